//! Why a job waits: the entry a cycle makes for each pending job
//! (`Pending`), its structured reason (`PendingReason`), and the
//! explanation a user reads (`PendingExplanation`: which quota, which
//! flavor, how many GPUs short, position in the queue).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::event::{PodPolicy, PodRequest, PodRequestKind};
use crate::ids::{JobIdx, QueueIdx, ReasonIdx};
use crate::types::{CpuMemory, JobUid, Timestamp, TopologyRequirement, is_zero};

/// Why one pending job waits, as a cycle decided it. The job and its queue
/// are slots in the allocator: a cycle over 10,000 pending jobs then touches
/// no uid or queue name (cloning each job's uid was a cache miss per job,
/// 8 % of a cycle). [`Allocator::explain`](crate::Allocator::explain) gives the full explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub(crate) job: JobIdx,
    /// The job's arrival number: a slot reused by a later job never
    /// resolves to that job.
    pub(crate) seq: u64,
    pub(crate) queue: QueueIdx,
    /// 1-based position in the queue's order this cycle.
    pub position: u32,
    /// Pending jobs in the queue.
    pub queue_length: u32,
    /// Base priority plus aging boost.
    pub effective_priority: i32,
    /// Why it waits: an index into the cycle's table of reasons, shared by
    /// jobs that fail for the same reason. An index rather than a shared
    /// reference: cloning one per pending job was an atomic increment on a
    /// few hot counters, 10,000 times a cycle.
    pub(crate) reason: ReasonIdx,
}

impl Pending {
    /// Its reason's slot in its cycle's [`CycleOutcome::reasons`](crate::CycleOutcome::reasons): jobs
    /// that wait for the same reason share one.
    pub fn reason_index(&self) -> usize {
        self.reason.slot()
    }
}

/// The reason one pending job was not admitted this cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingExplanation {
    /// Job uid.
    pub uid: JobUid,
    /// Queue the job waits in.
    pub queue: Arc<str>,
    /// 1-based position in the queue's order this cycle.
    pub position: u32,
    /// Pending jobs in the queue.
    pub queue_length: u32,
    /// Base priority plus aging boost.
    pub effective_priority: i32,
    /// Why it waits (shared by jobs that fail for the same reason).
    pub reason: Arc<PendingReason>,
}

impl PendingExplanation {
    /// One human-readable line.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for PendingExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "position {} of {} in queue {} (effective priority {}): {}",
            self.position, self.queue_length, self.queue, self.effective_priority, self.reason
        )
    }
}

/// Why a job waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum PendingReason {
    /// The job names a TrainingQueue that does not exist.
    QueueNotFound {
        /// The queue name.
        queue: String,
    },
    /// The queue admits no job now (`stopPolicy: Hold` or `HoldAndDrain`).
    QueueOnHold {
        /// The queue name.
        queue: String,
        /// It also stops its admitted jobs (`HoldAndDrain`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drains: bool,
    },
    /// The queue's budget is spent (TrainingQueue `spec.budget`): it admits
    /// no job until the next period or a raised amount.
    BudgetSpent {
        /// The queue name.
        queue: String,
        /// The spend, as the cost-optimizer reported it.
        spend: String,
        /// Its admitted jobs are checkpointed and stopped too.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drains: bool,
    },
    /// The queue admits jobs of other namespaces only.
    NamespaceNotAdmitted {
        /// The queue name.
        queue: String,
        /// The job's namespace.
        namespace: String,
        /// The namespaces the queue admits.
        admitted: Vec<String>,
    },
    /// The queue's pod policy does not allow something the job's pods ask
    /// for (TrainingQueue `spec.podPolicy`).
    PodPolicyRefused {
        /// The queue name.
        queue: String,
        /// The TrainingJob field asking for it, e.g. `spec.volumes[1].hostPath`.
        field: String,
        /// What the queue does not allow.
        detail: String,
        /// How to get the job admitted.
        fix: String,
    },
    /// No flavor of the queue has quota for what the job asks for.
    NoMatchingFlavor {
        /// What the job asks for, e.g. `nvidia.com/mig with >= 10GB`.
        wants: String,
    },
    /// The queue (or its cohort) has too little quota left.
    QuotaExceeded {
        /// Flavor.
        flavor: String,
        /// Resource.
        resource: String,
        /// Units the job needs.
        requested: u64,
        /// Units the queue could still take.
        available: u64,
        /// The queue's nominal quota.
        nominal: u64,
        /// The queue's current usage.
        used: u64,
        /// Quota is being kept for this job, ahead in line: cohort headroom,
        /// or the queue's own nominal quota.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        held_for: Option<JobUid>,
        /// This job is first in line for the cohort's headroom: what frees
        /// up is kept for it.
        #[serde(default)]
        holding_cohort_quota: bool,
    },
    /// Quota allows it but no set of nodes can host every worker now.
    InsufficientCapacity {
        /// Flavor.
        flavor: String,
        /// Resource.
        resource: String,
        /// Workers in the gang.
        workers: u32,
        /// Units per worker (all on one node).
        units_per_worker: u32,
        /// Workers that would fit now.
        placeable_workers: u32,
        /// Units missing, counted in whole workers; workers that lack only
        /// CPU or memory are not counted.
        units_short: u64,
        /// When the job is expected to start, if it holds a reservation.
        reserved_start: Option<Timestamp>,
        /// Whether the gang fits this flavor at all once it is empty.
        fits_when_empty: bool,
        /// The gang must stay in one zone or rack: the workers counted are
        /// those the roomiest one takes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        required_topology: Option<TopologyRequirement>,
        /// Units of the flavor's schedulable nodes that pods the allocator
        /// does not manage hold: why a cluster that looks idle may have no room.
        #[serde(default, skip_serializing_if = "is_zero")]
        held_by_other_pods: u64,
        /// Workers the free units could host but not the CPU or memory
        /// free beside them.
        #[serde(default, skip_serializing_if = "is_zero")]
        workers_lacking_cpu_memory: u32,
        /// What each worker requests besides GPUs.
        #[serde(default, skip_serializing_if = "CpuMemory::is_zero")]
        cpu_memory_per_worker: CpuMemory,
        /// The job's node selector, node affinity, tolerations or GPU
        /// memory floor narrow the flavor's nodes it may use.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        node_constrained: bool,
    },
    /// Capacity exists but is held for a job ahead in line, and this job's
    /// runtime estimate (if any) ends after that job's reserved start.
    HeldForReservation {
        /// Flavor.
        flavor: String,
        /// Resource.
        resource: String,
        /// The job the capacity is held for.
        reserved_for: JobUid,
        /// Its reserved start.
        until: Timestamp,
    },
    /// No node of any flavor the job may use could hold a worker, or no set
    /// of them the gang, even with every pod gone: waiting does not help.
    /// The job keeps its place in line; a node that could hold it, or a
    /// changed spec, lets it in.
    Unschedulable {
        /// What asks for more than the nodes offer.
        cause: UnschedulableCause,
        /// Flavor whose nodes came closest to holding the job.
        flavor: String,
        /// Resource of that flavor.
        resource: String,
        /// The flavor's node with the most units of `resource` (allocatable,
        /// whatever runs there).
        largest_node: String,
        /// Its units of `resource`.
        largest_node_units: u32,
        /// What does not fit, naming the field, e.g. `spec.gpusPerWorker is
        /// 16 but the largest node (gpu-node-3) has 8 GPUs`.
        detail: String,
        /// How to make the job schedulable, e.g. `lower gpusPerWorker and
        /// raise numWorkers`.
        fix: String,
    },
    /// Victims were told to checkpoint; the job starts when they are evicted.
    AwaitingPreemption {
        /// Victims still running.
        victims: u32,
        /// Eviction deadline.
        evict_at: Timestamp,
    },
}

/// What keeps a job off every node it may use (see
/// [`PendingReason::Unschedulable`]), checked in this order: the first that
/// leaves no node is the cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnschedulableCause {
    /// A worker's GPUs (MIG slices, shared replicas) exceed every node's.
    UnitsPerWorker,
    /// A worker's CPU request exceeds every node's allocatable CPU among
    /// the nodes with units enough.
    CpuPerWorker,
    /// Likewise memory.
    MemoryPerWorker,
    /// The node selector matches none of the nodes that could hold a worker.
    NodeSelector,
    /// The required node affinity matches none of them.
    NodeAffinity,
    /// Each of them has a taint the job does not tolerate.
    Tolerations,
    /// None of them has GPUs with the memory the job asks for.
    GpuMemoryFloor,
    /// The gang must stay on one node, rack or zone, and none holds it.
    Topology,
    /// Each worker needs a node of its own, and there are fewer nodes.
    OneWorkerPerNode,
    /// All the nodes together hold fewer workers than the gang has.
    NumWorkers,
}

impl UnschedulableCause {
    /// The TrainingJob field to change, e.g. `spec.gpusPerWorker`.
    pub fn field(self) -> &'static str {
        match self {
            UnschedulableCause::UnitsPerWorker => "spec.gpusPerWorker",
            UnschedulableCause::CpuPerWorker => "spec.resources.requests.cpu",
            UnschedulableCause::MemoryPerWorker => "spec.resources.requests.memory",
            UnschedulableCause::NodeSelector => "spec.scheduling.nodeSelector",
            UnschedulableCause::NodeAffinity => "spec.scheduling.affinity.nodeAffinity",
            UnschedulableCause::Tolerations => "spec.scheduling.tolerations",
            UnschedulableCause::GpuMemoryFloor => "minGpuMemoryMib",
            UnschedulableCause::Topology => "spec.scheduling.affinity.podAffinity",
            UnschedulableCause::OneWorkerPerNode => "spec.scheduling.affinity.podAntiAffinity",
            UnschedulableCause::NumWorkers => "spec.numWorkers",
        }
    }

    /// Whether not even one worker fits (else the gang as a whole does not).
    pub fn per_worker(self) -> bool {
        !matches!(
            self,
            UnschedulableCause::Topology
                | UnschedulableCause::OneWorkerPerNode
                | UnschedulableCause::NumWorkers
        )
    }
}

impl PendingReason {
    /// Why queue `queue` refuses `request`, and the fix: the reason a job
    /// asking for it waits with.
    pub fn pod_policy_refused(
        policy: &PodPolicy,
        queue: &str,
        request: &PodRequest,
    ) -> PendingReason {
        let field = &request.field;
        let (detail, fix) = match &request.kind {
            PodRequestKind::VolumeType(name) => (
                format!(
                    "TrainingQueue {queue} does not allow {name} volumes (spec.podPolicy.allowedVolumeTypes: {})",
                    listed(&policy.allowed_volume_types)
                ),
                format!(
                    "remove {field}, or name a queue whose podPolicy.allowedVolumeTypes lists {name}"
                ),
            ),
            PodRequestKind::PriorityClass(name) => (
                format!(
                    "TrainingQueue {queue} does not allow PriorityClass {name} (spec.podPolicy.allowedPriorityClasses: {})",
                    listed(
                        policy
                            .allowed_priority_classes
                            .as_deref()
                            .unwrap_or_default()
                    )
                ),
                format!(
                    "name an allowed PriorityClass, remove {field} (the queue's default priority applies), or name a queue that allows {name}"
                ),
            ),
            PodRequestKind::ExtendedResource(name) => (
                format!(
                    "TrainingQueue {queue} does not allow the extended resource {name} (spec.podPolicy.allowedExtendedResources: {})",
                    listed(&policy.allowed_extended_resources)
                ),
                format!(
                    "remove {field}, or name a queue whose podPolicy.allowedExtendedResources lists {name}"
                ),
            ),
            PodRequestKind::UncountedGpuResource(name) => (
                format!("{name} in spec.resources is a GPU resource no queue's quota counts there"),
                format!(
                    "remove {field} and ask with gpusPerWorker (MIG slices: scheduling.migProfile; shared GPUs: scheduling.allowTimeSlicing), which the queue's quota counts"
                ),
            ),
            PodRequestKind::UnsafeSecurityContext(what) => (
                format!(
                    "TrainingQueue {queue} does not allow {what}, beyond the Pod Security Standards' baseline (spec.podPolicy.allowUnsafeSecurityContext is false)"
                ),
                format!(
                    "remove {field}, or name a queue with podPolicy.allowUnsafeSecurityContext: true"
                ),
            ),
        };
        PendingReason::PodPolicyRefused {
            queue: queue.to_owned(),
            field: field.clone(),
            detail,
            fix,
        }
    }

    /// Every [`PendingReason::kind`], for gauges that show each one, zero or not.
    pub const KINDS: [&'static str; 12] = [
        "queue_not_found",
        "queue_on_hold",
        "budget_spent",
        "namespace_not_admitted",
        "pod_policy_refused",
        "no_matching_flavor",
        "quota",
        "capacity",
        "capacity_cpu_memory",
        "held_for_reservation",
        "awaiting_preemption",
        "unschedulable",
    ];

    /// A short, bounded name of the reason, for metric labels. A capacity
    /// reason where CPU or memory keep workers out is its own kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PendingReason::QueueNotFound { .. } => "queue_not_found",
            PendingReason::QueueOnHold { .. } => "queue_on_hold",
            PendingReason::BudgetSpent { .. } => "budget_spent",
            PendingReason::NamespaceNotAdmitted { .. } => "namespace_not_admitted",
            PendingReason::PodPolicyRefused { .. } => "pod_policy_refused",
            PendingReason::NoMatchingFlavor { .. } => "no_matching_flavor",
            PendingReason::QuotaExceeded { .. } => "quota",
            PendingReason::InsufficientCapacity {
                workers_lacking_cpu_memory,
                ..
            } => {
                if *workers_lacking_cpu_memory > 0 {
                    "capacity_cpu_memory"
                } else {
                    "capacity"
                }
            }
            PendingReason::HeldForReservation { .. } => "held_for_reservation",
            PendingReason::AwaitingPreemption { .. } => "awaiting_preemption",
            PendingReason::Unschedulable { .. } => "unschedulable",
        }
    }

    /// Units missing, used to pick the most useful reason across flavors.
    pub fn shortfall(&self) -> u64 {
        match self {
            PendingReason::QuotaExceeded {
                requested,
                available,
                ..
            } => requested.saturating_sub(*available),
            PendingReason::InsufficientCapacity { units_short, .. } => *units_short,
            PendingReason::HeldForReservation { .. } | PendingReason::AwaitingPreemption { .. } => {
                0
            }
            PendingReason::QueueNotFound { .. }
            | PendingReason::QueueOnHold { .. }
            | PendingReason::BudgetSpent { .. }
            | PendingReason::NamespaceNotAdmitted { .. }
            | PendingReason::PodPolicyRefused { .. }
            | PendingReason::NoMatchingFlavor { .. }
            | PendingReason::Unschedulable { .. } => u64::MAX,
        }
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::QueueNotFound { queue } => {
                write!(f, "TrainingQueue {queue} does not exist")
            }
            PendingReason::QueueOnHold { queue, drains } => write!(
                f,
                "TrainingQueue {queue} is on hold (stopPolicy: {}) and admits no job until it \
                 is set back to None",
                if *drains { "HoldAndDrain" } else { "Hold" }
            ),
            PendingReason::BudgetSpent {
                queue,
                spend,
                drains,
            } => write!(
                f,
                "TrainingQueue {queue} has spent its budget ({spend}) and admits no job{}; to lift \
                 the hold raise spec.budget.amount (kubectl patch trainingqueue {queue} --type merge \
                 -p '{{\"spec\":{{\"budget\":{{\"amount\":<new amount>}}}}}}') or wait for the next budget period",
                if *drains {
                    " and its admitted jobs are checkpointed and suspended (action: SuspendWithCheckpoint)"
                } else {
                    " (action: Hold; admitted jobs run on)"
                }
            ),
            PendingReason::NamespaceNotAdmitted {
                queue,
                namespace,
                admitted,
            } => {
                write!(
                    f,
                    "TrainingQueue {queue} admits jobs of namespaces {} only, not {namespace}: \
                     name a queue open to {namespace}, or add it to the queue's spec.namespaces",
                    admitted.join(", ")
                )
            }
            PendingReason::PodPolicyRefused {
                field, detail, fix, ..
            } => write!(f, "{field}: {detail}; {fix}"),
            PendingReason::NoMatchingFlavor { wants } => {
                write!(f, "no flavor of the queue has quota for {wants}")
            }
            PendingReason::QuotaExceeded {
                flavor,
                resource,
                requested,
                available,
                nominal,
                used,
                held_for,
                holding_cohort_quota,
            } => {
                write!(
                    f,
                    "quota: flavor {flavor} {resource}: needs {requested}, queue can take {available} \
                     (nominal {nominal}, in use {used}); {} short",
                    requested.saturating_sub(*available)
                )?;
                if let Some(holder) = held_for {
                    write!(f, "; quota is kept for job {holder}, ahead in line")?;
                }
                if *holding_cohort_quota {
                    write!(
                        f,
                        "; first in line: cohort headroom is kept for this job as it frees up"
                    )?;
                }
                Ok(())
            }
            PendingReason::InsufficientCapacity {
                flavor,
                resource,
                workers,
                units_per_worker,
                placeable_workers,
                units_short,
                reserved_start,
                fits_when_empty,
                required_topology,
                held_by_other_pods,
                workers_lacking_cpu_memory,
                cpu_memory_per_worker,
                node_constrained,
            } => {
                let within = match required_topology {
                    Some(TopologyRequirement::SameZone) => ", all in one zone",
                    Some(TopologyRequirement::SameRack) => ", all in one rack",
                    Some(TopologyRequirement::SameNode) => ", all on the same node",
                    Some(TopologyRequirement::Preferred) | None => "",
                };
                write!(
                    f,
                    "capacity: flavor {flavor}: {workers} worker(s) x {units_per_worker} {resource} \
                     on one node each{within}, {placeable_workers} fit now; {units_short} {resource} short"
                )?;
                if *held_by_other_pods > 0 {
                    write!(
                        f,
                        "; {held_by_other_pods} {resource} of the flavor held by pods Trainyard does not manage"
                    )?;
                }
                if *workers_lacking_cpu_memory > 0 {
                    write!(
                        f,
                        "; {workers_lacking_cpu_memory} more worker(s) would fit by {resource} but not \
                         by the CPU or memory free beside it ({cpu_memory_per_worker} per worker)"
                    )?;
                }
                if !fits_when_empty && *node_constrained {
                    write!(
                        f,
                        "; the gang does not fit the nodes of this flavor its node selector, \
                         affinity, tolerations and GPU memory floor admit, even when they are empty"
                    )?;
                } else if !fits_when_empty {
                    write!(
                        f,
                        "; the gang does not fit this flavor even when it is empty"
                    )?;
                }
                if let Some(start) = reserved_start {
                    write!(f, "; reserved to start by {start}")?;
                }
                Ok(())
            }
            PendingReason::HeldForReservation {
                flavor,
                resource,
                reserved_for,
                until,
            } => write!(
                f,
                "backfill: free {resource} in flavor {flavor} is reserved for job {reserved_for} \
                 starting by {until}; a runtime estimate ending before then would let this job run"
            ),
            PendingReason::AwaitingPreemption { victims, evict_at } => write!(
                f,
                "preempting {victims} job(s) that are checkpointing; starts after eviction at {evict_at}"
            ),
            PendingReason::Unschedulable {
                cause, detail, fix, ..
            } => write!(
                f,
                "{}: {detail}; {fix}",
                if cause.per_worker() {
                    "no node can hold a worker"
                } else {
                    "no set of nodes can hold the gang"
                }
            ),
        }
    }
}

/// A policy list for a message: `none` when empty.
fn listed(entries: &[String]) -> String {
    if entries.is_empty() {
        "none".to_owned()
    } else {
        entries.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_quota_flavor_shortfall_and_position() {
        let e = PendingExplanation {
            uid: JobUid::new("u"),
            queue: "team-a".into(),
            position: 3,
            queue_length: 7,
            effective_priority: 5,
            reason: Arc::new(PendingReason::QuotaExceeded {
                flavor: "a100".into(),
                resource: "nvidia.com/gpu".into(),
                requested: 16,
                available: 4,
                nominal: 8,
                used: 4,
                held_for: None,
                holding_cohort_quota: false,
            }),
        };
        let text = e.message();
        assert!(text.contains("position 3 of 7 in queue team-a"), "{text}");
        assert!(text.contains("flavor a100 nvidia.com/gpu"), "{text}");
        assert!(text.contains("12 short"), "{text}");
    }
}
