//! What the process is told of its remotes: `TETHER_REMOTES` while it
//! fits, `TETHER_REMOTES_FILE` always, and the discovered clusters'
//! kubeconfigs, in a private folder held locked while tether runs.

use std::path::{Path, PathBuf};

use secrecy::ExposeSecret as _;
use tracing::{info, warn};

use super::SetupError;
use crate::config::RemoteSource;
use crate::config::remote::{self, ResolvedRemote};

/// The `apiVersion` of `TETHER_REMOTES_FILE`: a reader checks it, and a
/// change that a reader of this one would misread gets a new one.
pub const REMOTES_FILE_VERSION: &str = "tether.dev/v1";

/// The remotes a process is told of, as `TETHER_REMOTES_FILE` holds them.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RemotesFile<'a> {
    api_version: &'static str,
    kind: &'static str,
    /// Counts the files this manager wrote; a reader takes in a file whose
    /// revision is above the last it took in.
    revision: u64,
    /// The cycle the process runs in.
    cycle: u64,
    /// Names this run of the process: an acknowledgement in
    /// `TETHER_APPLIED_FILE` counts only with it.
    instance: &'a str,
    /// Its remotes, in config order.
    remotes: Vec<RemoteEntry<'a>>,
}

/// One remote in `TETHER_REMOTES_FILE`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RemoteEntry<'a> {
    name: &'a str,
    required: bool,
    /// Changes when the remote must be reached anew: a new server, CA,
    /// client certificate or key (a token file alone does not change it).
    generation: u64,
    /// `false` while the probes call it lost: a process that follows the
    /// file stops using it until it is `true` again.
    reachable: bool,
    /// The kubeconfig that reaches it, absolute; absent for the in-cluster
    /// config or the current context (no config file).
    #[serde(skip_serializing_if = "Option::is_none")]
    kubeconfig: Option<PathBuf>,
    /// The context in it; absent for its current one.
    #[serde(skip_serializing_if = "Option::is_none")]
    context: Option<&'a str>,
}

/// What one `TETHER_REMOTES_FILE` says.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written<'a> {
    /// The cycle the process runs in.
    pub(super) cycle: u64,
    /// This file's revision.
    pub(super) revision: u64,
    /// The run of the process it is for.
    pub(super) instance: &'a str,
    /// The remotes it lists, in plan order.
    pub(super) remotes: &'a [&'a ResolvedRemote],
    /// Those of them the probes call lost.
    pub(super) lost: &'a std::collections::BTreeSet<String>,
}

/// Writes, into `dir`, the file that tells a process its remotes, and a
/// kubeconfig for each remote configured by direct fields (naming the CA
/// and token files by path: no secret is copied) or discovered (the
/// Secret's kubeconfig, mode 0600), each kubeconfig before the file that
/// names it. The kubeconfigs of remotes no longer listed are removed
/// after it: a cluster dropped from the fleet leaves no credentials
/// behind. Each file is replaced whole (written beside, synced, renamed),
/// so a reader never sees part of one. Returns the file.
pub(super) fn write_remotes(dir: &Path, told: Written<'_>) -> std::io::Result<PathBuf> {
    let absolute = |p: &Path| std::path::absolute(p);
    let mut entries = Vec::with_capacity(told.remotes.len());
    let mut written = std::collections::BTreeSet::new();
    for remote in told.remotes {
        let (kubeconfig, context) = match &remote.source {
            RemoteSource::Kubeconfig { path, context } => {
                (Some(absolute(path)?), context.as_deref())
            }
            RemoteSource::Direct {
                server,
                ca_file,
                token_file,
                insecure_skip_tls_verify,
            } => {
                let ca = ca_file.as_deref().map(absolute).transpose()?;
                let token = token_file.as_deref().map(absolute).transpose()?;
                let kubeconfig = remote::direct_kubeconfig(
                    &remote.name,
                    &tether_probes::client::without_userinfo(
                        &server.parse().map_err(std::io::Error::other)?,
                    )
                    .to_string(),
                    ca.as_deref(),
                    token.as_deref(),
                    *insecure_skip_tls_verify,
                );
                let path = dir.join(format!("{}.kubeconfig", remote.name));
                // JSON is YAML: client-go reads it as a kubeconfig.
                replace_file(&path, &serde_json::to_vec_pretty(&kubeconfig)?)?;
                written.insert(path.clone());
                (Some(path), None)
            }
            RemoteSource::Inferred => (None, None),
            RemoteSource::Secret(secret) => {
                // The process gets the discovered cluster as a kubeconfig
                // file of its own, readable by tether's user alone, in
                // tether's private folder.
                let kubeconfig = secret.kubeconfig.as_ref().ok_or_else(|| {
                    std::io::Error::other(format!(
                        "the kubeconfig of remote {} was not kept from its Secret",
                        remote.name
                    ))
                })?;
                let path = dir.join(format!("{}.kubeconfig", remote.name));
                replace_private_file(&path, kubeconfig.expose_secret())?;
                written.insert(path.clone());
                (Some(path), None)
            }
        };
        entries.push(RemoteEntry {
            name: &remote.name,
            required: remote.required,
            generation: remote.generation,
            reachable: !told.lost.contains(&remote.name),
            kubeconfig,
            context,
        });
    }
    let file = dir.join("remotes.json");
    let body = serde_json::to_vec_pretty(&RemotesFile {
        api_version: REMOTES_FILE_VERSION,
        kind: "Remotes",
        revision: told.revision,
        cycle: told.cycle,
        instance: told.instance,
        remotes: entries,
    })?;
    replace_file(&file, &body)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "kubeconfig") && !written.contains(&path) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(file)
}

/// The most `TETHER_REMOTES` may hold: 32 KiB, about 600 names of 50
/// characters. Linux refuses to start a process with one environment
/// string over 128 KiB (`E2BIG`), and about 2,600 such names pass that;
/// past this bound the variable is left out, and the process reads the set
/// from `TETHER_REMOTES_FILE`, which carries it whole however large.
pub(super) const MAX_REMOTES_VARIABLE: usize = 32 * 1024;

/// `TETHER_REMOTES`: the remotes' names, in plan order, comma-separated;
/// or, past [`MAX_REMOTES_VARIABLE`], its size.
pub(super) fn remotes_variable(remotes: &[&ResolvedRemote]) -> Result<String, usize> {
    let size = remotes
        .iter()
        .map(|r| r.name.len() + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if size > MAX_REMOTES_VARIABLE {
        return Err(size);
    }
    let names: Vec<&str> = remotes.iter().map(|r| r.name.as_str()).collect();
    Ok(names.join(","))
}

/// Writes `body` to `path` whole: into a file beside it, synced, then
/// renamed over, and the folder synced, so that a reader sees the old file
/// or the new one, never part of one, and a crash leaves one of them.
fn replace_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    replace_with(
        path,
        body,
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
    )
}

/// As [`replace_file`], the file readable and writable by its owner alone
/// from the start: it holds credentials.
pub(super) fn replace_private_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;

    let next = path.with_extension("next");
    let _ = std::fs::remove_file(&next);
    replace_with(
        path,
        body,
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600),
    )
}

/// Writes `body` into `<path>.next`, opened with `options`, syncs it,
/// renames it over `path`, and syncs the folder.
fn replace_with(path: &Path, body: &[u8], options: &std::fs::OpenOptions) -> std::io::Result<()> {
    use std::io::Write as _;

    let next = path.with_extension("next");
    let mut file = options.open(&next)?;
    file.write_all(body)?;
    file.sync_all()?;
    std::fs::rename(&next, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What every exec manager's private folder under `TMPDIR` is named from.
const FOLDER_PREFIX: &str = "tether-exec-";

/// The file in a private folder that its tether holds a lock on (`flock`)
/// for as long as it runs: the kernel lets the lock go when the process
/// ends, however it ends, so a folder whose lock can be taken was left by
/// a run that is over.
const FOLDER_LOCK: &str = ".lock";

/// The exec manager's private folder: its remotes file and the discovered
/// clusters' kubeconfigs, held locked while this process runs, and removed
/// with it on a clean stop.
#[derive(Debug)]
pub struct Folder {
    dir: tempfile::TempDir,
    /// Held for the folder's life: the sign, to a later run, that it is
    /// in use. Opened close-on-exec, so no child holds it.
    _lock: std::fs::File,
}

impl Folder {
    /// Where it is.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Takes the lock of the file at `path`, without waiting; whether it was
/// taken. A symlink is never followed.
fn try_lock(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt as _;

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed())
        .open(path)?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// Removes, from `tmp`, the private folders of exec managers whose run is
/// over: after a SIGKILL, an OOM kill or a second SIGTERM, a folder and
/// the credentials in it stay, and in the chart `TMPDIR` is an emptyDir
/// that outlives the container. A folder whose lock is held belongs to a
/// tether that runs (a second one in the same pod) and is left alone; one
/// with no lock file holds nothing, since a folder is locked before
/// anything is written to it.
fn remove_leftovers(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(FOLDER_PREFIX));
        // `file_type` does not follow a symlink: a link is never a folder
        // of ours.
        if !ours || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match try_lock(&path.join(FOLDER_LOCK)) {
            Ok(Some(_over)) => match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    info!(folder = %path.display(), "removed the exec manager's folder that an earlier run left, with the credentials in it");
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    warn!(folder = %path.display(), error = %err, "cannot remove the exec manager's folder that an earlier run left");
                }
            },
            Ok(None) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                warn!(folder = %path.display(), error = %err, "cannot tell whether an exec manager's folder is in use");
            }
        }
    }
}

/// Makes the folder for the exec manager's remotes file, under `TMPDIR`,
/// after removing those of earlier runs that are over.
///
/// # Errors
///
/// As [`SetupError::Folder`].
pub fn remotes_folder() -> Result<Folder, SetupError> {
    remotes_folder_in(&std::env::temp_dir())
}

/// As [`remotes_folder`], under `tmp`.
fn remotes_folder_in(tmp: &Path) -> Result<Folder, SetupError> {
    remove_leftovers(tmp);
    let dir = tempfile::Builder::new()
        .prefix(FOLDER_PREFIX)
        .tempdir_in(tmp)
        .map_err(SetupError::Folder)?;
    // Locked under another name, then renamed: whenever the lock file is
    // there, it is locked, and a sweep by another tether never takes it in
    // the moment between its creation and its lock.
    let locking = dir.path().join(".lock.new");
    let lock = std::fs::File::create(&locking)
        .and_then(|file| {
            rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
            std::fs::rename(&locking, dir.path().join(FOLDER_LOCK))?;
            Ok(file)
        })
        .map_err(SetupError::Folder)?;
    Ok(Folder { dir, _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::config::SecretSource;

    fn discovered(name: &str) -> ResolvedRemote {
        let source = RemoteSource::Secret(Arc::new(SecretSource {
            namespace: "fleet".to_owned(),
            name: name.to_owned(),
            digest: Vec::new(),
            kubeconfig: Some(
                serde_json::to_vec(&kube::config::Kubeconfig::default())
                    .expect("json")
                    .into(),
            ),
        }));
        let config = kube::Config::new("https://h:6443".parse().expect("a URL"));
        ResolvedRemote::new(name, true, source, Arc::new(config)).expect("a server to probe")
    }

    /// Writes a file listing `remotes`, none lost, as revision `revision`.
    fn write(dir: &Path, revision: u64, remotes: &[ResolvedRemote]) -> PathBuf {
        let listed: Vec<&ResolvedRemote> = remotes.iter().collect();
        let told = Written {
            cycle: 1,
            revision,
            instance: "i",
            remotes: &listed,
            lost: &std::collections::BTreeSet::new(),
        };
        write_remotes(dir, told).expect("written")
    }

    #[test]
    fn the_file_is_versioned_and_says_each_remotes_generation_and_reachability() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (a, b) = (discovered("a"), discovered("b"));
        let lost = std::collections::BTreeSet::from(["b".to_owned()]);
        let told = Written {
            cycle: 3,
            revision: 7,
            instance: "i",
            remotes: &[&a, &b],
            lost: &lost,
        };
        let file = write_remotes(dir.path(), told).expect("written");
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON");
        assert_eq!(read["apiVersion"], REMOTES_FILE_VERSION);
        assert_eq!(read["kind"], "Remotes");
        assert_eq!(
            (read["revision"].as_u64(), read["cycle"].as_u64()),
            (Some(7), Some(3))
        );
        assert_eq!(
            read["remotes"][0]["generation"].as_u64(),
            Some(a.generation)
        );
        assert_eq!(read["remotes"][0]["reachable"], true);
        assert_eq!(read["remotes"][1]["reachable"], false);
        assert!(
            !file.with_extension("next").exists(),
            "the file beside it stayed"
        );
    }

    #[test]
    fn a_discovered_clusters_kubeconfig_is_private_and_goes_with_it() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().expect("temp dir");
        write(dir.path(), 1, &[discovered("a"), discovered("b")]);
        let a = dir.path().join("a.kubeconfig");
        let mode = std::fs::metadata(&a)
            .expect("a's file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        write(dir.path(), 2, &[discovered("b")]);
        assert!(!a.exists(), "a's credentials outlived it");
        assert!(dir.path().join("b.kubeconfig").exists());
    }

    #[test]
    fn the_remotes_variable_stays_within_what_linux_passes_and_the_file_carries_the_rest() {
        // 2,600 names of 50 characters: 130 KiB joined, past Linux's 128
        // KiB for one environment string (E2BIG).
        let name = |i: usize| format!("{:0>50}", format!("cluster-{i}"));
        let fleet: Vec<ResolvedRemote> = (0..2_600).map(|i| discovered(&name(i))).collect();
        let all: Vec<&ResolvedRemote> = fleet.iter().collect();
        assert_eq!(remotes_variable(&all), Err(2_600 * 51 - 1));
        // What Linux says to such a variable, as it said to a controller
        // told of the whole fleet in it.
        let joined: Vec<&str> = fleet.iter().map(|r| r.name.as_str()).collect();
        let refused = std::process::Command::new("true")
            .env("TETHER_REMOTES", joined.join(","))
            .status()
            .expect_err("Linux refuses one environment string over 128 KiB");
        assert_eq!(
            refused.raw_os_error(),
            Some(rustix::io::Errno::TOOBIG.raw_os_error())
        );
        let few: Vec<ResolvedRemote> = (0..3).map(|i| discovered(&name(i))).collect();
        let few: Vec<&ResolvedRemote> = few.iter().collect();
        assert_eq!(remotes_variable(&few).expect("fits").split(',').count(), 3);
        let dir = tempfile::tempdir().expect("temp dir");
        let file = write(dir.path(), 1, &fleet);
        let told: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file).expect("read")).expect("JSON");
        assert_eq!(told["remotes"].as_array().map(Vec::len), Some(2_600));
    }

    #[test]
    fn a_folder_an_earlier_run_left_is_removed_at_start_and_one_in_use_is_not() {
        let tmp = tempfile::tempdir().expect("temp dir");
        // A run killed with SIGKILL: its folder, a kubeconfig and its lock
        // file, which nobody holds any more.
        let killed = tmp.path().join(format!("{FOLDER_PREFIX}killed"));
        std::fs::create_dir(&killed).expect("folder");
        std::fs::write(killed.join(FOLDER_LOCK), b"").expect("lock file");
        std::fs::write(killed.join("a.kubeconfig"), b"token: t").expect("kubeconfig");
        // A second tether of the same pod, running.
        let running = remotes_folder_in(tmp.path()).expect("a folder");
        std::fs::write(running.path().join("b.kubeconfig"), b"token: t").expect("kubeconfig");
        assert!(!killed.exists(), "the killed run's credentials stayed");
        // A link is never followed, nor taken for a folder of ours.
        let elsewhere = tempfile::tempdir().expect("temp dir");
        std::fs::write(elsewhere.path().join(FOLDER_LOCK), b"").expect("lock file");
        std::os::unix::fs::symlink(
            elsewhere.path(),
            tmp.path().join(format!("{FOLDER_PREFIX}link")),
        )
        .expect("link");
        let next = remotes_folder_in(tmp.path()).expect("a folder");
        assert!(
            running.path().join("b.kubeconfig").exists(),
            "a running tether's folder was removed"
        );
        assert!(elsewhere.path().join(FOLDER_LOCK).exists());
        let path = running.path().to_owned();
        drop(running);
        assert!(!path.exists(), "a clean stop removes its folder");
        drop(next);
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("read")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from(format!("{FOLDER_PREFIX}link"))]
        );
    }
}
