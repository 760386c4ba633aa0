use thiserror::Error;

/// Why a message could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum ContractError {
    /// The bytes are not a Trainyard envelope (not JSON, or a required header field is missing).
    #[error(
        "malformed envelope: {0}; a message needs id, type, schemaVersion, source, time, entity, correlationId and payload"
    )]
    Malformed(#[source] serde_json::Error),
    /// The envelope names a different message type than the consumer asked for.
    #[error("message type is {found:?}, expected {expected:?}")]
    WrongType {
        expected: &'static str,
        found: String,
    },
    /// The envelope's schema version is not one this build understands.
    #[error(
        "{message_type} schemaVersion {found} is not supported (this build speaks {supported}); upgrade the consumer or publish version {supported}"
    )]
    UnsupportedVersion {
        message_type: &'static str,
        found: u32,
        supported: u32,
    },
    /// The payload does not match the type's schema.
    #[error("invalid {message_type} payload: {source}")]
    InvalidPayload {
        message_type: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A catalogue entry names a publisher no NATS identity stands for.
    #[error(
        "{message_type} is published by {publisher:?}, which is no service, submitter or worker; name the publishing service in the catalogue"
    )]
    UnknownPublisher {
        message_type: &'static str,
        publisher: &'static str,
    },
    /// Serialising a message failed.
    #[error("cannot encode message: {0}")]
    Encode(#[source] serde_json::Error),
}

impl ContractError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            ContractError::Malformed(_) => "malformed",
            ContractError::WrongType { .. } => "wrong_type",
            ContractError::UnsupportedVersion { .. } => "unsupported_version",
            ContractError::InvalidPayload { .. } => "invalid_payload",
            ContractError::UnknownPublisher { .. } => "unknown_publisher",
            ContractError::Encode(_) => "encode",
        }
    }
}
