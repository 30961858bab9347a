//! A new config file and rotated remote files, read by the daemon and
//! handed to the planner (`crate::desired`), which decides what they
//! change. Nothing here ends a cycle or touches the probes or the manager.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::Daemon;
use crate::config::remote::{self, ResolvedRemote};
use crate::config::sources::{self, Role};
use crate::config::{Config, ConfigError};

/// How often the config file is checked for changes. ConfigMap mounts swap a
/// symlink, which inotify on the file misses, so poll the content instead.
pub(super) const CONFIG_POLL: Duration = Duration::from_secs(2);

/// How many of the remotes' files a sweep may `stat` a second, on average:
/// at 10,000 remotes of three files each a sweep every 2 s took 2.7% of a
/// core; at this pace it runs every 15 s and takes a tenth of that.
const SWEEP_FILES_PER_SECOND: f64 = 2_000.0;

/// How long after a sweep of the remotes' files the next one runs: every
/// [`CONFIG_POLL`], or less often past [`SWEEP_FILES_PER_SECOND`]. A probe
/// that fails as a rotation would asks for its own files at once, so a
/// slower sweep only delays a rotation that broke nothing yet. This is the
/// pace for the remotes whose folders are not watched (`folders.rs`), and
/// what the checks a folder's change wakes are held to ([`Sweeps::spend`]).
fn sweep_every(files: usize) -> Duration {
    #[allow(clippy::cast_precision_loss)] // a count of files, far below 2^52
    let pace = Duration::from_secs_f64(files as f64 / SWEEP_FILES_PER_SECOND);
    pace.max(CONFIG_POLL)
}

/// How many times slower than [`sweep_every`] the sweep of every remote
/// runs when their folders are watched: a safety net for what inotify
/// misses (a file edited in place through a symlink into a folder not
/// watched, a filesystem without inotify). Every 60 s up to 4,000 files.
const SAFETY_SWEEP_SLOWER: u32 = 30;

/// How long after a sweep of every remote's files the next one runs.
fn safety_sweep_every(files: usize) -> Duration {
    sweep_every(files) * SAFETY_SWEEP_SLOWER
}

/// When the two sweeps of the remotes' files run next: over every remote
/// (at once when the daemon starts, which finds what changed before the
/// folders were watched; then as the safety net), and over those in
/// folders not watched, at the old pace; and what the checks the folders
/// woke spent of that pace.
#[derive(Debug)]
pub(super) struct Sweeps {
    every: Instant,
    unwatched: Instant,
    /// How far the checks that the folders' changes woke have spent the
    /// sweep's pace: each moves it on by its files' time at that pace.
    spent: Instant,
}

impl Sweeps {
    /// Spends, at `now`, the time that checking `files` of `every` file
    /// takes at the sweep's pace; gives when the next check may run: at
    /// once while the checks stay within one sweep of every file ahead of
    /// the pace.
    fn spend(&mut self, now: Instant, files: usize, every: usize) -> Instant {
        let window = sweep_every(every);
        #[allow(clippy::cast_precision_loss)] // counts of files, far below 2^52
        let share = files as f64 / every.max(1) as f64;
        self.spent = self.spent.max(now) + window.mul_f64(share);
        self.spent.checked_sub(window).map_or(now, |at| at.max(now))
    }
}

impl Default for Sweeps {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            every: now,
            unwatched: now,
            spent: now,
        }
    }
}

/// What made the daemon check a remote's files, as its log line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Noticed {
    /// An event in the folder of one of its files.
    Folder,
    /// A sweep: the paced one for remotes whose folders are not watched,
    /// or the slow safety net over every remote.
    Sweep,
    /// Its probe failed as a rotation would (a TLS failure, a 401).
    Probe,
}

impl Noticed {
    fn as_str(self) -> &'static str {
        match self {
            Self::Folder => "folder",
            Self::Sweep => "sweep",
            Self::Probe => "probe",
        }
    }
}

impl Daemon {
    /// Reads the config file again and applies it, or rejects it and keeps
    /// the last good one. Returns whether it was applied.
    pub async fn reload(&mut self) -> bool {
        let Some(path) = self.config.file.clone() else {
            info!("reload asked, but tether runs without a config file; nothing to do");
            return false;
        };
        match self.try_reload(&path).await {
            Ok(()) => {
                self.reloads.with_label_values(&["applied"]).inc();
                true
            }
            Err(err) => {
                self.reloads.with_label_values(&["rejected"]).inc();
                error!(error = %err, "config reload rejected; still running on the last good config");
                false
            }
        }
    }

    async fn try_reload(&mut self, path: &Path) -> Result<(), ConfigError> {
        let (next, restart) = Config::reload(path, &self.config)?;
        let next = next.with_command(self.config.command_line.clone())?;
        if next.exec.is_some() != self.config.exec.is_some() {
            return Err(ConfigError::new(
                &next.label(),
                "manager.exec",
                "switching between the built-in watch manager and the exec manager takes a restart",
            ));
        }
        let mut remotes = remote::resolve(&next).await?;
        // By name: a search of the list for each remote would be 50 million
        // comparisons at 10,000.
        let last: HashMap<&str, &ResolvedRemote> =
            self.resolved.iter().map(|r| (r.name.as_str(), r)).collect();
        for remote in &mut remotes {
            let Some(old) = last.get(remote.name.as_str()) else {
                continue;
            };
            let changed: Vec<Role> = remote
                .files
                .iter()
                .filter(|file| !old.files.iter().any(|o| o.same_as(file)))
                .map(sources::SourceFile::role)
                .collect();
            if changed.is_empty() && old.source == remote.source {
                // The same settings: its probe keeps its client and
                // connection.
                remote.config = Arc::clone(&old.config);
                remote.identity = Arc::clone(&old.identity);
                remote.generation = old.generation;
            } else if changed.is_empty() {
                info!(remote = %remote.name, "its settings in the config changed; client rebuilt");
            } else {
                info!(remote = %remote.name, "{} changed; client rebuilt", sources::shown(&changed));
            }
        }
        for section in restart {
            warn!(
                section,
                "this section changed, and takes effect only after a restart; the running one stays"
            );
        }
        self.resolved = remotes;
        self.follow_folders();
        info!(
            remotes = next.remotes.len(),
            config = %next.label(),
            "config reloaded and applied"
        );
        self.config = next;
        self.hand_over(true).await;
        Ok(())
    }

    /// Hands the planner the remotes as now read; with `reloaded`, under
    /// the config now in force (which ends the running cycle). Returns once
    /// the probes and the manager follow the value that takes them in: the
    /// series of a remote removed are gone.
    async fn hand_over(&mut self, reloaded: bool) {
        let config = reloaded.then(|| Arc::new(self.config.clone()));
        self.followers
            .hand_over(config, remote::handed(&self.resolved))
            .await;
    }

    /// Runs the sweep of the remotes' files that is due at the poll `now`,
    /// if one is. The next is timed from the poll, so that a sweep due every
    /// [`CONFIG_POLL`] runs at each one.
    pub(super) async fn sweep_when_due(&mut self, sweeps: &mut Sweeps, now: Instant) {
        if now >= sweeps.every {
            self.refresh_remotes(None, Noticed::Sweep).await;
            if !self.folders.unwatched().is_empty() {
                // Try again the folders that could not be watched.
                self.follow_folders();
            }
            sweeps.every = now + safety_sweep_every(self.files_of(None));
        } else if now >= sweeps.unwatched && !self.folders.unwatched().is_empty() {
            let unwatched = self.folders.unwatched().to_vec();
            self.refresh_remotes(Some(&unwatched), Noticed::Sweep).await;
        } else {
            return;
        }
        let unwatched = self.files_of(Some(self.folders.unwatched()));
        sweeps.unwatched = now + sweep_every(unwatched);
    }

    /// Checks the files of the remotes a change in their folders woke
    /// (every remote, with `None`), and spends their share of a sweep:
    /// checks may run at once as long as together they stay within one
    /// sweep of every file plus the sweep's pace, and then wait for it. A
    /// rotation's burst of events in one folder costs a few files of that,
    /// while a folder always busy costs what a sweep every 2 s did, and no
    /// more.
    pub(super) async fn refresh_woken(&mut self, woken: Option<&[usize]>, sweeps: &mut Sweeps) {
        let now = Instant::now();
        self.refresh_remotes(woken, Noticed::Folder).await;
        let rest = sweeps.spend(now, self.files_of(woken), self.files_of(None));
        self.folders.rest_until(rest);
    }

    /// How many files the remotes given by index (every one, with `None`)
    /// were read from.
    fn files_of(&self, only: Option<&[usize]>) -> usize {
        match only {
            None => self.resolved.iter().map(|r| r.files.len()).sum(),
            Some(indices) => indices
                .iter()
                .filter_map(|&i| self.resolved.get(i))
                .map(|r| r.files.len())
                .sum(),
        }
    }

    /// Watches the folders of the remotes' files as now read: called with
    /// each change to `resolved`, whose indices the folders' wakes name.
    pub(super) fn follow_folders(&mut self) {
        self.folders
            .follow(self.resolved.iter().map(|r| r.files.as_slice()));
    }

    /// Re-reads the files of the remotes given by index (every remote, with
    /// `None`) and rebuilds the client of each whose files changed: its
    /// probe's now, the manager's in the next cycle. Other remotes keep
    /// theirs.
    ///
    /// A token file alone leaves the cycle running: the manager's clients
    /// re-read it by themselves, as client-go does, so the remote keeps its
    /// generation. Any other file ends the cycle (`config_changed`): its
    /// clients hold the old CA, certificate or kubeconfig. A change that
    /// does not load is logged once, and the remote keeps its last good
    /// settings.
    pub(super) async fn refresh_remotes(&mut self, only: Option<&[usize]>, noticed: Noticed) {
        let mut rebuilt = 0;
        for (index, roles) in self.changed_files(only).await {
            let Some(spec) = self.config.remotes.get(index) else {
                continue;
            };
            let what = sources::shown(&roles);
            match remote::resolve_one(&self.config, index, spec).await {
                Ok(mut fresh) => {
                    info!(remote = %spec.name, noticed = noticed.as_str(), "{what} changed; client rebuilt");
                    if roles.iter().all(|r| *r == Role::TokenFile) {
                        fresh.generation = self.resolved[index].generation;
                    }
                    self.resolved[index] = fresh;
                    rebuilt += 1;
                }
                Err(err) => {
                    error!(remote = %spec.name, noticed = noticed.as_str(), error = %err, "{what} changed, but cannot be used; the remote keeps its last good settings");
                }
            }
        }
        if rebuilt > 0 {
            // A new kubeconfig may name files in other folders.
            self.follow_folders();
            self.hand_over(false).await;
        }
    }

    /// The remotes (those given by index, or every one) whose files
    /// changed, by index, with what changed. The `stat` calls run off the
    /// async workers: at thousands of remotes a sweep is tens of thousands.
    async fn changed_files(&mut self, only: Option<&[usize]>) -> Vec<(usize, Vec<Role>)> {
        let files: Vec<(usize, Vec<sources::SourceFile>)> = match only {
            // Each once: its files are taken out while they are checked.
            Some(indices) => std::collections::BTreeSet::from_iter(indices)
                .into_iter()
                .filter_map(|&index| {
                    let files = std::mem::take(&mut self.resolved.get_mut(index)?.files);
                    Some((index, files))
                })
                .collect(),
            None => self
                .resolved
                .iter_mut()
                .map(|r| std::mem::take(&mut r.files))
                .enumerate()
                .collect(),
        };
        let swept = tokio::task::spawn_blocking(move || {
            let mut files = files;
            let changed: Vec<(usize, Vec<Role>)> = files
                .iter_mut()
                .map(|(index, files)| (*index, sources::changed(files)))
                .filter(|(_, roles)| !roles.is_empty())
                .collect();
            (files, changed)
        })
        .await;
        match swept {
            Ok((files, changed)) => {
                for (index, files) in files {
                    self.resolved[index].files = files;
                }
                changed
            }
            Err(err) => {
                // Only a panic in `stat` could get here; the next reload
                // reads the files again.
                error!(error = %err, "checking the remotes' files failed; they are watched again after the next reload");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_runs_every_poll_until_it_would_stat_too_many_files() {
        assert_eq!(sweep_every(0), CONFIG_POLL);
        assert_eq!(sweep_every(300), CONFIG_POLL);
        assert_eq!(sweep_every(30_000), Duration::from_secs(15));
    }

    #[test]
    fn checks_a_folder_woke_run_at_once_within_a_sweeps_worth_then_at_its_pace() {
        let mut sweeps = Sweeps::default();
        let now = sweeps.spent;
        // A rotation's events, one remote of three files among 1,000
        // remotes: a few checks at once.
        for _ in 0..10 {
            assert_eq!(sweeps.spend(now, 3, 3_000), now);
        }
        // A folder of every file, always busy: one more check at once (a
        // sweep's worth), then one every 2 s, as the sweep was.
        let mut sweeps = Sweeps::default();
        let now = sweeps.spent;
        assert_eq!(sweeps.spend(now, 3_000, 3_000), now);
        assert_eq!(sweeps.spend(now, 3_000, 3_000), now + CONFIG_POLL);
        let later = now + CONFIG_POLL;
        assert_eq!(sweeps.spend(later, 3_000, 3_000), later + CONFIG_POLL);
        // Quiet for long, the pace is owed nothing.
        let quiet = later + Duration::from_secs(3_600);
        assert_eq!(sweeps.spend(quiet, 3_000, 3_000), quiet);
    }

    #[test]
    fn the_safety_sweep_runs_every_minute_until_it_would_stat_too_many_files() {
        assert_eq!(safety_sweep_every(0), Duration::from_secs(60));
        assert_eq!(safety_sweep_every(4_000), Duration::from_secs(60));
        assert_eq!(safety_sweep_every(30_000), Duration::from_secs(450));
    }
}
