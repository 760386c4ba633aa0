//! The outbox: every routed event per destination, in the
//! `trainyard_notifier_outbox` bucket, from the moment a replica consumed it
//! until it is delivered. Creating the entry is idempotent (a redelivered
//! message finds it); sending it is claimed with compare-and-set, so one
//! replica sends it, once. Replicas also write their heartbeats here.

use async_nats::jetstream::kv;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use notifier_core::pace::key_digest;
use notifier_core::{Event, Routed};
use serde::{Deserialize, Serialize};

/// Where an outbox entry stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum EntryState {
    /// Waiting to be grouped and sent by the destination's owner.
    Pending,
    /// Claimed by `owner` as part of notification `notification`.
    Sending {
        owner: String,
        notification: String,
    },
    Sent {
        notification: String,
    },
    /// Dead-lettered with the reason.
    Failed {
        notification: String,
    },
}

impl EntryState {
    pub fn is_final(&self) -> bool {
        matches!(self, EntryState::Sent { .. } | EntryState::Failed { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntry {
    pub routed: Routed,
    pub event: Event,
    #[serde(flatten)]
    pub state: EntryState,
    /// When the replica that consumed the event wrote it.
    pub stored_at: DateTime<Utc>,
}

impl OutboxEntry {
    pub fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// `e.<destination digest>.<event id>`: KV keys allow neither `#` nor `/`.
pub fn entry_key(routed: &Routed, event_id: &str) -> String {
    let digest = key_digest(&routed.destination.key());
    format!("{ENTRY_PREFIX}{digest}.{event_id}")
}

pub const ENTRY_PREFIX: &str = "e.";
pub const HEARTBEAT_PREFIX: &str = "r.";

/// A replica's heartbeat: its wall-clock time in milliseconds.
pub fn heartbeat_key(replica: &str) -> String {
    format!("{HEARTBEAT_PREFIX}{replica}")
}

/// The outbox bucket.
#[derive(Clone)]
pub struct Outbox {
    pub store: kv::Store,
}

impl Outbox {
    /// Stores the entry unless it exists; true when this call created it.
    pub async fn create(&self, key: &str, entry: &OutboxEntry) -> Result<bool, String> {
        match self.store.create(key, entry.encode()).await {
            Ok(_) => Ok(true),
            Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(err) => Err(format!("outbox create {key}: {err}")),
        }
    }

    /// Compare-and-set: the new revision, or None when someone else wrote first.
    pub async fn update(
        &self,
        key: &str,
        entry: &OutboxEntry,
        revision: u64,
    ) -> Result<Option<u64>, String> {
        match self.store.update(key, entry.encode(), revision).await {
            Ok(revision) => Ok(Some(revision)),
            Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(err) => Err(format!("outbox update {key}: {err}")),
        }
    }
}
