//! Waiting for an admitted attempt's pods (`pods_ready_timeout_seconds`): pods
//! never created or never running give the GPUs back, the job queues again
//! after a growing backoff, and after `pods_ready_requeue_limit` requeues in
//! a row it fails with the cause and the fix. Time is a plain value here.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Harness, admission, applied, deleted, job_event, pod_event, spec, training_job};
use planner_core::{
    CONDITION_ADMITTED, CONDITION_FAILED, CONDITION_PODS_READY, Observation, PlannerAction,
    PlannerConfig, REASON_PODS_NOT_CREATED, REASON_PODS_NOT_READY,
};
use trainyard_api::{ConditionStatus, TrainingJobState};
use trainyard_contracts::events::{Change, ContainerWaiting, JobEventObserved, JobObserved};

const QUOTA_REFUSAL: &str = "Error creating: pods \"quota-a0-0-x7k2p\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4";

fn failed_create(name: &str, attempt: u32, message: &str) -> JobEventObserved {
    JobEventObserved {
        change: Change::Applied,
        job_name: format!("{name}-a{attempt}"),
        attempt,
        reason: "FailedCreate".into(),
        message: message.into(),
        count: 1,
    }
}

/// Creates `attempt`, admits it and sees its Job unsuspended, with no pods.
fn admitted_without_pods(h: &mut Harness, attempt: u32) -> Vec<PlannerAction> {
    let name = h.name();
    let workers = h.job.spec.num_workers;
    h.decide();
    h.observe(Observation::Job(job_event(&name, attempt, true, 0)));
    h.observe(Observation::Admission(admission(attempt, workers)));
    h.decide();
    h.observe(Observation::Job(job_event(&name, attempt, false, 0)));
    h.decide()
}

fn recreate_after(actions: &[PlannerAction]) -> Option<(u32, u64)> {
    actions.iter().find_map(|a| match a {
        PlannerAction::RecreateAfter { attempt, delay } => Some((*attempt, delay.as_secs())),
        _ => None,
    })
}

fn recheck_delays(actions: &[PlannerAction]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::RecheckAfter { delay, .. } => Some(delay.as_secs()),
            _ => None,
        })
        .collect()
}

/// Attempt `attempt` times out without pods; the job is then in its backoff.
fn time_out_without_pods(h: &mut Harness, attempt: u32) -> Vec<PlannerAction> {
    let name = h.name();
    admitted_without_pods(h, attempt);
    h.observe(Observation::JobEvent(failed_create(
        &name,
        attempt,
        QUOTA_REFUSAL,
    )));
    h.decide();
    h.advance(300);
    h.decide()
}

#[test]
fn pods_never_created_delete_the_job_give_the_gpus_back_and_requeue_after_a_backoff() {
    let mut h = Harness::new(training_job("quota", spec(2)));
    let actions = admitted_without_pods(&mut h, 0);
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
    assert!(recheck_delays(&actions).contains(&300), "{actions:?}");
    h.observe(Observation::JobEvent(failed_create(
        "quota",
        0,
        QUOTA_REFUSAL,
    )));
    h.advance(299);
    assert!(deleted(&h.decide()).is_empty(), "not before the timeout");
    assert_eq!(h.condition(CONDITION_PODS_READY), None);

    h.advance(1);
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["quota-a0"]);
    assert!(
        applied(&actions).is_empty(),
        "attempt 1 waits for its backoff"
    );
    assert_eq!(recreate_after(&actions), Some((1, 10)));
    assert_eq!(h.state_now(), Some(TrainingJobState::Pending));
    let pods_ready = h.condition(CONDITION_PODS_READY).unwrap();
    assert_eq!(pods_ready.status, ConditionStatus::False);
    assert_eq!(pods_ready.reason.as_deref(), Some(REASON_PODS_NOT_CREATED));
    assert_eq!(
        pods_ready.message.as_deref(),
        Some(
            format!("pods of attempt 0 not created within 300s: FailedCreate: {QUOTA_REFUSAL}")
                .as_str()
        )
    );
    assert_eq!(h.status().pods_ready_requeues, Some(1));
    assert_eq!(h.status().restart_count, Some(1));
    assert_eq!(
        h.condition(CONDITION_ADMITTED).unwrap().message.as_deref(),
        Some("GPUs released; attempt 1 waits for admission once created")
    );
    // What the gpu-allocator frees the GPUs on: a transition to attempt 1,
    // which finishes attempt 0's admission.
    let release = h.transitions.last().unwrap();
    assert_eq!(
        (release.from, release.to, release.restart_count),
        (
            Some(TrainingJobState::Initializing),
            TrainingJobState::Pending,
            1
        )
    );
    assert_eq!(release.reason, REASON_PODS_NOT_CREATED);
    assert!(
        h.recorded_events
            .iter()
            .any(|(warning, reason, message)| *warning
                && reason == REASON_PODS_NOT_CREATED
                && message.contains("exceeded quota")
                && message.contains("requeue 1 of 3")),
        "{:?}",
        h.recorded_events
    );
    assert_eq!(
        h.state.failed_attempts, 0,
        "no restart of backoffLimit spent"
    );

    // The deletion's echo and a replayed decision count nothing twice.
    h.observe(Observation::Job(JobObserved {
        change: Change::Deleted,
        ..job_event("quota", 0, false, 0)
    }));
    let transitions = h.transitions.len();
    let actions = h.decide();
    assert!(deleted(&actions).is_empty());
    assert_eq!(recreate_after(&actions), Some((1, 10)));
    assert_eq!(h.status().pods_ready_requeues, Some(1));
    assert_eq!(h.transitions.len(), transitions);

    h.advance(10);
    let actions = h.decide();
    let next = applied(&actions);
    assert_eq!(next[0].job_name(), "quota-a1");
    assert!(
        next[0].job_suspended(),
        "attempt 1 waits for a new admission"
    );
    assert_eq!(h.status().pods_ready_requeues, Some(1));
}

#[test]
fn workers_that_all_run_clear_the_condition_and_the_count() {
    let mut h = Harness::new(training_job("recovers", spec(2)));
    time_out_without_pods(&mut h, 0);
    h.advance(10);
    h.decide();
    admitted_without_pods(&mut h, 1);
    for index in 0..2 {
        h.observe(Observation::Pod(pod_event("recovers", 1, index, "Running")));
    }
    let actions = h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
    assert!(!recheck_delays(&actions).contains(&300));
    let pods_ready = h.condition(CONDITION_PODS_READY).unwrap();
    assert_eq!(pods_ready.status, ConditionStatus::True);
    assert_eq!(pods_ready.reason.as_deref(), Some("PodsReady"));
    assert_eq!(
        pods_ready.message.as_deref(),
        Some("all 2 workers of attempt 1 are running")
    );
    assert_eq!(h.status().pods_ready_requeues, None);

    // Workers that ran are not timed out when they end.
    h.advance(3_600);
    h.observe(Observation::Pod(pod_event("recovers", 1, 1, "Pending")));
    assert!(deleted(&h.decide()).is_empty());
}

#[test]
fn the_backoff_doubles_and_the_limit_fails_the_job_with_the_cause_and_the_fix() {
    let mut h = Harness::new(training_job("never", spec(2)));
    h.config = PlannerConfig {
        pods_ready_requeue_limit: 2,
        ..PlannerConfig::default()
    };
    let mut delays = Vec::new();
    for attempt in 0..2 {
        let actions = time_out_without_pods(&mut h, attempt);
        let (next, delay) = recreate_after(&actions).unwrap();
        assert_eq!(next, attempt + 1);
        delays.push(delay);
        h.advance(i64::try_from(delay).unwrap());
        assert_eq!(applied(&h.decide())[0].job_name(), format!("never-a{next}"));
    }
    assert_eq!(delays, [10, 20]);
    assert_eq!(h.status().pods_ready_requeues, Some(2));

    let actions = time_out_without_pods(&mut h, 2);
    assert_eq!(deleted(&actions), ["never-a2"]);
    assert_eq!(recreate_after(&actions), None);
    assert_eq!(h.state_now(), Some(TrainingJobState::Failed));
    let failed = h.condition(CONDITION_FAILED).unwrap();
    assert_eq!(failed.reason.as_deref(), Some(REASON_PODS_NOT_CREATED));
    let message = failed.message.unwrap();
    assert!(
        message.starts_with(
            "pods of attempt 2 not created within 300s: FailedCreate: Error creating: pods"
        ),
        "{message}"
    );
    assert!(
        message.contains("queued again 2 times in a row (pods_ready_requeue_limit)"),
        "{message}"
    );
    assert!(
        message.contains("raise the ResourceQuota of namespace ml-training"),
        "{message}"
    );
    assert_eq!(
        h.status().failure_reason.as_deref(),
        Some(format!("{REASON_PODS_NOT_CREATED}: {message}").as_str())
    );
    let failed = h.transitions.last().unwrap();
    assert_eq!(failed.to, TrainingJobState::Failed);
    assert!(
        failed
            .context
            .fix
            .as_deref()
            .is_some_and(|fix| fix.starts_with("Kubernetes refused the workers' pods")),
        "the notifier gets the fix: {:?}",
        failed.context.fix
    );
}

#[test]
fn pods_that_exist_but_do_not_run_are_named_with_their_waiting_reason() {
    let mut h = Harness::new(training_job("badimage", spec(2)));
    admitted_without_pods(&mut h, 0);
    h.observe(Observation::Pod(pod_event("badimage", 0, 0, "Running")));
    let mut stuck = pod_event("badimage", 0, 1, "Pending");
    stuck.waiting = Some(ContainerWaiting {
        reason: "ImagePullBackOff".into(),
        message: Some("Back-off pulling image \"registry.local/trainer:nope\"".into()),
    });
    h.observe(Observation::Pod(stuck));
    h.decide();
    h.advance(300);
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["badimage-a0"]);
    let pods_ready = h.condition(CONDITION_PODS_READY).unwrap();
    assert_eq!(pods_ready.reason.as_deref(), Some(REASON_PODS_NOT_READY));
    assert_eq!(
        pods_ready.message.as_deref(),
        Some(
            "1 of 2 workers of attempt 0 not running within 300s: worker 1: ImagePullBackOff: Back-off pulling image \"registry.local/trainer:nope\""
        )
    );
}

#[test]
fn a_missing_priority_class_is_named_and_no_timeout_means_no_requeue() {
    let refusal = "Error creating: pods \"gold-a0-0-abcde\" is forbidden: no PriorityClass with name gold was found";
    let mut h = Harness::new(training_job("gold", spec(1)));
    h.config = PlannerConfig {
        pods_ready_requeue_limit: 0,
        ..PlannerConfig::default()
    };
    admitted_without_pods(&mut h, 0);
    h.observe(Observation::JobEvent(failed_create("gold", 0, refusal)));
    h.advance(300);
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Failed));
    let message = h.condition(CONDITION_FAILED).unwrap().message.unwrap();
    assert!(
        message.contains("no PriorityClass with name gold was found"),
        "{message}"
    );
    assert!(message.contains("create the PriorityClass"), "{message}");

    let mut h = Harness::new(training_job("patient", spec(1)));
    h.config = PlannerConfig {
        pods_ready_timeout_seconds: 0,
        ..PlannerConfig::default()
    };
    admitted_without_pods(&mut h, 0);
    h.advance(86_400);
    assert!(deleted(&h.decide()).is_empty());
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
}
