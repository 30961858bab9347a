//! `metadata.managedFields` and server-side apply.
//!
//! Each manager owns a set of leaf fields, written as `fieldsV1` the way the
//! apiserver writes it. Lists are atomic (one leaf), which is what the kinds
//! the kit serves need: their only lists are `finalizers` and
//! `ownerReferences`.
//!
//! - An update (create, PUT, or a non-apply PATCH) gives its manager the
//!   fields it changed, and takes them from every other manager.
//! - An apply owns exactly the fields of the applied configuration. A field
//!   it would change that another manager owns is a conflict (`409`), unless
//!   `force` takes the field over. A field it applied before and leaves out
//!   now is removed, unless another manager owns it too.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::Resource;
use crate::status::ApiError;
use crate::store::now_rfc3339;

type Path = Vec<String>;

/// Fields no manager owns: identity and bookkeeping.
fn untracked(path: &[String]) -> bool {
    match path {
        [top] => matches!(top.as_str(), "apiVersion" | "kind"),
        [metadata, field, ..] if metadata == "metadata" => matches!(
            field.as_str(),
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "generation"
                | "creationTimestamp"
                | "deletionTimestamp"
                | "selfLink"
                | "managedFields"
        ),
        _ => false,
    }
}

/// The leaf fields of an object and their values.
fn leaves(object: &Value) -> BTreeMap<Path, &Value> {
    fn walk<'v>(value: &'v Value, path: &mut Path, out: &mut BTreeMap<Path, &'v Value>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    path.push(key.clone());
                    if !untracked(path) {
                        walk(child, path, out);
                    }
                    path.pop();
                }
            }
            _ if !path.is_empty() => {
                out.insert(path.clone(), value);
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk(object, &mut Vec::new(), &mut out);
    out
}

/// Nodes that are structs, not maps, and so carry no `.` of their own.
fn is_struct(path: &[String]) -> bool {
    matches!(path, [] | [_]) && path.first().is_none_or(|p| p == "metadata" || p == "spec")
}

/// The `fieldsV1` of a field set. An update owns each map it wrote into as
/// well as its keys, marked `.`; an apply owns only the leaves it named, as
/// the real apiserver records them.
fn to_fields_v1(fields: &BTreeSet<Path>, owns_maps: bool) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut node = &mut root;
        for (depth, key) in path.iter().enumerate() {
            let child = node
                .entry(format!("f:{key}"))
                .or_insert_with(|| Value::Object(Map::new()));
            let child = child.as_object_mut().expect("every node is an object");
            if owns_maps && depth + 1 < path.len() && !is_struct(&path[..=depth]) {
                child.insert(".".to_owned(), json!({}));
            }
            node = child;
        }
    }
    Value::Object(root)
}

fn from_fields_v1(value: &Value) -> BTreeSet<Path> {
    fn walk(value: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let children: Vec<(&str, &Value)> = value
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k, v)))
            .collect();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (key, child) in children {
            path.push(key.to_owned());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    apply: bool,
    time: Value,
    fields: BTreeSet<Path>,
}

impl Entry {
    fn is(&self, manager: &str, apply: bool) -> bool {
        self.manager == manager && self.apply == apply
    }
}

fn entries(object: Option<&Value>) -> Vec<Entry> {
    object
        .and_then(|o| o["metadata"]["managedFields"].as_array())
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e["manager"].as_str().unwrap_or_default().to_owned(),
            apply: e["operation"] == "Apply",
            time: e["time"].clone(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

fn now() -> Value {
    Value::from(now_rfc3339())
}

fn set_entries(object: &mut Value, resource: Resource, entries: Vec<Entry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": if e.apply { "Apply" } else { "Update" },
                "apiVersion": resource.api_version(),
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields, !e.apply),
            })
        })
        .collect();
    let metadata = &mut object["metadata"];
    if list.is_empty() {
        if let Some(map) = metadata.as_object_mut() {
            map.remove("managedFields");
        }
    } else {
        metadata["managedFields"] = Value::Array(list);
    }
}

/// Puts `entry` among `entries`, replacing the entry of the same manager and
/// operation, and stamps it if its fields changed or `touched`.
fn upsert(entries: &mut Vec<Entry>, mut entry: Entry, touched: bool) {
    entry.time = now();
    if let Some(old) = entries
        .iter_mut()
        .find(|e| e.is(&entry.manager, entry.apply))
    {
        if touched || old.fields != entry.fields {
            *old = entry;
        }
    } else {
        entries.push(entry);
    }
}

/// Records an update of `old` (none for a create) to `new` by `manager` in
/// `new`'s managedFields. Whatever managedFields `new` carried are replaced:
/// the kit keeps the history itself.
pub(crate) fn record_update(
    resource: Resource,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
) {
    let before = old.map(leaves).unwrap_or_default();
    let after = leaves(new);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|(path, value)| before.get(*path) != Some(*value))
        .map(|(path, _)| path.clone())
        .collect();
    let mut list = entries(old);
    for entry in &mut list {
        let mine = entry.is(manager, false);
        entry
            .fields
            .retain(|path| after.contains_key(path) && (mine || !changed.contains(path)));
    }
    if !changed.is_empty() {
        let mut mine = list
            .iter()
            .find(|e| e.is(manager, false))
            .map_or_else(BTreeSet::new, |e| e.fields.clone());
        mine.extend(changed);
        upsert(
            &mut list,
            Entry {
                manager: manager.to_owned(),
                apply: false,
                time: Value::Null,
                fields: mine,
            },
            true,
        );
    }
    set_entries(new, resource, list);
}

fn render(path: &[String]) -> String {
    path.iter().fold(String::new(), |mut text, key| {
        text.push('.');
        text.push_str(key);
        text
    })
}

fn conflict(conflicts: &[(String, Path)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(manager, path)| {
            json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with \"{manager}\" using v1"),
                "field": render(path),
            })
        })
        .collect();
    let list: Vec<String> = conflicts
        .iter()
        .map(|(manager, path)| format!("conflict with \"{manager}\" using v1: {}", render(path)))
        .collect();
    let count = conflicts.len();
    let noun = if count == 1 { "conflict" } else { "conflicts" };
    ApiError::new(
        409,
        "Conflict",
        format!("Apply failed with {count} {noun}: {}", list.join("; ")),
    )
    .with_details(json!({"causes": causes}))
}

/// Merges `applied` into `object`: maps key by key, everything else
/// replaced.
fn merge_into(object: &mut Value, applied: &Value) {
    match (object, applied) {
        (Value::Object(target), Value::Object(source)) => {
            for (key, value) in source {
                merge_into(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (target, value) => *target = value.clone(),
    }
}

fn remove_path(object: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for key in parents {
        match node.get_mut(key) {
            Some(child) => node = child,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

/// The object after `manager` applies `applied` to `current` (none: the
/// apply creates it).
///
/// # Errors
///
/// `409 Conflict`, listing every field, when the apply would change fields
/// other managers own and `force` is not set.
pub(crate) fn apply(
    resource: Resource,
    current: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
) -> Result<Value, ApiError> {
    let mut applied = applied.clone();
    remove_path(
        &mut applied,
        &["metadata".to_owned(), "managedFields".to_owned()],
    );
    let wanted = leaves(&applied);
    let have = current.map(leaves).unwrap_or_default();
    let mut list = entries(current);

    let mut conflicts = Vec::new();
    for (path, value) in &wanted {
        if have.get(path).is_none_or(|v| v == value) {
            continue;
        }
        for entry in list
            .iter()
            .filter(|e| !e.is(manager, true) && e.fields.contains(path))
        {
            conflicts.push((entry.manager.clone(), path.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict(&conflicts));
    }
    for entry in &mut list {
        entry
            .fields
            .retain(|p| !conflicts.iter().any(|(_, taken)| taken == p));
    }

    let mut object = current.cloned().unwrap_or_else(|| json!({}));
    let before = object.clone();
    let previously = list
        .iter()
        .find(|e| e.is(manager, true))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for path in previously.iter().filter(|p| !wanted.contains_key(*p)) {
        let shared = list
            .iter()
            .any(|e| !e.is(manager, true) && e.fields.contains(path));
        if !shared {
            remove_path(&mut object, path);
        }
    }
    merge_into(&mut object, &applied);
    let touched = leaves(&object) != leaves(&before);
    upsert(
        &mut list,
        Entry {
            manager: manager.to_owned(),
            apply: true,
            time: Value::Null,
            fields: wanted.into_keys().collect(),
        },
        touched,
    );
    set_entries(&mut object, resource, list);
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: &Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data})
    }

    fn managers(object: &Value) -> Vec<(String, String)> {
        object["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap_or("").to_owned(),
                    e["operation"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn fields_v1_is_written_as_the_apiserver_writes_it() {
        let mut object = cm(&json!({"a": "1"}));
        object["metadata"]["labels"] = json!({"app": "x"});
        record_update(Resource::ConfigMap, None, &mut object, "kubectl-create");
        let entry = &object["metadata"]["managedFields"][0];
        assert_eq!(entry["operation"], "Update");
        assert_eq!(entry["fieldsType"], "FieldsV1");
        assert_eq!(
            entry["fieldsV1"],
            json!({"f:data": {".": {}, "f:a": {}}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}})
        );
        assert_eq!(from_fields_v1(&entry["fieldsV1"]).len(), 2);
    }

    #[test]
    fn an_apply_over_a_field_another_manager_set_conflicts_unless_forced() {
        let mut created = cm(&json!({"a": "1", "b": "2"}));
        record_update(Resource::ConfigMap, None, &mut created, "kubectl-create");

        // Same values: shared, no conflict.
        let same = apply(
            Resource::ConfigMap,
            Some(&created),
            &cm(&json!({"a": "1"})),
            "ssa",
            false,
        )
        .expect("same value is no conflict");
        assert_eq!(managers(&same).len(), 2);

        let err = apply(
            Resource::ConfigMap,
            Some(&created),
            &cm(&json!({"a": "9"})),
            "ssa",
            false,
        )
        .expect_err("a conflict");
        assert_eq!(err.code, 409);
        assert!(
            err.message
                .contains("conflict with \"kubectl-create\" using v1: .data.a"),
            "{}",
            err.message
        );

        let forced = apply(
            Resource::ConfigMap,
            Some(&created),
            &cm(&json!({"a": "9"})),
            "ssa",
            true,
        )
        .expect("force takes the field");
        assert_eq!(forced["data"], json!({"a": "9", "b": "2"}));
        let fields = entries(Some(&forced));
        let create = fields
            .iter()
            .find(|e| e.manager == "kubectl-create")
            .expect("still owns b");
        assert_eq!(create.fields.len(), 1);
    }

    #[test]
    fn a_field_left_out_of_the_next_apply_is_removed_and_a_repeat_changes_nothing() {
        let first = apply(
            Resource::ConfigMap,
            None,
            &cm(&json!({"a": "1", "b": "2"})),
            "ssa",
            false,
        )
        .expect("creates");
        let second = apply(
            Resource::ConfigMap,
            Some(&first),
            &cm(&json!({"a": "1"})),
            "ssa",
            false,
        )
        .expect("applies");
        assert_eq!(second["data"], json!({"a": "1"}));
        let third = apply(
            Resource::ConfigMap,
            Some(&second),
            &cm(&json!({"a": "1"})),
            "ssa",
            false,
        )
        .expect("applies again");
        assert_eq!(
            third, second,
            "a repeated apply is a no-op, timestamps included"
        );
    }

    #[test]
    fn an_update_takes_the_fields_it_changes() {
        let applied = apply(
            Resource::ConfigMap,
            None,
            &cm(&json!({"a": "1"})),
            "ssa",
            false,
        )
        .expect("creates");
        let mut edited = applied.clone();
        edited["data"]["a"] = json!("2");
        record_update(
            Resource::ConfigMap,
            Some(&applied),
            &mut edited,
            "kubectl-edit",
        );
        assert_eq!(
            managers(&edited),
            [("kubectl-edit".to_owned(), "Update".to_owned())]
        );
        let err = apply(
            Resource::ConfigMap,
            Some(&edited),
            &cm(&json!({"a": "1"})),
            "ssa",
            false,
        )
        .expect_err("the editor owns a now");
        assert_eq!(err.code, 409);
    }
}
