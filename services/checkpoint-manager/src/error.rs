use thiserror::Error;

/// What can go wrong in the checkpoint-manager adapter.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A report names a job whose TrainingJob has not been seen (yet).
    #[error(
        "no TrainingJob {0} with checkpoint.enabled has been seen; the report is retried until it arrives, then dead-lettered"
    )]
    UnknownJob(String),
    /// A job's stored state cannot be read by this build.
    #[error(
        "stored state of {key} is unreadable ({message}); inspect or purge key {key} in bucket trainyard_checkpoints"
    )]
    CorruptState { key: String, message: String },
    /// Reading or writing the `trainyard_checkpoints` bucket failed.
    #[error("state store: {0}")]
    Store(String),
    /// Checkpoint storage refused a request or cannot be used as configured.
    #[error("checkpoint storage: {0}")]
    Storage(String),
    /// Checkpoint storage could not be reached (connection refused, timeout,
    /// 5xx, throttling): an outage, waited out.
    #[error(
        "checkpoint storage unreachable: {0}; the message is handled again until the storage answers"
    )]
    StorageUnavailable(String),
    /// Publishing a decision failed.
    #[error(transparent)]
    Runtime(#[from] trainyard_runtime::RuntimeError),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The model registry could not be reached (refusals are published, not returned).
    #[error(transparent)]
    Registry(#[from] trainyard_mlflow::MlflowError),
    /// The `checkpoint_manager` configuration section is unusable.
    #[error("configuration: {0}")]
    Config(String),
}

impl CheckpointError {
    /// A bounded label for metrics and dead letters.
    pub fn category(&self) -> &'static str {
        match self {
            CheckpointError::UnknownJob(_) => "unknown_job",
            CheckpointError::CorruptState { .. } => "corrupt_state",
            CheckpointError::Store(_) => "store",
            CheckpointError::Storage(_) => "storage",
            CheckpointError::StorageUnavailable(_) => "storage_unavailable",
            CheckpointError::Runtime(err) => err.category(),
            CheckpointError::Metrics(_) => "metrics",
            CheckpointError::Registry(_) => "registry",
            CheckpointError::Config(_) => "config",
        }
    }
}

impl From<CheckpointError> for trainyard_runtime::HandleError {
    /// Unreadable state is dead-lettered at once; an unreachable model
    /// registry or checkpoint storage is waited out in place, so a job's
    /// completion or checkpoint is never lost to an outage; everything else is retried (an unknown job's TrainingJob event
    /// may still be on its way).
    fn from(err: CheckpointError) -> Self {
        match err {
            CheckpointError::CorruptState { .. } => trainyard_runtime::HandleError::Reject {
                category: err.category(),
                reason: err.to_string(),
            },
            CheckpointError::Registry(_) | CheckpointError::StorageUnavailable(_) => {
                trainyard_runtime::HandleError::Transient(err.to_string())
            }
            other => trainyard_runtime::HandleError::Retry(other.to_string()),
        }
    }
}
