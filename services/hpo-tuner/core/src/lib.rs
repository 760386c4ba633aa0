//! Decision core of the hpo-tuner: pure types and algorithms, no I/O, no async.
//!
//! * [`space`]: search spaces (`float` uniform/log, `int` with step/log,
//!   `categorical`) and parameter values.
//! * [`sampler`]: the [`Sampler`] contract with [`RandomSampler`], [`GridSampler`]
//!   and [`TpeSampler`] (multivariate TPE with constant liar).
//! * [`stopping`]: [`EarlyStopping`] schedulers: [`Asha`], [`Hyperband`],
//!   [`MedianStop`].
//! * [`sweep`]: [`SweepCore`], the state machine the NATS adapter drives:
//!   [`SweepEvent`] in, [`SweepDecision`] out, [`SweepStatus`] for the planner,
//!   [`SweepSnapshot`] for the key-value store.
//! * [`testfns`]: Branin and Hartmann6, for tests and benchmarks.
//!
//! See `README.md` next to this crate for the algorithms and the benchmark.

pub mod error;
pub mod math;
pub mod sampler;
pub mod space;
pub mod stopping;
pub mod sweep;
pub mod testfns;

pub use error::{SampleError, SpecError, SweepError};
pub use sampler::{
    AlgorithmSpec, AnySampler, GridConfig, GridSampler, Observation, Outcome, RandomSampler,
    Sampler, TpeConfig, TpeSampler,
};
pub use space::{Domain, ParamSpec, ParamValue, Params, SearchSpace};
pub use stopping::{
    Asha, AshaConfig, EarlyStopping, EarlyStoppingSpec, Hyperband, MedianStop, MedianStopConfig,
    RungStatus, StopDecision, Stopper,
};
pub use sweep::{
    BestTrial, Direction, FinishReason, Objective, StopReason, SweepCore, SweepDecision,
    SweepEvent, SweepSnapshot, SweepSpec, SweepStatus, TrialCounts, TrialRecord, TrialState,
    trial_id,
};
