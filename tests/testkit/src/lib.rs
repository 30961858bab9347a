//! A simulated Kubernetes apiserver for tether's tests and `tether demo`.
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
//! real failure does. A [`HostileServer`] is no apiserver at all: it
//! misbehaves in one way (an endless body, a huge head, a drip, a stall,
//! garbage) for the hostile-peer tests. [`serve_control`] exposes them over HTTP for the
//! `fake-apiserver` binary. A [`TestHost`] (root only) gives a network path
//! whose packets can be dropped, for the `blackhole` fault.
//!
//! It depends on no tether crate, so every crate can use it as a
//! dev-dependency, and `tether demo` can embed it.
//!
//! ```no_run
//! use tether_testkit::{ApiServer, Fault, Options};
//!
//! # async fn example() -> tether_testkit::Result<()> {
//! let server = ApiServer::start(Options::default().tls(true).token("t0ken")).await?;
//! server.kubeconfig().write(std::path::Path::new("/tmp/kubeconfig"))?;
//! server.set_fault(Fault::Refuse).await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod api;
mod control;
mod fault;
mod hostile;
mod kubeconfig;
mod managed;
mod netns;
mod node;
mod patch;
pub mod plumbing;
pub mod procfs;
mod proto;
mod real;
mod resource;
mod selector;
mod server;
mod status;
mod store;
mod tls;
mod wire;
mod write;

pub use crate::control::serve_control;
pub use crate::fault::{Fault, parse_duration};
pub use crate::hostile::{FORGED_LINE, HostileServer, Hostility};
pub use crate::kubeconfig::Kubeconfig;
pub use crate::netns::TestHost;
pub use crate::node::{NODE_NAME, Node, PAUSE_IMAGE};
pub use crate::plumbing::{EVERY, free_port, fuzz_budget, http_get, median_max, poll};
pub use crate::real::{ControlPlane, RealOptions, SERVICE_IP, peer};
pub use crate::resource::Resource;
pub use crate::selector::check_label_selector;
pub use crate::server::{ApiServer, Options, Requests, Restart, Rotation, Stats};

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
    /// A test host needs root.
    #[error("{0}")]
    NotRoot(&'static str),
    /// An external command failed.
    #[error("`{command}` failed: {reason}")]
    Command {
        /// The command line.
        command: String,
        /// Its error output, or why it could not start.
        reason: String,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a test needs of an apiserver to point a client at it, simulated
/// ([`ApiServer`]) or real ([`ControlPlane`]), so one test body can meet
/// both.
pub trait Cluster {
    /// The address clients connect to.
    fn addr(&self) -> std::net::SocketAddr;
    /// A kubeconfig for a client with every right.
    fn kubeconfig(&self) -> Kubeconfig;
}

impl Cluster for ApiServer {
    fn addr(&self) -> std::net::SocketAddr {
        ApiServer::addr(self)
    }
    fn kubeconfig(&self) -> Kubeconfig {
        ApiServer::kubeconfig(self)
    }
}

impl Cluster for ControlPlane {
    fn addr(&self) -> std::net::SocketAddr {
        ControlPlane::addr(self)
    }
    fn kubeconfig(&self) -> Kubeconfig {
        ControlPlane::kubeconfig(self)
    }
}
