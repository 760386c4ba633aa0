//! The notifier: tells people what happened to their training, in Slack and
//! through signed webhooks. It consumes lifecycle transitions, sweep progress,
//! budget decisions and alerts, routes them with `notifier-core`, stores each
//! (event, destination) in the outbox bucket, and sends from there: grouped,
//! claimed with compare-and-set so no replica sends what another did, paced
//! per Slack channel and held after a 429 per channel and webhook endpoint
//! across the replicas, retried, and dead-lettered when retries run out.

pub mod dispatch;
pub mod error;
pub mod ingest;
pub mod live;
pub mod metrics;
pub mod outbox;
pub mod pace;
pub mod queued;
pub mod send;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notifier_core::delivery::default_schedule;
use notifier_core::duration;
use serde::{Deserialize, Serialize};
use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::{ConfigSources, Runtime};

pub use error::NotifierError;

/// The `notifier` configuration section (`TRAINYARD_NOTIFIER__*` variables).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct NotifierConfig {
    /// The routing file (route tree, receivers, subscriptions), YAML.
    pub routes_file: PathBuf,
    /// How often the routing file and the secret files are checked for changes.
    pub reload_interval_seconds: u64,
    /// This replica's name among the others; empty: a fresh one per start.
    pub replica_id: String,
    /// Heartbeat period; a replica silent for three periods is taken over.
    pub heartbeat_millis: u64,
    /// Least time between two messages to one Slack channel, across replicas:
    /// Slack's 1 per second plus a margin for the requests' own jitter, so the
    /// channel sees them at least a second apart.
    pub channel_interval_millis: u64,
    /// Time limit of one HTTP request.
    pub request_timeout_seconds: u64,
    /// Delays before each retry, e.g. `["5s", "5m", "30m"]`; default: the
    /// Standard Webhooks schedule (5s 5m 30m 2h 5h 10h 10h).
    pub retry_schedule: Vec<String>,
    /// How often queued jobs' waits are checked against their thresholds.
    pub queued_check_millis: u64,
}

impl Default for NotifierConfig {
    fn default() -> Self {
        Self {
            routes_file: PathBuf::from("/etc/trainyard/notifier/routes.yaml"),
            reload_interval_seconds: 10,
            replica_id: String::new(),
            heartbeat_millis: 1000,
            channel_interval_millis: 1100,
            request_timeout_seconds: 15,
            retry_schedule: Vec::new(),
            queued_check_millis: 1000,
        }
    }
}

impl NotifierConfig {
    pub fn retry_schedule(&self) -> Result<Vec<Duration>, NotifierError> {
        if self.retry_schedule.is_empty() {
            return Ok(default_schedule());
        }
        self.retry_schedule
            .iter()
            .enumerate()
            .map(|(i, text)| {
                duration::parse(text).map_err(|message| {
                    NotifierError::Config(format!("notifier.retry_schedule[{i}]: {message}"))
                })
            })
            .collect()
    }
}

/// Service setup: reads the `notifier` section and starts.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), NotifierError> {
    start(runtime, sources.section("notifier")?).await
}

/// Loads the routing file (refusing to start on a bad one), then starts the
/// consumers, the dispatcher, the heartbeat and the reloader on `runtime`.
pub async fn start(runtime: &Runtime, config: NotifierConfig) -> Result<(), NotifierError> {
    let bucket = |bucket: Bucket| {
        runtime
            .bucket(bucket)
            .cloned()
            .ok_or_else(|| NotifierError::Store {
                bucket: bucket.name(),
                message: "not provisioned".into(),
            })
    };
    let outbox = outbox::Outbox {
        store: bucket(Bucket::NotifierOutbox)?,
    };
    let status = bucket(Bucket::Notifications)?;
    let pace_store = bucket(Bucket::NotifierPace)?;
    let live = live::LiveConfig::new(live::Live::load(&config.routes_file)?);
    let metrics = metrics::NotifierMetrics::register(&runtime.registry)?;
    let replica = if config.replica_id.is_empty() {
        format!("notifier-{}", uuid::Uuid::now_v7().simple())
    } else {
        config.replica_id.clone()
    };
    let sender = send::Sender::new(Duration::from_secs(config.request_timeout_seconds.max(1)))
        .map_err(|err| NotifierError::Config(format!("HTTP client: {err}")))?;
    let disabled = Arc::new(Mutex::new(Default::default()));
    let dispatcher = dispatch::Dispatcher {
        settings: dispatch::DispatchSettings {
            replica: replica.clone(),
            heartbeat: Duration::from_millis(config.heartbeat_millis.max(50)),
            channel_interval: Duration::from_millis(config.channel_interval_millis),
            retry_schedule: config.retry_schedule()?,
        },
        outbox: outbox.clone(),
        status,
        pace: pace::SharedPace::new(pace_store, metrics.clone()),
        config: live.clone(),
        sender,
        publisher: runtime.publisher.clone(),
        metrics: metrics.clone(),
        disabled: disabled.clone(),
    };
    tracing::info!(%replica, routes = %config.routes_file.display(), "notifier starting");
    runtime.spawn(dispatcher.clone().heartbeat(runtime.shutdown.clone()));
    runtime.spawn(dispatcher.run(runtime.shutdown.clone()));
    runtime.spawn(reload(
        live.clone(),
        config.routes_file.clone(),
        Duration::from_secs(config.reload_interval_seconds.max(1)),
        metrics.clone(),
        disabled,
        runtime.shutdown.clone(),
    ));
    let waits = queued::Waits {
        outbox: outbox.clone(),
    };
    runtime.spawn(waits.clone().run(
        live.clone(),
        Duration::from_millis(config.queued_check_millis.max(10)),
        runtime.shutdown.clone(),
    ));
    let handler = Arc::new(ingest::Ingest {
        config: live,
        outbox,
        metrics,
        waits,
    });
    for consumer in Service::Notifier.consumers() {
        runtime.spawn_consumer(consumer, handler.clone());
    }
    Ok(())
}

async fn reload(
    live: live::LiveConfig,
    routes_file: PathBuf,
    every: Duration,
    metrics: metrics::NotifierMetrics,
    disabled: Arc<Mutex<std::collections::HashSet<String>>>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match live.reload(&routes_file) {
            Ok(false) => {}
            Ok(true) => {
                metrics.reloads.with_label_values(&["applied"]).inc();
                if let Ok(mut set) = disabled.lock() {
                    set.clear();
                }
                tracing::info!(routes = %routes_file.display(), "routing config reloaded");
            }
            Err(err) => {
                metrics.reloads.with_label_values(&["rejected"]).inc();
                tracing::error!(error = %err, "routing config rejected; keeping the last good one");
            }
        }
    }
}
