//! API errors, rendered as `Status` objects the way the apiserver sends them.

use serde_json::{Value, json};

use crate::Resource;

/// An API error: an HTTP status with a `Status` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The `details` of the `Status`, if any.
    pub(crate) details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// Sets the `details`.
    #[must_use]
    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Names the object the error is about, as the apiserver does in
    /// `details`.
    #[must_use]
    pub(crate) fn about(self, resource: Resource, name: &str) -> Self {
        let mut details = json!({"name": name, "kind": resource.plural()});
        if !resource.group().is_empty() {
            details["group"] = Value::from(resource.group());
        }
        self.with_details(details)
    }

    /// Adds a cause to the `details`, as validation errors carry them.
    #[must_use]
    pub(crate) fn with_cause(mut self, field: &str, reason: &str, message: &str) -> Self {
        let details = self.details.get_or_insert_with(|| json!({}));
        let cause = json!({"reason": reason, "message": message, "field": field});
        match details["causes"].as_array_mut() {
            Some(causes) => causes.push(cause),
            None => details["causes"] = json!([cause]),
        }
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn not_found(resource: Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.qualified_plural()),
        )
        .about(resource, name)
    }

    pub(crate) fn already_exists(resource: Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.qualified_plural()),
        )
        .about(resource, name)
    }

    pub(crate) fn conflict(resource: Resource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.qualified_plural()
            ),
        )
        .about(resource, name)
    }

    pub(crate) fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// The `Status` object.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}
