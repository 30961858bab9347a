//! Never two managers at once: each way that replicas, restarts and reloads
//! once ran a second manager, tried again, with a witness. Every manager is
//! the exec manager running a shell that writes to one log, and a sampler
//! reads `/proc` every 10 ms for the children alive (`common/witness.rs`):
//! two replicas' children alive at once (with sharding: for one remote) is
//! the failure each test counts, over its trials, and prints before it
//! asserts none. Run against an older build with `TETHER_UNDER_TEST=<its
//! tether>` to measure it the same way (docs/testkit.md).
//!
//! The tests here take turns: they measure time, and run many processes.

// Real processes and sockets: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path as FilePath, PathBuf};
use std::time::{Duration, Instant};

use common::relay::{Path, Relay};
use common::witness::{Sampler, Samples, Witness, a_remote_twice, two_replicas};
use common::{DEADLINE, Shape, Tether, lease, remote};
use serde_json::Value;
use tether_testkit::{ApiServer, Options, Resource};

/// Short Lease timings, whole seconds, with a 1 s fence margin.
const LEASE_DURATION: Duration = Duration::from_secs(2);
const TIMINGS: &str = "leaseDuration: 2s, renewDeadline: 1s, retryPeriod: 300ms";
/// The exec child's grace: within the margin (leaseDuration - renewDeadline).
const GRACE: &str = "500ms";
const TRIALS: usize = 10;

/// One test at a time: each measures time with many processes.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes `server`'s kubeconfig into `dir` and returns its path.
fn kubeconfig(dir: &FilePath, name: &str, server: &ApiServer) -> PathBuf {
    let path = dir.join(format!("{name}.kubeconfig"));
    server.kubeconfig().write(&path).expect("kubeconfig");
    path
}

/// A `leaderElection` section on Lease `lease`, reached with `kubeconfig`.
fn election(lease: &str, kubeconfig: &FilePath, identity: Option<&str>, timings: &str) -> String {
    let identity = identity.map_or_else(String::new, |id| format!("identity: {id}, "));
    format!(
        "leaderElection: {{enabled: true, leaseName: {lease}, leaseNamespace: default, {identity}{timings}, kubeconfig: {}}}",
        kubeconfig.display()
    )
}

/// A replica of the election with the witness as its manager.
fn elector(
    id: &str,
    server: &ApiServer,
    witness: &Witness,
    election: &str,
    env: &[(&str, &str)],
) -> Tether {
    Tether::start(
        &[("a", server)],
        &["--log-format", "json"],
        &Shape {
            manager: Some(&witness.manager(id, GRACE, false)),
            extra: election,
            env,
            drain_window: Some("0s"),
            ..Shape::default()
        },
    )
}

async fn status(tether: &Tether) -> Option<Value> {
    let (_, body) = tether.get("/status.json").await?;
    serde_json::from_str(&body).ok()
}

/// Waits, bounded, until `done` holds; `what` names it if it never does.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    common::until(what, DEADLINE, async || done().await.then_some(())).await;
}

/// Whether some replica leads with its manager up.
async fn some_leader_up(replicas: &[Tether]) -> bool {
    let replicas: Vec<&Tether> = replicas.iter().collect();
    leader_up(&replicas, None).await.is_some()
}

/// The first of `replicas`, but `except`, that leads with its manager up.
async fn leader_up(replicas: &[&Tether], except: Option<usize>) -> Option<usize> {
    for (i, r) in replicas.iter().enumerate() {
        if Some(i) != except
            && r.metric("tether_leader").await == Some(1.0)
            && r.metric("tether_manager_up").await == Some(1.0)
        {
            return Some(i);
        }
    }
    None
}

/// SIGKILL, and wait for the exit.
async fn kill(tether: &mut Tether) {
    let _ = tether.child.start_kill();
    let _ = tether.wait().await;
}

fn report(what: &str, trials: usize, samples: &Samples, two: usize) {
    println!(
        "{what}: {trials} trials; two managers in {two} of {} samples",
        samples.len()
    );
}

/// 1. A lease duration that a Lease cannot store is refused, with exit 2
///    and nothing started, by `validate` and by `run`, with and without
///    sharding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_duration_that_is_not_whole_seconds_starts_nothing() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = kubeconfig(dir.path(), "leases", &server);
    let witness = Witness::new();
    let mut samples = Samples::default();
    let mut two = 0;
    let mut refusals = Vec::new();
    for trial in 0..TRIALS {
        let duration = if trial % 2 == 0 { "900ms" } else { "1900ms" };
        let timings =
            format!("leaseDuration: {duration}, renewDeadline: 500ms, retryPeriod: 100ms");
        let lease = format!("w1-{trial}");
        let section = election(&lease, &leases, None, &timings);
        let watching = Sampler::start(&witness);
        let mut replicas = vec![
            elector("r0", &server, &witness, &section, &[]),
            elector("r1", &server, &witness, &section, &[]),
        ];
        // An old build runs both; give it as long as the trial lasts.
        let started = Instant::now();
        let mut codes = Vec::new();
        for r in &mut replicas {
            let left = Duration::from_secs(2).saturating_sub(started.elapsed());
            if let Ok(status) = tokio::time::timeout(left, r.child.wait()).await {
                codes.push(status.expect("wait").code());
            } else {
                kill(r).await;
                codes.push(None);
            }
        }
        let trial_samples = watching.finish().await;
        two += trial_samples.count(two_replicas);
        samples.0.extend(trial_samples.0);
        witness.kill_all();
        for (r, code) in replicas.iter().zip(&codes) {
            refusals.push((duration, *code, r.logs()));
        }
    }
    report("a lease that is not whole seconds", TRIALS, &samples, two);
    for (duration, code, logs) in refusals {
        assert_eq!(
            code,
            Some(2),
            "a {duration} lease: tether must refuse it; logs:\n{logs}"
        );
        assert!(
            logs.contains("leaderElection.leaseDuration")
                && logs.contains("whole number of seconds"),
            "{logs}"
        );
    }
    assert_eq!(two, 0, "first: {:?}", samples.first(two_replicas));
    assert!(witness.runs().is_empty(), "a manager started");
    // validate says so too, and sharding is no way around it.
    for extra in ["", "\nsharding: {enabled: true}"] {
        let config = dir.path().join("check.yaml");
        std::fs::write(
            &config,
            format!(
                "remotes: [{{name: a, kubeconfig: {}}}]\n{}{extra}\n",
                leases.display(),
                election(
                    "w1",
                    &leases,
                    None,
                    "leaseDuration: 1500ms, renewDeadline: 500ms, retryPeriod: 100ms"
                )
            ),
        )
        .expect("config");
        let out = std::process::Command::new(common::binary())
            .args(["validate", "--config"])
            .arg(&config)
            .output()
            .expect("tether validate runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("leaderElection.leaseDuration: 1500ms is not a whole number of seconds"),
            "{err}"
        );
    }
}

/// 2. Two processes that would get one identity by default (one host, or
///    one pod name) get two, and one leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_the_default_identity_never_both_lead() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = kubeconfig(dir.path(), "leases", &server);
    let witness = Witness::new();
    let mut samples = Samples::default();
    let mut two = 0;
    let mut seen = Vec::new();
    for trial in 0..TRIALS {
        let section = election(&format!("w2-{trial}"), &leases, None, TIMINGS);
        let watching = Sampler::start(&witness);
        let env = [("POD_NAME", "tether-0")];
        let mut replicas = vec![
            elector("r0", &server, &witness, &section, &env),
            elector("r1", &server, &witness, &section, &env),
        ];
        until("a leader with its manager up", async || {
            some_leader_up(&replicas).await
        })
        .await;
        // A leaseDuration more: long enough for a second leader to show.
        tokio::time::sleep(LEASE_DURATION).await;
        let identities: BTreeSet<String> = {
            let mut ids = BTreeSet::new();
            for r in &replicas {
                let s = status(r).await.expect("status");
                ids.insert(s["election"]["identity"].as_str().unwrap_or("").to_owned());
            }
            ids
        };
        for r in &mut replicas {
            kill(r).await;
        }
        let trial_samples = watching.finish().await;
        two += trial_samples.count(two_replicas);
        samples.0.extend(trial_samples.0);
        witness.kill_all();
        seen.push(identities);
    }
    report(
        "two processes, one pod name, no identity",
        TRIALS,
        &samples,
        two,
    );
    for identities in seen {
        assert_eq!(
            identities.len(),
            2,
            "one identity for two processes: {identities:?}"
        );
        for id in &identities {
            assert!(
                id.starts_with("tether-0-") && id.len() > "tether-0-".len(),
                "{id}"
            );
        }
    }
    assert_eq!(two, 0, "first: {:?}", samples.first(two_replicas));
}

/// 2. Two processes given one identity on purpose: the second sees that
///    another process writes its Lease, says so, and never leads beside it.
///    With sharding, it holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_under_one_identity_is_reported_and_never_runs_a_manager() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = kubeconfig(dir.path(), "leases", &server);
    let witness = Witness::new();
    let watching = Sampler::start(&witness);
    let section = election("w2-twin", &leases, Some("twin"), TIMINGS);
    let mut first = elector("first", &server, &witness, &section, &[]);
    until("the first leads", async || {
        some_leader_up(std::slice::from_ref(&first)).await
    })
    .await;
    let mut second = elector("second", &server, &witness, &section, &[]);
    // Two leaseDurations: long enough for the clash to show either way.
    tokio::time::sleep(LEASE_DURATION * 2).await;
    let election_status = status(&second).await.expect("status");
    let election_logs = second.logs();
    kill(&mut first).await;
    kill(&mut second).await;
    let election_samples = watching.finish().await;
    witness.kill_all();

    // Sharding: two members under one identity never hold a remote twice.
    let remotes = [
        remote("s0", false).await,
        remote("s1", false).await,
        remote("s2", false).await,
    ];
    let servers: Vec<(&str, &ApiServer)> = vec![
        ("s0", &remotes[0]),
        ("s1", &remotes[1]),
        ("s2", &remotes[2]),
    ];
    let sharding = format!(
        "{}\nsharding: {{enabled: true, leasePrefix: w2-twin}}",
        election("unused", &leases, Some("twin"), TIMINGS)
    );
    let member = |id: &str| {
        Tether::start(
            &servers,
            &["--log-format", "json"],
            &Shape {
                manager: Some(&witness.manager(id, GRACE, false)),
                extra: &sharding,
                drain_window: Some("0s"),
                ..Shape::default()
            },
        )
    };
    let watching = Sampler::start(&witness);
    let mut a = member("a");
    until("a holds every remote", async || {
        status(&a)
            .await
            .is_some_and(|s| s["shard"]["owned"].as_array().is_some_and(|o| o.len() == 3))
    })
    .await;
    let mut b = member("b");
    tokio::time::sleep(LEASE_DURATION * 2).await;
    let shard_twin = status(&b).await.map(|s| s["shard"]["twin"].clone());
    kill(&mut a).await;
    kill(&mut b).await;
    let shard_samples = watching.finish().await;
    witness.kill_all();
    println!(
        "one identity, two processes: two leaders in {} of {} samples; a remote held twice in {} of {} samples",
        election_samples.count(two_replicas),
        election_samples.len(),
        shard_samples.count(a_remote_twice),
        shard_samples.len()
    );
    assert_eq!(
        election_status["election"]["twin"], true,
        "{election_status}"
    );
    let verdict = election_status["verdict"]["text"].as_str().unwrap_or("");
    assert!(verdict.contains("own identity"), "{verdict}");
    assert!(
        election_logs.contains("two processes share one identity"),
        "{election_logs}"
    );
    assert_eq!(shard_twin, Some(Value::Bool(true)));
    assert_eq!(
        election_samples.count(two_replicas),
        0,
        "first: {:?}",
        election_samples.first(two_replicas)
    );
    assert_eq!(
        shard_samples.count(a_remote_twice),
        0,
        "first: {:?}",
        shard_samples.first(a_remote_twice)
    );
}

/// Sharded replicas, each with the witness as its manager.
struct Group {
    remotes: Vec<ApiServer>,
    leases: PathBuf,
    _dir: tempfile::TempDir,
}

impl Group {
    async fn new(server: &ApiServer, n: usize) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let leases = kubeconfig(dir.path(), "leases", server);
        let mut remotes = Vec::new();
        for i in 0..n {
            remotes.push(
                ApiServer::start(Options::default().name(format!("s{i}")))
                    .await
                    .expect("server"),
            );
        }
        Self {
            remotes,
            leases,
            _dir: dir,
        }
    }

    fn member(&self, id: &str, prefix: &str, witness: &Witness) -> Tether {
        let names: Vec<String> = (0..self.remotes.len()).map(|i| format!("s{i}")).collect();
        let servers: Vec<(&str, &ApiServer)> = names
            .iter()
            .map(String::as_str)
            .zip(&self.remotes)
            .collect();
        let sharding = format!(
            "{}\nsharding: {{enabled: true, leasePrefix: {prefix}}}",
            election("unused", &self.leases, Some(id), TIMINGS)
        );
        Tether::start(
            &servers,
            &["--log-format", "json"],
            &Shape {
                manager: Some(&witness.manager(id, GRACE, false)),
                extra: &sharding,
                drain_window: Some("0s"),
                ..Shape::default()
            },
        )
    }
}

/// What the members say they hold, from `/status.json`: whether some
/// remote is in two members' shares at once. (A build whose children are
/// not told their share can be judged by this alone.)
async fn owned_twice(members: &[Tether]) -> bool {
    let mut seen = BTreeSet::new();
    for m in members {
        let owned = status(m).await.map(|s| s["shard"]["owned"].clone());
        for name in owned.iter().filter_map(Value::as_array).flatten() {
            if !seen.insert(name.as_str().unwrap_or("").to_owned()) {
                return true;
            }
        }
    }
    false
}

/// Whether every member is a full member, waits for nothing, and the
/// witness sees each remote in exactly one child's share.
async fn settled(members: &[Tether], witness: &Witness, remotes: usize) -> bool {
    for m in members {
        let Some(s) = status(m).await else {
            return false;
        };
        let shard = &s["shard"];
        if !shard["joiningSeconds"].is_null()
            || shard["waiting"].as_array().is_none_or(|w| !w.is_empty())
            || shard["members"].as_array().map_or(0, Vec::len) != members.len()
        {
            return false;
        }
    }
    let alive = witness.alive();
    if !alive.is_empty() && alive.iter().all(|a| a.remotes.is_empty()) {
        // An older build tells its children nothing: what the members say
        // is all there is to judge by.
        return true;
    }
    let mut held = std::collections::BTreeMap::<String, usize>::new();
    for child in &alive {
        for r in &child.remotes {
            *held.entry(r.clone()).or_default() += 1;
        }
    }
    held.len() == remotes && held.values().all(|n| *n == 1)
}

/// 3. Three sharded replicas that start together: each waits a
///    leaseDuration before it takes a share, so none takes every remote
///    while the others' Leases are still unwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_started_together_never_hold_a_remote_twice() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let group = Group::new(&server, 6).await;
    let witness = Witness::new();
    let mut samples = Samples::default();
    let mut twice = 0;
    let (mut polls, mut reported_twice) = (0, 0);
    let mut took = Vec::new();
    for trial in 0..TRIALS {
        let prefix = format!("w3-{trial}");
        let watching = Sampler::start(&witness);
        let started = Instant::now();
        let mut members: Vec<Tether> = ["a", "b", "c"]
            .iter()
            .map(|id| group.member(id, &prefix, &witness))
            .collect();
        until("the shares settle", async || {
            polls += 1;
            reported_twice += usize::from(owned_twice(&members).await);
            settled(&members, &witness, group.remotes.len()).await
        })
        .await;
        took.push(started.elapsed());
        for m in &mut members {
            kill(m).await;
        }
        let trial_samples = watching.finish().await;
        twice += trial_samples.count(a_remote_twice);
        samples.0.extend(trial_samples.0);
        witness.kill_all();
    }
    took.sort();
    println!(
        "three sharded replicas started together: {TRIALS} trials; a remote held twice in {twice} of {} samples, and said to be in {reported_twice} of {polls} polls of /status.json; settled in {:?} to {:?}",
        samples.len(),
        took[0],
        took[TRIALS - 1]
    );
    assert_eq!(twice, 0, "first: {:?}", samples.first(a_remote_twice));
    assert_eq!(reported_twice, 0);
}

/// 4. With sharding, the exec manager runs only where a remote is held,
///    and its process is told its share: `TETHER_REMOTES`, and the file
///    `TETHER_REMOTES_FILE` names with each remote's kubeconfig.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_manager_runs_only_on_a_replica_with_a_share_and_is_told_it() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let group = Group::new(&server, 1).await;
    let witness = Witness::new();
    let watching = Sampler::start(&witness);
    let mut members: Vec<Tether> = ["a", "b"]
        .iter()
        .map(|id| group.member(id, "w4", &witness))
        .collect();
    until("one child holds the remote", async || {
        settled(&members, &witness, 1).await
    })
    .await;
    // A leaseDuration more: long enough for a second child to show (the
    // sampler sees every overlap); then settled again, since on a loaded
    // machine a renewal past renewDeadline may move the remote meanwhile
    // (seen beside stress-ng --cpu 2).
    tokio::time::sleep(LEASE_DURATION).await;
    until(
        "one child holds the remote, a leaseDuration later",
        async || settled(&members, &witness, 1).await,
    )
    .await;
    let alive = witness.alive();
    println!(
        "sharding with the exec manager, one remote, two replicas: {} children alive: {:?}",
        alive.len(),
        alive
            .iter()
            .map(|a| (&a.replica, &a.remotes))
            .collect::<Vec<_>>()
    );
    assert_eq!(alive.len(), 1, "{alive:?}");
    let child = &alive[0];
    assert_eq!(child.remotes, BTreeSet::from(["s0".to_owned()]));
    let (holder, idle) = if child.replica == "a" {
        (&members[0], &members[1])
    } else {
        (&members[1], &members[0])
    };
    // The share the child was told is the one its replica holds.
    let owned = status(holder).await.expect("status")["shard"]["owned"].clone();
    assert_eq!(owned, serde_json::json!(["s0"]));
    // The file names the remote's kubeconfig, as configured.
    let environ = std::fs::read(format!("/proc/{}/environ", child.pid)).expect("environ");
    let environ = String::from_utf8_lossy(&environ);
    let file = environ
        .split('\0')
        .find_map(|v| v.strip_prefix("TETHER_REMOTES_FILE="))
        .expect("TETHER_REMOTES_FILE is set");
    let listed: Value =
        serde_json::from_str(&std::fs::read_to_string(file).expect("the remotes file"))
            .expect("JSON");
    assert_eq!(listed["remotes"][0]["name"], "s0");
    let path = listed["remotes"][0]["kubeconfig"]
        .as_str()
        .expect("a kubeconfig");
    assert!(
        std::fs::read_to_string(path)
            .expect("the kubeconfig exists")
            .contains(&group.remotes[0].url()),
        "{path}"
    );
    // The other replica runs no child, and says why: ready, standing by.
    let (code, body) = idle.get("/readyz").await.expect("answers");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("standby (holds none of the 1 remotes)"),
        "{body}"
    );
    let verdict = status(idle).await.expect("status")["verdict"].clone();
    assert_eq!(verdict["state"], "standby", "{verdict}");
    for m in &mut members {
        kill(m).await;
    }
    let samples = watching.finish().await;
    witness.kill_all();
    report(
        "sharding with the exec manager",
        1,
        &samples,
        samples.count(a_remote_twice),
    );
    assert_eq!(
        samples.count(a_remote_twice),
        0,
        "first: {:?}",
        samples.first(a_remote_twice)
    );
}

/// 3. The Lease deleted under the leader: a follower has not seen it
///    missing for a leaseDuration, so it does not take it; the leader, whose
///    claim is current, writes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_under_the_leader_is_not_taken_while_its_manager_runs() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = kubeconfig(dir.path(), "leases", &server);
    let witness = Witness::new();
    let section = election("w3-deleted", &leases, None, TIMINGS);
    let watching = Sampler::start(&witness);
    let mut replicas: Vec<Tether> = ["r0", "r1", "r2"]
        .iter()
        .map(|id| elector(id, &server, &witness, &section, &[]))
        .collect();
    for _ in 0..TRIALS {
        until("a leader with its manager up", async || {
            some_leader_up(&replicas).await
        })
        .await;
        assert!(
            server.delete(Resource::Lease, "default", "w3-deleted"),
            "the Lease existed"
        );
        // Long enough for a follower to take a missing Lease, and more.
        tokio::time::sleep(LEASE_DURATION + Duration::from_millis(500)).await;
    }
    for r in &mut replicas {
        kill(r).await;
    }
    let samples = watching.finish().await;
    witness.kill_all();
    let two = samples.count(two_replicas);
    report("the Lease deleted under the leader", TRIALS, &samples, two);
    assert_eq!(two, 0, "first: {:?}", samples.first(two_replicas));
}

/// 5. A reload that would stretch the exec manager's grace past the
///    running election's fence is refused, and the last good config keeps
///    running: a leader cut off from its Lease still stops in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_would_break_the_fence_is_refused() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let witness = Witness::new();
    let watching = Sampler::start(&witness);
    let mut replicas = Vec::new();
    for id in ["r0", "r1", "r2"] {
        let relay = Relay::start(server.addr()).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let mut kc = server.kubeconfig();
        kc.server = format!("https://{}", relay.addr);
        let path = dir.path().join("leases.kubeconfig");
        kc.write(&path).expect("kubeconfig");
        let tether = Tether::start(
            &[("a", &server)],
            &["--log-format", "json"],
            &Shape {
                // The child shrugs SIGTERM off: only the grace period's
                // SIGKILL stops it, so the grace decides the overlap.
                manager: Some(&witness.manager(id, GRACE, true)),
                extra: &election("w5", &path, Some(id), TIMINGS),
                drain_window: Some("0s"),
                ..Shape::default()
            },
        );
        replicas.push((tether, relay, dir));
    }
    let mut reloads = 0.0;
    for trial in 0..TRIALS {
        let tethers: Vec<&Tether> = replicas.iter().map(|(t, _, _)| t).collect();
        let mut leader = None;
        until("a leader with its manager up", async || {
            leader = leader_up(&tethers, None).await;
            leader.is_some()
        })
        .await;
        let leader = leader.expect("found");
        // Every replica's file now asks for a 3 s grace, and a leaseDuration
        // that would fit it, which takes effect only at a restart.
        for (t, _, _) in &replicas {
            let text = std::fs::read_to_string(&t.config).expect("config");
            let text = text
                .replace(&format!("gracePeriod: {GRACE}"), "gracePeriod: 3s")
                .replace("leaseDuration: 2s", "leaseDuration: 20s");
            std::fs::write(&t.config, text).expect("config");
            t.signal("HUP");
        }
        // The reload is done once either counter moves (an older build
        // applies it).
        reloads += 1.0;
        let (leading, _, _) = &replicas[leader];
        until("the reload is done", async || {
            let rejected = leading
                .metric("tether_config_reloads_total{result=\"rejected\"}")
                .await
                .unwrap_or(0.0);
            let applied = leading
                .metric("tether_config_reloads_total{result=\"applied\"}")
                .await
                .unwrap_or(0.0);
            rejected + applied >= reloads
        })
        .await;
        replicas[leader].1.set(if trial % 2 == 0 {
            Path::Refuse
        } else {
            Path::Hang
        });
        until("another replica takes over", async || {
            leader_up(&tethers, Some(leader)).await.is_some()
        })
        .await;
        replicas[leader].1.set(Path::Up);
    }
    let logs = replicas[0].0.logs();
    // Read once the admin server answers: on a loaded machine one GET can
    // run past its two seconds, and that is no count.
    let rejected = common::poll(DEADLINE, common::EVERY, async || {
        replicas[0]
            .0
            .metric("tether_config_reloads_total{result=\"rejected\"}")
            .await
    })
    .await;
    for (t, _, _) in &mut replicas {
        kill(t).await;
    }
    let samples = watching.finish().await;
    witness.kill_all();
    let two = samples.count(two_replicas);
    report(
        "a reload stretching the grace, then a partition",
        TRIALS,
        &samples,
        two,
    );
    #[allow(clippy::cast_precision_loss)]
    let trials = TRIALS as f64;
    assert_eq!(rejected, Some(trials), "every reload is refused");
    assert!(
        logs.contains("manager.exec.gracePeriod") && logs.contains("running election"),
        "the rejection names the field and why: {logs}"
    );
    assert_eq!(two, 0, "first: {:?}", samples.first(two_replicas));
}

/// 6. tether killed with SIGKILL takes its child with it, so a restarted
///    tether never runs a second one beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tether_takes_its_child_with_it() {
    let _turn = TURN.lock().await;
    let server = remote("a", false).await;
    let witness = Witness::new();
    let watching = Sampler::start(&witness);
    let mut gone_after = Vec::new();
    for trial in 0..TRIALS {
        let id = format!("life-{trial}");
        let mut tether = Tether::start(
            &[("a", &server)],
            &[],
            &Shape {
                manager: Some(&witness.manager(&id, GRACE, false)),
                ..Shape::default()
            },
        );
        until("the child runs", async || {
            witness.alive().iter().any(|a| a.replica == id)
        })
        .await;
        let killed = Instant::now();
        kill(&mut tether).await;
        let started = Instant::now();
        while witness.alive().iter().any(|a| a.replica == id) {
            if started.elapsed() > Duration::from_secs(5) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        gone_after.push(killed.elapsed());
    }
    let samples = watching.finish().await;
    let left = witness.alive();
    witness.kill_all();
    gone_after.sort();
    let two = samples.count(two_replicas);
    println!(
        "tether SIGKILLed and started again: {TRIALS} trials; its child gone after {:?} to {:?}; two managers in {two} of {} samples; {} children left at the end",
        gone_after[0],
        gone_after[TRIALS - 1],
        samples.len(),
        left.len()
    );
    assert!(left.is_empty(), "children outlived tether: {left:?}");
    assert_eq!(two, 0, "first: {:?}", samples.first(two_replicas));
}

/// The near miss: a `409 Conflict` on the leader's own renewal (another
/// writer touched the Lease) is a failed try, not a loss. A leader whose
/// renewals all fail steps down at renewDeadline, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_renewal_is_a_failed_try_not_a_lost_lease() {
    let _turn = TURN.lock().await;
    let server = remote("lease", true).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = kubeconfig(dir.path(), "leases", &server);
    let witness = Witness::new();
    // A renewDeadline of many retry periods: the renewal after a lost one
    // must land within it, and beside a CPU hog (stress-ng --cpu 2) a try
    // took more than the 1s of TIMINGS. It also makes the leader that
    // cannot renew send more renewals than it used to remember, and it
    // then took its own record for a twin's: the verdict below said "two
    // processes share one identity".
    let section = election(
        "w409",
        &leases,
        Some("only"),
        "leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 300ms",
    );
    let tether = elector("only", &server, &witness, &section, &[]);
    until("it leads", async || {
        some_leader_up(std::slice::from_ref(&tether)).await
    })
    .await;
    let renewed = async || {
        lease(&server, "w409")
            .await
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
    };
    let mut saw_conflict = false;
    for _ in 0..5 {
        // One renewal loses a race; the next one wins.
        server.lose_updates(Resource::Lease, 1);
        let before = renewed().await;
        until("a renewal after the lost one", async || {
            if status(&tether).await.is_some_and(|s| {
                s["election"]["lastError"]
                    .as_str()
                    .is_some_and(|e| e.contains("409"))
            }) {
                saw_conflict = true;
            }
            renewed().await != before
        })
        .await;
    }
    let transitions = tether.metric("tether_leader_transitions_total").await;
    let lost = tether
        .metric("tether_cycles_total{cause=\"leadership_lost\"}")
        .await;
    println!(
        "five renewals lost a race: role changes {transitions:?} (1: it took the lead and kept it); cycles ended by a lost leadership {lost:?}; the 409 shown: {saw_conflict}"
    );
    assert_eq!(
        transitions,
        Some(1.0),
        "a conflict cost the leadership; logs:\n{}",
        tether.logs()
    );
    assert_eq!(lost, Some(0.0));
    assert!(saw_conflict, "the 409 was never shown on /status.json");
    // Every renewal loses: at renewDeadline the leader stands down, and says
    // the Lease still names it but it cannot renew it.
    server.lose_updates(Resource::Lease, u64::MAX);
    until("the leader stands down", async || {
        tether.metric("tether_leader").await == Some(0.0)
    })
    .await;
    // The verdict shows the last failed try: on a loaded machine one may
    // time out before the server answers its 409; the next answers.
    let mut verdict = String::new();
    let said = common::poll(DEADLINE, common::EVERY, async || {
        let s = status(&tether).await?;
        verdict = s["verdict"]["text"].as_str().unwrap_or("").to_owned();
        (verdict.contains("still names this replica, which cannot renew it")
            && verdict.contains("409"))
        .then_some(())
    })
    .await;
    assert!(said.is_some(), "{verdict}");
    assert!(!verdict.contains("(leader: only)"), "{verdict}");
    server.lose_updates(Resource::Lease, 0);
    until("it leads again", async || {
        some_leader_up(std::slice::from_ref(&tether)).await
    })
    .await;
    witness.kill_all();
}
