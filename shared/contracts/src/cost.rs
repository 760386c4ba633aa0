//! The cost-optimizer's messages: capacity decisions with their inputs and
//! the suspension of idle jobs (decisions family), cost records, budget
//! status per TrainingQueue, and the GPU utilisation workers report (worker
//! family). Its budget and idle alerts are the alerts family's
//! (`crate::alerts`), which the notifier delivers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::subject::Family;

/// Spot or on-demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    Spot,
    OnDemand,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
        }
    }
}

/// What a capacity choice was computed from, so it can be checked by hand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityInputs {
    /// Hours of work left.
    pub work_hours: f64,
    /// `estimate` (`scheduling.estimatedRuntimeSeconds`), `history` (similar
    /// jobs) or `default`.
    pub runtime_source: String,
    pub gpus: u32,
    pub nodes: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_seconds: Option<f64>,
    pub checkpoint_save_seconds: f64,
    pub restart_seconds: f64,
    pub spot_price_per_gpu_hour: f64,
    pub on_demand_price_per_gpu_hour: f64,
    /// The spot pool's interruption rate: the catalog's prior updated with
    /// the reclaims observed.
    pub spot_reclaims_per_node_hour: f64,
    /// `<gpu product>@<zone or region>`.
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    pub spot_interruptions: u32,
}

/// The capacity type the job runs on: the gpu-allocator admits it on nodes of
/// that type only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityChosen {
    pub capacity_type: CapacityType,
    /// Why, with both options' expected cost: written into the job's status.
    pub reason: String,
    pub currency: String,
    pub spot_expected_cost: f64,
    pub on_demand_expected_cost: f64,
    /// Expected cost of finishing on the chosen type.
    pub expected_cost: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_miss_probability: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand_miss_probability: Option<f64>,
    pub inputs: CapacityInputs,
}

/// Money a job spent over a period, at the prices in force then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CostRecorded {
    pub queue: String,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub currency: String,
    /// One line per node and price in force.
    pub lines: Vec<CostLine>,
    /// The job's cost so far, this period included.
    pub accrued_cost: f64,
    /// Accrued plus the expected cost of the work left, when it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cost: Option<f64>,
}

/// GPU-hours on one node at one price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CostLine {
    pub node: String,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: String,
    pub gpu_hours: f64,
    pub price_per_gpu_hour: f64,
    pub cost: f64,
}

/// What the budget means for a TrainingQueue's admissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum BudgetState {
    /// Under the limit.
    Open,
    /// At the limit, action `Hold`: new admissions wait, running jobs go on.
    Held,
    /// At the limit, action `SuspendWithCheckpoint`: running jobs are
    /// checkpointed and suspended, new admissions wait.
    Suspended,
}

/// A TrainingQueue's spend in its current budget period. The entity is the
/// queue (cluster-scoped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatusReported {
    pub state: BudgetState,
    pub period_start: DateTime<Utc>,
    pub spent: f64,
    pub amount: f64,
    pub currency: String,
    pub message: String,
}

/// The cost-optimizer found the entity job idle long enough to suspend it:
/// the planner checkpoints it, verifies the checkpoint and suspends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleSuspendRequested {
    pub attempt: u32,
    pub idle_since: DateTime<Utc>,
    /// Mean GPU utilisation (0..1) over the idle stretch.
    pub utilization: f64,
    /// For the TrainingJob's status, e.g. "GPUs idle (2% < 5%) since 10:02".
    pub message: String,
}

/// What a worker is doing, for idle detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WorkerPhase {
    Starting,
    LoadingData,
    Training,
    Checkpointing,
}

/// GPU utilisation of one worker (NVML on the worker, or the exporter).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UtilizationReported {
    pub worker_index: u32,
    #[serde(default)]
    pub attempt: u32,
    /// Mean over the worker's GPUs, 0..1.
    pub gpu_utilization: f64,
    pub phase: WorkerPhase,
}

crate::payload!(
    CapacityChosen,
    "cost.capacity",
    1,
    Family::Decisions,
    "capacity"
);
crate::payload!(CostRecorded, "cost.recorded", 1, Family::Decisions, "cost");
crate::payload!(
    BudgetStatusReported,
    "cost.budget",
    1,
    Family::Decisions,
    "budget"
);
crate::payload!(
    IdleSuspendRequested,
    "cost.idlesuspend",
    1,
    Family::Decisions,
    "idlesuspend"
);
crate::payload!(
    UtilizationReported,
    "worker.utilization",
    1,
    Family::Worker,
    "utilization"
);
