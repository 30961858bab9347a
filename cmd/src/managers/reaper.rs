//! tether as PID 1 in a container: orphaned processes are reparented to it,
//! and their zombies must be reaped, as tini does.
//!
//! tether's own children are reaped by whoever started them: tokio for the
//! exec manager's process, the standard library for credential plugins.
//! Reaping with `waitpid(-1)`, or any zombie child, would steal their exit
//! statuses (a plugin's build then fails with "No child processes"). So
//! the reaper reaps, by pid, only what is not tether's own:
//! - the exec manager's process is registered ([`own`]) while tether waits
//!   for it, and never reaped here;
//! - a process in tether's own process group was started by tether (the
//!   standard library does not move a child to a group of its own), so its
//!   zombie is its starter's: reaped here only after [`OWN_GROUP_GRACE`],
//!   when no starter is still waiting for it;
//! - any other zombie child is a reparented orphan: reaped once it has been
//!   a zombie for a scan.
//!
//! A live orphan outside tether's group and outside the running exec
//! manager's group left its group (`setsid`): tether cannot stop it with the
//! group, and says so once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::{Pid, WaitOptions};
use tokio::time::Instant;
use tracing::{debug, warn};

/// How often `/proc` is scanned for zombies.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// How long a zombie in tether's own process group is left to whoever
/// started it: far longer than any starter takes to wait once its child
/// has ended, short enough that a leaked one does not linger.
pub const OWN_GROUP_GRACE: Duration = Duration::from_secs(300);

/// The processes tether waits for itself, by pid (also their process
/// groups: each is its group's leader).
static OWN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// While alive, marks `pid` as a process tether waits for itself.
#[derive(Debug)]
pub struct Own(i32);

impl Drop for Own {
    fn drop(&mut self) {
        crate::lock(&OWN).remove(&self.0);
    }
}

/// Marks `pid`, a child tether waits for itself and the leader of its own
/// process group, until the guard is dropped.
#[must_use]
pub fn own(pid: u32) -> Own {
    let pid = i32::try_from(pid).unwrap_or(0);
    crate::lock(&OWN).insert(pid);
    Own(pid)
}

/// Starts reaping if this process is PID 1; does nothing otherwise.
pub fn start_if_init() {
    if rustix::process::getpid().is_init() {
        tokio::spawn(reap_forever());
    }
}

/// What one scan of this process's children calls for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scan {
    /// Zombies to reap now.
    reap: Vec<i32>,
    /// Live processes that left their group, first seen in this scan.
    escaped: Vec<i32>,
}

/// What the reaper remembers between scans.
#[derive(Debug, Default)]
struct Memory {
    /// Zombies, with when each was first seen as one.
    zombies: BTreeMap<i32, Instant>,
    /// Escapees already reported.
    reported: BTreeSet<i32>,
}

impl Memory {
    /// Judges `children` (this process's children, with their stats) now,
    /// for a process whose own group is `group`, given the processes it
    /// waits for itself.
    fn scan(&mut self, children: &[(i32, Stat)], group: i32, own: &BTreeSet<i32>) -> Scan {
        let now = Instant::now();
        let mut scan = Scan::default();
        let mut zombies = BTreeMap::new();
        for (pid, stat) in children {
            if own.contains(pid) {
                continue;
            }
            if stat.is_zombie() {
                let since = *self.zombies.get(pid).unwrap_or(&now);
                zombies.insert(*pid, since);
                let wait = if stat.pgrp == group {
                    OWN_GROUP_GRACE
                } else {
                    SCAN_EVERY
                };
                if now.duration_since(since) >= wait {
                    scan.reap.push(*pid);
                }
            } else if stat.pgrp != group && !own.contains(&stat.pgrp) && self.reported.insert(*pid)
            {
                scan.escaped.push(*pid);
            }
        }
        self.zombies = zombies;
        let alive: BTreeSet<i32> = children.iter().map(|(pid, _)| *pid).collect();
        self.reported.retain(|pid| alive.contains(pid));
        scan
    }
}

async fn reap_forever() {
    let mut memory = Memory::default();
    let mut ticks = tokio::time::interval(SCAN_EVERY);
    let me = rustix::process::getpid().as_raw_nonzero().get();
    // From /proc, as the children's are: as PID 1 of a PID namespace,
    // tether's group may lie outside it and read as 0.
    let group = procfs::process::Process::myself()
        .and_then(|me| me.stat())
        .map_or(0, |stat| stat.pgrp);
    loop {
        ticks.tick().await;
        let children: Vec<(i32, Stat)> = processes().filter(|(_, stat)| stat.ppid == me).collect();
        let own = crate::lock(&OWN).clone();
        let scan = memory.scan(&children, group, &own);
        for pid in scan.reap {
            if let Some(pid) = Pid::from_raw(pid)
                && let Ok(Some(_)) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)
            {
                debug!(
                    pid = pid.as_raw_nonzero().get(),
                    "reaped an orphaned zombie"
                );
            }
        }
        for pid in scan.escaped {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            warn!(
                pid,
                process = %tether_supervisor::printable(name.trim(), 64),
                "a process left the manager's process group (setsid?) and outlived its parent; tether cannot stop it with the group, and it may hold what a new manager needs"
            );
        }
    }
}

/// What the reaper needs of a process's `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// The state letter: `R`, `S`, `Z`, ...
    pub(crate) state: char,
    /// The parent.
    pub(crate) ppid: i32,
    /// The process group.
    pub(crate) pgrp: i32,
}

impl Stat {
    /// Whether it is a zombie: dead, waiting to be reaped.
    pub(crate) fn is_zombie(self) -> bool {
        self.state == 'Z'
    }
}

/// Every process this one can see, with its stat; one that ends while it
/// is read is left out.
pub(crate) fn processes() -> impl Iterator<Item = (i32, Stat)> {
    procfs::process::all_processes()
        .into_iter()
        .flatten()
        .filter_map(|process| {
            let stat = process.ok()?.stat().ok()?;
            let seen = Stat {
                state: stat.state,
                ppid: stat.ppid,
                pgrp: stat.pgrp,
            };
            Some((stat.pid, seen))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(state: char, pgrp: i32) -> Stat {
        Stat {
            state,
            ppid: 1,
            pgrp,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn own_children_are_left_to_their_starters_and_orphans_are_reaped() {
        let mut memory = Memory::default();
        let own: BTreeSet<i32> = [50].into();
        // 10: a credential plugin, in tether's group (1). 50: the exec
        // child tether waits for. 60: an orphan from its group. 70: one
        // that left it.
        let children = [
            (10, stat('Z', 1)),
            (50, stat('Z', 50)),
            (60, stat('Z', 50)),
            (70, stat('S', 70)),
        ];
        let first = memory.scan(&children, 1, &own);
        assert_eq!(first.reap, Vec::<i32>::new(), "reaped a zombie seen once");
        assert_eq!(first.escaped, vec![70]);
        tokio::time::advance(SCAN_EVERY).await;
        let second = memory.scan(&children, 1, &own);
        assert_eq!(second.reap, vec![60], "only the orphan");
        assert!(second.escaped.is_empty(), "an escapee is told of once");
        tokio::time::advance(OWN_GROUP_GRACE).await;
        let late = memory.scan(&children, 1, &own);
        assert_eq!(
            late.reap,
            vec![10, 60],
            "a zombie of tether's group, long left, is reaped"
        );
    }

    #[test]
    fn this_process_is_among_the_processes() {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let (_, stat) = processes().find(|(pid, _)| *pid == me).expect("itself");
        assert!(!stat.is_zombie());
    }
}
