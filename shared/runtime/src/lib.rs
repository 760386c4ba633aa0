//! The runtime shared by all seven Trainyard services: layered config, JSON logs and
//! OpenTelemetry traces, Prometheus `/metrics` with `/healthz` and `/readyz`, NATS
//! with reconnect, idempotent stream provisioning, durable consumers with
//! dead-lettering, leases that pick one active replica, and graceful shutdown.

pub mod consumer;
pub mod crash_point;
pub mod error;
pub mod http;
pub mod lease;
pub mod metrics;
pub mod nats;
pub mod publisher;
pub mod runtime;
pub mod serve;
pub mod settings;
pub mod shutdown;
pub mod telemetry;

pub use consumer::{Delivery, HandleError, Handler};
pub use error::RuntimeError;
pub use lease::Lease;
pub use publisher::{PendingPublish, Published, Publisher};
pub use runtime::{Consumers, Runtime};
pub use serve::serve;
pub use settings::{ConfigSources, Settings};
