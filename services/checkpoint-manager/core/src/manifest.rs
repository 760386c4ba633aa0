//! Trainyard's completion marker: `trainyard-manifest.json`, written last inside
//! the checkpoint directory (or object prefix). Other tools write it too, so its
//! shape is a public format:
//!
//! ```json
//! {"format": "trainyard.checkpoint/v1", "step": 1200, "epoch": 3,
//!  "createdAt": "2026-11-21T10:00:00Z",
//!  "files": [{"path": "model.pt", "sizeBytes": 1048576, "sha256": "9f86d0..."}],
//!  "metrics": {"loss": 0.41}}
//! ```

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::CoreError;

/// Name of the manifest inside a checkpoint.
pub const MANIFEST_FILE: &str = "trainyard-manifest.json";
/// The `format` value of this version of the manifest.
pub const MANIFEST_FORMAT: &str = "trainyard.checkpoint/v1";

/// The manifest of one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub step: u64,
    pub epoch: u32,
    pub created_at: DateTime<Utc>,
    /// Every file of the checkpoint but the manifest itself.
    pub files: Vec<ManifestFile>,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

/// One file of a checkpoint, relative to the checkpoint's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestFile {
    pub path: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the file's content.
    pub sha256: String,
}

impl Manifest {
    /// Parses and checks a manifest: its format, relative file paths inside the
    /// checkpoint, 64-digit hex checksums, no file listed twice.
    pub fn parse(bytes: &[u8]) -> Result<Self, CoreError> {
        let invalid = |message: String| CoreError::InvalidManifest {
            file: MANIFEST_FILE,
            message,
        };
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|err| invalid(err.to_string()))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(invalid(format!(
                "format is {:?}; this reader knows {MANIFEST_FORMAT:?}",
                manifest.format
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (index, file) in manifest.files.iter().enumerate() {
            if let Some(problem) = path_problem(&file.path) {
                return Err(invalid(format!(
                    "files[{index}].path {:?} {problem}",
                    file.path
                )));
            }
            if file.path == MANIFEST_FILE {
                return Err(invalid(format!(
                    "files[{index}] lists the manifest itself; list only the checkpoint's other files"
                )));
            }
            if file.sha256.len() != 64 || !file.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(format!(
                    "files[{index}].sha256 must be 64 hex digits, got {:?}",
                    file.sha256
                )));
            }
            if !seen.insert(file.path.as_str()) {
                return Err(invalid(format!(
                    "files[{index}].path {:?} is listed twice",
                    file.path
                )));
            }
        }
        Ok(manifest)
    }

    /// Bytes of every file the manifest lists.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size_bytes).sum()
    }
}

fn path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("is empty");
    }
    if path.starts_with('/') || path.contains('\\') {
        return Some("must be relative to the checkpoint, with / separators");
    }
    if path
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Some("must stay inside the checkpoint (no empty, . or .. parts)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn manifest(files: &str) -> String {
        format!(
            r#"{{"format":"trainyard.checkpoint/v1","step":1200,"epoch":3,"createdAt":"2026-11-21T10:00:00Z","files":{files},"metrics":{{"loss":0.41}}}}"#
        )
    }

    #[test]
    fn parses_the_documented_shape() {
        let text = manifest(&format!(
            r#"[{{"path":"model/part-0.bin","sizeBytes":4,"sha256":"{SHA}"}}]"#
        ));
        let parsed = Manifest::parse(text.as_bytes()).expect("valid");
        assert_eq!(parsed.step, 1200);
        assert_eq!(parsed.files[0].path, "model/part-0.bin");
        assert_eq!(parsed.total_bytes(), 4);
        assert_eq!(parsed.metrics["loss"], 0.41);
    }

    #[test]
    fn refuses_paths_outside_the_checkpoint_bad_checksums_and_other_formats() {
        for (files, why) in [
            (
                format!(r#"[{{"path":"../x","sizeBytes":1,"sha256":"{SHA}"}}]"#),
                "inside",
            ),
            (
                format!(r#"[{{"path":"/etc/x","sizeBytes":1,"sha256":"{SHA}"}}]"#),
                "relative",
            ),
            (
                r#"[{"path":"x","sizeBytes":1,"sha256":"abc"}]"#.to_string(),
                "64 hex",
            ),
            (
                format!(
                    r#"[{{"path":"x","sizeBytes":1,"sha256":"{SHA}"}},{{"path":"x","sizeBytes":1,"sha256":"{SHA}"}}]"#
                ),
                "twice",
            ),
            (
                format!(r#"[{{"path":"trainyard-manifest.json","sizeBytes":1,"sha256":"{SHA}"}}]"#),
                "itself",
            ),
        ] {
            let err = Manifest::parse(manifest(&files).as_bytes()).expect_err(why);
            assert!(err.to_string().contains(why), "{err}");
        }
        let other = manifest("[]").replace("trainyard.checkpoint/v1", "trainyard.checkpoint/v9");
        let err = Manifest::parse(other.as_bytes()).expect_err("unknown format");
        assert!(err.to_string().contains("trainyard.checkpoint/v9"), "{err}");
    }
}
