//! Which replica owns which remote: rendezvous hashing over the live
//! members, and the rule that fences a move.
//!
//! Invariants:
//! - **Ownership.** A remote belongs to the member of highest weight among
//!   the live *full* members, the weight being the first 8 bytes of SHA-256
//!   of the member's identity and the remote's key (its normalized URL).
//!   Every replica computes the same owner from the same members, with no
//!   coordination.
//! - **Little movement.** A member joining takes only the remotes it now
//!   wins, about 1/N; a member leaving gives up only its own; no remote
//!   moves between two members that stay.
//! - **A newcomer waits.** A replica that starts (or whose claim lapsed)
//!   is *joining* for a full `leaseDuration` of successful rounds: it
//!   publishes an empty view, holds nothing, and owns nothing in anyone's
//!   computation, so the others keep its future share meanwhile. By then it
//!   has seen every member that could hold a remote: a member's Lease
//!   exists before it holds anything, and one that vanished while current
//!   counts as live for a full duration (`claim.rs`).
//! - **No two holders.** Each full member publishes, in its Lease, the
//!   members its current holdings were computed from (its *view*), and
//!   publishes a new view only after it has stopped the remotes the new
//!   view takes from it. It takes remotes only under a view it published
//!   in an earlier round, and only those that no other live member still
//!   owns under that member's own published view: of two members that each
//!   list before the other writes, neither takes in that round. Two live
//!   members that see each other can never both own a remote (for
//!   rendezvous hashing, the owner among any set containing both is the
//!   same one of the two), so a remote is held twice only if a member
//!   counts a live one as dead; that is what the claims, measured on the
//!   reader's own clock, and the holder's fence (it stops before its Lease
//!   can expire for others) rule out, as in leader election.
//! - **Leaving.** A member that stops releases its Lease (no holder) once
//!   its manager has stopped: the others take its remotes at their next
//!   round. Lapsed or released member Leases are deleted by the full
//!   members a `leaseDuration` later, with the `resourceVersion` read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Error;
use super::claim::{self, Claimant, Lapse, Observer, Releaser, TryError, shown_holder};
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
    owner_by(members, |m| weight(m, remote))
}

/// The member of `members` of highest weight, as `weigh` gives each:
/// [`owner`]'s rule, whether the weights are hashed now or were kept.
fn owner_by<'m>(
    members: impl IntoIterator<Item = &'m str>,
    weigh: impl Fn(&str) -> u64,
) -> Option<&'m str> {
    members
        .into_iter()
        .map(|m| (weigh(m), std::cmp::Reverse(m), m))
        .max()
        .map(|(_, _, m)| m)
}

/// A live member, as its Lease shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its identity: the Lease's holder.
    pub identity: String,
    /// The members its holdings were computed from; empty while it joins,
    /// when it owns and holds nothing.
    pub view: BTreeSet<String>,
}

/// What this replica should do with its remotes now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The keys it owns under the live full members, and may hold now.
    pub hold: BTreeSet<String>,
    /// The keys it owns, but another live member still owns under its
    /// published view: taken once that member publishes a newer view, or
    /// its Lease expires.
    pub waiting: BTreeSet<String>,
}

/// The plan of `me` for the remotes keyed `keys`, given the `live` members
/// (`me` among them, with its view as it will publish it). Members with an
/// empty view are joining and own nothing.
#[must_use]
pub fn plan<'k>(me: &str, keys: impl IntoIterator<Item = &'k str>, live: &[Member]) -> Plan {
    let rule = Rule::of(me, live);
    let mut plan = Plan::default();
    for key in keys {
        let into = match rule.place(|m| weight(m, key)) {
            Some(Place::Hold) => &mut plan.hold,
            Some(Place::Wait) => &mut plan.waiting,
            None => continue,
        };
        into.insert(key.to_owned());
    }
    plan
}

/// Where [`plan`] puts a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Hold,
    Wait,
}

/// [`plan`]'s rule for one replica and the live members, for any key.
struct Rule<'l> {
    me: &'l str,
    /// The full members: those with a view.
    members: Vec<&'l str>,
    /// The others, with their views.
    others: Vec<&'l Member>,
}

impl<'l> Rule<'l> {
    fn of(me: &'l str, live: &'l [Member]) -> Self {
        Self {
            me,
            members: live
                .iter()
                .filter(|m| !m.view.is_empty())
                .map(|m| m.identity.as_str())
                .collect(),
            others: live.iter().filter(|m| m.identity != me).collect(),
        }
    }

    /// Where the key that `weigh` gives each member's weight for goes:
    /// held, waited for (another live member still owns it under its
    /// published view), or neither (another member owns it).
    fn place(&self, weigh: impl Fn(&str) -> u64) -> Option<Place> {
        if owner_by(self.members.iter().copied(), &weigh) != Some(self.me) {
            return None;
        }
        let claimed = self.others.iter().any(|m| {
            owner_by(m.view.iter().map(String::as_str), &weigh) == Some(m.identity.as_str())
        });
        Some(if claimed { Place::Wait } else { Place::Hold })
    }
}

/// A round's ownership, computed again only when its inputs change; and
/// each member's weight for each remote, kept while the remotes stay the
/// same, so that a computation compares numbers where it hashed every
/// remote with every member (about two million SHA-256, 0.19 s of the
/// Leases' thread, at 100,000 remotes and ten members).
#[derive(Debug, Default)]
struct Memo {
    mine: Option<Mine>,
    plan: Option<Planned>,
    weights: Weights,
}

/// What [`Memo::mine`] computed, and from what.
#[derive(Debug)]
struct Mine {
    keys: Arc<Keys>,
    members: BTreeSet<String>,
    names: BTreeSet<String>,
}

/// What [`Memo::plan`] computed, by name, and from what.
#[derive(Debug)]
struct Planned {
    keys: Arc<Keys>,
    live: Vec<Member>,
    hold: BTreeSet<String>,
    waiting: BTreeSet<String>,
}

/// The most identities [`Weights`] keeps a row for: 256 bytes a remote at
/// most, whatever the size of the group; the weights of the members past
/// it are hashed as they are asked.
const MAX_ROWS: usize = 32;

/// Members' weights for the keys of one set of remotes.
#[derive(Debug, Default)]
struct Weights {
    /// The remotes they are for.
    keys: Arc<Keys>,
    /// By identity: its weight for each remote's key, in `keys`' order.
    /// Made only for the live members and this replica, at most
    /// [`MAX_ROWS`] (an identity that only a view names, or past the
    /// bound, is hashed as it is asked), and kept while a live member or a
    /// view names it.
    rows: BTreeMap<String, Vec<u64>>,
    /// How many rows were made: each is a SHA-256 for every remote.
    made: u64,
}

impl Weights {
    /// Ready for `keys`, with a row for each of `members`.
    fn ready<'m>(&mut self, keys: &Arc<Keys>, members: impl IntoIterator<Item = &'m str>) {
        if !Arc::ptr_eq(&self.keys, keys) {
            self.keys = Arc::clone(keys);
            self.rows.clear();
        }
        for member in members {
            if !self.rows.contains_key(member) && self.rows.len() < MAX_ROWS {
                let row = keys.values().map(|key| weight(member, key)).collect();
                self.rows.insert(member.to_owned(), row);
                self.made += 1;
            }
        }
    }

    /// Drops the rows of identities that `named` leaves out.
    fn keep_only(&mut self, named: &BTreeSet<&str>) {
        self.rows
            .retain(|member, _| named.contains(member.as_str()));
    }

    /// `member`'s weight for the `i`th remote, keyed `key`.
    fn of(&self, member: &str, i: usize, key: &str) -> u64 {
        self.rows
            .get(member)
            .map_or_else(|| weight(member, key), |row| row[i])
    }

    /// The names of the remotes `chosen` marks, in `keys`' order.
    fn names(&self, chosen: &[bool]) -> BTreeSet<String> {
        self.keys
            .keys()
            .zip(chosen)
            .filter(|(_, chosen)| **chosen)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

impl Memo {
    /// The names of the remotes in `keys` that `me` owns among `members`.
    fn mine(
        &mut self,
        me: &str,
        keys: &Arc<Keys>,
        members: &BTreeSet<String>,
    ) -> &BTreeSet<String> {
        let fresh = self
            .mine
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(&m.keys, keys) && m.members == *members);
        if !fresh {
            let weights = &mut self.weights;
            weights.ready(keys, members.iter().map(String::as_str));
            let owned: Vec<bool> = keys
                .values()
                .enumerate()
                .map(|(i, key)| {
                    owner_by(members.iter().map(String::as_str), |m| {
                        weights.of(m, i, key)
                    }) == Some(me)
                })
                .collect();
            self.mine = Some(Mine {
                keys: Arc::clone(keys),
                members: members.clone(),
                names: weights.names(&owned),
            });
        }
        &self.mine.as_ref().expect("set above").names
    }

    /// [`plan`] for `me`, `keys` and `live`, by name: what to hold, and
    /// what to wait for.
    fn plan(
        &mut self,
        me: &str,
        keys: &Arc<Keys>,
        mut live: Vec<Member>,
    ) -> (&BTreeSet<String>, &BTreeSet<String>) {
        live.sort_by(|a, b| a.identity.cmp(&b.identity));
        let fresh = self
            .plan
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(&p.keys, keys) && p.live == live);
        if !fresh {
            let weights = &mut self.weights;
            weights.ready(keys, live.iter().map(|m| m.identity.as_str()));
            let named: BTreeSet<&str> = live
                .iter()
                .flat_map(|m| m.view.iter().chain([&m.identity]))
                .map(String::as_str)
                .collect();
            weights.keep_only(&named);
            let rule = Rule::of(me, &live);
            let (mut hold, mut waiting) = (vec![false; keys.len()], vec![false; keys.len()]);
            for (i, key) in keys.values().enumerate() {
                match rule.place(|m| weights.of(m, i, key)) {
                    Some(Place::Hold) => hold[i] = true,
                    Some(Place::Wait) => waiting[i] = true,
                    None => {}
                }
            }
            let (hold, waiting) = (weights.names(&hold), weights.names(&waiting));
            self.plan = Some(Planned {
                keys: Arc::clone(keys),
                live,
                hold,
                waiting,
            });
        }
        let planned = self.plan.as_ref().expect("set above");
        (&planned.hold, &planned.waiting)
    }
}

/// The label that marks a shard Lease, its value the prefix: the members
/// are the Leases that carry it.
pub const GROUP_LABEL: &str = "tether.dev/shard-group";

/// The annotation in which a member publishes its view: the identities its
/// holdings were computed from, comma-separated; empty while it joins.
pub const VIEW_ANNOTATION: &str = "tether.dev/view";

/// The most identities read from one member's view: far more replicas than
/// a group has, far fewer than a hostile annotation could list.
const MAX_VIEW: usize = 1000;

/// Where this replica stands among the shards, for `/status` and `check`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardState {
    /// This replica's identity.
    pub identity: String,
    /// `namespace/prefix`.
    pub group: String,
    /// The live full members, by identity, as this replica sees them.
    pub members: Vec<String>,
    /// The remotes (by name) this replica holds.
    pub owned: BTreeSet<String>,
    /// The remotes it owns, but waits for another member to give up.
    pub waiting: BTreeSet<String>,
    /// While it joins: how long until it is a full member and takes its
    /// share.
    pub joining: Option<std::time::Duration>,
    /// Whether its own Lease names its identity but another process wrote
    /// it: two processes share one identity.
    pub twin: bool,
    /// Why the last round failed, if it did.
    pub last_error: Option<String>,
    /// The remotes with a `tether_remote_owned` series: the keys as last
    /// held under.
    exported: Arc<Keys>,
}

/// The configured remotes, by name, with their keys (normalized URLs).
type Keys = BTreeMap<String, String>;

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
    gate: Arc<watch::Sender<bool>>,
    keys: watch::Sender<Arc<Keys>>,
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

    /// The supervisor's gate: open while this replica holds a remote. The
    /// sharding closes it itself, in the step that empties its holdings (a
    /// fence included); it opens only through
    /// [`open_if_holding`](Self::open_if_holding), once the plan that runs
    /// the remotes held is published.
    #[must_use]
    pub fn gate(&self) -> watch::Receiver<bool> {
        self.gate.subscribe()
    }

    /// Opens the gate if this replica holds a remote now, or closes it.
    /// Read under the gate's lock, so that it cannot open on holdings the
    /// sharding emptied meanwhile.
    pub fn open_if_holding(&self) {
        self.gate.send_if_modified(|open| {
            let now = !self.holding.borrow().is_empty();
            std::mem::replace(open, now) != now
        });
    }

    /// How many remotes this replica last said it runs: what it gives up
    /// when its share goes to none.
    #[must_use]
    pub fn applied_count(&self) -> usize {
        self.applied.borrow().len()
    }

    /// How many remotes are configured, this replica's or not.
    #[must_use]
    pub fn configured(&self) -> usize {
        self.keys.borrow().len()
    }

    /// The configured remotes, by name, with their keys (normalized URLs),
    /// at start and after each reload.
    pub fn set_remotes(&self, keys: Keys) {
        self.keys.send_replace(Arc::new(keys));
    }

    /// Tells the sharding that nothing runs the remotes outside `names`
    /// any more: their probes stopped, and the cycle that used them ended.
    /// Only then does it let other members take them.
    pub fn applied(&self, names: BTreeSet<String>) {
        self.applied.send_replace(names);
    }
}

/// What this replica has seen of another member's Lease.
#[derive(Debug)]
struct Seen {
    observer: Observer,
    /// Its holder and view as last read; kept while the Lease is absent
    /// but its claim may still be current.
    holder: String,
    view: BTreeSet<String>,
    /// The `resourceVersion` last read, for a delete that must not remove
    /// a Lease renewed since.
    version: Option<String>,
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
    gate: Arc<watch::Sender<bool>>,
    keys: watch::Receiver<Arc<Keys>>,
    applied: watch::Receiver<BTreeSet<String>>,
    handle: ShardHandle,
    /// The last round's ownership, while its inputs stay the same.
    memo: Memo,
    /// What this replica has seen of its own Lease, and wrote to it.
    own: Observer,
    /// The other members' Leases, by name.
    seen: BTreeMap<String, Seen>,
    /// The view this replica last published.
    view: BTreeSet<String>,
    /// When its current membership's first round succeeded: it joins until
    /// a `leaseDuration` later.
    since: Option<Instant>,
}

impl std::fmt::Debug for Sharding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharding")
            .field("identity", &self.identity)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A member's view, from its annotation: at most [`MAX_VIEW`] identities,
/// each as [`shown_holder`] keeps it.
fn parse_view(lease: &Lease) -> BTreeSet<String> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VIEW_ANNOTATION))
        .map(|v| {
            v.split(',')
                .filter(|m| !m.is_empty())
                .take(MAX_VIEW)
                .map(shown_holder)
                .collect()
        })
        .unwrap_or_default()
}

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
            "Live full members of this replica's shard group, as it sees them.",
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
        let gate = Arc::new(watch::channel(false).0);
        let (keys_tx, keys) = watch::channel(Arc::default());
        let (applied_tx, applied) = watch::channel(BTreeSet::new());
        Ok(Self {
            own: Observer::new(election.lease_duration),
            spec: election,
            prefix: sharding.lease_prefix.clone(),
            leases: api,
            identity,
            handle: ShardHandle {
                shared: Arc::clone(&shared),
                holding: holding_rx,
                gate: Arc::clone(&gate),
                keys: keys_tx,
                applied: applied_tx,
            },
            shared,
            holding,
            gate,
            keys,
            memo: Memo::default(),
            applied,
            seen: BTreeMap::new(),
            view: BTreeSet::new(),
            since: None,
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
        self.shared
            .members
            .set(i64::try_from(members.len()).unwrap_or(i64::MAX));
        {
            let configured = Arc::clone(&self.keys.borrow());
            let mut state = lock(&self.shared.state);
            // Every round holds, and most change nothing: the series are
            // all written when the remotes change, and otherwise only
            // those of the remotes taken or given up.
            let set = |name: &String| {
                self.shared
                    .remote_owned
                    .with_label_values(&[name])
                    .set(i64::from(names.contains(name)));
            };
            if Arc::ptr_eq(&state.exported, &configured) {
                state.owned.symmetric_difference(&names).for_each(set);
            } else {
                for gone in state.exported.keys() {
                    if !configured.contains_key(gone) {
                        let _ = self.shared.remote_owned.remove_label_values(&[gone]);
                    }
                }
                configured.keys().for_each(set);
                state.exported = configured;
            }
            state.owned.clone_from(&names);
            state.waiting = waiting;
            state.members = members;
        }
        let none = names.is_empty();
        self.holding.send_if_modified(|held| {
            if *held == names {
                return false;
            }
            *held = names;
            true
        });
        // The fence: closed here, not behind the plan.
        if none {
            self.gate
                .send_if_modified(|open| std::mem::replace(open, false));
        }
    }

    /// Holds nothing, and starts joining again. The view it publishes
    /// stays until the daemon says nothing runs the remotes any more: an
    /// empty view tells the others they may take them at once.
    fn let_go(&mut self) {
        self.since = None;
        // What it announced before it let go counts for nothing: it joins
        // again, and takes only under a view it publishes from now on.
        self.view = BTreeSet::new();
        self.hold(BTreeSet::new(), BTreeSet::new(), Vec::new());
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
    /// holds nothing, and releases its Lease once the daemon has let go, so
    /// the others take its remotes at once.
    ///
    /// # Cancellation safety
    ///
    /// Cancel `stop` instead of dropping it.
    pub async fn run(mut self, stop: CancellationToken) {
        let spec = self.spec.clone();
        info!(
            identity = %self.identity,
            lease = %self.lease_name(),
            "sharding: this replica's identity; it joins for a leaseDuration before it takes a share"
        );
        claim::keep(&mut self, &spec, &stop).await;
        self.let_go();
        let deadline = Instant::now() + spec.renew_deadline;
        if self.until_applied(&BTreeSet::new(), deadline).await {
            match claim::release(spec.renew_deadline, &mut self).await {
                Ok(true) => {
                    info!(identity = %self.identity, "shard Lease released: the other replicas take its remotes now");
                }
                Ok(false) => {}
                Err(err) => {
                    warn!(error = %err, "could not release the shard Lease; the others take its remotes after leaseDuration");
                }
            }
        }
    }

    /// Reads the group's Leases: this replica's own, and what each other
    /// member's says. Returns this replica's own Lease, if it exists, and
    /// the names of the Leases a full member should delete.
    fn read(&mut self, leases: Vec<Lease>) -> (Option<Lease>, Vec<(String, Option<String>)>) {
        let mine = self.lease_name();
        let mut own = None;
        let mut present = BTreeSet::new();
        for lease in leases {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            if name == mine {
                own = Some(lease);
                continue;
            }
            let record = lease.spec.clone().unwrap_or_default();
            let seen = self.seen.entry(name.clone()).or_insert_with(|| Seen {
                observer: Observer::new(self.spec.lease_duration),
                holder: String::new(),
                view: BTreeSet::new(),
                version: None,
            });
            seen.observer.observe(Some(&record), &self.identity);
            seen.holder = shown_holder(record.holder_identity.as_deref().unwrap_or(""));
            seen.view = parse_view(&lease);
            seen.version.clone_from(&lease.metadata.resource_version);
            present.insert(name);
        }
        let mut stale = Vec::new();
        let lease_duration = self.spec.lease_duration.duration();
        self.seen.retain(|name, seen| {
            if !present.contains(name) {
                seen.observer.observe(None, "");
            }
            let claim = seen.observer.claim().cloned();
            let lapsed_for_long = claim
                .as_ref()
                .is_some_and(|c| Instant::now() >= c.expiry + lease_duration);
            if lapsed_for_long && present.contains(name) {
                stale.push((name.clone(), seen.version.clone()));
            }
            // Forget a Lease gone and no longer claimed.
            present.contains(name) || claim.is_some_and(|c| c.is_current())
        });
        (own, stale)
    }

    /// The other members whose claim is current, with their views.
    fn live(&self) -> Vec<Member> {
        self.seen
            .values()
            .filter(|s| {
                !s.holder.is_empty()
                    && s.holder != self.identity
                    && s.observer.claim().is_some_and(claim::Claim::is_current)
            })
            .map(|s| Member {
                identity: s.holder.clone(),
                view: s.view.clone(),
            })
            .collect()
    }

    /// Creates or renews this replica's Lease, publishing `view`. Returns
    /// when the write was sent.
    async fn renew(
        &mut self,
        lease: Option<Lease>,
        ours: bool,
        view: &BTreeSet<String>,
    ) -> Result<Instant, kube::Error> {
        let name = self.lease_name();
        let now = claim::micro_now();
        let view = view.iter().cloned().collect::<Vec<_>>().join(",");
        let record = claim::holding(
            lease.as_ref().and_then(|l| l.spec.as_ref()),
            ours,
            &self.identity,
            self.spec.lease_duration,
            &now,
        );
        let old = lease.map(|l| l.metadata).unwrap_or_default();
        let exists = old.resource_version.is_some();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(GROUP_LABEL.to_owned(), self.prefix.clone())].into()),
                annotations: Some([(VIEW_ANNOTATION.to_owned(), view)].into()),
                ..old
            },
            spec: Some(record),
        };
        self.own.sending(&now);
        let sent = Instant::now();
        if exists {
            self.leases
                .replace(&name, &PostParams::default(), &lease)
                .await?;
        } else {
            self.leases.create(&PostParams::default(), &lease).await?;
        }
        Ok(sent)
    }

    /// Deletes Leases of members long gone, each only as last read.
    async fn collect(&self, stale: Vec<(String, Option<String>)>) {
        for (name, version) in stale {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: version,
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            if self.leases.delete(&name, &params).await.is_ok() {
                info!(lease = %name, "deleted the shard Lease of a member gone for a leaseDuration");
            }
        }
    }
}

/// What a round's error says, a conflict in words.
fn round_error(err: kube::Error) -> TryError {
    TryError::of(err, "this replica's shard Lease", "round")
}

impl Releaser for Sharding {
    /// Writes this replica's Lease with no holder, if this process holds
    /// it.
    async fn release_once(&mut self) -> Result<bool, kube::Error> {
        let name = self.lease_name();
        let Some(mut lease) = self.leases.get_opt(&name).await? else {
            return Ok(false);
        };
        let old = lease.spec.clone().unwrap_or_default();
        if !self.own.observe(Some(&old), &self.identity).ours {
            return Ok(false);
        }
        lease.spec = Some(claim::released(&old, &claim::micro_now()));
        lease
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(VIEW_ANNOTATION.to_owned(), String::new());
        self.leases
            .replace(&name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }
}

impl Claimant for Sharding {
    /// One round: the group's Leases read; this replica's own renewed with
    /// its view; what the members take from it given up, and what it may
    /// take taken; while it joins, nothing held and an empty view.
    async fn attempt(&mut self, fence: Option<Instant>) -> Result<Option<Instant>, TryError> {
        let selector = format!("{GROUP_LABEL}={}", self.prefix);
        let list = match self
            .leases
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => list,
            Err(err) => {
                // A replica that holds nothing has seen nothing: its wait
                // to join counts only rounds that read the group.
                if fence.is_none() {
                    self.since = None;
                }
                return Err(round_error(err));
            }
        };
        let (own, stale) = self.read(list.items);
        let spec = own.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let sighting = self.own.observe(spec.as_ref(), &self.identity);
        let twin = sighting.twin && sighting.claim.is_current();
        if twin && !lock(&self.shared.state).twin {
            warn!(
                identity = %self.identity,
                "this replica's shard Lease names its identity, but another process wrote it: two processes share one identity; this one holds nothing while the other's claim holds (give each replica its own leaderElection.identity, or leave it unset)"
            );
        }
        lock(&self.shared.state).twin = twin;
        // Another process's claim on this replica's own Lease (a twin, or
        // a previous life under a fixed identity): wait it out, holding
        // nothing. A Lease that does not exist is created at once: the
        // create fails if another process made it first.
        if own.is_some() && !sighting.ours && sighting.claim.is_current() {
            return Ok(None);
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let joined = now >= since + self.spec.lease_duration.duration();
        let members: BTreeSet<String> = if joined && fence.is_some() {
            self.live()
                .iter()
                .filter(|m| !m.view.is_empty())
                .map(|m| m.identity.clone())
                .chain([self.identity.clone()])
                .collect()
        } else {
            BTreeSet::new()
        };
        let member_list: Vec<String> = members.iter().cloned().collect();
        lock(&self.shared.state).joining =
            (!joined).then(|| since + self.spec.lease_duration.duration() - now);
        let keys = Arc::clone(&self.keys.borrow());
        // Give up first: what the new members take from this replica stops
        // now, and the view that lets them take it is published only once
        // the daemon says nothing runs it any more (the manager may take
        // its grace period to return). Meanwhile the old view is renewed,
        // and nothing is taken.
        let held = self.holding.borrow().clone();
        let mine = self.memo.mine(&self.identity, &keys, &members);
        let kept: BTreeSet<String> = held.intersection(mine).cloned().collect();
        if kept != held {
            let waiting = lock(&self.shared.state).waiting.clone();
            self.hold(kept.clone(), waiting, member_list.clone());
        }
        let released = self.applied.borrow().is_subset(&kept);
        let publish = if released {
            members.clone()
        } else {
            self.view.clone()
        };
        let sent = self
            .renew(own, sighting.ours, &publish)
            .await
            .map_err(round_error)?;
        // Take only under a view published in an earlier round: a member
        // that has not seen this one's view yet (two that finish joining at
        // once each see the other as joining) may take the same remotes
        // under its own; by the next round, every such member has either
        // published its view before this replica's list, or will list
        // after this replica's write.
        let announced = std::mem::replace(&mut self.view, publish.clone());
        if !released || publish != announced {
            return Ok(Some(sent));
        }
        let mut live = self.live();
        live.push(Member {
            identity: self.identity.clone(),
            view: members,
        });
        let (to_hold, to_wait) = self.memo.plan(&self.identity, &keys, live);
        let mut taking = to_hold.clone();
        taking.extend(kept);
        let waiting = to_wait.clone();
        self.hold(taking, waiting, member_list);
        if joined {
            self.collect(stale).await;
        }
        Ok(Some(sent))
    }

    fn lapsed(&mut self, why: Lapse) {
        let why = match why {
            Lapse::Fence => {
                "no renewal of this replica's shard Lease within renewDeadline: giving up every remote"
            }
            Lapse::Lost => {
                "another process holds this replica's shard Lease: giving up every remote"
            }
        };
        warn!(identity = %self.identity, "{why}");
        self.let_go();
    }

    fn note(&mut self, error: Option<&TryError>) {
        lock(&self.shared.state).last_error = error.map(ToString::to_string);
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

    /// `n` remotes named `r<i>`, with their keys.
    fn named(n: usize) -> Arc<Keys> {
        Arc::new(
            keys(n)
                .into_iter()
                .enumerate()
                .map(|(i, key)| (format!("r{i}"), key))
                .collect(),
        )
    }

    /// The names of the remotes in `keys` whose key is one of `of`.
    fn by_name(keys: &Keys, of: &BTreeSet<String>) -> BTreeSet<String> {
        keys.iter()
            .filter(|(_, key)| of.contains(*key))
            .map(|(name, _)| name.clone())
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

    #[test]
    fn a_joining_member_owns_nothing_and_takes_nothing() {
        let keys = keys(300);
        // c joins: its view is empty. a and b keep everything between them.
        let live = [
            member("a", &["a", "b"]),
            member("b", &["a", "b"]),
            member("c", &[]),
        ];
        let a = plan("a", keys.iter().map(String::as_str), &live);
        let b = plan("b", keys.iter().map(String::as_str), &live);
        let c = plan("c", keys.iter().map(String::as_str), &live);
        assert_eq!(
            a.hold.len() + b.hold.len(),
            keys.len(),
            "a joiner's share went unheld"
        );
        assert!(c.hold.is_empty() && c.waiting.is_empty(), "{c:?}");
    }

    #[test]
    fn the_memo_gives_what_a_fresh_computation_gives_as_its_inputs_change() {
        let mut memo = Memo::default();
        let (some, more) = (named(300), named(400));
        let two: BTreeSet<String> = ["a".to_owned(), "b".to_owned()].into();
        let three: BTreeSet<String> = ["a".to_owned(), "b".to_owned(), "c".to_owned()].into();
        let settled = [member("b", &["a", "b"]), member("a", &["a", "b"])];
        // b has not yet published a view with a in it: what a owns, it
        // waits for.
        let moving = [member("a", &["a", "b"]), member("b", &["b"])];
        // d is gone, and b's view still names it: its weights are kept
        // while named, or hashed as asked; b's own are made.
        let lost = [member("a", &["a", "b"]), member("b", &["a", "b", "d"])];
        // Each step changes one input, then repeats it, as rounds do; with
        // the identities whose weights are kept after it: made for the
        // members and the live, kept while a live member or a view names
        // them (c's go at the plan that no longer names it), none for d.
        for (keys, members, live, rows) in [
            (&some, &two, &settled, &["a", "b"][..]),
            (&some, &two, &settled, &["a", "b"]),
            (&some, &three, &settled, &["a", "b", "c"]),
            (&more, &three, &settled, &["a", "b"]),
            (&more, &three, &moving, &["a", "b"]),
            (&more, &three, &moving, &["a", "b"]),
            (&more, &two, &lost, &["a", "b"]),
            (&some, &two, &lost, &["a", "b"]),
            (&some, &two, &settled, &["a", "b"]),
        ] {
            let fresh: BTreeSet<String> = keys
                .iter()
                .filter(|(_, k)| owner(k, members.iter().map(String::as_str)) == Some("a"))
                .map(|(name, _)| name.clone())
                .collect();
            assert_eq!(*memo.mine("a", keys, members), fresh);
            let want = plan("a", keys.values().map(String::as_str), live);
            let (hold, waiting) = memo.plan("a", keys, live.to_vec());
            assert_eq!(*hold, by_name(keys, &want.hold));
            assert_eq!(*waiting, by_name(keys, &want.waiting));
            assert!(!(hold.is_empty() && waiting.is_empty()), "a owns nothing");
            let kept: Vec<&str> = memo.weights.rows.keys().map(String::as_str).collect();
            assert_eq!(kept, rows);
        }
        // The same live members, listed in another order, are the same
        // inputs: the memo keeps what it had (a new computation would keep
        // the list it was handed).
        let kept = |memo: &Memo| memo.plan.as_ref().map(|p| p.live.as_ptr());
        let before = kept(&memo);
        let _ = memo.plan("a", &some, settled.iter().rev().cloned().collect());
        assert_eq!(kept(&memo), before);
    }

    #[test]
    fn a_members_loss_and_the_views_after_it_hash_nothing_again() {
        let keys = named(1000);
        let ids = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let set =
            |ids: &[&str]| -> BTreeSet<String> { ids.iter().map(|i| (*i).to_owned()).collect() };
        let live = |ids: &[&str], views: &[&[&str]]| -> Vec<Member> {
            ids.iter().zip(views).map(|(i, v)| member(i, v)).collect()
        };
        let mut memo = Memo::default();
        let all: Vec<&[&str]> = vec![&ids; 10];
        let _ = memo.mine("a", &keys, &set(&ids));
        let _ = memo.plan("a", &keys, live(&ids, &all));
        assert_eq!(memo.weights.made, 10, "one row a member");
        // j is lost: the nine publish views without it, one round apart.
        let nine = &ids[..9];
        let _ = memo.mine("a", &keys, &set(nine));
        for moved in 1..=9 {
            let views: Vec<&[&str]> = (0..9)
                .map(|m| if m < moved { nine } else { &ids[..] })
                .collect();
            let (hold, _) = memo.plan("a", &keys, live(nine, &views));
            assert!(!hold.is_empty());
        }
        assert_eq!(memo.weights.made, 10, "a loss hashed again");
        // k joins: its row alone is made.
        let mut joined = nine.to_vec();
        joined.push("k");
        let _ = memo.mine("a", &keys, &set(&joined));
        assert_eq!(memo.weights.made, 11);
    }

    #[test]
    fn a_group_past_the_bound_keeps_that_many_rows_and_the_same_result() {
        let keys = named(300);
        let ids: Vec<String> = (0..MAX_ROWS + 8).map(|i| format!("m{i:02}")).collect();
        let members: BTreeSet<String> = ids.iter().cloned().collect();
        let view: Vec<&str> = ids.iter().map(String::as_str).collect();
        let live: Vec<Member> = ids.iter().map(|i| member(i, &view)).collect();
        let me = ids.last().expect("members");
        let mut memo = Memo::default();
        let mine = memo.mine(me, &keys, &members).clone();
        let hold = memo.plan(me, &keys, live.clone()).0.clone();
        assert_eq!(memo.weights.rows.len(), MAX_ROWS);
        let want = plan(me, keys.values().map(String::as_str), &live);
        let fresh = by_name(&keys, &want.hold);
        assert_eq!(hold, fresh);
        assert_eq!(
            mine, fresh,
            "with every view current, a member holds what it owns"
        );
        assert!(!fresh.is_empty());
    }

    /// One step of a member in the model below.
    #[derive(Debug, Clone)]
    enum Step {
        /// It lists the group: who it believes live, and their views now.
        /// It sees itself, and every member that holds a remote or has
        /// joined: their Leases are renewed, and have been there for a
        /// leaseDuration (or the member fenced itself, and lapsed). A
        /// joining member may be seen or not.
        Read(BTreeSet<usize>),
        /// It acts on what it last read: gives up what it no longer owns,
        /// publishes the members it counts as its view, and takes what the
        /// plan lets it, if that view was published before.
        Act,
        /// Its wait to join is over.
        Join,
        /// Its claim lapsed: it holds nothing, and joins again.
        Lapse,
    }

    fn step() -> impl Strategy<Value = (usize, Step)> {
        let step = prop_oneof![
            4 => proptest::collection::btree_set(0usize..4, 0..4).prop_map(Step::Read),
            4 => Just(Step::Act),
            2 => Just(Step::Join),
            1 => Just(Step::Lapse),
        ];
        (0usize..4, step)
    }

    proptest! {
        /// Members act in any order, and a list and the write and take that
        /// follow it are two steps, with others' steps between: what a
        /// member acts on may be stale. A joining member counts no member
        /// and takes nothing. No remote is ever held twice.
        #[test]
        fn no_remote_is_ever_held_twice(steps in proptest::collection::vec(step(), 1..80)) {
            let name = |i: usize| format!("m{i}");
            let keys = keys(40);
            let mut views: Vec<BTreeSet<String>> = vec![BTreeSet::new(); 4];
            let mut held: Vec<BTreeSet<String>> = vec![BTreeSet::new(); 4];
            let mut full = [false; 4];
            let mut read: Vec<Option<Vec<Member>>> = vec![None; 4];
            for (me, step) in steps {
                match step {
                    Step::Read(believed) => {
                        let live: BTreeSet<usize> = believed
                            .into_iter()
                            .chain([me])
                            .chain((0..4).filter(|&i| !held[i].is_empty() || full[i]))
                            .collect();
                        read[me] = Some(
                            live.iter()
                                .filter(|&&i| i != me)
                                .map(|&i| Member { identity: name(i), view: views[i].clone() })
                                .collect(),
                        );
                    }
                    Step::Act => {
                        let Some(others) = read[me].take() else { continue };
                        let members: BTreeSet<String> = if full[me] {
                            others
                                .iter()
                                .filter(|m| !m.view.is_empty())
                                .map(|m| m.identity.clone())
                                .chain([name(me)])
                                .collect()
                        } else {
                            BTreeSet::new()
                        };
                        held[me].retain(|k| owner(k, members.iter().map(String::as_str)) == Some(name(me).as_str()));
                        let announced = std::mem::replace(&mut views[me], members.clone());
                        if members != announced {
                            continue;
                        }
                        let mut live = others;
                        live.push(Member { identity: name(me), view: members });
                        held[me].extend(plan(&name(me), keys.iter().map(String::as_str), &live).hold);
                    }
                    Step::Join => full[me] = true,
                    Step::Lapse => {
                        held[me].clear();
                        views[me].clear();
                        full[me] = false;
                        read[me] = None;
                    }
                }
                for key in &keys {
                    let holders = held.iter().filter(|h| h.contains(key)).count();
                    prop_assert!(holders <= 1, "{key} held by {holders}");
                }
            }
        }
    }
}
