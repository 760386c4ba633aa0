//! Pending entries resolved into what a user reads: the job's uid and
//! queue name beside the cycle's reason and queue position.

use std::sync::Arc;

use crate::allocator::Allocator;
use crate::decision::CycleOutcome;
use crate::pending::{Pending, PendingExplanation, PendingReason};
use crate::types::JobUid;

impl Allocator {
    /// The explanation of a pending entry of the last cycle, `outcome`,
    /// with the job's uid and queue name; `None` once the job is gone.
    pub fn explain(&self, outcome: &CycleOutcome, pending: &Pending) -> Option<PendingExplanation> {
        let (uid, queue, reason) = self.pending_parts(outcome, pending)?;
        Some(PendingExplanation {
            uid: uid.clone(),
            queue: Arc::clone(queue),
            position: pending.position,
            queue_length: pending.queue_length,
            effective_priority: pending.effective_priority,
            reason: Arc::clone(reason),
        })
    }

    /// The job's uid, its queue's name and its reason, borrowed from the
    /// allocator and `outcome`: enough to decide whether a pending entry is
    /// worth publishing again, without building (and cloning a uid for) an
    /// explanation of each of 10,000 jobs a cycle. `None` once the job is gone.
    pub fn pending_parts<'a>(
        &'a self,
        outcome: &'a CycleOutcome,
        pending: &Pending,
    ) -> Option<(&'a JobUid, &'a Arc<str>, &'a Arc<PendingReason>)> {
        let job = self
            .state
            .job(pending.job)
            .filter(|j| j.seq == pending.seq)?;
        let queue = self.state.queues.get(pending.queue)?;
        let reason = outcome.reasons.get(pending.reason.slot())?;
        Some((&job.spec.uid, &queue.name, reason))
    }
}
