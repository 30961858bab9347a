//! The JSON form of the protobuf messages the kit serves, mapped field by
//! field onto `k8s-pb`'s generated types.
//!
//! Every object that enters the store passes through this mapping, whatever
//! format it came in: a body that does not fit the type is rejected as the
//! apiserver rejects it, unknown fields are found (and dropped, as the
//! apiserver drops them), and the stored JSON is the canonical form. That is
//! also why encoding a stored object as protobuf cannot fail.
//!
//! The mapping lists every field of every message, so a field added to
//! `k8s-pb` does not compile until it is mapped here.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::events::v1 as events;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use serde_json::{Map, Value};

/// Why a JSON value does not fit a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError {
    /// Where, as `spec.leaseDurationSeconds`.
    pub(crate) path: String,
    /// What was wrong there.
    pub(crate) problem: String,
}

/// The walk through a value: where it is, and the unknown fields met.
#[derive(Debug, Default)]
pub(crate) struct Cx {
    path: Vec<String>,
    /// The paths of fields no message has, as `spec.foo`.
    pub(crate) unknown: Vec<String>,
}

impl Cx {
    fn here(&self) -> String {
        self.path.join(".")
    }

    fn error(&self, problem: impl Into<String>) -> WireError {
        WireError {
            path: self.here(),
            problem: problem.into(),
        }
    }

    fn mismatch(&self, want: &str, got: &Value) -> WireError {
        let got = match got {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        self.error(format!(
            "cannot unmarshal {got} into a field of type {want}"
        ))
    }

    fn object<'v>(&self, value: &'v Value) -> Result<&'v Map<String, Value>, WireError> {
        value
            .as_object()
            .ok_or_else(|| self.mismatch("object", value))
    }

    fn within<T>(
        &mut self,
        key: &str,
        f: impl FnOnce(&mut Self) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        self.path.push(key.to_owned());
        let result = f(self);
        self.path.pop();
        result
    }

    fn note_unknown(&mut self, map: &Map<String, Value>, known: &[&str]) {
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            self.path.push(key.clone());
            self.unknown.push(self.here());
            self.path.pop();
        }
    }
}

/// A message or scalar with a JSON form.
pub(crate) trait Wire: Sized {
    /// Whether a zero value is left out of the JSON unless the field says
    /// otherwise: true for strings, since Go's JSON tags say `omitempty` on
    /// nearly every one.
    const OMIT_ZERO: bool = false;

    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError>;
    fn to_json(&self) -> Value;

    /// Whether this is the zero value Go's `omitempty` leaves out.
    /// Protobuf cannot tell a zero from an absent value for Go's
    /// non-pointer fields, which Go always writes.
    fn is_zero(&self) -> bool {
        false
    }
}

/// How a field of a message reads and writes: `Option`, repeated and map
/// fields differ in what an absent or empty value means.
pub(crate) trait Field: Sized {
    fn read(value: Option<&Value>, cx: &mut Cx) -> Result<Self, WireError>;
    /// `None` leaves the field out of the JSON. `omitempty` says whether a
    /// zero value is left out too; `None` takes the type's default.
    fn write(&self, omitempty: Option<bool>) -> Option<Value>;
}

impl<T: Wire> Field for Option<T> {
    fn read(value: Option<&Value>, cx: &mut Cx) -> Result<Self, WireError> {
        match value {
            None | Some(Value::Null) => Ok(None),
            Some(value) => T::from_json(value, cx).map(Some),
        }
    }

    fn write(&self, omitempty: Option<bool>) -> Option<Value> {
        let omit = omitempty.unwrap_or(T::OMIT_ZERO);
        self.as_ref()
            .filter(|v| !(omit && v.is_zero()))
            .map(Wire::to_json)
    }
}

impl<T: Wire> Field for Vec<T> {
    fn read(value: Option<&Value>, cx: &mut Cx) -> Result<Self, WireError> {
        match value {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| cx.within(&i.to_string(), |cx| T::from_json(item, cx)))
                .collect(),
            Some(other) => Err(cx.mismatch("array", other)),
        }
    }

    fn write(&self, _: Option<bool>) -> Option<Value> {
        (!self.is_empty()).then(|| Value::Array(self.iter().map(Wire::to_json).collect()))
    }
}

/// `map[string]string` (labels, annotations, data) and `map[string][]byte`
/// (binaryData, base64 in JSON).
impl<T: Wire> Field for BTreeMap<String, T> {
    fn read(value: Option<&Value>, cx: &mut Cx) -> Result<Self, WireError> {
        match value {
            None | Some(Value::Null) => Ok(Self::new()),
            Some(value) => cx
                .object(value)?
                .iter()
                .map(|(k, v)| Ok((k.clone(), cx.within(k, |cx| T::from_json(v, cx))?)))
                .collect(),
        }
    }

    fn write(&self, _: Option<bool>) -> Option<Value> {
        (!self.is_empty())
            .then(|| Value::Object(self.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()))
    }
}

impl Wire for String {
    const OMIT_ZERO: bool = true;

    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        value
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| cx.mismatch("string", value))
    }

    fn to_json(&self) -> Value {
        Value::from(self.as_str())
    }

    fn is_zero(&self) -> bool {
        self.is_empty()
    }
}

impl Wire for bool {
    fn is_zero(&self) -> bool {
        !*self
    }

    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        value.as_bool().ok_or_else(|| cx.mismatch("bool", value))
    }

    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl Wire for i64 {
    fn is_zero(&self) -> bool {
        *self == 0
    }

    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        value.as_i64().ok_or_else(|| cx.mismatch("int64", value))
    }

    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

impl Wire for i32 {
    fn is_zero(&self) -> bool {
        *self == 0
    }

    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        value
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| cx.mismatch("int32", value))
    }

    fn to_json(&self) -> Value {
        Value::from(*self)
    }
}

/// `[]byte`: base64 in JSON.
impl Wire for Vec<u8> {
    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        let text = value.as_str().ok_or_else(|| cx.mismatch("[]byte", value))?;
        STANDARD
            .decode(text)
            .map_err(|e| cx.error(format!("illegal base64 data: {e}")))
    }

    fn to_json(&self) -> Value {
        Value::from(STANDARD.encode(self))
    }
}

/// Reads an RFC 3339 time into seconds and nanoseconds since the epoch.
fn read_time(value: &Value, cx: &Cx) -> Result<(i64, i32), WireError> {
    let text = value.as_str().ok_or_else(|| cx.mismatch("Time", value))?;
    let ts: jiff::Timestamp = text
        .parse()
        .map_err(|e| cx.error(format!("parsing time {text:?}: {e}")))?;
    Ok((ts.as_second(), ts.subsec_nanosecond()))
}

/// Writes a time as the apiserver does: UTC, with `micros` digits of
/// fractions (0 or 6).
fn write_time(seconds: Option<i64>, nanos: Option<i32>, micros: bool) -> Value {
    let ts = jiff::Timestamp::new(seconds.unwrap_or(0), nanos.unwrap_or(0))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let base = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    Value::from(if micros {
        format!("{base}.{:06}Z", ts.subsec_microsecond())
    } else {
        format!("{base}Z")
    })
}

/// `metav1.Time`: seconds precision in JSON.
impl Wire for meta::Time {
    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        let (seconds, _) = read_time(value, cx)?;
        Ok(Self {
            seconds: Some(seconds),
            nanos: Some(0),
        })
    }

    fn to_json(&self) -> Value {
        write_time(self.seconds, None, false)
    }

    fn is_zero(&self) -> bool {
        self.seconds.unwrap_or(0) == 0
    }
}

/// `metav1.MicroTime`: microseconds in JSON, as leader election writes
/// `renewTime`.
impl Wire for meta::MicroTime {
    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        let (seconds, nanos) = read_time(value, cx)?;
        Ok(Self {
            seconds: Some(seconds),
            nanos: Some(nanos / 1000 * 1000),
        })
    }

    fn to_json(&self) -> Value {
        write_time(self.seconds, self.nanos, true)
    }

    fn is_zero(&self) -> bool {
        self.seconds.unwrap_or(0) == 0 && self.nanos.unwrap_or(0) == 0
    }
}

/// `FieldsV1` is a JSON object in JSON, and that object's bytes in protobuf.
impl Wire for meta::FieldsV1 {
    fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
        cx.object(value)?;
        Ok(Self {
            raw: Some(value.to_string().into_bytes()),
        })
    }

    fn to_json(&self) -> Value {
        self.raw
            .as_deref()
            .and_then(|raw| serde_json::from_slice(raw).ok())
            .unwrap_or_else(|| Value::Object(Map::new()))
    }
}

/// Maps a message's fields to their JSON names. Every field must be listed:
/// the struct literal does not compile otherwise.
///
/// Go writes a pointer field's zero value (`leaseTransitions: 0`,
/// `holderIdentity: ""`) and leaves out an `omitempty` field's. Protobuf
/// cannot tell them apart, so the mapping says which is which: a string
/// field is `omitempty` unless marked `pointer`, and any other field is a
/// pointer unless marked `omitempty`.
macro_rules! wire {
    (@omit) => { None };
    (@omit omitempty) => { Some(true) };
    (@omit pointer) => { Some(false) };
    ($($ty:ty { $($field:ident: $json:literal $($omit:ident)?),* $(,)? })*) => {$(
        impl Wire for $ty {
            fn from_json(value: &Value, cx: &mut Cx) -> Result<Self, WireError> {
                let map = cx.object(value)?;
                cx.note_unknown(map, &[$($json),*]);
                Ok(Self {
                    $($field: cx.within($json, |cx| Field::read(map.get($json), cx))?,)*
                })
            }

            fn to_json(&self) -> Value {
                #[allow(unused_mut)]
                let mut map = Map::new();
                $(if let Some(value) = Field::write(&self.$field, wire!(@omit $($omit)?)) {
                    map.insert($json.to_owned(), value);
                })*
                Value::Object(map)
            }
        }
    )*};
}

wire! {
    meta::ObjectMeta {
        name: "name",
        generate_name: "generateName",
        namespace: "namespace",
        self_link: "selfLink",
        uid: "uid",
        resource_version: "resourceVersion",
        generation: "generation" omitempty,
        creation_timestamp: "creationTimestamp" omitempty,
        deletion_timestamp: "deletionTimestamp",
        deletion_grace_period_seconds: "deletionGracePeriodSeconds",
        labels: "labels",
        annotations: "annotations",
        owner_references: "ownerReferences",
        finalizers: "finalizers",
        managed_fields: "managedFields",
    }
    meta::OwnerReference {
        api_version: "apiVersion" pointer,
        kind: "kind" pointer,
        name: "name" pointer,
        uid: "uid" pointer,
        controller: "controller",
        block_owner_deletion: "blockOwnerDeletion",
    }
    meta::ManagedFieldsEntry {
        manager: "manager",
        operation: "operation",
        api_version: "apiVersion",
        time: "time",
        fields_type: "fieldsType",
        fields_v1: "fieldsV1",
        subresource: "subresource",
    }
    meta::ListMeta {
        self_link: "selfLink",
        resource_version: "resourceVersion",
        r#continue: "continue",
        remaining_item_count: "remainingItemCount",
    }
    meta::Status {
        metadata: "metadata",
        status: "status",
        message: "message",
        reason: "reason",
        details: "details",
        code: "code" omitempty,
    }
    meta::StatusDetails {
        name: "name",
        group: "group",
        kind: "kind",
        uid: "uid",
        causes: "causes",
        retry_after_seconds: "retryAfterSeconds" omitempty,
    }
    meta::StatusCause {
        reason: "reason",
        message: "message",
        field: "field",
    }
    meta::DeleteOptions {
        grace_period_seconds: "gracePeriodSeconds",
        preconditions: "preconditions",
        orphan_dependents: "orphanDependents",
        propagation_policy: "propagationPolicy" pointer,
        dry_run: "dryRun",
        ignore_store_read_error_with_cluster_breaking_potential:
            "ignoreStoreReadErrorWithClusterBreakingPotential",
    }
    meta::Preconditions {
        uid: "uid",
        resource_version: "resourceVersion",
    }
    core::ConfigMap {
        metadata: "metadata",
        immutable: "immutable",
        data: "data",
        binary_data: "binaryData",
    }
    core::Namespace {
        metadata: "metadata",
        spec: "spec",
        status: "status",
    }
    core::NamespaceSpec {
        finalizers: "finalizers",
    }
    core::NamespaceStatus {
        phase: "phase",
        conditions: "conditions",
    }
    core::NamespaceCondition {
        r#type: "type",
        status: "status",
        last_transition_time: "lastTransitionTime" omitempty,
        reason: "reason",
        message: "message",
    }
    core::ObjectReference {
        kind: "kind",
        namespace: "namespace",
        name: "name",
        uid: "uid",
        api_version: "apiVersion",
        resource_version: "resourceVersion",
        field_path: "fieldPath",
    }
    core::EventSource {
        component: "component",
        host: "host",
    }
    core::EventSeries {
        count: "count" omitempty,
        last_observed_time: "lastObservedTime" omitempty,
    }
    core::Event {
        metadata: "metadata",
        involved_object: "involvedObject",
        reason: "reason",
        message: "message",
        source: "source",
        first_timestamp: "firstTimestamp" omitempty,
        last_timestamp: "lastTimestamp" omitempty,
        count: "count" omitempty,
        r#type: "type",
        event_time: "eventTime" omitempty,
        series: "series",
        action: "action",
        related: "related",
        reporting_component: "reportingComponent",
        reporting_instance: "reportingInstance",
    }
    events::EventSeries {
        count: "count",
        last_observed_time: "lastObservedTime",
    }
    events::Event {
        metadata: "metadata",
        event_time: "eventTime" omitempty,
        series: "series",
        reporting_controller: "reportingController",
        reporting_instance: "reportingInstance",
        action: "action",
        reason: "reason",
        regarding: "regarding",
        related: "related",
        note: "note",
        r#type: "type",
        deprecated_source: "deprecatedSource",
        deprecated_first_timestamp: "deprecatedFirstTimestamp" omitempty,
        deprecated_last_timestamp: "deprecatedLastTimestamp" omitempty,
        deprecated_count: "deprecatedCount" omitempty,
    }
    coordination::Lease {
        metadata: "metadata",
        spec: "spec",
    }
    coordination::LeaseSpec {
        holder_identity: "holderIdentity" pointer,
        lease_duration_seconds: "leaseDurationSeconds",
        acquire_time: "acquireTime",
        renew_time: "renewTime",
        lease_transitions: "leaseTransitions",
        strategy: "strategy" pointer,
        preferred_holder: "preferredHolder" pointer,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip<T: Wire>(value: &Value) -> (Value, Vec<String>) {
        let mut cx = Cx::default();
        let message = T::from_json(value, &mut cx).expect("fits");
        (message.to_json(), cx.unknown)
    }

    #[test]
    fn a_lease_keeps_microsecond_times_and_drops_unknown_fields() {
        let lease = json!({
            "metadata": {"name": "l", "namespace": "default", "labels": {"a": "b"}},
            "spec": {
                "holderIdentity": "pod-a",
                "leaseDurationSeconds": 15,
                "acquireTime": "2026-11-30T10:00:00.123456789Z",
                "renewTime": "2026-11-30T12:00:00+02:00",
                "leaseTransitions": 3,
                "bogus": 1,
            },
        });
        let (json, unknown) = round_trip::<coordination::Lease>(&lease);
        assert_eq!(unknown, ["spec.bogus"]);
        let released = json!({"spec": {"holderIdentity": "", "leaseTransitions": 0}});
        assert_eq!(
            round_trip::<coordination::Lease>(&released).0,
            released,
            "a released Lease keeps its empty holder, as Go writes the pointer"
        );
        let empty = json!({"metadata": {"name": "x", "generateName": "", "generation": 0}});
        assert_eq!(
            round_trip::<coordination::Lease>(&empty).0,
            json!({"metadata": {"name": "x"}}),
            "omitempty fields leave their zero out"
        );
        assert_eq!(json["spec"]["acquireTime"], "2026-11-30T10:00:00.123456Z");
        assert_eq!(json["spec"]["renewTime"], "2026-11-30T10:00:00.000000Z");
        assert_eq!(json["spec"]["leaseDurationSeconds"], 15);
        assert!(json["spec"].get("bogus").is_none());
    }

    #[test]
    fn a_wrong_type_names_its_path() {
        let bad = json!({"spec": {"leaseDurationSeconds": "15"}});
        let err = coordination::Lease::from_json(&bad, &mut Cx::default()).expect_err("string");
        assert_eq!(err.path, "spec.leaseDurationSeconds");
        assert!(err.problem.contains("string"), "{}", err.problem);
        let big = json!({"spec": {"leaseDurationSeconds": 1_i64 << 40}});
        assert!(coordination::Lease::from_json(&big, &mut Cx::default()).is_err());
    }

    #[test]
    fn binary_data_is_base64_and_times_have_seconds_precision() {
        let cm = json!({
            "metadata": {"name": "c", "creationTimestamp": "2026-01-02T03:04:05.9Z"},
            "binaryData": {"b": "AAEC"},
        });
        let mut cx = Cx::default();
        let message = core::ConfigMap::from_json(&cm, &mut cx).expect("fits");
        assert_eq!(message.binary_data["b"], [0, 1, 2]);
        let json = message.to_json();
        assert_eq!(
            json["metadata"]["creationTimestamp"],
            "2026-01-02T03:04:05Z"
        );
        assert_eq!(json["binaryData"]["b"], "AAEC");
        assert!(json.get("data").is_none(), "empty maps are left out");
    }

    #[test]
    fn fields_v1_is_an_object_in_json_and_bytes_in_protobuf() {
        let entry =
            json!({"manager": "m", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}});
        let mut cx = Cx::default();
        let message = meta::ManagedFieldsEntry::from_json(&entry, &mut cx).expect("fits");
        assert_eq!(
            message.fields_v1.as_ref().and_then(|f| f.raw.as_deref()),
            Some(br#"{"f:data":{"f:a":{}}}"#.as_slice())
        );
        assert_eq!(message.to_json(), entry);
    }
}
