//! Admission: the passes that walk pending jobs in order (preemptors whose
//! victims are gone, then jobs that held a reservation, then every pending
//! job by queue order), each deciding one admission or wait at a time; the
//! cycle (`cycle/mod.rs`) applies each before the pass goes on.

use std::collections::BinaryHeap;

use crate::cycle::evaluate::Plan;
use crate::cycle::queue_order::{Lane, LaneJob, LaneKey};
use crate::cycle::{CycleCtx, Decision, Pass, Policy};
use crate::ids::{JobIdx, QueueIdx, ResourceIdx};
use crate::pending::Pending;
use crate::state::jobs::JobState;
use crate::types::{JobUid, Timestamp};

/// Preemptors whose victims are all gone, in line order: each one's
/// nomination ends, then it is admitted if it fits, before anyone else
/// takes the capacity it paid for.
pub(crate) struct ReadyPreemptors {
    ready: std::vec::IntoIter<JobIdx>,
    /// The preemptor whose nomination just ended, with the resource its
    /// victims freed.
    ended: Option<(JobIdx, Option<ResourceIdx>)>,
    options: Vec<ResourceIdx>,
}

impl ReadyPreemptors {
    pub(crate) fn new(policy: Policy<'_>, now: Timestamp) -> Self {
        let mut ready: Vec<(_, JobIdx)> = policy
            .state
            .nominated
            .iter()
            .filter_map(|idx| {
                let job = policy.state.job(*idx)?;
                let JobState::Pending(Some(n)) = &job.state else {
                    return None;
                };
                (policy.victims_left(job, n) == 0).then(|| (policy.line_place(job, now), *idx))
            })
            .collect();
        ready.sort_unstable();
        ReadyPreemptors {
            ready: ready
                .into_iter()
                .map(|(_, idx)| idx)
                .collect::<Vec<_>>()
                .into_iter(),
            ended: None,
            options: Vec::new(),
        }
    }
}

impl Pass for ReadyPreemptors {
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision> {
        if let Some((idx, planned)) = self.ended.take()
            && let Some(plan) = policy.preemptor_plan(idx, planned, now, ctx, &mut self.options)
        {
            return Some(Decision::Admit { job: idx, plan });
        }
        let idx = self.ready.next()?;
        // The resource its victims freed first: elsewhere, the eviction
        // was for nothing, and another flavor may be kept for others.
        let planned = policy.state.job(idx).and_then(|job| match &job.state {
            JobState::Pending(Some(n)) => policy.nomination_res(n),
            _ => None,
        });
        self.ended = Some((idx, planned));
        // Whatever happens now, the nomination is used up: if the plan no
        // longer fits (a node vanished) the job competes normally.
        Some(Decision::EndNomination(idx))
    }
}

impl Policy<'_> {
    /// Where a preemptor whose nomination ended fits now: the resource its
    /// victims freed (`planned`) first, then its other options, each within
    /// its queue's quota. `None`: it competes like any other job.
    pub(crate) fn preemptor_plan(
        &self,
        idx: JobIdx,
        planned: Option<ResourceIdx>,
        now: Timestamp,
        ctx: &mut CycleCtx,
        options: &mut Vec<ResourceIdx>,
    ) -> Option<Plan> {
        options.clear();
        let job = self.state.job(idx)?;
        // A queue on hold or closed to its namespace meanwhile: it waits, as
        // evaluate says.
        if self.queue_admits(job) {
            self.options_for(job, options);
        }
        if let Some(at) = planned.and_then(|res| options.iter().position(|r| *r == res))
            && let Some(first) = options.get_mut(..=at)
        {
            first.rotate_right(1);
        }
        let units = job.spec.total_units();
        options.iter().find_map(|&res| {
            if self.state.queues.check(job.queue, res, units, &[]).is_err() {
                return None;
            }
            self.try_place(idx, res, now, ctx).ok()
        })
    }
}

/// Jobs that held a reservation last cycle, evaluated before everyone else
/// so they keep it until they start: without this, a big gang could lose
/// its reservation to whichever queue the fair-share order puts first next
/// cycle, and be passed over again and again. A failure is kept for the
/// main pass (`CycleCtx::early`).
pub(crate) struct ReservedFirst {
    reserved: std::vec::IntoIter<JobUid>,
    options: Vec<ResourceIdx>,
}

impl ReservedFirst {
    /// `reserved`: the jobs that held a reservation at the end of the last
    /// cycle, in the order they got it.
    pub(crate) fn new(reserved: Vec<JobUid>) -> Self {
        ReservedFirst {
            reserved: reserved.into_iter(),
            options: Vec::new(),
        }
    }
}

impl Pass for ReservedFirst {
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision> {
        for uid in self.reserved.by_ref() {
            let Some(idx) = policy.state.job_by_uid.get(&uid).copied() else {
                continue;
            };
            if !matches!(
                policy.state.job(idx).map(|j| &j.state),
                Some(JobState::Pending(None))
            ) {
                continue;
            }
            match policy.evaluate(idx, now, ctx, &mut self.options) {
                Ok(plan) => return Some(Decision::Admit { job: idx, plan }),
                Err(failure) => ctx.early.insert(idx, failure),
            }
        }
        None
    }
}

/// The main pass: every pending job, its queue's next job taken from the
/// queue of lowest weighted share (recomputed after each admission of its
/// queue), evaluated, and admitted if it fits now or listed as waiting.
pub(crate) struct MainPass {
    lanes: Vec<Lane>,
    /// Each queue's weighted share, by queue index. It changes only when
    /// one of its jobs is admitted: computed once here and after each
    /// admission, not once per job.
    shares: Vec<f64>,
    heap: BinaryHeap<LaneKey>,
    /// The lane to take the next job from, before the heap's top.
    current: Option<LaneKey>,
    /// The lane whose job was decided last: its next key goes in before
    /// the next job is taken.
    decided: Option<usize>,
    /// The queue whose job was last admitted: its share is out of date.
    admitted: Option<QueueIdx>,
    options: Vec<ResourceIdx>,
}

impl MainPass {
    /// Lanes are built after the preemptors and reserved jobs went, so every
    /// job in them is still pending.
    pub(crate) fn new(policy: Policy<'_>, now: Timestamp) -> Self {
        let lanes = policy.build_lanes(now);
        let shares: Vec<f64> = QueueIdx::enumerate(&policy.state.queues.queues)
            .map(|(queue, _)| policy.state.queues.share(queue, &[]))
            .collect();
        let mut heap = BinaryHeap::new();
        for i in 0..lanes.len() {
            if let Some(key) = Policy::lane_key(&lanes, &shares, i) {
                heap.push(key);
            }
        }
        let current = heap.pop();
        MainPass {
            lanes,
            shares,
            heap,
            current,
            decided: None,
            admitted: None,
            options: Vec::new(),
        }
    }

    /// Pending jobs in the lanes.
    pub(crate) fn jobs_in_line(&self) -> usize {
        self.lanes.iter().map(|l| l.jobs.len()).sum()
    }

    /// The key after lane `lane`'s job: what pushing the lane's next key
    /// and popping would return (keys are unique), for at most one sift:
    /// the lane goes on when it is still first, else it swaps places with
    /// the heap's top.
    fn following(&mut self, lane: usize) -> Option<LaneKey> {
        match Policy::lane_key(&self.lanes, &self.shares, lane) {
            Some(next) => match self.heap.peek_mut() {
                Some(mut top) if *top > next => Some(std::mem::replace(&mut *top, next)),
                _ => Some(next),
            },
            None => self.heap.pop(),
        }
    }
}

impl Pass for MainPass {
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision> {
        loop {
            if let Some(lane) = self.decided.take() {
                self.current = self.following(lane);
            }
            let key = self.current.take()?;
            let lane_idx = key.lane();
            let lane = self.lanes.get_mut(lane_idx)?;
            let LaneJob {
                priority,
                idx,
                seq,
                shape,
                ..
            } = lane.jobs.next()?;
            let lane_queue = lane.queue;
            self.decided = Some(lane_idx);
            ctx.stats.considered += 1;
            let outcome = match ctx.early.take(idx) {
                // Evaluated before the pass (it held a reservation).
                Some(failure) => Err(failure),
                // A job no node could ever hold says so before any quota
                // answer a job of its shape got.
                None => match policy.unschedulable(idx, ctx) {
                    Some(reason) => Err((reason, false)),
                    None => match shape.filter(|_| ctx.quota_shortcut()).and_then(|s| {
                        ctx.memo
                            .lookup_quota_blocked(lane_queue, s, ctx.quota_epoch(lane_queue))
                    }) {
                        Some(failure) => {
                            ctx.stats.memo_hits += 1;
                            Err(failure)
                        }
                        None => policy.evaluate(idx, now, ctx, &mut self.options),
                    },
                },
            };
            match outcome {
                Ok(plan) => {
                    self.admitted = Some(lane_queue);
                    return Some(Decision::Admit { job: idx, plan });
                }
                Err((reason, may_preempt)) => {
                    if let Some(position) = ctx.positions.next(lane_queue) {
                        let entry = Pending {
                            job: idx,
                            seq,
                            queue: lane_queue,
                            position,
                            // Known once every job was seen.
                            queue_length: 0,
                            effective_priority: priority,
                            reason,
                        };
                        ctx.wait(entry, may_preempt);
                    }
                }
            }
        }
    }

    fn applied(&mut self, policy: Policy<'_>, _took_effect: bool) {
        if let Some(queue) = self.admitted.take()
            && let Some(share) = self.shares.get_mut(queue.slot())
        {
            *share = policy.state.queues.share(queue, &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::Allocator;
    use crate::config::AllocatorConfig;
    use crate::cycle::queue_position::QueuePositions;
    use crate::cycle::reservation::tests::{job, node, queue};
    use crate::decision::CycleOutcome;

    #[test]
    fn the_main_pass_decides_each_job_on_what_the_admissions_before_it_took() {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
        // Two jobs of 4 x 2 GPUs for one node of 8.
        for event in [
            node("n1"),
            queue("q"),
            job("a", "q", 4, None),
            job("b", "q", 4, None),
        ] {
            alloc.apply(event).expect("accepted");
        }
        let now = Timestamp(0);
        let mut ctx = CycleCtx {
            positions: QueuePositions::new(1),
            ..CycleCtx::default()
        };
        let mut out = CycleOutcome::default();
        let mut pass = MainPass::new(alloc.policy(), now);
        assert_eq!(pass.jobs_in_line(), 2);
        let uid = |alloc: &Allocator, idx| alloc.state.job_uid(idx).map(|u| u.as_str().to_string());
        let first = pass
            .next(alloc.policy(), now, &mut ctx)
            .expect("a decision");
        let Decision::Admit { job, .. } = &first else {
            panic!("the first job fits");
        };
        assert_eq!(uid(&alloc, *job).as_deref(), Some("a"));
        assert!(
            alloc.is_pending(&JobUid::new("a")),
            "deciding admits nobody"
        );
        assert!(alloc.apply_decision(first, now, &mut ctx, &mut out));
        pass.applied(alloc.policy(), true);
        assert!(
            pass.next(alloc.policy(), now, &mut ctx).is_none(),
            "the second fits no more"
        );
        let [entry] = ctx.pending.as_slice() else {
            panic!("one job waits: {}", ctx.pending.len());
        };
        assert_eq!(uid(&alloc, entry.job).as_deref(), Some("b"));
        assert_eq!(entry.position, 1);
        assert_eq!(
            ctx.may_preempt,
            [(0, entry.job)],
            "its own queue's jobs may make room"
        );
    }
}
