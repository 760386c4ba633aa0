//! The one error type of the notifier's core.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CoreError {
    /// The routing config is invalid; `field` is its path, e.g. `route.routes[1].matchers[0]`.
    #[error("{field}: {message}")]
    Config { field: String, message: String },
    /// The routing config is not YAML of the right shape.
    #[error("routing config: {0}")]
    ConfigSyntax(#[from] yaml_serde::Error),
    /// A message the notifier consumes but whose type it does not know.
    #[error(
        "unknown event type {0:?}: the notifier handles lifecycle transitions, sweep progress, budget decisions and the alert types of shared/contracts"
    )]
    UnknownEventType(String),
    /// A message whose payload does not decode as its type.
    #[error(transparent)]
    Contract(#[from] trainyard_contracts::ContractError),
    /// A signing secret is not `whsec_<base64>`.
    #[error("signing secret {name}: {message}")]
    Secret { name: String, message: String },
}

impl CoreError {
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        CoreError::Config {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Bounded category for metrics and dead letters.
    pub fn category(&self) -> &'static str {
        match self {
            CoreError::Config { .. } | CoreError::ConfigSyntax(_) => "config",
            CoreError::UnknownEventType(_) => "unknown_event_type",
            CoreError::Contract(err) => err.category(),
            CoreError::Secret { .. } => "secret",
        }
    }
}
