//! The daemon: wires config, probes, the manager, the supervisor and the
//! admin server together, and handles signals and reloads.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use tether_probes::{ProbeSet, ProbeSetHandle};
use tether_supervisor::{BoxError, Cause, ShutdownOutcome, Supervisor, SupervisorHandle};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::admin::{self, Admin, Heartbeats, Sources};
use crate::config::remote::{self, ResolvedRemote};
use crate::config::sources::{self, Role};
use crate::config::{Config, ConfigError, Plan};
use crate::events::{Events, Publisher, Reason};
use crate::lease::election::{self, Election, ElectionHandle};
use crate::lease::shard::{ShardHandle, Sharding};
use crate::managers::{self, exec};

/// Why the daemon could not start. Nothing is left running.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is bad (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The admin address cannot be bound.
    #[error("cannot listen on the admin address {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Metrics, probes or the supervisor could not be set up.
    #[error("setting up the {what} failed")]
    Setup {
        /// What was being set up.
        what: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// How often the config file is checked for changes. ConfigMap mounts swap a
/// symlink, which inotify on the file misses, so poll the content instead.
const CONFIG_POLL: Duration = Duration::from_secs(2);

/// How many of the remotes' files a sweep may `stat` a second, on average:
/// at 10,000 remotes of three files each a sweep every 2 s took 2.7% of a
/// core; at this pace it runs every 15 s and takes a tenth of that.
const SWEEP_FILES_PER_SECOND: f64 = 2_000.0;

/// How long after a sweep of the remotes' files the next one runs: every
/// [`CONFIG_POLL`], or less often past [`SWEEP_FILES_PER_SECOND`]. A probe
/// that fails as a rotation would asks for its own files at once, so a
/// slower sweep only delays a rotation that broke nothing yet.
fn sweep_every(files: usize) -> Duration {
    #[allow(clippy::cast_precision_loss)] // a count of files, far below 2^52
    let pace = Duration::from_secs_f64(files as f64 / SWEEP_FILES_PER_SECOND);
    pace.max(CONFIG_POLL)
}

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    /// The supervisor's state.
    pub supervisor: SupervisorHandle,
    /// The probes' state.
    pub probes: ProbeSetHandle,
    /// The manager.
    pub manager: managers::Handle,
    /// The leader election, when on.
    pub election: Option<ElectionHandle>,
    /// The admin server's address.
    pub admin_address: SocketAddr,
    /// What the admin server shows: `/status` as a value.
    pub admin: Arc<Admin>,
    config: Config,
    probe_set: ProbeSet,
    root: CancellationToken,
    draining: Arc<AtomicBool>,
    reloads: IntCounterVec,
    run: JoinHandle<ShutdownOutcome>,
    admin_stop: CancellationToken,
    /// The election's task, its stop, and the election, for the release.
    elected: Option<(Arc<Election>, CancellationToken, JoinHandle<()>)>,
    /// Every configured remote, resolved; with sharding, the manager and
    /// the probes get the ones this replica holds.
    resolved: Vec<ResolvedRemote>,
    /// The sharding, when on.
    sharded: Option<Sharded>,
    /// Probes asking to have their remotes' files re-read (a TLS failure or
    /// a 401), each with where to say it was done; taken by the run loop.
    rechecks: Option<tokio::sync::mpsc::Receiver<Recheck>>,
    /// Events on tether's own Pod, when it runs in one.
    events: Option<EventsRunning>,
}

/// The Events on tether's Pod: where to send them, and the task that
/// records each cycle's end and leadership change.
#[derive(Debug)]
struct EventsRunning {
    events: Events,
    stop: CancellationToken,
    task: JoinHandle<()>,
    publisher: Publisher,
}

impl EventsRunning {
    fn spawn(
        events: Events,
        publisher: Publisher,
        supervisor: &SupervisorHandle,
        election: Option<&ElectionHandle>,
    ) -> Self {
        let watching = events.clone();
        let (supervisor, election) = (supervisor.clone(), election.cloned());
        let (stop, task) = spawn_until(|stop| watching.watch(supervisor, election, stop));
        Self {
            events,
            stop,
            task,
            publisher,
        }
    }

    /// Records what the shutdown ended (the last cycle, the leadership),
    /// then waits a moment for it to be sent.
    async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
        drop(self.events);
        self.publisher.flush().await;
    }
}

/// Events on tether's Pod, when it runs in one (`POD_NAME` and
/// `POD_NAMESPACE` from the downward API): sent to the home cluster, the
/// leader election's kubeconfig or in-cluster. Without a client, a warning
/// and no Events; tether runs on.
async fn start_events(config: &Config, registry: &Registry) -> Option<(Events, Publisher)> {
    let pod = crate::events::own_pod()?;
    let kubeconfig = config
        .leader_election
        .as_ref()
        .and_then(|spec| spec.kubeconfig.clone());
    let client = crate::lease::home_client(kubeconfig.as_deref(), Duration::from_secs(5))
        .await
        .map(|(client, _)| client)
        .map_err(|err| tether_supervisor::error_chain(&err));
    match client.map(|client| Events::start(client, pod, registry)) {
        Ok(Ok(started)) => Some(started),
        Ok(Err(err)) => {
            warn!(error = %err, "cannot count Events; none are recorded");
            None
        }
        Err(error) => {
            warn!(%error, "no client for the home cluster; no Events are recorded on tether's Pod");
            None
        }
    }
}

/// A probe's ask to re-read its remotes' files, and where to say it is done.
type Recheck = (Vec<String>, tokio::sync::oneshot::Sender<()>);

/// How many probes' asks to re-read their files may wait at once; a probe
/// that finds no room counts its failure as it would have anyway.
const RECHECKS_WAITING: usize = 64;

/// Lets `probes` ask the daemon to re-read a remote's files before a
/// failure that rotated credentials explain is counted; the daemon's run
/// loop answers through the receiver.
fn rechecks(probes: &ProbeSet) -> tokio::sync::mpsc::Receiver<Recheck> {
    let (asks, asked) = tokio::sync::mpsc::channel::<Recheck>(RECHECKS_WAITING);
    probes.recheck_with(Arc::new(move |names| {
        let asks = asks.clone();
        Box::pin(async move {
            let (done, wait) = tokio::sync::oneshot::channel();
            if asks.try_send((names, done)).is_ok() {
                let _ = wait.await;
            }
        })
    }));
    asked
}

/// The running sharding, as the daemon drives it.
#[derive(Debug)]
struct Sharded {
    handle: ShardHandle,
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// The supervisor's gate: open while this replica holds a remote. A
    /// replica with no share runs no manager (an exec child included) and
    /// stands by.
    gate: tokio::sync::watch::Sender<bool>,
}

impl Sharded {
    fn run(
        sharding: Sharding,
        handle: ShardHandle,
        gate: tokio::sync::watch::Sender<bool>,
    ) -> Self {
        let (stop, task) = spawn_until(|stop| sharding.run(stop));
        Self {
            handle,
            stop,
            task,
            gate,
        }
    }
}

/// The probes of `running`, their metrics in `registry`.
fn new_probes(
    config: &Config,
    registry: &Registry,
    running: &[ResolvedRemote],
) -> Result<ProbeSet, StartError> {
    let probe_set = ProbeSet::new(config.probe.clone(), registry).map_err(setup("probes"))?;
    probe_set
        .sync(&remote::probed(running))
        .map_err(setup("probes"))?;
    Ok(probe_set)
}

/// The admin server's listener on `addr`, and the address it got.
async fn listen(addr: SocketAddr) -> Result<(admin::Listener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind { addr, source };
    let listener = admin::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// `supervisor`, building cycles only on the leader (`election`), or, with
/// sharding, only while this replica holds a remote; the sharding's gate,
/// open at first if it `holds_any`.
fn gated(
    supervisor: Supervisor<managers::Manager>,
    election: Option<&ElectionHandle>,
    sharded: bool,
    holds_any: bool,
) -> (
    Supervisor<managers::Manager>,
    tokio::sync::watch::Sender<bool>,
) {
    let (shard_gate, open) = tokio::sync::watch::channel(holds_any);
    let supervisor = match election {
        Some(election) => supervisor.build_while(election.gate()),
        None if sharded => supervisor.build_while(open),
        None => supervisor,
    };
    (supervisor, shard_gate)
}

/// `tether_config_reloads_total`, both results exported from the start.
fn reload_counter(registry: &Registry) -> prometheus::Result<IntCounterVec> {
    let reloads = IntCounterVec::new(
        Opts::new(
            "tether_config_reloads_total",
            "Config reloads, by result (applied or rejected).",
        ),
        &["result"],
    )?;
    for result in ["applied", "rejected"] {
        reloads.with_label_values(&[result]);
    }
    registry.register(Box::new(reloads.clone()))?;
    Ok(reloads)
}

/// The leader election `config` asks for, if any. A Lease namespace that
/// cannot be known is a config error.
async fn start_election(
    config: &Config,
    registry: &Registry,
) -> Result<Option<Arc<Election>>, StartError> {
    let Some(spec) = config
        .leader_election
        .as_ref()
        .filter(|_| config.sharding.is_none())
    else {
        return Ok(None);
    };
    let election = Election::new(spec.clone(), registry)
        .await
        .map_err(lease_error(config, "leader election"))?;
    Ok(Some(Arc::new(election)))
}

/// A Lease setup error. What the config decides (the Lease's namespace, the
/// cluster that holds it, its kubeconfig) is the config's, exit 2;
/// anything else is a setup failure.
fn lease_error(config: &Config, what: &'static str) -> impl Fn(election::Error) -> StartError {
    let file = config.label();
    move |err| {
        let config_error = |field: &str| {
            StartError::Config(ConfigError::new(
                &file,
                field,
                tether_supervisor::error_chain(&err),
            ))
        };
        match &err {
            election::Error::NoNamespace => config_error("leaderElection.leaseNamespace"),
            election::Error::Kubeconfig(_) => config_error("leaderElection.kubeconfig"),
            election::Error::Infer(_) => config_error("leaderElection"),
            _ => StartError::Setup {
                what,
                source: err.into(),
            },
        }
    }
}

/// The exec manager's command, if it is one, must be a program that can be
/// run.
fn exec_command(config: &Config) -> Result<(), StartError> {
    let Some(exec) = &config.exec else {
        return Ok(());
    };
    exec::find_command(exec).map(drop).map_err(|err| {
        StartError::Config(ConfigError::new(
            &config.label(),
            "manager.exec.command",
            err.to_string(),
        ))
    })
}

/// Checks what `run` needs beyond the config file itself, without starting
/// anything: the client of the leader election's (or sharding's) Lease, and
/// the exec manager's command. `validate` and `check` run it; so does
/// [`Daemon::start`], first.
///
/// # Errors
///
/// [`StartError::Config`] naming the field; [`StartError::Setup`] for
/// anything else.
pub async fn preflight(config: &Config) -> Result<(), StartError> {
    exec_command(config)?;
    if let Some(spec) = &config.leader_election {
        let what = if config.sharding.is_some() {
            "sharding"
        } else {
            "leader election"
        };
        crate::lease::Leases::new(spec)
            .await
            .map_err(lease_error(config, what))?;
    }
    Ok(())
}

/// Spawns what `run` makes of a new stop token; returns the token and the
/// task.
fn spawn_until<F>(run: impl FnOnce(CancellationToken) -> F) -> (CancellationToken, JoinHandle<()>)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(stop.clone()));
    (stop, task)
}

/// Runs `election` until its stop token: the election, the token and the
/// task, for the release at shutdown.
fn run_election(election: Arc<Election>) -> (Arc<Election>, CancellationToken, JoinHandle<()>) {
    let (stop, task) = spawn_until(|stop| {
        let election = Arc::clone(&election);
        async move { election.run(stop).await }
    });
    (election, stop, task)
}

/// The process's registry, with the process collector and the reload
/// counter in it.
fn new_registry() -> Result<(Registry, IntCounterVec), StartError> {
    let registry = Registry::new();
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .map_err(setup("process metrics"))?;
    let reloads = reload_counter(&registry).map_err(setup("reload metrics"))?;
    Ok((registry, reloads))
}

/// The sharding `config` asks for, if any, not yet running.
async fn new_sharding(
    config: &Config,
    registry: &Registry,
) -> Result<Option<Sharding>, StartError> {
    let (Some(sharding), Some(election)) = (&config.sharding, &config.leader_election) else {
        return Ok(None);
    };
    Sharding::new(election.clone(), sharding, registry)
        .await
        .map(Some)
        .map_err(lease_error(config, "sharding"))
}

/// The remotes of `resolved` that `shard` lets this replica run: all of
/// them without sharding.
fn held(resolved: &[ResolvedRemote], shard: Option<&ShardHandle>) -> Vec<ResolvedRemote> {
    match shard {
        None => resolved.to_vec(),
        Some(shard) => {
            let holding = shard.holding();
            let names = holding.borrow();
            resolved
                .iter()
                .filter(|r| names.contains(&r.name))
                .cloned()
                .collect()
        }
    }
}

fn setup<E: Into<BoxError>>(what: &'static str) -> impl Fn(E) -> StartError {
    move |err| StartError::Setup {
        what,
        source: err.into(),
    }
}

impl Daemon {
    /// Starts everything, or nothing.
    ///
    /// # Errors
    ///
    /// [`StartError`]; the process should exit 2 for a config error, and
    /// non-zero otherwise.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        let remotes = remote::resolve(&config).await?;
        exec_command(&config)?;
        // Bind first: never run without health endpoints.
        let (listener, admin_address) = listen(config.admin_address).await?;

        let (registry, reloads) = new_registry()?;

        // With sharding, this replica runs only what it holds: nothing
        // until its first round among the members.
        let sharding = new_sharding(&config, &registry).await?;
        let shard = sharding.as_ref().map(Sharding::handle);
        if let Some(shard) = &shard {
            shard.set_remotes(remote::keys(&remotes));
        }
        let running = held(&remotes, shard.as_ref());
        let holds_any = !running.is_empty();
        let probe_set = new_probes(&config, &registry, &running)?;
        let probes = probe_set.handle();
        let (manager, manager_handle) = managers::build(
            Plan::new(&config, running),
            &registry,
            &probes,
            config.probe.detection_bound(),
        )
        .map_err(setup("manager"))?;
        let election = start_election(&config, &registry).await?;
        let election_handle = election.as_ref().map(|e| e.handle());
        let supervisor = Supervisor::new(manager, config.supervisor, &registry)
            .map_err(setup("supervisor"))?
            .end_cycles_on(probes.signals());
        let (supervisor, shard_gate) = gated(
            supervisor,
            election_handle.as_ref(),
            shard.is_some(),
            holds_any,
        );
        let supervisor_handle = supervisor.handle();
        let draining = Arc::new(AtomicBool::new(false));
        let sources = Sources {
            supervisor: supervisor_handle.clone(),
            probes: probes.clone(),
            manager: Arc::new(manager_handle.clone()),
            election: election_handle.clone(),
            shard: shard.clone(),
            draining: Arc::clone(&draining),
        };
        let heartbeats = Heartbeats {
            probes: config.probe.interval,
            supervisor: config.supervisor.heartbeat,
        };
        let admin =
            Admin::new(registry.clone(), sources, heartbeats).map_err(setup("admin metrics"))?;

        let root = CancellationToken::new();
        let admin_stop = CancellationToken::new();
        let admin = Arc::new(admin);
        tokio::spawn(admin::serve(
            listener,
            Arc::clone(&admin),
            admin_stop.clone(),
        ));
        let run = tokio::spawn(supervisor.run(root.clone()));
        let elected = election.map(run_election);
        let sharded = sharding
            .zip(shard)
            .map(|(sharding, handle)| Sharded::run(sharding, handle, shard_gate));
        let events = start_events(&config, &registry)
            .await
            .map(|(events, publisher)| {
                EventsRunning::spawn(
                    events,
                    publisher,
                    &supervisor_handle,
                    election_handle.as_ref(),
                )
            });
        info!(
            admin = %admin_address,
            remotes = config.remotes.len(),
            config = %config.label(),
            "tether started"
        );
        Ok(Self {
            supervisor: supervisor_handle,
            probes,
            manager: manager_handle,
            election: election_handle,
            admin_address,
            admin,
            config,
            rechecks: Some(rechecks(&probe_set)),
            probe_set,
            root,
            draining,
            reloads,
            run,
            admin_stop,
            elected,
            resolved: remotes,
            sharded,
            events,
        })
    }

    /// Reads the config file again and applies it, or rejects it and keeps
    /// the last good one. Returns whether it was applied.
    pub async fn reload(&mut self) -> bool {
        let Some(path) = self.config.file.clone() else {
            info!("reload asked, but tether runs without a config file; nothing to do");
            return false;
        };
        match self.try_reload(&path).await {
            Ok(()) => {
                self.reloads.with_label_values(&["applied"]).inc();
                true
            }
            Err(err) => {
                self.reloads.with_label_values(&["rejected"]).inc();
                error!(error = %err, "config reload rejected; still running on the last good config");
                false
            }
        }
    }

    async fn try_reload(&mut self, path: &Path) -> Result<(), ConfigError> {
        let (next, restart) = Config::reload(path, &self.config)?;
        let next = next.with_command(self.config.command_line.clone())?;
        if next.exec.is_some() != self.config.exec.is_some() {
            return Err(ConfigError::new(
                &next.label(),
                "manager.exec",
                "switching between the built-in watch manager and the exec manager takes a restart",
            ));
        }
        let mut remotes = remote::resolve(&next).await?;
        for remote in &mut remotes {
            let Some(old) = self.resolved.iter().find(|old| old.name == remote.name) else {
                continue;
            };
            let changed: Vec<Role> = remote
                .files
                .iter()
                .filter(|file| !old.files.iter().any(|o| o.same_as(file)))
                .map(sources::SourceFile::role)
                .collect();
            if changed.is_empty() && old.source == remote.source {
                // The same settings: its probe keeps its client and
                // connection.
                remote.config = Arc::clone(&old.config);
            } else if changed.is_empty() {
                info!(remote = %remote.name, "its settings in the config changed; client rebuilt");
            } else {
                info!(remote = %remote.name, "{} changed; client rebuilt", sources::shown(&changed));
            }
        }
        self.sync_remotes(&remotes, &next).map_err(|err| {
            ConfigError::new(
                &next.label(),
                "remotes",
                tether_supervisor::error_chain(&err),
            )
        })?;
        for section in restart {
            warn!(
                section,
                "this section changed, and takes effect only after a restart; the running one stays"
            );
        }
        self.resolved = remotes;
        let ended = self.supervisor.end_cycle(Cause::ConfigChanged);
        info!(
            remotes = next.remotes.len(),
            config = %next.label(),
            "config reloaded and applied{}",
            if ended { "; the cycle ends" } else { "; the next cycle runs it" }
        );
        self.config = next;
        Ok(())
    }

    /// Probes, and plans for the manager's next cycle, the remotes of
    /// `remotes` this replica holds.
    fn sync_remotes(
        &self,
        remotes: &[ResolvedRemote],
        config: &Config,
    ) -> tether_probes::Result<()> {
        let shard = self.sharded.as_ref().map(|s| &s.handle);
        if let Some(shard) = shard {
            shard.set_remotes(remote::keys(remotes));
        }
        let running = held(remotes, shard);
        self.probe_set.sync(&remote::probed(&running))?;
        self.manager.update(Plan::new(config, running));
        Ok(())
    }

    /// Re-reads the files of the remotes named (every remote, with `None`)
    /// and rebuilds the client of each whose files changed: its probe's
    /// now, the manager's in the next cycle. Other remotes keep theirs.
    ///
    /// A token file alone leaves the cycle running: the manager's clients
    /// re-read it by themselves, as client-go does. Any other file ends the
    /// cycle (`config_changed`): its clients hold the old CA, certificate or
    /// kubeconfig. A change that does not load is logged once, and the
    /// remote keeps its last good settings.
    async fn refresh_remotes(&mut self, only: Option<&[String]>) {
        let mut ends_cycle = false;
        let mut rebuilt = 0;
        for (index, roles) in self.changed_files(only).await {
            let Some(spec) = self.config.remotes.get(index) else {
                continue;
            };
            let what = sources::shown(&roles);
            match remote::resolve_one(&self.config, index, spec).await {
                Ok(fresh) => {
                    info!(remote = %spec.name, "{what} changed; client rebuilt");
                    self.resolved[index] = fresh;
                    ends_cycle |= roles.iter().any(|r| *r != Role::TokenFile);
                    rebuilt += 1;
                }
                Err(err) => {
                    error!(remote = %spec.name, error = %err, "{what} changed, but cannot be used; the remote keeps its last good settings");
                }
            }
        }
        if rebuilt == 0 {
            return;
        }
        if let Err(err) = self.sync_remotes(&self.resolved, &self.config) {
            // The same names and URLs as before: this cannot fail, but if it
            // did, the probes keep what they had.
            error!(error = %err, "applying the rebuilt clients failed");
            return;
        }
        if ends_cycle && self.supervisor.end_cycle(Cause::ConfigChanged) {
            info!(
                rebuilt,
                "the cycle ends, so that the manager's clients use the new files"
            );
        }
    }

    /// The remotes (those named, or every one) whose files changed, by
    /// index, with what changed. The `stat` calls run off the async
    /// workers: at thousands of remotes a sweep is tens of thousands.
    async fn changed_files(&mut self, only: Option<&[String]>) -> Vec<(usize, Vec<Role>)> {
        let files: Vec<(usize, Vec<sources::SourceFile>)> = self
            .resolved
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| only.is_none_or(|names| names.contains(&r.name)))
            .map(|(index, r)| (index, std::mem::take(&mut r.files)))
            .collect();
        let swept = tokio::task::spawn_blocking(move || {
            let mut files = files;
            let changed: Vec<(usize, Vec<Role>)> = files
                .iter_mut()
                .map(|(index, files)| (*index, sources::changed(files)))
                .filter(|(_, roles)| !roles.is_empty())
                .collect();
            (files, changed)
        })
        .await;
        match swept {
            Ok((files, changed)) => {
                for (index, files) in files {
                    self.resolved[index].files = files;
                }
                changed
            }
            Err(err) => {
                // Only a panic in `stat` could get here; the next reload
                // reads the files again.
                error!(error = %err, "checking the remotes' files failed; they are watched again after the next reload");
                Vec::new()
            }
        }
    }

    /// Runs what the sharding now lets this replica hold: the probes and
    /// the manager's plan follow, and the running cycle ends
    /// (`shard_changed`). Once that cycle's manager has returned, the
    /// sharding hears the remotes given up are let go.
    fn apply_holding(&mut self) {
        let Some(Sharded {
            handle: shard,
            gate,
            ..
        }) = &self.sharded
        else {
            return;
        };
        let running = held(&self.resolved, Some(shard));
        let before: std::collections::BTreeSet<String> =
            self.probes.status().into_iter().map(|r| r.name).collect();
        let now: std::collections::BTreeSet<String> =
            running.iter().map(|r| r.name.clone()).collect();
        if now == before {
            shard.applied(now);
            return;
        }
        if let Err(err) = self.probe_set.sync(&remote::probed(&running)) {
            // The remotes were resolved and synced before; a subset cannot
            // fail, but if it did, the old set stays probed.
            error!(error = %err, "applying this replica's share failed");
            return;
        }
        self.manager.update(Plan::new(&self.config, running));
        let cycle = self.supervisor.status().cycle;
        let ended = self.supervisor.end_cycle(Cause::ShardChanged {
            taken: now.difference(&before).count(),
            given_up: before.difference(&now).count(),
        });
        // After the cause is recorded: a gate closing mid-cycle would end it
        // as `leadership_lost`.
        gate.send_replace(!now.is_empty());
        info!(
            holds = now.len(),
            taken = now.difference(&before).count(),
            given_up = before.difference(&now).count(),
            "this replica's remotes changed"
        );
        if let Some(events) = &self.events {
            events.events.record(
                Reason::ShardChanged,
                &format!(
                    "this replica now holds {} remote(s): took {}, gave up {}",
                    now.len(),
                    now.difference(&before).count(),
                    before.difference(&now).count()
                ),
            );
        }
        let supervisor = self.supervisor.clone();
        let shard = shard.clone();
        tokio::spawn(async move {
            // The cycle that ran the old set ends when its manager returns
            // (within the shutdown grace); then nothing runs the remotes
            // given up.
            if ended {
                supervisor.ended(cycle).await;
            }
            shard.applied(now);
        });
    }

    /// Drains and shuts down: `/readyz` answers 503 at once, root is
    /// cancelled, and the manager gets its grace period. The admin server
    /// keeps answering (`/readyz` 503) for at least `admin.drainWindow`
    /// after the drain began, so a kubelet or a load balancer sees it.
    pub async fn shutdown(self) -> ShutdownOutcome {
        self.draining.store(true, Ordering::SeqCst);
        let drained = tokio::time::Instant::now() + self.config.drain_window;
        info!(window = ?self.config.drain_window, "draining: readiness off; stopping the manager");
        self.root.cancel();
        let outcome = match self.run.await {
            Ok(outcome) => outcome,
            Err(err) => {
                error!(error = %err, "the supervisor task failed");
                ShutdownOutcome::GraceExceeded
            }
        };
        // The manager has stopped: the remotes are let go, and the sharding
        // releases this replica's Lease so the others take them at once.
        if let Some(Sharded {
            handle, stop, task, ..
        }) = self.sharded
        {
            handle.applied(std::collections::BTreeSet::new());
            stop.cancel();
            let _ = task.await;
        }
        // The manager has stopped: now let another replica lead at once.
        if let Some((election, stop, task)) = self.elected {
            stop.cancel();
            let _ = task.await;
            election.release().await;
        }
        // The last cycle's end and the leadership's release, on the Pod.
        if let Some(events) = self.events {
            events.finish().await;
        }
        tokio::time::sleep_until(drained).await;
        self.admin_stop.cancel();
        info!(%outcome, "tether stopped");
        outcome
    }

    /// Runs until SIGTERM or SIGINT, reloading on SIGHUP and when the config
    /// file changes, and rebuilding a remote's client when a file its
    /// settings came from changes. Returns the exit code: 0, or 1 if the grace period ran
    /// out. A second SIGTERM or SIGINT exits at once with 130.
    pub async fn run_until_signalled(mut self, signals: Signals) -> u8 {
        let Signals {
            mut term,
            mut int,
            mut hup,
        } = signals;
        let mut poll = tokio::time::interval(CONFIG_POLL);
        let mut next_sweep = tokio::time::Instant::now();
        // Without sharding, a receiver that never changes.
        let (_never, idle) = tokio::sync::watch::channel(std::collections::BTreeSet::new());
        // A change made before this loop began is seen at its first turn.
        let mut holding = self.sharded.as_ref().map_or(idle, |s| s.handle.holding());
        let mut seen = self
            .config
            .file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok());
        // Taken once: this loop runs once.
        let mut rechecks = self
            .rechecks
            .take()
            .unwrap_or_else(|| tokio::sync::mpsc::channel(1).1);
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = hup.recv() => {
                    info!("SIGHUP: reloading the config");
                    self.reload().await;
                    seen = self.config.file.as_ref().and_then(|f| std::fs::read(f).ok());
                }
                Ok(()) = holding.changed() => self.apply_holding(),
                Some((names, done)) = rechecks.recv() => {
                    self.refresh_remotes(Some(&names)).await;
                    let _ = done.send(());
                }
                _ = poll.tick() => {
                    let now = self.config.file.as_ref().and_then(|f| std::fs::read(f).ok());
                    if now.is_some() && now != seen {
                        info!("the config file changed: reloading");
                        seen = now;
                        self.reload().await;
                    } else if tokio::time::Instant::now() >= next_sweep {
                        self.refresh_remotes(None).await;
                        let files = self.resolved.iter().map(|r| r.files.len()).sum();
                        next_sweep = tokio::time::Instant::now() + sweep_every(files);
                    }
                }
            }
        }
        let manager = self.manager.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if manager.kill_now() {
                error!("second signal: SIGKILL to the manager process, and exiting at once");
            } else {
                error!("second signal: exiting at once");
            }
            std::process::exit(130);
        });
        match self.shutdown().await {
            ShutdownOutcome::Clean => 0,
            ShutdownOutcome::GraceExceeded => 1,
        }
    }
}

/// The daemon's signal handlers: SIGTERM and SIGINT stop it, SIGHUP
/// reloads. Install them first thing, before anything slow: until a
/// handler exists, a signal takes its default action, and SIGHUP's is to
/// end the process.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers. A signal that arrives from now on waits for
    /// [`Daemon::run_until_signalled`].
    ///
    /// # Errors
    ///
    /// If a handler cannot be installed.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_every_poll_until_it_would_stat_too_many_files() {
        assert_eq!(sweep_every(0), CONFIG_POLL);
        assert_eq!(sweep_every(300), CONFIG_POLL);
        assert_eq!(sweep_every(30_000), Duration::from_secs(15));
    }
}
