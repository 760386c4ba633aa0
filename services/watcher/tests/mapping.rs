mod fixtures;

use kube::runtime::watcher::Event;
use trainyard_api::TrainingJob;
use trainyard_contracts::events::Change;
use trainyard_watcher::mapping::{ChangePayload, Watched};
use trainyard_watcher::relist::Relist;

#[test]
fn node_keeps_only_what_scheduling_needs() {
    let event = fixtures::gpu_node("gpu-1", "n1", "5")
        .to_event(Change::Applied)
        .expect("a node event");
    assert_eq!(event.message_id, "n1:5");
    assert_eq!(event.entity.namespace, "", "nodes are cluster-scoped");
    let ChangePayload::Node(node) = event.payload else {
        panic!("node payload expected")
    };
    assert_eq!(node.allocatable_gpus, 8);
    assert_eq!(node.mig.get("1g.10gb"), Some(&7));
    assert!(node.unschedulable && node.ready);
    assert_eq!(node.taints[0].key, "nvidia.com/gpu");
    assert_eq!(node.labels["karpenter.sh/capacity-type"], "spot");
}

#[test]
fn pods_are_published_under_their_training_job_with_exit_codes() {
    let event = fixtures::worker_pod("bert", 1, Some(137))
        .to_event(Change::Applied)
        .expect("owned pod");
    assert_eq!(event.entity.key(), "ml/bert");
    let ChangePayload::Pod(pod) = event.payload else {
        panic!("pod payload expected")
    };
    assert_eq!(
        (pod.index, pod.attempt, pod.phase.as_str()),
        (1, 1, "Failed")
    );
    assert_eq!(pod.termination.expect("terminated").exit_code, 137);
    assert!(!pod.ready);
}

#[test]
fn published_objects_carry_no_managed_fields() {
    let mut job = fixtures::training_job("a", "ua", "1");
    job.metadata.managed_fields = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            operation: Some("Apply".into()),
            ..Default::default()
        },
    ]);
    let event = job.to_event(Change::Applied).expect("a trainingjob event");
    let ChangePayload::TrainingJob(changed) = event.payload else {
        panic!("trainingjob payload expected")
    };
    assert_eq!(changed.object.metadata.managed_fields, None);
    assert_eq!(changed.object.metadata.name.as_deref(), Some("a"));
}

#[test]
fn jobs_trainyard_does_not_own_are_ignored() {
    assert!(fixtures::foreign_job().to_event(Change::Applied).is_none());
}

fn ids(events: &[trainyard_watcher::mapping::ChangeEvent]) -> Vec<String> {
    events.iter().map(|e| e.message_id.clone()).collect()
}

#[test]
fn relist_republishes_the_same_ids_and_reports_what_vanished() {
    let mut relist = Relist::default();
    let a = fixtures::training_job("a", "ua", "1");
    let b = fixtures::training_job("b", "ub", "1");
    let mut first = Vec::new();
    for event in [
        Event::Init,
        Event::InitApply(a.clone()),
        Event::InitApply(b),
        Event::InitDone,
    ] {
        first.extend(relist.on_event::<TrainingJob>(event));
    }
    assert_eq!(ids(&first), ["ua:1", "ub:1"]);

    // The watch restarts; b was deleted while it was down.
    let mut second = Vec::new();
    for event in [Event::Init, Event::InitApply(a), Event::InitDone] {
        second.extend(relist.on_event::<TrainingJob>(event));
    }
    assert_eq!(
        ids(&second),
        ["ua:1", "ub:deleted"],
        "a keeps its id, so JetStream drops it"
    );
    let ChangePayload::TrainingJob(deleted) = &second[1].payload else {
        panic!("trainingjob payload expected")
    };
    assert_eq!(deleted.change, Change::Deleted);
    assert_eq!(relist.len(), 1);
}

#[test]
fn plain_deletes_and_updates_map_one_to_one() {
    let mut relist = Relist::default();
    let updated = relist.on_event(Event::Apply(fixtures::training_job("a", "ua", "2")));
    assert_eq!(ids(&updated), ["ua:2"]);
    let deleted = relist.on_event(Event::Delete(fixtures::training_job("a", "ua", "3")));
    assert_eq!(ids(&deleted), ["ua:deleted"]);
    assert!(relist.is_empty());
}
