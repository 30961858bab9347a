//! The daemon: wires config, probes, the manager, the supervisor and the
//! admin server together, and handles signals and reloads.
//!
//! - here: start, the run loop, and shutdown;
//! - `wiring.rs`: the pieces `start` wires (registry, probes, election,
//!   sharding, Events) and the checks it makes first;
//! - `reload.rs`: a new config, rotated files, and a new share of remotes,
//!   applied to the running daemon;
//! - `folders.rs`: the remotes' folders, watched through inotify, so that
//!   a rotated file is read when it changes;
//! - `parts.rs`: the snapshot of the supervisor, the Leases and discovery
//!   that the admin server is handed for each request.

mod folders;
mod parts;
mod reload;
mod wiring;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::IntCounterVec;
use tether_probes::ProbeSetHandle;
use tether_supervisor::{BoxError, ShutdownOutcome, Supervisor, SupervisorHandle};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::admin::{self, Admin};
use crate::config::remote::{self, ResolvedRemote};
use crate::config::{Config, ConfigError};
use crate::desired::{self, Planner, Statics};
use crate::discovery::{self, Discovery};
use crate::lease::LeaseThread;
use crate::lease::election::ElectionHandle;
use crate::lease::shard::Sharding;
use crate::managers;

use self::folders::Folders;
pub use self::parts::Parts;
use self::reload::{CONFIG_POLL, Noticed, Sweeps};
pub use self::wiring::preflight;
use self::wiring::{
    Elected, EventsRunning, Followers, Recheck, Sharded, exec_command, gated, keep_leases,
    lease_thread, listen, new_admin, new_probes, new_registry, new_sharding, rechecks, setup,
    start_election, start_events,
};

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
    /// Every configured remote, resolved, in config order, as the daemon
    /// last read them; the planner is handed each new reading.
    resolved: Vec<ResolvedRemote>,
    root: CancellationToken,
    draining: Arc<AtomicBool>,
    reloads: IntCounterVec,
    run: JoinHandle<ShutdownOutcome>,
    admin_stop: CancellationToken,
    /// The planner, what it is handed and what it publishes, and the
    /// probes', the manager's and the sharding's followers: stopped after
    /// the supervisor.
    followers: Followers,
    /// The election's task, its stop, and the election, for the release.
    elected: Option<Elected>,
    /// The home cluster's Secrets, read for remotes, when discovery is on.
    discovery: Option<Arc<Discovery>>,
    /// The sharding, when on.
    sharded: Option<Sharded>,
    /// The thread the election or the sharding runs on: kept until both
    /// are done.
    leases: Option<LeaseThread>,
    /// The folders of the remotes' files, watched.
    folders: Folders,
    /// Probes asking to have their remotes' files re-read (a TLS failure or
    /// a 401), each with where to say it was done; taken by the run loop.
    rechecks: Option<tokio::sync::mpsc::Receiver<Recheck>>,
    /// Events on tether's own Pod, when it runs in one.
    events: Option<EventsRunning>,
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
        let (listener, admin_address) = listen(config.admin_address)?;

        let (registry, reloads) = new_registry()?;
        let discovery = start_discovery(&config, &registry).await?;
        // With sharding, this replica runs only what it holds: nothing
        // until its first round among the members.
        let leases = lease_thread(&config)?;
        let sharding = new_sharding(&config, &registry, leases.as_ref()).await?;
        let shard = sharding.as_ref().map(Sharding::handle);
        let (statics, statics_rx) = tokio::sync::watch::channel(Statics {
            config: Arc::new(config.clone()),
            remotes: remote::handed(&remotes),
            reading: 0,
        });
        let (planner, desired) = Planner::new(statics_rx, discovery.clone(), shard.clone());
        let discovered = desired.borrow().all.len().saturating_sub(remotes.len());

        let probe_set = new_probes(&config, &registry, &desired.borrow().probes())?;
        let probes = probe_set.handle();
        let rechecks = rechecks(&probe_set);
        let (manager, manager_handle) = managers::build(
            desired.clone(),
            &registry,
            &probes,
            config.probe.detection_bound(),
        )
        .map_err(setup("manager"))?;
        let election = start_election(&config, &registry, leases.as_ref()).await?;
        let election_handle = election.as_ref().map(|e| e.handle());
        let supervisor = Supervisor::new(manager, config.supervisor, &registry)
            .map_err(setup("supervisor"))?
            .end_cycles_on(probes.signals())
            .end_cycles_with(desired::cycle_ends(desired.clone()))
            .change_remotes_on(desired::remote_changes(desired.clone()));
        let supervisor = gated(supervisor, election_handle.as_ref(), shard.as_ref());
        let supervisor_handle = supervisor.handle();
        let draining = Arc::new(AtomicBool::new(false));
        let parts = Parts {
            supervisor: supervisor_handle.clone(),
            draining: Arc::clone(&draining),
            election: election_handle.clone(),
            shard: shard.clone(),
            discovery: discovery.clone(),
        };
        let admin = new_admin(&config, &registry, parts, &probes, &manager_handle)?;

        let root = CancellationToken::new();
        let (admin, admin_stop) = serve_admin(listener, admin);
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
        let followers = Followers::spawn(
            (statics, planner, desired),
            probe_set,
            manager_handle.clone(),
            shard,
            events.as_ref().map(|e| e.events.clone()),
        );
        let run = tokio::spawn(supervisor.run(root.clone()));
        let (elected, sharded) = keep_leases(leases.as_ref(), election, sharding);
        info!(
            admin = %admin_address,
            remotes = config.remotes.len(),
            discovered,
            config = %config.label(),
            "tether started"
        );
        let mut daemon = Self {
            supervisor: supervisor_handle,
            probes,
            manager: manager_handle,
            election: election_handle,
            admin_address,
            admin,
            config,
            resolved: remotes,
            folders: Folders::new(),
            rechecks: Some(rechecks),
            root,
            draining,
            reloads,
            run,
            admin_stop,
            followers,
            elected,
            discovery,
            sharded,
            leases,
            events,
        };
        daemon.follow_folders();
        Ok(daemon)
    }

    /// Drains and shuts down: `/readyz` answers 503 at once, root is
    /// cancelled, and the manager gets its grace period. The admin server
    /// keeps answering (`/readyz` 503) for at least `admin.drainWindow`
    /// after the drain began, so a kubelet or a load balancer sees it.
    pub async fn shutdown(self) -> ShutdownOutcome {
        self.draining.store(true, Ordering::SeqCst);
        let drained = tokio::time::Instant::now() + self.config.drain_window;
        if let Some(discovery) = &self.discovery {
            discovery.stop();
        }
        info!(window = ?self.config.drain_window, "draining: readiness off; stopping the manager");
        self.root.cancel();
        let outcome = match self.run.await {
            Ok(outcome) => outcome,
            Err(err) => {
                error!(error = %err, "the supervisor task failed");
                ShutdownOutcome::GraceExceeded
            }
        };
        self.followers.stop().await;
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
        if let (Some((election, stop, task)), Some(leases)) = (self.elected, &self.leases) {
            stop.cancel();
            let _ = task.await;
            let _ = leases.run(async move { election.release().await }).await;
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
        // Before the polls: the first poll sweeps every remote's files.
        let mut sweeps = Sweeps::default();
        let mut poll = tokio::time::interval(CONFIG_POLL);
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
                Some((names, done)) = rechecks.recv() => {
                    let asked: Vec<usize> = self
                        .resolved
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| names.contains(&r.name))
                        .map(|(index, _)| index)
                        .collect();
                    self.refresh_remotes(Some(&asked), Noticed::Probe).await;
                    let _ = done.send(());
                }
                woken = self.folders.changed() => {
                    self.refresh_woken(woken.as_deref(), &mut sweeps).await;
                }
                polled = poll.tick() => {
                    let now = self.config.file.as_ref().and_then(|f| std::fs::read(f).ok());
                    if now.is_some() && now != seen {
                        info!("the config file changed: reloading");
                        seen = now;
                        self.reload().await;
                    } else {
                        self.sweep_when_due(&mut sweeps, polled).await;
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

/// Serves `admin` on `listener` until the token returned is cancelled.
fn serve_admin(listener: admin::Listener, admin: Admin) -> (Arc<Admin>, CancellationToken) {
    let admin = Arc::new(admin);
    let stop = CancellationToken::new();
    tokio::spawn(admin::serve(listener, Arc::clone(&admin), stop.clone()));
    (admin, stop)
}

/// Discovery, when the config has sources: its reflectors started, and
/// their first lists waited for (at most [`discovery::FIRST_LIST_WAIT`]).
async fn start_discovery(
    config: &Config,
    registry: &prometheus::Registry,
) -> Result<Option<Arc<Discovery>>, StartError> {
    if config.discovery.is_empty() {
        return Ok(None);
    }
    // The exec manager hands each discovered cluster's kubeconfig to its
    // process; the built-in one needs only the kube configuration.
    let discovery = Discovery::start(&config.discovery, config.exec.is_some(), registry)
        .await
        .map_err(|err| match err {
            discovery::Error::Config(message) => StartError::Config(ConfigError::new(
                &config.label(),
                "discovery[0].secrets.kubeconfig",
                message,
            )),
            other => StartError::Setup {
                what: "discovery",
                source: other.into(),
            },
        })?;
    discovery.first_lists(discovery::FIRST_LIST_WAIT).await;
    Ok(Some(Arc::new(discovery)))
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
