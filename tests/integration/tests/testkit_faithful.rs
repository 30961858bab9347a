//! Proof that the simulated apiserver is faithful enough for tether: a real
//! kube-rs client, watcher and reflector against it, and each fault giving
//! the client-side error class the real failure gives.

mod common;

use std::error::Error as StdError;
use std::io;
use std::time::Duration;

use common::{client_for, config_for};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};
use serde_json::json;
use tether_testkit::{ApiServer, Fault, Options, Resource, Restart};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Generous: kube's default watcher backoff alone can take a few seconds.
const DEADLINE: Duration = Duration::from_secs(30);
/// The probe-style client's own deadline.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// A client set up the way tether's probes set theirs up.
async fn probe_client_for(server: &ApiServer) -> Client {
    let mut config = config_for(server).await;
    config.default_retry = false;
    config.read_timeout = Some(PROBE_TIMEOUT);
    config.connect_timeout = Some(PROBE_TIMEOUT);
    Client::try_from(config).expect("client builds")
}

fn configmap(name: &str, value: &str) -> serde_json::Value {
    json!({"metadata": {"name": name}, "data": {"value": value}})
}

/// What a probe request came to.
#[derive(Debug)]
enum Outcome {
    Status(u16),
    Failed(kube::Error),
    TimedOut,
}

async fn probe(client: &Client, path: &str) -> Outcome {
    let request = http::Request::get(path)
        .body(Vec::new())
        .expect("valid request");
    match timeout(PROBE_TIMEOUT * 2, client.send(request.map(Into::into))).await {
        Ok(Ok(response)) => Outcome::Status(response.status().as_u16()),
        Ok(Err(err)) => Outcome::Failed(err),
        Err(_) => Outcome::TimedOut,
    }
}

/// The I/O error kinds and messages anywhere in the error's source chain.
fn chain(err: &(dyn StdError + 'static)) -> (Vec<io::ErrorKind>, String) {
    let mut kinds = Vec::new();
    let mut text = err.to_string();
    let mut source = err.source();
    if let Some(io) = err.downcast_ref::<io::Error>() {
        kinds.push(io.kind());
    }
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            kinds.push(io.kind());
        }
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    (kinds, text)
}

fn failure(outcome: Outcome) -> (Vec<io::ErrorKind>, String) {
    match outcome {
        Outcome::Failed(err) => chain(&err),
        other => panic!("expected a transport failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_typed_client_gets_lists_and_writes_over_tls_with_a_token() {
    let server = ApiServer::start(Options::default().tls(true).token("s3cret"))
        .await
        .expect("starts");
    let api: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let created = api
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(configmap("typed", "1")).expect("valid"),
        )
        .await
        .expect("create");
    assert!(created.metadata.resource_version.is_some());
    let list = api
        .list(&kube::api::ListParams::default())
        .await
        .expect("list");
    assert!(
        list.metadata.resource_version.is_some(),
        "lists carry metadata.resourceVersion"
    );
    assert_eq!(list.items.len(), 1);
    let err = api.get("missing").await.expect_err("not found");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 404);
            assert_eq!(status.reason, "NotFound");
        }
        other => panic!("expected a Status error, got {other:?}"),
    }
}

#[tokio::test]
async fn pagination_returns_every_object_once() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    for i in 0..25 {
        server
            .put(
                Resource::ConfigMap,
                "default",
                configmap(&format!("cm-{i:02}"), "x"),
            )
            .expect("put");
    }
    let api: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let mut names = Vec::new();
    let mut params = kube::api::ListParams::default().limit(10);
    loop {
        let page = api.list(&params).await.expect("list page");
        names.extend(page.items.into_iter().filter_map(|cm| cm.metadata.name));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    let expected: Vec<_> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);
}

/// Runs a reflector and forwards every watcher event to a channel.
fn reflect(
    api: Api<ConfigMap>,
) -> (
    reflector::Store<ConfigMap>,
    mpsc::UnboundedReceiver<watcher::Event<ConfigMap>>,
    tokio::task::JoinHandle<()>,
) {
    let (reader, writer) = reflector::store();
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(event) = event
                && tx.send(event).is_err()
            {
                return;
            }
        }
    });
    (reader, rx, task)
}

/// Waits for the first event that `pred` accepts.
async fn wait_event(
    events: &mut mpsc::UnboundedReceiver<watcher::Event<ConfigMap>>,
    what: &str,
    pred: impl Fn(&watcher::Event<ConfigMap>) -> bool,
) {
    timeout(DEADLINE, async {
        while let Some(event) = events.recv().await {
            if pred(&event) {
                return;
            }
        }
        panic!("the watcher stopped before {what}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} within {DEADLINE:?}: watcher stuck?"));
}

fn applied(name: &'static str, value: &'static str) -> impl Fn(&watcher::Event<ConfigMap>) -> bool {
    move |event| match event {
        watcher::Event::Apply(cm) | watcher::Event::InitApply(cm) => {
            cm.metadata.name.as_deref() == Some(name)
                && cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .map(String::as_str)
                    == Some(value)
        }
        _ => false,
    }
}

fn names(reader: &reflector::Store<ConfigMap>) -> Vec<String> {
    let mut names: Vec<_> = reader
        .state()
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_reflector_sees_add_update_delete_and_resumes_after_a_restart() {
    let server = ApiServer::start(
        Options::default()
            .tls(true)
            .token("s3cret")
            .bookmark_interval(Duration::from_secs(1)),
    )
    .await
    .expect("starts");
    server
        .put(Resource::ConfigMap, "default", configmap("a", "1"))
        .expect("put");
    let api: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let (reader, mut events, task) = reflect(api);

    wait_event(&mut events, "the initial list", |e| {
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(names(&reader), ["a"]);
    server
        .put(Resource::ConfigMap, "default", configmap("b", "1"))
        .expect("put");
    wait_event(&mut events, "b added", applied("b", "1")).await;
    server
        .put(Resource::ConfigMap, "default", configmap("a", "2"))
        .expect("put");
    wait_event(&mut events, "a updated", applied("a", "2")).await;
    assert!(server.delete(Resource::ConfigMap, "default", "b"));
    wait_event(
        &mut events,
        "b deleted",
        |e| matches!(e, watcher::Event::Delete(cm) if cm.metadata.name.as_deref() == Some("b")),
    )
    .await;

    let watch_path = "/api/v1/namespaces/default/configmaps";
    let lists_before = server.requests(watch_path);
    server
        .restart(Restart::SameIdentity)
        .await
        .expect("restart");
    server
        .put(Resource::ConfigMap, "default", configmap("c", "1"))
        .expect("put");
    wait_event(&mut events, "c added after the restart", applied("c", "1")).await;
    assert_eq!(names(&reader), ["a", "c"]);
    assert_eq!(
        server.requests(watch_path),
        lists_before,
        "the watcher re-listed instead of resuming from its resourceVersion"
    );
    task.abort();
}

#[tokio::test]
async fn after_a_recreated_cluster_the_reflector_relists_and_drops_stale_objects() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    server
        .put(Resource::ConfigMap, "default", configmap("old", "1"))
        .expect("put");
    let api: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let (reader, mut events, task) = reflect(api);
    wait_event(&mut events, "the initial list", |e| {
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(names(&reader), ["old"]);

    server.restart(Restart::Recreated).await.expect("recreate");
    server
        .put(Resource::ConfigMap, "default", configmap("new", "1"))
        .expect("put");
    // The old resourceVersion has expired: 410, then a fresh list.
    wait_event(&mut events, "a relist", |e| {
        matches!(e, watcher::Event::Init)
    })
    .await;
    wait_event(&mut events, "the relist's end", |e| {
        matches!(e, watcher::Event::InitDone)
    })
    .await;
    assert_eq!(
        names(&reader),
        ["new"],
        "a stale object survived the recreation"
    );
    task.abort();
}

#[tokio::test]
async fn a_streaming_list_ends_with_the_initial_events_end_bookmark() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    server
        .put(Resource::ConfigMap, "default", configmap("streamed", "1"))
        .expect("put");
    let api: Api<ConfigMap> = Api::namespaced(client_for(&server).await, "default");
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().streaming_lists();
    let stream = reflector(writer, watcher(api, config));
    let mut stream = std::pin::pin!(stream);
    timeout(DEADLINE, async {
        while let Some(event) = stream.next().await {
            if matches!(event.expect("no watch error"), watcher::Event::InitDone) {
                return;
            }
        }
    })
    .await
    .expect("the streaming list never ended: initial-events-end bookmark missing?");
    assert_eq!(names(&reader), ["streamed"]);
    assert_eq!(
        server.requests("/api/v1/namespaces/default/configmaps?watch"),
        1
    );
}

#[tokio::test]
async fn refuse_gives_connection_refused() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    let client = probe_client_for(&server).await;
    assert!(matches!(
        probe(&client, "/readyz").await,
        Outcome::Status(200)
    ));
    server.set_fault(Fault::Refuse).await.expect("refuse");
    let (kinds, text) = failure(probe(&client, "/readyz").await);
    // Under load a refusing port can read as a reset: the kept-alive
    // connection the fault cut may be picked before its close is seen.
    assert!(
        kinds.iter().any(|kind| matches!(
            kind,
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
        )),
        "{kinds:?}: {text}"
    );
    server.set_fault(Fault::Up).await.expect("up again");
    assert!(matches!(
        probe(&client, "/readyz").await,
        Outcome::Status(200)
    ));
}

#[tokio::test]
async fn hang_is_bounded_only_by_the_clients_own_timeout() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    server.set_fault(Fault::Hang).await.expect("hang");
    let client = probe_client_for(&server).await;
    match probe(&client, "/readyz").await {
        // The read timeout fires first, or the outer deadline does.
        Outcome::TimedOut => {}
        Outcome::Failed(err) => {
            let (kinds, text) = chain(&err);
            assert!(
                kinds.contains(&io::ErrorKind::TimedOut) || text.contains("timed out"),
                "{kinds:?}: {text}"
            );
        }
        Outcome::Status(code) => panic!("a hung server answered {code}"),
    }
    assert_eq!(
        server.requests("/readyz"),
        0,
        "a hung server handled a request"
    );
}

#[tokio::test]
async fn reset_gives_a_connection_reset() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    server.set_fault(Fault::Reset).await.expect("reset");
    let client = probe_client_for(&server).await;
    let (kinds, text) = failure(probe(&client, "/readyz").await);
    // A write that meets the reset gives EPIPE rather than ECONNRESET.
    assert!(
        kinds.iter().any(|kind| matches!(
            kind,
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        )),
        "{kinds:?}: {text}"
    );
}

#[tokio::test]
async fn tls_mismatch_fails_the_handshake() {
    let server = ApiServer::start(Options::default().tls(true))
        .await
        .expect("starts");
    let client = probe_client_for(&server).await;
    assert!(matches!(
        probe(&client, "/readyz").await,
        Outcome::Status(200)
    ));
    server
        .set_fault(Fault::TlsMismatch)
        .await
        .expect("mismatch");
    let (_, text) = failure(probe(&client, "/readyz").await);
    assert!(
        text.contains("invalid peer certificate") || text.contains("UnknownIssuer"),
        "{text}"
    );
}

#[tokio::test]
async fn an_injected_status_is_a_response_not_a_failure() {
    let server = ApiServer::start(Options::default().token("s3cret"))
        .await
        .expect("starts");
    let client = probe_client_for(&server).await;
    server
        .set_fault(Fault::Status {
            code: 403,
            all_paths: false,
        })
        .await
        .expect("403");
    assert!(matches!(
        probe(&client, "/readyz").await,
        Outcome::Status(403)
    ));
    assert!(
        matches!(probe(&client, "/version").await, Outcome::Status(200)),
        "only /readyz is affected"
    );
    server
        .set_fault(Fault::Status {
            code: 503,
            all_paths: true,
        })
        .await
        .expect("503 everywhere");
    assert!(matches!(
        probe(&client, "/version").await,
        Outcome::Status(503)
    ));
}

#[tokio::test]
async fn slow_delays_every_answer() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    let client = probe_client_for(&server).await;
    let delay = Duration::from_millis(200);
    server.set_fault(Fault::Slow(delay)).await.expect("slow");
    let started = tokio::time::Instant::now();
    assert!(matches!(
        probe(&client, "/readyz").await,
        Outcome::Status(200)
    ));
    assert!(
        started.elapsed() >= delay,
        "answered in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn flap_follows_its_script_per_readyz_request() {
    let server = ApiServer::start(Options::default()).await.expect("starts");
    let client = probe_client_for(&server).await;
    server
        .set_fault(Fault::Flap(vec![true, false, false]))
        .await
        .expect("flap");
    let mut script = Vec::new();
    for _ in 0..6 {
        script.push(matches!(
            probe(&client, "/readyz").await,
            Outcome::Status(200)
        ));
    }
    assert_eq!(script, [true, false, false, true, false, false]);
    assert_eq!(server.requests("/readyz"), 6);
}

/// Opens a raw watch and returns its body once the stream is established.
async fn open_watch(client: &Client) -> kube::client::Body {
    let request = http::Request::get("/api/v1/namespaces/default/configmaps?watch=true")
        .body(Vec::new())
        .expect("valid request");
    let response = client
        .send(request.map(Into::into))
        .await
        .expect("watch opens");
    assert_eq!(response.status(), 200);
    response.into_body()
}

#[tokio::test]
async fn refuse_and_hang_end_open_watch_streams() {
    for fault in [Fault::Refuse, Fault::Hang, Fault::Reset] {
        let server = ApiServer::start(Options::default()).await.expect("starts");
        server
            .put(Resource::ConfigMap, "default", configmap("x", "1"))
            .expect("put");
        let client = client_for(&server).await;
        let mut body = open_watch(&client).await;
        let first = timeout(DEADLINE, http_body_util::BodyExt::frame(&mut body))
            .await
            .expect("the initial event arrives");
        assert!(first.is_some());
        assert_eq!(server.stats().open_watches, 1);

        server.set_fault(fault.clone()).await.expect("fault");
        let ended = timeout(DEADLINE, async {
            loop {
                match http_body_util::BodyExt::frame(&mut body).await {
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "{fault}: the open watch stream survived");
    }
}
