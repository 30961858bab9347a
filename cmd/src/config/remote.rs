//! Turning configured remotes into kube client configurations, once, for
//! the probes and the manager alike.

use std::path::Path;
use std::sync::Arc;

use kube::config::{
    AuthInfo, Cluster, Context, ExecInteractiveMode, KubeConfigOptions, Kubeconfig, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use tether_probes::client::without_userinfo;
use tether_probes::{Identity, Remote};
use tracing::warn;

use super::ranked::Remotes;
use super::sources::{Role, SourceFile};
use super::{Config, ConfigError, RemoteSource, RemoteSpec};

/// A configured remote with its kube configuration.
#[derive(Clone)]
pub struct ResolvedRemote {
    /// The configured name.
    pub name: String,
    /// Whether its caches gate readiness, and its loss ends the cycle.
    pub required: bool,
    /// Where its settings came from, as configured: what an exec manager's
    /// process is told, so that it reaches the remote the same way.
    pub source: RemoteSource,
    /// Its connection settings (credentials included; never logged),
    /// shared by the probes and the manager.
    pub config: Arc<kube::Config>,
    /// `config`'s identity, worked out once when it was read: the
    /// sharding's key and the probes' dedupe take it from here each time
    /// the remotes change. Set with `config`, never apart from it.
    pub identity: Arc<Identity>,
    /// The files its settings were read from, as they were then: watched,
    /// so that a rotation rebuilds its client.
    pub files: Vec<SourceFile>,
    /// Which reading of its settings the manager's clients would hold:
    /// new ([`next_generation`]) each time they are read anew, kept when
    /// only a token file rotated, since clients re-read that themselves. A
    /// remote the manager runs is rebuilt when it gets a new generation.
    pub generation: u64,
}

/// A generation no remote had before.
#[must_use]
pub fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl ResolvedRemote {
    /// A remote of `config` as read now: a new generation, no files, and
    /// its identity worked out here.
    ///
    /// # Errors
    ///
    /// [`tether_probes::Error`] if its server URL cannot be probed.
    pub fn new(
        name: impl Into<String>,
        required: bool,
        source: RemoteSource,
        config: Arc<kube::Config>,
    ) -> tether_probes::Result<Self> {
        let identity = Arc::new(Identity::of(&config)?);
        Ok(Self {
            name: name.into(),
            required,
            source,
            config,
            identity,
            files: Vec::new(),
            generation: next_generation(),
        })
    }
}

impl std::fmt::Debug for ResolvedRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedRemote")
            .field("name", &self.name)
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

/// The remotes as the daemon hands them to the planner: each without the
/// files it was read from, which only the daemon's sweep reads. The
/// planner keeps its own copies, so a list of files there would be one
/// more copy of every path (about 300 bytes a remote at 10,000).
#[must_use]
pub fn handed(remotes: &[ResolvedRemote]) -> Remotes {
    remotes
        .iter()
        .map(|r| ResolvedRemote {
            name: r.name.clone(),
            required: r.required,
            source: r.source.clone(),
            config: Arc::clone(&r.config),
            identity: Arc::clone(&r.identity),
            files: Vec::new(),
            generation: r.generation,
        })
        .collect()
}

impl ResolvedRemote {
    /// The remote as the probes take it.
    #[must_use]
    pub fn probed(&self) -> Remote {
        Remote::with_identity(
            self.name.clone(),
            Arc::clone(&self.config),
            Arc::clone(&self.identity),
        )
    }

    /// A required remote `name` of `https://{host}:6443`, read now: for the
    /// tests.
    #[cfg(test)]
    pub(crate) fn on(name: &str, host: &str) -> Self {
        let config = kube::Config::new(format!("https://{host}:6443").parse().expect("a URL"));
        Self::new(name, true, RemoteSource::Inferred, Arc::new(config)).expect("a server to probe")
    }
}

/// The innermost cause's message.
fn root(error: &(dyn std::error::Error + 'static)) -> String {
    tether_probes::client::root_cause(error)
}

/// A kubeconfig with one cluster, user and context, from direct fields.
pub(crate) fn direct_kubeconfig(
    name: &str,
    server: &str,
    ca_file: Option<&std::path::Path>,
    token_file: Option<&std::path::Path>,
    insecure: bool,
) -> Kubeconfig {
    single_kubeconfig(
        name,
        Cluster {
            server: Some(server.to_owned()),
            certificate_authority: ca_file.map(|p| p.display().to_string()),
            insecure_skip_tls_verify: Some(insecure),
            ..Cluster::default()
        },
        AuthInfo {
            token_file: token_file.map(|p| p.display().to_string()),
            ..AuthInfo::default()
        },
    )
}

/// A kubeconfig of `cluster` and `user`, and a context of the two, each
/// named `name`; that context current.
pub(crate) fn single_kubeconfig(name: &str, cluster: Cluster, user: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.to_owned(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.to_owned(),
            auth_info: Some(user),
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

/// A field of a remote (`.kubeconfig`, `.context`, or empty for the whole
/// remote) and what is wrong with it.
type FieldError = (&'static str, String);

/// The kube configuration a kubeconfig file's `context` (default: its
/// current one) describes, with every file it names checked first; and
/// those files, the kubeconfig first, as they were read.
async fn from_kubeconfig(
    path: &Path,
    context: Option<&str>,
) -> Result<(kube::Config, Vec<SourceFile>), FieldError> {
    let mut files = vec![SourceFile::read(Role::Kubeconfig, path)];
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
        (
            ".kubeconfig",
            format!("cannot load {}: {}", path.display(), root(&e)),
        )
    })?;
    if let Some(wanted) = context
        && !kubeconfig.contexts.iter().any(|c| c.name == wanted)
    {
        let known: Vec<&str> = kubeconfig
            .contexts
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let known = if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        };
        return Err((
            ".context",
            format!(
                "{} has no context {wanted:?}; it has: {known}",
                path.display()
            ),
        ));
    }
    // kube reads these files itself, and its errors do not name them.
    for (role, file) in named_files(&kubeconfig, context) {
        super::readable_file(Path::new(file)).map_err(|err| {
            let reason = tether_supervisor::error_chain(&err);
            (
                ".kubeconfig",
                format!("{}: its {}: {reason}", path.display(), role.as_str()),
            )
        })?;
        files.push(SourceFile::read(role, file));
    }
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| {
            let field = if context.is_some() {
                ".context"
            } else {
                ".kubeconfig"
            };
            (field, root(&e))
        })?;
    Ok((config, files))
}

/// A bearer token must fit in an HTTP header: kube panics building a
/// client with one that does not (a control character, a line break
/// inside). The token a file holds is read as kube reads it, without its
/// surrounding whitespace.
fn check_token(config: &kube::Config) -> Result<(), String> {
    use secrecy::ExposeSecret as _;

    let fits = |token: &str| http::HeaderValue::from_str(&format!("Bearer {token}")).is_ok();
    let auth = &config.auth_info;
    if let Some(token) = &auth.token
        && !fits(token.expose_secret())
    {
        return Err("its user's token holds a character an HTTP header cannot carry (a control character or a line break)".to_owned());
    }
    if let Some(path) = &auth.token_file {
        let token = std::fs::read_to_string(path)
            .map_err(|err| format!("cannot read its token file {path}: {err}"))?;
        if !fits(token.trim()) {
            return Err(format!(
                "its token file {path} holds a character an HTTP header cannot carry (a control character, or a line break inside the token)"
            ));
        }
    }
    Ok(())
}

/// Where a remote's settings came from, for what its errors may say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A kubeconfig file of the operator's.
    Kubeconfig,
    /// Direct fields in the config file.
    Direct,
    /// A Secret of the home cluster: whoever wrote it is not the operator,
    /// and its errors are shown on unauthenticated pages, so they name the
    /// field and never quote the value (a server URL's query or userinfo
    /// may carry a token).
    Secret,
}

/// `url` as an error may quote it: scheme, host, port and path, without
/// userinfo or query, where tokens ride.
fn quoted(url: &http::Uri) -> String {
    let bare = without_userinfo(url);
    match (bare.scheme_str(), bare.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}{}", bare.path()),
        _ => bare.path().to_owned(),
    }
}

/// What must hold of a loaded configuration before tether uses it, and the
/// changes it makes to it; with its identity.
fn finish(
    mut kube_config: kube::Config,
    name: &str,
    origin: Origin,
) -> Result<(kube::Config, Identity), FieldError> {
    let direct = origin == Origin::Direct;
    // Userinfo authenticates nothing for kube; keep it out of every client
    // and so out of every log line. A proxy's too: kube's messages about a
    // proxy quote its URL whole.
    kube_config.cluster_url = without_userinfo(&kube_config.cluster_url);
    kube_config.proxy_url = kube_config.proxy_url.as_ref().map(without_userinfo);
    check_token(&kube_config)
        .map_err(|message| (if direct { ".tokenFile" } else { ".kubeconfig" }, message))?;
    // A CA file with no certificate in it would fail every TLS handshake.
    if kube_config.root_cert.as_ref().is_some_and(Vec::is_empty) {
        return Err((
            if direct { ".caFile" } else { ".kubeconfig" },
            "its certificate authority holds no certificate".to_owned(),
        ));
    }
    // kube collects the certificates in place over the PEM blocks they
    // were parsed from, and keeps those blocks' room for the config's life:
    // 288 bytes a remote.
    if let Some(certs) = &mut kube_config.root_cert {
        certs.shrink_to_fit();
    }
    // A daemon has no terminal: an interactive plugin would inherit tether's
    // stdin and write its stderr, which may hold a token, into the logs.
    if let Some(exec) = kube_config.auth_info.exec.as_mut() {
        exec.interactive_mode = Some(ExecInteractiveMode::Never);
    }
    // A server URL that cannot be probed is a config error, not a loop of
    // failing builds.
    let identity = Identity::of(&kube_config).map_err(|e| match origin {
        Origin::Secret => (
            ".server",
            "its server is not an http or https URL with a host and a port tether can probe"
                .to_owned(),
        ),
        Origin::Direct => (
            ".server",
            format!("its server {}: {e}", quoted(&kube_config.cluster_url)),
        ),
        Origin::Kubeconfig => (
            ".kubeconfig",
            format!("its server {}: {e}", quoted(&kube_config.cluster_url)),
        ),
    })?;
    for warning in warnings(&kube_config) {
        warn!(remote = %name, "{warning}");
    }
    Ok((kube_config, identity))
}

/// Builds remote `index` of `config`: its kube configuration, and the
/// files it came from.
///
/// # Errors
///
/// A [`ConfigError`] naming `remotes[index]` and the field that failed.
pub async fn resolve_one(
    config: &Config,
    index: usize,
    spec: &RemoteSpec,
) -> Result<ResolvedRemote, ConfigError> {
    let loaded = match &spec.source {
        RemoteSource::Kubeconfig { path, context } => {
            from_kubeconfig(path, context.as_deref()).await
        }
        RemoteSource::Direct {
            server,
            ca_file,
            token_file,
            insecure_skip_tls_verify,
        } => {
            let files = [
                (Role::CertificateAuthority, ca_file),
                (Role::TokenFile, token_file),
            ]
            .into_iter()
            .filter_map(|(role, file)| file.as_ref().map(|f| SourceFile::read(role, f)))
            .collect();
            let kubeconfig = direct_kubeconfig(
                &spec.name,
                server,
                ca_file.as_deref(),
                token_file.as_deref(),
                *insecure_skip_tls_verify,
            );
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map(|config| (config, files))
                .map_err(|e| ("", root(&e)))
        }
        RemoteSource::Inferred => match kube::Config::infer().await {
            Ok(config) => {
                let files = config
                    .auth_info
                    .token_file
                    .iter()
                    .map(|f| SourceFile::read(Role::TokenFile, f))
                    .collect();
                Ok((config, files))
            }
            Err(e) => Err((
                "",
                format!(
                    "no config file, and no in-cluster or kubeconfig default: {}",
                    root(&e)
                ),
            )),
        },
        // Discovery builds its remotes (`discovered`); a config has none.
        RemoteSource::Secret(_) => Err((
            "",
            "a discovered remote is read from its Secret, not from the config".to_owned(),
        )),
    };
    loaded
        .and_then(|(kube_config, files)| {
            let origin = match spec.source {
                RemoteSource::Direct { .. } => Origin::Direct,
                RemoteSource::Secret(_) => Origin::Secret,
                RemoteSource::Kubeconfig { .. } | RemoteSource::Inferred => Origin::Kubeconfig,
            };
            Ok((finish(kube_config, &spec.name, origin)?, files))
        })
        .map(|((kube_config, identity), files)| ResolvedRemote {
            name: spec.name.clone(),
            required: spec.required,
            source: spec.source.clone(),
            config: Arc::new(kube_config),
            identity: Arc::new(identity),
            files,
            generation: next_generation(),
        })
        .map_err(|(field, message)| {
            ConfigError::new(&config.label(), format!("remotes[{index}]{field}"), message)
        })
}

/// The kube configuration of a kubeconfig a Secret carried: its current
/// context, with no file to read.
async fn from_secret(kubeconfig: &Kubeconfig) -> Result<kube::Config, FieldError> {
    use kube::config::KubeconfigError;

    kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| match e {
            KubeconfigError::ParseClusterUrl(_) => {
                (".server", "its server is not a URL".to_owned())
            }
            KubeconfigError::ParseProxyUrl(_) => ("", "its proxy-url is not a URL".to_owned()),
            e => ("", root(&e)),
        })
}

/// A remote a discovery source found in `secret`: `kubeconfig`, the one it
/// carries, loaded and checked as a configured remote's is.
///
/// # Errors
///
/// The field (`server`, or empty for the kubeconfig as a whole) and what is
/// wrong, in words that hold none of the Secret's data.
pub async fn discovered(
    name: &str,
    required: bool,
    kubeconfig: &Kubeconfig,
    secret: Arc<super::SecretSource>,
) -> Result<ResolvedRemote, (&'static str, String)> {
    let (config, identity) = from_secret(kubeconfig)
        .await
        .and_then(|config| finish(config, name, Origin::Secret))
        .map_err(|(field, message)| (field.trim_start_matches('.'), message))?;
    Ok(ResolvedRemote {
        name: name.to_owned(),
        required,
        source: RemoteSource::Secret(secret),
        config: Arc::new(config),
        identity: Arc::new(identity),
        files: Vec::new(),
        generation: next_generation(),
    })
}

/// What an operator should know about how a remote is reached: the
/// server's certificate unverified, or a bearer token sent in the clear.
#[must_use]
pub fn warnings(config: &kube::Config) -> Vec<&'static str> {
    let mut warnings = Vec::new();
    if config.accept_invalid_certs {
        warnings.push("TLS verification is OFF: the server's certificate is not verified");
    }
    let auth = &config.auth_info;
    let sends_token = auth.token.is_some() || auth.token_file.is_some() || auth.exec.is_some();
    if sends_token && config.cluster_url.scheme_str() == Some("http") {
        warnings.push("a bearer token is sent over plain http, readable on the way");
    }
    warnings
}

/// Every file the kubeconfig's chosen context names: the cluster's CA, the
/// user's token file, client certificate and key.
fn named_files<'k>(kubeconfig: &'k Kubeconfig, context: Option<&str>) -> Vec<(Role, &'k str)> {
    let Some(name) = context.or(kubeconfig.current_context.as_deref()) else {
        return Vec::new();
    };
    let Some(context) = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.as_ref())
    else {
        return Vec::new();
    };
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref());
    let user = context.user.as_ref().and_then(|user| {
        kubeconfig
            .auth_infos
            .iter()
            .find(|u| &u.name == user)
            .and_then(|u| u.auth_info.as_ref())
    });
    [
        (
            Role::CertificateAuthority,
            cluster.and_then(|c| c.certificate_authority.as_deref()),
        ),
        (Role::TokenFile, user.and_then(|u| u.token_file.as_deref())),
        (
            Role::ClientCertificate,
            user.and_then(|u| u.client_certificate.as_deref()),
        ),
        (Role::ClientKey, user.and_then(|u| u.client_key.as_deref())),
    ]
    .into_iter()
    .filter_map(|(role, path)| path.map(|p| (role, p)))
    .collect()
}

/// Builds every remote's kube configuration, in config order.
///
/// # Errors
///
/// The first remote's [`ConfigError`].
pub async fn resolve(config: &Config) -> Result<Vec<ResolvedRemote>, ConfigError> {
    let mut remotes = Vec::with_capacity(config.remotes.len());
    for (index, spec) in config.remotes.iter().enumerate() {
        remotes.push(resolve_one(config, index, spec).await?);
    }
    Ok(remotes)
}

/// The remotes as the probes take them.
#[must_use]
pub fn probed(remotes: &[ResolvedRemote]) -> Vec<Remote> {
    remotes.iter().map(ResolvedRemote::probed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planner_is_handed_the_remotes_without_their_files() {
        let config = Arc::new(kube::Config::new("https://a:6443".parse().expect("a URL")));
        let mut remote =
            ResolvedRemote::new("a", true, RemoteSource::Inferred, Arc::clone(&config))
                .expect("a server to probe");
        remote.files = vec![SourceFile::read(Role::TokenFile, "/nonexistent/token")];
        remote.generation = 7;
        let handed = handed(std::slice::from_ref(&remote));
        let [given] = handed.iter().collect::<Vec<_>>()[..] else {
            panic!("one remote handed, not {}", handed.len());
        };
        assert!(given.files.is_empty());
        assert_eq!(
            (given.name.as_str(), given.required, given.generation),
            ("a", true, 7)
        );
        assert!(
            Arc::ptr_eq(&given.config, &config),
            "the same settings, shared"
        );
        assert_eq!(given.source, remote.source);
        assert_eq!(
            remote.files.len(),
            1,
            "the daemon's own copy keeps its files"
        );
    }
}
