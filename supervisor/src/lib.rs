//! The cycle loop of tether: build a manager once per cycle under a
//! cancellable child token, record why each cycle ended, and rebuild with
//! backoff.
//!
//! This crate knows nothing about Kubernetes. It drives a [`ManagerFactory`],
//! and takes what ends a cycle as its inputs, as `kube-runtime`'s
//! `Controller::reconcile_all_on` takes its triggers: a stream of
//! [`RemoteSignal`]s ([`Supervisor::end_cycles_on`]) and
//! [`SupervisorHandle::end_cycle`] (new configuration). No manager has to
//! wire them up itself.
//!
//! # Invariants of the loop
//!
//! - Cycle `n` runs under a fresh [`CycleToken`], a child of the root token.
//!   Cancelling root cancels every cycle; cancelling a cycle never cancels
//!   root.
//! - Every cycle ends with exactly one [`Cause`]: the first one recorded. A
//!   manager that returns after its cycle was cancelled does not change it.
//!   A manager that returns `Ok` uncancelled ends its cycle as
//!   `manager_exited`, an error as `manager_failed` or `build_failed`, and a
//!   panic as `manager_panicked`. A panic never ends the loop.
//! - A remote signal counts for the cycle that runs when the loop takes it;
//!   signals between cycles are dropped, so a remote already down when a
//!   cycle starts does not end it again. Dropped signals (a source that fell
//!   behind) end the cycle as `transitions_missed`: a loss may be among them.
//! - The loop keeps which remotes are lost, from every signal it takes. A
//!   manager that [waits for lost remotes](ManagerFactory::waits_for_lost_remotes)
//!   is not run while a remote whose loss would end its cycle is lost: the
//!   cycle holds, and its manager starts in it when the last one is back.
//!   Dropped signals forget what was lost, so a missed recovery never holds
//!   a cycle for ever.
//! - Each remote a cycle uses has a scope ([`RemoteScope`]). The loss of a
//!   remote that [restarts alone](UsedRemote::restarts_alone) stops only its
//!   scope, counted in `tether_remote_restarts_total`; it runs again in the
//!   same cycle when the remote recovers. Any other used remote's loss ends
//!   the cycle.
//! - When the remotes a manager uses change ([`Supervisor::change_remotes_on`]),
//!   a manager that [takes remote changes](ManagerFactory::takes_remote_changes)
//!   gets them in its running cycle, one scope each (added, removed, or
//!   started anew at a new version), counted in
//!   `tether_remote_changes_total`; any other manager's cycle ends.
//! - At most one manager runs at a time, and none runs after [`Supervisor::run`]
//!   returns: the manager's future is awaited in the loop's own task, and
//!   dropped if it overruns the shutdown grace.
//! - After any cause but `shutdown`, the loop waits a backoff and builds
//!   again. The backoff resets after a cycle that lived at least
//!   `stable_after`; a shutdown cuts the wait short, and no build follows it.
//! - `tether_manager_up` is 1 only between the current cycle's manager
//!   reporting itself up and the end of that cycle; a report from a cancelled
//!   or older cycle is ignored.
//! - While the loop waits (on a manager, or a backoff), it records a heartbeat
//!   every `heartbeat`; a stale heartbeat means the loop is wedged.
//!
//! # Example
//!
//! ```no_run
//! use prometheus::Registry;
//! use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, Supervisor, SupervisorConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! struct Idle;
//!
//! impl ManagerFactory for Idle {
//!     async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
//!         cycle.set_manager_up(true);
//!         cycle.cancelled().await;
//!         Ok(())
//!     }
//! }
//!
//! # async fn example() -> Result<(), tether_supervisor::Error> {
//! let registry = Registry::new();
//! let supervisor = Supervisor::new(Idle, SupervisorConfig::default(), &registry)?;
//! let root = CancellationToken::new();
//! let outcome = supervisor.run(root).await;
//! # let _ = outcome;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod backoff;
mod cause;
mod factory;
mod metrics;
mod scope;
mod signal;
mod state;
mod supervisor;
mod text;
mod token;

pub use crate::backoff::{Backoff, BackoffConfig};
pub use crate::cause::{Cause, CauseKind};
pub use crate::factory::{BoxError, ManagerError, ManagerFactory, error_chain};
pub use crate::scope::{OnLoss, RemoteChange, RemoteScope, UsedRemote, UsedRemotes};
pub use crate::signal::RemoteSignal;
pub use crate::state::{
    ChangedRemote, EndedCycle, Phase, RECENT_CYCLES, RECENT_REMOTE_CHANGES, Status,
};
pub use crate::supervisor::{ShutdownOutcome, Supervisor, SupervisorConfig, SupervisorHandle};
pub use crate::text::{MAX_ERROR_CHARS, panic_message, printable};
pub use crate::token::CycleToken;

/// What can go wrong when setting up a supervisor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range.
    #[error("{field}: {reason}")]
    InvalidConfig {
        /// The setting's path, such as `backoff.jitter`.
        field: &'static str,
        /// Why the value was rejected.
        reason: String,
    },
    /// The supervisor's metrics could not be registered.
    #[error("registering the supervisor's metrics failed")]
    RegisterMetrics(#[source] prometheus::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
