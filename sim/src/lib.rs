//! tether's simulated Kubernetes apiserver: the remotes `tether demo`
//! runs against, and the peer of tether's tests where a real apiserver
//! cannot show a fault.
//!
//! It speaks the real protocol over real sockets, faithfully enough that the
//! real `kubectl`, the Python `kubernetes` client and kube-rs work against
//! it (`docs/testkit.md` has the full table):
//!
//! - health and discovery: `/readyz`, `/livez`, `/healthz` (with
//!   `?verbose`), `/version`, `/api`, `/api/v1`, `/apis`, each group;
//! - Namespaces (seeded, read-only), ConfigMaps, Events (`v1` and
//!   `events.k8s.io/v1`) and Leases from an in-memory store with a
//!   monotonically increasing `resourceVersion`: get, list (with `limit`,
//!   `continue`, `labelSelector` and `fieldSelector=metadata.name=`), watch
//!   (with `resourceVersion`, `allowWatchBookmarks`, `timeoutSeconds`,
//!   `sendInitialEvents`, and a 410 `Expired` for a version older than the
//!   history), create, update (with optimistic concurrency), JSON, merge
//!   and strategic patches, server-side apply with `managedFields` and
//!   conflicts, `dryRun`, and delete with preconditions;
//! - JSON and protobuf (Kubernetes' envelope, and its watch framing), with
//!   every object checked against its kind's `k8s-pb` message;
//! - errors as `Status` objects; HTTP or HTTPS with a CA of its own;
//!   optional bearer tokens.
//!
//! [`Fault`]s switch at run time, and act at the socket level the way the
//! real failure does.
//!
//! It depends on no tether crate, so `tether demo` embeds it and every
//! crate's tests can use it (through `tether-testkit`, which adds what only
//! tests need: real control planes, hostile peers, network paths).
//!
//! ```no_run
//! use tether_sim::{ApiServer, Fault, Options};
//!
//! # async fn example() -> tether_sim::Result<()> {
//! let server = ApiServer::start(Options::default().tls(true).token("t0ken")).await?;
//! server.kubeconfig().write(std::path::Path::new("/tmp/kubeconfig"))?;
//! server.set_fault(Fault::Refuse).await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod api;
mod fault;
mod kubeconfig;
mod managed;
mod patch;
mod proto;
mod resource;
mod selector;
mod server;
mod status;
mod store;
mod tls;
mod wire;
mod write;

pub use crate::fault::{Fault, parse_duration};
pub use crate::kubeconfig::Kubeconfig;
pub use crate::resource::Resource;
pub use crate::selector::check_label_selector;
pub use crate::server::{ApiServer, Options, Requests, Restart, Rotation, Stats};
pub use crate::tls::certificate_authority;

/// What can go wrong when running a simulated apiserver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listen address could not be bound.
    #[error("binding {addr} failed")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A certificate could not be generated.
    #[error("generating a certificate failed")]
    Tls(#[source] rcgen::Error),
    /// rustls rejected the TLS configuration.
    #[error("configuring TLS failed")]
    Rustls(#[source] rustls::Error),
    /// The server cannot do that in its configuration.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The store rejected an object.
    #[error("the object was rejected: {0}")]
    Api(String),
    /// A file could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The state folder's file could not be written.
    #[error("cannot write {}", .0.display())]
    State(std::path::PathBuf, #[source] std::io::Error),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
