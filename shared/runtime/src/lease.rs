//! One active replica per responsibility: a lease in the `trainyard_leases`
//! bucket, whose entries expire [`LEASE_TTL`] after their last write.
//!
//! A replica acquires the lease by creating its key (which succeeds only
//! when no live entry exists) and keeps it by compare-and-set updates every
//! third of the TTL. The revision of the creating write is the fencing
//! token: it grows with every change of holder. The holder counts the lease
//! valid until the moment it sent its last successful renewal plus the TTL
//! less a safety margin, so it stops writing before the entry can expire
//! and a standby can create it again. A holder whose renewal finds another
//! revision, or that cannot renew before its lease runs out, has lost the
//! lease and shuts its service down: its in-memory view may be stale, and a
//! restarted process comes back as a standby.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::streams::LEASE_TTL;

use crate::error::RuntimeError;
use crate::metrics::RuntimeMetrics;

/// How often the holder renews: three tries before the lease could expire.
const RENEW_EVERY: Duration = Duration::from_secs(LEASE_TTL.as_secs() / 3);
/// How often a standby tries to take the lease.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// The holder stops counting on the lease this long before its entry can
/// expire: covers clock-rate differences and the gap between a check and
/// the write it guards.
const SAFETY_MARGIN: Duration = Duration::from_millis(1500);
/// A lease write that takes longer than this counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the lease entry holds: who has it and since when that process
/// competes, for operators reading the bucket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    holder: String,
    started_at: chrono::DateTime<chrono::Utc>,
}

/// This replica's relation to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// Waiting for the lease.
    Standby,
    /// Held with fencing token `token` until `valid_until`.
    Held { token: u64, valid_until: Instant },
    /// Lost or released: this process never holds it again.
    Gone,
}

/// A lease kept by a background task until [`Lease::release`].
#[derive(Clone)]
pub struct Lease {
    key: &'static str,
    bucket: kv::Store,
    holding: watch::Receiver<Holding>,
    /// Stops the keeper; it answers with the revision to release, if held.
    stop: CancellationToken,
    keeper: Arc<tokio::sync::Mutex<Option<tokio::task::JoinHandle<Option<u64>>>>>,
    metrics: RuntimeMetrics,
}

impl Lease {
    /// Starts competing for `key` in `bucket` as `holder`. Losing the lease
    /// after holding it cancels `on_lost`.
    pub fn keep(
        bucket: kv::Store,
        key: &'static str,
        holder: String,
        metrics: RuntimeMetrics,
        on_lost: CancellationToken,
    ) -> Self {
        let (sender, holding) = watch::channel(Holding::Standby);
        let stop = CancellationToken::new();
        metrics.lease_held.with_label_values(&[key]).set(0);
        let keeper = Keeper {
            bucket: bucket.clone(),
            key,
            holder,
            holding: sender,
            metrics: metrics.clone(),
        };
        let handle = tokio::spawn(keeper.run(stop.clone(), on_lost));
        Self {
            key,
            bucket,
            holding,
            stop,
            keeper: Arc::new(tokio::sync::Mutex::new(Some(handle))),
            metrics,
        }
    }

    /// The lease's key (the responsibility it guards).
    pub fn key(&self) -> &'static str {
        self.key
    }

    /// Waits until this replica holds the lease and returns its fencing
    /// token; None once it never will (released or lost).
    pub async fn acquired(&self) -> Option<u64> {
        let mut holding = self.holding.clone();
        let held = holding
            .wait_for(|h| !matches!(h, Holding::Standby))
            .await
            .ok()?;
        match *held {
            Holding::Held { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The fencing token, if this replica may write now: call it before
    /// every write the lease guards.
    pub fn fence(&self) -> Result<u64, RuntimeError> {
        match *self.holding.borrow() {
            Holding::Held { token, valid_until } if Instant::now() < valid_until => Ok(token),
            _ => Err(RuntimeError::NotLeader {
                lease: self.key.to_string(),
            }),
        }
    }

    /// Stops renewing and, if held, deletes the entry so a standby takes
    /// over at once rather than after the TTL. Later calls do nothing.
    pub async fn release(&self) {
        self.stop.cancel();
        let Some(keeper) = self.keeper.lock().await.take() else {
            return;
        };
        let Ok(Some(revision)) = keeper.await else {
            return;
        };
        match tokio::time::timeout(
            WRITE_TIMEOUT,
            self.bucket.purge_expect_revision(self.key, Some(revision)),
        )
        .await
        {
            Ok(Ok(())) => {
                self.metrics
                    .lease_transitions
                    .with_label_values(&[self.key, "released"])
                    .inc();
                tracing::info!(lease = self.key, "lease released");
            }
            Ok(Err(err)) => {
                tracing::warn!(lease = self.key, error = %err, "cannot release the lease; it expires on its own")
            }
            Err(_) => tracing::warn!(
                lease = self.key,
                "releasing the lease timed out; it expires on its own"
            ),
        }
    }
}

struct Keeper {
    bucket: kv::Store,
    key: &'static str,
    holder: String,
    holding: watch::Sender<Holding>,
    metrics: RuntimeMetrics,
}

impl Keeper {
    /// Competes for the lease, then renews it until stopped (returning the
    /// revision to release) or until it is lost (returning None).
    async fn run(self, stop: CancellationToken, on_lost: CancellationToken) -> Option<u64> {
        let record = match serde_json::to_vec(&Record {
            holder: self.holder.clone(),
            started_at: chrono::Utc::now(),
        }) {
            Ok(record) => Bytes::from(record),
            Err(err) => {
                tracing::error!(lease = self.key, error = %err, "cannot encode the lease record");
                self.holding.send_replace(Holding::Gone);
                return None;
            }
        };
        let Some((token, mut revision, mut valid_until)) = self.acquire(&record, &stop).await
        else {
            self.holding.send_replace(Holding::Gone);
            return None;
        };
        loop {
            let renew_at = tokio::time::sleep(RENEW_EVERY);
            tokio::select! {
                _ = stop.cancelled() => {
                    self.holding.send_replace(Holding::Gone);
                    self.metrics.lease_held.with_label_values(&[self.key]).set(0);
                    return Some(revision);
                }
                _ = renew_at => {}
            }
            let sent = Instant::now();
            let renewed = tokio::time::timeout(
                WRITE_TIMEOUT,
                self.bucket.update(self.key, record.clone(), revision),
            )
            .await;
            match renewed {
                Ok(Ok(next)) => {
                    revision = next;
                    valid_until = sent + LEASE_TTL - SAFETY_MARGIN;
                    self.holding
                        .send_replace(Holding::Held { token, valid_until });
                }
                Ok(Err(err)) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    return self.lost(&on_lost, "another replica holds it now");
                }
                Ok(Err(err)) if Instant::now() >= valid_until => {
                    return self.lost(
                        &on_lost,
                        &format!("renewals failed until it ran out: {err}"),
                    );
                }
                Err(_) if Instant::now() >= valid_until => {
                    return self.lost(&on_lost, "renewals timed out until it ran out");
                }
                Ok(Err(err)) => {
                    tracing::warn!(lease = self.key, error = %err, "lease renewal failed; retrying")
                }
                Err(_) => tracing::warn!(lease = self.key, "lease renewal timed out; retrying"),
            }
        }
    }

    /// Tries to create the entry until it succeeds (token, revision, valid
    /// until) or `stop` is cancelled.
    async fn acquire(
        &self,
        record: &Bytes,
        stop: &CancellationToken,
    ) -> Option<(u64, u64, Instant)> {
        loop {
            let sent = Instant::now();
            match tokio::time::timeout(WRITE_TIMEOUT, self.bucket.create(self.key, record.clone()))
                .await
            {
                Ok(Ok(revision)) => {
                    let valid_until = sent + LEASE_TTL - SAFETY_MARGIN;
                    self.holding.send_replace(Holding::Held {
                        token: revision,
                        valid_until,
                    });
                    self.metrics
                        .lease_held
                        .with_label_values(&[self.key])
                        .set(1);
                    self.metrics
                        .lease_transitions
                        .with_label_values(&[self.key, "acquired"])
                        .inc();
                    tracing::info!(lease = self.key, holder = %self.holder, token = revision, "lease acquired; this replica is active");
                    return Some((revision, revision, valid_until));
                }
                Ok(Err(err)) if err.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Ok(Err(err)) => {
                    tracing::warn!(lease = self.key, error = %err, "cannot try the lease; retrying")
                }
                Err(_) => tracing::warn!(lease = self.key, "trying the lease timed out; retrying"),
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(POLL_EVERY) => {}
            }
        }
    }

    fn lost(&self, on_lost: &CancellationToken, why: &str) -> Option<u64> {
        self.holding.send_replace(Holding::Gone);
        self.metrics
            .lease_held
            .with_label_values(&[self.key])
            .set(0);
        self.metrics
            .lease_transitions
            .with_label_values(&[self.key, "lost"])
            .inc();
        tracing::error!(
            lease = self.key,
            reason = why,
            "lease lost; shutting down so a restart comes back as a standby"
        );
        on_lost.cancel();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_gives_up_before_a_standby_can_take_over() {
        assert!(RENEW_EVERY * 2 < LEASE_TTL - SAFETY_MARGIN);
        assert!(SAFETY_MARGIN > Duration::ZERO);
        // A standby notices the expiry within a poll.
        assert!(LEASE_TTL + POLL_EVERY < Duration::from_secs(10));
    }
}
