//! Queue order: each queue's pending jobs in line order (effective
//! priority with aging, then submission, then arrival), and the queues
//! interleaved by weighted dominant-resource fair share, recomputed after
//! every admission.

use std::cmp::Reverse;

use crate::config::AgingPolicy;
use crate::cycle::Policy;
use crate::cycle::evaluate::estimated_end;
use crate::ids::{JobIdx, QueueIdx};
use crate::memo::QuotaShape;
use crate::state::jobs::Job;
use crate::types::Timestamp;

/// What the main pass needs of a job without touching it again, copied
/// from its queue's line (see `crate::line`). Kept small: the pass reads
/// the lanes interleaved, one cache miss per job when they are large.
pub(crate) struct LaneJob {
    /// Effective priority at this cycle.
    pub(crate) priority: i32,
    pub(crate) idx: JobIdx,
    pub(crate) submitted_at: Timestamp,
    pub(crate) seq: u64,
    /// For a job that may take the quota shortcut: pending without a
    /// nomination, whole or shared GPUs.
    pub(crate) shape: Option<QuotaShape>,
}

/// A queue's ordered pending jobs during a cycle.
pub(crate) struct Lane {
    pub(crate) queue: QueueIdx,
    /// In line order; the pass takes them from the front.
    pub(crate) jobs: std::vec::IntoIter<LaneJob>,
}

/// Heap key: lowest weighted share first, then the head job's place in
/// line (effective priority, submission time, arrival), then the lane.
/// Packed into two integers in that order of significance, so that a
/// comparison is a few instructions: the heap compares keys for nearly
/// every job of the pass, and queues of equal share (common: queues at
/// their nominal quota) interleave job by job.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LaneKey(Reverse<(u128, u128)>);

impl LaneKey {
    pub(crate) fn new(share: f64, head: &LaneJob, lane: usize) -> Self {
        // The bits of an f64 turned into an unsigned key in `total_cmp`'s
        // order: negatives flipped whole, the sign bit set on the rest.
        let bits = share.to_bits();
        let share = if bits >> 63 == 1 {
            !bits
        } else {
            bits | 1 << 63
        };
        // Highest priority first: the i32 order made unsigned, then flipped.
        let priority = !(head.priority.cast_unsigned() ^ 1 << 31);
        let submitted = head.submitted_at.0;
        let lane = u32::try_from(lane).unwrap_or(u32::MAX);
        LaneKey(Reverse((
            u128::from(share) << 64 | u128::from(priority) << 32 | u128::from(submitted >> 32),
            u128::from(submitted & u64::from(u32::MAX)) << 96
                | u128::from(head.seq) << 32
                | u128::from(lane),
        )))
    }

    pub(crate) fn lane(&self) -> usize {
        usize::try_from(self.0.0.1 & u128::from(u32::MAX)).unwrap_or(usize::MAX)
    }
}

impl Policy<'_> {
    /// The aging policy of a queue: its own, else the configured one.
    pub(crate) fn aging_of(&self, queue: QueueIdx) -> AgingPolicy {
        self.state
            .queues
            .get(queue)
            .and_then(|q| q.aging)
            .unwrap_or(self.state.config.aging)
    }

    /// Base priority plus the aging boost of the job's queue.
    pub(crate) fn effective_priority(&self, job: &Job, now: Timestamp) -> i32 {
        let waited = now.secs_since(job.spec.submitted_at);
        job.spec
            .priority
            .saturating_add(self.aging_of(job.queue).boost(waited))
    }

    /// Where `job` stands in its queue's line at `now` (smaller is ahead):
    /// effective priority, then submission time, then arrival, as
    /// `crate::line` orders pending jobs.
    pub(crate) fn line_place(&self, job: &Job, now: Timestamp) -> (Reverse<i32>, Timestamp, u64) {
        (
            Reverse(self.effective_priority(job, now)),
            job.spec.submitted_at,
            job.seq,
        )
    }

    /// Each queue's pending jobs in line order (effective priority,
    /// submission time, arrival), read off the queues' lines.
    pub(crate) fn build_lanes(&self, now: Timestamp) -> Vec<Lane> {
        let mut lanes = Vec::new();
        // The few queues with a nominated job: only their jobs are looked up.
        let nominating: Vec<QueueIdx> = self
            .state
            .nominated
            .iter()
            .filter_map(|idx| self.state.job(*idx).map(|j| j.queue))
            .collect();
        for (queue, q) in QueueIdx::enumerate(&self.state.queues.queues) {
            let listed = q.line.len();
            if listed == 0 {
                continue;
            }
            let aging = self.aging_of(queue);
            let smallest_nominal = self.smallest_nominal(queue);
            let check_nominated = nominating.contains(&queue);
            // A job the queue does not admit waits for that alone: no quota
            // shortcut from the jobs it does admit.
            let restricted = q.spec.as_ref().is_some_and(crate::QueueSpec::refuses_some);
            let admitted = |idx: JobIdx, needs_permission: bool| {
                !(restricted || needs_permission)
                    || self.state.job(idx).is_some_and(|j| self.queue_admits(j))
            };
            let mut jobs = Vec::with_capacity(listed);
            q.line.in_order(
                |submitted_at| aging.boost(now.secs_since(submitted_at)),
                |priority, e| {
                    // A nominated job waits for its victims: no shortcut.
                    let nominated = check_nominated && self.state.nominated.contains(&e.idx);
                    // Units beyond u32 (never in practice) go the long way.
                    let shape = u32::try_from(e.units)
                        .ok()
                        .filter(|_| !nominated && !e.sliced && admitted(e.idx, e.needs_permission))
                        .map(|units| QuotaShape {
                            end: estimated_end(e.runtime_estimate_secs, now).0,
                            units,
                            sharing: e.allow_gpu_sharing,
                            ages: self
                                .hold_ages(e.submitted_at, now)
                                .for_units(e.units, smallest_nominal),
                        });
                    jobs.push(LaneJob {
                        priority,
                        submitted_at: e.submitted_at,
                        idx: e.idx,
                        seq: e.seq,
                        shape,
                    });
                },
            );
            lanes.push(Lane {
                queue,
                jobs: jobs.into_iter(),
            });
        }
        lanes
    }

    /// `shares`: each queue's weighted share, by queue index.
    pub(crate) fn lane_key(lanes: &[Lane], shares: &[f64], lane: usize) -> Option<LaneKey> {
        let l = lanes.get(lane)?;
        let head = l.jobs.as_slice().first()?;
        Some(LaneKey::new(
            shares.get(l.queue.slot()).copied().unwrap_or(0.0),
            head,
            lane,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::types::Timestamp;

    fn head(priority: i32, submitted_at: u64, seq: u64) -> LaneJob {
        LaneJob {
            priority,
            submitted_at: Timestamp(submitted_at),
            idx: JobIdx::from(0),
            seq,
            shape: None,
        }
    }

    #[test]
    fn lane_keys_go_by_share_then_the_heads_place_in_line_then_lane() {
        let shares = [-1.5, -0.0, 0.0, 1e-300, 0.25, 0.5, 3.0, f64::INFINITY];
        let any = head(0, 0, 0);
        for a in shares {
            for b in shares {
                // Greater goes first: the lower share.
                let by_share = LaneKey::new(a, &any, 1).cmp(&LaneKey::new(b, &any, 1));
                assert_eq!(by_share, b.total_cmp(&a), "{a} vs {b}");
            }
        }
        let key = |share, p, t, seq, lane| LaneKey::new(share, &head(p, t, seq), lane);
        assert!(key(0.25, i32::MIN, 9, 9, 9) > key(0.5, i32::MAX, 0, 0, 0));
        // Higher effective priority first, negative ones included.
        for (hi, lo) in [(1, 0), (0, -1), (-1, -2), (i32::MAX, i32::MIN), (5, -5)] {
            assert!(
                key(0.5, hi, 9, 9, 9) > key(0.5, lo, 0, 0, 0),
                "{hi} vs {lo}"
            );
        }
        assert!(key(0.5, 3, 1, 9, 9) > key(0.5, 3, 2, 0, 0));
        // Submission times differing in either half of their bits.
        assert!(key(0.5, 3, 1 << 32, 9, 9) > key(0.5, 3, 2 << 32, 0, 0));
        assert!(key(0.5, 3, 1 << 32 | 7, 9, 9) > key(0.5, 3, 1 << 32 | 8, 0, 0));
        assert!(key(0.5, 3, u64::MAX - 1, 9, 9) > key(0.5, 3, u64::MAX, 0, 0));
        assert!(key(0.5, 3, 1, u64::MAX - 1, 9) > key(0.5, 3, 1, u64::MAX, 0));
        assert!(key(0.5, 3, 1, 1, 9) > key(0.5, 3, 1, 2, 0));
        assert!(key(0.5, 3, 1, 1, 3) > key(0.5, 3, 1, 1, 4));
        assert_eq!(key(0.5, 3, 1, 1, 3).lane(), 3);
    }
}
