//! Experiment tracking in MLflow: one experiment per Sweep (`<namespace>/<name>`),
//! one run per trial with its parameters, tags, metrics by epoch and final status.
//! Standalone TrainingJobs (not trials of a sweep) get one run each, named
//! `<namespace>/<name>`, in the experiment the `mlflow_standalone_experiment`
//! template names (by default the namespace).
//!
//! Tracking never blocks a sweep: the tuner hands commands to a bounded queue
//! and one background task carries them out with retries. A command that still
//! fails is logged and counted (`trainyard_tuner_mlflow_errors_total`), and the
//! queue drops commands (counted as operation `queue_full`) rather than wait.

use std::collections::{BTreeMap, HashMap};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use trainyard_api::TrainingJobState;
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::TrialTracking;
use trainyard_contracts::object_key;

use crate::metrics::TunerMetrics;
use crate::routing::TrialInput;
use trainyard_mlflow::{
    Batch, Metric, MlflowClient, MlflowError, MlflowServers, RunStatus, ServerChoice,
    filter_literal,
};

/// Tag keys the tuner sets on experiments and runs.
pub mod tags {
    pub const NAMESPACE: &str = "trainyard.namespace";
    /// The trial's TrainingJob name on a run; the Sweep's name on an experiment.
    pub const NAME: &str = "trainyard.name";
    /// The trial TrainingJob's uid (once a message about it carried one).
    pub const UID: &str = "trainyard.uid";
    pub const SWEEP: &str = "trainyard.sweep";
    pub const SWEEP_UID: &str = "trainyard.sweep_uid";
    pub const TRIAL_INDEX: &str = "trainyard.trial_index";
    /// `TrainingJob` on the runs of standalone jobs.
    pub const KIND: &str = "trainyard.kind";
}

/// The default `mlflow_standalone_experiment` template: one experiment per namespace.
pub const DEFAULT_STANDALONE_EXPERIMENT: &str = "{namespace}";

/// The experiment name a `mlflow_standalone_experiment` template gives for
/// `namespace`: every `{namespace}` replaced, surrounding blanks trimmed.
pub fn standalone_experiment_name(template: &str, namespace: &str) -> String {
    template
        .replace("{namespace}", namespace)
        .trim()
        .to_string()
}

/// The Sweep a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The trial template's `monitoring.mlflowTrackingUri`: where the Sweep
    /// is recorded when the allow-list admits it.
    pub tracking_uri: Option<String>,
}

impl SweepInfo {
    /// The Sweep `sweep` whose trial template names `tracking_uri`.
    pub fn of(sweep: &EntityRef, tracking_uri: Option<&str>) -> Self {
        Self {
            namespace: sweep.namespace.clone(),
            name: sweep.name.clone(),
            uid: sweep.uid.clone(),
            tracking_uri: tracking_uri.map(str::to_string),
        }
    }

    /// The experiment name: `<namespace>/<name>`.
    pub fn experiment_name(&self) -> String {
        object_key(&self.namespace, &self.name)
    }

    /// Where the Sweep is recorded among `servers`.
    pub fn server(&self, servers: &MlflowServers) -> ServerChoice {
        servers.choose(self.tracking_uri.as_deref())
    }
}

/// The trial a command is about; enough to create its run from scratch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialInfo {
    pub name: String,
    pub index: u32,
    /// Parameter values as text.
    pub params: BTreeMap<String, String>,
    /// The TrainingJob's uid, empty until a message about the job carried it.
    pub uid: String,
}

/// A standalone TrainingJob a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    pub namespace: String,
    pub name: String,
    /// The TrainingJob's uid (never empty: jobs are only tracked by uid).
    pub uid: String,
    /// The experiment its run belongs to.
    pub experiment: String,
}

impl JobInfo {
    /// The run name: `<namespace>/<name>`.
    pub fn run_name(&self) -> String {
        object_key(&self.namespace, &self.name)
    }

    /// The tags that identify the job's run (and find it again after a restart).
    pub fn run_tags(&self) -> Vec<(String, String)> {
        vec![
            (tags::NAMESPACE.to_string(), self.namespace.clone()),
            (tags::NAME.to_string(), self.name.clone()),
            (tags::UID.to_string(), self.uid.clone()),
            (tags::KIND.to_string(), JOB_KIND.to_string()),
        ]
    }

    fn key(&self) -> (String, String, String) {
        (self.namespace.clone(), self.name.clone(), self.uid.clone())
    }
}

/// The `trainyard.kind` tag value of standalone job runs.
pub const JOB_KIND: &str = "TrainingJob";

/// What ends a standalone job's run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// The job completed or failed: the run gets this status.
    Ended(RunStatus),
    /// The job was deleted: a run still open gets `status` (`KILLED` unless the
    /// job had completed or failed), then the job is forgotten.
    Finalized { status: RunStatus },
}

/// The tracking command for one input about a standalone job, if any.
/// `start_on_progress`: whether a progress report may create the job's run
/// (not for jobs named like a trial, whose sweep may just have been deleted).
pub fn job_command(
    job: JobInfo,
    input: &TrialInput,
    at_ms: i64,
    start_on_progress: bool,
) -> Option<TrackingCommand> {
    Some(match input {
        TrialInput::Started => TrackingCommand::JobStarted { job, at_ms },
        TrialInput::Progress { epoch, metrics, .. } => TrackingCommand::JobMetrics {
            job,
            epoch: *epoch,
            metrics: metrics.clone(),
            at_ms,
            create: start_on_progress,
        },
        TrialInput::Completed => TrackingCommand::JobEnded {
            job,
            end: JobEnd::Ended(RunStatus::Finished),
            at_ms,
        },
        TrialInput::Failed { .. } => TrackingCommand::JobEnded {
            job,
            end: JobEnd::Ended(RunStatus::Failed),
            at_ms,
        },
        TrialInput::Finalized { last_state } => TrackingCommand::JobEnded {
            job,
            end: JobEnd::Finalized {
                status: match last_state {
                    // The transition may have been missed (or dropped from a full queue).
                    Some(TrainingJobState::Completed) => RunStatus::Finished,
                    Some(TrainingJobState::Failed) => RunStatus::Failed,
                    _ => RunStatus::Killed,
                },
            },
            at_ms,
        },
    })
}

/// What the tracker records.
#[derive(Debug, Clone, PartialEq)]
pub enum TrackingCommand {
    /// A Sweep was created: make sure its experiment exists.
    SweepCreated { sweep: SweepInfo },
    /// A trial was requested: create its run with params and tags.
    TrialRequested {
        sweep: SweepInfo,
        trial: TrialInfo,
        at_ms: i64,
    },
    /// Rank 0 of a trial reported metrics after `epoch` epochs.
    TrialMetrics {
        sweep: SweepInfo,
        trial: TrialInfo,
        epoch: u32,
        metrics: BTreeMap<String, f64>,
        at_ms: i64,
    },
    /// A trial ended.
    TrialEnded {
        sweep: SweepInfo,
        trial: TrialInfo,
        status: RunStatus,
        at_ms: i64,
    },
    /// A standalone job started running: create its run unless it has one.
    JobStarted { job: JobInfo, at_ms: i64 },
    /// Rank 0 of a standalone job reported metrics after `epoch` epochs; the
    /// run is created first when it has none and `create` is set.
    JobMetrics {
        job: JobInfo,
        epoch: u32,
        metrics: BTreeMap<String, f64>,
        at_ms: i64,
        create: bool,
    },
    /// A standalone job ended or was deleted; nothing happens when it has no run.
    JobEnded {
        job: JobInfo,
        end: JobEnd,
        at_ms: i64,
    },
}

impl TrackingCommand {
    fn operation(&self) -> &'static str {
        match self {
            TrackingCommand::SweepCreated { .. } => "sweep_created",
            TrackingCommand::TrialRequested { .. } => "trial_requested",
            TrackingCommand::TrialMetrics { .. } => "trial_metrics",
            TrackingCommand::TrialEnded { .. } => "trial_ended",
            TrackingCommand::JobStarted { .. } => "job_started",
            TrackingCommand::JobMetrics { .. } => "job_metrics",
            TrackingCommand::JobEnded { .. } => "job_ended",
        }
    }
}

/// The tuner's end of the queue.
#[derive(Clone)]
pub struct TrackerHandle {
    sender: mpsc::Sender<TrackingCommand>,
    metrics: TunerMetrics,
    /// The `mlflow_standalone_experiment` template; standalone jobs are not
    /// tracked when unset.
    standalone_experiment: Option<String>,
}

impl TrackerHandle {
    /// Tracks standalone TrainingJobs in the experiment `template` names
    /// (`{namespace}` replaced).
    pub fn with_standalone_jobs(mut self, template: impl Into<String>) -> Self {
        self.standalone_experiment = Some(template.into());
        self
    }

    /// Queues what `input` means for the standalone job `job` (see
    /// [`job_command`]). Jobs without a namespace, name or uid, and jobs whose
    /// experiment name would be empty, are not tracked.
    pub fn job(&self, job: &EntityRef, input: &TrialInput, at_ms: i64, start_on_progress: bool) {
        let Some(template) = &self.standalone_experiment else {
            return;
        };
        if job.namespace.is_empty() || job.name.is_empty() || job.uid.is_empty() {
            tracing::debug!(job = %job.key(), "standalone job without namespace, name or uid; not tracked");
            return;
        }
        let experiment = standalone_experiment_name(template, &job.namespace);
        if experiment.is_empty() {
            return;
        }
        let info = JobInfo {
            namespace: job.namespace.clone(),
            name: job.name.clone(),
            uid: job.uid.clone(),
            experiment,
        };
        if let Some(command) = job_command(info, input, at_ms, start_on_progress) {
            self.send(command);
        }
    }

    /// Queues a command; never waits. A full queue drops it (logged and counted).
    pub fn send(&self, command: TrackingCommand) {
        if let Err(err) = self.sender.try_send(command) {
            let reason = match err {
                mpsc::error::TrySendError::Full(_) => "queue_full",
                mpsc::error::TrySendError::Closed(_) => "queue_closed",
            };
            tracing::warn!(reason, "experiment tracking command dropped");
            self.metrics
                .mlflow_errors
                .with_label_values(&[reason])
                .inc();
        }
    }
}

/// Carries out tracking commands, in order: a Sweep's on the server it is
/// recorded on, standalone jobs' on the tuner's own.
pub struct Tracker {
    servers: MlflowServers,
    metrics: TunerMetrics,
    /// (server's API URL, experiment name) → id.
    experiments: HashMap<(String, String), String>,
    /// (sweep uid or experiment name, trial name) → run id.
    runs: HashMap<(String, String), String>,
    /// Standalone jobs (namespace, name, uid) → their run.
    jobs: HashMap<(String, String, String), JobRun>,
}

/// A standalone job's run as the tracker knows it.
#[derive(Debug, Clone)]
struct JobRun {
    id: String,
    /// Still `RUNNING` (or `SCHEDULED`) as far as the tracker knows.
    open: bool,
}

/// Creates the tracker and its queue (`capacity` commands).
pub fn tracker(
    servers: MlflowServers,
    metrics: TunerMetrics,
    capacity: usize,
) -> (TrackerHandle, Tracker, mpsc::Receiver<TrackingCommand>) {
    let (sender, receiver) = mpsc::channel(capacity.max(1));
    (
        TrackerHandle {
            sender,
            metrics: metrics.clone(),
            standalone_experiment: None,
        },
        Tracker {
            servers,
            metrics,
            experiments: HashMap::new(),
            runs: HashMap::new(),
            jobs: HashMap::new(),
        },
        receiver,
    )
}

impl Tracker {
    /// Runs until shutdown; then finishes what is queued already (each call's
    /// retries are cut short by the shutdown) and returns.
    pub async fn run(
        mut self,
        mut receiver: mpsc::Receiver<TrackingCommand>,
        shutdown: CancellationToken,
    ) {
        loop {
            let command = tokio::select! {
                command = receiver.recv() => command,
                _ = shutdown.cancelled() => break,
            };
            let Some(command) = command else { return };
            self.apply(command).await;
        }
        receiver.close();
        while let Ok(command) = receiver.try_recv() {
            self.apply(command).await;
        }
    }

    /// Carries out one command; failures are logged and counted, never returned.
    pub async fn apply(&mut self, command: TrackingCommand) {
        let operation = command.operation();
        if let Err(err) = self.try_apply(command).await {
            tracing::warn!(operation, error = %err, "experiment tracking failed; the sweep goes on");
            self.metrics
                .mlflow_errors
                .with_label_values(&[err.operation()])
                .inc();
        }
    }

    async fn try_apply(&mut self, command: TrackingCommand) -> Result<(), MlflowError> {
        match command {
            TrackingCommand::SweepCreated { sweep } => {
                let client = self.servers.client(&sweep.server(&self.servers))?;
                self.experiment(&client, &sweep).await?;
            }
            TrackingCommand::TrialRequested {
                sweep,
                trial,
                at_ms,
            } => {
                // Creating the run logs its params and tags.
                self.run_id(&sweep, &trial, at_ms).await?;
            }
            TrackingCommand::TrialMetrics {
                sweep,
                trial,
                epoch,
                metrics,
                at_ms,
            } => {
                let client = self.servers.client(&sweep.server(&self.servers))?;
                let run = self.run_id(&sweep, &trial, at_ms).await?;
                let batch = Batch {
                    metrics: metrics
                        .into_iter()
                        .map(|(key, value)| Metric {
                            key,
                            value,
                            timestamp_ms: at_ms,
                            step: i64::from(epoch),
                        })
                        .collect(),
                    params: Vec::new(),
                    tags: uid_tag(&trial),
                };
                self.on_run(&sweep, &trial, client.log_batch(&run, batch).await)?;
            }
            TrackingCommand::TrialEnded {
                sweep,
                trial,
                status,
                at_ms,
            } => {
                let client = self.servers.client(&sweep.server(&self.servers))?;
                let run = self.run_id(&sweep, &trial, at_ms).await?;
                let tags = uid_tag(&trial);
                if !tags.is_empty() {
                    let batch = Batch {
                        tags,
                        ..Batch::default()
                    };
                    let logged = client.log_batch(&run, batch).await;
                    self.on_run(&sweep, &trial, logged)?;
                }
                let updated = client.update_run(&run, status, Some(at_ms)).await;
                self.on_run(&sweep, &trial, updated)?;
            }
            TrackingCommand::JobStarted { job, at_ms } => {
                self.job_run(&job, at_ms, true).await?;
            }
            TrackingCommand::JobMetrics {
                job,
                epoch,
                metrics,
                at_ms,
                create,
            } => {
                let Some(run) = self.job_run(&job, at_ms, create).await? else {
                    return Ok(());
                };
                let batch = Batch {
                    metrics: metrics
                        .into_iter()
                        .map(|(key, value)| Metric {
                            key,
                            value,
                            timestamp_ms: at_ms,
                            step: i64::from(epoch),
                        })
                        .collect(),
                    ..Batch::default()
                };
                let logged = self
                    .servers
                    .default_client()
                    .log_batch(&run.id, batch)
                    .await;
                self.on_job_run(&job, logged)?;
            }
            TrackingCommand::JobEnded { job, end, at_ms } => {
                let finalized = matches!(end, JobEnd::Finalized { .. });
                let run = self.job_run(&job, at_ms, false).await;
                if finalized {
                    // The job is gone; nothing more will come for this uid.
                    self.jobs.remove(&job.key());
                }
                let Some(run) = run? else {
                    return Ok(());
                };
                // A closed run keeps its status and end time (a redelivered
                // completion or the later deletion does not move them).
                if !run.open {
                    return Ok(());
                }
                let status = match end {
                    JobEnd::Ended(status) | JobEnd::Finalized { status } => status,
                };
                let updated = self
                    .servers
                    .default_client()
                    .update_run(&run.id, status, Some(at_ms))
                    .await;
                self.on_job_run(&job, updated)?;
                if let Some(known) = self.jobs.get_mut(&job.key()) {
                    known.open = false;
                }
            }
        }
        Ok(())
    }

    /// Forgets a cached job run when the server no longer knows the run.
    fn on_job_run(
        &mut self,
        job: &JobInfo,
        result: Result<(), MlflowError>,
    ) -> Result<(), MlflowError> {
        if let Err(err) = &result
            && err.error_code() == Some("RESOURCE_DOES_NOT_EXIST")
        {
            self.jobs.remove(&job.key());
        }
        result
    }

    /// A standalone job's run: cached, else found by its tags (after a restart
    /// or on another replica), else created when `create` is set.
    async fn job_run(
        &mut self,
        job: &JobInfo,
        at_ms: i64,
        create: bool,
    ) -> Result<Option<JobRun>, MlflowError> {
        let key = job.key();
        if let Some(run) = self.jobs.get(&key) {
            return Ok(Some(run.clone()));
        }
        let experiment = if create {
            Some(self.named_experiment(&job.experiment, job).await?)
        } else {
            // Only look: a job that never ran leaves no experiment behind.
            self.existing_experiment(&job.experiment).await?
        };
        let Some(experiment) = experiment else {
            return Ok(None);
        };
        let filter = job
            .run_tags()
            .iter()
            .map(|(key, value)| format!("tags.`{key}` = {}", filter_literal(value)))
            .collect::<Vec<_>>()
            .join(" and ");
        let client = self.servers.default_client().clone();
        let found = match client.search_runs(&experiment, &filter).await {
            Ok(runs) => runs.into_iter().next(),
            Err(err) if err.error_code() == Some("RESOURCE_DOES_NOT_EXIST") => {
                self.experiments
                    .remove(&experiment_key(&client, &job.experiment));
                return Err(err);
            }
            Err(err) => return Err(err),
        };
        let run = match found {
            Some(info) => JobRun {
                open: matches!(info.status.as_str(), "RUNNING" | "SCHEDULED"),
                id: info.run_id,
            },
            None if create => JobRun {
                id: client
                    .create_run(&experiment, &job.run_name(), at_ms, &job.run_tags())
                    .await?,
                open: true,
            },
            None => return Ok(None),
        };
        self.jobs.insert(key, run.clone());
        Ok(Some(run))
    }

    /// The id of the experiment `name`, created (tagged with the job's namespace) when needed.
    async fn named_experiment(&mut self, name: &str, job: &JobInfo) -> Result<String, MlflowError> {
        let client = self.servers.default_client();
        let key = experiment_key(client, name);
        if let Some(id) = self.experiments.get(&key) {
            return Ok(id.clone());
        }
        let tags = vec![(tags::NAMESPACE.to_string(), job.namespace.clone())];
        let id = client.get_or_create_experiment(name, &tags).await?;
        self.experiments.insert(key, id.clone());
        Ok(id)
    }

    /// The id of the experiment `name` if it exists and is not in the trash.
    async fn existing_experiment(&mut self, name: &str) -> Result<Option<String>, MlflowError> {
        let client = self.servers.default_client();
        if let Some(id) = self.experiments.get(&experiment_key(client, name)) {
            return Ok(Some(id.clone()));
        }
        Ok(client
            .experiment_by_name(name)
            .await?
            .filter(|e| e.lifecycle_stage != "deleted")
            .map(|e| e.experiment_id))
    }

    /// Forgets a cached run id when the server no longer knows the run.
    fn on_run(
        &mut self,
        sweep: &SweepInfo,
        trial: &TrialInfo,
        result: Result<(), MlflowError>,
    ) -> Result<(), MlflowError> {
        if let Err(err) = &result
            && err.error_code() == Some("RESOURCE_DOES_NOT_EXIST")
        {
            self.runs.remove(&run_key(sweep, trial));
        }
        result
    }

    async fn experiment(
        &mut self,
        client: &MlflowClient,
        sweep: &SweepInfo,
    ) -> Result<String, MlflowError> {
        let name = sweep.experiment_name();
        let key = experiment_key(client, &name);
        if let Some(id) = self.experiments.get(&key) {
            return Ok(id.clone());
        }
        let id = client
            .get_or_create_experiment(&name, &experiment_tags(sweep))
            .await?;
        self.experiments.insert(key, id.clone());
        Ok(id)
    }

    /// The trial's run: cached, else found by its tags (after a restart), else created.
    async fn run_id(
        &mut self,
        sweep: &SweepInfo,
        trial: &TrialInfo,
        at_ms: i64,
    ) -> Result<String, MlflowError> {
        let key = run_key(sweep, trial);
        if let Some(id) = self.runs.get(&key) {
            return Ok(id.clone());
        }
        let client = self.servers.client(&sweep.server(&self.servers))?;
        let experiment = self.experiment(&client, sweep).await?;
        let id = match find_or_create_run(&client, &experiment, sweep, trial, at_ms).await {
            Ok(id) => id,
            Err(err) if err.error_code() == Some("RESOURCE_DOES_NOT_EXIST") => {
                // The experiment was removed under us: look it up again next time.
                self.experiments
                    .remove(&experiment_key(&client, &sweep.experiment_name()));
                return Err(err);
            }
            Err(err) => return Err(err),
        };
        self.runs.insert(key, id.clone());
        Ok(id)
    }
}

/// Experiments are cached per server: names repeat across servers.
fn experiment_key(client: &MlflowClient, name: &str) -> (String, String) {
    (client.api_url().to_string(), name.to_string())
}

fn experiment_tags(sweep: &SweepInfo) -> Vec<(String, String)> {
    vec![
        (tags::NAMESPACE.to_string(), sweep.namespace.clone()),
        (tags::NAME.to_string(), sweep.name.clone()),
        (tags::SWEEP_UID.to_string(), sweep.uid.clone()),
    ]
}

/// The trial's run in `experiment`: found by its name and sweep-uid tags, else
/// created with its tags; either way with its params logged (identical on
/// every replay, which MLflow accepts).
async fn find_or_create_run(
    client: &MlflowClient,
    experiment: &str,
    sweep: &SweepInfo,
    trial: &TrialInfo,
    at_ms: i64,
) -> Result<String, MlflowError> {
    let filter = format!(
        "tags.`{}` = {} and tags.`{}` = {}",
        tags::NAME,
        filter_literal(&trial.name),
        tags::SWEEP_UID,
        filter_literal(&sweep.uid)
    );
    let found = client
        .search_runs(experiment, &filter)
        .await?
        .into_iter()
        .next()
        .map(|r| r.run_id);
    let id = match found {
        Some(id) => id,
        None => {
            let mut run_tags = vec![
                (tags::NAMESPACE.to_string(), sweep.namespace.clone()),
                (tags::NAME.to_string(), trial.name.clone()),
                (tags::SWEEP.to_string(), sweep.name.clone()),
                (tags::SWEEP_UID.to_string(), sweep.uid.clone()),
                (tags::TRIAL_INDEX.to_string(), trial.index.to_string()),
            ];
            run_tags.extend(uid_tag(trial));
            client
                .create_run(experiment, &trial.name, at_ms, &run_tags)
                .await?
        }
    };
    let batch = Batch {
        params: trial
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Batch::default()
    };
    client.log_batch(&id, batch).await?;
    Ok(id)
}

/// Makes a trial's run before the trial is asked for, so the run id can
/// travel with the request to the trial's workers (`MLFLOW_RUN_ID`): MLflow
/// chooses run ids itself, so the run must exist first. The tracker finds
/// the same run by its tags later.
#[derive(Clone)]
pub struct TrialRuns {
    servers: MlflowServers,
}

impl TrialRuns {
    pub fn new(servers: MlflowServers) -> Self {
        Self { servers }
    }

    /// Where `sweep` is recorded.
    pub fn server(&self, sweep: &SweepInfo) -> ServerChoice {
        sweep.server(&self.servers)
    }

    /// The tuner's own server.
    pub fn default_uri(&self) -> &str {
        self.servers.default_uri()
    }

    /// The trial's run (found or created) with the server it is on, as the
    /// trial template names it (the tuner's own when the template names
    /// none, or a server the allow-list does not admit).
    pub async fn ensure(
        &self,
        sweep: &SweepInfo,
        trial: &TrialInfo,
        at_ms: i64,
    ) -> Result<TrialTracking, MlflowError> {
        let server = self.server(sweep);
        let client = self.servers.client(&server)?;
        let experiment = client
            .get_or_create_experiment(&sweep.experiment_name(), &experiment_tags(sweep))
            .await?;
        let run = find_or_create_run(&client, &experiment, sweep, trial, at_ms).await?;
        Ok(TrialTracking {
            mlflow_tracking_uri: server.uri(self.servers.default_uri()).to_string(),
            mlflow_run_id: run,
        })
    }
}

fn run_key(sweep: &SweepInfo, trial: &TrialInfo) -> (String, String) {
    let sweep_id = if sweep.uid.is_empty() {
        sweep.experiment_name()
    } else {
        sweep.uid.clone()
    };
    (sweep_id, trial.name.clone())
}

fn uid_tag(trial: &TrialInfo) -> Vec<(String, String)> {
    if trial.uid.is_empty() {
        Vec::new()
    } else {
        vec![(tags::UID.to_string(), trial.uid.clone())]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use trainyard_mlflow::{ClientSettings, RetryPolicy};

    fn job() -> JobInfo {
        JobInfo {
            namespace: "ml".into(),
            name: "bert".into(),
            uid: "u-1".into(),
            experiment: "ml".into(),
        }
    }

    fn handle() -> (TrackerHandle, mpsc::Receiver<TrackingCommand>) {
        let servers = MlflowServers::new(
            "http://127.0.0.1:9",
            &[],
            "hpo_tuner.mlflow_allowed_tracking_uris",
            ClientSettings {
                access: Default::default(),
                timeout: Duration::from_secs(1),
                retry: RetryPolicy::default(),
                shutdown: CancellationToken::new(),
            },
        )
        .expect("servers");
        let metrics = TunerMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let (handle, _tracker, receiver) = tracker(servers, metrics, 16);
        (handle, receiver)
    }

    #[test]
    fn standalone_experiment_names_come_from_the_template() {
        assert_eq!(
            standalone_experiment_name(DEFAULT_STANDALONE_EXPERIMENT, "ml"),
            "ml"
        );
        assert_eq!(
            standalone_experiment_name("jobs/{namespace}", "team-a"),
            "jobs/team-a"
        );
        assert_eq!(
            standalone_experiment_name("{namespace}-{namespace}", "a"),
            "a-a"
        );
        assert_eq!(
            standalone_experiment_name("all-jobs", "ml"),
            "all-jobs",
            "a fixed name puts every namespace in one experiment"
        );
        assert_eq!(standalone_experiment_name("  ", "ml"), "");
        assert_eq!(
            standalone_experiment_name(" {namespace} ", "ml"),
            "ml",
            "trimmed"
        );
    }

    #[test]
    fn job_runs_are_named_and_tagged_after_the_job() {
        let job = job();
        assert_eq!(job.run_name(), "ml/bert");
        let tags: BTreeMap<String, String> = job.run_tags().into_iter().collect();
        assert_eq!(
            tags,
            [
                ("trainyard.kind", "TrainingJob"),
                ("trainyard.name", "bert"),
                ("trainyard.namespace", "ml"),
                ("trainyard.uid", "u-1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        );
    }

    #[test]
    fn job_inputs_become_tracking_commands() {
        assert_eq!(
            job_command(job(), &TrialInput::Started, 5, true),
            Some(TrackingCommand::JobStarted {
                job: job(),
                at_ms: 5
            })
        );
        let progress = TrialInput::Progress {
            epoch: 2,
            step: 200,
            metrics: [("loss".to_string(), 0.5)].into(),
        };
        for create in [true, false] {
            assert_eq!(
                job_command(job(), &progress, 5, create),
                Some(TrackingCommand::JobMetrics {
                    job: job(),
                    epoch: 2,
                    metrics: [("loss".to_string(), 0.5)].into(),
                    at_ms: 5,
                    create,
                })
            );
        }
        let end = |input: TrialInput| match job_command(job(), &input, 5, true) {
            Some(TrackingCommand::JobEnded { end, .. }) => Some(end),
            _ => None,
        };
        assert_eq!(
            end(TrialInput::Completed),
            Some(JobEnd::Ended(RunStatus::Finished))
        );
        assert_eq!(
            end(TrialInput::Failed { reason: "x".into() }),
            Some(JobEnd::Ended(RunStatus::Failed))
        );
        for (last_state, status) in [
            (None, RunStatus::Killed),
            (Some(TrainingJobState::Running), RunStatus::Killed),
            (Some(TrainingJobState::Suspended), RunStatus::Killed),
            (Some(TrainingJobState::Completed), RunStatus::Finished),
            (Some(TrainingJobState::Failed), RunStatus::Failed),
        ] {
            assert_eq!(
                end(TrialInput::Finalized { last_state }),
                Some(JobEnd::Finalized { status }),
                "{last_state:?}"
            );
        }
    }

    #[test]
    fn standalone_jobs_are_queued_only_when_configured_and_identified() {
        let (plain, mut receiver) = handle();
        plain.job(
            &EntityRef::new("ml", "bert", "u-1"),
            &TrialInput::Started,
            1,
            true,
        );
        assert!(
            receiver.try_recv().is_err(),
            "not configured: nothing queued"
        );

        let (handle, mut receiver) = handle();
        let handle = handle.with_standalone_jobs("jobs-{namespace}");
        for unidentified in [
            EntityRef::new("ml", "bert", ""),
            EntityRef::new("", "bert", "u-1"),
            EntityRef::new("ml", "", "u-1"),
        ] {
            handle.job(&unidentified, &TrialInput::Started, 1, true);
        }
        assert!(receiver.try_recv().is_err(), "no uid, namespace or name");
        handle.job(
            &EntityRef::new("ml", "bert", "u-1"),
            &TrialInput::Started,
            7,
            true,
        );
        assert_eq!(
            receiver.try_recv().expect("queued"),
            TrackingCommand::JobStarted {
                job: JobInfo {
                    experiment: "jobs-ml".into(),
                    ..job()
                },
                at_ms: 7
            }
        );
    }
}
