//! What the admin server is told of the process: the daemon holds the
//! handles of the supervisor, the Leases and discovery, and for each
//! request assembles one [`Snapshot`] of them, readiness included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tether_supervisor::SupervisorHandle;

use std::collections::{BTreeMap, BTreeSet};

use crate::admin::{
    CacheView, DiscoveryView, ElectionView, ManagerStatus, ProcessView, Role, ShardView,
    SkippedView, Snapshot, Snapshots, SourceView, ago,
};
use crate::discovery::Discovery;
use crate::lease::election::ElectionHandle;
use crate::lease::shard::ShardHandle;
use crate::managers::Handle;
use crate::managers::exec::ProcessHandle;
use crate::managers::watch::ManagerHandle;

/// The parts of a running tether the admin server shows.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The supervisor.
    pub supervisor: SupervisorHandle,
    /// Set once at shutdown; never cleared.
    pub draining: Arc<AtomicBool>,
    /// The leader election, when on.
    pub election: Option<ElectionHandle>,
    /// The sharding of remotes among replicas, when on.
    pub shard: Option<ShardHandle>,
    /// Discovery from the home cluster's Secrets, when on.
    pub discovery: Option<Arc<Discovery>>,
}

impl Snapshots for Parts {
    fn snapshot(&self) -> Snapshot {
        Snapshot::new(
            self.supervisor.status(),
            self.draining.load(Ordering::SeqCst),
            self.election.as_ref().map(election_view),
            self.shard.as_ref().map(shard_view),
            self.discovery.as_deref().map(discovery_view),
        )
    }

    fn supervisor_heartbeat(&self) -> tokio::time::Instant {
        self.supervisor.status().heartbeat
    }
}

/// The election as the view shows it.
fn election_view(election: &ElectionHandle) -> ElectionView {
    let state = election.state();
    ElectionView {
        role: if state.leading {
            Role::Leader
        } else {
            Role::Standby
        },
        identity: state.identity,
        holder: state.holder,
        lease: state.lease,
        twin: state.twin,
        leads_in_seconds: state.leads_in.map(|d| d.as_secs_f64()),
        last_error: state.last_error,
    }
}

/// Discovery as the view shows it.
fn discovery_view(discovery: &Discovery) -> DiscoveryView {
    DiscoveryView {
        home: crate::config::discovery::HOME,
        sources: discovery
            .status()
            .into_iter()
            .map(|s| SourceView {
                source: s.source,
                selector: s.selector,
                required: s.required,
                listed: s.listed,
                listed_seconds_ago: ago(s.listed_at),
                remotes: s.remotes,
                skipped: s
                    .skipped
                    .into_iter()
                    .map(|k| SkippedView {
                        secret: k.secret,
                        field: k.skipped.field,
                        message: k.skipped.message,
                    })
                    .collect(),
                failing_seconds: ago(s.failing.as_ref().map(|(_, since)| *since)),
                failing: s.failing.map(|(error, _)| error),
            })
            .collect(),
    }
}

/// This replica's share as the view shows it.
fn shard_view(shard: &ShardHandle) -> ShardView {
    let state = shard.state();
    ShardView {
        identity: state.identity,
        group: state.group,
        members: state.members,
        owned: state.owned.into_iter().collect(),
        waiting: state.waiting.into_iter().collect(),
        configured: shard.configured(),
        joining_seconds: state.joining.map(|d| d.as_secs_f64()),
        twin: state.twin,
        last_error: state.last_error,
    }
}

// The manager as the admin server reads it: the managers know nothing of
// the admin server.
impl ManagerStatus for Handle {
    fn required(&self) -> BTreeSet<String> {
        self.plan().required()
    }

    fn caches(&self) -> BTreeMap<(String, String), CacheView> {
        self.watch()
            .map_or_else(BTreeMap::new, ManagerStatus::caches)
    }

    fn process(&self) -> Option<ProcessView> {
        self.exec().map(process_view)
    }
}

/// The watch manager alone, as the admin server shows it: what its plan
/// requires, and its caches.
impl ManagerStatus for ManagerHandle {
    fn required(&self) -> BTreeSet<String> {
        self.plan().required()
    }

    fn caches(&self) -> BTreeMap<(String, String), CacheView> {
        ManagerHandle::caches(self)
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
        None
    }
}

/// The exec manager's process as the admin server shows it.
fn process_view(process: &ProcessHandle) -> ProcessView {
    let state = process.state();
    let spec = process.spec();
    let last = state.last_exit.as_ref();
    ProcessView {
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
    }
}
