//! What the planner has learned about one TrainingJob, folded from messages.
//!
//! [`observe`] records facts only; every decision is made by
//! [`decide`](crate::decide::decide) from these facts, the TrainingJob object and the
//! time. Folding the same messages in the same order always gives the same state.
//!
//! Attempts: every run of the worker gang is one attempt with its own Job
//! `<name>-a<attempt>`. Cluster facts about a newer attempt (its Job or pods) move the
//! state on to that attempt, because only the planner creates those Jobs. Anything
//! about an older attempt is stale and ignored; worker reports about a newer attempt
//! are ignored too (a worker cannot outrun its own Job's events for long, and a
//! mistaken attempt number must not abandon the running gang).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use chrono::{DateTime, Utc};
use trainyard_contracts::cost::{CapacityChosen, CostRecorded, IdleSuspendRequested};
use trainyard_contracts::decisions::{
    AdmissionDecided, CheckpointIntervalAdvised, CheckpointVerified, ModelRegistered,
    PendingExplained, PreemptionDecided, ResumePointChosen, TrialStopped,
};
use trainyard_contracts::events::{Change, JobEventObserved, JobObserved, PodObserved};
use trainyard_contracts::worker::{CheckpointReported, ProgressReported};

use crate::cost::{CostSeen, IdleSuspendSeen};
use crate::failure::{FailureCause, WorkerFailure};
use crate::status::MetricGoal;

/// Job condition types that mean the Job finished successfully.
const JOB_SUCCESS_CONDITIONS: [&str; 2] = ["Complete", "SuccessCriteriaMet"];
/// Job condition types that mean the Job failed (FailureTarget comes first, since 1.31).
const JOB_FAILURE_CONDITIONS: [&str; 2] = ["Failed", "FailureTarget"];
/// Admissions kept for attempts not started yet; the allocator admits at most the next one.
const MAX_EARLY_ADMISSIONS: usize = 4;
/// Epochs of metrics kept in a job's state: enough for any early-stopping
/// patience in practice, and it keeps the state of a long job well under the
/// store's 1 MiB value limit. The full history belongs to the tracking server.
pub const MAX_EPOCH_METRICS: usize = 512;
/// Metric names whose best value is kept for epochs dropped from the window.
const MAX_EARLIER_BEST: usize = 64;

/// A message about one TrainingJob that the planner folds into its state.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The watcher saw one of the job's Kubernetes Jobs change.
    Job(JobObserved),
    /// The watcher saw one of the job's worker pods change.
    Pod(PodObserved),
    /// The watcher saw a Warning Event about one of the job's Jobs.
    JobEvent(JobEventObserved),
    /// A worker reported training progress.
    Progress(ProgressReported),
    /// A worker reported a checkpoint.
    Checkpoint(CheckpointReported),
    /// The gpu-allocator admitted an attempt.
    Admission(AdmissionDecided),
    /// The gpu-allocator explained why the job still waits.
    Pending(PendingExplained),
    /// The gpu-allocator decided to preempt the running attempt.
    Preemption(PreemptionDecided),
    /// The checkpoint-manager chose where the next attempt resumes.
    ResumePoint(ResumePointChosen),
    /// The checkpoint-manager checked a reported checkpoint.
    CheckpointVerified(CheckpointVerified),
    /// The checkpoint-manager advised a save interval.
    IntervalAdvised(CheckpointIntervalAdvised),
    /// The checkpoint-manager registered the best checkpoint as a model version.
    ModelRegistered(ModelRegistered),
    /// The hpo-tuner stopped this trial early.
    TrialStopped(TrialStopped),
    /// The cost-optimizer chose the capacity type (`capacityType: any`).
    Capacity(CapacityChosen),
    /// The cost-optimizer recorded an accounting interval's cost.
    Cost(CostRecorded),
    /// The cost-optimizer found the job's GPUs idle and asks for its suspension.
    IdleSuspend(IdleSuspendRequested),
}

/// What [`observe`] did with an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The state changed or was confirmed.
    Recorded,
    /// The observation is about an attempt older than the current one.
    StaleAttempt { attempt: u32, current: u32 },
    /// A worker report names an attempt the planner has not seen start.
    FutureAttempt { attempt: u32, current: u32 },
    /// The observation has nothing to act on in the current situation (a pending
    /// explanation after admission, a preemption of a job that holds nothing, a second
    /// admission of a running attempt).
    NotApplicable,
}

/// A checkpoint the job can resume from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSeen {
    pub uri: String,
    pub epoch: u32,
    pub step: u64,
    pub at: DateTime<Utc>,
}

/// Latest progress of the job (worker 0's reports).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressSeen {
    pub attempt: u32,
    pub epoch: u32,
    pub total_epochs: Option<u32>,
    pub step: u64,
    #[serde(
        deserialize_with = "trainyard_contracts::non_finite::deserialize_metrics",
        serialize_with = "trainyard_contracts::non_finite::serialize_metrics"
    )]
    pub metrics: BTreeMap<String, f64>,
    pub at: DateTime<Utc>,
}

/// Worker 0's metrics of one epoch, for the success policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    #[serde(
        deserialize_with = "trainyard_contracts::non_finite::deserialize_metrics",
        serialize_with = "trainyard_contracts::non_finite::serialize_metrics"
    )]
    pub metrics: BTreeMap<String, f64>,
    pub at: DateTime<Utc>,
}

/// The best value of one metric among the epochs dropped from the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BestMetric {
    pub value: f64,
    pub epoch: u32,
}

/// A preemption decision and when it arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionSeen {
    pub decision: PreemptionDecided,
    pub at: DateTime<Utc>,
}

/// A trial stop and when it arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialStopSeen {
    pub decision: TrialStopped,
    pub at: DateTime<Utc>,
}

/// Everything known about one attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    /// The admission of this attempt, frozen once the attempt started.
    pub admission: Option<AdmissionDecided>,
    /// Latest state of the attempt's Job.
    pub job: Option<JobObserved>,
    /// The Job was deleted (by the planner, or by someone else).
    pub job_deleted: bool,
    /// The workers ran at some point (the Job started, a pod ran, a worker reported).
    pub ever_started: bool,
    /// Latest state of each worker pod, by index.
    pub pods: BTreeMap<u32, PodObserved>,
    /// The first failure; later ones are the Job controller killing the rest of the gang.
    pub failure: Option<WorkerFailure>,
    /// When the Job succeeded.
    pub succeeded_at: Option<DateTime<Utc>>,
    /// A preemption of this attempt.
    pub preemption: Option<PreemptionSeen>,
    /// A checkpoint was reported after the preemption decision: the workers may go.
    pub checkpointed_since_preemption: bool,
    /// Some worker of this attempt reported progress.
    pub progress_reported: bool,
    /// Since when some worker pod has been unschedulable (no node fits it),
    /// without a break.
    #[serde(default)]
    pub unschedulable_since: Option<DateTime<Utc>>,
    /// When the Job was first seen unsuspended: the workers may start from then
    /// on, and `pods_ready_timeout_seconds` counts from it.
    #[serde(default)]
    pub unsuspended_at: Option<DateTime<Utc>>,
    /// The most workers seen running at once (pods in phase Running, or the
    /// Job's `ready`), so a gang that once ran all its workers is known to
    /// have started after they are gone.
    #[serde(default)]
    pub most_workers_running: u32,
    /// The latest Warning Event saying why the Job's pods could not be
    /// created (`FailedCreate`).
    #[serde(default)]
    pub creation_failure: Option<JobEventObserved>,
}

impl AttemptRecord {
    fn new(attempt: u32) -> Self {
        Self {
            attempt,
            ..Self::default()
        }
    }

    /// Worker pods currently in phase Running.
    pub fn running_pods(&self) -> u32 {
        let running = self.pods.values().filter(|p| p.phase == "Running").count();
        u32::try_from(running).unwrap_or(u32::MAX)
    }

    /// True when the Job exists and its workers may be running or about to run.
    pub fn job_live(&self) -> bool {
        self.job.is_some()
            && !self.job_deleted
            && self.succeeded_at.is_none()
            && self.failure.is_none()
    }

    /// The first worker pod the scheduler found no node for, with its message.
    pub fn unschedulable_worker(&self) -> Option<(u32, &str)> {
        self.pods.values().find_map(|pod| {
            let condition = pod.conditions.iter().find(|c| {
                c.condition_type == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })?;
            Some((
                pod.index,
                condition.message.as_deref().unwrap_or("no node fits"),
            ))
        })
    }

    /// Distinct nodes the workers run on, sorted.
    pub fn nodes(&self) -> Vec<String> {
        let nodes: BTreeSet<&str> = self
            .pods
            .values()
            .filter_map(|p| p.node_name.as_deref())
            .collect();
        nodes.into_iter().map(str::to_owned).collect()
    }
}

/// The planner's knowledge of one TrainingJob.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlannerJobState {
    /// The attempt the planner is driving.
    pub current: AttemptRecord,
    /// Admissions that arrived before their attempt started (during a restart backoff).
    pub early_admissions: BTreeMap<u32, AdmissionDecided>,
    /// Attempts that ended in a failure and were followed by another attempt:
    /// the restarts spent against `failurePolicy.backoffLimit`. Preemptions, user
    /// suspends, deleted Jobs and disruptions Kubernetes reports (spot reclaims,
    /// evictions, node loss: a Job's podFailurePolicy `Ignore` on
    /// `DisruptionTarget`) do not count.
    pub failed_attempts: u32,
    /// When the workers first started, over all attempts.
    pub first_started_at: Option<DateTime<Utc>>,
    /// Why the current attempt, or the one after it, still waits for admission
    /// (see `waiting_reason`).
    pub pending: Option<PendingExplained>,
    /// Where the next attempt resumes: the checkpoint-manager's latest choice, the
    /// newest verified checkpoint. A reported checkpoint is never resumed from
    /// until the manager has verified it.
    pub resume_point: Option<ResumePointChosen>,
    /// The checkpoint-manager's latest verification, with the job's checkpoint summary.
    #[serde(default)]
    pub checkpoint_summary: Option<CheckpointVerified>,
    /// The checkpoint-manager's advised save interval.
    #[serde(default)]
    pub interval_advice: Option<CheckpointIntervalAdvised>,
    /// The model version the best checkpoint was registered as.
    #[serde(default)]
    pub model: Option<ModelRegistered>,
    /// Newest checkpoint reported.
    pub latest_checkpoint: Option<CheckpointSeen>,
    /// Distinct checkpoint locations reported.
    pub checkpoint_uris: BTreeSet<String>,
    /// Worker 0's latest progress.
    pub progress: Option<ProgressSeen>,
    /// Worker 0's metrics by epoch, the newest `MAX_EPOCH_METRICS` epochs.
    pub epoch_metrics: BTreeMap<u32, EpochMetrics>,
    /// Per metric, the best value of the epochs dropped from `epoch_metrics`,
    /// so the success policy still compares against it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub earlier_best: BTreeMap<String, BestMetric>,
    /// The hpo-tuner stopped this trial.
    pub trial_stop: Option<TrialStopSeen>,
    /// Money spent and the capacity choice, from the cost-optimizer.
    #[serde(default)]
    pub cost: Option<CostSeen>,
    /// The cost-optimizer's request to suspend the job for idle GPUs.
    #[serde(default)]
    pub idle_suspend: Option<IdleSuspendSeen>,
}

impl PlannerJobState {
    /// A state for a job the planner has not heard about yet (attempt 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// The attempt the planner is driving.
    pub fn attempt(&self) -> u32 {
        self.current.attempt
    }

    /// Moves on to a newer attempt: the current one is over.
    fn advance_to(&mut self, attempt: u32) {
        let finished = std::mem::replace(&mut self.current, AttemptRecord::new(attempt));
        // A failure during a preemption window is the eviction, not the program;
        // a disruption is the infrastructure's, not the program's.
        let program_failed = finished
            .failure
            .as_ref()
            .is_some_and(|failure| !matches!(failure.cause, FailureCause::Disrupted { .. }));
        if program_failed && finished.preemption.is_none() {
            self.failed_attempts = self.failed_attempts.saturating_add(1);
        }
        self.current.admission = self.early_admissions.remove(&attempt);
        self.early_admissions
            .retain(|candidate, _| *candidate > attempt);
        // The allocator may explain an attempt's wait before the planner starts
        // it (the explanation follows the preemption, not the new Job), and it
        // says so only once: an explanation of this attempt or a later one stays.
        let admitted = self.current.admission.is_some();
        self.pending = self
            .pending
            .take()
            .filter(|pending| !admitted && pending.attempt.is_some_and(|a| a >= attempt));
    }

    /// Folds an epoch leaving the metrics window into the best values kept.
    fn keep_best(&mut self, epoch: u32, metrics: &BTreeMap<String, f64>) {
        for (name, &value) in metrics {
            if !value.is_finite() {
                continue;
            }
            let improves = self
                .earlier_best
                .get(name)
                .map_or(self.earlier_best.len() < MAX_EARLIER_BEST, |best| {
                    MetricGoal::for_metric(name).improves(value, best.value)
                });
            if improves {
                self.earlier_best
                    .insert(name.clone(), BestMetric { value, epoch });
            }
        }
    }

    /// Why the current attempt waits, if the allocator has said.
    pub fn waiting_reason(&self) -> Option<&PendingExplained> {
        self.pending
            .as_ref()
            .filter(|pending| pending.attempt.is_none_or(|a| a == self.current.attempt))
    }

    /// Places an attempt number relative to the current attempt, moving on when
    /// `may_advance` and it is newer.
    fn place(&mut self, attempt: u32, may_advance: bool) -> Result<(), Observed> {
        let current = self.current.attempt;
        if attempt < current {
            return Err(Observed::StaleAttempt { attempt, current });
        }
        if attempt > current {
            if !may_advance {
                return Err(Observed::FutureAttempt { attempt, current });
            }
            self.advance_to(attempt);
        }
        Ok(())
    }

    fn mark_started(&mut self, at: DateTime<Utc>) {
        self.current.ever_started = true;
        if self.first_started_at.is_none_or(|first| at < first) {
            self.first_started_at = Some(at);
        }
    }

    fn observe_job(&mut self, job: JobObserved, at: DateTime<Utc>) -> Observed {
        if let Err(outcome) = self.place(job.attempt, true) {
            return outcome;
        }
        let record = &mut self.current;
        if job.change == Change::Deleted {
            record.job_deleted = true;
            return Observed::Recorded;
        }
        let holds = |types: &[&str]| {
            job.conditions
                .iter()
                .find(|c| types.contains(&c.condition_type.as_str()) && c.status == "True")
                .cloned()
        };
        let succeeded = holds(&JOB_SUCCESS_CONDITIONS);
        let failed = holds(&JOB_FAILURE_CONDITIONS);
        let started_at = job.start_time;
        let running = started_at.is_some() || job.active > 0;
        if succeeded.is_some() && record.succeeded_at.is_none() {
            record.succeeded_at = Some(job.completion_time.unwrap_or(at));
        }
        if let Some(condition) = failed
            && record.failure.is_none()
            && record.succeeded_at.is_none()
        {
            record.failure = Some(WorkerFailure::from_job_condition(
                condition.reason.as_deref(),
                at,
            ));
        }
        if !job.suspended && record.unsuspended_at.is_none() {
            record.unsuspended_at = Some(at);
        }
        record.most_workers_running = record.most_workers_running.max(job.ready);
        record.job = Some(job);
        if running {
            self.mark_started(started_at.unwrap_or(at));
        }
        Observed::Recorded
    }

    fn observe_pod(&mut self, pod: PodObserved, at: DateTime<Utc>) -> Observed {
        if let Err(outcome) = self.place(pod.attempt, true) {
            return outcome;
        }
        if pod.change == Change::Deleted {
            // The Job controller counts a vanished pod as failed and fails the Job;
            // the Job's condition reports that. Deletions after the planner deleted the
            // Job are the garbage collector at work. A gone pod has no gate to lift.
            if let Some(known) = self.current.pods.get_mut(&pod.index)
                && known.pod_name == pod.pod_name
            {
                known.scheduling_gates.clear();
            }
            return Observed::Recorded;
        }
        if pod.phase == "Running" {
            self.mark_started(at);
        }
        let record = &mut self.current;
        let failed_here =
            pod.phase == "Failed" && !record.job_deleted && record.succeeded_at.is_none();
        if failed_here
            && record
                .failure
                .as_ref()
                .is_none_or(|f| f.cause.is_unspecific())
        {
            let mut failure = WorkerFailure::from_pod(&pod, at);
            // Keep the time the attempt was first known to have failed.
            if let Some(earlier) = &record.failure {
                failure.at = earlier.at;
            }
            record.failure = Some(failure);
        }
        record.pods.insert(pod.index, pod);
        record.most_workers_running = record.most_workers_running.max(record.running_pods());
        record.unschedulable_since = match record.unschedulable_worker() {
            Some(_) => record.unschedulable_since.or(Some(at)),
            None => None,
        };
        Observed::Recorded
    }

    fn observe_job_event(&mut self, event: JobEventObserved) -> Observed {
        // An expired Event takes nothing back: the pods were refused.
        if event.change == Change::Deleted {
            return Observed::NotApplicable;
        }
        if let Err(outcome) = self.place(event.attempt, true) {
            return outcome;
        }
        self.current.creation_failure = Some(event);
        Observed::Recorded
    }

    fn observe_progress(&mut self, report: ProgressReported, at: DateTime<Utc>) -> Observed {
        if let Err(outcome) = self.place(report.attempt, false) {
            return outcome;
        }
        self.mark_started(at);
        self.current.progress_reported = true;
        if report.worker_index != 0 {
            return Observed::Recorded;
        }
        let newer = self.progress.as_ref().is_none_or(|seen| {
            seen.attempt < report.attempt || (seen.epoch, seen.step) <= (report.epoch, report.step)
        });
        if newer {
            self.epoch_metrics.insert(
                report.epoch,
                EpochMetrics {
                    metrics: report.metrics.clone(),
                    at,
                },
            );
            while self.epoch_metrics.len() > MAX_EPOCH_METRICS {
                if let Some((epoch, dropped)) = self.epoch_metrics.pop_first() {
                    self.keep_best(epoch, &dropped.metrics);
                }
            }
            self.progress = Some(ProgressSeen {
                attempt: report.attempt,
                epoch: report.epoch,
                total_epochs: report.total_epochs,
                step: report.step,
                metrics: report.metrics,
                at,
            });
        }
        Observed::Recorded
    }

    fn observe_checkpoint(&mut self, report: CheckpointReported, at: DateTime<Utc>) -> Observed {
        if let Err(outcome) = self.place(report.attempt, false) {
            return outcome;
        }
        if self.current.preemption.is_some() {
            self.current.checkpointed_since_preemption = true;
        }
        self.checkpoint_uris.insert(report.uri.clone());
        let newer = self
            .latest_checkpoint
            .as_ref()
            .is_none_or(|seen| (seen.epoch, seen.step) <= (report.epoch, report.step));
        if newer {
            self.latest_checkpoint = Some(CheckpointSeen {
                uri: report.uri,
                epoch: report.epoch,
                step: report.step,
                at,
            });
        }
        Observed::Recorded
    }

    fn observe_admission(&mut self, admission: AdmissionDecided) -> Observed {
        let current = self.current.attempt;
        if admission.attempt < current {
            return Observed::StaleAttempt {
                attempt: admission.attempt,
                current,
            };
        }
        if admission.attempt > current {
            self.early_admissions.insert(admission.attempt, admission);
            while self.early_admissions.len() > MAX_EARLY_ADMISSIONS {
                self.early_admissions.pop_last();
            }
            return Observed::Recorded;
        }
        // A started Job's node selector and tolerations are immutable; a new admission
        // for it cannot be applied (a re-admission is always for a new attempt).
        if self.current.ever_started && self.current.admission.is_some() {
            return Observed::NotApplicable;
        }
        self.current.admission = Some(admission);
        self.pending = None;
        Observed::Recorded
    }

    fn observe_pending(&mut self, pending: PendingExplained) -> Observed {
        let current = self.current.attempt;
        match pending.attempt {
            Some(attempt) if attempt < current => {
                return Observed::StaleAttempt { attempt, current };
            }
            Some(attempt) if attempt > current => {
                self.pending = Some(pending);
                return Observed::Recorded;
            }
            _ => {}
        }
        if self.current.admission.is_some() {
            return Observed::NotApplicable;
        }
        self.pending = Some(pending);
        Observed::Recorded
    }

    fn observe_preemption(&mut self, decision: PreemptionDecided, at: DateTime<Utc>) -> Observed {
        let record = &mut self.current;
        let holds_gpus = record.admission.is_some() || record.ever_started;
        if !holds_gpus || record.job_deleted || record.preemption.is_some() {
            // Nothing to preempt, or already being preempted: the first decision's grace
            // period stands.
            return Observed::NotApplicable;
        }
        record.preemption = Some(PreemptionSeen { decision, at });
        Observed::Recorded
    }
}

/// Folds one observation, made known at `at` (the message time), into `state`.
pub fn observe(
    state: &mut PlannerJobState,
    at: DateTime<Utc>,
    observation: Observation,
) -> Observed {
    match observation {
        Observation::Job(job) => state.observe_job(job, at),
        Observation::Pod(pod) => state.observe_pod(pod, at),
        Observation::JobEvent(event) => state.observe_job_event(event),
        Observation::Progress(report) => state.observe_progress(report, at),
        Observation::Checkpoint(report) => state.observe_checkpoint(report, at),
        Observation::Admission(admission) => state.observe_admission(admission),
        Observation::Pending(pending) => state.observe_pending(pending),
        Observation::Preemption(decision) => state.observe_preemption(decision, at),
        Observation::ResumePoint(point) => {
            state.resume_point = Some(point);
            Observed::Recorded
        }
        Observation::CheckpointVerified(verified) => {
            state.note_verified_for_idle_suspend(&verified, at);
            state.checkpoint_summary = Some(verified);
            Observed::Recorded
        }
        Observation::IntervalAdvised(advice) => {
            state.interval_advice = Some(advice);
            Observed::Recorded
        }
        Observation::ModelRegistered(model) => {
            // A refusal without a version leaves the last registered one in status.
            if !model.version.is_empty() {
                state.model = Some(model);
            }
            Observed::Recorded
        }
        Observation::TrialStopped(decision) => {
            if state.trial_stop.is_none() {
                state.trial_stop = Some(TrialStopSeen { decision, at });
            }
            Observed::Recorded
        }
        Observation::Capacity(chosen) => state.observe_capacity(chosen),
        Observation::Cost(record) => state.observe_cost(record),
        Observation::IdleSuspend(request) => state.observe_idle_suspend(request, at),
    }
}
