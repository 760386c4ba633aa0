//! Quota, cohort borrowing and reclaim, quota holds, queue holds and namespaces, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

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
        matches!(
            *why.reason,
            PendingReason::Unschedulable {
                cause: UnschedulableCause::CpuPerWorker,
                ..
            }
        ),
        "{why:?}"
    );
    assert!(
        why.message().contains(
            "no node can hold a worker: spec.resources.requests.cpu is 65 per worker but the \
             node with the most CPU among the nodes with 1 GPU or more (n1) has 64 allocatable"
        ),
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
fn a_spent_budget_holds_the_queue_with_its_own_reason_until_it_is_open() {
    let mut h = Harness::default_config();
    h.nodes([node("n1", 8), node("n2", 8)]);
    h.queue(queue("a", Some("c"), 8));
    h.submit_at(job("running", "a", 1, 4), 0);
    assert_eq!(admitted_uids(&h.cycle(10)), vec!["running"]);

    h.apply(Event::QueueBudgetChanged {
        name: "a".into(),
        hold: Some(BudgetHold {
            drains: false,
            spend: "spent 1012.50 of 1000.00 USD".into(),
        }),
    });
    h.submit_at(job("waits", "a", 1, 4), 1);
    let out = h.cycle(20);
    assert!(admitted_uids(&out).is_empty());
    assert!(out.drains.is_empty(), "action Hold: admitted jobs run on");
    assert!(h.admitted("running").is_some());
    let why = h.reason_of(&out, "waits");
    assert_eq!(
        *why.reason,
        PendingReason::BudgetSpent {
            queue: "a".into(),
            spend: "spent 1012.50 of 1000.00 USD".into(),
            drains: false
        }
    );
    assert!(
        why.message().contains("raise spec.budget.amount"),
        "{}",
        why.message()
    );

    h.apply(Event::QueueBudgetChanged {
        name: "a".into(),
        hold: None,
    });
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
