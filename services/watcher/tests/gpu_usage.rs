//! GPUs, CPU and memory held by pods the gpu-allocator did not place:
//! counted per node and carried by the node's events.

mod fixtures;

use kube::runtime::watcher::Event;
use serde_json::json;
use trainyard_contracts::events::NodeObserved;
use trainyard_watcher::gpu_usage::{GpuNode, NodeUsage, OtherPod, Usage};
use trainyard_watcher::mapping::{ChangePayload, Watched};
use trainyard_watcher::relist::Relist;

fn other_pod(
    uid: &str,
    rv: &str,
    node: Option<&str>,
    phase: &str,
    spec: serde_json::Value,
) -> OtherPod {
    let mut spec = spec;
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "serving", "uid": uid, "resourceVersion": rv},
        "spec": spec,
        "status": {"phase": phase},
    }))
    .expect("valid pod")
}

/// One container requesting `cpu` and `memory`, and no GPU.
fn cpu_memory(cpu: &str, memory: &str) -> serde_json::Value {
    json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]})
}

fn gpus(n: u32) -> serde_json::Value {
    json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": n.to_string()}}}]})
}

/// What the published event of each node event says: (message id, GPUs used by others).
fn published(relist: &mut Relist, events: Vec<Event<GpuNode>>) -> Vec<(String, u32)> {
    events
        .into_iter()
        .flat_map(|event| relist.on_event(event))
        .map(|change| {
            let ChangePayload::Node(node) = &change.payload else {
                panic!("node payload expected")
            };
            (change.message_id.clone(), node.gpus_used_by_other_pods)
        })
        .collect()
}

#[test]
fn a_pod_holds_its_containers_sum_or_its_largest_init_container_while_bound_and_running() {
    let held = |pod: &OtherPod| {
        pod.held()
            .map(|(node, usage)| (node, usage.gpus, usage.mig))
    };
    let spec = json!({
        "containers": [
            {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "2"}}},
            {"name": "cpu-only", "resources": {"requests": {"cpu": "4"}}},
        ],
        "initContainers": [{"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
    });
    assert_eq!(
        held(&other_pod("p", "1", Some("gpu-1"), "Running", spec.clone())),
        Some(("gpu-1".to_owned(), 4, [("1g.10gb".to_owned(), 2)].into()))
    );
    assert_eq!(
        held(&other_pod("p", "1", Some("gpu-1"), "Pending", gpus(3))),
        Some(("gpu-1".to_owned(), 3, Default::default())),
        "bound, still starting: its GPUs are taken"
    );
    for (node, phase) in [
        (None, "Pending"),
        (Some("gpu-1"), "Succeeded"),
        (Some("gpu-1"), "Failed"),
    ] {
        assert_eq!(
            held(&other_pod("p", "1", node, phase, gpus(3))),
            None,
            "{node:?} {phase}"
        );
    }
}

#[test]
fn nodes_wait_for_the_first_pod_listing_then_carry_what_other_pods_hold() {
    let mut usage = NodeUsage::new("test".into());
    let mut relist = Relist::default();
    let node = fixtures::gpu_node("gpu-1", "n1", "5");
    let mut events = usage.on_node(Event::Init);
    events.extend(usage.on_node(Event::InitApply(node.clone())));
    events.extend(usage.on_node(Event::InitDone));
    assert!(events.is_empty(), "no node before the other pods are known");
    assert!(usage.on_pod(Event::Init).is_empty());
    assert!(
        usage
            .on_pod(Event::InitApply(other_pod(
                "p1",
                "3",
                Some("gpu-1"),
                "Running",
                gpus(2)
            )))
            .is_empty()
    );
    let listed = usage.on_pod(Event::InitDone);
    assert_eq!(
        published(&mut relist, listed),
        [("n1:5:used=2".to_owned(), 2)]
    );

    // Each change of usage is a change of the node, named after the pod change.
    let second = other_pod("p2", "4", Some("gpu-1"), "Running", gpus(4));
    let added = usage.on_pod(Event::Apply(second.clone()));
    // What the node is published with again is what the whole object said.
    let node_fields = |event: &Event<GpuNode>| {
        let Event::Apply(gpu_node) = event else {
            panic!("apply expected")
        };
        let ChangePayload::Node(observed) = gpu_node
            .to_event(trainyard_contracts::events::Change::Applied)
            .expect("event")
            .payload
        else {
            panic!("node payload expected")
        };
        NodeObserved {
            gpus_used_by_other_pods: 0,
            ..*observed
        }
    };
    assert_eq!(
        node_fields(&added[0]),
        node_fields(&Event::Apply(GpuNode::idle(node.clone())))
    );
    assert_eq!(
        published(&mut relist, added),
        [("n1:5:pod=p2:4".to_owned(), 6)]
    );
    assert_eq!(usage.gpus_used_by_other_pods(), 6);
    // A pod on another node, or one that changes without changing its GPUs, changes nothing here.
    assert!(
        usage
            .on_pod(Event::Apply(other_pod(
                "p3",
                "5",
                Some("gpu-9"),
                "Running",
                gpus(1)
            )))
            .is_empty()
    );
    assert!(
        usage
            .on_pod(Event::Apply(other_pod(
                "p2",
                "6",
                Some("gpu-1"),
                "Running",
                gpus(4)
            )))
            .is_empty()
    );
    // Finished, then deleted: the GPUs come back once.
    let finished = usage.on_pod(Event::Apply(other_pod(
        "p2",
        "7",
        Some("gpu-1"),
        "Succeeded",
        gpus(4),
    )));
    assert_eq!(
        published(&mut relist, finished),
        [("n1:5:pod=p2:7".to_owned(), 2)]
    );
    assert_eq!(usage.gpus_used_by_other_pods(), 3, "2 on gpu-1, 1 on gpu-9");
    assert!(usage.on_pod(Event::Delete(second)).is_empty());
    let gone = usage.on_pod(Event::Delete(other_pod(
        "p1",
        "8",
        Some("gpu-1"),
        "Running",
        gpus(2),
    )));
    assert_eq!(
        published(&mut relist, gone),
        [("n1:5:pod=p1:deleted".to_owned(), 0)]
    );

    // A node change carries the usage of the moment.
    let mut relabelled = node.clone();
    relabelled.metadata.resource_version = Some("9".into());
    relabelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("pool".into(), "b".into());
    let applied = usage.on_node(Event::Apply(relabelled.clone()));
    assert_eq!(published(&mut relist, applied), [("n1:9".to_owned(), 0)]);

    // A relist that finds a pod the watch missed is a change; the same
    // usage found again is not published twice.
    usage.on_pod(Event::Init);
    usage.on_pod(Event::InitApply(other_pod(
        "p4",
        "10",
        Some("gpu-1"),
        "Running",
        gpus(8),
    )));
    let relisted = usage.on_pod(Event::InitDone);
    assert_eq!(
        published(&mut relist, relisted),
        [("n1:9:pod=relist-test-2".to_owned(), 8)]
    );
    usage.on_pod(Event::Init);
    usage.on_pod(Event::InitApply(other_pod(
        "p4",
        "10",
        Some("gpu-1"),
        "Running",
        gpus(8),
    )));
    assert!(usage.on_pod(Event::InitDone).is_empty());
}

#[test]
fn a_node_without_other_pods_reads_as_before() {
    let event = GpuNode::idle(fixtures::gpu_node("gpu-1", "n1", "5"))
        .to_event(trainyard_contracts::events::Change::Applied)
        .expect("event");
    let ChangePayload::Node(node) = event.payload else {
        panic!("node payload expected")
    };
    let encoded = serde_json::to_value(&node).expect("encodes");
    assert!(encoded.get("gpusUsedByOtherPods").is_none(), "{encoded}");
    let decoded: NodeObserved = serde_json::from_value(encoded).expect("decodes");
    assert_eq!(decoded.gpus_used_by_other_pods, 0);
}

/// (CPU millicores, memory bytes) a running pod bound to `gpu-1` with `spec` holds.
fn cpu_and_memory_held(spec: serde_json::Value) -> Option<(u64, u64)> {
    other_pod("p", "1", Some("gpu-1"), "Running", spec)
        .held()
        .map(|(_, usage)| (usage.cpu_millis, usage.memory_bytes))
}

#[test]
fn cpu_and_memory_are_the_containers_sum_or_the_largest_init_container() {
    let containers = json!([
        {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}},
    ]);
    assert_eq!(
        cpu_and_memory_held(json!({"containers": containers})),
        Some((1500, 3 << 29)),
        "summed across containers"
    );
    let init_containers = json!([
        {"name": "fetch", "resources": {"requests": {"cpu": "2", "memory": "256Mi"}}},
        {"name": "migrate", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
    ]);
    assert_eq!(
        cpu_and_memory_held(json!({"containers": containers, "initContainers": init_containers})),
        Some((2000, 3 << 29)),
        "per resource, the larger of the sum and the largest init container"
    );
    let sidecar_first = json!([
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
        {"name": "fetch", "resources": {"requests": {"cpu": "2"}}},
    ]);
    assert_eq!(
        cpu_and_memory_held(json!({"containers": containers, "initContainers": sidecar_first})),
        Some((2100, 3 << 29)),
        "a sidecar runs beside the later init containers and the containers"
    );
    let sidecar_and_small_init = json!([
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
        {"name": "fetch", "resources": {"requests": {"cpu": "1"}}},
    ]);
    assert_eq!(
        cpu_and_memory_held(
            json!({"containers": containers, "initContainers": sidecar_and_small_init})
        ),
        Some((1600, 3 << 29))
    );
}

#[test]
fn a_limit_alone_is_the_request_and_overhead_is_added() {
    let limited = json!({"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "1"},
        "limits": {"cpu": "3", "memory": "2Gi"},
    }}]});
    assert_eq!(
        cpu_and_memory_held(limited.clone()),
        Some((1000, 2 << 30)),
        "the request where there is one, else the limit"
    );
    let mut sandboxed = limited;
    sandboxed["overhead"] = json!({"cpu": "250m", "memory": "120Mi"});
    assert_eq!(
        cpu_and_memory_held(sandboxed),
        Some((1250, (2 << 30) + (120 << 20)))
    );
    let pod_level = json!({
        "resources": {"requests": {"cpu": "4"}},
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
    });
    assert_eq!(
        cpu_and_memory_held(pod_level),
        Some((4000, 1 << 30)),
        "pod-level requests replace the containers' for what they set"
    );
}

#[test]
fn a_pod_holding_only_cpu_and_memory_holds_them_while_bound_and_running() {
    assert_eq!(
        other_pod(
            "p",
            "1",
            Some("gpu-1"),
            "Running",
            cpu_memory("100m", "50Mi")
        )
        .held(),
        Some((
            "gpu-1".to_owned(),
            Usage {
                cpu_millis: 100,
                memory_bytes: 50 << 20,
                ..Usage::default()
            }
        ))
    );
    for (node, phase) in [
        (None, "Pending"),
        (Some("gpu-1"), "Succeeded"),
        (Some("gpu-1"), "Failed"),
    ] {
        let pod = other_pod("p", "1", node, phase, cpu_memory("100m", "50Mi"));
        assert_eq!(pod.held(), None, "{node:?} {phase}");
    }
    let best_effort = json!({"containers": [{"name": "c"}]});
    assert_eq!(cpu_and_memory_held(best_effort), None, "requests nothing");
}

#[test]
fn a_gpu_workers_requests_are_the_allocators_and_a_cpu_only_workers_are_not() {
    let worker = |spec: serde_json::Value| {
        let mut pod = other_pod("w", "1", Some("gpu-1"), "Running", spec);
        pod.metadata.labels = Some([("trainyard.dev/job".to_owned(), "bert".to_owned())].into());
        pod
    };
    let mut gpu_worker = gpus(2);
    gpu_worker["containers"][0]["resources"]["requests"] = json!({"cpu": "8"});
    assert_eq!(
        worker(gpu_worker).held(),
        None,
        "placed and counted by the allocator"
    );
    let shared = json!({"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "8", "nvidia.com/gpu.shared": "1"}}}]});
    assert_eq!(worker(shared).held(), None, "time-sliced GPUs too");
    assert_eq!(
        worker(cpu_memory("4", "8Gi")).held(),
        Some((
            "gpu-1".to_owned(),
            Usage {
                cpu_millis: 4000,
                memory_bytes: 8 << 30,
                ..Usage::default()
            }
        )),
        "a CPU-only job's worker is admitted without a placement"
    );
    let mut gpu_unlabelled = gpus(2);
    gpu_unlabelled["containers"][0]["resources"]["requests"] = json!({"cpu": "8"});
    let (_, held) = other_pod("s", "1", Some("gpu-1"), "Running", gpu_unlabelled)
        .held()
        .expect("an inference server holds what it asks");
    assert_eq!((held.gpus, held.cpu_millis), (2, 8000));
}

#[test]
fn a_quantity_that_does_not_parse_counts_as_nothing_and_is_logged() {
    let spec = json!({"containers": [{"name": "c", "resources": {
        "requests": {"cpu": "4 cores", "memory": "1Gi"},
        "limits": {"nvidia.com/gpu": "two"},
    }}]});
    let pod = other_pod("p", "1", Some("gpu-1"), "Running", spec);
    let (held, warnings) = fixtures::warnings(|| pod.held());
    assert_eq!(
        held,
        Some((
            "gpu-1".to_owned(),
            Usage {
                memory_bytes: 1 << 30,
                ..Usage::default()
            }
        ))
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("object=pod serving/p")
            && warnings[0].contains("field=spec.containers[0].resources.requests[cpu]"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("field=spec.containers[0].resources.limits[nvidia.com/gpu]"),
        "{warnings:?}"
    );
}

#[test]
fn nodes_carry_the_cpu_and_memory_other_pods_hold_and_count_them_incrementally() {
    let mut usage = NodeUsage::new("test".into());
    let mut relist = Relist::default();
    let node = fixtures::gpu_node("gpu-1", "n1", "5");
    usage.on_node(Event::Init);
    usage.on_node(Event::InitApply(node.clone()));
    usage.on_node(Event::InitDone);
    let daemon = other_pod(
        "d1",
        "3",
        Some("gpu-1"),
        "Running",
        cpu_memory("100m", "50Mi"),
    );
    let elsewhere = other_pod(
        "d2",
        "3",
        Some("gpu-9"),
        "Running",
        cpu_memory("100m", "50Mi"),
    );
    usage.on_pod(Event::Init);
    usage.on_pod(Event::InitApply(daemon.clone()));
    usage.on_pod(Event::InitApply(elsewhere.clone()));
    let listed = usage.on_pod(Event::InitDone);
    let [Event::Init, Event::InitApply(published), Event::InitDone] = listed.as_slice() else {
        panic!("the waiting node expected: {listed:?}")
    };
    assert_eq!(
        (
            published.used_by_other_pods.cpu_millis,
            published.used_by_other_pods.memory_bytes
        ),
        (100, 50 << 20),
        "gpu-9's pod is not gpu-1's"
    );
    assert_eq!(
        cpu_published(&mut relist, listed),
        [("n1:5:used=0,cpu=100m,memory=52428800".to_owned(), 100)]
    );

    let notebook = other_pod("p1", "4", Some("gpu-1"), "Running", cpu_memory("2", "8Gi"));
    let added = usage.on_pod(Event::Apply(notebook.clone()));
    assert_eq!(
        cpu_published(&mut relist, added),
        [("n1:5:pod=p1:4".to_owned(), 2100)]
    );
    // A change that leaves what the pod holds is no change of the node.
    let mut relabelled = notebook.clone();
    relabelled.metadata.resource_version = Some("5".into());
    assert!(usage.on_pod(Event::Apply(relabelled)).is_empty());
    let finished = other_pod(
        "p1",
        "6",
        Some("gpu-1"),
        "Succeeded",
        cpu_memory("2", "8Gi"),
    );
    assert_eq!(
        cpu_published(&mut relist, usage.on_pod(Event::Apply(finished))),
        [("n1:5:pod=p1:6".to_owned(), 100)]
    );
    assert!(
        usage.on_pod(Event::Delete(notebook)).is_empty(),
        "finished: it held nothing"
    );

    // What was counted change by change is what a relist counts.
    usage.on_pod(Event::Init);
    usage.on_pod(Event::InitApply(daemon));
    usage.on_pod(Event::InitApply(elsewhere));
    assert!(usage.on_pod(Event::InitDone).is_empty());
}

/// What the published event of each node event says: (message id, CPU used by others).
fn cpu_published(relist: &mut Relist, events: Vec<Event<GpuNode>>) -> Vec<(String, u64)> {
    events
        .into_iter()
        .flat_map(|event| relist.on_event(event))
        .map(|change| {
            let ChangePayload::Node(node) = &change.payload else {
                panic!("node payload expected")
            };
            (
                change.message_id.clone(),
                node.cpu_millis_used_by_other_pods,
            )
        })
        .collect()
}
