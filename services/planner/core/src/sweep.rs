//! Sweeps: a trial's TrainingJob spec from the template and the tuner's parameters,
//! and the Sweep's status from the tuner's progress record. Pure.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use trainyard_api::{
    BestTrial, Condition, ConditionStatus, RungStatus, SweepState, SweepStatus, TrainingJobSpec,
    TrialCounts,
};
use trainyard_contracts::decisions::{ParameterValue, SweepProgressed, TrialTracking};

use crate::error::PlanError;

/// Parameter names that set a field of `spec.hyperparameters`; any other name goes
/// into `hyperparameters.additionalParams` (as the Sweep CRD documents).
pub const WELL_KNOWN_HYPERPARAMETERS: [&str; 7] = [
    "learningRate",
    "batchSize",
    "epochs",
    "optimizer",
    "warmupSteps",
    "gradientAccumulationSteps",
    "mixedPrecision",
];

fn json_value(value: &ParameterValue) -> Value {
    match value {
        ParameterValue::Int(i) => Value::from(*i),
        ParameterValue::Float(f) => Value::from(*f),
        ParameterValue::Text(t) => Value::from(t.as_str()),
    }
}

fn text(value: &ParameterValue) -> String {
    match value {
        ParameterValue::Int(i) => i.to_string(),
        ParameterValue::Float(f) => f.to_string(),
        ParameterValue::Text(t) => t.clone(),
    }
}

/// The trial's spec: the template with the suggested parameters filled into its
/// hyperparameters, and the MLflow run the tuner made for it as
/// `monitoring.mlflowRunId` when the run is on the server the trial logs to
/// (the tuner names the template's server as the template writes it when it
/// recorded the run there). A value the field cannot hold (e.g. `optimizer:
/// lion`) is an error naming the parameter.
pub fn trial_spec(
    template: &TrainingJobSpec,
    parameters: &BTreeMap<String, ParameterValue>,
    tracking: Option<&TrialTracking>,
) -> Result<TrainingJobSpec, PlanError> {
    let invalid = |name: &str, problem: String| PlanError::InvalidSpec {
        errors: vec![trainyard_api::FieldError::new(
            format!("spec.parameters[{name}]"),
            trainyard_api::FieldErrorKind::Invalid,
            problem,
        )],
    };
    let mut spec = serde_json::to_value(template).map_err(|e| invalid("*", e.to_string()))?;
    let Some(root) = spec.as_object_mut() else {
        return Err(invalid("*", "the trial template is not an object".into()));
    };
    let hyperparameters = root
        .entry("hyperparameters")
        .or_insert_with(|| Value::Object(Map::new()));
    if hyperparameters.is_null() {
        *hyperparameters = Value::Object(Map::new());
    }
    let Some(hyperparameters) = hyperparameters.as_object_mut() else {
        return Err(invalid(
            "*",
            "trialTemplate.hyperparameters is not an object".into(),
        ));
    };
    for (name, value) in parameters {
        if WELL_KNOWN_HYPERPARAMETERS.contains(&name.as_str()) {
            let value = match (name.as_str(), value) {
                // Categorical booleans arrive as text.
                ("mixedPrecision", ParameterValue::Text(t)) => Value::from(t == "true"),
                _ => json_value(value),
            };
            hyperparameters.insert(name.clone(), value);
        } else {
            let extra = hyperparameters
                .entry("additionalParams")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(extra) = extra.as_object_mut() {
                extra.insert(name.clone(), Value::from(text(value)));
            }
        }
    }
    // Decoding names the offending path (e.g. spec.hyperparameters.optimizer) and
    // validates the result, as for any spec that does not come through the apiserver.
    let mut filled =
        TrainingJobSpec::from_json(spec).map_err(|errors| PlanError::InvalidSpec { errors })?;
    if let Some(tracking) = tracking {
        let monitoring = filled.monitoring.get_or_insert_default();
        let server = monitoring
            .mlflow_tracking_uri
            .get_or_insert_with(|| tracking.mlflow_tracking_uri.clone());
        // A template that logs to another server has no such run there.
        if same_server(server, &tracking.mlflow_tracking_uri) {
            monitoring.mlflow_run_id = Some(tracking.mlflow_run_id.clone());
        }
    }
    Ok(filled)
}

fn same_server(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// Reasons the tuner ends a sweep that count as success.
const SUCCESSFUL_ENDS: [&str; 3] = ["GoalReached", "MaxTrialsReached", "SearchSpaceExhausted"];

/// The Sweep's status from the tuner's latest progress record.
pub fn sweep_status(
    progress: &SweepProgressed,
    previous: Option<&SweepStatus>,
    generation: Option<i64>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> SweepStatus {
    let started = progress.pending
        + progress.running
        + progress.succeeded
        + progress.failed
        + progress.early_stopped;
    let state = match progress.finished_reason.as_deref() {
        Some(reason) if SUCCESSFUL_ENDS.contains(&reason) => SweepState::Completed,
        Some(_) => SweepState::Failed,
        None if started > 0 => SweepState::Running,
        None => SweepState::Pending,
    };
    let mut conditions = previous.map(|s| s.conditions.clone()).unwrap_or_default();
    let condition = |condition_type: &str, status, reason: &str, message: String| Condition {
        condition_type: condition_type.to_string(),
        status,
        reason: Some(reason.to_string()),
        message: Some(message),
        last_transition_time: Some(now.clone()),
        observed_generation: generation,
    };
    let running = state == SweepState::Running;
    trainyard_api::set_condition(
        &mut conditions,
        condition(
            "Running",
            if running {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            if running {
                "TrialsRunning"
            } else {
                state.as_str()
            },
            format!("{} running, {} pending", progress.running, progress.pending),
        ),
    );
    if let Some(warning) = &progress.tracking_warning {
        trainyard_api::set_condition(
            &mut conditions,
            condition(
                "TrackingRedirected",
                ConditionStatus::True,
                "TrackingUriNotAllowed",
                warning.clone(),
            ),
        );
    }
    if let Some(reason) = &progress.finished_reason {
        let (kind, status) = match state {
            SweepState::Completed => ("Succeeded", ConditionStatus::True),
            _ => ("Failed", ConditionStatus::True),
        };
        trainyard_api::set_condition(
            &mut conditions,
            condition(
                kind,
                status,
                reason,
                progress.message.clone().unwrap_or_else(|| reason.clone()),
            ),
        );
    }
    SweepStatus {
        state: Some(state),
        trials: Some(TrialCounts {
            pending: progress.pending,
            running: progress.running,
            succeeded: progress.succeeded,
            failed: progress.failed,
            early_stopped: progress.early_stopped,
        }),
        best_trial: progress.best_trial.as_ref().map(|best| BestTrial {
            name: best.trial_name.clone(),
            parameters: best
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), text(v)))
                .collect(),
            objective_value: best.objective_value,
        }),
        rungs: progress
            .rungs
            .iter()
            .enumerate()
            .map(|(rung, (resource, trials))| RungStatus {
                rung: u32::try_from(rung).unwrap_or(u32::MAX),
                resource: *resource,
                trials: *trials,
                promoted: progress.rungs.values().nth(rung + 1).copied().unwrap_or(0),
            })
            .collect(),
        conditions,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> TrainingJobSpec {
        serde_json::from_value(serde_json::json!({
            "model": "resnet", "dataset": "cifar10", "numWorkers": 1,
            "hyperparameters": {"epochs": 9, "optimizer": "adam"}
        }))
        .expect("template")
    }

    #[test]
    fn well_known_names_fill_fields_and_others_go_to_additional_params() {
        let parameters = BTreeMap::from([
            ("learningRate".to_string(), ParameterValue::Float(0.003)),
            ("batchSize".to_string(), ParameterValue::Int(64)),
            ("optimizer".to_string(), ParameterValue::Text("sgd".into())),
            ("dropout".to_string(), ParameterValue::Float(0.25)),
        ]);
        let spec = trial_spec(&template(), &parameters, None).expect("fills");
        let hp = spec.hyperparameters.expect("hyperparameters");
        assert_eq!(hp.learning_rate, Some(0.003));
        assert_eq!(hp.batch_size, Some(64));
        assert_eq!(hp.optimizer.map(|o| o.to_string()).as_deref(), Some("sgd"));
        assert_eq!(hp.epochs, Some(9), "template values stay");
        assert_eq!(
            hp.additional_params.get("dropout").map(String::as_str),
            Some("0.25")
        );
    }

    #[test]
    fn the_run_id_is_set_only_when_the_run_is_on_the_server_the_trial_logs_to() {
        let mut template = template();
        template.monitoring = Some(trainyard_api::MonitoringSpec {
            mlflow_tracking_uri: Some("http://team-mlflow:5000".into()),
            ..Default::default()
        });
        let tracking = |uri: &str| TrialTracking {
            mlflow_tracking_uri: uri.into(),
            mlflow_run_id: "run-1".into(),
        };
        let run_of = |template: &TrainingJobSpec, tracking: &TrialTracking| {
            let spec = trial_spec(template, &BTreeMap::new(), Some(tracking)).expect("fills");
            let monitoring = spec.monitoring.expect("monitoring");
            (monitoring.mlflow_tracking_uri, monitoring.mlflow_run_id)
        };
        assert_eq!(
            run_of(&template, &tracking("http://team-mlflow:5000")),
            (Some("http://team-mlflow:5000".into()), Some("run-1".into())),
            "the tuner recorded the trial on the template's server"
        );
        assert_eq!(
            run_of(&template, &tracking("http://mlflow.mlflow:5000")),
            (Some("http://team-mlflow:5000".into()), None),
            "the tuner's own server has a run the workers' server does not"
        );
        assert_eq!(
            run_of(&self::template(), &tracking("http://mlflow.mlflow:5000")),
            (
                Some("http://mlflow.mlflow:5000".into()),
                Some("run-1".into())
            ),
            "a template naming no server logs to the tuner's"
        );
    }

    #[test]
    fn a_refused_tracking_server_is_a_condition_on_the_sweep() {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        let progress = SweepProgressed {
            pending: 1,
            running: 0,
            succeeded: 0,
            failed: 0,
            early_stopped: 0,
            best_trial: None,
            rungs: BTreeMap::new(),
            finished_reason: None,
            message: None,
            objective_metric: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            tracking_warning: Some("http://evil:5000 is not allowed".into()),
        };
        let status = sweep_status(&progress, None, Some(1), now);
        let condition = status
            .conditions
            .iter()
            .find(|c| c.condition_type == "TrackingRedirected")
            .expect("condition");
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(condition.reason.as_deref(), Some("TrackingUriNotAllowed"));
        assert_eq!(
            condition.message.as_deref(),
            Some("http://evil:5000 is not allowed")
        );
    }

    #[test]
    fn a_value_the_field_cannot_hold_names_the_parameter() {
        let parameters =
            BTreeMap::from([("optimizer".to_string(), ParameterValue::Text("lion".into()))]);
        let err = trial_spec(&template(), &parameters, None)
            .expect_err("lion is no optimizer")
            .to_string();
        assert!(err.contains("optimizer"), "{err}");
    }

    #[test]
    fn status_follows_progress_and_names_the_end() {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        let mut progress = SweepProgressed {
            pending: 1,
            running: 2,
            succeeded: 3,
            failed: 0,
            early_stopped: 1,
            best_trial: None,
            rungs: BTreeMap::from([(1, 7), (3, 2)]),
            finished_reason: None,
            message: None,
            objective_metric: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            tracking_warning: None,
        };
        let running = sweep_status(&progress, None, Some(2), now.clone());
        assert_eq!(running.state, Some(SweepState::Running));
        assert_eq!(running.rungs.len(), 2);
        assert_eq!(running.rungs[0].promoted, 2);
        progress.finished_reason = Some("GoalReached".into());
        let done = sweep_status(&progress, Some(&running), Some(2), now.clone());
        assert_eq!(done.state, Some(SweepState::Completed));
        assert!(
            done.conditions
                .iter()
                .any(|c| c.condition_type == "Succeeded")
        );
        progress.finished_reason = Some("TooManyFailures".into());
        assert_eq!(
            sweep_status(&progress, None, None, now).state,
            Some(SweepState::Failed)
        );
    }
}
