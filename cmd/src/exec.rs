//! The exec manager: any controller process, run as each cycle's manager.
//!
//! Each cycle spawns the command in a process group of its own, with stdin
//! from `/dev/null` and stdout and stderr passed through unchanged. The
//! cycle's end stops the whole group: the stop signal, then SIGKILL after
//! the grace period, then the reap. No process of the group outlives its
//! cycle, grandchildren included (one that leaves the group with `setsid`
//! is its own business). A process that ends by itself ends the cycle:
//! exit 0 as `manager_exited`, anything else as `manager_failed`; a spawn
//! error is `build_failed`. The supervisor's backoff spaces the restarts.
//!
//! A process cannot be restarted in part, so the manager uses every remote,
//! and the loss of any of them ends the cycle. The manager counts as up
//! while its readiness check passes (or once it has started, without one)
//! and every required remote is reachable.

use std::fmt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use prometheus::{IntCounter, IntGauge, Registry};
use rustix::process::{Pid, Signal};
use tether_probes::{ProbeSetHandle, Reachability};
use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, UsedRemotes};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};
use tracing::{info, warn};

use crate::config::{ExecSpec, ReadinessSpec};
use crate::lock;
use crate::manager::ManagerHandle;
use crate::reaper;

/// How often a stopping group is checked for members left.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long SIGKILL may take to empty a group before tether goes on.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How often the required remotes are looked at, without a readiness check.
const GATE_PERIOD: Duration = Duration::from_secs(1);

/// How a run of the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitHow {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl ExitHow {
    fn of(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Code(code),
            (None, Some(signal)) => Self::Signal(signal),
            (None, None) => Self::Code(-1),
        }
    }
}

impl fmt::Display for ExitHow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(code) => write!(f, "exit code {code}"),
            Self::Signal(signal) => {
                let named = crate::config::STOP_SIGNALS
                    .iter()
                    .chain(&[
                        ("SIGKILL", Signal::KILL),
                        ("SIGSEGV", Signal::SEGV),
                        ("SIGABRT", Signal::ABORT),
                    ])
                    .find(|(_, known)| known.as_raw() == *signal);
                match named {
                    Some((name, _)) => write!(f, "killed by {name}"),
                    None => write!(f, "killed by signal {signal}"),
                }
            }
        }
    }
}

/// The process ended by itself with a failure.
#[derive(Debug, thiserror::Error)]
#[error("the manager process ended with {0}")]
pub struct ExitError(pub ExitHow);

/// The process could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start {program:?}")]
pub struct SpawnError {
    /// The program, as configured.
    pub program: String,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// The last run's end, for `/status`.
#[derive(Debug, Clone)]
pub struct LastExit {
    /// The cycle it ran in.
    pub cycle: u64,
    /// When it ended.
    pub at: SystemTime,
    /// How.
    pub how: ExitHow,
    /// Whether tether stopped it (the cycle ended), rather than it ending
    /// by itself.
    pub stopped: bool,
}

/// What the process is doing, for `/status`.
#[derive(Debug, Clone, Default)]
pub struct ProcessState {
    /// The running process, if one runs.
    pub pid: Option<u32>,
    /// The cycle the running process belongs to.
    pub cycle: u64,
    /// When it started.
    pub started: Option<SystemTime>,
    /// How the last run ended.
    pub last_exit: Option<LastExit>,
    /// The last spawn error, until a spawn succeeds.
    pub spawn_error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    spec: Mutex<Arc<ExecSpec>>,
    manager: ManagerHandle,
    probes: ProbeSetHandle,
    state: Mutex<ProcessState>,
    /// Registered at the first run's end: before it, there is no exit to
    /// report, and a 0 would read as a clean one.
    exit: std::sync::OnceLock<(IntGauge, IntGauge)>,
    registry: Registry,
    starts: IntCounter,
}

/// The exec manager.
#[derive(Debug)]
pub struct ExecManager {
    shared: Arc<Shared>,
}

/// A view of the exec manager, for reloads, the admin server and the
/// second signal.
#[derive(Debug, Clone)]
pub struct ProcessHandle {
    shared: Arc<Shared>,
}

impl ExecManager {
    /// A manager that runs `spec`, its metrics in `registry`. `manager`
    /// names the required remotes, and `probes` says whether they are
    /// reachable.
    ///
    /// # Errors
    ///
    /// If the metric names are already registered.
    pub fn new(
        registry: &Registry,
        spec: ExecSpec,
        manager: ManagerHandle,
        probes: ProbeSetHandle,
    ) -> prometheus::Result<Self> {
        let starts = IntCounter::new(
            "tether_manager_process_starts_total",
            "Processes the exec manager started.",
        )?;
        registry.register(Box::new(starts.clone()))?;
        Ok(Self {
            shared: Arc::new(Shared {
                spec: Mutex::new(Arc::new(spec)),
                manager,
                probes,
                state: Mutex::default(),
                exit: std::sync::OnceLock::new(),
                registry: registry.clone(),
                starts,
            }),
        })
    }

    /// A view for reloads, the admin server and the second signal.
    #[must_use]
    pub fn handle(&self) -> ProcessHandle {
        ProcessHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl ProcessHandle {
    /// Replaces the spec; the next cycle runs it.
    pub fn update(&self, spec: ExecSpec) {
        *lock(&self.shared.spec) = Arc::new(spec);
    }

    /// The spec the next cycle runs.
    #[must_use]
    pub fn spec(&self) -> Arc<ExecSpec> {
        Arc::clone(&lock(&self.shared.spec))
    }

    /// What the process is doing.
    #[must_use]
    pub fn state(&self) -> ProcessState {
        lock(&self.shared.state).clone()
    }

    /// Sends SIGKILL to the running group at once: the second SIGTERM.
    pub fn kill_now(&self) {
        if let Some(group) = lock(&self.shared.state).pid.and_then(pid_of) {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
    }
}

fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// A running process group: SIGKILL on drop, so that a cycle whose future
/// is dropped (shutdown past its grace) leaves nothing behind.
struct Group(Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(self.0, Signal::KILL);
    }
}

impl Group {
    fn signal(&self, signal: Signal) {
        let _ = rustix::process::kill_process_group(self.0, signal);
    }

    /// Whether no process of the group is alive. Zombies count as gone:
    /// they are dead, and whoever they were reparented to reaps them.
    fn is_empty(&self) -> bool {
        let group = self.0.as_raw_nonzero().get();
        !reaper::processes().any(|(_, stat)| stat.pgrp == group && !stat.is_zombie())
    }

    /// Waits until the group is empty, or `within` has passed; returns
    /// whether it emptied.
    async fn emptied_within(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            sleep(GROUP_POLL).await;
        }
        true
    }

    /// Stops what is left of the group after its leader was reaped:
    /// `signal`, then SIGKILL after `grace`.
    async fn stop_leftovers(&self, signal: Signal, grace: Duration) {
        if self.is_empty() {
            return;
        }
        warn!(
            group = self.0.as_raw_nonzero().get(),
            "the manager process left processes behind; stopping them"
        );
        self.signal(signal);
        if !self.emptied_within(grace).await {
            self.signal(Signal::KILL);
            if !self.emptied_within(KILL_WAIT).await {
                warn!(
                    group = self.0.as_raw_nonzero().get(),
                    "processes of the group outlived SIGKILL"
                );
            }
        }
    }
}

/// Stops `child` and its group: `signal`, then SIGKILL after `grace`; waits
/// for the child. Returns how it ended.
async fn stop(child: &mut Child, group: &Group, signal: Signal, grace: Duration) -> ExitHow {
    let started = Instant::now();
    group.signal(signal);
    let status = if let Ok(status) = timeout(grace, child.wait()).await {
        status
    } else {
        warn!(
            ?grace,
            "the manager process did not stop within its grace period; SIGKILL"
        );
        group.signal(Signal::KILL);
        child.wait().await
    };
    let how = status.map_or(ExitHow::Code(-1), ExitHow::of);
    group
        .stop_leftovers(signal, grace.saturating_sub(started.elapsed()))
        .await;
    how
}

/// One readiness check: any 2xx within `spec.timeout`.
async fn check(spec: &ReadinessSpec) -> bool {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", spec.port))
            .await
            .ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(connection);
        let request = http::Request::get(spec.path.as_str())
            .header(http::header::HOST, format!("127.0.0.1:{}", spec.port))
            .body(Empty::<bytes::Bytes>::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        Some(response.status().is_success())
    };
    timeout(spec.timeout, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

impl Shared {
    fn required_reachable(&self) -> bool {
        self.manager
            .required()
            .iter()
            .all(|name| self.probes.state_of(name) == Some(Reachability::Reachable))
    }

    /// Keeps the cycle's `manager_up` true while the process is ready and
    /// every required remote is reachable. Never returns.
    async fn follow_readiness(&self, spec: &ExecSpec, cycle: &CycleToken) {
        let mut ready = false;
        let mut failures = 0;
        let mut up = false;
        loop {
            let period = match &spec.readiness {
                None => {
                    ready = true;
                    GATE_PERIOD
                }
                Some(readiness) => {
                    if check(readiness).await {
                        failures = 0;
                        ready = true;
                    } else {
                        failures += 1;
                        if ready && failures >= readiness.failure_threshold {
                            ready = false;
                        }
                    }
                    readiness.period
                }
            };
            let now = ready && self.required_reachable();
            if now != up && cycle.set_manager_up(now) {
                up = now;
                if up {
                    info!(cycle = cycle.number(), "manager up: the process is ready");
                } else {
                    warn!(
                        cycle = cycle.number(),
                        "manager down: the process is not ready, or a required remote is unreachable"
                    );
                }
            }
            sleep(period).await;
        }
    }

    fn record_exit(&self, cycle: u64, how: ExitHow, stopped: bool) {
        let (code, signal) = match how {
            ExitHow::Code(code) => (code, 0),
            ExitHow::Signal(signal) => (-1, signal),
        };
        let (exit_code, exit_signal) = self.exit.get_or_init(|| {
            let gauges = (
                IntGauge::new(
                    "tether_manager_process_exit_code",
                    "The exit code of the exec manager's last run; -1 if a signal ended it.",
                )
                .expect("a valid name and help"),
                IntGauge::new(
                    "tether_manager_process_exit_signal",
                    "The signal that ended the exec manager's last run; 0 if it exited.",
                )
                .expect("a valid name and help"),
            );
            for gauge in [&gauges.0, &gauges.1] {
                if let Err(err) = self.registry.register(Box::new(gauge.clone())) {
                    warn!(error = %err, "cannot export the exit of the manager process");
                }
            }
            gauges
        });
        exit_code.set(i64::from(code));
        exit_signal.set(i64::from(signal));
        let mut state = lock(&self.state);
        state.pid = None;
        state.started = None;
        state.last_exit = Some(LastExit {
            cycle,
            at: SystemTime::now(),
            how,
            stopped,
        });
    }
}

impl ManagerFactory for ExecManager {
    fn remotes(&self) -> UsedRemotes {
        UsedRemotes::All
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        let spec = Arc::clone(&lock(&shared.spec));
        let (program, args) = spec
            .command
            .split_first()
            .expect("validation requires a command");
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("TETHER_CYCLE", cycle.number().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0);
        if let Some(dir) = &spec.working_dir {
            command.current_dir(dir);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(source) => {
                let err = SpawnError {
                    program: program.clone(),
                    source,
                };
                lock(&shared.state).spawn_error = Some(tether_supervisor::error_chain(&err));
                return Err(ManagerError::build(err));
            }
        };
        let pid = child
            .id()
            .expect("a child that was not waited for has its id");
        let group = Group(pid_of(pid).expect("a child's pid is positive"));
        shared.starts.inc();
        {
            let mut state = lock(&shared.state);
            state.pid = Some(pid);
            state.cycle = cycle.number();
            state.started = Some(SystemTime::now());
            state.spawn_error = None;
        }
        info!(cycle = cycle.number(), pid, command = %crate::human::command(&spec.command), "manager process started");

        let readiness = shared.follow_readiness(&spec, &cycle);
        let (how, stopped) = tokio::select! {
            status = child.wait() => {
                let how = status.map_or(ExitHow::Code(-1), ExitHow::of);
                group.stop_leftovers(spec.signal(), spec.grace_period).await;
                (how, false)
            }
            () = cycle.cancelled() => {
                (stop(&mut child, &group, spec.signal(), spec.grace_period).await, true)
            }
            () = readiness => unreachable!("readiness is followed until the process ends"),
        };
        cycle.set_manager_up(false);
        shared.record_exit(cycle.number(), how, stopped);
        if stopped {
            info!(cycle = cycle.number(), pid, exit = %how, "manager process stopped");
            return Ok(());
        }
        match how {
            ExitHow::Code(0) => {
                info!(
                    cycle = cycle.number(),
                    pid, "manager process exited with code 0"
                );
                Ok(())
            }
            how => {
                warn!(cycle = cycle.number(), pid, exit = %how, "manager process failed");
                Err(ManagerError::failed(ExitError(how)))
            }
        }
    }
}
