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
pub mod quantity;
pub mod queue;
pub mod sweep;
pub mod trainingjob;
pub mod validation;

pub use condition::{Condition, ConditionStatus, find_condition, set_condition};
pub use crdgen::{CRDGEN_COMMAND, CrdFile, all_crds, generate_crd_files};
pub use queue::{
    DEFAULT_AGING_STEP, FairShare, FairSharingStatus, FlavorQuota, FlavorUsage, MigQuota, MigUsage,
    PreemptionPolicy, QUEUE_ACTIVE, QueuePriorityPolicy, ReclaimWithinCohort, StopPolicy,
    TrainingQueue, TrainingQueueSpec, TrainingQueueStatus, WithinQueuePreemption,
};
pub use sweep::{
    AlgorithmName, BestTrial, EarlyStoppingAlgorithm, EarlyStoppingSpec, Objective,
    ObjectiveDirection, ParameterSpec, ParameterType, ResolvedTpeSettings, RungStatus,
    SearchAlgorithm, Sweep, SweepSpec, SweepState, SweepStatus, TpeSettings, TrialCounts,
};
pub use trainingjob::{
    AllocatedResources, CapacityType, CheckpointSpec, CheckpointStatus, CheckpointStorage,
    CommunicationBackend, FailurePolicy, Framework, Hyperparameters, MonitoringSpec,
    NetworkingSpec, Optimizer, QueueStatus, RestartPolicy, SchedulingSpec, StorageType,
    SuccessPolicy, TrainingJob, TrainingJobSpec, TrainingJobState, TrainingJobStatus, WorkerCounts,
};
pub use validation::{FieldError, FieldErrorKind, format_field_errors};

/// API group of every Trainyard kind.
pub const API_GROUP: &str = "trainyard.dev";
/// API version of every Trainyard kind.
pub const API_VERSION: &str = "v1";
/// `apiVersion` value of Trainyard objects.
pub const API_GROUP_VERSION: &str = "trainyard.dev/v1";
