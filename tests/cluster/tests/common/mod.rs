//! What the cluster tests share: `kubectl` and `helm` against the node's
//! home cluster, the README's quickstart as written, and bounded polls of
//! real processes.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

pub(crate) mod monitoring;
pub(crate) mod upgrade;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tether_testkit::{ControlPlane, Node};
use tokio::time::Instant;

/// How often a poll looks.
pub(crate) const EVERY: Duration = Duration::from_millis(250);

/// The repository's root.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where `scripts/peers cluster` put the helm CLI and the CRDs.
fn peers() -> PathBuf {
    root().join("target/peers")
}

/// Starts the node and imports the cluster step's images into it
/// (`scripts/cluster` builds them, into `target/cluster/images`).
pub(crate) async fn node() -> Node {
    let images = std::env::var_os("TETHER_CLUSTER_IMAGES")
        .map_or_else(|| root().join("target/cluster/images"), PathBuf::from);
    let node = Node::start()
        .await
        .unwrap_or_else(|err| panic!("the node starts: {err}"));
    for image in [
        "pause",
        "tether",
        "tether-previous",
        "controller",
        "controller-tether",
        "prometheus-operator",
        "prometheus-config-reloader",
        "prometheus",
        "alertmanager",
    ] {
        let archive = images.join(format!("{image}.tar"));
        assert!(
            archive.is_file(),
            "{} is missing: build the images with scripts/cluster",
            archive.display()
        );
        node.import(&archive)
            .unwrap_or_else(|err| panic!("{image} imports: {err}"));
    }
    println!("node: Ready in {:.1?}", node.started_in());
    node
}

/// `kubectl` and `helm` for the node's home cluster.
pub(crate) struct Kube {
    kubeconfig: PathBuf,
    path: std::ffi::OsString,
}

impl Kube {
    pub(crate) fn new(node: &Node) -> Self {
        let mut path = peers().join("bin").into_os_string();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        Self {
            kubeconfig: node.kubeconfig().to_owned(),
            path,
        }
    }

    /// A command for `program` with `KUBECONFIG` and `PATH` set.
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", &self.path)
            .stdin(Stdio::null());
        command
    }

    /// Runs `program args`: its stdout, or its stderr.
    pub(crate) fn try_run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|err| {
                panic!("{program} runs ({err}); kubectl is on the machines, helm comes from scripts/peers cluster")
            });
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// `kubectl args`, which must succeed.
    pub(crate) fn kubectl(&self, args: &[&str]) -> String {
        self.try_run("kubectl", args)
            .unwrap_or_else(|err| panic!("kubectl {}: {err}", args.join(" ")))
    }

    /// `kubectl args -o json`, parsed.
    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&args)).expect("kubectl prints JSON")
    }

    /// `helm args`, which must succeed.
    pub(crate) fn helm(&self, args: &[&str]) -> String {
        self.try_run("helm", args)
            .unwrap_or_else(|err| panic!("helm {}: {err}", args.join(" ")))
    }

    /// The pods of `release` in `namespace`.
    pub(crate) fn pods(&self, namespace: &str, release: &str) -> Vec<Pod> {
        let list = self.json(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={release}"),
        ]);
        list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(Pod::from)
            .collect()
    }

    /// `GET path` through the apiserver's proxy to port 9090 of `pod`:
    /// tether's admin server, which the machine cannot reach itself.
    pub(crate) fn admin(&self, namespace: &str, pod: &str, path: &str) -> Option<String> {
        self.try_run(
            "kubectl",
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/{namespace}/pods/{pod}:9090/proxy{path}"),
            ],
        )
        .ok()
    }

    /// `kubectl -n namespace port-forward target 0:port`, as the README
    /// says to reach the status page: the running forward, once kubectl
    /// says which local port it took, or what kubectl said instead.
    pub(crate) fn port_forward(
        &self,
        namespace: &str,
        target: &str,
        port: u16,
    ) -> Result<PortForward, String> {
        let mut child = self
            .command("kubectl")
            .args([
                "-n",
                namespace,
                "port-forward",
                target,
                &format!("0:{port}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("kubectl runs: {err}"))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                // "Forwarding from 127.0.0.1:41234 -> 9090"
                let local = line
                    .strip_prefix("Forwarding from 127.0.0.1:")
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|p| p.parse::<u16>().ok());
                if let Some(local) = local {
                    let _ = tx.send(local);
                }
            }
        });
        if let Ok(local) = rx.recv_timeout(Duration::from_secs(30)) {
            return Ok(PortForward { child, local });
        }
        let _ = child.kill();
        let output = child.wait_with_output().map_err(|err| err.to_string())?;
        Err(format!(
            "kubectl port-forward named no local port within 30s: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    /// The Event reasons on `pod`, oldest first.
    pub(crate) fn event_reasons(&self, namespace: &str, pod: &str) -> Vec<String> {
        let events = self.json(&[
            "-n",
            namespace,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={pod}"),
            "--sort-by=.metadata.creationTimestamp",
        ]);
        events["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect()
    }

    /// Creates `namespace` and one Secret per remote in it, from that
    /// remote's kubeconfig, as the quickstart does.
    pub(crate) fn secrets(&self, namespace: &str, remotes: &[(&str, &ControlPlane)]) {
        let dir = tempfile::tempdir().expect("temp dir");
        self.kubectl(&["create", "namespace", namespace]);
        for (name, plane) in remotes {
            let file = dir.path().join(format!("{name}.kubeconfig"));
            plane.kubeconfig().write(&file).expect("kubeconfig");
            self.kubectl(&[
                "-n",
                namespace,
                "create",
                "secret",
                "generic",
                &format!("tether-{name}"),
                &format!("--from-file=kubeconfig={}", file.display()),
            ]);
        }
    }
}

/// A running `kubectl port-forward`, stopped on drop.
pub(crate) struct PortForward {
    child: std::process::Child,
    local: u16,
}

impl PortForward {
    /// `GET path` on the forwarded port, as a browser would: the body of a
    /// 200, or why there is none. Every step is bounded by `within`.
    pub(crate) fn get(&self, path: &str, within: Duration) -> Result<String, String> {
        use std::io::{Read as _, Write as _};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.local));
        let mut stream = std::net::TcpStream::connect_timeout(&addr, within)
            .map_err(|err| format!("connect to {addr}: {err}"))?;
        stream
            .set_read_timeout(Some(within))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(within))
            .map_err(|e| e.to_string())?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .map_err(|err| format!("send: {err}"))?;
        let mut answer = Vec::new();
        // At most 4 MiB: the status page is a few dozen KiB.
        (&mut stream)
            .take(4 << 20)
            .read_to_end(&mut answer)
            .map_err(|err| format!("no answer within {within:?}: {err}"))?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        if answer.starts_with("HTTP/1.1 200") {
            Ok(answer)
        } else {
            Err(format!(
                "not a 200: {}",
                answer.lines().next().unwrap_or("(nothing)")
            ))
        }
    }

    /// What kubectl said on stderr so far, once stopped.
    pub(crate) fn stop(mut self) -> String {
        let _ = self.child.kill();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let _ = self.child.wait();
        stderr
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the tests read of a pod.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    pub(crate) name: String,
    pub(crate) ready: bool,
    pub(crate) deleting: bool,
    pub(crate) restarts: u64,
    pub(crate) phase: String,
    /// Its IP, once it has one.
    pub(crate) ip: String,
    /// Its first container's image.
    pub(crate) image: String,
}

impl From<&Value> for Pod {
    fn from(pod: &Value) -> Self {
        let ready = pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        let restarts = pod["status"]["containerStatuses"]
            .as_array()
            .map_or(0, |s| {
                s.iter().filter_map(|s| s["restartCount"].as_u64()).sum()
            });
        Self {
            name: pod["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ready,
            deleting: !pod["metadata"]["deletionTimestamp"].is_null(),
            restarts,
            phase: pod["status"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ip: pod["status"]["podIP"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            image: pod["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

/// Polls `check` every [`EVERY`] until it gives a value, for at most
/// `deadline` (the kit's [`tether_testkit::poll`]): the value and how long
/// it took. Panics naming `what`, with `context()` (what the cluster says),
/// at the deadline.
pub(crate) async fn poll<T>(
    what: &str,
    deadline: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> (T, Duration) {
    poll_every(what, deadline, EVERY, check, context).await
}

/// [`poll`], looking every `every`.
pub(crate) async fn poll_every<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> (T, Duration) {
    let begun = Instant::now();
    let value = tether_testkit::poll(deadline, every, async || check()).await;
    let value = value.unwrap_or_else(|| panic!("{what}: not within {deadline:?}\n{}", context()));
    (value, begun.elapsed())
}

/// The README's "Quickstart on a cluster" shell block, as written, but for
/// the image's repository: `localhost/tether`, which the node has
/// imported, for the README's `registry.example.com/tether`.
pub(crate) fn quickstart() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let section = readme
        .split_once("## Quickstart on a cluster")
        .expect("the README has a quickstart on a cluster")
        .1;
    let block = section
        .split_once("```sh\n")
        .expect("the quickstart has a sh block")
        .1
        .split_once("```")
        .expect("the block ends")
        .0;
    assert!(
        block.contains("registry.example.com/tether"),
        "the quickstart sets image.repository"
    );
    block.replace("registry.example.com/tether", "localhost/tether")
}

/// Runs `script` with bash (`-euo pipefail`) in `dir`, where the README's
/// relative paths resolve: `./helm/tether`, and the remotes' kubeconfigs.
pub(crate) fn run_script(kube: &Kube, dir: &Path, script: &str) {
    let link = dir.join("helm");
    if !link.exists() {
        std::os::unix::fs::symlink(root().join("helm"), &link).expect("link to the chart");
    }
    let output = kube
        .command("bash")
        .args([OsStr::new("-euo"), OsStr::new("pipefail"), OsStr::new("-c")])
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "the script failed:\n{script}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
