//! Watches as a real apiserver saw them, from its audit log: a witness of
//! who ran a manager against a remote that the manager's own process
//! cannot forge.
//!
//! A [`ControlPlane`](crate::ControlPlane) started with
//! [`RealOptions::audit_watches`](crate::RealOptions::audit_watches) logs
//! every watch request's `ResponseStarted` (the watch is open) and
//! `ResponseComplete` (it ended, by either side) stages, at `Metadata`
//! level, and nothing else; its own loopback clients are left out.
//!
//! # Invariants
//!
//! - A watch is counted from its `ResponseStarted`: a watch refused before
//!   it opened served no cache and is not one.
//! - A line that is not an audit event (the last, half-written one) is
//!   skipped, never guessed at.
//! - Each incarnation of the apiserver logs to a file of its own: a killed
//!   one logs no end for its open watches, and they ended by the time the
//!   next one started.

use std::collections::BTreeMap;
use std::path::Path;

use jiff::Timestamp;
use serde_json::Value;

/// The policy: watches at `Metadata`, without the request's stage, and
/// nothing else; the apiserver's own clients (`system:apiserver`) not at all.
pub(crate) const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: [\"system:apiserver\"]
  - level: Metadata
    verbs: [watch]
  - level: None
";

/// One watch a client had open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    /// The client's address, as the apiserver saw it (a pod's IP).
    pub source: String,
    /// The user it authenticated as.
    pub user: String,
    /// The resource it watched: `namespaces`, `configmaps`, ...
    pub resource: String,
    /// When it opened.
    pub opened: Timestamp,
    /// When it ended; `None` while it is open.
    pub ended: Option<Timestamp>,
}

impl Watch {
    /// Whether `self` and `other` were open at one instant.
    #[must_use]
    pub fn overlaps(&self, other: &Self) -> bool {
        let before = |end: Option<Timestamp>, start: Timestamp| end.is_some_and(|e| e <= start);
        !before(self.ended, other.opened) && !before(other.ended, self.opened)
    }
}

/// The watches in the audit log at `path`, in the order they opened. The
/// log of an apiserver that has since been killed has no end for the
/// watches it had open: they ended by `ended_by`, when the next one started.
///
/// # Errors
///
/// If the file cannot be read.
pub(crate) fn read(path: &Path, ended_by: Option<Timestamp>) -> std::io::Result<Vec<Watch>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        // Written at the first event.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(err),
    };
    let mut watches = parse(&text);
    for watch in &mut watches {
        watch.ended = watch.ended.or(ended_by);
    }
    Ok(watches)
}

/// The watches in an audit log's text.
fn parse(text: &str) -> Vec<Watch> {
    let mut watches: BTreeMap<String, Watch> = BTreeMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let field = |name: &str| event[name].as_str().unwrap_or_default();
        let Ok(at) = field("stageTimestamp").parse::<Timestamp>() else {
            continue;
        };
        let id = field("auditID").to_owned();
        match field("stage") {
            "ResponseStarted" => {
                watches.insert(
                    id,
                    Watch {
                        source: event["sourceIPs"][0]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        user: event["user"]["username"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        resource: event["objectRef"]["resource"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        opened: at,
                        ended: None,
                    },
                );
            }
            "ResponseComplete" | "Panic" => {
                if let Some(watch) = watches.get_mut(&id) {
                    watch.ended = Some(at);
                }
            }
            _ => {}
        }
    }
    let mut watches: Vec<Watch> = watches.into_values().collect();
    watches.sort_by_key(|w| w.opened);
    watches
}

/// Every pair of watches from two clients that were open at one instant.
#[must_use]
pub fn overlapping(watches: &[Watch]) -> Vec<(&Watch, &Watch)> {
    let mut pairs = Vec::new();
    for (i, first) in watches.iter().enumerate() {
        for second in &watches[i + 1..] {
            if first.source != second.source && first.overlaps(second) {
                pairs.push((first, second));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, stage: &str, source: &str, at: &str) -> String {
        format!(
            r#"{{"kind":"Event","auditID":"{id}","stage":"{stage}","verb":"watch","user":{{"username":"admin"}},"sourceIPs":["{source}"],"objectRef":{{"resource":"namespaces"}},"stageTimestamp":"2026-12-03T20:00:{at}Z"}}"#
        )
    }

    #[test]
    fn a_watch_spans_its_start_to_its_end() {
        let log = [
            event("a", "ResponseStarted", "10.0.0.2", "01.000000"),
            event("b", "ResponseComplete", "10.0.0.3", "01.500000"),
            event("a", "ResponseComplete", "10.0.0.2", "02.000000"),
            event("c", "ResponseStarted", "10.0.0.3", "02.000001"),
            r#"{"kind":"Event","auditID":"d","stage":"Respo"#.to_owned(),
        ]
        .join("\n");
        let watches = parse(&log);
        assert_eq!(watches.len(), 2, "b never opened, d is half-written");
        assert_eq!(watches[0].source, "10.0.0.2");
        assert_eq!(watches[0].resource, "namespaces");
        assert!(watches[0].ended.is_some());
        assert_eq!(watches[1].ended, None, "c is still open");
        assert!(
            overlapping(&watches).is_empty(),
            "c opened after a ended: {watches:?}"
        );
    }

    #[test]
    fn a_killed_apiservers_open_watches_ended_when_the_next_started() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("audit-1.log");
        std::fs::write(&log, event("a", "ResponseStarted", "10.0.0.2", "01.000000")).expect("log");
        let next: Timestamp = "2026-12-03T20:00:05Z".parse().expect("time");
        let watches = read(&log, Some(next)).expect("read");
        assert_eq!(watches[0].ended, Some(next));
        let never = read(&dir.path().join("audit-2.log"), None).expect("no log yet");
        assert!(never.is_empty(), "{never:?}");
    }

    #[test]
    fn two_clients_open_at_once_overlap_and_one_client_never_does() {
        let log = [
            event("a", "ResponseStarted", "10.0.0.2", "01.000000"),
            event("b", "ResponseStarted", "10.0.0.2", "01.100000"),
            event("c", "ResponseStarted", "10.0.0.3", "01.900000"),
            event("a", "ResponseComplete", "10.0.0.2", "02.000000"),
        ]
        .join("\n");
        let watches = parse(&log);
        let pairs = overlapping(&watches);
        assert_eq!(pairs.len(), 2, "a and b each overlap c: {pairs:?}");
        assert!(pairs.iter().all(|(x, y)| x.source != y.source));
    }
}
