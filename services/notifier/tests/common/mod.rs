//! Test harness: notifier replicas as real processes against a real
//! nats-server, a fake Slack that enforces Block Kit limits and the
//! per-channel rate, and publishing helpers (the webhook receiver is the
//! testkit's).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap as HttpHeaders, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use trainyard_api::TrainingJobState;
use trainyard_contracts::lifecycle::{TrainingJobTransitioned, TransitionContext};
use trainyard_contracts::{EntityRef, Envelope, Payload};
use trainyard_testkit::{free_port, http_get};

pub const SIGNING_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const OLD_SIGNING_KEY: &str = "whsec_c2VjcmV0LW9mLXRoZS1sYXN0LXJvdGF0aW9uLTAwMDE=";

/// One message the fake Slack accepted.
#[derive(Debug, Clone)]
pub struct SlackMessage {
    pub channel: String,
    pub at: Instant,
    pub body: Value,
}

impl SlackMessage {
    /// Events in it, from the context line `… · N events · …`.
    pub fn events(&self) -> u64 {
        let context = self.body["blocks"]
            .as_array()
            .and_then(|b| b.last())
            .and_then(|b| b["elements"][0]["text"].as_str())
            .unwrap_or_default()
            .to_string();
        context
            .split(" · ")
            .find_map(|part| {
                part.split(' ')
                    .next()
                    .and_then(|n| part.contains("event").then(|| n.parse().ok()).flatten())
            })
            .unwrap_or(0)
    }
}

#[derive(Default)]
pub struct SlackState {
    pub accepted: Vec<SlackMessage>,
    /// Requests that broke a Block Kit limit, with why.
    pub invalid: Vec<String>,
    /// Requests that came sooner than `min_gap` after the last on their channel.
    pub too_fast: Vec<String>,
    /// Requests answered 429 because of `force_429`.
    pub forced_429: u64,
    /// Requests that came before the Retry-After of a 429 on their channel had passed.
    pub ignored_retry_after: u64,
    /// Answer this many of the next requests with 429.
    pub force_429: u64,
    /// Answer every n-th request with 429 (0: never).
    pub every_nth_429: u64,
    /// Answer every n-th request with 500 (0: never).
    pub every_nth_500: u64,
    pub requests: u64,
    pub last: HashMap<String, Instant>,
    pub blocked_until: HashMap<String, Instant>,
    pub min_gap: Duration,
    pub retry_after_seconds: u64,
}

/// A fake Slack on loopback: incoming webhooks at `/hooks/<channel>` and
/// `/api/chat.postMessage` with a bot token.
pub struct FakeSlack {
    pub port: u16,
    pub state: Arc<Mutex<SlackState>>,
}

fn validate_blocks(body: &Value) -> Result<(), String> {
    let blocks = body["blocks"].as_array().ok_or("no blocks")?;
    if blocks.len() > 50 {
        return Err(format!("{} blocks > 50", blocks.len()));
    }
    for block in blocks {
        let text = block["text"]["text"].as_str().unwrap_or_default();
        match block["type"].as_str() {
            Some("header") if text.chars().count() > 150 => return Err("header > 150".into()),
            Some("section") if text.chars().count() > 3000 => return Err("section > 3000".into()),
            Some("section") if block["fields"].as_array().is_some_and(|f| f.len() > 10) => {
                return Err("more than 10 fields".into());
            }
            _ => {}
        }
    }
    Ok(())
}

async fn accept(state: &Arc<Mutex<SlackState>>, channel: String, body: Value) -> Response {
    let mut s = state.lock().expect("state");
    let now = Instant::now();
    s.requests += 1;
    if s.blocked_until
        .get(&channel)
        .is_some_and(|until| now < *until)
    {
        s.ignored_retry_after += 1;
    }
    if let Some(last) = s.last.get(&channel)
        && now.duration_since(*last) < s.min_gap
    {
        let gap = now.duration_since(*last);
        s.too_fast
            .push(format!("{channel}: {gap:?} after the last message"));
    }
    s.last.insert(channel.clone(), now);
    let requests = s.requests;
    let forced =
        s.force_429 > 0 || (s.every_nth_429 > 0 && requests.is_multiple_of(s.every_nth_429));
    if forced {
        s.force_429 = s.force_429.saturating_sub(1);
        s.forced_429 += 1;
        let after = s.retry_after_seconds;
        s.blocked_until
            .insert(channel, now + Duration::from_secs(after));
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", after.to_string())],
            "rate_limited",
        )
            .into_response();
    }
    if s.every_nth_500 > 0 && requests.is_multiple_of(s.every_nth_500) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "oops").into_response();
    }
    if let Err(why) = validate_blocks(&body) {
        s.invalid.push(why);
        return (StatusCode::BAD_REQUEST, "invalid_blocks").into_response();
    }
    s.accepted.push(SlackMessage {
        channel,
        at: now,
        body,
    });
    (StatusCode::OK, "ok").into_response()
}

impl FakeSlack {
    pub async fn start(min_gap: Duration) -> Self {
        let state = Arc::new(Mutex::new(SlackState {
            min_gap,
            retry_after_seconds: 1,
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route(
                "/hooks/{channel}",
                post(
                    |State(state): State<Arc<Mutex<SlackState>>>,
                     UrlPath(channel): UrlPath<String>,
                     body: axum::Json<Value>| async move {
                        accept(&state, format!("#{channel}"), body.0).await
                    },
                ),
            )
            .route(
                "/api/chat.postMessage",
                post(
                    |State(state): State<Arc<Mutex<SlackState>>>,
                     headers: HttpHeaders,
                     body: axum::Json<Value>| async move {
                        let authorized = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .is_some_and(|v| v == "Bearer xoxb-test-token");
                        if !authorized {
                            return axum::Json(json!({"ok": false, "error": "invalid_auth"}))
                                .into_response();
                        }
                        let channel = body["channel"].as_str().unwrap_or_default().to_string();
                        let response = accept(&state, channel, body.0).await;
                        if response.status() == StatusCode::OK {
                            axum::Json(json!({"ok": true})).into_response()
                        } else {
                            response
                        }
                    },
                ),
            )
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { port, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// A directory with the routing file and secrets.
pub struct Setup {
    pub dir: tempfile::TempDir,
}

impl Setup {
    pub fn new(routes: &str, secrets: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, value) in secrets {
            std::fs::write(dir.path().join(name), value).expect("secret");
        }
        let routes = routes.replace("$DIR", &dir.path().display().to_string());
        std::fs::write(dir.path().join("routes.yaml"), routes).expect("routes");
        let config = format!(
            "[notifier]\nroutes_file = {:?}\nheartbeat_millis = 200\nreload_interval_seconds = 1\n\
             retry_schedule = [\"200ms\", \"400ms\", \"800ms\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\"]\n",
            dir.path().join("routes.yaml").display().to_string()
        );
        std::fs::write(dir.path().join("notifier.toml"), config).expect("config");
        Self { dir }
    }

    pub fn routes_file(&self) -> PathBuf {
        self.dir.path().join("routes.yaml")
    }

    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("notifier.toml")
    }
}

/// A notifier process.
pub struct Replica {
    pub child: Child,
    pub http_port: u16,
}

impl Replica {
    pub fn start(nats_url: &str, config: &Path, name: &str) -> Self {
        let http_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_trainyard-notifier"))
            .arg("--config")
            .arg(config)
            .env("TRAINYARD_NATS__URL", nats_url)
            .env("TRAINYARD_HTTP__LISTEN", format!("127.0.0.1:{http_port}"))
            .env("TRAINYARD_TELEMETRY__LOG_LEVEL", "warn")
            .env("TRAINYARD_TELEMETRY__LOG_FORMAT", "text")
            .env("TRAINYARD_NOTIFIER__REPLICA_ID", name)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the notifier");
        Self { child, http_port }
    }

    pub async fn ready(&self) {
        let port = self.http_port;
        trainyard_testkit::eventually("notifier ready", || async move {
            http_get(port, "/readyz")
                .filter(|(status, _)| *status == 200)
                .map(|_| ())
        })
        .await;
    }

    pub fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn jetstream(url: &str) -> async_nats::jetstream::Context {
    async_nats::jetstream::new(async_nats::connect(url).await.expect("connect"))
}

pub async fn publish<P: Payload>(js: &async_nats::jetstream::Context, envelope: &Envelope<P>) {
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", envelope.id.to_string().as_str());
    js.publish_with_headers(
        envelope.subject(),
        headers,
        envelope.to_json().expect("json").into(),
    )
    .await
    .expect("publish")
    .await
    .expect("stored");
}

/// A job's failure with its labels; returns the envelope (its id is the event id).
pub fn failure(
    ns: &str,
    name: &str,
    team: &str,
    reason: &str,
) -> Envelope<TrainingJobTransitioned> {
    Envelope::new(
        "planner",
        EntityRef::new(ns, name, format!("uid-{name}")),
        TrainingJobTransitioned {
            from: Some(TrainingJobState::Running),
            to: TrainingJobState::Failed,
            reason: reason.into(),
            message: "worker 0 exited with code 1".into(),
            restart_count: 0,
            gpus: 0,
            queue: Some("team-a".into()),
            context: TransitionContext {
                labels: [("team".to_string(), team.to_string())].into(),
                exit_code: Some(1),
                exit_class: Some("permanent".into()),
                fix: Some("fix the training script".into()),
                ..Default::default()
            },
        },
    )
}
