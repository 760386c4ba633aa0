//! TrainingJob lifecycle, published by the planner on
//! `trainyard.lifecycle.trainingjob.<ns>.<name>` for the other services, the notifier
//! and any external subscriber.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainyard_api::TrainingJobState;

use crate::envelope::EntityRef;

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
    /// What subscribers that never read Kubernetes need to know about the job
    /// (the notifier); absent from publishers that do not fill it.
    #[serde(default, skip_serializing_if = "TransitionContext::is_empty")]
    pub context: TransitionContext,
}

/// The job as people see it, carried with each transition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransitionContext {
    /// The TrainingJob's labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Its `trainyard.dev/notify*` annotations (no others).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The Sweep that owns it, when it is a trial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<EntityRef>,
    /// Links for people, by name (`run`: the experiment-tracking run, `tracking`: the server).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub links: BTreeMap<String, String>,
    /// Exit code of the failed worker, on restarts and failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `retryable` or `permanent`, on restarts and failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_class: Option<String>,
    /// What the user can do about a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Last reported metrics, on completion.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub final_metrics: BTreeMap<String, f64>,
    /// Seconds since the job started running, once it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
}

impl TransitionContext {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
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
