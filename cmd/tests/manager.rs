//! The built-in watch manager under the real supervisor, in process.

use std::time::Duration;

use prometheus::Registry;
use tether::config::WatchSpec;
use tether::manager::{ManagedRemote, WatchManager};
use tether_probes::{ProbeConfig, ProbeSet, Remote};
use tether_supervisor::{BackoffConfig, Cause, Supervisor, SupervisorConfig};
use tether_testkit::{ApiServer, Options};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

fn configmaps() -> WatchSpec {
    WatchSpec {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        plural: "configmaps".into(),
        namespaced: true,
        namespace: None,
        label_selector: None,
    }
}

async fn config_of(server: &ApiServer) -> kube::Config {
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml()).expect("kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_task_outlives_its_cycle_across_fifty_cycles() {
    let servers = [
        ApiServer::start(Options::default()).await.expect("server"),
        ApiServer::start(Options::default()).await.expect("server"),
    ];
    let registry = Registry::new();
    let probes = ProbeSet::new(ProbeConfig::default(), &registry).expect("probes");
    let mut remotes = Vec::new();
    let mut plan = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let config = config_of(server).await;
        remotes.push(Remote::new(format!("r{i}"), config.clone()));
        plan.push(ManagedRemote {
            name: format!("r{i}"),
            required: true,
            config,
        });
    }
    probes.sync(&remotes).expect("sync");
    let manager = WatchManager::new(&registry, probes.handle(), plan, vec![configmaps()], true)
        .expect("manager");
    let handle = manager.handle();
    let backoff = BackoffConfig::default()
        .with_initial(Duration::from_millis(1))
        .with_max(Duration::from_millis(1))
        .with_jitter(0.0);
    let supervisor = Supervisor::new(
        manager,
        SupervisorConfig::default().with_backoff(backoff),
        &registry,
    )
    .expect("supervisor");
    let status = supervisor.handle();
    let root = CancellationToken::new();
    let run = tokio::spawn(supervisor.run(root.clone()));

    let metrics = tokio::runtime::Handle::current().metrics();
    let mut alive = Vec::new();
    for cycle in 1..=50u64 {
        let started = Instant::now();
        while !(status.status().cycle == cycle && status.status().manager_up) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cycle {cycle} never came up"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        alive.push(metrics.num_alive_tasks());
        handle.end_cycle(Cause::ConfigChanged);
    }
    // Same tasks alive with the manager up in cycle 50 as in cycle 5: the
    // reflectors of 45 ended cycles are all gone.
    assert!(
        alive[49] <= alive[4],
        "live tasks grew from {} (cycle 5) to {} (cycle 50): {alive:?}",
        alive[4],
        alive[49]
    );
    assert!(
        servers.iter().all(|s| s.stats().open_watches <= 1),
        "old watches still open"
    );
    root.cancel();
    let outcome = timeout(Duration::from_secs(10), run)
        .await
        .expect("shutdown")
        .expect("no panic");
    assert_eq!(outcome, tether_supervisor::ShutdownOutcome::Clean);
}
