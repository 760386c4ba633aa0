//! Whether a checkpoint is complete, judged from what its directory (or object
//! prefix) holds. A checkpoint counts as *verified* only when the completion
//! marker of its format is there and, for Trainyard's manifest, every listed
//! file has its size (and, where checksums were computed, its SHA-256).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::manifest::{MANIFEST_FILE, Manifest};

/// PyTorch Distributed Checkpoint writes `.metadata` after every shard.
pub const DCP_MARKER: &str = ".metadata";
/// Orbax writes `commit_success.txt` once a checkpoint is committed (on object
/// stores; on file systems it renames the temporary directory instead).
pub const ORBAX_MARKER: &str = "commit_success.txt";
/// Part of the name of Orbax's temporary directory, renamed away on commit.
pub const ORBAX_TEMPORARY: &str = ".orbax-checkpoint-tmp-";

/// The completion marker that showed a checkpoint complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// `trainyard-manifest.json`, with every listed file's size (and checksum) checked.
    TrainyardManifest,
    /// PyTorch DCP's `.metadata`.
    PytorchDcp,
    /// Orbax's `commit_success.txt`, or its final (renamed) directory.
    Orbax,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::TrainyardManifest => "trainyard-manifest",
            Method::PytorchDcp => "pytorch-dcp",
            Method::Orbax => "orbax",
        }
    }
}

/// Who checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verifier {
    /// The checkpoint-manager read the storage itself.
    Manager,
    /// The worker-side reporter checked before reporting (volumes the manager cannot reach).
    Worker,
}

/// What is known about a checkpoint's completeness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Verification {
    /// Reported, not checked yet (the storage could not be read so far).
    Pending,
    /// Complete.
    Verified {
        method: Method,
        verifier: Verifier,
        /// Whether file checksums were compared (not just sizes).
        checksums: bool,
    },
    /// Not complete, or not what the report said; never resumed from.
    Incomplete { reason: String },
}

impl Verification {
    pub fn is_verified(&self) -> bool {
        matches!(self, Verification::Verified { .. })
    }
}

/// Relative path → size in bytes of every file under a checkpoint.
pub type Listing = BTreeMap<String, u64>;

/// The files whose SHA-256 the adapter should compute before [`judge`]: those
/// the manifest lists and the listing holds at the listed size (a missing or
/// short file already fails verification, so hashing it would be wasted).
pub fn files_to_hash<'m>(manifest: &'m Manifest, listing: &Listing) -> Vec<&'m str> {
    manifest
        .files
        .iter()
        .filter(|file| listing.get(&file.path) == Some(&file.size_bytes))
        .map(|file| file.path.as_str())
        .collect()
}

/// What the report says the checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub step: u64,
    pub epoch: u32,
}

/// Judges a checkpoint from its listing, its parsed manifest (when the listing
/// holds one) and the digests computed for [`files_to_hash`] (`None` when
/// checksums are not checked). `name` is the checkpoint's last path segment.
pub fn judge(
    name: &str,
    listing: &Listing,
    manifest: Option<&Manifest>,
    digests: Option<&BTreeMap<String, String>>,
    expected: Expected,
) -> Verification {
    let incomplete = |reason: String| Verification::Incomplete { reason };
    if listing.contains_key(MANIFEST_FILE) {
        let Some(manifest) = manifest else {
            return incomplete(format!("{MANIFEST_FILE} is present but was not read"));
        };
        if manifest.step != expected.step || manifest.epoch != expected.epoch {
            return incomplete(format!(
                "{MANIFEST_FILE} is for step {} epoch {}, the report for step {} epoch {}",
                manifest.step, manifest.epoch, expected.step, expected.epoch
            ));
        }
        for file in &manifest.files {
            match listing.get(&file.path) {
                None => {
                    return incomplete(format!(
                        "{} listed in {MANIFEST_FILE} is missing",
                        file.path
                    ));
                }
                Some(&size) if size != file.size_bytes => {
                    return incomplete(format!(
                        "{} is {size} bytes, {MANIFEST_FILE} says {}",
                        file.path, file.size_bytes
                    ));
                }
                Some(_) => {}
            }
            if let Some(digests) = digests {
                match digests.get(&file.path) {
                    None => {
                        return incomplete(format!("{} was not checksummed", file.path));
                    }
                    Some(digest) if !digest.eq_ignore_ascii_case(&file.sha256) => {
                        return incomplete(format!(
                            "{} has SHA-256 {digest}, {MANIFEST_FILE} says {}",
                            file.path, file.sha256
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        return Verification::Verified {
            method: Method::TrainyardManifest,
            verifier: Verifier::Manager,
            checksums: digests.is_some(),
        };
    }
    if listing.contains_key(DCP_MARKER) {
        return Verification::Verified {
            method: Method::PytorchDcp,
            verifier: Verifier::Manager,
            checksums: false,
        };
    }
    if name.contains(ORBAX_TEMPORARY) {
        return incomplete(format!(
            "{name} is an Orbax temporary directory (not yet renamed on commit)"
        ));
    }
    if listing.contains_key(ORBAX_MARKER) {
        return Verification::Verified {
            method: Method::Orbax,
            verifier: Verifier::Manager,
            checksums: false,
        };
    }
    if listing.is_empty() {
        return incomplete("nothing is stored there".to_string());
    }
    incomplete(format!(
        "no completion marker ({MANIFEST_FILE}, PyTorch DCP {DCP_MARKER} or Orbax {ORBAX_MARKER}) among its {} files",
        listing.len()
    ))
}

/// The worker-side reporter's word for a checkpoint on a volume the manager
/// cannot read: verified by the method it names, or not verified at all.
pub fn reported_by_worker(method: Option<Method>, checksums: bool) -> Verification {
    match method {
        Some(method) => Verification::Verified {
            method,
            verifier: Verifier::Worker,
            checksums,
        },
        None => Verification::Incomplete {
            reason: "the worker reported it without saying how it verified it (verifiedBy), and the checkpoint-manager cannot read this storage".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{MANIFEST_FORMAT, ManifestFile};

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    const AT: Expected = Expected { step: 10, epoch: 1 };

    fn manifest() -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT.to_string(),
            step: 10,
            epoch: 1,
            created_at: chrono::DateTime::UNIX_EPOCH,
            files: vec![ManifestFile {
                path: "model.pt".into(),
                size_bytes: 4,
                sha256: SHA.into(),
            }],
            metrics: BTreeMap::new(),
        }
    }

    fn listing(files: &[(&str, u64)]) -> Listing {
        files.iter().map(|(p, s)| (p.to_string(), *s)).collect()
    }

    #[test]
    fn a_manifest_with_every_file_at_its_size_and_checksum_verifies() {
        let files = listing(&[("model.pt", 4), (MANIFEST_FILE, 200)]);
        let m = manifest();
        assert_eq!(files_to_hash(&m, &files), vec!["model.pt"]);
        let digests = BTreeMap::from([("model.pt".to_string(), SHA.to_uppercase())]);
        assert_eq!(
            judge("ckpt-10", &files, Some(&m), Some(&digests), AT),
            Verification::Verified {
                method: Method::TrainyardManifest,
                verifier: Verifier::Manager,
                checksums: true
            }
        );
        assert!(judge("ckpt-10", &files, Some(&m), None, AT).is_verified());
    }

    #[test]
    fn missing_short_or_corrupt_files_and_foreign_manifests_are_incomplete() {
        let m = manifest();
        let reason = |v: Verification| match v {
            Verification::Incomplete { reason } => reason,
            other => panic!("expected incomplete, got {other:?}"),
        };
        let missing = listing(&[(MANIFEST_FILE, 200)]);
        assert!(reason(judge("c", &missing, Some(&m), None, AT)).contains("missing"));
        let short = listing(&[("model.pt", 3), (MANIFEST_FILE, 200)]);
        assert!(files_to_hash(&m, &short).is_empty());
        assert!(reason(judge("c", &short, Some(&m), None, AT)).contains("3 bytes"));
        let whole = listing(&[("model.pt", 4), (MANIFEST_FILE, 200)]);
        let wrong = BTreeMap::from([("model.pt".to_string(), "0".repeat(64))]);
        assert!(reason(judge("c", &whole, Some(&m), Some(&wrong), AT)).contains("SHA-256"));
        let later = Expected { step: 20, epoch: 2 };
        assert!(reason(judge("c", &whole, Some(&m), None, later)).contains("step 20"));
        assert!(reason(judge("c", &whole, None, None, AT)).contains("not read"));
    }

    #[test]
    fn framework_markers_verify_and_their_absence_does_not() {
        let dcp = listing(&[("__0_0.distcp", 100), (DCP_MARKER, 10)]);
        assert!(matches!(
            judge("step-10", &dcp, None, None, AT),
            Verification::Verified {
                method: Method::PytorchDcp,
                ..
            }
        ));
        let orbax = listing(&[("state/array", 100), (ORBAX_MARKER, 0)]);
        assert!(matches!(
            judge("10", &orbax, None, None, AT),
            Verification::Verified {
                method: Method::Orbax,
                ..
            }
        ));
        let tmp = judge("10.orbax-checkpoint-tmp-1700000000", &orbax, None, None, AT);
        assert!(!tmp.is_verified());
        let shards_only = listing(&[("__0_0.distcp", 100)]);
        assert!(!judge("step-10", &shards_only, None, None, AT).is_verified());
        assert!(!judge("step-10", &Listing::new(), None, None, AT).is_verified());
    }

    #[test]
    fn the_worker_must_say_how_it_verified() {
        assert!(reported_by_worker(Some(Method::TrainyardManifest), true).is_verified());
        assert!(!reported_by_worker(None, false).is_verified());
    }
}
