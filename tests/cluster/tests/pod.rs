//! tether as a pod on a real single-node cluster (`tether_testkit::Node`:
//! kube-apiserver, etcd, kube-controller-manager, kube-scheduler,
//! kube-proxy, kubelet, containerd and runc, all in processes), with its
//! image imported, not pulled, and two real remote control planes.
//!
//! One node and its two remotes serve every part, in order (the node starts
//! in seconds, but its images' imports and the remotes add up): the
//! README's quickstart as written, scraped and alerted on by
//! prometheus-operator's Prometheus and Alertmanager, a lost and recovered
//! remote that reaches a person as an alert and its resolution, a rotated
//! Secret, three replicas with leader election, a release of three
//! upgraded in place from the previous release and rolled back, the exec
//! manager both ways the chart offers, and the controller in a container
//! of its own, without tether's rights. Each part prints what it measured.

mod common;

use std::time::Duration;

use common::monitoring::{self, Monitoring};
use common::upgrade::{Release, Settled};
use common::{Kube, Pod, poll};
use tether_testkit::ControlPlane;
use tokio::time::Instant;

/// The quickstart's namespace and release.
const NS: &str = "tether";

/// The longest a pod may take to turn Ready after `helm install`: the
/// image is local, so this is the start, the first probes and the caches'
/// sync, and the kubelet's readiness period (5s).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The longest the chart's default probes take to count a hung remote
/// unreachable: 3 failures 10s apart, each with a 5s timeout.
const DETECTION: Duration = Duration::from_secs(45);

/// The chart's default probe interval: a resumed remote's next probe.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// The longest a lost remote may take to show as NotReady: the probes'
/// detection plus the kubelet's two failed readiness checks 5s apart.
const NOT_READY_WITHIN: Duration = Duration::from_secs(75);

/// The chart's ServiceMonitor interval, and Prometheus's evaluation
/// interval (`tests/cluster/monitoring/stack.yaml`, the operator's
/// default).
const SCRAPE: Duration = Duration::from_secs(30);
const EVALUATION: Duration = Duration::from_secs(30);

/// `TetherRemoteApiserverUnreachable`'s `for` (alerts/tether.rules.yaml).
const UNREACHABLE_FOR: Duration = Duration::from_secs(300);

/// The test's Alertmanager route (`stack.yaml`): a new group waits
/// `group_wait`; a change in a group (its resolution) waits for the next
/// `group_interval`.
const GROUP_WAIT: Duration = Duration::from_secs(10);
const GROUP_INTERVAL: Duration = Duration::from_secs(30);

/// What a bound allows for the processes on the way (kubectl's poll, a
/// request's latency): not a timing margin for the mechanisms above.
const SLACK: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_runs_as_a_pod_on_a_real_node() {
    let node = common::node().await;
    let kube = Kube::new(&node);
    let monitoring = Monitoring::install(&kube, &node);
    let a = node.remote("cluster-a").await.expect("cluster-a starts");
    let b = node.remote("cluster-b").await.expect("cluster-b starts");

    let pod = quickstart(&kube, &a, &b).await;
    status_through_port_forward(&kube, &node);
    scraped_and_alerted_on(&kube, &monitoring).await;
    remote_lost_and_back(&kube, &a, &pod, &monitoring).await;
    secret_rotated(&kube, &b, &pod).await;
    kube.helm(&["uninstall", "tether", "-n", NS, "--wait"]);

    three_replicas(&kube, &a, &b).await;
    upgraded_in_place(&kube, &node, &a, &b).await;
    for way in [Way::InTheImage, Way::CopiedIn] {
        exec_manager(&kube, &a, way).await;
    }
    separate_controller(&kube, &a, &b).await;
    drop(node);
}

/// The README's quickstart, as written: Secrets from the remotes'
/// kubeconfigs, then `helm install`. The pod turns Ready through the
/// kubelet's own readiness probe on `/readyz`.
async fn quickstart(kube: &Kube, a: &ControlPlane, b: &ControlPlane) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    a.kubeconfig()
        .write(&dir.path().join("cluster-a.kubeconfig"))
        .expect("kubeconfig");
    b.kubeconfig()
        .write(&dir.path().join("cluster-b.kubeconfig"))
        .expect("kubeconfig");
    common::run_script(kube, dir.path(), &common::quickstart());

    let (pod, took) = until_pod(kube, "the quickstart's pod Ready", true, READY_WITHIN).await;
    println!("quickstart: helm install to Ready in {took:.1?}");
    assert_eq!(
        pod.restarts,
        0,
        "no restart on the way: {pod:?}\n{}\nthe container before the restart said:\n{}",
        describe(kube),
        kube.try_run("kubectl", &["-n", NS, "logs", "--previous", &pod.name])
            .unwrap_or_else(|e| e)
    );
    let spec = kube.json(&["-n", NS, "get", "pod", &pod.name]);
    let probe = &spec["spec"]["containers"][0]["readinessProbe"]["httpGet"];
    assert_eq!(
        (probe["path"].as_str(), probe["port"].as_str()),
        (Some("/readyz"), Some("admin")),
        "Ready is the kubelet's probe of tether's /readyz"
    );
    for kind in ["servicemonitor", "prometheusrule"] {
        kube.kubectl(&["-n", NS, "get", kind, "tether"]);
    }
    let log = kube.kubectl(&["-n", NS, "logs", &pod.name]);
    assert!(
        log.contains("manager up: every required cache synced"),
        "the log says what the README says it will:\n{log}"
    );
    status_page(kube, &pod.name);
    pod.name
}

/// tether's `/status` page the README's way: `kubectl port-forward
/// deploy/tether 9090`, then a browser on localhost.
fn status_through_port_forward(kube: &Kube, node: &tether_testkit::Node) {
    let begun = Instant::now();
    let forward = kube
        .port_forward(NS, "deploy/tether", 9090)
        .unwrap_or_else(|err| panic!("{err}"));
    match forward.get("/status", Duration::from_secs(20)) {
        Ok(page) => {
            assert!(
                page.contains("cluster-a"),
                "the page names the remotes:\n{page}"
            );
            println!("port-forward: /status answered in {:.1?}", begun.elapsed());
            forward.stop();
        }
        Err(err) => {
            let said = forward.stop();
            let lines = |process: &str| {
                node.log(process)
                    .lines()
                    .filter(|l| {
                        l.to_lowercase().contains("portforward")
                            || l.to_lowercase().contains("port forward")
                    })
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "kubectl port-forward: {err}\nkubectl said: {said}\nkubelet:\n{}\ncontainerd:\n{}",
                lines("kubelet"),
                lines("containerd")
            );
        }
    }
}

/// tether's `/status` page, through the apiserver's proxy to the pod's
/// admin port: it names both remotes.
fn status_page(kube: &Kube, pod: &str) {
    let page = kube
        .admin(NS, pod, "/status")
        .expect("the status page answers");
    assert!(
        page.contains("<html") && page.contains("cluster-a") && page.contains("cluster-b"),
        "the status page names both remotes:\n{page}"
    );
}

/// Prometheus, run by prometheus-operator, finds the quickstart's pod
/// through its ServiceMonitor and scrapes it, and has loaded every alert
/// of `alerts/tether.rules.yaml` from its PrometheusRule.
async fn scraped_and_alerted_on(kube: &Kube, monitoring: &Monitoring) {
    monitoring.until_ready(kube).await;
    let query = r#"tether_remote_apiserver_reachable{remote="cluster-a"}"#;
    let (sample, took) = poll(
        "Prometheus scrapes tether through the ServiceMonitor",
        // Its first scrape comes within a scrape interval of the target's
        // discovery, which follows the config reloader's pass.
        Duration::from_secs(120),
        || {
            Monitoring::query(kube, query)
                .into_iter()
                .find(|s| s["value"][1] == "1")
        },
        || {
            format!(
                "targets: {:?}\n{}",
                Monitoring::api(kube, "/api/v1/targets?state=active"),
                Monitoring::said(kube)
            )
        },
    )
    .await;
    println!("alerts: {query} = 1 in Prometheus {took:.1?} after its stack was Ready");
    assert_eq!(
        (
            sample["metric"]["namespace"].as_str(),
            sample["metric"]["job"].as_str()
        ),
        (Some(NS), Some("tether")),
        "scraped as the ServiceMonitor's job: {sample}"
    );
    let loaded = Monitoring::alert_rules(kube);
    for alert in monitoring::tether_alerts() {
        assert!(
            loaded.contains(&alert),
            "{alert} is loaded from the PrometheusRule: {loaded:?}"
        );
    }
}

/// One remote's apiserver hangs (SIGSTOP): the pod turns NotReady (0/1),
/// its log and Events say why, `TetherRemoteApiserverUnreachable` goes
/// pending, then firing, and reaches the person through Alertmanager; it
/// turns Ready again after the remote resumes, with no container restart,
/// and the person gets the alert's resolution. No other tether alert fires
/// on the way.
async fn remote_lost_and_back(kube: &Kube, a: &ControlPlane, pod: &str, monitoring: &Monitoring) {
    let wall = std::time::SystemTime::now();
    let fault = Instant::now();
    a.pause().await;
    let (_, took) = until_pod(
        kube,
        "NotReady after cluster-a hung",
        false,
        NOT_READY_WITHIN,
    )
    .await;
    println!("loss: SIGSTOP to NotReady in {took:.1?}");
    let table = kube.kubectl(&["-n", NS, "get", "pods"]);
    assert!(table.contains(" 0/1 "), "kubectl shows 0/1:\n{table}");
    let log = kube.kubectl(&["-n", NS, "logs", pod]);
    assert!(
        log.lines()
            .any(|l| l.contains("cluster-a") && l.contains("remote_lost")),
        "the log names the remote and the cause:\n{log}"
    );
    poll(
        "a RemoteLost Event on the pod",
        Duration::from_secs(30),
        || {
            kube.event_reasons(NS, pod)
                .contains(&"RemoteLost".to_owned())
                .then_some(())
        },
        || format!("{:?}", kube.event_reasons(NS, pod)),
    )
    .await;
    alert_fires(kube, monitoring, wall, fault).await;

    let resumed = Instant::now();
    a.resume();
    let (back, took) = until_pod(
        kube,
        "Ready again after cluster-a resumed",
        true,
        READY_WITHIN,
    )
    .await;
    println!("loss: SIGCONT to Ready in {took:.1?}");
    assert_eq!(back.name, pod, "the same pod");
    assert_eq!(back.restarts, 0, "liveness never depends on a remote");
    alert_resolves(kube, monitoring, resumed).await;
}

/// The unreachable alert for cluster-a, as the person receives it.
fn unreachable_a(alert: &tether_testkit::Alert) -> bool {
    alert.label("alertname") == "TetherRemoteApiserverUnreachable"
        && alert.label("remote") == "cluster-a"
}

/// `TetherRemoteApiserverUnreachable{remote="cluster-a"}` goes pending,
/// then firing in Prometheus, and its notification reaches the webhook,
/// each within the bound the probes, the scrape, the evaluation, the
/// rule's `for` and Alertmanager's `group_wait` give, and never before the
/// `for`.
async fn alert_fires(
    kube: &Kube,
    monitoring: &Monitoring,
    wall: std::time::SystemTime,
    fault: Instant,
) {
    let firing_bound = DETECTION + SCRAPE + EVALUATION + UNREACHABLE_FOR + SLACK;
    let (alert, _) = monitoring::poll_slowly(
        "TetherRemoteApiserverUnreachable firing for cluster-a",
        firing_bound.saturating_sub(fault.elapsed()),
        || {
            Monitoring::alerts(kube).into_iter().find(|alert| {
                alert["labels"]["alertname"] == "TetherRemoteApiserverUnreachable"
                    && alert["labels"]["remote"] == "cluster-a"
                    && alert["state"] == "firing"
            })
        },
        || format!("{:#?}", Monitoring::alerts(kube)),
    )
    .await;
    let firing = fault.elapsed();
    let pending = monitoring::since(wall, &alert["activeAt"]);
    println!(
        "alerts: SIGSTOP to pending in {pending:.1?} (bound {:?}), to firing in {firing:.1?} (bound {firing_bound:?})",
        DETECTION + SCRAPE + EVALUATION
    );
    assert!(
        firing >= UNREACHABLE_FOR,
        "fired after {firing:?}, before its `for` of {UNREACHABLE_FOR:?}"
    );
    assert!(
        alert["annotations"]["runbook_url"]
            .as_str()
            .is_some_and(|url| url.ends_with("docs/runbooks.md#tetherremoteapiserverunreachable")),
        "the runbook's URL: {alert}"
    );

    let webhook_bound = firing_bound + GROUP_WAIT;
    let (notification, took) = monitoring::poll_slowly(
        "the firing alert at the webhook",
        webhook_bound.saturating_sub(fault.elapsed()),
        || {
            monitoring
                .webhook()
                .notifications()
                .into_iter()
                .find(|n| n.status == "firing" && n.alerts.iter().any(unreachable_a))
        },
        || format!("{:#?}", monitoring.webhook().notifications()),
    )
    .await;
    let delivered = notification.at - fault;
    println!(
        "alerts: SIGSTOP to the webhook's firing notification in {delivered:.1?} (bound {webhook_bound:?}; {took:.1?} after Prometheus showed it firing)"
    );
    let alert = notification
        .alerts
        .iter()
        .find(|a| unreachable_a(a))
        .expect("the alert");
    assert_eq!(alert.label("severity"), "critical");
    assert!(
        alert
            .annotations
            .get("runbook_url")
            .is_some_and(|u| u.contains("runbooks.md")),
        "the person gets the runbook: {alert:?}"
    );
}

/// After cluster-a resumed, the person gets the resolution, within the
/// probes' next success, a scrape, an evaluation and Alertmanager's
/// `group_interval`; and nothing else ever reached them: no other tether
/// alert fired during the whole run.
async fn alert_resolves(kube: &Kube, monitoring: &Monitoring, resumed: Instant) {
    let bound = PROBE_INTERVAL + SCRAPE + EVALUATION + GROUP_INTERVAL + SLACK;
    let (notification, _) = monitoring::poll_slowly(
        "the resolution at the webhook",
        bound.saturating_sub(resumed.elapsed()),
        || {
            monitoring.webhook().notifications().into_iter().find(|n| {
                n.at > resumed
                    && n.alerts
                        .iter()
                        .any(|a| unreachable_a(a) && a.status == "resolved")
            })
        },
        || format!("{:#?}", monitoring.webhook().notifications()),
    )
    .await;
    println!(
        "alerts: SIGCONT to the webhook's resolved notification in {:.1?} (bound {bound:?})",
        notification.at - resumed
    );
    for notification in monitoring.webhook().notifications() {
        assert!(
            notification.alerts.iter().all(unreachable_a),
            "only cluster-a's unreachable alert reached the person: {notification:?}"
        );
    }
    let others = Monitoring::query(
        kube,
        r#"max_over_time(ALERTS{alertname=~"Tether.+",alertname!="TetherRemoteApiserverUnreachable"}[1h])"#,
    );
    let firing: Vec<_> = others
        .iter()
        .filter(|s| s["metric"]["alertstate"] == "firing")
        .collect();
    assert!(firing.is_empty(), "no other tether alert fired: {firing:?}");
    if !others.is_empty() {
        println!("alerts: pending on the way, never firing: {others:?}");
    }
}

/// cluster-b is made anew (a new CA and token on the same address): the
/// old Secret no longer works and the pod turns NotReady. The new
/// kubeconfig, applied over the Secret as an operator would, reaches the
/// pod through the kubelet's volume update, and tether picks it up without
/// a restart.
async fn secret_rotated(kube: &Kube, b: &ControlPlane, pod: &str) {
    b.recreate().await.expect("cluster-b is made anew");
    let (_, took) = until_pod(
        kube,
        "NotReady on cluster-b's old credentials",
        false,
        NOT_READY_WITHIN,
    )
    .await;
    println!("rotation: cluster-b recreated to NotReady in {took:.1?}");

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cluster-b.kubeconfig");
    b.kubeconfig().write(&file).expect("kubeconfig");
    common::run_script(
        kube,
        dir.path(),
        "kubectl -n tether create secret generic tether-cluster-b \\
           --from-file=kubeconfig=./cluster-b.kubeconfig --dry-run=client -o yaml \\
         | kubectl apply -f -",
    );

    let (back, took) = until_pod(
        kube,
        "Ready on cluster-b's new credentials",
        true,
        READY_WITHIN,
    )
    .await;
    println!("rotation: kubectl apply to Ready in {took:.1?}");
    assert_eq!(back.name, pod, "the same pod");
    assert_eq!(back.restarts, 0, "picked up without a restart");
    let log = kube.kubectl(&["-n", NS, "logs", pod]);
    let changed = log
        .lines()
        .find(|l| l.contains("kubeconfig changed") && l.contains("cluster-b"));
    let Some(changed) = changed else {
        panic!("the log says the kubeconfig changed:\n{log}");
    };
    // The folder's inotify watch, or a failing probe's own check, whichever
    // came first: both are immediate.
    println!("rotation: {changed}");
}

/// The release `ha`: three replicas over both remotes, with leader
/// election (the chart turns it on). Exactly one leads; deleting its pod
/// moves the Lease to another within the documented bound; an eviction
/// honours the `PodDisruptionBudget` (maxUnavailable 1).
async fn three_replicas(kube: &Kube, a: &ControlPlane, b: &ControlPlane) {
    const HA: &str = "ha";
    kube.secrets(HA, &[("cluster-a", a), ("cluster-b", b)]);
    install(
        kube,
        HA,
        "remotes:
  - {name: cluster-a, secretName: tether-cluster-a}
  - {name: cluster-b, secretName: tether-cluster-b}
replicaCount: 3
",
    );
    let (pods, took) = all_ready(kube, HA, 3).await;
    println!("ha: helm install to 3 Ready in {took:.1?}");

    let leader = only_leader(kube, HA, &pods).await;
    kube.kubectl(&["-n", HA, "delete", "pod", &leader, "--wait=false"]);
    let (next, took) = poll(
        "another replica leads after the leader's pod was deleted",
        FAILOVER_WITHIN,
        || {
            // A follower, or the deleted pod's replacement: whichever
            // reads the released Lease first.
            let holder = lease_holder(kube, HA)?;
            kube.pods(HA, HA)
                .into_iter()
                .map(|p| p.name)
                .find(|p| *p != leader && holder.starts_with(p.as_str()))
        },
        || {
            format!(
                "{:?}",
                kube.kubectl(&["-n", HA, "get", "lease", "-o", "yaml"])
            )
        },
    )
    .await;
    println!("ha: leader's pod deleted to {next} holding the Lease in {took:.1?}");
    let (pods, _) = all_ready(kube, HA, 3).await;
    assert_eq!(
        only_leader(kube, HA, &pods).await,
        next,
        "the new holder leads, alone"
    );

    // The budget allows one pod down: the first eviction is taken, the
    // second, while the first pod's replacement is not Ready, refused.
    poll(
        "the PodDisruptionBudget allows one disruption",
        Duration::from_secs(60),
        || {
            let pdb = kube.json(&["-n", HA, "get", "pdb", "ha-tether"]);
            (pdb["status"]["disruptionsAllowed"] == 1).then_some(())
        },
        || kube.kubectl(&["-n", HA, "get", "pdb", "-o", "yaml"]),
    )
    .await;
    let followers: Vec<&String> = pods.iter().filter(|p| **p != next).collect();
    evict(kube, HA, followers[0]).expect("the first eviction is allowed");
    let refused = evict(kube, HA, followers[1]).expect_err("the second eviction is refused");
    assert!(
        refused.contains("disruption budget"),
        "refused for the budget: {refused}"
    );
    let (_, took) = all_ready(kube, HA, 3).await;
    println!(
        "ha: eviction to 3 Ready again in {took:.1?}; a second eviction was refused: {}",
        refused.trim()
    );
    kube.helm(&["uninstall", HA, "-n", HA, "--wait"]);
}

/// The upgrade in place's namespace and release.
const UP: &str = "upgrade";

/// Three replicas of the previous release (`tests/cluster/previous`: its
/// chart and its image, which `scripts/cluster` builds), upgraded in place
/// to this one with a config change (the manager watches ConfigMaps too),
/// then rolled back. Each change is looked at as it happens
/// ([`Release::change`]): the remotes' audit logs witness that no two pods
/// ever had watches open at once, and at every look the Lease names one
/// pod of the release, the budget's floor holds, and no two pods say their
/// manager is up. The manager's absence, each time it moved, is within the
/// failover bound.
async fn upgraded_in_place(
    kube: &Kube,
    node: &tether_testkit::Node,
    a: &ControlPlane,
    b: &ControlPlane,
) {
    let root = common::root();
    let previous = std::fs::read_to_string(root.join("tests/cluster/previous"))
        .expect("tests/cluster/previous names the previous release");
    let previous = previous.trim();
    let old_chart = root.join("target/upgrade/src/helm/tether");
    assert!(
        old_chart.is_dir(),
        "{} is missing: scripts/cluster extracts the previous release there",
        old_chart.display()
    );
    let old_image = "localhost/tether:previous";
    let new_image = format!("localhost/tether:{}", env!("CARGO_PKG_VERSION"));
    kube.secrets(UP, &[("cluster-a", a), ("cluster-b", b)]);
    let values = "remotes:
  - {name: cluster-a, secretName: tether-cluster-a}
  - {name: cluster-b, secretName: tether-cluster-b}
replicaCount: 3
";
    let changed = format!(
        "{values}config:
  watch:
    - {{apiVersion: v1, kind: Namespace}}
    - {{apiVersion: v1, kind: ConfigMap}}
"
    );
    let (values, changed) = (values_file(values), values_file(&changed));
    let release = Release {
        kube,
        node,
        name: UP,
        remotes: [a, b],
        since: jiff::Timestamp::now(),
    };
    kube.helm(&[
        "install",
        UP,
        old_chart.to_str().expect("UTF-8"),
        "-n",
        UP,
        "-f",
        values.path().to_str().expect("UTF-8"),
        "--set",
        "image.tag=previous",
    ]);
    let (pods, took) = all_ready(kube, UP, 3).await;
    only_leader(kube, UP, &pods).await;
    println!(
        "upgrade: the previous release ({}) installed, 3 Ready in {took:.1?}",
        &previous[..12]
    );

    let chart = root.join("helm/tether");
    let upgraded = release.change(
        "helm upgrade",
        || {
            kube.helm(&[
                "upgrade",
                UP,
                chart.to_str().expect("UTF-8"),
                "-n",
                UP,
                "-f",
                changed.path().to_str().expect("UTF-8"),
                "--wait",
                "--timeout",
                "3m",
            ]);
        },
        &Settled {
            image: &new_image,
            watched: &["configmaps", "namespaces"],
        },
        READY_WITHIN,
    );
    moved_within_bounds("helm upgrade", &upgraded);
    let rolled_back = release.change(
        "helm rollback",
        || {
            kube.helm(&["rollback", UP, "1", "-n", UP, "--wait", "--timeout", "3m"]);
        },
        &Settled {
            image: old_image,
            watched: &["namespaces"],
        },
        READY_WITHIN,
    );
    moved_within_bounds("helm rollback", &rolled_back);
    rolled_back_to_the_first(kube);
    kube.helm(&["uninstall", UP, "-n", UP, "--wait"]);
}

/// Asserts that the release's history ends in the rollback to its first
/// revision, deployed.
fn rolled_back_to_the_first(kube: &Kube) {
    let history: serde_json::Value =
        serde_json::from_str(&kube.helm(&["history", UP, "-n", UP, "-o", "json"]))
            .expect("helm prints JSON");
    let last = &history[2];
    assert_eq!(
        (
            last["revision"].as_i64(),
            last["status"].as_str(),
            last["description"].as_str()
        ),
        (Some(3), Some("deployed"), Some("Rollback to 1")),
        "the third revision is the rollback, deployed: {history}"
    );
}

/// Asserts what an upgrade or a rollback must show: the manager moved (every
/// pod was replaced), each time within the failover bound, and the witness
/// saw watches from more than one pod on each remote; prints the figures.
fn moved_within_bounds(what: &str, measured: &common::upgrade::Measured) {
    let seconds = |d: &[Duration]| {
        d.iter()
            .map(|d| format!("{:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "upgrade: {what}: settled in {:.1?} ({} looks); the manager moved {}; no manager for {} s; the Lease without a holder for at most {:.1?}; fewest Ready {} (the budget's floor {}); the witness: {:?} watches (pods) on the remotes, never two pods at once",
        measured.took,
        measured.looks,
        measured.leaders.join(" -> "),
        seconds(&measured.gaps),
        measured.holderless,
        measured.fewest_ready,
        common::upgrade::BUDGET_FLOOR,
        measured.watches,
    );
    assert!(
        measured.leaders.len() >= 2,
        "{what}: the manager never moved: {:?}",
        measured.leaders
    );
    let longest = measured.gaps.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= FAILOVER_WITHIN && measured.holderless <= FAILOVER_WITHIN,
        "{what}: no manager for {longest:.1?}, no holder for {:.1?}: over {FAILOVER_WITHIN:?}",
        measured.holderless
    );
    for (watches, pods) in &measured.watches {
        assert!(
            *pods >= 2,
            "{what}: the witness saw {watches} watches from {pods} pod on a remote"
        );
    }
}

/// `values` in a temporary file, for `helm -f`.
fn values_file(values: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), values).expect("values");
    file
}

/// The longest a deleted leader's Lease may take to move: the leader
/// stops its manager and releases it (SIGTERM from the kubelet), and a
/// follower takes it within `retryPeriod` (2s, with 20% jitter); a leader
/// that never released it would hold it `leaseDuration` (15s) longer.
const FAILOVER_WITHIN: Duration = Duration::from_secs(15);

/// The two ways the chart runs the exec manager.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// tether in the controller's image (`image` set to it).
    InTheImage,
    /// tether copied in by an init container (`manager.exec.image`).
    CopiedIn,
}

/// The exec manager, one way, with the real controller-runtime
/// `mirror-controller` as the controller: the pod turns Ready through the
/// controller's own `/readyz`, and a ConfigMap labelled in cluster-a is
/// mirrored into the home namespace by the controller tether started.
async fn exec_manager(kube: &Kube, a: &ControlPlane, way: Way) {
    let ns = match way {
        Way::InTheImage => "exec-image",
        Way::CopiedIn => "exec-copied",
    };
    kube.secrets(ns, &[("cluster-a", a)]);
    // The controller writes its mirrors at home: a Role for that, as its
    // own chart would carry, for tether's account, which it runs as.
    mirror_role(kube, ns, &format!("--serviceaccount={ns}:{ns}-tether"));
    let image = match way {
        Way::InTheImage => "image: {repository: localhost/mirror-controller-tether, tag: test}",
        Way::CopiedIn => "image: {repository: localhost/tether}",
    };
    let inject = match way {
        Way::InTheImage => "",
        Way::CopiedIn => "    image: {repository: localhost/mirror-controller, tag: test}\n",
    };
    install(
        kube,
        ns,
        &format!(
            "{image}
remotes:
  - {{name: cluster-a, secretName: tether-cluster-a}}
manager:
  exec:
    command: [/mirror-controller, --remote, cluster-a, --namespace, {ns}]
    readiness: {{httpGet: {{port: 8081, path: /readyz}}, period: 1s, timeout: 1s, failureThreshold: 3}}
{inject}"
        ),
    );
    let (pods, took) = all_ready(kube, ns, 1).await;
    println!("exec ({way:?}): helm install to Ready in {took:.1?}");
    let pod = kube.json(&["-n", ns, "get", "pod", &pods[0]]);
    if let Way::CopiedIn = way {
        let init = &pod["status"]["initContainerStatuses"][0];
        assert_eq!(init["name"], "install-tether");
        assert_eq!(
            init["state"]["terminated"]["exitCode"], 0,
            "tether was copied in: {init}"
        );
    }

    let took = mirrored(kube, (a, "cluster-a"), ns, &pods[0], "").await;
    println!("exec ({way:?}): a labelled ConfigMap mirrored in {took:.1?}");
    let pods_now = kube.pods(ns, ns);
    assert_eq!(pods_now.len(), 1);
    assert_eq!(pods_now[0].restarts, 0, "{way:?}: no restart");
    kube.helm(&["uninstall", ns, "-n", ns, "--wait"]);
}

/// Labels a new ConfigMap in `plane` (the remote `name`) for mirroring,
/// and waits until the controller in `pod` has written its mirror,
/// `<prefix>default-<ConfigMap>`, into `ns` at home.
async fn mirrored(
    kube: &Kube,
    (plane, name): (&ControlPlane, &str),
    ns: &str,
    pod: &str,
    prefix: &str,
) -> Duration {
    let from = name;
    let remote = tempfile::NamedTempFile::new().expect("temp file");
    plane.kubeconfig().write(remote.path()).expect("kubeconfig");
    let name = format!("seen-by-{ns}");
    kube.kubectl(&[
        "--kubeconfig",
        remote.path().to_str().expect("UTF-8"),
        "-n",
        "default",
        "create",
        "configmap",
        &name,
        &format!("--from-literal=from={from}"),
    ]);
    kube.kubectl(&[
        "--kubeconfig",
        remote.path().to_str().expect("UTF-8"),
        "-n",
        "default",
        "label",
        "configmap",
        &name,
        "tether.test/mirror=yes",
    ]);
    let (_, took) = poll(
        &format!("the controller mirrors {from}'s ConfigMap at home"),
        Duration::from_secs(60),
        || {
            kube.try_run(
                "kubectl",
                &[
                    "-n",
                    ns,
                    "get",
                    "configmap",
                    &format!("{prefix}default-{name}"),
                    "-o",
                    "jsonpath={.data.from}",
                ],
            )
            .ok()
            .filter(|mirrored| mirrored == from)
        },
        || {
            kube.try_run("kubectl", &["-n", ns, "logs", pod, "--all-containers"])
                .unwrap_or_else(|e| e)
        },
    )
    .await;
    took
}

/// The controller in a container of its own (`manager.exec.separate`):
/// tether discovers cluster-a from an Argo CD cluster Secret (so its
/// service account reads every Secret of `argocd`, `argocd-secret` among
/// them) and has cluster-b from a Secret of its own. The fleet-mode
/// controller, in the other container, mirrors from both as its own
/// ServiceAccount, and every credential it finds in its container (its
/// environment, every file) gets 401 or 403 for `argocd-secret`.
async fn separate_controller(kube: &Kube, a: &ControlPlane, b: &ControlPlane) {
    const NS: &str = "separate";
    kube.secrets(NS, &[("cluster-b", b)]);
    kube.kubectl(&["create", "namespace", "argocd"]);
    kube.kubectl(&[
        "-n",
        "argocd",
        "create",
        "secret",
        "generic",
        "argocd-secret",
        "--from-literal=admin.password=for-argo-cd-alone",
    ]);
    argocd_cluster(kube, "cluster-a", a);
    // The controller's own RBAC, bound to the ServiceAccount the chart
    // makes for it: its mirrors, in its namespace.
    mirror_role(
        kube,
        NS,
        &format!("--serviceaccount={NS}:{NS}-tether-controller"),
    );
    install(
        kube,
        NS,
        &format!(
            "image: {{repository: localhost/tether}}
remotes:
  - {{name: cluster-b, secretName: tether-cluster-b}}
discovery:
  - secrets: {{namespace: argocd, format: argocd}}
manager:
  exec:
    command: [/mirror-controller, --fleet, --namespace, {NS}, --audit-secret, argocd/argocd-secret]
    followsRemotesFile: true
    readiness: {{httpGet: {{port: 8081, path: /readyz}}, period: 1s, timeout: 1s, failureThreshold: 3}}
    image: {{repository: localhost/mirror-controller, tag: test}}
    separate: {{enabled: true}}
"
        ),
    );
    let (pods, took) = all_ready(kube, NS, 1).await;
    println!("separate: helm install to Ready in {took:.1?}");
    let pod = &pods[0];

    // tether's own service account may read argocd-secret: what the
    // controller must not reach.
    let tether_can = kube.kubectl(&[
        "auth",
        "can-i",
        "get",
        "secret/argocd-secret",
        "-n",
        "argocd",
        &format!("--as=system:serviceaccount:{NS}:{NS}-tether"),
    ]);
    assert_eq!(tether_can.trim(), "yes", "tether's own rights");
    // It may request tokens for the controller's ServiceAccount alone
    // (`can-i` prints no, and exits 1, for a no).
    for (account, allowed) in [
        (format!("{NS}-tether-controller"), "yes"),
        ("default".to_owned(), "no"),
    ] {
        let out = kube
            .command("kubectl")
            .args([
                "auth",
                "can-i",
                "create",
                &format!("serviceaccounts/{account}"),
                "--subresource=token",
                "-n",
                NS,
                &format!("--as=system:serviceaccount:{NS}:{NS}-tether"),
            ])
            .output()
            .expect("kubectl runs");
        let answer = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            answer.trim(),
            allowed,
            "tether may request a token for {account}: {answer}"
        );
    }

    credentials_refused(kube, NS, pod).await;

    let took = mirrored(kube, (a, "cluster-a"), NS, pod, "cluster-a-").await;
    println!("separate: cluster-a's (discovered) ConfigMap mirrored in {took:.1?}");
    let took = mirrored(kube, (b, "cluster-b"), NS, pod, "cluster-b-").await;
    println!("separate: cluster-b's ConfigMap mirrored in {took:.1?}");
    let now = kube.pods(NS, NS);
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].restarts, 0, "no restart of either container");
    kube.helm(&["uninstall", NS, "-n", NS, "--wait"]);
}

/// The controller's credential audit (`--audit-secret`), from its log:
/// every credential found in its container, its own among them, gets 401
/// or 403 for `argocd-secret`, and no service account token is there.
async fn credentials_refused(kube: &Kube, ns: &str, pod: &str) {
    let audit = poll(
        "the controller's credential audit",
        READY_WITHIN,
        || {
            let log = kube
                .try_run("kubectl", &["-n", ns, "logs", pod, "-c", "controller"])
                .ok()?;
            log.contains("credential audit done").then_some(log)
        },
        || {
            kube.try_run("kubectl", &["-n", ns, "logs", pod, "--all-containers"])
                .unwrap_or_else(|e| e)
        },
    )
    .await
    .0;
    let tried: Vec<(String, String)> = audit
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["msg"] == "credential tried")
        .map(|event| {
            (
                event["source"].as_str().unwrap_or_default().to_owned(),
                event["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    println!(
        "separate: the controller tried {} credentials for argocd-secret:",
        tried.len()
    );
    for (source, status) in &tried {
        println!("    {status}  {source}");
    }
    assert!(
        tried
            .iter()
            .all(|(_, status)| status == "401" || status == "403"),
        "every credential in the controller's container is refused argocd-secret: {tried:?}"
    );
    let found = |what: &str| tried.iter().any(|(source, _)| source.contains(what));
    assert!(
        found(".home-kubeconfig") && found(".home-token"),
        "it found its own home credentials: {tried:?}"
    );
    assert!(
        tried
            .iter()
            .any(|(source, status)| source.contains(".home-token") && status == "403"),
        "as its own ServiceAccount, it is known and refused (403): {tried:?}"
    );
    assert!(
        found("/run/tether/")
            && found("cluster-a.kubeconfig")
            && found("/etc/tether/remotes/cluster-b/"),
        "it found the remotes' kubeconfigs, discovered and static: {tried:?}"
    );
    assert!(
        !found("/var/run/secrets"),
        "no service account token in its container: {tried:?}"
    );
}

/// The mirror controller's Role in `ns` (its mirrors, ConfigMaps there),
/// bound to `subject` (a `kubectl create rolebinding` subject flag).
fn mirror_role(kube: &Kube, ns: &str, subject: &str) {
    kube.kubectl(&[
        "-n",
        ns,
        "create",
        "role",
        "mirror",
        "--verb=get,list,watch,create,update,patch,delete",
        "--resource=configmaps",
    ]);
    kube.kubectl(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        "mirror",
        "--role=mirror",
        subject,
    ]);
}

/// An Argo CD cluster Secret in `argocd` for `plane`, named `name`.
fn argocd_cluster(kube: &Kube, name: &str, plane: &ControlPlane) {
    use base64::Engine as _;
    let config = serde_json::json!({
        "bearerToken": plane.token(),
        "tlsClientConfig": {
            "caData": base64::engine::general_purpose::STANDARD.encode(plane.ca_pem()),
        },
    });
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": "argocd",
            "labels": {"argocd.argoproj.io/secret-type": "cluster"},
        },
        "stringData": {"name": name, "server": plane.url(), "config": config.to_string()},
    });
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), secret.to_string()).expect("secret");
    kube.kubectl(&["apply", "-f", file.path().to_str().expect("UTF-8")]);
}

/// `helm install <namespace> <chart> -n <namespace> -f <values>`: the
/// release is named for its namespace.
fn install(kube: &Kube, namespace: &str, values: &str) {
    let file = values_file(values);
    let chart = common::root().join("helm/tether");
    kube.helm(&[
        "install",
        namespace,
        chart.to_str().expect("UTF-8"),
        "-n",
        namespace,
        "-f",
        file.path().to_str().expect("UTF-8"),
    ]);
}

/// Waits until `release`'s pods are exactly `count`, all Ready and none
/// terminating: their names, and how long it took.
async fn all_ready(kube: &Kube, release: &str, count: usize) -> (Vec<String>, Duration) {
    poll(
        &format!("{count} Ready pods of {release}"),
        READY_WITHIN,
        || {
            let pods = kube.pods(release, release);
            (pods.len() == count && pods.iter().all(|p| p.ready && !p.deleting))
                .then(|| pods.into_iter().map(|p| p.name).collect())
        },
        || {
            kube.try_run("kubectl", &["-n", release, "describe", "pods"])
                .unwrap_or_else(|e| e)
        },
    )
    .await
}

/// The Lease's holder, if it has one.
fn lease_holder(kube: &Kube, release: &str) -> Option<String> {
    let lease = kube
        .try_run(
            "kubectl",
            &[
                "-n",
                release,
                "get",
                "lease",
                &format!("{release}-tether"),
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        )
        .ok()?;
    (!lease.is_empty()).then_some(lease)
}

/// Waits until one of `pods` leads: its `tether_leader` is 1, every
/// other's 0, and the Lease names it. Never two at once: each look checks.
async fn only_leader(kube: &Kube, release: &str, pods: &[String]) -> String {
    let leaders = || -> Vec<String> {
        pods.iter()
            .filter(|pod| {
                let metrics = kube
                    .admin(release, pod, "/metrics")
                    .expect("the admin port answers");
                let value = metrics
                    .lines()
                    .find_map(|l| l.strip_prefix("tether_leader "))
                    .unwrap_or_else(|| panic!("{pod} exports tether_leader"));
                value.trim() == "1"
            })
            .cloned()
            .collect()
    };
    let (leader, _) = poll(
        &format!("one of {pods:?} leads"),
        FAILOVER_WITHIN,
        || {
            let leaders = leaders();
            assert!(leaders.len() <= 1, "two lead at once: {leaders:?}");
            let holder = lease_holder(kube, release)?;
            leaders
                .into_iter()
                .next()
                .filter(|leader| holder.starts_with(leader.as_str()))
        },
        || kube.kubectl(&["-n", release, "get", "lease", "-o", "yaml"]),
    )
    .await;
    leader
}

/// Asks for `pod`'s eviction (policy/v1 Eviction): Ok, or the refusal.
fn evict(kube: &Kube, namespace: &str, pod: &str) -> Result<String, String> {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        file.path(),
        format!(r#"{{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {{"name": "{pod}", "namespace": "{namespace}"}}}}"#),
    )
    .expect("eviction");
    kube.try_run(
        "kubectl",
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{namespace}/pods/{pod}/eviction"),
            "-f",
            file.path().to_str().expect("UTF-8"),
        ],
    )
}

/// Waits until the quickstart has exactly one pod, Ready or not as
/// `ready` says: the pod, and how long it took.
async fn until_pod(kube: &Kube, what: &str, ready: bool, within: Duration) -> (Pod, Duration) {
    poll(
        what,
        within,
        || only_pod(kube).filter(|p| p.ready == ready),
        || describe(kube),
    )
    .await
}

/// The quickstart's one pod, once there is exactly one.
fn only_pod(kube: &Kube) -> Option<Pod> {
    let pods = kube.pods(NS, "tether");
    (pods.len() == 1).then(|| pods[0].clone())
}

/// What the cluster says about the quickstart's pods, for a failure.
fn describe(kube: &Kube) -> String {
    kube.try_run("kubectl", &["-n", NS, "describe", "pods"])
        .unwrap_or_else(|err| err)
}
