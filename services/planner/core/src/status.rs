//! Small pure helpers for status fields.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use trainyard_api::TrainingJobStatus;

/// A Kubernetes `Time` (second precision on the wire) from a chrono time. Sub-second
/// parts are dropped so a status read back from the apiserver compares equal to the
/// one written, and an unchanged status is never rewritten.
pub fn to_time(at: DateTime<Utc>) -> Time {
    Time(Timestamp::from_second(at.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The chrono time of a Kubernetes `Time`.
pub fn from_time(time: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(time.0.as_second(), 0).unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// A duration as Go prints it, the way kubectl users read durations: `45s`, `2m5s`,
/// `1h2m3s`, `26h0m0s`.
pub fn format_duration(duration: Duration) -> String {
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, (total % 3600) / 60, total % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// Whole seconds from `from` to `to`, zero when `to` is earlier.
pub fn elapsed(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or_default()
}

/// Progress as the reference prints it: epochs done over total, e.g. `45%`, capped at 100.
pub fn progress_percent(epoch: u32, total_epochs: u32) -> String {
    if total_epochs == 0 {
        return "0%".to_owned();
    }
    let percent = (u64::from(epoch) * 100 / u64::from(total_epochs)).min(100);
    format!("{percent}%")
}

/// Whether a larger value of a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricGoal {
    Maximize,
    Minimize,
}

impl MetricGoal {
    /// Losses, errors and perplexities shrink as training improves; everything else
    /// (accuracy, F1, BLEU, AUC, ...) grows.
    pub fn for_metric(name: &str) -> Self {
        let name = name.to_ascii_lowercase();
        if [
            "loss",
            "error",
            "perplexity",
            "mse",
            "mae",
            "rmse",
            "wer",
            "cer",
        ]
        .iter()
        .any(|word| name.contains(word))
        {
            Self::Minimize
        } else {
            Self::Maximize
        }
    }

    /// True when `value` reaches `target`.
    pub fn reaches(self, value: f64, target: f64) -> bool {
        match self {
            Self::Maximize => value >= target,
            Self::Minimize => value <= target,
        }
    }

    /// True when `value` is strictly better than `best`.
    pub fn improves(self, value: f64, best: f64) -> bool {
        match self {
            Self::Maximize => value > best,
            Self::Minimize => value < best,
        }
    }
}

/// Whether `next` changes the job's state, or the status or reason of any
/// condition, against `previous`: what users and other systems act on, so it
/// is written at once. The rest (progress, metrics, worker counts, checkpoint,
/// start time, a condition's message) can wait for the next write.
pub fn changes_state_or_conditions(previous: &TrainingJobStatus, next: &TrainingJobStatus) -> bool {
    if previous.state != next.state || previous.conditions.len() != next.conditions.len() {
        return true;
    }
    next.conditions.iter().any(|condition| {
        previous
            .conditions
            .iter()
            .find(|p| p.condition_type == condition.condition_type)
            .is_none_or(|p| p.status != condition.status || p.reason != condition.reason)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::{Condition, ConditionStatus, TrainingJobState};

    #[test]
    fn only_state_and_condition_changes_are_urgent() {
        let running = |reason: &str, message: &str| {
            Condition::new(
                "Running",
                ConditionStatus::True,
                reason.to_owned(),
                message.to_owned(),
            )
        };
        let previous = TrainingJobStatus {
            state: Some(TrainingJobState::Running),
            conditions: vec![running("WorkersRunning", "1 of 2 workers running")],
            current_epoch: Some(1),
            ..TrainingJobStatus::default()
        };
        let progressed = TrainingJobStatus {
            current_epoch: Some(2),
            progress: Some("66%".to_owned()),
            conditions: vec![running("WorkersRunning", "2 of 2 workers running")],
            ..previous.clone()
        };
        assert!(!changes_state_or_conditions(&previous, &progressed));
        let finished = TrainingJobStatus {
            state: Some(TrainingJobState::Completed),
            ..progressed.clone()
        };
        assert!(changes_state_or_conditions(&progressed, &finished));
        let mut flipped = progressed.clone();
        flipped.conditions[0].status = ConditionStatus::False;
        assert!(changes_state_or_conditions(&progressed, &flipped));
        let mut reasoned = progressed.clone();
        reasoned.conditions[0].reason = Some("Restarting".to_owned());
        assert!(changes_state_or_conditions(&progressed, &reasoned));
        let mut added = progressed.clone();
        added.conditions.push(Condition::new(
            "Suspended",
            ConditionStatus::True,
            "Suspended".to_owned(),
            String::new(),
        ));
        assert!(changes_state_or_conditions(&progressed, &added));
    }

    #[test]
    fn durations_read_like_go() {
        assert_eq!(format_duration(Duration::from_secs(0)), "0s");
        assert_eq!(format_duration(Duration::from_secs(45)), "45s");
        assert_eq!(format_duration(Duration::from_secs(125)), "2m5s");
        assert_eq!(format_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format_duration(Duration::from_secs(93600)), "26h0m0s");
    }

    #[test]
    fn progress_is_a_capped_percentage() {
        assert_eq!(progress_percent(0, 10), "0%");
        assert_eq!(progress_percent(9, 20), "45%");
        assert_eq!(progress_percent(12, 10), "100%");
        assert_eq!(progress_percent(1, 0), "0%");
    }

    #[test]
    fn times_round_trip_at_second_precision() {
        let at = DateTime::from_timestamp(1_700_000_000, 999_000_000).unwrap_or_default();
        assert_eq!(from_time(&to_time(at)).timestamp(), 1_700_000_000);
    }

    #[test]
    fn metric_goals() {
        assert_eq!(MetricGoal::for_metric("accuracy"), MetricGoal::Maximize);
        assert_eq!(
            MetricGoal::for_metric("validation_loss"),
            MetricGoal::Minimize
        );
        assert!(MetricGoal::Minimize.reaches(0.2, 0.25));
        assert!(!MetricGoal::Maximize.reaches(0.9, 0.95));
    }
}
