//! The write verbs: create (POST), update (PUT), patch (PATCH, server-side
//! apply included) and delete, with `dryRun`, `fieldManager`,
//! `fieldValidation` and preconditions as the apiserver takes them.

use std::collections::HashMap;

use bytes::Bytes;
use http::{HeaderMap, header};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::Resource;
use crate::managed;
use crate::patch::{self, PatchKind};
use crate::proto::{self, PROTOBUF};
use crate::status::ApiError;
use crate::store::{Change, Store};

/// The largest body a write may send: the apiserver's limit.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// The longest field manager name the apiserver takes.
const MAX_MANAGER: usize = 128;

/// A write's outcome: the status code, the object, and the warnings for the
/// `Warning` header.
pub(crate) struct Written {
    pub(crate) code: u16,
    pub(crate) object: Value,
    pub(crate) warnings: Vec<String>,
}

/// What every write verb needs from its request.
pub(crate) struct WriteRequest<'a> {
    store: &'a Store,
    resource: Resource,
    namespace: &'a str,
    params: &'a HashMap<String, String>,
    content_type: String,
    body: Bytes,
    dry_run: bool,
    manager: String,
}

impl<'a> WriteRequest<'a> {
    /// Reads the body and the options every write shares.
    ///
    /// # Errors
    ///
    /// `400` for a bad `dryRun` or `fieldManager`, or a body that cannot be
    /// read; `413` for a body over 3 MiB.
    pub(crate) async fn read(
        store: &'a Store,
        resource: Resource,
        namespace: &'a str,
        params: &'a HashMap<String, String>,
        req: http::Request<Incoming>,
    ) -> Result<Self, ApiError> {
        let dry_run = match params.get("dryRun").map(String::as_str) {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid dryRun value {other:?}: only \"All\" is supported"
                )));
            }
        };
        let manager = field_manager(params, req.headers())?;
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_owned();
        let body = http_body_util::Limited::new(req.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    ApiError::new(413, "RequestEntityTooLarge", "the request is too large")
                } else {
                    ApiError::bad_request(format!("reading the body failed: {e}"))
                }
            })?
            .to_bytes();
        Ok(Self {
            store,
            resource,
            namespace,
            params,
            content_type,
            body,
            dry_run,
            manager,
        })
    }

    /// Commits `decide`'s change to the object `name` addresses.
    fn commit(
        &self,
        name: &str,
        dry_run: bool,
        decide: impl FnOnce(Option<&Value>) -> Result<Change, ApiError>,
    ) -> Result<Value, ApiError> {
        self.store
            .commit(self.resource, self.namespace, name, dry_run, decide)
    }

    fn media_type(&self) -> &str {
        self.content_type.split(';').next().unwrap_or("").trim()
    }

    /// The body of a create or update, as JSON.
    fn object(&self) -> Result<Value, ApiError> {
        match self.media_type() {
            "application/json" | "" => serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}"))),
            "application/yaml" => yaml(&self.body),
            PROTOBUF => proto::decode_object(self.resource, &self.body),
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: \
                     application/json, application/yaml, application/vnd.kubernetes.protobuf (got {other})"
                ),
            )),
        }
    }

    /// Checks a body's type and fields; returns its canonical form and the
    /// warnings its unknown fields earn under `fieldValidation`.
    fn admit(&self, body: &Value) -> Result<(Value, Vec<String>), ApiError> {
        let resource = self.resource;
        for (field, want) in [
            ("apiVersion", resource.api_version()),
            ("kind", resource.kind()),
        ] {
            if let Some(got) = body[field].as_str().filter(|g| *g != want) {
                return Err(ApiError::bad_request(format!(
                    "the {field} of the body ({got}) does not match the expected {field} ({want})"
                )));
            }
        }
        let admitted = proto::admit(resource, body)?;
        let warnings: Vec<String> = admitted
            .unknown
            .iter()
            .map(|field| format!("unknown field \"{field}\""))
            .collect();
        match self.params.get("fieldValidation").map(String::as_str) {
            Some("Strict") if !warnings.is_empty() => Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                warnings.join(", ")
            ))),
            Some("Ignore") => Ok((admitted.object, Vec::new())),
            None | Some("" | "Warn" | "Strict") => Ok((admitted.object, warnings)),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation must be Ignore, Warn or Strict, not {other:?}"
            ))),
        }
    }

    /// POST: creates the object, `409 AlreadyExists` if the name is taken.
    pub(crate) fn create(&self) -> Result<Written, ApiError> {
        let (mut object, warnings) = self.admit(&self.object()?)?;
        let name = match object["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            Some(name) => name.to_owned(),
            None => match object["metadata"]["generateName"]
                .as_str()
                .filter(|n| !n.is_empty())
            {
                Some(prefix) => format!("{prefix}{}", random_suffix()),
                None => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                            self.resource.kind()
                        ),
                    ));
                }
            },
        };
        self.check_namespace(&object)?;
        let created = self.commit(&name, self.dry_run, |existing| {
            if existing.is_some() {
                return Err(ApiError::already_exists(self.resource, &name));
            }
            managed::record_update(self.resource, None, &mut object, &self.manager);
            Ok(Change::Put(object))
        })?;
        Ok(Written {
            code: 201,
            object: created,
            warnings,
        })
    }

    /// PUT: replaces the object; a stale `resourceVersion` is `409`.
    pub(crate) fn update(&self, name: &str) -> Result<Written, ApiError> {
        let (mut object, warnings) = self.admit(&self.object()?)?;
        self.check_namespace(&object)?;
        if object["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n != name)
        {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        if !self.resource.allows_unconditional_update()
            && object["metadata"]["resourceVersion"]
                .as_str()
                .is_none_or(str::is_empty)
        {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    self.resource.kind()
                ),
            )
            .about(self.resource, name)
            .with_cause("metadata.resourceVersion", "FieldValueInvalid", "Invalid value: 0x0: must be specified for an update"));
        }
        if !self.dry_run && self.store.loses_race(self.resource) {
            // Another writer got in first: it changed the object's
            // annotations (as `kubectl annotate` does), so its
            // resourceVersion is no longer the one this update carries.
            self.commit(name, false, |existing| {
                let mut current = existing
                    .ok_or_else(|| ApiError::not_found(self.resource, name))?
                    .clone();
                let touched = current["metadata"]["annotations"]["testkit.tether.dev/touched"]
                    .as_str()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                current["metadata"]["annotations"]["testkit.tether.dev/touched"] =
                    Value::from((touched + 1).to_string());
                Ok(Change::Put(current))
            })?;
        }
        let updated = self.commit(name, self.dry_run, |existing| {
            let current = existing.ok_or_else(|| ApiError::not_found(self.resource, name))?;
            managed::record_update(self.resource, Some(current), &mut object, &self.manager);
            Ok(Change::Put(object))
        })?;
        Ok(Written {
            code: 200,
            object: updated,
            warnings,
        })
    }

    /// PATCH: a JSON, merge or strategic patch of the object, or a
    /// server-side apply, which creates it if it is missing.
    pub(crate) fn patch(&self, name: &str) -> Result<Written, ApiError> {
        let kind = PatchKind::from_content_type(&self.content_type)?;
        let force = match self.params.get("force").map(String::as_str) {
            None | Some("" | "false") => false,
            Some("true") if kind == PatchKind::Apply => true,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "force may only be true, and only for apply patches",
                ));
            }
        };
        if kind == PatchKind::Apply {
            return self.apply(name, force);
        }
        let mut warnings = Vec::new();
        let patched = self.commit(name, self.dry_run, |existing| {
            let current = existing.ok_or_else(|| ApiError::not_found(self.resource, name))?;
            let patched = patch::patch(kind, current, &self.body)?;
            for field in ["name", "namespace", "uid"] {
                if patched["metadata"][field] != current["metadata"][field] {
                    return Err(immutable(self.resource, name, field));
                }
            }
            let (mut object, found) = self.admit(&patched)?;
            warnings = found;
            managed::record_update(self.resource, Some(current), &mut object, &self.manager);
            Ok(Change::Put(object))
        })?;
        Ok(Written {
            code: 200,
            object: patched,
            warnings,
        })
    }

    fn apply(&self, name: &str, force: bool) -> Result<Written, ApiError> {
        if !self.params.contains_key("fieldManager") {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        let mut applied = yaml(&self.body)?;
        for field in ["apiVersion", "kind"] {
            if applied[field].as_str().is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(format!(
                    "invalid object type: {field} is required for an apply patch"
                )));
            }
        }
        match applied["metadata"]["name"].as_str() {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            Some(_) => {}
            None => applied["metadata"]["name"] = Value::from(name),
        }
        let (applied, warnings) = self.admit(&applied)?;
        self.check_namespace(&applied)?;
        let mut created = false;
        let object = self.commit(name, self.dry_run, |existing| {
            created = existing.is_none();
            let merged = managed::apply(self.resource, existing, &applied, &self.manager, force)?;
            // Leaving fields out can leave empty maps: store the canonical
            // form.
            Ok(Change::Put(proto::admit(self.resource, &merged)?.object))
        })?;
        Ok(Written {
            code: if created { 201 } else { 200 },
            object,
            warnings,
        })
    }

    /// DELETE, with `DeleteOptions` (JSON or protobuf) in the body: its
    /// `dryRun` and `preconditions` are honoured.
    pub(crate) fn delete(&self, name: &str) -> Result<Written, ApiError> {
        let options = if self.body.is_empty() {
            json!({})
        } else if self.media_type() == PROTOBUF {
            proto::decode_delete_options(&self.body)?
        } else {
            serde_json::from_slice(&self.body)
                .map_err(|e| ApiError::bad_request(format!("the body is not DeleteOptions: {e}")))?
        };
        let dry_run = self.dry_run
            || options["dryRun"]
                .as_array()
                .is_some_and(|d| d.iter().any(|v| v == "All"));
        let deleted = self.commit(name, dry_run, |existing| {
            let current = existing.ok_or_else(|| ApiError::not_found(self.resource, name))?;
            for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
                let want = options["preconditions"][field].as_str();
                let have = current["metadata"][field].as_str().unwrap_or("");
                if let Some(want) = want.filter(|w| *w != have) {
                    // The registry names the kind here, not the resource.
                    let mut error = ApiError::conflict(
                        self.resource,
                        name,
                        &format!("Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}"),
                    );
                    if let Some(details) = error.details.as_mut() {
                        details["kind"] = Value::from(self.resource.kind());
                    }
                    return Err(error);
                }
            }
            Ok(Change::Delete)
        })?;
        let mut details = json!({"name": name, "kind": self.resource.plural(), "uid": deleted["metadata"]["uid"]});
        if !self.resource.group().is_empty() {
            details["group"] = Value::from(self.resource.group());
        }
        Ok(Written {
            code: 200,
            object: json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": details,
            }),
            warnings: Vec::new(),
        })
    }

    fn check_namespace(&self, object: &Value) -> Result<(), ApiError> {
        match object["metadata"]["namespace"].as_str() {
            Some(ns) if !ns.is_empty() && ns != self.namespace => Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
            _ => Ok(()),
        }
    }
}

fn immutable(resource: Resource, name: &str, field: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!(
            "{} \"{name}\" is invalid: metadata.{field}: Invalid value: field is immutable",
            resource.kind()
        ),
    )
    .about(resource, name)
}

fn yaml(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the body is not UTF-8 YAML"))?;
    serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

/// The manager of a write: `fieldManager`, or the `User-Agent` up to its
/// first `/`, as the apiserver derives it.
fn field_manager(
    params: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    let manager = match params.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(manager) => manager.clone(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or("unknown")
            .chars()
            .take(MAX_MANAGER)
            .collect(),
    };
    if manager.len() > MAX_MANAGER || manager.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "fieldManager must be at most {MAX_MANAGER} printable characters"
        )));
    }
    Ok(manager)
}

/// Five characters for `generateName`, from the apiserver's alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}
