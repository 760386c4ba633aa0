//! Spot or on-demand on a replayed trace: total cost, mean JCT and deadline
//! misses for all on-demand, all spot, the cost-optimizer's choice, the best
//! rule a policy without foresight can follow, and an oracle that knows every
//! reclaim in advance; then where the cost-optimizer's gap to the oracle
//! comes from.
//!
//! Each job runs alone on its gang's nodes (capacity is not contended): the
//! figures compare capacity choices, not queueing. Trace durations are
//! multiplied by `TIME_SCALE` so jobs run for hours, as training does.
//! Spot nodes are reclaimed at `RECLAIMS_PER_NODE_HOUR` (Poisson, seeded), so
//! a gang of n nodes is interrupted at n times that rate; a reclaim loses the
//! work since the last checkpoint and costs a restart, in time and money: the
//! gang holds its new nodes while its pods start and load the checkpoint,
//! and pays their price (the decision model prices the restart the same
//! way), under every policy alike. Half the jobs checkpoint
//! every 30 minutes; every third has a deadline of 1.3 × its duration. The
//! cost-optimizer sees the pool's rate as its prior (the catalog bucket) and
//! decides again after each interruption, with the time then left to the
//! deadline.
//!
//! The oracle runs each job all on spot when that, with the reclaims it
//! knows, is cheaper and misses no deadline on-demand would meet; otherwise
//! all on-demand. Part of any policy's gap to it is luck no policy can know.
//! The best rule without foresight shows how much: for each job, of "all
//! on-demand" and "spot, then on-demand after k interruptions" (k = 1, 2, 3,
//! never), the rule with the lowest mean cost over `--draws` reclaim draws
//! whose deadline-miss rate is at most on-demand's plus the cost-optimizer's
//! risk tolerance. Expected costs are means over `--draws` further draws.
//!
//! `cargo run --release -p trainyard-loadtest --bin cost -- [trace.csv ...]`

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Parser;
use cost_optimizer_core::decision::{
    CapacityChoice, Choice, DecisionInputs, RuntimeSource, decide,
};
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
/// Seeds of the draws that choose the best rule and of those that measure
/// expected costs; far from `--seed` so none is shared.
const CHOOSING_SEEDS: u64 = 1_000_000;
const MEASURING_SEEDS: u64 = 2_000_000;

#[derive(Parser)]
#[command(
    about = "Spot or on-demand on replayed traces: cost, JCT and deadline misses of all on-demand, all spot, the cost-optimizer, the best rule without foresight and an oracle"
)]
struct Args {
    /// Traces in the Tiresias CSV columns; a generated trace of 2000 jobs
    /// (seed 11) is replayed after them.
    #[arg(default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/sample-40.csv"))]
    traces: Vec<PathBuf>,
    /// Seed of the reclaims the per-draw figures and the breakdown use.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Reclaim draws that choose the best rule, and as many again that
    /// measure expected costs.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    draws: u64,
    /// Extra deadline-miss probability spot may carry (the cost-optimizer's
    /// `deadline_risk_tolerance`; the best rule is held to the same).
    #[arg(long, default_value_t = 0.0, value_parser = risk)]
    deadline_risk_tolerance: f64,
    /// Interruptions after which the cost-optimizer keeps a job on
    /// on-demand (its `max_spot_interruptions`).
    #[arg(long, default_value_t = 3)]
    max_spot_interruptions: u32,
    /// Writes one CSV line per job (the cost-optimizer against the oracle)
    /// to `DIR/<trace>.csv`.
    #[arg(long, value_name = "DIR")]
    breakdown: Option<PathBuf>,
}

fn risk(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text} is not a probability between 0 and 1")),
    }
}

struct Job {
    gpus: u32,
    nodes: u32,
    work_hours: f64,
    checkpoint: Option<f64>,
    deadline_hours: Option<f64>,
    /// Hours (of wall time on spot) at which the gang is reclaimed.
    reclaims: Vec<f64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    hours: f64,
    cost: f64,
    missed: bool,
    interruptions: u32,
    /// Hours run on spot whose work a reclaim threw away.
    lost_hours: f64,
}

fn price_of(choice: Choice) -> f64 {
    match choice {
        Choice::Spot => SPOT_PRICE,
        Choice::OnDemand => ON_DEMAND_PRICE,
    }
}

/// Runs `job` starting on `first`; `policy` is asked again after every
/// interruption, given the work left, the interruptions so far and the
/// hours since the start.
fn run(job: &Job, first: Choice, mut policy: impl FnMut(f64, u32, f64) -> Choice) -> Outcome {
    let save = job.checkpoint.map_or(0.0, |_| SAVE_HOURS);
    let mut choice = first;
    let mut outcome = Outcome::default();
    let (mut clock, mut left) = (0.0, job.work_hours);
    let mut reclaims = job.reclaims.iter().copied().peekable();
    loop {
        // Time to finish from here without interruption.
        let segments = job
            .checkpoint
            .map_or(1.0, |tau| (left / tau).ceil().max(1.0));
        let need = left + (segments - 1.0) * save;
        let price = price_of(choice);
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
                outcome.cost += need * f64::from(job.gpus) * price;
                break;
            }
            Some(at) => {
                let ran = at - clock;
                outcome.cost += ran * f64::from(job.gpus) * price;
                let (saved, kept) = match job.checkpoint {
                    Some(tau) => {
                        let done = (ran / (tau + save)).floor();
                        let saved = (done * tau).min(left);
                        (saved, saved / tau * (tau + save))
                    }
                    None => (0.0, 0.0),
                };
                left -= saved;
                outcome.lost_hours += ran - kept;
                outcome.interruptions += 1;
                clock = at + RESTART_HOURS;
                reclaims.next();
                choice = policy(left, outcome.interruptions, clock);
                outcome.cost += RESTART_HOURS * f64::from(job.gpus) * price_of(choice);
            }
        }
    }
    outcome.hours = clock;
    outcome.missed = job.deadline_hours.is_some_and(|d| clock > d);
    outcome
}

/// The cost-optimizer's settings the benchmark varies.
#[derive(Debug, Clone, Copy)]
struct Settings {
    deadline_risk_tolerance: f64,
    max_spot_interruptions: u32,
}

fn inputs(
    job: &Job,
    work: f64,
    interruptions: u32,
    elapsed: f64,
    settings: Settings,
) -> DecisionInputs {
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
        max_spot_interruptions: settings.max_spot_interruptions,
        deadline_risk_tolerance: settings.deadline_risk_tolerance,
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

fn on_demand(job: &Job) -> Outcome {
    run(job, Choice::OnDemand, |_, _, _| Choice::OnDemand)
}

fn spot(job: &Job) -> Outcome {
    run(job, Choice::Spot, |_, _, _| Choice::Spot)
}

/// The cost-optimizer's first choice and how the job went under its choices.
fn trainyard(job: &Job, settings: Settings) -> (CapacityChoice, Outcome) {
    let first = decide(&inputs(job, job.work_hours, 0, 0.0, settings));
    let outcome = run(job, first.choice, |left, n, clock| {
        decide(&inputs(job, left, n, clock, settings)).choice
    });
    (first, outcome)
}

/// The oracle's choice for the whole run and how the job went.
fn oracle(job: &Job) -> (Choice, Outcome) {
    let (od, spot) = (on_demand(job), spot(job));
    if spot.cost < od.cost && (!spot.missed || od.missed) {
        (Choice::Spot, spot)
    } else {
        (Choice::OnDemand, od)
    }
}

/// A rule that needs no foresight: all on-demand, or spot until the
/// `n`th interruption and on-demand from then on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    OnDemand,
    SpotUntil(u32),
}

const RULES: [Rule; 5] = [
    Rule::OnDemand,
    Rule::SpotUntil(1),
    Rule::SpotUntil(2),
    Rule::SpotUntil(3),
    Rule::SpotUntil(u32::MAX),
];

fn follow(job: &Job, rule: Rule) -> Outcome {
    match rule {
        Rule::OnDemand => on_demand(job),
        Rule::SpotUntil(limit) => run(job, Choice::Spot, |_, n, _| {
            if n >= limit {
                Choice::OnDemand
            } else {
                Choice::Spot
            }
        }),
    }
}

/// Per job, the rule with the lowest mean cost over `draws` reclaim draws
/// among those whose miss rate is within the tolerance of on-demand's.
fn best_rules(trace: &[TraceJob], draws: u64, tolerance: f64) -> Vec<Rule> {
    let mut cost = vec![[0.0f64; RULES.len()]; trace.len()];
    let mut misses = vec![[0u64; RULES.len()]; trace.len()];
    for draw in 0..draws {
        for (i, job) in jobs_of(trace, CHOOSING_SEEDS + draw).iter().enumerate() {
            for (r, rule) in RULES.iter().enumerate() {
                let o = follow(job, *rule);
                cost[i][r] += o.cost;
                misses[i][r] += u64::from(o.missed);
            }
        }
    }
    let tolerated = (tolerance * draws as f64).floor() as u64;
    (0..trace.len())
        .map(|i| {
            let allowed = misses[i][0] + tolerated;
            (0..RULES.len())
                .filter(|&r| misses[i][r] <= allowed)
                .min_by(|&a, &b| cost[i][a].total_cmp(&cost[i][b]))
                .map_or(Rule::OnDemand, |r| RULES[r])
        })
        .collect()
}

/// Where a job's cost under the cost-optimizer differs from the oracle's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Gap {
    SpotUntilLimit,
    SpotReclaimedOracleOnDemand,
    SpotReclaimedOracleSpot,
    OnDemandForDeadlineOracleSpot,
    OnDemandForReworkOracleSpot,
    SpotOracleOnDemand,
    Same,
}

impl Gap {
    fn label(self) -> &'static str {
        match self {
            Gap::SpotUntilLimit => "spot, reclaimed to the limit, then on-demand",
            Gap::SpotReclaimedOracleOnDemand => "spot, reclaimed; oracle on-demand",
            Gap::SpotReclaimedOracleSpot => "spot, reclaimed; oracle spot",
            Gap::OnDemandForDeadlineOracleSpot => "on-demand (deadline risk); oracle spot",
            Gap::OnDemandForReworkOracleSpot => "on-demand (expected rework); oracle spot",
            Gap::SpotOracleOnDemand => "spot, not reclaimed; oracle on-demand",
            Gap::Same => "same run as the oracle",
        }
    }

    fn of(first: &CapacityChoice, ours: &Outcome, oracle: Choice, limit: u32) -> Gap {
        if first.choice == Choice::Spot && ours.interruptions >= limit {
            return Gap::SpotUntilLimit;
        }
        match (first.choice, ours.interruptions > 0, oracle) {
            (Choice::Spot, true, Choice::OnDemand) => Gap::SpotReclaimedOracleOnDemand,
            (Choice::Spot, true, Choice::Spot) => Gap::SpotReclaimedOracleSpot,
            (Choice::Spot, false, Choice::OnDemand) => Gap::SpotOracleOnDemand,
            (Choice::OnDemand, _, Choice::Spot) => {
                if first.spot.expected_cost < first.on_demand.expected_cost {
                    Gap::OnDemandForDeadlineOracleSpot
                } else {
                    Gap::OnDemandForReworkOracleSpot
                }
            }
            (Choice::Spot, false, Choice::Spot) | (Choice::OnDemand, _, Choice::OnDemand) => {
                Gap::Same
            }
        }
    }
}

#[derive(Default, Clone, Copy)]
struct Sums {
    jobs: usize,
    ours: f64,
    oracle: f64,
    rework: f64,
}

fn summary(outcomes: &[Outcome]) -> (f64, f64, usize, u32) {
    (
        outcomes.iter().map(|o| o.cost).sum(),
        outcomes.iter().map(|o| o.hours).sum::<f64>() / outcomes.len().max(1) as f64,
        outcomes.iter().filter(|o| o.missed).count(),
        outcomes.iter().map(|o| o.interruptions).sum(),
    )
}

fn percent(a: f64, b: f64) -> f64 {
    (a / b - 1.0) * 100.0
}

fn report(name: &str, trace: &[TraceJob], args: &Args) -> Result<(), trainyard_loadtest::Error> {
    let jobs = jobs_of(trace, args.seed);
    let settings = Settings {
        deadline_risk_tolerance: args.deadline_risk_tolerance,
        max_spot_interruptions: args.max_spot_interruptions,
    };
    let tolerance = settings.deadline_risk_tolerance;
    let rules = best_rules(trace, args.draws, tolerance);
    println!(
        "{name}: {} jobs, {:.0} GPU-hours of work, {} checkpointing, {} with deadlines, reclaims {RECLAIMS_PER_NODE_HOUR}/node-h, deadline risk tolerance {tolerance}, spot interruption limit {}, seed {}",
        jobs.len(),
        jobs.iter()
            .map(|j| j.work_hours * f64::from(j.gpus))
            .sum::<f64>(),
        jobs.iter().filter(|j| j.checkpoint.is_some()).count(),
        jobs.iter().filter(|j| j.deadline_hours.is_some()).count(),
        settings.max_spot_interruptions,
        args.seed
    );
    let od: Vec<Outcome> = jobs.iter().map(on_demand).collect();
    let all_spot: Vec<Outcome> = jobs.iter().map(spot).collect();
    let ours: Vec<(CapacityChoice, Outcome)> =
        jobs.iter().map(|j| trainyard(j, settings)).collect();
    let ours_outcomes: Vec<Outcome> = ours.iter().map(|(_, o)| *o).collect();
    let ruled: Vec<Outcome> = jobs
        .iter()
        .zip(&rules)
        .map(|(j, r)| follow(j, *r))
        .collect();
    let oracles: Vec<(Choice, Outcome)> = jobs.iter().map(oracle).collect();
    let oracle_outcomes: Vec<Outcome> = oracles.iter().map(|(_, o)| *o).collect();
    println!(
        "  {:<26} {:>10} {:>10} {:>7} {:>13}",
        "strategy", "cost $", "mean JCT h", "misses", "interruptions"
    );
    let rows = [
        ("all on-demand", &od),
        ("all spot", &all_spot),
        ("trainyard", &ours_outcomes),
        ("best rule without foresight", &ruled),
        ("oracle", &oracle_outcomes),
    ];
    let mut costs = Vec::new();
    for (label, outcomes) in rows {
        let (cost, jct, missed, interruptions) = summary(outcomes);
        costs.push(cost);
        println!("  {label:<26} {cost:>10.0} {jct:>10.2} {missed:>7} {interruptions:>13}");
    }
    println!(
        "  trainyard vs oracle {:+.1}%, vs all on-demand {:+.1}%; best rule without foresight vs oracle {:+.1}%",
        percent(costs[2], costs[4]),
        percent(costs[2], costs[0]),
        percent(costs[3], costs[4]),
    );

    // Expected figures: the same strategies over independent draws.
    let mut expected = [0.0f64; 5];
    let mut expected_misses = [0u64; 5];
    // The deadline risk the cost-optimizer took, by its own model, on its
    // first choices: beside its misses, how well the model is calibrated.
    let predicted: f64 = jobs
        .iter()
        .map(|j| decide(&inputs(j, j.work_hours, 0, 0.0, settings)))
        .filter(|c| c.choice == Choice::Spot)
        .filter_map(|c| c.spot.miss_probability)
        .sum();
    for draw in 0..args.draws {
        for (job, rule) in jobs_of(trace, MEASURING_SEEDS + draw).iter().zip(&rules) {
            let runs = [
                on_demand(job),
                spot(job),
                trainyard(job, settings).1,
                follow(job, *rule),
                oracle(job).1,
            ];
            for (k, o) in runs.iter().enumerate() {
                expected[k] += o.cost;
                expected_misses[k] += u64::from(o.missed);
            }
        }
    }
    let draws = args.draws as f64;
    let mean = expected.map(|c| c / draws);
    println!(
        "  expected over {} draws (rules chosen on {} others): cost $ / misses per draw",
        args.draws, args.draws
    );
    let mut line = String::from("   ");
    for (k, (label, _)) in rows.iter().enumerate() {
        let _ = write!(
            line,
            " {label} {:.0} / {:.2};",
            mean[k],
            expected_misses[k] as f64 / draws
        );
    }
    println!("{}", line.trim_end_matches(';'));
    println!(
        "  trainyard's deadline risk on its first choices, by its model: {predicted:.2} misses per draw"
    );
    let knowable = if mean[2] > mean[4] {
        format!(
            "{:.0}% of trainyard's gap to the oracle is knowable",
            (mean[2] - mean[3]) / (mean[2] - mean[4]) * 100.0
        )
    } else {
        "trainyard is at or below the oracle's cost".to_string()
    };
    println!(
        "  expected: trainyard vs oracle {:+.1}%, best rule without foresight vs oracle {:+.1}%, trainyard vs best rule {:+.1}% ({knowable})",
        percent(mean[2], mean[4]),
        percent(mean[3], mean[4]),
        percent(mean[2], mean[3]),
    );

    // Where the gap on this draw comes from.
    let mut sums = std::collections::BTreeMap::<Gap, Sums>::new();
    let mut lines = String::from(
        "job,gpus,nodes,work_hours,checkpoints,deadline_hours,trainyard_first,trainyard_interruptions,trainyard_lost_hours,trainyard_cost,trainyard_missed,oracle_choice,oracle_cost,oracle_missed,best_rule,category,gap\n",
    );
    for (i, job) in jobs.iter().enumerate() {
        let (first, ours) = &ours[i];
        let (oracle_choice, oracle) = &oracles[i];
        let gap = Gap::of(first, ours, *oracle_choice, settings.max_spot_interruptions);
        let entry = sums.entry(gap).or_default();
        entry.jobs += 1;
        entry.ours += ours.cost;
        entry.oracle += oracle.cost;
        entry.rework += ours.lost_hours * f64::from(job.gpus) * SPOT_PRICE;
        let _ = writeln!(
            lines,
            "{},{},{},{:.3},{},{},{},{},{:.3},{:.2},{},{},{:.2},{},{:?},{:?},{:.2}",
            trace[i].id,
            job.gpus,
            job.nodes,
            job.work_hours,
            job.checkpoint.is_some(),
            job.deadline_hours
                .map_or(String::new(), |d| format!("{d:.3}")),
            first.choice.as_str(),
            ours.interruptions,
            ours.lost_hours,
            ours.cost,
            ours.missed,
            oracle_choice.as_str(),
            oracle.cost,
            oracle.missed,
            rules[i],
            gap,
            ours.cost - oracle.cost
        );
    }
    println!("  trainyard's gap to the oracle on this draw, by job:");
    println!(
        "    {:<42} {:>5} {:>12} {:>10} {:>9} {:>9}",
        "category", "jobs", "trainyard $", "oracle $", "gap $", "rework $"
    );
    let total_gap = costs[2] - costs[4];
    for (gap, s) in &sums {
        println!(
            "    {:<42} {:>5} {:>12.0} {:>10.0} {:>9.0} {:>9.0}",
            gap.label(),
            s.jobs,
            s.ours,
            s.oracle,
            s.ours - s.oracle,
            s.rework
        );
    }
    println!(
        "    {:<42} {:>5} {:>12.0} {:>10.0} {:>9.0} {:>9.0}",
        "total",
        jobs.len(),
        costs[2],
        costs[4],
        total_gap,
        sums.values().map(|s| s.rework).sum::<f64>()
    );
    if let Some(dir) = &args.breakdown {
        std::fs::create_dir_all(dir).map_err(|source| trainyard_loadtest::Error::Io {
            path: dir.clone(),
            source,
        })?;
        let stem = Path::new(name)
            .file_stem()
            .map_or_else(|| name.to_string(), |s| s.to_string_lossy().into_owned());
        let path = dir.join(format!("{}.csv", stem.replace([' ', '(', ')', ','], "")));
        std::fs::write(&path, lines).map_err(|source| trainyard_loadtest::Error::Io {
            path: path.clone(),
            source,
        })?;
        println!("  per-job breakdown: {}", path.display());
    }
    Ok(())
}

fn main() -> Result<(), trainyard_loadtest::Error> {
    let args = Args::parse();
    for path in &args.traces {
        report(&path.display().to_string(), &read_trace(path)?, &args)?;
    }
    let larger = generate(&GeneratorConfig {
        seed: 11,
        jobs: 2000,
        ..GeneratorConfig::default()
    })?;
    report("generated-2000-seed-11", &larger, &args)
}
