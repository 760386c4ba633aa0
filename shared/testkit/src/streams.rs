//! Reading what a JetStream stream holds, for assertions.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures::StreamExt;

/// One stored message.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Subject as stored (with the partition token on partitioned streams).
    pub subject: String,
    pub headers: Option<HeaderMap>,
    pub payload: Bytes,
}

/// Every message in `stream` (only those matching `filter`, if given), in order.
/// Reads with an ephemeral consumer that acks nothing, so it changes no state.
pub async fn stream_messages(
    jetstream: &jetstream::Context,
    stream: &str,
    filter: Option<&str>,
) -> Vec<StoredMessage> {
    let stream = jetstream.get_stream(stream).await.expect("stream exists");
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            filter_subject: filter.unwrap_or_default().to_string(),
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    let mut out = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .expect("fetch");
        let before = out.len();
        while let Some(Ok(message)) = batch.next().await {
            out.push(StoredMessage {
                subject: message.subject.to_string(),
                headers: message.headers.clone(),
                payload: message.payload.clone(),
            });
        }
        if out.len() == before {
            return out;
        }
    }
}

/// Polls `check` until it returns Some, or fails after 20 s.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(what, Duration::from_secs(20), check).await
}

/// Polls `check` every 50 ms until it returns Some, or fails after `limit`.
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
