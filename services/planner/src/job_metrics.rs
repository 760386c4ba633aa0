//! Job-level metrics: TrainingJobs by state, outcomes, restarts, preemptions
//! and the time jobs wait for admission. Labels are bounded: namespace, queue,
//! state, outcome and a reason from the planner's own fixed set; never a job
//! name. The planner is the one place that sees every job's lifecycle.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use trainyard_api::TrainingJobState;
use trainyard_contracts::lifecycle::TrainingJobTransitioned;

use crate::error::PlannerError;

/// What the metrics remember of one job, by `<namespace>/<name>`.
struct Known {
    namespace: String,
    queue: String,
    state: Option<TrainingJobState>,
    restart_count: Option<u32>,
    queued_at: Option<Instant>,
}

/// The job-level metrics and the little per-job memory they need.
pub struct JobMetrics {
    jobs: IntGaugeVec,
    outcomes: IntCounterVec,
    restarts: IntCounterVec,
    preemptions: IntCounterVec,
    admission_wait: HistogramVec,
    known: Mutex<HashMap<String, Known>>,
}

/// A transition reason as a label: the planner's reasons are CamelCase
/// constants; anything else is counted as `Other` so the label stays bounded.
fn reason_label(reason: &str) -> &str {
    let constant = !reason.is_empty()
        && reason.len() <= 40
        && reason.starts_with(|c: char| c.is_ascii_uppercase())
        && reason.chars().all(|c| c.is_ascii_alphanumeric());
    if constant { reason } else { "Other" }
}

impl JobMetrics {
    pub fn register(registry: &Registry) -> Result<Self, PlannerError> {
        let err = |e: prometheus::Error| PlannerError::Metrics(e.to_string());
        let jobs = IntGaugeVec::new(
            Opts::new(
                "trainyard_trainingjobs",
                "TrainingJobs by namespace, queue and state (deleted jobs leave)",
            ),
            &["namespace", "queue", "state"],
        )
        .map_err(err)?;
        let outcomes = IntCounterVec::new(
            Opts::new(
                "trainyard_trainingjob_outcomes_total",
                "TrainingJobs that finished, by outcome (completed, failed) and reason",
            ),
            &["namespace", "queue", "outcome", "reason"],
        )
        .map_err(err)?;
        let restarts = IntCounterVec::new(
            Opts::new(
                "trainyard_trainingjob_restarts_total",
                "New attempts of TrainingJobs after a failure, preemption or eviction",
            ),
            &["namespace", "queue"],
        )
        .map_err(err)?;
        let preemptions = IntCounterVec::new(
            Opts::new(
                "trainyard_trainingjob_preemptions_total",
                "Preemption decisions received for running TrainingJobs",
            ),
            &["namespace", "queue"],
        )
        .map_err(err)?;
        let admission_wait = HistogramVec::new(
            HistogramOpts::new(
                "trainyard_admission_wait_seconds",
                "Time a TrainingJob attempt spent Queued before it was admitted",
            )
            .buckets(vec![
                1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
            ]),
            &["queue"],
        )
        .map_err(err)?;
        registry.register(Box::new(jobs.clone())).map_err(err)?;
        registry.register(Box::new(outcomes.clone())).map_err(err)?;
        registry.register(Box::new(restarts.clone())).map_err(err)?;
        registry
            .register(Box::new(preemptions.clone()))
            .map_err(err)?;
        registry
            .register(Box::new(admission_wait.clone()))
            .map_err(err)?;
        Ok(Self {
            jobs,
            outcomes,
            restarts,
            preemptions,
            admission_wait,
            known: Mutex::default(),
        })
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the state a job's status now shows (None: no status yet).
    pub fn observe_state(
        &self,
        key: &str,
        namespace: &str,
        queue: &str,
        state: Option<TrainingJobState>,
    ) {
        let mut known = self.known();
        let entry = known.entry(key.to_string()).or_insert_with(|| Known {
            namespace: namespace.to_string(),
            queue: queue.to_string(),
            state: None,
            restart_count: None,
            queued_at: None,
        });
        if entry.state == state && entry.queue == queue {
            return;
        }
        if let Some(old) = entry.state {
            self.jobs
                .with_label_values(&[&entry.namespace, &entry.queue, old.as_str()])
                .dec();
        }
        if let Some(new) = state {
            self.jobs
                .with_label_values(&[namespace, queue, new.as_str()])
                .inc();
        }
        entry.queue = queue.to_string();
        entry.state = state;
    }

    /// Counts what a published transition means: an outcome, a restart, the
    /// end of a wait for admission.
    pub fn transitioned(&self, key: &str, namespace: &str, transition: &TrainingJobTransitioned) {
        let mut known = self.known();
        let queue = transition.queue.as_deref().unwrap_or_default();
        let entry = known.entry(key.to_string()).or_insert_with(|| Known {
            namespace: namespace.to_string(),
            queue: queue.to_string(),
            state: None,
            restart_count: None,
            queued_at: None,
        });
        let queue = entry.queue.clone();
        if let Some(before) = entry.restart_count
            && transition.restart_count > before
        {
            self.restarts
                .with_label_values(&[namespace, &queue])
                .inc_by(u64::from(transition.restart_count - before));
        }
        entry.restart_count = Some(transition.restart_count);
        match transition.to {
            TrainingJobState::Queued => entry.queued_at = Some(Instant::now()),
            TrainingJobState::Initializing | TrainingJobState::Running => {
                if let Some(at) = entry.queued_at.take() {
                    self.admission_wait
                        .with_label_values(&[&queue])
                        .observe(at.elapsed().as_secs_f64());
                }
            }
            TrainingJobState::Completed | TrainingJobState::Failed => {
                entry.queued_at = None;
                let outcome = if transition.to == TrainingJobState::Completed {
                    "completed"
                } else {
                    "failed"
                };
                self.outcomes
                    .with_label_values(&[
                        namespace,
                        &queue,
                        outcome,
                        reason_label(&transition.reason),
                    ])
                    .inc();
            }
            TrainingJobState::Pending | TrainingJobState::Suspended => entry.queued_at = None,
        }
    }

    /// Counts a preemption decision about a job.
    pub fn preempted(&self, key: &str, namespace: &str) {
        let queue = self
            .known()
            .get(key)
            .map(|known| known.queue.clone())
            .unwrap_or_default();
        self.preemptions
            .with_label_values(&[namespace, &queue])
            .inc();
    }

    /// A deleted job leaves the by-state gauge.
    pub fn forget(&self, key: &str) {
        if let Some(known) = self.known().remove(key)
            && let Some(state) = known.state
        {
            self.jobs
                .with_label_values(&[&known.namespace, &known.queue, state.as_str()])
                .dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> (Registry, JobMetrics) {
        let registry = Registry::new();
        let metrics = JobMetrics::register(&registry).expect("registers");
        (registry, metrics)
    }

    fn transition(
        from: Option<TrainingJobState>,
        to: TrainingJobState,
        reason: &str,
        restart_count: u32,
    ) -> TrainingJobTransitioned {
        TrainingJobTransitioned {
            from,
            to,
            reason: reason.into(),
            message: String::new(),
            restart_count,
            gpus: 0,
            queue: Some("research".into()),
            context: Default::default(),
        }
    }

    fn gauge(metrics: &JobMetrics, state: &str) -> i64 {
        metrics
            .jobs
            .with_label_values(&["ml", "research", state])
            .get()
    }

    #[test]
    fn jobs_move_between_states_and_leave_when_deleted() {
        let (_, metrics) = metrics();
        metrics.observe_state("ml/a", "ml", "research", Some(TrainingJobState::Queued));
        metrics.observe_state("ml/b", "ml", "research", Some(TrainingJobState::Queued));
        metrics.observe_state("ml/a", "ml", "research", Some(TrainingJobState::Running));
        metrics.observe_state("ml/a", "ml", "research", Some(TrainingJobState::Running));
        assert_eq!(gauge(&metrics, "Queued"), 1);
        assert_eq!(gauge(&metrics, "Running"), 1);
        metrics.forget("ml/a");
        metrics.forget("ml/a");
        assert_eq!(gauge(&metrics, "Running"), 0);
        assert_eq!(gauge(&metrics, "Queued"), 1);
    }

    #[test]
    fn outcomes_restarts_and_admission_waits_are_counted_per_queue() {
        use TrainingJobState::*;
        let (_, metrics) = metrics();
        let steps = [
            transition(None, Pending, "Created", 0),
            transition(Some(Pending), Queued, "Queued", 0),
            transition(Some(Queued), Running, "Training", 0),
            transition(Some(Running), Queued, "RestartBackoff", 1),
            transition(Some(Queued), Running, "Training", 1),
            transition(Some(Running), Queued, "RestartBackoff", 2),
            transition(Some(Queued), Failed, "BackoffLimitExceeded", 2),
        ];
        for step in &steps {
            metrics.transitioned("ml/a", "ml", step);
        }
        metrics.transitioned(
            "ml/b",
            "ml",
            &transition(Some(Running), Failed, "exit code 3: see the logs", 0),
        );
        let failed = |reason: &str| {
            metrics
                .outcomes
                .with_label_values(&["ml", "research", "failed", reason])
                .get()
        };
        assert_eq!(failed("BackoffLimitExceeded"), 1);
        assert_eq!(failed("Other"), 1, "free text is not a label value");
        assert_eq!(
            metrics
                .restarts
                .with_label_values(&["ml", "research"])
                .get(),
            2
        );
        let waits = metrics
            .admission_wait
            .with_label_values(&["research"])
            .get_sample_count();
        assert_eq!(
            waits, 2,
            "two admissions out of Queued; the failure is none"
        );
    }

    #[test]
    fn preemptions_are_counted_under_the_jobs_queue() {
        let (_, metrics) = metrics();
        metrics.observe_state("ml/a", "ml", "research", Some(TrainingJobState::Running));
        metrics.preempted("ml/a", "ml");
        assert_eq!(
            metrics
                .preemptions
                .with_label_values(&["ml", "research"])
                .get(),
            1
        );
    }
}
