//! Publishing envelopes to JetStream with `Nats-Msg-Id` and trace context.

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self};
use bytes::Bytes;
use trainyard_contracts::{EntityRef, Envelope, Payload, Service};

use crate::error::RuntimeError;
use crate::metrics::RuntimeMetrics;
use crate::telemetry;

/// Publishes on behalf of one service.
#[derive(Clone)]
pub struct Publisher {
    jetstream: jetstream::Context,
    service: Service,
    metrics: RuntimeMetrics,
}

/// What JetStream said about a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub stream_sequence: u64,
    /// JetStream had already stored a message with this id (inside the duplicate window).
    pub duplicate: bool,
}

impl Publisher {
    pub fn new(jetstream: jetstream::Context, service: Service, metrics: RuntimeMetrics) -> Self {
        Self {
            jetstream,
            service,
            metrics,
        }
    }

    /// A new envelope from this service.
    pub fn envelope<P: Payload>(&self, entity: EntityRef, payload: P) -> Envelope<P> {
        Envelope::new(self.service.name(), entity, payload)
    }

    /// Publishes with the envelope id as `Nats-Msg-Id`.
    pub async fn publish<P: Payload>(
        &self,
        envelope: Envelope<P>,
    ) -> Result<Published, RuntimeError> {
        let id = envelope.id.to_string();
        self.publish_with_id(envelope, &id).await
    }

    /// Publishes with an explicit deduplication id, for messages derived from
    /// something that can be seen twice (a watch relist, a replayed decision).
    pub async fn publish_with_id<P: Payload>(
        &self,
        envelope: Envelope<P>,
        message_id: &str,
    ) -> Result<Published, RuntimeError> {
        self.send_with_id(envelope, message_id)
            .await?
            .stored()
            .await
    }

    /// Hands the message to NATS and returns without waiting for the stream's
    /// acknowledgement, so one task can have many messages on the way; they
    /// are stored in the order they were sent.
    pub async fn send_with_id<P: Payload>(
        &self,
        mut envelope: Envelope<P>,
        message_id: &str,
    ) -> Result<PendingPublish, RuntimeError> {
        if envelope.trace_context.traceparent.is_none() {
            envelope.trace_context = telemetry::current_trace_context();
        }
        let subject = envelope.subject();
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", message_id);
        headers.insert("Trainyard-Type", P::TYPE);
        telemetry::inject_current(&mut headers);
        let mut pending = self
            .send_raw(subject, headers, Bytes::from(envelope.to_json()?))
            .await?;
        pending.counted_as = Some((self.metrics.clone(), P::TYPE));
        Ok(pending)
    }

    /// Publishes bytes as they are and waits for the stream's acknowledgement.
    pub async fn publish_raw(
        &self,
        subject: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Published, RuntimeError> {
        self.send_raw(subject, headers, body).await?.stored().await
    }

    async fn send_raw(
        &self,
        subject: String,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<PendingPublish, RuntimeError> {
        let bytes = body.len();
        match self
            .jetstream
            .publish_with_headers(subject.clone(), headers, body)
            .await
        {
            Ok(ack) => Ok(PendingPublish {
                subject,
                ack,
                counted_as: None,
            }),
            Err(err) if err.kind() == PublishErrorKind::MaxPayloadExceeded => {
                Err(RuntimeError::TooLarge {
                    subject,
                    bytes,
                    max_payload: self.jetstream.client().server_info().max_payload,
                })
            }
            Err(err) => Err(RuntimeError::Publish {
                subject,
                message: err.to_string(),
            }),
        }
    }
}

/// A message handed to NATS whose acknowledgement from the stream is still to come.
pub struct PendingPublish {
    subject: String,
    ack: PublishAckFuture,
    /// Counted in `trainyard_messages_published_total` under this type once stored.
    counted_as: Option<(RuntimeMetrics, &'static str)>,
}

impl PendingPublish {
    /// Waits until the stream has stored the message (or says it had it already).
    pub async fn stored(self) -> Result<Published, RuntimeError> {
        let ack = self.ack.await.map_err(|err| RuntimeError::Publish {
            subject: self.subject,
            message: err.to_string(),
        })?;
        if let Some((metrics, message_type)) = self.counted_as {
            metrics.published.with_label_values(&[message_type]).inc();
        }
        Ok(Published {
            stream_sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}
