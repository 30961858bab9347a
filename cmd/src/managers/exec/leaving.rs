//! The remotes a process that follows its remotes file was told to let go,
//! until it says it has (`TETHER_APPLIED_FILE`): they still count as
//! running here, so that sharding gives a remote to another replica only
//! once this one's process has stopped using it. A process that does not
//! say so in time is restarted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

/// The most of the applied file tether reads: a revision in JSON.
const MAX_APPLIED_BYTES: u64 = 4096;

/// Each remote let go, the revision of the file that left it out, and
/// since when.
#[derive(Debug, Default)]
pub(super) struct Leaving(BTreeMap<String, (u64, Instant)>);

impl Leaving {
    /// A file of `revision` told `now`, after one that told `before`: the
    /// remotes it dropped are leaving, and those it lists are not.
    pub(super) fn told(
        &mut self,
        before: &BTreeSet<String>,
        now: &BTreeSet<String>,
        revision: u64,
    ) {
        self.0.retain(|name, _| !now.contains(name));
        let at = Instant::now();
        for name in before.difference(now) {
            self.0.entry(name.clone()).or_insert((revision, at));
        }
    }

    /// The process applied every revision up to `applied`: what those
    /// dropped is gone. Whether anything left.
    pub(super) fn applied(&mut self, applied: u64) -> bool {
        let before = self.0.len();
        self.0.retain(|_, (revision, _)| *revision > applied);
        self.0.len() != before
    }

    /// Whether a remote has been leaving for longer than `within`.
    pub(super) fn overdue(&self, within: Duration) -> bool {
        let now = Instant::now();
        self.0
            .values()
            .any(|(_, since)| now.saturating_duration_since(*since) > within)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn names(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }
}

/// The revision the process says it applied, from `path`; `None` if the
/// file is missing, too large, not an acknowledgement, or from another run
/// than `instance`.
pub(super) fn read_applied(path: &Path, instance: &str) -> Option<u64> {
    use std::io::Read as _;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Applied {
        api_version: String,
        instance: String,
        revision: u64,
    }
    let mut body = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_APPLIED_BYTES)
        .read_to_end(&mut body)
        .ok()?;
    let applied: Applied = serde_json::from_slice(&body).ok()?;
    (applied.api_version == super::REMOTES_FILE_VERSION && applied.instance == instance)
        .then_some(applied.revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_remote_leaves_once_its_revision_is_applied_or_is_overdue() {
        let mut leaving = Leaving::default();
        leaving.told(&set(&["a", "b"]), &set(&["a"]), 5);
        assert_eq!(leaving.names().collect::<Vec<_>>(), ["b"]);
        assert!(!leaving.applied(4), "an older revision lets nothing go");
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!leaving.overdue(Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(leaving.overdue(Duration::from_secs(5)));
        assert!(leaving.applied(5));
        assert!(leaving.is_empty());

        // Listed again before it was applied: not leaving.
        leaving.told(&set(&["a"]), &set(&[]), 6);
        leaving.told(&set(&[]), &set(&["a"]), 7);
        assert!(leaving.is_empty());
    }

    #[test]
    fn the_applied_file_is_read_bounded_and_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("applied.json");
        assert_eq!(read_applied(&path, "i1"), None, "missing");
        std::fs::write(
            &path,
            r#"{"apiVersion":"tether.dev/v1","instance":"i1","revision":7}"#,
        )
        .expect("write");
        assert_eq!(read_applied(&path, "i1"), Some(7));
        assert_eq!(read_applied(&path, "i2"), None, "another run's");
        std::fs::write(
            &path,
            r#"{"apiVersion":"other/v9","instance":"i1","revision":7}"#,
        )
        .expect("write");
        assert_eq!(read_applied(&path, "i1"), None, "another version");
        let huge = format!(
            r#"{{"apiVersion":"tether.dev/v1","instance":"i1","revision":7,"pad":"{}"}}"#,
            "x".repeat(10_000)
        );
        std::fs::write(&path, huge).expect("write");
        assert_eq!(read_applied(&path, "i1"), None, "past the bound");
    }
}
