//! What ends a cycle, as inputs of the supervisor: remote signals, the
//! handle's `end_cycle`, and per-remote scopes inside a cycle. All on
//! tokio's paused clock.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Registry;
use tether_supervisor::{
    BackoffConfig, Cause, CauseKind, CycleToken, ManagerError, ManagerFactory, Phase, RemoteChange,
    RemoteScope, RemoteSignal, ShutdownOutcome, Status, Supervisor, SupervisorConfig,
    SupervisorHandle, UsedRemote, UsedRemotes,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

mod common;

use common::DEADLOCK;

/// One run of one remote's part, as the manager saw it begin.
#[derive(Debug)]
struct Run {
    cycle: u64,
    remote: String,
    token: CancellationToken,
}

/// A manager that declares `used` and runs one task per used remote, which
/// reports every run of that remote's scope.
struct Scoped {
    used: Arc<Mutex<UsedRemotes>>,
    /// Its answer to `waits_for_lost_remotes`.
    waits: bool,
    /// Its answer to `takes_remote_changes`.
    takes: bool,
    cycles: mpsc::UnboundedSender<CycleToken>,
    runs: mpsc::UnboundedSender<Run>,
}

impl ManagerFactory for Scoped {
    fn remotes(&self) -> UsedRemotes {
        self.used
            .lock()
            .expect("no test panics while holding it")
            .clone()
    }

    fn waits_for_lost_remotes(&self) -> bool {
        self.waits
    }

    fn takes_remote_changes(&self, _: &Cause) -> bool {
        self.takes
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let _ = self.cycles.send(cycle.clone());
        cycle.set_manager_up(true);
        let names: Vec<String> = match self.remotes() {
            UsedRemotes::All => Vec::new(),
            UsedRemotes::Only(used) => used.into_iter().map(|r| r.name).collect(),
        };
        let mut parts = tokio::task::JoinSet::new();
        let part = |mut scope: RemoteScope| {
            let runs = self.runs.clone();
            let number = cycle.number();
            async move {
                while let Some(token) = scope.next_run().await {
                    let _ = runs.send(Run {
                        cycle: number,
                        remote: scope.remote().to_owned(),
                        token: token.clone(),
                    });
                    token.cancelled().await;
                }
                // The scope ended: the remote was removed, or the cycle ended.
                let _ = runs.send(Run {
                    cycle: number,
                    remote: format!("{} ended", scope.remote()),
                    token: CancellationToken::new(),
                });
            }
        };
        for name in names {
            parts.spawn(part(
                cycle.scope(&name).expect("a declared remote has a scope"),
            ));
        }
        while let Some(scope) = cycle.joined().await {
            parts.spawn(part(scope));
        }
        // `joined` ends at once for a cycle without scopes.
        cycle.cancelled().await;
        while parts.join_next().await.is_some() {}
        Ok(())
    }
}

struct Harness {
    used: Arc<Mutex<UsedRemotes>>,
    signals: mpsc::UnboundedSender<RemoteSignal>,
    changes: mpsc::UnboundedSender<Cause>,
    cycles: mpsc::UnboundedReceiver<CycleToken>,
    runs: mpsc::UnboundedReceiver<Run>,
    handle: SupervisorHandle,
    registry: Registry,
    root: CancellationToken,
    run: JoinHandle<ShutdownOutcome>,
}

/// Longer than the default backoff's cap.
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

fn config() -> SupervisorConfig {
    SupervisorConfig::default().with_backoff(BackoffConfig::default().with_jitter(0.0))
}

fn start(used: UsedRemotes, config: SupervisorConfig) -> Harness {
    start_with(used, config, false)
}

fn start_with(used: UsedRemotes, config: SupervisorConfig, waits: bool) -> Harness {
    start_taking(used, config, waits, false)
}

/// The receiver as a stream.
fn stream<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

fn start_taking(used: UsedRemotes, config: SupervisorConfig, waits: bool, takes: bool) -> Harness {
    let (cycles_tx, cycles) = mpsc::unbounded_channel();
    let (runs_tx, runs) = mpsc::unbounded_channel();
    let (signals, rx) = mpsc::unbounded_channel();
    let (changes, changes_rx) = mpsc::unbounded_channel();
    let registry = Registry::new();
    let used = Arc::new(Mutex::new(used));
    let supervisor = Supervisor::new(
        Scoped {
            used: Arc::clone(&used),
            waits,
            takes,
            cycles: cycles_tx,
            runs: runs_tx,
        },
        config,
        &registry,
    )
    .expect("valid config")
    .end_cycles_on(stream(rx))
    .change_remotes_on(stream(changes_rx));
    let handle = supervisor.handle();
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));
    Harness {
        used,
        signals,
        changes,
        cycles,
        runs,
        handle,
        registry,
        root,
        run,
    }
}

fn lost(remote: &str) -> RemoteSignal {
    RemoteSignal::Lost(remote.to_owned())
}

fn recovered(remote: &str) -> RemoteSignal {
    RemoteSignal::Recovered(remote.to_owned())
}

impl Harness {
    async fn next_cycle(&mut self) -> CycleToken {
        timeout(DEADLOCK, self.cycles.recv())
            .await
            .expect("no cycle within the deadline: supervisor loop deadlocked?")
            .expect("the supervisor stopped building")
    }

    async fn next_run(&mut self) -> Run {
        timeout(DEADLOCK, self.runs.recv())
            .await
            .expect("no run of a remote's part within the deadline: deadlocked?")
            .expect("the manager is gone")
    }

    fn send(&self, signal: RemoteSignal) {
        self.signals.send(signal).expect("the supervisor listens");
    }

    /// The manager uses `now` from here on, for `cause`.
    fn change(&self, now: Vec<UsedRemote>, cause: Cause) {
        *self.used.lock().expect("not poisoned") = UsedRemotes::Only(now);
        self.changes.send(cause).expect("the supervisor listens");
    }

    fn changes(&self, change: RemoteChange, cause: CauseKind) -> f64 {
        common::metric(
            &self.registry,
            "tether_remote_changes_total",
            &[("change", change.as_str()), ("cause", cause.as_str())],
        )
        .expect("every change and cause is exported")
    }

    /// Lets the loop take what was sent, on the paused clock.
    async fn settle(&self) {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    async fn until(&self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        common::until(&self.handle, what, pred).await
    }

    fn ended(&self, kind: CauseKind) -> f64 {
        common::metric(
            &self.registry,
            "tether_cycles_total",
            &[("cause", kind.as_str())],
        )
        .expect("every cause is exported")
    }

    fn restarts(&self, remote: &str, cause: CauseKind) -> Option<f64> {
        common::metric(
            &self.registry,
            "tether_remote_restarts_total",
            &[("remote", remote), ("cause", cause.as_str())],
        )
    }

    async fn shut_down(mut self) -> ShutdownOutcome {
        self.root.cancel();
        timeout(DEADLOCK, &mut self.run)
            .await
            .expect("shutdown deadlocked?")
            .expect("the supervisor task does not panic")
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_remote_ends_the_cycle_and_a_loss_between_cycles_does_not_end_the_next() {
    let mut h = start(UsedRemotes::All, config());
    let first = h.next_cycle().await;
    h.send(lost("a"));
    let second = h.next_cycle().await;
    assert_eq!(first.cause(), Some(&Cause::remote_lost("a")));

    // Lost while the third cycle was not yet built: not news to it.
    second.cancel(Cause::ConfigChanged);
    h.until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    h.send(lost("b"));
    let third = h.next_cycle().await;
    h.settle().await;
    assert!(
        !third.is_cancelled(),
        "a loss from before the cycle ended it: a rebuild storm"
    );

    h.send(recovered("b"));
    let fourth = h.next_cycle().await;
    assert_eq!(third.cause(), Some(&Cause::remote_recovered("b")));
    assert_eq!(fourth.number(), 4);
    assert_eq!(h.ended(CauseKind::RemoteLost), 1.0);
    assert_eq!(h.ended(CauseKind::RemoteRecovered), 1.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_waits_for_lost_remotes_runs_only_while_none_is_lost() {
    let mut h = start_with(UsedRemotes::All, config(), true);
    let first = h.next_cycle().await;
    h.send(lost("a"));
    h.send(lost("b"));
    // Past any backoff, on the paused clock: the cycle is built, and waits.
    tokio::time::sleep(BACKOFF_MAX).await;
    // What it waits for is in its status, for the status page to say.
    h.until("the second cycle, held for a and b", |s| {
        s.cycle == 2 && s.held_for == ["a", "b"]
    })
    .await;
    h.send(recovered("a"));
    h.settle().await;
    assert!(h.cycles.try_recv().is_err(), "ran while a remote was lost");
    assert_eq!(first.cause(), Some(&Cause::remote_lost("a")));
    assert_eq!(h.handle.status().held_for, ["b"]);

    // The last one back: the same cycle runs, with no rebuild.
    h.send(recovered("b"));
    let second = h.next_cycle().await;
    assert_eq!(second.number(), 2);
    h.settle().await;
    assert!(!second.is_cancelled());
    assert_eq!(h.ended(CauseKind::RemoteRecovered), 0.0);
    assert!(h.handle.status().held_for.is_empty(), "it runs");

    // A reload while it waits ends the cycle; no manager ran in it.
    h.send(lost("a"));
    tokio::time::sleep(BACKOFF_MAX).await;
    h.until("the third cycle", |s| s.cycle == 3).await;
    h.settle().await;
    assert!(h.handle.end_cycle(Cause::ConfigChanged));
    tokio::time::sleep(BACKOFF_MAX).await;
    h.until("the fourth cycle", |s| s.cycle == 4).await;
    h.settle().await;
    assert!(h.cycles.try_recv().is_err(), "ran while a remote was lost");
    assert_eq!(h.handle.status().held_for, ["a"], "a new cycle holds anew");
    // Missed transitions leave what is lost unknown: it runs.
    h.send(RemoteSignal::Missed(3));
    assert_eq!(h.next_cycle().await.number(), 4);

    // Shutdown while a cycle waits is clean.
    h.send(lost("a"));
    tokio::time::sleep(BACKOFF_MAX).await;
    h.until("the fifth cycle", |s| s.cycle == 5).await;
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn without_rebuild_on_recovery_a_recovery_ends_nothing() {
    let mut h = start(UsedRemotes::All, config().with_rebuild_on_recovery(false));
    let first = h.next_cycle().await;
    h.send(recovered("a"));
    h.settle().await;
    assert!(!first.is_cancelled());
    h.send(lost("a"));
    h.next_cycle().await;
    assert_eq!(first.cause(), Some(&Cause::remote_lost("a")));
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn dropped_signals_end_the_cycle_as_transitions_missed() {
    let mut h = start(UsedRemotes::All, config());
    let first = h.next_cycle().await;
    h.send(RemoteSignal::Missed(12));
    h.next_cycle().await;
    assert_eq!(first.cause(), Some(&Cause::TransitionsMissed { count: 12 }));
    assert_eq!(h.ended(CauseKind::TransitionsMissed), 1.0);
    assert_eq!(
        h.handle.status().last_cause().map(ToString::to_string),
        Some("transitions_missed (12 dropped)".to_owned())
    );
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn the_handle_ends_the_running_cycle_and_nothing_between_cycles() {
    let mut h = start(UsedRemotes::All, config());
    let first = h.next_cycle().await;
    assert!(h.handle.end_cycle(Cause::ConfigChanged));
    h.until("backing off", |s| s.phase == Phase::BackingOff)
        .await;
    assert_eq!(first.cause(), Some(&Cause::ConfigChanged));
    assert!(
        !h.handle.end_cycle(Cause::ConfigChanged),
        "ended a cycle that was not running"
    );
    let second = h.next_cycle().await;
    h.settle().await;
    assert!(!second.is_cancelled());
    assert_eq!(h.ended(CauseKind::ConfigChanged), 1.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_cycle_to_end_resolves_once_its_manager_returned() {
    let mut h = start(UsedRemotes::All, config());
    h.next_cycle().await;
    let handle = h.handle.clone();
    let waiting = tokio::spawn(async move { handle.ended(1).await });
    h.settle().await;
    assert!(!waiting.is_finished(), "cycle 1 still runs");
    assert!(h.handle.end_cycle(Cause::ConfigChanged));
    tokio::time::timeout(BACKOFF_MAX, waiting)
        .await
        .expect("resolved once cycle 1 ended")
        .expect("no panic");
    assert!(
        h.handle
            .status()
            .last_ended()
            .is_some_and(|c| c.number == 1),
        "resolved before cycle 1 was recorded as ended"
    );
    // An end already past resolves at once.
    tokio::time::timeout(Duration::from_millis(1), h.handle.ended(1))
        .await
        .expect("cycle 1 ended before");
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn signals_about_remotes_the_cycle_does_not_use_are_ignored() {
    let mut h = start(
        UsedRemotes::Only(vec![UsedRemote::ends_cycle("a")]),
        config(),
    );
    let first = h.next_cycle().await;
    h.next_run().await;
    h.send(lost("other"));
    h.send(recovered("other"));
    h.settle().await;
    assert!(!first.is_cancelled());
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn an_optional_remote_restarts_alone_and_a_required_one_ends_the_cycle() {
    let mut h = start(
        UsedRemotes::Only(vec![
            UsedRemote::ends_cycle("required"),
            UsedRemote::restarts_alone("optional"),
        ]),
        config(),
    );
    let cycle = h.next_cycle().await;
    let mut first = [h.next_run().await, h.next_run().await];
    first.sort_by(|a, b| a.remote.cmp(&b.remote));
    let [optional, required] = first;
    assert_eq!((optional.remote.as_str(), optional.cycle), ("optional", 1));
    assert_eq!(h.restarts("optional", CauseKind::RemoteLost), Some(0.0));
    assert_eq!(
        h.restarts("required", CauseKind::RemoteLost),
        None,
        "a remote that never restarts alone has no restart series"
    );

    h.send(lost("optional"));
    h.until("optional stopped", |s| s.stopped_remotes == ["optional"])
        .await;
    assert!(
        optional.token.is_cancelled(),
        "the optional part still runs"
    );
    assert!(
        !required.token.is_cancelled(),
        "the loss reached the required part"
    );
    assert!(!cycle.is_cancelled(), "an optional remote ended the cycle");
    assert_eq!(h.restarts("optional", CauseKind::RemoteLost), Some(1.0));

    h.send(recovered("optional"));
    let again = h.next_run().await;
    assert_eq!((again.remote.as_str(), again.cycle), ("optional", 1));
    assert!(!again.token.is_cancelled());
    assert!(h.handle.status().stopped_remotes.is_empty());
    assert_eq!(h.handle.status().cycle, 1);
    assert_eq!(
        h.restarts("optional", CauseKind::RemoteRecovered),
        Some(0.0),
        "restarting a stopped part is its loss's restart, not another"
    );

    h.send(lost("required"));
    h.next_cycle().await;
    assert_eq!(cycle.cause(), Some(&Cause::remote_lost("required")));
    assert!(again.token.is_cancelled() && required.token.is_cancelled());
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn an_optional_remote_down_at_the_start_restarts_its_part_when_it_recovers() {
    let mut h = start(
        UsedRemotes::Only(vec![UsedRemote::restarts_alone("optional")]),
        config(),
    );
    let cycle = h.next_cycle().await;
    let first = h.next_run().await;
    // No loss in this cycle: the remote was already down when it began.
    h.send(recovered("optional"));
    let second = h.next_run().await;
    assert!(first.token.is_cancelled(), "the old part still runs");
    assert!(!second.token.is_cancelled());
    assert!(!cycle.is_cancelled());
    assert_eq!(
        h.restarts("optional", CauseKind::RemoteRecovered),
        Some(1.0)
    );
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

#[tokio::test(start_paused = true)]
async fn restart_series_follow_the_remotes_each_cycle_uses() {
    let mut h = start(
        UsedRemotes::Only(vec![UsedRemote::restarts_alone("gone")]),
        config(),
    );
    h.next_cycle().await;
    assert_eq!(h.restarts("gone", CauseKind::RemoteLost), Some(0.0));
    *h.used.lock().expect("not poisoned") =
        UsedRemotes::Only(vec![UsedRemote::restarts_alone("new")]);
    assert!(h.handle.end_cycle(Cause::ConfigChanged));
    h.next_cycle().await;
    assert_eq!(h.restarts("gone", CauseKind::RemoteLost), None);
    assert_eq!(h.restarts("new", CauseKind::RemoteLost), Some(0.0));
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

/// A manager that takes remote changes: a remote added gets a scope and a
/// run, one removed has its run cancelled and its scope ended, one at a new
/// version runs anew, all in the same cycle; each change is counted and
/// kept for the status page.
#[tokio::test(start_paused = true)]
async fn a_manager_that_takes_remote_changes_gets_them_in_its_running_cycle() {
    let mut h = start_taking(
        UsedRemotes::Only(vec![
            UsedRemote::ends_cycle("required"),
            UsedRemote::restarts_alone("optional"),
        ]),
        config(),
        false,
        true,
    );
    let cycle = h.next_cycle().await;
    let mut first = [h.next_run().await, h.next_run().await];
    first.sort_by(|a, b| a.remote.cmp(&b.remote));
    let [optional, required] = first;

    // Added: a scope of its own, and a restart series at 0.
    h.change(
        vec![
            UsedRemote::ends_cycle("required"),
            UsedRemote::restarts_alone("optional"),
            UsedRemote::restarts_alone("new"),
        ],
        Cause::ConfigChanged,
    );
    let added = h.next_run().await;
    assert_eq!((added.remote.as_str(), added.cycle), ("new", 1));
    assert_eq!(h.restarts("new", CauseKind::RemoteLost), Some(0.0));

    // Rebuilt: a new run of that remote's part alone.
    h.change(
        vec![
            UsedRemote::ends_cycle("required"),
            UsedRemote::restarts_alone("optional").at_version(2),
            UsedRemote::restarts_alone("new"),
        ],
        Cause::ConfigChanged,
    );
    let rebuilt = h.next_run().await;
    assert_eq!(rebuilt.remote, "optional");
    assert!(optional.token.is_cancelled() && !rebuilt.token.is_cancelled());

    // Removed, by a share that moved: its run ends, and its scope with it.
    h.change(
        vec![
            UsedRemote::ends_cycle("required"),
            UsedRemote::restarts_alone("optional").at_version(2),
        ],
        Cause::ShardChanged {
            taken: 0,
            given_up: 1,
        },
    );
    assert_eq!(h.next_run().await.remote, "new ended");
    assert!(added.token.is_cancelled());
    assert_eq!(h.restarts("new", CauseKind::RemoteLost), None);

    // A removed remote's loss is no longer the cycle's business.
    h.send(lost("new"));
    h.settle().await;
    assert!(!cycle.is_cancelled(), "a change ended the cycle");
    assert!(!required.token.is_cancelled() && !rebuilt.token.is_cancelled());
    assert_eq!(h.handle.status().cycle, 1);
    assert_eq!(
        h.changes(RemoteChange::Added, CauseKind::ConfigChanged),
        1.0
    );
    assert_eq!(
        h.changes(RemoteChange::Rebuilt, CauseKind::ConfigChanged),
        1.0
    );
    assert_eq!(
        h.changes(RemoteChange::Removed, CauseKind::ShardChanged),
        1.0
    );
    let kept: Vec<_> = h
        .handle
        .status()
        .remote_changes
        .iter()
        .map(|c| (c.remote.clone(), c.change, c.cause, c.cycle))
        .collect();
    assert_eq!(
        kept,
        [
            (
                "new".to_owned(),
                RemoteChange::Added,
                CauseKind::ConfigChanged,
                1
            ),
            (
                "optional".to_owned(),
                RemoteChange::Rebuilt,
                CauseKind::ConfigChanged,
                1
            ),
            (
                "new".to_owned(),
                RemoteChange::Removed,
                CauseKind::ShardChanged,
                1
            ),
        ]
    );
    assert_eq!(h.ended(CauseKind::ConfigChanged), 0.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

/// A part stopped for its remote's loss stays stopped through a new
/// version, and starts at it when the remote is back; a change of what a
/// loss costs cannot be taken in, and ends the cycle.
#[tokio::test(start_paused = true)]
async fn a_lost_remote_read_anew_waits_for_its_recovery_and_a_new_cost_ends_the_cycle() {
    let mut h = start_taking(
        UsedRemotes::Only(vec![UsedRemote::restarts_alone("optional")]),
        config(),
        false,
        true,
    );
    let cycle = h.next_cycle().await;
    let first = h.next_run().await;
    h.send(lost("optional"));
    h.until("optional stopped", |s| s.stopped_remotes == ["optional"])
        .await;
    assert!(first.token.is_cancelled());
    h.change(
        vec![UsedRemote::restarts_alone("optional").at_version(2)],
        Cause::ConfigChanged,
    );
    h.settle().await;
    assert_eq!(
        h.handle.status().stopped_remotes,
        ["optional"],
        "a new version started a lost remote's part"
    );
    h.send(recovered("optional"));
    let back = h.next_run().await;
    assert_eq!((back.remote.as_str(), back.cycle), ("optional", 1));

    h.change(
        vec![UsedRemote::ends_cycle("optional")],
        Cause::ConfigChanged,
    );
    let second = h.next_cycle().await;
    assert_eq!(cycle.cause(), Some(&Cause::ConfigChanged));
    assert_eq!(second.number(), 2);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}

/// A manager that does not take remote changes has its cycle ended with
/// the change's cause, as before.
#[tokio::test(start_paused = true)]
async fn a_manager_that_does_not_take_remote_changes_has_its_cycle_ended() {
    let mut h = start(
        UsedRemotes::Only(vec![UsedRemote::restarts_alone("a")]),
        config(),
    );
    let cycle = h.next_cycle().await;
    h.next_run().await;
    h.change(
        vec![
            UsedRemote::restarts_alone("a"),
            UsedRemote::restarts_alone("b"),
        ],
        Cause::ShardChanged {
            taken: 1,
            given_up: 0,
        },
    );
    h.next_cycle().await;
    assert_eq!(
        cycle.cause(),
        Some(&Cause::ShardChanged {
            taken: 1,
            given_up: 0
        })
    );
    assert_eq!(h.changes(RemoteChange::Added, CauseKind::ShardChanged), 0.0);
    assert_eq!(h.shut_down().await, ShutdownOutcome::Clean);
}
