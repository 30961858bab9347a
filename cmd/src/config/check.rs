//! The checks: every field of the raw shape, defaulted from `defaults.rs`,
//! checked, and named by its path in the file when it is wrong. Every
//! section is checked even after another failed, so one run reports every
//! mistake.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_probes::ProbeConfig;
use tether_supervisor::{BackoffConfig, SupervisorConfig};

use super::raw::{
    RawConfig, RawExec, RawLeaderElection, RawManager, RawProbe, RawReadiness, RawRemote,
    RawSharding, RawSupervisor, RawWatch,
};
use super::spec::KNOWN_KINDS;
use super::{
    Config, ConfigError, DiscoverySpec, ExecSpec, LeaderElectionSpec, ReadinessSpec, RemoteSource,
    RemoteSpec, ShardingSpec, StopSignal, WatchSpec, WholeSeconds, defaults, selector,
};

/// The value of `result`, or `None` with its error kept in `errors`: the
/// sections of a file are checked one after another, and every mistake is
/// reported together.
pub(super) fn kept<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// The longest duration the configuration takes. No setting sensibly needs
/// more, and far larger values would overflow the timers' arithmetic.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Why a duration was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// It does not parse.
    #[error(
        "invalid duration {text:?}: write a number and a unit, like 500ms, 10s, 2m or 1h30m ({reason})"
    )]
    Invalid {
        /// What was given.
        text: String,
        /// The parser's reason.
        reason: String,
    },
    /// It is longer than 24h.
    #[error("{text:?} is longer than 24h, the most tether takes")]
    TooLong {
        /// What was given.
        text: String,
    },
}

/// Parses a duration: `500ms`, `10s`, `2m`, `1h30m`, `1.5s`. The grammar is
/// jiff's "friendly" format, the same the test kit's faults take. At most
/// 24h.
///
/// # Errors
///
/// [`DurationError`]: what a duration looks like, or that it is too long.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let duration = jiff::fmt::friendly::SpanParser::new()
        .parse_unsigned_duration(text.trim())
        .map_err(|err| DurationError::Invalid {
            text: text.to_owned(),
            reason: err.to_string(),
        })?;
    if duration > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: text.to_owned(),
        });
    }
    Ok(duration)
}

/// Why a file cannot be read, naming it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Nothing is there.
    #[error("file {} does not exist", .0.display())]
    Missing(PathBuf),
    /// A directory is there.
    #[error("{} is a directory, not a file", .0.display())]
    Directory(PathBuf),
    /// It cannot be opened: permissions, a symlink loop, ...
    #[error("cannot read {}: {source}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Whether `path` is a file tether can read, or why not, naming it: a
/// directory, a symlink loop and a missing file each say so.
///
/// # Errors
///
/// [`FileError`], with the path.
pub fn readable_file(path: &Path) -> Result<(), FileError> {
    let unreadable = |source| FileError::Unreadable {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(FileError::Missing(path.to_owned()))
        }
        Err(err) => Err(unreadable(err)),
        Ok(meta) if meta.is_dir() => Err(FileError::Directory(path.to_owned())),
        Ok(_) => std::fs::File::open(path).map(drop).map_err(unreadable),
    }
}

/// A remote name is a Prometheus label value and a log field: keep it to
/// DNS-label characters.
#[must_use]
pub fn valid_name(name: &str) -> bool {
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
    discovery: Vec<DiscoverySpec>,
}

/// The sections of a config that change only at a restart.
struct Restartable {
    admin_address: SocketAddr,
    probe: ProbeConfig,
    supervisor: SupervisorConfig,
    leader_election: Option<LeaderElectionSpec>,
    sharding: Option<ShardingSpec>,
    discovery: Vec<DiscoverySpec>,
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
            (self.discovery != running.discovery, "discovery"),
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
            discovery: running.discovery.clone(),
        };
        (kept, restart)
    }
}

pub(super) struct Checker<'a> {
    pub(super) file: &'a str,
    pub(super) base: &'a Path,
}

impl Checker<'_> {
    /// The config `raw` describes. At a reload, `running` is the config
    /// that runs: the sections that change only at a restart keep its
    /// values, and come back named.
    pub(super) fn config(
        &self,
        raw: RawConfig,
        running: Option<&Config>,
    ) -> Result<(Config, Vec<&'static str>), ConfigError> {
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
                discovery,
            },
            manager,
        ) = self.sections(raw)?;
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
                discovery,
            },
            restart,
        ) = Restartable {
            admin_address,
            probe,
            supervisor,
            leader_election,
            sharding,
            discovery,
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
            .map(|exec| self.exec(exec, &supervisor, fence))
            .transpose()?;
        if let (Some(exec), Some(election)) = (&exec, fence) {
            // The fence: a leader that stops renewing gives up at
            // renewDeadline, and its process must be gone before another
            // replica can take the Lease, at leaseDuration.
            let margin = election.fence_margin();
            if exec.grace_period > margin {
                return Err(self.error(
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
                return Err(self.error(
                    "watch",
                    "does not go with manager.exec: the built-in watch manager and the exec manager are two managers; keep one",
                ));
            }
            (Some(watch), None) => watch,
            (None, None) => defaults::watch(),
            (None, Some(_)) => Vec::new(),
        };
        let config = Config {
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
            discovery,
        };
        Ok((config, restart))
    }

    pub(super) fn error(
        &self,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(self.file, field, message)
    }

    fn duration(
        &self,
        field: &str,
        value: Option<&String>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        value.map_or(Ok(default), |v| {
            parse_duration(v).map_err(|e| self.error(field, e.to_string()))
        })
    }

    /// A path relative to the config file's folder, which must be a file
    /// tether can read.
    pub(super) fn existing_file(&self, field: &str, value: &str) -> Result<PathBuf, ConfigError> {
        let path = self.base.join(value);
        readable_file(&path)
            .map(|()| path)
            .map_err(|err| self.error(field, err.to_string()))
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
            discovery,
        } = raw;
        let mut errors = Vec::new();
        let discovering = discovery.as_ref().is_some_and(|d| !d.is_empty());
        let admin = admin.unwrap_or_default();
        let drain_window = kept(
            &mut errors,
            self.duration(
                "admin.drainWindow",
                admin.drain_window.as_ref(),
                defaults::DRAIN_WINDOW,
            ),
        );
        let admin_address = kept(
            &mut errors,
            admin.address.map_or(Ok(defaults::ADMIN_ADDRESS), |text| {
                text.parse().map_err(|e| {
                    self.error(
                        "admin.address",
                        format!("{text:?} is not an address like 0.0.0.0:9090: {e}"),
                    )
                })
            }),
        );
        let probe = kept(&mut errors, self.probe(probe.unwrap_or_default()));
        let supervisor = kept(&mut errors, self.supervisor(supervisor.unwrap_or_default()));
        let remotes = kept(
            &mut errors,
            self.remotes(remotes.unwrap_or_default(), discovering),
        );
        let discovery = kept(
            &mut errors,
            self.discovery(discovery.unwrap_or_default(), remotes.as_deref()),
        );
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
            Some(discovery),
        ) = (
            drain_window,
            admin_address,
            probe,
            supervisor,
            remotes,
            leader_election,
            sharding,
            discovery,
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
                discovery,
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
            tether_probes::Error::InvalidConfig { field, reason } => {
                self.error(format!("probe.{field}"), reason)
            }
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

    /// The static remotes; none only when `discovering` finds them.
    fn remotes(
        &self,
        raw: Vec<RawRemote>,
        discovering: bool,
    ) -> Result<Vec<RemoteSpec>, ConfigError> {
        if raw.is_empty() && !discovering {
            return Err(self.error(
                "remotes",
                "at least one remote is needed, or a discovery source",
            ));
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
                tether_probes::client::normalize_url(&uri).map_err(|e| {
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
            required: remote.required.unwrap_or(defaults::REQUIRED),
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
        let path = get
            .path
            .unwrap_or_else(|| defaults::READINESS_PATH.to_owned());
        if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(self.error(
                "manager.exec.readiness.httpGet.path",
                format!("{path:?} is not a path like /readyz"),
            ));
        }
        let period = self.duration(
            "manager.exec.readiness.period",
            r.period.as_ref(),
            defaults::READINESS_PERIOD,
        )?;
        let timeout = self.duration(
            "manager.exec.readiness.timeout",
            r.timeout.as_ref(),
            defaults::READINESS_PERIOD,
        )?;
        if period.is_zero() || timeout.is_zero() {
            return Err(self.error(
                "manager.exec.readiness",
                "period and timeout must be above 0",
            ));
        }
        let failure_threshold = r
            .failure_threshold
            .unwrap_or(defaults::READINESS_FAILURE_THRESHOLD);
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

    fn stop_signal(&self, raw: Option<String>) -> Result<StopSignal, ConfigError> {
        let Some(name) = raw else {
            return Ok(StopSignal::Term);
        };
        StopSignal::parse(&name).ok_or_else(|| {
            let known: Vec<&str> = StopSignal::ALL.iter().map(|s| s.name()).collect();
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
        let lease_name = raw
            .lease_name
            .unwrap_or_else(|| defaults::LEASE_NAME.to_owned());
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
            defaults::LEASE_DURATION,
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
            defaults::RENEW_DEADLINE,
        )?;
        let retry_period = self.duration(
            &field("retryPeriod"),
            raw.retry_period.as_ref(),
            defaults::RETRY_PERIOD,
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
            .unwrap_or_else(|| defaults::SHARD_LEASE_PREFIX.to_owned());
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
            defaults::grace_period(supervisor, election),
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
            selector::check(selector).map_err(|reason| {
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
