//! Pacing shared by the replicas: each Slack channel and webhook endpoint has
//! a key in the `trainyard_notifier_pace` bucket ([`PaceTarget::key`]) holding
//! its next free instant and the end of the last `Retry-After`
//! ([`notifier_core::pace`] decides, this module reads and writes with
//! compare-and-set). When the bucket does not answer, the replica paces on its
//! own (as it would alone), logs a warning and counts the fallback: a
//! notification is delayed or paced locally, never dropped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use chrono::Utc;
use notifier_core::delivery::Pacer;
use notifier_core::pace::{Pace, PaceTarget};
use tokio::time::Instant;

use crate::metrics::NotifierMetrics;

/// Attempts of one compare-and-set before this replica paces on its own.
const CAS_ATTEMPTS: usize = 10;

/// Longest wait for the bucket before pacing locally.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// A booked slot: when, on this replica's clock and on the shared one.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub at: Instant,
    at_ms: i64,
}

#[derive(Clone)]
pub struct SharedPace {
    store: kv::Store,
    /// This replica's own view, kept in step with what it books and holds;
    /// used when the bucket does not answer.
    local: Arc<Mutex<Pacer>>,
    metrics: NotifierMetrics,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// The monotonic instant of a wall-clock one.
fn instant_of(at_ms: i64) -> Instant {
    let ahead = u64::try_from(at_ms.saturating_sub(now_ms())).unwrap_or(0);
    Instant::now() + Duration::from_millis(ahead)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl SharedPace {
    pub fn new(store: kv::Store, metrics: NotifierMetrics) -> Self {
        Self {
            store,
            local: Arc::default(),
            metrics,
        }
    }

    /// Books the next slot for `target`, `interval` after the one booked
    /// before it and not inside a hold.
    pub async fn book(&self, target: &PaceTarget, interval: Duration) -> Slot {
        let key = target.key();
        let interval_ms = millis(interval);
        let booked = self
            .change(&key, |pace| {
                let booking = pace.book(now_ms(), interval_ms);
                (booking.slot_ms, booking.next)
            })
            .await;
        match booked {
            Ok(at_ms) => {
                let at = instant_of(at_ms);
                self.with_local(|local| local.hold(&key, (at + interval).into_std()));
                Slot { at, at_ms }
            }
            Err(why) => {
                self.fall_back("book", target, &why);
                let now = Instant::now();
                let at = self
                    .with_local(|local| {
                        Instant::from_std(local.reserve(&key, now.into_std(), interval))
                    })
                    .unwrap_or(now);
                let ahead = millis(at.saturating_duration_since(now));
                Slot {
                    at,
                    at_ms: now_ms().saturating_add(ahead),
                }
            }
        }
    }

    /// Whether a hold written since `slot` was booked covers it: then the
    /// message books again. Unknown (bucket silent) counts as not held: the
    /// booking already waited for every hold known when it was made.
    pub async fn held(&self, target: &PaceTarget, slot: Slot) -> bool {
        match self.read(&target.key()).await {
            Ok((pace, _)) => pace.holds(slot.at_ms),
            Err(why) => {
                self.fall_back("check", target, &why);
                false
            }
        }
    }

    /// Nothing goes to `target` for `after` from now: a `Retry-After`.
    pub async fn hold(&self, target: &PaceTarget, after: Duration) {
        let key = target.key();
        let until = Instant::now() + after;
        self.with_local(|local| local.hold(&key, until.into_std()));
        let until_ms = now_ms().saturating_add(millis(after));
        if let Err(why) = self.change(&key, |pace| ((), pace.hold(until_ms))).await {
            self.fall_back("hold", target, &why);
        }
    }

    /// Reads the pace, lets `decide` compute a result and the pace to write
    /// (None: nothing), and writes it with compare-and-set, reading again
    /// after a lost race.
    async fn change<T>(
        &self,
        key: &str,
        decide: impl Fn(Pace) -> (T, Option<Pace>),
    ) -> Result<T, String> {
        for _ in 0..CAS_ATTEMPTS {
            let (pace, revision) = self.read(key).await?;
            let (result, next) = decide(pace);
            let Some(next) = next else {
                return Ok(result);
            };
            if self.write(key, &next, revision).await? {
                return Ok(result);
            }
        }
        Err(format!("changed by others {CAS_ATTEMPTS} times in a row"))
    }

    /// The stored pace and its revision (None: absent or deleted).
    async fn read(&self, key: &str) -> Result<(Pace, Option<u64>), String> {
        let entry = tokio::time::timeout(STORE_TIMEOUT, self.store.entry(key))
            .await
            .map_err(|_| format!("read {key}: no answer within {STORE_TIMEOUT:?}"))?
            .map_err(|err| format!("read {key}: {err}"))?;
        Ok(match entry {
            Some(entry) if entry.operation == Operation::Put => {
                match serde_json::from_slice::<Pace>(&entry.value) {
                    Ok(pace) => (pace, Some(entry.revision)),
                    Err(err) => {
                        tracing::warn!(%key, error = %err, "unreadable pace replaced");
                        (Pace::default(), Some(entry.revision))
                    }
                }
            }
            Some(entry) => (Pace::default(), Some(entry.revision)),
            None => (Pace::default(), None),
        })
    }

    /// Writes `pace` if the key is still at `revision` (None: absent); false
    /// when another replica wrote first.
    async fn write(&self, key: &str, pace: &Pace, revision: Option<u64>) -> Result<bool, String> {
        let body = Bytes::from(serde_json::to_vec(pace).map_err(|err| err.to_string())?);
        let timed_out = || format!("write {key}: no answer within {STORE_TIMEOUT:?}");
        match revision {
            Some(revision) => {
                match tokio::time::timeout(STORE_TIMEOUT, self.store.update(key, body, revision))
                    .await
                    .map_err(|_| timed_out())?
                {
                    Ok(_) => Ok(true),
                    Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
                    Err(err) => Err(format!("update {key}: {err}")),
                }
            }
            None => match tokio::time::timeout(STORE_TIMEOUT, self.store.create(key, body))
                .await
                .map_err(|_| timed_out())?
            {
                Ok(_) => Ok(true),
                Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(err) => Err(format!("create {key}: {err}")),
            },
        }
    }

    fn with_local<T>(&self, act: impl FnOnce(&mut Pacer) -> T) -> Option<T> {
        self.local.lock().ok().map(|mut local| act(&mut local))
    }

    fn fall_back(&self, operation: &str, target: &PaceTarget, why: &str) {
        self.metrics
            .pace_fallbacks
            .with_label_values(&[operation])
            .inc();
        tracing::warn!(
            ?target,
            operation,
            error = %why,
            "shared pacing unavailable; pacing on this replica alone"
        );
    }
}
