//! Asynchronous successive halving (ASHA) and asynchronous Hyperband.
//!
//! Rung `k` sits at epoch `minResource * reductionFactor^k` (rungs below
//! `maxResource` only; reaching `maxResource` is completion). A running trial
//! that reaches a rung records its current score there and is compared with
//! **every score ever recorded at that rung** (its own included, by any trial,
//! running or finished): it goes on if it is among the best
//! `floor(n / reductionFactor)` of those `n` scores, and is stopped otherwise.
//! While a rung holds fewer than `reductionFactor` scores, only a new best goes on.
//!
//! Comparing against all results at the rung (not a synchronous cohort) is what
//! makes it asynchronous: no trial ever waits for a cohort to fill, workers never
//! idle, and stragglers cannot hold a rung. The price is that early trials face a
//! weaker field (a few are promoted that a full cohort would have stopped); that
//! is bounded because the bar only rises as the rung fills, and it is the rule
//! Optuna's `SuccessiveHalvingPruner` and Ray Tune's ASHA use as well. See
//! the crate README for the longer argument.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{EarlyStopping, RungStatus, StopDecision};
use crate::error::SpecError;
use crate::math::mix64;

fn default_min_resource() -> u32 {
    1
}

fn default_reduction_factor() -> u32 {
    3
}

/// ASHA / Hyperband settings (resource = epochs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AshaConfig {
    /// Epoch of the first rung.
    #[serde(default = "default_min_resource")]
    pub min_resource: u32,
    /// Epochs a trial runs when never stopped (the trial template's epoch count).
    pub max_resource: u32,
    /// Keep the best `1 / reductionFactor` at each rung.
    #[serde(default = "default_reduction_factor")]
    pub reduction_factor: u32,
}

impl AshaConfig {
    pub fn new(min_resource: u32, max_resource: u32, reduction_factor: u32) -> Self {
        Self {
            min_resource,
            max_resource,
            reduction_factor,
        }
    }

    fn validate(&self) -> Result<(), SpecError> {
        if self.min_resource == 0 {
            return Err(SpecError::field(
                "earlyStopping.minResource",
                "must be at least 1",
            ));
        }
        if self.reduction_factor < 2 {
            return Err(SpecError::field(
                "earlyStopping.reductionFactor",
                "must be at least 2",
            ));
        }
        if self.max_resource <= self.min_resource {
            return Err(SpecError::field(
                "earlyStopping.maxResource",
                "must be greater than minResource",
            ));
        }
        Ok(())
    }

    /// Rung epochs `min * eta^k < max`.
    fn rung_resources(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut r = u64::from(self.min_resource);
        while r < u64::from(self.max_resource) {
            out.push(r as u32);
            r = r.saturating_mul(u64::from(self.reduction_factor.max(2)));
        }
        out
    }
}

/// One rung: its epoch and every score recorded there, kept sorted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rung {
    pub resource: u32,
    pub scores: Vec<f64>,
    pub promoted: u32,
}

impl Rung {
    fn new(resource: u32) -> Self {
        Self {
            resource,
            scores: Vec::new(),
            promoted: 0,
        }
    }

    /// Records `score`, returns whether it passes the promotion test.
    fn record_and_test(&mut self, score: f64, eta: u32) -> bool {
        let pos = self.scores.partition_point(|s| s.total_cmp(&score).is_lt());
        self.scores.insert(pos, score);
        let k = self.scores.len() / eta as usize;
        let threshold = self.scores[k.max(1) - 1];
        let promote = score.total_cmp(&threshold).is_le();
        if promote {
            self.promoted += 1;
        }
        promote
    }
}

/// Asynchronous successive halving. State: the rung tables and, per running
/// trial, the next rung it has to pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Asha {
    config: AshaConfig,
    rungs: Vec<Rung>,
    #[serde(with = "super::pairs")]
    next_rung: BTreeMap<u32, u32>,
}

impl Asha {
    pub fn new(config: AshaConfig) -> Result<Self, SpecError> {
        config.validate()?;
        Ok(Self::unchecked(config))
    }

    fn unchecked(config: AshaConfig) -> Self {
        let rungs = config.rung_resources().into_iter().map(Rung::new).collect();
        Self {
            config,
            rungs,
            next_rung: BTreeMap::new(),
        }
    }

    /// Builds a scheduler with pre-filled rung tables (`scores[k]` = scores
    /// already recorded at rung `k`), e.g. for tests and for what-if analysis.
    pub fn with_rung_scores(config: AshaConfig, scores: Vec<Vec<f64>>) -> Result<Self, SpecError> {
        let mut a = Self::new(config)?;
        for (rung, mut s) in a.rungs.iter_mut().zip(scores) {
            s.retain(|x| !x.is_nan());
            s.sort_by(f64::total_cmp);
            rung.scores = s;
        }
        Ok(a)
    }

    pub fn config(&self) -> &AshaConfig {
        &self.config
    }

    pub fn rung_tables(&self) -> &[Rung] {
        &self.rungs
    }

    fn status(&self, bracket: u32) -> Vec<RungStatus> {
        self.rungs
            .iter()
            .enumerate()
            .map(|(k, r)| RungStatus {
                bracket,
                rung: k as u32,
                resource: r.resource,
                recorded: r.scores.len() as u32,
                promoted: r.promoted,
                running: self
                    .next_rung
                    .values()
                    .filter(|&&n| n == k as u32 + 1)
                    .count() as u32,
            })
            .collect()
    }
}

impl EarlyStopping for Asha {
    fn on_report(&mut self, trial: u32, epoch: u32, score: f64) -> StopDecision {
        let eta = self.config.reduction_factor;
        let next = self.next_rung.entry(trial).or_insert(0);
        while let Some(rung) = self.rungs.get_mut(*next as usize) {
            if epoch < rung.resource {
                break;
            }
            if !rung.record_and_test(score, eta) {
                let failed = *next;
                self.next_rung.remove(&trial);
                return StopDecision::Stop { rung: Some(failed) };
            }
            *next += 1;
        }
        StopDecision::Continue
    }

    fn on_trial_end(&mut self, trial: u32, _completed: bool) {
        self.next_rung.remove(&trial);
    }

    fn rungs(&self) -> Vec<RungStatus> {
        self.status(0)
    }
}

/// Asynchronous Hyperband: bracket `b` is an ASHA whose first rung is at
/// `minResource * eta^b`, so bracket 0 stops most aggressively and the last
/// bracket never stops anything. A trial joins one bracket, drawn from the
/// sweep seed and its index with Hyperband's weights (bracket with `s` rungs
/// gets `ceil((sMax + 1) / (s + 1) * eta^s)` shares).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hyperband {
    config: AshaConfig,
    seed: u64,
    brackets: Vec<Asha>,
    shares: Vec<u64>,
}

impl Hyperband {
    pub fn new(config: AshaConfig, seed: u64) -> Result<Self, SpecError> {
        config.validate()?;
        let s_max = config.rung_resources().len() as u32;
        let eta = u64::from(config.reduction_factor);
        let mut brackets = Vec::new();
        let mut shares = Vec::new();
        for b in 0..=s_max {
            let min = u64::from(config.min_resource) * eta.saturating_pow(b);
            let c = AshaConfig {
                min_resource: min.min(u64::from(u32::MAX)) as u32,
                ..config.clone()
            };
            let asha = Asha::unchecked(c);
            let s = asha.rungs.len() as u32;
            let share = (u64::from(s_max + 1) * eta.saturating_pow(s)).div_ceil(u64::from(s + 1));
            brackets.push(asha);
            shares.push(share.max(1));
        }
        Ok(Self {
            config,
            seed,
            brackets,
            shares,
        })
    }

    /// The bracket trial `trial` belongs to.
    pub fn bracket_of(&self, trial: u32) -> usize {
        let total: u64 = self.shares.iter().sum();
        let mut x = mix64(self.seed ^ mix64(u64::from(trial) ^ 0x4B7A_11D5)) % total.max(1);
        for (b, &s) in self.shares.iter().enumerate() {
            if x < s {
                return b;
            }
            x -= s;
        }
        0
    }

    pub fn brackets(&self) -> &[Asha] {
        &self.brackets
    }
}

impl EarlyStopping for Hyperband {
    fn on_report(&mut self, trial: u32, epoch: u32, score: f64) -> StopDecision {
        let b = self.bracket_of(trial);
        match self.brackets.get_mut(b) {
            Some(a) => a.on_report(trial, epoch, score),
            None => StopDecision::Continue,
        }
    }

    fn on_trial_end(&mut self, trial: u32, completed: bool) {
        let b = self.bracket_of(trial);
        if let Some(a) = self.brackets.get_mut(b) {
            a.on_trial_end(trial, completed);
        }
    }

    fn rungs(&self) -> Vec<RungStatus> {
        self.brackets
            .iter()
            .enumerate()
            .flat_map(|(b, a)| a.status(b as u32))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AshaConfig {
        AshaConfig::new(1, 27, 3)
    }

    #[test]
    fn rungs_are_geometric_below_max() {
        let a = Asha::new(cfg()).expect("valid");
        let r: Vec<u32> = a.rung_tables().iter().map(|r| r.resource).collect();
        assert_eq!(r, vec![1, 3, 9]);
        let b = Asha::new(AshaConfig::new(2, 30, 2)).expect("valid");
        let r: Vec<u32> = b.rung_tables().iter().map(|r| r.resource).collect();
        assert_eq!(r, vec![2, 4, 8, 16]);
    }

    #[test]
    fn invalid_settings_name_the_field() {
        for (c, field) in [
            (AshaConfig::new(0, 27, 3), "earlyStopping.minResource"),
            (AshaConfig::new(1, 27, 1), "earlyStopping.reductionFactor"),
            (AshaConfig::new(9, 9, 3), "earlyStopping.maxResource"),
        ] {
            let e = Asha::new(c).expect_err("invalid");
            assert!(e.to_string().starts_with(field), "{e}");
        }
    }

    #[test]
    fn promotes_top_third_of_all_recorded_at_rung() {
        // Rung 0 already holds 8 scores; with the new one n = 9, k = 3:
        // the new score must be <= the 3rd smallest.
        let table = vec![vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], vec![], vec![]];
        let mut a = Asha::with_rung_scores(cfg(), table.clone()).expect("valid");
        assert_eq!(a.on_report(100, 1, 0.25), StopDecision::Continue);
        let mut a = Asha::with_rung_scores(cfg(), table.clone()).expect("valid");
        assert_eq!(
            a.on_report(100, 1, 0.3),
            StopDecision::Continue,
            "tie promotes"
        );
        let mut a = Asha::with_rung_scores(cfg(), table).expect("valid");
        assert_eq!(
            a.on_report(100, 1, 0.31),
            StopDecision::Stop { rung: Some(0) }
        );
        assert_eq!(
            a.rung_tables()[0].scores.len(),
            9,
            "a stopped trial's score is recorded"
        );
    }

    #[test]
    fn fewer_than_eta_scores_only_a_new_best_goes_on() {
        let mut a = Asha::with_rung_scores(cfg(), vec![vec![0.5], vec![], vec![]]).expect("valid");
        assert_eq!(a.on_report(1, 1, 0.6), StopDecision::Stop { rung: Some(0) });
        assert_eq!(a.on_report(2, 1, 0.4), StopDecision::Continue);
        // Empty rung: the first arrival is the best so far.
        assert_eq!(a.on_report(2, 3, 9.0), StopDecision::Continue);
    }

    #[test]
    fn compares_against_finished_trials_too_not_a_cohort() {
        // Scores at rung 1 come from trials that have long finished or been
        // stopped; a new arrival is still judged against them.
        let table = vec![vec![], vec![0.1, 0.2, 0.3, 0.4, 0.5], vec![]];
        let mut a = Asha::with_rung_scores(cfg(), table).expect("valid");
        // Rung 0 is empty: a new best passes it; at rung 1 n = 6, k = 2,
        // threshold = 0.2 -> 0.35 fails.
        assert_eq!(
            a.on_report(7, 3, 0.35),
            StopDecision::Stop { rung: Some(1) }
        );
        assert_eq!(a.rung_tables()[0].scores, vec![0.35]);
        assert_eq!(a.rung_tables()[1].scores.len(), 6);
    }

    #[test]
    fn reports_between_rungs_and_past_last_rung_continue() {
        let mut a = Asha::new(cfg()).expect("valid");
        assert_eq!(a.on_report(1, 1, 1.0), StopDecision::Continue);
        assert_eq!(a.on_report(1, 2, 0.9), StopDecision::Continue);
        assert_eq!(a.rung_tables()[1].scores.len(), 0, "epoch 2 is not a rung");
        // Skipping epochs: the first report at or beyond a rung counts there.
        assert_eq!(a.on_report(1, 10, 0.5), StopDecision::Continue);
        assert_eq!(a.rung_tables()[1].scores, vec![0.5]);
        assert_eq!(a.rung_tables()[2].scores, vec![0.5]);
        assert_eq!(a.on_report(1, 26, 0.4), StopDecision::Continue);
    }

    #[test]
    fn status_counts_running_trials_per_rung() {
        let mut a = Asha::new(cfg()).expect("valid");
        a.on_report(1, 1, 0.1); // passes rung 0
        a.on_report(2, 1, 0.05); // passes rung 0
        a.on_report(2, 3, 0.05); // passes rung 1
        a.on_report(3, 1, 0.9); // stopped at rung 0
        let s = a.rungs();
        assert_eq!(s[0].recorded, 3);
        assert_eq!(s[0].promoted, 2);
        assert_eq!(s[0].running, 1, "trial 1");
        assert_eq!(s[1].running, 1, "trial 2");
        a.on_trial_end(2, true);
        assert_eq!(a.rungs()[1].running, 0);
    }

    #[test]
    fn hyperband_brackets_and_assignment() {
        let h = Hyperband::new(cfg(), 42).expect("valid");
        let mins: Vec<usize> = h.brackets().iter().map(|a| a.rung_tables().len()).collect();
        assert_eq!(mins, vec![3, 2, 1, 0]);
        let mut counts = [0u32; 4];
        for t in 0..4000 {
            counts[h.bracket_of(t)] += 1;
        }
        // Shares 27, 12, 6, 4 of 49 (s = 3, 2, 1, 0 rungs).
        assert!(counts[0] > counts[1] && counts[1] > counts[2] && counts[2] > counts[3]);
        assert!(counts.iter().all(|&c| c > 0));
        let h2 = Hyperband::new(cfg(), 42).expect("valid");
        assert!(
            (0..100).all(|t| h.bracket_of(t) == h2.bracket_of(t)),
            "seeded"
        );
    }

    #[test]
    fn hyperband_last_bracket_never_stops() {
        let mut h = Hyperband::new(cfg(), 1).expect("valid");
        let last = (0..1000)
            .find(|&t| h.bracket_of(t) == 3)
            .expect("some trial in bracket 3");
        for e in 1..27 {
            assert_eq!(h.on_report(last, e, 1e9), StopDecision::Continue);
        }
    }
}
