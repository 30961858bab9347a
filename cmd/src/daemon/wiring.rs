//! The pieces `Daemon::start` wires, and the checks it makes first.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounterVec, Opts, Registry};
use tether_probes::{ProbeSet, ProbeSetHandle};
use tether_supervisor::{BoxError, Cause, Supervisor, SupervisorHandle};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{Parts, StartError};
use crate::admin::{self, Admin, Heartbeats, Sources};
use crate::config::ranked::Remotes;
use crate::config::{Config, ConfigError};
use crate::desired::{self, Desired, Planner, Statics};
use crate::events::{Events, Publisher, Reason};
use crate::lease::LeaseThread;
use crate::lease::election::{self, Election, ElectionHandle};
use crate::lease::shard::{ShardHandle, Sharding};
use crate::managers::{self, exec};

/// The Events on tether's Pod: where to send them, and the task that
/// records each cycle's end and leadership change.
#[derive(Debug)]
pub(super) struct EventsRunning {
    pub(super) events: Events,
    pub(super) stop: CancellationToken,
    pub(super) task: JoinHandle<()>,
    pub(super) publisher: Publisher,
}

impl EventsRunning {
    pub(super) fn spawn(
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
    pub(super) async fn finish(self) {
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
pub(super) async fn start_events(
    config: &Config,
    registry: &Registry,
) -> Option<(Events, Publisher)> {
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
pub(super) type Recheck = (Vec<String>, tokio::sync::oneshot::Sender<()>);

/// How many probes' asks to re-read their files may wait at once; a probe
/// that finds no room counts its failure as it would have anyway.
pub(super) const RECHECKS_WAITING: usize = 64;

/// Lets `probes` ask the daemon to re-read a remote's files before a
/// failure that rotated credentials explain is counted; the daemon's run
/// loop answers through the receiver.
pub(super) fn rechecks(probes: &ProbeSet) -> tokio::sync::mpsc::Receiver<Recheck> {
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
pub(super) struct Sharded {
    pub(super) handle: ShardHandle,
    pub(super) stop: CancellationToken,
    pub(super) task: JoinHandle<()>,
}

impl Sharded {
    /// Runs `sharding` on the Leases' thread.
    pub(super) fn run(sharding: Sharding, leases: &LeaseThread) -> Self {
        let handle = sharding.handle();
        let stop = CancellationToken::new();
        let task = leases.spawn(sharding.run(stop.clone()));
        Self { handle, stop, task }
    }
}

/// The tasks that follow the published [`Desired`] value: the planner that
/// publishes it, the probes, and, with sharding, the one that lets the
/// sharding know what nothing runs any more.
#[derive(Debug)]
pub(super) struct Followers {
    /// What the daemon read, for the planner.
    statics: watch::Sender<Statics>,
    /// What the planner publishes.
    desired: watch::Receiver<Arc<Desired>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// The revisions the probes and the manager follow.
    probes: watch::Receiver<u64>,
    manager: watch::Receiver<u64>,
}

impl Followers {
    pub(super) fn spawn(
        (statics, planner, desired): (
            watch::Sender<Statics>,
            Planner,
            watch::Receiver<Arc<Desired>>,
        ),
        probes: ProbeSet,
        manager: managers::Handle,
        sharded: Option<ShardHandle>,
        events: Option<Events>,
    ) -> Self {
        let stop = CancellationToken::new();
        let (probes_at, probes_follow) = watch::channel(0);
        let (manager_at, manager_follows) = watch::channel(0);
        let running = manager.running();
        let mut tasks = vec![
            tokio::spawn(planner.run(stop.clone())),
            tokio::spawn(desired::follow(
                desired.clone(),
                move |d, last| desired::probe(&probes, d, last),
                probes_at,
                stop.clone(),
            )),
            tokio::spawn(desired::follow(
                desired.clone(),
                move |d, _| {
                    manager.follow(d);
                    true
                },
                manager_at,
                stop.clone(),
            )),
        ];
        if let Some(shard) = sharded {
            tasks.push(tokio::spawn(let_go(
                desired.clone(),
                probes_follow.clone(),
                running,
                shard,
                events,
                stop.clone(),
            )));
        }
        Self {
            statics,
            desired,
            stop,
            tasks,
            probes: probes_follow,
            manager: manager_follows,
        }
    }

    /// Hands the planner `remotes` as the daemon read them, under `config`
    /// when one was reloaded (which ends the running cycle), and waits until
    /// the probes and the manager follow the value that takes them in: at
    /// most [`FOLLOW_WAIT`] for each, as they do no I/O to get there.
    pub(super) async fn hand_over(&self, config: Option<Arc<Config>>, remotes: Remotes) {
        let config = config.unwrap_or_else(|| Arc::clone(&self.statics.borrow().config));
        let reading = self.statics.borrow().reading + 1;
        self.statics.send_replace(Statics {
            config,
            remotes,
            reading,
        });
        let mut desired = self.desired.clone();
        let published =
            tokio::time::timeout(FOLLOW_WAIT, desired.wait_for(|d| d.reading >= reading)).await;
        let Ok(Ok(revision)) = published.map(|value| value.map(|v| v.revision)) else {
            warn!(
                reading,
                "the planner did not take in the remotes read within {FOLLOW_WAIT:?}"
            );
            return;
        };
        let (mut probes, mut manager) = (self.probes.clone(), self.manager.clone());
        let both = async {
            let _ = probes.wait_for(|at| *at >= revision).await;
            let _ = manager.wait_for(|at| *at >= revision).await;
        };
        if tokio::time::timeout(FOLLOW_WAIT, both).await.is_err() {
            warn!(
                revision,
                "the probes or the manager did not take in the new remotes within {FOLLOW_WAIT:?}"
            );
        }
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// How long a reload waits for the probes and the manager to take it in.
const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// Tells the sharding, for each share published, once nothing runs the
/// remotes outside it: the probes follow that value (`synced`), and the
/// running cycle's plan has none of the others (`running`, which the
/// supervisor empties when it ends that cycle for the change). Records a
/// change of what this replica runs as an Event on its Pod.
async fn let_go(
    mut desired: watch::Receiver<Arc<Desired>>,
    mut synced: watch::Receiver<u64>,
    mut running: watch::Receiver<BTreeSet<String>>,
    shard: ShardHandle,
    events: Option<Events>,
    stop: CancellationToken,
) {
    let mut runs = desired.borrow().running();
    loop {
        let now = Arc::clone(&desired.borrow_and_update());
        let will = now.running();
        if will != runs {
            if let Some(events) = &events {
                events.record(
                    Reason::ShardChanged,
                    &format!(
                        "this replica now holds {} remote(s): took {}, gave up {}",
                        will.len(),
                        will.difference(&runs).count(),
                        runs.difference(&will).count()
                    ),
                );
            }
            runs.clone_from(&will);
        }
        let held = now.share.as_deref().cloned().unwrap_or_default();
        let settled = async {
            let _ = synced.wait_for(|synced| *synced >= now.revision).await;
            let _ = running.wait_for(|running| running.is_subset(&held)).await;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            changed = desired.changed() => if changed.is_err() { return },
            () = settled => {
                shard.applied(held);
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = desired.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

/// The probes of `targets`, their metrics in `registry`.
pub(super) fn new_probes(
    config: &Config,
    registry: &Registry,
    targets: &[tether_probes::Remote],
) -> Result<ProbeSet, StartError> {
    let probe_set = ProbeSet::new(config.probe.clone(), registry).map_err(setup("probes"))?;
    probe_set.sync(targets).map_err(setup("probes"))?;
    Ok(probe_set)
}

/// The admin server's listener on `addr`, and the address it got.
pub(super) fn listen(addr: SocketAddr) -> Result<(admin::Listener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind { addr, source };
    let listener = admin::bind(addr).map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// `supervisor`, building cycles only on the leader (`election`), or, with
/// sharding, only while this replica holds a remote (`shard`).
pub(super) fn gated(
    supervisor: Supervisor<managers::Manager>,
    election: Option<&ElectionHandle>,
    shard: Option<&ShardHandle>,
) -> Supervisor<managers::Manager> {
    match (election, shard) {
        (Some(election), _) => supervisor.build_while(election.gate()),
        (None, Some(shard)) => {
            let gave_up = shard.clone();
            supervisor.build_while_ending_with(shard.gate(), move || Cause::ShardChanged {
                taken: 0,
                given_up: gave_up.applied_count(),
            })
        }
        (None, None) => supervisor,
    }
}

/// `tether_config_reloads_total`, both results exported from the start.
pub(super) fn reload_counter(registry: &Registry) -> prometheus::Result<IntCounterVec> {
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
pub(super) async fn start_election(
    config: &Config,
    registry: &Registry,
    leases: Option<&LeaseThread>,
) -> Result<Option<Arc<Election>>, StartError> {
    let (Some(spec), Some(leases), None) = (&config.leader_election, leases, &config.sharding)
    else {
        return Ok(None);
    };
    let (spec, registry) = (spec.clone(), registry.clone());
    let election = leases
        .run(async move { Election::new(spec, &registry).await })
        .await
        .map_err(setup(LEASE_THREAD))?
        .map_err(lease_error(config, "leader election"))?;
    Ok(Some(Arc::new(election)))
}

/// What a failure of the Leases' thread is reported as.
const LEASE_THREAD: &str = "the Leases' thread";

/// The Leases' own thread, when the config has Leases to keep.
pub(super) fn lease_thread(config: &Config) -> Result<Option<LeaseThread>, StartError> {
    config
        .leader_election
        .as_ref()
        .map(|_| LeaseThread::start())
        .transpose()
        .map_err(setup(LEASE_THREAD))
}

/// A Lease setup error. What the config decides (the Lease's namespace, the
/// cluster that holds it, its kubeconfig) is the config's, exit 2;
/// anything else is a setup failure.
pub(super) fn lease_error(
    config: &Config,
    what: &'static str,
) -> impl Fn(election::Error) -> StartError {
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
/// run; in a launcher's container, it is the launcher that says.
pub(super) fn exec_command(config: &Config) -> Result<(), StartError> {
    let Some(exec) = config.exec.as_ref().filter(|e| e.launcher.is_none()) else {
        return Ok(());
    };
    exec::find_command(exec).map(drop).map_err(|err| {
        StartError::Config(ConfigError::new(
            &config.label(),
            "manager.exec.command",
            tether_supervisor::error_chain(&err),
        ))
    })
}

/// Checks what `run` needs beyond the config file itself, without starting
/// anything: the client of the leader election's (or sharding's) Lease, the
/// home cluster's config for discovery, and the exec manager's command. `validate` and `check` run it; so does
/// [`Daemon::start`](super::Daemon::start), first.
///
/// # Errors
///
/// [`StartError::Config`] naming the field; [`StartError::Setup`] for
/// anything else.
pub async fn preflight(config: &Config) -> Result<(), StartError> {
    exec_command(config)?;
    if let Some(source) = config.discovery.first() {
        crate::discovery::home_config(source.kubeconfig.as_deref())
            .await
            .map_err(|err| {
                StartError::Config(ConfigError::new(
                    &config.label(),
                    "discovery[0].secrets.kubeconfig",
                    err.to_string(),
                ))
            })?;
    }
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
pub(super) fn spawn_until<F>(
    run: impl FnOnce(CancellationToken) -> F,
) -> (CancellationToken, JoinHandle<()>)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let stop = CancellationToken::new();
    let task = tokio::spawn(run(stop.clone()));
    (stop, task)
}

/// The running election: the election, its stop token and its task, for
/// the release at shutdown.
pub(super) type Elected = (Arc<Election>, CancellationToken, JoinHandle<()>);

/// Runs the election or the sharding, whichever there is, on the Leases'
/// thread until its stop token.
pub(super) fn keep_leases(
    leases: Option<&LeaseThread>,
    election: Option<Arc<Election>>,
    sharding: Option<Sharding>,
) -> (Option<Elected>, Option<Sharded>) {
    let Some(leases) = leases else {
        return (None, None);
    };
    let elected = election.map(|election| {
        let stop = CancellationToken::new();
        let task = leases.spawn({
            let (election, stop) = (Arc::clone(&election), stop.clone());
            async move { election.run(stop).await }
        });
        (election, stop, task)
    });
    (
        elected,
        sharding.map(|sharding| Sharded::run(sharding, leases)),
    )
}

/// The process's registry, with the process collector and the reload
/// counter in it.
pub(super) fn new_registry() -> Result<(Registry, IntCounterVec), StartError> {
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
pub(super) async fn new_sharding(
    config: &Config,
    registry: &Registry,
    leases: Option<&LeaseThread>,
) -> Result<Option<Sharding>, StartError> {
    let (Some(sharding), Some(election), Some(leases)) =
        (&config.sharding, &config.leader_election, leases)
    else {
        return Ok(None);
    };
    let (sharding, election, registry) = (sharding.clone(), election.clone(), registry.clone());
    leases
        .run(async move { Sharding::new(election, &sharding, &registry).await })
        .await
        .map_err(setup(LEASE_THREAD))?
        .map(Some)
        .map_err(lease_error(config, "sharding"))
}

/// The admin server's state: the daemon's [`Parts`], the probes' rows and
/// the manager's caches.
pub(super) fn new_admin(
    config: &Config,
    registry: &Registry,
    parts: Parts,
    probes: &ProbeSetHandle,
    manager: &managers::Handle,
) -> Result<Admin, StartError> {
    let sources = Sources {
        parts: Arc::new(parts),
        probes: probes.clone(),
        manager: Arc::new(manager.clone()),
    };
    let heartbeats = Heartbeats {
        probes: config.probe.interval,
        supervisor: config.supervisor.heartbeat,
    };
    Admin::new(registry.clone(), sources, heartbeats).map_err(setup("admin metrics"))
}

pub(super) fn setup<E: Into<BoxError>>(what: &'static str) -> impl Fn(E) -> StartError {
    move |err| StartError::Setup {
        what,
        source: err.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Barrier;

    use tether_testkit::{ApiServer, Options};
    use tokio::time::Instant;

    use super::*;

    const REMOTES: usize = 10;
    const RENEW_DEADLINE: Duration = Duration::from_secs(2);

    /// Every worker of the daemon's runtime busy for twice `renewDeadline`,
    /// as a replica taking thousands of remotes at once keeps them: the
    /// sharding, on the Leases' thread, renews meanwhile, and holds its
    /// remotes throughout and after. On the workers, its fence lapsed as
    /// they came free, and it let every remote go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[expect(
        clippy::disallowed_methods,
        reason = "blocks the workers on purpose, as a burst of handshakes does"
    )]
    async fn the_shard_lease_is_renewed_while_every_worker_is_busy() {
        // The Leases' apiserver has a runtime of its own: these workers
        // are to be blocked.
        let peer = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let server = peer
            .spawn(ApiServer::start(Options::default().name("leases")))
            .await
            .expect("spawned")
            .expect("the Leases' apiserver");
        let dir = tempfile::tempdir().expect("dir");
        server
            .kubeconfig()
            .write(&dir.path().join("leases.kubeconfig"))
            .expect("kubeconfig");
        let text = format!(
            "remotes: [{{name: a, kubeconfig: leases.kubeconfig}}]\n\
             leaderElection: {{enabled: true, leaseNamespace: default, identity: busy, \
             leaseDuration: 3s, renewDeadline: {}s, retryPeriod: 500ms, kubeconfig: leases.kubeconfig}}\n\
             sharding: {{enabled: true}}\n",
            RENEW_DEADLINE.as_secs()
        );
        let config = Config::parse(&text, "tether.yaml", dir.path()).expect("config");
        let registry = Registry::new();
        let leases = lease_thread(&config)
            .expect("the Leases' thread")
            .expect("Leases to keep");
        let sharding = new_sharding(&config, &registry, Some(&leases))
            .await
            .expect("sharding")
            .expect("on");
        let handle = sharding.handle();
        handle.set_remotes(
            (0..REMOTES)
                .map(|i| (format!("r{i}"), format!("https://10.0.0.{i}:6443")))
                .collect::<BTreeMap<_, _>>(),
        );
        let sharded = Sharded::run(sharding, &leases);
        // The only member: it holds every remote once it has joined.
        let mut holding = handle.holding();
        tokio::time::timeout(
            Duration::from_secs(30),
            holding.wait_for(|h| h.len() == REMOTES),
        )
        .await
        .expect("every remote held within 30s")
        .expect("sharding runs");

        let busy = RENEW_DEADLINE * 2;
        let together = Arc::new(Barrier::new(2));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (together, holding) = (Arc::clone(&together), holding.clone());
                tokio::spawn(async move {
                    // Both workers at once, each blocked, watching what is
                    // held.
                    together.wait();
                    let until = Instant::now() + busy;
                    let mut fewest = REMOTES;
                    while Instant::now() < until {
                        fewest = fewest.min(holding.borrow().len());
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    fewest
                })
            })
            .collect();
        for worker in workers {
            assert_eq!(
                worker.await.expect("worker"),
                REMOTES,
                "let remotes go while the workers were busy"
            );
        }
        // A lapsed fence shows as soon as a worker is free: none for a
        // renewDeadline more.
        let dropped =
            tokio::time::timeout(RENEW_DEADLINE, holding.wait_for(|h| h.len() != REMOTES)).await;
        assert!(
            dropped.is_err(),
            "let remotes go once the workers were free: {:?}",
            handle.state()
        );

        handle.applied(std::collections::BTreeSet::new());
        sharded.stop.cancel();
        sharded.task.await.expect("the sharding ends");
        drop((leases, server));
        peer.shutdown_background();
    }
}
