//! Supplying your own manager instead of tether's built-in watch manager.
//!
//! The supervisor drives anything that implements `ManagerFactory`, and ends
//! its cycles itself: the probes' signals end a cycle when a remote is lost
//! or comes back, and `SupervisorHandle::end_cycle` when the configuration
//! changes. A manager only starts its controllers and reports up. This one
//! only prints; a real one would start its controllers with clients built
//! from the same kube configs, under `cycle.child_token()`.
//!
//! Run it against a remote named by a kubeconfig:
//! `cargo run -p tether --example custom_manager -- /path/to/kubeconfig`

use std::time::Duration;

use prometheus::Registry;
use tether_probes::{ProbeConfig, ProbeSet, Remote};
use tether_supervisor::{CycleToken, ManagerError, ManagerFactory, Supervisor, SupervisorConfig};
use tokio_util::sync::CancellationToken;

struct MyController;

impl ManagerFactory for MyController {
    async fn run(&self, cycle: CycleToken) -> Result<(), ManagerError> {
        println!("cycle {}: my controllers start", cycle.number());
        // ... start controllers here, then report up once their caches sync.
        cycle.set_manager_up(true);
        cycle.cancelled().await;
        println!("cycle {} ends: {:?}", cycle.number(), cycle.cause());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "kubeconfig".to_owned());
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;

    let registry = Registry::new();
    let probes = ProbeSet::new(
        ProbeConfig::default()
            .with_interval(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(1)),
        &registry,
    )?;
    probes.sync(&[Remote::new("my-remote", config)])?;
    let supervisor = Supervisor::new(MyController, SupervisorConfig::default(), &registry)?
        .end_cycles_on(probes.handle().signals());

    let root = CancellationToken::new();
    let stop = root.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let outcome = supervisor.run(root).await;
    println!("stopped: {outcome:?}");
    Ok(())
}
