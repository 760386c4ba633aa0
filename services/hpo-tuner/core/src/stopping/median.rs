//! Median stopping rule: stop a trial whose best score so far is worse than the
//! median of what completed trials reported at the same epoch.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{EarlyStopping, RungStatus, StopDecision};
use crate::error::SpecError;

fn default_startup() -> u32 {
    5
}

/// Median stopping settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MedianStopConfig {
    /// No stopping until this many trials have completed.
    #[serde(default = "default_startup")]
    pub startup_trials: u32,
    /// No stopping before this epoch.
    #[serde(default)]
    pub warmup_epochs: u32,
}

impl Default for MedianStopConfig {
    fn default() -> Self {
        Self {
            startup_trials: default_startup(),
            warmup_epochs: 0,
        }
    }
}

/// Median stopping state: curves of running trials and, per epoch, the sorted
/// scores completed trials reported there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MedianStop {
    config: MedianStopConfig,
    #[serde(with = "super::pairs")]
    running: BTreeMap<u32, Vec<(u32, f64)>>,
    #[serde(with = "super::pairs")]
    completed_at: BTreeMap<u32, Vec<f64>>,
    completed: u32,
}

impl MedianStop {
    pub fn new(config: MedianStopConfig) -> Result<Self, SpecError> {
        if config.startup_trials == 0 {
            return Err(SpecError::field(
                "earlyStopping.startupTrials",
                "must be at least 1",
            ));
        }
        Ok(Self {
            config,
            running: BTreeMap::new(),
            completed_at: BTreeMap::new(),
            completed: 0,
        })
    }

    fn median_at(&self, epoch: u32) -> Option<f64> {
        let v = self.completed_at.get(&epoch)?;
        let n = v.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some(0.5 * (v[n / 2 - 1] + v[n / 2])),
        }
    }
}

impl EarlyStopping for MedianStop {
    fn on_report(&mut self, trial: u32, epoch: u32, score: f64) -> StopDecision {
        let curve = self.running.entry(trial).or_default();
        curve.push((epoch, score));
        let best = curve.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
        if self.completed < self.config.startup_trials || epoch < self.config.warmup_epochs {
            return StopDecision::Continue;
        }
        match self.median_at(epoch) {
            Some(median) if best > median => {
                self.running.remove(&trial);
                StopDecision::Stop { rung: None }
            }
            _ => StopDecision::Continue,
        }
    }

    fn on_trial_end(&mut self, trial: u32, completed: bool) {
        let Some(curve) = self.running.remove(&trial) else {
            return;
        };
        if !completed {
            return;
        }
        self.completed += 1;
        for (epoch, score) in curve {
            let v = self.completed_at.entry(epoch).or_default();
            let pos = v.partition_point(|s| s.total_cmp(&score).is_lt());
            v.insert(pos, score);
        }
    }

    fn rungs(&self) -> Vec<RungStatus> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(m: &mut MedianStop, trial: u32, scores: &[f64]) {
        for (e, s) in scores.iter().enumerate() {
            assert_eq!(m.on_report(trial, e as u32 + 1, *s), StopDecision::Continue);
        }
        m.on_trial_end(trial, true);
    }

    #[test]
    fn stops_worse_than_median_after_startup() {
        let mut m = MedianStop::new(MedianStopConfig {
            startup_trials: 3,
            warmup_epochs: 2,
        })
        .expect("valid");
        finish(&mut m, 0, &[1.0, 0.8, 0.6]);
        finish(&mut m, 1, &[2.0, 1.8, 1.6]);
        // Only 2 completed: no stopping even for a terrible trial.
        assert_eq!(m.on_report(9, 2, 100.0), StopDecision::Continue);
        m.on_trial_end(9, false);
        finish(&mut m, 2, &[3.0, 2.8, 2.6]);
        // Epoch 1 is warm-up.
        assert_eq!(m.on_report(5, 1, 100.0), StopDecision::Continue);
        // Median at epoch 2 is 1.8; the best so far (1.5) is better.
        assert_eq!(m.on_report(5, 2, 1.5), StopDecision::Continue);
        // Median at epoch 3 is 1.6; best so far is still 1.5.
        assert_eq!(m.on_report(5, 3, 1.7), StopDecision::Continue);
        assert_eq!(m.on_report(6, 2, 1.81), StopDecision::Stop { rung: None });
    }

    #[test]
    fn failed_trials_do_not_enter_the_median() {
        let mut m = MedianStop::new(MedianStopConfig {
            startup_trials: 1,
            warmup_epochs: 0,
        })
        .expect("valid");
        m.on_report(0, 1, 0.0);
        m.on_trial_end(0, false);
        assert_eq!(m.on_report(1, 1, 50.0), StopDecision::Continue);
        assert!(
            MedianStop::new(MedianStopConfig {
                startup_trials: 0,
                warmup_epochs: 0
            })
            .is_err()
        );
    }
}
