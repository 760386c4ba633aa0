//! The simulated workers' checkpoints, as real (small) files under one local
//! directory. A checkpoint is written as Trainyard's worker library writes one:
//! each file under a temporary name, renamed into place once flushed, and
//! `trainyard-manifest.json` (every file with its size and SHA-256) last, the
//! same way. A killed save leaves the files written so far, one of them cut
//! short under its temporary name, and no manifest.
//!
//! Where a checkpoint URI lives under the root: object-store URIs by scheme,
//! bucket and key (`s3://b/k` → `s3/b/k`, which the simulator also serves as an
//! S3 endpoint, see [`crate::object_storage`]); a volume path, as the worker
//! sees it at its mount, under its TrainingJob's own directory
//! (`/checkpoints/x` of `ml/bert` → `volumes/ml/bert/checkpoints/x`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use trainyard_contracts::hash::fnv1a_parts;

pub const MANIFEST_FILE: &str = "trainyard-manifest.json";
pub const MANIFEST_FORMAT: &str = "trainyard.checkpoint/v1";
/// A prefix, as the worker library's: a file under it is not part of a checkpoint yet.
pub const TEMP_PREFIX: &str = ".trainyard-tmp.";
/// Bytes of each model shard (one per rank) and of the optimizer state.
const SHARD_BYTES: usize = 4096;
const OPTIMIZER_BYTES: usize = 2048;

/// Why a checkpoint URI has no place under the root, or a save failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointFileError {
    #[error("checkpoint URI {uri:?} cannot be stored: {reason}")]
    Uri { uri: String, reason: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CheckpointFileError + '_ {
    move |source| CheckpointFileError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// One file of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
}

/// `trainyard-manifest.json`, as `docs/checkpoints.md` describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: String,
    pub step: u64,
    pub epoch: u32,
    pub created_at: String,
    pub files: Vec<ManifestFile>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

/// What one save is to hold.
#[derive(Debug, Clone)]
pub struct SavePlan<'a> {
    pub epoch: u32,
    pub step: u64,
    pub metrics: &'a BTreeMap<String, f64>,
    /// Ranks of the gang: one model shard each.
    pub workers: u32,
    /// Killed before finishing this file (an index into [`SavePlan::files`],
    /// or one past its end for the manifest), which is then left cut short
    /// under its temporary name.
    pub killed_at: Option<usize>,
}

impl SavePlan<'_> {
    /// The checkpoint's files, relative paths in the order they are written.
    pub fn files(&self) -> Vec<(String, Vec<u8>)> {
        let pattern = |seed: u64, len: usize| -> Vec<u8> {
            (0..len)
                .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64) % 251) as u8)
                .collect()
        };
        let mut files: Vec<(String, Vec<u8>)> = (0..self.workers.max(1))
            .map(|rank| {
                (
                    format!("model/part-{rank}.bin"),
                    pattern(self.step + u64::from(rank), SHARD_BYTES),
                )
            })
            .collect();
        files.push((
            "optimizer.bin".to_owned(),
            pattern(self.step, OPTIMIZER_BYTES),
        ));
        let state =
            serde_json::json!({"epoch": self.epoch, "step": self.step, "metrics": self.metrics});
        files.push((
            "trainer_state.json".to_owned(),
            state.to_string().into_bytes(),
        ));
        files
    }
}

/// What decides whether a save is killed (`checkpoints.killedSaveRate`).
#[derive(Debug, Clone, Copy)]
pub struct SaveDraw<'a> {
    pub seed: u64,
    pub rate: f64,
    pub namespace: &'a str,
    pub training_job: &'a str,
    pub attempt: u32,
    pub uri: &'a str,
}

/// Whether a save is killed, and before which of its `files` (the manifest
/// being the last): drawn from the seed, the job, the attempt and the URI
/// alone, so a run repeats whatever the order of the steps.
pub fn killed_save(draw: &SaveDraw<'_>, files: usize) -> Option<usize> {
    if draw.rate <= 0.0 || files == 0 {
        return None;
    }
    let key = fnv1a_parts(&[
        &draw.seed.to_le_bytes(),
        draw.namespace.as_bytes(),
        draw.training_job.as_bytes(),
        &draw.attempt.to_le_bytes(),
        draw.uri.as_bytes(),
    ]);
    let mut rng = StdRng::seed_from_u64(key);
    (rng.random::<f64>() < draw.rate).then(|| rng.random_range(0..files))
}

/// What a save left on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// Files renamed into place (the manifest included when complete).
    pub files: usize,
    /// Bytes of those files.
    pub size_bytes: u64,
    /// The manifest was written: the save finished.
    pub complete: bool,
}

fn sha256_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Writes `data` to `target` under a temporary name, flushes it and renames it
/// into place.
fn write_atomically(target: &Path, data: &[u8]) -> Result<(), CheckpointFileError> {
    let temp = temp_name(target);
    let mut file = fs::File::create(&temp).map_err(io_error(&temp))?;
    file.write_all(data).map_err(io_error(&temp))?;
    file.sync_all().map_err(io_error(&temp))?;
    fs::rename(&temp, target).map_err(io_error(target))
}

fn temp_name(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!("{TEMP_PREFIX}{name}"))
}

/// Saves a checkpoint into `dir`: every file, then the manifest, unless the
/// plan kills the save first.
pub fn save(
    dir: &Path,
    plan: &SavePlan<'_>,
    created_at: &str,
) -> Result<Saved, CheckpointFileError> {
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    // A manifest left by an earlier attempt at this epoch would vouch for files
    // about to be replaced.
    let manifest_path = dir.join(MANIFEST_FILE);
    match fs::remove_file(&manifest_path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => {
            return Err(io_error(&manifest_path)(err));
        }
        _ => {}
    }
    let files = plan.files();
    let manifest_index = files.len();
    let mut listed = Vec::new();
    let mut size_bytes = 0;
    for (index, (relative, data)) in files.into_iter().enumerate() {
        let target = dir.join(&relative);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        if plan.killed_at == Some(index) {
            let temp = temp_name(&target);
            fs::write(&temp, &data[..data.len() / 2]).map_err(io_error(&temp))?;
            return Ok(Saved {
                files: listed.len(),
                size_bytes,
                complete: false,
            });
        }
        write_atomically(&target, &data)?;
        size_bytes += data.len() as u64;
        listed.push(ManifestFile {
            path: relative,
            size_bytes: data.len() as u64,
            sha256: sha256_hex(&data),
        });
    }
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_owned(),
        step: plan.step,
        epoch: plan.epoch,
        created_at: created_at.to_owned(),
        files: listed,
        metrics: plan.metrics.clone(),
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointFileError::Io {
        path: manifest_path.display().to_string(),
        source: io::Error::other(e),
    })?;
    if plan.killed_at == Some(manifest_index) {
        let temp = temp_name(&manifest_path);
        fs::write(&temp, &text[..text.len() / 2]).map_err(io_error(&temp))?;
        return Ok(Saved {
            files: manifest.files.len(),
            size_bytes,
            complete: false,
        });
    }
    write_atomically(&manifest_path, &text)?;
    Ok(Saved {
        files: manifest.files.len() + 1,
        size_bytes: size_bytes + text.len() as u64,
        complete: true,
    })
}

/// Checks a checkpoint directory as the worker library's `read_checkpoint`
/// does: its manifest, and every listed file at its size and SHA-256. The
/// error says what is wrong, naming the file.
pub fn verify(dir: &Path) -> Result<Manifest, String> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match fs::read(&manifest_path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(format!("no {MANIFEST_FILE}: the save did not finish"));
        }
        Err(err) => return Err(format!("{MANIFEST_FILE}: {err}")),
    };
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| format!("{MANIFEST_FILE} is not valid: {e}"))?;
    if manifest.format != MANIFEST_FORMAT {
        return Err(format!(
            "{MANIFEST_FILE} has format {:?}, expected {MANIFEST_FORMAT:?}",
            manifest.format
        ));
    }
    for file in &manifest.files {
        let data = fs::read(dir.join(&file.path))
            .map_err(|e| format!("{} listed in {MANIFEST_FILE}: {e}", file.path))?;
        if data.len() as u64 != file.size_bytes {
            return Err(format!(
                "{} has {} bytes, {MANIFEST_FILE} says {}",
                file.path,
                data.len(),
                file.size_bytes
            ));
        }
        if sha256_hex(&data) != file.sha256 {
            return Err(format!(
                "{} does not match its SHA-256 in {MANIFEST_FILE}",
                file.path
            ));
        }
    }
    Ok(manifest)
}

/// Removes a checkpoint directory; one already gone is not an error.
pub fn delete(dir: &Path) -> Result<(), CheckpointFileError> {
    match fs::remove_dir_all(dir) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_error(dir)(err)),
        _ => Ok(()),
    }
}

/// The directory the simulated workers' checkpoints are kept under.
#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    root: PathBuf,
}

/// The parts of a relative path, refusing anything that would leave it.
fn plain_parts(path: &str) -> Option<Vec<&str>> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let plain = parts
        .iter()
        .all(|p| matches!(Path::new(p).components().next(), Some(Component::Normal(_))));
    plain.then_some(parts)
}

impl CheckpointStorage {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `uri` lives under the root (see the module's documentation);
    /// `namespace` and `training_job` place volume paths.
    pub fn local_path(
        &self,
        uri: &str,
        namespace: &str,
        training_job: &str,
    ) -> Result<PathBuf, CheckpointFileError> {
        let refuse = |reason| CheckpointFileError::Uri {
            uri: uri.to_owned(),
            reason,
        };
        let (base, rest) = if let Some((scheme, rest)) = uri.split_once("://") {
            if scheme == "file" {
                (
                    self.root.join("volumes").join(namespace).join(training_job),
                    rest,
                )
            } else if scheme
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && !scheme.is_empty()
            {
                (self.root.join(scheme), rest)
            } else {
                return Err(refuse("its scheme is not a plain word such as s3"));
            }
        } else if uri.starts_with('/') {
            (
                self.root.join("volumes").join(namespace).join(training_job),
                uri,
            )
        } else {
            return Err(refuse("it is neither an absolute path nor a URI"));
        };
        let parts = plain_parts(rest).ok_or_else(|| refuse("it has '.' or '..' segments"))?;
        if parts.is_empty() {
            return Err(refuse("it names no directory"));
        }
        Ok(parts.iter().fold(base, |path, part| path.join(part)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_map_by_scheme_and_volume_paths_by_job() {
        let storage = CheckpointStorage::new("/r");
        let cases = [
            (
                "s3://b/ml/bert/checkpoint-epoch-2",
                "/r/s3/b/ml/bert/checkpoint-epoch-2",
            ),
            ("gs://b/x", "/r/gs/b/x"),
            (
                "/checkpoints/checkpoint-epoch-2",
                "/r/volumes/ml/bert/checkpoints/checkpoint-epoch-2",
            ),
            ("file:///mnt/c", "/r/volumes/ml/bert/mnt/c"),
        ];
        for (uri, expected) in cases {
            let path = storage.local_path(uri, "ml", "bert").expect(uri);
            assert_eq!(path, PathBuf::from(expected), "{uri}");
        }
        for uri in [
            "/checkpoints/../../etc",
            "relative/path",
            "s3://",
            "S 3://b/k",
        ] {
            assert!(storage.local_path(uri, "ml", "bert").is_err(), "{uri}");
        }
    }
}
