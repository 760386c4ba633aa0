//! Backfill reservations: a blocked job's reserved start and what may run before it, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

/// n1: 4 of 8 GPUs busy until t=1000 (estimate); n2 full with no estimate.
/// The 8-GPU head job can start at t=1000 on n1.
fn backfill_scenario(backfill: bool) -> Harness {
    let mut h = Harness::new(AllocatorConfig {
        backfill: BackfillPolicy {
            enabled: backfill,
            ..BackfillPolicy::default()
        },
        preemption: no_preemption(),
        ..AllocatorConfig::default()
    });
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 64));
    let mut r1 = pinned(job("running-4", "q", 1, 4), "n1");
    r1.runtime_estimate_secs = Some(1_000);
    let r2 = pinned(job("running-8", "q", 1, 8), "n2");
    h.submit(r1);
    h.submit(r2);
    assert_eq!(h.cycle(0).admissions.len(), 2);
    let mut head = job("head-8", "q", 1, 8);
    head.priority = 10;
    let mut long = job("long-4", "q", 1, 4);
    long.runtime_estimate_secs = Some(5_000);
    long.submitted_at = Timestamp(1);
    let mut short = job("short-4", "q", 1, 4);
    short.runtime_estimate_secs = Some(500);
    short.submitted_at = Timestamp(2);
    h.submit(head);
    h.submit(long);
    h.submit(short);
    h
}

#[test]
fn backfill_never_delays_the_reserved_head_job() {
    let mut h = backfill_scenario(true);
    let out = h.cycle(0);
    assert_eq!(
        admitted_uids(&out),
        vec!["short-4"],
        "ends before the reserved start"
    );
    assert_eq!(
        h.admitted("short-4")
            .and_then(|a| a.backfilled_ahead_of.clone()),
        Some(uid("head-8"))
    );
    match &*h.reason_of(&out, "head-8").reason {
        PendingReason::InsufficientCapacity { reserved_start, .. } => {
            assert_eq!(*reserved_start, Some(Timestamp(1_000)))
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        *h.reason_of(&out, "long-4").reason,
        PendingReason::HeldForReservation { ref reserved_for, until: Timestamp(1_000), .. } if *reserved_for == uid("head-8")
    ));
    h.finish("short-4");
    assert!(
        h.cycle(600).admissions.is_empty(),
        "long-4 still may not take the hole"
    );
    h.finish("running-4");
    let out = h.cycle(1_000);
    assert_eq!(
        admitted_uids(&out)[0],
        "head-8",
        "starts exactly at its reservation"
    );
}

/// A gang that must stay in one rack is reserved where a whole rack frees
/// up, however many earlier releases leave room for it only across racks:
/// a reservation search tries to place a gang at most 64 times, so it must
/// not spend them on the 70 releases below, after which units alone could
/// host the gang only across racks.
#[test]
fn a_rack_bound_gang_is_reserved_where_one_rack_frees_up() {
    let mut h = Harness::without_preemption();
    let mut nodes = vec![
        node_in("a1", 8, "z", "ra"),
        node_in("a2", 8, "z", "ra"),
        node_in("b1", 8, "z", "rb"),
    ];
    nodes.extend((0..10).map(|i| node_in(&format!("c{i}"), 8, "z", "rc")));
    h.nodes(nodes);
    h.queue(queue("q", None, 1_000));
    let mut a2 = pinned(job("a2-busy", "q", 1, 8), "a2");
    a2.runtime_estimate_secs = Some(1_000);
    h.submit(a2);
    // Each c node: seven 1-GPU jobs ending one after another before t=1000,
    // and one that keeps it from being whole until t=5000.
    for i in 0..10u64 {
        let host = format!("c{i}");
        for k in 0..7u64 {
            let mut small = pinned(job(&format!("c{i}-{k}"), "q", 1, 1), &host);
            small.runtime_estimate_secs = Some(10 + (i * 7 + k) * 10);
            h.submit(small);
        }
        let mut long = pinned(job(&format!("c{i}-long"), "q", 1, 1), &host);
        long.runtime_estimate_secs = Some(5_000);
        h.submit(long);
    }
    assert_eq!(h.cycle(0).admissions.len(), 81);
    let mut gang = job("rack-pair", "q", 2, 8);
    gang.topology = TopologyRequirement::SameRack;
    gang.priority = 10;
    h.submit(gang);
    let out = h.cycle(0);
    assert!(
        h.admitted("rack-pair").is_none(),
        "a1 and b1 are in two racks"
    );
    match &*h.reason_of(&out, "rack-pair").reason {
        PendingReason::InsufficientCapacity { reserved_start, .. } => {
            assert_eq!(*reserved_start, Some(Timestamp(1_000)), "rack ra at t=1000")
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// n1: 4 of 8 GPUs busy until t=1000, n2 full; a 6-GPU head job is
/// reserved on n1 at t=1000, which keeps 2 of n1's 4 free GPUs for it. A
/// long 2-GPU job whose CPU leaves room for one worker takes the other 2:
/// CPU and memory cap what the reservation leaves.
#[test]
fn cpu_and_memory_cap_what_a_reservation_leaves_not_the_reverse() {
    let mut h = Harness::new(AllocatorConfig {
        preemption: no_preemption(),
        ..AllocatorConfig::default()
    });
    h.nodes([
        host("n1", CpuMemory::default()),
        host("n2", CpuMemory::default()),
    ]);
    h.queue(queue("q", None, 64));
    let mut r1 = pinned(job("running-4", "q", 1, 4), "n1");
    r1.runtime_estimate_secs = Some(1_000);
    h.submit(r1);
    h.submit(pinned(job("running-8", "q", 1, 8), "n2"));
    assert_eq!(h.cycle(0).admissions.len(), 2);
    let mut head = job("head-6", "q", 1, 6);
    head.priority = 10;
    h.submit(head);
    let mut long = asking(job("long-2", "q", 1, 2), cpu_memory(40, 0));
    long.runtime_estimate_secs = Some(5_000);
    long.submitted_at = Timestamp(1);
    h.submit(long);
    let out = h.cycle(0);
    assert_eq!(admitted_uids(&out), vec!["long-2"]);
    assert_eq!(h.nodes_of("long-2"), ["n1"]);
    match &*h.reason_of(&out, "head-6").reason {
        PendingReason::InsufficientCapacity { reserved_start, .. } => {
            assert_eq!(*reserved_start, Some(Timestamp(1_000)))
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn without_reservations_the_long_job_delays_the_head_job() {
    let mut h = backfill_scenario(false);
    let out = h.cycle(0);
    assert!(admitted_uids(&out).contains(&"long-4".to_string()));
    h.finish("running-4");
    let out = h.cycle(1_000);
    assert!(
        !admitted_uids(&out).contains(&"head-8".to_string()),
        "head-8 is delayed"
    );
}
