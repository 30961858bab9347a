//! tether as PID 1 in a container: orphaned processes are reparented to it,
//! and their zombies must be reaped, as tini does.
//!
//! tether's own children are reaped by whoever started them: tokio for the
//! exec manager's process, the standard library for credential plugins.
//! Reaping with `waitpid(-1)` would steal their exit statuses. So the
//! reaper reaps, by pid, only a zombie child that was already a zombie a
//! scan ago: no owner waits that long, since each waits as soon as its child
//! ends.

use std::collections::BTreeSet;
use std::time::Duration;

use rustix::process::{Pid, WaitOptions};
use tracing::debug;

/// How often `/proc` is scanned for zombies.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Starts reaping if this process is PID 1; does nothing otherwise.
pub fn start_if_init() {
    if rustix::process::getpid().is_init() {
        tokio::spawn(reap_forever());
    }
}

async fn reap_forever() {
    let mut seen = BTreeSet::new();
    let mut ticks = tokio::time::interval(SCAN_EVERY);
    loop {
        ticks.tick().await;
        let zombies = zombie_children();
        for pid in zombies.intersection(&seen) {
            if let Some(pid) = Pid::from_raw(*pid)
                && let Ok(Some(_)) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)
            {
                debug!(
                    pid = pid.as_raw_nonzero().get(),
                    "reaped an orphaned zombie"
                );
            }
        }
        seen = zombies;
    }
}

/// A process, as `/proc/<pid>/stat` describes it.
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
    /// Parses a `/proc/<pid>/stat` line. The command name may hold spaces
    /// and parentheses: the fields start after its last `)`.
    fn parse(stat: &str) -> Option<Self> {
        let (_, fields) = stat.rsplit_once(')')?;
        let mut fields = fields.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgrp = fields.next()?.parse().ok()?;
        Some(Self { state, ppid, pgrp })
    }

    /// Whether it is a zombie: dead, waiting to be reaped.
    pub(crate) fn is_zombie(self) -> bool {
        self.state == 'Z'
    }
}

/// Every process this one can see, with its stat.
pub(crate) fn processes() -> impl Iterator<Item = (i32, Stat)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Stat::parse(&stat).map(|stat| (pid, stat))
        })
}

/// The pids of this process's children that are zombies now.
fn zombie_children() -> BTreeSet<i32> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    processes()
        .filter(|(_, stat)| stat.ppid == me && stat.is_zombie())
        .map(|(pid, _)| pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_parses_whatever_the_command_name() {
        let zombie = Stat::parse("42 (sleep) Z 1 40 40 0 -1").expect("parses");
        assert_eq!((zombie.ppid, zombie.pgrp), (1, 40));
        assert!(zombie.is_zombie());
        let odd = Stat::parse("42 (a) Z (b)) S 7 42 42 0 -1").expect("parses");
        assert_eq!((odd.state, odd.ppid), ('S', 7));
        assert_eq!(Stat::parse("garbage"), None);
    }

    #[test]
    fn this_process_is_among_the_processes() {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        let (_, stat) = processes().find(|(pid, _)| *pid == me).expect("itself");
        assert!(!stat.is_zombie());
    }
}
