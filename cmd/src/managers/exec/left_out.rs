//! The optional remotes a process that does not follow its remotes file
//! is restarted without, for their loss, and when each is put back: once
//! it has stayed reachable for `putBackAfter`. A remote that flaps faster
//! is never put back while it flaps, so it restarts the process at most
//! twice per `putBackAfter`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Plan;

/// Why the process was restarted within its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Restart {
    /// An optional remote it was told of was lost.
    LeftOut,
    /// An optional remote left out stayed reachable for `putBackAfter`.
    PutBack,
    /// A process that follows its file did not say in time that it let go
    /// of a remote dropped from it.
    NotReleased,
}

impl Restart {
    pub(super) const ALL: [Self; 3] = [Self::LeftOut, Self::PutBack, Self::NotReleased];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Self::LeftOut => "remote_left_out",
            Self::PutBack => "remote_put_back",
            Self::NotReleased => "remote_not_released",
        }
    }
}

/// The optional remotes a process that does not follow its remotes file
/// is started without, for their loss, and since when each has been
/// reachable again.
#[derive(Debug, Default)]
pub(super) struct LeftOut(BTreeMap<String, Option<Instant>>);

impl LeftOut {
    /// Looks at `plan`'s optional remotes as `lost` (the probes) says
    /// they are now, and says whether the process must restart, and why:
    /// one it is told of was lost, or one left out has stayed reachable
    /// for `hold`.
    pub(super) fn look(
        &mut self,
        plan: &Plan,
        lost: impl Fn(&str) -> bool,
        hold: Duration,
    ) -> Option<Restart> {
        let now = Instant::now();
        let mut restart = None;
        self.0
            .retain(|name, _| plan.remotes.iter().any(|r| &r.name == name && !r.required));
        for remote in plan.remotes.iter().filter(|r| !r.required) {
            match (self.0.get_mut(&remote.name), lost(&remote.name)) {
                (None, true) => {
                    self.0.insert(remote.name.clone(), None);
                    restart = Some(Restart::LeftOut);
                }
                (Some(since), true) => *since = None,
                (Some(since @ None), false) => *since = Some(now),
                (Some(Some(since)), false) => {
                    if now.saturating_duration_since(*since) >= hold {
                        self.0.remove(&remote.name);
                        restart = restart.or(Some(Restart::PutBack));
                    }
                }
                (None, false) => {}
            }
        }
        restart
    }

    /// When the next remote left out may be put back.
    pub(super) fn next(&self, hold: Duration) -> Option<Instant> {
        self.0.values().flatten().min().map(|since| *since + hold)
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The remotes left out, by name.
    pub(super) fn names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::config::RemoteSource;
    use crate::config::remote::ResolvedRemote;

    fn plan(optional: &[&str]) -> Plan {
        let remote = |name: &str, required| {
            let config = kube::Config::new("https://h:6443".parse().expect("a URL"));
            ResolvedRemote::new(name, required, RemoteSource::Inferred, Arc::new(config))
                .expect("a server to probe")
        };
        let mut remotes = vec![remote("required", true)];
        remotes.extend(optional.iter().map(|name| remote(name, false)));
        Plan {
            remotes: remotes.into_iter().collect(),
            watch: Vec::new(),
            exec: None,
        }
    }

    const HOLD: Duration = Duration::from_secs(300);
    /// A second short of the hold.
    const ALMOST: Duration = Duration::from_secs(299);

    /// A lost optional remote is left out at once, put back only after the
    /// hold of unbroken reachability, and a flap restarts the hold; a
    /// required remote is never left out.
    #[tokio::test(start_paused = true)]
    async fn a_lost_remote_is_left_out_at_once_and_put_back_after_the_hold() {
        let plan = plan(&["b"]);
        let mut out = LeftOut::default();
        let lost = |names: &'static [&'static str]| {
            let set: BTreeSet<&str> = names.iter().copied().collect();
            move |name: &str| set.contains(name)
        };
        assert_eq!(out.look(&plan, lost(&["required"]), HOLD), None);
        assert_eq!(out.look(&plan, lost(&["b"]), HOLD), Some(Restart::LeftOut));
        assert!(out.contains("b"));
        assert_eq!(out.look(&plan, lost(&["b"]), HOLD), None, "counted twice");

        // Back for a while, then lost again: the hold starts over.
        assert_eq!(out.look(&plan, lost(&[]), HOLD), None);
        assert_eq!(out.next(HOLD), Some(Instant::now() + HOLD));
        tokio::time::advance(ALMOST).await;
        assert_eq!(out.look(&plan, lost(&["b"]), HOLD), None);
        assert_eq!(out.next(HOLD), None, "a lost remote has no put-back time");
        assert_eq!(out.look(&plan, lost(&[]), HOLD), None);
        tokio::time::advance(ALMOST).await;
        assert_eq!(
            out.look(&plan, lost(&[]), HOLD),
            None,
            "put back within the hold"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(out.look(&plan, lost(&[]), HOLD), Some(Restart::PutBack));
        assert!(!out.contains("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_remote_that_leaves_the_plan_is_forgotten() {
        let mut out = LeftOut::default();
        assert_eq!(
            out.look(&plan(&["b"]), |n| n == "b", HOLD),
            Some(Restart::LeftOut)
        );
        assert_eq!(out.look(&plan(&[]), |_| false, HOLD), None);
        assert!(out.names().is_empty());
    }
}
