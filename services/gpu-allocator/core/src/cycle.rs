//! The admission cycle, in five steps:
//! 1. evictions: victims whose grace period ended (or who reported their
//!    checkpoint) release their GPUs and go back to pending;
//! 2. preemptors whose victims are all gone are admitted first, so the
//!    capacity they paid for is not taken by someone else;
//! 3. jobs that held a reservation, a cohort quota hold or a queue hold last
//!    cycle are evaluated next, so they keep it until they start;
//! 4. the main pass walks every pending job, queues interleaved by weighted
//!    dominant share, and admits each one that fits quota and concrete nodes
//!    now; blocked jobs at the front get backfill reservations;
//! 5. a bounded number of still-blocked jobs look for preemption victims.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::rc::Rc;
use std::sync::Arc;

use crate::backfill::{Claim, Reservations};
use crate::config::AgingPolicy;
use crate::decision::{
    Admission, CycleOutcome, CycleStats, Drain, Eviction, EvictionReason, PlannedNode, Preemption,
    PreemptionRule, TopologyAssignment, Victim, WorkerPlacement,
};
use crate::event::JobSpec;
use crate::ids::CohortIdx;
use crate::ids::{FastMap, JobIdx, NodeIdx, QueueIdx, ReasonIdx, ResIdx};
use crate::pending::{Pending, PendingReason};
use crate::placement::{self, Candidate};
use crate::state::jobs::{Gang, Job, JobState, Nomination, Running};
use crate::state::releases::Timeline;
use crate::types::{GpuSliceRequest, JobUid, ResourceKind, Timestamp, TopologyRequirement, names};

use crate::allocator::Allocator;

/// What a successful placement attempt produced.
pub(crate) struct Plan {
    res: ResIdx,
    per_worker: u32,
    placement: Vec<(NodeIdx, u32)>,
    ahead_of: Option<JobUid>,
}

/// Placement-failure memo key: jobs with the same shape and node filter fail
/// alike within a cycle, because capacity only shrinks during a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MemoKey {
    res: ResIdx,
    gang: Gang,
    filter: u32,
}

/// (queue, resource, requested, used, available, a hold is involved).
pub(crate) type QuotaMemoKey = (QueueIdx, ResIdx, u64, u64, u64, bool);

/// Quota kept for a blocked job: cohort headroom for the first job that only
/// the pool blocks, or a queue's nominal quota for one of its own jobs.
#[derive(Clone, Copy)]
pub(crate) struct QuotaHold {
    units: u64,
    /// The job held for: its uid is read only when a reason names it.
    holder_idx: JobIdx,
    /// When the holder can expect enough headroom; jobs ending by then may
    /// still use the held units.
    until: Option<Timestamp>,
    /// A cohort hold of a starving borrower (see `starving_borrower`): it
    /// binds every member's jobs, not only those that would borrow.
    binds_lenders: bool,
}

/// How this cycle's holds bear on one job in one resource.
#[derive(Clone, Copy)]
pub(crate) struct HoldTerms {
    idx: JobIdx,
    /// The job would borrow. Nominal quota is guaranteed: a hold only stops
    /// jobs that would borrow, or every job if it binds lenders too.
    borrows: bool,
    /// A starving borrower: nominal quota other queues keep does not stop it.
    starving: bool,
    /// Estimated end: a job gone before the holder can expect its headroom
    /// may use it (backfill, applied to quota).
    end: Option<Timestamp>,
}

impl HoldTerms {
    fn bound(&self, h: &QuotaHold) -> bool {
        self.borrows || h.binds_lenders
    }

    fn exempt(&self, h: &QuotaHold) -> bool {
        matches!((self.end, h.until), (Some(end), Some(until)) if end <= until)
    }
}

/// What this cycle's holds keep from one job in one resource (see
/// `Allocator::held_from`).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeldFrom {
    /// The job's queue's nominal quota of the resource.
    nominal: u64,
    /// Cohort headroom kept from it if it would borrow.
    cohort_if_borrowing: u64,
    /// Cohort headroom kept from it within its nominal quota (only a
    /// starving borrower's hold keeps any: nominal quota is guaranteed).
    cohort_within_nominal: u64,
    /// Units of its own queue's nominal quota kept for a job ahead of it in
    /// line.
    own_queue: Option<u64>,
}

impl HeldFrom {
    /// Cohort headroom kept from the job (`units`) when its queue uses
    /// `used` of the resource.
    pub(crate) fn cohort(&self, used: u64, units: u64) -> u64 {
        if used.saturating_add(units) > self.nominal {
            self.cohort_if_borrowing
        } else {
            self.cohort_within_nominal
        }
    }

    /// Whether the job's queue, using `used` of the resource, can take it
    /// (`units`) without the units its own queue keeps.
    pub(crate) fn own_queue_allows(&self, used: u64, units: u64) -> bool {
        self.own_queue
            .is_none_or(|kept| fits_beside(used, units, kept, self.nominal))
    }
}

/// Whether `units` more fit a queue's `nominal` quota beside the `used`
/// units and the `kept` ones its queue hold keeps.
fn fits_beside(used: u64, units: u64, kept: u64, nominal: u64) -> bool {
    used.saturating_add(units).saturating_add(kept) <= nominal
}

/// What a victim search depends on, besides cluster state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PreemptionKey {
    queue: QueueIdx,
    priority: i32,
    gang: Gang,
    filter: u32,
    sharing: bool,
    slice: Option<GpuSliceRequest>,
}

pub(crate) struct MemoEntry {
    /// Smallest job end (u64::MAX = no estimate) known to fail; jobs ending
    /// later see at least as much reservation protection, so fail too.
    min_failing_end: u64,
    reason: ReasonIdx,
}

/// Failures of jobs evaluated before the main pass (they held a
/// reservation), each taken back at its job's place in line. A bit per job
/// says whether to look: the pass asks for nearly every pending job, and the
/// map holds a handful.
#[derive(Default)]
pub(crate) struct EarlyFailures {
    by_job: FastMap<JobIdx, (ReasonIdx, bool)>,
    /// Bit `idx % 64` of word `idx / 64` is set for each job in `by_job`.
    marked: Vec<u64>,
}

impl EarlyFailures {
    fn insert(&mut self, idx: JobIdx, failure: (ReasonIdx, bool)) {
        let word = idx as usize / 64;
        if self.marked.len() <= word {
            self.marked.resize(word + 1, 0);
        }
        if let Some(bits) = self.marked.get_mut(word) {
            *bits |= 1 << (idx % 64);
        }
        self.by_job.insert(idx, failure);
    }

    fn take(&mut self, idx: JobIdx) -> Option<(ReasonIdx, bool)> {
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

/// (expected end, units, cohort of the job's queue, the queue) of a running job.
type CohortRelease = (Timestamp, u64, Option<CohortIdx>, QueueIdx);

/// `Allocator::slots_when_empty` by (resource, node filter, worker shape
/// with no count of workers).
pub(crate) type EmptySlots = FastMap<(ResIdx, u32, Gang), u64>;

/// Scratch state of one cycle.
#[derive(Default)]
pub(crate) struct CycleCtx {
    memo: FastMap<MemoKey, MemoEntry>,
    /// Release timelines per resource (see `timeline_cached`).
    timelines: FastMap<ResIdx, Rc<Timeline>>,
    /// Expected releases per resource for the cohort pools and queues (see
    /// `quota_release_time`).
    cohort_releases: FastMap<ResIdx, Vec<CohortRelease>>,
    /// Failures of jobs evaluated before the main pass.
    early: EarlyFailures,
    /// Jobs given a reservation this cycle, in order.
    reserved_order: Vec<JobUid>,
    quota_memo: FastMap<QuotaMemoKey, ReasonIdx>,
    /// Reasons of jobs blocked by their queue's hold, by (queue, resource,
    /// units, queue usage).
    queue_hold_reasons: FastMap<(QueueIdx, ResIdx, u64, u64), ReasonIdx>,
    /// Reasons of jobs their queue refuses, by queue and namespace (none
    /// for a queue on hold): one per cause, however many jobs wait for it.
    refusals: FastMap<QueueIdx, FastMap<String, ReasonIdx>>,
    /// Cohort pool headroom held for the first job that only the pool
    /// blocks, per (cohort, resource).
    quota_holds: FastMap<(CohortIdx, ResIdx), QuotaHold>,
    /// A queue's nominal quota kept for one of its blocked jobs, per (queue,
    /// resource): the units that job needs (see `hold_queue_quota`).
    queue_holds: FastMap<(QueueIdx, ResIdx), QuotaHold>,
    /// `queue_holds` by (the holding queue's cohort, resource), each group
    /// in the order the holds were made: what `kept_by_queue_holds` needs
    /// of the map, for each borrower checked, without walking all of it.
    queue_holds_by_cohort: FastMap<(CohortIdx, ResIdx), Vec<CohortQueueHold>>,
    reservations: Reservations,
    /// `slots_when_empty` per (resource, node filter, worker shape), kept
    /// from cycle to cycle while no node changes (see
    /// `Allocator::spare_empty_slots`).
    empty_slots: EmptySlots,
    /// Failures that may try preemption (blocked by quota or capacity), in
    /// line order: (slot in the pending explanations, job).
    may_preempt: Vec<(usize, JobIdx)>,
    stats: CycleStats,
    /// By queue: bumped by every admission and every new quota or queue
    /// hold in the queue's cohort (see `quota_changed`): what a quota check
    /// of the queue saw is valid while its epoch stays.
    quota_epochs: Vec<u64>,
    /// Jobs blocked by quota on every option, by (queue, shares GPUs,
    /// units, hold ages) packed (`HoldAges::shape_key`): up to
    /// `SHAPE_SLOTS` failures, each standing for the jobs whose estimated
    /// end falls in its own span between the holds' times
    /// (`QuotaBlocked::exempt_until` and `passes_until`). Another job of
    /// that shape, those ages and an end in one of the spans fails alike
    /// within the queue's epoch.
    quota_blocked: QuotaBlockedShapes,
    /// Every reason made this cycle, each once: failures name them by index
    /// (see `Pending::reason`). Handed to the outcome.
    reasons: Vec<Arc<PendingReason>>,
    /// Every job evaluated in full: what the quota shortcut is checked against.
    #[cfg(test)]
    no_quota_shortcut: bool,
}

impl CycleCtx {
    #[cfg(not(test))]
    fn quota_shortcut(&self) -> bool {
        true
    }

    #[cfg(test)]
    fn quota_shortcut(&self) -> bool {
        !self.no_quota_shortcut
    }

    /// Lists a job that holds a reservation or quota among those evaluated
    /// first next cycle (see `evaluate_reserved_first`), once: a job that
    /// holds both was evaluated twice, and a second evaluation could admit
    /// it past the reservation the first had just made for it, which then
    /// held other jobs back for a job already running.
    fn evaluate_first_next_cycle(&mut self, uid: &JobUid) {
        if !self.reserved_order.contains(uid) {
            self.reserved_order.push(uid.clone());
        }
    }

    fn quota_epoch(&self, queue: QueueIdx) -> u64 {
        self.quota_epochs.get(queue as usize).copied().unwrap_or(0)
    }

    /// Adds a reason to the cycle's table.
    fn add_reason(&mut self, reason: PendingReason) -> ReasonIdx {
        let idx = ReasonIdx::try_from(self.reasons.len()).unwrap_or(ReasonIdx::MAX);
        self.reasons.push(Arc::new(reason));
        idx
    }

    fn reason(&self, idx: ReasonIdx) -> Option<&PendingReason> {
        self.reasons.get(idx as usize).map(|r| &**r)
    }

    /// Units missing by reason `idx` (see `PendingReason::shortfall`).
    fn shortfall(&self, idx: ReasonIdx) -> u64 {
        self.reason(idx).map_or(u64::MAX, PendingReason::shortfall)
    }
}

/// A queue hold as the other queues of its cohort see it (see
/// `CycleCtx::queue_holds_by_cohort`).
pub(crate) struct CohortQueueHold {
    queue: QueueIdx,
    hold: QuotaHold,
    /// What it keeps from borrowers: the held units, up to what the queue
    /// leaves unused of its nominal quota. Kept up to date as the queue
    /// admits jobs (see `admit_in_cycle`), so that the borrowers checked
    /// in between do not look the queue up each.
    keeps: u64,
}

/// What other queues' holds keep from a borrower (see `kept_by_queue_holds`).
#[derive(Default)]
pub(crate) struct KeptQuota {
    units: u64,
    /// The first holder found.
    first_holder: Option<JobIdx>,
    /// The latest time a hold that counted lets jobs ending by then through.
    latest_until: Option<u64>,
    /// The earliest time a hold that would have counted but lets this job
    /// through lets jobs ending by then through.
    passed_until: Option<u64>,
}

/// Failures kept per shape (see `CycleCtx::quota_blocked`). Two spans are
/// common, jobs that no hold lets through and jobs that some do; with four,
/// jobs between two holds' times find theirs too (a tenth fewer full
/// evaluations on the gang-heavy benchmark; eight find barely more).
pub(crate) const SHAPE_SLOTS: usize = 4;

/// A quota failure on every option, reusable by jobs of the same shape.
pub(crate) struct QuotaBlocked {
    epoch: u64,
    reason: ReasonIdx,
    can_preempt: bool,
    /// The latest time a quota hold lets jobs ending by then through; a job
    /// with an earlier estimated end may be let through, so it is evaluated
    /// in full. `None`: no hold exempts anyone.
    exempt_until: Option<u64>,
    /// The earliest time a hold that let the failed job through lets jobs
    /// ending by then through: a job ending later is held back more, so it
    /// is evaluated in full. `None`: no hold let it through.
    passes_until: Option<u64>,
}

/// What the main pass needs of a job without touching it again, copied
/// from its queue's line (see `crate::line`). Kept small: the pass reads
/// the lanes interleaved, one cache miss per job when they are large.
pub(crate) struct LaneJob {
    /// Effective priority at this cycle.
    priority: i32,
    idx: JobIdx,
    submitted_at: Timestamp,
    seq: u64,
    /// For a job that may take the quota shortcut: pending without a
    /// nomination, whole or shared GPUs.
    shape: Option<QuotaShape>,
}

/// What the quota shortcut (`quota_blocked_like`) compares of a job.
#[derive(Clone, Copy)]
pub(crate) struct QuotaShape {
    /// Estimated end, as `estimated_end` gives it.
    end: u64,
    units: u32,
    sharing: bool,
    ages: HoldAges,
}

/// The waits a job has passed that change how a quota failure is handled:
/// `backfill.queueHoldAfterSecs` (it may keep its queue's quota) and
/// `backfill.borrowerHoldAfterSecs` (a borrower starts starving). Jobs of one
/// shape fail alike only if these agree too.
#[derive(Clone, Copy)]
pub(crate) struct HoldAges {
    queue_hold: bool,
    starving: bool,
}

impl HoldAges {
    /// The ages a quota failure of `units` depends on: only a job larger
    /// than one of its queue's nominal quotas above zero (`smallest_nominal`
    /// the smallest) can be a starving borrower.
    fn for_units(self, units: u64, smallest_nominal: u64) -> Self {
        HoldAges {
            starving: self.starving && units > smallest_nominal,
            ..self
        }
    }

    /// The quota shortcut's key for a job of these ages: (queue, shares
    /// GPUs, units, ages) packed into one integer, as each pending job's
    /// lookup hashes it. `None` (no shortcut: the job is evaluated in full)
    /// for units beyond u32 or a queue index beyond 29 bits, which do not
    /// fit.
    fn shape_key(self, queue: QueueIdx, sharing: bool, units: u64) -> Option<u64> {
        let units = u32::try_from(units).ok()?;
        (queue < 1 << 29).then(|| {
            u64::from(units)
                | u64::from(queue) << 32
                | u64::from(sharing) << 61
                | u64::from(self.queue_hold) << 62
                | u64::from(self.starving) << 63
        })
    }
}

/// The failures of `CycleCtx::quota_blocked`, by shape key. The keys sit
/// apart from the failures: the pass looks a key up for nearly every
/// pending job, and a few hundred keys stay in cache where the failures
/// beside them (four slots each) did not.
#[derive(Default)]
pub(crate) struct QuotaBlockedShapes {
    at: FastMap<u64, u32>,
    failures: Vec<[Option<QuotaBlocked>; SHAPE_SLOTS]>,
}

impl QuotaBlockedShapes {
    fn clear(&mut self) {
        self.at.clear();
        self.failures.clear();
    }

    fn get(&self, key: u64) -> Option<&[Option<QuotaBlocked>; SHAPE_SLOTS]> {
        let at = *self.at.get(&key)?;
        self.failures.get(at as usize)
    }

    fn slots_mut(&mut self, key: u64) -> Option<&mut [Option<QuotaBlocked>; SHAPE_SLOTS]> {
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

/// A queue's ordered pending jobs during a cycle.
pub(crate) struct Lane {
    queue: QueueIdx,
    /// In line order; the pass takes them from the front.
    jobs: std::vec::IntoIter<LaneJob>,
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
    fn new(share: f64, head: &LaneJob, lane: usize) -> Self {
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

    fn lane(&self) -> usize {
        usize::try_from(self.0.0.1 & u128::from(u32::MAX)).unwrap_or(usize::MAX)
    }
}

/// Keeps the later of `at` and the time `latest` holds.
fn keep_latest(latest: &mut Option<u64>, at: u64) {
    *latest = Some(latest.map_or(at, |t| t.max(at)));
}

/// Keeps the earlier of `at` and the time `earliest` holds.
fn keep_earliest(earliest: &mut Option<u64>, at: u64) {
    *earliest = Some(earliest.map_or(at, |t| t.min(at)));
}

/// A job's expected end for a runtime estimate, as a sort key (`u64::MAX`
/// without an estimate) and as a time.
fn estimated_end(estimate_secs: Option<u64>, now: Timestamp) -> (u64, Option<Timestamp>) {
    match estimate_secs {
        Some(est) => {
            let end = now.plus_secs(est);
            (end.0, Some(end))
        }
        None => (u64::MAX, None),
    }
}

impl Allocator {
    // ------------------------------------------------------------------ cycle

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

    /// Resources a job may use, in the queue's flavor preference order.
    pub(crate) fn options_for(&self, job: &Job, out: &mut Vec<ResIdx>) {
        out.clear();
        let Some(queue) = self.state.queues.get(job.queue) else {
            return;
        };
        let Some(request) = &job.spec.gpu_slice else {
            // Opted-in jobs try shared GPUs first: that is what they asked for.
            out.extend_from_slice(if job.spec.allow_gpu_sharing {
                &queue.sharing_options
            } else {
                &queue.plain_options
            });
            return;
        };
        for flavor in &queue.flavor_order {
            // Per flavor, the smallest matching MIG profile first: least GPU
            // memory wasted.
            let mut matching: Vec<(u32, u32, &str, ResIdx)> = queue
                .quotas
                .iter()
                .filter(|s| s.flavor == *flavor)
                .filter_map(|s| match self.state.inv.kind_of_res(s.res) {
                    Some(ResourceKind::Mig(p)) => {
                        let ok = match request {
                            GpuSliceRequest::Profile(name) => p.name == *name,
                            GpuSliceRequest::MemoryGb(gb) => p.memory_gb.is_some_and(|m| m >= *gb),
                        };
                        ok.then(|| {
                            (
                                p.memory_gb.unwrap_or(u32::MAX),
                                p.compute_slices.unwrap_or(u32::MAX),
                                p.name.as_str(),
                                s.res,
                            )
                        })
                    }
                    _ => None,
                })
                .collect();
            matching.sort();
            out.extend(matching.into_iter().map(|m| m.3));
        }
    }

    pub(crate) fn wants_description(spec: &JobSpec) -> String {
        match &spec.gpu_slice {
            Some(GpuSliceRequest::Profile(p)) => format!("{}{p}", names::MIG_RESOURCE_PREFIX),
            Some(GpuSliceRequest::MemoryGb(gb)) => {
                format!(
                    "a MIG slice ({}*) with at least {gb}GB",
                    names::MIG_RESOURCE_PREFIX
                )
            }
            None if spec.allow_gpu_sharing => {
                format!("{} or {}", names::SHARED_GPU_RESOURCE, names::GPU_RESOURCE)
            }
            None => names::GPU_RESOURCE.to_string(),
        }
    }

    /// Runs one admission cycle at `now`.
    pub fn cycle(&mut self, now: Timestamp) -> CycleOutcome {
        let (at, empty_slots) = std::mem::take(&mut self.memo.spare_empty_slots);
        let ctx = CycleCtx {
            quota_blocked: std::mem::take(&mut self.memo.spare_quota_blocked),
            empty_slots: if at == self.state.inv.node_changes {
                empty_slots
            } else {
                EmptySlots::default()
            },
            ..CycleCtx::default()
        };
        self.cycle_with(now, ctx)
    }

    fn cycle_with(&mut self, now: Timestamp, mut ctx: CycleCtx) -> CycleOutcome {
        self.state.clock = self.state.clock.max(now);
        self.state.cycles += 1;
        self.prune_tombstones(now);
        let mut out = CycleOutcome {
            now,
            ..CycleOutcome::default()
        };
        out.evictions.append(&mut self.state.undelivered_evictions);
        self.process_evictions(now, &mut out);
        self.start_drains(now, &mut out);

        self.hold_for_waiting_preemptors(now, &mut ctx);
        self.admit_ready_preemptors(now, &mut ctx, &mut out);
        self.evaluate_reserved_first(now, &mut ctx, &mut out);
        let lanes = self.build_lanes(now);
        self.main_pass(now, lanes, &mut ctx, &mut out);
        self.state.reserved_jobs = std::mem::take(&mut ctx.reserved_order);
        if self.state.config.preemption.enabled {
            self.preemption_pass(now, &mut ctx, &mut out);
        }
        out.reasons = std::mem::take(&mut ctx.reasons);
        out.stats = ctx.stats;
        out.stats.admitted = u32::try_from(out.admissions.len()).unwrap_or(u32::MAX);
        ctx.quota_blocked.clear();
        self.memo.spare_quota_blocked = ctx.quota_blocked;
        self.memo.spare_empty_slots = (self.state.inv.node_changes, ctx.empty_slots);
        out
    }

    pub(crate) fn prune_tombstones(&mut self, now: Timestamp) {
        let retention = self.state.config.tombstone_retention_secs;
        while let Some((at, _)) = self.state.tombstone_order.front() {
            if now.secs_since(*at) <= retention {
                break;
            }
            if let Some((_, uid)) = self.state.tombstone_order.pop_front() {
                self.state.tombstones.remove(&uid);
            }
        }
    }

    pub(crate) fn process_evictions(&mut self, now: Timestamp, out: &mut CycleOutcome) {
        let due = self
            .state
            .by_arrival(self.state.preempting.iter().copied().filter(|idx| {
                self.state
                    .job(*idx)
                    .and_then(Job::running)
                    .and_then(|r| r.preempting.as_ref())
                    .is_some_and(|p| p.checkpointed || p.evict_at <= now)
            }));
        for idx in due {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            let uid = job.spec.uid.clone();
            let Some(by) = job
                .running()
                .and_then(|r| r.preempting.as_ref())
                .map(|p| p.by.clone())
            else {
                continue;
            };
            let reason = match &by {
                Some(by) => EvictionReason::Preempted { by: by.clone() },
                None => EvictionReason::Drained {
                    queue: self.state.queues.name_of(job.queue),
                },
            };
            self.state.requeue(idx, by);
            out.evictions.push(Eviction {
                uid,
                reason,
                at: now,
            });
        }
    }

    /// The resource a nomination planned on.
    pub(crate) fn nomination_res(&self, nomination: &Nomination) -> Option<ResIdx> {
        let flavor = self.state.inv.flavor_by_name(&nomination.flavor)?;
        let kind = ResourceKind::from_quota_name(&nomination.resource)?;
        self.state
            .inv
            .kind_idx(&kind)
            .and_then(|k| self.state.inv.res_of(flavor, k))
    }

    pub(crate) fn preempting_jobs(&self) -> Vec<JobIdx> {
        self.state.preempting.iter().copied().collect()
    }

    pub(crate) fn nominated_jobs(&self) -> Vec<JobIdx> {
        self.state.nominated.iter().copied().collect()
    }

    pub(crate) fn job_idx(&self, uid: &JobUid) -> Option<JobIdx> {
        self.state.job_by_uid.get(uid).copied()
    }

    /// Victims of `preemptor`'s nomination not evicted yet. A victim
    /// evicted early (it checkpointed) may start again elsewhere before the
    /// others go: running again, it is no victim, and the preemptor does not
    /// wait for it to end.
    pub(crate) fn victims_left(&self, preemptor: &Job, nomination: &Nomination) -> u32 {
        let left = nomination
            .victims
            .iter()
            .filter(|uid| {
                self.state
                    .job_by_uid
                    .get(*uid)
                    .and_then(|i| self.state.job(*i))
                    .and_then(Job::running)
                    .and_then(|r| r.preempting.as_ref())
                    .is_some_and(|p| p.by.as_ref() == Some(&preemptor.spec.uid))
            })
            .count();
        u32::try_from(left).unwrap_or(u32::MAX)
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
            let timeline = Self::timeline_cached(self, &mut ctx.timelines, res, now);
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
                (self.victims_left(job, n) == 0).then(|| (self.line_place(job, now), *idx))
            })
            .collect();
        ready.sort_unstable();
        for (_, idx) in ready {
            // The resource its victims freed first: elsewhere, the eviction
            // was for nothing, and another flavor may be kept for others.
            let planned = self.state.job(idx).and_then(|job| match &job.state {
                JobState::Pending(Some(n)) => self.nomination_res(n),
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
                && self.queue_admits(job)
            {
                self.options_for(job, &mut options);
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
                if let Ok(plan) = self.try_place(idx, res, now, ctx) {
                    self.admit_in_cycle(idx, plan, now, ctx, out);
                    break;
                }
            }
        }
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
        for (queue, q) in (0..).zip(&self.state.queues.queues) {
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
            let admitted = |idx: JobIdx| {
                !restricted || self.state.job(idx).is_some_and(|j| self.queue_admits(j))
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
                        .filter(|_| !nominated && !e.sliced && admitted(e.idx))
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
            shares.get(l.queue as usize).copied().unwrap_or(0.0),
            head,
            lane,
        ))
    }

    /// Takes a job's GPUs for this cycle: every quota check seen so far is
    /// out of date, and the job's releases join its resource's timeline.
    pub(crate) fn admit_in_cycle(
        &mut self,
        idx: JobIdx,
        plan: Plan,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        let res = plan.res;
        let cached = ctx.timelines.remove(&res);
        let queue = self.state.job(idx).map(|job| job.queue);
        if let Some(queue) = queue {
            self.quota_changed(queue, ctx);
        }
        self.admit(idx, plan, now, out);
        if let Some(queue) = queue {
            self.refresh_queue_hold(queue, res, ctx);
        }
        // Updating a cached timeline in place gives the same sorted events
        // as rebuilding it from every running job, for a fraction of the cost.
        if let Some(mut timeline) = cached {
            self.add_releases(Rc::make_mut(&mut timeline), idx, res, now);
            ctx.timelines.insert(res, timeline);
        }
        // Likewise for the cohort releases.
        if let Some(releases) = ctx.cohort_releases.get_mut(&res)
            && let Some(job) = self.state.job(idx)
            && let Some(run) = job.running()
            && let Some(release) = self.cohort_release(idx, job, run, res, now)
        {
            crate::state::releases::insert_one(releases, release);
        }
    }

    /// Inserts the release events of running job `idx` into `timeline` (see
    /// `release_timeline`), keeping it sorted.
    fn add_releases(&self, timeline: &mut Timeline, idx: JobIdx, res: ResIdx, now: Timestamp) {
        let mut events = Vec::new();
        self.state
            .job_releases(idx, res, now, |event| events.push(event));
        crate::state::releases::insert_sorted(timeline, &mut events);
    }

    /// The failure of an earlier job of the same shape blocked by quota on
    /// every option, when it holds for this job too.
    fn quota_blocked_like(
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

    pub(crate) fn main_pass(
        &mut self,
        now: Timestamp,
        mut lanes: Vec<Lane>,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        // A queue's share changes only when one of its jobs is admitted:
        // computed once here and after each admission, not once per job.
        let mut shares: Vec<f64> = (0..)
            .zip(&self.state.queues.queues)
            .map(|(queue, _)| self.state.queues.share(queue, &[]))
            .collect();
        let mut heap = BinaryHeap::new();
        for i in 0..lanes.len() {
            if let Some(key) = Self::lane_key(&lanes, &shares, i) {
                heap.push(key);
            }
        }
        // Failures so far per queue: a failure's position counts only jobs
        // still waiting (admitted ones left the line).
        let mut waiting: Vec<u32> = vec![0; self.state.queues.queues.len()];
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
                None => match shape
                    .filter(|_| ctx.quota_shortcut())
                    .and_then(|s| Self::quota_blocked_like(ctx, lane_queue, s))
                {
                    Some(failure) => {
                        ctx.stats.memo_hits += 1;
                        Err(failure)
                    }
                    None => self.evaluate(idx, now, ctx, &mut options),
                },
            };
            match outcome {
                Ok(plan) => {
                    self.admit_in_cycle(idx, plan, now, ctx, out);
                    if let Some(share) = shares.get_mut(lane_queue as usize) {
                        *share = self.state.queues.share(lane_queue, &[]);
                    }
                }
                Err((reason, can_preempt)) => {
                    if let Some(waiting) = waiting.get_mut(lane_queue as usize) {
                        *waiting += 1;
                        if can_preempt {
                            ctx.may_preempt.push((out.pending.len(), idx));
                        }
                        out.pending.push(Pending {
                            job: idx,
                            seq,
                            queue: lane_queue,
                            position: *waiting,
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
            current = match Self::lane_key(&lanes, &shares, lane_idx) {
                Some(next) => match heap.peek_mut() {
                    Some(mut top) if *top > next => Some(std::mem::replace(&mut *top, next)),
                    _ => Some(next),
                },
                None => heap.pop(),
            };
        }
        for pending in &mut out.pending {
            pending.queue_length = waiting.get(pending.queue as usize).copied().unwrap_or(0);
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
            match self.evaluate(idx, now, ctx, &mut options) {
                Ok(plan) => self.admit_in_cycle(idx, plan, now, ctx, out),
                Err(failure) => {
                    ctx.early.insert(idx, failure);
                }
            }
        }
    }

    /// Whether the job's queue admits it now: not on hold, open to its
    /// namespace.
    pub(crate) fn queue_admits(&self, job: &Job) -> bool {
        self.state
            .queues
            .get(job.queue)
            .and_then(|q| q.spec.as_ref())
            .is_none_or(|spec| !spec.refuses(&job.spec.namespace))
    }

    /// Tries every allowed (flavor, resource) of a pending job. On failure
    /// returns the most useful reason and whether preemption may help.
    pub(crate) fn evaluate(
        &mut self,
        idx: JobIdx,
        now: Timestamp,
        ctx: &mut CycleCtx,
        options: &mut Vec<ResIdx>,
    ) -> Result<Plan, (ReasonIdx, bool)> {
        let Some(job) = self.state.job(idx) else {
            return Err((
                ctx.add_reason(PendingReason::QueueNotFound {
                    queue: String::new(),
                }),
                false,
            ));
        };
        if job.running().is_some() {
            // Admitted earlier in this cycle (a preemptor whose victims left):
            // never evaluate a job twice.
            return Err((
                ctx.add_reason(PendingReason::NoMatchingFlavor {
                    wants: String::new(),
                }),
                false,
            ));
        }
        if let JobState::Pending(Some(nomination)) = &job.state {
            return Err((
                ctx.add_reason(PendingReason::AwaitingPreemption {
                    victims: self.victims_left(job, nomination),
                    evict_at: nomination.evict_at,
                }),
                false,
            ));
        }
        let queue = job.queue;
        if self
            .state
            .queues
            .get(queue)
            .is_none_or(|q| q.spec.is_none())
        {
            return Err((
                ctx.add_reason(PendingReason::QueueNotFound {
                    queue: self.state.queues.name_of(queue),
                }),
                false,
            ));
        }
        if let Some(q) = self.state.queues.get(queue)
            && let Some(spec) = &q.spec
            && spec.refuses(&job.spec.namespace)
        {
            let namespace = if spec.on_hold {
                ""
            } else {
                job.spec.namespace.as_str()
            };
            if let Some(reason) = ctx.refusals.get(&queue).and_then(|r| r.get(namespace)) {
                return Err((*reason, false));
            }
            let name = q.name.to_string();
            let reason = ctx.add_reason(if spec.on_hold {
                PendingReason::QueueOnHold {
                    queue: name,
                    drains: spec.drain,
                }
            } else {
                PendingReason::NamespaceNotAdmitted {
                    queue: name,
                    namespace: namespace.to_string(),
                    admitted: spec.namespaces.clone(),
                }
            });
            ctx.refusals
                .entry(queue)
                .or_default()
                .insert(namespace.to_string(), reason);
            return Err((reason, false));
        }
        self.options_for(job, options);
        if options.is_empty() {
            return Err((
                ctx.add_reason(PendingReason::NoMatchingFlavor {
                    wants: Self::wants_description(&job.spec),
                }),
                false,
            ));
        }
        let units = job.spec.total_units();
        let sharing = job.spec.allow_gpu_sharing;
        let ages = self
            .hold_ages(job.spec.submitted_at, now)
            .for_units(units, self.smallest_nominal(queue));
        // The reason with the smallest shortfall so far, and that shortfall.
        let mut best: Option<(ReasonIdx, u64)> = None;
        let mut first_capacity_failure: Option<(ResIdx, ReasonIdx)> = None;
        let consider = |reason: ReasonIdx, shortfall: u64, best: &mut Option<(ReasonIdx, u64)>| {
            if best.is_none_or(|(_, b)| shortfall < b) {
                *best = Some((reason, shortfall));
            }
        };
        let cohort = self.state.queues.get(queue).and_then(|q| q.cohort);
        let (_, job_end) = estimated_end(job.spec.runtime_estimate_secs, now);
        let mut blocked_by_hold_only = true;
        // When the job can expect to start without preempting anyone.
        let mut expected_start: Option<Timestamp> = None;
        // Whether jobs of the same shape fail exactly alike (see
        // `quota_blocked`): only if every option failed on quota and this job
        // holds nothing; jobs that holds let through differently are told
        // apart by their estimated end, against the latest time a hold
        // that held this job lets jobs through (`exempt_until`) and the
        // earliest time one that let it through does (`passes_until`).
        let mut alike = job.spec.gpu_slice.is_none();
        let mut exempt_until: Option<u64> = None;
        let mut passes_until: Option<u64> = None;
        // The first option quota blocks: (resource, units the queue must free
        // to fit the job within nominal, when the cohort headroom this job
        // holds is expected).
        let mut quota_short: Option<(ResIdx, u64, Option<Timestamp>)> = None;
        // Cohort holds this job makes, kept only if it fails on every
        // option: one started on a later option needs no quota kept.
        let mut holds = Vec::new();
        for &res in options.iter() {
            let terms = self.hold_terms(job, idx, res, job_end, now, self.would_borrow(job, res));
            let hold = cohort.and_then(|c| ctx.quota_holds.get(&(c, res)));
            if let Some(h) = hold
                && terms.bound(h)
            {
                match h.until {
                    _ if h.holder_idx == idx => alike = false,
                    Some(until) if terms.exempt(h) => keep_earliest(&mut passes_until, until.0),
                    Some(until) => keep_latest(&mut exempt_until, until.0),
                    None => {}
                }
            }
            let (held, held_for, kept) = self.held(ctx, terms, queue, cohort, res, hold);
            if let Some(kept) = kept {
                if let Some(until) = kept.passed_until {
                    keep_earliest(&mut passes_until, until);
                }
                if let Some(until) = kept.latest_until {
                    keep_latest(&mut exempt_until, until);
                }
            }
            if let Err(short) = self
                .state
                .queues
                .check_with_hold(queue, res, units, &[], held)
            {
                if held == 0 || self.state.queues.check(queue, res, units, &[]).is_err() {
                    blocked_by_hold_only = false;
                }
                // The first job in line that only the cohort pool holds back
                // keeps what the pool has left, so a stream of smaller jobs
                // cannot take the headroom as fast as it frees up.
                let mut holding = false;
                let may_hold = short.cohort_short && self.state.config.backfill.enabled;
                // Whether the cohort's hold binds every member already.
                let standing = cohort
                    .and_then(|c| ctx.quota_holds.get(&(c, res)))
                    .map(|h| h.binds_lenders);
                // A starving borrower takes over a hold that binds borrowers
                // only. Draining the cohort for a job that could never fit
                // (its quota when idle, checked above, or the nodes when
                // empty) would idle it for good.
                let may_drain = may_hold && terms.starving && standing != Some(true);
                let drains = may_drain
                    && self.slots_when_empty(res, &job.spec, job.filter, &mut ctx.empty_slots)
                        >= u64::from(job.spec.num_workers);
                // Whether the nodes could ever take it depends on the job's
                // own workers and filters, not only its shape.
                if may_drain {
                    alike = false;
                }
                if may_hold
                    && let Some(c) = cohort
                    && (standing.is_none() || drains)
                {
                    let until = self.quota_release_time(
                        &mut ctx.cohort_releases,
                        |r| r.2 == Some(c),
                        res,
                        units.saturating_sub(short.available),
                        now,
                    );
                    expected_start = until;
                    holds.push((
                        (c, res),
                        QuotaHold {
                            units: short.pool_headroom,
                            holder_idx: idx,
                            until,
                            binds_lenders: drains,
                        },
                    ));
                    alike = false;
                    holding = true;
                }
                if quota_short.is_none() {
                    let need = short
                        .used
                        .saturating_add(units)
                        .saturating_sub(short.nominal);
                    quota_short = Some((res, need, expected_start.filter(|_| holding)));
                }
                // Jobs of one queue blocked by the same quota share one reason.
                let key = (
                    queue,
                    res,
                    units,
                    short.used,
                    short.available,
                    held_for.is_some() || holding,
                );
                let reason = match ctx.quota_memo.get(&key) {
                    Some(r) if !holding => *r,
                    _ => {
                        let r = ctx.add_reason(PendingReason::QuotaExceeded {
                            flavor: self.state.inv.res_flavor_name(res).to_string(),
                            resource: self.state.inv.res_quota_name(res),
                            requested: units,
                            available: short.available,
                            nominal: short.nominal,
                            used: short.used,
                            held_for: held_for.and_then(|h| self.state.job_uid(h)),
                            holding_cohort_quota: holding,
                        });
                        if !holding {
                            ctx.quota_memo.insert(key, r);
                        }
                        r
                    }
                };
                consider(reason, ctx.shortfall(reason), &mut best);
                continue;
            }
            // The queue's nominal quota kept for a job ahead in its line: a
            // job may take it if both fit within nominal, or if it ends before
            // that job can expect to start (backfill, applied to the queue).
            if let Some((h, nominal)) = self.own_queue_hold(ctx, &terms, queue, res)
                && let used = self.state.queues.get(queue).map_or(0, |q| q.usage(res))
                && !fits_beside(used, units, h.units, nominal)
            {
                if let Some(until) = h.until {
                    keep_latest(&mut exempt_until, until.0);
                }
                let available = nominal.saturating_sub(used.saturating_add(h.units));
                // Built only when it would be kept (the smallest shortfall
                // wins); a queue's hold stands all cycle, so jobs of its
                // queue alike in size and usage share one reason.
                let shortfall = units.saturating_sub(available);
                if best.is_none_or(|(_, b)| shortfall < b) {
                    let key = (queue, res, units, used);
                    let reason = match ctx.queue_hold_reasons.get(&key) {
                        Some(r) => *r,
                        None => {
                            let r = ctx.add_reason(PendingReason::QuotaExceeded {
                                flavor: self.state.inv.res_flavor_name(res).to_string(),
                                resource: self.state.inv.res_quota_name(res),
                                requested: units,
                                available,
                                nominal,
                                used,
                                held_for: self.state.job_uid(h.holder_idx),
                                holding_cohort_quota: false,
                            });
                            ctx.queue_hold_reasons.insert(key, r);
                            r
                        }
                    };
                    best = Some((reason, shortfall));
                }
                continue;
            }
            blocked_by_hold_only = false;
            alike = false;
            match self.try_place(idx, res, now, ctx) {
                Ok(plan) => return Ok(plan),
                Err(reason) => {
                    if matches!(
                        ctx.reason(reason),
                        Some(PendingReason::InsufficientCapacity { .. })
                    ) && first_capacity_failure.is_none()
                    {
                        first_capacity_failure = Some((res, reason));
                    }
                    consider(reason, ctx.shortfall(reason), &mut best);
                }
            }
        }
        if !holds.is_empty() {
            ctx.quota_holds.extend(holds);
            ctx.evaluate_first_next_cycle(&job.spec.uid);
            self.quota_changed(queue, ctx);
        }
        let mut reason = match best {
            Some((reason, _)) => reason,
            None => ctx.add_reason(PendingReason::NoMatchingFlavor {
                wants: String::new(),
            }),
        };
        let mut reserved: Option<(ResIdx, Timestamp)> = None;
        if let Some((res, capacity_reason)) = first_capacity_failure
            && self.state.config.backfill.enabled
            && ctx.reservations.count < self.state.config.backfill.max_reservations
            && let Some(start) = self.reserve(idx, res, now, ctx)
        {
            reserved = Some((res, start));
            expected_start = Some(expected_start.map_or(start, |e| e.max(start)));
            // The reserved flavor is the one the job will start in: explain that one.
            if let Some(mut annotated) = ctx.reason(capacity_reason).cloned() {
                if let PendingReason::InsufficientCapacity { reserved_start, .. } = &mut annotated {
                    *reserved_start = Some(start);
                }
                reason = ctx.add_reason(annotated);
            }
        }
        self.hold_queue_quota(idx, reserved, quota_short, now, ctx);
        // Waiting only because headroom is kept for a job ahead in line is
        // not a shortage preemption should fix; nor is a wait expected to
        // end within the grace period a preemption would cost anyway.
        let starts_soon = expected_start
            .is_some_and(|t| t <= now.plus_secs(self.state.config.preemption.grace_period_secs));
        let can_preempt = !blocked_by_hold_only && !starts_soon;
        let epoch = ctx.quota_epoch(queue);
        if alike
            && let Some(key) = ages.shape_key(queue, sharing, units)
            && let Some(known) = ctx.quota_blocked.slots_mut(key)
        {
            // The slot of a failure of the same span or a stale one, else
            // the last.
            let at = known
                .iter()
                .position(|k| {
                    k.as_ref().is_none_or(|k| {
                        k.epoch != epoch
                            || (k.exempt_until, k.passes_until) == (exempt_until, passes_until)
                    })
                })
                .unwrap_or(SHAPE_SLOTS - 1);
            if let Some(slot) = known.get_mut(at) {
                *slot = Some(QuotaBlocked {
                    epoch,
                    reason,
                    can_preempt,
                    exempt_until,
                    passes_until,
                });
            }
        }
        Err((reason, can_preempt))
    }

    /// When enough units of `res` are expected back for a job short of
    /// `short` units, counting the releases `of` keeps: the running jobs of a
    /// cohort (its pool) or of a queue, ending at their estimates. `None` when
    /// they never free that much.
    pub(crate) fn quota_release_time(
        &self,
        cache: &mut FastMap<ResIdx, Vec<CohortRelease>>,
        of: impl Fn(&CohortRelease) -> bool,
        res: ResIdx,
        short: u64,
        now: Timestamp,
    ) -> Option<Timestamp> {
        // One scan of the running jobs serves every cohort and queue: their
        // releases are sorted subsequences of all of them.
        let releases = cache
            .entry(res)
            .or_insert_with(|| self.cohort_releases(res, now));
        let mut freed = 0u64;
        for (end, units, ..) in releases.iter().filter(|r| of(r)) {
            freed += units;
            if freed >= short {
                return Some(*end);
            }
        }
        None
    }

    /// A blocked job that holds a node reservation, or that quota holds
    /// back, keeps its queue's nominal quota from the jobs behind
    /// it in its own queue once it has waited `backfill.queueHoldAfterSecs`:
    /// the first such job in each queue, so every queue
    /// has at most one queue hold per resource and no cap on holds can leave
    /// a queue's head unprotected. Nominal quota frees up as the queue's own
    /// jobs end, so without this a stream of the queue's small jobs takes it
    /// as fast as it appears and a gang that must borrow never starts. Only a
    /// job that fits within nominal holds: its queue alone can make room for
    /// it, so the hold ends. Jobs ending before it can expect to start pass.
    fn hold_queue_quota(
        &self,
        idx: JobIdx,
        reserved: Option<(ResIdx, Timestamp)>,
        quota_short: Option<(ResIdx, u64, Option<Timestamp>)>,
        now: Timestamp,
        ctx: &mut CycleCtx,
    ) {
        let Some(job) = self.state.job(idx) else {
            return;
        };
        let queue = job.queue;
        if !self.state.config.backfill.enabled
            || !self.hold_ages(job.spec.submitted_at, now).queue_hold
        {
            return;
        }
        let units = job.spec.total_units();
        // The queue's first hold stands; and only a job that fits within
        // nominal can be helped by the queue draining.
        let can_hold = |res: ResIdx| {
            !ctx.queue_holds.contains_key(&(queue, res))
                && self
                    .state
                    .queues
                    .get(queue)
                    .and_then(|q| q.quota(res))
                    .is_some_and(|s| units <= s.nominal)
        };
        let hold = match (reserved, quota_short) {
            (Some((res, start)), _) => can_hold(res).then_some((res, start)),
            (None, Some((res, need, cohort_until))) if can_hold(res) => {
                let room = if need == 0 {
                    Some(now)
                } else {
                    self.quota_release_time(
                        &mut ctx.cohort_releases,
                        |r| r.3 == queue,
                        res,
                        need,
                        now,
                    )
                };
                room.map(|t| (res, cohort_until.map_or(t, |c| c.max(t))))
            }
            (None, _) => None,
        };
        let Some((res, until)) = hold else { return };
        let hold = QuotaHold {
            units,
            holder_idx: idx,
            until: Some(until),
            binds_lenders: false,
        };
        ctx.queue_holds.insert((queue, res), hold);
        if let Some(cohort) = self.state.queues.get(queue).and_then(|q| q.cohort) {
            ctx.queue_holds_by_cohort
                .entry((cohort, res))
                .or_default()
                .push(CohortQueueHold {
                    queue,
                    hold,
                    keeps: units.min(self.unused_nominal(queue, res)),
                });
        }
        ctx.evaluate_first_next_cycle(&job.spec.uid);
        self.quota_changed(queue, ctx);
    }

    /// Which of the hold waits (see `HoldAges`) a job submitted at
    /// `submitted_at` has passed by `at`.
    fn hold_ages(&self, submitted_at: Timestamp, at: Timestamp) -> HoldAges {
        let waited = at.secs_since(submitted_at);
        HoldAges {
            queue_hold: waited >= self.state.config.backfill.queue_hold_after_secs,
            starving: waited >= self.state.config.backfill.borrower_hold_after_secs,
        }
    }

    /// The smallest nominal quota above zero among `queue`'s resources
    /// (`u64::MAX` without one): no job of at most that many units can be a
    /// starving borrower (see `starving_borrower`).
    fn smallest_nominal(&self, queue: QueueIdx) -> u64 {
        self.state
            .queues
            .get(queue)
            .and_then(|q| q.quotas.iter().map(|s| s.nominal).filter(|&n| n > 0).min())
            .unwrap_or(u64::MAX)
    }

    /// Bumps the quota epoch of `queue` and of every queue in its cohort:
    /// what a quota check reads (queue and cohort pool usage, cohort and
    /// queue holds) never crosses a cohort, so a change in one cohort leaves
    /// the other cohorts' quota failures valid.
    fn quota_changed(&self, queue: QueueIdx, ctx: &mut CycleCtx) {
        let cohort = self.state.queues.get(queue).and_then(|q| q.cohort);
        let queues = &self.state.queues.queues;
        if ctx.quota_epochs.len() < queues.len() {
            ctx.quota_epochs.resize(queues.len(), 0);
        }
        for ((other, q), epoch) in (0..).zip(queues).zip(&mut ctx.quota_epochs) {
            if other == queue || (cohort.is_some() && q.cohort == cohort) {
                *epoch += 1;
            }
        }
    }

    /// A job larger than its queue's nominal quota of `res`, so it can only
    /// run by borrowing, that has waited `backfill.borrowerHoldAfterSecs` by
    /// `at`. Its cohort hold binds every member (see
    /// `QuotaHold::binds_lenders`): each queue's own jobs would otherwise
    /// take back their nominal quota as it frees up, and it would never
    /// start. A queue without nominal quota only borrows what the others
    /// leave idle, by its definition: its jobs never starve others.
    pub(crate) fn starving_borrower(&self, job: &Job, res: ResIdx, at: Timestamp) -> bool {
        self.hold_ages(job.spec.submitted_at, at).starving
            && self
                .state
                .queues
                .get(job.queue)
                .and_then(|q| q.quota(res))
                .is_some_and(|s| s.nominal > 0 && job.spec.total_units() > s.nominal)
    }

    /// Unused nominal quota of `res` that the other queues of `cohort` keep
    /// for their blocked jobs (see `hold_queue_quota`) from `borrower`,
    /// apart from holds `exempt` lets it through.
    fn kept_by_queue_holds(
        &self,
        ctx: &CycleCtx,
        cohort: CohortIdx,
        borrower: QueueIdx,
        res: ResIdx,
        exempt: &impl Fn(&QuotaHold) -> bool,
    ) -> KeptQuota {
        let mut kept = KeptQuota::default();
        // The holds of the cohort's queues in the order they were made:
        // the first holder found is named, and a restored allocator, whose
        // queue slots may differ, names the same one.
        let holding = ctx.queue_holds_by_cohort.get(&(cohort, res));
        for held in holding.into_iter().flatten() {
            let (h, units) = (&held.hold, held.keeps);
            if held.queue == borrower || units == 0 {
                continue;
            }
            if exempt(h) {
                if let Some(until) = h.until {
                    keep_earliest(&mut kept.passed_until, until.0);
                }
                continue;
            }
            kept.units = kept.units.saturating_add(units);
            kept.first_holder.get_or_insert(h.holder_idx);
            if let Some(until) = h.until {
                keep_latest(&mut kept.latest_until, until.0);
            }
        }
        kept
    }

    /// Whether `job` would borrow `res` if admitted now.
    fn would_borrow(&self, job: &Job, res: ResIdx) -> bool {
        self.state.queues.get(job.queue).is_some_and(|q| {
            q.usage(res).saturating_add(job.spec.total_units())
                > q.quota(res).map_or(0, |s| s.nominal)
        })
    }

    /// How this cycle's holds bear on `job` (slot `idx`) in `res`, if it
    /// `borrows` or not.
    fn hold_terms(
        &self,
        job: &Job,
        idx: JobIdx,
        res: ResIdx,
        end: Option<Timestamp>,
        now: Timestamp,
        borrows: bool,
    ) -> HoldTerms {
        let units = job.spec.total_units();
        HoldTerms {
            idx,
            borrows,
            // Only a borrower can be one (checked first: this runs for most
            // jobs of every cycle).
            starving: borrows
                && self.starving_borrower(job, res, now)
                && self.state.queues.fits_when_idle(job.queue, res, units),
            end,
        }
    }

    /// Cohort headroom this cycle's holds keep from a job: what its cohort's
    /// hold keeps, if it binds the job, and the nominal quota other queues
    /// keep for their own blocked jobs, which is not lent to a borrower that
    /// would still hold it then (a starving borrower comes first). With the
    /// holder named first, and what the queue holds said, if asked. `hold`:
    /// the cohort's hold in `res`, which the caller has looked up.
    fn held(
        &self,
        ctx: &CycleCtx,
        terms: HoldTerms,
        queue: QueueIdx,
        cohort: Option<CohortIdx>,
        res: ResIdx,
        hold: Option<&QuotaHold>,
    ) -> (u64, Option<JobIdx>, Option<KeptQuota>) {
        let Some(c) = cohort else {
            return (0, None, None);
        };
        let (held, held_for) = match hold {
            Some(h) if terms.bound(h) && h.holder_idx != terms.idx && !terms.exempt(h) => {
                (h.units, Some(h.holder_idx))
            }
            _ => (0, None),
        };
        if !terms.borrows || terms.starving {
            return (held, held_for, None);
        }
        let kept = self.kept_by_queue_holds(ctx, c, queue, res, &|h| terms.exempt(h));
        (
            held.saturating_add(kept.units),
            held_for.or(kept.first_holder),
            Some(kept),
        )
    }

    /// The hold `queue` keeps on its own nominal quota of `res` for another
    /// of its jobs, unless it lets the job `terms` describe through, with
    /// that nominal quota. The job may use only what the queue leaves unused
    /// beyond the held units.
    fn own_queue_hold<'c>(
        &self,
        ctx: &'c CycleCtx,
        terms: &HoldTerms,
        queue: QueueIdx,
        res: ResIdx,
    ) -> Option<(&'c QuotaHold, u64)> {
        let h = ctx.queue_holds.get(&(queue, res))?;
        if h.holder_idx == terms.idx || terms.exempt(h) {
            return None;
        }
        let nominal = self.state.queues.get(queue)?.quota(res)?.nominal;
        Some((h, nominal))
    }

    /// What this cycle's holds keep from job `idx` in `res`, as `evaluate`
    /// counts it. A victim search counts it too: without it, evicting a
    /// small job let a bigger one in on quota kept for a job ahead in line.
    pub(crate) fn held_from(
        &self,
        ctx: &CycleCtx,
        idx: JobIdx,
        res: ResIdx,
        now: Timestamp,
    ) -> HeldFrom {
        let Some(job) = self.state.job(idx) else {
            return HeldFrom::default();
        };
        let cohort = self.state.queues.get(job.queue).and_then(|q| q.cohort);
        let (_, end) = estimated_end(job.spec.runtime_estimate_secs, now);
        let hold = cohort.and_then(|c| ctx.quota_holds.get(&(c, res)));
        // Whether the job borrows depends on the victims its own queue
        // loses: both cases, for the search to pick per victim set.
        let borrowing = self.hold_terms(job, idx, res, end, now, true);
        let within_nominal = self.hold_terms(job, idx, res, end, now, false);
        let held = |terms| self.held(ctx, terms, job.queue, cohort, res, hold).0;
        // A queue hold keeps quota from the jobs behind its holder; the main
        // pass meets the jobs ahead before the hold is made.
        let own_queue = self
            .own_queue_hold(ctx, &borrowing, job.queue, res)
            .filter(|(h, _)| {
                self.state
                    .job(h.holder_idx)
                    .is_some_and(|holder| self.line_place(holder, now) < self.line_place(job, now))
            })
            .map(|(h, _)| h.units);
        HeldFrom {
            nominal: self
                .state
                .queues
                .get(job.queue)
                .and_then(|q| q.quota(res))
                .map_or(0, |s| s.nominal),
            cohort_if_borrowing: held(borrowing),
            cohort_within_nominal: held(within_nominal),
            own_queue,
        }
    }

    /// What `queue` leaves unused of its nominal quota of `res`.
    fn unused_nominal(&self, queue: QueueIdx, res: ResIdx) -> u64 {
        self.state.queues.get(queue).map_or(0, |q| {
            q.quota(res)
                .map_or(0, |s| s.nominal)
                .saturating_sub(q.usage(res))
        })
    }

    /// Brings up to date what the queue hold of `queue` in `res`, if any,
    /// keeps from the other queues of its cohort, after its usage changed.
    fn refresh_queue_hold(&self, queue: QueueIdx, res: ResIdx, ctx: &mut CycleCtx) {
        if !ctx.queue_holds.contains_key(&(queue, res)) {
            return;
        }
        let Some(cohort) = self.state.queues.get(queue).and_then(|q| q.cohort) else {
            return;
        };
        let unused = self.unused_nominal(queue, res);
        let group = ctx.queue_holds_by_cohort.get_mut(&(cohort, res));
        for held in group.into_iter().flatten() {
            if held.queue == queue {
                held.keeps = held.hold.units.min(unused);
            }
        }
    }

    /// Expected releases of the jobs running in `res`, in time order.
    fn cohort_releases(&self, res: ResIdx, now: Timestamp) -> Vec<CohortRelease> {
        self.state.job_releases_in(res, now, |(end, units, queue)| {
            let cohort = self.state.queues.get(queue).and_then(|q| q.cohort);
            (end, units, cohort, queue)
        })
    }

    fn cohort_release(
        &self,
        idx: JobIdx,
        job: &Job,
        run: &Running,
        res: ResIdx,
        now: Timestamp,
    ) -> Option<CohortRelease> {
        (run.res == res).then(|| {
            (
                self.state.expected_end(idx, now),
                run.admission.total_units(),
                self.state.queues.get(job.queue).and_then(|q| q.cohort),
                job.queue,
            )
        })
    }

    /// Release timeline of `res`, computed once per cycle until an admission
    /// in `res` changes it.
    pub(crate) fn timeline_cached(
        alloc: &Allocator,
        cache: &mut FastMap<ResIdx, Rc<Timeline>>,
        res: ResIdx,
        now: Timestamp,
    ) -> Rc<Timeline> {
        Rc::clone(
            cache
                .entry(res)
                .or_insert_with(|| Rc::new(alloc.state.release_timeline(res, now))),
        )
    }

    /// Computes and records a reservation for a blocked job.
    pub(crate) fn reserve(
        &mut self,
        idx: JobIdx,
        res: ResIdx,
        now: Timestamp,
        ctx: &mut CycleCtx,
    ) -> Option<Timestamp> {
        let timeline = Self::timeline_cached(self, &mut ctx.timelines, res, now);
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

    /// Finds concrete nodes for every worker of a job in `res`, honouring
    /// node filters and this cycle's reservations.
    pub(crate) fn try_place(
        &self,
        idx: JobIdx,
        res: ResIdx,
        now: Timestamp,
        ctx: &mut CycleCtx,
    ) -> Result<Plan, ReasonIdx> {
        let Some(job) = self.state.job(idx) else {
            return Err(ctx.add_reason(PendingReason::QueueNotFound {
                queue: String::new(),
            }));
        };
        let spec = &job.spec;
        let per_worker = spec.gpus_per_worker;
        let workers = spec.num_workers;
        let (end_key, end) = estimated_end(spec.runtime_estimate_secs, now);
        let gang = Gang::of(spec);
        let key = MemoKey {
            res,
            gang,
            filter: job.filter,
        };
        if let Some(entry) = ctx.memo.get(&key)
            && entry.min_failing_end <= end_key
        {
            ctx.stats.memo_hits += 1;
            return Err(entry.reason);
        }
        let Some(r) = self.state.inv.res(res) else {
            let reason = self.capacity_reason(res, spec, (0, 0), job.filter, &mut ctx.empty_slots);
            return Err(ctx.add_reason(reason));
        };
        let protected = ctx.reservations.has_any(res);
        let mut placement = None;
        let mut placeable: u64 = 0;
        let mut placeable_unprotected: u64 = 0;
        // Workers the free units could host beyond those CPU and memory let in.
        let mut lacking_cpu_memory: u64 = 0;
        let mut candidates: Vec<Candidate> = Vec::new();
        // Walked even when the free units cannot hold the gang: its reason
        // tells how many of its workers fit now.
        for (node_idx, free) in r.nodes_with_free(per_worker) {
            let Some(node) = self.state.inv.node(node_idx) else {
                continue;
            };
            if !self.state.admits(node, job.filter) {
                continue;
            }
            let capped = node.usable_units(free, gang);
            if capped != free {
                lacking_cpu_memory += gang.slots(free) - gang.slots(capped);
            }
            placeable_unprotected += gang.slots(capped);
            // Reserved units first, then CPU and memory: they cap what the
            // reservation leaves, not the other way round.
            let usable = if protected {
                let unreserved =
                    free.saturating_sub(ctx.reservations.protected(node_idx, res, end));
                node.usable_units(unreserved, gang)
            } else {
                capped
            };
            if usable < per_worker {
                continue;
            }
            let candidate = Candidate {
                node: node_idx,
                usable,
                zone: node.zone,
                rack: node.rack,
            };
            placeable += gang.slots(usable);
            if workers == 1 && !protected {
                // Buckets are walked in ascending free order: the first
                // admissible node is the best fit.
                placement = Some(vec![(node_idx, 1)]);
                break;
            }
            candidates.push(candidate);
        }
        if placement.is_none() && placeable >= u64::from(workers) {
            placement = placement::place_gang(gang, &candidates);
        }
        if let Some(placement) = placement {
            let ahead_of = if protected {
                ctx.reservations
                    .first_holder
                    .get(&res)
                    .map(|(u, _)| u.clone())
            } else {
                None
            };
            return Ok(Plan {
                res,
                per_worker,
                placement,
                ahead_of,
            });
        }
        let reason = match ctx.reservations.first_holder.get(&res) {
            Some((holder, until)) if protected && placeable_unprotected >= u64::from(workers) => {
                PendingReason::HeldForReservation {
                    flavor: self.state.inv.res_flavor_name(res).to_string(),
                    resource: self.state.inv.res_quota_name(res),
                    reserved_for: holder.clone(),
                    until: *until,
                }
            }
            _ => {
                // A gang that must stay in one zone or rack: what the
                // roomiest one holds, not what all of them do.
                let placeable = placement::most_placeable(
                    gang,
                    candidates.iter().map(|c| (c.usable, c.zone, c.rack)),
                );
                let fitting = |slots: u64| slots.min(u64::from(workers));
                let lacking = fitting(placeable_unprotected + lacking_cpu_memory)
                    - fitting(placeable_unprotected);
                self.capacity_reason(
                    res,
                    spec,
                    (placeable, lacking),
                    job.filter,
                    &mut ctx.empty_slots,
                )
            }
        };
        let reason = ctx.add_reason(reason);
        let entry = ctx.memo.entry(key).or_insert(MemoEntry {
            min_failing_end: end_key,
            reason,
        });
        if end_key < entry.min_failing_end {
            entry.min_failing_end = end_key;
            entry.reason = reason;
        }
        Err(reason)
    }

    /// Workers of the job `spec` describes that the nodes of `res` `filter`
    /// admits could host, in one zone or rack if it must stay in one, if
    /// every running job ended. (Not a promise: nodes come and go; it tells
    /// "wait" apart from "never, as is".)
    pub(crate) fn slots_when_empty(
        &self,
        res: ResIdx,
        spec: &JobSpec,
        filter: u32,
        cache: &mut EmptySlots,
    ) -> u64 {
        let gang = Gang::of(spec);
        // The count of workers does not change what each node hosts.
        let key = (res, filter, Gang { workers: 0, ..gang });
        if let Some(slots) = cache.get(&key) {
            return *slots;
        }
        let slots = self.state.inv.res(res).map_or(0, |r| {
            let nodes = r
                .nodes_with_free(0)
                .filter_map(|(n, _)| self.state.inv.node(n))
                .filter(|node| self.state.admits(node, filter))
                .map(|node| {
                    let capacity = node.pool(res).map_or(0, |p| p.capacity);
                    let usable = node.usable_units_after(capacity, gang, node.cpu_memory_used);
                    (usable, node.zone, node.rack)
                });
            placement::most_placeable(gang, nodes)
        });
        cache.insert(key, slots);
        slots
    }

    /// Why the job `spec` describes does not fit the nodes of `res` now:
    /// `placeable` of its workers are all that do (in one zone or rack if
    /// it must stay in one), and `lacking_cpu_memory` more are what the free
    /// units could host but not the CPU or memory beside them.
    pub(crate) fn capacity_reason(
        &self,
        res: ResIdx,
        spec: &JobSpec,
        (placeable, lacking_cpu_memory): (u64, u64),
        filter: u32,
        empty_slots: &mut EmptySlots,
    ) -> PendingReason {
        let (per_worker, workers) = (spec.gpus_per_worker, spec.num_workers);
        let placeable = placeable.min(u64::from(workers));
        // Workers that lack only CPU or memory are not short of units.
        let short_workers = u64::from(workers).saturating_sub(placeable + lacking_cpu_memory);
        let empty_slots = self.slots_when_empty(res, spec, filter, empty_slots);
        PendingReason::InsufficientCapacity {
            flavor: self.state.inv.res_flavor_name(res).to_string(),
            resource: self.state.inv.res_quota_name(res),
            workers,
            units_per_worker: per_worker,
            placeable_workers: u32::try_from(placeable).unwrap_or(u32::MAX),
            units_short: short_workers * u64::from(per_worker),
            reserved_start: None,
            fits_when_empty: empty_slots >= u64::from(workers),
            required_topology: (spec.topology != TopologyRequirement::Preferred && workers > 1)
                .then_some(spec.topology),
            held_by_other_pods: self.state.inv.res(res).map_or(0, |r| r.held_by_other_pods),
            workers_lacking_cpu_memory: u32::try_from(lacking_cpu_memory).unwrap_or(u32::MAX),
            cpu_memory_per_worker: spec.cpu_memory_per_worker,
            node_constrained: filter != 0,
        }
    }

    /// Turns a plan into an admission decision and commits it.
    pub(crate) fn admit(
        &mut self,
        idx: JobIdx,
        plan: Plan,
        now: Timestamp,
        out: &mut CycleOutcome,
    ) {
        let Some(job) = self.state.job(idx) else {
            return;
        };
        let Some(r) = self.state.inv.res(plan.res) else {
            return;
        };
        let flavor = self.state.inv.flavors.get(r.flavor as usize);
        let flavor_labels = flavor.map(|f| f.labels.clone()).unwrap_or_default();
        let mut workers = Vec::new();
        let mut zones = BTreeSet::new();
        let mut racks = BTreeSet::new();
        for (node_idx, count) in &plan.placement {
            let Some(node) = self.state.inv.node(*node_idx) else {
                continue;
            };
            zones.insert(node.zone);
            racks.insert(node.rack);
            let request = node
                .pool(plan.res)
                .map(|p| p.request_name.clone())
                .unwrap_or_default();
            for _ in 0..*count {
                let mut selector = flavor_labels.clone();
                selector.insert(names::HOSTNAME_LABEL.to_string(), node.info.name.clone());
                workers.push(WorkerPlacement {
                    index: u32::try_from(workers.len()).unwrap_or(u32::MAX),
                    node: node.info.name.clone(),
                    node_selector: selector,
                    request_resource: request.clone(),
                });
            }
        }
        let single = |set: &BTreeSet<u32>| {
            (set.len() == 1)
                .then(|| set.iter().next().copied())
                .flatten()
        };
        let topology = TopologyAssignment {
            zone: single(&zones)
                .and_then(|z| self.state.inv.zones.name(z))
                .map(str::to_string),
            rack: single(&racks)
                .and_then(|r| self.state.inv.racks.name(r))
                .map(str::to_string),
            rack_label: self.state.config.rack_label.clone(),
            nodes: u32::try_from(plan.placement.len()).unwrap_or(u32::MAX),
        };
        let total = job.spec.total_units();
        let queue = self.state.queues.get(job.queue);
        let borrowing = queue.is_some_and(|q| {
            q.usage(plan.res) + total > q.quota(plan.res).map_or(0, |s| s.nominal)
        });
        let admission = Admission {
            uid: job.spec.uid.clone(),
            namespace: job.spec.namespace.clone(),
            name: job.spec.name.clone(),
            queue: queue.map(|q| q.name.to_string()).unwrap_or_default(),
            flavor: self.state.inv.flavor_name(r.flavor).to_string(),
            resource: self.state.inv.res_quota_name(plan.res),
            units_per_worker: plan.per_worker,
            capacity_type: flavor.and_then(|f| f.capacity_type),
            workers,
            tolerations: flavor.map(|f| f.tolerations.clone()).unwrap_or_default(),
            topology,
            admitted_at: now,
            borrowing,
            backfilled_ahead_of: plan.ahead_of.clone(),
        };
        out.admissions.push(admission.clone());
        self.state
            .commit(idx, plan.res, plan.per_worker, plan.placement, admission);
    }

    // ------------------------------------------------------------- preemption

    pub(crate) fn preemption_pass(
        &mut self,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        let policy = self.state.config.preemption;
        let mut attempts = 0u32;
        let mut decided = 0u32;
        // Per failed key, the earliest estimated end (u64::MAX = none) of a
        // job that failed: a job ending later is let through by no more
        // holds (see `HoldTerms::exempt`), so fails too.
        let mut failed_searches: FastMap<PreemptionKey, u64> = FastMap::default();
        let mut inflight = self.inflight();
        let draining: Vec<_> = ctx
            .quota_holds
            .iter()
            .filter(|(_, h)| h.binds_lenders)
            .map(|(&(cohort, res), h)| (cohort, res, h.holder_idx))
            .collect();
        for (slot, idx) in std::mem::take(&mut ctx.may_preempt) {
            if attempts >= policy.max_attempts_per_cycle
                || decided >= policy.max_preemptions_per_cycle
            {
                break;
            }
            if !self.may_try_preemption(idx) {
                continue;
            }
            // Jobs alike in every respect the victim search looks at fail
            // alike; decisions within the cycle only make it harder.
            // A draining holder may take what others of its shape may not.
            let holds_drain = draining.iter().any(|&(.., holder)| holder == idx);
            let key = self.state.job(idx).and_then(|j| {
                (j.preempted_by.is_none() && !holds_drain).then(|| PreemptionKey {
                    queue: j.queue,
                    priority: j.spec.priority,
                    gang: Gang::of(&j.spec),
                    filter: j.filter,
                    sharing: j.spec.allow_gpu_sharing,
                    slice: j.spec.gpu_slice.clone(),
                })
            });
            let end = self.state.job(idx).map_or(u64::MAX, |j| {
                estimated_end(j.spec.runtime_estimate_secs, now).0
            });
            if let Some(key) = &key
                && failed_searches
                    .get(key)
                    .is_some_and(|&failing_end| end >= failing_end)
            {
                continue;
            }
            if self
                .state
                .job(idx)
                .is_some_and(|j| j.preemption_retry_after > now)
            {
                continue;
            }
            attempts += 1;
            ctx.stats.preemption_attempts += 1;
            let Some(plan) = self.find_victims(idx, now, &inflight, &draining, ctx) else {
                if let Some(key) = key {
                    let failing_end = failed_searches.entry(key).or_insert(end);
                    *failing_end = (*failing_end).min(end);
                }
                // Back off linearly, one grace period per failure up to
                // eight: the state that made the search fail rarely changes
                // within a cycle or two, and other blocked jobs get the turn.
                let grace = policy.grace_period_secs.max(1);
                if let Some(job) = self.state.job_mut(idx) {
                    job.preemption_failures = job.preemption_failures.saturating_add(1).min(8);
                    job.preemption_retry_after =
                        now.plus_secs(grace * u64::from(job.preemption_failures));
                }
                continue;
            };
            if let Some(job) = self.state.job_mut(idx) {
                job.preemption_failures = 0;
                job.preemption_retry_after = Timestamp(0);
            }
            let Some(preemption) = self.start_preemption(idx, &plan, now) else {
                continue;
            };
            decided += 1;
            // The decision changes usage projections and claims.
            inflight = self.inflight();
            if let Some(f) = out.pending.get_mut(slot) {
                f.reason = ctx.add_reason(PendingReason::AwaitingPreemption {
                    victims: u32::try_from(preemption.victims.len()).unwrap_or(u32::MAX),
                    evict_at: preemption.evict_at,
                });
            }
            out.preemptions.push(preemption);
        }
    }

    /// Running job `idx` as a victim of `rule`.
    fn victim(&self, idx: JobIdx, rule: PreemptionRule) -> Option<Victim> {
        let job = self.state.job(idx)?;
        let run = job.running()?;
        Some(Victim {
            uid: job.spec.uid.clone(),
            namespace: job.spec.namespace.clone(),
            name: job.spec.name.clone(),
            queue: self.state.queues.name_of(job.queue),
            units: run.admission.total_units(),
            rule,
        })
    }

    /// Tells the admitted jobs of every draining queue to checkpoint: each
    /// is evicted when the grace period ends (or once it checkpointed), then
    /// waits in the queue's line while the queue is held. A job already
    /// being preempted goes as that preemption planned.
    pub(crate) fn start_drains(&mut self, now: Timestamp, out: &mut CycleOutcome) {
        let draining: Vec<QueueIdx> = (0..self.state.queues.queues.len())
            .filter_map(|i| u32::try_from(i).ok())
            .filter(|q| {
                self.state
                    .queues
                    .get(*q)
                    .and_then(|q| q.spec.as_ref())
                    .is_some_and(|spec| spec.drain)
            })
            .collect();
        let evict_at = now.plus_secs(self.state.config.preemption.grace_period_secs);
        for queue in draining {
            let told: Vec<JobIdx> = self
                .state
                .running_by_queue
                .iter()
                .filter(|((q, _), _)| *q == queue)
                .flat_map(|(_, jobs)| jobs.iter().copied())
                .filter(|idx| {
                    self.state
                        .job(*idx)
                        .and_then(Job::running)
                        .is_some_and(|r| r.preempting.is_none())
                })
                .collect();
            if told.is_empty() {
                continue;
            }
            let victims: Vec<Victim> = self
                .state
                .by_arrival(told)
                .into_iter()
                .filter_map(|idx| self.victim(idx, PreemptionRule::Drain))
                .collect();
            self.state.start_preempting(&victims, None, evict_at);
            out.drains.push(Drain {
                queue: self.state.queues.name_of(queue),
                victims,
                decided_at: now,
                evict_at,
            });
        }
    }

    /// Records victims and the preemptor's nomination.
    pub(crate) fn start_preemption(
        &mut self,
        idx: JobIdx,
        plan: &crate::preemption::VictimPlan,
        now: Timestamp,
    ) -> Option<Preemption> {
        let evict_at = now.plus_secs(self.state.config.preemption.grace_period_secs);
        let preemptor = self.state.job(idx)?.spec.uid.clone();
        let mut victims = Vec::new();
        for (victim, rule) in &plan.victims {
            victims.push(self.victim(*victim, *rule)?);
        }
        // A victim search passes over jobs already being preempted.
        self.state
            .start_preempting(&victims, Some(&preemptor), evict_at);
        let flavor = self.state.inv.res_flavor_name(plan.res).to_string();
        let resource = self.state.inv.res_quota_name(plan.res);
        let nodes: Vec<PlannedNode> = plan
            .placement
            .iter()
            .filter_map(|(n, w)| {
                self.state.inv.node(*n).map(|node| PlannedNode {
                    node: node.info.name.clone(),
                    workers: *w,
                })
            })
            .collect();
        if let Some(job) = self.state.job_mut(idx) {
            job.state = JobState::Pending(Some(Box::new(Nomination {
                victims: victims.iter().map(|v| v.uid.clone()).collect(),
                evict_at,
                flavor: flavor.clone(),
                resource: resource.clone(),
                nodes: nodes.clone(),
            })));
        }
        self.state.nominated.insert(idx);
        Some(Preemption {
            preemptor,
            victims,
            flavor,
            resource,
            planned_nodes: nodes,
            decided_at: now,
            evict_at,
        })
    }

    pub(crate) fn options_of(&self, idx: JobIdx) -> Vec<ResIdx> {
        let mut out = Vec::new();
        if let Some(job) = self.state.job(idx) {
            self.options_for(job, &mut out);
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{CycleCtx, EarlyFailures, HoldAges, LaneJob, LaneKey};
    use crate::types::Timestamp;
    use crate::{
        Allocator, AllocatorConfig, BackfillPolicy, CycleOutcome, Event, FlavorQuota, JobSpec,
        JobUid, PendingExplanation, QueueSpec, ResourceQuota, names,
    };

    use crate::testing::Rng;

    #[test]
    fn an_early_failure_is_taken_once_and_only_by_its_job() {
        let mut early = EarlyFailures::default();
        early.insert(3, (7, true));
        early.insert(200, (8, false));
        // 131 and 8 share a word or a bit with job 3 or 200 without being them.
        assert_eq!(early.take(131), None);
        assert_eq!(early.take(8), None);
        assert_eq!(early.take(10_000), None, "beyond every marked word");
        assert_eq!(early.take(3), Some((7, true)));
        assert_eq!(early.take(3), None, "taken once");
        assert_eq!(early.take(200), Some((8, false)));
    }

    /// Two cohorts of three queues and a queue of its own, on 16 nodes of
    /// 8 GPUs (half of them labelled `pool: a`); quota holds start early so
    /// that jobs cross both hold ages during the run.
    fn contested_cluster() -> Allocator {
        let mut alloc = Allocator::new(AllocatorConfig {
            backfill: BackfillPolicy {
                queue_hold_after_secs: 300,
                borrower_hold_after_secs: 600,
                ..BackfillPolicy::default()
            },
            ..AllocatorConfig::default()
        })
        .expect("valid config");
        for n in 0..16 {
            let mut node = crate::backfill::tests::node(&format!("node-{n}"));
            if n % 2 == 0
                && let Event::NodeUpserted(info) = &mut node
            {
                info.labels.insert("pool".into(), "a".into());
            }
            alloc.apply(node).expect("node");
        }
        let cohorts = [
            Some("c0"),
            Some("c0"),
            Some("c0"),
            Some("c1"),
            Some("c1"),
            Some("c1"),
            None,
        ];
        let nominal = [16, 8, 24, 8, 16, 32, 16];
        for (q, (cohort, nominal)) in cohorts.iter().zip(nominal).enumerate() {
            let queue = QueueSpec {
                name: format!("q{q}"),
                cohort: cohort.map(str::to_string),
                quotas: vec![FlavorQuota {
                    flavor: "A100.on-demand".into(),
                    resources: vec![ResourceQuota {
                        resource: names::GPU_RESOURCE.into(),
                        nominal,
                        ..ResourceQuota::default()
                    }],
                }],
                ..QueueSpec::default()
            };
            alloc.apply(Event::QueueUpserted(queue)).expect("queue");
        }
        alloc
    }

    /// What a queue hold keeps from its cohort's borrowers follows its
    /// queue's admissions within the cycle: a job the holder lets through
    /// uses some of the held nominal quota.
    #[test]
    fn a_queue_hold_keeps_only_what_its_queue_leaves_unused() {
        let mut alloc = contested_cluster();
        for (uid, queue, workers) in [
            ("holder", "q0", 2),
            ("small", "q0", 1),
            ("borrower", "q1", 1),
        ] {
            let job = JobSpec {
                uid: JobUid::new(uid),
                namespace: "ml".into(),
                name: uid.into(),
                queue: Some(queue.into()),
                submitted_at: Timestamp(0),
                num_workers: workers,
                gpus_per_worker: 8,
                ..JobSpec::default()
            };
            alloc.apply(Event::JobSubmitted(job)).expect("job");
        }
        let idx = |alloc: &Allocator, uid: &str| alloc.job_idx(&JobUid::new(uid)).expect("job");
        let (holder, small) = (idx(&alloc, "holder"), idx(&alloc, "small"));
        let queue_of =
            |alloc: &Allocator, uid: &str| alloc.state.job(idx(alloc, uid)).expect("job").queue;
        let borrower = queue_of(&alloc, "borrower");
        let cohort = alloc
            .state
            .queues
            .get(queue_of(&alloc, "holder"))
            .and_then(|q| q.cohort)
            .expect("cohort");
        let res = *alloc.options_of(holder).first().expect("an option");
        let now = Timestamp(3_600);
        let mut ctx = CycleCtx::default();
        // q0's nominal quota (16) kept whole for the holder.
        alloc.hold_queue_quota(holder, Some((res, now.plus_secs(600))), None, now, &mut ctx);
        let kept = |alloc: &Allocator, ctx: &CycleCtx| {
            alloc
                .kept_by_queue_holds(ctx, cohort, borrower, res, &|_| false)
                .units
        };
        assert_eq!(kept(&alloc, &ctx), 16);
        let plan = alloc.try_place(small, res, now, &mut ctx).expect("room");
        alloc.admit_in_cycle(small, plan, now, &mut ctx, &mut CycleOutcome::default());
        assert_eq!(kept(&alloc, &ctx), 8);
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

    fn head(priority: i32, submitted_at: u64, seq: u64) -> LaneJob {
        LaneJob {
            priority,
            submitted_at: Timestamp(submitted_at),
            idx: 0,
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

    #[test]
    fn shape_keys_tell_every_field_apart_and_refuse_what_does_not_fit() {
        let ages = |queue_hold, starving| HoldAges {
            queue_hold,
            starving,
        };
        let mut keys = Vec::new();
        for queue in [0, 1, 7, (1 << 29) - 1] {
            for sharing in [false, true] {
                for units in [0, 1, 8, u64::from(u32::MAX)] {
                    for (hold, starving) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        keys.push(ages(hold, starving).shape_key(queue, sharing, units));
                    }
                }
            }
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        assert!(keys.iter().all(Option::is_some));
        // Beyond the key's room: no key, so the job is evaluated in full.
        assert_eq!(ages(true, true).shape_key(1 << 29, false, 8), None);
        assert_eq!(
            ages(false, false).shape_key(0, false, u64::from(u32::MAX) + 1),
            None
        );
    }
}
