//! Trainyard's message contracts: every subject, stream, consumer, key-value bucket
//! and message type. This crate is the only place a subject string is written; the
//! catalogue in [`catalog`] is the public reference for external systems
//! (`docs/messages.md` is generated from it).

/// Implements [`Payload`] for a type published on a per-entity subject.
macro_rules! payload {
    ($ty:ty, $type_name:literal, $version:literal, $family:expr, $kind:literal) => {
        impl $crate::envelope::Payload for $ty {
            const TYPE: &'static str = $type_name;
            const VERSION: u32 = $version;
            fn subject(&self, entity: &$crate::envelope::EntityRef) -> String {
                $crate::subject::entity_subject($family, $kind, entity)
            }
        }
    };
}
pub(crate) use payload;

pub mod alerts;
pub mod backoff;
pub mod catalog;
pub mod commands;
pub mod cost;
pub mod dead_letter;
pub mod decisions;
pub mod envelope;
pub mod error;
pub mod events;
pub mod hash;
pub mod lifecycle;
pub mod non_finite;
pub mod notifications;
pub mod permissions;
pub mod streams;
pub mod subject;
pub mod submit;
pub mod worker;

pub use envelope::{
    EntityRef, Envelope, Header, Incoming, Payload, TraceContext, decode, object_key,
};
pub use error::ContractError;
pub use streams::{Bucket, ConsumerSpec, Service, StreamSpec};
