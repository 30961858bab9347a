//! What the admin server is told of the process: the daemon holds the
//! handles of the supervisor, the Leases and discovery, and for each
//! request assembles one [`Snapshot`] of them, readiness included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tether_supervisor::SupervisorHandle;

use crate::admin::{
    DiscoveryView, ElectionView, Role, ShardView, SkippedView, Snapshot, Snapshots, SourceView, ago,
};
use crate::discovery::Discovery;
use crate::lease::election::ElectionHandle;
use crate::lease::shard::ShardHandle;

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
