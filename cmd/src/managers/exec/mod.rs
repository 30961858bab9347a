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
//! A process cannot be restarted in part, so the manager uses every remote
//! of its plan, and the loss of any of them ends the cycle. The manager
//! counts as up while its readiness check passes (or once it has started,
//! without one) and every required remote is reachable.
//!
//! The process is told its remotes: `TETHER_REMOTES` (their names, in
//! config order, comma-separated, while they fit in 32 KiB) and
//! `TETHER_REMOTES_FILE` (a JSON file with each one's kubeconfig, in a
//! private folder that a later start removes if this run is killed). With sharding, that is this replica's share,
//! and a change of share ends the cycle, so the next process gets the new
//! one.
//!
//! The process dies with tether: it starts as `tether __exec-child`, which
//! asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`)
//! and then becomes the command. It is spawned from a thread that lives as
//! long as the manager, since the kernel sends that signal when the
//! *thread* that forked the child ends.
//!
//! By job:
//!
//! - here: the manager, its state and metrics, and what a cycle does;
//! - `program.rs`: finding the command, and starting it (the child shim,
//!   and the thread that forks);
//! - `remotes.rs`: what the process is told of its remotes (the variable,
//!   the file, the discovered clusters' kubeconfigs) and the private
//!   folder they live in;
//! - `group.rs`: the process group, and its stop: signal, grace, SIGKILL;
//! - `readiness.rs`: the readiness check, and the rule that makes the
//!   checks "ready".

mod group;
mod program;
mod readiness;
mod remotes;

use std::fmt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus::{IntCounter, IntGauge, Registry};
use rustix::process::Signal;
use tether_probes::{ProbeSetHandle, Reachability};
use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, UsedRemotes};
use tokio::process::Command;
use tracing::{info, warn};

use crate::config::{ExecSpec, Plan, StopSignal};
use crate::lock;

use self::group::{Group, pid_of, stop};
pub use self::program::{CHILD_SHIM, CommandError, become_child, find_command};
use self::program::{Spawner, spec_program};
use self::readiness::{Readiness, check};
pub use self::remotes::{Folder, remotes_folder};
use self::remotes::{MAX_REMOTES_VARIABLE, remotes_variable, write_remotes};

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
                let named = StopSignal::ALL
                    .iter()
                    .map(|s| (s.name(), s.signal()))
                    .chain([
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
    /// The remotes of the next cycle: the required ones, and what the
    /// process is told.
    plan: Mutex<Arc<Plan>>,
    probes: ProbeSetHandle,
    state: Mutex<ProcessState>,
    /// Registered at the first run's end: before it, there is no exit to
    /// report, and a 0 would read as a clean one.
    exit: std::sync::OnceLock<(IntGauge, IntGauge)>,
    registry: Registry,
    starts: IntCounter,
    /// Where each cycle's remotes file goes; removed with the manager.
    dir: Folder,
    /// The tether binary that starts as each child: `/proc/self/exe` in
    /// the daemon.
    launcher: PathBuf,
    spawner: Spawner,
}

/// Why the exec manager cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Its metrics' names are taken.
    #[error("registering the exec manager's metrics failed")]
    Metrics(#[from] prometheus::Error),
    /// The folder for its remotes file cannot be made.
    #[error(
        "cannot make and lock a folder for the manager's remotes file in {}; set TMPDIR to a writable folder (the chart mounts an emptyDir at /tmp)",
        std::env::temp_dir().display()
    )]
    Folder(#[source] std::io::Error),
    /// The thread that starts its processes cannot be started.
    #[error("cannot start the thread that starts the manager's processes")]
    Spawner(#[source] std::io::Error),
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
    /// A manager that runs `spec`, its metrics in `registry`. `plan` names
    /// the remotes (the required ones, and what the process is told), and
    /// `probes` says whether they are reachable. Each process
    /// starts as `launcher` (the tether binary: `/proc/self/exe` in the
    /// daemon) in its [`CHILD_SHIM`] role, which becomes the command.
    ///
    /// # Errors
    ///
    /// If the metric names are already registered, the remotes file's
    /// folder cannot be made, or the spawning thread cannot start (outside
    /// a tokio runtime among them).
    pub fn new(
        registry: &Registry,
        spec: ExecSpec,
        plan: Plan,
        probes: ProbeSetHandle,
        launcher: PathBuf,
    ) -> Result<Self, SetupError> {
        let starts = IntCounter::new(
            "tether_manager_process_starts_total",
            "Processes the exec manager started.",
        )?;
        registry.register(Box::new(starts.clone()))?;
        Ok(Self {
            shared: Arc::new(Shared {
                spec: Mutex::new(Arc::new(spec)),
                plan: Mutex::new(Arc::new(plan)),
                probes,
                state: Mutex::default(),
                exit: std::sync::OnceLock::new(),
                registry: registry.clone(),
                starts,
                dir: remotes_folder()?,
                launcher,
                spawner: Spawner::start().map_err(SetupError::Spawner)?,
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
    /// Replaces the plan, and the spec if it has one; the next cycle runs
    /// them.
    pub fn update(&self, plan: Arc<Plan>) {
        if let Some(spec) = &plan.exec {
            *lock(&self.shared.spec) = Arc::new(spec.clone());
        }
        *lock(&self.shared.plan) = plan;
    }

    /// The plan the next cycle runs.
    #[must_use]
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&lock(&self.shared.plan))
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

impl Shared {
    fn required_reachable(&self) -> bool {
        lock(&self.plan)
            .required()
            .iter()
            .all(|name| self.probes.state_of(name) == Some(Reachability::Reachable))
    }

    /// Keeps the cycle's `manager_up` true while the process is ready and
    /// every required remote is reachable: the readiness check runs every
    /// period, and the remotes are looked at again at each of the probes'
    /// transitions. Never returns.
    async fn follow_readiness(&self, spec: &ExecSpec, cycle: &CycleToken) {
        let mut transitions = self.probes.subscribe();
        let mut readiness = Readiness::new(spec.readiness.as_ref());
        let mut up = false;
        let mut probes_gone = false;
        loop {
            let now = readiness.ready() && self.required_reachable();
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
            tokio::select! {
                // The check runs here, to its end: a transition waits
                // for it rather than cut it short.
                () = readiness.due() => readiness.run(check).await,
                seen = transitions.recv(), if !probes_gone => {
                    // Lagged: look at every remote now, which is what a
                    // transition asks for anyway. Closed: the probes are
                    // gone with the process; only the check is left.
                    probes_gone = matches!(
                        seen,
                        Err(tokio::sync::broadcast::error::RecvError::Closed)
                    );
                }
            }
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

    /// A process started against a lost remote could only wait on it, or
    /// fail its cache sync: it starts when none is lost.
    fn waits_for_lost_remotes(&self) -> bool {
        true
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        let spec = Arc::clone(&lock(&shared.spec));
        let plan = Arc::clone(&lock(&shared.plan));
        let (program, args) = spec
            .command
            .split_first()
            .expect("validation requires a command");
        let fail = |source: std::io::Error| {
            let err = SpawnError {
                program: program.clone(),
                source,
            };
            lock(&shared.state).spawn_error = Some(tether_supervisor::error_chain(&err));
            ManagerError::build(err)
        };
        // Found here too (`validate` and the start check it first), so that
        // a program removed since is this cycle's build failure, named,
        // rather than the shim's exit code.
        spec_program(&spec).map_err(fail)?;
        let remotes_file =
            write_remotes(shared.dir.path(), cycle.number(), &plan.remotes).map_err(fail)?;
        let names = remotes_variable(&plan.remotes);
        let mut command = Command::new(&shared.launcher);
        command
            .arg(CHILD_SHIM)
            .arg(rustix::process::getpid().as_raw_nonzero().get().to_string())
            .arg("--")
            .arg(program)
            .args(args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("TETHER_CYCLE", cycle.number().to_string())
            .env("TETHER_REMOTES_FILE", &remotes_file)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0);
        match &names {
            Ok(names) => {
                command.env("TETHER_REMOTES", names);
            }
            Err(size) => {
                command.env_remove("TETHER_REMOTES");
                warn!(
                    cycle = cycle.number(),
                    remotes = plan.remotes.len(),
                    size,
                    "TETHER_REMOTES is not set: the remotes' names pass the {} KiB tether puts in one environment variable; the process finds them in TETHER_REMOTES_FILE",
                    MAX_REMOTES_VARIABLE / 1024
                );
            }
        }
        if let Some(dir) = &spec.working_dir {
            command.current_dir(dir);
        }
        // tether waits for this child itself: the PID 1 reaper leaves it,
        // and its group's stray members are not escapees.
        let (mut child, _own) = shared.spawner.spawn(command).await.map_err(fail)?;
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
                group.stop_leftovers(spec.stop_signal.signal(), spec.grace_period).await;
                (how, false)
            }
            () = cycle.cancelled() => {
                (stop(&mut child, &group, spec.stop_signal.signal(), spec.grace_period).await, true)
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
