//! Per-job planner state in the `trainyard_planner` KV bucket, so a restarted planner
//! (or another replica) continues where the last one stopped.

use async_nats::jetstream::kv;
use planner_core::PlannerJobState;
use trainyard_contracts::EntityRef;

use crate::error::PlannerError;

#[derive(Clone)]
pub struct StateStore {
    bucket: kv::Store,
}

/// KV key of a job: `<namespace>/<name>` (both are valid key characters).
pub fn key(entity: &EntityRef) -> String {
    format!("{}/{}", entity.namespace, entity.name)
}

impl StateStore {
    pub fn new(bucket: kv::Store) -> Self {
        Self { bucket }
    }

    pub async fn load(&self, key: &str) -> Result<Option<PlannerJobState>, PlannerError> {
        let Some(bytes) = self
            .bucket
            .get(key)
            .await
            .map_err(|e| PlannerError::Store(format!("get {key}: {e}")))?
        else {
            return Ok(None);
        };
        match serde_json::from_slice(&bytes) {
            Ok(state) => Ok(Some(state)),
            Err(err) => {
                // A state written by an incompatible build: start over from the
                // cluster's facts rather than wedge the job.
                tracing::warn!(%key, error = %err, "discarding unreadable planner state");
                Ok(None)
            }
        }
    }

    pub fn encode(key: &str, state: &PlannerJobState) -> Result<Vec<u8>, PlannerError> {
        serde_json::to_vec(state).map_err(|e| PlannerError::Store(format!("encode {key}: {e}")))
    }

    /// Stores an encoded state (see `encode`).
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), PlannerError> {
        self.bucket
            .put(key, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| PlannerError::Store(format!("put {key}: {e}")))
    }

    pub async fn delete(&self, key: &str) -> Result<(), PlannerError> {
        self.bucket
            .purge(key)
            .await
            .map_err(|e| PlannerError::Store(format!("purge {key}: {e}")))
    }
}
