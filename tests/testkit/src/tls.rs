//! A throwaway certificate authority and serving certificate per server.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::{Error, Result};

/// A CA and a serving certificate it signed, ready for rustls.
#[derive(Clone)]
pub(crate) struct Identity {
    /// The CA certificate, PEM, for kubeconfigs.
    pub(crate) ca_pem: String,
    pub(crate) server_config: Arc<ServerConfig>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh CA named `ca_name`, and a serving certificate for
    /// `localhost`, `127.0.0.1` and `extra_names`.
    pub(crate) fn generate(ca_name: &str, extra_names: &[String]) -> Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, ca_name);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(Error::Tls)?)
            .map_err(Error::Tls)?;

        let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        names.extend(extra_names.iter().cloned());
        let mut leaf_params = CertificateParams::new(names).map_err(Error::Tls)?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let leaf_key = KeyPair::generate().map_err(Error::Tls)?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(Error::Tls)?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(Error::Rustls)?
                .with_no_client_auth()
                .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
                .map_err(Error::Rustls)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca.pem(),
            server_config: Arc::new(config),
        })
    }
}
