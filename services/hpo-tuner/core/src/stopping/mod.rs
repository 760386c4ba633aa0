//! Early stopping: decide, every time a running trial reports its objective at
//! some epoch, whether it continues.
//!
//! Schedulers work on scores where lower is better (the sweep negates maximised
//! metrics) and on the epoch as the resource axis. They hold state (rung tables,
//! curves) that is part of the sweep snapshot, so they are serde types.

mod asha;
mod median;

use serde::{Deserialize, Serialize};

pub use asha::{Asha, AshaConfig, Hyperband};
pub use median::{MedianStop, MedianStopConfig};

use crate::error::SpecError;

/// Serializes an integer-keyed map as a list of `[key, value]` pairs: JSON
/// object keys are strings, which do not survive serde's buffering inside
/// internally tagged enums (and are awkward in other formats).
pub(crate) mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K, V, S>(map: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error>
    where
        K: Serialize,
        V: Serialize,
        S: Serializer,
    {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
    }
}

/// Outcome of one report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum StopDecision {
    Continue,
    /// Stop the trial. `rung` is the ASHA rung whose promotion test it failed
    /// (`None` for rules without rungs).
    Stop {
        rung: Option<u32>,
    },
}

/// Occupancy of one rung, for the sweep status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RungStatus {
    /// Hyperband bracket (0 for plain ASHA).
    pub bracket: u32,
    pub rung: u32,
    /// Epoch at which trials are compared at this rung.
    pub resource: u32,
    /// Trials that have recorded a result at this rung.
    pub recorded: u32,
    /// Of those, trials that passed the promotion test and went on.
    pub promoted: u32,
    /// Running trials whose highest rung passed is this one.
    pub running: u32,
}

/// The early-stopping contract.
pub trait EarlyStopping {
    /// Trial `trial` reported `score` (lower is better) at `epoch`. Reports come
    /// with increasing epochs per trial (the sweep drops duplicates).
    fn on_report(&mut self, trial: u32, epoch: u32, score: f64) -> StopDecision;
    /// Trial ended (completed, stopped, or failed); `completed` is true when it
    /// ran to its end with a valid objective.
    fn on_trial_end(&mut self, trial: u32, completed: bool);
    /// Current rung occupancy (empty for rules without rungs).
    fn rungs(&self) -> Vec<RungStatus>;
}

/// Early-stopping configuration of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "camelCase")]
pub enum EarlyStoppingSpec {
    /// Asynchronous successive halving.
    Asha(AshaConfig),
    /// Asynchronous Hyperband: several ASHA brackets with growing minimum
    /// resource; each trial joins one bracket (seeded, by trial index).
    Hyperband(AshaConfig),
    /// Median stopping rule.
    Median(MedianStopConfig),
}

impl EarlyStoppingSpec {
    /// Builds the scheduler; settings are validated (errors name the field).
    pub fn build(&self, seed: u64) -> Result<Stopper, SpecError> {
        Ok(match self {
            EarlyStoppingSpec::Asha(c) => Stopper::Asha(Asha::new(c.clone())?),
            EarlyStoppingSpec::Hyperband(c) => Stopper::Hyperband(Hyperband::new(c.clone(), seed)?),
            EarlyStoppingSpec::Median(c) => Stopper::Median(MedianStop::new(c.clone())?),
        })
    }
}

/// Any of the built-in schedulers, with its state (what a sweep snapshots).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Stopper {
    Asha(Asha),
    Hyperband(Hyperband),
    Median(MedianStop),
}

impl EarlyStopping for Stopper {
    fn on_report(&mut self, trial: u32, epoch: u32, score: f64) -> StopDecision {
        match self {
            Stopper::Asha(s) => s.on_report(trial, epoch, score),
            Stopper::Hyperband(s) => s.on_report(trial, epoch, score),
            Stopper::Median(s) => s.on_report(trial, epoch, score),
        }
    }

    fn on_trial_end(&mut self, trial: u32, completed: bool) {
        match self {
            Stopper::Asha(s) => s.on_trial_end(trial, completed),
            Stopper::Hyperband(s) => s.on_trial_end(trial, completed),
            Stopper::Median(s) => s.on_trial_end(trial, completed),
        }
    }

    fn rungs(&self) -> Vec<RungStatus> {
        match self {
            Stopper::Asha(s) => s.rungs(),
            Stopper::Hyperband(s) => s.rungs(),
            Stopper::Median(s) => s.rungs(),
        }
    }
}
