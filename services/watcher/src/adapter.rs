//! Kubernetes watches in, change events out to JetStream.

use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use prometheus::{IntCounterVec, Opts, Registry};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};
use trainyard_runtime::{ConfigSources, Published, Publisher, Runtime, RuntimeError};

use crate::error::WatcherError;
use crate::mapping::{ChangeEvent, ChangePayload, JOB_LABEL, Watched};
use crate::relist::Relist;

/// The `watcher` config section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WatcherSettings {
    /// Watch TrainingJobs, Sweeps, Jobs and Pods in this namespace only; all namespaces when unset.
    pub namespace: Option<String>,
    /// Label selector narrowing the Nodes watched (e.g. `nvidia.com/gpu.present=true`).
    pub node_selector: Option<String>,
}

/// The watcher's metrics.
#[derive(Clone)]
pub struct WatcherMetrics {
    /// Events published, by kind and whether JetStream already had them.
    pub events: IntCounterVec,
}

impl WatcherMetrics {
    pub fn register(registry: &Registry) -> Result<Self, WatcherError> {
        let events = IntCounterVec::new(
            Opts::new(
                "trainyard_watcher_events_total",
                "Change events published, by kind and outcome (stored or duplicate)",
            ),
            &["kind", "outcome"],
        )
        .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        registry
            .register(Box::new(events.clone()))
            .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        Ok(Self { events })
    }
}

/// Service setup: connects to Kubernetes (in-cluster or kubeconfig) and starts the watches.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), WatcherError> {
    let settings: WatcherSettings = sources.section("watcher")?;
    // Tests link a second TLS backend; name the one in use so rustls need not guess.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::try_default().await.map_err(WatcherError::Kube)?;
    let metrics = WatcherMetrics::register(&runtime.registry)?;
    spawn_watches(runtime, client, &settings, metrics);
    Ok(())
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Starts one watch per kind. Jobs and Pods are narrowed to those Trainyard owns.
pub fn spawn_watches(
    runtime: &Runtime,
    client: Client,
    settings: &WatcherSettings,
    metrics: WatcherMetrics,
) {
    let owned = watcher::Config::default().labels(JOB_LABEL);
    let mut nodes = watcher::Config::default();
    if let Some(selector) = &settings.node_selector {
        nodes = nodes.labels(selector);
    }
    let ns = &settings.namespace;
    spawn_watch(
        runtime,
        scoped::<TrainingJob>(&client, ns),
        watcher::Config::default(),
        &metrics,
    );
    spawn_watch(
        runtime,
        scoped::<Sweep>(&client, ns),
        watcher::Config::default(),
        &metrics,
    );
    spawn_watch(
        runtime,
        Api::<TrainingQueue>::all(client.clone()),
        watcher::Config::default(),
        &metrics,
    );
    spawn_watch(runtime, scoped::<Job>(&client, ns), owned.clone(), &metrics);
    spawn_watch(runtime, scoped::<Pod>(&client, ns), owned, &metrics);
    spawn_watch(runtime, Api::<Node>::all(client), nodes, &metrics);
}

fn spawn_watch<K>(runtime: &Runtime, api: Api<K>, config: watcher::Config, metrics: &WatcherMetrics)
where
    K: Watched + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let publisher = runtime.publisher.clone();
    let shutdown = runtime.shutdown.clone();
    let metrics = metrics.clone();
    runtime.spawn(async move {
        let events = watcher(api, config).default_backoff();
        pump(events, publisher, metrics, shutdown).await;
    });
}

/// Publishes every change a watch stream reports until it ends or `shutdown`.
/// Watch errors are logged (the stream backs off and relists by itself).
pub async fn pump<K, S>(
    events: S,
    publisher: Publisher,
    metrics: WatcherMetrics,
    shutdown: CancellationToken,
) where
    K: Watched,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut relist = Relist::default();
    let mut events = std::pin::pin!(events);
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = events.next() => next,
        };
        match next {
            None => break,
            Some(Err(err)) => tracing::warn!(error = %err, "watch error; backing off"),
            Some(Ok(event)) => {
                for change in relist.on_event(event) {
                    publish_until_stored(&publisher, &metrics, change, &shutdown).await;
                }
            }
        }
    }
}

/// A change must not be lost: retry the publish until JetStream has it (or shutdown).
async fn publish_until_stored(
    publisher: &Publisher,
    metrics: &WatcherMetrics,
    change: ChangeEvent,
    shutdown: &CancellationToken,
) {
    let kind = change.kind();
    let mut attempt = 0usize;
    loop {
        match publish(publisher, change.clone()).await {
            Ok(published) => {
                let outcome = if published.duplicate {
                    "duplicate"
                } else {
                    "stored"
                };
                metrics.events.with_label_values(&[kind, outcome]).inc();
                tracing::debug!(kind, entity = %change.entity.key(), outcome, "change published");
                return;
            }
            Err(err) => {
                attempt += 1;
                tracing::warn!(kind, entity = %change.entity.key(), error = %err, attempt, "publish failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100 * attempt.min(50) as u64)) => {}
                }
            }
        }
    }
}

/// Publishes one change with its uid/resourceVersion-derived id.
pub async fn publish(
    publisher: &Publisher,
    change: ChangeEvent,
) -> Result<Published, RuntimeError> {
    let ChangeEvent {
        entity,
        message_id,
        payload,
    } = change;
    let id = message_id.as_str();
    match payload {
        ChangePayload::TrainingJob(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Sweep(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::TrainingQueue(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Job(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, p), id)
                .await
        }
        ChangePayload::Pod(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Node(p) => {
            publisher
                .publish_with_id(publisher.envelope(entity, p), id)
                .await
        }
    }
}
