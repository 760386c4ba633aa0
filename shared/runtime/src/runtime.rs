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

use crate::consumer::{self, ConsumerContext, Handler};
use crate::error::RuntimeError;
use crate::http::{self, Readiness};
use crate::metrics::RuntimeMetrics;
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
}

impl Runtime {
    /// Serves HTTP (healthz at once, readyz once provisioned), connects to NATS and
    /// provisions every stream and this service's buckets.
    pub async fn start(
        service: Service,
        settings: Settings,
        shutdown: CancellationToken,
    ) -> Result<Self, RuntimeError> {
        let registry = Registry::new();
        let metrics = RuntimeMetrics::register(&registry)?;
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
        })
    }

    /// Key-value bucket provisioned for this service.
    pub fn bucket(&self, bucket: Bucket) -> Option<&kv::Store> {
        self.buckets.get(bucket.name())
    }

    /// Runs a durable consumer in the background until shutdown.
    pub fn spawn_consumer<H: Handler>(&self, spec: ConsumerSpec, handler: Arc<H>) {
        let context = ConsumerContext {
            jetstream: self.jetstream.clone(),
            publisher: self.publisher.clone(),
            metrics: self.metrics.clone(),
            settings: self.settings.nats.clone(),
        };
        let shutdown = self.shutdown.clone();
        let durable = spec.durable.clone();
        self.tracker.spawn(async move {
            if let Err(err) = consumer::run(context, spec, handler, shutdown.clone()).await {
                tracing::error!(consumer = %durable, error = %err, "consumer stopped; shutting the service down");
                shutdown.cancel();
            }
        });
    }

    /// Spawns any other background task that must finish before exit.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task);
    }

    /// Waits for shutdown, lets in-flight work finish (up to the grace period) and
    /// flushes outgoing messages.
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
