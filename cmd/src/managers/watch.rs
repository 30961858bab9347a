//! The built-in watch manager: one per cycle, a reflector per remote and per
//! watched resource type.
//!
//! # Invariants
//!
//! - Every task the manager starts belongs to its cycle, and ends before
//!   `run` returns: no task outlives its cycle.
//! - Each remote's reflectors run under the runs of the remote's scope. The
//!   loss of an optional remote stops only them; they start again, with a
//!   new client and unsynced caches, when it is back.
//! - A cache is *current* while it has listed in this run and its watch has
//!   not been failing for longer than `stale_after` (the probes' detection
//!   bound). The manager reports itself up while every cache of every
//!   *required* remote is current: readiness is decided here, once.
//! - A failed list or watch is retried with a new list, never by resuming
//!   the watch: a resumed watch says nothing until an object changes, so
//!   only a completed list tells that the remote answers again.
//! - A list or watch that fails at the transport makes the probes check
//!   that remote at once on a new connection ([`ProbeSetHandle::suspect`]).
//! - A remote's client is built off the async workers (it runs the exec
//!   credential plugin, if any), and built again with backoff while that
//!   fails: a hung or failing plugin stops that remote's watches alone.
//! - Each remote's part lives as long as its scope: a remote added to the
//!   running cycle (config, discovery, a share gained) starts its watches
//!   alone, one removed stops them alone and its series go, and one read
//!   anew (a new generation: credentials, CA or server) runs anew alone.
//!   No other remote's watches stop or list again.
//! - Each run of a remote's part uses the remote as the newest plan has
//!   it; the resource types are the cycle's, read at its start: a change of
//!   them ends the cycle.
//! - What the manager runs ([`ManagerHandle::running`]) is the set of
//!   remotes whose part has not yet ended: a remote given up to another
//!   replica leaves it only once its watches have stopped.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus::{IntGaugeVec, Opts, Registry};
use tether_probes::{ProbeSetHandle, Reachability};
use tether_supervisor::{
    Backoff, BackoffConfig, CycleToken, ManagerError, ManagerFactory, RemoteScope, UsedRemotes,
};
use tokio::sync::{mpsc, watch as channel};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::remote::ResolvedRemote;
use crate::config::{Plan, WatchSpec};
use crate::lock;

/// What went wrong in the manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// kube could not build a remote's client.
    #[error("building the client of remote {remote} failed")]
    Client {
        /// The remote's name.
        remote: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A reflector ended although nothing stopped it: a bug.
    #[error("a watch of remote {remote} ended by itself")]
    WatchEnded {
        /// The remote's name.
        remote: String,
    },
    /// A reflector panicked.
    #[error("a watch of remote {remote} panicked")]
    WatchPanicked {
        /// The remote's name.
        remote: String,
        /// The panic.
        #[source]
        source: JoinError,
    },
}

/// The state of one cache in the current run of its remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheState {
    /// Whether its initial list completed in this run.
    pub synced: bool,
    /// Objects in the cache.
    pub objects: usize,
    /// Since when its list or watch has been failing, if it is.
    pub failing_since: Option<SystemTime>,
    /// Whether it has been failing for longer than the detection bound, so
    /// its objects may be out of date.
    pub stale: bool,
}

impl CacheState {
    /// Synced, and not stale: what readiness needs of a required cache.
    #[must_use]
    pub fn current(&self) -> bool {
        self.synced && !self.stale
    }
}

/// Caches by `(remote, resource)`.
pub type Caches = BTreeMap<(String, String), CacheState>;

/// The remotes the manager uses: none when it watches nothing.
fn used(plan: &Plan) -> impl Iterator<Item = &ResolvedRemote> {
    let watches = !plan.watch.is_empty();
    watches.then(|| plan.remotes.iter()).into_iter().flatten()
}

#[derive(Debug)]
struct Shared {
    /// The newest plan, and the revision of the value it came with.
    plan: Mutex<(u64, Arc<Plan>)>,
    /// The remotes whose part runs now.
    running: channel::Sender<BTreeSet<String>>,
    caches: Mutex<Caches>,
    probes: ProbeSetHandle,
    stale_after: Duration,
    objects: IntGaugeVec,
    synced: IntGaugeVec,
}

impl Shared {
    /// Records a cache's state, if the cache is still planned: a reflector
    /// of a remote that a reload removed, still tearing down, must not bring
    /// its series back.
    fn set_cache(&self, remote: &str, resource: &str, state: CacheState) {
        let mut caches = lock(&self.caches);
        if let Some(cache) = caches.get_mut(&(remote.to_owned(), resource.to_owned())) {
            *cache = state;
            self.export(remote, resource, state);
        }
    }

    /// Deletes the caches, and their series, of pairs `plan` no longer
    /// has, and adds those it has new, unsynced.
    fn follow_plan(&self, plan: &Plan) {
        let wanted = plan.pairs();
        let mut caches = lock(&self.caches);
        caches.retain(|(remote, resource), _| {
            let keep = wanted.contains(&(remote.clone(), resource.clone()));
            if !keep {
                let _ = self.synced.remove_label_values(&[remote, resource]);
                let _ = self.objects.remove_label_values(&[remote, resource]);
            }
            keep
        });
        for pair in wanted {
            if let std::collections::btree_map::Entry::Vacant(new) = caches.entry(pair) {
                let (remote, resource) = new.key();
                self.export(remote, resource, CacheState::default());
                new.insert(CacheState::default());
            }
        }
    }

    /// The remote `name` as the newest plan has it.
    fn remote(&self, name: &str) -> Option<ResolvedRemote> {
        lock(&self.plan).1.remotes.get(name).cloned()
    }

    /// Counts one more or one fewer part of `remote` running.
    fn part(&self, parts: &mut BTreeMap<String, usize>, remote: &str, starts: bool) {
        let count = parts.entry(remote.to_owned()).or_default();
        if starts {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                parts.remove(remote);
            }
        }
        self.running.send_replace(parts.keys().cloned().collect());
    }

    fn export(&self, remote: &str, resource: &str, state: CacheState) {
        self.synced
            .with_label_values(&[remote, resource])
            .set(i64::from(state.current()));
        self.objects
            .with_label_values(&[remote, resource])
            .set(i64::try_from(state.objects).unwrap_or(i64::MAX));
    }

    /// Marks `remote`'s caches as not yet synced in a new run; their objects
    /// stay counted until the next list.
    fn unsync(&self, remote: &str, watch: &[WatchSpec]) {
        let mut caches = lock(&self.caches);
        for spec in watch {
            let resource = spec.resource_label();
            // Only caches still planned: a run of a remote a reload removed
            // must not bring its series back.
            if let Some(state) = caches.get_mut(&(remote.to_owned(), resource.clone())) {
                *state = CacheState {
                    objects: state.objects,
                    ..CacheState::default()
                };
                self.export(remote, &resource, *state);
            }
        }
    }

    /// Resets the caches for a new cycle's plan: series of pairs no longer
    /// planned are deleted, the rest start unsynced.
    fn reset_caches(&self, plan: &Plan) {
        self.follow_plan(plan);
        for remote in plan.remotes.iter() {
            self.unsync(&remote.name, &plan.watch);
        }
    }
}

/// The built-in manager.
#[derive(Debug)]
pub struct WatchManager {
    shared: Arc<Shared>,
}

/// A cheap view of the manager, for reloads and the admin server.
#[derive(Debug, Clone)]
pub struct ManagerHandle {
    shared: Arc<Shared>,
}

impl WatchManager {
    /// A manager that runs `plan`, its metrics in `registry`. It suspects a
    /// remote to `probes` when it cannot reach it, and counts a cache as
    /// stale once its watch has failed for longer than `stale_after`.
    ///
    /// # Errors
    ///
    /// If the metric names are already registered.
    pub fn new(
        registry: &Registry,
        probes: ProbeSetHandle,
        plan: Plan,
        stale_after: Duration,
    ) -> prometheus::Result<Self> {
        let objects = IntGaugeVec::new(
            Opts::new("tether_watch_objects", "Objects in the manager's cache."),
            &["remote", "resource"],
        )?;
        let synced = IntGaugeVec::new(
            Opts::new(
                "tether_watch_synced",
                "1 while that cache has synced this cycle and its watch has not failed for longer than the detection bound.",
            ),
            &["remote", "resource"],
        )?;
        registry.register(Box::new(objects.clone()))?;
        registry.register(Box::new(synced.clone()))?;
        let shared = Arc::new(Shared {
            plan: Mutex::new((0, Arc::new(plan))),
            running: channel::Sender::new(BTreeSet::new()),
            caches: Mutex::default(),
            probes,
            stale_after,
            objects,
            synced,
        });
        shared.reset_caches(&lock(&shared.plan).1);
        Ok(Self { shared })
    }

    /// A view for reloads and the admin server.
    #[must_use]
    pub fn handle(&self) -> ManagerHandle {
        ManagerHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl ManagerHandle {
    /// The newest plan: the remotes, and what is cached.
    #[must_use]
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&lock(&self.shared.plan).1)
    }

    /// Takes in `plan`, of the value numbered `revision`, unless it or a
    /// newer one is in: the caches and series of remotes and resources it no
    /// longer has go at once, and a remote's part reads its remote from it
    /// at its next run. The resource types take effect in the next cycle.
    pub fn update(&self, revision: u64, plan: Arc<Plan>) {
        let mut newest = lock(&self.shared.plan);
        if revision <= newest.0 {
            return;
        }
        self.shared.follow_plan(&plan);
        *newest = (revision, plan);
    }

    /// The remotes whose part runs now, as it changes: none between cycles.
    #[must_use]
    pub fn running(&self) -> channel::Receiver<BTreeSet<String>> {
        self.shared.running.subscribe()
    }

    /// The caches as they are now.
    #[must_use]
    pub fn caches(&self) -> Caches {
        lock(&self.shared.caches).clone()
    }
}

fn api_resource(spec: &WatchSpec) -> ApiResource {
    let (group, version) = spec
        .api_version
        .split_once('/')
        .unwrap_or(("", spec.api_version.as_str()));
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: spec.api_version.clone(),
        kind: spec.kind.clone(),
        plural: spec.plural.clone(),
    }
}

/// The remote's client, its responses bounded so a remote cannot exhaust
/// tether's memory.
fn client(remote: &ResolvedRemote) -> Result<kube::Client, Error> {
    tether_probes::client::bounded_client(kube::Config::clone(&remote.config)).map_err(|source| {
        Error::Client {
            remote: remote.name.clone(),
            source,
        }
    })
}

/// How a failing watch, and a client that cannot be built, are retried: 1s
/// doubling to 30s, ±20%, as kube's own default backoff, but reset only by
/// an answer.
const WATCH_RETRY: BackoffConfig = BackoffConfig {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(30),
    factor: 2.0,
    jitter: 0.2,
};

/// How often a watch that keeps failing is summarised in the log, after
/// its first failure is logged in full.
const SUMMARY_EVERY: Duration = Duration::from_secs(300);

/// What to log of one more failure of a watch.
#[derive(Debug, PartialEq, Eq)]
enum Report {
    /// The first of a run of failures: in full, as a warning.
    First,
    /// `failures` more since the last report, `over` this long.
    Summary { failures: u32, over: Duration },
    /// Nothing above debug.
    Quiet,
}

/// The failures of one watch since it last worked, for its log lines.
#[derive(Debug, Default)]
struct FailureLog {
    /// Since it last worked.
    total: u32,
    /// Since the last line logged, and when that was.
    since_report: u32,
    reported_at: Option<Instant>,
}

impl FailureLog {
    fn failed(&mut self, now: Instant) -> Report {
        self.total += 1;
        self.since_report += 1;
        match self.reported_at {
            None => {
                self.reported_at = Some(now);
                self.since_report = 0;
                Report::First
            }
            Some(at) if now.saturating_duration_since(at) >= SUMMARY_EVERY => {
                let report = Report::Summary {
                    failures: self.since_report,
                    over: now.saturating_duration_since(at),
                };
                self.reported_at = Some(now);
                self.since_report = 0;
                report
            }
            Some(_) => Report::Quiet,
        }
    }
}

/// A change of a cache's state, for the manager's readiness.
#[derive(Debug)]
struct Change {
    /// The part of the remote it belongs to.
    part: u64,
    cache: (String, String),
    current: bool,
}

/// One reflector: a remote's cache of one resource type.
struct Cache {
    part: u64,
    remote: String,
    spec: WatchSpec,
    client: kube::Client,
    shared: Arc<Shared>,
    changes: mpsc::UnboundedSender<Change>,
}

/// The kube error inside a watcher error, if the request itself failed.
fn request_error(err: &watcher::Error) -> Option<&kube::Error> {
    match err {
        watcher::Error::InitialListFailed(err)
        | watcher::Error::WatchStartFailed(err)
        | watcher::Error::WatchFailed(err) => Some(err),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => None,
    }
}

impl Cache {
    /// Runs the reflector until `stop`, keeping its cache state current.
    async fn run(self, stop: CancellationToken) {
        let resource = self.spec.resource_label();
        let remote = self.remote.as_str();
        let ar = api_resource(&self.spec);
        let api: Api<DynamicObject> = match &self.spec.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        let mut config = watcher::Config::default();
        if let Some(selector) = &self.spec.label_selector {
            config = config.labels(selector);
        }
        let mut writer = Writer::new(ar);
        let reader = writer.as_reader();
        // No kube backoff: it resets on every item, the watcher's `Init`
        // before each retry included, so a dead remote was retried every
        // second for ever. The retries wait here instead, and each starts
        // a new watcher, which lists first: kube's own retry resumes the
        // watch, which yields nothing until an object changes, and a quiet
        // cache would be called stale though its remote answers again.
        let list_anew = || watcher(api.clone(), config.clone()).boxed();
        let mut stream = list_anew();
        let mut state = CacheState::default();
        let mut retry = Backoff::new(WATCH_RETRY);
        let mut retry_at: Option<Instant> = None;
        let mut failures = FailureLog::default();
        // When a failing watch makes the cache stale.
        let mut stale_at: Option<Instant> = None;
        loop {
            let before = state;
            let event = tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(stale_at.unwrap_or_else(Instant::now)), if stale_at.is_some() => {
                    stale_at = None;
                    state.stale = true;
                    warn!(%remote, %resource, failing_for = ?self.shared.stale_after, "cache stale: its watch has failed for longer than the probes take to find a dead remote");
                    self.publish(&resource, before, state);
                    continue;
                }
                () = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {
                    retry_at = None;
                    continue;
                }
                event = stream.next(), if retry_at.is_none() => event,
            };
            match event {
                None => return,
                Some(Ok(event)) => {
                    writer.apply_watcher_event(&event);
                    // The watcher says `Init` before it sends the list
                    // request: nothing has answered yet.
                    let answered = !matches!(event, watcher::Event::Init);
                    if answered && state.failing_since.is_some() {
                        info!(%remote, %resource, failures = failures.total, "watch works again");
                        state.failing_since = None;
                        state.stale = false;
                        stale_at = None;
                        retry.reset();
                        failures = FailureLog::default();
                    }
                    state.objects = reader.len();
                    if matches!(event, watcher::Event::InitDone) && !state.synced {
                        state.synced = true;
                        debug!(%remote, %resource, objects = state.objects, "cache synced");
                    }
                }
                Some(Err(err)) => {
                    // A transport failure may be a remote that takes no new
                    // connections while the probe's kept one still answers.
                    if request_error(&err)
                        .and_then(tether_probes::client::transport_failure)
                        .is_some()
                    {
                        self.shared.probes.suspect(remote);
                    }
                    let error = tether_probes::client::root_cause(&err);
                    match failures.failed(Instant::now()) {
                        Report::First => {
                            warn!(%remote, %resource, %error, "watch failing; retrying with backoff");
                        }
                        Report::Summary { failures, over } => {
                            info!(%remote, %resource, %error, failures, over = ?over, "watch still failing");
                        }
                        Report::Quiet => debug!(%remote, %resource, %error, "watch failed again"),
                    }
                    if state.failing_since.is_none() {
                        state.failing_since = Some(SystemTime::now());
                        // `None` (never stale) only for a bound past the clock's range.
                        stale_at = Instant::now().checked_add(self.shared.stale_after);
                    }
                    // While the probes call the remote lost, a retry cannot
                    // succeed before they call it back: wait the longest.
                    let mut wait = retry.next_delay();
                    if self.shared.probes.state_of(remote) == Some(Reachability::Unreachable) {
                        wait = wait.max(WATCH_RETRY.max);
                    }
                    retry_at = Instant::now().checked_add(wait);
                    // Polled only at `retry_at`: the cache keeps its objects
                    // until the new list completes.
                    stream = list_anew();
                }
            }
            self.publish(&resource, before, state);
        }
    }

    fn publish(&self, resource: &str, before: CacheState, now: CacheState) {
        if before == now {
            return;
        }
        self.shared.set_cache(&self.remote, resource, now);
        if before.current() != now.current() {
            // The manager is gone only when its cycle is, and so is this.
            let _ = self.changes.send(Change {
                part: self.part,
                cache: (self.remote.clone(), resource.to_owned()),
                current: now.current(),
            });
        }
    }
}

/// A client for `run` of `remote`'s scope, built off the async workers (an
/// exec credential plugin runs as it is built), and tried again with
/// backoff while it fails: a hung or failing plugin is this remote's local
/// error alone. `None` once the run ends.
async fn client_for(
    remote: &ResolvedRemote,
    probes: &ProbeSetHandle,
    run: &CancellationToken,
    pending: &mut Option<tether_probes::client::Pending<Result<kube::Client, Error>>>,
) -> Option<kube::Client> {
    // The same policy as a failing watch: 1s doubling to 30s, jittered so
    // that many remotes whose plugin fails together do not retry in step.
    let mut retry = Backoff::new(WATCH_RETRY);
    let mut failures = 0u32;
    loop {
        let make = {
            let remote = remote.clone();
            move || client(&remote)
        };
        let outcome = tokio::select! {
            biased;
            () = run.cancelled() => return None,
            outcome = tether_probes::client::off_workers(pending, make) => outcome,
        };
        let error = match outcome {
            Ok(Ok(client)) => {
                if failures > 0 {
                    info!(remote = %remote.name, failures, "client built; its watches start");
                }
                return Some(client);
            }
            Ok(Err(err)) => {
                probes.count_local_error(tether_probes::LocalKind::of(&err));
                tether_probes::client::root_cause(&err)
            }
            Err(err) => {
                probes.count_local_error(tether_probes::LocalKind::of(&err));
                err.to_string()
            }
        };
        failures += 1;
        if failures == 1 {
            warn!(remote = %remote.name, %error, "cannot build the remote's client (a local error); its watches wait, trying again with backoff");
        } else {
            debug!(remote = %remote.name, %error, failures, "still cannot build the remote's client");
        }
        tokio::select! {
            () = run.cancelled() => return None,
            () = tokio::time::sleep(retry.next_delay()) => {}
        }
    }
}

/// One remote's part of a cycle: its scope, and what it caches.
struct Part {
    id: u64,
    scope: RemoteScope,
    watch: Arc<Vec<WatchSpec>>,
    shared: Arc<Shared>,
    changes: mpsc::UnboundedSender<Change>,
}

impl Part {
    /// Runs the remote's reflectors for every run of its scope, each run
    /// with a new client, on the remote as the newest plan has it, until
    /// the scope ends: with the cycle, or the remote removed from it.
    async fn run(mut self) -> Result<(), Error> {
        let name = self.scope.remote().to_owned();
        let mut pending = None;
        while let Some(run) = self.scope.next_run().await {
            self.shared.unsync(&name, &self.watch);
            // Gone from the plan: its scope ends once the supervisor hears.
            let Some(remote) = self.shared.remote(&name) else {
                continue;
            };
            let Some(client) = client_for(&remote, &self.shared.probes, &run, &mut pending).await
            else {
                continue;
            };
            let mut caches = JoinSet::new();
            for spec in self.watch.iter() {
                let cache = Cache {
                    part: self.id,
                    remote: name.clone(),
                    spec: spec.clone(),
                    client: client.clone(),
                    shared: Arc::clone(&self.shared),
                    changes: self.changes.clone(),
                };
                caches.spawn(cache.run(run.clone()));
            }
            tokio::select! {
                biased;
                () = run.cancelled() => {}
                Some(ended) = caches.join_next() => {
                    // A reflector ends only when stopped.
                    caches.shutdown().await;
                    return Err(match ended {
                        Err(source) if source.is_panic() => Error::WatchPanicked { remote: name, source },
                        _ => Error::WatchEnded { remote: name },
                    });
                }
            }
            while caches.join_next().await.is_some() {}
            self.shared.unsync(&name, &self.watch);
        }
        Ok(())
    }
}

/// The parts of one cycle, and what readiness needs of them.
struct Parts {
    tasks: JoinSet<Result<(), Error>>,
    /// By task, the part and its remote.
    which: BTreeMap<tokio::task::Id, (u64, String)>,
    /// How many parts of each remote run (two, briefly, when a remote is
    /// removed and added again).
    count: BTreeMap<String, usize>,
    /// Each required part's caches, and whether each is current.
    required: BTreeMap<u64, BTreeMap<String, bool>>,
    next: u64,
    watch: Arc<Vec<WatchSpec>>,
    shared: Arc<Shared>,
    changes: mpsc::UnboundedSender<Change>,
}

impl Parts {
    fn start(&mut self, scope: RemoteScope) {
        self.next += 1;
        let id = self.next;
        let name = scope.remote().to_owned();
        if scope.on_loss() == tether_supervisor::OnLoss::EndCycle {
            let caches = self
                .watch
                .iter()
                .map(|w| (w.resource_label(), false))
                .collect();
            self.required.insert(id, caches);
        }
        self.shared.part(&mut self.count, &name, true);
        let part = Part {
            id,
            scope,
            watch: Arc::clone(&self.watch),
            shared: Arc::clone(&self.shared),
            changes: self.changes.clone(),
        };
        let task = self.tasks.spawn(part.run());
        self.which.insert(task.id(), (id, name));
    }

    /// A part ended: its remote runs one part fewer, and its caches no
    /// longer count for readiness.
    fn ended(&mut self, task: tokio::task::Id) {
        if let Some((id, name)) = self.which.remove(&task) {
            self.required.remove(&id);
            self.shared.part(&mut self.count, &name, false);
        }
    }

    fn changed(&mut self, change: &Change) {
        if let Some(current) = self
            .required
            .get_mut(&change.part)
            .and_then(|caches| caches.get_mut(&change.cache.1))
        {
            *current = change.current;
        }
    }

    /// A required cache that is not current, by remote and resource.
    fn not_current(&self) -> Option<(String, String)> {
        let (id, caches) = self
            .required
            .iter()
            .find(|(_, caches)| caches.values().any(|current| !current))?;
        let resource = caches.iter().find(|(_, current)| !**current)?.0;
        let remote = self.which.values().find(|(part, _)| part == id)?.1.clone();
        Some((remote, resource.clone()))
    }

    /// Whether every cache of every required part is current.
    fn up(&self) -> bool {
        self.required
            .values()
            .flat_map(BTreeMap::values)
            .all(|c| *c)
    }

    /// Waits for every part to end.
    async fn end(mut self) {
        while let Some(ended) = self.tasks.join_next_with_id().await {
            let task = match &ended {
                Ok((task, _)) => *task,
                Err(join) => join.id(),
            };
            self.ended(task);
        }
    }
}

impl ManagerFactory for WatchManager {
    fn remotes(&self) -> UsedRemotes {
        super::used_remotes(used(&lock(&self.shared.plan).1))
    }

    fn takes_remote_changes(&self, _: &tether_supervisor::Cause) -> bool {
        true
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        // Cleared however the run ends; each part counts itself in and out.
        let _running = super::Running::new(&shared.running);
        let plan = Arc::clone(&lock(&shared.plan).1);
        shared.reset_caches(&plan);

        let (changes_tx, mut changes) = mpsc::unbounded_channel();
        let mut parts = Parts {
            tasks: JoinSet::new(),
            which: BTreeMap::new(),
            count: BTreeMap::new(),
            required: BTreeMap::new(),
            next: 0,
            watch: Arc::new(if used(&plan).next().is_none() {
                Vec::new()
            } else {
                plan.watch.clone()
            }),
            shared: Arc::clone(shared),
            changes: changes_tx,
        };
        // A remote without a scope was added after the supervisor asked which
        // remotes this cycle uses; its scope joins below.
        for remote in used(&plan) {
            if let Some(scope) = cycle.scope(&remote.name) {
                parts.start(scope);
            }
        }

        let mut up = parts.up();
        cycle.set_manager_up(up);
        let result = loop {
            tokio::select! {
                biased;
                () = cycle.cancelled() => break Ok(()),
                Some(scope) = cycle.joined() => parts.start(scope),
                Some(change) = changes.recv() => parts.changed(&change),
                Some(ended) = parts.tasks.join_next_with_id() => match ended {
                    Ok((task, Ok(()))) => parts.ended(task),
                    Ok((_, Err(err))) => break Err(ManagerError::failed(err)),
                    Err(join) => break Err(ManagerError::failed(join)),
                },
            }
            let now = parts.up();
            if now != up && cycle.set_manager_up(now) {
                up = now;
                if up {
                    info!(
                        cycle = cycle.number(),
                        "manager up: every required cache synced"
                    );
                } else {
                    let (remote, resource) = parts.not_current().unwrap_or_default();
                    warn!(cycle = cycle.number(), %remote, %resource, "manager down: a required cache is not current");
                }
            }
        };
        if result.is_err() {
            parts.tasks.abort_all();
        }
        // No task outlives its cycle: every part ends with its scope's runs.
        parts.end().await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_are_logged_once_then_summarised() {
        let start = Instant::now();
        let mut log = FailureLog::default();
        assert_eq!(log.failed(start), Report::First);
        for i in 1..37 {
            assert_eq!(log.failed(start + Duration::from_secs(i)), Report::Quiet);
        }
        assert_eq!(
            log.failed(start + SUMMARY_EVERY),
            Report::Summary {
                failures: 37,
                over: SUMMARY_EVERY
            }
        );
        assert_eq!(log.failed(start + SUMMARY_EVERY), Report::Quiet);
        assert_eq!(log.total, 39);
    }
}
