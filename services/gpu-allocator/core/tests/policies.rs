//! One test (or more) per admission policy, through the public API only.

mod common;

use std::collections::BTreeMap;

use common::*;
use gpu_allocator_core::*;

// ------------------------------------------------------------------- quota

#[test]
fn quota_caps_a_queue_at_nominal_and_explains_the_shortfall() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("team-a", None, 8));
    for (i, t) in [(1, 10), (2, 11), (3, 12)] {
        h.submit_at(job(&format!("j{i}"), "team-a", 1, 4), t);
    }
    let out = h.cycle(100);
    assert_eq!(
        admitted_uids(&out),
        vec!["j1", "j2"],
        "8 nominal GPUs = two 4-GPU jobs"
    );
    let why = h.reason_of(&out, "j3");
    assert_eq!(
        *why.reason,
        PendingReason::QuotaExceeded {
            flavor: A100.into(),
            resource: "nvidia.com/gpu".into(),
            requested: 4,
            available: 0,
            nominal: 8,
            used: 8,
            held_for: None,
            holding_cohort_quota: false,
        }
    );
    assert_eq!((why.position, why.queue_length), (1, 1));
    let text = why.message();
    assert!(
        text.contains("team-a") && text.contains(A100) && text.contains("4 short"),
        "{text}"
    );
}

#[test]
fn gpus_other_pods_hold_are_not_given_out_and_are_named_when_a_job_waits() {
    let mut h = Harness::default_config();
    let mut serving = node("n1", 8);
    serving
        .used_by_other_pods
        .insert(names::GPU_RESOURCE.into(), 6);
    h.nodes([serving.clone(), node("n2", 8)]);
    h.queue(queue("team-a", None, 32));
    h.submit_at(job("fits-beside", "team-a", 1, 2), 10);
    h.submit_at(job("whole-node", "team-a", 1, 8), 11);
    h.submit_at(job("second-node", "team-a", 1, 8), 12);
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["fits-beside", "whole-node"]);
    assert_eq!(
        h.nodes_of("fits-beside"),
        ["n1"],
        "the 2 GPUs left beside the server"
    );
    assert_eq!(h.nodes_of("whole-node"), ["n2"]);
    let why = h.reason_of(&out, "second-node");
    assert!(
        matches!(
            *why.reason,
            PendingReason::InsufficientCapacity {
                placeable_workers: 0,
                units_short: 8,
                fits_when_empty: true,
                held_by_other_pods: 6,
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message()
            .contains("; 6 nvidia.com/gpu of the flavor held by pods Trainyard does not manage"),
        "{}",
        why.message()
    );
    // The server goes: its GPUs are the allocator's to give again.
    serving.used_by_other_pods.clear();
    h.finish("fits-beside");
    h.nodes([serving]);
    h.submit_at(job("third", "team-a", 1, 8), 13);
    let out = h.cycle(200);
    assert_eq!(admitted_uids(&out), vec!["second-node"]);
    assert_eq!(h.nodes_of("second-node"), ["n1"]);
    let why = h.reason_of(&out, "third");
    assert!(
        matches!(
            *why.reason,
            PendingReason::InsufficientCapacity {
                held_by_other_pods: 0,
                ..
            }
        ),
        "{why:?}"
    );
    assert!(!why.message().contains("held by pods"), "{}", why.message());
}

const GIB: u64 = 1 << 30;

fn cpu_memory(cores: u64, memory_gib: u64) -> CpuMemory {
    CpuMemory {
        cpu_millis: cores * 1000,
        memory_bytes: memory_gib * GIB,
    }
}

/// An 8-GPU node with 64 cores and 512 GiB, of which other pods request `other`.
fn host(name: &str, other: CpuMemory) -> NodeInfo {
    NodeInfo {
        cpu_memory: Some(cpu_memory(64, 512)),
        cpu_memory_used_by_other_pods: other,
        ..node(name, 8)
    }
}

fn asking(mut j: JobSpec, per_worker: CpuMemory) -> JobSpec {
    j.cpu_memory_per_worker = per_worker;
    j
}

#[test]
fn workers_go_only_where_their_cpu_and_memory_are_free_too() {
    let mut h = Harness::without_preemption();
    // n1 has its GPUs free but other pods request 40 of its 64 cores.
    h.nodes([
        host("n1", cpu_memory(40, 0)),
        host("n2", CpuMemory::default()),
    ]);
    h.queue(queue("team-a", None, 32));
    // By GPUs alone, all three 2-GPU workers would share n1, the first of
    // two equally free nodes; its 24 free cores take one of them.
    h.submit_at(asking(job("three", "team-a", 3, 2), cpu_memory(24, 64)), 10);
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["three"]);
    let mut nodes = h.nodes_of("three");
    nodes.sort();
    assert_eq!(nodes, ["n1", "n2", "n2"]);
    // Workers stating no CPU or memory are placed by GPUs alone.
    h.submit_at(job("plain", "team-a", 1, 6), 11);
    let out = h.cycle(110);
    assert_eq!(admitted_uids(&out), vec!["plain"]);
    assert_eq!(h.nodes_of("plain"), ["n1"]);
}

#[test]
fn a_job_short_of_cpu_or_memory_says_so_and_starts_when_they_are_freed() {
    let mut h = Harness::without_preemption();
    h.nodes([host("n1", CpuMemory::default())]);
    h.queue(queue("team-a", None, 32));
    h.submit_at(
        asking(job("big-memory", "team-a", 1, 2), cpu_memory(8, 400)),
        10,
    );
    h.submit_at(
        asking(job("second", "team-a", 1, 2), cpu_memory(8, 200)),
        11,
    );
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["big-memory"]);
    let why = h.reason_of(&out, "second");
    assert!(
        matches!(
            *why.reason,
            PendingReason::InsufficientCapacity {
                placeable_workers: 0,
                workers_lacking_cpu_memory: 1,
                // Its GPUs are free: CPU and memory are what it lacks.
                units_short: 0,
                fits_when_empty: true,
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message().contains(
            "; 1 more worker(s) would fit by nvidia.com/gpu but not by the CPU or memory \
             free beside it (cpu 8, memory 200Gi per worker)"
        ),
        "{}",
        why.message()
    );
    assert_eq!(why.reason.kind(), "capacity_cpu_memory");
    assert!(PendingReason::KINDS.contains(&why.reason.kind()));
    // A worker that could never fit says that too.
    h.submit_at(asking(job("huge", "team-a", 1, 1), cpu_memory(65, 1)), 12);
    let out = h.cycle(101);
    let why = h.reason_of(&out, "huge");
    assert!(
        why.message().contains("even when it is empty"),
        "{}",
        why.message()
    );
    // The first job's memory comes back when it ends.
    h.finish("big-memory");
    let out = h.cycle(200);
    assert_eq!(admitted_uids(&out), vec!["second"]);
}

#[test]
fn a_preemption_counts_the_cpu_and_memory_its_victims_free() {
    let mut h = Harness::default_config();
    h.nodes([host("n1", cpu_memory(0, 256))]);
    h.queue(queue("q", None, 8));
    // 2 GPUs and 240 GiB: after it, 6 GPUs but only 16 GiB are free.
    h.submit_at(asking(job("low", "q", 1, 2), cpu_memory(4, 240)), 0);
    assert_eq!(admitted_uids(&h.cycle(1)), vec!["low"]);
    let mut high = asking(job("high", "q", 1, 4), cpu_memory(4, 200));
    high.priority = 10;
    h.submit_at(high, 2);
    let out = h.cycle(2);
    assert_eq!(
        only_victims(&out),
        vec!["low"],
        "the GPUs are free but the memory is low's"
    );
    h.apply(Event::JobCheckpointed { uid: uid("low") });
    let out = h.cycle(5);
    assert_eq!(out.evictions.len(), 1);
    assert_eq!(admitted_uids(&out), vec!["high"]);
}

#[test]
fn jobs_in_a_missing_queue_or_without_matching_quota_say_so() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("team-a", None, 8));
    h.submit(job("lost", "nope", 1, 1));
    let mut mig = job("mig", "team-a", 1, 1);
    mig.gpu_slice = Some(GpuSliceRequest::MemoryGb(10));
    h.submit(mig);
    let out = h.cycle(10);
    assert_eq!(
        *h.reason_of(&out, "lost").reason,
        PendingReason::QueueNotFound {
            queue: "nope".into()
        }
    );
    assert!(matches!(
        *h.reason_of(&out, "mig").reason,
        PendingReason::NoMatchingFlavor { .. }
    ));
}

fn in_namespace(mut j: JobSpec, namespace: &str) -> JobSpec {
    j.namespace = namespace.into();
    j
}

#[test]
fn a_queue_open_to_some_namespaces_admits_only_their_jobs() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    let mut team_a = queue("team-a", None, 8);
    team_a.namespaces = vec!["research".into()];
    h.queue(team_a.clone());
    h.submit_at(in_namespace(job("mine", "team-a", 1, 8), "research"), 0);
    h.submit_at(in_namespace(job("mine-2", "team-a", 1, 8), "research"), 1);
    // Same shape, behind a job the quota blocks: its own reason, not the
    // quota's.
    h.submit_at(in_namespace(job("theirs", "team-a", 1, 8), "prod"), 2);
    let out = h.cycle(10);
    assert_eq!(admitted_uids(&out), vec!["mine"]);
    assert!(matches!(
        *h.reason_of(&out, "mine-2").reason,
        PendingReason::QuotaExceeded { .. }
    ));
    let why = h.reason_of(&out, "theirs");
    assert_eq!(
        *why.reason,
        PendingReason::NamespaceNotAdmitted {
            queue: "team-a".into(),
            namespace: "prod".into(),
            admitted: vec!["research".into()],
        }
    );
    assert_eq!(why.position, 2, "it keeps its place in line");
    assert!(
        why.message()
            .contains("admits jobs of namespaces research only, not prod"),
        "{}",
        why.message()
    );

    // Opened to prod, it waits for quota like the rest.
    team_a.namespaces.push("prod".into());
    h.queue(team_a);
    let out = h.cycle(20);
    assert!(matches!(
        *h.reason_of(&out, "theirs").reason,
        PendingReason::QuotaExceeded { .. }
    ));
}

#[test]
fn a_queue_on_hold_admits_nothing_runs_on_and_still_lends() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 0));
    h.submit_at(job("running", "a", 1, 4), 0);
    assert_eq!(admitted_uids(&h.cycle(10)), vec!["running"]);

    let mut held = queue("a", Some("c"), 8);
    held.on_hold = true;
    h.queue(held);
    h.submit_at(job("waits", "a", 1, 4), 1);
    h.submit_at(job("borrows", "b", 1, 4), 2);
    let out = h.cycle(20);
    assert_eq!(
        admitted_uids(&out),
        vec!["borrows"],
        "the held queue's idle quota is lent"
    );
    assert!(h.admitted("running").is_some(), "admitted jobs run on");
    let why = h.reason_of(&out, "waits");
    assert_eq!(
        *why.reason,
        PendingReason::QueueOnHold {
            queue: "a".into(),
            drains: false
        }
    );
    assert_eq!(why.position, 1);
    assert!(why.message().contains("is on hold"), "{}", why.message());

    h.queue(queue("a", Some("c"), 8));
    h.finish("borrows");
    assert_eq!(admitted_uids(&h.cycle(30)), vec!["waits"]);
}

#[test]
fn a_draining_queue_stops_its_jobs_after_the_grace_period_and_holds_them() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    h.submit_at(job("first", "a", 1, 4), 0);
    h.submit_at(job("second", "a", 1, 4), 1);
    h.submit_at(job("other", "b", 1, 8), 2);
    assert_eq!(h.cycle(10).admissions.len(), 3);

    let mut draining = queue("a", Some("c"), 8);
    draining.on_hold = true;
    draining.drain = true;
    h.queue(draining.clone());
    let out = h.cycle(20);
    let [drain] = out.drains.as_slice() else {
        panic!("one drain: {:?}", out.drains);
    };
    assert_eq!(drain.queue, "a");
    let victims: Vec<&str> = drain.victims.iter().map(|v| v.uid.as_str()).collect();
    assert_eq!(
        victims,
        ["first", "second"],
        "every admitted job of the queue"
    );
    assert!(
        drain
            .victims
            .iter()
            .all(|v| v.rule == PreemptionRule::Drain)
    );
    assert_eq!(drain.evict_at, Timestamp(20 + 120), "the grace period");
    assert!(out.evictions.is_empty(), "they checkpoint first");
    assert!(h.cycle(30).drains.is_empty(), "told once");

    // One reports its checkpoint and goes at once; the other at the deadline.
    h.apply(Event::JobCheckpointed { uid: uid("second") });
    let out = h.cycle(40);
    assert_eq!(out.evictions.len(), 1);
    assert_eq!(
        out.evictions[0].reason,
        EvictionReason::Drained { queue: "a".into() }
    );
    let out = h.cycle(140);
    let evicted: Vec<&str> = out.evictions.iter().map(|e| e.uid.as_str()).collect();
    assert_eq!(evicted, ["first"]);
    assert!(h.admitted("other").is_some(), "other queues run on");
    let why = h.reason_of(&out, "first");
    assert_eq!(
        *why.reason,
        PendingReason::QueueOnHold {
            queue: "a".into(),
            drains: true
        }
    );
    assert!(
        why.message().contains("stopPolicy: HoldAndDrain"),
        "{}",
        why.message()
    );

    draining.on_hold = false;
    draining.drain = false;
    h.queue(draining);
    assert_eq!(admitted_uids(&h.cycle(150)), vec!["first", "second"]);
}

#[test]
fn a_preemptor_whose_queue_closes_to_its_namespace_is_not_admitted() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 0));
    h.submit_at(in_namespace(job("borrower", "b", 1, 8), "ml"), 0);
    assert_eq!(h.cycle(10).admissions.len(), 1, "b borrows a's idle quota");
    h.submit(in_namespace(job("reclaimer", "a", 1, 8), "ml"));
    let out = h.cycle(20);
    assert_eq!(out.preemptions.len(), 1);
    let mut closed = queue("a", Some("c"), 8);
    closed.namespaces = vec!["other".into()];
    h.queue(closed);
    let out = h.cycle(200);
    assert_eq!(out.evictions.len(), 1, "the victim was already told");
    assert_eq!(
        admitted_uids(&out),
        vec!["borrower"],
        "the requeued victim takes the idle quota again"
    );
    assert!(matches!(
        *h.reason_of(&out, "reclaimer").reason,
        PendingReason::NamespaceNotAdmitted { .. }
    ));
}

// ------------------------------------------------------ borrowing / reclaim

#[test]
fn borrowing_uses_idle_cohort_quota_within_the_borrowing_limit() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    let mut b = queue("b", Some("c"), 8);
    b.quotas[0].resources[0].borrowing_limit = Some(4);
    h.queue(b);
    for i in 0..4 {
        h.submit(job(&format!("b{i}"), "b", 1, 4));
    }
    let out = h.cycle(10);
    assert_eq!(out.admissions.len(), 3, "8 nominal + 4 borrowed");
    assert_eq!(out.admissions.iter().filter(|a| a.borrowing).count(), 1);
    assert!(matches!(
        *h.reason_of(&out, "b3").reason,
        PendingReason::QuotaExceeded { available: 0, .. }
    ));
}

/// Queues a and b (nominal 8 each, one cohort); b runs 12 GPUs, 4 of them
/// borrowed from a. a's quota is cut to 2: the pool now lends 10 and b
/// alone draws 12 from it. b's jobs keep running (Kueue does not evict on a
/// quota change either), but b starts nothing more until what it draws
/// fits the pool again, and its job says why.
#[test]
fn a_quota_cut_below_what_borrowers_use_keeps_them_running_and_lends_no_more() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    for (i, b) in ["b1", "b2", "b3"].into_iter().enumerate() {
        h.submit_at(job(b, "b", 1, 4), i as u64);
    }
    assert_eq!(admitted_uids(&h.cycle(10)), vec!["b1", "b2", "b3"]);
    h.queue(queue("a", Some("c"), 2));
    h.submit_at(job("b4", "b", 1, 1), 20);
    let out = h.cycle(30);
    assert!(out.admissions.is_empty() && out.evictions.is_empty());
    for b in ["b1", "b2", "b3"] {
        assert!(h.admitted(b).is_some(), "{b} keeps running");
    }
    assert_eq!(
        *h.reason_of(&out, "b4").reason,
        PendingReason::QuotaExceeded {
            flavor: A100.into(),
            resource: "nvidia.com/gpu".into(),
            requested: 1,
            available: 0,
            nominal: 8,
            used: 12,
            held_for: None,
            // First in line for what the pool gets back.
            holding_cohort_quota: true,
        }
    );
    // b draws 8 of the pool's 10 once b1 ends: 2 to lend again.
    h.finish("b1");
    assert_eq!(admitted_uids(&h.cycle(40)), vec!["b4"]);
}

#[test]
fn reclaim_preempts_only_the_borrower_and_admits_after_the_grace_period() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    for i in 0..4 {
        h.submit_at(job(&format!("b{i}"), "b", 1, 4), i);
    }
    assert_eq!(
        h.cycle(10).admissions.len(),
        4,
        "b borrows all of a's idle quota"
    );
    h.submit(job("a0", "a", 1, 4));
    let out = h.cycle(20);
    assert!(out.admissions.is_empty());
    assert_eq!(out.preemptions.len(), 1);
    let p = &out.preemptions[0];
    assert_eq!(p.preemptor, uid("a0"));
    assert_eq!(p.victims.len(), 1);
    assert_eq!(p.victims[0].rule, PreemptionRule::ReclaimQuota);
    assert_eq!(p.victims[0].queue, "b");
    assert_eq!(p.evict_at, Timestamp(20 + 120));
    assert!(matches!(
        *h.reason_of(&out, "a0").reason,
        PendingReason::AwaitingPreemption { victims: 1, .. }
    ));

    // During the grace period the victim keeps running and nothing else moves.
    let out = h.cycle(60);
    assert!(out.evictions.is_empty() && out.admissions.is_empty() && out.preemptions.is_empty());

    let out = h.cycle(140);
    assert_eq!(out.evictions.len(), 1);
    assert_eq!(out.evictions[0].uid, p.victims[0].uid);
    assert_eq!(admitted_uids(&out), vec!["a0"]);
    assert!(
        h.alloc.is_pending(&p.victims[0].uid),
        "the victim is requeued"
    );
    // b is back at its nominal 8: the requeued victim cannot reclaim from a.
    let out = h.cycle(300);
    assert!(out.preemptions.is_empty());
}

#[test]
fn reclaim_from_lower_priorities_only_spares_borrowers_of_equal_priority() {
    // b runs 16 GPUs on its nominal 8: two jobs of priority 5 (8 and 4
    // GPUs) and one of priority 0 (4). a's job of priority 5 then wants
    // `gpus` of a's quota back.
    let scenario = |lower_priority_only: bool, gpus: u32| {
        let mut h = Harness::default_config();
        h.nodes([node("n1", 8), node("n2", 8)]);
        let mut a = queue("a", Some("c"), 8);
        a.preemption.reclaim_lower_priority_only = lower_priority_only;
        h.queue(a);
        h.queue(queue("b", Some("c"), 8));
        for (i, (name, gpus, priority)) in [("b-big", 8, 5), ("b-high", 4, 5), ("b-low", 4, 0)]
            .into_iter()
            .enumerate()
        {
            let mut j = job(name, "b", 1, gpus);
            j.priority = priority;
            h.submit_at(j, i as u64);
        }
        assert_eq!(
            h.cycle(10).admissions.len(),
            3,
            "b borrows all of a's quota"
        );
        let mut a0 = job("a0", "a", 1, gpus);
        a0.priority = 5;
        h.submit(a0);
        h.cycle(20)
    };
    // Kueue's `Any`: the one gang that frees a whole node.
    assert_eq!(only_victims(&scenario(false, 8)), ["b-big"]);
    // `LowerPriority`: b-big and b-high (priority 5, as a0's) are spared,
    // and b-low alone cannot free 8 GPUs on one node.
    let out = scenario(true, 8);
    assert!(out.preemptions.is_empty(), "{:?}", only_victims(&out));
    assert_eq!(only_victims(&scenario(true, 4)), ["b-low"]);
}

#[test]
fn a_checkpointed_victim_is_evicted_before_its_deadline() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    let mut low = job("low", "q", 1, 8);
    low.priority = 0;
    h.submit(low);
    h.cycle(1);
    let mut high = job("high", "q", 1, 8);
    high.priority = 10;
    h.submit(high);
    let out = h.cycle(2);
    assert_eq!(out.preemptions.len(), 1);
    assert_eq!(
        out.preemptions[0].victims[0].rule,
        PreemptionRule::LowerPriority
    );
    h.apply(Event::JobCheckpointed { uid: uid("low") });
    let out = h.cycle(5);
    assert_eq!(out.evictions.len(), 1);
    assert_eq!(admitted_uids(&out), vec!["high"]);
}

/// "high" evicts v1 and v2 from n1. v1 checkpoints first and goes, and
/// starts again at once on n2, freed meanwhile. Running again, it is no
/// victim: when v2 goes at the deadline, high starts (it once waited for v1
/// to end).
#[test]
fn a_victim_that_starts_again_elsewhere_is_not_waited_for() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 16));
    h.submit_at(job("v1", "q", 1, 4), 0);
    h.submit_at(job("v2", "q", 1, 4), 1);
    let mut other = pinned(job("other", "q", 1, 8), "n2");
    other.preemptible = false;
    h.submit_at(other, 2);
    assert_eq!(h.cycle(10).admissions.len(), 3);
    assert_eq!(h.nodes_of("v1"), vec!["n1"]);
    let mut high = job("high", "q", 1, 8);
    high.priority = 10;
    h.submit_at(high, 20);
    let out = h.cycle(20);
    assert_eq!(only_victims(&out), vec!["v1", "v2"]);
    let evict_at = out.preemptions[0].evict_at.0;
    h.apply(Event::JobCheckpointed { uid: uid("v1") });
    h.finish("other");
    let out = h.cycle(30);
    assert_eq!(out.evictions.len(), 1, "v1 goes");
    assert_eq!(admitted_uids(&out), vec!["v1"]);
    assert_eq!(h.nodes_of("v1"), vec!["n2"], "n1 is held for high");
    let out = h.cycle(evict_at);
    assert_eq!(out.evictions.len(), 1, "v2 goes at the deadline");
    // And starts again beside v1.
    assert_eq!(admitted_uids(&out), vec!["high", "v2"]);
}

/// a (nominal 12) uses 4, b (nominal 4) borrows 8: the pool of 16 is full.
/// a's 8-GPU job is within a's nominal but needs b's borrowed units back,
/// while b keeps a stream of 1-GPU jobs waiting (preemption off).
fn cohort_hold_scenario(backfill: bool) -> (Harness, Vec<String>) {
    let mut h = Harness::new(AllocatorConfig {
        backfill: BackfillPolicy {
            enabled: backfill,
            ..BackfillPolicy::default()
        },
        preemption: no_preemption(),
        ..AllocatorConfig::default()
    });
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8)]);
    h.queue(queue("a", Some("c"), 12));
    h.queue(queue("b", Some("c"), 4));
    for i in 0..12 {
        h.submit(job(&format!("b-run-{i:02}"), "b", 1, 1));
    }
    for i in 0..4 {
        h.submit(job(&format!("a-run-{i}"), "a", 1, 1));
    }
    assert_eq!(h.cycle(0).admissions.len(), 16);
    h.submit_at(job("a-big", "a", 1, 8), 10);
    for i in 0..20 {
        h.submit_at(job(&format!("b-wait-{i:02}"), "b", 1, 1), 20 + i);
    }
    let mut admitted = Vec::new();
    for i in 0..8 {
        h.finish(&format!("b-run-{i:02}"));
        let out = h.cycle(100 + 10 * u64::from(i as u32));
        admitted.extend(admitted_uids(&out));
    }
    (h, admitted)
}

#[test]
fn cohort_headroom_is_kept_for_the_first_job_in_line() {
    let (h, admitted) = cohort_hold_scenario(true);
    assert_eq!(
        admitted,
        vec!["a-big"],
        "headroom accumulated for the big job"
    );
    assert!(h.admitted("a-big").is_some());
    let (_, without) = cohort_hold_scenario(false);
    assert!(
        !without.contains(&"a-big".to_string()),
        "small jobs take every freed GPU"
    );
    assert_eq!(without.len(), 8);
}

#[test]
fn a_short_job_passes_a_cohort_hold_however_many_alike_jobs_wait_before_it() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8)]);
    h.queue(queue("a", Some("c"), 12));
    h.queue(queue("b", Some("c"), 4));
    for i in 0..12 {
        h.submit(job(&format!("b-run-{i:02}"), "b", 1, 1));
    }
    for i in 0..4 {
        h.submit(job(&format!("a-run-{i}"), "a", 1, 1));
    }
    assert_eq!(h.cycle(0).admissions.len(), 16);
    h.submit_at(job("a-big", "a", 1, 8), 10);
    // Many jobs of one shape without an estimate: the first one's quota
    // failure answers for the others...
    for i in 0..20 {
        h.submit_at(job(&format!("b-wait-{i:02}"), "b", 1, 1), 20 + i);
    }
    // ...but not for this one, of the same shape, which ends long before
    // the held headroom can add up to a-big's 8 GPUs.
    let mut short = job("b-short", "b", 1, 1);
    short.submitted_at = Timestamp(50);
    short.runtime_estimate_secs = Some(60);
    h.submit(short);
    h.finish("b-run-00");
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["b-short"]);
    let first = &h.reason_of(&out, "b-wait-00").reason;
    assert!(
        matches!(&**first, PendingReason::QuotaExceeded { held_for: Some(holder), .. } if holder.as_str() == "a-big"),
        "{first:?}"
    );
    for i in 1..20 {
        assert_eq!(&h.reason_of(&out, &format!("b-wait-{i:02}")).reason, first);
    }
}

/// A cycle time by which the gangs below, submitted at 10 s, have waited
/// past `backfill.queueHoldAfterSecs` (600 s), so their queues hold for them.
const HELD_FROM: u64 = 1_000;

/// Queue a (nominal 4, one 4-GPU node) runs four 1-GPU jobs; a 4-GPU gang
/// then waits with 1-GPU jobs behind it. Before the gang has waited
/// `backfill.queueHoldAfterSecs` a freed GPU goes to the next job (best
/// effort); after, the queue keeps what it frees for the gang.
#[test]
fn a_queue_holds_for_its_blocked_gang_once_it_has_waited() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n", 4)]);
    h.queue(queue("a", None, 4));
    for i in 0..4 {
        h.submit(job(&format!("run-{i}"), "a", 1, 1));
    }
    assert_eq!(h.cycle(0).admissions.len(), 4);
    h.submit_at(job("gang", "a", 4, 1), 10);
    for i in 0..3 {
        h.submit_at(job(&format!("wait-{i}"), "a", 1, 1), 20 + i);
    }
    h.finish("run-0");
    assert_eq!(
        admitted_uids(&h.cycle(300)),
        vec!["wait-0"],
        "best effort before 600 s"
    );
    h.finish("run-1");
    let out = h.cycle(700);
    assert!(
        admitted_uids(&out).is_empty(),
        "held for the gang after 600 s"
    );
    h.assert_held_for(&out, "wait-1", "gang");
    for (i, done) in ["run-2", "run-3", "wait-0"].into_iter().enumerate() {
        h.finish(done);
        let admitted = admitted_uids(&h.cycle(800 + 100 * i as u64));
        let expected: &[&str] = if done == "wait-0" { &["gang"] } else { &[] };
        assert_eq!(admitted, expected, "after {done} ends");
    }
}

/// The queue hold goes to the first blocked job that has waited, even when
/// a younger job of the same size is ahead of it in line (by priority): a
/// quota failure is only reused for jobs that have passed the same waits.
/// Queue a (nominal 16) runs 8 GPUs; "young" (priority 10) and "old" both
/// need 16 more, "small" needs 8, which fits a's nominal quota.
#[test]
fn the_queue_hold_goes_to_the_first_job_that_waited_not_the_first_in_line() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8), node("n4", 8)]);
    h.queue(queue("a", None, 16));
    let mut running = job("run", "a", 1, 8);
    running.runtime_estimate_secs = Some(3_600);
    h.submit(running);
    assert_eq!(admitted_uids(&h.cycle(0)), vec!["run"]);
    let mut young = job("young", "a", 2, 8);
    young.priority = 10;
    h.submit_at(young, 990);
    h.submit_at(job("old", "a", 2, 8), 100);
    h.submit_at(job("small", "a", 1, 8), 995);
    let out = h.cycle(1_000);
    assert!(admitted_uids(&out).is_empty(), "a keeps its 8 GPUs for old");
    h.assert_held_for(&out, "small", "old");
}

/// a (nominal 16) and b (nominal 8) fill their nominal quota and the 24
/// GPUs. a's 8 x 1-GPU gang is within a's nominal but would borrow while a's
/// 1-GPU jobs hold it; a keeps a stream of 1-GPU jobs without an estimate
/// waiting, and its running jobs end one per cycle (preemption off).
#[test]
fn a_big_gang_is_not_starved_by_small_jobs_of_its_own_queue() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8)]);
    h.queue(queue("a", Some("c"), 16));
    h.queue(queue("b", Some("c"), 8));
    for i in 0..16 {
        h.submit(job(&format!("a-run-{i:02}"), "a", 1, 1));
    }
    for i in 0..8 {
        h.submit(job(&format!("b-run-{i}"), "b", 1, 1));
    }
    assert_eq!(h.cycle(0).admissions.len(), 24);
    h.submit_at(job("a-big", "a", 8, 1), 10);
    for i in 0..20 {
        h.submit_at(job(&format!("a-wait-{i:02}"), "a", 1, 1), 20 + i);
    }
    // Ends long before a's running jobs (no estimate: 4 h assumed) make
    // room for a-big, so it may use a's quota meanwhile.
    let mut short = job("a-short", "a", 1, 1);
    short.submitted_at = Timestamp(15);
    short.runtime_estimate_secs = Some(60);
    h.submit(short);
    let mut admitted = Vec::new();
    for i in 0..8u64 {
        h.finish(&format!("a-run-{i:02}"));
        let out = h.cycle(HELD_FROM + 100 * i);
        if i == 0 {
            h.assert_held_for(&out, "a-wait-00", "a-big");
        }
        admitted.extend(admitted_uids(&out));
        if i == 0 {
            h.finish("a-short");
        }
    }
    assert_eq!(
        admitted,
        vec!["a-short", "a-big"],
        "a's freed quota was kept for a-big"
    );
}

/// Three queues without a cohort (nominal 4 each, one 4-GPU node each) run
/// four 1-GPU jobs each; each then gets a 4-GPU gang followed by a stream of
/// 1-GPU jobs, and one running job per queue ends per cycle. Every queue
/// keeps what frees up for its gang, though only one reservation is allowed
/// per cycle: a queue hold is per queue, not capped.
#[test]
fn every_queue_keeps_its_freed_quota_for_its_blocked_gang() {
    let mut h = Harness::new(AllocatorConfig {
        preemption: no_preemption(),
        backfill: BackfillPolicy {
            max_reservations: 1,
            ..BackfillPolicy::default()
        },
        ..AllocatorConfig::default()
    });
    let queues = ["a", "b", "c"];
    h.nodes(queues.map(|q| node(&format!("n-{q}"), 4)));
    for q in queues {
        h.queue(queue(q, None, 4));
        for i in 0..4 {
            h.submit(job(&format!("{q}-run-{i}"), q, 1, 1));
        }
    }
    assert_eq!(h.cycle(0).admissions.len(), 12);
    for q in queues {
        h.submit_at(job(&format!("{q}-gang"), q, 4, 1), 10);
        for i in 0..5 {
            h.submit_at(job(&format!("{q}-wait-{i}"), q, 1, 1), 20 + i);
        }
    }
    let mut admitted = Vec::new();
    for i in 0..4u64 {
        for q in queues {
            h.finish(&format!("{q}-run-{i}"));
        }
        let out = h.cycle(HELD_FROM + 100 * i);
        if i == 0 {
            for q in queues {
                h.assert_held_for(&out, &format!("{q}-wait-0"), &format!("{q}-gang"));
            }
        }
        admitted.extend(admitted_uids(&out));
    }
    admitted.sort();
    assert_eq!(admitted, vec!["a-gang", "b-gang", "c-gang"]);
}

/// a (nominal 4, may not borrow) and d (nominal 4) share a cohort and two
/// 4-GPU nodes, each running four 1-GPU jobs. a's 4-GPU gang waits for a's
/// own jobs to end (one per cycle); d has 1-GPU jobs that would borrow what
/// a frees. a keeps that quota for its gang, from d's borrowers too: lent
/// out, the gang could only start by preempting them (preemption off).
#[test]
fn quota_a_queue_keeps_for_its_gang_is_not_lent_to_other_queues() {
    let mut h = Harness::without_preemption();
    h.nodes([node("n1", 4), node("n2", 4)]);
    let mut a = queue("a", Some("c"), 4);
    a.quotas[0].resources[0].borrowing_limit = Some(0);
    h.queue(a);
    h.queue(queue("d", Some("c"), 4));
    for q in ["a", "d"] {
        for i in 0..4 {
            h.submit(job(&format!("{q}-run-{i}"), q, 1, 1));
        }
    }
    assert_eq!(h.cycle(0).admissions.len(), 8);
    h.submit_at(job("a-gang", "a", 4, 1), 10);
    for i in 0..5 {
        h.submit_at(job(&format!("d-wait-{i}"), "d", 1, 1), 20 + i);
    }
    let mut admitted = Vec::new();
    for i in 0..4u64 {
        h.finish(&format!("a-run-{i}"));
        let out = h.cycle(HELD_FROM + 100 * i);
        if i == 0 {
            h.assert_held_for(&out, "d-wait-0", "a-gang");
        }
        admitted.extend(admitted_uids(&out));
    }
    assert_eq!(admitted, vec!["a-gang"]);
}

/// a and b share a cohort, 8 GPUs of nominal quota each, on four 4-GPU
/// nodes; a's 12-GPU gang can only run by borrowing, and both queues keep
/// 4-GPU jobs without an estimate waiting. Until the gang has waited
/// `borrowerHoldAfterSecs` each queue takes its own freed quota back; then
/// the cohort keeps what frees up until the gang fits, and once it runs,
/// b's reclaim takes a's other job but never the gang.
#[test]
fn a_gang_larger_than_its_queues_quota_starts_once_it_has_waited() {
    let mut h = Harness::default_config();
    h.nodes((0..4).map(|i| node(&format!("n{i}"), 4)));
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    for q in ["a", "b"] {
        for i in 0..2 {
            h.submit(job(&format!("{q}-run-{i}"), q, 1, 4));
        }
    }
    assert_eq!(h.cycle(0).admissions.len(), 4);
    h.submit_at(job("a-gang", "a", 3, 4), 10);
    for q in ["a", "b"] {
        for i in 0..4 {
            h.submit_at(job(&format!("{q}-wait-{i}"), q, 1, 4), 20 + i);
        }
    }
    let hold_from = BackfillPolicy::default().borrower_hold_after_secs;
    h.finish("b-run-0");
    assert_eq!(
        admitted_uids(&h.cycle(hold_from - 100)),
        vec!["b-wait-0"],
        "b takes its quota back before the gang has waited"
    );
    h.finish("b-wait-0");
    let out = h.cycle(hold_from + 10);
    assert!(admitted_uids(&out).is_empty(), "kept for the gang");
    h.assert_held_for(&out, "b-wait-1", "a-gang");
    h.assert_held_for(&out, "a-wait-0", "a-gang");
    h.finish("a-run-0");
    assert!(admitted_uids(&h.cycle(hold_from + 100)).is_empty());
    h.finish("b-run-1");
    // a now borrows 8 of b's nominal quota, 4 of them with a-run-1.
    let mut victims = Vec::new();
    for step in 0..=10 {
        let out = h.cycle(hold_from + 200 + 60 * step);
        if step == 0 {
            assert_eq!(admitted_uids(&out), vec!["a-gang"]);
        }
        for p in &out.preemptions {
            victims.extend(p.victims.iter().map(|v| v.uid.to_string()));
        }
    }
    assert_eq!(victims, vec!["a-run-1"], "the gang is never reclaimed");
    assert!(h.admitted("a-gang").is_some());
}

/// a, b and d share a cohort, 8 GPUs of nominal quota each, on six 4-GPU
/// nodes, all busy: d borrows 8. While the cohort keeps quota for a's
/// starving 12-GPU gang, b's job does not reclaim from d (the GPUs d frees
/// are what the gang waits for); the gang starts once they are free (then
/// b may reclaim from a, which borrows).
#[test]
fn nobody_reclaims_in_a_cohort_that_keeps_quota_for_a_starving_gang() {
    let mut h = Harness::default_config();
    h.nodes((0..6).map(|i| node(&format!("n{i}"), 4)));
    for q in ["a", "b", "d"] {
        h.queue(queue(q, Some("c"), 8));
    }
    for (q, jobs) in [("a", 2), ("d", 4)] {
        for i in 0..jobs {
            h.submit(job(&format!("{q}-run-{i}"), q, 1, 4));
        }
    }
    assert_eq!(h.cycle(0).admissions.len(), 6);
    h.submit_at(job("a-gang", "a", 3, 4), 10);
    let hold_from = BackfillPolicy::default().borrower_hold_after_secs;
    h.submit_at(job("b-wait", "b", 1, 4), hold_from);
    let out = h.cycle(hold_from + 10);
    assert!(out.preemptions.is_empty(), "b reclaims nothing from d");
    h.assert_held_for(&out, "b-wait", "a-gang");
    let mut admitted = Vec::new();
    for (i, done) in ["d-run-0", "d-run-1", "a-run-0"].into_iter().enumerate() {
        h.finish(done);
        let out = h.cycle(hold_from + 100 * (i as u64 + 1));
        let gang_starts = admitted_uids(&out).iter().any(|u| u == "a-gang");
        assert!(
            gang_starts || out.preemptions.is_empty(),
            "no reclaim while the gang waits"
        );
        admitted.extend(admitted_uids(&out));
    }
    assert_eq!(admitted, vec!["a-gang"]);
}

/// A gang that could never fit is no starving borrower: 5 x 4 GPUs is more
/// than the cohort's 16, and 2 x 8 GPUs fits no 4-GPU node. Past the wait,
/// b's job still gets b's own quota.
#[test]
fn a_gang_that_can_never_fit_does_not_drain_its_cohort() {
    for (workers, gpus) in [(5, 4), (2, 8)] {
        let mut h = Harness::default_config();
        h.nodes((0..4).map(|i| node(&format!("n{i}"), 4)));
        h.queue(queue("a", Some("c"), 8));
        h.queue(queue("b", Some("c"), 8));
        h.submit(job("b-run", "b", 1, 4));
        assert_eq!(h.cycle(0).admissions.len(), 1);
        h.submit_at(job("a-gang", "a", workers, gpus), 10);
        h.submit_at(job("b-wait", "b", 1, 4), 20);
        let hold_from = BackfillPolicy::default().borrower_hold_after_secs;
        assert_eq!(
            admitted_uids(&h.cycle(hold_from + 10)),
            vec!["b-wait"],
            "{workers} x {gpus} GPUs"
        );
    }
}

// ----------------------------------------------------------- priority, aging

#[test]
fn priority_orders_jobs_within_a_queue() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    let mut early_low = job("early-low", "q", 1, 8);
    early_low.submitted_at = Timestamp(0);
    early_low.priority = 0;
    let mut late_high = job("late-high", "q", 1, 8);
    late_high.submitted_at = Timestamp(50);
    late_high.priority = 10;
    h.submit(early_low);
    h.submit(late_high);
    let out = h.cycle(100);
    assert_eq!(admitted_uids(&out), vec!["late-high"]);
    let why = h.reason_of(&out, "early-low");
    assert_eq!(
        (why.position, why.queue_length),
        (1, 1),
        "first of those still waiting"
    );
}

fn aging_scenario(aging: AgingPolicy) -> Vec<String> {
    let mut h = Harness::new(AllocatorConfig {
        aging,
        ..AllocatorConfig::default()
    });
    aging_race(&mut h, queue("q", None, 8))
}

/// Two 8-GPU jobs race for one 8-GPU node at t=1000: `old-low` (priority 0,
/// waiting since 0) against `new-high` (priority 5, waiting since 900).
fn aging_race(h: &mut Harness, q: QueueSpec) -> Vec<String> {
    h.nodes([node("n1", 8)]);
    h.queue(q);
    let mut old = job("old-low", "q", 1, 8);
    old.submitted_at = Timestamp(0);
    old.priority = 0;
    let mut new = job("new-high", "q", 1, 8);
    new.submitted_at = Timestamp(900);
    new.priority = 5;
    h.submit(old);
    h.submit(new);
    admitted_uids(&h.cycle(1_000))
}

#[test]
fn aging_lets_a_long_waiting_low_priority_job_overtake() {
    let aged = aging_scenario(AgingPolicy {
        interval_secs: 100,
        step: 1,
        max_boost: 100,
    });
    assert_eq!(aged, vec!["old-low"], "1000 s of waiting = +10 priority");
    let no_aging = aging_scenario(AgingPolicy {
        interval_secs: 0,
        step: 1,
        max_boost: 0,
    });
    assert_eq!(no_aging, vec!["new-high"]);
}

#[test]
fn a_queue_ages_by_its_own_policy_over_the_configured_one() {
    // The configured aging (one step per 600 s) gives old-low only +1.
    let config = AllocatorConfig::default();
    let mut default_aging = Harness::new(config.clone());
    assert_eq!(
        aging_race(&mut default_aging, queue("q", None, 8)),
        vec!["new-high"]
    );
    // The queue's own aging (3 per 500 s) gives it +6: it overtakes.
    let mut own = Harness::new(config);
    let mut q = queue("q", None, 8);
    q.aging = Some(AgingPolicy {
        interval_secs: 500,
        step: 3,
        max_boost: 1_000,
    });
    assert_eq!(aging_race(&mut own, q.clone()), vec!["old-low"]);
    let out = own.cycle(1_000);
    assert_eq!(own.reason_of(&out, "new-high").effective_priority, 5);
    // A policy that cannot age is rejected naming the field.
    q.aging = Some(AgingPolicy {
        interval_secs: 60,
        step: 0,
        max_boost: 10,
    });
    assert!(matches!(
        q.validate(),
        Err(AllocatorError::InvalidQueue { ref field, .. }) if field == "aging.step"
    ));
}

// --------------------------------------------------------------------- DRF

#[test]
fn drf_splits_borrowed_capacity_by_weight() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 4), node("n2", 4), node("n3", 4)]);
    let mut a = queue("a", Some("c"), 0);
    a.weight = 1.0;
    let mut b = queue("b", Some("c"), 0);
    b.weight = 2.0;
    h.queue(a);
    h.queue(b);
    h.queue(queue("lender", Some("c"), 12));
    for i in 0..12 {
        h.submit(job(&format!("a{i:02}"), "a", 1, 1));
        h.submit(job(&format!("b{i:02}"), "b", 1, 1));
    }
    let out = h.cycle(10);
    let a_count = out.admissions.iter().filter(|x| x.queue == "a").count();
    let b_count = out.admissions.iter().filter(|x| x.queue == "b").count();
    assert_eq!(
        (a_count, b_count),
        (4, 8),
        "weight 2 gets twice the borrowed share"
    );
    assert!(out.preemptions.is_empty(), "the split is already fair");
}

#[test]
fn admits_many_jobs_per_cycle_across_all_queues() {
    let mut h = Harness::default_config();
    h.nodes((0..8).map(|i| node(&format!("n{i}"), 8)));
    for q in ["q1", "q2", "q3"] {
        h.queue(queue(q, None, 20));
        for i in 0..5 {
            h.submit(job(&format!("{q}-{i}"), q, 1, 4));
        }
    }
    let out = h.cycle(10);
    assert_eq!(out.admissions.len(), 15, "not one per queue per cycle");
    assert!(out.pending.is_empty());
}

// --------------------------------------------------------------------- gang

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

// ---------------------------------------------------------- best fit, topology

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
            PendingReason::InsufficientCapacity {
                fits_when_empty: false,
                ..
            }
        ),
        "no node in z3, now or ever"
    );
    let message = h.reason_of(&out, "nowhere").message();
    assert!(
        message.contains("does not fit the nodes of this flavor its node selector, affinity"),
        "the job's own constraints are named: {message}"
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
            PendingReason::InsufficientCapacity {
                fits_when_empty: false,
                ..
            }
        ),
        "three nodes never host four workers apart"
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
    assert!(
        h.reason_of(&out, "never")
            .message()
            .contains("does not fit this flavor even when it is empty"),
        "no node holds 9 GPUs"
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
        why.message()
            .contains("does not fit this flavor even when it is empty"),
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

// ---------------------------------------------------------- MIG, time-slicing

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

// --------------------------------------------------------------- preemption

#[test]
fn preemption_picks_the_smallest_set_of_whole_gangs() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8)]);
    h.queue(queue("q", None, 24));
    // n1: one 8-GPU job; n2: two 4-GPU jobs; n3: a 2x4 gang spread on n3 and n2? No:
    // keep n3 full with a high-priority job so only n1/n2 can be cleared.
    let mut keep = pinned(job("keep", "q", 1, 8), "n3");
    keep.priority = 100;
    let mut big = pinned(job("big-low", "q", 1, 8), "n1");
    big.priority = 1;
    let s1 = pinned(job("small-1", "q", 1, 4), "n2");
    let s2 = pinned(job("small-2", "q", 1, 4), "n2");
    for j in [keep, big, s1, s2] {
        h.submit(j);
    }
    assert_eq!(h.cycle(1).admissions.len(), 4);
    let mut urgent = job("urgent", "q", 1, 8);
    urgent.priority = 50;
    h.submit(urgent);
    let out = h.cycle(2);
    assert_eq!(
        only_victims(&out),
        vec!["big-low"],
        "one whole gang beats two smaller ones"
    );
    assert_eq!(out.preemptions[0].planned_nodes[0].node, "n1");
}

/// Submits "urgent", one worker of `gpus` GPUs at priority 10 in queue "q",
/// and runs the cycle at `now`.
fn urgent_job_preempts(h: &mut Harness, gpus: u32, now: u64) -> CycleOutcome {
    let mut urgent = job("urgent", "q", 1, gpus);
    urgent.priority = 10;
    h.submit(urgent);
    h.cycle(now)
}

#[test]
fn preemption_throws_away_the_least_work() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8), node("n3", 8)]);
    h.queue(queue("q", None, 24));
    // A 2x8 gang on n1+n2 and two 4-GPU jobs on n3, all low priority.
    let mut gang = job("gang-16", "q", 2, 8);
    gang.node_selector.clear();
    h.submit(gang);
    h.cycle(1);
    let gang_nodes = h.nodes_of("gang-16");
    let free_node = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| !gang_nodes.iter().any(|g| g == n))
        .expect("one node left");
    for small in ["small-a", "small-b"] {
        h.submit(pinned(job(small, "q", 1, 4), free_node));
    }
    assert_eq!(h.cycle(2).admissions.len(), 2);
    let out = urgent_job_preempts(&mut h, 8, 3);
    assert_eq!(
        only_victims(&out),
        vec!["small-a", "small-b"],
        "8 GPUs of work lost, not 16"
    );
}

/// A job evicted without a resumable checkpoint starts over: an 8-GPU job
/// admitted a minute ago loses less than a 4-GPU job that ran for hours.
#[test]
fn preemption_spares_long_running_work_over_fewer_gpus() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 4), node("n2", 8)]);
    h.queue(queue("q", None, 12));
    h.submit(pinned(job("old-4", "q", 1, 4), "n1"));
    assert_eq!(h.cycle(1).admissions.len(), 1);
    h.submit(pinned(job("fresh-8", "q", 1, 8), "n2"));
    assert_eq!(h.cycle(36_000).admissions.len(), 1);
    let out = urgent_job_preempts(&mut h, 4, 36_060);
    assert_eq!(
        only_victims(&out),
        vec!["fresh-8"],
        "8 GPUs x 1 min of work lost, not 4 GPUs x 10 h"
    );
    assert_eq!(out.preemptions[0].planned_nodes[0].node, "n2");
}

/// Every victim also loses its grace period and a restart, per GPU: a
/// 16-GPU gang a minute in costs 16 x 180 GPU-s, more than a 4-GPU job
/// eight minutes in (4 x 600), though the gang has run less.
#[test]
fn preemption_counts_the_grace_period_as_each_victim_gpus_restart() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 4), node("n2", 8), node("n3", 8)]);
    h.queue(queue("q", None, 20));
    h.submit(pinned(job("small-4", "q", 1, 4), "n1"));
    assert_eq!(h.cycle(1_000).admissions.len(), 1);
    h.submit(job("gang-16", "q", 2, 8));
    assert_eq!(h.cycle(1_420).admissions.len(), 1);
    let out = urgent_job_preempts(&mut h, 4, 1_480);
    assert_eq!(
        only_victims(&out),
        vec!["small-4"],
        "4 x (480 + 120) GPU-s lost, not 16 x (60 + 120)"
    );
}

/// Nodes `n1` and `n2` of 4 GPUs, queue `q` with all 8.
fn two_nodes_of_4() -> Harness {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 4), node("n2", 4)]);
    h.queue(queue("q", None, 8));
    h
}

/// A restarted job starts afresh, so by work alone it is the cheapest
/// victim every time it runs again. Each earlier restart counts one more:
/// a job back for 30 s after one restart costs 4 x (30 + 2 x 120) GPU-s,
/// more than a job that has run 50 s and never restarted (4 x 170).
/// Restarts are this allocator's own requeues (here after a lost node) and
/// those of earlier attempts (`earlierRestarts`, from `status.restartCount`).
#[test]
fn preemption_counts_a_restart_for_each_earlier_one() {
    let mut h = two_nodes_of_4();
    h.submit(pinned(job("requeued-4", "q", 1, 4), "n1"));
    assert_eq!(h.cycle(1).admissions.len(), 1);
    h.submit(pinned(job("fresh-4", "q", 1, 4), "n2"));
    assert_eq!(h.cycle(10).admissions.len(), 1);
    h.apply(Event::NodeRemoved { name: "n1".into() });
    assert_eq!(h.cycle(20).evictions.len(), 1);
    h.nodes([node("n1", 4)]);
    assert_eq!(admitted_uids(&h.cycle(30)), vec!["requeued-4"]);
    let out = urgent_job_preempts(&mut h, 4, 60);
    assert_eq!(
        only_victims(&out),
        vec!["fresh-4"],
        "4 x (50 + 120) GPU-s lost, not 4 x (30 + 2 x 120)"
    );

    let mut h = two_nodes_of_4();
    h.submit(pinned(job("fresh-4", "q", 1, 4), "n2"));
    assert_eq!(h.cycle(10).admissions.len(), 1);
    let mut second_attempt = pinned(job("second-attempt-4", "q", 1, 4), "n1");
    second_attempt.earlier_restarts = 1;
    h.submit(second_attempt);
    assert_eq!(h.cycle(30).admissions.len(), 1);
    let out = urgent_job_preempts(&mut h, 4, 60);
    assert_eq!(
        only_victims(&out),
        vec!["fresh-4"],
        "the attempt's earlier restart counts as a requeue does"
    );
}

/// A search looks at up to 512 candidates, latest admitted first: a job
/// that has just started is among them, however many bigger jobs have run
/// for an hour.
#[test]
fn preemption_looks_at_the_latest_admitted_candidates_first() {
    let mut h = Harness::default_config();
    let mut nodes: Vec<NodeInfo> = (0..520).map(|i| node(&format!("n{i}"), 2)).collect();
    nodes.push(node("small", 1));
    h.nodes(nodes);
    h.queue(queue("q", None, 1_041));
    for i in 0..520 {
        h.submit(job(&format!("old-{i}"), "q", 1, 2));
    }
    assert_eq!(h.cycle(1).admissions.len(), 520);
    h.submit(job("fresh-1", "q", 1, 1));
    assert_eq!(h.cycle(3_600).admissions.len(), 1);
    let out = urgent_job_preempts(&mut h, 1, 3_660);
    assert_eq!(
        only_victims(&out),
        vec!["fresh-1"],
        "1 GPU x 1 min of work lost, not 2 GPUs x 1 h"
    );
}

#[test]
fn preemption_evicts_whole_multi_node_gangs_and_never_higher_priority() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("q", None, 16));
    let mut gang = job("gang-low", "q", 2, 8);
    gang.priority = 0;
    h.submit(gang);
    h.cycle(1);
    let mut peer = job("peer", "q", 2, 8);
    peer.priority = 0;
    h.submit(peer);
    let out = h.cycle(2);
    assert!(out.preemptions.is_empty(), "equal priority never preempts");
    let mut high = job("high", "q", 1, 8);
    high.priority = 10;
    h.submit(high);
    let out = h.cycle(3);
    assert_eq!(out.preemptions.len(), 1);
    assert_eq!(out.preemptions[0].preemptor, uid("high"));
    assert_eq!(out.preemptions[0].victims[0].uid, uid("gang-low"));
    assert_eq!(
        out.preemptions[0].victims[0].units, 16,
        "the whole gang goes"
    );
    let out = h.cycle(3 + 120);
    assert_eq!(out.evictions.len(), 1);
    assert!(admitted_uids(&out).contains(&"high".to_string()));
}

/// The service submits every attempt of a TrainingJob as a new job, so the
/// loop guard travels in the spec: a job never preempts the preemptor of
/// its earlier attempt, though the rules would let it.
#[test]
fn a_preemption_never_starts_a_job_on_headroom_kept_for_another() {
    // Queue qa's gang waits for cohort headroom on A100, first in line, so
    // the cohort keeps qa's unused 8 GPUs for it. Queue qb's urgent job
    // would have to borrow 3 of those on A100 and finds H100 full. Evicting
    // qb's 1-GPU job on A100 would let it in on the kept headroom; the
    // preemption must take qb's H100 job instead.
    let mut h = Harness::default_config();
    let mut h100 = node("h1", 8);
    h100.labels
        .insert(names::GPU_PRODUCT_LABEL.into(), "H100".into());
    h.nodes([node("a1", 8), node("a2", 8), h100]);
    let two_flavors = |name: &str, a100: u64, h100: u64| QueueSpec {
        name: name.into(),
        cohort: Some("c".into()),
        quotas: vec![
            FlavorQuota {
                flavor: A100.into(),
                resources: vec![gpu_quota(a100)],
            },
            FlavorQuota {
                flavor: "H100.on-demand".into(),
                resources: vec![gpu_quota(h100)],
            },
        ],
        ..QueueSpec::default()
    };
    h.queue(two_flavors("qa", 8, 0));
    h.queue(two_flavors("qb", 8, 8));
    h.submit_at(job("small", "qb", 1, 1), 0);
    let mut urgent_fill = job("fill", "qb", 1, 7);
    urgent_fill.priority = 10;
    h.submit_at(urgent_fill, 1);
    let mut on_h100 = job("on-h100", "qb", 1, 8);
    on_h100
        .node_selector
        .insert(names::GPU_PRODUCT_LABEL.into(), "H100".into());
    h.submit_at(on_h100, 2);
    assert_eq!(
        admitted_uids(&h.cycle(10)),
        vec!["fill", "small", "on-h100"]
    );
    h.submit_at(job("gang", "qa", 2, 8), 20);
    h.cycle(20);
    let mut urgent = job("urgent", "qb", 1, 4);
    urgent.priority = 10;
    h.submit_at(urgent, 30);
    let out = h.cycle(30);
    assert_eq!(only_victims(&out), vec!["on-h100"], "not the A100 job");
    h.cycle(200);
    assert_eq!(
        h.admitted("urgent").expect("admitted").flavor,
        "H100.on-demand"
    );
    let out = h.cycle(400);
    assert!(
        matches!(
            *h.reason_of(&out, "gang").reason,
            PendingReason::QuotaExceeded { available: 8, .. }
        ),
        "qa's headroom is intact: {}",
        h.reason_of(&out, "gang").message()
    );
}

/// Queue a (nominal 8, no cohort) runs "r" (priority 5, 4 GPUs) and "v"
/// (priority 0, 2 GPUs). "h" (priority 5, 8 GPUs) waits for a's nominal
/// quota: it cannot preempt "r" (same priority), and evicting "v" alone
/// would not make room. Once it has waited, a keeps its nominal quota for
/// it. "p" (priority 3, 4 GPUs) is behind "h" in line: evicting "v" would
/// start it on that kept quota, and "h" would then evict "p" once "r"
/// ended. A job ahead of "h" in line ("u", priority 7) is not held back,
/// nor is one that ends before "h" can expect the quota.
#[test]
fn a_preemption_never_takes_nominal_quota_kept_for_a_job_ahead_in_its_queue() {
    let setup = || {
        let mut h = Harness::default_config();
        h.nodes([node("n1", 8), node("n2", 8)]);
        h.queue(queue("a", None, 8));
        let mut r = job("r", "a", 1, 4);
        r.priority = 5;
        h.submit_at(r, 0);
        h.submit_at(job("v", "a", 1, 2), 0);
        assert_eq!(admitted_uids(&h.cycle(0)), vec!["r", "v"]);
        let mut holder = job("h", "a", 1, 8);
        holder.priority = 5;
        h.submit_at(holder, 10);
        let out = h.cycle(10);
        assert!(out.preemptions.is_empty(), "h cannot preempt");
        h
    };
    let with_priority = |uid: &str, priority| {
        let mut j = job(uid, "a", 1, 4);
        j.priority = priority;
        j
    };

    let mut h = setup();
    h.submit_at(with_priority("p", 3), 650);
    let out = h.cycle(700);
    assert!(
        out.preemptions.is_empty(),
        "p behind h takes no kept quota: {:?}",
        out.preemptions
    );
    h.finish("r");
    // After h's back-off from its two failed searches (at 10 and 700).
    let out = h.cycle(1_000);
    assert_eq!(out.preemptions.len(), 1);
    assert_eq!(out.preemptions[0].preemptor.as_str(), "h");
    assert_eq!(only_victims(&out), vec!["v"], "not a job that just started");

    let mut h = setup();
    h.submit_at(with_priority("u", 7), 650);
    let out = h.cycle(700);
    assert_eq!(out.preemptions.len(), 1, "u is ahead of h");
    assert_eq!(out.preemptions[0].preemptor.as_str(), "u");
    assert_eq!(only_victims(&out), vec!["v"]);

    // A job that ends before h can expect its quota (r has no estimate)
    // may use it meanwhile, even right after a like job without an
    // estimate failed its search in the same cycle.
    let mut h = setup();
    h.submit_at(with_priority("p", 3), 650);
    let mut short = with_priority("short", 3);
    short.runtime_estimate_secs = Some(600);
    h.submit_at(short, 660);
    let out = h.cycle(700);
    assert_eq!(out.preemptions.len(), 1, "short ends first");
    assert_eq!(out.preemptions[0].preemptor.as_str(), "short");
    assert_eq!(only_victims(&out), vec!["v"]);
}

/// Queues a and b (nominal 8 each, one cohort) on two 8-GPU nodes: a runs
/// 6 GPUs, b 8. b's gang needs 4 more and would borrow; the cohort keeps its
/// 2 GPUs of headroom for it, a's unused nominal quota. a's urgent 4-GPU job
/// would borrow now, but evicting a's 2-GPU job leaves it within a's
/// nominal quota, which is a's whatever the cohort keeps. So the victim is
/// that job, which has run least, not a's older 4-GPU one (the search once
/// judged the hold by a's usage before the eviction, as if the job still
/// borrowed, and had to free the held 2 GPUs too).
#[test]
fn a_preemptor_back_within_its_nominal_quota_is_not_held_to_a_cohort_hold() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    h.submit_at(pinned(job("b-run", "b", 1, 8), "n2"), 0);
    h.submit_at(pinned(job("a-old", "a", 1, 4), "n1"), 0);
    assert_eq!(h.cycle(0).admissions.len(), 2);
    h.submit_at(pinned(job("a-new", "a", 1, 2), "n1"), 50);
    assert_eq!(admitted_uids(&h.cycle(60)), vec!["a-new"]);
    h.submit_at(job("gang", "b", 2, 2), 100);
    let out = h.cycle(100);
    assert!(
        matches!(
            *h.reason_of(&out, "gang").reason,
            PendingReason::QuotaExceeded {
                holding_cohort_quota: true,
                available: 2,
                ..
            }
        ),
        "the cohort keeps its 2 GPUs for b's gang: {}",
        h.reason_of(&out, "gang").message()
    );
    let mut urgent = job("urgent", "a", 1, 4);
    urgent.priority = 10;
    h.submit_at(urgent, 110);
    let out = h.cycle(110);
    assert_eq!(out.preemptions.len(), 1);
    assert_eq!(out.preemptions[0].preemptor.as_str(), "urgent");
    assert_eq!(only_victims(&out), vec!["a-new"], "the least work lost");
}

#[test]
fn a_new_attempt_never_preempts_the_preemptor_of_the_one_before() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8)]);
    h.queue(queue("q", None, 8));
    h.submit(job("preemptor", "q", 1, 8));
    assert_eq!(h.cycle(1).admissions.len(), 1);
    let mut second_attempt = job("second-attempt", "q", 1, 8);
    second_attempt.priority = 10;
    second_attempt.last_preemptor = Some(uid("preemptor"));
    h.submit(second_attempt);
    assert!(h.cycle(2).preemptions.is_empty(), "never strikes back");
    let out = urgent_job_preempts(&mut h, 8, 3);
    assert_eq!(
        only_victims(&out),
        vec!["preemptor"],
        "the rules allow it to any other job"
    );
}

/// Runs cycles (evictions happen inside `cycle` once the grace period ends)
/// until nothing changes for three cycles; returns every preemption seen.
fn run_to_quiescence(h: &mut Harness, start: u64) -> (Vec<Preemption>, u64) {
    let mut all = Vec::new();
    let mut quiet = 0;
    let mut now = start;
    for _ in 0..60 {
        let out = h.cycle(now);
        let busy =
            !out.preemptions.is_empty() || !out.evictions.is_empty() || !out.admissions.is_empty();
        all.extend(out.preemptions);
        quiet = if busy { 0 } else { quiet + 1 };
        if quiet >= 3 {
            return (all, now);
        }
        now += 121;
    }
    panic!("no quiescence after 60 cycles; preemptions: {all:?}");
}

fn assert_no_strike_back(preemptions: &[Preemption]) {
    for (i, p) in preemptions.iter().enumerate() {
        for v in &p.victims {
            let strikes_back = preemptions[i + 1..].iter().any(|later| {
                later.preemptor == v.uid && later.victims.iter().any(|x| x.uid == p.preemptor)
            });
            assert!(
                !strikes_back,
                "{} preempted its preemptor {}",
                v.uid, p.preemptor
            );
        }
    }
}

fn usage(h: &Harness, queue: &str) -> u64 {
    h.alloc
        .snapshot()
        .jobs
        .iter()
        .filter_map(|j| j.admission.as_ref())
        .filter(|a| a.queue == queue)
        .map(Admission::total_units)
        .sum()
}

#[test]
fn fair_share_preemption_reaches_quiescence_without_loops() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 0));
    h.queue(queue("b", Some("c"), 0));
    h.queue(queue("lender", Some("c"), 16));
    for i in 0..4 {
        h.submit_at(job(&format!("b{i}"), "b", 1, 4), i);
    }
    assert_eq!(h.cycle(10).admissions.len(), 4, "b borrows everything");
    for i in 0..4 {
        h.submit_at(job(&format!("a{i}"), "a", 1, 4), 20 + i);
    }
    let (preemptions, _) = run_to_quiescence(&mut h, 30);
    assert!(!preemptions.is_empty(), "a must win back a fair share");
    assert!(
        preemptions
            .iter()
            .flat_map(|p| &p.victims)
            .all(|v| v.rule == PreemptionRule::FairShare)
    );
    assert_no_strike_back(&preemptions);
    assert_eq!(
        (usage(&h, "a"), usage(&h, "b")),
        (8, 8),
        "equal weights end equal"
    );
    assert_eq!(preemptions.len(), 2, "exactly two moves, then stable");
}

#[test]
fn reclaim_reaches_quiescence_without_loops() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.queue(queue("b", Some("c"), 8));
    for i in 0..4 {
        h.submit_at(job(&format!("b{i}"), "b", 1, 4), i);
    }
    h.cycle(10);
    for i in 0..4 {
        h.submit_at(job(&format!("a{i}"), "a", 1, 4), 20 + i);
    }
    let (preemptions, _) = run_to_quiescence(&mut h, 30);
    assert_no_strike_back(&preemptions);
    assert_eq!(
        (usage(&h, "a"), usage(&h, "b")),
        (8, 8),
        "each back at nominal"
    );
    assert_eq!(
        preemptions.iter().map(|p| p.victims.len()).sum::<usize>(),
        2
    );
}

// ----------------------------------------------------------------- backfill

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

// ------------------------------------------------------ flavors and taints

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

// ------------------------------------------------------- state and replay

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
