//! Whole-process figures of the probes: detection time, and CPU and memory
//! at 1,000 remotes. `cargo bench -p tether-probes --bench scale`.
//!
//! The simulated apiservers run in a child process, so the figures are the
//! probing process's alone.

// A benchmark measures wall-clock and CPU time; no paused clock here.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prometheus::Registry;
use tether_probes::{ProbeConfig, ProbeSet, Reachability, Remote};
use tether_testkit::{ApiServer, Fault, Options, procfs};

const REMOTES: usize = 1_000;
const MEASURE: Duration = Duration::from_secs(30);

fn rss_kib() -> u64 {
    procfs::status_kib(None, "VmRSS").expect("/proc/self/status has VmRSS")
}

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    procfs::cpu_time(None).expect("/proc/self/stat")
}

fn config_for(url: &str) -> kube::Config {
    kube::Config::new(url.parse().expect("valid URL"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--servers") {
        let count: usize = args[i + 1].parse().expect("a count");
        return serve(count);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Each scale run in a process of its own, so one's retained memory does
    // not skew the next one's figure.
    if let Some(i) = args.iter().position(|a| a == "--scale") {
        let seconds: u64 = args[i + 1].parse().expect("an interval in seconds");
        return runtime.block_on(scale(Duration::from_secs(seconds)));
    }
    runtime.block_on(async {
        println!(
            "machine: {} cores",
            std::thread::available_parallelism().map_or(0, usize::from)
        );
        detection(Fault::Refuse).await;
        detection(Fault::Hang).await;
    });
    for seconds in ["1", "10"] {
        let status = Command::new(std::env::current_exe().expect("own path"))
            .args(["--scale", seconds])
            .status()
            .expect("scale run");
        assert!(status.success());
    }
}

/// Runs `count` idle HTTPS servers until stdin closes; writes a kubeconfig
/// for each (CA included, as operators' kubeconfigs have) and prints its path.
fn serve(count: usize) {
    let dir = std::env::temp_dir().join(format!("tether-probe-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut servers = Vec::with_capacity(count);
        let mut out = std::io::stdout().lock();
        for _ in 0..count {
            let server = ApiServer::start(Options::default().tls(true))
                .await
                .expect("server");
            let path = dir.join(format!("{}.kubeconfig", server.addr().port()));
            server.kubeconfig().write(&path).expect("kubeconfig");
            writeln!(out, "{}", path.display()).expect("stdout");
            servers.push(server);
        }
        writeln!(out, "ready").expect("stdout");
        out.flush().expect("stdout");
        drop(out);
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        })
        .await
        .expect("stdin reader");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

async fn config_from(path: &str) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config")
}

async fn detection(fault: Fault) {
    let interval = Duration::from_secs(1);
    let deadline = Duration::from_millis(500);
    let threshold = 3;
    let ideal = interval * (threshold - 1) + deadline;
    let mut measured = Vec::new();
    for _ in 0..3 {
        let server = ApiServer::start(Options::default()).await.expect("server");
        let config = ProbeConfig::default()
            .with_interval(interval)
            .with_timeout(deadline)
            .with_failure_threshold(threshold)
            .with_jitter(0.0);
        let probes = ProbeSet::new(config, &Registry::new()).expect("probes");
        let mut rx = probes.handle().subscribe();
        probes
            .sync(&[Remote::new("a", config_for(&server.url()))])
            .expect("sync");
        let up = rx.recv().await.expect("first transition");
        assert_eq!(up.to, Reachability::Reachable);
        // Fail at a random phase of the interval, as a real outage does.
        tokio::time::sleep(interval.mul_f64(fastrand::f64())).await;
        let failed_at = Instant::now();
        server.set_fault(fault.clone()).await.expect("fault");
        let down = rx.recv().await.expect("lost");
        assert_eq!(down.to, Reachability::Unreachable);
        measured.push(failed_at.elapsed());
    }
    let shown: Vec<String> = measured
        .iter()
        .map(|d| format!("{:.2}s", d.as_secs_f64()))
        .collect();
    println!(
        "detection ({fault}; interval 1s, threshold 3, timeout 500ms): {} (ideal (threshold-1)*interval + deadline = {:.1}s)",
        shown.join(", "),
        ideal.as_secs_f64()
    );
}

async fn scale(interval: Duration) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--servers", &REMOTES.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("server process");
    let mut paths = Vec::with_capacity(REMOTES);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.expect("line");
        if line == "ready" {
            break;
        }
        paths.push(line);
    }
    assert_eq!(paths.len(), REMOTES);
    let mut configs = Vec::with_capacity(REMOTES);
    for path in &paths {
        configs.push(config_from(path).await);
    }

    let rss_before = rss_kib();
    let registry = Registry::new();
    let config = ProbeConfig::default()
        .with_interval(interval)
        .with_timeout(interval / 2);
    let probes = ProbeSet::new(config, &registry).expect("probes");
    let remotes: Vec<Remote> = configs
        .into_iter()
        .enumerate()
        .map(|(i, config)| Remote::new(format!("remote-{i:04}"), config))
        .collect();
    probes.sync(&remotes).expect("sync");
    // Warm up: every remote probed at least once.
    let handle = probes.handle();
    while handle
        .status()
        .iter()
        .any(|s| s.state != Reachability::Reachable)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let probes_done = || -> u64 {
        registry
            .gather()
            .iter()
            .filter(|f| f.name() == "tether_remote_probe_duration_seconds")
            .flat_map(|f| {
                f.get_metric()
                    .iter()
                    .map(|m| m.get_histogram().get_sample_count())
            })
            .sum()
    };
    let (cpu0, wall0, done0) = (cpu_time(), Instant::now(), probes_done());
    tokio::time::sleep(MEASURE).await;
    let (cpu, wall, done) = (
        cpu_time().saturating_sub(cpu0),
        wall0.elapsed(),
        probes_done() - done0,
    );
    let rss = rss_kib();
    println!(
        "{REMOTES} remotes at a {}s interval: {:.1}% of one core, RSS {} MiB ({:.0} KiB per remote over the {} MiB baseline), {:.0} µs CPU per probe ({done} probes in {:.0}s)",
        interval.as_secs(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        rss / 1024,
        (rss.saturating_sub(rss_before)) as f64 / REMOTES as f64,
        rss_before / 1024,
        1e6 * cpu.as_secs_f64() / done.max(1) as f64,
        wall.as_secs_f64(),
    );
    drop(probes);
    drop(child.stdin.take());
    let _ = child.wait();
}
