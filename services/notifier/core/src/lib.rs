//! The notifier's decisions, free of I/O: which events people hear about
//! ([`event`]), where they go ([`routing`]), when and together with what
//! ([`group`], [`notification`]), what they look like ([`render`]), how
//! webhooks are signed ([`sign`]) and how delivery answers are handled
//! ([`delivery`]), how replicas share each destination's pace ([`pace`]), and when a queued job has waited too long ([`queued`]). The service crate feeds it messages and time.

pub mod delivery;
pub mod duration;
pub mod error;
pub mod event;
pub mod group;
pub mod notification;
pub mod pace;
pub mod queued;
pub mod render;
pub mod routing;
pub mod sign;

pub use error::CoreError;
pub use event::{EVENT_TYPES, Event, events_of};
pub use group::{Added, Batch, Grouper};
pub use notification::{Notification, coalesce};
pub use routing::{Destination, GroupPolicy, Routed, Routing};
