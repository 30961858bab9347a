//! Why a cycle ended.

use std::fmt;

/// The closed set of reasons a cycle ends.
///
/// This is the value of the `cause` label on `tether_cycles_total`, so it never
/// carries data: the remote's name or an error's text would make the label set
/// unbounded. [`Cause`] carries that detail for logs and status pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CauseKind {
    /// A remote the cycle uses became unreachable during the cycle.
    RemoteLost,
    /// A remote came back, and the cycle is rebuilt so clients reconnect fresh.
    RemoteRecovered,
    /// New configuration was applied.
    ConfigChanged,
    /// The source of remote signals fell behind and dropped some, any of
    /// which may have been a loss.
    TransitionsMissed,
    /// The manager returned `Ok` although nobody cancelled it.
    ManagerExited,
    /// The manager returned an error.
    ManagerFailed,
    /// The manager panicked.
    ManagerPanicked,
    /// Building the manager failed before it ran.
    BuildFailed,
    /// This process may no longer build cycles: it lost the leadership.
    LeadershipLost,
    /// The remotes this replica owns changed: a replica joined or left.
    ShardChanged,
    /// The process is shutting down; no further cycle is built.
    Shutdown,
}

impl CauseKind {
    /// Every kind, in declaration order, so metrics can be pre-initialised.
    pub const ALL: [Self; 11] = [
        Self::RemoteLost,
        Self::RemoteRecovered,
        Self::ConfigChanged,
        Self::TransitionsMissed,
        Self::ManagerExited,
        Self::ManagerFailed,
        Self::ManagerPanicked,
        Self::BuildFailed,
        Self::LeadershipLost,
        Self::ShardChanged,
        Self::Shutdown,
    ];

    /// The `snake_case` label value, as used in metrics and logs.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RemoteLost => "remote_lost",
            Self::RemoteRecovered => "remote_recovered",
            Self::ConfigChanged => "config_changed",
            Self::TransitionsMissed => "transitions_missed",
            Self::ManagerExited => "manager_exited",
            Self::ManagerFailed => "manager_failed",
            Self::ManagerPanicked => "manager_panicked",
            Self::BuildFailed => "build_failed",
            Self::LeadershipLost => "leadership_lost",
            Self::ShardChanged => "shard_changed",
            Self::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for CauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a cycle ended, with the detail a person needs in a log line or on the
/// status page.
///
/// Its [`kind`](Self::kind) is the bounded part that metrics use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// A remote the cycle uses became unreachable during the cycle.
    RemoteLost {
        /// The configured name of the remote.
        remote: String,
    },
    /// A remote came back, and the cycle is rebuilt so clients reconnect fresh.
    RemoteRecovered {
        /// The configured name of the remote.
        remote: String,
    },
    /// New configuration was applied.
    ConfigChanged,
    /// The source of remote signals fell behind and dropped some, any of
    /// which may have been a loss.
    TransitionsMissed {
        /// How many signals were dropped.
        count: u64,
    },
    /// The manager returned `Ok` although nobody cancelled it.
    ManagerExited,
    /// The manager returned an error.
    ManagerFailed {
        /// The error and its sources, joined with `: `.
        error: String,
    },
    /// The manager panicked.
    ManagerPanicked {
        /// The panic payload, when it was a string.
        message: String,
    },
    /// Building the manager failed before it ran.
    BuildFailed {
        /// The error and its sources, joined with `: `.
        error: String,
    },
    /// This process may no longer build cycles: it lost the leadership.
    LeadershipLost,
    /// The remotes this replica owns changed.
    ShardChanged {
        /// Remotes it took.
        taken: usize,
        /// Remotes it gave up.
        given_up: usize,
    },
    /// The process is shutting down.
    Shutdown,
}

impl Cause {
    /// A remote was lost.
    #[must_use]
    pub fn remote_lost(remote: impl Into<String>) -> Self {
        Self::RemoteLost {
            remote: remote.into(),
        }
    }

    /// A remote recovered.
    #[must_use]
    pub fn remote_recovered(remote: impl Into<String>) -> Self {
        Self::RemoteRecovered {
            remote: remote.into(),
        }
    }

    /// The bounded kind of this cause, for metric labels.
    #[must_use]
    pub const fn kind(&self) -> CauseKind {
        match self {
            Self::RemoteLost { .. } => CauseKind::RemoteLost,
            Self::RemoteRecovered { .. } => CauseKind::RemoteRecovered,
            Self::ConfigChanged => CauseKind::ConfigChanged,
            Self::TransitionsMissed { .. } => CauseKind::TransitionsMissed,
            Self::ManagerExited => CauseKind::ManagerExited,
            Self::ManagerFailed { .. } => CauseKind::ManagerFailed,
            Self::ManagerPanicked { .. } => CauseKind::ManagerPanicked,
            Self::BuildFailed { .. } => CauseKind::BuildFailed,
            Self::LeadershipLost => CauseKind::LeadershipLost,
            Self::ShardChanged { .. } => CauseKind::ShardChanged,
            Self::Shutdown => CauseKind::Shutdown,
        }
    }
}

impl Cause {
    /// The remote the cause is about: the one lost or recovered.
    #[must_use]
    pub fn remote(&self) -> Option<&str> {
        match self {
            Self::RemoteLost { remote } | Self::RemoteRecovered { remote } => Some(remote),
            _ => None,
        }
    }

    /// The cause in words, for a person: `cluster-b unreachable`,
    /// `configuration changed`. [`Display`](fmt::Display) is for logs, and
    /// leads with the kind's label.
    #[must_use]
    pub fn in_words(&self) -> String {
        match self {
            Self::RemoteLost { remote } => format!("{remote} unreachable"),
            Self::RemoteRecovered { remote } => format!("{remote} reachable again"),
            Self::ConfigChanged => "configuration changed".to_owned(),
            Self::TransitionsMissed { count } => {
                format!("{count} reachability changes missed")
            }
            Self::ManagerExited => "the manager returned by itself".to_owned(),
            Self::ManagerFailed { error } => format!("the manager failed: {error}"),
            Self::ManagerPanicked { message } => format!("the manager panicked: {message}"),
            Self::BuildFailed { error } => format!("building the manager failed: {error}"),
            Self::LeadershipLost => "leadership lost".to_owned(),
            Self::ShardChanged { taken, given_up } => {
                format!("this replica's remotes changed: {taken} taken, {given_up} given up")
            }
            Self::Shutdown => "shutdown".to_owned(),
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind();
        match self {
            Self::RemoteLost { remote } | Self::RemoteRecovered { remote } => {
                write!(f, "{kind} (remote {remote})")
            }
            Self::ManagerFailed { error } | Self::BuildFailed { error } => {
                write!(f, "{kind}: {error}")
            }
            Self::ManagerPanicked { message } => write!(f, "{kind}: {message}"),
            Self::TransitionsMissed { count } => write!(f, "{kind} ({count} dropped)"),
            Self::ShardChanged { taken, given_up } => {
                write!(f, "{kind} ({taken} taken, {given_up} given up)")
            }
            Self::ConfigChanged | Self::ManagerExited | Self::LeadershipLost | Self::Shutdown => {
                kind.fmt(f)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_snake_case_and_unique() {
        let labels: Vec<_> = CauseKind::ALL.iter().map(|k| k.as_str()).collect();
        for label in &labels {
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label} is not snake_case"
            );
        }
        let mut unique = labels.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), labels.len());
    }

    #[test]
    fn display_names_the_remote_but_the_kind_does_not() {
        let cause = Cause::remote_lost("cluster-a");
        assert_eq!(cause.to_string(), "remote_lost (remote cluster-a)");
        assert_eq!(cause.kind().to_string(), "remote_lost");
    }

    #[test]
    fn display_of_a_failure_carries_its_error() {
        let cause = Cause::ManagerFailed {
            error: "watch ended: connection refused".into(),
        };
        assert_eq!(
            cause.to_string(),
            "manager_failed: watch ended: connection refused"
        );
    }
}
