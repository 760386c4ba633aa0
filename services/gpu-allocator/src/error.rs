//! The service's error type.

use gpu_allocator_core::AllocatorError;
use trainyard_contracts::ContractError;
use trainyard_runtime::{HandleError, RuntimeError};

/// What can go wrong in the gpu-allocator service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The allocator core rejected an event, the configuration or a snapshot.
    #[error(transparent)]
    Allocator(#[from] AllocatorError),
    /// A message field cannot be mapped onto the allocator's model.
    #[error("{object}: invalid field `{field}`: {reason}")]
    InvalidField {
        /// The object, e.g. `TrainingJob ml/bert` or `node gpu-1`.
        object: String,
        /// Path of the field, e.g. `spec.scheduling.tolerations[0].effect`.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A message could not be decoded.
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// The runtime failed (configuration, publishing).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The `trainyard_allocator` bucket could not be read or written.
    #[error("state store: {0}")]
    Store(String),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
    /// Another replica holds the allocator lease now: this one must stop.
    #[error("fenced out: {0}")]
    Fenced(String),
}

impl ServiceError {
    pub(crate) fn invalid(
        object: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ServiceError::InvalidField {
            object: object.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A bounded label for metrics and dead letters.
    pub fn category(&self) -> &'static str {
        match self {
            ServiceError::Allocator(err) => err.category(),
            ServiceError::InvalidField { .. } => "invalid_field",
            ServiceError::Contract(err) => err.category(),
            ServiceError::Runtime(err) => err.category(),
            ServiceError::Store(_) => "store",
            ServiceError::Metrics(_) => "metrics",
            ServiceError::Fenced(_) => "fenced",
        }
    }
}

impl From<ServiceError> for HandleError {
    fn from(err: ServiceError) -> Self {
        match err {
            // Bad content never becomes good: dead-letter it now, naming the field.
            ServiceError::Allocator(_)
            | ServiceError::InvalidField { .. }
            | ServiceError::Contract(_) => HandleError::Reject {
                category: err.category(),
                reason: err.to_string(),
            },
            ServiceError::Runtime(_)
            | ServiceError::Store(_)
            | ServiceError::Metrics(_)
            | ServiceError::Fenced(_) => HandleError::Retry(err.to_string()),
        }
    }
}
