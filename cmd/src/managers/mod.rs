//! The managers the supervisor can drive, behind one seam.
//!
//! - `watch.rs`: the built-in watch manager, a reflector per remote and per
//!   watched resource type;
//! - `exec.rs`: any controller process, run as each cycle's manager;
//! - `reaper.rs`: the zombie reaper tether runs as PID 1, for the exec
//!   manager's strays.
//!
//! Each consumes the [`Plan`] and knows nothing of the other. The daemon
//! builds one with [`build`], hands it to the supervisor, and keeps its
//! [`Handle`]: to give it a new plan, to show it on the admin server, and to
//! kill its process at a second signal. Adding a manager touches only this
//! file and its own.

pub mod exec;
pub mod reaper;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use prometheus::Registry;
use tether_probes::ProbeSetHandle;
use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, UsedRemotes};

use self::exec::{ExecManager, ProcessHandle};
use self::watch::{ManagerHandle, WatchManager};
use crate::admin::{CacheView, ManagerStatus, ProcessView, ago};
use crate::config::Plan;

/// The manager the supervisor drives: the plan's process, or else the
/// built-in watch manager.
#[derive(Debug)]
pub enum Manager {
    /// The built-in watch manager.
    Watch(WatchManager),
    /// A process.
    Exec(ExecManager),
}

impl ManagerFactory for Manager {
    fn remotes(&self) -> UsedRemotes {
        match self {
            Self::Watch(manager) => manager.remotes(),
            Self::Exec(manager) => manager.remotes(),
        }
    }

    fn waits_for_lost_remotes(&self) -> bool {
        match self {
            Self::Watch(manager) => manager.waits_for_lost_remotes(),
            Self::Exec(manager) => manager.waits_for_lost_remotes(),
        }
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        match self {
            Self::Watch(manager) => manager.run(cycle).await,
            Self::Exec(manager) => manager.run(cycle).await,
        }
    }
}

/// A view of the manager, whichever it is, for the daemon and the admin
/// server.
#[derive(Debug, Clone)]
pub enum Handle {
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

/// The manager `plan` asks for: its process, if it has one, else the
/// built-in watch manager. Metrics go in `registry`; `probes` says which
/// remotes are reachable, and a watch whose cache has failed for longer
/// than `stale_after` counts as stale.
///
/// # Errors
///
/// [`BuildError`]: its metrics are taken, or the exec manager's folder or
/// thread cannot be made.
pub fn build(
    plan: Plan,
    registry: &Registry,
    probes: &ProbeSetHandle,
    stale_after: Duration,
) -> Result<(Manager, Handle), BuildError> {
    Ok(match plan.exec.clone() {
        None => {
            let watch = WatchManager::new(registry, probes.clone(), plan, stale_after)?;
            let handle = Handle::Watch(watch.handle());
            (Manager::Watch(watch), handle)
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
            let handle = Handle::Exec(exec.handle());
            (Manager::Exec(exec), handle)
        }
    })
}

impl Handle {
    /// Replaces the plan; the next cycle runs it.
    pub fn update(&self, plan: Plan) {
        match self {
            Self::Watch(handle) => handle.update(plan),
            Self::Exec(handle) => handle.update(plan),
        }
    }

    /// The plan the next cycle runs.
    #[must_use]
    pub fn plan(&self) -> std::sync::Arc<Plan> {
        match self {
            Self::Watch(handle) => handle.plan(),
            Self::Exec(handle) => handle.plan(),
        }
    }

    /// At a second signal: SIGKILL to the manager's process, if it runs
    /// one. Whether it does.
    #[must_use]
    pub fn kill_now(&self) -> bool {
        match self {
            Self::Watch(_) => false,
            Self::Exec(handle) => {
                handle.kill_now();
                true
            }
        }
    }
}

impl ManagerStatus for Handle {
    fn required(&self) -> BTreeSet<String> {
        match self {
            Self::Watch(handle) => handle.plan().required(),
            Self::Exec(handle) => handle.plan().required(),
        }
    }

    fn caches(&self) -> BTreeMap<(String, String), CacheView> {
        let Self::Watch(handle) = self else {
            return BTreeMap::new();
        };
        handle
            .caches()
            .into_iter()
            .map(|(key, cache)| {
                let view = CacheView {
                    resource: key.1.clone(),
                    synced: cache.synced,
                    stale: cache.stale,
                    failing_seconds_ago: ago(cache.failing_since),
                    objects: cache.objects,
                };
                (key, view)
            })
            .collect()
    }

    fn process(&self) -> Option<ProcessView> {
        let Self::Exec(process) = self else {
            return None;
        };
        let state = process.state();
        let spec = process.spec();
        let last = state.last_exit.as_ref();
        Some(ProcessView {
            command: spec.command.clone(),
            pid: state.pid,
            cycle: state.cycle,
            running_seconds: ago(state.started),
            readiness_check: spec
                .readiness
                .as_ref()
                .map(|r| format!("GET http://127.0.0.1:{}{}", r.port, r.path)),
            last_exit: last.map(|e| e.how.to_string()),
            last_exit_stopped: last.map(|e| e.stopped),
            last_exit_cycle: last.map(|e| e.cycle),
            last_exit_seconds_ago: ago(last.map(|e| e.at)),
            spawn_error: state.spawn_error,
        })
    }
}
