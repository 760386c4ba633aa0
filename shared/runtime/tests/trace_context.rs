//! W3C trace context crosses NATS: the handler's span continues the publisher's trace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::trace::TraceContextExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use trainyard_contracts::worker::CheckpointReported;
use trainyard_contracts::{EntityRef, Incoming, Service, streams};
use trainyard_runtime::settings::{LogFormat, TelemetrySettings};
use trainyard_runtime::{Delivery, HandleError, Handler, Runtime, Settings, telemetry};
use trainyard_testkit::NatsServer;

#[derive(Default)]
struct TraceRecorder {
    trace_ids: Mutex<Vec<String>>,
}

impl Handler for TraceRecorder {
    async fn handle(&self, _message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let context = tracing::Span::current().context();
        let trace_id = context.span().span_context().trace_id().to_string();
        self.trace_ids.lock().expect("lock").push(trace_id);
        Ok(())
    }
}

#[tokio::test]
async fn handler_span_continues_the_publishers_trace() {
    let _guard = telemetry::init(
        "test",
        &TelemetrySettings {
            log_level: "warn".to_string(),
            log_format: LogFormat::Text,
            otlp_endpoint: None,
        },
    )
    .expect("telemetry");
    let nats = NatsServer::start();
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(
        Service::CheckpointManager,
        settings,
        CancellationToken::new(),
    )
    .await
    .expect("starts");

    let span = tracing::info_span!("worker-publishes");
    let published_trace = span.context().span().span_context().trace_id().to_string();
    let envelope = runtime.publisher.envelope(
        EntityRef::new("ml", "bert", ""),
        CheckpointReported {
            worker_index: 0,
            attempt: 0,
            epoch: 2,
            step: 20,
            uri: "/ckpt/2".to_string(),
            size_bytes: 1,
            metrics: Default::default(),
            ..Default::default()
        },
    );
    runtime
        .publisher
        .publish(envelope)
        .instrument(span)
        .await
        .expect("publish");

    let recorder = Arc::new(TraceRecorder::default());
    let spec = Service::CheckpointManager
        .consumers()
        .into_iter()
        .find(|c| c.stream == streams::WORKER)
        .expect("the checkpoint-manager reads worker reports");
    runtime.spawn_consumer(spec, recorder.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorder.trace_ids.lock().expect("lock").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        *recorder.trace_ids.lock().expect("lock"),
        vec![published_trace]
    );
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}
