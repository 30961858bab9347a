//! `tether check`: every remote probed once.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::run::local_error;
use crate::classify::{LocalKind, ProbeResult, root_cause};
use crate::credentials;
use crate::probe::{probe_client, probe_once};
use crate::{Identity, ProbeConfig, Remote, Result};

/// One row of [`check`]: a configured remote probed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRow {
    /// The configured name.
    pub name: String,
    /// `host:port`.
    pub host: String,
    /// What the probe found.
    pub result: ProbeResult,
}

/// Probes every remote once (each identity once), for `tether check`.
///
/// # Errors
///
/// As [`ProbeSet::sync`], for an invalid or duplicate remote.
pub async fn check(remotes: &[Remote], config: &ProbeConfig) -> Result<Vec<CheckRow>> {
    let mut groups: BTreeMap<Arc<Identity>, Vec<&Remote>> = BTreeMap::new();
    for remote in remotes {
        groups.entry(remote.identity()?).or_default().push(remote);
    }
    let probes = groups.into_iter().map(|(identity, group)| async move {
        let kube_config = Arc::clone(&group[0].config);
        let probe_config = config.clone();
        let built =
            credentials::once_off_workers(move || probe_client(&kube_config, &probe_config)).await;
        let result = match built {
            Ok(Ok(mut client)) => {
                probe_once(
                    &mut client,
                    &config.path,
                    config.timeout,
                    &config.unreachable_statuses,
                )
                .await
            }
            Ok(Err(err)) => local_error(LocalKind::of(&err), root_cause(&err)),
            Err(err) => local_error(LocalKind::of(&err), err.to_string()),
        };
        group
            .into_iter()
            .map(|remote| CheckRow {
                name: remote.name.clone(),
                host: identity.host().to_owned(),
                result: result.clone(),
            })
            .collect::<Vec<_>>()
    });
    let mut rows: Vec<CheckRow> = futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}
