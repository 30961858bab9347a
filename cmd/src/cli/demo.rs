//! `tether demo`: the daemon against three simulated remotes, one of which
//! is lost and brought back, narrated on the terminal.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tether_probes::Reachability;
use tether_sim::{ApiServer, Fault, Options, Resource};
use tether_supervisor::Phase;
use tokio::time::Instant;

use crate::config::Config;
use crate::daemon::{Daemon, StartError};

/// The remote that the demo takes down.
const VICTIM: &str = "cluster-b";

/// Failed probes in a row that make a remote unreachable in the demo.
const THRESHOLD: u32 = 3;
/// How long after the manager is first up the outage starts, and how long it
/// lasts.
const OUTAGE_AFTER: Duration = Duration::from_secs(5);
const OUTAGE_FOR: Duration = Duration::from_secs(15);

/// What went wrong setting the demo up.
#[derive(Debug, thiserror::Error)]
pub(super) enum DemoError {
    /// A simulated remote could not start.
    #[error("starting a simulated remote failed")]
    Remote(#[from] tether_sim::Error),
    /// Writing its files failed.
    #[error("writing the demo's files failed")]
    Io(#[from] std::io::Error),
    /// The daemon could not start.
    #[error(transparent)]
    Start(#[from] StartError),
}

struct Narrator {
    started: Instant,
    /// What was last said, so only changes are told.
    seen: std::sync::Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    cycle: u64,
    phase: Option<Phase>,
    up: bool,
    remotes: std::collections::BTreeMap<String, (Reachability, u32)>,
    /// When the cycle's wait for an unreachable remote was last told.
    waiting_told: Option<Instant>,
    /// When the outage began, once it has.
    outage: Option<Instant>,
    /// Whether what would happen without tether was told.
    without_told: bool,
}

/// How often a wait that goes on is told again: once per probe would be a
/// line a second saying the same.
const RETELL_EVERY: Duration = Duration::from_secs(5);

impl Narrator {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Tells what changed of `remote` since `seen`.
    fn tell_remote(&self, seen: &mut Seen, remote: &tether_probes::RemoteStatus) {
        let previous = seen.remotes.insert(
            remote.name.clone(),
            (remote.state, remote.consecutive_failures),
        );
        let Some((state, failures)) = previous else {
            return;
        };
        // Each failure toward the threshold is news; past it, the wait
        // tells the streak now and then.
        if remote.consecutive_failures > failures && remote.state != Reachability::Unreachable
            || remote.state != state && remote.state == Reachability::Unreachable
        {
            self.say(&format!(
                "{}: probe failed ({} in a row; unreachable at {THRESHOLD}): {}",
                remote.name,
                remote.consecutive_failures,
                remote
                    .last_cause
                    .map_or("?", tether_probes::FailureCause::as_str)
            ));
        }
        if remote.state != state {
            let since = match (remote.state, seen.outage) {
                (Reachability::Unreachable, Some(outage)) => format!(
                    ", {:.1}s after the outage began; \"unreachable for\" counts from here",
                    outage.elapsed().as_secs_f64()
                ),
                _ => String::new(),
            };
            self.say(&format!(
                "{}: {state} -> {}{since}",
                remote.name, remote.state
            ));
        }
    }

    fn say(&self, line: &str) {
        crate::stdout::write(&format!(
            "[{:6.1}s] {line}\n",
            self.started.elapsed().as_secs_f64()
        ));
    }
}

/// Runs the demo until Ctrl-C, or for `duration`. Returns the exit code.
///
/// # Errors
///
/// [`DemoError`] if the remotes or the daemon cannot start.
///
/// # Panics
///
/// Never: the faulted remote is one of the three it starts, and switching
/// to `hang` or `up` needs no new listener address.
pub(super) async fn run(admin: SocketAddr, duration: Option<Duration>) -> Result<u8, DemoError> {
    let narrator = Narrator {
        started: Instant::now(),
        seen: std::sync::Mutex::default(),
    };
    let dir = tempfile::tempdir()?;
    let mut servers = Vec::new();
    let mut yaml = format!(
        "admin: {{address: \"{admin}\", drainWindow: 0s}}\n\
         probe: {{interval: 1s, timeout: 500ms, failureThreshold: {THRESHOLD}}}\n\
         supervisor: {{backoff: {{initial: 1s, max: 30s}}}}\n\
         watch: [{{apiVersion: v1, kind: ConfigMap}}, {{apiVersion: v1, kind: Namespace}}]\n\
         remotes:\n"
    );
    for name in ["cluster-a", VICTIM, "cluster-c"] {
        let token = format!("demo-{:016x}", fastrand::u64(..));
        let server = ApiServer::start(Options::default().tls(true).token(token).name(name)).await?;
        for i in 0..5 {
            server.put(
                Resource::ConfigMap,
                "default",
                json!({"metadata": {"name": format!("{name}-config-{i}")}, "data": {"index": i.to_string()}}),
            )?;
        }
        let path = dir.path().join(format!("{name}.kubeconfig"));
        server.kubeconfig().write(&path)?;
        let _ = writeln!(yaml, "- {{name: {name}, kubeconfig: {}}}", path.display());
        narrator.say(&format!(
            "simulated remote {name} at {} (TLS, bearer token, 5 ConfigMaps)",
            server.url()
        ));
        servers.push((name, server));
    }
    let config_path = dir.path().join("tether.yaml");
    std::fs::write(&config_path, &yaml)?;
    let config = Config::load(&config_path).map_err(StartError::from)?;
    let daemon = Daemon::start(config).await?;
    let addr = daemon.admin_address;
    narrator.say(&format!(
        "tether running: open http://{addr}/status in a browser to follow along (also /metrics, /readyz)"
    ));

    let victim = servers
        .iter()
        .find(|(name, _)| *name == VICTIM)
        .map(|(_, server)| server.clone())
        .expect("the victim is one of the servers");
    let script = async {
        narrate_until(&daemon, &narrator, None).await;
        tokio::time::sleep(OUTAGE_AFTER).await;
        narrator.say(&format!(
            "OUTAGE: {VICTIM} stops answering (hang: connections accepted, never answered)"
        ));
        narrator.seen().outage = Some(Instant::now());
        victim
            .set_fault(Fault::Hang)
            .await
            .expect("a hang can always be set");
        narrate_until(&daemon, &narrator, Some(OUTAGE_FOR)).await;
        narrator.say(&format!("RECOVERY: {VICTIM} answers again"));
        victim
            .set_fault(Fault::Up)
            .await
            .expect("up can always be set");
        narrate_until(&daemon, &narrator, None).await;
        narrator.say(&match duration {
            Some(duration) => format!(
                "the demo's script is done; it stops {:.0}s after it started",
                duration.as_secs_f64()
            ),
            None => "the demo's script is done; Ctrl-C to stop".to_owned(),
        });
        std::future::pending::<()>().await;
    };
    let stop = async {
        match duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    tokio::select! {
        () = script => {}
        () = stop => {}
    }
    narrator.say("stopping");
    let outcome = daemon.shutdown().await;
    narrator.say(match outcome {
        tether_supervisor::ShutdownOutcome::Clean => "stopped cleanly",
        tether_supervisor::ShutdownOutcome::GraceExceeded => {
            "stopped: the manager outlived the shutdown grace"
        }
    });
    Ok(match outcome {
        tether_supervisor::ShutdownOutcome::Clean => 0,
        tether_supervisor::ShutdownOutcome::GraceExceeded => 1,
    })
}

/// Tells what changes, every 100ms, for `how_long`, or (without it) until
/// the manager is up again with every remote reachable.
async fn narrate_until(daemon: &Daemon, narrator: &Narrator, how_long: Option<Duration>) {
    let deadline = how_long.map(|d| Instant::now() + d);
    loop {
        let status = daemon.supervisor.status();
        {
            let mut seen = narrator.seen();
            // A remote's change first: it is what ends or holds the cycle.
            for remote in &daemon.probes.status() {
                narrator.tell_remote(&mut seen, remote);
            }
            if status.cycle != seen.cycle {
                seen.cycle = status.cycle;
                narrator.say(&format!(
                    "cycle {} started: building the manager",
                    status.cycle
                ));
            }
            if seen.phase != Some(status.phase) {
                if status.phase == Phase::BackingOff {
                    let cause = status
                        .last_cause()
                        .map_or_else(String::new, tether_supervisor::Cause::in_words);
                    let wait = status.backoff.map_or(0.0, |b| b.as_secs_f64());
                    narrator.say(&format!(
                        "cycle {} ended: {cause}; rebuilding in {wait:.1}s (backoff)",
                        status.cycle
                    ));
                    let lost = status
                        .last_cause()
                        .is_some_and(|c| c.kind() == tether_supervisor::CauseKind::RemoteLost);
                    if lost && !seen.without_told {
                        seen.without_told = true;
                        narrator.say(&format!(
                            "  (without tether, the manager would not end: its watcher would retry {VICTIM} forever, the process would stay up and look healthy, and its caches of {VICTIM} would go stale with nothing said)"
                        ));
                    }
                }
                seen.phase = Some(status.phase);
            }
            if status.manager_up != seen.up {
                seen.up = status.manager_up;
                if seen.up {
                    seen.waiting_told = None;
                    narrator.say(&format!(
                        "cycle {}: manager up, every required cache synced",
                        status.cycle
                    ));
                }
            }
            if status.phase == Phase::Running && !status.manager_up {
                let due = seen
                    .waiting_told
                    .is_none_or(|told| told.elapsed() >= RETELL_EVERY);
                if due {
                    seen.waiting_told = Some(Instant::now());
                    narrator.say(&daemon.admin.status().verdict.text);
                }
            }
        }
        let settled = status.manager_up
            && daemon
                .probes
                .status()
                .iter()
                .all(|r| r.state == Reachability::Reachable);
        match deadline {
            Some(deadline) if Instant::now() >= deadline => return,
            None if settled => return,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
