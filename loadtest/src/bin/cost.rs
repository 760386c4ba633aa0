//! Spot or on-demand on a replayed trace: total cost, mean JCT and deadline
//! misses for all on-demand, all spot, the cost-optimizer's choice and an
//! oracle that knows every reclaim in advance.
//!
//! Each job runs alone on its gang's nodes (capacity is not contended): the
//! figures compare capacity choices, not queueing. Trace durations are
//! multiplied by `TIME_SCALE` so jobs run for hours, as training does.
//! Spot nodes are reclaimed at `RECLAIMS_PER_NODE_HOUR` (Poisson, seeded);
//! a reclaim loses the work since the last checkpoint and costs a restart.
//! Half the jobs checkpoint every 30 minutes; every third has a deadline of
//! 1.3 × its duration. The cost-optimizer sees the pool's rate as its prior
//! (the catalog bucket) and re-decides after each interruption.
//!
//! `cargo run --release -p trainyard-loadtest --bin cost [trace.csv ...]`

use std::path::Path;

use cost_optimizer_core::decision::{Choice, DecisionInputs, RuntimeSource, decide};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use trainyard_loadtest::generate::{GeneratorConfig, generate};
use trainyard_loadtest::trace::{TraceJob, read_trace};

const TIME_SCALE: f64 = 30.0;
const RECLAIMS_PER_NODE_HOUR: f64 = 0.03;
const GPUS_PER_NODE: u32 = 8;
const SPOT_PRICE: f64 = 1.64;
const ON_DEMAND_PRICE: f64 = 4.10;
const RESTART_HOURS: f64 = 0.1;
const CHECKPOINT_HOURS: f64 = 0.5;
const SAVE_HOURS: f64 = 60.0 / 3600.0;

struct Job {
    gpus: u32,
    nodes: u32,
    work_hours: f64,
    checkpoint: Option<f64>,
    deadline_hours: Option<f64>,
    /// Hours (of wall time on spot) at which the gang is reclaimed.
    reclaims: Vec<f64>,
}

struct Outcome {
    hours: f64,
    cost: f64,
    missed: bool,
    interruptions: u32,
}

/// Runs `job` starting on `first`; `policy` is asked again after every
/// interruption (given the work left and interruptions so far).
fn run(job: &Job, first: Choice, mut policy: impl FnMut(f64, u32) -> Choice) -> Outcome {
    let save = job.checkpoint.map_or(0.0, |_| SAVE_HOURS);
    let mut choice = first;
    let (mut clock, mut left, mut cost, mut interruptions) = (0.0, job.work_hours, 0.0, 0u32);
    let mut reclaims = job.reclaims.iter().copied().peekable();
    loop {
        // Time to finish from here without interruption.
        let segments = job
            .checkpoint
            .map_or(1.0, |tau| (left / tau).ceil().max(1.0));
        let need = left + (segments - 1.0) * save;
        let price = match choice {
            Choice::Spot => SPOT_PRICE,
            Choice::OnDemand => ON_DEMAND_PRICE,
        };
        while reclaims.peek().is_some_and(|r| *r < clock) {
            reclaims.next();
        }
        let next = match choice {
            Choice::Spot => reclaims.peek().copied().filter(|r| *r < clock + need),
            Choice::OnDemand => None,
        };
        match next {
            None => {
                clock += need;
                cost += need * f64::from(job.gpus) * price;
                break;
            }
            Some(at) => {
                let ran = at - clock;
                cost += ran * f64::from(job.gpus) * price;
                let saved = match job.checkpoint {
                    Some(tau) => ((ran / (tau + save)).floor() * tau).min(left),
                    None => 0.0,
                };
                left -= saved;
                interruptions += 1;
                clock = at + RESTART_HOURS;
                reclaims.next();
                choice = policy(left, interruptions);
            }
        }
    }
    Outcome {
        hours: clock,
        cost,
        missed: job.deadline_hours.is_some_and(|d| clock > d),
        interruptions,
    }
}

fn inputs(job: &Job, work: f64, interruptions: u32, elapsed: f64) -> DecisionInputs {
    DecisionInputs {
        work_hours: work,
        runtime_source: RuntimeSource::Estimate,
        gpus: job.gpus,
        nodes: job.nodes,
        checkpoint_interval_hours: job.checkpoint,
        checkpoint_save_hours: SAVE_HOURS,
        restart_hours: RESTART_HOURS,
        spot_price_per_gpu_hour: SPOT_PRICE,
        on_demand_price_per_gpu_hour: ON_DEMAND_PRICE,
        spot_reclaims_per_node_hour: RECLAIMS_PER_NODE_HOUR,
        hours_to_deadline: job.deadline_hours.map(|d| (d - elapsed).max(0.0)),
        spot_interruptions: interruptions,
        max_spot_interruptions: 3,
        deadline_risk_tolerance: 0.05,
    }
}

fn jobs_of(trace: &[TraceJob], seed: u64) -> Vec<Job> {
    let mut rng = StdRng::seed_from_u64(seed);
    trace
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let gpus = t.gpus.max(1);
            let nodes = gpus.div_ceil(GPUS_PER_NODE);
            let work_hours = t.duration_seconds * TIME_SCALE / 3600.0;
            let rate = RECLAIMS_PER_NODE_HOUR * f64::from(nodes);
            let mut reclaims = Vec::new();
            let mut at = 0.0;
            while at < work_hours * 20.0 {
                at += -(1.0 - rng.random::<f64>()).ln() / rate;
                reclaims.push(at);
            }
            Job {
                gpus,
                nodes,
                work_hours,
                checkpoint: (i % 2 == 0).then_some(CHECKPOINT_HOURS),
                deadline_hours: (i % 3 == 0).then_some(work_hours * 1.3),
                reclaims,
            }
        })
        .collect()
}

/// How a job is run, start to end.
type Strategy = Box<dyn Fn(&Job) -> Outcome>;

fn report(name: &str, trace: &[TraceJob]) {
    let jobs = jobs_of(trace, 42);
    let strategies: [(&str, Strategy); 4] = [
        (
            "all on-demand",
            Box::new(|j| run(j, Choice::OnDemand, |_, _| Choice::OnDemand)),
        ),
        (
            "all spot",
            Box::new(|j| run(j, Choice::Spot, |_, _| Choice::Spot)),
        ),
        (
            "trainyard",
            Box::new(|j| {
                let first = decide(&inputs(j, j.work_hours, 0, 0.0)).choice;
                let mut elapsed_guess = 0.0;
                run(j, first, |left, n| {
                    elapsed_guess += j.work_hours - left;
                    decide(&inputs(j, left, n, elapsed_guess.min(j.work_hours))).choice
                })
            }),
        ),
        (
            "oracle",
            Box::new(|j| {
                let od = run(j, Choice::OnDemand, |_, _| Choice::OnDemand);
                let spot = run(j, Choice::Spot, |_, _| Choice::Spot);
                if spot.cost < od.cost && (!spot.missed || od.missed) {
                    spot
                } else {
                    od
                }
            }),
        ),
    ];
    println!(
        "{name}: {} jobs, {:.0} GPU-hours of work, {} with deadlines, reclaims {RECLAIMS_PER_NODE_HOUR}/node-h",
        jobs.len(),
        jobs.iter()
            .map(|j| j.work_hours * f64::from(j.gpus))
            .sum::<f64>(),
        jobs.iter().filter(|j| j.deadline_hours.is_some()).count()
    );
    println!(
        "  {:<14} {:>12} {:>10} {:>8} {:>14}",
        "strategy", "cost $", "mean JCT h", "misses", "interruptions"
    );
    let mut costs = Vec::new();
    for (label, strategy) in &strategies {
        let outcomes: Vec<Outcome> = jobs.iter().map(strategy).collect();
        let cost: f64 = outcomes.iter().map(|o| o.cost).sum();
        costs.push(cost);
        println!(
            "  {label:<14} {cost:>12.0} {:>10.2} {:>8} {:>14}",
            outcomes.iter().map(|o| o.hours).sum::<f64>() / outcomes.len().max(1) as f64,
            outcomes.iter().filter(|o| o.missed).count(),
            outcomes.iter().map(|o| o.interruptions).sum::<u32>()
        );
    }
    println!(
        "  trainyard vs oracle: {:+.1}%  trainyard vs all on-demand: {:+.1}%",
        (costs[2] / costs[3] - 1.0) * 100.0,
        (costs[2] / costs[0] - 1.0) * 100.0
    );
}

fn main() -> Result<(), trainyard_loadtest::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sample = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/sample-40.csv");
    let paths = if args.is_empty() {
        vec![sample.to_string()]
    } else {
        args
    };
    for path in &paths {
        report(path, &read_trace(Path::new(path))?);
    }
    let larger = generate(&GeneratorConfig {
        seed: 11,
        jobs: 2000,
        ..GeneratorConfig::default()
    })?;
    report("generated (2000 jobs, seed 11)", &larger);
    Ok(())
}
