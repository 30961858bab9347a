//! What the exec manager adds to a child's start: from a cycle's start to
//! the child running, against the same child spawned bare with tokio, and
//! started through `tether launcher` (as in another container) instead.
//! `cargo bench -p tether --bench exec_start`.
//!
//! The child is `sh -c 'date +%s%N'`, which appends the wall-clock time it
//! ran at to a file; both sides pay the same shell and `date` start, so the
//! difference is tether's.

// A benchmark measures wall-clock time; no paused clock here.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::Registry;
use tether::config::ExecSpec;
use tether::config::Plan;
use tether::managers::exec::ExecManager;
use tether_probes::{ProbeConfig, ProbeSet};
use tether_supervisor::{CycleToken, ManagerFactory, SupervisorConfig};
use tether_testkit::median_max;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 200;

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// The last time the child wrote to `file`.
fn child_ran_at(file: &Path) -> u128 {
    let text = std::fs::read_to_string(file).expect("the child wrote");
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("nanoseconds")
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("ran");
    let script = format!("date +%s%N >> {}", file.display());
    let command = vec!["sh".to_owned(), "-c".to_owned(), script.clone()];

    let mut bare = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let asked = now_nanos();
        let status = tokio::process::Command::new("sh")
            .args(["-c", &script])
            .status()
            .await
            .expect("sh runs");
        assert!(status.success());
        bare.push(Duration::from_nanos(
            u64::try_from(child_ran_at(&file) - asked).expect("small"),
        ));
    }

    let supervised = cycles(
        &file,
        ExecSpec::of_command(command.clone(), &SupervisorConfig::default(), None),
    )
    .await;

    let socket = dir.path().join("launcher.sock");
    let mut serving = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["launcher", "--socket"])
        .arg(&socket)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the launcher starts");
    let mut spec = ExecSpec::of_command(command, &SupervisorConfig::default(), None);
    spec.launcher = Some(socket);
    let launched = cycles(&file, spec).await;
    let _ = serving.kill().await;
    let launched = median_max(launched).0;

    let (bare, supervised) = (median_max(bare).0, median_max(supervised).0);
    println!(
        "exec start, median of {ROUNDS}: bare tokio spawn to running {bare:?}, exec manager cycle start to running {supervised:?}, overhead {:?}; through the launcher {launched:?}, overhead {:?}",
        supervised.saturating_sub(bare),
        launched.saturating_sub(bare)
    );
}

/// [`ROUNDS`] cycles of an exec manager on `spec`, each to its child's
/// exit: from each cycle's start to the child running (the time it wrote
/// to `file`).
async fn cycles(file: &Path, spec: ExecSpec) -> Vec<Duration> {
    let registry = Registry::new();
    let probes = ProbeSet::new(ProbeConfig::default(), &registry).expect("probes");
    let manager = ExecManager::new(
        &registry,
        spec,
        Plan::default(),
        probes.handle(),
        // The daemon starts each child as itself (`/proc/self/exe`);
        // here, the tether binary plays that part.
        env!("CARGO_BIN_EXE_tether").into(),
    )
    .expect("exec manager");
    let root = CancellationToken::new();
    let mut took = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let cycle = CycleToken::new(round as u64 + 1, &root);
        let asked = now_nanos();
        manager.run(cycle).await.expect("exits 0");
        took.push(Duration::from_nanos(
            u64::try_from(child_ran_at(file) - asked).expect("small"),
        ));
    }
    took
}
