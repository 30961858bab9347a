//! What `/status.json`, `/status` and `/readyz` cost at 10,000 remotes, each
//! with one cache: the admin server's view built from the probes', the
//! supervisor's and the manager's state, and rendered.
//! `cargo bench -p tether --bench status`.
//!
//! The remotes point at a closed port, so their probes fail at once and then
//! idle (interval 1h): what is measured is the view, not the probes.

// A benchmark measures wall-clock time; no paused clock here.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use prometheus::Registry;
use tether::admin::{Admin, Heartbeats, Sources};
use tether::config::Plan;
use tether::config::WatchSpec;
use tether::config::remote::{self, ResolvedRemote};
use tether::daemon::Parts;
use tether::managers::watch::WatchManager;
use tether_probes::{ProbeConfig, ProbeSet};
use tether_supervisor::{Supervisor, SupervisorConfig};

const REMOTES: usize = 10_000;
const ROUNDS: usize = 20;

#[tokio::main]
async fn main() {
    let registry = Registry::new();
    let probe = ProbeConfig::default()
        .with_interval(Duration::from_secs(3600))
        .with_timeout(Duration::from_secs(1));
    let probes = ProbeSet::new(probe.clone(), &registry).expect("probes");
    // Port 1 on loopback: refused at once. Half the remotes optional.
    let remotes: Vec<ResolvedRemote> = (0..REMOTES)
        .map(|i| {
            let config = kube::Config::new(
                format!("http://127.0.0.{}:1", 1 + i % 250)
                    .parse()
                    .expect("a URL"),
            );
            ResolvedRemote::new(
                format!("remote-{i:05}"),
                i % 2 == 0,
                tether::config::RemoteSource::Inferred,
                config.into(),
            )
            .expect("a server to probe")
        })
        .collect();
    probes.sync(&remote::probed(&remotes)).expect("sync");
    let plan = Plan {
        remotes: remotes.into_iter().collect(),
        watch: vec![WatchSpec {
            api_version: "v1".into(),
            kind: "Namespace".into(),
            plural: "namespaces".into(),
            namespaced: false,
            namespace: None,
            label_selector: None,
        }],
        exec: None,
    };
    let manager = WatchManager::new(&registry, probes.handle(), plan, probe.detection_bound())
        .expect("manager");
    let manager_handle = manager.handle();
    let supervisor =
        Supervisor::new(manager, SupervisorConfig::default(), &registry).expect("supervisor");
    let admin = Admin::new(
        registry,
        Sources {
            parts: Arc::new(Parts {
                supervisor: supervisor.handle(),
                draining: Arc::new(AtomicBool::new(false)),
                election: None,
                shard: None,
                discovery: None,
            }),
            probes: probes.handle(),
            manager: Arc::new(manager_handle),
        },
        Heartbeats {
            probes: probe.interval,
            supervisor: Duration::from_secs(1),
        },
    )
    .expect("admin");
    // Let every first probe fail, so each remote has an error to show.
    let started = Instant::now();
    while probes
        .handle()
        .status()
        .iter()
        .any(|r| r.last_probe.is_none())
    {
        assert!(started.elapsed() < Duration::from_secs(120), "probes stuck");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!(
        "machine: {} cores; {REMOTES} remotes, one cache each; median and max of {ROUNDS}",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    for (what, render) in [
        (
            "/status.json",
            Box::new(|| admin.status_json().len()) as Box<dyn Fn() -> usize>,
        ),
        (
            "/status",
            Box::new(|| admin.status_html(&tether::admin::Query::default()).len()),
        ),
        ("/readyz", Box::new(|| admin.readyz().1.len())),
    ] {
        let mut times = Vec::with_capacity(ROUNDS);
        let mut size = 0;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            size = render();
            times.push(started.elapsed());
        }
        times.sort();
        println!(
            "{what:13} median {:7.2} ms, max {:7.2} ms, {} KiB",
            times[ROUNDS / 2].as_secs_f64() * 1000.0,
            times[ROUNDS - 1].as_secs_f64() * 1000.0,
            size / 1024
        );
    }
}
