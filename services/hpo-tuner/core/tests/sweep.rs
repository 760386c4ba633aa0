//! The sweep state machine: parallelism, limits, goal, failure budget, early
//! stopping, idempotency and deterministic replay.

use hpo_tuner_core::testfns::branin_params;
use hpo_tuner_core::{
    AlgorithmSpec, AshaConfig, Direction, EarlyStoppingSpec, FinishReason, GridConfig,
    MedianStopConfig, Objective, ParamSpec, Params, SearchSpace, SpecError, StopReason, SweepCore,
    SweepDecision, SweepError, SweepEvent, SweepSnapshot, SweepSpec, TrialState, trial_id,
};

fn space() -> SearchSpace {
    SearchSpace::new(vec![
        ParamSpec::float("x1", -5.0, 10.0),
        ParamSpec::float("x2", 0.0, 15.0),
    ])
    .expect("valid")
}

fn spec(parallel: u32, max: Option<u32>) -> SweepSpec {
    let mut s = SweepSpec::new(
        "demo",
        Objective {
            metric: "loss".into(),
            direction: Direction::Minimize,
            goal: None,
        },
        space(),
    );
    s.parallel_trial_count = parallel;
    s.max_trial_count = max;
    s.seed = 42;
    s
}

fn requested(ds: &[SweepDecision]) -> Vec<(String, Params)> {
    ds.iter()
        .filter_map(|d| match d {
            SweepDecision::TrialRequested {
                trial_id, params, ..
            } => Some((trial_id.clone(), params.clone())),
            _ => None,
        })
        .collect()
}

fn stopped(ds: &[SweepDecision]) -> Vec<(String, StopReason)> {
    ds.iter()
        .filter_map(|d| match d {
            SweepDecision::StopTrial { trial_id, reason } => {
                Some((trial_id.clone(), reason.clone()))
            }
            _ => None,
        })
        .collect()
}

fn finished(ds: &[SweepDecision]) -> Option<FinishReason> {
    ds.iter().find_map(|d| match d {
        SweepDecision::SweepFinished { reason } => Some(reason.clone()),
        _ => None,
    })
}

fn ev(core: &mut SweepCore, e: SweepEvent) -> Vec<SweepDecision> {
    core.on_event(e).expect("event applies")
}

fn complete(id: &str, value: f64) -> SweepEvent {
    SweepEvent::TrialCompleted {
        trial_id: id.into(),
        value: Some(value),
    }
}

fn metric(id: &str, epoch: u32, value: f64) -> SweepEvent {
    SweepEvent::TrialMetric {
        trial_id: id.into(),
        metric: "loss".into(),
        epoch,
        value,
    }
}

#[test]
fn trial_ids_are_deterministic_and_padded() {
    assert_eq!(trial_id("demo", 7), "demo-t0007");
    assert_eq!(trial_id("demo", 12345), "demo-t12345");
    let mut core = SweepCore::new(spec(3, Some(10))).expect("valid");
    let ids: Vec<String> = requested(&ev(&mut core, SweepEvent::Start))
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ids, vec!["demo-t0000", "demo-t0001", "demo-t0002"]);
}

#[test]
fn parallelism_limit_is_kept_and_slots_are_refilled() {
    let mut core = SweepCore::new(spec(2, Some(10))).expect("valid");
    let first = requested(&ev(&mut core, SweepEvent::Start));
    assert_eq!(first.len(), 2);
    // A second Start (e.g. the spec re-delivered) requests nothing new.
    assert!(ev(&mut core, SweepEvent::Start).is_empty());
    ev(
        &mut core,
        SweepEvent::TrialStarted {
            trial_id: first[0].0.clone(),
        },
    );
    assert_eq!(core.status().trials.running, 1);
    assert_eq!(core.status().trials.requested, 1);
    let next = requested(&ev(&mut core, complete(&first[0].0, 3.0)));
    assert_eq!(next.len(), 1, "one slot freed, one trial requested");
    assert_eq!(next[0].0, "demo-t0002");
    let active = core.trials().iter().filter(|t| t.state.is_active()).count();
    assert_eq!(active, 2);
}

#[test]
fn parallel_suggestions_differ() {
    let mut s = spec(4, Some(20));
    s.algorithm = AlgorithmSpec::Random;
    let mut core = SweepCore::new(s).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    for i in 0..r.len() {
        for j in 0..i {
            assert_ne!(r[i].1, r[j].1);
        }
    }
}

#[test]
fn max_trial_count_finishes_after_the_last_trial_ends() {
    let mut core = SweepCore::new(spec(2, Some(3))).expect("valid");
    let mut queue = requested(&ev(&mut core, SweepEvent::Start));
    let mut total = queue.len();
    let mut last = Vec::new();
    while let Some((id, p)) = queue.pop() {
        last = ev(&mut core, complete(&id, branin_params(&p)));
        let more = requested(&last);
        total += more.len();
        queue.extend(more);
        if queue.is_empty() {
            break;
        }
        assert_eq!(finished(&last), None, "trials still running");
    }
    assert_eq!(total, 3);
    assert_eq!(finished(&last), Some(FinishReason::MaxTrialsReached));
    let st = core.status();
    assert_eq!(st.trials.completed, 3);
    assert_eq!(st.finished, Some(FinishReason::MaxTrialsReached));
    assert!(st.best_trial.is_some());
    // Nothing happens after the end.
    assert!(ev(&mut core, SweepEvent::Start).is_empty());
}

#[test]
fn goal_reached_stops_running_trials_and_ends_the_sweep() {
    let mut s = spec(3, Some(50));
    s.objective.goal = Some(1.0);
    let mut core = SweepCore::new(s).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    assert!(finished(&ev(&mut core, complete(&r[0].0, 1.5))).is_none());
    let r2 = requested(&core.on_event(SweepEvent::Start).expect("ok"));
    assert!(r2.is_empty(), "slots already full");
    let out = ev(&mut core, complete(&r[1].0, 0.9));
    let stops = stopped(&out);
    let ids: Vec<&str> = stops.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(ids, vec![r[2].0.as_str(), "demo-t0003"]);
    assert!(stops.iter().all(|s| s.1 == StopReason::SweepFinished));
    assert_eq!(
        finished(&out),
        Some(FinishReason::GoalReached {
            trial_id: r[1].0.clone(),
            value: 0.9
        })
    );
    assert!(matches!(
        out.last(),
        Some(SweepDecision::SweepFinished { .. })
    ));
    let best = core.status().best_trial.expect("best");
    assert_eq!(best.trial_id, r[1].0);
    assert_eq!(best.params, r[1].1);
}

#[test]
fn goal_for_a_maximised_metric() {
    let mut s = spec(1, Some(10));
    s.objective = Objective {
        metric: "accuracy".into(),
        direction: Direction::Maximize,
        goal: Some(0.95),
    };
    let mut core = SweepCore::new(s).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    let r = requested(&ev(&mut core, complete(&r[0].0, 0.90)));
    let r = requested(&ev(&mut core, complete(&r[0].0, 0.93)));
    assert_eq!(core.status().best_trial.map(|b| b.value), Some(0.93));
    let out = ev(&mut core, complete(&r[0].0, 0.96));
    assert!(matches!(
        finished(&out),
        Some(FinishReason::GoalReached { value, .. }) if value == 0.96
    ));
}

#[test]
fn failure_budget_ends_the_sweep_when_exceeded() {
    let mut s = spec(2, Some(100));
    s.max_failed_trial_count = Some(1);
    let mut core = SweepCore::new(s).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    let fail = |id: &str| SweepEvent::TrialFailed {
        trial_id: id.into(),
        reason: "OOMKilled".into(),
    };
    let out = ev(&mut core, fail(&r[0].0));
    assert_eq!(finished(&out), None, "one failure is within the budget");
    assert_eq!(requested(&out).len(), 1, "the slot is refilled");
    let out = ev(&mut core, fail(&r[1].0));
    assert_eq!(
        finished(&out),
        Some(FinishReason::TooManyFailedTrials { failed: 2 })
    );
    assert_eq!(stopped(&out).len(), 1, "the remaining trial is stopped");
    let st = core.status();
    assert_eq!(st.trials.failed, 2);
    assert!(!st.finished.expect("finished").is_success());
    assert_eq!(
        core.trial(&r[0].0).and_then(|t| t.failure.clone()),
        Some("OOMKilled".into())
    );
}

#[test]
fn completion_uses_the_last_metric_and_no_value_is_a_failure() {
    let mut core = SweepCore::new(spec(2, Some(10))).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    ev(&mut core, metric(&r[0].0, 1, 5.0));
    ev(&mut core, metric(&r[0].0, 2, 4.0));
    ev(
        &mut core,
        SweepEvent::TrialCompleted {
            trial_id: r[0].0.clone(),
            value: None,
        },
    );
    assert_eq!(core.trial(&r[0].0).and_then(|t| t.objective), Some(4.0));
    ev(
        &mut core,
        SweepEvent::TrialCompleted {
            trial_id: r[1].0.clone(),
            value: None,
        },
    );
    assert_eq!(
        core.trial(&r[1].0).map(|t| t.state),
        Some(TrialState::Failed)
    );
}

#[test]
fn non_finite_metric_stops_the_trial() {
    let mut core = SweepCore::new(spec(1, Some(10))).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    let out = ev(&mut core, metric(&r[0].0, 3, f64::NAN));
    assert_eq!(
        stopped(&out),
        vec![(r[0].0.clone(), StopReason::NonFiniteMetric { epoch: 3 })]
    );
    assert_eq!(requested(&out).len(), 1, "replaced");
}

#[test]
fn other_metrics_duplicates_and_late_events_are_ignored() {
    let mut core = SweepCore::new(spec(1, Some(10))).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    let id = &r[0].0;
    let other = SweepEvent::TrialMetric {
        trial_id: id.clone(),
        metric: "throughput".into(),
        epoch: 1,
        value: f64::NAN,
    };
    assert!(ev(&mut core, other).is_empty());
    ev(&mut core, metric(id, 1, 2.0));
    ev(&mut core, metric(id, 1, 9.0));
    assert_eq!(core.trial(id).and_then(|t| t.last_value), Some(2.0));
    let out = ev(&mut core, complete(id, 1.0));
    let before = core.status();
    // Redelivery of the completion and of a metric: no new trial, no change.
    assert!(ev(&mut core, complete(id, 1.0)).is_empty());
    assert!(ev(&mut core, metric(id, 5, 0.1)).is_empty());
    assert_eq!(core.status(), before);
    assert_eq!(requested(&out).len(), 1);
}

#[test]
fn unknown_trials_are_errors_that_change_nothing() {
    let mut core = SweepCore::new(spec(1, Some(10))).expect("valid");
    ev(&mut core, SweepEvent::Start);
    let before = core.snapshot();
    for bad in [
        "demo-t0009",
        "other-t0000",
        "demo-t1",
        "demo-t00000",
        "",
        "demo-tx",
    ] {
        let e = core
            .on_event(complete(bad, 1.0))
            .expect_err("unknown trial");
        assert!(matches!(e, SweepError::UnknownTrial { .. }), "{bad}: {e}");
    }
    assert_eq!(core.snapshot(), before);
}

#[test]
fn cancel_stops_everything_once() {
    let mut core = SweepCore::new(spec(3, None)).expect("valid");
    ev(&mut core, SweepEvent::Start);
    let out = ev(&mut core, SweepEvent::Cancel);
    assert_eq!(stopped(&out).len(), 3);
    assert_eq!(finished(&out), Some(FinishReason::Cancelled));
    assert!(ev(&mut core, SweepEvent::Cancel).is_empty());
}

#[test]
fn grid_sweep_ends_when_the_grid_is_exhausted() {
    let mut s = spec(2, None);
    s.search_space = SearchSpace::new(vec![
        ParamSpec::int("layers", 1, 3, 1),
        ParamSpec::categorical("opt", ["sgd", "adam"]),
    ])
    .expect("valid");
    s.algorithm = AlgorithmSpec::Grid(GridConfig::default());
    let mut core = SweepCore::new(s).expect("valid");
    let mut queue = requested(&ev(&mut core, SweepEvent::Start));
    let mut seen = Vec::new();
    let mut end = None;
    while let Some((id, p)) = queue.pop() {
        seen.push(p);
        let out = ev(&mut core, complete(&id, 1.0));
        end = end.or(finished(&out));
        queue.extend(requested(&out));
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(end, Some(FinishReason::SearchSpaceExhausted));
}

fn asha_spec() -> SweepSpec {
    let mut s = spec(3, Some(30));
    s.early_stopping = Some(EarlyStoppingSpec::Asha(AshaConfig::new(1, 9, 3)));
    s
}

#[test]
fn asha_in_a_sweep_stops_losers_and_reports_rungs() {
    let mut core = SweepCore::new(asha_spec()).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    // Rung 0 (epoch 1): first arrival is the best so far.
    assert!(ev(&mut core, metric(&r[0].0, 1, 1.0)).is_empty());
    // Worse than the only score at the rung: stopped, and replaced.
    let out = ev(&mut core, metric(&r[1].0, 1, 2.0));
    assert_eq!(
        stopped(&out),
        vec![(
            r[1].0.clone(),
            StopReason::EarlyStopped {
                epoch: 1,
                rung: Some(0)
            }
        )]
    );
    assert_eq!(requested(&out).len(), 1);
    // Three scores at rung 0, k = 1: 0.5 is the best, goes on.
    assert!(ev(&mut core, metric(&r[2].0, 1, 0.5)).is_empty());
    let st = core.status();
    assert_eq!(st.rungs.len(), 2, "rungs at epochs 1 and 3");
    assert_eq!(st.rungs[0].recorded, 3);
    assert_eq!(st.rungs[0].promoted, 2);
    assert_eq!(st.rungs[0].running, 2);
    assert_eq!(st.trials.stopped, 1);
    // A stopped trial enters the sampler history as pruned.
    assert_eq!(core.history().len(), 1);
}

#[test]
fn median_rule_in_a_sweep() {
    let mut s = spec(1, Some(30));
    s.early_stopping = Some(EarlyStoppingSpec::Median(MedianStopConfig {
        startup_trials: 1,
        warmup_epochs: 0,
    }));
    let mut core = SweepCore::new(s).expect("valid");
    let r = requested(&ev(&mut core, SweepEvent::Start));
    ev(&mut core, metric(&r[0].0, 1, 1.0));
    let r = requested(&ev(&mut core, complete(&r[0].0, 1.0)));
    let out = ev(&mut core, metric(&r[0].0, 1, 3.0));
    assert_eq!(stopped(&out).len(), 1);
}

#[test]
fn invalid_specs_name_the_field() {
    let cases: Vec<(SweepSpec, &str)> = vec![
        (spec(0, None), "parallelTrialCount"),
        (spec(1, Some(0)), "maxTrialCount"),
        (
            SweepSpec {
                name: "Bad_Name".into(),
                ..spec(1, None)
            },
            "name",
        ),
        (
            SweepSpec {
                name: "x".repeat(60),
                ..spec(1, None)
            },
            "name",
        ),
        (
            {
                let mut s = spec(1, None);
                s.objective.metric = " ".into();
                s
            },
            "objective.metric",
        ),
        (
            {
                let mut s = spec(1, None);
                s.objective.goal = Some(f64::INFINITY);
                s
            },
            "objective.goal",
        ),
        (
            {
                let mut s = spec(1, None);
                s.early_stopping = Some(EarlyStoppingSpec::Asha(AshaConfig::new(1, 9, 1)));
                s
            },
            "earlyStopping.reductionFactor",
        ),
    ];
    for (s, field) in cases {
        let e: SpecError = SweepCore::new(s).expect_err("invalid");
        assert!(e.to_string().starts_with(field), "{e} should name {field}");
    }
    let json = r#"{"name":"demo","objective":{"metric":"loss","direction":"minimize"},
        "searchSpace":[{"name":"lr","type":"float","low":0.1,"high":0.01}]}"#;
    let err = serde_json::from_str::<SweepSpec>(json).expect_err("bad space");
    assert!(err.to_string().contains("searchSpace[lr]"), "{err}");
}

#[test]
fn spec_json_round_trip_with_defaults() {
    let json = r#"{
        "name": "mnist-lr",
        "objective": {"metric": "val_loss", "direction": "minimize", "goal": 0.05},
        "searchSpace": [
            {"name": "lr", "type": "float", "low": 1e-5, "high": 1e-1, "log": true},
            {"name": "layers", "type": "int", "low": 2, "high": 8, "step": 2},
            {"name": "opt", "type": "categorical", "choices": ["sgd", "adam"]}
        ],
        "algorithm": {"name": "tpe", "nEiCandidates": 48},
        "earlyStopping": {"name": "asha", "maxResource": 27},
        "parallelTrialCount": 4,
        "maxTrialCount": 60,
        "maxFailedTrialCount": 3,
        "seed": 7
    }"#;
    let s: SweepSpec = serde_json::from_str(json).expect("valid spec");
    assert!(matches!(&s.algorithm, AlgorithmSpec::Tpe(c) if c.n_ei_candidates == 48));
    assert_eq!(
        s.early_stopping,
        Some(EarlyStoppingSpec::Asha(AshaConfig::new(1, 27, 3)))
    );
    let back: SweepSpec =
        serde_json::from_str(&serde_json::to_string(&s).expect("ser")).expect("de");
    assert_eq!(back, s);
    assert!(SweepCore::new(s).is_ok());
}

/// Drives a sweep with a deterministic fake cluster and returns every event
/// fed in and every decision produced, in order.
fn simulate(spec: SweepSpec, steps: usize) -> (Vec<SweepEvent>, Vec<Vec<SweepDecision>>) {
    let mut core = SweepCore::new(spec).expect("valid");
    let mut events = vec![SweepEvent::Start];
    let mut outputs = Vec::new();
    let mut running: Vec<(String, Params, u32)> = Vec::new();
    let mut i = 0;
    let mut step = 0;
    while i < events.len() && step < steps {
        let out = core.on_event(events[i].clone()).expect("applies");
        for d in &out {
            match d {
                SweepDecision::TrialRequested {
                    trial_id, params, ..
                } => running.push((trial_id.clone(), params.clone(), 0)),
                SweepDecision::StopTrial { trial_id, .. } => {
                    running.retain(|r| &r.0 != trial_id);
                }
                SweepDecision::SweepFinished { .. } => running.clear(),
            }
        }
        outputs.push(out);
        i += 1;
        step += 1;
        if i == events.len() && !running.is_empty() {
            // Advance the oldest running trial by one epoch (3 epochs total),
            // fail every 7th trial at epoch 2, duplicate every 5th report.
            let (id, p, e) = running.remove(0);
            let idx: u32 = id
                .rsplit("-t")
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let y = branin_params(&p);
            let e = e + 1;
            if idx % 7 == 3 && e == 2 {
                events.push(SweepEvent::TrialFailed {
                    trial_id: id,
                    reason: "node lost".into(),
                });
            } else if e < 3 {
                let ev = metric(&id, e, y + 10.0 / f64::from(e));
                if idx.is_multiple_of(5) {
                    events.push(ev.clone());
                }
                events.push(ev);
                running.push((id, p, e));
            } else {
                events.push(complete(&id, y));
            }
        }
    }
    (events, outputs)
}

fn replay_spec() -> SweepSpec {
    let mut s = asha_spec();
    s.early_stopping = Some(EarlyStoppingSpec::Asha(AshaConfig::new(1, 3, 3)));
    s.max_trial_count = Some(40);
    s.max_failed_trial_count = Some(20);
    s
}

#[test]
fn replaying_the_same_events_gives_the_same_decisions() {
    let (events, outputs) = simulate(replay_spec(), 10_000);
    let all: Vec<SweepDecision> = outputs.iter().flatten().cloned().collect();
    assert!(matches!(
        all.last(),
        Some(SweepDecision::SweepFinished { .. })
    ));
    let ids: Vec<String> = requested(&all).into_iter().map(|r| r.0).collect();
    assert_eq!(ids.len(), 40);
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 40, "no duplicate trial ids");

    let mut fresh = SweepCore::new(replay_spec()).expect("valid");
    for (e, want) in events.iter().zip(&outputs) {
        assert_eq!(&fresh.on_event(e.clone()).expect("applies"), want);
    }
}

#[test]
fn restart_from_snapshot_and_replay_loses_and_duplicates_nothing() {
    let (events, outputs) = simulate(replay_spec(), 10_000);
    let all: Vec<SweepDecision> = outputs.iter().flatten().cloned().collect();
    for cut in [1, 7, 23, events.len() / 2, events.len() - 3] {
        // Original process: applies events up to `cut` and snapshots; then
        // "crashes" after applying a few more events without snapshotting.
        let mut core = SweepCore::new(replay_spec()).expect("valid");
        for e in &events[..cut] {
            core.on_event(e.clone()).expect("applies");
        }
        let stored = serde_json::to_string(&core).expect("snapshot serializes");
        let snap: SweepSnapshot = serde_json::from_str(&stored).expect("snapshot parses");
        assert_eq!(snap, core.snapshot());
        let mut restored: SweepCore = serde_json::from_str(&stored).expect("restores");
        // Redelivery replays everything after the snapshot, one event twice.
        let mut replayed: Vec<SweepDecision> = outputs[..cut].iter().flatten().cloned().collect();
        for (k, e) in events[cut..].iter().enumerate() {
            let out = restored.on_event(e.clone()).expect("applies");
            assert_eq!(
                out,
                outputs[cut + k],
                "event {} after restore at {cut}",
                cut + k
            );
            replayed.extend(out);
            if k == 0 {
                let dup = restored.on_event(e.clone()).expect("applies");
                assert!(requested(&dup).is_empty(), "a duplicate creates no trial");
            }
        }
        assert_eq!(requested(&replayed), requested(&all), "cut {cut}");
        assert_eq!(restored.status(), {
            let mut c = SweepCore::new(replay_spec()).expect("valid");
            for e in &events {
                c.on_event(e.clone()).expect("applies");
            }
            c.status()
        });
    }
}

#[test]
fn corrupt_snapshots_are_rejected() {
    let mut core = SweepCore::new(spec(2, Some(5))).expect("valid");
    ev(&mut core, SweepEvent::Start);
    let good = core.snapshot();
    let mut bad = good.clone();
    bad.trials[1].id = "demo-t0005".into();
    assert!(matches!(
        SweepCore::restore(bad),
        Err(SweepError::CorruptSnapshot(_))
    ));
    let mut bad = good.clone();
    bad.history_order = vec![9];
    assert!(SweepCore::restore(bad).is_err());
    let mut bad = good.clone();
    bad.history_order = vec![0];
    assert!(
        SweepCore::restore(bad).is_err(),
        "a running trial has no outcome"
    );
    let mut bad = good;
    bad.version = 99;
    assert!(SweepCore::restore(bad).is_err());
}
