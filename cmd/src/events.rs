//! Kubernetes Events on tether's own Pod: each cycle's end with its cause,
//! each change of leadership, each change of this replica's share. An
//! operator's first look is `kubectl describe pod` or `kubectl get events`.
//!
//! The Pod is named by the downward API (`POD_NAME`, `POD_NAMESPACE`,
//! `POD_UID`); without the first two, no Events are recorded. They go to
//! the home cluster: the leader election's kubeconfig when it has one, else
//! the in-cluster config. kube's recorder aggregates repeats of one reason
//! within six minutes into one Event with a count (`series`), as client-go's
//! does; and as client-go's spam filter, a token bucket (25 at once, then
//! one every 5 minutes) keeps a process that ends cycles in a loop from
//! flooding the apiserver. Publishing runs on a task of its own, behind a
//! bounded queue: the daemon never waits on it.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus::{IntCounterVec, Opts, Registry};
use tether_supervisor::{Cause, CauseKind, SupervisorHandle};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::lease::election::ElectionHandle;

/// Why an Event was recorded: a closed set, its `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// A cycle ended: a remote it used became unreachable.
    RemoteLost,
    /// A cycle ended: a remote came back.
    RemoteRecovered,
    /// A cycle ended: new configuration or rotated credentials.
    ConfigChanged,
    /// A cycle ended: the probes' transitions fell behind.
    TransitionsMissed,
    /// A cycle ended: the manager returned by itself.
    ManagerExited,
    /// A cycle ended: the manager failed.
    ManagerFailed,
    /// A cycle ended: the manager panicked.
    ManagerPanicked,
    /// A cycle ended: building the manager failed.
    BuildFailed,
    /// The cycle ended at a shutdown.
    Shutdown,
    /// This replica began to lead.
    LeadershipAcquired,
    /// This replica lost the leadership.
    LeadershipLost,
    /// This replica stopped leading because it is shutting down.
    LeadershipReleased,
    /// This replica's share of the remotes changed.
    ShardChanged,
}

impl Reason {
    /// Every reason, for the test that holds the docs to the closed set.
    #[cfg(test)]
    pub(crate) const ALL: [Self; 13] = [
        Self::RemoteLost,
        Self::RemoteRecovered,
        Self::ConfigChanged,
        Self::TransitionsMissed,
        Self::ManagerExited,
        Self::ManagerFailed,
        Self::ManagerPanicked,
        Self::BuildFailed,
        Self::Shutdown,
        Self::LeadershipAcquired,
        Self::LeadershipLost,
        Self::LeadershipReleased,
        Self::ShardChanged,
    ];

    /// The Event's `reason`.
    #[must_use]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::RemoteLost => "RemoteLost",
            Self::RemoteRecovered => "RemoteRecovered",
            Self::ConfigChanged => "ConfigChanged",
            Self::TransitionsMissed => "TransitionsMissed",
            Self::ManagerExited => "ManagerExited",
            Self::ManagerFailed => "ManagerFailed",
            Self::ManagerPanicked => "ManagerPanicked",
            Self::BuildFailed => "BuildFailed",
            Self::Shutdown => "Shutdown",
            Self::LeadershipAcquired => "LeadershipAcquired",
            Self::LeadershipLost => "LeadershipLost",
            Self::LeadershipReleased => "LeadershipReleased",
            Self::ShardChanged => "ShardChanged",
        }
    }

    /// `Warning` for what an operator should look at, else `Normal`.
    #[must_use]
    pub(crate) fn event_type(self) -> EventType {
        match self {
            Self::RemoteLost
            | Self::TransitionsMissed
            | Self::ManagerExited
            | Self::ManagerFailed
            | Self::ManagerPanicked
            | Self::BuildFailed
            | Self::LeadershipLost => EventType::Warning,
            _ => EventType::Normal,
        }
    }

    /// What the Event says was done: its `action`.
    fn action(self) -> &'static str {
        match self {
            Self::LeadershipAcquired | Self::LeadershipLost | Self::LeadershipReleased => "Elect",
            Self::ShardChanged => "Share",
            _ => "EndCycle",
        }
    }

    /// The reason of a cycle's end, when it is recorded as one: a
    /// leadership or share change has an Event of its own.
    #[must_use]
    pub(crate) fn of_cycle_end(kind: CauseKind) -> Option<Self> {
        Some(match kind {
            CauseKind::RemoteLost => Self::RemoteLost,
            CauseKind::RemoteRecovered => Self::RemoteRecovered,
            CauseKind::ConfigChanged => Self::ConfigChanged,
            CauseKind::TransitionsMissed => Self::TransitionsMissed,
            CauseKind::ManagerExited => Self::ManagerExited,
            CauseKind::ManagerFailed => Self::ManagerFailed,
            CauseKind::ManagerPanicked => Self::ManagerPanicked,
            CauseKind::BuildFailed => Self::BuildFailed,
            CauseKind::Shutdown => Self::Shutdown,
            CauseKind::LeadershipLost | CauseKind::ShardChanged => return None,
        })
    }
}

/// client-go's spam filter: 25 Events at once, then one every 5 minutes.
const BURST: f64 = 25.0;
const REFILL_EVERY: Duration = Duration::from_secs(300);

/// A token bucket.
#[derive(Debug)]
struct SpamFilter {
    tokens: f64,
    last: Instant,
}

impl SpamFilter {
    fn new() -> Self {
        Self {
            tokens: BURST,
            last: Instant::now(),
        }
    }

    /// Whether an Event may be sent now; takes a token if so.
    fn allow(&mut self) -> bool {
        let now = Instant::now();
        let refilled = (now - self.last).as_secs_f64() / REFILL_EVERY.as_secs_f64();
        self.tokens = (self.tokens + refilled).min(BURST);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How many Events may wait to be published; past it, they are dropped.
const QUEUE: usize = 64;
/// How long one publish may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a note may be (the API's limit is 1 kB).
const NOTE_MAX: usize = 1000;
/// How often the cycles and the election are looked at.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// One Event to publish: why, what it says, and the remote it is about.
#[derive(Debug)]
struct Queued {
    reason: Reason,
    note: String,
    remote: Option<String>,
}

/// Where Events are sent: cheap to clone; sending never waits.
#[derive(Debug, Clone)]
pub(crate) struct Events {
    queue: mpsc::Sender<Queued>,
    counts: IntCounterVec,
}

/// What an Event is about: tether's Pod, and for an Event about one
/// remote, that remote as a part of it (`fieldPath: remotes{cluster-b}`,
/// as the kubelet names a container `spec.containers{nginx}`). kube's
/// recorder, as client-go's, folds the repeats of one Event into a count
/// and keeps the first note; the part is in what it folds by, so that
/// three remotes lost are three Events, each naming its remote, and a
/// remote lost again adds to its own count.
fn regarding(pod: &ObjectReference, remote: Option<&str>) -> ObjectReference {
    ObjectReference {
        field_path: remote.map(|remote| format!("remotes{{{remote}}}")),
        ..pod.clone()
    }
}

/// The publishing task, to wait for at shutdown.
#[derive(Debug)]
pub(crate) struct Publisher {
    task: JoinHandle<()>,
}

impl Publisher {
    /// Waits, at most `PUBLISH_TIMEOUT`, for what was queued to be sent;
    /// every [`Events`] must be dropped first.
    pub(crate) async fn flush(self) {
        let _ = tokio::time::timeout(PUBLISH_TIMEOUT, self.task).await;
    }
}

/// The Pod that Events are about, from the downward API; `None` outside a
/// pod (no `POD_NAME` or `POD_NAMESPACE`).
#[must_use]
pub(crate) fn own_pod() -> Option<ObjectReference> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(var("POD_NAME")?),
        namespace: Some(var("POD_NAMESPACE")?),
        uid: var("POD_UID"),
        ..ObjectReference::default()
    })
}

/// `tether_events_total{result}`, every result exported from the start.
fn counts(registry: &Registry) -> prometheus::Result<IntCounterVec> {
    let counts = IntCounterVec::new(
        Opts::new(
            "tether_events_total",
            "Kubernetes Events on tether's Pod, by result: published, dropped (rate limit or a full queue) or failed.",
        ),
        &["result"],
    )?;
    for result in ["published", "dropped", "failed"] {
        counts.with_label_values(&[result]);
    }
    registry.register(Box::new(counts.clone()))?;
    Ok(counts)
}

impl Events {
    /// Starts publishing Events about `pod` through `client`.
    ///
    /// # Errors
    ///
    /// If the metric's name is taken.
    pub(crate) fn start(
        client: kube::Client,
        pod: ObjectReference,
        registry: &Registry,
    ) -> prometheus::Result<(Self, Publisher)> {
        let counts = counts(registry)?;
        let (queue, mut queued) = mpsc::channel::<Queued>(QUEUE);
        let reporter = Reporter {
            controller: "tether".to_owned(),
            instance: pod.name.clone(),
        };
        let recorder = Recorder::new(client, reporter);
        let published = counts.clone();
        let task = tokio::spawn(async move {
            let mut filter = SpamFilter::new();
            let mut warned = false;
            while let Some(Queued {
                reason,
                note,
                remote,
            }) = queued.recv().await
            {
                if !filter.allow() {
                    published.with_label_values(&["dropped"]).inc();
                    debug!(
                        reason = reason.as_str(),
                        "Event dropped: past the rate limit"
                    );
                    continue;
                }
                let event = Event {
                    type_: reason.event_type(),
                    reason: reason.as_str().to_owned(),
                    note: Some(note),
                    action: reason.action().to_owned(),
                    secondary: None,
                };
                let regarding = regarding(&pod, remote.as_deref());
                match tokio::time::timeout(PUBLISH_TIMEOUT, recorder.publish(&event, &regarding))
                    .await
                {
                    Ok(Ok(())) => {
                        warned = false;
                        published.with_label_values(&["published"]).inc();
                    }
                    failed => {
                        published.with_label_values(&["failed"]).inc();
                        let error = match failed {
                            Ok(Err(err)) => tether_supervisor::error_chain(&err),
                            _ => format!("no answer within {PUBLISH_TIMEOUT:?}"),
                        };
                        // Once until one gets through: an apiserver that
                        // refuses Events would refuse each.
                        if !warned {
                            warned = true;
                            warn!(reason = reason.as_str(), %error, "cannot record an Event on tether's Pod");
                        }
                    }
                }
            }
        });
        Ok((Self { queue, counts }, Publisher { task }))
    }

    /// Queues an Event; dropped (and counted) when the queue is full.
    pub(crate) fn record(&self, reason: Reason, note: &str) {
        self.record_about(reason, note, None);
    }

    /// Queues an Event about `remote`, if it names one.
    fn record_about(&self, reason: Reason, note: &str, remote: Option<&str>) {
        let queued = Queued {
            reason,
            note: tether_supervisor::printable(note, NOTE_MAX).into_owned(),
            remote: remote.map(str::to_owned),
        };
        if self.queue.try_send(queued).is_err() {
            self.counts.with_label_values(&["dropped"]).inc();
        }
    }

    /// Records each cycle's end and each change of leadership, as
    /// `supervisor` and `election` show them, until `stop`.
    pub(crate) async fn watch(
        self,
        supervisor: SupervisorHandle,
        election: Option<ElectionHandle>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut seen_cycle = 0;
        let mut leading = false;
        loop {
            let stopping = stop.is_cancelled();
            self.record_new_ends(&supervisor, &mut seen_cycle);
            if let Some(election) = &election {
                let state = election.state();
                if state.leading != leading {
                    leading = state.leading;
                    let (reason, what) = if leading {
                        (Reason::LeadershipAcquired, "leads: it runs the manager")
                    } else if stopping || state.stopped {
                        // The election stops before the watch does, with
                        // the Lease's release between: a turn of the watch
                        // may see it first.
                        (
                            Reason::LeadershipReleased,
                            "released it: tether is shutting down, its manager stopped",
                        )
                    } else {
                        (Reason::LeadershipLost, "no longer leads: its manager stops")
                    };
                    self.record(
                        reason,
                        &format!("{} on Lease {}: {}", state.identity, state.lease, what),
                    );
                }
            }
            if stopping {
                return;
            }
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(WATCH_EVERY) => {}
            }
        }
    }

    /// Records the cycles that ended since `seen`, oldest first.
    fn record_new_ends(&self, supervisor: &SupervisorHandle, seen: &mut u64) {
        let status = supervisor.status();
        let since = *seen;
        for ended in status.recent.iter().filter(|c| c.number > since) {
            if let Some(reason) = Reason::of_cycle_end(ended.cause.kind()) {
                self.record_about(
                    reason,
                    &cycle_note(ended.number, &ended.cause),
                    ended.cause.remote(),
                );
            }
            *seen = ended.number;
        }
    }
}

/// What a cycle end's Event says.
fn cycle_note(number: u64, cause: &Cause) -> String {
    format!("cycle {number} ended: {}", cause.in_words())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_a_closed_set_of_pascal_case_words() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        for name in &names {
            assert!(
                name.chars().next().is_some_and(char::is_uppercase)
                    && name.chars().all(char::is_alphanumeric),
                "{name}"
            );
        }
        let unique: std::collections::BTreeSet<&&str> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        // Every cause of a cycle's end has its reason, or an Event of its
        // own elsewhere.
        for kind in CauseKind::ALL {
            let own = matches!(kind, CauseKind::LeadershipLost | CauseKind::ShardChanged);
            assert_eq!(Reason::of_cycle_end(kind).is_none(), own, "{kind:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_spam_filter_lets_25_through_then_one_every_five_minutes() {
        let mut filter = SpamFilter::new();
        let allowed = (0..100).filter(|_| filter.allow()).count();
        assert_eq!(allowed, 25);
        tokio::time::advance(REFILL_EVERY.saturating_sub(Duration::from_secs(1))).await;
        assert!(!filter.allow(), "a token came early");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(filter.allow());
        assert!(!filter.allow());
        // A long quiet spell refills the burst, no more.
        tokio::time::advance(REFILL_EVERY * 100).await;
        assert_eq!((0..100).filter(|_| filter.allow()).count(), 25);
    }
}
