//! The cost-optimizer's decisions as the planner keeps and shows them: a
//! job's spend and capacity choice (`status.cost`), the request to suspend an
//! idle job, and a TrainingQueue's budget (`status.budget`). Pure.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_api::{BudgetStatus, CostStatus, QueueBudget, TrainingQueueStatus};
use trainyard_contracts::cost::{
    BudgetState, BudgetStatusReported, CapacityChosen, CostRecorded, IdleSuspendRequested,
};
use trainyard_contracts::decisions::CheckpointVerified;

use crate::state::{Observed, PlannerJobState};

/// What a job has cost, folded from `cost.recorded` and `cost.capacity`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CostSeen {
    pub currency: String,
    /// The job's cost so far, as the newest record says.
    pub accrued: f64,
    /// Accrued plus the expected cost of the work left, when known.
    pub estimated: Option<f64>,
    /// GPU-seconds of every interval counted.
    pub gpu_seconds: f64,
    /// End of the newest interval counted: a redelivered or older record
    /// adds nothing, so GPU-seconds are never counted twice.
    pub counted_until: Option<DateTime<Utc>>,
    /// The capacity type chosen and why.
    pub capacity_type: Option<String>,
    pub decision: Option<String>,
    /// Capacity types of the nodes the newest record with GPU-hours charged.
    #[serde(default)]
    pub node_capacity_types: Vec<String>,
}

/// The cost-optimizer's request to suspend the job for idle GPUs, and the
/// checkpoint that allows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleSuspendSeen {
    pub request: IdleSuspendRequested,
    /// When the request arrived: the checkpoint request's time.
    pub at: DateTime<Utc>,
    /// Step of the newest checkpoint known when the request arrived; the
    /// checkpoint the suspension waits for is a later one.
    pub checkpoint_step_before: Option<u64>,
    /// The checkpoint written after the request and verified by the
    /// checkpoint-manager, and when the verification arrived: the job may
    /// be suspended if that was before the request's deadline.
    pub verified_checkpoint: Option<(String, DateTime<Utc>)>,
}

/// Rounds money to 1/10,000 of the currency unit and GPU-seconds to whole
/// seconds: finer figures would change the status on every record for
/// nothing anyone reads.
fn round_money(value: f64) -> f64 {
    (value * 10_000.0).round() / 10_000.0
}

impl PlannerJobState {
    pub(crate) fn observe_capacity(&mut self, chosen: CapacityChosen) -> Observed {
        let cost = self.cost.get_or_insert_with(CostSeen::default);
        if cost.currency.is_empty() {
            cost.currency = chosen.currency;
        }
        cost.capacity_type = Some(chosen.capacity_type.as_str().to_owned());
        cost.decision = Some(chosen.reason);
        Observed::Recorded
    }

    pub(crate) fn observe_cost(&mut self, record: CostRecorded) -> Observed {
        let cost = self.cost.get_or_insert_with(CostSeen::default);
        if cost
            .counted_until
            .is_some_and(|until| record.period_end <= until)
        {
            return Observed::NotApplicable;
        }
        let charged: std::collections::BTreeSet<&str> = record
            .lines
            .iter()
            .filter(|line| line.gpu_hours > 0.0)
            .map(|line| line.capacity_type.as_str())
            .collect();
        if !charged.is_empty() {
            cost.node_capacity_types = charged.into_iter().map(str::to_owned).collect();
        }
        let gpu_hours: f64 = record
            .lines
            .iter()
            .map(|line| line.gpu_hours)
            .filter(|hours| hours.is_finite() && *hours > 0.0)
            .sum();
        cost.gpu_seconds += gpu_hours * 3600.0;
        if record.accrued_cost.is_finite() {
            cost.accrued = record.accrued_cost;
        }
        cost.estimated = record.estimated_cost.filter(|e| e.is_finite());
        cost.currency = record.currency;
        cost.counted_until = Some(record.period_end);
        Observed::Recorded
    }

    pub(crate) fn observe_idle_suspend(
        &mut self,
        request: IdleSuspendRequested,
        at: DateTime<Utc>,
    ) -> Observed {
        let current = self.current.attempt;
        if request.attempt < current {
            return Observed::StaleAttempt {
                attempt: request.attempt,
                current,
            };
        }
        if request.attempt > current {
            return Observed::FutureAttempt {
                attempt: request.attempt,
                current,
            };
        }
        if !self.current.ever_started {
            return Observed::NotApplicable;
        }
        if self
            .idle_suspend
            .as_ref()
            .is_some_and(|seen| seen.request.attempt == current)
        {
            // The first request's checkpoint stands.
            return Observed::Recorded;
        }
        let verified_step = self
            .checkpoint_summary
            .as_ref()
            .and_then(|s| s.latest_verified.as_ref())
            .map(|c| c.step);
        let reported_step = self.latest_checkpoint.as_ref().map(|c| c.step);
        self.idle_suspend = Some(IdleSuspendSeen {
            request,
            at,
            checkpoint_step_before: verified_step.max(reported_step),
            verified_checkpoint: None,
        });
        Observed::Recorded
    }

    /// A checkpoint verified after an idle suspension was requested, newer
    /// than every checkpoint known then, allows the suspension.
    pub(crate) fn note_verified_for_idle_suspend(
        &mut self,
        verified: &CheckpointVerified,
        at: DateTime<Utc>,
    ) {
        let Some(idle) = self.idle_suspend.as_mut() else {
            return;
        };
        let newer = idle
            .checkpoint_step_before
            .is_none_or(|before| verified.step > before);
        if idle.verified_checkpoint.is_none() && verified.verified && at >= idle.at && newer {
            idle.verified_checkpoint = Some((verified.uri.clone(), at));
        }
    }
}

/// `status.cost` from what the cost-optimizer reported; None before its first report.
pub fn cost_status(state: &PlannerJobState) -> Option<CostStatus> {
    let cost = state.cost.as_ref()?;
    Some(CostStatus {
        accrued: round_money(cost.accrued),
        estimated: cost.estimated.map(round_money),
        currency: cost.currency.clone(),
        gpu_seconds: cost.gpu_seconds.round(),
        capacity_type: cost.capacity_type.clone(),
        decision: cost.decision.clone(),
        either_capacity_type: cost.capacity_type.is_some()
            && state
                .current
                .admission
                .as_ref()
                .is_some_and(|a| a.capacity_type_reopened),
        node_capacity_types: cost.node_capacity_types.clone(),
    })
}

fn state_name(state: BudgetState) -> &'static str {
    match state {
        BudgetState::Open => "Open",
        BudgetState::Held => "Held",
        BudgetState::Suspended => "Suspended",
    }
}

/// How to lift a spent budget of `queue`: what a Held or Suspended queue's
/// status and its jobs' Admitted conditions say.
pub fn budget_lift_hint(queue: &str) -> String {
    format!(
        "raise spec.budget.amount (kubectl patch trainingqueue {queue} --type merge -p '{{\"spec\":{{\"budget\":{{\"amount\":<new amount>}}}}}}') or wait for the next budget period"
    )
}

/// The queue's status with `status.budget` from the cost-optimizer's report;
/// everything else as `previous` has it. `budget` is the queue's
/// `spec.budget`, whose thresholds the spend is measured against.
pub fn budget_status(
    queue: &str,
    report: &BudgetStatusReported,
    budget: Option<&QueueBudget>,
    previous: Option<&TrainingQueueStatus>,
) -> TrainingQueueStatus {
    let thresholds_crossed = budget.map_or_else(Vec::new, |b| {
        let mut crossed: Vec<u32> = b
            .thresholds_percent
            .iter()
            .copied()
            .filter(|t| {
                report.amount > 0.0 && report.spent * 100.0 >= report.amount * f64::from(*t)
            })
            .collect();
        crossed.sort_unstable();
        crossed.dedup();
        crossed
    });
    let consequence = match report.state {
        BudgetState::Open => String::new(),
        BudgetState::Held => format!(
            "; no new job of the queue is admitted, running jobs go on; to lift: {}",
            budget_lift_hint(queue)
        ),
        BudgetState::Suspended => format!(
            "; no new job of the queue is admitted and its running jobs are checkpointed and suspended; to lift: {}",
            budget_lift_hint(queue)
        ),
    };
    let mut status = previous.cloned().unwrap_or_default();
    status.budget = Some(BudgetStatus {
        period_start: report.period_start.to_rfc3339(),
        spent: round_money(report.spent),
        amount: report.amount,
        currency: report.currency.clone(),
        state: state_name(report.state).to_owned(),
        thresholds_crossed,
        message: Some(format!("{}{consequence}", report.message)),
    });
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::{BudgetAction, BudgetPeriod};
    use trainyard_contracts::cost::{CapacityInputs, CapacityType, CostLine};

    fn at(minute: u32) -> DateTime<Utc> {
        DateTime::from_timestamp(1_795_000_000 + i64::from(minute) * 60, 0).unwrap_or_default()
    }

    fn record(minute: u32, gpu_hours: f64, accrued: f64) -> CostRecorded {
        CostRecorded {
            queue: "team-a".into(),
            period_start: at(minute.saturating_sub(1)),
            period_end: at(minute),
            currency: "USD".into(),
            lines: vec![CostLine {
                node: "gpu-node-1".into(),
                capacity_type: "spot".into(),
                gpu_hours,
                price_per_gpu_hour: 1.5,
                cost: gpu_hours * 1.5,
            }],
            accrued_cost: accrued,
            estimated_cost: Some(20.0),
        }
    }

    #[test]
    fn cost_records_accumulate_gpu_seconds_once_per_interval() {
        let mut state = PlannerJobState::new();
        assert_eq!(cost_status(&state), None, "nothing before the first record");
        assert_eq!(
            state.observe_cost(record(1, 4.0 / 60.0, 0.1)),
            Observed::Recorded
        );
        assert_eq!(
            state.observe_cost(record(2, 4.0 / 60.0, 0.2)),
            Observed::Recorded
        );
        // A redelivery of the first interval changes nothing.
        assert_eq!(
            state.observe_cost(record(1, 4.0 / 60.0, 0.1)),
            Observed::NotApplicable
        );
        let status = cost_status(&state).expect("a cost status");
        assert_eq!(status.gpu_seconds, 480.0);
        assert_eq!(status.accrued, 0.2);
        assert_eq!(status.estimated, Some(20.0));
        assert_eq!(status.currency, "USD");
    }

    #[test]
    fn the_capacity_choice_and_its_explanation_reach_the_status() {
        let mut state = PlannerJobState::new();
        state.observe_capacity(spot_chosen());
        let status = cost_status(&state).expect("a cost status");
        assert_eq!(status.capacity_type.as_deref(), Some("spot"));
        assert_eq!(status.decision.as_deref(), Some("spot: saves 57%"));
        assert_eq!(status.accrued, 0.0);
        assert!(!status.either_capacity_type);
        assert!(status.node_capacity_types.is_empty());
    }

    fn spot_chosen() -> CapacityChosen {
        CapacityChosen {
            capacity_type: CapacityType::Spot,
            reason: "spot: saves 57%".into(),
            currency: "USD".into(),
            spot_expected_cost: 20.5,
            on_demand_expected_cost: 41.6,
            expected_cost: 20.5,
            spot_miss_probability: None,
            on_demand_miss_probability: None,
            inputs: CapacityInputs {
                work_hours: 10.0,
                runtime_source: "estimate".into(),
                gpus: 4,
                nodes: 1,
                checkpoint_interval_seconds: None,
                checkpoint_save_seconds: 60.0,
                restart_seconds: 360.0,
                spot_price_per_gpu_hour: 0.48,
                on_demand_price_per_gpu_hour: 1.0,
                spot_reclaims_per_node_hour: 0.05,
                pool: "A100@us-east-1a".into(),
                deadline: None,
                spot_interruptions: 0,
            },
        }
    }

    #[test]
    fn a_choice_no_node_of_its_type_can_hold_shows_with_the_nodes_the_job_runs_on() {
        let mut state = PlannerJobState::new();
        state.observe_capacity(spot_chosen());
        state.current.admission = Some(trainyard_contracts::decisions::AdmissionDecided {
            attempt: 0,
            queue: "team-a".into(),
            flavor: "a100".into(),
            node_selector: Default::default(),
            tolerations: Vec::new(),
            placements: Vec::new(),
            topology: Default::default(),
            capacity_type_reopened: true,
        });
        let mut on_demand = record(1, 4.0 / 60.0, 0.3);
        on_demand.lines[0].capacity_type = "on-demand".into();
        state.observe_cost(on_demand);
        // A record of a stretch without GPU-hours keeps the nodes known.
        state.observe_cost(record(2, 0.0, 0.3));
        let status = cost_status(&state).expect("a cost status");
        assert_eq!(status.capacity_type.as_deref(), Some("spot"));
        assert!(status.either_capacity_type);
        assert_eq!(status.node_capacity_types, ["on-demand"]);
    }

    fn report(state: BudgetState, spent: f64) -> BudgetStatusReported {
        BudgetStatusReported {
            state,
            period_start: at(0),
            spent,
            amount: 1000.0,
            currency: "USD".into(),
            message: format!("{}% of the Monthly budget spent", spent / 10.0),
        }
    }

    fn budget() -> QueueBudget {
        QueueBudget {
            amount: 1000.0,
            period: BudgetPeriod::Monthly,
            thresholds_percent: vec![100, 50, 80],
            action: Some(BudgetAction::Hold),
        }
    }

    #[test]
    fn a_queue_budget_names_the_thresholds_crossed_and_keeps_the_rest_of_the_status() {
        let previous = TrainingQueueStatus {
            pending: 3,
            admitted: 2,
            ..TrainingQueueStatus::default()
        };
        let status = budget_status(
            "team-a",
            &report(BudgetState::Open, 810.0),
            Some(&budget()),
            Some(&previous),
        );
        assert_eq!((status.pending, status.admitted), (3, 2));
        let written = status.budget.expect("budget");
        assert_eq!(written.thresholds_crossed, vec![50, 80]);
        assert_eq!(written.state, "Open");
        assert_eq!(written.spent, 810.0);
        assert_eq!(
            written.message.as_deref(),
            Some("81% of the Monthly budget spent")
        );
    }

    #[test]
    fn a_held_budget_says_how_to_lift_it() {
        let status = budget_status(
            "team-a",
            &report(BudgetState::Held, 1010.0),
            Some(&budget()),
            None,
        );
        let written = status.budget.expect("budget");
        assert_eq!(written.state, "Held");
        assert_eq!(written.thresholds_crossed, vec![50, 80, 100]);
        let message = written.message.expect("message");
        assert!(
            message.contains("no new job of the queue is admitted"),
            "{message}"
        );
        assert!(
            message.contains("kubectl patch trainingqueue team-a"),
            "{message}"
        );
    }
}
