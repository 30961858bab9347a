//! The configuration file: YAML, camelCase keys, durations as strings.
//!
//! Parsing rejects unknown keys and wrong types; validation then checks every
//! value and names the file and the field path of the first bad one
//! (`remotes[1].server: invalid URL ...`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tether_probes::ProbeConfig;
use tether_supervisor::{BackoffConfig, SupervisorConfig};

/// A configuration error: the file, the field path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, or `<defaults>` when there is none.
    pub file: String,
    /// The field path, such as `remotes[1].server`.
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// The other mistakes found in the same file, each shown on a line of
    /// its own: an operator fixes them all at once.
    pub more: Vec<ConfigError>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file, self.field, self.message)?;
        for other in &self.more {
            write!(f, "\n{other}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// What is wrong with `field` of `file`.
    #[must_use]
    pub fn new(file: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            field: field.into(),
            message: message.into(),
            more: Vec::new(),
        }
    }

    /// Every mistake of `errors`, the first in front; `None` if there is
    /// none.
    #[must_use]
    pub fn all(errors: Vec<Self>) -> Option<Self> {
        let mut flat = errors.into_iter().flat_map(|mut e| {
            let more = std::mem::take(&mut e.more);
            std::iter::once(e).chain(more)
        });
        let mut first = flat.next()?;
        first.more = flat.collect();
        Some(first)
    }
}

/// The value of `result`, or `None` with its error kept in `errors`: the
/// sections of a file are checked one after another, and every mistake is
/// reported together.
fn kept<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// The resource types the built-in manager can cache: `(apiVersion, kind)`
/// to `(plural, namespaced)`.
const KNOWN_KINDS: [(&str, &str, &str, bool); 8] = [
    ("v1", "Namespace", "namespaces", false),
    ("v1", "ConfigMap", "configmaps", true),
    ("v1", "Secret", "secrets", true),
    ("v1", "Service", "services", true),
    ("v1", "Pod", "pods", true),
    ("v1", "Node", "nodes", false),
    ("apps/v1", "Deployment", "deployments", true),
    ("coordination.k8s.io/v1", "Lease", "leases", true),
];

/// Where a remote's connection settings come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteSource {
    /// A kubeconfig file, and a context in it (default: its current one).
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The context.
        context: Option<String>,
    },
    /// Direct fields.
    Direct {
        /// The server URL.
        server: String,
        /// The CA bundle to trust.
        ca_file: Option<PathBuf>,
        /// A file holding the bearer token.
        token_file: Option<PathBuf>,
        /// Skip server certificate verification (logged as a warning).
        insecure_skip_tls_verify: bool,
    },
    /// In a pod, the in-cluster config; elsewhere the current kubeconfig
    /// context. Only when tether runs without a config file.
    Inferred,
}

/// One configured remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    /// The unique name: the `remote` label.
    pub name: String,
    /// Whether its caches gate `/readyz`.
    pub required: bool,
    /// How to reach it.
    pub source: RemoteSource,
}

/// One resource type the built-in manager caches on every remote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// `v1`, `apps/v1`, ...
    pub api_version: String,
    /// `ConfigMap`, ...
    pub kind: String,
    /// The plural, as in API paths.
    pub plural: String,
    /// Whether the kind is namespaced.
    pub namespaced: bool,
    /// Only this namespace, if set.
    pub namespace: Option<String>,
    /// Only objects matching this label selector, if set.
    pub label_selector: Option<String>,
}

impl WatchSpec {
    /// The `resource` label: `configmaps`, `deployments.apps`, ...
    #[must_use]
    pub fn resource_label(&self) -> String {
        match self.api_version.split_once('/') {
            Some((group, _)) => format!("{}.{group}", self.plural),
            None => self.plural.clone(),
        }
    }
}

/// How the exec manager knows its process is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessSpec {
    /// `GET http://127.0.0.1:<port><path>`; any 2xx is ready.
    pub port: u16,
    /// The path, from `/`.
    pub path: String,
    /// How often it is checked.
    pub period: Duration,
    /// Each check's deadline.
    pub timeout: Duration,
    /// Failures in a row, once up, before the process counts as down.
    pub failure_threshold: u32,
}

/// The signals a process may be asked to stop with.
pub const STOP_SIGNALS: [(&str, rustix::process::Signal); 6] = [
    ("SIGTERM", rustix::process::Signal::TERM),
    ("SIGINT", rustix::process::Signal::INT),
    ("SIGQUIT", rustix::process::Signal::QUIT),
    ("SIGHUP", rustix::process::Signal::HUP),
    ("SIGUSR1", rustix::process::Signal::USR1),
    ("SIGUSR2", rustix::process::Signal::USR2),
];

/// The exec manager: a process run as each cycle's manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// The argv; the first is the program, looked up on `PATH`.
    pub command: Vec<String>,
    /// Added to tether's own environment.
    pub env: Vec<(String, String)>,
    /// The working directory; default tether's.
    pub working_dir: Option<PathBuf>,
    /// When the process counts as up; `None`: once started.
    pub readiness: Option<ReadinessSpec>,
    /// The signal a cycle's end sends the process group first, by name.
    pub stop_signal: &'static str,
    /// How long after the stop signal the group gets SIGKILL.
    pub grace_period: Duration,
}

impl ExecSpec {
    /// The spec of a bare command: the defaults for everything else.
    #[must_use]
    pub fn of_command(
        command: Vec<String>,
        supervisor: &SupervisorConfig,
        election: Option<&LeaderElectionSpec>,
    ) -> Self {
        Self {
            command,
            env: Vec::new(),
            working_dir: None,
            readiness: None,
            stop_signal: "SIGTERM",
            grace_period: default_grace_period(supervisor, election),
        }
    }

    /// The stop signal.
    #[must_use]
    pub fn signal(&self) -> rustix::process::Signal {
        STOP_SIGNALS
            .iter()
            .find(|(name, _)| *name == self.stop_signal)
            .map_or(rustix::process::Signal::TERM, |(_, signal)| *signal)
    }
}

/// A whole, positive number of seconds: how a Lease stores its duration
/// (`leaseDurationSeconds`, an integer). The config keeps it so from the
/// file to the wire, so a replica's fence is computed from exactly the
/// value the others read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WholeSeconds(std::num::NonZeroU32);

impl WholeSeconds {
    /// `duration`, if it is a whole number of seconds, at least one, that a
    /// Lease can store.
    #[must_use]
    pub fn new(duration: Duration) -> Option<Self> {
        if duration.subsec_nanos() != 0 {
            return None;
        }
        let secs = u32::try_from(duration.as_secs()).ok()?;
        i32::try_from(secs).ok()?;
        std::num::NonZeroU32::new(secs).map(Self)
    }

    /// As a duration.
    #[must_use]
    pub fn duration(self) -> Duration {
        Duration::from_secs(u64::from(self.0.get()))
    }

    /// As a Lease's `leaseDurationSeconds`.
    ///
    /// # Panics
    ///
    /// Never: [`new`](Self::new) keeps the value within `i32`.
    #[must_use]
    pub fn wire(self) -> i32 {
        i32::try_from(self.0.get()).expect("new() keeps it within i32")
    }
}

impl fmt::Display for WholeSeconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.0)
    }
}

/// The default time a process has to stop before SIGKILL: two thirds of the
/// supervisor's default 30s shutdown grace, so a clean stop fits in it (a
/// shorter shutdown grace shortens it too).
const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(20);

/// 20s, or less so that a stop fits: in two thirds of the shutdown grace,
/// and, with leader election, in the fence's margin (leaseDuration -
/// renewDeadline).
fn default_grace_period(
    supervisor: &SupervisorConfig,
    election: Option<&LeaderElectionSpec>,
) -> Duration {
    let fits = DEFAULT_GRACE_PERIOD.min(supervisor.shutdown_grace * 2 / 3);
    election.map_or(fits, |e| fits.min(e.fence_margin()))
}

/// Leader election on a Lease, as client-go's `leaderelection` runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionSpec {
    /// The Lease's name.
    pub lease_name: String,
    /// Its namespace; `None`: the pod's.
    pub lease_namespace: Option<String>,
    /// This replica's holder identity; `None`: `$POD_NAME`, else the
    /// hostname, with a random suffix made at start.
    pub identity: Option<String>,
    /// How long a holder's claim lasts after its last renewal, as the Lease
    /// stores it.
    pub lease_duration: WholeSeconds,
    /// How long a leader keeps trying to renew before it gives up: its fence.
    pub renew_deadline: Duration,
    /// How often to try.
    pub retry_period: Duration,
    /// The kubeconfig of the cluster that holds the Lease; `None`:
    /// in-cluster, else the current context.
    pub kubeconfig: Option<PathBuf>,
}

/// Sharing the remotes among replicas, each on a Lease of its own, with
/// leader election's cluster settings and timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardingSpec {
    /// Each replica's Lease is `<prefix>-<identity>`; the prefix also
    /// labels them, so the members are the Leases that carry it.
    pub lease_prefix: String,
}

impl LeaderElectionSpec {
    /// How long a leader that gave up at `renewDeadline` has to stop its
    /// manager before another replica can take the Lease.
    #[must_use]
    pub fn fence_margin(&self) -> Duration {
        self.lease_duration
            .duration()
            .saturating_sub(self.renew_deadline)
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from, if any.
    pub file: Option<PathBuf>,
    /// The admin server's address.
    pub admin_address: SocketAddr,
    /// How long, after a SIGTERM, the admin server keeps answering
    /// `/readyz` with 503 before it closes.
    pub drain_window: Duration,
    /// How remotes are probed.
    pub probe: ProbeConfig,
    /// The cycle loop, `rebuildOnRecovery` included.
    pub supervisor: SupervisorConfig,
    /// The remotes, in file order.
    pub remotes: Vec<RemoteSpec>,
    /// What the built-in manager caches.
    pub watch: Vec<WatchSpec>,
    /// The exec manager, when the manager is a process.
    pub exec: Option<ExecSpec>,
    /// The command given after `--`, kept so that a reload applies it again.
    pub command_line: Vec<String>,
    /// Leader election, when on.
    pub leader_election: Option<LeaderElectionSpec>,
    /// Sharing the remotes among replicas, when on: then every replica
    /// runs a manager for its own remotes, and no leader is elected.
    pub sharding: Option<ShardingSpec>,
}

/// The sections of a config that change only at a restart.
struct Restartable {
    admin_address: SocketAddr,
    probe: ProbeConfig,
    supervisor: SupervisorConfig,
    leader_election: Option<LeaderElectionSpec>,
    sharding: Option<ShardingSpec>,
}

impl Restartable {
    /// These sections as they will run: the file's at start, the running
    /// config's at a reload (`running`), with the names of those the file
    /// changed.
    fn into_running(self, running: Option<&Config>) -> (Self, Vec<&'static str>) {
        let Some(running) = running else {
            return (self, Vec::new());
        };
        let restart = [
            (self.admin_address != running.admin_address, "admin.address"),
            (self.probe != running.probe, "probe"),
            (self.supervisor != running.supervisor, "supervisor"),
            (
                self.leader_election != running.leader_election,
                "leaderElection",
            ),
            (self.sharding != running.sharding, "sharding"),
        ]
        .into_iter()
        .filter_map(|(changed, section)| changed.then_some(section))
        .collect();
        let kept = Self {
            admin_address: running.admin_address,
            probe: running.probe.clone(),
            supervisor: running.supervisor,
            leader_election: running.leader_election.clone(),
            sharding: running.sharding.clone(),
        };
        (kept, restart)
    }
}

// The file's shape. Everything optional is defaulted in `validate`, so that
// every error can name its field.

/// The sections of a file but the manager, checked; `watch` as the file
/// gives it, if it does.
struct Sections {
    drain_window: Duration,
    admin_address: SocketAddr,
    probe: ProbeConfig,
    supervisor: SupervisorConfig,
    remotes: Vec<RemoteSpec>,
    leader_election: Option<LeaderElectionSpec>,
    sharding: Option<ShardingSpec>,
    watch: Option<Vec<WatchSpec>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    admin: Option<RawAdmin>,
    probe: Option<RawProbe>,
    supervisor: Option<RawSupervisor>,
    remotes: Option<Vec<RawRemote>>,
    watch: Option<Vec<RawWatch>>,
    manager: Option<RawManager>,
    leader_election: Option<RawLeaderElection>,
    sharding: Option<RawSharding>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSharding {
    enabled: Option<bool>,
    lease_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLeaderElection {
    enabled: Option<bool>,
    lease_name: Option<String>,
    lease_namespace: Option<String>,
    identity: Option<String>,
    lease_duration: Option<String>,
    renew_deadline: Option<String>,
    retry_period: Option<String>,
    kubeconfig: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawManager {
    exec: Option<RawExec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawExec {
    command: Option<Vec<String>>,
    env: Option<Vec<RawEnv>>,
    working_dir: Option<String>,
    readiness: Option<RawReadiness>,
    stop_signal: Option<String>,
    grace_period: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawEnv {
    name: Option<String>,
    value: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawReadiness {
    http_get: Option<RawHttpGet>,
    period: Option<String>,
    timeout: Option<String>,
    failure_threshold: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawHttpGet {
    port: Option<u16>,
    path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAdmin {
    address: Option<String>,
    drain_window: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProbe {
    path: Option<String>,
    interval: Option<String>,
    timeout: Option<String>,
    failure_threshold: Option<u32>,
    success_threshold: Option<u32>,
    jitter: Option<f64>,
    unreachable_statuses: Option<Vec<u16>>,
    max_connection_age: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawBackoff {
    initial: Option<String>,
    max: Option<String>,
    factor: Option<f64>,
    jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSupervisor {
    backoff: Option<RawBackoff>,
    stable_after: Option<String>,
    shutdown_grace: Option<String>,
    rebuild_on_recovery: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawRemote {
    name: Option<String>,
    kubeconfig: Option<String>,
    context: Option<String>,
    required: Option<bool>,
    server: Option<String>,
    ca_file: Option<String>,
    token_file: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWatch {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    label_selector: Option<String>,
}

/// How long `/readyz` answers 503 after a SIGTERM before the admin server
/// closes: one period of the chart's readiness probe (5s), so the kubelet or
/// a load balancer polling as often sees the drain.
const DEFAULT_DRAIN_WINDOW: Duration = Duration::from_secs(5);

/// The longest duration the configuration takes. No setting sensibly needs
/// more, and far larger values would overflow the timers' arithmetic.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Parses a duration: `500ms`, `10s`, `2m`, `1h30m`, `1.5s`. The grammar is
/// jiff's "friendly" format, the same the test kit's faults take. At most
/// 24h.
///
/// # Errors
///
/// A message saying what a duration looks like, or that it is too long.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = jiff::fmt::friendly::SpanParser::new()
        .parse_unsigned_duration(text.trim())
        .map_err(|err| {
            format!(
                "invalid duration {text:?}: write a number and a unit, like 500ms, 10s, 2m or 1h30m ({err})"
            )
        })?;
    if duration > MAX_DURATION {
        return Err(format!(
            "{text:?} is longer than 24h, the most tether takes"
        ));
    }
    Ok(duration)
}

/// Whether `path` is a file tether can read, or why not, naming it: a
/// directory, a symlink loop and a missing file each say so.
///
/// # Errors
///
/// The reason, with the path.
pub fn readable_file(path: &Path) -> Result<(), String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("file {shown} does not exist"))
        }
        Err(err) => Err(format!("cannot read {shown}: {err}")),
        Ok(meta) if meta.is_dir() => Err(format!("{shown} is a directory, not a file")),
        Ok(_) => std::fs::File::open(path)
            .map(drop)
            .map_err(|err| format!("cannot read {shown}: {err}")),
    }
}

/// A remote name is a Prometheus label value and a log field: keep it to
/// DNS-label characters.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' || c == '_'
        })
}

/// A Lease name: a DNS subdomain, at most 253 lower-case letters, digits,
/// '-' and '.', starting and ending with a letter or digit.
fn valid_lease_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
}

/// The longest identity a shard Lease's name leaves room for: the name is
/// `<prefix>-<identity>`, at most 253 characters.
fn identity_room(prefix: &str) -> usize {
    253 - prefix.len() - 1
}

struct Checker<'a> {
    file: &'a str,
    base: &'a Path,
}

impl Checker<'_> {
    fn error(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, field, message)
    }

    fn duration(
        &self,
        field: &str,
        value: Option<&String>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        value.map_or(Ok(default), |v| {
            parse_duration(v).map_err(|e| self.error(field, e))
        })
    }

    /// A path relative to the config file's folder, which must be a file
    /// tether can read.
    fn existing_file(&self, field: &str, value: &str) -> Result<PathBuf, ConfigError> {
        let path = self.base.join(value);
        readable_file(&path)
            .map(|()| path)
            .map_err(|message| self.error(field, message))
    }

    /// Every section of `raw` but the manager (handed back unchecked),
    /// each checked even after another failed: every mistake in the file is
    /// reported at once.
    fn sections(&self, raw: RawConfig) -> Result<(Sections, Option<RawManager>), ConfigError> {
        let RawConfig {
            admin,
            probe,
            supervisor,
            remotes,
            watch,
            manager,
            leader_election,
            sharding,
        } = raw;
        let mut errors = Vec::new();
        let admin = admin.unwrap_or_default();
        let drain_window = kept(
            &mut errors,
            self.duration(
                "admin.drainWindow",
                admin.drain_window.as_ref(),
                DEFAULT_DRAIN_WINDOW,
            ),
        );
        let admin_address = admin.address.unwrap_or_else(|| "0.0.0.0:9090".to_owned());
        let admin_address = kept(
            &mut errors,
            admin_address.parse().map_err(|e| {
                self.error(
                    "admin.address",
                    format!("{admin_address:?} is not an address like 0.0.0.0:9090: {e}"),
                )
            }),
        );
        let probe = kept(&mut errors, self.probe(probe.unwrap_or_default()));
        let supervisor = kept(&mut errors, self.supervisor(supervisor.unwrap_or_default()));
        let remotes = kept(&mut errors, self.remotes(remotes.unwrap_or_default()));
        let leader_election = kept(
            &mut errors,
            self.leader_election(leader_election.unwrap_or_default()),
        );
        let sharding = leader_election.as_ref().and_then(|election| {
            kept(
                &mut errors,
                self.sharding(sharding.unwrap_or_default(), election.as_ref()),
            )
        });
        let watch = watch.and_then(|watch| kept(&mut errors, self.watch(watch)));
        if let Some(errors) = ConfigError::all(errors) {
            return Err(errors);
        }
        let (
            Some(drain_window),
            Some(admin_address),
            Some(probe),
            Some(supervisor),
            Some(remotes),
            Some(leader_election),
            Some(sharding),
        ) = (
            drain_window,
            admin_address,
            probe,
            supervisor,
            remotes,
            leader_election,
            sharding,
        )
        else {
            unreachable!("a section without an error has its value");
        };
        Ok((
            Sections {
                drain_window,
                admin_address,
                probe,
                supervisor,
                remotes,
                leader_election,
                sharding,
                watch,
            },
            manager,
        ))
    }

    fn probe(&self, raw: RawProbe) -> Result<ProbeConfig, ConfigError> {
        let defaults = ProbeConfig::default();
        let config = ProbeConfig {
            path: raw.path.unwrap_or(defaults.path),
            interval: self.duration("probe.interval", raw.interval.as_ref(), defaults.interval)?,
            timeout: self.duration("probe.timeout", raw.timeout.as_ref(), defaults.timeout)?,
            failure_threshold: raw.failure_threshold.unwrap_or(defaults.failure_threshold),
            success_threshold: raw.success_threshold.unwrap_or(defaults.success_threshold),
            jitter: raw.jitter.unwrap_or(defaults.jitter),
            unreachable_statuses: raw.unreachable_statuses.unwrap_or_default(),
            max_connection_age: self.duration(
                "probe.maxConnectionAge",
                raw.max_connection_age.as_ref(),
                defaults.max_connection_age,
            )?,
        };
        config.validate().map_err(|err| match err {
            tether_probes::Error::InvalidConfig { field, reason } => self.error(field, reason),
            other => self.error("probe", other.to_string()),
        })?;
        Ok(config)
    }

    fn supervisor(&self, raw: RawSupervisor) -> Result<SupervisorConfig, ConfigError> {
        let defaults = SupervisorConfig::default();
        let backoff = raw.backoff.unwrap_or_default();
        let config = SupervisorConfig::default()
            .with_backoff(BackoffConfig {
                initial: self.duration(
                    "supervisor.backoff.initial",
                    backoff.initial.as_ref(),
                    defaults.backoff.initial,
                )?,
                max: self.duration(
                    "supervisor.backoff.max",
                    backoff.max.as_ref(),
                    defaults.backoff.max,
                )?,
                factor: backoff.factor.unwrap_or(defaults.backoff.factor),
                jitter: backoff.jitter.unwrap_or(defaults.backoff.jitter),
            })
            .with_stable_after(self.duration(
                "supervisor.stableAfter",
                raw.stable_after.as_ref(),
                defaults.stable_after,
            )?)
            .with_shutdown_grace(self.duration(
                "supervisor.shutdownGrace",
                raw.shutdown_grace.as_ref(),
                defaults.shutdown_grace,
            )?)
            .with_rebuild_on_recovery(
                raw.rebuild_on_recovery
                    .unwrap_or(defaults.rebuild_on_recovery),
            );
        config.validate().map_err(|err| match err {
            tether_supervisor::Error::InvalidConfig { field, reason } => {
                self.error(format!("supervisor.{field}"), reason)
            }
            // Validation only ever reports an invalid setting.
            other @ tether_supervisor::Error::RegisterMetrics(_) => {
                self.error("supervisor", other.to_string())
            }
        })?;
        Ok(config)
    }

    fn remotes(&self, raw: Vec<RawRemote>) -> Result<Vec<RemoteSpec>, ConfigError> {
        if raw.is_empty() {
            return Err(self.error("remotes", "at least one remote is needed"));
        }
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut remotes = Vec::with_capacity(raw.len());
        let mut errors = Vec::new();
        for (i, remote) in raw.into_iter().enumerate() {
            remotes.extend(kept(&mut errors, self.remote(i, remote, &mut seen)));
        }
        match ConfigError::all(errors) {
            Some(errors) => Err(errors),
            None => Ok(remotes),
        }
    }

    /// Remote `i`, whose name must not be in `seen` yet.
    fn remote(
        &self,
        i: usize,
        remote: RawRemote,
        seen: &mut BTreeMap<String, usize>,
    ) -> Result<RemoteSpec, ConfigError> {
        let at = |field: &str| format!("remotes[{i}].{field}");
        let name = remote
            .name
            .ok_or_else(|| self.error(at("name"), "is required"))?;
        if !valid_name(&name) {
            return Err(self.error(
                at("name"),
                format!("{name:?} must be 1-63 lower-case letters, digits, '-', '.' or '_'"),
            ));
        }
        if let Some(first) = seen.insert(name.clone(), i) {
            return Err(self.error(
                at("name"),
                format!("{name:?} is already the name of remotes[{first}]"),
            ));
        }
        let source = match (remote.kubeconfig, remote.server) {
            (Some(_), Some(_)) => {
                return Err(self.error(
                    format!("remotes[{i}]"),
                    "set either kubeconfig or server, not both",
                ));
            }
            (None, None) => {
                return Err(self.error(format!("remotes[{i}]"), "needs a kubeconfig or a server"));
            }
            (Some(path), None) => {
                for (field, set) in [
                    ("caFile", remote.ca_file.is_some()),
                    ("tokenFile", remote.token_file.is_some()),
                    (
                        "insecureSkipTlsVerify",
                        remote.insecure_skip_tls_verify.is_some(),
                    ),
                ] {
                    if set {
                        return Err(self.error(
                            at(field),
                            "only goes with server; the kubeconfig says how to connect",
                        ));
                    }
                }
                RemoteSource::Kubeconfig {
                    path: self.existing_file(&at("kubeconfig"), &path)?,
                    context: remote.context,
                }
            }
            (None, Some(server)) => {
                if remote.context.is_some() {
                    return Err(self.error(at("context"), "only goes with kubeconfig"));
                }
                let uri: http::Uri = server.parse().map_err(|e| {
                    self.error(at("server"), format!("invalid URL {server:?}: {e}"))
                })?;
                tether_probes::normalize_url(&uri).map_err(|e| {
                    self.error(at("server"), format!("invalid URL {server:?}: {e}"))
                })?;
                RemoteSource::Direct {
                    server,
                    ca_file: remote
                        .ca_file
                        .map(|f| self.existing_file(&at("caFile"), &f))
                        .transpose()?,
                    token_file: remote
                        .token_file
                        .map(|f| self.existing_file(&at("tokenFile"), &f))
                        .transpose()?,
                    insecure_skip_tls_verify: remote.insecure_skip_tls_verify.unwrap_or(false),
                }
            }
        };
        Ok(RemoteSpec {
            name,
            required: remote.required.unwrap_or(true),
            source,
        })
    }

    fn readiness(&self, r: RawReadiness) -> Result<ReadinessSpec, ConfigError> {
        let get = r.http_get.ok_or_else(|| {
            self.error(
                "manager.exec.readiness.httpGet",
                "is required: {port, path}",
            )
        })?;
        let port = get.port.filter(|p| *p != 0).ok_or_else(|| {
            self.error(
                "manager.exec.readiness.httpGet.port",
                "is required: 1-65535",
            )
        })?;
        let path = get.path.unwrap_or_else(|| "/".to_owned());
        if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(self.error(
                "manager.exec.readiness.httpGet.path",
                format!("{path:?} is not a path like /readyz"),
            ));
        }
        let second = Duration::from_secs(1);
        let period = self.duration("manager.exec.readiness.period", r.period.as_ref(), second)?;
        let timeout =
            self.duration("manager.exec.readiness.timeout", r.timeout.as_ref(), second)?;
        if period.is_zero() || timeout.is_zero() {
            return Err(self.error(
                "manager.exec.readiness",
                "period and timeout must be above 0",
            ));
        }
        let failure_threshold = r.failure_threshold.unwrap_or(3);
        if failure_threshold == 0 {
            return Err(self.error(
                "manager.exec.readiness.failureThreshold",
                "must be at least 1",
            ));
        }
        Ok(ReadinessSpec {
            port,
            path,
            period,
            timeout,
            failure_threshold,
        })
    }

    fn stop_signal(&self, raw: Option<String>) -> Result<&'static str, ConfigError> {
        let Some(name) = raw else {
            return Ok("SIGTERM");
        };
        let wanted = name.trim().to_ascii_uppercase();
        let wanted = if wanted.starts_with("SIG") {
            wanted
        } else {
            format!("SIG{wanted}")
        };
        STOP_SIGNALS
            .iter()
            .find(|(known, _)| *known == wanted)
            .map(|(known, _)| *known)
            .ok_or_else(|| {
                let known: Vec<&str> = STOP_SIGNALS.iter().map(|(n, _)| *n).collect();
                self.error(
                    "manager.exec.stopSignal",
                    format!("{name:?} is not one of {}", known.join(", ")),
                )
            })
    }

    fn leader_election(
        &self,
        raw: RawLeaderElection,
    ) -> Result<Option<LeaderElectionSpec>, ConfigError> {
        if !raw.enabled.unwrap_or(false) {
            return Ok(None);
        }
        let field = |name: &str| format!("leaderElection.{name}");
        let lease_name = raw.lease_name.unwrap_or_else(|| "tether".to_owned());
        if !valid_lease_name(&lease_name) {
            return Err(self.error(
                field("leaseName"),
                format!(
                    "{lease_name:?} is not a Lease name (at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
                ),
            ));
        }
        let optional = |value: Option<String>| value.filter(|v| !v.is_empty());
        let identity = optional(raw.identity);
        if let Some(identity) = &identity
            && (identity.len() > 253 || identity.chars().any(char::is_control))
        {
            return Err(self.error(
                field("identity"),
                "must be at most 253 characters, none of them a control character (a Lease's holderIdentity is a Kubernetes name)",
            ));
        }
        let lease_duration = self.duration(
            &field("leaseDuration"),
            raw.lease_duration.as_ref(),
            Duration::from_secs(15),
        )?;
        let lease_duration = WholeSeconds::new(lease_duration).ok_or_else(|| {
            self.error(
                field("leaseDuration"),
                format!(
                    "{} is not a whole number of seconds: a Lease stores leaseDurationSeconds as an integer, and every replica's fence is computed from exactly what is written; write 1s or more, in whole seconds",
                    raw.lease_duration.as_deref().map_or("", str::trim)
                ),
            )
        })?;
        let renew_deadline = self.duration(
            &field("renewDeadline"),
            raw.renew_deadline.as_ref(),
            Duration::from_secs(10),
        )?;
        let retry_period = self.duration(
            &field("retryPeriod"),
            raw.retry_period.as_ref(),
            Duration::from_secs(2),
        )?;
        if retry_period.is_zero() {
            return Err(self.error(field("retryPeriod"), "must be above 0"));
        }
        if renew_deadline <= retry_period {
            return Err(self.error(
                field("renewDeadline"),
                format!(
                    "{} must be longer than retryPeriod ({})",
                    crate::human::exact(renew_deadline),
                    crate::human::exact(retry_period)
                ),
            ));
        }
        if lease_duration.duration() <= renew_deadline {
            return Err(self.error(
                field("leaseDuration"),
                format!(
                    "{lease_duration} must be longer than renewDeadline ({}), so a leader that lost its Lease has stopped before another takes it",
                    crate::human::exact(renew_deadline)
                ),
            ));
        }
        Ok(Some(LeaderElectionSpec {
            lease_name,
            lease_namespace: optional(raw.lease_namespace),
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            kubeconfig: optional(raw.kubeconfig)
                .map(|path| self.existing_file(&field("kubeconfig"), &path))
                .transpose()?,
        }))
    }

    fn sharding(
        &self,
        raw: RawSharding,
        election: Option<&LeaderElectionSpec>,
    ) -> Result<Option<ShardingSpec>, ConfigError> {
        if !raw.enabled.unwrap_or(false) {
            return Ok(None);
        }
        if election.is_none() {
            return Err(self.error(
                "sharding.enabled",
                "needs leaderElection (enabled: true) for the Leases' cluster, namespace, identity and timings",
            ));
        }
        let lease_prefix = raw
            .lease_prefix
            .unwrap_or_else(|| "tether-shard".to_owned());
        // The Lease is `<prefix>-<identity>`, and the prefix is a label value.
        if !valid_lease_name(&lease_prefix) || lease_prefix.len() > 40 {
            return Err(self.error(
                "sharding.leasePrefix",
                format!(
                    "{lease_prefix:?} is not a Lease name prefix (at most 40 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
                ),
            ));
        }
        if let Some(identity) = election.and_then(|e| e.identity.as_deref())
            && !(valid_lease_name(identity) && identity.len() <= identity_room(&lease_prefix))
        {
            return Err(self.error(
                "leaderElection.identity",
                format!(
                    "{identity:?} cannot name a shard Lease ({lease_prefix}-<identity>): with sharding it must be at most {} lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
                    identity_room(&lease_prefix)
                ),
            ));
        }
        Ok(Some(ShardingSpec { lease_prefix }))
    }

    fn exec(
        &self,
        raw: RawExec,
        supervisor: &SupervisorConfig,
        election: Option<&LeaderElectionSpec>,
    ) -> Result<ExecSpec, ConfigError> {
        // Empty: it must come after `--` on the command line
        // (`with_command`).
        let command = raw.command.unwrap_or_default();
        if command.first().is_some_and(String::is_empty) {
            return Err(self.error("manager.exec.command[0]", "the program is empty"));
        }
        if let Some(i) = command.iter().position(|arg| arg.contains('\0')) {
            return Err(self.error(format!("manager.exec.command[{i}]"), "contains a NUL byte"));
        }
        let mut env = Vec::new();
        for (i, var) in raw.env.unwrap_or_default().into_iter().enumerate() {
            let name = var
                .name
                .ok_or_else(|| self.error(format!("manager.exec.env[{i}].name"), "is required"))?;
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(self.error(
                    format!("manager.exec.env[{i}].name"),
                    format!("{name:?} is not a variable name"),
                ));
            }
            let value = var.value.unwrap_or_default();
            if value.contains('\0') {
                return Err(self.error(
                    format!("manager.exec.env[{i}].value"),
                    "contains a NUL byte",
                ));
            }
            env.push((name, value));
        }
        let working_dir = raw
            .working_dir
            .map(|dir| {
                let path = self.base.join(&dir);
                if path.is_dir() {
                    Ok(path)
                } else {
                    Err(self.error(
                        "manager.exec.workingDir",
                        format!("{} is not a directory", path.display()),
                    ))
                }
            })
            .transpose()?;
        let readiness = raw.readiness.map(|r| self.readiness(r)).transpose()?;
        let stop_signal = self.stop_signal(raw.stop_signal)?;
        // Unset, it fits in the shutdown grace, with a third of it to spare.
        let grace_period = self.duration(
            "manager.exec.gracePeriod",
            raw.grace_period.as_ref(),
            default_grace_period(supervisor, election),
        )?;
        if grace_period >= supervisor.shutdown_grace {
            return Err(self.error(
                "manager.exec.gracePeriod",
                format!(
                    "{grace_period:?} must be shorter than supervisor.shutdownGrace ({:?}), so that a stop at shutdown fits in it",
                    supervisor.shutdown_grace
                ),
            ));
        }
        Ok(ExecSpec {
            command,
            env,
            working_dir,
            readiness,
            stop_signal,
            grace_period,
        })
    }

    fn watch(&self, raw: Vec<RawWatch>) -> Result<Vec<WatchSpec>, ConfigError> {
        let mut errors = Vec::new();
        let watch: Vec<WatchSpec> = raw
            .into_iter()
            .enumerate()
            .filter_map(|(i, watch)| kept(&mut errors, self.watch_item(i, watch)))
            .collect();
        match ConfigError::all(errors) {
            Some(errors) => Err(errors),
            None => Ok(watch),
        }
    }

    /// Item `i` of the watch list.
    fn watch_item(&self, i: usize, watch: RawWatch) -> Result<WatchSpec, ConfigError> {
        let api_version = watch
            .api_version
            .ok_or_else(|| self.error(format!("watch[{i}].apiVersion"), "is required"))?;
        let kind = watch
            .kind
            .ok_or_else(|| self.error(format!("watch[{i}].kind"), "is required"))?;
        let (_, _, plural, namespaced) = KNOWN_KINDS
            .iter()
            .find(|(v, k, _, _)| *v == api_version && *k == kind)
            .ok_or_else(|| {
                let known: Vec<String> = KNOWN_KINDS
                    .iter()
                    .map(|(v, k, _, _)| format!("{v}/{k}"))
                    .collect();
                let given = format!("{api_version}/{kind}");
                let closest = known
                    .iter()
                    .map(|k| {
                        (
                            strsim::jaro_winkler(&given.to_lowercase(), &k.to_lowercase()),
                            k,
                        )
                    })
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .filter(|(score, _)| *score > 0.9);
                let message = match closest {
                    Some((_, k)) => format!("unknown apiVersion/kind {given}; did you mean {k}?"),
                    None => format!(
                        "unknown apiVersion/kind {given}; known: {}",
                        known.join(", ")
                    ),
                };
                self.error(format!("watch[{i}]"), message)
            })?;
        if !namespaced && watch.namespace.is_some() {
            return Err(self.error(
                format!("watch[{i}].namespace"),
                format!("{kind} is not namespaced"),
            ));
        }
        if let Some(selector) = &watch.label_selector {
            tether_testkit::check_label_selector(selector).map_err(|reason| {
                self.error(
                    format!("watch[{i}].labelSelector"),
                    format!("{selector:?} is not a label selector: {reason}"),
                )
            })?;
        }
        Ok(WatchSpec {
            api_version,
            kind,
            plural: (*plural).to_owned(),
            namespaced: *namespaced,
            namespace: watch.namespace,
            label_selector: watch.label_selector,
        })
    }
}

/// A parse error at `path` (`probe.jitter`, `remotes[1].name`), as a
/// [`ConfigError`]: an unknown key gets the closest known one as a
/// suggestion, anything else serde-saphyr's message and where it is.
fn parse_error(file: &str, path: &str, err: &serde_saphyr::Error) -> ConfigError {
    let message = match err.without_snippet() {
        serde_saphyr::Error::SerdeUnknownField {
            field, expected, ..
        } => {
            let closest = expected
                .iter()
                .map(|known| (strsim::jaro_winkler(field, known), *known))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .filter(|(score, _)| *score > 0.8);
            match closest {
                Some((_, known)) => format!("unknown field; did you mean {known}?"),
                None => format!("unknown field; known fields: {}", expected.join(", ")),
            }
        }
        other => other
            .to_string()
            .lines()
            .next()
            .unwrap_or("invalid YAML")
            .to_owned(),
    };
    let field = if path.is_empty() || path == "." {
        "(document)"
    } else {
        path
    };
    ConfigError::new(file, field, message)
}

/// The default watch list: namespaces, enough to prove a remote's watch
/// path works.
fn default_watch() -> Vec<WatchSpec> {
    vec![WatchSpec {
        api_version: "v1".to_owned(),
        kind: "Namespace".to_owned(),
        plural: "namespaces".to_owned(),
        namespaced: false,
        namespace: None,
        label_selector: None,
    }]
}

impl Config {
    /// Reads and validates `path`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file and the field.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::read(path, None).map(|(config, _)| config)
    }

    /// Reads and validates `path` again, for a reload of `running`. The
    /// election's settings change only at a restart, so what the running
    /// election's fence depends on (the exec manager's grace period, and
    /// its default) is checked against the election as it runs, not as the
    /// file now says. The result keeps the running values of the sections
    /// that change only at a restart, and names those the file changed.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the file and the field.
    pub fn reload(path: &Path, running: &Self) -> Result<(Self, Vec<&'static str>), ConfigError> {
        Self::read(path, Some(running))
    }

    /// Reads `path` and parses it as [`parse_as`](Self::parse_as) does.
    fn read(path: &Path, running: Option<&Self>) -> Result<(Self, Vec<&'static str>), ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(&file, "(file)", format!("cannot read it: {e}")))?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        Self::parse_as(&text, &file, base, running).map(|(mut config, restart)| {
            config.file = Some(path.to_owned());
            (config, restart)
        })
    }

    /// Parses and validates `text`; relative paths resolve against `base`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `file` and the field.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        Self::parse_as(text, file, base, None).map(|(config, _)| config)
    }

    /// As [`parse`](Self::parse); at a reload, `running` is the config that
    /// runs (see [`reload`](Self::reload)), and the sections that wait for a
    /// restart come back too.
    fn parse_as(
        text: &str,
        file: &str,
        base: &Path,
        running: Option<&Self>,
    ) -> Result<(Self, Vec<&'static str>), ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            // serde_path_to_error follows the keys and indices down to the
            // error, which serde-saphyr's own message does not name.
            let mut path = String::new();
            serde_saphyr::with_deserializer_from_str(text, |deserializer| {
                serde_path_to_error::deserialize(deserializer).map_err(|err| {
                    path = err.path().to_string();
                    err.into_inner()
                })
            })
            .map_err(|err| parse_error(file, &path, &err))?
        };
        let check = Checker { file, base };
        let (
            Sections {
                drain_window,
                admin_address,
                probe,
                supervisor,
                remotes,
                leader_election,
                sharding,
                watch,
            },
            manager,
        ) = check.sections(raw)?;
        // At a reload, the sections that change only at a restart keep
        // their running values: the exec manager's grace period is checked,
        // and defaulted, against the shutdown grace and the election's fence
        // that will actually hold while it runs.
        let (
            Restartable {
                admin_address,
                probe,
                supervisor,
                leader_election,
                sharding,
            },
            restart,
        ) = Restartable {
            admin_address,
            probe,
            supervisor,
            leader_election,
            sharding,
        }
        .into_running(running);
        let which = if running.is_some() {
            " of the running election (its settings change only at a restart)"
        } else {
            ""
        };
        let fence = leader_election.as_ref();
        let exec = manager
            .and_then(|m| m.exec)
            .map(|exec| check.exec(exec, &supervisor, fence))
            .transpose()?;
        if let (Some(exec), Some(election)) = (&exec, fence) {
            // The fence: a leader that stops renewing gives up at
            // renewDeadline, and its process must be gone before another
            // replica can take the Lease, at leaseDuration.
            let margin = election.fence_margin();
            if exec.grace_period > margin {
                return Err(check.error(
                    "manager.exec.gracePeriod",
                    format!(
                        "{} must be at most leaderElection.leaseDuration - renewDeadline{which} ({}), so that a leader that lost its Lease has stopped its process before another replica can take it",
                        crate::human::exact(exec.grace_period),
                        crate::human::exact(margin),
                    ),
                ));
            }
        }
        // Absent: the default. An explicit empty list watches nothing. The
        // exec manager watches nothing itself.
        let watch = match (watch, &exec) {
            (Some(_), Some(_)) => {
                return Err(check.error(
                    "watch",
                    "does not go with manager.exec: the built-in watch manager and the exec manager are two managers; keep one",
                ));
            }
            (Some(watch), None) => watch,
            (None, None) => default_watch(),
            (None, Some(_)) => Vec::new(),
        };
        let config = Self {
            file: None,
            admin_address,
            drain_window,
            probe,
            supervisor,
            remotes,
            watch,
            exec,
            command_line: Vec::new(),
            leader_election,
            sharding,
        };
        Ok((config, restart))
    }

    /// The configuration without a file: defaults, and one remote from the
    /// environment (in-cluster in a pod, else the current kubeconfig context).
    #[must_use]
    pub fn defaults() -> Self {
        Self {
            file: None,
            admin_address: SocketAddr::from(([0, 0, 0, 0], 9090)),
            drain_window: DEFAULT_DRAIN_WINDOW,
            probe: ProbeConfig::default(),
            supervisor: SupervisorConfig::default(),
            remotes: vec![RemoteSpec {
                name: "default".to_owned(),
                required: true,
                source: RemoteSource::Inferred,
            }],
            watch: default_watch(),
            exec: None,
            command_line: Vec::new(),
            leader_election: None,
            sharding: None,
        }
    }

    /// Makes `command` (given after `--` on the command line, possibly
    /// none) the exec manager's. A `manager.exec` section without a
    /// `command` of its own gives its other settings; without one, they are
    /// the defaults.
    ///
    /// # Errors
    ///
    /// If the file's `manager.exec` has a command too, or the file has a
    /// `watch` list (which one runs would be a guess); or if the file's
    /// `manager.exec` has no command and none was given.
    pub fn with_command(mut self, command: Vec<String>) -> Result<Self, ConfigError> {
        let file = self.label();
        let error = |field: &str, message: String| ConfigError::new(&file, field, message);
        let clash = "and a command was given after `--` too; keep one";
        match (&mut self.exec, command.is_empty()) {
            (Some(exec), true) if exec.command.is_empty() => {
                return Err(error(
                    "manager.exec.command",
                    "is required: the program and its arguments, as a list (not a shell line), or after `--` on the command line".to_owned(),
                ));
            }
            (_, true) => return Ok(self),
            (Some(exec), false) if !exec.command.is_empty() => {
                return Err(error(
                    "manager.exec.command",
                    format!("sets the exec manager's command, {clash}"),
                ));
            }
            (Some(exec), false) => exec.command.clone_from(&command),
            (None, false) => {
                if self.watch != default_watch() {
                    return Err(error(
                        "watch",
                        format!("configures the built-in watch manager, {clash}"),
                    ));
                }
                self.exec = Some(ExecSpec::of_command(
                    command.clone(),
                    &self.supervisor,
                    self.leader_election.as_ref(),
                ));
            }
        }
        self.watch = Vec::new();
        self.command_line = command;
        Ok(self)
    }

    /// The label for errors: the file, or `<defaults>`.
    #[must_use]
    pub fn label(&self) -> String {
        self.file
            .as_ref()
            .map_or_else(|| "<defaults>".to_owned(), |f| f.display().to_string())
    }
}

impl fmt::Display for RemoteSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kubeconfig { path, context } => {
                write!(f, "kubeconfig {}", path.display())?;
                if let Some(context) = context {
                    write!(f, " (context {context})")?;
                }
                Ok(())
            }
            Self::Direct {
                server,
                insecure_skip_tls_verify,
                ..
            } => {
                // Never the userinfo or the query: either may hold a secret.
                let uri: Option<http::Uri> = server.parse().ok();
                let shown = uri.map_or_else(
                    || "(not a URL)".to_owned(),
                    |u| tether_probes::shown_url(&u),
                );
                write!(f, "server {shown}")?;
                if *insecure_skip_tls_verify {
                    write!(f, " (TLS verification OFF)")?;
                }
                Ok(())
            }
            Self::Inferred => f.write_str("in-cluster config, or the current kubeconfig context"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
        for bad in ["10", "s", "10x", "", "-1s", "PT10S"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_that_overflow_or_exceed_a_day_are_rejected() {
        for huge in [
            "1142673313454786114h",
            "18446744073709551615s",
            "307445734561825861m",
            "25h",
            "86401s",
        ] {
            let err = parse_duration(huge).expect_err(huge);
            assert!(err.contains(huge), "{err}");
        }
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.yaml", Path::new("."))
    }

    const REMOTE: &str = "remotes: [{name: a, server: \"https://h:6443\"}]\n";

    #[test]
    fn every_mistake_in_a_file_is_shown_each_on_its_line() {
        let err = parse(
            "probe: {interval: 0s}\nremotes: [{name: A, server: \"https://h:6443\"}, {name: b}]\nwatch: [{apiVersion: v1, kind: Configmap}, {apiVersion: v1}]\n",
        )
        .expect_err("five mistakes");
        let fields: Vec<&str> = std::iter::once(&err)
            .chain(&err.more)
            .map(|e| e.field.as_str())
            .collect();
        assert_eq!(
            fields,
            [
                "probe.interval",
                "remotes[0].name",
                "remotes[1]",
                "watch[0]",
                "watch[1].kind"
            ],
            "{err}"
        );
        assert_eq!(err.to_string().lines().count(), 5, "{err}");
    }

    #[test]
    fn a_kind_in_the_wrong_case_gets_the_known_one_as_a_suggestion() {
        let err = parse(&format!(
            "{REMOTE}watch: [{{apiVersion: v1, kind: Configmap}}]\n"
        ))
        .expect_err("unknown kind");
        assert_eq!(
            err.to_string(),
            "t.yaml: watch[0]: unknown apiVersion/kind v1/Configmap; did you mean v1/ConfigMap?"
        );
    }

    #[test]
    fn an_unknown_key_names_its_path_and_the_closest_known_one() {
        let err = parse(&format!("probe:\n  failureTreshold: 3\n{REMOTE}")).expect_err("typo");
        assert_eq!(
            err.to_string(),
            "t.yaml: probe.failureTreshold: unknown field; did you mean failureThreshold?"
        );
        let err = parse(&format!("{REMOTE}zzz: 1\n")).expect_err("unknown");
        assert_eq!(err.field, "zzz");
        assert!(err.message.contains("known fields: admin"), "{err}");
        let err = parse("remotes: [{name: a, server: \"https://h\"}, {name: b, sever: x}]\n")
            .expect_err("typo");
        assert_eq!(err.field, "remotes[1].sever");
        assert!(err.message.ends_with("did you mean server?"), "{err}");
    }

    #[test]
    fn a_type_error_names_the_full_path() {
        let err = parse(&format!(
            "supervisor: {{backoff: {{jitter: lots}}}}\n{REMOTE}"
        ))
        .expect_err("type");
        assert_eq!(err.field, "supervisor.backoff.jitter");
        let err = parse(&format!("probe: {{jitter: lots}}\n{REMOTE}")).expect_err("type");
        assert_eq!(err.field, "probe.jitter");
        let err =
            parse(&format!("probe: {{failureThreshold: three}}\n{REMOTE}")).expect_err("type");
        assert_eq!(err.field, "probe.failureThreshold");
    }

    #[test]
    fn an_empty_file_needs_remotes() {
        let err = Config::parse("", "t.yaml", Path::new(".")).expect_err("no remotes");
        assert_eq!(
            err.to_string(),
            "t.yaml: remotes: at least one remote is needed"
        );
    }

    #[test]
    fn defaults_follow_the_design() {
        let config = Config::parse(
            "remotes: [{name: a, server: \"https://h:6443\"}]",
            "t.yaml",
            Path::new("."),
        )
        .expect("valid");
        assert_eq!(config.admin_address, "0.0.0.0:9090".parse().expect("valid"));
        assert_eq!(config.probe, ProbeConfig::default());
        assert_eq!(config.supervisor, SupervisorConfig::default());
        assert!(config.supervisor.rebuild_on_recovery);
        assert!(config.remotes[0].required);
        assert_eq!(config.watch[0].resource_label(), "namespaces");
    }

    const ELECTION: &str = "leaderElection: {enabled: true, leaseNamespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}\n";

    #[test]
    fn a_lease_duration_is_whole_seconds_or_an_error_naming_the_field() {
        for bad in ["900ms", "1.5s", "2500ms"] {
            let err = parse(&format!(
                "{REMOTE}leaderElection: {{enabled: true, leaseDuration: {bad}, renewDeadline: 500ms, retryPeriod: 100ms}}\n"
            ))
            .expect_err(bad);
            assert_eq!(err.field, "leaderElection.leaseDuration", "{err}");
            assert!(
                err.message
                    .starts_with(&format!("{bad} is not a whole number of seconds")),
                "{err}"
            );
        }
        let config = parse(&format!("{REMOTE}{ELECTION}")).expect("valid");
        let election = config.leader_election.expect("on");
        assert_eq!(election.lease_duration.wire(), 3);
        assert_eq!(election.fence_margin(), Duration::from_secs(1));
    }

    #[test]
    fn a_reload_checks_the_grace_period_against_the_running_election() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.yaml");
        let write = |text: &str| std::fs::write(&path, text).expect("write");
        let manager =
            |grace: &str| format!("manager: {{exec: {{command: [x], gracePeriod: {grace}}}}}\n");
        write(&format!("{REMOTE}{ELECTION}{}", manager("1s")));
        let running = Config::load(&path).expect("valid");
        // The file now fits a 4s grace in a 10s lease: the running one, 3s,
        // keeps running, and its fence is 1s.
        write(&format!(
            "{REMOTE}leaderElection: {{enabled: true, leaseNamespace: default, leaseDuration: 10s, renewDeadline: 2s, retryPeriod: 500ms}}\n{}",
            manager("4s")
        ));
        assert!(Config::load(&path).is_ok(), "the file alone is valid");
        let err = Config::reload(&path, &running).expect_err("past the running fence");
        assert_eq!(err.field, "manager.exec.gracePeriod", "{err}");
        assert!(
            err.message.contains("running election") && err.message.contains("(1s)"),
            "{err}"
        );
        // Within the running fence, it is applied, with the election as it
        // runs, and the section named as waiting for a restart.
        write(&format!(
            "{REMOTE}leaderElection: {{enabled: true, leaseNamespace: default, leaseDuration: 10s, renewDeadline: 2s, retryPeriod: 500ms}}\n{}",
            manager("800ms")
        ));
        let (next, restart) = Config::reload(&path, &running).expect("fits");
        assert_eq!(next.leader_election, running.leader_election);
        assert_eq!(restart, vec!["leaderElection"]);
        assert_eq!(
            next.exec.expect("exec").grace_period,
            Duration::from_millis(800)
        );
    }

    #[test]
    fn an_identity_must_fit_a_shard_leases_name() {
        let err = parse(&format!(
            "{REMOTE}leaderElection: {{enabled: true, identity: Pod_A}}\nsharding: {{enabled: true}}\n"
        ))
        .expect_err("not a Lease name");
        assert_eq!(err.field, "leaderElection.identity", "{err}");
        // Without sharding, any name without control characters will do,
        // as client-go takes it.
        assert!(
            parse(&format!(
                "{REMOTE}leaderElection: {{enabled: true, identity: Pod_A}}\n"
            ))
            .is_ok()
        );
        let err = parse(&format!(
            "{REMOTE}leaderElection: {{enabled: true, leaseName: a_b}}\n"
        ))
        .expect_err("not a Lease name");
        assert_eq!(err.field, "leaderElection.leaseName", "{err}");
    }

    #[test]
    fn an_explicit_empty_watch_list_watches_nothing() {
        let config = Config::parse(
            "remotes: [{name: a, server: \"https://h:6443\"}]\nwatch: []",
            "t.yaml",
            Path::new("."),
        )
        .expect("valid");
        assert!(config.watch.is_empty());
    }
}
