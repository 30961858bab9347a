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

use crate::config::remote::{self, ResolvedRemote};
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
    pub remotes: Arc<Vec<ResolvedRemote>>,
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
    pub share: Option<BTreeSet<String>>,
    /// The home cluster, probed while discovery reads it.
    pub home: Option<tether_probes::Remote>,
}

/// What should run, and since when.
#[derive(Debug, Clone)]
pub struct Desired {
    /// Counts the values published; the first is 1.
    pub revision: u64,
    /// What the probes probe: the plan's remotes, and the home cluster.
    pub probes: Vec<tether_probes::Remote>,
    /// What the probes probe that differs from the value before this one
    /// (`revision - 1`), by name: a remote now, or `None`, gone. A
    /// follower that applied that value applies this alone.
    pub probes_changed: Arc<Vec<(String, Option<tether_probes::Remote>)>>,
    /// What the manager runs.
    pub plan: Arc<Plan>,
    /// Every remote, this replica's or not, by name, with its sharding key.
    pub keys: BTreeMap<String, String>,
    /// With sharding, the remotes this replica holds.
    pub share: Option<BTreeSet<String>>,
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
}

impl Change {
    /// Whether nothing changed at all.
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.probes.is_empty() && self.ends_cycle.is_none() && self.remotes.is_none()
    }
}

/// A remote as the manager's part compares it: by name, whether it is
/// required, and its generation.
fn run_key(r: &ResolvedRemote) -> (&str, (bool, u64)) {
    (r.name.as_str(), (r.required, r.generation))
}

impl Desired {
    /// What `inputs` say should run: the first value.
    #[must_use]
    pub fn from(inputs: &Inputs) -> Self {
        let all: Vec<ResolvedRemote> = inputs
            .statics
            .remotes
            .iter()
            .chain(inputs.discovered.values())
            .cloned()
            .collect();
        let keys = remote::keys(&all);
        let running: Vec<ResolvedRemote> = match &inputs.share {
            None => all,
            Some(share) => all
                .into_iter()
                .filter(|r| share.contains(&r.name))
                .collect(),
        };
        let mut probes = remote::probed(&running);
        probes.extend(inputs.home.clone());
        Self {
            revision: 1,
            probes,
            probes_changed: Arc::default(),
            plan: Arc::new(Plan::new(&inputs.statics.config, running)),
            keys,
            share: inputs.share.clone(),
            manager: 1,
            cause: None,
            remotes: 1,
            remotes_cause: None,
            reading: inputs.statics.reading,
            config: Arc::clone(&inputs.statics.config),
        }
    }

    /// The value after `self` that `inputs` give, and what changed; `self`
    /// again, with nothing changed, if nothing did.
    #[must_use]
    pub fn next(&self, inputs: &Inputs) -> (Self, Change) {
        let mut next = Self::from(inputs);
        let mut change = self.change_to(&next);
        if change.is_none()
            && self.keys == next.keys
            && self.share == next.share
            && self.reading == next.reading
        {
            return (self.clone(), change);
        }
        next.revision = self.revision + 1;
        next.probes_changed = Arc::new(std::mem::take(&mut change.probes));
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

    /// What differs from `self` to `next`.
    fn change_to(&self, next: &Self) -> Change {
        let before: BTreeMap<&str, &tether_probes::Remote> =
            self.probes.iter().map(|p| (p.name.as_str(), p)).collect();
        let now: BTreeMap<&str, &tether_probes::Remote> =
            next.probes.iter().map(|p| (p.name.as_str(), p)).collect();
        let mut probes: Vec<(String, Option<tether_probes::Remote>)> = Vec::new();
        let (mut added, mut rebuilt) = (0, 0);
        for (name, probe) in &now {
            match before.get(name) {
                None => added += 1,
                Some(b) if !Arc::ptr_eq(&b.config, &probe.config) => rebuilt += 1,
                Some(_) => continue,
            }
            probes.push(((*name).to_owned(), Some((*probe).clone())));
        }
        let gone = before.keys().filter(|n| !now.contains_key(*n));
        probes.extend(gone.map(|n| ((*n).to_owned(), None)));
        let removed = probes.len() - added - rebuilt;
        let runs: BTreeMap<&str, (bool, u64)> = self.plan.remotes.iter().map(run_key).collect();
        let will: BTreeMap<&str, (bool, u64)> = next.plan.remotes.iter().map(run_key).collect();
        // Whether a remote is required decides what its loss costs, which
        // no running cycle can change.
        let required_flipped = will
            .iter()
            .any(|(name, (required, _))| runs.get(name).is_some_and(|r| r.0 != *required));
        let own = |d: &Self| (d.config.watch.clone(), d.config.exec.clone());
        let ends_cycle =
            (required_flipped || own(self) != own(next)).then_some(Cause::ConfigChanged);
        let remotes = if ends_cycle.is_some() || runs == will {
            None
        } else if self.share != next.share {
            let had: BTreeSet<&str> = runs.keys().copied().collect();
            let has: BTreeSet<&str> = will.keys().copied().collect();
            Some(Cause::ShardChanged {
                taken: has.difference(&had).count(),
                given_up: had.difference(&has).count(),
            })
        } else {
            Some(Cause::ConfigChanged)
        };
        Change {
            added,
            removed,
            rebuilt,
            ends_cycle,
            remotes,
            probes,
        }
    }

    /// The names of the remotes the plan runs.
    #[must_use]
    pub fn running(&self) -> BTreeSet<String> {
        remote::names(&self.plan.remotes)
    }
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
            share: shard.as_ref().map(|s| s.holding().borrow().clone()),
            home: discovery.as_deref().map(Discovery::home),
            statics: first,
        };
        let value = Desired::from(&inputs);
        if let Some(shard) = &shard {
            shard.set_remotes(value.keys.clone());
        }
        let (desired, subscribed) = watch::channel(Arc::new(value));
        (
            Self {
                inputs,
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
                    self.inputs.statics = self.statics.borrow_and_update().clone();
                    let statics = Arc::clone(&self.inputs.statics.remotes);
                    self.take_found(Some(&statics));
                }
                Ok(()) = found.changed() => {
                    found.borrow_and_update();
                    self.take_found(None);
                }
                Ok(()) = holding.changed() => {
                    self.inputs.share = Some(holding.borrow_and_update().clone());
                }
            }
            self.publish();
        }
    }

    /// Takes in what discovery learned, beside the static remotes (whose
    /// names win) when they are new.
    fn take_found(&mut self, statics: Option<&[ResolvedRemote]>) {
        if let Some(discovery) = &self.discovery {
            discovery.update(statics, &mut self.inputs.discovered);
        }
    }

    /// Makes the value of the inputs now, and publishes it if it differs.
    fn publish(&self) {
        let before = Arc::clone(&self.desired.borrow());
        let (next, change) = before.next(&self.inputs);
        if next.revision == before.revision {
            return;
        }
        if let Some(shard) = &self.shard
            && next.keys != before.keys
        {
            shard.set_remotes(next.keys.clone());
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
                probed = next.probes.len(),
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
        _ => probes.sync(&desired.probes),
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
    use crate::config::RemoteSource;

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
        let config = kube::Config::new(format!("https://{host}:6443").parse().expect("a URL"));
        ResolvedRemote::new(name, true, RemoteSource::Inferred, Arc::new(config))
            .expect("a server to probe")
    }

    fn inputs(statics: Vec<ResolvedRemote>, share: Option<&[&str]>) -> Inputs {
        Inputs {
            statics: Statics {
                config: config(),
                remotes: Arc::new(statics),
                reading: 0,
            },
            discovered: Found::new(),
            share: share.map(|s| s.iter().map(|n| (*n).to_owned()).collect()),
            home: None,
        }
    }

    #[test]
    fn sharding_keeps_the_plan_and_the_probes_to_the_share_and_the_keys_to_all() {
        let all = vec![remote("a", "a"), remote("b", "b"), remote("c", "c")];
        let value = Desired::from(&inputs(all, Some(&["b"])));
        assert_eq!(value.running(), BTreeSet::from(["b".to_owned()]));
        assert_eq!(value.probes.len(), 1);
        assert_eq!(value.keys.len(), 3, "the sharding hears of every remote");
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
        given.statics.remotes = Arc::new(vec![rotated]);
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
        given.statics.remotes = Arc::new(vec![remote("a", "a")]);
        let (second, change) = first.next(&given);
        assert_eq!(
            (change.rebuilt, change.ends_cycle, change.remotes),
            (1, None, Some(Cause::ConfigChanged))
        );
        given.discovered = Found::from([((0, "d".to_owned()), remote("d", "d"))]);
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
        given.discovered = Found::from([((0, "d".to_owned()), remote("d", "d"))]);
        let (second, _) = first.next(&given);
        assert_eq!(changed(&second), [("d".to_owned(), true)]);
        // b read anew (a new config), d gone; a is left out.
        given.statics.remotes = Arc::new(vec![given.statics.remotes[0].clone(), remote("b", "b")]);
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
        let mut optional = given.statics.remotes[0].clone();
        optional.required = false;
        given.statics.remotes = Arc::new(vec![optional]);
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
        given.share = Some(BTreeSet::from(["b".to_owned(), "c".to_owned()]));
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
        given.discovered = Found::from([((0, "z".to_owned()), remote("z", "z"))]);
        let (third, change) = second.next(&given);
        assert_eq!((change.ends_cycle, change.remotes), (None, None));
        assert_eq!(third.remotes, second.remotes);
        assert_eq!(third.keys.len(), 4);
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
                remotes: Arc::new(remotes),
                reading,
            });
        };

        // A token rotation: a new value, nothing for the manager.
        let a = given.statics.remotes[0].clone();
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
