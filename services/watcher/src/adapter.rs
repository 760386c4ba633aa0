//! Kubernetes watches in, change events out to JetStream.

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};
use trainyard_runtime::{
    ConfigSources, PendingPublish, Published, Publisher, Runtime, RuntimeError,
};

use crate::error::WatcherError;
use crate::gpu_usage::{GpuNode, NodeUsage, OtherPod};
use crate::mapping::{
    ChangeEvent, ChangePayload, FAILED_CREATE_EVENTS, Watched, WatchedJob, WatchedPod,
};
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
    /// `nvidia.com/gpu` that pods Trainyard does not manage hold, over all nodes.
    pub gpus_used_by_other_pods: IntGauge,
}

impl WatcherMetrics {
    pub fn register(registry: &Registry) -> Result<Self, WatcherError> {
        let events = IntCounterVec::new(
            Opts::new(
                "trainyard_watcher_events_total",
                "Changes, by kind and outcome (stored; duplicate: JetStream had it; unchanged: nothing consumers act on changed, not published; oversized: above the NATS max payload, skipped)",
            ),
            &["kind", "outcome"],
        )
        .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        registry
            .register(Box::new(events.clone()))
            .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        let gpus_used_by_other_pods = IntGauge::new(
            "trainyard_watcher_gpus_used_by_other_pods",
            "nvidia.com/gpu requested by bound, unfinished pods Trainyard does not manage, over all nodes",
        )
        .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        registry
            .register(Box::new(gpus_used_by_other_pods.clone()))
            .map_err(|e| WatcherError::Metrics(e.to_string()))?;
        Ok(Self {
            events,
            gpus_used_by_other_pods,
        })
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

/// Starts one watch per kind. Jobs and Pods are narrowed to those Trainyard
/// owns, Events to the Job controller's `FailedCreate`.
pub fn spawn_watches(
    runtime: &Runtime,
    client: Client,
    settings: &WatcherSettings,
    metrics: WatcherMetrics,
) {
    let owned = watcher::Config::default().labels(LABEL_JOB);
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
    spawn_watch(
        runtime,
        scoped::<WatchedJob>(&client, ns),
        owned.clone(),
        &metrics,
    );
    spawn_watch(runtime, scoped::<WatchedPod>(&client, ns), owned, &metrics);
    spawn_watch(
        runtime,
        scoped::<Event>(&client, ns),
        watcher::Config::default().fields(FAILED_CREATE_EVENTS),
        &metrics,
    );
    spawn_node_watch(runtime, client, nodes, &metrics);
}

/// A Node watch event or an other pods' watch event.
enum NodeOrPod {
    Node(Box<Result<watcher::Event<Node>, watcher::Error>>),
    Pod(Box<Result<watcher::Event<OtherPod>, watcher::Error>>),
}

/// Watches Nodes and, in every namespace, the pods, and publishes each node
/// with the GPUs, CPU and memory that pods the gpu-allocator did not place
/// hold on it (see [`crate::gpu_usage`]).
fn spawn_node_watch(
    runtime: &Runtime,
    client: Client,
    nodes: watcher::Config,
    metrics: &WatcherMetrics,
) {
    let node_events = watcher(Api::<Node>::all(client.clone()), nodes)
        .default_backoff()
        .map(|event| NodeOrPod::Node(Box::new(event)));
    let pod_events = watcher(Api::<OtherPod>::all(client), watcher::Config::default())
        .default_backoff()
        .map(|event| NodeOrPod::Pod(Box::new(event)));
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut usage = NodeUsage::new(format!("{started:x}"));
    let gauge = metrics.gpus_used_by_other_pods.clone();
    let events = futures::stream::select(node_events, pod_events).flat_map(move |event| {
        let changes = match event {
            NodeOrPod::Node(event) => (*event).map(|event| usage.on_node(event)),
            NodeOrPod::Pod(event) => (*event).map(|event| {
                let changes = usage.on_pod(event);
                gauge.set(i64::try_from(usage.gpus_used_by_other_pods()).unwrap_or(i64::MAX));
                changes
            }),
        };
        let out: Vec<Result<watcher::Event<GpuNode>, watcher::Error>> = match changes {
            Ok(changes) => changes.into_iter().map(Ok).collect(),
            Err(err) => vec![Err(err)],
        };
        futures::stream::iter(out)
    });
    let publisher = runtime.publisher.clone();
    let shutdown = runtime.shutdown.clone();
    let metrics = metrics.clone();
    runtime.spawn(async move {
        pump(events, publisher, metrics, shutdown).await;
    });
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

/// Changes one watch may have handed to NATS and not yet seen stored.
const IN_FLIGHT: usize = 256;

/// A change handed to NATS, resolving to the change and what the stream said.
type Sent = Pin<Box<dyn Future<Output = (ChangeEvent, Result<Published, RuntimeError>)> + Send>>;

/// The changes in flight: their acknowledgements are awaited together (so the
/// timeouts of those a crashed server never answers run out together) and
/// taken in the order sent; and the objects they are about.
#[derive(Default)]
struct InFlight {
    acks: FuturesOrdered<Sent>,
    objects: HashSet<String>,
}

/// Publishes every change a watch stream reports until it ends or `shutdown`.
/// Watch errors are logged (the stream backs off and relists by itself).
///
/// Changes are sent without waiting for each acknowledgement (up to
/// [`IN_FLIGHT`] at once): a round trip per change would cap one watch at a
/// few thousand changes a second, and less on a busy machine. One connection
/// delivers them in order and the stream stores them in that order. A change
/// whose acknowledgement fails is sent again (its id makes a copy already
/// stored a duplicate), possibly after changes sent behind it; so at most one
/// change per object is in flight, and an object's changes stay in order even
/// then (consumers fold changes per object).
pub async fn pump<K, S>(
    events: S,
    publisher: Publisher,
    metrics: WatcherMetrics,
    shutdown: CancellationToken,
) where
    K: Watched,
    K::DynamicType: Default,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let kind = K::kind(&Default::default()).to_lowercase();
    let unchanged = metrics
        .events
        .with_label_values(&[kind.as_str(), "unchanged"]);
    let mut relist = Relist::default();
    let mut events = std::pin::pin!(events);
    let mut in_flight = InFlight::default();
    loop {
        let full = in_flight.acks.len() >= IN_FLIGHT;
        let waiting = !in_flight.acks.is_empty();
        // New changes go first; acknowledgements are collected while the watch is quiet.
        let step = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            next = events.next(), if !full => Step::Watch(next),
            Some(sent) = in_flight.acks.next(), if waiting => Step::Stored(sent),
        };
        match step {
            Step::Watch(None) => {
                // The watch ended: what it sent is still counted (or sent again).
                settle_all(&publisher, &metrics, &mut in_flight, &shutdown).await;
                break;
            }
            Step::Watch(Some(Err(err))) => tracing::warn!(error = %err, "watch error; backing off"),
            Step::Watch(Some(Ok(event))) => {
                for change in relist.on_event(event) {
                    send(&publisher, &metrics, &mut in_flight, change, &shutdown).await;
                }
                unchanged.inc_by(relist.take_unchanged());
            }
            Step::Stored((change, stored)) => {
                settle(
                    &publisher,
                    &metrics,
                    &mut in_flight,
                    change,
                    stored,
                    &shutdown,
                )
                .await
            }
        }
    }
}

enum Step<E> {
    Watch(Option<Result<E, watcher::Error>>),
    Stored((ChangeEvent, Result<Published, RuntimeError>)),
}

/// Sends one change behind those in flight, once no earlier change of the same
/// object is. If it cannot even be sent (no connection), the ones in flight are
/// settled first so it is stored after them.
async fn send(
    publisher: &Publisher,
    metrics: &WatcherMetrics,
    in_flight: &mut InFlight,
    change: ChangeEvent,
    shutdown: &CancellationToken,
) {
    while in_flight.objects.contains(change.object_uid())
        && let Some((sent, stored)) = in_flight.acks.next().await
    {
        settle(publisher, metrics, in_flight, sent, stored, shutdown).await;
    }
    match publish(publisher, change.clone()).await {
        Ok(pending) => {
            in_flight.objects.insert(change.object_uid().to_owned());
            in_flight
                .acks
                .push_back(Box::pin(async move { (change, pending.stored().await) }));
        }
        Err(RuntimeError::TooLarge {
            bytes, max_payload, ..
        }) => skip_oversized(metrics, &change, bytes, max_payload),
        Err(err) => {
            tracing::warn!(kind = change.kind(), entity = %change.entity.key(), error = %err, "publish failed; retrying");
            settle_all(publisher, metrics, in_flight, shutdown).await;
            publish_until_stored(publisher, metrics, change, shutdown).await;
        }
    }
}

/// A change too large for one NATS message can never be published: it is
/// left out (consumers see the object's next change that fits), so the watch
/// goes on instead of retrying it for ever.
fn skip_oversized(
    metrics: &WatcherMetrics,
    change: &ChangeEvent,
    bytes: usize,
    max_payload: usize,
) {
    let kind = change.kind();
    tracing::warn!(
        kind,
        entity = %change.entity.key(),
        bytes,
        max_payload,
        "object too large to publish ({bytes} bytes, NATS max_payload {max_payload}); skipped, the watch goes on"
    );
    metrics.events.with_label_values(&[kind, "oversized"]).inc();
}

/// Waits for every change in flight, oldest first.
async fn settle_all(
    publisher: &Publisher,
    metrics: &WatcherMetrics,
    in_flight: &mut InFlight,
    shutdown: &CancellationToken,
) {
    while let Some((change, stored)) = in_flight.acks.next().await {
        settle(publisher, metrics, in_flight, change, stored, shutdown).await;
    }
}

/// Counts a change the stream acknowledged, or sends it again until stored.
async fn settle(
    publisher: &Publisher,
    metrics: &WatcherMetrics,
    in_flight: &mut InFlight,
    change: ChangeEvent,
    stored: Result<Published, RuntimeError>,
    shutdown: &CancellationToken,
) {
    // The pump waits for the retry below, so the object's next change cannot go out before it.
    in_flight.objects.remove(change.object_uid());
    match stored {
        Ok(published) => count(metrics, &change, published),
        Err(err) => {
            tracing::warn!(kind = change.kind(), entity = %change.entity.key(), error = %err, "publish failed; retrying");
            publish_until_stored(publisher, metrics, change, shutdown).await;
        }
    }
}

fn count(metrics: &WatcherMetrics, change: &ChangeEvent, published: Published) {
    let kind = change.kind();
    let outcome = if published.duplicate {
        "duplicate"
    } else {
        "stored"
    };
    metrics.events.with_label_values(&[kind, outcome]).inc();
    tracing::debug!(kind, entity = %change.entity.key(), outcome, "change published");
}

/// A change must not be lost: retry the publish until JetStream has it (or shutdown).
async fn publish_until_stored(
    publisher: &Publisher,
    metrics: &WatcherMetrics,
    change: ChangeEvent,
    shutdown: &CancellationToken,
) {
    let mut attempt = 0usize;
    loop {
        let stored = match publish(publisher, change.clone()).await {
            Ok(pending) => pending.stored().await,
            Err(err) => Err(err),
        };
        match stored {
            Ok(published) => return count(metrics, &change, published),
            Err(RuntimeError::TooLarge {
                bytes, max_payload, ..
            }) => return skip_oversized(metrics, &change, bytes, max_payload),
            Err(err) => {
                attempt += 1;
                tracing::warn!(kind = change.kind(), entity = %change.entity.key(), error = %err, attempt, "publish failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100 * attempt.min(50) as u64)) => {}
                }
            }
        }
    }
}

/// Sends one change with its uid/resourceVersion-derived id.
pub async fn publish(
    publisher: &Publisher,
    change: ChangeEvent,
) -> Result<PendingPublish, RuntimeError> {
    let ChangeEvent {
        entity,
        message_id,
        payload,
    } = change;
    let id = message_id.as_str();
    match payload {
        ChangePayload::TrainingJob(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Sweep(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::TrainingQueue(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Job(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, p), id)
                .await
        }
        ChangePayload::Pod(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::JobEvent(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
        ChangePayload::Node(p) => {
            publisher
                .send_with_id(publisher.envelope(entity, *p), id)
                .await
        }
    }
}
