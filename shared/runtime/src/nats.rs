//! Connecting to NATS and provisioning streams and buckets idempotently.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use trainyard_contracts::{Bucket, StreamSpec};

use crate::error::RuntimeError;
use crate::metrics::RuntimeMetrics;
use crate::settings::NatsSettings;

/// Connects with reconnects forever, backing off exponentially to 5 s.
pub async fn connect(
    service: &str,
    settings: &NatsSettings,
    metrics: &RuntimeMetrics,
) -> Result<async_nats::Client, RuntimeError> {
    let connected = metrics.nats_connected.clone();
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("trainyard-{service}"))
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .reconnect_delay_callback(reconnect_delay)
        .event_callback(move |event| {
            let connected = connected.clone();
            async move {
                match event {
                    async_nats::Event::Connected => connected.set(1),
                    async_nats::Event::Disconnected => {
                        connected.set(0);
                        tracing::warn!("disconnected from NATS; reconnecting");
                    }
                    other => tracing::info!(event = %other, "nats event"),
                }
            }
        });
    if let Some(path) = &settings.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|err| RuntimeError::Connect {
                url: settings.url.clone(),
                message: format!("nats.credentials_file {path}: {err}"),
            })?;
    }
    let client = options
        .connect(settings.url.as_str())
        .await
        .map_err(|err| RuntimeError::Connect {
            url: settings.url.clone(),
            message: err.to_string(),
        })?;
    metrics.nats_connected.set(1);
    Ok(client)
}

/// Delay before reconnect attempt `attempts`: 100 ms doubling, capped at 5 s.
pub fn reconnect_delay(attempts: usize) -> Duration {
    let exponent = attempts.min(6) as u32;
    Duration::from_millis(100 * 2u64.pow(exponent)).min(Duration::from_secs(5))
}

/// The JetStream configuration of a contract stream under these settings.
pub fn stream_config(spec: &StreamSpec, settings: &NatsSettings) -> stream::Config {
    stream::Config {
        name: spec.name.to_string(),
        description: Some(spec.description.to_string()),
        subjects: spec.subjects(),
        storage: stream::StorageType::File,
        num_replicas: settings.replicas,
        max_age: settings.max_age(),
        duplicate_window: settings.duplicate_window(),
        subject_transform: spec.partition_transform().map(|(source, destination)| {
            stream::SubjectTransform {
                source,
                destination,
            }
        }),
        ..Default::default()
    }
}

/// Creates each stream, or updates it to this configuration; safe to run on every start.
pub async fn provision_streams(
    jetstream: &jetstream::Context,
    specs: &[StreamSpec],
    settings: &NatsSettings,
) -> Result<(), RuntimeError> {
    for spec in specs {
        jetstream
            .create_or_update_stream(stream_config(spec, settings))
            .await
            .map_err(|err| RuntimeError::Provision {
                what: format!("stream {}", spec.name),
                message: err.to_string(),
            })?;
    }
    Ok(())
}

/// Creates or updates a key-value bucket.
pub async fn provision_bucket(
    jetstream: &jetstream::Context,
    bucket: Bucket,
    settings: &NatsSettings,
) -> Result<kv::Store, RuntimeError> {
    jetstream
        .create_or_update_key_value(kv::Config {
            bucket: bucket.name().to_string(),
            history: 1,
            storage: stream::StorageType::File,
            num_replicas: settings.replicas,
            max_age: bucket.max_age().unwrap_or_default(),
            ..Default::default()
        })
        .await
        .map_err(|err| RuntimeError::Provision {
            what: format!("bucket {}", bucket.name()),
            message: err.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_backs_off_to_a_cap() {
        assert_eq!(reconnect_delay(0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(3), Duration::from_millis(800));
        assert_eq!(reconnect_delay(50), Duration::from_secs(5));
    }

    #[test]
    fn stream_config_follows_settings() {
        let settings = NatsSettings {
            replicas: 3,
            duplicate_window_seconds: 60,
            ..Default::default()
        };
        let config = stream_config(&trainyard_contracts::streams::EVENTS, &settings);
        assert_eq!(config.num_replicas, 3);
        assert_eq!(config.duplicate_window, Duration::from_secs(60));
        assert_eq!(config.storage, stream::StorageType::File);
        assert!(config.subject_transform.is_some());
    }
}
