//! The folders the remotes' files are in, watched through inotify (the
//! `inotify` crate), so that a rotated file is read when its folder changes
//! rather than found by a sweep that `stat`s every file.
//!
//! A folder, not a file, is watched: the kubelet updates a Secret volume by
//! swapping its `..data` symlink, which a watch on the file (the inode it
//! led to) never sees, while the folder sees the swap. A change wakes the
//! daemon with the remotes whose files are in that folder; which of their
//! files changed is still decided by `sources::changed`, so an event that
//! changed nothing (a new file beside them) rebuilds nothing.
//!
//! A watch asks for changes alone: not for a file opened or read. tether
//! and kube read these files themselves, and so may anything beside them
//! (a sidecar, another exporter reading the same tokens): the `notify`
//! crate's watch, which always asks for opens, woke tether at each
//! (issue 43, part 18).
//!
//! What this misses, the daemon's slow sweep still finds: a folder that
//! could not be watched (gone, or past `fs.inotify.max_user_watches`) has
//! its remotes swept at the old pace, and a file edited in place through a
//! symlink into another folder, or on a filesystem without inotify (NFS), is
//! found by the safety sweep.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt as _;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tracing::warn;

use crate::config::sources::SourceFile;

/// The most paths of events kept between two wakes of the daemon; past it,
/// every remote is checked instead. The daemon drains them at each wake,
/// at most a sweep's pace apart, so only a storm of new entries beside the
/// files (thousands of names in a watched folder) gets here.
const PENDING_MAX: usize = 4_096;

/// What a folder's watch reports: whatever can change a file in it (its
/// content, its name, its mode), or the folder itself. Not an open, a read,
/// or a close after reading.
const CHANGES: WatchMask = WatchMask::ATTRIB
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MODIFY)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO);

/// Room for one read of events: at least one event with the longest name
/// (16 bytes and `NAME_MAX` + 1), as the kernel requires.
const READ_ROOM: usize = 4_096;

/// What the reader hands the daemon.
#[derive(Debug, Default)]
struct Pending {
    /// The paths of the events since the last wake.
    paths: HashSet<PathBuf>,
    /// Events were lost (the kernel's queue overflowed, or past
    /// [`PENDING_MAX`]): check every remote.
    everything: bool,
    /// The reader stopped: no event will come, and every remote is swept.
    failed: bool,
}

impl Pending {
    /// Keeps the path of an event (`None`: events were lost).
    fn add(&mut self, path: Option<PathBuf>) {
        match path {
            None => self.everything = true,
            Some(_) if self.paths.len() >= PENDING_MAX => {
                self.everything = true;
                self.paths.clear();
            }
            Some(path) if !self.everything => {
                self.paths.insert(path);
            }
            Some(_) => {}
        }
    }
}

/// Each watch's folder, by the descriptor the kernel names it with.
type ByWatch = Arc<Mutex<HashMap<WatchDescriptor, PathBuf>>>;

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The kernel's watches on the folders, and the task that reads their
/// events.
struct Watcher {
    watches: Watches,
    by_watch: ByWatch,
    by_folder: HashMap<PathBuf, WatchDescriptor>,
    reader: tokio::task::JoinHandle<()>,
}

impl Watcher {
    /// Watches `folder`. Its descriptor is named under the lock the reader
    /// takes, so that no event of it comes before its folder is known.
    fn watch(&mut self, folder: &Path) -> std::io::Result<()> {
        let mut by_watch = lock(&self.by_watch);
        let watch = self.watches.add(folder, CHANGES)?;
        by_watch.insert(watch.clone(), folder.to_path_buf());
        self.by_folder.insert(folder.to_path_buf(), watch);
        Ok(())
    }

    /// Stops watching `folder`. The kernel has dropped the watch already if
    /// the folder is gone; that is not an error here.
    fn unwatch(&mut self, folder: &Path) {
        if let Some(watch) = self.by_folder.remove(folder) {
            lock(&self.by_watch).remove(&watch);
            let _ = self.watches.remove(watch);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Reads the watches' events into `pending`, waking the daemon for each.
/// An event of a watch let go is dropped. If a read fails (the kernel
/// refuses only a buffer too small for an event), it says so and stops:
/// the daemon then sweeps every remote.
async fn read(
    mut events: EventStream<[u8; READ_ROOM]>,
    by_watch: ByWatch,
    pending: Arc<Mutex<Pending>>,
    woken: Arc<tokio::sync::Notify>,
) {
    while let Some(event) = events.next().await {
        let path = match event {
            Ok(event) if event.mask.contains(EventMask::Q_OVERFLOW) => None,
            Ok(event) => match lock(&by_watch).get(&event.wd) {
                // An event without a name is the folder's own.
                Some(folder) => Some(
                    event
                        .name
                        .map_or_else(|| folder.clone(), |name| folder.join(name)),
                ),
                // A watch let go.
                None => continue,
            },
            Err(err) => {
                warn!(error = %err, "reading inotify's events failed; every remote's files are swept instead");
                let mut pending = lock(&pending);
                pending.add(None);
                pending.failed = true;
                drop(pending);
                woken.notify_one();
                return;
            }
        };
        lock(&pending).add(path);
        woken.notify_one();
        // A storm of events (a folder always busy) yields the worker to the
        // probes every so often: a read of buffered events alone never
        // would.
        tokio::task::consume_budget().await;
    }
}

/// The remotes' folders, watched.
pub(super) struct Folders {
    /// `None` when inotify cannot be had (`fs.inotify.max_user_instances`):
    /// then every remote is swept.
    watcher: Option<Watcher>,
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

impl Folders {
    /// A watcher with nothing watched yet, its reader a task on the
    /// runtime. Without inotify (the instance limit reached), every remote
    /// is swept, and that is logged.
    pub(super) fn new() -> Self {
        let pending = Arc::new(Mutex::new(Pending::default()));
        let woken = Arc::new(tokio::sync::Notify::new());
        let watcher = Inotify::init()
            .and_then(|inotify| {
                let watches = inotify.watches();
                let events = inotify.into_event_stream([0; READ_ROOM])?;
                Ok((watches, events))
            })
            .map_err(|err| {
                warn!(
                    error = %err,
                    "inotify cannot be had (see fs.inotify.max_user_instances); every remote's files are swept instead"
                );
            })
            .ok()
            .map(|(watches, events)| {
                let by_watch = ByWatch::default();
                let reader = tokio::spawn(read(
                    events,
                    Arc::clone(&by_watch),
                    Arc::clone(&pending),
                    Arc::clone(&woken),
                ));
                Watcher {
                    watches,
                    by_watch,
                    by_folder: HashMap::new(),
                    reader,
                }
            });
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
            watcher.unwatch(gone);
        }
        let mut unwatched = Vec::new();
        let mut failure = None;
        let mut kept = HashMap::with_capacity(wanted.len());
        for (folder, indices) in wanted {
            let held = self.watched.contains_key(&folder)
                || match watcher.watch(&folder) {
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
        watcher.unwatch(folder);
        if watcher.watch(folder).is_err()
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
            let pending = std::mem::take(&mut *lock(&self.pending));
            if pending.failed {
                self.watcher = None;
                self.unwatched
                    .extend(self.watched.drain().flat_map(|(_, own)| own));
                self.unwatched.sort_unstable();
                self.unwatched.dedup();
            }
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

        // Read a's file (as kube does), then replace b's by a rename: had
        // the read made events, the kernel would queue them first; no wake
        // names a.
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

    /// The masks of this process's inotify watches on the inode `inode`,
    /// as the kernel lists them in `/proc/self/fdinfo`.
    fn kernel_masks(inode: u64) -> Vec<u32> {
        let mut masks = Vec::new();
        for fd in std::fs::read_dir("/proc/self/fdinfo").expect("fdinfo") {
            let Ok(info) = std::fs::read_to_string(fd.expect("an fd").path()) else {
                continue;
            };
            for line in info.lines().filter(|l| l.starts_with("inotify wd:")) {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name))
                        .expect("a field of the kernel's line")
                        .to_owned()
                };
                if u64::from_str_radix(&field("ino:"), 16) == Ok(inode) {
                    masks.push(u32::from_str_radix(&field("mask:"), 16).expect("hex"));
                }
            }
        }
        masks
    }

    #[tokio::test]
    async fn a_watch_asks_the_kernel_for_changes_and_not_for_reads() {
        use std::os::unix::fs::MetadataExt as _;
        let a = tempfile::tempdir().expect("dir");
        let mut folders = Folders::new();
        follow(&mut folders, &[files(&[a.path().join("token")])]);
        let inode = std::fs::metadata(a.path()).expect("stat").ino();
        let masks = kernel_masks(inode);
        assert_eq!(masks.len(), 1, "one watch on the folder: {masks:x?}");
        let reads = WatchMask::OPEN | WatchMask::ACCESS | WatchMask::CLOSE_NOWRITE;
        assert_eq!(masks[0] & reads.bits(), 0, "{:x}", masks[0]);
        assert_eq!(masks[0] & CHANGES.bits(), CHANGES.bits(), "{:x}", masks[0]);
        // A folder no remote needs is let go, its watch with it.
        follow(&mut folders, &[]);
        assert!(kernel_masks(inode).is_empty());
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
