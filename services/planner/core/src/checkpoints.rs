//! What the checkpoint-manager's decisions mean for a job's status and Events.

use trainyard_contracts::decisions::{CheckpointVerified, ModelRegistered, ResumePointChosen};

use crate::decide::{EventType, PlannerAction};
use crate::state::Observation;

/// Event reason when the checkpoint-manager found a reported checkpoint incomplete.
pub const EVENT_CHECKPOINT_INCOMPLETE: &str = "CheckpointIncomplete";
/// Event reason when a resume passed over newer, unverified checkpoints.
pub const EVENT_CHECKPOINT_SKIPPED: &str = "CheckpointSkipped";
/// Event reason when the best checkpoint became a model version.
pub const EVENT_MODEL_REGISTERED: &str = "ModelRegistered";
/// Event reason when the model registry refused the registration for good.
pub const EVENT_MODEL_REGISTRATION_FAILED: &str = "ModelRegistrationFailed";
/// Event reason when the model went to the checkpoint-manager's own registry
/// rather than the one the job's `monitoring.mlflowTrackingUri` names.
pub const EVENT_MODEL_REGISTRY_REDIRECTED: &str = "ModelRegistryRedirected";

/// The status line for where the job resumes.
pub fn resume_reason(point: &ResumePointChosen) -> String {
    let mut text = format!("resumes from {} (step {}", point.uri, point.step);
    if let Some(method) = point.verified_by {
        let method = serde_json::to_value(method)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        text.push_str(&format!(", verified by {method}"));
    }
    text.push(')');
    if !point.reason.is_empty() {
        text = format!("{}: {text}", point.reason);
    }
    match point.skipped.len() {
        0 => {}
        1 => text.push_str("; skipped 1 newer checkpoint that is not verified"),
        n => text.push_str(&format!(
            "; skipped {n} newer checkpoints that are not verified"
        )),
    }
    text
}

/// Events an observation records on the job, besides what its state change
/// leads to: a checkpoint found incomplete, newer checkpoints a resume skipped,
/// a model version registered, or the registry's refusal with its fix, and
/// why the registry is not the one the job names.
pub fn checkpoint_events(observation: &Observation) -> Vec<PlannerAction> {
    let mut events = registration_events(observation);
    if let Observation::ModelRegistered(ModelRegistered {
        tracking_warning: Some(warning),
        ..
    }) = observation
    {
        events.push(PlannerAction::RecordEvent {
            event_type: EventType::Warning,
            reason: EVENT_MODEL_REGISTRY_REDIRECTED.to_owned(),
            message: warning.clone(),
        });
    }
    events
}

fn registration_events(observation: &Observation) -> Vec<PlannerAction> {
    let warning = |reason: &str, message: String| PlannerAction::RecordEvent {
        event_type: EventType::Warning,
        reason: reason.to_owned(),
        message,
    };
    match observation {
        Observation::CheckpointVerified(CheckpointVerified {
            uri,
            step,
            verified: false,
            reason,
            ..
        }) => vec![warning(
            EVENT_CHECKPOINT_INCOMPLETE,
            format!(
                "checkpoint {uri} (step {step}) is not verified and will not be resumed from: {}",
                reason.as_deref().unwrap_or("no reason given")
            ),
        )],
        Observation::ResumePoint(point) => point
            .skipped
            .iter()
            .map(|skipped| {
                warning(
                    EVENT_CHECKPOINT_SKIPPED,
                    format!(
                        "resuming from {} (step {}), not from the newer {} (step {}): {}",
                        point.uri, point.step, skipped.uri, skipped.step, skipped.reason
                    ),
                )
            })
            .collect(),
        Observation::ModelRegistered(ModelRegistered {
            model_name,
            source,
            error: Some(error),
            ..
        }) => vec![warning(
            EVENT_MODEL_REGISTRATION_FAILED,
            format!("checkpoint {source} was not registered as model {model_name}: {error}"),
        )],
        Observation::ModelRegistered(model) => vec![PlannerAction::RecordEvent {
            event_type: EventType::Normal,
            reason: EVENT_MODEL_REGISTERED.to_owned(),
            message: format!(
                "best checkpoint {} registered as model {} version {}{}",
                model.source,
                model.model_name,
                model.version,
                model
                    .alias
                    .as_deref()
                    .map(|a| format!(" (alias @{a})"))
                    .unwrap_or_default()
            ),
        }],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use trainyard_contracts::decisions::SkippedCheckpoint;
    use trainyard_contracts::worker::VerificationMethod;

    use super::*;

    #[test]
    fn a_resume_that_skipped_an_incomplete_checkpoint_says_so_in_status_and_events() {
        let point = ResumePointChosen {
            uri: "/checkpoints/step-200".into(),
            epoch: 2,
            step: 200,
            reason: "Restarting".into(),
            verified_by: Some(VerificationMethod::TrainyardManifest),
            skipped: vec![SkippedCheckpoint {
                uri: "/checkpoints/step-300".into(),
                epoch: 3,
                step: 300,
                reason: "incomplete: model.pt is missing".into(),
            }],
        };
        assert_eq!(
            resume_reason(&point),
            "Restarting: resumes from /checkpoints/step-200 (step 200, verified by trainyard-manifest); skipped 1 newer checkpoint that is not verified"
        );
        let events = checkpoint_events(&Observation::ResumePoint(point));
        assert!(matches!(
            events.as_slice(),
            [PlannerAction::RecordEvent { event_type: EventType::Warning, reason, message }]
                if reason == EVENT_CHECKPOINT_SKIPPED && message.contains("model.pt is missing")
        ));
    }
}
