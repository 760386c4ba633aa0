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
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;
use trainyard_api::placement::{LABEL_ATTEMPT, LABEL_JOB, LABEL_WORKER_INDEX};
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
fn store_key(object: &Value) -> Option<(String, String)> {
    let metadata = &object["metadata"];
    let namespace = metadata["namespace"].as_str().unwrap_or_default();
    Some((namespace.to_owned(), metadata["name"].as_str()?.to_owned()))
}

fn str_of<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().fold(value, |v, p| &v[*p]).as_str()
}

/// `"4"`, `4` or `"4000m"` as whole units.
fn quantity(value: &Value) -> u32 {
    match value {
        Value::Number(n) => n.as_u64().unwrap_or(0) as u32,
        Value::String(s) => match s.strip_suffix('m') {
            Some(milli) => milli.parse::<u32>().map(|m| m / 1000).unwrap_or(0),
            None => s.parse().unwrap_or(0),
        },
        _ => 0,
    }
}

/// Extended resources (GPUs, MIG slices) a pod asks for: limits, else requests.
fn pod_requests(pod: &Value) -> BTreeMap<&str, u32> {
    let mut total = BTreeMap::new();
    for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
        let resources = &container["resources"];
        for section in ["limits", "requests"] {
            let Some(map) = resources[section].as_object() else {
                continue;
            };
            for (name, value) in map {
                if (name == GPU || name.starts_with(MIG_PREFIX))
                    && (section == "limits" || resources["limits"][name].is_null())
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

/// A quantity as the API server reads it: text, or a bare JSON number. `field`
/// names it in the error.
fn parse_quantity(
    value: &Value,
    parse: fn(&str) -> Result<u64, QuantityError>,
    field: impl Fn() -> String,
) -> Result<u64, String> {
    let parsed = match value {
        Value::String(text) => parse(text),
        Value::Number(number) => parse(&number.to_string()),
        other => return Err(format!("{}: {other} is not a quantity", field())),
    };
    parsed.map_err(|err| format!("{}: {err}", field()))
}

/// The CPU and memory in a resource list (`requests`, `limits`, `overhead`);
/// `path` names the list in errors (built only then: this runs on every pod change).
fn compute_in(list: &Value, path: &dyn Fn() -> String) -> Result<Compute, String> {
    let read = |resource: &str, parse| match &list[resource] {
        Value::Null => Ok(0),
        value => parse_quantity(value, parse, || format!("{}.{resource}", path())),
    };
    Ok(Compute {
        cpu_millis: read("cpu", cpu_millis)?,
        memory_bytes: read("memory", bytes)?,
    })
}

/// The CPU and memory requests of container `index` of `spec.<list>`. A resource
/// with a limit and no request requests its limit, as the API server defaults it.
fn container_compute(container: &Value, list: &str, index: usize) -> Result<Compute, String> {
    let resources = &container["resources"];
    let section = |section: &str| {
        compute_in(&resources[section], &|| {
            format!("spec.{list}[{index}].resources.{section}")
        })
    };
    let (requests, limits) = (section("requests")?, section("limits")?);
    let requested = |resource: &str| !resources["requests"][resource].is_null();
    Ok(Compute {
        cpu_millis: if requested("cpu") {
            requests.cpu_millis
        } else {
            limits.cpu_millis
        },
        memory_bytes: if requested("memory") {
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
fn pod_compute(pod: &Value) -> Result<Compute, String> {
    let spec = &pod["spec"];
    let containers = |list: &str| spec[list].as_array().into_iter().flatten().enumerate();
    let mut total = Compute::default();
    for (i, container) in containers("containers") {
        total = total.plus(container_compute(container, "containers", i)?);
    }
    let mut sidecars = Compute::default();
    let mut largest_init = Compute::default();
    for (i, container) in containers("initContainers") {
        let requests = container_compute(container, "initContainers", i)?;
        if container["restartPolicy"] == "Always" {
            total = total.plus(requests);
            sidecars = sidecars.plus(requests);
            largest_init = largest_init.max(sidecars);
        } else {
            largest_init = largest_init.max(requests.plus(sidecars));
        }
    }
    let overhead = compute_in(&spec["overhead"], &|| "spec.overhead".to_owned())?;
    Ok(total.max(largest_init).plus(overhead))
}

fn phase(pod: &Value) -> &str {
    str_of(pod, &["status", "phase"]).unwrap_or("Pending")
}

fn terminal(pod: &Value) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

fn job_finished(job: &Value) -> bool {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True")
}

fn tolerates(tolerations: &[Value], taint: &Value) -> bool {
    let effect = taint["effect"].as_str().unwrap_or_default();
    if effect == "PreferNoSchedule" {
        return true;
    }
    tolerations.iter().any(|t| {
        let key_ok = match t["key"].as_str() {
            None | Some("") => t["operator"] == "Exists",
            Some(k) => Some(k) == taint["key"].as_str(),
        };
        let value_ok = t["operator"] == "Exists"
            || t["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default();
        let effect_ok = t["effect"]
            .as_str()
            .is_none_or(|e| e.is_empty() || e == effect);
        key_ok && value_ok && effect_ok
    })
}

fn expression_matches(expression: &Value, labels: &Value) -> bool {
    let key = expression["key"].as_str().unwrap_or_default();
    let value = labels[key].as_str();
    let values: Vec<&str> = expression["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match expression["operator"].as_str().unwrap_or_default() {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

fn label_selector_matches(selector: &Value, labels: &Value) -> bool {
    let match_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v);
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| expression_matches(e, labels));
    match_labels && expressions
}

/// The conditions kube-scheduler gives a pod it leaves alone for its gates.
fn scheduling_gated() -> Value {
    json!([{
        "type": "PodScheduled",
        "status": "False",
        "reason": "SchedulingGated",
        "message": "Scheduling is blocked due to non-empty scheduling gates",
    }])
}

/// A pod with what the steps read of it: read once per change rather than on
/// every step.
struct PodFacts {
    object: Arc<Value>,
    namespace: String,
    name: String,
    /// Whether `spec.nodeName` is set at all.
    bound: bool,
    /// `spec.nodeName`, when it is a string.
    node: Option<String>,
    /// Whether `spec.schedulingGates` holds a gate: the scheduler leaves it alone.
    gated: bool,
    /// Whether its status already says so (see [`scheduling_gated`]).
    gated_reported: bool,
    phase: String,
    /// The GPUs and MIG slices it asks for (see [`pod_requests`]).
    requests: BTreeMap<String, u32>,
    /// The CPU and memory it asks for, or why they cannot be read (see [`pod_compute`]).
    compute: Result<Compute, String>,
    resource_version: Option<u64>,
}

impl PodFacts {
    fn of(object: Arc<Value>) -> Self {
        let metadata = &object["metadata"];
        let gated = object["spec"]["schedulingGates"]
            .as_array()
            .is_some_and(|gates| !gates.is_empty());
        Self {
            namespace: metadata["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            name: metadata["name"].as_str().unwrap_or_default().to_owned(),
            bound: !object["spec"]["nodeName"].is_null(),
            node: str_of(&object, &["spec", "nodeName"]).map(str::to_owned),
            gated,
            gated_reported: gated && object["status"]["conditions"] == scheduling_gated(),
            phase: phase(&object).to_owned(),
            requests: pod_requests(&object)
                .into_iter()
                .map(|(resource, count)| (resource.to_owned(), count))
                .collect(),
            compute: pod_compute(&object),
            resource_version: metadata["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse().ok()),
            object,
        }
    }

    fn terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// A Job not yet Complete or Failed, with what the Job controller reads of it on
/// every step: read once per change.
struct LiveJob {
    object: Arc<Value>,
    uid: String,
    namespace: String,
    name: String,
    suspended: bool,
    /// `status.active` and `status.ready`, when whole non-negative numbers.
    active: Option<u64>,
    ready: Option<u64>,
    started: bool,
    /// Whether any condition is `Suspended`, and whether that is the only one.
    suspended_condition: bool,
    only_suspended_condition: bool,
}

impl LiveJob {
    fn of(object: Arc<Value>) -> Self {
        let metadata = &object["metadata"];
        let text = |field: &str| metadata[field].as_str().unwrap_or_default().to_owned();
        let status = &object["status"];
        let conditions = status["conditions"].as_array();
        let suspended = |c: &Value| c["type"] == "Suspended";
        Self {
            uid: text("uid"),
            namespace: text("namespace"),
            name: text("name"),
            suspended: object["spec"]["suspend"] == true,
            active: status["active"].as_u64(),
            ready: status["ready"].as_u64(),
            started: !status["startTime"].is_null(),
            suspended_condition: conditions.is_some_and(|c| c.iter().any(suspended)),
            only_suspended_condition: conditions.is_some_and(|c| c.len() == 1 && suspended(&c[0])),
            object,
        }
    }
}

/// What the scheduler reads of a node object, kept while the object is unchanged:
/// nodes rarely change, and reading all of them on every binding step was a
/// large part of the step.
struct NodeFacts {
    object: Arc<Value>,
    name: String,
    labels: Value,
    schedulable: bool,
    taints: Vec<Value>,
    /// Allocatable GPUs, MIG slices and pod slots, the resources the scheduler
    /// accounts by count.
    allocatable: Vec<(String, i64)>,
    allocatable_compute: Compute,
}

impl NodeFacts {
    fn of(node: &Arc<Value>) -> Self {
        let ready = node["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        Self {
            object: node.clone(),
            name: str_of(node, &["metadata", "name"])
                .unwrap_or_default()
                .to_owned(),
            labels: node["metadata"]["labels"].clone(),
            schedulable: ready && node["spec"]["unschedulable"] != true,
            taints: node["spec"]["taints"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            allocatable: node["status"]["allocatable"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| *k == GPU || k.starts_with(MIG_PREFIX) || *k == "pods")
                .map(|(k, v)| (k.clone(), i64::from(quantity(v))))
                .collect(),
            // The API server refuses a node whose quantities do not parse; one
            // that got in anyway offers nothing.
            allocatable_compute: compute_in(&node["status"]["allocatable"], &|| {
                "status.allocatable".to_owned()
            })
            .unwrap_or_default(),
        }
    }
}

/// What the scheduler reads of a node in a step, and what is left of its resources.
struct NodeView<'a> {
    name: &'a str,
    labels: &'a Value,
    schedulable: bool,
    taints: &'a [Value],
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
    taken: Vec<&'a Value>,
}

/// A required pod affinity term, resolved against the pods already placed:
/// the node must carry the `topology` label, with one of the values in
/// `domains` (the nodes of the pods the term selects). With no such pod
/// anywhere, as in kube-scheduler, a pod the term selects itself may go to
/// any node that carries the label (the first worker of a gang).
struct Gather<'a> {
    topology: &'a str,
    domains: Vec<&'a Value>,
    selects_itself: bool,
}

/// What the scheduler reads of a pending pod, looked up once rather than once
/// per node.
struct PodNeeds<'a> {
    requests: &'a BTreeMap<String, u32>,
    compute: Compute,
    tolerations: &'a [Value],
    node_selector: Option<&'a Map<String, Value>>,
    /// Required node affinity: any one term must match.
    affinity_terms: Option<&'a [Value]>,
    pod_affinity: Vec<Gather<'a>>,
    anti_affinity: Vec<Spread<'a>>,
}

impl<'a> PodNeeds<'a> {
    /// `compute` is what the pod's CPU and memory requests read as; `placed`
    /// holds the labels of each bound pod and of its node.
    fn of(pod: &'a PodFacts, compute: Compute, placed: &[(&'a Value, &'a Value)]) -> Self {
        let spec = &pod.object["spec"];
        let affinity = &spec["affinity"];
        // The topology label values of the nodes of the placed pods `term` selects.
        let domains = |term: &'a Value, topology: &'a str| -> Vec<&'a Value> {
            placed
                .iter()
                .filter(|(_, pod_labels)| {
                    label_selector_matches(&term["labelSelector"], pod_labels)
                })
                .map(|(node_labels, _)| &node_labels[topology])
                .collect()
        };
        let topology_of = |term: &'a Value| {
            term["topologyKey"]
                .as_str()
                .unwrap_or("kubernetes.io/hostname")
        };
        let spread = |term: &'a Value| {
            let topology = topology_of(term);
            Spread {
                topology,
                taken: domains(term, topology),
            }
        };
        let gather = |term: &'a Value| {
            let topology = topology_of(term);
            Gather {
                topology,
                domains: domains(term, topology),
                selects_itself: label_selector_matches(
                    &term["labelSelector"],
                    &pod.object["metadata"]["labels"],
                ),
            }
        };
        Self {
            requests: &pod.requests,
            compute,
            tolerations: spec["tolerations"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default(),
            node_selector: spec["nodeSelector"].as_object(),
            affinity_terms: affinity["nodeAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                .as_array()
                .map(Vec::as_slice),
            pod_affinity: affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .into_iter()
                .flatten()
                .map(gather)
                .collect(),
            anti_affinity: affinity["podAntiAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
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
/// (readiness, taints, selectors and affinity, anti-affinity), if any.
fn unmet_constraint(needs: &PodNeeds, node: &NodeView) -> Option<&'static str> {
    let labels = node.labels;
    if !node.schedulable {
        return Some("node not ready or cordoned");
    }
    let untolerated = node
        .taints
        .iter()
        .any(|taint| !tolerates(needs.tolerations, taint));
    if untolerated {
        return Some("untolerated taint");
    }
    let selector_ok = needs
        .node_selector
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v);
    let affinity_ok = needs.affinity_terms.is_none_or(|terms| {
        terms.is_empty()
            || terms.iter().any(|term| {
                term["matchExpressions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|e| expression_matches(e, labels))
            })
    });
    if !selector_ok || !affinity_ok {
        return Some("node selector or affinity mismatch");
    }
    if !pod_affinity_met(&needs.pod_affinity, labels) {
        return Some("pod affinity");
    }
    let conflict = needs.anti_affinity.iter().any(|spread| {
        let domain = &labels[spread.topology];
        !domain.is_null() && spread.taken.contains(&domain)
    });
    conflict.then_some("pod anti-affinity")
}

/// kube-scheduler's rule for required pod affinity: the node carries every
/// term's topology label, and each term's selected pods are in the node's
/// domain; or no placed pod is selected by any term and the pod selects
/// itself by each.
fn pod_affinity_met(terms: &[Gather], labels: &Value) -> bool {
    let values: Option<Vec<&Value>> = terms
        .iter()
        .map(|term| Some(&labels[term.topology]).filter(|v| !v.is_null()))
        .collect();
    let Some(values) = values else {
        return false;
    };
    let gathered = terms
        .iter()
        .zip(&values)
        .all(|(term, value)| term.domains.contains(value));
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
            let class = json!({"metadata": {"name": name}, "value": value});
            // Already there: the store outlived an earlier cluster.
            let _ = cluster
                .store
                .create(resources::priority_classes(), None, class);
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

    fn node_object(group: &NodeGroup, slot: &NodeSlot) -> Value {
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
        let mut allocatable = serde_json::Map::new();
        allocatable.insert(
            GPU.into(),
            json!((group.gpus * group.time_slicing_replicas.unwrap_or(1)).to_string()),
        );
        for (profile, count) in &group.mig {
            allocatable.insert(format!("{MIG_PREFIX}{profile}"), json!(count.to_string()));
        }
        allocatable.insert("cpu".into(), json!(group.cpu));
        allocatable.insert("memory".into(), json!(group.memory));
        allocatable.insert("pods".into(), json!("110"));
        json!({
            "metadata": {"name": slot.name, "labels": labels},
            "spec": {"taints": group.taints, "unschedulable": false},
            "status": {
                "capacity": allocatable,
                "allocatable": allocatable,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": wall_clock()}],
            },
        })
    }

    fn register_node(&mut self, slot: &NodeSlot) {
        let group = &self.config.nodes[slot.group];
        let object = Self::node_object(group, slot);
        if let Err(err) = self
            .store
            .create_with_status(resources::nodes(), None, object)
        {
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
        if !pod && deleted {
            let uid = object["metadata"]["uid"].as_str().unwrap_or_default();
            self.runs.remove(uid);
            self.job_pods.remove(uid);
        }
        let Some(key) = store_key(object) else {
            return;
        };
        if pod {
            let (namespace, name) = &key;
            if deleted {
                if let Some(pods) = self.pods.get_mut(namespace) {
                    pods.remove(name);
                }
                self.live_pods.remove(&key);
                return;
            }
            self.track_pod(key, object.clone());
        } else if deleted || job_finished(object) {
            self.live_jobs.remove(&key);
        } else {
            self.live_jobs
                .insert(key, Arc::new(LiveJob::of(object.clone())));
        }
    }

    /// Keeps a pod's facts under its namespace and name, and among the live
    /// pods while it is unfinished.
    fn track_pod(&mut self, key: (String, String), object: Arc<Value>) {
        let facts = Arc::new(PodFacts::of(object));
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
        let uids: HashSet<&str> = jobs
            .iter()
            .filter_map(|job| job["metadata"]["uid"].as_str())
            .collect();
        self.runs.retain(|uid, _| uids.contains(uid.as_str()));
        self.job_pods.retain(|uid, _| uids.contains(uid.as_str()));
        self.pods.clear();
        self.live_pods.clear();
        for pod in pods {
            if let Some(key) = store_key(&pod) {
                self.track_pod(key, pod);
            }
        }
        self.live_jobs = jobs
            .iter()
            .filter(|job| !job_finished(job))
            .filter_map(|job| Some((store_key(job)?, Arc::new(LiveJob::of(job.clone())))))
            .collect();
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
                self.fail_pod(&pod.object, exit_code, Some(reason));
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
        let status = if ready { "True" } else { "Unknown" };
        let reason = if ready {
            "KubeletReady"
        } else {
            "NodeStatusUnknown"
        };
        let _ = self.store.update(resources::nodes(), None, node, |n| {
            n["status"]["conditions"] = json!([{"type": "Ready", "status": status, "reason": reason, "lastTransitionTime": wall_clock()}]);
        });
    }

    fn fail_pod(&self, pod: &Value, exit_code: Option<i32>, disruption: Option<&str>) {
        let ns = str_of(pod, &["metadata", "namespace"]).unwrap_or_default();
        let name = str_of(pod, &["metadata", "name"]).unwrap_or_default();
        let container = pod["spec"]["containers"][0]["name"]
            .as_str()
            .unwrap_or("worker")
            .to_owned();
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
        let _ = self.store.update(resources::pods(), Some(ns), name, |p| {
            p["status"]["phase"] = json!("Failed");
            let mut conditions = vec![json!({"type": "Ready", "status": "False"})];
            if let Some(reason) = disruption {
                conditions.push(json!({"type": "DisruptionTarget", "status": "True", "reason": reason, "message": format!("simulated {reason}")}));
            }
            p["status"]["conditions"] = json!(conditions);
            p["status"]["containerStatuses"] = match exit_code {
                Some(code) => json!([{
                    "name": container,
                    "ready": false,
                    "restartCount": 0,
                    "image": "",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": code, "reason": if code == 137 { "OOMKilled" } else { "Error" }, "finishedAt": wall_clock()}},
                }]),
                None => json!([]),
            };
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
                let _ = self.store.update(resources::jobs(), Some(ns), name, |j| {
                    j["status"]["active"] = json!(0);
                    j["status"]["ready"] = json!(0);
                    j["status"]["conditions"] = json!([{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]);
                });
                continue;
            }
            if !self.runs.contains_key(uid) {
                // A refused Job has no pods, but it has started: its status says so.
                if let Some(run) = self.start_run(&job.object) {
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
            let _ = self.store.update(resources::jobs(), Some(ns), name, |j| {
                j["status"]["active"] = json!(active);
                j["status"]["ready"] = json!(running);
                if j["status"]["startTime"].is_null() {
                    j["status"]["startTime"] = json!(wall_clock());
                }
                if let Some(conditions) = j["status"]["conditions"].as_array_mut() {
                    conditions.retain(|c| c["type"] != "Suspended");
                }
            });
        }
    }

    /// Creates the pods of an unsuspended Job and remembers how its workers train.
    fn start_run(&mut self, job: &Value) -> Option<Run> {
        let ns = str_of(job, &["metadata", "namespace"])?.to_owned();
        let name = str_of(job, &["metadata", "name"])?.to_owned();
        let uid = str_of(job, &["metadata", "uid"])?.to_owned();
        let template = &job["spec"]["template"];
        let workers = job["spec"]["completions"].as_u64().unwrap_or(1) as u32;
        let labels = &template["metadata"]["labels"];
        let training_job = labels[LABEL_JOB].as_str().unwrap_or(&name).to_owned();
        let attempt = labels[LABEL_ATTEMPT]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        if let Some(message) =
            pod_admission::refusal(&self.store, &ns, &name, &template["spec"], workers)
        {
            pod_admission::record_failed_create(&self.store, job, &message, &wall_clock());
            return None;
        }
        let mut gpus = 0;
        for index in 0..workers {
            let mut pod = json!({
                "metadata": {
                    "generateName": format!("{name}-{index}-"),
                    "namespace": ns,
                    "labels": template["metadata"]["labels"].clone(),
                    "annotations": template["metadata"]["annotations"].clone(),
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}],
                },
                "spec": template["spec"].clone(),
                "status": {"phase": "Pending"},
            });
            if !pod["metadata"]["labels"].is_object() {
                pod["metadata"]["labels"] = json!({});
            }
            if !pod["metadata"]["annotations"].is_object() {
                pod["metadata"]["annotations"] = json!({});
            }
            pod["metadata"]["labels"][JOB_NAME_LABEL] = json!(name);
            pod["metadata"]["labels"][JOB_CONTROLLER_UID_LABEL] = json!(uid);
            pod["metadata"]["labels"][LABEL_WORKER_INDEX] = json!(index.to_string());
            pod["metadata"]["annotations"][LABEL_WORKER_INDEX] = json!(index.to_string());
            pod["spec"]["hostname"] = json!(format!("{name}-{index}"));
            gpus += pod_requests(&pod).get(GPU).copied().unwrap_or(0);
            match self
                .store
                .create_with_status(resources::pods(), Some(&ns), pod)
            {
                Ok(created) => {
                    let pod_name = str_of(&created, &["metadata", "name"]).unwrap_or_default();
                    self.job_pods
                        .entry(uid.clone())
                        .or_default()
                        .insert(pod_name.to_owned());
                }
                Err(err) => {
                    tracing::warn!(job = %name, error = %err, "cannot create pod");
                    return None;
                }
            }
        }
        let container = &template["spec"]["containers"][0];
        let env = |wanted: &str| -> Option<String> {
            let var = container["env"]
                .as_array()?
                .iter()
                .find(|e| e["name"] == wanted)?;
            if let Some(value) = var["value"].as_str() {
                return Some(value.to_owned());
            }
            let secret_ref = &var["valueFrom"]["secretKeyRef"];
            if let Some(secret) = secret_ref["name"].as_str() {
                let secret = self
                    .store
                    .get(resources::secrets(), Some(&ns), secret)
                    .ok()?;
                let key = secret_ref["key"].as_str()?;
                if let Some(text) = secret["stringData"][key].as_str() {
                    return Some(text.to_owned());
                }
                let encoded = secret["data"][key].as_str()?;
                let decoded =
                    base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded)
                        .ok()?;
                return String::from_utf8(decoded).ok();
            }
            let reference = &var["valueFrom"]["configMapKeyRef"];
            let map = self
                .store
                .get(
                    resources::config_maps(),
                    Some(&ns),
                    reference["name"].as_str()?,
                )
                .ok()?;
            map["data"][reference["key"].as_str()?]
                .as_str()
                .map(str::to_owned)
        };
        let config_file = |file: &str| -> Value {
            template["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                // A ConfigMap volume, or one projected with others (the
                // planner's, when the workers' NATS CA joins it).
                .flat_map(|v| {
                    let projected = v["projected"]["sources"].as_array().into_iter().flatten();
                    std::iter::once(v).chain(projected)
                })
                .filter_map(|v| v["configMap"]["name"].as_str())
                .filter_map(|cm| self.store.get(resources::config_maps(), Some(&ns), cm).ok())
                .find_map(|cm| {
                    cm["data"][file]
                        .as_str()
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
            .filter(|p| !p.bound)
            .map(AsRef::as_ref)
            .partition(|p| p.gated);
        for pod in gated.iter().filter(|p| !p.gated_reported) {
            let _ = self
                .store
                .update(resources::pods(), Some(&pod.namespace), &pod.name, |p| {
                    p["status"]["conditions"] = scheduling_gated();
                });
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
        let mut placed: Vec<(&Value, &Value)> = Vec::new();
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
                placed.push((node.labels, &pod.object["metadata"]["labels"]));
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
                        ns,
                        pod_name,
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
                    placed.push((node.labels, &pod.object["metadata"]["labels"]));
                    let node = node.name.to_owned();
                    let _ = self
                        .store
                        .update(resources::pods(), Some(ns), pod_name, |p| {
                            p["spec"]["nodeName"] = json!(node);
                            p["status"]["conditions"] =
                                json!([{"type": "PodScheduled", "status": "True"}]);
                        });
                    self.bound_at.insert(object_key(ns, pod_name), now);
                }
                None => {
                    let detail = reasons
                        .iter()
                        .map(|(r, n)| format!("{n} {r}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let message = format!("0/{} nodes are available: {detail}.", nodes.len());
                    self.mark_unschedulable(ns, pod_name, message);
                }
            }
        }
    }

    /// Leaves a pending pod a `PodScheduled: False` condition saying why.
    fn mark_unschedulable(&self, namespace: &str, name: &str, message: String) {
        let _ = self
            .store
            .update(resources::pods(), Some(namespace), name, |p| {
                p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]);
            });
    }

    /// The kubelets: bound pods start after the configured delay.
    fn start_pods(&mut self, now: f64) {
        let delay = self.config.workers.start_delay_seconds;
        for pod in self.live_pods() {
            if pod.phase != "Pending" || !pod.bound {
                continue;
            }
            let ns = pod.namespace.as_str();
            let name = pod.name.as_str();
            let bound = *self.bound_at.entry(object_key(ns, name)).or_insert(now);
            if now < bound + delay {
                continue;
            }
            let container = pod.object["spec"]["containers"][0]["name"]
                .as_str()
                .unwrap_or("worker")
                .to_owned();
            let image = pod.object["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default();
            if self
                .config
                .workers
                .unpullable_images
                .iter()
                .any(|i| i == image)
            {
                self.back_off_pulling(&pod, &container, image);
                continue;
            }
            let _ = self.store.update(resources::pods(), Some(ns), name, |p| {
                p["status"]["phase"] = json!("Running");
                p["status"]["startTime"] = json!(wall_clock());
                p["status"]["conditions"] = json!([
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ]);
                p["status"]["containerStatuses"] = json!([{
                    "name": container, "ready": true, "restartCount": 0, "image": "", "imageID": "",
                    "state": {"running": {"startedAt": wall_clock()}},
                }]);
            });
            self.bound_at.remove(&object_key(ns, name));
        }
    }

    /// The kubelet cannot pull the worker's image: the pod stays Pending with
    /// its container waiting in `ImagePullBackOff` (written once).
    fn back_off_pulling(&self, pod: &PodFacts, container: &str, image: &str) {
        let waiting = &pod.object["status"]["containerStatuses"][0]["state"]["waiting"];
        if waiting["reason"] == "ImagePullBackOff" {
            return;
        }
        let _ = self
            .store
            .update(resources::pods(), Some(&pod.namespace), &pod.name, |p| {
                p["status"]["conditions"] = json!([
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                ]);
                p["status"]["containerStatuses"] = json!([{
                    "name": container, "ready": false, "restartCount": 0, "image": image, "imageID": "",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": format!("Back-off pulling image \"{image}\"")}},
                }]);
            });
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
                let worker_index = rank(&pod.object);
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
                rank(&pod.object),
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
                if let Some(pod) = pods.iter().find(|p| rank(&p.object) == 0).or(pods.first()) {
                    self.fail_pod(&pod.object, Some(137), None);
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
                    self.fail_pod(&pod.object, Some(code), None);
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
            p.object["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "DisruptionTarget")
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
            // The snapshot may predate this step's own failure of a worker.
            let Ok(pod) = self.store.get(resources::pods(), Some(ns), name) else {
                continue;
            };
            if terminal(&pod) {
                continue;
            }
            if succeeded {
                let container = pod["spec"]["containers"][0]["name"]
                    .as_str()
                    .unwrap_or("worker")
                    .to_owned();
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
                let _ = self.store.update(resources::pods(), Some(ns), name, |p| {
                    p["status"]["phase"] = json!("Succeeded");
                    p["status"]["conditions"] = json!([{"type": "Ready", "status": "False", "reason": "PodCompleted"}]);
                    p["status"]["containerStatuses"] = json!([{
                        "name": container, "ready": false, "restartCount": 0, "image": "", "imageID": "",
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": wall_clock()}},
                    }]);
                });
            } else {
                // The Job controller terminates the rest of a failed gang.
                let _ =
                    self.store
                        .delete(resources::pods(), Some(ns), name, Propagation::Background);
            }
        }
        let workers = run.workers;
        let _ = self.store.update(resources::jobs(), Some(ns), &run.job, |j| {
            let time = wall_clock();
            j["status"]["active"] = json!(0);
            j["status"]["ready"] = json!(0);
            if succeeded {
                j["status"]["succeeded"] = json!(workers);
                j["status"]["completionTime"] = json!(time);
                j["status"]["conditions"] = json!([
                    {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached", "lastTransitionTime": time},
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached", "lastTransitionTime": time},
                ]);
            } else {
                j["status"]["failed"] = json!(1);
                j["status"]["conditions"] = json!([
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": time},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": time},
                ]);
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
fn rank(pod: &Value) -> u32 {
    pod["metadata"]["labels"][LABEL_WORKER_INDEX]
        .as_str()
        .and_then(|index| index.parse().ok())
        .unwrap_or(0)
}

/// Rank 0 saves checkpoints, so only its log tells of them.
fn log_rank_zero(store: &Store, pods: &[Arc<PodFacts>], text: &str) {
    for pod in pods.iter().filter(|pod| rank(&pod.object) == 0) {
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
    use super::*;

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
        let pod = json!({"spec": {"containers": [], "overhead": {"cpu": true}}});
        assert_eq!(
            pod_compute(&pod),
            Err("spec.overhead.cpu: true is not a quantity".to_owned())
        );
    }
}
