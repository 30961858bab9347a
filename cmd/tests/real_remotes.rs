//! The fault matrix and the watch manager on real remotes: kube-apiserver and
//! etcd built from their Go modules (`scripts/peers`), started by the test
//! (`tether_testkit::ControlPlane`). The same config and bounds as
//! `fault_matrix.rs` on the simulated remotes: interval 1s, failureThreshold
//! 3, timeout 500ms, no jitter, backoff 1s.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::time::Duration;

mod common;

use common::matrix::{detection_bound, reachable, reload_kubeconfig, within};
use common::{Shape, Tether};
use k8s_openapi::api::core::v1::ConfigMap;
use tether_testkit::{ControlPlane, RealOptions};
use tokio::time::Instant;

async fn plane(options: RealOptions) -> ControlPlane {
    let plane = ControlPlane::start(options)
        .await
        .unwrap_or_else(|err| panic!("the real control plane starts: {err}"));
    seed(&plane, 3).await;
    plane
}

/// Real remotes `a` and `b`, started side by side, each with three
/// ConfigMaps in `default`.
async fn two() -> (ControlPlane, ControlPlane) {
    tokio::join!(
        plane(RealOptions::default().name("a")),
        plane(RealOptions::default().name("b"))
    )
}

/// Creates ConfigMaps `cm-0` .. `cm-<n-1>` in `default`.
async fn seed(plane: &ControlPlane, n: usize) {
    for i in 0..n {
        create_configmap(plane, &format!("cm-{i}")).await;
    }
}

/// Creates the ConfigMap `name` in `default`.
async fn create_configmap(plane: &ControlPlane, name: &str) {
    let client = kube::Client::try_from(common::config_of(plane).await).expect("client");
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .expect("a ConfigMap");
    api.create(&kube::api::PostParams::default(), &cm)
        .await
        .expect("the real apiserver creates it");
}

/// The watch list of these tests: the ConfigMaps the test made. A real
/// cluster has others of its own in `kube-system`.
const WATCH: &str = "[{apiVersion: v1, kind: ConfigMap, namespace: default}]";

/// tether over `remotes` with the test config and this file's watch list,
/// changed as `shape` says.
fn tether(remotes: &[(&str, &ControlPlane)], shape: Shape<'_>) -> Tether {
    Tether::start(
        remotes,
        &[],
        &Shape {
            watch: Some(shape.watch.unwrap_or(WATCH)),
            ..shape
        },
    )
}

/// The loss of `b` through `strike`: unreachable within the bound with
/// `cause`, one `remote_lost` cycle and no more while it stays down; then
/// `heal`, and ready again with every cache synced.
async fn lost_once_then_back(
    a: &ControlPlane,
    b: &ControlPlane,
    strike: impl AsyncFnOnce(),
    heal: impl AsyncFnOnce(),
    cause: &str,
) -> Duration {
    let tether = tether(&[("a", a), ("b", b)], Shape::default());
    tether.until_ready(true).await;
    let struck = Instant::now();
    strike().await;
    let took = within(&tether, &reachable(b, "b"), 0.0, struck, detection_bound()).await;
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    assert_eq!(tether.last_cause("b").await.as_deref(), Some(cause));
    tether
        .still_lost_once("b", 6, "rebuilt again while down")
        .await;
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
    assert_eq!(tether.get("/readyz").await.map(|(c, _)| c), Some(503));
    assert_eq!(
        tether.metric(&reachable(a, "a")).await,
        Some(1.0),
        "a was spared"
    );

    heal().await;
    tether.until_ready(true).await;
    for remote in ["a", "b"] {
        let synced = format!("tether_watch_synced{{remote=\"{remote}\",resource=\"configmaps\"}}");
        assert_eq!(tether.metric(&synced).await, Some(1.0), "{remote}");
    }
    println!("real remote, {cause}: unreachable after {took:?}");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_apiserver_is_refused_lost_once_and_back_after_its_restart() {
    let (a, b) = two().await;
    lost_once_then_back(
        &a,
        &b,
        async || b.stop(),
        async || b.restart().await.expect("restart"),
        "refused",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_apiserver_is_hung_lost_once_and_back_after_sigcont() {
    let (a, b) = two().await;
    lost_once_then_back(&a, &b, async || b.pause(), async || b.resume(), "timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_apiserver_is_lost_as_timeout_and_back_when_packets_pass() {
    let a = plane(RealOptions::default().name("a")).await;
    let b = plane(RealOptions::default().name("b").in_test_host(true)).await;
    lost_once_then_back(
        &a,
        &b,
        async || {
            b.blackhole(true)
                .expect("nft drops the port (apt-get install nftables)");
        },
        async || b.blackhole(false).expect("nft passes it again"),
        "timeout",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_apiserver_is_relisted_and_keeps_its_objects() {
    let (a, b) = two().await;
    let tether = tether(&[("a", &a), ("b", &b)], Shape::default());
    tether.until_ready(true).await;
    let objects = "tether_watch_objects{remote=\"b\",resource=\"configmaps\"}";
    tether.until_metric(objects, "3", |v| v == 3.0).await;
    b.restart().await.expect("restart");
    // The same etcd: the objects survive, and the caches hold them again.
    tether.until_ready(true).await;
    tether.until_metric(objects, "3", |v| v == 3.0).await;
    create_configmap(&b, "after-restart").await;
    tether.until_metric(objects, "4", |v| v == 4.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_cluster_is_lost_as_tls_and_back_with_only_new_objects_after_the_kubeconfig_is_updated()
 {
    let (a, b) = two().await;
    let tether = tether(&[("a", &a), ("b", &b)], Shape::default());
    tether.until_ready(true).await;
    let objects = "tether_watch_objects{remote=\"b\",resource=\"configmaps\"}";
    tether.until_metric(objects, "3", |v| v == 3.0).await;

    let struck = Instant::now();
    b.recreate().await.expect("recreate");
    within(
        &tether,
        &reachable(&b, "b"),
        0.0,
        struck,
        detection_bound() + Duration::from_secs(30),
    )
    .await;
    assert_eq!(tether.last_cause("b").await.as_deref(), Some("tls"));

    // The operator writes the new kubeconfig; tether reloads.
    create_configmap(&b, "fresh").await;
    reload_kubeconfig(&tether, "b", &b).await;
    tether.until_ready(true).await;
    tether
        .until_metric(objects, "1 (only the new cluster's object)", |v| v == 1.0)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_reachable_never_ready_and_never_rebuilt() {
    let (a, b) = two().await;
    let mut wrong = b.kubeconfig();
    wrong.token = Some("not-the-token".into());
    let yaml = wrong.to_yaml();
    let tether = tether(
        &[("a", &a), ("b", &b)],
        Shape {
            kubeconfigs: &[("b", &yaml)],
            ..Shape::default()
        },
    );
    tether
        .until_metric(&reachable(&b, "b"), "1", |v| v == 1.0)
        .await;
    let failures = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"reachable\"}";
    tether
        .until_metric(failures, ">= 5 probes", |v| v >= 5.0)
        .await;
    let ready = format!(
        "tether_remote_apiserver_ready{{host=\"{}\",remote=\"b\"}}",
        b.addr()
    );
    assert_eq!(tether.metric(&ready).await, Some(0.0), "401 is not ready");
    assert_eq!(tether.metric(&reachable(&b, "b")).await, Some(1.0));
    assert_eq!(
        tether.metric("tether_cycle").await,
        Some(1.0),
        "rebuilt for a 401"
    );
    assert_eq!(tether.get("/readyz").await.map(|(c, _)| c), Some(503));
    let (_, status) = tether.get("/status.json").await.expect("status");
    assert!(status.contains("401"), "{status}");
}

/// A real apiserver answers `/readyz` with 500 (not 503) from SIGTERM until
/// its shutdown delay ends: not ready, still reachable, no rebuild; the
/// refusal after the delay is the loss. Listed in `unreachableStatuses`, the
/// 500 is the loss itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutting_down_apiserver_is_not_ready_through_its_delay_then_lost() {
    let delay = Duration::from_secs(8);
    for listed in [false, true] {
        let a = plane(RealOptions::default().name("a")).await;
        let b = plane(RealOptions::default().name("b").shutdown_delay(delay)).await;
        let tether = tether(
            &[("a", &a), ("b", &b)],
            Shape {
                probe_extra: if listed {
                    ", unreachableStatuses: [500]"
                } else {
                    ""
                },
                ..Shape::default()
            },
        );
        tether.until_ready(true).await;
        let ready = format!(
            "tether_remote_apiserver_ready{{host=\"{}\",remote=\"b\"}}",
            b.addr()
        );
        let struck = Instant::now();
        b.terminate();
        if listed {
            let took = within(&tether, &reachable(&b, "b"), 0.0, struck, detection_bound()).await;
            assert!(took < delay, "lost only at the refusal, after {took:?}");
            assert_eq!(tether.last_cause("b").await.as_deref(), Some("status"));
            println!("real remote, 500 while shutting down (listed): unreachable after {took:?}");
        } else {
            within(&tether, &ready, 0.0, struck, detection_bound()).await;
            assert_eq!(tether.metric(&reachable(&b, "b")).await, Some(1.0));
            assert_eq!(tether.metric("tether_cycle").await, Some(1.0));
            let took = within(
                &tether,
                &reachable(&b, "b"),
                0.0,
                struck,
                delay + detection_bound(),
            )
            .await;
            assert!(took >= delay, "lost during the delay, after {took:?}");
            assert_eq!(tether.last_cause("b").await.as_deref(), Some("refused"));
            println!(
                "real remote, shutting down: not ready at once, refused and lost after {took:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_real_remotes_sync_and_a_lost_optional_one_restarts_alone() {
    let (a, b, c) = tokio::join!(
        plane(RealOptions::default().name("a")),
        plane(RealOptions::default().name("b")),
        plane(RealOptions::default().name("c")),
    );
    let tether = tether(
        &[("a", &a), ("b", &b), ("c", &c)],
        Shape {
            optional: &["c"],
            ..Shape::default()
        },
    );
    tether.until_ready(true).await;
    for remote in ["a", "b", "c"] {
        let objects =
            format!("tether_watch_objects{{remote=\"{remote}\",resource=\"configmaps\"}}");
        tether.until_metric(&objects, "3", |v| v == 3.0).await;
    }

    // The optional remote: its scope stops and starts again; the cycle
    // stays, and so does readiness.
    c.pause();
    tether
        .until_metric(
            "tether_remote_restarts_total{cause=\"remote_lost\",remote=\"c\"}",
            "1",
            |v| v == 1.0,
        )
        .await;
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));
    assert_eq!(tether.get("/readyz").await.map(|(c, _)| c), Some(200));
    c.resume();
    let synced = "tether_watch_synced{remote=\"c\",resource=\"configmaps\"}";
    tether.until_metric(synced, "1", |v| v == 1.0).await;
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));

    // A required one ends the cycle; its recovery rebuilds.
    b.stop();
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    tether.until_ready(false).await;
    b.restart().await.expect("restart");
    tether.until_ready(true).await;
    assert!(tether.metric("tether_cycle").await >= Some(2.0));
    for remote in ["a", "b", "c"] {
        let objects =
            format!("tether_watch_objects{{remote=\"{remote}\",resource=\"configmaps\"}}");
        tether.until_metric(&objects, "3 again", |v| v == 3.0).await;
    }
}
