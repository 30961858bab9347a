//! What the supervisor hears about remotes from outside: the input that
//! ends cycles, as `kube-runtime`'s `Controller::reconcile_all_on` takes
//! its triggers.

/// A change in a remote's reachability, as a source of signals (tether's
/// probes) publishes it.
///
/// Feed a stream of these to
/// [`Supervisor::end_cycles_on`](crate::Supervisor::end_cycles_on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteSignal {
    /// The remote became unreachable.
    Lost(String),
    /// The remote was unreachable and is reachable again.
    Recovered(String),
    /// The source fell behind and dropped this many signals. Any of them may
    /// have been a loss, so the running cycle ends (`transitions_missed`).
    Missed(u64),
}

impl std::fmt::Display for RemoteSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lost(remote) => write!(f, "{remote} lost"),
            Self::Recovered(remote) => write!(f, "{remote} recovered"),
            Self::Missed(count) => write!(f, "{count} signals missed"),
        }
    }
}
