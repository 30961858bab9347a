//! Soak: forced rebuild cycles, `remote_lost` and `remote_recovered`
//! alternating through real probe transitions (interval 100ms), with live
//! tokio tasks, open file descriptors and RSS sampled along the way. They
//! must come back to the baseline within 5%, and no watch of an old cycle may
//! stay open on the simulated servers.
//!
//! `SOAK_CYCLES` sets the count (default 100, as in scripts/test); the full
//! 1,000 is a benchmark: `SOAK_CYCLES=1000 cargo test --release -p tether
//! --test soak -- --nocapture`.

use std::time::Duration;

mod common;

use common::start_in_process;
use tether_probes::ProbeConfig;
use tether_supervisor::CauseKind;
use tether_testkit::{ApiServer, Fault, Options};
use tokio::time::{Instant, timeout};

fn cycles() -> u64 {
    std::env::var("SOAK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    cycle: u64,
    tasks: usize,
    fds: usize,
    rss_kib: u64,
}

fn sample(cycle: u64) -> Sample {
    let rss_kib = tether_testkit::procfs::status_kib(None, "VmRSS").expect("VmRSS");
    Sample {
        cycle,
        tasks: tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        fds: std::fs::read_dir("/proc/self/fd")
            .expect("/proc/self/fd")
            .count(),
        rss_kib,
    }
}

fn within_five_percent(base: usize, now: usize) -> bool {
    // Never below zero slack: a handful of tasks or fds is 5% of little.
    now <= base + (base / 20).max(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_rebuilds_leak_no_tasks_descriptors_memory_or_watches() {
    let total = cycles();
    let flaky = ApiServer::start(Options::default()).await.expect("server");
    let steady = ApiServer::start(Options::default()).await.expect("server");
    let stack = start_in_process(
        &[("flaky", &flaky), ("steady", &steady)],
        ProbeConfig::default()
            .with_interval(Duration::from_millis(100))
            .with_timeout(Duration::from_millis(50))
            .with_jitter(0.0),
    )
    .await;
    let (status, root, run) = (stack.status.clone(), stack.root.clone(), stack.run);

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut down = false;
    while status.status().cycle <= total {
        // Each loss and each recovery ends one cycle.
        let ended = status.status().ended.values().sum::<u64>();
        down = !down;
        flaky
            .set_fault(if down { Fault::Refuse } else { Fault::Up })
            .await
            .expect("fault");
        let deadline = Instant::now() + Duration::from_secs(20);
        while status.status().ended.values().sum::<u64>() == ended {
            assert!(
                Instant::now() < deadline,
                "no cycle ended after switching the remote {}: {:?}; {:?}",
                if down { "off" } else { "on" },
                status.status(),
                stack.probes.handle().status(),
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let cycle = status.status().cycle;
        if !down && (cycle % 20 < 2 || cycle >= total) {
            // Sample with the manager up and the remote reachable.
            let wait = Instant::now() + Duration::from_secs(20);
            while !status.status().manager_up {
                assert!(
                    Instant::now() < wait,
                    "manager never came up in cycle {cycle}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples.push(sample(cycle));
            for server in [&flaky, &steady] {
                assert!(
                    server.stats().open_watches <= 1,
                    "an old cycle's watch is still open: {:?}",
                    server.stats()
                );
            }
        }
    }
    let ended = status.status().ended;
    println!(
        "soak: {} cycles in {:.1}s ({} remote_lost, {} remote_recovered)",
        status.status().cycle - 1,
        started.elapsed().as_secs_f64(),
        ended[&CauseKind::RemoteLost],
        ended[&CauseKind::RemoteRecovered]
    );
    for s in &samples {
        println!(
            "  cycle {:5}: {:4} tasks, {:4} fds, {:7} KiB RSS",
            s.cycle, s.tasks, s.fds, s.rss_kib
        );
    }
    assert!(ended[&CauseKind::RemoteLost] + ended[&CauseKind::RemoteRecovered] >= total - 1);
    assert!(samples.len() >= 3, "too few samples: {samples:?}");
    // The first sample is the baseline once everything has been built once.
    let (base, last) = (samples[1], *samples.last().expect("samples"));
    assert!(
        within_five_percent(base.tasks, last.tasks),
        "tasks grew: {base:?} -> {last:?}"
    );
    assert!(
        within_five_percent(base.fds, last.fds),
        "descriptors grew: {base:?} -> {last:?}"
    );
    assert!(
        last.rss_kib <= base.rss_kib + base.rss_kib / 20,
        "RSS grew more than 5%: {base:?} -> {last:?}"
    );

    root.cancel();
    let _ = timeout(Duration::from_secs(10), run)
        .await
        .expect("shutdown");
}
