//! Helpers shared by the integration tests: the generated schemas, the examples,
//! a JSON-schema validator with the apiserver's draft-4 semantics, and a CEL evaluator.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde::Deserialize;
use serde_json::Value;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

/// Root of the Cargo workspace (crds/ and examples/ live there).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The generated CRD of a Trainyard kind.
pub fn crd_for_kind(kind: &str) -> CustomResourceDefinition {
    match kind {
        "TrainingJob" => TrainingJob::crd(),
        "Sweep" => Sweep::crd(),
        "TrainingQueue" => TrainingQueue::crd(),
        other => panic!("not a Trainyard kind: {other}"),
    }
}

/// The generated openAPIV3Schema of a Trainyard kind, as JSON.
pub fn schema_for_kind(kind: &str) -> Value {
    let crd = crd_for_kind(kind);
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("generated CRD has an openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serializes")
}

/// One problem found by the schema or by CEL: dotted path (`spec.numWorkers`) and message.
#[derive(Debug, Clone)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

/// Structural schema errors (types, ranges, enums, patterns, required), like the
/// apiserver's OpenAPI validation. The apiserver's schemas are OpenAPI 3.0 which uses
/// draft-4 keyword semantics (boolean `exclusiveMinimum`).
pub fn schema_problems(kind: &str, object: &Value) -> Vec<Problem> {
    let schema = schema_for_kind(kind);
    let validator = jsonschema::draft4::new(&schema).expect("generated schema compiles as draft 4");
    validator
        .iter_errors(object)
        .map(|error| Problem {
            path: pointer_to_dotted(error.instance_path().as_str()),
            message: error.to_string(),
        })
        .collect()
}

/// CEL (`x-kubernetes-validations`) failures, evaluated the way the apiserver does it:
/// schema defaults first, then every rule at its node.
pub fn cel_problems(kind: &str, object: &Value) -> Vec<Problem> {
    let schema = schema_for_kind(kind);
    match kube_cel::Validator::new().validate(&schema, object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            .map(|error| Problem {
                path: error.field_path.clone(),
                message: error.message.clone(),
            })
            .collect(),
    }
}

/// All apiserver-side problems: schema first, then CEL.
pub fn apiserver_problems(kind: &str, object: &Value) -> Vec<Problem> {
    let mut problems = schema_problems(kind, object);
    problems.extend(cel_problems(kind, object));
    problems
}

/// `/spec/parameters/0/min` -> `spec.parameters[0].min`.
pub fn pointer_to_dotted(pointer: &str) -> String {
    let mut dotted = String::new();
    for segment in pointer.split('/').filter(|s| !s.is_empty()) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if segment.chars().all(|c| c.is_ascii_digit()) {
            dotted.push_str(&format!("[{segment}]"));
        } else {
            if !dotted.is_empty() {
                dotted.push('.');
            }
            dotted.push_str(&segment);
        }
    }
    dotted
}

/// One YAML document of an example file.
pub struct ExampleDocument {
    pub file: PathBuf,
    pub object: Value,
}

impl ExampleDocument {
    pub fn kind(&self) -> &str {
        self.object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    pub fn label(&self) -> String {
        let name = self
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        format!("{} ({} {name})", self.file.display(), self.kind())
    }
}

/// Every document of every `examples/*.yaml` file, in file-name order.
pub fn example_documents() -> Vec<ExampleDocument> {
    let dir = workspace_root().join("examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for document in yaml_serde::Deserializer::from_str(&text) {
            let object = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", file.display()));
            if !object.is_null() {
                documents.push(ExampleDocument {
                    file: file.clone(),
                    object,
                });
            }
        }
    }
    documents
}

/// Renders problems one per line for assertion messages.
pub fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  {}: {}", p.path, p.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Applies a JSON merge patch (RFC 7386): objects merge, `null` deletes, anything else replaces.
pub fn merged(base: &Value, patch: &Value) -> Value {
    match (base, patch) {
        (Value::Object(base_map), Value::Object(patch_map)) => {
            let mut result = base_map.clone();
            for (key, patch_value) in patch_map {
                if patch_value.is_null() {
                    result.remove(key);
                } else {
                    let merged_value = match result.get(key) {
                        Some(existing) => merged(existing, patch_value),
                        None => merged(&Value::Null, patch_value),
                    };
                    result.insert(key.clone(), merged_value);
                }
            }
            Value::Object(result)
        }
        (_, Value::Object(patch_map)) => merged(
            &Value::Object(Default::default()),
            &Value::Object(patch_map.clone()),
        ),
        (_, other) => other.clone(),
    }
}

/// True when a problem names `field` (a dotted path such as `spec.model`): either its path
/// is the field (or inside it), or its path is the field's parent and the message names the
/// field, which is how "required property" errors are reported.
pub fn names_field(path: &str, message: &str, field: &str) -> bool {
    if path == field
        || path.starts_with(&format!("{field}."))
        || path.starts_with(&format!("{field}["))
    {
        return true;
    }
    match field.rsplit_once('.') {
        Some((parent, leaf)) => path == parent && message.contains(leaf),
        None => false,
    }
}

/// A minimal valid TrainingJob (the reference's basic example).
pub fn basic_trainingjob() -> Value {
    serde_json::json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "mnist-training", "namespace": "ml-training"},
        "spec": {
            "model": "cnn",
            "dataset": "mnist",
            "numWorkers": 2,
            "gpusPerWorker": 1,
            "hyperparameters": {"learningRate": 0.001, "batchSize": 64, "epochs": 10}
        }
    })
}

/// A valid Sweep with one parameter of each type.
pub fn basic_sweep() -> Value {
    serde_json::json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "lr-sweep", "namespace": "ml-training"},
        "spec": {
            "objective": {"metric": "validation_loss", "direction": "minimize"},
            "parameters": [
                {"name": "learningRate", "type": "float", "min": 0.0001, "max": 0.1, "log": true},
                {"name": "batchSize", "type": "int", "min": 16, "max": 128, "step": 16},
                {"name": "optimizer", "type": "categorical", "values": ["adam", "sgd"]}
            ],
            "algorithm": {"name": "random", "seed": 7},
            "parallelTrialCount": 2,
            "maxTrialCount": 10,
            "trialTemplate": {"model": "bert-base", "dataset": "glue-mrpc", "numWorkers": 1,
                              "hyperparameters": {"epochs": 9}}
        }
    })
}

/// A valid TrainingQueue in a cohort.
pub fn basic_queue() -> Value {
    serde_json::json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingQueue",
        "metadata": {"name": "team-a"},
        "spec": {
            "cohort": "research",
            "flavors": [{"name": "a100-80gb", "nominalQuota": 16, "borrowingLimit": 8, "lendingLimit": 4}]
        }
    })
}
