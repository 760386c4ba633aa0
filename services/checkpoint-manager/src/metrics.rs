//! The checkpoint-manager's Prometheus metrics; labels are bounded (outcomes, never job names).

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::error::CheckpointError;

#[derive(Clone)]
pub struct CheckpointMetrics {
    /// Checkpoints checked, by outcome (`verified`, `incomplete`, `rejected`).
    pub verifications: IntCounterVec,
    /// Checkpoints deleted under retention policies.
    pub deleted: IntCounter,
    /// Resume points published.
    pub resume_points: IntCounter,
    /// Model registrations of completed jobs, by outcome (`registered`,
    /// `existing`, `refused`, `retried`).
    pub registrations: IntCounterVec,
    /// `CheckpointProblem` alerts raised, by problem (`WriteFailed`,
    /// `Overdue`, `ResumeUnavailable`, `RetentionFailed`).
    pub problems: IntCounterVec,
    /// Jobs whose checkpoint reports wait for their storage to answer.
    pub waiting_jobs: IntGauge,
    /// Registrations on the manager's own MLflow server because the job's
    /// `monitoring.mlflowTrackingUri` is not in `mlflow_allowed_tracking_uris`.
    pub mlflow_servers_refused: IntCounter,
}

impl CheckpointMetrics {
    pub fn register(registry: &Registry) -> Result<Self, CheckpointError> {
        let err = |e: prometheus::Error| CheckpointError::Metrics(e.to_string());
        let metrics = Self {
            verifications: IntCounterVec::new(
                Opts::new(
                    "trainyard_checkpoint_verifications_total",
                    "Reported checkpoints checked, by outcome",
                ),
                &["outcome"],
            )
            .map_err(err)?,
            deleted: IntCounter::new(
                "trainyard_checkpoint_retention_deleted_total",
                "Checkpoints deleted under retention policies",
            )
            .map_err(err)?,
            resume_points: IntCounter::new(
                "trainyard_checkpoint_resume_points_total",
                "Resume points published",
            )
            .map_err(err)?,
            registrations: IntCounterVec::new(
                Opts::new(
                    "trainyard_checkpoint_registrations_total",
                    "Model registrations of completed jobs' checkpoints, by outcome",
                ),
                &["outcome"],
            )
            .map_err(err)?,
            problems: IntCounterVec::new(
                Opts::new(
                    "trainyard_checkpoint_problems_total",
                    "CheckpointProblem alerts raised, by problem",
                ),
                &["problem"],
            )
            .map_err(err)?,
            waiting_jobs: IntGauge::new(
                "trainyard_checkpoint_waiting_jobs",
                "Jobs whose checkpoint reports wait for their storage to answer",
            )
            .map_err(err)?,
            mlflow_servers_refused: IntCounter::new(
                "trainyard_checkpoint_mlflow_servers_refused_total",
                "Registrations on the manager's own MLflow server because the job names one not in mlflow_allowed_tracking_uris",
            )
            .map_err(err)?,
        };
        registry
            .register(Box::new(metrics.verifications.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.deleted.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.resume_points.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.registrations.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.problems.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.waiting_jobs.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.mlflow_servers_refused.clone()))
            .map_err(err)?;
        Ok(metrics)
    }
}
