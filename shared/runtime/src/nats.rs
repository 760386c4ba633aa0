//! Connecting to NATS and provisioning streams and buckets idempotently.

use std::path::PathBuf;
use std::time::Duration;
use trainyard_contracts::backoff::capped_doubling;

use async_nats::jetstream::{self, kv, stream};
use trainyard_contracts::permissions::Identity;
use trainyard_contracts::streams::Discard;
use trainyard_contracts::{Bucket, Service, StreamSpec};

use crate::error::RuntimeError;
use crate::metrics::RuntimeMetrics;
use crate::settings::NatsSettings;

/// Connects as `service`'s own identity with reconnects forever, backing off
/// exponentially to 5 s.
pub async fn connect(
    service: Service,
    settings: &NatsSettings,
    metrics: &RuntimeMetrics,
) -> Result<async_nats::Client, RuntimeError> {
    let connected = metrics.nats_connected.clone();
    let options = async_nats::ConnectOptions::new()
        .name(format!("trainyard-{}", service.name()))
        // Replies come back under the identity's own prefix, the only inbox its
        // permissions let it subscribe to.
        .custom_inbox_prefix(Identity::Service(service).inbox_prefix())
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
    let client = authenticate(options, settings)
        .await?
        .connect(servers(&settings.url))
        .await
        .map_err(|err| RuntimeError::Connect {
            url: settings.url.clone(),
            message: err.to_string(),
        })?;
    metrics.nats_connected.set(1);
    Ok(client)
}

/// The servers of a NATS URL setting: one URL, or several separated by
/// commas (the servers of a cluster), as the NATS tools take them. The
/// client tries them in turn and follows the cluster's own list after.
pub fn servers(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Adds the credentials and TLS settings to `options`.
pub async fn authenticate(
    mut options: async_nats::ConnectOptions,
    settings: &NatsSettings,
) -> Result<async_nats::ConnectOptions, RuntimeError> {
    let failed = |key: &str, path: &str, err: std::io::Error| RuntimeError::Connect {
        url: settings.url.clone(),
        message: format!("nats.{key} {path}: {err}"),
    };
    if let Some(path) = &settings.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|err| failed("credentials_file", path, err))?;
    }
    match (&settings.user, &settings.password_file) {
        (Some(user), Some(path)) => {
            let password =
                std::fs::read_to_string(path).map_err(|err| failed("password_file", path, err))?;
            options = options.user_and_password(user.clone(), password.trim_end().to_string());
        }
        (None, None) => {}
        _ => {
            return Err(RuntimeError::Connect {
                url: settings.url.clone(),
                message: "nats.user and nats.password_file go together: set both or neither"
                    .to_string(),
            });
        }
    }
    if settings.tls_ca_file.is_some() || settings.tls_cert_file.is_some() {
        // Several rustls crypto providers can be linked into one binary (kube
        // brings aws-lc-rs); without a process default, rustls refuses to choose.
        // An error only means a default is already installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if let Some(ca) = &settings.tls_ca_file {
        options = options
            .require_tls(true)
            .add_root_certificates(PathBuf::from(ca));
    }
    match (&settings.tls_cert_file, &settings.tls_key_file) {
        (Some(cert), Some(key)) => {
            options = options.add_client_certificate(PathBuf::from(cert), PathBuf::from(key));
        }
        (None, None) => {}
        _ => {
            return Err(RuntimeError::Connect {
                url: settings.url.clone(),
                message:
                    "nats.tls_cert_file and nats.tls_key_file go together: set both or neither"
                        .to_string(),
            });
        }
    }
    Ok(options)
}

/// Delay before reconnect attempt `attempts`: 100 ms doubling, capped at 5 s.
pub fn reconnect_delay(attempts: usize) -> Duration {
    capped_doubling(
        Duration::from_millis(100),
        u32::try_from(attempts).unwrap_or(u32::MAX),
        Duration::from_secs(5),
    )
}

/// The JetStream configuration of a contract stream under these settings.
pub fn stream_config(
    spec: &StreamSpec,
    settings: &NatsSettings,
) -> Result<stream::Config, RuntimeError> {
    Ok(stream::Config {
        name: spec.name.to_string(),
        description: Some(spec.description.to_string()),
        subjects: spec.subjects(),
        storage: stream::StorageType::File,
        num_replicas: settings.replicas,
        max_age: settings.max_age(),
        duplicate_window: settings.duplicate_window(),
        max_bytes: settings.max_bytes(spec)?,
        discard: match spec.discard {
            Discard::Old => stream::DiscardPolicy::Old,
            Discard::New => stream::DiscardPolicy::New,
        },
        subject_transform: spec.partition_transform().map(|(source, destination)| {
            stream::SubjectTransform {
                source,
                destination,
            }
        }),
        ..Default::default()
    })
}

/// Creates each stream, or updates it to this configuration (limits and
/// discard policy included); safe to run on every start.
pub async fn provision_streams(
    jetstream: &jetstream::Context,
    specs: &[StreamSpec],
    settings: &NatsSettings,
) -> Result<(), RuntimeError> {
    for spec in specs {
        jetstream
            .create_or_update_stream(stream_config(spec, settings)?)
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
    fn a_url_setting_names_one_server_or_a_clusters_separated_by_commas() {
        assert_eq!(servers("nats://a:4222"), vec!["nats://a:4222"]);
        assert_eq!(
            servers("nats://a:4222, nats://b:4222,,nats://c:4222"),
            vec!["nats://a:4222", "nats://b:4222", "nats://c:4222"]
        );
    }

    #[test]
    fn stream_config_follows_settings() {
        let settings = NatsSettings {
            replicas: 3,
            duplicate_window_seconds: 60,
            ..Default::default()
        };
        let config =
            stream_config(&trainyard_contracts::streams::EVENTS, &settings).expect("valid");
        assert_eq!(config.num_replicas, 3);
        assert_eq!(config.discard, stream::DiscardPolicy::New);
        assert_eq!(
            config.max_bytes,
            trainyard_contracts::streams::EVENTS.default_max_bytes
        );
        assert_eq!(config.duplicate_window, Duration::from_secs(60));
        assert_eq!(config.storage, stream::StorageType::File);
        assert!(config.subject_transform.is_some());
    }
}
