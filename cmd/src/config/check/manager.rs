//! The manager: the watch list, or the exec manager's command, stop,
//! readiness and grace period.

use super::{Checker, kept};
use std::path::PathBuf;

use super::lease::valid_subdomain;
use crate::config::raw::{RawExec, RawLauncher, RawReadiness, RawServiceAccount, RawWatch};
use crate::config::spec::KNOWN_KINDS;
use crate::config::{
    ConfigError, ExecSpec, LeaderElectionSpec, ReadinessSpec, ServiceAccountSpec, StopSignal,
    SupervisorConfig, WatchSpec, defaults, selector,
};

/// The longest path a Unix socket's address holds (`sun_path`, without its
/// NUL).
const MAX_SOCKET_PATH: usize = 107;

impl Checker<'_> {
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

    /// `manager.exec.launcher.socket`: a path a Unix socket's address
    /// holds.
    fn launcher(&self, raw: RawLauncher) -> Result<PathBuf, ConfigError> {
        let socket = raw.socket.filter(|s| !s.is_empty()).ok_or_else(|| {
            self.error(
                "manager.exec.launcher.socket",
                "is required: the path `tether launcher --socket` listens on",
            )
        })?;
        let path = self.base.join(&socket);
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(self.error(
                "manager.exec.launcher.socket",
                format!(
                    "{} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket's path may have",
                    path.display()
                ),
            ));
        }
        Ok(path)
    }

    fn service_account(&self, raw: RawServiceAccount) -> Result<ServiceAccountSpec, ConfigError> {
        let name = raw.name.unwrap_or_default();
        if !valid_subdomain(&name) {
            return Err(self.error(
                "manager.exec.serviceAccount.name",
                format!("{name:?} is not a ServiceAccount name (a DNS subdomain)"),
            ));
        }
        let namespace = raw.namespace.filter(|ns| !ns.is_empty());
        if let Some(ns) = &namespace
            && !(valid_subdomain(ns) && ns.len() <= 63 && !ns.contains('.'))
        {
            return Err(self.error(
                "manager.exec.serviceAccount.namespace",
                format!("{ns:?} is not a namespace name (a DNS label)"),
            ));
        }
        let expiration = self.duration(
            "manager.exec.serviceAccount.expiration",
            raw.expiration.as_ref(),
            defaults::TOKEN_EXPIRATION,
        )?;
        if expiration < defaults::TOKEN_EXPIRATION_MIN {
            return Err(self.error(
                "manager.exec.serviceAccount.expiration",
                format!(
                    "{expiration:?} is shorter than the {:?} the TokenRequest API gives at least",
                    defaults::TOKEN_EXPIRATION_MIN
                ),
            ));
        }
        Ok(ServiceAccountSpec {
            name,
            namespace,
            expiration,
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

    pub(super) fn exec(
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
        let launcher = raw.launcher.map(|l| self.launcher(l)).transpose()?;
        let service_account = raw
            .service_account
            .map(|s| self.service_account(s))
            .transpose()?;
        if service_account.is_some() && launcher.is_none() {
            return Err(self.error(
                "manager.exec.serviceAccount",
                "needs manager.exec.launcher: a process tether starts in its own container can read tether's token, so a token of its own would take nothing from it",
            ));
        }
        let working_dir = raw
            .working_dir
            .map(|dir| {
                let path = self.base.join(&dir);
                // The launcher's container has its own files.
                if launcher.is_some() || path.is_dir() {
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
        let put_back_after = self.duration(
            "manager.exec.putBackAfter",
            raw.put_back_after.as_ref(),
            defaults::PUT_BACK_AFTER,
        )?;
        if put_back_after.is_zero() {
            return Err(self.error(
                "manager.exec.putBackAfter",
                "must be above 0: a remote that flaps would restart the process at each flap",
            ));
        }
        Ok(ExecSpec {
            command,
            env,
            working_dir,
            readiness,
            stop_signal,
            grace_period,
            follows_remotes_file: raw.follows_remotes_file.unwrap_or(false),
            put_back_after,
            launcher,
            service_account,
        })
    }

    pub(super) fn watch(&self, raw: Vec<RawWatch>) -> Result<Vec<WatchSpec>, ConfigError> {
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
