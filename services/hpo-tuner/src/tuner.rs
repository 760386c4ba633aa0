//! The tuner's adapter: messages in, the sweep state machine's decisions out.
//!
//! One sweep's messages are handled one at a time (a lock per sweep; across
//! replicas, compare-and-set on the stored state). For each message:
//!
//! 1. read the sweep's state from the bucket (reusing the decoded copy when the
//!    revision is unchanged) and publish any messages a previous attempt decided
//!    but did not get acknowledged;
//! 2. feed the core its events and turn the decisions into messages with
//!    deterministic ids;
//! 3. store the new state together with those messages (the outbox), publish
//!    them, store the state again with the outbox emptied; then ack.
//!
//! A crash anywhere in there leaves either the old state (the message is
//! redelivered and decides the same thing again, JetStream drops the repeats) or
//! the new state with its outbox (which is published first on the next touch).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hpo_tuner_core::{StopReason, SweepDecision, SweepError, SweepEvent, TrialState};
use trainyard_api::Sweep;
use trainyard_contracts::decisions::{TrialRequested, TrialTracking};
use trainyard_contracts::{EntityRef, Header, Incoming, Payload};
use trainyard_runtime::{Delivery, HandleError, Handler, Publisher};

use crate::error::TunerError;
use crate::metrics::TunerMetrics;
use crate::routing::{self, Outgoing, OutgoingPayload, Route, TrialChange, TrialInput, TrialRef};
use crate::spec::{self, parameter_text};
use crate::store::{StateStore, SweepMetadata, SweepState};
use crate::tracking::{SweepInfo, TrackerHandle, TrackingCommand, TrialInfo, TrialRuns};
use trainyard_mlflow::{RunStatus, ServerChoice};

/// Deliveries of a trial's completion that wait for its final progress report
/// (progress and lifecycle travel on different streams, so after a backlog the
/// completion can overtake the last metrics). The runtime redelivers after 1 s,
/// then 2 s; from this delivery on the completion is taken as it is, with the
/// last objective seen.
pub const COMPLETION_WAIT_DELIVERIES: i64 = 3;

/// Fails with [`TunerError::AwaitingFinalReport`] while an active trial's
/// objective has not been seen at its last epoch.
fn await_final_report(state: &SweepState, trial_id: &str) -> Result<(), TunerError> {
    let Some(trial) = state.core.trial(trial_id) else {
        return Ok(());
    };
    let expected = state.trial_epochs(trial_id);
    let seen = trial.last_epoch;
    if trial.state.is_active() && seen.is_none_or(|epoch| epoch < expected) {
        return Err(TunerError::AwaitingFinalReport {
            trial: trial_id.to_string(),
            seen,
            expected,
        });
    }
    Ok(())
}

/// What one message asks of a sweep.
#[derive(Debug)]
enum Input {
    Applied(Box<Sweep>),
    Deleted,
    Trial { trial: TrialRef, input: TrialInput },
}

/// The cached state of one sweep, valid while the bucket's revision matches.
#[derive(Default)]
struct Cell {
    loaded: bool,
    revision: u64,
    /// What the bucket holds at `revision`.
    stored: Option<Bytes>,
    state: Option<SweepState>,
}

pub struct Tuner {
    publisher: Publisher,
    store: StateStore,
    metrics: TunerMetrics,
    tracker: Option<TrackerHandle>,
    /// Makes each trial's MLflow run before the trial is asked for.
    trial_runs: Option<TrialRuns>,
    cells: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Cell>>>>,
    /// Keys of sweeps that have state and have not finished.
    active: Mutex<HashSet<String>>,
}

impl Tuner {
    pub fn new(
        publisher: Publisher,
        store: StateStore,
        metrics: TunerMetrics,
        tracker: Option<TrackerHandle>,
    ) -> Self {
        Self {
            publisher,
            store,
            metrics,
            tracker,
            trial_runs: None,
            cells: Mutex::default(),
            active: Mutex::default(),
        }
    }

    /// Trial requests carry the MLflow run made for the trial.
    pub fn with_trial_runs(mut self, runs: TrialRuns) -> Self {
        self.trial_runs = Some(runs);
        self
    }

    /// The trial's run, made (or found) now; None when MLflow fails, logged
    /// and counted: the trial goes ahead without a run id rather than wait.
    async fn trial_run(
        &self,
        runs: &TrialRuns,
        sweep: &EntityRef,
        tracking_uri: Option<&str>,
        request: &TrialRequested,
        at_ms: i64,
    ) -> Option<TrialTracking> {
        let sweep_info = SweepInfo::of(sweep, tracking_uri);
        let trial = TrialInfo {
            name: request.trial_name.clone(),
            index: request.trial_index,
            params: request
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), parameter_text(v)))
                .collect(),
            uid: String::new(),
        };
        match runs.ensure(&sweep_info, &trial, at_ms).await {
            Ok(tracking) => Some(tracking),
            Err(err) => {
                tracing::warn!(sweep = %sweep.key(), trial = %request.trial_name, error = %err, "cannot make the trial's MLflow run; the trial is requested without it");
                self.metrics
                    .mlflow_errors
                    .with_label_values(&[err.operation()])
                    .inc();
                None
            }
        }
    }

    /// Why a new Sweep will not be recorded on the server its trial template
    /// names (logged and counted here, once per Sweep): a server the
    /// allow-list does not admit. None when it will be, or tracking is off.
    fn tracking_warning(&self, state: &SweepState) -> Option<String> {
        let runs = self.trial_runs.as_ref()?;
        let sweep = SweepInfo::of(&state.sweep, state.tracking_uri.as_deref());
        let ServerChoice::Refused { uri, reason } = runs.server(&sweep) else {
            return None;
        };
        tracing::warn!(sweep = %state.sweep.key(), %uri, %reason, "the Sweep's tracking server is not allowed; recording it on the tuner's own");
        self.metrics.mlflow_servers_refused.inc();
        Some(format!(
            "spec.trialTemplate.monitoring.mlflowTrackingUri: {reason}; the hpo-tuner records this Sweep's experiment and trial runs on its own MLflow server {}, and the trials' workers log to {uri} without the tuner's run",
            runs.default_uri()
        ))
    }

    fn cell(&self, key: &str) -> Arc<tokio::sync::Mutex<Cell>> {
        let mut cells = self
            .cells
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cells.entry(key.to_string()).or_default().clone()
    }

    fn forget(&self, key: &str) {
        let mut cells = self
            .cells
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cells.remove(key);
    }

    fn set_active(&self, key: &str, active: bool) {
        let mut set = self
            .active
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if active {
            set.insert(key.to_string());
        } else {
            set.remove(key);
        }
        self.metrics
            .sweeps_active
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
    }

    /// Loads every stored sweep once at start-up: publishes what a crashed
    /// predecessor left in an outbox and counts the active sweeps.
    pub async fn warm_up(&self) -> Result<usize, TunerError> {
        let keys = self.store.keys().await?;
        let mut loaded = 0;
        for key in keys {
            let cell = self.cell(&key);
            let mut cell = cell.lock().await;
            let running = match self.refresh(&key, &mut cell).await {
                Ok(()) => cell.state.as_ref().map(|state| !state.core.is_finished()),
                Err(err) => {
                    tracing::warn!(sweep = %key, error = %err, "cannot load sweep state at start-up");
                    None
                }
            };
            drop(cell);
            if let Some(running) = running {
                loaded += 1;
                self.set_active(&key, running);
            }
            if running != Some(true) {
                self.forget(&key);
            }
        }
        Ok(loaded)
    }

    /// Handles one message; `delivered` is its delivery count (1 the first time).
    pub async fn handle(&self, message: &Incoming, delivered: i64) -> Result<(), HandleError> {
        let (sweep, input) = match routing::route(message)? {
            Route::Ignore(why) => {
                tracing::debug!(message_type = %message.header.message_type, why, "ignored");
                return Ok(());
            }
            Route::Job { job, input } => {
                // Standalone jobs are only tracked: nothing to store or decide.
                self.track_job(&job, &input, &message.header, true);
                return Ok(());
            }
            Route::SweepApplied { sweep, object } => (sweep, Input::Applied(object)),
            Route::SweepDeleted { sweep } => (sweep, Input::Deleted),
            Route::Trial {
                sweep,
                trial,
                input,
            } => (sweep, Input::Trial { trial, input }),
        };
        self.process(&sweep, input, &message.header, delivered)
            .await
            .map_err(|err| {
                if matches!(err, TunerError::Conflict(_)) {
                    self.metrics.state_conflicts.inc();
                }
                if matches!(err, TunerError::AwaitingFinalReport { .. }) {
                    tracing::debug!(error = %err, "completion deferred");
                    return HandleError::from(err);
                }
                tracing::warn!(sweep = %sweep.key(), category = err.category(), error = %err, "message not handled");
                HandleError::from(err)
            })
    }

    async fn process(
        &self,
        sweep: &EntityRef,
        input: Input,
        header: &Header,
        delivered: i64,
    ) -> Result<(), TunerError> {
        let key = sweep.key();
        let cell = self.cell(&key);
        let mut guard = cell.lock().await;
        let result = self
            .process_locked(&key, sweep, input, header, delivered, &mut guard)
            .await;
        let untouched = matches!(result, Err(TunerError::AwaitingFinalReport { .. }));
        if result.is_err() && !untouched {
            // Re-read the bucket next time rather than trust a half-applied copy.
            guard.loaded = false;
            guard.state = None;
        }
        // Keep decoded state for running sweeps only; others are read again if needed.
        let keep = guard.loaded
            && guard
                .state
                .as_ref()
                .is_some_and(|state| !state.core.is_finished());
        drop(guard);
        if !keep {
            self.forget(&key);
        }
        result
    }

    /// Brings the cell up to date with the bucket and publishes a leftover outbox.
    async fn refresh(&self, key: &str, cell: &mut Cell) -> Result<(), TunerError> {
        let stored = self.store.read(key).await?;
        if !cell.loaded || cell.revision != stored.revision {
            cell.state = match &stored.value {
                Some(bytes) => Some(SweepState::decode(key, bytes)?),
                None => None,
            };
            cell.revision = stored.revision;
            cell.stored = stored.value;
            cell.loaded = true;
        }
        if let Some(state) = cell.state.as_mut()
            && !state.outbox.is_empty()
        {
            tracing::info!(sweep = %key, messages = state.outbox.len(), "publishing decisions left by an earlier attempt");
            self.publish(state).await?;
            state.outbox.clear();
            let bytes = state.encode()?;
            cell.revision = self.store.write(key, bytes.clone(), cell.revision).await?;
            cell.stored = Some(bytes);
        }
        Ok(())
    }

    async fn process_locked(
        &self,
        key: &str,
        sweep: &EntityRef,
        input: Input,
        header: &Header,
        delivered: i64,
        cell: &mut Cell,
    ) -> Result<(), TunerError> {
        self.refresh(key, cell).await?;
        let mut created = false;
        let mut delete = false;
        let mut trial_input = None;
        let events = match input {
            Input::Applied(object) => {
                let earlier = cell.state.as_ref().is_some_and(|s| {
                    !sweep.uid.is_empty() && !s.sweep.uid.is_empty() && s.sweep.uid != sweep.uid
                });
                if earlier {
                    tracing::warn!(sweep = %key, uid = %sweep.uid, "stored state belongs to an earlier Sweep of this name; starting over");
                    cell.state = None;
                }
                if cell.state.is_none() {
                    let mapped = spec::map_sweep(sweep, &object)?;
                    let epochs = object.spec.trial_template.epochs();
                    let mut state =
                        SweepState::new(sweep.clone(), mapped.core, mapped.codec, epochs);
                    state.tracking_uri = object
                        .spec
                        .trial_template
                        .monitoring
                        .as_ref()
                        .and_then(|m| m.mlflow_tracking_uri.clone());
                    state.tracking_warning = self.tracking_warning(&state);
                    cell.state = Some(state);
                    created = true;
                    tracing::info!(sweep = %key, uid = %sweep.uid, "sweep created");
                }
                // Labels and annotations may change while the sweep runs; the
                // next progress carries the current ones.
                if let Some(state) = cell.state.as_mut() {
                    state.metadata = SweepMetadata::of(&object);
                }
                vec![SweepEvent::Start]
            }
            Input::Deleted => {
                let Some(state) = &cell.state else {
                    return Ok(());
                };
                if !sweep.uid.is_empty()
                    && !state.sweep.uid.is_empty()
                    && state.sweep.uid != sweep.uid
                {
                    tracing::debug!(sweep = %key, "deletion of an earlier Sweep of this name; ignored");
                    return Ok(());
                }
                delete = true;
                vec![SweepEvent::Cancel]
            }
            Input::Trial { trial, input } => {
                let Some(state) = &cell.state else {
                    // Named like a trial, but there is no such sweep: a standalone
                    // job. Progress alone does not start its run: it may be a trial
                    // of a sweep that was just deleted, still reporting.
                    tracing::debug!(trial = %trial.name, "not a trial of a known sweep; tracked as a standalone job");
                    let job = EntityRef::new(sweep.namespace.clone(), trial.name, trial.uid);
                    self.track_job(&job, &input, header, false);
                    return Ok(());
                };
                if input == TrialInput::Completed && delivered < COMPLETION_WAIT_DELIVERIES {
                    await_final_report(state, &trial.name)?;
                }
                let events =
                    routing::events_for(&trial.name, &input, &state.core.spec().objective.metric);
                trial_input = Some((trial, input));
                events
            }
        };
        let Some(state) = cell.state.as_mut() else {
            return Ok(());
        };
        let before: Vec<TrialState> = state.core.trials().iter().map(|t| t.state).collect();
        let was_finished = state.core.is_finished();
        let mut decisions = Vec::new();
        for event in events {
            match state.core.on_event(event) {
                Ok(more) => decisions.extend(more),
                Err(SweepError::UnknownTrial { trial_id, .. }) => {
                    tracing::debug!(sweep = %key, trial = %trial_id, "not a trial this sweep requested; ignored");
                }
                Err(err) => {
                    return Err(TunerError::CorruptState {
                        key: key.to_string(),
                        message: err.to_string(),
                    });
                }
            }
        }
        let mut outbox =
            routing::decision_messages(&state.sweep, &state.core, &state.codec, &decisions);
        if let Some(runs) = &self.trial_runs {
            let at_ms = header.time.timestamp_millis();
            for message in &mut outbox {
                if let OutgoingPayload::TrialRequested(request) = &mut message.payload {
                    request.tracking = self
                        .trial_run(
                            runs,
                            &state.sweep,
                            state.tracking_uri.as_deref(),
                            request,
                            at_ms,
                        )
                        .await;
                }
            }
        }
        let progress = routing::progress_of(
            &state.core,
            &state.codec,
            &state.metadata,
            state.tracking_warning.as_deref(),
        );
        if state.last_progress.as_ref() != Some(&progress) {
            state.progress_seq += 1;
            outbox.push(Outgoing {
                message_id: routing::progress_message_id(&state.sweep, state.progress_seq),
                correlation_id: None,
                causation_id: None,
                payload: OutgoingPayload::SweepProgressed(progress.clone()),
            });
            state.last_progress = Some(progress);
        }
        for message in &mut outbox {
            message.correlation_id = Some(header.correlation_id);
            message.causation_id = Some(header.id);
        }
        state.outbox = outbox;

        // Commit: state with its outbox, publish, state without it.
        let bytes = state.encode()?;
        if !state.outbox.is_empty() {
            cell.revision = self.store.write(key, bytes.clone(), cell.revision).await?;
            cell.stored = Some(bytes);
            self.publish(state).await?;
            state.outbox.clear();
            if !delete {
                let bytes = state.encode()?;
                cell.revision = self.store.write(key, bytes.clone(), cell.revision).await?;
                cell.stored = Some(bytes);
            }
        } else if !delete && cell.stored.as_ref() != Some(&bytes) {
            cell.revision = self.store.write(key, bytes.clone(), cell.revision).await?;
            cell.stored = Some(bytes);
        }
        self.account(state, &decisions, was_finished);
        self.track(state, created, &before, trial_input, header);
        if delete {
            self.store.remove(key).await?;
            cell.state = None;
            cell.loaded = false;
            self.set_active(key, false);
            tracing::info!(sweep = %key, "sweep deleted; state dropped");
        } else {
            let finished = state.core.is_finished();
            self.set_active(key, !finished);
        }
        Ok(())
    }

    async fn publish(&self, state: &SweepState) -> Result<(), TunerError> {
        for message in &state.outbox {
            match &message.payload {
                OutgoingPayload::TrialRequested(p) => {
                    self.publish_one(&state.sweep, message, p.clone()).await?
                }
                OutgoingPayload::TrialStopped(p) => {
                    self.publish_one(&state.sweep, message, p.clone()).await?
                }
                OutgoingPayload::SweepProgressed(p) => {
                    self.publish_one(&state.sweep, message, p.clone()).await?
                }
            }
        }
        Ok(())
    }

    async fn publish_one<P: Payload>(
        &self,
        sweep: &EntityRef,
        message: &Outgoing,
        payload: P,
    ) -> Result<(), TunerError> {
        let mut envelope = self.publisher.envelope(sweep.clone(), payload);
        if let Some(correlation) = message.correlation_id {
            envelope.correlation_id = correlation;
        }
        envelope.causation_id = message.causation_id;
        let published = self
            .publisher
            .publish_with_id(envelope, &message.message_id)
            .await?;
        if published.duplicate {
            tracing::debug!(id = %message.message_id, "already published; JetStream dropped the repeat");
        }
        Ok(())
    }

    fn account(&self, state: &SweepState, decisions: &[SweepDecision], was_finished: bool) {
        for decision in decisions {
            match decision {
                SweepDecision::TrialRequested { .. } => self.metrics.trials_requested.inc(),
                SweepDecision::StopTrial { reason, .. } => {
                    let label = match reason {
                        StopReason::EarlyStopped { .. } => "early_stopped",
                        StopReason::NonFiniteMetric { .. } => "non_finite",
                        StopReason::SweepFinished => "sweep_finished",
                    };
                    self.metrics
                        .trials_stopped
                        .with_label_values(&[label])
                        .inc();
                }
                SweepDecision::SweepFinished { .. } => {}
            }
        }
        if !was_finished && let Some(reason) = state.core.finish_reason() {
            self.metrics
                .sweeps_finished
                .with_label_values(&[routing::finish_name(reason)])
                .inc();
            tracing::info!(sweep = %state.sweep.key(), reason = routing::finish_name(reason), "sweep finished");
        }
    }

    /// Hands what happened to a standalone TrainingJob to the experiment
    /// tracker, if one is configured for standalone jobs. Never waits.
    fn track_job(
        &self,
        job: &EntityRef,
        input: &TrialInput,
        header: &Header,
        start_on_progress: bool,
    ) {
        if let Some(tracker) = &self.tracker {
            tracker.job(
                job,
                input,
                header.time.timestamp_millis(),
                start_on_progress,
            );
        }
    }

    /// Hands what happened to the experiment tracker, if one is configured.
    fn track(
        &self,
        state: &SweepState,
        created: bool,
        before: &[TrialState],
        trial_input: Option<(TrialRef, TrialInput)>,
        header: &Header,
    ) {
        let Some(tracker) = &self.tracker else {
            return;
        };
        let at_ms = header.time.timestamp_millis();
        let sweep = SweepInfo::of(&state.sweep, state.tracking_uri.as_deref());
        let (uid_of, current_trial) = match &trial_input {
            Some((trial, _)) => (trial.uid.clone(), trial.name.clone()),
            None => (String::new(), String::new()),
        };
        let info = |index: u32| {
            let record = state.core.trials().get(index as usize)?;
            let params: BTreeMap<String, String> = state
                .codec
                .decode(&record.params)
                .iter()
                .map(|(k, v)| (k.clone(), parameter_text(v)))
                .collect();
            let uid = if record.id == current_trial {
                uid_of.clone()
            } else {
                String::new()
            };
            Some(TrialInfo {
                name: record.id.clone(),
                index,
                params,
                uid,
            })
        };
        if created {
            tracker.send(TrackingCommand::SweepCreated {
                sweep: sweep.clone(),
            });
        }
        if let Some((trial, TrialInput::Progress { epoch, metrics, .. })) = &trial_input
            && state.core.trial(&trial.name).is_some()
            && let Some(info) = info(trial.index)
        {
            tracker.send(TrackingCommand::TrialMetrics {
                sweep: sweep.clone(),
                trial: info,
                epoch: *epoch,
                metrics: metrics.clone(),
                at_ms,
            });
        }
        for (index, change) in routing::trial_changes(before, &state.core) {
            let Some(trial) = info(index) else { continue };
            let command = match change {
                TrialChange::Requested => TrackingCommand::TrialRequested {
                    sweep: sweep.clone(),
                    trial,
                    at_ms,
                },
                TrialChange::Ended(ended) => TrackingCommand::TrialEnded {
                    sweep: sweep.clone(),
                    trial,
                    status: match ended {
                        TrialState::Completed => RunStatus::Finished,
                        TrialState::Failed => RunStatus::Failed,
                        _ => RunStatus::Killed,
                    },
                    at_ms,
                },
            };
            tracker.send(command);
        }
    }
}

/// The tuner as a consumer of every stream it reads.
pub struct TunerHandler(pub Arc<Tuner>);

impl Handler for TunerHandler {
    async fn handle(&self, message: Incoming, delivery: Delivery) -> Result<(), HandleError> {
        self.0.handle(&message, delivery.delivered).await
    }
}
