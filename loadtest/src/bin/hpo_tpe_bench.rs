//! Sampler benchmark: hpo-tuner-core TPE vs Optuna on Branin and Hartmann6.
//!
//! For every function and seed, runs a sequential optimisation loop (suggest,
//! evaluate, append) and records the simple regret `min f(x_1..x_t) - f*` at the
//! checkpoints, and the wall time of each `suggest` call. "Suggest time at trial
//! N" is the mean over trials N-9..N, then over seeds; the same definition is used
//! by `loadtest/hpo/optuna_bench.py`, whose JSON output (`--optuna FILE`) is
//! printed next to ours.
//!
//! ```text
//! cargo run --release -p trainyard-loadtest --bin hpo_tpe_bench -- \
//!     --optuna loadtest/out/optuna.json
//! ```
//!
//! Options: `--seeds 50 --seed-offset 0 --trials 100 --checkpoints 25,50,100
//! --timing-trials 2000 --timing-seeds 3 --functions branin,hartmann6
//! --variants tpe,optuna-defaults,independent,random --optuna FILE --per-seed`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use hpo_tuner_core::testfns::{
    BRANIN_MIN, HARTMANN6_MIN, branin_params, branin_space, hartmann6_params, hartmann6_space,
};
use hpo_tuner_core::{
    AlgorithmSpec, Observation, Params, Sampler, SearchSpace, TpeConfig, math::trial_seed,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// hpo-tuner-core TPE against Optuna on Branin and Hartmann6.
#[derive(Parser)]
struct Args {
    /// Seeds per function and variant.
    #[arg(long, default_value_t = 50)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed_offset: u64,
    /// Trials per optimisation run.
    #[arg(long, default_value_t = 100)]
    trials: usize,
    /// Trial counts at which regret is reported (those beyond --trials are dropped).
    #[arg(long, value_delimiter = ',', default_value = "25,50,100")]
    checkpoints: Vec<usize>,
    /// Trials of the longer runs that time `suggest`.
    #[arg(long, default_value_t = 2000)]
    timing_trials: usize,
    /// Seeds of the timing runs.
    #[arg(long, default_value_t = 3)]
    timing_seeds: u64,
    /// Test functions: branin, hartmann6.
    #[arg(long, value_delimiter = ',', default_value = "branin,hartmann6")]
    functions: Vec<String>,
    /// Sampler variants (see `algorithm`).
    #[arg(long, value_delimiter = ',', default_value = "tpe")]
    variants: Vec<String>,
    /// JSON results of loadtest/hpo/optuna_bench.py, printed beside ours.
    #[arg(long)]
    optuna: Option<String>,
    /// Print every seed's regret, sorted.
    #[arg(long)]
    per_seed: bool,
}

type Objective = fn(&Params) -> f64;

fn function(name: &str) -> Result<(SearchSpace, Objective, f64), String> {
    let (space, f, f_star) = match name {
        "branin" => (branin_space(), branin_params as Objective, BRANIN_MIN),
        "hartmann6" => (
            hartmann6_space(),
            hartmann6_params as Objective,
            HARTMANN6_MIN,
        ),
        _ => return Err(format!("unknown function {name}")),
    };
    Ok((space.map_err(|e| e.to_string())?, f, f_star))
}

/// `tpe` (our defaults), `optuna-defaults` (our implementation with Optuna 5's
/// settings: 24 EI candidates, gamma 0.1, 10 startup trials, no rank weights),
/// `independent`, `random`, or `tpe:key=value/key=value...` with keys `ei`, `gamma`,
/// `prior`, `startup`, `cap`, `mv` (0/1), `rank` (0/1) for experiments.
fn algorithm(variant: &str) -> Option<AlgorithmSpec> {
    let tpe = TpeConfig::default();
    Some(match variant {
        "tpe" => AlgorithmSpec::Tpe(tpe),
        // Optuna 5's TPESampler defaults.
        "optuna-defaults" => AlgorithmSpec::Tpe(TpeConfig {
            n_ei_candidates: 24,
            gamma: 0.1,
            n_startup_trials: 10,
            rank_weights: false,
            ..tpe
        }),
        "independent" => AlgorithmSpec::Tpe(TpeConfig {
            multivariate: false,
            ..tpe
        }),
        "random" => AlgorithmSpec::Random,
        _ => {
            let mut c = tpe;
            for kv in variant.strip_prefix("tpe:")?.split('/') {
                let (k, v) = kv.split_once('=')?;
                match k {
                    "ei" => c.n_ei_candidates = v.parse().ok()?,
                    "gamma" => c.gamma = v.parse().ok()?,
                    "prior" => c.prior_weight = v.parse().ok()?,
                    "startup" => c.n_startup_trials = v.parse().ok()?,
                    "cap" => c.max_above_kernels = v.parse().ok()?,
                    "mv" => c.multivariate = v == "1",
                    "rank" => c.rank_weights = v == "1",
                    _ => return None,
                }
            }
            AlgorithmSpec::Tpe(c)
        }
    })
}

/// One run: regret after each trial and suggest seconds of each trial.
fn run(
    space: &SearchSpace,
    f: Objective,
    f_star: f64,
    alg: &AlgorithmSpec,
    seed: u64,
    trials: usize,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut sampler = alg.build(space, seed).map_err(|e| e.to_string())?;
    let mut history: Vec<Observation> = Vec::with_capacity(trials);
    let mut best = f64::INFINITY;
    let mut regret = Vec::with_capacity(trials);
    let mut secs = Vec::with_capacity(trials);
    for t in 0..trials {
        let mut rng = StdRng::seed_from_u64(trial_seed(seed, t as u32));
        let start = Instant::now();
        let params = sampler
            .suggest(&history, &[], &mut rng)
            .map_err(|e| e.to_string())?;
        secs.push(start.elapsed().as_secs_f64());
        let y = f(&params);
        if !space.contains(&params) || !y.is_finite() {
            return Err(format!("sampler produced an invalid point {params:?}"));
        }
        best = best.min(y);
        regret.push(best - f_star);
        history.push(Observation::completed(params, y));
    }
    Ok((regret, secs))
}

fn window_mean(secs: &[f64], n: usize) -> f64 {
    let lo = n.saturating_sub(10);
    let w = &secs[lo..n];
    w.iter().sum::<f64>() / w.len() as f64
}

/// Quartiles with linear interpolation (numpy's default, Python's "inclusive").
fn quartiles(mut xs: Vec<f64>) -> [f64; 3] {
    xs.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let pos = p * (xs.len() - 1) as f64;
        let lo = pos.floor() as usize;
        let hi = pos.ceil() as usize;
        xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
    };
    [q(0.25), q(0.5), q(0.75)]
}

struct Row {
    label: String,
    regret: BTreeMap<usize, [f64; 3]>,
    suggest_ms: BTreeMap<usize, f64>,
}

fn optuna_rows(path: &str) -> Result<BTreeMap<String, Row>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let label = doc["optimizer"].as_str().unwrap_or("optuna").to_string();
    let mut out = BTreeMap::new();
    let Some(funcs) = doc["functions"].as_object() else {
        return Err(format!("{path}: no functions"));
    };
    for (name, f) in funcs {
        let mut regret = BTreeMap::new();
        for (c, q) in f["regret"].as_object().into_iter().flatten() {
            let (Ok(c), Some(q1), Some(m), Some(q3)) = (
                c.parse::<usize>(),
                q["q1"].as_f64(),
                q["median"].as_f64(),
                q["q3"].as_f64(),
            ) else {
                continue;
            };
            regret.insert(c, [q1, m, q3]);
        }
        let suggest_ms = f["suggest_ms"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.parse::<usize>().ok()?, v.as_f64()?)))
            .collect();
        out.insert(
            name.clone(),
            Row {
                label: label.clone(),
                regret,
                suggest_ms,
            },
        );
    }
    Ok(out)
}

fn print_row(func: &str, r: &Row, checkpoints: &[usize], timing: &[usize]) {
    let mut line = format!("{func:<10} {:<44}", r.label);
    for c in checkpoints {
        match r.regret.get(c) {
            Some([q1, m, q3]) => line += &format!(" {m:>8.4} [{q1:.4}, {q3:.4}]"),
            None => line += &format!(" {:>26}", "-"),
        }
    }
    for n in timing {
        match r.suggest_ms.get(n) {
            Some(ms) => line += &format!(" {ms:>10.4}"),
            None => line += &format!(" {:>10}", "-"),
        }
    }
    println!("{line}");
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("hpo_tpe_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Returns whether every target was met (when Optuna figures are available).
fn real_main() -> Result<bool, String> {
    let mut args = Args::parse();
    let trials = args.trials;
    args.checkpoints.retain(|&c| c >= 1 && c <= trials);
    let optuna = args.optuna.as_deref().map(optuna_rows).transpose()?;
    let timing: Vec<usize> = if args.timing_seeds > 0 && args.timing_trials > args.trials {
        vec![args.trials, args.timing_trials]
    } else {
        vec![args.trials]
    };
    println!(
        "simple regret median [q1, q3] over {} seeds (offset {}); suggest time in ms \
         (mean of trials N-9..N; @{} over {} seeds)",
        args.seeds, args.seed_offset, args.timing_trials, args.timing_seeds
    );
    let mut header = format!("{:<10} {:<44}", "function", "optimizer");
    for c in &args.checkpoints {
        header += &format!(" {:>26}", format!("regret@{c}"));
    }
    for n in &timing {
        header += &format!(" {:>10}", format!("ms@{n}"));
    }
    println!("{header}");

    let mut all_met = true;
    for fname in &args.functions {
        let (space, f, f_star) = function(fname)?;
        for variant in &args.variants {
            let alg = algorithm(variant).ok_or(format!("unknown variant {variant}"))?;
            let mut at: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
            let mut ms_first = Vec::new();
            for s in 0..args.seeds {
                let seed = args.seed_offset + s;
                let (regret, secs) = run(&space, f, f_star, &alg, seed, args.trials)?;
                for &c in &args.checkpoints {
                    at.entry(c).or_default().push(regret[c - 1]);
                }
                ms_first.push(1e3 * window_mean(&secs, args.trials));
            }
            let mut suggest_ms = BTreeMap::new();
            suggest_ms.insert(
                args.trials,
                ms_first.iter().sum::<f64>() / ms_first.len() as f64,
            );
            if timing.len() > 1 {
                let mut ms = Vec::new();
                for s in 0..args.timing_seeds {
                    let seed = args.seed_offset + s;
                    let (_, secs) = run(&space, f, f_star, &alg, seed, args.timing_trials)?;
                    ms.push(1e3 * window_mean(&secs, args.timing_trials));
                }
                suggest_ms.insert(args.timing_trials, ms.iter().sum::<f64>() / ms.len() as f64);
            }
            if args.per_seed {
                let mut v = at.get(&args.trials).cloned().unwrap_or_default();
                v.sort_by(f64::total_cmp);
                let s: Vec<String> = v.iter().map(|x| format!("{x:.3}")).collect();
                println!("  sorted regret@{}: {}", args.trials, s.join(" "));
            }
            let row = Row {
                label: format!("hpo-tuner-core {variant}"),
                regret: at.into_iter().map(|(c, v)| (c, quartiles(v))).collect(),
                suggest_ms,
            };
            print_row(fname, &row, &args.checkpoints, &timing);
            if variant == "tpe" {
                if let Some(o) = optuna.as_ref().and_then(|o| o.get(fname)) {
                    let last = args.trials;
                    let ours = row.regret.get(&last).map(|q| q[1]);
                    let theirs = o.regret.get(&last).map(|q| q[1]);
                    if let (Some(a), Some(b)) = (ours, theirs) {
                        let ok = a <= b;
                        all_met &= ok;
                        println!(
                            "  target: median regret@{last} {a:.4} <= optuna {b:.4}: {}",
                            if ok { "met" } else { "NOT met" }
                        );
                    }
                }
                for (n, limit) in [(100usize, 0.1f64), (2000, 1.0)] {
                    if let Some(ms) = row.suggest_ms.get(&n) {
                        let ok = *ms <= limit;
                        all_met &= ok;
                        println!(
                            "  target: suggest@{n} {ms:.4} ms <= {limit} ms: {}",
                            if ok { "met" } else { "NOT met" }
                        );
                    }
                }
            }
        }
        if let Some(o) = optuna.as_ref().and_then(|o| o.get(fname)) {
            print_row(fname, o, &args.checkpoints, &timing);
        }
    }
    Ok(all_met)
}
