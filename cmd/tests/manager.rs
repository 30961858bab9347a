//! The built-in watch manager under the real supervisor, in process.

use std::time::Duration;

mod common;

use common::{comes_down_to, start_in_process};
use tether_probes::ProbeConfig;
use tether_supervisor::Cause;
use tether_testkit::{ApiServer, Fault, Options};
use tokio::time::{Instant, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_task_outlives_its_cycle_across_fifty_cycles() {
    let servers = [
        ApiServer::start(Options::default()).await.expect("server"),
        ApiServer::start(Options::default()).await.expect("server"),
    ];
    let stack = start_in_process(
        &[("r0", &servers[0]), ("r1", &servers[1])],
        ProbeConfig::default(),
    )
    .await;
    let (status, root, run) = (stack.status.clone(), stack.root.clone(), stack.run);

    let metrics = tokio::runtime::Handle::current().metrics();
    let mut alive = Vec::new();
    // Fifty cycles are ended; the count at the end is taken with the
    // fifty-first up.
    for cycle in 1..=51u64 {
        // Up, with this cycle's watch open on each server: the manager
        // reports up between its list and its watch, so a count taken
        // before the watches open is a few tasks short.
        let started = Instant::now();
        while !(status.status().cycle == cycle
            && status.status().manager_up
            && servers.iter().all(|s| s.stats().open_watches == 1))
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cycle {cycle} never came up with one watch open on each server"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        alive.push(metrics.num_alive_tasks());
        if cycle <= 50 {
            assert!(status.end_cycle(Cause::ConfigChanged));
        }
    }
    // After fifty cycles, the live tasks must come back to the most seen in
    // cycles 3-12: the reflectors of ended cycles are all gone. An old
    // cycle's client tasks end a moment after it does; a leak never ends.
    let early = *alive[2..12].iter().max().expect("samples");
    if let Err(now) = comes_down_to(early, || metrics.num_alive_tasks()).await {
        panic!("live tasks grew from at most {early} (cycles 3-12) to {now}: {alive:?}");
    }
    assert!(
        servers.iter().all(|s| s.stats().open_watches <= 1),
        "old watches still open"
    );
    root.cancel();
    let outcome = timeout(Duration::from_secs(10), run)
        .await
        .expect("shutdown")
        .expect("no panic");
    assert_eq!(outcome, tether_supervisor::ShutdownOutcome::Clean);
}

/// Waits until `done` holds, for up to 20s; panics naming `what`.
async fn until(what: &str, done: impl Fn() -> bool) {
    common::until(what, Duration::from_secs(20), async || done().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_an_optional_remote_restarts_only_its_own_watches() {
    let required = ApiServer::start(Options::default()).await.expect("server");
    let optional = ApiServer::start(Options::default()).await.expect("server");
    let stack = common::start_in_process_with(
        &[("req", &required, true), ("opt", &optional, false)],
        ProbeConfig::default()
            .with_interval(Duration::from_millis(100))
            .with_timeout(Duration::from_millis(50))
            .with_jitter(0.0),
    )
    .await;
    let (status, manager) = (stack.status.clone(), stack.manager.clone());
    let synced = |remote: &str| {
        manager
            .caches()
            .get(&(remote.to_owned(), "configmaps".to_owned()))
            .is_some_and(|cache| cache.synced)
    };
    until("both watches open, the manager up", || {
        status.status().manager_up
            && required.stats().open_watches == 1
            && optional.stats().open_watches == 1
    })
    .await;
    let accepted = required.stats().connections_accepted;
    let relists = required.requests("/api/v1/configmaps");

    optional.set_fault(Fault::Refuse).await.expect("refuse");
    // The supervisor records the stop before the part's reflectors have
    // ended; the caches are marked unsynced as they end.
    until(
        "the optional remote's part stopped, its cache no longer synced",
        || status.status().stopped_remotes == ["opt"] && !synced("opt"),
    )
    .await;
    assert_eq!(
        status.status().cycle,
        1,
        "an optional remote ended the cycle"
    );
    assert!(status.status().manager_up);

    optional.set_fault(Fault::Up).await.expect("up");
    until("the optional remote's cache synced again", || {
        synced("opt") && optional.stats().open_watches == 1
    })
    .await;
    let now = status.status();
    assert_eq!(now.cycle, 1, "the recovery ended the cycle");
    assert!(now.stopped_remotes.is_empty() && now.manager_up);
    assert_eq!(
        required.stats().connections_accepted,
        accepted,
        "the required remote's connections were reopened"
    );
    assert_eq!(
        required.requests("/api/v1/configmaps"),
        relists,
        "the required remote was listed again"
    );
    assert_eq!(required.stats().open_watches, 1);
    let restarts = stack
        .registry
        .gather()
        .into_iter()
        .find(|f| f.name() == "tether_remote_restarts_total")
        .expect("registered")
        .get_metric()
        .iter()
        .filter(|m| m.get_label().iter().any(|l| l.value() == "opt"))
        .map(|m| {
            let cause = m
                .get_label()
                .iter()
                .find(|l| l.name() == "cause")
                .map(|l| l.value().to_owned());
            (cause.expect("a cause label"), m.get_counter().get_value())
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    assert_eq!(restarts.get("remote_lost"), Some(&1.0), "{restarts:?}");
    assert_eq!(restarts.get("remote_recovered"), Some(&0.0), "{restarts:?}");

    stack.shuts_down_cleanly().await;
}

/// A watch that failed for a moment, on a remote the probes never lost,
/// is current again once the remote answers, though no object changed: a
/// resumed watch says nothing until one does, so the retry lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_failed_briefly_is_current_again_with_nothing_changed() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let stack =
        common::start_in_process_with(&[("req", &server, true)], ProbeConfig::default()).await;
    let (status, manager) = (stack.status.clone(), stack.manager.clone());
    let cache = || {
        manager
            .caches()
            .get(&("req".to_owned(), "configmaps".to_owned()))
            .copied()
            .unwrap_or_default()
    };
    until("the manager up, its watch open", || {
        status.status().manager_up && server.stats().open_watches == 1
    })
    .await;
    let lists = server.requests("/api/v1/configmaps");

    server.set_fault(Fault::Refuse).await.expect("refuse");
    until("the watch failing", || cache().failing_since.is_some()).await;
    server.set_fault(Fault::Up).await.expect("up");
    until("the watch working again, with no object changed", || {
        cache().failing_since.is_none() && cache().current()
    })
    .await;
    assert_eq!(
        server.requests("/api/v1/configmaps"),
        lists + 1,
        "the retry listed once"
    );
    let now = status.status();
    assert!(now.manager_up, "the manager went down");
    assert_eq!(now.cycle, 1, "a moment's failure ended the cycle");

    stack.shuts_down_cleanly().await;
}
