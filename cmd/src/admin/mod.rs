//! The admin server: `/metrics`, `/healthz`, `/readyz`, `/status` and
//! `/status.json`.
//!
//! - `readiness.rs`: whether this replica is ready, decided once from a
//!   [`Snapshot`];
//! - `view.rs`: the one status view model, the verdict included;
//! - `page.rs`: that view as the `/status` page;
//! - `server.rs`: the socket, its limits and its reserved descriptor.
//!
//! The admin server holds no handle to the supervisor, the Leases or
//! discovery: for each request the daemon assembles a [`Snapshot`] of them,
//! readiness included, as linkerd's admin is handed a latch. It reads the
//! probes and the manager through their own narrow views. Every handler
//! reads state that is already computed: none waits on a probe, a remote or
//! the manager, so a hung remote can never make health endpoints slow.

mod page;
mod readiness;
mod server;
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, Uri, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use prometheus::{Encoder as _, IntGauge, Opts, Registry, TextEncoder};
use tether_probes::ProbeSetHandle;
use tether_supervisor::Status;

pub use self::page::{ATTENTION_SHOWN, HEALTHY_SHOWN, Query, REFRESH};
pub use self::readiness::Readiness;
pub use self::server::{HEAD_TIMEOUT, Listener, MAX_CONNECTIONS, bind, serve};
pub use self::view::{
    Attention, CacheView, Counts, CycleView, DiscoveryView, ElectionView, ProcessView, RemoteView,
    Role, ShardView, SkippedView, SourceView, StatusView, SupervisorView, Verdict, VerdictState,
    ago,
};

/// What the admin server shows of the manager, whichever it is: the
/// daemon hands it the manager's handle behind this.
pub trait ManagerStatus: std::fmt::Debug + Send + Sync {
    /// The names of the required remotes.
    fn required(&self) -> BTreeSet<String>;
    /// The caches by `(remote, resource)`; none for a manager without.
    fn caches(&self) -> BTreeMap<(String, String), CacheView>;
    /// The process, when the manager is one.
    fn process(&self) -> Option<ProcessView>;
}

/// One look at the process's parts, as the daemon assembles it for a
/// request, with the readiness they make.
#[derive(Debug)]
pub struct Snapshot {
    /// The supervisor's state, `manager_up` included.
    pub supervisor: Status,
    /// Whether tether is shutting down.
    pub draining: bool,
    /// The leader election, when on.
    pub election: Option<ElectionView>,
    /// This replica's share of the remotes, when sharding is on.
    pub shard: Option<ShardView>,
    /// Discovery from the home cluster's Secrets, when on.
    pub discovery: Option<DiscoveryView>,
    readiness: Readiness,
}

impl Snapshot {
    /// The snapshot of these parts; readiness is decided here, once.
    #[must_use]
    pub fn new(
        supervisor: Status,
        draining: bool,
        election: Option<ElectionView>,
        shard: Option<ShardView>,
        discovery: Option<DiscoveryView>,
    ) -> Self {
        let readiness = Readiness::of(
            draining,
            election.as_ref(),
            shard.as_ref(),
            supervisor.manager_up,
        );
        Self {
            supervisor,
            draining,
            election,
            shard,
            discovery,
            readiness,
        }
    }

    /// Whether this replica is ready, and which way.
    #[must_use]
    pub const fn readiness(&self) -> Readiness {
        self.readiness
    }
}

/// Where the admin server gets a [`Snapshot`]: the daemon, which holds the
/// handles.
pub trait Snapshots: std::fmt::Debug + Send + Sync {
    /// The parts as they are now.
    fn snapshot(&self) -> Snapshot;
    /// When the supervisor's loop last beat, for `/healthz` alone: cheaper
    /// than a whole snapshot.
    fn supervisor_heartbeat(&self) -> tokio::time::Instant;
}

/// The state the admin server reads: it never reaches into a manager, the
/// supervisor or the Leases.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The rest of the process, assembled by the daemon for each request.
    pub parts: Arc<dyn Snapshots>,
    /// The probes' state, one row a remote.
    pub probes: ProbeSetHandle,
    /// The manager, as the status page shows it.
    pub manager: Arc<dyn ManagerStatus>,
}

/// How often each loop beats: `/healthz` fails when one is three behind.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeats {
    /// The probe interval.
    pub probes: Duration,
    /// The supervisor's heartbeat interval.
    pub supervisor: Duration,
}

/// Everything the admin server reads.
#[derive(Debug)]
pub struct Admin {
    /// The process registry.
    pub registry: Registry,
    /// What it shows.
    pub sources: Sources,
    /// What counts as wedged.
    pub heartbeats: Heartbeats,
    ready: IntGauge,
}

/// How many intervals a heartbeat may lag before `/healthz` fails.
const WEDGED_AFTER: u32 = 3;

impl Admin {
    /// The admin state; registers `tether_ready` and `tether_build_info`.
    ///
    /// # Errors
    ///
    /// If those metric names are taken.
    pub fn new(
        registry: Registry,
        sources: Sources,
        heartbeats: Heartbeats,
    ) -> prometheus::Result<Self> {
        let ready =
            IntGauge::with_opts(Opts::new("tether_ready", "What /readyz answers, as 1/0."))?;
        registry.register(Box::new(ready.clone()))?;
        let build = IntGauge::with_opts(
            Opts::new("tether_build_info", "Always 1; the version is a label.")
                .const_label("version", env!("CARGO_PKG_VERSION")),
        )?;
        build.set(1);
        registry.register(Box::new(build))?;
        Ok(Self {
            registry,
            sources,
            heartbeats,
            ready,
        })
    }

    /// Liveness: the process's own loops are beating. Never looks at a
    /// remote.
    #[must_use]
    pub fn healthz(&self) -> (u16, String) {
        let mut failures = Vec::new();
        let supervisor = self.sources.parts.supervisor_heartbeat().elapsed();
        if supervisor > self.heartbeats.supervisor * WEDGED_AFTER {
            failures.push(format!(
                "[-]supervisor: last heartbeat {supervisor:.1?} ago"
            ));
        }
        let probes = self.sources.probes.heartbeat().elapsed();
        if probes > self.heartbeats.probes * WEDGED_AFTER {
            failures.push(format!("[-]probes: oldest probe tick {probes:.1?} ago"));
        }
        if failures.is_empty() {
            (200, "ok\n".to_owned())
        } else {
            (
                500,
                format!("{}\nhealthz check failed\n", failures.join("\n")),
            )
        }
    }

    /// Readiness, as [`Readiness`] decides it: `/readyz`'s status and
    /// body. Also sets `tether_ready`.
    #[must_use]
    pub fn readyz(&self) -> (u16, String) {
        let parts = self.sources.parts.snapshot();
        let readiness = parts.readiness();
        self.ready.set(i64::from(readiness.is_ready()));
        readiness.readyz(
            parts.election.as_ref(),
            parts.shard.as_ref(),
            parts.supervisor.cycle,
        )
    }

    /// The state of the process, as `/status.json` and `/status` show it:
    /// one view, built once per request, in time linear in the remotes.
    #[must_use]
    pub fn status(&self) -> StatusView {
        view::build(&self.sources, self.sources.parts.snapshot())
    }

    /// `/status` as a page a person reads after `kubectl port-forward`.
    #[must_use]
    pub fn status_html(&self, query: &Query) -> String {
        let recent = |name: &str| self.sources.probes.recent(name).unwrap_or_default();
        page::render(&self.status(), query, &recent)
    }

    /// `/status.json`'s body.
    ///
    /// # Panics
    ///
    /// Never: `serde_json` fails only on a map with keys that are not
    /// strings, and the view has none.
    #[must_use]
    pub fn status_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.status()).expect("the view's map keys are strings")
    }

    /// `/metrics`: the registry's families, then the probes' per-remote
    /// series, made a piece at a time as the connection takes them.
    fn metrics(&self) -> Result<Body, prometheus::Error> {
        // tether_ready reflects the state now, scraped or not.
        let _ = self.readyz();
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        let pieces = std::iter::once(out)
            .chain(self.sources.probes.metric_chunks())
            .map(|piece| Ok(Frame::data(Bytes::from(piece))));
        Ok(StreamBody::new(futures_util::stream::iter(pieces)).boxed())
    }

    fn respond(&self, method: &Method, uri: &Uri) -> Response<Body> {
        let path = uri.path();
        // Every endpoint only reads.
        if method != Method::GET && method != Method::HEAD {
            return Response::builder()
                .status(405)
                .header(header::ALLOW, "GET, HEAD")
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full(Bytes::from_static(
                    b"method not allowed: the admin endpoints are read-only\n",
                )))
                .expect("a valid status and static headers");
        }
        if path == "/metrics" {
            let (code, content_type, body) = match self.metrics() {
                Ok(body) => (200, "text/plain; version=0.0.4; charset=utf-8", body),
                Err(err) => (
                    500,
                    "text/plain; charset=utf-8",
                    full(format!("encoding metrics failed: {err}\n").into()),
                ),
            };
            return Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, content_type)
                .body(body)
                .expect("a valid status and static headers");
        }
        let (code, content_type, body): (u16, &str, Vec<u8>) = match path {
            "/healthz" | "/livez" => {
                let (code, text) = self.healthz();
                (code, "text/plain; charset=utf-8", text.into_bytes())
            }
            "/readyz" => {
                let (code, text) = self.readyz();
                (code, "text/plain; charset=utf-8", text.into_bytes())
            }
            "/status.json" => (200, "application/json", self.status_json()),
            "/status" | "/" => (
                200,
                "text/html; charset=utf-8",
                self.status_html(&Query::parse(uri.query())).into_bytes(),
            ),
            _ => (
                404,
                "text/plain; charset=utf-8",
                b"not found; see /status\n".to_vec(),
            ),
        };
        Response::builder()
            .status(code)
            .header(header::CONTENT_TYPE, content_type)
            .body(full(Bytes::from(body)))
            .expect("a valid status and static headers")
    }
}

/// An admin response's body: whole, or made as it is sent.
type Body = BoxBody<Bytes, Infallible>;

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).boxed()
}
