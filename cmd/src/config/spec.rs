//! The validated values of the config, as the rest of tether takes them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tether_supervisor::SupervisorConfig;

use super::defaults;

/// The resource types the built-in manager can cache: `(apiVersion, kind)`
/// to `(plural, namespaced)`.
pub(super) const KNOWN_KINDS: [(&str, &str, &str, bool); 8] = [
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
    /// A Secret of the home cluster, found by a `discovery` source.
    Secret(std::sync::Arc<SecretSource>),
}

/// A discovered remote's Secret, and the kubeconfig read from it.
#[derive(Clone)]
pub struct SecretSource {
    /// The namespace it is in.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// A digest of its data: the same digest, the same settings.
    pub digest: Vec<u8>,
    /// How to reach the cluster, as JSON (credentials included, never
    /// logged): what the exec manager's process is given. Kept with the
    /// exec manager alone (a switch of manager takes a restart): nothing
    /// else reads it once the remote's kube configuration is built, and
    /// parsed it cost about 2.9 KiB of heap a remote.
    pub kubeconfig: Option<secrecy::SecretSlice<u8>>,
}

impl PartialEq for SecretSource {
    fn eq(&self, other: &Self) -> bool {
        (&self.namespace, &self.name, &self.digest)
            == (&other.namespace, &other.name, &other.digest)
    }
}

impl Eq for SecretSource {}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSource")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
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

/// A signal a process may be asked to stop with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// `SIGTERM`, the default.
    Term,
    /// `SIGINT`.
    Int,
    /// `SIGQUIT`.
    Quit,
    /// `SIGHUP`.
    Hup,
    /// `SIGUSR1`.
    Usr1,
    /// `SIGUSR2`.
    Usr2,
}

impl StopSignal {
    /// Every one, in the order an error lists them.
    pub const ALL: [Self; 6] = [
        Self::Term,
        Self::Int,
        Self::Quit,
        Self::Hup,
        Self::Usr1,
        Self::Usr2,
    ];

    /// Its name: `SIGTERM`, ...
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Term => "SIGTERM",
            Self::Int => "SIGINT",
            Self::Quit => "SIGQUIT",
            Self::Hup => "SIGHUP",
            Self::Usr1 => "SIGUSR1",
            Self::Usr2 => "SIGUSR2",
        }
    }

    /// The signal sent.
    #[must_use]
    pub const fn signal(self) -> rustix::process::Signal {
        use rustix::process::Signal;
        match self {
            Self::Term => Signal::TERM,
            Self::Int => Signal::INT,
            Self::Quit => Signal::QUIT,
            Self::Hup => Signal::HUP,
            Self::Usr1 => Signal::USR1,
            Self::Usr2 => Signal::USR2,
        }
    }

    /// The one named `name`, in any case, with or without `SIG`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        let wanted = name.trim().to_ascii_uppercase();
        let wanted = wanted.strip_prefix("SIG").unwrap_or(&wanted);
        Self::ALL
            .into_iter()
            .find(|known| known.name().strip_prefix("SIG") == Some(wanted))
    }
}

impl fmt::Display for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    /// The signal a cycle's end sends the process group first.
    pub stop_signal: StopSignal,
    /// How long after the stop signal the group gets SIGKILL.
    pub grace_period: Duration,
    /// Whether the process follows `TETHER_REMOTES_FILE` as tether
    /// rewrites it: then it is never restarted for a change of its
    /// remotes, nor for an optional remote's loss.
    pub follows_remotes_file: bool,
    /// Without `follows_remotes_file`: how long an optional remote left
    /// out for its loss must stay reachable before the process is
    /// restarted with it.
    pub put_back_after: Duration,
    /// Where `tether launcher` listens, in another container: the process
    /// is started there, out of reach of tether's credentials; `None`:
    /// tether starts it itself.
    pub launcher: Option<PathBuf>,
    /// The process's own ServiceAccount at home: tether requests its
    /// tokens and writes a kubeconfig for it (`KUBECONFIG`).
    pub service_account: Option<ServiceAccountSpec>,
}

/// The ServiceAccount whose tokens tether requests (TokenRequest) for the
/// exec manager's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountSpec {
    /// Its name.
    pub name: String,
    /// Its namespace; `None`: the home cluster's (tether's own, in a pod).
    pub namespace: Option<String>,
    /// How long each token is asked to last; it is replaced at 80% of that.
    pub expiration: Duration,
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
            stop_signal: StopSignal::Term,
            grace_period: defaults::grace_period(supervisor, election),
            follows_remotes_file: false,
            put_back_after: defaults::PUT_BACK_AFTER,
            launcher: None,
            service_account: None,
        }
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
                    |u| tether_probes::client::shown_url(&u),
                );
                write!(f, "server {shown}")?;
                if *insecure_skip_tls_verify {
                    write!(f, " (TLS verification OFF)")?;
                }
                Ok(())
            }
            Self::Inferred => f.write_str("in-cluster config, or the current kubeconfig context"),
            Self::Secret(secret) => write!(f, "Secret {}/{}", secret.namespace, secret.name),
        }
    }
}
