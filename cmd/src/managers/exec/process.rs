//! A run of the process, started by tether itself or by a launcher in
//! another container: the same waits and stops either way.

use std::path::Path;
use std::time::Duration;

use rustix::process::Signal;
use tokio::process::Child;

use super::ExitHow;
use super::group::{Group, pid_of, stop};
use super::launcher::Remote;
use super::program::{Spawner, Start, command};
use crate::managers::reaper;

/// Kills a run's group at once, from anywhere: the second SIGTERM.
pub(super) struct Killer(Box<dyn Fn() + Send + Sync>);

impl Killer {
    pub(super) fn kill(&self) {
        (self.0)();
    }
}

impl std::fmt::Debug for Killer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Killer")
    }
}

/// A running process.
pub(super) enum Process {
    /// Started by tether, in its own container.
    Here {
        child: Child,
        group: Group,
        /// tether waits for it itself: the PID 1 reaper leaves it.
        _own: reaper::Own,
    },
    /// Started by the launcher in another container.
    There(Remote),
}

impl Process {
    /// Starts `start`: through the launcher on `launcher`, or here with
    /// `spawner` as `binary` (the tether binary), in its child shim role.
    pub(super) async fn start(
        spawner: &Spawner,
        binary: &Path,
        launcher: Option<&Path>,
        start: &Start,
    ) -> std::io::Result<Self> {
        if let Some(socket) = launcher {
            return Remote::start(socket, start).await.map(Self::There);
        }
        let tether = rustix::process::getpid().as_raw_nonzero().get();
        let (child, own) = spawner.spawn(command(binary, tether, start)).await?;
        let pid = child
            .id()
            .expect("a child that was not waited for has its id");
        let group = Group(pid_of(pid).expect("a child's pid is positive"));
        Ok(Self::Here {
            child,
            group,
            _own: own,
        })
    }

    /// Its pid, in the container it runs in.
    pub(super) fn pid(&self) -> u32 {
        match self {
            Self::Here { group, .. } => group.0.as_raw_nonzero().get().unsigned_abs(),
            Self::There(remote) => remote.pid(),
        }
    }

    /// What kills its group at once.
    pub(super) fn killer(&self) -> Killer {
        match self {
            Self::Here { group, .. } => {
                let group = group.0;
                Killer(Box::new(move || {
                    let _ = rustix::process::kill_process_group(group, Signal::KILL);
                }))
            }
            Self::There(remote) => Killer(Box::new(remote.killer())),
        }
    }

    /// Waits for it to end by itself. Safe to cancel.
    pub(super) async fn wait(&mut self) -> std::io::Result<ExitHow> {
        match self {
            Self::Here { child, .. } => child.wait().await.map(ExitHow::of),
            Self::There(remote) => remote.wait().await,
        }
    }

    /// After it ended by itself: stops what it left in its group (the
    /// launcher does that on its side).
    pub(super) async fn stop_leftovers(&self, signal: Signal, grace: Duration) {
        if let Self::Here { group, .. } = self {
            group.stop_leftovers(signal, grace).await;
        }
    }

    /// Stops it and its group: `signal`, then SIGKILL after `grace`.
    pub(super) async fn stop(&mut self, signal: Signal, grace: Duration) -> ExitHow {
        match self {
            Self::Here { child, group, .. } => stop(child, group, signal, grace).await,
            Self::There(remote) => remote.stop(grace).await,
        }
    }
}
