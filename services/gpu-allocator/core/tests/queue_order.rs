//! Order: priority, aging and weighted fair share across queues, through the public API only.

mod common;

use common::*;
use gpu_allocator_core::*;

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
