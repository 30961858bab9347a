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
//! - The remotes the cycle uses, and their scopes, are set once, before the
//!   manager runs; a token made outside a supervisor has none.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::Cause;
use crate::OnLoss;
use crate::scope::{RemoteScope, Scope, Scopes, UsedRemotes};
use crate::state::State;

/// How a cycle uses a remote a signal names.
pub(crate) enum Usage<'a> {
    /// Not at all: the signal is ignored.
    Unused,
    /// Its loss ends the cycle.
    EndsCycle,
    /// Its loss stops only this scope.
    RestartsAlone(&'a Scope),
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
    scopes: OnceLock<Scopes>,
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
                scopes: OnceLock::new(),
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
            .scopes
            .get()?
            .get(remote)
            .map(|scope| RemoteScope::new(remote, scope))
    }

    /// Sets the remotes the cycle uses; only the first call counts.
    pub(crate) fn use_remotes(&self, used: &UsedRemotes) {
        if let UsedRemotes::Only(remotes) = used {
            let _ = self
                .inner
                .scopes
                .set(crate::scope::scopes(remotes, &self.inner.token));
        }
    }

    /// How the cycle uses `remote`.
    pub(crate) fn usage(&self, remote: &str) -> Usage<'_> {
        match self.inner.scopes.get().map(|scopes| scopes.get(remote)) {
            None => Usage::EndsCycle,
            Some(None) => Usage::Unused,
            Some(Some(scope)) => match scope.on_loss() {
                OnLoss::EndCycle => Usage::EndsCycle,
                OnLoss::RestartAlone => Usage::RestartsAlone(scope),
            },
        }
    }

    /// The names of the remotes whose part is stopped alone.
    pub(crate) fn stopped_remotes(&self) -> Vec<String> {
        self.inner.scopes.get().map_or_else(Vec::new, |scopes| {
            scopes
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
