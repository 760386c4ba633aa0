//! The speed layer: answers a cycle keeps so that jobs answered alike are
//! answered once. The passes reach it only through `lookup_*` and
//! `record_*` on [`CycleMemo`]; each entry stands for exactly what a full
//! evaluation would decide (the test
//! `the_quota_shortcut_decides_as_a_full_evaluation` runs seeded cycles with
//! and without the quota shortcut). What outlives a cycle ([`Memo`]) is only
//! looked up by key, never iterated, so it cannot change a decision.

use std::rc::Rc;
use std::sync::Arc;

use crate::cycle::quota_holds::CohortRelease;
use crate::cycle::quota_holds::HoldAges;
use crate::ids::{FastMap, FilterIdx, JobIdx, QueueIdx, ReasonIdx, ResourceIdx};
use crate::pending::PendingReason;
use crate::state::jobs::Gang;
use crate::state::releases::Timeline;
use crate::types::GpuSliceRequest;

/// Kept from one cycle to the next.
#[derive(Default)]
pub(crate) struct Memo {
    /// The last cycle's quota-shortcut failures, emptied: regrown from
    /// nothing, they cost 1.5 % of a cycle's instructions. Only looked up by
    /// key, never iterated, so their room cannot change a decision. (Maps
    /// that are iterated start empty each cycle, as after a restart: reusing
    /// them all changed decisions through their iteration order.)
    pub(crate) spare_quota_blocked: QuotaBlockedShapes,
    /// `slots_when_empty` as the last cycle left it, with the
    /// `Inventory::node_changes` it was worked out at: it depends on the
    /// nodes alone, and walking them all for each reason took a fifth of
    /// a cycle where CPU binds. Only looked up by key.
    pub(crate) spare_empty_slots: (u64, EmptySlots),
    /// Which pending jobs no node could ever hold, as the last cycle left it.
    pub(crate) spare_fits: FitVerdicts,
}

/// A job's fit verdict: some node could hold it.
pub(crate) const FITS: u32 = u32::MAX;

/// What a fit verdict depends on besides the nodes and the queues: the
/// job's queue and what picks its resources there (GPU sharing, a MIG
/// request), what each worker asks and the job's node filter. Jobs alike in
/// these share one verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FitKey {
    pub(crate) queue: QueueIdx,
    pub(crate) sharing: bool,
    pub(crate) slice: Option<GpuSliceRequest>,
    pub(crate) gang: Gang,
    pub(crate) filter: FilterIdx,
}

/// Whether any node could ever hold each pending job (see
/// `Allocator::unschedulable`), kept from cycle to cycle while no node and
/// no queue changes (`at`): it depends on the job, its queue and the nodes
/// alone, so a job is judged once per change rather than every cycle. Only
/// looked up by key, never iterated.
#[derive(Default)]
pub(crate) struct FitVerdicts {
    /// (`Inventory::node_changes`, `Queues::changes`) they hold at.
    at: (u64, u64),
    /// By job slot: `NOT_JUDGED`, or its verdict as `stored` keeps it. Four bytes a job: the main pass
    /// reads it for every pending job. A slot is forgotten whenever a job is
    /// submitted into it (`Allocator::apply`), so a reused slot is judged anew.
    by_job: Vec<u32>,
    /// Verdicts by what they depend on.
    by_shape: FastMap<FitKey, u32>,
    /// Why the jobs no node could hold wait.
    never: Vec<Arc<PendingReason>>,
    /// Each of `never` in this cycle's table of reasons, once a job used it.
    in_cycle: Vec<Option<ReasonIdx>>,
}

impl FitVerdicts {
    /// Forgets job slot `idx`'s verdict: a job was submitted into it, or
    /// its spec changed.
    pub(crate) fn forget_job(&mut self, idx: JobIdx) {
        if let Some(slot) = self.by_job.get_mut(idx.slot()) {
            *slot = NOT_JUDGED;
        }
    }
}

/// A job slot's entry before its job is judged.
const NOT_JUDGED: u32 = 0;

/// A verdict as `FitVerdicts::by_job` stores it: [`FITS`] as 1, a reason's
/// index `i` as `i + 2`.
fn stored(verdict: u32) -> u32 {
    if verdict == FITS {
        1
    } else {
        verdict.saturating_add(2)
    }
}

/// Placement-failure memo key: jobs with the same shape and node filter fail
/// alike within a cycle, because capacity only shrinks during a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MemoKey {
    pub(crate) res: ResourceIdx,
    pub(crate) gang: Gang,
    pub(crate) filter: FilterIdx,
}

/// (queue, resource, requested, used, available, a hold is involved).
pub(crate) type QuotaMemoKey = (QueueIdx, ResourceIdx, u64, u64, u64, bool);

/// What a victim search depends on, besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PreemptionKey {
    pub(crate) queue: QueueIdx,
    pub(crate) priority: i32,
    pub(crate) gang: Gang,
    pub(crate) filter: FilterIdx,
    pub(crate) sharing: bool,
    pub(crate) slice: Option<GpuSliceRequest>,
}

pub(crate) struct MemoEntry {
    /// Smallest job end (u64::MAX = no estimate) known to fail; jobs ending
    /// later see at least as much reservation protection, so fail too.
    pub(crate) min_failing_end: u64,
    pub(crate) reason: ReasonIdx,
}

/// Failures of jobs evaluated before the main pass (they held a
/// reservation), each taken back at its job's place in line. A bit per job
/// says whether to look: the pass asks for nearly every pending job, and the
/// map holds a handful.
#[derive(Default)]
pub(crate) struct EarlyFailures {
    pub(crate) by_job: FastMap<JobIdx, (ReasonIdx, bool)>,
    /// Bit `idx % 64` of word `idx / 64` is set for each job in `by_job`.
    pub(crate) marked: Vec<u64>,
}

impl EarlyFailures {
    pub(crate) fn insert(&mut self, idx: JobIdx, failure: (ReasonIdx, bool)) {
        let word = idx.slot() / 64;
        if self.marked.len() <= word {
            self.marked.resize(word + 1, 0);
        }
        if let Some(bits) = self.marked.get_mut(word) {
            *bits |= 1 << (idx.slot() % 64);
        }
        self.by_job.insert(idx, failure);
    }

    pub(crate) fn take(&mut self, idx: JobIdx) -> Option<(ReasonIdx, bool)> {
        let marked = self
            .marked
            .get(idx.slot() / 64)
            .is_some_and(|bits| bits >> (idx.slot() % 64) & 1 == 1);
        if marked {
            self.by_job.remove(&idx)
        } else {
            None
        }
    }
}

/// `Allocator::slots_when_empty` by (resource, node filter, worker shape
/// with no count of workers).
pub(crate) type EmptySlots = FastMap<(ResourceIdx, FilterIdx, Gang), u64>;

/// Failures kept per shape (see `CycleCtx::quota_blocked`). Two spans are
/// common, jobs that no hold lets through and jobs that some do; with four,
/// jobs between two holds' times find theirs too (a tenth fewer full
/// evaluations on the gang-heavy benchmark; eight find barely more).
pub(crate) const SHAPE_SLOTS: usize = 4;

/// A quota failure on every option, reusable by jobs of the same shape.
pub(crate) struct QuotaBlocked {
    pub(crate) epoch: u64,
    pub(crate) reason: ReasonIdx,
    pub(crate) can_preempt: bool,
    /// The latest time a quota hold lets jobs ending by then through; a job
    /// with an earlier estimated end may be let through, so it is evaluated
    /// in full. `None`: no hold exempts anyone.
    pub(crate) exempt_until: Option<u64>,
    /// The earliest time a hold that let the failed job through lets jobs
    /// ending by then through: a job ending later is held back more, so it
    /// is evaluated in full. `None`: no hold let it through.
    pub(crate) passes_until: Option<u64>,
}

/// What the quota shortcut (`quota_blocked_like`) compares of a job.
#[derive(Clone, Copy)]
pub(crate) struct QuotaShape {
    /// Estimated end, as `estimated_end` gives it.
    pub(crate) end: u64,
    pub(crate) units: u32,
    pub(crate) sharing: bool,
    pub(crate) ages: HoldAges,
}

/// The failures of `CycleCtx::quota_blocked`, by shape key. The keys sit
/// apart from the failures: the pass looks a key up for nearly every
/// pending job, and a few hundred keys stay in cache where the failures
/// beside them (four slots each) did not.
#[derive(Default)]
pub(crate) struct QuotaBlockedShapes {
    pub(crate) at: FastMap<u64, u32>,
    pub(crate) failures: Vec<[Option<QuotaBlocked>; SHAPE_SLOTS]>,
}

impl QuotaBlockedShapes {
    pub(crate) fn clear(&mut self) {
        self.at.clear();
        self.failures.clear();
    }

    pub(crate) fn get(&self, key: u64) -> Option<&[Option<QuotaBlocked>; SHAPE_SLOTS]> {
        let at = *self.at.get(&key)?;
        self.failures.get(at as usize)
    }

    pub(crate) fn slots_mut(
        &mut self,
        key: u64,
    ) -> Option<&mut [Option<QuotaBlocked>; SHAPE_SLOTS]> {
        let at = match self.at.entry(key) {
            std::collections::hash_map::Entry::Occupied(known) => *known.get(),
            std::collections::hash_map::Entry::Vacant(new) => {
                let at = *new.insert(u32::try_from(self.failures.len()).ok()?);
                self.failures.push(Default::default());
                at
            }
        };
        self.failures.get_mut(at as usize)
    }
}

impl Memo {
    /// The memo a cycle starts with, at the inventory's `node_changes`.
    pub(crate) fn start_cycle(&mut self, node_changes: u64, queue_changes: u64) -> CycleMemo {
        let (at, empty_slots) = std::mem::take(&mut self.spare_empty_slots);
        let mut fits = std::mem::take(&mut self.spare_fits);
        if fits.at != (node_changes, queue_changes) {
            fits = FitVerdicts {
                at: (node_changes, queue_changes),
                ..FitVerdicts::default()
            };
        }
        fits.in_cycle.iter_mut().for_each(|r| *r = None);
        CycleMemo {
            fits,
            quota_blocked: std::mem::take(&mut self.spare_quota_blocked),
            empty_slots: if at == node_changes {
                empty_slots
            } else {
                EmptySlots::default()
            },
            ..CycleMemo::default()
        }
    }

    /// Keeps what the next cycle may reuse of the one that ended.
    pub(crate) fn end_cycle(&mut self, mut memo: CycleMemo, node_changes: u64) {
        memo.quota_blocked.clear();
        self.spare_quota_blocked = memo.quota_blocked;
        self.spare_empty_slots = (node_changes, memo.empty_slots);
        self.spare_fits = memo.fits;
    }
}

/// One cycle's memo.
#[derive(Default)]
pub(crate) struct CycleMemo {
    /// Placement failures by job shape and node filter: capacity only
    /// shrinks during a cycle.
    placement_failures: FastMap<MemoKey, MemoEntry>,
    /// Quota reasons, shared by the jobs of one queue blocked alike.
    quota_reasons: FastMap<QuotaMemoKey, ReasonIdx>,
    /// Jobs blocked by quota on every option, by (queue, shares GPUs,
    /// units, hold ages) packed (`HoldAges::shape_key`): up to
    /// `SHAPE_SLOTS` failures, each standing for the jobs whose estimated
    /// end falls in its own span between the holds' times
    /// (`QuotaBlocked::exempt_until` and `passes_until`). Another job of
    /// that shape, those ages and an end in one of the spans fails alike
    /// within the queue's epoch.
    quota_blocked: QuotaBlockedShapes,
    /// `slots_when_empty` per (resource, node filter, worker shape), kept
    /// from cycle to cycle while no node changes.
    empty_slots: EmptySlots,
    /// Which jobs no node could ever hold, kept from cycle to cycle while
    /// no node or queue changes.
    fits: FitVerdicts,
    /// Release timelines per resource, until an admission in it changes them.
    timelines: FastMap<ResourceIdx, Rc<Timeline>>,
    /// Expected releases per resource for the cohort pools and queues (see
    /// `quota_release_time`).
    cohort_releases: FastMap<ResourceIdx, Vec<CohortRelease>>,
}

impl CycleMemo {
    /// The reason a job of this shape and filter failed placement with, if
    /// one ending no earlier than `end_key` failed: jobs ending later see at
    /// least as much reservation protection.
    pub(crate) fn lookup_placement_failure(
        &self,
        key: &MemoKey,
        end_key: u64,
    ) -> Option<ReasonIdx> {
        self.placement_failures
            .get(key)
            .filter(|entry| entry.min_failing_end <= end_key)
            .map(|entry| entry.reason)
    }

    /// Records a placement failure of a job ending at `end_key`.
    pub(crate) fn record_placement_failure(
        &mut self,
        key: MemoKey,
        end_key: u64,
        reason: ReasonIdx,
    ) {
        let entry = self.placement_failures.entry(key).or_insert(MemoEntry {
            min_failing_end: end_key,
            reason,
        });
        if end_key < entry.min_failing_end {
            entry.min_failing_end = end_key;
            entry.reason = reason;
        }
    }

    pub(crate) fn lookup_quota_reason(&self, key: &QuotaMemoKey) -> Option<ReasonIdx> {
        self.quota_reasons.get(key).copied()
    }

    pub(crate) fn record_quota_reason(&mut self, key: QuotaMemoKey, reason: ReasonIdx) {
        self.quota_reasons.insert(key, reason);
    }

    /// The failure of an earlier job of the same shape blocked by quota on
    /// every option, when it holds for this job too (`epoch`: its queue's).
    pub(crate) fn lookup_quota_blocked(
        &self,
        queue: QueueIdx,
        shape: QuotaShape,
        epoch: u64,
    ) -> Option<(ReasonIdx, bool)> {
        let key = shape
            .ages
            .shape_key(queue, shape.sharing, u64::from(shape.units))?;
        // Each failure stands for the jobs whose end falls in its span.
        self.quota_blocked
            .get(key)?
            .iter()
            .flatten()
            .find_map(|known| {
                let exempt = shape.end != u64::MAX
                    && known.exempt_until.is_some_and(|until| shape.end <= until);
                let passes_alike = known.passes_until.is_none_or(|until| shape.end <= until);
                (known.epoch == epoch && !exempt && passes_alike)
                    .then_some((known.reason, known.can_preempt))
            })
    }

    /// Records a quota failure on every option under shape `key`: in the
    /// slot of a failure of the same span or a stale one, else the last.
    pub(crate) fn record_quota_blocked(&mut self, key: u64, failure: QuotaBlocked) {
        let Some(known) = self.quota_blocked.slots_mut(key) else {
            return;
        };
        let at = known
            .iter()
            .position(|k| {
                k.as_ref().is_none_or(|k| {
                    k.epoch != failure.epoch
                        || (k.exempt_until, k.passes_until)
                            == (failure.exempt_until, failure.passes_until)
                })
            })
            .unwrap_or(SHAPE_SLOTS - 1);
        if let Some(slot) = known.get_mut(at) {
            *slot = Some(failure);
        }
    }

    pub(crate) fn lookup_empty_slots(&self, key: &(ResourceIdx, FilterIdx, Gang)) -> Option<u64> {
        self.empty_slots.get(key).copied()
    }

    pub(crate) fn record_empty_slots(&mut self, key: (ResourceIdx, FilterIdx, Gang), slots: u64) {
        self.empty_slots.insert(key, slots);
    }

    /// Job `idx`'s fit verdict, if it was judged.
    pub(crate) fn lookup_fit(&self, idx: JobIdx) -> Option<u32> {
        match self.fits.by_job.get(idx.slot()).copied() {
            None | Some(NOT_JUDGED) => None,
            Some(1) => Some(FITS),
            Some(at) => Some(at - 2),
        }
    }

    pub(crate) fn record_fit(&mut self, idx: JobIdx, verdict: u32) {
        let at = idx.slot();
        if self.fits.by_job.len() <= at {
            self.fits.by_job.resize(at + 1, NOT_JUDGED);
        }
        if let Some(slot) = self.fits.by_job.get_mut(at) {
            *slot = stored(verdict);
        }
    }

    /// The verdict of jobs alike in `key`, if one was judged.
    pub(crate) fn lookup_fit_shape(&self, key: &FitKey) -> Option<u32> {
        self.fits.by_shape.get(key).copied()
    }

    /// Records the verdict of jobs alike in `key`: `never`, why no node could
    /// hold them, or none. Returns the verdict.
    pub(crate) fn record_fit_shape(&mut self, key: FitKey, never: Option<PendingReason>) -> u32 {
        let verdict = match never {
            Some(reason) => {
                let at = u32::try_from(self.fits.never.len()).unwrap_or(FITS - 1);
                self.fits.never.push(Arc::new(reason));
                self.fits.in_cycle.push(None);
                at
            }
            None => FITS,
        };
        self.fits.by_shape.insert(key, verdict);
        verdict
    }

    /// Why jobs of `verdict` wait, and their reason in this cycle's table
    /// once one was explained; none for [`FITS`].
    pub(crate) fn never_reason(
        &self,
        verdict: u32,
    ) -> Option<(Option<ReasonIdx>, &Arc<PendingReason>)> {
        let reason = self.fits.never.get(verdict as usize)?;
        let known = self.fits.in_cycle.get(verdict as usize).copied().flatten();
        Some((known, reason))
    }

    pub(crate) fn record_never_reason(&mut self, verdict: u32, reason: ReasonIdx) {
        if let Some(slot) = self.fits.in_cycle.get_mut(verdict as usize) {
            *slot = Some(reason);
        }
    }

    /// The release timeline of `res`, from `compute` the first time.
    pub(crate) fn timeline(
        &mut self,
        res: ResourceIdx,
        compute: impl FnOnce() -> Timeline,
    ) -> Rc<Timeline> {
        Rc::clone(
            self.timelines
                .entry(res)
                .or_insert_with(|| Rc::new(compute())),
        )
    }

    /// Takes the timeline of `res` out, for an admission to update.
    pub(crate) fn take_timeline(&mut self, res: ResourceIdx) -> Option<Rc<Timeline>> {
        self.timelines.remove(&res)
    }

    pub(crate) fn record_timeline(&mut self, res: ResourceIdx, timeline: Rc<Timeline>) {
        self.timelines.insert(res, timeline);
    }

    /// The cohort releases of `res`, from `compute` the first time.
    pub(crate) fn cohort_releases(
        &mut self,
        res: ResourceIdx,
        compute: impl FnOnce() -> Vec<CohortRelease>,
    ) -> &[CohortRelease] {
        self.cohort_releases.entry(res).or_insert_with(compute)
    }

    /// The cohort releases of `res` if known, for an admission to update.
    pub(crate) fn cohort_releases_to_update(
        &mut self,
        res: ResourceIdx,
    ) -> Option<&mut Vec<CohortRelease>> {
        self.cohort_releases.get_mut(&res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::CycleCtx;
    use crate::testing::{Rng, contested_cluster};
    use crate::types::Timestamp;
    use crate::{Allocator, CycleOutcome, Event, JobSpec, JobUid, PendingExplanation};

    #[test]
    fn an_early_failure_is_taken_once_and_only_by_its_job() {
        let mut early = EarlyFailures::default();
        early.insert(JobIdx::from(3), (ReasonIdx::from(7), true));
        early.insert(JobIdx::from(200), (ReasonIdx::from(8), false));
        // 131 and 8 share a word or a bit with job 3 or 200 without being them.
        assert_eq!(early.take(JobIdx::from(131)), None);
        assert_eq!(early.take(JobIdx::from(8)), None);
        assert_eq!(
            early.take(JobIdx::from(10_000)),
            None,
            "beyond every marked word"
        );
        assert_eq!(
            early.take(JobIdx::from(3)),
            Some((ReasonIdx::from(7), true))
        );
        assert_eq!(early.take(JobIdx::from(3)), None, "taken once");
        assert_eq!(
            early.take(JobIdx::from(200)),
            Some((ReasonIdx::from(8), false))
        );
    }

    /// Everything a cycle decided, pending explanations resolved.
    fn decided(
        alloc: &Allocator,
        out: &CycleOutcome,
    ) -> (String, String, String, Vec<PendingExplanation>) {
        (
            format!("{:?}", out.admissions),
            format!("{:?}", out.preemptions),
            format!("{:?}", out.evictions),
            out.pending
                .iter()
                .filter_map(|p| alloc.explain(out, p))
                .collect(),
        )
    }

    /// The quota shortcut answers a job from an earlier failure of its
    /// shape: it must decide what evaluating the job in full decides.
    /// Seeded runs of a contested cluster (cohorts borrowing, quota and
    /// queue holds, starving borrowers, runtime estimates, node filters,
    /// preemption) go cycle by cycle with and without it.
    #[test]
    fn the_quota_shortcut_decides_as_a_full_evaluation() {
        let mut shortcut_answers = 0;
        for seed in 1..=12u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut fast = contested_cluster();
            let mut full = contested_cluster();
            let mut running: Vec<JobUid> = Vec::new();
            let mut next = 0;
            for step in 1..=60u64 {
                let now = step * 60;
                let mut events = Vec::new();
                for _ in 0..rng.below(9) {
                    next += 1;
                    let mut job = JobSpec {
                        uid: JobUid::new(format!("j{next}")),
                        namespace: "ml".into(),
                        name: format!("j{next}"),
                        queue: Some(format!("q{}", rng.below(7))),
                        priority: rng.pick(&[0, 5, 10]),
                        submitted_at: Timestamp(now.saturating_sub(rng.below(1_200))),
                        num_workers: rng.pick(&[1, 1, 2, 4]),
                        gpus_per_worker: rng.pick(&[1, 2, 4, 8, 8]),
                        runtime_estimate_secs: rng.pick(&[None, Some(300), Some(900), Some(3_600)]),
                        ..JobSpec::default()
                    };
                    // Some jobs want half the nodes; a few want none there are.
                    match rng.below(8) {
                        0 | 1 => job.node_selector.insert("pool".into(), "a".into()),
                        2 => job.node_selector.insert("pool".into(), "b".into()),
                        _ => None,
                    };
                    events.push(Event::JobSubmitted(job));
                }
                for _ in 0..rng.below(3) {
                    if !running.is_empty() {
                        let done = running.swap_remove(rng.below(running.len() as u64) as usize);
                        events.push(Event::JobFinished { uid: done });
                    }
                }
                for event in events {
                    fast.apply(event.clone()).expect("event");
                    full.apply(event).expect("event");
                }
                let with_shortcut = fast.cycle(Timestamp(now));
                let without = full.cycle_with(
                    Timestamp(now),
                    CycleCtx {
                        no_quota_shortcut: true,
                        ..CycleCtx::default()
                    },
                );
                assert_eq!(
                    decided(&fast, &with_shortcut),
                    decided(&full, &without),
                    "seed {seed}, cycle at {now} s"
                );
                shortcut_answers += with_shortcut.stats.memo_hits;
                running.extend(with_shortcut.admissions.iter().map(|a| a.uid.clone()));
                let gone: Vec<&JobUid> = with_shortcut.evictions.iter().map(|e| &e.uid).collect();
                running.retain(|uid| !gone.contains(&uid));
            }
        }
        assert!(
            shortcut_answers > 1_000,
            "shortcut used {shortcut_answers} times"
        );
    }
}
