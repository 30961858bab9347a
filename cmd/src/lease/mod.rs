//! What tether keeps on Kubernetes Leases: the leader election, and the
//! sharing of remotes among replicas. Both know kube, and nothing of the
//! supervisor.

pub mod election;
pub mod shard;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::Api;

use crate::config::LeaderElectionSpec;

/// Why the Leases cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Lease's namespace is not configured and not known from a pod.
    #[error("leaderElection.leaseNamespace is required outside a pod")]
    NoNamespace,
    /// The client for the Lease's cluster could not be made.
    #[error("cannot make a client for the Lease's cluster")]
    Client(#[source] kube::Error),
    /// The kubeconfig of the Lease's cluster is unusable.
    #[error("cannot read the kubeconfig of the Lease's cluster")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither in-cluster config nor a kubeconfig is available.
    #[error("no cluster to hold the Lease: not in a pod, and no kubeconfig")]
    Infer(#[source] kube::config::InferConfigError),
    /// The metrics' names are taken.
    #[error("registering the Lease metrics failed")]
    Metrics(#[source] prometheus::Error),
}

/// The Leases' API in their namespace, and this replica's identity.
pub(crate) struct Leases {
    pub(crate) api: Api<Lease>,
    pub(crate) namespace: String,
    pub(crate) identity: String,
}

impl Leases {
    /// The client `spec` asks for: its kubeconfig, else in-cluster or the
    /// current context; each request bounded by `retryPeriod`, no retries.
    pub(crate) async fn new(spec: &LeaderElectionSpec) -> Result<Self, Error> {
        let mut config = match &spec.kubeconfig {
            Some(path) => {
                let kubeconfig =
                    kube::config::Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
                kube::Config::from_custom_kubeconfig(
                    kubeconfig,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(Error::Kubeconfig)?
            }
            None => kube::Config::infer().await.map_err(Error::Infer)?,
        };
        // Each request is bounded by its own timeout; kube's retries would
        // outlast the fence.
        config.default_retry = false;
        config.read_timeout = Some(spec.retry_period);
        config.connect_timeout = Some(spec.retry_period);
        let namespace = spec
            .lease_namespace
            .clone()
            .or_else(pod_namespace)
            .or_else(|| {
                spec.kubeconfig
                    .as_ref()
                    .map(|_| config.default_namespace.clone())
            })
            .ok_or(Error::NoNamespace)?;
        let client = kube::Client::try_from(config).map_err(Error::Client)?;
        Ok(Self {
            api: Api::namespaced(client, &namespace),
            namespace,
            identity: spec.identity.clone().unwrap_or_else(default_identity),
        })
    }
}

/// The pod's namespace, from its service account mount.
fn pod_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// `$POD_NAME`, else the hostname.
fn default_identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "tether".to_owned())
}

fn micro_now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// The jittered wait before the next try: `period` to 1.2 × `period`, as
/// client-go's `JitterFactor`.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + 0.2 * fastrand::f64())
}
