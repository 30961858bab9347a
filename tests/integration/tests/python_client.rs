//! A second real client against the simulated apiserver: the official Python
//! `kubernetes` package (`tests/integration/python/kubernetes_client.py`),
//! over HTTPS with a token. It lists, watches from a resourceVersion,
//! creates, patches, and replaces a Lease with a stale resourceVersion.

// The script is a real process, waited for from a plain thread with std's
// clock: there is no tokio time to pause.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_testkit::{ApiServer, Options, Resource};

/// How long the script may take; it makes a dozen requests.
const DEADLINE: Duration = Duration::from_secs(60);
const INSTALL: &str = "python3 -m venv .venv && .venv/bin/pip install kubernetes==37.0.2 \
                       (scripts/test deps does this)";

fn python() -> PathBuf {
    let python = std::env::var_os("TETHER_PYTHON").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&python)
        .args(["-c", "import kubernetes"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import the kubernetes package; install it: {INSTALL}",
        python.display()
    );
    python
}

/// Runs the script against `kubeconfig` and returns what it observed.
fn run_script(kubeconfig: PathBuf) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/kubernetes_client.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    let deadline = Instant::now() + DEADLINE;
    while child
        .try_wait()
        .expect("python can be waited for")
        .is_none()
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the Python client did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("python's output");
    assert!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the script prints one JSON object ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_kubernetes_client_lists_watches_patches_and_conflicts() {
    let server = ApiServer::start(Options::default().tls(true).token("python-token"))
        .await
        .expect("server starts");
    for name in ["seed-a", "seed-b"] {
        server
            .put(
                Resource::ConfigMap,
                "default",
                json!({"metadata": {"name": name}, "data": {"k": "v"}}),
            )
            .expect("seeded");
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .kubeconfig()
        .write(&kubeconfig)
        .expect("kubeconfig written");

    let seen = tokio::task::spawn_blocking(move || run_script(kubeconfig))
        .await
        .expect("the script's thread");

    assert_eq!(seen["listed"], json!(["seed-a", "seed-b"]));
    let already = json!({"status": 409, "reason": "AlreadyExists", "kind": "Status"});
    assert_eq!(seen["create_again"], already);
    assert_eq!(
        seen["watched"],
        json!([["ADDED", "from-python"]]),
        "a watch from the list's version replays only what came after"
    );
    assert_eq!(seen["merge_patched"], json!({"a": "1", "b": "2"}));
    assert_eq!(seen["json_patched"], json!({"a": "3", "b": "2"}));
    assert_eq!(seen["replaced_holder"], "python-2");
    assert_eq!(seen["version_moved"], true);
    let conflict = json!({"status": 409, "reason": "Conflict", "kind": "Status"});
    assert_eq!(seen["stale_replace"], conflict);
    assert_eq!(
        seen["holder_after"], "python-2",
        "the stale replace changed nothing"
    );
    assert_eq!(seen["transitions"], 0, "leaseTransitions: 0 survives");
}
