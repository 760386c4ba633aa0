//! Backfill: reservations for blocked jobs and the protection they impose.
//!
//! When a job at the front of the order is blocked by capacity (not quota),
//! it gets a reservation: the earliest time `T` at which it fits, computed by
//! releasing running jobs at their expected end (admission time plus runtime
//! estimate, or the configured assumption), and the nodes it would use then.
//! Every job considered after it may use a node's free units only as far as
//! that keeps the reservation feasible at `T`, unless its own runtime estimate
//! ends by `T` (then it is gone before the reserved job needs the units).
//! So a smaller job may start ahead of a blocked bigger one, but never delays
//! its reserved start.

use std::collections::HashSet;

use crate::allocator::FastMap;

use crate::allocator::{Allocator, JobState};
use crate::inventory::{Inventory, JobIdx, NodeIdx, ResIdx};
use crate::placement::{self, Candidate};
use crate::types::{JobUid, Timestamp, TopologyRequirement};

/// Units a reservation needs on one node at its start time.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    pub(crate) start: Timestamp,
    pub(crate) need: u32,
    /// Units on this node released (by running jobs ending) by `start`.
    pub(crate) released_by_start: u32,
    pub(crate) holder: JobUid,
}

/// The reservations of one cycle.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    by_node: FastMap<(NodeIdx, ResIdx), Vec<Claim>>,
    resources: HashSet<ResIdx, foldhash::fast::FixedState>,
    /// First holder per resource, for explanations and `backfilledAheadOf`.
    pub(crate) first_holder: FastMap<ResIdx, (JobUid, Timestamp)>,
    pub(crate) count: u32,
}

impl Reservations {
    pub(crate) fn has_any(&self, res: ResIdx) -> bool {
        self.resources.contains(&res)
    }

    pub(crate) fn add(&mut self, node: NodeIdx, res: ResIdx, claim: Claim) {
        self.resources.insert(res);
        self.first_holder
            .entry(res)
            .or_insert_with(|| (claim.holder.clone(), claim.start));
        let claims = self.by_node.entry((node, res)).or_default();
        claims.push(claim);
        claims.sort_by_key(|c| c.start);
    }

    /// Units claimed on a node, whatever their start (used when computing a
    /// later reservation, so it never counts on units an earlier one needs).
    pub(crate) fn claimed_total(&self, node: NodeIdx, res: ResIdx) -> u32 {
        self.by_node
            .get(&(node, res))
            .map_or(0, |cs| cs.iter().map(|c| c.need).sum())
    }

    /// Free units on `node` that a job running until `end` (`None`: unknown)
    /// must leave alone so every reservation starting before `end` still fits.
    ///
    /// For the claims sorted by start, at each start `T_i` the node must offer
    /// the needs of all claims starting by `T_i`; it offers the units free now
    /// plus those released by `T_i`, minus what the new job holds. The largest
    /// deficit over those `T_i` is the protected amount.
    pub(crate) fn protected(&self, node: NodeIdx, res: ResIdx, end: Option<Timestamp>) -> u32 {
        let Some(claims) = self.by_node.get(&(node, res)) else {
            return 0;
        };
        let mut cumulative: u32 = 0;
        let mut protected: u32 = 0;
        for claim in claims {
            cumulative = cumulative.saturating_add(claim.need);
            if let Some(end) = end
                && claim.start >= end
            {
                break;
            }
            protected = protected.max(cumulative.saturating_sub(claim.released_by_start));
        }
        protected
    }
}

/// Expected releases `(end, node, units)` of the jobs running in one
/// resource, sorted by end.
pub(crate) type Timeline = Vec<(Timestamp, NodeIdx, u32)>;

/// A computed reservation.
pub(crate) struct Reservation {
    pub(crate) start: Timestamp,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
}

impl Allocator {
    /// When a running job is expected to release its units.
    pub(crate) fn expected_end(&self, job: JobIdx, now: Timestamp) -> Timestamp {
        let Some(j) = self.job(job) else { return now };
        let JobState::Running(run) = &j.state else {
            return now;
        };
        let end = match &run.preempting {
            Some(p) if p.checkpointed => now,
            Some(p) => p.evict_at,
            None => run.admitted_at.plus_secs(
                j.spec
                    .runtime_estimate_secs
                    .unwrap_or(self.config.backfill.assumed_runtime_secs),
            ),
        };
        end.max(now)
    }

    /// Release events `(end, node, units)` of jobs running in `res`.
    pub(crate) fn release_timeline(&self, res: ResIdx, now: Timestamp) -> Timeline {
        let Some(r) = self.inv.res(res) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        for job in &r.running {
            self.job_releases(*job, res, now, |event| events.push(event));
        }
        events.sort_unstable();
        events
    }

    /// Calls `each` with the release events `(end, node, units)` of one job,
    /// if it runs in `res`.
    pub(crate) fn job_releases(
        &self,
        job: JobIdx,
        res: ResIdx,
        now: Timestamp,
        mut each: impl FnMut((Timestamp, NodeIdx, u32)),
    ) {
        let Some(run) = self.job(job).and_then(|j| j.running()) else {
            return;
        };
        if run.res != res {
            return;
        }
        let end = self.expected_end(job, now);
        for (node, workers) in &run.placement {
            each((end, *node, workers.saturating_mul(run.per_worker)));
        }
    }

    /// Earliest start and nodes for a blocked gang, not counting on units
    /// already claimed by earlier reservations. `None` when it does not fit
    /// even after every running job has ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compute_reservation(
        &self,
        res: ResIdx,
        filter: u32,
        per_worker: u32,
        workers: u32,
        topology: TopologyRequirement,
        now: Timestamp,
        reservations: &Reservations,
        timeline: &[(Timestamp, NodeIdx, u32)],
    ) -> Option<Reservation> {
        let r = self.inv.res(res)?;
        let filter = self.filters.get(filter as usize)?;
        // Eligible nodes and their units available at `now`.
        let mut avail: FastMap<NodeIdx, (u32, u32, u32)> = FastMap::default();
        for (node_idx, free) in r.nodes_with_free(0) {
            let Some(node) = self.inv.node(node_idx) else {
                continue;
            };
            if !Inventory::node_admits(node, filter) {
                continue;
            }
            let claimed = reservations.claimed_total(node_idx, res);
            avail.insert(
                node_idx,
                (free.saturating_sub(claimed), node.zone, node.rack),
            );
        }
        let slots_of = |units: u32| u64::from(units / per_worker.max(1));
        let mut slots: u64 = avail.values().map(|(u, _, _)| slots_of(*u)).sum();
        let mut tries = 0u32;
        let mut i = 0usize;
        let mut t = now;
        loop {
            if slots >= u64::from(workers) && tries < 64 {
                tries += 1;
                let cands: Vec<Candidate> = avail
                    .iter()
                    .filter(|(_, (u, _, _))| *u >= per_worker)
                    .map(|(n, (u, z, r))| Candidate {
                        node: *n,
                        usable: *u,
                        zone: *z,
                        rack: *r,
                    })
                    .collect();
                if let Some(placement) =
                    placement::place_gang(per_worker, workers, topology, &cands)
                {
                    return Some(Reservation {
                        start: t,
                        placement,
                    });
                }
            }
            // Advance to the next release time and apply every release at it.
            let (next_t, _, _) = *timeline.get(i)?;
            t = next_t;
            while let Some((when, node, units)) = timeline.get(i) {
                if *when != t {
                    break;
                }
                if let Some(entry) = avail.get_mut(node) {
                    let before = slots_of(entry.0);
                    entry.0 = entry.0.saturating_add(*units);
                    slots += slots_of(entry.0) - before;
                }
                i += 1;
            }
        }
    }

    /// Units released on `node` by `start`, used to size a claim.
    pub(crate) fn released_by(
        timeline: &[(Timestamp, NodeIdx, u32)],
        node: NodeIdx,
        start: Timestamp,
    ) -> u32 {
        timeline
            .iter()
            .take_while(|(t, _, _)| *t <= start)
            .filter(|(_, n, _)| *n == node)
            .map(|(_, _, u)| *u)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(start: u64, need: u32, released: u32) -> Claim {
        Claim {
            start: Timestamp(start),
            need,
            released_by_start: released,
            holder: JobUid::new("big"),
        }
    }

    #[test]
    fn protection_covers_the_deficit_at_each_reserved_start() {
        let mut r = Reservations::default();
        // Needs 8 at t=100; 4 are released by then, so 4 of today's free
        // units must stay free for jobs still running at t=100.
        r.add(0, 0, claim(100, 8, 4));
        assert_eq!(r.protected(0, 0, None), 4);
        assert_eq!(r.protected(0, 0, Some(Timestamp(150))), 4);
        // A job ending by t=100 is gone before the reservation starts.
        assert_eq!(r.protected(0, 0, Some(Timestamp(100))), 0);
        // A second reservation at t=200 needing 4 more with 6 released by then.
        r.add(0, 0, claim(200, 4, 6));
        assert_eq!(r.protected(0, 0, None), 6);
        assert_eq!(r.protected(0, 0, Some(Timestamp(150))), 4);
        assert_eq!(r.claimed_total(0, 0), 12);
        assert_eq!(r.protected(1, 0, None), 0, "other nodes are untouched");
    }
}
