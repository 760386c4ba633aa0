//! The simulated cluster's controllers: the nodes' kubelets, the Job controller, the
//! scheduler and the training itself. `Cluster::step` advances everything to the
//! virtual clock's now and returns the worker reports to publish; it does no I/O
//! beyond the in-memory store and the workers' checkpoint files (when a
//! checkpoint root is configured), so tests drive it step by step.
//!
//! Simplifications, deliberately: nodes account only GPUs (`nvidia.com/gpu`,
//! `nvidia.com/mig-*`), CPU, memory and pod counts, and the scheduler picks among
//! the nodes that fit by free GPUs alone; CPU and memory requests are summed as
//! kube-scheduler's `NodeResourcesFit` sums them, but pod-level `spec.resources`
//! is not read; a Job is a gang (any worker failure fails the Job, as Trainyard's
//! Jobs have `backoffLimit: 0`); the workers of a gang start training together
//! once all are Running (a rendezvous) and advance in lockstep.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use gpu_allocator_core::{
    NodeKey, NodeRequirement, NodeSelectorTerm, Taint, TaintEffect, Toleration, TolerationOperator,
};
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::{
    self as k8s, ConfigMap, Container, ContainerState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Node, NodeCondition,
    NodeSpec, NodeStatus, Pod, PodAffinityTerm, PodCondition, PodSpec, PodStatus, Secret,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use serde::de::value::StrDeserializer;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;
use trainyard_api::placement::{self, LABEL_ATTEMPT, LABEL_JOB, LABEL_WORKER_INDEX};
use trainyard_api::quantity::{QuantityError, bytes, cpu_millis};
use trainyard_contracts::cost::{UtilizationReported, WorkerPhase};
use trainyard_contracts::decisions::{RetentionApplied, RetentionExecutor};
use trainyard_contracts::hash::fnv1a_of;
use trainyard_contracts::object_key;
use trainyard_contracts::worker::{
    CheckpointReported, NATS_TOKEN_ENV as TOKEN_ENV, ProgressReported, VerificationMethod,
};

use crate::checkpoints::{self, CheckpointStorage, SaveDraw, SavePlan};
use crate::clock::SimClock;
use crate::config::{ClusterConfig, NodeGroup, NodeScoring};
use crate::pod_admission;
use crate::resources;
use crate::selector::Selector;
use crate::store::{
    Change, ChangeKind, JOB_CONTROLLER_UID_LABEL, JOB_NAME_LABEL, Propagation, Store,
};
use crate::typed;

const GPU: &str = "nvidia.com/gpu";
const MIG_PREFIX: &str = "nvidia.com/mig-";
/// Per-job override of the epoch speed, for trace replay (set through `spec.env`).
pub const EPOCH_SECONDS_ENV: &str = "TRAINYARD_SIM_SECONDS_PER_EPOCH";
/// Per-job idleness on demand (set through `spec.env`): once the workers reach
/// this epoch they hold their GPUs without using them, until stopped.
pub const IDLE_AFTER_EPOCH_ENV: &str = "TRAINYARD_SIM_IDLE_AFTER_EPOCH";
/// GPU utilisation the workers report in each phase; training is per model.
const STARTING_UTILIZATION: f64 = 0.0;
const LOADING_UTILIZATION: f64 = 0.03;
const CHECKPOINTING_UTILIZATION: f64 = 0.04;
const IDLE_UTILIZATION: f64 = 0.01;

fn wall_clock() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn time_now() -> Time {
    Time(Timestamp::now())
}

/// What a simulated worker says over NATS.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Progress {
        namespace: String,
        training_job: String,
        payload: ProgressReported,
        /// The pods' `TRAINYARD_NATS_TOKEN`, which a worker connects with.
        nats_token: Option<String>,
    },
    Checkpoint {
        namespace: String,
        training_job: String,
        payload: CheckpointReported,
        nats_token: Option<String>,
    },
    Utilization {
        namespace: String,
        training_job: String,
        payload: UtilizationReported,
        nats_token: Option<String>,
    },
}

/// A command a worker received.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerCommand {
    CheckpointNow {
        namespace: String,
        training_job: String,
    },
    Stop {
        namespace: String,
        training_job: String,
    },
    /// Save checkpoints this many (simulated) seconds apart (`checkpoint.frequency: auto`).
    CheckpointInterval {
        namespace: String,
        training_job: String,
        seconds: f64,
    },
}

/// How one gang run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Succeeded,
    Failed,
    Disrupted,
}

/// The simulated history of one TrainingJob, in simulated seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobHistory {
    pub gpus: u32,
    /// When each gang run started training (all workers Running).
    pub started: Vec<f64>,
    /// When each run ended, and how.
    pub ended: Vec<(f64, RunOutcome)>,
}

/// A sample of the cluster's GPU use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageSample {
    pub at: f64,
    pub busy_gpus: u32,
    pub total_gpus: u32,
    pub pending_pods: u32,
}

#[derive(Debug, Clone)]
struct NodeSlot {
    group: usize,
    index: u32,
    name: String,
    generation: u32,
    /// Down (reclaimed or failed) until this simulated time.
    down_until: Option<f64>,
}

#[derive(Debug, Clone)]
struct Run {
    namespace: String,
    job: String,
    training_job: String,
    attempt: u32,
    workers: u32,
    gpus: u32,
    started: Option<f64>,
    start_epoch: u32,
    total_epochs: u32,
    seconds_per_epoch: f64,
    checkpoint_dir: Option<String>,
    /// `CHECKPOINT_FREQUENCY` in epochs; 0: never on its own.
    checkpoint_every: u32,
    /// `CHECKPOINT_FREQUENCY=auto`: saves follow the advised interval.
    checkpoint_auto: bool,
    /// The advised seconds between saves (`CHECKPOINT_INTERVAL_SECONDS`, then
    /// checkpoint-interval commands); every epoch until there is one.
    checkpoint_interval_seconds: Option<f64>,
    /// The epoch of the run's last save (its start epoch before one).
    last_checkpoint_epoch: u32,
    reported_epoch: u32,
    /// Fails when training reaches this simulated time, with this exit code.
    failure: Option<(f64, i32)>,
    stop_requested: bool,
    /// How good the run's hyperparameters are, 0..=1 (see [`quality`]).
    quality: f64,
    model: String,
    model_key: u64,
    /// The checkpoint it resumes from (`RESUME_FROM`).
    resume_from: Option<String>,
    /// What reading `RESUME_FROM` found, for the start line of the log.
    resume_note: String,
    /// Rank 0 was killed while saving a checkpoint; the run fails on the next
    /// step, after its report is out.
    killed_in_save: bool,
    /// `TRAINYARD_NATS_TOKEN` of its pods (from the planner's Secret), if set.
    nats_token: Option<String>,
    /// `TRAINYARD_SIM_IDLE_AFTER_EPOCH`: training stops advancing at this epoch.
    idle_after_epoch: Option<u32>,
    /// Whether the workers have gone idle (and said so in their logs).
    idle: bool,
    /// The phase (and idleness) last reported, and when the next report is due.
    utilization_reported: Option<(WorkerPhase, bool)>,
    utilization_due: f64,
}

impl Run {
    /// Whether the run saves a checkpoint at the end of `epoch`: every
    /// `CHECKPOINT_FREQUENCY` epochs, or with `auto` once the advised interval
    /// has passed since the last save (every epoch until there is advice).
    fn checkpoint_due(&self, epoch: u32) -> bool {
        if self.checkpoint_dir.is_none() || self.checkpoint_every == 0 {
            return false;
        }
        match (self.checkpoint_auto, self.checkpoint_interval_seconds) {
            (true, Some(interval)) => {
                let since = epoch.saturating_sub(self.last_checkpoint_epoch);
                f64::from(since) * self.seconds_per_epoch >= interval
            }
            _ => epoch.is_multiple_of(self.checkpoint_every),
        }
    }
}

/// The simulated cluster.
pub struct Cluster {
    store: Arc<Store>,
    config: ClusterConfig,
    clock: SimClock,
    rng: StdRng,
    nodes: Vec<NodeSlot>,
    /// By the uid of the Job running them.
    runs: HashMap<String, Run>,
    /// The names of the pods created for each Job (by uid), in the store's order:
    /// what a controller-uid label selector finds, without reading every pod's
    /// labels on every step. Dropped with the Job.
    job_pods: HashMap<String, BTreeSet<String>>,
    /// The store's changes, applied to `live_pods` and `live_jobs` before a step
    /// reads them: finished pods and Jobs pile up over a run, and listing the
    /// store would read every one of them on every step.
    changes: broadcast::Receiver<Change>,
    /// Every pod, by namespace and name: what [`Cluster::pods_of`] reads without
    /// taking the store's lock and allocating a key for each pod of each Job.
    pods: HashMap<String, HashMap<String, Arc<PodFacts>>>,
    /// Pods not yet Succeeded or Failed, by namespace and name (the store's order).
    live_pods: BTreeMap<(String, String), Arc<PodFacts>>,
    /// Jobs not yet Complete or Failed, by namespace and name (the store's order).
    live_jobs: BTreeMap<(String, String), Arc<LiveJob>>,
    /// The nodes as the scheduler last read them, in the store's order.
    node_facts: Vec<NodeFacts>,
    bound_at: HashMap<String, f64>,
    history: BTreeMap<String, JobHistory>,
    usage: Vec<UsageSample>,
    last_step: f64,
    /// Where workers write checkpoints; None: they report without writing.
    checkpoints: Option<CheckpointStorage>,
}

/// Where the store keeps an object: its namespace (empty if cluster-scoped) and name.
fn store_key(metadata: &ObjectMeta) -> Option<(String, String)> {
    let namespace = metadata.namespace.clone().unwrap_or_default();
    Some((namespace, metadata.name.clone()?))
}

/// What any stored object says of itself: how the cluster still knows one
/// that does not read as its kind.
#[derive(Debug, Default, serde::Deserialize)]
struct Named {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// `"4"`, `4` or `"4000m"` as whole units.
fn quantity(value: &Quantity) -> u32 {
    let text = value.0.as_str();
    match text.strip_suffix('m') {
        Some(milli) => milli.parse::<u32>().map(|m| m / 1000).unwrap_or(0),
        None => text.parse().unwrap_or(0),
    }
}

/// Extended resources (GPUs, MIG slices) a pod asks for: limits, else requests.
fn pod_requests(spec: &PodSpec) -> BTreeMap<&str, u32> {
    let mut total = BTreeMap::new();
    for resources in spec.containers.iter().filter_map(|c| c.resources.as_ref()) {
        let limits = resources.limits.as_ref();
        for (list, is_limits) in [(limits, true), (resources.requests.as_ref(), false)] {
            for (name, value) in list.into_iter().flatten() {
                if (name == GPU || name.starts_with(MIG_PREFIX))
                    && (is_limits || limits.is_none_or(|l| !l.contains_key(name)))
                {
                    *total.entry(name.as_str()).or_insert(0) += quantity(value);
                }
            }
        }
    }
    total
}

/// CPU and memory, in the units the scheduler accounts them in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Compute {
    cpu_millis: u64,
    memory_bytes: u64,
}

impl Compute {
    fn plus(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }

    /// What is left of `self` once `other` is taken; never below nothing, as
    /// pods bound by a client may overcommit a node.
    fn minus(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
        }
    }

    /// The larger of each.
    fn max(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.max(other.cpu_millis),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
        }
    }
}

/// A resource list (`requests`, `limits`, `overhead`, `allocatable`).
type ResourceList = BTreeMap<String, Quantity>;

/// The CPU and memory in a resource list; `path` names the list in errors
/// (built only then: this runs on every pod change).
fn compute_in(list: Option<&ResourceList>, path: &dyn Fn() -> String) -> Result<Compute, String> {
    let read = |resource: &str, parse: fn(&str) -> Result<u64, QuantityError>| match list
        .and_then(|list| list.get(resource))
    {
        None => Ok(0),
        Some(value) => parse(&value.0).map_err(|err| format!("{}.{resource}: {err}", path())),
    };
    Ok(Compute {
        cpu_millis: read("cpu", cpu_millis)?,
        memory_bytes: read("memory", bytes)?,
    })
}

/// The CPU and memory requests of container `index` of `spec.<list>`. A resource
/// with a limit and no request requests its limit, as the API server defaults it.
fn container_compute(container: &Container, list: &str, index: usize) -> Result<Compute, String> {
    let resources = container.resources.as_ref();
    let requested = resources.and_then(|r| r.requests.as_ref());
    let limited = resources.and_then(|r| r.limits.as_ref());
    let section = |values, section: &str| {
        compute_in(values, &|| {
            format!("spec.{list}[{index}].resources.{section}")
        })
    };
    let (requests, limits) = (section(requested, "requests")?, section(limited, "limits")?);
    let has_request = |resource: &str| requested.is_some_and(|r| r.contains_key(resource));
    Ok(Compute {
        cpu_millis: if has_request("cpu") {
            requests.cpu_millis
        } else {
            limits.cpu_millis
        },
        memory_bytes: if has_request("memory") {
            requests.memory_bytes
        } else {
            limits.memory_bytes
        },
    })
}

/// The CPU and memory a pod requests, as kube-scheduler's `NodeResourcesFit`
/// counts them: the containers' requests summed, or more if an init container
/// needs more while it runs, plus `spec.overhead`. Sidecars (init containers with
/// `restartPolicy: Always`) keep running: they add to the containers and to every
/// init container after them. An error names the quantity that does not parse.
fn pod_compute(spec: &PodSpec) -> Result<Compute, String> {
    let mut total = Compute::default();
    for (i, container) in spec.containers.iter().enumerate() {
        total = total.plus(container_compute(container, "containers", i)?);
    }
    let mut sidecars = Compute::default();
    let mut largest_init = Compute::default();
    for (i, container) in spec.init_containers.iter().flatten().enumerate() {
        let requests = container_compute(container, "initContainers", i)?;
        if container.restart_policy.as_deref() == Some("Always") {
            total = total.plus(requests);
            sidecars = sidecars.plus(requests);
            largest_init = largest_init.max(sidecars);
        } else {
            largest_init = largest_init.max(requests.plus(sidecars));
        }
    }
    let overhead = compute_in(spec.overhead.as_ref(), &|| "spec.overhead".to_owned())?;
    Ok(total.max(largest_init).plus(overhead))
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
}

/// One of the allocator core's enums by the name Kubernetes gives the value
/// (its variants are named so): `In`, `Exists`, `NoSchedule`, ...
fn by_api_name<T: DeserializeOwned>(name: &str) -> Option<T> {
    T::deserialize(StrDeserializer::<serde::de::value::Error>::new(name)).ok()
}

/// A pod's toleration in the allocator's terms, whose matching the scheduler
/// shares. None for one the API server would refuse (an unknown operator or
/// effect): it tolerates nothing.
fn toleration(t: &k8s::Toleration) -> Option<Toleration> {
    let operator = match t.operator.as_deref() {
        None | Some("") => TolerationOperator::Equal,
        Some(operator) => by_api_name(operator)?,
    };
    let effect = match t.effect.as_deref() {
        None | Some("") => None,
        Some(effect) => Some(by_api_name(effect)?),
    };
    Some(Toleration {
        key: t.key.clone().filter(|k| !k.is_empty()),
        operator,
        value: t.value.clone(),
        effect,
    })
}

/// A node's taint in the allocator's terms. An effect the API server would
/// refuse reads as `NoSchedule`: it keeps off the pods that do not tolerate it.
fn taint(t: &k8s::Taint) -> Taint {
    Taint {
        key: t.key.clone(),
        value: t.value.clone().unwrap_or_default(),
        effect: by_api_name(&t.effect).unwrap_or(TaintEffect::NoSchedule),
    }
}

/// A required node-affinity term in the allocator's terms, whose matching the
/// scheduler shares (labels, `metadata.name` fields, `Gt`/`Lt`; a term without
/// requirements matches no node). None for one the API server would refuse (an
/// unknown operator, a field other than `metadata.name`): it matches no node.
fn node_term(term: &k8s::NodeSelectorTerm) -> Option<NodeSelectorTerm> {
    let labels = term.match_expressions.iter().flatten().map(|e| {
        Some(NodeRequirement {
            key: NodeKey::Label(e.key.clone()),
            operator: by_api_name(&e.operator)?,
            values: e.values.clone().unwrap_or_default(),
        })
    });
    let fields = term.match_fields.iter().flatten().map(|f| {
        Some(NodeRequirement {
            key: (f.key == "metadata.name").then_some(NodeKey::Name)?,
            operator: by_api_name(&f.operator)?,
            values: f.values.clone().unwrap_or_default(),
        })
    });
    let requirements = labels.chain(fields).collect::<Option<Vec<_>>>()?;
    Some(NodeSelectorTerm { requirements })
}

fn condition(type_: &str, status: &str) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        ..PodCondition::default()
    }
}

fn condition_because(type_: &str, status: &str, reason: &str) -> PodCondition {
    PodCondition {
        reason: Some(reason.to_owned()),
        ..condition(type_, status)
    }
}

fn job_condition(type_: &str, reason: &str, at: Option<Time>) -> JobCondition {
    JobCondition {
        type_: type_.to_owned(),
        status: "True".to_owned(),
        reason: Some(reason.to_owned()),
        last_transition_time: at,
        ..JobCondition::default()
    }
}

fn ready_condition(ready: bool) -> NodeCondition {
    let (status, reason) = if ready {
        ("True", "KubeletReady")
    } else {
        ("Unknown", "NodeStatusUnknown")
    };
    NodeCondition {
        type_: "Ready".to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        last_transition_time: Some(time_now()),
        ..NodeCondition::default()
    }
}

/// The conditions kube-scheduler gives a pod it leaves alone for its gates.
fn scheduling_gated() -> Vec<PodCondition> {
    vec![PodCondition {
        message: Some("Scheduling is blocked due to non-empty scheduling gates".to_owned()),
        ..condition_because("PodScheduled", "False", "SchedulingGated")
    }]
}

/// A container's status with no image pulled yet, in `state`.
fn container_status(
    name: &str,
    image: &str,
    ready: bool,
    state: ContainerState,
) -> ContainerStatus {
    ContainerStatus {
        name: name.to_owned(),
        image: image.to_owned(),
        ready,
        state: Some(state),
        ..ContainerStatus::default()
    }
}

fn terminated(exit_code: i32, reason: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            reason: Some(reason.to_owned()),
            finished_at: Some(time_now()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

/// The name of a pod's first container, which the simulated worker runs in.
fn worker_container(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map_or("worker", |c| c.name.as_str())
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn labels_of(metadata: &ObjectMeta) -> &BTreeMap<String, String> {
    metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// A pod with what the steps read of it: read once per change rather than on
/// every step.
struct PodFacts {
    pod: Pod,
    namespace: String,
    name: String,
    /// `spec.nodeName`.
    node: Option<String>,
    /// Whether `spec.schedulingGates` holds a gate: the scheduler leaves it alone.
    gated: bool,
    /// Whether its status already says so (see [`scheduling_gated`]).
    gated_reported: bool,
    phase: String,
    /// The GPUs and MIG slices it asks for (see [`pod_requests`]).
    requests: BTreeMap<String, u32>,
    /// The CPU and memory it asks for, or why they cannot be read (see
    /// [`pod_compute`]; a pod that does not read as a Pod cannot either).
    compute: Result<Compute, String>,
    resource_version: Option<u64>,
}

impl PodFacts {
    fn of(object: &Value) -> Self {
        let (pod, compute) = match typed::read::<Pod>(resources::pods(), object) {
            Ok(pod) => {
                let compute = pod
                    .spec
                    .as_ref()
                    .map_or(Ok(Compute::default()), pod_compute);
                (pod, compute)
            }
            Err(err) => {
                // Still known by name, so the scheduler can say why it is left alone.
                let metadata = typed::read::<Named>(resources::pods(), object)
                    .map(|named| named.metadata)
                    .unwrap_or_default();
                let pod = Pod {
                    metadata,
                    ..Pod::default()
                };
                (pod, Err(err.message))
            }
        };
        let spec = pod.spec.as_ref();
        let gated = spec
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|gates| !gates.is_empty());
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let requests = spec
            .map(pod_requests)
            .unwrap_or_default()
            .into_iter()
            .map(|(resource, count)| (resource.to_owned(), count))
            .collect();
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()),
            gated,
            gated_reported: gated && conditions.is_some_and(|c| *c == scheduling_gated()),
            phase: phase(&pod).to_owned(),
            requests,
            compute,
            resource_version: pod
                .metadata
                .resource_version
                .as_deref()
                .and_then(|rv| rv.parse().ok()),
            pod,
        }
    }

    fn terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }

    fn labels(&self) -> &BTreeMap<String, String> {
        labels_of(&self.pod.metadata)
    }
}

/// A Job not yet Complete or Failed, with what the Job controller reads of it on
/// every step: read once per change.
struct LiveJob {
    job: Job,
    uid: String,
    namespace: String,
    name: String,
    suspended: bool,
    /// `status.active` and `status.ready`, when not negative.
    active: Option<u64>,
    ready: Option<u64>,
    started: bool,
    /// Whether any condition is `Suspended`, and whether that is the only one.
    suspended_condition: bool,
    only_suspended_condition: bool,
}

impl LiveJob {
    fn of(job: Job) -> Self {
        let text = |field: &Option<String>| field.clone().unwrap_or_default();
        let status = job.status.as_ref();
        let conditions = status.and_then(|s| s.conditions.as_deref());
        let suspended = |c: &JobCondition| c.type_ == "Suspended";
        let count = |n: Option<i32>| n.and_then(|n| u64::try_from(n).ok());
        Self {
            uid: text(&job.metadata.uid),
            namespace: text(&job.metadata.namespace),
            name: text(&job.metadata.name),
            suspended: job.spec.as_ref().and_then(|s| s.suspend) == Some(true),
            active: count(status.and_then(|s| s.active)),
            ready: count(status.and_then(|s| s.ready)),
            started: status.is_some_and(|s| s.start_time.is_some()),
            suspended_condition: conditions.is_some_and(|c| c.iter().any(suspended)),
            only_suspended_condition: conditions.is_some_and(|c| c.len() == 1 && suspended(&c[0])),
            job,
        }
    }
}

/// What the scheduler reads of a node object, kept while the object is unchanged:
/// nodes rarely change, and reading all of them on every binding step was a
/// large part of the step.
struct NodeFacts {
    object: Arc<Value>,
    name: String,
    labels: BTreeMap<String, String>,
    schedulable: bool,
    taints: Vec<Taint>,
    /// Allocatable GPUs, MIG slices and pod slots, the resources the scheduler
    /// accounts by count.
    allocatable: Vec<(String, i64)>,
    allocatable_compute: Compute,
}

impl NodeFacts {
    fn of(object: &Arc<Value>) -> Self {
        // The API server refuses a node that does not read as one, or whose
        // quantities do not parse; one that got in anyway offers nothing.
        let node = typed::read::<Node>(resources::nodes(), object).unwrap_or_else(|err| {
            tracing::warn!(error = %err, "node offers nothing");
            let metadata = typed::read::<Named>(resources::nodes(), object)
                .map(|named| named.metadata)
                .unwrap_or_default();
            Node {
                metadata,
                ..Node::default()
            }
        });
        let (spec, status) = (node.spec.as_ref(), node.status.as_ref());
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let allocatable = status.and_then(|s| s.allocatable.as_ref());
        Self {
            object: object.clone(),
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: labels_of(&node.metadata).clone(),
            schedulable: ready && spec.and_then(|s| s.unschedulable) != Some(true),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .map(taint)
                .collect(),
            allocatable: allocatable
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k == GPU || k.starts_with(MIG_PREFIX) || *k == "pods")
                .map(|(k, v)| (k.clone(), i64::from(quantity(v))))
                .collect(),
            allocatable_compute: compute_in(allocatable, &|| "status.allocatable".to_owned())
                .unwrap_or_default(),
        }
    }
}

/// What the scheduler reads of a node in a step, and what is left of its resources.
struct NodeView<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
    schedulable: bool,
    taints: &'a [Taint],
    /// Allocatable less what the pods bound to it ask for; a resource it does not
    /// list has none.
    free: Vec<(&'a str, i64)>,
    free_compute: Compute,
}
impl<'a> NodeView<'a> {
    fn of(node: &'a NodeFacts) -> Self {
        Self {
            name: &node.name,
            labels: &node.labels,
            schedulable: node.schedulable,
            taints: &node.taints,
            free: node
                .allocatable
                .iter()
                .map(|(resource, count)| (resource.as_str(), *count))
                .collect(),
            free_compute: node.allocatable_compute,
        }
    }

    fn free(&self, resource: &str) -> i64 {
        self.free
            .iter()
            .find(|(name, _)| *name == resource)
            .map_or(0, |(_, count)| *count)
    }

    fn free_mut(&mut self, resource: &'a str) -> &mut i64 {
        let at = match self.free.iter().position(|(name, _)| *name == resource) {
            Some(at) => at,
            None => {
                self.free.push((resource, 0));
                self.free.len() - 1
            }
        };
        &mut self.free[at].1
    }

    /// Takes what a pod asks for, and a pod slot.
    fn take(&mut self, requests: &'a BTreeMap<String, u32>, compute: Compute) {
        for (resource, count) in requests {
            *self.free_mut(resource) -= i64::from(*count);
        }
        *self.free_mut("pods") -= 1;
        self.free_compute = self.free_compute.minus(compute);
    }
}

/// A required pod anti-affinity term, resolved against the pods already placed:
/// a node whose `topology` label has one of the `taken` values may not take the pod.
struct Spread<'a> {
    topology: &'a str,
    /// The `topology` label values of the nodes of the pods the term selects.
    taken: Vec<&'a str>,
}

/// A required pod affinity term, resolved against the pods already placed:
/// the node must carry the `topology` label, with one of the values in
/// `domains` (the nodes of the pods the term selects; None for a node without
/// the label). With no such pod anywhere, as in kube-scheduler, a pod the term
/// selects itself may go to any node that carries the label (the first worker
/// of a gang).
struct Gather<'a> {
    topology: &'a str,
    domains: Vec<Option<&'a str>>,
    selects_itself: bool,
}

/// The labels of a placed pod's node, and the pod's own.
type Placed<'a> = (&'a BTreeMap<String, String>, &'a BTreeMap<String, String>);

/// What the scheduler reads of a pending pod, looked up once rather than once
/// per node.
struct PodNeeds<'a> {
    requests: &'a BTreeMap<String, u32>,
    compute: Compute,
    tolerations: Vec<Toleration>,
    node_selector: Option<&'a BTreeMap<String, String>>,
    /// Required node affinity: any one term must match (None: a term no node matches).
    affinity_terms: Option<Vec<Option<NodeSelectorTerm>>>,
    pod_affinity: Vec<Gather<'a>>,
    anti_affinity: Vec<Spread<'a>>,
}

impl<'a> PodNeeds<'a> {
    /// `compute` is what the pod's CPU and memory requests read as; `placed`
    /// holds the labels of each bound pod and of its node.
    fn of(pod: &'a PodFacts, compute: Compute, placed: &[Placed<'a>]) -> Self {
        let spec = pod.pod.spec.as_ref();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        // Whether a term selects pods with `labels`: the allocator's reading.
        let selects = |term: &PodAffinityTerm, labels: &BTreeMap<String, String>| {
            term.label_selector
                .as_ref()
                .is_some_and(|selector| placement::selects(selector, labels))
        };
        // The topology label values of the nodes of the placed pods `term` selects.
        let domains = |term: &'a PodAffinityTerm, topology: &'a str| -> Vec<Option<&'a str>> {
            placed
                .iter()
                .filter(|(_, pod_labels)| selects(term, pod_labels))
                .map(|(node_labels, _)| node_labels.get(topology).map(String::as_str))
                .collect()
        };
        let topology_of = |term: &'a PodAffinityTerm| match term.topology_key.as_str() {
            "" => "kubernetes.io/hostname",
            key => key,
        };
        let spread = |term: &'a PodAffinityTerm| {
            let topology = topology_of(term);
            Spread {
                topology,
                taken: domains(term, topology).into_iter().flatten().collect(),
            }
        };
        let gather = |term: &'a PodAffinityTerm| {
            let topology = topology_of(term);
            Gather {
                topology,
                domains: domains(term, topology),
                selects_itself: selects(term, pod.labels()),
            }
        };
        Self {
            requests: &pod.requests,
            compute,
            tolerations: spec
                .and_then(|s| s.tolerations.as_ref())
                .into_iter()
                .flatten()
                .filter_map(toleration)
                .collect(),
            node_selector: spec.and_then(|s| s.node_selector.as_ref()),
            affinity_terms: affinity
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|required| required.node_selector_terms.iter().map(node_term).collect()),
            pod_affinity: affinity
                .and_then(|a| a.pod_affinity.as_ref())
                .and_then(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .into_iter()
                .flatten()
                .map(gather)
                .collect(),
            anti_affinity: affinity
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .into_iter()
                .flatten()
                .map(spread)
                .collect(),
        }
    }
}

/// Whether a node can take a pod; if not, `reject` hears why. As in
/// kube-scheduler, a node that fails a constraint has that one reason, and a
/// node short of resources has one per resource it lacks.
fn fits(needs: &PodNeeds, node: &NodeView, mut reject: impl FnMut(&'static str)) -> bool {
    if let Some(reason) = unmet_constraint(needs, node) {
        reject(reason);
        return false;
    }
    let (want, free) = (needs.compute, node.free_compute);
    let gpus_short = needs
        .requests
        .iter()
        .any(|(resource, want)| node.free(resource) < i64::from(*want));
    let shortfalls = [
        (want.cpu_millis > free.cpu_millis, "Insufficient cpu"),
        (want.memory_bytes > free.memory_bytes, "Insufficient memory"),
        (gpus_short || node.free("pods") < 1, "insufficient GPUs"),
    ];
    let mut fits = true;
    for (short, reason) in shortfalls {
        if short {
            reject(reason);
            fits = false;
        }
    }
    fits
}

/// The first constraint other than free resources that a node fails for a pod
/// (readiness, taints, selectors and affinity, anti-affinity), if any. Taints
/// and node affinity are matched by the allocator core's rules, so the
/// scheduler and the allocator agree on where a job's pods may go.
fn unmet_constraint(needs: &PodNeeds, node: &NodeView) -> Option<&'static str> {
    let labels = node.labels;
    if !node.schedulable {
        return Some("node not ready or cordoned");
    }
    let untolerated = node
        .taints
        .iter()
        .filter(|taint| taint.repels())
        .any(|taint| !needs.tolerations.iter().any(|t| t.tolerates(taint)));
    if untolerated {
        return Some("untolerated taint");
    }
    let selector_ok = needs
        .node_selector
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let affinity_ok = needs.affinity_terms.as_ref().is_none_or(|terms| {
        terms.is_empty()
            || terms
                .iter()
                .flatten()
                .any(|term| term.matches(node.name, labels))
    });
    if !selector_ok || !affinity_ok {
        return Some("node selector or affinity mismatch");
    }
    if !pod_affinity_met(&needs.pod_affinity, labels) {
        return Some("pod affinity");
    }
    let conflict = needs.anti_affinity.iter().any(|spread| {
        labels
            .get(spread.topology)
            .is_some_and(|domain| spread.taken.contains(&domain.as_str()))
    });
    conflict.then_some("pod anti-affinity")
}

/// kube-scheduler's rule for required pod affinity: the node carries every
/// term's topology label, and each term's selected pods are in the node's
/// domain; or no placed pod is selected by any term and the pod selects
/// itself by each.
fn pod_affinity_met(terms: &[Gather], labels: &BTreeMap<String, String>) -> bool {
    let values: Option<Vec<&str>> = terms
        .iter()
        .map(|term| labels.get(term.topology).map(String::as_str))
        .collect();
    let Some(values) = values else {
        return false;
    };
    let gathered = terms
        .iter()
        .zip(&values)
        .all(|(term, value)| term.domains.contains(&Some(*value)));
    gathered
        || terms
            .iter()
            .all(|term| term.domains.is_empty() && term.selects_itself)
}

impl Cluster {
    pub fn new(store: Arc<Store>, config: ClusterConfig, clock: SimClock) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        let mut nodes = Vec::new();
        for (group, spec) in config.nodes.iter().enumerate() {
            for index in 0..spec.count {
                nodes.push(NodeSlot {
                    group,
                    index,
                    name: format!("{}-{index}", spec.name),
                    generation: 0,
                    down_until: None,
                });
            }
        }
        let changes = store.subscribe();
        let checkpoints = config.checkpoints.root.clone().map(CheckpointStorage::new);
        let mut cluster = Self {
            store,
            config,
            clock,
            rng,
            nodes,
            runs: HashMap::new(),
            job_pods: HashMap::new(),
            changes,
            pods: HashMap::new(),
            live_pods: BTreeMap::new(),
            live_jobs: BTreeMap::new(),
            node_facts: Vec::new(),
            bound_at: HashMap::new(),
            history: BTreeMap::new(),
            usage: Vec::new(),
            last_step: 0.0,
            checkpoints,
        };
        cluster.relist();
        for slot in cluster.nodes.clone() {
            cluster.register_node(&slot);
        }
        for (name, value) in &cluster.config.priority_classes {
            let class = PriorityClass {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                value: Some(*value),
                ..PriorityClass::default()
            };
            // Already there: the store outlived an earlier cluster.
            let _ = cluster
                .store
                .create_as(resources::priority_classes(), None, &class, false);
        }
        cluster
    }

    pub fn clock(&self) -> SimClock {
        self.clock
    }

    /// Total whole GPUs the configured nodes advertise when all are up.
    pub fn total_gpus(&self) -> u32 {
        self.config
            .nodes
            .iter()
            .map(|g| g.count * g.gpus * g.time_slicing_replicas.unwrap_or(1))
            .sum()
    }

    /// Per TrainingJob (`namespace/name`), what the cluster ran.
    pub fn history(&self) -> &BTreeMap<String, JobHistory> {
        &self.history
    }

    /// GPU use, one sample per step.
    pub fn usage(&self) -> &[UsageSample] {
        &self.usage
    }

    fn node_object(group: &NodeGroup, slot: &NodeSlot) -> Node {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), slot.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            (
                "karpenter.sh/capacity-type".to_owned(),
                group.capacity_type.as_str().to_owned(),
            ),
            ("trainyard.dev/simulated".to_owned(), "true".to_owned()),
            ("nvidia.com/gpu.count".to_owned(), group.gpus.to_string()),
        ]);
        let optional = [
            ("nvidia.com/gpu.product", group.gpu_product.clone()),
            (
                "nvidia.com/gpu.memory",
                group.gpu_memory_mib.map(|m| m.to_string()),
            ),
            (
                "nvidia.com/gpu.replicas",
                group.time_slicing_replicas.map(|r| r.to_string()),
            ),
            ("topology.kubernetes.io/zone", group.zone.clone()),
            ("topology.kubernetes.io/region", group.region.clone()),
            ("trainyard.dev/price-class", group.price_class.clone()),
            (
                "nvidia.com/gpu.clique",
                group
                    .nodes_per_rack
                    .map(|n| format!("{}-rack-{}", group.name, slot.index / n.max(1))),
            ),
        ];
        for (label, value) in optional {
            if let Some(value) = value {
                labels.insert(label.to_owned(), value);
            }
        }
        labels.extend(group.labels.clone());
        let gpus = group.gpus * group.time_slicing_replicas.unwrap_or(1);
        let mut allocatable = ResourceList::from([(GPU.to_owned(), Quantity(gpus.to_string()))]);
        for (profile, count) in &group.mig {
            allocatable.insert(
                format!("{MIG_PREFIX}{profile}"),
                Quantity(count.to_string()),
            );
        }
        allocatable.insert("cpu".to_owned(), Quantity(group.cpu.clone()));
        allocatable.insert("memory".to_owned(), Quantity(group.memory.clone()));
        allocatable.insert("pods".to_owned(), Quantity("110".to_owned()));
        let taints = group
            .taints
            .iter()
            .map(|t| k8s::Taint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                ..k8s::Taint::default()
            })
            .collect();
        Node {
            metadata: ObjectMeta {
                name: Some(slot.name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                unschedulable: Some(false),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(allocatable.clone()),
                allocatable: Some(allocatable),
                conditions: Some(vec![ready_condition(true)]),
                ..NodeStatus::default()
            }),
        }
    }

    fn register_node(&mut self, slot: &NodeSlot) {
        let group = &self.config.nodes[slot.group];
        let node = Self::node_object(group, slot);
        if let Err(err) = self.store.create_as(resources::nodes(), None, &node, true) {
            tracing::warn!(node = %slot.name, error = %err, "cannot register node");
        }
    }

    /// Receives a worker command (from NATS).
    pub fn command(&mut self, command: WorkerCommand) -> Vec<Report> {
        let mut reports = Vec::new();
        let now = self.last_step;
        let (WorkerCommand::Stop {
            namespace,
            training_job,
        }
        | WorkerCommand::CheckpointNow {
            namespace,
            training_job,
        }
        | WorkerCommand::CheckpointInterval {
            namespace,
            training_job,
            ..
        }) = &command;
        let uids: Vec<String> = self
            .runs
            .iter()
            .filter(|(_, run)| run.namespace == *namespace && run.training_job == *training_job)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in uids {
            let Some(mut run) = self.runs.remove(&uid) else {
                continue;
            };
            match &command {
                WorkerCommand::Stop { .. } => run.stop_requested = true,
                WorkerCommand::CheckpointInterval { seconds, .. } => {
                    if seconds.is_finite() && *seconds > 0.0 {
                        run.checkpoint_interval_seconds = Some(*seconds);
                    }
                }
                WorkerCommand::CheckpointNow { .. } => {
                    if let (Some(started), Some(_)) = (run.started, &run.checkpoint_dir)
                        && !run.killed_in_save
                    {
                        let epoch = Self::epoch_at(&run, started, now);
                        let pods = self.pods_of(&run.namespace, &uid);
                        reports.push(self.save_checkpoint(&mut run, &pods, epoch, true));
                        reports.extend(self.utilization(
                            &mut run,
                            &pods,
                            now,
                            WorkerPhase::Checkpointing,
                        ));
                    }
                }
            }
            self.runs.insert(uid, run);
        }
        reports
    }

    /// Applies a retention decision as the job's worker-side reporter does:
    /// with executor `worker` (volumes the checkpoint-manager cannot read), a
    /// running job's rank 0 deletes the listed checkpoints inside its
    /// `CHECKPOINT_DIR`. Returns the URIs it deleted.
    pub fn retention(
        &mut self,
        namespace: &str,
        training_job: &str,
        decision: &RetentionApplied,
    ) -> Vec<String> {
        let mut deleted = Vec::new();
        if decision.executor != RetentionExecutor::Worker {
            return deleted;
        }
        let Some(storage) = &self.checkpoints else {
            return deleted;
        };
        // Only a running worker's reporter is there to hear the decision.
        let Some((uid, run)) = self.runs.iter().find(|(_, run)| {
            run.namespace == namespace && run.training_job == training_job && run.started.is_some()
        }) else {
            return deleted;
        };
        let Some(dir) = run.checkpoint_dir.as_deref() else {
            return deleted;
        };
        let inside = format!("{}/", dir.trim_end_matches('/'));
        let pods = pods_of(&self.pods, &self.job_pods, namespace, uid);
        for uri in &decision.delete {
            if !uri.starts_with(&inside) {
                log_rank_zero(
                    &self.store,
                    &pods,
                    &format!("retention: not deleting {uri}: it is outside CHECKPOINT_DIR {dir}"),
                );
                continue;
            }
            let removed = storage
                .local_path(uri, namespace, training_job)
                .and_then(|path| checkpoints::delete(&path));
            let text = match removed {
                Ok(()) => {
                    deleted.push(uri.clone());
                    format!("retention: deleted {uri}")
                }
                Err(err) => format!("retention: cannot delete {uri}: {err}"),
            };
            log_rank_zero(&self.store, &pods, &text);
        }
        deleted
    }

    /// Advances the cluster to the clock's now.
    pub fn step(&mut self) -> Vec<Report> {
        let now = self.clock.now();
        self.step_at(now)
    }

    /// Advances the cluster to simulated time `now` (tests choose the time).
    pub fn step_at(&mut self, now: f64) -> Vec<Report> {
        let elapsed = (now - self.last_step).max(0.0);
        self.last_step = now;
        let mut reports = Vec::new();
        self.disrupt(now, elapsed);
        self.run_job_controller();
        self.schedule(now);
        self.start_pods(now);
        self.train(now, &mut reports);
        self.sample(now);
        reports
    }

    /// Brings `pods`, `live_pods` and `live_jobs` up to the store's present.
    fn catch_up(&mut self) {
        loop {
            match self.changes.try_recv() {
                Ok(change) => self.apply(&change),
                // Changes were missed: start again from the store's contents.
                Err(TryRecvError::Lagged(_)) => self.relist(),
                Err(TryRecvError::Empty | TryRecvError::Closed) => return,
            }
        }
    }

    /// Keeps a changed pod or Job live while it is unfinished; a deleted Job
    /// takes its run along.
    fn apply(&mut self, change: &Change) {
        let object = &change.object;
        let deleted = change.kind == ChangeKind::Deleted;
        let pod = change.resource == resources::pods().name;
        if !pod && change.resource != resources::jobs().name {
            return;
        }
        if pod {
            self.track_pod(object, deleted);
        } else {
            self.track_job(object, deleted);
        }
    }

    /// Keeps a pod's facts under its namespace and name, and among the live
    /// pods while it is unfinished.
    fn track_pod(&mut self, object: &Value, deleted: bool) {
        let facts = Arc::new(PodFacts::of(object));
        let Some(key) = store_key(&facts.pod.metadata) else {
            return;
        };
        if deleted {
            if let Some(pods) = self.pods.get_mut(&key.0) {
                pods.remove(&key.1);
            }
            self.live_pods.remove(&key);
            return;
        }
        self.pods
            .entry(key.0.clone())
            .or_default()
            .insert(key.1.clone(), facts.clone());
        if facts.terminal() {
            self.live_pods.remove(&key);
        } else {
            self.live_pods.insert(key, facts);
        }
    }

    /// Keeps a Job live while it is unfinished; a deleted Job takes its run
    /// along. One that does not read as a Job is left alone, with a warning.
    fn track_job(&mut self, object: &Value, deleted: bool) {
        let job = match typed::read::<Job>(resources::jobs(), object) {
            Ok(job) => job,
            Err(err) => {
                tracing::warn!(error = %err, "the Job controller leaves alone a Job it cannot read");
                let named = typed::read::<Named>(resources::jobs(), object).unwrap_or_default();
                if let Some(key) = store_key(&named.metadata) {
                    self.live_jobs.remove(&key);
                }
                return;
            }
        };
        if deleted && let Some(uid) = &job.metadata.uid {
            self.runs.remove(uid);
            self.job_pods.remove(uid);
        }
        let Some(key) = store_key(&job.metadata) else {
            return;
        };
        if deleted || job_finished(&job) {
            self.live_jobs.remove(&key);
        } else {
            self.live_jobs.insert(key, Arc::new(LiveJob::of(job)));
        }
    }

    /// Rebuilds `pods`, `live_pods` and `live_jobs` from a listing, and forgets the runs
    /// of Jobs that are gone. The new subscription may repeat changes the listing
    /// already holds: applied again in order, they end in the same state.
    fn relist(&mut self) {
        self.changes = self.changes.resubscribe();
        let list = |rt| {
            self.store
                .list(rt, None, &Selector::default(), &Selector::default())
                .0
        };
        let (pods, jobs) = (list(resources::pods()), list(resources::jobs()));
        let uids: HashSet<String> = jobs
            .iter()
            .filter_map(|job| {
                typed::read::<Named>(resources::jobs(), job)
                    .ok()?
                    .metadata
                    .uid
            })
            .collect();
        self.runs.retain(|uid, _| uids.contains(uid));
        self.job_pods.retain(|uid, _| uids.contains(uid));
        self.pods.clear();
        self.live_pods.clear();
        for pod in pods {
            self.track_pod(&pod, false);
        }
        self.live_jobs.clear();
        for job in jobs {
            self.track_job(&job, false);
        }
    }

    /// The pods not yet Succeeded or Failed, in the store's order.
    fn live_pods(&mut self) -> Vec<Arc<PodFacts>> {
        self.catch_up();
        self.live_pods.values().cloned().collect()
    }

    /// The pods of the Job with this uid that still exist, as of the last
    /// [`Cluster::catch_up`].
    fn pods_of(&self, namespace: &str, job_uid: &str) -> Vec<Arc<PodFacts>> {
        pods_of(&self.pods, &self.job_pods, namespace, job_uid)
    }

    /// Spot reclaims and node failures (Poisson in simulated time), and recoveries.
    fn disrupt(&mut self, now: f64, elapsed: f64) {
        let hours = elapsed / 3600.0;
        let d = &self.config.disruptions;
        let reclaim_chance = 1.0 - (-d.spot_reclaims_per_node_hour * hours).exp();
        let failure_chance = 1.0 - (-d.node_failures_per_node_hour * hours).exp();
        let recovery_seconds = d.recovery_seconds;
        for i in 0..self.nodes.len() {
            let slot = &mut self.nodes[i];
            let group = &self.config.nodes[slot.group];
            let spot = group.capacity_type == crate::config::CapacityType::Spot;
            if let Some(until) = slot.down_until {
                if now >= until {
                    slot.down_until = None;
                    if spot {
                        // A reclaimed instance comes back as a new node.
                        slot.generation += 1;
                        slot.name = format!("{}-{}-r{}", group.name, slot.index, slot.generation);
                        let slot = slot.clone();
                        self.register_node(&slot);
                    } else {
                        let name = slot.name.clone();
                        self.set_ready(&name, true);
                    }
                }
                continue;
            }
            let reclaim = spot && self.rng.random::<f64>() < reclaim_chance;
            let failure = !reclaim && self.rng.random::<f64>() < failure_chance;
            if !(reclaim || failure) {
                continue;
            }
            slot.down_until = Some(now + recovery_seconds);
            // Cloned only for a disrupted node: failing its pods needs `self`.
            let slot = slot.clone();
            let reason = if reclaim {
                "spot reclaim"
            } else {
                "node failure"
            };
            tracing::info!(node = %slot.name, reason, "node disrupted");
            for pod in self
                .live_pods()
                .into_iter()
                .filter(|p| p.node.as_deref() == Some(slot.name.as_str()))
            {
                let (reason, exit_code) = if reclaim {
                    ("TerminationByKubelet", Some(143))
                } else {
                    ("DeletionByPodGC", None)
                };
                self.fail_pod(&pod.pod, exit_code, Some(reason));
            }
            if reclaim {
                let _ = self.store.delete(
                    resources::nodes(),
                    None,
                    &slot.name,
                    Propagation::Background,
                );
            } else {
                self.set_ready(&slot.name, false);
            }
        }
    }

    fn set_ready(&self, node: &str, ready: bool) {
        let _ = self
            .store
            .update_as(resources::nodes(), None, node, |n: &mut Node| {
                n.status.get_or_insert_default().conditions = Some(vec![ready_condition(ready)]);
            });
    }

    fn fail_pod(&self, pod: &Pod, exit_code: Option<i32>, disruption: Option<&str>) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let container = worker_container(pod);
        // Written before the pod turns Failed, so a follower that sees it end has it.
        if let Some(code) = exit_code {
            let text = match (code, disruption) {
                (_, Some(_)) => {
                    format!("received SIGTERM: the node is going away; exiting with code {code}")
                }
                (137, None) => format!("killed: out of memory; exiting with code {code}"),
                _ => format!("training failed: exiting with code {code}"),
            };
            self.store.logs().append(ns, name, text);
        }
        let mut conditions = vec![condition("Ready", "False")];
        if let Some(reason) = disruption {
            conditions.push(PodCondition {
                message: Some(format!("simulated {reason}")),
                ..condition_because("DisruptionTarget", "True", reason)
            });
        }
        let statuses = match exit_code {
            Some(code) => {
                let reason = if code == 137 { "OOMKilled" } else { "Error" };
                vec![container_status(
                    container,
                    "",
                    false,
                    terminated(code, reason),
                )]
            }
            None => Vec::new(),
        };
        let _ = self
            .store
            .update_as(resources::pods(), Some(ns), name, |p: &mut Pod| {
                let status = p.status.get_or_insert_default();
                status.phase = Some("Failed".to_owned());
                status.conditions = Some(conditions);
                status.container_statuses = Some(statuses);
            });
    }

    /// The Job controller: pods for unsuspended Jobs, none for suspended ones,
    /// Job status from its pods.
    fn run_job_controller(&mut self) {
        self.catch_up();
        let jobs: Vec<Arc<LiveJob>> = self.live_jobs.values().cloned().collect();
        for job in &jobs {
            let uid = job.uid.as_str();
            let ns = job.namespace.as_str();
            let name = job.name.as_str();
            // Read before a run starts: the pods it creates count from the next step.
            let pods = self.pods_of(ns, uid);
            if job.suspended {
                for pod in pods.iter().filter(|p| !p.terminal()) {
                    let _ = self.store.delete(
                        resources::pods(),
                        Some(ns),
                        &pod.name,
                        Propagation::Background,
                    );
                }
                self.runs.remove(uid);
                let marked =
                    job.active == Some(0) && job.ready == Some(0) && job.only_suspended_condition;
                if marked {
                    continue;
                }
                let _ = self
                    .store
                    .update_as(resources::jobs(), Some(ns), name, |j: &mut Job| {
                        let status = j.status.get_or_insert_default();
                        status.active = Some(0);
                        status.ready = Some(0);
                        status.conditions = Some(vec![JobCondition {
                            message: Some("Job suspended".to_owned()),
                            ..job_condition("Suspended", "JobSuspended", None)
                        }]);
                    });
                continue;
            }
            if !self.runs.contains_key(uid) {
                // A refused Job has no pods, but it has started: its status says so.
                if let Some(run) = self.start_run(&job.job) {
                    self.runs.insert(uid.to_owned(), run);
                }
            }
            let running = pods.iter().filter(|p| p.phase == "Running").count();
            let active = pods.iter().filter(|p| !p.terminal()).count();
            // Most Jobs are unchanged on most steps: a copy-and-compare of each
            // would be most of the step's time.
            let current = job.active == Some(active as u64)
                && job.ready == Some(running as u64)
                && job.started
                && !job.suspended_condition;
            if current {
                continue;
            }
            let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
            let _ = self
                .store
                .update_as(resources::jobs(), Some(ns), name, |j: &mut Job| {
                    let status = j.status.get_or_insert_default();
                    status.active = Some(count(active));
                    status.ready = Some(count(running));
                    status.start_time.get_or_insert_with(time_now);
                    if let Some(conditions) = &mut status.conditions {
                        conditions.retain(|c| c.type_ != "Suspended");
                    }
                });
        }
    }

    /// Creates the pods of an unsuspended Job and remembers how its workers train.
    fn start_run(&mut self, job: &Job) -> Option<Run> {
        let ns = job.metadata.namespace.clone()?;
        let name = job.metadata.name.clone()?;
        let uid = job.metadata.uid.clone()?;
        let job_spec = job.spec.clone().unwrap_or_default();
        let workers = job_spec
            .completions
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(1);
        let template_meta = job_spec.template.metadata.unwrap_or_default();
        let template = job_spec.template.spec.unwrap_or_default();
        let template_labels = labels_of(&template_meta);
        let training_job = template_labels
            .get(LABEL_JOB)
            .cloned()
            .unwrap_or_else(|| name.clone());
        let attempt = template_labels
            .get(LABEL_ATTEMPT)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        if let Some(message) = pod_admission::refusal(&self.store, &ns, &name, &template, workers) {
            pod_admission::record_failed_create(&self.store, job, &message, &time_now());
            return None;
        }
        let mut gpus = 0;
        for index in 0..workers {
            let mut labels = template_labels.clone();
            labels.insert(JOB_NAME_LABEL.to_owned(), name.clone());
            labels.insert(JOB_CONTROLLER_UID_LABEL.to_owned(), uid.clone());
            labels.insert(LABEL_WORKER_INDEX.to_owned(), index.to_string());
            let mut annotations = template_meta.annotations.clone().unwrap_or_default();
            annotations.insert(LABEL_WORKER_INDEX.to_owned(), index.to_string());
            let pod = Pod {
                metadata: ObjectMeta {
                    generate_name: Some(format!("{name}-{index}-")),
                    namespace: Some(ns.clone()),
                    labels: Some(labels),
                    annotations: Some(annotations),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "batch/v1".to_owned(),
                        kind: "Job".to_owned(),
                        name: name.clone(),
                        uid: uid.clone(),
                        controller: Some(true),
                        block_owner_deletion: Some(true),
                    }]),
                    ..ObjectMeta::default()
                },
                spec: Some(PodSpec {
                    hostname: Some(format!("{name}-{index}")),
                    ..template.clone()
                }),
                status: Some(PodStatus {
                    phase: Some("Pending".to_owned()),
                    ..PodStatus::default()
                }),
            };
            gpus += pod_requests(&template).get(GPU).copied().unwrap_or(0);
            match self
                .store
                .create_as(resources::pods(), Some(&ns), &pod, true)
            {
                Ok(created) => {
                    self.job_pods
                        .entry(uid.clone())
                        .or_default()
                        .insert(created.metadata.name.unwrap_or_default());
                }
                Err(err) => {
                    tracing::warn!(job = %name, error = %err, "cannot create pod");
                    return None;
                }
            }
        }
        let env_vars = template
            .containers
            .first()
            .and_then(|c| c.env.as_deref())
            .unwrap_or_default();
        let env = |wanted: &str| -> Option<String> {
            let var = env_vars.iter().find(|e| e.name == wanted)?;
            if let Some(value) = &var.value {
                return Some(value.clone());
            }
            let source = var.value_from.as_ref()?;
            if let Some(secret_ref) = &source.secret_key_ref {
                let secret: Secret = self
                    .store
                    .get_as(resources::secrets(), Some(&ns), &secret_ref.name)
                    .ok()?;
                let key = &secret_ref.key;
                if let Some(text) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
                    return Some(text.clone());
                }
                let bytes = secret.data?.remove(key)?;
                return String::from_utf8(bytes.0).ok();
            }
            let reference = source.config_map_key_ref.as_ref()?;
            let map: ConfigMap = self
                .store
                .get_as(resources::config_maps(), Some(&ns), &reference.name)
                .ok()?;
            map.data?.remove(&reference.key)
        };
        // The files a worker reads are free-form JSON (any hyperparameters).
        let config_file = |file: &str| -> Value {
            template
                .volumes
                .iter()
                .flatten()
                // A ConfigMap volume, or one projected with others (the
                // planner's, when the workers' NATS CA joins it).
                .flat_map(|v| {
                    let projected = v
                        .projected
                        .as_ref()
                        .and_then(|p| p.sources.as_ref())
                        .into_iter()
                        .flatten()
                        .filter_map(|source| source.config_map.as_ref())
                        .map(|cm| cm.name.as_str());
                    v.config_map
                        .as_ref()
                        .map(|cm| cm.name.as_str())
                        .into_iter()
                        .chain(projected)
                })
                .filter_map(|cm| {
                    self.store
                        .get_as::<ConfigMap>(resources::config_maps(), Some(&ns), cm)
                        .ok()
                })
                .find_map(|cm| {
                    cm.data
                        .as_ref()
                        .and_then(|data| data.get(file))
                        .and_then(|t| serde_json::from_str(t).ok())
                })
                .unwrap_or(Value::Null)
        };
        let hyperparameters = config_file("hyperparameters.json");
        let training = config_file("training-config.json");
        let model = training["model"].as_str().unwrap_or_default().to_owned();
        let total_epochs = hyperparameters["epochs"].as_u64().unwrap_or(10) as u32;
        let resume_from = env("RESUME_FROM");
        let (resumed_epoch, resume_note) = match resume_from.as_deref() {
            Some(uri) => self.read_resume_point(uri, &ns, &training_job),
            None => (0, String::new()),
        };
        let start_epoch = resumed_epoch.min(total_epochs);
        let seconds_per_epoch = env(EPOCH_SECONDS_ENV)
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| self.config.seconds_per_epoch(&model));
        let checkpoint_dir = env("CHECKPOINT_DIR");
        let frequency = env("CHECKPOINT_FREQUENCY");
        let checkpoint_auto =
            frequency.as_deref() == Some(trainyard_api::CHECKPOINT_FREQUENCY_AUTO);
        let checkpoint_every = if checkpoint_auto {
            trainyard_api::trainingjob::DEFAULT_CHECKPOINT_FREQUENCY
        } else {
            frequency.and_then(|f| f.parse().ok()).unwrap_or(0)
        };
        let checkpoint_interval_seconds = env("CHECKPOINT_INTERVAL_SECONDS")
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0);
        let nats_token = env(TOKEN_ENV);
        let idle_after_epoch = env(IDLE_AFTER_EPOCH_ENV).and_then(|e| e.parse().ok());
        let failure = (self.rng.random::<f64>() < self.config.failures.rate).then(|| {
            let codes = &self.config.failures.exit_codes;
            let code = codes[self.rng.random_range(0..codes.len())];
            let fraction = self.rng.random::<f64>();
            (
                fraction * f64::from(total_epochs.saturating_sub(start_epoch)) * seconds_per_epoch,
                code,
            )
        });
        self.history
            .entry(object_key(&ns, &training_job))
            .or_default()
            .gpus = gpus;
        tracing::debug!(job = %name, workers, gpus, start_epoch, total_epochs, "pods created");
        Some(Run {
            namespace: ns,
            job: name,
            model_key: fnv1a_of(model.as_bytes()),
            model,
            resume_from,
            resume_note,
            killed_in_save: false,
            quality: quality(&hyperparameters),
            training_job,
            attempt,
            workers,
            gpus,
            started: None,
            start_epoch,
            total_epochs,
            seconds_per_epoch,
            checkpoint_dir,
            checkpoint_every,
            checkpoint_auto,
            checkpoint_interval_seconds,
            last_checkpoint_epoch: start_epoch,
            reported_epoch: start_epoch,
            failure,
            stop_requested: false,
            nats_token,
            idle_after_epoch,
            idle: false,
            utilization_reported: None,
            utilization_due: 0.0,
        })
    }

    /// The scheduler: binds pending pods without scheduling gates to nodes that
    /// satisfy their selectors, tolerations and affinities and have the GPUs,
    /// CPU and memory free, choosing among them by free GPUs (`scoring`).
    fn schedule(&mut self, now: f64) {
        let pods = self.live_pods();
        let (gated, mut pending): (Vec<&PodFacts>, Vec<&PodFacts>) = pods
            .iter()
            .filter(|p| p.node.is_none())
            .map(AsRef::as_ref)
            .partition(|p| p.gated);
        for pod in gated.iter().filter(|p| !p.gated_reported) {
            let _ = self.store.update_as(
                resources::pods(),
                Some(&pod.namespace),
                &pod.name,
                |p: &mut Pod| {
                    p.status.get_or_insert_default().conditions = Some(scheduling_gated());
                },
            );
        }
        // Most steps have nothing to bind (gated pods wait for a client to lift
        // their gates): skip the per-node accounting then.
        if pending.is_empty() {
            return;
        }
        let (nodes, _) = self.store.list(
            resources::nodes(),
            None,
            &Selector::default(),
            &Selector::default(),
        );
        self.node_facts.truncate(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            match self.node_facts.get_mut(i) {
                Some(facts) if Arc::ptr_eq(&facts.object, node) => {}
                Some(facts) => *facts = NodeFacts::of(node),
                None => self.node_facts.push(NodeFacts::of(node)),
            }
        }
        let mut views: Vec<NodeView> = self.node_facts.iter().map(NodeView::of).collect();
        let by_name: HashMap<&str, usize> =
            views.iter().enumerate().map(|(i, v)| (v.name, i)).collect();
        let mut placed: Vec<Placed> = Vec::new();
        for pod in &pods {
            if let Some(node) = pod
                .node
                .as_deref()
                .and_then(|name| by_name.get(name))
                .and_then(|i| views.get_mut(*i))
            {
                // Only a client binds a pod whose quantities do not parse (the
                // simulated scheduler does not): it holds what can be read of it.
                node.take(
                    &pod.requests,
                    pod.compute.as_ref().copied().unwrap_or_default(),
                );
                placed.push((node.labels, pod.labels()));
            }
        }
        pending.sort_by_key(|p| p.resource_version);
        for pod in pending {
            let ns = pod.namespace.as_str();
            let pod_name = pod.name.as_str();
            let compute = match &pod.compute {
                Ok(compute) => *compute,
                Err(invalid) => {
                    self.mark_unschedulable(
                        pod,
                        format!("{invalid} (a real API server refuses such a pod)"),
                    );
                    continue;
                }
            };
            let needs = PodNeeds::of(pod, compute, &placed);
            let mut best: Option<(usize, i64)> = None;
            let mut reasons: BTreeMap<&'static str, u32> = BTreeMap::new();
            for (i, node) in views.iter().enumerate() {
                let reject = |reason| *reasons.entry(reason).or_insert(0) += 1;
                if !fits(&needs, node, reject) {
                    continue;
                }
                let left = node.free(GPU);
                let better = |best_left| match self.config.scoring {
                    NodeScoring::MostAllocated => left < best_left,
                    NodeScoring::LeastAllocated => left > best_left,
                };
                if best.is_none_or(|(_, best_left)| better(best_left)) {
                    best = Some((i, left));
                }
            }
            match best.and_then(|(i, _)| views.get_mut(i)) {
                Some(node) => {
                    node.take(needs.requests, needs.compute);
                    placed.push((node.labels, pod.labels()));
                    let node = node.name.to_owned();
                    let _ = self.store.update_as(
                        resources::pods(),
                        Some(ns),
                        pod_name,
                        |p: &mut Pod| {
                            p.spec.get_or_insert_default().node_name = Some(node);
                            p.status.get_or_insert_default().conditions =
                                Some(vec![condition("PodScheduled", "True")]);
                        },
                    );
                    self.bound_at.insert(object_key(ns, pod_name), now);
                }
                None => {
                    let detail = reasons
                        .iter()
                        .map(|(r, n)| format!("{n} {r}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let message = format!("0/{} nodes are available: {detail}.", nodes.len());
                    self.mark_unschedulable(pod, message);
                }
            }
        }
    }

    /// Leaves a pending pod a `PodScheduled: False` condition saying why,
    /// unless it already says so (most pending pods wait for many steps).
    fn mark_unschedulable(&self, pod: &PodFacts, message: String) {
        let conditions = vec![PodCondition {
            message: Some(message),
            ..condition_because("PodScheduled", "False", "Unschedulable")
        }];
        let current = pod.pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        if current == Some(&conditions) {
            return;
        }
        let _ = self.store.update_as(
            resources::pods(),
            Some(&pod.namespace),
            &pod.name,
            |p: &mut Pod| {
                p.status.get_or_insert_default().conditions = Some(conditions);
            },
        );
    }

    /// The kubelets: bound pods start after the configured delay.
    fn start_pods(&mut self, now: f64) {
        let delay = self.config.workers.start_delay_seconds;
        for pod in self.live_pods() {
            if pod.phase != "Pending" || pod.node.is_none() {
                continue;
            }
            let ns = pod.namespace.as_str();
            let name = pod.name.as_str();
            let bound = *self.bound_at.entry(object_key(ns, name)).or_insert(now);
            if now < bound + delay {
                continue;
            }
            let container = worker_container(&pod.pod);
            let image = pod
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.as_deref())
                .unwrap_or_default();
            if self
                .config
                .workers
                .unpullable_images
                .iter()
                .any(|i| i == image)
            {
                self.back_off_pulling(&pod, container, image);
                continue;
            }
            let running = ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(time_now()),
                }),
                ..ContainerState::default()
            };
            let started = container_status(container, "", true, running);
            let _ = self
                .store
                .update_as(resources::pods(), Some(ns), name, |p: &mut Pod| {
                    let status = p.status.get_or_insert_default();
                    status.phase = Some("Running".to_owned());
                    status.start_time = Some(time_now());
                    status.conditions = Some(
                        ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
                            .map(|type_| condition(type_, "True"))
                            .to_vec(),
                    );
                    status.container_statuses = Some(vec![started]);
                });
            self.bound_at.remove(&object_key(ns, name));
        }
    }

    /// The kubelet cannot pull the worker's image: the pod stays Pending with
    /// its container waiting in `ImagePullBackOff` (written once).
    fn back_off_pulling(&self, pod: &PodFacts, container: &str, image: &str) {
        let waiting_reason = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| {
                s.container_statuses
                    .as_ref()?
                    .first()?
                    .state
                    .as_ref()?
                    .waiting
                    .as_ref()
            })
            .and_then(|w| w.reason.as_deref());
        if waiting_reason == Some("ImagePullBackOff") {
            return;
        }
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ImagePullBackOff".to_owned()),
                message: Some(format!("Back-off pulling image \"{image}\"")),
            }),
            ..ContainerState::default()
        };
        let status = container_status(container, image, false, waiting);
        let _ = self.store.update_as(
            resources::pods(),
            Some(&pod.namespace),
            &pod.name,
            |p: &mut Pod| {
                let not_ready = |type_| condition_because(type_, "False", "ContainersNotReady");
                let status_of_pod = p.status.get_or_insert_default();
                status_of_pod.conditions = Some(vec![
                    condition("PodScheduled", "True"),
                    condition("Initialized", "True"),
                    not_ready("ContainersReady"),
                    not_ready("Ready"),
                ]);
                status_of_pod.container_statuses = Some(vec![status]);
            },
        );
    }

    /// The epoch training has reached: it stops at the idle epoch, if any
    /// (a run resumed beyond it is idle from its start).
    fn epoch_at(run: &Run, started: f64, now: f64) -> u32 {
        let trained = ((now - started) / run.seconds_per_epoch).floor().max(0.0) as u32;
        let epoch = (run.start_epoch + trained).min(run.total_epochs);
        run.idle_after_epoch
            .map_or(epoch, |idle| epoch.min(idle.max(run.start_epoch)))
    }

    /// Each running worker's GPU utilisation report, when one is due: the
    /// phase (or idleness) changed, or `utilizationReportSeconds` passed.
    /// None when reports are off.
    fn utilization(
        &self,
        run: &mut Run,
        pods: &[Arc<PodFacts>],
        now: f64,
        phase: WorkerPhase,
    ) -> Vec<Report> {
        let every = self.config.workers.utilization_report_seconds;
        let state = (phase, run.idle);
        if every <= 0.0 || (run.utilization_reported == Some(state) && now < run.utilization_due) {
            return Vec::new();
        }
        run.utilization_reported = Some(state);
        run.utilization_due = now + every;
        pods.iter()
            .filter(|p| p.phase == "Running")
            .map(|pod| {
                let worker_index = rank(&pod.pod);
                let gpu_utilization = match phase {
                    _ if run.idle => IDLE_UTILIZATION,
                    WorkerPhase::Starting => STARTING_UTILIZATION,
                    WorkerPhase::LoadingData => LOADING_UTILIZATION,
                    WorkerPhase::Checkpointing => CHECKPOINTING_UTILIZATION,
                    // 0.80 to 0.95 by model, a little less on higher ranks.
                    WorkerPhase::Training => {
                        0.80 + (run.model_key % 16) as f64 * 0.01
                            - f64::from(worker_index % 3) * 0.005
                    }
                };
                Report::Utilization {
                    namespace: run.namespace.clone(),
                    training_job: run.training_job.clone(),
                    nats_token: run.nats_token.clone(),
                    payload: UtilizationReported {
                        worker_index,
                        attempt: run.attempt,
                        gpu_utilization,
                        phase,
                    },
                }
            })
            .collect()
    }

    /// Loss decays and accuracy rises with the epochs, towards values that are
    /// worse the further the hyperparameters are from the simulated optimum. Both
    /// the training and the validation names are reported, as training scripts do.
    fn metrics(&self, run: &Run, epoch: u32) -> BTreeMap<String, f64> {
        let w = &self.config.workers;
        let progress = f64::from(epoch) / f64::from(run.total_epochs.max(1));
        // A little per-model variation so jobs do not all look alike.
        let jitter = (run.model_key % 7) as f64 * 0.01;
        let decay = (-3.0 * progress).exp();
        let final_loss = w.final_loss + jitter + (1.0 - run.quality);
        let loss = final_loss + (w.initial_loss - final_loss).max(0.0) * decay;
        let accuracy = (w.final_accuracy - jitter) * run.quality.sqrt() * (1.0 - decay);
        BTreeMap::from([
            ("loss".to_owned(), loss),
            ("validation_loss".to_owned(), loss * 1.05),
            ("accuracy".to_owned(), accuracy),
            ("validation_accuracy".to_owned(), accuracy * 0.98),
        ])
    }

    /// Every worker's progress report for an epoch.
    fn progress(&self, run: &Run, epoch: u32) -> Vec<Report> {
        let metrics = self.metrics(run, epoch);
        (0..run.workers)
            .map(|worker_index| Report::Progress {
                namespace: run.namespace.clone(),
                training_job: run.training_job.clone(),
                nats_token: run.nats_token.clone(),
                payload: ProgressReported {
                    worker_index,
                    attempt: run.attempt,
                    epoch,
                    total_epochs: Some(run.total_epochs),
                    step: u64::from(epoch) * 100,
                    metrics: metrics.clone(),
                },
            })
            .collect()
    }

    /// Each worker says who it is and where it starts, once the gang runs.
    fn log_start(&self, run: &Run, pods: &[Arc<PodFacts>]) {
        let start = match &run.resume_from {
            Some(uri) => format!(
                "resuming from {uri} at epoch {}{}",
                run.start_epoch, run.resume_note
            ),
            None => "starting at epoch 0".to_owned(),
        };
        for pod in pods {
            let text = format!(
                "rank {}/{}: training {} for {} epochs, {start}",
                rank(&pod.pod),
                run.workers,
                if run.model.is_empty() {
                    "the model"
                } else {
                    run.model.as_str()
                },
                run.total_epochs,
            );
            self.store.logs().append(&pod.namespace, &pod.name, text);
        }
    }

    /// Each worker's line for a finished epoch, with the metrics it reports.
    fn log_epoch(&self, run: &Run, pods: &[Arc<PodFacts>], epoch: u32) {
        let metrics: Vec<String> = self
            .metrics(run, epoch)
            .iter()
            .map(|(name, value)| format!("{name}={value:.4}"))
            .collect();
        let text = format!(
            "epoch {epoch}/{} step {} {}",
            run.total_epochs,
            u64::from(epoch) * 100,
            metrics.join(" ")
        );
        for pod in pods {
            self.store
                .logs()
                .append(&pod.namespace, &pod.name, text.as_str());
        }
    }

    /// The epoch a resumed worker starts at, and what reading `RESUME_FROM`
    /// found: with a checkpoint root, the checkpoint's manifest is read and
    /// verified (the epoch is then the manifest's); otherwise, or when it is
    /// not there, the epoch is the one its name carries.
    fn read_resume_point(&self, uri: &str, namespace: &str, training_job: &str) -> (u32, String) {
        let Some(storage) = &self.checkpoints else {
            return (resume_epoch(uri), String::new());
        };
        let read = storage
            .local_path(uri, namespace, training_job)
            .map_err(|err| err.to_string())
            .and_then(|path| checkpoints::verify(&path));
        match read {
            Ok(manifest) => (
                manifest.epoch,
                format!(
                    " (read RESUME_FROM: {} verified, {} files)",
                    checkpoints::MANIFEST_FILE,
                    manifest.files.len()
                ),
            ),
            Err(reason) => (
                resume_epoch(uri),
                format!(
                    " (RESUME_FROM is not readable: {reason}; starting at the epoch its name says)"
                ),
            ),
        }
    }

    /// Rank 0 saves the checkpoint of `epoch` into `CHECKPOINT_DIR` and reports
    /// it. With a checkpoint root, the files are written (see
    /// [`crate::checkpoints`]) and checked against their manifest before the
    /// report says how it verified them (`verifiedBy`), as Trainyard's worker
    /// library does; a killed save is reported without it and the run fails on
    /// the next step. `requested`: on `command.checkpoint-now`.
    fn save_checkpoint(
        &self,
        run: &mut Run,
        pods: &[Arc<PodFacts>],
        epoch: u32,
        requested: bool,
    ) -> Report {
        let dir = run.checkpoint_dir.as_deref().unwrap_or_default();
        let uri = format!("{}/checkpoint-epoch-{epoch}", dir.trim_end_matches('/'));
        let step = u64::from(epoch) * 100;
        let metrics = self.metrics(run, epoch);
        let mut payload = CheckpointReported {
            worker_index: 0,
            attempt: run.attempt,
            epoch,
            step,
            uri: uri.clone(),
            size_bytes: u64::from(run.gpus.max(1)) * 512 * 1024 * 1024,
            metrics: metrics.clone(),
            ..CheckpointReported::default()
        };
        let saved = if requested {
            "checkpoint requested: saved"
        } else {
            "checkpoint saved:"
        };
        let text = match &self.checkpoints {
            None => format!("{saved} {uri} (epoch {epoch})"),
            Some(storage) => {
                let mut plan = SavePlan {
                    epoch,
                    step,
                    metrics: &metrics,
                    workers: run.workers,
                    killed_at: None,
                };
                let files = plan.files().len();
                plan.killed_at = checkpoints::killed_save(
                    &SaveDraw {
                        seed: self.config.seed,
                        rate: self.config.checkpoints.killed_save_rate,
                        namespace: &run.namespace,
                        training_job: &run.training_job,
                        attempt: run.attempt,
                        uri: &uri,
                    },
                    files + 1,
                );
                let written = storage
                    .local_path(&uri, &run.namespace, &run.training_job)
                    .and_then(|path| {
                        checkpoints::save(&path, &plan, &wall_clock()).map(|done| (path, done))
                    });
                match written {
                    Ok((path, done)) if done.complete => {
                        payload.size_bytes = done.size_bytes;
                        match checkpoints::verify(&path) {
                            Ok(_) => {
                                payload.verified_by = Some(VerificationMethod::TrainyardManifest);
                                payload.checksums_verified = true;
                                format!(
                                    "{saved} {uri} (epoch {epoch}): {} files, {} bytes, {} verified with SHA-256",
                                    done.files,
                                    done.size_bytes,
                                    checkpoints::MANIFEST_FILE
                                )
                            }
                            Err(reason) => {
                                format!(
                                    "{saved} {uri} (epoch {epoch}) but it does not verify: {reason}"
                                )
                            }
                        }
                    }
                    Ok((_, done)) => {
                        payload.size_bytes = done.size_bytes;
                        run.killed_in_save = true;
                        format!(
                            "killed while saving {uri} (epoch {epoch}): {} of {} files written, no {}",
                            done.files,
                            files + 1,
                            checkpoints::MANIFEST_FILE
                        )
                    }
                    Err(err) => {
                        tracing::warn!(namespace = %run.namespace, job = %run.training_job, error = %err, "checkpoint not written");
                        format!("cannot save {uri} (epoch {epoch}): {err}")
                    }
                }
            }
        };
        log_rank_zero(&self.store, pods, &text);
        Report::Checkpoint {
            namespace: run.namespace.clone(),
            training_job: run.training_job.clone(),
            payload,
            nats_token: run.nats_token.clone(),
        }
    }

    /// Training: gangs whose pods all run advance epochs, report, checkpoint, and
    /// end by succeeding, failing or being stopped.
    fn train(&mut self, now: f64, reports: &mut Vec<Report>) {
        // The pods as this step's binding and starting left them.
        self.catch_up();
        let uids: Vec<String> = self.runs.keys().cloned().collect();
        for uid in uids {
            // Taken out while it advances (put back unless it ends): a copy of
            // every run on every step was a noticeable part of the step.
            let Some(mut run) = self.runs.remove(&uid) else {
                continue;
            };
            let pods = self.pods_of(&run.namespace, &uid);
            let pods = pods.as_slice();
            if pods.iter().any(|p| p.phase == "Failed") {
                self.end_run(&run, now, pods, false);
                continue;
            }
            let all_running =
                pods.len() as u32 == run.workers && pods.iter().all(|p| p.phase == "Running");
            let Some(started) = run.started else {
                if all_running {
                    run.started = Some(now);
                    self.log_start(&run, pods);
                    self.history
                        .entry(object_key(&run.namespace, &run.training_job))
                        .or_default()
                        .started
                        .push(now);
                    if run.start_epoch > 0 {
                        // A resumed worker says where it starts.
                        reports.extend(self.progress(&run, run.start_epoch));
                    }
                } else {
                    // Started workers wait for the rest of the gang.
                    reports.extend(self.utilization(&mut run, pods, now, WorkerPhase::Starting));
                }
                self.runs.insert(uid, run);
                continue;
            };
            if run.killed_in_save {
                if let Some(pod) = pods.iter().find(|p| rank(&p.pod) == 0).or(pods.first()) {
                    self.fail_pod(&pod.pod, Some(137), None);
                }
                self.end_run(&run, now, pods, false);
                continue;
            }
            // A run ends one step after its last report, as a worker exits after
            // reporting: the reports are published before the Job's end is visible.
            if run.reported_epoch >= run.total_epochs || run.stop_requested {
                self.end_run(&run, now, pods, true);
                continue;
            }
            let epoch = Self::epoch_at(&run, started, now);
            for e in run.reported_epoch + 1..=epoch {
                self.log_epoch(&run, pods, e);
                reports.extend(self.progress(&run, e));
                run.reported_epoch = e;
                if run.checkpoint_due(e) {
                    run.last_checkpoint_epoch = e;
                    reports.push(self.save_checkpoint(&mut run, pods, e, false));
                    if run.killed_in_save {
                        break;
                    }
                    reports.extend(self.utilization(
                        &mut run,
                        pods,
                        now,
                        WorkerPhase::Checkpointing,
                    ));
                }
            }
            if run.killed_in_save {
                self.runs.insert(uid, run);
                continue;
            }
            if let Some((after, code)) = run.failure
                && now - started >= after
                && epoch < run.total_epochs
            {
                if let Some(pod) = pods.first() {
                    self.fail_pod(&pod.pod, Some(code), None);
                }
                self.end_run(&run, now, pods, false);
                continue;
            }
            if !run.idle
                && run
                    .idle_after_epoch
                    .is_some_and(|idle| epoch < run.total_epochs && epoch >= idle)
            {
                run.idle = true;
                let text = format!(
                    "epoch {epoch}/{}: idle from here on, holding the GPUs without using them ({IDLE_AFTER_EPOCH_ENV})",
                    run.total_epochs
                );
                for pod in pods {
                    self.store
                        .logs()
                        .append(&pod.namespace, &pod.name, text.as_str());
                }
            }
            let phase = if now - started < self.config.workers.data_loading_seconds {
                WorkerPhase::LoadingData
            } else {
                WorkerPhase::Training
            };
            reports.extend(self.utilization(&mut run, pods, now, phase));
            self.runs.insert(uid, run);
        }
    }

    /// Ends a run already taken out of `runs`.
    fn end_run(&mut self, run: &Run, now: f64, pods: &[Arc<PodFacts>], succeeded: bool) {
        let disrupted = pods.iter().any(|p| {
            p.pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "DisruptionTarget")
        });
        let outcome = match (succeeded, disrupted) {
            (true, _) => RunOutcome::Succeeded,
            (false, true) => RunOutcome::Disrupted,
            (false, false) => RunOutcome::Failed,
        };
        if run.started.is_some() || !succeeded {
            self.history
                .entry(object_key(&run.namespace, &run.training_job))
                .or_default()
                .ended
                .push((now, outcome));
        }
        let ns = run.namespace.as_str();
        for pod in pods {
            let name = pod.name.as_str();
            let pod = match self.store.get_as::<Pod>(resources::pods(), Some(ns), name) {
                Ok(pod) => pod,
                // The snapshot may predate this step's own failure of a worker.
                Err(err) if err.code == 404 => continue,
                // One that does not read as a Pod still ends with its gang.
                Err(_) => Pod::default(),
            };
            if terminal(&pod) {
                continue;
            }
            if succeeded {
                let container = worker_container(&pod);
                let text = if run.stop_requested {
                    format!(
                        "stop requested at epoch {}/{}: exiting with code 0",
                        run.reported_epoch, run.total_epochs
                    )
                } else {
                    format!(
                        "training finished at epoch {}/{}: exiting with code 0",
                        run.reported_epoch, run.total_epochs
                    )
                };
                self.store.logs().append(ns, name, text);
                let exited = container_status(container, "", false, terminated(0, "Completed"));
                let _ = self
                    .store
                    .update_as(resources::pods(), Some(ns), name, |p: &mut Pod| {
                        let status = p.status.get_or_insert_default();
                        status.phase = Some("Succeeded".to_owned());
                        status.conditions =
                            Some(vec![condition_because("Ready", "False", "PodCompleted")]);
                        status.container_statuses = Some(vec![exited]);
                    });
            } else {
                // The Job controller terminates the rest of a failed gang.
                let _ =
                    self.store
                        .delete(resources::pods(), Some(ns), name, Propagation::Background);
            }
        }
        let workers = i32::try_from(run.workers).unwrap_or(i32::MAX);
        let _ = self
            .store
            .update_as(resources::jobs(), Some(ns), &run.job, |j: &mut Job| {
                let time = time_now();
                let status = j.status.get_or_insert_default();
                status.active = Some(0);
                status.ready = Some(0);
                let ended = |type_| job_condition(type_, "CompletionsReached", Some(time.clone()));
                let failed = |type_| JobCondition {
                    message: Some("Job has reached the specified backoff limit".to_owned()),
                    ..job_condition(type_, "BackoffLimitExceeded", Some(time.clone()))
                };
                if succeeded {
                    status.succeeded = Some(workers);
                    status.completion_time = Some(time.clone());
                    status.conditions = Some(vec![ended("SuccessCriteriaMet"), ended("Complete")]);
                } else {
                    status.failed = Some(1);
                    status.conditions = Some(vec![failed("FailureTarget"), failed("Failed")]);
                }
            });
    }

    fn sample(&mut self, now: f64) {
        let (mut busy, mut pending) = (0, 0);
        for pod in self.live_pods() {
            match pod.phase.as_str() {
                "Running" => busy += pod.requests.get(GPU).copied().unwrap_or(0),
                "Pending" => pending += 1,
                _ => {}
            }
        }
        let total = self
            .nodes
            .iter()
            .filter(|n| n.down_until.is_none())
            .map(|n| {
                let g = &self.config.nodes[n.group];
                g.gpus * g.time_slicing_replicas.unwrap_or(1)
            })
            .sum();
        self.usage.push(UsageSample {
            at: now,
            busy_gpus: busy,
            total_gpus: total,
            pending_pods: pending,
        });
    }
}

/// The pods of the Job with this uid that still exist, from the cluster's
/// per-namespace pods and per-Job pod names.
fn pods_of(
    pods: &HashMap<String, HashMap<String, Arc<PodFacts>>>,
    job_pods: &HashMap<String, BTreeSet<String>>,
    namespace: &str,
    job_uid: &str,
) -> Vec<Arc<PodFacts>> {
    let Some(pods) = pods.get(namespace) else {
        return Vec::new();
    };
    job_pods
        .get(job_uid)
        .into_iter()
        .flatten()
        .filter_map(|name| pods.get(name).cloned())
        .collect()
}

/// A worker's rank: its pod's completion index (0 when it has none).
fn rank(pod: &Pod) -> u32 {
    labels_of(&pod.metadata)
        .get(LABEL_WORKER_INDEX)
        .and_then(|index| index.parse().ok())
        .unwrap_or(0)
}

/// Rank 0 saves checkpoints, so only its log tells of them.
fn log_rank_zero(store: &Store, pods: &[Arc<PodFacts>], text: &str) {
    for pod in pods.iter().filter(|pod| rank(&pod.pod) == 0) {
        store.logs().append(&pod.namespace, &pod.name, text);
    }
}

/// How close hyperparameters are to the simulated optimum (learning rate 3e-4,
/// batch size 64), from 1 (there) towards 0; 1 when none are given.
fn quality(hyperparameters: &Value) -> f64 {
    let mut quality = 1.0;
    if let Some(rate) = hyperparameters["learningRate"]
        .as_f64()
        .filter(|r| *r > 0.0)
    {
        let distance = rate.log10() - 3e-4f64.log10();
        quality *= (-distance * distance / 2.0).exp();
    }
    if let Some(batch) = hyperparameters["batchSize"].as_f64().filter(|b| *b > 0.0) {
        let distance = (batch / 64.0).log2();
        quality *= (-distance * distance / 8.0).exp();
    }
    quality
}

/// The epoch a checkpoint URI names (`.../checkpoint-epoch-12` → 12); 0 if none.
pub fn resume_epoch(uri: &str) -> u32 {
    uri.rsplit_once("epoch-")
        .or_else(|| uri.rsplit_once("epoch_"))
        .map(|(_, tail)| {
            tail.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
        })
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What the scheduler reads of a stored pod's CPU and memory.
    fn pod_compute(pod: &Value) -> Result<Compute, String> {
        PodFacts::of(pod).compute
    }

    fn compute(cpu_millis: u64, memory_bytes: u64) -> Compute {
        Compute {
            cpu_millis,
            memory_bytes,
        }
    }

    #[test]
    fn a_pod_requests_its_containers_sum_or_its_largest_init_container_plus_overhead() {
        let pod = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                // A limit without a request is the request; a bare number is a quantity.
                {"resources": {"limits": {"cpu": 2, "memory": "2Gi"}, "requests": {"memory": "1Gi"}}},
            ],
            "initContainers": [
                {"resources": {"requests": {"cpu": "2500m", "memory": "2.5Gi"}}},
            ],
            "overhead": {"cpu": "250m", "memory": "64Mi"},
        }});
        assert_eq!(
            pod_compute(&pod),
            Ok(compute(3_250, (5 << 29) + (64 << 20))),
            "CPU: the containers' 1 + 2 over the init container's 2.5; memory: the init \
             container's 2.5Gi over the containers' 1Gi + 1Gi; each plus the overhead"
        );
    }

    #[test]
    fn sidecars_run_alongside_the_containers_and_later_init_containers() {
        // A 1-CPU sidecar, then a 3-CPU init container: 4 while that one runs,
        // then the containers and the sidecar.
        for (containers, expected) in [("1", 4_000), ("5", 6_000)] {
            let pod = json!({"spec": {
                "containers": [{"resources": {"requests": {"cpu": containers}}}],
                "initContainers": [
                    {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                    {"resources": {"requests": {"cpu": "3"}}},
                ],
            }});
            assert_eq!(
                pod_compute(&pod),
                Ok(compute(expected, 0)),
                "containers {containers}"
            );
        }
    }

    #[test]
    fn a_quantity_that_does_not_parse_is_named_by_its_field() {
        let pod = json!({"spec": {
            "containers": [{}],
            "initContainers": [{"resources": {"limits": {"memory": "16GB"}}}],
        }});
        let err = pod_compute(&pod).expect_err("16GB is not a quantity");
        assert!(
            err.starts_with("spec.initContainers[0].resources.limits.memory: \"16GB\""),
            "{err}"
        );
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "overhead": {"cpu": true}}});
        let err = pod_compute(&pod).expect_err("a boolean is not a quantity");
        assert!(
            err.starts_with("Pod \"p\" is invalid: spec.overhead.cpu: invalid type: boolean"),
            "{err}"
        );
    }

    #[test]
    fn node_affinity_and_taints_are_matched_by_the_allocators_rules() {
        let pod = PodFacts::of(&json!({"metadata": {"name": "p"}, "spec": {
            "containers": [],
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-1"]}]},
                    {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]},
                    {"matchExpressions": [{"key": "gpus", "operator": "Near", "values": ["2"]}]},
                ],
            }}},
        }}));
        let needs = PodNeeds::of(&pod, Compute::default(), &[]);
        let node = |name: &str, gpus: &str, taints: Value| {
            NodeFacts::of(&Arc::new(json!({
                "metadata": {"name": name, "labels": {"gpus": gpus}},
                "spec": {"taints": taints},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            })))
        };
        let unmet = |facts: &NodeFacts| unmet_constraint(&needs, &NodeView::of(facts));
        let mismatch = Some("node selector or affinity mismatch");
        assert_eq!(
            unmet(&node("n-1", "2", json!([]))),
            None,
            "named by a field"
        );
        assert_eq!(
            unmet(&node("n-2", "8", json!([]))),
            None,
            "more than 4 GPUs"
        );
        assert_eq!(
            unmet(&node("n-3", "2", json!([]))),
            mismatch,
            "an unknown operator matches nothing"
        );
        let tainted =
            |key: &str, effect: &str| node("n-2", "8", json!([{"key": key, "effect": effect}]));
        assert_eq!(unmet(&tainted("spot", "NoSchedule")), None, "tolerated");
        assert_eq!(
            unmet(&tainted("other", "PreferNoSchedule")),
            None,
            "only advice"
        );
        assert_eq!(
            unmet(&tainted("other", "NoExecute")),
            Some("untolerated taint")
        );
    }
}
