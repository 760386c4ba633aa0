//! The sweep state machine: events in, decisions out.
//!
//! [`SweepCore::on_event`] is deterministic: the same state and event always
//! give the same decisions and the same next state (the random stream of trial
//! `i` is derived from the sweep seed and `i` alone). Duplicate deliveries are
//! no-ops. Together with deterministic trial ids (`<sweep>-t<NNNN>`) this makes
//! "restore the last snapshot, replay the unacknowledged events" produce the
//! same trial requests, with the same ids, as the first run: nothing is created
//! twice and nothing is lost.

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::error::{SampleError, SpecError, SweepError};
use crate::math::trial_seed;
use crate::sampler::{AlgorithmSpec, AnySampler, Observation, Outcome, Sampler};
use crate::space::{Params, SearchSpace};
use crate::stopping::{EarlyStopping, EarlyStoppingSpec, RungStatus, StopDecision, Stopper};

/// Longest sweep name: trial ids (`<name>-t<index>`, index up to 10 digits) must
/// stay valid Kubernetes object names (63 characters).
pub const MAX_SWEEP_NAME_LEN: usize = 51;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Direction {
    Minimize,
    Maximize,
}

/// What the sweep optimises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Objective {
    /// Name of the reported metric that is the objective; other metrics are ignored.
    pub metric: String,
    pub direction: Direction,
    /// Ends the sweep as soon as a completed trial reaches it (`<=` when
    /// minimising, `>=` when maximising).
    #[serde(default)]
    pub goal: Option<f64>,
}

impl Objective {
    /// Lower-is-better score of a metric value.
    pub fn score(&self, value: f64) -> f64 {
        match self.direction {
            Direction::Minimize => value,
            Direction::Maximize => -value,
        }
    }

    fn reaches_goal(&self, value: f64) -> bool {
        match (self.goal, self.direction) {
            (Some(g), Direction::Minimize) => value <= g,
            (Some(g), Direction::Maximize) => value >= g,
            (None, _) => false,
        }
    }
}

fn default_parallel() -> u32 {
    3
}

/// A sweep as the tuner needs it (the planner maps the `Sweep` resource to this).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepSpec {
    /// Sweep name; trial ids are `<name>-t<NNNN>`.
    pub name: String,
    pub objective: Objective,
    pub search_space: SearchSpace,
    #[serde(default)]
    pub algorithm: AlgorithmSpec,
    #[serde(default)]
    pub early_stopping: Option<EarlyStoppingSpec>,
    /// Trials requested or running at the same time.
    #[serde(default = "default_parallel")]
    pub parallel_trial_count: u32,
    /// Trials to create in total (failed ones included); unlimited when absent.
    #[serde(default)]
    pub max_trial_count: Option<u32>,
    /// The sweep fails when more trials than this have failed; unlimited when absent.
    #[serde(default)]
    pub max_failed_trial_count: Option<u32>,
    /// Seed of every random choice of the sweep.
    #[serde(default)]
    pub seed: u64,
}

impl SweepSpec {
    /// A spec with defaults: TPE, no early stopping, 3 in parallel, no limits.
    pub fn new(name: impl Into<String>, objective: Objective, search_space: SearchSpace) -> Self {
        Self {
            name: name.into(),
            objective,
            search_space,
            algorithm: AlgorithmSpec::default(),
            early_stopping: None,
            parallel_trial_count: default_parallel(),
            max_trial_count: None,
            max_failed_trial_count: None,
            seed: 0,
        }
    }

    fn validate(&self) -> Result<(), SpecError> {
        let name = &self.name;
        let ok_chars = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        let ok_ends = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
            && name
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric());
        if name.is_empty() || !ok_chars || !ok_ends || name.len() > MAX_SWEEP_NAME_LEN {
            return Err(SpecError::field(
                "name",
                format!(
                    "must be 1-{MAX_SWEEP_NAME_LEN} lowercase letters, digits or '-', \
                     starting and ending with a letter or digit"
                ),
            ));
        }
        if self.objective.metric.trim().is_empty() {
            return Err(SpecError::field("objective.metric", "must not be empty"));
        }
        if self.objective.goal.is_some_and(|g| !g.is_finite()) {
            return Err(SpecError::field(
                "objective.goal",
                "must be a finite number",
            ));
        }
        if self.parallel_trial_count == 0 {
            return Err(SpecError::field("parallelTrialCount", "must be at least 1"));
        }
        if self.max_trial_count == Some(0) {
            return Err(SpecError::field("maxTrialCount", "must be at least 1"));
        }
        Ok(())
    }
}

/// Input to the state machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SweepEvent {
    /// The sweep exists (or its spec was re-delivered): fill free trial slots.
    Start,
    /// A requested trial's workload started.
    #[serde(rename_all = "camelCase")]
    TrialStarted { trial_id: String },
    /// A trial reported `metric` = `value` after `epoch` epochs.
    #[serde(rename_all = "camelCase")]
    TrialMetric {
        trial_id: String,
        metric: String,
        epoch: u32,
        value: f64,
    },
    /// A trial ran to its end. `value` is its final objective; when absent the
    /// last reported objective metric is used.
    #[serde(rename_all = "camelCase")]
    TrialCompleted {
        trial_id: String,
        #[serde(default)]
        value: Option<f64>,
    },
    /// A trial failed.
    #[serde(rename_all = "camelCase")]
    TrialFailed { trial_id: String, reason: String },
    /// The user deleted or cancelled the sweep.
    Cancel,
}

/// Why a trial is to be stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StopReason {
    /// The early-stopping rule stopped it after `epoch` (`rung` for ASHA/Hyperband).
    EarlyStopped { epoch: u32, rung: Option<u32> },
    /// It reported a NaN or infinite objective (diverged training).
    NonFiniteMetric { epoch: u32 },
    /// The sweep ended while it was running.
    SweepFinished,
}

/// Why the sweep ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum FinishReason {
    #[serde(rename_all = "camelCase")]
    GoalReached {
        trial_id: String,
        value: f64,
    },
    MaxTrialsReached,
    TooManyFailedTrials {
        failed: u32,
    },
    SearchSpaceExhausted,
    Cancelled,
}

impl FinishReason {
    /// True when the sweep succeeded (as opposed to failed or cancelled).
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            FinishReason::GoalReached { .. }
                | FinishReason::MaxTrialsReached
                | FinishReason::SearchSpaceExhausted
        )
    }
}

/// Output of the state machine, in the order it must be published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum SweepDecision {
    #[serde(rename_all = "camelCase")]
    TrialRequested {
        trial_id: String,
        index: u32,
        params: Params,
    },
    #[serde(rename_all = "camelCase")]
    StopTrial {
        trial_id: String,
        reason: StopReason,
    },
    SweepFinished {
        reason: FinishReason,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TrialState {
    /// Requested, workload not seen yet.
    Requested,
    Running,
    Completed,
    /// Stopped by the tuner (early stopping, diverged, or sweep end).
    Stopped,
    Failed,
}

impl TrialState {
    pub fn is_active(self) -> bool {
        matches!(self, TrialState::Requested | TrialState::Running)
    }
}

/// Everything the tuner knows about one trial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialRecord {
    pub index: u32,
    pub id: String,
    pub params: Params,
    pub state: TrialState,
    /// Last objective report.
    pub last_epoch: Option<u32>,
    pub last_value: Option<f64>,
    /// Final objective of a completed trial.
    pub objective: Option<f64>,
    pub stop_reason: Option<StopReason>,
    pub failure: Option<String>,
}

/// Trials by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrialCounts {
    pub total: u32,
    pub requested: u32,
    pub running: u32,
    pub completed: u32,
    pub stopped: u32,
    pub failed: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BestTrial {
    pub trial_id: String,
    pub params: Params,
    pub value: f64,
}

/// What the planner writes into the Sweep's status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepStatus {
    pub trials: TrialCounts,
    /// Best completed trial (early-stopped trials never count: their value is
    /// from a shorter run).
    pub best_trial: Option<BestTrial>,
    pub rungs: Vec<RungStatus>,
    /// Set once the sweep has ended.
    pub finished: Option<FinishReason>,
}

/// Serializable state of a sweep (what goes into the key-value store).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepSnapshot {
    pub version: u32,
    pub spec: SweepSpec,
    pub trials: Vec<TrialRecord>,
    /// Indices of the trials in the samplers' history, in the order they ended.
    pub history_order: Vec<u32>,
    pub stopper: Option<Stopper>,
    pub exhausted: bool,
    pub finished: Option<FinishReason>,
}

const SNAPSHOT_VERSION: u32 = 1;

/// The sweep state machine. Serializes as a [`SweepSnapshot`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "SweepSnapshot", try_from = "SweepSnapshot")]
pub struct SweepCore {
    spec: SweepSpec,
    sampler: AnySampler,
    stopper: Option<Stopper>,
    trials: Vec<TrialRecord>,
    history: Vec<Observation>,
    history_order: Vec<u32>,
    exhausted: bool,
    finished: Option<FinishReason>,
    active: u32,
    failed: u32,
    best: Option<u32>,
}

/// Formats the id of trial `index` of sweep `sweep`.
pub fn trial_id(sweep: &str, index: u32) -> String {
    format!("{sweep}-t{index:04}")
}

/// What a finished trial contributes to the samplers' history (`None`: nothing,
/// e.g. trials cut by the end of the sweep).
fn outcome_of(t: &TrialRecord, objective: &Objective) -> Option<Outcome> {
    match t.state {
        TrialState::Completed => t.objective.map(|v| Outcome::Completed {
            score: objective.score(v),
        }),
        TrialState::Stopped => match t.stop_reason {
            Some(StopReason::EarlyStopped { .. }) => match (t.last_value, t.last_epoch) {
                (Some(v), Some(e)) => Some(Outcome::Pruned {
                    score: objective.score(v),
                    step: e,
                }),
                _ => Some(Outcome::Failed),
            },
            Some(StopReason::NonFiniteMetric { .. }) => Some(Outcome::Failed),
            Some(StopReason::SweepFinished) | None => None,
        },
        TrialState::Failed => Some(Outcome::Failed),
        TrialState::Requested | TrialState::Running => None,
    }
}

impl SweepCore {
    /// Validates the spec and builds an empty sweep. Nothing is requested until
    /// the first [`SweepEvent::Start`].
    pub fn new(spec: SweepSpec) -> Result<Self, SpecError> {
        spec.validate()?;
        let sampler = spec.algorithm.build(&spec.search_space, spec.seed)?;
        let stopper = spec
            .early_stopping
            .as_ref()
            .map(|e| e.build(spec.seed))
            .transpose()?;
        Ok(Self {
            spec,
            sampler,
            stopper,
            trials: Vec::new(),
            history: Vec::new(),
            history_order: Vec::new(),
            exhausted: false,
            finished: None,
            active: 0,
            failed: 0,
            best: None,
        })
    }

    pub fn spec(&self) -> &SweepSpec {
        &self.spec
    }

    pub fn search_space(&self) -> &SearchSpace {
        &self.spec.search_space
    }

    pub fn trials(&self) -> &[TrialRecord] {
        &self.trials
    }

    pub fn trial(&self, trial_id: &str) -> Option<&TrialRecord> {
        self.index_of(trial_id).and_then(|i| self.trials.get(i))
    }

    /// The samplers' history (finished trials in the order they ended).
    pub fn history(&self) -> &[Observation] {
        &self.history
    }

    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finished.as_ref()
    }

    fn index_of(&self, trial_id: &str) -> Option<usize> {
        let idx: u32 = trial_id
            .strip_prefix(self.spec.name.as_str())?
            .strip_prefix("-t")?
            .parse()
            .ok()?;
        let t = self.trials.get(idx as usize)?;
        (t.id == trial_id).then_some(idx as usize)
    }

    fn lookup(&self, trial_id: &str) -> Result<usize, SweepError> {
        self.index_of(trial_id)
            .ok_or_else(|| SweepError::UnknownTrial {
                sweep: self.spec.name.clone(),
                trial_id: trial_id.to_string(),
            })
    }

    /// Applies one event. Errors leave the state unchanged.
    pub fn on_event(&mut self, event: SweepEvent) -> Result<Vec<SweepDecision>, SweepError> {
        let mut out = Vec::new();
        match event {
            SweepEvent::Start => self.fill(&mut out),
            SweepEvent::Cancel => {
                if self.finished.is_none() {
                    self.finish(FinishReason::Cancelled, &mut out);
                }
            }
            SweepEvent::TrialStarted { trial_id } => {
                let i = self.lookup(&trial_id)?;
                if self.finished.is_none() && self.trials[i].state == TrialState::Requested {
                    self.trials[i].state = TrialState::Running;
                }
            }
            SweepEvent::TrialMetric {
                trial_id,
                metric,
                epoch,
                value,
            } => {
                let i = self.lookup(&trial_id)?;
                if metric == self.spec.objective.metric {
                    self.on_metric(i, epoch, value, &mut out);
                }
            }
            SweepEvent::TrialCompleted { trial_id, value } => {
                let i = self.lookup(&trial_id)?;
                self.on_completed(i, value, &mut out);
            }
            SweepEvent::TrialFailed { trial_id, reason } => {
                let i = self.lookup(&trial_id)?;
                self.on_failed(i, reason, &mut out);
            }
        }
        Ok(out)
    }

    fn accepts_updates(&self, i: usize) -> bool {
        self.finished.is_none() && self.trials[i].state.is_active()
    }

    fn on_metric(&mut self, i: usize, epoch: u32, value: f64, out: &mut Vec<SweepDecision>) {
        if !self.accepts_updates(i) {
            return;
        }
        let t = &mut self.trials[i];
        if t.last_epoch.is_some_and(|e| epoch <= e) {
            // Duplicate or out-of-order delivery.
            return;
        }
        t.state = TrialState::Running;
        t.last_epoch = Some(epoch);
        if !value.is_finite() {
            self.end_trial(
                i,
                TrialState::Stopped,
                Some(StopReason::NonFiniteMetric { epoch }),
                out,
            );
            self.after_trial_end(out);
            return;
        }
        t.last_value = Some(value);
        let score = self.spec.objective.score(value);
        let decision = match self.stopper.as_mut() {
            Some(s) => s.on_report(i as u32, epoch, score),
            None => StopDecision::Continue,
        };
        if let StopDecision::Stop { rung } = decision {
            self.end_trial(
                i,
                TrialState::Stopped,
                Some(StopReason::EarlyStopped { epoch, rung }),
                out,
            );
            self.after_trial_end(out);
        }
    }

    fn on_completed(&mut self, i: usize, value: Option<f64>, out: &mut Vec<SweepDecision>) {
        if !self.accepts_updates(i) {
            return;
        }
        let value = value.or(self.trials[i].last_value);
        let Some(v) = value.filter(|v| v.is_finite()) else {
            self.on_failed(
                i,
                "completed without a finite objective value".to_string(),
                out,
            );
            return;
        };
        self.trials[i].objective = Some(v);
        self.end_trial(i, TrialState::Completed, None, out);
        let objective = &self.spec.objective;
        let better = self
            .best
            .and_then(|b| self.trials.get(b as usize))
            .is_none_or(|b| {
                b.objective
                    .is_none_or(|bv| objective.score(v) < objective.score(bv))
            });
        if better {
            self.best = Some(i as u32);
        }
        if objective.reaches_goal(v) {
            let reason = FinishReason::GoalReached {
                trial_id: self.trials[i].id.clone(),
                value: v,
            };
            self.finish(reason, out);
            return;
        }
        self.after_trial_end(out);
    }

    fn on_failed(&mut self, i: usize, reason: String, out: &mut Vec<SweepDecision>) {
        if !self.accepts_updates(i) {
            return;
        }
        self.trials[i].failure = Some(reason);
        self.end_trial(i, TrialState::Failed, None, out);
        self.failed += 1;
        if let Some(max) = self.spec.max_failed_trial_count
            && self.failed > max
        {
            let failed = self.failed;
            self.finish(FinishReason::TooManyFailedTrials { failed }, out);
            return;
        }
        self.after_trial_end(out);
    }

    /// Moves an active trial to a terminal state, records it in the history and
    /// tells the scheduler. Emits the stop decision when the tuner stopped it.
    fn end_trial(
        &mut self,
        i: usize,
        state: TrialState,
        stop: Option<StopReason>,
        out: &mut Vec<SweepDecision>,
    ) {
        let t = &mut self.trials[i];
        t.state = state;
        t.stop_reason = stop.clone();
        self.active = self.active.saturating_sub(1);
        if let Some(reason) = stop {
            out.push(SweepDecision::StopTrial {
                trial_id: t.id.clone(),
                reason,
            });
        }
        if let Some(s) = self.stopper.as_mut() {
            s.on_trial_end(i as u32, state == TrialState::Completed);
        }
        if let Some(outcome) = outcome_of(&self.trials[i], &self.spec.objective) {
            self.history.push(Observation {
                params: self.trials[i].params.clone(),
                outcome,
            });
            self.history_order.push(i as u32);
        }
    }

    fn after_trial_end(&mut self, out: &mut Vec<SweepDecision>) {
        self.fill(out);
    }

    fn max_reached(&self) -> bool {
        self.spec
            .max_trial_count
            .is_some_and(|m| self.trials.len() as u64 >= u64::from(m))
            || self.trials.len() as u64 >= u64::from(u32::MAX)
    }

    /// Requests trials until `parallelTrialCount` are active, then ends the
    /// sweep if nothing is left to run.
    fn fill(&mut self, out: &mut Vec<SweepDecision>) {
        if self.finished.is_some() {
            return;
        }
        let mut pending: Vec<Params> = self
            .trials
            .iter()
            .filter(|t| t.state.is_active())
            .map(|t| t.params.clone())
            .collect();
        while self.active < self.spec.parallel_trial_count && !self.exhausted && !self.max_reached()
        {
            let index = self.trials.len() as u32;
            let mut rng = StdRng::seed_from_u64(trial_seed(self.spec.seed, index));
            match self.sampler.suggest(&self.history, &pending, &mut rng) {
                Ok(params) => {
                    let id = trial_id(&self.spec.name, index);
                    pending.push(params.clone());
                    out.push(SweepDecision::TrialRequested {
                        trial_id: id.clone(),
                        index,
                        params: params.clone(),
                    });
                    self.trials.push(TrialRecord {
                        index,
                        id,
                        params,
                        state: TrialState::Requested,
                        last_epoch: None,
                        last_value: None,
                        objective: None,
                        stop_reason: None,
                        failure: None,
                    });
                    self.active += 1;
                }
                Err(SampleError::Exhausted) => self.exhausted = true,
            }
        }
        if self.active == 0 {
            if self.max_reached() {
                self.finish(FinishReason::MaxTrialsReached, out);
            } else if self.exhausted {
                self.finish(FinishReason::SearchSpaceExhausted, out);
            }
        }
    }

    /// Ends the sweep: stops every active trial (in index order), then emits
    /// the finish decision.
    fn finish(&mut self, reason: FinishReason, out: &mut Vec<SweepDecision>) {
        for i in 0..self.trials.len() {
            if self.trials[i].state.is_active() {
                self.end_trial(i, TrialState::Stopped, Some(StopReason::SweepFinished), out);
            }
        }
        self.finished = Some(reason.clone());
        out.push(SweepDecision::SweepFinished { reason });
    }

    /// Status for the planner to write.
    pub fn status(&self) -> SweepStatus {
        let mut c = TrialCounts {
            total: self.trials.len() as u32,
            ..TrialCounts::default()
        };
        for t in &self.trials {
            match t.state {
                TrialState::Requested => c.requested += 1,
                TrialState::Running => c.running += 1,
                TrialState::Completed => c.completed += 1,
                TrialState::Stopped => c.stopped += 1,
                TrialState::Failed => c.failed += 1,
            }
        }
        let best_trial = self
            .best
            .and_then(|b| self.trials.get(b as usize))
            .and_then(|t| {
                Some(BestTrial {
                    trial_id: t.id.clone(),
                    params: t.params.clone(),
                    value: t.objective?,
                })
            });
        SweepStatus {
            trials: c,
            best_trial,
            rungs: self.stopper.as_ref().map(|s| s.rungs()).unwrap_or_default(),
            finished: self.finished.clone(),
        }
    }

    pub fn snapshot(&self) -> SweepSnapshot {
        SweepSnapshot {
            version: SNAPSHOT_VERSION,
            spec: self.spec.clone(),
            trials: self.trials.clone(),
            history_order: self.history_order.clone(),
            stopper: self.stopper.clone(),
            exhausted: self.exhausted,
            finished: self.finished.clone(),
        }
    }

    /// Rebuilds a sweep from a snapshot, checking it for consistency.
    pub fn restore(s: SweepSnapshot) -> Result<Self, SweepError> {
        let corrupt = |m: String| SweepError::CorruptSnapshot(m);
        if s.version != SNAPSHOT_VERSION {
            return Err(corrupt(format!("unsupported version {}", s.version)));
        }
        let mut core = SweepCore::new(s.spec)?;
        if s.stopper.is_some() != core.stopper.is_some() {
            return Err(corrupt(
                "early-stopping state does not match the spec".into(),
            ));
        }
        for (i, t) in s.trials.iter().enumerate() {
            if t.index as usize != i || t.id != trial_id(&core.spec.name, t.index) {
                return Err(corrupt(format!(
                    "trial {i} has index {} id {}",
                    t.index, t.id
                )));
            }
        }
        let mut seen = vec![false; s.trials.len()];
        for &i in &s.history_order {
            let Some(t) = s.trials.get(i as usize) else {
                return Err(corrupt(format!("history refers to unknown trial {i}")));
            };
            if std::mem::replace(&mut seen[i as usize], true) {
                return Err(corrupt(format!("trial {i} appears twice in the history")));
            }
            let Some(outcome) = outcome_of(t, &core.spec.objective) else {
                return Err(corrupt(format!(
                    "trial {i} is in the history but has no outcome"
                )));
            };
            core.history.push(Observation {
                params: t.params.clone(),
                outcome,
            });
        }
        core.history_order = s.history_order;
        core.active = s.trials.iter().filter(|t| t.state.is_active()).count() as u32;
        core.failed = s
            .trials
            .iter()
            .filter(|t| t.state == TrialState::Failed)
            .count() as u32;
        let objective = &core.spec.objective;
        core.best = s
            .trials
            .iter()
            .filter(|t| t.state == TrialState::Completed)
            .filter_map(|t| t.objective.map(|v| (t.index, objective.score(v))))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
            .map(|(i, _)| i);
        core.trials = s.trials;
        if s.stopper.is_some() {
            core.stopper = s.stopper;
        }
        core.exhausted = s.exhausted;
        core.finished = s.finished;
        Ok(core)
    }
}

impl From<SweepCore> for SweepSnapshot {
    fn from(core: SweepCore) -> Self {
        core.snapshot()
    }
}

impl TryFrom<SweepSnapshot> for SweepCore {
    type Error = SweepError;
    fn try_from(s: SweepSnapshot) -> Result<Self, SweepError> {
        SweepCore::restore(s)
    }
}
