//! One pace per Slack channel and per webhook endpoint, shared by the
//! replicas: the state they read and write with compare-and-set, and the
//! arithmetic on it. A replica books a slot before sending (the later of now,
//! the next free instant and any hold), then looks again when the slot comes,
//! in case a 429 told everyone to hold meanwhile.
//!
//! Instants are wall-clock milliseconds since the Unix epoch, written by
//! every replica: the replicas are assumed to share a clock (NTP keeps hosts
//! within milliseconds; a skew of `d` between two replicas lets their
//! messages come up to `d` closer than the interval, or inside a hold's last
//! `d`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What is paced: where a 429 applies and where the rate is counted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PaceTarget {
    /// A Slack channel, by name (`#team-a`), whichever receiver posts to it.
    SlackChannel(String),
    /// A webhook endpoint, by URL, whichever receiver names it.
    Webhook(String),
}

impl PaceTarget {
    /// The target's key in the pace bucket: `slack.<digest>` or
    /// `webhook.<digest>`, as channel names (`#`) and URLs (`:`, `?`) hold
    /// characters a key may not.
    pub fn key(&self) -> String {
        match self {
            PaceTarget::SlackChannel(channel) => format!("slack.{}", key_digest(channel)),
            PaceTarget::Webhook(url) => format!("webhook.{}", key_digest(url)),
        }
    }
}

/// The first 8 bytes of the SHA-256 of `text`, in hex: a valid key part for
/// any text.
pub fn key_digest(text: &str) -> String {
    Sha256::digest(text.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One target's shared pace, in wall-clock milliseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pace {
    /// The earliest instant the next message may go.
    pub next_at_ms: i64,
    /// Nothing goes before this: the end of the last `Retry-After`.
    pub hold_until_ms: i64,
}

/// A booked slot and the pace to write for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booking {
    pub slot_ms: i64,
    /// None when the booking changes nothing others need (no interval).
    pub next: Option<Pace>,
}

impl Pace {
    /// Books the first slot at or after `now_ms` that neither an earlier
    /// booking nor a hold takes; the next one is `interval_ms` later. With no
    /// interval (webhooks) only holds delay a message and nothing is written.
    pub fn book(self, now_ms: i64, interval_ms: i64) -> Booking {
        let slot_ms = now_ms.max(self.next_at_ms).max(self.hold_until_ms);
        let next = (interval_ms > 0).then(|| Pace {
            next_at_ms: slot_ms.saturating_add(interval_ms),
            ..self
        });
        Booking { slot_ms, next }
    }

    /// The pace once a `Retry-After` ends at `until_ms`; None when a hold as
    /// long or longer is already there. Slots booked after it start at its end.
    pub fn hold(self, until_ms: i64) -> Option<Pace> {
        (until_ms > self.hold_until_ms).then(|| Pace {
            next_at_ms: self.next_at_ms.max(until_ms),
            hold_until_ms: until_ms,
        })
    }

    /// Whether a slot booked earlier fell inside a hold written since: then
    /// the message must book again rather than go.
    pub fn holds(self, slot_ms: i64) -> bool {
        slot_ms < self.hold_until_ms
    }
}
