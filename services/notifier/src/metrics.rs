//! The notifier's metrics. Labels are receivers (from the operator's config)
//! and outcomes, never a job.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use trainyard_runtime::RuntimeError;
use trainyard_runtime::metrics::metric_error;

#[derive(Clone)]
pub struct NotifierMetrics {
    /// Notifications by receiver and outcome: `sent`, `retrying`, `failed`,
    /// `disabled`; events by `muted`, `repeat`, `refused`.
    pub notifications: IntCounterVec,
    /// From a group being due to its notification delivered, by receiver.
    pub delivery_seconds: HistogramVec,
    /// Config reloads by outcome (`applied`, `rejected`).
    pub reloads: IntCounterVec,
    /// Events waiting in this replica's groups or deliveries.
    pub pending: IntGauge,
    /// Times the shared pace bucket did not answer and this replica paced
    /// alone, by operation (`book`, `check`, `hold`).
    pub pace_fallbacks: IntCounterVec,
}

impl NotifierMetrics {
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let metrics = Self {
            notifications: IntCounterVec::new(
                Opts::new(
                    "trainyard_notifications_total",
                    "Notifications by receiver and outcome",
                ),
                &["receiver", "outcome"],
            )
            .map_err(metric_error)?,
            delivery_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "trainyard_notification_delivery_seconds",
                    "From a group being due to its notification delivered",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0,
                ]),
                &["receiver"],
            )
            .map_err(metric_error)?,
            reloads: IntCounterVec::new(
                Opts::new(
                    "trainyard_notifier_config_reloads_total",
                    "Routing config reloads by outcome",
                ),
                &["outcome"],
            )
            .map_err(metric_error)?,
            pending: IntGauge::new(
                "trainyard_notifier_pending_events",
                "Events waiting in this replica's groups and deliveries",
            )
            .map_err(metric_error)?,
            pace_fallbacks: IntCounterVec::new(
                Opts::new(
                    "trainyard_notifier_pace_fallbacks_total",
                    "Times the shared pace bucket did not answer and this replica paced alone",
                ),
                &["operation"],
            )
            .map_err(metric_error)?,
        };
        registry
            .register(Box::new(metrics.notifications.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.delivery_seconds.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.reloads.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.pending.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.pace_fallbacks.clone()))
            .map_err(metric_error)?;
        Ok(metrics)
    }
}
