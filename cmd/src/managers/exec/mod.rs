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
//! The manager uses every remote of its plan. The loss of a required one
//! ends the cycle, and no process starts while one is lost. An optional
//! one costs less, in one of two ways (`docs/exec.md`):
//!
//! - a process that follows its remotes file (`followsRemotesFile`) is
//!   never restarted for it: the file marks it unreachable, then reachable
//!   again; a remote added, removed or read anew, or a share moved, is
//!   written into the file in the running cycle too, and a remote dropped
//!   from it runs until the process says it let it go
//!   (`TETHER_APPLIED_FILE`, `leaving.rs`);
//! - any other process is restarted without it, and restarted with it once
//!   it has stayed reachable for `putBackAfter`, in the same cycle.
//!
//! The manager counts as up while its readiness check passes (or once it
//! has started, without one) and every required remote is reachable.
//!
//! The process is told its remotes: `TETHER_REMOTES` (their names, in
//! config order, comma-separated, while they fit in 32 KiB) and
//! `TETHER_REMOTES_FILE` (a versioned JSON file with each one's
//! kubeconfig, generation and reachability, replaced whole at each change,
//! in a private folder that a later start removes if this run is killed).
//! With sharding, that is this replica's share; a change of share ends
//! the cycle of a process that does not follow its file, so the next
//! process gets the new one.
//!
//! The process dies with tether: it starts as `tether __exec-child`, which
//! asks the kernel for SIGKILL when its parent dies (`PR_SET_PDEATHSIG`)
//! and then becomes the command. It is spawned from a thread that lives as
//! long as the manager, since the kernel sends that signal when the
//! *thread* that forked the child ends.
//!
//! With `launcher`, the process runs in another container instead, out of
//! reach of tether's credentials: `tether launcher` there starts and stops
//! it as this manager asks, over a Unix socket whose closing is the fence;
//! with `serviceAccount`, the process reaches the home cluster with tokens
//! of its own, which tether requests and renews.
//!
//! By job:
//!
//! - here: the manager, its state and metrics, and what a cycle does;
//! - `program.rs`: finding the command, and starting it (the child shim,
//!   and the thread that forks);
//! - `process.rs`: a run of the process, here or in the launcher's
//!   container: its wait and its stop;
//! - `launcher.rs`: `tether launcher`, and tether's side of its socket;
//! - `home_token.rs`: the process's own home token and kubeconfig;
//! - `remotes.rs`: what the process is told of its remotes (the variable,
//!   the file, the discovered clusters' kubeconfigs) and the private
//!   folder they live in;
//! - `group.rs`: the process group, and its stop: signal, grace, SIGKILL;
//! - `left_out.rs`: the optional remotes a process that does not follow
//!   its file is restarted without, and when each is put back;
//! - `leaving.rs`: the remotes a follower was told to let go, until it
//!   says it has;
//! - `readiness.rs`: the readiness check, and the rule that makes the
//!   checks "ready".

mod group;
mod home_token;
mod launcher;
mod leaving;
mod left_out;
mod process;
mod program;
mod readiness;
mod remotes;

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use rustix::process::Signal;
use tether_probes::{ProbeSetHandle, Reachability};
use tether_supervisor::{Cause, CycleToken, ManagerError, ManagerFactory, UsedRemotes};
use tokio::sync::watch as channel;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::remote::ResolvedRemote;
use crate::config::{ExecSpec, Plan, StopSignal};
use crate::lock;

use self::home_token::HomeToken;
pub use self::launcher::serve as serve_launcher;
use self::leaving::{Leaving, read_applied};
use self::left_out::{LeftOut, Restart};
use self::process::{Killer, Process};
pub use self::program::{CHILD_SHIM, CommandError, become_child, find_command};
use self::program::{Spawner, Start, spec_program};
use self::readiness::{Readiness, check};
pub use self::remotes::REMOTES_FILE_VERSION;
pub use self::remotes::{Folder, remotes_folder};
use self::remotes::{MAX_REMOTES_VARIABLE, Written, remotes_variable, write_remotes};

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
    /// Counts the plans taken in, so a running cycle hears of each.
    plans: channel::Sender<u64>,
    /// The remotes the process is told of now; none while none runs.
    running: channel::Sender<BTreeSet<String>>,
    /// The revision of the last remotes file written.
    revision: AtomicU64,
    /// Restarts within a cycle, by why.
    restarts: IntCounterVec,
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
    binary: PathBuf,
    spawner: Spawner,
    /// Kills the running group at once, while one runs.
    kill: Mutex<Option<Killer>>,
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
    /// starts as `binary` (the tether binary: `/proc/self/exe` in the
    /// daemon) in its [`CHILD_SHIM`] role, which becomes the command; or
    /// in the launcher's container, when the spec names one.
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
        binary: PathBuf,
    ) -> Result<Self, SetupError> {
        let starts = IntCounter::new(
            "tether_manager_process_starts_total",
            "Processes the exec manager started.",
        )?;
        registry.register(Box::new(starts.clone()))?;
        let restarts = IntCounterVec::new(
            Opts::new(
                "tether_manager_process_restarts_total",
                "Restarts of the exec manager's process within a cycle, by why: an optional remote left out for its loss, or put back once it stayed reachable.",
            ),
            &["reason"],
        )?;
        for reason in Restart::ALL {
            restarts.with_label_values(&[reason.as_str()]);
        }
        registry.register(Box::new(restarts.clone()))?;
        Ok(Self {
            shared: Arc::new(Shared {
                spec: Mutex::new(Arc::new(spec)),
                plan: Mutex::new(Arc::new(plan)),
                plans: channel::Sender::new(0),
                running: channel::Sender::new(BTreeSet::new()),
                revision: AtomicU64::new(0),
                restarts,
                probes,
                state: Mutex::default(),
                exit: std::sync::OnceLock::new(),
                registry: registry.clone(),
                starts,
                dir: remotes_folder()?,
                binary,
                spawner: Spawner::start().map_err(SetupError::Spawner)?,
                kill: Mutex::new(None),
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
        let mut now = lock(&self.shared.plan);
        if !Arc::ptr_eq(&now, &plan) {
            *now = plan;
            self.shared.plans.send_modify(|n| *n += 1);
        }
    }

    /// The remotes the process is told of now, as it changes; none while
    /// none runs.
    #[must_use]
    pub fn running(&self) -> channel::Receiver<BTreeSet<String>> {
        self.shared.running.subscribe()
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
        if let Some(killer) = &*lock(&self.shared.kill) {
            killer.kill();
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
        *lock(&self.kill) = None;
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

/// How one process of a cycle ended.
enum Ended {
    /// By itself.
    Exited(std::io::Result<ExitHow>),
    /// The cycle ended.
    Stopped,
    /// Restarted within the cycle.
    Restart(Restart),
}

/// What a remotes file tells, to compare with the last one written: each
/// remote's name, generation, and reachability.
type Telling = Vec<(String, u64, bool)>;

/// What one run of the process was told: the last file, and the remotes
/// it was told to let go and has not said it did.
#[derive(Debug)]
struct Told {
    /// Names this run; an acknowledgement counts only with it.
    instance: String,
    telling: Telling,
    leaving: Leaving,
}

impl Told {
    /// A new run's: nothing told yet.
    fn new() -> Self {
        Self {
            instance: format!("{:016x}", fastrand::u64(..)),
            telling: Telling::new(),
            leaving: Leaving::default(),
        }
    }

    /// For a follower with remotes leaving: takes in what it says it
    /// applied (`applied`), and lets go, in `running`, of the remotes it
    /// has. Says to restart it if one has been leaving for longer than
    /// [`RELEASE_WITHIN`].
    fn released(
        &mut self,
        applied: Option<&Path>,
        running: &super::Running<'_>,
    ) -> Option<Restart> {
        if self.leaving.is_empty() {
            return None;
        }
        let revision = applied.and_then(|path| read_applied(path, &self.instance));
        if revision.is_some_and(|revision| self.leaving.applied(revision)) {
            info!(
                revision,
                "the process let go of the remotes dropped from its file"
            );
            running.set(self.running());
        }
        self.leaving
            .overdue(RELEASE_WITHIN)
            .then_some(Restart::NotReleased)
    }

    /// What runs: the remotes of the last file, and those leaving.
    fn running(&self) -> BTreeSet<String> {
        self.telling
            .iter()
            .map(|(name, _, _)| name.clone())
            .chain(self.leaving.names().cloned())
            .collect()
    }
}

/// What a file listing `listed`, `lost` among them, tells.
fn telling(listed: &[&ResolvedRemote], lost: &BTreeSet<String>) -> Telling {
    listed
        .iter()
        .map(|r| (r.name.clone(), r.generation, !lost.contains(&r.name)))
        .collect()
}

impl Shared {
    /// The remotes the process is told of, under `plan`: all of them, but
    /// those left out; and of those, the ones the probes call lost.
    fn listed<'a>(
        &self,
        plan: &'a Plan,
        left_out: &LeftOut,
    ) -> (Vec<&'a ResolvedRemote>, BTreeSet<String>) {
        let listed: Vec<&ResolvedRemote> = plan
            .remotes
            .iter()
            .filter(|r| !left_out.contains(&r.name))
            .collect();
        let lost = listed
            .iter()
            .filter(|r| self.lost(&r.name))
            .map(|r| r.name.clone())
            .collect();
        (listed, lost)
    }

    /// Whether the probes call `remote` lost.
    fn lost(&self, remote: &str) -> bool {
        self.probes.state_of(remote) == Some(Reachability::Unreachable)
    }

    /// Writes the remotes file for `listed`, as a new revision, into
    /// `told`, and says what runs: those, and any it dropped that are
    /// still leaving.
    fn tell(
        &self,
        cycle: u64,
        listed: &[&ResolvedRemote],
        lost: &BTreeSet<String>,
        running: &super::Running<'_>,
        told: &mut Told,
    ) -> std::io::Result<PathBuf> {
        let revision = self.revision.fetch_add(1, Ordering::Relaxed) + 1;
        let file = write_remotes(
            self.dir.path(),
            Written {
                cycle,
                revision,
                instance: &told.instance,
                remotes: listed,
                lost,
            },
        )?;
        let before: BTreeSet<String> = told.telling.iter().map(|(n, _, _)| n.clone()).collect();
        let now: BTreeSet<String> = listed.iter().map(|r| r.name.clone()).collect();
        told.leaving.told(&before, &now, revision);
        told.telling = telling(listed, lost);
        running.set(told.running());
        Ok(file)
    }

    /// For a process that follows its remotes file: writes a new one if
    /// what the plan and the probes say now differs from `told`.
    fn retell(&self, cycle: u64, pid: u32, told: &mut Told, running: &super::Running<'_>) {
        let plan = Arc::clone(&lock(&self.plan));
        let (listed, lost) = self.listed(&plan, &LeftOut::default());
        if telling(&listed, &lost) == told.telling {
            return;
        }
        match self.tell(cycle, &listed, &lost, running, told) {
            Ok(_) => {
                let revision = self.revision.load(Ordering::Relaxed);
                info!(
                    cycle,
                    pid,
                    revision,
                    remotes = listed.len(),
                    lost = lost.len(),
                    "remotes file rewritten; the process follows it"
                );
            }
            Err(err) => {
                warn!(cycle, error = %err, "cannot rewrite the remotes file; the process keeps the last one");
            }
        }
    }

    /// Starts the process of `cycle` on `spec`, told of `listed` through
    /// `file`, and of its own home credentials through `home` (a
    /// kubeconfig) if it has them.
    async fn spawn(
        &self,
        cycle: &CycleToken,
        spec: &ExecSpec,
        listed: &[&ResolvedRemote],
        file: &Path,
        home: Option<&Path>,
        applied: Option<&Path>,
    ) -> std::io::Result<Process> {
        let utf8 = |path: &Path| {
            path.to_str().map(str::to_owned).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "{} is not UTF-8: set TMPDIR to a UTF-8 folder",
                        path.display()
                    ),
                )
            })
        };
        let mut start = Start {
            version: launcher::VERSION,
            cycle: cycle.number(),
            command: spec.command.clone(),
            env: spec.env.clone(),
            unset: Vec::new(),
            working_dir: spec.working_dir.clone(),
            stop_signal: spec.stop_signal.signal().as_raw(),
            grace_ms: u64::try_from(spec.grace_period.as_millis()).unwrap_or(u64::MAX),
        };
        start
            .env
            .push(("TETHER_CYCLE".to_owned(), cycle.number().to_string()));
        start
            .env
            .push(("TETHER_REMOTES_FILE".to_owned(), utf8(file)?));
        if let Some(home) = home {
            start.env.push(("KUBECONFIG".to_owned(), utf8(home)?));
        }
        if let Some(applied) = applied {
            start
                .env
                .push(("TETHER_APPLIED_FILE".to_owned(), utf8(applied)?));
        }
        match remotes_variable(listed) {
            Ok(names) => start.env.push(("TETHER_REMOTES".to_owned(), names)),
            Err(size) => {
                start.unset.push("TETHER_REMOTES".to_owned());
                warn!(
                    cycle = cycle.number(),
                    remotes = listed.len(),
                    size,
                    "TETHER_REMOTES is not set: the remotes' names pass the {} KiB tether puts in one environment variable; the process finds them in TETHER_REMOTES_FILE",
                    MAX_REMOTES_VARIABLE / 1024
                );
            }
        }
        let process = Process::start(
            &self.spawner,
            &self.binary,
            spec.launcher.as_deref(),
            &start,
        )
        .await?;
        let pid = process.pid();
        *lock(&self.kill) = Some(process.killer());
        self.starts.inc();
        {
            let mut state = lock(&self.state);
            state.pid = Some(pid);
            state.cycle = cycle.number();
            state.started = Some(SystemTime::now());
            state.spawn_error = None;
        }
        // The pid is in the container the process runs in.
        let started_by = spec.launcher.as_ref().map_or_else(
            || "tether".to_owned(),
            |socket| format!("the launcher on {}", socket.display()),
        );
        info!(cycle = cycle.number(), pid, remotes = listed.len(), started_by, command = %crate::human::command(&spec.command), "manager process started");
        Ok(process)
    }

    /// The cycle's build failure: `source`, starting `spec`'s program;
    /// also kept for `/status`.
    fn spawn_failed(&self, spec: &ExecSpec, source: std::io::Error) -> ManagerError {
        let err = SpawnError {
            program: spec.command.first().cloned().unwrap_or_default(),
            source,
        };
        lock(&self.state).spawn_error = Some(tether_supervisor::error_chain(&err));
        ManagerError::build(err)
    }

    /// For a process with a ServiceAccount of its own: its first home
    /// token, and the task that keeps it renewed for the cycle; the
    /// kubeconfig to give it.
    async fn home_token(
        &self,
        spec: &ExecSpec,
    ) -> Result<Option<(PathBuf, AbortOnDrop)>, ManagerError> {
        let Some(account) = &spec.service_account else {
            return Ok(None);
        };
        let token = HomeToken::start(self.dir.path(), account)
            .await
            .map_err(|err| {
                lock(&self.state).spawn_error = Some(tether_supervisor::error_chain(&err));
                ManagerError::build(err)
            })?;
        let kubeconfig = token.kubeconfig();
        let renewing = tokio::spawn(token.keep_renewed(account.clone()));
        Ok(Some((kubeconfig, AbortOnDrop(renewing))))
    }
}

/// How often a follower's applied file is read while remotes are leaving.
const ACK_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a follower has to say it let go of a remote dropped from its
/// file before it is restarted: as long as the Go package gives a
/// cluster to stop (`StopTimeout`). Another replica waits for the remote
/// meanwhile; nothing runs it twice.
const RELEASE_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a follower says what it applied (`TETHER_APPLIED_FILE`): beside
/// the launcher's socket when it has one (a volume the process may write),
/// else in tether's folder `dir`.
fn applied_file(spec: &ExecSpec, dir: &Path) -> PathBuf {
    spec.launcher
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(dir)
        .join("applied.json")
}

/// Logs a restart within the cycle, and why.
fn restarting(cycle: u64, pid: u32, why: Restart, left_out: &LeftOut, told: &Told) {
    if why == Restart::NotReleased {
        let leaving: Vec<&str> = told.leaving.names().map(String::as_str).collect();
        warn!(cycle, pid, reason = why.as_str(), leaving = %leaving.join(","), within = ?RELEASE_WITHIN, "restarting the manager process: it did not say in time that it let go of the remotes dropped from its file (TETHER_APPLIED_FILE)");
    } else {
        warn!(cycle, pid, reason = why.as_str(), left_out = %left_out.names().join(","), "restarting the manager process with its reachable remotes (it does not follow its remotes file)");
    }
}

/// A process that ended by itself: `manager_exited` for exit code 0, and
/// `manager_failed` for anything else.
fn exited(cycle: u64, pid: u32, how: ExitHow) -> Result<(), ManagerError> {
    match how {
        ExitHow::Code(0) => {
            info!(cycle, pid, "manager process exited with code 0");
            Ok(())
        }
        how => {
            warn!(cycle, pid, exit = %how, "manager process failed");
            Err(ManagerError::failed(ExitError(how)))
        }
    }
}

impl ManagerFactory for ExecManager {
    /// Every remote of the plan: a required one's loss ends the cycle, an
    /// optional one's is the manager's to take in.
    fn remotes(&self) -> UsedRemotes {
        super::used_remotes(lock(&self.shared.plan).remotes.iter())
    }

    /// A process started against a lost required remote could only wait
    /// on it, or fail its cache sync: it starts when none is lost.
    fn waits_for_lost_remotes(&self) -> bool {
        true
    }

    /// A process that follows its remotes file takes a remote added,
    /// removed or read anew from the file, a share that moved among them:
    /// a remote dropped from the file runs here until the process says it
    /// let it go (`TETHER_APPLIED_FILE`), or is restarted for not saying
    /// so, and only then may another replica take it.
    fn takes_remote_changes(&self, _cause: &Cause) -> bool {
        lock(&self.shared.spec).follows_remotes_file
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        let spec = Arc::clone(&lock(&shared.spec));
        let fail = |source| shared.spawn_failed(&spec, source);
        // Found here too (`validate` and the start check it first), so that
        // a program removed since is this cycle's build failure, named,
        // rather than the shim's exit code.
        if spec.launcher.is_none() {
            spec_program(&spec).map_err(fail)?;
        }
        let home = shared.home_token(&spec).await?;
        let running = super::Running::new(&shared.running);
        let mut plans = shared.plans.subscribe();
        let mut transitions = shared.probes.subscribe();
        let follows = spec.follows_remotes_file;
        let hold = spec.put_back_after;
        let mut left_out = LeftOut::default();
        if !follows {
            let plan = Arc::clone(&lock(&shared.plan));
            left_out.look(&plan, |name| shared.lost(name), hold);
        }
        let applied = follows.then(|| applied_file(&spec, shared.dir.path()));
        loop {
            let plan = Arc::clone(&lock(&shared.plan));
            let (listed, lost) = shared.listed(&plan, &left_out);
            let mut told = Told::new();
            let file = shared
                .tell(cycle.number(), &listed, &lost, &running, &mut told)
                .map_err(fail)?;
            let mut process = shared
                .spawn(
                    &cycle,
                    &spec,
                    &listed,
                    &file,
                    home.as_ref().map(|(k, _)| k.as_path()),
                    applied.as_deref(),
                )
                .await
                .map_err(fail)?;
            let pid = process.pid();
            drop(listed);
            drop(plan);
            let readiness = shared.follow_readiness(&spec, &cycle);
            tokio::pin!(readiness);
            let ended = loop {
                let put_back = left_out.next(hold);
                tokio::select! {
                    how = process.wait() => break Ended::Exited(how),
                    () = cycle.cancelled() => break Ended::Stopped,
                    () = &mut readiness => unreachable!("readiness is followed until the process ends"),
                    // The scopes are the supervisor's; the file says the rest.
                    Some(_) = cycle.joined() => {}
                    Ok(()) = plans.changed(), if follows => {}
                    _ = transitions.recv() => {}
                    () = tokio::time::sleep_until(put_back.unwrap_or_else(Instant::now)), if put_back.is_some() => {}
                    () = tokio::time::sleep(ACK_POLL), if !told.leaving.is_empty() => {}
                }
                if follows {
                    shared.retell(cycle.number(), pid, &mut told, &running);
                    if let Some(why) = told.released(applied.as_deref(), &running) {
                        break Ended::Restart(why);
                    }
                    continue;
                }
                let plan = Arc::clone(&lock(&shared.plan));
                if let Some(why) = left_out.look(&plan, |name| shared.lost(name), hold) {
                    break Ended::Restart(why);
                }
            };
            let how = match ended {
                Ended::Restart(_) | Ended::Stopped => {
                    cycle.set_manager_up(false);
                    let (signal, grace) = (spec.stop_signal.signal(), spec.grace_period);
                    let how = process.stop(signal, grace).await;
                    shared.record_exit(cycle.number(), how, true);
                    let Ended::Restart(why) = ended else {
                        info!(cycle = cycle.number(), pid, exit = %how, "manager process stopped");
                        return Ok(());
                    };
                    shared.restarts.with_label_values(&[why.as_str()]).inc();
                    restarting(cycle.number(), pid, why, &left_out, &told);
                    continue;
                }
                Ended::Exited(how) => {
                    let how = how.unwrap_or_else(|err| {
                        warn!(cycle = cycle.number(), pid, error = %err, "cannot tell how the manager process ended");
                        ExitHow::Code(-1)
                    });
                    process
                        .stop_leftovers(spec.stop_signal.signal(), spec.grace_period)
                        .await;
                    how
                }
            };
            cycle.set_manager_up(false);
            shared.record_exit(cycle.number(), how, false);
            return exited(cycle.number(), pid, how);
        }
    }
}
