//! The files a remote's settings come from (its kubeconfig, and the CA,
//! client certificate, key and token files it names), and whether they
//! changed since they were read.
//!
//! Kubernetes updates a mounted Secret by writing a new directory and
//! swapping the `..data` symlink to it: the path a kubeconfig names stays,
//! and what it leads to changes. So a file is judged through its path, as
//! `stat` sees it (device, inode, size, times); when that changed, its
//! content's hash decides, so a `touch` or a swap to the same bytes
//! rebuilds nothing. The daemon checks a remote's files when their folder's
//! inotify watch wakes it (`daemon/folders.rs`), when its probe asks, and
//! in a slow sweep.

use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The most of a file that is hashed: a kubeconfig, a CA bundle or a token
/// is a few KiB; past this, a file is judged by its first bytes and its
/// size, which `stat` has anyway.
const HASHED_MAX: u64 = 4 << 20;

/// What a file is to its remote, as the logs and `kubeconfig` fields name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The kubeconfig file itself.
    Kubeconfig,
    /// The cluster's `certificate-authority` (or `caFile`).
    CertificateAuthority,
    /// The user's `client-certificate`.
    ClientCertificate,
    /// The user's `client-key`.
    ClientKey,
    /// The user's `tokenFile`: a projected `ServiceAccount` token, rotated by
    /// the kubelet.
    TokenFile,
}

impl Role {
    /// The name the logs use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubeconfig => "kubeconfig",
            Self::CertificateAuthority => "certificate-authority",
            Self::ClientCertificate => "client-certificate",
            Self::ClientKey => "client-key",
            Self::TokenFile => "tokenFile",
        }
    }
}

/// A file's `stat`, through its path (symlinks followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// What was seen of a file: its stamp and its content's hash, or nothing
/// when it could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    stamp: Stamp,
    content: u64,
}

impl Seen {
    fn stamp(path: &Path) -> Option<Stamp> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }

    fn content(path: &Path) -> Option<u64> {
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .ok()?
            .take(HASHED_MAX)
            .read_to_end(&mut bytes)
            .ok()?;
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        Some(hasher.finish())
    }

    fn of(path: &Path) -> Option<Self> {
        let stamp = Self::stamp(path)?;
        Some(Self {
            stamp,
            content: Self::content(path)?,
        })
    }
}

/// One file a remote's settings come from.
#[derive(Debug, Clone)]
pub struct SourceFile {
    role: Role,
    path: PathBuf,
    seen: Option<Seen>,
}

impl SourceFile {
    /// `path`, as it is now. Take this before the settings are read from
    /// it: a change made between the two is then seen at the next check,
    /// never missed.
    #[must_use]
    pub fn read(role: Role, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let seen = Seen::of(&path);
        Self { role, path, seen }
    }

    /// What the file is to its remote.
    #[must_use]
    pub fn role(&self) -> Role {
        self.role
    }

    /// Its path, as the settings name it.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether its content changed (or it appeared, or went) since it was
    /// last seen; a new `stat` with the same content is remembered and is
    /// no change.
    pub fn changed(&mut self) -> bool {
        let stamp = Seen::stamp(&self.path);
        if stamp == self.seen.map(|s| s.stamp) {
            return false;
        }
        let now = Seen::of(&self.path);
        let changed = now.map(|s| s.content) != self.seen.map(|s| s.content);
        self.seen = now;
        changed
    }

    /// Whether `self` and `other` are the same file with the same content.
    #[must_use]
    pub fn same_as(&self, other: &Self) -> bool {
        self.role == other.role
            && self.path == other.path
            && self.seen.map(|s| s.content) == other.seen.map(|s| s.content)
    }
}

/// The roles of `files` whose content changed since last seen, each once.
pub fn changed(files: &mut [SourceFile]) -> Vec<Role> {
    let mut roles: Vec<Role> = files
        .iter_mut()
        .filter_map(|file| file.changed().then_some(file.role))
        .collect();
    roles.sort_unstable();
    roles.dedup();
    roles
}

/// `roles` for a log line: `kubeconfig and certificate-authority`.
#[must_use]
pub fn shown(roles: &[Role]) -> String {
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `files` into a new timestamped directory beside `..data` and
    /// swaps `..data` to it, as the kubelet updates a Secret volume; the
    /// first call also makes the top-level links.
    fn swap(dir: &Path, generation: u32, files: &[(&str, &str)]) {
        let target = format!("..2026_12_01_{generation}");
        std::fs::create_dir(dir.join(&target)).expect("dir");
        for (name, text) in files {
            std::fs::write(dir.join(&target).join(name), text).expect("write");
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(format!("..data/{name}"), link).expect("link");
            }
        }
        std::os::unix::fs::symlink(&target, dir.join("..data_tmp")).expect("tmp link");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap");
    }

    #[test]
    fn a_secret_volume_swap_is_a_change_and_a_touch_is_not() {
        let dir = tempfile::tempdir().expect("dir");
        swap(dir.path(), 1, &[("ca.crt", "one"), ("token", "t1")]);
        let mut files = vec![
            SourceFile::read(Role::CertificateAuthority, dir.path().join("ca.crt")),
            SourceFile::read(Role::TokenFile, dir.path().join("token")),
        ];
        assert_eq!(changed(&mut files), []);

        swap(dir.path(), 2, &[("ca.crt", "two"), ("token", "t1")]);
        assert_eq!(changed(&mut files), [Role::CertificateAuthority]);
        assert_eq!(changed(&mut files), [], "seen once, then no change");

        // Rewritten with the same bytes: a new stat, the same content.
        std::fs::write(dir.path().join("..data/token"), "t1").expect("rewrite");
        assert_eq!(changed(&mut files), []);

        std::fs::remove_file(dir.path().join("..data/token")).expect("remove");
        assert_eq!(changed(&mut files), [Role::TokenFile], "a file that went");
    }

    #[test]
    fn roles_are_shown_as_a_list() {
        assert_eq!(shown(&[Role::Kubeconfig]), "kubeconfig");
        assert_eq!(
            shown(&[
                Role::Kubeconfig,
                Role::CertificateAuthority,
                Role::TokenFile
            ]),
            "kubeconfig, certificate-authority and tokenFile"
        );
    }
}
