//! The process's own credentials for the home cluster
//! (`manager.exec.serviceAccount`): tether asks the TokenRequest API for a
//! short-lived token of the process's ServiceAccount (not bound to the pod:
//! the apiserver binds a token only to a pod that runs as its
//! ServiceAccount, and tether's runs as tether's), and writes it with a kubeconfig that reads it (`tokenFile`) into the
//! private folder the process shares. A token is replaced at 80% of its
//! life, as the kubelet replaces a projected one; client-go reads a
//! `tokenFile` again every minute, so the process needs no restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use kube::config::{AuthInfo, Cluster};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::remotes::replace_private_file;
use crate::config::ServiceAccountSpec;
use crate::config::remote::single_kubeconfig;

/// How long one request to the home cluster may take.
const REQUEST_WITHIN: Duration = Duration::from_secs(10);

/// How soon a failed replacement is tried again, while the token in use
/// still lasts.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The kubeconfig's file name in the folder: a leading dot, which no
/// remote's name has.
const KUBECONFIG: &str = ".home-kubeconfig";
/// The token's.
const TOKEN: &str = ".home-token";

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub(super) enum TokenError {
    /// The home cluster is not known (not in a pod, no `KUBECONFIG`).
    #[error("cannot find the home cluster for manager.exec.serviceAccount")]
    Home(#[source] kube::config::InferConfigError),
    /// Its client cannot be made.
    #[error("cannot make a client for the home cluster")]
    Client(#[source] tether_probes::client::BuildError),
    /// Its client cannot be made.
    #[error("cannot make a client for the home cluster")]
    Kube(#[source] kube::Error),
    /// The TokenRequest failed (RBAC: `create` on `serviceaccounts/token`).
    #[error("cannot request a token for ServiceAccount {account} (manager.exec.serviceAccount)")]
    Request {
        /// `namespace/name`.
        account: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// It did not answer in time.
    #[error(
        "the home cluster did not answer a TokenRequest for {account} within {REQUEST_WITHIN:?}"
    )]
    Timeout {
        /// `namespace/name`.
        account: String,
    },
    /// It answered without a token.
    #[error("the TokenRequest for {0} came back without a token")]
    Empty(String),
    /// The files cannot be written.
    #[error("cannot write the process's home kubeconfig")]
    Write(#[source] std::io::Error),
}

/// The process's home token and kubeconfig in `dir`, and when to replace
/// them.
#[derive(Debug)]
pub(super) struct HomeToken {
    dir: PathBuf,
    /// When the token in use should be replaced.
    refresh_at: Instant,
}

impl HomeToken {
    /// Requests the first token for `spec` and writes it, with its
    /// kubeconfig, into `dir`.
    pub(super) async fn start(dir: &Path, spec: &ServiceAccountSpec) -> Result<Self, TokenError> {
        let mut token = Self {
            dir: dir.to_owned(),
            refresh_at: Instant::now(),
        };
        token.renew(spec).await?;
        Ok(token)
    }

    /// The kubeconfig the process is given (`KUBECONFIG`).
    pub(super) fn kubeconfig(&self) -> PathBuf {
        self.dir.join(KUBECONFIG)
    }

    /// Replaces the token at 80% of each one's life, for as long as it
    /// runs. A failure is logged, and tried again after [`RETRY_AFTER`]:
    /// the token in use still works for a fifth of its life.
    pub(super) async fn keep_renewed(mut self, spec: ServiceAccountSpec) {
        loop {
            tokio::time::sleep_until(self.refresh_at).await;
            match self.renew(&spec).await {
                Ok(()) => debug!(account = %spec.name, "the process's home token replaced"),
                Err(err) => {
                    warn!(error = %tether_supervisor::error_chain(&err), retry = ?RETRY_AFTER, "cannot replace the process's home token; the one it has still works until it expires");
                }
            }
        }
    }

    /// Requests a token and writes it with its kubeconfig. On failure the
    /// one in use (if any) stays, and the next try is [`RETRY_AFTER`] away.
    async fn renew(&mut self, spec: &ServiceAccountSpec) -> Result<(), TokenError> {
        let asked = Instant::now();
        match self.request(spec).await {
            Ok(lasts) => {
                self.refresh_at = asked + lasts.mul_f64(0.8);
                Ok(())
            }
            Err(err) => {
                self.refresh_at = Instant::now() + RETRY_AFTER;
                Err(err)
            }
        }
    }

    /// One TokenRequest, and the files: how long the token lasts.
    async fn request(&self, spec: &ServiceAccountSpec) -> Result<Duration, TokenError> {
        let config = kube::Config::infer().await.map_err(TokenError::Home)?;
        let namespace = spec
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let account = format!("{namespace}/{}", spec.name);
        let kubeconfig = kubeconfig(&config, &self.dir.join(TOKEN))
            .map_err(|err| TokenError::Write(err.into()))?;
        let client = crate::lease::bounded_client(config, REQUEST_WITHIN)
            .await
            .map_err(TokenError::Client)?
            .map_err(TokenError::Kube)?;
        let asked = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(
                    i64::try_from(spec.expiration.as_secs()).unwrap_or(i64::MAX),
                ),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(client, &namespace);
        let answer = tokio::time::timeout(
            REQUEST_WITHIN,
            api.create_token_request(&spec.name, &PostParams::default(), &asked),
        )
        .await
        .map_err(|_| TokenError::Timeout {
            account: account.clone(),
        })?
        .map_err(|source| TokenError::Request {
            account: account.clone(),
            source,
        })?;
        let status = answer.status.unwrap_or_default();
        let token = status
            .token
            .filter(|t| !t.is_empty())
            .ok_or_else(|| TokenError::Empty(account.clone()))?;
        // As the apiserver says, which may cap the expiration asked for.
        let lasts = status
            .expiration_timestamp
            .and_then(|at| Duration::try_from(at.0.duration_since(jiff::Timestamp::now())).ok())
            .unwrap_or(spec.expiration)
            .min(spec.expiration);
        replace_private_file(&self.dir.join(TOKEN), token.as_bytes()).map_err(TokenError::Write)?;
        replace_private_file(&self.dir.join(KUBECONFIG), kubeconfig.as_bytes())
            .map_err(TokenError::Write)?;
        Ok(lasts)
    }
}

/// A kubeconfig for the home cluster as `config` reaches it, whose user
/// reads its token from `token`: the CA inline, since the process's
/// container has none of tether's files.
fn kubeconfig(config: &kube::Config, token: &Path) -> Result<String, serde_json::Error> {
    let ca = config.root_cert.as_ref().map(|certs| {
        let pems: Vec<pem::Pem> = certs
            .iter()
            .map(|der| pem::Pem::new("CERTIFICATE", der.clone()))
            .collect();
        base64::engine::general_purpose::STANDARD.encode(pem::encode_many(&pems))
    });
    let mut kubeconfig = single_kubeconfig(
        "home",
        Cluster {
            server: Some(config.cluster_url.to_string()),
            certificate_authority_data: ca,
            insecure_skip_tls_verify: config.accept_invalid_certs.then_some(true),
            tls_server_name: config.tls_server_name.clone(),
            ..Cluster::default()
        },
        AuthInfo {
            token_file: Some(token.display().to_string()),
            ..AuthInfo::default()
        },
    );
    if let Some(context) = kubeconfig.contexts[0].context.as_mut() {
        context.namespace = Some(config.default_namespace.clone());
    }
    serde_json::to_string(&kubeconfig)
}
