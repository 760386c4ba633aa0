//! The gpu-allocator service: feeds node, TrainingQueue and TrainingJob
//! events into the pure allocator core (`gpu-allocator-core`) and publishes
//! its admission, preemption and pending decisions. No Kubernetes client:
//! the planner carries the decisions out.

pub mod config;
pub mod error;
pub mod mapping;
pub mod metrics;
pub mod pending_status;
pub mod persisted;
pub mod service;
pub mod snapshot;
pub mod state;

use std::sync::Arc;

use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::{ConfigSources, Runtime};

pub use config::{AllocatorServiceConfig, FlavorConfig};
pub use error::ServiceError;
pub use metrics::AllocatorMetrics;
pub use persisted::PersistedState;
pub use service::{Allocation, AllocatorHandler, CycleLoop, replay};
pub use snapshot::{CHUNK_BYTES, SNAPSHOT_KEY, SnapshotStore};
pub use state::{AllocatorState, Outgoing};

/// Configuration section of this service.
pub const CONFIG_SECTION: &str = "gpu_allocator";

/// Service setup for `trainyard_runtime::serve`: reads the `gpu_allocator` section.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), ServiceError> {
    let config: AllocatorServiceConfig = sources.section(CONFIG_SECTION)?;
    start(runtime, config).await
}

/// Competes for the allocator's lease; once this replica holds it, restores
/// the saved state, replays the streams after it, then starts the consumers
/// and the cycle loop. A standby replica does nothing else until then.
pub async fn start(runtime: &Runtime, config: AllocatorServiceConfig) -> Result<(), ServiceError> {
    let bucket = runtime.bucket(Bucket::Allocator).cloned().ok_or_else(|| {
        ServiceError::Store(format!(
            "bucket {} was not provisioned",
            Bucket::Allocator.name()
        ))
    })?;
    let lease = runtime.lease()?;
    let metrics = AllocatorMetrics::register(&runtime.registry)?;
    let active = Active {
        bucket,
        config,
        metrics,
        lease,
        jetstream: runtime.jetstream.clone(),
        publisher: runtime.publisher.clone(),
        consumers: runtime.consumers(),
        shutdown: runtime.shutdown.clone(),
    };
    runtime.spawn(async move {
        let shutdown = active.shutdown.clone();
        let token = tokio::select! {
            _ = shutdown.cancelled() => return,
            token = active.lease.acquired() => token,
        };
        let Some(token) = token else { return };
        if let Err(err) = active.run(token).await {
            tracing::error!(error = %err, "the allocator cannot start; shutting down");
            shutdown.cancel();
        }
    });
    Ok(())
}

/// What the active replica needs.
struct Active {
    bucket: async_nats::jetstream::kv::Store,
    config: AllocatorServiceConfig,
    metrics: AllocatorMetrics,
    lease: trainyard_runtime::Lease,
    jetstream: async_nats::jetstream::Context,
    publisher: trainyard_runtime::Publisher,
    consumers: trainyard_runtime::Consumers,
    shutdown: tokio_util::sync::CancellationToken,
}

impl Active {
    /// Restores, replays and runs the cycle loop until shutdown.
    async fn run(self, token: u64) -> Result<(), ServiceError> {
        let (snapshots, saved) = SnapshotStore::open(self.bucket, token).await?;
        let orphans = snapshots.purge_orphans().await?;
        if orphans > 0 {
            tracing::info!(orphans, "purged snapshot chunks no manifest names");
        }
        let mut state = match saved {
            Some(persisted) => {
                let state = AllocatorState::restore(self.config.clone(), persisted)?;
                let stats = state.allocator().stats();
                tracing::info!(
                    pending = stats.pending_jobs,
                    running = stats.running_jobs,
                    nodes = stats.nodes,
                    outbox = state.outbox().len(),
                    "restored allocator state"
                );
                self.metrics.restores.with_label_values(&["snapshot"]).inc();
                state
            }
            None => {
                self.metrics.restores.with_label_values(&["empty"]).inc();
                AllocatorState::new(self.config.clone())?
            }
        };
        let consumers = Service::GpuAllocator.consumers();
        for consumer in &consumers {
            let replayed = service::replay(&self.jetstream, consumer, &mut state).await?;
            if replayed > 0 {
                tracing::info!(
                    stream = consumer.stream.name,
                    replayed,
                    "replayed messages newer than the snapshot"
                );
            }
        }
        let allocation = Allocation::new(state, self.config, self.metrics, self.shutdown);
        for consumer in consumers {
            let handler = Arc::new(AllocatorHandler::new(
                allocation.clone(),
                consumer.stream.name,
            ));
            self.consumers.spawn(consumer, handler);
        }
        let cycle_loop = CycleLoop {
            allocation,
            snapshots,
            publisher: self.publisher,
            lease: self.lease,
        };
        cycle_loop.run().await;
        Ok(())
    }
}
