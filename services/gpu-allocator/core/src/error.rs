//! The crate's one error type. Every variant names the offending object and
//! field so a malformed event can be dead-lettered with a readable reason.

use crate::types::JobUid;

/// Errors returned when an event or the configuration is rejected.
/// A rejected event leaves the allocator state unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocatorError {
    /// A configuration field is out of range or inconsistent.
    #[error("invalid config field `{field}`: {reason}")]
    InvalidConfig {
        /// Path of the field, e.g. `flavors[2].name`.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A node event carries a malformed field.
    #[error("node {node}: invalid field `{field}`: {reason}")]
    InvalidNode {
        /// Node name (may be empty when the name itself is the problem).
        node: String,
        /// Path of the field, e.g. `allocatable[nvidia.com/gpu]`.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A TrainingQueue event carries a malformed field.
    #[error("queue {queue}: invalid field `{field}`: {reason}")]
    InvalidQueue {
        /// Queue name (may be empty when the name itself is the problem).
        queue: String,
        /// Path of the field, e.g. `quotas[0].resources[1].nominal`.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A job event carries a malformed field.
    #[error("job {uid}: invalid field `{field}`: {reason}")]
    InvalidJob {
        /// Job uid (may be empty when the uid itself is the problem).
        uid: String,
        /// Path of the field, e.g. `numWorkers`.
        field: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A replayed decision refers to a job the allocator has never seen.
    #[error("{event} refers to unknown job {uid}")]
    UnknownJob {
        /// The job uid.
        uid: JobUid,
        /// The event kind that referred to it.
        event: &'static str,
    },
    /// A replayed decision refers to a node the allocator does not know.
    #[error("{event} for job {uid} refers to unknown node {node}")]
    UnknownNode {
        /// The job uid.
        uid: JobUid,
        /// The node name.
        node: String,
        /// The event kind.
        event: &'static str,
    },
    /// A replayed decision cannot be applied to the current state.
    #[error("{event} for job {uid} is inconsistent with the allocator state: {reason}")]
    InconsistentDecision {
        /// The job uid.
        uid: JobUid,
        /// The event kind.
        event: &'static str,
        /// What does not fit.
        reason: String,
    },
}

impl AllocatorError {
    /// A bounded label for metrics (one value per variant, never per object).
    pub fn category(&self) -> &'static str {
        match self {
            AllocatorError::InvalidConfig { .. } => "invalid_config",
            AllocatorError::InvalidNode { .. } => "invalid_node",
            AllocatorError::InvalidQueue { .. } => "invalid_queue",
            AllocatorError::InvalidJob { .. } => "invalid_job",
            AllocatorError::UnknownJob { .. } => "unknown_job",
            AllocatorError::UnknownNode { .. } => "unknown_node",
            AllocatorError::InconsistentDecision { .. } => "inconsistent_decision",
        }
    }
}
