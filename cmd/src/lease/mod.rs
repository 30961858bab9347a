//! What tether keeps on Kubernetes Leases: the leader election, and the
//! sharing of remotes among replicas. Both know kube, and nothing of the
//! supervisor.

pub(crate) mod claim;
pub(crate) mod election;
pub mod shard;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use crate::config::LeaderElectionSpec;

/// The runtime the Lease rounds run on: a thread of their own, apart from
/// the workers that the probes, the manager and the admin server load.
///
/// A replica that takes thousands of remotes at once (a TLS handshake
/// each) keeps those workers busy for seconds. A round on them waited its
/// turn behind every handshake, missed `renewDeadline`, and the fence let
/// every remote go: at 100,000 remotes over ten replicas the replicas went
/// round that loop and never settled. The Leases' client is made here
/// too, since kube's client starts its request queue's task on the
/// runtime that makes it. The fence is unchanged: a round that cannot
/// renew in time, on this thread, still lets go.
#[derive(Debug)]
pub(crate) struct LeaseThread {
    handle: tokio::runtime::Handle,
    /// Shut down in the background when dropped: a runtime may not be
    /// dropped from within another's tasks.
    runtime: Option<tokio::runtime::Runtime>,
}

impl LeaseThread {
    /// Starts the thread.
    ///
    /// # Errors
    ///
    /// If the thread or the runtime's drivers cannot be made.
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tether-leases")
            .enable_all()
            .build()?;
        Ok(Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// Runs `work` on the Leases' thread until it is done.
    pub(crate) fn spawn<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.handle.spawn(work)
    }

    /// Runs `work` on the Leases' thread, and waits for it here; a panic
    /// in it goes on here.
    ///
    /// # Errors
    ///
    /// If the thread was shut down first.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        match self.spawn(work).await {
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            done => done,
        }
    }
}

impl Drop for LeaseThread {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Why the Leases cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Lease's namespace is not configured and not known from a pod.
    #[error("leaderElection.leaseNamespace is required outside a pod")]
    NoNamespace,
    /// The client for the Lease's cluster could not be made.
    #[error("cannot make a client for the Lease's cluster")]
    Client(#[source] kube::Error),
    /// Making that client (which may run an exec credential plugin) hung
    /// or panicked.
    #[error("cannot make a client for the Lease's cluster")]
    Build(#[source] tether_probes::client::BuildError),
    /// The kubeconfig of the Lease's cluster is unusable.
    #[error("cannot read the kubeconfig of the Lease's cluster")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// Neither in-cluster config nor a kubeconfig is available.
    #[error("no cluster to hold the Lease: not in a pod, and no leaderElection.kubeconfig")]
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
    /// current context; each request bounded by `retryPeriod`, no retries,
    /// each response by [`tether_probes::client::MAX_LEASE_RESPONSE`].
    pub(crate) async fn new(spec: &LeaderElectionSpec) -> Result<Self, Error> {
        // Each request is bounded by its own timeout; kube's retries would
        // outlast the fence.
        let (client, default_namespace) =
            home_client(spec.kubeconfig.as_deref(), spec.retry_period).await?;
        let namespace = spec
            .lease_namespace
            .clone()
            .or_else(pod_namespace)
            .or_else(|| spec.kubeconfig.as_ref().map(|_| default_namespace))
            .ok_or(Error::NoNamespace)?;
        Ok(Self {
            api: Api::namespaced(client, &namespace),
            namespace,
            identity: spec.identity.clone().unwrap_or_else(default_identity),
        })
    }
}

/// The home cluster's connection settings: `kubeconfig`, or, without one,
/// in-cluster in a pod and the current kubeconfig context elsewhere. The
/// Leases, the Events and discovery's Secrets all come from it.
///
/// # Errors
///
/// [`Error::Kubeconfig`] or [`Error::Infer`] if the cluster cannot be
/// known.
pub async fn home_config(kubeconfig: Option<&std::path::Path>) -> Result<kube::Config, Error> {
    match kubeconfig {
        Some(path) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(Error::Kubeconfig)
        }
        None => kube::Config::infer().await.map_err(Error::Infer),
    }
}

/// A client of the home cluster (`kubeconfig`'s current context, else
/// in-cluster, else the current kubeconfig context), and the namespace that
/// context names: each request bounded by `timeout`, no retries, each
/// response by [`tether_probes::client::MAX_LEASE_RESPONSE`]. The Leases and the
/// Events on tether's Pod go through it.
///
/// # Errors
///
/// [`Error::Kubeconfig`] or [`Error::Infer`] if the cluster cannot be
/// known; [`Error::Build`] or [`Error::Client`] if its client cannot be
/// made.
pub async fn home_client(
    kubeconfig: Option<&std::path::Path>,
    timeout: std::time::Duration,
) -> Result<(kube::Client, String), Error> {
    let config = home_config(kubeconfig).await?;
    let namespace = config.default_namespace.clone();
    let client = bounded_client(config, timeout)
        .await
        .map_err(Error::Build)?
        .map_err(Error::Client)?;
    Ok((client, namespace))
}

/// A client on `config` for the home cluster's small objects (Leases,
/// Events, tokens): each request bounded by `timeout`, no retries, each
/// response by [`tether_probes::client::MAX_LEASE_RESPONSE`]. Built off
/// the workers: an exec credential plugin runs in the build.
///
/// # Errors
///
/// The outer error if the build hung or panicked; the inner one if kube
/// could not make the client.
pub(crate) async fn bounded_client(
    mut config: kube::Config,
    timeout: std::time::Duration,
) -> Result<Result<kube::Client, kube::Error>, tether_probes::client::BuildError> {
    config.default_retry = false;
    config.read_timeout = Some(timeout);
    config.connect_timeout = Some(timeout);
    tether_probes::client::once_off_workers(move || {
        tether_probes::client::bounded_client_within(
            config,
            tether_probes::client::MAX_LEASE_RESPONSE,
        )
    })
    .await
}

/// The pod's namespace, from its service account mount.
fn pod_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// How long the base of a default identity may be: room for the suffix
/// within the longest identity a shard Lease's name leaves.
const IDENTITY_BASE: usize = 200;

/// `$POD_NAME`, else the hostname, with a random suffix made at start, as
/// controller-runtime adds a UUID to the hostname: two processes on one
/// host, or two pods that a template gives one name, never share an
/// identity. Lower-cased, with anything a Lease name cannot hold as `-`.
#[must_use]
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_default();
    let base: String = base
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(IDENTITY_BASE)
        .collect();
    let base = base.trim_matches(['-', '.']);
    let base = if base.is_empty() { "tether" } else { base };
    let suffix: String = std::iter::repeat_with(|| fastrand::digit(36))
        .take(8)
        .collect();
    format!("{base}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_identity_is_unique_per_process_and_a_lease_name() {
        let (a, b) = (default_identity(), default_identity());
        assert_ne!(a, b, "two processes on one host would share {a}");
        for id in [&a, &b] {
            assert!(id.len() <= IDENTITY_BASE + 9, "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
                "{id}"
            );
        }
    }
}
