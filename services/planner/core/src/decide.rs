//! What the planner does next for one TrainingJob: decisions as data.
//!
//! [`decide`] is a pure function of the TrainingJob object (spec, metadata and the
//! status the planner last wrote), the folded [`PlannerJobState`] and the time. It
//! returns [`PlannerAction`]s for a thin shell to carry out. The status written last
//! time is the planner's only memory of its own earlier decisions: one-shot effects
//! (lifecycle transitions, commands to workers, Kubernetes events) are emitted when
//! the newly computed status differs from it, and carry a deduplication key so that a
//! decision replayed before its status write landed publishes nothing twice.
//!
//! The shell runs the actions in the order given: objects first (apply, delete), then
//! timers, commands, events and transitions, and the status update last, so a status
//! never claims something that was not done.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use trainyard_api::{
    AllocatedResources, CheckpointFrequency, CheckpointStatus, Condition, ConditionStatus,
    QueueStatus, RestartPolicy, TrainingJob, TrainingJobSpec, TrainingJobState, TrainingJobStatus,
    WorkerCounts, find_condition, set_condition,
};
use trainyard_contracts::commands::{CheckpointIntervalSet, CheckpointRequested, StopRequested};
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::lifecycle::TrainingJobTransitioned;

use crate::checkpoints::resume_reason;
use crate::config::PlannerConfig;
use crate::error::PlanError;
use crate::failure::{FailureCause, WorkerFailure};
use crate::names::{PLACEMENT_GATE, job_name};
use crate::objects::{DesiredObjects, JobPlan, desired_objects};
use crate::state::{AttemptRecord, PlannerJobState};
use crate::status::{MetricGoal, elapsed, format_duration, from_time, progress_percent, to_time};

/// Condition: the current attempt holds an admission (its GPUs are reserved).
pub const CONDITION_ADMITTED: &str = "Admitted";
/// Condition: all workers are running (or training has reported progress).
pub const CONDITION_RUNNING: &str = "Running";
/// Condition: the user suspended the job.
pub const CONDITION_SUSPENDED: &str = "Suspended";
/// Condition: the gpu-allocator preempted the job; it resumes after re-admission.
pub const CONDITION_PREEMPTED: &str = "Preempted";
/// Condition: the job completed.
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
/// Condition: the job failed for good.
pub const CONDITION_FAILED: &str = "Failed";
/// Condition: the current attempt's workers all run (True), or an attempt's
/// pods were not created or not ready within `pods_ready_timeout_seconds`
/// (False). Set once the timeout first passes; True again when workers run.
pub const CONDITION_PODS_READY: &str = "PodsReady";
/// `PodsReady` reason: some of the attempt's pods were never created.
pub const REASON_PODS_NOT_CREATED: &str = "PodsNotCreated";
/// `PodsReady` reason: the pods exist but not all of them run.
pub const REASON_PODS_NOT_READY: &str = "PodsNotReady";
/// Condition: some node the job may use could hold it. False (reason
/// [`REASON_UNSCHEDULABLE`]) while the gpu-allocator finds none could, even
/// with the cluster empty; set True again once one could. Absent on jobs
/// that never were unschedulable.
pub const CONDITION_SCHEDULABLE: &str = trainyard_api::CONDITION_SCHEDULABLE;
/// Reason of `Schedulable: False`, and of `Admitted: False` meanwhile.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";
/// Reason of `Admitted: False` while the job's queue's pod policy does not
/// allow something its pods ask for (TrainingQueue `spec.podPolicy`).
pub const REASON_POD_POLICY_REFUSED: &str = "PodPolicyRefused";

/// Kind of Kubernetes Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// A command to the job's workers, published on its commands subject.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum PlannerCommand {
    /// Stop training (success policy met, trial stopped early).
    Stop(StopRequested),
    /// Write a checkpoint now (preemption, suspend).
    CheckpointNow(CheckpointRequested),
    /// Save checkpoints at the advised interval (`checkpoint.frequency: auto`).
    CheckpointInterval(CheckpointIntervalSet),
}

/// One thing for the planner's shell to do.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum PlannerAction {
    /// Server-side apply the ConfigMap, the Service and the Job, in that order.
    ApplyObjects(Box<DesiredObjects>),
    /// Delete a Job of this TrainingJob with `propagationPolicy: Background`: the API's
    /// default for Jobs orphans their pods, and Background (unlike Foreground) makes
    /// the Job disappear at once so its deletion is observed before its pods' ends.
    DeleteJob { name: String },
    /// Remove [`PLACEMENT_GATE`] from a worker pod and, in the same write, add
    /// `kubernetes.io/hostname: node` to its node selector: the node its
    /// admission placed its completion index on (none when the admission has
    /// no placement for that index: the pod keeps the pin to the planned set).
    ///
    /// [`PLACEMENT_GATE`]: crate::PLACEMENT_GATE
    UngateWorker {
        pod_name: String,
        node: Option<String>,
    },
    /// Decide again after `delay`; attempt `attempt` starts then (restart backoff).
    RecreateAfter { attempt: u32, delay: Duration },
    /// Decide again after `delay` (a deadline, a grace period).
    RecheckAfter { delay: Duration, reason: String },
    /// Publish a command to the workers, with `dedup_key` as `Nats-Msg-Id`.
    SendCommand {
        command: PlannerCommand,
        dedup_key: String,
    },
    /// Record a Kubernetes Event on the TrainingJob.
    RecordEvent {
        event_type: EventType,
        reason: String,
        message: String,
    },
    /// Publish the lifecycle transition, with `dedup_key` as `Nats-Msg-Id`.
    PublishTransition {
        transition: Box<TrainingJobTransitioned>,
        dedup_key: String,
    },
    /// Write the TrainingJob's status subresource.
    UpdateStatus(Box<TrainingJobStatus>),
    /// Set the TrainingJob's `spec.suspend` to true: its GPUs sat idle and a
    /// checkpoint written since was verified (see `decide/idle.rs`).
    SuspendJob { reason: String },
}

pub(crate) mod idle;
mod pods_ready;

/// Decides what to do next for `job`; see the module documentation.
pub fn decide(
    job: &TrainingJob,
    state: &PlannerJobState,
    now: DateTime<Utc>,
    config: &PlannerConfig,
) -> Vec<PlannerAction> {
    // Owner references hand the children to the garbage collector.
    if job.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let unset = TrainingJobStatus::default();
    let previous = job.status.as_ref().unwrap_or(&unset);
    let context = Context {
        job,
        state,
        previous,
        now,
        config,
    };
    if previous.state.is_some_and(|s| s.is_terminal()) {
        let mut actions = context.terminal_cleanup();
        // A worker's last reports can arrive after the Job's end (they travel on
        // another stream); they still describe the final attempt.
        // A job stopped early keeps the progress it reached.
        let mut status = previous.clone();
        context.fold_reports(
            &mut status,
            previous.state == Some(TrainingJobState::Completed) && context.early_stop().is_none(),
        );
        if status != *previous {
            actions.push(PlannerAction::UpdateStatus(Box::new(status)));
        }
        return actions;
    }
    let verdict = context.idle_suspension(context.judge());
    context.finish(verdict)
}

/// The inputs of one decision.
struct Context<'a> {
    job: &'a TrainingJob,
    state: &'a PlannerJobState,
    previous: &'a TrainingJobStatus,
    now: DateTime<Utc>,
    config: &'a PlannerConfig,
}

/// Where the current attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No Job observed yet.
    NotCreated,
    /// Job suspended, no admission.
    Queued,
    /// Job suspended, admission present: unsuspend it.
    Admitted,
    /// Job running, not every worker yet.
    Starting,
    /// Every worker running, or training reported progress.
    Running,
    /// The Job succeeded.
    Succeeded(DateTime<Utc>),
    /// A worker (or the Job) failed.
    Failed,
    /// The Job was deleted without finishing.
    Gone,
}

impl Phase {
    fn of(record: &AttemptRecord, spec: &TrainingJobSpec) -> Self {
        if let Some(at) = record.succeeded_at {
            return Self::Succeeded(at);
        }
        if record.failure.is_some() {
            return Self::Failed;
        }
        if record.job_deleted {
            return Self::Gone;
        }
        let Some(job) = &record.job else {
            return if record.ever_started {
                Self::Starting
            } else {
                Self::NotCreated
            };
        };
        if job.suspended {
            return if record.admission.is_some() {
                Self::Admitted
            } else {
                Self::Queued
            };
        }
        let all_running =
            record.running_pods() >= spec.num_workers || job.ready >= spec.num_workers;
        if record.progress_reported || all_running {
            Self::Running
        } else {
            Self::Starting
        }
    }
}

/// A condition to set: status, reason, message.
#[derive(Debug, Clone, PartialEq)]
struct ConditionUpdate {
    status: ConditionStatus,
    reason: String,
    message: String,
}

impl ConditionUpdate {
    fn new(status: ConditionStatus, reason: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

/// The outcome of judging the job, before it is turned into status and actions.
#[derive(Debug, Clone)]
struct Verdict {
    state: TrainingJobState,
    reason: String,
    message: String,
    /// Attempt the status describes; `status.restartCount` is this number.
    attempt: u32,
    admitted: ConditionUpdate,
    /// None leaves the Preempted condition as it is.
    preempted: Option<ConditionUpdate>,
    /// The attempt's admission, when it holds GPUs.
    allocation: Option<AdmissionDecided>,
    failure_reason: Option<String>,
    completion_time: Option<DateTime<Utc>>,
    /// Apply, delete and timer actions, in order.
    actions: Vec<PlannerAction>,
    /// Send a Stop command when the job enters this verdict's state.
    stop_reason: Option<String>,
    /// Ask for a checkpoint (reason, deadline) when entering this verdict's state, or,
    /// for a preemption, when the Preempted condition turns True.
    checkpoint_now: Option<(String, DateTime<Utc>)>,
    /// Warning event when the Admitted condition newly gets this reason.
    admission_warning: bool,
    /// Record the state change as a Warning event.
    warning: bool,
    /// The Suspended condition when something other than the state says
    /// what it is (an idle suspension under way or done); None: from the state.
    suspended: Option<ConditionUpdate>,
    /// The PodsReady condition after a pods-ready timeout; None leaves it.
    pods_ready: Option<ConditionUpdate>,
    /// `status.podsReadyRequeues` after a pods-ready timeout; None leaves it.
    pods_ready_requeues: Option<u32>,
    /// Every worker of the attempt runs: PodsReady turns True, the requeue
    /// count is cleared.
    workers_ready: bool,
}

impl Verdict {
    fn new(
        state: TrainingJobState,
        attempt: u32,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        let message = message.into();
        Self {
            state,
            reason: reason.to_owned(),
            attempt,
            admitted: ConditionUpdate::new(ConditionStatus::False, reason, message.clone()),
            message,
            preempted: None,
            allocation: None,
            failure_reason: None,
            completion_time: None,
            actions: Vec::new(),
            stop_reason: None,
            checkpoint_now: None,
            admission_warning: false,
            warning: false,
            suspended: None,
            pods_ready: None,
            pods_ready_requeues: None,
            workers_ready: false,
        }
    }

    fn failed(attempt: u32, reason: &str, message: String, at: DateTime<Utc>) -> Self {
        let mut verdict = Self::new(TrainingJobState::Failed, attempt, reason, message.clone());
        verdict.admitted = ConditionUpdate::new(
            ConditionStatus::False,
            "Finished",
            "the job failed; GPUs released",
        );
        verdict.failure_reason = Some(format!("{reason}: {message}"));
        verdict.completion_time = Some(at);
        verdict.warning = true;
        verdict
    }

    fn completed(attempt: u32, reason: &str, message: String, at: DateTime<Utc>) -> Self {
        let mut verdict = Self::new(TrainingJobState::Completed, attempt, reason, message);
        verdict.admitted = ConditionUpdate::new(
            ConditionStatus::False,
            "Finished",
            "the job completed; GPUs released",
        );
        verdict.completion_time = Some(at);
        verdict
    }
}

/// Why training ends before its Job does.
struct EarlyStop {
    reason: &'static str,
    message: String,
    at: DateTime<Utc>,
}

/// Outcome of building an attempt's objects.
enum Built {
    /// Objects with the given admission (or none).
    Ready(Box<DesiredObjects>),
    /// The admission was unusable; objects without it (suspended), and why.
    WithoutAdmission(Box<DesiredObjects>, PlanError),
}

fn add_seconds(at: DateTime<Utc>, seconds: u64) -> DateTime<Utc> {
    let delta = i64::try_from(seconds)
        .ok()
        .and_then(TimeDelta::try_seconds)
        .unwrap_or(TimeDelta::MAX);
    at.checked_add_signed(delta)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn add_duration(at: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    add_seconds(at, duration.as_secs())
}

impl Context<'_> {
    fn spec(&self) -> &TrainingJobSpec {
        &self.job.spec
    }

    fn record(&self) -> &AttemptRecord {
        &self.state.current
    }

    fn name(&self) -> &str {
        self.job.metadata.name.as_deref().unwrap_or_default()
    }

    fn uid(&self) -> &str {
        self.job.metadata.uid.as_deref().unwrap_or_default()
    }

    fn delete_current_job(&self) -> PlannerAction {
        PlannerAction::DeleteJob {
            name: job_name(self.name(), self.record().attempt),
        }
    }

    /// Judges the job: what state it is in and what must happen.
    fn judge(&self) -> Verdict {
        let spec = self.spec();
        let record = self.record();
        let attempt = record.attempt;
        // Pre-flight runs whenever objects are built (`desired_objects` starts with it),
        // so a job that cannot run fails before its first Job exists; a running attempt
        // is not failed because, say, the configured node size shrank under it.
        let phase = Phase::of(record, spec);
        // Workers told to stop exit cleanly: their Job succeeds, and the job
        // still stopped early, at the progress it had reached.
        let early_stop = self
            .early_stop()
            .filter(|stop| !matches!(phase, Phase::Succeeded(at) if stop.at > at));
        if let Some(stop) = early_stop {
            let mut verdict =
                Verdict::completed(attempt, stop.reason, stop.message.clone(), stop.at);
            verdict.stop_reason = Some(stop.message);
            if !matches!(phase, Phase::Succeeded(_)) {
                verdict.actions.extend(self.stop_cleanup(stop.at));
            }
            return verdict;
        }
        if let Phase::Succeeded(at) = phase {
            let message = format!("all {} workers finished successfully", spec.num_workers);
            return Verdict::completed(attempt, "Succeeded", message, at);
        }
        if let Some(verdict) = self.deadline_verdict(phase) {
            return verdict;
        }
        if phase == Phase::Failed
            && record.preemption.is_none()
            && let Some(failure) = &record.failure
        {
            return self.after_failure(failure);
        }
        if spec.is_suspended() {
            return self.suspended(phase);
        }
        if self.previous.state == Some(TrainingJobState::Suspended) && self.still_stopping(phase) {
            let mut verdict = Verdict::new(
                TrainingJobState::Pending,
                attempt,
                "Resuming",
                format!(
                    "waiting for the Job of suspended attempt {attempt} to be deleted before attempt {} starts",
                    attempt.saturating_add(1)
                ),
            );
            verdict.actions.push(self.delete_current_job());
            return verdict;
        }
        if let Some(preemption) = &record.preemption {
            return self.preempted(phase, &preemption.decision);
        }
        // A worker without a node is a matter of capacity, left to its own
        // timeout (which spends no requeue) while that one is set.
        if let Some(deadline) = self.pods_ready_deadline()
            && self.now >= deadline
            && self.unschedulable_deadline().is_none()
            && matches!(phase, Phase::Starting | Phase::Gone)
        {
            return self.pods_not_ready(deadline);
        }
        if let Some(deadline) = self.unschedulable_deadline()
            && self.now >= deadline
            && matches!(phase, Phase::Starting | Phase::Gone)
        {
            return self.requeued_unschedulable();
        }
        let mut verdict = self.progression(phase);
        verdict.actions.extend(self.ungated_workers());
        verdict
    }

    /// The current attempt's gated worker pods, each given the node its index
    /// was admitted onto (see [`PlannerAction::UngateWorker`]).
    fn ungated_workers(&self) -> impl Iterator<Item = PlannerAction> + '_ {
        let record = self.record();
        let admission = record.admission.as_ref().filter(|_| record.job_live());
        admission.into_iter().flat_map(move |admission| {
            record
                .pods
                .values()
                .filter(|pod| pod.scheduling_gates.iter().any(|g| g == PLACEMENT_GATE))
                .map(|pod| PlannerAction::UngateWorker {
                    pod_name: pod.pod_name.clone(),
                    node: admission
                        .placements
                        .iter()
                        .find(|p| p.index == pod.index)
                        .map(|p| p.node.clone()),
                })
        })
    }

    /// True when a suspended attempt's Job has not been seen gone yet.
    fn still_stopping(&self, phase: Phase) -> bool {
        let record = self.record();
        let consumed = record.admission.is_some() || record.ever_started;
        consumed && !matches!(phase, Phase::Gone | Phase::NotCreated)
    }

    /// Success policy met or trial stopped: training ends before its Job does.
    fn early_stop(&self) -> Option<EarlyStop> {
        if let Some(stop) = &self.state.trial_stop {
            let rung = stop
                .decision
                .rung
                .map(|rung| format!(" at rung {rung}"))
                .unwrap_or_default();
            return Some(EarlyStop {
                reason: "TrialEarlyStopped",
                message: format!(
                    "the hpo-tuner stopped this trial{rung}: {}",
                    stop.decision.reason
                ),
                at: stop.at,
            });
        }
        let policy = self.spec().success_policy.as_ref()?;
        let metric = self.spec().success_metric();
        let goal = MetricGoal::for_metric(metric);
        // Epochs dropped from the window were decided on when they arrived;
        // only their best value still matters, for the patience.
        let mut best = self
            .state
            .earlier_best
            .get(metric)
            .map(|earlier| (earlier.value, earlier.epoch));
        for (epoch, reported) in &self.state.epoch_metrics {
            let Some(value) = reported
                .metrics
                .get(metric)
                .copied()
                .filter(|v| v.is_finite())
            else {
                continue;
            };
            if let Some(target) = policy.target_accuracy
                && goal.reaches(value, target)
            {
                return Some(EarlyStop {
                    reason: "TargetReached",
                    message: format!(
                        "{metric} reached {value} at epoch {epoch}, meeting successPolicy.targetAccuracy {target}"
                    ),
                    at: reported.at,
                });
            }
            if best.is_none_or(|(best_value, _)| goal.improves(value, best_value)) {
                best = Some((value, *epoch));
            }
            if let (Some(patience), Some((best_value, best_epoch))) =
                (policy.early_stopping_patience, best)
                && epoch.saturating_sub(best_epoch) >= patience
            {
                return Some(EarlyStop {
                    reason: "EarlyStopped",
                    message: format!(
                        "{metric} has not improved on {best_value} (epoch {best_epoch}) for {patience} epochs (successPolicy.earlyStoppingPatience); stopped at epoch {epoch}"
                    ),
                    at: reported.at,
                });
            }
        }
        None
    }

    /// After a Stop command, the workers get a grace period to exit on their own.
    fn stop_cleanup(&self, stopped_at: DateTime<Utc>) -> Vec<PlannerAction> {
        if !self.record().job_live() {
            return Vec::new();
        }
        let kill_at = add_seconds(stopped_at, u64::from(self.config.stop_grace_period_seconds));
        if self.now >= kill_at {
            vec![self.delete_current_job()]
        } else {
            vec![PlannerAction::RecheckAfter {
                delay: elapsed(self.now, kill_at),
                reason: "stop grace period".to_owned(),
            }]
        }
    }

    /// `failurePolicy.activeDeadlineSeconds` counts from the first start over all
    /// attempts; each Job also carries it, which catches a single long attempt.
    fn deadline_verdict(&self, phase: Phase) -> Option<Verdict> {
        let record = self.record();
        let seconds = self
            .spec()
            .failure_policy
            .as_ref()
            .and_then(|f| f.active_deadline_seconds)?;
        let first_start = self
            .previous
            .start_time
            .as_ref()
            .map(from_time)
            .or(self.state.first_started_at);
        let deadline = first_start.map(|start| add_seconds(start, seconds));
        let job_hit_deadline = phase == Phase::Failed
            && record
                .failure
                .as_ref()
                .is_some_and(|f| f.cause == FailureCause::DeadlineExceeded);
        let passed = deadline.is_some_and(|deadline| self.now >= deadline);
        if !(passed || job_hit_deadline) {
            return None;
        }
        let at = match (&record.failure, deadline) {
            (Some(failure), _) if job_hit_deadline => failure.at,
            (_, Some(deadline)) => deadline,
            _ => self.now,
        };
        let message = format!(
            "the job ran longer than failurePolicy.activeDeadlineSeconds ({seconds}s) since it first started; raise the deadline or resume from the latest checkpoint in a new TrainingJob"
        );
        let mut verdict = Verdict::failed(record.attempt, "DeadlineExceeded", message, at);
        if record.job_live() {
            verdict.actions.push(self.delete_current_job());
        }
        Some(verdict)
    }

    /// The current attempt failed: fail the job, or restart it after a backoff.
    fn after_failure(&self, failure: &WorkerFailure) -> Verdict {
        let spec = self.spec();
        let attempt = self.record().attempt;
        let policy = spec.restart_policy();
        let limit = spec.backoff_limit();
        let used = self.state.failed_attempts;
        let retry = match policy {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => true,
            RestartPolicy::ExitCode => failure.is_retryable(),
        };
        if !retry {
            let (reason, why) = match policy {
                RestartPolicy::Never => (
                    "WorkerFailed",
                    "failurePolicy.restartPolicy Never does not restart",
                ),
                _ => (
                    "PermanentFailure",
                    "exit codes 1-127 are program errors, which failurePolicy.restartPolicy ExitCode does not restart",
                ),
            };
            return Verdict::failed(attempt, reason, format!("{failure}; {why}"), failure.at);
        }
        if used >= limit {
            let message = format!(
                "{failure}; all {limit} restarts allowed by failurePolicy.backoffLimit are used"
            );
            return Verdict::failed(attempt, "BackoffLimitExceeded", message, failure.at);
        }

        let next = attempt.saturating_add(1);
        let ready_at = add_duration(failure.at, self.config.restart_backoff(used));
        let resume = self
            .resume_point_uri()
            .map(|uri| format!(", resuming from {uri}"))
            .unwrap_or_default();
        let restart = format!(
            "restart {} of {limit} as attempt {next}",
            used.saturating_add(1)
        );
        if spec.is_suspended() {
            let mut verdict = self.suspended_verdict(next);
            verdict.message =
                format!("{failure}; {restart} waits until spec.suspend is false{resume}");
            return verdict;
        }
        if self.now < ready_at {
            let message = format!("{failure}; {restart} at {}{resume}", ready_at.to_rfc3339());
            let mut verdict =
                Verdict::new(TrainingJobState::Pending, next, "RestartBackoff", message);
            verdict.admitted = ConditionUpdate::new(
                ConditionStatus::False,
                "RestartBackoff",
                format!("GPUs released; attempt {next} waits for admission once created"),
            );
            verdict.warning = true;
            verdict.actions.push(PlannerAction::RecreateAfter {
                attempt: next,
                delay: elapsed(self.now, ready_at),
            });
            return verdict;
        }
        let mut verdict =
            self.start_attempt(next, "Restarting", format!("{failure}; {restart}{resume}"));
        verdict.warning = true;
        // The failed attempt's Job stays for `kubectl logs`; the one before it goes.
        if let Some(older) = attempt.checked_sub(1) {
            verdict.actions.push(PlannerAction::DeleteJob {
                name: job_name(self.name(), older),
            });
        }
        verdict
    }

    fn suspended_verdict(&self, attempt: u32) -> Verdict {
        let mut verdict = Verdict::new(
            TrainingJobState::Suspended,
            attempt,
            "Suspended",
            "spec.suspend is true: the workers are stopped and their GPUs released; set it to false to resume from the latest checkpoint",
        );
        verdict.admitted =
            ConditionUpdate::new(ConditionStatus::False, "Suspended", "suspended by the user");
        verdict
    }

    /// `spec.suspend` is true: stop the workers (after a checkpoint request) and
    /// release the admission; resuming starts a fresh attempt.
    fn suspended(&self, phase: Phase) -> Verdict {
        let record = self.record();
        let mut verdict = self.suspended_verdict(record.attempt);
        match phase {
            Phase::NotCreated | Phase::Queued => {
                let plan = self.plan(record.attempt, None, true);
                match desired_objects(self.job, &plan) {
                    Ok(objects) => verdict
                        .actions
                        .push(PlannerAction::ApplyObjects(Box::new(objects))),
                    Err(error) => return self.cannot_build(error),
                }
            }
            Phase::Admitted | Phase::Starting | Phase::Running => {
                if record.ever_started {
                    let deadline = add_seconds(
                        self.now,
                        u64::from(self.config.termination_grace_period_seconds),
                    );
                    verdict.checkpoint_now = Some(("suspended by the user".to_owned(), deadline));
                }
                verdict.actions.push(self.delete_current_job());
            }
            Phase::Gone | Phase::Failed | Phase::Succeeded(_) => {}
        }
        verdict
    }

    /// The gpu-allocator preempted the running attempt: ask for a checkpoint, and at
    /// the eviction time (or once the checkpoint is written) replace the attempt with a
    /// new one that waits for re-admission. Preemptions do not count against
    /// `failurePolicy.backoffLimit`.
    fn preempted(
        &self,
        phase: Phase,
        decision: &trainyard_contracts::decisions::PreemptionDecided,
    ) -> Verdict {
        let record = self.record();
        // A draining queue names itself as the preemptor.
        let preemptor = if decision.reason == "drain" {
            format!("TrainingQueue {}", decision.preemptor.key())
        } else {
            decision.preemptor.key()
        };
        // Only running workers have something to checkpoint; an attempt that has not
        // started yet gives its admission back at once.
        let running = matches!(phase, Phase::Starting | Phase::Running);
        if running && self.now < decision.evict_after && !record.checkpointed_since_preemption {
            let mut verdict = self.progression(phase);
            verdict.preempted = Some(ConditionUpdate::new(
                ConditionStatus::True,
                "Preempted",
                format!(
                    "preempted by {preemptor} ({}): {}; checkpointing, workers stop at {}",
                    decision.reason,
                    decision.message,
                    decision.evict_after.to_rfc3339()
                ),
            ));
            verdict.checkpoint_now =
                Some((format!("preempted by {preemptor}"), decision.evict_after));
            verdict.actions.push(PlannerAction::RecheckAfter {
                delay: elapsed(self.now, decision.evict_after),
                reason: "preemption grace period".to_owned(),
            });
            return verdict;
        }
        let next = record.attempt.saturating_add(1);
        let message = format!(
            "preempted by {preemptor} ({}): {}; attempt {next} waits for re-admission",
            decision.reason, decision.message
        );
        let mut verdict = self.requeued("Preempted", message.clone());
        verdict.preempted = Some(ConditionUpdate::new(
            ConditionStatus::True,
            "Preempted",
            message,
        ));
        verdict
    }

    /// The current attempt gives its admission back: its Job (if any) is
    /// deleted first, and the next attempt waits for a new admission.
    fn requeued(&self, reason: &str, message: String) -> Verdict {
        let record = self.record();
        let next = record.attempt.saturating_add(1);
        let mut verdict = self.start_attempt(next, reason, message);
        verdict.warning = true;
        if record.job.is_some() && !record.job_deleted {
            verdict.actions.insert(0, self.delete_current_job());
        }
        verdict
    }

    /// When the current attempt gives its admission back if a worker stays
    /// unschedulable (see `unschedulable_timeout_seconds`).
    fn unschedulable_deadline(&self) -> Option<DateTime<Utc>> {
        let seconds = self.config.unschedulable_timeout_seconds;
        let since = self.record().unschedulable_since.filter(|_| seconds > 0)?;
        Some(add_seconds(since, u64::from(seconds)))
    }

    /// A worker found no node for `unschedulable_timeout_seconds`: the
    /// admission is given back and the job queues again as the next attempt.
    /// The restart budget is not spent: nothing failed.
    fn requeued_unschedulable(&self) -> Verdict {
        let record = self.record();
        let next = record.attempt.saturating_add(1);
        let (index, why) = record.unschedulable_worker().unwrap_or((0, "no node fits"));
        let message = format!(
            "worker {index} of attempt {} found no node for {}s ({why}); its GPUs are given back and attempt {next} waits for re-admission",
            record.attempt, self.config.unschedulable_timeout_seconds
        );
        self.requeued("WorkersUnschedulable", message)
    }

    /// Creates attempt `attempt` (or keeps it suspended while the user suspends the job).
    fn start_attempt(&self, attempt: u32, reason: &str, message: String) -> Verdict {
        if self.spec().is_suspended() {
            return self.suspended_verdict(attempt);
        }
        let mut verdict = Verdict::new(TrainingJobState::Pending, attempt, reason, message);
        verdict.admitted = ConditionUpdate::new(
            ConditionStatus::False,
            reason,
            format!("attempt {attempt} waits for admission"),
        );
        let admission = self.state.early_admissions.get(&attempt);
        match self.build(attempt, admission) {
            Ok(Built::Ready(objects) | Built::WithoutAdmission(objects, _)) => {
                if !self.deferred_until_admitted(&objects) {
                    verdict.actions.push(PlannerAction::ApplyObjects(objects));
                }
            }
            Err(error) => return self.cannot_build(error),
        }
        verdict
    }

    /// Whether a suspended Job is left uncreated until the job is admitted:
    /// its pods ask for something (a hostPath volume, a PriorityClass, ...)
    /// only its queue's pod policy may allow, and the gpu-allocator, which
    /// knows the queue, admits the job only if it does. So a job the policy
    /// refuses never has a Job, not even a suspended one.
    fn deferred_until_admitted(&self, objects: &DesiredObjects) -> bool {
        objects.job_suspended() && !trainyard_api::pod_requests(self.spec()).is_empty()
    }

    /// The job waits in its queue; the Admitted condition says why.
    fn queued(&self, attempt: u32) -> Verdict {
        let waiting = self.waiting_condition();
        let mut verdict = Verdict::new(
            TrainingJobState::Queued,
            attempt,
            "Queued",
            waiting.message.clone(),
        );
        // No node could ever hold it, or its queue does not allow it: a
        // Warning, once.
        let warn = matches!(
            waiting.reason.as_str(),
            REASON_UNSCHEDULABLE | REASON_POD_POLICY_REFUSED
        );
        verdict.warning = warn;
        verdict.admission_warning = warn;
        verdict.reason = waiting.reason.clone();
        verdict.admitted = waiting;
        verdict
    }

    /// Normal course: create, wait for admission, unsuspend, watch the workers start.
    fn progression(&self, phase: Phase) -> Verdict {
        let spec = self.spec();
        let record = self.record();
        let attempt = record.attempt;
        let admission = record.admission.as_ref();
        match phase {
            Phase::Gone => {
                let next = attempt.saturating_add(1);
                let (reason, message) = if self.previous.state == Some(TrainingJobState::Suspended)
                {
                    ("Resumed", format!("resumed by the user as attempt {next}"))
                } else {
                    (
                        "JobDeleted",
                        format!(
                            "the Job of attempt {attempt} was deleted; recreating the workers as attempt {next}"
                        ),
                    )
                };
                self.start_attempt(next, reason, message)
            }
            Phase::NotCreated | Phase::Queued | Phase::Admitted => {
                let built = match self.build(attempt, admission) {
                    Ok(built) => built,
                    Err(error) => return self.cannot_build(error),
                };
                let (objects, conflict) = match built {
                    Built::Ready(objects) => (objects, None),
                    Built::WithoutAdmission(objects, error) => (objects, Some(error)),
                };
                let unsuspends = !objects.job_suspended();
                let deferred = phase == Phase::NotCreated && self.deferred_until_admitted(&objects);
                let mut verdict = match (phase, unsuspends, conflict) {
                    (_, _, Some(conflict)) => {
                        let mut verdict = Verdict::new(
                            TrainingJobState::Queued,
                            attempt,
                            "AdmissionConflict",
                            conflict.to_string(),
                        );
                        verdict.admission_warning = true;
                        verdict
                    }
                    (Phase::NotCreated, false, None) if deferred => self.queued(attempt),
                    (Phase::NotCreated, _, None) => {
                        let mut verdict = Verdict::new(
                            TrainingJobState::Pending,
                            attempt,
                            "Creating",
                            format!("creating the Job of attempt {attempt}"),
                        );
                        verdict.admitted = self.waiting_condition();
                        if unsuspends {
                            verdict.admitted = self.admitted_condition(admission);
                        }
                        verdict
                    }
                    (_, true, None) => {
                        let mut verdict = Verdict::new(
                            TrainingJobState::Initializing,
                            attempt,
                            "Admitted",
                            format!("admitted; starting {} workers", spec.num_workers),
                        );
                        verdict.admitted = self.admitted_condition(admission);
                        verdict.allocation = admission.cloned();
                        verdict
                    }
                    (_, false, None) => self.queued(attempt),
                };
                if !deferred {
                    verdict.actions.push(PlannerAction::ApplyObjects(objects));
                }
                verdict
            }
            Phase::Starting => {
                let running = record
                    .running_pods()
                    .max(record.job.as_ref().map_or(0, |j| j.ready));
                let mut message = format!(
                    "{} of {} workers running",
                    running.min(spec.num_workers),
                    spec.num_workers
                );
                if let Some((index, why)) = record.unschedulable_worker() {
                    message.push_str(&format!("; worker {index} unschedulable: {why}"));
                }
                let mut verdict = Verdict::new(
                    TrainingJobState::Initializing,
                    attempt,
                    "WorkersStarting",
                    message,
                );
                if let Some(deadline) = self.unschedulable_deadline() {
                    verdict.actions.push(PlannerAction::RecheckAfter {
                        delay: elapsed(self.now, deadline),
                        reason: "unschedulable workers".to_owned(),
                    });
                }
                if let Some(deadline) = self.pods_ready_deadline() {
                    verdict.actions.push(PlannerAction::RecheckAfter {
                        delay: elapsed(self.now, deadline),
                        reason: "pods ready timeout".to_owned(),
                    });
                }
                verdict.admitted = self.admitted_condition(admission);
                verdict.allocation = admission.cloned();
                self.readmitted(&mut verdict);
                self.deadline_timer(&mut verdict);
                verdict
            }
            Phase::Running => {
                let total = self.total_epochs();
                let message = match &self.state.progress {
                    Some(progress) => format!("training: epoch {} of {total}", progress.epoch),
                    None => format!("all {} workers running", spec.num_workers),
                };
                let mut verdict =
                    Verdict::new(TrainingJobState::Running, attempt, "Training", message);
                verdict.workers_ready = true;
                verdict.admitted = self.admitted_condition(admission);
                verdict.allocation = admission.cloned();
                self.readmitted(&mut verdict);
                self.deadline_timer(&mut verdict);
                verdict
            }
            // Handled before progression is reached.
            Phase::Succeeded(_) | Phase::Failed => Verdict::new(
                TrainingJobState::Pending,
                attempt,
                "Waiting",
                "waiting for the outcome of the current attempt",
            ),
        }
    }

    /// A job re-admitted after a preemption is no longer preempted.
    fn readmitted(&self, verdict: &mut Verdict) {
        let was_preempted = find_condition(&self.previous.conditions, CONDITION_PREEMPTED)
            .is_some_and(Condition::is_true);
        if was_preempted && verdict.preempted.is_none() {
            verdict.preempted = Some(ConditionUpdate::new(
                ConditionStatus::False,
                "Readmitted",
                format!("attempt {} was admitted again", verdict.attempt),
            ));
        }
    }

    /// While workers run under a deadline, decide again when it passes.
    fn deadline_timer(&self, verdict: &mut Verdict) {
        let seconds = self
            .spec()
            .failure_policy
            .as_ref()
            .and_then(|f| f.active_deadline_seconds);
        let first_start = self
            .previous
            .start_time
            .as_ref()
            .map(from_time)
            .or(self.state.first_started_at);
        if let (Some(seconds), Some(start)) = (seconds, first_start) {
            verdict.actions.push(PlannerAction::RecheckAfter {
                delay: elapsed(self.now, add_seconds(start, seconds)),
                reason: "active deadline".to_owned(),
            });
        }
    }

    fn admitted_condition(&self, admission: Option<&AdmissionDecided>) -> ConditionUpdate {
        let message = match admission {
            Some(admission) => format!(
                "admitted by queue {} (flavor {})",
                admission.queue, admission.flavor
            ),
            None => "the Job was started without an admission decision".to_owned(),
        };
        ConditionUpdate::new(ConditionStatus::True, "Admitted", message)
    }

    fn waiting_condition(&self) -> ConditionUpdate {
        let spec = self.spec();
        match self.state.waiting_reason() {
            Some(pending) => ConditionUpdate::new(
                ConditionStatus::False,
                if pending.unschedulable.is_some() {
                    REASON_UNSCHEDULABLE
                } else if pending.pod_policy.is_some() {
                    REASON_POD_POLICY_REFUSED
                } else {
                    "WaitingForQuota"
                },
                format!(
                    "position {} in queue {}: {}",
                    pending.position, pending.queue, pending.message
                ),
            ),
            None => ConditionUpdate::new(
                ConditionStatus::False,
                "WaitingForAdmission",
                format!(
                    "waiting for queue {} to admit {} GPUs ({} workers × {})",
                    spec.queue_name(),
                    spec.total_gpus(),
                    spec.num_workers,
                    spec.gpus_per_worker()
                ),
            ),
        }
    }

    fn cannot_build(&self, error: PlanError) -> Verdict {
        let record = self.record();
        let mut verdict =
            Verdict::failed(record.attempt, error.reason(), error.to_string(), self.now);
        if record.job_live() {
            verdict.actions.push(self.delete_current_job());
        }
        verdict
    }

    fn resume_point_uri(&self) -> Option<String> {
        self.state
            .resume_point
            .as_ref()
            .map(|p| p.uri.clone())
            .or_else(|| {
                self.spec()
                    .checkpoint
                    .as_ref()
                    .and_then(|c| c.resume_from.clone())
            })
    }

    fn plan<'p>(
        &'p self,
        attempt: u32,
        admission: Option<&'p AdmissionDecided>,
        suspended_by_user: bool,
    ) -> JobPlan<'p> {
        JobPlan {
            attempt,
            admission,
            suspended_by_user,
            resume_point: self.state.resume_point.as_ref(),
            interval_advice: self.state.interval_advice.as_ref(),
            config: self.config,
        }
    }

    /// Builds the objects of `attempt`, falling back to a suspended Job when the
    /// admission cannot be honoured (a later admission may fix that).
    fn build(
        &self,
        attempt: u32,
        admission: Option<&AdmissionDecided>,
    ) -> Result<Built, PlanError> {
        let suspended = self.spec().is_suspended();
        match desired_objects(self.job, &self.plan(attempt, admission, suspended)) {
            Ok(objects) => Ok(Built::Ready(Box::new(objects))),
            Err(error) if admission.is_some() && !error.is_spec_error() => {
                let objects = desired_objects(self.job, &self.plan(attempt, None, suspended))?;
                Ok(Built::WithoutAdmission(Box::new(objects), error))
            }
            Err(error) => Err(error),
        }
    }

    fn total_epochs(&self) -> u32 {
        self.state
            .progress
            .as_ref()
            .and_then(|p| p.total_epochs)
            .unwrap_or_else(|| self.spec().epochs())
    }

    /// A terminal job keeps its status; only its leftover workers are cleaned up.
    fn terminal_cleanup(&self) -> Vec<PlannerAction> {
        if !self.record().job_live() || self.job.metadata.name.is_none() {
            return Vec::new();
        }
        match self.previous.state {
            Some(TrainingJobState::Completed) => {
                let stopped_at = self
                    .previous
                    .completion_time
                    .as_ref()
                    .map_or(self.now, from_time);
                self.stop_cleanup(stopped_at)
            }
            _ => vec![self.delete_current_job()],
        }
    }

    /// The advised checkpoint interval for the workers of a job with
    /// `checkpoint.frequency: auto`, when it differs from the one in status
    /// (the status write that follows records it as sent).
    fn interval_command(&self, uid: &str, attempt: u32) -> Option<PlannerAction> {
        let advice = self.state.interval_advice.as_ref()?;
        let shown = self
            .previous
            .checkpoint
            .as_ref()
            .and_then(|c| c.advised_interval_seconds);
        let auto = self.spec().checkpointing_enabled()
            && self.spec().checkpoint_frequency() == CheckpointFrequency::Auto;
        (auto && self.record().job_live() && shown != Some(advice.interval_seconds)).then(|| {
            PlannerAction::SendCommand {
                command: PlannerCommand::CheckpointInterval(CheckpointIntervalSet {
                    interval_seconds: advice.interval_seconds,
                }),
                dedup_key: format!(
                    "{uid}/a{attempt}/checkpoint-interval/{}",
                    advice.interval_seconds.to_bits()
                ),
            }
        })
    }

    /// Turns a verdict into the status and the actions.
    fn finish(&self, mut verdict: Verdict) -> Vec<PlannerAction> {
        let status = self.status_for(&verdict);
        // Taken, not cloned: they may hold the whole desired Job.
        let mut actions = std::mem::take(&mut verdict.actions);
        let entered = self.previous.state != Some(verdict.state);
        let uid = self.uid();
        let attempt = verdict.attempt;
        actions.extend(self.interval_command(uid, attempt));

        if entered
            && let Some(reason) = &verdict.stop_reason
            && self.record().job_live()
        {
            actions.push(PlannerAction::SendCommand {
                command: PlannerCommand::Stop(StopRequested {
                    reason: reason.clone(),
                }),
                dedup_key: format!("{uid}/a{attempt}/stop"),
            });
        }
        let preemption_began = verdict
            .preempted
            .as_ref()
            .is_some_and(|p| p.status == ConditionStatus::True)
            && !find_condition(&self.previous.conditions, CONDITION_PREEMPTED)
                .is_some_and(Condition::is_true);
        let checkpoint_trigger = if verdict.state == TrainingJobState::Suspended {
            entered
        } else {
            preemption_began
        };
        if checkpoint_trigger && let Some((reason, deadline)) = &verdict.checkpoint_now {
            actions.push(PlannerAction::SendCommand {
                command: PlannerCommand::CheckpointNow(CheckpointRequested {
                    reason: reason.clone(),
                    deadline: *deadline,
                }),
                dedup_key: format!("{uid}/a{attempt}/checkpoint-now"),
            });
        }

        if entered {
            actions.push(PlannerAction::RecordEvent {
                event_type: if verdict.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: verdict.reason.clone(),
                message: verdict.message.clone(),
            });
        } else if preemption_began && let Some(preempted) = &verdict.preempted {
            actions.push(PlannerAction::RecordEvent {
                event_type: EventType::Warning,
                reason: preempted.reason.clone(),
                message: preempted.message.clone(),
            });
        }
        let previous_admitted_reason =
            find_condition(&self.previous.conditions, CONDITION_ADMITTED)
                .and_then(|c| c.reason.as_deref());
        if verdict.admission_warning
            && previous_admitted_reason != Some(verdict.admitted.reason.as_str())
            && !entered
        {
            actions.push(PlannerAction::RecordEvent {
                event_type: EventType::Warning,
                reason: verdict.admitted.reason.clone(),
                message: verdict.admitted.message.clone(),
            });
        }

        if entered {
            let gpus = if verdict.allocation.is_some() {
                self.spec().total_gpus()
            } else {
                0
            };
            let queue = verdict
                .allocation
                .as_ref()
                .map(|a| a.queue.clone())
                .unwrap_or_else(|| self.spec().queue_name().to_owned());
            let from = self.previous.state.map_or("None", |s| s.as_str());
            actions.push(PlannerAction::PublishTransition {
                transition: Box::new(TrainingJobTransitioned {
                    from: self.previous.state,
                    to: verdict.state,
                    reason: verdict.reason.clone(),
                    message: verdict.message.clone(),
                    restart_count: attempt,
                    gpus,
                    queue: Some(queue),
                    context: crate::context::transition_context(
                        self.job,
                        verdict.state,
                        &verdict.reason,
                        self.record().failure.as_ref().filter(|_| {
                            verdict.state == TrainingJobState::Failed
                                || matches!(
                                    verdict.reason.as_str(),
                                    "Restarting" | "RestartBackoff"
                                )
                        }),
                        &status.metrics,
                        self.state.first_started_at,
                        verdict.completion_time,
                    ),
                }),
                dedup_key: format!("{uid}/a{attempt}/{from}-{}", verdict.state.as_str()),
            });
        }
        if status != *self.previous {
            actions.push(PlannerAction::UpdateStatus(Box::new(status)));
        }
        actions
    }

    /// Progress, metrics and checkpoint fields from the workers' reports.
    fn fold_reports(&self, status: &mut TrainingJobStatus, completed: bool) {
        let spec = self.spec();
        let total = self.total_epochs();
        status.total_epochs = Some(total);
        if let Some(progress) = &self.state.progress {
            status.current_epoch = Some(progress.epoch);
            status.progress = Some(progress_percent(progress.epoch, total));
            // A Kubernetes number cannot be NaN or infinite; a diverged metric
            // stays in the planner's state and leaves the status.
            status.metrics = progress
                .metrics
                .iter()
                .filter(|(_, value)| value.is_finite())
                .map(|(name, value)| (name.clone(), *value))
                .collect();
        } else if status.progress.is_none() {
            status.progress = Some(progress_percent(0, total));
        }
        if completed {
            status.progress = Some("100%".to_owned());
        }
        if let Some(checkpoint) = &self.state.latest_checkpoint {
            let summary = self.state.checkpoint_summary.as_ref();
            let best_metric = spec
                .checkpoint
                .as_ref()
                .and_then(|c| c.retention.as_ref())
                .and_then(|r| r.keep_best.as_ref())
                .map(|b| b.metric.as_str());
            let best = summary.and_then(|s| s.best.as_ref());
            let latest_verified = summary.and_then(|s| s.latest_verified.as_ref());
            status.checkpoint = Some(CheckpointStatus {
                latest_path: Some(checkpoint.uri.clone()),
                latest_epoch: Some(checkpoint.epoch),
                last_checkpoint_time: Some(to_time(checkpoint.at)),
                // The manager's count leaves out what retention deleted.
                count: summary.map_or_else(
                    || u32::try_from(self.state.checkpoint_uris.len()).unwrap_or(u32::MAX),
                    |s| s.count,
                ),
                latest_verified_path: latest_verified.map(|c| c.uri.clone()),
                latest_verified_step: latest_verified.map(|c| c.step),
                best_path: best.map(|c| c.uri.clone()),
                best_metric_value: best
                    .zip(best_metric)
                    .and_then(|(c, metric)| c.metrics.get(metric).copied()),
                resume_reason: self.state.resume_point.as_ref().map(resume_reason),
                advised_interval_seconds: self
                    .state
                    .interval_advice
                    .as_ref()
                    .map(|a| a.interval_seconds),
                model_name: self.state.model.as_ref().map(|m| m.model_name.clone()),
                model_version: self.state.model.as_ref().map(|m| m.version.clone()),
            });
        }
        if let Some(cost) = crate::cost::cost_status(self.state) {
            status.cost = Some(cost);
        }
    }

    fn status_for(&self, verdict: &Verdict) -> TrainingJobStatus {
        let spec = self.spec();
        let record = self.record();
        let generation = self.job.metadata.generation;
        let mut status = self.previous.clone();
        status.state = Some(verdict.state);
        status.observed_generation = generation;
        status.restart_count = Some(verdict.attempt);
        status.requeue_at = verdict.actions.iter().find_map(|action| match action {
            PlannerAction::RecreateAfter { delay, .. } => {
                Some(to_time(add_duration(self.now, *delay)))
            }
            _ => None,
        });

        let now = to_time(self.now);
        let mut set = |condition_type: &str, update: &ConditionUpdate| {
            let mut condition = Condition::new(
                condition_type,
                update.status,
                update.reason.clone(),
                update.message.clone(),
            );
            condition.last_transition_time = Some(now.clone());
            condition.observed_generation = generation;
            set_condition(&mut status.conditions, condition);
        };
        set(CONDITION_ADMITTED, &verdict.admitted);
        let running = if verdict.state == TrainingJobState::Running {
            ConditionUpdate::new(
                ConditionStatus::True,
                &verdict.reason,
                verdict.message.clone(),
            )
        } else {
            ConditionUpdate::new(
                ConditionStatus::False,
                &verdict.reason,
                verdict.message.clone(),
            )
        };
        set(CONDITION_RUNNING, &running);
        let suspended = verdict.state == TrainingJobState::Suspended;
        if let Some(update) = &verdict.suspended {
            set(CONDITION_SUSPENDED, update);
        } else if suspended {
            set(
                CONDITION_SUSPENDED,
                &ConditionUpdate::new(ConditionStatus::True, "Suspended", verdict.message.clone()),
            );
        } else if find_condition(&self.previous.conditions, CONDITION_SUSPENDED).is_some() {
            set(
                CONDITION_SUSPENDED,
                &ConditionUpdate::new(ConditionStatus::False, "Resumed", "spec.suspend is false"),
            );
        }
        if let Some(preempted) = &verdict.preempted {
            set(CONDITION_PREEMPTED, preempted);
        }
        if let Some(pods_ready) = &verdict.pods_ready {
            set(CONDITION_PODS_READY, pods_ready);
        } else if verdict.workers_ready
            && find_condition(&self.previous.conditions, CONDITION_PODS_READY)
                .is_some_and(|c| !c.is_true())
        {
            set(
                CONDITION_PODS_READY,
                &ConditionUpdate::new(
                    ConditionStatus::True,
                    "PodsReady",
                    format!(
                        "all {} workers of attempt {} are running",
                        spec.num_workers, verdict.attempt
                    ),
                ),
            );
        }
        if let Some(update) = self.schedulable_condition(verdict) {
            set(CONDITION_SCHEDULABLE, &update);
        }
        match verdict.state {
            TrainingJobState::Completed => set(
                CONDITION_SUCCEEDED,
                &ConditionUpdate::new(
                    ConditionStatus::True,
                    &verdict.reason,
                    verdict.message.clone(),
                ),
            ),
            TrainingJobState::Failed => set(
                CONDITION_FAILED,
                &ConditionUpdate::new(
                    ConditionStatus::True,
                    &verdict.reason,
                    verdict.message.clone(),
                ),
            ),
            _ => {}
        }

        // A job stopped early (trial stopped, success policy) keeps the progress it
        // reached: "100%" at epoch 1 of 9 would say it ran to the end.
        let ran_to_the_end =
            verdict.state == TrainingJobState::Completed && verdict.stop_reason.is_none();
        self.fold_reports(&mut status, ran_to_the_end);
        if let Some(job) = &record.job {
            status.workers = Some(WorkerCounts {
                active: job.active,
                succeeded: job.succeeded,
                failed: job.failed,
            });
        }
        status.resources = verdict.allocation.as_ref().map(|admission| {
            let mut nodes = record.nodes();
            if nodes.is_empty() {
                let placed: std::collections::BTreeSet<&str> = admission
                    .placements
                    .iter()
                    .map(|p| p.node.as_str())
                    .collect();
                nodes = placed.into_iter().map(str::to_owned).collect();
            }
            AllocatedResources {
                gpus: spec.total_gpus(),
                nodes,
                flavor: Some(admission.flavor.clone()),
                queue: Some(admission.queue.clone()),
            }
        });
        if status.start_time.is_none() {
            status.start_time = self.state.first_started_at.map(to_time);
        }
        if let Some(completed_at) = verdict.completion_time {
            status.completion_time = Some(to_time(completed_at));
            status.duration = status
                .start_time
                .as_ref()
                .map(|start| format_duration(elapsed(from_time(start), completed_at)));
        }
        status.failure_reason = verdict.failure_reason.clone();
        if verdict.workers_ready {
            status.pods_ready_requeues = None;
        } else if let Some(requeues) = verdict.pods_ready_requeues {
            status.pods_ready_requeues = Some(requeues);
        }
        status.queue = (verdict.state == TrainingJobState::Queued).then(|| self.queue_status());
        status
    }

    /// `Schedulable`: False while the job waits and the gpu-allocator finds
    /// no node could ever hold it; True once that no longer holds, for a job
    /// that had it False (the job stays in its queue all along, as a node may
    /// be added).
    fn schedulable_condition(&self, verdict: &Verdict) -> Option<ConditionUpdate> {
        let unschedulable = self
            .state
            .waiting_reason()
            .filter(|p| p.unschedulable.is_some() && verdict.state == TrainingJobState::Queued);
        match unschedulable {
            Some(pending) => Some(ConditionUpdate::new(
                ConditionStatus::False,
                REASON_UNSCHEDULABLE,
                pending.message.clone(),
            )),
            None => find_condition(&self.previous.conditions, CONDITION_SCHEDULABLE).map(|_| {
                ConditionUpdate::new(
                    ConditionStatus::True,
                    "NodesFit",
                    "a node the job may use can hold each of its workers",
                )
            }),
        }
    }

    /// The typed twin of the waiting condition, so clients need not parse its message.
    fn queue_status(&self) -> QueueStatus {
        match self.state.waiting_reason() {
            Some(pending) => QueueStatus {
                name: pending.queue.clone(),
                position: Some(pending.position),
                reason: Some(pending.message.clone()),
            },
            None => QueueStatus {
                name: self.spec().queue_name().to_owned(),
                position: None,
                reason: None,
            },
        }
    }
}
