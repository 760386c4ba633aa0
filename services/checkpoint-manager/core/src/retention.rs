//! Which checkpoints a retention policy deletes.
//!
//! Invariants (property-tested): a decision never deletes the newest verified
//! checkpoint, the best one, a pinned one, a registered one, the one a pending
//! resume names, or any checkpoint not verified (nothing is deleted on doubt).
//! Deciding again after the deletions deletes nothing more.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::catalog::Checkpoint;
use crate::error::CoreError;

/// Whether a lower or a higher metric value is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricMode {
    Min,
    Max,
}

/// Keep the `count` best checkpoints by `metric`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeepBest {
    pub metric: String,
    pub mode: MetricMode,
    pub count: u32,
}

/// A job's retention policy. A checkpoint is kept when any rule keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    /// Keep the newest N verified checkpoints.
    pub keep_last: Option<u32>,
    pub keep_best: Option<KeepBest>,
    /// Keep every checkpoint whose step is a multiple of this.
    pub keep_every_n_steps: Option<u64>,
    /// Steps whose checkpoints are never deleted.
    pub pinned_steps: Vec<u64>,
}

impl RetentionPolicy {
    /// Refuses a policy that keeps nothing or names nothing to rank by.
    pub fn check(&self) -> Result<(), CoreError> {
        let invalid = |field, message: &str| {
            Err(CoreError::InvalidPolicy {
                field,
                message: message.to_string(),
            })
        };
        if let Some(best) = &self.keep_best {
            if best.metric.trim().is_empty() {
                return invalid(
                    ".keepBest.metric",
                    "name the metric to rank checkpoints by, e.g. loss",
                );
            }
            if best.count == 0 {
                return invalid(
                    ".keepBest.count",
                    "must be at least 1; remove keepBest to keep no best checkpoints",
                );
            }
        }
        if self.keep_every_n_steps == Some(0) {
            return invalid(".keepEveryNSteps", "must be at least 1");
        }
        if self.keep_last == Some(0)
            && self.keep_best.is_none()
            && self.keep_every_n_steps.is_none()
            && self.pinned_steps.is_empty()
        {
            return invalid(
                ".keepLast",
                "0 with no keepBest, keepEveryNSteps or pinnedSteps keeps nothing; set keepLast to at least 1 or add keepBest",
            );
        }
        Ok(())
    }
}

/// Why a checkpoint is kept (the first rule that keeps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeepReason {
    /// Not verified: nothing is deleted on doubt.
    NotVerified,
    NewestVerified,
    /// A pending resume names it.
    PendingResume,
    Pinned,
    /// Registered as a model version.
    Registered,
    Best,
    KeepLast,
    KeepBest,
    KeepEveryNSteps,
    /// The job has no retention policy.
    NoPolicy,
}

/// Checkpoints that must outlive any policy, besides the ones the catalogue
/// itself protects.
#[derive(Debug, Clone, Copy, Default)]
pub struct Protected<'a> {
    pub pending_resume: Option<&'a str>,
    pub registered: Option<&'a BTreeSet<String>>,
}

/// A retention decision: every checkpoint appears once, in `keep` or `delete`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RetentionDecision {
    pub keep: Vec<(String, KeepReason)>,
    pub delete: Vec<String>,
}

/// The best verified checkpoint by `keep_best` (the newest among equals).
pub fn best<'c>(checkpoints: &'c [Checkpoint], keep_best: &KeepBest) -> Option<&'c Checkpoint> {
    ranked(checkpoints, keep_best).next()
}

/// Verified checkpoints with a finite value of the metric, best first; among
/// equal values the newest first.
fn ranked<'c>(
    checkpoints: &'c [Checkpoint],
    keep_best: &KeepBest,
) -> impl Iterator<Item = &'c Checkpoint> {
    let mut scored: Vec<(f64, usize)> = checkpoints
        .iter()
        .enumerate()
        .filter(|(_, c)| c.verification.is_verified())
        .filter_map(|(index, c)| c.metric(&keep_best.metric).map(|v| (v, index)))
        .collect();
    scored.sort_by(|(a, ia), (b, ib)| {
        let by_value = match keep_best.mode {
            MetricMode::Min => a.total_cmp(b),
            MetricMode::Max => b.total_cmp(a),
        };
        by_value.then(ib.cmp(ia))
    });
    scored
        .into_iter()
        .map(move |(_, index)| &checkpoints[index])
}

/// Decides which of `checkpoints` (oldest first, as the catalogue holds them)
/// to delete under `policy` (`None`: keep everything).
pub fn decide(
    checkpoints: &[Checkpoint],
    policy: Option<&RetentionPolicy>,
    protected: Protected<'_>,
) -> RetentionDecision {
    let newest_verified = checkpoints
        .iter()
        .rev()
        .find(|c| c.verification.is_verified())
        .map(|c| c.uri.as_str());
    let keep_best = policy.and_then(|p| p.keep_best.as_ref());
    let top: Vec<&str> = keep_best
        .map(|kb| {
            ranked(checkpoints, kb)
                .take(kb.count.max(1) as usize)
                .map(|c| c.uri.as_str())
                .collect()
        })
        .unwrap_or_default();
    let last: Vec<&str> = policy
        .and_then(|p| p.keep_last)
        .map(|n| {
            checkpoints
                .iter()
                .rev()
                .filter(|c| c.verification.is_verified())
                .take(n as usize)
                .map(|c| c.uri.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut decision = RetentionDecision::default();
    for checkpoint in checkpoints {
        let uri = checkpoint.uri.as_str();
        let reason = if !checkpoint.verification.is_verified() {
            Some(KeepReason::NotVerified)
        } else if Some(uri) == newest_verified {
            Some(KeepReason::NewestVerified)
        } else if Some(uri) == protected.pending_resume {
            Some(KeepReason::PendingResume)
        } else if policy.is_some_and(|p| p.pinned_steps.contains(&checkpoint.step)) {
            Some(KeepReason::Pinned)
        } else if protected.registered.is_some_and(|r| r.contains(uri)) {
            Some(KeepReason::Registered)
        } else if top.first() == Some(&uri) {
            Some(KeepReason::Best)
        } else if policy.is_none() {
            Some(KeepReason::NoPolicy)
        } else if last.contains(&uri) {
            Some(KeepReason::KeepLast)
        } else if top.contains(&uri) {
            Some(KeepReason::KeepBest)
        } else if policy
            .and_then(|p| p.keep_every_n_steps)
            .is_some_and(|n| n > 0 && checkpoint.step % n == 0)
        {
            Some(KeepReason::KeepEveryNSteps)
        } else {
            None
        };
        match reason {
            Some(reason) => decision.keep.push((checkpoint.uri.clone(), reason)),
            None => decision.delete.push(checkpoint.uri.clone()),
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::verify::{Method, Verification, Verifier};

    fn verified(step: u64, loss: f64) -> Checkpoint {
        Checkpoint {
            uri: format!("s3://b/job/step-{step}"),
            epoch: 0,
            step,
            attempt: 0,
            metrics: BTreeMap::from([("loss".to_string(), loss)]),
            size_bytes: 0,
            save_seconds: None,
            verification: Verification::Verified {
                method: Method::TrainyardManifest,
                verifier: Verifier::Manager,
                checksums: true,
            },
        }
    }

    fn steps(uris: &[String]) -> Vec<u64> {
        uris.iter()
            .map(|u| {
                u.rsplit('-')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    }

    #[test]
    fn keeps_the_last_the_best_every_nth_and_pinned_and_deletes_the_rest() {
        let losses = [0.9, 0.2, 0.8, 0.7, 0.6, 0.5, 0.55, 0.65];
        let checkpoints: Vec<Checkpoint> = losses
            .iter()
            .enumerate()
            .map(|(i, loss)| verified((i as u64 + 1) * 100, *loss))
            .collect();
        let policy = RetentionPolicy {
            keep_last: Some(2),
            keep_best: Some(KeepBest {
                metric: "loss".into(),
                mode: MetricMode::Min,
                count: 2,
            }),
            keep_every_n_steps: Some(400),
            pinned_steps: vec![100],
        };
        let decision = decide(&checkpoints, Some(&policy), Protected::default());
        assert_eq!(steps(&decision.delete), vec![300, 500]);
        let reasons: BTreeMap<u64, KeepReason> = decision
            .keep
            .iter()
            .map(|(uri, reason)| (steps(std::slice::from_ref(uri))[0], *reason))
            .collect();
        assert_eq!(reasons[&100], KeepReason::Pinned);
        assert_eq!(reasons[&200], KeepReason::Best);
        assert_eq!(reasons[&400], KeepReason::KeepEveryNSteps);
        assert_eq!(reasons[&600], KeepReason::KeepBest);
        assert_eq!(reasons[&700], KeepReason::KeepLast);
        assert_eq!(reasons[&800], KeepReason::NewestVerified);
    }

    #[test]
    fn without_a_policy_nothing_is_deleted() {
        let checkpoints = vec![verified(1, 0.1), verified(2, 0.2)];
        assert!(
            decide(&checkpoints, None, Protected::default())
                .delete
                .is_empty()
        );
    }

    #[test]
    fn policies_that_keep_nothing_are_refused_with_the_field_and_the_fix() {
        let nothing = RetentionPolicy {
            keep_last: Some(0),
            ..RetentionPolicy::default()
        };
        let err = nothing.check().expect_err("keeps nothing");
        assert!(
            err.to_string()
                .starts_with("checkpoint.retention.keepLast: 0 with no keepBest"),
            "{err}"
        );
        let unranked = RetentionPolicy {
            keep_best: Some(KeepBest {
                metric: " ".into(),
                mode: MetricMode::Min,
                count: 1,
            }),
            ..RetentionPolicy::default()
        };
        assert!(
            unranked
                .check()
                .expect_err("no metric")
                .to_string()
                .contains("keepBest.metric")
        );
        let with_best = RetentionPolicy {
            keep_last: Some(0),
            keep_best: Some(KeepBest {
                metric: "loss".into(),
                mode: MetricMode::Min,
                count: 1,
            }),
            ..RetentionPolicy::default()
        };
        assert_eq!(with_best.check(), Ok(()));
    }
}
