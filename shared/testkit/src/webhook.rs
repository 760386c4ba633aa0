//! A webhook receiver on loopback that records what it got: each delivery's
//! `webhook-id`, the event ids it carries and its body. It can answer some
//! requests with 429 or 500 to exercise a sender's retries, and counts the
//! requests that came while a 429's `Retry-After` was running.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::Value;

/// One delivery the receiver accepted.
#[derive(Debug, Clone)]
pub struct WebhookDelivery {
    /// The `webhook-id` header (the same on every retry of one notification).
    pub id: String,
    /// `data.eventIds` of the body.
    pub event_ids: Vec<String>,
    pub body: Value,
}

/// Deliveries a [`WebhookSink`] accepted, in arrival order.
pub type Deliveries = Arc<Mutex<Vec<WebhookDelivery>>>;

pub struct WebhookSink {
    pub port: u16,
    pub deliveries: Deliveries,
    /// Requests that came before the `Retry-After` of the last 429 had passed.
    pub early: Arc<AtomicU64>,
    /// Requests answered 429.
    pub answered_429: Arc<AtomicU64>,
}

/// Requests so far, and the end of the last 429's `Retry-After`.
#[derive(Default)]
struct Counter {
    requests: u64,
    blocked_until: Option<Instant>,
}

impl WebhookSink {
    /// Listens at `/hook`; every `every_nth_429`-th request is answered 429
    /// (with `Retry-After: 1`) and every `every_nth_500`-th 500 (0: never).
    pub async fn start(every_nth_429: u64, every_nth_500: u64) -> Self {
        let deliveries: Deliveries = Arc::default();
        let early = Arc::new(AtomicU64::new(0));
        let answered_429 = Arc::new(AtomicU64::new(0));
        let counter = Arc::new(Mutex::new(Counter::default()));
        let sink = deliveries.clone();
        let (early_seen, refused) = (early.clone(), answered_429.clone());
        let app = axum::Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: axum::Json<Value>| {
                let sink = sink.clone();
                let counter = counter.clone();
                let (early, answered_429) = (early_seen.clone(), refused.clone());
                async move {
                    let now = Instant::now();
                    let mut c = counter.lock().unwrap_or_else(|p| p.into_inner());
                    c.requests += 1;
                    let n = c.requests;
                    if c.blocked_until.is_some_and(|until| now < until) {
                        early.fetch_add(1, Ordering::Relaxed);
                    }
                    if every_nth_429 > 0 && n.is_multiple_of(every_nth_429) {
                        c.blocked_until = Some(now + Duration::from_secs(1));
                        answered_429.fetch_add(1, Ordering::Relaxed);
                        return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "")
                            .into_response();
                    }
                    drop(c);
                    if every_nth_500 > 0 && n.is_multiple_of(every_nth_500) {
                        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
                    }
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let event_ids = body["data"]["eventIds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect();
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(WebhookDelivery {
                            id,
                            event_ids,
                            body: body.0,
                        });
                    StatusCode::NO_CONTENT.into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            port,
            deliveries,
            early,
            answered_429,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every delivery so far.
    pub fn received(&self) -> Vec<WebhookDelivery> {
        self.deliveries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
