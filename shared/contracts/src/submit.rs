//! Job submission by external systems, on `trainyard.submit.trainingjob.<ns>.<name>`.
//! The planner validates the spec and creates the TrainingJob; a bad spec goes to the
//! dead-letter subject with the field and the fix.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainyard_api::TrainingJobSpec;

use crate::subject::Family;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobSubmitted {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub spec: TrainingJobSpec,
}

crate::payload!(
    TrainingJobSubmitted,
    "trainingjob.submit",
    1,
    Family::Submit,
    "trainingjob"
);

/// The planner's answer to a submission, on `trainyard.submit.result.<ns>.<name>`,
/// which the submitter may subscribe to (it need not read the dead-letter stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionResult {
    pub accepted: bool,
    /// Bounded rejection category (`invalid_spec`, `namespace_not_allowed`,
    /// `entity_mismatch`, `not_owned`, `policy_violation`); absent when accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Every problem found, each naming its field and the fix; empty when accepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<SubmissionError>,
}

/// One reason a submission was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionError {
    /// Path of the offending field, e.g. `spec.framework` or `entity.namespace`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

crate::payload!(
    SubmissionResult,
    "trainingjob.submit.result",
    1,
    Family::Submit,
    "result"
);
