//! The admin server: `/metrics`, `/healthz`, `/readyz`, `/status` and
//! `/status.json`.
//!
//! Every handler reads state that is already computed: none waits on a
//! probe, a remote or the manager, so a hung remote can never make health
//! endpoints slow.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder as _, IntGauge, Opts, Registry, TextEncoder};
use serde::Serialize;
use tether_probes::ProbeSetHandle;
use tether_supervisor::SupervisorHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::election::ElectionHandle;
use crate::exec::ProcessHandle;
use crate::manager::ManagerHandle;

/// The state the admin server reads: it never reaches into a manager.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The supervisor's state, readiness (`manager_up`) included.
    pub supervisor: SupervisorHandle,
    /// The probes' state.
    pub probes: ProbeSetHandle,
    /// The manager's caches, for the status page.
    pub manager: ManagerHandle,
    /// The exec manager's process, when the manager is one.
    pub process: Option<ProcessHandle>,
    /// The leader election, when on.
    pub election: Option<ElectionHandle>,
    /// Set once at shutdown; never cleared.
    pub draining: Arc<AtomicBool>,
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

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ago(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs_f64())
}

/// An optional text, escaped, or a dash.
fn text(value: Option<&str>) -> String {
    value.map_or_else(|| "—".to_owned(), escape)
}

/// The leader election's table on `/status`.
fn write_election(html: &mut String, election: Option<&ElectionView>) {
    if let Some(e) = election {
        let _ = write!(
            html,
            "<h2>Leader election</h2><table>\
             <tr><th>role</th><td>{}</td></tr><tr><th>this replica</th><td>{}</td></tr>\
             <tr><th>holder</th><td>{}</td></tr><tr><th>lease</th><td>{}</td></tr>\
             <tr><th>last error</th><td>{}</td></tr></table>",
            e.role,
            escape(&e.identity),
            text(Some(e.holder.as_str()).filter(|h| !h.is_empty())),
            escape(&e.lease),
            text(e.last_error.as_deref()),
        );
    }
}

/// The exec manager's process's table on `/status`.
fn write_process(html: &mut String, process: Option<&ProcessView>) {
    if let Some(p) = process {
        let last = p.last_exit.as_deref().map(|how| {
            let by = if p.last_exit_stopped == Some(true) {
                "stopped by tether"
            } else {
                "ended by itself"
            };
            format!(
                "{how} ({by}, cycle {}, {} s ago)",
                p.last_exit_cycle.unwrap_or_default(),
                seconds(p.last_exit_seconds_ago)
            )
        });
        let _ = write!(
            html,
            "<h2>Manager process</h2><table>\
             <tr><th>command</th><td><code>{}</code></td></tr><tr><th>pid</th><td>{}</td></tr>\
             <tr><th>running (s)</th><td>{}</td></tr><tr><th>last exit</th><td>{}</td></tr>\
             <tr><th>spawn error</th><td>{}</td></tr></table>",
            escape(&p.command.join(" ")),
            p.pid.map_or_else(|| "—".to_owned(), |pid| pid.to_string()),
            seconds(p.running_seconds),
            text(last.as_deref()),
            text(p.spawn_error.as_deref()),
        );
    }
}

/// Seconds to two decimals, or a dash.
fn seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |s| format!("{s:.2}"))
}

/// The process as `/status.json` and `/status` show it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    /// tether's version.
    pub version: &'static str,
    /// Whether the drain latch is set.
    pub draining: bool,
    /// The supervisor.
    pub supervisor: SupervisorView,
    /// Every configured remote, by name.
    pub remotes: Vec<RemoteView>,
    /// The exec manager's process, when the manager is one.
    pub process: Option<ProcessView>,
    /// The leader election, when on.
    pub election: Option<ElectionView>,
}

/// The leader election, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ElectionView {
    /// `leader` or `standby`.
    pub role: &'static str,
    /// This replica's identity.
    pub identity: String,
    /// The holder last seen on the Lease; empty when free.
    pub holder: String,
    /// `namespace/name`.
    pub lease: String,
    /// Why the last try failed, if it did.
    pub last_error: Option<String>,
}

/// The exec manager's process, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessView {
    /// The command it runs.
    pub command: Vec<String>,
    /// The running process, if one runs.
    pub pid: Option<u32>,
    /// The cycle it runs in.
    pub cycle: u64,
    /// How long it has run.
    pub running_seconds: Option<f64>,
    /// How the last run ended: `exit code 1`, `killed by SIGKILL`.
    pub last_exit: Option<String>,
    /// Whether tether stopped the last run, rather than it ending by itself.
    pub last_exit_stopped: Option<bool>,
    /// The cycle of the last run.
    pub last_exit_cycle: Option<u64>,
    /// How long ago the last run ended.
    pub last_exit_seconds_ago: Option<f64>,
    /// Why the last spawn failed, until one succeeds.
    pub spawn_error: Option<String>,
}

/// The supervisor, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupervisorView {
    /// The current (or last) cycle.
    pub cycle: u64,
    /// Where the loop is.
    pub phase: String,
    /// How old the current cycle is.
    pub cycle_age_seconds: Option<f64>,
    /// Whether the manager is up: what `/readyz` answers, but for draining.
    pub manager_up: bool,
    /// Why the last cycle ended, with its detail.
    pub last_cause: Option<String>,
    /// The wait before the next build, while backing off.
    pub backoff_seconds: Option<f64>,
    /// Ended cycles by cause.
    pub ended: std::collections::BTreeMap<&'static str, u64>,
}

/// One remote, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteView {
    /// The configured name.
    pub name: String,
    /// `host:port`.
    pub host: String,
    /// Whether it gates readiness, and its loss ends the cycle.
    pub required: bool,
    /// Whether its part of the current cycle is stopped until it is back.
    pub stopped_in_cycle: bool,
    /// `unknown`, `reachable` or `unreachable`.
    pub state: &'static str,
    /// The current failure streak.
    pub consecutive_failures: u32,
    /// The status of the last answer.
    pub last_status: Option<u16>,
    /// Whether the last answer was 2xx.
    pub ready: bool,
    /// The class of the last failure.
    pub last_cause: Option<&'static str>,
    /// The root cause of the last failure.
    pub last_error: Option<String>,
    /// Why probes cannot be made from here, while they cannot.
    pub local_error: Option<String>,
    /// Seconds since the state last changed.
    pub last_transition_seconds_ago: Option<f64>,
    /// Seconds since the last probe finished.
    pub last_probe_seconds_ago: Option<f64>,
    /// The last probe's latency.
    pub latency_seconds: Option<f64>,
    /// The manager's caches of this remote.
    pub caches: Vec<CacheView>,
}

/// One cache of the manager, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheView {
    /// `configmaps`, `deployments.apps`, ...
    pub resource: String,
    /// Whether it has listed in this run of its remote.
    pub synced: bool,
    /// Whether its watch has failed for longer than the detection bound.
    pub stale: bool,
    /// Seconds since its watch began failing, while it is.
    pub failing_seconds_ago: Option<f64>,
    /// Objects in it.
    pub objects: usize,
}

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
        let supervisor = self.sources.supervisor.status().heartbeat.elapsed();
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

    /// Readiness: not draining, and the manager up, which the manager
    /// decides (every required remote's caches synced and current). Also
    /// sets `tether_ready`.
    #[must_use]
    pub fn readyz(&self) -> (u16, String) {
        let draining = self.sources.draining.load(Ordering::SeqCst);
        let status = self.sources.supervisor.status();
        // A follower is healthy and ready to take over: ready, standing by.
        let standby = self
            .sources
            .election
            .as_ref()
            .map(ElectionHandle::state)
            .filter(|e| !e.leading);
        if let Some(election) = standby.filter(|_| !draining) {
            self.ready.set(1);
            let holder = if election.holder.is_empty() {
                "none yet".to_owned()
            } else {
                election.holder
            };
            return (
                200,
                format!("[+]not draining\n[+]standby (leader: {holder})\nreadyz check passed\n"),
            );
        }
        let ready = !draining && status.manager_up;
        let mark = |ok: bool| if ok { '+' } else { '-' };
        let verdict = if ready {
            "readyz check passed"
        } else {
            "readyz check failed"
        };
        self.ready.set(i64::from(ready));
        (
            if ready { 200 } else { 503 },
            format!(
                "[{}]not draining\n[{}]manager up (cycle {}, every required cache synced and current)\n{verdict}\n",
                mark(!draining),
                mark(status.manager_up),
                status.cycle,
            ),
        )
    }

    /// The state of the process, as `/status.json` and `/status` show it:
    /// one view, built once per request, in time linear in the remotes.
    #[must_use]
    pub fn status(&self) -> StatusView {
        let caches = self.sources.manager.caches();
        let required = self.sources.manager.required();
        let status = self.sources.supervisor.status();
        let remotes = self
            .sources
            .probes
            .status()
            .into_iter()
            .map(|remote| {
                // The caches are keyed by (remote, resource): one range each.
                let caches = caches
                    .range((remote.name.clone(), String::new())..)
                    .take_while(|((name, _), _)| *name == remote.name)
                    .map(|((_, resource), cache)| CacheView {
                        resource: resource.clone(),
                        synced: cache.synced,
                        stale: cache.stale,
                        failing_seconds_ago: ago(cache.failing_since),
                        objects: cache.objects,
                    })
                    .collect();
                RemoteView {
                    required: required.contains(&remote.name),
                    stopped_in_cycle: status.stopped_remotes.binary_search(&remote.name).is_ok(),
                    state: remote.state.as_str(),
                    consecutive_failures: remote.consecutive_failures,
                    last_status: remote.last_status,
                    ready: remote.ready,
                    last_cause: remote.last_cause.map(tether_probes::FailureCause::as_str),
                    last_transition_seconds_ago: ago(remote.last_transition),
                    last_probe_seconds_ago: ago(remote.last_probe),
                    latency_seconds: remote.latency.map(|l| l.as_secs_f64()),
                    caches,
                    name: remote.name,
                    host: remote.host,
                    last_error: remote.last_error,
                    local_error: remote.local_error,
                }
            })
            .collect();
        StatusView {
            version: env!("CARGO_PKG_VERSION"),
            draining: self.sources.draining.load(Ordering::SeqCst),
            supervisor: SupervisorView {
                cycle: status.cycle,
                phase: format!("{:?}", status.phase),
                cycle_age_seconds: status.cycle_started.map(|t| t.elapsed().as_secs_f64()),
                manager_up: status.manager_up,
                last_cause: status.last_cause.as_ref().map(ToString::to_string),
                backoff_seconds: status.backoff.map(|b| b.as_secs_f64()),
                ended: status
                    .ended
                    .iter()
                    .map(|(kind, count)| (kind.as_str(), *count))
                    .collect(),
            },
            remotes,
            election: self.sources.election.as_ref().map(|election| {
                let state = election.state();
                ElectionView {
                    role: if state.leading { "leader" } else { "standby" },
                    identity: state.identity,
                    holder: state.holder,
                    lease: state.lease,
                    last_error: state.last_error,
                }
            }),
            process: self.sources.process.as_ref().map(|process| {
                let state = process.state();
                let last = state.last_exit.as_ref();
                ProcessView {
                    command: process.spec().command.clone(),
                    pid: state.pid,
                    cycle: state.cycle,
                    running_seconds: ago(state.started),
                    last_exit: last.map(|e| e.how.to_string()),
                    last_exit_stopped: last.map(|e| e.stopped),
                    last_exit_cycle: last.map(|e| e.cycle),
                    last_exit_seconds_ago: ago(last.map(|e| e.at)),
                    spawn_error: state.spawn_error,
                }
            }),
        }
    }

    /// `/status` as a page a person reads after `kubectl port-forward`.
    #[must_use]
    pub fn status_html(&self) -> String {
        let status = self.status();
        let s = &status.supervisor;
        let mut html = String::from(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>tether status</title><style>\
             body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}\
             td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}\
             .reachable{color:#060}.unreachable{color:#b00;font-weight:bold}.unknown{color:#777}\
             </style></head><body>",
        );
        let _ = write!(
            html,
            "<h1>tether {}</h1><h2>Supervisor</h2><table>\
             <tr><th>cycle</th><td>{}</td></tr><tr><th>phase</th><td>{}</td></tr>\
             <tr><th>cycle age (s)</th><td>{}</td></tr><tr><th>manager up</th><td>{}</td></tr>\
             <tr><th>last cause</th><td>{}</td></tr><tr><th>backoff (s)</th><td>{}</td></tr>\
             <tr><th>draining</th><td>{}</td></tr></table>",
            status.version,
            s.cycle,
            escape(&s.phase),
            seconds(s.cycle_age_seconds),
            s.manager_up,
            text(s.last_cause.as_deref()),
            seconds(s.backoff_seconds),
            status.draining,
        );
        write_election(&mut html, status.election.as_ref());
        write_process(&mut html, status.process.as_ref());
        html.push_str(
            "<h2>Remotes</h2><table><tr><th>remote</th><th>host</th><th>gates readiness</th><th>state</th><th>failures</th>\
             <th>last cause</th><th>last error</th><th>local error</th><th>last transition (s ago)</th><th>latency (s)</th>\
             <th>caches</th></tr>",
        );
        for remote in &status.remotes {
            let mut caches = String::new();
            if remote.stopped_in_cycle {
                caches.push_str("stopped until the remote is back<br>");
            }
            for (i, cache) in remote.caches.iter().enumerate() {
                let how = match (cache.synced, cache.stale) {
                    (_, true) => "stale: its watch keeps failing",
                    (true, false) => "synced",
                    (false, false) => "not synced",
                };
                let _ = write!(
                    caches,
                    "{}{}: {how} ({} objects)",
                    if i > 0 { "<br>" } else { "" },
                    escape(&cache.resource),
                    cache.objects
                );
            }
            let required = if remote.required {
                "required"
            } else {
                "optional"
            };
            let state = remote.state;
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{required}</td><td class=\"{state}\">{state}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{caches}</td></tr>",
                escape(&remote.name),
                escape(&remote.host),
                remote.consecutive_failures,
                text(remote.last_cause),
                text(remote.last_error.as_deref()),
                text(remote.local_error.as_deref()),
                seconds(remote.last_transition_seconds_ago),
                seconds(remote.latency_seconds),
            );
        }
        html.push_str("</table><p><a href=\"/metrics\">/metrics</a> · <a href=\"/status.json\">/status.json</a> · <a href=\"/readyz\">/readyz</a> · <a href=\"/healthz\">/healthz</a></p></body></html>\n");
        html
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

    fn respond(&self, method: &Method, path: &str) -> Response<Body> {
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
                self.status_html().into_bytes(),
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

/// The admin server's listener, and a file descriptor held in reserve for
/// it, taken before anything else can use them up.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    spare: Option<std::fs::File>,
}

impl Listener {
    /// The address it listens on.
    ///
    /// # Errors
    ///
    /// As `TcpListener::local_addr`.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// Binds the admin address, and reserves a descriptor for it.
///
/// # Errors
///
/// The bind error, for the caller to report with the address and exit.
pub async fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
    Ok(Listener {
        tcp: TcpListener::bind(addr).await?,
        spare: reserve(),
    })
}

/// The most admin connections open at once. A new one beyond it closes
/// the oldest, so idle connections from outside can neither run tether out
/// of descriptors nor lock the kubelet out of `/healthz`.
pub const MAX_CONNECTIONS: usize = 32;

/// How long a connection may take to send a request's head, waiting for
/// the next one on an idle kept-alive connection included.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest the accept loop waits after an accept fails (out of
/// descriptors, say) before it tries again; the wait starts at 10 ms and
/// doubles.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// The descriptor held in reserve for the admin server, while it is.
type Spare = Arc<std::sync::Mutex<Option<std::fs::File>>>;

/// Opens a descriptor to hold in reserve.
fn reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Closes the reserved descriptor, if there is one to give up.
fn give_up(spare: &Spare) -> bool {
    crate::lock(spare).take().is_some()
}

/// Reserves a descriptor again, if none is.
fn take_back(spare: &Spare) {
    let mut spare = crate::lock(spare);
    if spare.is_none() {
        *spare = reserve();
    }
}

/// The open connections, oldest first, each with what closes it.
type Open = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>>;

fn open_lock(
    open: &Open,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, CancellationToken)>> {
    // Critical sections only push and remove; a poisoned queue is whole.
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serves `admin` on `listener` until `stop`.
///
/// At most [`MAX_CONNECTIONS`] connections are open; a request head must
/// arrive within [`HEAD_TIMEOUT`]. An accept that fails backs off, up to a
/// second, instead of spinning.
///
/// # Cancellation safety
///
/// Cancel safe: dropping it stops accepting; open connections finish.
pub async fn serve(listener: Listener, admin: Arc<Admin>, stop: CancellationToken) {
    let Listener {
        tcp: listener,
        spare,
    } = listener;
    let open: Open = Arc::default();
    let mut next_id = 0u64;
    let mut backoff = Duration::ZERO;
    // A descriptor held in reserve: when the process has none left (its
    // remotes took them all), it is given up to accept one admin connection,
    // so `/healthz` still answers, and that connection takes it back as it
    // closes, before anything else can.
    let spare: Spare = Arc::new(std::sync::Mutex::new(spare));
    loop {
        take_back(&spare);
        let mut reserved = false;
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::ZERO;
                    stream
                }
                Err(err) if tether_probes::out_of_descriptors(&err) && give_up(&spare) => {
                    debug!("admin accept: out of descriptors; using the reserved one");
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            reserved = true;
                            stream
                        }
                        Err(err) => {
                            debug!(error = %err, "admin accept failed even with the reserved descriptor");
                            take_back(&spare);
                            continue;
                        }
                    }
                }
                Err(err) => {
                    if backoff.is_zero() {
                        warn!(error = %err, "admin accept failed; backing off");
                    } else {
                        debug!(error = %err, ?backoff, "admin accept failed again");
                    }
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    continue;
                }
            },
        };
        let id = next_id;
        next_id += 1;
        let close = CancellationToken::new();
        {
            let mut open = open_lock(&open);
            if open.len() >= MAX_CONNECTIONS
                && let Some((_, oldest)) = open.pop_front()
            {
                oldest.cancel();
            }
            open.push_back((id, close.clone()));
        }
        let admin = Arc::clone(&admin);
        let open = Arc::clone(&open);
        let spare = Arc::clone(&spare);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = admin.respond(req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT);
            let served = http.serve_connection(TokioIo::new(stream), service);
            // Dropping the connection closes its socket.
            tokio::select! {
                _ = served => {}
                () = close.cancelled() => debug!("admin connection closed: the oldest of too many"),
            }
            open_lock(&open).retain(|(open_id, _)| *open_id != id);
            if reserved {
                take_back(&spare);
            }
        });
    }
}
