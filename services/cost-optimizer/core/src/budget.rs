//! Budgets per TrainingQueue (or namespace): an amount per calendar period
//! (UTC), warning thresholds that become alerts, and what happens at the limit.

use std::collections::BTreeSet;

use chrono::{DateTime, Datelike, Duration, NaiveTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::error::CostError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum BudgetPeriod {
    Daily,
    Weekly,
    Monthly,
}

impl BudgetPeriod {
    /// Start of the period containing `at`: midnight UTC, Monday, the 1st.
    pub fn start_of(self, at: DateTime<Utc>) -> DateTime<Utc> {
        let day = at.date_naive();
        let date = match self {
            BudgetPeriod::Daily => day,
            BudgetPeriod::Weekly => {
                day - Duration::days(i64::from(day.weekday().num_days_from_monday()))
            }
            BudgetPeriod::Monthly => day.with_day(1).unwrap_or(day),
        };
        Utc.from_utc_datetime(&date.and_time(NaiveTime::MIN))
    }
}

/// What happens when a budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum LimitAction {
    /// New admissions in the queue wait; running jobs continue.
    Hold,
    /// Running jobs are suspended after a verified checkpoint.
    SuspendWithCheckpoint,
}

/// A budget, as given in a TrainingQueue's `budget`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub amount: f64,
    pub period: Option<BudgetPeriod>,
    /// Percentages of `amount` that raise an alert, e.g. 50, 80, 100.
    pub thresholds_percent: Vec<u32>,
    pub action: LimitAction,
}

impl Budget {
    /// Checks the budget; `field` is its path, e.g. `TrainingQueue team-a spec.budget`.
    pub fn validate(&self, field: &str) -> Result<BudgetPeriod, CostError> {
        let bad = |sub: &str, reason: String| CostError::Budget {
            field: format!("{field}.{sub}"),
            reason,
        };
        let Some(period) = self.period else {
            return Err(bad(
                "period",
                "a budget needs a period: Daily, Weekly or Monthly".into(),
            ));
        };
        if !(self.amount.is_finite() && self.amount > 0.0) {
            return Err(bad(
                "amount",
                format!("must be a positive amount, got {}", self.amount),
            ));
        }
        if let Some(t) = self
            .thresholds_percent
            .iter()
            .find(|t| **t == 0 || **t > 1000)
        {
            return Err(bad(
                "thresholdsPercent",
                format!("{t} is not a percentage in 1..=1000"),
            ));
        }
        Ok(period)
    }
}

/// What a budget check found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BudgetEvent {
    /// Spend passed `percent` of the budget.
    ThresholdCrossed {
        percent: u32,
        spent: f64,
        amount: f64,
    },
    /// Spend reached the amount: the action applies until the period ends.
    LimitReached {
        action: LimitAction,
        spent: f64,
        amount: f64,
    },
    /// A new period began; a held queue admits again.
    PeriodBegan { start: DateTime<Utc> },
}

/// Spend of one budget in its current period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetTracker {
    pub period_start: Option<DateTime<Utc>>,
    pub spent: f64,
    crossed: BTreeSet<u32>,
    pub at_limit: bool,
}

impl BudgetTracker {
    /// Adds `spend` made at `at` and reports what that crossed. A budget
    /// that does not validate is not tracked.
    pub fn add(&mut self, budget: &Budget, spend: f64, at: DateTime<Utc>) -> Vec<BudgetEvent> {
        let Some(period) = budget.period else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let start = period.start_of(at);
        if self.period_start != Some(start) {
            if self.period_start.is_some_and(|s| s < start) {
                events.push(BudgetEvent::PeriodBegan { start });
            }
            if self.period_start.is_none_or(|s| s < start) {
                *self = BudgetTracker {
                    period_start: Some(start),
                    ..BudgetTracker::default()
                };
            }
        }
        if spend.is_finite() && spend > 0.0 {
            self.spent += spend;
        }
        let mut thresholds = budget.thresholds_percent.clone();
        thresholds.sort_unstable();
        for percent in thresholds {
            if self.spent >= budget.amount * f64::from(percent) / 100.0
                && self.crossed.insert(percent)
            {
                events.push(BudgetEvent::ThresholdCrossed {
                    percent,
                    spent: self.spent,
                    amount: budget.amount,
                });
            }
        }
        if !self.at_limit && self.spent >= budget.amount {
            self.at_limit = true;
            events.push(BudgetEvent::LimitReached {
                action: budget.action,
                spent: self.spent,
                amount: budget.amount,
            });
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().expect("time")
    }

    fn budget() -> Budget {
        Budget {
            amount: 1000.0,
            period: Some(BudgetPeriod::Monthly),
            thresholds_percent: vec![100, 50, 80],
            action: LimitAction::Hold,
        }
    }

    #[test]
    fn thresholds_are_crossed_once_each_and_the_limit_acts() {
        let b = budget();
        let mut tracker = BudgetTracker::default();
        assert!(tracker.add(&b, 400.0, t("2026-03-02T00:00:00Z")).is_empty());
        let events = tracker.add(&b, 450.0, t("2026-03-03T00:00:00Z"));
        let percents: Vec<u32> = events
            .iter()
            .filter_map(|e| match e {
                BudgetEvent::ThresholdCrossed { percent, .. } => Some(*percent),
                _ => None,
            })
            .collect();
        assert_eq!(percents, vec![50, 80]);
        assert!(tracker.add(&b, 10.0, t("2026-03-04T00:00:00Z")).is_empty());
        let events = tracker.add(&b, 200.0, t("2026-03-05T00:00:00Z"));
        assert!(matches!(
            events.as_slice(),
            [
                BudgetEvent::ThresholdCrossed { percent: 100, .. },
                BudgetEvent::LimitReached {
                    action: LimitAction::Hold,
                    ..
                }
            ]
        ));
        assert!(tracker.at_limit);
        let events = tracker.add(&b, 1.0, t("2026-04-01T00:00:01Z"));
        assert_eq!(
            events,
            vec![BudgetEvent::PeriodBegan {
                start: t("2026-04-01T00:00:00Z")
            }]
        );
        assert!(!tracker.at_limit);
        assert_eq!(tracker.spent, 1.0);
    }

    #[test]
    fn periods_start_at_utc_midnight_monday_and_the_first() {
        let at = t("2026-03-05T13:00:00Z"); // a Thursday
        assert_eq!(BudgetPeriod::Daily.start_of(at), t("2026-03-05T00:00:00Z"));
        assert_eq!(BudgetPeriod::Weekly.start_of(at), t("2026-03-02T00:00:00Z"));
        assert_eq!(
            BudgetPeriod::Monthly.start_of(at),
            t("2026-03-01T00:00:00Z")
        );
    }

    #[test]
    fn a_budget_without_a_period_or_amount_is_named() {
        let mut b = budget();
        b.period = None;
        assert_eq!(
            b.validate("TrainingQueue team-a spec.budget")
                .expect_err("invalid")
                .to_string(),
            "TrainingQueue team-a spec.budget.period: a budget needs a period: Daily, Weekly or Monthly"
        );
        let mut b = budget();
        b.amount = -1.0;
        assert!(
            b.validate("q")
                .expect_err("invalid")
                .to_string()
                .starts_with("q.amount")
        );
        let mut b = budget();
        b.thresholds_percent = vec![0];
        assert!(b.validate("q").is_err());
        assert_eq!(budget().validate("q"), Ok(BudgetPeriod::Monthly));
    }
}
