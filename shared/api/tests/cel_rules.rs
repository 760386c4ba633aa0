//! The CEL rules (`x-kubernetes-validations`) of the generated schemas, evaluated with
//! kube-cel the way the apiserver does (defaults first, then each rule at its node), and
//! the Rust `validate()` mirror of each rule, on good and bad specs.

mod common;

use std::collections::BTreeSet;

use common::{
    basic_queue, basic_sweep, basic_trainingjob, cel_problems, describe, merged, names_field,
    schema_for_kind, schema_problems,
};
use serde_json::{Value, json};
use trainyard_api::{FieldError, SweepSpec, TrainingJobSpec, TrainingQueueSpec};

const KINDS: [&str; 3] = ["TrainingJob", "Sweep", "TrainingQueue"];

/// A spec change and the field a CEL rule must name when rejecting it.
struct Bad {
    what: &'static str,
    patch: Value,
    field: &'static str,
}

fn bad(what: &'static str, patch: Value, field: &'static str) -> Bad {
    Bad { what, patch, field }
}

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

/// Asserts each bad change passes the structural schema (so the CEL rule is what catches
/// it), is rejected by CEL naming the field, and is rejected by `validate()` naming it.
/// Returns the CEL messages seen, for the coverage check.
fn assert_cel_rejects(kind: &str, base: &Value, cases: &[Bad]) -> BTreeSet<String> {
    let mut failures = Vec::new();
    let mut messages = BTreeSet::new();
    for case in cases {
        let object = merged(base, &case.patch);
        let structural = schema_problems(kind, &object);
        if !structural.is_empty() {
            failures.push(format!(
                "{kind}: {}: expected only CEL to reject it, but the schema does:\n{}",
                case.what,
                describe(&structural)
            ));
        }
        let cel = cel_problems(kind, &object);
        if !cel
            .iter()
            .any(|p| names_field(&p.path, &p.message, case.field))
        {
            failures.push(format!(
                "{kind}: {}: CEL does not reject it naming {}; CEL said:\n{}",
                case.what,
                case.field,
                describe(&cel)
            ));
        }
        messages.extend(cel.iter().map(|p| p.message.clone()));
        let rust = rust_errors(kind, &object);
        if !rust
            .iter()
            .any(|e| names_field(&e.path, &e.message, case.field))
        {
            failures.push(format!(
                "{kind}: {}: validate() does not reject it naming {}; it said: {rust:?}",
                case.what, case.field
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    messages
}

/// Asserts each good change is accepted by schema, CEL and `validate()`.
fn assert_accepted(kind: &str, base: &Value, cases: &[(&str, Value)]) {
    let mut failures = Vec::new();
    for (what, patch) in cases {
        let object = merged(base, patch);
        let mut problems = schema_problems(kind, &object);
        problems.extend(cel_problems(kind, &object));
        if !problems.is_empty() {
            failures.push(format!(
                "{kind}: {what}: rejected by the apiserver rules:\n{}",
                describe(&problems)
            ));
        }
        let rust = rust_errors(kind, &object);
        if !rust.is_empty() {
            failures.push(format!("{kind}: {what}: rejected by validate(): {rust:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn trainingjob_bad_cases() -> Vec<Bad> {
    vec![
        bad(
            "resumeFrom without enabled",
            json!({"spec": {"checkpoint": {"resumeFrom": "s3://c/epoch-3"}}}),
            "spec.checkpoint.resumeFrom",
        ),
        bad(
            "resumeFrom with checkpointing disabled",
            json!({"spec": {"checkpoint": {"enabled": false, "resumeFrom": "s3://c/epoch-3"}}}),
            "spec.checkpoint.resumeFrom",
        ),
        bad(
            "s3 without bucket",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "s3"}}}}),
            "spec.checkpoint.storage.s3Bucket",
        ),
        bad(
            "s3 with only a gcs bucket",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "s3", "gcsBucket": "ckpt"}}}}),
            "spec.checkpoint.storage.s3Bucket",
        ),
        bad(
            "gcs without bucket",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "gcs"}}}}),
            "spec.checkpoint.storage.gcsBucket",
        ),
        bad(
            "pvc without claim",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "pvc"}}}}),
            "spec.checkpoint.storage.claimName",
        ),
        bad(
            "nfs without server",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "nfs", "nfsPath": "/exports/ckpt"}}}}),
            "spec.checkpoint.storage.nfsServer",
        ),
        bad(
            "nfs without path",
            json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "nfs", "nfsServer": "nfs.local"}}}}),
            "spec.checkpoint.storage.nfsPath",
        ),
        bad(
            "MIG profile on a CPU job",
            json!({"spec": {"gpusPerWorker": 0, "scheduling": {"migProfile": "1g.10gb"}}}),
            "spec.scheduling.migProfile",
        ),
        bad(
            "NCCL on a CPU job",
            json!({"spec": {"gpusPerWorker": 0, "networking": {"backend": "nccl"}}}),
            "spec.networking.backend",
        ),
        bad(
            "metrics port equal to master port",
            json!({"spec": {"monitoring": {"metricsPort": 23456}, "networking": {"masterPort": 23456}}}),
            "spec.monitoring.metricsPort",
        ),
        bad(
            "metrics port equal to the default master port",
            json!({"spec": {"monitoring": {"metricsPort": 29500}}}),
            "spec.monitoring.metricsPort",
        ),
        bad(
            "metrics port equal to the defaulted master port of a networking section",
            json!({"spec": {"monitoring": {"metricsPort": 29500}, "networking": {"backend": "nccl"}}}),
            "spec.monitoring.metricsPort",
        ),
        bad(
            "early stopping patience equal to epochs",
            json!({"spec": {"successPolicy": {"earlyStoppingPatience": 10}}}),
            "spec.successPolicy.earlyStoppingPatience",
        ),
        bad(
            "checkpoint frequency above epochs",
            json!({"spec": {"checkpoint": {"enabled": true, "frequency": 11}}}),
            "spec.checkpoint.frequency",
        ),
        bad(
            "checkpoint frequency 0",
            json!({"spec": {"checkpoint": {"frequency": 0}}}),
            "spec.checkpoint.frequency",
        ),
        bad(
            "checkpoint frequency a word other than auto",
            json!({"spec": {"checkpoint": {"enabled": true, "frequency": "hourly"}}}),
            "spec.checkpoint.frequency",
        ),
        bad(
            "retention that keeps nothing",
            json!({"spec": {"checkpoint": {"retention": {"keepLast": 0}}}}),
            "spec.checkpoint.retention.keepLast",
        ),
        bad(
            "backoff limit with restartPolicy Never",
            json!({"spec": {"failurePolicy": {"restartPolicy": "Never", "backoffLimit": 2}}}),
            "spec.failurePolicy.backoffLimit",
        ),
        bad(
            "a user volume named like Trainyard's checkpoint volume",
            json!({"spec": {"volumes": [{"name": "checkpoints", "emptyDir": {}}]}}),
            "spec.volumes",
        ),
    ]
}

fn sweep_bad_cases() -> Vec<Bad> {
    let parameters = |list: Value| json!({"spec": {"parameters": list}});
    vec![
        bad(
            "float without min",
            parameters(json!([{"name": "x", "type": "float", "max": 1.0}])),
            "spec.parameters[0].min",
        ),
        bad(
            "int without max",
            parameters(json!([{"name": "x", "type": "int", "min": 1}])),
            "spec.parameters[0].max",
        ),
        bad(
            "min equal to max",
            parameters(json!([{"name": "x", "type": "float", "min": 0.5, "max": 0.5}])),
            "spec.parameters[0].max",
        ),
        bad(
            "min above max",
            parameters(json!([{"name": "x", "type": "int", "min": 10, "max": 2}])),
            "spec.parameters[0].max",
        ),
        bad(
            "categorical without values",
            parameters(json!([{"name": "x", "type": "categorical"}])),
            "spec.parameters[0].values",
        ),
        bad(
            "categorical with empty values",
            parameters(json!([{"name": "x", "type": "categorical", "values": []}])),
            "spec.parameters[0].values",
        ),
        bad(
            "values on a float",
            parameters(
                json!([{"name": "x", "type": "float", "min": 0.1, "max": 1.0, "values": ["a"]}]),
            ),
            "spec.parameters[0].values",
        ),
        bad(
            "range on a categorical",
            parameters(json!([{"name": "x", "type": "categorical", "values": ["a"], "min": 1.0}])),
            "spec.parameters[0].min",
        ),
        bad(
            "step on a categorical",
            parameters(json!([{"name": "x", "type": "categorical", "values": ["a"], "step": 1}])),
            "spec.parameters[0].step",
        ),
        bad(
            "log on an int",
            parameters(json!([{"name": "x", "type": "int", "min": 1, "max": 64, "log": true}])),
            "spec.parameters[0].log",
        ),
        bad(
            "log with min 0",
            parameters(
                json!([{"name": "x", "type": "float", "min": 0.0, "max": 1.0, "log": true}]),
            ),
            "spec.parameters[0].min",
        ),
        bad(
            "int with fractional min",
            parameters(json!([{"name": "x", "type": "int", "min": 1.5, "max": 8}])),
            "spec.parameters[0].min",
        ),
        bad(
            "int with fractional max",
            parameters(json!([{"name": "x", "type": "int", "min": 1, "max": 8.5}])),
            "spec.parameters[0].max",
        ),
        bad(
            "int with fractional step",
            parameters(json!([{"name": "x", "type": "int", "min": 1, "max": 8, "step": 0.5}])),
            "spec.parameters[0].step",
        ),
        bad(
            "grid over a float without step",
            json!({"spec": {"algorithm": {"name": "grid"}}}),
            "spec.parameters",
        ),
        bad(
            "tpe settings on random search",
            json!({"spec": {"algorithm": {"name": "random", "settings": {"nStartupTrials": 5}}}}),
            "spec.algorithm.settings",
        ),
        bad(
            "minResource not below maxResource",
            json!({"spec": {"earlyStopping": {"algorithm": "asha", "minResource": 9, "maxResource": 9}}}),
            "spec.earlyStopping.maxResource",
        ),
        bad(
            "more parallel trials than trials",
            json!({"spec": {"parallelTrialCount": 11}}),
            "spec.parallelTrialCount",
        ),
        bad(
            "trial template volume named like Trainyard's config volume",
            json!({"spec": {"trialTemplate": {"volumes": [{"name": "trainyard-config", "emptyDir": {}}]}}}),
            "spec.trialTemplate.volumes",
        ),
        bad(
            "trial template resuming without checkpointing",
            json!({"spec": {"trialTemplate": {"checkpoint": {"resumeFrom": "s3://c/x"}}}}),
            "spec.trialTemplate.checkpoint.resumeFrom",
        ),
        bad(
            "trial template retention that keeps nothing",
            json!({"spec": {"trialTemplate": {"checkpoint": {"retention": {"keepLast": 0}}}}}),
            "spec.trialTemplate.checkpoint.retention.keepLast",
        ),
        bad(
            "trial template NCCL on CPU",
            json!({"spec": {"trialTemplate": {"gpusPerWorker": 0, "networking": {"backend": "nccl"}}}}),
            "spec.trialTemplate.networking.backend",
        ),
    ]
}

fn queue_bad_cases() -> Vec<Bad> {
    vec![
        bad(
            "borrowing without a cohort",
            json!({"spec": {"cohort": null, "flavors": [{"name": "a100", "nominalQuota": 8, "borrowingLimit": 4}]}}),
            "spec.flavors",
        ),
        bad(
            "lending without a cohort",
            json!({"spec": {"cohort": null, "flavors": [{"name": "a100", "nominalQuota": 8, "lendingLimit": 4}]}}),
            "spec.flavors",
        ),
        bad(
            "lending more than the quota",
            json!({"spec": {"flavors": [{"name": "a100", "nominalQuota": 8, "lendingLimit": 9}]}}),
            "spec.flavors[0].lendingLimit",
        ),
        bad(
            "borrowing MIG slices without a cohort",
            json!({"spec": {"cohort": null, "flavors": [{"name": "a100", "nominalQuota": 8,
                "migQuotas": [{"profile": "1g.10gb", "nominalQuota": 14, "borrowingLimit": 7}]}]}}),
            "spec.flavors",
        ),
        bad(
            "lending more MIG slices than the quota",
            json!({"spec": {"flavors": [{"name": "a100", "nominalQuota": 8,
                "migQuotas": [{"profile": "1g.10gb", "nominalQuota": 14, "lendingLimit": 15}]}]}}),
            "spec.flavors[0].migQuotas[0].lendingLimit",
        ),
    ]
}

#[test]
fn trainingjob_cel_rules_reject_bad_specs() {
    assert_cel_rejects(
        "TrainingJob",
        &basic_trainingjob(),
        &trainingjob_bad_cases(),
    );
}

#[test]
fn trainingjob_cel_rules_accept_good_specs() {
    assert_accepted(
        "TrainingJob",
        &basic_trainingjob(),
        &[
            (
                "resume with checkpointing enabled",
                json!({"spec": {"checkpoint": {"enabled": true, "resumeFrom": "s3://c/epoch-3",
                        "storage": {"type": "s3", "s3Bucket": "ckpt"}}}}),
            ),
            (
                "gcs with bucket",
                json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "gcs", "gcsBucket": "ckpt"}}}}),
            ),
            (
                "pvc with claim",
                json!({"spec": {"checkpoint": {"enabled": true, "storage": {"type": "pvc", "claimName": "ckpt"}}}}),
            ),
            (
                "nfs with server and path",
                json!({"spec": {"checkpoint": {"enabled": true, "storage":
                        {"type": "nfs", "nfsServer": "nfs.local", "nfsPath": "/exports/ckpt"}}}}),
            ),
            (
                "disabled checkpointing may keep a large frequency",
                json!({"spec": {"checkpoint": {"enabled": false, "frequency": 50}}}),
            ),
            (
                "checkpoint frequency auto",
                json!({"spec": {"checkpoint": {"enabled": true, "frequency": "auto"}}}),
            ),
            (
                "CPU job on gloo",
                json!({"spec": {"gpusPerWorker": 0, "networking": {"backend": "gloo"}}}),
            ),
            (
                "MIG slices",
                json!({"spec": {"gpusPerWorker": 2, "scheduling": {"migProfile": "3g.40gb"}}}),
            ),
            (
                "metrics port 29500 when master port moved",
                json!({"spec": {"monitoring": {"metricsPort": 29500}, "networking": {"masterPort": 29600}}}),
            ),
            (
                "patience below epochs",
                json!({"spec": {"successPolicy": {"earlyStoppingPatience": 9}}}),
            ),
            (
                "Never with backoff 0",
                json!({"spec": {"failurePolicy": {"restartPolicy": "Never", "backoffLimit": 0}}}),
            ),
            ("suspended", json!({"spec": {"suspend": true}})),
        ],
    );
}

#[test]
fn sweep_cel_rules_reject_bad_specs() {
    assert_cel_rejects("Sweep", &basic_sweep(), &sweep_bad_cases());
}

#[test]
fn sweep_cel_rules_accept_good_specs() {
    assert_accepted(
        "Sweep",
        &basic_sweep(),
        &[
            (
                "grid with a step on every float",
                json!({"spec": {"algorithm": {"name": "grid"}, "parameters": [
                    {"name": "dropout", "type": "float", "min": 0.1, "max": 0.5, "step": 0.1},
                    {"name": "layers", "type": "int", "min": 2, "max": 8},
                    {"name": "optimizer", "type": "categorical", "values": ["adam"]}
                ]}}),
            ),
            (
                "tpe with settings",
                json!({"spec": {"algorithm": {"name": "tpe", "settings": {"nStartupTrials": 5, "gamma": 0.2}}}}),
            ),
            (
                "asha with rungs",
                json!({"spec": {"earlyStopping": {"algorithm": "hyperband", "minResource": 1, "maxResource": 9}}}),
            ),
            (
                "parallel equal to max",
                json!({"spec": {"parallelTrialCount": 10}}),
            ),
            (
                "whole-number bounds on a float, log scale",
                json!({"spec": {"parameters": [{"name": "hidden", "type": "float", "min": 1, "max": 1024, "log": true}]}}),
            ),
            (
                "int bounds written as 2.0 and 8.0",
                json!({"spec": {"parameters": [{"name": "layers", "type": "int", "min": 2.0, "max": 8.0, "step": 2.0}]}}),
            ),
        ],
    );
}

#[test]
fn trainingqueue_cel_rules_reject_bad_specs() {
    assert_cel_rejects("TrainingQueue", &basic_queue(), &queue_bad_cases());
}

#[test]
fn trainingqueue_cel_rules_accept_good_specs() {
    assert_accepted(
        "TrainingQueue",
        &basic_queue(),
        &[
            (
                "standalone queue without limits",
                json!({"spec": {"cohort": null, "flavors": [{"name": "a100", "nominalQuota": 8}]}}),
            ),
            (
                "lend the whole quota",
                json!({"spec": {"flavors": [{"name": "a100", "nominalQuota": 8, "lendingLimit": 8}]}}),
            ),
        ],
    );
}

/// Every rule (by message) of every generated schema, with its schema location.
fn all_rules() -> Vec<(String, Value)> {
    fn walk(path: &str, node: &Value, rules: &mut Vec<(String, Value)>) {
        if let Some(list) = node
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            rules.extend(list.iter().map(|rule| (path.to_owned(), rule.clone())));
        }
        if let Some(properties) = node.get("properties").and_then(Value::as_object) {
            for (name, child) in properties {
                walk(&format!("{path}.{name}"), child, rules);
            }
        }
        if let Some(items) = node.get("items") {
            walk(&format!("{path}[]"), items, rules);
        }
        if let Some(additional) = node.get("additionalProperties").filter(|a| a.is_object()) {
            walk(&format!("{path}{{}}"), additional, rules);
        }
    }
    let mut rules = Vec::new();
    for kind in KINDS {
        walk(kind, &schema_for_kind(kind), &mut rules);
    }
    rules
}

#[test]
fn every_cel_rule_compiles_and_fits_the_cost_budget() {
    let rules = all_rules();
    assert!(
        rules.len() >= 20,
        "expected the CEL rules in the schemas, found {}",
        rules.len()
    );
    let mut failures = Vec::new();
    for kind in KINDS {
        let schema = schema_for_kind(kind);
        failures.extend(compilation_failures(
            kind,
            &kube_cel::compile_schema(&schema),
        ));
        // Scope and cost analysis of each rule against the node it sits on.
        analyze_node(kind, &schema, &mut failures);
    }
    for (path, rule) in &rules {
        for key in ["rule", "message", "fieldPath"] {
            assert!(
                rule.get(key).is_some(),
                "{path}: rule without {key}: {rule}"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn compilation_failures(path: &str, node: &kube_cel::CompiledSchema) -> Vec<String> {
    let mut failures: Vec<String> = node
        .compilation_errors()
        .into_iter()
        .map(|error| format!("{path}: {error:?}"))
        .collect();
    for (name, child) in &node.properties {
        failures.extend(compilation_failures(&format!("{path}.{name}"), child));
    }
    if let Some(items) = &node.items {
        failures.extend(compilation_failures(&format!("{path}[]"), items));
    }
    failures
}

/// kube-cel's scope check does not know macro bindings: `self.items.all(p, ...)` reports
/// `p` as an unknown variable. Such a warning is a false positive when the rule binds it.
fn is_comprehension_variable(rule: &str, warning: &kube_cel::AnalysisWarning) -> bool {
    let Some(variable) = warning.message.split('\'').nth(1) else {
        return false;
    };
    warning.kind == kube_cel::WarningKind::WrongScope
        && ["all", "exists", "exists_one", "map", "filter"]
            .iter()
            .any(|mac| rule.contains(&format!(".{mac}({variable},")))
}

fn analyze_node(path: &str, node: &Value, failures: &mut Vec<String>) {
    if let Some(list) = node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        let compiled = kube_cel::compile_schema(node);
        for rule in list
            .iter()
            .filter_map(|r| r.get("rule").and_then(Value::as_str))
        {
            for warning in
                kube_cel::analyze_rule(rule, &compiled, kube_cel::ScopeContext::CrdValidation)
            {
                if is_comprehension_variable(rule, &warning) {
                    continue;
                }
                failures.push(format!(
                    "{path}: {rule}: {:?}: {}",
                    warning.kind, warning.message
                ));
            }
        }
    }
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            analyze_node(&format!("{path}.{name}"), child, failures);
        }
    }
    if let Some(items) = node.get("items") {
        analyze_node(&format!("{path}[]"), items, failures);
    }
}

#[test]
fn every_cel_rule_is_exercised_by_a_failing_case() {
    // A rule added without a test case (or one that can never fire) fails here.
    let mut triggered = BTreeSet::new();
    triggered.extend(assert_cel_rejects(
        "TrainingJob",
        &basic_trainingjob(),
        &trainingjob_bad_cases(),
    ));
    triggered.extend(assert_cel_rejects(
        "Sweep",
        &basic_sweep(),
        &sweep_bad_cases(),
    ));
    triggered.extend(assert_cel_rejects(
        "TrainingQueue",
        &basic_queue(),
        &queue_bad_cases(),
    ));
    let untested: BTreeSet<String> = all_rules()
        .into_iter()
        .filter_map(|(path, rule)| {
            let message = rule.get("message").and_then(Value::as_str)?.to_owned();
            (!triggered.contains(&message)).then(|| format!("{path}: {message}"))
        })
        .collect();
    assert!(
        untested.is_empty(),
        "CEL rules no case triggers:\n{}",
        untested.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn cel_messages_and_validate_messages_agree() {
    // For every CEL case, validate() reports the same sentence kubectl would show.
    for (kind, base, cases) in [
        ("TrainingJob", basic_trainingjob(), trainingjob_bad_cases()),
        ("Sweep", basic_sweep(), sweep_bad_cases()),
        ("TrainingQueue", basic_queue(), queue_bad_cases()),
    ] {
        for case in cases {
            let object = merged(&base, &case.patch);
            let cel: BTreeSet<String> = cel_problems(kind, &object)
                .into_iter()
                .map(|p| p.message)
                .collect();
            let rust: BTreeSet<String> = rust_errors(kind, &object)
                .into_iter()
                .map(|e| e.message)
                .collect();
            assert!(
                cel.iter().any(|message| rust.contains(message)),
                "{kind}: {}: CEL said {cel:?}, validate() said {rust:?}",
                case.what
            );
        }
    }
}
