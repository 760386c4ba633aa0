//! The notifier end to end: real nats-server, notifier processes, a fake
//! Slack, webhook receivers (one of them the `standardwebhooks` package).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use trainyard_testkit::{NatsServer, WebhookSink, eventually_within, free_port};

fn slack_and_webhook_routes(slack: &FakeSlack, webhook_url: &str) -> String {
    format!(
        r##"
route:
  receiver: slack-training
  group_by: [event, namespace]
  group_wait: 100ms
  group_interval: 300ms
  routes:
    - matchers: ['team="ci"']
      receiver: ci
    - matchers: ['team=~"nlp|vision"']
      receiver: slack-bot
      group_by: [event, namespace, team]
      continue: true
    - matchers: ['event="job.failed"']
      receiver: ci
receivers:
  - name: slack-training
    slack: {{channel: "#training", webhook_url_file: $DIR/slack-url}}
  - name: slack-bot
    slack: {{channel: "#ml", token_file: $DIR/slack-token, api_url: "{api}"}}
  - name: ci
    webhook: {{url: "{webhook_url}", secret_file: $DIR/ci-keys}}
subscriptions:
  slack_receiver: slack-bot
  allowed_channels: ["#team-*"]
"##,
        api = slack.url("/api"),
    )
}

fn secrets(slack: &FakeSlack) -> Vec<(&'static str, String)> {
    vec![
        ("slack-url", slack.url("/hooks/training")),
        ("slack-token", "xoxb-test-token\n".to_string()),
        ("ci-keys", format!("{OLD_SIGNING_KEY}\n{SIGNING_KEY}\n")),
    ]
}

fn setup(routes: &str, secrets: &[(&'static str, String)]) -> Setup {
    let pairs: Vec<(&str, &str)> = secrets.iter().map(|(n, v)| (*n, v.as_str())).collect();
    Setup::new(routes, &pairs)
}

const PYTHON_RECEIVER: &str = r#"
import http.server, json, sys
from standardwebhooks.webhooks import Webhook

port, secret = int(sys.argv[1]), sys.argv[2]
hook = Webhook(secret)
seen = set()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        wid = self.headers["webhook-id"]
        try:
            payload = hook.verify(body, dict(self.headers))
        except Exception as err:
            print("INVALID", wid, repr(err), flush=True)
            self.send_response(400); self.end_headers(); return
        if wid not in seen:
            # Fail every first attempt: retries must keep the id and sign anew.
            seen.add(wid)
            print("FAILED", wid, flush=True)
            self.send_response(503); self.end_headers(); return
        print("VERIFIED", wid, payload["type"], json.dumps(payload["data"]["eventIds"]), flush=True)
        self.send_response(204); self.end_headers()

    def log_message(self, *args):
        pass

print("LISTENING", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_for_an_independent_verifier_and_retried_under_one_id() {
    let nats = NatsServer::start();
    let slack = FakeSlack::start(Duration::from_millis(900)).await;
    let port = free_port();
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), PYTHON_RECEIVER).expect("write script");
    // The receiver knows only the new key: the rotation's two signatures let it verify.
    let mut receiver = KillOnDrop(
        Command::new("python3")
            .arg(script.path())
            .arg(port.to_string())
            .arg(SIGNING_KEY)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with standardwebhooks (pip install standardwebhooks)"),
    );
    let stdout = receiver.0.stdout.take().expect("stdout");
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let first = tokio::time::timeout(Duration::from_secs(20), lines.recv()).await;
    assert_eq!(
        first.ok().flatten().as_deref(),
        Some("LISTENING"),
        "the receiver did not start: is `standardwebhooks` installed?"
    );
    let setup = setup(
        &slack_and_webhook_routes(&slack, &format!("http://127.0.0.1:{port}/hook")),
        &secrets(&slack),
    );
    let replica = Replica::start(&nats.url(), &setup.config_file(), "solo");
    replica.ready().await;
    let js = jetstream(&nats.url()).await;
    let mut published = BTreeSet::new();
    for i in 0..3 {
        let envelope = failure("ci-ns", &format!("build-{i}"), "ci", "PermanentFailure");
        published.insert(envelope.id.to_string());
        publish(&js, &envelope).await;
    }

    let mut verified = BTreeSet::new();
    let mut failed_ids = BTreeSet::new();
    let mut verified_ids = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while verified != published {
        let line = tokio::time::timeout_at(deadline, lines.recv())
            .await
            .unwrap_or_else(|_| panic!("not every event verified: {verified:?} of {published:?}"))
            .expect("receiver output");
        let mut parts = line.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("VERIFIED"), Some(id), Some(kind), Some(events)) => {
                assert_eq!(kind, "job.failed");
                assert!(
                    failed_ids.contains(id),
                    "the retry carries the first attempt's webhook-id"
                );
                assert!(
                    verified_ids.insert(id.to_string()),
                    "one success per webhook-id"
                );
                let events: Vec<String> = serde_json::from_str(events).expect("event ids");
                for event in events {
                    assert!(verified.insert(event), "an event was delivered twice");
                }
            }
            (Some("FAILED"), Some(id), _, _) => {
                failed_ids.insert(id.to_string());
            }
            _ => panic!("the receiver rejected a delivery: {line}"),
        }
    }
    let metrics = replica.metrics();
    assert!(
        metrics.contains("trainyard_notifications_total{outcome=\"retrying\",receiver=\"ci\"}"),
        "{metrics}"
    );
}

/// Stops the receiver however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_gets_block_kit_within_limits_at_one_message_a_second_and_429s_are_honoured() {
    let nats = NatsServer::start();
    let slack = FakeSlack::start(Duration::from_millis(950)).await;
    slack.state.lock().expect("state").force_429 = 1;
    let sink = WebhookSink::start(0, 0).await;
    let setup = setup(
        &slack_and_webhook_routes(&slack, &sink.url()),
        &secrets(&slack),
    );
    let replica = Replica::start(&nats.url(), &setup.config_file(), "solo");
    replica.ready().await;
    let js = jetstream(&nats.url()).await;

    // Four namespaces × two kinds for #ml (nlp team, bot token) and a subscribed
    // channel; failures also reach the ci webhook.
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for i in 0..24 {
        let ns = format!("ns-{}", i % 4);
        let mut envelope = failure(&ns, &format!("job-{i}"), "nlp", &format!("Reason{}", i % 3));
        if i % 2 == 0 {
            envelope.payload.to = trainyard_api::TrainingJobState::Completed;
        }
        if i < 6 {
            envelope.payload.context.annotations.insert(
                "trainyard.dev/notify".into(),
                "slack:#team-nlp, slack:#elsewhere".into(),
            );
        }
        publish(&js, &envelope).await;
        *expected.entry("#ml").or_default() += 1;
        if i < 6 && i % 2 == 1 {
            // Subscriptions hear failures (a default event); #elsewhere is not allowed.
            *expected.entry("#team-nlp").or_default() += 1;
        }
        if i < 6 && i % 2 == 0 {
            *expected.entry("#team-nlp").or_default() += 1;
        }
    }

    let state = slack.state.clone();
    let delivered = eventually_within("every event in Slack", Duration::from_secs(30), || {
        let state = state.clone();
        let expected = expected.clone();
        async move {
            let s = state.lock().expect("state");
            let mut got: BTreeMap<&str, u64> = BTreeMap::new();
            for m in &s.accepted {
                let key = if m.channel == "#ml" {
                    "#ml"
                } else if m.channel == "#team-nlp" {
                    "#team-nlp"
                } else {
                    "other"
                };
                *got.entry(key).or_default() += m.events();
            }
            (got == expected).then_some(got)
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s = slack.state.lock().expect("state");
    assert!(
        s.invalid.is_empty(),
        "Block Kit limits broken: {:?}",
        s.invalid
    );
    assert!(
        s.too_fast.is_empty(),
        "faster than one a second: {:?}",
        s.too_fast
    );
    assert_eq!(s.forced_429, 1);
    assert_eq!(s.ignored_retry_after, 0, "a Retry-After was not honoured");
    let total: u64 = s.accepted.iter().map(|m| m.events()).sum();
    assert_eq!(
        total,
        delivered.values().sum::<u64>(),
        "no duplicates arrived after the counts matched"
    );
    assert!(
        s.accepted.len() < 24,
        "like events were coalesced: {} messages for 30 events",
        s.accepted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_mid_burst_lose_nothing_and_duplicate_nothing() {
    let nats = NatsServer::start();
    let slack = FakeSlack::start(Duration::from_millis(0)).await;
    let sink = WebhookSink::start(7, 11).await;
    let setup = setup(
        &slack_and_webhook_routes(&slack, &sink.url()),
        &secrets(&slack),
    );
    let mut replicas: Vec<Replica> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| Replica::start(&nats.url(), &setup.config_file(), name))
        .collect();
    for replica in &replicas {
        replica.ready().await;
    }
    let js = jetstream(&nats.url()).await;
    let mut published = BTreeSet::new();
    for i in 0..300 {
        if i == 120 {
            replicas[1].kill();
        }
        // Twenty namespaces: groups (and webhook deliveries) spread over time and replicas.
        let envelope = failure(
            &format!("ns-{}", i % 20),
            &format!("job-{i}"),
            "ci",
            "PermanentFailure",
        );
        published.insert(envelope.id.to_string());
        publish(&js, &envelope).await;
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let deliveries = sink.deliveries.clone();
    eventually_within("every event delivered", Duration::from_secs(40), || {
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
    })
    .await;
    // Let any straggling duplicate arrive before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let deliveries = sink.deliveries.lock().expect("sink").clone();
    let mut seen = BTreeSet::new();
    let duplicates: Vec<&String> = deliveries
        .iter()
        .flat_map(|d| &d.event_ids)
        .filter(|event| !seen.insert((*event).clone()))
        .collect();
    assert!(
        duplicates.is_empty(),
        "{} events delivered twice",
        duplicates.len()
    );
    assert_eq!(seen, published, "0 lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_routing_file_refuses_to_start_naming_the_field() {
    let nats = NatsServer::start();
    let slack = FakeSlack::start(Duration::ZERO).await;
    let routes = slack_and_webhook_routes(&slack, "http://127.0.0.1:9/hook")
        .replace("receiver: ci\n", "receiver: cii\n");
    let setup = setup(&routes, &secrets(&slack));
    let output = Command::new(env!("CARGO_BIN_EXE_trainyard-notifier"))
        .arg("--config")
        .arg(setup.config_file())
        .env("TRAINYARD_NATS__URL", nats.url())
        .env(
            "TRAINYARD_HTTP__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("TRAINYARD_TELEMETRY__LOG_FORMAT", "text")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("route.routes[0].receiver") && stderr.contains("cii"),
        "{stderr}"
    );

    let missing = setup_missing_secret(&slack);
    let output = Command::new(env!("CARGO_BIN_EXE_trainyard-notifier"))
        .arg("--config")
        .arg(missing.config_file())
        .env("TRAINYARD_NATS__URL", nats.url())
        .env(
            "TRAINYARD_HTTP__LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("TRAINYARD_TELEMETRY__LOG_FORMAT", "text")
        .output()
        .expect("runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ci-keys"),
        "the missing file is named: {stderr}"
    );
    assert!(
        !stderr.contains("xoxb-test-token"),
        "secrets never appear: {stderr}"
    );
}

fn setup_missing_secret(slack: &FakeSlack) -> Setup {
    let mut secrets = secrets(slack);
    secrets.retain(|(name, _)| *name != "ci-keys");
    setup(
        &slack_and_webhook_routes(slack, "http://127.0.0.1:9/hook"),
        &secrets,
    )
}
