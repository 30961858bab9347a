//! The process-lifetime set of probes: one task per remote identity, state
//! that outlives cycles and reloads, metrics, and published transitions.
//!
//! - here: the set, its `sync`, its handle, and each remote's state;
//! - `run.rs`: one identity's probe task, and each result applied;
//! - `pace.rs`: when ticks fall, and how fast new connections open;
//! - `text.rs`: the series as Prometheus text, a piece at a time;
//! - `check.rs`: every remote probed once, for `tether check`.
//!
//! # Invariants
//!
//! - One probe task runs per distinct [`Identity`]; its result is reported
//!   under every configured name that shares the identity.
//! - [`ProbeSet::sync`] keeps the task and the state of every identity that
//!   stays, stops the tasks of identities that go, and deletes the metric
//!   series of every name that goes.
//! - Each task probes at once, then every `interval` ± `jitter` (moved to
//!   the nearest point of a grid sized to gather about 20 probes a point,
//!   at most 100 ms, so that many remotes share a wake-up), and once
//!   early when the remote closes the connection kept for probing. Every probe
//!   has its own deadline (`timeout` ≤ `interval / 2`), so one remote never
//!   delays another, and a probe always reports before the next is due.
//! - A remote [suspected](ProbeSetHandle::suspect) by a manager that failed
//!   to reach it is probed on a new connection: at once if its last probe
//!   succeeded and no early probe ran since the last regular tick (at most
//!   one early probe, for a suspicion or a closed connection, between two
//!   regular ticks); else the next regular probe uses a new connection. So a
//!   suspicion reveals what a kept connection hides, and never hurries a
//!   failing remote toward the threshold.
//! - New connections are paced across the set (250 at once, then 2,500 a
//!   second); the wait comes before a probe's deadline starts.
//! - A task that panics is restarted after one interval; the panic is
//!   logged and counted.
//! - Every state change is logged once, counted in
//!   `tether_remote_transitions_total`, and published once per name.

mod check;
mod pace;
mod run;
mod text;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use prometheus::Registry;
use tether_supervisor::RemoteSignal;
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::classify::{FailureCause, LocalKind, Outcome, ProbeResult};
use crate::history::{History, Recent};
use crate::metrics::{Gauges, Metrics, Series};
use crate::{Error, Identity, ProbeConfig, Reachability, Remote, Result, Tracker};

pub use self::check::{CheckRow, check};
use self::pace::Pacer;
use self::run::supervise_probe;
pub use self::text::MetricChunks;

/// How many transitions a slow subscriber may fall behind.
const TRANSITION_BUFFER: usize = 1024;

/// A change of a remote's state, published once per configured name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The configured name.
    pub remote: String,
    /// `host:port`.
    pub host: String,
    /// The state left.
    pub from: Reachability,
    /// The state entered.
    pub to: Reachability,
    /// The failure streak when it happened.
    pub failures: u32,
    /// The last error's root cause, when the change is to unreachable.
    pub error: Option<String>,
}

impl Transition {
    /// What this transition tells a supervisor: a loss, a recovery, or
    /// nothing (a remote first seen reachable).
    #[must_use]
    pub fn signal(&self) -> Option<RemoteSignal> {
        match (self.from, self.to) {
            (_, Reachability::Unreachable) => Some(RemoteSignal::Lost(self.remote.clone())),
            (Reachability::Unreachable, Reachability::Reachable) => {
                Some(RemoteSignal::Recovered(self.remote.clone()))
            }
            _ => None,
        }
    }
}

/// What the status page shows of one configured remote.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RemoteStatus {
    /// The configured name.
    pub name: String,
    /// `host:port`.
    pub host: String,
    /// The sustained state.
    pub state: Reachability,
    /// The current failure streak.
    pub consecutive_failures: u32,
    /// The status of the last answer, if the last probe got one.
    pub last_status: Option<u16>,
    /// Whether the last answer was 2xx.
    pub ready: bool,
    /// The class of the last failure.
    pub last_cause: Option<FailureCause>,
    /// The root cause of the last failure.
    pub last_error: Option<String>,
    /// When the last failure happened.
    pub last_failure: Option<SystemTime>,
    /// Set while probes cannot be made here (credentials, exec plugin).
    pub local_error: Option<String>,
    /// When the state last changed.
    pub last_transition: Option<SystemTime>,
    /// When the last probe finished.
    pub last_probe: Option<SystemTime>,
    /// The last probe's latency.
    pub latency: Option<Duration>,
    /// How often this remote's probe task panicked.
    pub panics: u64,
    /// Whether a probe failed within the last
    /// [`HISTORY_WINDOW`](crate::HISTORY_WINDOW); the probes themselves are
    /// [`ProbeSetHandle::recent`].
    pub failed_recently: bool,
}

#[derive(Debug)]
struct ProbeState {
    /// The configured names sharing this probe, with their own series.
    names: Vec<Series>,
    /// The identity it probes now: its key in [`Probes::by_identity`].
    identity: Arc<Identity>,
    config: Arc<kube::Config>,
    config_generation: u64,
    tracker: Tracker,
    last: Option<ProbeResult>,
    last_cause: Option<FailureCause>,
    last_error: Option<String>,
    last_failure: Option<SystemTime>,
    local_error: Option<String>,
    last_transition: Option<SystemTime>,
    last_probe: Option<SystemTime>,
    last_tick: Instant,
    panics: u64,
    history: History,
}

#[derive(Debug)]
struct Shared {
    host: String,
    state: Mutex<ProbeState>,
    /// A manager failed to reach the remote: check it on a new connection.
    suspected: Notify,
}

impl Shared {
    /// A remote not probed yet.
    fn new(
        identity: Arc<Identity>,
        names: Vec<String>,
        config: Arc<kube::Config>,
        tracker: Tracker,
    ) -> Self {
        Self {
            host: identity.host().to_owned(),
            state: Mutex::new(ProbeState {
                names: names.into_iter().map(Series::new).collect(),
                identity,
                config,
                config_generation: 0,
                tracker,
                last: None,
                last_cause: None,
                last_error: None,
                last_failure: None,
                local_error: None,
                last_transition: None,
                last_probe: None,
                last_tick: Instant::now(),
                panics: 0,
                history: History::new(),
            }),
            suspected: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ProbeState> {
        // Critical sections only assign fields; a poisoned state is whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Probe {
    shared: Arc<Shared>,
    /// Aborted to stop the probe (see [`supervise_probe`]).
    task: JoinHandle<()>,
}

/// The running probes, by identity, and each configured name's probe.
#[derive(Debug, Default)]
struct Probes {
    by_identity: BTreeMap<Arc<Identity>, Probe>,
    by_name: BTreeMap<String, Arc<Shared>>,
}

#[derive(Debug)]
struct Inner {
    config: ProbeConfig,
    metrics: Metrics,
    transitions: broadcast::Sender<Transition>,
    probes: Mutex<Probes>,
    created: Instant,
    connects: Pacer,
    /// How many probe tasks run: the grid's step is sized to them
    /// ([`on_grid`](pace::on_grid)).
    tasks: AtomicUsize,
    /// Asked to re-read a remote's files when a probe fails as rotated
    /// credentials would make it.
    recheck: RecheckSlot,
}

/// Where the [`Recheck`] is kept, once set.
#[derive(Default)]
struct RecheckSlot(Mutex<Option<Recheck>>);

impl std::fmt::Debug for RecheckSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecheckSlot")
    }
}

impl RecheckSlot {
    fn get(&self) -> Option<Recheck> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, recheck: Recheck) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(recheck);
    }
}

/// Re-reads the files the settings of the remotes named came from (its
/// kubeconfig, CA, client certificate and key, token), applies any change
/// through [`ProbeSet::sync`], and resolves when done.
pub type Recheck = Arc<
    dyn Fn(Vec<String>) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync + 'static,
>;

impl Inner {
    fn probes(&self) -> MutexGuard<'_, Probes> {
        self.probes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn probe_of(&self, name: &str) -> Option<Arc<Shared>> {
        self.probes().by_name.get(name).cloned()
    }
}

/// The probes of every configured remote, for the life of the process.
/// Dropping it stops every probe.
#[derive(Debug)]
pub struct ProbeSet {
    inner: Arc<Inner>,
}

/// A cheap, cloneable view of a [`ProbeSet`] for the admin server and the
/// supervisor's cycles.
#[derive(Debug, Clone)]
pub struct ProbeSetHandle {
    inner: Arc<Inner>,
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ProbeState {
    /// The configured names, for a log line: `a, b`.
    fn names(&self) -> String {
        let names: Vec<&str> = self.names.iter().map(|s| s.name.as_str()).collect();
        names.join(", ")
    }

    /// What the gauges say now; a series is absent until it means something.
    fn gauges(&self) -> Gauges {
        Gauges {
            reachable: match self.tracker.state() {
                Reachability::Unknown => None,
                known => Some(known == Reachability::Reachable),
            },
            ready: self.last.as_ref().map(ProbeResult::ready),
            failures: self.last_probe.map(|_| self.tracker.consecutive_failures()),
            last_probe: self.last_probe.map(unix_seconds),
        }
    }
}

impl ProbeSet {
    /// An empty set whose metrics are registered in `registry`. Call
    /// [`sync`](Self::sync) to start probing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `config` is out of range, and
    /// [`Error::RegisterMetrics`] if the metric names are taken.
    pub fn new(config: ProbeConfig, registry: &Registry) -> Result<Self> {
        config.validate()?;
        let metrics = Metrics::register(registry).map_err(Error::RegisterMetrics)?;
        let (transitions, _) = broadcast::channel(TRANSITION_BUFFER);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                metrics,
                transitions,
                probes: Mutex::default(),
                created: Instant::now(),
                connects: Pacer::new(),
                tasks: AtomicUsize::new(0),
                recheck: RecheckSlot::default(),
            }),
        })
    }

    /// Sets what a probe asks before it counts a failure that rotated
    /// credentials explain (a TLS failure, or a 401): a probe racing a
    /// rotation then tries the new files instead of counting toward a loss.
    pub fn recheck_with(&self, recheck: Recheck) {
        self.inner.recheck.set(recheck);
    }

    /// A view for status pages and subscribers.
    #[must_use]
    pub fn handle(&self) -> ProbeSetHandle {
        ProbeSetHandle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Makes the running probes match `remotes`.
    ///
    /// New identities start probing at once; identities that stay keep their
    /// task and state, and a remote whose settings changed (a new `Arc`)
    /// gets a new client at its next probe. A remote whose identity changed
    /// on the same host (rotated credentials) keeps its probe's state and
    /// series. Identities that go stop. Names that go have their series
    /// deleted.
    ///
    /// # Errors
    ///
    /// [`Error::Remote`] naming a remote whose URL is invalid, and
    /// [`Error::DuplicateName`]; nothing changes then.
    ///
    /// # Panics
    ///
    /// Must be called within a tokio runtime, which runs the probe tasks.
    pub fn sync(&self, remotes: &[Remote]) -> Result<()> {
        let wanted = grouped(remotes)?;
        let mut probes = self.inner.probes();
        apply(&self.inner, &mut probes, wanted, None, remotes);
        Ok(())
    }

    /// Makes the running probes follow the names of `changed` alone: each
    /// name's remote now, or `None` if it is no longer probed. Every other
    /// name keeps its probe. It works as [`sync`](Self::sync) does, over
    /// the probes those names had or join, so that it costs work in
    /// proportion to the names changed, not to the probes.
    ///
    /// # Errors
    ///
    /// As [`sync`](Self::sync): nothing changes then.
    ///
    /// # Panics
    ///
    /// Must be called within a tokio runtime, which runs the probe tasks.
    pub fn update<'a>(
        &self,
        changed: impl IntoIterator<Item = (&'a str, Option<&'a Remote>)>,
    ) -> Result<()> {
        let changed: BTreeMap<&str, Option<&Remote>> = changed.into_iter().collect();
        let mut probes = self.inner.probes();
        // The probes the names leave or join: the only ones that change.
        let mut scope: BTreeSet<Arc<Identity>> = BTreeSet::new();
        for (name, remote) in &changed {
            if let Some(shared) = probes.by_name.get(*name) {
                scope.insert(Arc::clone(&shared.lock().identity));
            }
            if let Some(remote) = remote {
                scope.insert(remote.identity()?);
            }
        }
        // Their other names stay, as they are.
        let mut remotes: Vec<Remote> = changed.values().flatten().map(|r| (*r).clone()).collect();
        for identity in &scope {
            if let Some(probe) = probes.by_identity.get(identity) {
                let state = probe.shared.lock();
                let staying = state
                    .names
                    .iter()
                    .filter(|series| !changed.contains_key(series.name.as_str()));
                remotes.extend(staying.map(|series| {
                    Remote::with_identity(
                        series.name.clone(),
                        Arc::clone(&state.config),
                        Arc::clone(identity),
                    )
                }));
            }
        }
        let wanted = grouped(&remotes)?;
        apply(&self.inner, &mut probes, wanted, Some(&scope), &remotes);
        Ok(())
    }
}

/// `remotes` grouped by identity, each group in the order given.
///
/// # Errors
///
/// [`Error::Remote`] for a remote whose URL is invalid, and
/// [`Error::DuplicateName`].
fn grouped(remotes: &[Remote]) -> Result<BTreeMap<Arc<Identity>, Vec<&Remote>>> {
    let mut wanted: BTreeMap<Arc<Identity>, Vec<&Remote>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for remote in remotes {
        if !seen.insert(remote.name.as_str()) {
            return Err(Error::DuplicateName(remote.name.clone()));
        }
        wanted.entry(remote.identity()?).or_default().push(remote);
    }
    Ok(wanted)
}

/// Makes the probes of `scope` (every probe, if `None`) match `wanted`,
/// which names every remote of those probes that stays (`remotes`, the
/// remotes it groups, for the log lines).
fn apply(
    inner: &Arc<Inner>,
    guard: &mut Probes,
    wanted: BTreeMap<Arc<Identity>, Vec<&Remote>>,
    scope: Option<&BTreeSet<Arc<Identity>>>,
    remotes: &[Remote],
) {
    let Probes {
        by_identity: probes,
        by_name,
    } = guard;
    // Identities no longer wanted. A probe whose names stay, on the same
    // host, under new settings (a rotated CA, certificate or token)
    // moves to its new identity below: its state and series stay, and
    // its client is rebuilt.
    let mut retired: Vec<Probe> = Vec::new();
    let gone: Vec<Arc<Identity>> = match scope {
        None => probes
            .keys()
            .filter(|identity| !wanted.contains_key(*identity))
            .cloned()
            .collect(),
        Some(scope) => scope
            .iter()
            .filter(|identity| probes.contains_key(*identity) && !wanted.contains_key(*identity))
            .cloned()
            .collect(),
    };
    for identity in gone {
        retired.extend(probes.remove(&identity));
    }
    // Counted before any new task starts, so that its first tick is moved
    // to the grid of the whole set.
    let joining = wanted.keys().filter(|id| !probes.contains_key(*id)).count();
    inner.tasks.store(probes.len() + joining, Ordering::Relaxed);
    // `by_name` follows what changes, not the whole set: the names each
    // probe lost are removed, then the names each gained inserted, so
    // that a name that moves from one probe to another ends at the
    // second.
    let mut lost: Vec<String> = Vec::new();
    let mut gained: Vec<(String, Arc<Shared>)> = Vec::new();
    for (identity, group) in wanted {
        let config = Arc::clone(&group[0].config);
        if !probes.contains_key(&identity)
            && let Some(at) = retired.iter().position(|probe| {
                probe.shared.host == identity.host()
                    && probe
                        .shared
                        .lock()
                        .names
                        .iter()
                        .any(|series| group.iter().any(|r| r.name == series.name))
            })
        {
            let probe = retired.swap_remove(at);
            debug!(remotes = %joined(&group), host = %probe.shared.host, "remote's settings changed; its probe goes on with a new client");
            probe.shared.lock().identity = Arc::clone(&identity);
            probes.insert(Arc::clone(&identity), probe);
        }
        if let Some(probe) = probes.get(&identity) {
            let mut state = probe.shared.lock();
            // The same settings keep the client, and its connection.
            if !Arc::ptr_eq(&state.config, &config) {
                state.config = config;
                state.config_generation += 1;
            }
            let same = state.names.len() == group.len()
                && state
                    .names
                    .iter()
                    .zip(&group)
                    .all(|(s, r)| s.name == r.name);
            if same {
                continue;
            }
            // Names that stay keep their series; names that go take
            // theirs with them.
            let mut kept = std::mem::take(&mut state.names);
            state.names = group
                .iter()
                .map(|r| {
                    if let Some(at) = kept.iter().position(|s| s.name == r.name) {
                        return kept.swap_remove(at);
                    }
                    gained.push((r.name.clone(), Arc::clone(&probe.shared)));
                    Series::new(r.name.clone())
                })
                .collect();
            lost.extend(kept.into_iter().map(|s| s.name));
        } else {
            let probe = start_probe(inner, &identity, &group, config);
            gained.extend(
                group
                    .iter()
                    .map(|r| (r.name.clone(), Arc::clone(&probe.shared))),
            );
            probes.insert(identity, probe);
        }
    }
    for probe in &retired {
        lost.extend(probe.shared.lock().names.iter().map(|s| s.name.clone()));
    }
    stop_retired(retired, remotes);
    for name in &lost {
        by_name.remove(name);
    }
    by_name.extend(gained);
    debug_assert_eq!(inner.tasks.load(Ordering::Relaxed), probes.len());
}

/// A probe of `host` for the remotes of `group`, its task started.
fn start_probe(
    inner: &Arc<Inner>,
    identity: &Arc<Identity>,
    group: &[&Remote],
    config: Arc<kube::Config>,
) -> Probe {
    let names: Vec<String> = group.iter().map(|r| r.name.clone()).collect();
    info!(remotes = %names.join(", "), host = %identity.host(), "probing remote apiserver");
    let tracker = Tracker::new(
        inner.config.failure_threshold,
        inner.config.success_threshold,
    );
    let shared = Arc::new(Shared::new(Arc::clone(identity), names, config, tracker));
    // No span around the task: entering one on each of its polls cost a
    // tenth of a probe. Its events name the host themselves, and a
    // client's build runs in the span.
    let task = tokio::spawn(supervise_probe(Arc::clone(inner), Arc::clone(&shared)));
    Probe { shared, task }
}

/// The names of `group`, as a log line lists them.
fn joined(group: &[&Remote]) -> String {
    let names: Vec<&str> = group.iter().map(|r| r.name.as_str()).collect();
    names.join(", ")
}

/// Stops the probes of identities no longer wanted, saying of each name
/// whether it went from the config or moved to another server.
fn stop_retired(retired: Vec<Probe>, remotes: &[Remote]) {
    if retired.is_empty() {
        return;
    }
    let kept: BTreeSet<&str> = remotes.iter().map(|r| r.name.as_str()).collect();
    for probe in retired {
        probe.task.abort();
        let state = probe.shared.lock();
        let (staying, removed): (Vec<&str>, Vec<&str>) = state
            .names
            .iter()
            .map(|series| series.name.as_str())
            .partition(|name| kept.contains(name));
        if !removed.is_empty() {
            info!(remotes = %removed.join(", "), host = %probe.shared.host, "remote removed from config; probe stopped");
        }
        if !staying.is_empty() {
            info!(remotes = %staying.join(", "), host = %probe.shared.host, "remote's server changed; its old one is no longer probed");
        }
    }
}

impl Drop for ProbeSet {
    fn drop(&mut self) {
        for probe in self.inner.probes().by_identity.values() {
            probe.task.abort();
        }
    }
}

impl ProbeSetHandle {
    /// Transitions from now on, once per configured name.
    #[must_use]
    pub fn subscribe(&self) -> broadcast::Receiver<Transition> {
        self.inner.transitions.subscribe()
    }

    /// Losses and recoveries of every configured remote, from now on, as
    /// the supervisor takes them
    /// ([`Supervisor::end_cycles_on`](tether_supervisor::Supervisor::end_cycles_on)).
    ///
    /// Nothing is dropped silently: if the stream falls more than 1,024
    /// transitions behind, it yields [`RemoteSignal::Missed`] with the count,
    /// and the supervisor ends the running cycle for it.
    pub fn signals(&self) -> impl Stream<Item = RemoteSignal> + Send + 'static {
        futures_util::stream::unfold(self.subscribe(), |mut transitions| async move {
            loop {
                match transitions.recv().await {
                    Ok(transition) => {
                        if let Some(signal) = transition.signal() {
                            return Some((signal, transitions));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        warn!(missed, "fell behind the probe transitions");
                        return Some((RemoteSignal::Missed(missed), transitions));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// Tells the probes that a manager failed to reach `name` (a list or a
    /// watch that could not connect): the remote is probed on a new
    /// connection, so that a kept connection that still answers cannot hide
    /// a remote that takes no new ones. The probe runs at once if the remote
    /// was answering and no early probe ran since the last regular tick;
    /// else the next regular probe connects anew. Unknown names are ignored.
    pub fn suspect(&self, name: &str) {
        if let Some(probe) = self.inner.probe_of(name) {
            probe.suspected.notify_one();
        }
    }

    /// Counts a local error met outside the probes, such as a manager's
    /// client that cannot be built: `tether_local_errors_total{kind}`.
    pub fn count_local_error(&self, kind: LocalKind) {
        self.inner
            .metrics
            .local_errors
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    /// Every configured remote's series in Prometheus's text format, in
    /// pieces of about 64 KiB made as they are taken, so a scrape never
    /// holds the whole text (17 MiB at 10,000 remotes). No family is also
    /// in the registry.
    #[must_use]
    pub fn metric_chunks(&self) -> MetricChunks {
        MetricChunks::new(
            self.inner
                .probes()
                .by_identity
                .values()
                .map(|probe| Arc::clone(&probe.shared))
                .collect(),
        )
    }

    /// Appends every configured remote's series to `out`: the
    /// [`metric_chunks`](Self::metric_chunks), whole.
    pub fn write_metrics(&self, out: &mut Vec<u8>) {
        for chunk in self.metric_chunks() {
            out.extend_from_slice(&chunk);
        }
    }

    /// Every configured remote's status, sorted by name.
    #[must_use]
    pub fn status(&self) -> Vec<RemoteStatus> {
        let mut rows = Vec::new();
        let since_epoch = self.inner.created.elapsed();
        for probe in self.inner.probes().by_identity.values() {
            let state = probe.shared.lock();
            for series in &state.names {
                rows.push(RemoteStatus {
                    name: series.name.clone(),
                    host: probe.shared.host.clone(),
                    state: state.tracker.state(),
                    consecutive_failures: state.tracker.consecutive_failures(),
                    last_status: state.last.as_ref().and_then(|r| match r.outcome {
                        Outcome::Reachable { status } => Some(status),
                        _ => None,
                    }),
                    ready: state.last.as_ref().is_some_and(ProbeResult::ready),
                    last_cause: state.last_cause,
                    last_error: state.last_error.clone(),
                    last_failure: state.last_failure,
                    local_error: state.local_error.clone(),
                    last_transition: state.last_transition,
                    last_probe: state.last_probe,
                    latency: state.last.as_ref().map(|r| r.latency),
                    panics: state.panics,
                    failed_recently: state.history.failed_within(since_epoch),
                });
            }
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    }

    /// The probes of the remote named `name` over the last
    /// [`HISTORY_WINDOW`](crate::HISTORY_WINDOW), if it is configured: for
    /// the rows a status page shows, not every remote's at every request.
    #[must_use]
    pub fn recent(&self, name: &str) -> Option<Recent> {
        let since_epoch = self.inner.created.elapsed();
        self.inner
            .probe_of(name)
            .map(|probe| probe.lock().history.recent(since_epoch))
    }

    /// The state of the remote named `name`, if it is configured.
    #[must_use]
    pub fn state_of(&self, name: &str) -> Option<Reachability> {
        self.inner
            .probe_of(name)
            .map(|probe| probe.lock().tracker.state())
    }

    /// The oldest probe task's last tick: a stale value means a probe loop
    /// is wedged. With no remotes, the set's creation.
    #[must_use]
    pub fn heartbeat(&self) -> Instant {
        self.inner
            .probes()
            .by_identity
            .values()
            .map(|probe| probe.shared.lock().last_tick)
            .min()
            .unwrap_or(self.inner.created)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::pace::{CONNECT_BURST, CONNECTS_PER_SECOND, jittered, on_grid};
    use super::text::CHUNK;
    use super::*;
    use crate::metrics::Family;

    fn transition(from: Reachability, to: Reachability) -> Transition {
        Transition {
            remote: "a".into(),
            host: "h:443".into(),
            from,
            to,
            failures: 0,
            error: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn connections_past_the_burst_wait_their_turn_and_the_burst_comes_back() {
        let pacer = Pacer::new();
        let start = Instant::now();
        let spacing = Duration::from_secs(1) / CONNECTS_PER_SECOND;
        for _ in 0..CONNECT_BURST {
            assert_eq!(pacer.slot(), start, "within the burst: at once");
        }
        assert_eq!(pacer.slot(), start + spacing);
        assert_eq!(pacer.slot(), start + spacing * 2);
        // 10,000 more at once: the last opens four seconds on.
        let last = (0..10_000).map(|_| pacer.slot()).max().expect("slots");
        assert_eq!(last, start + spacing * 10_002);
        // Once the pace has caught up, a burst is at once again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = Instant::now();
        for _ in 0..CONNECT_BURST {
            assert_eq!(pacer.slot(), now);
        }
    }

    /// `by_name` as the probes say it should be: each name of each probe,
    /// to that probe.
    fn by_name_agrees(set: &ProbeSet) -> Vec<(String, String)> {
        let probes = set.inner.probes();
        let mut expected = BTreeMap::new();
        for probe in probes.by_identity.values() {
            for series in &probe.shared.lock().names {
                expected.insert(series.name.clone(), Arc::as_ptr(&probe.shared));
            }
        }
        let kept: BTreeMap<String, *const Shared> = probes
            .by_name
            .iter()
            .map(|(name, shared)| (name.clone(), Arc::as_ptr(shared)))
            .collect();
        assert_eq!(kept, expected, "by_name strays from the probes");
        probes
            .by_name
            .iter()
            .map(|(name, shared)| (name.clone(), shared.host.clone()))
            .collect()
    }

    /// Each probe as a set says: its identity's URL and credentials
    /// (`Debug` of the key), and its names. Checks that each probe's state
    /// knows its own key.
    fn probed(set: &ProbeSet) -> BTreeMap<String, BTreeSet<String>> {
        let probes = set.inner.probes();
        probes
            .by_identity
            .iter()
            .map(|(identity, probe)| {
                let state = probe.shared.lock();
                assert_eq!(state.identity, *identity, "a probe that lost its key");
                let names = state.names.iter().map(|s| s.name.clone()).collect();
                (format!("{identity:?}"), names)
            })
            .collect()
    }

    /// For each name probed, whether its probe (and so its state and
    /// series) is the one it had in `before`.
    fn kept_since(set: &ProbeSet, before: &BTreeMap<String, usize>) -> BTreeMap<String, bool> {
        set.inner
            .probes()
            .by_name
            .iter()
            .map(|(name, shared)| {
                let at = Arc::as_ptr(shared) as usize;
                (name.clone(), before.get(name) == Some(&at))
            })
            .collect()
    }

    fn pointers(set: &ProbeSet) -> BTreeMap<String, usize> {
        set.inner
            .probes()
            .by_name
            .iter()
            .map(|(name, shared)| (name.clone(), Arc::as_ptr(shared) as usize))
            .collect()
    }

    proptest::proptest! {
        /// A set told only the names that changed ends where a set told
        /// every name each time does: the same probes, of the same names,
        /// each probe kept or started alike (a name that moves to new
        /// settings on the same host keeps its probe in both).
        #[test]
        fn told_what_changed_the_probes_end_as_told_everything(
            steps in proptest::collection::vec(
                proptest::collection::btree_map(0usize..6, proptest::option::of(0usize..5), 1..4),
                1..30,
            )
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a runtime");
            let _entered = runtime.enter();
            let config = ProbeConfig::default().with_interval(Duration::from_secs(3600));
            let whole = ProbeSet::new(config.clone(), &Registry::new()).expect("probes");
            let told = ProbeSet::new(config, &Registry::new()).expect("probes");
            // Two hosts, and one of them under three credentials.
            let configs: Vec<Arc<kube::Config>> = [
                ("https://a:6443", ""),
                ("https://a:6443", "t"),
                ("https://a:6443", "u"),
                ("https://b:6443", ""),
                ("https://b:6443", "t"),
            ]
            .iter()
            .map(|(url, token)| {
                let mut c = kube::Config::new(url.parse().expect("a URL"));
                c.auth_info.token = (!token.is_empty()).then(|| (*token).to_owned().into());
                Arc::new(c)
            })
            .collect();
            let mut now: BTreeMap<String, usize> = BTreeMap::new();
            for step in steps {
                let before = (pointers(&whole), pointers(&told));
                let mut changed: Vec<(String, Option<Remote>)> = Vec::new();
                for (name, to) in step {
                    let name = format!("n{name}");
                    match to {
                        Some(c) => now.insert(name.clone(), c),
                        None => now.remove(&name),
                    };
                    changed.push((name.clone(), to.map(|c| Remote::new(name, Arc::clone(&configs[c])))));
                }
                let all: Vec<Remote> = now
                    .iter()
                    .map(|(name, c)| Remote::new(name.clone(), Arc::clone(&configs[*c])))
                    .collect();
                whole.sync(&all).expect("sync");
                told.update(changed.iter().map(|(n, r)| (n.as_str(), r.as_ref()))).expect("update");
                proptest::prop_assert_eq!(probed(&told), probed(&whole));
                proptest::prop_assert_eq!(by_name_agrees(&told), by_name_agrees(&whole));
                proptest::prop_assert_eq!(
                    kept_since(&told, &before.1),
                    kept_since(&whole, &before.0)
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_name_finds_its_probe_as_names_come_go_and_move() {
        let set = ProbeSet::new(
            ProbeConfig::default().with_interval(Duration::from_secs(3600)),
            &prometheus::Registry::new(),
        )
        .expect("probes");
        let config = |url: &str, token: &str| {
            let mut c = kube::Config::new(url.parse().expect("a URL"));
            c.auth_info.token = (!token.is_empty()).then(|| token.to_owned().into());
            Arc::new(c)
        };
        let (a, b, c) = (
            config("https://a:6443", ""),
            config("https://b:6443", ""),
            config("https://c:6443", ""),
        );
        let step = |pairs: &[(&str, &Arc<kube::Config>)], want: &[(&str, &str)]| {
            let remotes: Vec<Remote> = pairs
                .iter()
                .map(|(n, c)| Remote::new(*n, Arc::clone(c)))
                .collect();
            set.sync(&remotes).expect("sync");
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(n, h)| ((*n).to_owned(), (*h).to_owned()))
                .collect();
            assert_eq!(by_name_agrees(&set), want, "after {pairs:?}");
        };
        step(
            &[("x", &a), ("y", &a), ("z", &b)],
            &[("x", "a:6443"), ("y", "a:6443"), ("z", "b:6443")],
        );
        // One added beside the rest: nothing else moves.
        step(
            &[("x", &a), ("y", &a), ("z", &b), ("w", &c)],
            &[
                ("w", "c:6443"),
                ("x", "a:6443"),
                ("y", "a:6443"),
                ("z", "b:6443"),
            ],
        );
        // y moves to b's probe, and a name goes.
        step(
            &[("x", &a), ("y", &b), ("z", &b)],
            &[("x", "a:6443"), ("y", "b:6443"), ("z", "b:6443")],
        );
        // b's probe goes whole; its names move to a new server.
        step(
            &[("x", &a), ("y", &c), ("z", &c)],
            &[("x", "a:6443"), ("y", "c:6443"), ("z", "c:6443")],
        );
        // a's settings change on the same host (a token): its probe moves
        // to the new identity, and its names with it.
        let a_token = config("https://a:6443", "t");
        step(
            &[("x", &a_token), ("y", &c), ("z", &c)],
            &[("x", "a:6443"), ("y", "c:6443"), ("z", "c:6443")],
        );
        step(&[], &[]);
    }

    #[test]
    fn metrics_come_in_pieces_with_each_family_whole_and_once() {
        let tracker = || Tracker::new(3, 1);
        let probes: Vec<Arc<Shared>> = (0..400)
            .map(|i| {
                let config = Arc::new(kube::Config::new(
                    format!("http://h{i}:1").parse().expect("a URL"),
                ));
                let identity = Arc::new(Identity::of(&config).expect("an identity"));
                let shared = Shared::new(identity, vec![format!("r{i}")], config, tracker());
                {
                    let mut state = shared.lock();
                    state.last_probe = Some(SystemTime::now());
                    state.last = Some(ProbeResult {
                        outcome: Outcome::Reachable { status: 200 },
                        latency: Duration::from_millis(2),
                    });
                    state.tracker.observe(true);
                    state.names[0].observe(Reachability::Reachable, 0.002);
                }
                Arc::new(shared)
            })
            .collect();
        let chunks: Vec<Vec<u8>> = MetricChunks::new(probes).collect();
        assert!(chunks.len() > 1, "400 remotes' histograms fit in one piece");
        assert!(
            chunks.iter().all(|c| c.len() < CHUNK + 4096),
            "a piece ran over"
        );
        let text = String::from_utf8(chunks.concat()).expect("utf-8");
        let mut family = "";
        let mut seen = Vec::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("# TYPE ") {
                family = name.split(' ').next().expect("a name");
                assert!(!seen.contains(&family), "{family} twice");
                seen.push(family);
            } else if !line.starts_with('#') {
                assert!(
                    line.starts_with(family),
                    "{line} outside its family {family}"
                );
            }
        }
        // No transition happened: that family is left out, not empty.
        assert_eq!(seen.len(), Family::ALL.len() - 1, "{seen:?}");
        assert_eq!(text.matches("le=\"+Inf\"} 1").count(), 400);
    }

    #[test]
    fn ticks_move_to_the_nearest_point_of_the_grid() {
        let epoch = Instant::now();
        let interval = Duration::from_secs(10);
        let ms = Duration::from_millis;
        // 10,000 tasks every 10 s: a step of 20 ms gathers 20 a point.
        let at = |t| on_grid(epoch + t, epoch, interval, 10_000);
        assert_eq!(at(ms(40)), epoch + ms(40));
        assert_eq!(at(ms(49)), epoch + ms(40));
        assert_eq!(at(ms(50)), epoch + ms(60));
        assert_eq!(at(ms(59)), epoch + ms(60));
        // Fewer tasks: a wider step, at most 100 ms.
        let at = |t| on_grid(epoch + t, epoch, interval, 100);
        assert_eq!(at(ms(149)), epoch + ms(100));
        assert_eq!(at(ms(150)), epoch + ms(200));
        // A short interval: at most a tenth of it, whatever the tasks.
        let short = Duration::from_millis(100);
        for tasks in [0, 1, 10] {
            assert_eq!(on_grid(epoch + ms(4), epoch, short, tasks), epoch);
            assert_eq!(on_grid(epoch + ms(5), epoch, short, tasks), epoch + ms(10));
        }
    }

    #[test]
    fn a_jittered_interval_stays_within_the_jitter_and_none_is_exact() {
        for interval in [Duration::from_millis(1_500), Duration::from_secs(10)] {
            assert_eq!(jittered(interval, 0.0), interval);
            let (low, high) = (interval.mul_f64(0.9), interval.mul_f64(1.1));
            let draws: Vec<Duration> = (0..1_000).map(|_| jittered(interval, 0.1)).collect();
            assert!(draws.iter().all(|d| (low..=high).contains(d)), "{draws:?}");
            // Spread over the range, not stuck at one end.
            assert!(draws.iter().any(|d| *d < interval.mul_f64(0.95)));
            assert!(draws.iter().any(|d| *d > interval.mul_f64(1.05)));
        }
    }

    #[test]
    fn only_losses_and_recoveries_are_signals() {
        use Reachability::{Reachable, Unknown, Unreachable};
        assert_eq!(transition(Unknown, Reachable).signal(), None);
        assert_eq!(
            transition(Unknown, Unreachable).signal(),
            Some(RemoteSignal::Lost("a".into()))
        );
        assert_eq!(
            transition(Reachable, Unreachable).signal(),
            Some(RemoteSignal::Lost("a".into()))
        );
        assert_eq!(
            transition(Unreachable, Reachable).signal(),
            Some(RemoteSignal::Recovered("a".into()))
        );
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_says_how_many_it_missed() {
        let probes = ProbeSet::new(ProbeConfig::default(), &Registry::new()).expect("probe set");
        let mut signals = std::pin::pin!(probes.handle().signals());
        let extra = 76;
        for _ in 0..TRANSITION_BUFFER + extra {
            let lost = transition(Reachability::Reachable, Reachability::Unreachable);
            probes.inner.transitions.send(lost).expect("a subscriber");
        }
        assert_eq!(
            signals.next().await,
            Some(RemoteSignal::Missed(extra as u64))
        );
        assert_eq!(signals.next().await, Some(RemoteSignal::Lost("a".into())));
    }

    /// A probe's future is boxed on every probe (so that the idle task stays
    /// small), and glibc's per-thread cache serves an allocation of at most
    /// 1,032 bytes at a fraction of what a larger one costs: 1,680 bytes
    /// cost about 370 instructions a probe more (issue 43). A new connection
    /// is boxed apart, being rare; the kept one's path is what stays inline.
    #[test]
    fn a_probe_future_fits_the_allocator_cache() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = runtime.enter();
        let config = kube::Config::new("https://h:1".parse().expect("a URL"));
        let mut client =
            crate::probe::probe_client(&config, &ProbeConfig::default()).expect("a client");
        // The probe task's own timer, as the loop passes it.
        let timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let probe =
            crate::probe::probe_on(&mut client, "/readyz", Duration::from_secs(1), &[], timer);
        // 944 bytes in an optimized build and 976 in an unoptimized one
        // (1,008 and 1,040 with a timer of its own, 1,680 before); under
        // the cache's 1,032 either way.
        let most = if cfg!(debug_assertions) { 1_040 } else { 1_024 };
        assert!(
            std::mem::size_of_val(&probe) <= most && std::mem::align_of_val(&probe) <= 16,
            "a probe's future holds {} bytes, aligned to {}",
            std::mem::size_of_val(&probe),
            std::mem::align_of_val(&probe)
        );
    }

    /// What every remote keeps while its probe waits, counted in bytes so
    /// that a change cannot grow it unseen (issue 43): the idle task's
    /// future (tokio adds about 150 bytes of its own to each), and the
    /// state the set shares with it. A wait that is rare (a recheck, a
    /// build, the probe itself) is boxed and costs nothing while idle.
    #[test]
    fn an_idle_probe_task_and_its_state_stay_small() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = runtime.enter();
        let set = ProbeSet::new(ProbeConfig::default(), &Registry::new()).expect("a set");
        let config = Arc::new(kube::Config::new("https://h:1".parse().expect("a URL")));
        let identity = Arc::new(Identity::of(&config).expect("an identity"));
        let shared = Arc::new(Shared::new(
            identity,
            vec!["a".into()],
            config,
            Tracker::new(3, 1),
        ));
        let task = supervise_probe(Arc::clone(&set.inner), shared);
        // 848 before issue 43's second part, 624 after it, 544 since the
        // task is aborted rather than watching a cancellation token, 576
        // since it keeps one timer for its life (about 370 instructions a
        // probe less), 528 since part 16's changes to the loop.
        assert!(
            std::mem::size_of_val(&task) <= 528,
            "the idle probe task holds {} bytes",
            std::mem::size_of_val(&task)
        );
        // 680 before (the history's buckets took six bytes, now four).
        assert!(
            std::mem::size_of::<Shared>() <= 576,
            "a remote's shared state holds {} bytes",
            std::mem::size_of::<Shared>()
        );
    }
}
