//! Grid search over the Cartesian product of per-parameter value lists, visited
//! in a seeded pseudo-random order (so a sweep cut short by `maxTrialCount`
//! still covers the space evenly), without repeats.

use std::collections::BTreeSet;

use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Observation, Sampler};
use crate::error::{SampleError, SpecError};
use crate::math::{below, mix64};
use crate::space::{Domain, ParamValue, Params, SearchSpace};

fn default_points() -> u32 {
    5
}

fn default_true() -> bool {
    true
}

/// Grid settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GridConfig {
    /// Number of evenly spaced values (log-spaced for log scale) per float
    /// parameter, end points included. Ints use every step value, categoricals
    /// every choice.
    #[serde(default = "default_points")]
    pub points_per_float: u32,
    /// Visit the grid in a seeded pseudo-random order (default) instead of
    /// row-major order.
    #[serde(default = "default_true")]
    pub shuffle: bool,
}

impl Default for GridConfig {
    fn default() -> Self {
        Self {
            points_per_float: default_points(),
            shuffle: true,
        }
    }
}

#[derive(Clone, Debug)]
enum Axis {
    Floats(Vec<f64>),
    Ints { low: i64, step: i64, count: u64 },
    Choices(Vec<String>),
}

impl Axis {
    fn len(&self) -> u64 {
        match self {
            Axis::Floats(v) => v.len() as u64,
            Axis::Ints { count, .. } => *count,
            Axis::Choices(c) => c.len() as u64,
        }
    }

    fn value(&self, i: u64) -> ParamValue {
        match self {
            Axis::Floats(v) => ParamValue::Float(v.get(i as usize).copied().unwrap_or(f64::NAN)),
            Axis::Ints { low, step, .. } => ParamValue::Int(low + (i as i64) * step),
            Axis::Choices(c) => {
                ParamValue::Categorical(c.get(i as usize).cloned().unwrap_or_default())
            }
        }
    }

    fn index_of(&self, v: &ParamValue) -> Option<u64> {
        match (self, v) {
            (Axis::Floats(pts), ParamValue::Float(x)) => pts
                .iter()
                .position(|p| (p - x).abs() <= 1e-12 * p.abs().max(1.0))
                .map(|i| i as u64),
            (Axis::Ints { low, step, count }, ParamValue::Int(x)) => {
                let d = x.checked_sub(*low)?;
                if d < 0 || d % step != 0 {
                    return None;
                }
                let i = (d / step) as u64;
                (i < *count).then_some(i)
            }
            (Axis::Choices(c), ParamValue::Categorical(x)) => {
                c.iter().position(|p| p == x).map(|i| i as u64)
            }
            _ => None,
        }
    }
}

/// Grid sampler. Grid point `k` of the visiting order is
/// `(mult * k + offset) mod size` in row-major numbering, with `mult` coprime to
/// `size`: a bijection, so every point is visited exactly once, in O(1) memory
/// even for huge grids.
#[derive(Clone, Debug)]
pub struct GridSampler {
    names: Vec<String>,
    axes: Vec<Axis>,
    size: u64,
    mult: u64,
    offset: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl GridSampler {
    pub fn new(space: SearchSpace, config: GridConfig, seed: u64) -> Result<Self, SpecError> {
        if config.points_per_float == 0 {
            return Err(SpecError::field(
                "algorithm.pointsPerFloat",
                "must be at least 1",
            ));
        }
        let n = config.points_per_float as usize;
        let mut axes = Vec::with_capacity(space.len());
        let mut names = Vec::with_capacity(space.len());
        for p in space.params() {
            let axis = match &p.domain {
                Domain::Float { low, high, log } => {
                    let pts = (0..n)
                        .map(|i| {
                            let t = if n == 1 {
                                0.5
                            } else {
                                i as f64 / (n - 1) as f64
                            };
                            let v = if *log {
                                (low.ln() + t * (high.ln() - low.ln())).exp()
                            } else {
                                low + t * (high - low)
                            };
                            v.clamp(*low, *high)
                        })
                        .collect();
                    Axis::Floats(pts)
                }
                Domain::Int {
                    low, high, step, ..
                } => Axis::Ints {
                    low: *low,
                    step: *step,
                    count: ((high - low) / step) as u64 + 1,
                },
                Domain::Categorical { choices } => Axis::Choices(choices.clone()),
            };
            names.push(p.name.clone());
            axes.push(axis);
        }
        let size = axes
            .iter()
            .try_fold(1u64, |acc, a| acc.checked_mul(a.len()))
            .ok_or_else(|| SpecError::field("searchSpace", "the grid has more than 2^64 points"))?;
        let (mult, offset) = if config.shuffle && size > 2 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(mix64(seed ^ 0x6121_D5EE));
            let offset = rng.next_u64() % size;
            // Multiplier near size * 0.618 (golden ratio) for a well spread order,
            // jittered by the seed, then moved to the next value coprime to size.
            let base = ((size as f64) * 0.618_033_988_75) as u64;
            let jitter = below(&mut rng, (size / 8).clamp(1, 1 << 20) as usize) as u64;
            let mut mult = (base + jitter) % size;
            mult = mult.max(1);
            while gcd(mult, size) != 1 {
                mult = mult % (size - 1) + 1;
            }
            (mult, offset)
        } else {
            (1, 0)
        };
        Ok(Self {
            names,
            axes,
            size,
            mult,
            offset,
        })
    }

    /// Total number of grid points.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn point_index(&self, params: &Params) -> Option<u64> {
        let mut idx: u64 = 0;
        for (name, axis) in self.names.iter().zip(&self.axes) {
            let i = axis.index_of(params.get(name)?)?;
            idx = idx * axis.len() + i;
        }
        Some(idx)
    }

    fn point(&self, mut idx: u64) -> Params {
        let mut out = Params::new();
        for (name, axis) in self.names.iter().zip(&self.axes).rev() {
            let len = axis.len();
            out.insert(name.clone(), axis.value(idx % len));
            idx /= len;
        }
        out
    }

    fn permuted(&self, k: u64) -> u64 {
        ((u128::from(self.mult) * u128::from(k) + u128::from(self.offset)) % u128::from(self.size))
            as u64
    }
}

impl Sampler for GridSampler {
    fn suggest(
        &mut self,
        history: &[Observation],
        pending: &[Params],
        _rng: &mut dyn RngCore,
    ) -> Result<Params, SampleError> {
        let visited: BTreeSet<u64> = history
            .iter()
            .map(|o| &o.params)
            .chain(pending)
            .filter_map(|p| self.point_index(p))
            .collect();
        // Among the first |visited| + 1 positions of the order at least one is free.
        let limit = (visited.len() as u64).saturating_add(1).min(self.size);
        (0..limit)
            .map(|k| self.permuted(k))
            .find(|idx| !visited.contains(idx))
            .map(|idx| self.point(idx))
            .ok_or(SampleError::Exhausted)
    }
}
