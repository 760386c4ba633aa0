//! The planner's adapter: messages in, the pure core's decisions carried out
//! against Kubernetes and NATS. One job's messages are handled one at a time.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use planner_core::{
    EventType, Observation, PlannerAction, PlannerCommand, PlannerConfig, PlannerJobState,
};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJob;
use trainyard_contracts::cost::{
    BudgetStatusReported, CapacityChosen, CostRecorded, IdleSuspendRequested,
};
use trainyard_contracts::decisions::{
    AdmissionDecided, CheckpointIntervalAdvised, CheckpointVerified, ModelRegistered,
    PendingExplained, PreemptionDecided, QueueStatusReported, ResumePointChosen, SweepProgressed,
    TrialRequested, TrialStopped,
};
use trainyard_contracts::events::{
    Change, JobEventObserved, JobObserved, PodObserved, TrainingJobChanged,
};
use trainyard_contracts::lifecycle::TrainingJobFinalized;
use trainyard_contracts::submit::{SubmissionResult, TrainingJobSubmitted};
use trainyard_contracts::worker::{CheckpointReported, ProgressReported};
use trainyard_contracts::{EntityRef, Incoming, Payload};
use trainyard_runtime::{Delivery, HandleError, Handler, Lease, Publisher};

use crate::error::PlannerError;
use crate::job_metrics::JobMetrics;
use crate::kubernetes::{FINALIZER, KubeWriter, ObjectChanges};
use crate::store::StateStore;

/// The planner's metrics.
#[derive(Clone)]
pub struct PlannerMetrics {
    pub reconciles: IntCounterVec,
    pub reconcile_seconds: HistogramVec,
    pub actions: IntCounterVec,
    pub jobs_in_memory: IntGauge,
    pub timers: IntGauge,
    /// TrainingJobs by state, outcomes, restarts, preemptions, admission waits.
    pub jobs: Arc<JobMetrics>,
}

impl PlannerMetrics {
    pub fn register(registry: &Registry) -> Result<Self, PlannerError> {
        let err = |e: prometheus::Error| PlannerError::Metrics(e.to_string());
        let reconciles = IntCounterVec::new(
            Opts::new(
                "trainyard_planner_reconciles_total",
                "Reconciles, by outcome",
            ),
            &["outcome"],
        )
        .map_err(err)?;
        let reconcile_seconds = HistogramVec::new(
            HistogramOpts::new(
                "trainyard_planner_reconcile_seconds",
                "Time to decide and carry out",
            ),
            &["outcome"],
        )
        .map_err(err)?;
        let actions = IntCounterVec::new(
            Opts::new(
                "trainyard_planner_actions_total",
                "Actions carried out, by kind (apply_unchanged: objects as last applied, not sent again; status_deferred: a status change waits for the next write)",
            ),
            &["action"],
        )
        .map_err(err)?;
        registry
            .register(Box::new(reconciles.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(reconcile_seconds.clone()))
            .map_err(err)?;
        let jobs_in_memory = IntGauge::new(
            "trainyard_planner_jobs_in_memory",
            "TrainingJobs this process holds in memory (finished and deleted ones are released after finished_entry_ttl_seconds)",
        )
        .map_err(err)?;
        let timers = IntGauge::new(
            "trainyard_planner_timers",
            "Timed reconciles waiting (at most one per job: the earliest)",
        )
        .map_err(err)?;
        registry.register(Box::new(timers.clone())).map_err(err)?;
        registry.register(Box::new(actions.clone())).map_err(err)?;
        registry
            .register(Box::new(jobs_in_memory.clone()))
            .map_err(err)?;
        Ok(Self {
            reconciles,
            reconcile_seconds,
            actions,
            jobs_in_memory,
            timers,
            jobs: Arc::new(JobMetrics::register(registry)?),
        })
    }
}

/// What the planner knows of one TrainingJob.
#[derive(Default)]
struct Entry {
    loaded: bool,
    object: Option<TrainingJob>,
    /// The API answered 409: the next load reads the object from the API
    /// even when the message carries a copy.
    reread_object: bool,
    state: PlannerJobState,
    /// Fingerprints of the objects this process last applied: the core asks for
    /// the same objects on every event while a job waits, and re-applying one
    /// unchanged is an API write for nothing (admitting a job changes its Job,
    /// not its ConfigMap or Service).
    applied: AppliedObjects,
    /// Worker pods this process took the placement gate off: the core asks
    /// again on every message until the pod's ungated state is observed.
    ungated: HashSet<String>,
    /// Fingerprint of the state as last saved to (or loaded from) the KV bucket.
    saved: Option<u64>,
    /// The state's revision in the KV bucket as last read or written (0:
    /// none): the next save expects it.
    revision: u64,
    /// An observation changed the state since it was last saved: only
    /// observations change it (the core decides from it, never into it), so
    /// the many other inputs skip encoding it.
    observed_unsaved: bool,
    /// When a message last left the job finished (Completed or Failed) or
    /// gone from the API (a deleted job's last Pod and Job changes arrive
    /// after it is forgotten).
    finished_at: Option<Instant>,
    /// When this process last wrote the job's status.
    status_written_at: Option<Instant>,
    /// A status change waits for `min_status_interval_ms`, and a reconcile
    /// that writes it is scheduled.
    status_deferred: bool,
    /// Events an observation records by itself (the checkpoint-manager's
    /// findings), carried out with the next decisions.
    observed_events: Vec<PlannerAction>,
}

/// Fingerprints of one job's objects as last applied; None: not applied by
/// this process, or to be applied again.
#[derive(Default, Clone, Copy, PartialEq, Eq)]
struct AppliedObjects {
    checkpoint_claim: Option<u64>,
    config_map: Option<u64>,
    service: Option<u64>,
    job: Option<u64>,
    worker_credentials: Option<u64>,
}

/// Every job's entry, by `<namespace>/<name>`.
type Entries = HashMap<String, Arc<tokio::sync::Mutex<Entry>>>;

/// One message's effect on a job.
enum Input {
    Object(Box<TrainingJobChanged>),
    Observe(Box<Observation>),
    Reconcile,
}

pub struct Planner {
    writer: KubeWriter,
    publisher: Publisher,
    store: StateStore,
    config: PlannerConfig,
    metrics: PlannerMetrics,
    /// Held while this replica is the active planner; checked before every write.
    lease: Lease,
    shutdown: CancellationToken,
    entries: Mutex<Entries>,
    /// When each job's timed reconcile is due: one timer per job, the earliest.
    timers: Mutex<HashMap<String, tokio::time::Instant>>,
}

/// A hash of encoded values; compared only within this process.
fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    for part in parts {
        part.hash(&mut hasher);
    }
    hasher.finish()
}

/// Feeds encoded bytes straight into a hasher.
struct HashWriter<'a>(&'a mut std::hash::DefaultHasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Adds one value's JSON to `hasher`, encoded into it rather than into a buffer.
fn hash_json(
    hasher: &mut std::hash::DefaultHasher,
    value: &impl serde::Serialize,
) -> Result<(), PlannerError> {
    // 0xff never occurs in JSON: it ends one value's bytes.
    hasher.write_u8(0xff);
    serde_json::to_writer(HashWriter(hasher), value)
        .map_err(|e| PlannerError::Encode(format!("desired objects: {e}")))
}

/// A hash of one desired object as applied by `field_manager`.
fn object_fingerprint(
    field_manager: &str,
    object: &impl serde::Serialize,
) -> Result<u64, PlannerError> {
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(field_manager.as_bytes());
    hash_json(&mut hasher, object)?;
    Ok(hasher.finish())
}

/// Hashes of the desired objects; the core asks for the same objects on most events.
fn objects_fingerprints(
    objects: &planner_core::DesiredObjects,
) -> Result<AppliedObjects, PlannerError> {
    let manager = objects.field_manager.as_str();
    Ok(AppliedObjects {
        checkpoint_claim: objects
            .checkpoint_claim
            .as_ref()
            .map(|claim| object_fingerprint(manager, claim))
            .transpose()?,
        config_map: Some(object_fingerprint(manager, &objects.config_map)?),
        service: Some(object_fingerprint(manager, &objects.service)?),
        job: Some(object_fingerprint(manager, &objects.job)?),
        // The unsigned credentials: the Secret is signed once per attempt
        // and process, not again on every reconcile.
        worker_credentials: objects
            .worker_credentials
            .as_ref()
            .map(|credentials| object_fingerprint(manager, credentials))
            .transpose()?,
    })
}

/// A TrainingJob no planner has reconciled yet: without the planner's
/// finalizer and without a status.
fn untouched(job: &TrainingJob) -> bool {
    job.status.is_none() && !job.finalizers().iter().any(|f| f == FINALIZER)
}

fn resource_version(job: &TrainingJob) -> Option<u64> {
    job.resource_version().and_then(|rv| rv.parse().ok())
}

impl Planner {
    pub fn new(
        writer: KubeWriter,
        publisher: Publisher,
        store: StateStore,
        config: PlannerConfig,
        metrics: PlannerMetrics,
        lease: Lease,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            writer,
            publisher,
            store,
            config,
            metrics,
            lease,
            shutdown,
            entries: Mutex::default(),
            timers: Mutex::default(),
        })
    }

    /// Fails unless this replica holds the lease: call before every write.
    fn fence(&self) -> Result<(), PlannerError> {
        self.lease.fence()?;
        Ok(())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn timers_locked(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::time::Instant>> {
        self.timers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry(&self, key: &str) -> Arc<tokio::sync::Mutex<Entry>> {
        let mut entries = self.entries();
        let entry = entries.entry(key.to_string()).or_default().clone();
        self.metrics.jobs_in_memory.set(entries.len() as i64);
        entry
    }

    /// Drops the entries of jobs finished for at least `ttl` (their state is
    /// in the KV bucket and is loaded again if anything more arrives), so
    /// memory follows the live jobs rather than every job ever seen. An entry
    /// some message holds or waits for is kept: under the map's lock nobody
    /// can take a new handle, so one job never has two entries.
    fn release_finished(&self, ttl: Duration) {
        let mut entries = self.entries();
        entries.retain(|_, entry| {
            if Arc::strong_count(entry) > 1 {
                return true;
            }
            entry.try_lock().map_or(true, |entry| {
                entry.finished_at.is_none_or(|at| at.elapsed() < ttl)
            })
        });
        self.metrics.jobs_in_memory.set(entries.len() as i64);
    }

    /// Releases finished jobs' entries (`finished_entry_ttl_seconds` after their
    /// last message: a job's last reports and object changes arrive just after
    /// it ends, and each would otherwise load it again) until shutdown.
    pub fn spawn_release(self: &Arc<Self>) {
        let planner = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        let ttl = Duration::from_secs(self.config.finished_entry_ttl_seconds.max(1).into());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(ttl);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = every.tick() => match planner.upgrade() {
                        Some(planner) => planner.release_finished(ttl),
                        None => return,
                    },
                }
            }
        });
    }

    fn forget(&self, key: &str) {
        let mut entries = self.entries();
        entries.remove(key);
        self.metrics.jobs_in_memory.set(entries.len() as i64);
    }

    /// Reconciles every TrainingJob in the cluster: after a restart this re-arms
    /// restart backoffs and deadlines that lived only in timers.
    pub async fn resync(self: &Arc<Self>) -> Result<usize, PlannerError> {
        let jobs = self.writer.list_all().await?;
        let count = jobs.len();
        for job in jobs {
            let entity = EntityRef::new(
                job.namespace().unwrap_or_default(),
                job.name_any(),
                job.uid().unwrap_or_default(),
            );
            let change = TrainingJobChanged {
                change: Change::Applied,
                object: job,
            };
            if let Err(err) = self
                .handle_input(&entity, Utc::now(), Input::Object(Box::new(change)))
                .await
            {
                tracing::warn!(job = %entity.key(), error = %err, "resync failed for job");
            }
        }
        Ok(count)
    }

    async fn handle_input(
        self: &Arc<Self>,
        entity: &EntityRef,
        at: DateTime<Utc>,
        input: Input,
    ) -> Result<(), PlannerError> {
        let started = Instant::now();
        let key = entity.key();
        let entry = self.entry(&key);
        let mut entry = entry.lock().await;
        if !entry.loaded {
            let (stored, revision) = match &input {
                // No planner has reconciled it (that adds the finalizer and
                // writes a status before any state is saved): nothing stored.
                Input::Object(change) if untouched(&change.object) => (None, 0),
                _ => self.store.load(&key).await?,
            };
            entry.revision = revision;
            // A job seen before (released when it finished, or before a restart)
            // is read from the API: a message may carry an older copy of it.
            let seen_before = stored.is_some();
            entry.state = stored.unwrap_or_default();
            entry.saved = Some(fingerprint(&[&StateStore::encode(&key, &entry.state)?]));
            if entry.object.is_none()
                && (seen_before || entry.reread_object || !matches!(input, Input::Object(_)))
            {
                entry.object = self.writer.get(&entity.namespace, &entity.name).await?;
                entry.reread_object = false;
            }
            entry.loaded = true;
        }
        let preemption =
            matches!(&input, Input::Observe(o) if matches!(o.as_ref(), Observation::Preemption(_)));
        let result = self.apply(&key, entity, &mut entry, at, input).await;
        if preemption && result.is_ok() {
            self.metrics.jobs.preempted(&key, &entity.namespace);
        }
        if let Some(job) = &entry.object {
            let state = job.status.as_ref().and_then(|status| status.state);
            self.metrics
                .jobs
                .observe_state(&key, &entity.namespace, job.spec.queue_name(), state);
        }
        if result.as_ref().is_err_and(PlannerError::is_conflict) {
            // Another writer's state or object is newer than ours: read both
            // again (the object from the API, not the message's copy) when
            // the message is handled again.
            entry.loaded = false;
            entry.object = None;
            entry.reread_object = true;
        }
        let finished_or_gone = entry.object.as_ref().is_none_or(|job| {
            job.status
                .as_ref()
                .and_then(|status| status.state)
                .is_some_and(|state| state.is_terminal())
        });
        entry.finished_at = finished_or_gone.then(Instant::now);
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.metrics.reconciles.with_label_values(&[outcome]).inc();
        self.metrics
            .reconcile_seconds
            .with_label_values(&[outcome])
            .observe(started.elapsed().as_secs_f64());
        result
    }

    async fn apply(
        self: &Arc<Self>,
        key: &str,
        entity: &EntityRef,
        entry: &mut Entry,
        at: DateTime<Utc>,
        input: Input,
    ) -> Result<(), PlannerError> {
        match input {
            Input::Object(change) if change.change == Change::Deleted => {
                let last_state = entry
                    .object
                    .as_ref()
                    .or(Some(&change.object))
                    .and_then(|j| j.status.as_ref())
                    .and_then(|s| s.state);
                return self.finalized(key, entity, entry, last_state).await;
            }
            Input::Object(change) => {
                let incoming = change.object;
                let newer = match (
                    entry.object.as_ref().and_then(resource_version),
                    resource_version(&incoming),
                ) {
                    (Some(known), Some(seen)) => seen >= known,
                    _ => true,
                };
                if newer {
                    entry.object = Some(incoming);
                }
            }
            Input::Observe(observation) => {
                if let Observation::Job(job) = observation.as_ref()
                    && job.change == Change::Deleted
                {
                    // Whoever deleted it, a Job asked for again must be created again.
                    entry.applied = AppliedObjects::default();
                }
                entry
                    .observed_events
                    .extend(planner_core::checkpoint_events(&observation));
                planner_core::observe(&mut entry.state, at, *observation);
                entry.observed_unsaved = true;
            }
            Input::Reconcile => entry.status_deferred = false,
        }
        // Taken out (not copied) while the core decides from it and its
        // decisions are carried out; put back unless a status write stored a newer one.
        let Some(job) = entry.object.take() else {
            // Reports about a TrainingJob that no longer exists (or not yet): nothing to do.
            return Ok(());
        };
        if job.metadata.deletion_timestamp.is_some() {
            self.fence()?;
            let finalize = self.writer.finalize(&job).await;
            let last_state = job.status.as_ref().and_then(|s| s.state);
            entry.object = Some(job);
            finalize?;
            return self.finalized(key, entity, entry, last_state).await;
        }
        match self.reconcile(key, entity, entry, &job).await {
            // Deleted meanwhile (a stale copy, or a retry that outlived the
            // object): its deletion event finalizes it, and the entry is
            // released like a finished job's.
            Err(PlannerError::TrainingJobGone { .. }) => {
                entry.object = None;
                Ok(())
            }
            reconciled => {
                entry.object.get_or_insert(job);
                reconciled
            }
        }
    }

    /// Decides from `job` and the state, carries the decisions out and saves the state.
    async fn reconcile(
        self: &Arc<Self>,
        key: &str,
        entity: &EntityRef,
        entry: &mut Entry,
        job: &TrainingJob,
    ) -> Result<(), PlannerError> {
        self.fence()?;
        if let Some(stored) = self.writer.ensure_finalizer(job).await? {
            entry.object = Some(stored);
        }
        let mut actions = std::mem::take(&mut entry.observed_events);
        actions.extend(planner_core::decide(
            job,
            &entry.state,
            Utc::now(),
            &self.config,
        ));
        self.carry_out(entity, entry, job, actions).await?;
        if entry.observed_unsaved {
            let bytes = StateStore::encode(key, &entry.state)?;
            let print = fingerprint(&[&bytes]);
            if entry.saved != Some(print) {
                self.fence()?;
                let put = self.store.put(key, bytes.clone(), entry.revision).await;
                entry.revision = match put {
                    Err(PlannerError::StateConflict(_))
                        if entry.revision == 0 && untouched(job) =>
                    {
                        // State left by an earlier TrainingJob of this name that
                        // was never finalized: this one was not reconciled before,
                        // so that state is not its own.
                        let (_, revision) = self.store.load(key).await?;
                        self.store.put(key, bytes, revision).await?
                    }
                    put => put?,
                };
                entry.saved = Some(print);
            }
            entry.observed_unsaved = false;
        }
        Ok(())
    }

    async fn finalized(
        &self,
        key: &str,
        entity: &EntityRef,
        entry: &mut Entry,
        last_state: Option<trainyard_api::TrainingJobState>,
    ) -> Result<(), PlannerError> {
        let envelope = self
            .publisher
            .envelope(entity.clone(), TrainingJobFinalized { last_state });
        let dedup = format!("finalized:{}:{}", entity.key(), entity.uid);
        self.fence()?;
        self.publisher.publish_with_id(envelope, &dedup).await?;
        self.store.delete(key).await?;
        self.metrics.jobs.forget(key);
        entry.object = None;
        entry.state = PlannerJobState::default();
        entry.observed_unsaved = false;
        self.forget(key);
        tracing::info!(job = %entity.key(), "finalized");
        Ok(())
    }

    async fn carry_out(
        self: &Arc<Self>,
        entity: &EntityRef,
        entry: &mut Entry,
        job: &TrainingJob,
        actions: Vec<PlannerAction>,
    ) -> Result<(), PlannerError> {
        let namespace = job.namespace().unwrap_or_default();
        for action in actions {
            self.fence()?;
            let mut label = match &action {
                PlannerAction::ApplyObjects(_) => "apply",
                PlannerAction::DeleteJob { .. } => "delete_job",
                PlannerAction::UngateWorker { .. } => "ungate",
                PlannerAction::RecreateAfter { .. } | PlannerAction::RecheckAfter { .. } => "timer",
                PlannerAction::SendCommand { .. } => "command",
                PlannerAction::RecordEvent { .. } => "event",
                PlannerAction::PublishTransition { .. } => "transition",
                PlannerAction::UpdateStatus(_) => "status",
                PlannerAction::SuspendJob { .. } => "suspend_idle",
            };
            match action {
                PlannerAction::ApplyObjects(objects) => {
                    let prints = objects_fingerprints(&objects)?;
                    let applied = entry.applied;
                    if applied == prints {
                        label = "apply_unchanged";
                    } else {
                        let changes = ObjectChanges {
                            checkpoint_claim: applied.checkpoint_claim != prints.checkpoint_claim,
                            config_map: applied.config_map != prints.config_map,
                            service: applied.service != prints.service,
                            job: applied.job != prints.job,
                            worker_credentials: applied.worker_credentials
                                != prints.worker_credentials,
                        };
                        self.writer.apply(&namespace, &objects, changes).await?;
                        entry.applied = prints;
                    }
                }
                PlannerAction::DeleteJob { name } => {
                    entry.applied = AppliedObjects::default();
                    entry.ungated.clear();
                    self.writer.delete_job(&namespace, &name).await?
                }
                PlannerAction::UngateWorker { pod_name, node } => {
                    // The pod stays gated in the state until its next event.
                    if entry.ungated.contains(&pod_name) {
                        label = "ungate_unchanged";
                    } else {
                        self.writer
                            .ungate_worker(&namespace, &pod_name, node.as_deref())
                            .await?;
                        entry.ungated.insert(pod_name);
                    }
                }
                PlannerAction::RecreateAfter { delay, .. }
                | PlannerAction::RecheckAfter { delay, .. } => self.schedule(entity.clone(), delay),
                PlannerAction::SendCommand { command, dedup_key } => {
                    self.send_command(entity, command, &dedup_key).await?
                }
                PlannerAction::RecordEvent {
                    event_type,
                    reason,
                    message,
                } => {
                    let warning = matches!(event_type, EventType::Warning);
                    self.writer.record_event(job, warning, reason, &message);
                }
                PlannerAction::PublishTransition {
                    transition,
                    dedup_key,
                } => {
                    // Counted once published: a failed publish is retried with the message.
                    self.publisher
                        .publish_with_id(
                            self.publisher
                                .envelope(entity.clone(), (*transition).clone()),
                            &dedup_key,
                        )
                        .await?;
                    self.metrics
                        .jobs
                        .transitioned(&entity.key(), &namespace, &transition);
                }
                PlannerAction::SuspendJob { reason } => {
                    tracing::info!(job = %entity.key(), %reason, "suspending idle job");
                    entry.object = Some(self.writer.suspend(job).await?);
                }
                PlannerAction::UpdateStatus(status) => {
                    let interval = Duration::from_millis(self.config.min_status_interval_ms);
                    let wait = entry
                        .status_written_at
                        .map_or(Duration::ZERO, |at| interval.saturating_sub(at.elapsed()));
                    let urgent = job.status.as_ref().is_none_or(|previous| {
                        planner_core::changes_state_or_conditions(previous, &status)
                    });
                    if wait.is_zero() || urgent {
                        let stored = self.writer.write_status(job, &status).await?;
                        entry.object = Some(stored);
                        entry.status_written_at = Some(Instant::now());
                    } else {
                        label = "status_deferred";
                        if !entry.status_deferred {
                            entry.status_deferred = true;
                            self.schedule(entity.clone(), wait);
                        }
                    }
                }
            }
            self.metrics.actions.with_label_values(&[label]).inc();
        }
        Ok(())
    }

    /// Publishes a command to the job's workers; each kind is its own payload type.
    async fn send_command(
        &self,
        entity: &EntityRef,
        command: PlannerCommand,
        dedup_key: &str,
    ) -> Result<(), PlannerError> {
        match command {
            PlannerCommand::Stop(stop) => {
                let envelope = self.publisher.envelope(entity.clone(), stop);
                self.publisher.publish_with_id(envelope, dedup_key).await?
            }
            PlannerCommand::CheckpointNow(request) => {
                let envelope = self.publisher.envelope(entity.clone(), request);
                self.publisher.publish_with_id(envelope, dedup_key).await?
            }
            PlannerCommand::CheckpointInterval(interval) => {
                let envelope = self.publisher.envelope(entity.clone(), interval);
                self.publisher.publish_with_id(envelope, dedup_key).await?
            }
        };
        Ok(())
    }

    /// Decides again for `entity` after `delay` (restart backoff, deadlines,
    /// deferred status writes).
    /// A job has at most one timer, the earliest asked for: a later one is
    /// not needed, as the reconcile decides again and asks for what is still
    /// ahead.
    fn schedule(self: &Arc<Self>, entity: EntityRef, delay: Duration) {
        let due = tokio::time::Instant::now() + delay;
        let key = entity.key();
        {
            let mut timers = self.timers_locked();
            if timers.get(&key).is_some_and(|earlier| *earlier <= due) {
                return;
            }
            timers.insert(key.clone(), due);
            self.metrics.timers.set(timers.len() as i64);
        }
        let planner = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = planner.shutdown.cancelled() => {}
                _ = tokio::time::sleep_until(due) => {
                    {
                        let mut timers = planner.timers_locked();
                        if timers.get(&key) == Some(&due) {
                            timers.remove(&key);
                        }
                        planner.metrics.timers.set(timers.len() as i64);
                    }
                    // Boxed: inline, the reconcile's future would size every
                    // sleeping timer task (thousands in a burst) like a reconcile.
                    let reconcile = Box::pin(planner.handle_input(&entity, Utc::now(), Input::Reconcile));
                    if let Err(err) = reconcile.await {
                        tracing::warn!(job = %entity.key(), error = %err, "timed reconcile failed");
                    }
                }
            }
        });
    }

    /// Checks a submission's tenancy and spec, creates or updates the
    /// TrainingJob, and tells the submitter on its result subject. A rejection
    /// is also dead-lettered with its category.
    async fn submit(
        &self,
        entity: &EntityRef,
        message: &Incoming,
        delivery: &Delivery,
    ) -> Result<(), HandleError> {
        let subject = trainyard_contracts::subject::parse(&delivery.subject);
        let checked = planner_core::check_submission(
            subject.as_ref(),
            entity,
            &message.raw_payload(),
            &self.config.submit_namespaces,
        );
        let answer = format!("submit-result:{}", message.header.id);
        let accepted = match checked {
            Ok(accepted) => accepted,
            Err(rejection) => return self.reject_submission(entity, &answer, rejection).await,
        };
        let queue = self
            .writer
            .get_queue(accepted.spec.queue_name())
            .await
            .map_err(HandleError::from)?;
        if let Err(rejection) = planner_core::check_pod_policy(&accepted, queue.as_ref()) {
            return self.reject_submission(entity, &answer, rejection).await;
        }
        let labels = self
            .writer
            .training_job_labels(&accepted.namespace, &accepted.name)
            .await
            .map_err(HandleError::from)?;
        if let Some(labels) = &labels
            && let Err(rejection) = planner_core::check_overwrite(&accepted, labels)
        {
            return self.reject_submission(entity, &answer, rejection).await;
        }
        self.fence().map_err(HandleError::from)?;
        self.writer
            .submit(&accepted, labels.is_some())
            .await
            .map_err(HandleError::from)?;
        self.submission_result(
            entity,
            &answer,
            SubmissionResult {
                accepted: true,
                category: None,
                errors: Vec::new(),
            },
        )
        .await
    }

    async fn reject_submission(
        &self,
        entity: &EntityRef,
        answer: &str,
        rejection: planner_core::Rejection,
    ) -> Result<(), HandleError> {
        tracing::info!(job = %entity.key(), category = rejection.category, "submission rejected");
        self.submission_result(entity, answer, rejection.result())
            .await?;
        Err(HandleError::Reject {
            category: rejection.category,
            reason: rejection.reason(),
        })
    }

    /// Publishes the answer on the submission's own result subject; the id
    /// derives from the submission, so a redelivery answers once.
    async fn submission_result(
        &self,
        entity: &EntityRef,
        answer: &str,
        result: SubmissionResult,
    ) -> Result<(), HandleError> {
        self.fence().map_err(HandleError::from)?;
        let envelope = self
            .publisher
            .envelope(EntityRef::new(&entity.namespace, &entity.name, ""), result);
        self.publisher
            .publish_with_id(envelope, answer)
            .await
            .map(|_| ())
            .map_err(|err| HandleError::Retry(err.to_string()))
    }
}

impl Planner {
    /// Creates the trial the tuner asked for, from the Sweep's template.
    async fn trial(&self, sweep: &EntityRef, request: TrialRequested) -> Result<(), HandleError> {
        let retry = HandleError::from;
        let Some(object) = self
            .writer
            .get_sweep(&sweep.namespace, &sweep.name)
            .await
            .map_err(retry)?
        else {
            tracing::info!(sweep = %sweep.key(), trial = %request.trial_name, "sweep is gone; trial not created");
            return Ok(());
        };
        let spec = planner_core::trial_spec(
            &object.spec.trial_template,
            &request.parameters,
            request.tracking.as_ref(),
        )
        .map_err(|err| HandleError::Reject {
            category: "invalid_trial",
            reason: format!("trial {}: {err}", request.trial_name),
        })?;
        self.fence().map_err(retry)?;
        self.writer
            .apply_trial(&object, &request.trial_name, request.trial_index, spec)
            .await
            .map_err(retry)
    }

    /// Writes the tuner's progress into the Sweep's status.
    async fn sweep_progress(
        &self,
        sweep: &EntityRef,
        progress: SweepProgressed,
    ) -> Result<(), HandleError> {
        let retry = HandleError::from;
        let Some(object) = self
            .writer
            .get_sweep(&sweep.namespace, &sweep.name)
            .await
            .map_err(retry)?
        else {
            return Ok(());
        };
        let now = api_now();
        let status = planner_core::sweep_status(
            &progress,
            object.status.as_ref(),
            object.metadata.generation,
            now,
        );
        self.fence().map_err(retry)?;
        self.writer
            .write_sweep_status(&object, &status)
            .await
            .map_err(retry)
    }

    /// Writes the gpu-allocator's report into the TrainingQueue's status.
    async fn queue_status(
        &self,
        queue: &EntityRef,
        report: QueueStatusReported,
    ) -> Result<(), HandleError> {
        let retry = HandleError::from;
        let Some(object) = self.writer.get_queue(&queue.name).await.map_err(retry)? else {
            tracing::debug!(queue = %queue.name, "queue is gone; status not written");
            return Ok(());
        };
        let now = api_now();
        let status = planner_core::queue_status(
            &report,
            object.status.as_ref(),
            object.metadata.generation,
            now,
        );
        if object.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.fence().map_err(retry)?;
        self.writer
            .write_queue_status(&queue.name, &status)
            .await
            .map_err(retry)
    }
}

impl Planner {
    /// Writes the cost-optimizer's budget report into the TrainingQueue's
    /// status (the rest of the status as it is); an unchanged one is not written.
    async fn queue_budget(
        &self,
        queue: &EntityRef,
        report: BudgetStatusReported,
    ) -> Result<(), HandleError> {
        let retry = |err: PlannerError| HandleError::Retry(err.to_string());
        let Some(object) = self.writer.get_queue(&queue.name).await.map_err(retry)? else {
            tracing::debug!(queue = %queue.name, "queue is gone; budget not written");
            return Ok(());
        };
        let status = planner_core::budget_status(
            &queue.name,
            &report,
            object.spec.budget.as_ref(),
            object.status.as_ref(),
        );
        if object.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.fence().map_err(retry)?;
        self.writer
            .write_queue_status(&queue.name, &status)
            .await
            .map_err(retry)
    }
}

/// Now, as a status condition's transition time.
fn api_now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

/// Routes each message type the planner reads to its effect.
fn input_of(message: &Incoming) -> Result<Option<Input>, HandleError> {
    let observation = match message.header.message_type.as_str() {
        TrainingJobChanged::TYPE => return Ok(Some(Input::Object(Box::new(message.payload()?)))),
        JobObserved::TYPE => Observation::Job(message.payload()?),
        PodObserved::TYPE => Observation::Pod(message.payload()?),
        JobEventObserved::TYPE => Observation::JobEvent(message.payload()?),
        ProgressReported::TYPE => Observation::Progress(message.payload()?),
        CheckpointReported::TYPE => Observation::Checkpoint(message.payload()?),
        AdmissionDecided::TYPE => Observation::Admission(message.payload()?),
        PendingExplained::TYPE => Observation::Pending(message.payload()?),
        PreemptionDecided::TYPE => Observation::Preemption(message.payload()?),
        ResumePointChosen::TYPE => Observation::ResumePoint(message.payload()?),
        CheckpointVerified::TYPE => Observation::CheckpointVerified(message.payload()?),
        CheckpointIntervalAdvised::TYPE => Observation::IntervalAdvised(message.payload()?),
        ModelRegistered::TYPE => Observation::ModelRegistered(message.payload()?),
        CapacityChosen::TYPE => Observation::Capacity(message.payload()?),
        CostRecorded::TYPE => Observation::Cost(message.payload()?),
        IdleSuspendRequested::TYPE => Observation::IdleSuspend(message.payload()?),
        _ => return Ok(None),
    };
    Ok(Some(Input::Observe(Box::new(observation))))
}

/// The planner as a consumer of every stream it reads.
pub struct PlannerHandler(pub Arc<Planner>);

impl Handler for PlannerHandler {
    fn lanes(&self) -> usize {
        self.0.config.parallel_jobs
    }

    async fn handle(&self, message: Incoming, delivery: Delivery) -> Result<(), HandleError> {
        let entity = message.header.entity.clone();
        if message.is::<TrainingJobSubmitted>() {
            return self.0.submit(&entity, &message, &delivery).await;
        }
        if message.is::<TrialRequested>() {
            return self.0.trial(&entity, message.payload()?).await;
        }
        if message.is::<SweepProgressed>() {
            return self.0.sweep_progress(&entity, message.payload()?).await;
        }
        if message.is::<QueueStatusReported>() {
            return self.0.queue_status(&entity, message.payload()?).await;
        }
        if message.is::<BudgetStatusReported>() {
            return self.0.queue_budget(&entity, message.payload()?).await;
        }
        if message.is::<TrialStopped>() {
            // The tuner names the Sweep; the stop is about one of its trials.
            let stop: TrialStopped = message.payload()?;
            let trial = EntityRef::new(&entity.namespace, &stop.trial_name, "");
            return self
                .0
                .handle_input(
                    &trial,
                    message.header.time,
                    Input::Observe(Box::new(Observation::TrialStopped(stop))),
                )
                .await
                .map_err(HandleError::from);
        }
        let Some(input) = input_of(&message)? else {
            tracing::debug!(message_type = %message.header.message_type, "not for the planner");
            return Ok(());
        };
        self.0
            .handle_input(&entity, message.header.time, input)
            .await
            .map_err(HandleError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn training_job(status: bool, finalizer: bool) -> TrainingJob {
        let mut job: TrainingJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "trainyard.dev/v1",
            "kind": "TrainingJob",
            "metadata": {"name": "mnist", "namespace": "ml", "uid": "u1"},
            "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": 1},
        }))
        .expect("a TrainingJob");
        if status {
            job.status = Some(Default::default());
        }
        if finalizer {
            job.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        }
        job
    }

    /// Only a job no planner has reconciled skips reading the stored state.
    #[test]
    fn a_job_with_a_status_or_the_finalizer_has_been_reconciled() {
        assert!(untouched(&training_job(false, false)));
        assert!(!untouched(&training_job(true, false)));
        assert!(!untouched(&training_job(false, true)));
        assert!(!untouched(&training_job(true, true)));
    }
}
