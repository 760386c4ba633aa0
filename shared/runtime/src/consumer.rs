//! Durable pull consumers: ack after the effect, retry with backoff, and after the
//! last allowed delivery (or at once for a message that can never succeed) move
//! the message to the dead-letter subject with the reason. A passing failure
//! (see [`HandleError::Transient`]) is handled again in place for as long as it
//! lasts and never dead-lettered. Nothing panics on input.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_contracts::backoff::capped_doubling;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer::pull};
use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use trainyard_contracts::dead_letter::{DeadLetter, REASON_HEADER};
use trainyard_contracts::{ConsumerSpec, ContractError, Incoming, subject};

use crate::error::RuntimeError;
use crate::metrics::RuntimeMetrics;
use crate::publisher::Publisher;
use crate::settings::NatsSettings;
use crate::telemetry;

/// Why a handler did not finish a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandleError {
    /// Might work later (a dependency is down); redelivered with backoff until
    /// `max_deliver`, then dead-lettered.
    Retry(String),
    /// Passing by nature (a dependency throttles, times out, answers 5xx, or
    /// another writer changed the object meanwhile): handled again, in place,
    /// with backoff and jitter for as long as it lasts. The message stays this
    /// consumer's (its ack deadline is extended), its delivery count does not
    /// grow, and it is never dead-lettered for it; messages after it about the
    /// same entity wait, so their order holds.
    Transient(String),
    /// Can never work (bad content); dead-lettered now.
    Reject {
        category: &'static str,
        reason: String,
    },
}

impl From<ContractError> for HandleError {
    fn from(err: ContractError) -> Self {
        HandleError::Reject {
            category: err.category(),
            reason: err.to_string(),
        }
    }
}

/// Where a message came from, for handlers that care.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Subject as stored (with the partition token on partitioned streams).
    pub subject: String,
    pub stream_sequence: u64,
    /// 1 on first delivery.
    pub delivered: i64,
}

/// Handles one decoded message. Implementations do their effect, then return Ok;
/// the runtime acks.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        message: Incoming,
        delivery: Delivery,
    ) -> impl Future<Output = Result<(), HandleError>> + Send;

    /// How many entities' messages may be handled at once. Messages about one
    /// entity (one `<namespace>.<name>` subject tail) are always handled one at a
    /// time, in stream order. Only handlers whose effects do not depend on the
    /// order across entities may return more than 1.
    fn lanes(&self) -> usize {
        1
    }
}

/// The lane of a message: the same for every message about one entity.
fn lane(subject: &str, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match subject::parse(subject) {
        Some(parsed) => (parsed.namespace, parsed.name).hash(&mut hasher),
        None => subject.hash(&mut hasher),
    }
    (hasher.finish() % lanes.max(1) as u64) as usize
}

/// How long one pull request of the stream stays open on the server.
const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// The server's idle heartbeat on an open pull: a missing one means the
/// connection or consumer is gone, and the stream pulls anew.
const PULL_HEARTBEAT: Duration = Duration::from_secs(5);
/// On shutdown, messages already pulled are NAKed for this long.
const SHUTDOWN_DRAIN: Duration = Duration::from_millis(50);

/// Everything a consumer loop needs besides its handler.
#[derive(Clone)]
pub struct ConsumerContext {
    pub jetstream: jetstream::Context,
    pub publisher: Publisher,
    pub metrics: RuntimeMetrics,
    pub settings: NatsSettings,
}

/// Creates (or updates) the durable consumer and handles messages until `shutdown`.
/// On shutdown it stops pulling, finishes the messages already started and returns;
/// pulled messages not yet started are NAKed so another replica takes them at once.
///
/// With lanes, each lane chains its messages (one entity's messages stay in
/// order) and pulling goes on while lanes are busy, up to `batch_size` messages
/// in flight: a slow message holds back its own lane, not the next pull.
pub async fn run<H: Handler>(
    context: ConsumerContext,
    spec: ConsumerSpec,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let consumer = ensure_consumer(&context, &spec).await?;
    let mut failures = 0usize;
    let lanes = handler.lanes().max(1);
    let mut chains: Vec<Option<tokio::task::JoinHandle<()>>> = (0..lanes).map(|_| None).collect();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(
        context.settings.batch_size.max(1),
    ));
    'pulling: while !shutdown.is_cancelled() {
        // One long-lived pull stream, not a fetch per batch: a fetch
        // subscribes to a fresh inbox, requests and unsubscribes each time,
        // and at a steady trickle most fetches return one or two messages.
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            stream = consumer
                .stream()
                .max_messages_per_batch(context.settings.batch_size.max(1))
                .expires(PULL_EXPIRES)
                .heartbeat(PULL_HEARTBEAT)
                .messages() => stream,
        };
        let mut messages = match stream {
            Ok(messages) => messages,
            Err(err) => {
                failures += 1;
                tracing::warn!(consumer = %spec.durable, error = %err, "pull failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(crate::nats::reconnect_delay(failures)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => {
                    // Pulled but not started: back to the stream at once.
                    while let Ok(Some(Ok(message))) =
                        tokio::time::timeout(SHUTDOWN_DRAIN, messages.next()).await
                    {
                        nak(&message, None).await;
                    }
                    break 'pulling;
                }
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(err)) => {
                    failures += 1;
                    tracing::warn!(consumer = %spec.durable, error = %err, "pull error; pulling anew");
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'pulling,
                        _ = tokio::time::sleep(crate::nats::reconnect_delay(failures)) => continue 'pulling,
                    }
                }
                None => continue 'pulling,
            };
            failures = 0;
            if lanes == 1 {
                process(&context, &spec, handler.as_ref(), message, &shutdown).await;
                continue;
            }
            let permit = tokio::select! {
                permit = in_flight.clone().acquire_owned() => permit,
                _ = shutdown.cancelled() => {
                    nak(&message, None).await;
                    continue;
                }
            };
            let slot = &mut chains[lane(&message.subject, lanes)];
            let previous = slot.take();
            let (context, spec, handler, shutdown) = (
                context.clone(),
                spec.clone(),
                handler.clone(),
                shutdown.clone(),
            );
            *slot = Some(tokio::spawn(async move {
                if let Some(previous) = previous
                    && let Err(err) = previous.await
                {
                    tracing::error!(consumer = %spec.durable, error = %err, "a handler task failed");
                }
                process(&context, &spec, handler.as_ref(), message, &shutdown).await;
                drop(permit);
            }));
        }
    }
    for chain in chains.into_iter().flatten() {
        if let Err(err) = chain.await {
            tracing::error!(consumer = %spec.durable, error = %err, "a handler task failed");
        }
    }
    Ok(())
}

async fn ensure_consumer(
    context: &ConsumerContext,
    spec: &ConsumerSpec,
) -> Result<jetstream::consumer::Consumer<pull::Config>, RuntimeError> {
    let provision_error = |message: String| RuntimeError::Provision {
        what: format!("consumer {}", spec.durable),
        message,
    };
    let stream = context
        .jetstream
        .get_stream(spec.stream.name)
        .await
        .map_err(|err| provision_error(err.to_string()))?;
    stream
        .create_consumer(pull::Config {
            durable_name: Some(spec.durable.clone()),
            filter_subjects: spec.filter_subjects.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: context.settings.ack_wait(),
            max_deliver: context.settings.max_deliver,
            ..Default::default()
        })
        .await
        .map_err(|err| provision_error(err.to_string()))
}

async fn process<H: Handler>(
    context: &ConsumerContext,
    spec: &ConsumerSpec,
    handler: &H,
    message: jetstream::Message,
    shutdown: &CancellationToken,
) {
    let started = Instant::now();
    let (stream_sequence, delivered) = match message.info() {
        Ok(info) => (info.stream_sequence, info.delivered),
        Err(err) => {
            tracing::warn!(consumer = %spec.durable, error = %err, "message without JetStream metadata");
            (0, 1)
        }
    };
    let delivery = Delivery {
        subject: message.subject.to_string(),
        stream_sequence,
        delivered,
    };
    let mut transient_failures = 0u32;
    let outcome = loop {
        match handle_once(context, spec, handler, &message, &delivery).await {
            Err(HandleError::Transient(reason)) => {
                transient_failures += 1;
                context
                    .metrics
                    .messages
                    .with_label_values(&[spec.durable.as_str(), "transient"])
                    .inc();
                let wait = transient_delay(transient_failures, context.settings.ack_wait());
                tracing::warn!(consumer = %spec.durable, subject = %delivery.subject, attempt = transient_failures, wait_ms = wait.as_millis() as u64, %reason, "passing failure; handling again");
                if !hold(&message, wait, context.settings.ack_wait(), shutdown).await {
                    // Shutting down: another replica (or this one restarted)
                    // takes the message at once.
                    nak(&message, None).await;
                    context
                        .metrics
                        .messages
                        .with_label_values(&[spec.durable.as_str(), "retry"])
                        .inc();
                    return;
                }
            }
            outcome => break outcome,
        }
    };
    let label = match outcome {
        Ok(()) => {
            crate::crash_point::reached_before_ack(&spec.durable);
            if let Err(err) = message.ack().await {
                tracing::warn!(consumer = %spec.durable, error = %err, "ack failed; message will be redelivered");
            }
            "ack"
        }
        Err(HandleError::Reject { category, reason }) => {
            dead_letter(context, spec, &message, &delivery, category, reason).await
        }
        Err(HandleError::Retry(reason)) if delivered >= context.settings.max_deliver => {
            let reason = format!("gave up after {delivered} deliveries: {reason}");
            dead_letter(
                context,
                spec,
                &message,
                &delivery,
                "retries_exhausted",
                reason,
            )
            .await
        }
        // A passing failure never leaves the loop above; redelivery is what
        // it would get.
        Err(HandleError::Retry(reason) | HandleError::Transient(reason)) => {
            tracing::warn!(consumer = %spec.durable, delivered, %reason, "handler failed; will retry");
            nak(&message, Some(retry_delay(delivered))).await;
            "retry"
        }
    };
    context
        .metrics
        .messages
        .with_label_values(&[spec.durable.as_str(), label])
        .inc();
    context
        .metrics
        .handle_seconds
        .with_label_values(&[spec.durable.as_str()])
        .observe(started.elapsed().as_secs_f64());
}

/// Decodes the message and runs the handler on it once.
async fn handle_once<H: Handler>(
    context: &ConsumerContext,
    spec: &ConsumerSpec,
    handler: &H,
    message: &jetstream::Message,
    delivery: &Delivery,
) -> Result<(), HandleError> {
    let delivered = delivery.delivered;
    let incoming = Incoming::decode(&message.payload)?;
    // A publisher's clock ahead of ours reads as no wait, not a negative one.
    let age = (Utc::now() - incoming.header.time)
        .to_std()
        .unwrap_or_default();
    context
        .metrics
        .message_age_seconds
        .with_label_values(&[spec.durable.as_str()])
        .observe(age.as_secs_f64());
    let entity = incoming.header.entity.clone();
    let span = tracing::info_span!(
        "handle",
        consumer = %spec.durable,
        message_type = %incoming.header.message_type,
        namespace = %entity.namespace,
        name = %entity.name,
        delivered,
    );
    telemetry::link_parent(
        &span,
        message.headers.as_ref(),
        Some(&incoming.header.trace_context),
    );
    handler
        .handle(incoming, delivery.clone())
        .instrument(span)
        .await
}

/// Keeps `message` this consumer's for `wait` (its ack deadline extended in
/// steps shorter than `ack_wait`); false when shutdown came first.
async fn hold(
    message: &jetstream::Message,
    wait: Duration,
    ack_wait: Duration,
    shutdown: &CancellationToken,
) -> bool {
    let step = (ack_wait / 3).max(Duration::from_millis(100));
    let until = tokio::time::Instant::now() + wait;
    loop {
        if let Err(err) = message.ack_with(AckKind::Progress).await {
            tracing::warn!(error = %err, "in-progress ack failed; the message may be redelivered");
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return true;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep((until - now).min(step)) => {}
        }
    }
}

/// Wait before handling a message again after its `failures`-th passing
/// failure: 500 ms doubling to 30 s (at most half the ack wait), each drawn
/// between half and all of that, so replicas that failed together do not
/// return together.
pub fn transient_delay(failures: u32, ack_wait: Duration) -> Duration {
    let cap = Duration::from_secs(30).min(ack_wait / 2);
    let ceiling = capped_doubling(Duration::from_millis(500), failures.max(1) - 1, cap);
    ceiling.mul_f64(rand::random_range(0.5..=1.0))
}

/// Backoff before redelivery `delivered` + 1: 1 s doubling, capped at 60 s.
pub fn retry_delay(delivered: i64) -> Duration {
    let retry = u32::try_from(delivered.max(1) - 1).unwrap_or(u32::MAX);
    capped_doubling(Duration::from_secs(1), retry, Duration::from_secs(60))
}

async fn nak(message: &jetstream::Message, delay: Option<Duration>) {
    if let Err(err) = message.ack_with(AckKind::Nak(delay)).await {
        tracing::warn!(error = %err, "nak failed; message will be redelivered after ack wait");
    }
}

/// Publishes the dead letter, then terminates the original. If the dead letter
/// cannot be stored, the original is NAKed instead so nothing is lost.
async fn dead_letter(
    context: &ConsumerContext,
    spec: &ConsumerSpec,
    message: &jetstream::Message,
    delivery: &Delivery,
    category: &'static str,
    reason: String,
) -> &'static str {
    tracing::error!(consumer = %spec.durable, subject = %delivery.subject, category, %reason, "dead-lettering message");
    let headers: BTreeMap<String, String> = message
        .headers
        .iter()
        .flat_map(|headers| headers.iter())
        .filter_map(|(name, values)| {
            values
                .first()
                .map(|value| (name.to_string(), value.as_str().to_string()))
        })
        .collect();
    let letter = DeadLetter {
        stream: spec.stream.name.to_string(),
        consumer: spec.durable.clone(),
        subject: delivery.subject.clone(),
        stream_sequence: delivery.stream_sequence,
        category: category.to_string(),
        reason: reason.clone(),
        deliveries: delivery.delivered.max(0) as u64,
        failed_at: Utc::now(),
        headers,
        payload: String::from_utf8_lossy(&message.payload).into_owned(),
    };
    let body = match serde_json::to_vec(&letter) {
        Ok(body) => body,
        Err(err) => {
            tracing::error!(error = %err, "cannot encode dead letter");
            nak(message, Some(retry_delay(delivery.delivered))).await;
            return "retry";
        }
    };
    let mut out = HeaderMap::new();
    out.insert("Nats-Msg-Id", letter.message_id().as_str());
    // Header values cannot hold line breaks.
    out.insert(REASON_HEADER, reason.replace(['\r', '\n'], " ").as_str());
    let published = context
        .publisher
        .publish_raw(
            subject::dead_letter(spec.stream.name, &spec.durable),
            out,
            Bytes::from(body),
        )
        .await;
    match published {
        Ok(_) => {
            if let Err(err) = message.ack_with(AckKind::Term).await {
                tracing::warn!(error = %err, "term failed after dead-lettering");
            }
            context
                .metrics
                .dead_letters
                .with_label_values(&[spec.stream.name, spec.durable.as_str(), category])
                .inc();
            "dead_letter"
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot publish dead letter; will retry the original");
            nak(message, Some(retry_delay(delivery.delivered))).await;
            "retry"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_to_a_cap() {
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(2), Duration::from_secs(2));
        assert_eq!(retry_delay(4), Duration::from_secs(8));
        assert_eq!(retry_delay(100), Duration::from_secs(60));
    }

    #[test]
    fn transient_waits_grow_with_jitter_and_stay_under_the_ack_wait() {
        let ack_wait = Duration::from_secs(30);
        for failures in 1..20 {
            let wait = transient_delay(failures, ack_wait);
            let ceiling = (Duration::from_millis(500) * 2u32.pow(failures.min(10) - 1))
                .min(Duration::from_secs(15));
            assert!(
                wait >= ceiling / 2 && wait <= ceiling,
                "{failures}: {wait:?}"
            );
        }
        let draws: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| transient_delay(6, ack_wait)).collect();
        assert!(draws.len() > 1, "jittered");
    }

    #[test]
    fn contract_errors_are_rejections() {
        let err = trainyard_contracts::Incoming::decode(b"{").expect_err("malformed");
        assert!(matches!(
            HandleError::from(err),
            HandleError::Reject {
                category: "malformed",
                ..
            }
        ));
    }
}
