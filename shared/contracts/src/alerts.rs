//! Alerts for people, on `trainyard.alerts.<severity>.<ns>.<name>`; the notifier
//! delivers them. [`AlertRaised`] is the generic alert any service may raise; the
//! other types carry what their situation needs, so the notifier can render and
//! coalesce them without parsing text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::envelope::EntityRef;
use crate::subject::{Family, entity_subject};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// Implements [`crate::Payload`] for an alert: published under its severity.
macro_rules! alert_payload {
    ($ty:ty, $type_name:literal) => {
        impl crate::envelope::Payload for $ty {
            const TYPE: &'static str = $type_name;
            const VERSION: u32 = 1;
            fn subject(&self, entity: &EntityRef) -> String {
                entity_subject(Family::Alerts, self.severity.as_str(), entity)
            }
        }
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertRaised {
    /// Stable alert name, e.g. `TrainingJobFailed`, `BudgetExceeded`.
    pub alertname: String,
    pub severity: Severity,
    pub summary: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Spend crossed a budget threshold. The entity is the namespace's budget
/// (`<namespace>/<budget name>`) or a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetThresholdCrossed {
    pub severity: Severity,
    /// The threshold crossed, in percent of the budget (e.g. 80, 100).
    pub threshold_percent: u32,
    pub spent: f64,
    pub budget: f64,
    pub currency: String,
    /// Queue the spend is counted against, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// What happens next, e.g. "new jobs in ml-training are suspended at 100%".
    #[serde(default)]
    pub message: String,
}

/// GPUs held but idle. The entity is the job holding them (or the node, cluster-scoped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpusIdle {
    pub severity: Severity,
    pub gpus: u32,
    /// How long they have been idle.
    pub idle_minutes: u32,
    /// Mean utilisation over that time, in percent.
    pub utilization_percent: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default)]
    pub message: String,
}

/// What went wrong with a job's checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum CheckpointProblemKind {
    /// A reported checkpoint failed verification (no completion marker,
    /// sizes or checksums wrong): it was not written completely.
    WriteFailed,
    /// A Running job has had no verified checkpoint for longer than its
    /// checkpoint interval allows.
    Overdue,
    /// The next attempt cannot resume from the newest checkpoint: none is
    /// verified (it starts from scratch) or newer ones are not.
    ResumeUnavailable,
    /// Retention could not delete a checkpoint it chose, or the job's
    /// retention policy was refused.
    RetentionFailed,
}

/// A problem with a job's checkpoints. The entity is the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointProblem {
    pub severity: Severity,
    pub problem: CheckpointProblemKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Age of the latest good checkpoint, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint_age_seconds: Option<u64>,
    pub message: String,
}

/// Messages went to a dead-letter subject. The entity is the message's entity
/// when known, else the consumer (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagesDeadLettered {
    pub severity: Severity,
    pub stream: String,
    pub consumer: String,
    /// Dead-letter category, e.g. `malformed`, `retries_exhausted`.
    pub category: String,
    /// How many since the last alert.
    pub count: u64,
    /// The latest reason.
    pub reason: String,
}

/// A webhook endpoint answered 410 Gone; the notifier stopped sending to it
/// until its operator changes its configuration. The entity is the receiver
/// (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookEndpointDisabled {
    pub severity: Severity,
    /// The receiver's name in the notifier's routing config.
    pub receiver: String,
    /// HTTP status that disabled it.
    pub status: u16,
    pub message: String,
}

alert_payload!(AlertRaised, "alert.raised");
alert_payload!(BudgetThresholdCrossed, "alert.budget");
alert_payload!(GpusIdle, "alert.gpus_idle");
alert_payload!(CheckpointProblem, "alert.checkpoint");
alert_payload!(MessagesDeadLettered, "alert.dead_letter");
alert_payload!(WebhookEndpointDisabled, "alert.webhook_disabled");
