//! The interruption rate of each spot pool: the catalog's prior, updated with
//! the reclaims observed, as the mean of a Gamma posterior over a Poisson rate
//! (the prior counts as `prior_node_hours` of observation at its rate).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A spot pool: a GPU product in one zone (or region, when nodes carry no zone).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolKey {
    pub product: String,
    pub location: String,
}

impl PoolKey {
    /// `<product>@<location>`.
    pub fn name(&self) -> String {
        format!("{}@{}", self.product, self.location)
    }
}

/// What has been observed of one pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolObservations {
    pub reclaims: u64,
    pub node_hours: f64,
}

/// Observed reclaims and exposure per pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InterruptionModel {
    /// By [`PoolKey::name`] (JSON keys are strings).
    pools: BTreeMap<String, PoolObservations>,
}

impl InterruptionModel {
    /// `node_hours` of spot nodes of `pool` were up.
    pub fn observe_exposure(&mut self, pool: &PoolKey, node_hours: f64) {
        if node_hours.is_finite() && node_hours > 0.0 {
            self.pools.entry(pool.name()).or_default().node_hours += node_hours;
        }
    }

    /// A spot node of `pool` was reclaimed (or lost).
    pub fn observe_reclaim(&mut self, pool: &PoolKey) {
        self.pools.entry(pool.name()).or_default().reclaims += 1;
    }

    pub fn observations(&self, pool: &PoolKey) -> PoolObservations {
        self.pools.get(&pool.name()).cloned().unwrap_or_default()
    }

    /// Reclaims per node-hour: `(prior_rate · prior_hours + reclaims) /
    /// (prior_hours + observed hours)`.
    pub fn rate(&self, pool: &PoolKey, prior_rate: f64, prior_node_hours: f64) -> f64 {
        let seen = self.observations(pool);
        (prior_rate * prior_node_hours + seen.reclaims as f64)
            / (prior_node_hours + seen.node_hours).max(f64::MIN_POSITIVE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_pull_the_rate_from_the_prior_towards_what_was_seen() {
        let pool = PoolKey {
            product: "A100".into(),
            location: "zone-a".into(),
        };
        let mut model = InterruptionModel::default();
        assert_eq!(model.rate(&pool, 0.01, 100.0), 0.01);
        model.observe_exposure(&pool, 100.0);
        for _ in 0..9 {
            model.observe_reclaim(&pool);
        }
        // (0.01·100 + 9) / 200 = 0.05
        assert!((model.rate(&pool, 0.01, 100.0) - 0.05).abs() < 1e-12);
        model.observe_exposure(&pool, 9_800.0);
        assert!(model.rate(&pool, 0.01, 100.0) < 0.0011);
        model.observe_exposure(&pool, f64::NAN);
        assert_eq!(model.observations(&pool).node_hours, 9_900.0);
    }
}
