//! API discovery (`/api`, `/apis`, `/api/v1`, `/apis/<group>[/<version>]`): what kubectl
//! reads first to map `kubectl get tj` to a resource. Served in the legacy
//! (unaggregated) form, which clients fall back to when a server answers plain JSON.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::resources::{self, ResourceType};

const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// The discovery document at `path`, or None when `path` is not a discovery path.
pub fn document(path: &str) -> Option<Value> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [],
        })),
        ["api", "v1"] => Some(resource_list("", "v1")),
        ["apis"] => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": groups().iter().map(|(group, version)| group_document(group, version)).collect::<Vec<_>>(),
        })),
        ["apis", group] => groups()
            .get(*group)
            .map(|version| group_document(group, version)),
        ["apis", group, version] if groups().get(*group) == Some(version) => {
            Some(resource_list(group, version))
        }
        _ => None,
    }
}

/// Every named group with its one served version.
fn groups() -> BTreeMap<&'static str, &'static str> {
    resources::all()
        .iter()
        .filter(|rt| !rt.group.is_empty())
        .map(|rt| (rt.group, rt.version))
        .collect()
}

fn group_document(group: &str, version: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [version],
        "preferredVersion": version,
    })
}

fn resource_list(group: &str, version: &str) -> Value {
    let served: Vec<&ResourceType> = resources::all()
        .iter()
        .filter(|rt| rt.group == group && rt.version == version)
        .collect();
    let mut entries = Vec::new();
    for rt in served {
        entries.push(json!({
            "name": rt.plural,
            "singularName": rt.kind.to_lowercase(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": VERBS,
            "shortNames": rt.short_names,
        }));
        if rt.status_subresource {
            entries.push(json!({
                "name": format!("{}/status", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if rt.name == resources::pods().name {
            entries.push(json!({
                "name": "pods/log",
                "singularName": "",
                "namespaced": true,
                "kind": "Pod",
                "verbs": ["get"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainyard_group_lists_its_kinds_with_short_names() {
        let groups = document("/apis").expect("served");
        assert!(
            groups["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|g| g["name"] == "trainyard.dev")
        );
        let list = document("/apis/trainyard.dev/v1").expect("served");
        let tj = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["name"] == "trainingjobs")
            .cloned()
            .expect("trainingjobs listed");
        assert_eq!(tj["kind"], "TrainingJob");
        assert_eq!(tj["shortNames"][0], "tj");
        assert!(document("/apis/trainyard.dev/v2").is_none());
        assert_eq!(document("/api").expect("served")["versions"][0], "v1");
        let core = document("/api/v1").expect("served");
        assert!(
            core["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["name"] == "pods/status")
        );
        assert!(
            core["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["name"] == "pods/log" && r["verbs"] == json!(["get"]))
        );
    }
}
