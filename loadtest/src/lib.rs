//! Building blocks for Trainyard's trace-replay and pipeline load tests. All
//! but [`stack`] are pure: nothing else talks to a cluster or a process; the
//! benchmarks wire these pieces to the stack and a (simulated) cluster and
//! print or plot what they return.
//!
//! - [`trace`]: read and write GPU job traces in the Tiresias CSV columns,
//!   and derive each job's gang layout for a node size;
//! - [`generate`]: a seeded generator of sample traces in the same columns;
//! - [`report`]: job completion time, queueing delay, makespan, GPU
//!   utilisation and time series from per-job records;
//! - [`plot`]: an SVG chart of those time series;
//! - [`procstats`]: CPU seconds and peak RSS of a process from `/proc`;
//! - [`latency`]: latency percentiles for the pipeline test;
//! - [`percentile`]: the nearest-rank percentile both summaries use;
//! - [`throughput`]: message rates from periodic counter samples;
//! - [`workload`]: the simulated cluster, queue and TrainingJobs the
//!   benchmarks submit, and job records from the simulator's history;
//! - [`fifo`]: a strict-FIFO reference schedule for a replayed trace;
//! - [`stack`]: NATS, the simulator and the service binaries as processes,
//!   for the `pipeline` and `trace_replay` benchmarks.

pub mod chaos;
pub mod error;
pub mod fifo;
pub mod generate;
pub mod latency;
pub mod plot;
pub mod procstats;
pub mod report;
pub mod stack;
pub mod throughput;
pub mod trace;
pub mod workload;

pub use error::Error;

/// Command-line value parser for a positive, finite number.
pub fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err(format!("{text:?} must be a positive number")),
    }
}
