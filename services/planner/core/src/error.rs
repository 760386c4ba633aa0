//! Why the planner cannot build a TrainingJob's objects.
//!
//! Every variant names the field at fault and says how to fix it, because the message
//! ends up verbatim in the TrainingJob's `Failed` condition where a data scientist
//! reads it. [`PlanError::reason`] is a bounded CamelCase word for condition reasons
//! and metric labels.

use trainyard_api::FieldError;

/// Why desired objects cannot be built from a TrainingJob.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The TrainingJob lacks metadata the owned objects need (namespace, uid).
    #[error("{field} is not set: {fix}")]
    MissingMetadata {
        /// JSON path of the missing field, e.g. `metadata.uid`.
        field: &'static str,
        /// What to do about it.
        fix: &'static str,
    },

    /// `metadata.name` cannot name the worker Service or the worker pods' host names.
    #[error(
        "metadata.name {name:?} cannot name the workers: {problem}; use at most {max_length} lowercase letters, digits and '-', starting with a letter"
    )]
    UnusableName {
        /// The TrainingJob's name.
        name: String,
        /// What is wrong with it.
        problem: String,
        /// Longest name that still fits the generated names.
        max_length: usize,
    },

    /// The spec breaks a schema or CEL rule of the CRD (it did not come through the apiserver).
    #[error("spec is invalid: {}", join_field_errors(errors))]
    InvalidSpec {
        /// Every problem, each with its path and fix.
        errors: Vec<FieldError>,
    },

    /// One worker asks for more GPUs than any node has, so the gang can never be placed.
    #[error(
        "spec.gpusPerWorker is {requested} but the largest node has {largest} GPUs, so no worker could ever be scheduled: lower gpusPerWorker to at most {largest} and raise numWorkers instead"
    )]
    GpusExceedLargestNode {
        /// `spec.gpusPerWorker`.
        requested: u32,
        /// GPUs of the largest node, from the planner's configuration.
        largest: u32,
    },

    /// `spec.checkpoint.resumeFrom` is neither a URI nor an absolute path.
    #[error(
        "spec.checkpoint.resumeFrom {value:?} is not a checkpoint URI or absolute path: {problem}; use e.g. s3://bucket/run/checkpoint-epoch-10 or /checkpoints/epoch-10"
    )]
    UnparsableResumeFrom {
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },

    /// `spec.resources` sets the GPU resource to something other than `gpusPerWorker`.
    #[error(
        "spec.resources.{section}[{resource:?}] is {value:?} but gpusPerWorker is {gpus_per_worker}: remove {resource} from spec.resources (Trainyard sets it from gpusPerWorker) or make it {gpus_per_worker}"
    )]
    GpuResourceMismatch {
        /// `requests` or `limits`.
        section: &'static str,
        /// Resource name, e.g. `nvidia.com/gpu`.
        resource: String,
        /// The quantity as written.
        value: String,
        /// `spec.gpusPerWorker` (after defaulting).
        gpus_per_worker: u32,
    },

    /// The admission's node selector contradicts the spec's: no node can satisfy both.
    #[error(
        "spec.scheduling.nodeSelector[{key:?}] is {spec_value:?} but the admission for queue {queue:?} requires {admission_value:?}: the job waits for an admission that honours spec.scheduling.nodeSelector"
    )]
    NodeSelectorConflict {
        /// Label key present in both selectors.
        key: String,
        /// Value the spec asks for.
        spec_value: String,
        /// Value the admission injected.
        admission_value: String,
        /// Queue that admitted the job.
        queue: String,
    },

    /// The admission is for a different attempt than the objects being built.
    #[error(
        "admission is for attempt {admission_attempt} but the objects are for attempt {plan_attempt}"
    )]
    AdmissionForOtherAttempt {
        /// `AdmissionDecided.attempt`.
        admission_attempt: u32,
        /// `JobPlan.attempt`.
        plan_attempt: u32,
    },

    /// Two `additionalParams` keys map to the same `HP_<NAME>` environment variable.
    #[error(
        "spec.hyperparameters.additionalParams keys {first:?} and {second:?} both become environment variable {env_name}: rename one of them"
    )]
    HyperparameterNameClash {
        /// First key, in map order.
        first: String,
        /// Second key.
        second: String,
        /// The shared variable name.
        env_name: String,
    },

    /// A generated file could not be encoded.
    #[error("could not encode {what}: {message}")]
    Encode {
        /// Which file, e.g. `hyperparameters.json`.
        what: &'static str,
        /// The encoder's message.
        message: String,
    },
}

impl PlanError {
    /// CamelCase reason for the `Failed` condition, events and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingMetadata { .. } => "MissingMetadata",
            Self::UnusableName { .. } => "UnusableName",
            Self::InvalidSpec { .. } => "InvalidSpec",
            Self::GpusExceedLargestNode { .. } => "GpusExceedLargestNode",
            Self::UnparsableResumeFrom { .. } => "UnparsableResumeFrom",
            Self::GpuResourceMismatch { .. } => "GpuResourceMismatch",
            Self::NodeSelectorConflict { .. } => "AdmissionConflict",
            Self::AdmissionForOtherAttempt { .. } => "AdmissionForOtherAttempt",
            Self::HyperparameterNameClash { .. } => "HyperparameterNameClash",
            Self::Encode { .. } => "EncodeFailed",
        }
    }

    /// JSON path of the field at fault (the first one for [`PlanError::InvalidSpec`]).
    pub fn field(&self) -> String {
        match self {
            Self::MissingMetadata { field, .. } => (*field).to_owned(),
            Self::UnusableName { .. } => "metadata.name".to_owned(),
            Self::InvalidSpec { errors } => errors
                .first()
                .map_or_else(|| "spec".to_owned(), |e| e.path.clone()),
            Self::GpusExceedLargestNode { .. } => "spec.gpusPerWorker".to_owned(),
            Self::UnparsableResumeFrom { .. } => "spec.checkpoint.resumeFrom".to_owned(),
            Self::GpuResourceMismatch {
                section, resource, ..
            } => format!("spec.resources.{section}[{resource}]"),
            Self::NodeSelectorConflict { key, .. } => {
                format!("spec.scheduling.nodeSelector[{key}]")
            }
            Self::AdmissionForOtherAttempt { .. } => "admission.attempt".to_owned(),
            Self::HyperparameterNameClash { .. } => {
                "spec.hyperparameters.additionalParams".to_owned()
            }
            Self::Encode { what, .. } => (*what).to_owned(),
        }
    }

    /// True when the TrainingJob itself is at fault, so retrying cannot help and the job
    /// fails; false when a decision (an admission) is at fault and a later one may fix it.
    pub fn is_spec_error(&self) -> bool {
        !matches!(
            self,
            Self::NodeSelectorConflict { .. } | Self::AdmissionForOtherAttempt { .. }
        )
    }
}

/// One line per problem would break a condition message across lines; join with "; ".
fn join_field_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why a worker's NATS credentials cannot be issued or are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The worker token is not one the planner issues.
    #[error("worker token is malformed: {0}")]
    MalformedToken(&'static str),

    /// The token's signature is not the issuer's: forged, or signed by another key.
    #[error("worker token is signed by another key (or altered)")]
    BadSignature,

    /// The token's time is over; a new attempt of the job gets a new one.
    #[error("worker token for {namespace}/{job} expired at {expired_at} (Unix seconds)")]
    Expired {
        namespace: String,
        job: String,
        expired_at: i64,
    },

    /// nats-server's authorization request cannot be read or was not signed by it.
    #[error("authorization request is malformed: {0}")]
    MalformedRequest(String),

    /// The issuer key cannot sign (it is a public key, not a seed) or a claim cannot be encoded.
    #[error("cannot sign: {0}")]
    Signing(String),
}
