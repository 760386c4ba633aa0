//! Jobs no node could ever hold are told apart from jobs that wait: the
//! reason names the field that asks too much and the largest node, wins
//! over quota, and goes once a node that could hold the job joins.

mod common;

use common::*;
use gpu_allocator_core::*;

fn cause_of(h: &Harness, out: &CycleOutcome, uid: &str) -> Option<UnschedulableCause> {
    match &*h.reason_of(out, uid).reason {
        PendingReason::Unschedulable { cause, .. } => Some(*cause),
        _ => None,
    }
}

#[test]
fn a_worker_with_more_gpus_than_the_largest_node_names_the_field_and_the_node() {
    let mut h = Harness::default_config();
    h.nodes([node("gpu-node-1", 4), node("gpu-node-3", 8)]);
    h.queue(queue("q", None, 64));
    h.submit(job("wide", "q", 2, 16));
    let out = h.cycle(1);
    assert!(out.admissions.is_empty());
    let why = h.reason_of(&out, "wide");
    match &*why.reason {
        PendingReason::Unschedulable {
            cause,
            flavor,
            resource,
            largest_node,
            largest_node_units,
            ..
        } => {
            assert_eq!(*cause, UnschedulableCause::UnitsPerWorker);
            assert_eq!(cause.field(), "spec.gpusPerWorker");
            assert_eq!(flavor, A100);
            assert_eq!(resource, names::GPU_RESOURCE);
            assert_eq!(
                (largest_node.as_str(), *largest_node_units),
                ("gpu-node-3", 8)
            );
        }
        other => panic!("unexpected reason {other:?}"),
    }
    assert_eq!(
        why.reason.to_string(),
        "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node (gpu-node-3) \
         has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers"
    );
    assert_eq!(why.reason.kind(), "unschedulable");
    assert!(PendingReason::KINDS.contains(&why.reason.kind()));
    assert!(
        out.preemptions.is_empty(),
        "no victim makes room that is not there"
    );
}

#[test]
fn a_quota_reason_does_not_mask_a_job_no_node_could_hold() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 8));
    h.submit_at(job("running", "q", 1, 8), 0);
    assert_eq!(admitted_uids(&h.cycle(1)), vec!["running"]);
    // The queue's quota is all in use: a job that fits a node waits for it.
    h.submit_at(job("fits", "q", 1, 4), 1);
    // Same size and queue, but a selector no node matches: the quota answer
    // of the job before it must not stand for it.
    let mut nowhere = job("nowhere", "q", 1, 4);
    nowhere.node_selector.insert("pool".into(), "b".into());
    h.submit_at(nowhere, 2);
    h.submit_at(job("too-big", "q", 1, 16), 3);
    let out = h.cycle(2);
    assert!(matches!(
        *h.reason_of(&out, "fits").reason,
        PendingReason::QuotaExceeded { .. }
    ));
    assert_eq!(
        cause_of(&h, &out, "nowhere"),
        Some(UnschedulableCause::NodeSelector)
    );
    assert!(
        h.reason_of(&out, "nowhere").message().contains(
            "spec.scheduling.nodeSelector pool=b matches none of the 2 node(s) that could \
             otherwise hold a worker (the nodes with 4 GPUs or more)"
        ),
        "{}",
        h.reason_of(&out, "nowhere").message()
    );
    assert_eq!(
        cause_of(&h, &out, "too-big"),
        Some(UnschedulableCause::UnitsPerWorker)
    );
    // It keeps its place in line.
    assert_eq!(h.reason_of(&out, "too-big").position, 3);
}

#[test]
fn cpu_memory_taints_and_gpu_memory_that_no_node_offers_are_each_named() {
    let mut h = Harness::default_config();
    let mut tainted = host("tainted", CpuMemory::default());
    tainted.taints.push(Taint {
        key: "dedicated".into(),
        value: "research".into(),
        effect: TaintEffect::NoSchedule,
    });
    tainted
        .labels
        .insert(names::GPU_MEMORY_LABEL.into(), "40960".into());
    h.nodes([tainted]);
    h.queue(queue("q", None, 64));
    h.submit(asking(job("memory", "q", 1, 1), cpu_memory(1, 600)));
    h.submit(job("untolerated", "q", 1, 1));
    let mut floor = job("floor", "q", 1, 1);
    floor.tolerations.push(Toleration::equal(
        "dedicated",
        "research",
        TaintEffect::NoSchedule,
    ));
    floor.min_gpu_memory_mib = Some(81_920);
    h.submit(floor);
    let out = h.cycle(1);
    assert_eq!(
        cause_of(&h, &out, "memory"),
        Some(UnschedulableCause::MemoryPerWorker)
    );
    assert!(
        h.reason_of(&out, "memory")
            .message()
            .contains("spec.resources.requests.memory is 600Gi per worker"),
        "{}",
        h.reason_of(&out, "memory").message()
    );
    assert_eq!(
        cause_of(&h, &out, "untolerated"),
        Some(UnschedulableCause::Tolerations)
    );
    assert!(
        h.reason_of(&out, "untolerated")
            .message()
            .contains("e.g. dedicated=research:NoSchedule on tainted"),
        "{}",
        h.reason_of(&out, "untolerated").message()
    );
    assert_eq!(
        cause_of(&h, &out, "floor"),
        Some(UnschedulableCause::GpuMemoryFloor)
    );
}

#[test]
fn a_gang_kept_on_one_node_larger_than_any_node_is_unschedulable_until_one_joins() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    let mut together = job("together", "q", 2, 8);
    together.topology = TopologyRequirement::SameNode;
    h.submit(together);
    let out = h.cycle(1);
    assert_eq!(
        cause_of(&h, &out, "together"),
        Some(UnschedulableCause::Topology)
    );
    assert!(
        h.reason_of(&out, "together")
            .message()
            .contains("make numWorkers x gpusPerWorker at most 8 so the gang fits one node"),
        "{}",
        h.reason_of(&out, "together").message()
    );
    h.nodes([node("big", 16)]);
    let out = h.cycle(2);
    assert_eq!(admitted_uids(&out), vec!["together"]);
    assert_eq!(h.nodes_of("together"), vec!["big", "big"]);
}

#[test]
fn more_workers_than_all_the_nodes_hold_name_num_workers() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    h.submit(job("many", "q", 5, 4));
    let out = h.cycle(1);
    assert_eq!(
        cause_of(&h, &out, "many"),
        Some(UnschedulableCause::NumWorkers)
    );
    assert!(
        h.reason_of(&out, "many").message().contains(
            "spec.numWorkers is 5 but the nodes the job may use hold 4 worker(s) of 4 GPUs"
        ),
        "{}",
        h.reason_of(&out, "many").message()
    );
}

#[test]
fn adding_a_node_that_could_hold_the_job_clears_it_and_the_job_is_admitted() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 64));
    h.submit(job("wide", "q", 1, 16));
    for now in 1..=3 {
        let out = h.cycle(now);
        assert_eq!(
            cause_of(&h, &out, "wide"),
            Some(UnschedulableCause::UnitsPerWorker),
            "cycle {now}: the verdict holds while the nodes stay"
        );
    }
    h.nodes([node("n16", 16)]);
    let out = h.cycle(4);
    assert_eq!(admitted_uids(&out), vec!["wide"]);
    assert_eq!(h.nodes_of("wide"), vec!["n16"]);
}

#[test]
fn an_edited_job_and_a_queue_given_another_flavor_are_judged_again() {
    let mut h = Harness::default_config();
    let mut h100 = node("h100-node", 16);
    h100.labels
        .insert(names::GPU_PRODUCT_LABEL.into(), "H100".into());
    h.nodes([node("n1", 8), h100]);
    h.queue(queue("q", None, 64));
    h.submit_at(job("edited", "q", 1, 16), 0);
    h.submit_at(job("wide", "q", 1, 16), 1);
    let out = h.cycle(1);
    assert!(cause_of(&h, &out, "edited").is_some(), "A100 nodes have 8");
    assert!(cause_of(&h, &out, "wide").is_some());
    // Edited while pending: it now fits an A100 node.
    h.submit_at(job("edited", "q", 1, 8), 0);
    let out = h.cycle(2);
    assert_eq!(admitted_uids(&out), vec!["edited"]);
    // The queue takes the H100 flavor too: its 16-GPU node holds `wide`.
    let mut both = queue("q", None, 64);
    both.quotas.push(FlavorQuota {
        flavor: "H100.on-demand".into(),
        resources: vec![gpu_quota(64)],
    });
    h.queue(both);
    let out = h.cycle(3);
    assert_eq!(admitted_uids(&out), vec!["wide"]);
    assert_eq!(h.nodes_of("wide"), vec!["h100-node"]);
}

#[test]
fn a_queue_whose_flavors_have_no_node_yet_waits_for_capacity() {
    let mut h = Harness::default_config();
    h.queue(queue("q", None, 64));
    h.submit(job("early", "q", 1, 8));
    let out = h.cycle(1);
    assert!(
        matches!(
            *h.reason_of(&out, "early").reason,
            PendingReason::InsufficientCapacity { .. }
        ),
        "nodes not seen yet are no verdict: {:?}",
        h.reason_of(&out, "early").reason
    );
}
