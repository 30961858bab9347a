//! The file's shape, as serde reads it. Everything is optional here, and
//! defaulted in `check/`, so that every error can name its field.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) admin: Option<RawAdmin>,
    pub(super) probe: Option<RawProbe>,
    pub(super) supervisor: Option<RawSupervisor>,
    pub(super) remotes: Option<Vec<RawRemote>>,
    pub(super) watch: Option<Vec<RawWatch>>,
    pub(super) manager: Option<RawManager>,
    pub(super) leader_election: Option<RawLeaderElection>,
    pub(super) sharding: Option<RawSharding>,
    pub(super) discovery: Option<Vec<RawDiscovery>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawDiscovery {
    pub(super) secrets: Option<RawSecrets>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawSecrets {
    pub(super) namespace: Option<String>,
    pub(super) format: Option<String>,
    pub(super) label_selector: Option<String>,
    pub(super) required: Option<bool>,
    pub(super) kubeconfig: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawSharding {
    pub(super) enabled: Option<bool>,
    pub(super) lease_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawLeaderElection {
    pub(super) enabled: Option<bool>,
    pub(super) lease_name: Option<String>,
    pub(super) lease_namespace: Option<String>,
    pub(super) identity: Option<String>,
    pub(super) lease_duration: Option<String>,
    pub(super) renew_deadline: Option<String>,
    pub(super) retry_period: Option<String>,
    pub(super) kubeconfig: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawManager {
    pub(super) exec: Option<RawExec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawExec {
    pub(super) command: Option<Vec<String>>,
    pub(super) env: Option<Vec<RawEnv>>,
    pub(super) working_dir: Option<String>,
    pub(super) readiness: Option<RawReadiness>,
    pub(super) stop_signal: Option<String>,
    pub(super) grace_period: Option<String>,
    pub(super) follows_remotes_file: Option<bool>,
    pub(super) put_back_after: Option<String>,
    pub(super) launcher: Option<RawLauncher>,
    pub(super) service_account: Option<RawServiceAccount>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawLauncher {
    pub(super) socket: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawServiceAccount {
    pub(super) name: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) expiration: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawEnv {
    pub(super) name: Option<String>,
    pub(super) value: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawReadiness {
    pub(super) http_get: Option<RawHttpGet>,
    pub(super) period: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) failure_threshold: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawHttpGet {
    pub(super) port: Option<u16>,
    pub(super) path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) address: Option<String>,
    pub(super) drain_window: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawProbe {
    pub(super) path: Option<String>,
    pub(super) interval: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) failure_threshold: Option<u32>,
    pub(super) success_threshold: Option<u32>,
    pub(super) jitter: Option<f64>,
    pub(super) unreachable_statuses: Option<Vec<u16>>,
    pub(super) max_connection_age: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawBackoff {
    pub(super) initial: Option<String>,
    pub(super) max: Option<String>,
    pub(super) factor: Option<f64>,
    pub(super) jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawSupervisor {
    pub(super) backoff: Option<RawBackoff>,
    pub(super) stable_after: Option<String>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) rebuild_on_recovery: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawRemote {
    pub(super) name: Option<String>,
    pub(super) kubeconfig: Option<String>,
    pub(super) context: Option<String>,
    pub(super) required: Option<bool>,
    pub(super) server: Option<String>,
    pub(super) ca_file: Option<String>,
    pub(super) token_file: Option<String>,
    pub(super) insecure_skip_tls_verify: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RawWatch {
    pub(super) api_version: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) namespace: Option<String>,
    pub(super) label_selector: Option<String>,
}
