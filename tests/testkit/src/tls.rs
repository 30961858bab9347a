//! A throwaway certificate authority and serving certificate per server.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::{Error, Result};

/// A fresh self-signed CA named `name`, with a key of its own.
pub(crate) fn certificate_authority(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(Error::Tls)?)
        .map_err(Error::Tls)
}

/// A CA and a serving certificate it signed, ready for rustls.
#[derive(Clone)]
pub(crate) struct Identity {
    /// The CA certificate, PEM, for kubeconfigs.
    pub(crate) ca_pem: String,
    /// A client certificate and its key (PEM) the same CA signed, when the
    /// server requires one.
    pub(crate) client: Option<(String, String)>,
    pub(crate) server_config: Arc<ServerConfig>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

impl Identity {
    /// A fresh CA named `ca_name`, and a serving certificate for
    /// `localhost`, `127.0.0.1` and `extra_names`; with `client_certs`, also
    /// a client certificate, and a server that requires one the CA signed.
    pub(crate) fn generate(
        ca_name: &str,
        extra_names: &[String],
        client_certs: bool,
    ) -> Result<Self> {
        let ca = certificate_authority(ca_name)?;

        let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        names.extend(extra_names.iter().cloned());
        let mut leaf_params = CertificateParams::new(names).map_err(Error::Tls)?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let leaf_key = KeyPair::generate().map_err(Error::Tls)?;
        let leaf = leaf_params.signed_by(&leaf_key, &ca).map_err(Error::Tls)?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(Error::Rustls)?;
        let (builder, client) = if client_certs {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der().clone()).map_err(Error::Rustls)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|err| Error::Rustls(rustls::Error::General(err.to_string())))?;
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
            params
                .distinguished_name
                .push(DnType::CommonName, "tether-probe");
            let client_key = KeyPair::generate().map_err(Error::Tls)?;
            let client = params.signed_by(&client_key, &ca).map_err(Error::Tls)?;
            (
                builder.with_client_cert_verifier(verifier),
                Some((client.pem(), client_key.serialize_pem())),
            )
        } else {
            (builder.with_no_client_auth(), None)
        };
        let mut config = builder
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .map_err(Error::Rustls)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem: ca.pem(),
            client,
            server_config: Arc::new(config),
        })
    }
}
