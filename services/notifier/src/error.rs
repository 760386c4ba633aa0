//! The notifier service's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum NotifierError {
    /// The `notifier` config section or the routing file is wrong.
    #[error("{0}")]
    Config(String),
    /// The routing file is invalid (the message names the field).
    #[error("{file}: {source}")]
    Routing {
        file: String,
        source: notifier_core::CoreError,
    },
    /// A secret file is missing or unreadable (its content is never shown).
    #[error("secret file {file}: {message}")]
    Secret { file: String, message: String },
    /// A key-value bucket is missing or failed.
    #[error("bucket {bucket}: {message}")]
    Store {
        bucket: &'static str,
        message: String,
    },
    #[error(transparent)]
    Runtime(#[from] trainyard_runtime::RuntimeError),
}
