//! Samplers: given what has been observed and what is still running, choose the
//! parameters of the next trial.
//!
//! All samplers share one contract ([`Sampler`]): the result lies inside the
//! search space (bounds, log scale, int steps, categorical choices), and the same
//! history, pending set and random stream give the same result.

mod grid;
mod random;
mod tpe;

use rand::RngCore;
use serde::{Deserialize, Serialize};

pub use grid::{GridConfig, GridSampler};
pub use random::RandomSampler;
pub use tpe::{TpeConfig, TpeSampler};

use crate::error::{SampleError, SpecError};
use crate::space::{Params, SearchSpace};

/// How a finished trial ended, as the samplers see it. `score` is always
/// "lower is better": the sweep negates the metric for maximized objectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Outcome {
    /// Ran to the end; `score` is its objective.
    Completed { score: f64 },
    /// Early-stopped after reporting `score` at epoch `step`.
    Pruned { score: f64, step: u32 },
    /// Failed, or produced no usable objective. Ignored by TPE, counted as
    /// visited by the grid.
    Failed,
}

/// One finished trial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub params: Params,
    pub outcome: Outcome,
}

impl Observation {
    pub fn completed(params: Params, score: f64) -> Self {
        Self {
            params,
            outcome: Outcome::Completed { score },
        }
    }
}

/// Chooses the next point.
///
/// * `history`: finished trials, oldest first. It must only ever grow by
///   appending (samplers cache per-observation work and re-check the last seen
///   entry; a history that changed otherwise is re-read in full).
/// * `pending`: parameters of trials requested but not finished yet.
/// * `rng`: the random stream of this suggestion. The sweep derives it from the
///   sweep seed and the trial index, so a replay reproduces every suggestion.
pub trait Sampler {
    fn suggest(
        &mut self,
        history: &[Observation],
        pending: &[Params],
        rng: &mut dyn RngCore,
    ) -> Result<Params, SampleError>;
}

/// Which sampler a sweep uses, with its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "camelCase")]
pub enum AlgorithmSpec {
    Random,
    Grid(GridConfig),
    Tpe(TpeConfig),
}

impl Default for AlgorithmSpec {
    fn default() -> Self {
        AlgorithmSpec::Tpe(TpeConfig::default())
    }
}

impl AlgorithmSpec {
    /// Builds the sampler; settings are validated here (errors name the field).
    pub fn build(&self, space: &SearchSpace, seed: u64) -> Result<AnySampler, SpecError> {
        Ok(match self {
            AlgorithmSpec::Random => AnySampler::Random(RandomSampler::new(space.clone())),
            AlgorithmSpec::Grid(cfg) => {
                AnySampler::Grid(GridSampler::new(space.clone(), cfg.clone(), seed)?)
            }
            AlgorithmSpec::Tpe(cfg) => {
                AnySampler::Tpe(TpeSampler::new(space.clone(), cfg.clone())?)
            }
        })
    }
}

/// Any of the built-in samplers (what a sweep holds).
#[derive(Clone, Debug)]
pub enum AnySampler {
    Random(RandomSampler),
    Grid(GridSampler),
    Tpe(TpeSampler),
}

impl Sampler for AnySampler {
    fn suggest(
        &mut self,
        history: &[Observation],
        pending: &[Params],
        rng: &mut dyn RngCore,
    ) -> Result<Params, SampleError> {
        match self {
            AnySampler::Random(s) => s.suggest(history, pending, rng),
            AnySampler::Grid(s) => s.suggest(history, pending, rng),
            AnySampler::Tpe(s) => s.suggest(history, pending, rng),
        }
    }
}
