//! The resource types the simulated apiserver serves, and their discovery.

use serde_json::{Value, json};

/// A resource type the simulated apiserver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `v1` `Namespace`, cluster-scoped. Read-only: the kit seeds them.
    Namespace,
    /// `v1` `ConfigMap`.
    ConfigMap,
    /// `v1` `Event`, which client-go's event recorder writes.
    CoreEvent,
    /// `events.k8s.io/v1` `Event`, which newer recorders write. The kit
    /// stores it apart from [`Resource::CoreEvent`]; the apiserver serves
    /// both from one store.
    Event,
    /// `coordination.k8s.io/v1` `Lease`.
    Lease,
}

impl Resource {
    /// Every resource, for discovery.
    pub const ALL: [Self; 5] = [
        Self::Namespace,
        Self::ConfigMap,
        Self::CoreEvent,
        Self::Event,
        Self::Lease,
    ];

    /// The API group; empty for the core group.
    #[must_use]
    pub const fn group(self) -> &'static str {
        match self {
            Self::Namespace | Self::ConfigMap | Self::CoreEvent => "",
            Self::Event => "events.k8s.io",
            Self::Lease => "coordination.k8s.io",
        }
    }

    /// The `apiVersion` of objects of this resource.
    #[must_use]
    pub const fn api_version(self) -> &'static str {
        match self {
            Self::Namespace | Self::ConfigMap | Self::CoreEvent => "v1",
            Self::Event => "events.k8s.io/v1",
            Self::Lease => "coordination.k8s.io/v1",
        }
    }

    /// The `kind` of objects of this resource.
    #[must_use]
    pub const fn kind(self) -> &'static str {
        match self {
            Self::Namespace => "Namespace",
            Self::ConfigMap => "ConfigMap",
            Self::CoreEvent | Self::Event => "Event",
            Self::Lease => "Lease",
        }
    }

    /// Whether an update may leave out `metadata.resourceVersion`: the
    /// real registry's `AllowUnconditionalUpdate`, false for Leases.
    pub(crate) const fn allows_unconditional_update(self) -> bool {
        !matches!(self, Self::Lease)
    }

    /// The plural name used in paths.
    #[must_use]
    pub const fn plural(self) -> &'static str {
        match self {
            Self::Namespace => "namespaces",
            Self::ConfigMap => "configmaps",
            Self::CoreEvent | Self::Event => "events",
            Self::Lease => "leases",
        }
    }

    /// The plural with its group, as errors name it: `leases.coordination.k8s.io`.
    #[must_use]
    pub fn qualified_plural(self) -> String {
        if self.group().is_empty() {
            self.plural().to_owned()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// Whether objects live in a namespace.
    #[must_use]
    pub const fn namespaced(self) -> bool {
        !matches!(self, Self::Namespace)
    }

    /// Whether the API accepts create, update, patch and delete.
    #[must_use]
    pub const fn writable(self) -> bool {
        self.namespaced()
    }

    pub(crate) fn from_path(group: &str, plural: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|r| r.group() == group && r.plural() == plural)
    }

    fn short_names(self) -> &'static [&'static str] {
        match self {
            Self::Namespace => &["ns"],
            Self::ConfigMap => &["cm"],
            Self::CoreEvent | Self::Event => &["ev"],
            Self::Lease => &[],
        }
    }

    fn verbs(self) -> &'static [&'static str] {
        if self.writable() {
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ]
        } else {
            &["get", "list", "watch"]
        }
    }
}

/// The body of `/api`.
pub(crate) fn api_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
    })
}

/// The named groups, in discovery order.
fn groups() -> Vec<&'static str> {
    let mut groups: Vec<&str> = Resource::ALL
        .into_iter()
        .map(Resource::group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    groups
}

fn group_body(group: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({
        "name": group,
        "versions": [version],
        "preferredVersion": version,
    })
}

/// The body of `/apis`.
pub(crate) fn api_group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(group_body).collect();
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups,
    })
}

/// The body of `/apis/<group>`, if the group exists.
pub(crate) fn api_group(group: &str) -> Option<Value> {
    groups().contains(&group).then(|| {
        let mut body = group_body(group);
        body["kind"] = Value::from("APIGroup");
        body["apiVersion"] = Value::from("v1");
        body
    })
}

/// The `APIResourceList` of a group version, if it exists.
pub(crate) fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    if version != "v1" {
        return None;
    }
    let resources: Vec<Value> = Resource::ALL
        .into_iter()
        .filter(|r| r.group() == group)
        .map(|r| {
            json!({
                "name": r.plural(),
                "singularName": r.kind().to_lowercase(),
                "namespaced": r.namespaced(),
                "kind": r.kind(),
                "verbs": r.verbs(),
                "shortNames": r.short_names(),
            })
        })
        .collect();
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// The path of a group version in `/openapi/v3`: `api/v1` or
/// `apis/<group>/v1`.
fn openapi_path(group: &str) -> String {
    if group.is_empty() {
        "api/v1".to_owned()
    } else {
        format!("apis/{group}/v1")
    }
}

/// The body of `/openapi/v3`: where each group version's document is.
pub(crate) fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    for resource in Resource::ALL {
        let path = openapi_path(resource.group());
        let url = format!("/openapi/v3/{path}?hash=tether-testkit");
        paths.insert(path, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of a group version (`api/v1` or
/// `apis/<group>/v1`), if it exists.
///
/// It holds only what clients look for: each writable resource's PATCH
/// operation with its `x-kubernetes-group-version-kind` and its
/// `fieldValidation` parameter. kubectl reads that to decide that the server
/// validates fields itself, and then skips client-side schema validation.
pub(crate) fn openapi_v3_group_version(path: &str) -> Option<Value> {
    let resources: Vec<Resource> = Resource::ALL
        .into_iter()
        .filter(|r| openapi_path(r.group()) == path)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for resource in resources.into_iter().filter(|r| r.writable()) {
        let url = format!(
            "/{path}/namespaces/{{namespace}}/{}/{{name}}",
            resource.plural()
        );
        paths.insert(
            url,
            json!({"patch": {
                "x-kubernetes-group-version-kind": {"group": resource.group(), "version": "v1", "kind": resource.kind()},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}},
            }}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0-tether-testkit"},
        "paths": paths,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_to_resources() {
        assert_eq!(
            Resource::from_path("", "configmaps"),
            Some(Resource::ConfigMap)
        );
        assert_eq!(
            Resource::from_path("coordination.k8s.io", "leases"),
            Some(Resource::Lease)
        );
        assert_eq!(Resource::from_path("", "leases"), None);
    }

    #[test]
    fn the_core_group_lists_namespaces_and_configmaps() {
        let list = api_resource_list("", "v1").expect("core v1 exists");
        let names: Vec<_> = list["resources"]
            .as_array()
            .expect("resources is an array")
            .iter()
            .map(|r| r["name"].as_str().expect("name is a string"))
            .collect();
        assert_eq!(names, ["namespaces", "configmaps", "events"]);
        let groups = api_group_list();
        assert_eq!(groups["groups"].as_array().map(Vec::len), Some(2));
        assert!(api_resource_list("", "v2").is_none());
    }
}
