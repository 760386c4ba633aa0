//! The adapter: messages in, the core's decisions out.
//!
//! Messages about one job are handled one at a time, in stream order (the
//! runtime's lanes); each job's record is cached and written back to the
//! `trainyard_checkpoints` bucket after every message that changed it.
//! Published messages carry ids derived from the message that caused them, so
//! a redelivery publishes nothing twice.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_nats::jetstream::kv;
use bytes::Bytes;
use checkpoint_manager_core::problems::{self, OverdueInput, POLICY_KEY};
use checkpoint_manager_core::retention::{self, Protected};
use checkpoint_manager_core::verify::{self, Expected};
use checkpoint_manager_core::{
    Checkpoint, InterruptionStats, JobCheckpoints, KeepBest, Method, MetricMode, Problem,
    ProblemKind, ProblemSeverity, Raised, RetentionPolicy, SaveStats, Verification, Verifier,
    interval, registration,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::Instrument;
use trainyard_api::{StorageType, TrainingJob, TrainingJobState};
use trainyard_contracts::alerts::{CheckpointProblem, CheckpointProblemKind, Severity};
use trainyard_contracts::decisions::{
    CheckpointIntervalAdvised, CheckpointRef, CheckpointVerified, ModelRegistered,
    ResumePointChosen, RetentionApplied, RetentionExecutor, SkippedCheckpoint, SweepProgressed,
};
use trainyard_contracts::events::{Change, TrainingJobChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::worker::{CheckpointReported, VerificationMethod};
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload};
use trainyard_mlflow::ServerChoice;
use trainyard_runtime::{Delivery, HandleError, Handler, Publisher};

use crate::ManagerConfig;
use crate::error::CheckpointError;
use crate::metrics::CheckpointMetrics;
use crate::registry::{Registry, refusal};
use crate::storage::{Storage, is_volume_path};
use crate::waiting::Waiting;

/// Version of [`JobRecord`]'s stored form.
pub const RECORD_VERSION: u32 = 1;
/// Resume reason when a newer checkpoint was verified.
pub const REASON_VERIFIED: &str = "Verified";

/// What the manager keeps from a TrainingJob's spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSettings {
    /// Every checkpoint of the job lives under this directory or URI prefix.
    pub base: String,
    #[serde(default)]
    pub s3_endpoint: Option<String>,
    #[serde(default)]
    pub policy: Option<RetentionPolicy>,
    /// Why the policy is not applied (it failed its checks); nothing is deleted then.
    #[serde(default)]
    pub policy_error: Option<String>,
    /// `checkpoint.frequency: auto`.
    #[serde(default)]
    pub auto_interval: bool,
    #[serde(default)]
    pub queue: Option<String>,
    /// `monitoring.mlflowRunId`: the run a registered model version is tied to.
    #[serde(default)]
    pub mlflow_run_id: Option<String>,
    /// `monitoring.mlflowTrackingUri`: the registry the job's model goes to
    /// when the allow-list admits it.
    #[serde(default)]
    pub mlflow_tracking_uri: Option<String>,
    /// The `trainyard.dev/model-name` annotation.
    #[serde(default)]
    pub model_name: Option<String>,
    /// The Sweep whose trial the job is: registered only as the Sweep's best.
    #[serde(default)]
    pub sweep: Option<String>,
    /// Where a checkpoint volume keeps the job's checkpoints, as the
    /// registry names them (`pvc://<claim>/<directory>`); none on object storage.
    #[serde(default)]
    pub volume_location: Option<String>,
}

/// The message a decision answers: its causation, and the ids of what it
/// publishes derive from its id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cause {
    pub id: uuid::Uuid,
    pub correlation_id: uuid::Uuid,
    pub time: DateTime<Utc>,
}

impl Cause {
    pub fn of(message: &Incoming) -> Self {
        Self {
            id: message.header.id,
            correlation_id: message.header.correlation_id,
            time: message.header.time,
        }
    }

    fn stamp<P: Payload>(&self, mut envelope: Envelope<P>) -> Envelope<P> {
        envelope.correlation_id = self.correlation_id;
        envelope.causation_id = Some(self.id);
        envelope
    }
}

/// A report whose storage did not answer: acknowledged, kept in the job's
/// record, and verified by the waiting timer once its endpoint answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingReport {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    pub cause: Cause,
}

/// Everything the manager keeps about one job.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub version: u32,
    pub job: EntityRef,
    #[serde(default)]
    pub settings: Option<JobSettings>,
    #[serde(default)]
    pub checkpoints: JobCheckpoints,
    #[serde(default)]
    pub saves: SaveStats,
    /// The URI of the last resume point published: protected from retention.
    #[serde(default)]
    pub resume_uri: Option<String>,
    /// Checkpoints registered as model versions: protected from retention.
    #[serde(default)]
    pub registered: BTreeSet<String>,
    #[serde(default)]
    pub running_since: Option<DateTime<Utc>>,
    #[serde(default)]
    pub advised_interval_seconds: Option<f64>,
    /// The job's last lifecycle transition was to Completed.
    #[serde(default)]
    pub completed: bool,
    /// The model version the job's chosen checkpoint was registered as, or
    /// the registry's refusal: what a redelivery publishes again.
    #[serde(default)]
    pub model: Option<ModelRegistered>,
    /// When the newest verified checkpoint was verified: the overdue check's clock.
    #[serde(default)]
    pub last_verified_at: Option<DateTime<Utc>>,
    /// The current overdue episode was raised (re-armed by the next verified
    /// checkpoint or start of Running).
    #[serde(default)]
    pub overdue_raised: bool,
    /// Problems raised once per checkpoint URI or refused policy.
    #[serde(default)]
    pub raised: Raised,
    /// The model a Sweep's trial is registered as, set once the Sweep
    /// finished with this trial as its best.
    #[serde(default)]
    pub sweep_model: Option<String>,
    /// Reports waiting for their storage to answer, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingReport>,
}

impl JobRecord {
    fn new(job: EntityRef) -> Self {
        Self {
            version: RECORD_VERSION,
            job,
            settings: None,
            checkpoints: JobCheckpoints::default(),
            saves: SaveStats::default(),
            resume_uri: None,
            registered: BTreeSet::new(),
            running_since: None,
            advised_interval_seconds: None,
            completed: false,
            model: None,
            last_verified_at: None,
            overdue_raised: false,
            raised: Raised::default(),
            sweep_model: None,
            waiting: Vec::new(),
        }
    }
}

/// The directory or URI prefix a job's checkpoints go to, as the planner
/// tells the workers (`CHECKPOINT_DIR`); None when checkpointing is off.
pub fn checkpoint_base(job: &TrainingJob) -> Option<String> {
    let spec = &job.spec;
    if !spec.checkpointing_enabled() {
        return None;
    }
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let storage = spec.checkpoint.as_ref().and_then(|c| c.storage.as_ref());
    let Some(storage) = storage else {
        return Some(trainyard_api::trainingjob::DEFAULT_CHECKPOINT_MOUNT_PATH.to_string());
    };
    let object = |scheme: &str, bucket: &Option<String>, prefix: Option<&str>| {
        let default_prefix = format!("{namespace}/{name}");
        let prefix = prefix.unwrap_or(&default_prefix).trim_matches('/');
        let bucket = bucket.as_deref().unwrap_or_default();
        if prefix.is_empty() {
            format!("{scheme}://{bucket}")
        } else {
            format!("{scheme}://{bucket}/{prefix}")
        }
    };
    Some(match storage.storage_type {
        StorageType::Pvc | StorageType::Nfs => storage.mount_path().to_string(),
        StorageType::S3 => object("s3", &storage.s3_bucket, storage.s3_prefix.as_deref()),
        StorageType::Gcs => object("gs", &storage.gcs_bucket, None),
    })
}

fn settings_of(job: &TrainingJob) -> Option<JobSettings> {
    let base = checkpoint_base(job)?;
    let checkpoint = job.spec.checkpoint.as_ref();
    let policy = checkpoint
        .and_then(|c| c.retention.as_ref())
        .map(|r| RetentionPolicy {
            keep_last: r.keep_last,
            keep_best: r.keep_best.as_ref().map(|b| KeepBest {
                metric: b.metric.clone(),
                mode: match b.mode {
                    Some(trainyard_api::MetricMode::Max) => MetricMode::Max,
                    _ => MetricMode::Min,
                },
                count: b.count.unwrap_or(1),
            }),
            keep_every_n_steps: r.keep_every_n_steps,
            pinned_steps: r.pinned_steps.clone(),
        });
    let policy_error = policy
        .as_ref()
        .and_then(|p| p.check().err())
        .map(|e| e.to_string());
    Some(JobSettings {
        base,
        s3_endpoint: checkpoint
            .and_then(|c| c.storage.as_ref())
            .and_then(|s| s.s3_endpoint.clone()),
        policy: if policy_error.is_some() { None } else { policy },
        policy_error,
        auto_interval: job.spec.checkpoint_frequency() == trainyard_api::CheckpointFrequency::Auto,
        queue: job.spec.scheduling.as_ref().and_then(|s| s.queue.clone()),
        mlflow_run_id: job
            .spec
            .monitoring
            .as_ref()
            .and_then(|m| m.mlflow_run_id.clone()),
        mlflow_tracking_uri: job
            .spec
            .monitoring
            .as_ref()
            .and_then(|m| m.mlflow_tracking_uri.clone()),
        model_name: job
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(trainyard_api::ANNOTATION_MODEL_NAME).cloned()),
        sweep: sweep_of(job),
        volume_location: job.spec.checkpoint_volume_location(
            job.metadata.namespace.as_deref().unwrap_or_default(),
            job.metadata.name.as_deref().unwrap_or_default(),
        ),
    })
}

/// The Sweep that owns `job` (its trial): the controlling owner reference of
/// kind Sweep, else the planner's `trainyard.dev/sweep` label.
fn sweep_of(job: &TrainingJob) -> Option<String> {
    let owner = job
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| {
            owner.kind == "Sweep" && owner.api_version == trainyard_api::API_GROUP_VERSION
        });
    owner.map(|owner| owner.name.clone()).or_else(|| {
        job.metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SWEEP_LABEL).cloned())
    })
}

/// The label the planner puts on a Sweep's trials, naming the Sweep.
pub const SWEEP_LABEL: &str = "trainyard.dev/sweep";

fn method_of(method: Method) -> VerificationMethod {
    match method {
        Method::TrainyardManifest => VerificationMethod::TrainyardManifest,
        Method::PytorchDcp => VerificationMethod::PytorchDcp,
        Method::Orbax => VerificationMethod::Orbax,
    }
}

fn method_from(method: VerificationMethod) -> Method {
    match method {
        VerificationMethod::TrainyardManifest => Method::TrainyardManifest,
        VerificationMethod::PytorchDcp => Method::PytorchDcp,
        VerificationMethod::Orbax => Method::Orbax,
    }
}

fn reference(checkpoint: &Checkpoint) -> CheckpointRef {
    CheckpointRef {
        uri: checkpoint.uri.clone(),
        epoch: checkpoint.epoch,
        step: checkpoint.step,
        metrics: checkpoint.metrics.clone(),
    }
}

/// A message to publish, with its deduplication id.
enum Outgoing {
    Verified(CheckpointVerified),
    Resume(ResumePointChosen),
    Retention(RetentionApplied),
    Interval(CheckpointIntervalAdvised),
    Registered(ModelRegistered),
    /// A checkpoint problem, with its deduplication id.
    Problem(Problem, String),
}

/// The deduplication id of a problem raised by `cause`: derived from the
/// problem's key when it has one (raised once per key), else from the cause.
fn problem_id(job: &EntityRef, problem: &Problem, cause: &str) -> String {
    match &problem.key {
        Some(key) => {
            let digest = Sha256::digest(format!("{}/{key}", job.key()));
            format!("checkpoint-problem/{digest:x}")
        }
        None => format!("{cause}/problem/{}", problem.kind.as_str()),
    }
}

fn alert_of(problem: Problem) -> CheckpointProblem {
    CheckpointProblem {
        severity: match problem.severity {
            ProblemSeverity::Warning => Severity::Warning,
            ProblemSeverity::Critical => Severity::Critical,
        },
        problem: match problem.kind {
            ProblemKind::WriteFailed => CheckpointProblemKind::WriteFailed,
            ProblemKind::Overdue => CheckpointProblemKind::Overdue,
            ProblemKind::ResumeUnavailable => CheckpointProblemKind::ResumeUnavailable,
            ProblemKind::RetentionFailed => CheckpointProblemKind::RetentionFailed,
        },
        uri: problem.uri,
        last_checkpoint_age_seconds: problem.last_checkpoint_age_seconds,
        message: problem.message,
    }
}

/// The problems `cause` raises for the job, each admitted once per key.
fn raise(
    record: &mut JobRecord,
    cause: &str,
    found: impl IntoIterator<Item = Problem>,
) -> Vec<Outgoing> {
    found
        .into_iter()
        .filter(|problem| record.raised.admit(problem, cause))
        .map(|problem| {
            let id = problem_id(&record.job, &problem, cause);
            Outgoing::Problem(problem, id)
        })
        .collect()
}

pub struct Manager {
    publisher: Publisher,
    bucket: kv::Store,
    metrics: CheckpointMetrics,
    config: ManagerConfig,
    storage: Storage,
    /// The model registry completed jobs' checkpoints go to; None when off.
    registry: Option<Registry>,
    records: Mutex<HashMap<String, JobRecord>>,
    /// One handler at a time per job: its TrainingJob, report and lifecycle
    /// consumers each load, change and save the same record.
    job_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Interruptions per node pool (the job's queue), from lifecycle transitions.
    pools: Mutex<HashMap<String, InterruptionStats>>,
    /// Jobs whose reports wait for their storage, per endpoint.
    waiting: Mutex<Waiting>,
}

impl Manager {
    pub fn new(
        publisher: Publisher,
        bucket: kv::Store,
        metrics: CheckpointMetrics,
        config: ManagerConfig,
        registry: Option<Registry>,
    ) -> Self {
        Self {
            publisher,
            bucket,
            metrics,
            storage: Storage::new(config.storage.clone()),
            registry,
            config,
            records: Mutex::default(),
            job_locks: Mutex::default(),
            pools: Mutex::default(),
            waiting: Mutex::default(),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checkpoints tracked over every job held in memory.
    pub fn tracked(&self) -> usize {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| r.checkpoints.len())
            .sum()
    }

    async fn load(&self, job: &EntityRef) -> Result<JobRecord, CheckpointError> {
        let key = job.key();
        let cached = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        if let Some(record) = cached {
            return Ok(record);
        }
        let stored = self
            .bucket
            .get(&key)
            .await
            .map_err(|err| CheckpointError::Store(format!("get {key}: {err}")))?;
        match stored {
            None => Ok(JobRecord::new(job.clone())),
            Some(bytes) => {
                let record: JobRecord = serde_json::from_slice(&bytes).map_err(|err| {
                    CheckpointError::CorruptState {
                        key: key.clone(),
                        message: err.to_string(),
                    }
                })?;
                if record.version != RECORD_VERSION {
                    return Err(CheckpointError::CorruptState {
                        key,
                        message: format!(
                            "record version {} is not {RECORD_VERSION}",
                            record.version
                        ),
                    });
                }
                Ok(record)
            }
        }
    }

    async fn save(&self, record: JobRecord) -> Result<(), CheckpointError> {
        let key = record.job.key();
        let bytes = serde_json::to_vec(&record)
            .map_err(|err| CheckpointError::Store(format!("encode {key}: {err}")))?;
        self.bucket
            .put(&key, Bytes::from(bytes))
            .await
            .map_err(|err| CheckpointError::Store(format!("put {key}: {err}")))?;
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, record);
        Ok(())
    }

    async fn publish(
        &self,
        job: &EntityRef,
        cause: &Cause,
        outgoing: Vec<Outgoing>,
    ) -> Result<(), CheckpointError> {
        for (index, message) in outgoing.into_iter().enumerate() {
            let id = format!("{}/{index}", cause.id);
            match message {
                Outgoing::Verified(p) => self.publish_one(job, cause, &id, p).await?,
                Outgoing::Resume(p) => {
                    self.metrics.resume_points.inc();
                    self.publish_one(job, cause, &id, p).await?
                }
                Outgoing::Retention(p) => self.publish_one(job, cause, &id, p).await?,
                Outgoing::Interval(p) => self.publish_one(job, cause, &id, p).await?,
                Outgoing::Registered(p) => self.publish_one(job, cause, &id, p).await?,
                Outgoing::Problem(problem, id) => {
                    self.publish_problem(job, Some(cause), problem, &id).await?
                }
            }
        }
        Ok(())
    }

    async fn publish_one<P: Payload>(
        &self,
        job: &EntityRef,
        cause: &Cause,
        id: &str,
        payload: P,
    ) -> Result<(), CheckpointError> {
        let envelope = cause.stamp(self.publisher.envelope(job.clone(), payload));
        self.publisher.publish_with_id(envelope, id).await?;
        Ok(())
    }

    async fn publish_problem(
        &self,
        job: &EntityRef,
        cause: Option<&Cause>,
        problem: Problem,
        id: &str,
    ) -> Result<(), CheckpointError> {
        let kind = problem.kind.as_str();
        tracing::warn!(problem = kind, message = %problem.message, "checkpoint problem raised");
        let envelope = self.publisher.envelope(job.clone(), alert_of(problem));
        let envelope = match cause {
            Some(cause) => cause.stamp(envelope),
            None => envelope,
        };
        self.publisher.publish_with_id(envelope, id).await?;
        self.metrics.problems.with_label_values(&[kind]).inc();
        Ok(())
    }

    pub fn overdue_check_seconds(&self) -> u64 {
        self.config.overdue_check_seconds
    }

    /// The keys of every job record in the bucket.
    async fn job_keys(&self) -> Result<Vec<String>, CheckpointError> {
        use futures::TryStreamExt;
        self.bucket
            .keys()
            .await
            .map_err(|err| CheckpointError::Store(format!("list keys: {err}")))?
            .try_collect()
            .await
            .map_err(|err| CheckpointError::Store(format!("list keys: {err}")))
    }

    /// Raises `Overdue` for every Running job whose newest verified
    /// checkpoint is older than its limit, once per episode. The id is the
    /// episode's (its start), so replicas checking at once raise it once.
    pub async fn check_overdue(&self, now: DateTime<Utc>) -> Result<(), CheckpointError> {
        let keys = self.job_keys().await?;
        for key in keys {
            if let Err(err) = self.check_job_overdue(key.clone(), now).await {
                tracing::warn!(%key, error = %err, "overdue check of a job failed; retried next interval");
            }
        }
        Ok(())
    }

    async fn check_job_overdue(
        &self,
        key: String,
        now: DateTime<Utc>,
    ) -> Result<(), CheckpointError> {
        let job_lock = self.job_lock(&key);
        let _checking = job_lock.lock().await;
        let Some(job) = self.stored_job(&key).await? else {
            return Ok(());
        };
        let mut record = self.load(&job).await?;
        let input = OverdueInput {
            running_since: record
                .running_since
                .filter(|_| !record.completed && record.settings.is_some()),
            last_verified_at: record.last_verified_at,
            advised_interval_seconds: record.advised_interval_seconds,
            raised: record.overdue_raised,
        };
        let problem = problems::overdue(input, now, self.config.overdue_floor_seconds);
        let (Some(problem), Some(episode)) = (problem, input.episode_start()) else {
            self.records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, record);
            return Ok(());
        };
        let id = format!("{key}/problem/Overdue/{}", episode.to_rfc3339());
        record.overdue_raised = true;
        let span = tracing::info_span!("checkpoints", namespace = %job.namespace, name = %job.name);
        async {
            self.save(record).await?;
            self.publish_problem(&job, None, problem, &id).await
        }
        .instrument(span)
        .await
    }

    /// The job a bucket key names, from its cached or stored record.
    async fn stored_job(&self, key: &str) -> Result<Option<EntityRef>, CheckpointError> {
        if let Some(record) = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
        {
            return Ok(Some(record.job.clone()));
        }
        Ok(self.stored_record(key).await?.map(|record| record.job))
    }

    async fn stored_record(&self, key: &str) -> Result<Option<JobRecord>, CheckpointError> {
        let stored = self
            .bucket
            .get(key)
            .await
            .map_err(|err| CheckpointError::Store(format!("get {key}: {err}")))?;
        let Some(bytes) = stored else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|err| CheckpointError::CorruptState {
                key: key.to_string(),
                message: err.to_string(),
            })
    }

    /// The storage endpoint the job's waiting reports are read from now.
    fn waiting_endpoint(&self, record: &JobRecord) -> Option<String> {
        let first = record.waiting.first()?;
        let settings = record.settings.as_ref()?;
        Some(
            self.storage
                .endpoint(&first.uri, settings.s3_endpoint.as_deref()),
        )
    }

    /// Indexes the job's waiting reports under the endpoint its settings
    /// name now (a fixed `s3Endpoint` is tried at once).
    fn rewait(&self, record: &JobRecord) {
        if let Some(endpoint) = self.waiting_endpoint(record) {
            let mut waiting = self.waiting();
            waiting.wait(&record.job.key(), &endpoint, Instant::now());
            self.metrics.waiting_jobs.set(waiting.len() as i64);
        }
    }

    /// Indexes every job with reports waiting in the bucket: run when this
    /// replica takes the lease, so reports acknowledged before a restart or
    /// by another replica are verified.
    pub async fn recover_waiting(&self) -> Result<usize, CheckpointError> {
        let keys = self.job_keys().await?;
        let mut recovered = 0;
        for key in keys {
            match self.stored_record(&key).await {
                Ok(Some(record)) if !record.waiting.is_empty() => {
                    self.rewait(&record);
                    recovered += 1;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "record unreadable; its waiting reports are not recovered")
                }
            }
        }
        Ok(recovered)
    }

    /// Tries every storage endpoint that is due: its waiting jobs one after
    /// another until one still finds it unreachable (it is then tried again
    /// after a longer backoff). Runs on a timer, outside the consumers, so a
    /// storage that never answers holds no lane.
    pub async fn retry_waiting(&self) {
        let due = self.waiting().due(Instant::now());
        for (endpoint, jobs) in due {
            for key in jobs {
                match self.retry_job(&key).await {
                    Ok(()) => self.waiting().answered(&endpoint, Instant::now()),
                    Err(err) => {
                        tracing::info!(%endpoint, job = %key, error = %err, "waiting checkpoint reports still cannot be verified");
                        self.waiting().failed(&endpoint, Instant::now());
                        break;
                    }
                }
            }
        }
        self.metrics.waiting_jobs.set(self.waiting().len() as i64);
    }

    /// Verifies the job's waiting reports in order. The storage is read
    /// without the job's lock (a slow endpoint delays no handler); each
    /// verdict is applied under it, if the report still waits.
    async fn retry_job(&self, key: &str) -> Result<(), CheckpointError> {
        loop {
            let next = {
                let job_lock = self.job_lock(key);
                let _reading = job_lock.lock().await;
                let record = match self.cached_or_stored(key).await? {
                    Some(record) => record,
                    None => {
                        self.waiting().forget(key);
                        return Ok(());
                    }
                };
                let next = record.waiting.first().cloned().zip(record.settings.clone());
                if next.is_none() {
                    self.waiting().forget(key);
                }
                self.put_back(record);
                next
            };
            let Some((report, settings)) = next else {
                return Ok(());
            };
            let expected = Expected {
                step: report.step,
                epoch: report.epoch,
            };
            let verification = match self
                .storage
                .open(&report.uri, settings.s3_endpoint.as_deref())
            {
                Ok(location) => {
                    location
                        .verify(expected, self.config.verify_checksums)
                        .await
                }
                Err(err) => Err(err),
            };
            let verification = match verification {
                Ok(verification) => verification,
                Err(err @ CheckpointError::StorageUnavailable(_)) => return Err(err),
                // Acknowledged already: a refusal is the checkpoint's verdict.
                Err(err) => Verification::Incomplete {
                    reason: format!("the storage refused the verification: {err}"),
                },
            };
            self.conclude_waiting(key, &report, expected, verification)
                .await?;
        }
    }

    /// Applies the verdict of a waiting report to the job's record and
    /// publishes what follows, with ids derived from the report's message.
    async fn conclude_waiting(
        &self,
        key: &str,
        report: &WaitingReport,
        expected: Expected,
        verification: Verification,
    ) -> Result<(), CheckpointError> {
        let job_lock = self.job_lock(key);
        let _concluding = job_lock.lock().await;
        let Some(mut record) = self.cached_or_stored(key).await? else {
            return Ok(());
        };
        let Some(position) = record.waiting.iter().position(|w| w == report) else {
            self.put_back(record);
            return Ok(());
        };
        let Some(settings) = record.settings.clone() else {
            self.put_back(record);
            return Ok(());
        };
        record.waiting.remove(position);
        let job = record.job.clone();
        let span = tracing::info_span!("checkpoints", namespace = %job.namespace, name = %job.name);
        async {
            let previous_resume = record.checkpoints.latest_verified().map(|c| c.uri.clone());
            let mut outgoing = self
                .concluded(
                    &mut record,
                    &settings,
                    &report.uri,
                    expected,
                    verification,
                    previous_resume,
                    &report.cause,
                )
                .await?;
            if record.completed || record.sweep_model.is_some() {
                outgoing.extend(self.register(&mut record, false).await?);
            }
            let done = record.waiting.is_empty();
            // Published before the record is saved: a crash in between
            // verifies the report again and publishes the same ids.
            self.publish(&job, &report.cause, outgoing).await?;
            self.save(record).await?;
            if done {
                self.waiting().forget(key);
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// The job's cached record, else its stored one.
    async fn cached_or_stored(&self, key: &str) -> Result<Option<JobRecord>, CheckpointError> {
        let cached = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        match cached {
            Some(record) => Ok(Some(record)),
            None => self.stored_record(key).await,
        }
    }

    fn put_back(&self, record: JobRecord) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(record.job.key(), record);
    }

    /// The lock that lets one handler at a time work on the job `key`.
    fn job_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.job_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default()
            .clone()
    }

    /// Handles one message, in a span naming its job.
    pub async fn handle(&self, message: &Incoming) -> Result<(), CheckpointError> {
        let job = &message.header.entity;
        let span = tracing::info_span!("checkpoints", namespace = %job.namespace, name = %job.name);
        self.handle_in_span(message).instrument(span).await
    }

    async fn handle_in_span(&self, message: &Incoming) -> Result<(), CheckpointError> {
        let job = message.header.entity.clone();
        let kind = message.header.message_type.as_str();
        if kind == SweepProgressed::TYPE {
            let progress: SweepProgressed = message
                .payload()
                .map_err(|err| CheckpointError::Config(err.to_string()))?;
            return self.on_sweep(&job, &progress, message).await;
        }
        let key = job.key();
        let job_lock = self.job_lock(&key);
        let _handling = job_lock.lock().await;
        if kind == TrainingJobFinalized::TYPE {
            self.records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            self.bucket
                .purge(&key)
                .await
                .map_err(|err| CheckpointError::Store(format!("purge {key}: {err}")))?;
            self.job_locks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            let mut waiting = self.waiting();
            waiting.forget(&key);
            self.metrics.waiting_jobs.set(waiting.len() as i64);
            return Ok(());
        }
        let mut record = self.load(&job).await?;
        let outgoing = match kind {
            TrainingJobChanged::TYPE => {
                let changed: TrainingJobChanged = message
                    .payload()
                    .map_err(|err| CheckpointError::Config(err.to_string()))?;
                let mut outgoing = Vec::new();
                if changed.change == Change::Applied {
                    record.settings = settings_of(&changed.object);
                    match record
                        .settings
                        .as_ref()
                        .and_then(|s| s.policy_error.clone())
                    {
                        Some(policy_error) => {
                            tracing::warn!(problem = %policy_error, "retention policy refused; nothing is deleted");
                            outgoing = raise(
                                &mut record,
                                &message.header.id.to_string(),
                                [problems::policy_refused(&policy_error)],
                            );
                        }
                        None => record.raised.rearm(POLICY_KEY),
                    }
                    self.rewait(&record);
                }
                outgoing
            }
            CheckpointReported::TYPE => {
                let report: CheckpointReported = message
                    .payload()
                    .map_err(|err| CheckpointError::Config(err.to_string()))?;
                let mut outgoing = self.on_report(&mut record, report, message).await?;
                // A report handled after the completion (they travel on
                // different streams) may change which checkpoint is best.
                if record.completed || record.sweep_model.is_some() {
                    outgoing.extend(self.register(&mut record, false).await?);
                }
                outgoing
            }
            TrainingJobTransitioned::TYPE => {
                let transition: TrainingJobTransitioned = message
                    .payload()
                    .map_err(|err| CheckpointError::Config(err.to_string()))?;
                record.completed = transition.to == TrainingJobState::Completed;
                // Registration first: when the registry is unreachable the
                // message is handled again from the stored record, and the
                // transition's own bookkeeping must run once.
                let mut outgoing = Vec::new();
                if record.completed {
                    outgoing.extend(self.register(&mut record, true).await?);
                }
                outgoing.extend(self.on_transition(&mut record, &transition, message));
                outgoing
            }
            _ => Vec::new(),
        };
        // The record first: a crash before publishing is redelivered, and
        // deciding again from the stored record publishes the same ids.
        self.save(record).await?;
        self.publish(&job, &Cause::of(message), outgoing).await
    }

    /// Registers a finished Sweep's best trial's best verified checkpoint as
    /// the Sweep's model (named like a job's, from the Sweep's name). The
    /// trial's record keeps the registration, so a redelivered or repeated
    /// finish publishes it again without asking the registry, and a report of
    /// the trial handled later that changes its best checkpoint registers it.
    async fn on_sweep(
        &self,
        sweep: &EntityRef,
        progress: &SweepProgressed,
        message: &Incoming,
    ) -> Result<(), CheckpointError> {
        let (Some(reason), Some(best)) = (&progress.finished_reason, &progress.best_trial) else {
            return Ok(());
        };
        let Some(registry) = &self.registry else {
            return Ok(());
        };
        let trial = EntityRef::new(&sweep.namespace, &best.trial_name, "");
        let key = trial.key();
        let job_lock = self.job_lock(&key);
        let _handling = job_lock.lock().await;
        let mut record = self.load(&trial).await?;
        let owned = record
            .settings
            .as_ref()
            .and_then(|s| s.sweep.as_deref())
            .is_some_and(|owner| owner == sweep.name);
        if !owned {
            tracing::info!(trial = %best.trial_name, "the finished Sweep's best trial has no checkpoints of this Sweep tracked; no model registered");
            // Back to the cache only when it is a job's record, not an empty one.
            if record.settings.is_some() {
                self.records
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, record);
            }
            return Ok(());
        }
        let model_name = registry.model_name(
            &sweep.namespace,
            &sweep.name,
            progress
                .annotations
                .get(trainyard_api::ANNOTATION_MODEL_NAME)
                .map(String::as_str),
        );
        tracing::info!(trial = %best.trial_name, model = %model_name, %reason, "Sweep finished; registering its best trial");
        record.sweep_model = Some(model_name);
        let outgoing: Vec<Outgoing> = self
            .register(&mut record, true)
            .await?
            .into_iter()
            .collect();
        let trial = record.job.clone();
        self.save(record).await?;
        self.publish(&trial, &Cause::of(message), outgoing).await
    }

    async fn on_report(
        &self,
        record: &mut JobRecord,
        report: CheckpointReported,
        message: &Incoming,
    ) -> Result<Vec<Outgoing>, CheckpointError> {
        let job_key = record.job.key();
        let Some(settings) = record.settings.clone() else {
            return Err(CheckpointError::UnknownJob(job_key));
        };
        let tracked = u32::try_from(record.checkpoints.len()).unwrap_or(u32::MAX);
        let rejected = |reason: String| {
            self.metrics
                .verifications
                .with_label_values(&["rejected"])
                .inc();
            tracing::warn!(uri = %report.uri, %reason, "checkpoint report refused");
            Outgoing::Verified(CheckpointVerified {
                uri: report.uri.clone(),
                epoch: report.epoch,
                step: report.step,
                verified: false,
                method: None,
                verifier: None,
                checksums: false,
                reason: Some(reason),
                latest_verified: None,
                best: None,
                count: tracked,
            })
        };
        if !registration::within(&settings.base, &report.uri) {
            return Ok(vec![rejected(format!(
                "uri {} is outside the job's checkpoint storage {}; write checkpoints under it (checkpoint.storage)",
                report.uri, settings.base
            ))]);
        }
        if let Some(seconds) = report.save_seconds {
            record.saves.observe(seconds);
        }
        let checkpoint = Checkpoint {
            uri: report.uri.clone(),
            epoch: report.epoch,
            step: report.step,
            attempt: report.attempt,
            // A diverged metric ranks nothing (keepBest) and cannot be saved
            // as a JSON number in the catalog.
            metrics: report
                .metrics
                .iter()
                .filter(|(_, value)| value.is_finite())
                .map(|(name, value)| (name.clone(), *value))
                .collect(),
            size_bytes: report.size_bytes,
            save_seconds: report.save_seconds,
            verification: Verification::Pending,
        };
        let previous_resume = record.checkpoints.latest_verified().map(|c| c.uri.clone());
        match record.checkpoints.record(checkpoint) {
            Ok(_) => {}
            Err(err) => return Ok(vec![rejected(err.to_string())]),
        }
        let expected = Expected {
            step: report.step,
            epoch: report.epoch,
        };
        let missing_volume_dir = is_volume_path(&report.uri)
            && self.storage.readable(&report.uri)
            && !tokio::fs::try_exists(report.uri.strip_prefix("file://").unwrap_or(&report.uri))
                .await
                .unwrap_or(false);
        let verification = if missing_volume_dir {
            verify::judge("", &verify::Listing::new(), None, None, expected)
        } else if self.storage.readable(&report.uri) {
            let endpoint = self
                .storage
                .endpoint(&report.uri, settings.s3_endpoint.as_deref());
            let down = self.waiting().is_down(&endpoint);
            let outcome = if down {
                Err(CheckpointError::StorageUnavailable(format!(
                    "{endpoint} has reports waiting"
                )))
            } else {
                let location = self
                    .storage
                    .open(&report.uri, settings.s3_endpoint.as_deref())?;
                location
                    .verify(expected, self.config.verify_checksums)
                    .await
            };
            match outcome {
                Ok(verification) => verification,
                Err(CheckpointError::StorageUnavailable(reason)) => {
                    tracing::warn!(uri = %report.uri, %endpoint, %reason, "checkpoint storage does not answer; the report waits for it");
                    self.wait_for_storage(record, &endpoint, &report, message);
                    return Ok(Vec::new());
                }
                Err(err) => return Err(err),
            }
        } else {
            verify::reported_by_worker(
                report.verified_by.map(method_from),
                report.checksums_verified,
            )
        };
        self.concluded(
            record,
            &settings,
            &report.uri,
            expected,
            verification,
            previous_resume,
            &Cause::of(message),
        )
        .await
    }

    /// Keeps `report` in the job's record and indexes the job under the
    /// storage endpoint that did not answer; the waiting timer verifies it.
    fn wait_for_storage(
        &self,
        record: &mut JobRecord,
        endpoint: &str,
        report: &CheckpointReported,
        message: &Incoming,
    ) {
        if !record.waiting.iter().any(|w| w.uri == report.uri) {
            record.waiting.push(WaitingReport {
                uri: report.uri.clone(),
                epoch: report.epoch,
                step: report.step,
                cause: Cause::of(message),
            });
        }
        let mut waiting = self.waiting();
        waiting.wait(&record.job.key(), endpoint, Instant::now());
        self.metrics.waiting_jobs.set(waiting.len() as i64);
    }

    /// Records what verification found for the checkpoint at `uri` and
    /// decides what follows: its verdict, a new resume point, retention,
    /// interval advice and problems.
    #[allow(clippy::too_many_arguments)]
    async fn concluded(
        &self,
        record: &mut JobRecord,
        settings: &JobSettings,
        uri: &str,
        expected: Expected,
        verification: Verification,
        previous_resume: Option<String>,
        cause: &Cause,
    ) -> Result<Vec<Outgoing>, CheckpointError> {
        let outcome = if verification.is_verified() {
            "verified"
        } else {
            "incomplete"
        };
        self.metrics
            .verifications
            .with_label_values(&[outcome])
            .inc();
        record
            .checkpoints
            .set_verification(uri, verification.clone());

        let mut outgoing = Vec::new();
        let (method, verifier, checksums, reason) = match &verification {
            Verification::Verified {
                method,
                verifier,
                checksums,
            } => (
                Some(method_of(*method)),
                Some(match verifier {
                    Verifier::Manager => "checkpoint-manager",
                    Verifier::Worker => "worker",
                }),
                *checksums,
                None,
            ),
            Verification::Incomplete { reason } => (None, None, false, Some(reason.clone())),
            Verification::Pending => (None, None, false, Some("not verified yet".to_string())),
        };
        if let Some(reason) = &reason {
            tracing::warn!(%uri, %reason, "checkpoint is not verified");
        }

        let cause_id = cause.id.to_string();
        let newest = record.checkpoints.latest_verified().map(|c| c.uri.clone());
        if newest.is_some() && newest != previous_resume {
            record.last_verified_at = Some(cause.time);
            record.overdue_raised = false;
            outgoing.extend(self.resume_point(record, REASON_VERIFIED));
        }
        outgoing.extend(self.apply_retention(record, settings, &cause_id).await?);
        let summary = record.checkpoints.summary(settings.policy.as_ref());
        outgoing.insert(
            0,
            Outgoing::Verified(CheckpointVerified {
                uri: uri.to_string(),
                epoch: expected.epoch,
                step: expected.step,
                verified: verification.is_verified(),
                method,
                verifier: verifier.map(str::to_string),
                checksums,
                reason,
                latest_verified: summary.latest_verified.map(reference),
                best: summary.best.map(reference),
                count: u32::try_from(summary.count).unwrap_or(u32::MAX),
            }),
        );
        outgoing.extend(self.advice(record, settings));
        outgoing.extend(raise(
            record,
            &cause_id,
            problems::write_failed(uri, &verification),
        ));
        Ok(outgoing)
    }

    /// Registers the completed job's best verified checkpoint (else its newest
    /// verified) as a version of its model and moves the alias to it. The
    /// registration already recorded for that checkpoint is published again
    /// when `republish` is set (a redelivered completion), and nothing is
    /// asked of the registry for it. An unreachable registry is an error (the
    /// message is handled again); a refusal is recorded and published.
    async fn register(
        &self,
        record: &mut JobRecord,
        republish: bool,
    ) -> Result<Option<Outgoing>, CheckpointError> {
        let Some(registry) = &self.registry else {
            return Ok(None);
        };
        let Some(settings) = record.settings.clone() else {
            return Ok(None);
        };
        let Some(chosen) = registration::candidate(&record.checkpoints, settings.policy.as_ref())
        else {
            if republish {
                tracing::info!("job completed without a verified checkpoint; no model registered");
            }
            return Ok(None);
        };
        let model_name = match (&settings.sweep, &record.sweep_model) {
            (None, _) => registry.model_name(
                &record.job.namespace,
                &record.job.name,
                settings.model_name.as_deref(),
            ),
            (Some(_), Some(sweep_model)) => sweep_model.clone(),
            (Some(sweep), None) => {
                if republish {
                    tracing::info!(%sweep, "a Sweep's trial is registered only as the Sweep's best, when the Sweep finishes");
                }
                return Ok(None);
            }
        };
        let source = registration::source(
            &chosen.uri,
            &settings.base,
            settings.volume_location.as_deref(),
        );
        if let Some(model) = record
            .model
            .as_ref()
            .filter(|m| m.source == source && m.model_name == model_name)
        {
            return Ok(republish.then(|| Outgoing::Registered(model.clone())));
        }
        let server = registry.server(settings.mlflow_tracking_uri.as_deref());
        let (run_id, tracking_warning) = match &server {
            ServerChoice::Refused { reason, .. } => {
                // The job's run is on its own server, not on this one.
                (
                    None,
                    Some(format!(
                        "spec.monitoring.mlflowTrackingUri: {reason}; the checkpoint-manager registers the model on its own MLflow server {}, without the job's run",
                        registry.default_uri()
                    )),
                )
            }
            _ => (settings.mlflow_run_id.clone(), None),
        };
        let outcome = async {
            let version = registry
                .version(&server, &model_name, &source, run_id.as_deref())
                .await?;
            let alias = registry
                .move_alias(&server, &model_name, &version.version)
                .await;
            Ok::<_, trainyard_mlflow::MlflowError>((version, alias))
        }
        .await;
        let model = match outcome {
            Ok((version, alias)) => {
                record.registered.insert(source.clone());
                let outcome = if version.created {
                    "registered"
                } else {
                    "existing"
                };
                let (alias, error) = match alias {
                    Ok(()) => {
                        self.metrics
                            .registrations
                            .with_label_values(&[outcome])
                            .inc();
                        (registry.alias().map(str::to_string), None)
                    }
                    Err(err) => (None, Some(self.refused(err, &model_name, &source)?)),
                };
                tracing::info!(model = %model_name, version = %version.version, %source, outcome, "checkpoint registered as a model version");
                ModelRegistered {
                    model_name,
                    version: version.version,
                    source,
                    run_id,
                    alias,
                    error,
                    tracking_warning,
                }
            }
            Err(err) => {
                let error = self.refused(err, &model_name, &source)?;
                ModelRegistered {
                    model_name,
                    version: String::new(),
                    source,
                    run_id,
                    alias: None,
                    error: Some(error),
                    tracking_warning,
                }
            }
        };
        if let Some(error) = &model.error {
            tracing::warn!(model = %model.model_name, source = %model.source, %error, "model registry refused the checkpoint");
        }
        if let Some(warning) = &model.tracking_warning {
            // Once per registration published, not per attempt.
            tracing::warn!(model = %model.model_name, %warning, "the job's tracking server is not allowed; registered on the manager's own");
            self.metrics.mlflow_servers_refused.inc();
        }
        record.model = Some(model.clone());
        Ok(Some(Outgoing::Registered(model)))
    }

    /// A registry error that may pass is returned (the message is handled
    /// again); any other is the refusal to publish, with its fix.
    fn refused(
        &self,
        err: trainyard_mlflow::MlflowError,
        model_name: &str,
        source: &str,
    ) -> Result<String, CheckpointError> {
        let retryable = err.is_retryable();
        self.metrics
            .registrations
            .with_label_values(&[if retryable { "retried" } else { "refused" }])
            .inc();
        if retryable {
            return Err(err.into());
        }
        Ok(refusal(&err, model_name, source))
    }

    /// The resume point message for the job's newest verified checkpoint.
    fn resume_point(&self, record: &mut JobRecord, reason: &str) -> Option<Outgoing> {
        let choice = record.checkpoints.resume();
        let chosen = choice.checkpoint?;
        let point = ResumePointChosen {
            uri: chosen.uri.clone(),
            epoch: chosen.epoch,
            step: chosen.step,
            reason: reason.to_string(),
            verified_by: match &chosen.verification {
                Verification::Verified { method, .. } => Some(method_of(*method)),
                _ => None,
            },
            skipped: choice
                .skipped
                .iter()
                .map(|s| SkippedCheckpoint {
                    uri: s.checkpoint.uri.clone(),
                    epoch: s.checkpoint.epoch,
                    step: s.checkpoint.step,
                    reason: s.reason.clone(),
                })
                .collect(),
        };
        record.resume_uri = Some(point.uri.clone());
        Some(Outgoing::Resume(point))
    }

    async fn apply_retention(
        &self,
        record: &mut JobRecord,
        settings: &JobSettings,
        cause: &str,
    ) -> Result<Vec<Outgoing>, CheckpointError> {
        let Some(policy) = settings.policy.as_ref() else {
            return Ok(Vec::new());
        };
        let decision = retention::decide(
            record.checkpoints.all(),
            Some(policy),
            Protected {
                pending_resume: record.resume_uri.as_deref(),
                registered: Some(&record.registered),
            },
        );
        if decision.delete.is_empty() {
            return Ok(Vec::new());
        }
        let mut executor = RetentionExecutor::CheckpointManager;
        let mut deleted = Vec::new();
        let mut failed = Vec::new();
        for uri in decision.delete {
            if !self.storage.readable(&uri) {
                executor = RetentionExecutor::Worker;
                deleted.push(uri);
                continue;
            }
            match self.delete(&uri, settings).await {
                Ok(()) => {
                    self.metrics.deleted.inc();
                    record.raised.forget(&problems::deletion_key(&uri));
                    deleted.push(uri);
                }
                Err(err) => {
                    tracing::warn!(%uri, error = %err, "retention could not delete a checkpoint; kept for the next pass");
                    failed.push(problems::deletion_failed(&uri, &err.to_string()));
                }
            }
        }
        let mut outgoing = raise(record, cause, failed);
        if deleted.is_empty() {
            return Ok(outgoing);
        }
        record.checkpoints.remove(&deleted);
        tracing::info!(deleted = deleted.len(), "retention applied");
        outgoing.insert(
            0,
            Outgoing::Retention(RetentionApplied {
                delete: deleted,
                keep: decision.keep.into_iter().map(|(uri, _)| uri).collect(),
                executor,
            }),
        );
        Ok(outgoing)
    }

    /// Deletes one checkpoint's files (and its directory on a volume).
    async fn delete(&self, uri: &str, settings: &JobSettings) -> Result<(), CheckpointError> {
        let location = self.storage.open(uri, settings.s3_endpoint.as_deref())?;
        location.delete_all().await?;
        if is_volume_path(uri) {
            match tokio::fs::remove_dir_all(uri.strip_prefix("file://").unwrap_or(uri)).await {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(CheckpointError::Storage(format!("delete {uri}: {err}")));
                }
            }
        }
        Ok(())
    }

    fn advice(&self, record: &mut JobRecord, settings: &JobSettings) -> Option<Outgoing> {
        let pool = settings
            .queue
            .as_ref()
            .and_then(|q| {
                self.pools
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(q)
                    .copied()
            })
            .unwrap_or_default();
        let advice = interval::advise(
            &record.saves,
            &pool,
            self.config.prior_seconds_between_interruptions,
        )?;
        let moved = record.advised_interval_seconds.is_none_or(|last| {
            (advice.interval_seconds - last).abs() > self.config.advice_change_fraction * last
        });
        if !moved {
            return None;
        }
        record.advised_interval_seconds = Some(advice.interval_seconds);
        Some(Outgoing::Interval(CheckpointIntervalAdvised {
            interval_seconds: advice.interval_seconds,
            save_seconds: advice.save_seconds,
            mean_seconds_between_interruptions: advice.mean_seconds_between_interruptions,
            applied: settings.auto_interval,
        }))
    }

    fn on_transition(
        &self,
        record: &mut JobRecord,
        transition: &TrainingJobTransitioned,
        message: &Incoming,
    ) -> Vec<Outgoing> {
        let at = message.header.time;
        let queue = transition
            .queue
            .clone()
            .or_else(|| record.settings.as_ref().and_then(|s| s.queue.clone()));
        if transition.from == Some(TrainingJobState::Running)
            && transition.to != TrainingJobState::Running
            && let Some(since) = record.running_since.take()
            && let Some(queue) = &queue
        {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            let pool = pools.entry(queue.clone()).or_default();
            pool.exposure_seconds += (at - since).num_milliseconds().max(0) as f64 / 1000.0;
            if matches!(transition.reason.as_str(), "Restarting" | "Preempted") {
                pool.interruptions += 1;
            }
        }
        if transition.to == TrainingJobState::Running {
            record.running_since = Some(at);
            record.overdue_raised = false;
        }
        let next_attempt_ahead = matches!(
            transition.to,
            TrainingJobState::Pending
                | TrainingJobState::Queued
                | TrainingJobState::Initializing
                | TrainingJobState::Suspended
        ) && transition.from == Some(TrainingJobState::Running);
        if next_attempt_ahead {
            let unavailable = problems::resume_unavailable(
                &record.checkpoints.resume(),
                record.checkpoints.len(),
            );
            let mut outgoing: Vec<Outgoing> = self
                .resume_point(record, &transition.reason)
                .into_iter()
                .collect();
            outgoing.extend(raise(record, &message.header.id.to_string(), unavailable));
            return outgoing;
        }
        Vec::new()
    }
}

/// The manager as a consumer.
pub struct ManagerHandler(pub std::sync::Arc<Manager>);

impl Handler for ManagerHandler {
    fn lanes(&self) -> usize {
        // Jobs are independent; one job's messages stay in order within a lane.
        8
    }

    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        self.0.handle(&message).await.map_err(|err| {
            tracing::warn!(category = err.category(), error = %err, "message not handled");
            HandleError::from(err)
        })
    }
}
