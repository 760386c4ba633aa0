//! `TrainingJob`: one (possibly distributed) training run.
//!
//! Every field of the reference API's spec and status tables is here, plus the
//! scheduling fields Trainyard adds (queue, capacity type, MIG, time slicing).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::validation::{
    DNS_SUBDOMAIN_PATTERN, FieldError, FieldErrors, MAX_DNS_SUBDOMAIN_LENGTH, decode_at,
};
use crate::wire_enum::wire_enum;

/// Fewest workers a job may ask for.
pub const MIN_WORKERS: u32 = 1;
/// Most workers a job may ask for.
pub const MAX_WORKERS: u32 = 100;
/// GPUs per worker when `gpusPerWorker` is unset.
pub const DEFAULT_GPUS_PER_WORKER: u32 = 1;
/// Most GPUs (or MIG slices) one worker may ask for.
pub const MAX_GPUS_PER_WORKER: u32 = 64;
/// Framework when `framework` is unset.
pub const DEFAULT_FRAMEWORK: Framework = Framework::Pytorch;
/// Epochs when `hyperparameters.epochs` is unset.
pub const DEFAULT_EPOCHS: u32 = 10;
/// Rendezvous port when `networking.masterPort` is unset (torchrun's default).
pub const DEFAULT_MASTER_PORT: u32 = 29500;
/// Lowest allowed rendezvous port: ports below 1024 are privileged.
pub const MIN_MASTER_PORT: u32 = 1024;
/// Highest TCP port.
pub const MAX_PORT: u32 = 65535;
/// Metrics port when `monitoring.metricsPort` is unset.
pub const DEFAULT_METRICS_PORT: u32 = 9090;
/// Checkpoint interval in epochs when `checkpoint.frequency` is unset.
pub const DEFAULT_CHECKPOINT_FREQUENCY: u32 = 1;
/// Restarts allowed when `failurePolicy.backoffLimit` is unset.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;
/// Most restarts a job may allow.
pub const MAX_BACKOFF_LIMIT: u32 = 100;
/// Metric compared with `successPolicy.targetAccuracy` when `successPolicy.metric` is unset.
pub const DEFAULT_SUCCESS_METRIC: &str = "accuracy";
/// TrainingQueue used when `scheduling.queue` is unset.
pub const DEFAULT_QUEUE: &str = "default";
/// Longest model name.
pub const MAX_MODEL_LENGTH: usize = 253;
/// Longest dataset name or URI.
pub const MAX_DATASET_LENGTH: usize = 1024;
/// Longest image reference, path or URI.
pub const MAX_REFERENCE_LENGTH: usize = 1024;
/// Schema pattern of an NVIDIA MIG profile such as `1g.10gb` or `1g.10gb+me`;
/// [`is_mig_profile`] is the same check in Rust.
pub const MIG_PROFILE_PATTERN: &str = r"^[1-7]g\.[1-9][0-9]*gb(\+me)?$";

// CEL rules and their messages. The Rust mirror in `validate()` reuses the messages so
// kubectl and NATS submitters read the same words.
const RULE_MIG_NEEDS_GPUS: &str = "!has(self.scheduling) || !has(self.scheduling.migProfile) || !has(self.gpusPerWorker) || self.gpusPerWorker >= 1";
const MSG_MIG_NEEDS_GPUS: &str = "scheduling.migProfile needs gpusPerWorker of at least 1: each worker gets gpusPerWorker slices of this MIG profile";
const RULE_NCCL_NEEDS_GPUS: &str = "!has(self.networking) || !has(self.networking.backend) || self.networking.backend != 'nccl' || !has(self.gpusPerWorker) || self.gpusPerWorker >= 1";
const MSG_NCCL_NEEDS_GPUS: &str = "networking.backend nccl needs GPUs: set gpusPerWorker to at least 1, or use gloo for CPU-only training";
// 29500 is DEFAULT_MASTER_PORT; a unit test keeps the two in step.
const RULE_METRICS_PORT_FREE: &str = "!has(self.monitoring) || !has(self.monitoring.metricsPort) || self.monitoring.metricsPort != (has(self.networking) && has(self.networking.masterPort) ? self.networking.masterPort : 29500)";
const MSG_METRICS_PORT_FREE: &str = "monitoring.metricsPort must differ from networking.masterPort (default 29500): both are opened in the same worker pod";
/// Most user volumes (and mounts) per worker pod; bounds the CEL rules' cost.
pub const MAX_POD_VOLUMES: usize = 16;
/// Volume names the planner gives its own volumes; a user volume must not take one.
pub const RESERVED_VOLUME_NAMES: [&str; 3] = ["trainyard-config", "dshm", "checkpoints"];
const RULE_VOLUME_NAMES_FREE: &str = "!has(self.volumes) || self.volumes.all(v, !(v.name in ['trainyard-config', 'dshm', 'checkpoints']))";
const MSG_VOLUME_NAMES_FREE: &str = "volumes must not be named trainyard-config, dshm or checkpoints: Trainyard mounts its own volumes under those names";
// No CEL rule for this one: Volume names have no maxLength in the Kubernetes schema, so
// matching every mount against every volume exceeds the apiserver's CEL cost budget.
// The CLI and the planner's pre-flight check it; the apiserver refuses such a pod too.
const MSG_MOUNTS_NAME_VOLUMES: &str =
    "every volumeMounts[].name must be the name of one of spec.volumes";
const RULE_PATIENCE_BELOW_EPOCHS: &str = "!has(self.successPolicy) || !has(self.successPolicy.earlyStoppingPatience) || !has(self.hyperparameters) || !has(self.hyperparameters.epochs) || self.successPolicy.earlyStoppingPatience < self.hyperparameters.epochs";
const MSG_PATIENCE_BELOW_EPOCHS: &str = "successPolicy.earlyStoppingPatience must be less than hyperparameters.epochs, otherwise early stopping can never trigger";
const RULE_CHECKPOINT_WITHIN_EPOCHS: &str = "!has(self.checkpoint) || !has(self.checkpoint.enabled) || !self.checkpoint.enabled || !has(self.checkpoint.frequency) || !has(self.hyperparameters) || !has(self.hyperparameters.epochs) || !string(self.checkpoint.frequency).matches('^[0-9]+$') || int(self.checkpoint.frequency) <= self.hyperparameters.epochs";
const MSG_CHECKPOINT_WITHIN_EPOCHS: &str = "checkpoint.frequency is larger than hyperparameters.epochs, so no checkpoint would ever be written: lower the frequency or raise epochs";
const RULE_FREQUENCY_EPOCHS_OR_AUTO: &str = "!has(self.frequency) || string(self.frequency) == 'auto' || string(self.frequency).matches('^[1-9][0-9]*$')";
const MSG_FREQUENCY_EPOCHS_OR_AUTO: &str = "checkpoint.frequency must be a whole number of epochs, at least 1 (frequency: 2), or auto to follow the checkpoint-manager's advised interval (frequency: auto)";
const RULE_RESUME_NEEDS_CHECKPOINTING: &str =
    "!has(self.resumeFrom) || (has(self.enabled) && self.enabled)";
const MSG_RESUME_NEEDS_CHECKPOINTING: &str = "checkpoint.resumeFrom needs checkpoint.enabled: true; enable checkpointing or remove resumeFrom";
const RULE_S3_NEEDS_BUCKET: &str = "self.type != 's3' || has(self.s3Bucket)";
const MSG_S3_NEEDS_BUCKET: &str =
    "storage type s3 needs s3Bucket: set the bucket that holds the checkpoints";
const RULE_GCS_NEEDS_BUCKET: &str = "self.type != 'gcs' || has(self.gcsBucket)";
const MSG_GCS_NEEDS_BUCKET: &str =
    "storage type gcs needs gcsBucket: set the bucket that holds the checkpoints";
const RULE_PVC_NEEDS_CLAIM: &str = "self.type != 'pvc' || has(self.claimName)";
const MSG_PVC_NEEDS_CLAIM: &str = "storage type pvc needs claimName: set the name of a PersistentVolumeClaim in the job's namespace";
const RULE_NFS_NEEDS_SERVER: &str = "self.type != 'nfs' || has(self.nfsServer)";
const MSG_NFS_NEEDS_SERVER: &str =
    "storage type nfs needs nfsServer: set the NFS server host name or address";
const RULE_NFS_NEEDS_PATH: &str = "self.type != 'nfs' || has(self.nfsPath)";
const MSG_NFS_NEEDS_PATH: &str =
    "storage type nfs needs nfsPath: set the exported directory on the NFS server";
const RULE_NEVER_RESTART_NO_BACKOFF: &str = "!has(self.restartPolicy) || self.restartPolicy != 'Never' || !has(self.backoffLimit) || self.backoffLimit == 0";
const MSG_NEVER_RESTART_NO_BACKOFF: &str = "failurePolicy.backoffLimit has no effect with restartPolicy Never: remove backoffLimit or set it to 0";

wire_enum! {
    /// ML framework the workers run: pytorch (torchrun environment), tensorflow (TF_CONFIG)
    /// or jax (JAX coordinator variables).
    pub enum Framework {
        Pytorch => "pytorch",
        Tensorflow => "tensorflow",
        Jax => "jax",
    }
}

wire_enum! {
    /// Optimizer: adam, sgd, adamw or rmsprop.
    pub enum Optimizer {
        Adam => "adam",
        Sgd => "sgd",
        Adamw => "adamw",
        Rmsprop => "rmsprop",
    }
}

wire_enum! {
    /// Checkpoint storage backend: pvc (a PersistentVolumeClaim), s3 (or an S3-compatible
    /// store), gcs (Google Cloud Storage) or nfs (an NFS export mounted into the workers).
    pub enum StorageType {
        Pvc => "pvc",
        S3 => "s3",
        Gcs => "gcs",
        Nfs => "nfs",
    }
}

wire_enum! {
    /// Node capacity a job may run on: spot (cheaper, can be reclaimed; the job resumes
    /// from its last checkpoint), on-demand, or any (the cost optimizer chooses).
    pub enum CapacityType {
        Spot => "spot",
        OnDemand => "on-demand",
        Any => "any",
    }
}

wire_enum! {
    /// Collective communication backend: nccl (GPU), gloo (CPU, or GPU without NCCL) or mpi.
    pub enum CommunicationBackend {
        Nccl => "nccl",
        Gloo => "gloo",
        Mpi => "mpi",
    }
}

wire_enum! {
    /// What happens when a worker fails: OnFailure restarts the job from its latest
    /// checkpoint up to backoffLimit times, Never fails the job at the first failure,
    /// ExitCode restarts only for retryable exit codes (signals, spot reclaims, NCCL
    /// timeouts) and fails at once on a program error.
    pub enum RestartPolicy {
        OnFailure => "OnFailure",
        Never => "Never",
        ExitCode => "ExitCode",
    }
}

wire_enum! {
    /// Lifecycle state of a TrainingJob: Pending (accepted, not yet queued), Queued (waiting
    /// for quota), Initializing (admitted, pods starting), Running, Suspended, Completed or Failed.
    pub enum TrainingJobState {
        Pending => "Pending",
        Queued => "Queued",
        Initializing => "Initializing",
        Running => "Running",
        Suspended => "Suspended",
        Completed => "Completed",
        Failed => "Failed",
    }
}

impl TrainingJobState {
    /// True for Completed and Failed: the job will not run again.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

/// Desired state of a TrainingJob: what to train, on how many workers and GPUs, and how
/// to checkpoint, schedule, monitor and finish it.
// Every printcolumn repeats keys such as `type_`, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "trainyard.dev",
    version = "v1",
    kind = "TrainingJob",
    namespaced,
    status = "TrainingJobStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "tj",
    shortname = "tjob",
    category = "trainyard",
    doc = "A machine-learning training run on Kubernetes: Trainyard queues it, gangs GPUs for all of its workers, runs distributed PyTorch, TensorFlow or JAX training, checkpoints it and resumes it after failures.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Lifecycle state"
    ),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "Training progress"
    ),
    printcolumn(
        name = "Epoch",
        type_ = "integer",
        json_path = ".status.currentEpoch",
        description = "Current epoch"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Restarts",
        type_ = "integer",
        json_path = ".status.restartCount",
        description = "Restarts after failures or preemptions",
        priority = 1
    ),
    printcolumn(
        name = "Position",
        type_ = "integer",
        json_path = ".status.queue.position",
        description = "Position in the TrainingQueue while waiting",
        priority = 1
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".status.resources.gpus",
        description = "GPUs allocated",
        priority = 1
    ),
    printcolumn(
        name = "Queue",
        type_ = "string",
        json_path = ".spec.scheduling.queue",
        description = "TrainingQueue",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_MIG_NEEDS_GPUS).message(MSG_MIG_NEEDS_GPUS).field_path(".scheduling.migProfile"),
    validation = Rule::new(RULE_NCCL_NEEDS_GPUS).message(MSG_NCCL_NEEDS_GPUS).field_path(".networking.backend"),
    validation = Rule::new(RULE_METRICS_PORT_FREE).message(MSG_METRICS_PORT_FREE).field_path(".monitoring.metricsPort"),
    validation = Rule::new(RULE_PATIENCE_BELOW_EPOCHS).message(MSG_PATIENCE_BELOW_EPOCHS).field_path(".successPolicy.earlyStoppingPatience"),
    validation = Rule::new(RULE_CHECKPOINT_WITHIN_EPOCHS).message(MSG_CHECKPOINT_WITHIN_EPOCHS).field_path(".checkpoint.frequency"),
    validation = Rule::new(RULE_VOLUME_NAMES_FREE).message(MSG_VOLUME_NAMES_FREE).field_path(".volumes"),
)]
pub struct TrainingJobSpec {
    /// Model architecture to train, e.g. resnet50 or bert-base. Passed to the workers as MODEL_NAME.
    #[schemars(length(min = 1, max = MAX_MODEL_LENGTH))]
    pub model: String,

    /// Dataset name or URI, e.g. imagenet or s3://datasets/imagenet. Passed to the workers as DATASET.
    #[schemars(length(min = 1, max = MAX_DATASET_LENGTH))]
    pub dataset: String,

    /// Number of worker replicas, 1 to 100. All workers are admitted and started together.
    #[schemars(range(min = MIN_WORKERS, max = MAX_WORKERS))]
    pub num_workers: u32,

    /// GPUs per worker, 0 to 64 (0 trains on CPU). With scheduling.migProfile these are MIG slices. Default 1.
    #[serde(
        default = "default_gpus_per_worker",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = MAX_GPUS_PER_WORKER))]
    pub gpus_per_worker: Option<u32>,

    /// ML framework: pytorch, tensorflow or jax. Decides the distributed environment given to workers. Default pytorch.
    #[serde(default = "default_framework", skip_serializing_if = "Option::is_none")]
    pub framework: Option<Framework>,

    /// Container image of the workers. Default: the framework's Trainyard training image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH))]
    pub image: Option<String>,

    /// Container entrypoint of the workers; the image's ENTRYPOINT when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,

    /// Arguments to the entrypoint; the image's CMD when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,

    /// Extra environment variables for every worker. Trainyard's own variables (MASTER_ADDR, RANK, TF_CONFIG, ...) take precedence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,

    /// CPU, memory and other resource requests and limits of each worker. The GPU resource is set from gpusPerWorker; other NVIDIA GPU resources are refused (they would escape the queue's quota), other extended resources need the queue's podPolicy.allowedExtendedResources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// ServiceAccount the worker pods run as, e.g. one bound to a cloud role (IRSA, Workload Identity) that may read the dataset and write the checkpoint bucket. The namespace's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Secrets holding credentials for pulling the worker image from a private registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,

    /// Extra volumes of every worker pod (datasets, caches, credentials); mounted with volumeMounts. The names trainyard-config, dshm and checkpoints are Trainyard's own. Types beyond configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected and secret (hostPath, nfs, ...) need the queue's podPolicy.allowedVolumeTypes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_POD_VOLUMES))]
    pub volumes: Vec<Volume>,

    /// Where the worker container mounts spec.volumes; each names one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_POD_VOLUMES))]
    pub volume_mounts: Vec<VolumeMount>,

    /// Labels added to every worker pod, e.g. for cost allocation or network policies. Trainyard's own labels (trainyard.dev/...) take precedence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,

    /// Annotations added to every worker pod, e.g. for a service mesh or a secrets injector. Trainyard's own annotations take precedence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,

    /// Pod-level security context of the workers: runAsUser, runAsNonRoot, fsGroup (so a mounted volume is writable), seccompProfile. Settings beyond the Pod Security Standards' baseline (Unconfined seccomp or AppArmor, custom SELinux types, unsafe sysctls, Windows hostProcess) need the queue's podPolicy.allowUnsafeSecurityContext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,

    /// Training hyperparameters, passed to the workers as environment variables and a config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperparameters: Option<Hyperparameters>,

    /// Checkpointing: how often, where, how many to keep, and where to resume from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,

    /// Scheduling: priority, queue, node placement, capacity type and GPU sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingSpec>,

    /// Monitoring: metrics port, TensorBoard and experiment tracking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<MonitoringSpec>,

    /// Networking between workers: communication backend, rendezvous port, RDMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networking: Option<NetworkingSpec>,

    /// Failure handling: restart policy, restart limit and deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,

    /// Success criteria: stop early when a metric reaches its target or stops improving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_policy: Option<SuccessPolicy>,

    /// Suspend the job: running workers are stopped after a checkpoint and their GPUs released; set back to false to resume. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

fn default_gpus_per_worker() -> Option<u32> {
    Some(DEFAULT_GPUS_PER_WORKER)
}

fn default_framework() -> Option<Framework> {
    Some(DEFAULT_FRAMEWORK)
}

/// Training hyperparameters.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hyperparameters {
    /// Learning rate, greater than 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub learning_rate: Option<f64>,

    /// Batch size per worker, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub batch_size: Option<u32>,

    /// Number of epochs, at least 1. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub epochs: Option<u32>,

    /// Optimizer: adam, sgd, adamw or rmsprop. Default: the training script's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<Optimizer>,

    /// Learning-rate warmup steps, 0 or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub warmup_steps: Option<u32>,

    /// Batches whose gradients are accumulated before each optimizer step, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub gradient_accumulation_steps: Option<u32>,

    /// Train with mixed precision (fp16/bf16 autocast). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed_precision: Option<bool>,

    /// Further hyperparameters for the training script, e.g. weight_decay: "0.01".
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_params: BTreeMap<String, String>,
}

/// Checkpoint configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_RESUME_NEEDS_CHECKPOINTING).message(MSG_RESUME_NEEDS_CHECKPOINTING).field_path(".resumeFrom"),
    validation = Rule::new(RULE_FREQUENCY_EPOCHS_OR_AUTO).message(MSG_FREQUENCY_EPOCHS_OR_AUTO).field_path(".frequency")
)]
pub struct CheckpointSpec {
    /// Write checkpoints. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Write a checkpoint every this many epochs (at least 1), or auto: at the interval the checkpoint-manager advises from save durations and the queue's interruptions (Young/Daly), every epoch until its first advice. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency: Option<CheckpointFrequency>,

    /// Where checkpoints are stored. Default: a volume that lives as long as the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<CheckpointStorage>,

    /// Checkpoint to start from, e.g. s3://checkpoints/gpt/checkpoint-epoch-10. Needs enabled: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH))]
    pub resume_from: Option<String>,

    /// Which checkpoints to keep; the rest are deleted by the checkpoint-manager (object stores) or the worker-side reporter (volumes). Never deleted: the newest verified checkpoint, the best one, pinned ones, the registered model version's, and the one a pending resume names. Default: keep all. The earlier form, a whole number N, is read as keepLast: N by Trainyard's services; the schema takes the object form, so write retention: {keepLast: N}.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "retention_either_form"
    )]
    pub retention: Option<RetentionPolicySpec>,
}

const RULE_RETENTION_KEEPS_SOMETHING: &str = "(has(self.keepLast) && self.keepLast > 0) || has(self.keepBest) || has(self.keepEveryNSteps) || (has(self.pinnedSteps) && size(self.pinnedSteps) > 0)";
const MSG_RETENTION_KEEPS_SOMETHING: &str = "checkpoint.retention keeps nothing: keepLast is 0 or unset and no keepBest, keepEveryNSteps or pinnedSteps is set; set keepLast to at least 1 or add keepBest";

/// A declarative checkpoint retention policy: a checkpoint is kept when any rule keeps it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_RETENTION_KEEPS_SOMETHING).message(MSG_RETENTION_KEEPS_SOMETHING).field_path(".keepLast")
)]
pub struct RetentionPolicySpec {
    /// Keep the newest N verified checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100000))]
    pub keep_last: Option<u32>,

    /// Keep the best checkpoints by a reported metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_best: Option<KeepBestSpec>,

    /// Keep every checkpoint whose step is a multiple of this, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub keep_every_n_steps: Option<u64>,

    /// Steps whose checkpoints are never deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub pinned_steps: Vec<u64>,
}

/// Keep the best checkpoints by a metric the workers report with each checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeepBestSpec {
    /// Metric to rank by, e.g. loss or accuracy.
    #[schemars(length(min = 1, max = 256))]
    pub metric: String,

    /// min (lower is better, e.g. loss) or max (higher is better, e.g. accuracy). Default min.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MetricMode>,

    /// How many of the best to keep, at least 1. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub count: Option<u32>,
}

wire_enum! {
    /// Whether lower (min) or higher (max) metric values are better.
    pub enum MetricMode {
        Min => "min",
        Max => "max",
    }
}

/// `checkpoint.frequency`: a whole number of epochs, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointFrequency {
    /// Every this many epochs.
    Epochs(u32),
    /// At the checkpoint-manager's advised interval (`status.checkpoint.advisedIntervalSeconds`).
    Auto,
}

/// The spelling of [`CheckpointFrequency::Auto`].
pub const CHECKPOINT_FREQUENCY_AUTO: &str = "auto";

impl std::fmt::Display for CheckpointFrequency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointFrequency::Epochs(epochs) => write!(f, "{epochs}"),
            CheckpointFrequency::Auto => f.write_str(CHECKPOINT_FREQUENCY_AUTO),
        }
    }
}

impl Serialize for CheckpointFrequency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CheckpointFrequency::Epochs(epochs) => serializer.serialize_u32(*epochs),
            CheckpointFrequency::Auto => serializer.serialize_str(CHECKPOINT_FREQUENCY_AUTO),
        }
    }
}

impl<'de> Deserialize<'de> for CheckpointFrequency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Epochs(u32),
            Word(String),
        }
        match Written::deserialize(deserializer)
            .map_err(|_| serde::de::Error::custom(MSG_FREQUENCY_EPOCHS_OR_AUTO))?
        {
            Written::Epochs(epochs) => Ok(CheckpointFrequency::Epochs(epochs)),
            Written::Word(word) if word == CHECKPOINT_FREQUENCY_AUTO => {
                Ok(CheckpointFrequency::Auto)
            }
            // An int-or-string may spell the number as a string, as Kubernetes' own do.
            Written::Word(word) => word
                .parse()
                .map(CheckpointFrequency::Epochs)
                .map_err(|_| serde::de::Error::custom(MSG_FREQUENCY_EPOCHS_OR_AUTO)),
        }
    }
}

impl JsonSchema for CheckpointFrequency {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CheckpointFrequency".into()
    }

    fn inline_schema() -> bool {
        true
    }

    /// An int-or-string, like Kubernetes' IntOrString; the CEL rule on
    /// `checkpoint` admits only a number of epochs or `auto`.
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "x-kubernetes-int-or-string": true })
    }
}

/// Reads `retention` as a policy, or as the earlier whole number N (keep the last N).
fn retention_either_form<'de, D>(deserializer: D) -> Result<Option<RetentionPolicySpec>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum EitherForm {
        KeepLast(u32),
        Policy(RetentionPolicySpec),
    }
    Ok(match Option::<EitherForm>::deserialize(deserializer)? {
        None => None,
        Some(EitherForm::KeepLast(keep_last)) => Some(RetentionPolicySpec {
            keep_last: Some(keep_last),
            ..RetentionPolicySpec::default()
        }),
        Some(EitherForm::Policy(policy)) => Some(policy),
    })
}

/// Checkpoint storage backend and its location.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_S3_NEEDS_BUCKET).message(MSG_S3_NEEDS_BUCKET).field_path(".s3Bucket").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_GCS_NEEDS_BUCKET).message(MSG_GCS_NEEDS_BUCKET).field_path(".gcsBucket").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_PVC_NEEDS_CLAIM).message(MSG_PVC_NEEDS_CLAIM).field_path(".claimName").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_NFS_NEEDS_SERVER).message(MSG_NFS_NEEDS_SERVER).field_path(".nfsServer").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_NFS_NEEDS_PATH).message(MSG_NFS_NEEDS_PATH).field_path(".nfsPath").reason(Reason::FieldValueRequired),
)]
pub struct CheckpointStorage {
    /// Backend: pvc (needs claimName), s3 (needs s3Bucket), gcs (needs gcsBucket) or nfs (needs nfsServer and nfsPath).
    #[serde(rename = "type")]
    pub storage_type: StorageType,

    /// S3 bucket (type s3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 63))]
    pub s3_bucket: Option<String>,

    /// Key prefix inside the S3 bucket. Default: <namespace>/<job name>/.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_REFERENCE_LENGTH))]
    pub s3_prefix: Option<String>,

    /// Endpoint URL of an S3-compatible store (MinIO, Ceph, ...). Default: AWS S3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH))]
    pub s3_endpoint: Option<String>,

    /// GCS bucket (type gcs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 222))]
    pub gcs_bucket: Option<String>,

    /// PersistentVolumeClaim in the job's namespace (type pvc). Use a ReadWriteMany claim for more than one worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_DNS_SUBDOMAIN_LENGTH), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub claim_name: Option<String>,

    /// NFS server host name or IP address (type nfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_DNS_SUBDOMAIN_LENGTH))]
    pub nfs_server: Option<String>,

    /// Exported directory on the NFS server, an absolute path (type nfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH), pattern(ABSOLUTE_PATH_PATTERN))]
    pub nfs_path: Option<String>,

    /// Where the checkpoint volume is mounted in the workers (pvc and nfs), an absolute path. Default /checkpoints. The job sees its own directory of the volume there, <namespace>/<job name>, so jobs and a Sweep's trials naming one claim or export keep their checkpoints apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH), pattern(ABSOLUTE_PATH_PATTERN))]
    pub mount_path: Option<String>,
}

/// Schema pattern of an absolute path.
const ABSOLUTE_PATH_PATTERN: &str = "^/";

/// Mount path of the checkpoint volume when `storage.mountPath` is unset.
pub const DEFAULT_CHECKPOINT_MOUNT_PATH: &str = "/checkpoints";

/// Name of the PersistentVolumeClaim holding a job's checkpoints when its spec
/// names no storage: it lives as long as the TrainingJob, across attempts.
pub fn checkpoint_claim_name(training_job: &str) -> String {
    format!("{training_job}-checkpoints")
}

/// The directory of a TrainingJob's checkpoints on a shared checkpoint
/// volume (`pvc` with `claimName`, `nfs`): `<namespace>/<job>`, the default
/// S3 prefix's shape, so jobs naming one claim or export (a Sweep's trials)
/// keep their checkpoints apart. The kubelet creates it on first mount.
pub fn checkpoint_volume_sub_path(namespace: &str, training_job: &str) -> String {
    format!("{namespace}/{training_job}")
}

/// Scheduling policies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingSpec {
    /// Name of a PriorityClass, e.g. high-priority. Decides order in the queue and who may be preempted. Must be one the queue's podPolicy.allowedPriorityClasses allows (unset: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_DNS_SUBDOMAIN_LENGTH), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub priority: Option<String>,

    /// Name of the TrainingQueue that admits the job. Default "default".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_DNS_SUBDOMAIN_LENGTH), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub queue: Option<String>,

    /// Node labels every worker's node must have, e.g. nvidia.com/gpu.product: A100-SXM4-80GB.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Node and pod affinity of the workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// Taints the workers tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// Node capacity: spot, on-demand or any. Spot jobs resume from their last checkpoint when a node is reclaimed. Default any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<CapacityType>,

    /// NVIDIA MIG profile each GPU slot is carved from, e.g. 1g.10gb or 3g.40gb. Unset means whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), pattern(MIG_PROFILE_PATTERN))]
    pub mig_profile: Option<String>,

    /// Allow the workers onto time-sliced (shared) GPUs. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_time_slicing: Option<bool>,

    /// Expected run time in seconds, at least 1. Helps the scheduler backfill and the cost optimizer choose capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub estimated_runtime_seconds: Option<u64>,

    /// When the job should be finished, RFC 3339, e.g. 2026-12-01T08:00:00Z. With capacityType any, the cost optimizer prefers the capacity type less likely to miss it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
}

/// Monitoring configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Scrape Prometheus metrics from the workers. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Port the workers serve metrics on, 1 to 65535; must differ from networking.masterPort. Default 9090.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_PORT))]
    pub metrics_port: Option<u32>,

    /// Keep TensorBoard logs: the workers get TENSORBOARD_ENABLED and TENSORBOARD_LOG_DIR, a tensorboard directory under the checkpoint directory (so the logs are kept only with checkpointing on); `trainyard tensorboard NAME` opens them. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensorboard_enabled: Option<bool>,

    /// MLflow tracking server URI; runs and metrics are logged there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_REFERENCE_LENGTH))]
    pub mlflow_tracking_uri: Option<String>,

    /// MLflow run the workers log into (their MLFLOW_RUN_ID), 1 to 128 characters. The hpo-tuner sets it on each trial to the run it made for the trial, so mlflow.autolog() does not make a second one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub mlflow_run_id: Option<String>,

    /// Weights & Biases project name. The workers get WANDB_PROJECT, WANDB_RUN_GROUP (the Sweep's name for a trial, else the job's) and WANDB_NAME (<job>-rank-<worker index>), which wandb.init() reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub wandb_project: Option<String>,
}

impl MonitoringSpec {
    /// Whether the job keeps TensorBoard logs (`tensorboardEnabled`, default false).
    pub fn is_tensorboard_enabled(&self) -> bool {
        self.tensorboard_enabled.unwrap_or(false)
    }
}

/// Networking between the workers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkingSpec {
    /// Collective communication backend: nccl, gloo or mpi. Default nccl with GPUs, gloo without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<CommunicationBackend>,

    /// Rendezvous port on worker 0, 1024 to 65535. Default 29500.
    #[serde(
        default = "default_master_port",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = MIN_MASTER_PORT, max = MAX_PORT))]
    pub master_port: Option<u32>,

    /// Use RDMA (InfiniBand / RoCE) between workers; needs RDMA-capable nodes. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_enabled: Option<bool>,
}

fn default_master_port() -> Option<u32> {
    Some(DEFAULT_MASTER_PORT)
}

/// Failure handling.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_NEVER_RESTART_NO_BACKOFF).message(MSG_NEVER_RESTART_NO_BACKOFF).field_path(".backoffLimit").reason(Reason::FieldValueForbidden)
)]
pub struct FailurePolicy {
    /// OnFailure (restart from the latest checkpoint), Never, or ExitCode (restart only for retryable exit codes). Default OnFailure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,

    /// Restarts allowed before the job fails, 0 to 100. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_BACKOFF_LIMIT))]
    pub backoff_limit: Option<u32>,

    /// Seconds the job may run in total, counted from its first start, at least 1; then it fails with reason DeadlineExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<u64>,
}

/// Success criteria.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessPolicy {
    /// Complete the job as soon as the metric reaches this value, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub target_accuracy: Option<f64>,

    /// Complete the job after this many epochs without improvement of the metric, at least 1; must be less than hyperparameters.epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub early_stopping_patience: Option<u32>,

    /// Name of the reported metric that targetAccuracy and earlyStoppingPatience watch. Default accuracy.
    #[serde(
        default = "default_success_metric",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(min = 1, max = 128))]
    pub metric: Option<String>,
}

fn default_success_metric() -> Option<String> {
    Some(DEFAULT_SUCCESS_METRIC.to_owned())
}

/// Condition type that is False (reason `Unschedulable`) while no node the job may use
/// could hold it, even with the cluster empty.
pub const CONDITION_SCHEDULABLE: &str = "Schedulable";

/// Observed state of a TrainingJob, written by the planner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// Lifecycle state: Pending, Queued, Initializing, Running, Suspended, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TrainingJobState>,

    /// Conditions such as Admitted, Running, PodsReady, Succeeded, Failed, Suspended, and Schedulable: False (reason Unschedulable) while no node the job may use could hold it even with the cluster empty, naming the field to change; the job stays queued and is admitted once a node that fits joins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Training progress as a percentage of epochs, e.g. 45%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// Epoch the workers are in (or finished last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_epoch: Option<u32>,

    /// Epochs the job will run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_epochs: Option<u32>,

    /// Latest reported training metrics, e.g. loss: 0.45, accuracy: 0.91.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,

    /// Worker pods by outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkerCounts>,

    /// Latest checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointStatus>,

    /// Resources allocated to the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<AllocatedResources>,

    /// When training first started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the job completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Total run time, e.g. 1h2m3s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,

    /// Why the job failed, e.g. BackoffLimitExceeded or DeadlineExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,

    /// Times the job was restarted (from a checkpoint) after a failure or preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<u32>,

    /// Times in a row the job gave its GPUs back and queued again because an
    /// attempt's pods were not created or not ready in time (the `PodsReady`
    /// condition says why). Not restarts of `failurePolicy.backoffLimit`;
    /// absent once an attempt's workers all run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_ready_requeues: Option<u32>,

    /// While the job waits out a restart or pods-ready backoff: when its next
    /// attempt is created and queues for admission (Kueue's
    /// `requeueState.requeueAt`). The gpu-allocator admits nothing for the job
    /// until then, so its GPUs serve others meanwhile. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_at: Option<Time>,

    /// Money spent and expected, from the cost-optimizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostStatus>,
    /// Where the job waits while it is Queued: its TrainingQueue, its position and why,
    /// from the gpu-allocator's latest decision. Absent once admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,

    /// metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl TrainingJobStatus {
    /// Why no node could hold the job (the `Schedulable: False` condition's message),
    /// while that holds.
    pub fn unschedulable(&self) -> Option<&str> {
        crate::condition::find_condition(&self.conditions, CONDITION_SCHEDULABLE)
            .filter(|c| c.status == crate::condition::ConditionStatus::False)
            .map(|c| c.message.as_deref().unwrap_or_default())
    }
}

/// What a job has cost and is expected to cost.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostStatus {
    /// Spent so far, at the prices in force when the GPUs were used.
    #[serde(default)]
    pub accrued: f64,
    /// Accrued plus the expected cost of the work left, when the runtime is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated: Option<f64>,
    /// Currency of the price catalog, e.g. USD.
    #[serde(default)]
    pub currency: String,
    /// GPU-seconds charged so far (max of requested and used GPUs, over time).
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Capacity type chosen for capacityType any: spot or on-demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<String>,
    /// Why that capacity type, with the expected cost of each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// True when no node of the chosen capacity type can ever hold the job
    /// alone, so the gpu-allocator admitted its current attempt on either type.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub either_capacity_type: bool,
    /// Capacity types (spot, on-demand, reserved) of the nodes the newest
    /// cost record charged the job for: where it runs, or last ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_capacity_types: Vec<String>,
}

/// A waiting job's place in its TrainingQueue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// TrainingQueue the job waits in.
    pub name: String,
    /// 1-based position among the queue's waiting jobs; absent until the gpu-allocator
    /// has ranked the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// Why the job waits, e.g. `quota: flavor a100-spot nvidia.com/gpu: needs 8, queue can
    /// take 0 (nominal 16, in use 16); 8 short`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Worker pods by outcome.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCounts {
    /// Running worker pods.
    #[serde(default)]
    pub active: u32,
    /// Worker pods that finished successfully.
    #[serde(default)]
    pub succeeded: u32,
    /// Worker pods that failed.
    #[serde(default)]
    pub failed: u32,
}

/// Latest checkpoint of a job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStatus {
    /// Path or URI of the latest checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_path: Option<String>,
    /// Epoch the latest checkpoint was taken at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_epoch: Option<u32>,
    /// When the latest checkpoint was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_time: Option<Time>,
    /// Checkpoints currently kept.
    #[serde(default)]
    pub count: u32,
    /// Newest checkpoint verified complete: where the next attempt resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_verified_path: Option<String>,
    /// Step of the newest verified checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_verified_step: Option<u64>,
    /// Best verified checkpoint by retention.keepBest's metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_path: Option<String>,
    /// Value of that metric at the best checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_metric_value: Option<f64>,
    /// Why the current attempt resumes where it does, e.g. "Restarting: resumed from step 1200 (trainyard-manifest); skipped 1 incomplete newer checkpoint".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_reason: Option<String>,
    /// Recommended seconds between saves (Young/Daly), followed when frequency is auto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advised_interval_seconds: Option<f64>,
    /// Registered model the best checkpoint became, in the MLflow model registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
    /// Version of that registered model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
}

/// Resources allocated to a job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedResources {
    /// GPUs (or MIG slices) allocated across all workers.
    #[serde(default)]
    pub gpus: u32,
    /// Nodes the workers were placed on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// TrainingQueue flavor the GPUs were admitted from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor: Option<String>,
    /// TrainingQueue that admitted the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

impl TrainingJobSpec {
    /// Decodes a spec from JSON (e.g. a NATS submission) and validates it.
    ///
    /// Decode failures (unknown enum values, missing required fields, wrong types) and
    /// rule violations both come back as field errors rooted at `spec`.
    pub fn from_json(value: serde_json::Value) -> Result<Self, Vec<FieldError>> {
        let spec: Self = decode_at(value, "spec")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every schema and CEL rule of the CRD, so specs that never pass the
    /// apiserver get the same answer kubectl would give.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        self.field_errors("spec").into_result()
    }

    /// Collects validation errors with paths rooted at `root` (a Sweep's trial template
    /// lives at `spec.trialTemplate`).
    pub(crate) fn field_errors(&self, root: &str) -> FieldErrors {
        let mut errors = FieldErrors::default();
        errors.length(&format!("{root}.model"), &self.model, 1, MAX_MODEL_LENGTH);
        errors.length(
            &format!("{root}.dataset"),
            &self.dataset,
            1,
            MAX_DATASET_LENGTH,
        );
        errors.in_range(
            &format!("{root}.numWorkers"),
            self.num_workers,
            MIN_WORKERS,
            MAX_WORKERS,
        );
        if let Some(gpus) = self.gpus_per_worker {
            errors.in_range(
                &format!("{root}.gpusPerWorker"),
                gpus,
                0,
                MAX_GPUS_PER_WORKER,
            );
        }
        if let Some(image) = &self.image {
            errors.length(&format!("{root}.image"), image, 1, MAX_REFERENCE_LENGTH);
        }
        if let Some(hyperparameters) = &self.hyperparameters {
            hyperparameters.check(&format!("{root}.hyperparameters"), &mut errors);
        }
        if let Some(checkpoint) = &self.checkpoint {
            checkpoint.check(&format!("{root}.checkpoint"), &mut errors);
        }
        if let Some(scheduling) = &self.scheduling {
            scheduling.check(&format!("{root}.scheduling"), &mut errors);
        }
        if let Some(monitoring) = &self.monitoring {
            monitoring.check(&format!("{root}.monitoring"), &mut errors);
        }
        if let Some(networking) = &self.networking
            && let Some(port) = networking.master_port
        {
            errors.in_range(
                &format!("{root}.networking.masterPort"),
                port,
                MIN_MASTER_PORT,
                MAX_PORT,
            );
        }
        if let Some(failure_policy) = &self.failure_policy {
            failure_policy.check(&format!("{root}.failurePolicy"), &mut errors);
        }
        if let Some(success_policy) = &self.success_policy {
            success_policy.check(&format!("{root}.successPolicy"), &mut errors);
        }
        self.check_cross_field_rules(root, &mut errors);
        errors
    }

    /// Mirrors the CEL rules on the spec itself (`RULE_*` above).
    fn check_cross_field_rules(&self, root: &str, errors: &mut FieldErrors) {
        let explicit_gpus = self.gpus_per_worker;
        let has_mig_profile = self
            .scheduling
            .as_ref()
            .is_some_and(|s| s.mig_profile.is_some());
        if has_mig_profile && explicit_gpus.is_some_and(|gpus| gpus < 1) {
            errors.invalid(format!("{root}.scheduling.migProfile"), MSG_MIG_NEEDS_GPUS);
        }
        let backend = self.networking.as_ref().and_then(|n| n.backend);
        if backend == Some(CommunicationBackend::Nccl) && explicit_gpus.is_some_and(|gpus| gpus < 1)
        {
            errors.invalid(format!("{root}.networking.backend"), MSG_NCCL_NEEDS_GPUS);
        }
        if let Some(metrics_port) = self.monitoring.as_ref().and_then(|m| m.metrics_port)
            && metrics_port == self.master_port()
        {
            errors.invalid(
                format!("{root}.monitoring.metricsPort"),
                MSG_METRICS_PORT_FREE,
            );
        }
        if self
            .volumes
            .iter()
            .any(|v| RESERVED_VOLUME_NAMES.contains(&v.name.as_str()))
        {
            errors.invalid(format!("{root}.volumes"), MSG_VOLUME_NAMES_FREE);
        }
        if self.volumes.len() > MAX_POD_VOLUMES {
            errors.invalid(
                format!("{root}.volumes"),
                format!(
                    "at most {MAX_POD_VOLUMES} volumes, got {}",
                    self.volumes.len()
                ),
            );
        }
        if self.volume_mounts.len() > MAX_POD_VOLUMES {
            errors.invalid(
                format!("{root}.volumeMounts"),
                format!(
                    "at most {MAX_POD_VOLUMES} volume mounts, got {}",
                    self.volume_mounts.len()
                ),
            );
        }
        if self
            .volume_mounts
            .iter()
            .any(|m| !self.volumes.iter().any(|v| v.name == m.name))
        {
            errors.invalid(format!("{root}.volumeMounts"), MSG_MOUNTS_NAME_VOLUMES);
        }
        if let Some(account) = &self.service_account_name {
            errors.length(&format!("{root}.serviceAccountName"), account, 1, 253);
        }
        let explicit_epochs = self.hyperparameters.as_ref().and_then(|h| h.epochs);
        let patience = self
            .success_policy
            .as_ref()
            .and_then(|s| s.early_stopping_patience);
        if let (Some(patience), Some(epochs)) = (patience, explicit_epochs)
            && patience >= epochs
        {
            errors.invalid(
                format!("{root}.successPolicy.earlyStoppingPatience"),
                MSG_PATIENCE_BELOW_EPOCHS,
            );
        }
        if let Some(checkpoint) = &self.checkpoint
            && let (Some(true), Some(CheckpointFrequency::Epochs(frequency)), Some(epochs)) =
                (checkpoint.enabled, checkpoint.frequency, explicit_epochs)
            && frequency > epochs
        {
            errors.invalid(
                format!("{root}.checkpoint.frequency"),
                MSG_CHECKPOINT_WITHIN_EPOCHS,
            );
        }
    }

    /// Framework, defaulting to pytorch.
    pub fn framework(&self) -> Framework {
        self.framework.unwrap_or(DEFAULT_FRAMEWORK)
    }

    /// GPUs (or MIG slices) per worker, defaulting to 1.
    pub fn gpus_per_worker(&self) -> u32 {
        self.gpus_per_worker.unwrap_or(DEFAULT_GPUS_PER_WORKER)
    }

    /// GPUs (or MIG slices) across all workers: the amount the queue must admit at once.
    pub fn total_gpus(&self) -> u32 {
        self.num_workers.saturating_mul(self.gpus_per_worker())
    }

    /// Epochs to train, defaulting to 10.
    pub fn epochs(&self) -> u32 {
        self.hyperparameters
            .as_ref()
            .and_then(|h| h.epochs)
            .unwrap_or(DEFAULT_EPOCHS)
    }

    /// True when the job is suspended.
    pub fn is_suspended(&self) -> bool {
        self.suspend.unwrap_or(false)
    }

    /// TrainingQueue that admits the job, defaulting to "default".
    pub fn queue_name(&self) -> &str {
        self.scheduling
            .as_ref()
            .and_then(|s| s.queue.as_deref())
            .unwrap_or(DEFAULT_QUEUE)
    }

    /// PriorityClass name, if any.
    pub fn priority_class(&self) -> Option<&str> {
        self.scheduling.as_ref().and_then(|s| s.priority.as_deref())
    }

    /// Capacity type, defaulting to any.
    pub fn capacity_type(&self) -> CapacityType {
        self.scheduling
            .as_ref()
            .and_then(|s| s.capacity_type)
            .unwrap_or(CapacityType::Any)
    }

    /// Communication backend: the explicit one, else nccl with GPUs and gloo without.
    pub fn communication_backend(&self) -> CommunicationBackend {
        match self.networking.as_ref().and_then(|n| n.backend) {
            Some(backend) => backend,
            None if self.gpus_per_worker() > 0 => CommunicationBackend::Nccl,
            None => CommunicationBackend::Gloo,
        }
    }

    /// Rendezvous port, defaulting to 29500.
    pub fn master_port(&self) -> u32 {
        self.networking
            .as_ref()
            .and_then(|n| n.master_port)
            .unwrap_or(DEFAULT_MASTER_PORT)
    }

    /// Metrics port, defaulting to 9090.
    pub fn metrics_port(&self) -> u32 {
        self.monitoring
            .as_ref()
            .and_then(|m| m.metrics_port)
            .unwrap_or(DEFAULT_METRICS_PORT)
    }

    /// True when checkpoints are written.
    pub fn checkpointing_enabled(&self) -> bool {
        self.checkpoint
            .as_ref()
            .and_then(|c| c.enabled)
            .unwrap_or(false)
    }

    /// Where the checkpoint volume keeps this job's checkpoints (the
    /// directory its workers see at the mount path), as an address a model
    /// registry or a model server can name: `pvc://<claim>/<directory>`
    /// (KServe's form, the claim in the job's namespace) or
    /// `nfs://<server><export>/<directory>`. None without checkpointing and
    /// for object storage, whose URIs already are such addresses.
    pub fn checkpoint_volume_location(&self, namespace: &str, name: &str) -> Option<String> {
        if !self.checkpointing_enabled() {
            return None;
        }
        let storage = self.checkpoint.as_ref().and_then(|c| c.storage.as_ref());
        let Some(storage) = storage else {
            return Some(format!("pvc://{}", checkpoint_claim_name(name)));
        };
        let directory = checkpoint_volume_sub_path(namespace, name);
        match storage.storage_type {
            StorageType::Pvc => Some(format!(
                "pvc://{}/{directory}",
                storage.claim_name.as_deref().unwrap_or_default()
            )),
            StorageType::Nfs => {
                let server = storage.nfs_server.as_deref().unwrap_or_default();
                let export = storage.nfs_path.as_deref().unwrap_or_default();
                let export = export.trim_matches('/');
                Some(if export.is_empty() {
                    format!("nfs://{server}/{directory}")
                } else {
                    format!("nfs://{server}/{export}/{directory}")
                })
            }
            StorageType::S3 | StorageType::Gcs => None,
        }
    }

    /// `checkpoint.frequency`, defaulting to every epoch.
    pub fn checkpoint_frequency(&self) -> CheckpointFrequency {
        self.checkpoint
            .as_ref()
            .and_then(|c| c.frequency)
            .unwrap_or(CheckpointFrequency::Epochs(DEFAULT_CHECKPOINT_FREQUENCY))
    }

    /// Checkpoint interval in epochs: the frequency, or every epoch with
    /// `auto` (its cadence until the first advice, and the most it can save).
    pub fn checkpoint_every_epochs(&self) -> u32 {
        match self.checkpoint_frequency() {
            CheckpointFrequency::Epochs(epochs) => epochs,
            CheckpointFrequency::Auto => DEFAULT_CHECKPOINT_FREQUENCY,
        }
    }

    /// Restart policy, defaulting to OnFailure.
    pub fn restart_policy(&self) -> RestartPolicy {
        self.failure_policy
            .as_ref()
            .and_then(|f| f.restart_policy)
            .unwrap_or(RestartPolicy::OnFailure)
    }

    /// Restarts allowed: 0 with restartPolicy Never, else backoffLimit defaulting to 3.
    pub fn backoff_limit(&self) -> u32 {
        if self.restart_policy() == RestartPolicy::Never {
            return 0;
        }
        self.failure_policy
            .as_ref()
            .and_then(|f| f.backoff_limit)
            .unwrap_or(DEFAULT_BACKOFF_LIMIT)
    }

    /// Metric the success policy watches, defaulting to accuracy.
    pub fn success_metric(&self) -> &str {
        self.success_policy
            .as_ref()
            .and_then(|s| s.metric.as_deref())
            .unwrap_or(DEFAULT_SUCCESS_METRIC)
    }
}

impl Hyperparameters {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(learning_rate) = self.learning_rate {
            // NaN compares as None: JSON cannot carry it, but Rust callers can.
            if learning_rate.partial_cmp(&0.0) != Some(Ordering::Greater) {
                errors.invalid(
                    format!("{path}.learningRate"),
                    format!("must be greater than 0, got {learning_rate}"),
                );
            }
        }
        if let Some(batch_size) = self.batch_size {
            errors.at_least(&format!("{path}.batchSize"), batch_size, 1);
        }
        if let Some(epochs) = self.epochs {
            errors.at_least(&format!("{path}.epochs"), epochs, 1);
        }
        if let Some(steps) = self.gradient_accumulation_steps {
            errors.at_least(&format!("{path}.gradientAccumulationSteps"), steps, 1);
        }
    }
}

impl CheckpointSpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(CheckpointFrequency::Epochs(0)) = self.frequency {
            errors.invalid(format!("{path}.frequency"), MSG_FREQUENCY_EPOCHS_OR_AUTO);
        }
        if let Some(retention) = &self.retention {
            retention.check(&format!("{path}.retention"), errors);
        }
        if let Some(resume_from) = &self.resume_from {
            errors.length(
                &format!("{path}.resumeFrom"),
                resume_from,
                1,
                MAX_REFERENCE_LENGTH,
            );
            if self.enabled != Some(true) {
                errors.invalid(format!("{path}.resumeFrom"), MSG_RESUME_NEEDS_CHECKPOINTING);
            }
        }
        if let Some(storage) = &self.storage {
            storage.check(&format!("{path}.storage"), errors);
        }
    }
}

impl RetentionPolicySpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        let keeps_something = self.keep_last.is_some_and(|n| n > 0)
            || self.keep_best.is_some()
            || self.keep_every_n_steps.is_some()
            || !self.pinned_steps.is_empty();
        if !keeps_something {
            errors.invalid(format!("{path}.keepLast"), MSG_RETENTION_KEEPS_SOMETHING);
        }
        if let Some(every) = self.keep_every_n_steps {
            errors.at_least(&format!("{path}.keepEveryNSteps"), every, 1);
        }
        if let Some(best) = &self.keep_best {
            errors.length(&format!("{path}.keepBest.metric"), &best.metric, 1, 256);
            if let Some(count) = best.count {
                errors.at_least(&format!("{path}.keepBest.count"), count, 1);
            }
        }
    }
}

impl CheckpointStorage {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(bucket) = &self.s3_bucket {
            errors.length(&format!("{path}.s3Bucket"), bucket, 3, 63);
        }
        if let Some(prefix) = &self.s3_prefix {
            errors.length(&format!("{path}.s3Prefix"), prefix, 0, MAX_REFERENCE_LENGTH);
        }
        if let Some(endpoint) = &self.s3_endpoint {
            errors.length(
                &format!("{path}.s3Endpoint"),
                endpoint,
                1,
                MAX_REFERENCE_LENGTH,
            );
        }
        if let Some(bucket) = &self.gcs_bucket {
            errors.length(&format!("{path}.gcsBucket"), bucket, 3, 222);
        }
        if let Some(claim) = &self.claim_name {
            errors.dns_subdomain(&format!("{path}.claimName"), claim);
        }
        if let Some(server) = &self.nfs_server {
            errors.length(
                &format!("{path}.nfsServer"),
                server,
                1,
                MAX_DNS_SUBDOMAIN_LENGTH,
            );
        }
        for (field, value) in [("nfsPath", &self.nfs_path), ("mountPath", &self.mount_path)] {
            if let Some(value) = value {
                errors.length(&format!("{path}.{field}"), value, 1, MAX_REFERENCE_LENGTH);
                if !value.starts_with('/') {
                    errors.invalid(
                        format!("{path}.{field}"),
                        format!("must be an absolute path, got {value:?}"),
                    );
                }
            }
        }
        let (field, missing, message) = match self.storage_type {
            StorageType::S3 => ("s3Bucket", self.s3_bucket.is_none(), MSG_S3_NEEDS_BUCKET),
            StorageType::Gcs => ("gcsBucket", self.gcs_bucket.is_none(), MSG_GCS_NEEDS_BUCKET),
            StorageType::Pvc => ("claimName", self.claim_name.is_none(), MSG_PVC_NEEDS_CLAIM),
            StorageType::Nfs => ("nfsServer", self.nfs_server.is_none(), MSG_NFS_NEEDS_SERVER),
        };
        if missing {
            errors.required(format!("{path}.{field}"), message);
        }
        if self.storage_type == StorageType::Nfs && self.nfs_path.is_none() {
            errors.required(format!("{path}.nfsPath"), MSG_NFS_NEEDS_PATH);
        }
    }

    /// Mount path of the checkpoint volume, defaulting to /checkpoints.
    pub fn mount_path(&self) -> &str {
        self.mount_path
            .as_deref()
            .unwrap_or(DEFAULT_CHECKPOINT_MOUNT_PATH)
    }
}

impl SchedulingSpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(priority) = &self.priority {
            errors.dns_subdomain(&format!("{path}.priority"), priority);
        }
        if let Some(queue) = &self.queue {
            errors.dns_subdomain(&format!("{path}.queue"), queue);
        }
        if let Some(profile) = &self.mig_profile
            && !is_mig_profile(profile)
        {
            errors.invalid(
                    format!("{path}.migProfile"),
                    format!("{profile:?} is not a MIG profile: use <compute slices>g.<memory>gb, e.g. 1g.10gb or 3g.40gb"),
                );
        }
        if let Some(seconds) = self.estimated_runtime_seconds {
            errors.at_least(&format!("{path}.estimatedRuntimeSeconds"), seconds, 1);
        }
    }
}

impl MonitoringSpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(port) = self.metrics_port {
            errors.in_range(&format!("{path}.metricsPort"), port, 1, MAX_PORT);
        }
        if let Some(uri) = &self.mlflow_tracking_uri {
            errors.length(
                &format!("{path}.mlflowTrackingUri"),
                uri,
                1,
                MAX_REFERENCE_LENGTH,
            );
        }
        if let Some(run) = &self.mlflow_run_id {
            errors.length(&format!("{path}.mlflowRunId"), run, 1, 128);
        }
        if let Some(project) = &self.wandb_project {
            errors.length(&format!("{path}.wandbProject"), project, 1, 128);
        }
    }
}

impl FailurePolicy {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(limit) = self.backoff_limit {
            errors.in_range(&format!("{path}.backoffLimit"), limit, 0, MAX_BACKOFF_LIMIT);
            if self.restart_policy == Some(RestartPolicy::Never) && limit > 0 {
                errors.forbidden(format!("{path}.backoffLimit"), MSG_NEVER_RESTART_NO_BACKOFF);
            }
        }
        if let Some(seconds) = self.active_deadline_seconds {
            errors.at_least(&format!("{path}.activeDeadlineSeconds"), seconds, 1);
        }
    }
}

impl SuccessPolicy {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(target) = self.target_accuracy {
            // Written as a negated range check so NaN is rejected too.
            if !(0.0..=1.0).contains(&target) {
                errors.invalid(
                    format!("{path}.targetAccuracy"),
                    format!("must be between 0 and 1, got {target}"),
                );
            }
        }
        if let Some(patience) = self.early_stopping_patience {
            errors.at_least(&format!("{path}.earlyStoppingPatience"), patience, 1);
        }
        if let Some(metric) = &self.metric {
            errors.length(&format!("{path}.metric"), metric, 1, 128);
        }
    }
}

/// True for an NVIDIA MIG profile name such as `1g.10gb`, `3g.40gb` or `1g.10gb+me`
/// (same language as [`MIG_PROFILE_PATTERN`]).
pub fn is_mig_profile(profile: &str) -> bool {
    let profile = profile.strip_suffix("+me").unwrap_or(profile);
    let Some((compute, memory)) = profile.split_once('.') else {
        return false;
    };
    let compute_ok = matches!(compute.as_bytes(), [slices, b'g'] if (b'1'..=b'7').contains(slices));
    let memory_ok = memory.strip_suffix("gb").is_some_and(|size| {
        // A leading digit other than 0 also rules out the empty size.
        size.as_bytes().first().is_some_and(|first| *first != b'0')
            && size.bytes().all(|b| b.is_ascii_digit())
    });
    profile.len() <= 32 && compute_ok && memory_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensorboard_is_kept_only_when_asked_for() {
        assert!(!MonitoringSpec::default().is_tensorboard_enabled());
        for (asked, kept) in [(Some(false), false), (Some(true), true)] {
            let spec = MonitoringSpec {
                tensorboard_enabled: asked,
                ..MonitoringSpec::default()
            };
            assert_eq!(spec.is_tensorboard_enabled(), kept);
        }
    }

    #[test]
    fn a_checkpoint_volume_is_located_by_its_claim_or_export_and_the_jobs_directory() {
        let spec = |checkpoint: serde_json::Value| -> TrainingJobSpec {
            serde_json::from_value(serde_json::json!({
                "model": "bert", "dataset": "wiki", "numWorkers": 1, "gpusPerWorker": 1,
                "checkpoint": checkpoint
            }))
            .expect("a spec")
        };
        let located = |checkpoint| spec(checkpoint).checkpoint_volume_location("ml", "bert-ft");
        assert_eq!(
            located(serde_json::json!({"enabled": true})).as_deref(),
            Some("pvc://bert-ft-checkpoints")
        );
        assert_eq!(
            located(serde_json::json!({"enabled": true, "storage": {"type": "pvc", "claimName": "shared"}})).as_deref(),
            Some("pvc://shared/ml/bert-ft")
        );
        assert_eq!(
            located(serde_json::json!({"enabled": true, "storage": {"type": "nfs", "nfsServer": "10.0.0.5", "nfsPath": "/exports/ckpt/"}})).as_deref(),
            Some("nfs://10.0.0.5/exports/ckpt/ml/bert-ft")
        );
        assert_eq!(
            located(serde_json::json!({"enabled": true, "storage": {"type": "nfs", "nfsServer": "nas", "nfsPath": "/"}})).as_deref(),
            Some("nfs://nas/ml/bert-ft")
        );
        assert_eq!(
            located(
                serde_json::json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": "b"}})
            ),
            None
        );
        assert_eq!(located(serde_json::json!({"enabled": false})), None);
    }

    #[test]
    fn mig_profiles() {
        for good in ["1g.10gb", "3g.40gb", "7g.80gb", "1g.10gb+me", "2g.20gb"] {
            assert!(is_mig_profile(good), "{good}");
        }
        for bad in [
            "0g.10gb",
            "8g.10gb",
            "1g.0gb",
            "1g.gb",
            "1g10gb",
            "1g.10GB",
            "a100",
            "",
            "1g.10gb+mx",
        ] {
            assert!(!is_mig_profile(bad), "{bad}");
        }
    }

    #[test]
    fn metrics_port_rule_uses_the_default_master_port() {
        assert!(RULE_METRICS_PORT_FREE.contains(&DEFAULT_MASTER_PORT.to_string()));
        assert!(MSG_METRICS_PORT_FREE.contains(&DEFAULT_MASTER_PORT.to_string()));
    }

    #[test]
    fn defaults_apply_when_fields_are_unset() {
        let spec = TrainingJobSpec {
            model: "cnn".into(),
            dataset: "mnist".into(),
            num_workers: 4,
            ..TrainingJobSpec::default()
        };
        assert_eq!(spec.framework(), Framework::Pytorch);
        assert_eq!(spec.gpus_per_worker(), 1);
        assert_eq!(spec.total_gpus(), 4);
        assert_eq!(spec.epochs(), DEFAULT_EPOCHS);
        assert_eq!(spec.queue_name(), "default");
        assert_eq!(spec.communication_backend(), CommunicationBackend::Nccl);
        assert_eq!(spec.master_port(), 29500);
        assert_eq!(spec.backoff_limit(), DEFAULT_BACKOFF_LIMIT);
        assert_eq!(spec.success_metric(), "accuracy");
        assert!(!spec.is_suspended());
        assert!(spec.validate().is_ok());
    }

    #[test]
    fn cpu_jobs_default_to_gloo_and_never_restarts_zero_times() {
        let spec = TrainingJobSpec {
            model: "cnn".into(),
            dataset: "mnist".into(),
            num_workers: 2,
            gpus_per_worker: Some(0),
            failure_policy: Some(FailurePolicy {
                restart_policy: Some(RestartPolicy::Never),
                ..FailurePolicy::default()
            }),
            ..TrainingJobSpec::default()
        };
        assert_eq!(spec.communication_backend(), CommunicationBackend::Gloo);
        assert_eq!(spec.total_gpus(), 0);
        assert_eq!(spec.backoff_limit(), 0);
    }

    #[test]
    fn volume_mounts_must_name_a_user_volume_that_is_not_trainyards() {
        let volume = |name: &str| Volume {
            name: name.into(),
            ..Volume::default()
        };
        let mount = |name: &str| VolumeMount {
            name: name.into(),
            mount_path: "/data".into(),
            ..VolumeMount::default()
        };
        let spec = |volumes: Vec<Volume>, volume_mounts: Vec<VolumeMount>| TrainingJobSpec {
            model: "m".into(),
            dataset: "d".into(),
            num_workers: 1,
            volumes,
            volume_mounts,
            ..TrainingJobSpec::default()
        };
        assert!(
            spec(vec![volume("data")], vec![mount("data")])
                .validate()
                .is_ok()
        );
        let paths = |spec: TrainingJobSpec| -> Vec<String> {
            spec.validate()
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        assert_eq!(
            paths(spec(vec![], vec![mount("data")])),
            ["spec.volumeMounts"]
        );
        assert_eq!(
            paths(spec(vec![volume("checkpoints")], vec![])),
            ["spec.volumes"]
        );
        // The CEL rules say the same as the Rust checks.
        for name in RESERVED_VOLUME_NAMES {
            assert!(RULE_VOLUME_NAMES_FREE.contains(&format!("'{name}'")));
            assert!(MSG_VOLUME_NAMES_FREE.contains(name));
        }
    }
}
