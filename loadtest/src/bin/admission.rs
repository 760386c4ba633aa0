//! Admission benchmark: the gpu-allocator core against FIFO baselines on the
//! same seeded job stream, in one process.
//!
//! Cluster (2,000 nodes, 15,200 GPUs), three node pools as a cloud cluster
//! has them, nodes named and indexed pool by pool:
//! - `a100-mig`: 20 nodes x 8 A100 partitioned into 7 `1g.10gb` MIG slices
//!   each (56 slices a node, 160 GPUs);
//! - `h100-4g`: 200 nodes x 4 H100 (800 GPUs);
//! - `h100-8g`: 1,780 nodes x 8 H100 (14,240 GPUs);
//!
//! in 3 zones, NVLink racks of 16 nodes. 30 TrainingQueues in 3 cohorts; each
//! has an equal share of the H100 GPUs and of the MIG slices as nominal quota
//! (quotas add up to the cluster), borrowing unlimited inside the cohort.
//!
//! Four job mixes (`--mix`, all by default): `trace` (`TRACE_MIX`), shaped
//! like published cluster traces: MIG slices for notebooks, 1/2/4/8-GPU
//! single-worker jobs, and gangs of 4-GPU and 8-GPU workers from 2 to 96
//! workers (the API allows 100); `fragmenting` (`FRAGMENTING_MIX`), where
//! jobs smaller than a node (1 to 6 GPUs, some of odd sizes) run for hours
//! and hold about half of the GPU-hours beside gangs of 8-GPU workers that
//! need whole nodes; and `gang-heavy` (`GANG_HEAVY_MIX`, called `fragmenting`
//! until 2026-11-23), 1, 2 and 4-GPU jobs beside the same gang shapes, the
//! gangs holding 82 % of the GPU-hours; and `rack-bound` (`RACK_BOUND_MIX`),
//! `fragmenting`'s stream whose gangs of 2 to 16 workers must stay in one
//! rack (NVLink domain). Heavy-tailed runtimes (log-uniform, so jobs end at
//! all times and leave holes), runtime estimates (1.0-1.5x the truth) on 70%
//! of jobs, 5% high-priority jobs, queues picked uniformly.
//!
//! Closed loop: before every cycle the backlog is topped up to 10,000
//! pending jobs from one pre-generated stream (so every policy sees the same
//! jobs in the same order); jobs finish after their actual runtime in
//! simulated time, one cycle per simulated step. Bounded by `--cycles` and
//! `--max-wall-secs`. Prints figures only; nothing is asserted on timing.
//! The allocation ratio counts GPU-equivalents (a MIG slice is 1/7 GPU) held
//! by running jobs, the same bookkeeping for every policy; an evicted job
//! starts over when admitted again. The run covers 48 simulated hours and
//! samples after 12: jobs run up to 12 h and the cluster starts empty, so a
//! shorter run measures the fill, not the steady state, and hides gangs that
//! wait for days.
//!
//! Baselines, in submission order, each job limited to the pool kind it asks
//! for. Placement-aware and all-or-nothing per gang: strict FIFO with
//! first-fit placement (the first job that does not fit blocks the rest:
//! Kueue's StrictFIFO on one ClusterQueue), FIFO first-fit skipping blocked
//! jobs, and strict FIFO with spread placement; a gang kept in one rack goes
//! to the first rack that holds it. Kueue-like (quota-only
//! admission, BestEffortFIFO, then every pod bound on its own, first fit or
//! spread as kube-scheduler's default LeastAllocated scoring does, gangs
//! partly bound after `waitForPodsReady` evicted and requeued; a gang kept in
//! one rack asks it by required pod affinity, so its first pod binds
//! anywhere and the others in that pod's rack).
//!
//! Usage: `admission [--mix trace,fragmenting,gang-heavy,rack-bound] [--seed N] [--cycles N]
//! [--step-secs N] [--max-wall-secs N] [--warmup-secs N] [--preemption 0|1]
//! [--within-queue Never|LowerPriority] [--reclaim-within-cohort Never|LowerPriority|Any]
//! [--borrower-hold-after SECONDS] [--digest] [--trainyard-only] [--cpu-memory [--cpu-heavy-every N]]`
//!
//! `--digest` adds `decisions_digest` to trainyard's JSON: a hash of every
//! cycle's admissions, preemptions, evictions and pending explanations
//! (position, queue length, effective priority, reason). A change meant to
//! make the cycle faster, not different, shows it by an equal digest.
//!
//! `--cpu-memory` has nodes report CPU and memory (and DaemonSets request
//! some) and workers request them in proportion to their GPUs, never more
//! than fits beside them: trainyard's decisions stay those of the run
//! without, at the cost of fitting them. `--cpu-heavy-every N` makes every
//! Nth job ask for twice as much, so that CPU and memory decide where those
//! fit. Every baseline places a worker only where its CPU and memory fit
//! too, as the scheduler would.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::time::{Duration, Instant};

use gpu_allocator_core::{
    Allocator, AllocatorConfig, CpuMemory, Event, FlavorQuota, GpuSliceRequest, JobSpec, JobUid,
    NodeInfo, QueueSpec, ResourceQuota, Timestamp, TopologyRequirement, names,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use trainyard_api::{ReclaimWithinCohort, WithinQueuePreemption};
use trainyard_gpu_allocator::mapping;
use trainyard_stats::SortedSamples;

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
/// Kueue's `waitForPodsReady.timeout` default.
const WAIT_FOR_PODS_READY_SECS: u64 = 300;
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
    /// All workers in one rack (NVLink domain): `topology: SameRack`.
    same_rack: bool,
}

const fn shape(workers: u32, units: u32, mig: bool, weight: u32, lo: u64, hi: u64) -> Shape {
    Shape {
        workers,
        units,
        mig,
        weight,
        runtime: (lo, hi),
        same_rack: false,
    }
}

/// The job mix. Most jobs are small and short, most GPU-hours go to a few
/// large gangs, as in published cluster traces; runtimes are log-uniform, so
/// jobs end at all times and leave holes.
const TRACE_MIX: [Shape; 15] = [
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

/// A mix that fragments nodes, the shape of a shared research cluster:
/// notebooks, single-node fine-tunes and evaluations that run for hours
/// beside multi-node pre-training in gangs of 8-GPU workers that need whole
/// nodes. Workers smaller than a node are sized by the model's memory, not
/// by the node, so besides 1, 2 and 4 GPUs some ask for 3 (a 1-GPU hole on a
/// 4-GPU node, 2 on an 8-GPU node) or 6 (a 2-GPU hole). A node is wholly free
/// only when its longest small job ends.
///
/// GPU-hours of demand per 1,000 jobs are weight x GPUs x mean runtime, the
/// mean of a log-uniform runtime on `[lo, hi]` being `(hi - lo) / ln(hi / lo)`:
/// 30 min-12 h gives 3.62 h, 30 min-8 h 2.71 h, 30 min-6 h 2.21 h, 1-6 h
/// 2.79 h. Workers smaller than a node: MIG 50 x 1/7 x 2.71 = 19; 1 GPU
/// 380 x 3.62 = 1,375; 2 GPUs 200 x 2 x 3.62 = 1,447; 3 GPUs 50 x 3 x 3.62 =
/// 543; 4 GPUs 150 x 4 x 3.62 = 2,171; 6 GPUs 80 x 6 x 3.62 = 1,737; 2 x 4
/// GPUs 40 x 8 x 2.21 = 708; together 8,000 of 15,858 (50.4 %). Gangs of
/// 8-GPU workers (1-6 h) of 2, 4, 8, 16, 32 workers, weights 20, 12, 9, 6, 3:
/// 20 x 16 x 2.79 = 893, 1,072, 1,607, 2,143, 2,143; together 7,858 (49.6 %),
/// 55 % of it in gangs of 16 and 32 workers.
const FRAGMENTING_MIX: [Shape; 12] = [
    shape(1, 1, true, 50, 1_800, 28_800),
    shape(1, 1, false, 380, 1_800, 43_200),
    shape(1, 2, false, 200, 1_800, 43_200),
    shape(1, 3, false, 50, 1_800, 43_200),
    shape(1, 4, false, 150, 1_800, 43_200),
    shape(1, 6, false, 80, 1_800, 43_200),
    shape(2, 4, false, 40, 1_800, 21_600),
    shape(2, 8, false, 20, 3_600, 21_600),
    shape(4, 8, false, 12, 3_600, 21_600),
    shape(8, 8, false, 9, 3_600, 21_600),
    shape(16, 8, false, 6, 3_600, 21_600),
    shape(32, 8, false, 3, 3_600, 21_600),
];

/// `FRAGMENTING_MIX` on a cluster whose multi-node training needs the
/// NVLink fabric of one rack (as on rack-scale NVLink systems): every gang of
/// 8-GPU workers of 2 to 16 workers must stay in one rack of 16 nodes, and
/// gangs of 32 (two racks) are left unconstrained. Same weights and
/// runtimes, so the same GPU-hours of demand. A rack takes such a gang only
/// when enough of its own nodes are free at once, so small jobs that outlive
/// their neighbours keep whole racks from it.
const RACK_BOUND_MIX: [Shape; 12] = gangs_in_one_rack(FRAGMENTING_MIX);

/// `mix` with every gang of 2 to 16 workers of 8 GPUs kept in one rack.
const fn gangs_in_one_rack<const N: usize>(mut mix: [Shape; N]) -> [Shape; N] {
    let mut i = 0;
    while i < N {
        let s = &mut mix[i];
        s.same_rack = s.units == 8 && s.workers >= 2 && s.workers <= RACK_SIZE as u32;
        i += 1;
    }
    mix
}

/// The mix called `fragmenting` until 2026-11-23, kept so its figures stay
/// comparable. Jobs smaller than a node are 84 % of the jobs and run for
/// hours, but by GPU-hours of demand (per 1,000 jobs, computed as for
/// `FRAGMENTING_MIX`) they are 18 %: MIG 19, 1 GPU 400 x 3.62 = 1,447,
/// 2 GPUs 1,447, 4 GPUs 150 x 4 x 3.62 = 2,171, 2 x 4 GPUs 708; together
/// 5,792 of 31,689. Gangs of 8-GPU workers of 2, 4, 8, 16, 32 workers,
/// weights 60, 40, 30, 20, 10, hold 82 %: 2,679, 3,572, 5,358, 7,144, 7,144,
/// together 25,897. They vacate whole nodes when they end, so strict FIFO
/// seldom waits long for room and little of the cluster idles.
const GANG_HEAVY_MIX: [Shape; 10] = [
    shape(1, 1, true, 50, 1_800, 28_800),
    shape(1, 1, false, 400, 1_800, 43_200),
    shape(1, 2, false, 200, 1_800, 43_200),
    shape(1, 4, false, 150, 1_800, 43_200),
    shape(2, 4, false, 40, 1_800, 21_600),
    shape(2, 8, false, 60, 3_600, 21_600),
    shape(4, 8, false, 40, 3_600, 21_600),
    shape(8, 8, false, 30, 3_600, 21_600),
    shape(16, 8, false, 20, 3_600, 21_600),
    shape(32, 8, false, 10, 3_600, 21_600),
];

fn total_gpus() -> u64 {
    POOLS
        .iter()
        .map(|p| p.count as u64 * u64::from(p.gpus))
        .sum()
}

/// Parses one of `values` by its name in YAML.
fn wire_value<T>(values: &'static [T]) -> impl Fn(&str) -> Result<T, String> + Clone
where
    T: Copy + std::fmt::Display,
{
    move |name| {
        values
            .iter()
            .copied()
            .find(|v| v.to_string() == name)
            .ok_or_else(|| {
                let names: Vec<String> = values.iter().map(ToString::to_string).collect();
                format!("expected one of {}", names.join(", "))
            })
    }
}

/// Which job stream to replay.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MixName {
    /// `TRACE_MIX`: shaped like published cluster traces.
    Trace,
    /// `FRAGMENTING_MIX`: long small jobs, half of the GPU-hours, pin nodes
    /// beside gangs of 8-GPU workers.
    Fragmenting,
    /// `GANG_HEAVY_MIX`: the former `fragmenting` mix, 82 % of its GPU-hours
    /// in gangs of 8-GPU workers.
    GangHeavy,
    /// `RACK_BOUND_MIX`: `fragmenting` with its gangs of up to 16 workers
    /// kept in one rack.
    RackBound,
}

impl MixName {
    fn shapes(self) -> &'static [Shape] {
        match self {
            MixName::Trace => &TRACE_MIX,
            MixName::Fragmenting => &FRAGMENTING_MIX,
            MixName::GangHeavy => &GANG_HEAVY_MIX,
            MixName::RackBound => &RACK_BOUND_MIX,
        }
    }

    fn label(self) -> &'static str {
        match self {
            MixName::Trace => "trace",
            MixName::Fragmenting => "fragmenting",
            MixName::GangHeavy => "gang-heavy",
            MixName::RackBound => "rack-bound",
        }
    }
}

#[derive(clap::Parser)]
#[command(about = "gpu-allocator admission cycles against FIFO baselines on one seeded job stream")]
struct Args {
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Cycles, one per simulated step (48 h of 60 s steps).
    #[arg(long, default_value_t = 2_880)]
    cycles: usize,
    /// Simulated seconds between cycles.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    step_secs: u64,
    /// Wall-clock bound of each policy's run.
    #[arg(long, value_name = "SECONDS", default_value_t = 240)]
    max_wall_secs: u64,
    /// Simulated seconds before the allocation ratio is sampled.
    #[arg(long, default_value_t = 12 * 3600)]
    warmup_secs: u64,
    /// Allocator preemption on (1) or off (0).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    preemption: u8,
    /// Every queue's `preemption.withinQueue`, as in a TrainingQueue.
    #[arg(long, default_value = "LowerPriority", value_parser = wire_value(WithinQueuePreemption::ALL))]
    within_queue: WithinQueuePreemption,
    /// Every queue's `preemption.reclaimWithinCohort`, as in a TrainingQueue
    /// (`Any` also preempts for fair share).
    #[arg(long, default_value = "Any", value_parser = wire_value(ReclaimWithinCohort::ALL))]
    reclaim_within_cohort: ReclaimWithinCohort,
    /// The allocator's `backfill.borrowerHoldAfterSecs` (default: the allocator's).
    #[arg(long, value_name = "SECONDS")]
    borrower_hold_after: Option<u64>,
    /// Job mixes to run, each against every policy.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [MixName::Trace, MixName::Fragmenting, MixName::GangHeavy, MixName::RackBound])]
    mix: Vec<MixName>,
    /// Hash every decision of trainyard's run (slower; outside the timed cycle).
    #[arg(long)]
    digest: bool,
    /// Run trainyard alone, without the baselines: its figures, digest and
    /// instruction counts are the same, in a fifth of the time.
    #[arg(long)]
    trainyard_only: bool,
    /// Nodes report CPU and memory (DaemonSets requesting some) and workers
    /// request them in proportion to their GPUs, never more than a node has
    /// beside its GPUs: the cost of fitting them, on the same decisions.
    #[arg(long)]
    cpu_memory: bool,
    /// With `--cpu-memory`: every Nth job asks for twice the CPU and memory
    /// a GPU (at most what a node has beside its DaemonSets), so CPU and
    /// memory, not GPUs, decide where such jobs fit. 0: none.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "cpu_memory")]
    cpu_heavy_every: usize,
}

/// One job of the stream; `duration` is the truth the allocator never sees.
#[derive(Clone)]
struct SimJob {
    queue: usize,
    workers: u32,
    units: u32,
    mig: bool,
    same_rack: bool,
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

    /// More GPUs than its queue's nominal quota: it can only run by borrowing.
    fn beyond_nominal(&self) -> bool {
        !self.mig
            && u64::from(self.workers) * u64::from(self.units)
                > share(pool_units(false), self.queue)
    }
}

fn generate_stream(shapes: &[Shape], seed: u64, count: usize) -> Vec<SimJob> {
    let mut rng = StdRng::seed_from_u64(seed);
    let total_weight: u32 = shapes.iter().map(|s| s.weight).sum();
    (0..count)
        .map(|_| {
            let mut pick = rng.random_range(0..total_weight);
            let mut shape = shapes[0];
            for &s in shapes {
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
                same_rack: shape.same_rack,
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

const GIB: u64 = 1 << 30;

/// With `--cpu-memory`: what a node has, what its DaemonSets request, and
/// what a worker requests per GPU and per MIG slice (11 of 96 cores and
/// 120 GiB of 1 TiB a GPU: an 8-GPU worker fits beside the DaemonSets).
const NODE_CPU_MEMORY: CpuMemory = CpuMemory {
    cpu_millis: 96_000,
    memory_bytes: 1024 * GIB,
};
const DAEMONSETS_CPU_MEMORY: CpuMemory = CpuMemory {
    cpu_millis: 2_000,
    memory_bytes: 8 * GIB,
};
const PER_GPU_CPU_MEMORY: CpuMemory = CpuMemory {
    cpu_millis: 11_000,
    memory_bytes: 120 * GIB,
};
const PER_SLICE_CPU_MEMORY: CpuMemory = CpuMemory {
    cpu_millis: 1_000,
    memory_bytes: 16 * GIB,
};

/// Every node with its pool, in index order.
fn nodes(cpu_memory: bool) -> Vec<(NodeInfo, &'static NodePool)> {
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
            if cpu_memory {
                n.cpu_memory = Some(NODE_CPU_MEMORY);
                n.cpu_memory_used_by_other_pods = DAEMONSETS_CPU_MEMORY;
            }
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

/// The rack `nodes` gave a node.
fn rack_of(node: &NodeInfo) -> usize {
    node.labels
        .get(names::NVLINK_CLIQUE_LABEL)
        .and_then(|rack| rack.strip_prefix("rack-")?.parse().ok())
        .unwrap_or(0)
}

/// `total` split into `QUEUES` nominal quotas that add up exactly.
fn share(total: u64, queue: usize) -> u64 {
    total / QUEUES as u64 + u64::from((queue as u64) < total % QUEUES as u64)
}

/// Whole GPUs (`mig` false) or MIG slices (`mig` true) in the cluster.
fn pool_units(mig: bool) -> u64 {
    POOLS
        .iter()
        .filter(|p| p.mig == mig)
        .map(|p| p.count as u64 * u64::from(if mig { p.gpus * SLICES_PER_GPU } else { p.gpus }))
        .sum()
}

/// The queues, each with the preemption rights the service gives a
/// TrainingQueue with these settings.
fn queues(within_queue: WithinQueuePreemption, reclaim: ReclaimWithinCohort) -> Vec<QueueSpec> {
    let gpus = pool_units(false);
    let slices = pool_units(true);
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
            preemption: mapping::queue_preemption(within_queue, reclaim),
            ..QueueSpec::default()
        })
        .collect()
}

/// CPU and memory a node offers its workers: what it has beside its
/// DaemonSets.
fn node_room() -> CpuMemory {
    NODE_CPU_MEMORY.minus(DAEMONSETS_CPU_MEMORY)
}

/// CPU and memory each worker of the `index`th job requests (none without
/// `--cpu-memory`), for the allocator and the baselines alike.
fn cpu_memory_per_worker(index: usize, job: &SimJob, args: &Args) -> CpuMemory {
    if !args.cpu_memory {
        return CpuMemory::default();
    }
    let per_unit = if job.mig {
        PER_SLICE_CPU_MEMORY
    } else {
        PER_GPU_CPU_MEMORY
    };
    let heavy = args.cpu_heavy_every > 0 && index.is_multiple_of(args.cpu_heavy_every);
    if heavy {
        let room = node_room();
        let doubled = per_unit.times(2 * job.units);
        CpuMemory {
            cpu_millis: doubled.cpu_millis.min(room.cpu_millis),
            memory_bytes: doubled.memory_bytes.min(room.memory_bytes),
        }
    } else {
        per_unit.times(job.units)
    }
}

fn job_spec(index: usize, job: &SimJob, now: u64, args: &Args) -> JobSpec {
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
        cpu_memory_per_worker: cpu_memory_per_worker(index, job, args),
        topology: if job.same_rack {
            TopologyRequirement::SameRack
        } else {
            TopologyRequirement::Preferred
        },
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
    /// The cycles' CPU time, percentiles and admissions per CPU-second:
    /// what the cycle costs whatever else the machine runs.
    cycle_cpu_p50_ms: f64,
    cycle_cpu_p99_ms: f64,
    admissions_per_cpu_sec: f64,
    steady_allocation_ratio: f64,
    /// Nominal quota held by borrowers while its queue waits, as a fraction
    /// of the whole GPUs, averaged like the allocation (see `quota_owed`).
    steady_quota_owed_ratio: f64,
    /// GPUs bound to pods of gangs that cannot run yet (Kueue-like only).
    bound_idle_ratio: f64,
    /// Preemptions; for the Kueue-like baseline, gangs evicted by waitForPodsReady.
    preemptions: u64,
    victims_lower_priority: u64,
    victims_reclaim: u64,
    victims_fair_share: u64,
    victim_gpus: u64,
    /// GPU-hours evicted jobs had run before their eviction.
    evicted_gpu_hours: f64,
    /// Distinct jobs evicted, those evicted more than once, and the most
    /// evictions of one job: whether preemption keeps hitting the same jobs.
    jobs_evicted: u64,
    jobs_evicted_again: u64,
    most_evictions_of_one_job: u32,
    preemption_attempts: u64,
    reservations_made: u64,
    big_gangs_submitted: u64,
    big_gangs_started: u64,
    big_gangs_waiting_at_end: u64,
    oldest_waiting_big_gang_min: f64,
    big_gang_wait_p50_min: f64,
    big_gang_wait_max_min: f64,
    /// Jobs with more GPUs than their queue's nominal quota.
    beyond_nominal_submitted: u64,
    beyond_nominal_started: u64,
    simulated_hours: f64,
    wall_secs: f64,
    /// With `--digest`: every decision of the run, hashed (trainyard only).
    #[serde(skip_serializing_if = "Option::is_none")]
    decisions_digest: Option<String>,
}

/// Times one cycle on the wall clock and on the thread's CPU clock. On a
/// shared machine the wall clock also counts the time other processes had
/// the core; the CPU clock counts only the cycle's own.
struct CycleTimer {
    wall: Instant,
    cpu: Duration,
}

impl CycleTimer {
    fn start() -> Self {
        CycleTimer {
            wall: Instant::now(),
            cpu: thread_cpu(),
        }
    }

    /// Milliseconds since `start`: (wall clock, CPU time).
    fn stop(self) -> (f64, f64) {
        let cpu = thread_cpu().saturating_sub(self.cpu);
        (
            self.wall.elapsed().as_secs_f64() * 1000.0,
            cpu.as_secs_f64() * 1000.0,
        )
    }
}

/// CPU time this thread has run.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

fn mean(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().sum::<f64>() / samples.len() as f64
}

/// Shared bookkeeping of one simulated run.
struct Sim {
    submitted_at: Vec<u64>,
    started: Vec<bool>,
    generation: Vec<u32>,
    /// GPU-equivalents each job holds while it runs (0 otherwise).
    held: Vec<f64>,
    /// When each job's running instance started.
    running_since: Vec<u64>,
    /// GPU-hours evicted jobs had run, lost as they start over.
    evicted_gpu_hours: f64,
    /// Evictions per job.
    evictions: Vec<u32>,
    allocated: f64,
    /// Each job's queue when it holds whole GPUs (not MIG slices).
    gpu_queue: Vec<Option<usize>>,
    /// Whole GPUs each queue's running jobs hold.
    queue_gpus: Vec<f64>,
    finishes: BinaryHeap<Reverse<(u64, usize, u32)>>,
    next_job: usize,
    cycle_ms: Vec<f64>,
    /// Each cycle's CPU time (see `CycleTimer`).
    cycle_cpu_ms: Vec<f64>,
    admissions: u64,
    alloc_samples: Vec<f64>,
    /// Per sample, the fraction of the whole GPUs that `quota_owed` gives.
    owed_samples: Vec<f64>,
    big_waits_min: Vec<f64>,
    beyond_nominal_started: u64,
    preemptions: u64,
    /// Victims by rule: lower priority, reclaim, fair share.
    victims_by_rule: [u64; 3],
    victim_gpus: u64,
    preemption_attempts: u64,
    reservations: u64,
    first_cycle: (f64, u64),
}

impl Sim {
    fn new(stream: &[SimJob]) -> Self {
        let stream_len = stream.len();
        Sim {
            submitted_at: vec![0; stream_len],
            started: vec![false; stream_len],
            generation: vec![0; stream_len],
            held: vec![0.0; stream_len],
            running_since: vec![0; stream_len],
            evicted_gpu_hours: 0.0,
            evictions: vec![0; stream_len],
            allocated: 0.0,
            gpu_queue: stream.iter().map(|j| (!j.mig).then_some(j.queue)).collect(),
            queue_gpus: vec![0.0; QUEUES],
            finishes: BinaryHeap::new(),
            next_job: 0,
            cycle_ms: Vec::new(),
            cycle_cpu_ms: Vec::new(),
            admissions: 0,
            alloc_samples: Vec::new(),
            owed_samples: Vec::new(),
            big_waits_min: Vec::new(),
            beyond_nominal_started: 0,
            preemptions: 0,
            victims_by_rule: [0; 3],
            victim_gpus: 0,
            preemption_attempts: 0,
            reservations: 0,
            first_cycle: (0.0, 0),
        }
    }

    /// Records cycle `step`, timed by `timer`, which admitted `admitted` jobs.
    fn cycle_timed(&mut self, step: usize, timer: CycleTimer, admitted: u64) {
        let (wall_ms, cpu_ms) = timer.stop();
        self.cycle_ms.push(wall_ms);
        self.cycle_cpu_ms.push(cpu_ms);
        if step == 0 {
            self.first_cycle = (wall_ms, admitted);
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
            if let Some(Some(q)) = self.gpu_queue.get(idx)
                && let Some(held) = self.queue_gpus.get_mut(*q)
            {
                *held += *h;
            }
        }
        if let Some(since) = self.running_since.get_mut(idx) {
            *since = now;
        }
        if job.is_big() && !self.started[idx] {
            self.big_waits_min
                .push((now - self.submitted_at[idx]) as f64 / 60.0);
        }
        if job.beyond_nominal() && !self.started[idx] {
            self.beyond_nominal_started += 1;
        }
        self.started[idx] = true;
    }

    /// The running instance of `idx` was evicted: the work it did is lost.
    fn evicted(&mut self, idx: usize, now: u64) {
        if let (Some(h), Some(since)) = (self.held.get(idx), self.running_since.get(idx)) {
            self.evicted_gpu_hours += h * now.saturating_sub(*since) as f64 / 3600.0;
        }
        if let Some(n) = self.evictions.get_mut(idx) {
            *n += 1;
        }
        self.stopped(idx);
    }

    /// The running instance of `idx` stopped (finished or evicted).
    fn stopped(&mut self, idx: usize) {
        if let Some(h) = self.held.get_mut(idx) {
            self.allocated -= *h;
            if let Some(Some(q)) = self.gpu_queue.get(idx)
                && let Some(held) = self.queue_gpus.get_mut(*q)
            {
                *held -= *h;
            }
            *h = 0.0;
        }
    }

    /// Whole GPUs of nominal quota that other queues of the owner's cohort
    /// hold beyond their own nominal quota: what reclaiming would give back.
    /// Every queue always has jobs waiting (the backlog picks queues
    /// uniformly), so a queue below its nominal quota is owed the
    /// difference, up to what its cohort borrows. The FIFO baselines have
    /// no quotas; the same sum says how far their split is from the one the
    /// quotas promise.
    fn quota_owed(&self) -> f64 {
        let gpus = pool_units(false);
        (0..COHORTS)
            .map(|cohort| {
                let (mut borrowed, mut short) = (0.0, 0.0);
                for q in (cohort..QUEUES).step_by(COHORTS) {
                    let held = self.queue_gpus.get(q).copied().unwrap_or(0.0);
                    let nominal = share(gpus, q) as f64;
                    borrowed += (held - nominal).max(0.0);
                    short += (nominal - held).max(0.0);
                }
                f64::min(borrowed, short)
            })
            .sum()
    }

    /// Records the steady-state samples of this step.
    fn sample(&mut self, total_gpus: f64) {
        self.alloc_samples.push(self.allocated / total_gpus);
        self.owed_samples
            .push(self.quota_owed() / pool_units(false) as f64);
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
        let beyond_nominal_submitted = stream
            .iter()
            .take(self.next_job)
            .filter(|j| j.beyond_nominal())
            .count() as u64;
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
        let sorted = SortedSamples::new(self.cycle_ms.iter().copied());
        let total_ms: f64 = self.cycle_ms.iter().sum();
        let cpu_sorted = SortedSamples::new(self.cycle_cpu_ms.iter().copied());
        let total_cpu_ms: f64 = self.cycle_cpu_ms.iter().sum();
        let per_sec = |ms: f64| {
            if ms > 0.0 {
                self.admissions as f64 / (ms / 1000.0)
            } else {
                0.0
            }
        };
        let waits = SortedSamples::new(self.big_waits_min.iter().copied());
        Report {
            policy: policy.into(),
            cycles: self.cycle_ms.len(),
            cycle_p50_ms: sorted.percentile(50.0).unwrap_or(0.0),
            cycle_p99_ms: sorted.percentile(99.0).unwrap_or(0.0),
            cycle_max_ms: sorted.max().unwrap_or(0.0),
            first_cycle_ms: self.first_cycle.0,
            first_cycle_admissions: self.first_cycle.1,
            first_cycle_admissions_per_sec: if self.first_cycle.0 > 0.0 {
                self.first_cycle.1 as f64 / (self.first_cycle.0 / 1000.0)
            } else {
                0.0
            },
            admissions: self.admissions,
            admissions_per_sec: per_sec(total_ms),
            cycle_cpu_p50_ms: cpu_sorted.percentile(50.0).unwrap_or(0.0),
            cycle_cpu_p99_ms: cpu_sorted.percentile(99.0).unwrap_or(0.0),
            admissions_per_cpu_sec: per_sec(total_cpu_ms),
            bound_idle_ratio: 0.0,
            steady_allocation_ratio: mean(&self.alloc_samples),
            steady_quota_owed_ratio: mean(&self.owed_samples),
            preemptions: self.preemptions,
            victims_lower_priority: self.victims_by_rule[0],
            victims_reclaim: self.victims_by_rule[1],
            victims_fair_share: self.victims_by_rule[2],
            victim_gpus: self.victim_gpus,
            evicted_gpu_hours: self.evicted_gpu_hours,
            jobs_evicted: self.evictions.iter().filter(|n| **n > 0).count() as u64,
            jobs_evicted_again: self.evictions.iter().filter(|n| **n > 1).count() as u64,
            most_evictions_of_one_job: self.evictions.iter().copied().max().unwrap_or(0),
            preemption_attempts: self.preemption_attempts,
            reservations_made: self.reservations,
            big_gangs_submitted: big_submitted,
            big_gangs_started: waits.len() as u64,
            big_gangs_waiting_at_end: big_waiting,
            oldest_waiting_big_gang_min: oldest_waiting as f64 / 60.0,
            big_gang_wait_p50_min: waits.percentile(50.0).unwrap_or(0.0),
            big_gang_wait_max_min: waits.max().unwrap_or(0.0),
            beyond_nominal_submitted,
            beyond_nominal_started: self.beyond_nominal_started,
            simulated_hours: (self.cycle_ms.len() as u64 * args.step_secs) as f64 / 3600.0,
            wall_secs: wall.as_secs_f64(),
            decisions_digest: None,
        }
    }
}

fn run_allocator(stream: &[SimJob], args: &Args) -> Result<Report, String> {
    let started_wall = Instant::now();
    let mut config = AllocatorConfig::default();
    config.preemption.enabled = args.preemption == 1;
    if let Some(secs) = args.borrower_hold_after {
        config.backfill.borrower_hold_after_secs = secs;
    }
    let mut alloc = Allocator::new(config).map_err(|e| e.to_string())?;
    for (n, _) in nodes(args.cpu_memory) {
        alloc
            .apply(Event::NodeUpserted(n))
            .map_err(|e| e.to_string())?;
    }
    for q in queues(args.within_queue, args.reclaim_within_cohort) {
        alloc
            .apply(Event::QueueUpserted(q))
            .map_err(|e| e.to_string())?;
    }
    let total_gpus = total_gpus() as f64;
    let mut sim = Sim::new(stream);
    let mut pending: usize = 0;
    let mut digest = args.digest.then(Digest::default);
    for step in 0..args.cycles {
        if started_wall.elapsed() > Duration::from_secs(args.max_wall_secs) {
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
                .apply(Event::JobSubmitted(job_spec(idx, &stream[idx], now, args)))
                .map_err(|e| e.to_string())?;
            sim.next_job += 1;
            pending += 1;
        }
        let timer = CycleTimer::start();
        let outcome = alloc.cycle(Timestamp(now));
        sim.cycle_timed(step, timer, outcome.admissions.len() as u64);
        if let Some(digest) = digest.as_mut() {
            digest.add(&alloc, &outcome);
        }
        for e in &outcome.evictions {
            if let Some(idx) = index_of(&e.uid) {
                // The running instance is gone; its pending finish is stale.
                if let Some(g) = sim.generation.get_mut(idx) {
                    *g += 1;
                }
                sim.evicted(idx, now);
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
                    // Drains are decisions of their own, never in `preemptions`.
                    gpu_allocator_core::PreemptionRule::Drain => continue,
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
            sim.sample(total_gpus);
        }
    }
    let mut report = sim.report(
        "trainyard (best-fit+DRF+backfill)",
        args,
        started_wall.elapsed(),
        stream,
    );
    report.decisions_digest = digest.map(|d| format!("{:016x}", d.hasher.finish()));
    Ok(report)
}

/// Hash of every decision of a run (see `--digest`). The pending reasons are
/// hashed as text: a cycle's reason table and its indices may differ between
/// two builds that decide alike.
#[derive(Default)]
struct Digest {
    hasher: std::hash::DefaultHasher,
    text: String,
}

impl Digest {
    fn add(&mut self, alloc: &Allocator, outcome: &gpu_allocator_core::CycleOutcome) {
        use std::fmt::Write;
        self.text.clear();
        let _ = write!(
            self.text,
            "{:?}{:?}{:?}",
            outcome.admissions, outcome.preemptions, outcome.evictions
        );
        for pending in &outcome.pending {
            if let Some(e) = alloc.explain(outcome, pending) {
                let _ = write!(
                    self.text,
                    "{}/{}/{}/{}/{:?};",
                    e.uid.as_str(),
                    e.position,
                    e.queue_length,
                    e.effective_priority,
                    e.reason
                );
            }
        }
        self.text.hash(&mut self.hasher);
    }
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
/// all" test; with `--cpu-memory`, CPU and memory free per node too, which
/// a worker must fit as well (the scheduler would not bind it otherwise).
struct FifoCluster {
    free: Vec<u32>,
    mig: Vec<bool>,
    /// Each node's rack, as `nodes` numbers them (consecutive nodes).
    rack: Vec<usize>,
    by_free: [Vec<usize>; 2],
    cpu_memory_free: Vec<CpuMemory>,
}

impl FifoCluster {
    fn new() -> Self {
        let mut c = FifoCluster {
            free: Vec::new(),
            mig: Vec::new(),
            rack: Vec::new(),
            by_free: [Vec::new(), Vec::new()],
            cpu_memory_free: Vec::new(),
        };
        for (node, pool) in nodes(false) {
            let units = if pool.mig {
                pool.gpus * SLICES_PER_GPU
            } else {
                pool.gpus
            };
            c.free.push(units);
            c.mig.push(pool.mig);
            c.rack.push(rack_of(&node));
            // Without `--cpu-memory` workers request none, so any room does.
            c.cpu_memory_free.push(node_room());
            let counts = &mut c.by_free[usize::from(pool.mig)];
            if counts.len() <= units as usize {
                counts.resize(units as usize + 1, 0);
            }
            counts[units as usize] += 1;
        }
        c
    }

    /// Takes (`take`) or gives back `units` and the CPU and memory of the
    /// workers holding them, each requesting `per_worker`.
    fn adjust(&mut self, node: usize, units: u32, per_worker: (u32, CpuMemory), take: bool) {
        let (g, cpu_memory) = per_worker;
        let cpu_memory = cpu_memory.times(units / g.max(1));
        let counts = &mut self.by_free[usize::from(self.mig[node])];
        counts[self.free[node] as usize] -= 1;
        let room = &mut self.cpu_memory_free[node];
        if take {
            self.free[node] -= units;
            *room = room.minus(cpu_memory);
        } else {
            self.free[node] += units;
            *room = room.plus(cpu_memory);
        }
        counts[self.free[node] as usize] += 1;
    }

    /// Workers of `g` units, each requesting `cpu_memory`, that `node`
    /// hosts after `taken` more of them.
    fn workers_fitting(&self, node: usize, (g, cpu_memory): (u32, CpuMemory), taken: u32) -> u32 {
        let units = self.free[node] - taken * g;
        let room = self.cpu_memory_free[node].minus(cpu_memory.times(taken));
        (units / g.max(1)).min(cpu_memory.workers_in(room))
    }

    /// Workers of `g` units the free counts could host.
    fn slots(&self, mig: bool, g: u32) -> u64 {
        let counts = &self.by_free[usize::from(mig)];
        (g as usize..counts.len())
            .map(|f| counts[f] as u64 * u64::from(f as u32 / g))
            .sum()
    }

    /// All workers, each requesting `cpu_memory` beside its units, on the
    /// emptiest nodes (spread) or the lowest-numbered nodes with room (first
    /// fit); `None` when the gang does not fit.
    fn place(
        &self,
        job: &SimJob,
        cpu_memory: CpuMemory,
        spread: bool,
    ) -> Option<Vec<(usize, u32)>> {
        // Free units alone: a necessary condition, cheap to check.
        if self.slots(job.mig, job.units) < u64::from(job.workers) {
            return None;
        }
        if !job.same_rack {
            return self.place_among(job, cpu_memory, spread, 0..self.free.len());
        }
        // A gang kept in one rack: the first rack, by node index, that holds it.
        let mut start = 0;
        while let Some(&rack) = self.rack.get(start) {
            let end = start
                + self.rack[start..]
                    .iter()
                    .take_while(|r| **r == rack)
                    .count();
            if let Some(placement) = self.place_among(job, cpu_memory, spread, start..end) {
                return Some(placement);
            }
            start = end;
        }
        None
    }

    /// `place` on the nodes of `among` only.
    fn place_among(
        &self,
        job: &SimJob,
        cpu_memory: CpuMemory,
        spread: bool,
        among: Range<usize>,
    ) -> Option<Vec<(usize, u32)>> {
        let g = job.units;
        let per_worker = (g, cpu_memory);
        let mut placement: Vec<(usize, u32)> = Vec::new();
        if spread {
            for _ in 0..job.workers {
                let mut best: Option<(usize, u32)> = None;
                for node in among.clone() {
                    let f = self.free[node];
                    if self.mig[node] != job.mig {
                        continue;
                    }
                    let taken: u32 = placement
                        .iter()
                        .filter(|(n, _)| *n == node)
                        .map(|(_, u)| *u / g)
                        .sum();
                    let left = f - taken * g;
                    if self.workers_fitting(node, per_worker, taken) > 0
                        && best.is_none_or(|(_, b)| left > b)
                    {
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
            for node in among {
                if left == 0 {
                    break;
                }
                if self.mig[node] != job.mig {
                    continue;
                }
                let take = self.workers_fitting(node, per_worker, 0).min(left);
                if take > 0 {
                    placement.push((node, take * g));
                    left -= take;
                }
            }
            if left > 0 {
                return None;
            }
        }
        Some(placement)
    }
}

/// Every job's CPU and memory a worker, by stream index.
fn per_worker_cpu_memory(stream: &[SimJob], args: &Args) -> Vec<CpuMemory> {
    stream
        .iter()
        .enumerate()
        .map(|(index, job)| cpu_memory_per_worker(index, job, args))
        .collect()
}

fn run_fifo(stream: &[SimJob], args: &Args, baseline: Baseline) -> Report {
    let strict = baseline != Baseline::SkipBlockedFirstFit;
    let spread = baseline == Baseline::StrictSpread;
    let started_wall = Instant::now();
    let total_gpus = total_gpus() as f64;
    let mut cluster = FifoCluster::new();
    let per_worker_cpu = per_worker_cpu_memory(stream, args);
    let mut placed: Vec<Vec<(usize, u32)>> = vec![Vec::new(); stream.len()];
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut sim = Sim::new(stream);
    for step in 0..args.cycles {
        if started_wall.elapsed() > Duration::from_secs(args.max_wall_secs) {
            break;
        }
        let now = step as u64 * args.step_secs;
        for idx in sim.due(now) {
            let per_worker = (stream[idx].units, per_worker_cpu[idx]);
            for (node, units) in std::mem::take(&mut placed[idx]) {
                cluster.adjust(node, units, per_worker, false);
            }
        }
        while queue.len() < BACKLOG && sim.next_job < stream.len() {
            sim.submitted_at[sim.next_job] = now;
            queue.push_back(sim.next_job);
            sim.next_job += 1;
        }
        let timer = CycleTimer::start();
        let mut admitted = 0u64;
        let mut kept: VecDeque<usize> = VecDeque::with_capacity(queue.len());
        // Per worker shape, the fewest workers that did not fit this cycle:
        // admissions only take capacity, so as many or more do not fit
        // either (without it, skipping blocked jobs whose CPU does not fit
        // walked every node for each of thousands of jobs).
        let mut not_fitting: Vec<((bool, u32, CpuMemory), u32)> = Vec::new();
        while let Some(idx) = queue.pop_front() {
            let job = &stream[idx];
            let per_worker = (job.units, per_worker_cpu[idx]);
            let shape = (job.mig, job.units, per_worker_cpu[idx]);
            let known_not_to_fit = not_fitting
                .iter()
                .any(|(s, workers)| *s == shape && job.workers >= *workers);
            let placement = if known_not_to_fit {
                None
            } else {
                cluster.place(job, per_worker_cpu[idx], spread)
            };
            let Some(placement) = placement else {
                match not_fitting.iter_mut().find(|(s, _)| *s == shape) {
                    Some((_, workers)) => *workers = (*workers).min(job.workers),
                    None => not_fitting.push((shape, job.workers)),
                }
                kept.push_back(idx);
                if strict {
                    break;
                }
                continue;
            };
            for (node, units) in &placement {
                cluster.adjust(*node, *units, per_worker, true);
            }
            placed[idx] = placement;
            admitted += 1;
            sim.started(idx, job, now);
        }
        kept.extend(queue.drain(..));
        queue = kept;
        sim.cycle_timed(step, timer, admitted);
        if now >= args.warmup_secs {
            sim.sample(total_gpus);
        }
    }
    sim.report(baseline.name(), args, started_wall.elapsed(), stream)
}

/// Kueue's default ClusterQueue with kube-scheduler behind it: admission
/// checks quota only (one queue whose quota is the whole cluster, per pool
/// kind), in submission order skipping what does not fit (BestEffortFIFO);
/// then each worker pod binds on its own, to the lowest-numbered node with
/// room (first fit) or to the one with the most room (`spread`, the default
/// kube-scheduler scoring, LeastAllocated). A gang runs once every worker is bound; one still partly bound
/// after `WAIT_FOR_PODS_READY_SECS` is evicted (its pods released) and
/// requeued at the back, as `waitForPodsReady` does.
fn run_quota_fifo(stream: &[SimJob], args: &Args, spread: bool) -> Report {
    let started_wall = Instant::now();
    let total_gpus = total_gpus() as f64;
    let mut cluster = FifoCluster::new();
    let per_worker_cpu = per_worker_cpu_memory(stream, args);
    let mut quota_free = [0u64; 2];
    for (_, pool) in nodes(false) {
        let units = if pool.mig {
            pool.gpus * SLICES_PER_GPU
        } else {
            pool.gpus
        };
        quota_free[usize::from(pool.mig)] += u64::from(units);
    }
    let demand = |job: &SimJob| u64::from(job.workers) * u64::from(job.units);
    let mut placed: Vec<Vec<(usize, u32)>> = vec![Vec::new(); stream.len()];
    // Admitted gangs not yet wholly bound: (job, admitted at).
    let mut binding: Vec<(usize, u64)> = Vec::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut sim = Sim::new(stream);
    let mut idle_bound_samples: Vec<f64> = Vec::new();
    for step in 0..args.cycles {
        if started_wall.elapsed() > Duration::from_secs(args.max_wall_secs) {
            break;
        }
        let now = step as u64 * args.step_secs;
        for idx in sim.due(now) {
            let per_worker = (stream[idx].units, per_worker_cpu[idx]);
            for (node, units) in std::mem::take(&mut placed[idx]) {
                cluster.adjust(node, units, per_worker, false);
            }
            quota_free[usize::from(stream[idx].mig)] += demand(&stream[idx]);
        }
        binding.retain(|&(idx, admitted_at)| {
            if now.saturating_sub(admitted_at) < WAIT_FOR_PODS_READY_SECS {
                return true;
            }
            let per_worker = (stream[idx].units, per_worker_cpu[idx]);
            for (node, units) in std::mem::take(&mut placed[idx]) {
                cluster.adjust(node, units, per_worker, false);
            }
            quota_free[usize::from(stream[idx].mig)] += demand(&stream[idx]);
            queue.push_back(idx);
            sim.preemptions += 1;
            false
        });
        while queue.len() < BACKLOG && sim.next_job < stream.len() {
            sim.submitted_at[sim.next_job] = now;
            queue.push_back(sim.next_job);
            sim.next_job += 1;
        }
        let timer = CycleTimer::start();
        let mut admitted = 0u64;
        queue.retain(|&idx| {
            let job = &stream[idx];
            let free = &mut quota_free[usize::from(job.mig)];
            if demand(job) > *free {
                return true;
            }
            *free -= demand(job);
            binding.push((idx, now));
            admitted += 1;
            false
        });
        // The scheduler binds pending pods in admission order, one at a time;
        // a pod that fits nowhere waits.
        binding.retain(|&(idx, _)| {
            let job = &stream[idx];
            let per_worker = (job.units, per_worker_cpu[idx]);
            let mut bound: u32 = placed[idx].iter().map(|(_, u)| u / job.units).sum();
            while bound < job.workers {
                // A gang kept in one rack asks it by required pod affinity:
                // the scheduler binds its first pod anywhere and the others
                // in that pod's rack.
                let rack = placed[idx]
                    .first()
                    .filter(|_| job.same_rack)
                    .map(|(n, _)| cluster.rack[*n]);
                let mut fitting = (0..cluster.free.len()).filter(|&n| {
                    cluster.mig[n] == job.mig
                        && rack.is_none_or(|r| cluster.rack[n] == r)
                        && cluster.workers_fitting(n, per_worker, 0) > 0
                });
                let chosen = if spread {
                    // The first of the emptiest nodes, as `max_by_key` keeps the last.
                    fitting.min_by_key(|&n| Reverse(cluster.free[n]))
                } else {
                    fitting.next()
                };
                let Some(node) = chosen else {
                    break;
                };
                cluster.adjust(node, job.units, per_worker, true);
                match placed[idx].iter_mut().find(|(n, _)| *n == node) {
                    Some(entry) => entry.1 += job.units,
                    None => placed[idx].push((node, job.units)),
                }
                bound += 1;
            }
            if bound < job.workers {
                return true;
            }
            sim.started(idx, job, now);
            false
        });
        sim.cycle_timed(step, timer, admitted);
        if now >= args.warmup_secs {
            sim.sample(total_gpus);
            let idle: f64 = binding
                .iter()
                .map(|&(idx, _)| {
                    let units: u32 = placed[idx].iter().map(|(_, u)| u).sum();
                    if stream[idx].mig {
                        f64::from(units) / f64::from(SLICES_PER_GPU)
                    } else {
                        f64::from(units)
                    }
                })
                .sum();
            idle_bound_samples.push(idle / total_gpus);
        }
    }
    let mut report = sim.report(
        if spread {
            "Kueue-like: quota FIFO, pods spread"
        } else {
            "Kueue-like: quota FIFO, pods first-fit"
        },
        args,
        started_wall.elapsed(),
        stream,
    );
    report.bound_idle_ratio = mean(&idle_bound_samples);
    report
}

/// The gpu-allocator service's allocator (see its `main`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args = <Args as clap::Parser>::parse();
    for &mix in &args.mix {
        if let Err(e) = run_mix(&args, mix) {
            eprintln!(
                "admission: allocator run on the {} mix failed: {e}",
                mix.label()
            );
            std::process::exit(1);
        }
    }
}

/// Runs every policy on one mix and prints the table and a JSON line.
fn run_mix(args: &Args, mix: MixName) -> Result<(), String> {
    // Enough jobs for the whole run: backlog plus generous turnover.
    let stream = generate_stream(mix.shapes(), args.seed, BACKLOG + args.cycles * 200);
    let ours = run_allocator(&stream, args)?;
    if args.trainyard_only {
        #[derive(Serialize)]
        struct OursLine<'a> {
            benchmark: &'static str,
            mix: &'static str,
            seed: u64,
            trainyard: &'a Report,
        }
        let line = OursLine {
            benchmark: "admission",
            mix: mix.label(),
            seed: args.seed,
            trainyard: &ours,
        };
        match serde_json::to_string(&line) {
            Ok(json) => println!("{json}"),
            Err(e) => eprintln!("admission: cannot encode JSON: {e}"),
        }
        return Ok(());
    }
    let strict = run_fifo(&stream, args, Baseline::StrictFirstFit);
    let greedy = run_fifo(&stream, args, Baseline::SkipBlockedFirstFit);
    let spread = run_fifo(&stream, args, Baseline::StrictSpread);
    let kueue = run_quota_fifo(&stream, args, false);
    let kueue_spread = run_quota_fifo(&stream, args, true);

    println!(
        "steady state: admits/s = admissions / total cycle time (wall clock); per CPU-s = admissions / the cycles' CPU time (thread clock, without other processes' time on the core); alloc % = allocated GPU-equivalents / {} GPUs \
         averaged over cycles after warm-up; owed % = whole GPUs of a queue's nominal quota held by other queues of its cohort beyond their own while it waits (every queue always has jobs waiting), averaged likewise; lost GPU-h = work of evicted jobs, which start over; \
         big gangs = jobs of >= 64 GPUs; > nominal = jobs with more GPUs than their queue's nominal quota",
        total_gpus()
    );
    println!(
        "admission benchmark, {} mix: {} nodes ({}), {QUEUES} queues, backlog {BACKLOG}, \
         step {} s, seed {}, steady state after {} s, queues' withinQueue {} and reclaimWithinCohort {}",
        mix.label(),
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
        args.warmup_secs,
        args.within_queue,
        args.reclaim_within_cohort
    );
    println!(
        "{:<36} {:>6} {:>8} {:>8} {:>8} {:>10} {:>10} {:>8} {:>7} {:>8} {:>10} {:>17} {:>14} {:>17}",
        "policy",
        "cycles",
        "p50 ms",
        "p99 ms",
        "max ms",
        "admits/s",
        "per CPU-s",
        "alloc %",
        "owed %",
        "preempt",
        "lost GPU-h",
        ">=64-GPU started",
        "their wait p50",
        "> nominal started"
    );
    for r in [&ours, &strict, &greedy, &spread, &kueue, &kueue_spread] {
        println!(
            "{:<36} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>10.0} {:>10.0} {:>8.1} {:>7.1} {:>8} {:>10.0} {:>8}/{:<8} {:>9.0} min {:>8}/{:<8}",
            r.policy,
            r.cycles,
            r.cycle_p50_ms,
            r.cycle_p99_ms,
            r.cycle_max_ms,
            r.admissions_per_sec,
            r.admissions_per_cpu_sec,
            r.steady_allocation_ratio * 100.0,
            r.steady_quota_owed_ratio * 100.0,
            r.preemptions,
            r.evicted_gpu_hours,
            r.big_gangs_started,
            r.big_gangs_submitted,
            r.big_gang_wait_p50_min,
            r.beyond_nominal_started,
            r.beyond_nominal_submitted,
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
        ("Kueue-like quota FIFO, pods first-fit", &kueue),
        ("Kueue-like quota FIFO, pods spread", &kueue_spread),
    ] {
        println!(
            "allocation ratio vs {label}: {:+.1} points",
            (ours.steady_allocation_ratio - base.steady_allocation_ratio) * 100.0
        );
    }
    println!(
        "trainyard: {} victims were {} jobs, {} of them evicted more than once, one job at most {} times",
        ours.victims_lower_priority + ours.victims_reclaim + ours.victims_fair_share,
        ours.jobs_evicted,
        ours.jobs_evicted_again,
        ours.most_evictions_of_one_job
    );
    for r in [&kueue, &kueue_spread] {
        println!(
            "{}: {:.1} % of the GPUs bound to pods of gangs still waiting for the rest of their workers; {} gangs evicted by waitForPodsReady",
            r.policy,
            r.bound_idle_ratio * 100.0,
            r.preemptions
        );
    }
    #[derive(Serialize)]
    struct Line<'a> {
        benchmark: &'static str,
        mix: &'static str,
        seed: u64,
        nodes: usize,
        gpus: u64,
        queues: usize,
        backlog: usize,
        step_secs: u64,
        within_queue: WithinQueuePreemption,
        reclaim_within_cohort: ReclaimWithinCohort,
        trainyard: &'a Report,
        fifo_strict: &'a Report,
        fifo_skip_blocked: &'a Report,
        fifo_strict_spread: &'a Report,
        kueue_like_first_fit: &'a Report,
        kueue_like_spread: &'a Report,
        allocation_gain_points: f64,
    }
    let line = Line {
        benchmark: "admission",
        mix: mix.label(),
        seed: args.seed,
        nodes: POOLS.iter().map(|p| p.count).sum(),
        gpus: total_gpus(),
        queues: QUEUES,
        backlog: BACKLOG,
        step_secs: args.step_secs,
        within_queue: args.within_queue,
        reclaim_within_cohort: args.reclaim_within_cohort,
        trainyard: &ours,
        fifo_strict: &strict,
        fifo_skip_blocked: &greedy,
        fifo_strict_spread: &spread,
        kueue_like_first_fit: &kueue,
        kueue_like_spread: &kueue_spread,
        allocation_gain_points: (ours.steady_allocation_ratio - strict.steady_allocation_ratio)
            * 100.0,
    };
    match serde_json::to_string(&line) {
        Ok(json) => println!("{json}"),
        Err(e) => eprintln!("admission: cannot encode JSON: {e}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(queue: usize, gpus: u64, mig: bool) -> SimJob {
        SimJob {
            queue,
            workers: 1,
            units: u32::try_from(gpus).expect("fits"),
            mig,
            same_rack: false,
            priority: 0,
            duration: 3_600,
            estimate: None,
        }
    }

    #[test]
    fn quota_owed_is_what_borrowers_hold_up_to_what_their_cohort_lacks() {
        let nominal = |queue| share(pool_units(false), queue);
        // Cohorts 0 and 1 at their nominal quotas, cohort 2 idle.
        let mut stream: Vec<SimJob> = (0..QUEUES)
            .filter(|q| q % COHORTS != 2)
            .map(|q| holding(q, nominal(q), false))
            .collect();
        // Cohort 0 (queues 0, 3, ...): queue 0 borrows 106 GPUs, queue 3
        // lacks 62; MIG slices do not count for queue 3.
        stream[0].units += 106;
        stream[2].units -= 62;
        stream.push(holding(3, 7, true));
        // Cohort 1: queue 1 borrows 50, nobody lacks any.
        stream[1].units += 50;
        let mut sim = Sim::new(&stream);
        for (idx, job) in stream.iter().enumerate() {
            sim.started(idx, job, 0);
        }
        assert_eq!(sim.quota_owed(), 62.0);
        // Queue 3's job ends: it lacks its whole quota, but only the 106
        // GPUs that queue 0 borrows are owed.
        sim.stopped(2);
        assert_eq!(sim.quota_owed(), 106.0);
    }

    #[test]
    fn baselines_place_a_worker_only_where_its_cpu_and_memory_fit_too() {
        let cores = |n: u64| CpuMemory {
            cpu_millis: n * 1_000,
            memory_bytes: 0,
        };
        let mut cluster = FifoCluster::new();
        // The first whole-GPU node: 4 GPUs, 94 cores beside its DaemonSets.
        let first = POOLS[0].count;
        cluster.adjust(first, 1, (1, cores(90)), true);
        let job = holding(0, 1, false);
        // 3 GPUs are free on it, but not 11 cores: first fit takes the next.
        for spread in [false, true] {
            let placement = cluster.place(&job, cores(11), spread);
            assert_ne!(placement.as_ref().map(|p| p[0].0), Some(first));
            assert!(placement.is_some());
        }
        assert_eq!(cluster.workers_fitting(first, (1, cores(4)), 0), 1);
        // GPUs enough everywhere, CPU nowhere: the gang does not fit.
        assert_eq!(cluster.place(&job, cores(95), false), None);
        // Given back, the node takes it again.
        cluster.adjust(first, 1, (1, cores(90)), false);
        let placement = cluster.place(&job, cores(11), false);
        assert_eq!(placement, Some(vec![(first, 1)]));
    }

    #[test]
    fn baselines_keep_a_rack_bound_gang_in_the_first_rack_that_holds_it() {
        let mut cluster = FifoCluster::new();
        // The first 8-GPU H100 nodes start a rack of 16; one GPU busy on
        // each of its first 10 nodes leaves 6 whole nodes there.
        let first = POOLS[0].count + POOLS[1].count;
        let rack = cluster.rack[first];
        assert_ne!(cluster.rack[first - 1], rack, "a rack starts at the pool");
        for node in first..first + 10 {
            cluster.adjust(node, 1, (1, CpuMemory::default()), true);
        }
        let gang = |workers| SimJob {
            workers,
            units: 8,
            same_rack: true,
            ..holding(0, 1, false)
        };
        for spread in [false, true] {
            let six = cluster
                .place(&gang(6), CpuMemory::default(), spread)
                .expect("six whole nodes in the first rack");
            assert!(six.iter().all(|(n, _)| cluster.rack[*n] == rack), "{six:?}");
            // Seven: the first rack has 6 whole nodes, the next all 16.
            let seven = cluster
                .place(&gang(7), CpuMemory::default(), spread)
                .expect("the next rack");
            assert!(
                seven.iter().all(|(n, _)| cluster.rack[*n] == rack + 1),
                "{seven:?}"
            );
        }
        // Unconstrained, first fit takes the 6 and one more from the next rack.
        let spread_out = SimJob {
            same_rack: false,
            ..gang(7)
        };
        let placement = cluster
            .place(&spread_out, CpuMemory::default(), false)
            .expect("fits");
        assert_eq!(placement.first().map(|(n, _)| *n), Some(first + 10));
        assert_eq!(
            placement.last().map(|(n, _)| cluster.rack[*n]),
            Some(rack + 1)
        );
    }
}
