//! Placement: all-or-nothing gangs, best fit, topology, MIG slices and time-slicing, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

#[test]
fn gang_is_all_or_nothing() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    for (filler, host) in [("filler-1", "n1"), ("filler-2", "n2")] {
        h.submit(pinned(job(filler, "q", 1, 4), host));
    }
    assert_eq!(h.cycle(1).admissions.len(), 2);
    // 8 GPUs are free in total, 4 per node: the 2x8 gang must wait and is not
    // partially admitted. A 2x4 gang fits in the two holes; it ends before
    // the gang's reserved start, so it may go first.
    h.submit(job("gang", "q", 2, 8));
    let mut half = job("half", "q", 2, 4);
    half.runtime_estimate_secs = Some(600);
    h.submit(half);
    let out = h.cycle(2);
    assert_eq!(admitted_uids(&out), vec!["half"]);
    let why = h.reason_of(&out, "gang");
    match &*why.reason {
        PendingReason::InsufficientCapacity {
            placeable_workers,
            units_short,
            workers,
            ..
        } => {
            assert_eq!((*workers, *placeable_workers, *units_short), (2, 0, 16));
        }
        other => panic!("unexpected reason {other:?}"),
    }
    assert!(h.admitted("gang").is_none());
    assert_eq!(
        h.alloc.stats().gpus_allocated,
        16,
        "no GPU held for the pending gang"
    );
    let half = h.admitted("half").expect("admitted");
    assert_eq!(half.workers.len(), 2);
    assert_ne!(half.workers[0].node, half.workers[1].node);
    assert_eq!(
        half.workers[0].node_selector.get(names::HOSTNAME_LABEL),
        Some(&half.workers[0].node)
    );
}

#[test]
fn best_fit_fills_fragments_so_whole_nodes_stay_free() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    let mut pin = pinned(job("pinned-5", "q", 1, 5), "n2");
    pin.submitted_at = Timestamp(0);
    let mut small = job("small-3", "q", 1, 3);
    small.submitted_at = Timestamp(1);
    let mut big = job("big-8", "q", 1, 8);
    big.submitted_at = Timestamp(2);
    h.submit(pin);
    h.submit(small);
    h.submit(big);
    let out = h.cycle(10);
    // First fit would put the 3-GPU job on n1 (lowest index with room) and
    // strand the 8-GPU job; best fit uses n2's 3-GPU hole.
    assert_eq!(h.nodes_of("small-3"), vec!["n2"]);
    assert_eq!(h.nodes_of("big-8"), vec!["n1"]);
    assert_eq!(out.admissions.len(), 3);
}

#[test]
fn required_node_affinity_limits_the_nodes_a_job_is_placed_on() {
    let mut h = Harness::default_config();
    h.nodes([
        node_in("z1-a", 8, "z1", "r1"),
        node_in("z2-a", 8, "z2", "r2"),
        node_in("z2-b", 4, "z2", "r2"),
    ]);
    h.queue(queue("q", None, 64));
    let zone = |values: &[&str], operator| NodeRequirement {
        key: NodeKey::Label(names::ZONE_LABEL.into()),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
    };
    // Best fit alone would take z2-b; the job may run in z1 only.
    let mut z1 = job("z1-only", "q", 1, 4);
    z1.node_affinity = vec![NodeSelectorTerm {
        requirements: vec![zone(&["z1"], NodeOperator::In)],
    }];
    // Terms are alternatives: in a zone no node has, or on z2-a by name
    // (the roomiest node, which best fit would leave free).
    let mut either = job("either", "q", 2, 2);
    either.node_affinity = vec![
        NodeSelectorTerm {
            requirements: vec![zone(&["z3"], NodeOperator::In)],
        },
        NodeSelectorTerm {
            requirements: vec![NodeRequirement {
                key: NodeKey::Name,
                operator: NodeOperator::In,
                values: vec!["z2-a".into()],
            }],
        },
    ];
    h.submit_at(z1, 0);
    h.submit_at(either, 1);
    h.cycle(1);
    assert_eq!(h.nodes_of("z1-only"), vec!["z1-a"]);
    assert_eq!(h.nodes_of("either"), vec!["z2-a", "z2-a"]);

    let mut nowhere = job("nowhere", "q", 1, 1);
    nowhere.node_affinity = vec![NodeSelectorTerm {
        requirements: vec![zone(&["z3"], NodeOperator::In)],
    }];
    h.submit(nowhere);
    let out = h.cycle(2);
    assert!(
        matches!(
            *h.reason_of(&out, "nowhere").reason,
            PendingReason::Unschedulable {
                cause: UnschedulableCause::NodeAffinity,
                ..
            }
        ),
        "no node in z3, now or ever"
    );
    let message = h.reason_of(&out, "nowhere").message();
    assert!(
        message.contains("spec.scheduling.affinity.nodeAffinity matches none of the 3 node(s)"),
        "the job's own constraint is named: {message}"
    );
    // A z3 node joins, and a job that only fits there takes it first:
    // `nowhere` still waits, but now for room, no longer for a node.
    h.nodes([node_in("z3-a", 8, "z3", "r3")]);
    let mut first = job("z3-first", "q", 1, 8);
    first.priority = 10;
    first.node_affinity = vec![NodeSelectorTerm {
        requirements: vec![zone(&["z3"], NodeOperator::In)],
    }];
    h.submit(first);
    let out = h.cycle(3);
    assert_eq!(h.nodes_of("z3-first"), vec!["z3-a"]);
    assert!(
        matches!(
            *h.reason_of(&out, "nowhere").reason,
            PendingReason::InsufficientCapacity {
                fits_when_empty: true,
                ..
            }
        ),
        "what fits when empty is worked out again when nodes change"
    );

    for (bad, field) in [
        (
            zone(&[], NodeOperator::In),
            "nodeAffinity[0].requirements[0]",
        ),
        (
            zone(&["x"], NodeOperator::Exists),
            "nodeAffinity[0].requirements[0]",
        ),
        (
            zone(&["high"], NodeOperator::Gt),
            "nodeAffinity[0].requirements[0]",
        ),
    ] {
        let mut j = job("bad", "q", 1, 1);
        j.node_affinity = vec![NodeSelectorTerm {
            requirements: vec![bad],
        }];
        let err = j.validate().expect_err("refused");
        assert!(err.to_string().contains(field), "{err}");
    }
}

#[test]
fn workers_that_must_not_share_a_node_get_a_node_each_or_wait() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 4)]);
    h.queue(queue("q", None, 64));
    // Two 4-GPU workers would share n3's neighbour n1 or n2; apart, they
    // take two nodes, the tightest first.
    let mut apart = job("apart", "q", 2, 4);
    apart.one_worker_per_node = true;
    h.submit_at(apart, 0);
    h.submit_at(job("together", "q", 2, 4), 1);
    h.cycle(1);
    let mut nodes = h.nodes_of("apart");
    nodes.sort();
    assert_eq!(nodes, vec!["n1", "n3"]);
    assert_eq!(h.nodes_of("together"), vec!["n2", "n2"], "may share a node");

    // Three more, apart or not: only n1 has room left, for one worker. The
    // reason counts it, though the free units could never hold the gang.
    let mut trio = job("trio", "q", 3, 4);
    trio.one_worker_per_node = true;
    h.submit(trio);
    h.submit(job("plain-trio", "q", 3, 4));
    let out = h.cycle(2);
    assert!(h.admitted("trio").is_none());
    for uid in ["trio", "plain-trio"] {
        let why = h.reason_of(&out, uid);
        assert!(
            matches!(
                *why.reason,
                PendingReason::InsufficientCapacity {
                    workers: 3,
                    placeable_workers: 1,
                    units_short: 8,
                    fits_when_empty: true,
                    ..
                }
            ),
            "{why:?}"
        );
    }
    let mut four = job("four", "q", 4, 4);
    four.one_worker_per_node = true;
    h.submit(four);
    let out = h.cycle(3);
    assert!(
        matches!(
            *h.reason_of(&out, "four").reason,
            PendingReason::Unschedulable {
                cause: UnschedulableCause::OneWorkerPerNode,
                ..
            }
        ),
        "three nodes never host four workers apart"
    );
    let message = h.reason_of(&out, "four").message();
    assert!(
        message.contains("each of the 4 workers on a node of its own, but 3 node(s) can hold one"),
        "{message}"
    );
}

#[test]
fn workers_kept_on_one_node_wait_for_a_node_that_holds_them_all() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    h.submit_at(job("half-1", "q", 1, 6), 0);
    h.submit_at(job("half-2", "q", 1, 6), 1);
    h.cycle(1);
    let mut taken = [h.nodes_of("half-1"), h.nodes_of("half-2")].concat();
    taken.sort();
    assert_eq!(taken, vec!["n1", "n2"], "2 free on each");

    // Two 2-GPU workers fit spread over both nodes, not on one.
    let mut together = job("together", "q", 2, 2);
    together.topology = TopologyRequirement::SameNode;
    h.submit_at(together, 2);
    let out = h.cycle(2);
    assert!(h.admitted("together").is_none());
    let why = h.reason_of(&out, "together");
    assert!(
        matches!(
            *why.reason,
            PendingReason::InsufficientCapacity {
                placeable_workers: 1,
                units_short: 2,
                fits_when_empty: true,
                required_topology: Some(TopologyRequirement::SameNode),
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message()
            .contains("all on the same node, 1 fit now; 2 nvidia.com/gpu short"),
        "{}",
        why.message()
    );

    h.finish("half-1");
    h.cycle(3);
    let nodes = h.nodes_of("together");
    assert_eq!(nodes, vec!["n1", "n1"], "both on the node given back");

    let mut never = job("never", "q", 3, 3);
    never.topology = TopologyRequirement::SameNode;
    h.submit_at(never, 4);
    let out = h.cycle(4);
    let message = h.reason_of(&out, "never").message();
    assert!(
        message.contains(
            "no set of nodes can hold the gang: spec.scheduling.affinity.podAffinity keeps all 3 \
             workers (9 GPUs) on one node, but the roomiest node (n1) holds 2 of them"
        ),
        "no node holds 9 GPUs: {message}"
    );
}

#[test]
fn topology_prefers_one_rack_then_one_zone() {
    let mut h = Harness::default_config();
    h.nodes([
        node_in("z1-r1-a", 8, "z1", "r1"),
        node_in("z1-r1-b", 8, "z1", "r1"),
        node_in("z1-r2-a", 8, "z1", "r2"),
        node_in("z2-r3-a", 8, "z2", "r3"),
        node_in("z2-r3-b", 8, "z2", "r3"),
        node_in("z2-r3-c", 8, "z2", "r3"),
    ]);
    h.queue(queue("q", None, 64));
    h.submit_at(job("pair", "q", 2, 8), 0);
    h.cycle(1);
    let pair = h.admitted("pair").expect("admitted");
    assert_eq!(
        pair.topology.rack.as_deref(),
        Some("r1"),
        "tightest rack that fits"
    );
    assert_eq!(pair.topology.zone.as_deref(), Some("z1"));

    // Now z1 has one free node (r2) and z2 three (r3): a 3-worker gang takes r3.
    h.submit(job("trio", "q", 3, 8));
    h.cycle(2);
    let trio = h.admitted("trio").expect("admitted");
    assert_eq!(trio.topology.rack.as_deref(), Some("r3"));
    assert_eq!(trio.topology.nodes, 3);
    h.finish("pair");
    h.finish("trio");

    // No rack holds 4 free nodes, zone z1 holds 3, zone z2 3: a 3-worker
    // gang that requires one rack must wait; preferring stays in one zone.
    let mut strict = job("strict", "q", 3, 8);
    strict.topology = TopologyRequirement::SameRack;
    strict.submitted_at = Timestamp(10);
    h.submit(strict);
    let out = h.cycle(20);
    assert!(h.admitted("strict").is_some(), "r3 holds three nodes");
    assert_eq!(out.admissions[0].topology.rack.as_deref(), Some("r3"));
    let mut zone_only = job("zone-only", "q", 3, 8);
    zone_only.topology = TopologyRequirement::SameRack;
    h.submit(zone_only);
    let out = h.cycle(30);
    assert!(
        h.admitted("zone-only").is_none(),
        "z1 has 3 nodes but in two racks"
    );
    // What the roomiest rack holds (r1: two nodes), not all three free.
    let why = h.reason_of(&out, "zone-only");
    assert!(
        matches!(
            *why.reason,
            PendingReason::InsufficientCapacity {
                placeable_workers: 2,
                units_short: 8,
                fits_when_empty: true,
                required_topology: Some(TopologyRequirement::SameRack),
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message()
            .contains("all in one rack, 2 fit now; 8 nvidia.com/gpu short"),
        "{}",
        why.message()
    );
    let mut never = job("never", "q", 4, 8);
    never.topology = TopologyRequirement::SameRack;
    h.submit(never);
    let out = h.cycle(31);
    let why = h.reason_of(&out, "never");
    assert!(
        matches!(
            *why.reason,
            PendingReason::Unschedulable {
                cause: UnschedulableCause::Topology,
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message()
            .contains("keeps all 4 workers in one rack, but the roomiest rack holds 3 of them"),
        "no rack has four nodes: {}",
        why.message()
    );
    h.finish("never");
    h.finish("zone-only");
    let mut preferred = job("preferred", "q", 3, 8);
    preferred.topology = TopologyRequirement::Preferred;
    h.submit(preferred);
    h.cycle(40);
    let preferred = h.admitted("preferred").expect("admitted across racks");
    assert_eq!(preferred.topology.zone.as_deref(), Some("z1"));
    assert_eq!(preferred.topology.rack, None);
}

#[test]
fn a_rack_name_reused_in_another_zone_is_another_rack() {
    // Clusters name racks per zone (`rack-1` in every zone): two nodes with
    // the same rack label in two zones share no rack and no NVLink domain.
    let mut h = Harness::default_config();
    h.nodes([
        node_in("a", 8, "z1", "rack-1"),
        node_in("b", 8, "z2", "rack-1"),
    ]);
    h.queue(queue("q", None, 16));
    let mut same_rack = job("same-rack", "q", 2, 8);
    same_rack.topology = TopologyRequirement::SameRack;
    h.submit(same_rack);
    let mut same_zone = job("same-zone", "q", 2, 8);
    same_zone.topology = TopologyRequirement::SameZone;
    h.submit(same_zone);
    let out = h.cycle(1);
    assert!(
        out.admissions.is_empty(),
        "neither fits in one rack or zone: {:?}",
        admitted_uids(&out)
    );
    let mut preferred = job("preferred", "q", 2, 8);
    preferred.topology = TopologyRequirement::Preferred;
    h.submit(preferred);
    h.cycle(2);
    let spread = h.admitted("preferred").expect("admitted across zones");
    assert_eq!(
        (
            spread.topology.zone.as_deref(),
            spread.topology.rack.as_deref()
        ),
        (None, None)
    );
}

#[test]
fn mig_requests_get_the_smallest_profile_with_enough_memory() {
    let mut h = Harness::default_config();
    let mut mig = node("mig-node", 0);
    mig.allocatable
        .insert("nvidia.com/mig-1g.5gb".into(), "7".into());
    mig.allocatable
        .insert("nvidia.com/mig-3g.20gb".into(), "2".into());
    mig.allocatable
        .insert("nvidia.com/mig-7g.40gb".into(), "1".into());
    h.nodes([mig]);
    h.queue(QueueSpec {
        name: "q".into(),
        quotas: vec![FlavorQuota {
            flavor: A100.into(),
            resources: [
                "nvidia.com/mig-1g.5gb",
                "nvidia.com/mig-3g.20gb",
                "nvidia.com/mig-7g.40gb",
            ]
            .into_iter()
            .map(|r| ResourceQuota {
                resource: r.into(),
                nominal: 10,
                ..ResourceQuota::default()
            })
            .collect(),
        }],
        ..QueueSpec::default()
    });
    let mut ten = job("needs-10gb", "q", 1, 1);
    ten.gpu_slice = Some(GpuSliceRequest::MemoryGb(10));
    let mut five = job("needs-5gb", "q", 1, 1);
    five.gpu_slice = Some(GpuSliceRequest::MemoryGb(5));
    let mut exact = job("wants-7g", "q", 1, 1);
    exact.gpu_slice = Some(GpuSliceRequest::Profile("7g.40gb".into()));
    let mut whole = job("whole-gpu", "q", 1, 1);
    whole.gpu_slice = None;
    h.submit(ten);
    h.submit(five);
    h.submit(exact);
    h.submit(whole);
    let out = h.cycle(10);
    assert_eq!(
        h.admitted("needs-10gb").expect("admitted").resource,
        "nvidia.com/mig-3g.20gb"
    );
    assert_eq!(
        h.admitted("needs-5gb").expect("admitted").resource,
        "nvidia.com/mig-1g.5gb"
    );
    let exact = h.admitted("wants-7g").expect("admitted");
    assert_eq!(exact.workers[0].request_resource, "nvidia.com/mig-7g.40gb");
    assert!(matches!(
        *h.reason_of(&out, "whole-gpu").reason,
        PendingReason::NoMatchingFlavor { .. }
    ));
}

#[test]
fn mig_quota_is_counted_per_profile_in_slices() {
    let mut h = Harness::default_config();
    let mut mig = node("mig-node", 0);
    mig.allocatable
        .insert("nvidia.com/mig-1g.10gb".into(), "14".into());
    mig.allocatable
        .insert("nvidia.com/mig-3g.40gb".into(), "4".into());
    h.nodes([mig]);
    let slices = |profile: &str, nominal: u64| ResourceQuota {
        resource: format!("nvidia.com/mig-{profile}"),
        nominal,
        ..ResourceQuota::default()
    };
    h.queue(QueueSpec {
        name: "q".into(),
        quotas: vec![FlavorQuota {
            flavor: A100.into(),
            resources: vec![gpu_quota(8), slices("1g.10gb", 5), slices("3g.40gb", 1)],
        }],
        ..QueueSpec::default()
    });
    let sliced = |uid: &str, profile: &str, count: u32, at: u64| {
        let mut j = job(uid, "q", 1, count);
        j.gpu_slice = Some(GpuSliceRequest::Profile(profile.into()));
        j.submitted_at = Timestamp(at);
        j
    };
    h.submit(sliced("small-a", "1g.10gb", 3, 0));
    h.submit(sliced("small-b", "1g.10gb", 3, 1));
    h.submit(sliced("small-c", "1g.10gb", 2, 2));
    h.submit(sliced("big-a", "3g.40gb", 1, 3));
    h.submit(sliced("big-b", "3g.40gb", 1, 4));
    let out = h.cycle(10);
    // The node has 14 + 4 slices; the quota allows 5 + 1.
    assert_eq!(admitted_uids(&out), vec!["small-a", "small-c", "big-a"]);
    match &*h.reason_of(&out, "small-b").reason {
        PendingReason::QuotaExceeded {
            resource,
            requested,
            available,
            nominal,
            used,
            ..
        } => {
            assert_eq!(resource, "nvidia.com/mig-1g.10gb");
            assert_eq!((*requested, *available, *nominal, *used), (3, 2, 5, 3));
        }
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert!(matches!(
        &*h.reason_of(&out, "big-b").reason,
        PendingReason::QuotaExceeded { resource, .. } if resource == "nvidia.com/mig-3g.40gb"
    ));
    // Slices freed by a finished job are quota again.
    h.finish("small-a");
    assert_eq!(admitted_uids(&h.cycle(20)), vec!["small-b"]);
}

#[test]
fn time_sliced_gpus_are_used_only_by_jobs_that_opt_in() {
    let mut h = Harness::default_config();
    let mut shared = node("ts", 32);
    shared
        .labels
        .insert(names::GPU_REPLICAS_LABEL.into(), "4".into());
    h.nodes([shared, node("exclusive", 8)]);
    h.queue(QueueSpec {
        name: "q".into(),
        quotas: vec![FlavorQuota {
            flavor: A100.into(),
            resources: vec![
                gpu_quota(16),
                ResourceQuota {
                    resource: names::SHARED_GPU_RESOURCE.into(),
                    nominal: 32,
                    ..ResourceQuota::default()
                },
            ],
        }],
        ..QueueSpec::default()
    });
    h.submit_at(job("fill", "q", 1, 8), 0);
    h.submit_at(job("plain", "q", 1, 1), 1);
    let mut sharer = job("sharer", "q", 2, 1);
    sharer.allow_gpu_sharing = true;
    sharer.submitted_at = Timestamp(2);
    h.submit(sharer);
    let out = h.cycle(10);
    assert_eq!(h.nodes_of("fill"), vec!["exclusive"]);
    assert!(
        h.admitted("plain").is_none(),
        "never silently placed on a shared GPU"
    );
    assert!(matches!(
        *h.reason_of(&out, "plain").reason,
        PendingReason::InsufficientCapacity { .. }
    ));
    let sharer = h.admitted("sharer").expect("admitted");
    assert_eq!(sharer.resource, names::SHARED_GPU_RESOURCE);
    assert_eq!(sharer.workers[0].node, "ts");
    assert_eq!(sharer.workers[0].request_resource, "nvidia.com/gpu");
}
