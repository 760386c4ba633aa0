//! Pure decision core of the Trainyard GPU allocator.
//!
//! Events in ([`Event`]: nodes, TrainingQueues, jobs, and replays of earlier
//! decisions), decisions out ([`CycleOutcome`]: admissions with concrete
//! per-worker placement, preemptions, evictions, and a reason for every
//! pending job). No I/O, no async, no clocks: the caller passes `now`.
//!
//! ```
//! use gpu_allocator_core::*;
//! let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
//! let mut node = NodeInfo { name: "n1".into(), ready: true, ..NodeInfo::default() };
//! node.allocatable.insert("nvidia.com/gpu".into(), "8".into());
//! node.labels.insert("nvidia.com/gpu.product".into(), "A100".into());
//! alloc.apply(Event::NodeUpserted(node)).expect("node accepted");
//! alloc.apply(Event::QueueUpserted(QueueSpec {
//!     name: "default".into(),
//!     quotas: vec![FlavorQuota {
//!         flavor: "A100.on-demand".into(),
//!         resources: vec![ResourceQuota { resource: "nvidia.com/gpu".into(), nominal: 8, ..ResourceQuota::default() }],
//!     }],
//!     ..QueueSpec::default()
//! })).expect("queue accepted");
//! alloc.apply(Event::JobSubmitted(JobSpec {
//!     uid: JobUid::new("job-1"), num_workers: 2, gpus_per_worker: 4, ..JobSpec::default()
//! })).expect("job accepted");
//! let outcome = alloc.cycle(Timestamp(100));
//! assert_eq!(outcome.admissions.len(), 1);
//! assert_eq!(outcome.admissions[0].workers[0].node, "n1");
//! ```

mod allocator;
mod config;
mod cycle;
mod decision;
mod error;
mod event;
mod explain;
mod ids;
mod memo;
mod pending;
mod snapshot;
mod state;
#[cfg(test)]
mod testing;
mod types;
mod usage;

pub use allocator::{Allocator, AllocatorStats};
pub use config::{AgingPolicy, AllocatorConfig, BackfillPolicy, FlavorSpec, PreemptionPolicy};
pub use decision::{
    Admission, CycleOutcome, CycleStats, Drain, Eviction, EvictionReason, PlannedNode, Preemption,
    PreemptionRule, TopologyAssignment, Victim, WorkerPlacement,
};
pub use error::AllocatorError;
pub use event::{
    Applied, BudgetHold, Event, FlavorQuota, JobSpec, MAX_UNITS_PER_WORKER, MAX_WORKERS, NodeInfo,
    PodPolicy, PodRequest, PodRequestKind, QueuePreemption, QueueSpec, ResourceQuota,
};
pub use pending::{Pending, PendingExplanation, PendingReason, UnschedulableCause};
pub use snapshot::{AllocatorSnapshot, JobSnapshot, SNAPSHOT_FORMAT_VERSION};
pub use state::inventory::{InternOrder, MAX_NODE_UNITS};
pub use state::jobs::{Nomination, PreemptingState};
pub use types::{
    CapacityType, CpuMemory, GpuSliceRequest, JobUid, MigProfile, NodeKey, NodeOperator,
    NodeRequirement, NodeSelectorTerm, ResourceKind, Taint, TaintEffect, Timestamp, Toleration,
    TolerationOperator, TopologyRequirement, names,
};
pub use usage::{QueueUsage, ResourceUsage};
