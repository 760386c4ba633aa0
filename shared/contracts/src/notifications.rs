//! Delivery status of the notifier's notifications, kept in the
//! `trainyard_notifications` bucket under the notification id, for
//! `trainyard notifications` and any other reader.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a notification's delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Claimed, first attempt under way.
    Pending,
    Sent,
    /// An attempt failed; another is scheduled.
    Retrying,
    /// Retries exhausted or the endpoint refused it; dead-lettered with the reason.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Sent => "sent",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Failed => "failed",
        }
    }
}

/// One notification to one destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryStatus {
    /// Notification id; the `webhook-id` of webhook deliveries.
    pub id: String,
    /// Receiver name in the routing config.
    pub receiver: String,
    /// `slack:#channel` or `webhook:<receiver>`.
    pub destination: String,
    /// Event type of the notification, e.g. `job.failed`.
    pub event: String,
    /// Its headline.
    pub title: String,
    /// Events coalesced into it.
    pub events: u32,
    pub state: DeliveryState,
    pub attempts: u32,
    /// Why the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}
