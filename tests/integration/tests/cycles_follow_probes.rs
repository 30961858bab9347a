//! The supervisor's cycles driven by real probe transitions: a lost remote
//! ends the cycle once; a remote that is already down when a cycle starts
//! does not end it again; its recovery ends it so clients reconnect fresh.

use std::time::Duration;

use prometheus::Registry;
use tether_probes::{
    CycleEnd, ProbeConfig, ProbeSet, ProbeSetHandle, Reachability, Remote, next_cycle_end,
};
use tether_supervisor::{
    BackoffConfig, Cause, CycleToken, ManagerError, ManagerFactory, Supervisor, SupervisorConfig,
};
use tether_testkit::{ApiServer, Fault, Options};
use tokio::sync::mpsc;
use tokio::time::timeout;

const DEADLINE: Duration = Duration::from_secs(20);

/// A manager that does nothing but end its cycle when a remote it uses is
/// lost or recovers, the way tether's own manager is wired.
struct WatchesRemotes {
    probes: ProbeSetHandle,
    cycles: mpsc::UnboundedSender<CycleToken>,
}

impl ManagerFactory for WatchesRemotes {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        // Subscribe before anything else: only transitions during this
        // cycle count.
        let mut transitions = self.probes.subscribe();
        let _ = self.cycles.send(cycle.clone());
        tokio::select! {
            () = cycle.cancelled() => {}
            end = next_cycle_end(&mut transitions, |_| true, true) => match end {
                Some(CycleEnd::Lost(remote)) => { cycle.cancel(Cause::remote_lost(remote)); }
                Some(CycleEnd::Recovered(remote)) => { cycle.cancel(Cause::remote_recovered(remote)); }
                None => {}
            },
        }
        Ok(())
    }
}

async fn next_cycle(cycles: &mut mpsc::UnboundedReceiver<CycleToken>, what: &str) -> CycleToken {
    timeout(DEADLINE, cycles.recv())
        .await
        .unwrap_or_else(|_| panic!("no cycle ({what}) within {DEADLINE:?}: supervisor stuck?"))
        .expect("the supervisor is running")
}

#[tokio::test]
async fn a_lost_remote_ends_one_cycle_and_its_recovery_ends_the_next() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let registry = Registry::new();
    let probe_config = ProbeConfig::default()
        .with_interval(Duration::from_millis(100))
        .with_timeout(Duration::from_millis(50))
        .with_jitter(0.0);
    let probes = ProbeSet::new(probe_config, &registry).expect("probes");
    probes
        .sync(&[Remote::new("cluster-a", config)])
        .expect("sync");
    let handle = probes.handle();

    let (tx, mut cycles) = mpsc::unbounded_channel();
    let factory = WatchesRemotes {
        probes: handle.clone(),
        cycles: tx,
    };
    let supervisor_config = SupervisorConfig::default().with_backoff(
        BackoffConfig::default()
            .with_initial(Duration::from_millis(50))
            .with_jitter(0.0),
    );
    let supervisor = Supervisor::new(factory, supervisor_config, &registry).expect("supervisor");
    let root = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));

    let first = next_cycle(&mut cycles, "first").await;
    server.set_fault(Fault::Refuse).await.expect("refuse");
    let second = next_cycle(&mut cycles, "after the loss").await;
    assert_eq!(first.cause(), Some(&Cause::remote_lost("cluster-a")));

    // The remote stays down for many more probes: the new cycle lives on.
    let down_since = handle.status()[0].consecutive_failures;
    timeout(DEADLINE, async {
        while handle.status()[0].consecutive_failures < down_since + 10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("probes continue");
    assert!(
        !second.is_cancelled(),
        "a remote already down ended a new cycle: rebuild storm"
    );
    assert_eq!(
        handle.state_of("cluster-a"),
        Some(Reachability::Unreachable)
    );

    server.set_fault(Fault::Up).await.expect("up");
    let third = next_cycle(&mut cycles, "after the recovery").await;
    assert_eq!(second.cause(), Some(&Cause::remote_recovered("cluster-a")));
    assert!(!third.is_cancelled());

    root.cancel();
    let outcome = timeout(DEADLINE, run)
        .await
        .expect("shutdown deadlocked?")
        .expect("no panic");
    assert_eq!(outcome, tether_supervisor::ShutdownOutcome::Clean);
}
