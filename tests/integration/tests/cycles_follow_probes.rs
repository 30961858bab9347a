//! The supervisor's cycles driven by real probe transitions, wired exactly as
//! `tether run` wires them (`Supervisor::end_cycles_on(probes.signals())`):
//! a lost remote ends the cycle once; a remote that is already down when a
//! cycle starts does not end it again; its recovery ends it so clients
//! reconnect fresh. The manager has no code of its own for any of this.

use std::time::Duration;

use prometheus::Registry;
use tether_probes::{ProbeConfig, ProbeSet, Reachability, Remote};
use tether_supervisor::{
    BackoffConfig, Cause, CycleToken, ManagerError, ManagerFactory, Supervisor, SupervisorConfig,
};
use tether_testkit::{ApiServer, Fault, Options};
use tokio::sync::mpsc;
use tokio::time::timeout;

const DEADLINE: Duration = Duration::from_secs(20);

/// A manager that only reports its cycles and waits for them to end.
struct Reports {
    cycles: mpsc::UnboundedSender<CycleToken>,
}

impl ManagerFactory for Reports {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        let _ = self.cycles.send(cycle.clone());
        cycle.cancelled().await;
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
    let factory = Reports { cycles: tx };
    let supervisor_config = SupervisorConfig::default().with_backoff(
        BackoffConfig::default()
            .with_initial(Duration::from_millis(50))
            .with_jitter(0.0),
    );
    let supervisor = Supervisor::new(factory, supervisor_config, &registry)
        .expect("supervisor")
        .end_cycles_on(handle.signals());
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
