//! Early-stopping benchmark: TPE with and without ASHA (and Hyperband, median
//! stopping) for the same total epoch budget, on synthetic learning curves.
//!
//! The whole sweep runs through `SweepCore` (the state machine the service
//! uses), driven by a simulated pool of workers on a virtual clock: each tick
//! every running trial trains one epoch and reports its loss; stop decisions
//! free the worker at once, and the sweep's trial requests fill it.
//!
//! Learning curves ("LC-Hartmann6"): six hyperparameters in `[0, 1]`; the loss
//! after `e` of `R` epochs is
//!
//! ```text
//! loss(x, e) = r(x) + k(x) * ((R / e)^0.5 - 1) / (R^0.5 - 1) + noise
//! r(x) = hartmann6(x) - hartmann6_min          (final loss, >= 0)
//! k(x) = 0.6 + 1.8 * x0 * (1 - x3)              (slow learners start higher)
//! noise ~ N(0, 0.03^2), independent per report
//! ```
//!
//! so at epoch `R` the loss is `r(x)` plus noise, and early losses are inflated
//! by an amount that depends on two of the six parameters: curves cross, and an
//! early rung ranks trials only roughly like their final loss.
//!
//! Budget: `B` epochs in total, over all trials, partial ones included. Without
//! early stopping, `maxTrialCount = B / R`, so every trial runs to the end and
//! nothing is wasted (the most favourable setting for the baseline); with early
//! stopping the trial count is unlimited and the run is cut when `B` is spent.
//! Result: the true final loss `r(x)` of the completed trial with the best
//! reported final loss (what a user would deploy), median and quartiles over
//! seeds.
//!
//! ```text
//! cargo run --release -p trainyard-loadtest --bin hpo_asha_bench -- --seeds 50
//! ```
//!
//! Options: `--seeds 50 --seed-offset 0 --epochs 27 --workers 4
//! --budgets 10,20,40` (budgets in multiples of `R` epochs).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Parser;
use hpo_tuner_core::math::mix64;
use hpo_tuner_core::testfns::{HARTMANN6_MIN, hartmann6, hartmann6_space};
use hpo_tuner_core::{
    AlgorithmSpec, AshaConfig, Direction, EarlyStoppingSpec, MedianStopConfig, Objective, Params,
    SweepCore, SweepDecision, SweepEvent, SweepSpec, TpeConfig,
};

/// Budgets (in multiples of `R`) up to this are "small": the target applies.
const SMALL_BUDGET: u32 = 20;

/// TPE with and without early stopping at equal epoch budgets, on LC-Hartmann6.
#[derive(Parser)]
struct Args {
    /// Seeds per budget and algorithm.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    seed_offset: u64,
    /// Epochs of a full trial (R).
    #[arg(long, default_value_t = 27, value_parser = clap::value_parser!(u32).range(2..))]
    epochs: u32,
    /// Trials trained at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    workers: u32,
    /// Total epoch budgets, in multiples of R.
    #[arg(long, value_delimiter = ',', default_value = "10,20,40")]
    budgets: Vec<u32>,
}

fn coords(p: &Params) -> [f64; 6] {
    let mut x = [0.0; 6];
    for (i, xi) in x.iter_mut().enumerate() {
        *xi = p.f64(&format!("x{i}")).unwrap_or(0.5);
    }
    x
}

/// Final loss of a configuration (its Hartmann6 regret).
fn final_loss(x: &[f64; 6]) -> f64 {
    hartmann6(x) - HARTMANN6_MIN
}

/// Deterministic N(0, 1) for (seed, trial, epoch).
fn noise(seed: u64, trial: u32, epoch: u32) -> f64 {
    let h = mix64(seed ^ mix64((u64::from(trial) << 32) | u64::from(epoch)));
    let u1 = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let u2 = (mix64(h) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn loss(x: &[f64; 6], epoch: u32, max_epochs: u32, seed: u64, trial: u32) -> f64 {
    let r = f64::from(max_epochs);
    let e = f64::from(epoch.max(1));
    let k = 0.6 + 1.8 * x[0] * (1.0 - x[3]);
    let decay = ((r / e).sqrt() - 1.0) / (r.sqrt() - 1.0);
    final_loss(x) + k * decay + 0.03 * noise(seed, trial, epoch)
}

#[derive(Clone, Copy)]
enum Method {
    Plain,
    Asha,
    Hyperband,
    Median,
}

impl Method {
    fn label(self) -> &'static str {
        match self {
            Method::Plain => "TPE, no early stopping",
            Method::Asha => "TPE + ASHA (eta 3, min 1 epoch)",
            Method::Hyperband => "TPE + Hyperband (eta 3, min 1 epoch)",
            Method::Median => "TPE + median stopping",
        }
    }
}

struct Outcome {
    /// True final loss of the chosen trial (`None`: no trial completed).
    chosen: Option<f64>,
    trials: usize,
    completed: usize,
}

fn run_sweep(
    method: Method,
    seed: u64,
    budget: u64,
    epochs: u32,
    workers: u32,
) -> Result<Outcome, String> {
    let mut spec = SweepSpec::new(
        "lc",
        Objective {
            metric: "loss".into(),
            direction: Direction::Minimize,
            goal: None,
        },
        hartmann6_space().map_err(|e| e.to_string())?,
    );
    spec.algorithm = AlgorithmSpec::Tpe(TpeConfig::default());
    spec.parallel_trial_count = workers;
    spec.seed = seed;
    let asha = AshaConfig::new(1, epochs, 3);
    match method {
        Method::Plain => {
            spec.max_trial_count = Some((budget / u64::from(epochs)).max(1) as u32);
        }
        Method::Asha => spec.early_stopping = Some(EarlyStoppingSpec::Asha(asha)),
        Method::Hyperband => spec.early_stopping = Some(EarlyStoppingSpec::Hyperband(asha)),
        Method::Median => {
            spec.early_stopping = Some(EarlyStoppingSpec::Median(MedianStopConfig {
                startup_trials: 3,
                warmup_epochs: 1,
            }))
        }
    }
    let mut core = SweepCore::new(spec).map_err(|e| e.to_string())?;
    // Running trials: id, index, coordinates, epochs done.
    let mut running: Vec<(String, u32, [f64; 6], u32)> = Vec::new();
    let mut final_reported: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    let mut trials = 0usize;
    let apply = |core: &mut SweepCore,
                 running: &mut Vec<(String, u32, [f64; 6], u32)>,
                 trials: &mut usize,
                 e: SweepEvent|
     -> Result<bool, String> {
        let mut ended = false;
        for d in core.on_event(e).map_err(|e| e.to_string())? {
            match d {
                SweepDecision::TrialRequested {
                    trial_id,
                    index,
                    params,
                } => {
                    *trials += 1;
                    running.push((trial_id, index, coords(&params), 0));
                }
                SweepDecision::StopTrial { trial_id, .. } => running.retain(|r| r.0 != trial_id),
                SweepDecision::SweepFinished { .. } => ended = true,
            }
        }
        Ok(ended)
    };
    apply(&mut core, &mut running, &mut trials, SweepEvent::Start)?;
    let mut spent = 0u64;
    'clock: while spent < budget && !running.is_empty() {
        // One tick: every trial running at its start trains one epoch.
        let ids: Vec<String> = running.iter().map(|r| r.0.clone()).collect();
        for id in ids {
            if spent >= budget {
                break 'clock;
            }
            let Some(pos) = running.iter().position(|r| r.0 == id) else {
                continue;
            };
            let (index, x, epoch) = {
                let r = &mut running[pos];
                r.3 += 1;
                (r.1, r.2, r.3)
            };
            spent += 1;
            let v = loss(&x, epoch, epochs, seed, index);
            let ev = SweepEvent::TrialMetric {
                trial_id: id.clone(),
                metric: "loss".into(),
                epoch,
                value: v,
            };
            let mut ended = apply(&mut core, &mut running, &mut trials, ev)?;
            if epoch >= epochs && running.iter().any(|r| r.0 == id) {
                running.retain(|r| r.0 != id);
                final_reported.insert(index, (v, final_loss(&x)));
                let done = SweepEvent::TrialCompleted {
                    trial_id: id.clone(),
                    value: None,
                };
                ended |= apply(&mut core, &mut running, &mut trials, done)?;
            }
            if ended {
                break 'clock;
            }
        }
    }
    let chosen = final_reported
        .values()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|c| c.1);
    Ok(Outcome {
        chosen,
        trials,
        completed: final_reported.len(),
    })
}

fn quartiles(mut xs: Vec<f64>) -> [f64; 3] {
    xs.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let pos = p * (xs.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
    };
    [q(0.25), q(0.5), q(0.75)]
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("hpo_asha_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<bool, String> {
    let args = Args::parse();
    println!(
        "LC-Hartmann6, R = {} epochs, {} workers, {} seeds (offset {}): true final loss of the \
         chosen trial, median [q1, q3]; mean trials started / completed",
        args.epochs, args.workers, args.seeds, args.seed_offset
    );
    let mut all_met = true;
    for &b in &args.budgets {
        let budget = u64::from(b) * u64::from(args.epochs);
        println!("budget {b} x R = {budget} epochs");
        let mut medians = BTreeMap::new();
        for (mi, method) in [
            Method::Plain,
            Method::Asha,
            Method::Hyperband,
            Method::Median,
        ]
        .into_iter()
        .enumerate()
        {
            let mut finals = Vec::new();
            let (mut started, mut completed, mut none) = (0usize, 0usize, 0usize);
            for s in 0..args.seeds {
                let o = run_sweep(
                    method,
                    args.seed_offset + s,
                    budget,
                    args.epochs,
                    args.workers,
                )?;
                started += o.trials;
                completed += o.completed;
                match o.chosen {
                    Some(v) => finals.push(v),
                    None => {
                        // Nothing completed: count as the worst possible outcome.
                        none += 1;
                        finals.push(-HARTMANN6_MIN);
                    }
                }
            }
            let [q1, m, q3] = quartiles(finals);
            medians.insert(mi, m);
            let n = args.seeds as f64;
            println!(
                "  {:<38} {m:>8.4} [{q1:.4}, {q3:.4}]   trials {:>6.1} / {:>5.1}{}",
                method.label(),
                started as f64 / n,
                completed as f64 / n,
                if none > 0 {
                    format!("   ({none} runs completed nothing)")
                } else {
                    String::new()
                }
            );
        }
        if let (Some(plain), Some(asha)) = (medians.get(&0), medians.get(&1)) {
            let ok = asha < plain;
            if b <= SMALL_BUDGET {
                all_met &= ok;
                println!(
                    "  target (small budget): TPE+ASHA {asha:.4} < TPE {plain:.4}: {}",
                    if ok { "met" } else { "NOT met" }
                );
            } else {
                println!("  (larger budget, no target) TPE+ASHA {asha:.4} vs TPE {plain:.4}");
            }
        }
    }
    Ok(all_met)
}
