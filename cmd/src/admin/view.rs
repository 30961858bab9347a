//! The one status view model: built from the daemon's [`Snapshot`], the
//! probes' rows and the manager's caches, once per request, and rendered as
//! `/status.json` (serde) and `/status` (`page.rs`).
//!
//! What needs judgement is decided here, once: the verdict in words, and
//! how much attention each remote needs. The renderers only lay it out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tether_probes::{FailureCause, Reachability};
use tether_supervisor::{CauseKind, Phase, Status};

use super::{Readiness, Snapshot, Sources};
use crate::human;

/// The process as `/status.json` and `/status` show it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    /// tether's version.
    pub version: &'static str,
    /// When the view was built, RFC 3339 in UTC.
    pub rendered_at: String,
    /// The state in one line.
    pub verdict: Verdict,
    /// Whether the drain latch is set.
    pub draining: bool,
    /// The supervisor.
    pub supervisor: SupervisorView,
    /// How many remotes are in each state.
    pub counts: Counts,
    /// Every configured remote, by name.
    pub remotes: Vec<RemoteView>,
    /// The exec manager's process, when the manager is one.
    pub process: Option<ProcessView>,
    /// The leader election, when on.
    pub election: Option<ElectionView>,
    /// The sharding of remotes among replicas, when on.
    pub shard: Option<ShardView>,
    /// Discovery from the home cluster's Secrets, when on.
    pub discovery: Option<DiscoveryView>,
}

/// Discovery as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryView {
    /// The name the home cluster's probe goes by among the remotes.
    pub home: &'static str,
    /// Each source, in config order.
    pub sources: Vec<SourceView>,
}

/// One discovery source.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceView {
    /// `<namespace>/<format>`.
    pub source: String,
    /// The label selector its Secrets are listed with.
    pub selector: String,
    /// Whether its remotes are required.
    pub required: bool,
    /// Whether it has listed its Secrets once.
    pub listed: bool,
    /// Seconds since its last whole list.
    pub listed_seconds_ago: Option<f64>,
    /// The remotes it gives.
    pub remotes: usize,
    /// Its Secrets that are skipped.
    pub skipped: Vec<SkippedView>,
    /// Why its list or watch fails, while it does.
    pub failing: Option<String>,
    /// Seconds it has been failing.
    pub failing_seconds: Option<f64>,
}

/// A Secret that is skipped, and why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedView {
    /// The Secret's name.
    pub secret: String,
    /// The field that is wrong.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// This replica among the shards, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardView {
    /// This replica's identity.
    pub identity: String,
    /// `namespace/prefix` of the members' Leases.
    pub group: String,
    /// The live members, as this replica sees them.
    pub members: Vec<String>,
    /// The remotes this replica holds, by name.
    pub owned: Vec<String>,
    /// The remotes it owns but waits for another member to give up.
    pub waiting: Vec<String>,
    /// Every configured remote.
    pub configured: usize,
    /// While it joins, the seconds until it takes its share.
    pub joining_seconds: Option<f64>,
    /// Whether its own Lease names its identity, written by another
    /// process: two processes share one identity.
    pub twin: bool,
    /// Why the last round failed, if it did.
    pub last_error: Option<String>,
}

/// The state in one line, as a person says it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Which verdict.
    pub state: VerdictState,
    /// The whole line: `Not ready: cycle 2 waits for cluster-b's caches;
    /// cluster-b unreachable for 12s (timeout, 6 failed probes)`.
    pub text: String,
}

/// The verdicts there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictState {
    /// `/readyz` answers 200: the manager is up.
    Ready,
    /// `/readyz` answers 503, and the line says why.
    NotReady,
    /// Shutting down: `/readyz` answers 503 for good.
    Draining,
    /// Another replica leads; this one is ready to take over.
    Standby,
}

impl VerdictState {
    /// The verdict's first words.
    #[must_use]
    pub const fn headline(self) -> &'static str {
        match self {
            Self::Ready => "Ready",
            Self::NotReady => "Not ready",
            Self::Draining => "Draining",
            Self::Standby => "Standby",
        }
    }

    /// The `snake_case` name, as JSON and CSS classes use it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::NotReady => "not_ready",
            Self::Draining => "draining",
            Self::Standby => "standby",
        }
    }
}

/// How many remotes are in each state.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Every configured remote.
    pub total: usize,
    /// Reachable now.
    pub reachable: usize,
    /// Unreachable now.
    pub unreachable: usize,
    /// Not probed yet, or not probeable from here.
    pub unknown: usize,
    /// Needing nothing: see [`Attention::Healthy`].
    pub healthy: usize,
}

/// How much a remote needs a person's eye, most first: the status page
/// sorts by it, and folds the healthy ones away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attention {
    /// Unreachable now.
    Unreachable,
    /// Probes cannot be made from here (credentials, an exec plugin).
    CannotProbe,
    /// A cache's watch has failed past the detection bound.
    Stale,
    /// Not probed yet.
    Unknown,
    /// Answering, but `/readyz` is not 2xx.
    NotReady,
    /// Reachable, and, while a cycle runs, a cache has not synced yet (or
    /// its part of the cycle is stopped).
    Syncing,
    /// Reachable, but a probe failed in the last 15 minutes.
    Flapped,
    /// Reachable, ready, every cache synced, no failure in 15 minutes.
    Healthy,
}

impl Attention {
    /// The state in a few words, for the page's badge.
    #[must_use]
    pub const fn words(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::CannotProbe => "cannot probe",
            Self::Stale => "cache stale",
            Self::Unknown => "not probed yet",
            Self::NotReady => "not ready",
            Self::Syncing => "syncing",
            Self::Flapped => "recovered",
            Self::Healthy => "healthy",
        }
    }

    /// The `snake_case` name, as JSON and CSS classes use it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::CannotProbe => "cannot_probe",
            Self::Stale => "stale",
            Self::Unknown => "unknown",
            Self::NotReady => "not_ready",
            Self::Syncing => "syncing",
            Self::Flapped => "flapped",
            Self::Healthy => "healthy",
        }
    }
}

/// The leader election, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ElectionView {
    /// Whether this replica leads.
    pub role: Role,
    /// This replica's identity.
    pub identity: String,
    /// The holder last seen on the Lease; empty when free.
    pub holder: String,
    /// `namespace/name`.
    pub lease: String,
    /// Whether the Lease names this replica's identity, written by another
    /// process: two processes share one identity.
    pub twin: bool,
    /// While it holds a Lease it created but does not lead yet: the seconds
    /// until it does.
    pub leads_in_seconds: Option<f64>,
    /// Why the last try failed, if it did.
    pub last_error: Option<String>,
}

/// A replica's part in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It holds the Lease and runs the manager.
    Leader,
    /// Another replica leads, or none does yet.
    Standby,
}

impl Role {
    /// `leader` or `standby`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Standby => "standby",
        }
    }
}

/// The exec manager's process, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessView {
    /// The command it runs.
    pub command: Vec<String>,
    /// The running process, if one runs.
    pub pid: Option<u32>,
    /// The cycle it runs in.
    pub cycle: u64,
    /// How long it has run.
    pub running_seconds: Option<f64>,
    /// Whether it has a readiness check to pass before it is up.
    pub readiness_check: Option<String>,
    /// How the last run ended: `exit code 1`, `killed by SIGKILL`.
    pub last_exit: Option<String>,
    /// Whether tether stopped the last run, rather than it ending by itself.
    pub last_exit_stopped: Option<bool>,
    /// The cycle of the last run.
    pub last_exit_cycle: Option<u64>,
    /// How long ago the last run ended.
    pub last_exit_seconds_ago: Option<f64>,
    /// Why the last spawn failed, until one succeeds.
    pub spawn_error: Option<String>,
}

/// The supervisor, as the status page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SupervisorView {
    /// The current (or last) cycle.
    pub cycle: u64,
    /// Where the loop is, in words: `running`, `backing off`.
    #[serde(serialize_with = "phase_words")]
    pub phase: Phase,
    /// How old the current cycle is.
    pub cycle_age_seconds: Option<f64>,
    /// Whether the manager is up: what `/readyz` answers, but for draining.
    pub manager_up: bool,
    /// How long the manager has been up, while it is.
    pub up_for_seconds: Option<f64>,
    /// Why the last cycle ended, with its detail.
    pub last_cause: Option<String>,
    /// The wait before the next build, while backing off.
    pub backoff_seconds: Option<f64>,
    /// The lost remotes the running cycle waits for before it starts its
    /// manager (the exec manager does), sorted; empty once it started.
    pub held_for: Vec<String>,
    /// Ended cycles by cause.
    pub ended: BTreeMap<&'static str, u64>,
    /// The running cycle, then the last ended ones, newest first.
    pub cycles: Vec<CycleView>,
    /// The last remotes added to, removed from or rebuilt in a running
    /// cycle without ending it, oldest first.
    pub remote_changes: Vec<RemoteChangeView>,
    /// Those changes since the start, by kind.
    pub remote_changed: BTreeMap<&'static str, u64>,
}

/// One remote's part of a running cycle, changed without ending it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteChangeView {
    /// The remote.
    pub remote: String,
    /// `added`, `removed` or `rebuilt`.
    pub change: &'static str,
    /// `config_changed` or `shard_changed`.
    pub cause: &'static str,
    /// The cycle it happened in.
    pub cycle: u64,
    /// How long ago.
    pub seconds_ago: f64,
}

/// One cycle in the timeline.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CycleView {
    /// Its number.
    pub number: u64,
    /// How long ago it started.
    pub started_seconds_ago: f64,
    /// How long ago it ended; `None` while it runs.
    pub ended_seconds_ago: Option<f64>,
    /// The `cause` label of its end.
    #[serde(serialize_with = "cause_label")]
    pub cause: Option<CauseKind>,
    /// Its end in words: `cluster-b unreachable`.
    pub ended_by: Option<String>,
    /// The wait after it, before the next cycle.
    pub backoff_seconds: Option<f64>,
}

/// One remote, as the status page shows it.
// A view for JSON readers: each flag is a fact read on its own, not states
// of one machine.
#[allow(clippy::struct_excessive_bools)]
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteView {
    /// The configured name.
    pub name: String,
    /// `host:port`.
    pub host: String,
    /// Whether it gates readiness, and its loss ends the cycle.
    pub required: bool,
    /// How much it needs a person's eye.
    pub attention: Attention,
    /// Whether its part of the current cycle is stopped until it is back.
    pub stopped_in_cycle: bool,
    /// `unknown`, `reachable` or `unreachable`.
    pub state: &'static str,
    /// The current failure streak.
    pub consecutive_failures: u32,
    /// The status of the last answer.
    pub last_status: Option<u16>,
    /// Whether the last answer was 2xx.
    pub ready: bool,
    /// The class of the last failure.
    pub last_cause: Option<&'static str>,
    /// The root cause of the last failure.
    pub last_error: Option<String>,
    /// Seconds since the last failure.
    pub last_failure_seconds_ago: Option<f64>,
    /// Why probes cannot be made from here, while they cannot.
    pub local_error: Option<String>,
    /// Seconds since the state last changed.
    pub last_transition_seconds_ago: Option<f64>,
    /// Seconds since the last probe finished.
    pub last_probe_seconds_ago: Option<f64>,
    /// The last probe's latency.
    pub latency_seconds: Option<f64>,
    /// Whether a probe failed in the last 15 minutes.
    pub failed_recently: bool,
    /// The manager's caches of this remote.
    pub caches: Vec<CacheView>,
}

/// One cache of the manager, as the status page shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheView {
    /// `configmaps`, `deployments.apps`, ...
    pub resource: String,
    /// Whether it has listed in this run of its remote.
    pub synced: bool,
    /// Whether its watch has failed for longer than the detection bound.
    pub stale: bool,
    /// Seconds since its watch began failing, while it is.
    pub failing_seconds_ago: Option<f64>,
    /// Objects in it.
    pub objects: usize,
}

/// Seconds since `time`, if there is one and it is past.
#[must_use]
pub fn ago(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs_f64())
}

fn seconds_ago(time: tokio::time::Instant) -> f64 {
    time.elapsed().as_secs_f64()
}

impl Attention {
    /// How much `remote` needs a person's eye, with its `caches`. Between
    /// cycles and at shutdown no cache syncs: a cache not synced then is no
    /// news.
    fn of(
        remote: &tether_probes::RemoteStatus,
        caches: &[CacheView],
        stopped_in_cycle: bool,
        cycle_running: bool,
    ) -> Self {
        match remote.state {
            Reachability::Unreachable => Self::Unreachable,
            _ if remote.local_error.is_some() => Self::CannotProbe,
            _ if caches.iter().any(|c| c.stale) => Self::Stale,
            Reachability::Unknown => Self::Unknown,
            Reachability::Reachable if !remote.ready => Self::NotReady,
            Reachability::Reachable
                if cycle_running && (stopped_in_cycle || caches.iter().any(|c| !c.synced)) =>
            {
                Self::Syncing
            }
            Reachability::Reachable
                if remote.consecutive_failures > 0 || remote.failed_recently =>
            {
                Self::Flapped
            }
            Reachability::Reachable => Self::Healthy,
        }
    }
}

impl RemoteView {
    /// `cluster-b unreachable for 12s (timeout, 6 failed probes)`.
    fn unreachable_since(&self) -> String {
        let since = self
            .last_transition_seconds_ago
            .map_or_else(String::new, |s| {
                format!(" for {}", human::span(Duration::from_secs_f64(s)))
            });
        let cause = self.last_cause.unwrap_or("no answer");
        format!(
            "{} unreachable{since} ({cause}, {})",
            self.name,
            human::count(
                u64::from(self.consecutive_failures),
                "failed probe",
                "failed probes"
            )
        )
    }
}

/// At most this many names in a verdict, then `and N more`.
const NAMES_IN_A_VERDICT: usize = 3;

/// `a, b and c`, or `a, b, c and 7 more`.
pub(super) fn listed(items: &[String]) -> String {
    let shown = &items[..items.len().min(NAMES_IN_A_VERDICT)];
    let more = items.len() - shown.len();
    match (shown, more) {
        ([], _) => String::new(),
        ([one], 0) => one.clone(),
        (_, 0) => format!(
            "{} and {}",
            shown[..shown.len() - 1].join(", "),
            shown[shown.len() - 1]
        ),
        _ => format!("{} and {more} more", shown.join(", ")),
    }
}

/// Builds the view from the daemon's snapshot and the probes' and the
/// manager's, in time linear in the remotes.
pub(super) fn build(sources: &Sources, parts: Snapshot) -> StatusView {
    let caches = sources.manager.caches();
    let required = sources.manager.required();
    let readiness = parts.readiness();
    let Snapshot {
        supervisor: status,
        draining,
        election,
        shard,
        discovery,
        ..
    } = parts;
    let mut counts = Counts::default();
    let remotes: Vec<RemoteView> = sources
        .probes
        .status()
        .into_iter()
        .map(|remote| {
            counts.total += 1;
            match remote.state {
                Reachability::Reachable => counts.reachable += 1,
                Reachability::Unreachable => counts.unreachable += 1,
                Reachability::Unknown => counts.unknown += 1,
            }
            let view = remote_view(remote, &caches, &required, &status);
            counts.healthy += usize::from(view.attention == Attention::Healthy);
            view
        })
        .collect();
    let process = sources.manager.process();
    let supervisor = supervisor_view(&status);
    let mut view = StatusView {
        version: env!("CARGO_PKG_VERSION"),
        rendered_at: jiff::Timestamp::now()
            .round(jiff::Unit::Second)
            .unwrap_or_else(|_| jiff::Timestamp::now())
            .to_string(),
        // Judged below, from the rest of the view.
        verdict: Verdict {
            state: VerdictState::NotReady,
            text: String::new(),
        },
        draining,
        supervisor,
        counts,
        remotes,
        process,
        election,
        shard,
        discovery,
    };
    view.verdict = verdict(&view, &status, readiness);
    view
}

// serde's `serialize_with` hands a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn phase_words<S: serde::Serializer>(phase: &Phase, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(phase.as_str())
}

// serde's `serialize_with` hands a reference.
#[allow(clippy::ref_option, clippy::trivially_copy_pass_by_ref)]
fn cause_label<S: serde::Serializer>(
    cause: &Option<CauseKind>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    cause.map(CauseKind::as_str).serialize(serializer)
}

/// One remote's row, its caches (keyed by (remote, resource): one range
/// each) and its attention included.
fn remote_view(
    remote: tether_probes::RemoteStatus,
    caches: &BTreeMap<(String, String), CacheView>,
    required: &std::collections::BTreeSet<String>,
    status: &Status,
) -> RemoteView {
    let caches = caches
        .range((remote.name.clone(), String::new())..)
        .take_while(|((name, _), _)| *name == remote.name)
        .map(|(_, cache)| cache.clone())
        .collect::<Vec<_>>();
    let stopped_in_cycle = status.stopped_remotes.binary_search(&remote.name).is_ok();
    RemoteView {
        required: required.contains(&remote.name),
        attention: Attention::of(
            &remote,
            &caches,
            stopped_in_cycle,
            status.phase == Phase::Running,
        ),
        stopped_in_cycle,
        state: remote.state.as_str(),
        consecutive_failures: remote.consecutive_failures,
        last_status: remote.last_status,
        ready: remote.ready,
        last_cause: remote.last_cause.map(FailureCause::as_str),
        last_failure_seconds_ago: ago(remote.last_failure),
        last_transition_seconds_ago: ago(remote.last_transition),
        last_probe_seconds_ago: ago(remote.last_probe),
        latency_seconds: remote.latency.map(|l| l.as_secs_f64()),
        caches,
        name: remote.name,
        host: remote.host,
        last_error: remote.last_error,
        local_error: remote.local_error,
        failed_recently: remote.failed_recently,
    }
}

fn supervisor_view(status: &Status) -> SupervisorView {
    let running = matches!(status.phase, Phase::Running | Phase::ShuttingDown)
        .then_some(status.cycle_started)
        .flatten()
        .map(|started| CycleView {
            number: status.cycle,
            started_seconds_ago: seconds_ago(started),
            ended_seconds_ago: None,
            cause: None,
            ended_by: None,
            backoff_seconds: None,
        });
    let ended = status.recent.iter().rev().map(|c| CycleView {
        number: c.number,
        started_seconds_ago: seconds_ago(c.started),
        ended_seconds_ago: Some(seconds_ago(c.ended)),
        cause: Some(c.cause.kind()),
        ended_by: Some(c.cause.in_words()),
        backoff_seconds: c.backoff.map(|b| b.as_secs_f64()),
    });
    SupervisorView {
        cycle: status.cycle,
        phase: status.phase,
        cycle_age_seconds: status.cycle_started.map(seconds_ago),
        manager_up: status.manager_up,
        up_for_seconds: status.up_since.map(seconds_ago),
        last_cause: status.last_cause().map(ToString::to_string),
        backoff_seconds: status.backoff.map(|b| b.as_secs_f64()),
        held_for: status.held_for.clone(),
        ended: status
            .ended
            .iter()
            .map(|(kind, count)| (kind.as_str(), *count))
            .collect(),
        cycles: running.into_iter().chain(ended).collect(),
        remote_changes: status
            .remote_changes
            .iter()
            .map(|c| RemoteChangeView {
                remote: c.remote.clone(),
                change: c.change.as_str(),
                cause: c.cause.as_str(),
                cycle: c.cycle,
                seconds_ago: seconds_ago(c.at),
            })
            .collect(),
        remote_changed: status
            .remote_changed
            .iter()
            .map(|(change, count)| (change.as_str(), *count))
            .collect(),
    }
}

/// The verdict: what `/readyz` answers, and why, in one line.
fn verdict(view: &StatusView, status: &Status, readiness: Readiness) -> Verdict {
    let (remotes, counts) = (&view.remotes, &view.counts);
    let unreachable = |required: bool| -> Vec<String> {
        remotes
            .iter()
            .filter(|r| r.attention == Attention::Unreachable && r.required == required)
            .map(RemoteView::unreachable_since)
            .collect()
    };
    let reachable = format!(
        "{} of {} reachable",
        human::number(counts.reachable as u64),
        human::count(counts.total as u64, "remote", "remotes")
    );
    // With sharding, the counts are of this replica's share.
    let reachable = match &view.shard {
        Some(s) => format!(
            "{reachable}, this replica's share of {} among {}",
            human::number(s.configured as u64),
            human::count(s.members.len() as u64, "member", "members")
        ),
        None => reachable,
    };
    let (state, text) = match readiness {
        Readiness::Draining { .. } => (
            VerdictState::Draining,
            format!(
                "/readyz answers 503 so traffic moves away; the manager {}",
                if status.phase == Phase::Stopped {
                    "has stopped"
                } else {
                    "is stopping"
                }
            ),
        ),
        Readiness::Follower => (
            VerdictState::Standby,
            view.election.as_ref().map_or_else(String::new, standby),
        ),
        Readiness::Unassigned => (
            VerdictState::Standby,
            view.shard.as_ref().map_or_else(String::new, shard_standby),
        ),
        Readiness::Up => {
            let up_for = status.up_since.map_or_else(String::new, |t| {
                format!(" for {}", human::span(t.elapsed()))
            });
            let mut text = format!("{reachable}; manager up{up_for}");
            let optional = unreachable(false);
            if !optional.is_empty() {
                let _ = write!(text, "; optional: {}", listed(&optional));
            }
            (VerdictState::Ready, text)
        }
        Readiness::Down => (
            VerdictState::NotReady,
            not_ready(status, remotes, view.process.as_ref(), &unreachable(true)),
        ),
    };
    // "Standby (leader: pod-x)" reads as one phrase; the rest say why.
    let joint = if state == VerdictState::Standby {
        " "
    } else {
        ": "
    };
    Verdict {
        text: format!("{}{joint}{text}", state.headline()),
        state,
    }
}

/// Why a follower stands by, after `Standby`.
fn standby(e: &ElectionView) -> String {
    let error = e
        .last_error
        .as_deref()
        .map_or_else(String::new, |err| format!(": {err}"));
    if e.twin {
        format!(
            "(leader: another process under this replica's own identity, {}); two processes share one identity: give each replica its own leaderElection.identity, or leave it unset",
            e.identity
        )
    } else if let Some(left) = e.leads_in_seconds {
        format!(
            "(this replica created the Lease and leads in {}, once any leader it could not see has stopped)",
            human::span(std::time::Duration::from_secs_f64(left))
        )
    } else if e.holder == e.identity {
        format!(
            "(the Lease still names this replica, which cannot renew it{error}); another replica takes over when the claim lapses"
        )
    } else if e.holder.is_empty() {
        "(leader: none yet); a replica takes the Lease once no claim on it is current".to_owned()
    } else {
        format!(
            "(leader: {}); this replica takes over if the leader's Lease lapses",
            e.holder
        )
    }
}

/// Why a shard member with no remote stands by, after `Standby`.
fn shard_standby(s: &ShardView) -> String {
    let of = human::count(s.configured as u64, "remote", "remotes");
    if s.twin {
        format!(
            "(holds none of {of}): another process holds this replica's shard Lease under the same identity, {}; give each replica its own leaderElection.identity, or leave it unset",
            s.identity
        )
    } else if let Some(left) = s.joining_seconds {
        format!(
            "(joining: holds none of {of}); it takes its share in {}, once it has watched the group for leaseDuration",
            human::span(std::time::Duration::from_secs_f64(left))
        )
    } else if !s.waiting.is_empty() {
        format!(
            "(holds none of {of} yet); {} wait for another member to give them up",
            human::number(s.waiting.len() as u64)
        )
    } else {
        format!("(holds none of {of}); no manager runs here until a remote is this replica's")
    }
}

/// Why the manager is not up, where the supervisor is.
fn not_ready(
    status: &Status,
    remotes: &[RemoteView],
    process: Option<&ProcessView>,
    lost: &[String],
) -> String {
    let lost = if lost.is_empty() {
        String::new()
    } else {
        format!("; {}", listed(lost))
    };
    let cycle = status.cycle;
    match status.phase {
        Phase::Starting => format!("starting{lost}"),
        Phase::BackingOff => {
            let ended = status.last_ended().map_or_else(String::new, |c| {
                format!(
                    " {} ({})",
                    human::ago(c.ended.elapsed()),
                    c.cause.in_words()
                )
            });
            let next = status
                .backoff
                .zip(status.last_ended())
                .map(|(wait, c)| {
                    (c.ended + wait).saturating_duration_since(tokio::time::Instant::now())
                })
                .map_or_else(String::new, |left| {
                    format!("; cycle {} starts in {}", cycle + 1, human::span(left))
                });
            format!("cycle {cycle} ended{ended}{next}{lost}")
        }
        Phase::Running if !status.held_for.is_empty() => format!(
            "cycle {cycle} holds the manager until {} {} reachable again{lost}",
            listed(&status.held_for),
            if status.held_for.len() == 1 {
                "is"
            } else {
                "are"
            }
        ),
        Phase::Running => format!(
            "cycle {cycle} waits for {}{lost}",
            waits_for(remotes, process)
        ),
        Phase::Standby => format!("standing by: another replica leads{lost}"),
        Phase::ShuttingDown => format!("shutting down{lost}"),
        Phase::Stopped => "stopped".to_owned(),
    }
}

/// What a running cycle's manager waits for before it is up.
fn waits_for(remotes: &[RemoteView], process: Option<&ProcessView>) -> String {
    if let Some(p) = process {
        return match (&p.spawn_error, p.pid, &p.readiness_check) {
            (Some(err), _, _) => format!("the manager process, which failed to start: {err}"),
            (None, None, _) => "the manager process to start".to_owned(),
            (None, Some(_), Some(check)) => {
                format!("the manager process's readiness check ({check} answering 2xx)")
            }
            (None, Some(_), None) => "every required remote to be reachable".to_owned(),
        };
    }
    let waiting: Vec<String> = remotes
        .iter()
        .filter(|r| {
            r.required && (r.stopped_in_cycle || r.caches.iter().any(|c| !c.synced || c.stale))
        })
        .map(|r| format!("{}'s caches", r.name))
        .collect();
    if waiting.is_empty() {
        "the manager to report up".to_owned()
    } else {
        listed(&waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("r{i}")).collect()
    }

    #[test]
    fn a_list_in_a_verdict_reads_as_english_and_stays_short() {
        assert_eq!(listed(&names(1)), "r0");
        assert_eq!(listed(&names(2)), "r0 and r1");
        assert_eq!(listed(&names(3)), "r0, r1 and r2");
        assert_eq!(listed(&names(10)), "r0, r1, r2 and 7 more");
    }
}
