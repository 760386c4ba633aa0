//! The envelope every Trainyard message travels in.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::error::ContractError;

/// The Kubernetes object a message is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntityRef {
    /// Empty for cluster-scoped objects.
    #[serde(default)]
    pub namespace: String,
    pub name: String,
    /// Empty when the object does not exist yet (an external submission).
    #[serde(default)]
    pub uid: String,
}

impl EntityRef {
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub fn key(&self) -> String {
        object_key(&self.namespace, &self.name)
    }
}

/// The key of a Kubernetes object in every map, KV bucket and log line:
/// `namespace/name`, or `name` for cluster-scoped objects (kube-rs's
/// `ObjectRef` and client-go's cache keys read the same).
pub fn object_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// W3C trace context (`traceparent`, `tracestate`) of the span that published the message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// A typed message body. Each payload names its type, the schema version this
/// build speaks, and the subject it is published on.
pub trait Payload: Serialize + DeserializeOwned {
    /// Stable type name, e.g. `trainingjob.changed`.
    const TYPE: &'static str;
    /// Schema version of this payload. Bump on any incompatible change.
    const VERSION: u32;
    /// Subject for a message about `entity`.
    fn subject(&self, entity: &EntityRef) -> String;
}

/// A message: metadata plus a typed payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope<P> {
    /// UUID v7: unique and time-ordered.
    pub id: Uuid,
    #[serde(rename = "type")]
    pub message_type: String,
    pub schema_version: u32,
    /// The service (or external system) that published it.
    pub source: String,
    pub time: DateTime<Utc>,
    pub entity: EntityRef,
    /// Id of the first message of the chain this one belongs to.
    pub correlation_id: Uuid,
    /// Id of the message that directly caused this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<Uuid>,
    #[serde(default)]
    pub trace_context: TraceContext,
    pub payload: P,
}

impl<P: Payload> Envelope<P> {
    /// A message that starts a new chain.
    pub fn new(source: impl Into<String>, entity: EntityRef, payload: P) -> Self {
        let id = Uuid::now_v7();
        Self {
            id,
            message_type: P::TYPE.to_string(),
            schema_version: P::VERSION,
            source: source.into(),
            time: Utc::now(),
            entity,
            correlation_id: id,
            causation_id: None,
            trace_context: TraceContext::default(),
            payload,
        }
    }

    /// A message caused by `cause`: same correlation, causation = cause's id.
    pub fn caused_by<C>(mut self, cause: &Envelope<C>) -> Self {
        self.correlation_id = cause.correlation_id;
        self.causation_id = Some(cause.id);
        self
    }

    /// Same as [`Envelope::caused_by`] for an undecoded message.
    pub fn caused_by_incoming(mut self, cause: &Incoming) -> Self {
        self.correlation_id = cause.header.correlation_id;
        self.causation_id = Some(cause.header.id);
        self
    }

    pub fn subject(&self) -> String {
        self.payload.subject(&self.entity)
    }

    pub fn to_json(&self) -> Result<Vec<u8>, ContractError> {
        serde_json::to_vec(self).map_err(ContractError::Encode)
    }
}

/// The envelope's metadata, without the payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    pub id: Uuid,
    #[serde(rename = "type")]
    pub message_type: String,
    pub schema_version: u32,
    pub source: String,
    pub time: DateTime<Utc>,
    pub entity: EntityRef,
    pub correlation_id: Uuid,
    #[serde(default)]
    pub causation_id: Option<Uuid>,
    #[serde(default)]
    pub trace_context: TraceContext,
}

/// An envelope with its payload undecoded. The header's fields are spelled out
/// rather than a flattened [`Header`]: serde buffers a flattened struct field by
/// field before decoding it, and every service decodes every message it reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEnvelope<'a> {
    id: Uuid,
    #[serde(rename = "type")]
    message_type: String,
    schema_version: u32,
    source: String,
    time: DateTime<Utc>,
    entity: EntityRef,
    correlation_id: Uuid,
    #[serde(default)]
    causation_id: Option<Uuid>,
    #[serde(default)]
    trace_context: TraceContext,
    #[serde(borrow)]
    payload: &'a RawValue,
}

/// A received message whose header is decoded and whose payload is not yet,
/// so one consumer can dispatch on [`Header::message_type`].
#[derive(Debug, Clone)]
pub struct Incoming {
    pub header: Header,
    payload: Box<RawValue>,
}

impl Incoming {
    /// Decodes the header. Fails on anything that is not a Trainyard envelope.
    pub fn decode(bytes: &[u8]) -> Result<Self, ContractError> {
        match serde_json::from_slice::<RawEnvelope<'_>>(bytes) {
            Ok(raw) => Ok(Self::from_raw(raw)),
            Err(error) => match crate::non_finite::quote_literals(bytes) {
                // NaN/Infinity written as bare literals: kept, as strings.
                Some(quoted) => serde_json::from_slice::<RawEnvelope<'_>>(&quoted)
                    .map(Self::from_raw)
                    .map_err(|_| ContractError::Malformed(error)),
                None => Err(ContractError::Malformed(error)),
            },
        }
    }

    fn from_raw(raw: RawEnvelope<'_>) -> Self {
        Self {
            header: Header {
                id: raw.id,
                message_type: raw.message_type,
                schema_version: raw.schema_version,
                source: raw.source,
                time: raw.time,
                entity: raw.entity,
                correlation_id: raw.correlation_id,
                causation_id: raw.causation_id,
                trace_context: raw.trace_context,
            },
            payload: raw.payload.to_owned(),
        }
    }

    /// The payload as generic JSON (for tools that forward messages unchanged).
    pub fn raw_payload(&self) -> serde_json::Value {
        serde_json::from_str(self.payload.get()).unwrap_or(serde_json::Value::Null)
    }

    pub fn is<P: Payload>(&self) -> bool {
        self.header.message_type == P::TYPE
    }

    /// Decodes the payload as `P`, rejecting another type or an unknown version.
    /// Unknown payload fields are ignored, so newer minor additions pass.
    pub fn payload<P: Payload>(&self) -> Result<P, ContractError> {
        if self.header.message_type != P::TYPE {
            return Err(ContractError::WrongType {
                expected: P::TYPE,
                found: self.header.message_type.clone(),
            });
        }
        if self.header.schema_version != P::VERSION {
            return Err(ContractError::UnsupportedVersion {
                message_type: P::TYPE,
                found: self.header.schema_version,
                supported: P::VERSION,
            });
        }
        serde_json::from_str(self.payload.get()).map_err(|source| ContractError::InvalidPayload {
            message_type: P::TYPE,
            source,
        })
    }

    /// Decodes into a full typed envelope.
    pub fn into_envelope<P: Payload>(self) -> Result<Envelope<P>, ContractError> {
        let payload = self.payload::<P>()?;
        let h = self.header;
        Ok(Envelope {
            id: h.id,
            message_type: h.message_type,
            schema_version: h.schema_version,
            source: h.source,
            time: h.time,
            entity: h.entity,
            correlation_id: h.correlation_id,
            causation_id: h.causation_id,
            trace_context: h.trace_context,
            payload,
        })
    }
}

/// Decodes bytes straight into a typed envelope.
pub fn decode<P: Payload>(bytes: &[u8]) -> Result<Envelope<P>, ContractError> {
    Incoming::decode(bytes)?.into_envelope()
}
