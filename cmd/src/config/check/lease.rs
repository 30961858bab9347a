//! Leader election and sharding: the Lease's name, namespace, cluster and
//! timings, whole seconds as a Lease keeps them.

use super::Checker;
use crate::config::raw::{RawLeaderElection, RawSharding};
use crate::config::{ConfigError, LeaderElectionSpec, ShardingSpec, WholeSeconds, defaults};

/// A DNS subdomain, as a Lease's or a ServiceAccount's name: at most 253
/// lower-case letters, digits, '-' and '.', starting and ending with a
/// letter or digit.
pub(super) fn valid_subdomain(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
}

/// The longest identity a shard Lease's name leaves room for: the name is
/// `<prefix>-<identity>`, at most 253 characters.
fn identity_room(prefix: &str) -> usize {
    253 - prefix.len() - 1
}

impl Checker<'_> {
    pub(super) fn leader_election(
        &self,
        raw: RawLeaderElection,
    ) -> Result<Option<LeaderElectionSpec>, ConfigError> {
        if !raw.enabled.unwrap_or(false) {
            return Ok(None);
        }
        let field = |name: &str| format!("leaderElection.{name}");
        let lease_name = raw
            .lease_name
            .unwrap_or_else(|| defaults::LEASE_NAME.to_owned());
        if !valid_subdomain(&lease_name) {
            return Err(self.error(
                field("leaseName"),
                format!(
                    "{lease_name:?} is not a Lease name (at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
                ),
            ));
        }
        let optional = |value: Option<String>| value.filter(|v| !v.is_empty());
        let identity = optional(raw.identity);
        if let Some(identity) = &identity
            && (identity.len() > 253 || identity.chars().any(char::is_control))
        {
            return Err(self.error(
                field("identity"),
                "must be at most 253 characters, none of them a control character (a Lease's holderIdentity is a Kubernetes name)",
            ));
        }
        let lease_duration = self.duration(
            &field("leaseDuration"),
            raw.lease_duration.as_ref(),
            defaults::LEASE_DURATION,
        )?;
        let lease_duration = WholeSeconds::new(lease_duration).ok_or_else(|| {
            self.error(
                field("leaseDuration"),
                format!(
                    "{} is not a whole number of seconds: a Lease stores leaseDurationSeconds as an integer, and every replica's fence is computed from exactly what is written; write 1s or more, in whole seconds",
                    raw.lease_duration.as_deref().map_or("", str::trim)
                ),
            )
        })?;
        let renew_deadline = self.duration(
            &field("renewDeadline"),
            raw.renew_deadline.as_ref(),
            defaults::RENEW_DEADLINE,
        )?;
        let retry_period = self.duration(
            &field("retryPeriod"),
            raw.retry_period.as_ref(),
            defaults::RETRY_PERIOD,
        )?;
        if retry_period.is_zero() {
            return Err(self.error(field("retryPeriod"), "must be above 0"));
        }
        if renew_deadline <= retry_period {
            return Err(self.error(
                field("renewDeadline"),
                format!(
                    "{} must be longer than retryPeriod ({})",
                    crate::human::exact(renew_deadline),
                    crate::human::exact(retry_period)
                ),
            ));
        }
        if lease_duration.duration() <= renew_deadline {
            return Err(self.error(
                field("leaseDuration"),
                format!(
                    "{lease_duration} must be longer than renewDeadline ({}), so a leader that lost its Lease has stopped before another takes it",
                    crate::human::exact(renew_deadline)
                ),
            ));
        }
        Ok(Some(LeaderElectionSpec {
            lease_name,
            lease_namespace: optional(raw.lease_namespace),
            identity,
            lease_duration,
            renew_deadline,
            retry_period,
            kubeconfig: optional(raw.kubeconfig)
                .map(|path| self.existing_file(&field("kubeconfig"), &path))
                .transpose()?,
        }))
    }

    pub(super) fn sharding(
        &self,
        raw: RawSharding,
        election: Option<&LeaderElectionSpec>,
    ) -> Result<Option<ShardingSpec>, ConfigError> {
        if !raw.enabled.unwrap_or(false) {
            return Ok(None);
        }
        if election.is_none() {
            return Err(self.error(
                "sharding.enabled",
                "needs leaderElection (enabled: true) for the Leases' cluster, namespace, identity and timings",
            ));
        }
        let lease_prefix = raw
            .lease_prefix
            .unwrap_or_else(|| defaults::SHARD_LEASE_PREFIX.to_owned());
        // The Lease is `<prefix>-<identity>`, and the prefix is a label value.
        if !valid_subdomain(&lease_prefix) || lease_prefix.len() > 40 {
            return Err(self.error(
                "sharding.leasePrefix",
                format!(
                    "{lease_prefix:?} is not a Lease name prefix (at most 40 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
                ),
            ));
        }
        if let Some(identity) = election.and_then(|e| e.identity.as_deref())
            && !(valid_subdomain(identity) && identity.len() <= identity_room(&lease_prefix))
        {
            return Err(self.error(
                "leaderElection.identity",
                format!(
                    "{identity:?} cannot name a shard Lease ({lease_prefix}-<identity>): with sharding it must be at most {} lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
                    identity_room(&lease_prefix)
                ),
            ));
        }
        Ok(Some(ShardingSpec { lease_prefix }))
    }
}
