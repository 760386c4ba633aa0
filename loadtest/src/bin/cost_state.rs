//! The cost-optimizer's state saves under a stream of worker utilisation
//! reports. The service (in this process, on a real nats-server) is told of
//! eight nodes and `--jobs` jobs with `capacityType: any` and their
//! admissions (each message saved before its ack; prints the puts and bytes
//! written); then `--reports` `worker.utilization` reports go out, round
//! robin over the jobs, each round changing every job's utilisation, as fast
//! as JetStream takes them. Prints how long the service took to handle
//! them, the saves (`trainyard_cost_state_saves_total`), puts to
//! the `trainyard_cost` bucket and bytes they wrote (every message on the
//! bucket's subjects, counted as it goes by), and the size of the saved
//! state; then stops the service and prints the puts its shutdown added.
//! Bounded by `--reports` and `--max-wall-secs`; asserts nothing.
//!
//! `cargo run --release -p trainyard-loadtest --bin cost_state -- [--jobs N] [--reports N]`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::cost::{UtilizationReported, WorkerPhase};
use trainyard_contracts::decisions::{AdmissionDecided, WorkerPlacement};
use trainyard_contracts::events::{NodeObserved, TrainingJobChanged};
use trainyard_contracts::permissions::Identity;
use trainyard_contracts::{Bucket, EntityRef, Service};
use trainyard_cost_optimizer::CostConfig;
use trainyard_loadtest::stack::Stack;
use trainyard_runtime::{Publisher, Runtime, Settings};

const CATALOG: &str = r#"
currency: USD
products: [A100]
prices:
  - {product: A100, capacityType: on-demand, pricePerGpuHour: 4.1, effectiveFrom: "2020-01-01T00:00:00Z"}
  - {product: A100, capacityType: spot, pricePerGpuHour: 1.64, effectiveFrom: "2020-01-01T00:00:00Z"}
interruption:
  - {bucket: "5-10%"}
"#;

const NODES: u32 = 8;

#[derive(Parser)]
#[command(about = "The cost-optimizer's state saves under a stream of utilisation reports")]
struct Args {
    /// Running jobs the service knows.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    jobs: u32,
    /// Utilisation reports to send.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    reports: u32,
    /// Gives up waiting for the service after this long.
    #[arg(long, default_value_t = 300)]
    max_wall_secs: u64,
}

/// Messages the service has handled, over all its consumers and outcomes.
fn handled(runtime: &Runtime) -> f64 {
    runtime
        .registry
        .gather()
        .iter()
        .filter(|family| family.name() == "trainyard_messages_handled_total")
        .flat_map(|family| family.get_metric())
        .map(|series| series.get_counter().get_value())
        .sum()
}

/// Saves of the state so far.
fn saves(runtime: &Runtime) -> f64 {
    runtime
        .registry
        .gather()
        .iter()
        .filter(|family| family.name() == "trainyard_cost_state_saves_total")
        .flat_map(|family| family.get_metric())
        .map(|series| series.get_counter().get_value())
        .sum()
}

/// Puts to the bucket so far: its stream's last sequence.
async fn puts(runtime: &Runtime) -> anyhow::Result<u64> {
    let name = format!("KV_{}", Bucket::Cost.name());
    let mut stream = runtime.jetstream.get_stream(&name).await?;
    Ok(stream.info().await?.state.last_sequence)
}

async fn wait_handled(runtime: &Runtime, count: f64, deadline: Instant) -> anyhow::Result<()> {
    while handled(runtime) < count {
        if Instant::now() > deadline {
            bail!(
                "the service handled {} of {count} messages in time",
                handled(runtime)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

fn node(name: &str, capacity: &str) -> anyhow::Result<NodeObserved> {
    Ok(serde_json::from_value(json!({
        "change": "Applied", "allocatableGpus": 8,
        "labels": {"nvidia.com/gpu.product": "A100", "karpenter.sh/capacity-type": capacity,
                   "topology.kubernetes.io/zone": "zone-a", "kubernetes.io/hostname": name},
        "taints": [], "unschedulable": false, "ready": true
    }))?)
}

fn job(name: &str) -> anyhow::Result<TrainingJobChanged> {
    Ok(serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                   "metadata": {"name": name, "namespace": "ml", "uid": name, "generation": 1},
                   "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 1, "gpusPerWorker": 1,
                            "checkpoint": {"enabled": true},
                            "scheduling": {"queue": "team-a", "capacityType": "any", "estimatedRuntimeSeconds": 36000}}}
    }))?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let deadline = Instant::now() + Duration::from_secs(args.max_wall_secs);
    let mut stack = Stack::new(Path::new("."), "warn")?;
    stack.start_nats(None).await?;
    let catalog = stack.work_dir().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).context("writing the price catalog")?;
    let mut settings = Settings {
        nats: stack.nats_settings(&Identity::Service(Service::CostOptimizer))?,
        ..Settings::default()
    };
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime =
        Runtime::start(Service::CostOptimizer, settings, CancellationToken::new()).await?;
    // No accounting run during the measurement: only the reports change the state.
    let config = CostConfig {
        catalog_path: catalog.display().to_string(),
        accounting_interval_seconds: 3600,
        ..CostConfig::default()
    };
    let save_interval = config.state_save_interval_ms;
    trainyard_cost_optimizer::start(&runtime, config).await?;
    // The benchmark speaks for the watcher and the allocator, and watches
    // the bucket, as the operator: the cost-optimizer's own user may do
    // neither.
    let operator_client = stack.connect().await?;
    let operator = async_nats::jetstream::new(operator_client.clone());
    let watcher = Publisher::new(operator.clone(), Service::Watcher, runtime.metrics.clone());
    let allocator = Publisher::new(operator, Service::GpuAllocator, runtime.metrics.clone());
    // Every put to the bucket, as it goes by.
    let mut written = operator_client
        .subscribe(format!("$KV.{}.>", Bucket::Cost.name()))
        .await?;
    let bytes_written = Arc::new(AtomicUsize::new(0));
    let counted = bytes_written.clone();
    let counting = tokio::spawn(async move {
        while let Some(message) = written.next().await {
            counted.fetch_add(message.payload.len(), Ordering::Relaxed);
        }
    });
    let setup_started = Instant::now();
    for i in 0..NODES {
        let (name, capacity) = if i % 2 == 0 {
            (format!("spot-{i}"), "spot")
        } else {
            (format!("od-{i}"), "on-demand")
        };
        let entity = EntityRef::new("", &name, "");
        watcher
            .publish(watcher.envelope(entity, node(&name, capacity)?))
            .await?;
    }
    let entities: Vec<EntityRef> = (0..args.jobs)
        .map(|i| EntityRef::new("ml", format!("job-{i}"), format!("job-{i}")))
        .collect();
    for (i, entity) in entities.iter().enumerate() {
        watcher
            .publish(watcher.envelope(entity.clone(), job(&entity.name)?))
            .await?;
        let admission = AdmissionDecided {
            attempt: 0,
            queue: "team-a".into(),
            flavor: "a100".into(),
            node_selector: Default::default(),
            tolerations: Vec::new(),
            placements: vec![WorkerPlacement {
                index: 0,
                node: format!("spot-{}", (i as u32 % (NODES / 2)) * 2),
                gpus: 1,
            }],
            topology: Default::default(),
            capacity_type_reopened: false,
        };
        allocator
            .publish(allocator.envelope(entity.clone(), admission))
            .await?;
    }
    let setup = f64::from(NODES + 2 * args.jobs);
    wait_handled(&runtime, setup, deadline).await?;
    let setup_took = setup_started.elapsed().as_secs_f64();
    let puts_before = puts(&runtime).await?;
    let saves_before = saves(&runtime);
    let setup_bytes = bytes_written.swap(0, Ordering::Relaxed);
    let bucket = runtime
        .bucket(Bucket::Cost)
        .context("bucket trainyard_cost")?
        .clone();
    let keys: Vec<String> = bucket.keys().await?.try_collect().await?;
    let mut state_bytes = 0;
    for key in &keys {
        state_bytes += bucket.get(key).await?.map_or(0, |v| v.len());
    }

    let started = Instant::now();
    for r in 0..args.reports {
        let entity = entities[(r % args.jobs) as usize].clone();
        let report = UtilizationReported {
            worker_index: 0,
            attempt: 0,
            // Each round of reports changes every job's utilisation.
            gpu_utilization: f64::from((r / args.jobs) % 100) / 100.0,
            phase: WorkerPhase::Training,
        };
        watcher.publish(watcher.envelope(entity, report)).await?;
        if Instant::now() > deadline {
            bail!("sent {r} of {} reports in time", args.reports);
        }
    }
    wait_handled(&runtime, setup + f64::from(args.reports), deadline).await?;
    let took = started.elapsed().as_secs_f64();
    let report_puts = puts(&runtime).await? - puts_before;
    let report_saves = saves(&runtime) - saves_before;
    // Whatever is in flight reaches the subscriber within this.
    tokio::time::sleep(Duration::from_millis(200)).await;
    counting.abort();
    let report_bytes = bytes_written.load(Ordering::Relaxed);
    runtime.shutdown.cancel();
    let pre_shutdown = puts_before + report_puts;
    let js = runtime.jetstream.clone();
    runtime.run_until_shutdown().await?;
    let mut stream = js.get_stream(format!("KV_{}", Bucket::Cost.name())).await?;
    let shutdown_puts = stream.info().await?.state.last_sequence - pre_shutdown;

    println!(
        "cost-optimizer state saves: {} running jobs, {} utilisation reports, state_save_interval_ms {save_interval}",
        args.jobs, args.reports
    );
    println!(
        "  setup                   {setup} messages (nodes, jobs, admissions) in {setup_took:.2} s, each saved before its ack: {puts_before} puts, {:.3} MB written",
        setup_bytes as f64 / 1e6
    );
    println!(
        "  saved state             {state_bytes} bytes in {} values",
        keys.len()
    );
    println!(
        "  reports handled in      {took:.2} s ({:.0} reports/s, sending included)",
        f64::from(args.reports) / took
    );
    println!(
        "  saves                   {report_saves} ({:.4} per report)",
        report_saves / f64::from(args.reports)
    );
    println!(
        "  bucket puts             {report_puts} ({:.3} per report, {:.3} MB written)",
        report_puts as f64 / f64::from(args.reports),
        report_bytes as f64 / 1e6
    );
    println!("  puts at shutdown        {shutdown_puts}");
    stack.stop(Duration::from_secs(5)).await;
    Ok(())
}
