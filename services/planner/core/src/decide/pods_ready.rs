//! Waiting for an admitted attempt's pods, as Kueue's `waitForPodsReady`: an
//! attempt whose workers do not all run within `pods_ready_timeout_seconds`
//! of its Job being unsuspended (pods refused by a ResourceQuota, a
//! PriorityClass that does not exist, pod security admission; an image that
//! cannot be pulled) gives its GPUs back instead of holding them forever. Its
//! Job is deleted, the `PodsReady` condition says why, and the next attempt
//! queues again after a backoff; after `pods_ready_requeue_limit` such
//! requeues in a row the job fails with the cause and the fix. These requeues
//! spend nothing of `failurePolicy.backoffLimit`: no worker failed.

use chrono::{DateTime, Utc};
use trainyard_api::{ConditionStatus, TrainingJobState, find_condition};
use trainyard_contracts::events::PodObserved;

use super::{
    CONDITION_PODS_READY, ConditionUpdate, Context, PlannerAction, REASON_PODS_NOT_CREATED,
    REASON_PODS_NOT_READY, Verdict, add_duration, add_seconds,
};
use crate::names::job_name;
use crate::status::elapsed;

/// Container waiting reasons that are the normal course of a start.
const STARTING_REASONS: [&str; 2] = ["ContainerCreating", "PodInitializing"];

impl Context<'_> {
    /// Every worker of the attempt ran at some point, or training reported progress.
    fn workers_started(&self) -> bool {
        let record = self.record();
        record.progress_reported || record.most_workers_running >= self.spec().num_workers
    }

    /// When the current attempt has failed to start unless all its workers run;
    /// None when that is not watched (timeout 0, Job not unsuspended yet,
    /// workers already ran).
    pub(super) fn pods_ready_deadline(&self) -> Option<DateTime<Utc>> {
        let seconds = self.config.pods_ready_timeout_seconds;
        if seconds == 0 || self.workers_started() {
            return None;
        }
        let since = self.record().unsuspended_at?;
        Some(add_seconds(since, u64::from(seconds)))
    }

    /// The attempt's pods were not all running at `deadline`: delete its Job,
    /// give its GPUs back and queue again after a backoff, or fail the job
    /// once `pods_ready_requeue_limit` requeues in a row are spent.
    pub(super) fn pods_not_ready(&self, deadline: DateTime<Utc>) -> Verdict {
        let record = self.record();
        let attempt = record.attempt;
        let next = attempt.saturating_add(1);
        let limit = self.config.pods_ready_requeue_limit;
        // Once the status moved on to the next attempt, this timeout is
        // counted in it and its cause is the one written then (the pods'
        // later changes, as they are deleted, do not rewrite it).
        let counted = self.previous.restart_count == Some(next);
        let recorded = find_condition(&self.previous.conditions, CONDITION_PODS_READY)
            .filter(|c| counted && !c.is_true())
            .and_then(|c| Some((c.reason.clone()?, c.message.clone()?)));
        let (reason, cause) = recorded.unwrap_or_else(|| self.pods_not_ready_cause());
        let requeues = self.previous.pods_ready_requeues.unwrap_or(0);
        let requeues_before = if counted {
            requeues.saturating_sub(1)
        } else {
            requeues
        };
        let condition = ConditionUpdate::new(ConditionStatus::False, &reason, cause.clone());

        if requeues_before >= limit {
            let message = format!(
                "{cause}; the job queued again {limit} times in a row (pods_ready_requeue_limit) and its pods never all ran: {}",
                self.pods_ready_fix(&cause)
            );
            let mut verdict = Verdict::failed(attempt, &reason, message, deadline);
            verdict.pods_ready = Some(condition);
            verdict.pods_ready_requeues = Some(requeues_before);
            if record.job_live() {
                verdict.actions.push(self.delete_current_job());
            }
            return verdict;
        }

        let requeue = requeues_before.saturating_add(1);
        let ready_at = add_duration(deadline, self.config.restart_backoff(requeues_before));
        let requeued = format!(
            "{cause}; its GPUs are given back and attempt {next} queues again (requeue {requeue} of {limit})"
        );
        let mut verdict = if self.now < ready_at {
            let mut verdict = Verdict::new(
                TrainingJobState::Pending,
                next,
                &reason,
                format!("{requeued} at {}", ready_at.to_rfc3339()),
            );
            verdict.admitted = ConditionUpdate::new(
                ConditionStatus::False,
                &reason,
                format!("GPUs released; attempt {next} waits for admission once created"),
            );
            verdict.actions.push(PlannerAction::RecreateAfter {
                attempt: next,
                delay: elapsed(self.now, ready_at),
            });
            verdict
        } else {
            self.start_attempt(next, &reason, requeued)
        };
        verdict.warning = true;
        if record.job.is_some() && !record.job_deleted {
            verdict.actions.insert(0, self.delete_current_job());
        }
        verdict.pods_ready = Some(condition);
        verdict.pods_ready_requeues = Some(requeue);
        verdict
    }

    /// Why the attempt's workers are not all running, as specific as the
    /// cluster said: the Job controller's `FailedCreate` Event for pods never
    /// created, else the first worker's waiting reason, scheduling or phase.
    fn pods_not_ready_cause(&self) -> (String, String) {
        let record = self.record();
        let attempt = record.attempt;
        let workers = self.spec().num_workers;
        let seconds = self.config.pods_ready_timeout_seconds;
        let created = u32::try_from(record.pods.len()).unwrap_or(u32::MAX);
        if created < workers {
            let pods = if created == 0 {
                format!("pods of attempt {attempt}")
            } else {
                format!(
                    "{} of {workers} pods of attempt {attempt}",
                    workers - created
                )
            };
            let why = match &record.creation_failure {
                Some(event) => format!("{}: {}", event.reason, event.message),
                None => format!(
                    "no Event names the cause; see `kubectl describe job {}`",
                    job_name(self.name(), attempt)
                ),
            };
            return (
                REASON_PODS_NOT_CREATED.to_owned(),
                format!("{pods} not created within {seconds}s: {why}"),
            );
        }
        let not_running: Vec<&PodObserved> = record
            .pods
            .values()
            .filter(|pod| pod.phase != "Running")
            .collect();
        let worst = not_running
            .iter()
            .min_by_key(|pod| Self::blocking_rank(pod))
            .map_or_else(
                || "the workers did not all run at once".to_owned(),
                |pod| Self::why_not_running(pod),
            );
        (
            REASON_PODS_NOT_READY.to_owned(),
            format!(
                "{} of {workers} workers of attempt {attempt} not running within {seconds}s: {worst}",
                not_running.len().max(1)
            ),
        )
    }

    /// Which worker names the cause best: an error while the container
    /// waits, then no node, then anything else.
    fn blocking_rank(pod: &PodObserved) -> (u8, u32) {
        let rank = match &pod.waiting {
            Some(waiting) if !STARTING_REASONS.contains(&waiting.reason.as_str()) => 0,
            _ if Self::unschedulable(pod).is_some() => 1,
            _ => 2,
        };
        (rank, pod.index)
    }

    fn unschedulable(pod: &PodObserved) -> Option<&str> {
        pod.conditions
            .iter()
            .find(|c| {
                c.condition_type == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .map(|c| c.message.as_deref().unwrap_or("no node fits"))
    }

    fn why_not_running(pod: &PodObserved) -> String {
        let index = pod.index;
        if let Some(waiting) = pod
            .waiting
            .as_ref()
            .filter(|w| !STARTING_REASONS.contains(&w.reason.as_str()))
        {
            return match &waiting.message {
                Some(message) => format!("worker {index}: {}: {message}", waiting.reason),
                None => format!("worker {index}: {}", waiting.reason),
            };
        }
        if let Some(message) = Self::unschedulable(pod) {
            return format!("worker {index}: Unschedulable: {message}");
        }
        if !pod.scheduling_gates.is_empty() {
            return format!(
                "worker {index}: still gated by {}",
                pod.scheduling_gates.join(", ")
            );
        }
        match &pod.waiting {
            Some(waiting) => format!("worker {index}: {}", waiting.reason),
            None => format!("worker {index}: {}", pod.phase),
        }
    }

    /// What the user changes so the pods start, from the cause's words.
    fn pods_ready_fix(&self, cause: &str) -> String {
        let namespace = self.job.metadata.namespace.as_deref().unwrap_or_default();
        let fix = if cause.contains("exceeded quota") {
            format!(
                "raise the ResourceQuota of namespace {namespace} (`kubectl describe resourcequota -n {namespace}`) or ask for fewer GPUs"
            )
        } else if cause.to_lowercase().contains("priorityclass") {
            "create the PriorityClass or name an existing one in spec.scheduling.priority (`kubectl get priorityclasses`)".to_owned()
        } else if cause.contains("PodSecurity") {
            format!(
                "let the namespace's pod security level (`pod-security.kubernetes.io/enforce` on namespace {namespace}) admit the workers, or restrict their securityContext"
            )
        } else if ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"]
            .iter()
            .any(|reason| cause.contains(reason))
        {
            "fix spec.image or the registry's pull secret".to_owned()
        } else if cause.contains("CreateContainerConfigError") {
            "create the Secret or ConfigMap the workers' env or volumes name".to_owned()
        } else if cause.contains("Unschedulable") {
            "no node fits the workers: check the node selectors, tolerations and affinity in spec.scheduling and the nodes' free GPUs".to_owned()
        } else {
            format!(
                "see `kubectl describe job {}` and its pods",
                job_name(self.name(), self.record().attempt)
            )
        };
        format!("{fix}, then create the TrainingJob again")
    }
}
