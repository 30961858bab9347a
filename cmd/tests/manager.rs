//! The built-in watch manager under the real supervisor, in process.

use std::time::Duration;

mod common;

use common::{comes_down_to, start_in_process};
use tether_probes::ProbeConfig;
use tether_supervisor::Cause;
use tether_testkit::{ApiServer, Options};
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
    let (status, handle, root, run) = (
        stack.status.clone(),
        stack.manager.clone(),
        stack.root.clone(),
        stack.run,
    );

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
            handle.end_cycle(Cause::ConfigChanged);
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
