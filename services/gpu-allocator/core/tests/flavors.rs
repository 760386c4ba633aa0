//! Flavors, taints and tolerations, through the public API only.

mod common;

use std::collections::BTreeMap;

use common::*;
use gpu_allocator_core::*;

#[test]
fn decision_carries_flavor_labels_tolerations_and_capacity_type() {
    let mut h = Harness::new(AllocatorConfig {
        flavors: vec![FlavorSpec {
            name: "h100-spot".into(),
            gpu_product: Some("H100".into()),
            capacity_type: Some(CapacityType::Spot),
            node_labels: BTreeMap::from([("pool".to_string(), "training".to_string())]),
            tolerations: vec![Toleration::equal("spot", "true", TaintEffect::NoSchedule)],
        }],
        ..AllocatorConfig::default()
    });
    let mut spot = node("spot-1", 8);
    spot.labels
        .insert(names::GPU_PRODUCT_LABEL.into(), "H100".into());
    spot.labels
        .insert(names::KARPENTER_CAPACITY_LABEL.into(), "spot".into());
    spot.labels.insert("pool".into(), "training".into());
    spot.taints.push(Taint {
        key: "spot".into(),
        value: "true".into(),
        effect: TaintEffect::NoSchedule,
    });
    let mut dedicated = node("dedicated", 8);
    dedicated.taints.push(Taint {
        key: "team".into(),
        value: "research".into(),
        effect: TaintEffect::NoSchedule,
    });
    h.nodes([spot, dedicated]);
    h.queue(QueueSpec {
        name: "q".into(),
        quotas: vec![
            FlavorQuota {
                flavor: "h100-spot".into(),
                resources: vec![gpu_quota(8)],
            },
            FlavorQuota {
                flavor: A100.into(),
                resources: vec![gpu_quota(8)],
            },
        ],
        ..QueueSpec::default()
    });
    h.submit(job("on-spot", "q", 1, 8));
    h.submit(job("untolerated", "q", 1, 8));
    let out = h.cycle(1);
    let a = h.admitted("on-spot").expect("admitted");
    assert_eq!(a.flavor, "h100-spot");
    assert_eq!(a.capacity_type, Some(CapacityType::Spot));
    assert_eq!(
        a.tolerations,
        vec![Toleration::equal("spot", "true", TaintEffect::NoSchedule)]
    );
    let selector = &a.workers[0].node_selector;
    assert_eq!(selector.get("pool").map(String::as_str), Some("training"));
    assert_eq!(
        selector.get(names::GPU_PRODUCT_LABEL).map(String::as_str),
        Some("H100")
    );
    assert_eq!(
        selector.get(names::HOSTNAME_LABEL).map(String::as_str),
        Some("spot-1")
    );
    assert!(
        h.admitted("untolerated").is_none(),
        "team=research taint is not tolerated"
    );
    assert!(
        h.reason_of(&out, "untolerated")
            .message()
            .contains("flavor")
    );

    let mut tolerant = job("tolerant", "q", 1, 8);
    tolerant.tolerations = vec![Toleration::equal(
        "team",
        "research",
        TaintEffect::NoSchedule,
    )];
    h.finish("untolerated");
    h.submit(tolerant);
    h.cycle(2);
    assert_eq!(h.nodes_of("tolerant"), vec!["dedicated"]);
}

/// n1 runs a job as an A100 node, then is relabeled H100 (re-provisioned
/// under its name, or labeled wrong at first). The job keeps its GPUs: an
/// H100 job waits until it ends, rather than being placed on GPUs in use.
#[test]
fn a_node_relabeled_into_another_flavor_keeps_its_running_jobs_gpus() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    let mut q = queue("q", None, 8);
    let mut h100 = q.quotas[0].clone();
    h100.flavor = "H100.on-demand".into();
    q.quotas.push(h100);
    h.queue(q);
    h.submit_at(job("old", "q", 1, 8), 0);
    assert_eq!(admitted_uids(&h.cycle(10)), vec!["old"]);
    let mut relabeled = node("n1", 8);
    relabeled
        .labels
        .insert(names::GPU_PRODUCT_LABEL.into(), "H100".into());
    h.nodes([relabeled]);
    h.submit_at(job("new", "q", 1, 8), 20);
    let out = h.cycle(30);
    assert!(out.admissions.is_empty(), "n1's GPUs are in use");
    assert!(out.evictions.is_empty());
    assert_eq!(h.alloc.stats().gpus_allocated, 8);
    h.finish("old");
    let out = h.cycle(40);
    assert_eq!(admitted_uids(&out), vec!["new"]);
    assert_eq!(out.admissions[0].flavor, "H100.on-demand");
    assert_eq!(h.alloc.stats().gpus_allocated, 8);
}

#[test]
fn cordoned_and_not_ready_nodes_get_no_new_work() {
    let mut h = Harness::default_config();
    let mut cordoned = node("cordoned", 8);
    cordoned.unschedulable = true;
    let mut not_ready = node("not-ready", 8);
    not_ready.ready = false;
    h.nodes([cordoned, not_ready]);
    h.queue(queue("q", None, 16));
    h.submit(job("j", "q", 1, 1));
    let out = h.cycle(1);
    assert!(out.admissions.is_empty());
    h.nodes([node("cordoned", 8)]);
    assert_eq!(admitted_uids(&h.cycle(2)), vec!["j"]);
}

#[test]
fn losing_a_node_requeues_the_whole_gang() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 16));
    h.submit(job("gang", "q", 2, 8));
    h.cycle(1);
    assert!(h.admitted("gang").is_some());
    h.apply(Event::NodeRemoved { name: "n2".into() });
    let out = h.cycle(2);
    assert_eq!(out.evictions.len(), 1);
    assert!(
        matches!(out.evictions[0].reason, EvictionReason::NodeLost { ref node } if node == "n2")
    );
    assert!(h.alloc.is_pending(&uid("gang")));
    assert_eq!(
        h.alloc.stats().gpus_allocated,
        0,
        "n1's units were released"
    );
}
