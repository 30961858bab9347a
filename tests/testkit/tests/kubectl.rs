//! The real `kubectl` against the `fake-apiserver` binary, over HTTPS with a
//! bearer token, as a person would use it.

// These tests drive real processes from plain threads, with no tokio runtime
// and no paused clock: std's clock is the right one for their deadlines.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long any one step may take before the test calls it a hang.
const STEP: Duration = Duration::from_secs(30);

/// A running `fake-apiserver`, killed on drop.
struct FakeApiserver {
    child: Child,
    kubeconfig: PathBuf,
    control: String,
    dir: tempfile::TempDir,
}

impl Drop for FakeApiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads lines from `stdout` on a thread, so the test can wait for one with a
/// deadline.
fn line_reader(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for a line containing `needle`; returns every line seen up to it.
fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + STEP;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {
                panic!("no line containing {needle:?} within {STEP:?}; saw {seen:?}")
            }
        }
    }
}

impl FakeApiserver {
    fn start(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tether-testkit-{tag}-"))
            .tempdir()
            .expect("a temporary directory can be made");
        let kubeconfig = dir.path().join("kubeconfig");
        let mut child = Command::new(env!("CARGO_BIN_EXE_fake-apiserver"))
            .args([
                "--tls",
                "--token",
                "kubectl-test-token",
                "--objects",
                "3",
                "--kubeconfig-out",
            ])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("fake-apiserver starts");
        let lines = line_reader(child.stdout.take().expect("stdout is piped"));
        let seen = wait_for_line(&lines, "kubeconfig:");
        let control = seen
            .iter()
            .find_map(|l| l.strip_prefix("control endpoint: http://"))
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the control endpoint is printed before the kubeconfig")
            .to_owned();
        Self {
            child,
            kubeconfig,
            control,
            dir,
        }
    }

    fn kubectl(&self, args: &[&str]) -> Command {
        let mut command = Command::new(kubectl());
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=20s")
            .args(args);
        command
    }

    /// Runs kubectl and asserts it succeeded.
    fn run(&self, args: &[&str]) -> String {
        let out: Output = self.kubectl(args).output().expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `GET path` on the control endpoint.
    fn control_get(&self, path: &str) -> String {
        let mut stream = TcpStream::connect(&self.control).expect("control endpoint accepts");
        stream.set_read_timeout(Some(STEP)).expect("set timeout");
        write!(stream, "GET {path} HTTP/1.0\r\nHost: control\r\n\r\n").expect("write request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read response");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default()
    }

    fn open_watches(&self) -> u64 {
        let stats: serde_json::Value =
            serde_json::from_str(&self.control_get("/stats")).expect("stats are JSON");
        stats["openWatches"]
            .as_u64()
            .expect("openWatches is a number")
    }
}

fn kubectl() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("kubectl"))
            .find(|candidate| candidate.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "kubectl is not on PATH; install it (Debian: apt-get install kubernetes-client, \
             or the kubectl binary from the Kubernetes release)"
        )
    })
}

fn write_manifest(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels:\n    app: kubectl-test\ndata:\n  greeting: hello\n"),
    )
    .expect("manifest can be written");
    path
}

#[test]
fn kubectl_lists_namespaces_and_configmaps() {
    let server = FakeApiserver::start("list");
    let namespaces = server.run(&["get", "namespaces"]);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(namespaces.contains(ns), "{ns} missing from:\n{namespaces}");
    }
    let configmaps = server.run(&["get", "configmaps", "-A"]);
    assert!(configmaps.contains("NAMESPACE"), "{configmaps}");
    for i in 0..3 {
        assert!(
            configmaps.contains(&format!("seed-0000{i}")),
            "{configmaps}"
        );
    }
}

#[test]
fn kubectl_gets_a_configmap_as_yaml() {
    let server = FakeApiserver::start("yaml");
    let yaml = server.run(&["get", "cm", "-n", "default", "seed-00001", "-o", "yaml"]);
    assert!(yaml.contains("kind: ConfigMap"), "{yaml}");
    assert!(yaml.contains("index: \"1\""), "{yaml}");
    assert!(yaml.contains("resourceVersion:"), "{yaml}");
    let list = server.run(&["get", "cm", "-n", "default", "-o", "yaml"]);
    assert!(
        list.contains("kind: List") && list.contains("seed-00002"),
        "{list}"
    );
}

#[test]
fn kubectl_creates_and_deletes_a_configmap() {
    let server = FakeApiserver::start("create");
    let manifest = write_manifest(server.dir.path(), "made-by-kubectl");
    let created = server.run(&["create", "-f", manifest.to_str().expect("utf-8 path")]);
    assert!(
        created.contains("configmap/made-by-kubectl created"),
        "{created}"
    );
    let data = server.run(&[
        "get",
        "cm",
        "made-by-kubectl",
        "-o",
        "jsonpath={.data.greeting}",
    ]);
    assert_eq!(data, "hello");
    let selected = server.run(&["get", "cm", "-l", "app=kubectl-test", "-o", "name"]);
    assert_eq!(selected.trim(), "configmap/made-by-kubectl");

    let deleted = server.run(&["delete", "cm", "made-by-kubectl"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let out = server
        .kubectl(&["get", "cm", "made-by-kubectl"])
        .output()
        .expect("kubectl runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}

#[test]
fn kubectl_with_a_wrong_token_is_unauthorized() {
    let server = FakeApiserver::start("auth");
    let config = std::fs::read_to_string(&server.kubeconfig).expect("kubeconfig exists");
    std::fs::write(
        &server.kubeconfig,
        config.replace("kubectl-test-token", "wrong-token"),
    )
    .expect("kubeconfig is writable");
    let out = server
        .kubectl(&["get", "namespaces"])
        .output()
        .expect("kubectl runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Unauthorized") || stderr.contains("must be logged in"),
        "{stderr}"
    );
}

#[test]
fn kubectl_watch_receives_an_event_made_after_it_started() {
    let server = FakeApiserver::start("watch");
    let mut watch = server
        .kubectl(&["get", "cm", "-n", "default", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl watch starts");
    let lines = line_reader(watch.stdout.take().expect("stdout is piped"));
    wait_for_line(&lines, "configmap/seed-00002");

    // Only once the watch is open does the object get made, so it can only
    // arrive through the watch.
    let deadline = Instant::now() + STEP;
    while server.open_watches() == 0 {
        assert!(Instant::now() < deadline, "kubectl never opened its watch");
        std::thread::yield_now();
    }
    let manifest = write_manifest(server.dir.path(), "made-after-watch");
    server.run(&["create", "-f", manifest.to_str().expect("utf-8 path")]);
    wait_for_line(&lines, "configmap/made-after-watch");

    let _ = watch.kill();
    let _ = watch.wait();
}
