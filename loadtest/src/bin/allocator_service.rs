//! The gpu-allocator service's cycle at depth: its adapter state
//! (`trainyard_gpu_allocator::AllocatorState`, the core plus what the service
//! keeps and publishes) fed TrainingJob, TrainingQueue and node messages as
//! the service receives them, in one process, without NATS. The `admission`
//! benchmark times the core alone; this one times what the service does per
//! cycle on top (explaining every pending job, deciding which `admission.pending`
//! messages to publish) and counts those messages: each one becomes a status
//! write on a TrainingJob in the planner. It also counts the `queue.status`
//! reports, each a status write on a TrainingQueue.
//!
//! Cluster: 2,000 nodes x 8 GPUs (16,000), 30 TrainingQueues in one
//! cohort with equal nominal quotas. Jobs: 1, 2, 4, 8 GPUs (35, 20, 15, 10 %)
//! and gangs of 8-GPU workers 2, 4, 8, 16 x 8 (9, 6, 3, 2 %), runtime
//! log-uniform in 30 min-6 h, 70 % with an estimate, queues picked uniformly.
//! Closed loop of 60 s steps: jobs whose runtime is up complete, the backlog
//! is topped up to `--pending` jobs, one cycle runs, and every decision in the
//! outbox is published (fed back as the service does). Bounded by `--steps`
//! and `--max-wall-secs`; prints figures, asserts nothing.
//!
//! Usage: `allocator_service [--pending N] [--steps N] [--seed N]
//! [--explain-step-percent N] [--max-wall-secs N]`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use gpu_allocator_core::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_contracts::EntityRef;
use trainyard_contracts::events::{Change, NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_gpu_allocator::{AllocatorServiceConfig, AllocatorState, Outgoing};
use trainyard_loadtest::procstats;
use trainyard_loadtest::workload::{self, JobShape};
use trainyard_stats::SortedSamples;

const NODES: usize = 2_000;
const GPUS_PER_NODE: u32 = 8;
const QUEUES: usize = 30;
const NAMESPACE: &str = "ml";
const STEP_SECS: u64 = 60;
/// Simulated start (2027-01-15): any fixed time works.
const START: u64 = 1_800_000_000;
/// Steps before figures are sampled: the first cycle admits thousands.
const WARMUP_STEPS: usize = 30;

/// (workers, GPUs per worker, share of jobs in percent).
const SHAPES: [(u32, u32, u32); 8] = [
    (1, 1, 35),
    (1, 2, 20),
    (1, 4, 15),
    (1, 8, 10),
    (2, 8, 9),
    (4, 8, 6),
    (8, 8, 3),
    (16, 8, 2),
];
const RUNTIME_SECS: (f64, f64) = (1_800.0, 21_600.0);

#[derive(Parser, Debug)]
#[command(about = "The gpu-allocator service's cycle and its pending-status messages at depth")]
struct Args {
    /// Pending jobs the backlog is topped up to before every cycle.
    #[arg(long, default_value_t = 10_000)]
    pending: usize,
    /// Cycles (60 s simulated steps), warm-up included.
    #[arg(long, default_value_t = 150)]
    steps: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// `explain_step_percent` of the service config (unset: its default).
    #[arg(long)]
    explain_step_percent: Option<u32>,
    /// Stops early after this much wall time.
    #[arg(long, default_value_t = 300)]
    max_wall_secs: u64,
}

#[derive(Serialize)]
struct Figures {
    pending: usize,
    explain_step_percent: u32,
    steps_sampled: usize,
    cycle_ms_p50: f64,
    cycle_ms_p99: f64,
    admissions_per_cycle: f64,
    pending_messages_per_cycle_mean: f64,
    pending_messages_per_cycle_p50: f64,
    pending_messages_per_cycle_max: f64,
    pending_message_bytes_per_cycle: f64,
    /// `queue.status` messages (each a status write on a TrainingQueue).
    queue_status_messages_per_cycle: f64,
    snapshot_json_bytes: usize,
    snapshot_copy_ms_p50: f64,
    snapshot_encode_ms_p50: f64,
    /// Of this process: the state, a snapshot's copy and encoding, and the
    /// benchmark's own books (a few MB).
    peak_rss_mib: f64,
}

struct Running {
    entity: EntityRef,
    ends_at: u64,
}

/// The gpu-allocator service's allocator (see its `main`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = AllocatorServiceConfig::default();
    if let Some(percent) = args.explain_step_percent {
        config.explain_step_percent = percent;
    }
    let step_percent = config.explain_step_percent;
    let mut state = AllocatorState::new(config).context("allocator state")?;
    build_cluster(&mut state)?;

    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut next_job = 0usize;
    let mut pending: BTreeMap<String, EntityRef> = BTreeMap::new();
    let mut running: Vec<Running> = Vec::new();
    let mut cycle_ms = Vec::new();
    let mut copy_ms = Vec::new();
    let mut encode_ms = Vec::new();
    let mut messages = Vec::new();
    let mut message_bytes = 0usize;
    let mut queue_reports = 0usize;
    let mut admissions = 0usize;
    let mut snapshot_bytes = 0usize;
    let started = Instant::now();
    let deadline = Duration::from_secs(args.max_wall_secs);

    for step in 0..args.steps {
        if started.elapsed() > deadline {
            println!("stopped after {step} steps: --max-wall-secs reached");
            break;
        }
        let now = START + step as u64 * STEP_SECS;
        let (ended, still): (Vec<Running>, Vec<Running>) =
            running.into_iter().partition(|r| r.ends_at <= now);
        running = still;
        for job in ended {
            state
                .on_transition(&job.entity, &completed())
                .context("completion")?;
        }
        while pending.len() < args.pending {
            let (entity, change) = new_job(&mut rng, next_job)?;
            next_job += 1;
            state
                .on_job_changed(&entity, &change, Timestamp(now))
                .context("job")?;
            pending.insert(entity.uid.clone(), entity);
        }

        let timer = Instant::now();
        let report = state.cycle(Timestamp(now));
        let elapsed = timer.elapsed();

        let outbox: Vec<Outgoing> = state.outbox().iter().cloned().collect();
        let mut cycle_messages = 0usize;
        let mut cycle_queue_reports = 0usize;
        let mut cycle_bytes = 0usize;
        for outgoing in &outbox {
            match outgoing {
                Outgoing::Pending { payload, .. } => {
                    cycle_messages += 1;
                    cycle_bytes += serde_json::to_vec(payload)?.len();
                }
                Outgoing::QueueStatus { .. } => cycle_queue_reports += 1,
                Outgoing::Admission { entity, .. } => {
                    let Some(entity) = pending.remove(&entity.uid) else {
                        bail!("admitted {entity:?}, which is not pending");
                    };
                    let runtime = log_uniform(&mut rng, RUNTIME_SECS);
                    running.push(Running {
                        entity,
                        ends_at: now + runtime as u64,
                    });
                }
                Outgoing::Preemption { .. } | Outgoing::Drain { .. } => {}
            }
            state.published(outgoing.id());
        }
        if step >= WARMUP_STEPS {
            // The service saves a snapshot after every cycle that admitted
            // or preempted: copied under the state's lock, then encoded.
            let timer = Instant::now();
            let snapshot = state.persisted();
            copy_ms.push(timer.elapsed().as_secs_f64() * 1e3);
            let timer = Instant::now();
            let encoded = serde_json::to_vec(&snapshot)?;
            encode_ms.push(timer.elapsed().as_secs_f64() * 1e3);
            snapshot_bytes = encoded.len();
            cycle_ms.push(elapsed.as_secs_f64() * 1e3);
            messages.push(cycle_messages as f64);
            queue_reports += cycle_queue_reports;
            message_bytes += cycle_bytes;
            admissions += report.admissions;
        }
    }

    let cycles = SortedSamples::new(cycle_ms);
    let messages = SortedSamples::new(messages);
    let sampled = cycles.len().max(1) as f64;
    let peak_rss = procstats::sample(std::process::id())?.peak_rss_bytes;
    let figures = Figures {
        pending: args.pending,
        explain_step_percent: step_percent,
        steps_sampled: cycles.len(),
        cycle_ms_p50: cycles.percentile(50.0).unwrap_or(0.0),
        cycle_ms_p99: cycles.percentile(99.0).unwrap_or(0.0),
        admissions_per_cycle: admissions as f64 / sampled,
        pending_messages_per_cycle_mean: messages.mean().unwrap_or(0.0),
        pending_messages_per_cycle_p50: messages.percentile(50.0).unwrap_or(0.0),
        pending_messages_per_cycle_max: messages.max().unwrap_or(0.0),
        pending_message_bytes_per_cycle: message_bytes as f64 / sampled,
        queue_status_messages_per_cycle: queue_reports as f64 / sampled,
        snapshot_json_bytes: snapshot_bytes,
        snapshot_copy_ms_p50: SortedSamples::new(copy_ms).percentile(50.0).unwrap_or(0.0),
        snapshot_encode_ms_p50: SortedSamples::new(encode_ms)
            .percentile(50.0)
            .unwrap_or(0.0),
        peak_rss_mib: peak_rss as f64 / (1024.0 * 1024.0),
    };
    println!(
        "allocator service, {} pending jobs, explain step {} %, {} cycles after {WARMUP_STEPS} of warm-up:",
        figures.pending, figures.explain_step_percent, figures.steps_sampled
    );
    println!(
        "  cycle (core + adapter) p50 {:.2} ms, p99 {:.2} ms; {:.1} admissions a cycle",
        figures.cycle_ms_p50, figures.cycle_ms_p99, figures.admissions_per_cycle
    );
    println!(
        "  admission.pending messages a cycle: mean {:.0}, p50 {:.0}, max {:.0}; {:.0} bytes of payload a cycle",
        figures.pending_messages_per_cycle_mean,
        figures.pending_messages_per_cycle_p50,
        figures.pending_messages_per_cycle_max,
        figures.pending_message_bytes_per_cycle
    );
    println!(
        "  queue.status messages a cycle: mean {:.1} (of 30 queues; the benchmark's cycles are 60 s apart)",
        figures.queue_status_messages_per_cycle
    );
    println!(
        "  snapshot: {} bytes of JSON; p50 {:.1} ms to copy (under the lock), {:.1} ms to encode",
        figures.snapshot_json_bytes, figures.snapshot_copy_ms_p50, figures.snapshot_encode_ms_p50
    );
    println!("  peak RSS {:.1} MiB", figures.peak_rss_mib);
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

fn build_cluster(state: &mut AllocatorState) -> anyhow::Result<()> {
    let node: NodeObserved = serde_json::from_value(json!({
        "change": "Applied", "allocatableGpus": GPUS_PER_NODE,
        "labels": {"nvidia.com/gpu.product": workload::GPU_PRODUCT},
        "unschedulable": false, "ready": true
    }))?;
    for index in 0..NODES {
        let entity = EntityRef::new("", format!("node-{index:04}"), "");
        state.on_node(&entity, &node).context("node")?;
    }
    let total = NODES as u32 * GPUS_PER_NODE;
    for index in 0..QUEUES {
        let name = format!("team-{index:02}");
        let share = total / QUEUES as u32 + u32::from(index < (total as usize % QUEUES));
        let mut object = workload::training_queue(&name, share)?;
        object.spec.cohort = Some("all".into());
        let queue = TrainingQueueChanged {
            change: Change::Applied,
            object,
        };
        state
            .on_queue(&EntityRef::new("", &name, ""), &queue)
            .context("queue")?;
    }
    Ok(())
}

fn new_job(rng: &mut StdRng, index: usize) -> anyhow::Result<(EntityRef, TrainingJobChanged)> {
    let mut pick = rng.random_range(0..100);
    let (workers, gpus) = SHAPES
        .iter()
        .find(|(_, _, share)| {
            let hit = pick < *share;
            pick = pick.saturating_sub(*share);
            hit
        })
        .map_or((1, 1), |(w, g, _)| (*w, *g));
    let queue = format!("team-{:02}", rng.random_range(0..QUEUES));
    let name = format!("job-{index:06}");
    let uid = format!("uid-{index:06}");
    let shape = JobShape {
        model: "m".into(),
        workers,
        gpus_per_worker: gpus,
        epochs: 1,
        seconds_per_epoch: None,
        queue: Some(queue),
    };
    let mut object = workload::training_job(NAMESPACE, &name, &shape)?;
    object.metadata.uid = Some(uid.clone());
    if rng.random_bool(0.7) {
        let estimate = log_uniform(rng, RUNTIME_SECS) as u64;
        object
            .spec
            .scheduling
            .get_or_insert_with(Default::default)
            .estimated_runtime_seconds = Some(estimate);
    }
    let change = TrainingJobChanged {
        change: Change::Applied,
        object,
    };
    Ok((EntityRef::new(NAMESPACE, name, uid), change))
}

fn completed() -> TrainingJobTransitioned {
    TrainingJobTransitioned {
        from: Some(TrainingJobState::Running),
        to: TrainingJobState::Completed,
        reason: "Completed".into(),
        message: String::new(),
        restart_count: 0,
        gpus: 0,
        queue: None,
        context: Default::default(),
    }
}

fn log_uniform(rng: &mut StdRng, (lo, hi): (f64, f64)) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}
