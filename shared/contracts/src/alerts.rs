//! Alerts for people, on `trainyard.alerts.<severity>.<ns>.<name>`; the notifier delivers them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::envelope::EntityRef;
use crate::subject::{Family, entity_subject};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertRaised {
    /// Stable alert name, e.g. `TrainingJobFailed`, `BudgetExceeded`.
    pub alertname: String,
    pub severity: Severity,
    pub summary: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl crate::envelope::Payload for AlertRaised {
    const TYPE: &'static str = "alert.raised";
    const VERSION: u32 = 1;
    fn subject(&self, entity: &EntityRef) -> String {
        entity_subject(Family::Alerts, self.severity.as_str(), entity)
    }
}
