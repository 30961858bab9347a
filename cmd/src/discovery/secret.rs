//! One Secret read as a cluster, in each format fleets keep: a name and a
//! kubeconfig, or what is wrong with it, by field.
//!
//! A Secret's data is hostile text: whatever it holds is checked here, and
//! what is wrong is told by field, never by value. Its credentials go into
//! the kubeconfig and nowhere else.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::config::{AuthInfo, Cluster, Kubeconfig};
use serde::Deserialize;

use crate::config::SecretFormat;

/// The Cluster API label that names a kubeconfig Secret's cluster.
pub(super) const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";

/// A cluster a Secret describes.
#[derive(Clone)]
pub struct Found {
    /// The remote's name.
    pub name: String,
    /// How to reach it, credentials included (never logged).
    pub kubeconfig: Kubeconfig,
}

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Found")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Why a Secret is skipped: the field, and what is wrong with it. Neither
/// holds the Secret's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// `data.config`, `data.config.tlsClientConfig.caData`, `name`, ...
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn skipped(field: impl Into<String>, message: impl Into<String>) -> Skipped {
    Skipped {
        field: field.into(),
        message: message.into(),
    }
}

/// What `secret` describes as `format`: a cluster, or `None` for a Secret
/// the format passes over (Cluster API's other Secrets of a cluster, such
/// as `<cluster>-user-kubeconfig`).
///
/// # Errors
///
/// [`Skipped`], naming the field that is wrong.
pub fn read(format: SecretFormat, secret: &Secret) -> Result<Option<Found>, Skipped> {
    let secret_name = secret.metadata.name.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let found = match format {
        SecretFormat::ArgoCd => {
            let name = text(data, "name")?;
            Found {
                kubeconfig: argocd(&name, data)?,
                name,
            }
        }
        SecretFormat::ClusterApi => {
            let Some(cluster) = secret
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(CLUSTER_NAME))
            else {
                return Ok(None);
            };
            if secret_name != format!("{cluster}-kubeconfig") {
                return Ok(None);
            }
            Found {
                name: cluster.clone(),
                kubeconfig: kubeconfig(data, "value")?,
            }
        }
        SecretFormat::Kubeconfig => Found {
            name: secret_name.to_owned(),
            kubeconfig: kubeconfig(data, "kubeconfig")?,
        },
    };
    let field = if format == SecretFormat::ArgoCd {
        "data.name"
    } else {
        "metadata.name"
    };
    if !crate::config::valid_name(&found.name) {
        return Err(skipped(
            field,
            "the remote's name must be 1-63 lower-case letters, digits, '-', '.' or '_'",
        ));
    }
    no_files_or_plugins(&found.kubeconfig)?;
    Ok(Some(found))
}

/// The value of `key`, as UTF-8 text.
fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Result<String, Skipped> {
    let field = format!("data.{key}");
    let bytes = data.get(key).ok_or_else(|| skipped(&field, "is missing"))?;
    String::from_utf8(bytes.0.clone()).map_err(|_| skipped(&field, "is not UTF-8 text"))
}

/// The kubeconfig under `key`.
fn kubeconfig(data: &BTreeMap<String, ByteString>, key: &str) -> Result<Kubeconfig, Skipped> {
    let text = text(data, key)?;
    Kubeconfig::from_yaml(&text).map_err(|err| {
        // serde's message may quote the text it choked on: the line and
        // column only.
        let at = err
            .to_string()
            .rsplit_once(" at line ")
            .map(|(_, at)| format!(" (at line {at})"))
            .unwrap_or_default();
        skipped(
            format!("data.{key}"),
            format!(
                "is not a kubeconfig{}",
                tether_supervisor::printable(&at, 40)
            ),
        )
    })
}

/// Argo CD's `config`: how to reach and log in to the cluster.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ArgoConfig {
    username: Option<String>,
    password: Option<String>,
    bearer_token: Option<String>,
    #[serde(default)]
    tls_client_config: ArgoTls,
    aws_auth_config: Option<serde_json::Value>,
    exec_provider_config: Option<serde_json::Value>,
    proxy_url: Option<String>,
    disable_compression: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ArgoTls {
    #[serde(default)]
    insecure: bool,
    server_name: Option<String>,
    ca_data: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
}

/// The kubeconfig an Argo CD cluster Secret describes.
fn argocd(name: &str, data: &BTreeMap<String, ByteString>) -> Result<Kubeconfig, Skipped> {
    let server = text(data, "server")?;
    let config: ArgoConfig = match data.get("config") {
        None => return Err(skipped("data.config", "is missing")),
        Some(bytes) => serde_json::from_slice(&bytes.0).map_err(|err| {
            skipped(
                "data.config",
                format!(
                    "is not Argo CD's cluster config JSON (at line {} column {}: {})",
                    err.line(),
                    err.column(),
                    classify(&err)
                ),
            )
        })?,
    };
    for (field, set) in [
        ("awsAuthConfig", config.aws_auth_config.is_some()),
        ("execProviderConfig", config.exec_provider_config.is_some()),
    ] {
        if set {
            return Err(skipped(format!("data.config.{field}"), PLUGIN));
        }
    }
    let tls = &config.tls_client_config;
    let pem = |field: &str, value: &Option<String>| -> Result<Option<String>, Skipped> {
        let Some(value) = value else { return Ok(None) };
        base64::engine::general_purpose::STANDARD
            .decode(value.trim())
            .map_err(|_| {
                skipped(
                    format!("data.config.tlsClientConfig.{field}"),
                    "is not base64",
                )
            })?;
        Ok(Some(value.trim().to_owned()))
    };
    let cluster = Cluster {
        server: Some(server),
        insecure_skip_tls_verify: Some(tls.insecure),
        certificate_authority_data: pem("caData", &tls.ca_data)?,
        tls_server_name: tls.server_name.clone(),
        proxy_url: config.proxy_url.clone(),
        disable_compression: config.disable_compression,
        ..Cluster::default()
    };
    let user = AuthInfo {
        username: config.username.clone(),
        password: config.password.clone().map(Into::into),
        token: config.bearer_token.clone().map(Into::into),
        client_certificate_data: pem("certData", &tls.cert_data)?,
        client_key_data: pem("keyData", &tls.key_data)?.map(Into::into),
        ..AuthInfo::default()
    };
    Ok(crate::config::remote::single_kubeconfig(
        name, cluster, user,
    ))
}

/// What kind of JSON error, without serde's quote of the input.
fn classify(err: &serde_json::Error) -> &'static str {
    match err.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "a field of the wrong type",
        serde_json::error::Category::Eof => "cut short",
    }
}

/// Why a credential plugin named by a Secret is refused.
const PLUGIN: &str = "names a credential plugin, which tether does not run for a discovered cluster: anyone who can write the Secret could run a command in tether's pod; use a token or a client certificate";

/// A discovered kubeconfig carries its credentials inline: it may name no
/// file of tether's pod (a Secret's writer could point a token file at
/// tether's own service account token and a server of theirs) and no
/// credential plugin.
fn no_files_or_plugins(kubeconfig: &Kubeconfig) -> Result<(), Skipped> {
    for (i, cluster) in kubeconfig.clusters.iter().enumerate() {
        if cluster
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(skipped(
                format!("clusters[{i}].certificate-authority"),
                FILES,
            ));
        }
    }
    for (i, user) in kubeconfig.auth_infos.iter().enumerate() {
        let Some(auth) = &user.auth_info else {
            continue;
        };
        for (field, set) in [
            ("tokenFile", auth.token_file.is_some()),
            ("client-certificate", auth.client_certificate.is_some()),
            ("client-key", auth.client_key.is_some()),
        ] {
            if set {
                return Err(skipped(format!("users[{i}].{field}"), FILES));
            }
        }
        for (field, set) in [
            ("exec", auth.exec.is_some()),
            ("auth-provider", auth.auth_provider.is_some()),
        ] {
            if set {
                return Err(skipped(format!("users[{i}].{field}"), PLUGIN));
            }
        }
    }
    Ok(())
}

/// Why a file named by a Secret is refused.
const FILES: &str = "names a file; a discovered kubeconfig must carry its credentials inline (the *-data fields, or token)";

/// A Secret named `name`, with `labels` and `data`, for the tests.
#[cfg(test)]
pub(super) fn secret(name: &str, labels: &[(&str, &str)], data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    #[test]
    fn argo_cd_secrets_give_their_name_key_and_inline_credentials() {
        let s = secret(
            "cluster-10.0.0.1-123",
            &[],
            &[
                ("name", b"prod-1"),
                ("server", b"https://10.0.0.1:6443"),
                (
                    "config",
                    br#"{"bearerToken":"t0k","tlsClientConfig":{"insecure":false,"caData":"Zm9v","serverName":"api"}}"#,
                ),
            ],
        );
        let found = read(SecretFormat::ArgoCd, &s).unwrap().unwrap();
        assert_eq!(found.name, "prod-1");
        let cluster = found.kubeconfig.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Zm9v"));
        assert_eq!(cluster.tls_server_name.as_deref(), Some("api"));
        assert!(
            found.kubeconfig.auth_infos[0]
                .auth_info
                .as_ref()
                .unwrap()
                .token
                .is_some()
        );
        assert!(!format!("{found:?}").contains("t0k"));
    }

    #[test]
    fn each_bad_argo_cd_secret_names_its_field_and_never_its_data() {
        type Data<'a> = &'a [(&'a str, &'a [u8])];
        let cases: [(Data<'_>, &str); 6] = [
            (&[("server", b"https://a"), ("config", b"{}")], "data.name"),
            (&[("name", b"a"), ("config", b"{}")], "data.server"),
            (&[("name", b"a"), ("server", b"https://a")], "data.config"),
            (
                &[
                    ("name", b"a"),
                    ("server", b"https://a"),
                    ("config", b"{\"bearerToken\": \"s3cret"),
                ],
                "data.config",
            ),
            (
                &[
                    ("name", b"a"),
                    ("server", b"https://a"),
                    ("config", br#"{"tlsClientConfig":{"caData":"!!s3cret"}}"#),
                ],
                "data.config.tlsClientConfig.caData",
            ),
            (
                &[
                    ("name", b"a"),
                    ("server", b"https://a"),
                    ("config", br#"{"execProviderConfig":{"command":"s3cret"}}"#),
                ],
                "data.config.execProviderConfig",
            ),
        ];
        for (data, field) in cases {
            let err = read(SecretFormat::ArgoCd, &secret("x", &[], data)).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn cluster_api_takes_only_the_cluster_kubeconfig_secret_by_its_cluster_name() {
        let labels = [(CLUSTER_NAME, "prod-2")];
        let data: [(&str, &[u8]); 1] = [("value", KUBECONFIG.as_bytes())];
        let found = read(
            SecretFormat::ClusterApi,
            &secret("prod-2-kubeconfig", &labels, &data),
        )
        .unwrap()
        .unwrap();
        assert_eq!(found.name, "prod-2");
        assert!(
            read(
                SecretFormat::ClusterApi,
                &secret("prod-2-user-kubeconfig", &labels, &data)
            )
            .unwrap()
            .is_none()
        );
        let err = read(
            SecretFormat::ClusterApi,
            &secret(
                "prod-2-kubeconfig",
                &labels,
                &[("value", b"clusters: [s3cret")],
            ),
        )
        .unwrap_err();
        assert_eq!(err.field, "data.value");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn kubeconfig_secrets_go_by_the_secret_name_and_may_name_no_file_or_plugin() {
        let found = read(
            SecretFormat::Kubeconfig,
            &secret("edge-7", &[], &[("kubeconfig", KUBECONFIG.as_bytes())]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(found.name, "edge-7");
        let cases = [
            (
                KUBECONFIG.replace(
                    "certificate-authority-data: Zm9v",
                    "certificate-authority: /etc/passwd",
                ),
                "clusters[0].certificate-authority",
            ),
            (
                KUBECONFIG.replace(
                    "token: abc",
                    "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                ),
                "users[0].tokenFile",
            ),
            (
                KUBECONFIG.replace(
                    "token: abc",
                    "exec: {apiVersion: client.authentication.k8s.io/v1, command: sh}",
                ),
                "users[0].exec",
            ),
        ];
        for (text, field) in cases {
            let err = read(
                SecretFormat::Kubeconfig,
                &secret("edge-7", &[], &[("kubeconfig", text.as_bytes())]),
            )
            .unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        let err = read(
            SecretFormat::Kubeconfig,
            &secret("Edge_7", &[], &[("kubeconfig", KUBECONFIG.as_bytes())]),
        )
        .unwrap_err();
        assert_eq!(err.field, "metadata.name");
        let err = read(
            SecretFormat::Kubeconfig,
            &secret("edge-7", &[], &[("value", KUBECONFIG.as_bytes())]),
        )
        .unwrap_err();
        assert_eq!(err.field, "data.kubeconfig");
    }
}
