//! The planner's state machine, driven message by message through `observe` and
//! `decide`, with the harness in `common` standing in for the shell. Time is a plain
//! value the tests move forward; nothing here waits.

#![allow(clippy::unwrap_used)]

mod common;

use common::{
    Harness, admission, applied, checkpoint, condition, deleted, job_event, pending, pod_event,
    pod_failed, preemption, progress, spec, training_job, ungated, verified_resume_point,
    worker_pod,
};
use planner_core::CHECKPOINT_INTERVAL_KEY;
use planner_core::{
    CONDITION_ADMITTED, CONDITION_FAILED, CONDITION_PREEMPTED, CONDITION_RUNNING,
    CONDITION_SUCCEEDED, CONDITION_SUSPENDED, MAX_EPOCH_METRICS, Observation, Observed,
    PLACEMENT_GATE, PlannerAction, PlannerCommand, PlannerConfig, PlannerJobState, RESUME_FROM_KEY,
    decide, observe,
};
use trainyard_api::{
    CheckpointFrequency, CheckpointSpec, FailurePolicy, RestartPolicy, SuccessPolicy,
    TrainingJobSpec, TrainingJobState,
};
use trainyard_contracts::decisions::{ResumePointChosen, TrialStopped};
use trainyard_contracts::events::{JobObserved, PodObserved};

fn states(harness: &Harness) -> Vec<TrainingJobState> {
    harness.transitions.iter().map(|t| t.to).collect()
}

fn recreate_delay(actions: &[PlannerAction]) -> Option<(u32, u64)> {
    actions.iter().find_map(|a| match a {
        PlannerAction::RecreateAfter { attempt, delay } => Some((*attempt, delay.as_secs())),
        _ => None,
    })
}

fn with_failure_policy(
    restart_policy: RestartPolicy,
    backoff_limit: Option<u32>,
) -> TrainingJobSpec {
    TrainingJobSpec {
        failure_policy: Some(FailurePolicy {
            restart_policy: Some(restart_policy),
            backoff_limit,
            active_deadline_seconds: None,
        }),
        ..spec(2)
    }
}

/// Fails attempt `attempt` with `exit_code` on worker 1 and decides.
fn fail_worker_one(harness: &mut Harness, attempt: u32, exit_code: i32) -> Vec<PlannerAction> {
    let name = harness.name();
    fail_with(harness, attempt, pod_failed(&name, attempt, 1, exit_code))
}

/// `pod` ends the attempt, and the Job controller fails the Job.
fn fail_with(harness: &mut Harness, attempt: u32, pod: PodObserved) -> Vec<PlannerAction> {
    let name = harness.name();
    harness.observe(Observation::Pod(pod));
    let mut failed_job = job_event(&name, attempt, false, 0);
    failed_job.failed = 1;
    failed_job.conditions = vec![condition("Failed", "BackoffLimitExceeded")];
    harness.observe(Observation::Job(failed_job));
    harness.decide()
}

/// The job waits to restart as `attempt` + 1; the clock moves past the backoff.
fn expect_restart(harness: &mut Harness, actions: &[PlannerAction], attempt: u32) {
    assert_eq!(
        harness.state_now(),
        Some(TrainingJobState::Pending),
        "after attempt {attempt}"
    );
    let (next, delay) = recreate_delay(actions).unwrap();
    assert_eq!(next, attempt + 1);
    harness.advance(i64::try_from(delay).unwrap());
}

#[test]
fn happy_path_goes_pending_queued_initializing_running_completed() {
    let mut h = Harness::new(training_job("mnist", spec(2)));

    let actions = h.decide();
    let created = applied(&actions);
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].job_name(), "mnist-a0");
    assert!(
        created[0].job_suspended(),
        "created suspended until admitted"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Pending));

    h.observe(Observation::Job(job_event("mnist", 0, true, 0)));
    h.observe(Observation::Pending(pending(3)));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));
    let waiting = h.condition(CONDITION_ADMITTED).unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("WaitingForQuota"));
    let message = waiting.message.unwrap_or_default();
    assert!(message.contains("position 3 in queue default"), "{message}");
    assert!(message.contains("needs 2 more"), "{message}");
    let queue = h.status().queue.unwrap();
    assert_eq!((queue.name.as_str(), queue.position), ("default", Some(3)));
    assert!(queue.reason.unwrap_or_default().contains("needs 2 more"));

    h.observe(Observation::Admission(admission(0, 2)));
    let actions = h.decide();
    let unsuspended = applied(&actions);
    assert_eq!(unsuspended.len(), 1);
    assert!(!unsuspended[0].job_suspended());
    let pod = worker_pod(unsuspended[0]).unwrap();
    assert_eq!(
        pod.node_selector
            .as_ref()
            .unwrap()
            .get("nvidia.com/gpu.product")
            .map(String::as_str),
        Some("A100-SXM4-80GB")
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
    assert_eq!(h.status().queue, None, "an admitted job no longer waits");

    h.advance(5);
    let mut started = job_event("mnist", 0, false, 2);
    started.start_time = Some(h.now);
    h.observe(Observation::Job(started));
    h.observe(Observation::Pod(pod_event("mnist", 0, 0, "Running")));
    let actions = h.decide();
    assert!(
        applied(&actions).is_empty(),
        "a started Job is never re-applied"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
    h.observe(Observation::Pod(pod_event("mnist", 0, 1, "Running")));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
    let status = h.status();
    let resources = status.resources.unwrap();
    assert_eq!(resources.gpus, 2);
    assert_eq!(resources.nodes, ["gpu-node-0", "gpu-node-1"]);
    assert_eq!(resources.flavor.as_deref(), Some("a100-80gb"));
    assert!(h.condition(CONDITION_RUNNING).unwrap().is_true());

    for epoch in 1..=4 {
        h.advance(60);
        h.observe(Observation::Progress(progress(
            0,
            0,
            epoch,
            &[("loss", 1.0 / f64::from(epoch))],
        )));
    }
    h.observe(Observation::Checkpoint(checkpoint(0, 4)));
    h.decide();
    let status = h.status();
    assert_eq!(status.progress.as_deref(), Some("40%"));
    assert_eq!(status.current_epoch, Some(4));
    assert_eq!(status.total_epochs, Some(10));
    assert_eq!(status.metrics.get("loss"), Some(&0.25));
    let saved = status.checkpoint.unwrap();
    assert_eq!(saved.latest_epoch, Some(4));
    assert_eq!(saved.count, 1);

    h.advance(3600);
    let mut done = job_event("mnist", 0, false, 0);
    done.succeeded = 2;
    done.conditions = vec![condition("Complete", "CompletionsReached")];
    done.completion_time = Some(h.now);
    h.observe(Observation::Job(done));
    h.decide();
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Completed));
    assert_eq!(status.progress.as_deref(), Some("100%"));
    assert!(status.completion_time.is_some());
    assert_eq!(status.duration.as_deref(), Some("1h4m0s"));
    assert_eq!(status.restart_count, Some(0));
    assert_eq!(status.observed_generation, Some(1));
    assert!(h.condition(CONDITION_SUCCEEDED).unwrap().is_true());
    assert_eq!(
        states(&h),
        [
            TrainingJobState::Pending,
            TrainingJobState::Queued,
            TrainingJobState::Initializing,
            TrainingJobState::Running,
            TrainingJobState::Completed,
        ]
    );
    assert_eq!(h.transitions[3].gpus, 2, "a running job holds its GPUs");
    assert_eq!(h.transitions[4].gpus, 0, "a finished job holds none");

    // A terminal job stays terminal: nothing further happens.
    h.advance(60);
    assert!(h.decide().is_empty());
    assert_eq!(h.applied_jobs.len(), 1);

    // The workers' last reports may arrive after the Job's end, on their own
    // stream: they fill in the final epoch without changing the state.
    h.observe(Observation::Progress(progress(0, 0, 10, &[("loss", 0.05)])));
    h.observe(Observation::Checkpoint(checkpoint(0, 10)));
    let actions = h.decide();
    assert!(
        matches!(actions.as_slice(), [PlannerAction::UpdateStatus(_)]),
        "{actions:?}"
    );
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Completed));
    assert_eq!(status.current_epoch, Some(10));
    assert_eq!(status.progress.as_deref(), Some("100%"));
    assert_eq!(status.metrics.get("loss"), Some(&0.05));
    assert_eq!(status.checkpoint.and_then(|c| c.latest_epoch), Some(10));
    assert_eq!(h.transitions.len(), 5, "no new transition");
    assert!(h.decide().is_empty(), "and nothing more once folded in");
}

#[test]
fn retryable_failure_restarts_after_backoff_from_the_newest_verified_checkpoint() {
    let mut h = Harness::new(training_job(
        "bert",
        with_failure_policy(RestartPolicy::ExitCode, Some(3)),
    ));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 4)));
    h.observe(Observation::ResumePoint(verified_resume_point(
        &checkpoint(0, 4),
    )));
    // Reported but not (yet) verified by the checkpoint-manager: never resumed from.
    h.observe(Observation::Checkpoint(checkpoint(0, 5)));

    let actions = fail_worker_one(&mut h, 0, 137);
    assert!(
        applied(&actions).is_empty(),
        "the restart waits for its backoff"
    );
    assert_eq!(recreate_delay(&actions), Some((1, 10)));
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Pending));
    assert_eq!(status.restart_count, Some(1));
    let requeue_at = status
        .requeue_at
        .expect("the backoff's end, for the gpu-allocator");
    assert_eq!(
        requeue_at.0.as_second(),
        (h.now + chrono::TimeDelta::seconds(10)).timestamp()
    );
    let message = h
        .condition(CONDITION_RUNNING)
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(message.contains("worker 1"), "{message}");
    assert!(message.contains("exited with code 137"), "{message}");
    assert!(message.contains("restart 1 of 3 as attempt 1"), "{message}");

    h.advance(10);
    let actions = h.decide();
    let restarted = applied(&actions);
    assert_eq!(restarted.len(), 1);
    assert_eq!(restarted[0].job_name(), "bert-a1", "a retry is a fresh Job");
    assert_eq!(h.status().requeue_at, None, "created: it queues now");
    assert!(
        restarted[0].job_suspended(),
        "the new attempt waits for re-admission"
    );
    let resume = restarted[0]
        .config_map
        .data
        .as_ref()
        .unwrap()
        .get(RESUME_FROM_KEY)
        .cloned();
    assert_eq!(
        resume.as_deref(),
        Some("s3://ml-checkpoints/run/checkpoint-epoch-4")
    );

    h.run_attempt_until_running(1);
    assert_eq!(h.status().restart_count, Some(1));

    // The second failure waits twice as long.
    h.advance(100);
    let actions = fail_worker_one(&mut h, 1, 143);
    assert_eq!(recreate_delay(&actions), Some((2, 20)));
    assert_eq!(h.status().restart_count, Some(2));
}

#[test]
fn permanent_failure_under_exit_code_policy_fails_at_once() {
    let mut h = Harness::new(training_job(
        "bert",
        with_failure_policy(RestartPolicy::ExitCode, Some(3)),
    ));
    h.run_attempt_until_running(0);
    let actions = fail_worker_one(&mut h, 0, 1);
    assert!(applied(&actions).is_empty());
    assert!(recreate_delay(&actions).is_none());
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Failed));
    let reason = status.failure_reason.unwrap_or_default();
    assert!(
        reason.starts_with("PermanentFailure: worker 1 (pod bert-a0-1-abcde) exited with code 1"),
        "{reason}"
    );
    assert!(h.condition(CONDITION_FAILED).unwrap().is_true());
}

#[test]
fn transitions_carry_what_the_notifier_needs() {
    let mut job = training_job(
        "bert",
        with_failure_policy(RestartPolicy::ExitCode, Some(3)),
    );
    job.metadata.labels = Some([("team".to_string(), "nlp".to_string())].into());
    job.metadata.annotations = Some(
        [
            (
                "trainyard.dev/notify".to_string(),
                "slack:#team-nlp".to_string(),
            ),
            (
                "trainyard.dev/run-url".to_string(),
                "http://mlflow.example/#/runs/7".to_string(),
            ),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
        ]
        .into(),
    );
    let mut h = Harness::new(job);
    h.run_attempt_until_running(0);
    fail_worker_one(&mut h, 0, 1);
    let failed = h.transitions.last().unwrap();
    assert_eq!(failed.to, TrainingJobState::Failed);
    let context = &failed.context;
    assert_eq!(context.labels.get("team").map(String::as_str), Some("nlp"));
    assert_eq!(
        context.annotations.keys().collect::<Vec<_>>(),
        ["trainyard.dev/notify"],
        "only the notification annotations travel"
    );
    assert_eq!(
        context.links.get("run").map(String::as_str),
        Some("http://mlflow.example/#/runs/7")
    );
    assert_eq!(context.exit_code, Some(1));
    assert_eq!(context.exit_class.as_deref(), Some("permanent"));
    assert!(
        context
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("kubectl logs")
    );
    let running = &h.transitions[h.transitions.len() - 2];
    assert_eq!(
        running.context.exit_code, None,
        "no failure before the failure"
    );
}

#[test]
fn on_failure_policy_retries_program_errors_and_never_policy_retries_nothing() {
    let mut on_failure = Harness::new(training_job(
        "a",
        with_failure_policy(RestartPolicy::OnFailure, Some(1)),
    ));
    on_failure.run_attempt_until_running(0);
    let actions = fail_worker_one(&mut on_failure, 0, 1);
    assert_eq!(recreate_delay(&actions), Some((1, 10)));

    let mut never = Harness::new(training_job(
        "b",
        with_failure_policy(RestartPolicy::Never, None),
    ));
    never.run_attempt_until_running(0);
    let actions = fail_worker_one(&mut never, 0, 137);
    assert!(recreate_delay(&actions).is_none());
    let reason = never.status().failure_reason.unwrap_or_default();
    assert!(reason.starts_with("WorkerFailed: worker 1"), "{reason}");
    assert!(reason.contains("restartPolicy Never"), "{reason}");
}

#[test]
fn backoff_limit_exhausted_fails_with_exit_code_and_worker() {
    let mut h = Harness::new(training_job(
        "gpt",
        with_failure_policy(RestartPolicy::OnFailure, Some(2)),
    ));
    for attempt in 0..=2 {
        h.run_attempt_until_running(attempt);
        let actions = fail_worker_one(&mut h, attempt, 137);
        if attempt < 2 {
            expect_restart(&mut h, &actions, attempt);
        }
    }
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Failed));
    assert_eq!(status.restart_count, Some(2));
    let reason = status.failure_reason.unwrap_or_default();
    assert!(
        reason.starts_with(
            "BackoffLimitExceeded: worker 1 (pod gpt-a2-1-abcde) exited with code 137"
        ),
        "{reason}"
    );
    assert!(reason.contains("all 2 restarts"), "{reason}");
    let jobs: Vec<&str> = h.applied_jobs.iter().map(String::as_str).collect();
    assert_eq!(jobs, ["gpt-a0", "gpt-a1", "gpt-a2"]);
    // The failed attempt's Job is kept for its logs, the one before goes.
    assert!(h.deleted_jobs.contains(&"gpt-a0".to_owned()));
    assert!(!h.deleted_jobs.contains(&"gpt-a2".to_owned()));
}

#[test]
fn spot_reclaims_restart_without_spending_the_backoff_budget() {
    let mut h = Harness::new(training_job(
        "gpt",
        with_failure_policy(RestartPolicy::OnFailure, Some(1)),
    ));
    // Three reclaims in a row, more than backoffLimit allows failures.
    for attempt in 0..3 {
        h.run_attempt_until_running(attempt);
        let mut reclaimed = pod_failed("gpt", attempt, 1, 143);
        reclaimed.conditions = vec![condition("DisruptionTarget", "TerminationByKubelet")];
        let actions = fail_with(&mut h, attempt, reclaimed);
        expect_restart(&mut h, &actions, attempt);
    }
    h.run_attempt_until_running(3);
    assert_eq!(h.state.failed_attempts, 0, "a reclaim is not a failure");
    // Program failures still count: one restart, then the job fails.
    let actions = fail_worker_one(&mut h, 3, 137);
    expect_restart(&mut h, &actions, 3);
    h.run_attempt_until_running(4);
    fail_worker_one(&mut h, 4, 137);
    assert_eq!(h.state_now(), Some(TrainingJobState::Failed));
}

#[test]
fn suspend_stops_the_workers_after_a_checkpoint_request_and_resume_starts_a_new_attempt() {
    let mut h = Harness::new(training_job("bert", spec(2)));
    h.run_attempt_until_running(0);

    h.job.spec.suspend = Some(true);
    h.job.metadata.generation = Some(2);
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["bert-a0"]);
    assert_eq!(h.state_now(), Some(TrainingJobState::Suspended));
    assert!(h.condition(CONDITION_SUSPENDED).unwrap().is_true());
    assert!(matches!(
        h.commands.as_slice(),
        [PlannerCommand::CheckpointNow(_)]
    ));
    assert!(
        h.status().resources.is_none(),
        "a suspended job holds no GPUs"
    );

    let mut gone = job_event("bert", 0, false, 0);
    gone.change = trainyard_contracts::events::Change::Deleted;
    h.observe(Observation::Job(gone));
    let actions = h.decide();
    assert!(applied(&actions).is_empty(), "nothing runs while suspended");
    assert_eq!(h.commands.len(), 1, "the checkpoint request is sent once");

    h.job.spec.suspend = Some(false);
    h.job.metadata.generation = Some(3);
    let actions = h.decide();
    let resumed = applied(&actions);
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].job_name(), "bert-a1");
    assert_eq!(h.state_now(), Some(TrainingJobState::Pending));
    assert_eq!(
        h.condition(CONDITION_SUSPENDED).unwrap().reason.as_deref(),
        Some("Resumed")
    );
    h.run_attempt_until_running(1);
    assert_eq!(h.state.failed_attempts, 0, "a suspend is not a failure");
}

#[test]
fn a_job_created_suspended_stays_suspended_and_queued_objects_exist() {
    let mut job_spec = spec(2);
    job_spec.suspend = Some(true);
    let mut h = Harness::new(training_job("later", job_spec));
    let actions = h.decide();
    let created = applied(&actions);
    assert_eq!(created.len(), 1);
    assert!(created[0].job_suspended());
    assert_eq!(h.state_now(), Some(TrainingJobState::Suspended));
    assert!(h.commands.is_empty(), "nothing ran, nothing to checkpoint");
}

#[test]
fn success_policy_target_reached_sends_stop_and_completes() {
    let mut job_spec = spec(2);
    job_spec.success_policy = Some(SuccessPolicy {
        target_accuracy: Some(0.9),
        early_stopping_patience: None,
        metric: Some("accuracy".into()),
    });
    let mut h = Harness::new(training_job("resnet", job_spec));
    h.run_attempt_until_running(0);
    h.observe(Observation::Progress(progress(
        0,
        0,
        1,
        &[("accuracy", 0.7)],
    )));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
    h.advance(60);
    h.observe(Observation::Progress(progress(
        0,
        0,
        2,
        &[("accuracy", 0.93)],
    )));
    let actions = h.decide();
    let status = h.status();
    assert_eq!(status.state, Some(TrainingJobState::Completed));
    assert_eq!(
        h.condition(CONDITION_SUCCEEDED).unwrap().reason.as_deref(),
        Some("TargetReached")
    );
    assert!(matches!(h.commands.as_slice(), [PlannerCommand::Stop(_)]));
    assert!(
        deleted(&actions).is_empty(),
        "the workers get a grace period to stop"
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, PlannerAction::RecheckAfter { .. }))
    );

    h.advance(i64::from(h.config.stop_grace_period_seconds));
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["resnet-a0"]);
    assert_eq!(h.commands.len(), 1, "stop is sent once");
}

#[test]
fn success_policy_patience_stops_training_that_no_longer_improves() {
    let mut job_spec = spec(1);
    job_spec.success_policy = Some(SuccessPolicy {
        target_accuracy: None,
        early_stopping_patience: Some(2),
        metric: Some("val_loss".into()),
    });
    let mut h = Harness::new(training_job("patient", job_spec));
    h.run_attempt_until_running(0);
    for (epoch, loss) in [(1, 0.9), (2, 0.5), (3, 0.55)] {
        h.observe(Observation::Progress(progress(
            0,
            0,
            epoch,
            &[("val_loss", loss)],
        )));
    }
    h.decide();
    assert_eq!(
        h.state_now(),
        Some(TrainingJobState::Running),
        "one epoch without improvement"
    );
    h.observe(Observation::Progress(progress(
        0,
        0,
        4,
        &[("val_loss", 0.51)],
    )));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Completed));
    let message = h
        .condition(CONDITION_SUCCEEDED)
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(
        message.contains("has not improved on 0.5 (epoch 2) for 2 epochs"),
        "{message}"
    );
}

/// A job of many epochs keeps a bounded window of metrics in its state (the
/// store's value limit would otherwise stop it), and the patience still counts
/// from the best value, even once that epoch has left the window.
#[test]
fn a_long_job_keeps_a_bounded_metrics_window_and_patience_remembers_the_best() {
    let mut job_spec = spec(1);
    job_spec.success_policy = Some(SuccessPolicy {
        target_accuracy: None,
        early_stopping_patience: Some(MAX_EPOCH_METRICS as u32 + 10),
        metric: Some("val_loss".into()),
    });
    let mut h = Harness::new(training_job("long", job_spec));
    h.run_attempt_until_running(0);
    h.observe(Observation::Progress(progress(
        0,
        0,
        1,
        &[("val_loss", 0.1)],
    )));
    let last = MAX_EPOCH_METRICS as u32 + 10;
    for epoch in 2..=last {
        h.observe(Observation::Progress(progress(
            0,
            0,
            epoch,
            &[("val_loss", 0.5)],
        )));
        h.decide();
        assert_eq!(
            h.state_now(),
            Some(TrainingJobState::Running),
            "epoch {epoch}"
        );
    }
    assert_eq!(h.state.epoch_metrics.len(), MAX_EPOCH_METRICS);
    assert!(!h.state.epoch_metrics.contains_key(&1));
    h.observe(Observation::Progress(progress(
        0,
        0,
        last + 1,
        &[("val_loss", 0.5)],
    )));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Completed));
    let message = h
        .condition(CONDITION_SUCCEEDED)
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(
        message.contains("has not improved on 0.1 (epoch 1)"),
        "{message}"
    );
}

#[test]
fn trial_stopped_by_the_tuner_completes_early() {
    let mut h = Harness::new(training_job("sweep-t3", spec(1)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Progress(progress(0, 0, 3, &[("loss", 0.7)])));
    h.observe(Observation::TrialStopped(TrialStopped {
        trial_name: "sweep-t3".into(),
        reason: "below the median at rung 3".into(),
        rung: Some(3),
    }));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Completed));
    assert!(matches!(h.commands.as_slice(), [PlannerCommand::Stop(_)]));
    let status = h.status();
    assert_eq!(
        (status.progress.as_deref(), status.current_epoch),
        (Some("30%"), Some(3)),
        "an early-stopped trial keeps the progress it reached"
    );
    let succeeded = h.condition(CONDITION_SUCCEEDED).unwrap();
    assert_eq!(succeeded.reason.as_deref(), Some("TrialEarlyStopped"));

    // The stopped workers exit cleanly, and their Job completes: the trial
    // still stopped early.
    h.advance(5);
    let mut done = job_event("sweep-t3", 0, false, 0);
    done.succeeded = 1;
    done.conditions = vec![condition("Complete", "CompletionsReached")];
    done.completion_time = Some(h.now);
    h.observe(Observation::Job(done));
    h.decide();
    let status = h.status();
    assert_eq!(
        (status.state, status.progress.as_deref()),
        (Some(TrainingJobState::Completed), Some("30%")),
        "still the progress it reached"
    );
    let succeeded = h.condition(CONDITION_SUCCEEDED).unwrap();
    assert_eq!(succeeded.reason.as_deref(), Some("TrialEarlyStopped"));
}

#[test]
fn stale_attempt_reports_are_ignored() {
    let mut h = Harness::new(training_job("bert", spec(2)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Progress(progress(0, 0, 3, &[("loss", 0.4)])));
    fail_worker_one(&mut h, 0, 137);
    h.advance(10);
    h.run_attempt_until_running(1);
    h.observe(Observation::Progress(progress(1, 0, 2, &[("loss", 0.3)])));
    h.decide();
    let before = h.status();

    assert_eq!(
        h.observe(Observation::Progress(progress(0, 0, 9, &[("loss", 9.0)]))),
        Observed::StaleAttempt {
            attempt: 0,
            current: 1
        }
    );
    assert_eq!(
        h.observe(Observation::Checkpoint(checkpoint(0, 9))),
        Observed::StaleAttempt {
            attempt: 0,
            current: 1
        }
    );
    assert_eq!(
        h.observe(Observation::Pod(pod_failed("bert", 0, 0, 1))),
        Observed::StaleAttempt {
            attempt: 0,
            current: 1
        }
    );
    assert_eq!(
        h.observe(Observation::Admission(admission(0, 2))),
        Observed::StaleAttempt {
            attempt: 0,
            current: 1
        }
    );
    assert_eq!(
        h.observe(Observation::Progress(progress(7, 0, 9, &[]))),
        Observed::FutureAttempt {
            attempt: 7,
            current: 1
        }
    );
    let actions = h.decide();
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, PlannerAction::UpdateStatus(_))),
        "{actions:?}"
    );
    assert_eq!(h.status(), before);
    assert_eq!(h.status().metrics.get("loss"), Some(&0.3));
}

#[test]
fn preemption_checkpoints_then_requeues_without_spending_the_backoff_budget() {
    let mut h = Harness::new(training_job("bert", spec(2)));
    h.run_attempt_until_running(0);
    let evict_at = h.now + chrono::TimeDelta::seconds(60);
    h.observe(Observation::Preemption(preemption(evict_at)));
    let actions = h.decide();
    assert!(
        deleted(&actions).is_empty(),
        "the workers get the grace period"
    );
    let requested = h.commands.iter().find_map(|c| match c {
        PlannerCommand::CheckpointNow(request) => Some(request.deadline),
        PlannerCommand::Stop(_) | PlannerCommand::CheckpointInterval(_) => None,
    });
    assert_eq!(requested, Some(evict_at));
    assert!(h.condition(CONDITION_PREEMPTED).unwrap().is_true());
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));

    // The checkpoint landed: no need to wait for the eviction time.
    h.advance(20);
    h.observe(Observation::Checkpoint(checkpoint(0, 6)));
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["bert-a0"]);
    let next = applied(&actions);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].job_name(), "bert-a1");
    assert_eq!(h.status().restart_count, Some(1));

    let mut gone = job_event("bert", 0, false, 0);
    gone.change = trainyard_contracts::events::Change::Deleted;
    h.observe(Observation::Job(gone));
    h.observe(Observation::Pod(pod_failed("bert", 0, 1, 143)));
    h.run_attempt_until_running(1);
    assert_eq!(
        h.state.failed_attempts, 0,
        "preemptions do not count against backoffLimit"
    );
    assert_eq!(
        h.condition(CONDITION_PREEMPTED).unwrap().reason.as_deref(),
        Some("Readmitted")
    );
    assert_eq!(h.commands.len(), 1, "one checkpoint request per preemption");
}

/// The gpu-allocator explains a preempted job's next wait as soon as it
/// hears of the new attempt, which can be before the planner sees that
/// attempt's Job; it says so once, so the explanation is kept for the attempt
/// it names, and one about an attempt already over is dropped.
#[test]
fn a_wait_explained_before_its_attempt_starts_is_shown_once_it_does() {
    let mut h = Harness::new(training_job("drained", spec(1)));
    h.run_attempt_until_running(0);
    h.observe(Observation::Preemption(preemption(h.now)));
    h.decide();
    assert_eq!(h.status().restart_count, Some(1));

    let mut on_hold = pending(1);
    on_hold.attempt = Some(1);
    on_hold.message = "TrainingQueue default is on hold (stopPolicy: HoldAndDrain)".into();
    assert_eq!(
        h.observe(Observation::Pending(on_hold.clone())),
        Observed::Recorded
    );
    let mut earlier = pending(3);
    earlier.attempt = Some(0);
    assert!(matches!(
        h.observe(Observation::Pending(earlier.clone())),
        Observed::NotApplicable
    ));

    let mut gone = job_event("drained", 0, false, 0);
    gone.change = trainyard_contracts::events::Change::Deleted;
    h.observe(Observation::Job(gone));
    h.observe(Observation::Job(job_event("drained", 1, true, 0)));
    h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));
    let admitted = h.condition("Admitted").expect("Admitted");
    assert_eq!(
        admitted.message.as_deref(),
        Some(
            "position 1 in queue default: TrainingQueue default is on hold (stopPolicy: HoldAndDrain)"
        )
    );
    assert!(matches!(
        h.observe(Observation::Pending(earlier)),
        Observed::StaleAttempt {
            attempt: 0,
            current: 1
        }
    ));
}

/// Required node-affinity terms of the job's worker template, each as
/// (key, operator, values) per expression.
fn required_terms(
    objects: &planner_core::DesiredObjects,
) -> Vec<Vec<(String, String, Vec<String>)>> {
    let pod = worker_pod(objects).unwrap();
    pod.affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| {
                    t.match_expressions
                        .iter()
                        .flatten()
                        .map(|e| {
                            (
                                e.key.clone(),
                                e.operator.clone(),
                                e.values.clone().unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The worker template's objects once `affinity` is admitted with two
/// workers on one node and the third on another: (while suspended, admitted).
fn admitted_with(
    name: &str,
    affinity: k8s_openapi::api::core::v1::Affinity,
) -> (planner_core::DesiredObjects, planner_core::DesiredObjects) {
    admitted_within(name, affinity, &[])
}

/// `admitted_with`, the allocator reporting every worker in the domains
/// `topology` (label key, value).
fn admitted_within(
    name: &str,
    affinity: k8s_openapi::api::core::v1::Affinity,
    topology: &[(&str, &str)],
) -> (planner_core::DesiredObjects, planner_core::DesiredObjects) {
    let mut job_spec = spec(3);
    job_spec.scheduling = Some(trainyard_api::SchedulingSpec {
        affinity: Some(affinity),
        ..trainyard_api::SchedulingSpec::default()
    });
    let mut h = Harness::new(training_job(name, job_spec));
    let created = h.decide();
    let suspended = applied(&created)[0].clone();
    h.observe(Observation::Job(job_event(name, 0, true, 0)));
    let mut admitted = admission(0, 3);
    admitted.placements[1].node = "gpu-node-0".into();
    admitted.topology = topology
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    h.observe(Observation::Admission(admitted));
    let actions = h.decide();
    let unsuspended = applied(&actions);
    assert_eq!(unsuspended.len(), 1);
    assert!(!unsuspended[0].job_suspended());
    (suspended, unsuspended[0].clone())
}

#[test]
fn admitted_workers_are_pinned_to_the_planned_nodes_unless_a_rule_was_not_planned_for() {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        PodAffinity, PodAffinityTerm, PodAntiAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    // Pods labelled `key: value`, per host.
    let per_host = |key: &str, value: &str| PodAffinityTerm {
        topology_key: "kubernetes.io/hostname".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some([(key.into(), value.into())].into()),
            ..LabelSelector::default()
        }),
        ..PodAffinityTerm::default()
    };
    // The reference's advanced example: one worker per node, which the
    // gpu-allocator plans for.
    let apart = Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![per_host(
                "training-job",
                "apart",
            )]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    };
    let (suspended, admitted) = admitted_with("apart", apart);
    assert!(
        required_terms(&suspended).is_empty(),
        "no pin before admission"
    );
    assert_eq!(
        required_terms(&admitted),
        vec![vec![(
            "kubernetes.io/hostname".to_owned(),
            "In".to_owned(),
            vec!["gpu-node-0".to_owned(), "gpu-node-2".to_owned()],
        )]]
    );
    assert!(
        worker_pod(&admitted)
            .and_then(|pod| pod.affinity.as_ref())
            .is_some_and(|a| a.pod_anti_affinity.is_some()),
        "the user's rule stays"
    );

    // Required node affinity is planned for: the pin joins each term.
    let zone = Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "topology.kubernetes.io/zone".into(),
                        operator: "In".into(),
                        values: Some(vec!["z1".into()]),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
            ..NodeAffinity::default()
        }),
        ..Affinity::default()
    };
    let (suspended, admitted) = admitted_with("zoned", zone.clone());
    let users = required_terms(&suspended);
    assert_eq!(users.len(), 1);
    let pinned = required_terms(&admitted);
    assert_eq!(pinned.len(), 1);
    assert_eq!(pinned[0][0], users[0][0]);
    assert_eq!(pinned[0][1].0, "kubernetes.io/hostname");

    // Affinity to other pods is not: the scheduler picks the nodes, within
    // the flavor's selector, as before.
    let near_cache = Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![per_host(
                "app", "cache",
            )]),
            ..PodAffinity::default()
        }),
        ..zone
    };
    let (suspended, admitted) = admitted_with("near-cache", near_cache);
    assert_eq!(required_terms(&admitted), required_terms(&suspended));

    // Affinity among the job's own workers within a zone is planned for
    // where the allocator put the whole gang in one zone.
    let one_zone = Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                topology_key: "topology.kubernetes.io/zone".into(),
                ..per_host("trainyard.dev/job", "together")
            }]),
            ..PodAffinity::default()
        }),
        ..Affinity::default()
    };
    let (_, within) = admitted_within(
        "together",
        one_zone.clone(),
        &[("topology.kubernetes.io/zone", "z1")],
    );
    assert_eq!(
        required_terms(&within),
        vec![vec![(
            "kubernetes.io/hostname".to_owned(),
            "In".to_owned(),
            vec!["gpu-node-0".to_owned(), "gpu-node-2".to_owned()],
        )]]
    );
    let (suspended, spread) = admitted_with("together", one_zone);
    assert_eq!(required_terms(&spread), required_terms(&suspended));
    assert!(required_terms(&spread).is_empty());
}

#[test]
fn workers_planned_onto_several_nodes_are_gated_then_each_given_the_node_of_its_index() {
    let gates = |objects: &planner_core::DesiredObjects| -> Vec<String> {
        worker_pod(objects)
            .and_then(|pod| pod.scheduling_gates.as_ref())
            .into_iter()
            .flatten()
            .map(|gate| gate.name.clone())
            .collect()
    };
    // Two workers on gpu-node-0 and the third on gpu-node-2.
    let (suspended, admitted) = admitted_with("split", Default::default());
    assert!(gates(&suspended).is_empty(), "no gate before admission");
    assert_eq!(gates(&admitted), [PLACEMENT_GATE]);

    let mut h = Harness::new(training_job("split", spec(3)));
    h.decide();
    h.observe(Observation::Job(job_event("split", 0, true, 0)));
    let mut placed = admission(0, 3);
    placed.placements[1].node = "gpu-node-0".into();
    h.observe(Observation::Admission(placed));
    h.decide();
    h.observe(Observation::Job(job_event("split", 0, false, 3)));
    let gated = |index: u32, gates: &[&str]| {
        let mut pod = pod_event("split", 0, index, "Pending");
        pod.node_name = None;
        pod.scheduling_gates = gates.iter().map(|g| (*g).to_owned()).collect();
        Observation::Pod(pod)
    };
    h.observe(gated(0, &[PLACEMENT_GATE]));
    h.observe(gated(1, &["example.com/other", PLACEMENT_GATE]));
    h.observe(gated(2, &[PLACEMENT_GATE]));
    assert_eq!(
        ungated(&h.decide()),
        [
            ("split-a0-0-abcde", Some("gpu-node-0")),
            ("split-a0-1-abcde", Some("gpu-node-0")),
            ("split-a0-2-abcde", Some("gpu-node-2")),
        ]
    );
    // Ungated pods, and gates that are not the planner's, are left alone.
    h.observe(gated(0, &[]));
    h.observe(gated(1, &["example.com/other"]));
    assert_eq!(
        ungated(&h.decide()),
        [("split-a0-2-abcde", Some("gpu-node-2"))]
    );
    // A pod deleted while gated has no gate to lift.
    let mut gone = pod_event("split", 0, 2, "Pending");
    gone.change = trainyard_contracts::events::Change::Deleted;
    gone.scheduling_gates = vec![PLACEMENT_GATE.to_owned()];
    h.observe(Observation::Pod(gone));
    assert!(ungated(&h.decide()).is_empty());
    h.observe(gated(2, &[PLACEMENT_GATE]));
    // A preempted attempt's pods stay gated: they are about to go.
    h.observe(Observation::Preemption(preemption(h.now)));
    assert!(ungated(&h.decide()).is_empty());

    // One node: the pin to the set is exact, and nothing waits for a gate.
    let mut h = Harness::new(training_job("together", spec(2)));
    h.decide();
    h.observe(Observation::Job(job_event("together", 0, true, 0)));
    let mut together = admission(0, 2);
    together.placements[1].node = "gpu-node-0".into();
    h.observe(Observation::Admission(together));
    let actions = h.decide();
    assert!(gates(applied(&actions)[0]).is_empty());
}

/// Attempt 0 of a two-worker job admitted and started: worker 0 runs, and
/// the scheduler finds no node for worker 1.
fn one_worker_unschedulable(name: &str, config: PlannerConfig) -> Harness {
    let mut h = Harness::new(training_job(name, spec(2)));
    h.config = config;
    h.decide();
    h.observe(Observation::Job(job_event(name, 0, true, 0)));
    h.observe(Observation::Admission(admission(0, 2)));
    h.decide();
    h.observe(Observation::Job(job_event(name, 0, false, 2)));
    h.observe(Observation::Pod(pod_event(name, 0, 0, "Running")));
    let mut stuck = pod_event(name, 0, 1, "Pending");
    stuck.node_name = None;
    stuck.conditions = vec![trainyard_contracts::events::ObservedCondition {
        condition_type: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".into()),
    }];
    h.observe(Observation::Pod(stuck));
    h
}

#[test]
fn a_worker_that_finds_no_node_gives_the_admission_back_after_the_timeout() {
    let mut h = one_worker_unschedulable("stuck", PlannerConfig::default());
    let actions = h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
    let running = h.condition(CONDITION_RUNNING).unwrap();
    assert_eq!(
        running.message.as_deref(),
        Some(
            "1 of 2 workers running; worker 1 unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
        )
    );
    assert!(actions.iter().any(|a| matches!(
        a,
        PlannerAction::RecheckAfter { delay, .. } if delay.as_secs() == 300
    )));

    h.advance(299);
    assert!(deleted(&h.decide()).is_empty(), "not before the timeout");
    h.advance(1);
    let actions = h.decide();
    assert_eq!(deleted(&actions), ["stuck-a0"]);
    let next = applied(&actions);
    assert_eq!(next[0].job_name(), "stuck-a1");
    assert!(
        next[0].job_suspended(),
        "attempt 1 waits for a new admission"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Pending));
    let admitted = h.condition(CONDITION_ADMITTED).unwrap();
    assert_eq!(admitted.reason.as_deref(), Some("WorkersUnschedulable"));
    assert!(
        h.recorded_events
            .iter()
            .any(|(warning, reason, message)| *warning
                && reason == "WorkersUnschedulable"
                && message.contains("worker 1 of attempt 0 found no node for 300s")),
        "{:?}",
        h.recorded_events
    );
    assert_eq!(
        h.state.failed_attempts, 0,
        "nothing failed: no restart spent"
    );

    // The deletion's echoes change nothing; attempt 1 starts fresh.
    h.observe(Observation::Job(JobObserved {
        change: trainyard_contracts::events::Change::Deleted,
        ..job_event("stuck", 0, false, 2)
    }));
    let actions = h.decide();
    assert_eq!(applied(&actions)[0].job_name(), "stuck-a1");
    h.observe(Observation::Job(job_event("stuck", 1, true, 0)));
    h.decide();
    assert_eq!(h.state.current.attempt, 1);
    assert_eq!(h.state.current.unschedulable_since, None);
}

#[test]
fn a_worker_bound_before_the_timeout_or_no_timeout_keeps_the_attempt() {
    // Without the pods-ready timeout, which would end a start this slow.
    let patient_pods = PlannerConfig {
        pods_ready_timeout_seconds: 0,
        ..PlannerConfig::default()
    };
    let mut h = one_worker_unschedulable("late", patient_pods.clone());
    h.decide();
    h.advance(200);
    h.observe(Observation::Pod(pod_event("late", 0, 1, "Pending")));
    h.decide();
    h.advance(200);
    assert!(deleted(&h.decide()).is_empty());
    assert_eq!(h.state.current.unschedulable_since, None);

    let never = PlannerConfig {
        unschedulable_timeout_seconds: 0,
        ..patient_pods
    };
    let mut h = one_worker_unschedulable("patient", never);
    h.decide();
    h.advance(86_400);
    assert!(deleted(&h.decide()).is_empty());
    assert_eq!(h.state_now(), Some(TrainingJobState::Initializing));
}

#[test]
fn an_admission_that_contradicts_the_spec_keeps_the_job_queued() {
    let mut job_spec = spec(2);
    job_spec.scheduling = Some(trainyard_api::SchedulingSpec {
        node_selector: [("nvidia.com/gpu.product".to_owned(), "H100".to_owned())].into(),
        ..trainyard_api::SchedulingSpec::default()
    });
    let mut h = Harness::new(training_job("h100-only", job_spec));
    h.decide();
    h.observe(Observation::Job(job_event("h100-only", 0, true, 0)));
    h.observe(Observation::Admission(admission(0, 2)));
    let actions = h.decide();
    let kept = applied(&actions);
    assert_eq!(kept.len(), 1);
    assert!(
        kept[0].job_suspended(),
        "a conflicting admission is not applied"
    );
    assert_eq!(h.state_now(), Some(TrainingJobState::Queued));
    let condition = h.condition(CONDITION_ADMITTED).unwrap();
    assert_eq!(condition.reason.as_deref(), Some("AdmissionConflict"));
    assert!(
        condition
            .message
            .unwrap_or_default()
            .contains("spec.scheduling.nodeSelector")
    );
}

#[test]
fn preflight_failures_fail_the_job_with_the_field_and_fix_and_create_nothing() {
    let config = PlannerConfig {
        largest_node_gpus: Some(8),
        ..PlannerConfig::default()
    };
    let mut too_big = spec(2);
    too_big.gpus_per_worker = Some(16);
    let mut bad_resume = spec(2);
    bad_resume.checkpoint = Some(CheckpointSpec {
        enabled: Some(true),
        resume_from: Some("checkpoints/epoch-3".into()),
        ..CheckpointSpec::default()
    });
    let mut invalid = spec(2);
    invalid.num_workers = 0;
    let mut gpu_mismatch = spec(2);
    gpu_mismatch.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some(
            [(
                "nvidia.com/gpu".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
            )]
            .into(),
        ),
        ..Default::default()
    });

    for (name, job_spec, reason, field) in [
        (
            "too-big",
            too_big,
            "GpusExceedLargestNode",
            "spec.gpusPerWorker",
        ),
        (
            "bad-resume",
            bad_resume,
            "UnparsableResumeFrom",
            "spec.checkpoint.resumeFrom",
        ),
        ("invalid", invalid, "InvalidSpec", "spec.numWorkers"),
        (
            "gpu-mismatch",
            gpu_mismatch,
            "GpuResourceMismatch",
            "spec.resources.limits",
        ),
        ("name.with.dots", spec(1), "UnusableName", "metadata.name"),
    ] {
        let mut h = Harness::new(training_job(name, job_spec));
        h.config = config.clone();
        let actions = h.decide();
        assert!(applied(&actions).is_empty(), "{name}: no objects");
        assert_eq!(h.state_now(), Some(TrainingJobState::Failed), "{name}");
        let failed = h.condition(CONDITION_FAILED).unwrap();
        assert_eq!(failed.reason.as_deref(), Some(reason), "{name}");
        let message = failed.message.unwrap_or_default();
        assert!(message.contains(field), "{name}: {message}");
    }
}

#[test]
fn active_deadline_counts_from_the_first_start_across_attempts() {
    let mut job_spec = spec(1);
    job_spec.failure_policy = Some(FailurePolicy {
        restart_policy: Some(RestartPolicy::OnFailure),
        backoff_limit: Some(5),
        active_deadline_seconds: Some(600),
    });
    let mut h = Harness::new(training_job("bounded", job_spec));
    h.run_attempt_until_running(0);
    let timer = h.decide().into_iter().find_map(|a| match a {
        PlannerAction::RecheckAfter { delay, .. } => Some(delay.as_secs()),
        _ => None,
    });
    assert_eq!(timer, Some(600));
    h.advance(300);
    let name = h.name();
    h.observe(Observation::Pod(pod_failed(&name, 0, 0, 137)));
    h.decide();
    h.advance(10);
    h.run_attempt_until_running(1);
    h.advance(300);
    let actions = h.decide();
    assert_eq!(h.state_now(), Some(TrainingJobState::Failed));
    assert_eq!(
        h.condition(CONDITION_FAILED).unwrap().reason.as_deref(),
        Some("DeadlineExceeded")
    );
    assert_eq!(deleted(&actions), ["bounded-a1"]);
}

#[test]
fn the_checkpoint_managers_choice_beats_the_spec_resume_point() {
    let mut job_spec = spec(1);
    job_spec.checkpoint = Some(CheckpointSpec {
        enabled: Some(true),
        resume_from: Some("s3://bucket/old/checkpoint-epoch-1".into()),
        ..CheckpointSpec::default()
    });
    let mut h = Harness::new(training_job("resumer", job_spec));
    h.observe(Observation::ResumePoint(ResumePointChosen {
        uri: "s3://bucket/new/checkpoint-epoch-7".into(),
        epoch: 7,
        step: 700,
        ..ResumePointChosen::default()
    }));
    let actions = h.decide();
    let objects = applied(&actions);
    let resume = objects[0]
        .config_map
        .data
        .as_ref()
        .unwrap()
        .get(RESUME_FROM_KEY)
        .cloned();
    assert_eq!(
        resume.as_deref(),
        Some("s3://bucket/new/checkpoint-epoch-7")
    );
}

/// Replays every message of a run with a restart into fresh states: the states agree,
/// decisions agree, and deciding again after the replay applies no Job that the first
/// run did not already create.
#[test]
fn replaying_the_same_messages_gives_the_same_decisions_and_no_second_job() {
    let mut h = Harness::new(training_job(
        "replay",
        with_failure_policy(RestartPolicy::OnFailure, Some(3)),
    ));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 2)));
    fail_worker_one(&mut h, 0, 137);
    h.advance(10);
    h.run_attempt_until_running(1);
    h.observe(Observation::Progress(progress(1, 0, 5, &[("loss", 0.2)])));
    h.decide();

    let replay = |log: &[(chrono::DateTime<chrono::Utc>, Observation)]| {
        let mut state = PlannerJobState::new();
        for (at, observation) in log {
            observe(&mut state, *at, observation.clone());
        }
        state
    };
    let first = replay(&h.log);
    let second = replay(&h.log);
    assert_eq!(first, second);
    assert_eq!(first, h.state);

    let once = decide(&h.job, &first, h.now, &h.config);
    let twice = decide(&h.job, &second, h.now, &h.config);
    assert_eq!(once, twice);
    assert!(
        once.iter().all(|a| match a {
            PlannerAction::ApplyObjects(objects) => h.applied_jobs.contains(objects.job_name()),
            _ => true,
        }),
        "{once:?}"
    );
    assert!(
        applied(&once).is_empty(),
        "a running attempt is never re-applied"
    );
    assert!(
        !once
            .iter()
            .any(|a| matches!(a, PlannerAction::UpdateStatus(_))),
        "the status is already written"
    );
    let jobs: Vec<&str> = h.applied_jobs.iter().map(String::as_str).collect();
    assert_eq!(jobs, ["replay-a0", "replay-a1"]);
}

#[test]
fn an_admission_for_the_next_attempt_during_backoff_starts_it_unsuspended() {
    let mut h = Harness::new(training_job(
        "eager",
        with_failure_policy(RestartPolicy::OnFailure, Some(3)),
    ));
    h.run_attempt_until_running(0);
    fail_worker_one(&mut h, 0, 137);
    assert_eq!(
        h.observe(Observation::Admission(admission(1, 2))),
        Observed::Recorded
    );
    h.advance(10);
    let actions = h.decide();
    let restarted = applied(&actions);
    assert_eq!(restarted.len(), 1);
    assert_eq!(restarted[0].job_name(), "eager-a1");
    assert!(
        !restarted[0].job_suspended(),
        "the early admission is applied at creation"
    );
    h.observe(Observation::Job(job_event("eager", 1, false, 2)));
    assert_eq!(
        h.state.current.admission.as_ref().map(|a| a.attempt),
        Some(1)
    );
    assert_eq!(h.state.failed_attempts, 1);
}

#[test]
fn a_training_job_being_deleted_gets_no_actions() {
    let mut h = Harness::new(training_job("leaving", spec(1)));
    h.run_attempt_until_running(0);
    h.job.metadata.deletion_timestamp = Some(kube_time(h.now));
    assert!(
        h.decide().is_empty(),
        "owner references let the garbage collector clean up"
    );
}

fn kube_time(
    at: chrono::DateTime<chrono::Utc>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(at.timestamp()).unwrap(),
    )
}

#[test]
fn preflight_guards_new_objects_but_never_fails_a_running_attempt() {
    let mut job_spec = spec(2);
    job_spec.gpus_per_worker = Some(8);
    let mut h = Harness::new(training_job("big", job_spec));
    h.run_attempt_until_running(0);
    h.config.largest_node_gpus = Some(4);
    let actions = h.decide();
    assert!(deleted(&actions).is_empty());
    assert_eq!(h.state_now(), Some(TrainingJobState::Running));
}

/// A diverged run reports NaN and infinite metrics: the report is kept (its
/// epoch and finite metrics reach the status), the non-finite values stay in
/// the planner's saved state, which reads back unchanged, and never reach the
/// TrainingJob's status, where Kubernetes numbers cannot hold them.
#[test]
fn non_finite_metrics_keep_the_report_and_stay_out_of_the_status() {
    let mut h = Harness::new(training_job("diverged", spec(1)));
    h.run_attempt_until_running(0);
    h.advance(60);
    h.observe(Observation::Progress(progress(
        0,
        0,
        3,
        &[
            ("loss", f64::NAN),
            ("grad_norm", f64::INFINITY),
            ("accuracy", 0.4),
        ],
    )));
    h.decide();
    let status = h.status();
    assert_eq!(status.current_epoch, Some(3));
    assert_eq!(
        status.metrics.keys().collect::<Vec<_>>(),
        ["accuracy"],
        "{:?}",
        status.metrics
    );

    let saved = serde_json::to_string(&h.state).expect("state saves");
    let restored: PlannerJobState = serde_json::from_str(&saved).expect("state reads back");
    let seen = restored.progress.expect("progress kept");
    assert!(seen.metrics["loss"].is_nan());
    assert_eq!(seen.metrics["grad_norm"], f64::INFINITY);
    assert_eq!(seen.metrics["accuracy"], 0.4);
}

fn interval_commands(actions: &[PlannerAction]) -> Vec<f64> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::SendCommand {
                command: PlannerCommand::CheckpointInterval(set),
                ..
            } => Some(set.interval_seconds),
            _ => None,
        })
        .collect()
}

fn advice(interval_seconds: f64) -> Observation {
    Observation::IntervalAdvised(trainyard_contracts::decisions::CheckpointIntervalAdvised {
        interval_seconds,
        save_seconds: 30.0,
        mean_seconds_between_interruptions: 54_000.0,
        applied: true,
    })
}

fn checkpointing(frequency: CheckpointFrequency) -> TrainingJobSpec {
    TrainingJobSpec {
        checkpoint: Some(CheckpointSpec {
            enabled: Some(true),
            frequency: Some(frequency),
            ..CheckpointSpec::default()
        }),
        ..spec(2)
    }
}

#[test]
fn frequency_auto_sends_each_new_advice_to_the_workers_once_and_gives_it_to_the_next_attempt() {
    let mut h = Harness::new(training_job(
        "gpt",
        checkpointing(CheckpointFrequency::Auto),
    ));
    h.run_attempt_until_running(0);
    let first = applied_env(&h, "CHECKPOINT_FREQUENCY");
    assert_eq!(first.and_then(|e| e.value).as_deref(), Some("auto"));

    // Advice follows a reported save (its duration is what it needs).
    h.observe(Observation::Checkpoint(checkpoint(0, 1)));
    h.observe(advice(1800.0));
    assert_eq!(interval_commands(&h.decide()), [1800.0]);
    assert_eq!(
        h.status().checkpoint.unwrap().advised_interval_seconds,
        Some(1800.0)
    );
    assert!(
        interval_commands(&h.decide()).is_empty(),
        "sent once: status shows it"
    );
    h.observe(advice(900.0));
    assert_eq!(interval_commands(&h.decide()), [900.0]);

    // The next attempt's workers read the latest advice when they start.
    let actions = fail_worker_one(&mut h, 0, 137);
    expect_restart(&mut h, &actions, 0);
    let actions = h.decide();
    let next = applied(&actions);
    assert_eq!(
        next[0]
            .config_map
            .data
            .as_ref()
            .and_then(|d| d.get(CHECKPOINT_INTERVAL_KEY))
            .map(String::as_str),
        Some("900")
    );
    let env = applied_env(&h, "CHECKPOINT_INTERVAL_SECONDS").expect("the variable");
    let from = env.value_from.and_then(|v| v.config_map_key_ref).unwrap();
    assert_eq!(from.key, CHECKPOINT_INTERVAL_KEY);
}

#[test]
fn a_fixed_frequency_gets_no_interval_commands() {
    let mut h = Harness::new(training_job(
        "bert",
        checkpointing(CheckpointFrequency::Epochs(2)),
    ));
    h.run_attempt_until_running(0);
    h.observe(Observation::Checkpoint(checkpoint(0, 2)));
    h.observe(advice(1800.0));
    assert!(interval_commands(&h.decide()).is_empty());
    assert_eq!(
        h.status().checkpoint.unwrap().advised_interval_seconds,
        Some(1800.0),
        "the advice is still shown"
    );
    assert!(applied_env(&h, "CHECKPOINT_INTERVAL_SECONDS").is_none());
}

/// The variable `name` of the first container of the last applied Job.
fn applied_env(h: &Harness, name: &str) -> Option<k8s_openapi::api::core::v1::EnvVar> {
    let objects = h.last_applied.as_ref()?;
    worker_pod(objects)?.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .cloned()
}
