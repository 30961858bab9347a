//! The cycle token: a cancellable child of the root token that remembers why
//! it was cancelled.
//!
//! # Invariants
//!
//! - A cycle token is a child of the root token: cancelling root cancels it,
//!   cancelling it never cancels root.
//! - The cause is recorded *before* the token is cancelled, so whoever wakes
//!   from [`CycleToken::cancelled`] after [`CycleToken::cancel`] sees a cause.
//!   (A token cancelled only through root has no cause until the supervisor
//!   records [`Cause::Shutdown`].)
//! - The first recorded cause wins; later ones are ignored.
//! - Once the token is cancelled, the manager can no longer report itself up.
//! - The remotes the cycle uses, and their scopes, are set before the
//!   manager runs; a token made outside a supervisor has none. Only the
//!   supervisor changes them afterwards, for a manager that takes remote
//!   changes; each scope added is handed to the manager once, through
//!   [`CycleToken::joined`].

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::scope::{RemoteScope, Scope, Scopes, UsedRemote, UsedRemotes};
use crate::state::State;
use crate::{Cause, OnLoss, RemoteChange};

/// How a cycle uses a remote a signal names.
pub(crate) enum Usage {
    /// Not at all: the signal is ignored.
    Unused,
    /// Its loss ends the cycle.
    EndsCycle,
    /// Its loss stops only this scope.
    RestartsAlone(Arc<Scope>),
}

/// The scopes of a cycle that uses remotes by name, and the way new ones
/// reach its manager.
#[derive(Debug)]
struct Used {
    scopes: Mutex<Scopes>,
    joining: mpsc::UnboundedSender<RemoteScope>,
    joined: tokio::sync::Mutex<mpsc::UnboundedReceiver<RemoteScope>>,
}

impl Used {
    fn scopes(&self) -> MutexGuard<'_, Scopes> {
        // Nothing panics while holding it; the map is whole either way.
        self.scopes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The token of one cycle, handed to the manager.
///
/// Cloning is cheap and every clone refers to the same cycle.
#[derive(Clone, Debug)]
pub struct CycleToken {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    number: u64,
    token: CancellationToken,
    cause: OnceLock<Cause>,
    state: Option<Arc<State>>,
    /// `None` until set: every remote is used, without scopes.
    used: OnceLock<Used>,
}

impl CycleToken {
    /// A token for cycle `number`, as a child of `root`.
    ///
    /// The supervisor makes these itself; this constructor is for driving a
    /// manager without a supervisor, in tests. Such a token's
    /// [`set_manager_up`](Self::set_manager_up) reports to nobody.
    #[must_use]
    pub fn new(number: u64, root: &CancellationToken) -> Self {
        Self::with_state(number, root, None)
    }

    pub(crate) fn with_state(
        number: u64,
        root: &CancellationToken,
        state: Option<Arc<State>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                number,
                token: root.child_token(),
                cause: OnceLock::new(),
                state,
                used: OnceLock::new(),
            }),
        }
    }

    /// The cycle's number, starting at 1.
    #[must_use]
    pub fn number(&self) -> u64 {
        self.inner.number
    }

    /// Cancels the cycle with `cause`.
    ///
    /// Returns `true` if `cause` was recorded, and `false` if an earlier cause
    /// had already won. The token is cancelled either way.
    // Not `#[must_use]`: most callers cancel and move on; the result is for
    // those that log whether their cause won.
    #[allow(clippy::must_use_candidate)]
    pub fn cancel(&self, cause: Cause) -> bool {
        let recorded = self.inner.cause.set(cause).is_ok();
        self.inner.token.cancel();
        recorded
    }

    /// The cause that ended the cycle, if one has been recorded.
    #[must_use]
    pub fn cause(&self) -> Option<&Cause> {
        self.inner.cause.get()
    }

    /// Whether the cycle has been cancelled, by a cause or through root.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.inner.token.is_cancelled()
    }

    /// Completes when the cycle is cancelled.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: dropping the future has no effect on the token, and a new
    /// call completes at once if the token was cancelled meanwhile.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.inner.token.cancelled()
    }

    /// A child token for the manager's own tasks: cancelled with the cycle,
    /// and cancelling it does not end the cycle.
    #[must_use]
    pub fn child_token(&self) -> CancellationToken {
        self.inner.token.child_token()
    }

    /// The scope of `remote` in this cycle, if the cycle uses it by name.
    ///
    /// A manager that declared its remotes
    /// ([`ManagerFactory::remotes`](crate::ManagerFactory::remotes)) runs
    /// each remote's part under the runs of its scope, so that the loss of
    /// a remote that restarts alone stops only that part.
    #[must_use]
    pub fn scope(&self, remote: &str) -> Option<RemoteScope> {
        self.inner
            .used
            .get()?
            .scopes()
            .get(remote)
            .map(|scope| RemoteScope::new(remote, scope))
    }

    /// The scope of the next remote the cycle uses from now on, as the
    /// supervisor adds it for a manager that
    /// [takes remote changes](crate::ManagerFactory::takes_remote_changes);
    /// each is handed out once. Waits until there is one; `None` once the
    /// cycle is cancelled, or if it uses no remotes by name.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: a scope is handed out only when this returns it.
    pub async fn joined(&self) -> Option<RemoteScope> {
        let used = self.inner.used.get()?;
        let mut joined = tokio::select! {
            () = self.cancelled() => return None,
            joined = used.joined.lock() => joined,
        };
        tokio::select! {
            () = self.cancelled() => None,
            scope = joined.recv() => scope,
        }
    }

    /// Sets the remotes the cycle uses; only the first call counts.
    pub(crate) fn use_remotes(&self, used: &UsedRemotes) {
        if let UsedRemotes::Only(remotes) = used {
            let (joining, joined) = mpsc::unbounded_channel();
            let _ = self.inner.used.set(Used {
                scopes: Mutex::new(crate::scope::scopes(remotes, &self.inner.token)),
                joining,
                joined: tokio::sync::Mutex::new(joined),
            });
        }
    }

    /// Makes the cycle's scopes follow `now`, the remotes its manager uses
    /// now: what changed, by remote, in order of name. `Err` names a remote
    /// whose loss now costs something else, which no scope can take in: the
    /// cycle must end. Nothing changes for a cycle without scopes.
    pub(crate) fn change_remotes(
        &self,
        now: &[UsedRemote],
    ) -> Result<Vec<(String, RemoteChange)>, String> {
        let Some(used) = self.inner.used.get() else {
            return Ok(Vec::new());
        };
        let mut scopes = used.scopes();
        if let Some(changed) = now.iter().find(|remote| {
            scopes
                .get(&remote.name)
                .is_some_and(|scope| scope.on_loss() != remote.on_loss)
        }) {
            return Err(changed.name.clone());
        }
        let wanted: std::collections::BTreeMap<&str, &UsedRemote> = now
            .iter()
            .map(|remote| (remote.name.as_str(), remote))
            .collect();
        let mut changes = Vec::new();
        scopes.retain(|name, scope| {
            if wanted.contains_key(name.as_str()) {
                return true;
            }
            scope.stop();
            changes.push((name.clone(), RemoteChange::Removed));
            false
        });
        for (name, remote) in wanted {
            if let Some(scope) = scopes.get(name) {
                if scope.set_version(remote.version) {
                    // A part stopped for its loss starts at the new version
                    // when the remote is back.
                    if scope.is_running() {
                        scope.start();
                    }
                    changes.push((name.to_owned(), RemoteChange::Rebuilt));
                }
            } else {
                let scope = Arc::new(Scope::new(remote, &self.inner.token));
                // The manager may be gone already: then so is the cycle.
                let _ = used.joining.send(RemoteScope::new(name, &scope));
                scopes.insert(name.to_owned(), scope);
                changes.push((name.to_owned(), RemoteChange::Added));
            }
        }
        changes.sort();
        Ok(changes)
    }

    /// How the cycle uses `remote`.
    pub(crate) fn usage(&self, remote: &str) -> Usage {
        let Some(used) = self.inner.used.get() else {
            return Usage::EndsCycle;
        };
        match used.scopes().get(remote) {
            None => Usage::Unused,
            Some(scope) => match scope.on_loss() {
                OnLoss::EndCycle => Usage::EndsCycle,
                OnLoss::RestartAlone => Usage::RestartsAlone(Arc::clone(scope)),
            },
        }
    }

    /// The names of the remotes whose part is stopped alone.
    pub(crate) fn stopped_remotes(&self) -> Vec<String> {
        self.inner.used.get().map_or_else(Vec::new, |used| {
            used.scopes()
                .iter()
                .filter(|(_, scope)| !scope.is_running())
                .map(|(name, _)| name.clone())
                .collect()
        })
    }

    /// Reports whether the manager is up (its required caches have synced).
    ///
    /// After the cycle is cancelled, reporting `true` is ignored: a manager
    /// that is being torn down is never up. Returns whether the report was
    /// taken.
    // Not `#[must_use]`: a manager reports and moves on; see `cancel`.
    #[allow(clippy::must_use_candidate)]
    pub fn set_manager_up(&self, up: bool) -> bool {
        match &self.inner.state {
            // The check of `is_cancelled` happens under the state's lock, and
            // the supervisor cancels before it takes that lock to clear
            // `manager_up`, so a late report cannot overwrite the clear.
            Some(state) => state.set_manager_up(self.inner.number, up, || self.is_cancelled()),
            None => !(up && self.is_cancelled()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_cause_wins() {
        let root = CancellationToken::new();
        let cycle = CycleToken::new(1, &root);
        assert!(cycle.cancel(Cause::remote_lost("a")));
        assert!(!cycle.cancel(Cause::ConfigChanged));
        assert!(!cycle.cancel(Cause::Shutdown));
        assert_eq!(cycle.cause(), Some(&Cause::remote_lost("a")));
    }

    #[test]
    fn cancelling_a_cycle_never_cancels_root() {
        let root = CancellationToken::new();
        let cycle = CycleToken::new(1, &root);
        cycle.cancel(Cause::ConfigChanged);
        assert!(cycle.is_cancelled());
        assert!(!root.is_cancelled());
    }

    #[test]
    fn cancelling_root_cancels_the_cycle_without_a_cause() {
        let root = CancellationToken::new();
        let cycle = CycleToken::new(1, &root);
        let child = cycle.child_token();
        root.cancel();
        assert!(cycle.is_cancelled());
        assert!(child.is_cancelled());
        assert_eq!(cycle.cause(), None);
    }

    #[test]
    fn clones_share_the_cause() {
        let root = CancellationToken::new();
        let cycle = CycleToken::new(7, &root);
        let clone = cycle.clone();
        clone.cancel(Cause::remote_recovered("b"));
        assert_eq!(cycle.number(), 7);
        assert_eq!(cycle.cause(), Some(&Cause::remote_recovered("b")));
    }

    #[test]
    fn a_cancelled_cycle_cannot_report_up() {
        let root = CancellationToken::new();
        let cycle = CycleToken::new(1, &root);
        assert!(cycle.set_manager_up(true));
        cycle.cancel(Cause::ConfigChanged);
        assert!(!cycle.set_manager_up(true));
        assert!(cycle.set_manager_up(false));
    }
}
