//! The planner's memory under one long job: the whole stack as processes
//! (release builds of the seven services, the simulator, one nats-server),
//! one TrainingJob of `--epochs` (20,000) epochs of one simulated second
//! each, so its workers report progress every simulated second, for
//! `--simulated-seconds` (3,600). The planner's resident-set high-water mark
//! and the largest value in its state bucket (`trainyard_planner`) are read
//! after `--warmup-seconds` of simulated training and again at the end:
//! what grows with the job's history, and by how much.
//!
//! Prints a table and one JSON line; bounded by the run's simulated length
//! and `--timeout-seconds`; asserts nothing.
//!
//! Usage: `planner_memory [--epochs 20000] [--simulated-seconds 3600]
//! [--warmup-seconds 300] [--speed 60] [--sample-every 10]
//! [--timeout-seconds 600] [--bin-dir DIR]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use clap::Parser;
use futures::TryStreamExt;
use kube::Api;
use kube::api::PostParams;
use serde::Serialize;
use trainyard_api::TrainingJob;
use trainyard_contracts::Service;
use trainyard_contracts::streams::Bucket;
use trainyard_loadtest::stack::{self, Stack};
use trainyard_loadtest::workload::{self, JobShape};
use trainyard_loadtest::{chaos, positive};

/// Namespace of the job.
const NAMESPACE: &str = "memory";
/// Name of the job.
const JOB: &str = "long-job";

#[derive(Parser)]
struct Args {
    /// Epochs of the job: it must still be running at the end.
    #[arg(long, default_value_t = 20_000)]
    epochs: u32,
    /// Simulated seconds of training measured (one report per second).
    #[arg(long, default_value_t = 3600.0, value_parser = positive)]
    simulated_seconds: f64,
    /// Simulated seconds of training before the first reading.
    #[arg(long, default_value_t = 300.0, value_parser = positive)]
    warmup_seconds: f64,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    speed: f64,
    /// Real seconds between the samples of the growth curve.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    sample_every: f64,
    /// Give up waiting for the job to start or report after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// Where the release binaries are.
    #[arg(long, default_value_os_t = stack::default_bin_dir())]
    bin_dir: PathBuf,
}

/// One reading of the planner.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Real seconds since the warm-up reading.
    at_seconds: f64,
    /// The job's epoch, from the planner's state.
    epoch: Option<u64>,
    peak_rss_bytes: u64,
    largest_state_bytes: usize,
    /// Worker reports the planner has handled, from its `/metrics`.
    reports_handled: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    epochs: u32,
    simulated_seconds: f64,
    speed: f64,
    warmup: Sample,
    end: Sample,
    rss_growth_bytes: i64,
    samples: Vec<Sample>,
    /// Services whose process ended by itself during the run.
    exited: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.warmup_seconds >= args.simulated_seconds {
        bail!("--warmup-seconds must be shorter than --simulated-seconds");
    }
    if f64::from(args.epochs) <= args.simulated_seconds {
        bail!("--epochs must outlast --simulated-seconds (one epoch per simulated second)");
    }
    let mut stack = Stack::new(&args.bin_dir, "warn")?;
    let outcome = tokio::select! {
        outcome = run(&args, &mut stack) => outcome,
        interrupted = stack::interrupted() => {
            interrupted.context("listening for Ctrl-C")?;
            Err(anyhow::anyhow!("interrupted"))
        }
    };
    if outcome.is_err() {
        stack.keep_work_dir();
    }
    stack.stop(Duration::from_secs(10)).await;
    let report = outcome?;
    print_table(&report);
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn run(args: &Args, stack: &mut Stack) -> anyhow::Result<Report> {
    stack.start_nats(None).await?;
    let nats = stack.connect().await?;
    let js = jetstream::new(nats);
    let cluster = workload::cluster_config(1, 8, args.speed);
    let kubeconfig = stack
        .start_simulator(&yaml_serde::to_string(&cluster)?)
        .await?;
    stack.start_services(&kubeconfig.to_string_lossy(), 200)?;
    stack.wait_ready(Duration::from_secs(60)).await?;
    let client = stack::kube_client(&std::fs::read_to_string(&kubeconfig)?).await?;
    chaos::apply_queue(&client, 8).await?;
    stack::settle(&js, Duration::from_secs(60)).await;

    let shape = JobShape {
        model: "bert-base".into(),
        workers: 1,
        gpus_per_worker: 1,
        epochs: args.epochs,
        seconds_per_epoch: Some(1.0),
        queue: None,
    };
    let job = workload::training_job(NAMESPACE, JOB, &shape)?;
    Api::<TrainingJob>::namespaced(client, NAMESPACE)
        .create(&PostParams::default(), &job)
        .await
        .context("creating the TrainingJob")?;
    let state = js
        .get_key_value(Bucket::Planner.name())
        .await
        .context("the planner's state bucket")?;
    eprintln!(
        "one job of {} one-second epochs at {}x; work dir {}",
        args.epochs,
        args.speed,
        stack.work_dir().display()
    );

    let timeout = Duration::from_secs(args.timeout_seconds);
    let warmup_epoch = args.warmup_seconds as u64;
    wait_for_epoch(stack, &state, warmup_epoch, timeout).await?;
    let started = Instant::now();
    let warmup = sample(stack, &state, started).await?;
    let end_epoch = args.simulated_seconds as u64;
    let mut samples = vec![warmup.clone()];
    loop {
        tokio::time::sleep(Duration::from_secs_f64(args.sample_every)).await;
        let now = sample(stack, &state, started).await?;
        let done = now.epoch.is_some_and(|e| e >= end_epoch);
        samples.push(now);
        if done {
            break;
        }
        if started.elapsed()
            > timeout + Duration::from_secs_f64(args.simulated_seconds / args.speed)
        {
            bail!("the job did not reach epoch {end_epoch} in time");
        }
    }
    let end = samples.last().cloned().unwrap_or_else(|| warmup.clone());
    Ok(Report {
        epochs: args.epochs,
        simulated_seconds: args.simulated_seconds,
        speed: args.speed,
        rss_growth_bytes: end.peak_rss_bytes as i64 - warmup.peak_rss_bytes as i64,
        warmup,
        end,
        samples,
        exited: stack.exited(),
    })
}

/// Waits until the planner's state has the job at `epoch` or later.
async fn wait_for_epoch(
    stack: &Stack,
    state: &jetstream::kv::Store,
    epoch: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let (reached, _) = job_state(state).await?;
        if reached.is_some_and(|e| e >= epoch) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the job did not reach epoch {epoch} within {limit:?} (work dir {})",
                stack.work_dir().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The job's epoch in the planner's state and the largest value the
/// bucket holds.
async fn job_state(state: &jetstream::kv::Store) -> anyhow::Result<(Option<u64>, usize)> {
    let keys: Vec<String> = state.keys().await?.try_collect().await?;
    let mut epoch = None;
    let mut largest = 0;
    for key in keys {
        let Some(value) = state.get(&key).await? else {
            continue;
        };
        largest = largest.max(value.len());
        if key.contains(JOB) {
            epoch = serde_json::from_slice::<serde_json::Value>(&value)
                .ok()
                .as_ref()
                .and_then(epoch_of);
        }
    }
    Ok((epoch, largest))
}

/// The newest epoch a planner state value records (`progress.epoch`).
fn epoch_of(state: &serde_json::Value) -> Option<u64> {
    state
        .pointer("/progress/epoch")
        .and_then(serde_json::Value::as_u64)
}

async fn sample(
    stack: &Stack,
    state: &jetstream::kv::Store,
    since: Instant,
) -> anyhow::Result<Sample> {
    let (epoch, largest_state_bytes) = job_state(state).await?;
    let planner = stack
        .stats()
        .into_iter()
        .find(|p| p.name == Service::Planner.name())
        .context("the planner is not running")?;
    let reports_handled = stack
        .metrics(Service::Planner)
        .await
        .ok()
        .map(|m| worker_reports_handled(&m));
    Ok(Sample {
        at_seconds: since.elapsed().as_secs_f64(),
        epoch,
        peak_rss_bytes: planner.peak_rss_bytes,
        largest_state_bytes,
        reports_handled,
    })
}

/// Worker reports the planner handled, whatever the outcome.
fn worker_reports_handled(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("trainyard_messages_handled_total{consumer=\"planner-worker\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn print_table(report: &Report) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "| reading | epoch | planner peak RSS (MiB) | largest planner state value (KiB) | worker reports handled |"
    );
    println!("|---|---|---|---|---|");
    for (name, s) in [("after warm-up", &report.warmup), ("end", &report.end)] {
        println!(
            "| {name} | {} | {:.1} | {:.1} | {} |",
            s.epoch.map_or("-".into(), |e| e.to_string()),
            mib(s.peak_rss_bytes),
            s.largest_state_bytes as f64 / 1024.0,
            s.reports_handled.map_or("-".into(), |r| format!("{r:.0}")),
        );
    }
    println!(
        "planner RSS growth over {:.0} simulated seconds: {:+.2} MiB; services exited: {}",
        report.simulated_seconds,
        report.rss_growth_bytes as f64 / (1024.0 * 1024.0),
        if report.exited.is_empty() {
            "none".to_string()
        } else {
            report.exited.join(", ")
        }
    );
}
