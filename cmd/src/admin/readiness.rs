//! Readiness, decided once: `/readyz` answers it, `tether_ready` exports it,
//! and the status page's verdict says it in words.

use super::view::{ElectionView, Role, ShardView};

/// Whether this replica is ready, and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Shutting down: not ready, for good.
    Draining {
        /// Whether the manager was still up when the drain began.
        manager_up: bool,
    },
    /// Another replica leads: ready to take over.
    Follower,
    /// A shard member that holds no remote runs no manager: ready to take
    /// a share.
    Unassigned,
    /// The manager is up.
    Up,
    /// The manager is not up.
    Down,
}

impl Readiness {
    /// Readiness from the drain latch, the election and the sharding as the
    /// view shows them, and whether the manager is up.
    #[must_use]
    pub fn of(
        draining: bool,
        election: Option<&ElectionView>,
        shard: Option<&ShardView>,
        manager_up: bool,
    ) -> Self {
        if draining {
            Self::Draining { manager_up }
        } else if election.is_some_and(|e| e.role == Role::Standby) {
            Self::Follower
        } else if shard.is_some_and(|s| s.owned.is_empty()) {
            Self::Unassigned
        } else if manager_up {
            Self::Up
        } else {
            Self::Down
        }
    }

    /// Whether `/readyz` answers 200.
    #[must_use]
    pub const fn is_ready(self) -> bool {
        matches!(self, Self::Follower | Self::Unassigned | Self::Up)
    }

    /// `/readyz`'s status and body, in the apiserver's `[+]check` form.
    #[must_use]
    pub fn readyz(
        self,
        election: Option<&ElectionView>,
        shard: Option<&ShardView>,
        cycle: u64,
    ) -> (u16, String) {
        let mark = |ok: bool| if ok { '+' } else { '-' };
        let manager = |not_draining: bool, up: bool| {
            format!(
                "[{}]not draining\n[{}]manager up (cycle {cycle}, every required cache synced and current)\n",
                mark(not_draining),
                mark(up),
            )
        };
        let checks = match self {
            Self::Follower => {
                let holder = election
                    .map(|e| e.holder.as_str())
                    .filter(|h| !h.is_empty())
                    .unwrap_or("none yet");
                format!("[+]not draining\n[+]standby (leader: {holder})\n")
            }
            Self::Unassigned => {
                let configured = shard.map_or(0, |s| s.configured);
                format!("[+]not draining\n[+]standby (holds none of the {configured} remotes)\n")
            }
            Self::Draining { manager_up } => manager(false, manager_up),
            Self::Up => manager(true, true),
            Self::Down => manager(true, false),
        };
        let ready = self.is_ready();
        let verdict = if ready {
            "readyz check passed"
        } else {
            "readyz check failed"
        };
        (
            if ready { 200 } else { 503 },
            format!("{checks}{verdict}\n"),
        )
    }
}
