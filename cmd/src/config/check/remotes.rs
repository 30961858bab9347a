//! The static remotes: each one's name, source and credentials.

use std::collections::BTreeMap;

use super::{Checker, kept, valid_name};
use crate::config::raw::RawRemote;
use crate::config::{ConfigError, RemoteSource, RemoteSpec, defaults};

impl Checker<'_> {
    /// The static remotes; none only when `discovering` finds them.
    pub(super) fn remotes(
        &self,
        raw: Vec<RawRemote>,
        discovering: bool,
    ) -> Result<Vec<RemoteSpec>, ConfigError> {
        if raw.is_empty() && !discovering {
            return Err(self.error(
                "remotes",
                "at least one remote is needed, or a discovery source",
            ));
        }
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut remotes = Vec::with_capacity(raw.len());
        let mut errors = Vec::new();
        for (i, remote) in raw.into_iter().enumerate() {
            remotes.extend(kept(&mut errors, self.remote(i, remote, &mut seen)));
        }
        match ConfigError::all(errors) {
            Some(errors) => Err(errors),
            None => Ok(remotes),
        }
    }

    /// Remote `i`, whose name must not be in `seen` yet.
    fn remote(
        &self,
        i: usize,
        remote: RawRemote,
        seen: &mut BTreeMap<String, usize>,
    ) -> Result<RemoteSpec, ConfigError> {
        let at = |field: &str| format!("remotes[{i}].{field}");
        let name = remote
            .name
            .ok_or_else(|| self.error(at("name"), "is required"))?;
        if !valid_name(&name) {
            return Err(self.error(
                at("name"),
                format!("{name:?} must be 1-63 lower-case letters, digits, '-', '.' or '_'"),
            ));
        }
        if let Some(first) = seen.insert(name.clone(), i) {
            return Err(self.error(
                at("name"),
                format!("{name:?} is already the name of remotes[{first}]"),
            ));
        }
        let source = match (remote.kubeconfig, remote.server) {
            (Some(_), Some(_)) => {
                return Err(self.error(
                    format!("remotes[{i}]"),
                    "set either kubeconfig or server, not both",
                ));
            }
            (None, None) => {
                return Err(self.error(format!("remotes[{i}]"), "needs a kubeconfig or a server"));
            }
            (Some(path), None) => {
                for (field, set) in [
                    ("caFile", remote.ca_file.is_some()),
                    ("tokenFile", remote.token_file.is_some()),
                    (
                        "insecureSkipTlsVerify",
                        remote.insecure_skip_tls_verify.is_some(),
                    ),
                ] {
                    if set {
                        return Err(self.error(
                            at(field),
                            "only goes with server; the kubeconfig says how to connect",
                        ));
                    }
                }
                RemoteSource::Kubeconfig {
                    path: self.existing_file(&at("kubeconfig"), &path)?,
                    context: remote.context,
                }
            }
            (None, Some(server)) => {
                if remote.context.is_some() {
                    return Err(self.error(at("context"), "only goes with kubeconfig"));
                }
                let uri: http::Uri = server.parse().map_err(|e| {
                    self.error(at("server"), format!("invalid URL {server:?}: {e}"))
                })?;
                tether_probes::client::normalize_url(&uri).map_err(|e| {
                    self.error(at("server"), format!("invalid URL {server:?}: {e}"))
                })?;
                RemoteSource::Direct {
                    server,
                    ca_file: remote
                        .ca_file
                        .map(|f| self.existing_file(&at("caFile"), &f))
                        .transpose()?,
                    token_file: remote
                        .token_file
                        .map(|f| self.existing_file(&at("tokenFile"), &f))
                        .transpose()?,
                    insecure_skip_tls_verify: remote.insecure_skip_tls_verify.unwrap_or(false),
                }
            }
        };
        Ok(RemoteSpec {
            name,
            required: remote.required.unwrap_or(defaults::REQUIRED),
            source,
        })
    }
}
