//! The notifier under a burst: `--events` job failures (default 1,000) spread
//! over 5 Slack channels (incoming webhooks) and 3 signed webhooks, 3 notifier
//! replicas (release binaries) on one nats-server, one replica killed with
//! SIGKILL halfway through the burst, every receiver answering 10 % of
//! requests 429 (`Retry-After: 1`) and 5 % 500. Routing: `group_by: [event,
//! namespace]` over 10 namespaces, `group_wait: 0s`, `group_interval: 1s`.
//!
//! Prints duplicates and lost events (Slack: per channel, from the event count
//! of each message's context line; webhooks: per event id), requests sent
//! inside a 429's Retry-After (unhandled 429s), the highest number of messages
//! one Slack channel received in any one-second window and the shortest gap
//! between two messages on one channel (arrival times carry each request's
//! own latency, so a 1 s pace can arrive a few ms short), event-to-delivery
//! latency without the grouping wait (received − max(event published,
//! notification created), from the webhook deliveries) and with it, the same
//! for the unimpeded deliveries alone (first attempt, and no 429 closed the
//! endpoint while it waited: the notifier's own time), and each surviving
//! replica's peak RSS. Bounded by `--timeout-seconds`; asserts nothing.
//!
//! Usage: `notifier [--events N] [--timeout-seconds N] [--bin-dir DIR]`

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::HeaderMap;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap as HttpHeaders, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use chrono::{DateTime, Utc};
use clap::Parser;
use rand::Rng;
use serde_json::Value;
use trainyard_api::TrainingJobState;
use trainyard_contracts::lifecycle::{TrainingJobTransitioned, TransitionContext};
use trainyard_contracts::permissions::Identity;
use trainyard_contracts::{EntityRef, Envelope, Service};
use trainyard_loadtest::procstats;
use trainyard_loadtest::stack::{Stack, default_bin_dir, free_port};
use trainyard_stats::SortedSamples;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    events: usize,
    #[arg(long, default_value_t = 180)]
    timeout_seconds: u64,
    /// Where `trainyard-notifier` is (default: the workspace's target/release).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

const CHANNELS: usize = 5;
const HOOKS: usize = 3;
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Default)]
struct Received {
    /// Per Slack channel: (received at, events in the message).
    slack: HashMap<String, Vec<(Instant, u64)>>,
    hooks: Vec<HookDelivery>,
    /// Requests per `webhook-id`, refused ones included.
    attempts: HashMap<String, u32>,
    /// Per endpoint: the windows a 429's Retry-After closed it.
    closed: HashMap<String, Vec<Window>>,
    requests: u64,
    answered_429: u64,
    answered_500: u64,
    /// Requests that came inside the Retry-After of a 429 on the same endpoint.
    unhandled_429: u64,
    blocked_until: HashMap<String, Instant>,
}

/// From, to.
type Window = (DateTime<Utc>, DateTime<Utc>);

/// One accepted webhook delivery.
struct HookDelivery {
    endpoint: String,
    received: DateTime<Utc>,
    /// When the notifier created the notification (after the grouping wait).
    created: DateTime<Utc>,
    events: Vec<String>,
    /// Whether an earlier request of the same `webhook-id` was refused.
    retried: bool,
}

type Shared = Arc<Mutex<Received>>;

/// 10 % 429, 5 % 500, else None (accept).
fn chaos(state: &Shared, endpoint: &str, webhook_id: Option<&str>) -> Option<Response> {
    let mut r = state.lock().ok()?;
    let now = Instant::now();
    r.requests += 1;
    if let Some(id) = webhook_id {
        *r.attempts.entry(id.to_string()).or_default() += 1;
    }
    if r.blocked_until
        .get(endpoint)
        .is_some_and(|until| now < *until)
    {
        r.unhandled_429 += 1;
    }
    let roll: f64 = rand::rng().random();
    if roll < 0.10 {
        r.answered_429 += 1;
        r.blocked_until
            .insert(endpoint.to_string(), now + Duration::from_secs(1));
        let wall = Utc::now();
        r.closed
            .entry(endpoint.to_string())
            .or_default()
            .push((wall, wall + chrono::Duration::seconds(1)));
        return Some((StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "").into_response());
    }
    if roll < 0.15 {
        r.answered_500 += 1;
        return Some(StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    None
}

fn context_events(body: &Value) -> u64 {
    body["blocks"]
        .as_array()
        .and_then(|b| b.last())
        .and_then(|b| b["elements"][0]["text"].as_str())
        .and_then(|text| {
            text.split(" · ")
                .find(|part| part.ends_with("event") || part.ends_with("events"))
                .and_then(|part| part.split(' ').next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

async fn slack(
    State(state): State<Shared>,
    UrlPath(channel): UrlPath<String>,
    body: axum::Json<Value>,
) -> Response {
    if let Some(response) = chaos(&state, &format!("slack/{channel}"), None) {
        return response;
    }
    if let Ok(mut r) = state.lock() {
        let events = context_events(&body.0);
        r.slack
            .entry(channel)
            .or_default()
            .push((Instant::now(), events));
    }
    (StatusCode::OK, "ok").into_response()
}

async fn hook(
    State(state): State<Shared>,
    UrlPath(n): UrlPath<String>,
    headers: HttpHeaders,
    body: axum::Json<Value>,
) -> Response {
    let endpoint = format!("hook/{n}");
    let webhook_id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if let Some(response) = chaos(&state, &endpoint, Some(&webhook_id)) {
        return response;
    }
    let created = body["data"]["createdAt"]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(Utc::now);
    let events = body["data"]["eventIds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    if let Ok(mut r) = state.lock() {
        let retried = r.attempts.get(&webhook_id).copied().unwrap_or(0) > 1;
        r.hooks.push(HookDelivery {
            endpoint,
            received: Utc::now(),
            created,
            events,
            retried,
        });
    }
    StatusCode::NO_CONTENT.into_response()
}

fn routes(receiver_port: u16, dir: &std::path::Path) -> anyhow::Result<String> {
    let mut receivers = String::new();
    let mut routes = String::new();
    for c in 0..CHANNELS {
        let file = dir.join(format!("slack-c{c}"));
        std::fs::write(
            &file,
            format!("http://127.0.0.1:{receiver_port}/hooks/c{c}"),
        )?;
        receivers.push_str(&format!(
            "  - name: slack-c{c}\n    slack: {{channel: \"#c{c}\", webhook_url_file: {}}}\n",
            file.display()
        ));
        routes.push_str(&format!("    - matchers: ['channel=\"c{c}\"']\n      receiver: slack-c{c}\n      continue: true\n"));
    }
    let secret = dir.join("hook-secret");
    std::fs::write(&secret, SECRET)?;
    for h in 0..HOOKS {
        receivers.push_str(&format!(
            "  - name: hook-{h}\n    webhook: {{url: \"http://127.0.0.1:{receiver_port}/hook/{h}\", secret_file: {}}}\n",
            secret.display()
        ));
        routes.push_str(&format!(
            "    - matchers: ['hook=\"h{h}\"']\n      receiver: hook-{h}\n"
        ));
    }
    Ok(format!(
        "route:\n  receiver: slack-c0\n  group_by: [event, namespace]\n  group_wait: 0s\n  group_interval: 1s\n  routes:\n{routes}receivers:\n{receivers}"
    ))
}

fn event(i: usize) -> Envelope<TrainingJobTransitioned> {
    Envelope::new(
        "loadtest",
        EntityRef::new(
            format!("ns-{}", i % 10),
            format!("job-{i}"),
            format!("uid-{i}"),
        ),
        TrainingJobTransitioned {
            from: Some(TrainingJobState::Running),
            to: TrainingJobState::Failed,
            reason: "PermanentFailure".into(),
            message: format!("worker 0 exited with code {}", 1 + i % 3),
            restart_count: 0,
            gpus: 0,
            queue: Some("team-a".into()),
            context: TransitionContext {
                labels: [
                    ("channel".to_string(), format!("c{}", i % CHANNELS)),
                    ("hook".to_string(), format!("h{}", i % HOOKS)),
                ]
                .into(),
                exit_code: Some(1 + (i % 3) as i32),
                exit_class: Some("permanent".into()),
                ..Default::default()
            },
        },
    )
}

struct Replica {
    child: Child,
    http: u16,
}

fn percentiles(samples: Vec<f64>) -> String {
    let sorted = SortedSamples::new(samples);
    let p = |q| {
        sorted
            .percentile(q)
            .map_or("-".into(), |v| format!("{:.1} ms", v * 1000.0))
    };
    format!("p50 {} p99 {} (n={})", p(50.0), p(99.0), sorted.len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = args.bin_dir.unwrap_or_else(default_bin_dir);
    let binary = bin_dir.join("trainyard-notifier");
    if !binary.exists() {
        bail!(
            "{} not found: cargo build --release -p trainyard-notifier",
            binary.display()
        );
    }
    let mut stack = Stack::new(&bin_dir, "warn")?;
    stack.start_nats(None).await?;
    let nats = stack.nats_settings(&Identity::Service(Service::Notifier))?;
    let received: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/hooks/{channel}", post(slack))
        .route("/hook/{n}", post(hook))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let receiver_port = listener.local_addr()?.port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let dir = stack.work_dir().to_path_buf();
    std::fs::write(dir.join("routes.yaml"), routes(receiver_port, &dir)?)?;
    std::fs::write(
        dir.join("notifier.toml"),
        format!(
            "[notifier]\nroutes_file = {:?}\nheartbeat_millis = 500\nretry_schedule = [\"1s\", \"2s\", \"4s\", \"8s\", \"16s\", \"30s\"]\n",
            dir.join("routes.yaml").display().to_string()
        ),
    )?;
    let mut replicas = Vec::new();
    for r in 0..3 {
        let http = free_port()?;
        let log = std::fs::File::create(dir.join(format!("notifier-{r}.log")))?;
        let child = Command::new(&binary)
            .arg("--config")
            .arg(dir.join("notifier.toml"))
            .env("TRAINYARD_NATS__URL", &nats.url)
            .env(
                "TRAINYARD_NATS__USER",
                nats.user.as_deref().unwrap_or_default(),
            )
            .env(
                "TRAINYARD_NATS__PASSWORD_FILE",
                nats.password_file.as_deref().unwrap_or_default(),
            )
            .env("TRAINYARD_HTTP__LISTEN", format!("127.0.0.1:{http}"))
            .env("TRAINYARD_TELEMETRY__LOG_LEVEL", "warn")
            .env("TRAINYARD_NOTIFIER__REPLICA_ID", format!("replica-{r}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        replicas.push(Replica { child, http });
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    for replica in &replicas {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client
                .get(format!("http://127.0.0.1:{}/readyz", replica.http))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                break;
            }
            if Instant::now() > deadline {
                stack.keep_work_dir();
                bail!("a notifier did not get ready; logs in {}", dir.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let js = async_nats::jetstream::new(stack.connect().await?);
    let mut published: HashMap<String, DateTime<Utc>> = HashMap::new();
    let mut expected_per_channel: BTreeMap<String, u64> = BTreeMap::new();
    let burst = Instant::now();
    let mut pending = Vec::new();
    for i in 0..args.events {
        if i == args.events / 2 {
            replicas[1].child.kill()?;
            replicas[1].child.wait()?;
        }
        let envelope = event(i);
        published.insert(envelope.id.to_string(), envelope.time);
        *expected_per_channel
            .entry(format!("c{}", i % CHANNELS))
            .or_default() += 1;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", envelope.id.to_string().as_str());
        pending.push(
            js.publish_with_headers(envelope.subject(), headers, envelope.to_json()?.into())
                .await?,
        );
    }
    for ack in pending {
        ack.await?;
    }
    let burst_took = burst.elapsed();

    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let done = loop {
        let complete = {
            let r = received
                .lock()
                .map_err(|_| anyhow::anyhow!("receiver state poisoned"))?;
            let slack_done = expected_per_channel.iter().all(|(c, n)| {
                r.slack
                    .get(c)
                    .map_or(0, |m| m.iter().map(|(_, e)| e).sum::<u64>())
                    >= *n
            });
            let hook_events: std::collections::HashSet<&String> =
                r.hooks.iter().flat_map(|d| &d.events).collect();
            slack_done && hook_events.len() >= published.len()
        };
        if complete {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let settled = burst.elapsed();
    // Stragglers (duplicates) would arrive now.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let rss: Vec<String> = replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .filter_map(|(i, r)| {
            procstats::sample(r.child.id()).ok().map(|s| {
                format!(
                    "replica-{i} {:.1} MiB",
                    s.peak_rss_bytes as f64 / 1_048_576.0
                )
            })
        })
        .collect();
    for replica in &mut replicas {
        let _ = replica.child.kill();
        let _ = replica.child.wait();
    }

    let r = received
        .lock()
        .map_err(|_| anyhow::anyhow!("receiver state poisoned"))?;
    let mut slack_dup = 0u64;
    let mut slack_lost = 0u64;
    let mut peak_rate = 0usize;
    let mut closest: Option<Duration> = None;
    let mut messages = 0usize;
    for (channel, expected) in &expected_per_channel {
        let got = r.slack.get(channel).map(Vec::as_slice).unwrap_or_default();
        messages += got.len();
        let events: u64 = got.iter().map(|(_, e)| e).sum();
        slack_dup += events.saturating_sub(*expected);
        slack_lost += expected.saturating_sub(events);
        let times: Vec<Instant> = got.iter().map(|(t, _)| *t).collect();
        for pair in times.windows(2) {
            let gap = pair[1].duration_since(pair[0]);
            closest = Some(closest.map_or(gap, |c| c.min(gap)));
        }
        for (i, start) in times.iter().enumerate() {
            let in_window = times[i..]
                .iter()
                .take_while(|t| t.duration_since(*start) < Duration::from_secs(1))
                .count();
            peak_rate = peak_rate.max(in_window);
        }
    }
    let mut seen: HashMap<&String, u32> = HashMap::new();
    let mut outside = Vec::new();
    let mut unimpeded = Vec::new();
    let mut end_to_end = Vec::new();
    let seconds = |d: chrono::Duration| d.to_std().unwrap_or_default().as_secs_f64();
    for delivery in &r.hooks {
        for id in &delivery.events {
            *seen.entry(id).or_default() += 1;
            if let Some(published_at) = published.get(id) {
                let since = (*published_at).max(delivery.created);
                outside.push(seconds(delivery.received - since));
                end_to_end.push(seconds(delivery.received - *published_at));
                // Neither its own retry nor a Retry-After window of its
                // endpoint held it back: what the notifier itself takes.
                let closed_meanwhile = r.closed.get(&delivery.endpoint).is_some_and(|windows| {
                    windows
                        .iter()
                        .any(|(from, to)| *from < delivery.received && *to > since)
                });
                if !delivery.retried && !closed_meanwhile {
                    unimpeded.push(seconds(delivery.received - since));
                }
            }
        }
    }
    let hook_dup: u32 = seen.values().map(|n| n.saturating_sub(1)).sum();
    let hook_lost = published.keys().filter(|id| !seen.contains_key(id)).count();

    println!(
        "notifier burst: {} events, 5 Slack channels + 3 webhooks, 3 replicas (replica-1 SIGKILLed after {} events), receivers 10 % 429 / 5 % 500",
        args.events,
        args.events / 2
    );
    println!(
        "published in            {:.2} s; everything delivered after {:.1} s ({})",
        burst_took.as_secs_f64(),
        settled.as_secs_f64(),
        if done { "complete" } else { "TIMED OUT" }
    );
    println!(
        "receiver requests       {} ({} answered 429, {} answered 500)",
        r.requests, r.answered_429, r.answered_500
    );
    println!("duplicates              Slack {slack_dup} events, webhooks {hook_dup} events");
    println!("lost                    Slack {slack_lost} events, webhooks {hook_lost} events");
    println!(
        "unhandled 429s          {} (requests inside a Retry-After)",
        r.unhandled_429
    );
    println!(
        "Slack messages          {messages} for {} events; peak per channel {peak_rate} in any 1 s window",
        args.events
    );
    println!(
        "closest two messages    {} on one channel",
        closest.map_or("-".into(), |gap| format!(
            "{:.1} ms",
            gap.as_secs_f64() * 1000.0
        ))
    );
    println!("latency w/o group wait  {}", percentiles(outside));
    println!(
        "  of which unimpeded    {} (first attempt, endpoint not closed by a 429 meanwhile)",
        percentiles(unimpeded)
    );
    println!("latency end to end      {}", percentiles(end_to_end));
    println!("peak RSS                {}", rss.join(", "));
    Ok(())
}
