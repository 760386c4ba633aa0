//! "Queued too long" end to end: real nats-server, notifier processes
//! restarted between the wait and its notification and after it, a fake Slack.

mod common;

use std::time::Duration;

use common::*;
use trainyard_api::TrainingJobState;
use trainyard_contracts::decisions::PendingExplained;
use trainyard_contracts::lifecycle::{TrainingJobTransitioned, TransitionContext};
use trainyard_contracts::{EntityRef, Envelope};
use trainyard_testkit::{NatsServer, eventually_within};

fn routes() -> String {
    r##"
route:
  receiver: slack
  group_by: [event, namespace, name]
  group_wait: 0s
  group_interval: 100ms
queued_too_long:
  after: 1h
  queues:
    team-a: 2s
receivers:
  - name: slack
    slack: {channel: "#training", webhook_url_file: $DIR/slack-url}
"##
    .to_string()
}

fn transition(name: &str, to: TrainingJobState) -> Envelope<TrainingJobTransitioned> {
    Envelope::new(
        "planner",
        EntityRef::new("ml", name, format!("uid-{name}")),
        TrainingJobTransitioned {
            from: Some(TrainingJobState::Pending),
            to,
            reason: "WaitingForAdmission".into(),
            message: "waiting for queue team-a to admit 8 GPUs (1 workers × 8)".into(),
            restart_count: 0,
            gpus: 0,
            queue: Some("team-a".into()),
            context: TransitionContext::default(),
        },
    )
}

fn pending(name: &str) -> Envelope<PendingExplained> {
    Envelope::new(
        "gpu-allocator",
        EntityRef::new("ml", name, format!("uid-{name}")),
        PendingExplained {
            attempt: None,
            queue: "team-a".into(),
            position: 2,
            flavor: Some("a100".into()),
            gpus_requested: 8,
            gpus_short: 8,
            message: "quota: flavor a100 nvidia.com/gpu: needs 8, queue can take 0; 8 short".into(),
            unschedulable: None,
            pod_policy: None,
        },
    )
}

/// Slack messages about `job` (its header names it).
fn told_about(slack: &FakeSlack, job: &str) -> Vec<String> {
    slack
        .state
        .lock()
        .expect("state")
        .accepted
        .iter()
        .map(|m| m.body.to_string())
        .filter(|body| body.contains(&format!("ml/{job} queued for")))
        .collect()
}

async fn wait_for_message(slack: &FakeSlack, job: &str) -> String {
    let what = format!("{job} told as queued too long");
    eventually_within(&what, Duration::from_secs(30), || async {
        told_about(slack, job).into_iter().next()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_is_told_once_across_restarts_and_an_admitted_one_never() {
    let nats = NatsServer::start();
    let slack = FakeSlack::start(Duration::ZERO).await;
    let setup = Setup::new(&routes(), &[("slack-url", &slack.url("/hooks/training"))]);
    std::fs::write(
        setup.config_file(),
        std::fs::read_to_string(setup.config_file()).expect("config")
            + "queued_check_millis = 100\n",
    )
    .expect("config");
    let js = jetstream(&nats.url()).await;

    // The first replica stores the wait and the allocator's reason, then stops
    // before the threshold: only the stored wait can tell about it later.
    let mut first = Replica::start(&nats.url(), &setup.config_file(), "first");
    first.ready().await;
    publish(&js, &transition("bert", TrainingJobState::Queued)).await;
    publish(&js, &pending("bert")).await;
    let outbox = js
        .get_key_value("trainyard_notifier_outbox")
        .await
        .expect("bucket");
    // Both messages folded in (they come from two streams, in either order):
    // the killed replica acknowledged them, so none is redelivered later.
    eventually_within(
        "the wait and its reason stored",
        Duration::from_secs(20),
        || async {
            let entry = outbox.get("q.ml.bert").await.ok().flatten()?;
            let wait: serde_json::Value = serde_json::from_slice(&entry).ok()?;
            (wait["queuedSince"].is_string() && wait["pending"].to_string().contains("8 short"))
                .then_some(())
        },
    )
    .await;
    first.kill();

    // Admitted before its threshold: never told.
    let mut second = Replica::start(&nats.url(), &setup.config_file(), "second");
    second.ready().await;
    publish(&js, &transition("gpt", TrainingJobState::Queued)).await;
    publish(&js, &transition("gpt", TrainingJobState::Initializing)).await;

    let message = wait_for_message(&slack, "bert").await;
    assert!(message.contains("team-a"), "names the queue: {message}");
    assert!(message.contains("Waiting"), "names the wait: {message}");
    assert!(
        message.contains("position 2 in queue team-a") && message.contains("8 short"),
        "names the allocator's reason: {message}"
    );
    second.kill();

    // A third replica after the notification adds nothing for bert; a job
    // queued now is told, and by then bert would have been told again.
    let third = Replica::start(&nats.url(), &setup.config_file(), "third");
    third.ready().await;
    publish(&js, &transition("t5", TrainingJobState::Queued)).await;
    wait_for_message(&slack, "t5").await;
    assert_eq!(
        told_about(&slack, "bert").len(),
        1,
        "told once across restarts"
    );
    assert!(
        told_about(&slack, "gpt").is_empty(),
        "admission cancels the wait"
    );
    let wait = outbox
        .get("q.ml.gpt")
        .await
        .expect("read")
        .expect("the closed wait is kept");
    assert!(
        String::from_utf8_lossy(&wait).contains(r#""queuedSince":null"#),
        "gpt no longer waits"
    );
}
