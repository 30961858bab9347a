//! The sustained-failure state machine of one remote.
//!
//! # Invariants
//!
//! - `Unknown` becomes `Reachable` on the first success, and `Unreachable`
//!   after `failure_threshold` consecutive failures.
//! - `Reachable` becomes `Unreachable` after `failure_threshold` consecutive
//!   failures; one success resets the failure streak.
//! - `Unreachable` becomes `Reachable` after `success_threshold` consecutive
//!   successes; one failure resets the success streak.
//! - Each change of state is reported exactly once, by the observation that
//!   caused it.

use std::fmt;

/// Where a remote stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reachability {
    /// Not probed successfully yet, and not failed enough to be unreachable.
    Unknown,
    /// Answering.
    Reachable,
    /// Failed `failure_threshold` times in a row.
    Unreachable,
}

impl Reachability {
    /// The `snake_case` name, used as the `to` label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Reachable => "reachable",
            Self::Unreachable => "unreachable",
        }
    }
}

impl fmt::Display for Reachability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The state machine.
#[derive(Debug, Clone)]
pub struct Tracker {
    state: Reachability,
    failures: u32,
    successes: u32,
    failure_threshold: u32,
    success_threshold: u32,
}

impl Tracker {
    /// A tracker in `Unknown`, with the given thresholds (each at least 1).
    #[must_use]
    pub fn new(failure_threshold: u32, success_threshold: u32) -> Self {
        Self {
            state: Reachability::Unknown,
            failures: 0,
            successes: 0,
            failure_threshold: failure_threshold.max(1),
            success_threshold: success_threshold.max(1),
        }
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> Reachability {
        self.state
    }

    /// The current failure streak.
    #[must_use]
    pub fn consecutive_failures(&self) -> u32 {
        self.failures
    }

    /// Records one probe; returns the new state if it changed.
    pub fn observe(&mut self, reachable: bool) -> Option<Reachability> {
        let next = if reachable {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            match self.state {
                Reachability::Unknown => Reachability::Reachable,
                Reachability::Unreachable if self.successes >= self.success_threshold => {
                    Reachability::Reachable
                }
                state => state,
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= self.failure_threshold {
                Reachability::Unreachable
            } else {
                self.state
            }
        };
        (next != self.state).then(|| {
            self.state = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tracker: &mut Tracker, script: &str) -> Vec<Option<Reachability>> {
        script.chars().map(|c| tracker.observe(c == 'T')).collect()
    }

    #[test]
    fn three_failures_make_unreachable_exactly_once() {
        let mut t = Tracker::new(3, 1);
        let seen = run(&mut t, "TFFFFF");
        assert_eq!(
            seen,
            [
                Some(Reachability::Reachable),
                None,
                None,
                Some(Reachability::Unreachable),
                None,
                None
            ]
        );
    }

    #[test]
    fn a_success_resets_the_streak() {
        let mut t = Tracker::new(3, 1);
        assert!(run(&mut t, "TFFTFF").iter().skip(1).all(Option::is_none));
        assert_eq!(t.state(), Reachability::Reachable);
        assert_eq!(t.consecutive_failures(), 2);
    }

    #[test]
    fn the_success_threshold_gives_hysteresis() {
        let mut t = Tracker::new(1, 2);
        run(&mut t, "TF");
        assert_eq!(t.state(), Reachability::Unreachable);
        assert_eq!(t.observe(true), None);
        assert_eq!(t.observe(false), None);
        assert_eq!(t.observe(true), None);
        assert_eq!(t.observe(true), Some(Reachability::Reachable));
    }

    #[test]
    fn unknown_can_fail_straight_to_unreachable() {
        let mut t = Tracker::new(2, 1);
        assert_eq!(run(&mut t, "FF"), [None, Some(Reachability::Unreachable)]);
    }
}
