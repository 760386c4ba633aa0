mod fixtures;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::runtime::watcher::Event;
use trainyard_api::TrainingJob;
use trainyard_contracts::events::{Change, NodeObserved};
use trainyard_watcher::gpu_usage::{GpuNode, Usage};
use trainyard_watcher::mapping::{ChangePayload, Watched};
use trainyard_watcher::relist::Relist;

#[test]
fn node_keeps_only_what_scheduling_needs() {
    let event = GpuNode::idle(fixtures::gpu_node("gpu-1", "n1", "5"))
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
    assert_eq!(node.allocatable_cpu_millis, Some(96_000));
    assert_eq!(node.allocatable_memory_bytes, None, "absent, not 0");
}

/// The node event of `node` with `allocatable` cpu and memory, and the warnings logged making it.
fn with_allocatable(cpu: &str, memory: &str) -> (NodeObserved, Vec<String>) {
    let mut node = fixtures::gpu_node("gpu-1", "n1", "5");
    let allocatable = node
        .status
        .get_or_insert_default()
        .allocatable
        .get_or_insert_default();
    allocatable.insert("cpu".into(), Quantity(cpu.into()));
    allocatable.insert("memory".into(), Quantity(memory.into()));
    let (event, warnings) = fixtures::warnings(|| GpuNode::idle(node).to_event(Change::Applied));
    let ChangePayload::Node(node) = event.expect("a node event").payload else {
        panic!("node payload expected")
    };
    (*node, warnings)
}

#[test]
fn node_publishes_its_allocatable_cpu_and_memory() {
    let (node, warnings) = with_allocatable("64", "512Gi");
    assert_eq!(node.allocatable_cpu_millis, Some(64_000));
    assert_eq!(node.allocatable_memory_bytes, Some(512 << 30));
    assert!(warnings.is_empty(), "{warnings:?}");
    let (node, _) = with_allocatable("7910m", "128974848");
    assert_eq!(
        (node.allocatable_cpu_millis, node.allocatable_memory_bytes),
        (Some(7910), Some(128_974_848))
    );
}

#[test]
fn a_node_quantity_that_does_not_parse_is_absent_and_logged() {
    let (node, warnings) = with_allocatable("lots", "16GB");
    assert_eq!(node.allocatable_cpu_millis, None);
    assert_eq!(node.allocatable_memory_bytes, None);
    assert_eq!(node.allocatable_gpus, 8, "the rest of the node is read");
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("object=node gpu-1")
            && warnings[0].contains("field=status.allocatable[cpu]"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("field=status.allocatable[memory]"),
        "{warnings:?}"
    );
}

#[test]
fn a_node_change_id_carries_the_cpu_and_memory_other_pods_hold() {
    let id = |used: Usage| {
        GpuNode {
            node: fixtures::gpu_node("gpu-1", "n1", "5"),
            used_by_other_pods: used,
            usage_change: None,
        }
        .to_event(Change::Applied)
        .expect("a node event")
        .message_id
    };
    let daemon_sets = Usage {
        cpu_millis: 250,
        memory_bytes: 1 << 30,
        ..Usage::default()
    };
    assert_eq!(
        id(daemon_sets.clone()),
        "n1:5:used=0,cpu=250m,memory=1073741824"
    );
    let more_memory = Usage {
        memory_bytes: 2 << 30,
        ..daemon_sets.clone()
    };
    assert_eq!(id(more_memory), "n1:5:used=0,cpu=250m,memory=2147483648");
    let with_gpus = Usage {
        gpus: 2,
        mig: [("1g.10gb".to_owned(), 1)].into(),
        ..daemon_sets
    };
    assert_eq!(
        id(with_gpus),
        "n1:5:used=2,1g.10gb=1,cpu=250m,memory=1073741824"
    );
    assert_eq!(id(Usage::default()), "n1:5", "nothing used");
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
fn a_gated_pods_gates_are_published_and_their_removal_is_a_change() {
    let mut relist = Relist::default();
    let mut gated = fixtures::worker_pod("bert", 2, None);
    let spec = gated.spec.get_or_insert_default();
    spec.node_name = None;
    spec.scheduling_gates = serde_json::from_value(
        serde_json::json!([{"name": "trainyard.dev/placement"}, {"name": "example.com/other"}]),
    )
    .expect("gates");
    let published = relist.on_event(Event::Apply(gated.clone()));
    let [event] = published.as_slice() else {
        panic!("one event expected: {published:?}")
    };
    let ChangePayload::Pod(pod) = &event.payload else {
        panic!("pod payload expected")
    };
    assert_eq!(
        pod.scheduling_gates,
        ["trainyard.dev/placement", "example.com/other"]
    );
    let mut ungated = gated;
    ungated.metadata.resource_version = Some("8".into());
    ungated
        .spec
        .get_or_insert_default()
        .scheduling_gates
        .clear();
    assert_eq!(ids(&relist.on_event(Event::Apply(ungated))), ["pod-2:8"]);
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

/// A TrainingJob at `generation` with the given status, as the API server stores it.
fn job_with_status(rv: &str, generation: i64, status: serde_json::Value) -> TrainingJob {
    let mut job = fixtures::training_job("a", "ua", rv);
    job.metadata.generation = Some(generation);
    job.status = serde_json::from_value(status).expect("valid status");
    job
}

fn applied(relist: &mut Relist, job: TrainingJob) -> Vec<String> {
    ids(&relist.on_event(Event::Apply(job)))
}

#[test]
fn status_writes_consumers_do_not_act_on_are_not_published() {
    let mut relist = Relist::default();
    let queued = serde_json::json!({"state": "Queued"});
    assert_eq!(
        applied(&mut relist, job_with_status("1", 1, queued)),
        ["ua:1"]
    );
    // The planner's own writes: a state short of the end, progress.
    let running = serde_json::json!({"state": "Running", "currentEpoch": 2});
    assert!(applied(&mut relist, job_with_status("2", 1, running.clone())).is_empty());
    assert!(
        applied(
            &mut relist,
            job_with_status(
                "3",
                1,
                serde_json::json!({"state": "Running", "currentEpoch": 3})
            )
        )
        .is_empty()
    );
    let mut finalized = job_with_status("4", 1, running.clone());
    finalized.metadata.finalizers = Some(vec!["trainyard.dev/cleanup".into()]);
    assert!(
        applied(&mut relist, finalized).is_empty(),
        "the planner's finalizer"
    );
    assert_eq!(relist.take_unchanged(), 3);
    assert_eq!(relist.take_unchanged(), 0, "taken once");

    // What consumers act on: a new attempt, the spec, metadata, the end.
    let restarted = serde_json::json!({"state": "Queued", "restartCount": 1});
    assert_eq!(
        applied(&mut relist, job_with_status("5", 1, restarted.clone())),
        ["ua:5"]
    );
    assert_eq!(
        applied(&mut relist, job_with_status("6", 2, restarted.clone())),
        ["ua:6"],
        "spec changed"
    );
    let mut labelled = job_with_status("7", 2, restarted.clone());
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "nlp".into());
    assert_eq!(applied(&mut relist, labelled.clone()), ["ua:7"]);
    let mut deleting = labelled.clone();
    deleting.metadata.resource_version = Some("8".into());
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-26T08:00:00Z".parse().expect("time"),
        ));
    assert_eq!(applied(&mut relist, deleting), ["ua:8"]);
    let mut finished = labelled;
    finished.metadata.resource_version = Some("9".into());
    finished.status =
        serde_json::from_value(serde_json::json!({"state": "Completed", "restartCount": 1}))
            .expect("valid status");
    assert_eq!(applied(&mut relist, finished), ["ua:9"], "finished");
    assert_eq!(relist.take_unchanged(), 0);
}

/// The gpu-allocator holds an attempt while the planner waits out its
/// backoff, and queues it when the planner clears `requeueAt`: both writes
/// are published, though the state and the attempt stay the same.
#[test]
fn the_start_and_end_of_a_backoff_are_published() {
    let mut relist = Relist::default();
    let backing_off = serde_json::json!({"state": "Pending", "restartCount": 1,
                                         "requeueAt": "2026-11-26T08:00:00Z"});
    assert_eq!(
        applied(&mut relist, job_with_status("1", 1, backing_off)),
        ["ua:1"]
    );
    let created = serde_json::json!({"state": "Pending", "restartCount": 1});
    assert_eq!(
        applied(&mut relist, job_with_status("2", 1, created.clone())),
        ["ua:2"]
    );
    assert!(applied(&mut relist, job_with_status("3", 1, created)).is_empty());
}

#[test]
fn without_a_generation_every_change_is_published() {
    let mut relist = Relist::default();
    for rv in ["1", "2"] {
        let mut job = fixtures::training_job("a", "ua", rv);
        job.status =
            serde_json::from_value(serde_json::json!({"state": "Running"})).expect("valid status");
        assert_eq!(applied(&mut relist, job), [format!("ua:{rv}")]);
    }
}

#[test]
fn a_relist_skips_unchanged_jobs_and_still_reports_what_vanished() {
    let mut relist = Relist::default();
    let status = serde_json::json!({"state": "Running"});
    assert_eq!(
        applied(&mut relist, job_with_status("1", 1, status.clone())),
        ["ua:1"]
    );
    let mut relisted = Vec::new();
    for event in [
        Event::Init,
        Event::InitApply(job_with_status("2", 1, status)),
        Event::InitDone,
    ] {
        relisted.extend(relist.on_event::<TrainingJob>(event));
    }
    assert!(
        relisted.is_empty(),
        "a progress write while the watch was down"
    );
    assert_eq!(relist.len(), 1, "still known: listed again");
    let gone: Vec<_> = [Event::Init, Event::InitDone]
        .into_iter()
        .flat_map(|event| relist.on_event::<TrainingJob>(event))
        .collect();
    assert_eq!(ids(&gone), ["ua:deleted"]);
}

#[test]
fn pod_and_node_changes_that_report_nothing_new_are_not_published() {
    let mut relist = Relist::default();
    let running = fixtures::worker_pod("bert", 0, None);
    assert_eq!(
        ids(&relist.on_event(Event::Apply(running.clone()))),
        ["pod-0:7"]
    );
    // The kubelet rewrites a condition's times; the API server bumps the version.
    let mut rewritten = running.clone();
    rewritten.metadata.resource_version = Some("8".into());
    rewritten.metadata.finalizers = Some(vec!["batch.kubernetes.io/job-tracking".into()]);
    assert!(relist.on_event(Event::Apply(rewritten)).is_empty());
    let mut failed = fixtures::worker_pod("bert", 0, Some(137));
    failed.metadata.resource_version = Some("9".into());
    assert_eq!(ids(&relist.on_event(Event::Apply(failed))), ["pod-0:9"]);

    let node = fixtures::gpu_node("gpu-1", "n1", "5");
    assert_eq!(
        ids(&relist.on_event(Event::Apply(GpuNode::idle(node.clone())))),
        ["n1:5"]
    );
    let mut heartbeat = node.clone();
    heartbeat.metadata.resource_version = Some("6".into());
    heartbeat
        .status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()[0]
        .last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-26T08:00:00Z".parse().expect("time"),
    ));
    assert!(
        relist
            .on_event(Event::Apply(GpuNode::idle(heartbeat)))
            .is_empty()
    );
    let mut uncordoned = node;
    uncordoned.metadata.resource_version = Some("7".into());
    uncordoned.spec.get_or_insert_default().unschedulable = Some(false);
    assert_eq!(
        ids(&relist.on_event(Event::Apply(GpuNode::idle(uncordoned)))),
        ["n1:7"]
    );
    assert_eq!(relist.take_unchanged(), 2);

    let deleted = relist.on_event(Event::Delete(GpuNode::idle(fixtures::gpu_node(
        "gpu-1", "n1", "8",
    ))));
    assert_eq!(
        ids(&deleted),
        ["n1:deleted"],
        "deletions are always published"
    );
}

#[test]
fn a_waiting_container_is_published_with_its_reason_and_message() {
    let mut pod = fixtures::worker_pod("bert", 1, None);
    pod.status = Some(
        serde_json::from_value(serde_json::json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": "worker", "image": "registry.local/trainer:nope", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                                      "message": "Back-off pulling image \"registry.local/trainer:nope\""}}
            }]
        }))
        .expect("a pod status"),
    );
    let ChangePayload::Pod(pod) = pod.to_event(Change::Applied).expect("owned pod").payload else {
        panic!("pod payload expected")
    };
    let waiting = pod.waiting.expect("waiting");
    assert_eq!(waiting.reason, "ImagePullBackOff");
    assert_eq!(
        waiting.message.as_deref(),
        Some("Back-off pulling image \"registry.local/trainer:nope\"")
    );
}

fn event(kind: &str, name: &str, reason: &str) -> k8s_openapi::api::core::v1::Event {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{name}.1"), "namespace": "ml", "uid": "ev1", "resourceVersion": "7"},
        "involvedObject": {"kind": kind, "name": name, "namespace": "ml", "apiVersion": "batch/v1"},
        "reason": reason,
        "type": "Warning",
        "message": "Error creating: pods \"bert-a2-0-x\" is forbidden: no PriorityClass with name gold was found",
        "count": 4,
    }))
    .expect("an event")
}

#[test]
fn failed_create_events_of_planner_jobs_are_published_under_their_training_job() {
    let published = event("Job", "bert-a2", "FailedCreate")
        .to_event(Change::Applied)
        .expect("a planner Job's refusal");
    assert_eq!(published.entity.key(), "ml/bert");
    assert_eq!(published.message_id, "ev1:7");
    let ChangePayload::JobEvent(refusal) = published.payload else {
        panic!("job event payload expected")
    };
    assert_eq!((refusal.job_name.as_str(), refusal.attempt), ("bert-a2", 2));
    assert_eq!(refusal.count, 4);
    assert!(
        refusal
            .message
            .ends_with("no PriorityClass with name gold was found")
    );

    for (kind, name, reason) in [
        ("Job", "bert-a2", "SuccessfulCreate"),
        ("Pod", "bert-a2", "FailedCreate"),
        ("Job", "nightly-backup", "FailedCreate"),
        ("Job", "bert-a", "FailedCreate"),
    ] {
        assert!(
            event(kind, name, reason)
                .to_event(Change::Applied)
                .is_none(),
            "{kind} {name} {reason}"
        );
    }
}
