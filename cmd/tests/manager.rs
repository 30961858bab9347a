//! The built-in watch manager under the real supervisor, in process.

use std::time::Duration;

mod common;

use common::start_in_process;
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
    for cycle in 1..=50u64 {
        let started = Instant::now();
        while !(status.status().cycle == cycle && status.status().manager_up) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cycle {cycle} never came up"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        alive.push(metrics.num_alive_tasks());
        handle.end_cycle(Cause::ConfigChanged);
    }
    // Same tasks alive with the manager up in cycle 50 as in cycle 5: the
    // reflectors of 45 ended cycles are all gone.
    assert!(
        alive[49] <= alive[4],
        "live tasks grew from {} (cycle 5) to {} (cycle 50): {alive:?}",
        alive[4],
        alive[49]
    );
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
