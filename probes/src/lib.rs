//! Reachability probes for the remote apiservers tether watches.
//!
//! - **Identity.** A remote is identified by its normalized server URL, TLS
//!   server name, CA bundle and proxy ([`Identity`]). Remotes that share an
//!   identity are probed once, and the result is reported under each name.
//! - **Classification.** Any HTTP answer is reachable (a rebuild cannot fix
//!   a 401 or a 500), unless its status is listed in `unreachableStatuses`.
//!   Only a transport failure or the deadline is unreachable, with a
//!   [`FailureCause`]. A failure to make the probe here (credentials) is a
//!   [`Outcome::LocalError`] and never counts toward the threshold.
//! - **State.** A [`Tracker`] per identity moves between
//!   [`Reachability`] states with failure and success thresholds.
//! - **Lifetime.** The [`ProbeSet`] lives as long as the process. Reloads
//!   call [`ProbeSet::sync`], which keeps the state of remotes that stay and
//!   deletes the metric series of remotes that go.
//! - **Cycles.** Transitions are published; [`ProbeSetHandle::signals`]
//!   turns them into the losses and recoveries the supervisor ends cycles
//!   on. A manager that fails to reach a remote
//!   [suspects](ProbeSetHandle::suspect) it, and the remote is probed at once
//!   on a new connection.
//!
//! The crate knows kube clients and HTTP, and nothing of the manager.
//!
//! ```no_run
//! use prometheus::Registry;
//! use tether_probes::{ProbeConfig, ProbeSet, Remote};
//!
//! # async fn example(config: kube::Config) -> tether_probes::Result<()> {
//! let registry = Registry::new();
//! let probes = ProbeSet::new(ProbeConfig::default(), &registry)?;
//! probes.sync(&[Remote::new("cluster-a", config)])?;
//! // Losses and recoveries, for `Supervisor::end_cycles_on`.
//! let signals = probes.handle().signals();
//! # drop(signals);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod bounded;
mod classify;
mod config;
mod credentials;
mod history;
mod http;
mod identity;
mod metrics;
mod probe;
mod scratch;
mod set;
mod tracker;
mod wire;

pub use crate::classify::{FailureCause, LocalKind, Outcome, ProbeResult, classify};
pub use crate::config::ProbeConfig;
pub use crate::history::{
    BUCKET_WIDTH, Bucket, HISTORY_BUCKETS, HISTORY_WINDOW, MOST_COUNTED, Recent,
};
pub use crate::http::HEAD_TOO_LARGE;
pub use crate::identity::{Identity, Remote};
pub use crate::probe::{ProbeClient, probe_client, probe_once};
pub use crate::set::{
    CheckRow, MetricChunks, ProbeSet, ProbeSetHandle, Recheck, RemoteStatus, Transition, check,
};
pub use crate::tracker::{Reachability, Tracker};

/// The kube client plumbing the probes are built on, which the manager and
/// the Lease clients share so that every client tether makes is bounded and
/// reported alike: response size limits, credential plugins run off the
/// async workers under a deadline, the cause of a failure, and URLs shown
/// without their secrets.
pub mod client {
    pub use crate::bounded::{
        Bounded, MAX_LEASE_RESPONSE, MAX_RESPONSE, MAX_WATCH_EVENT, ResponseTooLarge,
        bounded_client, bounded_client_within,
    };
    pub use crate::classify::{out_of_descriptors, root_cause, transport_failure};
    pub use crate::credentials::{
        BuildError, PLUGIN_DEADLINE, Pending, off_workers, once_off_workers,
    };
    pub use crate::identity::{host_port, normalize_url};
    pub use crate::probe::{shown_url, without_userinfo};
}

/// What can go wrong when setting up probes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range.
    #[error("{field}: {reason}")]
    InvalidConfig {
        /// The setting, as `ProbeConfig` names it: `timeout`, `jitter`.
        field: &'static str,
        /// Why the value was rejected.
        reason: String,
    },
    /// A server URL cannot be normalized.
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    /// A configured remote is invalid.
    #[error("remote {name}")]
    Remote {
        /// The remote's configured name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },
    /// Two remotes have the same name.
    #[error("remote name {0:?} is used twice")]
    DuplicateName(String),
    /// kube could not build a client from a remote's configuration.
    #[error("building the probe client failed")]
    Client(#[source] kube::Error),
    /// The name a remote's certificate must carry is not a valid server
    /// name.
    #[error("invalid TLS server name {0:?}")]
    InvalidServerName(String),
    /// The metrics could not be registered.
    #[error("registering the probe metrics failed")]
    RegisterMetrics(#[source] prometheus::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
