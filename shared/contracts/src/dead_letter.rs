//! Dead letters: messages a consumer gave up on, with the reason, on
//! `trainyard.deadletter.<stream>.<consumer>`. The original bytes are kept so an
//! operator can fix the cause and replay them (`trainyard deadletter replay`);
//! nothing is lost.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Header naming the reason, so `nats sub` shows it without decoding the body.
pub const REASON_HEADER: &str = "Trainyard-Dead-Letter-Reason";

/// A dead letter. Not an [`crate::Envelope`]: the original may not have been one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    pub stream: String,
    pub consumer: String,
    /// Subject the original was stored under.
    pub subject: String,
    /// Stream sequence of the original.
    pub stream_sequence: u64,
    /// Bounded category, e.g. `malformed`, `unsupported_version`, `handler`.
    pub category: String,
    /// What went wrong and, where known, how to fix it.
    pub reason: String,
    pub deliveries: u64,
    pub failed_at: DateTime<Utc>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The original body (UTF-8; invalid bytes replaced).
    pub payload: String,
}

impl DeadLetter {
    /// Deduplication id: one dead letter per original stored message and
    /// consumer (several consumers of one stream may each reject the same
    /// message, and each rejection is kept).
    pub fn message_id(&self) -> String {
        format!(
            "deadletter:{}:{}:{}",
            self.stream, self.stream_sequence, self.consumer
        )
    }

    /// `Nats-Msg-Id` of the original when it is published again: not the
    /// original's own (JetStream would drop it as a duplicate within its
    /// window), but one per original, so replaying a dead letter twice stores
    /// it once. The envelope inside, and its id, are unchanged.
    pub fn replay_message_id(&self) -> String {
        format!("replay:{}:{}", self.stream, self.stream_sequence)
    }

    /// The subject the original was published on (without the partition
    /// token its stream inserted).
    pub fn original_subject(&self) -> String {
        crate::subject::published(&self.subject)
    }
}
