//! Every default of the config file, in one place: what a field is when
//! the file leaves it out. The probes' and the supervisor's are their
//! crates' `Default`s.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tether_supervisor::SupervisorConfig;

use super::{LeaderElectionSpec, WatchSpec};

/// `admin.address`: every interface, port 9090.
pub const ADMIN_ADDRESS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 9090);

/// How long `/readyz` answers 503 after a SIGTERM before the admin server
/// closes: one period of the chart's readiness probe (5s), so the kubelet or
/// a load balancer polling as often sees the drain.
pub const DRAIN_WINDOW: Duration = Duration::from_secs(5);

/// `remotes[].required`: a remote's loss ends the cycle unless it says
/// otherwise.
pub const REQUIRED: bool = true;

/// `discovery[].secrets.required`: a discovered remote's loss costs that
/// remote alone unless its source says otherwise. A fleet always has a few
/// clusters down; a configured remote is one someone chose to depend on,
/// a discovered one is one of many (docs/discovery.md).
pub const DISCOVERED_REQUIRED: bool = false;

/// `leaderElection.leaseName`.
pub const LEASE_NAME: &str = "tether";

/// `leaderElection.leaseDuration`: client-go's.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// `leaderElection.renewDeadline`: client-go's.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// `leaderElection.retryPeriod`: client-go's.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// `sharding.leasePrefix`.
pub const SHARD_LEASE_PREFIX: &str = "tether-shard";

/// `manager.exec.readiness.httpGet.path`.
pub const READINESS_PATH: &str = "/";

/// `manager.exec.readiness.period` and `.timeout`.
pub const READINESS_PERIOD: Duration = Duration::from_secs(1);

/// How long an optional remote that a process not following its remotes
/// file was restarted without must stay reachable before it is restarted
/// with it again: a remote that flaps costs at most two restarts per this
/// long, 24 an hour.
pub const PUT_BACK_AFTER: Duration = Duration::from_secs(300);

/// `manager.exec.serviceAccount.expiration`: as long as a projected
/// ServiceAccount token's, which the kubelet also replaces at 80%.
pub const TOKEN_EXPIRATION: Duration = Duration::from_secs(3600);

/// The shortest token the TokenRequest API gives.
pub const TOKEN_EXPIRATION_MIN: Duration = Duration::from_secs(600);

/// `manager.exec.readiness.failureThreshold`.
pub const READINESS_FAILURE_THRESHOLD: u32 = 3;

/// The default time a process has to stop before SIGKILL: two thirds of the
/// supervisor's default 30s shutdown grace, so a clean stop fits in it (a
/// shorter shutdown grace shortens it too).
pub const GRACE_PERIOD: Duration = Duration::from_secs(20);

/// 20s, or less so that a stop fits: in two thirds of the shutdown grace,
/// and, with leader election, in the fence's margin (leaseDuration -
/// renewDeadline).
#[must_use]
pub fn grace_period(
    supervisor: &SupervisorConfig,
    election: Option<&LeaderElectionSpec>,
) -> Duration {
    let fits = GRACE_PERIOD.min(supervisor.shutdown_grace * 2 / 3);
    election.map_or(fits, |e| fits.min(e.fence_margin()))
}

/// The default watch list: namespaces, enough to prove a remote's watch
/// path works.
#[must_use]
pub fn watch() -> Vec<WatchSpec> {
    vec![WatchSpec {
        api_version: "v1".to_owned(),
        kind: "Namespace".to_owned(),
        plural: "namespaces".to_owned(),
        namespaced: false,
        namespace: None,
        label_selector: None,
    }]
}
