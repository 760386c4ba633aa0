//! Spot or on-demand, on the expected cost of finishing the job.
//!
//! On spot, a job whose gang spans `nodes` nodes is interrupted at rate
//! λ = reclaims per node-hour × nodes. Work is saved every τ hours (the
//! checkpoint interval; without checkpoints the whole run is one segment), a
//! save takes s hours and a restart R hours. The expected time to finish a
//! segment under Poisson interruptions is e^{λR}(e^{λ(τ+s)} − 1)/λ (Duda's
//! formula, the one Young and Daly optimise), so W hours of work take
//! W/τ times that. On-demand takes W + (W/τ)·s. Each is priced at its GPU-hour
//! price for every GPU of the gang.
//!
//! With a deadline D, the choice is made again after every interruption with
//! the time then left, so spot misses the deadline only when an interruption
//! leaves too little time for on-demand to finish: when the work it loses
//! (the time since the last checkpoint, or since the start without
//! checkpoints) plus the restart exceeds the slack S = D − T_on-demand. The
//! risk of spot is the probability that the first interruption (Poisson at
//! rate λ, within T_on-demand) is such a one; spot is taken only when it is
//! within `deadline_risk_tolerance` of on-demand's. This assumes on-demand
//! capacity is there when the job moves to it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The two capacity types a job is run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    Spot,
    OnDemand,
}

impl Choice {
    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Spot => "spot",
            Choice::OnDemand => "on-demand",
        }
    }
}

/// Where the remaining runtime came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RuntimeSource {
    /// `scheduling.estimatedRuntimeSeconds`.
    Estimate,
    /// The mean runtime of finished jobs of the same model.
    History,
    /// Neither: the configured default.
    Default,
}

/// Everything the choice depends on; published with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionInputs {
    /// Hours of work left at full speed.
    pub work_hours: f64,
    pub runtime_source: RuntimeSource,
    pub gpus: u32,
    /// Nodes the gang spans; each can be reclaimed.
    pub nodes: u32,
    /// Hours between checkpoints; `None`: the job does not checkpoint.
    pub checkpoint_interval_hours: Option<f64>,
    /// Hours a checkpoint save takes.
    pub checkpoint_save_hours: f64,
    /// Hours from an interruption to training again (new node, pull, load).
    pub restart_hours: f64,
    pub spot_price_per_gpu_hour: f64,
    pub on_demand_price_per_gpu_hour: f64,
    pub spot_reclaims_per_node_hour: f64,
    /// Hours from now to the deadline, if the job has one.
    pub hours_to_deadline: Option<f64>,
    /// Times this job was already interrupted on spot.
    pub spot_interruptions: u32,
    /// Interruptions after which the job stays on on-demand.
    pub max_spot_interruptions: u32,
    /// Extra deadline risk spot may carry over on-demand, a probability.
    pub deadline_risk_tolerance: f64,
}

/// Expected duration, cost and deadline risk of one option.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OptionEstimate {
    pub expected_hours: f64,
    pub expected_cost: f64,
    /// Probability of missing the deadline; `None` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub miss_probability: Option<f64>,
}

/// The choice, both estimates and the text that explains it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityChoice {
    pub choice: Choice,
    pub spot: OptionEstimate,
    pub on_demand: OptionEstimate,
    pub reason: String,
}

/// Hours of (interval, number of segments) for `work` hours.
fn segments(inputs: &DecisionInputs) -> (f64, f64) {
    let work = inputs.work_hours.max(0.0);
    match inputs.checkpoint_interval_hours {
        Some(tau) if tau > 0.0 && tau < work => (tau, work / tau),
        _ => (work, 1.0),
    }
}

/// Interruptions per hour of the whole gang: any of its nodes may be
/// reclaimed.
fn gang_reclaims_per_hour(inputs: &DecisionInputs) -> f64 {
    inputs.spot_reclaims_per_node_hour.max(0.0) * f64::from(inputs.nodes.max(1))
}

/// Hours a checkpoint save takes, when the job saves between segments.
fn save_hours(inputs: &DecisionInputs, count: f64) -> f64 {
    if count > 1.0 {
        inputs.checkpoint_save_hours.max(0.0)
    } else {
        0.0
    }
}

/// Probability that spot misses `deadline` (hours from now) when the job
/// moves to on-demand after an interruption: the first interruption, within
/// the `od_hours` the run takes, comes when the work lost since the last
/// checkpoint is more than the slack after the restart.
fn spot_miss_probability(inputs: &DecisionInputs, od_hours: f64, deadline: f64) -> f64 {
    let lambda = gang_reclaims_per_hour(inputs);
    let (tau, count) = segments(inputs);
    // Work since the last save is lost: each period of a segment and its
    // save starts again from nothing.
    let period = tau + save_hours(inputs, count);
    let margin = deadline - od_hours - inputs.restart_hours.max(0.0);
    if lambda <= 0.0 || od_hours <= 0.0 || margin >= period {
        return 0.0;
    }
    let survives = |t: f64| (-lambda * t).exp();
    let margin = margin.max(0.0);
    // P(first interruption in [jP + margin, (j+1)P)) summed over the n full
    // periods (a geometric series), then the part of the last one.
    let full = (od_hours / period).floor();
    let per_period_decay = -(-lambda * period).exp_m1();
    let series = if per_period_decay > 0.0 {
        -(-lambda * period * full).exp_m1() / per_period_decay
    } else {
        full
    };
    let mut risk = (survives(margin) - survives(period)) * series;
    let last = full * period;
    if last + margin < od_hours {
        risk += survives(last + margin) - survives(od_hours);
    }
    risk.clamp(0.0, 1.0)
}

/// Expected hours to finish on spot.
pub fn expected_spot_hours(inputs: &DecisionInputs) -> f64 {
    let (tau, count) = segments(inputs);
    let save = save_hours(inputs, count);
    let lambda = gang_reclaims_per_hour(inputs);
    if lambda * (tau + save) < 1e-9 {
        return count * (tau + save);
    }
    count * (lambda * inputs.restart_hours.max(0.0)).exp() * ((lambda * (tau + save)).exp() - 1.0)
        / lambda
}

/// Hours to finish on on-demand: the work and its checkpoint saves.
pub fn on_demand_hours(inputs: &DecisionInputs) -> f64 {
    let (tau, count) = segments(inputs);
    count * (tau + save_hours(inputs, count))
}

/// Chooses spot or on-demand for `inputs`.
pub fn decide(inputs: &DecisionInputs) -> CapacityChoice {
    let gpus = f64::from(inputs.gpus.max(1));
    let od_hours = on_demand_hours(inputs);
    let spot_hours = expected_spot_hours(inputs);
    let lambda = gang_reclaims_per_hour(inputs);
    let (od_miss, spot_miss) = match inputs.hours_to_deadline {
        None => (None, None),
        Some(deadline) if deadline < od_hours => (Some(1.0), Some(1.0)),
        Some(deadline) => (
            Some(0.0),
            Some(spot_miss_probability(inputs, od_hours, deadline)),
        ),
    };
    let spot = OptionEstimate {
        expected_hours: spot_hours,
        expected_cost: spot_hours * gpus * inputs.spot_price_per_gpu_hour,
        miss_probability: spot_miss,
    };
    let on_demand = OptionEstimate {
        expected_hours: od_hours,
        expected_cost: od_hours * gpus * inputs.on_demand_price_per_gpu_hour,
        miss_probability: od_miss,
    };
    let too_many = inputs.spot_interruptions >= inputs.max_spot_interruptions;
    let risky = match (spot_miss, od_miss) {
        (Some(s), Some(o)) => s > o + inputs.deadline_risk_tolerance,
        _ => false,
    };
    let cheaper = spot.expected_cost < on_demand.expected_cost;
    let choice = if !too_many && !risky && cheaper {
        Choice::Spot
    } else {
        Choice::OnDemand
    };
    let reason = explain(inputs, choice, &spot, &on_demand, too_many, risky, lambda);
    CapacityChoice {
        choice,
        spot,
        on_demand,
        reason,
    }
}

fn explain(
    inputs: &DecisionInputs,
    choice: Choice,
    spot: &OptionEstimate,
    on_demand: &OptionEstimate,
    too_many: bool,
    risky: bool,
    lambda: f64,
) -> String {
    let mut text = String::new();
    let because = if too_many {
        format!(
            "interrupted {} times on spot (limit {})",
            inputs.spot_interruptions, inputs.max_spot_interruptions
        )
    } else if risky {
        "spot risks the deadline more".to_string()
    } else if choice == Choice::Spot {
        let saving = 1.0 - spot.expected_cost / on_demand.expected_cost.max(f64::MIN_POSITIVE);
        format!("saves {:.0}%", saving * 100.0)
    } else {
        "spot's rework costs more than it saves".to_string()
    };
    let runtime = match inputs.runtime_source {
        RuntimeSource::Estimate => "estimate",
        RuntimeSource::History => "history",
        RuntimeSource::Default => "default",
    };
    let _ = write!(
        text,
        "{}: {because}. spot ${:.2} ({:.2} h at {:.4} reclaims/h over {} node(s)) vs on-demand ${:.2} ({:.2} h); {:.2} h of work ({runtime}), ",
        choice.as_str(),
        spot.expected_cost,
        spot.expected_hours,
        lambda,
        inputs.nodes.max(1),
        on_demand.expected_cost,
        on_demand.expected_hours,
        inputs.work_hours,
    );
    match inputs.checkpoint_interval_hours {
        Some(tau) => {
            let _ = write!(text, "checkpoint every {:.2} h", tau);
        }
        None => text.push_str("no checkpoints"),
    }
    if let (Some(deadline), Some(s), Some(o)) = (
        inputs.hours_to_deadline,
        spot.miss_probability,
        on_demand.miss_probability,
    ) {
        let _ = write!(
            text,
            "; deadline in {deadline:.1} h: miss risk {:.1}% on spot, {:.1}% on-demand",
            s * 100.0,
            o * 100.0
        );
    }
    text
}

/// Runtimes of finished jobs, by model, for jobs without an estimate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeHistory {
    by_model: BTreeMap<String, (u32, f64)>,
}

impl RuntimeHistory {
    /// A job of `model` finished after `hours` of training.
    pub fn record(&mut self, model: &str, hours: f64) {
        if hours.is_finite() && hours > 0.0 {
            let entry = self.by_model.entry(model.to_string()).or_default();
            entry.0 += 1;
            entry.1 += hours;
        }
    }

    /// Mean runtime of finished jobs of `model`.
    pub fn mean_hours(&self, model: &str) -> Option<f64> {
        self.by_model
            .get(model)
            .filter(|(n, _)| *n > 0)
            .map(|(n, total)| total / f64::from(*n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> DecisionInputs {
        DecisionInputs {
            work_hours: 10.0,
            runtime_source: RuntimeSource::Estimate,
            gpus: 8,
            nodes: 1,
            checkpoint_interval_hours: Some(0.5),
            checkpoint_save_hours: 0.02,
            restart_hours: 0.1,
            spot_price_per_gpu_hour: 1.5,
            on_demand_price_per_gpu_hour: 4.0,
            spot_reclaims_per_node_hour: 0.05,
            hours_to_deadline: None,
            spot_interruptions: 0,
            max_spot_interruptions: 3,
            deadline_risk_tolerance: 0.05,
        }
    }

    #[test]
    fn a_checkpointing_job_goes_to_spot_when_rework_costs_less_than_the_discount() {
        let d = decide(&inputs());
        assert_eq!(d.choice, Choice::Spot);
        assert!(d.spot.expected_hours > on_demand_hours(&inputs()));
        assert!(d.spot.expected_cost < d.on_demand.expected_cost);
        assert!(d.reason.starts_with("spot: saves "), "{}", d.reason);
        assert!(d.reason.contains("checkpoint every 0.50 h"), "{}", d.reason);
    }

    #[test]
    fn a_long_job_without_checkpoints_on_a_volatile_pool_stays_on_demand() {
        let mut i = inputs();
        i.checkpoint_interval_hours = None;
        i.work_hours = 40.0;
        i.spot_reclaims_per_node_hour = 0.1;
        i.nodes = 4;
        let d = decide(&i);
        assert_eq!(d.choice, Choice::OnDemand);
        assert!(d.reason.contains("rework costs more"), "{}", d.reason);
    }

    #[test]
    fn without_interruptions_spot_takes_exactly_the_work_and_saves() {
        let mut i = inputs();
        i.spot_reclaims_per_node_hour = 0.0;
        assert!((expected_spot_hours(&i) - on_demand_hours(&i)).abs() < 1e-9);
        assert!((on_demand_hours(&i) - 20.0 * 0.52).abs() < 1e-9);
    }

    #[test]
    fn a_tight_deadline_prefers_the_option_less_likely_to_miss_it() {
        let mut i = inputs();
        i.spot_reclaims_per_node_hour = 0.2;
        i.hours_to_deadline = Some(10.6);
        let d = decide(&i);
        assert_eq!(d.choice, Choice::OnDemand);
        assert_eq!(d.on_demand.miss_probability, Some(0.0));
        assert!(d.spot.miss_probability.expect("risk") > 0.05);
        assert!(d.reason.contains("deadline"), "{}", d.reason);
        i.hours_to_deadline = Some(40.0);
        assert_eq!(decide(&i).choice, Choice::Spot);
    }

    #[test]
    fn a_deadline_with_room_for_a_lost_interval_and_a_restart_keeps_spot_on_a_volatile_pool() {
        // Two reclaims are likely in 10.4 h at 0.2/h, but the choice is made
        // again after each: one costs at most an interval, its save and a
        // restart, which the slack holds, and then on-demand can finish.
        let mut i = inputs();
        i.spot_reclaims_per_node_hour = 0.2;
        i.hours_to_deadline = Some(on_demand_hours(&i) + 0.1 + 0.52 + 0.01);
        let d = decide(&i);
        assert_eq!(d.spot.miss_probability, Some(0.0));
        assert_eq!(d.choice, Choice::Spot, "{}", d.reason);
    }

    #[test]
    fn spot_deadline_risk_counts_only_interruptions_that_leave_on_demand_too_little_time() {
        // Without checkpoints a reclaim loses everything so far: it is fatal
        // once the run is past the slack less the restart (0.9 h of 4 h).
        let mut i = inputs();
        i.checkpoint_interval_hours = None;
        i.work_hours = 4.0;
        i.hours_to_deadline = Some(5.0);
        let lambda: f64 = 0.05;
        let expected = (-lambda * 0.9).exp() - (-lambda * 4.0).exp();
        let risk = decide(&i).spot.miss_probability.expect("risk");
        assert!((risk - expected).abs() < 1e-12, "{risk} vs {expected}");
        // With checkpoints only the part of each interval and save past the
        // slack (0.3 h) less the restart is fatal.
        let mut i = inputs();
        let od = on_demand_hours(&i);
        i.hours_to_deadline = Some(od + 0.1 + 0.3);
        let period = 0.52;
        let mut expected = 0.0;
        let mut start = 0.0;
        while start < od - 1e-9 {
            let end = (start + period).min(od);
            if start + 0.3 < end {
                expected += (-lambda * (start + 0.3)).exp() - (-lambda * end).exp();
            }
            start += period;
        }
        let risk = decide(&i).spot.miss_probability.expect("risk");
        assert!((risk - expected).abs() < 1e-9, "{risk} vs {expected}");
        assert!(risk > 0.0 && risk < 1.0 - (-lambda * od).exp());
    }

    #[test]
    fn repeated_interruptions_move_the_job_to_on_demand() {
        let mut i = inputs();
        i.spot_interruptions = 3;
        let d = decide(&i);
        assert_eq!(d.choice, Choice::OnDemand);
        assert!(d.reason.contains("interrupted 3 times"), "{}", d.reason);
    }

    #[test]
    fn history_averages_runtimes_per_model() {
        let mut h = RuntimeHistory::default();
        assert_eq!(h.mean_hours("bert"), None);
        h.record("bert", 2.0);
        h.record("bert", 4.0);
        h.record("bert", f64::NAN);
        assert_eq!(h.mean_hours("bert"), Some(3.0));
    }
}
