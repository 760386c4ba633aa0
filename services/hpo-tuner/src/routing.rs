//! Message routing and decision mapping: pure functions from messages to sweep
//! inputs, and from the core's decisions to the messages the tuner publishes.

use std::collections::BTreeMap;

use hpo_tuner_core::{
    EarlyStoppingSpec, FinishReason, StopReason, SweepCore, SweepDecision, SweepEvent, TrialState,
};
use serde::{Deserialize, Serialize};
use trainyard_api::{Sweep, TrainingJobState};
use trainyard_contracts::decisions::{BestTrial, SweepProgressed, TrialRequested, TrialStopped};
use trainyard_contracts::events::{Change, SweepChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{EntityRef, Incoming};
use trainyard_runtime::HandleError;
use uuid::Uuid;

use crate::spec::ParamCodec;
use crate::store::SweepMetadata;

/// What one message means to the tuner.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// A Sweep was created or changed: create its state if new, then fill trial slots.
    SweepApplied {
        sweep: EntityRef,
        object: Box<Sweep>,
    },
    /// A Sweep was deleted: cancel it and drop its state.
    SweepDeleted { sweep: EntityRef },
    /// Something happened to a TrainingJob that may be a trial of `sweep`.
    Trial {
        /// Namespace and name of the sweep the trial name points at (uid unknown).
        sweep: EntityRef,
        trial: TrialRef,
        input: TrialInput,
    },
    /// Something happened to a TrainingJob that is not named like a trial: a
    /// standalone job, recorded in MLflow when that is configured.
    Job { job: EntityRef, input: TrialInput },
    /// Not for the tuner; acknowledged and dropped.
    Ignore(&'static str),
}

/// A TrainingJob named like a trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialRef {
    pub name: String,
    pub index: u32,
    /// The TrainingJob's uid, when the message carried it.
    pub uid: String,
}

/// What happened to a trial (or to a standalone TrainingJob).
#[derive(Debug, Clone, PartialEq)]
pub enum TrialInput {
    Started,
    Progress {
        epoch: u32,
        step: u64,
        metrics: BTreeMap<String, f64>,
    },
    Completed,
    Failed {
        reason: String,
    },
    /// The TrainingJob was deleted; `last_state` is what it had reached.
    Finalized {
        last_state: Option<TrainingJobState>,
    },
}

/// Splits a trial name `<sweep>-t<NNNN>` (at least four digits, no extra leading
/// zeros) into the sweep name and the trial index.
pub fn parse_trial_name(name: &str) -> Option<(&str, u32)> {
    let (sweep, digits) = name.rsplit_once("-t")?;
    if sweep.is_empty() || digits.len() < 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: u32 = digits.parse().ok()?;
    (format!("{index:04}") == digits).then_some((sweep, index))
}

/// Routes one message. Payloads that do not decode are rejected (dead-lettered);
/// messages about TrainingJobs not named like a trial route to [`Route::Job`];
/// other messages the tuner does not act on are ignored.
pub fn route(message: &Incoming) -> Result<Route, HandleError> {
    let entity = &message.header.entity;
    if message.is::<SweepChanged>() {
        let changed: SweepChanged = message.payload()?;
        let sweep = sweep_entity(entity, &changed.object)?;
        return Ok(match changed.change {
            Change::Applied => Route::SweepApplied {
                sweep,
                object: Box::new(changed.object),
            },
            Change::Deleted => Route::SweepDeleted { sweep },
        });
    }
    let input = if message.is::<ProgressReported>() {
        let progress: ProgressReported = message.payload()?;
        if progress.worker_index != 0 {
            return Ok(Route::Ignore("progress of a worker other than rank 0"));
        }
        TrialInput::Progress {
            epoch: progress.epoch,
            step: progress.step,
            metrics: progress.metrics,
        }
    } else if message.is::<TrainingJobTransitioned>() {
        let transition: TrainingJobTransitioned = message.payload()?;
        match transition.to {
            TrainingJobState::Running => TrialInput::Started,
            TrainingJobState::Completed => TrialInput::Completed,
            TrainingJobState::Failed => TrialInput::Failed {
                reason: failure_reason(&transition),
            },
            _ => return Ok(Route::Ignore("a transition the tuner does not act on")),
        }
    } else if message.is::<TrainingJobFinalized>() {
        let finalized: TrainingJobFinalized = message.payload()?;
        TrialInput::Finalized {
            last_state: finalized.last_state,
        }
    } else {
        return Ok(Route::Ignore("a message type the tuner does not read"));
    };
    if entity.namespace.is_empty() || entity.name.is_empty() {
        return Ok(Route::Ignore("a TrainingJob without a namespace or name"));
    }
    let Some((sweep, index)) = parse_trial_name(&entity.name) else {
        return Ok(Route::Job {
            job: entity.clone(),
            input,
        });
    };
    Ok(Route::Trial {
        sweep: EntityRef::new(entity.namespace.clone(), sweep, ""),
        trial: TrialRef {
            name: entity.name.clone(),
            index,
            uid: entity.uid.clone(),
        },
        input,
    })
}

fn failure_reason(transition: &TrainingJobTransitioned) -> String {
    match (transition.reason.is_empty(), transition.message.is_empty()) {
        (true, true) => "the TrainingJob failed".to_string(),
        (false, true) => transition.reason.clone(),
        (true, false) => transition.message.clone(),
        (false, false) => format!("{}: {}", transition.reason, transition.message),
    }
}

/// The Sweep's identity: the envelope's entity, completed from the object's metadata.
fn sweep_entity(entity: &EntityRef, object: &Sweep) -> Result<EntityRef, HandleError> {
    let reject = |reason: String| HandleError::Reject {
        category: "invalid_entity",
        reason,
    };
    let mut sweep = entity.clone();
    if sweep.namespace.is_empty() {
        sweep.namespace = object.metadata.namespace.clone().unwrap_or_default();
    }
    if sweep.name.is_empty() {
        sweep.name = object.metadata.name.clone().unwrap_or_default();
    }
    if sweep.uid.is_empty() {
        sweep.uid = object.metadata.uid.clone().unwrap_or_default();
    }
    if sweep.namespace.is_empty() || sweep.name.is_empty() {
        return Err(reject(
            "entity.namespace and entity.name (or metadata.namespace and metadata.name) must name the Sweep".into(),
        ));
    }
    Ok(sweep)
}

/// The core events a trial input becomes, given the sweep's objective metric.
pub fn events_for(trial: &str, input: &TrialInput, objective_metric: &str) -> Vec<SweepEvent> {
    let trial_id = trial.to_string();
    match input {
        TrialInput::Started => vec![SweepEvent::TrialStarted { trial_id }],
        TrialInput::Progress { epoch, metrics, .. } => metrics
            .get(objective_metric)
            .map(|value| SweepEvent::TrialMetric {
                trial_id,
                metric: objective_metric.to_string(),
                epoch: *epoch,
                value: *value,
            })
            .into_iter()
            .collect(),
        TrialInput::Completed => vec![SweepEvent::TrialCompleted {
            trial_id,
            value: None,
        }],
        TrialInput::Failed { reason } => vec![SweepEvent::TrialFailed {
            trial_id,
            reason: reason.clone(),
        }],
        TrialInput::Finalized { last_state } => match last_state {
            // The transition may have been missed; completing twice is a no-op.
            Some(TrainingJobState::Completed) => vec![SweepEvent::TrialCompleted {
                trial_id,
                value: None,
            }],
            _ => vec![SweepEvent::TrialFailed {
                trial_id,
                reason: "the trial's TrainingJob was deleted before it finished".to_string(),
            }],
        },
    }
}

/// A message waiting to be published, kept in the sweep's stored state until
/// JetStream has acknowledged it (so a crash between deciding and publishing
/// publishes the very same messages, with the same ids, after the restart).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outgoing {
    /// `Nats-Msg-Id`: derived from the sweep and the decision, never random.
    pub message_id: String,
    #[serde(default)]
    pub correlation_id: Option<Uuid>,
    #[serde(default)]
    pub causation_id: Option<Uuid>,
    pub payload: OutgoingPayload,
}

/// The payload of an [`Outgoing`] message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "payload", rename_all = "camelCase")]
pub enum OutgoingPayload {
    TrialRequested(TrialRequested),
    TrialStopped(TrialStopped),
    SweepProgressed(SweepProgressed),
}

/// `<namespace>/<name>:<uid>`: identifies one incarnation of a Sweep in message
/// ids, so a Sweep deleted and created again under the same name inside the
/// duplicate window does not have its trials dropped as duplicates.
fn incarnation(sweep: &EntityRef) -> String {
    format!("{}/{}:{}", sweep.namespace, sweep.name, sweep.uid)
}

pub fn trial_message_id(sweep: &EntityRef, trial: &str) -> String {
    format!("trial:{}:{trial}", incarnation(sweep))
}

pub fn stop_message_id(sweep: &EntityRef, trial: &str) -> String {
    format!("trialstop:{}:{trial}", incarnation(sweep))
}

pub fn progress_message_id(sweep: &EntityRef, seq: u64) -> String {
    format!("sweep:{}:{seq}", incarnation(sweep))
}

/// The trial and stop messages for `decisions`, in the core's order.
pub fn decision_messages(
    sweep: &EntityRef,
    core: &SweepCore,
    codec: &ParamCodec,
    decisions: &[SweepDecision],
) -> Vec<Outgoing> {
    decisions
        .iter()
        .filter_map(|decision| match decision {
            SweepDecision::TrialRequested {
                trial_id,
                index,
                params,
            } => Some(Outgoing {
                message_id: trial_message_id(sweep, trial_id),
                correlation_id: None,
                causation_id: None,
                payload: OutgoingPayload::TrialRequested(TrialRequested {
                    trial_name: trial_id.clone(),
                    trial_index: *index,
                    parameters: codec.decode(params),
                    tracking: None,
                }),
            }),
            SweepDecision::StopTrial { trial_id, reason } => Some(Outgoing {
                message_id: stop_message_id(sweep, trial_id),
                correlation_id: None,
                causation_id: None,
                payload: OutgoingPayload::TrialStopped(trial_stopped(core, trial_id, reason)),
            }),
            // Reported through SweepProgressed.finished_reason.
            SweepDecision::SweepFinished { .. } => None,
        })
        .collect()
}

fn trial_stopped(core: &SweepCore, trial_id: &str, reason: &StopReason) -> TrialStopped {
    let spec = core.spec();
    let (text, rung) = match reason {
        StopReason::EarlyStopped { epoch, rung } => {
            let rule = match &spec.early_stopping {
                Some(EarlyStoppingSpec::Asha(c)) => {
                    format!("ASHA: not in the top 1/{} ", c.reduction_factor)
                }
                Some(EarlyStoppingSpec::Hyperband(c)) => {
                    format!("Hyperband: not in the top 1/{} ", c.reduction_factor)
                }
                Some(EarlyStoppingSpec::Median(_)) => {
                    "median rule: worse than the median of completed trials ".to_string()
                }
                None => "early stopping: ".to_string(),
            };
            let rung_epoch = rung.map(|k| rung_epoch(core, k, *epoch));
            let text = match rung_epoch {
                Some(r) => format!(
                    "{rule}at rung {r} ({} at epoch {epoch})",
                    spec.objective.metric
                ),
                None => format!("{rule}at epoch {epoch} ({})", spec.objective.metric),
            };
            (text, rung_epoch)
        }
        StopReason::NonFiniteMetric { epoch } => (
            format!(
                "{} was not a finite number at epoch {epoch}: training diverged",
                spec.objective.metric
            ),
            None,
        ),
        StopReason::SweepFinished => (
            match core.finish_reason() {
                Some(reason) => format!("the sweep finished: {}", finish_message(core, reason)),
                None => "the sweep finished".to_string(),
            },
            None,
        ),
    };
    TrialStopped {
        trial_name: trial_id.to_string(),
        reason: text,
        rung,
    }
}

/// The epoch of rung index `rung` for a trial stopped at `epoch`: the largest
/// such rung at or below the epoch (Hyperband brackets share rung indices).
fn rung_epoch(core: &SweepCore, rung: u32, epoch: u32) -> u32 {
    core.status()
        .rungs
        .iter()
        .filter(|r| r.rung == rung && r.resource <= epoch)
        .map(|r| r.resource)
        .max()
        .unwrap_or(epoch)
}

/// The finish reason as the contract names it.
pub fn finish_name(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::GoalReached { .. } => "GoalReached",
        FinishReason::MaxTrialsReached => "MaxTrialsReached",
        FinishReason::TooManyFailedTrials { .. } => "TooManyFailures",
        FinishReason::SearchSpaceExhausted => "SearchSpaceExhausted",
        FinishReason::Cancelled => "Cancelled",
    }
}

fn finish_message(core: &SweepCore, reason: &FinishReason) -> String {
    let spec = core.spec();
    match reason {
        FinishReason::GoalReached { trial_id, value } => format!(
            "{trial_id} reached the goal: {} = {value}",
            spec.objective.metric
        ),
        FinishReason::MaxTrialsReached => format!(
            "all {} trials ended",
            spec.max_trial_count.unwrap_or(core.trials().len() as u32)
        ),
        FinishReason::TooManyFailedTrials { failed } => format!(
            "{failed} trials failed, more than maxFailedTrialCount {}",
            spec.max_failed_trial_count.unwrap_or_default()
        ),
        FinishReason::SearchSpaceExhausted => {
            "every point of the search grid has been tried".to_string()
        }
        FinishReason::Cancelled => "the Sweep was deleted".to_string(),
    }
}

/// The sweep's progress for the planner to write into its status, with what
/// the notifier routes on (objective, labels, notification annotations) and
/// why the Sweep is not recorded where its template says, if so.
pub fn progress_of(
    core: &SweepCore,
    codec: &ParamCodec,
    metadata: &SweepMetadata,
    tracking_warning: Option<&str>,
) -> SweepProgressed {
    let status = core.status();
    let mut rungs: BTreeMap<u32, u32> = BTreeMap::new();
    for rung in &status.rungs {
        *rungs.entry(rung.resource).or_default() += rung.recorded;
    }
    let counts = &status.trials;
    SweepProgressed {
        pending: counts.requested,
        running: counts.running,
        succeeded: counts.completed,
        failed: counts.failed,
        early_stopped: counts.stopped,
        best_trial: status.best_trial.as_ref().map(|best| BestTrial {
            trial_name: best.trial_id.clone(),
            parameters: codec.decode(&best.params),
            objective_value: best.value,
        }),
        rungs,
        finished_reason: status.finished.as_ref().map(|r| finish_name(r).to_string()),
        message: status.finished.as_ref().map(|r| finish_message(core, r)),
        objective_metric: Some(core.spec().objective.metric.clone()),
        labels: metadata.labels.clone(),
        annotations: metadata.annotations.clone(),
        tracking_warning: tracking_warning.map(str::to_string),
    }
}

/// How a trial's state changed in one step, for experiment tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialChange {
    Requested,
    Ended(TrialState),
}

/// Trials that were requested or ended between `before` (states by index) and now.
pub fn trial_changes(before: &[TrialState], core: &SweepCore) -> Vec<(u32, TrialChange)> {
    core.trials()
        .iter()
        .filter_map(|t| {
            let previous = before.get(t.index as usize).copied();
            match previous {
                None => Some((t.index, TrialChange::Requested)),
                Some(p) if p.is_active() && !t.state.is_active() => {
                    Some((t.index, TrialChange::Ended(t.state)))
                }
                Some(_) => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpo_tuner_core::{Direction, Objective, ParamSpec, SearchSpace, SweepSpec};
    use serde_json::json;
    use trainyard_contracts::{Envelope, Payload};

    fn incoming<P: Payload>(ns: &str, name: &str, uid: &str, payload: P) -> Incoming {
        let envelope = Envelope::new("test", EntityRef::new(ns, name, uid), payload);
        Incoming::decode(&envelope.to_json().expect("encodes")).expect("decodes")
    }

    fn transition(to: TrainingJobState) -> TrainingJobTransitioned {
        TrainingJobTransitioned {
            from: None,
            to,
            reason: "BackoffLimitExceeded".into(),
            message: "worker 0 exited 1".into(),
            restart_count: 0,
            gpus: 0,
            queue: None,
            context: Default::default(),
        }
    }

    fn progress(worker_index: u32, epoch: u32, metrics: &[(&str, f64)]) -> ProgressReported {
        ProgressReported {
            worker_index,
            attempt: 0,
            epoch,
            total_epochs: None,
            step: 100,
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn trial_names_parse_to_sweep_and_index() {
        assert_eq!(
            parse_trial_name("resnet-sweep-t0003"),
            Some(("resnet-sweep", 3))
        );
        assert_eq!(parse_trial_name("a-t-b-t12345"), Some(("a-t-b", 12345)));
        assert_eq!(parse_trial_name("s-t0000"), Some(("s", 0)));
        for bad in [
            "s-t003", "s-t00003", "-t0001", "s-tabcd", "s0001", "s-t", "bert",
        ] {
            assert_eq!(parse_trial_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn sweep_events_route_to_applied_and_deleted() {
        let object: Sweep = serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "Sweep",
            "metadata": {"name": "s", "namespace": "ml", "uid": "u-9"},
            "spec": {"objective": {"metric": "loss", "direction": "minimize"},
                     "parameters": [{"name": "lr", "type": "float", "min": 0.1, "max": 1.0}],
                     "maxTrialCount": 2,
                     "trialTemplate": {"model": "m", "dataset": "d", "numWorkers": 1, "gpusPerWorker": 1, "framework": "pytorch"}},
        }))
        .expect("sweep");
        let applied = incoming(
            "ml",
            "s",
            "",
            SweepChanged {
                change: Change::Applied,
                object: object.clone(),
            },
        );
        match route(&applied).expect("routes") {
            Route::SweepApplied { sweep, .. } => {
                assert_eq!(sweep, EntityRef::new("ml", "s", "u-9"), "uid from metadata")
            }
            other => panic!("{other:?}"),
        }
        let deleted = incoming(
            "ml",
            "s",
            "u-9",
            SweepChanged {
                change: Change::Deleted,
                object,
            },
        );
        assert_eq!(
            route(&deleted).expect("routes"),
            Route::SweepDeleted {
                sweep: EntityRef::new("ml", "s", "u-9")
            }
        );
    }

    #[test]
    fn trial_messages_route_to_their_sweep() {
        let m = incoming(
            "ml",
            "s-t0002",
            "job-uid",
            transition(TrainingJobState::Running),
        );
        assert_eq!(
            route(&m).expect("routes"),
            Route::Trial {
                sweep: EntityRef::new("ml", "s", ""),
                trial: TrialRef {
                    name: "s-t0002".into(),
                    index: 2,
                    uid: "job-uid".into()
                },
                input: TrialInput::Started,
            }
        );
        let m = incoming("ml", "s-t0002", "", transition(TrainingJobState::Failed));
        match route(&m).expect("routes") {
            Route::Trial {
                input: TrialInput::Failed { reason },
                ..
            } => assert_eq!(reason, "BackoffLimitExceeded: worker 0 exited 1"),
            other => panic!("{other:?}"),
        }
        let m = incoming("ml", "s-t0002", "", progress(0, 3, &[("loss", 0.5)]));
        assert!(matches!(
            route(&m).expect("routes"),
            Route::Trial {
                input: TrialInput::Progress { epoch: 3, .. },
                ..
            }
        ));
        let m = incoming(
            "ml",
            "s-t0002",
            "",
            TrainingJobFinalized {
                last_state: Some(TrainingJobState::Running),
            },
        );
        assert!(matches!(
            route(&m).expect("routes"),
            Route::Trial {
                input: TrialInput::Finalized { .. },
                ..
            }
        ));
    }

    #[test]
    fn jobs_not_named_like_trials_route_as_standalone_jobs() {
        let job = EntityRef::new("ml", "bert", "job-uid");
        let cases = [
            (
                incoming(
                    "ml",
                    "bert",
                    "job-uid",
                    transition(TrainingJobState::Running),
                ),
                TrialInput::Started,
            ),
            (
                incoming(
                    "ml",
                    "bert",
                    "job-uid",
                    transition(TrainingJobState::Completed),
                ),
                TrialInput::Completed,
            ),
            (
                incoming(
                    "ml",
                    "bert",
                    "job-uid",
                    TrainingJobFinalized { last_state: None },
                ),
                TrialInput::Finalized { last_state: None },
            ),
            (
                incoming("ml", "bert", "job-uid", progress(0, 2, &[("loss", 0.5)])),
                TrialInput::Progress {
                    epoch: 2,
                    step: 100,
                    metrics: [("loss".to_string(), 0.5)].into(),
                },
            ),
        ];
        for (m, input) in cases {
            assert_eq!(
                route(&m).expect("routes"),
                Route::Job {
                    job: job.clone(),
                    input
                }
            );
        }
        // Names that only look close to a trial's are standalone jobs too.
        for name in ["s-t003", "s-t00003", "bert-t", "-t0001"] {
            let m = incoming("ml", name, "u", transition(TrainingJobState::Running));
            assert!(
                matches!(route(&m).expect("routes"), Route::Job { ref job, .. } if job.name == name),
                "{name}"
            );
        }
        // ... while trial names still route to their sweep.
        let m = incoming(
            "ml",
            "bert-t0001",
            "u",
            transition(TrainingJobState::Running),
        );
        assert!(matches!(route(&m).expect("routes"), Route::Trial { .. }));
    }

    #[test]
    fn other_messages_are_ignored() {
        let cases = [
            incoming("ml", "s-t0002", "", progress(1, 3, &[("loss", 0.5)])),
            incoming("ml", "bert", "u", progress(2, 3, &[("loss", 0.5)])),
            incoming("ml", "bert", "u", transition(TrainingJobState::Suspended)),
            incoming("", "bert", "u", transition(TrainingJobState::Running)),
            incoming("ml", "", "u", transition(TrainingJobState::Running)),
            incoming("ml", "s-t0002", "", transition(TrainingJobState::Queued)),
            incoming(
                "ml",
                "s-t0002",
                "",
                trainyard_contracts::decisions::ResumePointChosen {
                    uri: "x".into(),
                    epoch: 1,
                    step: 1,
                    ..Default::default()
                },
            ),
        ];
        for m in cases {
            assert!(matches!(route(&m), Ok(Route::Ignore(_))), "{:?}", m.header);
        }
    }

    #[test]
    fn undecodable_payloads_are_rejected() {
        let body = json!({
            "id": Uuid::now_v7(), "type": "worker.progress", "schemaVersion": 1, "source": "x",
            "time": "2026-11-18T11:06:40Z", "entity": {"namespace": "ml", "name": "s-t0000"},
            "correlationId": Uuid::now_v7(), "payload": {"epoch": "three"},
        });
        let m = Incoming::decode(body.to_string().as_bytes()).expect("header decodes");
        assert!(matches!(route(&m), Err(HandleError::Reject { .. })));
    }

    #[test]
    fn inputs_become_core_events() {
        let progress = TrialInput::Progress {
            epoch: 2,
            step: 10,
            metrics: [("loss".to_string(), 0.4), ("acc".to_string(), 0.9)].into(),
        };
        assert_eq!(
            events_for("s-t0001", &progress, "acc"),
            vec![SweepEvent::TrialMetric {
                trial_id: "s-t0001".into(),
                metric: "acc".into(),
                epoch: 2,
                value: 0.9
            }]
        );
        assert!(events_for("s-t0001", &progress, "f1").is_empty());
        assert_eq!(
            events_for(
                "s-t0001",
                &TrialInput::Finalized {
                    last_state: Some(TrainingJobState::Completed)
                },
                "acc"
            ),
            vec![SweepEvent::TrialCompleted {
                trial_id: "s-t0001".into(),
                value: None
            }]
        );
        assert!(matches!(
            events_for(
                "s-t0001",
                &TrialInput::Finalized { last_state: None },
                "acc"
            )[..],
            [SweepEvent::TrialFailed { .. }]
        ));
    }

    fn core(max: u32) -> SweepCore {
        let space = SearchSpace::new(vec![ParamSpec::float("lr", 0.0, 1.0)]).expect("space");
        let mut spec = SweepSpec::new(
            "s",
            Objective {
                metric: "acc".into(),
                direction: Direction::Maximize,
                goal: None,
            },
            space,
        );
        spec.algorithm = hpo_tuner_core::AlgorithmSpec::Random;
        spec.parallel_trial_count = 2;
        spec.max_trial_count = Some(max);
        SweepCore::new(spec).expect("core")
    }

    #[test]
    fn decisions_become_messages_with_deterministic_ids() {
        let sweep = EntityRef::new("ml", "s", "u1");
        let mut core = core(2);
        let decisions = core.on_event(SweepEvent::Start).expect("start");
        let messages = decision_messages(&sweep, &core, &ParamCodec::default(), &decisions);
        let ids: Vec<_> = messages.iter().map(|m| m.message_id.as_str()).collect();
        assert_eq!(ids, ["trial:ml/s:u1:s-t0000", "trial:ml/s:u1:s-t0001"]);
        match &messages[1].payload {
            OutgoingPayload::TrialRequested(t) => {
                assert_eq!(t.trial_name, "s-t0001");
                assert_eq!(t.trial_index, 1);
                assert!(matches!(
                    t.parameters["lr"],
                    trainyard_contracts::decisions::ParameterValue::Float(_)
                ));
            }
            other => panic!("{other:?}"),
        }
        let decisions = core.on_event(SweepEvent::Cancel).expect("cancel");
        let messages = decision_messages(&sweep, &core, &ParamCodec::default(), &decisions);
        assert_eq!(
            messages.len(),
            2,
            "two stops; the finish goes into progress"
        );
        assert_eq!(messages[0].message_id, "trialstop:ml/s:u1:s-t0000");
        match &messages[0].payload {
            OutgoingPayload::TrialStopped(stop) => {
                assert_eq!(stop.reason, "the sweep finished: the Sweep was deleted")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(progress_message_id(&sweep, 7), "sweep:ml/s:u1:7");
    }

    #[test]
    fn progress_counts_best_and_finish() {
        let mut core = core(2);
        core.on_event(SweepEvent::Start).expect("start");
        core.on_event(SweepEvent::TrialStarted {
            trial_id: "s-t0000".into(),
        })
        .expect("started");
        let p = progress_of(
            &core,
            &ParamCodec::default(),
            &SweepMetadata::default(),
            None,
        );
        assert_eq!((p.pending, p.running, p.succeeded), (1, 1, 0));
        assert_eq!(p.finished_reason, None);
        for (id, value) in [("s-t0000", 0.7), ("s-t0001", 0.9)] {
            core.on_event(SweepEvent::TrialCompleted {
                trial_id: id.into(),
                value: Some(value),
            })
            .expect("completed");
        }
        let p = progress_of(
            &core,
            &ParamCodec::default(),
            &SweepMetadata::default(),
            None,
        );
        assert_eq!(p.succeeded, 2);
        assert_eq!(p.finished_reason.as_deref(), Some("MaxTrialsReached"));
        let best = p.best_trial.expect("best");
        assert_eq!(best.trial_name, "s-t0001");
        assert_eq!(best.objective_value, 0.9);
        assert_eq!(p.message.as_deref(), Some("all 2 trials ended"));
    }

    #[test]
    fn trial_changes_report_new_and_ended_trials() {
        let mut core = core(3);
        core.on_event(SweepEvent::Start).expect("start");
        let changes = trial_changes(&[], &core);
        assert_eq!(
            changes,
            vec![(0, TrialChange::Requested), (1, TrialChange::Requested)]
        );
        let before: Vec<_> = core.trials().iter().map(|t| t.state).collect();
        core.on_event(SweepEvent::TrialFailed {
            trial_id: "s-t0000".into(),
            reason: "x".into(),
        })
        .expect("failed");
        assert_eq!(
            trial_changes(&before, &core),
            vec![
                (0, TrialChange::Ended(TrialState::Failed)),
                (2, TrialChange::Requested)
            ]
        );
    }

    #[test]
    fn finish_reasons_use_the_contract_names() {
        assert_eq!(
            finish_name(&FinishReason::TooManyFailedTrials { failed: 3 }),
            "TooManyFailures"
        );
        assert_eq!(
            finish_name(&FinishReason::MaxTrialsReached),
            "MaxTrialsReached"
        );
        assert_eq!(
            finish_name(&FinishReason::GoalReached {
                trial_id: "x".into(),
                value: 1.0
            }),
            "GoalReached"
        );
    }
}
