//! Every example manifest is accepted by the generated schema and its CEL rules, decodes
//! into the Rust type, and passes `validate()`.

mod common;

use std::collections::BTreeSet;

use common::{ExampleDocument, apiserver_problems, describe, example_documents};
use serde_json::Value;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

/// The examples this crate owns; each must exist so the test cannot pass on an empty directory.
const REQUIRED_EXAMPLES: [(&str, &str); 6] = [
    ("TrainingJob", "mnist-training"),
    ("TrainingJob", "bert-distributed"),
    ("TrainingJob", "gpt-resume"),
    ("TrainingJob", "advanced-training"),
    ("Sweep", "bert-finetune-sweep"),
    ("TrainingQueue", "default"),
];

fn is_trainyard(document: &ExampleDocument) -> bool {
    document.object.get("apiVersion").and_then(Value::as_str)
        == Some(trainyard_api::API_GROUP_VERSION)
}

#[test]
fn all_required_examples_exist() {
    let present: BTreeSet<(String, String)> = example_documents()
        .iter()
        .filter(|d| is_trainyard(d))
        .map(|d| {
            let name = d
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            (d.kind().to_owned(), name.to_owned())
        })
        .collect();
    for (kind, name) in REQUIRED_EXAMPLES {
        assert!(
            present.contains(&(kind.to_owned(), name.to_owned())),
            "examples/ has no {kind} {name}"
        );
    }
}

#[test]
fn no_example_uses_the_reference_api_group() {
    for document in example_documents() {
        let api_version = document
            .object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(
            !api_version.starts_with("ml.example.com"),
            "{} still uses {api_version}",
            document.label()
        );
    }
}

#[test]
fn examples_pass_the_schema_and_cel_rules() {
    let mut checked = 0;
    for document in example_documents().iter().filter(|d| is_trainyard(d)) {
        let problems = apiserver_problems(document.kind(), &document.object);
        assert!(
            problems.is_empty(),
            "{} is rejected:\n{}",
            document.label(),
            describe(&problems)
        );
        checked += 1;
    }
    assert!(checked >= REQUIRED_EXAMPLES.len());
}

#[test]
fn examples_decode_into_rust_types_and_pass_validate() {
    for document in example_documents().iter().filter(|d| is_trainyard(d)) {
        let label = document.label();
        let object = document.object.clone();
        // Re-serialising the typed object must still satisfy the schema: the Rust
        // types and the schema describe the same wire format.
        let reencoded = match document.kind() {
            "TrainingJob" => {
                let job: TrainingJob =
                    serde_json::from_value(object).unwrap_or_else(|e| panic!("{label}: {e}"));
                if let Err(errors) = job.spec.validate() {
                    panic!(
                        "{label} fails validate():\n{}",
                        trainyard_api::format_field_errors(&errors)
                    );
                }
                serde_json::to_value(&job)
            }
            "Sweep" => {
                let sweep: Sweep =
                    serde_json::from_value(object).unwrap_or_else(|e| panic!("{label}: {e}"));
                if let Err(errors) = sweep.spec.validate() {
                    panic!(
                        "{label} fails validate():\n{}",
                        trainyard_api::format_field_errors(&errors)
                    );
                }
                serde_json::to_value(&sweep)
            }
            "TrainingQueue" => {
                let queue: TrainingQueue =
                    serde_json::from_value(object).unwrap_or_else(|e| panic!("{label}: {e}"));
                if let Err(errors) = queue.spec.validate() {
                    panic!(
                        "{label} fails validate():\n{}",
                        trainyard_api::format_field_errors(&errors)
                    );
                }
                serde_json::to_value(&queue)
            }
            other => panic!("{label}: unexpected kind {other}"),
        }
        .expect("serializes");
        let problems = apiserver_problems(document.kind(), &reencoded);
        assert!(
            problems.is_empty(),
            "{label} re-encoded is rejected:\n{}",
            describe(&problems)
        );
    }
}

#[test]
fn examples_decode_through_from_json() {
    // The NATS path: spec JSON in, typed and validated spec out.
    for document in example_documents().iter().filter(|d| is_trainyard(d)) {
        let spec = document.object["spec"].clone();
        let result = match document.kind() {
            "TrainingJob" => trainyard_api::TrainingJobSpec::from_json(spec).map(|_| ()),
            "Sweep" => trainyard_api::SweepSpec::from_json(spec).map(|_| ()),
            "TrainingQueue" => trainyard_api::TrainingQueueSpec::from_json(spec).map(|_| ()),
            _ => continue,
        };
        if let Err(errors) = result {
            panic!(
                "{}:\n{}",
                document.label(),
                trainyard_api::format_field_errors(&errors)
            );
        }
    }
}

#[test]
fn resume_example_is_what_the_controllers_see() {
    let document = example_documents()
        .into_iter()
        .find(|d| d.object.pointer("/metadata/name").and_then(Value::as_str) == Some("gpt-resume"))
        .expect("resume example");
    let job: TrainingJob = serde_json::from_value(document.object).expect("decodes");
    assert!(job.spec.checkpointing_enabled());
    assert_eq!(job.spec.total_gpus(), 8);
    assert_eq!(
        job.spec.checkpoint_frequency(),
        trainyard_api::CheckpointFrequency::Epochs(2)
    );
    assert_eq!(job.spec.framework(), trainyard_api::Framework::Pytorch);
    assert_eq!(
        job.spec.checkpoint.and_then(|c| c.resume_from).as_deref(),
        Some("s3://checkpoints/gpt-training/checkpoint-epoch-10")
    );
}
