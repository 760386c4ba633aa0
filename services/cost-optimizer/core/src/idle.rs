//! Idle GPU detection. A job is idle when its GPU utilisation stays below
//! `threshold` for `window_seconds`; it is busy again only once utilisation
//! rises above `resume_threshold` (hysteresis, so a job hovering at the
//! threshold does not flap). Jobs starting, loading data or checkpointing
//! are never idle. Actions escalate: alert the owner, then (if the queue's
//! policy says so) checkpoint and suspend. Nothing is ever killed.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::error::CostError;

/// What a job's workers are doing, as they report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WorkerPhase {
    Starting,
    LoadingData,
    Training,
    Checkpointing,
}

impl WorkerPhase {
    /// Phases in which low utilisation is expected and never idleness.
    pub fn is_busy_without_gpu(self) -> bool {
        matches!(
            self,
            WorkerPhase::Starting | WorkerPhase::LoadingData | WorkerPhase::Checkpointing
        )
    }
}

/// A queue's idle policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdlePolicy {
    /// Utilisation (0..1) below which a GPU counts as idle.
    pub threshold: f64,
    /// Utilisation above which an idle job is busy again.
    pub resume_threshold: f64,
    pub window_seconds: u64,
    /// Seconds after the alert before the job is checkpointed and suspended;
    /// `None`: alert only.
    pub suspend_after_seconds: Option<u64>,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            threshold: 0.05,
            resume_threshold: 0.15,
            window_seconds: 1800,
            suspend_after_seconds: None,
        }
    }
}

impl IdlePolicy {
    pub fn validate(&self, field: &str) -> Result<(), CostError> {
        let bad = |sub: &str, reason: String| CostError::IdlePolicy {
            field: format!("{field}.{sub}"),
            reason,
        };
        if !(0.0..1.0).contains(&self.threshold) {
            return Err(bad(
                "threshold",
                format!("must be a fraction in [0, 1), got {}", self.threshold),
            ));
        }
        if !(self.resume_threshold >= self.threshold && self.resume_threshold <= 1.0) {
            return Err(bad(
                "resumeThreshold",
                format!(
                    "must lie between threshold ({}) and 1, got {}",
                    self.threshold, self.resume_threshold
                ),
            ));
        }
        if self.window_seconds == 0 {
            return Err(bad("windowSeconds", "must be at least 1".into()));
        }
        Ok(())
    }
}

/// An action on an idle job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum IdleAction {
    /// Tell the owner; nothing else happens yet.
    Alert {
        idle_since: DateTime<Utc>,
        utilization: f64,
    },
    /// Checkpoint (verified) and suspend; resuming is unsuspending the job.
    Suspend {
        idle_since: DateTime<Utc>,
        utilization: f64,
    },
}

/// One job's idle state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleDetector {
    below_since: Option<DateTime<Utc>>,
    idle: bool,
    suspended: bool,
}

impl IdleDetector {
    /// Whether the job is idle now.
    pub fn is_idle(&self) -> bool {
        self.idle
    }

    /// A sample at `at`: mean utilisation of the job's GPUs (0..1) and the
    /// workers' phase. Returns the action due, at most one per sample.
    pub fn observe(
        &mut self,
        policy: &IdlePolicy,
        at: DateTime<Utc>,
        utilization: f64,
        phase: WorkerPhase,
    ) -> Option<IdleAction> {
        let busy = phase.is_busy_without_gpu()
            || !utilization.is_finite()
            || if self.idle {
                utilization > policy.resume_threshold
            } else {
                utilization >= policy.threshold
            };
        if busy {
            *self = IdleDetector::default();
            return None;
        }
        let since = *self.below_since.get_or_insert(at);
        let window = Duration::seconds(i64::try_from(policy.window_seconds).unwrap_or(i64::MAX));
        if !self.idle && at - since >= window {
            self.idle = true;
            return Some(IdleAction::Alert {
                idle_since: since,
                utilization,
            });
        }
        if let Some(after) = policy.suspend_after_seconds
            && self.idle
            && !self.suspended
            && at - since >= window + Duration::seconds(i64::try_from(after).unwrap_or(i64::MAX))
        {
            self.suspended = true;
            return Some(IdleAction::Suspend {
                idle_since: since,
                utilization,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + s, 0).expect("time")
    }

    fn policy() -> IdlePolicy {
        IdlePolicy {
            threshold: 0.05,
            resume_threshold: 0.2,
            window_seconds: 600,
            suspend_after_seconds: Some(300),
        }
    }

    #[test]
    fn an_idle_job_is_alerted_after_the_window_then_suspended() {
        let p = policy();
        let mut d = IdleDetector::default();
        let mut actions = Vec::new();
        for s in (0..=1200).step_by(60) {
            if let Some(a) = d.observe(&p, t(s), 0.01, WorkerPhase::Training) {
                actions.push((s, a));
            }
        }
        assert_eq!(actions.len(), 2);
        assert_eq!(actions[0].0, 600);
        assert!(matches!(actions[0].1, IdleAction::Alert { .. }));
        assert_eq!(actions[1].0, 900);
        assert!(
            matches!(actions[1].1, IdleAction::Suspend { idle_since, .. } if idle_since == t(0))
        );
    }

    #[test]
    fn busy_phases_are_never_idle() {
        let p = policy();
        let mut d = IdleDetector::default();
        for (i, phase) in [
            WorkerPhase::Starting,
            WorkerPhase::LoadingData,
            WorkerPhase::Checkpointing,
        ]
        .into_iter()
        .enumerate()
        {
            for s in 0..30 {
                let at = t(i as i64 * 10_000 + s * 60);
                assert_eq!(d.observe(&p, at, 0.0, phase), None);
            }
        }
        assert!(!d.is_idle());
    }

    #[test]
    fn hysteresis_keeps_an_idle_job_idle_until_it_clearly_works_again() {
        let mut p = policy();
        p.suspend_after_seconds = None;
        let mut d = IdleDetector::default();
        d.observe(&p, t(0), 0.0, WorkerPhase::Training);
        assert!(d.observe(&p, t(600), 0.0, WorkerPhase::Training).is_some());
        // Between the thresholds: still idle, no second alert.
        assert_eq!(d.observe(&p, t(660), 0.1, WorkerPhase::Training), None);
        assert!(d.is_idle());
        assert_eq!(d.observe(&p, t(720), 0.5, WorkerPhase::Training), None);
        assert!(!d.is_idle());
        // Not idle: a sample between the thresholds counts as busy.
        d.observe(&p, t(780), 0.0, WorkerPhase::Training);
        assert_eq!(d.observe(&p, t(1000), 0.1, WorkerPhase::Training), None);
        assert_eq!(d.observe(&p, t(1390), 0.0, WorkerPhase::Training), None);
    }

    /// A corpus of jobs sampled every `INTERVAL` s: busy phases with low
    /// utilisation (start-up, data loading, checkpointing) get no action;
    /// jobs idle from a random moment are caught within window + interval.
    #[test]
    fn corpus_busy_phases_get_no_action_and_idle_jobs_are_caught_in_time() {
        const INTERVAL: i64 = 60;
        let mut p = policy();
        p.suspend_after_seconds = None;
        let window = p.window_seconds as i64;
        for job in 0..200i64 {
            // Busy: start-up, loading, training, checkpointing, training...
            let mut d = IdleDetector::default();
            let mut t0 = 0;
            for (phase, minutes, util) in [
                (WorkerPhase::Starting, 15 + job % 20, 0.0),
                (WorkerPhase::LoadingData, 20 + job % 30, 0.02),
                (WorkerPhase::Training, 30, 0.9),
                (WorkerPhase::Checkpointing, 12 + job % 10, 0.01),
                (WorkerPhase::Training, 30, 0.6),
            ] {
                for m in 0..minutes {
                    let at = t(t0 + m * INTERVAL);
                    assert_eq!(d.observe(&p, at, util, phase), None, "job {job} {phase:?}");
                }
                t0 += minutes * INTERVAL;
            }
            // Truly idle from a moment between two samples.
            let mut d = IdleDetector::default();
            let idle_from = 1800 + (job * 37) % INTERVAL;
            let mut caught = None;
            let mut s = 0;
            while s <= idle_from + window + 2 * INTERVAL {
                let util = if s < idle_from { 0.8 } else { 0.0 };
                if d.observe(&p, t(s), util, WorkerPhase::Training).is_some() {
                    caught = Some(s);
                    break;
                }
                s += INTERVAL;
            }
            let caught = caught.expect("idle job caught");
            assert!(
                caught >= idle_from + window - INTERVAL,
                "job {job} caught early at {caught}"
            );
            assert!(
                caught <= idle_from + window + INTERVAL,
                "job {job} caught late at {caught}"
            );
        }
    }

    #[test]
    fn a_bad_policy_names_the_field() {
        let mut p = policy();
        p.resume_threshold = 0.01;
        assert!(
            p.validate("idle")
                .expect_err("invalid")
                .to_string()
                .starts_with("idle.resumeThreshold")
        );
        assert!(IdlePolicy::default().validate("idle").is_ok());
    }
}
