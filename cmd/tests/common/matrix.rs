//! The fault matrix's config and bounds, shared by its rows on simulated
//! remotes (`fault_matrix.rs`) and on real ones (`real_remotes.rs`): probe
//! interval 1s, failureThreshold 3, timeout 500ms, no jitter.

use std::time::Duration;

use tether_testkit::Cluster;
use tokio::time::Instant;

use super::Tether;

pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
pub(crate) const TIMEOUT: Duration = Duration::from_millis(500);
pub(crate) const THRESHOLD: u32 = 3;

/// The longest a loss may take to show: the fault can strike just after a
/// probe, then `THRESHOLD` probes each up to their deadline; doubled for a
/// loaded CI machine and the metrics poll.
pub(crate) fn detection_bound() -> Duration {
    (INTERVAL * THRESHOLD + TIMEOUT) * 2
}

/// The reachability gauge of `server`, configured as `name`.
pub(crate) fn reachable(server: &impl Cluster, name: &str) -> String {
    format!(
        "tether_remote_apiserver_reachable{{host=\"{}\",remote=\"{name}\"}}",
        server.addr()
    )
}

/// Waits until `series` reads `want`, within `bound` of `since`; how long
/// that took from `since`.
pub(crate) async fn within(
    tether: &Tether,
    series: &str,
    want: f64,
    since: Instant,
    bound: Duration,
) -> Duration {
    super::until(
        format!("{series} {want}"),
        bound.saturating_sub(since.elapsed()),
        async || (tether.metric(series).await == Some(want)).then(|| since.elapsed()),
    )
    .await
}

/// The operator hands tether `server`'s new kubeconfig for `name`, and
/// sends no signal: tether sees the file change, and the remote is
/// reachable again within the bound.
pub(crate) async fn rotate_kubeconfig(tether: &Tether, name: &str, server: &impl Cluster) {
    tether.write_kubeconfig(name, server);
    let reloaded = Instant::now();
    within(
        tether,
        &reachable(server, name),
        1.0,
        reloaded,
        detection_bound(),
    )
    .await;
}
