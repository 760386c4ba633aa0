//! A job the gpu-allocator finds no node could ever hold stays queued, and
//! its status says so: `Schedulable: False` (reason `Unschedulable`) with the
//! field and the fix, the same words in `status.queue.reason`, a Warning
//! event once; the condition turns True when nodes that fit arrive.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Harness, admission, job_event, pending, spec, training_job};
use planner_core::{
    CONDITION_ADMITTED, CONDITION_SCHEDULABLE, EventType, Observation, PlannerAction,
    REASON_UNSCHEDULABLE,
};
use trainyard_api::{ConditionStatus, TrainingJobState};
use trainyard_contracts::decisions::{PendingExplained, Unschedulable};

const MESSAGE: &str = "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node \
                       (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers";

fn unschedulable(position: u32) -> PendingExplained {
    PendingExplained {
        message: MESSAGE.into(),
        unschedulable: Some(Box::new(Unschedulable {
            field: "spec.gpusPerWorker".into(),
            largest_node: "gpu-node-3".into(),
            largest_node_gpus: 8,
            resource: "nvidia.com/gpu".into(),
            detail: "spec.gpusPerWorker is 16 but the largest node (gpu-node-3) has 8 GPUs".into(),
            fix: "lower gpusPerWorker to at most 8 and raise numWorkers".into(),
        })),
        ..pending(position)
    }
}

fn warnings(actions: &[PlannerAction]) -> Vec<(&str, &str)> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::RecordEvent {
                event_type: EventType::Warning,
                reason,
                message,
            } => Some((reason.as_str(), message.as_str())),
            _ => None,
        })
        .collect()
}

#[test]
fn an_unschedulable_job_stays_queued_with_the_condition_and_clears_when_nodes_fit() {
    let mut h = Harness::new(training_job("wide", spec(2)));
    h.decide();
    h.observe(Observation::Job(job_event("wide", 0, true, 0)));
    h.observe(Observation::Pending(pending(3)));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));
    assert!(
        h.condition(CONDITION_SCHEDULABLE).is_none(),
        "a job waiting for quota has no Schedulable condition"
    );

    h.observe(Observation::Pending(unschedulable(3)));
    let actions = h.decide();
    assert_eq!(
        h.state_now(),
        Some(TrainingJobState::Queued),
        "it stays in its queue: a node may be added"
    );
    let schedulable = h.condition(CONDITION_SCHEDULABLE).unwrap();
    assert_eq!(schedulable.status, ConditionStatus::False);
    assert_eq!(schedulable.reason.as_deref(), Some(REASON_UNSCHEDULABLE));
    assert_eq!(schedulable.message.as_deref(), Some(MESSAGE));
    let admitted = h.condition(CONDITION_ADMITTED).unwrap();
    assert_eq!(admitted.reason.as_deref(), Some(REASON_UNSCHEDULABLE));
    let queue = h.status().queue.unwrap();
    assert_eq!(queue.reason.as_deref(), Some(MESSAGE));
    assert_eq!(queue.position, Some(3));
    assert_eq!(
        warnings(&actions),
        vec![(
            REASON_UNSCHEDULABLE,
            format!("position 3 in queue default: {MESSAGE}").as_str()
        )]
    );
    // Told again (a new position): no second Warning.
    h.observe(Observation::Pending(unschedulable(2)));
    assert!(warnings(&h.decide()).is_empty());

    // A node that fits joined: the job waits for quota again, then is admitted.
    h.observe(Observation::Pending(pending(2)));
    h.decide();
    let schedulable = h.condition(CONDITION_SCHEDULABLE).unwrap();
    assert_eq!(schedulable.status, ConditionStatus::True);
    assert_eq!(schedulable.reason.as_deref(), Some("NodesFit"));
    assert_eq!(
        h.condition(CONDITION_ADMITTED).unwrap().reason.as_deref(),
        Some("WaitingForQuota")
    );
    h.observe(Observation::Admission(admission(0, 2)));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
    assert_eq!(
        h.condition(CONDITION_SCHEDULABLE).unwrap().status,
        ConditionStatus::True
    );
}
