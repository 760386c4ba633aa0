//! Expected releases of the running jobs, per resource: when each job is
//! expected to end and what it gives back, kept sorted across cycles as
//! jobs start, stop and change their expected end.

use crate::config::AllocatorConfig;
use crate::ids::{JobIdx, NodeIdx, QueueIdx, ResourceIdx};
use crate::state::State;
use crate::state::jobs::{Job, JobState, PreemptingState, Running};
use crate::types::Timestamp;

/// Expected releases `(end, node, units)` of the jobs running in one
/// resource, sorted by end.
pub(crate) type Timeline = Vec<(Timestamp, NodeIdx, u32)>;

/// The expected releases of the jobs running in one resource, kept sorted
/// from one cycle to the next as jobs start, stop and change their expected
/// end: a cycle copies them rather than visiting every running job and
/// sorting. Ends are kept as planned, before a cycle raises the past ones
/// to its `now`; the copy stays in time order, and every reader takes the
/// events of one time as a group, so their order within it does not matter.
#[derive(Debug, Default)]
pub(crate) struct ReleaseBook {
    /// `(end, node, units)` per node of each running job.
    pub(crate) by_node: EventBag<(Timestamp, NodeIdx, u32)>,
    /// `(end, units, queue)` per running job.
    pub(crate) by_job: EventBag<(Timestamp, u64, QueueIdx)>,
}

/// Events in order, repeats kept. A start or stop goes into a small sorted
/// buffer of events added or removed, merged into the rest when read (every
/// read copies anyway) and into the rest itself once the buffers reach a
/// sixteenth of it. In one sorted vector each start or stop moved every
/// later event (tens of thousands), dozens of times a cycle.
#[derive(Debug)]
pub(crate) struct EventBag<T> {
    pub(crate) settled: Vec<T>,
    pub(crate) added: Vec<T>,
    /// Events of `settled` taken out.
    pub(crate) removed: Vec<T>,
}

impl<T> Default for EventBag<T> {
    fn default() -> Self {
        EventBag {
            settled: Vec::new(),
            added: Vec::new(),
            removed: Vec::new(),
        }
    }
}

/// Buffered changes that always wait for a read, however small the bag.
const BAG_BUFFER_MIN: usize = 64;

impl<T: Ord + Copy> EventBag<T> {
    pub(crate) fn book(&mut self, event: T, booking: Booking) {
        // A buffered change of the other kind is undone first: adding back
        // an event removed since the last settling, or removing one added
        // since. An event that is not there is not removed.
        match booking {
            Booking::Add => match self.removed.binary_search(&event) {
                Ok(at) => {
                    self.removed.remove(at);
                }
                Err(_) => insert_one(&mut self.added, event),
            },
            Booking::Remove => match self.added.binary_search(&event) {
                Ok(at) => {
                    self.added.remove(at);
                }
                Err(_) if count(&self.settled, &event) > count(&self.removed, &event) => {
                    insert_one(&mut self.removed, event);
                }
                Err(_) => {}
            },
        }
        if self.added.len() + self.removed.len() > BAG_BUFFER_MIN.max(self.settled.len() / 16) {
            let mut settled = Vec::with_capacity(self.len());
            self.merged(|e| settled.push(e));
            self.settled = settled;
            self.added.clear();
            self.removed.clear();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.settled.len() + self.added.len() - self.removed.len()
    }

    /// Calls `each` with the events in order: the settled ones a stretch
    /// at a time, between the places of the buffered changes.
    pub(crate) fn merged(&self, mut each: impl FnMut(T)) {
        let (mut rest, mut added, mut removed) =
            (&self.settled[..], &self.added[..], &self.removed[..]);
        loop {
            let added_first = match (added.first(), removed.first()) {
                (Some(a), Some(r)) => a <= r,
                (a, _) => a.is_some(),
            };
            if let (true, Some((&a, more))) = (added_first, added.split_first()) {
                let (before, after) = rest.split_at(rest.partition_point(|e| *e <= a));
                before.iter().copied().for_each(&mut each);
                each(a);
                (rest, added) = (after, more);
            } else if let Some((&r, more)) = removed.split_first() {
                let (before, after) = rest.split_at(rest.partition_point(|e| *e < r));
                before.iter().copied().for_each(&mut each);
                rest = after.strip_prefix(&[r]).unwrap_or(after);
                removed = more;
            } else {
                rest.iter().copied().for_each(each);
                return;
            }
        }
    }

    /// The events in order, mapped by `f`: a cycle's copy, with room for
    /// the events its admissions add (growing a copy of every running job's
    /// events at the cycle's first admission cost as much again as making
    /// it).
    fn copy_with_room<U>(&self, f: impl Fn(T) -> U) -> Vec<U> {
        let mut copy = Vec::with_capacity(self.len() + CYCLE_ROOM);
        self.merged(|e| copy.push(f(e)));
        copy
    }
}

/// Inserts `event` into `sorted`, keeping it sorted.
pub(crate) fn insert_one<T: Ord>(sorted: &mut Vec<T>, event: T) {
    let at = sorted.partition_point(|e| *e < event);
    sorted.insert(at, event);
}

/// How many times `event` is in `sorted`.
fn count<T: Ord>(sorted: &[T], event: &T) -> usize {
    sorted.partition_point(|e| e <= event) - sorted.partition_point(|e| e < event)
}

/// Whether a job's releases join or leave its resource's book.
#[derive(Clone, Copy)]
pub(crate) enum Booking {
    Add,
    Remove,
}

/// Events a cycle's copy of a resource's releases has room for beyond the
/// running jobs' (see `EventBag::copy_with_room`).
const CYCLE_ROOM: usize = 1024;

/// Inserts `batch` into sorted `events`, keeping them sorted. A gang's
/// events go in with every element of `events` moved at most once: one
/// insert per event moved the tail (tens of thousands of events) once per
/// node of the gang.
pub(crate) fn insert_sorted<T: Ord + Copy>(events: &mut Vec<T>, batch: &mut [T]) {
    let Some(&first) = batch.first() else { return };
    batch.sort_unstable();
    let old = events.len();
    events.resize(old + batch.len(), first);
    // From the largest: each event's place among the old events not yet
    // moved, the block after it moved up past the events still to insert.
    let mut end = old;
    for (before, &event) in batch.iter().enumerate().rev() {
        let at = events
            .get(..end)
            .map_or(0, |old| old.partition_point(|e| *e < event));
        events.copy_within(at..end, at + before + 1);
        if let Some(slot) = events.get_mut(at + before) {
            *slot = event;
        }
        end = at;
    }
}

/// When a running job is expected to release its units, before the cycle's
/// `now` raises an end already past.
pub(crate) fn planned_end(config: &AllocatorConfig, job: &Job, run: &Running) -> Timestamp {
    match &run.preempting {
        Some(p) if p.checkpointed => Timestamp(0),
        Some(p) => p.evict_at,
        None => run.admitted_at.plus_secs(
            job.spec
                .runtime_estimate_secs
                .unwrap_or(config.backfill.assumed_runtime_secs),
        ),
    }
}

impl State {
    /// When a running job is expected to release its units.
    pub(crate) fn expected_end(&self, job: JobIdx, now: Timestamp) -> Timestamp {
        let Some(j) = self.job(job) else { return now };
        let JobState::Running(run) = &j.state else {
            return now;
        };
        planned_end(&self.config, j, run).max(now)
    }

    /// Adds or removes the releases of job `idx` in its resource's book (a
    /// no-op unless it runs). Called on every start and stop, and around
    /// every change of its expected end.
    pub(crate) fn book_releases(&mut self, idx: JobIdx, booking: Booking) {
        let Some(job) = self.jobs.get(idx.slot()).and_then(Option::as_ref) else {
            return;
        };
        let Some(run) = job.running() else { return };
        let end = planned_end(&self.config, job, run);
        let releases = self.releases.entry(run.res).or_default();
        for (node, workers) in &run.placement {
            let units = workers.saturating_mul(run.per_worker);
            releases.by_node.book((end, *node, units), booking);
        }
        releases
            .by_job
            .book((end, run.admission.total_units(), job.queue), booking);
    }

    /// Changes the preemption state of running job `idx`, keeping its
    /// releases booked at its new expected end. `None` if it does not run.
    pub(crate) fn update_preempting<R>(
        &mut self,
        idx: JobIdx,
        change: impl FnOnce(&mut Option<PreemptingState>) -> R,
    ) -> Option<R> {
        self.book_releases(idx, Booking::Remove);
        let changed = match self.job_mut(idx) {
            Some(Job {
                state: JobState::Running(run),
                ..
            }) => Some(change(&mut run.preempting)),
            _ => None,
        };
        self.book_releases(idx, Booking::Add);
        changed
    }

    /// Release events `(end, node, units)` of jobs running in `res`, in
    /// time order.
    pub(crate) fn release_timeline(&self, res: ResourceIdx, now: Timestamp) -> Timeline {
        self.releases.get(&res).map_or_else(Vec::new, |r| {
            r.by_node
                .copy_with_room(|(end, node, units)| (end.max(now), node, units))
        })
    }

    /// `(end, units, queue)` of each job running in `res`, in time order,
    /// ends raised to `now`.
    pub(crate) fn job_releases_in<U>(
        &self,
        res: ResourceIdx,
        now: Timestamp,
        f: impl Fn((Timestamp, u64, QueueIdx)) -> U,
    ) -> Vec<U> {
        self.releases.get(&res).map_or_else(Vec::new, |r| {
            r.by_job
                .copy_with_room(|(end, units, queue)| f((end.max(now), units, queue)))
        })
    }

    /// Calls `each` with the release events `(end, node, units)` of one job,
    /// if it runs in `res`.
    pub(crate) fn job_releases(
        &self,
        job: JobIdx,
        res: ResourceIdx,
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
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bag's events in order, checked against its count.
    pub(crate) fn listed<T: Ord + Copy>(bag: &EventBag<T>) -> Vec<T> {
        let events = bag.copy_with_room(|e| e);
        assert_eq!(events.len(), bag.len());
        events
    }

    #[test]
    fn an_event_bag_holds_what_one_sorted_vector_would() {
        // A small LCG: many batches, events with repeats among the booked ones.
        let mut state = 7u64;
        let mut next = |bound: u64| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % bound
        };
        let mut bag: EventBag<(u64, u32)> = EventBag::default();
        let mut single: Vec<(u64, u32)> = Vec::new();
        let mut booked: Vec<Vec<(u64, u32)>> = Vec::new();
        let mut settlings = 0;
        for round in 0..600 {
            if round % 3 == 2 && !booked.is_empty() {
                let gone = booked.swap_remove(next(booked.len() as u64) as usize);
                for e in &gone {
                    if let Ok(at) = single.binary_search(e) {
                        single.remove(at);
                    }
                    bag.book(*e, Booking::Remove);
                }
            } else if round % 5 == 4 && !booked.is_empty() {
                // A new expected end: out and back in, as `update_preempting`.
                let again = booked.get(next(booked.len() as u64) as usize).cloned();
                for e in again.unwrap_or_default() {
                    bag.book(e, Booking::Remove);
                    bag.book(e, Booking::Add);
                }
            } else {
                // One event per node: distinct within the batch.
                let end = next(20);
                let mut nodes: Vec<u32> = (0..1 + next(12)).map(|_| next(40) as u32).collect();
                nodes.sort_unstable();
                nodes.dedup();
                for n in nodes {
                    let at = single.partition_point(|x| *x < (end, n));
                    single.insert(at, (end, n));
                    bag.book((end, n), Booking::Add);
                    booked.push(vec![(end, n)]);
                }
            }
            if bag.added.is_empty() && bag.removed.is_empty() {
                settlings += 1;
            }
            assert_eq!(listed(&bag), single, "round {round}");
        }
        // Removing an event that is not there changes nothing.
        let before = listed(&bag);
        bag.book((99, 99), Booking::Remove);
        if let Some(&first) = before.first() {
            for _ in 0..=count(&before, &first) {
                bag.book(first, Booking::Remove);
            }
        }
        let first_gone: Vec<_> = before
            .iter()
            .filter(|e| Some(*e) != before.first())
            .copied()
            .collect();
        assert_eq!(listed(&bag), first_gone);
        assert!(
            single.windows(2).any(|w| w[0] == w[1]),
            "repeats were booked"
        );
        assert!(settlings > 3, "the buffers were settled ({settlings})");
    }
}
