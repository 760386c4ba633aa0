//! Layered configuration: built-in defaults, then an optional file, then
//! `TRAINYARD_*` environment variables (`TRAINYARD_NATS__URL=nats://…`; `__`
//! separates sections). Binaries pass the environment in, so the library never
//! reads it itself.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use trainyard_contracts::StreamSpec;
use trainyard_contracts::subject::Family;

use crate::error::RuntimeError;

/// Settings every service shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct Settings {
    pub nats: NatsSettings,
    pub http: HttpSettings,
    pub telemetry: TelemetrySettings,
    /// Seconds in-flight work may take after SIGTERM before the service exits anyway.
    pub shutdown_grace_seconds: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nats: NatsSettings::default(),
            http: HttpSettings::default(),
            telemetry: TelemetrySettings::default(),
            shutdown_grace_seconds: 8,
        }
    }
}

/// How to reach NATS and how streams and consumers are provisioned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct NatsSettings {
    /// The server's URL, or several separated by commas (a cluster's).
    pub url: String,
    /// Path of a NATS credentials file, if the server requires one.
    pub credentials_file: Option<String>,
    /// NATS user name (the service's own identity in `deploy/nats/auth.conf`).
    pub user: Option<String>,
    /// Path of a file holding the user's password (a mounted Secret).
    pub password_file: Option<String>,
    /// CA bundle the server's certificate must chain to; setting it requires TLS.
    pub tls_ca_file: Option<String>,
    /// Client certificate and key, for servers that verify clients.
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    /// Stream replicas: 1 on a laptop, 3 in production clusters.
    pub replicas: usize,
    /// How long streams keep messages.
    pub max_age_seconds: u64,
    /// Window in which JetStream drops a repeated `Nats-Msg-Id`.
    pub duplicate_window_seconds: u64,
    /// Deliveries before a failing message goes to the dead-letter subject.
    pub max_deliver: i64,
    /// Seconds a consumer has to ack before redelivery.
    pub ack_wait_seconds: u64,
    /// Messages a pull requests at a time (and at most in flight with lanes).
    pub batch_size: usize,
    /// Byte limit per stream, keyed by subject family (`events`, `decisions`,
    /// `worker`, `commands`, `alerts`, `submit`, `lifecycle`, `deadletter`);
    /// a stream not named keeps its contract default.
    pub stream_max_bytes: BTreeMap<String, i64>,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_string(),
            credentials_file: None,
            user: None,
            password_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            replicas: 1,
            max_age_seconds: 7 * 24 * 3600,
            duplicate_window_seconds: 120,
            max_deliver: 5,
            ack_wait_seconds: 30,
            batch_size: 64,
            stream_max_bytes: BTreeMap::new(),
        }
    }
}

impl NatsSettings {
    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.max_age_seconds)
    }
    pub fn duplicate_window(&self) -> Duration {
        Duration::from_secs(self.duplicate_window_seconds)
    }
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_seconds)
    }

    /// The byte limit of `spec`: configured, else the contract's default.
    /// A key that names no stream family, or a limit that is not positive, is
    /// refused with the key.
    pub fn max_bytes(&self, spec: &StreamSpec) -> Result<i64, RuntimeError> {
        for (family, bytes) in &self.stream_max_bytes {
            let key = format!("nats.stream_max_bytes.{family}");
            if !Family::ALL.iter().any(|f| f.as_str() == family) {
                let families: Vec<&str> = Family::ALL.iter().map(|f| f.as_str()).collect();
                return Err(RuntimeError::Settings(format!(
                    "{key}: no such stream family; use one of {}",
                    families.join(", ")
                )));
            }
            if *bytes <= 0 {
                return Err(RuntimeError::Settings(format!(
                    "{key}: {bytes} is not a byte limit; give a positive number of bytes"
                )));
            }
        }
        Ok(self
            .stream_max_bytes
            .get(spec.family.as_str())
            .copied()
            .unwrap_or(spec.default_max_bytes))
    }
}

/// The `/metrics`, `/healthz` and `/readyz` listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct HttpSettings {
    /// Address to listen on; in a cluster set `0.0.0.0:9090` so Prometheus can scrape.
    pub listen: String,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9090".to_string(),
        }
    }
}

/// Logs and traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct TelemetrySettings {
    /// `tracing` filter directive, e.g. `info,trainyard_planner=debug`.
    pub log_level: String,
    /// `json` (default) or `text`.
    pub log_format: LogFormat,
    /// OTLP/HTTP endpoint (e.g. `http://otel-collector:4318/v1/traces`); traces are exported only when set.
    pub otlp_endpoint: Option<String>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            log_level: "info".to_string(),
            log_format: LogFormat::Json,
            otlp_endpoint: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Json,
    Text,
}

/// The merged configuration sources, from which the shared [`Settings`] and each
/// service's own section are read.
#[derive(Debug, Clone)]
pub struct ConfigSources {
    merged: config::Config,
}

impl ConfigSources {
    /// Defaults, then `file` (if given; it must exist), then `TRAINYARD_*` variables from `env`.
    pub fn load(file: Option<&Path>, env: HashMap<String, String>) -> Result<Self, RuntimeError> {
        let defaults =
            config::Config::try_from(&Settings::default()).map_err(RuntimeError::Config)?;
        let mut builder = config::Config::builder().add_source(defaults);
        if let Some(file) = file {
            builder = builder.add_source(config::File::from(file).required(true));
        }
        let env = config::Environment::with_prefix("TRAINYARD")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .source(Some(env.into_iter().collect()));
        let merged = builder
            .add_source(env)
            .build()
            .map_err(RuntimeError::Config)?;
        Ok(Self { merged })
    }

    /// The settings every service shares.
    pub fn settings(&self) -> Result<Settings, RuntimeError> {
        self.merged
            .clone()
            .try_deserialize()
            .map_err(RuntimeError::Config)
    }

    /// A service's own section (e.g. `planner`), defaults for missing keys.
    pub fn section<T: DeserializeOwned + Default>(&self, name: &str) -> Result<T, RuntimeError> {
        match self.merged.get::<T>(name) {
            Ok(value) => Ok(value),
            Err(config::ConfigError::NotFound(_)) => Ok(T::default()),
            Err(err) => Err(RuntimeError::Config(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_then_file_then_environment() {
        let dir = std::env::temp_dir().join(format!("trainyard-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("config.toml");
        std::fs::write(&file, "[nats]\nurl = \"nats://file:4222\"\nreplicas = 3\n").expect("write");
        let sources = ConfigSources::load(
            Some(&file),
            env(&[
                ("TRAINYARD_NATS__URL", "nats://env:4222"),
                ("OTHER_NATS__URL", "ignored"),
            ]),
        )
        .expect("loads");
        let settings = sources.settings().expect("settings");
        assert_eq!(
            settings.nats.url, "nats://env:4222",
            "environment wins over file"
        );
        assert_eq!(settings.nats.replicas, 3, "file wins over defaults");
        assert_eq!(settings.nats.max_deliver, 5, "defaults fill the rest");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn stream_limits_come_from_the_environment_or_the_contract() {
        let sources = ConfigSources::load(
            None,
            env(&[("TRAINYARD_NATS__STREAM_MAX_BYTES__WORKER", "1048576")]),
        )
        .expect("loads");
        let settings = sources.settings().expect("settings").nats;
        let worker = trainyard_contracts::streams::WORKER;
        let events = trainyard_contracts::streams::EVENTS;
        assert_eq!(settings.max_bytes(&worker).expect("valid"), 1048576);
        assert_eq!(
            settings.max_bytes(&events).expect("valid"),
            events.default_max_bytes
        );
    }

    #[test]
    fn a_limit_for_an_unknown_stream_or_of_no_bytes_names_its_key() {
        let mut settings = NatsSettings::default();
        settings.stream_max_bytes.insert("progress".into(), 10);
        let err = settings
            .max_bytes(&trainyard_contracts::streams::WORKER)
            .expect_err("no such family")
            .to_string();
        assert!(err.contains("nats.stream_max_bytes.progress"), "{err}");
        assert!(err.contains("worker"), "{err}");
        let mut settings = NatsSettings::default();
        settings.stream_max_bytes.insert("events".into(), 0);
        let err = settings
            .max_bytes(&trainyard_contracts::streams::WORKER)
            .expect_err("no bytes")
            .to_string();
        assert!(err.contains("nats.stream_max_bytes.events"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let sources = ConfigSources::load(None, env(&[("TRAINYARD_NATS__REPLICAS", "three")]))
            .expect("loads");
        let err = sources.settings().expect_err("not a number").to_string();
        assert!(err.contains("replicas"), "{err}");
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Own {
        #[serde(default)]
        ttl_seconds: u64,
    }

    #[test]
    fn service_sections_default_when_absent() {
        let sources = ConfigSources::load(None, env(&[("TRAINYARD_PLANNER__TTL_SECONDS", "60")]))
            .expect("loads");
        assert_eq!(
            sources
                .section::<Own>("planner")
                .expect("section")
                .ttl_seconds,
            60
        );
        assert_eq!(
            sources.section::<Own>("notifier").expect("section"),
            Own::default()
        );
    }
}
