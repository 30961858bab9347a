//! A Lease written and read in protobuf, the way client-go's leader election
//! does (its clientset speaks protobuf for built-in kinds): create, update
//! with optimistic concurrency, release, and a protobuf watch stream.

mod common;

use std::time::Duration;

use common::client_for;
use http_body_util::BodyExt as _;
use k8s_pb::api::coordination::v1::{Lease, LeaseSpec};
use k8s_pb::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Status, WatchEvent};
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use kube::Client;
use prost::Message as _;
use tether_testkit::{ApiServer, Options};
use tokio::time::timeout;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
const DEADLINE: Duration = Duration::from_secs(10);

/// A Lease in Kubernetes' protobuf envelope, as client-go sends it.
fn enveloped(kind: &str, api_version: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = b"k8s\0".to_vec();
    Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .expect("a Vec grows");
    out
}

fn unwrap(body: &[u8], kind: &str) -> Vec<u8> {
    let raw = body.strip_prefix(b"k8s\0").expect("the magic prefix");
    let unknown = Unknown::decode(raw).expect("a runtime.Unknown");
    assert_eq!(
        unknown.type_meta.and_then(|t| t.kind).as_deref(),
        Some(kind)
    );
    unknown.raw.expect("raw bytes")
}

fn micro(seconds: i64, micros: i32) -> MicroTime {
    MicroTime {
        seconds: Some(seconds),
        nanos: Some(micros * 1000),
    }
}

/// A Lease held by `holder`, renewed `renewals` seconds after it was
/// acquired.
fn lease(resource_version: Option<String>, holder: &str, renewals: i64) -> Vec<u8> {
    let lease = Lease {
        metadata: Some(ObjectMeta {
            name: Some("leader".into()),
            namespace: Some("default".into()),
            resource_version,
            ..ObjectMeta::default()
        }),
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(micro(1_796_000_000, 123_456)),
            renew_time: Some(micro(1_796_000_005 + renewals, 654_321)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    };
    enveloped("Lease", "coordination.k8s.io/v1", lease.encode_to_vec())
}

async fn send(client: &Client, method: &str, path: &str, body: Vec<u8>) -> (u16, String, Vec<u8>) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            http::header::ACCEPT,
            format!("{PROTOBUF}, application/json"),
        )
        .header(http::header::CONTENT_TYPE, PROTOBUF)
        .body(body)
        .expect("valid request");
    let response = client
        .send(request.map(Into::into))
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, content_type, bytes.to_vec())
}

#[tokio::test]
async fn a_lease_round_trips_in_protobuf_with_conflicts_and_a_protobuf_watch() {
    let server = ApiServer::start(Options::default().tls(true).token("pb"))
        .await
        .expect("starts");
    let client = client_for(&server).await;

    let (code, content_type, body) = send(&client, "POST", LEASES, lease(None, "a", 0)).await;
    assert_eq!((code, content_type.as_str()), (201, PROTOBUF));
    let created = Lease::decode(unwrap(&body, "Lease").as_slice()).expect("a Lease");
    let first_version = created
        .metadata
        .as_ref()
        .and_then(|m| m.resource_version.clone())
        .expect("a resourceVersion");
    let spec = created.spec.expect("spec");
    assert_eq!(spec.renew_time, Some(micro(1_796_000_005, 654_321)));
    assert_eq!(spec.lease_transitions, Some(0));

    // A watch from the creation's version, in protobuf framing.
    let request = http::Request::get(format!(
        "{LEASES}?watch=true&resourceVersion={first_version}"
    ))
    .header(http::header::ACCEPT, PROTOBUF)
    .body(Vec::new())
    .expect("valid request");
    let watch = client
        .send(request.map(Into::into))
        .await
        .expect("watch opens");
    assert_eq!(
        watch.headers()[http::header::CONTENT_TYPE],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let mut watch = watch.into_body();

    let path = format!("{LEASES}/leader");
    let renewed = lease(Some(first_version.clone()), "a", 2);
    let (code, _, _) = send(&client, "PUT", &path, renewed).await;
    assert_eq!(code, 200);

    // client-go's update after another replica's: a stale version.
    let (code, content_type, body) =
        send(&client, "PUT", &path, lease(Some(first_version), "b", 1)).await;
    assert_eq!((code, content_type.as_str()), (409, PROTOBUF));
    let status = Status::decode(unwrap(&body, "Status").as_slice()).expect("a Status");
    assert_eq!(status.reason.as_deref(), Some("Conflict"));
    assert_eq!(status.code, Some(409));

    // Released, as ReleaseOnCancel writes it: an empty holder.
    let current = server.stats().resource_version.to_string();
    let (code, _, _) = send(&client, "PUT", &path, lease(Some(current), "", 4)).await;
    assert_eq!(code, 200);
    let json = server_json(&client, &path).await;
    assert_eq!(json["spec"]["holderIdentity"], "");
    assert_eq!(json["spec"]["renewTime"], "2026-11-30T00:53:29.654321Z");
    assert_eq!(json["spec"]["acquireTime"], "2026-11-30T00:53:20.123456Z");
    assert_eq!(json["spec"]["leaseTransitions"], 0);

    // The watch saw both updates, as length-prefixed WatchEvents.
    let mut buffer = Vec::new();
    let mut holders = Vec::new();
    while holders.len() < 2 {
        let frame = timeout(DEADLINE, watch.frame())
            .await
            .expect("the watch delivers within the deadline")
            .expect("the stream is open")
            .expect("a frame");
        buffer.extend_from_slice(&frame.into_data().unwrap_or_default());
        while buffer.len() >= 4 {
            let len = u32::from_be_bytes(buffer[..4].try_into().expect("4 bytes")) as usize;
            if buffer.len() < 4 + len {
                break;
            }
            let event = WatchEvent::decode(&buffer[4..4 + len]).expect("a bare WatchEvent");
            buffer.drain(..4 + len);
            assert_eq!(event.r#type.as_deref(), Some("MODIFIED"));
            let raw = event.object.and_then(|o| o.raw).expect("an object");
            let lease = Lease::decode(unwrap(&raw, "Lease").as_slice()).expect("a Lease");
            holders.push(
                lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default(),
            );
        }
    }
    assert_eq!(
        holders,
        ["a", ""],
        "the renewal, then the release; no event for the conflict"
    );
}

async fn server_json(client: &Client, path: &str) -> serde_json::Value {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .expect("valid request");
    let text = client.request_text(request).await.expect("a JSON answer");
    serde_json::from_str(&text).expect("JSON")
}
