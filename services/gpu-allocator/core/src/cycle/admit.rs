//! Admission: the passes that walk pending jobs in order (preemptors whose
//! victims are gone, then jobs that held a reservation, then every pending
//! job by queue order) and turn each plan into an admission.

use std::collections::BinaryHeap;

use crate::allocator::Allocator;
use crate::cycle::queue_order::{Lane, LaneJob};
use crate::cycle::{CycleCtx, Policy};
use crate::decision::CycleOutcome;
use crate::ids::{JobIdx, QueueIdx};
use crate::pending::Pending;
use crate::state::jobs::JobState;
use crate::types::Timestamp;

impl Allocator {
    pub(crate) fn admit_ready_preemptors(
        &mut self,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        // In line order.
        let mut ready: Vec<(_, JobIdx)> = self
            .state
            .nominated
            .iter()
            .filter_map(|idx| {
                let job = self.state.job(*idx)?;
                let JobState::Pending(Some(n)) = &job.state else {
                    return None;
                };
                (self.policy().victims_left(job, n) == 0)
                    .then(|| (self.policy().line_place(job, now), *idx))
            })
            .collect();
        ready.sort_unstable();
        for (_, idx) in ready {
            // The resource its victims freed first: elsewhere, the eviction
            // was for nothing, and another flavor may be kept for others.
            let planned = self.state.job(idx).and_then(|job| match &job.state {
                JobState::Pending(Some(n)) => self.policy().nomination_res(n),
                _ => None,
            });
            // Whatever happens now, the nomination is used up: if the plan no
            // longer fits (a node vanished) the job competes normally.
            if let Some(job) = self.state.job_mut(idx) {
                job.state = JobState::Pending(None);
            }
            self.state.nominated.remove(&idx);
            let mut options = Vec::new();
            // A queue on hold or closed to its namespace meanwhile: it waits,
            // as evaluate says.
            if let Some(job) = self.state.job(idx)
                && self.policy().queue_admits(job)
            {
                self.policy().options_for(job, &mut options);
            }
            if let Some(at) = planned.and_then(|res| options.iter().position(|r| *r == res))
                && let Some(first) = options.get_mut(..=at)
            {
                first.rotate_right(1);
            }
            for res in options {
                let Some(job) = self.state.job(idx) else {
                    break;
                };
                let units = job.spec.total_units();
                if self.state.queues.check(job.queue, res, units, &[]).is_err() {
                    continue;
                }
                if let Ok(plan) = self.policy().try_place(idx, res, now, ctx) {
                    self.admit_in_cycle(idx, plan, now, ctx, out);
                    break;
                }
            }
        }
    }

    /// Jobs that held a reservation last cycle are evaluated before everyone
    /// else, so they keep it until they start: without this, a big gang
    /// could lose its reservation to whichever queue the fair-share order
    /// puts first next cycle, and be passed over again and again.
    pub(crate) fn evaluate_reserved_first(
        &mut self,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        let reserved = std::mem::take(&mut self.state.reserved_jobs);
        let mut options = Vec::new();
        for uid in reserved {
            let Some(idx) = self.state.job_by_uid.get(&uid).copied() else {
                continue;
            };
            if !matches!(
                self.state.job(idx).map(|j| &j.state),
                Some(JobState::Pending(None))
            ) {
                continue;
            }
            match self.policy().evaluate(idx, now, ctx, &mut options) {
                Ok(plan) => self.admit_in_cycle(idx, plan, now, ctx, out),
                Err(failure) => {
                    ctx.early.insert(idx, failure);
                }
            }
        }
    }

    pub(crate) fn main_pass(
        &mut self,
        now: Timestamp,
        mut lanes: Vec<Lane>,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        // A queue's share changes only when one of its jobs is admitted:
        // computed once here and after each admission, not once per job.
        let mut shares: Vec<f64> = QueueIdx::enumerate(&self.state.queues.queues)
            .map(|(queue, _)| self.state.queues.share(queue, &[]))
            .collect();
        let mut heap = BinaryHeap::new();
        for i in 0..lanes.len() {
            if let Some(key) = Policy::lane_key(&lanes, &shares, i) {
                heap.push(key);
            }
        }
        let in_line: usize = lanes.iter().map(|l| l.jobs.len()).sum();
        out.pending.reserve(in_line);
        ctx.may_preempt.reserve(in_line);
        let mut options = Vec::new();
        let mut current = heap.pop();
        while let Some(key) = current.take() {
            let lane_idx = key.lane();
            let Some(lane) = lanes.get_mut(lane_idx) else {
                continue;
            };
            // Lanes are built after the preemptors and reserved jobs went, so
            // every job here is still pending.
            let Some(LaneJob {
                priority,
                idx,
                seq,
                shape,
                ..
            }) = lane.jobs.next()
            else {
                continue;
            };
            let lane_queue = lane.queue;
            ctx.stats.considered += 1;
            let early = ctx.early.take(idx);
            let outcome = match early {
                // Evaluated before the pass (it held a reservation).
                Some(failure) => Err(failure),
                // A job no node could ever hold says so before any quota
                // answer a job of its shape got.
                None => match self.policy().unschedulable(idx, ctx) {
                    Some(reason) => Err((reason, false)),
                    None => match shape.filter(|_| ctx.quota_shortcut()).and_then(|s| {
                        ctx.memo
                            .lookup_quota_blocked(lane_queue, s, ctx.quota_epoch(lane_queue))
                    }) {
                        Some(failure) => {
                            ctx.stats.memo_hits += 1;
                            Err(failure)
                        }
                        None => self.policy().evaluate(idx, now, ctx, &mut options),
                    },
                },
            };
            match outcome {
                Ok(plan) => {
                    self.admit_in_cycle(idx, plan, now, ctx, out);
                    if let Some(share) = shares.get_mut(lane_queue.slot()) {
                        *share = self.state.queues.share(lane_queue, &[]);
                    }
                }
                Err((reason, can_preempt)) => {
                    if let Some(position) = ctx.positions.next(lane_queue) {
                        if can_preempt {
                            ctx.may_preempt.push((out.pending.len(), idx));
                        }
                        out.pending.push(Pending {
                            job: idx,
                            seq,
                            queue: lane_queue,
                            position,
                            // Known once every job was seen.
                            queue_length: 0,
                            effective_priority: priority,
                            reason,
                        });
                    }
                }
            }
            // What pushing the lane's next key and popping would return
            // (keys are unique), for at most one sift: the lane goes on when
            // it is still first, else it swaps places with the heap's top.
            current = match Policy::lane_key(&lanes, &shares, lane_idx) {
                Some(next) => match heap.peek_mut() {
                    Some(mut top) if *top > next => Some(std::mem::replace(&mut *top, next)),
                    _ => Some(next),
                },
                None => heap.pop(),
            };
        }
    }
}
