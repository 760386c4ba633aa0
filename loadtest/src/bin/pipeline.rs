//! Pipeline load test: N TrainingJobs through the whole stack, every service
//! a separate release process, against a simulated cluster of M nodes (also a
//! process). Prints submit→Job-applied and submit→Running latency, messages/s
//! through JetStream, and each process's CPU seconds and peak RSS, beside the
//! pipeline's latency and footprint targets; asserts nothing.
//!
//! ```text
//! pipeline [--jobs 1000] [--nodes 500] [--gpus-per-node 8] [--epochs 3]
//!     [--rate JOBS_PER_S] [--speed 100] [--timeout 300] [--cycle-ms 500]
//!     [--nats-max-payload BYTES] [--bin-dir DIR]
//!     [--json loadtest/out/pipeline.json]
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use async_nats::jetstream;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_contracts::subject::{self, Family};
use trainyard_contracts::{Service, streams};
use trainyard_loadtest::latency::{LatencyRecorder, LatencySummary};
use trainyard_loadtest::positive;
use trainyard_loadtest::stack::{self, ProcessStats, Stack};
use trainyard_loadtest::throughput::{self, CounterSample};
use trainyard_loadtest::workload::{self, JobShape};

const NAMESPACE: &str = "default";
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
const TARGET_P99_MS: f64 = 50.0;
const TARGET_EVENTS_PER_S: f64 = 2000.0;
const TARGET_RSS_MIB: f64 = 64.0;

/// Submits N TrainingJobs through the whole stack on a simulated cluster and
/// reports latencies, message rates and each service's CPU and memory.
#[derive(Parser)]
struct Args {
    /// TrainingJobs to submit (1 worker × 1 GPU each).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: u32,
    /// Simulated nodes.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    gpus_per_node: u32,
    /// Epochs per job.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    epochs: u32,
    /// Jobs submitted per second; unset: as fast as the API answers.
    #[arg(long, value_parser = positive)]
    rate: Option<f64>,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 100.0, value_parser = positive)]
    speed: f64,
    /// Give up after this many seconds.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 300)]
    timeout_seconds: u64,
    /// The gpu-allocator's cycle interval.
    #[arg(long, default_value_t = 500)]
    cycle_ms: u64,
    /// The services' `RUST_LOG` filter; when given, their logs are kept.
    #[arg(long)]
    log: Option<String>,
    /// NATS server max_payload in bytes; unset: the server's default (1 MiB).
    #[arg(long)]
    nats_max_payload: Option<u64>,
    /// Where the release binaries are.
    #[arg(long, default_value_os_t = stack::default_bin_dir())]
    bin_dir: PathBuf,
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("out/pipeline.json"))]
    json: PathBuf,
}

/// When each job reached each stage, as first seen through the API.
#[derive(Default)]
struct Seen {
    /// The watcher's first `trainingjob.changed` about the job, seen on NATS.
    published: HashMap<String, Instant>,
    job_applied: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
    finished: HashMap<String, (Instant, bool)>,
}

#[derive(Serialize)]
struct StreamRate {
    messages: u64,
    per_second: f64,
}

#[derive(Serialize)]
struct EventsRates {
    /// Messages the watcher published to the EVENTS stream per second of the run.
    published_per_second: f64,
    /// Deliveries the planner acknowledged on its EVENTS consumers per second of the run.
    planner_per_second: f64,
    /// The same, counting only the intervals in which the planner had a backlog.
    planner_busy_per_second: Option<f64>,
    planner_busy_seconds: f64,
    /// Best planner rate over any 1-second window.
    planner_peak_1s_per_second: Option<f64>,
    planner_acked: u64,
}

/// Messages a planner consumer handled, its mean time per message and the
/// mean wait from publication to handling (the planner's own
/// `trainyard_handle_seconds` and `trainyard_message_age_seconds`, since start).
#[derive(Serialize)]
struct HandleTime {
    handled: f64,
    mean_ms: f64,
    mean_wait_ms: f64,
}

#[derive(Serialize)]
struct PipelineReport {
    unix_time: u64,
    cpus: usize,
    jobs: u32,
    nodes: u32,
    gpus_per_node: u32,
    epochs: u32,
    speed: f64,
    rate: Option<f64>,
    allocator_cycle_ms: u64,
    nats_max_payload: Option<u64>,
    submit_seconds: f64,
    run_seconds: f64,
    published: Option<LatencySummary>,
    job_applied: Option<LatencySummary>,
    running: Option<LatencySummary>,
    jobs_applied: usize,
    jobs_running: usize,
    jobs_succeeded: usize,
    jobs_failed: usize,
    streams: BTreeMap<&'static str, StreamRate>,
    total: StreamRate,
    events: EventsRates,
    planner_handle: BTreeMap<String, HandleTime>,
    /// The planner's `trainyard_planner_actions_total`, by action.
    planner_actions: BTreeMap<String, f64>,
    /// The planner's answers to workers' NATS connections
    /// (`trainyard_planner_worker_auth_total`), by outcome.
    worker_auth: BTreeMap<String, f64>,
    processes: Vec<ProcessStats>,
    timed_out: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut stack = Stack::new(&args.bin_dir, args.log.as_deref().unwrap_or("warn"))?;
    let outcome = tokio::select! {
        report = run(&args, &mut stack) => report,
        signal = stack::interrupted() => match signal {
            Ok(()) => Err(anyhow!("interrupted")),
            Err(err) => Err(anyhow!("cannot listen for Ctrl-C: {err}")),
        },
    };
    // Logs of a failed or timed-out run are kept to find out why.
    if args.log.is_some() || outcome.as_ref().map_or(true, |r| r.timed_out) {
        stack.keep_work_dir();
    }
    stack.stop(Duration::from_secs(10)).await;
    let report = outcome?;
    print_report(&report);
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", args.json.display()))?;
    println!("JSON: {}", args.json.display());
    Ok(())
}

async fn run(args: &Args, stack: &mut Stack) -> anyhow::Result<PipelineReport> {
    stack.start_nats(args.nats_max_payload).await?;
    let cluster = workload::cluster_config(args.nodes, args.gpus_per_node, args.speed);
    let total_gpus = args.nodes * args.gpus_per_node;
    let kubeconfig = stack
        .start_simulator(&yaml_serde::to_string(&cluster)?)
        .await?;
    let kubeconfig_path = kubeconfig.to_string_lossy().into_owned();
    stack.start_services(&kubeconfig_path, args.cycle_ms)?;
    stack.wait_ready(Duration::from_secs(60)).await?;
    eprintln!(
        "stack ready ({} nodes, {total_gpus} GPUs); work dir {}",
        args.nodes,
        stack.work_dir().display()
    );
    let client = stack::kube_client(&std::fs::read_to_string(&kubeconfig)?).await?;
    let nats = stack.connect().await?;
    let js = jetstream::new(nats.clone());
    let queue = workload::training_queue("default", total_gpus)?;
    Api::<trainyard_api::TrainingQueue>::all(client.clone())
        .patch(
            "default",
            &PatchParams::apply("loadtest").force(),
            &Patch::Apply(&queue),
        )
        .await
        .context("applying the TrainingQueue")?;
    stack::settle(&js, Duration::from_secs(60)).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = CancellationToken::new();
    let (jobs_ready, trainingjobs_ready) = (
        watch_jobs(client.clone(), seen.clone(), stop.clone()),
        watch_trainingjobs(client.clone(), seen.clone(), stop.clone()),
    );
    jobs_ready
        .await
        .context("Job watch ended before it started")?;
    trainingjobs_ready
        .await
        .context("TrainingJob watch ended before it started")?;
    watch_published(&nats, seen.clone(), stop.clone()).await?;

    let start = Instant::now();
    let sampler = tokio::spawn(sample_counters(js.clone(), start, stop.clone()));
    let deadline = start + Duration::from_secs(args.timeout_seconds);
    let submitted = submit(args, &client, start, deadline).await?;
    let submit_seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "submitted {} TrainingJobs in {submit_seconds:.2} s",
        submitted.len()
    );
    let everything_done = || {
        let seen = lock(&seen);
        submitted
            .keys()
            .all(|n| seen.running.contains_key(n) && seen.finished.contains_key(n))
    };
    while !everything_done() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last status updates are still flowing when the last job ends.
    while !stack::consumers_idle(&js, &Service::ALL).await && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let timed_out = Instant::now() >= deadline;
    let run_seconds = start.elapsed().as_secs_f64();
    // Read before anything stops: peak RSS and CPU time so far.
    let processes = stack.stats();
    let (planner_handle, planner_actions, worker_auth) = planner_figures(stack).await;
    stop.cancel();
    let samples = sampler.await.context("sampler")?;

    let seen = lock(&seen);
    let mut published = LatencyRecorder::new();
    let mut applied = LatencyRecorder::new();
    let mut running = LatencyRecorder::new();
    for (name, at) in &submitted {
        if let Some(t) = seen.published.get(name) {
            published.record(t.saturating_duration_since(*at));
        }
        if let Some(t) = seen.job_applied.get(name) {
            applied.record(t.saturating_duration_since(*at));
        }
        if let Some(t) = seen.running.get(name) {
            running.record(t.saturating_duration_since(*at));
        }
    }
    let finished = || submitted.keys().filter_map(|n| seen.finished.get(n));
    let (streams, total, events) = rates(&samples)?;
    Ok(PipelineReport {
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        jobs: args.jobs,
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        epochs: args.epochs,
        speed: args.speed,
        rate: args.rate,
        allocator_cycle_ms: args.cycle_ms,
        nats_max_payload: args.nats_max_payload,
        submit_seconds,
        run_seconds,
        published: published.summary(),
        job_applied: applied.summary(),
        running: running.summary(),
        jobs_applied: applied.len(),
        jobs_running: running.len(),
        jobs_succeeded: finished().filter(|(_, ok)| *ok).count(),
        jobs_failed: finished().filter(|(_, ok)| !*ok).count(),
        streams,
        total,
        events,
        planner_handle,
        planner_actions,
        worker_auth,
        processes,
        timed_out,
    })
}

/// Where the planner spends its time, per consumer, and what it did, by
/// action, from its `/metrics`.
type PlannerFigures = (
    BTreeMap<String, HandleTime>,
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
);

async fn planner_figures(stack: &Stack) -> PlannerFigures {
    let metrics = match stack.metrics(Service::Planner).await {
        Ok(metrics) => metrics,
        Err(err) => {
            eprintln!("warning: planner metrics unavailable: {err}");
            return Default::default();
        }
    };
    let worker_auth = ["authorized", "refused", "unanswered"]
        .into_iter()
        .map(|outcome| {
            let series = format!("trainyard_planner_worker_auth_total{{outcome=\"{outcome}\"}}");
            (
                outcome.to_owned(),
                stack::metric_value(&metrics, &series).unwrap_or(0.0),
            )
        })
        .collect();
    let actions = [
        "apply",
        "apply_unchanged",
        "delete_job",
        "timer",
        "command",
        "event",
        "transition",
        "status",
    ]
    .into_iter()
    .filter_map(|action| {
        let series = format!("trainyard_planner_actions_total{{action=\"{action}\"}}");
        Some((action.to_owned(), stack::metric_value(&metrics, &series)?))
    })
    .collect();
    let handle = Service::Planner
        .consumers()
        .into_iter()
        .filter_map(|c| {
            let series = |metric: &str, suffix: &str| {
                stack::metric_value(
                    &metrics,
                    &format!("{metric}_{suffix}{{consumer=\"{}\"}}", c.durable),
                )
            };
            let handle = "trainyard_handle_seconds";
            let age = "trainyard_message_age_seconds";
            let (sum, count) = (series(handle, "sum")?, series(handle, "count")?);
            let (waited, aged) = (series(age, "sum")?, series(age, "count")?);
            (count > 0.0).then(|| {
                (
                    c.durable.clone(),
                    HandleTime {
                        handled: count,
                        mean_ms: sum / count * 1000.0,
                        mean_wait_ms: waited / aged.max(1.0) * 1000.0,
                    },
                )
            })
        })
        .collect();
    (handle, actions, worker_auth)
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    // A panicking watch task cannot leave a half-written map entry.
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records when the watcher's first `trainingjob.changed` about each job
/// reaches NATS (a plain subscription sees what JetStream stores), which
/// splits submit → Job applied into the watcher's part and the planner's.
async fn watch_published(
    nats: &async_nats::Client,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let filter = subject::kind_filter(Family::Events, "trainingjob");
    let mut messages = nats.subscribe(filter).await?;
    nats.flush().await?;
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                message = messages.next() => message,
            };
            let Some(message) = message else { return };
            let now = Instant::now();
            if let Some(parsed) = subject::parse(&message.subject) {
                lock(&seen).published.entry(parsed.name).or_insert(now);
            }
        }
    });
    Ok(())
}

/// Records when each TrainingJob's batch/v1 Job first appears.
fn watch_jobs(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) -> tokio::sync::oneshot::Receiver<()> {
    let api = Api::<Job>::namespaced(client, NAMESPACE);
    stack::watch_objects(
        api,
        watcher::Config::default().labels(LABEL_JOB),
        stop,
        move |job: Job, _deleted, now| {
            if let Some(name) = job.labels().get(LABEL_JOB) {
                lock(&seen).job_applied.entry(name.clone()).or_insert(now);
            }
        },
    )
}

/// Records when each TrainingJob is first seen Running and first seen
/// finished (Completed, or Failed).
fn watch_trainingjobs(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) -> tokio::sync::oneshot::Receiver<()> {
    let api = Api::<TrainingJob>::namespaced(client, NAMESPACE);
    stack::watch_objects(
        api,
        watcher::Config::default(),
        stop,
        move |job: TrainingJob, _deleted, now| {
            let state = job.status.as_ref().and_then(|s| s.state);
            let name = job.name_any();
            let mut seen = lock(&seen);
            match state {
                Some(TrainingJobState::Running) => {
                    seen.running.entry(name).or_insert(now);
                }
                Some(state) if state.is_terminal() => {
                    let ok = state == TrainingJobState::Completed;
                    // A job that finished before Running was seen still ran.
                    seen.running.entry(name.clone()).or_insert(now);
                    seen.finished.entry(name).or_insert((now, ok));
                }
                _ => {}
            }
        },
    )
}

/// Creates the TrainingJobs, as fast as the API answers or at `--rate`;
/// returns when each create call returned, by name.
async fn submit(
    args: &Args,
    client: &Client,
    start: Instant,
    deadline: Instant,
) -> anyhow::Result<HashMap<String, Instant>> {
    let api = Api::<TrainingJob>::namespaced(client.clone(), NAMESPACE);
    let shape = JobShape {
        model: "resnet50".into(),
        workers: 1,
        gpus_per_worker: 1,
        epochs: args.epochs,
        seconds_per_epoch: None,
        queue: None,
    };
    let mut submitted = HashMap::new();
    for i in 0..args.jobs {
        if let Some(rate) = args.rate {
            let at = start + Duration::from_secs_f64(f64::from(i) / rate);
            tokio::time::sleep_until(at.into()).await;
        }
        if Instant::now() >= deadline {
            eprintln!("warning: --timeout reached after {i} submissions");
            break;
        }
        let name = format!("lt-{i:05}");
        let job = workload::training_job(NAMESPACE, &name, &shape)?;
        api.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating TrainingJob {name}"))?;
        submitted.insert(name, Instant::now());
    }
    Ok(submitted)
}

struct CounterSnapshot {
    t: f64,
    streams: BTreeMap<&'static str, u64>,
    planner: stack::ConsumerProgress,
}

/// Every stream's last sequence and the planner's EVENTS consumers, every
/// [`SAMPLE_EVERY`] until `stop` (one last sample after it).
async fn sample_counters(
    js: jetstream::Context,
    start: Instant,
    stop: CancellationToken,
) -> Vec<CounterSnapshot> {
    let mut samples = Vec::new();
    loop {
        let stopping = stop.is_cancelled();
        let t = start.elapsed().as_secs_f64();
        let streams = stack::stream_sequences(&js).await;
        let planner = stack::consumer_progress(&js, Service::Planner, streams::EVENTS).await;
        match (streams, planner) {
            (Ok(streams), Ok(planner)) => samples.push(CounterSnapshot {
                t,
                streams,
                planner,
            }),
            (Err(err), _) | (_, Err(err)) => eprintln!("sampling JetStream: {err}"),
        }
        if stopping {
            return samples;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

type Rates = (BTreeMap<&'static str, StreamRate>, StreamRate, EventsRates);

fn rates(samples: &[CounterSnapshot]) -> anyhow::Result<Rates> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        bail!("no JetStream samples were taken");
    };
    let seconds = (last.t - first.t).max(f64::EPSILON);
    let mut streams = BTreeMap::new();
    let mut total = 0;
    for (name, end) in &last.streams {
        let messages = end.saturating_sub(first.streams.get(name).copied().unwrap_or(0));
        total += messages;
        streams.insert(
            *name,
            StreamRate {
                messages,
                per_second: messages as f64 / seconds,
            },
        );
    }
    let planner: Vec<CounterSample> = samples
        .iter()
        .map(|s| CounterSample {
            t: s.t,
            value: s.planner.acked,
            backlog: s.planner.backlog,
        })
        .collect();
    let busy = throughput::busy_rate(&planner);
    let events = EventsRates {
        published_per_second: streams
            .get(streams::EVENTS.name)
            .map_or(0.0, |s| s.per_second),
        planner_per_second: throughput::average_rate(&planner).unwrap_or(0.0),
        planner_busy_per_second: busy.map(|(rate, _)| rate),
        planner_busy_seconds: busy.map_or(0.0, |(_, s)| s),
        planner_peak_1s_per_second: throughput::peak_rate(&planner, 1.0),
        planner_acked: last.planner.acked.saturating_sub(first.planner.acked),
    };
    Ok((
        streams,
        StreamRate {
            messages: total,
            per_second: total as f64 / seconds,
        },
        events,
    ))
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn print_report(r: &PipelineReport) {
    println!(
        "\npipeline: {} TrainingJobs (1 worker × 1 GPU, {} epochs) on {} nodes × {} GPUs, {} CPUs",
        r.jobs, r.epochs, r.nodes, r.gpus_per_node, r.cpus
    );
    if let Some(bytes) = r.nats_max_payload {
        println!("NATS max_payload raised to {bytes} bytes (default 1 MiB)");
    }
    println!(
        "submitted in {:.2} s ({}); run {:.1} s{}",
        r.submit_seconds,
        r.rate
            .map_or("as fast as the API answers".to_owned(), |x| format!(
                "{x} jobs/s"
            )),
        r.run_seconds,
        if r.timed_out { " (TIMED OUT)" } else { "" }
    );
    println!(
        "jobs: {} Job applied, {} Running, {} succeeded, {} failed",
        r.jobs_applied, r.jobs_running, r.jobs_succeeded, r.jobs_failed
    );
    println!(
        "\n{:<28} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "p50", "p90", "p99", "max"
    );
    for (label, summary) in [
        ("submit → event published", &r.published),
        ("submit → Job applied", &r.job_applied),
        ("submit → Running", &r.running),
    ] {
        match summary {
            Some(s) => println!(
                "{label:<28} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms
            ),
            None => println!("{label:<28} {:>9}", "-"),
        }
    }
    println!(
        "\n{:<28} {:>9} {:>10}",
        "JetStream stream", "messages", "msgs/s"
    );
    for (name, s) in &r.streams {
        println!("{name:<28} {:>9} {:>10.1}", s.messages, s.per_second);
    }
    println!(
        "{:<28} {:>9} {:>10.1}",
        "total", r.total.messages, r.total.per_second
    );
    let e = &r.events;
    println!(
        "\nwatcher → planner (EVENTS): published {:.1}/s; planner acked {} = {:.1}/s over the run, {} while backlogged ({:.1} s), peak 1 s {}",
        e.published_per_second,
        e.planner_acked,
        e.planner_per_second,
        e.planner_busy_per_second
            .map_or("-".to_owned(), |x| format!("{x:.1}/s")),
        e.planner_busy_seconds,
        e.planner_peak_1s_per_second
            .map_or("-".to_owned(), |x| format!("{x:.1}/s")),
    );
    for (consumer, h) in &r.planner_handle {
        println!(
            "planner consumer {consumer}: {} messages, mean {:.2} ms each, waited {:.1} ms on average from publication (since start)",
            h.handled, h.mean_ms, h.mean_wait_ms
        );
    }
    let jobs = f64::from(r.jobs.max(1));
    println!(
        "planner actions per TrainingJob: {}",
        r.planner_actions
            .iter()
            .map(|(action, n)| format!("{action} {:.2}", n / jobs))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let auth = |outcome: &str| r.worker_auth.get(outcome).copied().unwrap_or(0.0);
    println!(
        "NATS authentication on: each service under its own user; worker connections authorized {}, refused {}, unanswered {}",
        auth("authorized"),
        auth("refused"),
        auth("unanswered")
    );
    println!(
        "\n{:<20} {:>8} {:>12} {:>14}",
        "process", "pid", "CPU s", "peak RSS MiB"
    );
    for p in &r.processes {
        println!(
            "{:<20} {:>8} {:>12.2} {:>14.1}",
            p.name,
            p.pid,
            p.cpu_seconds,
            mib(p.peak_rss_bytes)
        );
    }
    println!("\ntargets:");
    if let Some(s) = &r.job_applied {
        println!(
            "  p99 submit → Job applied ≤ {TARGET_P99_MS} ms: {:.1} ms, {}",
            s.p99_ms,
            met(s.p99_ms <= TARGET_P99_MS)
        );
    }
    let best = e.planner_busy_per_second.unwrap_or(e.planner_per_second);
    // A run that offers fewer messages than the target cannot show the
    // capacity: the planner keeps up, so its rate is the offered one.
    let verdict = if best >= TARGET_EVENTS_PER_S {
        met(true)
    } else if e.published_per_second < TARGET_EVENTS_PER_S {
        "not measured: this run offers fewer; run a burst (no --rate)"
    } else {
        met(false)
    };
    println!(
        "  ≥ {TARGET_EVENTS_PER_S} msgs/s sustained watcher → planner: {best:.1}/s while backlogged, {verdict}"
    );
    for p in r.processes.iter().filter(|p| is_service(&p.name)) {
        let rss = mib(p.peak_rss_bytes);
        println!(
            "  {} peak RSS ≤ {TARGET_RSS_MIB} MiB: {rss:.1} MiB, {}",
            p.name,
            met(rss <= TARGET_RSS_MIB)
        );
    }
}

fn is_service(name: &str) -> bool {
    Service::ALL.iter().any(|s| s.name() == name)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
