//! Probes against real sockets: the simulated apiserver from
//! `tether-testkit`, with its faults. These run on the real clock with short
//! intervals, because a paused clock would auto-advance past real I/O.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use prometheus::{Encoder as _, Registry, TextEncoder};
use tether_probes::{
    FailureCause, HEAD_TOO_LARGE, Outcome, ProbeConfig, ProbeSet, ProbeSetHandle, Reachability,
    Remote, Transition, check, probe_client, probe_once,
};
use tether_supervisor::RemoteSignal;
use tether_testkit::{ApiServer, Fault, HostileServer, Hostility, Options};
use tokio::sync::broadcast;
use tokio::time::{Instant, timeout};

/// Bound on anything a test waits for.
const DEADLINE: Duration = Duration::from_secs(20);
const TIMEOUT: Duration = Duration::from_millis(250);

async fn config_of(server: &ApiServer) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml())
        .expect("valid kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kubeconfig resolves")
}

/// Settings for one-off probes with a deadline of `TIMEOUT`.
fn one_off() -> ProbeConfig {
    ProbeConfig::default()
        .with_interval(TIMEOUT * 2)
        .with_timeout(TIMEOUT)
}

async fn probe(server: &ApiServer, statuses: &[u16]) -> Outcome {
    let mut client = probe_client(&config_of(server).await, &one_off()).expect("client");
    probe_once(&mut client, "/readyz", TIMEOUT, statuses)
        .await
        .outcome
}

fn cause_of(outcome: &Outcome) -> FailureCause {
    match outcome {
        Outcome::Unreachable { cause, .. } => *cause,
        other => panic!("expected unreachable, got {other:?}"),
    }
}

#[tokio::test]
async fn any_http_status_is_reachable() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    for code in [200, 401, 403, 404, 500] {
        server
            .set_fault(Fault::Status {
                code,
                all_paths: true,
            })
            .await
            .expect("fault");
        assert_eq!(
            probe(&server, &[]).await,
            Outcome::Reachable { status: code }
        );
    }
}

#[tokio::test]
async fn a_listed_status_is_unreachable_and_a_503_is_not_retried() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    server
        .set_fault(Fault::Status {
            code: 503,
            all_paths: false,
        })
        .await
        .expect("fault");
    assert_eq!(
        probe(&server, &[]).await,
        Outcome::Reachable { status: 503 }
    );
    assert_eq!(server.requests("/readyz"), 1, "a 503 was retried");
    assert_eq!(
        cause_of(&probe(&server, &[502, 503, 504]).await),
        FailureCause::Status
    );
}

#[tokio::test]
async fn transport_failures_are_unreachable_with_their_cause() {
    let plain = ApiServer::start(Options::default()).await.expect("server");
    let tls = ApiServer::start(Options::default().tls(true))
        .await
        .expect("server");
    for (server, fault, cause) in [
        (&plain, Fault::Refuse, FailureCause::Refused),
        (&plain, Fault::Reset, FailureCause::Reset),
        (&plain, Fault::Hang, FailureCause::Timeout),
        (&tls, Fault::TlsMismatch, FailureCause::Tls),
    ] {
        server.set_fault(fault.clone()).await.expect("fault");
        let outcome = timeout(DEADLINE, probe(server, &[]))
            .await
            .unwrap_or_else(|_| panic!("{fault}: the probe outlived its deadline"));
        assert_eq!(cause_of(&outcome), cause, "{fault}: {outcome:?}");
    }
}

#[tokio::test]
async fn a_client_certificate_is_presented_and_none_is_a_tls_failure() {
    let server = ApiServer::start(Options::default().tls(true).client_certs(true))
        .await
        .expect("server");
    let config = config_of(&server).await;
    let mut client = probe_client(&config, &one_off()).expect("client");
    for _ in 0..2 {
        let result = probe_once(&mut client, "/readyz", TIMEOUT, &[]).await;
        assert_eq!(result.outcome, Outcome::Reachable { status: 200 });
    }
    assert_eq!(
        server.stats().connections_accepted,
        1,
        "the connection was kept"
    );
    let mut without = config;
    without.auth_info.client_certificate_data = None;
    without.auth_info.client_key_data = None;
    let mut client = probe_client(&without, &one_off()).expect("client");
    let outcome = probe_once(&mut client, "/readyz", TIMEOUT, &[])
        .await
        .outcome;
    assert_eq!(cause_of(&outcome), FailureCause::Tls, "{outcome:?}");
}

#[tokio::test]
async fn an_unresolvable_host_is_a_dns_failure() {
    let config = kube::Config::new(
        "https://tether-probe-test.invalid:6443"
            .parse()
            .expect("valid"),
    );
    let mut client = probe_client(&config, &one_off()).expect("client");
    let outcome = probe_once(&mut client, "/readyz", TIMEOUT, &[])
        .await
        .outcome;
    assert_eq!(cause_of(&outcome), FailureCause::Dns, "{outcome:?}");
}

fn with_missing_token_file(mut config: kube::Config) -> kube::Config {
    config.auth_info.token = None;
    config.auth_info.token_file = Some("/nonexistent/tether/token".into());
    config
}

#[tokio::test]
async fn an_unreadable_token_file_is_a_local_error() {
    let server = ApiServer::start(Options::default().token("t"))
        .await
        .expect("server");
    let config = with_missing_token_file(config_of(&server).await);
    let rows = check(&[Remote::new("a", config)], &ProbeConfig::default())
        .await
        .expect("check");
    assert!(
        matches!(rows[0].result.outcome, Outcome::LocalError { .. }),
        "{rows:?}"
    );
    assert_eq!(server.requests("/readyz"), 0);
}

/// A probe set with a fast, unjittered schedule.
fn fast(failure_threshold: u32, success_threshold: u32) -> ProbeConfig {
    ProbeConfig::default()
        .with_interval(Duration::from_millis(100))
        .with_timeout(Duration::from_millis(50))
        .with_jitter(0.0)
        .with_failure_threshold(failure_threshold)
        .with_success_threshold(success_threshold)
}

async fn next_transition(rx: &mut broadcast::Receiver<Transition>, what: &str) -> Transition {
    timeout(DEADLINE, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no transition ({what}) within {DEADLINE:?}: probe loop stuck?"))
        .expect("the probe set is alive")
}

/// Polls the status until `pred` holds for `name`.
async fn until(
    handle: &ProbeSetHandle,
    name: &str,
    what: &str,
    pred: impl Fn(&tether_probes::RemoteStatus) -> bool,
) {
    timeout(DEADLINE, async {
        loop {
            if handle.status().iter().any(|s| s.name == name && pred(s)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} never reached: {what}; status {:?}", handle.status()));
}

/// What `/metrics` serves: the registry's families, then the probes'.
fn metric_text(registry: &Registry, probes: &ProbeSetHandle) -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .expect("encodes");
    probes.write_metrics(&mut out);
    String::from_utf8(out).expect("utf-8")
}

#[tokio::test]
async fn a_local_error_never_counts_toward_the_threshold() {
    let server = ApiServer::start(Options::default().token("t"))
        .await
        .expect("server");
    let probes = ProbeSet::new(fast(1, 1), &Registry::new()).expect("probe set");
    let mut rx = probes.handle().subscribe();
    let config = with_missing_token_file(config_of(&server).await);
    probes.sync(&[Remote::new("a", config)]).expect("sync");
    let handle = probes.handle();
    until(&handle, "a", "a local error", |s| s.local_error.is_some()).await;
    // Several more ticks at threshold 1: still not unreachable.
    let first = handle.status()[0].last_probe;
    until(&handle, "a", "later ticks", |s| s.last_probe > first).await;
    let status = &handle.status()[0];
    assert_eq!(status.state, Reachability::Unknown);
    assert_eq!(status.consecutive_failures, 0);
    assert!(rx.try_recv().is_err(), "a local error caused a transition");
}

#[tokio::test]
async fn a_dead_remote_is_unreachable_on_the_third_failure_exactly_once() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let registry = Registry::new();
    let probes = ProbeSet::new(fast(3, 1), &registry).expect("probe set");
    let handle = probes.handle();
    let mut rx = handle.subscribe();
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    let up = next_transition(&mut rx, "first success").await;
    assert_eq!(
        (up.from, up.to),
        (Reachability::Unknown, Reachability::Reachable)
    );

    server.set_fault(Fault::Refuse).await.expect("refuse");
    let down = next_transition(&mut rx, "lost").await;
    assert_eq!(down.to, Reachability::Unreachable);
    assert_eq!(down.failures, 3, "declared on the wrong failure");
    assert!(down.error.is_some());

    // Three more failures: still one transition.
    until(&handle, "a", "six failures", |s| {
        s.consecutive_failures >= 6
    })
    .await;
    assert!(
        rx.try_recv().is_err(),
        "a second transition while still down"
    );
    let text = metric_text(&registry, &probes.handle());
    let host = server.addr().to_string();
    assert!(
        text.contains("tether_remote_transitions_total{remote=\"a\",to=\"unreachable\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "tether_remote_apiserver_reachable{{host=\"{host}\",remote=\"a\"}} 0"
        )),
        "{text}"
    );
    let status = &handle.status()[0];
    assert_eq!(status.last_cause, Some(FailureCause::Refused));
}

#[tokio::test]
async fn failures_interrupted_by_a_success_never_trip() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    // Up once, then F, F, T, F, F, T, ...: never three in a row.
    server
        .set_fault(Fault::Flap(vec![true, false, false]))
        .await
        .expect("flap");
    let registry = Registry::new();
    let probes = ProbeSet::new(fast(3, 1), &registry).expect("probe set");
    let mut rx = probes.handle().subscribe();
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    let up = next_transition(&mut rx, "first success").await;
    assert_eq!(up.to, Reachability::Reachable);

    timeout(DEADLINE, async {
        while server.requests("/readyz") < 15 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("fifteen probes happen");
    assert!(
        rx.try_recv().is_err(),
        "F, F, T, F, F tripped the threshold"
    );
    assert_eq!(probes.handle().state_of("a"), Some(Reachability::Reachable));
}

#[tokio::test]
async fn two_successes_are_needed_when_the_success_threshold_is_two() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let probes = ProbeSet::new(fast(1, 2), &Registry::new()).expect("probe set");
    let mut rx = probes.handle().subscribe();
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    next_transition(&mut rx, "first success").await;
    server.set_fault(Fault::Refuse).await.expect("refuse");
    assert_eq!(
        next_transition(&mut rx, "lost").await.to,
        Reachability::Unreachable
    );

    let before = server.requests("/readyz");
    server.set_fault(Fault::Up).await.expect("up");
    let back = next_transition(&mut rx, "recovered").await;
    assert_eq!(back.to, Reachability::Reachable);
    assert!(
        server.requests("/readyz") - before >= 2,
        "recovered after one success"
    );
}

#[tokio::test]
async fn probes_reuse_one_connection_between_ticks() {
    let server = ApiServer::start(Options::default().tls(true))
        .await
        .expect("server");
    let probes = ProbeSet::new(fast(3, 1), &Registry::new()).expect("probe set");
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    timeout(DEADLINE, async {
        while server.requests("/readyz") < 10 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("ten probes happen");
    // An idle pooled connection outlives the gap between probes: no new
    // TCP and TLS handshake per probe.
    assert_eq!(server.stats().connections_accepted, 1);
}

#[tokio::test]
async fn a_remote_closing_the_probe_connection_is_probed_before_the_next_tick() {
    let server = ApiServer::start(Options::default().tls(true))
        .await
        .expect("server");
    // The next regular tick is a minute away, three times the deadline.
    let config = ProbeConfig::default()
        .with_interval(DEADLINE * 3)
        .with_timeout(TIMEOUT)
        .with_jitter(0.0)
        .with_failure_threshold(1);
    let probes = ProbeSet::new(config, &Registry::new()).expect("probe set");
    let mut transitions = probes.handle().subscribe();
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    let up = next_transition(&mut transitions, "first probe").await;
    assert_eq!(up.to, Reachability::Reachable);
    // Refusing closes every open connection, the probe's kept one too.
    server.set_fault(Fault::Refuse).await.expect("fault");
    let down = next_transition(&mut transitions, "early probe").await;
    assert_eq!(down.to, Reachability::Unreachable);
    assert_eq!(server.requests("/readyz"), 1);
}

#[tokio::test]
async fn two_names_for_one_server_make_one_probe_reported_under_both() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let registry = Registry::new();
    let probes = ProbeSet::new(fast(3, 1), &registry).expect("probe set");
    let config = config_of(&server).await;
    let mut other = config.clone();
    // The same endpoint, written differently.
    other.cluster_url = format!("http://127.0.0.1:{}/", server.addr().port())
        .parse()
        .expect("valid");
    probes
        .sync(&[Remote::new("a", config), Remote::new("b", other)])
        .expect("sync");
    let handle = probes.handle();
    until(&handle, "b", "reachable", |s| {
        s.state == Reachability::Reachable
    })
    .await;
    until(&handle, "a", "five probes", |_| true).await;
    timeout(DEADLINE, async {
        while server.requests("/readyz") < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("probes happen");
    drop(probes);
    // Both names report every probe, and each probe reached the server once.
    let text = metric_text(&registry, &handle);
    let count = |name: &str| -> u64 {
        let prefix = format!(
            "tether_remote_probe_duration_seconds_count{{remote=\"{name}\",result=\"reachable\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no probe count for {name}:\n{text}"))
    };
    assert_eq!(count("a"), count("b"));
    // The set may have been dropped with one probe in flight.
    let requests = server.requests("/readyz");
    assert!(
        (count("a")..=count("a") + 1).contains(&requests),
        "{requests} requests for {} reported probes: probed more than once per tick",
        count("a")
    );
}

#[tokio::test]
async fn sync_keeps_the_state_of_a_remote_that_stays_and_deletes_removed_series() {
    let a = ApiServer::start(Options::default()).await.expect("server");
    let b = ApiServer::start(Options::default()).await.expect("server");
    let registry = Registry::new();
    let probes = ProbeSet::new(fast(3, 1), &registry).expect("probe set");
    let handle = probes.handle();
    let mut rx = handle.subscribe();
    let (config_a, config_b) = (config_of(&a).await, config_of(&b).await);
    probes
        .sync(&[
            Remote::new("a", config_a.clone()),
            Remote::new("b", config_b),
        ])
        .expect("sync");
    a.set_fault(Fault::Refuse).await.expect("refuse");
    until(&handle, "a", "unreachable", |s| {
        s.state == Reachability::Unreachable
    })
    .await;
    until(&handle, "b", "reachable", |s| {
        s.state == Reachability::Reachable
    })
    .await;
    let streak = handle.status()[0].consecutive_failures;

    // A reload that keeps a and drops b.
    probes.sync(&[Remote::new("a", config_a)]).expect("sync");
    let after = &handle.status();
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].state,
        Reachability::Unreachable,
        "the reload forgot a is down"
    );
    assert!(
        after[0].consecutive_failures >= streak,
        "the reload reset the streak"
    );
    let text = metric_text(&registry, &probes.handle());
    assert!(
        !text.contains("remote=\"b\""),
        "series of the removed remote remain:\n{text}"
    );

    // And a still recovers.
    while let Ok(t) = rx.try_recv() {
        assert!(
            t.remote != "a" || t.to != Reachability::Reachable,
            "{t:?} before the recovery"
        );
    }
    a.set_fault(Fault::Up).await.expect("up");
    let back = loop {
        let t = next_transition(&mut rx, "a recovers").await;
        if t.remote == "a" {
            break t;
        }
    };
    assert_eq!(
        (back.from, back.to),
        (Reachability::Unreachable, Reachability::Reachable)
    );
}

#[tokio::test]
async fn a_hanging_remote_never_delays_another_or_the_heartbeat() {
    let hung = ApiServer::start(Options::default()).await.expect("server");
    let healthy = ApiServer::start(Options::default()).await.expect("server");
    hung.set_fault(Fault::Hang).await.expect("hang");
    let config = fast(3, 1);
    let interval = config.interval;
    let probes = ProbeSet::new(config, &Registry::new()).expect("probe set");
    probes
        .sync(&[
            Remote::new("hung", config_of(&hung).await),
            Remote::new("healthy", config_of(&healthy).await),
        ])
        .expect("sync");
    let handle = probes.handle();
    timeout(DEADLINE, async {
        while healthy.requests("/readyz") < 10 {
            let age = handle.heartbeat().elapsed();
            assert!(age < interval * 3, "heartbeat is {age:?} old");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the healthy remote keeps being probed");
    until(&handle, "hung", "unreachable", |s| {
        s.state == Reachability::Unreachable
    })
    .await;
    let hung_status = handle
        .status()
        .into_iter()
        .find(|s| s.name == "hung")
        .expect("configured");
    assert_eq!(hung_status.last_cause, Some(FailureCause::Timeout));
}

/// A `MakeWriter` that keeps every log line.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Self;
    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

#[tokio::test]
async fn no_secret_reaches_a_log_line_or_a_metric_label() {
    const TOKEN: &str = "s3cret-bearer-token";
    const PASSWORD: &str = "hunter2-userinfo";
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = ApiServer::start(Options::default().token(TOKEN))
        .await
        .expect("server");
    let mut config = config_of(&server).await;
    config.cluster_url = format!("http://admin:{PASSWORD}@{}", server.addr())
        .parse()
        .expect("valid");
    let registry = Registry::new();
    let probes = ProbeSet::new(fast(3, 1), &registry).expect("probe set");
    let mut rx = probes.handle().subscribe();
    probes
        .sync(&[Remote::new("a", config.clone())])
        .expect("sync");
    next_transition(&mut rx, "first").await;
    server.set_fault(Fault::Reset).await.expect("reset");
    next_transition(&mut rx, "lost").await;
    server.set_fault(Fault::Up).await.expect("up");
    next_transition(&mut rx, "back").await;
    let rows = check(&[Remote::new("a", config)], &fast(3, 1))
        .await
        .expect("check");
    let handle = probes.handle();
    drop(probes);

    let logs = String::from_utf8(logs.0.lock().expect("not poisoned").clone()).expect("utf-8");
    assert!(
        logs.contains("remote apiserver unreachable"),
        "the logs were not captured:\n{logs}"
    );
    let metrics = metric_text(&registry, &handle);
    for secret in [TOKEN, PASSWORD] {
        assert!(!logs.contains(secret), "{secret} in the logs:\n{logs}");
        assert!(
            !metrics.contains(secret),
            "{secret} in the metrics:\n{metrics}"
        );
        assert!(
            !format!("{rows:?}").contains(secret),
            "{secret} in check rows"
        );
    }
}

#[tokio::test]
async fn check_probes_each_identity_once_and_reports_every_name() {
    let up = ApiServer::start(Options::default()).await.expect("server");
    let down = ApiServer::start(Options::default()).await.expect("server");
    down.set_fault(Fault::Refuse).await.expect("refuse");
    let config = config_of(&up).await;
    let rows = check(
        &[
            Remote::new("b-alias", config.clone()),
            Remote::new("a", config),
            Remote::new("c-down", config_of(&down).await),
        ],
        &ProbeConfig::default(),
    )
    .await
    .expect("check");
    let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "b-alias", "c-down"]);
    assert_eq!(rows[0].result.outcome, Outcome::Reachable { status: 200 });
    assert_eq!(rows[1].result.outcome, Outcome::Reachable { status: 200 });
    assert_eq!(cause_of(&rows[2].result.outcome), FailureCause::Refused);
    assert_eq!(up.requests("/readyz"), 1, "one identity was probed twice");
}

/// `server` probed as remote `a` with `config`, watched from before its
/// first probe: the set (probing stops when it is dropped), its handle, and
/// its transitions.
async fn probing(
    server: &ApiServer,
    config: ProbeConfig,
) -> (ProbeSet, ProbeSetHandle, broadcast::Receiver<Transition>) {
    let probes = ProbeSet::new(config, &Registry::new()).expect("probe set");
    let handle = probes.handle();
    let transitions = handle.subscribe();
    probes
        .sync(&[Remote::new("a", config_of(server).await)])
        .expect("sync");
    (probes, handle, transitions)
}

/// Probes every `interval` exactly, each with a deadline of `TIMEOUT`.
fn every(interval: Duration) -> ProbeConfig {
    ProbeConfig::default()
        .with_interval(interval)
        .with_timeout(TIMEOUT)
        .with_jitter(0.0)
}

/// Waits until `server` has answered `n` probes in all.
async fn answered(server: &ApiServer, n: u64) {
    timeout(DEADLINE, async {
        while server.requests("/readyz") < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("probe {n} never came"));
}

/// A probe set whose next regular tick is a minute away, so that only an
/// early probe can find anything within a test.
fn slow_ticks() -> ProbeConfig {
    every(DEADLINE * 3).with_failure_threshold(1)
}

#[tokio::test]
async fn a_suspected_remote_is_probed_at_once_on_a_new_connection() {
    let server = ApiServer::start(Options::default().tls(true))
        .await
        .expect("server");
    let (_probes, handle, mut transitions) = probing(&server, slow_ticks()).await;
    let up = next_transition(&mut transitions, "first probe").await;
    assert_eq!(up.to, Reachability::Reachable);

    // New connections are refused; the probe's kept one is still served.
    server.set_fault(Fault::RefuseNew).await.expect("fault");
    assert_eq!(
        server.stats().open_connections,
        1,
        "the kept connection was closed"
    );
    handle.suspect("a");
    handle.suspect("not-configured");
    let down = next_transition(&mut transitions, "the suspicion's probe").await;
    assert_eq!(down.to, Reachability::Unreachable);
    assert_eq!(
        handle.status()[0].last_cause,
        Some(FailureCause::Refused),
        "the probe went over the kept connection"
    );
    assert_eq!(server.requests("/readyz"), 1);
}

#[tokio::test]
async fn a_second_early_probe_waits_for_the_next_tick_which_reconnects() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let interval = Duration::from_secs(4);
    let (_probes, handle, _) = probing(&server, every(interval)).await;
    answered(&server, 1).await;
    handle.suspect("a");
    answered(&server, 2).await;
    assert_eq!(
        server.stats().connections_accepted,
        2,
        "not a new connection"
    );

    let second = Instant::now();
    handle.suspect("a");
    answered(&server, 3).await;
    assert!(
        second.elapsed() >= interval / 2,
        "a second early probe ran before the next tick, after {:?}",
        second.elapsed()
    );
    assert_eq!(
        server.stats().connections_accepted,
        3,
        "the tick after a suspicion kept the old connection"
    );
}

#[tokio::test]
async fn a_kept_connection_past_its_age_is_replaced() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let config = fast(1, 1).with_max_connection_age(Duration::from_millis(350));
    let (_probes, _, mut transitions) = probing(&server, config).await;
    next_transition(&mut transitions, "first probe").await;
    answered(&server, 10).await;
    let accepted = server.stats().connections_accepted;
    assert!(
        (2..=5).contains(&accepted),
        "ten probes 100ms apart over connections that live 350ms took {accepted} connections"
    );

    // A remote that takes no new connections is lost once the kept one
    // ages out, with no manager to suspect it.
    server.set_fault(Fault::RefuseNew).await.expect("fault");
    let down = next_transition(&mut transitions, "lost").await;
    assert_eq!(down.to, Reachability::Unreachable);
}

#[tokio::test]
async fn signals_are_the_losses_and_recoveries_of_the_transitions() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let probes = ProbeSet::new(fast(1, 1), &Registry::new()).expect("probe set");
    // Taken before the first probe, as the daemon takes it.
    let mut signals = std::pin::pin!(probes.handle().signals());
    probes
        .sync(&[Remote::new("a", config_of(&server).await)])
        .expect("sync");
    // The first transition, unknown to reachable, is no signal.
    server.set_fault(Fault::Refuse).await.expect("refuse");
    let lost = timeout(DEADLINE, signals.next()).await.expect("a signal");
    assert_eq!(lost, Some(RemoteSignal::Lost("a".into())));
    server.set_fault(Fault::Up).await.expect("up");
    let back = timeout(DEADLINE, signals.next()).await.expect("a signal");
    assert_eq!(back, Some(RemoteSignal::Recovered("a".into())));
}

#[tokio::test]
async fn suspicions_never_hurry_a_failing_remote_toward_the_threshold() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let interval = Duration::from_secs(2);
    let (_probes, handle, _) = probing(&server, every(interval)).await;
    until(&handle, "a", "reachable", |s| {
        s.state == Reachability::Reachable
    })
    .await;
    server.set_fault(Fault::Refuse).await.expect("refuse");
    // The kept connection closes: an early probe, then a regular one.
    until(&handle, "a", "two failures", |s| {
        s.consecutive_failures == 2
    })
    .await;
    let second = Instant::now();
    for _ in 0..3 {
        handle.suspect("a");
    }
    until(&handle, "a", "three failures", |s| {
        s.consecutive_failures == 3
    })
    .await;
    assert!(
        second.elapsed() >= interval / 2,
        "a suspicion probed a failing remote early: the third failure came {:?} after the second",
        second.elapsed()
    );
}

#[tokio::test]
async fn a_large_response_head_is_still_a_response() {
    for (size, status) in [(1_300, 200), (16 * 1024, 200), (64 * 1024, HEAD_TOO_LARGE)] {
        let server = HostileServer::start(Hostility::HugeHead(size))
            .await
            .expect("server");
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml())
            .expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("config");
        let mut client = probe_client(&config, &one_off()).expect("client");
        let outcome = probe_once(&mut client, "/readyz", TIMEOUT, &[])
            .await
            .outcome;
        assert_eq!(
            outcome,
            Outcome::Reachable { status },
            "a head of {size} bytes"
        );
    }
}

#[tokio::test]
async fn one_url_verified_and_unverified_is_two_probes_with_their_own_results() {
    let server = ApiServer::start(Options::default().tls(true))
        .await
        .expect("server");
    // One name verifies the certificate with no CA to trust: a TLS
    // failure. The other skips verification: it answers.
    let mut verifying = config_of(&server).await;
    verifying.root_cert = None;
    let mut insecure = verifying.clone();
    insecure.accept_invalid_certs = true;
    let probes = ProbeSet::new(fast(1, 1), &Registry::new()).expect("probe set");
    let handle = probes.handle();
    probes
        .sync(&[
            Remote::new("verifying", verifying),
            Remote::new("insecure", insecure),
        ])
        .expect("sync");
    until(&handle, "verifying", "unreachable", |s| {
        s.state == Reachability::Unreachable
    })
    .await;
    until(&handle, "insecure", "reachable", |s| {
        s.state == Reachability::Reachable
    })
    .await;
    let verifying = handle
        .status()
        .into_iter()
        .find(|s| s.name == "verifying")
        .expect("configured");
    assert_eq!(verifying.last_cause, Some(FailureCause::Tls));
}

/// A probe that fails as a rotation would (TLS after a new CA, a listed 401
/// after a new token) asks for its files to be read again before it counts
/// the failure. With a failure threshold of one, a rotation racing the
/// probes would be a loss at the first failure; here it never is, and the
/// probe goes on under the new settings.
#[tokio::test]
async fn a_failure_a_rotation_explains_is_rechecked_before_it_counts() {
    use tether_testkit::Rotation;

    for rotation in [Rotation::Ca, Rotation::Token] {
        let server = ApiServer::start(
            Options::default()
                .name("a")
                .tls(true)
                .token("t0")
                .anonymous_health(false),
        )
        .await
        .expect("server");
        let probes = Arc::new(
            ProbeSet::new(
                fast(1, 1).with_unreachable_statuses([401]),
                &Registry::new(),
            )
            .expect("probe set"),
        );
        let handle = probes.handle();
        let mut rx = handle.subscribe();
        // What the remote's files hold. The test holds the lock while it
        // rotates the server and rewrites them, so a recheck sees both or
        // neither, as the kubelet's symlink swap makes a Secret's update.
        let files = Arc::new(tokio::sync::Mutex::new(Arc::new(config_of(&server).await)));
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        probes.recheck_with({
            let (probes, files, asked) = (
                Arc::downgrade(&probes),
                Arc::clone(&files),
                Arc::clone(&asked),
            );
            Arc::new(move |names: Vec<String>| {
                assert_eq!(names, ["a"]);
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (probes, files) = (probes.clone(), Arc::clone(&files));
                Box::pin(async move {
                    let config = Arc::clone(&*files.lock().await);
                    if let Some(probes) = probes.upgrade() {
                        probes.sync(&[Remote::new("a", config)]).expect("sync");
                    }
                })
            })
        });
        probes
            .sync(&[Remote::new("a", Arc::clone(&*files.lock().await))])
            .expect("sync");
        let up = next_transition(&mut rx, "first success").await;
        assert_eq!(up.to, Reachability::Reachable);

        {
            let mut held = files.lock().await;
            server.rotate(rotation).expect("rotate");
            *held = Arc::new(config_of(&server).await);
        }
        timeout(DEADLINE, async {
            while asked.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{rotation:?}: no recheck was asked"));
        let answered = server.requests("/readyz");
        timeout(DEADLINE, async {
            while server.requests("/readyz") < answered + 5 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("probes go on");
        let status = &handle.status()[0];
        assert_eq!(status.state, Reachability::Reachable, "{rotation:?}");
        assert_eq!(status.consecutive_failures, 0, "{rotation:?}");
        assert!(
            rx.try_recv().is_err(),
            "{rotation:?}: a rotation made a transition"
        );
    }
}
