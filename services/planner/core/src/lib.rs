//! The planner's pure decision core.
//!
//! Inputs in, desired objects and decisions out: no I/O, no async, no Kubernetes or
//! NATS client. The planner service folds every message about a TrainingJob into a
//! [`PlannerJobState`] with [`observe`], asks [`decide`] what to do, and carries out
//! the returned [`PlannerAction`]s — server-side apply of the [`DesiredObjects`] built
//! by [`desired_objects`], Job deletions, status writes, events, lifecycle messages and
//! commands to the workers.
//!
//! Replaying the same messages gives the same state and the same actions: object names
//! are derived from the TrainingJob and the attempt number, never generated, so a
//! replay re-applies the same objects and never creates a second Job.
//!
//! See the crate's README for the state machine and the failure policy.

pub mod callout;
mod checkpoints;
mod config;
mod context;
mod cost;
mod decide;
mod env;
mod error;
mod failure;
mod names;
mod objects;
mod preflight;
mod queue_status;
mod resources;
mod state;
mod status;
mod submission;
mod sweep;
mod worker_token;

pub use checkpoints::{
    EVENT_CHECKPOINT_INCOMPLETE, EVENT_CHECKPOINT_SKIPPED, EVENT_MODEL_REGISTERED,
    EVENT_MODEL_REGISTRATION_FAILED, EVENT_MODEL_REGISTRY_REDIRECTED, checkpoint_events,
    resume_reason,
};
pub use config::{FrameworkImages, PlannerConfig};
pub use cost::{CostSeen, IdleSuspendSeen, budget_lift_hint, budget_status, cost_status};
pub use decide::idle::{
    REASON_IDLE_CHECKPOINTING, REASON_IDLE_SUSPEND_SKIPPED, REASON_IDLE_SUSPENDED,
    REASON_IDLE_SUSPENDING,
};
pub use decide::{
    CONDITION_ADMITTED, CONDITION_FAILED, CONDITION_PODS_READY, CONDITION_PREEMPTED,
    CONDITION_RUNNING, CONDITION_SCHEDULABLE, CONDITION_SUCCEEDED, CONDITION_SUSPENDED, EventType,
    PlannerAction, PlannerCommand, REASON_POD_POLICY_REFUSED, REASON_PODS_NOT_CREATED,
    REASON_PODS_NOT_READY, REASON_UNSCHEDULABLE, decide,
};
pub use env::{
    CHECKPOINT_INTERVAL_KEY, CONFIG_MOUNT_PATH, HYPERPARAMETERS_FILE, NATS_CA_FILE,
    RESUME_FROM_KEY, TRAINING_CONFIG_FILE, WORKER_INDEX_ENV, additional_param_env_name,
    checkpoint_dir, tensorboard_log_dir,
};
pub use error::{CredentialError, PlanError};
pub use failure::{FailureCause, WorkerFailure, classify_pod};
pub use names::{
    COMPLETION_INDEX_ANNOTATION, LABEL_ATTEMPT, LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE,
    LABEL_TRAINING_JOB, MANAGED_BY, PLACEMENT_GATE, Role, checkpoint_claim_name, config_map_name,
    job_name, service_name, worker_host,
};
pub use objects::{
    DesiredObjects, JobPlan, METRICS_PORT_NAME, RENDEZVOUS_PORT_NAME, WORKER_CONTAINER,
    desired_objects,
};
pub use preflight::{checkpoint_location_problem, preflight};
pub use queue_status::queue_status;
pub use resources::{GPU_RESOURCE, MIG_RESOURCE_PREFIX, gpu_resource_name};
pub use state::{
    AttemptRecord, BestMetric, CheckpointSeen, EpochMetrics, MAX_EPOCH_METRICS, Observation,
    Observed, PlannerJobState, PreemptionSeen, ProgressSeen, TrialStopSeen, observe,
};
pub use status::{MetricGoal, changes_state_or_conditions, format_duration};
pub use submission::{
    Accepted, LABEL_SUBMITTED, Rejection, check_overwrite, check_pod_policy, check_submission,
};
pub use sweep::{WELL_KNOWN_HYPERPARAMETERS, sweep_status, trial_spec};
pub use worker_token::{
    NATS_CA_SECRET_KEY, SIGNING_CONTEXT, TOKEN_ENV, TOKEN_SECRET_KEY, WorkerCredentials,
    WorkerToken,
};
