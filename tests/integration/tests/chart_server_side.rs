//! The chart, server side: Helm 4 installs it into a real kube-apiserver
//! (`scripts/peers`), which creates and validates every object itself, in
//! four shapes (one replica watching the home cluster; three with leader
//! election; three sharing the remotes; one discovering remotes from the
//! Secrets of two namespaces). Then the apiserver's own RBAC
//! authorizer answers `kubectl auth can-i` as each release's service
//! account: every verb tether uses is allowed, and nothing more.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tether_testkit::{ControlPlane, RealOptions};

/// `kubectl auth can-i VERB RESOURCE [-n NS]` as `user`: yes or no.
fn can_i(
    kubeconfig: &std::path::Path,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let mut command = std::process::Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["auth", "can-i", verb, resource, "--as", user]);
    match namespace {
        Some(ns) => command.args(["-n", ns]),
        None => command.arg("--all-namespaces"),
    };
    let out = command
        .output()
        .expect("kubectl runs (it is on the machines; see docs/testkit.md)");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        answer == "yes" || answer == "no",
        "can-i {verb} {resource} as {user}: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// One `can-i` question: as the release's service account, may it `verb`
/// `resource` in `namespace` (all namespaces if `None`)? And the answer the
/// chart must give.
struct Check {
    release: &'static str,
    verb: &'static str,
    resource: &'static str,
    namespace: Option<String>,
    allowed: bool,
}

const LEASES: &str = "leases.coordination.k8s.io";
const EVENTS: &str = "events.events.k8s.io";

/// What the release that discovers remotes may do with Secrets: read them
/// in exactly the namespaces named, once each however many sources share
/// one; nowhere else, and never write.
fn discovery_checks(namespace_of: impl Fn(&str) -> String) -> Vec<Check> {
    let check = |verb, resource, namespace: Option<String>, allowed| Check {
        release: "fleet",
        verb,
        resource,
        namespace,
        allowed,
    };
    let mut checks = Vec::new();
    for namespace in ["argocd", "capi"] {
        for (verb, allowed) in [
            ("get", true),
            ("list", true),
            ("watch", true),
            ("create", false),
            ("update", false),
            ("delete", false),
        ] {
            checks.push(check(verb, "secrets", Some(namespace.into()), allowed));
        }
    }
    for namespace in [
        Some("default".to_owned()),
        Some(namespace_of("fleet")),
        None,
    ] {
        checks.push(check("list", "secrets", namespace, false));
    }
    checks.push(check("list", "configmaps", Some("argocd".into()), false));
    checks
}

/// What each release's service account may and may not do.
fn checks(namespace_of: impl Fn(&str) -> String) -> Vec<Check> {
    let check = |release, verb, resource, namespace: Option<String>, allowed| Check {
        release,
        verb,
        resource,
        namespace,
        allowed,
    };
    let mut checks = Vec::new();
    // One replica watching the home cluster: the watched kind, read-only.
    for verb in ["get", "list", "watch"] {
        checks.push(check("one", verb, "namespaces", None, true));
    }
    checks.push(check(
        "one",
        "update",
        LEASES,
        Some(namespace_of("one")),
        false,
    ));
    // Leader election: get, create and update its Lease; no more.
    for (verb, allowed) in [
        ("get", true),
        ("create", true),
        ("update", true),
        ("list", false),
        ("delete", false),
        ("watch", false),
    ] {
        checks.push(check("ha", verb, LEASES, Some(namespace_of("ha")), allowed));
    }
    checks.push(check("ha", "list", "namespaces", None, false));
    // Sharding: also lists the members' Leases and deletes lapsed ones.
    for (verb, allowed) in [
        ("get", true),
        ("list", true),
        ("create", true),
        ("update", true),
        ("delete", true),
        ("watch", false),
    ] {
        checks.push(check(
            "shards",
            verb,
            LEASES,
            Some(namespace_of("shards")),
            allowed,
        ));
    }
    checks.extend(discovery_checks(&namespace_of));
    for release in ["one", "ha", "shards", "fleet"] {
        // Events on its own Pod: create, and patch to count a repeat, in its
        // namespace; nothing else with Events, nowhere else.
        for (verb, allowed) in [
            ("create", true),
            ("patch", true),
            ("get", false),
            ("list", false),
            ("delete", false),
        ] {
            checks.push(check(
                release,
                verb,
                EVENTS,
                Some(namespace_of(release)),
                allowed,
            ));
        }
        checks.push(check(
            release,
            "create",
            EVENTS,
            Some("default".into()),
            false,
        ));
        // Never Secrets but discovery's; never Leases outside its
        // namespace; never a write to what it watches.
        checks.push(check(release, "get", "secrets", None, false));
        checks.push(check(
            release,
            "list",
            "secrets",
            Some(namespace_of(release)),
            false,
        ));
        checks.push(check(
            release,
            "update",
            LEASES,
            Some("default".into()),
            false,
        ));
        checks.push(check(release, "create", "namespaces", None, false));
        checks.push(check(
            release,
            "delete",
            "configmaps",
            Some(namespace_of(release)),
            false,
        ));
    }
    checks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_into_a_real_apiserver_and_its_rbac_allows_exactly_what_tether_uses() {
    let home = ControlPlane::start(RealOptions::default().name("home"))
        .await
        .unwrap_or_else(|err| panic!("the real control plane starts: {err}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    home.kubeconfig().write(&kubeconfig).expect("kubeconfig");
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../helm/tether");

    let path = kubeconfig.clone();
    let releases = tokio::task::spawn_blocking(move || {
        common::run_python(
            "helm_python, kubernetes",
            "helm_install.py",
            &[path.as_os_str(), chart.as_os_str()],
            Duration::from_secs(180),
        )
    })
    .await
    .expect("the script's thread");
    println!("installed: {releases:#}");

    let election = &[
        "Role/",
        "RoleBinding/",
        "PodDisruptionBudget/",
        "Deployment/",
    ][..];
    for (release, want) in [
        (
            "one",
            &[
                "ClusterRole/",
                "ClusterRoleBinding/",
                "Deployment/",
                "ConfigMap/",
                "Service/",
                "ServiceAccount/",
            ][..],
        ),
        ("ha", election),
        ("shards", election),
        (
            "fleet",
            &["Role/", "RoleBinding/", "Deployment/", "ConfigMap/"][..],
        ),
    ] {
        let made = &releases[release];
        assert_eq!(
            made["missing"],
            Value::Array(vec![]),
            "{release}: not on the apiserver"
        );
        let objects: Vec<&str> = made["objects"]
            .as_array()
            .expect("objects")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for kind in want {
            assert!(
                objects.iter().any(|o| o.starts_with(kind)),
                "{release}: no {kind} in {objects:?}"
            );
        }
    }

    let field = |release: &str, key: &str| releases[release][key].as_str().expect(key).to_owned();
    let checks = checks(|release| field(release, "namespace"));
    let mut wrong = Vec::new();
    for c in &checks {
        let user = format!(
            "system:serviceaccount:{}:{}",
            field(c.release, "namespace"),
            field(c.release, "serviceAccount")
        );
        let got = can_i(
            &kubeconfig,
            &user,
            c.verb,
            c.resource,
            c.namespace.as_deref(),
        );
        if got != c.allowed {
            wrong.push(format!(
                "{}: {} {} in {:?}: {got}, want {}",
                c.release, c.verb, c.resource, c.namespace, c.allowed
            ));
        }
    }
    println!(
        "RBAC: {} checks with the apiserver's authorizer, {} wrong",
        checks.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}
