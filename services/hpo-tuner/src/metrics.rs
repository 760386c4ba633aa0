//! The tuner's Prometheus metrics. Labels are bounded: reasons and operations,
//! never a sweep or trial name.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::error::TunerError;

#[derive(Clone)]
pub struct TunerMetrics {
    /// Trials requested (counted when decided, once per trial).
    pub trials_requested: IntCounter,
    /// Trials stopped by the tuner, by reason (`early_stopped`, `non_finite`, `sweep_finished`).
    pub trials_stopped: IntCounterVec,
    /// Sweeps with state that have not finished.
    pub sweeps_active: IntGauge,
    /// Sweeps that finished, by reason (the `finished_reason` names).
    pub sweeps_finished: IntCounterVec,
    /// Writes of sweep state lost to a concurrent writer (the message is retried).
    pub state_conflicts: IntCounter,
    /// MLflow tracking failures after retries, by operation.
    pub mlflow_errors: IntCounterVec,
    /// Sweeps whose trial template names a tracking server the allow-list
    /// does not admit (recorded on the tuner's own server instead).
    pub mlflow_servers_refused: IntCounter,
}

impl TunerMetrics {
    pub fn register(registry: &Registry) -> Result<Self, TunerError> {
        let err = |e: prometheus::Error| TunerError::Metrics(e.to_string());
        let metrics = Self {
            trials_requested: IntCounter::new(
                "trainyard_tuner_trials_requested_total",
                "Trials requested by the hpo-tuner",
            )
            .map_err(err)?,
            trials_stopped: IntCounterVec::new(
                Opts::new(
                    "trainyard_tuner_trials_stopped_total",
                    "Trials stopped by the hpo-tuner, by reason",
                ),
                &["reason"],
            )
            .map_err(err)?,
            sweeps_active: IntGauge::new(
                "trainyard_tuner_sweeps_active",
                "Sweeps with stored state that have not finished",
            )
            .map_err(err)?,
            sweeps_finished: IntCounterVec::new(
                Opts::new(
                    "trainyard_tuner_sweeps_finished_total",
                    "Sweeps that finished, by reason",
                ),
                &["reason"],
            )
            .map_err(err)?,
            state_conflicts: IntCounter::new(
                "trainyard_tuner_state_conflicts_total",
                "Sweep state writes that lost to a concurrent writer and were retried",
            )
            .map_err(err)?,
            mlflow_errors: IntCounterVec::new(
                Opts::new(
                    "trainyard_tuner_mlflow_errors_total",
                    "MLflow tracking operations that failed after retries, by operation",
                ),
                &["operation"],
            )
            .map_err(err)?,
            mlflow_servers_refused: IntCounter::new(
                "trainyard_tuner_mlflow_servers_refused_total",
                "Sweeps whose trial template names an MLflow server not in mlflow_allowed_tracking_uris",
            )
            .map_err(err)?,
        };
        registry
            .register(Box::new(metrics.trials_requested.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.trials_stopped.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.sweeps_active.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.sweeps_finished.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.state_conflicts.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.mlflow_errors.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(metrics.mlflow_servers_refused.clone()))
            .map_err(err)?;
        Ok(metrics)
    }
}
