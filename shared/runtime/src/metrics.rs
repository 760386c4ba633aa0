//! Prometheus metrics of the runtime itself. Services register theirs on the same
//! registry. Labels are bounded: consumer names, outcomes and error categories,
//! never a job name.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::error::RuntimeError;

/// Handles for the runtime's metrics, registered once.
#[derive(Clone)]
pub struct RuntimeMetrics {
    /// Messages handled, by consumer and outcome (`ack`, `retry`, `dead_letter`).
    pub messages: IntCounterVec,
    /// Messages sent to the dead-letter subject, by consumer and category.
    pub dead_letters: IntCounterVec,
    /// Handler time, by consumer.
    pub handle_seconds: HistogramVec,
    /// From a message's publication (its envelope `time`) to the start of its
    /// handling, by consumer: how far a consumer lags, in time.
    pub message_age_seconds: HistogramVec,
    /// Messages published, by message type.
    pub published: IntCounterVec,
    /// 1 while connected to NATS.
    pub nats_connected: IntGauge,
    /// 1 while this replica holds the lease, by lease.
    pub lease_held: IntGaugeVec,
    /// Lease changes, by lease and transition (`acquired`, `lost`, `released`).
    pub lease_transitions: IntCounterVec,
}

impl RuntimeMetrics {
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let messages = IntCounterVec::new(
            Opts::new(
                "trainyard_messages_handled_total",
                "Messages handled, by consumer and outcome",
            ),
            &["consumer", "outcome"],
        );
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "trainyard_dead_letters_total",
                "Messages sent to the dead-letter subject",
            ),
            &["consumer", "category"],
        );
        let handle_seconds = HistogramVec::new(
            HistogramOpts::new("trainyard_handle_seconds", "Time to handle one message").buckets(
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
                ],
            ),
            &["consumer"],
        );
        let message_age_seconds = HistogramVec::new(
            HistogramOpts::new(
                "trainyard_message_age_seconds",
                "Time from a message's publication to the start of its handling",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ]),
            &["consumer"],
        );
        let published = IntCounterVec::new(
            Opts::new(
                "trainyard_messages_published_total",
                "Messages published, by type",
            ),
            &["type"],
        );
        let nats_connected = IntGauge::new("trainyard_nats_connected", "1 while connected to NATS");
        let lease_held = IntGaugeVec::new(
            Opts::new(
                "trainyard_lease_held",
                "1 while this replica holds the lease and is the active one",
            ),
            &["lease"],
        );
        let lease_transitions = IntCounterVec::new(
            Opts::new(
                "trainyard_lease_transitions_total",
                "Lease changes of this replica, by transition (acquired, lost, released)",
            ),
            &["lease", "transition"],
        );
        let metrics = Self {
            messages: messages.map_err(metric_error)?,
            dead_letters: dead_letters.map_err(metric_error)?,
            handle_seconds: handle_seconds.map_err(metric_error)?,
            message_age_seconds: message_age_seconds.map_err(metric_error)?,
            published: published.map_err(metric_error)?,
            nats_connected: nats_connected.map_err(metric_error)?,
            lease_held: lease_held.map_err(metric_error)?,
            lease_transitions: lease_transitions.map_err(metric_error)?,
        };
        registry
            .register(Box::new(metrics.messages.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.dead_letters.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.handle_seconds.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.message_age_seconds.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.published.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.nats_connected.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.lease_held.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.lease_transitions.clone()))
            .map_err(metric_error)?;
        Ok(metrics)
    }
}

/// Maps a registration error (a programming error such as a duplicate name) into ours.
pub fn metric_error(err: prometheus::Error) -> RuntimeError {
    RuntimeError::Telemetry(format!("metric registration: {err}"))
}
