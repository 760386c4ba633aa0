use thiserror::Error;

/// What can go wrong in the shared service runtime.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// A configuration source is unreadable or a key has the wrong type.
    #[error("configuration: {0}")]
    Config(#[source] config::ConfigError),
    /// A setting has a value that cannot work.
    #[error("configuration: {0}")]
    Settings(String),
    /// Telemetry (logs, traces) could not be set up.
    #[error("telemetry: {0}")]
    Telemetry(String),
    /// The HTTP listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// Connecting to NATS failed.
    #[error("cannot connect to NATS at {url}: {message}")]
    Connect { url: String, message: String },
    /// A stream, consumer or bucket could not be created or updated.
    #[error("cannot provision {what}: {message}")]
    Provision { what: String, message: String },
    /// A message larger than the server's max payload: it can never be
    /// published as it is.
    #[error(
        "publish to {subject} refused: {bytes} bytes exceed the NATS server's max_payload of {max_payload} bytes"
    )]
    TooLarge {
        subject: String,
        bytes: usize,
        max_payload: usize,
    },
    /// A publish was not acknowledged by JetStream.
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    /// This replica does not hold the lease (never did, lost it, or released
    /// it): another replica may be active, so it must not write.
    #[error("not the active replica: lease {lease} is not held")]
    NotLeader { lease: String },
    /// The command line is wrong.
    #[error("usage: {0}")]
    Usage(String),
    /// The service's own setup failed.
    #[error("setup: {0}")]
    Setup(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A message could not be encoded.
    #[error(transparent)]
    Contract(#[from] trainyard_contracts::ContractError),
}

impl RuntimeError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            RuntimeError::Config(_) | RuntimeError::Settings(_) => "config",
            RuntimeError::Telemetry(_) => "telemetry",
            RuntimeError::Listen { .. } => "listen",
            RuntimeError::Connect { .. } => "connect",
            RuntimeError::Provision { .. } => "provision",
            RuntimeError::Publish { .. } => "publish",
            RuntimeError::TooLarge { .. } => "too_large",
            RuntimeError::NotLeader { .. } => "not_leader",
            RuntimeError::Usage(_) => "usage",
            RuntimeError::Setup(_) => "setup",
            RuntimeError::Contract(_) => "contract",
        }
    }
}
