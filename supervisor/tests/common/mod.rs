//! Helpers shared by the supervisor's test files.

use std::time::Duration;

use prometheus::Registry;
use prometheus::proto::MetricType;
use tether_supervisor::{Status, SupervisorHandle};

/// Far longer than any schedule in these tests, on the paused clock.
pub(crate) const DEADLOCK: Duration = Duration::from_secs(3600);

/// Polls the status until `pred` holds, yielding to the loop in between.
pub(crate) async fn until(
    handle: &SupervisorHandle,
    what: &str,
    pred: impl Fn(&Status) -> bool,
) -> Status {
    for _ in 0..1000 {
        let status = handle.status();
        if pred(&status) {
            return status;
        }
        tokio::task::yield_now().await;
    }
    panic!("never reached: {what}; status {:?}", handle.status());
}

/// The value of the series of `name` that carries every label in
/// `labels`, counter or gauge; `None` if there is none.
pub(crate) fn metric(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let family = registry.gather().into_iter().find(|f| f.name() == name)?;
    let counter = family.get_field_type() == MetricType::COUNTER;
    family
        .get_metric()
        .iter()
        .find(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        .map(|m| {
            if counter {
                m.get_counter().get_value()
            } else {
                m.get_gauge().get_value()
            }
        })
}
