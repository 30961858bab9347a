//! The probes' metric series as text, a piece at a time.

use std::sync::Arc;

use super::Shared;
use crate::metrics::Family;

/// The probes' series as text, a piece at a time: see
/// [`ProbeSetHandle::metric_chunks`].
#[derive(Debug)]
pub struct MetricChunks {
    probes: Vec<Arc<Shared>>,
    /// The family being written, as an index of [`Family::ALL`].
    family: usize,
    /// The next remote of it.
    next: usize,
    /// Whether its help and type lines are written.
    started: bool,
}

impl MetricChunks {
    /// The series of `probes`, from the first family's first remote.
    pub(super) fn new(probes: Vec<Arc<Shared>>) -> Self {
        Self {
            probes,
            family: 0,
            next: 0,
            started: false,
        }
    }
}

/// The size a piece of [`MetricChunks`] reaches before it is handed on.
pub(super) const CHUNK: usize = 64 * 1024;

impl Iterator for MetricChunks {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(CHUNK + 4096);
        while out.len() < CHUNK {
            let Some(&family) = Family::ALL.get(self.family) else {
                break;
            };
            let Some(shared) = self.probes.get(self.next) else {
                (self.family, self.next, self.started) = (self.family + 1, 0, false);
                continue;
            };
            self.next += 1;
            let state = shared.lock();
            let gauges = state.gauges();
            for series in &state.names {
                // A family is written with its first series, or not at all,
                // as the registry leaves out a family without one.
                let start = out.len();
                if !self.started {
                    family.header(&mut out);
                }
                let head = out.len();
                family.series(&mut out, series, &shared.host, gauges);
                if out.len() == head {
                    out.truncate(start);
                } else {
                    self.started = true;
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }
}
