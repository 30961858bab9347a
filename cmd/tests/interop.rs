//! Leader election that interoperates with client-go on one Lease. Two
//! tether replicas and a client-go candidate (`tests/peers/lease-candidate`:
//! `k8s.io/client-go/tools/leaderelection`, a `LeaseLock`,
//! `ReleaseOnCancel`) contend for one real Lease with the same timings.
//!
//! Every candidate acts through the same witness: while it leads (for a
//! tether replica: while its exec manager runs) it writes `{holder, seq}`
//! to one ConfigMap every 50ms and appends `start`, `write` and `stop` to
//! one log, stamped on `CLOCK_MONOTONIC` (a write: when it was sent, and the
//! resourceVersion it made). The auditor reads the log: a tenure runs from
//! its `start` to its last write sent, and no two may overlap; a write
//! outside its writer's tenure is a failure, and so is a write of an older
//! tenure that the apiserver applied after one of a newer.
//!
//! Each fault strikes a tether leader and a client-go leader by turns;
//! `TETHER_TRIALS=<n>` runs each `n` times (2 by default).

// Real processes: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{DEADLINE, Shape, Tether, children, kill, real_plane, running};
use k8s_openapi::api::coordination::v1::Lease;
use tether_testkit::{ControlPlane, RealOptions, peer};

const LEASE: &str = "interop";
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP for longer than the lease duration, then SIGCONT: for a
    /// tether replica, tether and its manager together, as a frozen pod.
    Frozen,
    Killed,
    /// SIGTERM: a candidate that lets go.
    Terminated,
    ApiserverRestarted,
    LeaseDeleted,
    /// The Lease rewritten without `leaseDurationSeconds`.
    NoDuration,
}

const FAULTS: [Fault; 6] = [
    Fault::Frozen,
    Fault::Killed,
    Fault::Terminated,
    Fault::ApiserverRestarted,
    Fault::LeaseDeleted,
    Fault::NoDuration,
];

/// One candidate's process.
enum Candidate {
    Tether(Tether),
    Go(tokio::process::Child),
}

impl Candidate {
    fn pid(&self) -> u32 {
        match self {
            Self::Tether(t) => t.child.id(),
            Self::Go(c) => c.id(),
        }
        .expect("running")
    }
}

struct World {
    plane: ControlPlane,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    witness: PathBuf,
    candidates: BTreeMap<String, Candidate>,
    /// How many candidates were started: the next one's number.
    started: usize,
}

impl World {
    async fn new() -> Self {
        let plane = real_plane(RealOptions::default().name("lease")).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        plane.kubeconfig().write(&kubeconfig).expect("kubeconfig");
        let witness = dir.path().join("witness");
        std::fs::write(&witness, "").expect("witness");
        let mut world = Self {
            plane,
            _dir: dir,
            kubeconfig,
            witness,
            candidates: BTreeMap::new(),
            started: 0,
        };
        world.spawn(false);
        world.spawn(false);
        world.spawn(true);
        world
    }

    /// Starts a candidate under a new identity, as a new pod has a new
    /// name: `go-<n>` for client-go, `r<n>` for tether.
    fn spawn(&mut self, go: bool) {
        let n = self.started;
        self.started += 1;
        let (id, candidate) = if go {
            let id = format!("go-{n}");
            let child = go_candidate(&id, &self.kubeconfig, &self.witness);
            (id, Candidate::Go(child))
        } else {
            let id = format!("r{n}");
            let tether = replica(&id, &self.plane, &self.kubeconfig, &self.witness);
            (id, Candidate::Tether(tether))
        };
        self.candidates.insert(id, candidate);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.witness).expect("witness")
    }

    /// Waits until one candidate writes steadily (five writes in a row)
    /// after line `after` of the log; its identity.
    async fn acting(&self, after: usize) -> String {
        let steady = common::poll(DEADLINE, common::EVERY, async || {
            let log = self.log();
            let writers: Vec<&str> = log
                .lines()
                .skip(after)
                .filter_map(|l| l.strip_prefix("write "))
                .filter_map(|l| l.split_whitespace().nth(1))
                .collect();
            // The last five writes, by one writer.
            let last = writers.get(writers.len().checked_sub(5)?..)?;
            last.iter()
                .all(|w| *w == last[0])
                .then(|| last[0].to_owned())
        })
        .await;
        steady.unwrap_or_else(|| {
            panic!(
                "no candidate acted steadily; the witness:\n{}",
                tail(&self.log())
            )
        })
    }

    async fn leases(&self) -> kube::Api<Lease> {
        let client = kube::Client::try_from(common::config_of(&self.plane).await).expect("client");
        kube::Api::namespaced(client, "default")
    }

    /// Waits until a client-go candidate (`go`) or a tether replica acts.
    /// While the other kind does, its leader is sent SIGTERM, so that it
    /// lets go, and is started again (under a new identity) only once the
    /// wanted kind acts.
    async fn lead_by(&mut self, go: bool) -> String {
        let mut stopped = Vec::new();
        let who = loop {
            let who = self.acting(self.log().lines().count()).await;
            if who.starts_with("go-") == go {
                break who;
            }
            assert!(
                stopped.len() < 3,
                "no {} candidate came to lead",
                if go { "client-go" } else { "tether" }
            );
            stopped.push(self.stop(&who, "TERM").await);
        };
        for was_go in stopped {
            self.spawn(was_go);
        }
        who
    }

    /// Sends `signal` to `who` and waits for it to exit; whether it was a
    /// client-go candidate.
    async fn stop(&mut self, who: &str, signal: &str) -> bool {
        let mut gone = self.candidates.remove(who).expect("known");
        kill(gone.pid(), signal);
        let exited = match &mut gone {
            Candidate::Tether(t) => tokio::time::timeout(DEADLINE, t.wait()).await.is_ok(),
            Candidate::Go(c) => tokio::time::timeout(DEADLINE, c.wait()).await.is_ok(),
        };
        assert!(exited, "{who} did not exit on SIG{signal}");
        matches!(gone, Candidate::Go(_))
    }

    /// What the tether replicas running now logged of the election.
    fn elections(&self) -> String {
        let mut text = String::new();
        for (id, candidate) in &self.candidates {
            if let Candidate::Tether(tether) = candidate {
                let _ = writeln!(text, "== {id}");
                for line in tether
                    .logs()
                    .lines()
                    .filter(|l| l.contains("lease::election"))
                {
                    let _ = writeln!(text, "{line}");
                }
            }
        }
        text
    }

    /// Strikes `fault` at `who`, and brings a stopped candidate back.
    async fn strike(&mut self, fault: Fault, who: &str) {
        let pid = self.candidates[who].pid();
        match fault {
            Fault::Frozen => {
                // A frozen pod: the manager stops with tether.
                let mut pids = children(pid);
                pids.push(pid);
                for p in &pids {
                    kill(*p, "STOP");
                }
                tokio::time::sleep(LEASE_DURATION + Duration::from_secs(2)).await;
                // tether only: its manager stays frozen until tether has
                // stopped it (a stopped process takes only the SIGKILL
                // that follows the grace period). Thawed a moment after
                // tether, or once a SIGTERM was pending, a manager on a
                // loaded machine wrote as it woke, before tether's stop
                // reached it (overlaps of 1.4 and 1.7s): no Lease protocol
                // fences that, and docs/ha.md says so.
                kill(pid, "CONT");
                for p in &pids[..pids.len() - 1] {
                    let gone = common::poll(DEADLINE, Duration::from_millis(10), async || {
                        (!running(*p)).then_some(())
                    })
                    .await;
                    assert!(
                        gone.is_some(),
                        "tether never stopped its frozen manager {p}"
                    );
                }
            }
            Fault::Killed | Fault::Terminated => {
                let go = self
                    .stop(
                        who,
                        if fault == Fault::Killed {
                            "KILL"
                        } else {
                            "TERM"
                        },
                    )
                    .await;
                self.spawn(go);
            }
            Fault::ApiserverRestarted => self.plane.restart().await.expect("restarted"),
            Fault::LeaseDeleted => {
                self.leases()
                    .await
                    .delete(LEASE, &kube::api::DeleteParams::default())
                    .await
                    .expect("deleted");
            }
            Fault::NoDuration => {
                let leases = self.leases().await;
                let patch = serde_json::json!({"spec": {"leaseDurationSeconds": null}});
                leases
                    .patch(
                        LEASE,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await
                    .expect("patched");
            }
        }
    }
}

/// The last lines of the witness, for a failure's message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn go_candidate(id: &str, kubeconfig: &Path, witness: &Path) -> tokio::process::Child {
    tokio::process::Command::new(peer("lease-candidate").expect("built"))
        .arg("elect")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--witness")
        .arg(witness)
        .args(["--identity", id, "--lease", LEASE])
        .arg(format!("--lease-duration={}ms", LEASE_DURATION.as_millis()))
        .arg(format!("--renew-deadline={}ms", RENEW_DEADLINE.as_millis()))
        .arg(format!("--retry-period={}ms", RETRY_PERIOD.as_millis()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the client-go candidate starts")
}

fn replica(id: &str, plane: &ControlPlane, kubeconfig: &Path, witness: &Path) -> Tether {
    let manager = format!(
        "{{exec: {{command: [{}, write, --kubeconfig, {}, --witness, {}, --identity, {id}], gracePeriod: 1s}}}}",
        peer("lease-candidate").expect("built").display(),
        kubeconfig.display(),
        witness.display(),
    );
    let election = format!(
        "leaderElection: {{enabled: true, leaseName: {LEASE}, leaseNamespace: default, identity: {id}, \
         leaseDuration: {}ms, renewDeadline: {}ms, retryPeriod: {}ms, kubeconfig: {}}}",
        LEASE_DURATION.as_millis(),
        RENEW_DEADLINE.as_millis(),
        RETRY_PERIOD.as_millis(),
        kubeconfig.display()
    );
    Tether::start(
        &[("a", plane)],
        &[],
        &Shape {
            manager: Some(&manager),
            extra: &election,
            ..Shape::default()
        },
    )
}

/// One candidate's tenure, from the witness.
#[derive(Debug)]
struct Tenure {
    who: String,
    start: u64,
    /// When its last write was sent (its start, if it wrote nothing).
    end: u64,
    writes: usize,
}

/// One write, from the witness: who sent it, in which tenure (by start),
/// and the ConfigMap's resourceVersion it made.
struct Write {
    who: String,
    tenure: u64,
    version: u64,
}

/// The tenures in the log, and what in it breaks the rules: a write
/// outside its writer's tenure, two tenures that overlap, or a write of an
/// older tenure that landed (by resourceVersion) after one of a newer.
fn audit(log: &str) -> (Vec<Tenure>, Vec<String>) {
    let mut done: Vec<Tenure> = Vec::new();
    let mut open: BTreeMap<String, Tenure> = BTreeMap::new();
    let mut writes = Vec::new();
    let mut problems = Vec::new();
    for line in log.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(what), Some(Ok(at)), Some(who)) = (
            fields.first(),
            fields.get(1).map(|t| t.parse::<u64>()),
            fields.get(2),
        ) else {
            problems.push(format!("a line the witness never writes: {line:?}"));
            continue;
        };
        let who = (*who).to_owned();
        match *what {
            "start" => {
                // A writer killed by SIGKILL never wrote its stop.
                done.extend(open.remove(&who));
                open.insert(
                    who.clone(),
                    Tenure {
                        who,
                        start: at,
                        end: at,
                        writes: 0,
                    },
                );
            }
            "write" => match (
                open.get_mut(&who),
                fields.get(4).and_then(|v| v.parse().ok()),
            ) {
                (Some(tenure), Some(version)) => {
                    tenure.end = at;
                    tenure.writes += 1;
                    writes.push(Write {
                        who,
                        tenure: tenure.start,
                        version,
                    });
                }
                _ => problems.push(format!("a write outside {who}'s tenure: {line}")),
            },
            "stop" => done.extend(open.remove(&who)),
            _ => problems.push(format!("a line the witness never writes: {line:?}")),
        }
    }
    done.extend(open.into_values());
    done.sort_by_key(|t| t.start);
    for (i, a) in done.iter().enumerate() {
        for b in &done[i + 1..] {
            if b.start <= a.end {
                problems.push(format!(
                    "{} (start {}, last write sent {}) and {} (start {}) overlap by {:?}",
                    a.who,
                    a.start,
                    a.end,
                    b.who,
                    b.start,
                    Duration::from_nanos(a.end.min(b.end) - b.start)
                ));
            }
        }
    }
    // In the order the apiserver applied them, tenures only move forward.
    writes.sort_by_key(|w| w.version);
    let mut newest: Option<&Write> = None;
    for write in &writes {
        match newest {
            Some(n) if write.tenure < n.tenure => problems.push(format!(
                "a write of {} (resourceVersion {}) landed after {} had written (resourceVersion {})",
                write.who, write.version, n.who, n.version
            )),
            Some(n) if n.tenure == write.tenure => {}
            _ => newest = Some(write),
        }
    }
    (done, problems)
}

#[test]
fn the_auditor_finds_overlaps_stray_writes_and_late_landings() {
    let good = "start 10 r0\nwrite 11 r0 1 100\nstop 12 r0\nstart 13 go-0\nwrite 14 go-0 1 101\n";
    let (tenures, problems) = audit(good);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(tenures.len(), 2);
    // A frozen leader that sent a write after another started: an overlap,
    // and a late landing.
    let (_, problems) = audit(
        "start 10 r0\nwrite 11 r0 1 100\nstart 13 go-0\nwrite 14 go-0 1 101\nwrite 15 r0 2 102\nstop 16 r0\n",
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    // A write after its writer's stop.
    let (_, problems) = audit("start 10 r0\nstop 12 r0\nwrite 13 r0 2 100\n");
    assert_eq!(problems.len(), 1, "{problems:?}");
    // Sent in time, but applied after the next leader's write.
    let (_, problems) =
        audit("start 10 r0\nwrite 11 r0 1 105\nstop 12 r0\nstart 13 go-0\nwrite 14 go-0 1 101\n");
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tether_replicas_and_a_client_go_candidate_never_act_at_once() {
    let mut world = World::new().await;
    let trials = common::trials(2);
    let mut report = format!("{trials} trials of each fault; struck (-> next to act):\n");
    for fault in FAULTS {
        let mut struck = Vec::new();
        for trial in 0..trials {
            // Each fault strikes tether and client-go leaders by turns.
            let who = world.lead_by(trial % 2 == 1).await;
            let mark = world.log().lines().count();
            world.strike(fault, &who).await;
            let next = world.acting(mark).await;
            struck.push(format!("{who}->{next}"));
        }
        let _ = writeln!(report, "  {fault:?}: {}", struck.join(" "));
    }
    let log = world.log();
    let (tenures, problems) = audit(&log);
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &tenures {
        *by.entry(t.who.as_str()).or_default() += 1;
    }
    let writes: usize = tenures.iter().map(|t| t.writes).sum();
    let _ = writeln!(
        report,
        "{} tenures ({by:?}), {writes} writes, {} overlaps, stray or late writes",
        tenures.len(),
        problems.len()
    );
    println!("{report}");
    assert!(
        problems.is_empty(),
        "{problems:#?}\n{report}\n{}",
        world.elections()
    );
    // The Lease went both ways: tether took it from client-go, and back.
    assert!(
        by.keys().any(|id| id.starts_with('r')) && by.keys().any(|id| id.starts_with("go-")),
        "one implementation never led: {report}"
    );
}
