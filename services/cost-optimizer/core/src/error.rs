//! The core's one error type. Every message names the entry or field at fault
//! and what would make it valid.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum CostError {
    /// The catalog is not valid YAML or has a field of the wrong type.
    #[error("price catalog: {0}")]
    CatalogSyntax(String),
    /// One catalog entry is invalid; `entry` names it, e.g. `prices[3]`.
    #[error("price catalog {entry}.{field}: {reason}")]
    CatalogEntry {
        entry: String,
        field: &'static str,
        reason: String,
    },
    /// A budget is invalid; `field` is its path, e.g. `budget.period`.
    #[error("{field}: {reason}")]
    Budget { field: String, reason: String },
    /// A Prometheus answer could not be used.
    #[error("prometheus: {0}")]
    Prometheus(String),
    /// An idle policy is invalid.
    #[error("{field}: {reason}")]
    IdlePolicy { field: String, reason: String },
}
