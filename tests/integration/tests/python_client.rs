//! A second real client against the simulated apiserver: the official Python
//! `kubernetes` package (`tests/integration/python/kubernetes_client.py`),
//! over HTTPS with a token. It lists, watches from a resourceVersion,
//! creates, patches, and replaces a Lease with a stale resourceVersion.

// The script is a real process, waited for from a plain thread with std's
// clock: there is no tokio time to pause.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use serde_json::json;
use tether_testkit::{ApiServer, Options, Resource};

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

    // It makes a dozen requests.
    let seen = tokio::task::spawn_blocking(move || {
        common::run_python(
            "kubernetes",
            "kubernetes_client.py",
            &[kubeconfig.as_os_str()],
            Duration::from_secs(60),
        )
    })
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
