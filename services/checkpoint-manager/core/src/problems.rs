//! Which checkpoint problems a person is told about, and when: a reported
//! checkpoint that failed verification, a next attempt that cannot resume
//! from the newest checkpoint, retention that could not run, and a running
//! job that has not saved a verified checkpoint for too long.
//!
//! Problems about one thing (a checkpoint URI, a refused policy) are raised
//! once: [`Raised`] remembers which message raised each, so that message's
//! redelivery raises it again under the same id while any later message
//! does not. An overdue job is raised once per episode: the next verified
//! checkpoint, or the next start of Running, re-arms it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::catalog::ResumeChoice;
use crate::verify::Verification;

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    WriteFailed,
    Overdue,
    ResumeUnavailable,
    RetentionFailed,
}

impl ProblemKind {
    /// The name the `CheckpointProblem` contract and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemKind::WriteFailed => "WriteFailed",
            ProblemKind::Overdue => "Overdue",
            ProblemKind::ResumeUnavailable => "ResumeUnavailable",
            ProblemKind::RetentionFailed => "RetentionFailed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemSeverity {
    Warning,
    Critical,
}

/// One problem to raise about a job's checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub kind: ProblemKind,
    pub severity: ProblemSeverity,
    pub uri: Option<String>,
    /// Age of the newest verified checkpoint, when there is one.
    pub last_checkpoint_age_seconds: Option<u64>,
    pub message: String,
    /// What makes it the same problem again (raised once per key); None when
    /// each cause raises its own.
    pub key: Option<String>,
}

/// The keyed problems raised for a job, each with the id of the message
/// that raised it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Raised(BTreeMap<String, String>);

impl Raised {
    /// Whether `problem` is raised by the message `cause`: always when it has
    /// no key; otherwise when its key was not raised yet, or was raised by
    /// this same message (a redelivery publishes it again under the same id).
    pub fn admit(&mut self, problem: &Problem, cause: &str) -> bool {
        let Some(key) = &problem.key else {
            return true;
        };
        match self.0.get(key) {
            Some(by) => by == cause,
            None => {
                self.0.insert(key.clone(), cause.to_string());
                true
            }
        }
    }

    /// Forgets `key`, so it can be raised again.
    pub fn forget(&mut self, key: &str) {
        self.0.remove(key);
    }

    /// Forgets keys starting with `prefix`, so they can be raised again.
    pub fn rearm(&mut self, prefix: &str) {
        self.0.retain(|key, _| !key.starts_with(prefix));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Key prefix of a refused retention policy.
pub const POLICY_KEY: &str = "RetentionFailed/policy/";

/// A reported checkpoint that failed verification (no completion marker,
/// sizes or checksums wrong): once per URI. Reports refused as the
/// reporter's bad input (outside the job's storage, a step contradicting
/// an earlier report) are not judged here: `checkpoint.verified` and the
/// job's Event tell their author.
pub fn write_failed(uri: &str, verification: &Verification) -> Option<Problem> {
    let Verification::Incomplete { reason } = verification else {
        return None;
    };
    Some(Problem {
        kind: ProblemKind::WriteFailed,
        severity: ProblemSeverity::Warning,
        uri: Some(uri.to_string()),
        last_checkpoint_age_seconds: None,
        message: format!(
            "checkpoint {uri} failed verification: {reason}; it is never resumed from"
        ),
        key: Some(format!("WriteFailed/{uri}")),
    })
}

/// The next attempt's resume point, when it is not the newest checkpoint
/// reported: none verified although some were reported (critical: the
/// attempt starts from scratch), or newer ones skipped as unverified
/// (warning: it falls back to an older step).
pub fn resume_unavailable(choice: &ResumeChoice<'_>, reported: usize) -> Option<Problem> {
    let skipped = choice
        .skipped
        .iter()
        .map(|s| format!("step {} ({})", s.checkpoint.step, s.reason))
        .collect::<Vec<_>>()
        .join(", ");
    let newest = choice.skipped.first().map(|s| s.checkpoint.uri.clone());
    match choice.checkpoint {
        None if reported > 0 => Some(Problem {
            kind: ProblemKind::ResumeUnavailable,
            severity: ProblemSeverity::Critical,
            uri: newest,
            last_checkpoint_age_seconds: None,
            message: format!(
                "none of the {reported} reported checkpoints is verified, so the next attempt starts from scratch; skipped: {skipped}"
            ),
            key: None,
        }),
        Some(chosen) if !choice.skipped.is_empty() => Some(Problem {
            kind: ProblemKind::ResumeUnavailable,
            severity: ProblemSeverity::Warning,
            uri: newest,
            last_checkpoint_age_seconds: None,
            message: format!(
                "the next attempt falls back to step {} ({}); newer checkpoints are not verified: {skipped}",
                chosen.step, chosen.uri
            ),
            key: None,
        }),
        _ => None,
    }
}

/// The key of a failed deletion of `uri`: forgotten once it is deleted.
pub fn deletion_key(uri: &str) -> String {
    format!("RetentionFailed/{uri}")
}

/// A checkpoint the retention policy chose could not be deleted: once per
/// URI. It stays tracked, and the next retention pass tries again.
pub fn deletion_failed(uri: &str, error: &str) -> Problem {
    Problem {
        kind: ProblemKind::RetentionFailed,
        severity: ProblemSeverity::Warning,
        uri: Some(uri.to_string()),
        last_checkpoint_age_seconds: None,
        message: format!(
            "retention could not delete checkpoint {uri}: {error}; it is kept and deleted on the next retention pass"
        ),
        key: Some(deletion_key(uri)),
    }
}

/// The job's retention policy was refused (`policy_error` names the field and
/// the fix), so nothing is deleted: once per distinct refusal.
pub fn policy_refused(policy_error: &str) -> Problem {
    Problem {
        kind: ProblemKind::RetentionFailed,
        severity: ProblemSeverity::Warning,
        uri: None,
        last_checkpoint_age_seconds: None,
        message: format!("retention policy refused, nothing is deleted: {policy_error}"),
        key: Some(format!("{POLICY_KEY}{policy_error}")),
    }
}

/// How long a running job may go without a verified checkpoint.
pub fn overdue_after_seconds(advised_interval_seconds: Option<f64>, floor_seconds: u64) -> u64 {
    let advised = advised_interval_seconds
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(0, |s| (3.0 * s).ceil() as u64);
    advised.max(floor_seconds)
}

/// What the overdue check knows about one job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverdueInput {
    /// When the job's current run started; None when it is not Running.
    pub running_since: Option<DateTime<Utc>>,
    /// When the newest verified checkpoint was verified.
    pub last_verified_at: Option<DateTime<Utc>>,
    pub advised_interval_seconds: Option<f64>,
    /// The episode was already raised.
    pub raised: bool,
}

impl OverdueInput {
    /// When the current episode started: the later of the start of Running
    /// and the newest verified checkpoint; None when not Running.
    pub fn episode_start(&self) -> Option<DateTime<Utc>> {
        let since = self.running_since?;
        Some(self.last_verified_at.map_or(since, |at| at.max(since)))
    }
}

/// A Running job with no verified checkpoint for longer than
/// [`overdue_after_seconds`], counted from the later of its start of Running
/// and its newest verified checkpoint; None when not overdue or already raised.
pub fn overdue(input: OverdueInput, now: DateTime<Utc>, floor_seconds: u64) -> Option<Problem> {
    if input.raised {
        return None;
    }
    let from = input.episode_start()?;
    let waited = u64::try_from((now - from).num_seconds()).unwrap_or(0);
    let limit = overdue_after_seconds(input.advised_interval_seconds, floor_seconds);
    if waited <= limit {
        return None;
    }
    let age = input
        .last_verified_at
        .and_then(|at| u64::try_from((now - at).num_seconds()).ok());
    let last = match age {
        Some(age) => format!("the newest verified checkpoint is {} old", duration(age)),
        None => "it has no verified checkpoint".to_string(),
    };
    Some(Problem {
        kind: ProblemKind::Overdue,
        severity: ProblemSeverity::Warning,
        uri: None,
        last_checkpoint_age_seconds: age,
        message: format!(
            "no verified checkpoint for {} while Running (allowed: {}); {last}",
            duration(waited),
            duration(limit)
        ),
        key: None,
    })
}

fn duration(seconds: u64) -> String {
    match seconds {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::JobCheckpoints;
    use crate::catalog::tests::{checkpoint, verified};
    use chrono::Duration;

    fn incomplete(reason: &str) -> Verification {
        Verification::Incomplete {
            reason: reason.into(),
        }
    }

    fn catalog(entries: Vec<(u64, Verification)>) -> JobCheckpoints {
        let mut job = JobCheckpoints::default();
        for (step, verification) in entries {
            job.record(checkpoint(step, verification)).expect("new");
        }
        job
    }

    #[test]
    fn an_incomplete_checkpoint_is_a_write_failure_naming_the_uri_and_reason() {
        let problem =
            write_failed("s3://b/job/step-4", &incomplete("no completion marker")).expect("raised");
        assert_eq!(problem.kind, ProblemKind::WriteFailed);
        assert_eq!(problem.severity, ProblemSeverity::Warning);
        assert_eq!(problem.uri.as_deref(), Some("s3://b/job/step-4"));
        assert!(problem.message.contains("s3://b/job/step-4"));
        assert!(problem.message.contains("no completion marker"));
        assert!(write_failed("s3://b/job/step-4", &verified()).is_none());
        assert!(write_failed("s3://b/job/step-4", &Verification::Pending).is_none());
    }

    #[test]
    fn a_keyed_problem_is_raised_once_except_on_its_own_redelivery() {
        let problem = write_failed("s3://b/job/step-4", &incomplete("x")).expect("raised");
        let mut raised = Raised::default();
        assert!(raised.admit(&problem, "msg-1"));
        assert!(
            raised.admit(&problem, "msg-1"),
            "redelivery publishes again"
        );
        assert!(!raised.admit(&problem, "msg-2"), "another rank's report");
        let other = write_failed("s3://b/job/step-5", &incomplete("x")).expect("raised");
        assert!(raised.admit(&other, "msg-2"));
        assert_eq!(raised.len(), 2);
    }

    #[test]
    fn unkeyed_problems_are_raised_by_every_cause() {
        let job = catalog(vec![(1, incomplete("x"))]);
        let problem = resume_unavailable(&job.resume(), job.len()).expect("raised");
        let mut raised = Raised::default();
        assert!(raised.admit(&problem, "restart-1"));
        assert!(raised.admit(&problem, "restart-2"));
        assert!(raised.is_empty());
    }

    #[test]
    fn no_verified_checkpoint_after_reports_means_a_critical_fresh_start() {
        let job = catalog(vec![
            (100, incomplete("no completion marker")),
            (200, Verification::Pending),
        ]);
        let problem = resume_unavailable(&job.resume(), job.len()).expect("raised");
        assert_eq!(problem.kind, ProblemKind::ResumeUnavailable);
        assert_eq!(problem.severity, ProblemSeverity::Critical);
        assert_eq!(problem.uri.as_deref(), Some("s3://b/job/step-200"));
        assert!(
            problem.message.contains("starts from scratch"),
            "{}",
            problem.message
        );
        assert!(
            problem
                .message
                .contains("step 100 (incomplete: no completion marker)")
        );
    }

    #[test]
    fn newer_unverified_checkpoints_mean_a_warning_naming_the_fallback_step() {
        let job = catalog(vec![
            (100, verified()),
            (200, incomplete("model.pt is missing")),
        ]);
        let problem = resume_unavailable(&job.resume(), job.len()).expect("raised");
        assert_eq!(problem.severity, ProblemSeverity::Warning);
        assert!(
            problem.message.contains("falls back to step 100"),
            "{}",
            problem.message
        );
        assert!(
            problem
                .message
                .contains("step 200 (incomplete: model.pt is missing)")
        );
    }

    #[test]
    fn resuming_from_the_newest_or_having_none_reported_raises_nothing() {
        let job = catalog(vec![(100, incomplete("x")), (200, verified())]);
        assert!(resume_unavailable(&job.resume(), job.len()).is_none());
        let empty = JobCheckpoints::default();
        assert!(resume_unavailable(&empty.resume(), 0).is_none());
    }

    #[test]
    fn retention_failures_name_the_uri_and_error_or_the_policy_fix() {
        let failed = deletion_failed("s3://b/job/step-1", "access denied");
        let mut after = Raised::default();
        assert!(after.admit(&failed, "report-1"));
        after.forget(&deletion_key("s3://b/job/step-1"));
        assert!(
            after.is_empty(),
            "a deleted checkpoint leaves no key behind"
        );
        assert_eq!(failed.kind, ProblemKind::RetentionFailed);
        assert!(failed.message.contains("s3://b/job/step-1"));
        assert!(failed.message.contains("access denied"));
        let refused = policy_refused("keepLast must be at least 1; set it to 1 or more");
        assert!(refused.message.contains("keepLast must be at least 1"));
        let mut raised = Raised::default();
        assert!(raised.admit(&refused, "spec-1"));
        assert!(!raised.admit(&refused, "spec-2"));
        raised.rearm(POLICY_KEY);
        assert!(
            raised.admit(&refused, "spec-3"),
            "a fixed then broken policy is raised again"
        );
    }

    #[test]
    fn the_overdue_limit_is_three_intervals_or_the_floor() {
        assert_eq!(overdue_after_seconds(None, 1800), 1800);
        assert_eq!(overdue_after_seconds(Some(300.0), 1800), 1800);
        assert_eq!(overdue_after_seconds(Some(1000.0), 1800), 3000);
        assert_eq!(overdue_after_seconds(Some(f64::NAN), 60), 60);
    }

    #[test]
    fn a_running_job_without_a_recent_verified_checkpoint_is_overdue() {
        let start = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let input = OverdueInput {
            running_since: Some(start),
            last_verified_at: Some(start + Duration::minutes(10)),
            advised_interval_seconds: Some(1200.0),
            raised: false,
        };
        // 3 x 20 min = 1 h after the checkpoint at 10:10.
        assert!(overdue(input, start + Duration::minutes(70), 1800).is_none());
        let problem = overdue(input, start + Duration::minutes(71), 1800).expect("overdue");
        assert_eq!(problem.kind, ProblemKind::Overdue);
        assert_eq!(problem.last_checkpoint_age_seconds, Some(61 * 60));
        assert!(
            problem.message.contains("allowed: 1h"),
            "{}",
            problem.message
        );
        let raised = OverdueInput {
            raised: true,
            ..input
        };
        assert!(overdue(raised, start + Duration::hours(5), 1800).is_none());
        let stopped = OverdueInput {
            running_since: None,
            ..input
        };
        assert!(overdue(stopped, start + Duration::hours(5), 1800).is_none());
    }

    #[test]
    fn a_checkpoint_from_an_earlier_run_counts_from_the_start_of_running() {
        let start = DateTime::parse_from_rfc3339("2026-12-01T10:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let input = OverdueInput {
            running_since: Some(start),
            last_verified_at: Some(start - Duration::hours(3)),
            advised_interval_seconds: None,
            raised: false,
        };
        assert!(overdue(input, start + Duration::minutes(30), 1800).is_none());
        let problem = overdue(input, start + Duration::minutes(31), 1800).expect("overdue");
        assert_eq!(
            problem.last_checkpoint_age_seconds,
            Some((3 * 60 + 31) * 60)
        );
        let fresh = OverdueInput {
            last_verified_at: None,
            ..input
        };
        let problem = overdue(fresh, start + Duration::minutes(31), 1800).expect("overdue");
        assert!(problem.message.contains("no verified checkpoint"));
        assert_eq!(problem.last_checkpoint_age_seconds, None);
    }
}
