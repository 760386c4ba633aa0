//! The planner: the only writer to Kubernetes. It folds change events, decisions and
//! worker reports into each TrainingJob's state, asks the pure core
//! (`planner-core`) what the cluster should hold, and applies it with server-side
//! apply under one field manager.

pub mod callout;
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

/// Longest wait for a connection to the Kubernetes API server.
const API_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest wait for one Kubernetes API request or response.
const API_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Service setup with a Kubernetes client from the environment (in-cluster or kubeconfig).
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), PlannerError> {
    // Tests link a second TLS backend; name the one in use so rustls need not guess.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut config = kube::Config::infer()
        .await
        .map_err(|err| PlannerError::Client(kube::Error::InferConfig(err)))?;
    // Every call ends: a stalled API server fails the message, which is
    // retried, rather than hanging its lane for ever. The planner never
    // watches, so no call legitimately outlasts these.
    config.connect_timeout = Some(API_CONNECT_TIMEOUT);
    config.read_timeout = Some(API_CALL_TIMEOUT);
    config.write_timeout = Some(API_CALL_TIMEOUT);
    let client = kube::Client::try_from(config).map_err(PlannerError::Client)?;
    start(runtime, sources.section("planner")?, client)
}

/// Competes for the planner's lease; once this replica holds it, starts the
/// consumers on `runtime` against `client` and reconciles every existing
/// TrainingJob once. A standby replica reads and writes nothing until then.
pub fn start(
    runtime: &Runtime,
    config: PlannerConfig,
    client: kube::Client,
) -> Result<(), PlannerError> {
    let bucket = runtime.bucket(Bucket::Planner).cloned().ok_or_else(|| {
        PlannerError::Store("bucket trainyard_planner was not provisioned".into())
    })?;
    let metrics = PlannerMetrics::register(&runtime.registry)?;
    let lease = runtime.lease()?;
    let mut writer = KubeWriter::new(client, &config.field_manager);
    if let Some(path) = &config.worker_nats_ca_file {
        if config.worker_credentials_seed_file.is_none() {
            return Err(PlannerError::Credentials(format!(
                "planner.worker_nats_ca_file {path} reaches the workers in their credentials Secret; set planner.worker_credentials_seed_file too"
            )));
        }
        writer = writer.with_worker_nats_ca(callout::load_worker_nats_ca(path)?);
    }
    if let Some(path) = &config.worker_credentials_seed_file {
        let issuer = Arc::new(callout::load_issuer(path)?);
        writer = writer.with_credentials_issuer(issuer.clone());
        let callout_metrics = callout::CalloutMetrics::register(&runtime.registry)?;
        let (client, shutdown) = (runtime.client.clone(), runtime.shutdown.clone());
        runtime.spawn(async move {
            if let Err(err) =
                callout::serve(client, issuer, callout_metrics, shutdown.clone()).await
            {
                // Without the callout no worker can connect: stop rather than run half-blind.
                tracing::error!(error = %err, "auth callout stopped; shutting the planner down");
                shutdown.cancel();
            }
        });
    }
    let planner = Planner::new(
        writer,
        runtime.publisher.clone(),
        StateStore::new(bucket),
        config,
        metrics,
        lease.clone(),
        runtime.shutdown.clone(),
    );
    planner.spawn_release();
    let handler = Arc::new(PlannerHandler(planner.clone()));
    let consumers = runtime.consumers();
    for consumer in Service::Planner.consumers() {
        consumers.spawn_when_leading(consumer, handler.clone(), &lease);
    }
    let shutdown = runtime.shutdown.clone();
    runtime.spawn(async move {
        let leading = tokio::select! {
            _ = shutdown.cancelled() => None,
            token = lease.acquired() => token,
        };
        if leading.is_none() {
            return;
        }
        match planner.resync().await {
            Ok(count) => tracing::info!(count, "resynced existing TrainingJobs"),
            Err(err) => {
                tracing::warn!(error = %err, "resync failed; jobs reconcile on their next event")
            }
        }
    });
    Ok(())
}
