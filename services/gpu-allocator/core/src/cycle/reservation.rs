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

use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::ids::JobIdx;
use crate::state::jobs::JobState;
use std::collections::HashSet;

use crate::ids::FastMap;
use crate::ids::{FilterIdx, NodeIdx, ResourceIdx};
use crate::state::jobs::Gang;

use crate::cycle::placement::{self, Candidate, NodeTable, RoomiestDomain};
use crate::types::{CpuMemory, JobUid, Timestamp};

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
    by_node: FastMap<(NodeIdx, ResourceIdx), Vec<Claim>>,
    resources: HashSet<ResourceIdx, foldhash::fast::FixedState>,
    /// First holder per resource, for explanations and `backfilledAheadOf`.
    pub(crate) first_holder: FastMap<ResourceIdx, (JobUid, Timestamp)>,
    pub(crate) count: u32,
}

impl Reservations {
    pub(crate) fn has_any(&self, res: ResourceIdx) -> bool {
        self.resources.contains(&res)
    }

    pub(crate) fn add(&mut self, node: NodeIdx, res: ResourceIdx, claim: Claim) {
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
    pub(crate) fn claimed_total(&self, node: NodeIdx, res: ResourceIdx) -> u32 {
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
    pub(crate) fn protected(&self, node: NodeIdx, res: ResourceIdx, end: Option<Timestamp>) -> u32 {
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

/// A computed reservation.
pub(crate) struct Reservation {
    pub(crate) start: Timestamp,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
}

impl Policy<'_> {
    /// Earliest start and nodes for a blocked gang, not counting on units
    /// already claimed by earlier reservations. `None` when it does not fit
    /// even after every running job has ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compute_reservation(
        &self,
        res: ResourceIdx,
        filter: FilterIdx,
        gang: Gang,
        now: Timestamp,
        reservations: &Reservations,
        timeline: &[(Timestamp, NodeIdx, u32)],
    ) -> Option<Reservation> {
        let r = self.state.inv.res(res)?;
        // An eligible node's units available at `now`, zone and rack.
        let eligible = |node_idx: NodeIdx, free: u32| {
            let node = self.state.inv.node(node_idx)?;
            self.state.admits(node, filter).then(|| {
                let claimed = reservations.claimed_total(node_idx, res);
                (free.saturating_sub(claimed), node.zone, node.rack)
            })
        };
        // Nodes with no free units join when a release reaches them: in a
        // busy flavor they are most nodes, and most are never reached.
        let mut avail = NodeTable::new(self.state.inv.nodes.len());
        for (node_idx, free) in r.nodes_with_free(1) {
            if let Some(e) = eligible(node_idx, free) {
                avail.set(node_idx, e);
            }
        }
        // Tries start once units alone could host the gang in a domain its
        // topology allows.
        let mut roomiest = RoomiestDomain::new(gang.topology);
        for (_, &(units, zone, rack)) in avail.iter() {
            let s = gang.slots(units);
            roomiest.add((zone, rack), s, s);
        }
        let mut tries = 0u32;
        let mut i = 0usize;
        let mut t = now;
        loop {
            if roomiest.slots() >= u64::from(gang.workers) && tries < 64 {
                tries += 1;
                let cands: Vec<Candidate> = avail
                    .iter()
                    .filter_map(|(node, &(units, zone, rack))| {
                        // CPU and memory only ever lower the units usable.
                        if units < gang.per_worker {
                            return None;
                        }
                        let n = self.state.inv.node(node)?;
                        // CPU and memory given back by `t` only matter where
                        // what is free now caps the units (summing them walks
                        // the node's jobs).
                        let mut usable = n.usable_units(units, gang);
                        if usable != units {
                            let freed = self.cpu_memory_released_by(node, now, t);
                            usable = n.usable_units_after(units, gang, freed);
                        }
                        (usable >= gang.per_worker).then_some(Candidate {
                            node,
                            usable,
                            zone,
                            rack,
                        })
                    })
                    .collect();
                if let Some(placement) = placement::place_gang(gang, &cands) {
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
                if avail.get(node).is_none()
                    && let Some(e) = self
                        .state
                        .inv
                        .indexed_free(*node, res)
                        .and_then(|free| eligible(*node, free))
                {
                    avail.set(*node, e);
                }
                if let Some(entry) = avail.get_mut(node) {
                    let before = gang.slots(entry.0);
                    entry.0 = entry.0.saturating_add(*units);
                    let after = gang.slots(entry.0);
                    roomiest.add((entry.1, entry.2), after - before, after);
                }
                i += 1;
            }
        }
    }

    /// CPU and memory the jobs running on `node` are expected to have
    /// given back by `t`.
    fn cpu_memory_released_by(&self, node: NodeIdx, now: Timestamp, t: Timestamp) -> CpuMemory {
        let Some(n) = self.state.inv.node(node) else {
            return CpuMemory::default();
        };
        n.running
            .iter()
            .filter(|job| self.state.expected_end(**job, now) <= t)
            .filter_map(|job| {
                let j = self.state.job(*job)?;
                let workers: u32 = j
                    .running()?
                    .placement
                    .iter()
                    .filter(|(at, _)| *at == node)
                    .map(|(_, w)| *w)
                    .sum();
                Some(j.spec.cpu_memory_per_worker.times(workers))
            })
            .fold(CpuMemory::default(), CpuMemory::plus)
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

impl Policy<'_> {
    /// Computes and records a reservation for a blocked job.
    pub(crate) fn reserve(
        &self,
        idx: JobIdx,
        res: ResourceIdx,
        now: Timestamp,
        ctx: &mut CycleCtx,
    ) -> Option<Timestamp> {
        let timeline = ctx
            .memo
            .timeline(res, || self.state.release_timeline(res, now));
        let job = self.state.job(idx)?;
        let spec = &job.spec;
        let reservation = self.compute_reservation(
            res,
            job.filter,
            Gang::of(spec),
            now,
            &ctx.reservations,
            &timeline,
        )?;
        for (node, workers) in &reservation.placement {
            ctx.reservations.add(
                *node,
                res,
                Claim {
                    start: reservation.start,
                    need: workers.saturating_mul(spec.gpus_per_worker),
                    released_by_start: Self::released_by(&timeline, *node, reservation.start),
                    holder: spec.uid.clone(),
                },
            );
        }
        ctx.reservations.count += 1;
        ctx.stats.reservations += 1;
        let uid = spec.uid.clone();
        ctx.evaluate_first_next_cycle(&uid);
        Some(reservation.start)
    }

    /// Keeps the nodes a waiting preemptor planned on from being taken by
    /// jobs that would still run when its victims are evicted.
    pub(crate) fn hold_for_waiting_preemptors(&self, now: Timestamp, ctx: &mut CycleCtx) {
        // The first holder is named in explanations.
        for idx in self.state.by_arrival(self.state.nominated.iter().copied()) {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            let JobState::Pending(Some(nomination)) = &job.state else {
                continue;
            };
            if self.victims_left(job, nomination) == 0 || nomination.nodes.is_empty() {
                continue;
            }
            let Some(res) = self.nomination_res(nomination) else {
                continue;
            };
            let timeline = ctx
                .memo
                .timeline(res, || self.state.release_timeline(res, now));
            let start = nomination.evict_at.max(now);
            for planned in &nomination.nodes {
                let workers = &planned.workers;
                let Some(node) = self.state.inv.node_by_name(&planned.node) else {
                    continue;
                };
                ctx.reservations.add(
                    node,
                    res,
                    Claim {
                        start,
                        need: workers.saturating_mul(job.spec.gpus_per_worker),
                        released_by_start: Self::released_by(&timeline, node, start),
                        holder: job.spec.uid.clone(),
                    },
                );
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::allocator::Allocator;
    use crate::config::AllocatorConfig;
    use crate::event::{Event, FlavorQuota, JobSpec, NodeInfo, QueueSpec, ResourceQuota};
    use crate::ids::{JobIdx, QueueIdx};
    use crate::state::jobs::JobState;
    use crate::state::line::LineEntry;
    use crate::state::releases::tests::listed;
    use crate::state::releases::{Booking, ReleaseBook, planned_end};
    use crate::types::names;
    use std::collections::BTreeSet;

    /// An 8-GPU A100 node, as the cycle's tests use too.
    pub(crate) fn node(name: &str) -> Event {
        let mut info = NodeInfo {
            name: name.into(),
            ready: true,
            ..NodeInfo::default()
        };
        info.allocatable
            .insert(names::GPU_RESOURCE.into(), "8".into());
        info.labels
            .insert(names::GPU_PRODUCT_LABEL.into(), "A100".into());
        Event::NodeUpserted(info)
    }

    pub(crate) fn queue(name: &str) -> Event {
        Event::QueueUpserted(QueueSpec {
            name: name.into(),
            cohort: Some("c".into()),
            quotas: vec![FlavorQuota {
                flavor: "A100.on-demand".into(),
                resources: vec![ResourceQuota {
                    resource: names::GPU_RESOURCE.into(),
                    nominal: 8,
                    ..ResourceQuota::default()
                }],
            }],
            ..QueueSpec::default()
        })
    }

    pub(crate) fn job(uid: &str, queue: &str, workers: u32, estimate: Option<u64>) -> Event {
        Event::JobSubmitted(JobSpec {
            uid: JobUid::new(uid),
            queue: Some(queue.into()),
            num_workers: workers,
            gpus_per_worker: 2,
            runtime_estimate_secs: estimate,
            ..JobSpec::default()
        })
    }

    /// The book, rebuilt from scratch out of the running jobs.
    pub(crate) fn rebuilt(alloc: &Allocator) -> FastMap<ResourceIdx, ReleaseBook> {
        let mut books: FastMap<ResourceIdx, ReleaseBook> = FastMap::default();
        for job in alloc.state.jobs.iter().flatten() {
            let Some(run) = job.running() else { continue };
            let end = planned_end(&alloc.state.config, job, run);
            let releases = books.entry(run.res).or_default();
            for (node, workers) in &run.placement {
                let units = workers * run.per_worker;
                releases.by_node.book((end, *node, units), Booking::Add);
            }
            let units = run.admission.total_units();
            releases.by_job.book((end, units, job.queue), Booking::Add);
        }
        books
    }

    pub(crate) fn assert_booked(alloc: &Allocator) {
        let expected = rebuilt(alloc);
        for (res, releases) in &alloc.state.releases {
            let want = expected.get(res);
            assert_eq!(
                listed(&releases.by_node),
                want.map(|w| listed(&w.by_node)).unwrap_or_default()
            );
            assert_eq!(
                listed(&releases.by_job),
                want.map(|w| listed(&w.by_job)).unwrap_or_default()
            );
        }
        assert!(
            expected
                .keys()
                .all(|res| alloc.state.releases.contains_key(res))
        );
        let mut by_queue: Vec<(QueueIdx, ResourceIdx, JobIdx)> = alloc
            .state
            .running_by_queue
            .iter()
            .flat_map(|(&(queue, res), jobs)| jobs.iter().map(move |&j| (queue, res, j)))
            .collect();
        by_queue.sort_unstable();
        let mut running: Vec<(QueueIdx, ResourceIdx, JobIdx)> =
            JobIdx::enumerate(&alloc.state.jobs)
                .filter_map(|(idx, job)| {
                    let job = job.as_ref()?;
                    Some((job.queue, job.running()?.res, idx))
                })
                .collect();
        running.sort_unstable();
        assert_eq!(by_queue, running);
        // A job is listed by its own queue exactly while it is pending, with
        // what its spec and arrival say now.
        let mut listed: Vec<(QueueIdx, i32, LineEntry)> =
            QueueIdx::enumerate(&alloc.state.queues.queues)
                .flat_map(|(queue, q)| q.line.entries().map(move |(p, e)| (queue, p, *e)))
                .collect();
        listed.sort_unstable_by_key(|(queue, _, e)| (*queue, e.idx));
        let mut pending: Vec<(QueueIdx, i32, LineEntry)> = JobIdx::enumerate(&alloc.state.jobs)
            .filter_map(|(idx, job)| {
                let job = job.as_ref()?;
                matches!(job.state, JobState::Pending(_))
                    .then(|| (job.queue, job.spec.priority, LineEntry::of(idx, job)))
            })
            .collect();
        pending.sort_unstable_by_key(|(queue, _, e)| (*queue, e.idx));
        assert_eq!(listed, pending);
        // A job is nominated exactly while it waits for its victims.
        let waiting: BTreeSet<JobIdx> = JobIdx::enumerate(&alloc.state.jobs)
            .filter_map(|(idx, job)| {
                matches!(job.as_ref()?.state, JobState::Pending(Some(_))).then_some(idx)
            })
            .collect();
        assert_eq!(alloc.state.nominated, waiting);
    }

    #[test]
    pub(crate) fn the_release_book_follows_starts_preemptions_checkpoints_and_ends() {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
        for event in [node("n1"), node("n2"), queue("a"), queue("b")] {
            alloc.apply(event).expect("accepted");
        }
        for (i, estimate) in [Some(600), None, Some(60), Some(3600)]
            .into_iter()
            .enumerate()
        {
            let workers = if i == 0 { 3 } else { 1 };
            alloc
                .apply(job(&format!("b{i}"), "b", workers, estimate))
                .expect("accepted");
        }
        let out = alloc.cycle(Timestamp(10));
        assert_eq!(out.admissions.len(), 4);
        assert_booked(&alloc);
        alloc.apply(job("a0", "a", 4, None)).expect("accepted");
        let out = alloc.cycle(Timestamp(20));
        assert_eq!(out.preemptions.len(), 1, "a reclaims its quota");
        assert_booked(&alloc);
        let victim = out.preemptions[0].victims[0].uid.clone();
        alloc
            .apply(Event::JobCheckpointed { uid: victim })
            .expect("accepted");
        assert_booked(&alloc);
        alloc.cycle(Timestamp(30));
        assert_booked(&alloc);
        for uid in ["b2", "a0"] {
            alloc
                .apply(Event::JobFinished {
                    uid: JobUid::new(uid),
                })
                .expect("accepted");
            assert_booked(&alloc);
        }
        alloc.cycle(Timestamp(40));
        assert_booked(&alloc);
        assert!(
            alloc.state.releases.values().any(|r| r.by_job.len() > 0),
            "jobs still run"
        );
    }

    #[test]
    pub(crate) fn the_line_follows_edits_evictions_finishes_and_restores() {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
        for event in [node("n1"), node("n2"), queue("a"), queue("b")] {
            alloc.apply(event).expect("accepted");
        }
        for (uid, workers) in [("b0", 4), ("b1", 4), ("b2", 1)] {
            alloc.apply(job(uid, "b", workers, None)).expect("accepted");
        }
        assert_booked(&alloc);
        // Edits while pending: priority, size, estimate and queue.
        let mut edited = JobSpec {
            uid: JobUid::new("b1"),
            queue: Some("a".into()),
            num_workers: 1,
            gpus_per_worker: 2,
            priority: 5,
            runtime_estimate_secs: Some(60),
            ..JobSpec::default()
        };
        alloc
            .apply(Event::JobSubmitted(edited.clone()))
            .expect("accepted");
        assert_booked(&alloc);
        edited.queue = Some("b".into());
        edited.allow_gpu_sharing = true;
        alloc.apply(Event::JobSubmitted(edited)).expect("accepted");
        assert_booked(&alloc);
        let out = alloc.cycle(Timestamp(10));
        assert_eq!(out.admissions.len(), 3, "b borrows a's quota");
        assert_booked(&alloc);
        // Queue a reclaims its nominal quota: the victims go back in line.
        alloc.apply(job("a0", "a", 4, None)).expect("accepted");
        alloc.apply(job("a1", "a", 4, None)).expect("accepted");
        let out = alloc.cycle(Timestamp(20));
        assert_eq!(out.preemptions.len(), 1, "a reclaims its quota");
        assert_booked(&alloc);
        for victim in &out.preemptions[0].victims {
            alloc
                .apply(Event::JobCheckpointed {
                    uid: victim.uid.clone(),
                })
                .expect("accepted");
        }
        let out = alloc.cycle(Timestamp(30));
        assert!(!out.evictions.is_empty());
        assert_booked(&alloc);
        // An arrival gap (b2 ends) that a restore closes up.
        alloc.apply(job("b3", "b", 1, None)).expect("accepted");
        for uid in ["b2", "b3"] {
            alloc
                .apply(Event::JobFinished {
                    uid: JobUid::new(uid),
                })
                .expect("accepted");
            assert_booked(&alloc);
        }
        // A restore lists every pending job again, under its own arrival.
        let restored = Allocator::restore(alloc.snapshot()).expect("restores");
        assert_booked(&restored);
        for job in alloc.state.jobs.iter().flatten() {
            let again = restored.state.job_by_uid.get(&job.spec.uid).copied();
            assert_eq!(
                again.and_then(|i| restored.state.job(i)).map(|j| j.seq),
                Some(job.seq),
                "{} keeps its arrival",
                job.spec.uid
            );
        }
        // Slots differ after a restore: jobs are named by uid.
        let lines = |a: &Allocator| -> Vec<Vec<(i32, JobUid, LineEntry)>> {
            a.state
                .queues
                .queues
                .iter()
                .map(|q| {
                    q.line
                        .entries()
                        .map(|(p, e)| {
                            let uid = a.state.job(e.idx).map(|j| j.spec.uid.clone());
                            (
                                p,
                                uid.unwrap_or_default(),
                                LineEntry {
                                    idx: JobIdx::from(0),
                                    ..*e
                                },
                            )
                        })
                        .collect()
                })
                .collect()
        };
        assert_eq!(lines(&restored), lines(&alloc));
        assert!(
            lines(&alloc).iter().flatten().count() >= 2,
            "jobs still wait"
        );
    }

    pub(crate) fn claim(start: u64, need: u32, released: u32) -> Claim {
        Claim {
            start: Timestamp(start),
            need,
            released_by_start: released,
            holder: JobUid::new("big"),
        }
    }

    #[test]
    pub(crate) fn protection_covers_the_deficit_at_each_reserved_start() {
        let mut r = Reservations::default();
        // Needs 8 at t=100; 4 are released by then, so 4 of today's free
        // units must stay free for jobs still running at t=100.
        r.add(NodeIdx::from(0), ResourceIdx::from(0), claim(100, 8, 4));
        assert_eq!(r.protected(NodeIdx::from(0), ResourceIdx::from(0), None), 4);
        assert_eq!(
            r.protected(NodeIdx::from(0), ResourceIdx::from(0), Some(Timestamp(150))),
            4
        );
        // A job ending by t=100 is gone before the reservation starts.
        assert_eq!(
            r.protected(NodeIdx::from(0), ResourceIdx::from(0), Some(Timestamp(100))),
            0
        );
        // A second reservation at t=200 needing 4 more with 6 released by then.
        r.add(NodeIdx::from(0), ResourceIdx::from(0), claim(200, 4, 6));
        assert_eq!(r.protected(NodeIdx::from(0), ResourceIdx::from(0), None), 6);
        assert_eq!(
            r.protected(NodeIdx::from(0), ResourceIdx::from(0), Some(Timestamp(150))),
            4
        );
        assert_eq!(r.claimed_total(NodeIdx::from(0), ResourceIdx::from(0)), 12);
        assert_eq!(
            r.protected(NodeIdx::from(1), ResourceIdx::from(0), None),
            0,
            "other nodes are untouched"
        );
    }
}
