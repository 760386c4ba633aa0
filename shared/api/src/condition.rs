//! Status conditions shared by all kinds, shaped like `metav1.Condition`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::wire_enum::wire_enum;

wire_enum! {
    /// Whether a condition holds: True, False or Unknown.
    pub enum ConditionStatus {
        True => "True",
        False => "False",
        Unknown => "Unknown",
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { Self::True } else { Self::False }
    }
}

/// One aspect of an object's state, e.g. `Admitted` or `Running`, and when it last changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type in CamelCase, e.g. Admitted, Running, Succeeded, Failed, Suspended.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub condition_type: String,
    /// Whether the condition holds: True, False or Unknown.
    pub status: ConditionStatus,
    /// Machine-readable CamelCase reason for the last transition, e.g. QuotaExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details about the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed (not when the condition was last written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// metadata.generation of the spec this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// Creates a condition with a reason and message; the caller sets times and generation.
    pub fn new(
        condition_type: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            condition_type: condition_type.into(),
            status,
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    /// True when the condition's status is True.
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Finds the condition of the given type.
pub fn find_condition<'a>(
    conditions: &'a [Condition],
    condition_type: &str,
) -> Option<&'a Condition> {
    conditions
        .iter()
        .find(|c| c.condition_type == condition_type)
}

/// Adds or replaces the condition of `new.condition_type`, like `meta.SetStatusCondition`.
///
/// The transition time only moves when the status changes, so replaying the same
/// decision does not rewrite history. Returns true when anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions
        .iter_mut()
        .find(|c| c.condition_type == new.condition_type)
    {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = *existing != new;
            *existing = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_condition_keeps_transition_time_while_status_is_unchanged() {
        let first_time = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap_or_default());
        let later_time = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap_or_default());
        let mut conditions = Vec::new();
        let mut admitted = Condition::new("Admitted", ConditionStatus::True, "QuotaReserved", "ok");
        admitted.last_transition_time = Some(first_time.clone());
        assert!(set_condition(&mut conditions, admitted.clone()));

        let mut again = admitted.clone();
        again.last_transition_time = Some(later_time.clone());
        assert!(!set_condition(&mut conditions, again));
        assert_eq!(conditions[0].last_transition_time, Some(first_time));

        let mut evicted =
            Condition::new("Admitted", ConditionStatus::False, "Preempted", "reclaimed");
        evicted.last_transition_time = Some(later_time.clone());
        assert!(set_condition(&mut conditions, evicted));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, Some(later_time));
        assert!(find_condition(&conditions, "Admitted").is_some_and(|c| !c.is_true()));
    }
}
