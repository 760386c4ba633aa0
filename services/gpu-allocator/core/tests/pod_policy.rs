//! A queue's pod policy: a job whose pods ask for what its queue does not
//! allow is never admitted, never preempts and holds no quota; it waits with
//! the field and the fix. Through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

fn asking_for(mut j: JobSpec, field: &str, kind: PodRequestKind) -> JobSpec {
    j.pod_requests.push(PodRequest {
        field: field.into(),
        kind,
    });
    j
}

fn host_path() -> PodRequestKind {
    PodRequestKind::VolumeType("hostPath".into())
}

#[test]
fn a_hostpath_job_waits_naming_the_field_and_the_fix_while_a_plain_job_is_admitted() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    h.submit_at(
        asking_for(
            job("host", "q", 1, 4),
            "spec.volumes[1].hostPath",
            host_path(),
        ),
        0,
    );
    h.submit_at(job("plain", "q", 1, 4), 1);
    let out = h.cycle(10);
    assert_eq!(admitted_uids(&out), vec!["plain"]);
    let why = h.reason_of(&out, "host");
    assert!(
        matches!(&*why.reason, PendingReason::PodPolicyRefused { queue, field, .. }
            if queue == "q" && field == "spec.volumes[1].hostPath"),
        "{:?}",
        why.reason
    );
    assert_eq!(why.position, 1, "it keeps its place in line");
    let text = why.message();
    assert!(
        text.contains("spec.volumes[1].hostPath: TrainingQueue q does not allow hostPath volumes")
            && text.contains("name a queue whose podPolicy.allowedVolumeTypes lists hostPath"),
        "{text}"
    );
    assert_eq!(why.reason.kind(), "pod_policy_refused");
}

#[test]
fn a_queue_that_allows_the_volume_type_admits_the_job() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut open = queue("q", None, 8);
    open.pod_policy.allowed_volume_types = vec!["hostPath".into()];
    h.queue(open);
    h.submit(asking_for(
        job("host", "q", 1, 4),
        "spec.volumes[0].hostPath",
        host_path(),
    ));
    assert_eq!(admitted_uids(&h.cycle(10)), vec!["host"]);
}

#[test]
fn a_priority_class_outside_the_allow_list_never_preempts_and_the_victim_runs_on() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut q = queue("q", None, 8);
    q.pod_policy.allowed_priority_classes = Some(vec!["batch".into()]);
    h.queue(q.clone());
    let mut victim = job("victim", "q", 1, 8);
    victim.priority = 1;
    h.submit(victim);
    assert_eq!(admitted_uids(&h.cycle(1)), vec!["victim"]);

    let mut urgent = asking_for(
        job("urgent", "q", 1, 8),
        "spec.scheduling.priority",
        PodRequestKind::PriorityClass("system-cluster-critical".into()),
    );
    urgent.priority = 1_000_000;
    h.submit(urgent);
    let out = h.cycle(2);
    assert!(out.preemptions.is_empty(), "{:?}", out.preemptions);
    assert!(out.admissions.is_empty());
    assert!(h.admitted("victim").is_some(), "the victim keeps its GPUs");
    let text = h.reason_of(&out, "urgent").message();
    assert!(
        text.contains("does not allow PriorityClass system-cluster-critical")
            && text.contains("allowedPriorityClasses: batch"),
        "{text}"
    );

    // Unset, the list allows any class: the same job preempts as before.
    q.pod_policy.allowed_priority_classes = None;
    h.queue(q);
    let out = h.cycle(3);
    assert_eq!(only_victims(&out), vec!["victim"]);
}

#[test]
fn an_empty_priority_class_list_allows_none_and_a_job_without_a_class_is_admitted() {
    let policy = PodPolicy {
        allowed_priority_classes: Some(Vec::new()),
        ..PodPolicy::default()
    };
    assert!(!policy.allows(&PodRequestKind::PriorityClass("batch".into())));
    assert!(PodPolicy::default().allows(&PodRequestKind::PriorityClass("batch".into())));
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut q = queue("q", None, 8);
    q.pod_policy = policy;
    h.queue(q);
    h.submit(job("plain", "q", 1, 4));
    assert_eq!(admitted_uids(&h.cycle(1)), vec!["plain"]);
}

#[test]
fn gpu_resources_beside_the_jobs_own_are_refused_by_every_queue() {
    let everything = PodPolicy {
        allowed_volume_types: vec!["hostPath".into()],
        allowed_priority_classes: None,
        allowed_extended_resources: vec!["nvidia.com/gpu.shared".into()],
        allow_unsafe_security_context: true,
    };
    let shared = PodRequestKind::UncountedGpuResource("nvidia.com/gpu.shared".into());
    assert!(!everything.allows(&shared));
    assert!(everything.allows(&PodRequestKind::UnsafeSecurityContext("x".into())));
    assert!(!PodPolicy::default().allows(&PodRequestKind::UnsafeSecurityContext("x".into())));
    assert!(!PodPolicy::default().allows(&PodRequestKind::ExtendedResource("rdma/hca".into())));

    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut q = queue("q", None, 8);
    q.pod_policy = everything;
    h.queue(q);
    h.submit(asking_for(
        job("shared", "q", 1, 1),
        "spec.resources.limits[nvidia.com/gpu.shared]",
        shared,
    ));
    let out = h.cycle(1);
    assert!(out.admissions.is_empty());
    let text = h.reason_of(&out, "shared").message();
    assert!(
        text.contains("ask with gpusPerWorker (MIG slices: scheduling.migProfile"),
        "{text}"
    );
}

#[test]
fn a_refused_cpu_only_job_waits_too() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    h.submit(asking_for(
        job("cpu", "q", 1, 0),
        "spec.securityContext.seccompProfile.type",
        PodRequestKind::UnsafeSecurityContext("seccomp profile Unconfined".into()),
    ));
    let out = h.cycle(1);
    assert!(out.admissions.is_empty());
    assert!(matches!(
        &*h.reason_of(&out, "cpu").reason,
        PendingReason::PodPolicyRefused { .. }
    ));
}
