//! Credentials rotated under a running tether, as Kubernetes rotates them:
//! a Secret volume's `..data` symlink swapped to a new directory, and no
//! signal sent. Each remote's client is rebuilt within a few seconds, the
//! other remote's is left alone, and no rotation makes a lost remote.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::path::PathBuf;

mod common;

use common::matrix::{detection_bound, reachable, within};
use common::{Shape, Tether, remote};
use tether_testkit::{ApiServer, Options, Rotation};
use tokio::time::Instant;

/// A directory laid out as the kubelet mounts a Secret: each key a symlink
/// `<key> -> ..data/<key>`, and `..data` a symlink to a timestamped
/// directory. An update writes a new directory and renames a new `..data`
/// over the old one, so a reader sees the old keys or the new ones.
struct SecretVolume {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretVolume {
    fn new(keys: &[(&str, String)]) -> Self {
        let mut volume = Self {
            dir: tempfile::tempdir().expect("dir"),
            generation: 0,
        };
        volume.update(keys);
        for (key, _) in keys {
            std::os::unix::fs::symlink(format!("..data/{key}"), volume.path(key)).expect("link");
        }
        volume
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.path().join(key)
    }

    fn update(&mut self, keys: &[(&str, String)]) {
        self.generation += 1;
        let old = std::fs::read_link(self.dir.path().join("..data")).ok();
        let target = format!(
            "..2026_12_01_15_00_0{}.{}",
            self.generation,
            1000 + self.generation
        );
        let written = self.dir.path().join(&target);
        std::fs::create_dir(&written).expect("dir");
        for (key, text) in keys {
            std::fs::write(written.join(key), text).expect("write");
        }
        let swap = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&target, &swap).expect("link");
        std::fs::rename(&swap, self.dir.path().join("..data")).expect("swap");
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.path().join(old)).expect("old dir");
        }
    }
}

/// The keys of `server`'s Secret: its CA, its token, and its client
/// certificate and key when it wants one.
fn keys(server: &ApiServer) -> Vec<(&'static str, String)> {
    let kubeconfig = server.kubeconfig();
    let mut keys = vec![
        ("ca.crt", kubeconfig.ca_pem.expect("tls")),
        ("token", kubeconfig.token.expect("a token")),
    ];
    if let Some((cert, key)) = kubeconfig.client_cert {
        keys.extend([("tls.crt", cert), ("tls.key", key)]);
    }
    keys
}

/// A kubeconfig that names the volume's files, as one mounted beside a
/// Secret does.
fn kubeconfig(server: &ApiServer, volume: &SecretVolume) -> String {
    let file = |key: &str| volume.path(key).display().to_string();
    let client = if server.kubeconfig().client_cert.is_some() {
        format!(
            ", client-certificate: {}, client-key: {}",
            file("tls.crt"),
            file("tls.key")
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: b, cluster: {{server: \"{}\", certificate-authority: {}}}}}]\n\
         users: [{{name: b, user: {{tokenFile: {}{client}}}}}]\n\
         contexts: [{{name: b, context: {{cluster: b, user: b}}}}]\n\
         current-context: b\n",
        server.url(),
        file("ca.crt"),
        file("token"),
    )
}

/// Runs tether over `a` (plain) and `b` (reached through the volume's
/// files), ready, with b's probes treating 401 as unreachable.
async fn running(b: &ApiServer, volume: &SecretVolume) -> (ApiServer, Tether) {
    let a = remote("a", false).await;
    let b_kubeconfig = kubeconfig(b, volume);
    let tether = Tether::start(
        &[("a", &a), ("b", b)],
        &[],
        &Shape {
            kubeconfigs: &[("b", &b_kubeconfig)],
            probe_extra: ", unreachableStatuses: [401]",
            ..Shape::default()
        },
    );
    tether.until_ready(true).await;
    (a, tether)
}

/// Rotates `what` on `b` and swaps the volume to the new files at once;
/// then `b` is reachable and ready within the detection bound, its client
/// rebuilt for `changed`, with no loss, no signal, and `a` left alone; the
/// manager's part of `b` rebuilt alone exactly when `rebuilds`, and the
/// cycle never ended.
async fn rotated(b: &ApiServer, what: Rotation, changed: &str, rebuilds: bool) {
    let mut volume = SecretVolume::new(&keys(b));
    let (a, tether) = running(b, &volume).await;
    let a_probes = "tether_remote_probe_duration_seconds_count{remote=\"a\",result=\"reachable\"}";
    let a_before = tether.metric(a_probes).await.expect("a probed");

    let rotated = Instant::now();
    b.rotate(what).expect("rotate");
    volume.update(&keys(b));
    let said = format!("{changed} changed; client rebuilt");
    common::until(
        format!("{what:?}: {said:?} for b"),
        detection_bound().saturating_sub(rotated.elapsed()),
        async || {
            tether
                .logs()
                .lines()
                .any(|l| l.contains(&said) && l.contains("remote=b"))
                .then_some(())
        },
    )
    .await;
    let ready = format!(
        "tether_remote_apiserver_ready{{host=\"{}\",remote=\"b\"}}",
        b.addr()
    );
    within(&tether, &ready, 1.0, rotated, detection_bound()).await;
    within(&tether, &reachable(b, "b"), 1.0, rotated, detection_bound()).await;
    tether.until_ready(true).await;

    let logs = tether.logs();
    assert_eq!(
        tether
            .metric("tether_cycles_total{cause=\"remote_lost\"}")
            .await,
        Some(0.0),
        "{what:?}: the rotation made a lost remote; logs:\n{logs}"
    );
    assert!(
        !logs.contains("removed"),
        "{what:?}: a remote that stays was called removed:\n{logs}"
    );
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("client rebuilt") && l.contains("remote=a")),
        "{what:?}: a's client was rebuilt:\n{logs}"
    );
    // a's probe went on through it all.
    tether
        .until_metric(a_probes, "more probes of a", |v| v > a_before)
        .await;
    assert!(
        tether.metric(&reachable(&a, "a")).await == Some(1.0),
        "{what:?}: a was touched"
    );
    let rebuilt = "tether_remote_changes_total{cause=\"config_changed\",change=\"rebuilt\"}";
    if rebuilds {
        tether.until_metric(rebuilt, "1", |v| v == 1.0).await;
    }
    assert_eq!(
        tether.metric(rebuilt).await,
        Some(if rebuilds { 1.0 } else { 0.0 }),
        "{what:?}"
    );
    assert_eq!(
        tether
            .metric("tether_cycles_total{cause=\"config_changed\"}")
            .await,
        Some(0.0),
        "{what:?}: a rotation ended the cycle"
    );
}

async fn tls_server(client_certs: bool) -> ApiServer {
    ApiServer::start(
        Options::default()
            .name("b")
            .tls(true)
            .token("b-token")
            .anonymous_health(false)
            .client_certs(client_certs),
    )
    .await
    .expect("server")
}

/// The manager's clients trusted the old CA: b's part is rebuilt alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ca_in_a_secret_volume_is_used_without_a_signal_and_rebuilds_that_remote_alone() {
    rotated(
        &tls_server(false).await,
        Rotation::Ca,
        "certificate-authority",
        true,
    )
    .await;
}

/// kube and client-go re-read a token file by themselves: nothing is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_in_a_secret_volume_is_used_without_a_signal_and_the_cycle_runs_on() {
    rotated(
        &tls_server(false).await,
        Rotation::Token,
        "tokenFile",
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_client_certificate_in_a_secret_volume_is_used_without_a_signal() {
    let b = tls_server(true).await;
    rotated(
        &b,
        Rotation::ClientCertificate,
        "client-certificate and client-key",
        true,
    )
    .await;
}

/// A rotation written badly (a CA file with no certificate in it) is
/// logged once, and the remote keeps its last good settings; the good
/// files that follow are used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rotation_keeps_the_last_good_settings_and_a_good_one_follows() {
    let b = tls_server(false).await;
    let mut volume = SecretVolume::new(&keys(&b));
    let (_a, tether) = running(&b, &volume).await;
    let mut bad = keys(&b);
    bad[0].1 = "not a certificate\n".to_owned();
    let since = Instant::now();
    volume.update(&bad);
    let refused = "certificate-authority changed, but cannot be used";
    common::until(refused, detection_bound(), async || {
        tether.logs().contains(refused).then_some(())
    })
    .await;
    // Still probed with the old, good CA.
    let probes = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"reachable\"}";
    let before = tether.metric(probes).await.expect("b probed");
    tether
        .until_metric(probes, "more good probes of b", |v| v >= before + 3.0)
        .await;
    assert_eq!(
        tether.logs().matches(refused).count(),
        1,
        "{}",
        tether.logs()
    );

    volume.update(&keys(&b));
    let rebuilt = "certificate-authority changed; client rebuilt";
    common::until(
        rebuilt,
        (detection_bound() * 3).saturating_sub(since.elapsed()),
        async || tether.logs().contains(rebuilt).then_some(()),
    )
    .await;
}

/// A rotation that breaks no probe (the same CA, written anew) is seen
/// through the folder's inotify watch: the sweep over every remote runs at
/// start and then once a minute, and no probe failed to ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_no_probe_notices_is_seen_by_the_folder_watch_before_the_safety_sweep() {
    let b = tls_server(false).await;
    let mut volume = SecretVolume::new(&keys(&b));
    let (_a, tether) = running(&b, &volume).await;
    let probes = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"reachable\"}";
    let before = tether.metric(probes).await.expect("b probed");

    let mut same = keys(&b);
    same[0].1.push_str("\n# the same CA, written anew\n");
    let since = Instant::now();
    volume.update(&same);
    let rebuilt = "certificate-authority changed; client rebuilt";
    common::until(rebuilt, detection_bound(), async || {
        tether.logs().contains(rebuilt).then_some(())
    })
    .await;
    let noticed = since.elapsed();
    let logs = tether.logs();
    let line = logs
        .lines()
        .find(|l| l.contains(rebuilt))
        .expect("the line waited for");
    assert!(
        line.contains("remote=b") && line.contains("noticed=\"folder\""),
        "noticed otherwise than by the folder watch, after {noticed:?}: {line}"
    );
    tether
        .until_metric(probes, "more good probes of b", |v| v > before)
        .await;
    let failed = "tether_remote_probe_duration_seconds_count{remote=\"b\",result=\"unreachable\"}";
    assert_eq!(
        tether.metric(failed).await.unwrap_or(0.0),
        0.0,
        "a probe of b failed:\n{logs}"
    );
}
