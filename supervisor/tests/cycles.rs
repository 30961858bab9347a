//! The cycle loop, driven through its public API on tokio's paused clock.
//!
//! A scripted factory plays one [`Step`] per cycle and reports every build,
//! with its token and the (paused) time, so each test can act on a cycle and
//! measure the waits between builds exactly.

// Metric values compared here are small integers and whole seconds, which f64
// represents exactly.
#![allow(clippy::float_cmp)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Registry;
use tether_supervisor::{
    BackoffConfig, Cause, CauseKind, CycleToken, Error, ManagerError, ManagerFactory, Phase,
    RECENT_CYCLES, ShutdownOutcome, Status, Supervisor, SupervisorConfig, SupervisorHandle,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

mod common;

use common::DEADLOCK;

/// What the manager of one cycle does. Cycles past the script run until
/// cancelled.
#[derive(Debug, Clone)]
enum Step {
    /// Reports up, runs until cancelled, then returns `Ok`.
    RunUntilCancelled,
    /// Runs this long, then returns `Ok` without being cancelled.
    ExitAfter(Duration),
    /// Runs this long, then returns an error.
    FailAfter(Duration),
    /// Runs this long, then panics.
    PanicAfter(Duration),
    /// Fails to build.
    BuildFail,
    /// Once cancelled, takes this long to return.
    SlowShutdown(Duration),
    /// Never returns; sets the flag when its future is dropped.
    Hang(Arc<AtomicBool>),
}

#[derive(Debug)]
struct Built {
    token: CycleToken,
    at: Instant,
}

#[derive(Debug)]
struct Scripted {
    steps: Mutex<VecDeque<Step>>,
    built: mpsc::UnboundedSender<Built>,
}

#[derive(Debug, thiserror::Error)]
#[error("watch stream ended")]
struct WatchEnded(#[source] std::io::Error);

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl ManagerFactory for Scripted {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let step = self
            .steps
            .lock()
            .expect("no test panics while holding the script")
            .pop_front()
            .unwrap_or(Step::RunUntilCancelled);
        // The receiver may be gone once the test has what it needs.
        let _ = self.built.send(Built {
            token: cycle.clone(),
            at: Instant::now(),
        });
        // Sleeps here model how long a manager lives, on the paused clock.
        match step {
            Step::RunUntilCancelled => {
                cycle.set_manager_up(true);
                cycle.cancelled().await;
                Ok(())
            }
            Step::ExitAfter(life) => {
                tokio::time::sleep(life).await;
                Ok(())
            }
            Step::FailAfter(life) => {
                tokio::time::sleep(life).await;
                Err(ManagerError::failed(WatchEnded(std::io::Error::other(
                    "connection refused",
                ))))
            }
            Step::PanicAfter(life) => {
                tokio::time::sleep(life).await;
                panic!("manager {} panicked", cycle.number());
            }
            Step::BuildFail => Err(ManagerError::build(std::io::Error::other(
                "kubeconfig has no current context",
            ))),
            Step::SlowShutdown(drain) => {
                cycle.cancelled().await;
                tokio::time::sleep(drain).await;
                Ok(())
            }
            Step::Hang(dropped) => {
                let _guard = SetOnDrop(dropped);
                std::future::pending().await
            }
        }
    }
}

struct Harness {
    root: CancellationToken,
    handle: SupervisorHandle,
    registry: Registry,
    built: mpsc::UnboundedReceiver<Built>,
    run: JoinHandle<ShutdownOutcome>,
}

/// Defaults, but without jitter, so every wait is exact.
fn exact() -> SupervisorConfig {
    SupervisorConfig::default().with_backoff(BackoffConfig::default().with_jitter(0.0))
}

fn start(steps: impl IntoIterator<Item = Step>, config: SupervisorConfig) -> Harness {
    let (tx, built) = mpsc::unbounded_channel();
    let factory = Scripted {
        steps: Mutex::new(steps.into_iter().collect()),
        built: tx,
    };
    let registry = Registry::new();
    let supervisor = Supervisor::new(factory, config, &registry).expect("valid config");
    let handle = supervisor.handle();
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));
    Harness {
        root,
        handle,
        registry,
        built,
        run,
    }
}

impl Harness {
    async fn next_build(&mut self) -> Built {
        timeout(DEADLOCK, self.built.recv())
            .await
            .expect("no build within the deadline: supervisor loop deadlocked?")
            .expect("the supervisor stopped building")
    }

    /// Cancels root and waits for the loop to return.
    async fn shut_down(&mut self) -> ShutdownOutcome {
        self.root.cancel();
        timeout(DEADLOCK, &mut self.run)
            .await
            .expect("supervisor did not stop: shutdown deadlocked?")
            .expect("the supervisor task does not panic")
    }

    /// Asserts that no build happened, and none can happen any more.
    async fn assert_no_more_builds(&mut self) {
        assert!(
            self.built.recv().await.is_none(),
            "a manager was built after shutdown"
        );
    }

    async fn until(&self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        common::until(&self.handle, what, pred).await
    }

    fn value(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        let labels: Vec<(&str, &str)> = label.into_iter().collect();
        common::metric(&self.registry, name, &labels)
            .unwrap_or_else(|| panic!("{name} has no series {label:?}"))
    }

    fn ended(&self, kind: CauseKind) -> f64 {
        self.value("tether_cycles_total", Some(("cause", kind.as_str())))
    }
}

fn seconds(gaps: &[Duration]) -> Vec<f64> {
    gaps.iter().map(Duration::as_secs_f64).collect()
}

#[tokio::test(start_paused = true)]
async fn internal_cancel_rebuilds_the_manager_and_records_the_cause() {
    let mut h = start([], exact());
    let first = h.next_build().await;
    assert_eq!(first.token.number(), 1);

    let cancelled_at = Instant::now();
    assert!(first.token.cancel(Cause::remote_lost("cluster-a")));
    let second = h.next_build().await;

    assert_eq!(second.token.number(), 2);
    assert_eq!(second.at - cancelled_at, Duration::from_secs(1));
    assert!(!h.root.is_cancelled());
    let status = h.handle.status();
    assert_eq!(status.last_cause(), Some(&Cause::remote_lost("cluster-a")));
    assert_eq!(status.cycle, 2);
    assert_eq!(h.ended(CauseKind::RemoteLost), 1.0);
    assert_eq!(h.value("tether_cycle", None), 2.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn cancelling_root_stops_the_loop_and_nothing_is_built_after_it() {
    let mut h = start([], exact());
    let first = h.next_build().await;

    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);

    h.assert_no_more_builds().await;
    assert_eq!(first.token.cause(), Some(&Cause::Shutdown));
    assert_eq!(h.ended(CauseKind::Shutdown), 1.0);
    let status = h.handle.status();
    assert_eq!(status.phase, Phase::Stopped);
    assert!(!status.manager_up);
    assert_eq!(h.value("tether_manager_up", None), 0.0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_backoff_cuts_the_wait_short() {
    let config = exact().with_backoff(
        BackoffConfig::default()
            .with_initial(Duration::from_secs(10))
            .with_jitter(0.0),
    );
    let mut h = start([Step::FailAfter(Duration::ZERO)], config);
    h.next_build().await;
    h.until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    assert_eq!(h.value("tether_supervisor_backoff_seconds", None), 10.0);

    let asked = Instant::now();
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);

    assert_eq!(
        asked.elapsed(),
        Duration::ZERO,
        "shutdown waited out the backoff"
    );
    h.assert_no_more_builds().await;
    assert_eq!(h.value("tether_supervisor_backoff_seconds", None), 0.0);
}

#[tokio::test(start_paused = true)]
async fn each_cycle_gets_a_fresh_token_and_cancelling_it_never_cancels_root() {
    let mut h = start([], exact());
    let first = h.next_build().await;
    first.token.cancel(Cause::ConfigChanged);
    let second = h.next_build().await;

    assert!(first.token.is_cancelled());
    assert!(
        !second.token.is_cancelled(),
        "the new cycle inherited a cancel"
    );
    assert_eq!(second.token.cause(), None);
    assert!(!h.root.is_cancelled());

    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
    assert!(
        second.token.is_cancelled(),
        "root's cancel did not reach the cycle"
    );
}

#[tokio::test(start_paused = true)]
async fn the_first_cause_wins() {
    let mut h = start([], exact());
    let first = h.next_build().await;

    assert!(first.token.cancel(Cause::remote_lost("cluster-a")));
    assert!(!first.token.cancel(Cause::ConfigChanged));
    h.next_build().await;

    // The manager returned Ok after the cancel: that is not `manager_exited`.
    assert_eq!(first.token.cause(), Some(&Cause::remote_lost("cluster-a")));
    assert_eq!(h.ended(CauseKind::RemoteLost), 1.0);
    assert_eq!(h.ended(CauseKind::ConfigChanged), 0.0);
    assert_eq!(h.ended(CauseKind::ManagerExited), 0.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_failed_manager_is_rebuilt_after_a_backoff() {
    let mut h = start([Step::FailAfter(Duration::from_secs(5))], exact());
    let first = h.next_build().await;
    let second = h.next_build().await;

    assert_eq!(second.at - first.at, Duration::from_secs(5 + 1));
    assert_eq!(
        first.token.cause(),
        Some(&Cause::ManagerFailed {
            error: "watch stream ended: connection refused".into()
        })
    );
    assert_eq!(h.ended(CauseKind::ManagerFailed), 1.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_manager_is_rebuilt_and_the_loop_survives() {
    let panics = std::iter::repeat_n(Step::PanicAfter(Duration::ZERO), 3);
    let mut h = start(panics, exact());
    let mut builds = Vec::new();
    for _ in 0..4 {
        builds.push(h.next_build().await);
    }

    assert_eq!(h.ended(CauseKind::ManagerPanicked), 3.0);
    assert_eq!(
        builds[2].token.cause(),
        Some(&Cause::ManagerPanicked {
            message: "manager 3 panicked".into()
        })
    );
    assert!(!h.run.is_finished());
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_failing_build_is_counted_as_build_failed() {
    let mut h = start([Step::BuildFail], exact());
    let first = h.next_build().await;
    let second = h.next_build().await;

    assert_eq!(second.at - first.at, Duration::from_secs(1));
    assert_eq!(
        first.token.cause(),
        Some(&Cause::BuildFailed {
            error: "kubeconfig has no current context".into()
        })
    );
    assert_eq!(h.ended(CauseKind::BuildFailed), 1.0);
    assert_eq!(h.ended(CauseKind::ManagerFailed), 0.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_returns_uncancelled_ends_its_cycle_as_manager_exited() {
    let mut h = start([Step::ExitAfter(Duration::from_secs(3))], exact());
    let first = h.next_build().await;
    h.next_build().await;

    assert_eq!(first.token.cause(), Some(&Cause::ManagerExited));
    assert!(
        first.token.is_cancelled(),
        "an ended cycle's token stays live"
    );
    assert_eq!(h.ended(CauseKind::ManagerExited), 1.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

/// Measures the waits between consecutive builds when every cycle fails at
/// once, so each wait is the backoff alone.
async fn waits_between_failing_cycles(config: SupervisorConfig, failures: usize) -> Vec<Duration> {
    let steps = std::iter::repeat_n(Step::FailAfter(Duration::ZERO), failures);
    let mut h = start(steps, config);
    let mut last = h.next_build().await.at;
    let mut waits = Vec::new();
    for _ in 0..failures {
        let next = h.next_build().await.at;
        waits.push(next - last);
        last = next;
    }
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
    waits
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_with_consecutive_short_cycles_up_to_the_cap() {
    let waits = waits_between_failing_cycles(exact(), 8).await;
    assert_eq!(
        seconds(&waits),
        [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_default_jitter_every_wait_stays_within_twenty_percent() {
    let waits = waits_between_failing_cycles(SupervisorConfig::default(), 8).await;
    println!("observed waits with jitter 0.2: {:?}", seconds(&waits));
    for (wait, base) in waits
        .iter()
        .zip([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0])
    {
        let wait = wait.as_secs_f64();
        assert!(
            (base * 0.8..=base * 1.2).contains(&wait),
            "wait {wait}s is not within 20% of {base}s"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn backoff_resets_after_a_stable_cycle() {
    let steps = [
        Step::FailAfter(Duration::ZERO),
        Step::FailAfter(Duration::ZERO),
        Step::ExitAfter(Duration::from_secs(60)),
        Step::FailAfter(Duration::ZERO),
    ];
    let mut h = start(steps, exact());
    let mut at = Vec::new();
    for _ in 0..5 {
        at.push(h.next_build().await.at);
    }
    let gaps: Vec<_> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // 1s, 2s, then the 60s cycle is stable: back to 1s, then 2s.
    assert_eq!(seconds(&gaps), [1.0, 2.0, 60.0 + 1.0, 2.0]);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn backoff_does_not_reset_after_a_short_cycle() {
    let steps = [
        Step::FailAfter(Duration::ZERO),
        Step::FailAfter(Duration::ZERO),
        Step::ExitAfter(Duration::from_secs(59)),
    ];
    let mut h = start(steps, exact());
    let mut at = Vec::new();
    for _ in 0..4 {
        at.push(h.next_build().await.at);
    }
    let gaps: Vec<_> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(seconds(&gaps), [1.0, 2.0, 59.0 + 4.0]);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_manager_within_the_grace_period() {
    let mut h = start([Step::SlowShutdown(Duration::from_secs(5))], exact());
    h.next_build().await;

    let asked = Instant::now();
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
    assert_eq!(asked.elapsed(), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_overruns_the_grace_period_is_reported_and_dropped() {
    let dropped = Arc::new(AtomicBool::new(false));
    let config = exact().with_shutdown_grace(Duration::from_secs(30));
    let mut h = start([Step::Hang(Arc::clone(&dropped))], config);
    h.next_build().await;

    let asked = Instant::now();
    assert_eq!(h.shut_down().await, ShutdownOutcome::GraceExceeded);
    assert_eq!(asked.elapsed(), Duration::from_secs(30));
    assert!(
        dropped.load(Ordering::SeqCst),
        "the hung manager outlived run()"
    );
    assert_eq!(h.handle.status().phase, Phase::Stopped);
}

#[tokio::test(start_paused = true)]
async fn manager_up_follows_the_current_cycle_only() {
    let mut h = start([], exact());
    let first = h.next_build().await;
    h.until("manager up", |s| s.manager_up).await;
    assert_eq!(h.value("tether_manager_up", None), 1.0);

    first.token.cancel(Cause::ConfigChanged);
    let status = h
        .until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    assert!(!status.manager_up);
    assert_eq!(h.value("tether_manager_up", None), 0.0);
    assert!(
        !first.token.set_manager_up(true),
        "an ended cycle reported itself up"
    );
    assert!(!h.handle.status().manager_up);

    let second = h.next_build().await;
    h.until("second manager up", |s| s.manager_up).await;
    assert!(
        !first.token.set_manager_up(false),
        "an old cycle changed the new cycle's state"
    );
    assert!(h.handle.status().manager_up);
    assert!(second.token.set_manager_up(false));
    assert_eq!(h.value("tether_manager_up", None), 0.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_advances_while_a_manager_runs_and_while_backing_off() {
    let config = exact().with_backoff(
        BackoffConfig::default()
            .with_initial(Duration::from_secs(20))
            .with_jitter(0.0),
    );
    let mut h = start([], config);
    let first = h.next_build().await;
    let start = h.handle.status().heartbeat;

    tokio::time::advance(Duration::from_secs(10)).await;
    h.until("a beat while running", |s| {
        s.heartbeat >= start + Duration::from_secs(10)
    })
    .await;

    first.token.cancel(Cause::ConfigChanged);
    h.until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    let backing_off = h.handle.status().heartbeat;
    tokio::time::advance(Duration::from_secs(10)).await;
    h.until("a beat while backing off", |s| {
        s.heartbeat >= backing_off + Duration::from_secs(10)
    })
    .await;
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn status_counts_ended_cycles_by_cause() {
    let mut h = start([Step::BuildFail, Step::FailAfter(Duration::ZERO)], exact());
    for _ in 0..3 {
        h.next_build().await;
    }
    let status = h.handle.status();
    assert_eq!(status.ended[&CauseKind::BuildFailed], 1);
    assert_eq!(status.ended[&CauseKind::ManagerFailed], 1);
    assert_eq!(status.ended[&CauseKind::RemoteLost], 0);
    assert_eq!(status.ended.len(), CauseKind::ALL.len());
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn the_timeline_keeps_the_last_cycles_with_their_times_causes_and_backoffs() {
    let mut h = start([], exact());
    let first = h.next_build().await;
    h.until("manager up", |s| s.manager_up).await;
    let up = h.handle.status().up_since.expect("up, since when");
    assert_eq!(up, first.at, "up as soon as it was built");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(first.token.cancel(Cause::remote_lost("cluster-a")));
    let status = h
        .until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    assert_eq!(status.up_since, None, "not up between cycles");
    let ended = status.last_ended().expect("cycle 1 ended").clone();
    assert_eq!(ended.number, 1);
    assert_eq!(ended.cause, Cause::remote_lost("cluster-a"));
    assert_eq!(ended.lifetime(), Duration::from_secs(5));
    assert_eq!(ended.backoff, Some(Duration::from_secs(1)));

    // Past the ring's size, the oldest go first.
    for n in 2..=RECENT_CYCLES as u64 + 5 {
        let built = h.next_build().await;
        assert_eq!(built.token.number(), n);
        built.token.cancel(Cause::ConfigChanged);
    }
    let status = h
        .until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    let numbers: Vec<u64> = status.recent.iter().map(|c| c.number).collect();
    let last = RECENT_CYCLES as u64 + 5;
    assert_eq!(
        numbers,
        (last + 1 - RECENT_CYCLES as u64..=last).collect::<Vec<_>>()
    );
    assert_eq!(status.last_cause(), Some(&Cause::ConfigChanged));
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[test]
fn every_cause_is_exported_at_zero_before_any_cycle_ends() {
    let registry = Registry::new();
    let (tx, _rx) = mpsc::unbounded_channel();
    let factory = Scripted {
        steps: Mutex::default(),
        built: tx,
    };
    let _supervisor = Supervisor::new(factory, exact(), &registry).expect("valid config");
    let families = registry.gather();
    let cycles = families
        .iter()
        .find(|f| f.name() == "tether_cycles_total")
        .expect("tether_cycles_total is registered");
    let mut labels: Vec<_> = cycles
        .get_metric()
        .iter()
        .map(|m| {
            assert_eq!(m.get_counter().get_value(), 0.0);
            m.get_label()[0].value().to_owned()
        })
        .collect();
    labels.sort();
    let mut expected: Vec<_> = CauseKind::ALL
        .iter()
        .map(|k| k.as_str().to_owned())
        .collect();
    expected.sort();
    assert_eq!(labels, expected);
    for name in [
        "tether_cycle",
        "tether_manager_up",
        "tether_supervisor_backoff_seconds",
    ] {
        assert!(families.iter().any(|f| f.name() == name), "{name} missing");
    }
}

#[test]
fn a_registry_that_already_has_the_metrics_is_a_clear_error() {
    let registry = Registry::new();
    let make = || {
        let (tx, _rx) = mpsc::unbounded_channel();
        Scripted {
            steps: Mutex::default(),
            built: tx,
        }
    };
    let _first = Supervisor::new(make(), exact(), &registry).expect("first registration");
    let err = Supervisor::new(make(), exact(), &registry).expect_err("second registration");
    assert!(matches!(err, Error::RegisterMetrics(_)), "{err:?}");
}

#[test]
fn an_invalid_config_is_rejected_with_the_field() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let factory = Scripted {
        steps: Mutex::default(),
        built: tx,
    };
    let config = exact().with_backoff(BackoffConfig::default().with_jitter(1.5));
    let err = Supervisor::new(factory, config, &Registry::new()).expect_err("jitter 1.5");
    assert_eq!(err.to_string(), "backoff.jitter: must be in [0, 1)");
}
