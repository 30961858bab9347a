//! What should run: one value, [`Desired`], made by a pure function of
//! tether's inputs (the config and its remotes as last read, the remotes
//! discovered from Secrets, and this replica's share), and published by
//! one task on a `watch` channel.
//!
//! Everything that acts on it subscribes, and nothing calls back:
//!
//! - the probes follow its targets;
//! - the manager reads its plan when a cycle starts;
//! - the supervisor ends the running cycle when the manager's own part of
//!   it changes ([`cycle_ends`]), as it does on a probe's signal, and makes
//!   the running cycle follow the remotes it runs when only they change
//!   ([`remote_changes`]);
//! - the sharding hears of the remotes, and once nothing runs those this
//!   replica gave up, that they are let go.
//!
//! The task does no file or network I/O: the daemon reads files, then
//! hands the result over ([`Statics`]); discovery and the sharding publish
//! their own values.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures_util::Stream;
use tether_supervisor::Cause;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::config::ranked::{Rank, Remotes};
use crate::config::remote::ResolvedRemote;
use crate::config::{Config, Plan};
use crate::discovery::{Discovery, Found};
use crate::lease::shard::ShardHandle;

/// The static remotes as the daemon last read them, with the config they
/// came from. A new `config` (a reload) ends the running cycle when the
/// manager's own settings (`watch`, `exec`) differ.
#[derive(Debug, Clone)]
pub struct Statics {
    /// The config in force.
    pub config: Arc<Config>,
    /// Its remotes, resolved, in config order; the planner's inputs share
    /// them with the channel.
    pub remotes: Remotes,
    /// Counts the daemon's readings, so that it can tell when the value
    /// published takes this one in.
    pub reading: u64,
}

/// The inputs of [`Desired::from`], all in memory.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The config and its remotes.
    pub statics: Statics,
    /// The remotes discovery gives, after the static ones.
    pub discovered: Found,
    /// With sharding, the remotes this replica holds, by name.
    pub share: Option<Arc<BTreeSet<String>>>,
    /// The home cluster, probed while discovery reads it.
    pub home: Option<tether_probes::Remote>,
}

impl Inputs {
    /// The remote named `name`, and its rank: a static remote's, else a
    /// discovered one's (discovery gives no name a static remote has).
    fn remote(&self, name: &str) -> Option<(Rank, &ResolvedRemote)> {
        if let Some(remote) = self.statics.remotes.get(name) {
            let rank = self.statics.remotes.rank(name)?;
            return Some((rank.clone(), remote));
        }
        let (place, remote) = self.discovered.get(name)?;
        Some((Rank::Discovered(place.clone()), remote))
    }

    /// Whether this replica runs the remote named `name`.
    fn runs(&self, name: &str) -> bool {
        self.share.as_ref().is_none_or(|share| share.contains(name))
    }

    /// Every name the inputs give.
    fn names(&self) -> BTreeSet<String> {
        let statics = self.statics.remotes.iter().map(|r| r.name.clone());
        statics.chain(self.discovered.keys().cloned()).collect()
    }
}

/// What should run, and since when.
#[derive(Debug, Clone)]
pub struct Desired {
    /// Counts the values published; the first is 1.
    pub revision: u64,
    /// What the probes probe that differs from the value before this one
    /// (`revision - 1`), by name: a remote now, or `None`, gone. A
    /// follower that applied that value applies this alone.
    pub probes_changed: Arc<Vec<(String, Option<tether_probes::Remote>)>>,
    /// What the manager runs.
    pub plan: Arc<Plan>,
    /// Every remote, this replica's or not.
    pub all: Remotes,
    /// With sharding, the remotes this replica holds.
    pub share: Option<Arc<BTreeSet<String>>>,
    /// Counts the changes of the manager's own part, which end its cycle:
    /// its settings, or whether a remote it runs is required.
    pub manager: u64,
    /// Why the manager's part last changed; `None` before it ever did.
    pub cause: Option<Cause>,
    /// Counts the changes of the remotes the manager runs alone: added,
    /// gone, or read anew (a new generation).
    pub remotes: u64,
    /// Why they last changed; `None` before they ever did.
    pub remotes_cause: Option<Cause>,
    /// The daemon's reading of the static remotes this value takes in.
    pub reading: u64,
    /// The home cluster, probed beside the plan's remotes.
    home: Option<tether_probes::Remote>,
    /// The config the plan was made under, to tell a reload.
    config: Arc<Config>,
}

/// What one value changed from the one before.
#[derive(Debug, Default, Clone)]
pub struct Change {
    /// Remotes probed now that were not.
    pub added: usize,
    /// Remotes no longer probed.
    pub removed: usize,
    /// Remotes probed with new settings.
    pub rebuilt: usize,
    /// Why the running cycle ends, if the manager's own part changed.
    pub ends_cycle: Option<Cause>,
    /// Why, if the remotes the manager runs changed, one by one.
    pub remotes: Option<Cause>,
    /// The probes added, gone or rebuilt, by name.
    pub probes: Vec<(String, Option<tether_probes::Remote>)>,
    /// Whether any remote, this replica's or not, came, went or changed:
    /// what the sharding hears of.
    pub all: bool,
}

impl Change {
    /// Whether nothing changed at all.
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.probes.is_empty() && self.ends_cycle.is_none() && self.remotes.is_none() && !self.all
    }
}

impl Desired {
    /// What `inputs` say should run: the first value.
    #[must_use]
    pub fn from(inputs: &Inputs) -> Self {
        let empty = Self {
            revision: 1,
            probes_changed: Arc::default(),
            plan: Arc::new(Plan::new(&inputs.statics.config, Remotes::default())),
            all: Remotes::default(),
            share: inputs.share.clone(),
            manager: 1,
            cause: None,
            remotes: 1,
            remotes_cause: None,
            reading: inputs.statics.reading,
            home: inputs.home.clone(),
            config: Arc::clone(&inputs.statics.config),
        };
        let (mut first, _) = empty.apply(inputs, &inputs.names());
        // There is no value before the first.
        first.probes_changed = Arc::default();
        first
    }

    /// The value after `self` that `inputs` give, and what changed; `self`
    /// again, with nothing changed, if nothing did. Every remote is
    /// looked at, as the tests compare: the planner uses
    /// [`next_of`](Self::next_of), which looks at those named alone.
    #[cfg(test)]
    #[must_use]
    pub fn next(&self, inputs: &Inputs) -> (Self, Change) {
        let mut names = inputs.names();
        names.extend(self.all.iter().map(|r| r.name.clone()));
        self.next_of(inputs, &names)
    }

    /// As [`next`](Self::next), where only the remotes named in `touched`
    /// may differ between the inputs `self` was made of and `inputs`: it
    /// costs work in proportion to them, not to the remotes.
    #[must_use]
    pub fn next_of(&self, inputs: &Inputs, touched: &BTreeSet<String>) -> (Self, Change) {
        let (mut next, change) = self.apply(inputs, touched);
        if change.is_none() && self.share == next.share && self.reading == next.reading {
            return (self.clone(), change);
        }
        next.revision = self.revision + 1;
        (next.manager, next.cause) = match &change.ends_cycle {
            Some(cause) => (self.manager + 1, Some(cause.clone())),
            None => (self.manager, self.cause.clone()),
        };
        (next.remotes, next.remotes_cause) = match &change.remotes {
            Some(cause) => (self.remotes + 1, Some(cause.clone())),
            None => (self.remotes, self.remotes_cause.clone()),
        };
        (next, change)
    }

    /// `self` with the remotes named in `touched` as `inputs` give them,
    /// and what that changed. Its counters are `self`'s, for the caller to
    /// move.
    fn apply(&self, inputs: &Inputs, touched: &BTreeSet<String>) -> (Self, Change) {
        let (mut all, mut running) = (self.all.clone(), self.plan.remotes.clone());
        // Each remote that changes is taken out first and put back after,
        // so that one that moves never lands on the rank another is leaving.
        let (mut to_all, mut to_run) = (Vec::new(), Vec::new());
        let mut change = Change::default();
        let (mut runs_changed, mut required_flipped) = (false, false);
        let (mut taken, mut given_up) = (0, 0);
        for name in touched {
            let now = inputs.remote(name);
            let had = self.all.get(name);
            let kept = match (had, &now) {
                (Some(had), Some((rank, remote))) => {
                    same_remote(had, remote) && self.all.rank(name) == Some(rank)
                }
                (had, now) => had.is_none() && now.is_none(),
            };
            if !kept {
                change.all = true;
                all.remove(name);
                to_all.extend(now.clone());
            }
            let will = now.filter(|_| inputs.runs(name));
            let ran = self.plan.remotes.get(name);
            match (ran, &will) {
                (None, None) => continue,
                (None, Some((_, remote))) => {
                    change.added += 1;
                    change.probes.push((name.clone(), Some(remote.probed())));
                    (runs_changed, taken) = (true, taken + 1);
                }
                (Some(_), None) => {
                    change.removed += 1;
                    change.probes.push((name.clone(), None));
                    (runs_changed, given_up) = (true, given_up + 1);
                }
                (Some(ran), Some((rank, remote))) => {
                    if same_remote(ran, remote) && self.plan.remotes.rank(name) == Some(rank) {
                        continue;
                    }
                    if !Arc::ptr_eq(&ran.config, &remote.config) {
                        change.rebuilt += 1;
                        change.probes.push((name.clone(), Some(remote.probed())));
                    }
                    // Whether a remote is required decides what its loss
                    // costs, which no running cycle can change.
                    required_flipped |= ran.required != remote.required;
                    runs_changed |= ran.generation != remote.generation;
                }
            }
            running.remove(name);
            to_run.extend(will);
        }
        for (rank, remote) in to_all {
            all.insert(rank, remote.clone());
        }
        if inputs.share.is_none() {
            // It runs every remote: one map, not two alike.
            running = all.clone();
        } else {
            for (rank, remote) in to_run {
                running.insert(rank, remote.clone());
            }
        }
        let own = |c: &Config| (c.watch.clone(), c.exec.clone());
        let own_changed = own(&self.config) != own(&inputs.statics.config);
        change.ends_cycle = (required_flipped || own_changed).then_some(Cause::ConfigChanged);
        let share_changed = self.share != inputs.share;
        change.remotes = if change.ends_cycle.is_some() || !runs_changed {
            None
        } else if share_changed {
            Some(Cause::ShardChanged { taken, given_up })
        } else {
            Some(Cause::ConfigChanged)
        };
        let next = Self {
            revision: self.revision,
            probes_changed: Arc::new(change.probes.clone()),
            plan: Arc::new(Plan::new(&inputs.statics.config, running)),
            all,
            share: inputs.share.clone(),
            manager: self.manager,
            cause: self.cause.clone(),
            remotes: self.remotes,
            remotes_cause: self.remotes_cause.clone(),
            reading: inputs.statics.reading,
            home: self.home.clone(),
            config: Arc::clone(&inputs.statics.config),
        };
        (next, change)
    }

    /// What the probes probe: the plan's remotes, and the home cluster.
    #[must_use]
    pub fn probes(&self) -> Vec<tether_probes::Remote> {
        let mut probes: Vec<_> = self
            .plan
            .remotes
            .iter()
            .map(ResolvedRemote::probed)
            .collect();
        probes.extend(self.home.clone());
        probes
    }

    /// Every remote, this replica's or not, by name, with its sharding
    /// key: its normalized URL, so that the names that share an apiserver
    /// share an owner (and one probe).
    #[must_use]
    pub fn keys(&self) -> BTreeMap<String, String> {
        self.all
            .iter()
            .map(|r| (r.name.clone(), r.identity.url.clone()))
            .collect()
    }

    /// The names of the remotes the plan runs.
    #[must_use]
    pub fn running(&self) -> BTreeSet<String> {
        self.plan.remotes.iter().map(|r| r.name.clone()).collect()
    }
}

/// Whether `a` and `b` are the same remote as the manager and the probes
/// take it: its settings (the same reading), whether it is required, and
/// its generation.
fn same_remote(a: &ResolvedRemote, b: &ResolvedRemote) -> bool {
    Arc::ptr_eq(&a.config, &b.config) && a.required == b.required && a.generation == b.generation
}

/// The causes to end the running cycle with, as the manager's own part of
/// `desired` changes: the supervisor's input. A value the stream skips
/// (a `watch` keeps only the last) still counts: the stream compares what
/// it last saw with what is there now.
pub(crate) fn cycle_ends(
    desired: watch::Receiver<Arc<Desired>>,
) -> impl Stream<Item = Cause> + Send {
    changes_of(desired, |d| (d.manager, d.cause.as_ref()))
}

/// The causes the remotes the manager runs changed for, one by one: the
/// supervisor's input, which makes the running cycle follow them. As with
/// [`cycle_ends`], skipped values still count.
pub(crate) fn remote_changes(
    desired: watch::Receiver<Arc<Desired>>,
) -> impl Stream<Item = Cause> + Send {
    changes_of(desired, |d| (d.remotes, d.remotes_cause.as_ref()))
}

/// A cause each time the counter `part` picks out of `desired` moves.
fn changes_of(
    desired: watch::Receiver<Arc<Desired>>,
    part: fn(&Desired) -> (u64, Option<&Cause>),
) -> impl Stream<Item = Cause> + Send {
    let seen = part(&desired.borrow()).0;
    futures_util::stream::unfold((desired, seen), move |(mut desired, seen)| async move {
        loop {
            desired.changed().await.ok()?;
            let now = Arc::clone(&desired.borrow_and_update());
            let (count, cause) = part(&now);
            if count != seen {
                let cause = cause.cloned().unwrap_or(Cause::ConfigChanged);
                return Some((cause, (desired, count)));
            }
        }
    })
}

/// The one task that owns the inputs and publishes [`Desired`].
#[derive(Debug)]
pub(crate) struct Planner {
    inputs: Inputs,
    /// The remotes whose inputs changed since the value last made.
    touched: BTreeSet<String>,
    statics: watch::Receiver<Statics>,
    discovery: Option<Arc<Discovery>>,
    shard: Option<ShardHandle>,
    desired: watch::Sender<Arc<Desired>>,
}

impl Planner {
    /// The planner for `statics` (the daemon sends new ones on its
    /// sender), `discovery` and `shard`, and the first value, published.
    #[must_use]
    pub(crate) fn new(
        statics: watch::Receiver<Statics>,
        discovery: Option<Arc<Discovery>>,
        shard: Option<ShardHandle>,
    ) -> (Self, watch::Receiver<Arc<Desired>>) {
        let first = statics.borrow().clone();
        let mut found = Found::new();
        if let Some(discovery) = &discovery {
            discovery.update(Some(&first.remotes), &mut found);
        }
        let inputs = Inputs {
            discovered: found,
            share: shard
                .as_ref()
                .map(|s| Arc::new(s.holding().borrow().clone())),
            home: discovery.as_deref().map(Discovery::home),
            statics: first,
        };
        let value = Desired::from(&inputs);
        if let Some(shard) = &shard {
            shard.set_remotes(value.keys());
        }
        let (desired, subscribed) = watch::channel(Arc::new(value));
        (
            Self {
                inputs,
                touched: BTreeSet::new(),
                statics,
                discovery,
                shard,
                desired,
            },
            subscribed,
        )
    }

    /// Publishes a new value whenever an input changes, until `stop`.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let (_never, idle) = watch::channel(BTreeSet::new());
        let (_quiet, silent) = watch::channel(0);
        let mut holding = self.shard.as_ref().map_or(idle, ShardHandle::holding);
        let mut found = self.discovery.as_ref().map_or(silent, |d| d.changes());
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Ok(()) = self.statics.changed() => {
                    let statics = self.statics.borrow_and_update().clone();
                    // A reading is read whole: each of its remotes, and
                    // each of the last, is looked at again.
                    let names = |s: &Statics| s.remotes.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
                    self.touched.extend(names(&self.inputs.statics));
                    self.touched.extend(names(&statics));
                    self.inputs.statics = statics;
                    let remotes = self.inputs.statics.remotes.clone();
                    self.take_found(Some(&remotes));
                }
                Ok(()) = found.changed() => {
                    found.borrow_and_update();
                    self.take_found(None);
                }
                Ok(()) = holding.changed() => {
                    let share = Arc::new(holding.borrow_and_update().clone());
                    if let Some(had) = &self.inputs.share {
                        self.touched.extend(had.symmetric_difference(&share).cloned());
                    } else {
                        self.touched.extend(self.inputs.names());
                    }
                    self.inputs.share = Some(share);
                }
            }
            self.publish();
        }
    }

    /// Takes in what discovery learned, beside the static remotes (whose
    /// names win) when they are new.
    fn take_found(&mut self, statics: Option<&Remotes>) {
        if let Some(discovery) = &self.discovery {
            let names = discovery.update(statics, &mut self.inputs.discovered);
            self.touched.extend(names);
        }
    }

    /// Makes the value of the inputs now, and publishes it if it differs.
    fn publish(&mut self) {
        let before = Arc::clone(&self.desired.borrow());
        let (next, change) = before.next_of(&self.inputs, &self.touched);
        self.touched.clear();
        if next.revision == before.revision {
            return;
        }
        if let Some(shard) = &self.shard
            && change.all
        {
            shard.set_remotes(next.keys());
        }
        if next.share != before.share {
            let (had, has) = (before.running(), next.running());
            info!(
                holds = has.len(),
                taken = has.difference(&had).count(),
                given_up = had.difference(&has).count(),
                "this replica's remotes changed"
            );
        } else if change.added + change.removed + change.rebuilt > 0 {
            info!(
                added = change.added,
                gone = change.removed,
                rebuilt = change.rebuilt,
                probed = next.plan.remotes.len() + usize::from(next.home.is_some()),
                "the remotes changed{}",
                if change.ends_cycle.is_some() {
                    "; the cycle ends"
                } else {
                    ""
                }
            );
        }
        let opens = next.share.as_ref().is_some_and(|s| !s.is_empty());
        self.desired.send_replace(Arc::new(next));
        // Only now that the plan runs them may a cycle start on them.
        if let Some(shard) = &self.shard
            && opens
        {
            shard.open_if_holding();
        }
    }
}

/// Applies each value `desired` publishes with `apply`, until `stop`;
/// `followed` holds the revision last applied. `apply` is given the value
/// it last applied whole, if it did, and says whether it applied this one.
pub(crate) async fn follow(
    mut desired: watch::Receiver<Arc<Desired>>,
    apply: impl Fn(&Desired, Option<&Desired>) -> bool + Send,
    followed: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let mut last: Option<Arc<Desired>> = None;
    loop {
        let now = Arc::clone(&desired.borrow_and_update());
        let applied = apply(&now, last.as_deref());
        followed.send_replace(now.revision);
        last = applied.then_some(now);
        tokio::select! {
            () = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
        }
    }
}

/// Keeps `probes` probing what a value says: what changed alone, when they
/// follow the value just before it (`last`), else every remote. Whether
/// they took it in.
pub(crate) fn probe(
    probes: &tether_probes::ProbeSet,
    desired: &Desired,
    last: Option<&Desired>,
) -> bool {
    let applied = match last {
        Some(last) if last.revision + 1 == desired.revision => probes.update(
            desired
                .probes_changed
                .iter()
                .map(|(name, remote)| (name.as_str(), remote.as_ref())),
        ),
        _ => probes.sync(&desired.probes()),
    };
    if let Err(err) = &applied {
        // The names and URLs were checked when they were read; if this
        // failed anyway, the probes keep what they had, and the next
        // value is applied whole.
        error!(error = %err, "applying the remotes to the probes failed; they keep what they had");
    }
    applied.is_ok()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use futures_util::{FutureExt as _, StreamExt as _};

    use super::*;

    fn config() -> Arc<Config> {
        Arc::new(
            Config::parse(
                "remotes: [{name: a, server: \"https://a:6443\"}]",
                "t.yaml",
                Path::new("."),
            )
            .expect("valid"),
        )
    }

    fn remote(name: &str, host: &str) -> ResolvedRemote {
        ResolvedRemote::on(name, host)
    }

    /// The remote `name` as a Secret of its own name gives it.
    fn discovered(name: &str) -> Found {
        Found::from([(name.to_owned(), ((0, name.to_owned()), remote(name, name)))])
    }

    fn inputs(statics: Vec<ResolvedRemote>, share: Option<&[&str]>) -> Inputs {
        Inputs {
            statics: Statics {
                config: config(),
                remotes: statics.into_iter().collect(),
                reading: 0,
            },
            discovered: Found::new(),
            share: share.map(|s| Arc::new(s.iter().map(|n| (*n).to_owned()).collect())),
            home: None,
        }
    }

    #[test]
    fn sharding_keeps_the_plan_and_the_probes_to_the_share_and_the_keys_to_all() {
        let all = vec![remote("a", "a"), remote("b", "b"), remote("c", "c")];
        let value = Desired::from(&inputs(all, Some(&["b"])));
        assert_eq!(value.running(), BTreeSet::from(["b".to_owned()]));
        assert_eq!(value.probes().len(), 1);
        assert_eq!(value.keys().len(), 3, "the sharding hears of every remote");
    }

    #[test]
    fn the_same_inputs_give_the_same_value_and_no_change() {
        let mut given = inputs(vec![remote("a", "a")], None);
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        let (again, change) = first.next(&given);
        assert!(change.is_none());
        assert_eq!(again.revision, first.revision);
    }

    #[test]
    fn a_token_rotation_rebuilds_the_probe_and_leaves_the_cycle_running() {
        let a = remote("a", "a");
        let mut given = inputs(vec![a.clone()], None);
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        // Read anew, its generation kept: a token file alone rotated.
        let mut rotated = remote("a", "a");
        rotated.generation = a.generation;
        given.statics.remotes = [rotated].into_iter().collect();
        let (next, change) = first.next(&given);
        assert_eq!(change.rebuilt, 1);
        assert_eq!(change.ends_cycle, None);
        assert_eq!((next.revision, next.manager), (2, first.manager));
    }

    #[test]
    fn a_remote_read_anew_or_added_changes_the_remotes_alone_and_the_cycle_runs_on() {
        let mut given = inputs(vec![remote("a", "a")], None);
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        given.statics.remotes = [remote("a", "a")].into_iter().collect();
        let (second, change) = first.next(&given);
        assert_eq!(
            (change.rebuilt, change.ends_cycle, change.remotes),
            (1, None, Some(Cause::ConfigChanged))
        );
        given.discovered = discovered("d");
        let (third, change) = second.next(&given);
        assert_eq!(
            (change.added, change.ends_cycle, change.remotes),
            (1, None, Some(Cause::ConfigChanged))
        );
        assert_eq!(third.manager, first.manager);
        assert_eq!(third.remotes, first.remotes + 2);
    }

    #[test]
    fn each_value_names_the_probes_it_changed_from_the_one_before() {
        let changed = |d: &Desired| -> Vec<(String, bool)> {
            d.probes_changed
                .iter()
                .map(|(name, remote)| (name.clone(), remote.is_some()))
                .collect()
        };
        let mut given = inputs(vec![remote("a", "a"), remote("b", "b")], None);
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        given.discovered = discovered("d");
        let (second, _) = first.next(&given);
        assert_eq!(changed(&second), [("d".to_owned(), true)]);
        // b read anew (a new config), d gone; a is left out.
        given.statics.remotes = [
            given.statics.remotes.get("a").cloned().expect("a"),
            remote("b", "b"),
        ]
        .into_iter()
        .collect();
        given.discovered = Found::new();
        let (third, change) = second.next(&given);
        assert_eq!(
            changed(&third),
            [("b".to_owned(), true), ("d".to_owned(), false)]
        );
        assert_eq!((change.added, change.removed, change.rebuilt), (0, 1, 1));
        // Nothing changed: the same value, whose changes are its own.
        let (again, change) = third.next(&given);
        assert!(change.is_none());
        assert_eq!(again.revision, third.revision);
    }

    #[test]
    fn a_remote_that_becomes_optional_or_required_ends_the_cycle() {
        let mut given = inputs(vec![remote("a", "a")], None);
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        let mut optional = given.statics.remotes.get("a").cloned().expect("a");
        optional.required = false;
        given.statics.remotes = [optional].into_iter().collect();
        let (second, change) = first.next(&given);
        assert_eq!(
            (change.ends_cycle, change.remotes),
            (Some(Cause::ConfigChanged), None)
        );
        assert_eq!(second.manager, first.manager + 1);
    }

    #[test]
    fn a_reload_ends_the_cycle_only_when_the_managers_own_settings_change() {
        let mut given = inputs(vec![remote("a", "a")], None);
        let first = Desired::from(&given);
        // The same text, read again: a new config, the same manager.
        given.statics.config = config();
        let (second, change) = first.next(&given);
        assert_eq!((change.ends_cycle, change.remotes), (None, None));
        given.statics.config = Arc::new(
            Config::parse(
                "remotes: [{name: a, server: \"https://a:6443\"}]\nwatch: []",
                "t.yaml",
                Path::new("."),
            )
            .expect("valid"),
        );
        let (_, change) = second.next(&given);
        assert_eq!(change.ends_cycle, Some(Cause::ConfigChanged));
    }

    #[test]
    fn a_new_share_changes_the_remotes_with_what_was_taken_and_given_up() {
        let all = vec![remote("a", "a"), remote("b", "b"), remote("c", "c")];
        let mut given = inputs(all, Some(&["a", "b"]));
        let first = Desired::from(&given);
        given.statics.config = Arc::clone(&first.config);
        given.share = Some(Arc::new(BTreeSet::from(["b".to_owned(), "c".to_owned()])));
        let (second, change) = first.next(&given);
        assert_eq!(change.ends_cycle, None);
        assert_eq!(
            change.remotes,
            Some(Cause::ShardChanged {
                taken: 1,
                given_up: 1
            })
        );
        // A discovered remote outside the share changes nothing it runs.
        given.discovered = discovered("z");
        let (third, change) = second.next(&given);
        assert_eq!((change.ends_cycle, change.remotes), (None, None));
        assert_eq!(third.remotes, second.remotes);
        assert_eq!(third.keys().len(), 4);
    }

    /// What a value says, its counters aside: the plan's remotes in order
    /// (name, required, generation, settings), every remote in order, the
    /// sharding's keys, and the probes.
    type Content = (
        Vec<(String, bool, u64, usize)>,
        Vec<String>,
        BTreeMap<String, String>,
        Vec<String>,
    );

    fn content(d: &Desired) -> Content {
        let plan = d.plan.remotes.iter().map(|r| {
            let settings = Arc::as_ptr(&r.config) as usize;
            (r.name.clone(), r.required, r.generation, settings)
        });
        (
            plan.collect(),
            d.all.iter().map(|r| r.name.clone()).collect(),
            d.keys(),
            d.probes().into_iter().map(|p| p.name).collect(),
        )
    }

    /// What a change says, comparably.
    fn said(
        c: &Change,
    ) -> (
        usize,
        usize,
        usize,
        Option<Cause>,
        Option<Cause>,
        bool,
        Vec<String>,
    ) {
        let mut probes: Vec<String> = c.probes.iter().map(|(n, _)| n.clone()).collect();
        probes.sort();
        let counts = (c.added, c.removed, c.rebuilt);
        (
            counts.0,
            counts.1,
            counts.2,
            c.ends_cycle.clone(),
            c.remotes.clone(),
            c.all,
            probes,
        )
    }

    /// What changed from `a` to `b`, worked out from every remote of both,
    /// as values were compared before they carried their changes.
    fn change_whole(
        a: &Desired,
        b: &Desired,
    ) -> (usize, usize, usize, Option<Cause>, Option<Cause>) {
        let probes = |d: &Desired| -> BTreeMap<String, usize> {
            d.probes()
                .iter()
                .map(|p| (p.name.clone(), Arc::as_ptr(&p.config) as usize))
                .collect()
        };
        let (before, now) = (probes(a), probes(b));
        let added = now.keys().filter(|n| !before.contains_key(*n)).count();
        let removed = before.keys().filter(|n| !now.contains_key(*n)).count();
        let rebuilt = now
            .iter()
            .filter(|(n, p)| before.get(*n).is_some_and(|b| b != *p))
            .count();
        let runs = |d: &Desired| -> BTreeMap<String, (bool, u64)> {
            d.plan
                .remotes
                .iter()
                .map(|r| (r.name.clone(), (r.required, r.generation)))
                .collect()
        };
        let (had, has) = (runs(a), runs(b));
        let flipped = has
            .iter()
            .any(|(n, (req, _))| had.get(n).is_some_and(|h| h.0 != *req));
        let own = |d: &Desired| (d.config.watch.clone(), d.config.exec.clone());
        let ends = (flipped || own(a) != own(b)).then_some(Cause::ConfigChanged);
        let remotes = if ends.is_some() || had == has {
            None
        } else if a.share != b.share {
            Some(Cause::ShardChanged {
                taken: has.keys().filter(|n| !had.contains_key(*n)).count(),
                given_up: had.keys().filter(|n| !has.contains_key(*n)).count(),
            })
        } else {
            Some(Cause::ConfigChanged)
        };
        (added, removed, rebuilt, ends, remotes)
    }

    /// One change of the planner's inputs.
    #[derive(Debug, Clone)]
    enum Input {
        /// A static remote (of four) read as one of three readings, or
        /// gone.
        Static(usize, Option<usize>),
        /// A discovered remote (of four) read as one of three readings,
        /// from one of three Secrets, or gone.
        Found(usize, Option<(usize, usize)>),
        /// The share: every remote, or those of a mask over the eight.
        Share(Option<u8>),
        /// A reload under one of two configs.
        Config(bool),
    }

    fn input() -> impl proptest::strategy::Strategy<Value = Input> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0usize..4, proptest::option::of(0usize..3)).prop_map(|(n, r)| Input::Static(n, r)),
            4 => (0usize..4, proptest::option::of((0usize..3, 0usize..3)))
                .prop_map(|(n, r)| Input::Found(n, r)),
            1 => proptest::option::of(any::<u8>()).prop_map(Input::Share),
            1 => any::<bool>().prop_map(Input::Config),
        ]
    }

    proptest::proptest! {
        /// The value made from the remotes the inputs changed alone is the
        /// value made from every input, and it says what changed as a
        /// value made from every remote does.
        #[test]
        fn a_value_made_from_what_changed_is_the_value_made_from_everything(
            batches in proptest::collection::vec(proptest::collection::vec(input(), 1..4), 1..25)
        ) {
            // Each name's three readings: the same reading is the same
            // value (its settings, generation); the third is optional.
            let readings = |prefix: &str| -> Vec<Vec<ResolvedRemote>> {
                (0..4)
                    .map(|n| {
                        (0..3)
                            .map(|k| {
                                let name = format!("{prefix}{n}");
                                let mut r = remote(&name, &format!("{name}-{}", k % 2));
                                r.required = k != 2;
                                r
                            })
                            .collect()
                    })
                    .collect()
            };
            let (statics, found) = (readings("s"), readings("d"));
            let configs = [config(), Arc::new(
                Config::parse(
                    "remotes: [{name: a, server: \"https://a:6443\"}]\nwatch: []",
                    "t.yaml",
                    Path::new("."),
                )
                .expect("valid"),
            )];
            let mut given = inputs(Vec::new(), None);
            given.statics.config = Arc::clone(&configs[0]);
            let mut now = Desired::from(&given);
            let mut held: [Option<usize>; 4] = [None; 4];
            for batch in batches {
                let mut touched = BTreeSet::new();
                for step in batch {
                    match step {
                        Input::Static(n, reading) => {
                            held[n] = reading;
                            let before: Vec<String> =
                                given.statics.remotes.iter().map(|r| r.name.clone()).collect();
                            given.statics.remotes = held
                                .iter()
                                .enumerate()
                                .filter_map(|(i, k)| k.map(|k| statics[i][k].clone()))
                                .collect();
                            touched.extend(before);
                            touched.extend(given.statics.remotes.iter().map(|r| r.name.clone()));
                        }
                        Input::Found(n, reading) => {
                            let name = format!("d{n}");
                            match reading {
                                Some((k, secret)) => {
                                    // One Secret gives one name.
                                    let place = (0, format!("x{secret}-{name}"));
                                    given.discovered.insert(name.clone(), (place, found[n][k].clone()));
                                }
                                None => {
                                    given.discovered.remove(&name);
                                }
                            }
                            touched.insert(name);
                        }
                        Input::Share(mask) => {
                            let share = mask.map(|m| {
                                let names = (0..4).map(|i| format!("s{i}")).chain((0..4).map(|i| format!("d{i}")));
                                Arc::new(names.enumerate().filter(|(i, _)| m & (1 << i) != 0).map(|(_, n)| n).collect::<BTreeSet<String>>())
                            });
                            touched.extend((0..4).map(|i| format!("s{i}")).chain((0..4).map(|i| format!("d{i}"))));
                            given.share = share;
                        }
                        Input::Config(second) => {
                            given.statics.config = Arc::clone(&configs[usize::from(second)]);
                        }
                    }
                }
                let (told, change) = now.next_of(&given, &touched);
                let (whole, whole_change) = now.next(&given);
                proptest::prop_assert_eq!(content(&told), content(&Desired::from(&given)));
                proptest::prop_assert_eq!(said(&change), said(&whole_change));
                proptest::prop_assert_eq!(
                    (change.added, change.removed, change.rebuilt, change.ends_cycle, change.remotes),
                    change_whole(&now, &told)
                );
                proptest::prop_assert_eq!(
                    (told.revision, told.manager, told.remotes),
                    (whole.revision, whole.manager, whole.remotes)
                );
                now = told;
            }
        }
    }

    /// The planner publishes each change of its inputs; the remote
    /// changes follow the remotes it runs and the cycle ends only the
    /// manager's own part: a burst of values the streams skip still
    /// counts, once.
    #[tokio::test(start_paused = true)]
    async fn the_planner_publishes_and_each_stream_follows_its_own_part() {
        let given = inputs(vec![remote("a", "a")], None);
        let (statics_tx, statics) = watch::channel(given.statics.clone());
        let (planner, desired) = Planner::new(statics, None, None);
        let mut ends = Box::pin(cycle_ends(desired.clone()));
        let mut changes = Box::pin(remote_changes(desired.clone()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(planner.run(stop.clone()));
        let send = |remotes: Vec<ResolvedRemote>, reading| {
            statics_tx.send_replace(Statics {
                config: Arc::clone(&given.statics.config),
                remotes: remotes.into_iter().collect(),
                reading,
            });
        };

        // A token rotation: a new value, nothing for the manager.
        let a = given.statics.remotes.get("a").cloned().expect("a");
        let mut rotated = remote("a", "a");
        rotated.generation = a.generation;
        let mut published = desired.clone();
        send(vec![rotated], 1);
        published.changed().await.expect("published");
        assert_eq!(published.borrow_and_update().revision, 2);
        assert!(
            ends.next().now_or_never().is_none(),
            "a token rotation ended the cycle"
        );
        assert!(
            changes.next().now_or_never().is_none(),
            "a token rotation rebuilt the remote"
        );

        // Two reads at once: the stream may see only the last, and still
        // changes the remotes, once.
        for _ in 0..2 {
            send(vec![remote("a", "a")], 2);
            tokio::task::yield_now().await;
        }
        let within = std::time::Duration::from_secs(1);
        let cause = tokio::time::timeout(within, changes.next())
            .await
            .expect("a change");
        assert_eq!(cause, Some(Cause::ConfigChanged));
        assert!(
            ends.next().now_or_never().is_none(),
            "a remote read anew ended the cycle"
        );

        // Optional now: what its loss costs changed, and the cycle ends.
        let mut optional = remote("a", "a");
        optional.required = false;
        send(vec![optional], 3);
        let cause = tokio::time::timeout(within, ends.next())
            .await
            .expect("a cycle end");
        assert_eq!(cause, Some(Cause::ConfigChanged));
        stop.cancel();
        task.await.expect("the planner stops");
    }
}
