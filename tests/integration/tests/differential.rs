//! The simulated apiserver judged by the real one: the same requests, in the
//! same order, to both, and what comes back compared: the status code, the
//! `Status` reason, the media type, the `Warning` header, and the object
//! with `uid`, `resourceVersion` values and timestamps masked.
//!
//! The requests are the verbs and content types that tether, kubectl, the
//! Python client and client-go use in these tests. Where the two still
//! differ, the difference is in [`KNOWN`], each with why it cannot matter to
//! a test; `docs/testkit.md` has the same list. A new difference fails the
//! test, and so does a listed one that went away.
//!
//! The TLS 1.3 suite each picks for a client set up as tether's probes are
//! is compared too: it is most of what a probe's record costs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{client_for, config_for};
use http_body_util::BodyExt as _;
use kube::Client;
use kube::client::ConfigExt as _;
use prost::Message as _;
use serde_json::{Value, json};
use tether_testkit::{ApiServer, Cluster, ControlPlane, Options, RealOptions};

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const CM: &str = "/api/v1/namespaces/default/configmaps";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";

/// The differences that remain, by case and field, with why each cannot
/// matter to tether's tests.
const KNOWN: &[(&str, &str, &str)] = &[];

/// One request.
struct Request {
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    accept: Option<&'static str>,
    body: Option<Vec<u8>>,
}

fn get(path: impl Into<String>) -> Request {
    Request {
        method: "GET",
        path: path.into(),
        content_type: None,
        accept: None,
        body: None,
    }
}

fn with_body(
    method: &'static str,
    path: impl Into<String>,
    content_type: &'static str,
    body: &Value,
) -> Request {
    let body = if content_type == APPLY {
        // YAML is a superset of JSON: apply bodies go as JSON text.
        body.to_string().into_bytes()
    } else {
        serde_json::to_vec(body).expect("JSON")
    };
    Request {
        method,
        path: path.into(),
        content_type: Some(content_type),
        accept: None,
        body: Some(body),
    }
}

/// A Lease held by `holder`, as client-go's `LeaseLock` writes it; with
/// `resource_version`, an update that carries it.
fn lease(name: &str, holder: &str, resource_version: Option<&str>) -> Value {
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "acquireTime": "2026-12-01T10:00:00.000000Z", "renewTime": "2026-12-01T10:00:05.123456Z",
                 "leaseTransitions": u8::from(holder != "a")},
    });
    if let Some(rv) = resource_version {
        lease["metadata"]["resourceVersion"] = json!(rv);
    }
    lease
}

/// A server-side apply of the ConfigMap `name` with `value`, as `manager`.
fn apply(name: &str, manager: &str, value: &str, force: bool) -> Request {
    let force = if force { "&force=true" } else { "" };
    with_body(
        "PATCH",
        format!("{CM}/{name}?fieldManager={manager}{force}"),
        APPLY,
        &configmap(name, value),
    )
}

fn configmap(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": value}})
}

/// What came back, reduced to what is compared.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    code: u16,
    media_type: String,
    warning: bool,
    reason: Option<String>,
    /// The body, masked; for a watch, its events; for protobuf, the
    /// envelope's kind.
    body: Value,
    /// The object's `resourceVersion` before masking, for the next step of
    /// a case; never compared.
    rv: Option<u64>,
}

/// Values the two cannot share: identities, versions and times.
fn mask(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                // A Status message names the server's own versions and
                // wording; the reason and code are what clients read.
                match key.as_str() {
                    "uid" | "resourceVersion" | "creationTimestamp" | "time" | "renewTime"
                    | "acquireTime" | "continue" | "message" => *v = json!("<masked>"),
                    _ => mask(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

async fn send(client: &Client, request: &Request) -> Answer {
    let mut builder = http::Request::builder()
        .method(request.method)
        .uri(&request.path);
    if let Some(content_type) = request.content_type {
        builder = builder.header("Content-Type", content_type);
    }
    if let Some(accept) = request.accept {
        builder = builder.header("Accept", accept);
    }
    let http_request = builder
        .body(request.body.clone().unwrap_or_default())
        .expect("a request");
    let response = tokio::time::timeout(
        Duration::from_secs(20),
        client.send(http_request.map(Into::into)),
    )
    .await
    .expect("answered in time")
    .expect("an answer");
    let code = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let media_type = header("content-type")
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let warning = header("warning").is_some();
    let bytes = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the body ends in time")
        .expect("a body")
        .to_bytes();
    let watch = request.path.contains("watch=");
    let mut body = if media_type == PROTOBUF {
        let envelope = bytes.strip_prefix(b"k8s\0").expect("the protobuf magic");
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(envelope)
            .expect("a runtime.Unknown");
        let meta = unknown.type_meta.unwrap_or_default();
        json!({"apiVersion": meta.api_version, "kind": meta.kind})
    } else if watch {
        Value::Array(
            String::from_utf8_lossy(&bytes)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    let event: Value = serde_json::from_str(l).expect("a watch event");
                    let object = &event["object"];
                    json!({
                        "type": event["type"],
                        "name": object["metadata"]["name"],
                        "code": object["code"],
                        "reason": object["reason"],
                        "initialEventsEnd": object["metadata"]["annotations"]["k8s.io/initial-events-end"],
                    })
                })
                .collect(),
        )
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes)))
    };
    let reason = (body["kind"] == "Status")
        .then(|| body["reason"].as_str().map(str::to_owned))
        .flatten();
    let rv = body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok());
    mask(&mut body);
    Answer {
        code,
        media_type,
        warning,
        reason,
        body,
        rv,
    }
}

/// The cases, each a list of requests whose last answer is compared (the
/// ones before set it up and are compared too). `{rv}` in a path is the
/// `resourceVersion` of the previous answer's object.
// A table: one entry a case.
#[allow(clippy::too_many_lines)]
fn cases() -> Vec<(&'static str, Vec<Request>)> {
    let cm = |name: &str| format!("{CM}/{name}");
    vec![
        ("get a missing object", vec![get(cm("none"))]),
        (
            "create",
            vec![with_body("POST", CM, JSON, &configmap("created", "1"))],
        ),
        (
            "create: AlreadyExists",
            vec![
                with_body("POST", CM, JSON, &configmap("twice", "1")),
                with_body("POST", CM, JSON, &configmap("twice", "2")),
            ],
        ),
        (
            "get",
            vec![
                with_body("POST", CM, JSON, &configmap("got", "1")),
                get(cm("got")),
            ],
        ),
        (
            "update with a stale resourceVersion",
            vec![
                with_body("POST", CM, JSON, &configmap("stale", "1")),
                with_body(
                    "PUT",
                    cm("stale"),
                    JSON,
                    &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stale", "resourceVersion": "1"}, "data": {"k": "2"}}),
                ),
            ],
        ),
        (
            "update",
            vec![
                with_body("POST", CM, JSON, &configmap("updated", "1")),
                with_body("PUT", cm("updated"), JSON, &configmap("updated", "2")),
            ],
        ),
        (
            "JSON patch",
            vec![
                with_body("POST", CM, JSON, &configmap("jp", "1")),
                with_body(
                    "PATCH",
                    cm("jp"),
                    JSON_PATCH,
                    &json!([{"op": "replace", "path": "/data/k", "value": "2"}]),
                ),
            ],
        ),
        (
            "merge patch",
            vec![
                with_body("POST", CM, JSON, &configmap("mp", "1")),
                with_body(
                    "PATCH",
                    cm("mp"),
                    MERGE,
                    &json!({"data": {"k": "2", "l": "3"}}),
                ),
            ],
        ),
        (
            "strategic merge patch",
            vec![
                with_body("POST", CM, JSON, &configmap("smp", "1")),
                with_body("PATCH", cm("smp"), STRATEGIC, &json!({"data": {"l": "3"}})),
            ],
        ),
        (
            "patch of a missing object",
            vec![with_body(
                "PATCH",
                cm("nothing"),
                MERGE,
                &json!({"data": {"k": "2"}}),
            )],
        ),
        (
            "server-side apply: create",
            vec![apply("ssa", "one", "1", false)],
        ),
        (
            "server-side apply: a conflict",
            vec![
                apply("ssa-c", "one", "1", false),
                apply("ssa-c", "two", "2", false),
            ],
        ),
        (
            "server-side apply: forced",
            vec![
                apply("ssa-f", "one", "1", false),
                apply("ssa-f", "two", "2", true),
            ],
        ),
        (
            "delete with a wrong uid precondition",
            vec![
                with_body("POST", CM, JSON, &configmap("pre", "1")),
                with_body(
                    "DELETE",
                    cm("pre"),
                    JSON,
                    &json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
                ),
            ],
        ),
        (
            "delete",
            vec![
                with_body("POST", CM, JSON, &configmap("deleted", "1")),
                with_body(
                    "DELETE",
                    cm("deleted"),
                    JSON,
                    &json!({"kind": "DeleteOptions", "apiVersion": "v1"}),
                ),
            ],
        ),
        (
            "dry run: nothing is stored",
            vec![
                with_body(
                    "POST",
                    format!("{CM}?dryRun=All"),
                    JSON,
                    &configmap("dry", "1"),
                ),
                get(cm("dry")),
            ],
        ),
        (
            "field validation: Warn",
            vec![with_body(
                "POST",
                format!("{CM}?fieldValidation=Warn"),
                JSON,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "warned"}, "bogus": 1}),
            )],
        ),
        (
            "field validation: Strict",
            vec![with_body(
                "POST",
                format!("{CM}?fieldValidation=Strict"),
                JSON,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "strict"}, "bogus": 1}),
            )],
        ),
        (
            "Lease create, and update as client-go does",
            vec![
                with_body("POST", LEASES, JSON, &lease("held", "a", None)),
                with_body(
                    "PUT",
                    format!("{LEASES}/held"),
                    JSON,
                    &lease("held", "b", Some("{rv}")),
                ),
            ],
        ),
        (
            "Lease update without a resourceVersion",
            vec![
                with_body("POST", LEASES, JSON, &lease("bare", "a", None)),
                with_body(
                    "PUT",
                    format!("{LEASES}/bare"),
                    JSON,
                    &lease("bare", "b", None),
                ),
            ],
        ),
        (
            "get in protobuf",
            vec![
                with_body("POST", CM, JSON, &configmap("proto", "1")),
                Request {
                    accept: Some(PROTOBUF),
                    ..get(cm("proto"))
                },
            ],
        ),
        (
            "list in protobuf",
            vec![Request {
                accept: Some(PROTOBUF),
                ..get(format!("{LEASES}?labelSelector=none%3Dnone"))
            }],
        ),
        (
            "list with a label selector",
            vec![
                with_body(
                    "POST",
                    CM,
                    JSON,
                    &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "labelled", "labels": {"diff": "yes"}}}),
                ),
                get(format!("{CM}?labelSelector=diff%3Dyes")),
            ],
        ),
        (
            "watch from a resourceVersion, without bookmarks",
            vec![
                with_body("POST", CM, JSON, &configmap("watched", "1")),
                get(format!(
                    "{CM}?watch=1&fieldSelector=metadata.name%3Dwatched&resourceVersion={{rv-1}}&timeoutSeconds=1"
                )),
            ],
        ),
        (
            "watch with initial events and bookmarks",
            vec![
                with_body("POST", CM, JSON, &configmap("initial", "1")),
                get(format!(
                    "{CM}?watch=1&fieldSelector=metadata.name%3Dinitial&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"
                )),
            ],
        ),
        (
            "watch from a too old resourceVersion",
            vec![get(format!(
                "{CM}?watch=1&resourceVersion=2&timeoutSeconds=1"
            ))],
        ),
    ]
}

/// Runs every case against `server`; the answers by case. In a step's
/// path and body, `{rv}` is the previous answer's `resourceVersion` and
/// `{rv-1}` the one before it.
async fn answers(server: &impl Cluster) -> BTreeMap<&'static str, Vec<Answer>> {
    let client = client_for(server).await;
    let mut all = BTreeMap::new();
    for (name, requests) in cases() {
        let mut answers: Vec<Answer> = Vec::new();
        for request in requests {
            let fill = |text: &str| match answers.last().and_then(|a| a.rv) {
                Some(rv) => text
                    .replace("{rv-1}", &(rv - 1).to_string())
                    .replace("{rv}", &rv.to_string()),
                None => text.to_owned(),
            };
            let request = Request {
                path: fill(&request.path),
                body: request
                    .body
                    .as_ref()
                    .map(|b| fill(&String::from_utf8_lossy(b)).into_bytes()),
                ..request
            };
            answers.push(send(&client, &request).await);
        }
        all.insert(name, answers);
    }
    // A bad token: refused by both.
    let mut kubeconfig = server.kubeconfig();
    kubeconfig.token = Some("wrong".into());
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig.to_yaml()).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let bad = Client::try_from(config).expect("client");
    all.insert("a bad token", vec![send(&bad, &get(CM)).await]);
    all
}

/// Where two answers differ: the fields, each as `field: simulated / real`.
fn differences(simulated: &Answer, real: &Answer) -> Vec<(String, String)> {
    let mut found = Vec::new();
    if simulated.code != real.code {
        found.push(("code".into(), format!("{} / {}", simulated.code, real.code)));
    }
    if simulated.reason != real.reason {
        found.push((
            "reason".into(),
            format!("{:?} / {:?}", simulated.reason, real.reason),
        ));
    }
    if simulated.media_type != real.media_type {
        found.push((
            "media type".into(),
            format!("{} / {}", simulated.media_type, real.media_type),
        ));
    }
    if simulated.warning != real.warning {
        found.push((
            "warning".into(),
            format!("{} / {}", simulated.warning, real.warning),
        ));
    }
    diff_json("body", &simulated.body, &real.body, &mut found);
    found
}

fn diff_json(at: &str, simulated: &Value, real: &Value, found: &mut Vec<(String, String)>) {
    match (simulated, real) {
        (Value::Object(s), Value::Object(r)) => {
            let keys: std::collections::BTreeSet<&String> = s.keys().chain(r.keys()).collect();
            for key in keys {
                let (sv, rv) = (
                    s.get(key).unwrap_or(&Value::Null),
                    r.get(key).unwrap_or(&Value::Null),
                );
                diff_json(&format!("{at}.{key}"), sv, rv, found);
            }
        }
        (Value::Array(s), Value::Array(r)) if s.len() == r.len() => {
            for (i, (sv, rv)) in s.iter().zip(r).enumerate() {
                diff_json(&format!("{at}[{i}]"), sv, rv, found);
            }
        }
        _ if simulated != real => found.push((at.to_owned(), format!("{simulated} / {real}"))),
        _ => {}
    }
}

/// The TLS suite `server` picks for kube's rustls configuration, which
/// tether's probes use (and which offers AES-256-GCM first).
async fn negotiated_suite(server: &impl Cluster) -> rustls::CipherSuite {
    let tls = config_for(server)
        .await
        .rustls_client_config()
        .expect("a TLS configuration");
    let name = rustls::pki_types::ServerName::from(server.addr().ip());
    let tcp = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connected");
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
        .connect(name, tcp)
        .await
        .expect("a TLS handshake");
    stream
        .get_ref()
        .1
        .negotiated_cipher_suite()
        .expect("a suite once the handshake is done")
        .suite()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_apiserver_answers_as_the_real_one_does() {
    let real = ControlPlane::start(RealOptions::default().name("judge"))
        .await
        .unwrap_or_else(|err| panic!("the real control plane starts: {err}"));
    let simulated = ApiServer::start(Options::default().name("judged").tls(true).token("t0ken"))
        .await
        .expect("the simulated apiserver");
    let suites = (
        negotiated_suite(&simulated).await,
        negotiated_suite(&real).await,
    );
    println!(
        "TLS suite: {:?} / {:?} (simulated / real)",
        suites.0, suites.1
    );
    assert_eq!(
        suites.0, suites.1,
        "the TLS suite picked (simulated / real)"
    );
    let (simulated, real) = (answers(&simulated).await, answers(&real).await);

    let mut found = Vec::new();
    for (case, real_answers) in &real {
        for (step, (s, r)) in simulated[case].iter().zip(real_answers).enumerate() {
            for (field, both) in differences(s, r) {
                found.push((format!("{case} #{step}"), field, both));
            }
        }
    }
    println!("{} cases, {} differences:", real.len(), found.len());
    for (case, field, both) in &found {
        println!("  {case}: {field}: {both} (simulated / real)");
    }
    let unexplained: Vec<_> = found
        .iter()
        .filter(|(case, field, _)| {
            !KNOWN
                .iter()
                .any(|(c, f, _)| case.starts_with(c) && field.starts_with(f))
        })
        .collect();
    let gone: Vec<_> = KNOWN
        .iter()
        .filter(|(c, f, _)| {
            !found
                .iter()
                .any(|(case, field, _)| case.starts_with(c) && field.starts_with(f))
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "differences not in KNOWN: {unexplained:#?}"
    );
    assert!(gone.is_empty(), "listed in KNOWN but gone: {gone:#?}");
}
