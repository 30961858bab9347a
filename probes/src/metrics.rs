//! The probes' Prometheus metrics. Names follow Prometheus's conventions
//! (`_total` counters, `_seconds` units); label values come from closed sets
//! or the configured remote names, never from error text. `docs/metrics.md`
//! lists them.
//!
//! The two process-wide counters live in the `prometheus` registry. The
//! per-remote series (a few gauges, a counter and a histogram for each of
//! thousands of remotes) are kept as plain numbers in each remote's probe
//! state and written straight as text by [`Families`]: the `prometheus`
//! crate would hold a labelled child with copies of its label strings per
//! series, and build a protobuf message tree of every series on each scrape
//! before it writes one line.

use std::io::Write as _;

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::{LocalKind, Reachability};

/// Probe latencies: sub-millisecond loopback up to the largest sane deadline.
const LATENCY_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The buckets' `le` label values, as Prometheus's text format writes them.
const LE: [&str; 12] = [
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
];

/// The process-wide probe counters, in the registry.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    pub(crate) panics: IntCounter,
    pub(crate) local_errors: IntCounterVec,
}

impl Metrics {
    pub(crate) fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self {
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
        registry.register(Box::new(metrics.panics.clone()))?;
        registry.register(Box::new(metrics.local_errors.clone()))?;
        Ok(metrics)
    }
}

/// One result's latency histogram: counts per bucket (not cumulative), the
/// sum and the count.
#[derive(Debug, Clone, Default)]
struct Latency {
    buckets: [u64; LATENCY_BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Latency {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|le| seconds <= *le) {
            self.buckets[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// The series one configured name owns beyond its probe's shared state:
/// counted per name, so a name added to a probed identity starts from zero,
/// as a new series does.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) name: String,
    /// By result: reachable, unreachable.
    latency: [Latency; 2],
    /// By state entered: reachable, unreachable.
    transitions: [u64; 2],
}

const fn index(state: Reachability) -> usize {
    match state {
        Reachability::Unreachable => 1,
        Reachability::Reachable | Reachability::Unknown => 0,
    }
}

impl Series {
    pub(crate) fn new(name: String) -> Self {
        Self {
            name,
            latency: Default::default(),
            transitions: [0; 2],
        }
    }

    pub(crate) fn observe(&mut self, result: Reachability, seconds: f64) {
        self.latency[index(result)].observe(seconds);
    }

    pub(crate) fn transition(&mut self, to: Reachability) {
        self.transitions[index(to)] += 1;
    }
}

/// What the gauges of one name say; `None` leaves a series out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gauges {
    pub(crate) reachable: Option<bool>,
    pub(crate) ready: Option<bool>,
    pub(crate) failures: Option<u32>,
    pub(crate) last_probe: Option<f64>,
}

/// The per-remote families, each written whole in Prometheus's text
/// format: a pass over the remotes per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Reachable,
    Ready,
    Failures,
    Duration,
    LastProbe,
    Transitions,
}

/// `value` escaped for a label value.
fn escaped(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        value.into()
    }
}

impl Family {
    pub(crate) const ALL: [Self; 6] = [
        Self::Reachable,
        Self::Ready,
        Self::Failures,
        Self::Duration,
        Self::LastProbe,
        Self::Transitions,
    ];

    /// Name, help and type.
    const fn head(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Reachable => (
                "tether_remote_apiserver_reachable",
                "1 if the remote apiserver is reachable, 0 if unreachable (the sustained state, not the last probe).",
                "gauge",
            ),
            Self::Ready => (
                "tether_remote_apiserver_ready",
                "1 when the remote's /readyz last answered 2xx.",
                "gauge",
            ),
            Self::Failures => (
                "tether_remote_probe_consecutive_failures",
                "The remote's current streak of failed probes.",
                "gauge",
            ),
            Self::Duration => (
                "tether_remote_probe_duration_seconds",
                "Probe latency, by result (reachable or unreachable).",
                "histogram",
            ),
            Self::LastProbe => (
                "tether_remote_probe_last_timestamp_seconds",
                "Unix time of the remote's last finished probe.",
                "gauge",
            ),
            Self::Transitions => (
                "tether_remote_transitions_total",
                "Changes of a remote's reachability state, by the state entered.",
                "counter",
            ),
        }
    }

    /// Writes the family's help and type lines.
    pub(crate) fn header(self, out: &mut Vec<u8>) {
        let (name, help, kind) = self.head();
        // Writing to a Vec cannot fail.
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    /// Writes this family's series of one configured name.
    pub(crate) fn series(self, out: &mut Vec<u8>, series: &Series, host: &str, gauges: Gauges) {
        let name = escaped(&series.name);
        let host = escaped(host);
        let _ = match self {
            Self::Reachable => gauges.reachable.map_or(Ok(()), |up| {
                writeln!(
                    out,
                    "tether_remote_apiserver_reachable{{host=\"{host}\",remote=\"{name}\"}} {}",
                    u8::from(up)
                )
            }),
            Self::Ready => gauges.ready.map_or(Ok(()), |ready| {
                writeln!(
                    out,
                    "tether_remote_apiserver_ready{{host=\"{host}\",remote=\"{name}\"}} {}",
                    u8::from(ready)
                )
            }),
            Self::Failures => gauges.failures.map_or(Ok(()), |failures| {
                writeln!(
                    out,
                    "tether_remote_probe_consecutive_failures{{remote=\"{name}\"}} {failures}"
                )
            }),
            Self::LastProbe => gauges.last_probe.map_or(Ok(()), |at| {
                writeln!(
                    out,
                    "tether_remote_probe_last_timestamp_seconds{{remote=\"{name}\"}} {at}"
                )
            }),
            Self::Duration => latency_lines(out, &name, series),
            Self::Transitions => {
                for (count, to) in series.transitions.iter().zip(["reachable", "unreachable"]) {
                    if *count > 0 {
                        let _ = writeln!(
                            out,
                            "tether_remote_transitions_total{{remote=\"{name}\",to=\"{to}\"}} {count}"
                        );
                    }
                }
                Ok(())
            }
        };
    }
}

fn latency_lines(out: &mut Vec<u8>, name: &str, series: &Series) -> std::io::Result<()> {
    for (latency, result) in series.latency.iter().zip(["reachable", "unreachable"]) {
        if latency.count == 0 {
            continue;
        }
        let mut cumulative = 0;
        for (count, le) in latency.buckets.iter().chain([&0]).zip(LE) {
            cumulative += count;
            writeln!(
                out,
                "tether_remote_probe_duration_seconds_bucket{{remote=\"{name}\",result=\"{result}\",le=\"{le}\"}} {}",
                if le == "+Inf" {
                    latency.count
                } else {
                    cumulative
                }
            )?;
        }
        writeln!(
            out,
            "tether_remote_probe_duration_seconds_sum{{remote=\"{name}\",result=\"{result}\"}} {}\ntether_remote_probe_duration_seconds_count{{remote=\"{name}\",result=\"{result}\"}} {}",
            latency.sum, latency.count
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_with_its_sum_and_count() {
        let mut series = Series::new("a\"b".to_owned());
        for seconds in [0.001, 0.02, 0.02, 30.0] {
            series.observe(Reachability::Reachable, seconds);
        }
        series.transition(Reachability::Unreachable);
        let gauges = Gauges {
            reachable: Some(true),
            ready: None,
            failures: Some(0),
            last_probe: Some(1.5),
        };
        let mut out = Vec::new();
        for family in Family::ALL {
            let start = out.len();
            family.header(&mut out);
            let head = out.len();
            family.series(&mut out, &series, "h:443", gauges);
            if out.len() == head {
                out.truncate(start);
            }
        }
        let text = String::from_utf8(out).expect("utf-8");
        for line in [
            "tether_remote_apiserver_reachable{host=\"h:443\",remote=\"a\\\"b\"} 1",
            "tether_remote_probe_duration_seconds_bucket{remote=\"a\\\"b\",result=\"reachable\",le=\"0.005\"} 1",
            "tether_remote_probe_duration_seconds_bucket{remote=\"a\\\"b\",result=\"reachable\",le=\"0.025\"} 3",
            "tether_remote_probe_duration_seconds_bucket{remote=\"a\\\"b\",result=\"reachable\",le=\"10\"} 3",
            "tether_remote_probe_duration_seconds_bucket{remote=\"a\\\"b\",result=\"reachable\",le=\"+Inf\"} 4",
            "tether_remote_probe_duration_seconds_sum{remote=\"a\\\"b\",result=\"reachable\"} 30.041",
            "tether_remote_probe_duration_seconds_count{remote=\"a\\\"b\",result=\"reachable\"} 4",
            "tether_remote_probe_last_timestamp_seconds{remote=\"a\\\"b\"} 1.5",
            "tether_remote_transitions_total{remote=\"a\\\"b\",to=\"unreachable\"} 1",
            "# TYPE tether_remote_probe_duration_seconds histogram",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        assert!(
            !text.contains("tether_remote_apiserver_ready"),
            "no ready series yet"
        );
        assert!(
            !text.contains("result=\"unreachable\""),
            "nothing observed as unreachable"
        );
        assert!(!text.contains("to=\"reachable\""), "never turned reachable");
    }
}
