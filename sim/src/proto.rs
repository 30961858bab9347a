//! The wire formats: content negotiation, Kubernetes' protobuf envelope, and
//! the JSON and protobuf forms of objects, lists, `Status` and watch events.
//!
//! The protobuf format is the apiserver's: a `runtime.Unknown` whose
//! `typeMeta` names the kind and whose `raw` holds the message, after the
//! four-byte magic `k8s\0`. A watch stream is not wrapped: each frame is a
//! four-byte big-endian length and a bare `WatchEvent`, whose `object.raw`
//! is an enveloped object.

use bytes::Bytes;
use k8s_pb::api::coordination::v1 as coordination;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::events::v1 as events;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use prost::Message;
use serde_json::{Value, json};

use crate::Resource;
use crate::status::ApiError;
use crate::wire::{Cx, Wire, WireError};

/// The protobuf media type.
pub(crate) const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What every enveloped protobuf body starts with.
const MAGIC: &[u8; 4] = b"k8s\0";

/// The format of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Json,
    Protobuf,
}

impl Format {
    /// The first format of an `Accept` header the kit serves, or `None` if
    /// it serves none (a 406). Entries that ask for a conversion (`as=Table`,
    /// `as=PartialObjectMetadata`) are passed over, as an apiserver that
    /// lacks them would; clients list plain JSON after them.
    pub(crate) fn accepted(accept: Option<&str>) -> Option<Self> {
        let accept = accept.map(str::trim).filter(|a| !a.is_empty());
        let Some(accept) = accept else {
            return Some(Self::Json);
        };
        accept.split(',').find_map(|entry| {
            let mut parts = entry.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            if parts.any(|p| p.starts_with("as=")) {
                return None;
            }
            match media.as_str() {
                "application/json" | "application/*" | "*/*" => Some(Self::Json),
                PROTOBUF => Some(Self::Protobuf),
                _ => None,
            }
        })
    }

    pub(crate) const fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Protobuf => PROTOBUF,
        }
    }

    pub(crate) const fn watch_content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Protobuf => "application/vnd.kubernetes.protobuf;stream=watch",
        }
    }
}

/// A served kind's message, and its list's.
trait Kind: Wire + Message + Default {
    type List: Message;
    fn list(metadata: meta::ListMeta, items: Vec<Self>) -> Self::List;
}

macro_rules! kinds {
    ($($ty:ty => $list:ident),* $(,)?) => {$(
        impl Kind for $ty {
            type List = $list;
            fn list(metadata: meta::ListMeta, items: Vec<Self>) -> $list {
                $list { metadata: Some(metadata), items }
            }
        }
    )*};
}

use coordination::LeaseList;
use core::{ConfigMapList, EventList as CoreEventList, NamespaceList};
use events::EventList;

kinds! {
    core::Namespace => NamespaceList,
    core::ConfigMap => ConfigMapList,
    core::Event => CoreEventList,
    events::Event => EventList,
    coordination::Lease => LeaseList,
}

/// Calls `$f::<Message>($args)` with the message type of `$resource`.
macro_rules! by_kind {
    ($resource:expr, $f:ident($($arg:expr),*)) => {
        match $resource {
            Resource::Namespace => $f::<core::Namespace>($($arg),*),
            Resource::ConfigMap => $f::<core::ConfigMap>($($arg),*),
            Resource::CoreEvent => $f::<core::Event>($($arg),*),
            Resource::Event => $f::<events::Event>($($arg),*),
            Resource::Lease => $f::<coordination::Lease>($($arg),*),
        }
    };
}

/// An object that fits its kind, in canonical JSON, and the unknown fields
/// that were dropped on the way.
pub(crate) struct Admitted {
    pub(crate) object: Value,
    pub(crate) unknown: Vec<String>,
}

fn with_type_meta(resource: Resource, mut object: Value) -> Value {
    object["apiVersion"] = Value::from(resource.api_version());
    object["kind"] = Value::from(resource.kind());
    object
}

/// The message of a top-level object, whose `apiVersion` and `kind` are the
/// envelope's, not the message's.
fn message<T: Wire>(object: &Value, cx: &mut Cx) -> Result<T, WireError> {
    let message = T::from_json(object, cx)?;
    cx.unknown
        .retain(|field| field != "apiVersion" && field != "kind");
    Ok(message)
}

fn admit_as<T: Wire>(resource: Resource, object: &Value) -> Result<Admitted, WireError> {
    let mut cx = Cx::default();
    let canonical = message::<T>(object, &mut cx)?.to_json();
    Ok(Admitted {
        object: with_type_meta(resource, canonical),
        unknown: cx.unknown,
    })
}

/// Passes a JSON object through its kind's message: the canonical form, or
/// a `400` naming the field that does not fit.
pub(crate) fn admit(resource: Resource, object: &Value) -> Result<Admitted, ApiError> {
    by_kind!(resource, admit_as(resource, object)).map_err(|e| {
        let kind = resource.kind();
        ApiError::bad_request(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: {}: {}",
            e.path, e.problem
        ))
    })
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(MAGIC);
    unknown.encode(&mut out).expect("a Vec grows as needed");
    out
}

fn internal(err: &WireError) -> ApiError {
    ApiError::new(
        500,
        "InternalError",
        format!("encoding as protobuf: {}: {}", err.path, err.problem),
    )
}

fn encode_object_as<T: Kind>(resource: Resource, object: &Value) -> Result<Vec<u8>, ApiError> {
    let message = message::<T>(object, &mut Cx::default()).map_err(|e| internal(&e))?;
    Ok(envelope(
        resource.api_version(),
        resource.kind(),
        message.encode_to_vec(),
    ))
}

fn encode_list_as<T: Kind>(resource: Resource, list: &Value) -> Result<Vec<u8>, ApiError> {
    let mut cx = Cx::default();
    let metadata =
        meta::ListMeta::from_json(&list["metadata"], &mut cx).map_err(|e| internal(&e))?;
    let items = list["items"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|item| message::<T>(item, &mut cx))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| internal(&e))?;
    Ok(envelope(
        resource.api_version(),
        &format!("{}List", resource.kind()),
        T::list(metadata, items).encode_to_vec(),
    ))
}

/// What a response carries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// An object of a served kind.
    Object(Resource, &'a Value),
    /// A list of a served kind, in its JSON form.
    List(Resource, &'a Value),
    /// A `Status`.
    Status(&'a Value),
}

impl Payload<'_> {
    /// The payload's bytes in `format`.
    pub(crate) fn encode(self, format: Format) -> Result<Vec<u8>, ApiError> {
        match (format, self) {
            (Format::Json, Self::Object(_, v) | Self::List(_, v) | Self::Status(v)) => {
                Ok(v.to_string().into_bytes())
            }
            (Format::Protobuf, Self::Object(resource, object)) => {
                by_kind!(resource, encode_object_as(resource, object))
            }
            (Format::Protobuf, Self::List(resource, list)) => {
                by_kind!(resource, encode_list_as(resource, list))
            }
            (Format::Protobuf, Self::Status(status)) => {
                let message = message::<meta::Status>(status, &mut Cx::default())
                    .map_err(|e| internal(&e))?;
                Ok(envelope("v1", "Status", message.encode_to_vec()))
            }
        }
    }
}

/// One watch event, framed for its stream: a JSON line, or a
/// length-prefixed `WatchEvent`.
pub(crate) fn watch_event(
    format: Format,
    kind: &str,
    payload: Payload<'_>,
) -> Result<Bytes, ApiError> {
    match (format, payload) {
        (
            Format::Json,
            Payload::Object(_, object) | Payload::List(_, object) | Payload::Status(object),
        ) => {
            let mut line = json!({"type": kind, "object": object}).to_string();
            line.push('\n');
            Ok(Bytes::from(line))
        }
        (Format::Protobuf, payload) => {
            let event = meta::WatchEvent {
                r#type: Some(kind.to_owned()),
                object: Some(RawExtension {
                    raw: Some(payload.encode(Format::Protobuf)?),
                }),
            };
            let len = u32::try_from(event.encoded_len())
                .map_err(|_| ApiError::new(500, "InternalError", "a watch event over 4 GiB"))?;
            let mut frame = Vec::with_capacity(4 + event.encoded_len());
            frame.extend_from_slice(&len.to_be_bytes());
            event.encode(&mut frame).expect("a Vec grows as needed");
            Ok(Bytes::from(frame))
        }
    }
}

fn unwrap_envelope(body: &[u8]) -> Result<Unknown, ApiError> {
    let raw = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request(
            "the body of the request is not a Kubernetes protobuf object: no magic prefix",
        )
    })?;
    Unknown::decode(raw).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request is not a runtime.Unknown: {e}"
        ))
    })
}

fn decode_object_as<T: Kind>(resource: Resource, raw: &[u8]) -> Result<Value, ApiError> {
    let message = T::decode(raw).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"v1\" cannot be handled as a {}: {e}",
            resource.kind(),
            resource.kind()
        ))
    })?;
    Ok(with_type_meta(resource, message.to_json()))
}

/// Decodes an enveloped protobuf object of `resource`'s kind into JSON.
pub(crate) fn decode_object(resource: Resource, body: &[u8]) -> Result<Value, ApiError> {
    let unknown = unwrap_envelope(body)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let (api_version, kind) = (
        type_meta.api_version.unwrap_or_default(),
        type_meta.kind.unwrap_or_default(),
    );
    if kind != resource.kind() || api_version != resource.api_version() {
        return Err(ApiError::bad_request(format!(
            "the body is a {api_version}, Kind={kind}, not a {}, Kind={}",
            resource.api_version(),
            resource.kind()
        )));
    }
    by_kind!(
        resource,
        decode_object_as(resource, unknown.raw.as_deref().unwrap_or_default())
    )
}

/// Decodes enveloped protobuf `DeleteOptions` into JSON.
pub(crate) fn decode_delete_options(body: &[u8]) -> Result<Value, ApiError> {
    let unknown = unwrap_envelope(body)?;
    meta::DeleteOptions::decode(unknown.raw.as_deref().unwrap_or_default())
        .map(|options| options.to_json())
        .map_err(|e| ApiError::bad_request(format!("the body is not DeleteOptions: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_pick_the_first_served_format() {
        assert_eq!(Format::accepted(None), Some(Format::Json));
        assert_eq!(
            Format::accepted(Some(
                "application/vnd.kubernetes.protobuf, application/json"
            )),
            Some(Format::Protobuf)
        );
        assert_eq!(
            Format::accepted(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            )),
            Some(Format::Json)
        );
        assert_eq!(Format::accepted(Some("application/yaml")), None);
        assert_eq!(Format::accepted(Some("*/*")), Some(Format::Json));
    }

    #[test]
    fn an_object_round_trips_through_the_envelope() {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l", "namespace": "default", "resourceVersion": "7"},
            "spec": {"holderIdentity": "a", "renewTime": "2026-11-30T10:00:00.250000Z"},
        });
        let bytes = Payload::Object(Resource::Lease, &lease)
            .encode(Format::Protobuf)
            .expect("encodes");
        assert_eq!(&bytes[..4], b"k8s\0");
        assert_eq!(
            decode_object(Resource::Lease, &bytes).expect("decodes"),
            lease
        );
        let err = decode_object(Resource::ConfigMap, &bytes).expect_err("wrong kind");
        assert_eq!(err.code, 400);
    }

    #[test]
    fn a_watch_frame_is_a_length_and_a_bare_watch_event() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
        let frame = watch_event(
            Format::Protobuf,
            "ADDED",
            Payload::Object(Resource::ConfigMap, &cm),
        )
        .expect("encodes");
        let len = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        assert_eq!(len, frame.len() - 4);
        let event = meta::WatchEvent::decode(&frame[4..]).expect("a bare WatchEvent");
        assert_eq!(event.r#type.as_deref(), Some("ADDED"));
        let raw = event.object.and_then(|o| o.raw).expect("an object");
        assert_eq!(
            decode_object(Resource::ConfigMap, &raw).expect("enveloped"),
            cm
        );
    }
}
