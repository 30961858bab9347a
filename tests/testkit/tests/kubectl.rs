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
        Self::start_with(tag, &[])
    }

    /// Started with `extra` flags too.
    fn start_with(tag: &str, extra: &[&std::ffi::OsStr]) -> Self {
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
            .args(extra)
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

    fn stat(&self, name: &str) -> u64 {
        let stats: serde_json::Value =
            serde_json::from_str(&self.control_get("/stats")).expect("stats are JSON");
        stats[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} is a number in {stats}"))
    }

    /// Waits until the control endpoint's `name` reaches `at_least`.
    fn until_stat(&self, name: &str, at_least: u64) {
        let deadline = Instant::now() + STEP;
        while self.stat(name) < at_least {
            assert!(
                Instant::now() < deadline,
                "{name} stayed below {at_least} for {STEP:?}"
            );
            std::thread::yield_now();
        }
    }

    /// Starts a kubectl that streams (`-w`); returns it, killed on drop,
    /// and its output lines.
    fn stream(&self, args: &[&str]) -> (Streaming, mpsc::Receiver<String>) {
        let mut child = self
            .kubectl(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kubectl starts");
        let lines = line_reader(child.stdout.take().expect("stdout is piped"));
        (Streaming(child), lines)
    }
}

/// A streaming kubectl, killed on drop.
struct Streaming(Child);

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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

/// Killed and started again with the same `--state-dir`, it comes back at
/// the same address with the same CA: the kubeconfig written before still
/// reaches it, as after an apiserver's restart.
#[test]
fn killed_and_started_again_with_a_state_dir_it_comes_back_as_itself() {
    let state = tempfile::tempdir().expect("dir");
    let flags = [
        std::ffi::OsStr::new("--state-dir"),
        state.path().as_os_str(),
    ];
    let first = FakeApiserver::start_with("state-1", &flags);
    let written = std::fs::read_to_string(&first.kubeconfig).expect("kubeconfig");
    assert_eq!(first.run(&["get", "--raw", "/readyz"]), "ok");
    drop(first);
    let second = FakeApiserver::start_with("state-2", &flags);
    assert_eq!(
        std::fs::read_to_string(&second.kubeconfig).expect("kubeconfig"),
        written,
        "a new address, CA or token"
    );
    std::fs::write(&second.kubeconfig, &written).expect("the old kubeconfig");
    assert_eq!(second.run(&["get", "--raw", "/readyz"]), "ok");
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
    let (_watch, lines) = server.stream(&["get", "cm", "-n", "default", "-w", "-o", "name"]);
    wait_for_line(&lines, "configmap/seed-00002");

    // Only once the watch is open does the object get made, so it can only
    // arrive through the watch.
    server.until_stat("openWatches", 1);
    let manifest = write_manifest(server.dir.path(), "made-after-watch");
    server.run(&["create", "-f", manifest.to_str().expect("utf-8 path")]);
    wait_for_line(&lines, "configmap/made-after-watch");
}

impl FakeApiserver {
    /// Runs kubectl, asserts it failed, and returns its error output.
    fn fail(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).output().expect("kubectl runs");
        assert!(
            !out.status.success(),
            "kubectl {args:?} succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn write_file(&self, name: &str, text: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("the file can be written");
        path.to_str().expect("utf-8 path").to_owned()
    }

    fn resource_version(&self, object: &str) -> String {
        self.run(&["get", object, "-o", "jsonpath={.metadata.resourceVersion}"])
    }
}

/// Waits for `child` to exit, within [`STEP`].
fn exits_within_step(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not exit within {STEP:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const SSA_MANIFEST: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  namespace: default\ndata:\n  greeting: hello\n";

#[test]
fn kubectl_creates_a_configmap_from_literals_and_a_second_create_already_exists() {
    let server = FakeApiserver::start("literal");
    let before = server.stat("protobufRequests");
    let create = [
        "create",
        "configmap",
        "demo",
        "-n",
        "default",
        "--from-literal=a=b",
    ];
    let created = server.run(&create);
    assert_eq!(created.trim(), "configmap/demo created");
    assert!(
        server.stat("protobufRequests") > before,
        "kubectl's typed client sends the create as protobuf"
    );
    assert_eq!(
        server.run(&["get", "cm", "demo", "-o", "jsonpath={.data.a}"]),
        "b"
    );
    let managers = server.run(&[
        "get",
        "cm",
        "demo",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}/{.metadata.managedFields[*].operation}",
    ]);
    assert_eq!(managers, "kubectl-create/Update");

    let stderr = server.fail(&create);
    assert!(
        stderr.contains("configmaps \"demo\" already exists"),
        "{stderr}"
    );
}

#[test]
fn kubectl_apply_twice_changes_nothing_the_second_time_client_side_and_server_side() {
    let server = FakeApiserver::start("apply");
    let manifest = write_manifest(server.dir.path(), "applied");
    let manifest = manifest.to_str().expect("utf-8 path");
    assert_eq!(
        server.run(&["apply", "-f", manifest]).trim(),
        "configmap/applied created"
    );
    let version = server.resource_version("cm/applied");
    assert_eq!(
        server.run(&["apply", "-f", manifest]).trim(),
        "configmap/applied unchanged"
    );
    assert_eq!(server.resource_version("cm/applied"), version);

    let ssa = server.write_file("ssa.yaml", SSA_MANIFEST);
    let mut versions = Vec::new();
    for _ in 0..2 {
        let out = server.run(&["apply", "--server-side", "-f", &ssa]);
        assert_eq!(out.trim(), "configmap/ssa serverside-applied");
        versions.push(server.resource_version("cm/ssa"));
    }
    assert_eq!(
        versions[0], versions[1],
        "the second server-side apply wrote nothing"
    );
    let managers = server.run(&[
        "get",
        "cm",
        "ssa",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[0].manager}/{.metadata.managedFields[0].operation}",
    ]);
    assert_eq!(managers, "kubectl/Apply");
}

#[test]
fn kubectl_server_side_apply_over_another_managers_field_conflicts_until_forced() {
    let server = FakeApiserver::start("conflict");
    let ssa = server.write_file("ssa.yaml", SSA_MANIFEST);
    server.run(&["apply", "--server-side", "-f", &ssa]);
    server.run(&[
        "patch",
        "cm",
        "ssa",
        "-p",
        r#"{"data":{"greeting":"changed"}}"#,
    ]);

    let stderr = server.fail(&["apply", "--server-side", "-f", &ssa]);
    assert!(
        stderr.contains(r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: .data.greeting"#),
        "{stderr}"
    );
    assert!(
        stderr.contains("--force-conflicts"),
        "kubectl explains the way out: {stderr}"
    );
    assert_eq!(
        server.run(&["get", "cm", "ssa", "-o", "jsonpath={.data.greeting}"]),
        "changed"
    );

    server.run(&["apply", "--server-side", "--force-conflicts", "-f", &ssa]);
    assert_eq!(
        server.run(&["get", "cm", "ssa", "-o", "jsonpath={.data.greeting}"]),
        "hello"
    );
}

#[test]
fn kubectl_patches_labels_and_annotates() {
    let server = FakeApiserver::start("patch");
    server.run(&[
        "create",
        "configmap",
        "p",
        "--from-literal=a=1",
        "--from-literal=gone=x",
    ]);
    server.run(&[
        "patch",
        "cm",
        "p",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"m":"2","gone":null}}"#,
    ]);
    server.run(&[
        "patch",
        "cm",
        "p",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/data/a","value":"3"}]"#,
    ]);
    server.run(&["patch", "cm", "p", "-p", r#"{"data":{"s":"4"}}"#]);
    assert_eq!(
        server.run(&["get", "cm", "p", "-o", "jsonpath={.data}"]),
        r#"{"a":"3","m":"2","s":"4"}"#
    );
    let failed = server.fail(&[
        "patch",
        "cm",
        "p",
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/data/a","value":"no"}]"#,
    ]);
    assert!(
        failed.contains("The request is invalid") && failed.contains("value did not match"),
        "a failed test operation is a 422 that says why: {failed}"
    );

    server.run(&["label", "cm", "p", "tier=web"]);
    server.run(&["annotate", "cm", "p", "note=hi"]);
    assert_eq!(
        server.run(&[
            "get",
            "cm",
            "-l",
            "tier=web",
            "-o",
            "jsonpath={.items[*].metadata.annotations.note}"
        ]),
        "hi"
    );
    let stderr = server.fail(&["label", "cm", "p", "tier=db"]);
    assert!(stderr.contains("--overwrite"), "{stderr}");
}

#[test]
fn kubectl_get_watch_json_and_wait_for_delete_see_the_changes() {
    let server = FakeApiserver::start("wait");
    server.run(&["create", "configmap", "w", "--from-literal=a=1"]);
    let (_watch, lines) = server.stream(&["get", "cm", "w", "-o", "json", "-w"]);
    wait_for_line(&lines, r#""name": "w""#);
    server.until_stat("openWatches", 1);
    server.run(&["label", "cm", "w", "seen=yes"]);
    wait_for_line(&lines, r#""seen": "yes""#);

    let mut wait = server
        .kubectl(&["wait", "--for=delete", "cm/w", "--timeout=25s"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kubectl wait starts");
    server.until_stat("openWatches", 2);
    assert_eq!(
        server.run(&["delete", "cm", "w"]).trim(),
        r#"configmap "w" deleted"#
    );
    assert!(
        exits_within_step(&mut wait).success(),
        "kubectl wait saw the delete"
    );
    let mut said = String::new();
    wait.stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut said)
        .expect("read");
    assert_eq!(said.trim(), "configmap/w condition met");
}

#[test]
fn kubectl_creates_a_lease_from_yaml_and_reads_it_back() {
    let server = FakeApiserver::start("lease");
    let lease = server.write_file(
        "lease.yaml",
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: tether\n  namespace: default\n\
         spec:\n  holderIdentity: pod-a\n  leaseDurationSeconds: 15\n  acquireTime: \"2026-11-30T10:00:00.000000Z\"\n\
         \x20 renewTime: \"2026-11-30T10:00:05.123456Z\"\n  leaseTransitions: 0\n",
    );
    assert_eq!(
        server.run(&["create", "-f", &lease]).trim(),
        "lease.coordination.k8s.io/tether created"
    );
    let yaml = server.run(&["get", "lease", "tether", "-o", "yaml"]);
    for line in [
        "holderIdentity: pod-a",
        "leaseDurationSeconds: 15",
        "leaseTransitions: 0",
        "acquireTime: \"2026-11-30T10:00:00.000000Z\"",
        "renewTime: \"2026-11-30T10:00:05.123456Z\"",
    ] {
        assert!(yaml.contains(line), "{line:?} missing from:\n{yaml}");
    }
    let stderr = server.fail(&["create", "-f", &lease]);
    assert!(stderr.contains("already exists"), "{stderr}");

    // kubectl asks for strict field validation: an unknown field, or one of
    // the wrong type, is refused by name.
    let bad = |name: &str, field: &str| {
        server.write_file(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: {name}\nspec:\n  {field}\n"
            ),
        )
    };
    let stderr = server.fail(&["create", "-f", &bad("unknown", "holderIdentityy: pod-a")]);
    assert!(
        stderr.contains(r#"strict decoding error: unknown field "spec.holderIdentityy""#),
        "{stderr}"
    );
    let stderr = server.fail(&[
        "create",
        "-f",
        &bad("mistyped", "leaseDurationSeconds: \"15\""),
    ]);
    assert!(
        stderr.contains("spec.leaseDurationSeconds: cannot unmarshal string"),
        "{stderr}"
    );
    let leases = server.run(&["get", "leases", "-o", "name"]);
    assert_eq!(
        leases.trim(),
        "lease.coordination.k8s.io/tether",
        "nothing half-made"
    );
}

#[test]
fn kubectl_events_lists_and_watches_over_protobuf() {
    let server = FakeApiserver::start("events");
    let event = |name: &str, message: &str| {
        server.write_file(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Event\nmetadata:\n  name: {name}\n  namespace: default\n\
                 involvedObject:\n  kind: ConfigMap\n  name: seed-00000\n  namespace: default\n\
                 reason: Tested\nmessage: {message}\ntype: Normal\ncount: 1\n\
                 firstTimestamp: \"2026-11-30T10:00:00Z\"\nlastTimestamp: \"2026-11-30T10:00:00Z\"\n"
            ),
        )
    };
    server.run(&["create", "-f", &event("e1", "first")]);
    let (_watch, lines) = server.stream(&["events", "-n", "default", "--watch"]);
    wait_for_line(&lines, "first");
    server.until_stat("protobufWatches", 1);
    server.run(&["create", "-f", &event("e2", "second")]);
    let seen = wait_for_line(&lines, "second");
    assert!(
        seen.iter()
            .any(|l| l.contains("Tested") && l.contains("ConfigMap/seed-00000")),
        "{seen:?}"
    );
}
