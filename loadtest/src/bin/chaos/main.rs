//! Chaos runs: the whole stack as processes on the simulated cluster while a
//! service is killed (SIGKILL at random moments, and aborts at named crash
//! points, `trainyard_runtime::crash_point`) and started again, while
//! the simulated API server fails and stalls writes, or while NATS nodes of a
//! three-node cluster are killed. Afterwards it counts what the reliability
//! targets name (see `trainyard_loadtest::chaos`): lost, failed and
//! duplicated work, over-admission, re-suspended Jobs, state flaps, dead
//! letters by consumer and category, services that exited by themselves,
//! and recovery: from a killed service's new process start until it is ready
//! and, for the planner and the gpu-allocator, holds its lease again.
//!
//! Prints a table, one row per scenario, and writes JSON; asserts nothing.
//!
//! ```text
//! chaos [--scenario planner-kill|allocator-kill|api-faults|fuzz|replicas|nats-cluster|api-stall|all]
//!     [--jobs N] [--kills N] [--kill-every SECONDS] [--submit-over SECONDS]
//!     [--fault-seconds 300] [--stall-seconds 60] [--nodes 8] [--gpus-per-node 8]
//!     [--speed 60] [--seed 1] [--timeout 900] [--log FILTER]
//!     [--bin-dir DIR] [--json loadtest/out/chaos.json]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use clap::{Parser, ValueEnum};
use futures::TryStreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use trainyard_contracts::Service;
use trainyard_loadtest::chaos::{self, Counts, HIGH, LOW, Observer, fuzz, leading_again};
use trainyard_loadtest::latency::{LatencyRecorder, LatencySummary};
use trainyard_loadtest::positive;
use trainyard_loadtest::stack::{self, Stack, Stop};
use trainyard_loadtest::workload::{self, JobShape};
use trainyard_simulator::faults::ApiFaultConfig;

use fuzz::FuzzOutcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// Kill the planner (20 kills during 200 jobs): in turn a SIGKILL at a
    /// random moment and an abort after handling a message and before its
    /// ack, on each of its consumers.
    PlannerKill,
    /// Kill the gpu-allocator (50 kills during 500 jobs of mixed priority,
    /// so that some are preempted): in turn a SIGKILL at a random moment and
    /// an abort mid-cycle, after a save and after a publish.
    AllocatorKill,
    /// 20 % of API writes fail with 409/429/500/503 and 1 % stall 5 s.
    ApiFaults,
    /// Bad envelopes of seven kinds (random bytes, truncated JSON, invalid
    /// UTF-8, deep nesting, no entity, an unknown schema version, another
    /// type's payload) on the subject of every message type, among 200 jobs.
    Fuzz,
    /// Two replicas of every service deploy/ runs twice (all but the
    /// watcher), restarted one replica at a time with SIGTERM as a rolling
    /// update does (36 restarts: three rounds over the twelve replicas,
    /// during 200 jobs).
    Replicas,
    /// NATS as a three-node cluster with every stream on three replicas:
    /// during a burst of 1,000 jobs the node leading the most streams is
    /// SIGKILLed twice (started again 10 s later each time), then all three
    /// nodes are killed and started again.
    NatsCluster,
    /// 20 % of API writes fail with 409/429/500/503 for `--fault-seconds`
    /// (300), then the API server stalls every request for
    /// `--stall-seconds` (60).
    ApiStall,
    /// The worker-report stream limited to `--stream-max-bytes` (256 KiB),
    /// so it discards old progress reports throughout, during 200 jobs.
    StoragePressure,
    /// Each of the above in turn, each on a fresh stack.
    All,
}

impl Scenario {
    fn target(self) -> Option<Service> {
        match self {
            Self::PlannerKill => Some(Service::Planner),
            Self::AllocatorKill => Some(Service::GpuAllocator),
            _ => None,
        }
    }

    /// Jobs and kills when not given on the command line.
    fn defaults(self) -> (u32, u32) {
        match self {
            Self::PlannerKill => (200, 20),
            Self::AllocatorKill => (500, 50),
            Self::Replicas => (200, 36),
            // Two leader kills, then the three nodes.
            Self::NatsCluster => (1000, 5),
            Self::ApiStall => (300, 0),
            Self::StoragePressure => (200, 0),
            Self::ApiFaults | Self::Fuzz | Self::All => (200, 0),
        }
    }
}

/// Runs the stack under faults and counts lost and duplicated work.
#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// TrainingJobs to submit; default per scenario (200, 500, 200, 1,000, 300).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: Option<u32>,
    /// Kills of the scenario's service (20, 50), or replica restarts (36).
    #[arg(long)]
    kills: Option<u32>,
    /// Mean seconds between kills (each gap drawn from 0.5× to 1.5× of it);
    /// the jobs are submitted evenly over kills × this.
    #[arg(long, default_value_t = 3.0, value_parser = positive)]
    kill_every: f64,
    /// Seconds over which the jobs are submitted when nothing is killed
    /// (nats-cluster: the burst, default 30 s).
    #[arg(long, value_parser = positive)]
    submit_over: Option<f64>,
    /// api-stall: seconds of API write faults before the stall.
    #[arg(long, default_value_t = 300.0, value_parser = positive)]
    fault_seconds: f64,
    /// api-stall: seconds the API server stalls every request.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    stall_seconds: f64,
    /// storage-pressure: byte limit of the worker-report stream.
    #[arg(long, default_value_t = 262_144)]
    stream_max_bytes: u64,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(8..))]
    gpus_per_node: u32,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    speed: f64,
    /// Seed of the workload, the kill times and the API faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up draining a scenario after this many seconds.
    #[arg(long = "timeout", value_name = "SECONDS", default_value_t = 900)]
    timeout_seconds: u64,
    /// The services' `RUST_LOG` filter.
    #[arg(long, default_value = "warn")]
    log: String,
    /// Where the release binaries are.
    #[arg(long, default_value_os_t = stack::default_bin_dir())]
    bin_dir: PathBuf,
    #[arg(long, default_value_os_t = Path::new(env!("CARGO_MANIFEST_DIR")).join("out/chaos.json"))]
    json: PathBuf,
}

#[derive(Serialize)]
struct ScenarioReport {
    scenario: Scenario,
    jobs: u32,
    kills: u32,
    nodes: u32,
    gpus_per_node: u32,
    speed: f64,
    seed: u64,
    run_seconds: f64,
    #[serde(flatten)]
    counts: Counts,
    dead_letters: BTreeMap<String, u64>,
    /// Fuzz: what was published and what became of it.
    fuzz: Option<FuzzOutcome>,
    /// NATS cluster and API stall: what the outage left behind.
    outage: Option<Outage>,
    /// Storage pressure: per stream, the fullest it was (bytes over its
    /// limit, `TrainyardStreamNearLimit`'s expression; it fires above 0.8),
    /// from the planner's `/metrics` every second.
    stream_fullness: Option<BTreeMap<String, f64>>,
    /// Services whose process exited (a panic, an abort) during the run.
    exited: Vec<String>,
    /// Kills aimed at crash points, by point.
    aimed_kills: BTreeMap<String, AimedKills>,
    /// Allocator kills: restarts that did not restore the last snapshot.
    restarts_without_snapshot: Option<u32>,
    recovery: Option<LatencySummary>,
    timed_out: bool,
}

/// How the stack came back from an outage of NATS or the API server.
#[derive(Debug, Default, Serialize)]
struct Outage {
    /// From NATS (all three nodes) listening again until every service was
    /// ready and the planner and the gpu-allocator held their leases.
    services_back_seconds: Option<f64>,
    /// Services that exited by themselves during the NATS outages (a
    /// service whose lease ran out while NATS was unreachable shuts down)
    /// and were started again, as Kubernetes restarts a pod's container.
    service_exits: Vec<String>,
    /// Messages the streams hold that some consumer has not acknowledged
    /// after the drain (a message neither handled nor dead-lettered).
    unhandled_messages: u64,
    /// API stall: TrainingJobs not finished when the stall ended, and the
    /// longest any of them took to change state (or finish) after it; jobs
    /// that never changed again.
    unfinished_at_stall_end: usize,
    slowest_progress_after_stall_seconds: Option<f64>,
    no_progress_after_stall: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scenarios = match args.scenario {
        Scenario::All => vec![
            Scenario::PlannerKill,
            Scenario::AllocatorKill,
            Scenario::ApiFaults,
            Scenario::Fuzz,
            Scenario::Replicas,
            Scenario::NatsCluster,
            Scenario::ApiStall,
            Scenario::StoragePressure,
        ],
        one => vec![one],
    };
    let mut reports = Vec::new();
    for scenario in scenarios {
        let mut stack = Stack::new(&args.bin_dir, &args.log)?;
        let outcome = tokio::select! {
            outcome = run(&args, scenario, &mut stack) => outcome,
            interrupted = stack::interrupted() => {
                interrupted.context("listening for Ctrl-C")?;
                stack.keep_work_dir();
                stack.stop(Duration::from_secs(5)).await;
                bail!("interrupted");
            }
        };
        match outcome {
            Ok(report) => {
                let clean = report.counts.clean()
                    && report.exited.is_empty()
                    && report.restarts_without_snapshot.unwrap_or(0) == 0
                    && (report.dead_letters.is_empty() || report.fuzz.is_some());
                if !clean {
                    stack.keep_work_dir();
                }
                stack.stop(Duration::from_secs(10)).await;
                eprintln!("{}", row(&report));
                reports.push(report);
            }
            Err(err) => {
                stack.keep_work_dir();
                stack.stop(Duration::from_secs(10)).await;
                return Err(err);
            }
        }
    }
    println!("{}", table(&reports));
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&reports)?)?;
    println!("JSON: {}", args.json.display());
    Ok(())
}

async fn run(args: &Args, scenario: Scenario, stack: &mut Stack) -> anyhow::Result<ScenarioReport> {
    let (default_jobs, default_kills) = scenario.defaults();
    let jobs = args.jobs.unwrap_or(default_jobs);
    let kills = match scenario {
        Scenario::PlannerKill | Scenario::AllocatorKill | Scenario::Replicas => {
            args.kills.unwrap_or(default_kills)
        }
        _ => default_kills,
    };
    let mut rng = StdRng::seed_from_u64(args.seed);

    if scenario == Scenario::NatsCluster {
        stack.start_nats_cluster(3, "").await?;
    } else {
        stack.start_nats(None).await?;
    }
    let nats = stack.connect().await?;
    let js = jetstream::new(nats.clone());
    if scenario == Scenario::NatsCluster {
        jetstream_available(&js, Duration::from_secs(60)).await?;
    }
    let mut cluster = workload::cluster_config(args.nodes, args.gpus_per_node, args.speed);
    cluster.priority_classes = [HIGH, LOW]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    match scenario {
        Scenario::ApiFaults => {
            cluster.api_faults = ApiFaultConfig {
                write_error_rate: 0.2,
                write_stall_rate: 0.01,
                stall_seconds: 5.0,
                seed: args.seed,
                ..ApiFaultConfig::default()
            }
        }
        Scenario::ApiStall => {
            cluster.api_faults = ApiFaultConfig {
                write_error_rate: 0.2,
                seed: args.seed,
                fault_seconds: Some(args.fault_seconds),
                full_stall_seconds: args.stall_seconds,
                ..ApiFaultConfig::default()
            }
        }
        _ => {}
    }
    let simulator_started = Instant::now();
    let kubeconfig = stack
        .start_simulator(&yaml_serde::to_string(&cluster)?)
        .await?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let priorities = chaos::allocator_priority_env(stack)?;
    for service in Service::ALL {
        let mut env = stack.service_env(service, &kubeconfig, 200)?;
        if service == Service::GpuAllocator {
            env.push(priorities.clone());
        }
        if scenario == Scenario::NatsCluster {
            env.push(("TRAINYARD_NATS__REPLICAS".to_owned(), "3".to_owned()));
        }
        if scenario == Scenario::StoragePressure {
            env.push((
                "TRAINYARD_NATS__STREAM_MAX_BYTES__WORKER".to_owned(),
                args.stream_max_bytes.to_string(),
            ));
        }
        stack.start_service(service, &env)?;
        if scenario == Scenario::Replicas && service != Service::Watcher {
            stack.start_service_as(&second_replica(service), service, &env)?;
        }
    }
    stack.wait_ready(Duration::from_secs(60)).await?;
    let client = stack::kube_client(&std::fs::read_to_string(&kubeconfig)?).await?;
    chaos::apply_queue(&client, args.nodes * args.gpus_per_node).await?;
    stack::settle(&js, Duration::from_secs(60)).await;

    let observer = Observer::start(&client, args.gpus_per_node).await?;
    eprintln!(
        "{scenario:?}: {jobs} jobs, {kills} kills, {} nodes × {} GPUs; work dir {}",
        args.nodes,
        args.gpus_per_node,
        stack.work_dir().display()
    );

    let start = Instant::now();
    // The API stall's faults run from the simulator's start.
    let fault_window_left = Duration::from_secs_f64(args.fault_seconds)
        .saturating_sub(simulator_started.elapsed())
        .as_secs_f64();
    let window = match scenario {
        Scenario::PlannerKill | Scenario::AllocatorKill | Scenario::Replicas => {
            f64::from(kills) * args.kill_every
        }
        Scenario::NatsCluster => args.submit_over.unwrap_or(30.0),
        Scenario::ApiStall => args.submit_over.unwrap_or(fault_window_left.max(1.0)),
        _ => args.submit_over.unwrap_or(60.0),
    };
    let shapes: Vec<(JobShape, &str)> = (0..jobs)
        .map(|_| chaos::job_shape(&mut rng, args.gpus_per_node))
        .collect();
    let kill_gaps: Vec<Duration> = (0..kills)
        .map(|_| Duration::from_secs_f64(args.kill_every * rng.random_range(0.5..1.5)))
        .collect();
    let pauses: Vec<Duration> = (0..kills)
        .map(|_| Duration::from_millis(rng.random_range(0..1000)))
        .collect();
    let nths: Vec<u32> = (0..kills).map(|_| rng.random_range(1..=5)).collect();
    let mut aimed = BTreeMap::new();
    let mut restarts_without_snapshot = None;
    let bad = if scenario == Scenario::Fuzz {
        fuzz::messages(&mut rng)?
    } else {
        Vec::new()
    };
    let mut outage =
        matches!(scenario, Scenario::NatsCluster | Scenario::ApiStall).then(Outage::default);
    let mut fullness = BTreeMap::new();
    let restarts = async {
        match scenario {
            Scenario::StoragePressure => {
                let until = start + Duration::from_secs_f64(window);
                while Instant::now() < until {
                    sample_fullness(stack, &mut fullness).await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(Vec::new())
            }
            Scenario::Replicas => rolling_restarts(stack, &kill_gaps).await,
            Scenario::NatsCluster => {
                let (recoveries, back, exits) = nats_cluster_faults(stack, &js, window).await?;
                if let Some(outage) = outage.as_mut() {
                    outage.services_back_seconds = Some(back.as_secs_f64());
                    outage.service_exits = exits;
                }
                Ok(recoveries)
            }
            _ => {
                let (recoveries, kills, without_snapshot) =
                    kill_loop(stack, scenario.target(), &kill_gaps, &pauses, &nths).await?;
                aimed = kills;
                restarts_without_snapshot = without_snapshot;
                Ok(recoveries)
            }
        }
    };
    let (recoveries, submitted, published) = tokio::join!(
        restarts,
        chaos::submit(&client, "chaos", &shapes, start, window),
        fuzz::publish(&js, &bad, start, window),
    );
    let recoveries = recoveries?;
    let submitted = submitted?;
    let published = published?;

    let stall_end =
        simulator_started + Duration::from_secs_f64(args.fault_seconds + args.stall_seconds);
    if scenario == Scenario::ApiStall {
        tokio::time::sleep_until(stall_end.into()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let timed_out = observer
        .drain(&js, &submitted, &Service::ALL, deadline)
        .await;
    let run_seconds = start.elapsed().as_secs_f64();
    if scenario == Scenario::StoragePressure {
        sample_fullness(stack, &mut fullness).await;
    }
    if let Some(outage) = outage.as_mut() {
        outage.unhandled_messages = unhandled_messages(&js).await?;
        if scenario == Scenario::ApiStall {
            let progress = observer.progress_after(stall_end, &submitted);
            outage.unfinished_at_stall_end = progress.unfinished;
            outage.slowest_progress_after_stall_seconds = progress.slowest.map(|d| d.as_secs_f64());
            outage.no_progress_after_stall = progress.stuck;
        }
    }
    let letters = chaos::dead_letters(&js).await?;
    let fuzz =
        (scenario == Scenario::Fuzz).then(|| fuzz::outcome(&published, &letters, &Service::ALL));
    let exited = stack.exited();
    let counts = observer.counts(&submitted);
    let mut recovery = LatencyRecorder::new();
    for took in &recoveries {
        recovery.record(*took);
    }
    Ok(ScenarioReport {
        scenario,
        jobs,
        kills,
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        speed: args.speed,
        seed: args.seed,
        run_seconds,
        counts,
        dead_letters: chaos::dead_letter_counts(&letters),
        fuzz,
        outage,
        stream_fullness: (scenario == Scenario::StoragePressure).then_some(fullness),
        exited,
        aimed_kills: aimed,
        restarts_without_snapshot,
        recovery: recovery.summary(),
        timed_out,
    })
}

/// Records, per stream, the largest fullness the planner reports.
async fn sample_fullness(stack: &Stack, fullness: &mut BTreeMap<String, f64>) {
    let Ok(metrics) = stack.metrics(Service::Planner).await else {
        return;
    };
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("trainyard_stream_bytes{"))
    {
        let Some(stream) = line
            .split("stream=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let series = format!("trainyard_stream_max_bytes{{stream=\"{stream}\"}}");
        let bytes = stack::metric_value(&metrics, line.split(' ').next().unwrap_or(line));
        let limit = stack::metric_value(&metrics, &series);
        if let (Some(bytes), Some(limit)) = (bytes, limit)
            && limit > 0.0
        {
            let entry = fullness.entry(stream.to_owned()).or_insert(0.0);
            *entry = entry.max(bytes / limit);
        }
    }
}

/// Waits until the NATS cluster has elected its JetStream meta leader.
async fn jetstream_available(js: &jetstream::Context, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        match js.query_account().await {
            Ok(_) => return Ok(()),
            Err(err) if Instant::now() > deadline => {
                bail!("JetStream did not become available within {limit:?}: {err}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Stream name → the server leading it, for every stream (key-value
/// buckets included); a stream without a leader maps to None.
async fn stream_leaders(
    js: &jetstream::Context,
) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let names: Vec<String> = js.stream_names().try_collect().await?;
    let mut leaders = BTreeMap::new();
    for name in names {
        // `$JS.API.STREAM.INFO.<name>`: its cluster section names the leader.
        let leader = match js.get_stream(&name).await {
            Ok(mut stream) => stream
                .info()
                .await
                .ok()
                .and_then(|info| info.cluster.clone())
                .and_then(|cluster| cluster.leader),
            Err(_) => None,
        };
        leaders.insert(name, leader);
    }
    Ok(leaders)
}

/// The NATS cluster's faults during and after the burst of `window` seconds:
/// twice, the node leading the most streams is SIGKILLed and started again
/// 10 s later; once the burst is in, all three nodes are killed and started
/// again 3 s later. A service that exits meanwhile is started again, as
/// Kubernetes restarts a container. Returns, per leader kill, the time until
/// every stream had a leader again; the time from the three nodes listening
/// again until every service was ready and the planner and the
/// gpu-allocator held their leases; and the services that exited.
async fn nats_cluster_faults(
    stack: &mut Stack,
    js: &jetstream::Context,
    window: f64,
) -> anyhow::Result<(Vec<Duration>, Duration, Vec<String>)> {
    let mut recoveries = Vec::new();
    let mut exits = Vec::new();
    for _ in 0..2 {
        supervise(stack, &mut exits, Duration::from_secs_f64(window / 3.0)).await?;
        let leaders = stream_leaders(js).await?;
        let mut led: BTreeMap<&str, usize> = BTreeMap::new();
        for leader in leaders.values().flatten() {
            *led.entry(leader.as_str()).or_default() += 1;
        }
        let Some((&victim, &count)) = led.iter().max_by_key(|(_, count)| **count) else {
            bail!("no stream has a leader: {leaders:?}");
        };
        let victim = victim.to_owned();
        eprintln!(
            "killing {victim}, leader of {count} of {} streams",
            leaders.len()
        );
        let killed = Instant::now();
        stack.kill(&victim).await?;
        let deadline = killed + Duration::from_secs(60);
        loop {
            let leaders = stream_leaders(js).await.unwrap_or_default();
            if !leaders.is_empty()
                && leaders
                    .values()
                    .all(|l| l.as_deref().is_some_and(|l| l != victim))
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("streams without a leader 60 s after {victim} was killed: {leaders:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        recoveries.push(killed.elapsed());
        supervise(
            stack,
            &mut exits,
            Duration::from_secs(10).saturating_sub(killed.elapsed()),
        )
        .await?;
        stack.start_again(&victim)?;
        let port = node_port(stack, &victim)?;
        stack
            .wait_listening(&victim, port, Duration::from_secs(30))
            .await?;
    }
    supervise(
        stack,
        &mut exits,
        Duration::from_secs_f64(window / 3.0 + 5.0),
    )
    .await?;
    let nodes: Vec<(String, u16)> = stack.nats_nodes().to_vec();
    eprintln!("killing all {} NATS nodes", nodes.len());
    for (name, _) in &nodes {
        stack.kill(name).await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, _) in &nodes {
        stack.start_again(name)?;
    }
    for (name, port) in &nodes {
        stack
            .wait_listening(name, *port, Duration::from_secs(30))
            .await?;
    }
    let back = Instant::now();
    // Services whose lease ran out during the outage exit; give them a
    // moment to notice before they are restarted.
    supervise(stack, &mut exits, Duration::from_secs(1)).await?;
    let ready_by = Instant::now() + Duration::from_secs(120);
    while !stack.all_ready().await {
        restart_exited(stack, &mut exits).await?;
        if Instant::now() > ready_by {
            bail!("services not ready 120 s after NATS came back");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for service in [Service::Planner, Service::GpuAllocator] {
        leading_again(
            stack,
            service,
            &[service.name().to_owned()],
            Duration::from_secs(120),
        )
        .await?;
    }
    let back = back.elapsed();
    supervise(stack, &mut exits, Duration::from_secs(5)).await?;
    Ok((recoveries, back, exits))
}

/// Waits `length`, starting again any service that exits meanwhile.
async fn supervise(
    stack: &mut Stack,
    exits: &mut Vec<String>,
    length: Duration,
) -> anyhow::Result<()> {
    let until = Instant::now() + length;
    while Instant::now() < until {
        restart_exited(stack, exits).await?;
        tokio::time::sleep(
            Duration::from_millis(200).min(until.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    Ok(())
}

/// Starts again every service process that exited by itself.
async fn restart_exited(stack: &mut Stack, exits: &mut Vec<String>) -> anyhow::Result<()> {
    for name in stack.exited() {
        if name.starts_with("nats-") || name == "simulator" {
            continue;
        }
        eprintln!("{name} exited; starting it again");
        stack
            .restart(&name, Stop::Kill, Duration::ZERO, Duration::from_secs(120))
            .await?;
        exits.push(name);
    }
    Ok(())
}

fn node_port(stack: &Stack, name: &str) -> anyhow::Result<u16> {
    stack
        .nats_nodes()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, port)| *port)
        .with_context(|| format!("no NATS node {name}"))
}

/// Messages of the Trainyard streams that some durable consumer has not
/// acknowledged (its ack floor is below the stream's last sequence).
async fn unhandled_messages(js: &jetstream::Context) -> anyhow::Result<u64> {
    let mut total = 0;
    for service in Service::ALL {
        for spec in service.consumers() {
            let stream = js.get_stream(spec.stream.name).await?;
            if let Ok(info) = stream.consumer_info(&spec.durable).await {
                total += info.num_pending + info.num_ack_pending as u64;
            }
        }
    }
    Ok(total)
}

/// Where the kills of a service fall, in turn: at a random moment
/// (SIGKILL), or at a crash point the process aborts at by itself
/// (`TRAINYARD_CRASH_AT`): the gpu-allocator mid-cycle, after a save and
/// after a publish; the planner after handling a message (its Kubernetes
/// applies done) and before the ack, on each of its consumers.
fn kill_points(target: Service) -> Vec<Option<String>> {
    let points: Vec<String> = match target {
        Service::GpuAllocator => [
            trainyard_gpu_allocator::service::CRASH_MID_CYCLE,
            trainyard_gpu_allocator::service::CRASH_AFTER_SAVE,
            trainyard_gpu_allocator::service::CRASH_AFTER_PUBLISH,
        ]
        .map(str::to_owned)
        .to_vec(),
        // Not the submissions' consumer: chaos runs create TrainingJobs
        // through the API, so it has nothing to handle.
        service => service
            .consumers()
            .iter()
            .filter(|c| c.stream.name != trainyard_contracts::streams::SUBMIT.name)
            .map(|c| trainyard_runtime::crash_point::before_ack(&c.durable))
            .collect(),
    };
    std::iter::once(None)
        .chain(points.into_iter().map(Some))
        .collect()
}

/// Aimed kills at one crash point: tried, and how many reached it (the
/// others were SIGKILLed at the end of the wait).
#[derive(Debug, Default, Serialize)]
struct AimedKills {
    tried: u32,
    crashed_at_point: u32,
}

/// Kills `target` after each gap and starts it again after the matching
/// pause, aiming the kills at its crash points in turn (the `nths`-th time
/// the point is reached); returns each restart's recovery time, the aimed
/// kills by point and, for the gpu-allocator, the restarts that did not
/// restore the last saved snapshot (`trainyard_allocator_restores_total`).
async fn kill_loop(
    stack: &mut Stack,
    target: Option<Service>,
    gaps: &[Duration],
    pauses: &[Duration],
    nths: &[u32],
) -> anyhow::Result<(Vec<Duration>, BTreeMap<String, AimedKills>, Option<u32>)> {
    let Some(target) = target else {
        return Ok(Default::default());
    };
    let points = kill_points(target);
    let mut recoveries = Vec::with_capacity(gaps.len());
    let mut restarts_without_snapshot = (target == Service::GpuAllocator).then_some(0);
    let mut aimed: BTreeMap<String, AimedKills> = BTreeMap::new();
    for (((gap, pause), point), nth) in gaps.iter().zip(pauses).zip(points.iter().cycle()).zip(nths)
    {
        tokio::time::sleep(*gap).await;
        if let Some(point) = point {
            let crashed = stack
                .crash_at(
                    target.name(),
                    &format!("{point}:{nth}"),
                    Duration::from_secs(60),
                )
                .await?;
            let kills = aimed.entry(point.clone()).or_default();
            kills.tried += 1;
            kills.crashed_at_point += u32::from(crashed);
        }
        let started = Instant::now();
        stack
            .kill_and_restart(target.name(), *pause, Duration::from_secs(60))
            .await?;
        leading_again(
            stack,
            target,
            &[target.name().to_owned()],
            Duration::from_secs(60),
        )
        .await?;
        recoveries.push(started.elapsed().saturating_sub(*pause));
        if let Some(count) = restarts_without_snapshot.as_mut() {
            let metrics = stack.metrics(target).await?;
            let series = "trainyard_allocator_restores_total{source=\"snapshot\"}";
            if stack::metric_value(&metrics, series).unwrap_or(0.0) < 1.0 {
                *count += 1;
            }
        }
    }
    Ok((recoveries, aimed, restarts_without_snapshot))
}

/// The process name of a service's second replica.
fn second_replica(service: Service) -> String {
    format!("{}-1", service.name())
}

/// Restarts every replica of the replicated services in turn (SIGTERM, then
/// started again and ready), one after each gap; returns, per restart, the
/// time from the SIGTERM until the service is whole again: the new process
/// ready and, for the planner and the gpu-allocator, one replica holding the
/// lease.
async fn rolling_restarts(stack: &mut Stack, gaps: &[Duration]) -> anyhow::Result<Vec<Duration>> {
    let order: Vec<(Service, String)> = Service::ALL
        .into_iter()
        .filter(|s| *s != Service::Watcher)
        .flat_map(|s| [(s, s.name().to_owned()), (s, second_replica(s))])
        .collect();
    let mut recoveries = Vec::with_capacity(gaps.len());
    for ((service, name), gap) in order.iter().cycle().zip(gaps) {
        tokio::time::sleep(*gap).await;
        let started = Instant::now();
        stack
            .restart(
                name,
                Stop::Terminate {
                    grace: Duration::from_secs(15),
                },
                Duration::ZERO,
                Duration::from_secs(60),
            )
            .await?;
        leading_again(
            stack,
            *service,
            &[service.name().to_owned(), second_replica(*service)],
            Duration::from_secs(60),
        )
        .await?;
        recoveries.push(started.elapsed());
    }
    Ok(recoveries)
}

const HEADER: &str = "| scenario | jobs | kills | completed | failed | lost | duplicate Jobs | over-admissions | re-suspended Jobs | flaps per attempt (max; attempts with any) | dead letters | recovery p50 / p99 | run |";

fn row(r: &ScenarioReport) -> String {
    let recovery = r.recovery.as_ref().map_or("-".to_owned(), |s| {
        format!("{:.1} / {:.1} s", s.p50_ms / 1000.0, s.p99_ms / 1000.0)
    });
    let dead: u64 = r.dead_letters.values().sum();
    let mut line = format!(
        "| {:?} | {} | {} | {} | {} | {} | {} of {} | {} (worst +{} GPUs) | {} | {}; {} | {} | {} | {:.0} s{} |",
        r.scenario,
        r.jobs,
        r.kills,
        r.counts.completed,
        r.counts.failed,
        r.counts.lost,
        r.counts.duplicate_jobs,
        r.counts.job_objects,
        r.counts.over_admissions,
        r.counts.worst_excess_gpus,
        r.counts.resuspended_jobs,
        r.counts.max_flaps_per_attempt,
        r.counts.attempts_with_flaps,
        dead,
        recovery,
        r.run_seconds,
        if r.timed_out { ", timed out" } else { "" },
    );
    for (key, count) in &r.dead_letters {
        line.push_str(&format!("\n  dead letters {key}: {count}"));
    }
    if let Some(fuzz) = &r.fuzz {
        line.push_str(&format!(
            "\n  fuzz: {} bad messages published; {} (message, consumer) pairs expected to be dead-lettered, {} were, {} more than once; {} envelope-level ones missing; by kind: {:?}",
            fuzz.published,
            fuzz.expected,
            fuzz.dead_lettered,
            fuzz.duplicated,
            fuzz.missing,
            fuzz.by_kind
        ));
    }
    if let Some(outage) = &r.outage {
        line.push_str(&format!(
            "\n  outage: services back {} after NATS; {} messages unhandled after the drain; {} jobs unfinished at the stall's end, slowest next change {} after it, {} without one",
            outage
                .services_back_seconds
                .map_or("-".to_owned(), |s| format!("{s:.1} s")),
            outage.unhandled_messages,
            outage.unfinished_at_stall_end,
            outage
                .slowest_progress_after_stall_seconds
                .map_or("-".to_owned(), |s| format!("{s:.1} s")),
            outage.no_progress_after_stall,
        ));
    }
    if let Some(fullness) = &r.stream_fullness {
        line.push_str(&format!("\n  stream fullness (max): {fullness:?}"));
    }
    if let Some(n) = r.restarts_without_snapshot {
        line.push_str(&format!(
            "\n  restarts that did not restore the last snapshot: {n} of {}",
            r.kills
        ));
    }
    if !r.aimed_kills.is_empty() {
        let points: Vec<String> = r
            .aimed_kills
            .iter()
            .map(|(point, k)| format!("{point} {} of {}", k.crashed_at_point, k.tried))
            .collect();
        line.push_str(&format!(
            "\n  aimed kills (crashed at the point of tried; the rest SIGKILLed at random): {}",
            points.join(", ")
        ));
    }
    for name in &r.exited {
        line.push_str(&format!("\n  exited: {name}"));
    }
    for example in &r.counts.flap_examples {
        line.push_str(&format!("\n  flapped: {example}"));
    }
    for example in &r.counts.examples {
        line.push_str(&format!("\n  not completed: {example}"));
    }
    line
}

fn table(reports: &[ScenarioReport]) -> String {
    let mut out = vec![
        HEADER.to_owned(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|".to_owned(),
    ];
    out.extend(reports.iter().map(row));
    out.join("\n")
}
