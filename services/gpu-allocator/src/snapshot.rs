//! The allocator's snapshot in the `trainyard_allocator` bucket, in chunks.
//!
//! At a few hundred nodes and jobs the snapshot outgrows NATS's default
//! `max_payload` (1 MiB), and a KV value is one message. So it is written as
//! chunks under `snapshot.<save>.<part>`, then a small manifest under `snapshot`
//! names the save: a crash between the two leaves the previous manifest and its
//! chunks intact. The previous save's chunks are purged after the manifest moves.
//!
//! Only the replica holding the allocator's lease writes, and the manifest
//! carries that lease's fencing token: a replica taking over claims the
//! manifest with its token (a compare-and-set on the manifest's revision),
//! and every later manifest write is a compare-and-set too, so a replica that
//! lost the lease cannot replace a snapshot, and its decisions are either in
//! the snapshot the new holder loaded or never published. Chunk keys carry
//! the token as well, so two holders never write the same chunk.
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
    /// The lease token of the replica that last wrote the manifest (0:
    /// written before leases).
    #[serde(default)]
    fencing_token: u64,
    /// The lease token the chunks were written under, part of their keys.
    #[serde(default)]
    chunks_token: u64,
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

impl Manifest {
    /// The middle of its chunk keys: `<save>`, or `<token>-<save>` once
    /// written under a lease.
    fn save_name(&self) -> String {
        match self.chunks_token {
            0 => self.chunked_save.to_string(),
            token => format!("{token}-{}", self.chunked_save),
        }
    }

    fn chunk_key(&self, part: u32) -> String {
        format!("{SNAPSHOT_KEY}.{}.{part}", self.save_name())
    }
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

fn fenced(token: u64) -> ServiceError {
    ServiceError::Fenced(format!(
        "the snapshot was written by a newer holder of the allocator lease than token {token}"
    ))
}

/// Reads and writes the snapshot.
pub struct SnapshotStore {
    bucket: kv::Store,
    current: Option<Manifest>,
    /// Revision of the manifest key as this store last read or wrote it
    /// (0: no snapshot yet); every manifest write expects it.
    revision: u64,
    /// The lease token this store writes under.
    token: u64,
}

impl SnapshotStore {
    /// Opens the store as the holder of lease token `token`, loads the saved
    /// state, if any, and claims the manifest with the token, so that a
    /// previous holder's later saves fail. Fails with `Fenced` when a newer
    /// holder wrote the snapshot.
    pub async fn open(
        bucket: kv::Store,
        token: u64,
    ) -> Result<(Self, Option<PersistedState>), ServiceError> {
        let mut store = Self {
            bucket,
            current: None,
            revision: 0,
            token,
        };
        loop {
            let Some(head) = store
                .bucket
                .entry(SNAPSHOT_KEY)
                .await
                .map_err(|e| store_error(&format!("get {SNAPSHOT_KEY}"), e))?
                .filter(|entry| entry.operation == kv::Operation::Put)
            else {
                return Ok((store, None));
            };
            store.revision = head.revision;
            let (bytes, manifest) = match serde_json::from_slice::<Manifest>(&head.value) {
                Ok(manifest) => {
                    if manifest.fencing_token > token {
                        return Err(fenced(token));
                    }
                    let stored = store.read_chunks(manifest).await?;
                    let bytes = match manifest.encoding {
                        Encoding::Json => stored,
                        Encoding::Lz4Json => lz4_flex::decompress_size_prepended(&stored)
                            .map_err(|e| unreadable(format!("LZ4: {e}")))?,
                    };
                    (bytes, Some(manifest))
                }
                // A snapshot saved whole, before chunking.
                Err(_) => (head.value.to_vec(), None),
            };
            let state = serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
            store.current = manifest;
            match manifest {
                Some(manifest) if manifest.fencing_token < token => {
                    let claimed = Manifest {
                        fencing_token: token,
                        ..manifest
                    };
                    match store.write_manifest(claimed).await {
                        Ok(()) => store.current = Some(claimed),
                        // A previous holder saved meanwhile: load its save.
                        Err(ServiceError::Fenced(_)) => continue,
                        Err(err) => return Err(err),
                    }
                }
                _ => {}
            }
            return Ok((store, Some(state)));
        }
    }

    /// Writes the manifest if the key is still at the revision this store
    /// knows; `Fenced` if another writer moved it.
    async fn write_manifest(&mut self, manifest: Manifest) -> Result<(), ServiceError> {
        let head = serde_json::to_vec(&manifest).map_err(|e| ServiceError::Store(e.to_string()))?;
        match self
            .bucket
            .update(SNAPSHOT_KEY, head.into(), self.revision)
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                Ok(())
            }
            Err(err) if err.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(fenced(self.token))
            }
            Err(err) => Err(store_error(&format!("put {SNAPSHOT_KEY}"), err)),
        }
    }

    async fn read_chunks(&self, manifest: Manifest) -> Result<Vec<u8>, ServiceError> {
        let mut bytes = Vec::with_capacity(manifest.size);
        for part in 0..manifest.parts {
            let key = manifest.chunk_key(part);
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
    /// old chunks go. Returns the bytes stored. Fails with `Fenced`, writing
    /// no manifest, when another holder wrote the manifest since.
    pub async fn save(&mut self, json: &[u8]) -> Result<usize, ServiceError> {
        let bytes = lz4_flex::compress_prepend_size(json);
        let mut manifest = Manifest {
            chunked_save: self.current.map_or(1, |m| m.chunked_save + 1),
            fencing_token: self.token,
            chunks_token: self.token,
            parts: 0,
            size: bytes.len(),
            encoding: Encoding::Lz4Json,
        };
        for chunk in bytes.chunks(CHUNK_BYTES) {
            let key = manifest.chunk_key(manifest.parts);
            self.bucket
                .put(&key, chunk.to_vec().into())
                .await
                .map_err(|e| store_error(&format!("put {key}"), e))?;
            manifest.parts += 1;
        }
        self.write_manifest(manifest).await?;
        if let Some(previous) = self.current.replace(manifest) {
            self.purge(previous).await;
        }
        Ok(bytes.len())
    }

    /// Removes a superseded save's chunks; a failure only leaves garbage behind,
    /// which the next start cleans up.
    async fn purge(&self, old: Manifest) {
        for part in 0..old.parts {
            let key = old.chunk_key(part);
            if let Err(err) = self.bucket.purge(&key).await {
                tracing::warn!(%key, error = %err, "cannot purge an old snapshot chunk");
            }
        }
    }

    /// Purges chunks no manifest names (left by a crash mid-save or a failed purge).
    pub async fn purge_orphans(&self) -> Result<usize, ServiceError> {
        let current = self.current.map(|m| m.save_name());
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
                .map(|(save, _)| save);
            if save.is_some_and(|save| current.as_deref() != Some(save)) {
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
