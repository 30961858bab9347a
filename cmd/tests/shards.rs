//! Sharing the remotes among replicas: tether processes, each on a shard
//! Lease of its own in one apiserver (simulated, and again a real
//! kube-apiserver from `scripts/peers`), and thirty simulated remotes. Each replica reaches the remotes as a user of its own
//! (`as:` in its kubeconfigs), so the remotes count who probes them.

// Real processes and sockets: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{DEADLINE, Shape, Tether};
use tether::lease::shard::owner;
use tether_testkit::{ApiServer, Cluster, Options, RealOptions};

const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// The test config's probe interval.
const INTERVAL: Duration = Duration::from_secs(1);
const REMOTES: usize = 30;

struct Remote {
    name: String,
    server: ApiServer,
    /// Its key, as tether hashes it: the normalized URL.
    key: String,
}

async fn remotes() -> Vec<Remote> {
    let mut remotes = Vec::new();
    for i in 0..REMOTES {
        let name = format!("r{i:02}");
        let server = ApiServer::start(Options::default().name(&name))
            .await
            .expect("server");
        let key = tether_probes::client::normalize_url(&server.url().parse().expect("a URL"))
            .expect("normalized");
        remotes.push(Remote { name, server, key });
    }
    remotes
}

struct Replica {
    id: String,
    tether: Tether,
    _dir: tempfile::TempDir,
}

/// A replica named `id`; `in_pod` gives it the downward API's variables, so
/// it records Events on a Pod of that name where its Leases are.
fn replica(id: &str, leases: &impl Cluster, remotes: &[Remote], in_pod: bool) -> Replica {
    replica_with(id, leases, remotes, in_pod, None)
}

/// As [`replica`], with `manager` for its manager section (default: the
/// built-in watch manager).
fn replica_with(
    id: &str,
    leases: &impl Cluster,
    remotes: &[Remote],
    in_pod: bool,
    manager: Option<&str>,
) -> Replica {
    let dir = tempfile::tempdir().expect("temp dir");
    let lease_kubeconfig = dir.path().join("leases.kubeconfig");
    leases
        .kubeconfig()
        .write(&lease_kubeconfig)
        .expect("kubeconfig");
    let kubeconfigs: Vec<(&str, String)> = remotes
        .iter()
        .map(|r| {
            let mut kubeconfig = r.server.kubeconfig();
            kubeconfig.impersonate = Some(id.to_owned());
            (r.name.as_str(), kubeconfig.to_yaml())
        })
        .collect();
    let kubeconfigs: Vec<(&str, &str)> = kubeconfigs
        .iter()
        .map(|(name, yaml)| (*name, yaml.as_str()))
        .collect();
    let extra = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, identity: {id}, \
         leaseDuration: {}ms, renewDeadline: {}ms, retryPeriod: {}ms, kubeconfig: {}}}\n\
         sharding: {{enabled: true}}",
        LEASE_DURATION.as_millis(),
        RENEW_DEADLINE.as_millis(),
        RETRY_PERIOD.as_millis(),
        lease_kubeconfig.display()
    );
    let servers: Vec<(&str, &ApiServer)> = remotes
        .iter()
        .map(|r| (r.name.as_str(), &r.server))
        .collect();
    // The Events are found by the Pod's name; its UID only has to be one.
    let pod = [
        ("POD_NAME", id),
        ("POD_NAMESPACE", "default"),
        ("POD_UID", "6f1c2d3e-0000-4000-8000-000000000001"),
    ];
    let tether = Tether::start(
        &servers,
        &["--log-format", "json"],
        &Shape {
            kubeconfigs: &kubeconfigs,
            extra: &extra,
            env: if in_pod { &pod } else { &[] },
            manager,
            ..Shape::default()
        },
    );
    Replica {
        id: id.to_owned(),
        tether,
        _dir: dir,
    }
}

/// What a replica says it holds and waits for, from `/status.json`.
async fn share(replica: &Replica) -> Option<(BTreeSet<String>, usize, usize)> {
    let (_, body) = replica.tether.get("/status.json").await?;
    let status: serde_json::Value = serde_json::from_str(&body).ok()?;
    let shard = &status["shard"];
    let names = |field: &str| -> BTreeSet<String> {
        shard[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    Some((
        names("owned"),
        names("waiting").len(),
        shard["members"].as_array().map_or(0, Vec::len),
    ))
}

/// Polls until the replicas hold the remotes as rendezvous hashing over
/// their identities says, none waiting, each seeing them all; returns the
/// owner of each remote and how long it took.
async fn until_settled(
    replicas: &[&Replica],
    remotes: &[Remote],
) -> (BTreeMap<String, String>, Duration) {
    let started = Instant::now();
    let ids: Vec<&str> = replicas.iter().map(|r| r.id.as_str()).collect();
    let want: BTreeMap<String, String> = remotes
        .iter()
        .map(|r| {
            let owner = owner(&r.key, ids.iter().copied()).expect("members");
            (r.name.clone(), owner.to_owned())
        })
        .collect();
    let what = format!("the shares settle as {want:?}");
    common::until(what, DEADLINE, async || {
        let mut got = BTreeMap::new();
        for replica in replicas {
            let Some((owned, 0, members)) = share(replica).await else {
                return None;
            };
            if members != replicas.len() {
                return None;
            }
            for name in owned {
                if got.insert(name, replica.id.clone()).is_some() {
                    return None;
                }
            }
        }
        (got == want).then(|| (got, started.elapsed()))
    })
    .await
}

/// Asserts that, from now on, each remote is probed by its owner alone:
/// waits until every remote has had two more probes from its owner, and
/// checks that no other replica probed it meanwhile.
async fn probed_by_owners_alone(owners: &BTreeMap<String, String>, remotes: &[Remote]) {
    let count = |r: &Remote| -> BTreeMap<String, u64> {
        r.server
            .requests_by("/readyz")
            .into_iter()
            .map(|(user, requests)| (user, requests.count))
            .collect()
    };
    let before: Vec<BTreeMap<String, u64>> = remotes.iter().map(count).collect();
    common::until(
        "two more probes of each remote by its owner",
        DEADLINE,
        async || {
            let now: Vec<BTreeMap<String, u64>> = remotes.iter().map(count).collect();
            let mut done = true;
            for ((remote, before), now) in remotes.iter().zip(&before).zip(&now) {
                let owner = &owners[&remote.name];
                for (user, count) in now {
                    let grew = count - before.get(user).copied().unwrap_or(0);
                    if user == owner {
                        done &= grew >= 2;
                    } else {
                        assert_eq!(
                            grew, 0,
                            "{} is {owner}'s, but {user} probed it too",
                            remote.name
                        );
                    }
                }
                done &= now.contains_key(owner);
            }
            done.then_some(())
        },
    )
    .await;
}

/// A witness of the watches: every 10 ms, which replicas have a watch open
/// on each remote, as the remote counts them. A sample with two is a remote
/// run twice at once.
struct Watches {
    on: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, BTreeSet<String>, Vec<Twice>)>,
}

/// A remote, and the replicas that had a watch open on it at one sample.
type Twice = (String, BTreeMap<String, usize>);

impl Watches {
    fn start(remotes: &Arc<Vec<Remote>>) -> Self {
        let on = Arc::new(AtomicBool::new(true));
        let (sampling, remotes) = (Arc::clone(&on), Arc::clone(remotes));
        let task = tokio::spawn(async move {
            let (mut samples, mut watched, mut twice) = (0, BTreeSet::new(), Vec::new());
            while sampling.load(Ordering::SeqCst) {
                for remote in remotes.iter() {
                    let by = remote.server.open_watches_by();
                    if !by.is_empty() {
                        watched.insert(remote.name.clone());
                    }
                    if by.len() > 1 {
                        twice.push((remote.name.clone(), by));
                    }
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (samples, watched, twice)
        });
        Self { on, task }
    }

    /// Stops sampling; asserts that no remote was watched by two replicas
    /// at once, and that the samples saw watches move.
    async fn none_twice(self) {
        self.on.store(false, Ordering::SeqCst);
        let (samples, watched, twice) = self.task.await.expect("the witness");
        eprintln!("the watch witness took {samples} samples");
        assert!(samples > 100, "too few samples: {samples}");
        assert_eq!(
            watched.len(),
            REMOTES,
            "the witness saw watches, by replica, on only {watched:?}"
        );
        assert!(
            twice.is_empty(),
            "{} samples saw a remote watched by two replicas, the first: {:?}",
            twice.len(),
            twice.first()
        );
    }
}

/// Which cycle a replica runs, and how many ended for a share change.
async fn cycles(replica: &Replica) -> (Option<f64>, Option<f64>) {
    (
        replica.tether.metric("tether_cycle").await,
        replica
            .tether
            .metric("tether_cycles_total{cause=\"shard_changed\"}")
            .await,
    )
}

/// Asserts that `replicas` run the cycles they ran at `running`: their
/// shares moved remote by remote, `what` ending none; and at least one remote was `change`d for a share between them.
async fn ran_on(
    replicas: [&Replica; 2],
    running: &[(Option<f64>, Option<f64>); 2],
    change: &str,
    what: &str,
) {
    let mut changed = 0.0;
    for (replica, was) in replicas.iter().zip(running) {
        assert_eq!(
            &cycles(replica).await,
            was,
            "{what} ended a cycle of {}",
            replica.id
        );
        let series =
            format!("tether_remote_changes_total{{cause=\"shard_changed\",change=\"{change}\"}}");
        changed += replica.tether.metric(&series).await.unwrap_or_default();
    }
    assert!(changed >= 1.0, "{what}: no remote {change} for a share");
}

/// Asserts that `tether_remote_owned` is 1 on each remote's owner and 0 on
/// the other replicas: set in the step that changes what `/status.json`
/// says a replica holds, so a settled share shows in it at once.
async fn owned_series_follow(replicas: &[&Replica], owners: &BTreeMap<String, String>) {
    for replica in replicas {
        let (_, metrics) = replica.tether.get("/metrics").await.expect("metrics");
        for (name, owner) in owners {
            let series = format!("tether_remote_owned{{remote=\"{name}\"}} ");
            let value = metrics
                .lines()
                .find_map(|line| line.strip_prefix(&series))
                .unwrap_or_else(|| panic!("{} exports no {series}", replica.id));
            let want = if *owner == replica.id { "1" } else { "0" };
            assert_eq!(value.trim(), want, "{series}on {}", replica.id);
        }
    }
}

/// Asserts that each remote's reachability gauge is on its owner alone.
async fn only_owners_export(
    replicas: &[&Replica],
    owners: &BTreeMap<String, String>,
    remotes: &[Remote],
) {
    for replica in replicas {
        let (_, metrics) = replica.tether.get("/metrics").await.expect("metrics");
        for remote in remotes {
            let label = format!("remote=\"{}\"", remote.name);
            let exported = metrics.lines().any(|line| {
                line.starts_with("tether_remote_apiserver_reachable{") && line.contains(&label)
            });
            assert_eq!(
                exported,
                owners[&remote.name] == replica.id,
                "{} on {}",
                remote.name,
                replica.id
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_remotes_and_a_loss_or_a_join_moves_only_what_it_must() {
    let leases = ApiServer::start(
        Options::default()
            .name("leases")
            .tls(true)
            .token("leases-token"),
    )
    .await
    .expect("the Leases' apiserver");
    share_the_remotes(&leases, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_real_leases_replicas_share_the_remotes_and_a_loss_or_a_join_moves_only_what_it_must() {
    let leases = common::real_plane(RealOptions::default().name("leases")).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path().join("leases.kubeconfig");
    leases.kubeconfig().write(&home).expect("kubeconfig");
    share_the_remotes(&leases, Some(&home)).await;
    // The real apiserver holds the shard Leases tether wrote: the two
    // members still running, with their holders.
    let client = kube::Client::try_from(common::config_of(&leases).await).expect("client");
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client, "default");
    let held: Vec<String> = api
        .list(&kube::api::ListParams::default())
        .await
        .expect("list Leases")
        .items
        .into_iter()
        .filter_map(|l| l.spec?.holder_identity)
        .collect();
    for id in ["tether-a", "tether-b"] {
        assert!(
            held.iter().any(|h| h == id),
            "{id} holds no Lease: {held:?}"
        );
    }
}

/// The remotes whose owner differs from `before` to `now`.
fn moved_between<'a>(
    before: &'a BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<&'a String> {
    before
        .iter()
        .filter(|(name, owner)| now[*name] != **owner)
        .map(|(name, _)| name)
        .collect()
}

/// Never two at once: the old owner's last probe of each `moved` remote
/// came before the new member's first (`owners` as they were before).
fn probes_handed_over(remotes: &[Remote], moved: &[&String], owners: &BTreeMap<String, String>) {
    for remote in remotes.iter().filter(|r| moved.contains(&&r.name)) {
        let by = remote.server.requests_by("/readyz");
        let (old, new) = (&by[&owners[&remote.name]], &by["tether-d"]);
        assert!(
            old.last < new.first,
            "{} was probed by {} until {:?} after tether-d began",
            remote.name,
            owners[&remote.name],
            old.last - new.first
        );
    }
}

/// Three replicas share the remotes, one is killed, one joins, one stops.
/// With `events` (a kubeconfig of the Leases' cluster), the replicas run
/// "in Pods" and each change of a share is an Event on its Pod there.
async fn share_the_remotes(leases: &impl Cluster, events: Option<&Path>) {
    let remotes = Arc::new(remotes().await);
    let watches = Watches::start(&remotes);
    let in_pod = events.is_some();
    let a = replica("tether-a", leases, &remotes, in_pod);
    let b = replica("tether-b", leases, &remotes, in_pod);
    let mut c = replica("tether-c", leases, &remotes, in_pod);

    let (owners, took) = until_settled(&[&a, &b, &c], &remotes).await;
    eprintln!("three replicas settled in {took:?}");
    for id in ["tether-a", "tether-b", "tether-c"] {
        let n = owners.values().filter(|o| *o == id).count();
        assert!(n > 0, "{id} holds nothing: {owners:?}");
    }
    probed_by_owners_alone(&owners, &remotes).await;
    // Only the owner exports a remote's gauge.
    only_owners_export(&[&a, &b, &c], &owners, &remotes).await;
    owned_series_follow(&[&a, &b, &c], &owners).await;

    // A replica dies: its remotes move to the others within leaseDuration
    // and a round or two; no other remote moves, and the others take them
    // in their running cycles.
    let running = [cycles(&a).await, cycles(&b).await];
    c.tether.signal("KILL");
    let _ = c.tether.wait().await;
    let killed = Instant::now();
    let (after, took) = until_settled(&[&a, &b], &remotes).await;
    owned_series_follow(&[&a, &b], &after).await;
    let moved = moved_between(&owners, &after);
    eprintln!(
        "a member lost: {} of {REMOTES} remotes moved in {:?} (settled {took:?} after the first poll)",
        moved.len(),
        killed.elapsed()
    );
    for name in &moved {
        assert_eq!(
            owners[*name], "tether-c",
            "{name} moved, but was not the lost member's"
        );
    }
    assert_eq!(
        moved.len(),
        owners.values().filter(|o| *o == "tether-c").count()
    );
    let bound = LEASE_DURATION + INTERVAL + RETRY_PERIOD * 2;
    assert!(
        killed.elapsed() < bound + Duration::from_secs(1),
        "the lost member's remotes took {:?} to move (bound {bound:?})",
        killed.elapsed()
    );
    probed_by_owners_alone(&after, &remotes).await;
    ran_on(
        [&a, &b],
        &running,
        "added",
        "taking a lost member's remotes",
    )
    .await;

    // A replica joins: about a third moves to it, and only to it; the
    // others give theirs up in their running cycles.
    let d = replica("tether-d", leases, &remotes, in_pod);
    let (joined, took) = until_settled(&[&a, &b, &d], &remotes).await;
    owned_series_follow(&[&a, &b, &d], &joined).await;
    let moved = moved_between(&after, &joined);
    eprintln!(
        "a member joined: {} of {REMOTES} remotes moved to it in {took:?}",
        moved.len()
    );
    for name in &moved {
        assert_eq!(
            joined[*name], "tether-d",
            "{name} moved between members that stayed"
        );
    }
    assert!(!moved.is_empty(), "nothing moved to the new member");
    ran_on(
        [&a, &b],
        &running,
        "removed",
        "giving remotes up to a new member",
    )
    .await;
    if let Some(home) = events {
        // The newcomer held nothing: each change of its share only took.
        let changes = common::until_events(home, "tether-d", &["ShardChanged"]).await;
        for (reason, kind, message) in changes.iter().filter(|(r, _, _)| r == "ShardChanged") {
            assert_eq!(kind, "Normal", "{reason}: {message}");
            assert!(
                message.starts_with("this replica now holds ") && message.ends_with(", gave up 0"),
                "{message}"
            );
        }
    }
    probed_by_owners_alone(&joined, &remotes).await;
    probes_handed_over(&remotes, &moved, &after);

    // A clean stop releases the Lease: the others take its remotes at once,
    // without waiting out leaseDuration.
    let mut d = d;
    let stopped = Instant::now();
    d.tether.signal("TERM");
    assert_eq!(d.tether.wait().await.code(), Some(0), "{}", d.tether.logs());
    let (_, _) = until_settled(&[&a, &b], &remotes).await;
    eprintln!(
        "a member stopped: the others took its remotes in {:?}",
        stopped.elapsed()
    );
    watches.none_twice().await;
}

/// A replica whose manager is the mirror controller in its fleet mode, on
/// tether's Go package, following its remotes file (and acknowledging each
/// revision), with `home` (a kubeconfig) as its home cluster.
fn follower(id: &str, leases: &impl Cluster, remotes: &[Remote], home: &Path) -> Replica {
    let health = format!("127.0.0.1:{}", common::free_port());
    let port = health.rsplit(':').next().expect("a port");
    let controller = tether_testkit::peer("mirror-controller").expect("scripts/peers built it");
    let manager = format!(
        "{{exec: {{command: [{}, --fleet, --home-kubeconfig, {}, \"--health-probe-bind-address={health}\"], \
         followsRemotesFile: true, gracePeriod: 900ms, \
         readiness: {{httpGet: {{port: {port}, path: /readyz}}}}}}}}",
        controller.display(),
        home.display(),
    );
    replica_with(id, leases, remotes, false, Some(&manager))
}

/// Waits until every remote is watched by its owner in `owners` alone (the
/// owner's controller engaged it, and no other's holds it).
async fn watched_by_owners(owners: &BTreeMap<String, String>, remotes: &[Remote]) -> Duration {
    let started = Instant::now();
    common::until(
        "each remote watched by its owner alone",
        DEADLINE,
        async || {
            remotes
                .iter()
                .all(|r| {
                    let by = r.server.open_watches_by();
                    by.len() == 1 && by.contains_key(&owners[&r.name])
                })
                .then(|| started.elapsed())
        },
    )
    .await
}

/// Processes a replica's exec manager started, and restarted because one
/// did not let a remote go in time.
async fn starts(replica: &Replica) -> (f64, f64) {
    let tether = &replica.tether;
    (
        tether
            .metric("tether_manager_process_starts_total")
            .await
            .unwrap_or_default(),
        tether
            .metric("tether_manager_process_restarts_total{reason=\"remote_not_released\"}")
            .await
            .unwrap_or_default(),
    )
}

/// The exec manager with a controller that follows its file: a replica's
/// join and another's loss move remotes between the controllers one by
/// one, with no controller restarted and no cycle ended, and the witness
/// never sees a remote watched by two replicas' controllers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_that_follow_their_file_hand_remotes_over_without_a_restart() {
    let home = common::real_plane(RealOptions::default().name("home")).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let home_kubeconfig = dir.path().join("home.kubeconfig");
    home.kubeconfig()
        .write(&home_kubeconfig)
        .expect("kubeconfig");
    let remotes = Arc::new(remotes().await);
    let watches = Watches::start(&remotes);
    let a = follower("tether-a", &home, &remotes, &home_kubeconfig);
    let b = follower("tether-b", &home, &remotes, &home_kubeconfig);
    let (owners, _) = until_settled(&[&a, &b], &remotes).await;
    let took = watched_by_owners(&owners, &remotes).await;
    eprintln!(
        "two followers: every remote watched by its owner's controller {took:?} after the shares settled"
    );
    let running = [cycles(&a).await, cycles(&b).await];
    assert_eq!([starts(&a).await, starts(&b).await], [(1.0, 0.0); 2]);

    // A replica joins: the others' controllers let its remotes go, and
    // tether gives them up only once each said so.
    let mut c = follower("tether-c", &home, &remotes, &home_kubeconfig);
    let joined_at = Instant::now();
    let (joined, _) = until_settled(&[&a, &b, &c], &remotes).await;
    watched_by_owners(&joined, &remotes).await;
    let moved = moved_between(&owners, &joined);
    eprintln!(
        "a member joined: {} remotes moved, each watched by its new owner's controller {:?} after the join",
        moved.len(),
        joined_at.elapsed()
    );
    assert!(!moved.is_empty(), "nothing moved to the new member");
    ran_on(
        [&a, &b],
        &running,
        "removed",
        "giving remotes up to a new member",
    )
    .await;
    assert_eq!(
        [starts(&a).await, starts(&b).await],
        [(1.0, 0.0); 2],
        "a controller was restarted for a share that moved"
    );

    // A replica is lost: its remotes come back to the others' controllers.
    c.tether.signal("KILL");
    let _ = c.tether.wait().await;
    let (after, _) = until_settled(&[&a, &b], &remotes).await;
    watched_by_owners(&after, &remotes).await;
    ran_on(
        [&a, &b],
        &running,
        "added",
        "taking a lost member's remotes",
    )
    .await;
    assert_eq!([starts(&a).await, starts(&b).await], [(1.0, 0.0); 2]);
    watches.none_twice().await;
}
