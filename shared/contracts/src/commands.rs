//! Commands to running training, on `trainyard.commands.<kind>.<ns>.<trainingjob>`.
//! Workers subscribe to their own job's commands.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::subject::Family;

/// Write a checkpoint now (before preemption, a spot reclaim or a suspend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRequested {
    pub reason: String,
    /// The workers are stopped at this time, checkpoint or not.
    pub deadline: DateTime<Utc>,
}

/// Save checkpoints this many seconds apart: the checkpoint-manager's advice
/// (Young/Daly), sent to the workers of a job with `checkpoint.frequency: auto`
/// whenever it changes. Workers that start later read it from
/// `CHECKPOINT_INTERVAL_SECONDS`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointIntervalSet {
    pub interval_seconds: f64,
}

/// Stop training (early stop, success policy met, user request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopRequested {
    pub reason: String,
}

crate::payload!(
    CheckpointRequested,
    "command.checkpoint-now",
    1,
    Family::Commands,
    "checkpoint-now"
);
crate::payload!(StopRequested, "command.stop", 1, Family::Commands, "stop");
crate::payload!(
    CheckpointIntervalSet,
    "command.checkpoint-interval",
    1,
    Family::Commands,
    "checkpoint-interval"
);
