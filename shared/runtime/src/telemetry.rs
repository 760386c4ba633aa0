//! Logs and traces. JSON logs by default; OpenTelemetry spans always get ids (so
//! trace context flows across NATS even with no collector) and are exported over
//! OTLP/HTTP only when an endpoint is configured.

use std::collections::HashMap;

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};
use trainyard_contracts::TraceContext;

use crate::error::RuntimeError;
use crate::settings::{LogFormat, TelemetrySettings};

/// Flushes and shuts the tracer down when dropped; keep it alive until `main` returns.
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        // Shutdown flushes pending spans; a collector that is gone must not block exit.
        if let Err(err) = self.provider.shutdown() {
            eprintln!("telemetry shutdown: {err}");
        }
    }
}

/// Installs the global subscriber: logs to stdout, spans to OpenTelemetry.
pub fn init(service: &str, settings: &TelemetrySettings) -> Result<TelemetryGuard, RuntimeError> {
    let provider = tracer_provider(service, settings)?;
    let tracer = provider.tracer(service.to_string());
    let filter = EnvFilter::try_new(&settings.log_level).map_err(|err| {
        RuntimeError::Telemetry(format!(
            "telemetry.log_level {:?}: {err}",
            settings.log_level
        ))
    })?;
    let logs = match settings.log_format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer().boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init()
        .map_err(|err| RuntimeError::Telemetry(err.to_string()))?;
    Ok(TelemetryGuard { provider })
}

fn tracer_provider(
    service: &str,
    settings: &TelemetrySettings,
) -> Result<SdkTracerProvider, RuntimeError> {
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(format!("trainyard-{service}"))
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if let Some(endpoint) = &settings.otlp_endpoint {
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .build()
            .map_err(|err| {
                RuntimeError::Telemetry(format!("telemetry.otlp_endpoint {endpoint:?}: {err}"))
            })?;
        builder = builder.with_batch_exporter(exporter);
    }
    Ok(builder.build())
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct MapExtractor<'a>(&'a HashMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Writes the current span's W3C trace context into NATS headers.
pub fn inject_current(headers: &mut HeaderMap) {
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
}

/// The current span's W3C trace context, for the envelope.
pub fn current_trace_context() -> TraceContext {
    let mut carrier = HashMap::new();
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    TraceContext {
        traceparent: carrier.remove("traceparent"),
        tracestate: carrier.remove("tracestate").filter(|s| !s.is_empty()),
    }
}

/// Makes `span` a child of the trace in `headers` (falling back to the envelope's copy).
pub fn link_parent(
    span: &tracing::Span,
    headers: Option<&HeaderMap>,
    envelope: Option<&TraceContext>,
) {
    let mut carrier = HashMap::new();
    if let Some(headers) = headers {
        for key in ["traceparent", "tracestate"] {
            if let Some(value) = headers.get(key) {
                carrier.insert(key.to_string(), value.as_str().to_string());
            }
        }
    }
    if !carrier.contains_key("traceparent")
        && let Some(TraceContext {
            traceparent: Some(parent),
            tracestate,
        }) = envelope
    {
        carrier.insert("traceparent".to_string(), parent.clone());
        if let Some(state) = tracestate {
            carrier.insert("tracestate".to_string(), state.clone());
        }
    }
    if carrier.is_empty() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&MapExtractor(&carrier));
    // A span already closed or without an OpenTelemetry layer cannot take a parent; nothing to link then.
    let _ = span.set_parent(parent);
}
