//! Who a remote is: its normalized URL, TLS server name, CA bundle, proxy,
//! and the credentials it presents. Remotes that share an identity are
//! probed once.

use std::fmt;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::Arc;

use http::Uri;

use crate::{Error, Result};

/// A configured remote: its unique name (the `remote` label) and the kube
/// configuration that reaches it.
#[derive(Clone)]
pub struct Remote {
    /// The configured name, unique in the configuration.
    pub name: String,
    /// How to reach it, credentials included; shared with whatever else
    /// connects to it (the manager), not copied per user.
    pub config: Arc<kube::Config>,
    /// `config`'s identity, when whoever read `config` worked it out
    /// ([`Remote::with_identity`]): a set that is synced again and again
    /// then does not work it out for each remote each time.
    identity: Option<Arc<Identity>>,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the credentials in the config.
        f.debug_struct("Remote")
            .field("name", &self.name)
            .field("server", &host_port(&self.config.cluster_url))
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// A remote named `name`, reached through `config`.
    #[must_use]
    pub fn new(name: impl Into<String>, config: impl Into<Arc<kube::Config>>) -> Self {
        Self {
            name: name.into(),
            config: config.into(),
            identity: None,
        }
    }

    /// A remote named `name`, reached through `config`, whose identity is
    /// `identity` ([`Identity::of`] `config`, worked out when it was read).
    #[must_use]
    pub fn with_identity(
        name: impl Into<String>,
        config: Arc<kube::Config>,
        identity: Arc<Identity>,
    ) -> Self {
        debug_assert!(
            Identity::of(&config).is_ok_and(|i| i == *identity),
            "the identity given is not the config's"
        );
        Self {
            name: name.into(),
            config,
            identity: Some(identity),
        }
    }

    /// Its identity: the one it was made with, or worked out now.
    ///
    /// # Errors
    ///
    /// [`Error::Remote`], if its server URL cannot be normalized.
    pub fn identity(&self) -> Result<Arc<Identity>> {
        match &self.identity {
            Some(identity) => Ok(Arc::clone(identity)),
            None => Identity::of(&self.config)
                .map(Arc::new)
                .map_err(|source| Error::Remote {
                    name: self.name.clone(),
                    source: Box::new(source),
                }),
        }
    }
}

/// The identity of an apiserver endpoint, for dedupe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// `scheme://host:port/path`, lower-cased host, explicit port, no
    /// trailing slash, no userinfo.
    pub url: String,
    /// The TLS server name override, if any.
    pub tls_server_name: Option<String>,
    /// A hash of the trusted CA bundle; 0 when there is none.
    pub ca_hash: u64,
    /// The proxy URL, without userinfo.
    pub proxy: Option<String>,
    /// Whether the server's certificate goes unverified: a remote that
    /// verifies and one that does not can disagree on reachability.
    pub insecure: bool,
    /// A hash of the client certificate presented (its file or its data);
    /// 0 when there is none. A server that checks client certificates can
    /// accept one and refuse another.
    pub client_cert_hash: u64,
    /// A hash of every other credential (token, token file, basic auth,
    /// exec plugin, auth provider, impersonation); 0 when there is none.
    /// Remotes that reach one apiserver as different users are probed
    /// apart: a failure to make one's credentials is its own local error,
    /// never the other's, and neither decides for the other. Never shown.
    pub credentials_hash: u64,
}

/// A hash of the credentials in `auth` other than the client certificate.
fn credentials_hash(auth: &kube::config::AuthInfo) -> u64 {
    let mut hasher = DefaultHasher::new();
    auth.username.hash(&mut hasher);
    auth.password
        .as_ref()
        .map(secrecy::ExposeSecret::expose_secret)
        .hash(&mut hasher);
    auth.token
        .as_ref()
        .map(secrecy::ExposeSecret::expose_secret)
        .hash(&mut hasher);
    auth.token_file.hash(&mut hasher);
    auth.impersonate.hash(&mut hasher);
    auth.impersonate_uid.hash(&mut hasher);
    auth.impersonate_groups.hash(&mut hasher);
    if let Some(exec) = &auth.exec {
        exec.api_version.hash(&mut hasher);
        exec.command.hash(&mut hasher);
        exec.args.hash(&mut hasher);
        exec.drop_env.hash(&mut hasher);
        for env in exec.env.iter().flatten() {
            let sorted: std::collections::BTreeMap<_, _> = env.iter().collect();
            sorted.hash(&mut hasher);
        }
    }
    if let Some(provider) = &auth.auth_provider {
        provider.name.hash(&mut hasher);
        let sorted: std::collections::BTreeMap<_, _> = provider.config.iter().collect();
        sorted.hash(&mut hasher);
    }
    let any = auth.username.is_some()
        || auth.password.is_some()
        || auth.token.is_some()
        || auth.token_file.is_some()
        || auth.impersonate.is_some()
        || auth.impersonate_uid.is_some()
        || auth.impersonate_groups.is_some()
        || auth.exec.is_some()
        || auth.auth_provider.is_some();
    if any { hasher.finish() } else { 0 }
}

/// `host:port` of `uri`, with no userinfo, ever.
#[must_use]
pub fn host_port(uri: &Uri) -> String {
    let host = uri.host().unwrap_or("").to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    if host.contains(':') {
        // An IPv6 literal keeps its brackets.
        if host.starts_with('[') {
            format!("{host}:{port}")
        } else {
            format!("[{host}]:{port}")
        }
    } else {
        format!("{host}:{port}")
    }
}

/// Normalizes `uri`: scheme, lower-cased host, explicit port, path without a
/// trailing slash, no userinfo.
///
/// # Errors
///
/// [`Error::InvalidUrl`] if it has no scheme or host, or a scheme other
/// than `http` or `https`.
pub fn normalize_url(uri: &Uri) -> Result<String> {
    let scheme = uri
        .scheme_str()
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| Error::InvalidUrl("no scheme".to_owned()))?;
    if scheme != "http" && scheme != "https" {
        return Err(Error::InvalidUrl(format!(
            "scheme {scheme:?} is not http or https"
        )));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(Error::InvalidUrl("no host".to_owned()));
    }
    // `http::Uri` keeps a port it cannot read as a number and reports none;
    // probing the scheme's default instead would probe something else.
    if let Some(authority) = uri.authority() {
        let host_port = authority
            .as_str()
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, rest)| rest);
        if let Some((_, port)) = host_port.rsplit_once(':')
            && !port.ends_with(']')
            && !port.is_empty()
            && port.parse::<u16>().map_or(true, |p| p == 0)
        {
            return Err(Error::InvalidUrl(format!(
                "port {port} is not a port (1-65535)"
            )));
        }
    }
    let path = uri.path().trim_end_matches('/');
    Ok(format!("{scheme}://{}{path}", host_port(uri)))
}

impl Identity {
    /// The identity of the endpoint `config` reaches.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] if the server URL cannot be normalized.
    pub fn of(config: &kube::Config) -> Result<Self> {
        let ca_hash = config.root_cert.as_ref().map_or(0, |certs| {
            let mut hasher = DefaultHasher::new();
            certs.hash(&mut hasher);
            hasher.finish()
        });
        let auth = &config.auth_info;
        let client_cert_hash = match (&auth.client_certificate, &auth.client_certificate_data) {
            (None, None) => 0,
            (file, data) => {
                let mut hasher = DefaultHasher::new();
                file.hash(&mut hasher);
                data.hash(&mut hasher);
                hasher.finish()
            }
        };
        Ok(Self {
            url: normalize_url(&config.cluster_url)?,
            tls_server_name: config.tls_server_name.clone(),
            ca_hash,
            proxy: config.proxy_url.as_ref().map(host_port_with_scheme),
            insecure: config.accept_invalid_certs,
            client_cert_hash,
            credentials_hash: credentials_hash(auth),
        })
    }

    /// The `host` label: `host:port`.
    #[must_use]
    pub fn host(&self) -> &str {
        let rest = self
            .url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, r)| r);
        rest.split_once('/').map_or(rest, |(h, _)| h)
    }
}

fn host_port_with_scheme(uri: &Uri) -> String {
    format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        host_port(uri)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        normalize_url(&s.parse().expect("valid URI")).expect("normalizes")
    }

    #[test]
    fn urls_normalize_to_one_form() {
        assert_eq!(
            norm("https://API.Example.COM"),
            "https://api.example.com:443"
        );
        assert_eq!(
            norm("https://api.example.com:443/"),
            "https://api.example.com:443"
        );
        assert_eq!(norm("http://10.0.0.7/"), "http://10.0.0.7:80");
        assert_eq!(norm("HTTPS://h:6443/prefix/"), "https://h:6443/prefix");
        assert_eq!(norm("https://[::1]:6443"), "https://[::1]:6443");
    }

    #[test]
    fn userinfo_never_reaches_the_host_label() {
        let uri: Uri = "https://admin:hunter2@api.example.com:6443/"
            .parse()
            .expect("valid");
        assert_eq!(host_port(&uri), "api.example.com:6443");
        assert_eq!(
            norm("https://admin:hunter2@api.example.com:6443"),
            "https://api.example.com:6443"
        );
    }

    #[test]
    fn bad_urls_are_rejected() {
        for bad in [
            "ftp://h",
            "/just/a/path",
            "https://h:99999",
            "https://h:65536/x",
        ] {
            let uri: Uri = bad.parse().expect("parses as a URI");
            assert!(normalize_url(&uri).is_err(), "{bad}");
        }
    }

    #[test]
    fn identity_separates_ca_bundles_and_server_names() {
        let config = |url: &str| kube::Config::new(url.parse().expect("valid"));
        let a = Identity::of(&config("https://h:6443")).expect("valid");
        let b = Identity::of(&config("https://H:6443/")).expect("valid");
        assert_eq!(a, b);
        assert_eq!(a.host(), "h:6443");
        let mut with_ca = config("https://h:6443");
        with_ca.root_cert = Some(vec![vec![1, 2, 3]]);
        assert_ne!(Identity::of(&with_ca).expect("valid"), a);
        let mut with_name = config("https://h:6443");
        with_name.tls_server_name = Some("kubernetes".into());
        assert_ne!(Identity::of(&with_name).expect("valid"), a);
    }

    #[test]
    fn identity_separates_verification_and_client_certificates() {
        let config = |url: &str| kube::Config::new(url.parse().expect("valid"));
        let verifying = Identity::of(&config("https://h:6443")).expect("valid");
        let mut insecure = config("https://h:6443");
        insecure.accept_invalid_certs = true;
        assert_ne!(Identity::of(&insecure).expect("valid"), verifying);
        let mut with_cert = config("https://h:6443");
        with_cert.auth_info.client_certificate_data = Some("LS0tLS1...".into());
        let mut other_cert = config("https://h:6443");
        other_cert.auth_info.client_certificate = Some("/etc/tether/b.crt".into());
        let (one, other) = (
            Identity::of(&with_cert).expect("valid"),
            Identity::of(&other_cert).expect("valid"),
        );
        assert_ne!(one, verifying);
        assert_ne!(one, other);
    }

    #[test]
    fn identity_separates_users_of_one_apiserver() {
        let config = |url: &str| kube::Config::new(url.parse().expect("valid"));
        let anonymous = Identity::of(&config("https://h:6443")).expect("valid");
        assert_eq!(anonymous.credentials_hash, 0);
        let with_token = |token: &str| {
            let mut c = config("https://h:6443");
            c.auth_info.token = Some(token.to_owned().into());
            Identity::of(&c).expect("valid")
        };
        assert_eq!(with_token("a"), with_token("a"), "one user is probed once");
        assert_ne!(with_token("a"), with_token("b"));
        assert_ne!(with_token("a"), anonymous);
        let with_plugin = |arg: &str| {
            let mut c = config("https://h:6443");
            c.auth_info.exec = Some(kube::config::ExecConfig {
                api_version: Some("client.authentication.k8s.io/v1".into()),
                command: Some("get-token".into()),
                args: Some(vec![arg.into()]),
                env: None,
                drop_env: None,
                interactive_mode: None,
                provide_cluster_info: false,
                cluster: None,
                install_hint: None,
                other: std::collections::BTreeMap::new(),
            });
            Identity::of(&c).expect("valid")
        };
        assert_ne!(with_plugin("--cluster=a"), with_plugin("--cluster=b"));
    }
}
