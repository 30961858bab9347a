//! Several replicas: leader election on a Lease held by one apiserver,
//! three tether processes, each reaching the Lease through a relay of its
//! own, so that one replica can be partitioned from it while the others
//! still reach it. Each test runs on the simulated apiserver, and again on a
//! real kube-apiserver (`scripts/peers`), where the Lease is a real
//! `coordination.k8s.io/v1` object.

// Real processes and sockets: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::relay::{Path, Relay};
use common::witness::{Witness, overlap};
use common::{DEADLINE, Shape, Tether, lease, remote};
use tether_testkit::{Cluster, ControlPlane, RealOptions};

const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// Trials on the simulated apiserver; the real one, slower to start a
/// replica against, runs fewer.
const TRIALS: usize = 20;
const REAL_TRIALS: usize = 6;

async fn real(name: &str) -> ControlPlane {
    common::real_plane(RealOptions::default().name(name)).await
}

/// One replica: a tether process and its relay.
struct Replica {
    id: String,
    tether: Tether,
    relay: Relay,
    /// Holds the Lease's kubeconfig for the process's life.
    _dir: tempfile::TempDir,
}

/// A replica running `manager` (a `manager:` section, or the built-in one).
async fn replica(id: &str, server: &impl Cluster, manager: Option<&str>) -> Replica {
    let relay = Relay::start(server.addr()).await;
    let mut kubeconfig = server.kubeconfig();
    kubeconfig.server = format!("https://{}", relay.addr);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("lease-{id}.kubeconfig"));
    kubeconfig.write(&path).expect("kubeconfig");
    let extra = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, identity: {id}, \
         leaseDuration: {}ms, renewDeadline: {}ms, retryPeriod: {}ms, kubeconfig: {}}}",
        LEASE_DURATION.as_millis(),
        RENEW_DEADLINE.as_millis(),
        RETRY_PERIOD.as_millis(),
        path.display()
    );
    let tether = Tether::start(
        &[("a", server)],
        &["--log-format", "json"],
        &Shape {
            manager,
            extra: &extra,
            ..Shape::default()
        },
    );
    Replica {
        id: id.to_owned(),
        tether,
        relay,
        _dir: dir,
    }
}

async fn leading(replica: &Replica) -> bool {
    replica.tether.metric("tether_leader").await == Some(1.0)
}

async fn up(replica: &Replica) -> bool {
    replica.tether.metric("tether_manager_up").await == Some(1.0)
}

/// Waits until exactly one replica leads with its manager up; its index.
async fn one_leader_up(replicas: &[Replica]) -> usize {
    common::until("one leader with its manager up", DEADLINE, async || {
        let mut leaders = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if leading(r).await {
                leaders.push(i);
            }
        }
        assert!(leaders.len() <= 1, "two replicas lead at once: {leaders:?}");
        match leaders[..] {
            [only] if up(&replicas[only]).await => Some(only),
            _ => None,
        }
    })
    .await
}

/// Waits until `replica` has read the Lease and seen `holder` hold it.
async fn sees_holder(replica: &Replica, holder: &str) {
    let what = format!("{} sees {holder} hold the Lease", replica.id);
    common::until(what, DEADLINE, async || {
        let (code, body) = replica.tether.get("/status.json").await?;
        let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        (code == 200 && status["election"]["holder"] == holder).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_started_at_once_elect_exactly_one_and_followers_stand_by() {
    elect_exactly_one(&remote("lease", true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_lease_three_replicas_elect_exactly_one_and_write_what_client_go_writes() {
    let server = real("lease").await;
    elect_exactly_one(&server).await;
    // What kubectl shows of the real object: the fields client-go's
    // LeaseLock writes, in the formats the apiserver stores.
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.kubeconfig().write(&kubeconfig).expect("kubeconfig");
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "lease", "tether", "-n", "default", "-o", "yaml"])
        .output()
        .expect("kubectl runs");
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("the real Lease, as kubectl shows it:\n{yaml}");
    for field in [
        "apiVersion: coordination.k8s.io/v1",
        "kind: Lease",
        "holderIdentity: r",
        "leaseDurationSeconds: 3",
        "leaseTransitions: 0",
        "acquireTime: \"",
        "renewTime: \"",
        "resourceVersion: \"",
    ] {
        assert!(yaml.contains(field), "no `{field}` in:\n{yaml}");
    }
    // MicroTime: RFC 3339 with six fractional digits, in UTC.
    let renew = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("renewTime: "))
        .expect("renewTime")
        .trim_matches('"');
    let fraction = renew
        .split_once('.')
        .and_then(|(_, f)| f.strip_suffix('Z'))
        .expect("fractional seconds, in UTC");
    assert_eq!(fraction.len(), 6, "{renew}");
}

async fn elect_exactly_one(server: &impl Cluster) {
    let replicas = vec![
        replica("r0", server, None).await,
        replica("r1", server, None).await,
        replica("r2", server, None).await,
    ];
    let leader = one_leader_up(&replicas).await;
    assert!(
        !replicas[leader].tether.logs().contains("standing by"),
        "the leader said it stood by:\n{}",
        replicas[leader].tether.logs()
    );
    // It stays that way: two leaseDurations with exactly one leader.
    let settled = Instant::now();
    while settled.elapsed() < LEASE_DURATION * 2 {
        assert_eq!(
            one_leader_up(&replicas).await,
            leader,
            "the leadership moved"
        );
    }
    let held = lease(server, "tether")
        .await
        .expect("the Lease exists")
        .spec
        .expect("spec");
    assert_eq!(
        held.holder_identity.as_deref(),
        Some(replicas[leader].id.as_str())
    );
    assert_eq!(held.lease_transitions, Some(0), "{held:?}");
    assert_eq!(held.lease_duration_seconds, Some(3));
    for (i, r) in replicas.iter().enumerate().filter(|(i, _)| *i != leader) {
        let (code, body) = r.tether.get("/readyz").await.expect("answers");
        assert_eq!(code, 200, "replica {i}: {body}");
        assert!(
            body.contains(&format!("[+]standby (leader: {})", replicas[leader].id)),
            "{body}"
        );
        assert!(!up(r).await, "a follower runs no manager");
        // A follower says who leads, once.
        let said = r
            .tether
            .logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["fields"]["message"] == "standing by: another replica leads")
            .map(|e| {
                e["fields"]["leader"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect::<Vec<_>>();
        assert_eq!(said, [replicas[leader].id.as_str()], "replica {i}");
        let (_, status) = r.tether.get("/status.json").await.expect("answers");
        let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
        assert_eq!(status["election"]["role"], "standby");
        assert_eq!(status["supervisor"]["phase"], "standby");
        assert_eq!(status["verdict"]["state"], "standby");
        let verdict = status["verdict"]["text"].as_str().expect("a verdict");
        assert!(
            verdict.starts_with(&format!("Standby (leader: {})", replicas[leader].id)),
            "{verdict}"
        );
        // `tether check` reads the Lease too.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["check", "--config"])
            .arg(&r.tether.config)
            .output()
            .expect("tether check runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(
                "Lease default/tether held by {}",
                replicas[leader].id
            )) && text.contains(&format!("this replica ({}) stands by", r.id)),
            "{text}"
        );
    }
}

async fn failovers(server: &impl Cluster, signal: &str, trials: usize) -> Vec<Duration> {
    let mut replicas = vec![
        replica("r0", server, None).await,
        replica("r1", server, None).await,
        replica("r2", server, None).await,
    ];
    let mut took = Vec::new();
    for trial in 0..trials {
        let leader = one_leader_up(&replicas).await;
        let mut old = replicas.remove(leader);
        let asked = Instant::now();
        old.tether.signal(signal);
        let new = one_leader_up(&replicas).await;
        took.push(asked.elapsed());
        assert_ne!(replicas[new].id, old.id);
        if signal == "TERM" {
            // A clean stop is no loss: said at INFO, after the manager.
            old.tether.wait().await;
            let logs = old.tether.logs();
            assert!(
                logs.contains("stopped leading: tether is shutting down")
                    && !logs.contains("leadership lost"),
                "{logs}"
            );
            assert!(
                logs.contains("released the Lease"),
                "a clean stop releases the Lease:\n{logs}"
            );
        }
        drop(old);
        // The replacement stands by, having seen the Lease held, before the
        // next trial: a replica that just started would take a released
        // Lease at its first try, and flatter the figure.
        let fresh = replica(&format!("r{}", trial + 3), server, None).await;
        sees_holder(&fresh, &replicas[new].id).await;
        replicas.push(fresh);
    }
    let transitions = lease(server, "tether")
        .await
        .expect("the Lease exists")
        .spec
        .and_then(|s| s.lease_transitions);
    assert_eq!(
        transitions,
        Some(i32::try_from(trials).expect("small")),
        "each failover is one transition of the Lease"
    );
    took
}

/// The bound on a failover after SIGKILL: the Lease must lapse.
fn after_sigkill() -> Duration {
    LEASE_DURATION + RETRY_PERIOD.mul_f64(1.2) + Duration::from_secs(2)
}

/// The bound on a failover after SIGTERM: the Lease was released.
fn after_sigterm() -> Duration {
    RETRY_PERIOD.mul_f64(1.2) + Duration::from_secs(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_a_new_leader_is_up_within_lease_duration_and_retry_period() {
    let server = remote("lease", true).await;
    failovers_within(&server, "simulated", "KILL", TRIALS, after_sigkill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_lease_after_sigkill_a_new_leader_is_up_within_lease_duration_and_retry_period() {
    let server = real("lease").await;
    failovers_within(&server, "real", "KILL", REAL_TRIALS, after_sigkill()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_a_new_leader_is_up_within_the_retry_period() {
    let server = remote("lease", true).await;
    failovers_within(&server, "simulated", "TERM", TRIALS, after_sigterm()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_lease_after_sigterm_a_new_leader_is_up_within_the_retry_period() {
    let server = real("lease").await;
    failovers_within(&server, "real", "TERM", REAL_TRIALS, after_sigterm()).await;
}

/// `trials` failovers after `signal` to the leader, each under `bound`.
async fn failovers_within(
    server: &impl Cluster,
    which: &str,
    signal: &str,
    trials: usize,
    bound: Duration,
) {
    let took = failovers(server, signal, trials).await;
    let (median, max) = common::median_max(took);
    println!(
        "failover after SIG{signal} of the leader, {which} apiserver, {trials} trials: median {median:?}, max {max:?}"
    );
    assert!(
        max < bound,
        "a failover took {max:?}, over {bound:?} (after SIGTERM: was the Lease released?)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_its_manager_before_another_starts() {
    partitioned_leader(&remote("lease", true).await, "simulated", TRIALS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_lease_a_partitioned_leader_stops_its_manager_before_another_starts() {
    partitioned_leader(&real("lease").await, "real", REAL_TRIALS).await;
}

async fn partitioned_leader(server: &impl Cluster, which: &str, trials: usize) {
    let witness = Witness::new();
    let manager = |id: &str| witness.manager(id, "500ms", false);
    let replicas = vec![
        replica("r0", server, Some(&manager("r0"))).await,
        replica("r1", server, Some(&manager("r1"))).await,
        replica("r2", server, Some(&manager("r2"))).await,
    ];
    let mut took = Vec::new();
    for trial in 0..trials {
        let leader = one_leader_up(&replicas).await;
        let path = if trial % 2 == 0 {
            Path::Refuse
        } else {
            Path::Hang
        };
        let cut = Instant::now();
        replicas[leader].relay.set(path);
        // Another replica takes over; the partitioned one must have stopped
        // first, which the witness log shows.
        let new = common::until(
            format!("trial {trial}: another replica takes over"),
            DEADLINE,
            async || {
                let mut found = None;
                for (i, r) in replicas.iter().enumerate() {
                    if i != leader && leading(r).await && up(r).await {
                        found = Some(i);
                    }
                }
                found
            },
        )
        .await;
        took.push(cut.elapsed());
        assert!(
            !leading(&replicas[leader]).await,
            "trial {trial}: two leaders"
        );
        replicas[leader].relay.set(Path::Up);
        assert_ne!(new, leader);
    }
    // The last leader's child may not have written its start yet.
    let runs = common::until(
        "a run in the witness log per trial, and one more",
        DEADLINE,
        async || {
            let runs = witness.runs();
            (runs.len() > trials).then_some(runs)
        },
    )
    .await;
    let log = std::fs::read_to_string(&witness.log).expect("the witness log");
    let overlap = overlap(&runs);
    let (median, max) = common::median_max(took);
    println!(
        "partitioned leader, {which} apiserver, {trials} trials (refuse and hang): a new leader up after median {median:?}, max {max:?}; {} manager runs; overlap {overlap:?}",
        runs.len()
    );
    assert!(runs.len() > trials, "the witness saw every run: {log}");
    assert_eq!(overlap, Duration::ZERO, "two managers ran at once:\n{log}");
}
