//! The in-memory object store: objects, a monotonically increasing
//! `resourceVersion`, and a bounded event history that watches resume from.
//!
//! # Invariants
//!
//! - Every mutation takes the next `resourceVersion` and appends one event to
//!   the history, then broadcasts it, all under the store's lock: a watch
//!   that snapshots the history and subscribes under the same lock sees every
//!   event exactly once.
//! - A watch may resume from any version at or above `oldest`; older ones
//!   are `410 Expired`, as after an etcd compaction.
//! - A new epoch (a "recreated cluster") starts versions far above every
//!   earlier one and moves `oldest` there, so every old version has expired.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::Resource;
use crate::status::ApiError;

/// How many events a watch can resume across.
const HISTORY: usize = 10_000;
/// The distance between epochs' first versions.
const EPOCH_SPAN: u64 = 1_000_000_000;
/// Namespaces every cluster starts with.
const SEED_NAMESPACES: [&str; 4] = ["default", "kube-node-lease", "kube-public", "kube-system"];

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change to the store.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) kind: EventType,
    pub(crate) resource: Resource,
    pub(crate) object: Value,
    pub(crate) rv: u64,
}

type Key = (Resource, String, String);

#[derive(Debug)]
struct Inner {
    epoch: u64,
    rv: u64,
    oldest: u64,
    uids: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Event>>,
}

/// What a write does to the object it addresses.
#[derive(Debug)]
pub(crate) enum Change {
    /// Create or replace it with this.
    Put(Value),
    /// Delete it.
    Delete,
}

/// Sets what the store owns in an object's identity: its type, name and
/// namespace.
fn stamp(object: &mut Value, resource: Resource, namespace: &str, name: &str) {
    if !object.is_object() {
        *object = json!({});
    }
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["apiVersion"] = Value::from(resource.api_version());
    object["kind"] = Value::from(resource.kind());
    let metadata = &mut object["metadata"];
    metadata["name"] = Value::from(name);
    if resource.namespaced() {
        metadata["namespace"] = Value::from(namespace);
    }
}

/// Where a new watch starts.
pub(crate) struct WatchStart {
    /// Events after the requested version, or the current objects as
    /// `ADDED` when no version was given.
    pub(crate) backlog: Vec<Arc<Event>>,
    /// Everything after `rv`.
    pub(crate) live: broadcast::Receiver<Arc<Event>>,
    /// The store's version when the watch started.
    pub(crate) rv: u64,
}

#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    /// Updates still to lose a race, by resource: see
    /// [`ApiServer::lose_updates`](crate::ApiServer::lose_updates).
    races: Mutex<BTreeMap<Resource, u64>>,
}

/// Now, as the apiserver writes `metav1.Time`.
pub(crate) fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Store {
    pub(crate) fn new() -> Self {
        // Room for every watcher to fall this far behind before it is cut
        // off and has to re-watch, as the apiserver cuts off slow watchers.
        // Each slot costs memory in every server, and the scale harness runs
        // thousands of idle servers: 256 keeps one near 37 KiB (1024 cost
        // about 24 KiB more; see docs/benchmarks.md).
        let (events, _) = broadcast::channel(256);
        let store = Self {
            inner: Mutex::new(Inner {
                epoch: 0,
                rv: 0,
                oldest: 0,
                uids: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
            }),
            events,
            races: Mutex::new(BTreeMap::new()),
        };
        store.seed();
        store
    }

    /// Makes the next `n` updates of `resource` lose a race.
    pub(crate) fn lose_updates(&self, resource: Resource, n: u64) {
        self.races
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(resource, n);
    }

    /// Whether this update of `resource` loses a race; counts it.
    pub(crate) fn loses_race(&self, resource: Resource) -> bool {
        let mut races = self
            .races
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match races.get_mut(&resource) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn seed(&self) {
        for name in SEED_NAMESPACES {
            let object = json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
            self.write(Resource::Namespace, "", name, object, EventType::Added)
                .expect("seeding an empty store cannot conflict");
        }
    }

    /// Forgets every object and starts a new epoch of versions.
    pub(crate) fn recreate(&self) {
        {
            let mut inner = self.lock();
            inner.epoch += 1;
            inner.rv = inner.epoch * EPOCH_SPAN;
            inner.oldest = inner.rv;
            inner.objects.clear();
            inner.history.clear();
        }
        self.seed();
    }

    pub(crate) fn rv(&self) -> u64 {
        self.lock().rv
    }

    pub(crate) fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        let key = (resource, namespace.to_owned(), name.to_owned());
        self.lock().objects.get(&key).cloned()
    }

    /// The objects of `resource` (in `namespace`, if given) after `after`
    /// (a key from a continue token), in key order, and the current version.
    pub(crate) fn list(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((r, ns, name), _)| {
                *r == resource
                    && namespace.is_none_or(|want| want == ns)
                    && after.is_none_or(|(ans, aname)| (ns.as_str(), name.as_str()) > (ans, aname))
            })
            .map(|(_, object)| object.clone())
            .collect();
        (items, inner.rv)
    }

    pub(crate) fn namespace_exists(&self, namespace: &str) -> bool {
        self.get(Resource::Namespace, "", namespace).is_some()
    }

    /// Creates, updates or deletes one object, as `decide` says given the
    /// object as it is now, and records the event. `decide` runs under the
    /// store's lock, so a read-modify-write (a PATCH, an apply) is atomic,
    /// as the apiserver's retrying `GuaranteedUpdate` makes it.
    ///
    /// - [`Change::Put`] of a new name creates it: a `resourceVersion` in
    ///   the body is an error, as in the apiserver.
    /// - [`Change::Put`] over an existing object updates it. A
    ///   `metadata.resourceVersion` in the body must match the stored one
    ///   (optimistic concurrency). An update that changes nothing is not
    ///   written: no new version, no event.
    /// - With `dry_run`, everything is checked and the result returned, but
    ///   nothing is stored.
    pub(crate) fn commit(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        dry_run: bool,
        decide: impl FnOnce(Option<&Value>) -> Result<Change, ApiError>,
    ) -> Result<Value, ApiError> {
        let key = (resource, namespace.to_owned(), name.to_owned());
        let mut inner = self.lock();
        let existing = inner.objects.get(&key);
        let change = decide(existing)?;
        let (kind, mut object) = match (change, existing) {
            (Change::Delete, Some(current)) => (EventType::Deleted, current.clone()),
            (Change::Delete, None) => return Err(ApiError::not_found(resource, name)),
            (Change::Put(mut object), None) => {
                if object["metadata"]["resourceVersion"]
                    .as_str()
                    .is_some_and(|rv| !rv.is_empty())
                {
                    return Err(ApiError::new(
                        500,
                        "InternalError",
                        "resourceVersion should not be set on objects to be created",
                    ));
                }
                let uid = format!("{:08x}-0000-4000-8000-{:012x}", inner.epoch, inner.uids + 1);
                stamp(&mut object, resource, namespace, name);
                object["metadata"]["uid"] = Value::from(uid);
                object["metadata"]["creationTimestamp"] = Value::from(now_rfc3339());
                (EventType::Added, object)
            }
            (Change::Put(mut object), Some(current)) => {
                let wanted = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
                let have = current["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("");
                if !wanted.is_empty() && wanted != have {
                    return Err(ApiError::conflict(
                        resource,
                        name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
                stamp(&mut object, resource, namespace, name);
                let metadata = &mut object["metadata"];
                metadata["uid"] = current["metadata"]["uid"].clone();
                metadata["creationTimestamp"] = current["metadata"]["creationTimestamp"].clone();
                metadata["resourceVersion"] = Value::from(have);
                if object == *current {
                    return Ok(object);
                }
                (EventType::Modified, object)
            }
        };
        if dry_run {
            if let (EventType::Added, Some(metadata)) = (kind, object["metadata"].as_object_mut()) {
                metadata.remove("resourceVersion");
            }
            return Ok(object);
        }
        if kind == EventType::Added {
            inner.uids += 1;
        }
        inner.rv += 1;
        let rv = inner.rv;
        // A deleted object's last version is the deletion's, as in the
        // apiserver.
        object["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        if kind == EventType::Deleted {
            inner.objects.remove(&key);
        } else {
            inner.objects.insert(key, object.clone());
        }
        let event = Arc::new(Event {
            kind,
            resource,
            object: object.clone(),
            rv,
        });
        inner.history.push_back(Arc::clone(&event));
        if inner.history.len() > HISTORY {
            let dropped = inner.history.pop_front().expect("history is not empty");
            inner.oldest = dropped.rv;
        }
        // Nobody watching is fine.
        let _ = self.events.send(event);
        Ok(object)
    }

    /// Creates (`Added`), updates (`Modified`) or deletes (`Deleted`) one
    /// object, for the kit's own seeding and for tests: a create of an
    /// existing name is `409 AlreadyExists`, and an update or delete of a
    /// missing one `404`.
    pub(crate) fn write(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        object: Value,
        kind: EventType,
    ) -> Result<Value, ApiError> {
        self.commit(resource, namespace, name, false, |existing| {
            match (kind, existing) {
                (EventType::Added, Some(_)) => Err(ApiError::already_exists(resource, name)),
                (EventType::Modified, None) => Err(ApiError::not_found(resource, name)),
                (EventType::Deleted, _) => Ok(Change::Delete),
                _ => Ok(Change::Put(object)),
            }
        })
    }

    /// Starts a watch of `resource` after version `from`; with no version,
    /// from the current state.
    ///
    /// # Errors
    ///
    /// `410 Expired` if `from` is older than the history reaches.
    pub(crate) fn watch(
        &self,
        resource: Resource,
        from: Option<u64>,
    ) -> Result<WatchStart, ApiError> {
        let inner = self.lock();
        let backlog = match from {
            Some(from) if from < inner.oldest => return Err(ApiError::expired(from, inner.oldest)),
            Some(from) => inner
                .history
                .iter()
                .filter(|e| e.rv > from && e.resource == resource)
                .cloned()
                .collect(),
            None => inner
                .objects
                .iter()
                .filter(|((r, _, _), _)| *r == resource)
                .map(|(_, object)| {
                    Arc::new(Event {
                        kind: EventType::Added,
                        resource,
                        object: object.clone(),
                        rv: inner.rv,
                    })
                })
                .collect(),
        };
        Ok(WatchStart {
            backlog,
            live: self.events.subscribe(),
            rv: inner.rv,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> Value {
        json!({"metadata": {"name": name}, "data": {"k": "v"}})
    }

    #[test]
    fn every_write_takes_the_next_version() {
        let store = Store::new();
        let start = store.rv();
        let created = store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                cm("a"),
                EventType::Added,
            )
            .expect("create");
        assert_eq!(
            created["metadata"]["resourceVersion"],
            (start + 1).to_string()
        );
        assert_eq!(created["kind"], "ConfigMap");
        let unchanged = store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                created.clone(),
                EventType::Modified,
            )
            .expect("an update that changes nothing");
        assert_eq!(unchanged, created, "a no-op update is not written");
        let mut changed = created;
        changed["data"]["k"] = json!("w");
        let updated = store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                changed,
                EventType::Modified,
            )
            .expect("update with the current version");
        assert_eq!(
            updated["metadata"]["resourceVersion"],
            (start + 2).to_string()
        );
        assert_eq!(store.rv(), start + 2);
    }

    #[test]
    fn a_stale_update_conflicts_and_a_duplicate_create_already_exists() {
        let store = Store::new();
        let created = store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                cm("a"),
                EventType::Added,
            )
            .expect("create");
        let mut changed = created.clone();
        changed["data"]["k"] = json!("w");
        store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                changed,
                EventType::Modified,
            )
            .expect("update");
        let stale = store.write(
            Resource::ConfigMap,
            "default",
            "a",
            created,
            EventType::Modified,
        );
        assert_eq!(stale.expect_err("stale").reason, "Conflict");
        let again = store.write(
            Resource::ConfigMap,
            "default",
            "a",
            cm("a"),
            EventType::Added,
        );
        assert_eq!(again.expect_err("duplicate").code, 409);
    }

    #[test]
    fn a_watch_resumes_after_its_version_and_a_new_epoch_expires_it() {
        let store = Store::new();
        let from = store.rv();
        store
            .write(
                Resource::ConfigMap,
                "default",
                "a",
                cm("a"),
                EventType::Added,
            )
            .expect("create");
        let start = store
            .watch(Resource::ConfigMap, Some(from))
            .expect("resumable");
        assert_eq!(start.backlog.len(), 1);
        assert_eq!(start.backlog[0].kind, EventType::Added);

        store.recreate();
        assert!(store.rv() > from + EPOCH_SPAN - 1);
        let err = store
            .watch(Resource::ConfigMap, Some(from))
            .err()
            .expect("expired");
        assert_eq!(err.code, 410);
        assert!(store.get(Resource::ConfigMap, "default", "a").is_none());
        assert!(store.namespace_exists("default"));
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let ts = now_rfc3339();
        assert_eq!(ts.len(), 20, "{ts}");
        assert!(ts.starts_with("20") && ts.ends_with('Z'), "{ts}");
    }
}
