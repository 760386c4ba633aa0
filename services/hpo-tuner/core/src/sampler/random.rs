//! Independent uniform sampling (log-uniform for log-scale parameters).

use rand::RngCore;

use super::{Observation, Sampler};
use crate::error::SampleError;
use crate::math::{below, uniform};
use crate::space::{Domain, Params, SearchSpace};

/// Uniform random search. Ignores history; reproducible through the rng.
#[derive(Clone, Debug)]
pub struct RandomSampler {
    space: SearchSpace,
}

impl RandomSampler {
    pub fn new(space: SearchSpace) -> Self {
        Self { space }
    }
}

/// One uniform draw from the space: uniform (or log-uniform) for floats, every
/// step value equally likely for linear ints, log-uniform then rounded for log
/// ints, uniform over categories.
pub(crate) fn sample_uniform(space: &SearchSpace, rng: &mut dyn RngCore) -> Params {
    let mut out = Params::new();
    for p in space.params() {
        let u = match &p.domain {
            Domain::Categorical { choices } => below(rng, choices.len()) as f64,
            _ => uniform(rng),
        };
        out.insert(p.name.clone(), p.domain.decode(u));
    }
    out
}

impl Sampler for RandomSampler {
    fn suggest(
        &mut self,
        _history: &[Observation],
        _pending: &[Params],
        rng: &mut dyn RngCore,
    ) -> Result<Params, SampleError> {
        Ok(sample_uniform(&self.space, rng))
    }
}
