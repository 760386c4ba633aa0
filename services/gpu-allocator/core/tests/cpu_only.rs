//! CPU-only jobs (`gpusPerWorker: 0`): admitted when their queue admits
//! them, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

fn cpu_job(uid: &str, queue: &str, namespace: &str) -> JobSpec {
    JobSpec {
        namespace: namespace.into(),
        ..job(uid, queue, 2, 0)
    }
}

#[test]
fn a_cpu_only_job_is_admitted_at_once_without_quota_or_nodes() {
    let mut h = Harness::default_config();
    h.queue(queue("team-a", None, 0));
    h.submit(cpu_job("etl", "team-a", "default"));
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["etl"]);
    let admission = &out.admissions[0];
    assert_eq!(admission.flavor, names::CPU_ONLY_FLAVOR);
    assert_eq!(admission.queue, "team-a");
    assert!(
        admission.workers.is_empty(),
        "the scheduler places its pods"
    );
    assert!(out.pending.is_empty());
    // Replays of its submission and admission change nothing, and it is
    // not admitted twice.
    let again = Event::JobSubmitted(cpu_job("etl", "team-a", "default"));
    assert_eq!(h.alloc.apply(again).expect("accepted"), Applied::Unchanged);
    let replay = Event::Admitted(admission.clone());
    assert_eq!(h.alloc.apply(replay).expect("accepted"), Applied::Unchanged);
    assert!(h.cycle(160).admissions.is_empty());
}

#[test]
fn a_cpu_only_job_waits_while_its_queue_is_on_hold_and_starts_once_released() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut held = queue("team-a", None, 8);
    held.on_hold = true;
    h.queue(held.clone());
    h.submit_at(job("train", "team-a", 1, 4), 10);
    h.submit_at(cpu_job("etl", "team-a", "default"), 20);
    let out = h.cycle(100);
    assert!(out.admissions.is_empty());
    let why = h.reason_of(&out, "etl");
    assert!(
        matches!(*why.reason, PendingReason::QueueOnHold { .. }),
        "{why}"
    );
    // After the queue's GPU job in line.
    assert_eq!((why.position, why.queue_length), (2, 2));
    let usage = h.alloc.queue_usage();
    assert_eq!(usage[0].pending, 2, "both jobs count as pending");
    held.on_hold = false;
    h.queue(held);
    let mut started = admitted_uids(&h.cycle(160));
    started.sort_unstable();
    assert_eq!(started, vec!["etl", "train"]);
}

#[test]
fn a_cpu_only_job_of_a_namespace_its_queue_refuses_waits_with_that_reason() {
    let mut h = Harness::default_config();
    let mut closed = queue("team-a", None, 0);
    closed.namespaces = vec!["research".into()];
    h.queue(closed);
    h.submit(cpu_job("etl", "team-a", "prod"));
    h.submit(cpu_job("sweep", "team-a", "research"));
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["sweep"]);
    let why = h.reason_of(&out, "etl");
    assert!(
        matches!(&*why.reason, PendingReason::NamespaceNotAdmitted { namespace, .. } if namespace == "prod"),
        "{why}"
    );
}

#[test]
fn a_cpu_only_job_of_an_unknown_queue_waits_for_it() {
    let mut h = Harness::default_config();
    h.submit(cpu_job("etl", "nowhere", "default"));
    let out = h.cycle(100);
    assert!(out.admissions.is_empty());
    let why = h.reason_of(&out, "etl");
    assert!(
        matches!(*why.reason, PendingReason::QueueNotFound { .. }),
        "{why}"
    );
    h.queue(queue("nowhere", None, 0));
    assert_eq!(admitted_uids(&h.cycle(160)), vec!["etl"]);
}

#[test]
fn a_gpu_slice_request_without_gpus_is_rejected_naming_the_field() {
    let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
    let spec = JobSpec {
        gpu_slice: Some(GpuSliceRequest::Profile("1g.10gb".into())),
        ..job("notebook", "team-a", 1, 0)
    };
    match alloc.apply(Event::JobSubmitted(spec)) {
        Err(AllocatorError::InvalidJob { field, .. }) => assert_eq!(field, "gpusPerWorker"),
        other => panic!("expected an invalid job, got {other:?}"),
    }
}

#[test]
fn an_attempt_uid_gives_back_its_kubernetes_uid_and_attempt() {
    let uid = JobUid::for_attempt("7c9e-11", 3);
    assert_eq!(uid.as_str(), "7c9e-11/a3");
    assert_eq!(uid.attempt(), Some(("7c9e-11", 3)));
    assert_eq!(JobUid::new("plain").attempt(), None);
}
