//! A simulated Kubernetes cluster for demos, load tests and trace replay — not for
//! production. It serves the part of the Kubernetes API that Trainyard's watcher and
//! planner use (so their real code runs against it), and plays the Job controller,
//! the scheduler and the kubelets of virtual GPU nodes whose workers train at a
//! configured speed on a virtual clock and report over NATS like real workers.

pub mod apiserver;
pub mod checkpoints;
mod discovery;
pub mod error;
mod events;
pub mod faults;
mod log_endpoint;
pub mod object_storage;
mod openapi;
mod pod_admission;
pub mod pod_logs;
mod pod_update;
pub mod resources;
pub mod selector;
pub mod store;
mod table;
mod typed;

pub use error::{ApiError, SimulatorError};
pub use store::Store;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod runner;
