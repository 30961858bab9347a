//! `tether run` and `tether demo` as real processes, against simulated
//! remotes from `tether-testkit`, observed through the admin server the way
//! Prometheus and the kubelet see it.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::time::Duration;

mod common;

use common::{DEADLINE, Tether, config_yaml, free_port, probes, remote};
use tether_testkit::Fault;
use tokio::process::Command;
use tokio::time::{Instant, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_remote_costs_one_rebuild_and_its_recovery_one_more() {
    let (a, b, c) = (
        remote("a", true).await,
        remote("b", false).await,
        remote("c", false).await,
    );
    let mut tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));

    b.set_fault(Fault::Refuse).await.expect("refuse");
    let reachable_b = format!(
        "tether_remote_apiserver_reachable{{host=\"{}\",remote=\"b\"}}",
        b.addr()
    );
    tether.until_metric(&reachable_b, "0", |v| v == 0.0).await;
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    tether.until_metric("tether_cycle", "2", |v| v == 2.0).await;
    tether.until_ready(false).await;
    // The other remotes' caches sync again in the new cycle.
    tether
        .until_metric(
            "tether_watch_synced{remote=\"a\",resource=\"configmaps\"}",
            "1",
            |v| v == 1.0,
        )
        .await;

    // b stays down for five more probes: no more rebuilds.
    tether
        .still_lost_once("b", 8, "rebuilt while b stayed down")
        .await;
    assert_eq!(
        tether.metric("tether_cycle").await,
        Some(2.0),
        "rebuilt again for a remote already down"
    );

    b.set_fault(Fault::Up).await.expect("up");
    tether.until_metric(&reachable_b, "1", |v| v == 1.0).await;
    tether
        .until_metric(
            "tether_cycles_total{cause=\"remote_recovered\"}",
            "1",
            |v| v == 1.0,
        )
        .await;
    tether.until_ready(true).await;
    tether
        .until_metric(
            "tether_watch_objects{remote=\"b\",resource=\"configmaps\"}",
            "3",
            |v| v == 3.0,
        )
        .await;
    let (_, status) = tether.get("/status.json").await.expect("status");
    for name in ["\"a\"", "\"b\"", "\"c\""] {
        assert!(status.contains(name), "{status}");
    }

    // SIGTERM: draining starts when the signal is handled, and from the
    // first 503 on /readyz never says ready again, until the server is gone.
    tether.signal("TERM");
    let asked = Instant::now();
    let mut last = None;
    let mut first_503 = None;
    while let Some((code, _)) = tether.get("/readyz").await {
        if last == Some(503) {
            assert_eq!(code, 503, "ready again after draining began");
        }
        if code == 503 {
            first_503.get_or_insert_with(Instant::now);
        }
        last = Some(code);
        assert!(asked.elapsed() < DEADLINE, "still serving after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last, Some(503), "ready right up to the exit");
    // The test config's drain window is 1s: long enough to be seen.
    let drained = first_503.expect("a 503").elapsed();
    assert!(
        drained >= Duration::from_millis(900),
        "/readyz answered 503 for only {drained:?} before the listener closed"
    );
    let status = tether.wait().await;
    assert_eq!(status.code(), Some(0), "logs:\n{}", tether.logs());
    let logs = tether.logs();
    assert!(!logs.contains("a-token"), "a token reached the logs");
    assert!(logs.contains("draining"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_stay_fast_while_a_remote_hangs() {
    let (a, b) = (remote("a", false).await, remote("b", false).await);
    let mut tether = Tether::run(&[("a", &a), ("b", &b)]);
    tether.until_ready(true).await;
    b.set_fault(Fault::Hang).await.expect("hang");
    // Through the loss (3 probes of 500ms deadlines) and beyond.
    let reachable_b = format!(
        "tether_remote_apiserver_reachable{{host=\"{}\",remote=\"b\"}}",
        b.addr()
    );
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    while tether.metric(&reachable_b).await != Some(0.0)
        || started.elapsed() < Duration::from_secs(5)
    {
        for path in ["/healthz", "/readyz", "/status.json"] {
            let asked = Instant::now();
            let answer = tether.get(path).await;
            slowest = slowest.max(asked.elapsed());
            assert!(answer.is_some(), "{path} did not answer");
        }
        assert!(
            started.elapsed() < DEADLINE,
            "b was never declared unreachable"
        );
    }
    // Handlers read state already computed: far below the probe deadline.
    assert!(
        slowest < Duration::from_millis(250),
        "a health endpoint took {slowest:?}"
    );
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_or_server_error_never_causes_a_rebuild() {
    let a = remote("a", false).await;
    let mut tether = Tether::run(&[("a", &a)]);
    tether.until_ready(true).await;
    a.set_fault(Fault::Status {
        code: 403,
        all_paths: false,
    })
    .await
    .expect("403");
    probes(&a, 5).await;
    a.set_fault(Fault::Status {
        code: 500,
        all_paths: false,
    })
    .await
    .expect("500");
    probes(&a, 5).await;
    assert_eq!(
        tether.metric("tether_cycle").await,
        Some(1.0),
        "rebuilt for a 403/500"
    );
    let ready = format!(
        "tether_remote_apiserver_ready{{host=\"{}\",remote=\"a\"}}",
        a.addr()
    );
    assert_eq!(tether.metric(&ready).await, Some(0.0));
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_good_config_and_rejects_a_broken_one() {
    let (a, b, c) = (
        remote("a", false).await,
        remote("b", false).await,
        remote("c", false).await,
    );
    let mut tether = Tether::run(&[("a", &a), ("b", &b)]);
    tether.until_ready(true).await;
    a.set_fault(Fault::Refuse).await.expect("refuse");
    tether
        .until_metric(
            "tether_remote_probe_consecutive_failures{remote=\"a\"}",
            ">= 3",
            |v| v >= 3.0,
        )
        .await;
    // The loss ended cycle 1; reload while cycle 2 runs.
    tether.until_metric("tether_cycle", "2", |v| v == 2.0).await;
    tether
        .until_metric("tether_supervisor_backoff_seconds", "0", |v| v == 0.0)
        .await;

    // Keep a, drop b, add c.
    let dir = tether.config.parent().expect("a folder").to_owned();
    std::fs::write(
        &tether.config,
        config_yaml(&dir, &tether.admin, &[("a", &a), ("c", &c)]),
    )
    .expect("write");
    tether.signal("HUP");
    tether
        .until_metric(
            "tether_config_reloads_total{result=\"applied\"}",
            "1",
            |v| v >= 1.0,
        )
        .await;
    // Every series of the removed remote goes with the reload: its probe's
    // and its caches', not at the next cycle's start (a backoff later).
    let (_, metrics) = tether.get("/metrics").await.expect("metrics");
    assert!(
        !metrics.contains("remote=\"b\""),
        "series of the removed remote remain:\n{metrics}"
    );
    tether
        .until_metric(
            "tether_remote_probe_consecutive_failures{remote=\"c\"}",
            "0",
            |v| v == 0.0,
        )
        .await;

    let streak = tether
        .metric("tether_remote_probe_consecutive_failures{remote=\"a\"}")
        .await;
    assert!(
        streak >= Some(3.0),
        "the reload reset a's streak: {streak:?}"
    );
    // The running cycle took both in, remote by remote.
    for change in ["added", "removed"] {
        assert_eq!(
            tether
                .metric(&format!(
                    "tether_remote_changes_total{{cause=\"config_changed\",change=\"{change}\"}}"
                ))
                .await,
            Some(1.0),
            "{change}"
        );
    }

    std::fs::write(
        &tether.config,
        "remotes: [{name: a, server: \"ftp://nope\"}]\n",
    )
    .expect("write");
    tether.signal("HUP");
    tether
        .until_metric(
            "tether_config_reloads_total{result=\"rejected\"}",
            "1",
            |v| v >= 1.0,
        )
        .await;
    assert_eq!(
        tether.get("/healthz").await.map(|(code, _)| code),
        Some(200)
    );
    assert!(
        tether.logs().contains("remotes[0].server"),
        "the rejection does not name the field"
    );
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_admin_port_is_a_clear_error() {
    let a = remote("a", false).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("tether.yaml");
    std::fs::write(&config, config_yaml(dir.path(), &addr, &[("a", &a)])).expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .output()
        .await
        .expect("tether runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&addr) && stderr.contains("admin address"),
        "{stderr}"
    );
}

/// An admin address taken by another process (a Prometheus on 9090, say):
/// exit 2, naming the flag that chooses another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demo_whose_admin_address_is_taken_says_which_flag_moves_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let admin = taken.local_addr().expect("addr").to_string();
    let out = timeout(
        Duration::from_secs(30),
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["demo", "--duration", "5s", "--admin-address", &admin])
            .output(),
    )
    .await
    .expect("the demo exits")
    .expect("the demo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on the admin address {admin}"))
            && stderr.contains("choose another with --admin-address"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_a_lost_and_a_recovered_cycle() {
    let admin = format!("127.0.0.1:{}", free_port());
    let out = timeout(
        Duration::from_secs(90),
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["demo", "--duration", "35s", "--admin-address", &admin])
            .output(),
    )
    .await
    .expect("the demo stops by itself")
    .expect("the demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("cycle 1 ended: cluster-b unreachable;"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cycle 2 ended: cluster-b reachable again;"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cluster-b: reachable -> unreachable"),
        "{stdout}"
    );
    // The story: the loss before the cycle end it causes, what the next
    // cycle waits for, each failure toward the threshold once and not one
    // line per probe after it, and no Ctrl-C when it stops by itself.
    let at = |needle: &str| {
        stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} missing:\n{stdout}"))
    };
    assert!(
        at("cluster-b: reachable -> unreachable") < at("ended: cluster-b unreachable"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("Not ready: cycle 2 waits for cluster-b's caches; cluster-b unreachable for"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("cluster-b: probe failed").count(),
        3,
        "one line per failure up to the threshold:\n{stdout}"
    );
    assert!(!stdout.contains("Ctrl-C"), "{stdout}");
    assert!(stdout.contains("stopped cleanly"), "{stdout}");
    // Since when "unreachable for" counts, and what tether spared.
    assert!(
        stdout.contains("after the outage began; \"unreachable for\" counts from here"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("without tether, the manager would not end")
            .count(),
        1,
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_caches_cannot_sync_still_exits_cleanly_and_logs_json() {
    let a = remote("a", false).await;
    a.set_fault(Fault::Hang).await.expect("hang");
    let mut tether = Tether::run_with(&[("a", &a)], &["--log-format", "json"]);
    // The manager is building and its watch hangs: never ready.
    tether.until_metric("tether_cycle", "1", |v| v == 1.0).await;
    assert_eq!(tether.get("/readyz").await.map(|(c, _)| c), Some(503));
    tether.signal("TERM");
    let status = tether.wait().await;
    assert_eq!(status.code(), Some(0), "logs:\n{}", tether.logs());
    let logs = tether.logs();
    let mut lines = 0;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(
            event["level"].is_string() && event["fields"].is_object(),
            "{line}"
        );
        lines += 1;
    }
    assert!(lines >= 3, "too few log lines: {logs}");
    assert!(logs.contains("draining"), "{logs}");
}

/// Whether the process `pid` catches `signal` (its bit in `SigCgt`).
fn catches(pid: u32, signal: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_starting_does_not_end_the_process() {
    let a = remote("a", true).await;
    let dir = tempfile::tempdir().expect("dir");
    // The remote's CA is a FIFO: starting blocks on reading it until the
    // test writes it, which holds tether in the middle of its start.
    let ca = dir.path().join("ca.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&ca)
        .status()
        .expect("mkfifo runs (coreutils)");
    assert!(made.success());
    let kubeconfig = dir.path().join("a.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: a\n\
             clusters: [{{name: a, cluster: {{server: \"{}\", certificate-authority: {}}}}}]\n\
             users: [{{name: a, user: {{token: {}}}}}]\n\
             contexts: [{{name: a, context: {{cluster: a, user: a}}}}]\n",
            a.url(),
            ca.display(),
            a.token().expect("a token")
        ),
    )
    .expect("kubeconfig");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("tether.yaml");
    std::fs::write(
        &config,
        format!(
            "admin: {{address: \"{admin}\"}}\nremotes: [{{name: a, kubeconfig: {}}}]\n",
            kubeconfig.display()
        ),
    )
    .expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["run", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("tether starts");
    let pid = child.id().expect("running");

    // The handler is in place while the start still waits on the CA.
    let waited = Instant::now();
    while !catches(pid, 1) {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "no SIGHUP handler while tether starts: a SIGHUP now would end it"
        );
        assert!(
            child.try_wait().expect("wait works").is_none(),
            "tether exited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        common::http_get(&admin, "/healthz").await.is_none(),
        "tether had already started"
    );
    common::kill(pid, "HUP");
    // Every read of the CA, the start's and the reload's the SIGHUP asks
    // for, gets it. (The writer waits for a reader in a thread of its own.)
    let pem = a.ca_pem().expect("a CA");
    // A reader that opens the FIFO and closes it without reading (a
    // readability check) breaks that write's pipe: write again. Stop only
    // when the folder is gone, at the test's end.
    std::thread::spawn(move || {
        while std::fs::write(&ca, &pem)
            .map_or_else(|e| e.kind() == std::io::ErrorKind::BrokenPipe, |()| true)
        {}
    });

    let started = Instant::now();
    loop {
        assert!(
            child.try_wait().expect("wait works").is_none(),
            "tether ended after a SIGHUP during its start"
        );
        if common::http_get(&admin, "/readyz").await.map(|(c, _)| c) == Some(200) {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "tether never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill().await;
}
