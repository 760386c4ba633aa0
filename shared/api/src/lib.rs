//! Kubernetes API of Trainyard: the `TrainingJob`, `Sweep` and `TrainingQueue` kinds
//! in group `trainyard.dev`, version `v1`.
//!
//! These Rust types are the source of truth. The CRD YAML under `crds/` is generated
//! from them (`cargo run -p trainyard-api --bin crdgen`) and a test fails when it drifts.
//! Validation lives in three places that must agree: the schema (ranges, enums,
//! patterns), CEL rules in the schema (cross-field rules), and each spec's `validate()`
//! which repeats both in Rust for specs that never pass the apiserver (NATS submissions).

mod wire_enum;

pub mod condition;
pub mod crdgen;
pub mod placement;
pub mod pod_policy;
pub mod quantity;
pub mod queue;
pub mod sweep;
pub mod trainingjob;
pub mod validation;

pub use condition::{Condition, ConditionStatus, find_condition, set_condition};
pub use crdgen::{CRDGEN_COMMAND, CrdFile, all_crds, generate_crd_files};
pub use pod_policy::{PodPolicy, PodRequest, PodRequestKind, pod_requests};
pub use queue::{
    BudgetAction, BudgetPeriod, BudgetStatus, DEFAULT_AGING_STEP, DEFAULT_BUDGET_THRESHOLDS,
    DEFAULT_IDLE_RESUME_PERCENT, DEFAULT_IDLE_SUSPEND_AFTER_SECONDS,
    DEFAULT_IDLE_THRESHOLD_PERCENT, DEFAULT_IDLE_WINDOW_SECONDS, FairShare, FairSharingStatus,
    FlavorQuota, FlavorUsage, IdleAction, IdlePolicy, MigQuota, MigUsage, PreemptionPolicy,
    QUEUE_ACTIVE, QueueBudget, QueuePriorityPolicy, ReclaimWithinCohort, StopPolicy, TrainingQueue,
    TrainingQueueSpec, TrainingQueueStatus, WithinQueuePreemption,
};
pub use sweep::{
    AlgorithmName, BestTrial, EarlyStoppingAlgorithm, EarlyStoppingSpec, Objective,
    ObjectiveDirection, ParameterSpec, ParameterType, ResolvedTpeSettings, RungStatus,
    SearchAlgorithm, Sweep, SweepSpec, SweepState, SweepStatus, TpeSettings, TrialCounts,
};
pub use trainingjob::{
    AllocatedResources, CHECKPOINT_FREQUENCY_AUTO, CONDITION_SCHEDULABLE, CapacityType,
    CheckpointFrequency, CheckpointSpec, CheckpointStatus, CheckpointStorage, CommunicationBackend,
    CostStatus, FailurePolicy, Framework, Hyperparameters, KeepBestSpec, MetricMode,
    MonitoringSpec, NetworkingSpec, Optimizer, QueueStatus, RestartPolicy, RetentionPolicySpec,
    SchedulingSpec, StorageType, SuccessPolicy, TrainingJob, TrainingJobSpec, TrainingJobState,
    TrainingJobStatus, WorkerCounts,
};
pub use validation::{FieldError, FieldErrorKind, format_field_errors};

/// API group of every Trainyard kind.
pub const API_GROUP: &str = "trainyard.dev";
/// API version of every Trainyard kind.
pub const API_VERSION: &str = "v1";
/// `apiVersion` value of Trainyard objects.
pub const API_GROUP_VERSION: &str = "trainyard.dev/v1";

/// Annotation on a TrainingJob or Sweep naming extra notification destinations,
/// comma-separated: `slack:#team-a`, `webhook:ci`. The notifier sends only to
/// destinations its operator allowed.
pub const ANNOTATION_NOTIFY: &str = "trainyard.dev/notify";
/// Annotation restricting which events the `trainyard.dev/notify` destinations
/// hear, comma-separated event types (e.g. `job.failed,job.completed`).
pub const ANNOTATION_NOTIFY_ON: &str = "trainyard.dev/notify-on";
/// Prefix every notification annotation starts with; the planner forwards these to the notifier.
pub const ANNOTATION_NOTIFY_PREFIX: &str = "trainyard.dev/notify";
/// Annotation holding the job's experiment-tracking run URL (e.g. its MLflow run).
pub const ANNOTATION_RUN_URL: &str = "trainyard.dev/run-url";
/// Annotation on a TrainingJob or a Sweep naming the registered model its best
/// checkpoint becomes a version of when it completes (a Sweep: its best
/// trial's, when it finishes); the checkpoint-manager's `model_name_template`
/// otherwise.
pub const ANNOTATION_MODEL_NAME: &str = "trainyard.dev/model-name";
