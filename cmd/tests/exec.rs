//! The exec manager: tether runs a controller process as each cycle's
//! manager, with a real client-go program (kubectl) as the controller.

// Real processes: bounded polls with std's and tokio's real clocks.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::{
    DEADLINE, Shape, Tether, children, exec_kubeconfig, free_port, remote, running, until,
};
use serde_json::Value;
use tether_testkit::{ApiServer, Fault};

/// The test config's probes: interval 1s, timeout 500ms, 3 failures.
const DETECTION_BOUND: Duration = Duration::from_millis(3_500);

fn kubectl() -> String {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|candidate| candidate.is_file())
    });
    found
        .unwrap_or_else(|| {
            panic!(
                "kubectl is not on PATH; install it (the kubectl binary from the Kubernetes release)"
            )
        })
        .display()
        .to_string()
}

/// A `manager:` section running `command` (a YAML flow list).
fn exec(command: &str, extra: &str) -> String {
    format!("{{exec: {{command: {command}{extra}}}}}")
}

fn start(server: &ApiServer, manager: &str) -> Tether {
    Tether::start(
        &[("a", server)],
        &["--log-format", "json"],
        &Shape {
            manager: Some(manager),
            ..Shape::default()
        },
    )
}

/// `/status.json`, or null while the admin server is not up yet.
async fn status(tether: &Tether) -> Value {
    match tether.get("/status.json").await {
        Some((200, body)) => serde_json::from_str(&body).expect("status is JSON"),
        _ => Value::Null,
    }
}

/// Waits until `/status.json`'s process section satisfies `pred`.
async fn until_process(tether: &Tether, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    until(format!("the process {what}"), DEADLINE, async || {
        let process = status(tether).await["process"].clone();
        pred(&process).then_some(process)
    })
    .await
}

/// Waits for the first log event after `since` that `matches`.
async fn until_event(
    tether: &Tether,
    since: SystemTime,
    matches: impl Fn(&Value) -> bool,
) -> SystemTime {
    until("a log event that matches", DEADLINE, async || {
        tether.first_event(since, &matches)
    })
    .await
}

fn says(event: &Value, message: &str) -> bool {
    event["fields"]["message"] == message
}

/// Waits until `pid` is no longer running, for at most [`DEADLINE`].
async fn until_gone(pid: u32, what: &str) {
    until(format!("{what}: {pid} gone"), DEADLINE, async || {
        (!running(pid)).then_some(())
    })
    .await;
}

async fn until_file(path: &Path) -> String {
    until(
        format!("{} written", path.display()),
        DEADLINE,
        async || {
            std::fs::read_to_string(path)
                .ok()
                .filter(|text| text.ends_with('\n'))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_remote_stops_kubectl_and_a_new_kubectl_lists_again() {
    // `slow=1h` leaves the watch open and silent, as a partition does: the
    // case where kubectl itself would wait forever.
    for fault in [
        Fault::Slow(Duration::from_secs(3600)),
        Fault::Hang,
        Fault::Refuse,
    ] {
        let server = remote("a", true).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = common::write_kubeconfig(dir.path(), "kubectl", &server);
        let command = format!(
            "[{}, --kubeconfig, {}, get, configmaps, -A, --watch, -o, name]",
            kubectl(),
            kubeconfig.display()
        );
        let tether = start(&server, &exec(&command, ", gracePeriod: 2s"));
        let first = until_process(&tether, "started", |p| p["pid"].is_u64()).await["pid"].clone();
        // kubectl's output passes through tether's stdout unchanged.
        until("kubectl lists configmap/cm-2", DEADLINE, async || {
            tether.output().contains("configmap/cm-2").then_some(())
        })
        .await;
        tether.until_ready(true).await;

        let struck = SystemTime::now();
        server.set_fault(fault.clone()).await.expect("fault");
        // Over a reset connection kubectl ends by itself, and the next one
        // fails at once; over a silent one it would wait forever, and tether
        // stops it. Either way the kubectl that ran is gone within the bound.
        let first_pid = first.as_u64().expect("a pid");
        let ended = until_event(&tether, struck, |e| {
            e["fields"]["pid"].as_u64() == Some(first_pid)
                && [
                    "manager process stopped",
                    "manager process failed",
                    "manager process exited with code 0",
                ]
                .iter()
                .any(|m| says(e, m))
        })
        .await;
        let took = ended.duration_since(struck).expect("after the fault");
        println!(
            "{fault}: the running kubectl ended {took:?} after the loss (bound {DETECTION_BOUND:?} + gracePeriod 2s)"
        );
        assert!(
            took < DETECTION_BOUND + Duration::from_secs(2),
            "{fault}: kubectl ran on for {took:?}"
        );
        assert!(
            !running(u32::try_from(first_pid).expect("a pid")),
            "{fault}: the first kubectl outlived its cycle"
        );
        if matches!(fault, Fault::Slow(_)) {
            // The supervisor logs the cycle's end after the manager's stop.
            until_event(&tether, struck, |e| {
                says(e, "cycle ended") && e["fields"]["cycle"] == 1
            })
            .await;
            let cause = tether
                .logs()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| says(e, "cycle ended") && e["fields"]["cycle"] == 1)
                .map(|e| e["fields"]["cause"].clone());
            assert_eq!(
                cause.as_ref().and_then(Value::as_str),
                Some("remote_lost (remote a)"),
                "tether, not kubectl, ended the silent watch"
            );
        }

        let before = tether.output().matches("configmap/cm-2").count();
        let back = SystemTime::now();
        server.set_fault(Fault::Up).await.expect("up");
        until(
            format!("{fault}: a new kubectl lists after recovery"),
            DEADLINE,
            async || (tether.output().matches("configmap/cm-2").count() > before).then_some(()),
        )
        .await;
        let now = until_process(&tether, "restarted", |p| p["pid"].is_u64()).await;
        assert_ne!(now["pid"], first, "{fault}: a new kubectl, not the old one");
        println!(
            "{fault}: a new kubectl listed {:?} after the remote came back",
            back.elapsed().expect("clock")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_is_killed_at_the_grace_period_with_its_grandchildren() {
    let server = remote("a", false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let pids = dir.path().join("pids");
    // The child ignores SIGTERM, and so does the grandchild it forks.
    let script = format!(
        "trap '' TERM; (trap '' TERM; while :; do sleep 0.1; done) & echo $$ $! > {}; while :; do sleep 0.1; done",
        pids.display()
    );
    let tether = start(
        &server,
        &exec(&format!("[sh, -c, \"{script}\"]"), ", gracePeriod: 2s"),
    );
    let text = until_file(&pids).await;
    let (child, grandchild): (u32, u32) = {
        let mut it = text.split_whitespace().map(|p| p.parse().expect("a pid"));
        (it.next().expect("child"), it.next().expect("grandchild"))
    };
    assert!(running(child) && running(grandchild));

    let struck = SystemTime::now();
    server.set_fault(Fault::Refuse).await.expect("fault");
    let ended = until_process(&tether, "was stopped", |p| p["lastExit"].is_string()).await;
    assert_eq!(ended["lastExit"], "killed by SIGKILL", "{ended}");
    assert_eq!(ended["lastExitStopped"], true);
    let lost = tether
        .first_event(struck, |e| says(e, "remote apiserver unreachable"))
        .expect("the loss was logged");
    let killed = tether
        .first_event(struck, |e| {
            says(
                e,
                "the manager process did not stop within its grace period; SIGKILL",
            )
        })
        .expect("the SIGKILL was logged");
    let took = killed.duration_since(lost).expect("after the loss");
    println!("SIGTERM ignored: SIGKILL came {took:?} after the cycle ended (gracePeriod 2s)");
    assert!(
        took >= Duration::from_secs(2),
        "killed before its grace period: {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "killed long after its grace period: {took:?}"
    );
    assert!(!running(child), "the child outlived its cycle");
    assert!(!running(grandchild), "the grandchild outlived its cycle");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_exits_at_once_backs_off_and_says_how_it_ended() {
    let server = remote("a", false).await;
    let tether = start(&server, &exec("[sh, -c, \"exit 3\"]", ""));
    tether
        .until_metric("tether_manager_process_starts_total", ">= 4", |v| v >= 4.0)
        .await;
    let starts: Vec<SystemTime> = tether
        .logs()
        .lines()
        .filter_map(|line| {
            let event: Value = serde_json::from_str(line).ok()?;
            let at: jiff::Timestamp = event["timestamp"].as_str()?.parse().ok()?;
            says(&event, "manager process started").then(|| SystemTime::from(at))
        })
        .collect();
    let gaps: Vec<Duration> = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).expect("in order"))
        .collect();
    println!("a child that exits at once is started again after {gaps:?}");
    // Backoff 1s, 2s, 4s (no jitter in the test config): no storm.
    for (gap, floor) in gaps.iter().zip([1_000, 2_000, 4_000]) {
        assert!(
            *gap >= Duration::from_millis(floor - 50),
            "restarted after {gap:?}, before the backoff's {floor}ms: {gaps:?}"
        );
    }
    assert!(
        tether
            .metric("tether_cycles_total{cause=\"manager_failed\"}")
            .await
            >= Some(3.0)
    );
    assert_eq!(
        tether.metric("tether_manager_process_exit_code").await,
        Some(3.0)
    );
    let process = status(&tether).await["process"].clone();
    assert_eq!(process["lastExit"], "exit code 3");
    assert_eq!(process["lastExitStopped"], false);
    assert!(tether.logs().contains("exit code 3"));
}

/// A program missing at start is bad input: `run` exits 2 naming it, and
/// starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_at_start_is_refused_naming_the_path() {
    let server = remote("a", false).await;
    let mut tether = start(&server, &exec("[/nonexistent/controller, --flag]", ""));
    let status = tether.wait().await;
    assert_eq!(status.code(), Some(2), "{}", tether.logs());
    let logs = tether.logs();
    assert!(
        logs.contains("manager.exec.command")
            && logs.contains("/nonexistent/controller does not exist"),
        "{logs}"
    );
}

/// A program removed after start is that cycle's build failure, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_removed_after_start_is_build_failed_and_names_the_path() {
    use std::os::unix::fs::PermissionsExt as _;

    let server = remote("a", false).await;
    let dir = tempfile::tempdir().expect("dir");
    let program = dir.path().join("controller");
    std::fs::write(&program, "#!/bin/sh\nexit 3\n").expect("script");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let tether = start(
        &server,
        &exec(&format!("[{}, --flag]", program.display()), ""),
    );
    tether
        .until_metric("tether_manager_process_starts_total", ">= 1", |v| v >= 1.0)
        .await;
    std::fs::remove_file(&program).expect("remove");
    let started = tether
        .metric("tether_manager_process_starts_total")
        .await
        .expect("counted");
    tether
        .until_metric("tether_cycles_total{cause=\"build_failed\"}", ">= 1", |v| {
            v >= 1.0
        })
        .await;
    let process = until_process(&tether, "failed to spawn", |p| p["spawnError"].is_string()).await;
    let error = process["spawnError"].as_str().expect("a string");
    assert!(
        error.contains(&program.display().to_string())
            && error.contains("No such file or directory"),
        "{error}"
    );
    assert!(
        tether.metric("tether_manager_process_starts_total").await <= Some(started + 1.0),
        "a missing program was started"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_is_up_only_once_the_childs_readiness_answers() {
    let server = remote("a", false).await;
    let port = free_port();
    let python = "python3";
    assert!(
        std::process::Command::new(python)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "python3 is not on PATH: apt-get install python3"
    );
    // The child prints its cycle, then serves HTTP only after 2s.
    let script = format!(
        "echo cycle=$TETHER_CYCLE; sleep 2; exec {python} -m http.server {port} --bind 127.0.0.1"
    );
    let tether = start(
        &server,
        &exec(
            &format!("[sh, -c, \"{script}\"]"),
            &format!(", readiness: {{httpGet: {{port: {port}, path: /}}, period: 200ms}}"),
        ),
    );
    until_process(&tether, "started", |p| p["pid"].is_u64()).await;
    let listening = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let mut seen_down = false;
    until("the manager up", DEADLINE, async || {
        if tether.metric("tether_manager_up").await == Some(1.0) {
            assert!(listening(), "up before the child's endpoint answered");
            return Some(());
        }
        seen_down |= !listening();
        None
    })
    .await;
    assert!(
        seen_down,
        "the manager was seen down while its endpoint was closed"
    );
    tether.until_ready(true).await;
    assert!(
        tether.output().contains("cycle=1"),
        "TETHER_CYCLE reaches the child: {}",
        tether.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_child_and_exits_0_and_a_second_one_kills_it() {
    let server = remote("a", false).await;
    let mut tether = start(&server, &exec("[sleep, \"1000\"]", ", gracePeriod: 3s"));
    let pid = until_process(&tether, "started", |p| p["pid"].is_u64()).await["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .expect("a pid");
    tether
        .terminates_cleanly_within(Duration::from_secs(5))
        .await;
    assert!(!running(pid), "the child outlived tether");

    let dir = tempfile::tempdir().expect("temp dir");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.1; done",
        ready.display()
    );
    let mut tether = start(
        &server,
        &exec(&format!("[sh, -c, \"{script}\"]"), ", gracePeriod: 4s"),
    );
    let pid: u32 = until_file(&ready).await.trim().parse().expect("a pid");
    tether.signal("TERM");
    // The first signal set the drain: wait for it, then the second.
    tether.until_ready(false).await;
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(130), "{}", tether.logs());
    // tether sends SIGKILL and exits at once; the kernel ends the child
    // right after.
    until_gone(pid, "the second SIGTERM killed the child").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_tether_reaps_an_orphaned_grandchild() {
    assert!(
        rustix::process::getuid().is_root(),
        "this test needs root, for a PID namespace (CI runs as root)"
    );
    let server = remote("a", false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let orphan = dir.path().join("orphan");
    // The subshell forks a process and exits at once: the process is
    // orphaned to PID 1, tether, and exits a second later.
    let script = format!(
        "(sh -c 'echo ok > {}; sleep 1' &); exec sleep 1000",
        orphan.display()
    );
    let tether = Tether::start(
        &[("a", &server)],
        &[],
        &Shape {
            manager: Some(&exec(&format!("[sh, -c, \"{script}\"]"), "")),
            wrap: &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],
            ..Shape::default()
        },
    );
    until_file(&orphan).await;
    let unshare = tether.child.id().expect("running");
    let init = children(unshare)
        .into_iter()
        .next()
        .expect("tether runs under unshare");
    // First the orphan is tether's child (it sleeps a second)...
    until("the orphan reparented to tether", DEADLINE, async || {
        (children(init).len() >= 2).then_some(())
    })
    .await;
    // ...then, once it exits, it must not stay a zombie.
    until(
        "tether (pid 1) has no zombie, and only its manager as a child",
        DEADLINE,
        async || {
            let zombies = children(init).into_iter().filter(|p| !running(*p)).count();
            (zombies == 0 && children(init).len() == 1).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_tether_leaves_a_credential_plugins_exit_to_its_caller() {
    assert!(
        rustix::process::getuid().is_root(),
        "this test needs root, for a PID namespace (CI runs as root)"
    );
    let server = remote("a", false).await;
    // The plugin answers at once, but a process it leaves behind holds its
    // output open for 3 s: the plugin is a zombie for that long, and its
    // exit status is its caller's to take, not the PID 1 reaper's.
    let credential = "{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{\\\"token\\\":\\\"t\\\"}}";
    let plugin = exec_kubeconfig(&server, &format!("printf '%s' '{credential}'; sleep 3 &"));
    let tether = Tether::start(
        &[("a", &server)],
        &[],
        &Shape {
            kubeconfigs: &[("a", &plugin)],
            wrap: &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],
            ..Shape::default()
        },
    );
    // Ready: the probe's client and the watch's were built, each waiting
    // for the plugin's exit.
    tether.until_ready(true).await;
    let logs = tether.logs();
    assert!(!logs.contains("No child processes"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_tether_warns_of_a_process_that_left_the_managers_group() {
    assert!(
        rustix::process::getuid().is_root(),
        "this test needs root, for a PID namespace (CI runs as root)"
    );
    let server = remote("a", false).await;
    // A subshell starts a process in a session of its own and exits: the
    // process is reparented to tether, outside the group tether stops.
    let tether = Tether::start(
        &[("a", &server)],
        &[],
        &Shape {
            manager: Some(&exec(
                "[sh, -c, \"(setsid sleep 30 &); exec sleep 1000\"]",
                "",
            )),
            wrap: &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"],
            ..Shape::default()
        },
    );
    let warning = "a process left the manager's process group";
    until(warning, DEADLINE, async || {
        tether.logs().contains(warning).then_some(())
    })
    .await;
    // Only the escapee, by the name it settled on: never the manager
    // itself, seen between its fork and its registration.
    let logs = tether.logs();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("a process left the manager's process group"))
        .collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("process=sleep"),
        "{logs}"
    );
}
