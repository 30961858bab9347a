//! A throwaway certificate authority and serving certificate per server.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::{Error, Result};

/// A fresh self-signed CA named `name`, with a key of its own.
///
/// # Errors
///
/// [`Error::Tls`] if rcgen cannot make it.
pub fn certificate_authority(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(Error::Tls)?)
        .map_err(Error::Tls)
}

/// `provider` with its TLS 1.3 suites in the order Go's server prefers
/// them on a machine with AES instructions: AES-128-GCM, AES-256-GCM, then
/// ChaCha20-Poly1305. kube-apiserver uses Go's defaults, so a client that
/// offers AES-256-GCM first (as rustls does) still gets AES-128-GCM from it.
fn go_cipher_order(mut provider: rustls::crypto::CryptoProvider) -> rustls::crypto::CryptoProvider {
    use rustls::CipherSuite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let rank = |suite: &rustls::SupportedCipherSuite| match suite.suite() {
        TLS13_AES_128_GCM_SHA256 => 0,
        TLS13_AES_256_GCM_SHA384 => 1,
        TLS13_CHACHA20_POLY1305_SHA256 => 2,
        _ => 3,
    };
    provider.cipher_suites.sort_by_key(rank);
    provider
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
    /// The serving certificate's chain and key, kept for a new client CA.
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
    ca_name: String,
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

        Self::serving(
            ca.pem(),
            ca_name,
            vec![leaf.der().clone(), ca.der().clone()],
            leaf_key.serialize_der(),
            client_certs,
        )
    }

    /// The identity kept in `dir` (`ca.crt`, and the serving certificate,
    /// its CA and key as DER), or, when `dir` holds none, a new one from
    /// [`generate`](Self::generate), kept there for the next start. A
    /// restarted server then comes back as itself, its kubeconfig still
    /// good. Client certificates are not kept: with them, each start makes
    /// new ones.
    pub(crate) fn kept_in(
        dir: &std::path::Path,
        ca_name: &str,
        extra_names: &[String],
        client_certs: bool,
    ) -> Result<Self> {
        let file = |name: &str| dir.join(name);
        let read = |name: &str| std::fs::read(file(name));
        if !client_certs
            && let (Ok(ca_pem), Ok(ca), Ok(leaf), Ok(key)) = (
                std::fs::read_to_string(file("ca.crt")),
                read("ca.der"),
                read("server.der"),
                read("server.key.der"),
            )
        {
            return Self::serving(
                ca_pem,
                ca_name,
                vec![CertificateDer::from(leaf), CertificateDer::from(ca)],
                key,
                false,
            );
        }
        let identity = Self::generate(ca_name, extra_names, client_certs)?;
        let write = |name: &str, bytes: &[u8]| {
            std::fs::write(file(name), bytes).map_err(|e| Error::State(file(name), e))
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::State(dir.to_path_buf(), e))?;
        write("ca.crt", identity.ca_pem.as_bytes())?;
        write("server.der", &identity.chain[0])?;
        write("ca.der", &identity.chain[1])?;
        write("server.key.der", &identity.key)?;
        Ok(identity)
    }

    /// The same serving certificate, and, when client certificates are
    /// required, a new client CA and a client certificate it signed: the
    /// old client certificate is refused from now on.
    pub(crate) fn with_new_client_ca(&self) -> Result<Self> {
        Self::serving(
            self.ca_pem.clone(),
            &self.ca_name,
            self.chain.clone(),
            self.key.clone(),
            self.client.is_some(),
        )
    }

    /// A server config for `chain` and `key`; with `client_certs`, a client
    /// CA of its own (as an apiserver's `--client-ca-file`), and a client
    /// certificate it signed.
    fn serving(
        ca_pem: String,
        ca_name: &str,
        chain: Vec<CertificateDer<'static>>,
        key: Vec<u8>,
        client_certs: bool,
    ) -> Result<Self> {
        let provider = Arc::new(go_cipher_order(rustls::crypto::ring::default_provider()));
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(Error::Rustls)?;
        let (builder, client) = if client_certs {
            let client_ca = certificate_authority(&format!("{ca_name}-clients"))?;
            let mut roots = rustls::RootCertStore::empty();
            roots.add(client_ca.der().clone()).map_err(Error::Rustls)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|err| Error::Rustls(rustls::Error::General(err.to_string())))?;
            let mut params = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
            params
                .distinguished_name
                .push(DnType::CommonName, "tether-probe");
            let client_key = KeyPair::generate().map_err(Error::Tls)?;
            let client = params
                .signed_by(&client_key, &client_ca)
                .map_err(Error::Tls)?;
            (
                builder.with_client_cert_verifier(verifier),
                Some((client.pem(), client_key.serialize_pem())),
            )
        } else {
            (builder.with_no_client_auth(), None)
        };
        let mut config = builder
            .with_single_cert(
                chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.clone())),
            )
            .map_err(Error::Rustls)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // Go's server picks the suite by its own order, whatever the
        // client's, as kube-apiserver does.
        config.ignore_client_order = true;
        Ok(Self {
            ca_pem,
            client,
            server_config: Arc::new(config),
            chain,
            key,
            ca_name: ca_name.to_owned(),
        })
    }
}
