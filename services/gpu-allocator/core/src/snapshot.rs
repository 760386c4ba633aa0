//! Snapshots: the whole allocator state as serde data for a key-value
//! store, restored through the same validated paths as live events.

use serde::{Deserialize, Serialize};

use crate::config::AllocatorConfig;
use crate::decision::{Admission, Eviction};
use crate::error::AllocatorError;
use crate::event::{JobSpec, NodeInfo, QueueSpec};
use crate::ids::NodeIdx;
use crate::state::inventory::InternOrder;
use crate::state::jobs::{Job, JobState, Nomination, PreemptingState};
use crate::types::{JobUid, Timestamp};

use crate::allocator::Allocator;

/// Version of the snapshot format.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// Serializable allocator state. Restoring it re-applies each part through
/// the same validated paths as live events, so a tampered snapshot yields an
/// error rather than an inconsistent allocator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorSnapshot {
    /// Format version.
    pub format_version: u32,
    /// Configuration.
    pub config: AllocatorConfig,
    /// Time of the last cycle.
    pub clock: Timestamp,
    /// Node arena in slot order (`None` for free slots).
    pub nodes: Vec<Option<NodeInfo>>,
    /// Free node slots, in reuse order.
    pub free_node_slots: Vec<u32>,
    /// Queues that exist.
    pub queues: Vec<QueueSpec>,
    /// Jobs, sorted by uid.
    pub jobs: Vec<JobSnapshot>,
    /// Uids of finished jobs still remembered, with the time they finished.
    pub tombstones: Vec<(JobUid, Timestamp)>,
    /// Evictions decided outside a cycle (node lost) not yet reported.
    pub undelivered_evictions: Vec<Eviction>,
    /// Jobs holding a backfill reservation, evaluated first next cycle.
    #[serde(default)]
    pub reserved_jobs: Vec<JobUid>,
    /// The order in which the allocator first met zones, racks, flavors
    /// and resources: decisions break ties (and name the first of several
    /// holders) by that order, so a restore keeps it.
    #[serde(default, skip_serializing_if = "InternOrder::is_empty")]
    pub intern_order: InternOrder,
}

/// One job in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSnapshot {
    /// Spec.
    pub spec: JobSpec,
    /// Arrival order among jobs (tie-breaker after priority and submission time).
    pub seq: u64,
    /// No victim search for this job before this time.
    #[serde(default)]
    pub preemption_retry_after: Timestamp,
    /// Consecutive fruitless victim searches.
    #[serde(default)]
    pub preemption_failures: u32,
    /// Times the job was evicted and requeued.
    pub requeues: u32,
    /// Last preemptor.
    pub preempted_by: Option<JobUid>,
    /// Admission when running.
    pub admission: Option<Admission>,
    /// Set when running and being preempted.
    pub preempting: Option<PreemptingState>,
    /// Set when pending and waiting for victims.
    pub nomination: Option<Nomination>,
}

impl Allocator {
    // ---------------------------------------------------------------- snapshot

    /// The whole state, serializable for a key-value store.
    pub fn snapshot(&self) -> AllocatorSnapshot {
        let (nodes, free_node_slots) = self.state.inv.arena_layout();
        let queues = self
            .state
            .queues
            .queues
            .iter()
            .filter_map(|q| q.spec.clone())
            .collect();
        // Sorted as references: moving whole snapshots about while sorting
        // cost 8 % of the service's copy of its state with 10,000 jobs.
        // Uids are unique.
        let mut live: Vec<&Job> = self.state.jobs.iter().flatten().collect();
        live.sort_unstable_by(|a, b| a.spec.uid.cmp(&b.spec.uid));
        let jobs: Vec<JobSnapshot> = live
            .into_iter()
            .map(|j| {
                let (admission, preempting, nomination) = match &j.state {
                    JobState::Running(r) => (Some(r.admission.clone()), r.preempting.clone(), None),
                    JobState::Pending(n) => (None, None, n.as_deref().cloned()),
                };
                JobSnapshot {
                    seq: j.seq,
                    preemption_retry_after: j.preemption_retry_after,
                    preemption_failures: j.preemption_failures,
                    spec: j.spec.clone(),
                    requeues: j.requeues,
                    preempted_by: j.preempted_by.clone(),
                    admission,
                    preempting,
                    nomination,
                }
            })
            .collect();
        let mut tombstones: Vec<(JobUid, Timestamp)> = self
            .state
            .tombstone_order
            .iter()
            .map(|(t, u)| (u.clone(), *t))
            .collect();
        tombstones.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        AllocatorSnapshot {
            format_version: SNAPSHOT_FORMAT_VERSION,
            config: self.state.config.clone(),
            clock: self.state.clock,
            nodes,
            free_node_slots: free_node_slots.iter().map(|s| s.number()).collect(),
            queues,
            jobs,
            tombstones,
            undelivered_evictions: self.state.undelivered_evictions.clone(),
            reserved_jobs: self.state.reserved_jobs.clone(),
            intern_order: self.state.inv.intern_order(),
        }
    }

    /// Rebuilds an allocator from a snapshot.
    pub fn restore(snapshot: AllocatorSnapshot) -> Result<Self, AllocatorError> {
        if snapshot.format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(AllocatorError::InvalidConfig {
                field: "formatVersion".into(),
                reason: format!(
                    "snapshot format {} is not {SNAPSHOT_FORMAT_VERSION}",
                    snapshot.format_version
                ),
            });
        }
        let mut alloc = Allocator::new(snapshot.config)?;
        alloc.state.clock = snapshot.clock;
        alloc.state.inv.restore_intern_order(&snapshot.intern_order);
        for node in snapshot.nodes {
            match node {
                Some(info) => {
                    alloc.state.inv.upsert_node(info)?;
                }
                None => alloc.state.inv.push_gap(),
            }
        }
        alloc.state.inv.set_free_slots(
            snapshot
                .free_node_slots
                .iter()
                .map(|&s| NodeIdx::from_slot(s as usize))
                .collect(),
        );
        for queue in snapshot.queues {
            alloc.state.upsert_queue(queue)?;
        }
        let mut by_arrival: Vec<&JobSnapshot> = snapshot.jobs.iter().collect();
        by_arrival.sort_by_key(|j| j.seq);
        for job in by_arrival {
            // Submitted under its own arrival number (jobs go in arrival
            // order), so its queue lists it where it was.
            alloc.state.next_seq = job.seq;
            alloc.state.submit(job.spec.clone())?;
            if let Some(idx) = alloc.state.job_by_uid.get(&job.spec.uid).copied()
                && let Some(j) = alloc.state.job_mut(idx)
            {
                j.preemption_retry_after = job.preemption_retry_after;
                j.preemption_failures = job.preemption_failures;
            }
            alloc.state.next_seq = alloc.state.next_seq.max(job.seq.saturating_add(1));
        }
        for job in snapshot.jobs {
            let Some(idx) = alloc.state.job_by_uid.get(&job.spec.uid).copied() else {
                continue;
            };
            if let Some(admission) = &job.admission {
                alloc.state.replay_admission(admission)?;
            }
            let nominated = job.nomination.is_some();
            let preempting = job.preempting.is_some();
            if let Some(j) = alloc.state.job_mut(idx) {
                j.requeues = job.requeues;
                j.preempted_by = job.preempted_by;
                if let JobState::Pending(n) = &mut j.state {
                    *n = job.nomination.map(Box::new);
                }
            }
            alloc.state.update_preempting(idx, |p| *p = job.preempting);
            if nominated {
                alloc.state.nominated.insert(idx);
            }
            if preempting && job.admission.is_some() {
                alloc.state.preempting.insert(idx);
            }
        }
        for (uid, at) in snapshot.tombstones {
            if alloc.state.tombstones.insert(uid.clone(), at).is_none() {
                alloc.state.tombstone_order.push_back((at, uid));
            }
        }
        alloc.state.undelivered_evictions = snapshot.undelivered_evictions;
        alloc.state.reserved_jobs = snapshot.reserved_jobs;
        alloc.state.queues.recompute_all_cohorts();
        Ok(alloc)
    }
}
