//! The checkpoints of one job, and the choices made from them: where the next
//! attempt resumes and what status shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::retention::{KeepBest, RetentionPolicy};
use crate::verify::Verification;

/// One checkpoint as reported and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    /// Attempt of the job that wrote it.
    #[serde(default)]
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_seconds: Option<f64>,
    pub verification: Verification,
}

impl Checkpoint {
    /// Order of checkpoints in training time: epoch, then step, then URI (so the
    /// order is total even for two reports at the same point).
    pub fn order_key(&self) -> (u32, u64, &str) {
        (self.epoch, self.step, self.uri.as_str())
    }

    /// The value of `metric`, when reported and finite.
    pub fn metric(&self, metric: &str) -> Option<f64> {
        self.metrics.get(metric).copied().filter(|v| v.is_finite())
    }
}

/// What [`JobCheckpoints::record`] did with a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A checkpoint not seen before.
    New,
    /// The same checkpoint reported again (a redelivery, or another rank).
    Again,
}

/// A newer checkpoint the resume choice passed over, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped<'a> {
    pub checkpoint: &'a Checkpoint,
    pub reason: String,
}

/// Where the next attempt resumes: the newest verified checkpoint, if any, and
/// the newer ones that were not verified.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeChoice<'a> {
    pub checkpoint: Option<&'a Checkpoint>,
    pub skipped: Vec<Skipped<'a>>,
}

/// What status shows about a job's checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary<'a> {
    pub latest_verified: Option<&'a Checkpoint>,
    pub best: Option<&'a Checkpoint>,
    /// Checkpoints tracked (verified or not) that retention has not deleted.
    pub count: usize,
    pub verified: usize,
}

/// The checkpoints of one job, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobCheckpoints {
    checkpoints: Vec<Checkpoint>,
}

impl JobCheckpoints {
    pub fn all(&self) -> &[Checkpoint] {
        &self.checkpoints
    }

    pub fn len(&self) -> usize {
        self.checkpoints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.checkpoints.is_empty()
    }

    pub fn get(&self, uri: &str) -> Option<&Checkpoint> {
        self.checkpoints.iter().find(|c| c.uri == uri)
    }

    /// Adds a reported checkpoint. A second report of the same URI is accepted
    /// when it names the same step and epoch, and refused otherwise (a worker
    /// overwrote a checkpoint in place, so neither report can be trusted).
    pub fn record(&mut self, checkpoint: Checkpoint) -> Result<Recorded, CoreError> {
        if let Some(known) = self.get(&checkpoint.uri) {
            if (known.epoch, known.step) != (checkpoint.epoch, checkpoint.step) {
                return Err(CoreError::ConflictingReport {
                    uri: checkpoint.uri.clone(),
                    message: format!(
                        "reported as epoch {} step {}, earlier as epoch {} step {}; write each checkpoint to its own path",
                        checkpoint.epoch, checkpoint.step, known.epoch, known.step
                    ),
                });
            }
            return Ok(Recorded::Again);
        }
        let at = self
            .checkpoints
            .partition_point(|c| c.order_key() < checkpoint.order_key());
        self.checkpoints.insert(at, checkpoint);
        Ok(Recorded::New)
    }

    /// Sets what verification found; false when the URI is not tracked.
    pub fn set_verification(&mut self, uri: &str, verification: Verification) -> bool {
        match self.checkpoints.iter_mut().find(|c| c.uri == uri) {
            Some(checkpoint) => {
                checkpoint.verification = verification;
                true
            }
            None => false,
        }
    }

    /// Forgets deleted checkpoints.
    pub fn remove(&mut self, uris: &[String]) {
        self.checkpoints.retain(|c| !uris.contains(&c.uri));
    }

    pub fn latest_verified(&self) -> Option<&Checkpoint> {
        self.checkpoints
            .iter()
            .rev()
            .find(|c| c.verification.is_verified())
    }

    /// The best verified checkpoint by `keep_best`'s metric and mode (the
    /// newest among equals); none without a metric.
    pub fn best(&self, keep_best: Option<&KeepBest>) -> Option<&Checkpoint> {
        crate::retention::best(&self.checkpoints, keep_best?)
    }

    /// The newest verified checkpoint, and every newer one passed over.
    pub fn resume(&self) -> ResumeChoice<'_> {
        let chosen = self
            .checkpoints
            .iter()
            .rposition(|c| c.verification.is_verified());
        let newer = match chosen {
            Some(index) => &self.checkpoints[index + 1..],
            None => &self.checkpoints[..],
        };
        ResumeChoice {
            checkpoint: chosen.map(|index| &self.checkpoints[index]),
            skipped: newer
                .iter()
                .rev()
                .map(|checkpoint| Skipped {
                    checkpoint,
                    reason: match &checkpoint.verification {
                        Verification::Incomplete { reason } => format!("incomplete: {reason}"),
                        _ => "not verified yet".to_string(),
                    },
                })
                .collect(),
        }
    }

    pub fn summary(&self, policy: Option<&RetentionPolicy>) -> Summary<'_> {
        Summary {
            latest_verified: self.latest_verified(),
            best: self.best(policy.and_then(|p| p.keep_best.as_ref())),
            count: self.checkpoints.len(),
            verified: self
                .checkpoints
                .iter()
                .filter(|c| c.verification.is_verified())
                .count(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::verify::{Method, Verifier};

    /// A checkpoint of step `step` on S3, verified as `verification` says.
    pub(crate) fn checkpoint(step: u64, verification: Verification) -> Checkpoint {
        Checkpoint {
            uri: format!("s3://b/job/step-{step}"),
            epoch: 0,
            step,
            attempt: 0,
            metrics: BTreeMap::new(),
            size_bytes: 0,
            save_seconds: None,
            verification,
        }
    }

    /// Verified by the manager from Trainyard's manifest.
    pub(crate) fn verified() -> Verification {
        Verification::Verified {
            method: Method::TrainyardManifest,
            verifier: Verifier::Manager,
            checksums: true,
        }
    }

    #[test]
    fn resumes_from_the_newest_verified_and_names_what_it_skipped() {
        let mut job = JobCheckpoints::default();
        for (step, v) in [
            (300, Verification::Pending),
            (100, verified()),
            (
                400,
                Verification::Incomplete {
                    reason: "model.pt is missing".into(),
                },
            ),
            (200, verified()),
        ] {
            assert_eq!(job.record(checkpoint(step, v)), Ok(Recorded::New));
        }
        let choice = job.resume();
        assert_eq!(choice.checkpoint.map(|c| c.step), Some(200));
        let skipped: Vec<(u64, &str)> = choice
            .skipped
            .iter()
            .map(|s| (s.checkpoint.step, s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            vec![
                (400, "incomplete: model.pt is missing"),
                (300, "not verified yet")
            ]
        );
        assert_eq!(job.summary(None).count, 4);
        assert_eq!(job.summary(None).verified, 2);
    }

    #[test]
    fn no_verified_checkpoint_means_a_fresh_start() {
        let mut job = JobCheckpoints::default();
        job.record(checkpoint(1, Verification::Pending))
            .expect("new");
        let choice = job.resume();
        assert!(choice.checkpoint.is_none());
        assert_eq!(choice.skipped.len(), 1);
    }

    #[test]
    fn a_repeated_report_is_taken_once_and_a_contradicting_one_refused() {
        let mut job = JobCheckpoints::default();
        job.record(checkpoint(1, Verification::Pending))
            .expect("new");
        assert_eq!(job.record(checkpoint(1, verified())), Ok(Recorded::Again));
        let mut moved = checkpoint(1, Verification::Pending);
        moved.step = 2;
        assert!(matches!(
            job.record(moved),
            Err(CoreError::ConflictingReport { .. })
        ));
        assert_eq!(job.len(), 1);
    }
}
