//! Pure building blocks for Trainyard's trace-replay and pipeline load tests.
//! Nothing here talks to a cluster: the benchmarks wire these pieces to a
//! (simulated) cluster and print or plot what they return.
//!
//! - [`trace`]: read and write GPU job traces in the Tiresias CSV columns,
//!   and derive each job's gang layout for a node size;
//! - [`generate`]: a seeded generator of sample traces in the same columns;
//! - [`report`]: job completion time, queueing delay, makespan, GPU
//!   utilisation and time series from per-job records;
//! - [`plot`]: an SVG chart of those time series;
//! - [`procstats`]: CPU seconds and peak RSS of a process from `/proc`;
//! - [`latency`]: latency percentiles for the pipeline test;
//! - [`percentile`]: the nearest-rank percentile both summaries use.

pub mod error;
pub mod generate;
pub mod latency;
pub mod percentile;
pub mod plot;
pub mod procstats;
pub mod report;
pub mod trace;

pub use error::Error;
