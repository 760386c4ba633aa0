//! Names, scope, subresources and printer columns of the generated CRDs.

mod common;

use common::crd_for_kind;

fn default_view_columns(kind: &str) -> Vec<String> {
    let crd = crd_for_kind(kind);
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap_or_default();
    // kubectl always prints NAME first; columns with priority > 0 only appear with -o wide.
    std::iter::once("NAME".to_owned())
        .chain(
            columns
                .iter()
                .filter(|c| c.priority.unwrap_or(0) == 0)
                .map(|c| c.name.to_uppercase()),
        )
        .collect()
}

#[test]
fn trainingjob_names_scope_and_columns_match_the_reference() {
    let crd = crd_for_kind("TrainingJob");
    assert_eq!(crd.spec.group, "trainyard.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.plural, "trainingjobs");
    assert_eq!(
        crd.spec.names.short_names,
        Some(vec!["tj".into(), "tjob".into()])
    );
    assert_eq!(crd.spec.names.categories, Some(vec!["trainyard".into()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1");
    assert!(version.served && version.storage);
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    // The reference's `kubectl get trainingjobs` output.
    assert_eq!(
        default_view_columns("TrainingJob"),
        ["NAME", "STATE", "PROGRESS", "EPOCH", "AGE"]
    );
    let wide: Vec<String> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority == Some(1))
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(wide, ["RESTARTS", "POSITION", "GPUS", "QUEUE"]);
}

#[test]
fn sweep_names_scope_and_columns() {
    let crd = crd_for_kind("Sweep");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.short_names, Some(vec!["sw".into()]));
    assert!(
        crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    assert_eq!(
        default_view_columns("Sweep"),
        ["NAME", "STATE", "TRIALS", "BEST", "AGE"]
    );
}

#[test]
fn trainingqueue_is_cluster_scoped() {
    let crd = crd_for_kind("TrainingQueue");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["tq".into()]));
    assert!(
        crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    assert_eq!(
        default_view_columns("TrainingQueue")
            .first()
            .map(String::as_str),
        Some("NAME")
    );
}

#[test]
fn every_spec_field_of_the_reference_table_is_in_the_schema() {
    let schema = common::schema_for_kind("TrainingJob");
    let spec = &schema["properties"]["spec"]["properties"];
    for field in [
        "model",
        "dataset",
        "numWorkers",
        "gpusPerWorker",
        "framework",
        "image",
        "command",
        "args",
        "env",
        "resources",
        "hyperparameters",
        "checkpoint",
        "scheduling",
        "monitoring",
        "networking",
        "failurePolicy",
        "successPolicy",
        "suspend",
    ] {
        assert!(
            spec.get(field).is_some(),
            "spec.{field} missing from the schema"
        );
    }
    let status = &schema["properties"]["status"]["properties"];
    for field in [
        "state",
        "conditions",
        "progress",
        "currentEpoch",
        "totalEpochs",
        "metrics",
        "workers",
        "checkpoint",
        "resources",
        "startTime",
        "completionTime",
        "duration",
        "failureReason",
        "restartCount",
        "observedGeneration",
    ] {
        assert!(
            status.get(field).is_some(),
            "status.{field} missing from the schema"
        );
    }
    let required = schema["properties"]["spec"]["required"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(required, ["dataset", "model", "numWorkers"]);
}

#[test]
fn every_schema_property_has_a_description() {
    // Descriptions are what `kubectl explain` shows; a field without one is undocumented API.
    fn walk(path: &str, node: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(properties) = node.get("properties").and_then(|p| p.as_object()) {
            for (name, child) in properties {
                let child_path = format!("{path}.{name}");
                // Embedded Kubernetes types carry their upstream docs; our own fields must too.
                if child.get("description").is_none()
                    && !matches!(name.as_str(), "apiVersion" | "kind" | "metadata")
                {
                    missing.push(child_path.clone());
                }
                walk(&child_path, child, missing);
            }
        }
        if let Some(items) = node.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    for kind in ["TrainingJob", "Sweep", "TrainingQueue"] {
        let mut missing = Vec::new();
        walk(kind, &common::schema_for_kind(kind), &mut missing);
        assert!(
            missing.is_empty(),
            "fields without description:\n{}",
            missing.join("\n")
        );
    }
}

#[test]
fn enum_display_matches_the_wire_name() {
    use trainyard_api::*;
    fn check<T: serde::Serialize + std::fmt::Display>(values: &[T]) {
        for value in values {
            assert_eq!(
                serde_json::to_value(value).expect("serializes"),
                serde_json::json!(value.to_string())
            );
        }
    }
    check(Framework::ALL);
    check(Optimizer::ALL);
    check(StorageType::ALL);
    check(CapacityType::ALL);
    check(CommunicationBackend::ALL);
    check(RestartPolicy::ALL);
    check(TrainingJobState::ALL);
    check(ObjectiveDirection::ALL);
    check(ParameterType::ALL);
    check(AlgorithmName::ALL);
    check(EarlyStoppingAlgorithm::ALL);
    check(SweepState::ALL);
    check(WithinQueuePreemption::ALL);
    check(ReclaimWithinCohort::ALL);
    check(ConditionStatus::ALL);
    assert_eq!(CapacityType::OnDemand.to_string(), "on-demand");
}
