//! "Queued too long" with an explicit clock: each call names the time.

use chrono::{DateTime, Duration, TimeZone, Utc};
use notifier_core::queued::{QUEUED_TOO_LONG, QueueWait, WaitObservation, due, observe};
use notifier_core::{Routing, events_of};
use trainyard_api::TrainingJobState;
use trainyard_contracts::decisions::{
    BestTrial, ParameterValue, PendingExplained, SweepProgressed, Unschedulable,
};
use trainyard_contracts::lifecycle::{TrainingJobTransitioned, TransitionContext};
use trainyard_contracts::{EntityRef, Envelope, Incoming};

const ROUTES: &str = r##"
route:
  receiver: training
  routes:
    - matchers: ['team="nlp"']
      receiver: nlp
      queued_too_long_after: 10m
      continue: true
    - matchers: ['event="job.queued_too_long"']
      receiver: ops
receivers:
  - name: training
    slack: {channel: "#training", webhook_url_file: /secrets/slack-url}
  - name: nlp
    slack: {channel: "#nlp", token_file: /secrets/slack-token}
  - name: ops
    webhook: {url: "http://127.0.0.1:9/hooks", secret_file: /secrets/ops}
subscriptions:
  slack_receiver: nlp
  allowed_channels: ["#team-*"]
queued_too_long:
  after: 1h
  queues:
    a100-spot: 4h
"##;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 7, 9, 0, 0)
        .single()
        .expect("a Monday")
}

fn job() -> EntityRef {
    EntityRef::new("ml", "bert", "uid-bert")
}

fn transition(to: TrainingJobState, attempt: u32, queue: &str) -> WaitObservation {
    WaitObservation::Transitioned(Box::new(TrainingJobTransitioned {
        from: Some(TrainingJobState::Pending),
        to,
        reason: if to == TrainingJobState::Queued {
            "WaitingForAdmission".into()
        } else {
            "Admitted".into()
        },
        message: format!("waiting for queue {queue} to admit 8 GPUs (1 workers × 8)"),
        restart_count: attempt,
        gpus: 0,
        queue: Some(queue.into()),
        context: TransitionContext::default(),
    }))
}

fn pending(queue: &str) -> WaitObservation {
    WaitObservation::Pending(PendingExplained {
        attempt: None,
        queue: queue.into(),
        position: 3,
        flavor: Some("a100".into()),
        gpus_requested: 8,
        gpus_short: 8,
        message: "quota: flavor a100 nvidia.com/gpu: needs 8, queue can take 0; 8 short".into(),
        unschedulable: None,
        pod_policy: None,
    })
}

/// Folds observations, each at `t0 + minutes`.
fn fold(steps: &[(i64, WaitObservation)]) -> Option<QueueWait> {
    let mut wait: Option<QueueWait> = None;
    for (minutes, observation) in steps {
        if let Some(next) = observe(
            wait.as_ref(),
            &job(),
            observation,
            t0() + Duration::minutes(*minutes),
        ) {
            wait = Some(next);
        }
    }
    wait
}

fn routing() -> Routing {
    Routing::from_yaml(ROUTES).expect("valid")
}

#[test]
fn a_job_queued_past_its_threshold_is_told_once_naming_queue_wait_and_pending_reason() {
    let routing = routing();
    let mut wait = fold(&[
        (0, transition(TrainingJobState::Queued, 0, "team-a")),
        (1, pending("team-a")),
    ])
    .expect("waits");

    let early = due(&wait, &routing, t0() + Duration::minutes(59));
    assert!(early.notify.is_empty(), "the default threshold is 1h");
    assert_eq!(early.next, Some(t0() + Duration::hours(1)));

    let late = due(&wait, &routing, t0() + Duration::minutes(61));
    let receivers: Vec<String> = late
        .notify
        .iter()
        .map(|(r, _)| r.destination.key())
        .collect();
    assert_eq!(receivers, ["ops"]);
    let event = &late.notify[0].1;
    assert_eq!(event.kind, QUEUED_TOO_LONG);
    assert_eq!(event.title, "ml/bert queued for 1h 1m in queue team-a");
    assert_eq!(event.reason, "WaitingForQuota");
    assert!(
        event.text.contains("position 3 in queue team-a"),
        "{}",
        event.text
    );
    assert!(event.text.contains("8 short"), "{}", event.text);
    assert!(
        event
            .fields
            .contains(&("Waiting".to_string(), "1h 1m".to_string()))
    );

    let again = due(&wait, &routing, t0() + Duration::minutes(62));
    assert_eq!(
        again.notify[0].1.id, event.id,
        "the id does not depend on when it is asked"
    );
    wait.notified.insert("ops".into());
    let after = due(&wait, &routing, t0() + Duration::hours(5));
    assert!(after.notify.is_empty(), "told once per attempt");
    assert_eq!(after.next, None);
}

#[test]
fn a_job_no_node_could_hold_is_told_with_reason_unschedulable() {
    let WaitObservation::Pending(mut explained) = pending("team-a") else {
        panic!("a pending observation");
    };
    explained.message = "no node can hold a worker: spec.gpusPerWorker is 16 but the largest \
                         node (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and \
                         raise numWorkers"
        .into();
    explained.unschedulable = Some(Box::new(Unschedulable {
        field: "spec.gpusPerWorker".into(),
        largest_node: "gpu-node-3".into(),
        largest_node_gpus: 8,
        resource: "nvidia.com/gpu".into(),
        detail: "spec.gpusPerWorker is 16 but the largest node (gpu-node-3) has 8 GPUs".into(),
        fix: "lower gpusPerWorker to at most 8 and raise numWorkers".into(),
    }));
    let wait = fold(&[
        (0, transition(TrainingJobState::Queued, 0, "team-a")),
        (1, WaitObservation::Pending(explained)),
    ])
    .expect("waits");
    let late = due(&wait, &routing(), t0() + Duration::minutes(61));
    let event = &late.notify[0].1;
    assert_eq!(event.reason, "Unschedulable");
    assert!(
        event.text.contains("spec.gpusPerWorker is 16"),
        "{}",
        event.text
    );
}

#[test]
fn admission_running_completion_and_deletion_cancel_the_wait() {
    let routing = routing();
    let queued = (0, transition(TrainingJobState::Queued, 0, "team-a"));
    for (what, end) in [
        ("admission", WaitObservation::Admitted { attempt: 0 }),
        (
            "start",
            transition(TrainingJobState::Initializing, 0, "team-a"),
        ),
        (
            "completion",
            transition(TrainingJobState::Completed, 0, "team-a"),
        ),
        (
            "suspension",
            transition(TrainingJobState::Suspended, 0, "team-a"),
        ),
        ("deletion", WaitObservation::Deleted),
    ] {
        let wait = fold(&[queued.clone(), (30, end)]).expect("kept");
        assert!(!wait.is_waiting(), "{what}");
        let told = due(&wait, &routing, t0() + Duration::hours(10));
        assert!(told.notify.is_empty(), "{what} cancels");
        assert_eq!(told.next, None, "{what}");
    }
    // A Queued message older than the admission (handled late, by another
    // replica) does not open the wait again.
    let wait = fold(&[
        (30, WaitObservation::Admitted { attempt: 0 }),
        queued.clone(),
    ])
    .expect("the admission is kept");
    assert!(!wait.is_waiting());
    assert!(
        fold(&[(30, transition(TrainingJobState::Running, 0, "team-a"))]).is_none(),
        "transitions of a job never seen waiting store nothing"
    );
    let wait = fold(&[
        queued,
        (30, WaitObservation::Admitted { attempt: 0 }),
        (20, transition(TrainingJobState::Queued, 0, "team-a")),
    ])
    .expect("kept");
    assert!(!wait.is_waiting());
}

#[test]
fn an_admission_for_an_older_attempt_does_not_cancel_a_new_wait() {
    let wait = fold(&[
        (0, transition(TrainingJobState::Queued, 1, "team-a")),
        (5, WaitObservation::Admitted { attempt: 0 }),
    ])
    .expect("waits");
    assert!(wait.is_waiting());
}

#[test]
fn each_attempt_waits_afresh_under_its_own_event_id() {
    let routing = routing();
    let first = fold(&[(0, transition(TrainingJobState::Queued, 0, "team-a"))]).expect("waits");
    let first_event = due(&first, &routing, t0() + Duration::hours(2)).notify[0]
        .1
        .clone();
    let mut told = first.clone();
    told.notified.insert("ops".into());
    let mut wait = told;
    for (minutes, observation) in [
        (120, transition(TrainingJobState::Running, 0, "team-a")),
        (180, transition(TrainingJobState::Queued, 1, "team-a")),
    ] {
        wait = observe(
            Some(&wait),
            &job(),
            &observation,
            t0() + Duration::minutes(minutes),
        )
        .expect("changes");
    }
    assert!(wait.notified.is_empty());
    let second = due(&wait, &routing, t0() + Duration::minutes(241));
    assert_eq!(second.notify.len(), 1);
    assert_ne!(second.notify[0].1.id, first_event.id);
    assert!(
        second.notify[0]
            .1
            .fields
            .contains(&("Restarts".to_string(), "1".to_string()))
    );
}

#[test]
fn a_repeated_queued_message_keeps_the_time_the_wait_began() {
    let wait = fold(&[
        (0, transition(TrainingJobState::Queued, 0, "team-a")),
        (40, transition(TrainingJobState::Queued, 0, "team-a")),
    ])
    .expect("waits");
    assert_eq!(wait.queued_since, Some(t0()));
}

#[test]
fn thresholds_come_from_the_route_then_the_queue_then_the_default() {
    let routing = routing();
    let mut nlp =
        fold(&[(0, transition(TrainingJobState::Queued, 0, "a100-spot"))]).expect("waits");
    nlp.labels.insert("team".into(), "nlp".into());
    let at_11m = due(&nlp, &routing, t0() + Duration::minutes(11));
    let keys: Vec<String> = at_11m
        .notify
        .iter()
        .map(|(r, _)| r.destination.key())
        .collect();
    assert_eq!(keys, ["nlp"], "the nlp route's 10m beats the queue's 4h");
    assert_eq!(
        at_11m.next,
        Some(t0() + Duration::hours(4)),
        "ops waits for the queue's 4h"
    );
    let at_3h = due(&nlp, &routing, t0() + Duration::hours(3));
    assert_eq!(at_3h.notify.len(), 1);
    let at_4h = due(&nlp, &routing, t0() + Duration::hours(4));
    assert_eq!(at_4h.notify.len(), 2);
}

#[test]
fn subscriptions_hear_queued_too_long_only_when_they_ask_for_it() {
    let routing = routing();
    let mut wait = fold(&[(0, transition(TrainingJobState::Queued, 0, "team-a"))]).expect("waits");
    wait.annotations
        .insert("trainyard.dev/notify".into(), "slack:#team-a".into());
    let keys = |wait: &QueueWait| -> Vec<String> {
        due(wait, &routing, t0() + Duration::hours(2))
            .notify
            .iter()
            .map(|(r, _)| r.destination.key())
            .collect()
    };
    assert_eq!(keys(&wait), ["ops"], "not a default subscription event");
    wait.annotations.insert(
        "trainyard.dev/notify-on".into(),
        "job.queued_too_long,job.failed".into(),
    );
    assert_eq!(keys(&wait), ["ops", "nlp/#team-a"]);
}

#[test]
fn bad_thresholds_name_the_field() {
    for (yaml, field) in [
        (
            ROUTES.replace("a100-spot: 4h", "a100-spot: soon"),
            "queued_too_long.queues.a100-spot",
        ),
        (
            ROUTES.replace("after: 1h", "after: 1y"),
            "queued_too_long.after",
        ),
        (
            ROUTES.replace("queued_too_long_after: 10m", "queued_too_long_after: x"),
            "route.routes[0].queued_too_long_after",
        ),
    ] {
        let err = Routing::from_yaml(&yaml).expect_err("invalid");
        assert!(err.to_string().starts_with(field), "{err}");
    }
}

#[test]
fn a_sweep_annotated_for_a_channel_is_routed_there() {
    let routing = routing();
    let envelope = Envelope::new(
        "hpo-tuner",
        EntityRef::new("ml", "resnet-sweep", "uid-sweep"),
        SweepProgressed {
            pending: 0,
            running: 1,
            succeeded: 3,
            failed: 0,
            early_stopped: 1,
            best_trial: Some(BestTrial {
                trial_name: "resnet-sweep-t0002".into(),
                parameters: [("lr".to_string(), ParameterValue::Float(0.01))].into(),
                objective_value: 0.91,
            }),
            rungs: Default::default(),
            finished_reason: None,
            message: None,
            objective_metric: Some("accuracy".into()),
            labels: [("team".to_string(), "vision".to_string())].into(),
            annotations: [(
                "trainyard.dev/notify".to_string(),
                "slack:#team-vision".to_string(),
            )]
            .into(),
            tracking_warning: None,
        },
    );
    let incoming = Incoming::decode(&envelope.to_json().expect("json")).expect("decodes");
    let events = events_of(&incoming).expect("known");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "sweep.best_trial");
    assert!(
        events[0].title.contains("accuracy 0.9100"),
        "{}",
        events[0].title
    );
    let keys: Vec<String> = routing
        .route(&events[0])
        .routed
        .iter()
        .map(|r| r.destination.key())
        .collect();
    assert_eq!(keys, ["training", "nlp/#team-vision"]);
}
