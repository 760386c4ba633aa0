use thiserror::Error;

/// Input the core refuses. Every message names the field at fault and the fix.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CoreError {
    /// The retention policy is unusable.
    #[error("checkpoint.retention{field}: {message}")]
    InvalidPolicy {
        field: &'static str,
        message: String,
    },
    /// A manifest cannot be read as the Trainyard manifest format.
    #[error("{file} is not a valid manifest: {message}")]
    InvalidManifest { file: &'static str, message: String },
    /// A checkpoint report contradicts what is already known about the checkpoint.
    #[error("checkpoint {uri}: {message}")]
    ConflictingReport { uri: String, message: String },
}
