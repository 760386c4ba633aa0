//! Decisions of the gpu-allocator, hpo-tuner and checkpoint-manager (the
//! cost-optimizer's are in [`crate::cost`]),
//! published on `trainyard.decisions.<kind>.<ns>.<name>`. The planner turns them
//! into Kubernetes writes; nothing else does.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::envelope::EntityRef;
use crate::subject::Family;
use crate::worker::VerificationMethod;

/// A toleration for the planner to add to the worker pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TolerationSpec {
    pub key: String,
    /// `Equal` or `Exists`.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

/// Where one worker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPlacement {
    pub index: u32,
    pub node: String,
    /// GPUs (or MIG slices) of this worker.
    pub gpus: u32,
}

/// The job may start: all of its workers fit now, inside quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionDecided {
    /// The TrainingJob attempt this admission is for; older attempts ignore it.
    pub attempt: u32,
    pub queue: String,
    pub flavor: String,
    /// Labels every worker pod must select.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub tolerations: Vec<TolerationSpec>,
    #[serde(default)]
    pub placements: Vec<WorkerPlacement>,
    /// Topology domain the gang was packed into (label key → value), if any.
    #[serde(default)]
    pub topology: BTreeMap<String, String>,
    /// A job of `capacityType: any` that no node of the capacity type the
    /// cost-optimizer chose (`cost.capacity`) can ever hold alone: admitted
    /// on either type.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capacity_type_reopened: bool,
}

/// Why a job is still waiting, for status and events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingExplained {
    /// The attempt that waits (the TrainingJob's `restartCount`): a preempted
    /// job's next attempt can be explained before the planner has started it.
    /// Unset: the attempt the planner is driving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    pub queue: String,
    /// 1-based position in its queue.
    pub position: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    pub gpus_requested: u32,
    pub gpus_short: u32,
    /// Why the job waits, without its position, e.g. "quota: flavor a100-spot
    /// nvidia.com/gpu: needs 8, queue can take 0 (nominal 16, in use 16); 8 short".
    pub message: String,
    /// Set when no node of any flavor the job may use could hold it even
    /// with the cluster empty: waiting does not help. `message` says the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable: Option<Box<Unschedulable>>,
    /// Set when the queue's pod policy (TrainingQueue `spec.podPolicy`) does
    /// not allow something the job's pods ask for: the job is not admitted
    /// until the spec or the queue changes. `message` says the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policy: Option<Box<PodPolicyRefusal>>,
}

/// What a queue's pod policy does not allow in a job, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicyRefusal {
    /// The TrainingJob field asking for it, e.g. `spec.volumes[1].hostPath`.
    pub field: String,
    /// What the queue does not allow, e.g. "TrainingQueue research does not
    /// allow hostPath volumes (spec.podPolicy.allowedVolumeTypes: none)".
    pub detail: String,
    /// How to get the job admitted, e.g. "remove spec.volumes[1].hostPath, or
    /// name a queue whose podPolicy.allowedVolumeTypes lists hostPath".
    pub fix: String,
}

/// Why no node could ever hold a job, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unschedulable {
    /// The TrainingJob field that asks for more than the nodes offer, e.g.
    /// `spec.gpusPerWorker`, `spec.scheduling.nodeSelector`.
    pub field: String,
    /// The node with the most units of `resource` in the flavor the job came
    /// closest to fitting.
    pub largest_node: String,
    /// Its allocatable units of `resource` (GPUs for `nvidia.com/gpu`).
    pub largest_node_gpus: u32,
    /// `nvidia.com/gpu`, `nvidia.com/gpu.shared` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    /// What does not fit, e.g. "spec.gpusPerWorker is 16 but the largest node
    /// (gpu-node-3) has 8 GPUs".
    pub detail: String,
    /// How to make the job schedulable, e.g. "lower gpusPerWorker to at most
    /// 8 and raise numWorkers".
    pub fix: String,
}

/// The entity (a running job) is to be preempted: checkpoint now, evicted after the grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionDecided {
    /// The job that takes the GPUs; for `drain`, the TrainingQueue (no namespace).
    pub preemptor: EntityRef,
    /// `priority`, `reclaim` (quota lent to others taken back) or `drain`
    /// (the job's queue is set to `stopPolicy: HoldAndDrain`).
    pub reason: String,
    pub message: String,
    pub grace_period_seconds: u32,
    pub evict_after: DateTime<Utc>,
}

/// What a TrainingQueue holds and awaits, for the planner to write into its
/// status. The entity is the queue (cluster-scoped, no namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatusReported {
    /// Jobs waiting for admission.
    pub pending: u32,
    /// Jobs admitted (holding GPUs, or CPU-only).
    pub admitted: u32,
    /// Units in use per flavor and resource, in the queue's flavor order.
    #[serde(default)]
    pub usage: Vec<ResourceUsage>,
    /// Thousandths of the largest fraction of a cohort pool the queue borrows,
    /// divided by its fair-share weight (0 within nominal quota).
    pub weighted_share: u64,
    /// Whether the queue admits jobs.
    pub active: bool,
    /// `Ready`, or why it admits none, e.g. `Stopped`.
    pub reason: String,
    pub message: String,
}

/// Units of one resource of one flavor a queue's admitted jobs hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    pub flavor: String,
    /// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    pub used: u64,
    /// Of those, units above the queue's nominal quota, borrowed from its cohort.
    pub borrowed: u64,
}

/// A value of one hyperparameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParameterValue {
    Int(i64),
    Float(f64),
    Text(String),
}

/// The hpo-tuner asks for a trial (a child TrainingJob of the Sweep entity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialRequested {
    /// Deterministic trial name, `<sweep>-t<index>`.
    pub trial_name: String,
    pub trial_index: u32,
    pub parameters: BTreeMap<String, ParameterValue>,
    /// The experiment-tracking run the hpo-tuner made for the trial before
    /// asking for it; the planner hands it to the trial's workers
    /// (`MLFLOW_TRACKING_URI`, `MLFLOW_RUN_ID`). Absent when tracking is off
    /// or the server could not be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrialTracking>,
}

/// An MLflow run made for a trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialTracking {
    pub mlflow_tracking_uri: String,
    pub mlflow_run_id: String,
}

/// The hpo-tuner stops a trial early (the entity is the Sweep).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialStopped {
    pub trial_name: String,
    pub reason: String,
    /// Epoch rung at which the trial was stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rung: Option<u32>,
}

/// Best trial so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BestTrial {
    pub trial_name: String,
    pub parameters: BTreeMap<String, ParameterValue>,
    pub objective_value: f64,
}

/// Sweep progress for the planner to write into the Sweep's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepProgressed {
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub early_stopped: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_trial: Option<BestTrial>,
    /// Trials that reached each rung, by rung epoch.
    #[serde(default)]
    pub rungs: BTreeMap<u32, u32>,
    /// Set once the sweep ends: `GoalReached`, `MaxTrialsReached` or `TooManyFailures`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Name of the objective metric `bestTrial.objectiveValue` measures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective_metric: Option<String>,
    /// The Sweep's labels, for subscribers that route on them (the notifier).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The Sweep's `trainyard.dev/notify*` annotations and its
    /// `trainyard.dev/model-name` (the model its best trial is registered as).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Why the tuner records the Sweep on its own MLflow server rather than
    /// the one its trial template's `monitoring.mlflowTrackingUri` names (a
    /// server not in its allow-list); the planner writes it as the Sweep's
    /// `TrackingRedirected` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_warning: Option<String>,
}

/// Where the next attempt of a job resumes from: the newest verified checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumePointChosen {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    /// Why this point was (re)published, e.g. `Verified` (a newer checkpoint
    /// was verified) or the job's transition reason (`Restarting`, `Preempted`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_by: Option<VerificationMethod>,
    /// Newer checkpoints passed over because they are not verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedCheckpoint>,
}

/// A checkpoint a resume decision passed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedCheckpoint {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    pub reason: String,
}

/// Who carries out a retention decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionExecutor {
    /// Object stores: the checkpoint-manager has deleted them already.
    #[default]
    CheckpointManager,
    /// Volumes it cannot reach: the job's worker-side reporter deletes them
    /// (it subscribes to this subject).
    Worker,
}

/// Checkpoints to delete under the job's retention policy. Never lists the
/// newest verified, the best, a pinned or registered checkpoint, or one a
/// pending resume names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionApplied {
    pub delete: Vec<String>,
    pub keep: Vec<String>,
    #[serde(default)]
    pub executor: RetentionExecutor,
}

/// A checkpoint identified for status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRef {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

/// What verification of a reported checkpoint found, with the job's
/// checkpoint summary for status. A checkpoint that is not verified is never
/// resumed from; `reason` says why (for an Event on the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointVerified {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    pub verified: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<VerificationMethod>,
    /// `checkpoint-manager` (it read the storage) or `worker` (the worker-side
    /// reporter verified a volume the manager cannot read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier: Option<String>,
    #[serde(default)]
    pub checksums: bool,
    /// Why it is not verified, naming the file or field at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_verified: Option<CheckpointRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<CheckpointRef>,
    /// Checkpoints tracked, verified or not, that retention has not deleted.
    pub count: u32,
}

/// The recommended save interval for a job (Young/Daly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointIntervalAdvised {
    pub interval_seconds: f64,
    /// Mean save duration the workers reported.
    pub save_seconds: f64,
    /// Mean time between interruptions on the job's node pool.
    pub mean_seconds_between_interruptions: f64,
    /// True when `checkpoint.frequency` is `auto`: the worker-side reporter
    /// saves at this interval. Otherwise the advice is shown in status only.
    pub applied: bool,
}

/// The completed job's best verified checkpoint (else its latest verified),
/// registered as a model version; or, with `error`, why the registry refused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRegistered {
    pub model_name: String,
    /// The registry's version number; empty when `error` is set.
    #[serde(default)]
    pub version: String,
    /// The checkpoint URI, the version's `source`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The alias moved to this version, e.g. `best`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Why the model registry refused the registration for good (e.g. an
    /// invalid model name), naming the fix; nothing was registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the version is in the checkpoint-manager's own MLflow registry
    /// rather than the one the job's `monitoring.mlflowTrackingUri` names (a
    /// server not in its allow-list); the planner records it as a Warning
    /// Event on the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking_warning: Option<String>,
}

crate::payload!(
    AdmissionDecided,
    "admission.decided",
    1,
    Family::Decisions,
    "admission"
);
crate::payload!(
    PendingExplained,
    "admission.pending",
    1,
    Family::Decisions,
    "pending"
);
crate::payload!(
    PreemptionDecided,
    "preemption.decided",
    1,
    Family::Decisions,
    "preemption"
);
crate::payload!(
    QueueStatusReported,
    "queue.status",
    1,
    Family::Decisions,
    "queuestatus"
);
crate::payload!(
    TrialRequested,
    "trial.requested",
    1,
    Family::Decisions,
    "trial"
);
crate::payload!(
    TrialStopped,
    "trial.stopped",
    1,
    Family::Decisions,
    "trialstop"
);
crate::payload!(
    SweepProgressed,
    "sweep.progressed",
    1,
    Family::Decisions,
    "sweep"
);
crate::payload!(
    ResumePointChosen,
    "checkpoint.resume",
    1,
    Family::Decisions,
    "resume"
);
crate::payload!(
    RetentionApplied,
    "checkpoint.retention",
    1,
    Family::Decisions,
    "retention"
);
crate::payload!(
    CheckpointVerified,
    "checkpoint.verified",
    1,
    Family::Decisions,
    "verified"
);
crate::payload!(
    CheckpointIntervalAdvised,
    "checkpoint.interval",
    1,
    Family::Decisions,
    "interval"
);
crate::payload!(
    ModelRegistered,
    "checkpoint.registered",
    1,
    Family::Decisions,
    "model"
);
