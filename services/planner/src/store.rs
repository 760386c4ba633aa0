//! Per-job planner state in the `trainyard_planner` KV bucket, so a restarted planner
//! (or another replica) continues where the last one stopped. Every write is a
//! compare-and-set on the revision last read or written: a replica that lost
//! the lease cannot overwrite state the new active replica wrote, and the new
//! one re-reads rather than overwrite what it has not seen.

use async_nats::jetstream::kv;
use planner_core::PlannerJobState;

use crate::error::PlannerError;

#[derive(Clone)]
pub struct StateStore {
    bucket: kv::Store,
}

impl StateStore {
    pub fn new(bucket: kv::Store) -> Self {
        Self { bucket }
    }

    /// The stored state and its revision (0: never stored, or purged with
    /// no marker left).
    pub async fn load(&self, key: &str) -> Result<(Option<PlannerJobState>, u64), PlannerError> {
        let Some(entry) = self
            .bucket
            .entry(key)
            .await
            .map_err(|e| PlannerError::Store(format!("get {key}: {e}")))?
        else {
            return Ok((None, 0));
        };
        if entry.operation != kv::Operation::Put {
            return Ok((None, entry.revision));
        }
        match serde_json::from_slice(&entry.value) {
            Ok(state) => Ok((Some(state), entry.revision)),
            Err(err) => {
                // A state written by an incompatible build: start over from the
                // cluster's facts rather than wedge the job.
                tracing::warn!(%key, error = %err, "discarding unreadable planner state");
                Ok((None, entry.revision))
            }
        }
    }

    pub fn encode(key: &str, state: &PlannerJobState) -> Result<Vec<u8>, PlannerError> {
        serde_json::to_vec(state).map_err(|e| PlannerError::Store(format!("encode {key}: {e}")))
    }

    /// Stores an encoded state (see `encode`) if the key is still at
    /// `revision` (0: absent or deleted); returns the new revision, or
    /// `StateConflict` when someone else wrote it since.
    pub async fn put(&self, key: &str, bytes: Vec<u8>, revision: u64) -> Result<u64, PlannerError> {
        let conflict = || {
            PlannerError::StateConflict(format!(
                "{key} changed since revision {revision}; reloading"
            ))
        };
        if revision == 0 {
            // `create` also succeeds over a delete or purge marker.
            return self.bucket.create(key, bytes.into()).await.map_err(|e| {
                if e.kind() == kv::CreateErrorKind::AlreadyExists {
                    conflict()
                } else {
                    PlannerError::Store(format!("put {key}: {e}"))
                }
            });
        }
        self.bucket
            .update(key, bytes.into(), revision)
            .await
            .map_err(|e| {
                if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
                    conflict()
                } else {
                    PlannerError::Store(format!("put {key}: {e}"))
                }
            })
    }

    pub async fn delete(&self, key: &str) -> Result<(), PlannerError> {
        self.bucket
            .purge(key)
            .await
            .map_err(|e| PlannerError::Store(format!("purge {key}: {e}")))
    }
}
