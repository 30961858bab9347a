//! A release of three replicas changed under way (`helm upgrade`, `helm
//! rollback`), looked at from every side while it changes:
//! - the remotes' own audit logs, the witness: which pod had a watch open
//!   on each remote, and when. Two pods with watches open on one remote at
//!   one instant are two managers;
//! - the home cluster, every [`EVERY`]: the pods, the Lease's holder and
//!   the budget's status, in one `kubectl get`;
//! - each pod's `/readyz`, read from inside the node at the same look:
//!   which pod says its manager is up.

// Real processes: the sampler runs on the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use tether_testkit::{ControlPlane, Node, Watch, overlapping};

use super::{Kube, Pod};

/// How often the sampler looks.
const EVERY: Duration = Duration::from_millis(250);

/// tether's admin port in the pod.
const ADMIN: u16 = 9090;

/// The release's size, and the fewest Ready pods its budget allows
/// (`maxUnavailable: 1`).
const REPLICAS: usize = 3;
pub(crate) const BUDGET_FLOOR: usize = REPLICAS - 1;

/// One look at the release.
#[derive(Debug, Clone)]
struct Look {
    at: Instant,
    /// The Lease's `holderIdentity`; "" when it has none.
    holder: String,
    pods: Vec<Seen>,
    /// The budget's `currentHealthy` and `desiredHealthy`, once it has a
    /// status.
    budget: Option<(i64, i64)>,
    /// Pods whose `/readyz` said `[+]manager up`, and still did when read
    /// again after another pod said so too: two managers, as they claim.
    both_up: Vec<String>,
}

/// One pod at a look.
#[derive(Debug, Clone)]
struct Seen {
    pod: Pod,
    /// Its `/readyz` says `[+]manager up` (leading, the caches synced; or
    /// draining with its manager not yet stopped).
    manager_up: bool,
}

/// What the release must come to: every pod on `image`, and the leader's
/// watches on each remote exactly `watched` (the config's resources).
pub(crate) struct Settled<'a> {
    pub(crate) image: &'a str,
    pub(crate) watched: &'a [&'a str],
}

/// A release named for its namespace, and the remotes it watches.
pub(crate) struct Release<'a> {
    pub(crate) kube: &'a Kube,
    pub(crate) node: &'a Node,
    pub(crate) name: &'a str,
    pub(crate) remotes: [&'a ControlPlane; 2],
    /// When the release was installed: the witness reads every watch
    /// since.
    pub(crate) since: Timestamp,
}

/// What one change measured.
#[derive(Debug)]
pub(crate) struct Measured {
    /// From the change's start until the release settled.
    pub(crate) took: Duration,
    pub(crate) looks: usize,
    /// The pods that ran the manager, in turn.
    pub(crate) leaders: Vec<String>,
    /// Each time no pod said its manager was up: from the last look at
    /// one to the first look at the next.
    pub(crate) gaps: Vec<Duration>,
    /// The longest the Lease named no holder, look to look.
    pub(crate) holderless: Duration,
    /// The fewest Ready pods not being deleted at one look.
    pub(crate) fewest_ready: usize,
    /// Watches on each remote in the witness, and from how many pods.
    pub(crate) watches: Vec<(usize, usize)>,
}

impl Release<'_> {
    /// Runs `change` while looking every [`EVERY`], then looks on until
    /// the release has `settled` (at most `within` after `change`
    /// returned). Asserts, at every look, what must always hold:
    /// - the Lease, when held, names a pod of the release;
    /// - no two pods say their manager is up;
    /// - at least [`BUDGET_FLOOR`] pods are Ready and not being deleted,
    ///   and the budget's status has `currentHealthy >= desiredHealthy`;
    ///
    /// and over the whole release's life, on each remote's audit log, that
    /// no two pods had watches open at once.
    pub(crate) fn change(
        &self,
        what: &str,
        change: impl FnOnce(),
        settled: &Settled<'_>,
        within: Duration,
    ) -> Measured {
        let begun = Instant::now();
        let stop = AtomicBool::new(false);
        let looks = Mutex::new(Vec::<Look>::new());
        std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(look) = self.look() {
                        looks.lock().expect("not poisoned").push(look);
                    }
                    std::thread::sleep(EVERY);
                }
            });
            change();
            let changed = Instant::now();
            loop {
                let last = looks.lock().expect("not poisoned").last().cloned();
                if last
                    .as_ref()
                    .is_some_and(|look| self.is_settled(look, settled))
                {
                    break;
                }
                assert!(
                    changed.elapsed() < within,
                    "{what}: the release did not settle within {within:?} of the change: {last:#?}\nthe watches open: {:#?}\n{}",
                    self.remotes.map(|r| (r.name(), open(r))),
                    self.kube
                        .try_run("kubectl", &["-n", self.name, "describe", "pods"])
                        .unwrap_or_else(|e| e)
                );
                std::thread::sleep(EVERY);
            }
            stop.store(true, Ordering::SeqCst);
            sampler.join().expect("the sampler");
        });
        let looks = looks.into_inner().expect("not poisoned");
        let took = begun.elapsed();
        always(what, &looks);
        let watches = self.witness(what, &looks);
        Measured {
            took,
            looks: looks.len(),
            leaders: leaders(&looks),
            gaps: gaps(&looks),
            holderless: holderless(&looks),
            fewest_ready: looks.iter().map(ready).min().unwrap_or_default(),
            watches,
        }
    }

    /// One look: the pods, the Lease and the budget in one `kubectl get`,
    /// then each pod's `/readyz`. `None` if kubectl failed.
    fn look(&self) -> Option<Look> {
        let at = Instant::now();
        let text = self
            .kube
            .try_run(
                "kubectl",
                &["-n", self.name, "get", "pods,pdb,lease", "-o", "json"],
            )
            .ok()?;
        let list: serde_json::Value = serde_json::from_str(&text).ok()?;
        let (mut pods, mut holder, mut budget) = (Vec::new(), String::new(), None);
        for item in list["items"].as_array()? {
            match item["kind"].as_str() {
                Some("Pod") => pods.push(Pod::from(item)),
                Some("Lease") => {
                    item["spec"]["holderIdentity"]
                        .as_str()
                        .unwrap_or_default()
                        .clone_into(&mut holder);
                }
                Some("PodDisruptionBudget") => {
                    let status = &item["status"];
                    budget = status["currentHealthy"]
                        .as_i64()
                        .zip(status["desiredHealthy"].as_i64());
                }
                _ => {}
            }
        }
        let mut pods: Vec<Seen> = pods
            .into_iter()
            .map(|pod| {
                let manager_up = self.manager_up(&pod);
                Seen { pod, manager_up }
            })
            .collect();
        // Two pods read as up may be one stopping and the next starting
        // between the two reads: read each again. Still up after another
        // was seen up is two at once.
        let mut both_up = Vec::new();
        if pods.iter().filter(|s| s.manager_up).count() > 1 {
            for seen in &mut pods {
                seen.manager_up = seen.manager_up && self.manager_up(&seen.pod);
            }
            if pods.iter().filter(|s| s.manager_up).count() > 1 {
                both_up = pods
                    .iter()
                    .filter(|s| s.manager_up)
                    .map(|s| s.pod.name.clone())
                    .collect();
            }
        }
        Some(Look {
            at,
            holder,
            pods,
            budget,
            both_up,
        })
    }

    /// Whether `pod`'s `/readyz`, read from inside the node, says its
    /// manager is up.
    fn manager_up(&self, pod: &Pod) -> bool {
        let Ok(ip) = pod.ip.parse::<std::net::IpAddr>() else {
            return false;
        };
        let within = Duration::from_secs(1);
        let Ok(mut stream) = self.node.connect((ip, ADMIN).into(), within) else {
            return false;
        };
        let mut answer = String::new();
        stream.set_read_timeout(Some(within)).is_ok()
            && stream.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").is_ok()
            && stream.take(64 << 10).read_to_string(&mut answer).is_ok()
            && answer.contains("[+]manager up")
    }

    /// Whether the release has come to `settled` at `look`: its pods all
    /// on the image, Ready and none leaving, one leading and holding the
    /// Lease, and its watches alone open on each remote, on exactly the
    /// config's resources.
    fn is_settled(&self, look: &Look, settled: &Settled<'_>) -> bool {
        let pods = &look.pods;
        let leaders: Vec<&Seen> = pods.iter().filter(|s| s.manager_up).collect();
        let [leader] = leaders[..] else {
            return false;
        };
        if pods.len() != REPLICAS
            || !pods
                .iter()
                .all(|s| s.pod.ready && !s.pod.deleting && s.pod.image == settled.image)
            || !holds(&look.holder, &leader.pod.name)
        {
            return false;
        }
        let expected: BTreeSet<&str> = settled.watched.iter().copied().collect();
        self.remotes.iter().all(|remote| {
            let open = open(remote);
            open.iter().all(|w| w.source == leader.pod.ip)
                && open
                    .iter()
                    .map(|w| w.resource.as_str())
                    .collect::<BTreeSet<_>>()
                    == expected
        })
    }

    /// The witness: on each remote, every watch since the release was
    /// installed; no two pods' open at one instant. The watches, and from
    /// how many pods, per remote.
    fn witness(&self, what: &str, looks: &[Look]) -> Vec<(usize, usize)> {
        let pods: Vec<(String, String)> = looks
            .iter()
            .flat_map(|l| &l.pods)
            .map(|s| (s.pod.ip.clone(), s.pod.name.clone()))
            .collect();
        let name = |ip: &str| {
            pods.iter()
                .find(|(i, _)| i == ip)
                .map_or_else(|| format!("{ip} (no pod seen)"), |(_, n)| n.clone())
        };
        self.remotes
            .iter()
            .map(|remote| {
                let watches: Vec<Watch> = remote
                    .watches()
                    .expect("the remotes audit their watches")
                    .into_iter()
                    .filter(|w| w.ended.is_none_or(|end| end > self.since))
                    .collect();
                let twice = overlapping(&watches);
                assert!(
                    twice.is_empty(),
                    "{what}: {} watched by two pods at once, {} times; the first: {} {:?} and {} {:?}",
                    remote.name(),
                    twice.len(),
                    name(&twice[0].0.source),
                    twice[0].0,
                    name(&twice[0].1.source),
                    twice[0].1,
                );
                let sources: BTreeSet<&str> = watches.iter().map(|w| w.source.as_str()).collect();
                (watches.len(), sources.len())
            })
            .collect()
    }
}

/// What must hold at every look.
fn always(what: &str, looks: &[Look]) {
    for look in looks {
        let names: Vec<&str> = look.pods.iter().map(|s| s.pod.name.as_str()).collect();
        assert!(
            look.holder.is_empty() || names.iter().any(|name| holds(&look.holder, name)),
            "{what}: the Lease names {}, no pod of {:?}",
            look.holder,
            names
        );
        assert!(
            look.both_up.is_empty(),
            "{what}: two pods say their manager is up: {:?}",
            look.both_up
        );
        assert!(
            ready(look) >= BUDGET_FLOOR,
            "{what}: {} Ready pods, under the budget's {BUDGET_FLOOR}: {:#?}",
            ready(look),
            look.pods
        );
        if let Some((current, desired)) = look.budget {
            assert!(
                current >= desired,
                "{what}: the budget is broken: {current} healthy, {desired} needed"
            );
        }
    }
    assert!(
        looks.len() > 20,
        "{what}: too few looks to say anything: {}",
        looks.len()
    );
}

/// The watches open on `remote` now.
fn open(remote: &ControlPlane) -> Vec<Watch> {
    remote
        .watches()
        .expect("the remotes audit their watches")
        .into_iter()
        .filter(|w| w.ended.is_none())
        .collect()
}

/// Whether the Lease's `holder` is `pod`'s: its name and a suffix.
fn holds(holder: &str, pod: &str) -> bool {
    holder
        .strip_prefix(pod)
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The pods Ready and not being deleted at `look`.
fn ready(look: &Look) -> usize {
    look.pods
        .iter()
        .filter(|s| s.pod.ready && !s.pod.deleting)
        .count()
}

/// The pods whose manager was up, in turn.
fn leaders(looks: &[Look]) -> Vec<String> {
    let mut leaders: Vec<String> = Vec::new();
    for seen in looks.iter().flat_map(|l| &l.pods).filter(|s| s.manager_up) {
        if leaders.last() != Some(&seen.pod.name) {
            leaders.push(seen.pod.name.clone());
        }
    }
    leaders
}

/// Each time no pod's manager was up, after one had been: from the last
/// look with one up to the first look with one up again.
fn gaps(looks: &[Look]) -> Vec<Duration> {
    spans(looks, |look| look.pods.iter().any(|s| s.manager_up))
}

/// The longest the Lease had no holder, after it had had one.
fn holderless(looks: &[Look]) -> Duration {
    spans(looks, |look| !look.holder.is_empty())
        .into_iter()
        .max()
        .unwrap_or_default()
}

/// Each run of looks where `holds` failed after it had held: from the
/// last look it held to the next look it held.
fn spans(looks: &[Look], holds: impl Fn(&Look) -> bool) -> Vec<Duration> {
    let (mut spans, mut last, mut missed) = (Vec::new(), None::<Instant>, false);
    for look in looks {
        if holds(look) {
            if let Some(last) = last.filter(|_| missed) {
                spans.push(look.at - last);
            }
            (last, missed) = (Some(look.at), false);
        } else {
            missed = last.is_some();
        }
    }
    spans
}
