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
use http::{Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder as _, IntGauge, Opts, Registry, TextEncoder};
use serde_json::{Value, json};
use tether_probes::ProbeSetHandle;
use tether_supervisor::SupervisorHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

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

    /// The state of the process, as `/status.json` shows it.
    #[must_use]
    pub fn status(&self) -> Value {
        let caches = self.sources.manager.caches();
        let required = self.sources.manager.required();
        let status = self.sources.supervisor.status();
        let remotes: Vec<Value> = self
            .sources
            .probes
            .status()
            .into_iter()
            .map(|remote| {
                // The caches are keyed by (remote, resource): one range each.
                let from = (remote.name.clone(), String::new());
                let remote_caches: Vec<Value> = caches
                    .range(from..)
                    .take_while(|((name, _), _)| *name == remote.name)
                    .map(|((_, resource), cache)| {
                        json!({
                            "resource": resource,
                            "synced": cache.synced,
                            "stale": cache.stale,
                            "failingSecondsAgo": ago(cache.failing_since),
                            "objects": cache.objects,
                        })
                    })
                    .collect();
                let stopped = status.stopped_remotes.binary_search(&remote.name).is_ok();
                json!({
                    "name": remote.name,
                    "host": remote.host,
                    "required": required.contains(&remote.name),
                    "stoppedInCycle": stopped,
                    "state": remote.state.as_str(),
                    "consecutiveFailures": remote.consecutive_failures,
                    "lastStatus": remote.last_status,
                    "ready": remote.ready,
                    "lastCause": remote.last_cause.map(tether_probes::FailureCause::as_str),
                    "lastError": remote.last_error,
                    "localError": remote.local_error,
                    "lastTransitionSecondsAgo": ago(remote.last_transition),
                    "lastProbeSecondsAgo": ago(remote.last_probe),
                    "latencySeconds": remote.latency.map(|l| l.as_secs_f64()),
                    "caches": remote_caches,
                })
            })
            .collect();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "draining": self.sources.draining.load(Ordering::SeqCst),
            "supervisor": {
                "cycle": status.cycle,
                "phase": format!("{:?}", status.phase),
                "cycleAgeSeconds": status.cycle_started.map(|t| t.elapsed().as_secs_f64()),
                "managerUp": status.manager_up,
                "lastCause": status.last_cause.as_ref().map(ToString::to_string),
                "backoffSeconds": status.backoff.map(|b| b.as_secs_f64()),
                "ended": status.ended.iter().map(|(k, v)| (k.as_str().to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
            },
            "remotes": remotes,
        })
    }

    /// `/status` as a page a person reads after `kubectl port-forward`.
    #[must_use]
    pub fn status_html(&self) -> String {
        let status = self.status();
        let s = &status["supervisor"];
        let text = |v: &Value| match v {
            Value::Null => "—".to_owned(),
            Value::String(s) => escape(s),
            Value::Number(n) => n.as_f64().map_or_else(
                || n.to_string(),
                |f| {
                    if f.fract() == 0.0 {
                        format!("{f:.0}")
                    } else {
                        format!("{f:.2}")
                    }
                },
            ),
            other => escape(&other.to_string()),
        };
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
            text(&status["version"]),
            text(&s["cycle"]),
            text(&s["phase"]),
            text(&s["cycleAgeSeconds"]),
            text(&s["managerUp"]),
            text(&s["lastCause"]),
            text(&s["backoffSeconds"]),
            text(&status["draining"]),
        );
        html.push_str(
            "<h2>Remotes</h2><table><tr><th>remote</th><th>host</th><th>gates readiness</th><th>state</th><th>failures</th>\
             <th>last cause</th><th>last error</th><th>last transition (s ago)</th><th>latency (s)</th>\
             <th>caches</th></tr>",
        );
        for remote in status["remotes"].as_array().into_iter().flatten() {
            let caches: Vec<String> = remote["caches"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let how = match (c["synced"] == true, c["stale"] == true) {
                        (_, true) => "stale: its watch keeps failing",
                        (true, false) => "synced",
                        (false, false) => "not synced",
                    };
                    format!(
                        "{}: {how} ({} objects)",
                        text(&c["resource"]),
                        text(&c["objects"])
                    )
                })
                .collect();
            let mut caches = caches.join("<br>");
            if remote["stoppedInCycle"] == true {
                caches.insert_str(0, "stopped until the remote is back<br>");
            }
            let required = if remote["required"] == true {
                "required"
            } else {
                "optional"
            };
            let state = remote["state"].as_str().unwrap_or("unknown");
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td><td>{required}</td><td class=\"{state}\">{state}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{caches}</td></tr>",
                text(&remote["name"]),
                text(&remote["host"]),
                text(&remote["consecutiveFailures"]),
                text(&remote["lastCause"]),
                text(&remote["lastError"]),
                text(&remote["lastTransitionSecondsAgo"]),
                text(&remote["latencySeconds"]),
            );
        }
        html.push_str("</table><p><a href=\"/metrics\">/metrics</a> · <a href=\"/status.json\">/status.json</a> · <a href=\"/readyz\">/readyz</a> · <a href=\"/healthz\">/healthz</a></p></body></html>\n");
        html
    }

    fn metrics(&self) -> Result<Vec<u8>, prometheus::Error> {
        // tether_ready reflects the state now, scraped or not.
        let _ = self.readyz();
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(out)
    }

    fn respond(&self, path: &str) -> Response<Full<Bytes>> {
        let (code, content_type, body): (u16, &str, Vec<u8>) = match path {
            "/healthz" | "/livez" => {
                let (code, text) = self.healthz();
                (code, "text/plain; charset=utf-8", text.into_bytes())
            }
            "/readyz" => {
                let (code, text) = self.readyz();
                (code, "text/plain; charset=utf-8", text.into_bytes())
            }
            "/metrics" => match self.metrics() {
                Ok(body) => (200, "text/plain; version=0.0.4; charset=utf-8", body),
                Err(err) => (
                    500,
                    "text/plain; charset=utf-8",
                    format!("encoding metrics failed: {err}\n").into_bytes(),
                ),
            },
            "/status.json" => (
                200,
                "application/json",
                self.status().to_string().into_bytes(),
            ),
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
            .body(Full::new(Bytes::from(body)))
            .expect("a valid status and static headers")
    }
}

/// Binds the admin address.
///
/// # Errors
///
/// The bind error, for the caller to report with the address and exit.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `admin` on `listener` until `stop`.
///
/// # Cancellation safety
///
/// Cancel safe: dropping it stops accepting; open connections finish.
pub async fn serve(listener: TcpListener, admin: Arc<Admin>, stop: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    debug!(error = %err, "admin accept failed");
                    continue;
                }
            },
        };
        let admin = Arc::clone(&admin);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = admin.respond(req.uri().path());
                async move { Ok::<_, Infallible>(response) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new());
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
