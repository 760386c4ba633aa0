//! A job whose pods ask for something only its queue's pod policy may allow
//! (a hostPath volume, a PriorityClass, ...) gets no Job, not even a
//! suspended one, until the gpu-allocator admits it; while its queue refuses
//! it, it stays Queued with `Admitted: False` (reason `PodPolicyRefused`)
//! naming the field and the fix, and a Warning Event once.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Harness, admission, applied, pending, spec, training_job};
use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume};
use planner_core::{
    CONDITION_ADMITTED, EventType, Observation, PlannerAction, REASON_POD_POLICY_REFUSED,
};
use trainyard_api::{ConditionStatus, TrainingJobSpec, TrainingJobState};
use trainyard_contracts::decisions::{PendingExplained, PodPolicyRefusal};

const MESSAGE: &str = "spec.volumes[0].hostPath: TrainingQueue default does not allow hostPath \
                       volumes (spec.podPolicy.allowedVolumeTypes: none); remove \
                       spec.volumes[0].hostPath, or name a queue whose \
                       podPolicy.allowedVolumeTypes lists hostPath";

fn with_host_path(mut spec: TrainingJobSpec) -> TrainingJobSpec {
    spec.volumes = vec![Volume {
        name: "host".into(),
        host_path: Some(HostPathVolumeSource {
            path: "/".into(),
            ..HostPathVolumeSource::default()
        }),
        ..Volume::default()
    }];
    spec
}

fn refused(position: u32) -> PendingExplained {
    PendingExplained {
        message: MESSAGE.into(),
        pod_policy: Some(Box::new(PodPolicyRefusal {
            field: "spec.volumes[0].hostPath".into(),
            detail: "TrainingQueue default does not allow hostPath volumes".into(),
            fix: "remove spec.volumes[0].hostPath".into(),
        })),
        ..pending(position)
    }
}

fn warnings(actions: &[PlannerAction]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::RecordEvent {
                event_type: EventType::Warning,
                reason,
                ..
            } => Some(reason.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_refused_job_gets_no_job_and_a_condition_naming_the_field_and_the_fix() {
    let mut h = Harness::new(training_job("host", with_host_path(spec(2))));
    let actions = h.decide();
    assert!(
        applied(&actions).is_empty(),
        "no suspended Job before the queue allowed it"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));

    h.observe(Observation::Pending(refused(1)));
    let actions = h.decide();
    assert!(applied(&actions).is_empty());
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));
    let admitted = h.condition(CONDITION_ADMITTED).unwrap();
    assert_eq!(admitted.status, ConditionStatus::False);
    assert_eq!(admitted.reason.as_deref(), Some(REASON_POD_POLICY_REFUSED));
    assert_eq!(
        admitted.message.as_deref(),
        Some(format!("position 1 in queue default: {MESSAGE}").as_str())
    );
    assert_eq!(warnings(&actions), [REASON_POD_POLICY_REFUSED]);
    h.observe(Observation::Pending(refused(1)));
    assert!(warnings(&h.decide()).is_empty(), "a Warning once");
}

#[test]
fn an_allowed_job_gets_its_job_unsuspended_once_admitted() {
    let mut h = Harness::new(training_job("host", with_host_path(spec(2))));
    assert!(applied(&h.decide()).is_empty());
    h.observe(Observation::Admission(admission(0, 2)));
    let actions = h.decide();
    let objects = applied(&actions);
    assert_eq!(objects.len(), 1);
    assert!(
        !objects[0].job_suspended(),
        "created running, never suspended"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Pending));
}

#[test]
fn a_job_that_needs_no_permission_still_gets_its_suspended_job_at_once() {
    let mut h = Harness::new(training_job("plain", spec(2)));
    let actions = h.decide();
    let objects = applied(&actions);
    assert_eq!(objects.len(), 1);
    assert!(objects[0].job_suspended());
}
