//! Request handling: discovery, health, and get, list, watch, create, update
//! and delete of the served resources.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::proto::{self, Format, Payload};
use crate::resource::{
    api_group, api_group_list, api_resource_list, api_versions, openapi_v3_group_version,
    openapi_v3_root,
};
use crate::selector::Selector;
use crate::server::Shared;
use crate::status::ApiError;
use crate::store::{Event, WatchStart};
use crate::write::{WriteRequest, Written};
use crate::{Fault, Resource};

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// How long a watch without `timeoutSeconds` lives: the apiserver's
/// `--min-request-timeout` default (1800s).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body.to_string()))
        .expect("a status code from 100..600 and a static header are valid")
}

fn error_response(err: &ApiError) -> Response<Body> {
    json_response(err.code, &err.to_status())
}

fn text_response(code: u16, text: String) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(full(text))
        .expect("a status code from 100..600 and a static header are valid")
}

fn percent_decode(input: &str) -> String {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                if let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    out.push(byte);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_params(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn flag(params: &HashMap<String, String>, name: &str) -> bool {
    params.get(name).is_some_and(|v| v == "true" || v == "1")
}

/// Which objects a request addresses.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<group>/v1/...` resource paths.
fn parse_target(segments: &[&str]) -> Option<Target> {
    let (group, rest) = match segments {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, "v1", rest @ ..] => (*group, rest),
        _ => return None,
    };
    let target = |plural: &str, namespace: Option<&str>, name: Option<&str>| {
        let resource = Resource::from_path(group, plural)?;
        (resource.namespaced() || namespace.is_none()).then(|| Target {
            resource,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
        })
    };
    match rest {
        [plural] => target(plural, None, None),
        ["namespaces", namespace, plural] => target(plural, Some(namespace), None),
        ["namespaces", namespace, plural, name] => target(plural, Some(namespace), Some(name)),
        [plural, name] => target(plural, None, Some(name)),
        _ => None,
    }
}

fn is_health(path: &str) -> bool {
    matches!(path, "/readyz" | "/livez" | "/healthz")
}

/// Handles one request on a connection whose kill switch is `conn`.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    conn: CancellationToken,
    req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let params = query_params(req.uri().query());
    // Watches count apart from lists, so a test can tell a resume from a
    // re-list.
    let acting_as = req
        .headers()
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok());
    if flag(&params, "watch") {
        shared.count_request(&format!("{path}?watch"), acting_as);
    } else {
        shared.count_request(&path, acting_as);
    }

    match shared.fault() {
        Fault::Slow(delay) => tokio::time::sleep(delay).await,
        Fault::Flap(_) if path == "/readyz" && !shared.advance_flap() => {
            // This probe tick is "down": reset the connection under it.
            conn.cancel();
            return std::future::pending().await;
        }
        Fault::Status { code, all_paths } if all_paths || path == "/readyz" => {
            let reason = StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("Injected");
            return if path == "/readyz" {
                text_response(code, format!("injected fault: {code} {reason}\n"))
            } else {
                error_response(&ApiError::new(
                    code,
                    "InternalError",
                    format!("injected fault: {code} {reason}"),
                ))
            };
        }
        _ => {}
    }

    let public = shared.anonymous_health() && is_health(&path);
    if !public && !shared.authorized(req.headers()) {
        return error_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    }

    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["readyz" | "livez" | "healthz"]) => {
            health(&path, params.contains_key("verbose"))
        }
        (&Method::GET, ["version"]) => json_response(
            200,
            &json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0-tether-testkit",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
                "platform": "linux/amd64",
            }),
        ),
        (&Method::GET, ["api"]) => json_response(200, &api_versions()),
        (&Method::GET, ["api", version]) => discovery(api_resource_list("", version)),
        (&Method::GET, ["apis"]) => json_response(200, &api_group_list()),
        (&Method::GET, ["apis", group]) => discovery(api_group(group)),
        (&Method::GET, ["apis", group, version]) => discovery(api_resource_list(group, version)),
        (&Method::GET, ["openapi", "v3"]) => json_response(200, &openapi_v3_root()),
        (&Method::GET, ["openapi", "v3", rest @ ..]) => {
            discovery(openapi_v3_group_version(&rest.join("/")))
        }
        _ => match parse_target(&segments) {
            Some(target) => {
                let accept = req
                    .headers()
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let sends = req
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok());
                let format = Format::accepted(accept);
                if format == Some(Format::Protobuf)
                    || sends.is_some_and(|c| c.starts_with(proto::PROTOBUF))
                {
                    shared.protobuf_requests.fetch_add(1, Ordering::SeqCst);
                }
                let Some(format) = format else {
                    return error_response(&ApiError::new(
                        406,
                        "NotAcceptable",
                        "only the following media types are accepted: application/json, application/vnd.kubernetes.protobuf",
                    ));
                };
                resource_request(&shared, conn, format, target, &params, req)
                    .await
                    .unwrap_or_else(|err| {
                        respond(format, err.code, Payload::Status(&err.to_status()), &[])
                    })
            }
            None => error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        },
    }
}

fn health(path: &str, verbose: bool) -> Response<Body> {
    if !verbose {
        return text_response(200, "ok".to_owned());
    }
    let name = path.trim_start_matches('/');
    let checks = [
        "ping",
        "log",
        "etcd",
        "poststarthook/start-informers",
        "informer-sync",
    ];
    let mut text = String::new();
    for check in checks {
        writeln!(text, "[+]{check} ok").expect("writing to a String cannot fail");
    }
    writeln!(text, "{name} check passed").expect("writing to a String cannot fail");
    text_response(200, text)
}

fn discovery(body: Option<Value>) -> Response<Body> {
    body.map_or_else(
        || {
            error_response(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ))
        },
        |body| json_response(200, &body),
    )
}

/// The label, field and namespace filters of a list or watch.
struct Filter {
    namespace: Option<String>,
    labels: Selector,
    fields: Selector,
}

impl Filter {
    fn from_params(
        namespace: Option<String>,
        params: &HashMap<String, String>,
    ) -> Result<Self, ApiError> {
        let labels = Selector::parse_labels(params.get("labelSelector").map_or("", String::as_str))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields = Selector::parse_fields(params.get("fieldSelector").map_or("", String::as_str))
            .map_err(ApiError::bad_request)?;
        Ok(Self {
            namespace,
            labels,
            fields,
        })
    }

    fn matches(&self, object: &Value) -> bool {
        let in_namespace = self
            .namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns));
        in_namespace && self.labels.matches_labels(object) && self.fields.matches_fields(object)
    }
}

/// Answers with `payload` in `format`, with the `Warning` headers of
/// `warnings`.
fn respond(format: Format, code: u16, payload: Payload<'_>, warnings: &[String]) -> Response<Body> {
    let bytes = match payload.encode(format) {
        Ok(bytes) => bytes,
        Err(err) => return error_response(&err),
    };
    let mut response = Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, format.content_type());
    for warning in warnings {
        // A header value is visible ASCII; a field name may not be.
        let text: String = warning
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        let text = text.replace('\\', "\\\\").replace('"', "\\\"");
        response = response.header(header::WARNING, format!("299 - \"{text}\""));
    }
    response.body(full(bytes)).expect(
        "a status code from the API, a static content type and visible-ASCII warnings are valid",
    )
}

async fn resource_request(
    shared: &Arc<Shared>,
    conn: CancellationToken,
    format: Format,
    target: Target,
    params: &HashMap<String, String>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let Target {
        resource,
        namespace,
        name,
    } = target;
    let store = shared.store();
    let method = req.method().clone();
    let ns = namespace.clone().unwrap_or_default();
    if resource.namespaced()
        && namespace.is_some()
        && !store.namespace_exists(&ns)
        && method != Method::GET
    {
        return Err(ApiError::not_found(Resource::Namespace, &ns));
    }
    match (&method, name) {
        (&Method::GET, Some(name)) => store
            .get(resource, &ns, &name)
            .map(|object| respond(format, 200, Payload::Object(resource, &object), &[]))
            .ok_or_else(|| ApiError::not_found(resource, &name)),
        (&Method::GET, None) if flag(params, "watch") => {
            let filter = Filter::from_params(namespace, params)?;
            let acting_as = req
                .headers()
                .get("impersonate-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            watch(shared, conn, format, resource, filter, params, acting_as)
        }
        (&Method::GET, None) => {
            let filter = Filter::from_params(namespace, params)?;
            list(shared, format, resource, &filter, params)
        }
        (&Method::POST, None) if resource.writable() && namespace.is_some() => {
            let write = WriteRequest::read(store, resource, &ns, params, req).await?;
            Ok(written(format, resource, &write.create()?))
        }
        (&Method::PUT | &Method::PATCH | &Method::DELETE, Some(name)) if resource.writable() => {
            let write = WriteRequest::read(store, resource, &ns, params, req).await?;
            let done = match method {
                Method::PUT => write.update(&name),
                Method::PATCH => write.patch(&name),
                _ => write.delete(&name),
            }?;
            Ok(written(format, resource, &done))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )),
    }
}

fn written(format: Format, resource: Resource, done: &Written) -> Response<Body> {
    let payload = if done.object["kind"] == "Status" {
        Payload::Status(&done.object)
    } else {
        Payload::Object(resource, &done.object)
    };
    respond(format, done.code, payload, &done.warnings)
}

fn list(
    shared: &Shared,
    format: Format,
    resource: Resource,
    filter: &Filter,
    params: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let (list_rv, after) = match params.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (rv, after) = decode_continue(token)?;
            (Some(rv), Some(after))
        }
        None => (None, None),
    };
    let after_ref = after
        .as_ref()
        .map(|(ns, name)| (ns.as_str(), name.as_str()));
    let (items, rv) = shared
        .store()
        .list(resource, filter.namespace.as_deref(), after_ref);
    let mut items: Vec<Value> = items
        .into_iter()
        .filter(|o| filter.matches(o))
        .map(|mut o| {
            // A list's items carry no kind or apiVersion of their own.
            if let Some(map) = o.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            o
        })
        .collect();
    let rv = list_rv.unwrap_or(rv);
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = limit.filter(|l| items.len() > *l) {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let last = &items[limit - 1]["metadata"];
        let token = encode_continue(
            rv,
            last["namespace"].as_str().unwrap_or(""),
            last["name"].as_str().unwrap_or(""),
        );
        metadata["continue"] = Value::from(token);
        metadata["remainingItemCount"] = Value::from(remaining);
    }
    let list = json!({
        "kind": format!("{}List", resource.kind()),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    });
    Ok(respond(format, 200, Payload::List(resource, &list), &[]))
}

fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{rv}\n{namespace}\n{name}"))
}

/// A continue token: the list's version, and the key of the last object
/// returned.
type Continue = (u64, (String, String));

fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let text = URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let namespace = parts.next().ok_or_else(bad)?.to_owned();
    let name = parts.next().ok_or_else(bad)?.to_owned();
    Ok((rv, (namespace, name)))
}

/// Counts a watch as open for as long as it lives, in all and by the user
/// its client acts as, if any.
struct OpenWatch(Arc<Shared>, Option<String>);

impl OpenWatch {
    fn open(shared: &Arc<Shared>, acting_as: Option<String>) -> Self {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        if let Some(user) = &acting_as {
            *crate::server::lock(&shared.watches_as)
                .entry(user.clone())
                .or_default() += 1;
        }
        Self(Arc::clone(shared), acting_as)
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
        if let Some(user) = &self.1 {
            let mut by = crate::server::lock(&self.0.watches_as);
            if let Some(open) = by.get_mut(user) {
                *open -= 1;
                if *open == 0 {
                    by.remove(user);
                }
            }
        }
    }
}

fn bookmark(resource: Resource, rv: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({
        "kind": resource.kind(),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
    })
}

fn watch(
    shared: &Arc<Shared>,
    conn: CancellationToken,
    format: Format,
    resource: Resource,
    filter: Filter,
    params: &HashMap<String, String>,
    acting_as: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let send_initial = flag(params, "sendInitialEvents");
    let bookmarks = flag(params, "allowWatchBookmarks");
    let from = match params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(_) if send_initial => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);

    let (tx, rx) = mpsc::channel::<Bytes>(64);
    match shared.store().watch(resource, from) {
        // As the apiserver does: a 200 whose one event is the 410 Status.
        Err(expired) => {
            let event = proto::watch_event(format, "ERROR", Payload::Status(&expired.to_status()))?;
            tx.try_send(event)
                .expect("a fresh channel has room for one event");
        }
        Ok(start) => {
            let open = OpenWatch::open(shared, acting_as);
            if format == Format::Protobuf {
                shared.protobuf_watches.fetch_add(1, Ordering::SeqCst);
            }
            let stream = WatchStream {
                tx,
                format,
                resource,
                filter,
                seen: start.rv,
                send_initial,
                bookmark_every: bookmarks.then(|| shared.bookmark_interval()),
                timeout,
                conn,
                cut: shared.watch_cut(),
                _open: open,
            };
            tokio::spawn(stream.run(start));
        }
    }
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok(Frame::data(line)), rx))
    }));
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, format.watch_content_type())
        .body(body.boxed_unsync())
        .expect("static headers are valid"))
}

/// One open watch: it writes event lines into the response body's channel
/// until the client leaves, the timeout passes, or the connection is killed.
struct WatchStream {
    tx: mpsc::Sender<Bytes>,
    format: Format,
    resource: Resource,
    filter: Filter,
    /// The highest version this watch has passed, sent or not: what a
    /// bookmark may promise.
    seen: u64,
    send_initial: bool,
    bookmark_every: Option<Duration>,
    timeout: Duration,
    conn: CancellationToken,
    /// Cut under `refuse_new`: the watch's connection is reset.
    cut: CancellationToken,
    _open: OpenWatch,
}

impl WatchStream {
    /// Frames one event; `None` if it cannot be encoded (never for what the
    /// store holds), which ends the stream.
    fn frame(&self, kind: &str, object: &Value) -> Option<Bytes> {
        proto::watch_event(self.format, kind, Payload::Object(self.resource, object)).ok()
    }

    async fn send(&self, kind: &str, object: &Value) -> bool {
        match self.frame(kind, object) {
            Some(frame) => self.tx.send(frame).await.is_ok(),
            None => false,
        }
    }

    async fn run(mut self, start: WatchStart) {
        for event in &start.backlog {
            self.seen = self.seen.max(event.rv);
            if self.filter.matches(&event.object)
                && !self.send(event.kind.as_str(), &event.object).await
            {
                return;
            }
        }
        if self.send_initial
            && !self
                .send("BOOKMARK", &bookmark(self.resource, self.seen, true))
                .await
        {
            return;
        }
        self.stream_live(start.live).await;
    }

    async fn stream_live(mut self, mut live: broadcast::Receiver<Arc<Event>>) {
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        let mut ticks =
            tokio::time::interval(self.bookmark_every.unwrap_or(Duration::from_secs(3600)));
        ticks.reset();
        loop {
            let chunk = tokio::select! {
                () = self.conn.cancelled() => return,
                () = self.cut.cancelled() => {
                    self.conn.cancel();
                    return;
                }
                () = &mut deadline => return,
                () = self.tx.closed() => return,
                _ = ticks.tick(), if self.bookmark_every.is_some() => {
                    self.frame("BOOKMARK", &bookmark(self.resource, self.seen, false))
                }
                event = live.recv() => match event {
                    Ok(event) => {
                        if event.rv <= self.seen {
                            continue;
                        }
                        self.seen = event.rv;
                        if event.resource != self.resource || !self.filter.matches(&event.object) {
                            continue;
                        }
                        self.frame(event.kind.as_str(), &event.object)
                    }
                    // Fell behind, or the server is going away: end the
                    // stream and let the client re-watch, as the apiserver
                    // does.
                    Err(_) => return,
                },
            };
            let Some(chunk) = chunk else { return };
            if self.tx.send(chunk).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths_parse_like_the_apiserver_routes() {
        let t = |p: &str| parse_target(&p.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>());
        assert_eq!(
            t("/api/v1/namespaces"),
            Some(Target {
                resource: Resource::Namespace,
                namespace: None,
                name: None
            })
        );
        assert_eq!(
            t("/api/v1/namespaces/default"),
            Some(Target {
                resource: Resource::Namespace,
                namespace: None,
                name: Some("default".into())
            })
        );
        assert_eq!(
            t("/api/v1/configmaps"),
            Some(Target {
                resource: Resource::ConfigMap,
                namespace: None,
                name: None
            })
        );
        assert_eq!(
            t("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"),
            Some(Target {
                resource: Resource::Lease,
                namespace: Some("kube-system".into()),
                name: Some("x".into())
            })
        );
        assert_eq!(t("/api/v1/namespaces/default/namespaces"), None);
        assert_eq!(t("/api/v1/pods"), None);
    }

    #[test]
    fn continue_tokens_round_trip() {
        let token = encode_continue(42, "default", "b");
        assert_eq!(
            decode_continue(&token).expect("valid"),
            (42, ("default".into(), "b".into()))
        );
        assert!(decode_continue("garbage!").is_err());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        let params = query_params(Some("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=true"));
        assert_eq!(params["labelSelector"], "app=web,tier in (a)");
        assert!(flag(&params, "watch"));
    }
}
