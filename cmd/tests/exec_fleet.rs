//! The exec manager at fleet scale: its live remotes file, a process that
//! follows it (never restarted for an optional remote or a fleet change),
//! and one that does not (restarted without a lost optional remote, and
//! with it once it has stayed reachable for `putBackAfter`).

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]
// Real processes: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{DEADLINE, Shape, Tether, config_yaml_with, remote, until};
use serde_json::Value;
use tether_testkit::{ApiServer, Fault};

/// A child that appends `start <pid> <TETHER_REMOTES_FILE> <TETHER_REMOTES>`
/// to `log` when it starts, then idles.
fn child(log: &Path) -> String {
    format!(
        "[sh, -c, \"echo start $$ $TETHER_REMOTES_FILE $TETHER_REMOTES >> {}; while :; do sleep 0.05; done\"]",
        log.display()
    )
}

/// The starts in `log`: each child's pid, remotes file and remotes.
fn starts(log: &Path) -> Vec<(u32, PathBuf, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ').skip(1);
            let pid = words.next()?.parse().ok()?;
            let file = PathBuf::from(words.next()?);
            Some((pid, file, words.next().unwrap_or_default().to_owned()))
        })
        .collect()
}

async fn until_starts(log: &Path, n: usize) -> Vec<(u32, PathBuf, String)> {
    until(format!("{n} starts of the child"), DEADLINE, async || {
        let seen = starts(log);
        (seen.len() >= n).then_some(seen)
    })
    .await
}

/// The remotes file, parsed, once it is whole JSON.
fn read(file: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(file).ok()?).ok()
}

/// Each remote in the file, by name: its reachability.
fn listed(file: &Value) -> Vec<(String, bool)> {
    file["remotes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["name"].as_str()?.to_owned(), r["reachable"].as_bool()?)))
        .collect()
}

/// Waits until the file lists `want`; returns it.
async fn until_listed(file: &Path, want: &[(&str, bool)]) -> Value {
    let want: Vec<(String, bool)> = want.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect();
    until(
        format!("the remotes file lists {want:?}"),
        DEADLINE,
        async || read(file).filter(|told| listed(told) == want),
    )
    .await
}

fn manager(log: &Path, extra: &str) -> String {
    format!("{{exec: {{command: {}{extra}}}}}", child(log))
}

struct Fleet {
    tether: Tether,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// tether over `remotes` (the first required, the rest optional), its
/// manager the idle child, with `extra` exec settings.
fn start(remotes: &[(&str, &ApiServer)], extra: &str) -> Fleet {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("starts");
    let optional: Vec<&str> = remotes.iter().skip(1).map(|(n, _)| *n).collect();
    let manager = manager(&log, extra);
    let tether = Tether::start(
        remotes,
        &["--log-format", "json"],
        &Shape {
            manager: Some(&manager),
            optional: &optional,
            ..Shape::default()
        },
    );
    Fleet {
        tether,
        log,
        _dir: dir,
    }
}

impl Fleet {
    /// Rewrites the config with `remotes`, as [`start`] wrote it, and
    /// waits until tether has applied it `reloads` times.
    async fn reload(&self, remotes: &[(&str, &ApiServer)], extra: &str, reloads: f64) {
        let optional: Vec<&str> = remotes.iter().skip(1).map(|(n, _)| *n).collect();
        let manager = manager(&self.log, extra);
        let yaml = config_yaml_with(
            self.tether.config.parent().expect("a folder"),
            &self.tether.admin,
            remotes,
            &Shape {
                manager: Some(&manager),
                optional: &optional,
                ..Shape::default()
            },
        );
        std::fs::write(&self.tether.config, yaml).expect("write");
        self.tether.signal("HUP");
        self.tether
            .until_metric(
                "tether_config_reloads_total{result=\"applied\"}",
                &format!("{reloads}"),
                |v| v >= reloads,
            )
            .await;
    }

    async fn metric(&self, series: &str) -> Option<f64> {
        self.tether.metric(series).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_follows_its_remotes_file_is_never_restarted_for_an_optional_remote_or_a_fleet_change()
 {
    let (a, b, c, d) = (
        remote("a", false).await,
        remote("b", false).await,
        remote("c", false).await,
        remote("d", false).await,
    );
    let follows = ", followsRemotesFile: true";
    let fleet = start(&[("a", &a), ("b", &b), ("c", &c)], follows);
    let (pid, file, names) = until_starts(&fleet.log, 1).await.remove(0);
    assert_eq!(names, "a,b,c");
    let first = until_listed(&file, &[("a", true), ("b", true), ("c", true)]).await;
    assert_eq!(
        first["apiVersion"],
        tether::managers::exec::REMOTES_FILE_VERSION
    );

    // An optional remote lost: marked, then back; the process runs on.
    b.set_fault(Fault::Refuse).await.expect("refuse");
    until_listed(&file, &[("a", true), ("b", false), ("c", true)]).await;
    b.set_fault(Fault::Up).await.expect("up");
    until_listed(&file, &[("a", true), ("b", true), ("c", true)]).await;

    // The fleet changes: d added, c removed, each written in.
    fleet
        .reload(&[("a", &a), ("b", &b), ("c", &c), ("d", &d)], follows, 1.0)
        .await;
    until_listed(&file, &[("a", true), ("b", true), ("c", true), ("d", true)]).await;
    fleet
        .reload(&[("a", &a), ("b", &b), ("d", &d)], follows, 2.0)
        .await;
    let last = until_listed(&file, &[("a", true), ("b", true), ("d", true)]).await;
    assert!(
        last["revision"].as_u64() > first["revision"].as_u64(),
        "the revision did not grow: {first} then {last}"
    );
    assert_eq!(starts(&fleet.log).len(), 1, "the process was restarted");
    assert!(common::running(pid), "the first process is gone");
    assert_eq!(
        fleet.metric("tether_cycle").await,
        Some(1.0),
        "a cycle ended"
    );
    assert_eq!(
        fleet
            .metric("tether_remote_changes_total{cause=\"config_changed\",change=\"added\"}")
            .await,
        Some(1.0)
    );

    // A required remote lost still stops it, as before.
    a.set_fault(Fault::Refuse).await.expect("refuse");
    until(format!("the process {pid} stopped"), DEADLINE, async || {
        (!common::running(pid)).then_some(())
    })
    .await;
    // Counted once the manager has returned, after the process is gone.
    fleet
        .tether
        .until_metric("tether_cycles_total{cause=\"remote_lost\"}", "1", |v| {
            v == 1.0
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_does_not_follow_its_file_is_restarted_without_a_lost_optional_remote_and_with_it_after_the_hold()
 {
    let (a, b) = (remote("a", false).await, remote("b", false).await);
    // Longer than a flap's reachable time as tether sees it: the 1s it is
    // up, and the detection bound (3.5s) before the next loss is seen.
    let hold = Duration::from_secs(8);
    let extra = ", putBackAfter: 8s";
    let fleet = start(&[("a", &a), ("b", &b)], extra);
    let started = until_starts(&fleet.log, 1).await;
    assert_eq!(started[0].2, "a,b");

    // b lost: restarted with a alone, in the same cycle.
    b.set_fault(Fault::Refuse).await.expect("refuse");
    let started = until_starts(&fleet.log, 2).await;
    assert_eq!(started[1].2, "a", "b was not left out");
    assert_eq!(
        listed(&read(&started[1].1).expect("the file")),
        [("a".to_owned(), true)]
    );

    // b flaps: up for 1s, refusing for 6s, three times (the schedule of
    // the fault, not a wait for tether). Never reachable for the hold, it
    // is never put back.
    for _ in 0..3 {
        b.set_fault(Fault::Up).await.expect("up");
        tokio::time::sleep(Duration::from_secs(1)).await;
        b.set_fault(Fault::Refuse).await.expect("refuse");
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    assert_eq!(
        starts(&fleet.log).len(),
        2,
        "a flapping remote restarted the process"
    );

    // b back for good: put back once it has stayed reachable for the hold.
    b.set_fault(Fault::Up).await.expect("up");
    let back = Instant::now();
    let started = until_starts(&fleet.log, 3).await;
    assert_eq!(started[2].2, "a,b", "b was not put back");
    assert!(
        back.elapsed() >= hold,
        "put back {:?} after it came back, within the hold of {hold:?}",
        back.elapsed()
    );
    for (reason, count) in [("remote_left_out", 1.0), ("remote_put_back", 1.0)] {
        assert_eq!(
            fleet
                .metric(&format!(
                    "tether_manager_process_restarts_total{{reason=\"{reason}\"}}"
                ))
                .await,
            Some(count),
            "{reason}"
        );
    }
    assert_eq!(
        fleet.metric("tether_cycle").await,
        Some(1.0),
        "a cycle ended"
    );
}
