//! Turning configured remotes into kube client configurations, once, for
//! the probes and the manager alike.

use kube::config::{
    AuthInfo, Cluster, Context, ExecInteractiveMode, KubeConfigOptions, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use tether_probes::{Remote, without_userinfo};
use tracing::warn;

use crate::config::{Config, ConfigError, RemoteSource, RemoteSpec};

/// A configured remote with its kube configuration.
#[derive(Clone)]
pub struct ResolvedRemote {
    /// The configured name.
    pub name: String,
    /// Whether its caches gate readiness, and its loss ends the cycle.
    pub required: bool,
    /// Its connection settings (credentials included; never logged).
    pub config: kube::Config,
}

impl std::fmt::Debug for ResolvedRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedRemote")
            .field("name", &self.name)
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl ResolvedRemote {
    /// The remote as the probes take it.
    #[must_use]
    pub fn probed(&self) -> Remote {
        Remote::new(self.name.clone(), self.config.clone())
    }
}

/// The innermost cause's message.
fn root(error: &(dyn std::error::Error + 'static)) -> String {
    tether_probes::root_cause(error)
}

/// A kubeconfig with one cluster, user and context, from direct fields.
fn direct_kubeconfig(
    name: &str,
    server: &str,
    ca_file: Option<&std::path::Path>,
    token_file: Option<&std::path::Path>,
    insecure: bool,
) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.to_owned(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                certificate_authority: ca_file.map(|p| p.display().to_string()),
                insecure_skip_tls_verify: Some(insecure),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.to_owned(),
            auth_info: Some(AuthInfo {
                token_file: token_file.map(|p| p.display().to_string()),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: name.to_owned(),
            context: Some(Context {
                cluster: name.to_owned(),
                user: Some(name.to_owned()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(name.to_owned()),
        ..Kubeconfig::default()
    }
}

/// Builds the kube configuration of remote `index` of `config`.
///
/// # Errors
///
/// A [`ConfigError`] naming `remotes[index]` and the field that failed.
pub async fn kube_config(
    config: &Config,
    index: usize,
    spec: &RemoteSpec,
) -> Result<kube::Config, ConfigError> {
    let error = |field: &str, message: String| ConfigError {
        file: config.label(),
        field: format!("remotes[{index}]{field}"),
        message,
    };
    let mut kube_config = match &spec.source {
        RemoteSource::Kubeconfig { path, context } => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                error(
                    ".kubeconfig",
                    format!("cannot load {}: {}", path.display(), root(&e)),
                )
            })?;
            if let Some(wanted) = context
                && !kubeconfig.contexts.iter().any(|c| &c.name == wanted)
            {
                let known: Vec<&str> = kubeconfig
                    .contexts
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect();
                return Err(error(
                    ".context",
                    format!(
                        "{} has no context {wanted:?}; it has: {}",
                        path.display(),
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            let options = KubeConfigOptions {
                context: context.clone(),
                ..KubeConfigOptions::default()
            };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| {
                    let field = if context.is_some() {
                        ".context"
                    } else {
                        ".kubeconfig"
                    };
                    error(field, root(&e))
                })?
        }
        RemoteSource::Direct {
            server,
            ca_file,
            token_file,
            insecure_skip_tls_verify,
        } => {
            if *insecure_skip_tls_verify {
                warn!(remote = %spec.name, "insecureSkipTlsVerify is set: the server's certificate is not verified");
            }
            let kubeconfig = direct_kubeconfig(
                &spec.name,
                server,
                ca_file.as_deref(),
                token_file.as_deref(),
                *insecure_skip_tls_verify,
            );
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| error("", root(&e)))?
        }
        RemoteSource::Inferred => kube::Config::infer().await.map_err(|e| {
            error(
                "",
                format!(
                    "no config file, and no in-cluster or kubeconfig default: {}",
                    root(&e)
                ),
            )
        })?,
    };
    // Userinfo authenticates nothing for kube; keep it out of every client
    // and so out of every log line.
    kube_config.cluster_url = without_userinfo(&kube_config.cluster_url);
    // A daemon has no terminal: an interactive plugin would inherit tether's
    // stdin and write its stderr, which may hold a token, into the logs.
    if let Some(exec) = kube_config.auth_info.exec.as_mut() {
        exec.interactive_mode = Some(ExecInteractiveMode::Never);
    }
    Ok(kube_config)
}

/// Builds every remote's kube configuration, in config order.
///
/// # Errors
///
/// The first remote's [`ConfigError`].
pub async fn resolve(config: &Config) -> Result<Vec<ResolvedRemote>, ConfigError> {
    let mut remotes = Vec::with_capacity(config.remotes.len());
    for (index, spec) in config.remotes.iter().enumerate() {
        remotes.push(ResolvedRemote {
            name: spec.name.clone(),
            required: spec.required,
            config: kube_config(config, index, spec).await?,
        });
    }
    Ok(remotes)
}

/// The remotes as the probes take them.
#[must_use]
pub fn probed(remotes: &[ResolvedRemote]) -> Vec<Remote> {
    remotes.iter().map(ResolvedRemote::probed).collect()
}
