//! Which replica owns which remote: rendezvous hashing over the live
//! members, and the rule that fences a move.
//!
//! Invariants:
//! - **Ownership.** A remote belongs to the live member of highest weight,
//!   the weight being the first 8 bytes of SHA-256 of the member's identity
//!   and the remote's key (its normalized URL). Every replica computes the
//!   same owner from the same members, with no coordination.
//! - **Little movement.** A member joining takes only the remotes it now
//!   wins, about 1/N; a member leaving gives up only its own; no remote
//!   moves between two members that stay.
//! - **No two holders.** Each member publishes, in its Lease, the members
//!   its current holdings were computed from (its *view*), and publishes a
//!   new view only after it has stopped the remotes the new view takes from
//!   it. A member takes a remote only when no other live member still owns
//!   it under that member's own published view. Two live members that see
//!   each other can never both own a remote (for rendezvous hashing, the
//!   owner among any set containing both is the same one of the two), so a
//!   remote is held twice only if a member counts a live one as dead; that
//!   is what the Lease's expiry, measured on the reader's own clock, and the
//!   holder's fence (it stops before its Lease can expire for others)
//!   rule out, as in leader election.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Error, jittered, micro_now};
use crate::config::{LeaderElectionSpec, ShardingSpec};
use crate::lock;

/// A member's weight for a remote: stable across processes, versions and
/// machines, so every replica agrees.
fn weight(member: &str, remote: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(member.as_bytes());
    ctx.update(&[0]);
    ctx.update(remote.as_bytes());
    let digest = ctx.finish();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    u64::from_be_bytes(first)
}

/// The member of `members` that owns the remote keyed `remote`: the one of
/// highest weight (ties, which SHA-256 makes vanishingly rare, go to the
/// lower identity). `None` with no members.
#[must_use]
pub fn owner<'m>(remote: &str, members: impl IntoIterator<Item = &'m str>) -> Option<&'m str> {
    members
        .into_iter()
        .map(|m| (weight(m, remote), std::cmp::Reverse(m), m))
        .max()
        .map(|(_, _, m)| m)
}

/// A live member, as its Lease shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its identity: the Lease's holder.
    pub identity: String,
    /// The members its holdings were computed from; empty before its first.
    pub view: BTreeSet<String>,
}

/// What this replica should do with its remotes now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The keys it owns under the live members, and may hold now.
    pub hold: BTreeSet<String>,
    /// The keys it owns, but another live member still owns under its
    /// published view: taken once that member publishes a newer view, or
    /// its Lease expires.
    pub waiting: BTreeSet<String>,
}

/// The plan of `me` for the remotes keyed `keys`, given the `live` members
/// (`me` among them, with its view as it will publish it).
#[must_use]
pub fn plan<'k>(me: &str, keys: impl IntoIterator<Item = &'k str>, live: &[Member]) -> Plan {
    let members: Vec<&str> = live.iter().map(|m| m.identity.as_str()).collect();
    let others: Vec<&Member> = live.iter().filter(|m| m.identity != me).collect();
    let mut plan = Plan::default();
    for key in keys {
        if owner(key, members.iter().copied()) != Some(me) {
            continue;
        }
        let claimed = others
            .iter()
            .any(|m| owner(key, m.view.iter().map(String::as_str)) == Some(m.identity.as_str()));
        if claimed {
            plan.waiting.insert(key.to_owned());
        } else {
            plan.hold.insert(key.to_owned());
        }
    }
    plan
}

/// The label that marks a shard Lease, its value the prefix: the members
/// are the Leases that carry it.
pub const GROUP_LABEL: &str = "tether.dev/shard-group";

/// The annotation in which a member publishes its view: the identities its
/// holdings were computed from, comma-separated.
pub const VIEW_ANNOTATION: &str = "tether.dev/view";

/// Where this replica stands among the shards, for `/status` and `check`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardState {
    /// This replica's identity.
    pub identity: String,
    /// `namespace/prefix`.
    pub group: String,
    /// The live members, by identity, as this replica sees them.
    pub members: Vec<String>,
    /// The remotes (by name) this replica holds.
    pub owned: BTreeSet<String>,
    /// The remotes it owns, but waits for another member to give up.
    pub waiting: BTreeSet<String>,
    /// Why the last round failed, if it did.
    pub last_error: Option<String>,
    /// The remotes with a `tether_remote_owned` series.
    exported: BTreeSet<String>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<ShardState>,
    members: IntGauge,
    owned: IntGauge,
    /// 1 for each configured remote this replica holds, 0 for the others:
    /// a remote at 0 on every replica is held by none.
    remote_owned: IntGaugeVec,
}

/// A view of the sharding, for the admin server and the daemon.
#[derive(Debug, Clone)]
pub struct ShardHandle {
    shared: Arc<Shared>,
    holding: watch::Receiver<BTreeSet<String>>,
    keys: watch::Sender<BTreeMap<String, String>>,
    applied: watch::Sender<BTreeSet<String>>,
}

impl ShardHandle {
    /// Where this replica stands.
    #[must_use]
    pub fn state(&self) -> ShardState {
        lock(&self.shared.state).clone()
    }

    /// The remotes (by name) this replica should run, as they change.
    #[must_use]
    pub fn holding(&self) -> watch::Receiver<BTreeSet<String>> {
        self.holding.clone()
    }

    /// How many remotes are configured, this replica's or not.
    #[must_use]
    pub fn configured(&self) -> usize {
        self.keys.borrow().len()
    }

    /// The configured remotes, by name, with their keys (normalized URLs),
    /// at start and after each reload.
    pub fn set_remotes(&self, keys: BTreeMap<String, String>) {
        self.keys.send_replace(keys);
    }

    /// Tells the sharding that nothing runs the remotes outside `names`
    /// any more: their probes stopped, and the cycle that used them ended.
    /// Only then does it let other members take them.
    pub fn applied(&self, names: BTreeSet<String>) {
        self.applied.send_replace(names);
    }
}

/// The sharding of remotes among replicas: this replica's Lease, renewed
/// as in leader election, and its share, computed each round.
pub struct Sharding {
    spec: LeaderElectionSpec,
    prefix: String,
    leases: Api<Lease>,
    identity: String,
    shared: Arc<Shared>,
    holding: watch::Sender<BTreeSet<String>>,
    keys: watch::Receiver<BTreeMap<String, String>>,
    applied: watch::Receiver<BTreeSet<String>>,
    handle: ShardHandle,
}

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharding")
            .field("identity", &self.identity)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The Lease of each member as last seen, and when this replica saw it
/// change: liveness is measured on this replica's clock, never by comparing
/// clocks.
type Seen = BTreeMap<String, (LeaseSpec, BTreeSet<String>, Instant)>;

impl Sharding {
    /// The sharding `sharding` asks for, on the cluster and with the
    /// timings of `election`, its metrics in `registry`.
    ///
    /// # Errors
    ///
    /// [`Error`] if the Leases' cluster or namespace cannot be found.
    pub async fn new(
        election: LeaderElectionSpec,
        sharding: &ShardingSpec,
        registry: &Registry,
    ) -> Result<Self, Error> {
        let super::Leases {
            api,
            namespace,
            identity,
        } = super::Leases::new(&election).await?;
        let members = IntGauge::new(
            "tether_shard_members",
            "Live members of this replica's shard group, as it sees them.",
        )
        .map_err(Error::Metrics)?;
        let owned = IntGauge::new(
            "tether_owned_remotes",
            "Remotes this replica holds: probes, and runs the manager for.",
        )
        .map_err(Error::Metrics)?;
        for gauge in [&members, &owned] {
            registry
                .register(Box::new(gauge.clone()))
                .map_err(Error::Metrics)?;
        }
        let remote_owned = IntGaugeVec::new(
            Opts::new(
                "tether_remote_owned",
                "1 while this replica holds the remote, 0 while another member does or none; every configured remote.",
            ),
            &["remote"],
        )
        .map_err(Error::Metrics)?;
        registry
            .register(Box::new(remote_owned.clone()))
            .map_err(Error::Metrics)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(ShardState {
                identity: identity.clone(),
                group: format!("{namespace}/{}", sharding.lease_prefix),
                ..ShardState::default()
            }),
            members,
            owned,
            remote_owned,
        });
        let (holding, holding_rx) = watch::channel(BTreeSet::new());
        let (keys_tx, keys) = watch::channel(BTreeMap::new());
        let (applied_tx, applied) = watch::channel(BTreeSet::new());
        Ok(Self {
            spec: election,
            prefix: sharding.lease_prefix.clone(),
            leases: api,
            identity,
            handle: ShardHandle {
                shared: Arc::clone(&shared),
                holding: holding_rx,
                keys: keys_tx,
                applied: applied_tx,
            },
            shared,
            holding,
            keys,
            applied,
        })
    }

    /// A view for the admin server and the daemon.
    #[must_use]
    pub fn handle(&self) -> ShardHandle {
        self.handle.clone()
    }

    /// This replica's Lease: `<prefix>-<identity>`.
    fn lease_name(&self) -> String {
        format!("{}-{}", self.prefix, self.identity)
    }

    /// Holds `names` from now on, and says so.
    fn hold(&self, names: BTreeSet<String>, waiting: BTreeSet<String>, members: Vec<String>) {
        self.shared
            .owned
            .set(i64::try_from(names.len()).unwrap_or(i64::MAX));
        let configured: BTreeSet<String> = self.keys.borrow().keys().cloned().collect();
        let exported: BTreeSet<String> = lock(&self.shared.state).exported.clone();
        for gone in exported.difference(&configured) {
            let _ = self.shared.remote_owned.remove_label_values(&[gone]);
        }
        for name in &configured {
            self.shared
                .remote_owned
                .with_label_values(&[name])
                .set(i64::from(names.contains(name)));
        }
        self.shared
            .members
            .set(i64::try_from(members.len()).unwrap_or(i64::MAX));
        {
            let mut state = lock(&self.shared.state);
            state.owned.clone_from(&names);
            state.waiting = waiting;
            state.members = members;
            state.exported = configured;
        }
        self.holding.send_if_modified(|held| {
            if *held == names {
                return false;
            }
            *held = names;
            true
        });
    }

    /// Waits, at most until `deadline`, until the daemon has stopped every
    /// remote outside `names`. Returns whether it did.
    async fn until_applied(&mut self, names: &BTreeSet<String>, deadline: Instant) -> bool {
        let applied = self.applied.wait_for(|applied| applied.is_subset(names));
        matches!(tokio::time::timeout_at(deadline, applied).await, Ok(Ok(_)))
    }

    /// Runs until `stop`: each round (every `retryPeriod`, jittered) renews
    /// this replica's Lease with its view, reads the members', and holds its
    /// share. Past `renewDeadline` without a renewal it holds nothing (its
    /// fence), before its Lease can expire for the others. At the end it
    /// holds nothing, and deletes its Lease once the daemon has let go, so
    /// the others take its remotes at once.
    ///
    /// # Cancellation safety
    ///
    /// Cancel `stop` instead of dropping it.
    pub async fn run(mut self, stop: CancellationToken) {
        let spec = self.spec.clone();
        let mut seen: Seen = BTreeMap::new();
        let mut view: BTreeSet<String> = BTreeSet::new();
        let mut renewed: Option<Instant> = None;
        let mut next = Instant::now();
        loop {
            let fence = renewed.map(|at| at + spec.renew_deadline);
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(next) => {}
                () = sleep_until(fence.unwrap_or(next)), if fence.is_some_and(|f| f < next) => {
                    warn!(identity = %self.identity, "no renewal of this replica's shard Lease within renewDeadline: giving up every remote");
                    renewed = None;
                    view.clear();
                    self.hold(BTreeSet::new(), BTreeSet::new(), Vec::new());
                    continue;
                }
            }
            next = Instant::now() + jittered(spec.retry_period);
            let round = timeout(spec.retry_period, self.round(&mut seen, &mut view, renewed));
            match round.await {
                Ok(Ok(at)) => {
                    renewed = Some(at);
                    lock(&self.shared.state).last_error = None;
                }
                Ok(Err(err)) => {
                    lock(&self.shared.state).last_error = Some(err);
                }
                Err(_) => {
                    lock(&self.shared.state).last_error =
                        Some("the Leases' apiserver did not answer in time".to_owned());
                }
            }
        }
        self.hold(BTreeSet::new(), BTreeSet::new(), Vec::new());
        let deadline = Instant::now() + spec.renew_deadline;
        if self.until_applied(&BTreeSet::new(), deadline).await {
            let gone = timeout(
                spec.retry_period,
                self.leases
                    .delete(&self.lease_name(), &DeleteParams::default()),
            )
            .await;
            if matches!(gone, Ok(Ok(_))) {
                info!(identity = %self.identity, "shard Lease deleted: the other replicas take its remotes now");
            }
        }
    }

    /// One round: the members' Leases read, what this replica gives up let
    /// go of, its Lease renewed with its new view, and what it may take
    /// taken. Returns when the renewal was sent.
    async fn round(
        &mut self,
        seen: &mut Seen,
        view: &mut BTreeSet<String>,
        renewed: Option<Instant>,
    ) -> Result<Instant, String> {
        let err = |e: kube::Error| tether_supervisor::error_chain(&e);
        let selector = format!("{GROUP_LABEL}={}", self.prefix);
        let list = self
            .leases
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(err)?;
        let now = Instant::now();
        let mut present = BTreeSet::new();
        for lease in list.items {
            let spec = lease.spec.clone().unwrap_or_default();
            let Some(holder) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
                continue;
            };
            let published: BTreeSet<String> = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(VIEW_ANNOTATION))
                .map(|v| {
                    v.split(',')
                        .filter(|m| !m.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            present.insert(holder.clone());
            match seen.get_mut(&holder) {
                Some((old, old_view, at)) if *old == spec => *old_view = published,
                _ => {
                    seen.insert(holder, (spec, published, now));
                }
            }
        }
        seen.retain(|holder, _| present.contains(holder));
        let duration = |s: &LeaseSpec| {
            Duration::from_secs(u64::try_from(s.lease_duration_seconds.unwrap_or(0)).unwrap_or(0))
        };
        // Live: another member whose record changed within its duration by
        // this clock; this replica, while its own renewals hold.
        let renewing = renewed.is_none_or(|at| at + self.spec.renew_deadline > now);
        let mut live: Vec<Member> = seen
            .iter()
            .filter(|(holder, (spec, _, at))| {
                *holder != &self.identity && *at + duration(spec) > now
            })
            .map(|(holder, (_, view, _))| Member {
                identity: holder.clone(),
                view: view.clone(),
            })
            .collect();
        let mut members: BTreeSet<String> = live.iter().map(|m| m.identity.clone()).collect();
        if renewing {
            members.insert(self.identity.clone());
        }
        live.push(Member {
            identity: self.identity.clone(),
            view: members.clone(),
        });
        let keys = self.keys.borrow().clone();
        let by_key = |names: &BTreeSet<String>| -> BTreeSet<String> {
            keys.iter()
                .filter(|(_, key)| names.contains(*key))
                .map(|(name, _)| name.clone())
                .collect()
        };
        // Give up first: what the new members take from this replica stops
        // now, and the view that lets them take it is published only once
        // the daemon says nothing runs it any more (the manager may take
        // its grace period to return). Meanwhile the old view is renewed,
        // and nothing is taken.
        let held = self.holding.borrow().clone();
        let mine: BTreeSet<String> = keys
            .iter()
            .filter(|(_, key)| {
                owner(key, members.iter().map(String::as_str)) == Some(self.identity.as_str())
            })
            .map(|(name, _)| name.clone())
            .collect();
        let kept: BTreeSet<String> = held.intersection(&mine).cloned().collect();
        let member_list: Vec<String> = members.iter().cloned().collect();
        if kept != held {
            let waiting = lock(&self.shared.state).waiting.clone();
            self.hold(kept.clone(), waiting, member_list.clone());
        }
        let released = self.applied.borrow().is_subset(&kept);
        let publish = if released { &members } else { &*view };
        let sent = self.renew(publish).await.map_err(err)?;
        if !released {
            return Ok(sent);
        }
        view.clone_from(&members);
        let key_list: BTreeSet<&str> = keys.values().map(String::as_str).collect();
        let plan = plan(&self.identity, key_list.iter().copied(), &live);
        let mut taking = by_key(&plan.hold);
        taking.extend(kept);
        self.hold(taking, by_key(&plan.waiting), member_list);
        Ok(sent)
    }

    /// Creates or renews this replica's Lease, publishing `view`. Returns
    /// when the write was sent.
    async fn renew(&self, view: &BTreeSet<String>) -> Result<Instant, kube::Error> {
        let name = self.lease_name();
        let now = micro_now();
        let sent = Instant::now();
        let duration = i32::try_from(self.spec.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let view = view.iter().cloned().collect::<Vec<_>>().join(",");
        let metadata = |old: ObjectMeta| ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(GROUP_LABEL.to_owned(), self.prefix.clone())].into()),
            annotations: Some([(VIEW_ANNOTATION.to_owned(), view.clone())].into()),
            ..old
        };
        match self.leases.get_opt(&name).await? {
            None => {
                let lease = Lease {
                    metadata: metadata(ObjectMeta::default()),
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(duration),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        ..LeaseSpec::default()
                    }),
                };
                self.leases.create(&PostParams::default(), &lease).await?;
            }
            Some(lease) => {
                let old = lease.spec.unwrap_or_default();
                let lease = Lease {
                    metadata: metadata(lease.metadata),
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(duration),
                        renew_time: Some(now),
                        ..old
                    }),
                };
                self.leases
                    .replace(&name, &PostParams::default(), &lease)
                    .await?;
            }
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("https://10.0.{}.{}:6443", i / 250, i % 250))
            .collect()
    }

    fn owners(keys: &[String], members: &[&str]) -> Vec<String> {
        keys.iter()
            .map(|k| {
                owner(k, members.iter().copied())
                    .expect("members")
                    .to_owned()
            })
            .collect()
    }

    fn member(identity: &str, view: &[&str]) -> Member {
        Member {
            identity: identity.to_owned(),
            view: view.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn the_weight_is_stable_across_builds() {
        // Pinned: a change here would move every remote at an upgrade.
        assert_eq!(
            weight("tether-0", "https://10.0.0.1:6443"),
            weight("tether-0", "https://10.0.0.1:6443")
        );
        assert_ne!(weight("tether-0", "a"), weight("tether-1", "a"));
        assert_eq!(
            weight("a", "b"),
            u64::from_be_bytes([0x59, 0xb2, 0x71, 0xae, 0x1b, 0xbc, 0xb1, 0xd3])
        );
    }

    #[test]
    fn three_members_share_the_remotes_about_evenly() {
        let keys = keys(3000);
        let owners = owners(&keys, &["tether-0", "tether-1", "tether-2"]);
        for m in ["tether-0", "tether-1", "tether-2"] {
            let n = owners.iter().filter(|o| *o == m).count();
            assert!((850..=1150).contains(&n), "{m} owns {n} of 3000");
        }
    }

    #[test]
    fn a_join_moves_about_a_third_only_to_the_new_member() {
        let keys = keys(3000);
        let before = owners(&keys, &["a", "b"]);
        let after = owners(&keys, &["a", "b", "c"]);
        let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).collect();
        assert!(
            moved.iter().all(|(_, a)| *a == "c"),
            "a remote moved between a and b"
        );
        assert!(
            (850..=1150).contains(&moved.len()),
            "{} of 3000 moved",
            moved.len()
        );
    }

    #[test]
    fn a_leave_moves_only_the_leavers_remotes() {
        let keys = keys(3000);
        let before = owners(&keys, &["a", "b", "c"]);
        let after = owners(&keys, &["a", "c"]);
        for (b, a) in before.iter().zip(&after) {
            if b != "b" {
                assert_eq!(b, a, "a remote of a member that stayed moved");
            }
        }
    }

    #[test]
    fn a_joiner_waits_for_the_members_that_have_not_seen_it() {
        let keys = keys(300);
        let all = ["a", "b", "c"];
        // c has joined; a and b still act on {a, b}.
        let live = [
            member("a", &["a", "b"]),
            member("b", &["a", "b"]),
            member("c", &all),
        ];
        let c = plan("c", keys.iter().map(String::as_str), &live);
        assert!(
            c.hold.is_empty(),
            "c took remotes the others still hold: {:?}",
            c.hold
        );
        assert!(!c.waiting.is_empty());
        // Once a and b have given them up (their views include c), c takes
        // every one.
        let live = [member("a", &all), member("b", &all), member("c", &all)];
        let c2 = plan("c", keys.iter().map(String::as_str), &live);
        assert_eq!(c2.hold, c.waiting);
        assert!(c2.waiting.is_empty());
    }

    #[test]
    fn the_remotes_of_a_member_gone_are_taken_at_once() {
        let keys = keys(300);
        // b's Lease expired: it is not live, whatever view it published.
        // a and c had seen each other, so nothing else holds them back.
        let live = [member("a", &["a", "b", "c"]), member("c", &["a", "b", "c"])];
        let a = plan("a", keys.iter().map(String::as_str), &live);
        let c = plan("c", keys.iter().map(String::as_str), &live);
        assert!(a.waiting.is_empty() && c.waiting.is_empty());
        assert_eq!(a.hold.len() + c.hold.len(), keys.len());
    }

    proptest! {
        /// Members act one at a time, in any order, each on the members it
        /// believes live: itself and every member still holding a remote
        /// (a holder's Lease has not expired: it renews, or fences itself
        /// first), plus any others. Acting, a member gives up what the new
        /// members take from it, publishes them as its view, and takes what
        /// the plan lets it. No remote is ever held twice.
        #[test]
        fn no_remote_is_ever_held_twice(
            steps in proptest::collection::vec((0usize..4, proptest::collection::btree_set(0usize..4, 0..4)), 1..40),
        ) {
            let name = |i: usize| format!("m{i}");
            let keys = keys(60);
            let mut views: Vec<BTreeSet<String>> = vec![BTreeSet::new(); 4];
            let mut held: Vec<BTreeSet<String>> = vec![BTreeSet::new(); 4];
            for (me, believed) in steps {
                let live: BTreeSet<usize> = believed
                    .into_iter()
                    .chain([me])
                    .chain((0..4).filter(|&i| !held[i].is_empty()))
                    .collect();
                let members: BTreeSet<String> = live.iter().map(|&i| name(i)).collect();
                held[me].retain(|k| owner(k, members.iter().map(String::as_str)) == Some(name(me).as_str()));
                views[me] = members;
                let seen: Vec<Member> = live
                    .iter()
                    .map(|&i| Member { identity: name(i), view: views[i].clone() })
                    .collect();
                let plan = plan(&name(me), keys.iter().map(String::as_str), &seen);
                held[me].extend(plan.hold);
                for key in &keys {
                    let holders = held.iter().filter(|h| h.contains(key)).count();
                    prop_assert!(holders <= 1, "{key} held by {holders}");
                }
            }
        }
    }
}
