//! The `discovery` section: where remotes come from besides the static
//! list, checked as the rest of the file is.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use super::check::{Checker, kept};
use super::raw::RawDiscovery;
use super::{ConfigError, RemoteSpec, defaults, selector};

/// The name the home cluster's probe goes by: a remote's name, taken.
pub const HOME: &str = "home";

/// How the home cluster's Secrets describe a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SecretFormat {
    /// Argo CD's cluster Secrets: `name`, `server` and a JSON `config`.
    ArgoCd,
    /// Cluster API's `<cluster>-kubeconfig` Secrets: a kubeconfig under
    /// `value`.
    ClusterApi,
    /// multicluster-runtime's kubeconfig provider: a kubeconfig under
    /// `kubeconfig`.
    Kubeconfig,
}

impl SecretFormat {
    const ALL: [(&'static str, Self); 3] = [
        ("argocd", Self::ArgoCd),
        ("clusterapi", Self::ClusterApi),
        ("kubeconfig", Self::Kubeconfig),
    ];

    /// As the config writes it: `argocd`, `clusterapi`, `kubeconfig`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ArgoCd => "argocd",
            Self::ClusterApi => "clusterapi",
            Self::Kubeconfig => "kubeconfig",
        }
    }

    /// The label every Secret of this format carries, as a selector.
    #[must_use]
    pub fn own_selector(self) -> &'static str {
        match self {
            Self::ArgoCd => "argocd.argoproj.io/secret-type=cluster",
            Self::ClusterApi => "cluster.x-k8s.io/cluster-name",
            Self::Kubeconfig => "sigs.k8s.io/multicluster-runtime-kubeconfig=true",
        }
    }
}

impl fmt::Display for SecretFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One source of discovered remotes: the Secrets of one format in one
/// namespace of the home cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySpec {
    /// The namespace its Secrets are in.
    pub namespace: String,
    /// How they describe a cluster.
    pub format: SecretFormat,
    /// Required beside the format's own label.
    pub label_selector: Option<String>,
    /// Whether the remotes it finds are required.
    pub required: bool,
    /// The home cluster's kubeconfig; `None`: in-cluster in a pod, else
    /// the current kubeconfig context.
    pub kubeconfig: Option<PathBuf>,
}

impl DiscoverySpec {
    /// The label selector the Secrets are listed with: the format's own
    /// label and the configured one.
    #[must_use]
    pub fn selector(&self) -> String {
        match &self.label_selector {
            Some(more) => format!("{},{more}", self.format.own_selector()),
            None => self.format.own_selector().to_owned(),
        }
    }

    /// The `source` label, and how logs and `/status` name it:
    /// `<namespace>/<format>`.
    #[must_use]
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.format)
    }
}

/// A namespace's name: a DNS label.
fn valid_namespace(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-')
}

impl Checker<'_> {
    /// The `discovery` list: each source checked, every mistake at once.
    pub(super) fn discovery(
        &self,
        raw: Vec<RawDiscovery>,
        remotes: Option<&[RemoteSpec]>,
    ) -> Result<Vec<DiscoverySpec>, ConfigError> {
        let mut errors = Vec::new();
        let mut sources: Vec<DiscoverySpec> = Vec::with_capacity(raw.len());
        let mut seen = BTreeMap::new();
        for (i, source) in raw.into_iter().enumerate() {
            let Some(source) = kept(&mut errors, self.source(i, source)) else {
                continue;
            };
            if let Some(first) = seen.insert((source.namespace.clone(), source.format), i) {
                errors.push(self.error(
                    format!("discovery[{i}]"),
                    format!(
                        "discovery[{first}] already reads {} Secrets in {:?}: one source per namespace and format (a label selector's `key in (a, b)` covers several values)",
                        source.format, source.namespace
                    ),
                ));
                continue;
            }
            if let Some(first) = sources.first()
                && first.kubeconfig != source.kubeconfig
            {
                errors.push(self.error(
                    format!("discovery[{i}].kubeconfig"),
                    "must be the same as discovery[0].kubeconfig: every source reads the one home cluster",
                ));
                continue;
            }
            sources.push(source);
        }
        if !sources.is_empty()
            && let Some(i) = remotes
                .unwrap_or_default()
                .iter()
                .position(|r| r.name == HOME)
        {
            errors.push(self.error(
                format!("remotes[{i}].name"),
                format!(
                    "{HOME:?} is the home cluster's name while discovery is on; rename this remote"
                ),
            ));
        }
        match ConfigError::all(errors) {
            Some(errors) => Err(errors),
            None => Ok(sources),
        }
    }

    fn source(&self, i: usize, raw: RawDiscovery) -> Result<DiscoverySpec, ConfigError> {
        let at = |field: &str| format!("discovery[{i}].{field}");
        let secrets = raw.secrets.ok_or_else(|| {
            self.error(
                format!("discovery[{i}]"),
                "needs secrets: {namespace, format}",
            )
        })?;
        let namespace = secrets
            .namespace
            .ok_or_else(|| self.error(at("secrets.namespace"), "is required: the namespace whose Secrets are read (one per source, so that tether's RBAC stays namespaced)"))?;
        if !valid_namespace(&namespace) {
            return Err(self.error(
                at("secrets.namespace"),
                format!("{namespace:?} is not a namespace name (1-63 lower-case letters, digits and '-')"),
            ));
        }
        let known = || {
            SecretFormat::ALL
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let given = secrets.format.ok_or_else(|| {
            self.error(
                at("secrets.format"),
                format!("is required: one of {}", known()),
            )
        })?;
        let format = SecretFormat::ALL
            .iter()
            .find(|(name, _)| *name == given)
            .map(|(_, format)| *format)
            .ok_or_else(|| {
                self.error(
                    at("secrets.format"),
                    format!("{given:?} is not a format tether reads: one of {}", known()),
                )
            })?;
        let label_selector = secrets.label_selector.filter(|s| !s.trim().is_empty());
        if let Some(selector) = &label_selector {
            selector::check(selector).map_err(|reason| {
                self.error(
                    at("secrets.labelSelector"),
                    format!("{selector:?} is not a label selector: {reason}"),
                )
            })?;
        }
        let kubeconfig = secrets
            .kubeconfig
            .filter(|path| !path.is_empty())
            .map(|path| self.existing_file(&at("secrets.kubeconfig"), &path))
            .transpose()?;
        Ok(DiscoverySpec {
            namespace,
            format,
            label_selector,
            required: secrets.required.unwrap_or(defaults::DISCOVERED_REQUIRED),
            kubeconfig,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.yaml", Path::new("."))
    }

    #[test]
    fn a_source_alone_is_a_config_and_its_selector_adds_the_formats_label() {
        let config = parse(
            "discovery:\n- secrets: {namespace: argocd, format: argocd, labelSelector: \"env=prod\", required: false}\n",
        )
        .expect("valid");
        let source = &config.discovery[0];
        assert!(config.remotes.is_empty());
        assert_eq!(source.format, SecretFormat::ArgoCd);
        assert!(!source.required);
        assert_eq!(source.kubeconfig, None);
        assert_eq!(
            source.selector(),
            "argocd.argoproj.io/secret-type=cluster,env=prod"
        );
        assert_eq!(source.label(), "argocd/argocd");
    }

    #[test]
    fn every_bad_source_is_named_by_its_field() {
        let cases = [
            (
                "- secrets: {format: argocd}",
                "discovery[0].secrets.namespace",
            ),
            (
                "- secrets: {namespace: Argo, format: argocd}",
                "discovery[0].secrets.namespace",
            ),
            (
                "- secrets: {namespace: a, format: argo}",
                "discovery[0].secrets.format",
            ),
            ("- secrets: {namespace: a}", "discovery[0].secrets.format"),
            (
                "- secrets: {namespace: a, format: kubeconfig, labelSelector: \"a in b\"}",
                "discovery[0].secrets.labelSelector",
            ),
            (
                "- secrets: {namespace: a, format: kubeconfig, kubeconfig: /no/such/file}",
                "discovery[0].secrets.kubeconfig",
            ),
            (
                "- secrets: {namespace: a, format: kubeconfig}\n- secrets: {namespace: a, format: kubeconfig}",
                "discovery[1]",
            ),
            (
                "- secrets: {namespace: a, format: kubeconfig}\n- secrets: {namespace: b, format: kubeconfig, kubeconfig: Cargo.toml}",
                "discovery[1].kubeconfig",
            ),
            ("- {}", "discovery[0]"),
        ];
        for (sources, field) in cases {
            let err = parse(&format!("discovery:\n{sources}\n")).expect_err(sources);
            assert_eq!(err.field, field, "{err}");
        }
        let err = parse(
            "remotes: [{name: home, server: \"https://h:6443\"}]\ndiscovery: [{secrets: {namespace: a, format: argocd}}]\n",
        )
        .expect_err("home is taken");
        assert_eq!(err.field, "remotes[0].name");
        assert!(err.message.contains("home cluster"), "{err}");
    }
}
