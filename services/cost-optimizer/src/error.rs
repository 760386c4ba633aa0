//! The service's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CostServiceError {
    /// The price catalog could not be read or is invalid.
    #[error("{0}")]
    Catalog(String),
    /// A message's content is unusable.
    #[error("{0}")]
    Invalid(String),
    /// Prometheus (the DCGM utilisation source) is unreachable or answered
    /// something unusable.
    #[error("{0}")]
    Prometheus(String),
    /// The key-value store failed.
    #[error("state store: {0}")]
    Store(String),
    /// The runtime failed (config, metrics, publishing).
    #[error(transparent)]
    Runtime(#[from] trainyard_runtime::RuntimeError),
}
