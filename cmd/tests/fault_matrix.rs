//! The fault matrix: one of three remotes fails in each way a remote can,
//! against the real binary, with bounds derived from the test config
//! (interval 1s, failureThreshold 3, timeout 500ms, no jitter, backoff 1s).
//!
//! SIGTERM during a build is `daemon.rs`'s
//! `sigterm_while_caches_cannot_sync_still_exits_cleanly_and_logs_json`. A
//! manager that panics every cycle needs a manager that panics, which the
//! binary does not have: that row runs the library stack in process.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::matrix::{
    INTERVAL, THRESHOLD, TIMEOUT, detection_bound, reachable, rotate_kubeconfig, within,
};
use common::{DEADLINE, Shape, Tether, probes, remote};
use tether_testkit::{ApiServer, Fault, Options, Resource, Restart, TestHost};
use tokio::time::Instant;

async fn three(tls_b: bool) -> (ApiServer, ApiServer, ApiServer) {
    (
        remote("a", false).await,
        remote("b", tls_b).await,
        remote("c", false).await,
    )
}

/// A lost remote: unreachable within the bound, one `remote_lost` cycle,
/// and no more rebuilds while it stays down.
async fn lost_exactly_once(fault: Fault, causes: &[&str]) -> (Tether, [ApiServer; 3]) {
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
    tether.lost_for("b", causes, &fault.to_string()).await;
    tether
        .still_lost_once("b", 6, &format!("{fault}: rebuilt again"))
        .await;
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
    // Its watch has failed all along: it never worked again.
    let logs = tether.logs();
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("watch works again") && l.contains("remote=b")),
        "{fault}: a failing watch was logged as working again:\n{logs}"
    );
    (tether, [a, b, c])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_is_lost_once() {
    lost_exactly_once(Fault::Refuse, common::REFUSED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_is_lost_once_and_no_probe_outlives_its_deadline() {
    let (tether, _remotes) = lost_exactly_once(Fault::Hang, &["timeout"]).await;
    let bucket =
        "tether_remote_probe_duration_seconds_bucket{remote=\"b\",result=\"unreachable\",le=\"1\"}";
    let count = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"unreachable\"}";
    let (within_deadline, all) = (tether.metric(bucket).await, tether.metric(count).await);
    assert!(all >= Some(6.0), "{all:?}");
    assert_eq!(within_deadline, all, "a hung probe outlived its deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_lost_once() {
    lost_exactly_once(Fault::Reset, &["reset"]).await;
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
        &Shape {
            probe_extra: ", unreachableStatuses: [503]",
            ..Shape::default()
        },
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
    assert_eq!(tether.last_cause("b").await.as_deref(), Some("status"));
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
        .still_lost_once("a", 8, "one rebuild per remote")
        .await;
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
    // shutdownGrace is 5s in the test config.
    tether
        .terminates_cleanly_within(Duration::from_secs(5))
        .await;
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
    assert_eq!(tether.last_cause("b").await.as_deref(), Some("tls"));

    // The cluster was recreated: a new CA and token. The operator updates
    // the kubeconfig, and sends no signal.
    b.restart(Restart::Recreated).await.expect("recreate");
    rotate_kubeconfig(&tether, "b", &b).await;
    tether.until_ready(true).await;
}

/// A remote that stays unreachable for another reason says so: refused
/// while its cluster is rebuilt, then tls when it is back with a new CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_remote_whose_cause_changes_is_logged_once_with_both_causes() {
    let (a, b, c) = three(true).await;
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether.until_ready(true).await;
    let struck = Instant::now();
    b.set_fault(Fault::Refuse).await.expect("refuse");
    within(&tether, &reachable(&b, "b"), 0.0, struck, detection_bound()).await;
    b.set_fault(Fault::TlsMismatch).await.expect("mismatch");
    let said = "remote apiserver still unreachable; the cause changed";
    common::until(said, detection_bound(), async || {
        tether.logs().contains(said).then_some(())
    })
    .await;
    let logs = tether.logs();
    let line = logs.lines().find(|l| l.contains(said)).expect("found");
    assert!(
        line.contains("from=refused") && line.contains("to=tls") && line.contains("remotes=b"),
        "{line}"
    );
    assert_eq!(logs.matches(said).count(), 1, "{logs}");
}

/// The JSON log event's message and `remote` field.
fn says(event: &serde_json::Value, message: &str, remote: &str) -> bool {
    let fields = &event["fields"];
    fields["message"] == message
        && (fields["remote"] == remote || fields["remotes"].to_string().contains(remote))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_new_is_lost_within_the_bound_of_the_managers_first_failed_reconnect() {
    let (a, b, c) = three(false).await;
    // Connections live ten minutes: only the manager's failed reconnect can
    // make the probe try a new one within this test.
    let tether = Tether::start(
        &[("a", &a), ("b", &b), ("c", &c)],
        &["--log-format", "json"],
        &Shape {
            probe_extra: ", maxConnectionAge: 10m",
            ..Shape::default()
        },
    );
    tether.until_ready(true).await;
    let struck = std::time::SystemTime::now();
    b.set_fault(Fault::RefuseNew).await.expect("refuse_new");
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
    let failed = tether
        .first_event(struck, |e| {
            says(e, "watch failing; retrying with backoff", "b")
        })
        .expect("the manager's watch of b failed");
    let lost = tether
        .first_event(struck, |e| {
            e["fields"]["message"] == "cycle ended"
                && e["fields"]["cause"] == "remote_lost (remote b)"
        })
        .expect("the cycle ended for b");
    let took = lost.duration_since(failed).expect("lost after the failure");
    let bound = INTERVAL * (THRESHOLD - 1) + TIMEOUT + INTERVAL;
    println!(
        "refuse_new, with the manager's hint: remote_lost {took:?} after the first failed reconnect (bound {bound:?})"
    );
    assert!(
        took <= bound,
        "took {took:?}, over {bound:?}; logs:\n{}",
        tether.logs()
    );
    tether.lost_for("b", common::REFUSED, "refuse_new").await;
    tether
        .still_lost_once("b", 6, "refuse_new: rebuilt again")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_new_without_a_manager_is_lost_once_the_kept_connection_ages_out() {
    let (a, b, c) = three(false).await;
    let max_age = Duration::from_secs(3);
    // No watches: nothing but the probe ever connects to a remote.
    let tether = Tether::start(
        &[("a", &a), ("b", &b), ("c", &c)],
        &["--log-format", "json"],
        &Shape {
            probe_extra: ", maxConnectionAge: 3s",
            watch: Some("[]"),
            ..Shape::default()
        },
    );
    tether
        .until_metric(&reachable(&b, "b"), "1", |v| v == 1.0)
        .await;
    let struck = Instant::now();
    let struck_at = std::time::SystemTime::now();
    b.set_fault(Fault::RefuseNew).await.expect("refuse_new");
    within(
        &tether,
        &reachable(&b, "b"),
        0.0,
        struck,
        max_age + detection_bound(),
    )
    .await;
    let lost = tether
        .first_event(struck_at, |e| says(e, "remote apiserver unreachable", "b"))
        .expect("the loss was logged");
    let took = lost.duration_since(struck_at).expect("after the fault");
    println!(
        "refuse_new, no manager: unreachable {took:?} after the fault (maxConnectionAge {max_age:?})"
    );
    tether.lost_for("b", common::REFUSED, "refuse_new").await;
    assert_eq!(
        b.stats().open_connections,
        0,
        "the aged connection was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_cache_that_cannot_relist_is_not_ready_after_the_detection_bound() {
    let a = remote("a", false).await;
    // Plain HTTP with a token: `/readyz` answers anyone, lists need the token.
    let b = ApiServer::start(Options::default().name("b").token("b-token"))
        .await
        .expect("server");
    let tether = Tether::run(&[("a", &a), ("b", &b)]);
    tether.until_ready(true).await;

    // The cluster is recreated with a new token: the probe still gets 200,
    // every list gets 401, and the cache can only go stale.
    let struck = Instant::now();
    b.restart(Restart::Recreated).await.expect("recreate");
    let stale_after = INTERVAL * THRESHOLD + TIMEOUT;
    tether.until_ready(false).await;
    assert!(
        struck.elapsed() >= stale_after,
        "not ready after {:?}, before the bound {stale_after:?}",
        struck.elapsed()
    );
    assert!(
        struck.elapsed() < detection_bound(),
        "{:?}",
        struck.elapsed()
    );
    let synced = "tether_watch_synced{remote=\"b\",resource=\"configmaps\"}";
    assert_eq!(tether.metric(synced).await, Some(0.0));
    assert_eq!(tether.metric("tether_manager_up").await, Some(0.0));
    assert_eq!(tether.metric(&reachable(&b, "b")).await, Some(1.0));
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0), "rebuilt");

    // The operator hands tether the new token: ready again.
    tether.write_kubeconfig("b", &b);
    tether.signal("HUP");
    tether.until_metric(synced, "1", |v| v == 1.0).await;
    tether.until_ready(true).await;
}

/// `fake-apiserver`, which the workspace's test build puts next to `tether`.
fn fake_apiserver() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_tether")).with_file_name("fake-apiserver");
    assert!(
        path.exists(),
        "{} is missing: cargo build -p tether-testkit --bin fake-apiserver",
        path.display()
    );
    path
}

/// Adds a remote to the running tether's config file and reloads.
fn add_remote(tether: &Tether, name: &str, kubeconfig: &Path) {
    let mut yaml = std::fs::read_to_string(&tether.config).expect("config");
    writeln!(
        yaml,
        "- {{name: {name}, kubeconfig: {}}}",
        kubeconfig.display()
    )
    .expect("a String");
    std::fs::write(&tether.config, yaml).expect("config");
    tether.signal("HUP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_remote_is_lost_as_timeout_and_the_admin_server_stays_fast() {
    let host = TestHost::create().unwrap_or_else(|err| {
        panic!("cannot make a test host: {err} (needs root and iproute2: apt-get install iproute2)")
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("b.kubeconfig");
    let address = host.addr().to_string();
    let mut command = tokio::process::Command::from(host.command(fake_apiserver()));
    let _server = command
        .args(["--listen", &address, "--port", "6443", "--tls"])
        .args(["--token", "b-token", "--cert-name", &address, "--name", "b"])
        .args(["--objects", "3", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fake-apiserver starts in the test host");
    common::until(
        "fake-apiserver writes its kubeconfig",
        DEADLINE,
        async || kubeconfig.exists().then_some(()),
    )
    .await;

    let (a, c) = (remote("a", false).await, remote("c", false).await);
    let tether = Tether::run(&[("a", &a), ("c", &c)]);
    tether.until_ready(true).await;
    add_remote(&tether, "b", &kubeconfig);
    let series =
        format!("tether_remote_apiserver_reachable{{host=\"{address}:6443\",remote=\"b\"}}");
    tether.until_metric(&series, "1", |v| v == 1.0).await;
    tether.until_ready(true).await;

    let struck = Instant::now();
    host.blackhole(6443, true).unwrap_or_else(|err| {
        panic!("cannot drop packets: {err} (needs nftables: apt-get install nftables)")
    });
    // Until the loss shows, and while it does, the admin server answers
    // without waiting on any probe.
    let mut slowest = Duration::ZERO;
    common::until(
        "b lost",
        detection_bound().saturating_sub(struck.elapsed()),
        async || {
            if tether.metric(&series).await == Some(0.0) {
                return Some(());
            }
            for path in ["/healthz", "/status"] {
                let asked = Instant::now();
                let (code, _) = tether.get(path).await.expect("the admin server answers");
                assert_eq!(code, 200, "{path}");
                slowest = slowest.max(asked.elapsed());
            }
            None
        },
    )
    .await;
    assert!(slowest < TIMEOUT, "the admin server took {slowest:?}");
    assert_eq!(tether.last_cause("b").await.as_deref(), Some("timeout"));
    tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_build_is_applied_exactly_once() {
    let (a, b, c) = three(false).await;
    // Every list fails, /readyz included, with a status: b stays reachable,
    // and the manager stays in its build, never up.
    let failing = Fault::Status {
        code: 500,
        all_paths: true,
    };
    b.set_fault(failing).await.expect("status");
    let tether = Tether::run(&[("a", &a), ("b", &b), ("c", &c)]);
    tether
        .until_metric(&reachable(&b, "b"), "1", |v| v == 1.0)
        .await;
    assert_eq!(tether.metric("tether_manager_up").await, Some(0.0));

    let d = remote("d", false).await;
    let kubeconfig = tether.write_kubeconfig("d", &d);
    add_remote(&tether, "d", &kubeconfig);
    tether
        .until_metric(&reachable(&d, "d"), "1", |v| v == 1.0)
        .await;
    // Long enough for the file poll (every 2s) to see the same file twice.
    probes(&d, 5).await;
    let applied = "tether_config_reloads_total{result=\"applied\"}";
    assert_eq!(tether.metric(applied).await, Some(1.0), "{}", tether.logs());
    // The cycle that is still building takes d in, once, and runs on.
    assert_eq!(
        tether
            .metric("tether_remote_changes_total{cause=\"config_changed\",change=\"added\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        tether
            .metric("tether_cycles_total{cause=\"config_changed\"}")
            .await,
        Some(0.0)
    );
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));

    // The build completes once b answers again, with d.
    b.set_fault(Fault::Up).await.expect("up");
    tether.until_ready(true).await;
    assert_eq!(
        tether
            .metric("tether_watch_synced{remote=\"d\",resource=\"configmaps\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(tether.get("/healthz").await.map(|(c, _)| c), Some(200));
}

/// A manager that panics as soon as it runs.
struct Panicking;

impl tether_supervisor::ManagerFactory for Panicking {
    async fn run(
        &self,
        _cycle: tether_supervisor::CycleToken,
    ) -> Result<(), tether_supervisor::ManagerError> {
        panic!("this manager always panics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_that_panics_every_cycle_backs_off_to_the_cap_and_never_stops() {
    let registry = prometheus::Registry::new();
    let max = Duration::from_millis(160);
    let (status, root, run) = common::spawn_supervisor(
        Panicking,
        Duration::from_millis(10),
        max,
        &registry,
        futures_util::stream::empty(),
    );

    // 10, 20, 40, 80 ms, then the cap: by cycle 12 it has held for a while.
    let panicked = |status: &tether_supervisor::SupervisorHandle| {
        status.status().ended[&tether_supervisor::CauseKind::ManagerPanicked]
    };
    let begun = Instant::now();
    let mut longest = Duration::ZERO;
    while panicked(&status) < 12 {
        assert!(
            begun.elapsed() < DEADLINE,
            "cycles stopped: {:?}",
            status.status()
        );
        assert!(!run.is_finished(), "the supervisor stopped");
        longest = longest.max(status.status().backoff.unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        longest, max,
        "the backoff never reached its cap, or passed it"
    );
    let counted = registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "tether_cycles_total")
        .and_then(|f| {
            f.get_metric()
                .iter()
                .find(|m| {
                    m.get_label()
                        .iter()
                        .any(|l| l.value() == "manager_panicked")
                })
                .map(|m| m.get_counter().get_value())
        })
        .expect("the cycles counter");
    assert!(counted >= 12.0, "{counted}");
    assert!(!run.is_finished(), "the supervisor stopped");
    root.cancel();
    assert_eq!(
        run.await.expect("the supervisor returns at shutdown"),
        tether_supervisor::ShutdownOutcome::Clean
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_remotes_watch_is_retried_slowly_and_logged_once() {
    let (a, b) = (remote("a", false).await, remote("b", false).await);
    let tether = Tether::start(
        &[("a", &a), ("b", &b)],
        &[],
        &Shape {
            probe_extra: ", unreachableStatuses: [500]",
            ..Shape::default()
        },
    );
    tether.until_ready(true).await;
    // Every path answers 500 (which kube's client does not retry itself):
    // the probes call b lost, and the new cycle's lists of b fail.
    b.set_fault(Fault::Status {
        code: 500,
        all_paths: true,
    })
    .await
    .expect("500");
    tether.until_metric("tether_cycle", "2", |v| v == 2.0).await;
    let lists = "/api/v1/configmaps";
    let listed = b.requests(lists);
    // Ten probe intervals: kube's own backoff, reset by every retry, tried
    // a list each second; while b is lost, a retry waits 30s.
    probes(&b, 10).await;
    let retried = b.requests(lists) - listed;
    assert!(
        retried <= 2,
        "{retried} lists of a lost remote in ten intervals; logs:\n{}",
        tether.logs()
    );
    let logs = tether.logs();
    let warned = logs
        .lines()
        .filter(|l| l.contains("watch failing") && l.contains("remote=b"))
        .count();
    assert_eq!(warned, 1, "one warning for a run of failures:\n{logs}");
}
