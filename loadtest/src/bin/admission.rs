//! Admission benchmark: the gpu-allocator core against FIFO baselines on the
//! same seeded job stream, in one process.
//!
//! Cluster (2,000 nodes, 15,200 GPUs), three node pools as a cloud cluster
//! has them, nodes named and indexed pool by pool:
//! - `a100-mig`: 100 nodes x 8 A100 partitioned into 7 `1g.10gb` MIG slices
//!   each (56 slices a node, 800 GPUs);
//! - `h100-4g`: 200 nodes x 4 H100 (800 GPUs);
//! - `h100-8g`: 1,700 nodes x 8 H100 (13,600 GPUs);
//!
//! in 3 zones, NVLink racks of 16 nodes. 30 TrainingQueues in 3 cohorts; each
//! has an equal share of the H100 GPUs and of the MIG slices as nominal quota
//! (quotas add up to the cluster), borrowing unlimited inside the cohort.
//!
//! Workload, a fragmenting mix (see `SHAPES`): MIG slices for notebooks,
//! 1/2/4/8-GPU single-worker jobs, and gangs of 4-GPU and 8-GPU workers from 2
//! to 96 workers (the API allows 100); heavy-tailed runtimes (log-uniform, so jobs end at all
//! times and leave holes), runtime estimates (1.0-1.5x the truth) on 70% of
//! jobs, 5% high-priority jobs, queues picked uniformly.
//!
//! Closed loop: before every cycle the backlog is topped up to 10,000
//! pending jobs from one pre-generated stream (so every policy sees the same
//! jobs in the same order); jobs finish after their actual runtime in
//! simulated time, one cycle per simulated step. Bounded by `--cycles` and
//! `--max-wall-secs`. Prints figures only; nothing is asserted on timing.
//! The allocation ratio counts GPU-equivalents (a MIG slice is 1/7 GPU) held
//! by running jobs, the same bookkeeping for every policy.
//!
//! Baselines (all all-or-nothing per gang, in submission order, each job
//! limited to the pool kind it asks for): strict FIFO with first-fit
//! placement (the first job that does not fit blocks the rest: Kueue's
//! StrictFIFO on one ClusterQueue), FIFO first-fit skipping blocked jobs, and
//! strict FIFO with spread placement (what kube-scheduler's default scoring
//! does behind a FIFO admission queue).
//!
//! Usage: `admission [--seed N] [--cycles N] [--step-secs N] [--max-wall-secs N]
//! [--warmup-secs N] [--preemption 0|1]`

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use gpu_allocator_core::{
    Allocator, AllocatorConfig, Event, FlavorQuota, GpuSliceRequest, JobSpec, JobUid, NodeInfo,
    QueueSpec, ResourceQuota, Timestamp, names,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A node pool: `count` nodes of `gpus` GPUs, MIG-partitioned or whole.
struct NodePool {
    name: &'static str,
    count: usize,
    gpus: u32,
    product: &'static str,
    mig: bool,
}

const POOLS: [NodePool; 3] = [
    NodePool {
        name: "a100-mig",
        count: 20,
        gpus: 8,
        product: "A100",
        mig: true,
    },
    NodePool {
        name: "h100-4g",
        count: 200,
        gpus: 4,
        product: "H100",
        mig: false,
    },
    NodePool {
        name: "h100-8g",
        count: 1_780,
        gpus: 8,
        product: "H100",
        mig: false,
    },
];
const MIG_PROFILE: &str = "1g.10gb";
const SLICES_PER_GPU: u32 = 7;
const RACK_SIZE: usize = 16;
const ZONES: usize = 3;
const QUEUES: usize = 30;
const COHORTS: usize = 3;
const BACKLOG: usize = 10_000;
const GPU_FLAVOR: &str = "H100.on-demand";
const MIG_FLAVOR: &str = "A100.on-demand";

/// One kind of job in the mix.
#[derive(Clone, Copy)]
struct Shape {
    workers: u32,
    /// GPUs (or MIG slices) per worker.
    units: u32,
    mig: bool,
    /// Share of jobs, per mille.
    weight: u32,
    /// Runtime range in seconds, drawn log-uniformly.
    runtime: (u64, u64),
}

const fn shape(workers: u32, units: u32, mig: bool, weight: u32, lo: u64, hi: u64) -> Shape {
    Shape {
        workers,
        units,
        mig,
        weight,
        runtime: (lo, hi),
    }
}

/// The job mix. Most jobs are small and short, most GPU-hours go to a few
/// large gangs, as in published cluster traces; runtimes are log-uniform, so
/// jobs end at all times and leave holes.
const SHAPES: [Shape; 15] = [
    shape(1, 1, true, 60, 300, 14_400),
    shape(1, 2, true, 40, 300, 14_400),
    shape(1, 1, false, 270, 300, 14_400),
    shape(1, 2, false, 170, 300, 14_400),
    shape(1, 4, false, 140, 600, 14_400),
    shape(1, 8, false, 90, 600, 14_400),
    shape(2, 4, false, 50, 900, 14_400),
    shape(4, 4, false, 30, 900, 14_400),
    shape(2, 8, false, 50, 1_800, 21_600),
    shape(4, 8, false, 35, 1_800, 21_600),
    shape(8, 8, false, 25, 1_800, 21_600),
    shape(16, 8, false, 18, 1_800, 21_600),
    shape(32, 8, false, 10, 3_600, 21_600),
    shape(64, 8, false, 5, 3_600, 21_600),
    shape(96, 8, false, 2, 3_600, 21_600),
];

fn total_gpus() -> u64 {
    POOLS
        .iter()
        .map(|p| p.count as u64 * u64::from(p.gpus))
        .sum()
}

struct Args {
    seed: u64,
    cycles: usize,
    step_secs: u64,
    max_wall: Duration,
    warmup_secs: u64,
    preemption: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: 7,
        cycles: 360,
        step_secs: 60,
        max_wall: Duration::from_secs(240),
        warmup_secs: 2 * 3600,
        preemption: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: {value:?} is not a number"))?;
        match flag.as_str() {
            "--seed" => args.seed = n,
            "--cycles" => args.cycles = usize::try_from(n).map_err(|e| e.to_string())?,
            "--step-secs" => args.step_secs = n.max(1),
            "--max-wall-secs" => args.max_wall = Duration::from_secs(n),
            "--warmup-secs" => args.warmup_secs = n,
            "--preemption" => args.preemption = n != 0,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// One job of the stream; `duration` is the truth the allocator never sees.
#[derive(Clone)]
struct SimJob {
    queue: usize,
    workers: u32,
    units: u32,
    mig: bool,
    priority: i32,
    duration: u64,
    estimate: Option<u64>,
}

impl SimJob {
    /// GPUs the job holds, a MIG slice counting as 1/7 GPU.
    fn gpu_equivalents(&self) -> f64 {
        let units = f64::from(self.workers) * f64::from(self.units);
        if self.mig {
            units / f64::from(SLICES_PER_GPU)
        } else {
            units
        }
    }

    fn is_big(&self) -> bool {
        !self.mig && u64::from(self.workers) * u64::from(self.units) >= 64
    }
}

fn generate_stream(seed: u64, count: usize) -> Vec<SimJob> {
    let mut rng = StdRng::seed_from_u64(seed);
    let total_weight: u32 = SHAPES.iter().map(|s| s.weight).sum();
    (0..count)
        .map(|_| {
            let mut pick = rng.random_range(0..total_weight);
            let mut shape = SHAPES[0];
            for s in SHAPES {
                if pick < s.weight {
                    shape = s;
                    break;
                }
                pick -= s.weight;
            }
            let (lo, hi) = shape.runtime;
            let duration =
                (lo as f64 * (hi as f64 / lo as f64).powf(rng.random_range(0.0..1.0))) as u64;
            let estimate = if rng.random_range(0..100u32) < 70 {
                Some((duration as f64 * rng.random_range(1.0..1.5)) as u64)
            } else {
                None
            };
            SimJob {
                queue: rng.random_range(0..QUEUES),
                workers: shape.workers,
                units: shape.units,
                mig: shape.mig,
                priority: if rng.random_range(0..100u32) < 5 {
                    100
                } else {
                    0
                },
                duration,
                estimate,
            }
        })
        .collect()
}

/// Every node with its pool, in index order.
fn nodes() -> Vec<(NodeInfo, &'static NodePool)> {
    let mut out = Vec::new();
    let mut rack = 0usize;
    for pool in &POOLS {
        for i in 0..pool.count {
            if i % RACK_SIZE == 0 && i > 0 {
                rack += 1;
            }
            let mut n = NodeInfo {
                name: format!("{}-{i:04}", pool.name),
                ready: true,
                ..NodeInfo::default()
            };
            if pool.mig {
                n.allocatable.insert(names::GPU_RESOURCE.into(), "0".into());
                n.allocatable.insert(
                    format!("{}{MIG_PROFILE}", names::MIG_RESOURCE_PREFIX),
                    (pool.gpus * SLICES_PER_GPU).to_string(),
                );
            } else {
                n.allocatable
                    .insert(names::GPU_RESOURCE.into(), pool.gpus.to_string());
            }
            n.labels
                .insert(names::GPU_PRODUCT_LABEL.into(), pool.product.into());
            n.labels
                .insert(names::HOSTNAME_LABEL.into(), n.name.clone());
            n.labels
                .insert(names::ZONE_LABEL.into(), format!("zone-{}", rack % ZONES));
            n.labels
                .insert(names::NVLINK_CLIQUE_LABEL.into(), format!("rack-{rack:03}"));
            out.push((n, pool));
        }
        rack += 1;
    }
    out
}

/// `total` split into `QUEUES` nominal quotas that add up exactly.
fn share(total: u64, queue: usize) -> u64 {
    total / QUEUES as u64 + u64::from((queue as u64) < total % QUEUES as u64)
}

fn queues() -> Vec<QueueSpec> {
    let gpus: u64 = POOLS
        .iter()
        .filter(|p| !p.mig)
        .map(|p| p.count as u64 * u64::from(p.gpus))
        .sum();
    let slices: u64 = POOLS
        .iter()
        .filter(|p| p.mig)
        .map(|p| p.count as u64 * u64::from(p.gpus * SLICES_PER_GPU))
        .sum();
    (0..QUEUES)
        .map(|i| QueueSpec {
            name: format!("team-{i:02}"),
            cohort: Some(format!("cohort-{}", i % COHORTS)),
            weight: 1.0 + (i % 3) as f64,
            quotas: vec![
                FlavorQuota {
                    flavor: GPU_FLAVOR.into(),
                    resources: vec![ResourceQuota {
                        resource: names::GPU_RESOURCE.into(),
                        nominal: share(gpus, i),
                        ..ResourceQuota::default()
                    }],
                },
                FlavorQuota {
                    flavor: MIG_FLAVOR.into(),
                    resources: vec![ResourceQuota {
                        resource: format!("{}{MIG_PROFILE}", names::MIG_RESOURCE_PREFIX),
                        nominal: share(slices, i),
                        ..ResourceQuota::default()
                    }],
                },
            ],
            ..QueueSpec::default()
        })
        .collect()
}

fn job_spec(index: usize, job: &SimJob, now: u64) -> JobSpec {
    JobSpec {
        uid: JobUid::new(format!("j{index}")),
        namespace: "bench".into(),
        name: format!("j{index}"),
        queue: Some(format!("team-{:02}", job.queue)),
        priority: job.priority,
        submitted_at: Timestamp(now),
        num_workers: job.workers,
        gpus_per_worker: job.units,
        gpu_slice: job
            .mig
            .then(|| GpuSliceRequest::Profile(MIG_PROFILE.into())),
        runtime_estimate_secs: job.estimate,
        ..JobSpec::default()
    }
}

fn index_of(uid: &JobUid) -> Option<usize> {
    uid.as_str().strip_prefix('j')?.parse().ok()
}

#[derive(Default, Serialize, Clone)]
struct Report {
    policy: String,
    cycles: usize,
    cycle_p50_ms: f64,
    cycle_p99_ms: f64,
    cycle_max_ms: f64,
    first_cycle_ms: f64,
    first_cycle_admissions: u64,
    first_cycle_admissions_per_sec: f64,
    admissions: u64,
    admissions_per_sec: f64,
    steady_allocation_ratio: f64,
    preemptions: u64,
    victims_lower_priority: u64,
    victims_reclaim: u64,
    victims_fair_share: u64,
    victim_gpus: u64,
    preemption_attempts: u64,
    reservations_made: u64,
    big_gangs_submitted: u64,
    big_gangs_started: u64,
    big_gangs_waiting_at_end: u64,
    oldest_waiting_big_gang_min: f64,
    big_gang_wait_p50_min: f64,
    big_gang_wait_max_min: f64,
    simulated_hours: f64,
    wall_secs: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Shared bookkeeping of one simulated run.
struct Sim {
    submitted_at: Vec<u64>,
    started: Vec<bool>,
    generation: Vec<u32>,
    /// GPU-equivalents each job holds while it runs (0 otherwise).
    held: Vec<f64>,
    allocated: f64,
    finishes: BinaryHeap<Reverse<(u64, usize, u32)>>,
    next_job: usize,
    cycle_ms: Vec<f64>,
    admissions: u64,
    alloc_samples: Vec<f64>,
    big_waits_min: Vec<f64>,
    preemptions: u64,
    /// Victims by rule: lower priority, reclaim, fair share.
    victims_by_rule: [u64; 3],
    victim_gpus: u64,
    preemption_attempts: u64,
    reservations: u64,
    first_cycle: (f64, u64),
}

impl Sim {
    fn new(stream_len: usize) -> Self {
        Sim {
            submitted_at: vec![0; stream_len],
            started: vec![false; stream_len],
            generation: vec![0; stream_len],
            held: vec![0.0; stream_len],
            allocated: 0.0,
            finishes: BinaryHeap::new(),
            next_job: 0,
            cycle_ms: Vec::new(),
            admissions: 0,
            alloc_samples: Vec::new(),
            big_waits_min: Vec::new(),
            preemptions: 0,
            victims_by_rule: [0; 3],
            victim_gpus: 0,
            preemption_attempts: 0,
            reservations: 0,
            first_cycle: (0.0, 0),
        }
    }

    fn started(&mut self, idx: usize, job: &SimJob, now: u64) {
        self.admissions += 1;
        if let Some(g) = self.generation.get_mut(idx) {
            *g += 1;
            self.finishes.push(Reverse((now + job.duration, idx, *g)));
        }
        if let Some(h) = self.held.get_mut(idx) {
            *h = job.gpu_equivalents();
            self.allocated += *h;
        }
        if job.is_big() && !self.started[idx] {
            self.big_waits_min
                .push((now - self.submitted_at[idx]) as f64 / 60.0);
        }
        self.started[idx] = true;
    }

    /// The running instance of `idx` stopped (finished or evicted).
    fn stopped(&mut self, idx: usize) {
        if let Some(h) = self.held.get_mut(idx) {
            self.allocated -= *h;
            *h = 0.0;
        }
    }

    /// Pops jobs finishing by `now` that are still the running instance.
    fn due(&mut self, now: u64) -> Vec<usize> {
        let mut out = Vec::new();
        while let Some(Reverse((t, idx, generation))) = self.finishes.peek().copied() {
            if t > now {
                break;
            }
            self.finishes.pop();
            if self.generation.get(idx) == Some(&generation) {
                self.stopped(idx);
                out.push(idx);
            }
        }
        out
    }

    fn report(&self, policy: &str, args: &Args, wall: Duration, stream: &[SimJob]) -> Report {
        let end = self.cycle_ms.len() as u64 * args.step_secs;
        let mut big_submitted = 0u64;
        let mut big_waiting = 0u64;
        let mut oldest_waiting = 0u64;
        for (idx, job) in stream.iter().enumerate().take(self.next_job) {
            if !job.is_big() {
                continue;
            }
            big_submitted += 1;
            if !self.started[idx] {
                big_waiting += 1;
                oldest_waiting = oldest_waiting.max(end.saturating_sub(self.submitted_at[idx]));
            }
        }
        let mut sorted = self.cycle_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let total_ms: f64 = self.cycle_ms.iter().sum();
        let mut waits = self.big_waits_min.clone();
        waits.sort_by(f64::total_cmp);
        let steady: Vec<f64> = self.alloc_samples.clone();
        Report {
            policy: policy.into(),
            cycles: self.cycle_ms.len(),
            cycle_p50_ms: percentile(&sorted, 0.50),
            cycle_p99_ms: percentile(&sorted, 0.99),
            cycle_max_ms: sorted.last().copied().unwrap_or(0.0),
            first_cycle_ms: self.first_cycle.0,
            first_cycle_admissions: self.first_cycle.1,
            first_cycle_admissions_per_sec: if self.first_cycle.0 > 0.0 {
                self.first_cycle.1 as f64 / (self.first_cycle.0 / 1000.0)
            } else {
                0.0
            },
            admissions: self.admissions,
            admissions_per_sec: if total_ms > 0.0 {
                self.admissions as f64 / (total_ms / 1000.0)
            } else {
                0.0
            },
            steady_allocation_ratio: if steady.is_empty() {
                0.0
            } else {
                steady.iter().sum::<f64>() / steady.len() as f64
            },
            preemptions: self.preemptions,
            victims_lower_priority: self.victims_by_rule[0],
            victims_reclaim: self.victims_by_rule[1],
            victims_fair_share: self.victims_by_rule[2],
            victim_gpus: self.victim_gpus,
            preemption_attempts: self.preemption_attempts,
            reservations_made: self.reservations,
            big_gangs_submitted: big_submitted,
            big_gangs_started: waits.len() as u64,
            big_gangs_waiting_at_end: big_waiting,
            oldest_waiting_big_gang_min: oldest_waiting as f64 / 60.0,
            big_gang_wait_p50_min: percentile(&waits, 0.5),
            big_gang_wait_max_min: waits.last().copied().unwrap_or(0.0),
            simulated_hours: (self.cycle_ms.len() as u64 * args.step_secs) as f64 / 3600.0,
            wall_secs: wall.as_secs_f64(),
        }
    }
}

fn run_allocator(stream: &[SimJob], args: &Args) -> Result<Report, String> {
    let started_wall = Instant::now();
    let mut config = AllocatorConfig::default();
    config.preemption.enabled = args.preemption;
    let mut alloc = Allocator::new(config).map_err(|e| e.to_string())?;
    for (n, _) in nodes() {
        alloc
            .apply(Event::NodeUpserted(n))
            .map_err(|e| e.to_string())?;
    }
    for q in queues() {
        alloc
            .apply(Event::QueueUpserted(q))
            .map_err(|e| e.to_string())?;
    }
    let total_gpus = total_gpus() as f64;
    let mut sim = Sim::new(stream.len());
    let mut pending: usize = 0;
    for step in 0..args.cycles {
        if started_wall.elapsed() > args.max_wall {
            break;
        }
        let now = step as u64 * args.step_secs;
        for idx in sim.due(now) {
            alloc
                .apply(Event::JobFinished {
                    uid: JobUid::new(format!("j{idx}")),
                })
                .map_err(|e| e.to_string())?;
        }
        while pending < BACKLOG && sim.next_job < stream.len() {
            let idx = sim.next_job;
            sim.submitted_at[idx] = now;
            alloc
                .apply(Event::JobSubmitted(job_spec(idx, &stream[idx], now)))
                .map_err(|e| e.to_string())?;
            sim.next_job += 1;
            pending += 1;
        }
        let t0 = Instant::now();
        let outcome = alloc.cycle(Timestamp(now));
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        sim.cycle_ms.push(ms);
        if step == 0 {
            sim.first_cycle = (ms, outcome.admissions.len() as u64);
        }
        for e in &outcome.evictions {
            if let Some(idx) = index_of(&e.uid) {
                // The running instance is gone; its pending finish is stale.
                if let Some(g) = sim.generation.get_mut(idx) {
                    *g += 1;
                }
                sim.stopped(idx);
                pending += 1;
            }
        }
        sim.preemptions += outcome.preemptions.len() as u64;
        sim.preemption_attempts += u64::from(outcome.stats.preemption_attempts);
        sim.reservations += u64::from(outcome.stats.reservations);
        for p in &outcome.preemptions {
            for v in &p.victims {
                let slot = match v.rule {
                    gpu_allocator_core::PreemptionRule::LowerPriority => 0,
                    gpu_allocator_core::PreemptionRule::ReclaimQuota => 1,
                    gpu_allocator_core::PreemptionRule::FairShare => 2,
                };
                sim.victims_by_rule[slot] += 1;
                sim.victim_gpus += v.units;
            }
        }
        for a in &outcome.admissions {
            if let Some(idx) = index_of(&a.uid) {
                sim.started(idx, &stream[idx], now);
                pending = pending.saturating_sub(1);
            }
        }
        if now >= args.warmup_secs {
            sim.alloc_samples.push(sim.allocated / total_gpus);
        }
    }
    Ok(sim.report(
        "trainyard (best-fit+DRF+backfill)",
        args,
        started_wall.elapsed(),
        stream,
    ))
}

/// FIFO baselines: jobs in submission order, all-or-nothing per gang.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// Each worker on the lowest-numbered node with room; the first job that
    /// does not fit blocks everything behind it (Kueue StrictFIFO-like).
    StrictFirstFit,
    /// First fit, but blocked jobs are skipped (greedy, no reservations).
    SkipBlockedFirstFit,
    /// Strict FIFO, each worker on the node with the most free GPUs, as the
    /// default kube-scheduler scoring (LeastAllocated) spreads pods.
    StrictSpread,
}

impl Baseline {
    fn name(self) -> &'static str {
        match self {
            Baseline::StrictFirstFit => "FIFO first-fit, strict (baseline)",
            Baseline::SkipBlockedFirstFit => "FIFO first-fit, skip blocked",
            Baseline::StrictSpread => "FIFO strict, spread placement",
        }
    }
}

/// Free units per node and, per pool kind (whole GPUs, MIG slices), how
/// many nodes have each free count, for an O(capacity) "can this gang fit at
/// all" test.
struct FifoCluster {
    free: Vec<u32>,
    mig: Vec<bool>,
    by_free: [Vec<usize>; 2],
}

impl FifoCluster {
    fn new() -> Self {
        let mut c = FifoCluster {
            free: Vec::new(),
            mig: Vec::new(),
            by_free: [Vec::new(), Vec::new()],
        };
        for (_, pool) in nodes() {
            let units = if pool.mig {
                pool.gpus * SLICES_PER_GPU
            } else {
                pool.gpus
            };
            c.free.push(units);
            c.mig.push(pool.mig);
            let counts = &mut c.by_free[usize::from(pool.mig)];
            if counts.len() <= units as usize {
                counts.resize(units as usize + 1, 0);
            }
            counts[units as usize] += 1;
        }
        c
    }

    fn adjust(&mut self, node: usize, units: u32, take: bool) {
        let counts = &mut self.by_free[usize::from(self.mig[node])];
        counts[self.free[node] as usize] -= 1;
        if take {
            self.free[node] -= units;
        } else {
            self.free[node] += units;
        }
        counts[self.free[node] as usize] += 1;
    }

    /// Workers of `g` units the free counts could host.
    fn slots(&self, mig: bool, g: u32) -> u64 {
        let counts = &self.by_free[usize::from(mig)];
        (g as usize..counts.len())
            .map(|f| counts[f] as u64 * u64::from(f as u32 / g))
            .sum()
    }

    /// All workers on the emptiest nodes (spread) or the lowest-numbered
    /// nodes with room (first fit); `None` when the gang does not fit.
    fn place(&self, job: &SimJob, spread: bool) -> Option<Vec<(usize, u32)>> {
        let g = job.units;
        if self.slots(job.mig, g) < u64::from(job.workers) {
            return None;
        }
        let mut placement: Vec<(usize, u32)> = Vec::new();
        if spread {
            // Enough slots exist, so placing workers one by one on the
            // emptiest node always completes the gang.
            for _ in 0..job.workers {
                let mut best: Option<(usize, u32)> = None;
                for (node, f) in self.free.iter().enumerate() {
                    if self.mig[node] != job.mig {
                        continue;
                    }
                    let taken: u32 = placement
                        .iter()
                        .filter(|(n, _)| *n == node)
                        .map(|(_, u)| *u)
                        .sum();
                    let left = f - taken;
                    if left >= g && best.is_none_or(|(_, b)| left > b) {
                        best = Some((node, left));
                    }
                }
                let (node, _) = best?;
                match placement.iter_mut().find(|(n, _)| *n == node) {
                    Some(entry) => entry.1 += g,
                    None => placement.push((node, g)),
                }
            }
        } else {
            let mut left = job.workers;
            for (node, f) in self.free.iter().enumerate() {
                if left == 0 {
                    break;
                }
                if self.mig[node] != job.mig {
                    continue;
                }
                let take = (f / g).min(left);
                if take > 0 {
                    placement.push((node, take * g));
                    left -= take;
                }
            }
        }
        Some(placement)
    }
}

fn run_fifo(stream: &[SimJob], args: &Args, baseline: Baseline) -> Report {
    let strict = baseline != Baseline::SkipBlockedFirstFit;
    let spread = baseline == Baseline::StrictSpread;
    let started_wall = Instant::now();
    let total_gpus = total_gpus() as f64;
    let mut cluster = FifoCluster::new();
    let mut placed: Vec<Vec<(usize, u32)>> = vec![Vec::new(); stream.len()];
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut sim = Sim::new(stream.len());
    for step in 0..args.cycles {
        if started_wall.elapsed() > args.max_wall {
            break;
        }
        let now = step as u64 * args.step_secs;
        for idx in sim.due(now) {
            for (node, units) in std::mem::take(&mut placed[idx]) {
                cluster.adjust(node, units, false);
            }
        }
        while queue.len() < BACKLOG && sim.next_job < stream.len() {
            sim.submitted_at[sim.next_job] = now;
            queue.push_back(sim.next_job);
            sim.next_job += 1;
        }
        let t0 = Instant::now();
        let mut admitted = 0u64;
        let mut kept: VecDeque<usize> = VecDeque::with_capacity(queue.len());
        while let Some(idx) = queue.pop_front() {
            let job = &stream[idx];
            let Some(placement) = cluster.place(job, spread) else {
                kept.push_back(idx);
                if strict {
                    break;
                }
                continue;
            };
            for (node, units) in &placement {
                cluster.adjust(*node, *units, true);
            }
            placed[idx] = placement;
            admitted += 1;
            sim.started(idx, job, now);
        }
        kept.extend(queue.drain(..));
        queue = kept;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        sim.cycle_ms.push(ms);
        if step == 0 {
            sim.first_cycle = (ms, admitted);
        }
        if now >= args.warmup_secs {
            sim.alloc_samples.push(sim.allocated / total_gpus);
        }
    }
    sim.report(baseline.name(), args, started_wall.elapsed(), stream)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("admission: {e}");
            std::process::exit(2);
        }
    };
    // Enough jobs for the whole run: backlog plus generous turnover.
    let stream = generate_stream(args.seed, BACKLOG + args.cycles * 200);
    let ours = match run_allocator(&stream, &args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("admission: allocator run failed: {e}");
            std::process::exit(1);
        }
    };
    let strict = run_fifo(&stream, &args, Baseline::StrictFirstFit);
    let greedy = run_fifo(&stream, &args, Baseline::SkipBlockedFirstFit);
    let spread = run_fifo(&stream, &args, Baseline::StrictSpread);

    println!(
        "steady state: admits/s = admissions / total cycle time; alloc % = allocated GPU-equivalents / {} GPUs \
         averaged over cycles after warm-up; big gangs = jobs of >= 64 GPUs",
        total_gpus()
    );
    println!(
        "admission benchmark: {} nodes ({}), {QUEUES} queues, backlog {BACKLOG}, \
         step {} s, seed {}, steady state after {} s",
        POOLS.iter().map(|p| p.count).sum::<usize>(),
        POOLS
            .iter()
            .map(|p| format!(
                "{} x {} {}{}",
                p.count,
                p.gpus,
                p.product,
                if p.mig { " MIG" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(", "),
        args.step_secs,
        args.seed,
        args.warmup_secs
    );
    println!(
        "{:<36} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>17} {:>14}",
        "policy",
        "cycles",
        "p50 ms",
        "p99 ms",
        "max ms",
        "admits/s",
        "alloc %",
        "preempt",
        ">=64-GPU started",
        "their wait p50"
    );
    for r in [&ours, &strict, &greedy, &spread] {
        println!(
            "{:<36} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>10.0} {:>8.1} {:>8} {:>8}/{:<8} {:>9.0} min",
            r.policy,
            r.cycles,
            r.cycle_p50_ms,
            r.cycle_p99_ms,
            r.cycle_max_ms,
            r.admissions_per_sec,
            r.steady_allocation_ratio * 100.0,
            r.preemptions,
            r.big_gangs_started,
            r.big_gangs_submitted,
            r.big_gang_wait_p50_min,
        );
    }
    println!(
        "first cycle (empty cluster, {BACKLOG} pending): trainyard {:.1} ms for {} admissions ({:.0}/s); strict FIFO {:.1} ms for {}",
        ours.first_cycle_ms,
        ours.first_cycle_admissions,
        ours.first_cycle_admissions_per_sec,
        strict.first_cycle_ms,
        strict.first_cycle_admissions
    );
    for (label, base) in [
        ("strict FIFO first-fit (the baseline)", &strict),
        ("FIFO first-fit skipping blocked jobs", &greedy),
        ("strict FIFO with spread placement", &spread),
    ] {
        println!(
            "allocation ratio vs {label}: {:+.1} points",
            (ours.steady_allocation_ratio - base.steady_allocation_ratio) * 100.0
        );
    }
    #[derive(Serialize)]
    struct Line<'a> {
        benchmark: &'static str,
        seed: u64,
        nodes: usize,
        gpus: u64,
        queues: usize,
        backlog: usize,
        step_secs: u64,
        trainyard: &'a Report,
        fifo_strict: &'a Report,
        fifo_skip_blocked: &'a Report,
        fifo_strict_spread: &'a Report,
        allocation_gain_points: f64,
    }
    let line = Line {
        benchmark: "admission",
        seed: args.seed,
        nodes: POOLS.iter().map(|p| p.count).sum(),
        gpus: total_gpus(),
        queues: QUEUES,
        backlog: BACKLOG,
        step_secs: args.step_secs,
        trainyard: &ours,
        fifo_strict: &strict,
        fifo_skip_blocked: &greedy,
        fifo_strict_spread: &spread,
        allocation_gain_points: (ours.steady_allocation_ratio - strict.steady_allocation_ratio)
            * 100.0,
    };
    match serde_json::to_string(&line) {
        Ok(json) => println!("{json}"),
        Err(e) => eprintln!("admission: cannot encode JSON: {e}"),
    }
}
