//! Helpers shared by the tests that run real processes.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

pub(crate) mod matrix;
pub(crate) mod mirror;
pub(crate) mod relay;
pub(crate) mod witness;

use std::fmt::Write as _;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_testkit::{ApiServer, Cluster, Options, Resource};
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::time::{Instant, timeout};

// Each test binary uses its own part of these.
#[allow(unused_imports)]
pub(crate) use tether_testkit::{EVERY, free_port, http_get, median_max, poll, until, until_every};

/// Polls `count` for up to five seconds until it reads `limit` or less.
/// What an ended cycle leaves behind must end, but its tasks and sockets may
/// take a moment to go; a leak never comes down. `Err` holds the last reading.
pub(crate) async fn comes_down_to(limit: usize, count: impl Fn() -> usize) -> Result<(), usize> {
    let every = Duration::from_millis(10);
    match poll(Duration::from_secs(5), every, async || {
        (count() <= limit).then_some(())
    })
    .await
    {
        Some(()) => Ok(()),
        None => Err(count()),
    }
}

/// Bound on anything a test waits for.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// A kubeconfig for `server` whose user runs `sh -c script` as its exec
/// credential plugin.
pub(crate) fn exec_kubeconfig(server: &ApiServer, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n\
         clusters: [{{name: x, cluster: {{server: \"{}\"}}}}]\n\
         users: [{{name: x, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: sh, args: [\"-c\", \"{script}\"], interactiveMode: Never}}}}}}]\n\
         contexts: [{{name: x, context: {{cluster: x, user: x}}}}]\n",
        server.url()
    )
}

/// Waits until `server` has answered `n` more probes.
pub(crate) async fn probes(server: &ApiServer, n: u64) {
    let start = server.requests("/readyz");
    until(
        format!("{n} more probes of the remote"),
        DEADLINE,
        async || (server.requests("/readyz") >= start + n).then_some(()),
    )
    .await;
}

/// The tether binary under test: this build's, or the one
/// `TETHER_UNDER_TEST` names, so that one test can measure an older build
/// ("before") beside this one ("after"); see docs/testkit.md.
pub(crate) fn binary() -> std::ffi::OsString {
    std::env::var_os("TETHER_UNDER_TEST")
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tether").into())
}

pub(crate) struct Tether {
    pub(crate) child: Child,
    pub(crate) admin: String,
    stderr: Arc<Mutex<String>>,
    /// Ends when tether's stderr closes.
    stderr_closed: tokio::task::JoinHandle<()>,
    stdout: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
    pub(crate) config: std::path::PathBuf,
}

/// What a probe may find at a port that refuses connections: "refused",
/// or, under load, "reset" for a connection the kernel had queued as the
/// listener closed.
pub(crate) const REFUSED: &[&str] = &["refused", "reset"];

/// A test that fails with a tether running prints its log: whatever
/// failed, a wait, an assertion or a panic in a helper.
impl Drop for Tether {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = self.logs();
            let tail = logs.len().saturating_sub(64 * 1024);
            let start = logs.ceil_char_boundary(tail);
            eprintln!("tether's log, as the test failed:\n{}", &logs[start..]);
        }
    }
}

/// Collects what `pipe` gives, as text, until it closes.
pub(crate) fn collect(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> Arc<Mutex<String>> {
    collect_until_closed(pipe).0
}

/// [`collect`], and the task that ends when the pipe closes: a test that
/// reads what a process said once it exited waits for that first, or it
/// may read half a line (seen on a loaded machine).
pub(crate) fn collect_until_closed(
    mut pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> (Arc<Mutex<String>>, tokio::task::JoinHandle<()>) {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&text);
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                return;
            }
            sink.lock()
                .expect("not poisoned")
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, task)
}

pub(crate) async fn remote(name: &str, tls: bool) -> ApiServer {
    let mut options = Options::default().name(name);
    if tls {
        options = options.tls(true).token(format!("{name}-token"));
    }
    let server = ApiServer::start(options).await.expect("server");
    for i in 0..3 {
        server
            .put(
                Resource::ConfigMap,
                "default",
                serde_json::json!({"metadata": {"name": format!("cm-{i}")}}),
            )
            .expect("put");
    }
    server
}

/// Writes `server`'s kubeconfig as `<dir>/<name>.kubeconfig`, and returns
/// its path.
pub(crate) fn write_kubeconfig(
    dir: &std::path::Path,
    name: &str,
    server: &impl Cluster,
) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    server.kubeconfig().write(&path).expect("kubeconfig");
    path
}

pub(crate) fn config_yaml<C: Cluster>(
    dir: &std::path::Path,
    admin: &str,
    remotes: &[(&str, &C)],
) -> String {
    config_yaml_with(dir, admin, remotes, &Shape::default())
}

/// What a test changes in the test config.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Shape<'a> {
    /// Added to the probe section, e.g. `, unreachableStatuses: [503]`.
    pub(crate) probe_extra: &'a str,
    /// The watch list; by default every ConfigMap.
    pub(crate) watch: Option<&'a str>,
    /// The remotes marked `required: false`.
    pub(crate) optional: &'a [&'a str],
    /// Kubeconfigs written as given instead of the server's own, by remote.
    pub(crate) kubeconfigs: &'a [(&'a str, &'a str)],
    /// Runs tether under `ulimit` with these arguments, e.g. `-n 128`
    /// (soft and hard) or `-Sn 64` (soft only).
    pub(crate) ulimit: Option<&'a str>,
    /// A `manager:` section (YAML, after `manager:`), in place of the watch
    /// list: the exec manager.
    pub(crate) manager: Option<&'a str>,
    /// Runs tether under this command, e.g. `unshare --pid --fork`.
    pub(crate) wrap: &'a [&'a str],
    /// Appended to the config, e.g. a `leaderElection:` section.
    pub(crate) extra: &'a str,
    /// `admin.drainWindow`; by default 1s.
    pub(crate) drain_window: Option<&'a str>,
    /// Set in tether's environment, e.g. `POD_NAME`.
    pub(crate) env: &'a [(&'a str, &'a str)],
}

/// The test config (interval 1s, timeout 500ms, threshold 3, no jitter,
/// backoff 1s to 4s, a drain window of 1s), changed as `shape` says.
pub(crate) fn config_yaml_with<C: Cluster>(
    dir: &std::path::Path,
    admin: &str,
    remotes: &[(&str, &C)],
    shape: &Shape<'_>,
) -> String {
    let manager = match shape.manager {
        Some(manager) => format!("manager: {manager}"),
        None => format!(
            "watch: {}",
            shape.watch.unwrap_or("[{apiVersion: v1, kind: ConfigMap}]")
        ),
    };
    let mut yaml = format!(
        "admin: {{address: \"{admin}\", drainWindow: {}}}\n\
         probe: {{interval: 1s, timeout: 500ms, failureThreshold: 3, jitter: 0.0{}}}\n\
         supervisor: {{backoff: {{initial: 1s, max: 4s, jitter: 0.0}}, shutdownGrace: 5s}}\n\
         {manager}\n",
        shape.drain_window.unwrap_or("1s"),
        shape.probe_extra,
    );
    for line in shape.extra.lines() {
        let _ = writeln!(yaml, "{line}");
    }
    let _ = writeln!(yaml, "remotes:");
    for (name, server) in remotes {
        let path = match shape.kubeconfigs.iter().find(|(n, _)| n == name) {
            Some((_, text)) => {
                let path = dir.join(format!("{name}.kubeconfig"));
                std::fs::write(&path, text).expect("kubeconfig");
                path
            }
            None => write_kubeconfig(dir, name, *server),
        };
        let required = !shape.optional.contains(name);
        let _ = writeln!(
            yaml,
            "- {{name: {name}, kubeconfig: {}, required: {required}}}",
            path.display()
        );
    }
    yaml
}

impl Tether {
    /// Writes `server`'s kubeconfig next to this tether's config file.
    pub(crate) fn write_kubeconfig(&self, name: &str, server: &impl Cluster) -> std::path::PathBuf {
        write_kubeconfig(self.config.parent().expect("a folder"), name, server)
    }

    pub(crate) fn run<C: Cluster>(remotes: &[(&str, &C)]) -> Self {
        Self::run_with(remotes, &[])
    }

    pub(crate) fn run_with<C: Cluster>(remotes: &[(&str, &C)], extra: &[&str]) -> Self {
        Self::start(remotes, extra, &Shape::default())
    }

    /// Runs `tether [extra] run` with the test config, changed as `shape`
    /// says.
    pub(crate) fn start<C: Cluster>(
        remotes: &[(&str, &C)],
        extra: &[&str],
        shape: &Shape<'_>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let admin = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("tether.yaml");
        std::fs::write(
            &config,
            config_yaml_with(dir.path(), &admin, remotes, shape),
        )
        .expect("config");
        let binary = binary();
        let mut command = match (shape.ulimit, shape.wrap) {
            (None, []) => Command::new(&binary),
            (None, [wrapper, args @ ..]) => {
                let mut command = Command::new(wrapper);
                command.args(args).arg(&binary);
                command
            }
            (Some(limit), _) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
                    .arg(&binary);
                command
            }
        };
        let mut child = command
            .args(extra)
            .arg("run")
            .arg("--config")
            .arg(&config)
            // The shipped default filter, not the developer's.
            .env_remove("RUST_LOG")
            .envs(shape.env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("tether starts");
        let (stderr, stderr_closed) = collect_until_closed(child.stderr.take().expect("piped"));
        let stdout = collect(child.stdout.take().expect("piped"));
        Self {
            child,
            admin,
            stderr,
            stderr_closed,
            stdout,
            _dir: dir,
            config,
        }
    }

    pub(crate) fn logs(&self) -> String {
        self.stderr.lock().expect("not poisoned").clone()
    }

    /// Panics, with the logs, if tether has exited: a wait for something
    /// it would do never ends well then (a port it could not bind, a bad
    /// config), and should say so at once.
    pub(crate) fn alive(&self) {
        let Some(pid) = self.child.id() else {
            panic!("tether was reaped already; logs:\n{}", self.logs());
        };
        // Field 3 of /proc/<pid>/stat, after the name in parentheses.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        assert!(
            !matches!(state, None | Some('Z' | 'X')),
            "tether has exited; logs:\n{}",
            self.logs()
        );
    }

    /// What tether wrote on stdout: the exec manager's process writes there.
    pub(crate) fn output(&self) -> String {
        self.stdout.lock().expect("not poisoned").clone()
    }

    /// When the first log event after `since` that `matches` was written,
    /// with `--log-format json`: its timestamp, as tether wrote it.
    pub(crate) fn first_event(
        &self,
        since: std::time::SystemTime,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<std::time::SystemTime> {
        self.logs().lines().find_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).ok()?;
            let at: jiff::Timestamp = event["timestamp"].as_str()?.parse().ok()?;
            let at = std::time::SystemTime::from(at);
            (at >= since && matches(&event)).then_some(at)
        })
    }

    /// `GET path` on the admin server: the status and the body.
    pub(crate) async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.admin, path).await
    }

    /// The value of one series, e.g. `tether_cycles_total{cause="remote_lost"}`.
    pub(crate) async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await?;
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The `remotes[]` entry of `name` in `/status.json`.
    pub(crate) async fn remote_status(&self, name: &str) -> Option<serde_json::Value> {
        let (_, body) = self.get("/status.json").await?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["remotes"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
    }

    /// Asserts that `name`'s last loss was one of `causes`: every kind the
    /// kernel may give for the fault (see [`REFUSED`]).
    pub(crate) async fn lost_for(&self, name: &str, causes: &[&str], context: &str) {
        let cause = self.last_cause(name).await;
        assert!(
            cause.as_deref().is_some_and(|c| causes.contains(&c)),
            "{context}: {name} was lost for {cause:?}, not one of {causes:?}"
        );
    }

    /// The cause of `name`'s last loss, as `/status.json` shows it.
    pub(crate) async fn last_cause(&self, name: &str) -> Option<String> {
        self.remote_status(name).await?["lastCause"]
            .as_str()
            .map(str::to_owned)
    }

    /// Polls until `pred` holds of the metric, checking `/healthz` each time.
    pub(crate) async fn until_metric(&self, series: &str, what: &str, pred: impl Fn(f64) -> bool) {
        until(format!("{series} {what}"), DEADLINE, async || {
            if let Some(value) = self.metric(series).await
                && pred(value)
            {
                return Some(());
            }
            self.alive();
            if let Some((code, body)) = self.get("/healthz").await {
                assert_eq!(
                    code, 200,
                    "/healthz failed while waiting for {what}: {body}"
                );
            }
            None
        })
        .await;
    }

    /// Waits until `remote` has failed `failures` probes in a row, then
    /// asserts that one `remote_lost` cycle is all the loss cost: no rebuild
    /// while it stays down.
    pub(crate) async fn still_lost_once(&self, remote: &str, failures: u32, why: &str) {
        let want = f64::from(failures);
        self.until_metric(
            &format!("tether_remote_probe_consecutive_failures{{remote=\"{remote}\"}}"),
            &format!(">= {failures}"),
            |v| v >= want,
        )
        .await;
        assert_eq!(
            self.metric("tether_cycles_total{cause=\"remote_lost\"}")
                .await,
            Some(1.0),
            "{why}"
        );
    }

    pub(crate) async fn until_ready(&self, ready: bool) {
        let want = if ready { 200 } else { 503 };
        until(format!("/readyz answers {want}"), DEADLINE, async || {
            let answer = self.get("/readyz").await.filter(|(code, _)| *code == want);
            if answer.is_none() {
                self.alive();
            }
            answer
        })
        .await;
    }

    pub(crate) fn signal(&self, signal: &str) {
        kill(self.child.id().expect("running"), signal);
    }

    /// Sends SIGTERM and asserts that tether exits 0 within `bound`.
    pub(crate) async fn terminates_cleanly_within(&mut self, bound: Duration) {
        let asked = Instant::now();
        self.signal("TERM");
        assert_eq!(self.wait().await.code(), Some(0), "{}", self.logs());
        assert!(
            asked.elapsed() < bound,
            "exit took {:?}, over {bound:?}",
            asked.elapsed()
        );
    }

    /// Waits for tether to exit, and for what it said to be read: its
    /// stderr closed (bounded: a child it left may hold the pipe open).
    pub(crate) async fn wait(&mut self) -> std::process::ExitStatus {
        let status = timeout(DEADLINE, self.child.wait())
            .await
            .expect("tether did not exit")
            .expect("wait works");
        let _ = timeout(Duration::from_secs(5), &mut self.stderr_closed).await;
        status
    }
}

/// The library stack of `tether run`, in process, wired as the daemon wires
/// it: probes and the built-in manager (caching ConfigMaps) for `remotes`,
/// all required, under a supervisor that ends cycles on the probes' signals
/// and whose backoff is 1ms so cycles follow each other at once.
pub(crate) struct InProcess {
    pub(crate) status: tether_supervisor::SupervisorHandle,
    pub(crate) manager: tether::managers::watch::ManagerHandle,
    pub(crate) root: tokio_util::sync::CancellationToken,
    pub(crate) run: tokio::task::JoinHandle<tether_supervisor::ShutdownOutcome>,
    /// Probing stops when this is dropped.
    pub(crate) probes: tether_probes::ProbeSet,
    pub(crate) registry: prometheus::Registry,
}

impl InProcess {
    /// Cancels the root token and waits for the supervisor: a clean stop,
    /// within 10s.
    pub(crate) async fn shuts_down_cleanly(self) {
        self.root.cancel();
        let outcome = timeout(Duration::from_secs(10), self.run)
            .await
            .expect("shutdown deadlocked?")
            .expect("no panic");
        assert_eq!(outcome, tether_supervisor::ShutdownOutcome::Clean);
    }
}

/// `pid`'s `/proc/<pid>/stat`, if it is still there.
pub(crate) fn stat(pid: u32) -> Option<procfs::process::Stat> {
    procfs::process::Process::new(i32::try_from(pid).ok()?)
        .and_then(|p| p.stat())
        .ok()
}

/// Whether `pid` still runs: gone, or a zombie, is not running.
pub(crate) fn running(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

/// The children of `parent`, from `/proc`.
pub(crate) fn children(parent: u32) -> Vec<u32> {
    procfs::process::all_processes()
        .expect("/proc")
        .filter_map(|p| p.ok()?.stat().ok())
        .filter(|s| u32::try_from(s.ppid).ok() == Some(parent))
        .filter_map(|s| u32::try_from(s.pid).ok())
        .collect()
}

/// Sends `signal` (`TERM`, `KILL`, `STOP`, ...) to `pid` with kill(1).
pub(crate) fn kill(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A real control plane (`scripts/peers`), started as `options` say.
pub(crate) async fn real_plane(
    options: tether_testkit::RealOptions,
) -> tether_testkit::ControlPlane {
    tether_testkit::ControlPlane::start(options)
        .await
        .unwrap_or_else(|err| panic!("the real control plane starts: {err}"))
}

/// How many trials a test that measures runs of each case:
/// `TETHER_TRIALS`, else `default`.
pub(crate) fn trials(default: usize) -> usize {
    std::env::var("TETHER_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The Lease `name` in `server`'s `default` namespace, as a client reads it.
pub(crate) async fn lease(
    server: &impl Cluster,
    name: &str,
) -> Option<k8s_openapi::api::coordination::v1::Lease> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = kube::Api::namespaced(
        kube::Client::try_from(config_of(server).await).expect("client"),
        "default",
    );
    leases.get_opt(name).await.expect("the apiserver answers")
}

pub(crate) async fn config_of(server: &impl Cluster) -> kube::Config {
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml()).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config")
}

pub(crate) async fn start_in_process(
    remotes: &[(&str, &ApiServer)],
    probe: tether_probes::ProbeConfig,
) -> InProcess {
    let required: Vec<_> = remotes
        .iter()
        .map(|(name, server)| (*name, *server, true))
        .collect();
    start_in_process_with(&required, probe).await
}

/// As [`start_in_process`], with each remote's `required` flag.
pub(crate) async fn start_in_process_with(
    remotes: &[(&str, &ApiServer, bool)],
    probe: tether_probes::ProbeConfig,
) -> InProcess {
    use tether::config::Plan;
    use tether::config::remote::ResolvedRemote;
    use tether::managers::watch::WatchManager;

    let registry = prometheus::Registry::new();
    let stale_after = probe.detection_bound();
    let probes = tether_probes::ProbeSet::new(probe, &registry).expect("probes");
    let mut resolved = Vec::new();
    for (name, server, required) in remotes {
        resolved.push(
            ResolvedRemote::new(
                *name,
                *required,
                tether::config::RemoteSource::Inferred,
                config_of(*server).await.into(),
            )
            .expect("a server to probe"),
        );
    }
    probes
        .sync(&tether::config::remote::probed(&resolved))
        .expect("sync");
    let watch = vec![tether::config::WatchSpec {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
        namespace: None,
        label_selector: None,
    }];
    let plan = Plan {
        remotes: resolved.into_iter().collect(),
        watch,
        exec: None,
    };
    let manager =
        WatchManager::new(&registry, probes.handle(), plan, stale_after).expect("manager");
    let manager_handle = manager.handle();
    let (status, root, run) = spawn_supervisor(
        manager,
        Duration::from_millis(1),
        Duration::from_millis(1),
        &registry,
        probes.handle().signals(),
    );
    InProcess {
        status,
        manager: manager_handle,
        root,
        run,
        probes,
        registry,
    }
}

/// Runs a supervisor over `factory`, ending cycles on `signals`, with an
/// unjittered backoff from `initial` to `max`: its handle, its root token,
/// and its task.
pub(crate) fn spawn_supervisor<F: tether_supervisor::ManagerFactory + 'static>(
    factory: F,
    initial: Duration,
    max: Duration,
    registry: &prometheus::Registry,
    signals: impl futures_util::Stream<Item = tether_supervisor::RemoteSignal> + Send + 'static,
) -> (
    tether_supervisor::SupervisorHandle,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<tether_supervisor::ShutdownOutcome>,
) {
    use tether_supervisor::{BackoffConfig, Supervisor, SupervisorConfig};

    let backoff = BackoffConfig::default()
        .with_initial(initial)
        .with_max(max)
        .with_jitter(0.0);
    let supervisor = Supervisor::new(
        factory,
        SupervisorConfig::default().with_backoff(backoff),
        registry,
    )
    .expect("supervisor")
    .end_cycles_on(signals);
    let status = supervisor.handle();
    let root = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));
    (status, root, run)
}

/// `kubectl --kubeconfig KUBECONFIG ARGS` with `stdin`; its output, or a
/// panic with its error.
pub(crate) fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: &str) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs (it is on the machines; see docs/testkit.md)");
    let mut input = child.stdin.take().expect("piped");
    input.write_all(stdin.as_bytes()).expect("stdin");
    drop(input);
    let out = child.wait_with_output().expect("kubectl ends");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Events on the Pod, as `kubectl get events --field-selector
/// involvedObject.name=POD` lists them: `(reason, type, message)`.
pub(crate) fn pod_events(home: &std::path::Path, pod: &str) -> Vec<(String, String, String)> {
    let selector = format!("--field-selector=involvedObject.name={pod}");
    let out = kubectl(
        home,
        &["get", "events", "-n", "default", "-o", "json", &selector],
        "",
    );
    let list: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| {
            let text = |key: &str| e[key].as_str().unwrap_or_default().to_owned();
            (text("reason"), text("type"), text("message"))
        })
        .collect()
}

/// Waits until the Pod's Events include every reason of `want`.
pub(crate) async fn until_events(
    home: &std::path::Path,
    pod: &str,
    want: &[&str],
) -> Vec<(String, String, String)> {
    let every = Duration::from_millis(200);
    let found = poll(DEADLINE, every, async || {
        Some(pod_events(home, pod))
            .filter(|events| want.iter().all(|w| events.iter().any(|(r, _, _)| r == w)))
    })
    .await;
    found.unwrap_or_else(|| {
        panic!(
            "never within {DEADLINE:?}: the Pod's Events include {want:?}; they are {:#?}",
            pod_events(home, pod)
        )
    })
}
