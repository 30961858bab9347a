//! The supervisor's Prometheus metrics.

use prometheus::{Gauge, IntCounterVec, IntGauge, Opts, Registry};

use crate::{CauseKind, RemoteChange};

/// The causes that change one remote's part of a cycle while it runs on.
pub(crate) const CHANGE_CAUSES: [CauseKind; 2] =
    [CauseKind::ConfigChanged, CauseKind::ShardChanged];

/// The causes that stop one remote's part of a cycle alone.
pub(crate) const RESTART_CAUSES: [CauseKind; 2] =
    [CauseKind::RemoteLost, CauseKind::RemoteRecovered];

#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    pub(crate) cycle: IntGauge,
    pub(crate) cycles_total: IntCounterVec,
    pub(crate) backoff_seconds: Gauge,
    pub(crate) manager_up: IntGauge,
    pub(crate) restarts_total: IntCounterVec,
    pub(crate) changes_total: IntCounterVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
            cycle: IntGauge::with_opts(Opts::new("tether_cycle", "Current cycle number."))?,
            cycles_total: IntCounterVec::new(
                Opts::new(
                    "tether_cycles_total",
                    "Ended cycles, by the cause that ended them.",
                ),
                &["cause"],
            )?,
            backoff_seconds: Gauge::with_opts(Opts::new(
                "tether_supervisor_backoff_seconds",
                "The wait before the next build; 0 while a cycle runs.",
            ))?,
            manager_up: IntGauge::with_opts(Opts::new(
                "tether_manager_up",
                "1 while a cycle's manager runs with its required caches synced.",
            ))?,
            restarts_total: IntCounterVec::new(
                Opts::new(
                    "tether_remote_restarts_total",
                    "Stops of one remote's part of a cycle while the cycle ran on, by remote and by the cause that stopped it.",
                ),
                &["remote", "cause"],
            )?,
            // By kind and cause, not by remote: a fleet's remotes come and
            // go every day, and a series per remote ever seen would grow
            // without bound. The log and the status page name them.
            changes_total: IntCounterVec::new(
                Opts::new(
                    "tether_remote_changes_total",
                    "Remotes added to, removed from or rebuilt in a running cycle without ending it, by change and by cause.",
                ),
                &["change", "cause"],
            )?,
        };
        // Every cause starts at 0, so `increase()` sees the first end too.
        for kind in CauseKind::ALL {
            metrics.cycles_total.with_label_values(&[kind.as_str()]);
        }
        registry.register(Box::new(metrics.cycle.clone()))?;
        registry.register(Box::new(metrics.cycles_total.clone()))?;
        registry.register(Box::new(metrics.backoff_seconds.clone()))?;
        registry.register(Box::new(metrics.manager_up.clone()))?;
        for change in RemoteChange::ALL {
            for cause in CHANGE_CAUSES {
                metrics
                    .changes_total
                    .with_label_values(&[change.as_str(), cause.as_str()]);
            }
        }
        registry.register(Box::new(metrics.restarts_total.clone()))?;
        registry.register(Box::new(metrics.changes_total.clone()))?;
        Ok(metrics)
    }
}
