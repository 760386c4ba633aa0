//! Kubernetes change events, published by the watcher on `trainyard.events.<kind>.<ns>.<name>`.
//!
//! Events about the Jobs and Pods Trainyard owns are published under the owning
//! TrainingJob's namespace/name (the envelope entity), so one job's events land in
//! one partition and arrive in order.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

use crate::subject::Family;

/// Whether the object was created/updated or deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum Change {
    Applied,
    Deleted,
}

/// A TrainingJob as the API server holds it, without `metadata.managedFields`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobChanged {
    pub change: Change,
    pub object: TrainingJob,
}

/// A Sweep as the API server holds it, without `metadata.managedFields`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepChanged {
    pub change: Change,
    pub object: Sweep,
}

/// A TrainingQueue (cluster-scoped) as the API server holds it, without `metadata.managedFields`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingQueueChanged {
    pub change: Change,
    pub object: TrainingQueue,
}

/// A condition copied from a Kubernetes Job or Pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedCondition {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The state of a batch/v1 Job that Trainyard owns (the workers of one attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobObserved {
    pub change: Change,
    /// Name of the Kubernetes Job.
    pub job_name: String,
    pub job_uid: String,
    /// The TrainingJob's restart attempt this Job runs (label `trainyard.dev/attempt`).
    pub attempt: u32,
    pub suspended: bool,
    pub active: u32,
    pub ready: u32,
    pub succeeded: u32,
    pub failed: u32,
    #[serde(default)]
    pub conditions: Vec<ObservedCondition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<DateTime<Utc>>,
}

/// How a container ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerTermination {
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The state of one worker Pod that Trainyard owns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodObserved {
    pub change: Change,
    pub pod_name: String,
    pub attempt: u32,
    /// Completion index of the worker (its rank).
    pub index: u32,
    /// Pending, Running, Succeeded, Failed or Unknown.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Names of the scheduling gates still on the pod (`spec.schedulingGates`):
    /// the scheduler leaves it alone until they are all removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scheduling_gates: Vec<String>,
    pub ready: bool,
    pub restart_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<ContainerTermination>,
    #[serde(default)]
    pub conditions: Vec<ObservedCondition>,
    /// Why the first waiting container (init containers first) has not
    /// started: `ImagePullBackOff`, `ErrImagePull`, `CreateContainerConfigError`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<ContainerWaiting>,
}

/// Why a container has not started yet (`state.waiting` of its status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerWaiting {
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A Warning Event about a Kubernetes Job Trainyard owns: the Job controller's
/// `FailedCreate` when the API server refuses the Job's pods (a ResourceQuota
/// exceeded, a PriorityClass that does not exist, pod security admission).
/// Published under the owning TrainingJob's namespace/name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobEventObserved {
    pub change: Change,
    /// Name of the Kubernetes Job the Event is about.
    pub job_name: String,
    /// The TrainingJob's restart attempt that Job runs (from its name `<name>-a<attempt>`).
    pub attempt: u32,
    pub reason: String,
    pub message: String,
    /// How many times the Event was seen (its `count` or `series.count`).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// The fields of a Node that scheduling needs, and nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeObserved {
    pub change: Change,
    /// Allocatable `nvidia.com/gpu`.
    pub allocatable_gpus: u32,
    /// Allocatable MIG slices by profile (`nvidia.com/mig-1g.10gb` → `1g.10gb`).
    #[serde(default)]
    pub mig: BTreeMap<String, u32>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// `nvidia.com/gpu` requested by pods bound to the node that Trainyard
    /// does not manage (inference servers, notebooks, plain Jobs): not free
    /// for training, though allocatable.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpus_used_by_other_pods: u32,
    /// MIG slices by profile requested by such pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_used_by_other_pods: BTreeMap<String, u32>,
    /// Allocatable `cpu` in millicores; absent when the node reports none
    /// (then CPU does not limit placement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable_cpu_millis: Option<u64>,
    /// Allocatable `memory` in bytes; absent when the node reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable_memory_bytes: Option<u64>,
    /// CPU (millicores) requested by pods bound to the node that the
    /// gpu-allocator did not place: every pod but TrainingJob workers asking
    /// for GPUs (DaemonSets and CPU-only TrainingJobs' workers included).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_millis_used_by_other_pods: u64,
    /// Memory (bytes) requested by such pods.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub memory_bytes_used_by_other_pods: u64,
}

fn is_zero<N: Default + PartialEq>(count: &N) -> bool {
    *count == N::default()
}

crate::payload!(
    TrainingJobChanged,
    "trainingjob.changed",
    1,
    Family::Events,
    "trainingjob"
);
crate::payload!(SweepChanged, "sweep.changed", 1, Family::Events, "sweep");
crate::payload!(
    TrainingQueueChanged,
    "trainingqueue.changed",
    1,
    Family::Events,
    "trainingqueue"
);
crate::payload!(JobObserved, "job.observed", 1, Family::Events, "job");
crate::payload!(PodObserved, "pod.observed", 1, Family::Events, "pod");
crate::payload!(
    JobEventObserved,
    "jobevent.observed",
    1,
    Family::Events,
    "jobevent"
);
crate::payload!(NodeObserved, "node.observed", 1, Family::Events, "node");
