//! Outputs: the decisions a cycle produces. Each one can be fed back as an
//! event (`Event::Admitted`, `Event::PreemptionStarted`, `Event::Evicted`) to
//! rebuild state after a restart; replaying one that is already applied is a
//! no-op.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::pending::{Pending, PendingReason};
use crate::types::{CapacityType, JobUid, Timestamp, Toleration};

/// A job admitted with a concrete placement for every worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// Job uid.
    pub uid: JobUid,
    /// Job namespace.
    pub namespace: String,
    /// Job name.
    pub name: String,
    /// Queue whose quota the job uses.
    pub queue: String,
    /// Flavor the job was admitted to.
    pub flavor: String,
    /// Quota resource charged (`nvidia.com/gpu`, `nvidia.com/gpu.shared`,
    /// `nvidia.com/mig-<profile>`).
    pub resource: String,
    /// Units of `resource` per worker.
    pub units_per_worker: u32,
    /// Capacity type of the flavor, when known.
    pub capacity_type: Option<CapacityType>,
    /// One entry per worker, in worker-index order.
    pub workers: Vec<WorkerPlacement>,
    /// Tolerations the planner injects (the flavor's).
    pub tolerations: Vec<Toleration>,
    /// Topology the placement achieved.
    pub topology: TopologyAssignment,
    /// Time of the decision.
    pub admitted_at: Timestamp,
    /// Part of the job runs on quota borrowed from the cohort, so it can be
    /// reclaimed.
    pub borrowing: bool,
    /// The job started ahead of this blocked job without delaying its
    /// reserved start (backfill).
    pub backfilled_ahead_of: Option<JobUid>,
}

impl Admission {
    /// Total units the admission holds.
    pub fn total_units(&self) -> u64 {
        self.workers.len() as u64 * u64::from(self.units_per_worker)
    }
}

/// Where one worker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPlacement {
    /// Worker index (the Indexed Job completion index).
    pub index: u32,
    /// Node name.
    pub node: String,
    /// Node selector to inject: `kubernetes.io/hostname` plus the flavor labels.
    pub node_selector: BTreeMap<String, String>,
    /// Resource name the worker's container requests (time-sliced nodes may
    /// advertise `nvidia.com/gpu` or `nvidia.com/gpu.shared`).
    pub request_resource: String,
}

/// Topology of an admitted gang, for the planner to record or constrain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct TopologyAssignment {
    /// Zone shared by all workers, if any.
    pub zone: Option<String>,
    /// Rack / NVLink domain shared by all workers, if any.
    pub rack: Option<String>,
    /// Label key of the rack domain.
    pub rack_label: String,
    /// Distinct nodes used.
    pub nodes: u32,
}

/// Which rule allowed a victim to be preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PreemptionRule {
    /// Same queue, strictly lower base priority.
    LowerPriority,
    /// The preemptor's queue takes back nominal quota the victim's queue borrowed.
    ReclaimQuota,
    /// Both queues borrow; the victim's queue keeps the larger fair share.
    FairShare,
    /// The victim's queue drains (TrainingQueue `stopPolicy: HoldAndDrain`).
    Drain,
}

/// A victim of a preemption: first told to checkpoint, evicted after the grace period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Victim {
    /// Job uid.
    pub uid: JobUid,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Queue of the victim.
    pub queue: String,
    /// Units it frees.
    pub units: u64,
    /// Rule that allowed it.
    pub rule: PreemptionRule,
}

/// A preemption: the preemptor waits while victims checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preemption {
    /// Job that needs the capacity.
    pub preemptor: JobUid,
    /// Whole gangs to stop; each gets a checkpoint-now request.
    pub victims: Vec<Victim>,
    /// Flavor the preemptor will run in.
    pub flavor: String,
    /// Quota resource the preemptor will use.
    pub resource: String,
    /// Nodes the preemptor is planned on; held for it until the eviction.
    pub planned_nodes: Vec<PlannedNode>,
    /// Time of the decision.
    pub decided_at: Timestamp,
    /// Eviction deadline (decision time plus the grace period).
    pub evict_at: Timestamp,
}

/// A queue set to drain: its admitted jobs checkpoint now and are evicted
/// after the grace period, then wait in its line while it is held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Drain {
    /// The queue.
    pub queue: String,
    /// Its admitted jobs not already being preempted, rule `Drain`.
    pub victims: Vec<Victim>,
    /// Time of the decision.
    pub decided_at: Timestamp,
    /// Eviction deadline (decision time plus the grace period).
    pub evict_at: Timestamp,
}

/// Workers planned on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedNode {
    /// Node name.
    pub node: String,
    /// Workers on it.
    pub workers: u32,
}

/// Why a running job is stopped and requeued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "cause")]
pub enum EvictionReason {
    /// Preempted; the grace period ended or the checkpoint was reported.
    Preempted {
        /// The preemptor.
        by: JobUid,
    },
    /// Its queue drains; the grace period ended or the checkpoint was reported.
    Drained {
        /// The queue.
        queue: String,
    },
    /// A node hosting a worker disappeared, so the gang is broken.
    NodeLost {
        /// The node.
        node: String,
    },
}

/// A running job to stop (delete pods, suspend); it is pending again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    /// Job uid.
    pub uid: JobUid,
    /// Why.
    pub reason: EvictionReason,
    /// Time of the decision.
    pub at: Timestamp,
}

/// Counters of one cycle, for metrics and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CycleStats {
    /// Pending jobs looked at.
    pub considered: u32,
    /// Jobs admitted.
    pub admitted: u32,
    /// Of those, admitted ahead of a reserved job.
    pub backfilled: u32,
    /// Reservations made for blocked jobs.
    pub reservations: u32,
    /// Jobs answered from a per-cycle failure memo (placement, or quota on
    /// every option) instead of being checked again.
    pub memo_hits: u32,
    /// Pending jobs examined for preemption.
    pub preemption_attempts: u32,
}

/// Everything one cycle decided. Not a wire format: its pending entries
/// name slots of the allocator that produced it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CycleOutcome {
    /// Cycle time.
    pub now: Timestamp,
    /// Jobs to unsuspend with the given placement.
    pub admissions: Vec<Admission>,
    /// Preemptions started this cycle (victims must checkpoint now).
    pub preemptions: Vec<Preemption>,
    /// Drains started this cycle (victims must checkpoint now).
    pub drains: Vec<Drain>,
    /// Jobs to stop now.
    pub evictions: Vec<Eviction>,
    /// Why every still-pending job waits ([`crate::Allocator::explain`]
    /// gives each one's uid, queue name and sentence).
    pub pending: Vec<Pending>,
    /// Each distinct reason of this cycle once; pending entries name theirs
    /// by index.
    pub(crate) reasons: Vec<Arc<PendingReason>>,
    /// Counters.
    pub stats: CycleStats,
}

impl CycleOutcome {
    /// Each distinct reason of this cycle once, in the order of
    /// [`Pending::reason_index`].
    pub fn reasons(&self) -> &[Arc<PendingReason>] {
        &self.reasons
    }
}
