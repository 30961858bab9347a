//! What tether's tests need of their peers: the simulated apiserver
//! (`tether-sim`, re-exported), real control planes, hostile peers,
//! network paths that drop packets, and one bounded wait.
//!
//! The simulator is its own crate, `tether-sim` (`sim/`), because
//! `tether demo` ships it; this crate is never linked into tether.
//! [`HostileServer`] is no apiserver at all: it misbehaves in one way (an
//! endless body, a huge head, a drip, a stall, garbage) for the
//! hostile-peer tests. [`serve_control`] exposes the simulator's faults
//! over HTTP for the `fake-apiserver` binary. A [`TestHost`] (root only)
//! gives a network path whose packets can be dropped, for the `blackhole`
//! fault. [`ControlPlane`] runs a real etcd and kube-apiserver.
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

mod audit;
mod control;
mod hostile;
mod netns;
mod node;
pub mod plumbing;
pub mod procfs;
mod real;
mod webhook;

pub use tether_sim::{
    ApiServer, Fault, Kubeconfig, Options, Requests, Resource, Restart, Rotation, Stats,
    check_label_selector, parse_duration,
};

pub use crate::audit::{Watch, overlapping};
pub use crate::control::serve_control;
pub use crate::hostile::{FORGED_LINE, HostileServer, Hostility};
pub use crate::netns::TestHost;
pub use crate::node::{NODE_NAME, Node, PAUSE_IMAGE};
pub use crate::plumbing::{
    EVERY, free_port, fuzz_budget, http_get, median_max, poll, until, until_every,
};
pub use crate::real::{ControlPlane, RealOptions, SERVICE_IP, peer};
pub use crate::webhook::{Alert, AlertWebhook, Notification};

/// What can go wrong when running a peer for a test.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The simulated apiserver failed.
    #[error(transparent)]
    Sim(#[from] tether_sim::Error),
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
    /// The peer cannot do that in its configuration.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A file could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
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
