//! The built-in watch manager: one per cycle, a reflector per remote and per
//! watched resource type.
//!
//! # Invariants
//!
//! - Every task the manager starts belongs to its cycle, and is aborted and
//!   awaited before `run` returns: no task outlives its cycle.
//! - The manager reports itself up once every cache of every *required*
//!   remote has synced in this cycle, and `tether_watch_synced` is reset to 0
//!   when a cycle starts.
//! - It ends its cycle with `remote_lost` when a remote it uses becomes
//!   unreachable during the cycle, and with `remote_recovered` when one comes
//!   back (if configured).
//! - Remotes and watch types are read afresh at each cycle's start, so a
//!   reload takes effect in the next cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use prometheus::{IntGaugeVec, Opts, Registry};
use tether_probes::{CycleEnd, ProbeSetHandle, next_cycle_end};
use tether_supervisor::{Cause, CycleToken, ManagerError, ManagerFactory};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::WatchSpec;

/// A remote as the manager uses it.
#[derive(Clone)]
pub struct ManagedRemote {
    /// The configured name.
    pub name: String,
    /// Whether its caches gate readiness.
    pub required: bool,
    /// Its connection settings (credentials included; never logged).
    pub config: kube::Config,
}

impl std::fmt::Debug for ManagedRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRemote")
            .field("name", &self.name)
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// The state of one cache in the current cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheState {
    /// Whether its initial list completed this cycle.
    pub synced: bool,
    /// Objects in the cache.
    pub objects: usize,
}

/// Caches by `(remote, resource)`.
pub type Caches = BTreeMap<(String, String), CacheState>;

#[derive(Debug)]
struct Plan {
    remotes: Vec<ManagedRemote>,
    watch: Vec<WatchSpec>,
}

#[derive(Debug)]
struct Shared {
    plan: Mutex<Arc<Plan>>,
    caches: Mutex<Caches>,
    current: Mutex<Option<CycleToken>>,
    probes: ProbeSetHandle,
    rebuild_on_recovery: bool,
    objects: IntGaugeVec,
    synced: IntGaugeVec,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only assign; a poisoned value is whole.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn set_cache(&self, remote: &str, resource: &str, state: CacheState) {
        lock(&self.caches).insert((remote.to_owned(), resource.to_owned()), state);
        self.synced
            .with_label_values(&[remote, resource])
            .set(i64::from(state.synced));
        self.objects
            .with_label_values(&[remote, resource])
            .set(i64::try_from(state.objects).unwrap_or(i64::MAX));
    }

    /// Resets the caches for a new plan: series of pairs no longer planned are
    /// deleted, the rest start unsynced.
    fn reset_caches(&self, plan: &Plan) {
        let wanted: BTreeSet<(String, String)> = plan
            .remotes
            .iter()
            .flat_map(|r| {
                plan.watch
                    .iter()
                    .map(|w| (r.name.clone(), w.resource_label()))
            })
            .collect();
        let mut caches = lock(&self.caches);
        caches.retain(|(remote, resource), _| {
            let keep = wanted.contains(&(remote.clone(), resource.clone()));
            if !keep {
                let _ = self.synced.remove_label_values(&[remote, resource]);
                let _ = self.objects.remove_label_values(&[remote, resource]);
            }
            keep
        });
        for (remote, resource) in wanted {
            let state = caches
                .entry((remote.clone(), resource.clone()))
                .or_default();
            state.synced = false;
            self.synced.with_label_values(&[&remote, &resource]).set(0);
            self.objects
                .with_label_values(&[&remote, &resource])
                .set(i64::try_from(state.objects).unwrap_or(i64::MAX));
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
    /// A manager over `remotes` and `watch`, its metrics in `registry`.
    ///
    /// # Errors
    ///
    /// If the metric names are already registered.
    pub fn new(
        registry: &Registry,
        probes: ProbeSetHandle,
        remotes: Vec<ManagedRemote>,
        watch: Vec<WatchSpec>,
        rebuild_on_recovery: bool,
    ) -> prometheus::Result<Self> {
        let objects = IntGaugeVec::new(
            Opts::new("tether_watch_objects", "Objects in the manager's cache."),
            &["remote", "resource"],
        )?;
        let synced = IntGaugeVec::new(
            Opts::new(
                "tether_watch_synced",
                "1 when that cache has synced this cycle.",
            ),
            &["remote", "resource"],
        )?;
        registry.register(Box::new(objects.clone()))?;
        registry.register(Box::new(synced.clone()))?;
        let shared = Arc::new(Shared {
            plan: Mutex::new(Arc::new(Plan { remotes, watch })),
            caches: Mutex::default(),
            current: Mutex::default(),
            probes,
            rebuild_on_recovery,
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
    /// Replaces the remotes and watch types; the next cycle uses them.
    pub fn update(&self, remotes: Vec<ManagedRemote>, watch: Vec<WatchSpec>) {
        *lock(&self.shared.plan) = Arc::new(Plan { remotes, watch });
    }

    /// Ends the running cycle with `cause`, if one runs.
    pub fn end_cycle(&self, cause: Cause) {
        if let Some(cycle) = lock(&self.shared.current).as_ref() {
            cycle.cancel(cause);
        }
    }

    /// The caches as they are now.
    #[must_use]
    pub fn caches(&self) -> Caches {
        lock(&self.shared.caches).clone()
    }

    /// The names of required remotes.
    #[must_use]
    pub fn required(&self) -> BTreeSet<String> {
        lock(&self.shared.plan)
            .remotes
            .iter()
            .filter(|r| r.required)
            .map(|r| r.name.clone())
            .collect()
    }
}

/// Ends `cycle` when a remote for which `uses` is true is lost, or recovers
/// (with `rebuild_on_recovery`); returns once the cycle is cancelled for any
/// reason. Subscribe before the cycle's work starts, so that only
/// transitions during the cycle count.
///
/// # Cancellation safety
///
/// Cancel safe: it only reads transitions and cancels the cycle.
pub async fn end_cycle_on_transitions(
    cycle: &CycleToken,
    transitions: &mut tokio::sync::broadcast::Receiver<tether_probes::Transition>,
    uses: impl Fn(&str) -> bool,
    rebuild_on_recovery: bool,
) {
    tokio::select! {
        () = cycle.cancelled() => {}
        end = next_cycle_end(transitions, uses, rebuild_on_recovery) => match end {
            Some(CycleEnd::Lost(remote)) => { cycle.cancel(Cause::remote_lost(remote)); }
            Some(CycleEnd::Recovered(remote)) => { cycle.cancel(Cause::remote_recovered(remote)); }
            // The probe set is gone: nothing more will end the cycle from there.
            None => cycle.cancelled().await,
        },
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

/// Runs one reflector until `stop`, keeping its cache state current.
async fn reflect(
    client: kube::Client,
    remote: String,
    spec: WatchSpec,
    shared: Arc<Shared>,
    synced_tx: mpsc::UnboundedSender<(String, String)>,
    stop: CancellationToken,
) {
    let resource = spec.resource_label();
    let ar = api_resource(&spec);
    let api: Api<DynamicObject> = match &spec.namespace {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let mut config = watcher::Config::default();
    if let Some(selector) = &spec.label_selector {
        config = config.labels(selector);
    }
    let writer = Writer::new(ar);
    let reader = writer.as_reader();
    let stream = reflector(writer, watcher(api, config)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut state = CacheState::default();
    let mut failing = false;
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            None => return,
            Some(Ok(event)) => {
                if failing {
                    info!(%remote, %resource, "watch works again");
                    failing = false;
                }
                state.objects = reader.len();
                if matches!(event, watcher::Event::InitDone) && !state.synced {
                    state.synced = true;
                    debug!(%remote, %resource, objects = state.objects, "cache synced");
                    let _ = synced_tx.send((remote.clone(), resource.clone()));
                }
                shared.set_cache(&remote, &resource, state);
            }
            Some(Err(err)) => {
                // The probes report a lost remote once, classified; the
                // watcher retries with kube's backoff meanwhile.
                if !failing {
                    warn!(%remote, %resource, error = %tether_probes::root_cause(&err), "watch failing; retrying with backoff");
                    failing = true;
                }
            }
        }
    }
}

impl ManagerFactory for WatchManager {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let shared = &self.shared;
        let plan = Arc::clone(&lock(&shared.plan));
        *lock(&shared.current) = Some(cycle.clone());
        shared.reset_caches(&plan);
        // Subscribe first: only transitions during this cycle end it.
        let mut transitions = shared.probes.subscribe();

        let (synced_tx, mut synced_rx) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        let mut required = BTreeSet::new();
        // With nothing to watch, no remote is used: no client is built, and
        // no remote's transitions end the cycle.
        let used = if plan.watch.is_empty() {
            &[][..]
        } else {
            &plan.remotes[..]
        };
        for remote in used {
            let client = kube::Client::try_from(remote.config.clone()).map_err(|err| {
                ManagerError::build(format!(
                    "remote {}: {}",
                    remote.name,
                    tether_probes::root_cause(&err)
                ))
            })?;
            for spec in &plan.watch {
                if remote.required {
                    required.insert((remote.name.clone(), spec.resource_label()));
                }
                tasks.spawn(reflect(
                    client.clone(),
                    remote.name.clone(),
                    spec.clone(),
                    Arc::clone(shared),
                    synced_tx.clone(),
                    cycle.child_token(),
                ));
            }
        }
        drop(synced_tx);
        if required.is_empty() {
            cycle.set_manager_up(true);
        }

        let names: BTreeSet<String> = used.iter().map(|r| r.name.clone()).collect();
        let ends = end_cycle_on_transitions(
            &cycle,
            &mut transitions,
            |r| names.contains(r),
            shared.rebuild_on_recovery,
        );
        let mut ends = std::pin::pin!(ends);
        let mut synced = BTreeSet::new();
        let result = loop {
            tokio::select! {
                () = &mut ends => break Ok(()),
                Some(pair) = synced_rx.recv() => {
                    synced.insert(pair);
                    if required.is_subset(&synced) && cycle.set_manager_up(true) {
                        info!(cycle = cycle.number(), caches = synced.len(), "manager up: every required cache synced");
                    }
                }
                Some(ended) = tasks.join_next() => {
                    // A reflector only ends when stopped; anything else is a bug.
                    let why = match ended {
                        Err(err) if err.is_panic() => "a watch task panicked".to_owned(),
                        _ => "a watch task ended unexpectedly".to_owned(),
                    };
                    break Err(ManagerError::failed(why));
                }
            }
        };
        // No task outlives its cycle.
        tasks.shutdown().await;
        *lock(&shared.current) = None;
        result
    }
}
