//! The real control plane helper: it starts, reports the version it was
//! built as, serves the admin by token and by certificate, enforces RBAC,
//! and each fault does to a client what the real failure does.
//! Run by the test step after `scripts/peers` has built the binaries.

use std::time::Duration;

use tether_testkit::{ControlPlane, RealOptions};
use tokio::time::Instant;

/// What a new connection to `plane` gets: `Ok(code)` for an answer,
/// `Err(why)` for none within `wait`.
async fn answer(plane: &ControlPlane, wait: Duration) -> Result<u16, &'static str> {
    match tokio::time::timeout(wait, plane.get("/readyz")).await {
        Ok(Some((code, _))) => Ok(code),
        Ok(None) => Err("no answer"),
        Err(_) => Err("timeout"),
    }
}

async fn start(name: &str) -> ControlPlane {
    ControlPlane::start(RealOptions::default().name(name))
        .await
        .unwrap_or_else(|err| panic!("the control plane starts: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_start_at_once_and_each_is_the_version_it_was_built_as_and_authenticates_the_admin() {
    // Three remotes and a home cluster, as a test of the exec manager or
    // of discovery needs them: they must fit on the machine together.
    let planes = tokio::join!(start("home"), start("r1"), start("r2"), start("r3"));
    let planes = [&planes.0, &planes.1, &planes.2, &planes.3];
    let mut total = 0;
    for plane in planes {
        let (etcd, apiserver) = plane.rss_kib();
        total += etcd + apiserver;
        println!(
            "real control plane {}: ready in {:?}; RSS etcd {} MiB, kube-apiserver {} MiB",
            plane.name(),
            plane.started_in(),
            etcd / 1024,
            apiserver / 1024
        );
        assert!(etcd > 0 && apiserver > 0);
    }
    println!("four planes at once: RSS {} MiB in all", total / 1024);
    let plane = planes[0];
    let (code, body) = plane.get("/version").await.expect("/version");
    assert_eq!(code, 200);
    let version: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(version["gitVersion"], "v1.37.2", "{body}");
    assert_eq!(version["minor"], "37", "{body}");

    // The admin's token is in system:masters; a wrong one is refused.
    let (code, _) = plane.get("/api/v1/namespaces/default").await.expect("get");
    assert_eq!(code, 200);
    for (kubeconfig, who) in [
        (plane.kubeconfig(), "token"),
        (plane.cert_kubeconfig(), "cert"),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kubeconfig");
        kubeconfig.write(&path).expect("write");
        let output = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&path)
            .args(["auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}"])
            .output()
            .expect("kubectl runs (see docs/testkit.md to install it)");
        let groups = String::from_utf8_lossy(&output.stdout);
        assert!(
            groups.contains("system:masters"),
            "{who}: {groups} {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_does_what_the_real_failure_does() {
    let plane = start("faults").await;
    assert_eq!(answer(&plane, Duration::from_secs(5)).await, Ok(200));

    plane.pause().await;
    assert_eq!(
        answer(&plane, Duration::from_secs(1)).await,
        Err("timeout"),
        "paused"
    );
    plane.resume();
    assert_eq!(
        answer(&plane, Duration::from_secs(5)).await,
        Ok(200),
        "resumed"
    );

    plane.stop();
    let refused = Instant::now();
    assert_eq!(
        answer(&plane, Duration::from_secs(5)).await,
        Err("no answer"),
        "stopped"
    );
    assert!(
        refused.elapsed() < Duration::from_secs(1),
        "refused at once"
    );

    let before = plane.incarnation();
    plane.restart().await.expect("restart");
    assert_eq!(plane.incarnation(), before + 1);
    assert_eq!(
        answer(&plane, Duration::from_secs(5)).await,
        Ok(200),
        "restarted"
    );

    let old = plane.kubeconfig();
    plane.recreate().await.expect("recreate");
    let new = plane.kubeconfig();
    assert_eq!(old.server, new.server, "the same address");
    assert_ne!(old.ca_pem, new.ca_pem, "a new CA");
    assert_ne!(old.token, new.token, "a new token");
    assert_eq!(
        answer(&plane, Duration::from_secs(5)).await,
        Ok(200),
        "recreated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_it_answers_500_on_readyz_through_its_shutdown_delay() {
    let plane = ControlPlane::start(
        RealOptions::default()
            .name("shutdown")
            .shutdown_delay(Duration::from_secs(5)),
    )
    .await
    .expect("starts");
    plane.terminate();
    let begun = Instant::now();
    loop {
        let got = plane.get("/readyz").await;
        // A failed health check is a 500 from the real apiserver, not a
        // 503; the body names the check.
        if let Some((500, body)) = &got {
            assert!(body.contains("[-]shutdown failed"), "{body}");
            break;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(5),
            "/readyz never answered 500: {got:?}; its log:\n{}",
            plane.apiserver_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Still serving other requests while it drains.
    let (code, _) = plane.get("/livez").await.expect("/livez while draining");
    assert_eq!(code, 200);
}
