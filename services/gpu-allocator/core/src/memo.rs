//! The speed layer: what one cycle keeps for the next to find faster. Only
//! looked up by key, never iterated, so it cannot change a decision.

use crate::allocator::Allocator;
use crate::cycle::CycleCtx;
use crate::cycle::quota_holds::HoldAges;
use crate::ids::{FastMap, JobIdx, QueueIdx, ReasonIdx, ResIdx};
use crate::state::jobs::Gang;
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
}

/// Placement-failure memo key: jobs with the same shape and node filter fail
/// alike within a cycle, because capacity only shrinks during a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MemoKey {
    pub(crate) res: ResIdx,
    pub(crate) gang: Gang,
    pub(crate) filter: u32,
}

/// (queue, resource, requested, used, available, a hold is involved).
pub(crate) type QuotaMemoKey = (QueueIdx, ResIdx, u64, u64, u64, bool);

/// What a victim search depends on, besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PreemptionKey {
    pub(crate) queue: QueueIdx,
    pub(crate) priority: i32,
    pub(crate) gang: Gang,
    pub(crate) filter: u32,
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
        let word = idx as usize / 64;
        if self.marked.len() <= word {
            self.marked.resize(word + 1, 0);
        }
        if let Some(bits) = self.marked.get_mut(word) {
            *bits |= 1 << (idx % 64);
        }
        self.by_job.insert(idx, failure);
    }

    pub(crate) fn take(&mut self, idx: JobIdx) -> Option<(ReasonIdx, bool)> {
        let marked = self
            .marked
            .get(idx as usize / 64)
            .is_some_and(|bits| bits >> (idx % 64) & 1 == 1);
        if marked {
            self.by_job.remove(&idx)
        } else {
            None
        }
    }
}

/// `Allocator::slots_when_empty` by (resource, node filter, worker shape
/// with no count of workers).
pub(crate) type EmptySlots = FastMap<(ResIdx, u32, Gang), u64>;

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

impl Allocator {
    /// The failure of an earlier job of the same shape blocked by quota on
    /// every option, when it holds for this job too.
    pub(crate) fn quota_blocked_like(
        ctx: &CycleCtx,
        queue: QueueIdx,
        shape: QuotaShape,
    ) -> Option<(ReasonIdx, bool)> {
        let key = shape
            .ages
            .shape_key(queue, shape.sharing, u64::from(shape.units))?;
        let epoch = ctx.quota_epoch(queue);
        // Each failure stands for the jobs whose end falls in its span.
        ctx.quota_blocked
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
}
