//! The watcher: Kubernetes watches in, typed change events out. It only reads
//! Kubernetes (its RBAC allows get/list/watch and nothing else).

pub mod adapter;
pub mod error;
pub mod gpu_usage;
pub mod mapping;
pub mod relist;

pub use adapter::{WatcherMetrics, WatcherSettings, pump, setup};
pub use error::WatcherError;
