//! Preemption: victim search, its rules and the no-loop guarantee, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

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
