//! Environment of a worker container.
//!
//! Order matters: Kubernetes expands `$(VAR)` only from entries listed earlier, so
//! `TRAINYARD_WORKER_INDEX` comes first and the framework variables that reference it
//! (`RANK`, `PET_NODE_RANK`, `TF_CONFIG`, `JAX_PROCESS_ID`) follow. The user's `env`
//! comes last so it can reference ours; entries that would redefine one of ours are
//! dropped, because server-side apply rejects duplicate names and Trainyard's own
//! variables take precedence (as the API documents).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, EnvVar, EnvVarSource, ObjectFieldSelector, SecretKeySelector,
};
use trainyard_api::{
    CheckpointFrequency, CommunicationBackend, Framework, MonitoringSpec, StorageType,
    TrainingJobSpec,
};

use crate::error::PlanError;
use crate::names::COMPLETION_INDEX_ANNOTATION;
use crate::worker_token::{TOKEN_ENV, TOKEN_SECRET_KEY};
use trainyard_contracts::worker::NATS_CA_FILE_ENV;

/// Variable holding the worker's index; others reference it as `$(TRAINYARD_WORKER_INDEX)`.
pub const WORKER_INDEX_ENV: &str = "TRAINYARD_WORKER_INDEX";
/// ConfigMap key holding the checkpoint the next worker start resumes from.
pub const RESUME_FROM_KEY: &str = "resume-from";
/// ConfigMap key holding the advised seconds between checkpoints
/// (`checkpoint.frequency: auto`), read as `CHECKPOINT_INTERVAL_SECONDS`.
pub const CHECKPOINT_INTERVAL_KEY: &str = "checkpoint-interval-seconds";
/// Directory the ConfigMap's files are mounted at.
pub const CONFIG_MOUNT_PATH: &str = "/etc/trainyard";
/// File with the hyperparameters, inside [`CONFIG_MOUNT_PATH`].
pub const HYPERPARAMETERS_FILE: &str = "hyperparameters.json";
/// File with the framework, worker and checkpoint layout, inside [`CONFIG_MOUNT_PATH`].
pub const TRAINING_CONFIG_FILE: &str = "training-config.json";
/// File with the NATS CA bundle (from the credentials Secret), inside
/// [`CONFIG_MOUNT_PATH`].
pub const NATS_CA_FILE: &str = "nats-ca.crt";

/// Everything the environment depends on besides the spec.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerContext<'a> {
    pub training_job: &'a str,
    pub namespace: &'a str,
    pub attempt: u32,
    pub config_map: &'a str,
    pub nats_url: &'a str,
    /// `host:port` of worker 0 without the port, i.e. its DNS name.
    pub master_host: &'a str,
    /// DNS names of every worker, by index.
    pub worker_hosts: &'a [String],
    /// The Sweep the job is a trial of (its owner), if any.
    pub sweep: Option<&'a str>,
    /// The Secret with the workers' NATS token, when the planner issues them.
    pub credentials_secret: Option<&'a str>,
    /// That Secret also carries the CA the workers verify NATS with.
    pub nats_ca: bool,
}

fn literal(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn index_reference() -> String {
    format!("$({WORKER_INDEX_ENV})")
}

/// The complete environment of a worker container.
pub(crate) fn worker_env(
    spec: &TrainingJobSpec,
    ctx: &WorkerContext<'_>,
) -> Result<Vec<EnvVar>, PlanError> {
    let mut env = trainyard_env(spec, ctx);
    env.push(literal("MODEL_NAME", spec.model.clone()));
    env.push(literal("DATASET", spec.dataset.clone()));
    env.extend(framework_env(spec, ctx));
    env.extend(networking_env(spec));
    env.extend(checkpoint_env(spec, ctx));
    env.extend(monitoring_env(spec, ctx));
    env.extend(hyperparameter_env(spec)?);
    env.push(literal(
        "HYPERPARAMETERS_FILE",
        format!("{CONFIG_MOUNT_PATH}/{HYPERPARAMETERS_FILE}"),
    ));
    env.push(literal(
        "TRAINING_CONFIG_FILE",
        format!("{CONFIG_MOUNT_PATH}/{TRAINING_CONFIG_FILE}"),
    ));

    let ours: std::collections::BTreeSet<String> = env.iter().map(|e| e.name.clone()).collect();
    let mut seen_user = std::collections::BTreeSet::new();
    for user in &spec.env {
        // A later duplicate in the user's own list would also be rejected by the apiserver.
        if !ours.contains(&user.name) && seen_user.insert(user.name.clone()) {
            env.push(user.clone());
        }
    }
    Ok(env)
}

/// The worker reporting contract: who am I, and where do I report.
fn trainyard_env(spec: &TrainingJobSpec, ctx: &WorkerContext<'_>) -> Vec<EnvVar> {
    let mut env = vec![
        literal("TRAINYARD_NAMESPACE", ctx.namespace),
        literal("TRAINYARD_JOB", ctx.training_job),
        literal("TRAINYARD_ATTEMPT", ctx.attempt.to_string()),
        EnvVar {
            name: WORKER_INDEX_ENV.to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"),
                }),
                ..EnvVarSource::default()
            }),
        },
        literal("TRAINYARD_NUM_WORKERS", spec.num_workers.to_string()),
        literal("TRAINYARD_NATS_URL", ctx.nats_url),
    ];
    if let Some(secret) = ctx.credentials_secret {
        env.push(EnvVar {
            name: TOKEN_ENV.to_owned(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.to_owned(),
                    key: TOKEN_SECRET_KEY.to_owned(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
        });
        if ctx.nats_ca {
            env.push(literal(
                NATS_CA_FILE_ENV,
                format!("{CONFIG_MOUNT_PATH}/{NATS_CA_FILE}"),
            ));
        }
    }
    env
}

/// The framework's own distributed-training variables.
fn framework_env(spec: &TrainingJobSpec, ctx: &WorkerContext<'_>) -> Vec<EnvVar> {
    let workers = spec.num_workers.to_string();
    let port = spec.master_port();
    let master = ctx.master_host;
    let mut env = Vec::new();
    match spec.framework() {
        Framework::Pytorch => {
            // torchrun reads PET_*; scripts started without torchrun read the classic
            // MASTER_ADDR/WORLD_SIZE/RANK set as Kubeflow's PyTorchJob sets them
            // (one rank per worker pod, torchrun refines them per process).
            // A CPU worker still runs one process.
            let processes_per_worker = spec.gpus_per_worker().max(1);
            env.extend([
                literal("WORLD_SIZE", workers.clone()),
                literal("RANK", index_reference()),
                literal("MASTER_ADDR", master),
                literal("MASTER_PORT", port.to_string()),
                literal("PET_NNODES", workers),
                literal("PET_NPROC_PER_NODE", processes_per_worker.to_string()),
                literal("PET_NODE_RANK", index_reference()),
                literal("PET_MASTER_ADDR", master),
                literal("PET_MASTER_PORT", port.to_string()),
                literal(
                    "TORCH_DISTRIBUTED_BACKEND",
                    spec.communication_backend().as_str(),
                ),
            ]);
        }
        Framework::Tensorflow => env.push(literal("TF_CONFIG", tf_config(ctx.worker_hosts, port))),
        Framework::Jax => env.extend([
            literal("JAX_COORDINATOR_ADDRESS", format!("{master}:{port}")),
            literal("JAX_NUM_PROCESSES", workers),
            literal("JAX_PROCESS_ID", index_reference()),
        ]),
    }
    // Every supported framework is driven from Python; unbuffered output keeps the
    // logs of a crashing worker complete.
    env.push(literal("PYTHONUNBUFFERED", "1"));
    env
}

/// TF_CONFIG for MultiWorkerMirroredStrategy: every worker's `host:port` and this
/// worker's index. The index is a `$(...)` reference Kubernetes expands to a bare
/// number, so the value is valid JSON inside the container (and only there).
fn tf_config(worker_hosts: &[String], port: u32) -> String {
    let addresses: Vec<String> = worker_hosts
        .iter()
        .map(|host| format!("{host}:{port}"))
        .collect();
    // Serializing a list of plain strings cannot fail; fall back to an empty list anyway
    // rather than panic.
    let cluster = serde_json::to_string(&addresses).unwrap_or_else(|_| "[]".to_owned());
    format!(
        r#"{{"cluster":{{"worker":{cluster}}},"task":{{"type":"worker","index":{}}}}}"#,
        index_reference()
    )
}

fn networking_env(spec: &TrainingJobSpec) -> Vec<EnvVar> {
    let rdma = spec
        .networking
        .as_ref()
        .and_then(|n| n.rdma_enabled)
        .unwrap_or(false);
    let mut env = Vec::new();
    // Only an explicit RDMA request changes NCCL's transport choice; otherwise NCCL
    // detects InfiniBand itself and the user may still set NCCL_IB_DISABLE.
    if rdma && spec.communication_backend() == CommunicationBackend::Nccl {
        env.push(literal("NCCL_IB_DISABLE", "0"));
    }
    env
}

/// Where checkpoints go: a mounted directory (pvc, nfs, or an emptyDir when no storage
/// is configured) or an object-store URI (s3, gcs). None when checkpointing is off.
pub fn checkpoint_dir(
    spec: &TrainingJobSpec,
    namespace: &str,
    training_job: &str,
) -> Option<String> {
    if !spec.checkpointing_enabled() {
        return None;
    }
    let storage = spec.checkpoint.as_ref().and_then(|c| c.storage.as_ref());
    let Some(storage) = storage else {
        return Some(trainyard_api::trainingjob::DEFAULT_CHECKPOINT_MOUNT_PATH.to_owned());
    };
    let object_uri = |scheme: &str, bucket: &Option<String>, prefix: Option<&str>| {
        let bucket = bucket.as_deref().unwrap_or_default();
        let default_prefix = format!("{namespace}/{training_job}");
        let prefix = prefix.unwrap_or(&default_prefix).trim_matches('/');
        if prefix.is_empty() {
            format!("{scheme}://{bucket}")
        } else {
            format!("{scheme}://{bucket}/{prefix}")
        }
    };
    Some(match storage.storage_type {
        StorageType::Pvc | StorageType::Nfs => storage.mount_path().to_owned(),
        StorageType::S3 => object_uri("s3", &storage.s3_bucket, storage.s3_prefix.as_deref()),
        StorageType::Gcs => object_uri("gs", &storage.gcs_bucket, None),
    })
}

fn checkpoint_env(spec: &TrainingJobSpec, ctx: &WorkerContext<'_>) -> Vec<EnvVar> {
    let Some(dir) = checkpoint_dir(spec, ctx.namespace, ctx.training_job) else {
        return Vec::new();
    };
    let checkpoint = spec.checkpoint.as_ref();
    let mut env = vec![
        literal("CHECKPOINT_DIR", dir),
        literal(
            "CHECKPOINT_FREQUENCY",
            spec.checkpoint_frequency().to_string(),
        ),
    ];
    if let Some(endpoint) = checkpoint
        .and_then(|c| c.storage.as_ref())
        .and_then(|s| s.s3_endpoint.as_deref())
    {
        // The AWS SDKs (boto3 included) read the S3 endpoint from this variable.
        env.push(literal("AWS_ENDPOINT_URL_S3", endpoint));
    }
    // The resume point is read from the ConfigMap when the container starts, not baked
    // into the pod template: it changes while a Job waits in the queue (a new checkpoint,
    // the checkpoint manager's choice) and a Job's template is immutable.
    env.push(from_config_map("RESUME_FROM", ctx, RESUME_FROM_KEY));
    // With frequency auto, the advice when the container starts; later
    // advice arrives as a checkpoint-interval command.
    if spec.checkpoint_frequency() == CheckpointFrequency::Auto {
        env.push(from_config_map(
            "CHECKPOINT_INTERVAL_SECONDS",
            ctx,
            CHECKPOINT_INTERVAL_KEY,
        ));
    }
    env
}

/// `name` read from the attempt's ConfigMap key `key` (absent when it is).
fn from_config_map(name: &str, ctx: &WorkerContext<'_>, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: ctx.config_map.to_owned(),
                key: key.to_owned(),
                optional: Some(true),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Where the workers write TensorBoard event files: `tensorboard` under the
/// checkpoint directory, so the logs outlive the pods and every attempt adds
/// to the same ones. None unless `monitoring.tensorboardEnabled` is set and
/// checkpointing is on (without checkpoint storage nothing would keep them).
pub fn tensorboard_log_dir(
    spec: &TrainingJobSpec,
    namespace: &str,
    training_job: &str,
) -> Option<String> {
    if !spec
        .monitoring
        .as_ref()
        .is_some_and(MonitoringSpec::is_tensorboard_enabled)
    {
        return None;
    }
    checkpoint_dir(spec, namespace, training_job)
        .map(|dir| format!("{}/tensorboard", dir.trim_end_matches('/')))
}

fn monitoring_env(spec: &TrainingJobSpec, ctx: &WorkerContext<'_>) -> Vec<EnvVar> {
    let Some(monitoring) = &spec.monitoring else {
        return Vec::new();
    };
    let mut env = Vec::new();
    if monitoring.enabled == Some(true) {
        env.push(literal("METRICS_PORT", spec.metrics_port().to_string()));
    }
    if monitoring.is_tensorboard_enabled() {
        env.push(literal("TENSORBOARD_ENABLED", "true"));
        if let Some(dir) = tensorboard_log_dir(spec, ctx.namespace, ctx.training_job) {
            env.push(literal("TENSORBOARD_LOG_DIR", dir));
        }
    }
    if let Some(uri) = &monitoring.mlflow_tracking_uri {
        env.push(literal("MLFLOW_TRACKING_URI", uri.clone()));
    }
    // MLflow's own variable: `mlflow.start_run()` and `mlflow.autolog()` resume it.
    if let Some(run) = &monitoring.mlflow_run_id {
        env.push(literal("MLFLOW_RUN_ID", run.clone()));
    }
    // W&B's own variables: a sweep's trials are grouped under the sweep, a
    // standalone job's attempts under the job, and each worker's run is named
    // for its rank.
    if let Some(project) = &monitoring.wandb_project {
        env.push(literal("WANDB_PROJECT", project.clone()));
        env.push(literal(
            "WANDB_RUN_GROUP",
            ctx.sweep.unwrap_or(ctx.training_job),
        ));
        env.push(literal(
            "WANDB_NAME",
            format!("{}-rank-{}", ctx.training_job, index_reference()),
        ));
    }
    env
}

/// Hyperparameters as variables: the named ones under their own names, every
/// `additionalParams` entry as `HP_<NAME>` (upper case, other characters as `_`).
pub(crate) fn hyperparameter_env(spec: &TrainingJobSpec) -> Result<Vec<EnvVar>, PlanError> {
    let hyperparameters = spec.hyperparameters.clone().unwrap_or_default();
    let mut env = Vec::new();
    if let Some(rate) = hyperparameters.learning_rate {
        // f64's Display never uses an exponent, so 1e-5 reads "0.00001" for every parser.
        env.push(literal("LEARNING_RATE", rate.to_string()));
    }
    if let Some(batch_size) = hyperparameters.batch_size {
        env.push(literal("BATCH_SIZE", batch_size.to_string()));
    }
    env.push(literal("EPOCHS", spec.epochs().to_string()));
    if let Some(optimizer) = hyperparameters.optimizer {
        env.push(literal("OPTIMIZER", optimizer.as_str()));
    }
    if let Some(steps) = hyperparameters.warmup_steps {
        env.push(literal("WARMUP_STEPS", steps.to_string()));
    }
    if let Some(steps) = hyperparameters.gradient_accumulation_steps {
        env.push(literal("GRADIENT_ACCUMULATION_STEPS", steps.to_string()));
    }
    if let Some(mixed) = hyperparameters.mixed_precision {
        env.push(literal("MIXED_PRECISION", mixed.to_string()));
    }
    let mut owners: BTreeMap<String, &str> = BTreeMap::new();
    for (key, value) in &hyperparameters.additional_params {
        let name = additional_param_env_name(key);
        if let Some(first) = owners.insert(name.clone(), key) {
            return Err(PlanError::HyperparameterNameClash {
                first: first.to_owned(),
                second: key.clone(),
                env_name: name,
            });
        }
        env.push(literal(&name, value.clone()));
    }
    Ok(env)
}

/// `weight_decay` → `HP_WEIGHT_DECAY`, `label-smoothing` → `HP_LABEL_SMOOTHING`.
pub fn additional_param_env_name(key: &str) -> String {
    let sanitized: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("HP_{sanitized}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::Hyperparameters;

    #[test]
    fn additional_params_become_hp_variables_and_clashes_are_named() {
        assert_eq!(additional_param_env_name("weight_decay"), "HP_WEIGHT_DECAY");
        assert_eq!(
            additional_param_env_name("label-smoothing.v2"),
            "HP_LABEL_SMOOTHING_V2"
        );

        let spec = TrainingJobSpec {
            model: "m".into(),
            dataset: "d".into(),
            num_workers: 1,
            hyperparameters: Some(Hyperparameters {
                additional_params: BTreeMap::from([
                    ("drop-out".to_owned(), "0.1".to_owned()),
                    ("drop_out".to_owned(), "0.2".to_owned()),
                ]),
                ..Hyperparameters::default()
            }),
            ..TrainingJobSpec::default()
        };
        let error = hyperparameter_env(&spec)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("HP_DROP_OUT"), "{error}");
        assert!(
            error.contains("spec.hyperparameters.additionalParams"),
            "{error}"
        );
    }

    #[test]
    fn tf_config_lists_every_worker_and_references_the_index() {
        let hosts = vec!["a-0.s.ns.svc".to_owned(), "a-1.s.ns.svc".to_owned()];
        assert_eq!(
            tf_config(&hosts, 2222),
            r#"{"cluster":{"worker":["a-0.s.ns.svc:2222","a-1.s.ns.svc:2222"]},"task":{"type":"worker","index":$(TRAINYARD_WORKER_INDEX)}}"#
        );
        // What the container sees once Kubernetes has expanded the reference.
        let expanded = tf_config(&hosts, 2222).replace("$(TRAINYARD_WORKER_INDEX)", "1");
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&expanded);
        assert_eq!(
            parsed.ok().and_then(|v| v["task"]["index"].as_u64()),
            Some(1)
        );
    }
}
