//! Prometheus metrics of the runtime itself. Services register theirs on the same
//! registry. Labels are bounded: consumer names, outcomes and error categories,
//! never a job name.

use prometheus::process_collector::ProcessCollector;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::error::RuntimeError;

/// Handles for the runtime's metrics, registered once.
#[derive(Clone)]
pub struct RuntimeMetrics {
    /// Messages handled, by consumer and outcome (`ack`, `retry`, `dead_letter`;
    /// `transient` once per passing failure handled again in place).
    pub messages: IntCounterVec,
    /// Messages sent to the dead-letter subject, by stream, consumer and category.
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
                "Messages sent to the dead-letter subject, by the stream they came from, consumer and category",
            ),
            &["stream", "consumer", "category"],
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

/// Registers `trainyard_build_info` (always 1; the labels say which service
/// and which release runs) and the standard `process_*` metrics of this
/// process (CPU seconds, resident memory, open file descriptors, start time).
pub fn register_process_metrics(registry: &Registry, service: &str) -> Result<(), RuntimeError> {
    let build_info = IntGaugeVec::new(
        Opts::new(
            "trainyard_build_info",
            "Always 1; labels name the service and its release",
        ),
        &["service", "version"],
    )
    .map_err(metric_error)?;
    build_info
        .with_label_values(&[service, env!("CARGO_PKG_VERSION")])
        .set(1);
    registry
        .register(Box::new(build_info))
        .map_err(metric_error)?;
    registry
        .register(Box::new(ProcessCollector::for_self()))
        .map_err(metric_error)?;
    Ok(())
}

/// Size of each JetStream stream against its limits, as the server reports
/// it. Every service reports every stream (they all provision them), so
/// queries take `max by (stream)`.
#[derive(Clone)]
pub struct StreamMetrics {
    pub bytes: IntGaugeVec,
    pub messages: IntGaugeVec,
    /// 0 when the stream has no byte limit.
    pub max_bytes: IntGaugeVec,
}

impl StreamMetrics {
    pub fn register(registry: &Registry) -> Result<Self, RuntimeError> {
        let gauge = |name: &str, help: &str| {
            let gauge =
                IntGaugeVec::new(Opts::new(name, help), &["stream"]).map_err(metric_error)?;
            registry
                .register(Box::new(gauge.clone()))
                .map_err(metric_error)?;
            Ok::<_, RuntimeError>(gauge)
        };
        Ok(Self {
            bytes: gauge(
                "trainyard_stream_bytes",
                "Bytes stored in a JetStream stream",
            )?,
            messages: gauge(
                "trainyard_stream_messages",
                "Messages stored in a JetStream stream",
            )?,
            max_bytes: gauge(
                "trainyard_stream_max_bytes",
                "Byte limit of a JetStream stream (0: none)",
            )?,
        })
    }

    /// Records one stream's figures.
    pub fn observe(&self, stream: &str, bytes: u64, messages: u64, max_bytes: i64) {
        let clamp = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.bytes.with_label_values(&[stream]).set(clamp(bytes));
        self.messages
            .with_label_values(&[stream])
            .set(clamp(messages));
        self.max_bytes
            .with_label_values(&[stream])
            .set(max_bytes.max(0));
    }
}

/// Maps a registration error (a programming error such as a duplicate name) into ours.
pub fn metric_error(err: prometheus::Error) -> RuntimeError {
    RuntimeError::Telemetry(format!("metric registration: {err}"))
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .expect("encodes");
        String::from_utf8(text).expect("utf-8")
    }

    #[test]
    fn build_info_and_process_metrics_are_exposed() {
        let registry = Registry::new();
        register_process_metrics(&registry, "planner").expect("registers");
        let text = exposition(&registry);
        let build_info = format!(
            "trainyard_build_info{{service=\"planner\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&build_info), "{text}");
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.contains(&format!("\n{name} ")),
                "{name} missing from {text}"
            );
        }
    }

    #[test]
    fn streams_report_their_size_and_an_unlimited_stream_a_zero_limit() {
        let registry = Registry::new();
        let streams = StreamMetrics::register(&registry).expect("registers");
        streams.observe("TRAINYARD_EVENTS", 2048, 10, 1 << 20);
        streams.observe("TRAINYARD_WORKER", 512, 3, -1);
        let text = exposition(&registry);
        for line in [
            "trainyard_stream_bytes{stream=\"TRAINYARD_EVENTS\"} 2048",
            "trainyard_stream_messages{stream=\"TRAINYARD_EVENTS\"} 10",
            "trainyard_stream_max_bytes{stream=\"TRAINYARD_EVENTS\"} 1048576",
            "trainyard_stream_max_bytes{stream=\"TRAINYARD_WORKER\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
    }
}
