//! Suspension for idle GPUs, message by message: a checkpoint first, the
//! suspension only once a checkpoint written since is verified, never
//! without one, and resuming with `spec.suspend: false`.

#![allow(clippy::unwrap_used)]

mod common;

use chrono::TimeDelta;
use common::{Harness, checkpoint, deleted, job_event, spec, training_job};
use planner_core::{
    CONDITION_SUSPENDED, Observation, PlannerAction, PlannerCommand, REASON_IDLE_CHECKPOINTING,
    REASON_IDLE_SUSPEND_SKIPPED, REASON_IDLE_SUSPENDED, REASON_IDLE_SUSPENDING,
};
use trainyard_api::TrainingJobState;
use trainyard_contracts::cost::IdleSuspendRequested;
use trainyard_contracts::decisions::CheckpointVerified;

fn idle_request(h: &Harness, attempt: u32) -> IdleSuspendRequested {
    IdleSuspendRequested {
        attempt,
        idle_since: h.now - TimeDelta::minutes(40),
        utilization: 0.01,
        message: "GPUs idle (1% < 5%) since 09:20".into(),
    }
}

fn verified(step: u64, ok: bool) -> CheckpointVerified {
    CheckpointVerified {
        uri: format!("s3://ml-checkpoints/run/checkpoint-step-{step}"),
        epoch: 3,
        step,
        verified: ok,
        method: None,
        verifier: Some("checkpoint-manager".into()),
        checksums: true,
        reason: None,
        latest_verified: None,
        best: None,
        count: 1,
    }
}

fn suspends(actions: &[PlannerAction]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, PlannerAction::SuspendJob { .. }))
}

fn suspended_reason(h: &Harness) -> Option<String> {
    h.condition(CONDITION_SUSPENDED).and_then(|c| c.reason)
}

#[test]
fn an_idle_job_is_checkpointed_then_suspended_once_the_checkpoint_is_verified() {
    let mut h = Harness::new(training_job("bert", spec(2)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 2)));
    h.observe(Observation::IdleSuspend(idle_request(&h, 0)));
    let actions = h.decide();
    assert!(!suspends(&actions), "no suspension before a checkpoint");
    assert!(deleted(&actions).is_empty(), "the workers keep running");
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
    assert_eq!(
        suspended_reason(&h).as_deref(),
        Some(REASON_IDLE_CHECKPOINTING)
    );
    let [PlannerCommand::CheckpointNow(request)] = h.commands.as_slice() else {
        panic!("one checkpoint request: {:?}", h.commands);
    };
    assert!(request.reason.contains("idle"), "{}", request.reason);

    // A verification of the checkpoint known before the request does not count.
    h.advance(5);
    h.observe(Observation::CheckpointVerified(verified(200, true)));
    assert!(!suspends(&h.decide()));
    // Nor does a checkpoint found incomplete.
    h.observe(Observation::CheckpointVerified(verified(300, false)));
    assert!(!suspends(&h.decide()));
    assert_eq!(h.commands.len(), 1, "the checkpoint is asked for once");

    h.observe(Observation::CheckpointVerified(verified(300, true)));
    let actions = h.decide();
    assert!(
        suspends(&actions),
        "suspended after the verified checkpoint"
    );
    assert_eq!(
        suspended_reason(&h).as_deref(),
        Some(REASON_IDLE_SUSPENDING)
    );

    // The shell set spec.suspend: the job stops the way a user's suspend stops it.
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["bert-a0"]);
    assert_eq!(h.state_now(), Some(TrainingJobState::Suspended));
    let condition = h.condition(CONDITION_SUSPENDED).unwrap();
    assert!(condition.is_true());
    assert_eq!(condition.reason.as_deref(), Some(REASON_IDLE_SUSPENDED));
    let message = condition.message.unwrap_or_default();
    assert!(message.contains("utilisation 1%"), "{message}");
    assert!(message.contains("checkpoint-step-300"), "{message}");
    assert!(
        message.contains(
            "kubectl patch trainingjob bert -n ml-training --type merge -p '{\"spec\":{\"suspend\":false}}'"
        ),
        "{message}"
    );
    assert_eq!(
        h.transitions.last().map(|t| t.reason.as_str()),
        Some(REASON_IDLE_SUSPENDED)
    );

    // Resuming: a new attempt, and the old request does not suspend it again.
    let mut gone = job_event("bert", 0, false, 0);
    gone.change = trainyard_contracts::events::Change::Deleted;
    h.observe(Observation::Job(gone));
    h.decide();
    h.job.spec.suspend = Some(false);
    h.job.metadata.generation = Some(4);
    h.run_attempt_until_running(1);
    assert!(!suspends(&h.decide()));
    assert_ne!(suspended_reason(&h).as_deref(), Some(REASON_IDLE_SUSPENDED));
}

#[test]
fn an_idle_job_without_a_verified_checkpoint_by_the_deadline_keeps_running() {
    let mut h = Harness::new(training_job("bert", spec(1)));
    h.run_attempt_until_running(0);
    h.observe(Observation::IdleSuspend(idle_request(&h, 0)));
    h.decide();
    h.advance(i64::from(h.config.stop_grace_period_seconds) + 1);
    let actions = h.decide();
    assert!(!suspends(&actions));
    assert!(deleted(&actions).is_empty());
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
    assert_eq!(
        suspended_reason(&h).as_deref(),
        Some(REASON_IDLE_SUSPEND_SKIPPED)
    );
    assert!(
        h.recorded_events
            .iter()
            .any(|(warning, reason, _)| *warning && reason == REASON_IDLE_SUSPEND_SKIPPED),
        "{:?}",
        h.recorded_events
    );
    // The request has lapsed: a checkpoint verified later does not stop a
    // job that was told it keeps running.
    h.observe(Observation::CheckpointVerified(verified(500, true)));
    assert!(!suspends(&h.decide()));
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
}

#[test]
fn an_idle_request_for_another_attempt_changes_nothing() {
    let mut h = Harness::new(training_job("bert", spec(1)));
    h.run_attempt_until_running(0);
    let before = h.status();
    h.observe(Observation::IdleSuspend(idle_request(&h, 3)));
    let actions = h.decide();
    assert!(!suspends(&actions));
    assert!(h.commands.is_empty());
    assert_eq!(h.status().conditions, before.conditions);
}
