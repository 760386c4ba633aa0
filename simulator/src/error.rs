//! Errors, as the Kubernetes API reports them (a `Status` object with a code and reason).

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// An API error; the HTTP layer sends it as a `Status` body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", rt.name))
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.name),
        )
    }

    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                rt.name
            ),
        )
    }

    /// Named by kind, as the real apiserver names it (`Pod "x" is invalid: ...`).
    pub fn invalid(rt: &ResourceType, name: &str, detail: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {detail}", rt.qualified_kind()),
        )
    }

    /// A simulated failure of the API server itself (`apiFaults`).
    pub fn fault(code: u16, request: &str) -> Self {
        let (reason, message) = match code {
            409 => (
                "Conflict",
                format!(
                    "Operation cannot be fulfilled ({request}): the object has been modified; please apply your changes to the latest version and try again"
                ),
            ),
            429 => (
                "TooManyRequests",
                format!("too many requests ({request}), please try again later"),
            ),
            503 => (
                "ServiceUnavailable",
                format!("the server is currently unable to handle the request ({request})"),
            ),
            504 => (
                "Timeout",
                format!(
                    "the server was unable to return a response in the time allotted ({request})"
                ),
            ),
            _ => (
                "InternalError",
                format!(
                    "an error on the server ({request}) has prevented the request from succeeding"
                ),
            ),
        };
        Self::new(code, reason, message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The `Status` object clients parse.
    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

/// Errors of the simulator outside single API calls (start-up, configuration).
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("simulator config {path}: {message}")]
    Config { path: String, message: String },
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("NATS: {0}")]
    Nats(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}
