//! The cost-optimizer's state in the `trainyard_cost` bucket, one value per
//! [`Record`] (each job, node and queue, and the rest): a save writes the
//! values that changed since the last and purges those of objects gone, and
//! the lease holder loads every value the bucket lists when it starts.
//!
//! Earlier releases saved the state whole under `state`, one value of about
//! 680 bytes per job that outgrew NATS's 1 MiB message limit at about 1,500
//! jobs. A start that finds it writes it as records, then removes it; a
//! start interrupted in between does the same again from it.
//!
//! Only the holder of the cost-optimizer's lease writes, and every put and
//! purge first checks it still holds it ([`Lease::fence`]): a replica that
//! lost the lease stops writing before a standby can take it over and load.

use std::collections::BTreeMap;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use trainyard_runtime::Lease;

use crate::config::CostConfig;
use crate::error::CostServiceError;
use crate::state::{CostState, Record};

/// Key of the state saved whole by earlier releases.
pub const LEGACY_KEY: &str = "state";
/// Writes or reads in flight at once: after an accounting run every running
/// job's value changes, and a start reads every value.
const IN_FLIGHT: usize = 32;

/// What one save wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub puts: usize,
    pub purges: usize,
    pub bytes: usize,
}

/// The saved state's values, as this replica last wrote or read them.
pub struct StateStore {
    bucket: kv::Store,
    lease: Lease,
    /// What each key holds.
    saved: BTreeMap<String, Bytes>,
    /// Values a failed save did not write (None: to purge); the next save
    /// writes them unless it has newer ones.
    pending: BTreeMap<String, Option<Bytes>>,
}

fn store_error(action: &str, error: impl std::fmt::Display) -> CostServiceError {
    CostServiceError::Store(format!("{action}: {error}"))
}

fn unreadable(key: &str, error: impl std::fmt::Display) -> CostServiceError {
    CostServiceError::Store(format!(
        "value {key} is unreadable ({error}); refusing to start without it, since the \
         costs and decisions it holds would be lost. Delete the key to start that job, \
         node or queue over"
    ))
}

impl StateStore {
    pub fn new(bucket: kv::Store, lease: Lease) -> Self {
        Self {
            bucket,
            lease,
            saved: BTreeMap::new(),
            pending: BTreeMap::new(),
        }
    }

    /// The saved state, None when the bucket holds none.
    pub async fn load(
        &mut self,
        config: &CostConfig,
    ) -> Result<Option<CostState>, CostServiceError> {
        let keys: Vec<String> = self
            .bucket
            .keys()
            .await
            .map_err(|e| store_error("list keys", e))?
            .try_collect()
            .await
            .map_err(|e| store_error("list keys", e))?;
        if keys.iter().any(|k| k == LEGACY_KEY) {
            return self.migrate(keys, config).await.map(Some);
        }
        if keys.is_empty() {
            return Ok(None);
        }
        let bucket = &self.bucket;
        let values: Vec<(String, Result<Option<Bytes>, kv::EntryError>)> =
            futures::stream::iter(keys)
                .map(|key| async move {
                    let value = bucket.get(&key).await;
                    (key, value)
                })
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
        let mut records = Vec::with_capacity(values.len());
        for (key, value) in values {
            // Purged since the listing: nothing of it to load.
            let Some(bytes) = value.map_err(|e| store_error(&format!("get {key}"), e))? else {
                continue;
            };
            let record: Record<'static> =
                serde_json::from_slice(&bytes).map_err(|e| unreadable(&key, e))?;
            records.push(record);
            self.saved.insert(key, bytes);
        }
        Ok(Some(CostState::from_records(records, config.clone())))
    }

    /// Loads the state saved whole under [`LEGACY_KEY`], saves it as
    /// records (replacing any an interrupted migration left) and removes it.
    async fn migrate(
        &mut self,
        keys: Vec<String>,
        config: &CostConfig,
    ) -> Result<CostState, CostServiceError> {
        let whole = self
            .bucket
            .get(LEGACY_KEY)
            .await
            .map_err(|e| store_error(&format!("get {LEGACY_KEY}"), e))?
            .ok_or_else(|| store_error(&format!("get {LEGACY_KEY}"), "purged while starting"))?;
        let state = CostState::restore(
            serde_json::from_slice(&whole).map_err(|e| unreadable(LEGACY_KEY, e))?,
            config.clone(),
        );
        let values = state
            .values()
            .map_err(|e| store_error("encode the state", e))?;
        // Whatever else the bucket holds is rewritten from the whole state
        // or purged: an empty value never equals an encoded one.
        let mut changes: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        for key in keys.into_iter().filter(|k| k != LEGACY_KEY) {
            if !values.contains_key(&key) {
                changes.push((key.clone(), None));
            }
            self.saved.insert(key, Bytes::new());
        }
        changes.extend(values.into_iter().map(|(k, v)| (k, Some(v))));
        let written = self.save(changes).await?;
        self.lease.fence()?;
        self.bucket
            .purge(LEGACY_KEY)
            .await
            .map_err(|e| store_error(&format!("purge {LEGACY_KEY}"), e))?;
        tracing::info!(
            values = written.puts,
            bytes = whole.len(),
            "the state saved whole by an earlier release is now saved as one value per job, node and queue"
        );
        Ok(state)
    }

    /// Writes the values of `changes` that differ from what their keys hold
    /// and purges the keys whose value is None, after any a failed save left.
    /// Fails if any write failed; those are kept for the next save.
    pub async fn save(
        &mut self,
        changes: impl IntoIterator<Item = (String, Option<Vec<u8>>)>,
    ) -> Result<Written, CostServiceError> {
        for (key, value) in changes {
            self.pending.insert(key, value.map(Bytes::from));
        }
        let saved = &self.saved;
        let work: Vec<(String, Option<Bytes>)> = std::mem::take(&mut self.pending)
            .into_iter()
            .filter(|(key, value)| match value {
                Some(value) => saved.get(key) != Some(value),
                None => saved.contains_key(key),
            })
            .collect();
        let (bucket, lease) = (&self.bucket, &self.lease);
        let results: Vec<(String, Option<Bytes>, Result<(), CostServiceError>)> =
            futures::stream::iter(work)
                .map(|(key, value)| async move {
                    let result = write(bucket, lease, &key, value.clone()).await;
                    (key, value, result)
                })
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
        let mut written = Written::default();
        let mut failures = 0;
        let mut first_failure = None;
        for (key, value, result) in results {
            match (result, value) {
                (Ok(()), Some(value)) => {
                    written.puts += 1;
                    written.bytes += value.len();
                    self.saved.insert(key, value);
                }
                (Ok(()), None) => {
                    written.purges += 1;
                    self.saved.remove(&key);
                }
                (Err(err), value) => {
                    failures += 1;
                    first_failure.get_or_insert(err);
                    self.pending.insert(key, value);
                }
            }
        }
        match first_failure {
            None => Ok(written),
            Some(err) => Err(CostServiceError::Store(format!(
                "{failures} values not saved, to be retried: {err}"
            ))),
        }
    }
}

/// One put (Some) or purge (None), if this replica holds the lease.
async fn write(
    bucket: &kv::Store,
    lease: &Lease,
    key: &str,
    value: Option<Bytes>,
) -> Result<(), CostServiceError> {
    lease.fence()?;
    match value {
        Some(value) => bucket
            .put(key, value)
            .await
            .map(|_| ())
            .map_err(|e| store_error(&format!("put {key}"), e)),
        None => bucket
            .purge(key)
            .await
            .map_err(|e| store_error(&format!("purge {key}"), e)),
    }
}
