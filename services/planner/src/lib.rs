//! The planner: the only writer to Kubernetes. It folds change events, decisions and
//! worker reports into each TrainingJob's state, asks the pure core
//! (`planner-core`) what the cluster should hold, and applies it with server-side
//! apply under one field manager.

pub mod error;
pub mod events;
pub mod job_metrics;
pub mod kubernetes;
pub mod planner;
pub mod store;

use std::sync::Arc;

use planner_core::PlannerConfig;
use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::{ConfigSources, Runtime};

pub use error::PlannerError;
pub use kubernetes::KubeWriter;
pub use planner::{Planner, PlannerHandler, PlannerMetrics};
pub use store::StateStore;

/// Service setup with a Kubernetes client from the environment (in-cluster or kubeconfig).
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), PlannerError> {
    // Tests link a second TLS backend; name the one in use so rustls need not guess.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .map_err(PlannerError::Client)?;
    start(runtime, sources.section("planner")?, client)
}

/// Starts the planner's consumers on `runtime` against `client`, then reconciles
/// every existing TrainingJob once.
pub fn start(
    runtime: &Runtime,
    config: PlannerConfig,
    client: kube::Client,
) -> Result<(), PlannerError> {
    let bucket = runtime.bucket(Bucket::Planner).cloned().ok_or_else(|| {
        PlannerError::Store("bucket trainyard_planner was not provisioned".into())
    })?;
    let metrics = PlannerMetrics::register(&runtime.registry)?;
    let planner = Planner::new(
        KubeWriter::new(client, &config.field_manager),
        runtime.publisher.clone(),
        StateStore::new(bucket),
        config,
        metrics,
        runtime.shutdown.clone(),
    );
    planner.spawn_release();
    let handler = Arc::new(PlannerHandler(planner.clone()));
    for consumer in Service::Planner.consumers() {
        runtime.spawn_consumer(consumer, handler.clone());
    }
    runtime.spawn(async move {
        match planner.resync().await {
            Ok(count) => tracing::info!(count, "resynced existing TrainingJobs"),
            Err(err) => {
                tracing::warn!(error = %err, "resync failed; jobs reconcile on their next event")
            }
        }
    });
    Ok(())
}
