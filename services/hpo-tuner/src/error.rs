use thiserror::Error;

use crate::spec::SpecRejection;

/// What can go wrong in the hpo-tuner adapter.
#[derive(Debug, Error)]
pub enum TunerError {
    /// The Sweep's spec cannot be run; the message names the offending field.
    #[error("{0}")]
    InvalidSpec(#[from] SpecRejection),
    /// A sweep's stored state cannot be read by this build.
    #[error(
        "stored state of sweep {key} is unreadable ({message}); inspect or purge key {key} in bucket trainyard_tuner"
    )]
    CorruptState { key: String, message: String },
    /// Reading or writing the `trainyard_tuner` bucket failed.
    #[error("state store: {0}")]
    Store(String),
    /// Another replica changed the sweep's state between our read and our write.
    #[error("state of sweep {0} changed concurrently; the message will be retried")]
    Conflict(String),
    /// A trial completed before its last progress report was handled (the two
    /// travel on different streams); the completion is retried shortly.
    #[error(
        "trial {trial} completed but its progress was seen up to epoch {seen:?} of {expected}; waiting for the rest"
    )]
    AwaitingFinalReport {
        trial: String,
        seen: Option<u32>,
        expected: u32,
    },
    /// Publishing a decision failed.
    #[error(transparent)]
    Runtime(#[from] trainyard_runtime::RuntimeError),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The configuration of the `hpo_tuner` section is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A request to the MLflow tracking server failed.
    #[error(transparent)]
    Mlflow(#[from] trainyard_mlflow::MlflowError),
}

impl TunerError {
    /// A bounded label for metrics and dead letters.
    pub fn category(&self) -> &'static str {
        match self {
            TunerError::InvalidSpec(_) => "invalid_spec",
            TunerError::CorruptState { .. } => "corrupt_state",
            TunerError::Store(_) => "store",
            TunerError::Conflict(_) => "conflict",
            TunerError::AwaitingFinalReport { .. } => "awaiting_report",
            TunerError::Runtime(err) => err.category(),
            TunerError::Metrics(_) => "metrics",
            TunerError::Config(_) => "config",
            TunerError::Mlflow(_) => "mlflow",
        }
    }
}

impl From<TunerError> for trainyard_runtime::HandleError {
    /// Bad content is dead-lettered at once; everything else is retried.
    fn from(err: TunerError) -> Self {
        match err {
            TunerError::InvalidSpec(_) | TunerError::CorruptState { .. } => {
                trainyard_runtime::HandleError::Reject {
                    category: err.category(),
                    reason: err.to_string(),
                }
            }
            other => trainyard_runtime::HandleError::Retry(other.to_string()),
        }
    }
}
