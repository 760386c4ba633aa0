//! How often a job should save: the Young/Daly optimum from the cost of one
//! save and the mean time between interruptions of the job's node pool.
//!
//! Young (1974): `τ = √(2·C·M)`. Daly (2006) refines it for save costs that are
//! not small against `M`: `τ = √(2·C·M)·(1 + ⅓·√(C/2M) + C/18M) − C` while
//! `C < 2M`, else `τ = M`.

use serde::{Deserialize, Serialize};

/// Weight of the newest save duration in the running mean.
const SAVE_SMOOTHING: f64 = 0.3;

/// The running cost of one save, from the durations workers report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SaveStats {
    pub saves: u64,
    /// Exponentially weighted mean save duration in seconds.
    pub mean_seconds: f64,
}

impl SaveStats {
    /// Adds one save's duration; non-finite or negative values are ignored.
    pub fn observe(&mut self, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.mean_seconds = if self.saves == 0 {
            seconds
        } else {
            SAVE_SMOOTHING * seconds + (1.0 - SAVE_SMOOTHING) * self.mean_seconds
        };
        self.saves += 1;
    }
}

/// Interruptions (node losses, spot reclaims, preemptions) seen on a node pool
/// over the running time of the jobs on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionStats {
    pub interruptions: u64,
    /// Seconds jobs ran on the pool.
    pub exposure_seconds: f64,
}

impl InterruptionStats {
    /// Mean seconds between interruptions, with `prior_seconds` counted as one
    /// interval already seen: the prior until the pool has history, then
    /// converging to what the pool shows.
    pub fn mean_seconds_between(&self, prior_seconds: f64) -> f64 {
        (self.exposure_seconds.max(0.0) + prior_seconds) / (self.interruptions as f64 + 1.0)
    }
}

/// A recommended save interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Advice {
    pub interval_seconds: f64,
    pub save_seconds: f64,
    pub mean_seconds_between_interruptions: f64,
}

/// Daly's optimum interval between the starts of two saves for save cost
/// `save_seconds` and mean time between interruptions `mtbi_seconds`.
pub fn optimal_interval(save_seconds: f64, mtbi_seconds: f64) -> f64 {
    let c = save_seconds.max(0.0);
    let m = mtbi_seconds.max(f64::MIN_POSITIVE);
    if c >= 2.0 * m {
        return m;
    }
    let ratio = c / (2.0 * m);
    ((2.0 * c * m).sqrt() * (1.0 + ratio.sqrt() / 3.0 + ratio / 9.0) - c).max(c)
}

/// The advice for a job, once it has reported at least one save duration.
pub fn advise(
    saves: &SaveStats,
    pool: &InterruptionStats,
    prior_mtbi_seconds: f64,
) -> Option<Advice> {
    if saves.saves == 0 {
        return None;
    }
    let mtbi = pool.mean_seconds_between(prior_mtbi_seconds);
    Some(Advice {
        interval_seconds: optimal_interval(saves.mean_seconds, mtbi),
        save_seconds: saves.mean_seconds,
        mean_seconds_between_interruptions: mtbi,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_save_costs_follow_young() {
        // C = 60 s, M = 24 h: Young gives √(2·60·86400) ≈ 3220 s of work between
        // saves; Daly's interval counts from one save's start to the next, so it
        // is that less C, plus a correction under 1% here.
        let tau = optimal_interval(60.0, 86_400.0);
        let young = (2.0_f64 * 60.0 * 86_400.0).sqrt();
        assert!(
            (tau - (young - 60.0)).abs() / young < 0.01,
            "{tau} vs {young}"
        );
    }

    #[test]
    fn costly_saves_against_frequent_interruptions_save_once_per_interval() {
        assert_eq!(optimal_interval(500.0, 200.0), 200.0);
        let tau = optimal_interval(100.0, 100.0);
        assert!((100.0..200.0).contains(&tau), "{tau}");
    }

    #[test]
    fn the_interval_grows_with_the_time_between_interruptions() {
        let mut saves = SaveStats::default();
        let pool = InterruptionStats::default();
        assert!(
            advise(&saves, &pool, 86_400.0).is_none(),
            "no save seen yet"
        );
        saves.observe(30.0);
        saves.observe(f64::NAN);
        assert_eq!(saves.saves, 1);
        let calm = advise(&saves, &pool, 86_400.0).expect("advice");
        assert_eq!(calm.mean_seconds_between_interruptions, 86_400.0);
        let stormy_pool = InterruptionStats {
            interruptions: 9,
            exposure_seconds: 3_600.0,
        };
        let stormy = advise(&saves, &stormy_pool, 86_400.0).expect("advice");
        assert!((stormy.mean_seconds_between_interruptions - 9_000.0).abs() < 1e-9);
        assert!(stormy.interval_seconds < calm.interval_seconds);
    }

    #[test]
    fn the_save_cost_is_a_running_mean() {
        let mut saves = SaveStats::default();
        saves.observe(10.0);
        saves.observe(20.0);
        assert!((saves.mean_seconds - 13.0).abs() < 1e-9);
    }
}
