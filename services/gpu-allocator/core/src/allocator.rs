//! The allocator: the state (`state/`), the cycle's speed layer
//! (`memo/`) and the public API over them. Events go to
//! [`State::apply`](crate::state::State); decisions come from
//! [`Allocator::cycle`] (`cycle/`).

use serde::{Deserialize, Serialize};

use crate::config::AllocatorConfig;
use crate::decision::Admission;
use crate::error::AllocatorError;
use crate::event::{Applied, Event};
use crate::memo::Memo;
use crate::state::State;
use crate::state::jobs::JobState;
use crate::types::{JobUid, ResourceKind};

/// Cluster-level counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorStats {
    /// Nodes known.
    pub nodes: u32,
    /// Whole GPUs on all nodes.
    pub gpu_capacity: u64,
    /// Whole GPUs held by admitted jobs.
    pub gpus_allocated: u64,
    /// Jobs pending.
    pub pending_jobs: u32,
    /// Jobs running.
    pub running_jobs: u32,
}

/// The GPU admission decision core.
pub struct Allocator {
    /// Nodes, queues and jobs: what every decision reads.
    pub(crate) state: State,
    /// What one cycle keeps for the next to find faster; never decides.
    pub(crate) memo: Memo,
}

impl Allocator {
    /// Creates an empty allocator.
    pub fn new(config: AllocatorConfig) -> Result<Self, AllocatorError> {
        config.validate()?;
        Ok(Allocator {
            state: State::new(config),
            memo: Memo::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.state.config
    }

    /// Whether a job with this uid is pending or running.
    pub fn contains_job(&self, uid: &JobUid) -> bool {
        self.state.job_by_uid.contains_key(uid)
    }

    /// The admission of a running job.
    pub fn admission(&self, uid: &JobUid) -> Option<&Admission> {
        let idx = self.state.job_by_uid.get(uid)?;
        self.state.job(*idx)?.running().map(|r| &r.admission)
    }

    /// The budget hold of a queue, if its budget is spent (see
    /// [`Event::QueueBudgetChanged`]): a queue's new spec keeps it.
    pub fn queue_budget_hold(&self, name: &str) -> Option<&crate::event::BudgetHold> {
        let idx = self.state.queues.by_name(name)?;
        self.state
            .queues
            .get(idx)?
            .spec
            .as_ref()?
            .budget_hold
            .as_ref()
    }

    /// Whether a job is pending (known and not admitted).
    pub fn is_pending(&self, uid: &JobUid) -> bool {
        self.state
            .job_by_uid
            .get(uid)
            .and_then(|i| self.state.job(*i))
            .is_some_and(|j| matches!(j.state, JobState::Pending(_)))
    }

    /// Cluster-level counters (whole GPUs only).
    pub fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats::default();
        let inv = &self.state.inv;
        for node in inv.nodes.iter().flatten() {
            stats.nodes += 1;
            for pool in &node.pools {
                if inv.kind_of_res(pool.res) == Some(&ResourceKind::Gpu) {
                    stats.gpu_capacity += u64::from(pool.capacity);
                    stats.gpus_allocated += u64::from(pool.used.min(pool.capacity));
                }
            }
        }
        for job in self.state.jobs.iter().flatten() {
            match job.state {
                JobState::Pending(_) => stats.pending_jobs += 1,
                JobState::Running(_) => stats.running_jobs += 1,
            }
        }
        stats
    }

    /// Applies one event. A rejected event leaves the state unchanged.
    pub fn apply(&mut self, event: Event) -> Result<Applied, AllocatorError> {
        let submitted = match &event {
            Event::JobSubmitted(spec) => Some(spec.uid.clone()),
            _ => None,
        };
        let applied = self.state.apply(event)?;
        // A new job may take a slot an earlier one left, and an edit keeps
        // its slot: what was judged of the slot goes.
        if let Some(uid) = submitted
            && applied == Applied::Changed
            && let Some(idx) = self.state.job_by_uid.get(&uid)
        {
            self.memo.spare_fits.forget_job(*idx);
        }
        Ok(applied)
    }

    /// Removes a job like `JobRemoved` but without remembering its uid, so
    /// the same uid may be submitted again later (a job suspended while it
    /// was still pending, then resumed as the same attempt). Additive helper
    /// for the service adapter; not an [`Event`], so it is not replayable.
    pub fn withdraw(&mut self, uid: &JobUid) -> Applied {
        self.state.withdraw(uid)
    }
}
