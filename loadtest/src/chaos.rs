//! What the chaos runs count, shared by the `chaos` benchmark and the fast
//! chaos system test: watches of TrainingJobs, Jobs and pods that record
//! every state change, Job object and running pod; the tallies the
//! reliability targets name from them; the dead letters; and the workload's
//! queue and submissions, retried through API faults.
//!
//! - lost: TrainingJobs not finished (Completed or Failed) after the drain;
//! - failed: TrainingJobs that ended Failed;
//! - duplicates: Job objects beyond the first per Job name (a name is one
//!   TrainingJob attempt, `<job>-a<attempt>`);
//! - over-admission: moments at which the running pods on a node held more
//!   GPUs than the node has;
//! - re-suspended: Job objects that ran and were suspended again, then kept
//!   (a preempted or suspended attempt's Job is deleted) or resumed again;
//! - state flaps: a TrainingJob entering again, within one attempt
//!   (`restartCount`, `podsReadyRequeues`), a state it had left.

pub mod fuzz;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingQueue};
use trainyard_contracts::Service;
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::streams;

use crate::stack::{self, Stack};
use crate::workload::{self, JobShape};

pub const NAMESPACE: &str = "default";
const GPU: &str = "nvidia.com/gpu";
/// PriorityClasses of the workload, as the gpu-allocator is configured with them.
pub const HIGH: (&str, i32) = ("high-priority", 10_000);
pub const LOW: (&str, i32) = ("training-preemptible", 100);

/// Why a chaos run could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        source: Box<kube::Error>,
    },
    #[error("{0}")]
    Nats(String),
    #[error(transparent)]
    Workload(#[from] crate::Error),
    #[error(transparent)]
    Stack(#[from] stack::StackError),
    #[error("{0}")]
    Watch(String),
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
    /// TrainingJob name → its (attempt, state) changes in order, with when
    /// each was seen.
    history: HashMap<String, Vec<(Attempt, TrainingJobState, Instant)>>,
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
    /// had already left within that attempt, and the attempt's states in
    /// order (`job (restarts, requeues): Queued → Running → ...`).
    fn flaps_per_attempt(&self) -> Vec<(usize, String)> {
        let mut flaps = Vec::new();
        for (name, history) in &self.history {
            let mut left: HashMap<Attempt, HashSet<TrainingJobState>> = HashMap::new();
            let mut per_attempt: HashMap<Attempt, (usize, Vec<TrainingJobState>)> = HashMap::new();
            let mut previous: Option<(Attempt, TrainingJobState)> = None;
            for &(attempt, state, _) in history {
                let (count, states) = per_attempt.entry(attempt).or_default();
                states.push(state);
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
            flaps.extend(per_attempt.into_iter().map(|(attempt, (count, states))| {
                let states: Vec<String> = states.iter().map(|s| format!("{s:?}")).collect();
                (count, format!("{name} {attempt:?}: {}", states.join(" → ")))
            }));
        }
        flaps
    }
}

/// The tallies of one run, over the TrainingJobs it submitted.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub completed: usize,
    pub failed: usize,
    pub lost: usize,
    pub duplicate_jobs: usize,
    pub job_objects: usize,
    pub over_admissions: u64,
    pub worst_excess_gpus: u32,
    /// Job objects suspended after they ran and then kept or resumed.
    pub resuspended_jobs: usize,
    /// The most state flaps of any one attempt, and the attempts with any.
    pub max_flaps_per_attempt: usize,
    pub attempts_with_flaps: usize,
    /// Failed and lost jobs, first few, with their last state.
    pub examples: Vec<String>,
    /// Attempts that entered states they had left more than once, first
    /// few, with their states in order.
    pub flap_examples: Vec<String>,
}

impl Counts {
    /// Nothing lost, failed, duplicated, over-admitted or re-suspended, and
    /// no attempt entered a state it had left more than once.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.failed == 0
            && self.duplicate_jobs == 0
            && self.over_admissions == 0
            && self.resuspended_jobs == 0
            && self.max_flaps_per_attempt <= 1
    }
}

/// Watches of TrainingJobs, Jobs and pods in [`NAMESPACE`], recording what
/// the counts need; they stop when this is dropped.
pub struct Observer {
    seen: Arc<Mutex<Seen>>,
    stop: CancellationToken,
}

impl Observer {
    /// Starts the watches; returns once each has listed what exists.
    pub async fn start(client: &Client, gpus_per_node: u32) -> Result<Self, ChaosError> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = CancellationToken::new();
        let watches = [
            watch_trainingjobs(client.clone(), seen.clone(), stop.clone()),
            watch_jobs(client.clone(), seen.clone(), stop.clone()),
            watch_pods(client.clone(), seen.clone(), gpus_per_node, stop.clone()),
        ];
        for ready in watches {
            ready
                .await
                .map_err(|_| ChaosError::Watch("a watch ended before it started".into()))?;
        }
        Ok(Self { seen, stop })
    }

    /// Whether every TrainingJob of `names` is Completed or Failed.
    pub fn all_finished(&self, names: &[String]) -> bool {
        let seen = lock(&self.seen);
        names.iter().all(|name| {
            seen.states
                .get(name)
                .is_some_and(|state| state.is_terminal())
        })
    }

    /// Waits until every TrainingJob of `names` has finished and the durable
    /// consumers of `services` are idle, or `deadline` passes; returns
    /// whether it passed.
    pub async fn drain(
        &self,
        js: &jetstream::Context,
        names: &[String],
        services: &[Service],
        deadline: Instant,
    ) -> bool {
        while !self.all_finished(names) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        while !stack::consumers_idle(js, services).await && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Instant::now() >= deadline
    }

    /// The tallies over the TrainingJobs `submitted`.
    pub fn counts(&self, submitted: &[String]) -> Counts {
        let seen = lock(&self.seen);
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
        Counts {
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
            max_flaps_per_attempt: flaps.iter().map(|(n, _)| *n).max().unwrap_or(0),
            attempts_with_flaps: flaps.iter().filter(|(n, _)| *n > 0).count(),
            examples: submitted
                .iter()
                .filter(|n| state_of(n) != Some(TrainingJobState::Completed))
                .take(5)
                .map(|n| format!("{n}: {:?}", state_of(n)))
                .collect(),
            flap_examples: flaps
                .iter()
                .filter(|(n, _)| *n > 1)
                .take(5)
                .map(|(_, states)| states.clone())
                .collect(),
        }
    }
}

/// How the TrainingJobs went on after a moment (e.g. the end of an outage).
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Jobs not finished at that moment.
    pub unfinished: usize,
    /// The longest any of them took to change state after it.
    pub slowest: Option<Duration>,
    /// Those that did not change state after it at all.
    pub stuck: usize,
}

impl Observer {
    /// For the TrainingJobs `names` not finished at `moment`, how long each
    /// took to change state (or attempt) after it.
    pub fn progress_after(&self, moment: Instant, names: &[String]) -> Progress {
        let seen = lock(&self.seen);
        let mut progress = Progress {
            unfinished: 0,
            slowest: None,
            stuck: 0,
        };
        for name in names {
            let Some(history) = seen.history.get(name) else {
                continue;
            };
            let finished_before = history
                .iter()
                .any(|(_, state, at)| state.is_terminal() && *at <= moment);
            if finished_before {
                continue;
            }
            progress.unfinished += 1;
            match history.iter().find(|(_, _, at)| *at > moment) {
                Some((_, _, at)) => {
                    let took = *at - moment;
                    progress.slowest = Some(progress.slowest.map_or(took, |s| s.max(took)));
                }
                None => progress.stuck += 1,
            }
        }
        progress
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The queue every job goes to: all GPUs, lower priorities preempted.
pub async fn apply_queue(client: &Client, gpus: u32) -> Result<(), ChaosError> {
    let mut queue = serde_json::to_value(workload::training_queue("default", gpus)?)
        .map_err(|e| ChaosError::Watch(e.to_string()))?;
    queue["spec"]["preemption"] = serde_json::json!({"withinQueue": "LowerPriority"});
    let queue: TrainingQueue =
        serde_json::from_value(queue).map_err(|e| ChaosError::Watch(e.to_string()))?;
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
    .map_err(|source| ChaosError::Kube {
        what: "applying the TrainingQueue".into(),
        source: Box::new(source),
    })
}

/// The gpu-allocator's configuration file for the workload's
/// PriorityClasses, written into the stack's work directory; returns the
/// environment that points the allocator at it.
pub fn allocator_priority_env(stack: &Stack) -> Result<(String, String), ChaosError> {
    let path = stack.work_dir().join("gpu-allocator.toml");
    std::fs::write(
        &path,
        format!(
            "[gpu_allocator.priority_classes]\n{} = {}\n{} = {}\n",
            HIGH.0, HIGH.1, LOW.0, LOW.1
        ),
    )
    .map_err(|source| stack::StackError::Io {
        path: path.clone(),
        source,
    })?;
    Ok((
        "TRAINYARD_CONFIG".to_owned(),
        path.to_string_lossy().into_owned(),
    ))
}

/// Runs a write until the API server carries it out: an API server under
/// faults answers writes with 409, 429, 5xx or a 504 after a stall without
/// doing them, as a real API server under load may, and every client retries.
pub async fn retrying_faults<F, Fut>(mut write: F) -> Result<(), kube::Error>
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
                if attempts < 600 && matches!(status.code, 409 | 429 | 500 | 503 | 504) =>
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
pub fn job_shape(rng: &mut StdRng, gpus_per_node: u32) -> (JobShape, &'static str) {
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

/// Creates the TrainingJobs `<prefix>-<i>` evenly over `window` seconds
/// from `start`; returns their names.
pub async fn submit(
    client: &Client,
    prefix: &str,
    shapes: &[(JobShape, &str)],
    start: Instant,
    window: f64,
) -> Result<Vec<String>, ChaosError> {
    let api = Api::<TrainingJob>::namespaced(client.clone(), NAMESPACE);
    let mut names = Vec::with_capacity(shapes.len());
    let every = window / shapes.len().max(1) as f64;
    for (i, (shape, priority)) in shapes.iter().enumerate() {
        tokio::time::sleep_until((start + Duration::from_secs_f64(every * i as f64)).into()).await;
        let name = format!("{prefix}-{i:05}");
        let mut job = workload::training_job(NAMESPACE, &name, shape)?;
        job.spec
            .scheduling
            .get_or_insert_with(Default::default)
            .priority = Some((*priority).to_owned());
        retrying_faults(|| async { api.create(&PostParams::default(), &job).await.map(|_| ()) })
            .await
            .map_err(|source| ChaosError::Kube {
                what: format!("creating TrainingJob {name}"),
                source: Box::new(source),
            })?;
        names.push(name);
    }
    Ok(names)
}

/// Waits until one of the processes `names` of a planner or gpu-allocator
/// holds the service's lease (a killed holder's lease expires first), at
/// most `limit`; other services are done at once.
pub async fn leading_again(
    stack: &Stack,
    service: Service,
    names: &[String],
    limit: Duration,
) -> Result<(), ChaosError> {
    if !matches!(service, Service::Planner | Service::GpuAllocator) {
        return Ok(());
    }
    let deadline = Instant::now() + limit;
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
    Err(ChaosError::Watch(format!(
        "{} did not take its lease within {} s",
        service.name(),
        limit.as_secs()
    )))
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
        move |job: TrainingJob, _deleted, at| {
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
                if history.last().map(|&(a, s, _)| (a, s)) != Some((attempt, state)) {
                    history.push((attempt, state, at));
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
pub async fn dead_letters(js: &jetstream::Context) -> Result<Vec<DeadLetter>, ChaosError> {
    let nats = |e: &dyn std::fmt::Display| ChaosError::Nats(format!("dead letters: {e}"));
    let stream = js
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .map_err(|e| nats(&e))?;
    let mut reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .map_err(|e| nats(&e))?;
    let pending = reader.info().await.map_err(|e| nats(&e))?.num_pending as usize;
    let mut letters = Vec::with_capacity(pending);
    if pending == 0 {
        return Ok(letters);
    }
    let mut messages = reader.messages().await.map_err(|e| nats(&e))?.take(pending);
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| nats(&e))?;
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

/// Dead letters by `<consumer>/<category>`.
pub fn dead_letter_counts(letters: &[DeadLetter]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for letter in letters {
        *counts
            .entry(format!("{}/{}", letter.consumer, letter.category))
            .or_insert(0) += 1;
    }
    counts
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    // A panicking watch task cannot leave a half-written map entry.
    seen.lock().unwrap_or_else(|e| e.into_inner())
}
