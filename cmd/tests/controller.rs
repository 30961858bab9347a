//! The failure tether exists for, shown with a real controller-runtime
//! manager, and cured. `mirror-controller` (`tests/peers`, built by
//! `scripts/peers`) mirrors the ConfigMaps labelled `tether.test/mirror` of a
//! remote control plane into a home one; both are real kube-apiservers.
//!
//! Each fault is struck first at the bare controller (the baseline: what it
//! does by itself), then at the same program run by tether's exec manager
//! (the cure). `TETHER_TRIALS=<n>` strikes each fault `n` times under tether
//! (1 by default); the figures it prints are those of docs/benchmarks.md.

// Real processes: bounded polls on the real clock.
#![allow(clippy::disallowed_methods)]

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::matrix::detection_bound;
use common::mirror::{client, configmaps, create_labelled};
use common::{DEADLINE, Shape, Tether, collect, free_port, http_get, real_plane};
use tether_testkit::{ControlPlane, RealOptions, peer};

/// The exec manager's grace period for the controller.
const GRACE: Duration = Duration::from_secs(4);
/// How long a remote stays hung or refused in a trial.
const OUTAGE: Duration = Duration::from_secs(15);
/// How long the baseline waits for the bare controller to mirror after a
/// remote recovers before it records "never".
const PATIENCE: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// A new CA and token; the kubeconfig on disk rewritten.
    Recreated,
    /// SIGSTOP, then SIGCONT.
    Hung,
    /// The apiserver stopped, then started again on the same address.
    Refused,
}

const FAULTS: [Fault; 3] = [Fault::Recreated, Fault::Hung, Fault::Refused];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::Recreated => "recreated",
            Self::Hung => "hung",
            Self::Refused => "refused",
        }
    }

    /// Strikes the fault. A recreated remote is back at once, with
    /// credentials no kubeconfig has yet.
    async fn strike(self, remote: &ControlPlane) {
        match self {
            Self::Recreated => remote.recreate().await.expect("recreated"),
            Self::Hung => remote.pause().await,
            Self::Refused => remote.stop(),
        }
    }

    /// Ends a hang or a refusal; a recreated remote needs its kubeconfig.
    async fn recover(self, remote: &ControlPlane) {
        match self {
            Self::Recreated => {}
            Self::Hung => remote.resume(),
            Self::Refused => remote.restart().await.expect("started again"),
        }
    }
}

/// Whether `name`'s mirror is in the home cluster.
async fn mirrored(home: &ControlPlane, name: &str) -> bool {
    let mirror = configmaps(client(home).await)
        .get_opt(&format!("default-{name}"))
        .await
        .expect("the home cluster answers");
    mirror.is_some_and(|cm| cm.data.and_then(|d| d.get("made").cloned()).as_deref() == Some(name))
}

/// How long `name` takes to be mirrored, if within `limit`.
async fn until_mirrored(home: &ControlPlane, name: &str, limit: Duration) -> Option<Duration> {
    let since = Instant::now();
    common::poll(limit, common::EVERY, async || {
        mirrored(home, name).await.then(|| since.elapsed())
    })
    .await
}

/// The mirror controller, run bare, with its log.
struct Bare {
    child: tokio::process::Child,
    health: String,
    log: Arc<Mutex<String>>,
}

impl Bare {
    fn start(home: &Path, remote: &Path) -> Self {
        let health = format!("127.0.0.1:{}", free_port());
        let mut child = tokio::process::Command::new(peer("mirror-controller").expect("built"))
            .arg("--home-kubeconfig")
            .arg(home)
            .arg("--remote-kubeconfig")
            .arg(remote)
            .arg(format!("--health-probe-bind-address={health}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("mirror-controller starts");
        let log = collect(child.stderr.take().expect("piped"));
        Self { child, health, log }
    }

    async fn readyz(&self) -> Option<u16> {
        http_get(&self.health, "/readyz")
            .await
            .map(|(code, _)| code)
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    fn log(&self) -> String {
        self.log.lock().expect("not poisoned").clone()
    }
}

/// What the bare controller did through one fault.
#[derive(Debug)]
struct Baseline {
    fault: Fault,
    /// How long the remote was watched lost (recreated) or out.
    watched: Duration,
    /// Its log lines meanwhile, and one of them.
    lines: usize,
    sample: String,
    /// How long after recovery it mirrored a new object, if it did.
    mirrored_after: Option<Duration>,
}

/// Strikes `fault` at a bare controller that has synced, and watches it:
/// it stays running and ready throughout, and for a recreated remote it
/// never mirrors again.
async fn baseline(
    fault: Fault,
    home: &ControlPlane,
    remote: &ControlPlane,
    dir: &Path,
) -> Baseline {
    let (home_kubeconfig, remote_kubeconfig) = (dir.join("home"), dir.join("remote"));
    home.kubeconfig()
        .write(&home_kubeconfig)
        .expect("kubeconfig");
    remote
        .kubeconfig()
        .write(&remote_kubeconfig)
        .expect("kubeconfig");
    let mut bare = Bare::start(&home_kubeconfig, &remote_kubeconfig);
    let first = format!("bare-{}-first", fault.name());
    create_labelled(remote, &first).await;
    assert!(
        until_mirrored(home, &first, DEADLINE).await.is_some(),
        "the bare controller never mirrored: {}",
        bare.log()
    );
    let before = bare.log().lines().count();

    fault.strike(remote).await;
    let during = format!("bare-{}-during", fault.name());
    let watch = if fault == Fault::Recreated {
        // The operator does what tether would need: the new kubeconfig, on
        // disk, where the controller read it.
        remote
            .kubeconfig()
            .write(&remote_kubeconfig)
            .expect("kubeconfig");
        create_labelled(remote, &during).await;
        detection_bound() * 3
    } else {
        OUTAGE
    };
    let struck = Instant::now();
    while struck.elapsed() < watch {
        assert!(bare.running(), "the bare controller exited: {}", bare.log());
        assert_eq!(bare.readyz().await, Some(200), "its /readyz turned");
        if fault == Fault::Recreated {
            assert!(!mirrored(home, &during).await, "it mirrored the new remote");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let watched = struck.elapsed();
    fault.recover(remote).await;
    let mirrored_after = if fault == Fault::Recreated {
        assert!(!mirrored(home, &during).await, "it mirrored the new remote");
        None
    } else {
        create_labelled(remote, &during).await;
        until_mirrored(home, &during, PATIENCE).await
    };
    let log = bare.log();
    let new: Vec<&str> = log.lines().skip(before).collect();
    Baseline {
        fault,
        watched,
        lines: new.len(),
        sample: new
            .iter()
            .find(|l| l.contains("error") || l.contains("Failed"))
            .map_or_else(
                || "(no error logged)".to_owned(),
                |l| l.chars().take(300).collect(),
            ),
        mirrored_after,
    }
}

/// The pids of tether's mirror controllers (`comm` is cut at 15 bytes).
fn controllers(tether: u32) -> Vec<u32> {
    common::children(tether)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "mirror-controll")
        })
        .collect()
}

/// One trial of the cure: how long from the fault until the controller
/// was stopped, and from the recovery until the object made during the
/// outage was mirrored.
async fn cure(
    fault: Fault,
    trial: usize,
    tether: &Tether,
    home: &ControlPlane,
    remote: &ControlPlane,
) -> (Duration, Duration) {
    let pid = tether.child.id().expect("tether runs");
    tether.until_ready(true).await;
    let up = format!("cure-{}-{trial}-up", fault.name());
    create_labelled(remote, &up).await;
    assert!(
        until_mirrored(home, &up, DEADLINE).await.is_some(),
        "the controller under tether never mirrored; logs:\n{}",
        tether.logs()
    );
    assert_eq!(controllers(pid).len(), 1, "one controller runs");

    let struck = Instant::now();
    fault.strike(remote).await;
    let bound = detection_bound() + GRACE;
    while !controllers(pid).is_empty() {
        assert!(
            struck.elapsed() < bound,
            "{fault:?}: the controller still ran {bound:?} after the fault; logs:\n{}",
            tether.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = struck.elapsed();
    // While the remote is lost: no controller, and the pod is not ready.
    let lost = Instant::now();
    while lost.elapsed() < Duration::from_secs(3) {
        assert!(
            controllers(pid).is_empty(),
            "{fault:?}: a controller started while the remote was lost"
        );
        assert_eq!(
            tether.get("/readyz").await.map(|(c, _)| c),
            Some(503),
            "{fault:?}: ready while lost"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = format!("cure-{}-{trial}-during", fault.name());
    if fault == Fault::Recreated {
        create_labelled(remote, &during).await;
    }
    fault.recover(remote).await;
    if fault == Fault::Recreated {
        // The operator writes the new kubeconfig, and sends no signal.
        tether.write_kubeconfig("b", remote);
    } else {
        create_labelled(remote, &during).await;
    }
    let recovered = Instant::now();
    let Some(_) = until_mirrored(home, &during, DEADLINE).await else {
        panic!(
            "{fault:?}: the new controller never mirrored {during}; logs:\n{}",
            tether.logs()
        );
    };
    (stopped, recovered.elapsed())
}

fn exec_manager(home_kubeconfig: &Path) -> String {
    let port = free_port();
    format!(
        "{{exec: {{command: [{}, --home-kubeconfig, {}, --remote, b, --health-probe-bind-address=127.0.0.1:{port}], \
         readiness: {{httpGet: {{port: {port}, path: /readyz}}, period: 1s}}, gracePeriod: {}s}}}}",
        peer("mirror-controller").expect("built").display(),
        home_kubeconfig.display(),
        GRACE.as_secs()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_controller_stays_ready_on_a_stale_cache_and_tether_replaces_it() {
    let (home, remote) = tokio::join!(
        real_plane(RealOptions::default().name("home")),
        real_plane(RealOptions::default().name("b"))
    );
    let dir = tempfile::tempdir().expect("temp dir");

    let mut report = String::from("the bare controller:\n");
    for fault in FAULTS {
        let seen = baseline(fault, &home, &remote, dir.path()).await;
        let _ = writeln!(
            report,
            "  {:<9} watched {:>5.1}s: running, /readyz 200 throughout; {} log lines; mirrored after recovery: {}\n            e.g. {}",
            seen.fault.name(),
            seen.watched.as_secs_f64(),
            seen.lines,
            seen.mirrored_after.map_or_else(
                || "never".to_owned(),
                |d| format!("after {:.1}s", d.as_secs_f64())
            ),
            seen.sample,
        );
    }

    let home_kubeconfig = dir.path().join("home");
    home.kubeconfig()
        .write(&home_kubeconfig)
        .expect("kubeconfig");
    let manager = exec_manager(&home_kubeconfig);
    let tether = Tether::start(
        &[("b", &remote)],
        &[],
        &Shape {
            manager: Some(&manager),
            ..Shape::default()
        },
    );
    let trials = common::trials(1);
    let _ = writeln!(report, "under tether ({trials} trials each; median, max):");
    for fault in FAULTS {
        let (mut stopped, mut mirrored) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            let (s, m) = cure(fault, trial, &tether, &home, &remote).await;
            stopped.push(s);
            mirrored.push(m);
        }
        let (stopped, mirrored) = (common::median_max(stopped), common::median_max(mirrored));
        let _ = writeln!(
            report,
            "  {:<9} fault -> controller stopped {:.1}s, {:.1}s; recovery -> first mirrored {:.1}s, {:.1}s",
            fault.name(),
            stopped.0.as_secs_f64(),
            stopped.1.as_secs_f64(),
            mirrored.0.as_secs_f64(),
            mirrored.1.as_secs_f64(),
        );
    }
    println!("{report}");
}
