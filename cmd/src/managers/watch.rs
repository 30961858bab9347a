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
//! - Remotes and watch types are read afresh at each cycle's start, so a
//!   reload takes effect in the next cycle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus::{IntGaugeVec, Opts, Registry};
use tether_probes::{ProbeSetHandle, Reachability};
use tether_supervisor::{
    Backoff, BackoffConfig, CycleToken, ManagerError, ManagerFactory, RemoteScope, UsedRemote,
    UsedRemotes,
};
use tokio::sync::mpsc;
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
fn used(plan: &Plan) -> &[ResolvedRemote] {
    if plan.watch.is_empty() {
        &[]
    } else {
        &plan.remotes
    }
}

#[derive(Debug)]
struct Shared {
    plan: Mutex<Arc<Plan>>,
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

    /// Deletes the caches, and their series, of pairs `plan` no longer has.
    fn forget_unplanned(&self, plan: &Plan) {
        let wanted = plan.pairs();
        lock(&self.caches).retain(|(remote, resource), _| {
            let keep = wanted.contains(&(remote.clone(), resource.clone()));
            if !keep {
                let _ = self.synced.remove_label_values(&[remote, resource]);
                let _ = self.objects.remove_label_values(&[remote, resource]);
            }
            keep
        });
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
        self.forget_unplanned(plan);
        {
            let mut caches = lock(&self.caches);
            for pair in plan.pairs() {
                caches.entry(pair).or_default();
            }
        }
        for remote in &plan.remotes {
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
            plan: Mutex::new(Arc::new(plan)),
            caches: Mutex::default(),
            probes,
            stale_after,
            objects,
            synced,
        });
        shared.reset_caches(&lock(&shared.plan));
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
    /// The plan the next cycle runs: the remotes, and what is cached.
    #[must_use]
    pub fn plan(&self) -> Arc<Plan> {
        Arc::clone(&lock(&self.shared.plan))
    }

    /// Replaces the plan; the next cycle runs it. The caches and series of
    /// remotes and resources it no longer has go at once.
    pub fn update(&self, plan: Arc<Plan>) {
        self.shared.forget_unplanned(&plan);
        *lock(&self.shared.plan) = plan;
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
    cache: (String, String),
    current: bool,
}

/// One reflector: a remote's cache of one resource type.
struct Cache {
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

/// Runs `remote`'s reflectors for every run of its scope, each run with a
/// new client.
async fn run_remote(
    remote: ResolvedRemote,
    plan: Arc<Plan>,
    mut scope: RemoteScope,
    shared: Arc<Shared>,
    changes: mpsc::UnboundedSender<Change>,
) -> Result<(), Error> {
    let mut pending = None;
    while let Some(run) = scope.next_run().await {
        shared.unsync(&remote.name, &plan.watch);
        let Some(client) = client_for(&remote, &shared.probes, &run, &mut pending).await else {
            continue;
        };
        let mut caches = JoinSet::new();
        for spec in &plan.watch {
            let cache = Cache {
                remote: remote.name.clone(),
                spec: spec.clone(),
                client: client.clone(),
                shared: Arc::clone(&shared),
                changes: changes.clone(),
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
                    Err(source) if source.is_panic() => Error::WatchPanicked { remote: remote.name, source },
                    _ => Error::WatchEnded { remote: remote.name },
                });
            }
        }
        while caches.join_next().await.is_some() {}
        shared.unsync(&remote.name, &plan.watch);
    }
    Ok(())
}

impl ManagerFactory for WatchManager {
    fn remotes(&self) -> UsedRemotes {
        let plan = lock(&self.shared.plan);
        UsedRemotes::Only(
            used(&plan)
                .iter()
                .map(|remote| {
                    if remote.required {
                        UsedRemote::ends_cycle(&remote.name)
                    } else {
                        UsedRemote::restarts_alone(&remote.name)
                    }
                })
                .collect(),
        )
    }

    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        let plan = Arc::clone(&lock(&shared.plan));
        shared.reset_caches(&plan);

        // A remote without a scope was added after the supervisor asked which
        // remotes this cycle uses; the reload that added it ends this cycle.
        let parts: Vec<(&ResolvedRemote, RemoteScope)> = used(&plan)
            .iter()
            .filter_map(|remote| cycle.scope(&remote.name).map(|scope| (remote, scope)))
            .collect();
        let mut required: BTreeMap<(String, String), bool> = parts
            .iter()
            .filter(|(remote, _)| remote.required)
            .flat_map(|(remote, _)| {
                plan.watch
                    .iter()
                    .map(|spec| ((remote.name.clone(), spec.resource_label()), false))
            })
            .collect();
        let (changes_tx, mut changes) = mpsc::unbounded_channel();
        let mut remotes = JoinSet::new();
        for (remote, scope) in parts {
            remotes.spawn(run_remote(
                remote.clone(),
                Arc::clone(&plan),
                scope,
                Arc::clone(shared),
                changes_tx.clone(),
            ));
        }
        drop(changes_tx);

        let mut up = required.is_empty();
        cycle.set_manager_up(up);
        let result = loop {
            tokio::select! {
                biased;
                () = cycle.cancelled() => break Ok(()),
                Some(change) = changes.recv() => {
                    if let Some(current) = required.get_mut(&change.cache) {
                        *current = change.current;
                    }
                    let now = required.values().all(|current| *current);
                    if now != up && cycle.set_manager_up(now) {
                        up = now;
                        if up {
                            info!(cycle = cycle.number(), caches = required.len(), "manager up: every required cache synced");
                        } else {
                            let (remote, resource) = &change.cache;
                            warn!(cycle = cycle.number(), %remote, %resource, "manager down: a required cache is no longer current");
                        }
                    }
                }
                Some(ended) = remotes.join_next() => match ended {
                    // Its scope ended with the cycle; the next turn sees it.
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => break Err(ManagerError::failed(err)),
                    Err(join) => break Err(ManagerError::failed(join)),
                },
            }
        };
        if result.is_err() {
            remotes.shutdown().await;
        }
        // No task outlives its cycle: every part ends with its scope's runs.
        while remotes.join_next().await.is_some() {}
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
