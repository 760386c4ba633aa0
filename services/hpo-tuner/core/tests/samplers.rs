//! Sampler contracts: bounds, log scale, int steps, categoricals, reproducibility.

use std::collections::{BTreeMap, BTreeSet};

use hpo_tuner_core::testfns::{BRANIN_MIN, branin_params, branin_space};
use hpo_tuner_core::{
    AlgorithmSpec, Domain, GridConfig, GridSampler, Observation, Outcome, ParamSpec, ParamValue,
    Params, RandomSampler, SampleError, Sampler, SearchSpace, TpeConfig, TpeSampler,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn mixed_space() -> SearchSpace {
    SearchSpace::new(vec![
        ParamSpec::float("dropout", 0.0, 0.5),
        ParamSpec::log_float("lr", 1e-5, 1e-1),
        ParamSpec::int("layers", 2, 14, 3),
        ParamSpec::log_int("width", 8, 1024),
        ParamSpec::categorical("opt", ["sgd", "adam", "rmsprop"]),
    ])
    .expect("valid space")
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A smooth objective over the mixed space with its optimum at dropout 0.1,
/// lr 1e-3, layers 8, width 128, opt adam.
fn mixed_objective(p: &Params) -> f64 {
    let d = p.f64("dropout").unwrap_or(f64::NAN);
    let lr = p.f64("lr").unwrap_or(f64::NAN);
    let layers = p.f64("layers").unwrap_or(f64::NAN);
    let width = p.f64("width").unwrap_or(f64::NAN);
    let opt = match p.get("opt") {
        Some(ParamValue::Categorical(s)) if s == "adam" => 0.0,
        Some(ParamValue::Categorical(_)) => 1.0,
        _ => f64::NAN,
    };
    (d - 0.1).powi(2) * 4.0
        + (lr.log10() + 3.0).powi(2) * 0.25
        + ((layers - 8.0) / 12.0).powi(2)
        + (width.log2() - 7.0).powi(2) / 9.0
        + opt
}

fn assert_in_space(space: &SearchSpace, p: &Params) {
    assert!(space.contains(p), "{p:?} is not inside the space");
    for spec in space.params() {
        let v = p.get(&spec.name).expect("every parameter present");
        match (&spec.domain, v) {
            (Domain::Float { .. }, ParamValue::Float(_))
            | (Domain::Int { .. }, ParamValue::Int(_))
            | (Domain::Categorical { .. }, ParamValue::Categorical(_)) => {}
            other => panic!("wrong value type {other:?}"),
        }
    }
}

fn run(sampler: &mut dyn Sampler, f: fn(&Params) -> f64, n: usize, seed: u64) -> Vec<Observation> {
    let mut history = Vec::new();
    for t in 0..n {
        let p = sampler
            .suggest(&history, &[], &mut rng(seed * 1000 + t as u64))
            .expect("suggestion");
        let y = f(&p);
        history.push(Observation::completed(p, y));
    }
    history
}

fn best(history: &[Observation]) -> f64 {
    history
        .iter()
        .filter_map(|o| match o.outcome {
            Outcome::Completed { score } => Some(score),
            _ => None,
        })
        .fold(f64::INFINITY, f64::min)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn random_respects_bounds_steps_log_scale_and_categories() {
    let space = mixed_space();
    let mut s = RandomSampler::new(space.clone());
    let mut r = rng(1);
    let mut layers = BTreeSet::new();
    let mut opts = BTreeMap::new();
    let mut lr_below_1e3 = 0;
    let n = 4000;
    for _ in 0..n {
        let p = s.suggest(&[], &[], &mut r).expect("random never fails");
        assert_in_space(&space, &p);
        if let Some(ParamValue::Int(l)) = p.get("layers") {
            layers.insert(*l);
        }
        if let Some(ParamValue::Categorical(o)) = p.get("opt") {
            *opts.entry(o.clone()).or_insert(0) += 1;
        }
        if p.f64("lr").is_some_and(|lr| lr < 1e-3) {
            lr_below_1e3 += 1;
        }
    }
    assert_eq!(
        layers,
        [2, 5, 8, 11, 14].into_iter().collect(),
        "every step value"
    );
    assert_eq!(opts.len(), 3);
    assert!(opts.values().all(|&c| c > n / 4), "{opts:?}");
    // Log-uniform on [1e-5, 1e-1]: half the mass is below 1e-3 (uniform would give 1 %).
    let frac = lr_below_1e3 as f64 / n as f64;
    assert!((frac - 0.5).abs() < 0.05, "fraction below 1e-3 = {frac}");
}

#[test]
fn random_is_reproducible_by_seed() {
    let space = mixed_space();
    let mut s = RandomSampler::new(space);
    let a = s.suggest(&[], &[], &mut rng(7)).expect("ok");
    let b = s.suggest(&[], &[], &mut rng(7)).expect("ok");
    let c = s.suggest(&[], &[], &mut rng(8)).expect("ok");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

fn grid_space() -> SearchSpace {
    SearchSpace::new(vec![
        ParamSpec::log_float("lr", 1e-4, 1e-2),
        ParamSpec::int("batch", 16, 64, 16),
        ParamSpec::categorical("opt", ["sgd", "adam"]),
    ])
    .expect("valid")
}

#[test]
fn grid_visits_every_point_once_then_is_exhausted() {
    let space = grid_space();
    let cfg = GridConfig {
        points_per_float: 3,
        shuffle: true,
    };
    let mut g = GridSampler::new(space.clone(), cfg, 5).expect("valid");
    assert_eq!(g.size(), 3 * 4 * 2);
    let mut history = Vec::new();
    let mut seen = BTreeSet::new();
    for _ in 0..24 {
        let p = g.suggest(&history, &[], &mut rng(0)).expect("points left");
        assert_in_space(&space, &p);
        assert!(seen.insert(format!("{p:?}")), "duplicate grid point {p:?}");
        history.push(Observation::completed(p, 0.0));
    }
    assert_eq!(
        g.suggest(&history, &[], &mut rng(0)),
        Err(SampleError::Exhausted)
    );
    let lrs: BTreeSet<String> = history
        .iter()
        .filter_map(|o| o.params.f64("lr"))
        .map(|v| format!("{v:.6e}"))
        .collect();
    // Log-spaced: 1e-4, 1e-3, 1e-2.
    assert_eq!(
        lrs,
        ["1.000000e-4", "1.000000e-3", "1.000000e-2"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

#[test]
fn grid_counts_pending_and_failed_points_as_visited() {
    let space = grid_space();
    let mut g = GridSampler::new(space, GridConfig::default(), 1).expect("valid");
    let first = g.suggest(&[], &[], &mut rng(0)).expect("ok");
    let second = g
        .suggest(&[], std::slice::from_ref(&first), &mut rng(0))
        .expect("ok");
    assert_ne!(first, second, "a pending point is not suggested again");
    let failed = Observation {
        params: first.clone(),
        outcome: Outcome::Failed,
    };
    let after_failure = g.suggest(&[failed], &[], &mut rng(0)).expect("ok");
    assert_ne!(after_failure, first, "a failed point is not retried");
}

#[test]
fn grid_order_is_seeded() {
    let order = |seed: u64, shuffle: bool| {
        let cfg = GridConfig {
            points_per_float: 4,
            shuffle,
        };
        let mut g = GridSampler::new(grid_space(), cfg, seed).expect("valid");
        let mut h = Vec::new();
        for _ in 0..8 {
            let p = g.suggest(&h, &[], &mut rng(0)).expect("ok");
            h.push(Observation::completed(p, 0.0));
        }
        h.into_iter().map(|o| o.params).collect::<Vec<_>>()
    };
    assert_eq!(order(3, true), order(3, true));
    assert_ne!(order(3, true), order(4, true));
    // Unshuffled: row-major, the last parameter varies fastest.
    let rm = order(3, false);
    assert_eq!(
        rm[0].get("opt"),
        Some(&ParamValue::Categorical("sgd".into()))
    );
    assert_eq!(
        rm[1].get("opt"),
        Some(&ParamValue::Categorical("adam".into()))
    );
    assert_eq!(rm[0].get("batch"), Some(&ParamValue::Int(16)));
    assert_eq!(rm[2].get("batch"), Some(&ParamValue::Int(32)));
}

#[test]
fn grid_rejects_zero_points_naming_the_field() {
    let cfg = GridConfig {
        points_per_float: 0,
        shuffle: true,
    };
    let e = GridSampler::new(grid_space(), cfg, 0).expect_err("invalid");
    assert!(e.to_string().starts_with("algorithm.pointsPerFloat"), "{e}");
}

#[test]
fn tpe_respects_the_space_contract() {
    let space = mixed_space();
    let mut tpe = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
    let history = run(&mut tpe, mixed_objective, 120, 3);
    for o in &history {
        assert_in_space(&space, &o.params);
    }
}

#[test]
fn tpe_finds_log_scale_int_and_categorical_optimum() {
    let space = mixed_space();
    let mut wins = 0;
    let mut adam_late = 0;
    let mut lr_late_good = 0;
    for seed in 0..10 {
        let mut tpe = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
        let mut rs = RandomSampler::new(space.clone());
        let h_tpe = run(&mut tpe, mixed_objective, 80, seed);
        let b_rand = best(&run(&mut rs, mixed_objective, 80, seed));
        if best(&h_tpe) < b_rand {
            wins += 1;
        }
        // The model has learned the categorical and the log-scale optimum:
        // late suggestions mostly use adam and an lr within 10x of 1e-3.
        for o in &h_tpe[60..] {
            if o.params.get("opt") == Some(&ParamValue::Categorical("adam".into())) {
                adam_late += 1;
            }
            if o.params
                .f64("lr")
                .is_some_and(|lr| (1e-4..1e-2).contains(&lr))
            {
                lr_late_good += 1;
            }
        }
    }
    assert!(wins >= 8, "TPE beat random in only {wins} of 10 seeds");
    // Uniform sampling would give 1/3 adam and 1/2 of lr in [1e-4, 1e-2].
    assert!(adam_late >= 120, "{adam_late} of 200 late trials use adam");
    assert!(
        lr_late_good >= 150,
        "{lr_late_good} of 200 late trials have lr near 1e-3"
    );
}

#[test]
fn tpe_is_reproducible_and_its_cache_matches_a_fresh_sampler() {
    let space = branin_space().expect("valid space");
    let mut a = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
    let history = run(&mut a, branin_params, 60, 11);
    // A sampler that has followed the history incrementally and a fresh one that
    // reads it all at once suggest the same point for the same stream.
    let x = a.suggest(&history, &[], &mut rng(99)).expect("ok");
    let mut fresh = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
    let y = fresh.suggest(&history, &[], &mut rng(99)).expect("ok");
    assert_eq!(x, y);
    // A replaced (not extended) history is detected and re-read.
    let other = run(
        &mut TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid"),
        branin_params,
        60,
        12,
    );
    let z = a.suggest(&other, &[], &mut rng(99)).expect("ok");
    let mut fresh2 = TpeSampler::new(space, TpeConfig::default()).expect("valid");
    assert_eq!(z, fresh2.suggest(&other, &[], &mut rng(99)).expect("ok"));
}

#[test]
fn tpe_beats_random_on_branin() {
    let (mut t, mut r) = (Vec::new(), Vec::new());
    for seed in 0..15 {
        let mut tpe = TpeSampler::new(branin_space().expect("valid space"), TpeConfig::default())
            .expect("valid");
        let mut rs = RandomSampler::new(branin_space().expect("valid space"));
        t.push(best(&run(&mut tpe, branin_params, 60, seed)) - BRANIN_MIN);
        r.push(best(&run(&mut rs, branin_params, 60, seed)) - BRANIN_MIN);
    }
    let (mt, mr) = (median(t), median(r));
    assert!(mt < mr / 3.0, "TPE median regret {mt} vs random {mr}");
}

/// A narrow valley along the diagonal: only a joint model of (x, y) sees it.
fn valley(p: &Params) -> f64 {
    let (x, y) = (
        p.f64("x").unwrap_or(f64::NAN),
        p.f64("y").unwrap_or(f64::NAN),
    );
    let u = (x + y) / 2.0;
    let v = x - y;
    (u - 0.7).powi(2) + 400.0 * v * v
}

#[test]
fn multivariate_tpe_beats_independent_on_a_correlated_space() {
    let space = SearchSpace::new(vec![
        ParamSpec::float("x", -1.0, 1.0),
        ParamSpec::float("y", -1.0, 1.0),
    ])
    .expect("valid");
    let (mut mv, mut ind) = (Vec::new(), Vec::new());
    for seed in 0..15 {
        let cfg = TpeConfig::default();
        let mut a = TpeSampler::new(space.clone(), cfg.clone()).expect("valid");
        let mut b = TpeSampler::new(
            space.clone(),
            TpeConfig {
                multivariate: false,
                ..cfg
            },
        )
        .expect("valid");
        mv.push(best(&run(&mut a, valley, 60, seed)));
        ind.push(best(&run(&mut b, valley, 60, seed)));
    }
    let (m1, m2) = (median(mv), median(ind));
    assert!(m1 < m2, "multivariate {m1} vs independent {m2}");
}

#[test]
fn constant_liar_makes_parallel_suggestions_differ() {
    let space = branin_space().expect("valid space");
    let mut tpe = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
    let history = run(&mut tpe, branin_params, 40, 5);
    // Same stream, same history: only the pending set differs.
    let first = tpe.suggest(&history, &[], &mut rng(1)).expect("ok");
    let with_pending = tpe
        .suggest(&history, std::slice::from_ref(&first), &mut rng(1))
        .expect("ok");
    assert_ne!(first, with_pending);
    let mut no_liar = TpeSampler::new(
        space,
        TpeConfig {
            constant_liar: false,
            ..TpeConfig::default()
        },
    )
    .expect("valid");
    let a = no_liar.suggest(&history, &[], &mut rng(1)).expect("ok");
    let b = no_liar
        .suggest(&history, std::slice::from_ref(&a), &mut rng(1))
        .expect("ok");
    assert_eq!(a, b, "without the liar, pending trials are ignored");
}

#[test]
fn tpe_ignores_failed_and_foreign_observations() {
    let space = branin_space().expect("valid space");
    let mut tpe = TpeSampler::new(space.clone(), TpeConfig::default()).expect("valid");
    let mut history = run(&mut tpe, branin_params, 20, 1);
    let mut foreign = Params::new();
    foreign.insert("x1", ParamValue::Float(1e9));
    foreign.insert("x2", ParamValue::Categorical("nope".into()));
    history.push(Observation::completed(foreign, -1e9));
    history.push(Observation {
        params: history[0].params.clone(),
        outcome: Outcome::Failed,
    });
    history.push(Observation::completed(history[1].params.clone(), f64::NAN));
    history.push(Observation {
        params: history[2].params.clone(),
        outcome: Outcome::Pruned {
            score: 50.0,
            step: 3,
        },
    });
    for s in 0..20 {
        let p = tpe.suggest(&history, &[], &mut rng(s)).expect("ok");
        assert!(space.contains(&p));
    }
}

#[test]
fn tpe_stays_valid_and_capped_with_a_long_history() {
    let space = mixed_space();
    let mut rs = RandomSampler::new(space.clone());
    let history = run(&mut rs, mixed_objective, 3000, 2);
    let mut tpe = TpeSampler::new(
        space.clone(),
        TpeConfig {
            max_above_kernels: 64,
            ..TpeConfig::default()
        },
    )
    .expect("valid");
    let pending: Vec<Params> = history[..4].iter().map(|o| o.params.clone()).collect();
    for s in 0..10 {
        let p = tpe.suggest(&history, &pending, &mut rng(s)).expect("ok");
        assert_in_space(&space, &p);
    }
}

#[test]
fn tpe_settings_are_validated() {
    for (cfg, field) in [
        (
            TpeConfig {
                n_ei_candidates: 0,
                ..TpeConfig::default()
            },
            "algorithm.nEiCandidates",
        ),
        (
            TpeConfig {
                gamma: 0.0,
                ..TpeConfig::default()
            },
            "algorithm.gamma",
        ),
        (
            TpeConfig {
                prior_weight: f64::NAN,
                ..TpeConfig::default()
            },
            "algorithm.priorWeight",
        ),
        (
            TpeConfig {
                max_above_kernels: 2,
                ..TpeConfig::default()
            },
            "algorithm.maxAboveKernels",
        ),
    ] {
        let e = AlgorithmSpec::Tpe(cfg)
            .build(&branin_space().expect("valid space"), 0)
            .expect_err("invalid");
        assert!(e.to_string().starts_with(field), "{e}");
    }
}
