//! Decision core of the cost-optimizer: pure functions and state machines,
//! no I/O, no async, time always passed in.
//!
//! * [`catalog`]: the price catalog (prices per GPU product, location and
//!   capacity type with effective dates, provider discounts, interruption
//!   priors per spot pool), validated on load.
//! * [`interruption`]: the interruption rate per spot pool, the catalog's
//!   prior updated with the reclaims observed.
//! * [`decision`]: spot or on-demand on expected cost to completion, with
//!   the deadline risk of each.
//! * [`accounting`]: GPU-seconds priced at the price in force when spent, per
//!   job, queue and namespace, with idle cluster cost kept apart.
//! * [`budget`]: budgets per period, threshold alerts and the action at the limit.
//! * [`idle`]: idle GPU detection with hysteresis and escalation that never kills.
//! * [`dcgm`]: GPU activity per worker from DCGM exporter series in Prometheus.

pub mod accounting;
pub mod budget;
pub mod catalog;
pub mod dcgm;
pub mod decision;
pub mod error;
pub mod idle;
pub mod interruption;

pub use accounting::{CostLine, Holding, Ledger, LedgerTotals, PricedNode, Running};
pub use budget::{Budget, BudgetEvent, BudgetPeriod, BudgetTracker, LimitAction};
pub use catalog::{CapacityKind, PriceCatalog, PriceKey, SpotAdvisorBucket};
pub use decision::{
    CapacityChoice, Choice, DecisionInputs, OptionEstimate, RuntimeHistory, RuntimeSource, decide,
};
pub use error::CostError;
pub use idle::{IdleAction, IdleDetector, IdlePolicy, WorkerPhase};
pub use interruption::{InterruptionModel, PoolKey};
