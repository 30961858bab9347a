//! prometheus-operator on the node, with one Prometheus and one
//! Alertmanager it runs (`tests/cluster/monitoring/stack.yaml`), and the
//! test's webhook receiver as the person Alertmanager notifies. Prometheus
//! is read through the apiserver's proxy to its Service, as `kubectl`
//! reaches anything in the cluster.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;
use tether_testkit::{AlertWebhook, Node};

use super::{Kube, poll, poll_every, root};

/// Where `scripts/peers cluster` put the operator's CRDs and RBAC.
fn manifests() -> std::path::PathBuf {
    root().join("target/peers/prometheus-operator")
}

/// The longest the operator may take to run Prometheus and Alertmanager,
/// Ready, from `kubectl apply`: the operator's start, two stateful sets,
/// the config reloaders' first pass, the kubelet's readiness periods.
const STACK_WITHIN: Duration = Duration::from_secs(180);

/// The running stack.
pub(crate) struct Monitoring {
    webhook: AlertWebhook,
}

impl Monitoring {
    /// Applies the operator's CRDs and RBAC, then the stack, with the
    /// webhook receiver listening on the node's address.
    pub(crate) fn install(kube: &Kube, node: &Node) -> Self {
        let webhook = AlertWebhook::serve(node.listen().expect("a port on the node"))
            .expect("the webhook receiver serves");
        for dir in ["crds", "rbac"] {
            let path = manifests().join(dir);
            // Server-side: the Prometheus CRD is larger than the
            // annotation a client-side apply keeps.
            kube.kubectl(&[
                "apply",
                "--server-side",
                "-f",
                path.to_str().expect("a UTF-8 path"),
            ]);
        }
        kube.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "--all",
        ]);
        let stack = std::fs::read_to_string(root().join("tests/cluster/monitoring/stack.yaml"))
            .expect("the stack's manifest")
            .replace("WEBHOOK_URL", &webhook.url());
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("stack.yaml");
        std::fs::write(&file, stack).expect("written");
        kube.kubectl(&["apply", "-f", file.to_str().expect("a UTF-8 path")]);
        Self { webhook }
    }

    /// Waits until Prometheus and Alertmanager are Ready.
    pub(crate) async fn until_ready(&self, kube: &Kube) {
        let ((), took) = poll(
            "Prometheus and Alertmanager Ready",
            STACK_WITHIN,
            || {
                ["prometheus-main-0", "alertmanager-main-0"]
                    .iter()
                    .all(|pod| {
                        kube.try_run(
                            "kubectl",
                            &[
                                "-n",
                                "monitoring",
                                "get",
                                "pod",
                                pod,
                                "-o",
                                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                            ],
                        )
                        .is_ok_and(|s| s == "True")
                    })
                    .then_some(())
            },
            || Self::said(kube),
        )
        .await;
        println!("alerts: Prometheus and Alertmanager Ready in {took:.1?} (after the quickstart)");
    }

    /// What the stack says of itself, for a wait that failed: the pods, the
    /// last lines of Prometheus's, its config reloader's (which loads the
    /// scrape config the operator writes from a ServiceMonitor) and
    /// Alertmanager's logs, and the operator's.
    pub(crate) fn said(kube: &Kube) -> String {
        let pods = kube
            .try_run("kubectl", &["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_else(|e| e);
        let mut said = format!("{pods}\n");
        for (pod, container) in [
            ("prometheus-main-0", "prometheus"),
            ("prometheus-main-0", "config-reloader"),
            ("alertmanager-main-0", "alertmanager"),
        ] {
            for previous in ["--previous=false", "--previous=true"] {
                let log = kube
                    .try_run(
                        "kubectl",
                        &[
                            "-n",
                            "monitoring",
                            "logs",
                            pod,
                            "-c",
                            container,
                            previous,
                            "--tail=20",
                        ],
                    )
                    .unwrap_or_else(|e| e);
                let _ = writeln!(said, "{pod}/{container} ({previous}):\n{log}");
            }
        }
        let operator = kube
            .try_run(
                "kubectl",
                &[
                    "-n",
                    "default",
                    "logs",
                    "deploy/prometheus-operator",
                    "--tail=10",
                ],
            )
            .unwrap_or_else(|e| e);
        format!("{said}operator:\n{operator}")
    }

    /// `GET path` of Prometheus's HTTP API, through the apiserver's proxy:
    /// its `data`, if it answered `success`.
    pub(crate) fn api(kube: &Kube, path: &str) -> Option<Value> {
        let body = kube
            .try_run(
                "kubectl",
                &[
                    "get",
                    "--raw",
                    &format!(
                        "/api/v1/namespaces/monitoring/services/prometheus-operated:web/proxy{path}"
                    ),
                ],
            )
            .ok()?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// An instant query: its result's samples.
    pub(crate) fn query(kube: &Kube, promql: &str) -> Vec<Value> {
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", promql)
            .finish();
        Self::api(kube, &format!("/api/v1/query?{query}"))
            .and_then(|data| data["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The alerts Prometheus holds now, pending or firing.
    pub(crate) fn alerts(kube: &Kube) -> Vec<Value> {
        Self::api(kube, "/api/v1/alerts")
            .and_then(|data| data["alerts"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The names of the alerting rules Prometheus has loaded.
    pub(crate) fn alert_rules(kube: &Kube) -> Vec<String> {
        Self::api(kube, "/api/v1/rules?type=alert")
            .and_then(|data| data["groups"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|rule| rule["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// The person's receiver.
    pub(crate) fn webhook(&self) -> &AlertWebhook {
        &self.webhook
    }
}

/// The alert names of `alerts/tether.rules.yaml`, in its order.
pub(crate) fn tether_alerts() -> Vec<String> {
    let rules = std::fs::read_to_string(root().join("alerts/tether.rules.yaml"))
        .expect("alerts/tether.rules.yaml");
    rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert: "))
        .map(|name| name.trim().to_owned())
        .collect()
}

/// How often the alert checks look: an alert's state changes only at
/// Prometheus's evaluations, 30s apart, so a look a second is precise
/// enough and spares the machine a `kubectl` four times a second.
const SLOWLY: Duration = Duration::from_secs(1);

/// [`poll`](super::poll), looking every second.
pub(crate) async fn poll_slowly<T>(
    what: &str,
    deadline: Duration,
    check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> (T, Duration) {
    poll_every(what, deadline, SLOWLY, check, context).await
}

/// How long after `wall` the RFC 3339 time `at` (Prometheus's `activeAt`)
/// is.
pub(crate) fn since(wall: std::time::SystemTime, at: &Value) -> Duration {
    let at: jiff::Timestamp = at
        .as_str()
        .and_then(|at| at.parse().ok())
        .unwrap_or_else(|| panic!("an RFC 3339 time: {at}"));
    let wall = jiff::Timestamp::try_from(wall).expect("a time jiff holds");
    at.duration_since(wall)
        .try_into()
        .unwrap_or_else(|_| panic!("{at} is after {wall}"))
}
