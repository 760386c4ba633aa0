use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use notifier_core::delivery::{self, Pacer, Verdict};
use notifier_core::render::{self, limits};
use notifier_core::sign::{self, SigningKey};
use notifier_core::{Added, Event, Grouper, Routing, coalesce, events_of};
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_contracts::lifecycle::{TrainingJobTransitioned, TransitionContext};
use trainyard_contracts::{EntityRef, Envelope, Incoming};

const ROUTES: &str = r##"
route:
  receiver: slack-default
  group_by: [event, owner]
  group_wait: 10s
  group_interval: 1m
  repeat_interval: 1h
  routes:
    - matchers: ['team="nlp"']
      receiver: nlp
      continue: true
    - matchers: ['event=~"job\.(failed|restarted)"', 'namespace!="sandbox"']
      receiver: ci
      group_wait: 0s
    - matchers: ['severity="info"']
      receiver: slack-default
      mute_time_intervals: [weekend]
receivers:
  - name: slack-default
    slack: {channel: "#training", webhook_url_file: /secrets/slack-url}
  - name: nlp
    slack: {channel: "#nlp", token_file: /secrets/slack-token}
  - name: ci
    webhook: {url: "http://127.0.0.1:9/hooks", secret_file: /secrets/ci}
time_intervals:
  - name: weekend
    weekdays: [saturday, sunday]
subscriptions:
  slack_receiver: nlp
  allowed_channels: ["#team-*"]
  allowed_webhooks: [ci]
"##;

fn transition(
    ns: &str,
    name: &str,
    to: TrainingJobState,
    reason: &str,
    context: TransitionContext,
) -> Event {
    let envelope = Envelope::new(
        "planner",
        EntityRef::new(ns, name, format!("uid-{name}")),
        TrainingJobTransitioned {
            from: Some(TrainingJobState::Running),
            to,
            reason: reason.into(),
            message: "worker 0 exited with code 137 (OOMKilled)".into(),
            restart_count: 0,
            gpus: 0,
            queue: Some("team-a".into()),
            context,
        },
    );
    let incoming = Incoming::decode(&envelope.to_json().expect("encodes")).expect("decodes");
    events_of(&incoming).expect("known type").remove(0)
}

fn failed(ns: &str, name: &str) -> Event {
    transition(
        ns,
        name,
        TrainingJobState::Failed,
        "PermanentFailure",
        TransitionContext::default(),
    )
}

fn receivers(routing: &Routing, event: &Event) -> Vec<String> {
    routing
        .route(event)
        .routed
        .iter()
        .map(|r| r.destination.key())
        .collect()
}

#[test]
fn routes_match_labels_continue_and_fall_back_to_the_root() {
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let mut nlp_failure = failed("ml", "bert");
    nlp_failure.labels.insert("team".into(), "nlp".into());
    assert_eq!(
        receivers(&routing, &nlp_failure),
        ["nlp", "ci"],
        "continue goes on to the next route"
    );
    assert_eq!(receivers(&routing, &failed("ml", "gpt")), ["ci"]);
    assert_eq!(
        receivers(&routing, &failed("sandbox", "toy")),
        ["slack-default"],
        "no route matches: the root's receiver"
    );
}

#[test]
fn mute_windows_silence_matching_routes() {
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let mut completed = transition(
        "ml",
        "bert",
        TrainingJobState::Completed,
        "Succeeded",
        TransitionContext::default(),
    );
    completed.time = Utc
        .with_ymd_and_hms(2026, 12, 5, 12, 0, 0)
        .single()
        .expect("a Saturday");
    let outcome = routing.route(&completed);
    assert_eq!(outcome.muted, 1);
    assert!(outcome.routed.is_empty());
    completed.time = Utc
        .with_ymd_and_hms(2026, 12, 7, 12, 0, 0)
        .single()
        .expect("a Monday");
    assert_eq!(receivers(&routing, &completed), ["slack-default"]);
}

#[test]
fn subscriptions_reach_only_destinations_the_operator_allowed() {
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let context = TransitionContext {
        annotations: [(
            "trainyard.dev/notify".to_string(),
            "slack:#team-a, slack:#random, webhook:ci, webhook:http://169.254.169.254/".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let event = transition(
        "sandbox",
        "toy",
        TrainingJobState::Failed,
        "WorkerFailed",
        context.clone(),
    );
    let outcome = routing.route(&event);
    let keys: Vec<String> = outcome.routed.iter().map(|r| r.destination.key()).collect();
    assert_eq!(keys, ["slack-default", "nlp/#team-a", "ci"]);
    assert_eq!(outcome.refused.len(), 2, "{:?}", outcome.refused);
    assert!(outcome.refused.iter().any(|r| r.contains("#random")));
    assert!(
        outcome.refused.iter().any(|r| r.contains("169.254")),
        "no URL from a user is ever called"
    );

    let mut running = transition(
        "sandbox",
        "toy",
        TrainingJobState::Running,
        "AllWorkersRunning",
        context,
    );
    running.time = Utc
        .with_ymd_and_hms(2026, 12, 7, 12, 0, 0)
        .single()
        .expect("a Monday");
    assert_eq!(
        receivers(&routing, &running),
        ["slack-default"],
        "subscriptions hear the default events only (job.running is not one)"
    );
}

#[test]
fn bad_configs_name_the_field() {
    let cases = [
        (
            ROUTES.replace("receiver: ci\n", "receiver: cii\n"),
            "route.routes[1].receiver",
        ),
        (
            ROUTES.replace("'team=\"nlp\"'", "'team~nlp'"),
            "route.routes[0].matchers[0]",
        ),
        (
            ROUTES.replace("event=~\"job", "event=~\"(job"),
            "route.routes[1].matchers[0]",
        ),
        (
            ROUTES.replace("[weekend]", "[weekends]"),
            "route.routes[2].mute_time_intervals[0]",
        ),
        (
            ROUTES.replace("group_wait: 0s", "group_wait: 10 seconds"),
            "route.routes[1].group_wait",
        ),
        (
            ROUTES.replace("slack_receiver: nlp", "slack_receiver: slack-default"),
            "subscriptions.slack_receiver",
        ),
        (
            ROUTES.replace("http://127.0.0.1:9/hooks", "ftp://x"),
            "receivers[2].webhook.url",
        ),
        (
            ROUTES.replace("[saturday, sunday]", "[caturday]"),
            "time_intervals[0].weekdays",
        ),
    ];
    for (yaml, field) in cases {
        let err = Routing::from_yaml(&yaml).expect_err(field).to_string();
        assert!(err.contains(field), "{field} not in: {err}");
    }
}

fn routed_for(routing: &Routing, event: &Event) -> notifier_core::Routed {
    routing.route(event).routed.remove(0)
}

#[test]
fn groups_wait_then_follow_the_interval() {
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let mut grouper = Grouper::default();
    let t0 = Instant::now();
    let first = failed("sandbox", "a");
    let routed = routed_for(&routing, &first);
    assert_eq!(routed.policy.group_wait, Duration::from_secs(10));
    grouper.add(routed.clone(), first, 1, t0);
    grouper.add(
        routed.clone(),
        failed("sandbox", "b"),
        2,
        t0 + Duration::from_secs(5),
    );
    assert!(
        grouper.due(t0 + Duration::from_secs(9)).is_empty(),
        "group_wait not over"
    );
    assert_eq!(grouper.next_due(), Some(t0 + Duration::from_secs(10)));
    let batches = grouper.due(t0 + Duration::from_secs(10));
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].members.len(), 2);

    grouper.add(
        routed.clone(),
        failed("sandbox", "c"),
        3,
        t0 + Duration::from_secs(20),
    );
    assert!(
        grouper.due(t0 + Duration::from_secs(69)).is_empty(),
        "group_interval after the last send"
    );
    assert_eq!(grouper.due(t0 + Duration::from_secs(70)).len(), 1);
    assert_eq!(grouper.pending(), 0);
}

#[test]
fn a_repeated_alert_waits_for_the_repeat_interval() {
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let envelope = Envelope::new(
        "cost-optimizer",
        EntityRef::new("ml", "monthly", ""),
        trainyard_contracts::alerts::BudgetThresholdCrossed {
            severity: trainyard_contracts::alerts::Severity::Warning,
            threshold_percent: 80,
            spent: 800.0,
            budget: 1000.0,
            currency: "USD".into(),
            queue: None,
            message: String::new(),
        },
    );
    let alert = || {
        let mut e =
            events_of(&Incoming::decode(&envelope.to_json().expect("json")).expect("decodes"))
                .expect("known")
                .remove(0);
        e.id = uuid::Uuid::now_v7().to_string();
        e
    };
    let routed = routed_for(&routing, &alert());
    let mut grouper = Grouper::default();
    let t0 = Instant::now();
    assert_eq!(grouper.add(routed.clone(), alert(), (), t0), Added::Queued);
    assert_eq!(grouper.due(t0 + Duration::from_secs(10)).len(), 1);
    let later = t0 + Duration::from_secs(600);
    assert_eq!(
        grouper.add(routed.clone(), alert(), (), later),
        Added::Repeat
    );
    let after_repeat = t0 + Duration::from_secs(3700);
    assert_eq!(
        grouper.add(routed, alert(), (), after_repeat),
        Added::Queued
    );
}

#[test]
fn forty_trials_failing_alike_are_one_message_with_a_count() {
    let owner = EntityRef::new("ml", "resnet-sweep", "uid-sweep");
    let trials: Vec<Event> = (0..40)
        .map(|i| {
            let context = TransitionContext {
                owner: Some(owner.clone()),
                exit_code: Some(137),
                exit_class: Some("retryable".into()),
                ..Default::default()
            };
            transition(
                "ml",
                &format!("resnet-sweep-t{i:04}"),
                TrainingJobState::Failed,
                "BackoffLimitExceeded",
                context,
            )
        })
        .collect();
    let routing = Routing::from_yaml(ROUTES).expect("valid");
    let keys: std::collections::BTreeSet<String> = trials
        .iter()
        .map(|t| routed_for(&routing, t).group_key)
        .collect();
    assert_eq!(keys.len(), 1, "one group: same event and owner");
    let destination = routed_for(&routing, &trials[0]).destination;
    let notification = coalesce(destination.clone(), trials.clone(), Utc::now());
    assert_eq!(notification.lines.len(), 1);
    assert_eq!(notification.event_count(), 40);
    assert_eq!(
        notification.title,
        "40 trials of ml/resnet-sweep failed: BackoffLimitExceeded: exit code 137 (retryable)"
    );
    let mut reversed = trials;
    reversed.reverse();
    assert_eq!(
        coalesce(destination, reversed, Utc::now()).id,
        notification.id,
        "the id depends on the events, not their order"
    );
    let text = render::slack_text(&render::slack_message(&notification, None));
    assert!(text.contains("and 30 more"), "{text}");
}

#[test]
fn slack_messages_stay_within_block_kit_limits() {
    let mut events = Vec::new();
    for i in 0..120 {
        let mut e = failed("ml", &format!("job-{i}"));
        e.reason = format!("reason {i}");
        e.text = "x".repeat(5000);
        e.title = "y".repeat(400);
        events.push(e);
    }
    let notification = coalesce(
        notifier_core::Destination {
            receiver: "slack".into(),
            channel: None,
        },
        events,
        Utc::now(),
    );
    let message = render::slack_message(&notification, Some("#training"));
    let blocks = message["blocks"].as_array().expect("blocks");
    assert!(blocks.len() <= limits::BLOCKS, "{} blocks", blocks.len());
    assert!(
        blocks[0]["text"]["text"]
            .as_str()
            .expect("header")
            .chars()
            .count()
            <= limits::HEADER_CHARS
    );
    for block in blocks {
        if let Some(text) = block["text"]["text"].as_str() {
            assert!(text.chars().count() <= limits::SECTION_CHARS);
        }
    }
    assert!(render::slack_text(&message).contains("more kinds of events"));
    assert_eq!(message["channel"], "#training");
}

#[test]
fn a_single_failure_shows_fields_fix_and_links() {
    let context = TransitionContext {
        exit_code: Some(1),
        exit_class: Some("permanent".into()),
        fix: Some("fix the training script; exit code 1 is a program error".into()),
        links: [(
            "run".to_string(),
            "http://mlflow.example/#/runs/42".to_string(),
        )]
        .into(),
        duration_seconds: Some(3720),
        ..Default::default()
    };
    let event = transition(
        "ml",
        "bert",
        TrainingJobState::Failed,
        "PermanentFailure",
        context,
    );
    let notification = coalesce(
        notifier_core::Destination {
            receiver: "slack".into(),
            channel: None,
        },
        vec![event],
        Utc::now(),
    );
    let text = render::slack_text(&render::slack_message(&notification, None));
    for needle in [
        "▌:x: ml/bert failed",
        "Exit code: 1 (permanent)",
        "Duration: 1h 2m",
        "Fix:",
        "[Open run](http://mlflow.example/#/runs/42)",
        "Queue: team-a",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let body = render::webhook_body(&notification);
    assert_eq!(body["type"], "job.failed");
    assert_eq!(body["data"]["id"], json!(notification.id));
}

#[test]
fn signatures_follow_the_standard_webhooks_example() {
    // The example of the Standard Webhooks specification.
    let key =
        SigningKey::parse("example", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("valid");
    let headers = sign::headers(
        &[key.clone(), key],
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        br#"{"test": 2432232314}"#,
    )
    .expect("signs");
    assert_eq!(
        headers[2].1,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    );
    let err = SigningKey::parse("ci", "hunter2")
        .expect_err("not whsec")
        .to_string();
    assert!(err.contains("ci") && !err.contains("hunter2"), "{err}");
    assert!(
        format!(
            "{:?}",
            SigningKey::parse_file("ci", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").expect("ok")
        )
        .contains("redacted")
    );
}

#[test]
fn answers_decide_retries_with_backoff_and_retry_after() {
    assert_eq!(delivery::verdict(Some(204), None, ""), Verdict::Delivered);
    assert_eq!(delivery::verdict(Some(410), None, ""), Verdict::Gone);
    assert!(matches!(
        delivery::verdict(Some(400), None, "bad"),
        Verdict::Rejected { .. }
    ));
    let after = Some(Duration::from_secs(30));
    assert_eq!(
        delivery::verdict(Some(429), after, ""),
        Verdict::Retry {
            after,
            why: "HTTP 429".into()
        }
    );
    assert!(matches!(
        delivery::verdict(None, None, "timed out"),
        Verdict::Retry { .. }
    ));

    let schedule = delivery::default_schedule();
    assert_eq!(
        delivery::next_delay(&schedule, 0, 0.5, None),
        Some(Duration::from_secs(5))
    );
    let low = delivery::next_delay(&schedule, 1, 0.0, None).expect("scheduled");
    let high = delivery::next_delay(&schedule, 1, 0.999, None).expect("scheduled");
    assert!(low >= Duration::from_secs(240) && high <= Duration::from_secs(360) && low < high);
    assert_eq!(
        delivery::next_delay(&schedule, 0, 0.5, Some(Duration::from_secs(60))),
        Some(Duration::from_secs(60))
    );
    assert_eq!(
        delivery::next_delay(&schedule, schedule.len(), 0.5, None),
        None,
        "exhausted"
    );

    let now = Utc
        .with_ymd_and_hms(2026, 12, 6, 8, 0, 0)
        .single()
        .expect("time");
    assert_eq!(
        delivery::retry_after("7", now),
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        delivery::retry_after("Sun, 06 Dec 2026 08:00:30 GMT", now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(delivery::retry_after("soon", now), None);
}

#[test]
fn one_replica_owns_each_destination_and_pacing_spaces_sends() {
    let replicas: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let destinations: Vec<String> = (0..30).map(|i| format!("slack/#c{i}")).collect();
    let owners: Vec<&String> = destinations
        .iter()
        .map(|d| delivery::owner(d, &replicas).expect("an owner"))
        .collect();
    assert!(
        replicas.iter().all(|r| owners.contains(&r)),
        "every replica owns some"
    );
    let survivors: Vec<String> = ["a", "c"].map(String::from).to_vec();
    for (destination, owner) in destinations.iter().zip(&owners) {
        if owner.as_str() != "b" {
            assert_eq!(
                delivery::owner(destination, &survivors),
                Some(*owner),
                "only b's destinations move"
            );
        }
    }
    let mut pacer = Pacer::default();
    let t0 = Instant::now();
    let second = Duration::from_secs(1);
    assert_eq!(pacer.reserve("#a", t0, second), t0);
    assert_eq!(pacer.reserve("#a", t0, second), t0 + second);
    assert_eq!(
        pacer.reserve("#b", t0, second),
        t0,
        "channels are paced apart"
    );
    pacer.hold("#a", t0 + Duration::from_secs(30));
    assert_eq!(
        pacer.reserve("#a", t0, second),
        t0 + Duration::from_secs(30)
    );
}

#[test]
fn unknown_types_and_bad_payloads_are_errors() {
    let envelope = Envelope::new(
        "x",
        EntityRef::new("ml", "bert", ""),
        trainyard_contracts::worker::ProgressReported {
            worker_index: 0,
            attempt: 0,
            epoch: 1,
            total_epochs: None,
            step: 1,
            metrics: Default::default(),
        },
    );
    let incoming = Incoming::decode(&envelope.to_json().expect("json")).expect("decodes");
    let err = events_of(&incoming).expect_err("not for the notifier");
    assert_eq!(err.category(), "unknown_event_type");
    assert!(err.to_string().contains("worker.progress"));
}

#[test]
fn the_shipped_routing_config_is_valid() {
    let manifest = include_str!("../../../../deploy/notifier.yaml");
    let docs: yaml_serde::Value = yaml_serde::from_str(manifest).expect("YAML");
    let routes = docs["data"]["routes.yaml"]
        .as_str()
        .expect("routes.yaml key");
    let routing = Routing::from_yaml(routes).expect("valid");
    let mut running = transition(
        "ml",
        "bert",
        TrainingJobState::Running,
        "AllWorkersRunning",
        TransitionContext::default(),
    );
    running.time = Utc::now();
    assert!(
        routing.route(&running).routed.is_empty(),
        "starts are muted"
    );
    assert_eq!(receivers(&routing, &failed("ml", "bert")), ["slack"]);
}

#[test]
fn the_compose_stacks_routing_config_and_signing_secret_are_valid() {
    let routing = Routing::from_yaml(include_str!("../../../../compose/notifier/routes.yaml"))
        .expect("valid");
    assert_eq!(receivers(&routing, &failed("ml", "bert")), ["webhook-sink"]);
    let keys = SigningKey::parse_file(
        "webhook-signing",
        include_str!("../../../../compose/notifier/webhook-signing"),
    )
    .expect("a whsec_ secret");
    assert_eq!(keys.len(), 1);
}
