//! Pacing shared by replicas: three notifier processes on one nats-server,
//! each owning a receiver that posts to the same Slack channel, keep that
//! channel at one message a second between them and send nothing inside a
//! `Retry-After` the fake Slack declared; a webhook endpoint's 429 holds its
//! next notifications too.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use notifier_core::delivery;
use trainyard_testkit::{NatsServer, WebhookSink, eventually_within};

const REPLICAS: [&str; 3] = ["r1", "r2", "r3"];
const SLACK_RECEIVERS: [&str; 3] = ["slack-0", "slack-1", "slack-2"];

/// Every event goes to the three Slack receivers (all posting to `#shared`)
/// and to the `ci` webhook.
fn routes(webhook_url: &str) -> String {
    let mut children = String::new();
    let mut receivers = String::new();
    for receiver in SLACK_RECEIVERS {
        children.push_str(&format!(
            "    - matchers: ['team=\"ml\"']\n      receiver: {receiver}\n      continue: true\n"
        ));
        receivers.push_str(&format!(
            "  - name: {receiver}\n    slack: {{channel: \"#shared\", webhook_url_file: $DIR/slack-url}}\n"
        ));
    }
    format!(
        "route:\n  receiver: ci\n  group_by: [event, namespace]\n  group_wait: 0s\n  group_interval: 200ms\n  routes:\n{children}    - matchers: ['team=\"ml\"']\n      receiver: ci\nreceivers:\n{receivers}  - name: ci\n    webhook: {{url: \"{webhook_url}\", secret_file: $DIR/ci-keys}}\n"
    )
}

/// Whether a replica's metrics show a Slack message it sent.
fn sent_to_slack(metrics: &str) -> bool {
    metrics.lines().any(|line| {
        line.starts_with("trainyard_notifications_total{")
            && line.contains("outcome=\"sent\"")
            && line.contains("receiver=\"slack-")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_channels_pace_and_nobody_sends_inside_a_retry_after() {
    // The receivers belong to three different replicas, so only a shared
    // pace keeps the channel at one message a second.
    let replicas: Vec<String> = REPLICAS.map(String::from).to_vec();
    let owners: BTreeSet<&String> = SLACK_RECEIVERS
        .iter()
        .filter_map(|receiver| delivery::owner(receiver, &replicas))
        .collect();
    assert_eq!(owners.len(), 3, "each receiver has its own replica");

    let nats = NatsServer::start();
    // Arrival times carry each request's own latency: 100 ms of tolerance
    // on the one-second interval.
    let slack = FakeSlack::start(Duration::from_millis(900)).await;
    {
        let mut s = slack.state.lock().expect("state");
        s.every_nth_429 = 3;
        s.retry_after_seconds = 2;
    }
    let sink = WebhookSink::start(2, 0).await;
    let setup = Setup::new(
        &routes(&sink.url()),
        &[
            ("slack-url", &slack.url("/hooks/shared")),
            ("ci-keys", SIGNING_KEY),
        ],
    );
    let processes: Vec<Replica> = REPLICAS
        .iter()
        .map(|name| Replica::start(&nats.url(), &setup.config_file(), name))
        .collect();
    for replica in &processes {
        replica.ready().await;
    }
    // Ten heartbeats, so every replica sees the others before the burst: a
    // replica that has not yet seen the owner of `ci` would send to it too,
    // and a webhook request already in flight when the other's 429 arrives
    // cannot be recalled (webhooks have no interval to keep requests apart).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let js = jetstream(&nats.url()).await;
    let mut published = BTreeSet::new();
    for i in 0..12 {
        let envelope = failure(
            &format!("ns-{}", i % 2),
            &format!("job-{i}"),
            "ml",
            "PermanentFailure",
        );
        published.insert(envelope.id.to_string());
        publish(&js, &envelope).await;
    }

    let expected_in_slack = (published.len() * SLACK_RECEIVERS.len()) as u64;
    let state = slack.state.clone();
    eventually_within("every event in #shared", Duration::from_secs(90), || {
        let state = state.clone();
        async move {
            let s = state.lock().expect("state");
            let events: u64 = s.accepted.iter().map(SlackMessage::events).sum();
            (events >= expected_in_slack).then_some(())
        }
    })
    .await;
    let deliveries = sink.deliveries.clone();
    eventually_within(
        "every event at the webhook",
        Duration::from_secs(30),
        || {
            let deliveries = deliveries.clone();
            let published = published.clone();
            async move {
                let got: BTreeSet<String> = deliveries
                    .lock()
                    .expect("sink")
                    .iter()
                    .flat_map(|d| d.event_ids.clone())
                    .collect();
                (got == published).then_some(())
            }
        },
    )
    .await;
    // Let any straggler arrive before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let senders = processes
        .iter()
        .filter(|replica| sent_to_slack(&replica.metrics()))
        .count();
    assert!(
        senders >= 2,
        "{senders} replica(s) posted to #shared: the channel's pace was not shared"
    );
    let s = slack.state.lock().expect("state");
    assert!(
        s.forced_429 > 0,
        "the fake Slack answered 429 at least once"
    );
    assert!(
        s.too_fast.is_empty(),
        "#shared got more than one message a second: {:?}",
        s.too_fast
    );
    assert_eq!(
        s.ignored_retry_after, 0,
        "requests reached #shared inside a Retry-After"
    );
    let events: u64 = s.accepted.iter().map(SlackMessage::events).sum();
    assert_eq!(events, expected_in_slack, "no event twice in #shared");
    assert!(sink.answered_429.load(Ordering::Relaxed) > 0);
    assert_eq!(
        sink.early.load(Ordering::Relaxed),
        0,
        "requests reached the webhook inside a Retry-After"
    );
}
