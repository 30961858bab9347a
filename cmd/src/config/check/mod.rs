//! The checks: every field of the raw shape, defaulted from `defaults.rs`,
//! checked, and named by its path in the file when it is wrong. Every
//! section is checked even after another failed, so one run reports every
//! mistake.
//!
//! - `mod.rs`: the whole file and its sections, and the probe and
//!   supervisor sections;
//! - `values.rs`: durations, files and names, as every section takes them;
//! - `remotes.rs`: the static remotes;
//! - `manager.rs`: the watch list and the exec manager;
//! - `lease.rs`: leader election and sharding.

mod lease;
mod manager;
mod remotes;
mod values;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_probes::ProbeConfig;
use tether_supervisor::{BackoffConfig, SupervisorConfig};

use super::raw::{RawConfig, RawManager, RawProbe, RawSupervisor};
use super::{
    Config, ConfigError, DiscoverySpec, LeaderElectionSpec, RemoteSpec, ShardingSpec, WatchSpec,
    defaults,
};

pub use self::values::{DurationError, FileError, parse_duration, readable_file, valid_name};

/// The value of `result`, or `None` with its error kept in `errors`: the
/// sections of a file are checked one after another, and every mistake is
/// reported together.
pub(super) fn kept<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// The sections of a file but the manager, checked; `watch` as the file
/// gives it, if it does.
struct Sections {
    drain_window: Duration,
    remotes: Vec<RemoteSpec>,
    watch: Option<Vec<WatchSpec>>,
    restartable: Restartable,
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
                remotes,
                watch,
                restartable,
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
        ) = restartable.into_running(running);
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
            .map_err(|err| self.error(field, tether_supervisor::error_chain(&err)))
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
                remotes,
                watch,
                restartable: Restartable {
                    admin_address,
                    probe,
                    supervisor,
                    leader_election,
                    sharding,
                    discovery,
                },
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
}
