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

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
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
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tracing::{info, warn};

use super::reaper;
use crate::config::remote::{self, ResolvedRemote};
use crate::config::{ExecSpec, Plan, ReadinessSpec, RemoteSource, StopSignal};
use crate::lock;

/// How often a stopping group is checked for members left.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long SIGKILL may take to empty a group before tether goes on.
const KILL_WAIT: Duration = Duration::from_secs(5);

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

/// The hidden first argument with which tether starts as the exec
/// manager's child: `tether __exec-child <tether's pid> -- COMMAND...`.
pub const CHILD_SHIM: &str = "__exec-child";

/// The exit code of a child shim that could not become its command, as a
/// shell's for a command it cannot run.
const CANNOT_RUN: u8 = 126;
/// As [`CANNOT_RUN`], for a command that does not exist.
const NOT_FOUND: u8 = 127;

/// What `tether __exec-child` does, given the arguments after
/// [`CHILD_SHIM`]: asks the kernel to SIGKILL this process when its parent
/// dies, checks that the parent is still the tether that started it (it may
/// have died before the request), and becomes the command. Returns only
/// the exit code when that fails.
#[must_use]
pub fn become_child(args: &[OsString]) -> u8 {
    use std::os::unix::process::CommandExt as _;

    let (Some(parent), Some(separator), Some(program)) = (args.first(), args.get(1), args.get(2))
    else {
        eprintln!("tether {CHILD_SHIM}: expected <parent pid> -- COMMAND [ARGS...]");
        return 2;
    };
    if separator != "--" {
        eprintln!("tether {CHILD_SHIM}: expected -- before the command");
        return 2;
    }
    let parent = parent.to_str().and_then(|p| p.parse::<i32>().ok());
    if rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err() {
        eprintln!("tether {CHILD_SHIM}: cannot ask to die with tether (PR_SET_PDEATHSIG)");
        return CANNOT_RUN;
    }
    // The parent died before the request took effect: nothing would kill
    // this process with it, so it must not start.
    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if ppid != parent {
        return CANNOT_RUN;
    }
    let err = std::process::Command::new(program).args(&args[3..]).exec();
    eprintln!(
        "tether: cannot start {}: {err}",
        tether_supervisor::printable(&program.to_string_lossy(), 256)
    );
    if err.kind() == std::io::ErrorKind::NotFound {
        NOT_FOUND
    } else {
        CANNOT_RUN
    }
}

/// The program `command` runs, as `execvp` would find it: a path with a
/// `/` as is (against `dir` when relative), else the first executable file
/// of that name in `path`. The error is the one a spawn would give.
fn find_program(
    program: &str,
    path: Option<&std::ffi::OsStr>,
    dir: Option<&Path>,
) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;

    let executable = |candidate: &Path| -> std::io::Result<()> {
        let meta = std::fs::metadata(candidate)?;
        if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
            Ok(())
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        }
    };
    if program.contains('/') {
        let candidate = match dir {
            Some(dir) => dir.join(program),
            None => PathBuf::from(program),
        };
        return executable(&candidate).map(|()| candidate);
    }
    let mut denied = None;
    for folder in std::env::split_paths(path.unwrap_or_default()) {
        let candidate = folder.join(program);
        match executable(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => denied = Some(err),
            Err(_) => {}
        }
    }
    Err(denied.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
}

/// The program `spec`'s command runs, found as its process will find it:
/// on the `PATH` its environment sets, else tether's.
fn spec_program(spec: &ExecSpec) -> std::io::Result<PathBuf> {
    let program = spec.command.first().map_or("", String::as_str);
    let path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    find_program(program, path.as_deref(), spec.working_dir.as_deref())
}

/// Why the exec manager's program cannot be run, fit to print.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// A path to nothing.
    #[error("{0} does not exist")]
    Missing(String),
    /// A name on no folder of `PATH`.
    #[error("{0} is not found on PATH (the exec manager's env, else tether's)")]
    NotOnPath(String),
    /// Not an executable file.
    #[error("{0} is not an executable file")]
    NotExecutable(String),
    /// Anything else a spawn would fail on.
    #[error("{program}: {source}")]
    Other {
        /// The program, escaped.
        program: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Whether `spec`'s program can be run: its path, or why not.
///
/// # Errors
///
/// [`CommandError`]: not found, or not an executable file.
pub fn find_command(spec: &ExecSpec) -> Result<PathBuf, CommandError> {
    let program = spec.command.first().map_or("", String::as_str);
    let shown = tether_supervisor::printable(program, 256).into_owned();
    spec_program(spec).map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound if program.contains('/') => CommandError::Missing(shown),
        std::io::ErrorKind::NotFound => CommandError::NotOnPath(shown),
        std::io::ErrorKind::PermissionDenied => CommandError::NotExecutable(shown),
        _ => CommandError::Other {
            program: shown,
            source: err,
        },
    })
}

/// Starts commands from one thread that lives as long as the manager: the
/// kernel sends a child's `PR_SET_PDEATHSIG` when the thread that forked it
/// ends, and a tokio worker may end before the process does.
#[derive(Debug)]
struct Spawner {
    jobs: std::sync::mpsc::Sender<SpawnJob>,
}

/// A command to start, and where the child goes, with the guard that marks
/// it as tether's own.
type SpawnJob = (
    Command,
    tokio::sync::oneshot::Sender<std::io::Result<(Child, reaper::Own)>>,
);

impl Spawner {
    fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let (jobs, queue) = std::sync::mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("tether-exec-spawn".to_owned())
            .spawn(move || {
                // The child's wait is tokio's: spawn in its context.
                let _runtime = runtime.enter();
                while let Ok((mut command, reply)) = queue.recv() {
                    let _ = reply.send(reaper::spawn_own(&mut command));
                }
            })?;
        Ok(Self { jobs })
    }

    async fn spawn(&self, command: Command) -> std::io::Result<(Child, reaper::Own)> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .send((command, reply))
            .map_err(|_| std::io::Error::other("the spawning thread ended"))?;
        answer
            .await
            .map_err(|_| std::io::Error::other("the spawning thread ended"))?
    }
}

/// The remotes a process is told of, as `TETHER_REMOTES_FILE` holds them.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RemotesFile<'a> {
    /// The cycle the process runs in.
    cycle: u64,
    /// Its remotes, in config order.
    remotes: Vec<RemoteEntry<'a>>,
}

/// One remote in `TETHER_REMOTES_FILE`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RemoteEntry<'a> {
    name: &'a str,
    required: bool,
    /// The kubeconfig that reaches it, absolute; absent for the in-cluster
    /// config or the current context (no config file).
    #[serde(skip_serializing_if = "Option::is_none")]
    kubeconfig: Option<PathBuf>,
    /// The context in it; absent for its current one.
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a str>,
}

/// Writes, into `dir`, the file that tells a process its remotes, and a
/// kubeconfig for each remote configured by direct fields (naming the CA
/// and token files by path: no secret is copied) or discovered (the
/// Secret's kubeconfig, mode 0600). The kubeconfigs of remotes no longer
/// planned are removed: a cluster dropped from the fleet leaves no
/// credentials behind. Returns the file.
fn write_remotes(dir: &Path, cycle: u64, remotes: &[ResolvedRemote]) -> std::io::Result<PathBuf> {
    let absolute = |p: &Path| std::path::absolute(p);
    let mut entries = Vec::with_capacity(remotes.len());
    let mut written = std::collections::BTreeSet::new();
    for remote in remotes {
        let (kubeconfig, context) = match &remote.source {
            RemoteSource::Kubeconfig { path, context } => {
                (Some(absolute(path)?), context.as_deref())
            }
            RemoteSource::Direct {
                server,
                ca_file,
                token_file,
                insecure_skip_tls_verify,
            } => {
                let ca = ca_file.as_deref().map(absolute).transpose()?;
                let token = token_file.as_deref().map(absolute).transpose()?;
                let kubeconfig = remote::direct_kubeconfig(
                    &remote.name,
                    &tether_probes::client::without_userinfo(
                        &server.parse().map_err(std::io::Error::other)?,
                    )
                    .to_string(),
                    ca.as_deref(),
                    token.as_deref(),
                    *insecure_skip_tls_verify,
                );
                let path = dir.join(format!("{}.kubeconfig", remote.name));
                // JSON is YAML: client-go reads it as a kubeconfig.
                replace_file(&path, &serde_json::to_vec_pretty(&kubeconfig)?)?;
                written.insert(path.clone());
                (Some(path), None)
            }
            RemoteSource::Inferred => (None, None),
            RemoteSource::Secret(secret) => {
                // The process gets the discovered cluster as a kubeconfig
                // file of its own, readable by tether's user alone, in
                // tether's private folder.
                let path = dir.join(format!("{}.kubeconfig", remote.name));
                replace_private_file(&path, &serde_json::to_vec_pretty(&secret.kubeconfig)?)?;
                written.insert(path.clone());
                (Some(path), None)
            }
        };
        entries.push(RemoteEntry {
            name: &remote.name,
            required: remote.required,
            kubeconfig,
            context,
        });
    }
    let file = dir.join("remotes.json");
    let body = serde_json::to_vec_pretty(&RemotesFile {
        cycle,
        remotes: entries,
    })?;
    replace_file(&file, &body)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "kubeconfig") && !written.contains(&path) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(file)
}

/// The most `TETHER_REMOTES` may hold: 32 KiB, about 600 names of 50
/// characters. Linux refuses to start a process with one environment
/// string over 128 KiB (`E2BIG`), and about 2,600 such names pass that;
/// past this bound the variable is left out, and the process reads the set
/// from `TETHER_REMOTES_FILE`, which carries it whole however large.
const MAX_REMOTES_VARIABLE: usize = 32 * 1024;

/// `TETHER_REMOTES`: the remotes' names, in plan order, comma-separated;
/// or, past [`MAX_REMOTES_VARIABLE`], its size.
fn remotes_variable(remotes: &[ResolvedRemote]) -> Result<String, usize> {
    let size = remotes
        .iter()
        .map(|r| r.name.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if size > MAX_REMOTES_VARIABLE {
        return Err(size);
    }
    let names: Vec<&str> = remotes.iter().map(|r| r.name.as_str()).collect();
    Ok(names.join(","))
}

/// Writes `body` to `path` whole: into a file beside it, then renamed over.
fn replace_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let next = path.with_extension("next");
    std::fs::write(&next, body)?;
    std::fs::rename(&next, path)
}

/// As [`replace_file`], the file readable and writable by its owner alone
/// from the start: it holds credentials.
fn replace_private_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let next = path.with_extension("next");
    let _ = std::fs::remove_file(&next);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&next)?
        .write_all(body)?;
    std::fs::rename(&next, path)
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

/// What every exec manager's private folder under `TMPDIR` is named from.
const FOLDER_PREFIX: &str = "tether-exec-";

/// The file in a private folder that its tether holds a lock on (`flock`)
/// for as long as it runs: the kernel lets the lock go when the process
/// ends, however it ends, so a folder whose lock can be taken was left by
/// a run that is over.
const FOLDER_LOCK: &str = ".lock";

/// The exec manager's private folder: its remotes file and the discovered
/// clusters' kubeconfigs, held locked while this process runs, and removed
/// with it on a clean stop.
#[derive(Debug)]
pub struct Folder {
    dir: tempfile::TempDir,
    /// Held for the folder's life: the sign, to a later run, that it is
    /// in use. Opened close-on-exec, so no child holds it.
    _lock: std::fs::File,
}

impl Folder {
    /// Where it is.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Takes the lock of the file at `path`, without waiting; whether it was
/// taken. A symlink is never followed.
fn try_lock(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt as _;

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed())
        .open(path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Removes, from `tmp`, the private folders of exec managers whose run is
/// over: after a SIGKILL, an OOM kill or a second SIGTERM, a folder and
/// the credentials in it stay, and in the chart `TMPDIR` is an emptyDir
/// that outlives the container. A folder whose lock is held belongs to a
/// tether that runs (a second one in the same pod) and is left alone; one
/// with no lock file holds nothing, since a folder is locked before
/// anything is written to it.
fn remove_leftovers(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(FOLDER_PREFIX));
        // `file_type` does not follow a symlink: a link is never a folder
        // of ours.
        if !ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match try_lock(&path.join(FOLDER_LOCK)) {
            Ok(Some(_over)) => match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    info!(folder = %path.display(), "removed the exec manager's folder that an earlier run left, with the credentials in it");
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    warn!(folder = %path.display(), error = %err, "cannot remove the exec manager's folder that an earlier run left");
                }
            },
            Ok(None) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                warn!(folder = %path.display(), error = %err, "cannot tell whether an exec manager's folder is in use");
            }
        }
    }
}

/// Makes the folder for the exec manager's remotes file, under `TMPDIR`,
/// after removing those of earlier runs that are over.
///
/// # Errors
///
/// As [`SetupError::Folder`].
pub fn remotes_folder() -> Result<Folder, SetupError> {
    remotes_folder_in(&std::env::temp_dir())
}

/// As [`remotes_folder`], under `tmp`.
fn remotes_folder_in(tmp: &Path) -> Result<Folder, SetupError> {
    remove_leftovers(tmp);
    let dir = tempfile::Builder::new()
        .prefix(FOLDER_PREFIX)
        .tempdir_in(tmp)
        .map_err(SetupError::Folder)?;
    // Locked under another name, then renamed: whenever the lock file is
    // there, it is locked, and a sweep by another tether never takes it in
    // the moment between its creation and its lock.
    let locking = dir.path().join(".lock.new");
    let lock = std::fs::File::create(&locking)
        .and_then(|file| {
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
            std::fs::rename(&locking, dir.path().join(FOLDER_LOCK))?;
            Ok(file)
        })
        .map_err(SetupError::Folder)?;
    Ok(Folder { dir, _lock: lock })
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
    pub fn update(&self, plan: Plan) {
        if let Some(spec) = &plan.exec {
            *lock(&self.shared.spec) = Arc::new(spec.clone());
        }
        *lock(&self.shared.plan) = Arc::new(plan);
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
        let mut ready = spec.readiness.is_none();
        let mut failures = 0;
        let mut up = false;
        let mut next_check = Instant::now();
        let mut probes_gone = false;
        loop {
            if let Some(readiness) = &spec.readiness
                && Instant::now() >= next_check
            {
                if check(readiness).await {
                    failures = 0;
                    ready = true;
                } else {
                    failures += 1;
                    if ready && failures >= readiness.failure_threshold {
                        ready = false;
                    }
                }
                next_check = Instant::now() + readiness.period;
            }
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
            let checked = async {
                match spec.readiness {
                    Some(_) => sleep_until(next_check).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = checked => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretSource;

    fn discovered(name: &str) -> ResolvedRemote {
        ResolvedRemote {
            name: name.to_owned(),
            required: true,
            source: RemoteSource::Secret(Arc::new(SecretSource {
                namespace: "fleet".to_owned(),
                name: name.to_owned(),
                digest: Vec::new(),
                kubeconfig: kube::config::Kubeconfig::default(),
            })),
            config: Arc::new(kube::Config::new("https://h:6443".parse().expect("a URL"))),
            files: Vec::new(),
        }
    }

    #[test]
    fn a_discovered_clusters_kubeconfig_is_private_and_goes_with_it() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().expect("temp dir");
        write_remotes(dir.path(), 1, &[discovered("a"), discovered("b")]).expect("written");
        let a = dir.path().join("a.kubeconfig");
        let mode = std::fs::metadata(&a)
            .expect("a's file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        write_remotes(dir.path(), 2, &[discovered("b")]).expect("written");
        assert!(!a.exists(), "a's credentials outlived it");
        assert!(dir.path().join("b.kubeconfig").exists());
    }

    #[test]
    fn the_remotes_variable_stays_within_what_linux_passes_and_the_file_carries_the_rest() {
        // 2,600 names of 50 characters: 130 KiB joined, past Linux's 128
        // KiB for one environment string (E2BIG).
        let name = |i: usize| format!("{:0>50}", format!("cluster-{i}"));
        let fleet: Vec<ResolvedRemote> = (0..2_600).map(|i| discovered(&name(i))).collect();
        assert_eq!(remotes_variable(&fleet), Err(2_600 * 51 - 1));
        // What Linux says to such a variable, as it said to a controller
        // told of the whole fleet in it.
        let joined: Vec<&str> = fleet.iter().map(|r| r.name.as_str()).collect();
        let refused = std::process::Command::new("true")
            .env("TETHER_REMOTES", joined.join(","))
            .status()
            .expect_err("Linux refuses one environment string over 128 KiB");
        assert_eq!(
            refused.raw_os_error(),
            Some(rustix::io::Errno::TOOBIG.raw_os_error())
        );
        let few: Vec<ResolvedRemote> = (0..3).map(|i| discovered(&name(i))).collect();
        assert_eq!(remotes_variable(&few).expect("fits").split(',').count(), 3);
        let dir = tempfile::tempdir().expect("temp dir");
        let file = write_remotes(dir.path(), 1, &fleet).expect("written");
        let told: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file).expect("read")).expect("JSON");
        assert_eq!(told["remotes"].as_array().map(Vec::len), Some(2_600));
    }

    #[test]
    fn a_folder_an_earlier_run_left_is_removed_at_start_and_one_in_use_is_not() {
        let tmp = tempfile::tempdir().expect("temp dir");
        // A run killed with SIGKILL: its folder, a kubeconfig and its lock
        // file, which nobody holds any more.
        let killed = tmp.path().join(format!("{FOLDER_PREFIX}killed"));
        std::fs::create_dir(&killed).expect("folder");
        std::fs::write(killed.join(FOLDER_LOCK), b"").expect("lock file");
        std::fs::write(killed.join("a.kubeconfig"), b"token: t").expect("kubeconfig");
        // A second tether of the same pod, running.
        let running = remotes_folder_in(tmp.path()).expect("a folder");
        std::fs::write(running.path().join("b.kubeconfig"), b"token: t").expect("kubeconfig");
        assert!(!killed.exists(), "the killed run's credentials stayed");
        // A link is never followed, nor taken for a folder of ours.
        let elsewhere = tempfile::tempdir().expect("temp dir");
        std::fs::write(elsewhere.path().join(FOLDER_LOCK), b"").expect("lock file");
        std::os::unix::fs::symlink(
            elsewhere.path(),
            tmp.path().join(format!("{FOLDER_PREFIX}link")),
        )
        .expect("link");
        let next = remotes_folder_in(tmp.path()).expect("a folder");
        assert!(
            running.path().join("b.kubeconfig").exists(),
            "a running tether's folder was removed"
        );
        assert!(elsewhere.path().join(FOLDER_LOCK).exists());
        let path = running.path().to_owned();
        drop(running);
        assert!(!path.exists(), "a clean stop removes its folder");
        drop(next);
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("read")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from(format!("{FOLDER_PREFIX}link"))]
        );
    }
}
