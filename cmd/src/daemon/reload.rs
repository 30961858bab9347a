//! Changes applied to the running daemon: a new config file, rotated
//! remote files, and a new share of the remotes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tether_supervisor::Cause;
use tracing::{error, info, warn};

use super::wiring::{Sharded, held};
use super::{Daemon, probe_targets};
use crate::config::remote::{self, ResolvedRemote};
use crate::config::sources::{self, Role};
use crate::config::{Config, ConfigError, Plan};
use crate::events::Reason;

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
        for remote in &mut remotes {
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
            } else if changed.is_empty() {
                info!(remote = %remote.name, "its settings in the config changed; client rebuilt");
            } else {
                info!(remote = %remote.name, "{} changed; client rebuilt", sources::shown(&changed));
            }
        }
        // A static remote takes its name back from a discovered one.
        if let Some(discovery) = &self.discovery {
            self.discovered = discovery.remotes(&remote::names(&remotes));
        }
        self.sync_remotes(&remotes, &next).map_err(|err| {
            ConfigError::new(
                &next.label(),
                "remotes",
                tether_supervisor::error_chain(&err),
            )
        })?;
        for section in restart {
            warn!(
                section,
                "this section changed, and takes effect only after a restart; the running one stays"
            );
        }
        self.resolved = remotes;
        let ended = self.supervisor.end_cycle(Cause::ConfigChanged);
        info!(
            remotes = next.remotes.len(),
            config = %next.label(),
            "config reloaded and applied{}",
            if ended { "; the cycle ends" } else { "; the next cycle runs it" }
        );
        self.config = next;
        Ok(())
    }

    /// Probes, and plans for the manager's next cycle, the remotes of
    /// `statics` and those discovered that this replica holds.
    fn sync_remotes(
        &self,
        statics: &[ResolvedRemote],
        config: &Config,
    ) -> tether_probes::Result<()> {
        let all = self.with_discovered(statics);
        let shard = self.sharded.as_ref().map(|s| &s.handle);
        if let Some(shard) = shard {
            shard.set_remotes(remote::keys(&all));
        }
        let running = held(&all, shard);
        self.probe_set
            .sync(&probe_targets(&running, self.discovery.as_deref()))?;
        self.manager.update(Plan::new(config, running));
        Ok(())
    }

    /// `statics`, then the discovered remotes.
    fn with_discovered(&self, statics: &[ResolvedRemote]) -> Vec<ResolvedRemote> {
        statics.iter().chain(&self.discovered).cloned().collect()
    }

    /// Takes the discovered set anew after a Secret appeared, changed or
    /// went, or a source's list or watch turned: probes for the new
    /// remotes (the others' keep running), none for those gone, and, if
    /// what this replica's manager runs changed, a new plan and the end of
    /// the cycle (`config_changed`), as a reload does.
    pub(super) fn apply_discovered(&mut self) {
        let Some(discovery) = &self.discovery else {
            return;
        };
        let found = discovery.remotes(&remote::names(&self.resolved));
        let same = |a: &ResolvedRemote, b: &ResolvedRemote| {
            a.name == b.name && a.required == b.required && Arc::ptr_eq(&a.config, &b.config)
        };
        if found.len() == self.discovered.len()
            && found.iter().zip(&self.discovered).all(|(a, b)| same(a, b))
        {
            return;
        }
        let before: std::collections::BTreeMap<&str, &ResolvedRemote> = self
            .discovered
            .iter()
            .map(|r| (r.name.as_str(), r))
            .collect();
        let added = found
            .iter()
            .filter(|r| !before.contains_key(r.name.as_str()))
            .count();
        let rebuilt = found
            .iter()
            .filter(|r| before.get(r.name.as_str()).is_some_and(|b| !same(r, b)))
            .count();
        let removed = before.len() + added - found.len();
        let planned = self.manager.plan();
        self.discovered = found;
        if let Err(err) = self.sync_remotes(&self.resolved, &self.config) {
            error!(error = %err, "applying the discovered remotes failed; the probes keep what they had");
            return;
        }
        let now = self.manager.plan();
        let runs_the_same = planned.remotes.len() == now.remotes.len()
            && planned
                .remotes
                .iter()
                .zip(&now.remotes)
                .all(|(a, b)| same(a, b));
        let ended = !runs_the_same && self.supervisor.end_cycle(Cause::ConfigChanged);
        info!(
            added,
            removed,
            rebuilt,
            discovered = self.discovered.len(),
            "the discovered remotes changed{}",
            if ended { "; the cycle ends" } else { "" }
        );
    }

    /// Re-reads the files of the remotes named (every remote, with `None`)
    /// and rebuilds the client of each whose files changed: its probe's
    /// now, the manager's in the next cycle. Other remotes keep theirs.
    ///
    /// A token file alone leaves the cycle running: the manager's clients
    /// re-read it by themselves, as client-go does. Any other file ends the
    /// cycle (`config_changed`): its clients hold the old CA, certificate or
    /// kubeconfig. A change that does not load is logged once, and the
    /// remote keeps its last good settings.
    pub(super) async fn refresh_remotes(&mut self, only: Option<&[String]>) {
        let mut ends_cycle = false;
        let mut rebuilt = 0;
        for (index, roles) in self.changed_files(only).await {
            let Some(spec) = self.config.remotes.get(index) else {
                continue;
            };
            let what = sources::shown(&roles);
            match remote::resolve_one(&self.config, index, spec).await {
                Ok(fresh) => {
                    info!(remote = %spec.name, "{what} changed; client rebuilt");
                    self.resolved[index] = fresh;
                    ends_cycle |= roles.iter().any(|r| *r != Role::TokenFile);
                    rebuilt += 1;
                }
                Err(err) => {
                    error!(remote = %spec.name, error = %err, "{what} changed, but cannot be used; the remote keeps its last good settings");
                }
            }
        }
        if rebuilt == 0 {
            return;
        }
        if let Err(err) = self.sync_remotes(&self.resolved, &self.config) {
            // The same names and URLs as before: this cannot fail, but if it
            // did, the probes keep what they had.
            error!(error = %err, "applying the rebuilt clients failed");
            return;
        }
        if ends_cycle && self.supervisor.end_cycle(Cause::ConfigChanged) {
            info!(
                rebuilt,
                "the cycle ends, so that the manager's clients use the new files"
            );
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

    /// Runs what the sharding now lets this replica hold: the probes and
    /// the manager's plan follow, and the running cycle ends
    /// (`shard_changed`). Once that cycle's manager has returned, the
    /// sharding hears the remotes given up are let go.
    pub(super) fn apply_holding(&mut self) {
        let Some(Sharded {
            handle: shard,
            gate,
            ..
        }) = &self.sharded
        else {
            return;
        };
        let running = held(&self.with_discovered(&self.resolved), Some(shard));
        let before = remote::names(&self.manager.plan().remotes);
        let now: std::collections::BTreeSet<String> =
            running.iter().map(|r| r.name.clone()).collect();
        if now == before {
            shard.applied(now);
            return;
        }
        if let Err(err) = self
            .probe_set
            .sync(&probe_targets(&running, self.discovery.as_deref()))
        {
            // The remotes were resolved and synced before; a subset cannot
            // fail, but if it did, the old set stays probed.
            error!(error = %err, "applying this replica's share failed");
            return;
        }
        self.manager.update(Plan::new(&self.config, running));
        let cycle = self.supervisor.status().cycle;
        let ended = self.supervisor.end_cycle(Cause::ShardChanged {
            taken: now.difference(&before).count(),
            given_up: before.difference(&now).count(),
        });
        // After the cause is recorded: a gate closing mid-cycle would end it
        // as `leadership_lost`.
        gate.send_replace(!now.is_empty());
        info!(
            holds = now.len(),
            taken = now.difference(&before).count(),
            given_up = before.difference(&now).count(),
            "this replica's remotes changed"
        );
        if let Some(events) = &self.events {
            events.events.record(
                Reason::ShardChanged,
                &format!(
                    "this replica now holds {} remote(s): took {}, gave up {}",
                    now.len(),
                    now.difference(&before).count(),
                    before.difference(&now).count()
                ),
            );
        }
        let supervisor = self.supervisor.clone();
        let shard = shard.clone();
        tokio::spawn(async move {
            // The cycle that ran the old set ends when its manager returns
            // (within the shutdown grace); then nothing runs the remotes
            // given up.
            if ended {
                supervisor.ended(cycle).await;
            }
            shard.applied(now);
        });
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
