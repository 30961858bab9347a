//! Fleets: a remote added, read anew or removed touches that remote alone.
//! The built-in watch manager, in the real binary, among 50 simulated
//! apiservers that count the LISTs each serves.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Shape, Tether, config_yaml_with};
use tether_testkit::{ApiServer, http_get, until};

/// What a watcher's list asks for, as the simulated apiserver counts it.
const LIST: &str = "/api/v1/configmaps";

/// Long enough for 50 remotes to sync on a loaded machine.
const SYNC: Duration = Duration::from_secs(60);

fn name(i: usize) -> String {
    format!("r{i:02}")
}

/// The config for `remotes`, all optional, watching every ConfigMap.
fn yaml(tether: &Tether, remotes: &[(String, &ApiServer)]) -> String {
    let pairs: Vec<(&str, &ApiServer)> = remotes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let optional: Vec<&str> = remotes.iter().map(|(n, _)| n.as_str()).collect();
    config_yaml_with(
        tether.config.parent().expect("a folder"),
        &tether.admin,
        &pairs,
        &Shape {
            optional: &optional,
            ..Shape::default()
        },
    )
}

/// Tether on `remotes`, all optional, once each has synced and it is ready.
async fn start(remotes: &[(String, &ApiServer)]) -> Tether {
    let pairs: Vec<(&str, &ApiServer)> = remotes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let optional: Vec<&str> = remotes.iter().map(|(n, _)| n.as_str()).collect();
    let tether = Tether::start(
        &pairs,
        &[],
        &Shape {
            optional: &optional,
            ..Shape::default()
        },
    );
    for (remote, _) in remotes {
        synced(&tether, remote).await;
    }
    tether.until_ready(true).await;
    tether
}

/// `/readyz`, sampled every 20 ms until [`Sampler::finish`].
struct Sampler {
    sampling: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl Sampler {
    fn start(tether: &Tether) -> Self {
        let sampling = Arc::new(AtomicBool::new(true));
        let (admin, on) = (tether.admin.clone(), Arc::clone(&sampling));
        let task = tokio::spawn(async move {
            let (mut samples, mut unready) = (0, 0);
            while on.load(Ordering::SeqCst) {
                if http_get(&admin, "/readyz").await.map(|(code, _)| code) != Some(200) {
                    unready += 1;
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (samples, unready)
        });
        Self { sampling, task }
    }

    /// The samples taken, and how many were not 200.
    async fn finish(self) -> (u64, u64) {
        self.sampling.store(false, Ordering::SeqCst);
        self.task.await.expect("the sampler")
    }
}

/// Rewrites the config with `remotes` and has tether reload it.
async fn reload(tether: &Tether, remotes: &[(String, &ApiServer)], reloads: f64) {
    std::fs::write(&tether.config, yaml(tether, remotes)).expect("write");
    tether.signal("HUP");
    tether
        .until_metric(
            "tether_config_reloads_total{result=\"applied\"}",
            &format!("{reloads}"),
            |v| v >= reloads,
        )
        .await;
}

async fn synced(tether: &Tether, remote: &str) {
    tether
        .until_metric(
            &format!("tether_watch_synced{{remote=\"{remote}\",resource=\"configmaps\"}}"),
            "1",
            |v| v == 1.0,
        )
        .await;
}

/// The LISTs each server has served, by remote.
fn lists(remotes: &[(String, &ApiServer)]) -> BTreeMap<String, u64> {
    remotes
        .iter()
        .map(|(name, server)| (name.clone(), server.requests(LIST)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_added_read_anew_or_removed_among_fifty_lists_nothing_on_the_others() {
    let mut servers = Vec::new();
    for i in 0..53 {
        servers.push(common::remote(&name(i), false).await);
    }
    let (fleet, spare) = servers.split_at(50);
    let (added, moved) = (&spare[0], &spare[1]);
    let mut remotes: Vec<(String, &ApiServer)> = fleet
        .iter()
        .enumerate()
        .map(|(i, s)| (name(i), s))
        .collect();
    let mut tether = start(&remotes).await;
    assert_eq!(tether.metric("tether_cycle").await, Some(1.0));
    // An optional remote's change never makes tether unready.
    let readiness = Sampler::start(&tether);

    let before = lists(&remotes);
    // Added: r50, a new server.
    remotes.push((name(50), added));
    reload(&tether, &remotes, 1.0).await;
    synced(&tether, &name(50)).await;
    // Read anew: r10 now points at another server, a new generation.
    let old = remotes[10].1;
    remotes[10].1 = moved;
    reload(&tether, &remotes, 2.0).await;
    until("r10 listed on its new server", SYNC, async || {
        (moved.requests(LIST) >= 1).then_some(())
    })
    .await;
    synced(&tether, "r10").await;
    until("r10's watch on its old server closed", SYNC, async || {
        (old.stats().open_watches == 0).then_some(())
    })
    .await;
    // Removed: r20 goes, and its watch with it.
    let gone = remotes.remove(20);
    reload(&tether, &remotes, 3.0).await;
    until("r20's watch closed", SYNC, async || {
        (gone.1.stats().open_watches == 0).then_some(())
    })
    .await;
    let (_, metrics) = tether.get("/metrics").await.expect("metrics");
    assert!(
        !metrics.contains("remote=\"r20\""),
        "the removed remote's series remain"
    );

    let (samples, unready) = readiness.finish().await;
    let after = lists(&remotes);
    let relisted: Vec<_> = before
        .iter()
        .filter(|(remote, count)| {
            *remote != "r10" && after.get(*remote).is_some_and(|now| now != *count)
        })
        .collect();
    assert!(
        relisted.is_empty(),
        "the other remotes listed again: {relisted:?} (before {before:?}, after {after:?})"
    );
    assert_eq!(added.requests(LIST), 1, "r50 listed more than once");
    assert_eq!(
        unready, 0,
        "/readyz answered other than 200 in {unready} of {samples} samples"
    );
    assert_eq!(
        tether.metric("tether_cycle").await,
        Some(1.0),
        "a cycle ended"
    );
    for (change, count) in [("added", 1.0), ("rebuilt", 1.0), ("removed", 1.0)] {
        assert_eq!(
            tether
                .metric(&format!(
                    "tether_remote_changes_total{{cause=\"config_changed\",change=\"{change}\"}}"
                ))
                .await,
            Some(count),
            "{change}"
        );
    }
    let (_, status) = tether.get("/status.json").await.expect("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    let changes: Vec<(&str, &str)> = status["supervisor"]["remoteChanges"]
        .as_array()
        .expect("remoteChanges")
        .iter()
        .filter_map(|c| Some((c["remote"].as_str()?, c["change"].as_str()?)))
        .collect();
    assert_eq!(
        changes,
        [("r50", "added"), ("r10", "rebuilt"), ("r20", "removed")]
    );
    let logs = tether.logs();
    assert!(
        logs.contains("r50") && logs.contains("the cycle runs on"),
        "the log does not name the change"
    );
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(0));
}
