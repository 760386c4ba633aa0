//! Reports from training workers, on `trainyard.worker.<kind>.<ns>.<trainingjob>`.
//! Any framework can publish these; the Python worker library (`sdk/python`) does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::subject::Family;

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
    /// Metric name → value, e.g. `loss`, `accuracy`.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

/// A checkpoint a worker has written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
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
