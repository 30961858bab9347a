//! The config: the file's raw shape, its checks and defaults, and the plan
//! made from it.
//!
//! - `raw.rs`: the file's shape, as serde reads it;
//! - `parse.rs`: the file read into that shape, every unknown key named;
//! - `check/`: every field checked, and named by its path when wrong
//!   (`remotes[1].server: invalid URL ...`), every mistake at once, in a
//!   room per section (remotes, the manager, the Leases);
//! - `defaults.rs`: what a field is when the file leaves it out;
//! - `spec.rs`: the checked values, with their domain rules (the kinds the
//!   watch manager knows, the stop signals, the fence's margin);
//! - `selector.rs`: the label selector grammar, as the apiserver parses it;
//! - `discovery.rs`: the `discovery` sources (the Secrets themselves are
//!   read by `crate::discovery`);
//! - `remote.rs`: each remote's settings resolved to a kube `Config`;
//! - `sources.rs`: the files those settings came from, watched;
//! - `plan.rs`: what this replica's manager runs;
//! - `ranked.rs`: remotes in the plan's order, kept in persistent maps.
//!
//! Parsing rejects unknown keys (naming them all) and wrong types; the
//! checks then name the file and the field path of every bad value.

mod check;
pub mod defaults;
pub mod discovery;
mod parse;
mod plan;
pub mod ranked;
mod raw;
pub mod remote;
mod selector;
pub mod sources;
mod spec;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_probes::ProbeConfig;
use tether_supervisor::SupervisorConfig;

use self::check::Checker;
pub use self::check::{DurationError, FileError, parse_duration, readable_file, valid_name};
pub use self::discovery::{DiscoverySpec, SecretFormat};
pub use self::plan::Plan;
pub use self::spec::{
    ExecSpec, LeaderElectionSpec, ReadinessSpec, RemoteSource, RemoteSpec, SecretSource,
    ServiceAccountSpec, ShardingSpec, StopSignal, WatchSpec, WholeSeconds,
};

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
    /// Where remotes are discovered, besides the static list.
    pub discovery: Vec<DiscoverySpec>,
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
        let raw = parse::raw(text, file)?;
        Checker { file, base }.config(raw, running)
    }

    /// The configuration without a file: defaults, and one remote from the
    /// environment (in-cluster in a pod, else the current kubeconfig context).
    #[must_use]
    pub fn defaults() -> Self {
        Self {
            file: None,
            admin_address: defaults::ADMIN_ADDRESS,
            drain_window: defaults::DRAIN_WINDOW,
            probe: ProbeConfig::default(),
            supervisor: SupervisorConfig::default(),
            remotes: vec![RemoteSpec {
                name: "default".to_owned(),
                required: defaults::REQUIRED,
                source: RemoteSource::Inferred,
            }],
            watch: defaults::watch(),
            exec: None,
            command_line: Vec::new(),
            leader_election: None,
            sharding: None,
            discovery: Vec::new(),
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
                if self.watch != defaults::watch() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

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
            assert!(err.to_string().contains(huge), "{err}");
        }
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.yaml", Path::new("."))
    }

    const REMOTE: &str = "remotes: [{name: a, server: \"https://h:6443\"}]\n";

    /// The field of each mistake `err` reports, in order.
    fn fields(err: &ConfigError) -> Vec<&str> {
        std::iter::once(err)
            .chain(&err.more)
            .map(|e| e.field.as_str())
            .collect()
    }

    #[test]
    fn every_mistake_in_a_file_is_shown_each_on_its_line() {
        let err = parse(
            "probe: {interval: 0s}\nremotes: [{name: A, server: \"https://h:6443\"}, {name: b}]\nwatch: [{apiVersion: v1, kind: Configmap}, {apiVersion: v1}]\n",
        )
        .expect_err("five mistakes");
        assert_eq!(
            fields(&err),
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
    fn every_unknown_key_is_named_beside_the_first_mistake() {
        let err = parse(
            "probe: {interval: [1], failureTreshold: 3}\nremotes: [{name: a, server: \"https://h\"}, {name: b, sever: x, requird: true}]\nadmn: {address: \"127.0.0.1:1\"}\n",
        )
        .expect_err("four mistakes");
        assert_eq!(
            fields(&err),
            [
                "probe.interval",
                "admn",
                "probe.failureTreshold",
                "remotes[1].requird",
                "remotes[1].sever"
            ],
            "{err}"
        );
        assert!(err.message.contains("line 1"), "serde-saphyr's own: {err}");
        assert!(
            err.more[0].message.ends_with("did you mean admin?"),
            "{err}"
        );
        assert!(
            err.more[3].message.ends_with("did you mean server?"),
            "{err}"
        );
    }

    #[test]
    fn past_the_most_unknown_keys_looked_for_it_says_more_may_follow() {
        let mut file = "remotes:\n".to_owned();
        for i in 0..40 {
            let _ = writeln!(file, "  - {{name: r{i}, sever: x}}");
        }
        let err = parse(&file).expect_err("40 typos");
        assert_eq!(err.more.len(), 33, "{err}");
        let last = err.more.last().expect("a last line");
        assert_eq!(
            (last.field.as_str(), last.message.as_str()),
            (
                "(document)",
                "more mistakes may follow; these are the first 33"
            ),
            "{err}"
        );
        let err = parse("remotes:\n  - {name: a, sever: x}\n  - {name: b, sever: x}\n")
            .expect_err("two typos");
        assert_eq!(fields(&err), ["remotes[0].sever", "remotes[1].sever"]);
    }

    #[test]
    fn a_file_that_is_not_yaml_shows_one_mistake() {
        let err = parse("probe: {interval: 1s\nzzz: [\n").expect_err("syntax");
        assert!(err.more.is_empty(), "{err}");
        let err = parse("watch: [5, {kind: x, apiVersion: v1, zz: 1}]\n").expect_err("type");
        assert_eq!(err.field, "watch[0]", "{err}");
        assert!(err.more.is_empty(), "not a key, so not cut: {err}");
    }

    #[test]
    fn a_file_may_list_more_remotes_than_the_parsers_default_budget_allows() {
        use std::fmt::Write as _;

        // 60,000 remotes are 300,000 nodes: past serde-saphyr's default
        // of 250,000, within the file's own 2.5 MB.
        let mut text = String::from("remotes:\n");
        for i in 0..60_000 {
            let _ = writeln!(text, "  - {{name: r{i}, server: \"https://h{i}:6443\"}}");
        }
        let config = parse(&text).expect("a file of 60,000 remotes");
        assert_eq!(config.remotes.len(), 60_000);
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
            "t.yaml: remotes: at least one remote is needed, or a discovery source"
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
    fn the_exec_managers_fleet_settings_default_and_a_zero_hold_is_refused() {
        let exec = |extra: &str| format!("{REMOTE}manager: {{exec: {{command: [x]{extra}}}}}\n");
        let spec = parse(&exec("")).expect("valid").exec.expect("exec");
        assert!(!spec.follows_remotes_file);
        assert_eq!(spec.put_back_after, defaults::PUT_BACK_AFTER);
        let spec = parse(&exec(", followsRemotesFile: true, putBackAfter: 30s"))
            .expect("valid")
            .exec
            .expect("exec");
        assert!(spec.follows_remotes_file);
        assert_eq!(spec.put_back_after, Duration::from_secs(30));
        let err = parse(&exec(", putBackAfter: 0s")).expect_err("a zero hold");
        assert_eq!(err.field, "manager.exec.putBackAfter", "{err}");
    }

    #[test]
    fn a_launcher_and_a_service_account_are_checked_field_by_field() {
        let exec = |extra: &str| format!("{REMOTE}manager: {{exec: {{command: [x]{extra}}}}}\n");
        let launcher = ", launcher: {socket: /run/l/launcher.sock}";
        let spec = parse(&exec(&format!(
            "{launcher}, serviceAccount: {{name: my-controller}}"
        )))
        .expect("valid")
        .exec
        .expect("exec");
        assert_eq!(
            spec.launcher.as_deref(),
            Some(std::path::Path::new("/run/l/launcher.sock"))
        );
        let account = spec.service_account.expect("an account");
        assert_eq!(
            (account.name.as_str(), account.namespace, account.expiration),
            ("my-controller", None, defaults::TOKEN_EXPIRATION)
        );
        for (extra, field) in [
            (
                ", serviceAccount: {name: my-controller}".to_owned(),
                "manager.exec.serviceAccount",
            ),
            (", launcher: {}".to_owned(), "manager.exec.launcher.socket"),
            (
                format!(", launcher: {{socket: /{}}}", "s".repeat(120)),
                "manager.exec.launcher.socket",
            ),
            (
                format!("{launcher}, serviceAccount: {{name: My_Controller}}"),
                "manager.exec.serviceAccount.name",
            ),
            (
                format!("{launcher}, serviceAccount: {{name: c, namespace: a.b}}"),
                "manager.exec.serviceAccount.namespace",
            ),
            (
                format!("{launcher}, serviceAccount: {{name: c, expiration: 5m}}"),
                "manager.exec.serviceAccount.expiration",
            ),
        ] {
            let err = parse(&exec(&extra)).expect_err(&extra);
            assert_eq!(err.field, field, "{extra}: {err}");
        }
    }

    #[test]
    fn a_discovered_remote_is_optional_unless_its_source_says_otherwise() {
        let source = |extra: &str| {
            format!("discovery: [{{secrets: {{namespace: fleet, format: kubeconfig{extra}}}}}]\n")
        };
        assert!(!parse(&source("")).expect("valid").discovery[0].required);
        assert!(parse(&source(", required: true")).expect("valid").discovery[0].required);
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
