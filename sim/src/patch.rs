//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386),
//! strategic merge patch, and server-side apply, by `Content-Type`.

use serde_json::{Map, Value};

use crate::status::ApiError;

/// The kind of a PATCH, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub(crate) fn from_content_type(content_type: &str) -> Result<Self, ApiError> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Ok(Self::Json),
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" => Ok(Self::Apply),
            _ => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: \
                     application/json-patch+json, application/merge-patch+json, \
                     application/apply-patch+yaml, application/strategic-merge-patch+json \
                     (got {content_type})"
                ),
            )),
        }
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

fn invalid(err: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("the server rejected our request due to an error in our request: {err}"),
    )
}

/// Applies a JSON, merge or strategic patch `body` to `object`.
///
/// A strategic merge patch acts as a merge patch here, as it does for every
/// kind the kit serves (none has a list with a merge key that a client
/// patches), with its directives honoured: `$patch: replace` and
/// `$patch: delete` on a map, and the `$setElementOrder/`, `$retainKeys` and
/// `$deleteFromPrimitiveList/` keys dropped.
///
/// # Errors
///
/// `400` for a body that is not a patch, `422` for a patch that does not
/// apply (a failed `test`, a path that is not there).
pub(crate) fn patch(kind: PatchKind, object: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let mut object = object.clone();
    match kind {
        PatchKind::Json => {
            let ops: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut object, &ops).map_err(invalid)?;
        }
        PatchKind::Merge => {
            let patch = parse_json(body)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut object, &patch);
        }
        PatchKind::Strategic => {
            let patch = parse_json(body)?;
            let Value::Object(patch) = patch else {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            };
            strategic(&mut object, &patch)?;
        }
        PatchKind::Apply => unreachable!("apply is not a patch of the object; see managed::apply"),
    }
    Ok(object)
}

fn strategic(target: &mut Value, patch: &Map<String, Value>) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replacement = patch.clone();
            replacement.remove("$patch");
            *target = Value::Object(Map::new());
            return strategic(target, &replacement);
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other:?} in map"
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let map = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if key.starts_with('$') || key.starts_with("$setElementOrder/") {
            continue;
        }
        match value {
            Value::Null => {
                map.remove(key);
            }
            Value::Object(child) => {
                let slot = map.entry(key.clone()).or_insert(Value::Null);
                strategic(slot, child)?;
                if slot.is_null() {
                    map.remove(key);
                }
            }
            other => {
                map.insert(key.clone(), other.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_three_patch_kinds_change_what_they_name() {
        let cm =
            json!({"metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"k": "v", "x": "y"}});
        let merged =
            patch(PatchKind::Merge, &cm, br#"{"data":{"k":"w","x":null}}"#).expect("merge");
        assert_eq!(merged["data"], json!({"k": "w"}));

        let json = patch(
            PatchKind::Json,
            &cm,
            br#"[{"op":"test","path":"/data/k","value":"v"},{"op":"add","path":"/data/n","value":"1"}]"#,
        )
        .expect("json patch");
        assert_eq!(json["data"]["n"], "1");
        let failed = patch(
            PatchKind::Json,
            &cm,
            br#"[{"op":"test","path":"/data/k","value":"no"}]"#,
        )
        .expect_err("a failed test");
        assert_eq!(failed.code, 422);

        let strategic = patch(
            PatchKind::Strategic,
            &cm,
            br#"{"metadata":{"labels":{"$patch":"replace","b":"2"}},"$setElementOrder/x":[],"data":{"x":null}}"#,
        )
        .expect("strategic");
        assert_eq!(strategic["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(strategic["data"], json!({"k": "v"}));
    }

    #[test]
    fn a_body_that_is_not_a_patch_is_a_bad_request() {
        let cm = json!({"data": {}});
        assert_eq!(
            patch(PatchKind::Merge, &cm, b"[1]")
                .expect_err("array")
                .code,
            400
        );
        assert_eq!(
            patch(PatchKind::Json, &cm, b"{}").expect_err("object").code,
            400
        );
        assert_eq!(
            PatchKind::from_content_type("text/plain")
                .expect_err("415")
                .code,
            415
        );
    }
}
