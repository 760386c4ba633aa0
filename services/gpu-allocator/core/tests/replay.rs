//! Snapshots, restores and replays decide as the allocator they came from, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

#[test]
fn replaying_events_twice_never_double_admits() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 16));
    h.submit(job("a", "q", 1, 8));
    h.submit(job("a", "q", 1, 8));
    h.submit(job("b", "q", 1, 4));
    let out = h.cycle(5);
    assert_eq!(
        admitted_uids(&out),
        vec!["a", "b"],
        "duplicate submission admitted once"
    );
    h.finish("b");
    h.submit(job("c", "q", 2, 4));
    h.cycle(6);

    let mut rebuilt = Allocator::new(AllocatorConfig::default()).expect("config");
    for _pass in 0..2 {
        for event in &h.log {
            rebuilt.apply(event.clone()).expect("replay accepted");
        }
    }
    let original = h.alloc.snapshot();
    let replayed = rebuilt.snapshot();
    assert_eq!(replayed.jobs, original.jobs);
    assert_eq!(replayed.nodes, original.nodes);
    assert_eq!(rebuilt.stats(), h.alloc.stats());
    // "b" finished: replaying its submission again must not resurrect it.
    assert_eq!(
        rebuilt.apply(Event::JobSubmitted(job("b", "q", 1, 4))),
        Ok(Applied::Unchanged)
    );
    let again = rebuilt.cycle(Timestamp(7));
    assert!(
        again.admissions.is_empty(),
        "nothing admitted twice: {:?}",
        again.admissions
    );
    assert_eq!(rebuilt.stats().gpus_allocated, 16);
}

#[test]
fn snapshot_round_trips_through_json_and_decides_identically() {
    let mut h = Harness::default_config();
    h.nodes([
        node_in("n1", 8, "z1", "r1"),
        node_in("n2", 8, "z1", "r1"),
        node_in("n3", 8, "z2", "r2"),
    ]);
    h.apply(Event::NodeRemoved { name: "n2".into() });
    h.nodes([node_in("n4", 8, "z1", "r1")]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 16));
    for i in 0..6 {
        let mut j = job(&format!("b{i}"), "b", 1, 4);
        j.submitted_at = Timestamp(i);
        j.runtime_estimate_secs = Some(100 * (i + 1));
        h.submit(j);
    }
    h.cycle(10);
    h.submit(job("a-big", "a", 2, 4));
    let first = h.cycle(20);
    assert!(
        !first.preemptions.is_empty(),
        "a preemption is in flight in the snapshot"
    );
    let text = serde_json::to_string(&h.alloc.snapshot()).expect("serialize");
    let snapshot: AllocatorSnapshot = serde_json::from_str(&text).expect("deserialize");
    let mut restored = Allocator::restore(snapshot.clone()).expect("restore");
    assert_eq!(restored.snapshot(), snapshot);
    for now in [30, 200, 400] {
        h.submit(job(&format!("late-{now}"), "b", 1, 2));
        restored
            .apply(Event::JobSubmitted(job(&format!("late-{now}"), "b", 1, 2)))
            .expect("accepted");
        assert_eq!(restored.cycle(Timestamp(now)), h.cycle(now));
    }
}

#[test]
fn malformed_input_is_rejected_with_the_field_name_and_changes_nothing() {
    let mut alloc = Allocator::new(AllocatorConfig::default()).expect("config");
    let mut bad = node("n1", 8);
    bad.labels
        .insert(names::GPU_MEMORY_LABEL.into(), "lots".into());
    let err = alloc.apply(Event::NodeUpserted(bad)).expect_err("rejected");
    assert_eq!(err.category(), "invalid_node");
    assert!(
        err.to_string().contains("labels[nvidia.com/gpu.memory]"),
        "{err}"
    );
    assert_eq!(alloc.stats().nodes, 0);

    let err = alloc
        .apply(Event::JobSubmitted(job("j", "q", 0, 1)))
        .expect_err("rejected");
    assert!(err.to_string().contains("numWorkers"), "{err}");
    assert!(!alloc.contains_job(&uid("j")));

    let mut q = queue("q", None, 8);
    q.quotas[0].resources[0].lending_limit = Some(9);
    let err = alloc.apply(Event::QueueUpserted(q)).expect_err("rejected");
    assert!(err.to_string().contains("lendingLimit"), "{err}");

    let stray = Admission {
        uid: uid("ghost"),
        namespace: String::new(),
        name: String::new(),
        queue: "q".into(),
        flavor: A100.into(),
        resource: "nvidia.com/gpu".into(),
        units_per_worker: 1,
        capacity_type: None,
        workers: Vec::new(),
        tolerations: Vec::new(),
        topology: TopologyAssignment::default(),
        admitted_at: Timestamp(0),
        borrowing: false,
        backfilled_ahead_of: None,
    };
    assert!(matches!(
        alloc.apply(Event::Admitted(stray)),
        Err(AllocatorError::UnknownJob { .. })
    ));
}

#[test]
fn every_pending_job_has_a_reason_with_its_position() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    for i in 0..5 {
        h.submit_at(job(&format!("j{i}"), "q", 1, 4), i);
    }
    let out = h.cycle(10);
    assert_eq!(out.admissions.len(), 2);
    assert_eq!(out.pending.len(), 3);
    let mut positions: Vec<u32> = out.pending.iter().map(|p| p.position).collect();
    positions.sort_unstable();
    assert_eq!(positions, vec![1, 2, 3]);
    for p in &out.pending {
        assert_eq!(p.queue_length, 3);
        let explained = h
            .alloc
            .explain(&out, p)
            .expect("a pending job explains itself");
        assert!(
            explained
                .message()
                .starts_with(&format!("position {} of 3 in queue q", p.position))
        );
    }
}

#[test]
fn a_pending_entry_of_a_removed_job_never_explains_the_job_in_its_slot() {
    let mut h = Harness::default_config();
    h.queue(queue("q", None, 8));
    h.submit(job("gone", "q", 1, 4));
    let out = h.cycle(10);
    let entry = out.pending.first().expect("no node: the job waits").clone();
    assert_eq!(
        h.alloc.explain(&out, &entry).map(|e| e.uid),
        Some(uid("gone"))
    );
    h.apply(Event::JobRemoved { uid: uid("gone") });
    // The newcomer takes the freed slot; the old entry must not name it.
    h.submit(job("newcomer", "q", 1, 4));
    assert_eq!(h.alloc.explain(&out, &entry), None);
    let out = h.cycle(20);
    assert_eq!(h.reason_of(&out, "newcomer").position, 1);
}

#[test]
fn each_queue_reports_its_jobs_its_gpus_and_what_it_borrows() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 4));
    h.queue(queue("b", Some("c"), 12));
    let mut held = queue("idle", None, 0);
    held.on_hold = true;
    h.queue(held);
    h.submit_at(job("a-1", "a", 1, 8), 0);
    h.submit_at(job("b-1", "b", 1, 4), 2);
    h.submit_at(job("b-2", "b", 1, 8), 3);
    h.submit_at(job("nowhere", "missing", 1, 1), 4);
    let out = h.cycle(10);
    assert_eq!(admitted_uids(&out), vec!["a-1", "b-1"]);

    let usage = h.alloc.queue_usage();
    let names: Vec<&str> = usage.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(
        names,
        ["a", "b", "idle"],
        "a queue no one created has no status"
    );
    let (a, b, idle) = (&usage[0], &usage[1], &usage[2]);
    assert_eq!((a.pending, a.admitted), (0, 1));
    assert_eq!(
        a.resources,
        vec![ResourceUsage {
            flavor: A100.into(),
            resource: names::GPU_RESOURCE.into(),
            nominal: 4,
            used: 8,
            borrowed: 4,
        }]
    );
    // 4 borrowed of the cohort's 16 lendable GPUs, at weight 1.
    assert!(
        (a.weighted_share - 4.0 / 16.0).abs() < 1e-9,
        "{}",
        a.weighted_share
    );
    assert_eq!((b.pending, b.admitted), (1, 1));
    assert_eq!((b.resources[0].used, b.resources[0].borrowed), (4, 0));
    assert_eq!(b.weighted_share, 0.0);
    assert!(idle.on_hold && !a.on_hold);
    assert_eq!(
        (idle.pending, idle.admitted, idle.resources[0].used),
        (0, 0, 0)
    );

    h.finish("a-1");
    let usage = h.alloc.queue_usage();
    assert_eq!((usage[0].admitted, usage[0].resources[0].used), (0, 0));
    assert_eq!(usage[0].weighted_share, 0.0);
}
