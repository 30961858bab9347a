//! What the integration tests share: a kube-rs client for an apiserver,
//! simulated or real, made from the kubeconfig the kit writes, and the
//! Python scripts in `tests/integration/python/`.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]
// The scripts are real processes, waited for from a plain thread with std's
// clock: there is no tokio time to pause.
#![allow(clippy::disallowed_methods)]

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tether_testkit::Cluster;

/// The kube `Config` of `server`'s kubeconfig.
pub(crate) async fn config_for(server: &impl Cluster) -> kube::Config {
    let kubeconfig =
        Kubeconfig::from_yaml(&server.kubeconfig().to_yaml()).expect("valid kubeconfig");
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig resolves")
}

/// A client with kube's defaults for `server`.
pub(crate) async fn client_for(server: &impl Cluster) -> Client {
    Client::try_from(config_for(server).await).expect("client builds")
}

const INSTALL: &str = "python3 -m venv .venv && .venv/bin/pip install kubernetes==37.0.2 \
                       helm-python-sdk==0.2.2 (scripts/test deps does this)";

/// The venv's Python (or `TETHER_PYTHON`), which must import `modules`
/// (`kubernetes`, `helm_python, kubernetes`).
fn python(modules: &str) -> PathBuf {
    let python = std::env::var_os("TETHER_PYTHON").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import {modules}; install them: {INSTALL}",
        python.display()
    );
    python
}

/// Runs `tests/integration/python/<script>` with `args`, killed after
/// `deadline`, and returns the one JSON object it prints.
pub(crate) fn run_python(
    modules: &str,
    script: &str,
    args: &[&OsStr],
    deadline: Duration,
) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let mut child = Command::new(python(modules))
        .arg(path)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    let until = Instant::now() + deadline;
    while child
        .try_wait()
        .expect("python can be waited for")
        .is_none()
    {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("{script} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("python's output");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} prints one JSON object ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
