//! Kubeconfig files that point a client at a simulated apiserver.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// What a client needs to reach one simulated apiserver, as a kubeconfig.
#[derive(Clone, PartialEq, Eq)]
pub struct Kubeconfig {
    /// The name of the cluster, user and context.
    pub name: String,
    /// The server URL, such as `https://127.0.0.1:40123`.
    pub server: String,
    /// The CA certificate (PEM) to trust, for HTTPS.
    pub ca_pem: Option<String>,
    /// The bearer token, if the server wants one.
    pub token: Option<String>,
    /// A client certificate and its key (PEM), if the server wants one.
    pub client_cert: Option<(String, String)>,
    /// The user to act as (`as:`): clients send it as `Impersonate-User`,
    /// and the server counts requests by it, so a test can tell clients
    /// apart.
    pub impersonate: Option<String>,
}

impl std::fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Kubeconfig")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("tls", &self.ca_pem.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("client_cert", &self.client_cert.is_some())
            .field("impersonate", &self.impersonate)
            .finish()
    }
}

impl Kubeconfig {
    /// The kubeconfig as YAML, with one cluster, user and context, all named
    /// `name`, and that context current.
    #[must_use]
    pub fn to_yaml(&self) -> String {
        let name = &self.name;
        let ca = self.ca_pem.as_ref().map_or_else(String::new, |pem| {
            format!("    certificate-authority-data: {}\n", STANDARD.encode(pem))
        });
        let mut user = String::new();
        // Writing to a String cannot fail.
        if let Some(token) = &self.token {
            let _ = writeln!(user, "    token: \"{token}\"");
        }
        if let Some((cert, key)) = &self.client_cert {
            let _ = writeln!(
                user,
                "    client-certificate-data: {}\n    client-key-data: {}",
                STANDARD.encode(cert),
                STANDARD.encode(key)
            );
        }
        if let Some(who) = &self.impersonate {
            let _ = writeln!(user, "    as: \"{who}\"");
        }
        let user = if user.is_empty() {
            "  user: {}\n".to_owned()
        } else {
            format!("  user:\n{user}")
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n{ca}users:\n- name: {name}\n{user}contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\ncurrent-context: {name}\n",
            server = self.server,
        )
    }

    /// Writes the kubeconfig to `path` at once, as a whole: to a file
    /// beside it, renamed over it, so that a reader never sees half of it.
    ///
    /// # Errors
    ///
    /// Any error from writing the file.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, self.to_yaml())?;
        std::fs::rename(&partial, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_token() {
        let config = Kubeconfig {
            name: "a".into(),
            server: "https://127.0.0.1:1".into(),
            ca_pem: None,
            token: Some("s3cret".into()),
            client_cert: None,
            impersonate: None,
        };
        assert!(!format!("{config:?}").contains("s3cret"));
        assert!(config.to_yaml().contains("token: \"s3cret\""));
    }
}
