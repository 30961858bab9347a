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
use secrecy::SecretSlice;
use serde::Deserialize;

use crate::config::SecretFormat;

/// The Cluster API label that names a kubeconfig Secret's cluster.
pub(super) const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";

/// The most a value tether parses from a Secret may hold (a kubeconfig, or
/// Argo CD's `config`): 256 KiB. A kubeconfig that Cluster API or a
/// multicluster-runtime provider writes is a few KiB, a CA bundle of thirty
/// certificates about 60; a Secret may hold 1 MiB.
pub const MAX_VALUE: usize = 256 * 1024;

/// The most tether keeps of one discovered cluster's kubeconfig, as JSON:
/// 64 KiB. With the exec manager it is kept while the Secret is, and
/// written for the manager's process at each cycle; only what reaching the
/// cluster needs is kept (its current context, cluster and user, without
/// extensions).
pub const MAX_KEPT: usize = 64 * 1024;

/// A cluster a Secret describes.
#[derive(Clone)]
pub struct Found {
    /// The remote's name.
    pub name: String,
    /// How to reach it, credentials included (never logged).
    pub kubeconfig: Kubeconfig,
    /// `kubeconfig` as JSON (credentials included, never logged), at most
    /// [`MAX_KEPT`] bytes: what the exec manager's process is given.
    pub json: SecretSlice<u8>,
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
            let (kubeconfig, json) = argocd(&name, data)?;
            Found {
                name,
                kubeconfig,
                json,
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
            let (kubeconfig, json) = kubeconfig(data, "value")?;
            Found {
                name: cluster.clone(),
                kubeconfig,
                json,
            }
        }
        SecretFormat::Kubeconfig => {
            let (kubeconfig, json) = kubeconfig(data, "kubeconfig")?;
            Found {
                name: secret_name.to_owned(),
                kubeconfig,
                json,
            }
        }
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
    // A kubeconfig was checked for files and plugins as it was read, and
    // Argo CD's is built of inline fields alone.
    Ok(Some(found))
}

/// The field of a Secret of `format` that a remote's `field` (`server`, or
/// empty for the whole) was read from.
#[must_use]
pub fn field_of(format: SecretFormat, field: &str) -> String {
    match (format, field) {
        (SecretFormat::ArgoCd, "server") => "data.server",
        (SecretFormat::ArgoCd, _) => "data.config",
        (SecretFormat::ClusterApi, _) => "data.value",
        (SecretFormat::Kubeconfig, _) => "data.kubeconfig",
    }
    .to_owned()
}

/// The value of `key`, at most [`MAX_VALUE`] bytes.
fn value<'d>(data: &'d BTreeMap<String, ByteString>, key: &str) -> Result<&'d [u8], Skipped> {
    let field = format!("data.{key}");
    let bytes = &data
        .get(key)
        .ok_or_else(|| skipped(&field, "is missing"))?
        .0;
    if bytes.len() > MAX_VALUE {
        return Err(skipped(
            field,
            format!(
                "holds {}, over the {} KiB tether reads of one value",
                crate::human::bytes(bytes.len()),
                MAX_VALUE / 1024
            ),
        ));
    }
    Ok(bytes)
}

/// The value of `key`, as UTF-8 text.
fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Result<String, Skipped> {
    let bytes = value(data, key)?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| skipped(format!("data.{key}"), "is not UTF-8 text"))
}

/// What parsing one discovered kubeconfig may cost. client-go, Cluster API
/// and the multicluster-runtime providers never write YAML anchors, and an
/// alias is how a few KiB become tens of MiB once parsed: a discovered
/// kubeconfig may use none. Without them, what is parsed is bounded by the
/// text, itself at most [`MAX_VALUE`].
fn parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // The parser's errors would quote the text, credentials included.
        with_snippet: false,
        budget: serde_saphyr::budget! {
            max_aliases: 0,
            max_anchors: 0,
            max_documents: 8,
            max_depth: 32,
            max_nodes: 20_000,
            max_total_scalar_bytes: MAX_VALUE,
        },
    }
}

/// The kubeconfig under `key`: parsed within [`parse_options`], and only
/// what reaching the cluster needs kept, at most [`MAX_KEPT`]; and as JSON.
fn kubeconfig(data: &BTreeMap<String, ByteString>, key: &str) -> Result<Kept, Skipped> {
    let field = format!("data.{key}");
    let text = text(data, key)?;
    let documents: Vec<Kubeconfig> =
        serde_saphyr::from_multiple_with_options(&text, parse_options())
            .map_err(|err| skipped(&field, not_a_kubeconfig(&err)))?;
    let whole = documents
        .into_iter()
        .try_fold(Kubeconfig::default(), Kubeconfig::merge)
        .map_err(|_| skipped(&field, "is not a kubeconfig (its documents do not merge)"))?;
    no_files_or_plugins(&whole)?;
    let kept = essential(whole).map_err(|message| skipped(&field, message))?;
    within_kept(&field, kept)
}

/// A kubeconfig, and itself as JSON.
type Kept = (Kubeconfig, SecretSlice<u8>);

/// `kubeconfig` and its JSON, if that is at most [`MAX_KEPT`] bytes.
fn within_kept(field: &str, kubeconfig: Kubeconfig) -> Result<Kept, Skipped> {
    let json =
        serde_json::to_vec(&kubeconfig).map_err(|_| skipped(field, "cannot be kept as JSON"))?;
    if json.len() > MAX_KEPT {
        return Err(skipped(
            field,
            format!(
                "the cluster and user it describes take {}, over the {} KiB tether keeps of one cluster",
                crate::human::bytes(json.len()),
                MAX_KEPT / 1024
            ),
        ));
    }
    Ok((kubeconfig, json.into()))
}

/// Why `err` is no kubeconfig, without the parser's quote of the text it
/// choked on: a bound passed, or the line and column.
fn not_a_kubeconfig(err: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach;

    let mut inner = err;
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = inner
    {
        inner = error;
    }
    match inner {
        serde_saphyr::Error::Budget {
            breach: BudgetBreach::Aliases { .. } | BudgetBreach::Anchors { .. },
            ..
        } => "uses YAML anchors or aliases, which a discovered kubeconfig may not (each alias is a copy once parsed)".to_owned(),
        serde_saphyr::Error::Budget { .. } => "is not a kubeconfig: it passes a bound on what one may cost to parse (documents, depth, nodes)".to_owned(),
        _ => match err.location() {
            Some(at) => format!(
                "is not a kubeconfig (at line {} column {})",
                at.line(),
                at.column()
            ),
            None => "is not a kubeconfig".to_owned(),
        },
    }
}

/// Of `kubeconfig`, what reaching its current context's cluster takes: that
/// context, its cluster and its user, without extensions or preferences.
/// Whatever else it holds is neither kept nor written for the exec
/// manager's process.
fn essential(kubeconfig: Kubeconfig) -> Result<Kubeconfig, String> {
    let current = kubeconfig
        .current_context
        .ok_or("is not a kubeconfig tether can use: it has no current-context")?;
    let context = kubeconfig
        .contexts
        .into_iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context)
        .ok_or("its current-context names a context it does not have")?;
    let mut cluster = kubeconfig
        .clusters
        .into_iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster)
        .ok_or("its current context names a cluster it does not have")?;
    cluster.extensions = None;
    let mut user = match &context.user {
        None => AuthInfo::default(),
        Some(name) => kubeconfig
            .auth_infos
            .into_iter()
            .find(|u| &u.name == name)
            .and_then(|u| u.auth_info)
            .ok_or("its current context names a user it does not have")?,
    };
    user.extensions = None;
    let mut kept = crate::config::remote::single_kubeconfig(&current, cluster, user);
    if let Some(kept_context) = kept.contexts.first_mut().and_then(|c| c.context.as_mut()) {
        kept_context.namespace = context.namespace;
    }
    Ok(kept)
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
    aws_auth_config: Option<serde::de::IgnoredAny>,
    exec_provider_config: Option<serde::de::IgnoredAny>,
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
fn argocd(name: &str, data: &BTreeMap<String, ByteString>) -> Result<Kept, Skipped> {
    let server = text(data, "server")?;
    let config: ArgoConfig = serde_json::from_slice(value(data, "config")?).map_err(|err| {
        skipped(
            "data.config",
            format!(
                "is not Argo CD's cluster config JSON (at line {} column {}: {})",
                err.line(),
                err.column(),
                classify(&err)
            ),
        )
    })?;
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
    within_kept(
        "data.config",
        crate::config::remote::single_kubeconfig(name, cluster, user),
    )
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
    use secrecy::ExposeSecret as _;

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

    /// A kubeconfig of `KUBECONFIG`'s cluster, with `extensions` that
    /// expand by `fan`-fold at each of `levels` anchors once parsed.
    fn alias_bomb(levels: usize, fan: usize) -> String {
        use std::fmt::Write as _;

        let mut text = String::from(
            "apiVersion: v1\nkind: Config\nextensions:\n- name: bomb\n  extension:\n    l0: &l0 \"0123456789012345678901234567890123456789012345678901234567890123\"\n",
        );
        for level in 1..=levels {
            let refs = vec![format!("*l{}", level - 1); fan].join(", ");
            let _ = writeln!(text, "    l{level}: &l{level} [{refs}]");
        }
        text.push_str(&KUBECONFIG.replace("apiVersion: v1\nkind: Config\n", ""));
        text
    }

    #[test]
    fn a_kubeconfig_with_yaml_aliases_is_skipped_before_it_expands() {
        let bomb = alias_bomb(4, 12);
        assert!(bomb.len() < 5 * 1024, "{} bytes", bomb.len());
        // What kube's own reader makes of it: 12^4 copies of a 64-byte
        // string, 1.5 MB as JSON from 651 bytes (the issue's Secret: 55 MB
        // from 5 KB).
        let expanded = Kubeconfig::from_yaml(&bomb).expect("kube reads it");
        let size = serde_json::to_vec(&expanded).expect("json").len();
        assert!(size > 1000 * bomb.len(), "{size} bytes from {}", bomb.len());
        println!(
            "alias bomb: {} bytes of YAML, {size} bytes once kube parses it",
            bomb.len()
        );
        let err = read(
            SecretFormat::Kubeconfig,
            &secret("edge-7", &[], &[("kubeconfig", bomb.as_bytes())]),
        )
        .unwrap_err();
        assert_eq!(err.field, "data.kubeconfig", "{err}");
        assert!(err.message.contains("aliases"), "{err}");
    }

    #[test]
    fn only_what_reaches_the_current_cluster_is_kept() {
        let text = format!(
            "{KUBECONFIG}extensions: [{{name: e, extension: {{big: \"{}\"}}}}]\npreferences: {{colors: true}}\n",
            "x".repeat(100_000)
        )
        .replace(
            "clusters:\n",
            "clusters:\n- name: other\n  cluster: {server: \"https://10.9.9.9\", extensions: [{name: e, extension: {a: b}}]}\n",
        );
        let found = read(
            SecretFormat::Kubeconfig,
            &secret("edge-7", &[], &[("kubeconfig", text.as_bytes())]),
        )
        .unwrap()
        .unwrap();
        let json = found.json.expose_secret();
        assert!(json.len() < 1024, "{} bytes kept", json.len());
        // The JSON is the kubeconfig kept, whole: what the exec manager's
        // process reads.
        let kept: Kubeconfig = serde_json::from_slice(json).expect("a kubeconfig");
        assert_eq!(
            serde_json::to_value(&kept).expect("json"),
            serde_json::to_value(&found.kubeconfig).expect("json")
        );
        assert_eq!(kept.clusters.len(), 1);
        assert_eq!(kept.auth_infos.len(), 1);
        assert_eq!(kept.contexts.len(), 1);
        assert!(kept.extensions.is_none() && kept.preferences.is_none());
        let cluster = kept.clusters[0].cluster.as_ref().expect("its cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
    }

    #[test]
    fn a_value_or_a_cluster_past_its_bound_is_skipped_by_field() {
        let huge = format!("{KUBECONFIG}# {}\n", "x".repeat(MAX_VALUE));
        let err = read(
            SecretFormat::ClusterApi,
            &secret(
                "prod-2-kubeconfig",
                &[(CLUSTER_NAME, "prod-2")],
                &[("value", huge.as_bytes())],
            ),
        )
        .unwrap_err();
        assert_eq!(err.field, "data.value", "{err}");
        assert!(err.message.contains("256 KiB"), "{err}");
        // Under the input's bound, past what tether keeps of a cluster.
        let ca = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 100 * 1024]);
        let config = format!(r#"{{"bearerToken":"t","tlsClientConfig":{{"caData":"{ca}"}}}}"#);
        let err = read(
            SecretFormat::ArgoCd,
            &secret(
                "cluster-x",
                &[],
                &[
                    ("name", b"x"),
                    ("server", b"https://10.0.0.1:6443"),
                    ("config", config.as_bytes()),
                ],
            ),
        )
        .unwrap_err();
        assert_eq!(err.field, "data.config", "{err}");
        assert!(err.message.contains("64 KiB"), "{err}");
    }
}
