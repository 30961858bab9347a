//! Which remotes a cycle uses, what losing each one costs, and the scope
//! each one runs in.
//!
//! # Invariants
//!
//! - Every used remote has one scope per cycle. A run of the scope is a
//!   child token of the cycle's token: ending the cycle ends every run, and
//!   ending a run never ends the cycle.
//! - A scope starts with a run, whatever the remote's state: a remote that is
//!   already down when the cycle starts is used as any other.
//! - Only a remote that [restarts alone](UsedRemote::restarts_alone) ever has
//!   its run stopped without the cycle: on its loss the run is cancelled and
//!   no new one starts until the remote recovers.
//! - Runs are numbered; [`RemoteScope::next_run`] hands out each run at most
//!   once per handle, so a manager that asks again after a run ended waits
//!   for the next one.
//! - For a manager that [takes remote changes](crate::ManagerFactory::takes_remote_changes),
//!   the scopes follow the remotes it uses while the cycle runs: a remote
//!   added gets a new scope (handed out by [`CycleToken::joined`](crate::CycleToken::joined)),
//!   one removed has its run cancelled and its scope ended, and one at a new
//!   [version](UsedRemote::version) starts a new run, unless it is stopped
//!   for its loss (its next run, when it is back, is at the new version).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the loss of a used remote costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnLoss {
    /// The whole cycle ends with `remote_lost`: a remote the manager cannot
    /// do without, or a manager that cannot restart one remote's part alone.
    EndCycle,
    /// Only this remote's scope stops; it runs again, in the same cycle, when
    /// the remote recovers.
    RestartAlone,
}

/// A remote a cycle uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UsedRemote {
    /// The configured name, as remote signals name it.
    pub name: String,
    /// What its loss costs.
    pub on_loss: OnLoss,
    /// Changes when its part must start anew: new credentials, CA or
    /// server. 0 unless set.
    pub version: u64,
}

impl UsedRemote {
    /// A remote whose loss ends the cycle.
    #[must_use]
    pub fn ends_cycle(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            on_loss: OnLoss::EndCycle,
            version: 0,
        }
    }

    /// A remote whose loss stops only its own part of the cycle.
    #[must_use]
    pub fn restarts_alone(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            on_loss: OnLoss::RestartAlone,
            version: 0,
        }
    }

    /// The same remote at `version`.
    #[must_use]
    pub fn at_version(mut self, version: u64) -> Self {
        self.version = version;
        self
    }
}

/// How one remote's part of a running cycle changed, without ending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RemoteChange {
    /// The manager uses it now: a new scope.
    Added,
    /// The manager no longer uses it: its scope ended.
    Removed,
    /// It is used at a new version: its part starts anew.
    Rebuilt,
}

impl RemoteChange {
    /// Every kind, so metrics can be pre-initialised.
    pub const ALL: [Self; 3] = [Self::Added, Self::Removed, Self::Rebuilt];

    /// The `snake_case` label value, as used in metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Removed => "removed",
            Self::Rebuilt => "rebuilt",
        }
    }
}

impl fmt::Display for RemoteChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The remotes a cycle uses, as its factory declares them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UsedRemotes {
    /// Every remote a signal names: the loss of any one ends the cycle. The
    /// default, for managers that do not say which remotes they use. There
    /// are no per-remote scopes.
    #[default]
    All,
    /// Exactly these, each with a scope; signals about other remotes are
    /// ignored.
    Only(Vec<UsedRemote>),
}

/// One run of a scope: its number, and its token while it runs.
#[derive(Debug, Clone)]
struct Run {
    number: u64,
    /// `None` while the scope is stopped (its remote is lost).
    token: Option<CancellationToken>,
}

/// The supervisor's side of one remote's scope.
#[derive(Debug)]
pub(crate) struct Scope {
    on_loss: OnLoss,
    /// The [`UsedRemote::version`] it runs.
    version: AtomicU64,
    cycle: CancellationToken,
    runs: watch::Sender<Run>,
}

impl Scope {
    pub(crate) fn new(used: &UsedRemote, cycle: &CancellationToken) -> Self {
        let first = Run {
            number: 1,
            token: Some(cycle.child_token()),
        };
        Self {
            on_loss: used.on_loss,
            version: AtomicU64::new(used.version),
            cycle: cycle.clone(),
            runs: watch::Sender::new(first),
        }
    }

    /// Takes `version` in; whether it is new.
    pub(crate) fn set_version(&self, version: u64) -> bool {
        self.version.swap(version, Ordering::Relaxed) != version
    }

    pub(crate) fn on_loss(&self) -> OnLoss {
        self.on_loss
    }

    /// Whether a run is in progress (the remote's part has not been
    /// stopped alone).
    pub(crate) fn is_running(&self) -> bool {
        self.runs.borrow().token.is_some()
    }

    /// Cancels the run in progress; returns whether there was one.
    pub(crate) fn stop(&self) -> bool {
        let mut stopped = false;
        self.runs.send_modify(|run| {
            if let Some(token) = run.token.take() {
                token.cancel();
                stopped = true;
            }
        });
        stopped
    }

    /// Starts a new run, cancelling the one in progress if any.
    pub(crate) fn start(&self) {
        let next = self.cycle.child_token();
        self.runs.send_modify(|run| {
            if let Some(token) = run.token.replace(next) {
                token.cancel();
            }
            run.number += 1;
        });
    }
}

/// Every used remote's scope in one cycle, by name.
pub(crate) type Scopes = BTreeMap<String, Arc<Scope>>;

pub(crate) fn scopes(used: &[UsedRemote], cycle: &CancellationToken) -> Scopes {
    used.iter()
        .map(|remote| (remote.name.clone(), Arc::new(Scope::new(remote, cycle))))
        .collect()
}

/// A manager's view of one remote's scope in a cycle: the runs of the part
/// of the manager that uses this remote.
///
/// Get it with [`CycleToken::scope`](crate::CycleToken::scope).
#[derive(Debug)]
pub struct RemoteScope {
    name: String,
    on_loss: OnLoss,
    runs: watch::Receiver<Run>,
    cycle: CancellationToken,
    taken: u64,
}

impl RemoteScope {
    pub(crate) fn new(name: &str, scope: &Scope) -> Self {
        Self {
            name: name.to_owned(),
            on_loss: scope.on_loss,
            runs: scope.runs.subscribe(),
            cycle: scope.cycle.clone(),
            taken: 0,
        }
    }

    /// The remote's configured name.
    #[must_use]
    pub fn remote(&self) -> &str {
        &self.name
    }

    /// What the loss of this remote costs.
    #[must_use]
    pub fn on_loss(&self) -> OnLoss {
        self.on_loss
    }

    /// Waits for the next run of this remote's part, and returns the token
    /// it runs under: a child of the cycle's token, cancelled when the part
    /// must stop, alone or with the cycle.
    ///
    /// The first call returns at once. After a run ends alone (the remote
    /// was lost), the next call returns when the remote is back. Returns
    /// `None` once the cycle is cancelled, or the remote removed from it.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: a run is handed out only when this returns it.
    pub async fn next_run(&mut self) -> Option<CancellationToken> {
        loop {
            if self.cycle.is_cancelled() {
                return None;
            }
            {
                let run = self.runs.borrow_and_update();
                if run.number > self.taken
                    && let Some(token) = &run.token
                {
                    self.taken = run.number;
                    return Some(token.clone());
                }
            }
            tokio::select! {
                () = self.cycle.cancelled() => return None,
                changed = self.runs.changed() => {
                    // The supervisor dropped the scope: the cycle is over.
                    if changed.is_err() {
                        return None;
                    }
                }
            }
        }
    }
}
