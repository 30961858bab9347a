//! The whole-process scale and speed harness: `tether run` (the release
//! binary) against simulated remotes held in this process.
//!
//! ```text
//! cargo build --release -p tether
//! cargo run --release -p tether-tests --bin scale -- --remotes 1000 --blackbox
//! cargo run --release -p tether-tests --bin scale -- --remotes 10000
//! cargo run --release -p tether-tests --bin scale -- --detection 20
//! cargo run --release -p tether-tests --bin scale -- --detection 20 --apiservers real
//! ```
//!
//! It prints a table and writes the same figures as JSON (`--json`,
//! default `target/scale/<mode>.json`).

// A benchmark measures wall-clock time; no paused clock here.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde_json::{Value, json};
use tether_testkit::{ApiServer, ControlPlane, Fault, Options, RealOptions, procfs};

/// Whole-process figures of tether, optionally beside `blackbox_exporter` and
/// Prometheus probing the same remotes.
#[derive(Debug, Parser)]
struct Args {
    /// Simulated remotes (HTTPS, a CA and a token each) to probe.
    #[arg(long, default_value_t = 0)]
    remotes: usize,
    /// Probe interval of the scale run.
    #[arg(long, default_value = "10s", value_parser = tether_testkit::parse_duration)]
    interval: Duration,
    /// How long to measure once every remote is reachable.
    #[arg(long, default_value = "120s", value_parser = tether_testkit::parse_duration)]
    measure: Duration,
    /// Also run Debian's prometheus-blackbox-exporter and Prometheus against
    /// the same remotes, and compare.
    #[arg(long)]
    blackbox: bool,
    /// Detection trials per fault (refuse, hang) in the side-by-side run.
    #[arg(long, default_value_t = 5)]
    blackbox_trials: usize,
    /// Instead of a scale run: this many detection and rebuild trials per
    /// fault against three remotes (interval 1s, threshold 3, timeout 500ms).
    #[arg(long)]
    detection: Option<usize>,
    /// The remotes: simulated, or (with `--detection` only) real
    /// kube-apiservers and etcd built by `scripts/peers`, where `refuse`
    /// kills the apiserver and restarts it and `hang` stops it (SIGSTOP).
    #[arg(long, value_enum, default_value = "simulated")]
    apiservers: Apiservers,
    /// The built-in manager's watch list: `default` (Namespaces on every
    /// remote) or `none` (`watch: []`: probes only, as blackbox does).
    #[arg(long, default_value = "default")]
    watch: String,
    /// Configure this many of the remotes only after the measurement, by a
    /// reload (SIGHUP), and time the probes already running across it.
    #[arg(long, default_value_t = 0)]
    reload_add: usize,
    /// Run tether under callgrind, and count the instructions it runs while
    /// measuring (its wall-clock figures are then valgrind's).
    #[arg(long)]
    callgrind: bool,
    /// Run tether under this command (`heaptrack -o FILE`), in a process
    /// group stopped with SIGTERM; its CPU and RSS are then the wrapper's.
    #[arg(long)]
    wrap: Option<String>,
    /// Share the remotes among this many tether processes (sharding on
    /// Leases in one more simulated apiserver), and time a member's loss.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: serve remotes `FROM..FROM+COUNT` into this folder.
    #[arg(long, hide = true, requires = "serve_count")]
    serve_dir: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 0)]
    serve_from: usize,
    #[arg(long, hide = true)]
    serve_count: Option<usize>,
}

/// What serves the remotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Apiservers {
    Simulated,
    Real,
}

/// Remotes per server process: each holds a listener and at least one
/// connection per remote, within the 20,000 descriptors a process may have.
const PER_PROCESS: usize = 2_500;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("scale: {err}");
            ExitCode::FAILURE
        }
    }
}

type Result<T, E = String> = std::result::Result<T, E>;

fn run(args: &Args) -> Result<()> {
    if let (Some(dir), Some(count)) = (&args.serve_dir, args.serve_count) {
        return serve(dir, args.serve_from, count, args.apiservers);
    }
    if args.apiservers == Apiservers::Real && args.detection.is_none() {
        return Err("--apiservers real goes with --detection N".to_owned());
    }
    let (mode, report) = if let Some(trials) = args.detection {
        ("detection", detection(trials, args.apiservers)?)
    } else if args.remotes > 0 && args.replicas > 1 {
        ("shards", shards(args)?)
    } else if args.remotes > 0 {
        let mode = if args.blackbox { "blackbox" } else { "scale" };
        (mode, scale(args)?)
    } else {
        return Err("say --remotes N or --detection N".to_owned());
    };
    let file = if mode == "detection" && args.apiservers == Apiservers::Real {
        "detection-real.json".to_owned()
    } else if mode == "detection" {
        "detection.json".to_owned()
    } else if mode == "shards" {
        format!("shards-{}x{}.json", args.replicas, args.remotes)
    } else {
        format!("{mode}-{}-watch-{}.json", args.remotes, args.watch)
    };
    let path = args
        .json
        .clone()
        .unwrap_or_else(|| target_dir().join("scale").join(file));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut report = report;
    report["machine"] = machine();
    report["date"] = json!(today());
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("JSON: {}", path.display());
    Ok(())
}

// ---------------------------------------------------------------------------
// Processes and their figures.

fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// The release `tether` next to this binary.
fn tether_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.with_file_name("tether");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run `cargo build --release -p tether` first",
            path.display()
        ))
    }
}

fn which(tool: &str, install: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(tool))
        .find(|p| p.exists())
        .ok_or_else(|| format!("{tool} not found: {install}"))
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "cpu": cpu,
    })
}

fn today() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d").to_string()
}

/// Seconds since the epoch of an RFC 3339 timestamp, as tracing writes.
fn parse_timestamp(text: &str) -> Option<f64> {
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(at.as_duration().as_secs_f64())
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A child process, killed when dropped, with its stderr kept.
struct Process {
    name: &'static str,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Stopped with SIGTERM to its process group, so that a wrapper
    /// (heaptrack, valgrind) writes its profile.
    graceful: bool,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command) -> Result<Self> {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Ok(Self {
            name,
            child,
            lines,
            graceful: false,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User plus system CPU seconds so far.
    fn cpu(&self) -> f64 {
        procfs::cpu_time(Some(self.pid())).map_or(0.0, |t| t.as_secs_f64())
    }

    /// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
    fn kib(&self, field: &str) -> u64 {
        procfs::status_kib(Some(self.pid()), field).unwrap_or(0)
    }

    fn alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); last lines:\n{}",
                self.name,
                self.tail(20)
            )),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// Waits up to 30 s for the first `message` log line that `matches`
    /// (its unix time and fields).
    fn wait_event(
        &mut self,
        message: &str,
        matches: impl Fn(f64, &Value) -> bool,
    ) -> Result<(f64, Value)> {
        poll(
            message,
            Duration::from_secs(30),
            Duration::from_millis(20),
            || {
                self.alive()?;
                Ok(self
                    .events(message)
                    .into_iter()
                    .find(|(at, fields)| matches(*at, fields)))
            },
        )
        .map_err(|err| format!("{err}; tether's last lines:\n{}", self.tail(15)))
    }

    fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("lines");
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The JSON log lines of `message`, as (unix time, fields).
    fn events(&self, message: &str) -> Vec<(f64, Value)> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.contains(message))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .filter_map(|v| {
                Some((
                    parse_timestamp(v["timestamp"].as_str()?)?,
                    v["fields"].clone(),
                ))
            })
            .collect()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.graceful {
            let group = format!("-{}", self.pid());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let _ = poll(
                self.name,
                Duration::from_secs(120),
                Duration::from_millis(200),
                || Ok(self.child.try_wait().ok().flatten().map(|_| ())),
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTP/1.0: status, body, and how long it took.
fn http_get(addr: &str, path: &str) -> Result<(u16, String, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let elapsed = started.elapsed();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: no status"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body, elapsed))
}

/// The sum of a metric's samples in Prometheus text, over lines that
/// contain `filter`.
fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Polls `check` every `every` until it returns `Some`, for at most `limit`.
fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check()? {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(every);
    }
}

fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => f64::midpoint(values[n / 2 - 1], values[n / 2]),
    }
}

// ---------------------------------------------------------------------------
// Simulated remotes and tether's configuration.

/// Simulated remotes, served by child processes of this binary, with a
/// kubeconfig, a CA file and a token file each in one folder.
struct Remotes {
    servers: Vec<Server>,
    urls: Vec<String>,
    dir: tempfile::TempDir,
}

struct Server {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Remotes {
    fn start(count: usize) -> Result<Self> {
        Self::start_as(count, Apiservers::Simulated)
    }

    /// `count` remotes served by `apiservers`.
    fn start_as(count: usize, apiservers: Apiservers) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut servers = Vec::new();
        for from in (0..count).step_by(PER_PROCESS) {
            let kind = clap::ValueEnum::to_possible_value(&apiservers).expect("none is skipped");
            let mut child = Command::new(&exe)
                .args(["--apiservers", kind.get_name()])
                .args(["--serve-dir", &dir.path().to_string_lossy()])
                .args(["--serve-from", &from.to_string()])
                .args(["--serve-count", &PER_PROCESS.min(count - from).to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("server process: {e}"))?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = BufReader::new(child.stdout.take().expect("piped"));
            servers.push(Server {
                child,
                stdin,
                stdout,
            });
        }
        let mut urls = Vec::with_capacity(count);
        for server in &mut servers {
            loop {
                let mut line = String::new();
                if server
                    .stdout
                    .read_line(&mut line)
                    .map_err(|e| e.to_string())?
                    == 0
                {
                    return Err("a server process ended before it was ready".to_owned());
                }
                match line.trim().split_once(' ') {
                    Some(("url", url)) => urls.push(url.to_owned()),
                    _ if line.trim() == "ready" => break,
                    _ => return Err(format!("server process said {line:?}")),
                }
            }
        }
        Ok(Self { servers, urls, dir })
    }

    fn len(&self) -> usize {
        self.urls.len()
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn set_fault(&mut self, i: usize, fault: &Fault) -> Result<()> {
        let server = &mut self.servers[i / PER_PROCESS];
        writeln!(server.stdin, "{i} {fault}").map_err(|e| e.to_string())?;
        let mut line = String::new();
        server
            .stdout
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.trim() == "ok" {
            Ok(())
        } else {
            Err(format!("setting {fault} on remote {i}: {line}"))
        }
    }
}

/// A remote the server process holds.
enum Served {
    Simulated(ApiServer),
    Real(Box<ControlPlane>),
}

impl Served {
    async fn start(i: usize, apiservers: Apiservers) -> Result<Self> {
        if apiservers == Apiservers::Real {
            ControlPlane::start(RealOptions::default().name(name(i)))
                .await
                .map(|plane| Self::Real(Box::new(plane)))
                .map_err(|e| format!("real remote {i}: {e}"))
        } else {
            ApiServer::start(
                Options::default()
                    .tls(true)
                    .token(format!("token-{i:05}"))
                    .name(name(i)),
            )
            .await
            .map(Self::Simulated)
            .map_err(|e| format!("simulated remote {i}: {e}"))
        }
    }

    fn files(&self) -> (tether_testkit::Kubeconfig, String, String, String) {
        match self {
            Self::Simulated(s) => (
                s.kubeconfig(),
                s.ca_pem().unwrap_or_default(),
                s.token().unwrap_or_default(),
                s.url(),
            ),
            Self::Real(p) => (p.kubeconfig(), p.ca_pem(), p.token(), p.url()),
        }
    }

    /// A real process shows `refuse` (killed) and `hang` (stopped); `up`
    /// continues or restarts it.
    async fn set_fault(&self, fault: Fault) -> Result<()> {
        match (self, fault) {
            (Self::Simulated(s), fault) => s.set_fault(fault).await.map_err(|e| e.to_string()),
            (Self::Real(p), Fault::Refuse) => {
                p.stop();
                Ok(())
            }
            (Self::Real(p), Fault::Hang) => {
                p.pause();
                Ok(())
            }
            (Self::Real(p), Fault::Up) => {
                p.resume();
                if p.apiserver_pid().is_none() {
                    p.restart().await.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            (Self::Real(_), other) => Err(format!("a real remote cannot show {other}")),
        }
    }
}

/// The server process: starts `count` remotes served by `apiservers`,
/// writes their files, prints `url <url>` for each and `ready`,
/// then applies `<index> <fault>` lines from stdin until it closes.
fn serve(dir: &Path, from: usize, count: usize, apiservers: Apiservers) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let servers = runtime.block_on(async {
        let mut servers = Vec::with_capacity(count);
        for i in from..from + count {
            servers.push(Served::start(i, apiservers).await?);
        }
        Ok::<_, String>(servers)
    })?;
    let mut out = std::io::stdout().lock();
    for (offset, server) in servers.iter().enumerate() {
        let n = name(from + offset);
        let write = |file: String, text: &str| {
            std::fs::write(dir.join(file), text).map_err(|e| e.to_string())
        };
        let (kubeconfig, ca, token, url) = server.files();
        write(format!("{n}.kubeconfig"), &kubeconfig.to_yaml())?;
        write(format!("{n}.ca.pem"), &ca)?;
        write(format!("{n}.token"), &token)?;
        writeln!(out, "url {url}").map_err(|e| e.to_string())?;
    }
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let (index, fault) = line.split_once(' ').ok_or("a line: <index> <fault>")?;
        let index: usize = index.parse().map_err(|_| format!("bad index {index:?}"))?;
        let fault: Fault = fault.parse()?;
        let server = servers
            .get(index.wrapping_sub(from))
            .ok_or_else(|| format!("remote {index} is not served here"))?;
        runtime.block_on(server.set_fault(fault))?;
        writeln!(out, "ok").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Whether a log event's `remotes` field (the names of one remote
/// apiserver's remotes, comma-separated) includes `remote`.
fn names(fields: &Value, remote: &str) -> bool {
    fields["remotes"]
        .as_str()
        .is_some_and(|list| list.split(',').any(|n| n.trim() == remote))
}

fn name(i: usize) -> String {
    format!("remote-{i:05}")
}

/// A tether config for `remotes`: `probe` and `supervisor` in YAML flow
/// form, and `watch` as a YAML value.
fn tether_config(
    remotes: &Remotes,
    configured: usize,
    admin: &str,
    probe: &str,
    supervisor: &str,
    watch: &str,
) -> Result<PathBuf> {
    tether_config_as(
        remotes,
        configured,
        "tether.yaml",
        &format!(
            "admin: {{ address: \"{admin}\" }}\nprobe: {probe}\nsupervisor: {supervisor}\nwatch: {watch}\n"
        ),
    )
}

/// A tether config named `file`: `head` (YAML), then the first
/// `configured` remotes.
fn tether_config_as(
    remotes: &Remotes,
    configured: usize,
    file: &str,
    head: &str,
) -> Result<PathBuf> {
    let mut yaml = format!("{head}remotes:\n");
    for i in 0..configured {
        let _ = writeln!(
            yaml,
            "  - {{ name: {n}, kubeconfig: {n}.kubeconfig }}",
            n = name(i)
        );
    }
    let path = remotes.path(file);
    std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
    Ok(path)
}

fn start_tether(config: &Path) -> Result<Process> {
    start_tether_under(config, &[])
}

/// tether, run under `wrap` (a profiler's command line) if it is not empty.
fn start_tether_under(config: &Path, wrap: &[String]) -> Result<Process> {
    let binary = tether_binary()?;
    let mut command = match wrap.split_first() {
        None => Command::new(&binary),
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(&binary);
            command
        }
    };
    command.args([
        "run",
        "--config",
        &config.to_string_lossy(),
        "--log-format",
        "json",
    ]);
    if wrap.is_empty() {
        return Process::spawn("tether", &mut command);
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut process = Process::spawn("tether", &mut command)?;
    process.graceful = true;
    Ok(process)
}

/// Waits until tether reports every remote reachable and its manager up.
fn until_all_reachable(tether: &mut Process, admin: &str, count: usize) -> Result<Duration> {
    let started = Instant::now();
    #[allow(clippy::cast_precision_loss)]
    let want = count as f64;
    poll(
        "every remote reachable and the manager up",
        Duration::from_secs(600),
        Duration::from_millis(500),
        || {
            tether.alive()?;
            let Ok((_, text, _)) = http_get(admin, "/metrics") else {
                return Ok(None);
            };
            let reachable = metric_sum(&text, "tether_remote_apiserver_reachable", "");
            let up = metric_sum(&text, "tether_manager_up", "");
            Ok((reachable >= want && up >= 1.0).then(|| started.elapsed()))
        },
    )
}

// ---------------------------------------------------------------------------
// Scale, and the side-by-side with blackbox_exporter.

struct Sample {
    cpu: f64,
    at: Instant,
}

fn sample(process: &Process) -> Sample {
    Sample {
        cpu: process.cpu(),
        at: Instant::now(),
    }
}

fn cpu_percent(process: &Process, since: &Sample) -> f64 {
    100.0 * (process.cpu() - since.cpu) / since.at.elapsed().as_secs_f64()
}

#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
fn scale(args: &Args) -> Result<Value> {
    let count = args.remotes;
    let interval = args.interval.as_secs_f64();
    eprintln!("starting {count} simulated remotes (HTTPS, token each)");
    let mut remotes = Remotes::start(count)?;
    let admin = format!("127.0.0.1:{}", free_port()?);
    // In the side-by-side run both sides call a remote lost on its first
    // failed probe, as blackbox's probe_success does.
    let threshold = if args.blackbox { 1 } else { 3 };
    let configured = count
        .checked_sub(args.reload_add)
        .ok_or("--reload-add is more than --remotes")?;
    let watch = match args.watch.as_str() {
        "default" => "[{ apiVersion: v1, kind: Namespace }]",
        "none" => "[]",
        other => return Err(format!("--watch {other}: say default or none")),
    };
    let config_with = |configured| {
        tether_config(
            &remotes,
            configured,
            &admin,
            &format!(
                "{{ interval: {interval}s, timeout: {}s, failureThreshold: {threshold} }}",
                interval / 2.0
            ),
            "{ rebuildOnRecovery: true }",
            watch,
        )
    };
    let config = config_with(configured)?;
    let wrap: Vec<String> = if args.callgrind {
        vec![
            "valgrind".to_owned(),
            "--tool=callgrind".to_owned(),
            format!(
                "--callgrind-out-file={}",
                remotes.path("callgrind.out").display()
            ),
        ]
    } else {
        args.wrap
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let mut tether = start_tether_under(&config, &wrap)?;
    let warmup = until_all_reachable(&mut tether, &admin, configured)?;
    eprintln!("tether: all {configured} reachable and the manager up after {warmup:.1?}");

    let mut peers = if args.blackbox {
        Some(start_blackbox(&remotes, interval)?)
    } else {
        None
    };
    if let Some((blackbox, prometheus, prom_addr)) = peers.as_mut() {
        poll(
            "Prometheus has every probe_success",
            Duration::from_secs(600),
            Duration::from_secs(1),
            || {
                blackbox.alive()?;
                prometheus.alive()?;
                let up = prom_query(prom_addr, "count(probe_success == 1)")?;
                Ok((up.first().map(|(_, v)| *v) == Some(count as f64)).then_some(()))
            },
        )?;
        eprintln!("blackbox: all {count} probe_success == 1");
    }

    eprintln!("measuring for {:?}", args.measure);
    let probes_before = probes_finished(&admin)?;
    if args.callgrind {
        callgrind_control(&tether, "-z")?;
    }
    let t0 = sample(&tether);
    let peers_before = peers.as_ref().map(|(b, p, _)| (sample(b), sample(p)));
    std::thread::sleep(args.measure);
    let tether_cpu = cpu_percent(&tether, &t0);
    let instructions = if args.callgrind {
        callgrind_control(&tether, "-d")?;
        let keep = target_dir().join("scale").join("callgrind.out");
        Some(callgrind_instructions(&remotes, &keep)?)
    } else {
        None
    };
    let probes = probes_finished(&admin)? - probes_before;
    let peer_cpu = peers
        .as_ref()
        .zip(peers_before.as_ref())
        .map(|((b, p, _), (b0, p0))| (cpu_percent(b, b0), cpu_percent(p, p0)));
    tether.alive()?;
    let tether_peak = tether.kib("VmHWM");
    let tether_rss = tether.kib("VmRSS");

    let (scrape_median, scrape_max, size) = timed_gets(&admin, "/metrics")?;
    let (status_median, status_max, status_size) = timed_gets(&admin, "/status.json")?;
    let (page_median, page_max, page_size) = timed_gets(&admin, "/status")?;

    let mut rows = vec![
        ("remotes".to_owned(), count.to_string()),
        ("probe interval".to_owned(), format!("{interval}s")),
        ("built-in manager watches".to_owned(), args.watch.clone()),
        (
            "warm-up (all reachable, manager up)".to_owned(),
            format!("{:.1}s", warmup.as_secs_f64()),
        ),
        (
            "tether CPU".to_owned(),
            format!("{tether_cpu:.2}% of one core"),
        ),
        (
            "tether RSS (peak / now)".to_owned(),
            format!(
                "{:.1} / {:.1} MiB",
                tether_peak as f64 / 1024.0,
                tether_rss as f64 / 1024.0
            ),
        ),
        (
            "/metrics scrape (median / max of 5)".to_owned(),
            format!(
                "{scrape_median:.1} / {scrape_max:.1} ms, {} KiB",
                size / 1024
            ),
        ),
        (
            "probes while measuring".to_owned(),
            format!(
                "{probes:.0} ({:.1} µs of CPU each)",
                tether_cpu / 100.0 * args.measure.as_secs_f64() / probes * 1e6
            ),
        ),
        (
            "/status.json (median / max of 5)".to_owned(),
            format!(
                "{status_median:.1} / {status_max:.1} ms, {} KiB",
                status_size / 1024
            ),
        ),
        (
            "/status page (median / max of 5)".to_owned(),
            format!(
                "{page_median:.1} / {page_max:.1} ms, {} KiB",
                page_size / 1024
            ),
        ),
    ];
    let mut report = json!({
        "remotes": count,
        "interval_seconds": interval,
        "watch": args.watch,
        "measure_seconds": args.measure.as_secs_f64(),
        "warmup_seconds": warmup.as_secs_f64(),
        "tether": {
            "cpu_percent": tether_cpu,
            "peak_rss_kib": tether_peak,
            "rss_kib": tether_rss,
            "metrics_scrape_ms_median": scrape_median,
            "metrics_scrape_ms_max": scrape_max,
            "metrics_bytes": size,
            "status_json_ms_median": status_median,
            "status_json_ms_max": status_max,
            "status_json_bytes": status_size,
            "status_page_ms_median": page_median,
            "status_page_ms_max": page_max,
            "status_page_bytes": page_size,
            "failure_threshold": threshold,
            "probes_measured": probes,
        },
    });
    if let Some(instructions) = instructions {
        rows.push((
            "instructions (callgrind, while measuring)".to_owned(),
            format!(
                "{instructions} ({:.0} a probe)",
                instructions as f64 / probes
            ),
        ));
        report["tether"]["instructions"] = json!(instructions);
        report["tether"]["instructions_per_probe"] = json!(instructions as f64 / probes);
    }
    if args.reload_add > 0 {
        let (gap_before, gap_across, took) =
            reload_adding(&mut tether, &admin, (configured, count), interval, || {
                config_with(count).map(drop)
            })?;
        rows.push((
            format!("reload adding {}: all reachable after", args.reload_add),
            format!("{took:.1}s"),
        ));
        rows.push((
            "longest gap between two probes of a running remote (before / across the reload)"
                .to_owned(),
            format!("{gap_before:.2}s / {gap_across:.2}s"),
        ));
        report["reload"] = json!({
            "added": args.reload_add,
            "all_reachable_seconds": took,
            "max_probe_gap_before_seconds": gap_before,
            "max_probe_gap_across_seconds": gap_across,
        });
    }

    if let (Some((blackbox, prometheus, prom_addr)), Some((b_cpu, p_cpu))) =
        (peers.as_mut(), peer_cpu)
    {
        let (b_peak, p_peak) = (blackbox.kib("VmHWM"), prometheus.kib("VmHWM"));
        let peer_cpu = b_cpu + p_cpu;
        let peer_peak = b_peak + p_peak;
        rows.push((
            "blackbox_exporter CPU / peak RSS".to_owned(),
            format!("{b_cpu:.2}% / {:.1} MiB", b_peak as f64 / 1024.0),
        ));
        rows.push((
            "Prometheus CPU / peak RSS".to_owned(),
            format!("{p_cpu:.2}% / {:.1} MiB", p_peak as f64 / 1024.0),
        ));
        rows.push((
            "peer ÷ tether, CPU".to_owned(),
            format!("{:.1}×", peer_cpu / tether_cpu),
        ));
        rows.push((
            "peer ÷ tether, peak RSS".to_owned(),
            format!("{:.1}×", peer_peak as f64 / tether_peak as f64),
        ));
        let detections =
            side_by_side_detection(&mut remotes, &mut tether, prom_addr, args.blackbox_trials)?;
        for (fault, (tether_s, blackbox_s)) in &detections {
            let (mut t, mut b) = (tether_s.clone(), blackbox_s.clone());
            rows.push((
                format!("detection, {fault} (median: tether / blackbox)"),
                format!("{:.2}s / {:.2}s", median(&mut t), median(&mut b)),
            ));
        }
        report["blackbox_exporter"] = json!({ "cpu_percent": b_cpu, "peak_rss_kib": b_peak });
        report["prometheus"] = json!({ "cpu_percent": p_cpu, "peak_rss_kib": p_peak });
        report["ratio_cpu"] = json!(peer_cpu / tether_cpu);
        report["ratio_peak_rss"] = json!(peer_peak as f64 / tether_peak as f64);
        report["detection_seconds"] = json!(
            detections
                .iter()
                .map(|(fault, (t, b))| (fault.clone(), json!({ "tether": t, "blackbox": b })))
                .collect::<BTreeMap<_, _>>()
        );
    }
    print_table(&rows);
    Ok(report)
}

// ---------------------------------------------------------------------------
// Sharding: several processes share the remotes on Leases.

/// What the replicas at `admins` report together: remotes reachable (each
/// counted by its owner alone), remotes held, and managers up.
fn shard_totals(admins: &[String]) -> Result<(f64, f64, f64)> {
    let mut totals = (0.0, 0.0, 0.0);
    for admin in admins {
        let (_, text, _) = http_get(admin, "/metrics")?;
        totals.0 += metric_sum(&text, "tether_remote_apiserver_reachable", "");
        totals.1 += metric_sum(&text, "tether_owned_remotes", "");
        totals.2 += metric_sum(&text, "tether_manager_up", "");
    }
    Ok(totals)
}

/// Waits until the replicas at `admins` hold and reach all `count` remotes
/// between them, each with its manager up.
fn until_shared(tethers: &mut [Process], admins: &[String], count: usize) -> Result<Duration> {
    let started = Instant::now();
    #[allow(clippy::cast_precision_loss)]
    let (want, managers) = (count as f64, admins.len() as f64);
    poll(
        "every remote held, reachable, and every manager up",
        Duration::from_secs(600),
        Duration::from_millis(200),
        || {
            for tether in tethers.iter_mut() {
                tether.alive()?;
            }
            let Ok((reachable, held, up)) = shard_totals(admins) else {
                return Ok(None);
            };
            Ok((reachable >= want && held >= want && up >= managers).then(|| started.elapsed()))
        },
    )
}

/// `--replicas N --remotes M`: N tether processes share M remotes; CPU and
/// RSS of each while measuring, then the time for the survivors to hold
/// and reach every remote after one is killed (SIGKILL: its Lease must
/// expire).
#[allow(clippy::cast_precision_loss)]
fn shards(args: &Args) -> Result<Value> {
    let count = args.remotes;
    let interval = args.interval.as_secs_f64();
    eprintln!("starting {count} simulated remotes, and one more for the Leases");
    let remotes = Remotes::start(count)?;
    let leases = Remotes::start(1)?;
    let lease_kubeconfig = leases.path(&format!("{}.kubeconfig", name(0)));
    let (duration, deadline, retry) = (15, 10, 2);
    let mut admins = Vec::new();
    let mut tethers = Vec::new();
    for i in 0..args.replicas {
        let admin = format!("127.0.0.1:{}", free_port()?);
        let head = format!(
            "admin: {{ address: \"{admin}\" }}\n\
             probe: {{ interval: {interval}s, timeout: {}s }}\n\
             watch: []\n\
             leaderElection: {{ enabled: true, leaseNamespace: default, identity: shard-{i}, \
             leaseDuration: {duration}s, renewDeadline: {deadline}s, retryPeriod: {retry}s, kubeconfig: {} }}\n\
             sharding: {{ enabled: true }}\n",
            interval / 2.0,
            lease_kubeconfig.display()
        );
        let config = tether_config_as(&remotes, count, &format!("tether-{i}.yaml"), &head)?;
        tethers.push(start_tether(&config)?);
        admins.push(admin);
    }
    let warmup = until_shared(&mut tethers, &admins, count)?;
    eprintln!(
        "{} replicas: all {count} held and reachable after {warmup:.1?}; measuring for {:?}",
        args.replicas, args.measure
    );
    let before: Vec<Sample> = tethers.iter().map(sample).collect();
    std::thread::sleep(args.measure);
    let mut rows = vec![
        ("remotes".to_owned(), count.to_string()),
        ("replicas".to_owned(), args.replicas.to_string()),
        ("probe interval".to_owned(), format!("{interval}s")),
        (
            "warm-up (all held, reachable, managers up)".to_owned(),
            format!("{:.1}s", warmup.as_secs_f64()),
        ),
    ];
    let mut per_process = Vec::new();
    for (i, (tether, since)) in tethers.iter_mut().zip(&before).enumerate() {
        tether.alive()?;
        let cpu = cpu_percent(tether, since);
        let (peak, rss) = (tether.kib("VmHWM"), tether.kib("VmRSS"));
        let (_, text, _) = http_get(&admins[i], "/metrics")?;
        let held = metric_sum(&text, "tether_owned_remotes", "");
        rows.push((
            format!("shard-{i}: remotes held, CPU, RSS peak / now"),
            format!(
                "{held:.0}, {cpu:.2}% of one core, {:.1} / {:.1} MiB",
                peak as f64 / 1024.0,
                rss as f64 / 1024.0
            ),
        ));
        per_process.push(json!({
            "identity": format!("shard-{i}"),
            "held": held,
            "cpu_percent": cpu,
            "peak_rss_kib": peak,
            "rss_kib": rss,
        }));
    }
    // A member lost: SIGKILL, so its Lease stays until it expires.
    let mut lost = tethers.pop().ok_or("no replica")?;
    let lost_admin = admins.pop().ok_or("no replica")?;
    let (_, text, _) = http_get(&lost_admin, "/metrics")?;
    let moving = metric_sum(&text, "tether_owned_remotes", "");
    let killed = Instant::now();
    let _ = Command::new("kill")
        .args(["-KILL", &lost.pid().to_string()])
        .status();
    let _ = lost.alive();
    until_shared(&mut tethers, &admins, count)?;
    let settled = killed.elapsed();
    drop(lost);
    rows.push((
        "a member killed: its remotes held and reachable again".to_owned(),
        format!(
            "{moving:.0} remotes in {:.1}s (leaseDuration {duration}s, retryPeriod {retry}s, interval {interval}s)",
            settled.as_secs_f64()
        ),
    ));
    print_table(&rows);
    Ok(json!({
        "remotes": count,
        "replicas": args.replicas,
        "interval_seconds": interval,
        "measure_seconds": args.measure.as_secs_f64(),
        "warmup_seconds": warmup.as_secs_f64(),
        "processes": per_process,
        "member_loss": {
            "moved": moving,
            "settled_seconds": settled.as_secs_f64(),
            "lease_duration_seconds": duration,
            "retry_period_seconds": retry,
        },
    }))
}

/// Probes finished so far, by the probe histograms' counts.
fn probes_finished(admin: &str) -> Result<f64> {
    let (_, text, _) = http_get(admin, "/metrics")?;
    Ok(metric_sum(
        &text,
        "tether_remote_probe_duration_seconds_count",
        "",
    ))
}

/// Runs `callgrind_control FLAG PID`: `-z` zeroes the counts, `-d` dumps.
fn callgrind_control(tether: &Process, flag: &str) -> Result<()> {
    let tool = which("callgrind_control", "apt-get install valgrind")?;
    let status = Command::new(tool)
        .args([flag, &tether.pid().to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("callgrind_control {flag}: {status}"))
}

/// The instructions (`Ir`) of the newest callgrind dump, which is kept as
/// `keep` for `callgrind_annotate`.
fn callgrind_instructions(remotes: &Remotes, keep: &Path) -> Result<u64> {
    let newest = std::fs::read_dir(remotes.dir.path())
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out"))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .ok_or("no callgrind dump")?;
    if let Some(dir) = keep.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(newest.path(), keep).map_err(|e| format!("{}: {e}", keep.display()))?;
    eprintln!("callgrind dump: {}", keep.display());
    let text = std::fs::read_to_string(newest.path()).map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| "the callgrind dump has no summary".to_owned())
}

/// Each remote's last probe (unix seconds), and how many are reachable,
/// from one `/metrics`.
fn last_probes(admin: &str) -> Result<(BTreeMap<String, f64>, f64)> {
    let (_, text, _) = http_get(admin, "/metrics")?;
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("tether_remote_probe_last_timestamp_seconds{remote=\""))
        .filter_map(|l| {
            let (name, rest) = l.split_once('"')?;
            Some((name.to_owned(), rest.rsplit_once(' ')?.1.parse().ok()?))
        })
        .collect();
    Ok((
        last,
        metric_sum(&text, "tether_remote_apiserver_reachable", ""),
    ))
}

/// Follows every running remote's probes for 1.5 intervals, then has
/// `rewrite` list `count` remotes where the config file listed `configured`
/// and reloads tether (SIGHUP; it would also see the file change within
/// 2 s), and follows on until 1.5 intervals after the new ones are
/// reachable. Gives the longest gap between two probes of one running
/// remote before the reload and across it, and how long the new remotes
/// took to be reachable; an error if any remote turned unreachable.
fn reload_adding(
    tether: &mut Process,
    admin: &str,
    (configured, count): (usize, usize),
    interval: f64,
    rewrite: impl FnOnce() -> Result<()>,
) -> Result<(f64, f64, f64)> {
    let mut seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let follow = |seen: &mut BTreeMap<String, Vec<f64>>| -> Result<f64> {
        let (last, reachable) = last_probes(admin)?;
        for (name, at) in last {
            let times = seen.entry(name).or_default();
            if times.last() != Some(&at) {
                times.push(at);
            }
        }
        Ok(reachable)
    };
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < interval * 1.5 {
        follow(&mut seen)?;
        std::thread::sleep(Duration::from_secs(1));
    }
    let reload_at = now();
    let reloaded = Instant::now();
    rewrite()?;
    let status = Command::new("kill")
        .args(["-HUP", &tether.pid().to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("kill -HUP: {status}"));
    }
    let mut took = None;
    #[allow(clippy::cast_precision_loss)]
    let want = count as f64;
    loop {
        tether.alive()?;
        let reachable = follow(&mut seen)?;
        if took.is_none() && reachable >= want {
            took = Some(reloaded.elapsed().as_secs_f64());
        }
        match took {
            Some(took) if reloaded.elapsed().as_secs_f64() > took + interval * 1.5 => break,
            None if reloaded.elapsed() > Duration::from_secs(600) => {
                return Err("the added remotes: not all reachable within 600s".to_owned());
            }
            _ => std::thread::sleep(Duration::from_secs(1)),
        }
    }
    let (_, text, _) = http_get(admin, "/metrics")?;
    let lost = metric_sum(
        &text,
        "tether_remote_transitions_total",
        "to=\"unreachable\"",
    );
    if lost > 0.0 {
        return Err(format!(
            "{lost} remotes turned unreachable across the reload"
        ));
    }
    let (mut gap_before, mut gap_across) = (0.0_f64, 0.0_f64);
    let running = seen.iter().filter(|(name, _)| {
        name.strip_prefix("remote-")
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < configured)
    });
    for (_, times) in running {
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            if pair[1] < reload_at {
                gap_before = gap_before.max(gap);
            } else {
                gap_across = gap_across.max(gap);
            }
        }
    }
    Ok((gap_before, gap_across, took.unwrap_or_default()))
}

/// Five `GET path`s: the median and the most milliseconds, and the size.
fn timed_gets(admin: &str, path: &str) -> Result<(f64, f64, usize)> {
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let (status, body, took) = http_get(admin, path)?;
        if status != 200 {
            return Err(format!("{path} answered {status}"));
        }
        size = body.len();
        times.push(took.as_secs_f64() * 1000.0);
    }
    let max = times.iter().copied().fold(0.0, f64::max);
    Ok((median(&mut times), max, size))
}

fn print_table(rows: &[(String, String)]) {
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    println!();
    for (key, value) in rows {
        println!("{key:width$}  {value}");
    }
    println!();
}

fn start_blackbox(remotes: &Remotes, interval: f64) -> Result<(Process, Process, String)> {
    let blackbox_bin = which(
        "prometheus-blackbox-exporter",
        "apt-get install -y prometheus-blackbox-exporter",
    )?;
    let prometheus_bin = which("prometheus", "apt-get install -y prometheus")?;
    // One module per remote: its own CA and token, as tether has.
    let mut modules = String::from("modules:\n");
    let mut targets = String::new();
    for (i, url) in remotes.urls.iter().enumerate() {
        let n = name(i);
        let _ = write!(
            modules,
            "  {n}:\n    prober: http\n    timeout: {timeout}s\n    http:\n      preferred_ip_protocol: ip4\n      bearer_token_file: {token}\n      tls_config: {{ ca_file: {ca} }}\n",
            timeout = interval / 2.0,
            token = remotes.path(&format!("{n}.token")).display(),
            ca = remotes.path(&format!("{n}.ca.pem")).display(),
        );
        let _ = write!(
            targets,
            "      - targets: [\"{url}/readyz\"]\n        labels: {{ module: {n}, remote: {n} }}\n",
        );
    }
    let blackbox_config = remotes.path("blackbox.yml");
    std::fs::write(&blackbox_config, modules).map_err(|e| e.to_string())?;
    let blackbox_addr = format!("127.0.0.1:{}", free_port()?);
    let blackbox = Process::spawn(
        "blackbox_exporter",
        Command::new(blackbox_bin).args([
            &format!("--config.file={}", blackbox_config.display()),
            &format!("--web.listen-address={blackbox_addr}"),
        ]),
    )?;
    let prom_config = remotes.path("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global: {{ scrape_interval: {interval}s, scrape_timeout: {timeout}s }}\nscrape_configs:\n  - job_name: blackbox\n    metrics_path: /probe\n    static_configs:\n{targets}    relabel_configs:\n      - {{ source_labels: [__address__], target_label: __param_target }}\n      - {{ source_labels: [module], target_label: __param_module }}\n      - {{ target_label: __address__, replacement: \"{blackbox_addr}\" }}\n",
            timeout = interval / 2.0 + 1.0,
        ),
    )
    .map_err(|e| e.to_string())?;
    let prom_addr = format!("127.0.0.1:{}", free_port()?);
    let prometheus = Process::spawn(
        "prometheus",
        Command::new(prometheus_bin).args([
            &format!("--config.file={}", prom_config.display()),
            &format!("--web.listen-address={prom_addr}"),
            &format!("--storage.tsdb.path={}", remotes.path("tsdb").display()),
        ]),
    )?;
    Ok((blackbox, prometheus, prom_addr))
}

/// An instant query: (labels, value) per series.
fn prom_query(addr: &str, query: &str) -> Result<Vec<(Value, f64)>> {
    let mut encoded = String::new();
    for byte in query.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    let Ok((200, body, _)) = http_get(addr, &format!("/api/v1/query?query={encoded}")) else {
        return Ok(Vec::new());
    };
    let value: Value =
        serde_json::from_str(&body).map_err(|e| format!("Prometheus answer: {e}"))?;
    Ok(value["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let v = r["value"][1].as_str()?.parse().ok()?;
            Some((r["metric"].clone(), v))
        })
        .collect())
}

type Detections = Vec<(String, (Vec<f64>, Vec<f64>))>;

/// Faults one remote at a time and times each side's verdict: tether's
/// "remote apiserver unreachable" log line, and the timestamp of the
/// `probe_success` 0 sample in Prometheus.
fn side_by_side_detection(
    remotes: &mut Remotes,
    tether: &mut Process,
    prom_addr: &str,
    trials: usize,
) -> Result<Detections> {
    let mut results = Vec::new();
    for fault in [Fault::Refuse, Fault::Hang] {
        let (mut tether_s, mut blackbox_s) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            let i = (trial * 7919 + usize::from(fault == Fault::Hang) * 13) % remotes.len();
            let remote = name(i);
            // A random phase against both sides' intervals.
            std::thread::sleep(Duration::from_millis(fastrand::u64(..10_000)));
            let struck = now();
            remotes.set_fault(i, &fault)?;
            let (t, b) = poll(
                &format!("{remote} {fault} seen by both"),
                Duration::from_secs(120),
                Duration::from_millis(100),
                || {
                    tether.alive()?;
                    let t = tether
                        .events("remote apiserver unreachable")
                        .into_iter()
                        .filter(|(at, f)| {
                            *at >= struck
                                && f["remotes"].as_str().is_some_and(|r| r.contains(&remote))
                        })
                        .map(|(at, _)| at)
                        .next();
                    let b = prom_query(
                        prom_addr,
                        &format!("timestamp(probe_success{{remote=\"{remote}\"}} == 0)"),
                    )?
                    .first()
                    .map(|(_, at)| *at)
                    .filter(|at| *at >= struck);
                    Ok(t.zip(b))
                },
            )?;
            eprintln!(
                "{fault} on {remote}: tether {:.2}s, blackbox {:.2}s",
                t - struck,
                b - struck
            );
            tether_s.push(t - struck);
            blackbox_s.push(b - struck);
            remotes.set_fault(i, &Fault::Up)?;
            poll(
                &format!("{remote} back for both"),
                Duration::from_secs(120),
                Duration::from_millis(200),
                || {
                    let back = prom_query(
                        prom_addr,
                        &format!("probe_success{{remote=\"{remote}\"}} == 1"),
                    )?;
                    let reachable =
                        tether
                            .events("remote apiserver reachable")
                            .iter()
                            .any(|(at, f)| {
                                *at >= struck
                                    && f["remotes"].as_str().is_some_and(|r| r.contains(&remote))
                            });
                    Ok((!back.is_empty() && reachable).then_some(()))
                },
            )?;
        }
        results.push((fault.to_string(), (tether_s, blackbox_s)));
    }
    Ok(results)
}

// ---------------------------------------------------------------------------
// Detection and rebuild latency.

/// Whether a "cycle ended" line's cause is of `kind`.
fn cause_is(fields: &Value, kind: &str) -> bool {
    fields["cause"]
        .as_str()
        .is_some_and(|c| c.starts_with(kind))
}

/// Parses a `Duration`'s `Debug` form (`1.5s`, `850.2ms`, `12µs`).
fn parse_debug_duration(text: &str) -> Option<f64> {
    for (unit, scale) in [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)] {
        if let Some(number) = text.strip_suffix(unit) {
            return number.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

#[allow(clippy::too_many_lines)]
fn detection(trials: usize, apiservers: Apiservers) -> Result<Value> {
    let (interval, threshold, deadline) = (1.0, 3.0, 0.5);
    let ideal = (threshold - 1.0) * interval + deadline;
    let mut remotes = Remotes::start_as(3, apiservers)?;
    // Two resources on each of three remotes.
    let admin = format!("127.0.0.1:{}", free_port()?);
    let config = tether_config(
        &remotes,
        remotes.len(),
        &admin,
        "{ interval: 1s, timeout: 500ms, failureThreshold: 3, jitter: 0.1 }",
        "{ backoff: { initial: 200ms, max: 200ms, jitter: 0.0 }, stableAfter: 1s }",
        "[{ apiVersion: v1, kind: Namespace }, { apiVersion: v1, kind: ConfigMap }]",
    )?;
    let mut tether = start_tether(&config)?;
    until_all_reachable(&mut tether, &admin, 3)?;

    let mut report = json!({ "interval_seconds": interval, "failure_threshold": threshold, "timeout_seconds": deadline, "ideal_seconds": ideal });
    let mut rows = vec![(
        "ideal (threshold−1)·interval + deadline".to_owned(),
        format!("{ideal:.2}s"),
    )];
    let mut rebuilds = Vec::new();
    for fault in [Fault::Refuse, Fault::Hang] {
        let mut ratios = Vec::new();
        for trial in 0..trials {
            let i = trial % 3;
            // A random phase against the probe interval.
            std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
            let struck = now();
            remotes.set_fault(i, &fault)?;
            let (cancelled, _) = tether.wait_event("cycle ended", |at, f| {
                at >= struck && cause_is(f, "remote_lost")
            })?;
            let ratio = (cancelled - struck) / ideal;
            ratios.push(ratio);
            remotes.set_fault(i, &Fault::Up)?;
            // The way back: the recovery ends the cycle at once; the rebuild
            // is from there to the manager up, minus the backoff, with the
            // old manager's teardown included.
            let remote = name(i);
            let (recovered, _) = tether.wait_event("remote apiserver reachable", |at, f| {
                at > cancelled && names(f, &remote)
            })?;
            let (_, ended) = tether.wait_event("cycle ended", |at, f| {
                at >= recovered && cause_is(f, "remote_recovered")
            })?;
            let backoff = ended["next_backoff"]
                .as_str()
                .and_then(parse_debug_duration)
                .ok_or_else(|| format!("no next_backoff in {ended}"))?;
            let (up, _) = tether
                .wait_event("manager up: every required cache synced", |at, _| {
                    at > recovered
                })?;
            let rebuild_ms = (up - recovered - backoff) * 1000.0;
            rebuilds.push(rebuild_ms);
            eprintln!(
                "{fault} trial {}: cancel after {:.3}s (ratio {ratio:.3}); rebuild {rebuild_ms:.1} ms past the backoff",
                trial + 1,
                cancelled - struck
            );
        }
        let mut sorted = ratios.clone();
        let med = median(&mut sorted);
        rows.push((
            format!("{fault}: median ratio to ideal ({trials} trials)"),
            format!(
                "{med:.3} (min {:.3}, max {:.3})",
                sorted[0],
                sorted[sorted.len() - 1]
            ),
        ));
        report[fault.to_string()] = json!({ "ratios": ratios, "median_ratio": med });
    }
    let mut sorted = rebuilds.clone();
    let med = median(&mut sorted);
    rows.push((
        "rebuild: cancel to manager up − backoff (3 remotes × 2 resources)".to_owned(),
        format!("median {med:.1} ms, max {:.1} ms", sorted[sorted.len() - 1]),
    ));
    report["rebuild_ms"] =
        json!({ "samples": rebuilds, "median": med, "max": sorted[sorted.len() - 1] });

    if apiservers == Apiservers::Real {
        // A real process cannot refuse new connections while serving the
        // open ones; the rows below are the simulated remotes' alone.
        drop(tether);
        print_table(&rows);
        return Ok(report);
    }

    // refuse_new: the probe's kept connection still answers. With the
    // manager's hint, from its first failed reconnect to remote_lost; the
    // bound is (threshold−1)·interval + deadline, plus one interval.
    let mut hinted = Vec::new();
    for trial in 0..trials {
        let i = trial % 3;
        std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
        let struck = now();
        remotes.set_fault(i, &Fault::RefuseNew)?;
        let (failed, _) = tether.wait_event("watch failing; retrying with backoff", |at, f| {
            at >= struck && f["remote"] == name(i).as_str()
        })?;
        let (lost, _) = tether.wait_event("cycle ended", |at, f| {
            at >= struck && f["cause"] == format!("remote_lost (remote {})", name(i)).as_str()
        })?;
        hinted.push(lost - failed);
        eprintln!(
            "refuse_new trial {}: remote_lost {:.3}s after the first failed reconnect",
            trial + 1,
            lost - failed
        );
        remotes.set_fault(i, &Fault::Up)?;
        tether.wait_event("manager up: every required cache synced", |at, _| at > lost)?;
    }
    drop(tether);
    let bound = ideal + interval;
    let mut sorted = hinted.clone();
    let med = median(&mut sorted);
    rows.push((
        format!("refuse_new with the manager's hint: first failed reconnect to remote_lost (bound {bound:.1}s)"),
        format!("median {med:.2}s, max {:.2}s", sorted[sorted.len() - 1]),
    ));
    report["refuse_new_hinted_seconds"] =
        json!({ "samples": hinted, "median": med, "bound": bound });

    // Without a manager (watch: []), only the connection's age finds it.
    let max_age = 5.0;
    let config = tether_config(
        &remotes,
        remotes.len(),
        &admin,
        "{ interval: 1s, timeout: 500ms, failureThreshold: 3, jitter: 0.1, maxConnectionAge: 5s }",
        "{ backoff: { initial: 200ms, max: 200ms, jitter: 0.0 } }",
        "[]",
    )?;
    let mut tether = start_tether(&config)?;
    until_all_reachable(&mut tether, &admin, 3)?;
    let mut aged = Vec::new();
    for trial in 0..trials {
        let i = trial % 3;
        std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
        let struck = now();
        remotes.set_fault(i, &Fault::RefuseNew)?;
        let remote = name(i);
        let (lost, _) = tether.wait_event("remote apiserver unreachable", |at, f| {
            at >= struck && names(f, &remote)
        })?;
        aged.push(lost - struck);
        eprintln!(
            "refuse_new trial {} without a manager: unreachable {:.3}s after the fault",
            trial + 1,
            lost - struck
        );
        remotes.set_fault(i, &Fault::Up)?;
        tether.wait_event("remote apiserver reachable", |at, f| {
            at > lost && names(f, &remote)
        })?;
    }
    let bound = max_age + threshold * interval * 1.1 + deadline;
    let mut sorted = aged.clone();
    let med = median(&mut sorted);
    rows.push((
        format!("refuse_new without a manager (maxConnectionAge 5s): fault to unreachable (bound {bound:.1}s)"),
        format!("median {med:.2}s, max {:.2}s", sorted[sorted.len() - 1]),
    ));
    report["refuse_new_aged_seconds"] = json!({ "samples": aged, "median": med, "bound": bound });
    print_table(&rows);
    Ok(report)
}
