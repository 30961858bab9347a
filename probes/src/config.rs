//! Probe settings.

use std::time::Duration;

use crate::{Error, Result};

/// How remotes are probed.
///
/// The defaults probe every 10s with a 5s deadline and call a remote lost
/// after three failures in a row, so a dead remote is found in about 20-25s
/// while a single dropped probe never counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// The path requested. Default `/readyz`.
    pub path: String,
    /// Time between probes of one remote. Default 10s.
    pub interval: Duration,
    /// Deadline of one probe; at most `interval / 2`, so a probe always
    /// reports before the next is due. Default 5s.
    pub timeout: Duration,
    /// Consecutive failures that make a remote unreachable. Default 3.
    pub failure_threshold: u32,
    /// Consecutive successes that make it reachable again. Default 1.
    pub success_threshold: u32,
    /// Relative jitter of the interval, in `[0, 1)`, so that thousands of
    /// remotes do not fire together. Default 0.1.
    pub jitter: f64,
    /// HTTP statuses that count as unreachable, for apiservers behind an L7
    /// load balancer (e.g. `[502, 503, 504]`). Default empty.
    pub unreachable_statuses: Vec<u16>,
    /// The oldest a kept connection may be and still carry a probe; an older
    /// one is replaced by a new connection. A kept connection can go on
    /// answering after the remote stops taking new ones (a firewall change
    /// that keeps its tracked flows, a draining load balancer, an apiserver
    /// out of descriptors), so reachability must be checked on new
    /// connections too. Default 5m: one extra handshake per remote every 30
    /// probes at the default interval. Below `interval`, every probe opens a
    /// new connection.
    pub max_connection_age: Duration,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            path: "/readyz".to_owned(),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            failure_threshold: 3,
            success_threshold: 1,
            jitter: 0.1,
            unreachable_statuses: Vec::new(),
            max_connection_age: Duration::from_secs(300),
        }
    }
}

impl ProbeConfig {
    /// Sets the interval.
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets the per-probe deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the failure threshold.
    #[must_use]
    pub fn with_failure_threshold(mut self, threshold: u32) -> Self {
        self.failure_threshold = threshold;
        self
    }

    /// Sets the success threshold.
    #[must_use]
    pub fn with_success_threshold(mut self, threshold: u32) -> Self {
        self.success_threshold = threshold;
        self
    }

    /// Sets the jitter.
    #[must_use]
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Sets the statuses that count as unreachable.
    #[must_use]
    pub fn with_unreachable_statuses(mut self, statuses: impl Into<Vec<u16>>) -> Self {
        self.unreachable_statuses = statuses.into();
        self
    }

    /// Sets the oldest a kept connection may be.
    #[must_use]
    pub fn with_max_connection_age(mut self, age: Duration) -> Self {
        self.max_connection_age = age;
        self
    }

    /// Sets the path.
    #[must_use]
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// The longest a remote that stops answering can take to be found
    /// unreachable: the fault may strike just after a probe, then
    /// `failure_threshold` probes fail, each up to an interval (with its
    /// jitter) after the last, the final one taking up to its deadline.
    /// Saturates at `Duration::MAX`.
    #[must_use]
    pub fn detection_bound(&self) -> Duration {
        self.interval
            .mul_f64(1.0 + self.jitter)
            .checked_mul(self.failure_threshold)
            .and_then(|probes| probes.checked_add(self.timeout))
            .unwrap_or(Duration::MAX)
    }

    /// Checks that the settings are in range.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of range, by its
    /// name in this struct's serialized form (`timeout`,
    /// `failureThreshold`); the caller places it in its own config.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
        if !self.path.starts_with('/') {
            return invalid("path", "must start with /");
        }
        if self.path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(Error::InvalidConfig {
                field: "path",
                reason: format!("{:?} is not a URL path", self.path),
            });
        }
        if self.interval.is_zero() {
            return invalid("interval", "must be greater than zero");
        }
        if self.timeout.is_zero() {
            return invalid("timeout", "must be greater than zero");
        }
        if self.timeout > self.interval / 2 {
            return Err(Error::InvalidConfig {
                field: "timeout",
                reason: format!(
                    "{:?} must be at most half of the interval ({:?}), so a probe reports before the next is due",
                    self.timeout, self.interval
                ),
            });
        }
        if self.max_connection_age.is_zero() {
            return invalid("maxConnectionAge", "must be greater than zero");
        }
        if self.failure_threshold < 1 {
            return invalid("failureThreshold", "must be at least 1");
        }
        if self.success_threshold < 1 {
            return invalid("successThreshold", "must be at least 1");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return invalid("jitter", "must be in [0, 1)");
        }
        if let Some(bad) = self
            .unreachable_statuses
            .iter()
            .find(|s| !(100..600).contains(*s))
        {
            return Err(Error::InvalidConfig {
                field: "unreachableStatuses",
                reason: format!("{bad} is not an HTTP status code"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_over_half_the_interval_is_rejected_showing_both() {
        let config = ProbeConfig::default().with_timeout(Duration::from_secs(6));
        let err = config.validate().expect_err("6s > 10s / 2");
        assert_eq!(
            err.to_string(),
            "timeout: 6s must be at most half of the interval (10s), so a probe reports before the next is due"
        );
        assert!(ProbeConfig::default().validate().is_ok());
    }

    #[test]
    fn the_detection_bound_counts_every_interval_and_the_last_deadline() {
        // 3 × 10s × 1.1 + 5s.
        assert_eq!(
            ProbeConfig::default().detection_bound(),
            Duration::from_secs(38)
        );
        let absurd = ProbeConfig::default().with_failure_threshold(u32::MAX);
        assert_eq!(
            absurd
                .with_interval(Duration::from_secs(u64::MAX / 2))
                .detection_bound(),
            Duration::MAX
        );
    }

    #[test]
    fn thresholds_and_statuses_are_checked() {
        for (config, field) in [
            (
                ProbeConfig::default().with_failure_threshold(0),
                "failureThreshold",
            ),
            (
                ProbeConfig::default().with_success_threshold(0),
                "successThreshold",
            ),
            (ProbeConfig::default().with_jitter(1.0), "jitter"),
            (
                ProbeConfig::default().with_unreachable_statuses([99]),
                "unreachableStatuses",
            ),
            (ProbeConfig::default().with_path("readyz"), "path"),
            (
                ProbeConfig::default().with_path("/readyz\r\nX-Injected: 1"),
                "path",
            ),
            (
                ProbeConfig::default().with_max_connection_age(Duration::ZERO),
                "maxConnectionAge",
            ),
        ] {
            let err = config.validate().expect_err(field);
            assert!(err.to_string().starts_with(field), "{err}");
        }
    }
}
