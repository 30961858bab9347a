//! A new config file and rotated remote files, read by the daemon and
//! handed to the planner (`crate::desired`), which decides what they
//! change. Nothing here ends a cycle or touches the probes or the manager.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

use super::Daemon;
use crate::config::remote;
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
/// slower sweep only delays a rotation that broke nothing yet.
pub(super) fn sweep_every(files: usize) -> Duration {
    #[allow(clippy::cast_precision_loss)] // a count of files, far below 2^52
    let pace = Duration::from_secs_f64(files as f64 / SWEEP_FILES_PER_SECOND);
    pace.max(CONFIG_POLL)
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
        for (index, remote) in remotes.iter_mut().enumerate() {
            // What the probes will need of it: a server they can key.
            tether_probes::Identity::of(&remote.config).map_err(|err| {
                ConfigError::new(
                    &next.label(),
                    format!("remotes[{index}]"),
                    tether_supervisor::error_chain(&err),
                )
            })?;
            let Some(old) = self.resolved.iter().find(|old| old.name == remote.name) else {
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

    /// Re-reads the files of the remotes named (every remote, with `None`)
    /// and rebuilds the client of each whose files changed: its probe's
    /// now, the manager's in the next cycle. Other remotes keep theirs.
    ///
    /// A token file alone leaves the cycle running: the manager's clients
    /// re-read it by themselves, as client-go does, so the remote keeps its
    /// generation. Any other file ends the cycle (`config_changed`): its
    /// clients hold the old CA, certificate or kubeconfig. A change that
    /// does not load is logged once, and the remote keeps its last good
    /// settings.
    pub(super) async fn refresh_remotes(&mut self, only: Option<&[String]>) {
        let mut rebuilt = 0;
        for (index, roles) in self.changed_files(only).await {
            let Some(spec) = self.config.remotes.get(index) else {
                continue;
            };
            let what = sources::shown(&roles);
            match remote::resolve_one(&self.config, index, spec).await {
                Ok(mut fresh) => {
                    info!(remote = %spec.name, "{what} changed; client rebuilt");
                    if roles.iter().all(|r| *r == Role::TokenFile) {
                        fresh.generation = self.resolved[index].generation;
                    }
                    self.resolved[index] = fresh;
                    rebuilt += 1;
                }
                Err(err) => {
                    error!(remote = %spec.name, error = %err, "{what} changed, but cannot be used; the remote keeps its last good settings");
                }
            }
        }
        if rebuilt > 0 {
            self.hand_over(false).await;
        }
    }

    /// The remotes (those named, or every one) whose files changed, by
    /// index, with what changed. The `stat` calls run off the async
    /// workers: at thousands of remotes a sweep is tens of thousands.
    async fn changed_files(&mut self, only: Option<&[String]>) -> Vec<(usize, Vec<Role>)> {
        let files: Vec<(usize, Vec<sources::SourceFile>)> = self
            .resolved
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| only.is_none_or(|names| names.contains(&r.name)))
            .map(|(index, r)| (index, std::mem::take(&mut r.files)))
            .collect();
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
}
