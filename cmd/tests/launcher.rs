//! The exec manager's process started by `tether launcher` in another
//! container (`manager.exec.launcher`): tether keeps every decision, the
//! launcher's connection is the fence, and the process can have a home
//! ServiceAccount of its own (`manager.exec.serviceAccount`), whose tokens
//! tether requests from a real kube-apiserver.

// Real processes: bounded polls with std's and tokio's real clocks.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{DEADLINE, Shape, Tether, kill, remote, running, stat, until};
use serde_json::Value;
use tether_testkit::{ApiServer, Fault, RealOptions};
use tokio::process::{Child, Command};

/// `tether launcher --socket <socket>`, its output collected.
struct Launcher {
    child: Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
}

impl Launcher {
    fn start(socket: &Path) -> Self {
        let mut child = Command::new(common::binary())
            .args(["--log-format", "json", "launcher", "--socket"])
            .arg(socket)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the launcher starts");
        let out = common::collect(child.stdout.take().expect("piped"));
        let err = common::collect(child.stderr.take().expect("piped"));
        Self { child, out, err }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    fn logs(&self) -> String {
        self.err.lock().expect("not poisoned").clone()
    }

    /// What the processes it started wrote on stdout.
    fn output(&self) -> String {
        self.out.lock().expect("not poisoned").clone()
    }
}

/// tether over `server` as `a`, its manager `command` started by the
/// launcher on `socket`.
fn tether(server: &ApiServer, socket: &Path, command: &str) -> Tether {
    Tether::start(
        &[("a", server)],
        &["--log-format", "json"],
        &Shape {
            manager: Some(&format!(
                "{{exec: {{command: {command}, gracePeriod: 3s, launcher: {{socket: {}}}}}}}",
                socket.display()
            )),
            ..Shape::default()
        },
    )
}

/// A script that writes `<its pid> <its parent's pid>` and its
/// environment into `dir` (each file whole, by rename), says hello on
/// stdout, and sleeps.
fn reporter(dir: &Path) -> PathBuf {
    let script = dir.join("report.sh");
    std::fs::write(
        &script,
        format!(
            "env > {d}/env.next && mv {d}/env.next {d}/env\n\
             echo \"$$ $PPID\" > {d}/pid.next && mv {d}/pid.next {d}/pid\n\
             echo hello from the process\n\
             exec sleep 1000\n",
            d = dir.display()
        ),
    )
    .expect("script");
    script
}

/// The `(pid, parent pid)` the reporter wrote last, once it differs from
/// `not`. The reporter writes its environment first, so it is there by
/// then.
async fn reported(dir: &Path, not: Option<u32>) -> (u32, u32) {
    until("the process reports its pid", DEADLINE, async || {
        let text = std::fs::read_to_string(dir.join("pid")).ok()?;
        let mut it = text.split_whitespace().map(|p| p.parse::<u32>().ok());
        let (pid, parent) = (it.next()??, it.next()??);
        (Some(pid) != not && running(pid)).then_some((pid, parent))
    })
    .await
}

async fn until_gone(pid: u32, what: &str) {
    until(format!("{what}: {pid} gone"), DEADLINE, async || {
        (!running(pid)).then_some(())
    })
    .await;
}

async fn process_status(tether: &Tether) -> Value {
    match tether.get("/status.json").await {
        Some((200, body)) => serde_json::from_str::<Value>(&body).expect("JSON")["process"].clone(),
        _ => Value::Null,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_launcher_starts_and_stops_the_process_as_tether_says_and_kills_it_when_tether_dies() {
    let server = remote("a", false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("launcher.sock");
    let launcher = Launcher::start(&socket);
    let script = reporter(dir.path());
    let mut first = tether(&server, &socket, &format!("[sh, {}]", script.display()));

    // Started by the launcher, not by tether: its parent is the launcher's
    // child shim, which became it (`exec`), so the launcher itself.
    let (pid, parent) = reported(dir.path(), None).await;
    assert_eq!(parent, launcher.pid(), "the launcher started the process");
    let tether_pid = first.child.id().expect("running");
    assert_ne!(
        stat(pid).map(|s| s.ppid),
        i32::try_from(tether_pid).ok(),
        "not tether"
    );
    let env = std::fs::read_to_string(dir.path().join("env")).expect("env");
    for var in ["TETHER_CYCLE=1", "TETHER_REMOTES=a", "TETHER_REMOTES_FILE="] {
        assert!(env.lines().any(|l| l.starts_with(var)), "{var} in:\n{env}");
    }
    let shown = until("/status.json shows the pid", DEADLINE, async || {
        let process = process_status(&first).await;
        (process["pid"].as_u64() == Some(u64::from(pid))).then_some(process)
    })
    .await;
    println!("launcher: the process runs as {pid}, child of the launcher: {shown}");
    until(
        "the process's stdout is the launcher's",
        DEADLINE,
        async || {
            launcher
                .output()
                .contains("hello from the process")
                .then_some(())
        },
    )
    .await;

    // A required remote lost: tether stops it through the launcher.
    server.set_fault(Fault::Refuse).await.expect("fault");
    until_gone(pid, "the lost remote's cycle stopped the process").await;
    let stopped = until("tether records how it ended", DEADLINE, async || {
        let process = process_status(&first).await;
        process["lastExit"].is_string().then_some(process)
    })
    .await;
    assert_eq!(stopped["lastExitStopped"], true, "{stopped}");
    assert_eq!(stopped["lastExit"], "killed by SIGTERM", "{stopped}");
    server.set_fault(Fault::Up).await.expect("fault");
    let (second, parent) = reported(dir.path(), Some(pid)).await;
    assert_eq!(parent, launcher.pid());

    // tether SIGKILLed: the closed connection has the launcher kill the
    // process at once, and it serves the next tether.
    kill(tether_pid, "KILL");
    let _ = first.wait().await;
    until_gone(second, "tether's death killed the process").await;
    assert!(
        launcher
            .logs()
            .contains("tether's connection closed: killing the process group"),
        "{}",
        launcher.logs()
    );
    let _next = tether(&server, &socket, &format!("[sh, {}]", script.display()));
    let (third, parent) = reported(dir.path(), Some(second)).await;
    assert_eq!(
        parent,
        launcher.pid(),
        "the same launcher serves the next tether"
    );
    assert!(running(third));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_that_dies_takes_its_process_and_ends_the_cycle_and_a_new_one_is_used() {
    let server = remote("a", false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("launcher.sock");
    let launcher = Launcher::start(&socket);
    let script = reporter(dir.path());
    let tether = tether(&server, &socket, &format!("[sh, {}]", script.display()));
    let (pid, _) = reported(dir.path(), None).await;

    kill(launcher.pid(), "KILL");
    until_gone(pid, "the process died with its launcher").await;
    tether
        .until_metric(
            "tether_cycles_total{cause=\"manager_failed\"}",
            ">= 1",
            |v| v >= 1.0,
        )
        .await;
    assert!(
        tether
            .logs()
            .contains("the launcher's connection closed before the process ended"),
        "{}",
        tether.logs()
    );

    // The launcher's container restarted: a new launcher on the same
    // socket, which the next cycle uses.
    let again = Launcher::start(&socket);
    let (next, parent) = reported(dir.path(), Some(pid)).await;
    assert_eq!(parent, again.pid(), "the new launcher started it");
    assert!(running(next));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_launcher_on_a_socket_in_use_or_a_file_that_is_not_one_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("launcher.sock");
    let first = Launcher::start(&socket);
    until("the first launcher listens", DEADLINE, async || {
        first.logs().contains("launcher listening").then_some(())
    })
    .await;
    let said = refused_on(&socket);
    assert!(said.contains("another launcher answers on"), "{said}");
    assert!(socket.exists(), "the first one's socket is left alone");

    // A file that is not a socket is not taken for a stale one.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").expect("file");
    let said = refused_on(&file);
    assert!(said.contains("exists and is not a socket"), "{said}");
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep me");
}

/// `tether launcher --socket <path>`, which must refuse with exit code 2:
/// what it said.
fn refused_on(path: &Path) -> String {
    let out = std::process::Command::new(common::binary())
        .args(["launcher", "--socket"])
        .arg(path)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "refused as bad input");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The process's own ServiceAccount: tether requests its token from a real
/// apiserver (its own credentials are the admin's), and the process, given
/// only that, is who the token says, may do what its Role allows and gets
/// 403 for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_reaches_home_as_its_own_service_account_and_nothing_more() {
    let home = common::real_plane(RealOptions::default().name("home")).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let admin = dir.path().join("admin.kubeconfig");
    home.kubeconfig().write(&admin).expect("kubeconfig");
    grant(&admin);
    let out = dir.path();
    let script = home_script(out);
    let socket = out.join("launcher.sock");
    let _launcher = Launcher::start(&socket);
    let tether = Tether::start(
        &[("home", &home)],
        &["--log-format", "json"],
        &Shape {
            manager: Some(&format!(
                "{{exec: {{command: [sh, {}], launcher: {{socket: {}}}, serviceAccount: {{name: controller, namespace: default}}}}}}",
                script.display(),
                socket.display()
            )),
            // tether's own home credentials: the admin's.
            env: &[("KUBECONFIG", admin.to_str().expect("UTF-8"))],
            ..Shape::default()
        },
    );
    until(
        "the process has asked the home cluster",
        DEADLINE,
        async || {
            tether.alive();
            out.join("done").exists().then_some(())
        },
    )
    .await;
    let read = |name: &str| std::fs::read_to_string(out.join(name)).expect("written");
    assert_eq!(
        read("who").trim(),
        "system:serviceaccount:default:controller",
        "the process is its own ServiceAccount"
    );
    let configmaps = read("configmaps");
    assert!(
        configmaps.contains("configmap/visible") && configmaps.ends_with("exit 0\n"),
        "its Role allows ConfigMaps:\n{configmaps}"
    );
    let secret = read("secret");
    assert!(
        secret.contains("Forbidden")
            && secret.contains("system:serviceaccount:default:controller")
            && secret.ends_with("exit 1\n"),
        "403 for the Secret:\n{secret}"
    );
    let kubeconfig = read("kubeconfig");
    assert!(
        kubeconfig.contains("tokenFile"),
        "the token is read from a file, so it can be replaced: {kubeconfig}"
    );
    assert!(
        !kubeconfig.contains(&home.token()),
        "no admin credential in it"
    );
    println!(
        "launcher: the process is {} at home: ConfigMaps allowed, the Secret 403",
        read("who").trim()
    );
}

/// With the admin's `kubeconfig`: the ServiceAccount `default/controller`,
/// allowed to read ConfigMaps in `default`, one ConfigMap there, and a
/// Secret it may not read.
fn grant(kubeconfig: &Path) {
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs (install it: the kubectl binary from the Kubernetes release)");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    kubectl(&["-n", "default", "create", "serviceaccount", "controller"]);
    kubectl(&["-n", "default", "create", "configmap", "visible"]);
    kubectl(&[
        "-n",
        "default",
        "create",
        "role",
        "configmaps",
        "--verb=get,list",
        "--resource=configmaps",
    ]);
    kubectl(&[
        "-n",
        "default",
        "create",
        "rolebinding",
        "configmaps",
        "--role=configmaps",
        "--serviceaccount=default:controller",
    ]);
    kubectl(&[
        "-n",
        "default",
        "create",
        "secret",
        "generic",
        "argocd-secret",
        "--from-literal=admin.password=not-for-the-controller",
    ]);
}

/// A script that asks the home cluster, with `$KUBECONFIG`, who it is, for
/// the ConfigMaps and for the Secret, writes the answers into `out`, and
/// sleeps.
fn home_script(out: &Path) -> PathBuf {
    let script = out.join("home.sh");
    std::fs::write(
        &script,
        format!(
            "kubectl auth whoami -o jsonpath='{{.status.userInfo.username}}' > {d}/who 2>&1\n\
             kubectl -n default get configmaps -o name > {d}/configmaps 2>&1; echo \"exit $?\" >> {d}/configmaps\n\
             kubectl -n default get secret argocd-secret > {d}/secret 2>&1; echo \"exit $?\" >> {d}/secret\n\
             cp \"$KUBECONFIG\" {d}/kubeconfig\n\
             touch {d}/done\n\
             exec sleep 1000\n",
            d = out.display()
        ),
    )
    .expect("script");
    script
}
