//! The fault matrix and the watch manager on real remotes: kube-apiserver and
//! etcd built from their Go modules (`scripts/peers`), started by the test
//! (`tether_testkit::ControlPlane`). The same config and bounds as
//! `fault_matrix.rs` on the simulated remotes: interval 1s, failureThreshold
//! 3, timeout 500ms, no jitter, backoff 1s.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::time::Duration;

mod common;

use common::matrix::{detection_bound, reachable, rotate_kubeconfig, within};
use common::{Shape, Tether};
use k8s_openapi::api::core::v1::ConfigMap;
use tether_testkit::{ControlPlane, RealOptions};
use tokio::time::Instant;

async fn plane(options: RealOptions) -> ControlPlane {
    let plane = common::real_plane(options).await;
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
    causes: &[&str],
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
    tether.lost_for("b", causes, "lost once").await;
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
    // kube's own warnings about the cut watch (`eof in poll ... TLS
    // close_notify: https://docs.rs/...`) are folded into tether's lines.
    let logs = tether.logs();
    assert!(
        !logs.contains("eof in poll") && !logs.contains("https://docs.rs"),
        "kube's warning reached the log:\n{logs}"
    );
    assert!(logs.contains("remote apiserver unreachable"), "{logs}");
    for remote in ["a", "b"] {
        let synced = format!("tether_watch_synced{{remote=\"{remote}\",resource=\"configmaps\"}}");
        assert_eq!(tether.metric(&synced).await, Some(1.0), "{remote}");
    }
    println!("real remote, {causes:?}: unreachable after {took:?}");
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
        common::REFUSED,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_apiserver_is_hung_lost_once_and_back_after_sigcont() {
    let (a, b) = two().await;
    lost_once_then_back(
        &a,
        &b,
        async || b.pause().await,
        async || b.resume(),
        &["timeout"],
    )
    .await;
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
        &["timeout"],
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

    // The operator writes the new kubeconfig, and sends no signal.
    create_configmap(&b, "fresh").await;
    rotate_kubeconfig(&tether, "b", &b).await;
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
            tether.lost_for("b", common::REFUSED, "shutting down").await;
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
    c.pause().await;
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

/// The notes of the `RemoteLost` Events among `events`, sorted.
fn lost_notes(events: &[(String, String, String)]) -> Vec<String> {
    let mut notes: Vec<String> = events
        .iter()
        .filter(|(r, _, _)| r == "RemoteLost")
        .map(|(_, _, note)| note.clone())
        .collect();
    notes.sort();
    notes
}

/// tether in a Pod (the downward API's `POD_NAME` and `POD_NAMESPACE`)
/// records Events on it in the home cluster, where the operator looks
/// first: its leadership, each cycle's end with its cause, and at a clean
/// stop the last cycle and the leadership's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_tethers_pod_show_its_leadership_and_each_cycles_end() {
    let ((a, b), c) = tokio::join!(two(), plane(RealOptions::default().name("c")));
    let dir = tempfile::tempdir().expect("dir");
    // `a` is the home cluster too: it holds the Lease and the Events.
    let home = dir.path().join("home.kubeconfig");
    a.kubeconfig().write(&home).expect("kubeconfig");
    let pod = "tether-7d9f8-x2x4q";
    let extra = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms, kubeconfig: {}}}",
        home.display()
    );
    let mut tether = tether(
        &[("a", &a), ("b", &b), ("c", &c)],
        Shape {
            extra: &extra,
            env: &[
                ("POD_NAME", pod),
                ("POD_NAMESPACE", "default"),
                ("POD_UID", "0b5e7c1e-5d0a-4c55-9d8b-3f3c1f8a9e21"),
            ],
            ..Shape::default()
        },
    );
    // It leads (a Lease it created, it takes after a leaseDuration) and its
    // manager is up.
    tether
        .until_metric("tether_manager_up", "1", |v| v == 1.0)
        .await;
    b.stop();
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    // The next cycle runs, b still down, before b is back: a remote back
    // between cycles ends none, and b's restart may be quicker than the
    // backoff.
    tether.until_metric("tether_cycle", "2", |v| v == 2.0).await;
    b.restart().await.expect("restart");
    tether.until_ready(true).await;
    let events = common::until_events(
        &home,
        pod,
        &["LeadershipAcquired", "RemoteLost", "RemoteRecovered"],
    )
    .await;
    let lost = events
        .iter()
        .find(|(r, _, _)| r == "RemoteLost")
        .expect("listed");
    assert_eq!(lost.1, "Warning", "{events:#?}");
    assert_eq!(lost.2, "cycle 1 ended: b unreachable", "{events:#?}");
    let recovered = events
        .iter()
        .find(|(r, _, _)| r == "RemoteRecovered")
        .expect("listed");
    assert_eq!(recovered.1, "Normal", "{events:#?}");

    // Another remote lost: an Event of its own that names it, not a count
    // added to b's (kube's recorder folds repeats and keeps the first note).
    c.stop();
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "2", |v| {
            v == 2.0
        })
        .await;
    let every = Duration::from_millis(200);
    let lost = common::poll(common::DEADLINE, every, async || {
        Some(lost_notes(&common::pod_events(&home, pod))).filter(|notes| notes.len() >= 2)
    })
    .await
    .unwrap_or_default();
    let events = common::pod_events(&home, pod);
    assert!(
        lost.len() == 2
            && lost[0] == "cycle 1 ended: b unreachable"
            && lost[1].starts_with("cycle ")
            && lost[1].ends_with(" ended: c unreachable"),
        "each remote lost is an Event that names it: {events:#?}"
    );
    c.restart().await.expect("restart");
    tether.until_ready(true).await;

    assert!(
        tether
            .metric("tether_events_total{result=\"published\"}")
            .await
            >= Some(3.0)
    );
    assert_eq!(
        tether
            .metric("tether_events_total{result=\"failed\"}")
            .await,
        Some(0.0),
        "{}",
        tether.logs()
    );

    tether.signal("TERM");
    assert!(tether.wait().await.success(), "{}", tether.logs());
    common::until_events(&home, pod, &["Shutdown", "LeadershipReleased"]).await;
    assert!(
        !tether.logs().contains("cannot record an Event"),
        "{}",
        tether.logs()
    );
}

/// The RBAC manifest of docs/deploy.md, as the page gives it.
fn guide_manifest() -> String {
    let guide = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy.md"),
    )
    .expect("docs/deploy.md");
    let open = "kubectl apply -f - <<'EOF'\n";
    let start = guide.find(open).expect("the guide's manifest") + open.len();
    guide[start..start + guide[start..].find("\nEOF\n").expect("its end")].to_owned()
}

/// docs/deploy.md's recipe for a remote, followed on a real cluster: its
/// RBAC manifest as the page gives it, a `ServiceAccount` token, and a
/// kubeconfig made with kubectl as the page does. That user may do what
/// tether needs and no more, and `tether check` finds the remote reachable
/// and ready through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_guides_remote_rbac_and_token_kubeconfig_work_on_a_real_cluster() {
    let remote = plane(RealOptions::default().name("guide")).await;
    let dir = tempfile::tempdir().expect("dir");
    let admin = dir.path().join("admin.kubeconfig");
    remote.kubeconfig().write(&admin).expect("kubeconfig");
    common::kubectl(&admin, &["create", "namespace", "tether-remote"], "");
    common::kubectl(
        &admin,
        &["-n", "tether-remote", "create", "serviceaccount", "tether"],
        "",
    );
    common::kubectl(&admin, &["apply", "-f", "-"], &guide_manifest());
    // No token controller runs here to fill the guide's Secret: its other
    // way, a token with an expiry.
    let token = common::kubectl(
        &admin,
        &[
            "-n",
            "tether-remote",
            "create",
            "token",
            "tether",
            "--duration",
            "1h",
        ],
        "",
    );
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, remote.ca_pem()).expect("ca");
    let made = dir.path().join("cluster-a.kubeconfig");
    let ca = ca.display().to_string();
    let url = remote.url();
    for args in [
        &[
            "set-cluster",
            "cluster-a",
            "--server",
            &url,
            "--certificate-authority",
            &ca,
            "--embed-certs",
        ][..],
        &["set-credentials", "tether", "--token", token.trim()],
        &[
            "set-context",
            "cluster-a",
            "--cluster",
            "cluster-a",
            "--user",
            "tether",
        ],
        &["use-context", "cluster-a"],
    ] {
        common::kubectl(&made, &[&["config"][..], args].concat(), "");
    }

    let user = "system:serviceaccount:tether-remote:tether";
    for (verb, what, allowed) in [
        ("list", "configmaps", "yes"),
        ("watch", "configmaps", "yes"),
        ("get", "configmaps", "yes"),
        ("delete", "configmaps", "no"),
        ("list", "secrets", "no"),
        ("get", "/readyz", "yes"),
    ] {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&admin)
            .args([
                "auth",
                "can-i",
                verb,
                what,
                "--all-namespaces",
                "--as",
                user,
            ])
            .output()
            .expect("kubectl runs");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert_eq!(answer, allowed, "{verb} {what}");
    }

    let check = dir.path().join("check.yaml");
    std::fs::write(
        &check,
        format!(
            "remotes: [{{name: cluster-a, kubeconfig: {}}}]\n",
            made.display()
        ),
    )
    .expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["check", "-o", "json", "--config"])
        .arg(&check)
        .output()
        .expect("tether check runs");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{doc}");
    assert_eq!(doc["remotes"][0]["state"], "reachable", "{doc}");
    assert_eq!(
        doc["remotes"][0]["detail"], "200",
        "ready, through the token: {doc}"
    );
}
