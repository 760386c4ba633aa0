//! The job arena's records: a job's spec, its place in the queue table, and
//! whether it waits (perhaps as a preemptor with a nomination) or runs
//! (where, since when, perhaps as a preemption victim); and `Gang`, what a
//! job asks of the nodes it is placed on.

use serde::{Deserialize, Serialize};

use crate::decision::{Admission, PlannedNode, PreemptionRule};
use crate::event::JobSpec;
use crate::ids::{FilterIdx, NodeIdx, QueueIdx, ResourceIdx};
use crate::types::{CpuMemory, JobUid, Timestamp, TopologyRequirement};

/// A victim that is checkpointing before eviction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptingState {
    /// The preemptor; none when its queue drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<JobUid>,
    /// Rule that allowed the preemption.
    pub rule: PreemptionRule,
    /// Eviction deadline.
    pub evict_at: Timestamp,
    /// The victim reported its checkpoint, so it can go before the deadline.
    pub checkpointed: bool,
}

/// A preemptor waiting for its victims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nomination {
    /// Victims that must be gone before the preemptor starts.
    pub victims: Vec<JobUid>,
    /// Eviction deadline.
    pub evict_at: Timestamp,
    /// Flavor the plan is for.
    pub flavor: String,
    /// Resource the plan is for.
    pub resource: String,
    /// Planned nodes; held for the preemptor meanwhile.
    pub nodes: Vec<PlannedNode>,
}

#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) res: ResourceIdx,
    pub(crate) per_worker: u32,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
    pub(crate) admitted_at: Timestamp,
    /// The cycle that admitted it (`Allocator::cycles` then); a replayed
    /// admission gets the last cycle's, so it is never taken for one of
    /// the next cycle's.
    pub(crate) cycle: u64,
    pub(crate) admission: Admission,
    pub(crate) preempting: Option<PreemptingState>,
}

#[derive(Debug)]
pub(crate) enum JobState {
    // The nomination boxed too: a pending job is read by every cycle, a
    // nomination by few.
    Pending(Option<Box<Nomination>>),
    // Boxed: pending jobs (the many) stay small and cache-friendly.
    Running(Box<Running>),
}

/// In this order (`repr(C)`): what a cycle reads of every job it
/// evaluates comes first, then the spec, whose own order does the same
/// (see `JobSpec`). A full evaluation starts with a job nothing has touched
/// for a cycle, so each cache line it needs is a miss; the compiler's order
/// spread those fields over four or five of its cache lines.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Job {
    pub(crate) state: JobState,
    pub(crate) queue: QueueIdx,
    pub(crate) filter: FilterIdx,
    /// Arrival order, the last tie-breaker after priority and submission
    /// time (cheaper than comparing uids, and the same after a replay).
    pub(crate) seq: u64,
    pub(crate) spec: JobSpec,
    pub(crate) requeues: u32,
    /// Last job that preempted this one, or an earlier attempt of it
    /// (`JobSpec::last_preemptor`): never chosen as this job's victim (the
    /// explicit half of the no-loop guarantee).
    pub(crate) preempted_by: Option<JobUid>,
    /// A victim search that found nothing is not repeated before this time
    /// (see the preemption pass): searches are the costliest part of a cycle.
    pub(crate) preemption_retry_after: Timestamp,
    /// Consecutive fruitless victim searches.
    pub(crate) preemption_failures: u32,
}

impl Job {
    pub(crate) fn running(&self) -> Option<&Running> {
        match &self.state {
            JobState::Running(r) => Some(r.as_ref()),
            JobState::Pending(_) => None,
        }
    }

    /// Restarts before its current run: those of earlier attempts and this
    /// allocator's own requeues.
    pub(crate) fn restarts(&self) -> u32 {
        self.spec.earlier_restarts.saturating_add(self.requeues)
    }
}

/// What a gang asks of the nodes it is placed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Gang {
    pub(crate) per_worker: u32,
    pub(crate) workers: u32,
    pub(crate) topology: TopologyRequirement,
    pub(crate) one_per_node: bool,
    /// What each worker requests besides GPUs (see `Node::usable_units`).
    pub(crate) cpu_memory: CpuMemory,
}

impl Gang {
    pub(crate) fn of(spec: &JobSpec) -> Self {
        Gang {
            per_worker: spec.gpus_per_worker,
            workers: spec.num_workers,
            topology: spec.topology,
            one_per_node: spec.one_worker_per_node,
            cpu_memory: spec.cpu_memory_per_worker,
        }
    }

    /// Workers of this gang a node with `units` usable units can host.
    pub(crate) fn slots(self, units: u32) -> u64 {
        let slots = u64::from(units / self.per_worker.max(1));
        if self.one_per_node {
            slots.min(1)
        } else {
            slots
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_evaluation_reads_of_a_job_fits_in_two_cache_lines() {
        use std::mem::{offset_of, size_of};
        // The job's state, queue, filter and arrival, then the spec's
        // scalars and MIG request, in one stretch at the front.
        let spec = offset_of!(Job, spec);
        let hot_end = spec
            + offset_of!(JobSpec, gpu_slice)
            + size_of::<Option<crate::types::GpuSliceRequest>>();
        assert!(hot_end <= 128, "hot fields end at byte {hot_end}");
        for offset in [
            offset_of!(Job, state),
            offset_of!(Job, queue),
            offset_of!(Job, filter),
            offset_of!(Job, seq),
            spec + offset_of!(JobSpec, submitted_at),
            spec + offset_of!(JobSpec, runtime_estimate_secs),
            spec + offset_of!(JobSpec, priority),
            spec + offset_of!(JobSpec, num_workers),
            spec + offset_of!(JobSpec, gpus_per_worker),
            spec + offset_of!(JobSpec, allow_gpu_sharing),
            spec + offset_of!(JobSpec, preemptible),
            spec + offset_of!(JobSpec, topology),
        ] {
            assert!(offset < hot_end, "a hot field at byte {offset}");
        }
        // The names come after.
        assert!(spec + offset_of!(JobSpec, uid) >= hot_end);
        assert!(spec + offset_of!(JobSpec, name) >= hot_end);
    }
}
