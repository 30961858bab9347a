//! The fault matrix: one of three remotes fails in each way a remote can,
//! against the real binary, with bounds derived from the test config
//! (interval 1s, failureThreshold 3, timeout 500ms, no jitter, backoff 1s).

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::time::Duration;

mod common;

use common::{DEADLINE, Tether, remote};
use tether_testkit::{ApiServer, Fault, Resource, Restart};
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(500);
const THRESHOLD: u32 = 3;

/// The longest a loss may take to show: the fault can strike just after a
/// probe, then `THRESHOLD` probes each up to their deadline; doubled for a
/// loaded CI machine and the metrics poll.
fn detection_bound() -> Duration {
    (INTERVAL * THRESHOLD + TIMEOUT) * 2
}

fn reachable(server: &ApiServer, name: &str) -> String {
    format!(
        "tether_remote_apiserver_reachable{{host=\"{}\",remote=\"{name}\"}}",
        server.addr()
    )
}

async fn three(tls_b: bool) -> (ApiServer, ApiServer, ApiServer) {
    (
        remote("a", false).await,
        remote("b", tls_b).await,
        remote("c", false).await,
    )
}

/// Waits until `series` reads `want`, within `bound` of `since`.
async fn within(tether: &Tether, series: &str, want: f64, since: Instant, bound: Duration) {
    loop {
        if tether.metric(series).await == Some(want) {
            return;
        }
        assert!(
            since.elapsed() < bound,
            "{series} did not reach {want} within {bound:?}; logs:\n{}",
            tether.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the server has answered `n` more probes.
async fn probes(server: &ApiServer, n: u64) {
    let start = server.requests("/readyz");
    let begun = Instant::now();
    while server.requests("/readyz") < start + n {
        assert!(begun.elapsed() < DEADLINE, "the remote is not being probed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn last_cause(tether: &Tether, name: &str) -> Option<String> {
    let (_, body) = tether.get("/status.json").await?;
    let status: serde_json::Value = serde_json::from_str(&body).ok()?;
    status["remotes"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)
        .and_then(|r| r["lastCause"].as_str().map(str::to_owned))
}

/// A lost remote: unreachable within the bound, one `remote_lost` cycle,
/// and no more rebuilds while it stays down.
async fn lost_exactly_once(fault: Fault, cause: &str) -> (Tether, [ApiServer; 3]) {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let struck = Instant::now();
    b.set_fault(fault.clone()).await.expect("fault");
    within(&tether, &reachable(&b, "b"), 0.0, struck, detection_bound()).await;
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    assert_eq!(
        last_cause(&tether, "b").await.as_deref(),
        Some(cause),
        "{fault}"
    );
    tether
        .until_metric(
            "tether_remote_probe_consecutive_failures{remote=\"b\"}",
            ">= 6",
            |v| v >= 6.0,
        )
        .await;
    assert_eq!(
        tether
            .metric("tether_cycles_total{cause=\"remote_lost\"}")
            .await,
        Some(1.0),
        "{fault}: rebuilt again"
    );
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
    (tether, [a, b, c])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_is_lost_once() {
    lost_exactly_once(Fault::Refuse, "refused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_is_lost_once_and_no_probe_outlives_its_deadline() {
    let (tether, _remotes) = lost_exactly_once(Fault::Hang, "timeout").await;
    let bucket =
        "tether_remote_probe_duration_seconds_bucket{remote=\"b\",result=\"unreachable\",le=\"1\"}";
    let count = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"unreachable\"}";
    let (within_deadline, all) = (tether.metric(bucket).await, tether.metric(count).await);
    assert!(all >= Some(6.0), "{all:?}");
    assert_eq!(within_deadline, all, "a hung probe outlived its deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_lost_once() {
    lost_exactly_once(Fault::Reset, "reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_server_errors_never_rebuild_and_are_not_ready() {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let ready = format!(
        "tether_remote_apiserver_ready{{host=\"{}\",remote=\"b\"}}",
        b.addr()
    );
    for code in [401, 403, 404, 500] {
        b.set_fault(Fault::Status {
            code,
            all_paths: false,
        })
        .await
        .expect("status");
        probes(&b, 3).await;
        assert_eq!(
            tether.metric(&ready).await,
            Some(0.0),
            "{code}: still ready"
        );
        assert_eq!(
            tether.metric(&reachable(&b, "b")).await,
            Some(1.0),
            "{code}: unreachable"
        );
    }
    assert_eq!(
        tether.metric("tether_cycle").await,
        Some(1.0),
        "rebuilt for an HTTP answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_503_is_lost() {
    let (a, b, c) = three(false).await;
    let tether = Tether::start(
        &[("a", &a), ("b", &b), ("c", &c)],
        &[],
        ", unreachableStatuses: [503]",
    );
    tether.until_ready(true).await;
    let struck = Instant::now();
    b.set_fault(Fault::Status {
        code: 503,
        all_paths: false,
    })
    .await
    .expect("503");
    within(&tether, &reachable(&b, "b"), 0.0, struck, detection_bound()).await;
    assert_eq!(last_cause(&tether, "b").await.as_deref(), Some("status"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_within_the_deadline_stays_reachable() {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    b.set_fault(Fault::Slow(TIMEOUT.mul_f64(0.8)))
        .await
        .expect("slow");
    probes(&b, 5).await;
    assert_eq!(tether.metric(&reachable(&b, "b")).await, Some(1.0));
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_faster_than_the_threshold_never_rebuilds() {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    b.set_fault(Fault::Flap(vec![true, false, false]))
        .await
        .expect("flap");
    probes(&b, 9).await;
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));
    let lost = tether
        .metric("tether_remote_transitions_total{remote=\"b\",to=\"unreachable\"}")
        .await
        .unwrap_or(0.0);
    assert_eq!(
        lost, 0.0,
        "a flap shorter than the threshold counted as a loss"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_three_down_costs_one_rebuild_and_no_storm() {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let struck = Instant::now();
    for server in [&a, &b, &c] {
        server.set_fault(Fault::Refuse).await.expect("refuse");
    }
    for (name, server) in [("a", &a), ("b", &b), ("c", &c)] {
        within(
            &tether,
            &reachable(server, name),
            0.0,
            struck,
            detection_bound(),
        )
        .await;
    }
    tether
        .until_metric(
            "tether_remote_probe_consecutive_failures{remote=\"a\"}",
            ">= 8",
            |v| v >= 8.0,
        )
        .await;
    assert_eq!(
        tether
            .metric("tether_cycles_total{cause=\"remote_lost\"}")
            .await,
        Some(1.0),
        "one rebuild per remote"
    );
    assert_eq!(tether.metric("tether_cycle").await, Some(2.0));
    assert_eq!(tether.get("/readyz").await.map(|(c, _)| c), Some(503));
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_backoff_exits_cleanly_within_the_grace() {
    let (a, b, c) = three(false).await;
    let mut tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    b.set_fault(Fault::Refuse).await.expect("refuse");
    tether
        .until_metric(
            "tether_supervisor_backoff_seconds",
            "> 0 (backing off)",
            |v| v > 0.0,
        )
        .await;
    let asked = Instant::now();
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(0));
    // shutdownGrace is 5s in the test config.
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_cluster_is_relisted_and_no_stale_object_survives() {
    let (a, b, c) = three(false).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let objects = "tether_watch_objects{remote=\"b\",resource=\"configmaps\"}";
    tether.until_metric(objects, "3", |v| v == 3.0).await;
    b.restart(Restart::Recreated).await.expect("recreate");
    b.put(
        Resource::ConfigMap,
        "default",
        serde_json::json!({"metadata": {"name": "fresh"}}),
    )
    .expect("put");
    tether
        .until_metric(objects, "1 (only the new object)", |v| v == 1.0)
        .await;
    tether.until_ready(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ca_is_lost_as_tls_and_back_after_the_kubeconfig_is_updated() {
    let (a, b, c) = three(true).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let struck = Instant::now();
    b.set_fault(Fault::TlsMismatch).await.expect("mismatch");
    within(&tether, &reachable(&b, "b"), 0.0, struck, detection_bound()).await;
    assert_eq!(last_cause(&tether, "b").await.as_deref(), Some("tls"));

    // The cluster was recreated: a new CA and token. The operator updates
    // the kubeconfig and tether reloads.
    b.restart(Restart::Recreated).await.expect("recreate");
    let kubeconfig = tether
        .config
        .parent()
        .expect("a folder")
        .join("b.kubeconfig");
    b.kubeconfig().write(&kubeconfig).expect("kubeconfig");
    tether.signal("HUP");
    let reloaded = Instant::now();
    within(
        &tether,
        &reachable(&b, "b"),
        1.0,
        reloaded,
        detection_bound(),
    )
    .await;
    tether.until_ready(true).await;
}
