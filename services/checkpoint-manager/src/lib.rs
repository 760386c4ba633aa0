//! The checkpoint-manager: reads checkpoint reports, TrainingJob specs and
//! lifecycle transitions; verifies each reported checkpoint where it is stored;
//! publishes the resume point (the newest verified checkpoint), retention
//! deletions, the Young/Daly interval advice and the job's checkpoint summary;
//! registers a completed job's best verified checkpoint as an MLflow model
//! version. Each job's catalogue lives in the `trainyard_checkpoints` KV bucket.

pub mod error;
pub mod manager;
pub mod metrics;
pub mod registry;
pub mod storage;
pub mod waiting;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use serde::{Deserialize, Serialize};
use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::{ConfigSources, Runtime};

pub use error::CheckpointError;
pub use manager::{Manager, ManagerHandler};
pub use metrics::CheckpointMetrics;
pub use registry::Registry;

/// How the manager reaches checkpoint storage (part of [`ManagerConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct StorageSettings {
    /// Read volume paths (`/checkpoints/...`) itself: set when the manager
    /// mounts the same volumes as the workers at the paths they see (a shared
    /// RWX claim). Otherwise volume checkpoints count as verified on the worker-side
    /// reporter's word, and their deletion is left to it.
    pub read_volumes: bool,
    /// S3 endpoint for jobs that name none (`storage.s3Endpoint` wins).
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    /// S3 credentials, e.g. from a Secret through `TRAINYARD_CHECKPOINT_MANAGER__S3_*`;
    /// without them the AWS environment and the pod's service account are used.
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    /// Timeout of one storage request. A storage still unreachable after a
    /// few quick retries within this time is waited out on a timer (the
    /// report waits in the job's record), so no lane is held longer.
    pub storage_timeout_seconds: u64,
}

impl Default for StorageSettings {
    fn default() -> Self {
        Self {
            read_volumes: false,
            s3_endpoint: None,
            s3_region: None,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            storage_timeout_seconds: 10,
        }
    }
}

/// How often storage endpoints with waiting reports are checked for being
/// due (each is tried after its own backoff, 0.5 s to 15 s).
const WAITING_CHECK: Duration = Duration::from_millis(250);

/// The default alias moved to a newly registered version.
pub const DEFAULT_MODEL_ALIAS: &str = "best";

/// The `checkpoint_manager` configuration section (`TRAINYARD_CHECKPOINT_MANAGER__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct ManagerConfig {
    #[serde(flatten)]
    pub storage: StorageSettings,
    /// Compare SHA-256 checksums of the files a manifest lists, not only sizes.
    pub verify_checksums: bool,
    /// Mean seconds between interruptions assumed for a node pool before it
    /// has history (counted as one interval already seen).
    pub prior_seconds_between_interruptions: f64,
    /// A new interval advice is published when it moves by more than this fraction.
    pub advice_change_fraction: f64,
    /// MLflow server whose model registry takes completed jobs' checkpoints,
    /// e.g. `http://mlflow.mlflow:5000`; registration is off when unset or empty.
    pub mlflow_tracking_uri: Option<String>,
    /// Other servers a job's checkpoint is registered on when its
    /// `monitoring.mlflowTrackingUri` names one (prefixes of
    /// `scheme://host[:port][/path]`); they receive the manager's credentials.
    #[serde(deserialize_with = "trainyard_mlflow::deserialize_uri_list")]
    pub mlflow_allowed_tracking_uris: Vec<String>,
    /// Names a job's registered model: `{namespace}` and `{name}` are replaced
    /// (the `trainyard.dev/model-name` annotation wins).
    pub model_name_template: String,
    /// Alias moved to each newly registered version; none when empty.
    pub model_alias: String,
    /// Timeout of one MLflow request.
    pub mlflow_timeout_seconds: u64,
    /// Attempts per MLflow request (with backoff) before the message is handled again.
    pub mlflow_max_attempts: u32,
    /// File holding a token sent as `Authorization: Bearer` (a hosted MLflow's
    /// access token, what MLflow's clients take from `MLFLOW_TRACKING_TOKEN`).
    pub mlflow_token_file: Option<String>,
    /// User for HTTP basic auth (`MLFLOW_TRACKING_USERNAME`), with `mlflow_password_file`.
    pub mlflow_username: Option<String>,
    /// File holding the basic-auth password (`MLFLOW_TRACKING_PASSWORD`).
    pub mlflow_password_file: Option<String>,
    /// CA bundle an https tracking server's certificate must chain to; the
    /// system's roots when unset.
    pub mlflow_tls_ca_file: Option<String>,
    /// MLflow's own variables (`MLFLOW_TRACKING_URI`, `..._TOKEN`, ...), taken
    /// where the keys above are unset; [`setup`] reads them from the process.
    #[serde(skip)]
    pub mlflow_env: trainyard_mlflow::MlflowEnv,
    /// A Running job is overdue after max(3 x its advised interval, this)
    /// seconds without a verified checkpoint.
    pub overdue_floor_seconds: u64,
    /// How often running jobs are checked for an overdue checkpoint.
    pub overdue_check_seconds: u64,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            storage: StorageSettings::default(),
            verify_checksums: true,
            prior_seconds_between_interruptions: 86_400.0,
            advice_change_fraction: 0.1,
            mlflow_tracking_uri: None,
            mlflow_allowed_tracking_uris: Vec::new(),
            model_name_template: checkpoint_manager_core::registration::DEFAULT_MODEL_NAME_TEMPLATE
                .to_string(),
            model_alias: DEFAULT_MODEL_ALIAS.to_string(),
            mlflow_timeout_seconds: 10,
            mlflow_max_attempts: 5,
            mlflow_token_file: None,
            mlflow_username: None,
            mlflow_password_file: None,
            mlflow_tls_ca_file: None,
            mlflow_env: trainyard_mlflow::MlflowEnv::default(),
            overdue_floor_seconds: 1800,
            overdue_check_seconds: 60,
        }
    }
}

impl ManagerConfig {
    /// The registry's tracking server: `mlflow_tracking_uri`, else
    /// `MLFLOW_TRACKING_URI`; registration is off without either.
    pub fn tracking_uri(&self) -> Option<&str> {
        self.mlflow_env
            .tracking_uri_or(self.mlflow_tracking_uri.as_deref())
    }
}

/// Service setup: reads the `checkpoint_manager` section and starts the manager.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), CheckpointError> {
    let mut config: ManagerConfig = sources
        .section("checkpoint_manager")
        .map_err(|err| CheckpointError::Config(err.to_string()))?;
    config.mlflow_env = trainyard_mlflow::MlflowEnv::from_process();
    start(runtime, config).await?;
    Ok(())
}

/// Competes for the checkpoint-manager's lease; once this replica holds it,
/// starts the consumers and the overdue checks on `runtime`. One replica
/// decides at a time: each keeps the job records it works on in memory and
/// writes them whole, so two at once would overwrite each other's.
pub async fn start(
    runtime: &Runtime,
    config: ManagerConfig,
) -> Result<Arc<Manager>, CheckpointError> {
    let bucket = runtime
        .bucket(Bucket::Checkpoints)
        .cloned()
        .ok_or_else(|| {
            CheckpointError::Store("bucket trainyard_checkpoints was not provisioned".into())
        })?;
    let metrics = CheckpointMetrics::register(&runtime.registry)?;
    let registry = Registry::from_config(&config, runtime.shutdown.clone())?;
    match (&registry, config.tracking_uri()) {
        (Some(registry), Some(uri)) => tracing::info!(
            mlflow_tracking_uri = uri,
            alias = registry.alias().unwrap_or_default(),
            "completed jobs' best checkpoints are registered as model versions"
        ),
        _ => tracing::info!(
            "model registration off: neither checkpoint_manager.mlflow_tracking_uri nor MLFLOW_TRACKING_URI is set"
        ),
    }
    let manager = Arc::new(Manager::new(
        runtime.publisher.clone(),
        bucket,
        metrics,
        config,
        registry,
    ));
    let lease = runtime.lease()?;
    let handler = Arc::new(ManagerHandler(manager.clone()));
    let consumers = runtime.consumers();
    for consumer in Service::CheckpointManager.consumers() {
        consumers.spawn_when_leading(consumer, handler.clone(), &lease);
    }
    let retrying = manager.clone();
    let shutdown = runtime.shutdown.clone();
    let waiting_lease = lease.clone();
    runtime.spawn(async move {
        let leading = tokio::select! {
            _ = shutdown.cancelled() => None,
            token = waiting_lease.acquired() => token,
        };
        if leading.is_none() {
            return;
        }
        let mut recovered = false;
        let mut timer = tokio::time::interval(WAITING_CHECK);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = timer.tick() => {
                    if !recovered {
                        match retrying.recover_waiting().await {
                            Ok(jobs) => {
                                recovered = true;
                                if jobs > 0 {
                                    tracing::info!(jobs, "checkpoint reports waiting for their storage recovered");
                                }
                            }
                            Err(err) => tracing::warn!(error = %err, "waiting checkpoint reports not recovered yet; tried again"),
                        }
                    }
                    retrying.retry_waiting().await;
                }
            }
        }
    });
    let checking = manager.clone();
    let shutdown = runtime.shutdown.clone();
    let every = Duration::from_secs(checking.overdue_check_seconds().max(1));
    runtime.spawn(async move {
        let leading = tokio::select! {
            _ = shutdown.cancelled() => None,
            token = lease.acquired() => token,
        };
        if leading.is_none() {
            return;
        }
        let mut timer = tokio::time::interval(every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = timer.tick() => {
                    if let Err(err) = checking.check_overdue(Utc::now()).await {
                        tracing::warn!(error = %err, "overdue check failed; retried next interval");
                    }
                }
            }
        }
    });
    Ok(manager)
}
