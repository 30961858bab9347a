//! Remotes discovered from a real home cluster's Secrets (kube-apiserver and
//! etcd from `scripts/peers`), pointing at real remotes: one Secret of each
//! format, created, rotated and deleted while tether runs; a malformed one
//! of each format; a name taken by a static remote; the home cluster paused
//! and resumed, then killed and restarted. Each reaction is timed, and
//! printed for `docs/benchmarks.md`. Then the exec manager's process with a
//! discovered cluster, and discovered remotes shared between two replicas.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use common::{DEADLINE, EVERY, Shape, Tether, poll};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tether_testkit::{ApiServer, ControlPlane, Options, RealOptions};
use tokio::time::Instant;

/// A marker in every malformed Secret's data: it must show up nowhere.
const MARKER: &str = "s3cret-marker";

/// The value of the first series of `metric` whose labels hold each of
/// `labels` (`remote="a"`), from `/metrics`; `None` when there is none.
async fn series(tether: &Tether, metric: &str, labels: &[&str]) -> Option<f64> {
    let (_, body) = tether.get("/metrics").await?;
    body.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls until that series satisfies `pred` (given `None` while it is
/// absent); how long that took.
async fn until(
    tether: &Tether,
    metric: &str,
    labels: &[&str],
    what: &str,
    pred: impl Fn(Option<f64>) -> bool,
) -> Duration {
    let started = Instant::now();
    common::until(format!("{metric}{labels:?} {what}"), DEADLINE, async || {
        pred(series(tether, metric, labels).await).then_some(())
    })
    .await;
    started.elapsed()
}

const REACHABLE: &str = "tether_remote_apiserver_reachable";

fn named(name: &str) -> String {
    format!("remote=\"{name}\"")
}

/// Polls until `name`'s reachability gauge is `want` (`None`: gone).
async fn until_reachable(tether: &Tether, name: &str, want: Option<f64>) -> Duration {
    until(
        tether,
        REACHABLE,
        &[&named(name)],
        &format!("{want:?}"),
        |v| v == want,
    )
    .await
}

fn secret(name: &str, labels: &serde_json::Value, data: &[(&str, &str)]) -> Secret {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| {
            (
                (*k).to_owned(),
                base64::engine::general_purpose::STANDARD.encode(v).into(),
            )
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "data": data,
    }))
    .expect("a Secret")
}

/// An Argo CD cluster Secret for `plane`, named `name` in its `name` key,
/// with `token`.
fn argocd(secret_name: &str, name: &str, plane: &ControlPlane, token: &str) -> Secret {
    let config = serde_json::json!({
        "bearerToken": token,
        "tlsClientConfig": {
            "insecure": false,
            "caData": base64::engine::general_purpose::STANDARD.encode(plane.ca_pem()),
        },
    });
    secret(
        secret_name,
        &serde_json::json!({"argocd.argoproj.io/secret-type": "cluster"}),
        &[
            ("name", name),
            ("server", &plane.url()),
            ("config", &config.to_string()),
        ],
    )
}

/// A Cluster API kubeconfig Secret for cluster `cluster`.
fn clusterapi(cluster: &str, kubeconfig: &str) -> Secret {
    secret(
        &format!("{cluster}-kubeconfig"),
        &serde_json::json!({"cluster.x-k8s.io/cluster-name": cluster}),
        &[("value", kubeconfig)],
    )
}

/// A multicluster-runtime kubeconfig provider Secret, labelled `tier=edge`
/// (the test's selector) if `edge`.
fn provider(name: &str, kubeconfig: &str, edge: bool) -> Secret {
    let mut labels = serde_json::json!({"sigs.k8s.io/multicluster-runtime-kubeconfig": "true"});
    if edge {
        labels["tier"] = "edge".into();
    }
    secret(name, &labels, &[("kubeconfig", kubeconfig)])
}

struct Home {
    client: kube::Client,
}

impl Home {
    /// The home cluster `plane` with the test's namespaces; a folder, and
    /// the home cluster's kubeconfig in it.
    async fn new(plane: &ControlPlane) -> (Self, tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("home.kubeconfig");
        plane.kubeconfig().write(&kubeconfig).expect("kubeconfig");
        let client = kube::Client::try_from(common::config_of(plane).await).expect("client");
        for ns in ["argocd", "capi", "fleet"] {
            let namespace: Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await
                .expect("the home cluster creates the namespace");
        }
        (Self { client }, dir, kubeconfig)
    }

    fn api(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.client.clone(), ns)
    }

    async fn create(&self, ns: &str, secret: &Secret) {
        self.api(ns)
            .create(&PostParams::default(), secret)
            .await
            .expect("the home cluster creates the Secret");
    }

    async fn replace(&self, ns: &str, secret: &Secret) {
        let name = secret.metadata.name.as_deref().expect("named");
        let current = self.api(ns).get(name).await.expect("the Secret exists");
        let mut next = secret.clone();
        next.metadata.resource_version = current.metadata.resource_version;
        self.api(ns)
            .replace(name, &PostParams::default(), &next)
            .await
            .expect("the home cluster replaces the Secret");
    }

    async fn delete(&self, ns: &str, name: &str) {
        self.api(ns)
            .delete(name, &DeleteParams::default())
            .await
            .expect("the home cluster deletes the Secret");
    }
}

const DISCOVERY: &str = "discovery:
- secrets: {namespace: argocd, format: argocd, required: false, kubeconfig: HOME}
- secrets: {namespace: capi, format: clusterapi, kubeconfig: HOME}
- secrets: {namespace: fleet, format: kubeconfig, labelSelector: \"tier=edge\", kubeconfig: HOME}";

/// The config of one source: multicluster-runtime's Secrets labelled
/// `tier=edge` in `fleet`, on the home cluster of `kubeconfig`.
fn fleet_source(kubeconfig: &std::path::Path) -> String {
    format!(
        "discovery:\n- secrets: {{namespace: fleet, format: kubeconfig, labelSelector: \"tier=edge\", kubeconfig: {}}}",
        kubeconfig.display()
    )
}

/// A home cluster and a remote `a`, and `a`'s kubeconfig Secret (with
/// `kubeconfig`) in `fleet`; the home cluster's Secrets, and its kubeconfig
/// in a folder.
async fn home_and_a(
    kubeconfig: impl Fn(&ControlPlane) -> String,
) -> (
    ControlPlane,
    ControlPlane,
    Home,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let (home, a) = tokio::join!(
        common::real_plane(RealOptions::default().name("home")),
        common::real_plane(RealOptions::default().name("a")),
    );
    let (secrets, dir, home_kubeconfig) = Home::new(&home).await;
    secrets
        .create("fleet", &provider("a", &kubeconfig(&a), true))
        .await;
    (home, a, secrets, dir, home_kubeconfig)
}

/// tether with no static remote and `extra` (its discovery).
fn discovering(extra: &str) -> Tether {
    Tether::start::<ControlPlane>(
        &[],
        &[],
        &Shape {
            extra,
            ..Shape::default()
        },
    )
}

/// The planes, the home cluster's Secrets, and tether reading them.
struct World {
    home: ControlPlane,
    a: ControlPlane,
    b: ControlPlane,
    c: ControlPlane,
    secrets: Home,
    tether: Tether,
    _dir: tempfile::TempDir,
}

impl World {
    /// The planes; one Secret of each format (Argo CD's `a` with a token
    /// the apiserver refuses: reachable, but its cache cannot sync), and
    /// two that are passed over; then tether, with the static remote `s`.
    /// How long until every remote was probed reachable.
    async fn start() -> (Self, Duration) {
        let (home, a, b, c) = tokio::join!(
            common::real_plane(RealOptions::default().name("home")),
            common::real_plane(RealOptions::default().name("a")),
            common::real_plane(RealOptions::default().name("b")),
            common::real_plane(RealOptions::default().name("c")),
        );
        let (secrets, dir, home_kubeconfig) = Home::new(&home).await;
        secrets
            .create("argocd", &argocd("cluster-a", "a", &a, "not-a-token"))
            .await;
        secrets
            .create("capi", &clusterapi("b", &b.kubeconfig().to_yaml()))
            .await;
        secrets
            .create("fleet", &provider("c", &c.kubeconfig().to_yaml(), true))
            .await;
        // Cluster API's other Secret of a cluster, and one outside the
        // selector.
        let user = secret(
            "b-user-kubeconfig",
            &serde_json::json!({"cluster.x-k8s.io/cluster-name": "b"}),
            &[("value", "x")],
        );
        secrets.create("capi", &user).await;
        secrets
            .create(
                "fleet",
                &provider("not-edge", &c.kubeconfig().to_yaml(), false),
            )
            .await;
        let extra = DISCOVERY.replace("HOME", &home_kubeconfig.display().to_string());
        let started = Instant::now();
        let tether = Tether::start(
            &[("s", &a)],
            &["--log-format", "json"],
            &Shape {
                watch: Some("[{apiVersion: v1, kind: Namespace}]"),
                extra: &extra,
                ..Shape::default()
            },
        );
        tether.until_ready(true).await;
        for remote in ["s", "a", "b", "c", "home"] {
            until_reachable(&tether, remote, Some(1.0)).await;
        }
        let first_set = started.elapsed();
        let world = Self {
            home,
            a,
            b,
            c,
            secrets,
            tether,
            _dir: dir,
        };
        (world, first_set)
    }

    async fn metric(&self, metric: &str, labels: &[&str]) -> Option<f64> {
        series(&self.tether, metric, labels).await
    }

    /// What tether found at start: a remote from each source, none from
    /// outside the selector, and `a`'s cache unsynced.
    async fn found_one_of_each(&self) {
        for source in ["argocd/argocd", "capi/clusterapi", "fleet/kubeconfig"] {
            let labels = [format!("source=\"{source}\"")];
            assert_eq!(
                self.metric("tether_discovery_remotes", &[&labels[0]]).await,
                Some(1.0),
                "{source}"
            );
        }
        assert_eq!(
            self.metric(REACHABLE, &[&named("not-edge")]).await,
            None,
            "outside the selector"
        );
        assert_eq!(
            self.metric("tether_watch_synced", &[&named("a")]).await,
            Some(0.0),
            "a's token is refused: its cache cannot sync"
        );
        assert_eq!(
            self.metric("tether_watch_synced", &[&named("b")]).await,
            Some(1.0)
        );
    }

    /// A Secret appears: its remote is probed within an interval, and the
    /// others' probes go on as they were. How long it took.
    async fn appears(&self) -> Duration {
        let b_turns = ["to=\"reachable\"", &named("b")];
        let transitions = self
            .metric("tether_remote_transitions_total", &b_turns)
            .await;
        self.secrets
            .create(
                "fleet",
                &provider("c2", &self.c.kubeconfig().to_yaml(), true),
            )
            .await;
        let appeared = until_reachable(&self.tether, "c2", Some(1.0)).await;
        assert_eq!(
            self.metric("tether_remote_transitions_total", &b_turns)
                .await,
            transitions,
            "b's probe went on as it was"
        );
        appeared
    }

    /// `a`'s token rotated to one the apiserver takes: `a` alone is rebuilt
    /// in the running cycle, with a client that has it, and its cache
    /// syncs. How long it took.
    async fn rotates(&self) -> Duration {
        let rebuilt = ["change=\"rebuilt\"", "cause=\"config_changed\""];
        let cycle = self.metric("tether_cycle", &[]).await.expect("a cycle");
        let before = self
            .metric("tether_remote_changes_total", &rebuilt)
            .await
            .expect("exported at 0");
        let rotated = argocd("cluster-a", "a", &self.a, &self.a.token());
        let started = Instant::now();
        self.secrets.replace("argocd", &rotated).await;
        until(
            &self.tether,
            "tether_remote_changes_total",
            &rebuilt,
            "one more",
            |v| v.unwrap_or(0.0) > before,
        )
        .await;
        until(
            &self.tether,
            "tether_watch_synced",
            &[&named("a")],
            "1",
            |v| v == Some(1.0),
        )
        .await;
        assert_eq!(
            self.metric("tether_cycle", &[]).await,
            Some(cycle),
            "a rotated cluster ended the cycle"
        );
        started.elapsed()
    }

    /// A Secret goes: its series go with it, and its part of the running
    /// cycle stops alone (`removed`), the cycle running on. How long it
    /// took.
    async fn goes(&self) -> Duration {
        let removed = ["change=\"removed\"", "cause=\"config_changed\""];
        let cycle = self.metric("tether_cycle", &[]).await.expect("a cycle");
        let before = self
            .metric("tether_remote_changes_total", &removed)
            .await
            .expect("exported at 0");
        self.secrets.delete("fleet", "c2").await;
        let gone = until_reachable(&self.tether, "c2", None).await;
        until(
            &self.tether,
            "tether_remote_changes_total",
            &removed,
            "one more",
            |v| v.unwrap_or(0.0) > before,
        )
        .await;
        assert_eq!(
            self.metric("tether_cycle", &[]).await,
            Some(cycle),
            "a cluster gone ended the cycle"
        );
        gone
    }

    /// A malformed Secret of each format, a name a static remote has, the
    /// home cluster's name, and a server tether cannot probe.
    async fn create_the_bad(&self) {
        let bad_argo = secret(
            "bad-argo",
            &serde_json::json!({"argocd.argoproj.io/secret-type": "cluster"}),
            &[
                ("name", "bad"),
                ("server", &self.a.url()),
                (
                    "config",
                    &format!("{{\"tlsClientConfig\":{{\"caData\":\"!{MARKER}\"}}}}"),
                ),
            ],
        );
        let exec = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: b, cluster: {{server: \"{}\"}}}}]\nusers: [{{name: x, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {MARKER}}}}}}}]\ncontexts: [{{name: b, context: {{cluster: b, user: x}}}}]\ncurrent-context: b\n",
            self.b.url()
        );
        self.secrets.create("argocd", &bad_argo).await;
        self.secrets
            .create("argocd", &argocd("cluster-s", "s", &self.b, MARKER))
            .await;
        self.secrets
            .create("capi", &clusterapi("bad", &format!("clusters: [{MARKER}")))
            .await;
        self.secrets
            .create("fleet", &provider("bad-exec", &exec, true))
            .await;
        // The home cluster's name, from a Secret: that Secret's error
        // alone, not a set that can no longer change.
        self.secrets
            .create(
                "fleet",
                &provider("home", &self.c.kubeconfig().to_yaml(), true),
            )
            .await;
        // A server tether cannot probe, a token in its query: named by
        // field, never quoted.
        let ftp = secret(
            "cluster-ftp",
            &serde_json::json!({"argocd.argoproj.io/secret-type": "cluster"}),
            &[
                ("name", "ftp"),
                ("server", &format!("ftp://10.0.0.1:21/?token={MARKER}")),
                ("config", "{}"),
            ],
        );
        self.secrets.create("argocd", &ftp).await;
    }

    /// A malformed Secret of each format, and a name a static remote has:
    /// each that Secret's error alone, by field, and no cycle ends.
    async fn skips_the_bad_alone(&self) {
        let changed = ["cause=\"config_changed\""];
        let cycles = self.metric("tether_cycles_total", &changed).await;
        self.create_the_bad().await;
        let skipped = [
            (
                "argocd/argocd",
                "bad-argo",
                "data.config.tlsClientConfig.caData",
            ),
            ("argocd/argocd", "cluster-s", "name"),
            ("argocd/argocd", "cluster-ftp", "data.server"),
            ("capi/clusterapi", "bad-kubeconfig", "data.value"),
            ("fleet/kubeconfig", "bad-exec", "users[0].exec"),
            ("fleet/kubeconfig", "home", "name"),
        ];
        for (source, secret, _) in skipped {
            let labels = [
                format!("secret=\"{secret}\""),
                format!("source=\"{source}\""),
            ];
            until(
                &self.tether,
                "tether_discovery_errors",
                &[&labels[0], &labels[1]],
                "1",
                |v| v == Some(1.0),
            )
            .await;
        }
        let (_, status) = self.tether.get("/status.json").await.expect("status");
        let status: serde_json::Value = serde_json::from_str(&status).expect("json");
        let shown: Vec<(String, String)> = status["discovery"]["sources"]
            .as_array()
            .expect("sources")
            .iter()
            .flat_map(|s| s["skipped"].as_array().cloned().unwrap_or_default())
            .map(|k| (k["secret"].to_string(), k["field"].to_string()))
            .collect();
        for (_, secret, field) in skipped {
            let want = (format!("{secret:?}"), format!("{field:?}"));
            assert!(shown.contains(&want), "{want:?} in {shown:?}");
        }
        for remote in ["s", "a", "b", "c"] {
            assert_eq!(
                self.metric(REACHABLE, &[&named(remote)]).await,
                Some(1.0),
                "{remote} runs on"
            );
        }
        assert_eq!(
            self.metric("tether_cycles_total", &changed).await,
            cycles,
            "a bad Secret ends no cycle"
        );
        self.check_lists_them().await;
        // Gone, its error goes.
        self.secrets.delete("capi", "bad-kubeconfig").await;
        until(
            &self.tether,
            "tether_discovery_errors",
            &["secret=\"bad-kubeconfig\""],
            "gone",
            |v| v.is_none(),
        )
        .await;
    }

    /// `tether check` on the same config: every source's finding, each
    /// skipped Secret by name and field, the discovered remotes and the
    /// home cluster probed; exit 1, for the Secrets skipped.
    async fn check_lists_them(&self) {
        let out = tokio::process::Command::new(common::binary())
            .args(["check", "--config"])
            .arg(&self.tether.config)
            .output()
            .await
            .expect("tether check runs");
        let table = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{table}");
        for line in [
            "discovery argocd/argocd: listed; 1 remote found, 3 Secrets skipped",
            "  skipped Secret bad-argo: data.config.tlsClientConfig.caData: is not base64",
            "  skipped Secret cluster-s: name: \"s\" is already the name of a static remote",
            "  skipped Secret cluster-ftp: data.server: its server is not an http or https URL with a host and a port tether can probe",
            "discovery capi/clusterapi: listed; 1 remote found, 1 Secret skipped",
            "discovery fleet/kubeconfig: listed; 1 remote found, 2 Secrets skipped",
            "  skipped Secret home: name: \"home\" is already the name of the home cluster",
        ] {
            assert!(table.lines().any(|l| l == line), "{line:?} in\n{table}");
        }
        for remote in ["s ", "a ", "b ", "c ", "home "] {
            assert!(
                table
                    .lines()
                    .any(|l| l.starts_with(remote) && l.contains("reachable")),
                "{remote} probed in\n{table}"
            );
        }
        assert!(!table.contains(MARKER), "{table}");
    }

    /// The home cluster paused: probed as a remote, it turns unreachable,
    /// while the last known remotes and their manager run on, ready; then
    /// resumed. How long each turn took.
    async fn home_paused(&self) -> (Duration, Duration) {
        // The cycle the last change of the set asked for, built.
        until(&self.tether, "tether_manager_up", &[], "1", |v| {
            v == Some(1.0)
        })
        .await;
        let cycle = self.metric("tether_cycle", &[]).await;
        self.home.pause().await;
        let lost = until_reachable(&self.tether, "home", Some(0.0)).await;
        for remote in ["a", "b", "c"] {
            assert_eq!(
                self.metric(REACHABLE, &[&named(remote)]).await,
                Some(1.0),
                "{remote} stays while home is paused"
            );
        }
        assert_eq!(
            self.metric("tether_cycle", &[]).await,
            cycle,
            "the manager runs on"
        );
        self.tether.until_ready(true).await;
        self.home.resume();
        let back = until_reachable(&self.tether, "home", Some(1.0)).await;
        (lost, back)
    }

    /// The home cluster killed and restarted: tether lists anew, and finds
    /// a Secret made after the restart. How long from the restart.
    async fn home_restarted(&self) -> Duration {
        self.home.stop();
        until_reachable(&self.tether, "home", Some(0.0)).await;
        self.home
            .restart()
            .await
            .expect("the home cluster restarts");
        let restarted = Instant::now();
        self.secrets
            .create(
                "fleet",
                &provider("c3", &self.c.kubeconfig().to_yaml(), true),
            )
            .await;
        until_reachable(&self.tether, "c3", Some(1.0)).await;
        assert!(
            self.tether
                .logs()
                .contains("the home cluster answers again: listing its Secrets"),
            "listed anew after the restart"
        );
        restarted.elapsed()
    }

    /// Neither a token nor a bad Secret's data shows anywhere tether writes.
    async fn leaks_nothing(&self) {
        let (_, metrics) = self.tether.get("/metrics").await.expect("metrics");
        let (_, page) = self.tether.get("/status").await.expect("status");
        let (_, json) = self.tether.get("/status.json").await.expect("status.json");
        for (what, text) in [
            ("logs", self.tether.logs()),
            ("metrics", metrics),
            ("status", page),
            ("status.json", json),
        ] {
            assert!(!text.contains(MARKER), "a Secret's data in the {what}");
            assert!(!text.contains(&self.a.token()), "a token in the {what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remotes_come_and_go_with_the_home_clusters_secrets() {
    let (world, first_set) = Box::pin(World::start()).await;
    world.found_one_of_each().await;
    let appeared = world.appears().await;
    let rotated = world.rotates().await;
    let gone = world.goes().await;
    world.skips_the_bad_alone().await;
    let (home_lost, home_back) = world.home_paused().await;
    let relisted = world.home_restarted().await;
    world.leaks_nothing().await;
    println!(
        "discovery: first full set {first_set:?} after start; a Secret created to probed {appeared:?}; rotated to synced {rotated:?}; deleted to gone {gone:?}; home paused to unreachable {home_lost:?}, resumed to reachable {home_back:?}; restarted to a new Secret probed {relisted:?}"
    );
}

/// The exec manager's process reaches a discovered cluster through the
/// kubeconfig tether writes for it (mode 0600), with a real client
/// (kubectl); a rotated Secret ends the cycle (`config_changed`) and the
/// next process has the new credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_managers_process_gets_each_discovered_cluster_and_a_cycle_per_change() {
    let (_home, a, secrets, dir, home_kubeconfig) =
        home_and_a(|a| a.kubeconfig().to_yaml().replace(&a.token(), "not-a-token")).await;
    let script = dir.path().join("controller.sh");
    std::fs::write(
        &script,
        "k=$(grep -o '\"kubeconfig\": \"[^\"]*\"' \"$TETHER_REMOTES_FILE\" | cut -d'\"' -f4)\n\
         if kubectl --kubeconfig \"$k\" get namespaces >/dev/null 2>&1; then r=ok; else r=refused; fi\n\
         echo \"cycle $TETHER_CYCLE remotes $TETHER_REMOTES mode $(stat -c %a \"$k\") $r\"\n\
         exec sleep 600\n",
    )
    .expect("script");
    let manager = format!(
        "{{exec: {{command: [sh, {}], gracePeriod: 2s}}}}",
        script.display()
    );
    let extra = fleet_source(&home_kubeconfig);
    // TMPDIR, where the exec manager's private folder goes: the chart's
    // emptyDir, which outlives a container.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).expect("TMPDIR");
    let tmp_env = tmp.display().to_string();
    let env = [("TMPDIR", tmp_env.as_str())];
    let shape = Shape {
        manager: Some(&manager),
        extra: &extra,
        env: &env,
        ..Shape::default()
    };
    let mut tether = Tether::start::<ControlPlane>(&[], &[], &shape);
    let said = async |tether: &Tether, line: &str| {
        let found = poll(DEADLINE, EVERY, async || {
            tether.output().lines().any(|l| l == line).then_some(())
        })
        .await;
        assert!(
            found.is_some(),
            "{line:?} never printed; output:\n{}\nlogs:\n{}",
            tether.output(),
            tether.logs()
        );
    };
    said(&tether, "cycle 1 remotes a mode 600 refused").await;
    secrets
        .replace("fleet", &provider("a", &a.kubeconfig().to_yaml(), true))
        .await;
    said(&tether, "cycle 2 remotes a mode 600 ok").await;
    assert_eq!(
        series(
            &tether,
            "tether_cycles_total",
            &["cause=\"config_changed\""]
        )
        .await,
        Some(1.0),
        "the rotation ended cycle 1"
    );
    assert!(!tether.logs().contains(&a.token()), "a token in the logs");

    // Killed, tether leaves its folder and the credentials in it; the next
    // start removes it before it writes anything.
    let folders = || -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir(&tmp)
            .expect("TMPDIR")
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("tether-exec-"))
            })
            .collect();
        found.sort();
        found
    };
    let killed = folders();
    assert_eq!(killed.len(), 1, "{killed:?}");
    tether.signal("KILL");
    tether.wait().await;
    assert!(
        killed[0].join("a.kubeconfig").exists(),
        "a killed run leaves its credentials"
    );
    let next = Tether::start::<ControlPlane>(&[], &[], &shape);
    said(&next, "cycle 1 remotes a mode 600 ok").await;
    let now = folders();
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, killed, "the killed run's folder was removed");
    assert!(
        next.logs()
            .contains("removed the exec manager's folder that an earlier run left"),
        "{}",
        next.logs()
    );
}

/// What a replica holds, from `/status.json`'s shard section: its remotes,
/// and how many members it sees.
async fn held(tether: &Tether) -> Option<(BTreeSet<String>, usize)> {
    let (_, body) = tether.get("/status.json").await?;
    let status: serde_json::Value = serde_json::from_str(&body).ok()?;
    let shard = &status["shard"];
    let owned = shard["owned"]
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    Some((owned, shard["members"].as_array()?.len()))
}

/// Polls until the replicas hold exactly `names` between them, each name
/// once, both seeing both members; what each holds.
async fn shared_once(replicas: &[&Tether], names: &BTreeSet<String>) -> Vec<BTreeSet<String>> {
    let mut shares = Vec::new();
    let settled = poll(DEADLINE, EVERY, async || {
        shares = Vec::new();
        for tether in replicas {
            let (owned, members) = held(tether).await?;
            if members != replicas.len() {
                return None;
            }
            shares.push(owned);
        }
        let total: usize = shares.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<String> = shares.iter().flatten().cloned().collect();
        (total == names.len() && &union == names).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "never shared once each: want {names:?}, got {shares:?}; logs:\n{}",
        replicas[0].logs()
    );
    shares
}

/// With sharding, discovered remotes are shared like static ones: two
/// replicas, Leases and Secrets on one real home cluster, eight discovered
/// remotes held once between them; a Secret added later goes to one; and
/// both probe the home cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_remotes_are_shared_among_replicas_like_static_ones() {
    let home = common::real_plane(RealOptions::default().name("home")).await;
    let (secrets, _dir, home_kubeconfig) = Home::new(&home).await;
    let mut servers = Vec::new();
    for i in 0..9 {
        let server = ApiServer::start(Options::default().name(format!("d{i}")))
            .await
            .expect("a simulated remote");
        servers.push(server);
    }
    for (i, server) in servers.iter().enumerate().take(8) {
        let secret = provider(&format!("d{i}"), &server.kubeconfig().to_yaml(), true);
        secrets.create("fleet", &secret).await;
    }
    let section = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, identity: IDENTITY, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms, kubeconfig: {0}}}\n\
         sharding: {{enabled: true}}\n\
         discovery:\n- secrets: {{namespace: fleet, format: kubeconfig, kubeconfig: {0}}}",
        home_kubeconfig.display()
    );
    let replica = |id: &str| {
        let extra = section.replace("IDENTITY", id);
        Tether::start::<ControlPlane>(
            &[],
            &[],
            &Shape {
                watch: Some("[]"),
                extra: &extra,
                ..Shape::default()
            },
        )
    };
    let (one, two) = (replica("one"), replica("two"));
    let mut names: BTreeSet<String> = (0..8).map(|i| format!("d{i}")).collect();
    let before = shared_once(&[&one, &two], &names).await;
    assert!(
        before.iter().all(|share| !share.is_empty()),
        "both replicas hold some: {before:?}"
    );
    secrets
        .create(
            "fleet",
            &provider("d8", &servers[8].kubeconfig().to_yaml(), true),
        )
        .await;
    names.insert("d8".to_owned());
    let after = shared_once(&[&one, &two], &names).await;
    for (share, earlier) in after.iter().zip(&before) {
        assert!(
            share.difference(earlier).all(|n| n == "d8"),
            "only the new remote moved in: {earlier:?} to {share:?}"
        );
    }
    for tether in [&one, &two] {
        until_reachable(tether, "home", Some(1.0)).await;
    }
}

/// A Cluster API namespace labels every Secret of a cluster with its name,
/// bootstrap data of up to 1 MiB included: a real kube-apiserver answered
/// kube's one list (500 a page) of 60 such Secrets with 76 MiB, past the 64
/// MiB bound, and the source never found a cluster. Paged, it lists them,
/// passes them over, and finds the cluster beside them; a kubeconfig past
/// its bound is skipped alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_of_big_labelled_secrets_is_listed_page_by_page_and_its_cluster_found() {
    let home = common::real_plane(RealOptions::default().name("home")).await;
    let (secrets, _dir, home_kubeconfig) = Home::new(&home).await;
    let bootstrap = "b".repeat(1_000_000);
    for i in 0..60 {
        let big = secret(
            &format!("big-{i}-bootstrap"),
            &serde_json::json!({"cluster.x-k8s.io/cluster-name": format!("big-{i}")}),
            &[("value", &bootstrap)],
        );
        secrets.create("capi", &big).await;
    }
    let kubeconfig = home.kubeconfig().to_yaml();
    secrets
        .create("capi", &clusterapi("prod", &kubeconfig))
        .await;
    let huge = format!("{kubeconfig}\n# {}\n", "x".repeat(300 * 1024));
    secrets.create("capi", &clusterapi("huge", &huge)).await;
    let extra = format!(
        "discovery:\n- secrets: {{namespace: capi, format: clusterapi, kubeconfig: {}}}",
        home_kubeconfig.display()
    );
    let started = Instant::now();
    let tether = discovering(&extra);
    until_reachable(&tether, "prod", Some(1.0)).await;
    let found = started.elapsed();
    until(
        &tether,
        "tether_discovery_errors",
        &["secret=\"huge-kubeconfig\""],
        "1",
        |v| v == Some(1.0),
    )
    .await;
    assert_eq!(
        series(&tether, "tether_discovery_errors", &["secret=\"\""]).await,
        None,
        "the source never failed; logs:\n{}",
        tether.logs()
    );
    assert_eq!(
        series(
            &tether,
            "tether_discovery_remotes",
            &["source=\"capi/clusterapi\""]
        )
        .await,
        Some(1.0)
    );
    let (_, status) = tether.get("/status.json").await.expect("status");
    assert!(
        status.contains("over the 256 KiB tether reads of one value"),
        "{status}"
    );
    println!(
        "discovery: 60 labelled 1 MB Secrets, paged: the cluster beside them probed {found:?} after start"
    );
}

/// A home cluster that stops answering without closing its connections
/// (SIGSTOP: the kernel still accepts, nothing answers), as a path that
/// drops packets would: every request to it has a deadline, so its source
/// shows as failing (`/status`, `tether_discovery_errors{secret=""}`) while
/// the last known remotes run on; resumed, it lists anew and a Secret
/// created meanwhile is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_home_cluster_fails_its_source_within_the_deadline_and_it_lists_again() {
    let (home, a, secrets, _dir, home_kubeconfig) = home_and_a(|a| a.kubeconfig().to_yaml()).await;
    let extra = fleet_source(&home_kubeconfig);
    let tether = discovering(&extra);
    until_reachable(&tether, "a", Some(1.0)).await;
    let failing = ["source=\"fleet/kubeconfig\"", "secret=\"\""];
    assert_eq!(
        series(&tether, "tether_discovery_errors", &failing).await,
        None
    );
    home.pause().await;
    let stuck = until(
        &tether,
        "tether_discovery_errors",
        &failing,
        "1, the source failing",
        |v| v == Some(1.0),
    )
    .await;
    let (_, status) = tether.get("/status.json").await.expect("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    assert!(
        !status["discovery"]["sources"][0]["failing"].is_null(),
        "/status shows the source failing: {status:#}"
    );
    assert_eq!(
        series(&tether, REACHABLE, &[&named("a")]).await,
        Some(1.0),
        "the last known remote runs on"
    );
    home.resume();
    secrets
        .create("fleet", &provider("a2", &a.kubeconfig().to_yaml(), true))
        .await;
    let healed = until_reachable(&tether, "a2", Some(1.0)).await;
    until(&tether, "tether_discovery_errors", &failing, "gone", |v| {
        v.is_none()
    })
    .await;
    println!(
        "discovery: home silent to its source failing {stuck:?}; resumed to a new Secret probed {healed:?}"
    );
}
