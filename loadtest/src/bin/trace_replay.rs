//! Trace replay: a CSV job trace (Tiresias columns) replayed on the simulated
//! cluster with its virtual clock, through the seven services running as
//! release processes. The simulator runs in this process so its history
//! gives each job's simulated start and end. Prints job completion time,
//! queueing delay, makespan and GPU utilisation (and a strict-FIFO reference
//! on the same trace), and writes `trace-<name>.json` and `trace-<name>.svg`.
//!
//! ```text
//! trace_replay [--trace loadtest/traces/sample-40.csv] [--nodes 15]
//!     [--gpus-per-node 4] [--speed 60] [--cycle-ms 100] [--step 60]
//!     [--epoch-seconds 300] [--timeout 900] [--bin-dir DIR]
//!     [--out-dir loadtest/out] [--checkpoint-every EPOCHS [--killed-save-rate F]]
//! ```
//!
//! With `--checkpoint-every`, every job checkpoints to `s3://trace/...` with
//! `retention: {keepLast: 2}`: the simulated workers write real checkpoint
//! files under the stack's work directory, the checkpoint-manager verifies
//! them and deletes the older ones through the simulator's S3 endpoint, and
//! the output counts what it verified, found incomplete and deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use async_nats::jetstream;
use clap::Parser;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingQueue};
use trainyard_contracts::Service;
use trainyard_loadtest::fifo::{self, FifoJob};
use trainyard_loadtest::plot;
use trainyard_loadtest::positive;
use trainyard_loadtest::report::{self, Report};
use trainyard_loadtest::stack::{self, ProcessStats, Stack};
use trainyard_loadtest::trace::{self, GangLayout, TraceJob};
use trainyard_loadtest::workload::{self, JobShape, Submitted};
use trainyard_simulator::runner::{self, Simulator};
use trainyard_stats::SortedSamples;

const NAMESPACE: &str = "default";
const DEFAULT_QUEUE: &str = "default";
/// Epochs per job at most: each epoch is one progress report per worker.
const MAX_EPOCHS: u32 = 20;

/// Replays a job trace on the simulated cluster through the whole stack and
/// reports completion times, queueing delay, makespan and GPU utilisation.
#[derive(Parser)]
struct Args {
    /// Trace CSV (Tiresias columns; optional num_workers and queue).
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/sample-40.csv"))]
    trace: PathBuf,
    /// Simulated nodes (the Tiresias testbed: 15 × 4 GPUs).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    gpus_per_node: u32,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    speed: f64,
    /// The gpu-allocator's cycle interval.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    cycle_ms: u64,
    /// Seconds between samples of the utilisation and queue-depth series.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    step: f64,
    /// Target simulated seconds per epoch (epochs per job are capped).
    #[arg(long, default_value_t = 300.0, value_parser = positive)]
    epoch_seconds: f64,
    /// Give up after this many seconds.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 900)]
    timeout_seconds: u64,
    /// Where the release binaries are.
    #[arg(long, default_value_os_t = stack::default_bin_dir())]
    bin_dir: PathBuf,
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("out"))]
    out_dir: PathBuf,
    /// Jobs checkpoint every this many epochs (real files, verified and
    /// retained by the checkpoint-manager); 0: they do not checkpoint.
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u32,
    /// Fraction of saves killed part-way (the worker dies and the job
    /// restarts), with `--checkpoint-every`.
    #[arg(long, default_value_t = 0.0, value_parser = fraction)]
    killed_save_rate: f64,
}

fn fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!("{text} is not a fraction between 0 and 1")),
    }
}

/// What the checkpoint-manager counted, from its metrics.
#[derive(Serialize)]
struct CheckpointCounts {
    verified: f64,
    incomplete: f64,
    deleted_by_retention: f64,
}

/// The sum of `name`'s samples whose labels contain `labels` (Prometheus text).
fn counter(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name) && line.contains(labels))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The time resolution of the replay in simulated seconds: the services keep
/// the wall clock, so each real delay is stretched by the speed.
#[derive(Serialize)]
struct Resolution {
    speed: f64,
    allocator_cycle_simulated_seconds: f64,
    simulator_tick_simulated_seconds: f64,
    /// Submission lag behind the trace's submit time (simulated seconds).
    submit_lag_p50_seconds: Option<f64>,
    submit_lag_max_seconds: Option<f64>,
    /// The smallest queueing delay of any job: the floor Trainyard's own
    /// submit → start path adds, in simulated seconds.
    min_queueing_seconds: Option<f64>,
}

#[derive(Serialize)]
struct ReplayOutput {
    trace: String,
    jobs: usize,
    nodes: u32,
    gpus_per_node: u32,
    wall_seconds: f64,
    timed_out: bool,
    resolution: Resolution,
    trainyard: Report,
    fifo_reference: Report,
    processes: Vec<ProcessStats>,
    /// With `--checkpoint-every`.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoints: Option<CheckpointCounts>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let jobs = trace::read_trace(&args.trace)?;
    if jobs.is_empty() {
        bail!("{} has no jobs", args.trace.display());
    }
    let layouts = jobs
        .iter()
        .map(|j| trace::gang_layout(j, args.gpus_per_node))
        .collect::<Result<Vec<_>, _>>()?;
    let name = args
        .trace
        .file_stem()
        .map_or("trace".to_owned(), |s| s.to_string_lossy().into_owned());
    let mut stack = Stack::new(&args.bin_dir, "warn")?;
    let shutdown = CancellationToken::new();
    let outcome = tokio::select! {
        output = run(&args, &name, &jobs, &layouts, &mut stack, &shutdown) => output,
        signal = stack::interrupted() => match signal {
            Ok(()) => Err(anyhow!("interrupted")),
            Err(err) => Err(anyhow!("cannot listen for Ctrl-C: {err}")),
        },
    };
    // Logs of a failed or timed-out run are kept to find out why.
    if outcome.as_ref().map_or(true, |o| o.timed_out) {
        stack.keep_work_dir();
    }
    stack.stop(Duration::from_secs(10)).await;
    // The in-process simulator stops after the services that talk to it.
    shutdown.cancel();
    let output = outcome?;
    print_output(&output);
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let json = args.out_dir.join(format!("trace-{name}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(&output)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let svg = args.out_dir.join(format!("trace-{name}.svg"));
    let title = format!(
        "{name}: {} jobs on {} × {} GPUs (Trainyard, simulated)",
        output.jobs, args.nodes, args.gpus_per_node
    );
    std::fs::write(&svg, plot::render_svg(&output.trainyard.series, &title))
        .with_context(|| format!("cannot write {}", svg.display()))?;
    println!("JSON: {}\nSVG:  {}", json.display(), svg.display());
    Ok(())
}

async fn run(
    args: &Args,
    name: &str,
    jobs: &[TraceJob],
    layouts: &[GangLayout],
    stack: &mut Stack,
    shutdown: &CancellationToken,
) -> anyhow::Result<ReplayOutput> {
    stack.start_nats(None).await?;
    let mut cluster_config = workload::cluster_config(args.nodes, args.gpus_per_node, args.speed);
    if args.checkpoint_every > 0 {
        cluster_config.checkpoints.root = Some(stack.work_dir().join("checkpoints"));
        cluster_config.checkpoints.killed_save_rate = args.killed_save_rate;
    }
    let tick = cluster_config.tick_milliseconds;
    let simulator = Simulator::start(
        cluster_config,
        "127.0.0.1:0",
        Some(stack.connect().await?),
        shutdown.clone(),
    )
    .await?;
    let (clock, total_gpus) = {
        let cluster = runner::lock(&simulator.cluster);
        (cluster.clock(), cluster.total_gpus())
    };
    let kubeconfig = stack.write_kubeconfig(&simulator.kubeconfig())?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    for service in Service::ALL {
        let mut env = stack.service_env(service, &kubeconfig, args.cycle_ms)?;
        if service == Service::CheckpointManager && args.checkpoint_every > 0 {
            env.extend(workload::simulated_s3_env(simulator.address));
        }
        stack.start_service(service, &env)?;
    }
    stack.wait_ready(Duration::from_secs(60)).await?;
    let client = stack::kube_client(&simulator.kubeconfig()).await?;
    let js = jetstream::new(stack.connect().await?);
    let queues: BTreeSet<&str> = jobs
        .iter()
        .map(|j| j.queue.as_deref().unwrap_or(DEFAULT_QUEUE))
        .collect();
    let queue_api = Api::<TrainingQueue>::all(client.clone());
    for queue in &queues {
        // Every queue may use the whole cluster: the trace says nothing of quotas.
        let object = workload::training_queue(queue, total_gpus)?;
        queue_api
            .patch(
                queue,
                &PatchParams::apply("loadtest").force(),
                &Patch::Apply(&object),
            )
            .await
            .with_context(|| format!("applying TrainingQueue {queue}"))?;
    }
    settle(&js, Duration::from_secs(60)).await;

    let wall_start = Instant::now();
    let deadline = wall_start + Duration::from_secs(args.timeout_seconds);
    let api = Api::<TrainingJob>::namespaced(client.clone(), NAMESPACE);
    let origin = clock.now();
    let mut submitted = Vec::with_capacity(jobs.len());
    let mut lags = Vec::with_capacity(jobs.len());
    eprintln!(
        "replaying {} jobs of {name} at {}× ({} nodes × {} GPUs)",
        jobs.len(),
        args.speed,
        args.nodes,
        args.gpus_per_node
    );
    for (job, layout) in jobs.iter().zip(layouts) {
        let at = origin + job.submit_seconds;
        tokio::time::sleep(clock.real(at - clock.now())).await;
        if Instant::now() >= deadline {
            eprintln!("warning: --timeout reached during submission");
            break;
        }
        let (epochs, seconds_per_epoch) =
            workload::epochs_for(job.duration_seconds, args.epoch_seconds, MAX_EPOCHS);
        let queue = job
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_owned());
        let shape = JobShape {
            model: job.model.clone(),
            workers: layout.workers,
            gpus_per_worker: layout.gpus_per_worker,
            epochs,
            seconds_per_epoch: Some(seconds_per_epoch),
            queue: Some(queue.clone()),
        };
        let object_name = workload::object_name(name, &job.id);
        let mut object = workload::training_job(NAMESPACE, &object_name, &shape)?;
        if args.checkpoint_every > 0 {
            object.spec.checkpoint = Some(serde_json::from_value(serde_json::json!({
                "enabled": true,
                // A job shorter than the interval saves once, at its end.
                "frequency": args.checkpoint_every.min(epochs),
                "storage": {"type": "s3", "s3Bucket": "trace"},
                "retention": {"keepLast": 2},
            }))?);
        }
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating TrainingJob {object_name}"))?;
        lags.push(clock.now() - at);
        submitted.push(Submitted {
            key: format!("{NAMESPACE}/{object_name}"),
            queue,
            gpus: layout.workers * layout.gpus_per_worker,
            at,
        });
    }
    let mut done = false;
    while !done && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        done = all_finished(&api, &submitted).await;
    }
    let wall_seconds = wall_start.elapsed().as_secs_f64();
    let checkpoints = if args.checkpoint_every > 0 {
        let metrics = stack.metrics(Service::CheckpointManager).await?;
        let verifications = "trainyard_checkpoint_verifications_total";
        Some(CheckpointCounts {
            verified: counter(&metrics, verifications, "outcome=\"verified\""),
            incomplete: counter(&metrics, verifications, "outcome=\"incomplete\""),
            deleted_by_retention: counter(
                &metrics,
                "trainyard_checkpoint_retention_deleted_total",
                "",
            ),
        })
    } else {
        None
    };
    let processes = stack.stats();
    let history = runner::lock(&simulator.cluster).history().clone();

    let records = workload::job_records(&submitted, &history);
    let trainyard = report::build_report(&records, total_gpus, args.step)?;
    let fifo_jobs: Vec<FifoJob> = jobs
        .iter()
        .zip(layouts)
        .map(|(job, layout)| FifoJob {
            name: job.id.clone(),
            queue: job
                .queue
                .clone()
                .unwrap_or_else(|| DEFAULT_QUEUE.to_owned()),
            submitted: job.submit_seconds,
            duration: job.duration_seconds,
            workers: layout.workers,
            gpus_per_worker: layout.gpus_per_worker,
        })
        .collect();
    let fifo_records = fifo::fifo_records(&fifo_jobs, args.nodes as usize, args.gpus_per_node);
    let fifo_reference = report::build_report(&fifo_records, total_gpus, args.step)?;
    let lag = SortedSamples::new(lags);
    let resolution = Resolution {
        speed: args.speed,
        allocator_cycle_simulated_seconds: args.cycle_ms as f64 / 1000.0 * args.speed,
        simulator_tick_simulated_seconds: tick as f64 / 1000.0 * args.speed,
        submit_lag_p50_seconds: lag.percentile(50.0),
        submit_lag_max_seconds: lag.max(),
        min_queueing_seconds: records
            .iter()
            .filter_map(|r| r.started.map(|s| s - r.submitted))
            .reduce(f64::min),
    };
    Ok(ReplayOutput {
        trace: args.trace.display().to_string(),
        jobs: jobs.len(),
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        wall_seconds,
        timed_out: !done,
        resolution,
        trainyard,
        fifo_reference,
        processes,
        checkpoints,
    })
}

/// Whether every submitted TrainingJob is Completed or Failed.
async fn all_finished(api: &Api<TrainingJob>, submitted: &[Submitted]) -> bool {
    let Ok(list) = api.list(&ListParams::default()).await else {
        return false;
    };
    let terminal: BTreeMap<String, bool> = list
        .items
        .iter()
        .map(|j| {
            let state = j.status.as_ref().and_then(|s| s.state);
            (
                format!("{NAMESPACE}/{}", kube::ResourceExt::name_any(j)),
                state.is_some_and(|s| s.is_terminal()),
            )
        })
        .collect();
    submitted
        .iter()
        .all(|s| terminal.get(&s.key).copied().unwrap_or(false))
}

/// Waits (at most `limit`) until every service has handled the start-up
/// messages (node events, queues), so the replay starts on an idle stack.
async fn settle(js: &jetstream::Context, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if stack::consumers_idle(js, &Service::ALL).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("warning: the stack was still busy after {limit:?}; replaying anyway");
}

fn seconds(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |s| format!("{s:.1} s"))
}

fn print_output(o: &ReplayOutput) {
    println!(
        "\ntrace replay: {} ({} jobs) on {} nodes × {} GPUs, {:.1} s wall{}",
        o.trace,
        o.jobs,
        o.nodes,
        o.gpus_per_node,
        o.wall_seconds,
        if o.timed_out { " (TIMED OUT)" } else { "" }
    );
    println!("\nTrainyard (simulated seconds):");
    print!("{}", report::render_table(&o.trainyard));
    println!("\nstrict FIFO reference, best-fit packing, no system delays:");
    print!("{}", report::render_table(&o.fifo_reference));
    let r = &o.resolution;
    println!(
        "\ntime resolution at {}×: allocator cycle {:.1} s, simulator tick {:.1} s; submit lag p50 {} max {}; smallest queueing delay {}",
        r.speed,
        r.allocator_cycle_simulated_seconds,
        r.simulator_tick_simulated_seconds,
        seconds(r.submit_lag_p50_seconds),
        seconds(r.submit_lag_max_seconds),
        seconds(r.min_queueing_seconds),
    );
    if let Some(c) = &o.checkpoints {
        println!(
            "\ncheckpoints: {} reports verified, {} incomplete (killed saves), {} deleted by retention",
            c.verified, c.incomplete, c.deleted_by_retention
        );
    }
    println!("\n{:<20} {:>12} {:>14}", "process", "CPU s", "peak RSS MiB");
    for p in &o.processes {
        println!(
            "{:<20} {:>12.2} {:>14.1}",
            p.name,
            p.cpu_seconds,
            p.peak_rss_bytes as f64 / (1024.0 * 1024.0)
        );
    }
}
