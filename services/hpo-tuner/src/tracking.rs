//! Experiment tracking in MLflow: one experiment per Sweep (`<namespace>/<name>`),
//! one run per trial with its parameters, tags, metrics by epoch and final status.
//!
//! Tracking never blocks a sweep: the tuner hands commands to a bounded queue
//! and one background task carries them out with retries. A command that still
//! fails is logged and counted (`trainyard_tuner_mlflow_errors_total`), and the
//! queue drops commands (counted as operation `queue_full`) rather than wait.

use std::collections::{BTreeMap, HashMap};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::TunerMetrics;
use crate::mlflow::{Batch, Metric, MlflowClient, MlflowError, RunStatus, filter_literal};

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
}

/// The Sweep a command is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl SweepInfo {
    /// The experiment name: `<namespace>/<name>`.
    pub fn experiment_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
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
}

impl TrackingCommand {
    fn operation(&self) -> &'static str {
        match self {
            TrackingCommand::SweepCreated { .. } => "sweep_created",
            TrackingCommand::TrialRequested { .. } => "trial_requested",
            TrackingCommand::TrialMetrics { .. } => "trial_metrics",
            TrackingCommand::TrialEnded { .. } => "trial_ended",
        }
    }
}

/// The tuner's end of the queue.
#[derive(Clone)]
pub struct TrackerHandle {
    sender: mpsc::Sender<TrackingCommand>,
    metrics: TunerMetrics,
}

impl TrackerHandle {
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

/// Carries out tracking commands against one MLflow server, in order.
pub struct Tracker {
    client: MlflowClient,
    metrics: TunerMetrics,
    /// Experiment name → id.
    experiments: HashMap<String, String>,
    /// (sweep uid or experiment name, trial name) → run id.
    runs: HashMap<(String, String), String>,
}

/// Creates the tracker and its queue (`capacity` commands).
pub fn tracker(
    client: MlflowClient,
    metrics: TunerMetrics,
    capacity: usize,
) -> (TrackerHandle, Tracker, mpsc::Receiver<TrackingCommand>) {
    let (sender, receiver) = mpsc::channel(capacity.max(1));
    (
        TrackerHandle {
            sender,
            metrics: metrics.clone(),
        },
        Tracker {
            client,
            metrics,
            experiments: HashMap::new(),
            runs: HashMap::new(),
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
                self.experiment(&sweep).await?;
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
                self.on_run(&sweep, &trial, self.client.log_batch(&run, batch).await)?;
            }
            TrackingCommand::TrialEnded {
                sweep,
                trial,
                status,
                at_ms,
            } => {
                let run = self.run_id(&sweep, &trial, at_ms).await?;
                let tags = uid_tag(&trial);
                if !tags.is_empty() {
                    let batch = Batch {
                        tags,
                        ..Batch::default()
                    };
                    let logged = self.client.log_batch(&run, batch).await;
                    self.on_run(&sweep, &trial, logged)?;
                }
                let updated = self.client.update_run(&run, status, Some(at_ms)).await;
                self.on_run(&sweep, &trial, updated)?;
            }
        }
        Ok(())
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

    async fn experiment(&mut self, sweep: &SweepInfo) -> Result<String, MlflowError> {
        let name = sweep.experiment_name();
        if let Some(id) = self.experiments.get(&name) {
            return Ok(id.clone());
        }
        let tags = vec![
            (tags::NAMESPACE.to_string(), sweep.namespace.clone()),
            (tags::NAME.to_string(), sweep.name.clone()),
            (tags::SWEEP_UID.to_string(), sweep.uid.clone()),
        ];
        let id = self.client.get_or_create_experiment(&name, &tags).await?;
        self.experiments.insert(name, id.clone());
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
        let experiment = self.experiment(sweep).await?;
        let filter = format!(
            "tags.`{}` = {} and tags.`{}` = {}",
            tags::NAME,
            filter_literal(&trial.name),
            tags::SWEEP_UID,
            filter_literal(&sweep.uid)
        );
        let found = match self.client.search_runs(&experiment, &filter).await {
            Ok(runs) => runs.into_iter().next().map(|r| r.run_id),
            Err(err) if err.error_code() == Some("RESOURCE_DOES_NOT_EXIST") => {
                // The experiment was removed under us: look it up again next time.
                self.experiments.remove(&sweep.experiment_name());
                return Err(err);
            }
            Err(err) => return Err(err),
        };
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
                self.client
                    .create_run(&experiment, &trial.name, at_ms, &run_tags)
                    .await?
            }
        };
        // Params are immutable in MLflow and identical on every replay, so logging
        // them again (after a restart) is accepted.
        let batch = Batch {
            params: trial
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..Batch::default()
        };
        self.client.log_batch(&id, batch).await?;
        self.runs.insert(key, id.clone());
        Ok(id)
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
