//! The managers the supervisor can drive, behind one seam.
//!
//! - `watch.rs`: the built-in watch manager, a reflector per remote and per
//!   watched resource type;
//! - `exec.rs`: any controller process, run as each cycle's manager;
//! - `reaper.rs`: the zombie reaper tether runs as PID 1, for the exec
//!   manager's strays.
//!
//! Each consumes the [`Plan`] and knows nothing of the other. The daemon
//! builds one with [`build`] on the published [`Desired`] value, hands it
//! to the supervisor, and keeps its [`Handle`]: to show it on the admin
//! server, to know what the running cycle runs, and to kill its process at
//! a second signal. Each cycle runs the plan published when it starts.
//! Adding a manager touches only this file and its own.

pub mod exec;
pub(crate) mod reaper;
pub mod watch;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tether_probes::ProbeSetHandle;
use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, UsedRemote, UsedRemotes};
use tokio::sync::watch as channel;

use self::exec::{ExecManager, ProcessHandle};
use self::watch::{ManagerHandle, WatchManager};
use crate::config::Plan;
use crate::desired::Desired;

/// The manager the supervisor drives: the plan's process, or else the
/// built-in watch manager; each cycle on the plan published when it starts.
#[derive(Debug)]
pub struct Manager {
    kind: Kind,
    desired: channel::Receiver<Arc<Desired>>,
}

/// Which manager it is.
#[derive(Debug)]
enum Kind {
    /// The built-in watch manager.
    Watch(WatchManager),
    /// A process.
    Exec(ExecManager),
}

impl ManagerFactory for Manager {
    /// Asked as a cycle starts: the manager takes the plan published now,
    /// which the cycle then runs.
    fn remotes(&self) -> UsedRemotes {
        let (revision, plan) = {
            let desired = self.desired.borrow();
            (desired.revision, Arc::clone(&desired.plan))
        };
        match &self.kind {
            Kind::Watch(manager) => {
                manager.handle().update(revision, plan);
                manager.remotes()
            }
            Kind::Exec(manager) => {
                manager.handle().update(plan);
                manager.remotes()
            }
        }
    }

    fn waits_for_lost_remotes(&self) -> bool {
        match &self.kind {
            Kind::Watch(manager) => manager.waits_for_lost_remotes(),
            Kind::Exec(manager) => manager.waits_for_lost_remotes(),
        }
    }

    fn takes_remote_changes(&self, cause: &tether_supervisor::Cause) -> bool {
        match &self.kind {
            Kind::Watch(manager) => manager.takes_remote_changes(cause),
            Kind::Exec(manager) => manager.takes_remote_changes(cause),
        }
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        match &self.kind {
            Kind::Watch(manager) => manager.run(cycle).await,
            Kind::Exec(manager) => manager.run(cycle).await,
        }
    }
}

/// `remotes` as a cycle uses them: a required one's loss ends the cycle,
/// an optional one's stops its own part; each at its generation, so that
/// one read anew is rebuilt.
pub(crate) fn used_remotes<'a>(
    remotes: impl IntoIterator<Item = &'a crate::config::remote::ResolvedRemote>,
) -> UsedRemotes {
    UsedRemotes::Only(
        remotes
            .into_iter()
            .map(|remote| {
                let used = if remote.required {
                    UsedRemote::ends_cycle(&remote.name)
                } else {
                    UsedRemote::restarts_alone(&remote.name)
                };
                used.at_version(remote.generation)
            })
            .collect(),
    )
}

/// What a manager's running cycle runs, by remote, as the manager says it
/// changes: the sharding lets a remote go to another replica only once it
/// has left this. Cleared when the cycle's run ends, however it ends, a
/// panic included.
pub(crate) struct Running<'a>(&'a channel::Sender<BTreeSet<String>>);

impl<'a> Running<'a> {
    /// Follows `running` for one run; none runs yet.
    pub(crate) fn new(running: &'a channel::Sender<BTreeSet<String>>) -> Self {
        running.send_replace(BTreeSet::new());
        Self(running)
    }

    /// `names` run now.
    pub(crate) fn set(&self, names: BTreeSet<String>) {
        self.0.send_replace(names);
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.send_replace(BTreeSet::new());
    }
}

/// A view of the manager, whichever it is, for the daemon and the admin
/// server.
#[derive(Debug, Clone)]
pub struct Handle {
    kind: HandleKind,
    desired: channel::Receiver<Arc<Desired>>,
}

#[derive(Debug, Clone)]
enum HandleKind {
    /// The built-in watch manager's.
    Watch(ManagerHandle),
    /// The exec manager's.
    Exec(ProcessHandle),
}

/// Why a manager could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The watch manager's metric names are taken.
    #[error("registering the watch manager's metrics failed")]
    Watch(#[from] prometheus::Error),
    /// The exec manager could not be set up.
    #[error(transparent)]
    Exec(#[from] exec::SetupError),
}

/// The manager the plan `desired` holds asks for: its process, if it has
/// one, else the built-in watch manager. Metrics go in `registry`;
/// `probes` says which remotes are reachable, and a watch whose cache has
/// failed for longer than `stale_after` counts as stale.
///
/// # Errors
///
/// [`BuildError`]: its metrics are taken, or the exec manager's folder or
/// thread cannot be made.
pub fn build(
    desired: channel::Receiver<Arc<Desired>>,
    registry: &Registry,
    probes: &ProbeSetHandle,
    stale_after: Duration,
) -> Result<(Manager, Handle), BuildError> {
    let plan = Plan::clone(&desired.borrow().plan);
    let (kind, handle) = match plan.exec.clone() {
        None => {
            let watch = WatchManager::new(registry, probes.clone(), plan, stale_after)?;
            let handle = HandleKind::Watch(watch.handle());
            (Kind::Watch(watch), handle)
        }
        Some(spec) => {
            // Each child starts as this very binary, which becomes the
            // command once it has asked to die with tether.
            let exec = ExecManager::new(
                registry,
                spec,
                plan,
                probes.clone(),
                PathBuf::from("/proc/self/exe"),
            )?;
            let handle = HandleKind::Exec(exec.handle());
            (Kind::Exec(exec), handle)
        }
    };
    let handle = Handle {
        kind: handle,
        desired: desired.clone(),
    };
    Ok((Manager { kind, desired }, handle))
}

impl Handle {
    /// Takes in a published plan: the watch manager forgets at once the
    /// caches and series of what it no longer has. Its running cycle takes
    /// the remotes in as the supervisor says; the next cycle runs the plan
    /// either way.
    pub fn follow(&self, desired: &Desired) {
        if let HandleKind::Watch(handle) = &self.kind {
            handle.update(desired.revision, Arc::clone(&desired.plan));
        }
    }

    /// The plan the next cycle runs: the one published now.
    #[must_use]
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&self.desired.borrow().plan)
    }

    /// The remotes the running cycle runs, as it changes; none between
    /// cycles. A remote leaves it once its part has stopped: its watches,
    /// or the process told it is gone.
    #[must_use]
    pub fn running(&self) -> channel::Receiver<BTreeSet<String>> {
        match &self.kind {
            HandleKind::Watch(handle) => handle.running(),
            HandleKind::Exec(handle) => handle.running(),
        }
    }

    /// The watch manager's view, if it is the manager.
    #[must_use]
    pub fn watch(&self) -> Option<&ManagerHandle> {
        match &self.kind {
            HandleKind::Watch(handle) => Some(handle),
            HandleKind::Exec(_) => None,
        }
    }

    /// The exec manager's view, if it is the manager.
    #[must_use]
    pub fn exec(&self) -> Option<&ProcessHandle> {
        match &self.kind {
            HandleKind::Exec(handle) => Some(handle),
            HandleKind::Watch(_) => None,
        }
    }

    /// At a second signal: SIGKILL to the manager's process, if it runs
    /// one. Whether it does.
    #[must_use]
    pub fn kill_now(&self) -> bool {
        match &self.kind {
            HandleKind::Watch(_) => false,
            HandleKind::Exec(handle) => {
                handle.kill_now();
                true
            }
        }
    }
}
