//! Delivery decisions: what an HTTP answer means, when to try again, which
//! replica sends to a destination, and the per-channel pace.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

/// The retry schedule of the Standard Webhooks spec: after the first attempt,
/// 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
pub fn default_schedule() -> Vec<Duration> {
    [5, 300, 1800, 7200, 18_000, 36_000, 36_000]
        .map(Duration::from_secs)
        .to_vec()
}

/// What one attempt's answer means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Try again, not before `after` if the receiver said so.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// The endpoint is gone (410): stop sending to it.
    Gone,
    /// Never retried (4xx other than 408/429): the request itself is wrong.
    Rejected {
        why: String,
    },
}

/// Classifies an HTTP status (or a transport failure, `None`).
pub fn verdict(status: Option<u16>, retry_after: Option<Duration>, detail: &str) -> Verdict {
    match status {
        Some(200..=299) => Verdict::Delivered,
        Some(410) => Verdict::Gone,
        Some(status @ (408 | 429 | 500..=599)) => Verdict::Retry {
            after: retry_after,
            why: format!("HTTP {status}{}", suffix(detail)),
        },
        Some(status) => Verdict::Rejected {
            why: format!("HTTP {status}{}", suffix(detail)),
        },
        None => Verdict::Retry {
            after: None,
            why: detail.to_string(),
        },
    }
}

fn suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {}", crate::render::truncate(detail, 200))
    }
}

/// The delay before retry number `retry` (0-based), with `jitter` in [0, 1)
/// spreading it ±20 %; a `Retry-After` longer than that wins. `None` when the
/// schedule is exhausted.
pub fn next_delay(
    schedule: &[Duration],
    retry: usize,
    jitter: f64,
    retry_after: Option<Duration>,
) -> Option<Duration> {
    let base = schedule.get(retry)?;
    let factor = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
    let delay = base.mul_f64(factor);
    Some(retry_after.map_or(delay, |after| after.max(delay)))
}

/// Parses `Retry-After`: seconds, or an HTTP date.
pub fn retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = DateTime::parse_from_rfc2822(value).ok()?;
    Some((at.with_timezone(&Utc) - now).to_std().unwrap_or_default())
}

/// The replica that sends to `destination`: highest rendezvous score among the
/// live replicas, so every replica that sees the same members agrees, and a
/// replica leaving moves only its own destinations.
pub fn owner<'a>(destination: &str, replicas: &'a [String]) -> Option<&'a String> {
    replicas.iter().max_by_key(|replica| {
        let digest = Sha256::new()
            .chain_update(destination.as_bytes())
            .chain_update([0u8])
            .chain_update(replica.as_bytes())
            .finalize();
        let mut score = [0u8; 8];
        score.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(score)
    })
}

/// One replica's own pace: at most one message per interval per
/// destination, and none before a `Retry-After` ends. The replicas share
/// theirs through [`crate::pace`]; this one paces a replica that cannot reach
/// the shared one.
#[derive(Debug, Default)]
pub struct Pacer {
    next: HashMap<String, Instant>,
}

impl Pacer {
    /// Books the next slot for `destination` at or after `now`, the one after
    /// it `interval` later; returns it.
    pub fn reserve(&mut self, destination: &str, now: Instant, interval: Duration) -> Instant {
        let slot = self.next.get(destination).copied().unwrap_or(now).max(now);
        self.next.insert(destination.to_string(), slot + interval);
        slot
    }

    /// Nothing goes to `destination` before `until`.
    pub fn hold(&mut self, destination: &str, until: Instant) {
        let next = self.next.entry(destination.to_string()).or_insert(until);
        *next = (*next).max(until);
    }
}
