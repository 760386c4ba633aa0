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
