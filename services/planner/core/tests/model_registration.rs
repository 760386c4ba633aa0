//! The checkpoint-manager's model registration in the job's status and Events.

mod common;

use common::{Harness, checkpoint, spec, training_job};
use planner_core::{
    EVENT_MODEL_REGISTERED, EVENT_MODEL_REGISTRATION_FAILED, EVENT_MODEL_REGISTRY_REDIRECTED,
    EventType, Observation, PlannerAction, checkpoint_events,
};
use trainyard_contracts::decisions::ModelRegistered;

fn registered(version: &str, error: Option<&str>) -> ModelRegistered {
    ModelRegistered {
        model_name: "ml-training-bert".into(),
        version: version.into(),
        source: "s3://ml-checkpoints/run/checkpoint-epoch-2".into(),
        run_id: Some("run-1".into()),
        alias: Some("best".into()),
        error: error.map(str::to_string),
        tracking_warning: None,
    }
}

fn model_status(h: &Harness) -> (Option<String>, Option<String>) {
    let checkpoint = h.status().checkpoint.unwrap_or_default();
    (checkpoint.model_name, checkpoint.model_version)
}

fn event(observation: &Observation) -> Option<(EventType, String, String)> {
    match checkpoint_events(observation).as_slice() {
        [
            PlannerAction::RecordEvent {
                event_type,
                reason,
                message,
            },
        ] => Some((*event_type, reason.clone(), message.clone())),
        _ => None,
    }
}

#[test]
fn a_registered_model_version_is_shown_in_checkpoint_status_with_an_event() {
    let mut h = Harness::new(training_job("bert", spec(1)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 2)));
    h.decide();
    assert_eq!(model_status(&h), (None, None), "nothing registered yet");

    let observation = Observation::ModelRegistered(registered("3", None));
    let (event_type, reason, message) = event(&observation).expect("one Event");
    assert_eq!(
        (event_type, reason.as_str()),
        (EventType::Normal, EVENT_MODEL_REGISTERED)
    );
    assert!(message.contains("version 3 (alias @best)"), "{message}");
    h.observe(observation);
    h.decide();
    assert_eq!(
        model_status(&h),
        (Some("ml-training-bert".into()), Some("3".into()))
    );
}

#[test]
fn a_refused_registration_is_a_warning_event_naming_the_fix_and_keeps_the_status() {
    let mut h = Harness::new(training_job("bert", spec(1)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 2)));
    h.observe(Observation::ModelRegistered(registered("3", None)));
    h.decide();

    let refused = Observation::ModelRegistered(registered(
        "",
        Some(
            "MLflow create_registered_model: HTTP 400 INVALID_PARAMETER_VALUE: Invalid model name; set annotation trainyard.dev/model-name",
        ),
    ));
    let (event_type, reason, message) = event(&refused).expect("one Event");
    assert_eq!(
        (event_type, reason.as_str()),
        (EventType::Warning, EVENT_MODEL_REGISTRATION_FAILED)
    );
    assert!(message.contains("trainyard.dev/model-name"), "{message}");
    h.observe(refused);
    h.decide();
    assert_eq!(
        model_status(&h),
        (Some("ml-training-bert".into()), Some("3".into())),
        "the version registered before stays"
    );
}

#[test]
fn a_model_registered_away_from_the_jobs_server_is_a_warning_event() {
    let mut model = registered("3", None);
    model.tracking_warning = Some(
        "spec.monitoring.mlflowTrackingUri: http://evil:5000 is not in checkpoint_manager.mlflow_allowed_tracking_uris".into(),
    );
    let events = checkpoint_events(&Observation::ModelRegistered(model));
    let reasons: Vec<(EventType, &str)> = events
        .iter()
        .filter_map(|action| match action {
            PlannerAction::RecordEvent {
                event_type, reason, ..
            } => Some((*event_type, reason.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            (EventType::Normal, EVENT_MODEL_REGISTERED),
            (EventType::Warning, EVENT_MODEL_REGISTRY_REDIRECTED)
        ]
    );
}
