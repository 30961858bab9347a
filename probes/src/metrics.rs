//! The probes' Prometheus metrics. Names follow Prometheus's conventions
//! (`_total` counters, `_seconds` units); label values come from closed sets
//! or the configured remote names, never from error text. `docs/metrics.md`
//! lists them.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::{LocalKind, Reachability};

/// Probe latencies: sub-millisecond loopback up to the largest sane deadline.
const LATENCY_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    pub(crate) reachable: IntGaugeVec,
    pub(crate) ready: IntGaugeVec,
    pub(crate) failures: IntGaugeVec,
    pub(crate) duration: HistogramVec,
    pub(crate) last_probe: GaugeVec,
    pub(crate) transitions: IntCounterVec,
    pub(crate) panics: IntCounter,
    pub(crate) local_errors: IntCounterVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
            reachable: IntGaugeVec::new(
                Opts::new(
                    "tether_remote_apiserver_reachable",
                    "1 if the remote apiserver is reachable, 0 if unreachable (the sustained state, not the last probe).",
                ),
                &["remote", "host"],
            )?,
            ready: IntGaugeVec::new(
                Opts::new(
                    "tether_remote_apiserver_ready",
                    "1 when the remote's /readyz last answered 2xx.",
                ),
                &["remote", "host"],
            )?,
            failures: IntGaugeVec::new(
                Opts::new(
                    "tether_remote_probe_consecutive_failures",
                    "The remote's current streak of failed probes.",
                ),
                &["remote"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "tether_remote_probe_duration_seconds",
                    "Probe latency, by result (reachable or unreachable).",
                )
                .buckets(LATENCY_BUCKETS.to_vec()),
                &["remote", "result"],
            )?,
            last_probe: GaugeVec::new(
                Opts::new(
                    "tether_remote_probe_last_timestamp_seconds",
                    "Unix time of the remote's last finished probe.",
                ),
                &["remote"],
            )?,
            transitions: IntCounterVec::new(
                Opts::new(
                    "tether_remote_transitions_total",
                    "Changes of a remote's reachability state, by the state entered.",
                ),
                &["remote", "to"],
            )?,
            panics: IntCounter::with_opts(Opts::new(
                "tether_probe_panics_total",
                "Probe tasks that panicked and were restarted.",
            ))?,
            local_errors: IntCounterVec::new(
                Opts::new(
                    "tether_local_errors_total",
                    "Probes and client builds that failed here, not at the remote, by kind (descriptors, credentials, other).",
                ),
                &["kind"],
            )?,
        };
        for kind in LocalKind::ALL {
            metrics.local_errors.with_label_values(&[kind.as_str()]);
        }
        registry.register(Box::new(metrics.reachable.clone()))?;
        registry.register(Box::new(metrics.ready.clone()))?;
        registry.register(Box::new(metrics.failures.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.last_probe.clone()))?;
        registry.register(Box::new(metrics.transitions.clone()))?;
        registry.register(Box::new(metrics.panics.clone()))?;
        registry.register(Box::new(metrics.local_errors.clone()))?;
        Ok(metrics)
    }

    /// Deletes every series of a remote that left the configuration.
    pub(crate) fn forget(&self, remote: &str, host: &str) {
        // A series that was never set does not exist; that is fine.
        let _ = self.reachable.remove_label_values(&[remote, host]);
        let _ = self.ready.remove_label_values(&[remote, host]);
        let _ = self.failures.remove_label_values(&[remote]);
        let _ = self.last_probe.remove_label_values(&[remote]);
        for state in [Reachability::Reachable, Reachability::Unreachable] {
            let _ = self.duration.remove_label_values(&[remote, state.as_str()]);
            let _ = self
                .transitions
                .remove_label_values(&[remote, state.as_str()]);
        }
    }
}
