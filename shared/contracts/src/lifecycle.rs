//! TrainingJob lifecycle, published by the planner on
//! `trainyard.lifecycle.trainingjob.<ns>.<name>` for the other services, the notifier
//! and any external subscriber.

use serde::{Deserialize, Serialize};
use trainyard_api::TrainingJobState;

use crate::subject::Family;

/// The job moved from one state to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobTransitioned {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<TrainingJobState>,
    pub to: TrainingJobState,
    pub reason: String,
    pub message: String,
    pub restart_count: u32,
    /// GPUs the job holds in the new state (0 once it ends).
    pub gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
}

/// The job was deleted and everything it owned is gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobFinalized {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<TrainingJobState>,
}

crate::payload!(
    TrainingJobTransitioned,
    "trainingjob.transitioned",
    1,
    Family::Lifecycle,
    "trainingjob"
);
crate::payload!(
    TrainingJobFinalized,
    "trainingjob.finalized",
    1,
    Family::Lifecycle,
    "finalized"
);
