//! The process group a cycle's process runs in, and its stop: the stop
//! signal, the grace period, SIGKILL, and the reap.

use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::process::Child;
use tokio::time::{Instant, sleep, timeout};
use tracing::warn;

use super::ExitHow;
use crate::managers::reaper;

/// How often a stopping group is checked for members left.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long SIGKILL may take to empty a group before tether goes on.
pub(super) const KILL_WAIT: Duration = Duration::from_secs(5);

pub(super) fn pid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid).ok().and_then(Pid::from_raw)
}

/// A running process group: SIGKILL on drop, so that a cycle whose future
/// is dropped (shutdown past its grace) leaves nothing behind.
pub(super) struct Group(pub(super) Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(self.0, Signal::KILL);
    }
}

impl Group {
    pub(super) fn signal(&self, signal: Signal) {
        let _ = rustix::process::kill_process_group(self.0, signal);
    }

    /// Whether no process of the group is alive. Zombies count as gone:
    /// they are dead, and whoever they were reparented to reaps them.
    fn is_empty(&self) -> bool {
        let group = self.0.as_raw_nonzero().get();
        !reaper::processes().any(|(_, stat)| stat.pgrp == group && !stat.is_zombie())
    }

    /// Waits until the group is empty, or `within` has passed; returns
    /// whether it emptied.
    async fn emptied_within(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            sleep(GROUP_POLL).await;
        }
        true
    }

    /// Stops what is left of the group after its leader was reaped:
    /// `signal`, then SIGKILL after `grace`.
    pub(super) async fn stop_leftovers(&self, signal: Signal, grace: Duration) {
        if self.is_empty() {
            return;
        }
        warn!(
            group = self.0.as_raw_nonzero().get(),
            "the manager process left processes behind; stopping them"
        );
        self.signal(signal);
        if !self.emptied_within(grace).await {
            self.signal(Signal::KILL);
            if !self.emptied_within(KILL_WAIT).await {
                warn!(
                    group = self.0.as_raw_nonzero().get(),
                    "processes of the group outlived SIGKILL"
                );
            }
        }
    }
}

/// Stops `child` and its group: `signal`, then SIGKILL after `grace`; waits
/// for the child. Returns how it ended.
pub(super) async fn stop(
    child: &mut Child,
    group: &Group,
    signal: Signal,
    grace: Duration,
) -> ExitHow {
    let started = Instant::now();
    group.signal(signal);
    let status = if let Ok(status) = timeout(grace, child.wait()).await {
        status
    } else {
        warn!(
            ?grace,
            "the manager process did not stop within its grace period; SIGKILL"
        );
        group.signal(Signal::KILL);
        child.wait().await
    };
    let how = status.map_or(ExitHow::Code(-1), ExitHow::of);
    group
        .stop_leftovers(signal, grace.saturating_sub(started.elapsed()))
        .await;
    how
}

/// Kills `child` and its group at once (SIGKILL, no grace), and waits for
/// it. Returns how it ended.
pub(super) async fn kill(child: &mut Child, group: &Group) -> ExitHow {
    group.signal(Signal::KILL);
    let how = child.wait().await.map_or(ExitHow::Code(-1), ExitHow::of);
    group.stop_leftovers(Signal::KILL, Duration::ZERO).await;
    how
}
