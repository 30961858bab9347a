//! What the supervisor drives: something that builds and runs a manager.

use std::error::Error as StdError;
use std::fmt::Write as _;

use crate::{CycleToken, UsedRemotes};

/// A boxed error from a manager, as any library would return it.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// How a manager run ended badly.
///
/// The variant decides the cause the cycle is recorded with.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The manager could not be built (`build_failed`).
    #[error("building the manager failed")]
    BuildFailed(#[source] BoxError),
    /// The manager ran and then returned an error (`manager_failed`).
    #[error("the manager failed")]
    Failed(#[source] BoxError),
}

impl ManagerError {
    /// The manager could not be built.
    pub fn build(error: impl Into<BoxError>) -> Self {
        Self::BuildFailed(error.into())
    }

    /// The manager ran and then failed.
    pub fn failed(error: impl Into<BoxError>) -> Self {
        Self::Failed(error.into())
    }

    /// The underlying error and its sources, joined with `: `.
    #[must_use]
    pub fn source_chain(&self) -> String {
        let (Self::BuildFailed(source) | Self::Failed(source)) = self;
        error_chain(source.as_ref())
    }
}

/// Renders an error and each of its sources, joined with `: `, each cause
/// once (a source whose message the chain already holds is left out), fit
/// to print: an error may carry a peer's text (an apiserver's message), so
/// control characters are escaped and the whole is cut at
/// [`MAX_ERROR_CHARS`](crate::MAX_ERROR_CHARS) (see [`printable`](crate::printable)).
#[must_use]
pub fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // A message that quotes its source already says it: once is enough.
        let text = cause.to_string();
        if !out.contains(&text) {
            write!(out, ": {text}").expect("writing to a String cannot fail");
        }
        source = cause.source();
        if out.len() > 4 * crate::MAX_ERROR_CHARS {
            break;
        }
    }
    crate::printable(&out, crate::MAX_ERROR_CHARS).into_owned()
}

/// Builds a manager for a cycle and runs it until it ends.
///
/// The supervisor calls [`run`](Self::run) once per cycle. The manager must
/// return soon after `cycle` is cancelled; at shutdown it has the
/// supervisor's `shutdown_grace` to do so, after which its future is dropped.
/// It reports that it is up (its required caches have synced) with
/// [`CycleToken::set_manager_up`].
///
/// A manager writes no code to end its cycle when a remote is lost or comes
/// back, or when the configuration changes: the supervisor takes those as
/// its inputs ([`Supervisor::end_cycles_on`](crate::Supervisor::end_cycles_on),
/// [`SupervisorHandle::end_cycle`](crate::SupervisorHandle::end_cycle)) and
/// cancels the cycle. A manager declares which remotes it uses with
/// [`remotes`](Self::remotes); a manager that ends a cycle for a reason of
/// its own calls [`CycleToken::cancel`] with a cause and returns.
///
/// ```no_run
/// use tether_supervisor::{CycleToken, ManagerError, ManagerFactory};
///
/// struct Idle;
///
/// impl ManagerFactory for Idle {
///     async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
///         cycle.set_manager_up(true);
///         cycle.cancelled().await;
///         Ok(())
///     }
/// }
/// ```
pub trait ManagerFactory: Send + Sync {
    /// The remotes the next cycle uses, and what losing each one costs.
    ///
    /// Called once at the start of every cycle, just before
    /// [`run`](Self::run), so it sees the same configuration. The default,
    /// [`UsedRemotes::All`], ends the cycle on the loss of any remote.
    fn remotes(&self) -> UsedRemotes {
        UsedRemotes::All
    }

    /// Whether the manager starts only while no remote whose loss ends its
    /// cycle is lost. A manager that cannot run in part (a process) says
    /// so: started against a lost remote it could only wait on it or fail.
    /// The supervisor then holds each cycle before [`run`](Self::run) while
    /// any such remote is lost, and runs it, with no rebuild, when the last
    /// one is back. The default, `false`, runs at once: the built-in
    /// manager syncs the reachable remotes meanwhile.
    fn waits_for_lost_remotes(&self) -> bool {
        false
    }

    /// Whether the manager takes a change of the remotes it uses, for
    /// `cause`, in its running cycle: it runs each remote's part under its
    /// scope, and starts a part for each scope [`CycleToken::joined`]
    /// hands it. The supervisor then asks [`remotes`](Self::remotes) again
    /// and makes the scopes follow, instead of ending the cycle. Its
    /// remotes must be [`UsedRemotes::Only`]. The default, `false`, ends
    /// the cycle at each change.
    fn takes_remote_changes(&self, cause: &crate::Cause) -> bool {
        let _ = cause;
        false
    }

    /// Builds the manager for `cycle` and runs it until it ends.
    ///
    /// Returning `Ok` without the cycle having been cancelled counts as
    /// `manager_exited`; a panic counts as `manager_panicked`.
    ///
    /// # Errors
    ///
    /// [`ManagerError::BuildFailed`] if the manager could not be built, and
    /// [`ManagerError::Failed`] if it failed while running.
    ///
    /// # Cancellation safety
    ///
    /// The future is dropped if it outlives the shutdown grace period, so it
    /// must leave nothing behind that a drop would corrupt.
    fn run(&self, cycle: CycleToken) -> impl Future<Output = Result<(), ManagerError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("watch failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_lists_every_source_once() {
        let err = ManagerError::failed(Outer(std::io::Error::other("connection refused")));
        assert_eq!(err.source_chain(), "watch failed: connection refused");
        assert_eq!(err.to_string(), "the manager failed");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x: {0}")]
    struct Quoting(#[source] std::io::Error);

    #[test]
    fn a_cause_its_parent_quotes_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let shown = io.to_string();
        let err = ManagerError::failed(Outer(std::io::Error::other(Quoting(io))));
        assert_eq!(
            err.source_chain(),
            format!("watch failed: cannot read /x: {shown}")
        );
    }
}
