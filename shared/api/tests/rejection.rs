//! Bad specs are rejected by the schema (what kubectl hits) and by the Rust `validate()` /
//! `from_json()` (what NATS submissions hit), and both name the offending field.

mod common;

use common::{
    basic_queue, basic_sweep, basic_trainingjob, describe, merged, names_field, schema_problems,
};
use serde_json::{Value, json};
use trainyard_api::{FieldError, SweepSpec, TrainingJobSpec, TrainingQueueSpec};

struct Case {
    what: &'static str,
    patch: Value,
    field: &'static str,
}

fn case(what: &'static str, patch: Value, field: &'static str) -> Case {
    Case { what, patch, field }
}

/// Decodes and validates the object's spec the way a NATS submission is handled.
fn rust_errors(kind: &str, object: &Value) -> Vec<FieldError> {
    let spec = object["spec"].clone();
    let result = match kind {
        "TrainingJob" => TrainingJobSpec::from_json(spec).map(|_| ()),
        "Sweep" => SweepSpec::from_json(spec).map(|_| ()),
        "TrainingQueue" => TrainingQueueSpec::from_json(spec).map(|_| ()),
        other => panic!("unknown kind {other}"),
    };
    result.err().unwrap_or_default()
}

fn assert_rejected_everywhere(kind: &str, base: &Value, cases: &[Case]) {
    let mut failures = Vec::new();
    for case in cases {
        let object = merged(base, &case.patch);
        let schema = schema_problems(kind, &object);
        if !schema
            .iter()
            .any(|p| names_field(&p.path, &p.message, case.field))
        {
            failures.push(format!(
                "{kind}: {}: schema does not reject it naming {}; schema said:\n{}",
                case.what,
                case.field,
                describe(&schema)
            ));
        }
        let rust = rust_errors(kind, &object);
        if !rust
            .iter()
            .any(|e| names_field(&e.path, &e.message, case.field))
        {
            failures.push(format!(
                "{kind}: {}: Rust does not reject it naming {}; Rust said: {rust:?}",
                case.what, case.field
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn base_objects_are_valid() {
    for (kind, object) in [
        ("TrainingJob", basic_trainingjob()),
        ("Sweep", basic_sweep()),
        ("TrainingQueue", basic_queue()),
    ] {
        let problems = common::apiserver_problems(kind, &object);
        assert!(problems.is_empty(), "{kind}:\n{}", describe(&problems));
        assert_eq!(rust_errors(kind, &object), Vec::new(), "{kind}");
    }
}

#[test]
fn headline_rejections_num_workers_framework_model() {
    assert_rejected_everywhere(
        "TrainingJob",
        &basic_trainingjob(),
        &[
            case(
                "numWorkers: 0",
                json!({"spec": {"numWorkers": 0}}),
                "spec.numWorkers",
            ),
            case(
                "unknown framework",
                json!({"spec": {"framework": "mxnet"}}),
                "spec.framework",
            ),
            case(
                "missing model",
                json!({"spec": {"model": null}}),
                "spec.model",
            ),
        ],
    );
}

#[test]
fn validate_names_the_field_for_typed_specs() {
    // validate() on an already-typed spec (a Rust caller building a job).
    let base: TrainingJobSpec =
        serde_json::from_value(basic_trainingjob()["spec"].clone()).expect("decodes");
    let no_workers = TrainingJobSpec {
        num_workers: 0,
        ..base.clone()
    };
    let errors = no_workers.validate().expect_err("numWorkers 0 is invalid");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, "spec.numWorkers");
    assert!(
        errors[0].message.contains("between 1 and 100"),
        "{}",
        errors[0]
    );

    let no_model = TrainingJobSpec {
        model: String::new(),
        ..base
    };
    let errors = no_model.validate().expect_err("an empty model is invalid");
    assert_eq!(errors[0].path, "spec.model");
    assert_eq!(errors[0].kind, trainyard_api::FieldErrorKind::Required);

    // An unknown framework cannot exist in a typed spec; decoding names it.
    let errors = TrainingJobSpec::from_json(
        json!({"model": "m", "dataset": "d", "numWorkers": 1, "framework": "mxnet"}),
    )
    .expect_err("mxnet is not a framework");
    assert_eq!(errors[0].path, "spec.framework");
    assert_eq!(errors[0].kind, trainyard_api::FieldErrorKind::NotSupported);
    assert!(
        errors[0].message.contains("pytorch"),
        "the message lists the choices: {}",
        errors[0]
    );

    let errors = TrainingJobSpec::from_json(json!({"dataset": "d", "numWorkers": 1}))
        .expect_err("model is required");
    assert_eq!(errors[0].path, "spec.model");
    assert_eq!(errors[0].kind, trainyard_api::FieldErrorKind::Required);
}

#[test]
fn trainingjob_ranges_enums_and_formats() {
    assert_rejected_everywhere(
        "TrainingJob",
        &basic_trainingjob(),
        &[
            case(
                "101 workers",
                json!({"spec": {"numWorkers": 101}}),
                "spec.numWorkers",
            ),
            case(
                "negative workers",
                json!({"spec": {"numWorkers": -1}}),
                "spec.numWorkers",
            ),
            case(
                "workers as text",
                json!({"spec": {"numWorkers": "two"}}),
                "spec.numWorkers",
            ),
            case("empty model", json!({"spec": {"model": ""}}), "spec.model"),
            case(
                "missing dataset",
                json!({"spec": {"dataset": null}}),
                "spec.dataset",
            ),
            case(
                "65 GPUs per worker",
                json!({"spec": {"gpusPerWorker": 65}}),
                "spec.gpusPerWorker",
            ),
            case(
                "learning rate 0",
                json!({"spec": {"hyperparameters": {"learningRate": 0}}}),
                "spec.hyperparameters.learningRate",
            ),
            case(
                "batch size 0",
                json!({"spec": {"hyperparameters": {"batchSize": 0}}}),
                "spec.hyperparameters.batchSize",
            ),
            case(
                "epochs 0",
                json!({"spec": {"hyperparameters": {"epochs": 0}}}),
                "spec.hyperparameters.epochs",
            ),
            case(
                "unknown optimizer",
                json!({"spec": {"hyperparameters": {"optimizer": "adagrad"}}}),
                "spec.hyperparameters.optimizer",
            ),
            case(
                "gradient accumulation 0",
                json!({"spec": {"hyperparameters": {"gradientAccumulationSteps": 0}}}),
                "spec.hyperparameters.gradientAccumulationSteps",
            ),
            case(
                "unknown storage type",
                json!({"spec": {"checkpoint": {"storage": {"type": "azure"}}}}),
                "spec.checkpoint.storage.type",
            ),
            case(
                "storage without type",
                json!({"spec": {"checkpoint": {"storage": {"s3Bucket": "ml-checkpoints"}}}}),
                "spec.checkpoint.storage.type",
            ),
            case(
                "priority class with spaces",
                json!({"spec": {"scheduling": {"priority": "High Priority"}}}),
                "spec.scheduling.priority",
            ),
            case(
                "queue with capitals",
                json!({"spec": {"scheduling": {"queue": "Default"}}}),
                "spec.scheduling.queue",
            ),
            case(
                "unknown capacity type",
                json!({"spec": {"scheduling": {"capacityType": "reserved"}}}),
                "spec.scheduling.capacityType",
            ),
            case(
                "malformed MIG profile",
                json!({"spec": {"scheduling": {"migProfile": "a100-10gb"}}}),
                "spec.scheduling.migProfile",
            ),
            case(
                "metrics port 0",
                json!({"spec": {"monitoring": {"metricsPort": 0}}}),
                "spec.monitoring.metricsPort",
            ),
            case(
                "master port 80",
                json!({"spec": {"networking": {"masterPort": 80}}}),
                "spec.networking.masterPort",
            ),
            case(
                "unknown backend",
                json!({"spec": {"networking": {"backend": "ucx"}}}),
                "spec.networking.backend",
            ),
            case(
                "unknown restart policy",
                json!({"spec": {"failurePolicy": {"restartPolicy": "Always"}}}),
                "spec.failurePolicy.restartPolicy",
            ),
            case(
                "backoff limit 101",
                json!({"spec": {"failurePolicy": {"backoffLimit": 101}}}),
                "spec.failurePolicy.backoffLimit",
            ),
            case(
                "deadline 0",
                json!({"spec": {"failurePolicy": {"activeDeadlineSeconds": 0}}}),
                "spec.failurePolicy.activeDeadlineSeconds",
            ),
            case(
                "target accuracy 1.5",
                json!({"spec": {"successPolicy": {"targetAccuracy": 1.5}}}),
                "spec.successPolicy.targetAccuracy",
            ),
            case(
                "patience 0",
                json!({"spec": {"successPolicy": {"earlyStoppingPatience": 0}}}),
                "spec.successPolicy.earlyStoppingPatience",
            ),
        ],
    );
}

#[test]
fn sweep_schema_rejections() {
    assert_rejected_everywhere(
        "Sweep",
        &basic_sweep(),
        &[
            case(
                "maxTrialCount 0",
                json!({"spec": {"maxTrialCount": 0}}),
                "spec.maxTrialCount",
            ),
            case(
                "missing maxTrialCount",
                json!({"spec": {"maxTrialCount": null}}),
                "spec.maxTrialCount",
            ),
            case(
                "parallelTrialCount 0",
                json!({"spec": {"parallelTrialCount": 0}}),
                "spec.parallelTrialCount",
            ),
            case(
                "no parameters",
                json!({"spec": {"parameters": []}}),
                "spec.parameters",
            ),
            case(
                "unknown direction",
                json!({"spec": {"objective": {"direction": "up"}}}),
                "spec.objective.direction",
            ),
            case(
                "missing objective metric",
                json!({"spec": {"objective": {"metric": null}}}),
                "spec.objective.metric",
            ),
            case(
                "unknown algorithm",
                json!({"spec": {"algorithm": {"name": "bayes"}}}),
                "spec.algorithm.name",
            ),
            case(
                "reduction factor 1",
                json!({"spec": {"earlyStopping": {"algorithm": "asha", "reductionFactor": 1}}}),
                "spec.earlyStopping.reductionFactor",
            ),
            case(
                "unknown early stopping",
                json!({"spec": {"earlyStopping": {"algorithm": "pbt"}}}),
                "spec.earlyStopping.algorithm",
            ),
            case(
                "tpe gamma 1",
                json!({"spec": {"algorithm": {"name": "tpe", "settings": {"gamma": 1.0}}}}),
                "spec.algorithm.settings.gamma",
            ),
            case(
                "trial template with 0 workers",
                json!({"spec": {"trialTemplate": {"numWorkers": 0}}}),
                "spec.trialTemplate.numWorkers",
            ),
            case(
                "trial template with unknown framework",
                json!({"spec": {"trialTemplate": {"framework": "caffe"}}}),
                "spec.trialTemplate.framework",
            ),
        ],
    );
}

#[test]
fn sweep_parameter_rejections() {
    // Parameters are a list, which merge patches replace whole; build each bad list.
    let base = basic_sweep();
    let with_parameters = |parameters: Value| json!({"spec": {"parameters": parameters}});
    assert_rejected_everywhere(
        "Sweep",
        &base,
        &[
            case(
                "unknown parameter type",
                with_parameters(json!([{"name": "x", "type": "bool"}])),
                "spec.parameters[0].type",
            ),
            case(
                "parameter name with a space",
                with_parameters(
                    json!([{"name": "learning rate", "type": "float", "min": 0.1, "max": 1.0}]),
                ),
                "spec.parameters[0].name",
            ),
            case(
                "step 0",
                with_parameters(
                    json!([{"name": "x", "type": "float", "min": 0.1, "max": 1.0, "step": 0}]),
                ),
                "spec.parameters[0].step",
            ),
            case(
                "empty categorical value",
                with_parameters(json!([{"name": "x", "type": "categorical", "values": [""]}])),
                "spec.parameters[0].values[0]",
            ),
        ],
    );
}

#[test]
fn trainingqueue_schema_rejections() {
    assert_rejected_everywhere(
        "TrainingQueue",
        &basic_queue(),
        &[
            case(
                "no flavors",
                json!({"spec": {"flavors": []}}),
                "spec.flavors",
            ),
            case(
                "flavor name with capitals",
                json!({"spec": {"flavors": [{"name": "A100", "nominalQuota": 1}]}}),
                "spec.flavors[0].name",
            ),
            case(
                "negative quota",
                json!({"spec": {"flavors": [{"name": "a100", "nominalQuota": -1}]}}),
                "spec.flavors[0].nominalQuota",
            ),
            case(
                "cohort with capitals",
                json!({"spec": {"cohort": "Research"}}),
                "spec.cohort",
            ),
            case(
                "negative fair share",
                json!({"spec": {"fairShare": {"weight": -1}}}),
                "spec.fairShare.weight",
            ),
            case(
                "unknown preemption",
                json!({"spec": {"preemption": {"withinQueue": "Always"}}}),
                "spec.preemption.withinQueue",
            ),
            case(
                "aging seconds 0",
                json!({"spec": {"priority": {"agingSeconds": 0}}}),
                "spec.priority.agingSeconds",
            ),
        ],
    );
}

#[test]
fn duplicate_list_keys_are_rejected_by_validate() {
    // The apiserver enforces these through x-kubernetes-list-type (map keys, set values),
    // which a JSON-schema validator does not know; validate() has to catch them itself.
    let duplicated_parameter = merged(
        &basic_sweep(),
        &json!({"spec": {"parameters": [
            {"name": "lr", "type": "float", "min": 0.1, "max": 1.0},
            {"name": "lr", "type": "float", "min": 0.2, "max": 2.0}
        ]}}),
    );
    let errors = rust_errors("Sweep", &duplicated_parameter);
    assert!(
        errors.iter().any(|e| e.path == "spec.parameters[1].name"),
        "{errors:?}"
    );

    let duplicated_value = merged(
        &basic_sweep(),
        &json!({"spec": {"parameters": [{"name": "opt", "type": "categorical", "values": ["adam", "adam"]}]}}),
    );
    let errors = rust_errors("Sweep", &duplicated_value);
    assert!(
        errors
            .iter()
            .any(|e| e.path == "spec.parameters[0].values[1]"),
        "{errors:?}"
    );

    let duplicated_flavor = merged(
        &basic_queue(),
        &json!({"spec": {"flavors": [{"name": "a100", "nominalQuota": 1}, {"name": "a100", "nominalQuota": 2}]}}),
    );
    let errors = rust_errors("TrainingQueue", &duplicated_flavor);
    assert!(
        errors.iter().any(|e| e.path == "spec.flavors[1].name"),
        "{errors:?}"
    );

    let list_types = schema_list_types();
    for (kind, path) in [
        ("Sweep", "spec.parameters"),
        ("TrainingQueue", "spec.flavors"),
    ] {
        assert!(
            list_types
                .iter()
                .any(|(k, p, t)| *k == kind && p == path && t == "map"),
            "{kind} {path} is not a list-type map: {list_types:?}"
        );
    }
}

/// (kind, path, list type) of the list-type annotations the duplicate checks rely on.
fn schema_list_types() -> Vec<(&'static str, String, String)> {
    let mut found = Vec::new();
    for kind in ["Sweep", "TrainingQueue"] {
        let schema = common::schema_for_kind(kind);
        for (field, node) in schema["properties"]["spec"]["properties"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if let Some(list_type) = node.get("x-kubernetes-list-type").and_then(Value::as_str) {
                found.push((kind, format!("spec.{field}"), list_type.to_owned()));
            }
        }
    }
    found
}

#[test]
fn every_problem_in_a_spec_is_reported_at_once() {
    // One submission, three mistakes: the submitter sees all of them, not one per retry.
    let spec: TrainingJobSpec = serde_json::from_value(json!({
        "model": "", "dataset": "mnist", "numWorkers": 0,
        "networking": {"masterPort": 80}
    }))
    .expect("decodes");
    let paths: Vec<String> = spec
        .validate()
        .expect_err("invalid")
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(
        paths,
        [
            "spec.model",
            "spec.numWorkers",
            "spec.networking.masterPort"
        ]
    );
}
