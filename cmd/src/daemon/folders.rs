//! The folders the remotes' files are in, watched through inotify (the
//! `notify` crate), so that a rotated file is read when its folder changes
//! rather than found by a sweep that `stat`s every file.
//!
//! A folder, not a file, is watched: the kubelet updates a Secret volume by
//! swapping its `..data` symlink, which a watch on the file (the inode it
//! led to) never sees, while the folder sees the swap. A change wakes the
//! daemon with the remotes whose files are in that folder; which of their
//! files changed is still decided by `sources::changed`, so an event that
//! changed nothing (a new file beside them) rebuilds nothing.
//!
//! What this misses, the daemon's slow sweep still finds: a folder that
//! could not be watched (gone, or past `fs.inotify.max_user_watches`) has
//! its remotes swept at the old pace, and a file edited in place through a
//! symlink into another folder, or on a filesystem without inotify (NFS), is
//! found by the safety sweep.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};
use tracing::warn;

use crate::config::sources::SourceFile;

/// The most paths of events kept between two wakes of the daemon; past it,
/// every remote is checked instead. The daemon drains them at each wake,
/// at most a sweep's pace apart, so only a storm of new entries beside the
/// files (thousands of names in a watched folder) gets here.
const PENDING_MAX: usize = 4_096;

/// What the watcher's thread hands the daemon.
#[derive(Debug, Default)]
struct Pending {
    /// The paths of the events since the last wake.
    paths: HashSet<PathBuf>,
    /// Events were lost (the kernel's queue overflowed, or past
    /// [`PENDING_MAX`]): check every remote.
    everything: bool,
}

/// The remotes' folders, watched.
pub(super) struct Folders {
    /// `None` when inotify cannot be had (`fs.inotify.max_user_instances`):
    /// then every remote is swept.
    watcher: Option<notify::INotifyWatcher>,
    /// Each folder watched, with the indices (into the daemon's resolved
    /// remotes) of the remotes whose files are in it.
    watched: HashMap<PathBuf, Vec<usize>>,
    /// The remotes with a file in a folder that could not be watched, by
    /// index: the daemon sweeps them at the old pace.
    unwatched: Vec<usize>,
    pending: Arc<Mutex<Pending>>,
    woken: Arc<tokio::sync::Notify>,
    /// No wake before this: set by the daemon after each check, so that a
    /// folder always busy costs no more than the sweep it replaces.
    resting: tokio::time::Instant,
}

impl std::fmt::Debug for Folders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Folders")
            .field("inotify", &self.watcher.is_some())
            .field("watched", &self.watched.len())
            .field("unwatched", &self.unwatched.len())
            .finish_non_exhaustive()
    }
}

/// Whether an event can mean a file's content changed. Opening or reading a
/// file cannot, and tether and kube read these files themselves.
fn may_change(kind: EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

impl Folders {
    /// A watcher with nothing watched yet. Without inotify (the instance
    /// limit reached), every remote is swept, and that is logged.
    pub(super) fn new() -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let woken = Arc::new(tokio::sync::Notify::new());
        let handler = {
            let pending = Arc::clone(&pending);
            let woken = Arc::clone(&woken);
            move |event: notify::Result<notify::Event>| {
                if event
                    .as_ref()
                    .is_ok_and(|e| !e.need_rescan() && !may_change(e.kind))
                {
                    // An open or a read: most of a busy folder's events.
                    return;
                }
                let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
                match event {
                    Ok(event) if event.need_rescan() => pending.everything = true,
                    Ok(event) => {
                        if pending.paths.len() + event.paths.len() > PENDING_MAX {
                            pending.everything = true;
                            pending.paths.clear();
                        } else if !pending.everything {
                            pending.paths.extend(event.paths);
                        }
                    }
                    // The watcher's own read failed: what it lost is unknown.
                    Err(_) => pending.everything = true,
                }
                drop(pending);
                woken.notify_one();
            }
        };
        let watcher = notify::INotifyWatcher::new(handler, notify::Config::default())
            .map_err(|err| {
                warn!(
                    error = %err,
                    "inotify cannot be had (see fs.inotify.max_user_instances); every remote's files are swept instead"
                );
            })
            .ok();
        Self {
            watcher,
            watched: HashMap::new(),
            unwatched: Vec::new(),
            pending,
            woken,
            resting: tokio::time::Instant::now(),
        }
    }

    /// Holds the next wake back until `at`: the daemon's pace for the
    /// files it checked. What changes meanwhile waits, and is not lost.
    pub(super) fn rest_until(&mut self, at: tokio::time::Instant) {
        self.resting = at;
    }

    /// Watches the folders of the remotes' files (each remote's, in the
    /// daemon's order), and no other: called with every new reading of the
    /// remotes, whose indices the wakes then name. A folder already watched
    /// is kept; one that fails to be watched has its remotes swept, and is
    /// tried again at the next call.
    pub(super) fn follow<'f>(&mut self, remotes: impl ExactSizeIterator<Item = &'f [SourceFile]>) {
        let count = remotes.len();
        let mut wanted: HashMap<PathBuf, Vec<usize>> = HashMap::new();
        for (index, files) in remotes.enumerate() {
            for file in files {
                let folder = file.path().parent().unwrap_or(Path::new("/"));
                let indices = wanted.entry(folder.to_path_buf()).or_default();
                if indices.last() != Some(&index) {
                    indices.push(index);
                }
            }
        }
        let Some(watcher) = self.watcher.as_mut() else {
            self.unwatched = (0..count).collect();
            return;
        };
        for gone in self.watched.keys().filter(|f| !wanted.contains_key(*f)) {
            // A folder removed from under its watch is unwatched already.
            let _ = watcher.unwatch(gone);
        }
        let mut unwatched = Vec::new();
        let mut failure = None;
        let mut kept = HashMap::with_capacity(wanted.len());
        for (folder, indices) in wanted {
            let held = self.watched.contains_key(&folder)
                || match watcher.watch(&folder, RecursiveMode::NonRecursive) {
                    Ok(()) => true,
                    Err(err) => {
                        failure.get_or_insert((folder.clone(), err));
                        false
                    }
                };
            if held {
                kept.insert(folder, indices);
            } else {
                unwatched.extend(indices);
            }
        }
        unwatched.sort_unstable();
        unwatched.dedup();
        // Logged when the folders not watched change, not at each retry.
        if let Some((folder, err)) = failure.filter(|_| unwatched != self.unwatched) {
            warn!(
                folder = %folder.display(),
                error = %err,
                remotes = unwatched.len(),
                "a folder of the remotes' files cannot be watched (for too many folders, raise fs.inotify.max_user_watches); those remotes' files are swept instead, and it is tried again at each sweep of every remote"
            );
        }
        self.watched = kept;
        self.unwatched = unwatched;
    }

    /// Watches `folder` anew; if it cannot be, its remotes are swept until
    /// a later [`Folders::follow`] watches it.
    fn watch_again(&mut self, folder: &Path) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let _ = watcher.unwatch(folder);
        if watcher.watch(folder, RecursiveMode::NonRecursive).is_err()
            && let Some(indices) = self.watched.remove(folder)
        {
            self.unwatched.extend(indices);
            self.unwatched.sort_unstable();
            self.unwatched.dedup();
        }
    }

    /// The remotes swept at the old pace, by index: those with a file in a
    /// folder not watched.
    pub(super) fn unwatched(&self) -> &[usize] {
        &self.unwatched
    }

    /// Waits for a change in a watched folder (and for the rest the daemon
    /// asked for), then gives the remotes to check, by index: `None` for
    /// every one (events were lost). A folder itself replaced is watched
    /// anew. Cancelled at any await, it loses nothing: what was seen stays
    /// pending until a call returns it.
    pub(super) async fn changed(&mut self) -> Option<Vec<usize>> {
        loop {
            tokio::time::sleep_until(self.resting).await;
            let pending =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
            if pending.everything {
                return None;
            }
            let mut indices: Vec<usize> = Vec::new();
            for path in &pending.paths {
                if let Some(own) = path.parent().and_then(|p| self.watched.get(p)) {
                    indices.extend(own);
                }
                if self.watched.contains_key(path) {
                    // An event on the folder itself (removed, moved, or
                    // changed in its parent): its watch may be gone.
                    indices.extend(&self.watched[path]);
                    self.watch_again(path);
                }
            }
            indices.sort_unstable();
            indices.dedup();
            if !indices.is_empty() {
                return Some(indices);
            }
            // What the handler adds after the take above comes with a
            // permit, so this returns at once for it.
            self.woken.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::sources::{Role, SourceFile};

    fn files(paths: &[PathBuf]) -> Vec<SourceFile> {
        paths
            .iter()
            .map(|f| SourceFile::read(Role::TokenFile, f))
            .collect()
    }

    fn follow(folders: &mut Folders, remotes: &[Vec<SourceFile>]) {
        folders.follow(remotes.iter().map(Vec::as_slice));
    }

    /// The wakes until one names `index`, that one included.
    async fn until_named(folders: &mut Folders, index: usize) -> Vec<Vec<usize>> {
        let mut wakes = Vec::new();
        loop {
            let wake = next(folders).await.expect("no events lost");
            let named = wake.contains(&index);
            wakes.push(wake);
            if named {
                return wakes;
            }
        }
    }

    /// Bounds a wait for the watcher's thread, which the kernel wakes.
    async fn next(folders: &mut Folders) -> Option<Vec<usize>> {
        tokio::time::timeout(Duration::from_secs(30), folders.changed())
            .await
            .expect("a change in a watched folder wakes the daemon")
    }

    #[tokio::test]
    async fn a_swap_in_a_folder_wakes_its_remotes_alone_and_a_read_wakes_none() {
        let a = tempfile::tempdir().expect("dir");
        let b = tempfile::tempdir().expect("dir");
        for dir in [&a, &b] {
            std::fs::write(dir.path().join("token"), "one").expect("write");
        }
        let remotes = [
            files(&[a.path().join("token")]),
            files(&[b.path().join("token")]),
        ];
        let mut folders = Folders::new();
        follow(&mut folders, &remotes);
        assert!(folders.unwatched().is_empty());

        // Read a's file (as kube does), then replace b's by a rename: the
        // kernel queues the read's events first, and no wake names a.
        std::fs::read(a.path().join("token")).expect("read");
        std::fs::write(b.path().join("..token_tmp"), "two").expect("write");
        std::fs::rename(b.path().join("..token_tmp"), b.path().join("token")).expect("swap");
        let wakes = until_named(&mut folders, 1).await;
        assert!(
            wakes.iter().all(|w| w == &[1]),
            "a read woke its remote: {wakes:?}"
        );

        // An edit in place is seen too; a later wake may still name b for
        // the rename's last events.
        std::fs::write(a.path().join("token"), "two").expect("write");
        let wakes = until_named(&mut folders, 0).await;
        assert!(wakes.iter().flatten().all(|i| *i < 2), "{wakes:?}");
    }

    #[tokio::test]
    async fn a_folder_that_cannot_be_watched_is_swept_and_tried_again() {
        let a = tempfile::tempdir().expect("dir");
        let gone = a.path().join("not-yet");
        let remotes = [
            files(&[a.path().join("token")]),
            files(&[gone.join("token")]),
        ];
        let mut folders = Folders::new();
        follow(&mut folders, &remotes);
        assert_eq!(folders.unwatched(), [1]);

        // Making `not-yet` is an event in a's folder, which names a.
        std::fs::create_dir(&gone).expect("dir");
        follow(&mut folders, &remotes);
        assert!(folders.unwatched().is_empty());
        std::fs::write(gone.join("token"), "one").expect("write");
        until_named(&mut folders, 1).await;
    }

    #[tokio::test]
    async fn a_folder_no_remote_needs_is_let_go() {
        let a = tempfile::tempdir().expect("dir");
        let b = tempfile::tempdir().expect("dir");
        let mut folders = Folders::new();
        follow(&mut folders, &[files(&[a.path().join("token")])]);
        assert_eq!(folders.watched.len(), 1);
        follow(&mut folders, &[files(&[b.path().join("token")])]);
        assert_eq!(folders.watched.keys().collect::<Vec<_>>(), [b.path()]);
        // A change in a's folder, let go, wakes nothing: the first wake
        // comes of b's, and names b (now index 0) alone.
        std::fs::write(a.path().join("token"), "one").expect("write");
        std::fs::write(b.path().join("token"), "one").expect("write");
        assert_eq!(next(&mut folders).await, Some(vec![0]));
    }

    #[tokio::test]
    async fn a_change_waits_for_the_rest_the_daemon_asked_for() {
        let a = tempfile::tempdir().expect("dir");
        let mut folders = Folders::new();
        follow(&mut folders, &[files(&[a.path().join("token")])]);
        let pause = Duration::from_millis(300);
        let rested = tokio::time::Instant::now();
        folders.rest_until(rested + pause);
        std::fs::write(a.path().join("token"), "one").expect("write");
        assert_eq!(next(&mut folders).await, Some(vec![0]));
        assert!(
            rested.elapsed() >= pause,
            "woken after {:?}",
            rested.elapsed()
        );
    }
}
