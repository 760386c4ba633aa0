//! The running service: HTTP endpoints, NATS connection, provisioned streams and
//! buckets, consumers, and an orderly shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use prometheus::Registry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use trainyard_contracts::{Bucket, ConsumerSpec, Service};

use crate::lease::Lease;

use crate::consumer::{self, ConsumerContext, Handler};
use crate::error::RuntimeError;
use crate::http::{self, Readiness};
use crate::metrics::{RuntimeMetrics, StreamMetrics, register_process_metrics};
use crate::nats;
use crate::publisher::Publisher;
use crate::settings::Settings;

/// A started service, built with [`Runtime::start`].
pub struct Runtime {
    pub service: Service,
    pub settings: Settings,
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    pub publisher: Publisher,
    pub registry: Registry,
    pub metrics: RuntimeMetrics,
    pub shutdown: CancellationToken,
    pub http_addr: SocketAddr,
    buckets: HashMap<&'static str, kv::Store>,
    tracker: TaskTracker,
    /// Released once in-flight work is done, so a standby takes over at once.
    leases: std::sync::Mutex<Vec<Lease>>,
}

/// Starts durable consumers on a running service; cheap to clone, so a task
/// can start them later (once it holds a lease).
#[derive(Clone)]
pub struct Consumers {
    context: ConsumerContext,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Consumers {
    /// Runs a durable consumer in the background until shutdown.
    pub fn spawn<H: Handler>(&self, spec: ConsumerSpec, handler: Arc<H>) {
        let context = self.context.clone();
        let shutdown = self.shutdown.clone();
        let durable = spec.durable.clone();
        self.tracker.spawn(async move {
            if let Err(err) = consumer::run(context, spec, handler, shutdown.clone()).await {
                tracing::error!(consumer = %durable, error = %err, "consumer stopped; shutting the service down");
                shutdown.cancel();
            }
        });
    }

    /// Runs a durable consumer once `lease` is held: a standby replica does
    /// not pull, so one active replica handles every message.
    pub fn spawn_when_leading<H: Handler>(
        &self,
        spec: ConsumerSpec,
        handler: Arc<H>,
        lease: &Lease,
    ) {
        let lease = lease.clone();
        let consumers = self.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = consumers.shutdown.cancelled() => {}
                token = lease.acquired() => if token.is_some() {
                    consumers.spawn(spec, handler);
                },
            }
        });
    }
}

impl Runtime {
    /// Serves HTTP (healthz at once, readyz once provisioned), connects to NATS and
    /// provisions every stream and this service's buckets.
    pub async fn start(
        service: Service,
        settings: Settings,
        shutdown: CancellationToken,
    ) -> Result<Self, RuntimeError> {
        // A bad limit is a configuration error, not a provisioning failure
        // to retry for ever.
        for spec in trainyard_contracts::streams::ALL {
            settings.nats.max_bytes(&spec)?;
        }
        let registry = Registry::new();
        let metrics = RuntimeMetrics::register(&registry)?;
        register_process_metrics(&registry, service.name())?;
        let readiness = Readiness::default();
        let tracker = TaskTracker::new();
        let http_addr = http::serve(
            &settings.http.listen,
            registry.clone(),
            readiness.clone(),
            shutdown.clone(),
            &tracker,
        )
        .await?;
        tracing::info!(service = service.name(), %http_addr, nats = %settings.nats.url, "starting");
        let client = nats::connect(service, &settings.nats, &metrics).await?;
        readiness.connected(client.clone());
        let jetstream = jetstream::new(client.clone());
        let buckets = provision_until_done(service, &settings, &jetstream, &shutdown).await?;
        readiness.set_provisioned(true);
        tracing::info!(service = service.name(), "ready");
        let streams = StreamMetrics::register(&registry)?;
        tracker.spawn(watch_streams(jetstream.clone(), streams, shutdown.clone()));
        Ok(Self {
            service,
            publisher: Publisher::new(jetstream.clone(), service, metrics.clone()),
            settings,
            client,
            jetstream,
            registry,
            metrics,
            shutdown,
            http_addr,
            buckets,
            tracker,
            leases: std::sync::Mutex::default(),
        })
    }

    /// Competes for this service's lease ([`Service::lease_key`]); losing it
    /// after holding it shuts the service down. Released at shutdown.
    pub fn lease(&self) -> Result<Lease, RuntimeError> {
        let key = self.service.lease_key().ok_or_else(|| {
            RuntimeError::Setup(format!("{} runs without a lease", self.service.name()).into())
        })?;
        let bucket = self.bucket(Bucket::Leases).cloned().ok_or_else(|| {
            RuntimeError::Setup(
                format!("bucket {} was not provisioned", Bucket::Leases.name()).into(),
            )
        })?;
        let holder = format!(
            "{}-{}-{}",
            self.service.name(),
            std::process::id(),
            uuid::Uuid::now_v7()
        );
        let lease = Lease::keep(
            bucket,
            key,
            holder,
            self.metrics.clone(),
            self.shutdown.clone(),
        );
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(lease.clone());
        Ok(lease)
    }

    /// Starts consumers now or later (see [`Consumers`]).
    pub fn consumers(&self) -> Consumers {
        Consumers {
            context: ConsumerContext {
                jetstream: self.jetstream.clone(),
                publisher: self.publisher.clone(),
                metrics: self.metrics.clone(),
                settings: self.settings.nats.clone(),
            },
            shutdown: self.shutdown.clone(),
            tracker: self.tracker.clone(),
        }
    }

    /// Key-value bucket provisioned for this service.
    pub fn bucket(&self, bucket: Bucket) -> Option<&kv::Store> {
        self.buckets.get(bucket.name())
    }

    /// Runs a durable consumer in the background until shutdown.
    pub fn spawn_consumer<H: Handler>(&self, spec: ConsumerSpec, handler: Arc<H>) {
        self.consumers().spawn(spec, handler);
    }

    /// Spawns any other background task that must finish before exit.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task);
    }

    /// Waits for shutdown, lets in-flight work finish (up to the grace period),
    /// releases the leases held and flushes outgoing messages.
    pub async fn run_until_shutdown(self) -> Result<(), RuntimeError> {
        self.shutdown.cancelled().await;
        self.tracker.close();
        let grace = Duration::from_secs(self.settings.shutdown_grace_seconds);
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                ?grace,
                "in-flight work did not finish within the grace period"
            );
        }
        let leases = std::mem::take(
            &mut *self
                .leases
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for lease in leases {
            lease.release().await;
        }
        if let Err(err) = tokio::time::timeout(Duration::from_secs(1), self.client.flush()).await {
            tracing::warn!(error = %err, "flush timed out");
        }
        tracing::info!(service = self.service.name(), "stopped");
        Ok(())
    }
}

async fn provision_until_done(
    service: Service,
    settings: &Settings,
    jetstream: &jetstream::Context,
    shutdown: &CancellationToken,
) -> Result<HashMap<&'static str, kv::Store>, RuntimeError> {
    let mut attempt = 0usize;
    loop {
        match provision(service, settings, jetstream).await {
            Ok(buckets) => return Ok(buckets),
            Err(err) => {
                attempt += 1;
                tracing::warn!(error = %err, attempt, "provisioning failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Err(err),
                    _ = tokio::time::sleep(nats::reconnect_delay(attempt)) => {}
                }
            }
        }
    }
}

/// How often the streams' sizes are read: they change slowly, and each
/// read is one request per stream to the server.
const STREAM_POLL: Duration = Duration::from_secs(30);

/// Reads every stream's size and limit until shutdown.
async fn watch_streams(
    jetstream: jetstream::Context,
    metrics: StreamMetrics,
    shutdown: CancellationToken,
) {
    let mut every = tokio::time::interval(STREAM_POLL);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        for spec in &trainyard_contracts::streams::ALL {
            let info = match jetstream.get_stream(spec.name).await {
                Ok(mut stream) => stream.info().await.cloned(),
                Err(err) => {
                    tracing::debug!(stream = spec.name, error = %err, "stream not readable");
                    continue;
                }
            };
            match info {
                Ok(info) => metrics.observe(
                    spec.name,
                    info.state.bytes,
                    info.state.messages,
                    info.config.max_bytes,
                ),
                Err(err) => tracing::debug!(stream = spec.name, error = %err, "stream info failed"),
            }
        }
    }
}

async fn provision(
    service: Service,
    settings: &Settings,
    jetstream: &jetstream::Context,
) -> Result<HashMap<&'static str, kv::Store>, RuntimeError> {
    nats::provision_streams(
        jetstream,
        &trainyard_contracts::streams::ALL,
        &settings.nats,
    )
    .await?;
    let mut buckets = HashMap::new();
    for bucket in service.buckets() {
        let store = nats::provision_bucket(jetstream, bucket, &settings.nats).await?;
        buckets.insert(bucket.name(), store);
    }
    Ok(buckets)
}
