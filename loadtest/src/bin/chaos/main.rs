//! Chaos runs: the whole stack as processes on the simulated cluster while a
//! service is killed with SIGKILL at random moments and started again, or
//! while the simulated API server fails and stalls writes. Afterwards it
//! counts what the reliability targets name:
//!
//! - lost: TrainingJobs not finished (Completed or Failed) after the drain;
//! - failed: TrainingJobs that ended Failed (no job of the workload should);
//! - duplicates: Job objects beyond the first per Job name (a name is one
//!   TrainingJob attempt, `<job>-a<attempt>`);
//! - over-admission: moments at which the running pods on a node held more
//!   GPUs than the node has;
//! - re-suspended: Job objects that ran and were suspended again, then kept
//!   (a preempted or suspended attempt's Job is deleted) or resumed again;
//! - state flaps: a TrainingJob entering again, within one attempt
//!   (`restartCount`, `podsReadyRequeues`), a state it had left;
//! - dead letters, by consumer and category;
//! - recovery: from a killed service's new process start until it is ready
//!   and, for the planner and the gpu-allocator, holds its lease again.
//!
//! Prints a table, one row per scenario, and writes JSON; asserts nothing.
//!
//! ```text
//! chaos [--scenario planner-kill|allocator-kill|api-faults|fuzz|replicas|all] [--jobs N]
//!     [--kills N] [--kill-every SECONDS] [--nodes 8] [--gpus-per-node 8]
//!     [--speed 60] [--seed 1] [--timeout 900] [--log FILTER]
//!     [--bin-dir DIR] [--json loadtest/out/chaos.json]
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, consumer};
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingQueue};
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::{Service, streams};
use trainyard_loadtest::latency::{LatencyRecorder, LatencySummary};
use trainyard_loadtest::positive;
use trainyard_loadtest::stack::{self, Stack, Stop};
use trainyard_loadtest::workload::{self, JobShape};
use trainyard_simulator::faults::ApiFaultConfig;

use fuzz::FuzzOutcome;

mod fuzz;

const NAMESPACE: &str = "default";
const GPU: &str = "nvidia.com/gpu";
/// PriorityClasses of the workload, as the gpu-allocator is configured with them.
const HIGH: (&str, i32) = ("high-priority", 10_000);
const LOW: (&str, i32) = ("training-preemptible", 100);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// SIGKILL the planner at random moments (20 kills during 200 jobs).
    PlannerKill,
    /// SIGKILL the gpu-allocator at random moments (50 kills during 500
    /// jobs of mixed priority, so that some are preempted).
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
    /// Each of the above in turn, each on a fresh stack.
    All,
}

impl Scenario {
    fn target(self) -> Option<Service> {
        match self {
            Self::PlannerKill => Some(Service::Planner),
            Self::AllocatorKill => Some(Service::GpuAllocator),
            Self::ApiFaults | Self::Fuzz | Self::Replicas | Self::All => None,
        }
    }

    /// Jobs and kills when not given on the command line.
    fn defaults(self) -> (u32, u32) {
        match self {
            Self::PlannerKill => (200, 20),
            Self::AllocatorKill => (500, 50),
            Self::Replicas => (200, 36),
            Self::ApiFaults | Self::Fuzz | Self::All => (200, 0),
        }
    }
}

/// Runs the stack under faults and counts lost and duplicated work.
#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// TrainingJobs to submit; default per scenario (200, 500, 200).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: Option<u32>,
    /// Kills of the scenario's service (20, 50), or replica restarts (36).
    #[arg(long)]
    kills: Option<u32>,
    /// Mean seconds between kills (each gap drawn from 0.5× to 1.5× of it);
    /// the jobs are submitted evenly over kills × this.
    #[arg(long, default_value_t = 3.0, value_parser = positive)]
    kill_every: f64,
    /// Seconds over which the jobs are submitted when nothing is killed.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    submit_over: f64,
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

/// What the watches saw during a run.
#[derive(Default)]
struct Seen {
    /// TrainingJob name → last state.
    states: HashMap<String, TrainingJobState>,
    /// Job name → the UIDs of the Job objects created under it.
    jobs: HashMap<String, HashSet<String>>,
    /// Running pod UID → (node, GPUs).
    running: HashMap<String, (String, u32)>,
    /// Moments a node held more GPUs than it has, and the worst excess.
    over_admissions: u64,
    worst_excess: u32,
    /// TrainingJob name → its (attempt, state) changes in order.
    history: HashMap<String, Vec<(Attempt, TrainingJobState)>>,
    /// Job UID → how its `spec.suspend` went.
    suspensions: HashMap<String, Suspension>,
}

/// One attempt of a TrainingJob: (`restartCount`, `podsReadyRequeues`).
type Attempt = (u32, u32);

/// The `spec.suspend` story of one Job object.
#[derive(Default)]
struct Suspension {
    /// Seen unsuspended.
    ran: bool,
    /// Seen suspended after it ran.
    resuspended: bool,
    /// Seen unsuspended after that.
    resumed_again: bool,
    deleted: bool,
}

impl Seen {
    /// Per attempt of every TrainingJob: how often it entered a state it
    /// had already left within that attempt.
    fn flaps_per_attempt(&self) -> Vec<usize> {
        let mut flaps = Vec::new();
        for history in self.history.values() {
            let mut left: HashMap<Attempt, HashSet<TrainingJobState>> = HashMap::new();
            let mut per_attempt: HashMap<Attempt, usize> = HashMap::new();
            let mut previous: Option<(Attempt, TrainingJobState)> = None;
            for &(attempt, state) in history {
                let count = per_attempt.entry(attempt).or_default();
                if left.get(&attempt).is_some_and(|l| l.contains(&state)) {
                    *count += 1;
                }
                if let Some((was_attempt, was)) = previous
                    && was_attempt == attempt
                {
                    left.entry(attempt).or_default().insert(was);
                }
                previous = Some((attempt, state));
            }
            flaps.extend(per_attempt.into_values());
        }
        flaps
    }
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
    completed: usize,
    failed: usize,
    lost: usize,
    duplicate_jobs: usize,
    job_objects: usize,
    over_admissions: u64,
    worst_excess_gpus: u32,
    /// Job objects suspended after they ran and then kept or resumed.
    resuspended_jobs: usize,
    /// The most state flaps of any one attempt, and the attempts with any.
    max_flaps_per_attempt: usize,
    attempts_with_flaps: usize,
    dead_letters: BTreeMap<String, u64>,
    /// Fuzz: what was published and what became of it.
    fuzz: Option<FuzzOutcome>,
    /// Services whose process exited (a panic, an abort) during the run.
    exited: Vec<String>,
    recovery: Option<LatencySummary>,
    /// Failed and lost jobs, first few, with their last state.
    examples: Vec<String>,
    timed_out: bool,
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
                let clean = report.lost == 0
                    && report.failed == 0
                    && report.duplicate_jobs == 0
                    && report.over_admissions == 0
                    && report.resuspended_jobs == 0
                    && report.max_flaps_per_attempt <= 1
                    && report.exited.is_empty()
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
    let kills = match (scenario.target(), scenario) {
        (Some(_), _) | (None, Scenario::Replicas) => args.kills.unwrap_or(default_kills),
        (None, _) => 0,
    };
    let mut rng = StdRng::seed_from_u64(args.seed);

    let nats_url = stack.start_nats(None).await?;
    let mut cluster = workload::cluster_config(args.nodes, args.gpus_per_node, args.speed);
    cluster.priority_classes = [HIGH, LOW]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    if scenario == Scenario::ApiFaults {
        cluster.api_faults = ApiFaultConfig {
            write_error_rate: 0.2,
            write_stall_rate: 0.01,
            stall_seconds: 5.0,
            seed: args.seed,
            ..ApiFaultConfig::default()
        };
    }
    let kubeconfig = stack
        .start_simulator(&yaml_serde::to_string(&cluster)?)
        .await?;
    let kubeconfig = kubeconfig.to_string_lossy().into_owned();
    let allocator_config = stack.work_dir().join("gpu-allocator.toml");
    std::fs::write(
        &allocator_config,
        format!(
            "[gpu_allocator.priority_classes]\n{} = {}\n{} = {}\n",
            HIGH.0, HIGH.1, LOW.0, LOW.1
        ),
    )?;
    for service in Service::ALL {
        let mut env = stack.service_env(service, &kubeconfig, 200)?;
        if service == Service::GpuAllocator {
            env.push((
                "TRAINYARD_CONFIG".to_owned(),
                allocator_config.to_string_lossy().into_owned(),
            ));
        }
        stack.start_service(service, &env)?;
        if scenario == Scenario::Replicas && service != Service::Watcher {
            stack.start_service_as(&second_replica(service), service, &env)?;
        }
    }
    stack.wait_ready(Duration::from_secs(60)).await?;
    let client = stack::kube_client(&std::fs::read_to_string(&kubeconfig)?).await?;
    let js = jetstream::new(async_nats::connect(&nats_url).await?);
    apply_queue(&client, args.nodes * args.gpus_per_node).await?;
    stack::settle(&js, Duration::from_secs(60)).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = CancellationToken::new();
    let watches = [
        watch_trainingjobs(client.clone(), seen.clone(), stop.clone()),
        watch_jobs(client.clone(), seen.clone(), stop.clone()),
        watch_pods(
            client.clone(),
            seen.clone(),
            args.gpus_per_node,
            stop.clone(),
        ),
    ];
    for ready in watches {
        ready.await.context("a watch ended before it started")?;
    }
    eprintln!(
        "{scenario:?}: {jobs} jobs, {kills} kills, {} nodes × {} GPUs; work dir {}",
        args.nodes,
        args.gpus_per_node,
        stack.work_dir().display()
    );

    let start = Instant::now();
    let window = if kills > 0 {
        f64::from(kills) * args.kill_every
    } else {
        args.submit_over
    };
    let shapes: Vec<(JobShape, &str)> = (0..jobs)
        .map(|_| job_shape(&mut rng, args.gpus_per_node))
        .collect();
    let kill_gaps: Vec<Duration> = (0..kills)
        .map(|_| Duration::from_secs_f64(args.kill_every * rng.random_range(0.5..1.5)))
        .collect();
    let pauses: Vec<Duration> = (0..kills)
        .map(|_| Duration::from_millis(rng.random_range(0..1000)))
        .collect();
    let bad = if scenario == Scenario::Fuzz {
        fuzz::messages(&mut rng)?
    } else {
        Vec::new()
    };
    let restarts = async {
        if scenario == Scenario::Replicas {
            rolling_restarts(stack, &kill_gaps).await
        } else {
            kill_loop(stack, scenario.target(), &kill_gaps, &pauses).await
        }
    };
    let (recoveries, submitted, published) = tokio::join!(
        restarts,
        submit(&client, &shapes, start, window),
        fuzz::publish(&js, &bad, start, window),
    );
    let recoveries = recoveries?;
    let submitted = submitted?;
    let published = published?;

    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let all_finished = || {
        let seen = lock(&seen);
        submitted.iter().all(|name| {
            seen.states
                .get(name)
                .is_some_and(|state| state.is_terminal())
        })
    };
    while !all_finished() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    while !stack::consumers_idle(&js, &Service::ALL).await && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let timed_out = Instant::now() >= deadline;
    let run_seconds = start.elapsed().as_secs_f64();
    stop.cancel();
    let letters = dead_letters(&js).await?;
    let fuzz = (scenario == Scenario::Fuzz).then(|| fuzz::outcome(&published, &letters));
    let mut dead_letters = BTreeMap::new();
    for letter in &letters {
        *dead_letters
            .entry(format!("{}/{}", letter.consumer, letter.category))
            .or_insert(0) += 1;
    }
    let exited = stack.exited();

    let seen = lock(&seen);
    let state_of = |name: &String| seen.states.get(name).copied();
    let flaps = seen.flaps_per_attempt();
    let completed = submitted
        .iter()
        .filter(|n| state_of(n) == Some(TrainingJobState::Completed))
        .count();
    let failed = submitted
        .iter()
        .filter(|n| state_of(n) == Some(TrainingJobState::Failed))
        .count();
    let examples = submitted
        .iter()
        .filter(|n| state_of(n) != Some(TrainingJobState::Completed))
        .take(5)
        .map(|n| format!("{n}: {:?}", state_of(n)))
        .collect();
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
        completed,
        failed,
        lost: submitted.len() - completed - failed,
        duplicate_jobs: seen.jobs.values().map(|uids| uids.len() - 1).sum(),
        job_objects: seen.jobs.values().map(HashSet::len).sum(),
        over_admissions: seen.over_admissions,
        worst_excess_gpus: seen.worst_excess,
        resuspended_jobs: seen
            .suspensions
            .values()
            .filter(|s| s.resuspended && (!s.deleted || s.resumed_again))
            .count(),
        max_flaps_per_attempt: flaps.iter().copied().max().unwrap_or(0),
        attempts_with_flaps: flaps.iter().filter(|f| **f > 0).count(),
        dead_letters,
        fuzz,
        exited,
        recovery: recovery.summary(),
        examples,
        timed_out,
    })
}

/// The queue every job goes to: all GPUs, lower priorities preempted.
async fn apply_queue(client: &Client, gpus: u32) -> anyhow::Result<()> {
    let mut queue = serde_json::to_value(workload::training_queue("default", gpus)?)?;
    queue["spec"]["preemption"] = serde_json::json!({"withinQueue": "LowerPriority"});
    let queue: TrainingQueue = serde_json::from_value(queue)?;
    let api = Api::<TrainingQueue>::all(client.clone());
    retrying_faults(|| async {
        api.patch(
            "default",
            &PatchParams::apply("loadtest").force(),
            &Patch::Apply(&queue),
        )
        .await
        .map(|_| ())
    })
    .await
    .context("applying the TrainingQueue")
}

/// Runs a write until the API server carries it out: the API-fault scenario
/// answers writes with 409, 429, 5xx or a 504 after a stall without doing
/// them, as a real API server under load may, and every client retries.
async fn retrying_faults<F, Fut>(mut write: F) -> Result<(), kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let mut attempts = 0;
    loop {
        match write().await {
            Ok(()) => return Ok(()),
            // An earlier try was carried out after all.
            Err(kube::Error::Api(status)) if status.reason == "AlreadyExists" => return Ok(()),
            Err(kube::Error::Api(status))
                if attempts < 20 && matches!(status.code, 409 | 429 | 500 | 503 | 504) =>
            {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// One job of the workload: mostly single GPUs, some whole nodes, some
/// two-node gangs; one in five of high priority.
fn job_shape(rng: &mut StdRng, gpus_per_node: u32) -> (JobShape, &'static str) {
    let size: f64 = rng.random();
    let (workers, gpus_per_worker) = if size < 0.6 {
        (1, 1)
    } else if size < 0.85 {
        (1, 4)
    } else {
        (2, gpus_per_node)
    };
    let shape = JobShape {
        model: "resnet50".into(),
        workers,
        gpus_per_worker,
        epochs: rng.random_range(2..=4),
        seconds_per_epoch: Some(rng.random_range(20.0..90.0)),
        queue: None,
    };
    let priority = if rng.random::<f64>() < 0.2 {
        HIGH.0
    } else {
        LOW.0
    };
    (shape, priority)
}

/// Kills `target` after each gap and starts it again after the matching
/// pause; returns each restart's recovery time.
async fn kill_loop(
    stack: &mut Stack,
    target: Option<Service>,
    gaps: &[Duration],
    pauses: &[Duration],
) -> anyhow::Result<Vec<Duration>> {
    let Some(target) = target else {
        return Ok(Vec::new());
    };
    let mut recoveries = Vec::with_capacity(gaps.len());
    for (gap, pause) in gaps.iter().zip(pauses) {
        tokio::time::sleep(*gap).await;
        let started = Instant::now();
        stack
            .kill_and_restart(target.name(), *pause, Duration::from_secs(60))
            .await?;
        leading_again(stack, target, &[target.name().to_owned()]).await?;
        recoveries.push(started.elapsed().saturating_sub(*pause));
    }
    Ok(recoveries)
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
        )
        .await?;
        recoveries.push(started.elapsed());
    }
    Ok(recoveries)
}

/// Waits until one of the processes `names` of a planner or gpu-allocator
/// holds the service's lease (a killed holder's lease expires first); other
/// services are done when ready.
async fn leading_again(stack: &Stack, service: Service, names: &[String]) -> anyhow::Result<()> {
    if !matches!(service, Service::Planner | Service::GpuAllocator) {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        for name in names {
            if let Ok(metrics) = stack.process_metrics(name).await
                && metrics
                    .lines()
                    .filter(|l| l.starts_with("trainyard_lease_held{"))
                    .any(|l| l.ends_with(" 1"))
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{} did not take its lease within 60 s", service.name())
}

/// Creates the TrainingJobs evenly over `window` seconds; returns their names.
async fn submit(
    client: &Client,
    shapes: &[(JobShape, &str)],
    start: Instant,
    window: f64,
) -> anyhow::Result<Vec<String>> {
    let api = Api::<TrainingJob>::namespaced(client.clone(), NAMESPACE);
    let mut names = Vec::with_capacity(shapes.len());
    let every = window / shapes.len() as f64;
    for (i, (shape, priority)) in shapes.iter().enumerate() {
        tokio::time::sleep_until((start + Duration::from_secs_f64(every * i as f64)).into()).await;
        let name = format!("chaos-{i:05}");
        let mut job = workload::training_job(NAMESPACE, &name, shape)?;
        job.spec
            .scheduling
            .get_or_insert_with(Default::default)
            .priority = Some((*priority).to_owned());
        retrying_faults(|| async { api.create(&PostParams::default(), &job).await.map(|_| ()) })
            .await
            .with_context(|| format!("creating TrainingJob {name}"))?;
        names.push(name);
    }
    Ok(names)
}

fn watch_trainingjobs(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) -> tokio::sync::oneshot::Receiver<()> {
    stack::watch_objects(
        Api::<TrainingJob>::namespaced(client, NAMESPACE),
        watcher::Config::default(),
        stop,
        move |job: TrainingJob, _deleted, _| {
            let Some(status) = job.status.as_ref() else {
                return;
            };
            if let Some(state) = status.state {
                let attempt = (
                    status.restart_count.unwrap_or(0),
                    status.pods_ready_requeues.unwrap_or(0),
                );
                let mut seen = lock(&seen);
                seen.states.insert(job.name_any(), state);
                let history = seen.history.entry(job.name_any()).or_default();
                if history.last() != Some(&(attempt, state)) {
                    history.push((attempt, state));
                }
            }
        },
    )
}

fn watch_jobs(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) -> tokio::sync::oneshot::Receiver<()> {
    stack::watch_objects(
        Api::<Job>::namespaced(client, NAMESPACE),
        watcher::Config::default().labels(LABEL_JOB),
        stop,
        move |job: Job, deleted, _| {
            let Some(uid) = job.uid() else { return };
            let mut seen = lock(&seen);
            seen.jobs
                .entry(job.name_any())
                .or_default()
                .insert(uid.clone());
            let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
            let suspension = seen.suspensions.entry(uid).or_default();
            if deleted {
                suspension.deleted = true;
            } else if !suspended {
                suspension.resumed_again |= suspension.resuspended;
                suspension.ran = true;
            } else if suspension.ran {
                suspension.resuspended = true;
            }
        },
    )
}

/// Tallies the GPUs of running pods per node after every pod change.
fn watch_pods(
    client: Client,
    seen: Arc<Mutex<Seen>>,
    gpus_per_node: u32,
    stop: CancellationToken,
) -> tokio::sync::oneshot::Receiver<()> {
    stack::watch_objects(
        Api::<Pod>::namespaced(client, NAMESPACE),
        watcher::Config::default().labels(LABEL_JOB),
        stop,
        move |pod: Pod, deleted, _| {
            let Some(uid) = pod.uid() else { return };
            let mut seen = lock(&seen);
            let running = !deleted
                && pod.metadata.deletion_timestamp.is_none()
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let (Some(node), true) = (node, running) else {
                seen.running.remove(&uid);
                return;
            };
            seen.running.insert(uid, (node.clone(), pod_gpus(&pod)));
            let held: u32 = seen
                .running
                .values()
                .filter(|(n, _)| *n == node)
                .map(|(_, gpus)| gpus)
                .sum();
            if held > gpus_per_node {
                seen.over_admissions += 1;
                seen.worst_excess = seen.worst_excess.max(held - gpus_per_node);
            }
        },
    )
}

/// GPUs a pod's containers ask for.
fn pod_gpus(pod: &Pod) -> u32 {
    pod.spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get(GPU))
        .filter_map(|q| q.0.parse::<u32>().ok())
        .sum()
}

/// Every dead letter, read without acknowledging; an unreadable one counts
/// under the consumer `unreadable`.
async fn dead_letters(js: &jetstream::Context) -> anyhow::Result<Vec<DeadLetter>> {
    let stream = js
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .context("the dead-letter stream")?;
    let mut reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let pending = reader.info().await?.num_pending as usize;
    let mut letters = Vec::with_capacity(pending);
    if pending == 0 {
        return Ok(letters);
    }
    let mut messages = reader.messages().await?.take(pending);
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| anyhow::anyhow!("reading dead letters: {e}"))?;
        letters.push(
            serde_json::from_slice::<DeadLetter>(&message.payload).unwrap_or_else(|err| {
                DeadLetter {
                    stream: String::new(),
                    consumer: "unreadable".to_owned(),
                    subject: message.subject.to_string(),
                    stream_sequence: 0,
                    category: "unreadable".to_owned(),
                    reason: err.to_string(),
                    deliveries: 0,
                    failed_at: chrono::Utc::now(),
                    headers: BTreeMap::new(),
                    payload: String::new(),
                }
            }),
        );
    }
    Ok(letters)
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    // A panicking watch task cannot leave a half-written map entry.
    seen.lock().unwrap_or_else(|e| e.into_inner())
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
        r.completed,
        r.failed,
        r.lost,
        r.duplicate_jobs,
        r.job_objects,
        r.over_admissions,
        r.worst_excess_gpus,
        r.resuspended_jobs,
        r.max_flaps_per_attempt,
        r.attempts_with_flaps,
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
    for name in &r.exited {
        line.push_str(&format!("\n  exited: {name}"));
    }
    for example in &r.examples {
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
