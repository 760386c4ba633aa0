//! Reports from training workers, on `trainyard.worker.<kind>.<ns>.<trainingjob>`.
//! Any framework can publish these; the Python worker library (`sdk/python`) does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::subject::Family;

/// Environment variable with a worker's NATS token (its job's credentials,
/// issued by the planner): a worker connects with it as its NATS token when set.
pub const NATS_TOKEN_ENV: &str = "TRAINYARD_NATS_TOKEN";

/// Environment variable with the path of the CA bundle a worker verifies the
/// NATS server's certificate with (the installation's CA, from its job's
/// credentials); set when the workers' NATS URL is TLS.
pub const NATS_CA_FILE_ENV: &str = "TRAINYARD_NATS_CA_FILE";

/// Training progress of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgressReported {
    /// Rank of the reporting worker (0 is the one whose metrics count for status).
    pub worker_index: u32,
    /// Restart attempt of the job, from `TRAINYARD_ATTEMPT`; reports of older attempts are ignored.
    #[serde(default)]
    pub attempt: u32,
    /// Epochs completed so far.
    pub epoch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_epochs: Option<u32>,
    #[serde(default)]
    pub step: u64,
    /// Metric name → value, e.g. `loss`, `accuracy`; NaN and ±Infinity travel
    /// as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`.
    #[serde(
        default,
        deserialize_with = "crate::non_finite::deserialize_metrics",
        serialize_with = "crate::non_finite::serialize_metrics"
    )]
    pub metrics: BTreeMap<String, f64>,
}

/// A checkpoint a worker has written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointReported {
    pub worker_index: u32,
    #[serde(default)]
    pub attempt: u32,
    pub epoch: u32,
    #[serde(default)]
    pub step: u64,
    /// Where it was written, e.g. `s3://bucket/job/checkpoint-epoch-5` or `/checkpoints/epoch-5`.
    pub uri: String,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(
        default,
        deserialize_with = "crate::non_finite::deserialize_metrics",
        serialize_with = "crate::non_finite::serialize_metrics"
    )]
    pub metrics: BTreeMap<String, f64>,
    /// Seconds the save took, from its start to the manifest's write; feeds the
    /// checkpoint-manager's interval advice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_seconds: Option<f64>,
    /// How the worker verified the checkpoint complete before reporting it. Only
    /// counted for volumes the checkpoint-manager cannot read; on object stores
    /// (and volumes it reads) it checks the checkpoint itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_by: Option<VerificationMethod>,
    /// Whether that verification compared file checksums, not only sizes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checksums_verified: bool,
}

/// The completion marker that shows a checkpoint complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerificationMethod {
    /// `trainyard-manifest.json` (format `trainyard.checkpoint/v1`) with every
    /// listed file at its size and SHA-256.
    TrainyardManifest,
    /// PyTorch Distributed Checkpoint's `.metadata`.
    PytorchDcp,
    /// Orbax's `commit_success.txt` or its final (renamed) directory.
    Orbax,
}

crate::payload!(
    ProgressReported,
    "worker.progress",
    1,
    Family::Worker,
    "progress"
);
crate::payload!(
    CheckpointReported,
    "worker.checkpoint",
    1,
    Family::Worker,
    "checkpoint"
);
