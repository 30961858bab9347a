//! The exec manager's command: found on `PATH` or by path, and started
//! from one long-lived thread as `tether __exec-child`, which asks to die
//! with tether and becomes the command.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::config::ExecSpec;
use crate::managers::reaper;

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

/// One start of the process: what tether starts itself, and what it asks
/// a launcher in another container to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Start {
    /// The launcher protocol's version.
    pub(super) version: u32,
    /// The cycle it belongs to, for the logs.
    pub(super) cycle: u64,
    /// The argv.
    pub(super) command: Vec<String>,
    /// Set in its environment, over what it inherits.
    pub(super) env: Vec<(String, String)>,
    /// Removed from its environment.
    pub(super) unset: Vec<String>,
    /// Where it starts; `None`: where its starter runs.
    pub(super) working_dir: Option<PathBuf>,
    /// The signal a stop sends first.
    pub(super) stop_signal: i32,
    /// How long after it SIGKILL follows, in milliseconds.
    pub(super) grace_ms: u64,
}

impl Start {
    /// The signal a stop sends first: SIGTERM if it is not one.
    pub(super) fn stop_signal(&self) -> Signal {
        crate::config::StopSignal::ALL
            .iter()
            .map(|s| s.signal())
            .find(|s| s.as_raw() == self.stop_signal)
            .unwrap_or(Signal::TERM)
    }

    /// How long after the stop signal SIGKILL follows.
    pub(super) fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms)
    }
}

/// The command that starts `start` as `binary` (the tether binary) in its
/// [`CHILD_SHIM`] role, asking to die with `parent` (the starter's pid): in
/// a process group of its own, stdin from `/dev/null`, stdout and stderr
/// its starter's.
pub(super) fn command(binary: &Path, parent: i32, start: &Start) -> Command {
    let (program, args) = start
        .command
        .split_first()
        .expect("validation requires a command");
    let mut command = Command::new(binary);
    command
        .arg(CHILD_SHIM)
        .arg(parent.to_string())
        .arg("--")
        .arg(program)
        .args(args)
        .envs(start.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0);
    for name in &start.unset {
        command.env_remove(name);
    }
    if let Some(dir) = &start.working_dir {
        command.current_dir(dir);
    }
    command
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
pub(super) fn spec_program(spec: &ExecSpec) -> std::io::Result<PathBuf> {
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
    #[error("{program} cannot be run")]
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
pub(super) struct Spawner {
    jobs: std::sync::mpsc::Sender<SpawnJob>,
}

/// A command to start, and where the child goes, with the guard that marks
/// it as tether's own.
type SpawnJob = (
    Command,
    tokio::sync::oneshot::Sender<std::io::Result<(Child, reaper::Own)>>,
);

impl Spawner {
    pub(super) fn start() -> std::io::Result<Self> {
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

    pub(super) async fn spawn(&self, command: Command) -> std::io::Result<(Child, reaper::Own)> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs
            .send((command, reply))
            .map_err(|_| std::io::Error::other("the spawning thread ended"))?;
        answer
            .await
            .map_err(|_| std::io::Error::other("the spawning thread ended"))?
    }
}
