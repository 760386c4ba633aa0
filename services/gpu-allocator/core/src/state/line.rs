//! A queue's pending jobs in line order, kept across cycles.
//!
//! The line orders pending jobs by effective priority (priority plus the
//! queue's aging boost, highest first), then submission time, then arrival.
//! Aging never reorders jobs of the same base priority: the older one has
//! waited longer, so its boost is at least the younger one's. So a queue
//! keeps one run per base priority, sorted by (submission time, arrival)
//! once, on submission, and a cycle gets the line by merging the few runs
//! at its own time, instead of sorting every pending job again.
//!
//! An entry copies what the cycle reads of its job, so that walking the line
//! does not touch the job table; `Allocator::list` and `Allocator::unlist`
//! are the only writers, called wherever a job becomes or stops being pending
//! or its spec changes.
//!
//! Admitted jobs leave a run near its front, so taking each one out at once
//! moved the rest of the run (thousands of entries) every time. A removed
//! entry is only marked, and the run drops its marked entries in one pass
//! once they are an eighth of it.

use crate::ids::JobIdx;
use crate::state::jobs::Job;
use crate::types::Timestamp;

/// What the cycle reads of a pending job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineEntry {
    pub(crate) submitted_at: Timestamp,
    pub(crate) seq: u64,
    pub(crate) idx: JobIdx,
    pub(crate) units: u64,
    pub(crate) runtime_estimate_secs: Option<u64>,
    pub(crate) allow_gpu_sharing: bool,
    /// Asks for a GPU-memory slice (MIG) rather than whole or shared GPUs.
    pub(crate) sliced: bool,
    /// Its pods ask for something its queue's pod policy must allow.
    pub(crate) needs_permission: bool,
    /// False once removed from its line, until the run drops it.
    pub(crate) listed: bool,
}

impl LineEntry {
    pub(crate) fn of(idx: JobIdx, job: &Job) -> Self {
        LineEntry {
            submitted_at: job.spec.submitted_at,
            seq: job.seq,
            idx,
            units: job.spec.total_units(),
            runtime_estimate_secs: job.spec.runtime_estimate_secs,
            allow_gpu_sharing: job.spec.allow_gpu_sharing,
            sliced: job.spec.gpu_slice.is_some(),
            needs_permission: !job.spec.pod_requests.is_empty(),
            listed: true,
        }
    }

    fn arrival(&self) -> (Timestamp, u64) {
        (self.submitted_at, self.seq)
    }
}

/// The pending jobs of one base priority, by (submission time, arrival),
/// among `removed` entries no longer listed.
#[derive(Debug)]
struct PriorityRun {
    priority: i32,
    jobs: Vec<LineEntry>,
    removed: usize,
}

impl PriorityRun {
    fn listed(&self) -> usize {
        self.jobs.len() - self.removed
    }
}

/// One queue's pending jobs: a run per base priority, highest first.
#[derive(Debug, Default)]
pub(crate) struct QueueLine {
    runs: Vec<PriorityRun>,
}

impl QueueLine {
    /// The run of `priority`: `Ok` where it is, `Err` where it would go.
    fn run_of(&self, priority: i32) -> Result<usize, usize> {
        // Runs go highest priority first.
        self.runs.binary_search_by(|r| priority.cmp(&r.priority))
    }

    pub(crate) fn insert(&mut self, priority: i32, entry: LineEntry) {
        let at = match self.run_of(priority) {
            Ok(at) => at,
            Err(at) => {
                self.runs.insert(
                    at,
                    PriorityRun {
                        priority,
                        jobs: Vec::new(),
                        removed: 0,
                    },
                );
                at
            }
        };
        if let Some(run) = self.runs.get_mut(at) {
            let pos = run.jobs.partition_point(|e| e.arrival() < entry.arrival());
            let entry = LineEntry {
                listed: true,
                ..entry
            };
            // A job listed again (requeued) takes back its removed entry:
            // arrivals are unique, so no other job has that place.
            match run.jobs.get_mut(pos) {
                Some(slot) if !slot.listed && slot.arrival() == entry.arrival() => {
                    *slot = entry;
                    run.removed -= 1;
                }
                _ => run.jobs.insert(pos, entry),
            }
        }
    }

    /// Removes `entry`, listed under `priority`, if it is there.
    pub(crate) fn remove(&mut self, priority: i32, entry: &LineEntry) {
        let Ok(at) = self.run_of(priority) else {
            return;
        };
        let Some(run) = self.runs.get_mut(at) else {
            return;
        };
        let pos = run.jobs.partition_point(|e| e.arrival() < entry.arrival());
        match run.jobs.get_mut(pos) {
            Some(slot) if slot.listed && slot.idx == entry.idx => slot.listed = false,
            _ => return,
        }
        run.removed += 1;
        if run.listed() == 0 {
            self.runs.remove(at);
        } else if run.removed * 8 >= run.jobs.len() {
            run.jobs.retain(|e| e.listed);
            run.removed = 0;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.runs.iter().map(PriorityRun::listed).sum()
    }

    /// Every entry with its base priority, run by run.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = (i32, &LineEntry)> {
        self.runs.iter().flat_map(|r| {
            r.jobs
                .iter()
                .filter(|e| e.listed)
                .map(move |e| (r.priority, e))
        })
    }

    /// Calls `f` with each entry and its effective priority (its base
    /// priority plus `boost` of its submission time), in line order.
    pub(crate) fn in_order(
        &self,
        boost: impl Fn(Timestamp) -> i32,
        mut f: impl FnMut(i32, &LineEntry),
    ) {
        // Merge the runs. The run whose head is first goes on for as long as
        // its jobs stay ahead of the runner-up's head, which does not move
        // meanwhile: one comparison per job, and the heads are compared
        // again only when the line switches runs.
        let key = |run: &PriorityRun, e: &LineEntry| {
            let effective = run.priority.saturating_add(boost(e.submitted_at));
            ((std::cmp::Reverse(effective), e.arrival()), effective)
        };
        let mut next = vec![0usize; self.runs.len()];
        loop {
            let mut first: Option<(usize, _)> = None;
            let mut runner_up = None;
            for (r, (run, from)) in self.runs.iter().zip(&mut next).enumerate() {
                let unlisted = run.jobs.get(*from..).unwrap_or_default();
                *from += unlisted.iter().take_while(|e| !e.listed).count();
                let Some(e) = run.jobs.get(*from) else {
                    continue;
                };
                let (k, _) = key(run, e);
                match first {
                    Some((_, best)) if best < k => {
                        if runner_up.is_none_or(|second| k < second) {
                            runner_up = Some(k);
                        }
                    }
                    _ => {
                        runner_up = first.map(|(_, best)| best);
                        first = Some((r, k));
                    }
                }
            }
            let Some((r, _)) = first else {
                return;
            };
            let (Some(run), Some(from)) = (self.runs.get(r), next.get_mut(r)) else {
                return;
            };
            for e in run.jobs.get(*from..).unwrap_or_default() {
                if !e.listed {
                    *from += 1;
                    continue;
                }
                let (k, effective) = key(run, e);
                if runner_up.is_some_and(|second| second < k) {
                    break;
                }
                f(effective, e);
                *from += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(idx: JobIdx, submitted_at: u64, seq: u64) -> LineEntry {
        LineEntry {
            submitted_at: Timestamp(submitted_at),
            seq,
            idx,
            units: 1,
            runtime_estimate_secs: None,
            allow_gpu_sharing: false,
            sliced: false,
            needs_permission: false,
            listed: true,
        }
    }

    /// Job slots and effective priorities, in line order.
    fn order(line: &QueueLine, boost: impl Fn(Timestamp) -> i32) -> Vec<(u32, i32)> {
        let mut out = Vec::new();
        line.in_order(boost, |p, e| out.push((e.idx.number(), p)));
        out
    }

    #[test]
    fn runs_merge_by_effective_priority_then_submission_then_arrival() {
        let mut line = QueueLine::default();
        // Inserted out of order: the line sorts them.
        line.insert(0, entry(JobIdx::from(1), 100, 5));
        line.insert(0, entry(JobIdx::from(0), 0, 9));
        line.insert(10, entry(JobIdx::from(2), 200, 2));
        line.insert(0, entry(JobIdx::from(3), 100, 4));
        line.insert(10, entry(JobIdx::from(4), 300, 1));
        assert_eq!(line.len(), 5);
        // No aging: priority first.
        assert_eq!(
            order(&line, |_| 0),
            vec![(2, 10), (4, 10), (0, 0), (3, 0), (1, 0)]
        );
        // One point of boost per 100 s waited, at t = 1,000.
        let boost = |t: Timestamp| i32::try_from((1_000 - t.0) / 100).unwrap_or(i32::MAX);
        // Effective: job 0 10, job 3 9, job 1 9, job 2 18, job 4 17.
        assert_eq!(
            order(&line, boost),
            vec![(2, 18), (4, 17), (0, 10), (3, 9), (1, 9)]
        );
        // Aging past a higher priority: 20 points per 100 s.
        let steep = |t: Timestamp| i32::try_from((1_000 - t.0) / 100 * 20).unwrap_or(i32::MAX);
        // Effective: job 0 200, 3 and 1 180, 2 170, 4 150.
        assert_eq!(
            order(&line, steep),
            vec![(0, 200), (3, 180), (1, 180), (2, 170), (4, 150)]
        );
    }

    #[test]
    fn the_merge_gives_the_order_of_a_full_sort() {
        for seed in 1..=200u64 {
            let mut rng = crate::testing::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut line = QueueLine::default();
            let mut all = Vec::new();
            let priorities = [0, 1, 5, 100, -3];
            let runs = 1 + rng.below(priorities.len() as u64) as usize;
            for seq in 0..rng.below(60) {
                let priority = priorities[rng.below(runs as u64) as usize];
                let e = entry(JobIdx::from(seq as u32), rng.below(5_000), seq);
                line.insert(priority, e);
                all.push((priority, e));
            }
            // Aging as configured: a step per interval, capped.
            let (interval, step, cap) = (1 + rng.below(900), 1 + rng.below(20), rng.below(300));
            let boost = |t: Timestamp| {
                i32::try_from(((5_000 - t.0) / interval * step).min(cap)).unwrap_or(i32::MAX)
            };
            let mut sorted: Vec<_> = all
                .iter()
                .map(|(p, e)| {
                    (
                        std::cmp::Reverse(p + boost(e.submitted_at)),
                        e.arrival(),
                        e.idx,
                    )
                })
                .collect();
            sorted.sort_unstable();
            let expected: Vec<(u32, i32)> = sorted
                .into_iter()
                .map(|(std::cmp::Reverse(effective), _, idx)| (idx.number(), effective))
                .collect();
            assert_eq!(order(&line, boost), expected, "seed {seed}");
        }
    }

    #[test]
    fn removed_entries_leave_the_order_and_a_relisted_job_gets_its_place_back() {
        let mut line = QueueLine::default();
        for seq in 0..20u64 {
            line.insert(0, entry(JobIdx::from(seq as u32), 100 + seq, seq));
        }
        // Fewer than an eighth: marked, not yet dropped.
        line.remove(0, &entry(JobIdx::from(0), 100, 0));
        line.remove(0, &entry(JobIdx::from(5), 105, 5));
        assert_eq!(line.len(), 18);
        assert_eq!(line.runs.first().map(|r| r.jobs.len()), Some(20));
        let ids = |line: &QueueLine| -> Vec<u32> {
            order(line, |_| 0).into_iter().map(|(i, _)| i).collect()
        };
        assert!(!ids(&line).contains(&0) && !ids(&line).contains(&5));
        // Requeued: back in its place, in the entry it left.
        line.insert(0, entry(JobIdx::from(5), 105, 5));
        assert_eq!(line.len(), 19);
        assert_eq!(line.runs.first().map(|r| r.jobs.len()), Some(20));
        assert_eq!(ids(&line).get(4), Some(&5));
        // An eighth removed (3 of 20): the run drops them.
        line.remove(0, &entry(JobIdx::from(1), 101, 1));
        line.remove(0, &entry(JobIdx::from(2), 102, 2));
        assert_eq!(line.runs.first().map(|r| r.jobs.len()), Some(17));
        assert_eq!(line.len(), 17);
        assert_eq!(ids(&line), (3..20).collect::<Vec<_>>());
    }

    #[test]
    fn removal_needs_the_listed_fields_and_drops_empty_runs() {
        let mut line = QueueLine::default();
        line.insert(0, entry(JobIdx::from(1), 100, 1));
        line.insert(5, entry(JobIdx::from(2), 100, 2));
        line.remove(0, &entry(JobIdx::from(7), 100, 1));
        assert_eq!(line.len(), 2, "another job's slot");
        line.remove(5, &entry(JobIdx::from(1), 100, 1));
        assert_eq!(line.len(), 2, "another priority");
        line.remove(0, &entry(JobIdx::from(1), 100, 1));
        line.remove(0, &entry(JobIdx::from(1), 100, 1));
        assert_eq!(line.len(), 1, "removed once");
        assert_eq!(line.entries().count(), 1);
        line.remove(5, &entry(JobIdx::from(2), 100, 2));
        assert_eq!(line.len(), 0);
        assert!(line.runs.is_empty());
    }
}
