//! tether as PID 1 in a container: orphaned processes are reparented to it,
//! and their zombies must be reaped, as tini does.
//!
//! tether's own children are reaped by whoever started them: tokio for the
//! exec manager's process, the standard library for credential plugins.
//! Reaping with `waitpid(-1)`, or any zombie child, would steal their exit
//! statuses (a plugin's build then fails with "No child processes"). So
//! the reaper reaps, by pid, only what is not tether's own:
//! - the exec manager's process is registered ([`spawn_own`]) while tether
//!   waits for it, and never reaped here. It is registered under the same
//!   lock the reaper takes after it lists the children, so a scan never
//!   sees it between its fork and its registration;
//! - a process in tether's own process group was started by tether (the
//!   standard library does not move a child to a group of its own), so its
//!   zombie is its starter's: reaped here only after [`OWN_GROUP_GRACE`],
//!   when no starter is still waiting for it;
//! - any other zombie child is a reparented orphan: reaped once it has been
//!   a zombie for a scan.
//!
//! A live orphan outside tether's group and outside the running exec
//! manager's group left its group (`setsid`): tether cannot stop it with the
//! group, and says so once, when it has stayed out for a scan (so the name
//! given is the one it settled on, not a passing `setsid`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::{Pid, WaitOptions};
use tokio::process::Child;
use tokio::time::Instant;
use tracing::{debug, warn};

/// How often `/proc` is scanned for zombies.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// How long a zombie in tether's own process group is left to whoever
/// started it: far longer than any starter takes to wait once its child
/// has ended, short enough that a leaked one does not linger.
pub(crate) const OWN_GROUP_GRACE: Duration = Duration::from_secs(300);

/// The processes tether waits for itself, by pid (also their process
/// groups: each is its group's leader).
static OWN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// While alive, marks `pid` as a process tether waits for itself.
#[derive(Debug)]
pub(crate) struct Own(i32);

impl Drop for Own {
    fn drop(&mut self) {
        crate::lock(&OWN).remove(&self.0);
    }
}

/// Spawns `command`, a child tether waits for itself and the leader of its
/// own process group, and marks it as such until the guard is dropped.
///
/// The registry stays locked from before the fork until the pid is in it,
/// and a scan takes that lock after it lists the children: whatever child
/// a scan saw, it also sees whether it is tether's own.
///
/// # Errors
///
/// The spawn's error, when the command cannot be started.
pub(crate) fn spawn_own(command: &mut tokio::process::Command) -> std::io::Result<(Child, Own)> {
    let mut own = crate::lock(&OWN);
    let child = command.spawn()?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .unwrap_or(0);
    own.insert(pid);
    Ok((child, Own(pid)))
}

/// Starts reaping if this process is PID 1; does nothing otherwise.
pub(crate) fn start_if_init() {
    if rustix::process::getpid().is_init() {
        tokio::spawn(reap_forever());
    }
}

/// What one scan of this process's children calls for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scan {
    /// Zombies to reap now.
    reap: Vec<i32>,
    /// Live processes out of their group for a scan, to report now.
    escaped: Vec<i32>,
}

/// What the reaper remembers between scans.
#[derive(Debug, Default)]
struct Memory {
    /// Zombies, with when each was first seen as one.
    zombies: BTreeMap<i32, Instant>,
    /// Live processes out of their group, with when each was first seen so.
    strays: BTreeMap<i32, Instant>,
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
        let mut strays = BTreeMap::new();
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
            } else if stat.pgrp != group && !own.contains(&stat.pgrp) {
                let since = *self.strays.get(pid).unwrap_or(&now);
                strays.insert(*pid, since);
                if now.duration_since(since) >= SCAN_EVERY && self.reported.insert(*pid) {
                    scan.escaped.push(*pid);
                }
            }
        }
        self.reported.retain(|pid| strays.contains_key(pid));
        self.zombies = zombies;
        self.strays = strays;
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
        // After the listing: a child being spawned is registered by now.
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
        // that left it. 80: one out of its group for a moment, as the exec
        // child is between its fork and its registration.
        let children = [
            (10, stat('Z', 1)),
            (50, stat('Z', 50)),
            (60, stat('Z', 50)),
            (70, stat('S', 70)),
        ];
        let mut first_seen = children.to_vec();
        first_seen.push((80, stat('S', 80)));
        let first = memory.scan(&first_seen, 1, &own);
        assert_eq!(first.reap, Vec::<i32>::new(), "reaped a zombie seen once");
        assert!(first.escaped.is_empty(), "told of a process seen once");
        tokio::time::advance(SCAN_EVERY).await;
        let second = memory.scan(&children, 1, &own);
        assert_eq!(second.reap, vec![60], "only the orphan");
        assert_eq!(second.escaped, vec![70], "only the one out for a scan");
        tokio::time::advance(OWN_GROUP_GRACE).await;
        let late = memory.scan(&children, 1, &own);
        assert_eq!(
            late.reap,
            vec![10, 60],
            "a zombie of tether's group, long left, is reaped"
        );
        assert!(late.escaped.is_empty(), "an escapee is told of once");
    }

    #[tokio::test]
    async fn a_spawned_child_is_own_from_the_moment_spawn_returns_until_its_guard_drops() {
        let (mut child, guard) =
            spawn_own(tokio::process::Command::new("true").kill_on_drop(true)).expect("true");
        let pid = i32::try_from(child.id().expect("not yet waited for")).expect("a pid");
        assert!(crate::lock(&OWN).contains(&pid));
        drop(guard);
        assert!(!crate::lock(&OWN).contains(&pid));
        assert!(child.wait().await.expect("waited").success());
    }

    #[test]
    fn this_process_is_among_the_processes() {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let (_, stat) = processes().find(|(pid, _)| *pid == me).expect("itself");
        assert!(!stat.is_zombie());
    }
}
