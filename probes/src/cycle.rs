//! When a cycle must end because of a remote.
//!
//! A cycle subscribes when it starts, so it only sees transitions that
//! happen during its life: a remote that was already unreachable when the
//! cycle began does not end it again. That is how a dead remote avoids a
//! rebuild storm while staying visible in metrics and alerts.

use tokio::sync::broadcast;
use tracing::warn;

use crate::{Reachability, Transition};

/// Why a cycle must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CycleEnd {
    /// A remote the cycle uses became unreachable.
    Lost(String),
    /// A remote the cycle uses came back, and rebuilds on recovery are on.
    Recovered(String),
}

/// Waits for the transition that must end a cycle using the remotes for
/// which `uses` is true. Returns `None` if the probe set is gone.
///
/// # Cancellation safety
///
/// Cancel safe: a transition is consumed only when it is returned or
/// skipped as irrelevant.
pub async fn next_cycle_end(
    transitions: &mut broadcast::Receiver<Transition>,
    uses: impl Fn(&str) -> bool,
    rebuild_on_recovery: bool,
) -> Option<CycleEnd> {
    loop {
        let transition = match transitions.recv().await {
            Ok(transition) => transition,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                warn!(
                    missed,
                    "fell behind the probe transitions; some were skipped"
                );
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        if !uses(&transition.remote) {
            continue;
        }
        match (transition.from, transition.to) {
            (_, Reachability::Unreachable) => return Some(CycleEnd::Lost(transition.remote)),
            (Reachability::Unreachable, Reachability::Reachable) if rebuild_on_recovery => {
                return Some(CycleEnd::Recovered(transition.remote));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition(remote: &str, from: Reachability, to: Reachability) -> Transition {
        Transition {
            remote: remote.into(),
            host: "h:443".into(),
            from,
            to,
            failures: 0,
            error: None,
        }
    }

    #[tokio::test]
    async fn only_used_remotes_end_the_cycle() {
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(transition(
            "other",
            Reachability::Reachable,
            Reachability::Unreachable,
        ))
        .expect("send");
        tx.send(transition(
            "a",
            Reachability::Unknown,
            Reachability::Reachable,
        ))
        .expect("send");
        tx.send(transition(
            "a",
            Reachability::Reachable,
            Reachability::Unreachable,
        ))
        .expect("send");
        let end = next_cycle_end(&mut rx, |r| r == "a", true).await;
        assert_eq!(end, Some(CycleEnd::Lost("a".into())));
    }

    #[tokio::test]
    async fn recovery_ends_the_cycle_only_when_asked() {
        let (tx, mut rx) = broadcast::channel(8);
        tx.send(transition(
            "a",
            Reachability::Unreachable,
            Reachability::Reachable,
        ))
        .expect("send");
        drop(tx);
        assert_eq!(next_cycle_end(&mut rx, |_| true, false).await, None);

        let (tx, mut rx) = broadcast::channel(8);
        tx.send(transition(
            "a",
            Reachability::Unreachable,
            Reachability::Reachable,
        ))
        .expect("send");
        assert_eq!(
            next_cycle_end(&mut rx, |_| true, true).await,
            Some(CycleEnd::Recovered("a".into()))
        );
    }
}
