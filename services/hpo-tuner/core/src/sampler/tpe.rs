//! Tree-structured Parzen Estimator with the multivariate kernel.
//!
//! Follows Optuna 5's `TPESampler` (multivariate product kernels, constant
//! liar, prior component, "magic clip", neighbour-gap bandwidths,
//! `gamma(n) = min(ceil(gamma * n), 25)`, Optuna's recency weights,
//! early-stopped trials ranked after completed ones) with changes that make it
//! cheap enough for a message processor:
//!
//! * per-observation encodings are cached and extended incrementally (the
//!   history only grows), so a suggestion never re-reads old parameter maps;
//! * the "above" (worse) group is capped at `maxAboveKernels` kernels: the most
//!   recent half is kept one kernel per trial, older trials are merged into
//!   contiguous buckets represented by one kernel carrying the bucket's summed
//!   weight, so the density keeps its mass where the data was;
//! * all work is in flat arrays in the unit cube, and the density evaluation
//!   (components x candidates x dims) runs in `f32` on cache-sized tiles with
//!   a branch-free `exp`, so it vectorises.
//!
//! With `nEiCandidates: 24, gamma: 0.1, nStartupTrials: 10, rankWeights: false`
//! this is Optuna's algorithm; the defaults differ in exactly those four (see
//! [`TpeConfig::default`]). Discrete (int) parameters are modelled as
//! continuous on the half-step-widened range and rounded; the density is taken
//! at the rounded point (Optuna integrates each kernel over the step instead).

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use super::random::sample_uniform;
use super::{Observation, Outcome, Sampler};
use crate::error::{SampleError, SpecError};
use crate::math::{LN_SQRT_2PI, below, exp_nonpos_f32, ln_unit_mass, trunc_normal_unit, uniform};
use crate::space::{Params, SearchSpace};

/// TPE settings. Every field has a default; JSON uses camelCase names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TpeConfig {
    /// Random trials before the model is used (completed + early-stopped count).
    pub n_startup_trials: u32,
    /// Points drawn from the "good" density `l(x)`; the one maximising
    /// `l(x) / g(x)` is suggested.
    pub n_ei_candidates: u32,
    /// Fraction of observations in the "good" group ...
    pub gamma: f64,
    /// ... capped at this many.
    pub max_below: u32,
    /// Weight of the wide prior kernel relative to one observation.
    pub prior_weight: f64,
    /// Weight the "good" observations by rank (best first), on top of
    /// Optuna's recency weights.
    pub rank_weights: bool,
    /// One joint kernel over all parameters (true) or one independent TPE per
    /// parameter (false).
    pub multivariate: bool,
    /// Treat running trials as bad observations so parallel suggestions differ.
    pub constant_liar: bool,
    /// Upper bound on kernels in the "bad" density `g(x)` (cost control).
    pub max_above_kernels: u32,
}

impl Default for TpeConfig {
    /// Optuna 5's defaults except four, chosen on seeds disjoint from the
    /// reported benchmark (see the README): 96 EI candidates instead of 24
    /// (the fast batch evaluation makes them affordable, and they are what
    /// moves Hartmann6), `gamma` 0.15 instead of 0.1, 5 startup trials
    /// instead of 10, and rank weights on the "good" group.
    fn default() -> Self {
        Self {
            n_startup_trials: 5,
            n_ei_candidates: 96,
            gamma: 0.15,
            max_below: 25,
            prior_weight: 1.0,
            rank_weights: true,
            multivariate: true,
            constant_liar: true,
            max_above_kernels: 256,
        }
    }
}

impl TpeConfig {
    fn validate(&self) -> Result<(), SpecError> {
        if self.n_ei_candidates == 0 {
            return Err(SpecError::field(
                "algorithm.nEiCandidates",
                "must be at least 1",
            ));
        }
        if !(self.gamma > 0.0 && self.gamma <= 1.0) {
            return Err(SpecError::field("algorithm.gamma", "must be in (0, 1]"));
        }
        if self.max_below == 0 {
            return Err(SpecError::field("algorithm.maxBelow", "must be at least 1"));
        }
        if !(self.prior_weight > 0.0 && self.prior_weight.is_finite()) {
            return Err(SpecError::field(
                "algorithm.priorWeight",
                "must be a finite number > 0",
            ));
        }
        if !(8..=4096).contains(&self.max_above_kernels) {
            return Err(SpecError::field(
                "algorithm.maxAboveKernels",
                "must be between 8 and 4096",
            ));
        }
        if self.max_below > 1024 {
            return Err(SpecError::field(
                "algorithm.maxBelow",
                "must be at most 1024",
            ));
        }
        if self.n_ei_candidates > 100_000 {
            return Err(SpecError::field(
                "algorithm.nEiCandidates",
                "must be at most 100000",
            ));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Numeric,
    Categorical(u32),
}

/// Ranking key, smaller is better: completed trials by score, then early-stopped
/// trials by furthest epoch reached, then score (Optuna's rule).
#[derive(Clone, Copy, Debug)]
struct RankKey {
    class: u8,
    neg_step: i64,
    score: f64,
}

impl RankKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.class
            .cmp(&other.class)
            .then(self.neg_step.cmp(&other.neg_step))
            .then(self.score.total_cmp(&other.score))
    }
}

/// Encoded history, extended incrementally.
#[derive(Clone, Debug, Default)]
struct Cache {
    /// `n x dims` unit coordinates (category index for categoricals).
    rows: Vec<f64>,
    keys: Vec<RankKey>,
    /// History entries consumed so far, and a copy of the last one (to detect a
    /// history that was replaced rather than extended).
    n_seen: usize,
    last: Option<Observation>,
}

/// The TPE sampler. See the module docs.
#[derive(Clone, Debug)]
pub struct TpeSampler {
    space: SearchSpace,
    config: TpeConfig,
    kinds: Vec<Kind>,
    cache: Cache,
}

impl TpeSampler {
    pub fn new(space: SearchSpace, config: TpeConfig) -> Result<Self, SpecError> {
        config.validate()?;
        let kinds = space
            .params()
            .iter()
            .map(|p| match p.domain.n_choices() {
                Some(k) => Kind::Categorical(k as u32),
                None => Kind::Numeric,
            })
            .collect();
        Ok(Self {
            space,
            config,
            kinds,
            cache: Cache::default(),
        })
    }

    pub fn config(&self) -> &TpeConfig {
        &self.config
    }

    fn dims(&self) -> usize {
        self.kinds.len()
    }

    /// Encodes `params` into `out` (appending `dims` values); false (and nothing
    /// appended) when a parameter is missing or outside the space.
    fn encode_into(&self, params: &Params, out: &mut Vec<f64>) -> bool {
        let start = out.len();
        for p in self.space.params() {
            match params.get(&p.name).and_then(|v| p.domain.encode(v)) {
                Some(u) => out.push(u),
                None => {
                    out.truncate(start);
                    return false;
                }
            }
        }
        true
    }

    fn refresh_cache(&mut self, history: &[Observation]) {
        let consistent = self.cache.n_seen <= history.len()
            && match (&self.cache.last, self.cache.n_seen.checked_sub(1)) {
                (None, None) => true,
                (Some(last), Some(i)) => history.get(i) == Some(last),
                _ => false,
            };
        if !consistent {
            self.cache = Cache::default();
        }
        let mut rows = std::mem::take(&mut self.cache.rows);
        for obs in &history[self.cache.n_seen..] {
            let key = match obs.outcome {
                Outcome::Completed { score } if !score.is_nan() => RankKey {
                    class: 0,
                    neg_step: 0,
                    score,
                },
                Outcome::Pruned { score, step } if !score.is_nan() => RankKey {
                    class: 1,
                    neg_step: -i64::from(step),
                    score,
                },
                _ => continue,
            };
            if self.encode_into(&obs.params, &mut rows) {
                self.cache.keys.push(key);
            }
        }
        self.cache.rows = rows;
        self.cache.n_seen = history.len();
        self.cache.last = history.last().cloned();
    }

    fn decode(&self, row: &[f64]) -> Params {
        let mut out = Params::new();
        for (p, &u) in self.space.params().iter().zip(row) {
            out.insert(p.name.clone(), p.domain.decode(u));
        }
        out
    }
}

/// Optuna's default recency weights for `n` observations in trial order: flat 1
/// for the newest 25, a linear ramp from `1/n` up to 1 for older ones.
fn recency_weight(i: usize, n: usize) -> f64 {
    const FLAT: usize = 25;
    if n < FLAT || i >= n - FLAT {
        return 1.0;
    }
    let num = n - FLAT;
    if num == 1 {
        return 1.0 / n as f64;
    }
    let lo = 1.0 / n as f64;
    lo + (1.0 - lo) * i as f64 / (num - 1) as f64
}

/// Bits of a packed sort key that hold the element index (see [`sort_by_value`]).
const IDX_BITS: u32 = 13;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;

/// Sorts `0..values.len()` by value into `order`. Values are in `[0, 1]`, whose
/// `f64` bit patterns order like the numbers, so each value's bits (lowest 13
/// mantissa bits replaced by the index, a relative change below 2^-39) are
/// sorted as plain integers: several times faster than an indirect sort.
fn sort_by_value(
    values: impl ExactSizeIterator<Item = f64>,
    keys: &mut Vec<u64>,
    order: &mut Vec<u32>,
) {
    keys.clear();
    order.clear();
    let n = values.len();
    if n as u64 > IDX_MASK {
        let v: Vec<f64> = values.collect();
        order.extend(0..n as u32);
        order.sort_unstable_by(|&a, &b| v[a as usize].total_cmp(&v[b as usize]));
        return;
    }
    keys.extend(
        values
            .enumerate()
            .map(|(j, x)| ((x + 0.0).max(0.0).to_bits() & !IDX_MASK) | j as u64),
    );
    keys.sort_unstable();
    order.extend(keys.iter().map(|k| (k & IDX_MASK) as u32));
}

/// A mixture of product kernels over a subset of dimensions, in the unit cube.
struct Parzen {
    /// Numeric dims (indices into the full row) and categorical dims with their
    /// number of choices.
    num_dims: Vec<usize>,
    cat_dims: Vec<(usize, u32)>,
    /// Per component: kernel centres and widths on the numeric dims (`m x nn`).
    mu: Vec<f64>,
    sigma: Vec<f64>,
    /// Per component: observed category on each categorical dim (`m x nc`),
    /// `u32::MAX` for the prior component.
    cat_obs: Vec<u32>,
    /// Per categorical dim: log-probability of the observed category, of any
    /// other category, of a category under the uniform prior, and probability
    /// of the observed one (for sampling).
    cat_lhit: Vec<f64>,
    cat_lmiss: Vec<f64>,
    cat_lprior: Vec<f64>,
    cat_phit: Vec<f64>,
    /// Per component: `ln w - sum(ln sigma + ln sqrt(2 pi) + ln Z)`.
    constant: Vec<f64>,
    /// Cumulative normalised weights (for picking a component).
    cum_weight: Vec<f64>,
    /// `f32` copies of what the density evaluation reads (see `log_pdf_batch`):
    /// centres, `-1 / (2 sigma^2)`, per-component constants.
    mu32: Vec<f32>,
    nhp32: Vec<f32>,
    const32: Vec<f32>,
}

/// Reusable buffers of one suggestion.
#[derive(Default)]
struct Scratch {
    keys: Vec<u64>,
    order: Vec<u32>,
    exps: Vec<f32>,
}

impl Parzen {
    /// `rows`: the group's observations (full rows of `dims` values) with their
    /// weights; the prior component is added here.
    fn build(
        rows: &[&[f64]],
        weights: &[f64],
        kinds: &[Kind],
        subset: &[usize],
        prior_weight: f64,
        scratch: &mut Scratch,
    ) -> Self {
        let n = rows.len();
        let m = n + 1;
        let num_dims: Vec<usize> = subset
            .iter()
            .copied()
            .filter(|&d| kinds[d] == Kind::Numeric)
            .collect();
        let cat_dims: Vec<(usize, u32)> = subset
            .iter()
            .filter_map(|&d| match kinds[d] {
                Kind::Categorical(k) => Some((d, k)),
                Kind::Numeric => None,
            })
            .collect();
        let nn = num_dims.len();
        let nc = cat_dims.len();

        // Mixture weights: observations, then the prior.
        let total: f64 = weights.iter().sum::<f64>() + prior_weight;
        let mut constant = Vec::with_capacity(m);
        let mut cum_weight = Vec::with_capacity(m);
        let mut acc = 0.0;
        for w in weights.iter().chain(std::iter::once(&prior_weight)) {
            constant.push((w / total).ln());
            acc += w / total;
            cum_weight.push(acc);
        }

        let mut mu = vec![0.0; m * nn];
        let mut sigma = vec![0.0; m * nn];
        // Magic clip: no kernel narrower than 1 / min(100, n + 2) of the range.
        let min_sigma = 1.0 / (n as f64 + 2.0).min(100.0);
        for (k, &d) in num_dims.iter().enumerate() {
            for (j, r) in rows.iter().enumerate() {
                mu[j * nn + k] = r[d];
            }
            sort_by_value(
                rows.iter().map(|r| r[d]),
                &mut scratch.keys,
                &mut scratch.order,
            );
            let order = &scratch.order;
            // Neighbour-gap bandwidth: the larger gap to the sorted neighbours
            // (end points 0 and 1 count as neighbours, except that the outermost
            // observations use their inner gap only).
            for (pos, &j) in order.iter().enumerate() {
                let x = rows[j as usize][d];
                let left = if pos == 0 {
                    0.0
                } else {
                    rows[order[pos - 1] as usize][d]
                };
                let right = if pos + 1 == n {
                    1.0
                } else {
                    rows[order[pos + 1] as usize][d]
                };
                let s = if n >= 2 && pos == 0 {
                    right - x
                } else if n >= 2 && pos + 1 == n {
                    x - left
                } else {
                    (x - left).max(right - x)
                };
                sigma[j as usize * nn + k] = s.clamp(min_sigma, 1.0);
            }
            mu[n * nn + k] = 0.5;
            sigma[n * nn + k] = 1.0;
        }
        for (j, c) in constant.iter_mut().enumerate() {
            // sum(ln sigma) as ln(prod sigma) over chunks of 8 dims (sigma >=
            // 0.01, so a chunk's product stays far above f64's range limit).
            let sig = &sigma[j * nn..(j + 1) * nn];
            for chunk in sig.chunks(8) {
                *c -= chunk.iter().product::<f64>().ln();
            }
            *c -= nn as f64 * LN_SQRT_2PI;
            for k in 0..nn {
                *c -= ln_unit_mass(mu[j * nn + k], sig[k]);
            }
        }

        let mut cat_obs = vec![u32::MAX; m * nc];
        let mut cat_lhit = Vec::with_capacity(nc);
        let mut cat_lmiss = Vec::with_capacity(nc);
        let mut cat_lprior = Vec::with_capacity(nc);
        let mut cat_phit = Vec::with_capacity(nc);
        for (k, &(d, choices)) in cat_dims.iter().enumerate() {
            for (j, r) in rows.iter().enumerate() {
                cat_obs[j * nc + k] = r[d] as u32;
            }
            // Each observation's row: prior_weight / m on every choice, +1 on
            // the observed one, normalised (Optuna's categorical kernel).
            let base = prior_weight / m as f64;
            let norm = 1.0 + base * f64::from(choices);
            cat_phit.push((1.0 + base) / norm);
            cat_lhit.push(((1.0 + base) / norm).ln());
            cat_lmiss.push((base / norm).ln());
            cat_lprior.push(-f64::from(choices).ln());
        }

        let mu32 = mu.iter().map(|&x| x as f32).collect();
        let nhp32 = sigma.iter().map(|&s| (-0.5 / (s * s)) as f32).collect();
        let const32 = constant.iter().map(|&x| x as f32).collect();
        Self {
            mu32,
            nhp32,
            const32,
            num_dims,
            cat_dims,
            mu,
            sigma,
            cat_obs,
            cat_lhit,
            cat_lmiss,
            cat_lprior,
            cat_phit,
            constant,
            cum_weight,
        }
    }

    fn components(&self) -> usize {
        self.constant.len()
    }

    /// Draws `n` points from the mixture into `batch` (structure of arrays:
    /// `batch[d * n + c]` is dimension `d` of point `c`; only this subset's dims
    /// are written).
    fn sample_batch<R: RngCore>(
        &self,
        rng: &mut R,
        space: &SearchSpace,
        n: usize,
        batch: &mut [f64],
    ) {
        let m = self.components();
        let nn = self.num_dims.len();
        let nc = self.cat_dims.len();
        let params = space.params();
        for c in 0..n {
            let u = uniform(rng);
            let j = self.cum_weight.partition_point(|&w| w < u).min(m - 1);
            for (k, &d) in self.num_dims.iter().enumerate() {
                let x = trunc_normal_unit(rng, self.mu[j * nn + k], self.sigma[j * nn + k]);
                batch[d * n + c] = params.get(d).map_or(x, |p| p.domain.snap(x));
            }
            for (k, &(d, choices)) in self.cat_dims.iter().enumerate() {
                let obs = self.cat_obs[j * nc + k];
                let cat = if obs == u32::MAX || choices <= 1 {
                    below(rng, choices as usize) as u32
                } else if uniform(rng) < self.cat_phit[k] {
                    obs
                } else {
                    let r = below(rng, choices as usize - 1) as u32;
                    if r >= obs { r + 1 } else { r }
                };
                batch[d * n + c] = f64::from(cat);
            }
        }
    }

    /// Log density of the `n` points of `batch` (`f32` copy of the layout of
    /// `sample_batch`) into `out`.
    ///
    /// This is the hot loop of the sampler (components x candidates x dims), so it
    /// runs in `f32` on tiles of candidates that stay in L1 cache, over contiguous
    /// arrays with a branch-free `exp`: the loops vectorise 4 lanes wide even for
    /// baseline x86-64. Terms that are large in magnitude (far-away kernels) lose
    /// absolute precision but are negligible in the log-sum-exp; the result is
    /// accurate to ~1e-6 relative, far below what changes an argmax except on
    /// exact ties.
    fn log_pdf_batch(&self, batch: &[f32], n: usize, out: &mut [f64], scratch: &mut Scratch) {
        const TILE: usize = 32;
        let m = self.components();
        let nn = self.num_dims.len();
        let nc = self.cat_dims.len();
        let exps = &mut scratch.exps;
        exps.clear();
        exps.resize(m * TILE, 0.0);
        let cat_lhit: Vec<f32> = self.cat_lhit.iter().map(|&x| x as f32).collect();
        let cat_lmiss: Vec<f32> = self.cat_lmiss.iter().map(|&x| x as f32).collect();
        let cat_lprior: Vec<f32> = self.cat_lprior.iter().map(|&x| x as f32).collect();
        let mut start = 0;
        while start < n {
            let t = TILE.min(n - start);
            let mut mx = [f32::NEG_INFINITY; TILE];
            let mx = &mut mx[..t];
            for j in 0..m {
                let ej = &mut exps[j * TILE..j * TILE + t];
                ej.fill(self.const32[j]);
                for k in 0..nn {
                    let base = self.num_dims[k] * n + start;
                    let xs = &batch[base..base + t];
                    let mu = self.mu32[j * nn + k];
                    let h = self.nhp32[j * nn + k];
                    for (e, &x) in ej.iter_mut().zip(xs) {
                        let z = x - mu;
                        *e += h * z * z;
                    }
                }
                for k in 0..nc {
                    let base = self.cat_dims[k].0 * n + start;
                    let xs = &batch[base..base + t];
                    let obs = self.cat_obs[j * nc + k];
                    if obs == u32::MAX {
                        let v = cat_lprior[k];
                        ej.iter_mut().for_each(|e| *e += v);
                    } else {
                        let (hit, miss, o) = (cat_lhit[k], cat_lmiss[k], obs as f32);
                        for (e, &x) in ej.iter_mut().zip(xs) {
                            *e += if x == o { hit } else { miss };
                        }
                    }
                }
                for (a, &e) in mx.iter_mut().zip(ej.iter()) {
                    *a = a.max(e);
                }
            }
            let mut sums = [0.0f32; TILE];
            let sums = &mut sums[..t];
            for j in 0..m {
                let ej = &exps[j * TILE..j * TILE + t];
                for ((s, &e), &a) in sums.iter_mut().zip(ej).zip(mx.iter()) {
                    *s += exp_nonpos_f32(e - a);
                }
            }
            for ((o, &s), &a) in out[start..start + t]
                .iter_mut()
                .zip(sums.iter())
                .zip(mx.iter())
            {
                *o = if a.is_finite() {
                    f64::from(a) + f64::from(s).ln()
                } else {
                    f64::NEG_INFINITY
                };
            }
            start += t;
        }
    }
}

impl Sampler for TpeSampler {
    fn suggest(
        &mut self,
        history: &[Observation],
        pending: &[Params],
        rng: &mut dyn RngCore,
    ) -> Result<Params, SampleError> {
        self.refresh_cache(history);
        let dims = self.dims();
        let n = self.cache.keys.len();
        if n < self.config.n_startup_trials as usize || dims == 0 {
            return Ok(sample_uniform(&self.space, rng));
        }

        // Split into the best `gamma(n)` ("below") and the rest ("above").
        let n_below = ((self.config.gamma * n as f64).ceil() as usize)
            .min(self.config.max_below as usize)
            .clamp(1, n);
        let keys = &self.cache.keys;
        let mut idx: Vec<u32> = (0..n as u32).collect();
        if n_below < n {
            idx.select_nth_unstable_by(n_below - 1, |&a, &b| {
                keys[a as usize].cmp(&keys[b as usize])
            });
        }
        let mut is_below = vec![false; n];
        for &i in &idx[..n_below] {
            is_below[i as usize] = true;
        }
        let rows = &self.cache.rows;
        let row = |i: usize| &rows[i * dims..(i + 1) * dims];

        // "Good" density weights: Optuna's recency weights, times (by default)
        // linear rank weights, best observation 1 down to 1/n_below for the
        // worst member of the group (like the recombination weights of
        // evolution strategies), so the kernel on the incumbent dominates.
        let below_idx: Vec<usize> = (0..n).filter(|&i| is_below[i]).collect();
        let below_rows: Vec<&[f64]> = below_idx.iter().map(|&i| row(i)).collect();
        let nb = below_idx.len();
        let mut below_w: Vec<f64> = (0..nb).map(|i| recency_weight(i, nb)).collect();
        if self.config.rank_weights && nb > 1 {
            let mut by_rank: Vec<usize> = (0..nb).collect();
            by_rank.sort_by(|&a, &b| keys[below_idx[a]].cmp(&keys[below_idx[b]]));
            for (rank, &pos) in by_rank.iter().enumerate() {
                below_w[pos] *= (nb - rank) as f64 / nb as f64;
            }
        }

        // Running trials (constant liar) count as the newest "above" entries.
        let mut pending_rows = Vec::new();
        if self.config.constant_liar {
            for p in pending {
                self.encode_into(p, &mut pending_rows);
            }
        }
        let mut above_rows: Vec<&[f64]> = (0..n).filter(|&i| !is_below[i]).map(row).collect();
        above_rows.extend(pending_rows.chunks_exact(dims));
        let (above_rows, above_w) = cap_kernels(above_rows, self.config.max_above_kernels as usize);

        let subsets: Vec<Vec<usize>> = if self.config.multivariate {
            vec![(0..dims).collect()]
        } else {
            (0..dims).map(|d| vec![d]).collect()
        };
        let n_cand = self.config.n_ei_candidates as usize;
        // One seed from the caller's stream, then a fast statically dispatched
        // generator for the candidate draws (still fully determined by `rng`).
        let mut fast_rng = SmallRng::seed_from_u64(rng.next_u64());
        let mut batch = vec![0.0; dims * n_cand];
        let mut batch32: Vec<f32> = Vec::with_capacity(dims * n_cand);
        let mut log_l = vec![0.0; n_cand];
        let mut log_g = vec![0.0; n_cand];
        let mut scratch = Scratch::default();
        let mut best_row = vec![0.0; dims];
        let pw = self.config.prior_weight;
        for subset in &subsets {
            let l = Parzen::build(&below_rows, &below_w, &self.kinds, subset, pw, &mut scratch);
            let g = Parzen::build(&above_rows, &above_w, &self.kinds, subset, pw, &mut scratch);
            l.sample_batch(&mut fast_rng, &self.space, n_cand, &mut batch);
            batch32.clear();
            batch32.extend(batch.iter().map(|&x| x as f32));
            l.log_pdf_batch(&batch32, n_cand, &mut log_l, &mut scratch);
            g.log_pdf_batch(&batch32, n_cand, &mut log_g, &mut scratch);
            let mut best = 0;
            let mut best_acq = f64::NEG_INFINITY;
            for c in 0..n_cand {
                let acq = log_l[c] - log_g[c];
                if acq > best_acq {
                    best_acq = acq;
                    best = c;
                }
            }
            for &d in subset {
                best_row[d] = batch[d * n_cand + best];
            }
        }
        Ok(self.decode(&best_row))
    }
}

/// Limits a group (in trial order) to `cap` kernels. Returns the kept rows and
/// their weights (Optuna's recency weights; a merged bucket carries the sum of
/// its members' weights and is represented by its middle member).
fn cap_kernels(rows: Vec<&[f64]>, cap: usize) -> (Vec<&[f64]>, Vec<f64>) {
    let n = rows.len();
    if n <= cap {
        let w = (0..n).map(|i| recency_weight(i, n)).collect();
        return (rows, w);
    }
    let recent = cap / 2;
    let old = n - recent;
    let buckets = cap - recent;
    let mut out_rows = Vec::with_capacity(cap);
    let mut out_w = Vec::with_capacity(cap);
    for b in 0..buckets {
        let lo = b * old / buckets;
        let hi = (b + 1) * old / buckets;
        if lo >= hi {
            continue;
        }
        out_rows.push(rows[(lo + hi) / 2]);
        out_w.push((lo..hi).map(|i| recency_weight(i, n)).sum());
    }
    for (i, r) in rows.iter().enumerate().skip(old) {
        out_rows.push(*r);
        out_w.push(recency_weight(i, n));
    }
    (out_rows, out_w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recency_weights_match_optuna() {
        // default_weights(30) = linspace(1/30, 1, 5) ++ ones(25)
        let w: Vec<f64> = (0..30).map(|i| recency_weight(i, 30)).collect();
        let lo = 1.0 / 30.0;
        for (i, want) in [lo, lo + (1.0 - lo) * 0.25, lo + (1.0 - lo) * 0.5]
            .iter()
            .enumerate()
        {
            assert!((w[i] - want).abs() < 1e-12, "w[{i}] = {}", w[i]);
        }
        assert!((w[4] - 1.0).abs() < 1e-12);
        assert!(w[5..].iter().all(|&x| x == 1.0));
        assert!((0..24).all(|i| recency_weight(i, 24) == 1.0));
    }

    #[test]
    fn capping_keeps_total_weight_and_recent_kernels() {
        let data: Vec<Vec<f64>> = (0..1000).map(|i| vec![i as f64 / 1000.0]).collect();
        let rows: Vec<&[f64]> = data.iter().map(|r| r.as_slice()).collect();
        let full: f64 = (0..1000).map(|i| recency_weight(i, 1000)).sum();
        let (kept, w) = cap_kernels(rows, 64);
        assert_eq!(kept.len(), 64);
        assert_eq!(w.len(), 64);
        let total: f64 = w.iter().sum();
        assert!((total - full).abs() < 1e-9, "{total} vs {full}");
        assert_eq!(kept[63][0], 0.999, "newest observation kept as is");
    }
}
