//! Kubernetes objects → typed change events. Pure: no I/O.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Node, Pod, PodSchedulingGate, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt;
use serde::Deserialize;
use trainyard_api::placement::{LABEL_ATTEMPT, LABEL_JOB};
use trainyard_api::quantity::{QuantityError, bytes, cpu_millis};
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};
use trainyard_contracts::EntityRef;

use crate::gpu_usage::Usage;
use trainyard_contracts::events::{
    Change, ContainerTermination, ContainerWaiting, JobEventObserved, JobObserved, NodeObserved,
    ObservedCondition, PodObserved, SweepChanged, Taint, TrainingJobChanged, TrainingQueueChanged,
};

/// Where Kubernetes puts an Indexed Job pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Reason of the Job controller's Event when the API server refuses a Job's pods.
pub const FAILED_CREATE: &str = "FailedCreate";
/// Field selector of the Events watch: the Job controller's refusals only.
pub const FAILED_CREATE_EVENTS: &str = "involvedObject.kind=Job,reason=FailedCreate";
/// Extended resource of whole GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Prefix of MIG slice resources (`nvidia.com/mig-1g.10gb`).
pub const MIG_PREFIX: &str = "nvidia.com/mig-";

/// A batch/v1 Job as the watcher reads it: metadata, `spec.suspend` and the
/// status. The pod template, most of a Job's bytes, is skipped while parsing
/// rather than built and dropped on every change.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedJob {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<WatchedJobSpec>,
    #[serde(default)]
    pub status: Option<JobStatus>,
}

/// The part of a Job's spec the watcher reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedJobSpec {
    #[serde(default)]
    pub suspend: Option<bool>,
}

/// A Pod as the watcher reads it: metadata, `spec.nodeName`, `spec.schedulingGates` and the status.
/// The containers, volumes and the rest of the spec are skipped while parsing.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WatchedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<WatchedPodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// The part of a Pod's spec the watcher reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchedPodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub scheduling_gates: Vec<PodSchedulingGate>,
}

/// Makes a partial type the same API resource as the full Kubernetes type.
macro_rules! resource_as {
    ($partial:ty, $full:ty) => {
        impl kube::Resource for $partial {
            type DynamicType = ();
            type Scope = <$full as k8s_openapi::Resource>::Scope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::KIND.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use resource_as;

resource_as!(WatchedJob, Job);
resource_as!(WatchedPod, Pod);

/// One change event ready to publish.
#[derive(Debug, Clone)]
pub struct ChangeEvent {
    pub entity: EntityRef,
    /// Deduplication id derived from the object's uid and resourceVersion, so a
    /// relist or watch restart republishes nothing new.
    pub message_id: String,
    pub payload: ChangePayload,
}

#[derive(Debug, Clone)]
pub enum ChangePayload {
    TrainingJob(Box<TrainingJobChanged>),
    Sweep(Box<SweepChanged>),
    TrainingQueue(Box<TrainingQueueChanged>),
    Job(JobObserved),
    Pod(Box<PodObserved>),
    JobEvent(Box<JobEventObserved>),
    Node(Box<NodeObserved>),
}

impl ChangePayload {
    /// Whether `self` reports what `other` did: equal Job, Pod or Node
    /// observations. A Job or Pod changes several times per step of its life
    /// (finalizers, conditions' times, status fields no consumer reads), and a
    /// kubelet rewrites its Node's status every few minutes. The custom
    /// resources' events carry whole objects, with their resourceVersion, and
    /// never report the same.
    pub fn reports_same(&self, other: &ChangePayload) -> bool {
        match (self, other) {
            (ChangePayload::Job(a), ChangePayload::Job(b)) => a == b,
            (ChangePayload::Pod(a), ChangePayload::Pod(b)) => a == b,
            (ChangePayload::JobEvent(a), ChangePayload::JobEvent(b)) => a == b,
            (ChangePayload::Node(a), ChangePayload::Node(b)) => a == b,
            _ => false,
        }
    }
}

impl ChangeEvent {
    /// The same event, as a deletion.
    pub fn into_deleted(mut self) -> Self {
        self.message_id = format!("{}:deleted", self.object_uid());
        match &mut self.payload {
            ChangePayload::TrainingJob(p) => p.change = Change::Deleted,
            ChangePayload::Sweep(p) => p.change = Change::Deleted,
            ChangePayload::TrainingQueue(p) => p.change = Change::Deleted,
            ChangePayload::Job(p) => p.change = Change::Deleted,
            ChangePayload::Pod(p) => p.change = Change::Deleted,
            ChangePayload::JobEvent(p) => p.change = Change::Deleted,
            ChangePayload::Node(p) => p.change = Change::Deleted,
        }
        self
    }

    /// The uid of the object that changed (the first part of the message id).
    pub fn object_uid(&self) -> &str {
        self.message_id.split(':').next().unwrap_or_default()
    }

    pub fn kind(&self) -> &'static str {
        match self.payload {
            ChangePayload::TrainingJob(_) => "trainingjob",
            ChangePayload::Sweep(_) => "sweep",
            ChangePayload::TrainingQueue(_) => "trainingqueue",
            ChangePayload::Job(_) => "job",
            ChangePayload::Pod(_) => "pod",
            ChangePayload::JobEvent(_) => "jobevent",
            ChangePayload::Node(_) => "node",
        }
    }
}

/// A watched kind: how its objects become change events.
pub trait Watched: kube::Resource + Clone {
    /// The event for this object, or None when Trainyard does not care about it
    /// (a Job or Pod it does not own).
    fn to_event(&self, change: Change) -> Option<ChangeEvent>;

    /// A hash of what this kind's consumers act on: a change that leaves it as
    /// last published is not published. None: a change is published unless
    /// its event reports the same as the last one published
    /// ([`ChangePayload::reports_same`]).
    fn published_fingerprint(&self) -> Option<u64> {
        None
    }
}

fn message_id<K: kube::Resource>(object: &K, change: Change) -> Option<String> {
    let uid = object.uid()?;
    Some(match change {
        Change::Applied => format!("{uid}:{}", object.resource_version().unwrap_or_default()),
        Change::Deleted => format!("{uid}:deleted"),
    })
}

/// A copy of `object` without `metadata.managedFields`: no consumer reads them,
/// and on a real API server they are often most of an object's bytes.
fn without_managed_fields<K: kube::Resource + Clone>(object: &K) -> K {
    let mut copy = object.clone();
    copy.meta_mut().managed_fields = None;
    copy
}

fn own_entity<K: kube::Resource>(object: &K) -> EntityRef {
    EntityRef::new(
        object.namespace().unwrap_or_default(),
        object.name_any(),
        object.uid().unwrap_or_default(),
    )
}

/// The TrainingJob a Job or Pod belongs to: its `trainyard.dev/job` label, plus the
/// owner's uid when the owner is the TrainingJob itself.
fn owning_training_job<K: kube::Resource>(object: &K) -> Option<EntityRef> {
    let name = object.labels().get(LABEL_JOB)?.clone();
    let uid = object
        .owner_references()
        .iter()
        .find(|owner| owner.kind == "TrainingJob" && owner.name == name)
        .map(|owner| owner.uid.clone())
        .unwrap_or_default();
    Some(EntityRef::new(
        object.namespace().unwrap_or_default(),
        name,
        uid,
    ))
}

fn attempt<K: kube::Resource>(object: &K) -> u32 {
    object
        .labels()
        .get(LABEL_ATTEMPT)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

impl Watched for TrainingJob {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        Some(ChangeEvent {
            entity: own_entity(self),
            message_id: message_id(self, change)?,
            payload: ChangePayload::TrainingJob(Box::new(TrainingJobChanged {
                change,
                object: without_managed_fields(self),
            })),
        })
    }

    /// The spec (by `metadata.generation`), labels, annotations, owners,
    /// deletion, the attempt (`status.restartCount`), whether the attempt
    /// waits out a backoff (`status.requeueAt`: the gpu-allocator queues it
    /// only once that is cleared) and whether the job has finished. The planner's own writes (its finalizer, progress,
    /// conditions, states short of the end) come back from the API server as
    /// changes too, about two thirds of a job's: the planner holds what it wrote, and
    /// `trainingjob.transitioned` carries the state changes. Without a
    /// generation (an API server that sets none) every change is published.
    fn published_fingerprint(&self) -> Option<u64> {
        let metadata = &self.metadata;
        let mut hasher = DefaultHasher::new();
        metadata.generation?.hash(&mut hasher);
        metadata.labels.hash(&mut hasher);
        metadata.annotations.hash(&mut hasher);
        for owner in metadata.owner_references.iter().flatten() {
            owner.uid.hash(&mut hasher);
        }
        metadata
            .deletion_timestamp
            .as_ref()
            .map(|at| at.0.as_nanosecond())
            .hash(&mut hasher);
        let status = self.status.as_ref();
        status.and_then(|s| s.restart_count).hash(&mut hasher);
        status
            .is_some_and(|s| s.requeue_at.is_some())
            .hash(&mut hasher);
        status
            .and_then(|s| s.state)
            .is_some_and(|state| state.is_terminal())
            .hash(&mut hasher);
        Some(hasher.finish())
    }
}

impl Watched for Sweep {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        Some(ChangeEvent {
            entity: own_entity(self),
            message_id: message_id(self, change)?,
            payload: ChangePayload::Sweep(Box::new(SweepChanged {
                change,
                object: without_managed_fields(self),
            })),
        })
    }
}

impl Watched for TrainingQueue {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        Some(ChangeEvent {
            entity: own_entity(self),
            message_id: message_id(self, change)?,
            payload: ChangePayload::TrainingQueue(Box::new(TrainingQueueChanged {
                change,
                object: without_managed_fields(self),
            })),
        })
    }
}

fn conditions<'a>(
    items: impl Iterator<Item = (&'a str, &'a str, Option<&'a String>, Option<&'a String>)>,
) -> Vec<ObservedCondition> {
    items
        .map(
            |(condition_type, status, reason, message)| ObservedCondition {
                condition_type: condition_type.to_string(),
                status: status.to_string(),
                reason: reason.cloned(),
                message: message.cloned(),
            },
        )
        .collect()
}

/// Kubernetes times (jiff) as the contracts' chrono times.
fn utc(time: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(
        time.0.as_second(),
        time.0.subsec_nanosecond().try_into().ok()?,
    )
}

fn count(value: Option<i32>) -> u32 {
    value.and_then(|v| u32::try_from(v).ok()).unwrap_or(0)
}

impl Watched for WatchedJob {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        let entity = owning_training_job(self)?;
        let status = self.status.clone().unwrap_or_default();
        let observed = JobObserved {
            change,
            job_name: self.name_any(),
            job_uid: self.uid().unwrap_or_default(),
            attempt: attempt(self),
            suspended: self.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false),
            active: count(status.active),
            ready: count(status.ready),
            succeeded: count(status.succeeded),
            failed: count(status.failed),
            conditions: conditions(status.conditions.iter().flatten().map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_ref(),
                    c.message.as_ref(),
                )
            })),
            start_time: status.start_time.and_then(|t| utc(&t)),
            completion_time: status.completion_time.and_then(|t| utc(&t)),
        };
        Some(ChangeEvent {
            entity,
            message_id: message_id(self, change)?,
            payload: ChangePayload::Job(observed),
        })
    }
}

impl Watched for WatchedPod {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        let entity = owning_training_job(self)?;
        let status = self.status.clone().unwrap_or_default();
        let index = self
            .annotations()
            .get(COMPLETION_INDEX)
            .or_else(|| self.labels().get(COMPLETION_INDEX))
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let container = status.container_statuses.iter().flatten().next();
        let termination = container.and_then(|c| {
            let terminated = c
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
            Some(ContainerTermination {
                exit_code: terminated.exit_code,
                signal: terminated.signal,
                reason: terminated.reason.clone(),
                message: terminated.message.clone(),
            })
        });
        let pod_conditions = conditions(status.conditions.iter().flatten().map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_ref(),
                c.message.as_ref(),
            )
        }));
        let waiting = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .find_map(waiting);
        let observed = PodObserved {
            change,
            pod_name: self.name_any(),
            attempt: attempt(self),
            index,
            phase: status
                .phase
                .clone()
                .unwrap_or_else(|| "Unknown".to_string()),
            node_name: self.spec.as_ref().and_then(|s| s.node_name.clone()),
            scheduling_gates: self
                .spec
                .iter()
                .flat_map(|s| &s.scheduling_gates)
                .map(|gate| gate.name.clone())
                .collect(),
            ready: pod_conditions
                .iter()
                .any(|c| c.condition_type == "Ready" && c.status == "True"),
            restart_count: container.map(|c| count(Some(c.restart_count))).unwrap_or(0),
            termination,
            conditions: pod_conditions,
            waiting,
        };
        Some(ChangeEvent {
            entity,
            message_id: message_id(self, change)?,
            payload: ChangePayload::Pod(Box::new(observed)),
        })
    }
}

/// Why a container has not started, when it is waiting with a reason.
fn waiting(container: &ContainerStatus) -> Option<ContainerWaiting> {
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    Some(ContainerWaiting {
        reason: waiting.reason.clone()?,
        message: waiting.message.clone(),
    })
}

/// The TrainingJob and attempt of a Job named `<name>-a<attempt>`, the only
/// names the planner gives its Jobs.
pub fn training_job_of_job_name(job_name: &str) -> Option<(&str, u32)> {
    let (name, attempt) = job_name.rsplit_once("-a")?;
    if name.is_empty() || attempt.is_empty() || !attempt.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((name, attempt.parse().ok()?))
}

/// The Job controller's `FailedCreate` Events about the planner's Jobs,
/// under the owning TrainingJob (named by the Job's name: an Event carries
/// no labels of its object).
impl Watched for Event {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        let regarding = &self.involved_object;
        if regarding.kind.as_deref() != Some("Job") || self.reason.as_deref() != Some(FAILED_CREATE)
        {
            return None;
        }
        let job_name = regarding.name.as_deref()?;
        let (training_job, attempt) = training_job_of_job_name(job_name)?;
        let namespace = regarding
            .namespace
            .clone()
            .or_else(|| self.namespace())
            .unwrap_or_default();
        let count = self
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(self.count)
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(1);
        Some(ChangeEvent {
            entity: EntityRef::new(namespace, training_job, String::new()),
            message_id: message_id(self, change)?,
            payload: ChangePayload::JobEvent(Box::new(JobEventObserved {
                change,
                job_name: job_name.to_owned(),
                attempt,
                reason: FAILED_CREATE.to_owned(),
                message: self.message.clone().unwrap_or_default(),
                count,
            })),
        })
    }
}

/// `<kind> <namespace>/<name>` of an object (`<kind> <name>` when
/// cluster-scoped), for logs: formatted only when something is logged.
pub(crate) struct ObjectName<'a>(pub &'static str, pub &'a ObjectMeta);

impl fmt::Display for ObjectName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ObjectName(kind, meta) = self;
        let name = meta.name.as_deref().unwrap_or_default();
        match meta.namespace.as_deref() {
            Some(namespace) => write!(f, "{kind} {namespace}/{name}"),
            None => write!(f, "{kind} {name}"),
        }
    }
}

/// `quantity`, at `field` of `object`, as a whole number of `parse`'s unit;
/// None when it does not parse. The API server validates quantities, so one
/// that fails here overflows or uses a form this parser lacks: it is logged,
/// not taken for a number it is not.
pub(crate) fn read_quantity(
    parse: fn(&str) -> Result<u64, QuantityError>,
    quantity: &Quantity,
    object: &dyn fmt::Display,
    field: &dyn fmt::Display,
) -> Option<u64> {
    parse(&quantity.0)
        .inspect_err(|error| {
            tracing::warn!(%object, %field, %error, "resource quantity does not parse; ignored");
        })
        .ok()
}

/// A count of device-plugin resources (GPUs, MIG slices): 0 when it does not
/// parse (logged, see [`read_quantity`]).
pub(crate) fn whole(
    quantity: &Quantity,
    object: &dyn fmt::Display,
    field: &dyn fmt::Display,
) -> u32 {
    read_quantity(bytes, quantity, object, field)
        .map_or(0, |count| u32::try_from(count).unwrap_or(u32::MAX))
}

/// The event of `node`, with what pods Trainyard does not manage hold on it
/// (see [`crate::gpu_usage`]). A change of that usage alone keeps the node's
/// version, so its id names the pod change behind it (`usage_change`), and
/// a node change's id the usage it carries: the usage coming back to an
/// earlier value is not a duplicate, and a relist repeats the same ids.
pub(crate) fn node_event(
    node: &Node,
    used: &Usage,
    usage_change: Option<&str>,
    change: Change,
) -> Option<ChangeEvent> {
    let mut message_id = message_id(node, change)?;
    match usage_change {
        _ if change == Change::Deleted => {}
        Some(pod_change) => message_id.push_str(&format!(":pod={pod_change}")),
        None if !used.is_empty() => {
            message_id.push_str(&format!(":used={}", used.gpus));
            for (profile, n) in &used.mig {
                message_id.push_str(&format!(",{profile}={n}"));
            }
            // Left out when zero, so the ids of GPU-only usage read as before.
            if used.cpu_millis > 0 {
                message_id.push_str(&format!(",cpu={}m", used.cpu_millis));
            }
            if used.memory_bytes > 0 {
                message_id.push_str(&format!(",memory={}", used.memory_bytes));
            }
        }
        None => {}
    }
    let object = ObjectName("node", &node.metadata);
    let status = node.status.clone().unwrap_or_default();
    let allocatable = status.allocatable.unwrap_or_default();
    let mig: BTreeMap<String, u32> = allocatable
        .iter()
        .filter_map(|(name, q)| {
            let profile = name.strip_prefix(MIG_PREFIX)?;
            Some((
                profile.to_string(),
                whole(q, &object, &format_args!("status.allocatable[{name}]")),
            ))
        })
        .collect();
    let read_allocatable = |name: &str, parse: fn(&str) -> Result<u64, QuantityError>| {
        let quantity = allocatable.get(name)?;
        let field = format_args!("status.allocatable[{name}]");
        read_quantity(parse, quantity, &object, &field)
    };
    let spec = node.spec.clone().unwrap_or_default();
    let observed = NodeObserved {
        change,
        allocatable_gpus: allocatable.get(GPU_RESOURCE).map_or(0, |q| {
            whole(
                q,
                &object,
                &format_args!("status.allocatable[{GPU_RESOURCE}]"),
            )
        }),
        mig,
        labels: node.labels().clone(),
        taints: spec
            .taints
            .iter()
            .flatten()
            .map(|t| Taint {
                key: t.key.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
            .collect(),
        unschedulable: spec.unschedulable.unwrap_or(false),
        ready: status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        gpus_used_by_other_pods: used.gpus,
        mig_used_by_other_pods: used.mig.clone(),
        allocatable_cpu_millis: read_allocatable("cpu", cpu_millis),
        allocatable_memory_bytes: read_allocatable("memory", bytes),
        cpu_millis_used_by_other_pods: used.cpu_millis,
        memory_bytes_used_by_other_pods: used.memory_bytes,
    };
    Some(ChangeEvent {
        entity: EntityRef::new("", node.name_any(), node.uid().unwrap_or_default()),
        message_id,
        payload: ChangePayload::Node(Box::new(observed)),
    })
}
