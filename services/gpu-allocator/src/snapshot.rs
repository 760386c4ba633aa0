//! The allocator's snapshot in the `trainyard_allocator` bucket, in chunks.
//!
//! At a few hundred nodes and jobs the snapshot outgrows NATS's default
//! `max_payload` (1 MiB), and a KV value is one message. So it is written as
//! chunks under `snapshot.<save>.<part>`, then a small manifest under `snapshot`
//! names the save: a crash between the two leaves the previous manifest and its
//! chunks intact. The previous save's chunks are purged after the manifest moves.
//!
//! The chunks hold the JSON compressed with LZ4 (block format, size first):
//! the state repeats its field names and labels, so a save is about a tenth
//! of its JSON, and nats-server stores and the allocator sends that much less
//! on every save (saves come with every cycle that decides something).

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;
use crate::persisted::PersistedState;

/// Key of the manifest (and, before chunking, of the whole snapshot).
pub const SNAPSHOT_KEY: &str = "snapshot";
/// Bytes per chunk: a quarter of NATS's default message limit.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// What the manifest records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    /// Counter of saves; names the chunk keys.
    chunked_save: u64,
    parts: u32,
    /// Bytes stored in the chunks.
    size: usize,
    /// How the chunks encode the JSON (saves from before compression have
    /// no such field).
    #[serde(default)]
    encoding: Encoding,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Encoding {
    #[default]
    Json,
    Lz4Json,
}

fn chunk_key(save: u64, part: u32) -> String {
    format!("{SNAPSHOT_KEY}.{save}.{part}")
}

fn store_error(action: &str, error: impl std::fmt::Display) -> ServiceError {
    ServiceError::Store(format!("{action}: {error}"))
}

fn unreadable(detail: String) -> ServiceError {
    ServiceError::Store(format!(
        "snapshot under {SNAPSHOT_KEY} is unreadable ({detail}); refusing to start without it, \
         since decisions made after it would be repeated. Delete the key only if every \
         admitted job is known to the planner"
    ))
}

/// Reads and writes the snapshot.
pub struct SnapshotStore {
    bucket: kv::Store,
    current: Option<Manifest>,
}

impl SnapshotStore {
    /// Opens the store and loads the saved state, if any.
    pub async fn open(bucket: kv::Store) -> Result<(Self, Option<PersistedState>), ServiceError> {
        let mut store = Self {
            bucket,
            current: None,
        };
        let Some(head) = store
            .bucket
            .get(SNAPSHOT_KEY)
            .await
            .map_err(|e| store_error(&format!("get {SNAPSHOT_KEY}"), e))?
        else {
            return Ok((store, None));
        };
        let bytes = match serde_json::from_slice::<Manifest>(&head) {
            Ok(manifest) => {
                let stored = store.read_chunks(manifest).await?;
                store.current = Some(manifest);
                match manifest.encoding {
                    Encoding::Json => stored,
                    Encoding::Lz4Json => lz4_flex::decompress_size_prepended(&stored)
                        .map_err(|e| unreadable(format!("LZ4: {e}")))?,
                }
            }
            // A snapshot saved whole, before chunking.
            Err(_) => head.to_vec(),
        };
        let state = serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
        Ok((store, Some(state)))
    }

    async fn read_chunks(&self, manifest: Manifest) -> Result<Vec<u8>, ServiceError> {
        let mut bytes = Vec::with_capacity(manifest.size);
        for part in 0..manifest.parts {
            let key = chunk_key(manifest.chunked_save, part);
            let chunk = self
                .bucket
                .get(&key)
                .await
                .map_err(|e| store_error(&format!("get {key}"), e))?
                .ok_or_else(|| unreadable(format!("chunk {key} is missing")))?;
            bytes.extend_from_slice(&chunk);
        }
        if bytes.len() != manifest.size {
            return Err(unreadable(format!(
                "{} bytes in {} chunks, the manifest says {}",
                bytes.len(),
                manifest.parts,
                manifest.size
            )));
        }
        Ok(bytes)
    }

    /// Saves `json` as the new snapshot: chunks, then the manifest, then the
    /// old chunks go. Returns the bytes stored.
    pub async fn save(&mut self, json: &[u8]) -> Result<usize, ServiceError> {
        let bytes = lz4_flex::compress_prepend_size(json);
        let save = self.current.map_or(1, |m| m.chunked_save + 1);
        let mut parts = 0u32;
        for chunk in bytes.chunks(CHUNK_BYTES) {
            let key = chunk_key(save, parts);
            self.bucket
                .put(&key, chunk.to_vec().into())
                .await
                .map_err(|e| store_error(&format!("put {key}"), e))?;
            parts += 1;
        }
        let manifest = Manifest {
            chunked_save: save,
            parts,
            size: bytes.len(),
            encoding: Encoding::Lz4Json,
        };
        let head = serde_json::to_vec(&manifest).map_err(|e| ServiceError::Store(e.to_string()))?;
        self.bucket
            .put(SNAPSHOT_KEY, head.into())
            .await
            .map_err(|e| store_error(&format!("put {SNAPSHOT_KEY}"), e))?;
        if let Some(previous) = self.current.replace(manifest) {
            self.purge(previous).await;
        }
        Ok(bytes.len())
    }

    /// Removes a superseded save's chunks; a failure only leaves garbage behind,
    /// which the next start cleans up.
    async fn purge(&self, old: Manifest) {
        for part in 0..old.parts {
            let key = chunk_key(old.chunked_save, part);
            if let Err(err) = self.bucket.purge(&key).await {
                tracing::warn!(%key, error = %err, "cannot purge an old snapshot chunk");
            }
        }
    }

    /// Purges chunks no manifest names (left by a crash mid-save or a failed purge).
    pub async fn purge_orphans(&self) -> Result<usize, ServiceError> {
        let current = self.current.map(|m| m.chunked_save);
        let mut keys = self
            .bucket
            .keys()
            .await
            .map_err(|e| store_error("list keys", e))?;
        let prefix = format!("{SNAPSHOT_KEY}.");
        let mut orphans = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| store_error("list keys", e))?;
            let save = key
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(save, _)| save.parse::<u64>().ok());
            if save.is_some_and(|save| Some(save) != current) {
                orphans.push(key);
            }
        }
        for key in &orphans {
            self.bucket
                .purge(key)
                .await
                .map_err(|e| store_error(&format!("purge {key}"), e))?;
        }
        Ok(orphans.len())
    }
}
