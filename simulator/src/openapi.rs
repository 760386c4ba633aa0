//! OpenAPI v3 (`/openapi/v3`, `/openapi/v3/<api|apis/group>/<version>`): what kubectl
//! reads before `apply` (does the server validate fields itself?) and for `explain`.
//! Each served type has its PATCH operation, marked with its group-version-kind and
//! the `fieldValidation` parameter; Trainyard's kinds carry their CRD schema.

use kube::CustomResourceExt;
use serde_json::{Map, Value, json};
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

use crate::resources::{self, ResourceType};

const PREFIX: &str = "/openapi/v3";

/// The document at `path`, or None when `path` is not an OpenAPI v3 path this server has.
pub fn document(path: &str) -> Option<Value> {
    let rest = path.strip_prefix(PREFIX)?.trim_matches('/');
    if rest.is_empty() {
        return Some(root());
    }
    let served: Vec<&ResourceType> = resources::all()
        .iter()
        .filter(|rt| group_version_path(rt) == rest)
        .collect();
    (!served.is_empty()).then(|| group_version(&served))
}

/// `api/v1` or `apis/<group>/<version>`: the key of a group-version in the root document.
fn group_version_path(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        format!("api/{}", rt.version)
    } else {
        format!("apis/{}/{}", rt.group, rt.version)
    }
}

fn root() -> Value {
    let paths: Map<String, Value> = resources::all()
        .iter()
        .map(|rt| {
            let key = group_version_path(rt);
            let url = json!({ "serverRelativeURL": format!("{PREFIX}/{key}") });
            (key, url)
        })
        .collect();
    json!({ "paths": paths })
}

fn gvk(rt: &ResourceType) -> Value {
    json!({"group": rt.group, "version": rt.version, "kind": rt.kind})
}

fn query_parameter(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn group_version(served: &[&ResourceType]) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for rt in served {
        let prefix = group_version_path(rt);
        let path = if rt.namespaced {
            format!("/{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
        } else {
            format!("/{prefix}/{}/{{name}}", rt.plural)
        };
        let parameters =
            ["dryRun", "fieldManager", "fieldValidation", "force"].map(query_parameter);
        paths.insert(
            path,
            json!({
                "patch": {
                    "operationId": format!("patch{}", rt.kind),
                    "x-kubernetes-group-version-kind": gvk(rt),
                    "parameters": parameters,
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
        if let Some(mut schema) = crd_schema(rt) {
            schema["x-kubernetes-group-version-kind"] = json!([gvk(rt)]);
            schemas.insert(schema_name(rt), schema);
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (Trainyard simulator)", "version": "v1.36.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// `dev.trainyard.v1.TrainingJob`: the group reversed, as the apiserver names CRD schemas.
fn schema_name(rt: &ResourceType) -> String {
    let group: Vec<&str> = rt.group.split('.').rev().collect();
    format!("{}.{}.{}", group.join("."), rt.version, rt.kind)
}

fn crd_schema(rt: &ResourceType) -> Option<Value> {
    [TrainingJob::crd(), Sweep::crd(), TrainingQueue::crd()]
        .into_iter()
        .filter(|crd| crd.spec.group == rt.group && crd.spec.names.kind == rt.kind)
        .flat_map(|crd| crd.spec.versions)
        .find(|v| v.name == rt.version)
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|schema| serde_json::to_value(schema).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainingjobs_are_patched_with_server_side_field_validation_and_have_a_schema() {
        let root = document("/openapi/v3").expect("root");
        let url = root["paths"]["apis/trainyard.dev/v1"]["serverRelativeURL"]
            .as_str()
            .expect("listed");
        let doc = document(url).expect("group-version document");
        let patch = &doc["paths"]["/apis/trainyard.dev/v1/namespaces/{namespace}/trainingjobs/{name}"]
            ["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "TrainingJob"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["name"] == "fieldValidation")
        );
        let schema = &doc["components"]["schemas"]["dev.trainyard.v1.TrainingJob"];
        assert!(schema["properties"]["spec"]["properties"]["numWorkers"].is_object());
        assert!(document("/openapi/v3/apis/apps/v1").is_none());
        assert!(document("/openapi/v3/api/v1").is_some());
    }
}
