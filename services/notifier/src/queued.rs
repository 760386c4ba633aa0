//! "Queued too long": each job's wait is a key `q.<namespace>.<name>` in the
//! outbox bucket, folded from the messages with compare-and-set (replicas
//! share the consumers). Every replica watches those keys and, when a wait
//! passes a destination's threshold, writes the notification into the outbox
//! like any event (create-if-absent under an id derived from the job, attempt
//! and start of the wait), then records the destination as told in the wait.
//! A restart or a second replica finds the entry or the record and adds
//! nothing; the dispatcher sends it once.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use notifier_core::queued::{self, QueueWait, WaitObservation};
use tokio_util::sync::CancellationToken;
use trainyard_contracts::EntityRef;

use crate::live::LiveConfig;
use crate::outbox::{EntryState, Outbox, OutboxEntry, entry_key};

pub const WAIT_PREFIX: &str = "q.";

/// Attempts of one compare-and-set before the message is handed back for redelivery.
const CAS_ATTEMPTS: usize = 5;

/// The bucket keeps a value for a day; a wait still open after half of that is written again.
const REFRESH_AFTER_SECONDS: i64 = 12 * 3600;

/// `q.<namespace>.<name>`: both are DNS names, valid KV key characters.
pub fn wait_key(job: &EntityRef) -> String {
    format!("{WAIT_PREFIX}{}.{}", job.namespace, job.name)
}

#[derive(Clone)]
pub struct Waits {
    pub outbox: Outbox,
}

impl Waits {
    /// Folds one observation into the job's wait, retrying lost races.
    pub async fn observe(
        &self,
        job: &EntityRef,
        observation: &WaitObservation,
        at: chrono::DateTime<Utc>,
    ) -> Result<(), String> {
        let key = wait_key(job);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self
                .outbox
                .store
                .entry(&key)
                .await
                .map_err(|err| format!("read {key}: {err}"))?;
            let (previous, revision) = match entry {
                Some(entry) if entry.operation == Operation::Put => {
                    match serde_json::from_slice::<QueueWait>(&entry.value) {
                        Ok(wait) => (Some(wait), Some(entry.revision)),
                        Err(err) => {
                            tracing::warn!(%key, error = %err, "unreadable wait replaced");
                            (None, Some(entry.revision))
                        }
                    }
                }
                Some(entry) => (None, Some(entry.revision)),
                None => (None, None),
            };
            let Some(next) = queued::observe(previous.as_ref(), job, observation, at) else {
                return Ok(());
            };
            if self.write(&key, &next, revision).await? {
                return Ok(());
            }
        }
        Err(format!(
            "{key}: changed by others {CAS_ATTEMPTS} times in a row"
        ))
    }

    /// Writes `wait` if the key is still at `revision` (None: absent); false when another wrote first.
    async fn write(
        &self,
        key: &str,
        wait: &QueueWait,
        revision: Option<u64>,
    ) -> Result<bool, String> {
        let body = Bytes::from(serde_json::to_vec(wait).map_err(|err| err.to_string())?);
        let store = &self.outbox.store;
        match revision {
            Some(revision) => match store.update(key, body, revision).await {
                Ok(_) => Ok(true),
                Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(false),
                Err(err) => Err(format!("update {key}: {err}")),
            },
            None => match store.create(key, body).await {
                Ok(_) => Ok(true),
                Err(err) if err.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(err) => Err(format!("create {key}: {err}")),
            },
        }
    }

    /// Watches the waits and writes the notifications that fall due, until shutdown.
    pub async fn run(self, live: LiveConfig, every: Duration, shutdown: CancellationToken) {
        let watch_from_start = || async {
            loop {
                match self
                    .outbox
                    .store
                    .watch_with_history(format!("{WAIT_PREFIX}>"))
                    .await
                {
                    Ok(watch) => return Some(watch),
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot watch the queued jobs; retrying");
                        tokio::select! {
                            _ = shutdown.cancelled() => return None,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
            }
        };
        let Some(mut watch) = watch_from_start().await else {
            return;
        };
        // key → (wait, revision, when it was written, in seconds)
        let mut waits: HashMap<String, (QueueWait, u64, i64)> = HashMap::new();
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                update = watch.next() => {
                    match update {
                        Some(Ok(entry)) => track(&mut waits, entry),
                        Some(Err(err)) => {
                            tracing::warn!(error = %err, "queued-jobs watch error; watching anew");
                            let Some(fresh) = watch_from_start().await else { return };
                            watch = fresh;
                        }
                        None => {
                            let Some(fresh) = watch_from_start().await else { return };
                            watch = fresh;
                        }
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            let routing = live.get().routing.clone();
            let now = Utc::now();
            // The bucket drops a closed wait after a day without telling watchers.
            waits.retain(|_, (wait, _, written)| {
                wait.is_waiting() || now.timestamp() - *written < 2 * REFRESH_AFTER_SECONDS
            });
            for (key, (wait, revision, written)) in &waits {
                if !wait.is_waiting() {
                    continue;
                }
                let owed = queued::due(wait, &routing, now);
                let refresh = now.timestamp() - written > REFRESH_AFTER_SECONDS;
                if owed.notify.is_empty() && !refresh {
                    continue;
                }
                let mut told = wait.clone();
                for (routed, event) in owed.notify {
                    let destination = routed.destination.key();
                    let entry = OutboxEntry {
                        routed,
                        event,
                        state: EntryState::Pending,
                        stored_at: now,
                    };
                    let entry_key = entry_key(&entry.routed, &entry.event.id);
                    match self.outbox.create(&entry_key, &entry).await {
                        Ok(created) => {
                            if created {
                                tracing::info!(job = %wait.job.key(), %destination, "queued too long");
                            }
                            told.notified.insert(destination);
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "cannot store the queued-too-long notification; trying again")
                        }
                    }
                }
                // A lost race means another replica wrote; the watch brings its version.
                if let Err(err) = self.write(key, &told, Some(*revision)).await {
                    tracing::warn!(%key, error = %err, "cannot record the queued-too-long notification");
                }
            }
        }
    }
}

fn track(waits: &mut HashMap<String, (QueueWait, u64, i64)>, entry: kv::Entry) {
    if matches!(entry.operation, Operation::Delete | Operation::Purge) {
        waits.remove(&entry.key);
        return;
    }
    match serde_json::from_slice::<QueueWait>(&entry.value) {
        Ok(wait) => {
            let written = entry.created.unix_timestamp();
            waits.insert(entry.key, (wait, entry.revision, written));
        }
        Err(err) => tracing::warn!(key = %entry.key, error = %err, "unreadable wait ignored"),
    }
}
