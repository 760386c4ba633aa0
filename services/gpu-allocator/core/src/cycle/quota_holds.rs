//! Quota holds: quota kept for a blocked job so that a stream of smaller
//! jobs cannot take it as fast as it frees up. A cohort hold keeps the
//! cohort pool's headroom for the first job only the pool blocks; a queue
//! hold keeps a queue's own nominal quota for one of its jobs. Jobs whose
//! estimated end comes before the holder can expect the quota may still use
//! it. `held_from` says what this cycle's holds keep from one job.

use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::cycle::evaluate::{estimated_end, keep_earliest, keep_latest};
use crate::ids::{CohortIdx, JobIdx, QueueIdx, ResourceIdx};
use crate::memo::CycleMemo;
use crate::state::jobs::{Job, Running};
use crate::types::Timestamp;

/// Quota kept for a blocked job: cohort headroom for the first job that only
/// the pool blocks, or a queue's nominal quota for one of its own jobs.
#[derive(Clone, Copy)]
pub(crate) struct QuotaHold {
    pub(crate) units: u64,
    /// The job held for: its uid is read only when a reason names it.
    pub(crate) holder_idx: JobIdx,
    /// When the holder can expect enough headroom; jobs ending by then may
    /// still use the held units.
    pub(crate) until: Option<Timestamp>,
    /// A cohort hold of a starving borrower (see `starving_borrower`): it
    /// binds every member's jobs, not only those that would borrow.
    pub(crate) binds_lenders: bool,
}

/// How this cycle's holds bear on one job in one resource.
#[derive(Clone, Copy)]
pub(crate) struct HoldTerms {
    pub(crate) idx: JobIdx,
    /// The job would borrow. Nominal quota is guaranteed: a hold only stops
    /// jobs that would borrow, or every job if it binds lenders too.
    pub(crate) borrows: bool,
    /// A starving borrower: nominal quota other queues keep does not stop it.
    pub(crate) starving: bool,
    /// Estimated end: a job gone before the holder can expect its headroom
    /// may use it (backfill, applied to quota).
    pub(crate) end: Option<Timestamp>,
}

impl HoldTerms {
    pub(crate) fn bound(&self, h: &QuotaHold) -> bool {
        self.borrows || h.binds_lenders
    }

    pub(crate) fn exempt(&self, h: &QuotaHold) -> bool {
        matches!((self.end, h.until), (Some(end), Some(until)) if end <= until)
    }
}

/// What this cycle's holds keep from one job in one resource (see
/// `Allocator::held_from`).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeldFrom {
    /// The job's queue's nominal quota of the resource.
    pub(crate) nominal: u64,
    /// Cohort headroom kept from it if it would borrow.
    pub(crate) cohort_if_borrowing: u64,
    /// Cohort headroom kept from it within its nominal quota (only a
    /// starving borrower's hold keeps any: nominal quota is guaranteed).
    pub(crate) cohort_within_nominal: u64,
    /// Units of its own queue's nominal quota kept for a job ahead of it in
    /// line.
    pub(crate) own_queue: Option<u64>,
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
pub(crate) fn fits_beside(used: u64, units: u64, kept: u64, nominal: u64) -> bool {
    used.saturating_add(units).saturating_add(kept) <= nominal
}

/// (expected end, units, cohort of the job's queue, the queue) of a running job.
pub(crate) type CohortRelease = (Timestamp, u64, Option<CohortIdx>, QueueIdx);

/// A queue hold as the other queues of its cohort see it (see
/// `CycleCtx::queue_holds_by_cohort`).
pub(crate) struct CohortQueueHold {
    pub(crate) queue: QueueIdx,
    pub(crate) hold: QuotaHold,
    /// What it keeps from borrowers: the held units, up to what the queue
    /// leaves unused of its nominal quota. Kept up to date as the queue
    /// admits jobs (see `admit_in_cycle`), so that the borrowers checked
    /// in between do not look the queue up each.
    pub(crate) keeps: u64,
}

/// What other queues' holds keep from a borrower (see `kept_by_queue_holds`).
#[derive(Default)]
pub(crate) struct KeptQuota {
    pub(crate) units: u64,
    /// The first holder found.
    pub(crate) first_holder: Option<JobIdx>,
    /// The latest time a hold that counted lets jobs ending by then through.
    pub(crate) latest_until: Option<u64>,
    /// The earliest time a hold that would have counted but lets this job
    /// through lets jobs ending by then through.
    pub(crate) passed_until: Option<u64>,
}

/// The waits a job has passed that change how a quota failure is handled:
/// `backfill.queueHoldAfterSecs` (it may keep its queue's quota) and
/// `backfill.borrowerHoldAfterSecs` (a borrower starts starving). Jobs of one
/// shape fail alike only if these agree too.
#[derive(Clone, Copy)]
pub(crate) struct HoldAges {
    pub(crate) queue_hold: bool,
    pub(crate) starving: bool,
}

impl HoldAges {
    /// The ages a quota failure of `units` depends on: only a job larger
    /// than one of its queue's nominal quotas above zero (`smallest_nominal`
    /// the smallest) can be a starving borrower.
    pub(crate) fn for_units(self, units: u64, smallest_nominal: u64) -> Self {
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
    pub(crate) fn shape_key(self, queue: QueueIdx, sharing: bool, units: u64) -> Option<u64> {
        let units = u32::try_from(units).ok()?;
        (queue.number() < 1 << 29).then(|| {
            u64::from(units)
                | u64::from(queue.number()) << 32
                | u64::from(sharing) << 61
                | u64::from(self.queue_hold) << 62
                | u64::from(self.starving) << 63
        })
    }
}

impl Policy<'_> {
    /// When enough units of `res` are expected back for a job short of
    /// `short` units, counting the releases `of` keeps: the running jobs of a
    /// cohort (its pool) or of a queue, ending at their estimates. `None` when
    /// they never free that much.
    pub(crate) fn quota_release_time(
        &self,
        memo: &mut CycleMemo,
        of: impl Fn(&CohortRelease) -> bool,
        res: ResourceIdx,
        short: u64,
        now: Timestamp,
    ) -> Option<Timestamp> {
        // One scan of the running jobs serves every cohort and queue: their
        // releases are sorted subsequences of all of them.
        let releases = memo.cohort_releases(res, || self.cohort_releases(res, now));
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
    pub(crate) fn hold_queue_quota(
        &self,
        idx: JobIdx,
        reserved: Option<(ResourceIdx, Timestamp)>,
        quota_short: Option<(ResourceIdx, u64, Option<Timestamp>)>,
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
        let can_hold = |res: ResourceIdx| {
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
                    self.quota_release_time(&mut ctx.memo, |r| r.3 == queue, res, need, now)
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
    pub(crate) fn hold_ages(&self, submitted_at: Timestamp, at: Timestamp) -> HoldAges {
        let waited = at.secs_since(submitted_at);
        HoldAges {
            queue_hold: waited >= self.state.config.backfill.queue_hold_after_secs,
            starving: waited >= self.state.config.backfill.borrower_hold_after_secs,
        }
    }

    /// The smallest nominal quota above zero among `queue`'s resources
    /// (`u64::MAX` without one): no job of at most that many units can be a
    /// starving borrower (see `starving_borrower`).
    pub(crate) fn smallest_nominal(&self, queue: QueueIdx) -> u64 {
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
    pub(crate) fn quota_changed(&self, queue: QueueIdx, ctx: &mut CycleCtx) {
        let cohort = self.state.queues.get(queue).and_then(|q| q.cohort);
        let queues = &self.state.queues.queues;
        if ctx.quota_epochs.len() < queues.len() {
            ctx.quota_epochs.resize(queues.len(), 0);
        }
        for ((other, q), epoch) in QueueIdx::enumerate(queues).zip(&mut ctx.quota_epochs) {
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
    pub(crate) fn starving_borrower(&self, job: &Job, res: ResourceIdx, at: Timestamp) -> bool {
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
    pub(crate) fn kept_by_queue_holds(
        &self,
        ctx: &CycleCtx,
        cohort: CohortIdx,
        borrower: QueueIdx,
        res: ResourceIdx,
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
    pub(crate) fn would_borrow(&self, job: &Job, res: ResourceIdx) -> bool {
        self.state.queues.get(job.queue).is_some_and(|q| {
            q.usage(res).saturating_add(job.spec.total_units())
                > q.quota(res).map_or(0, |s| s.nominal)
        })
    }

    /// How this cycle's holds bear on `job` (slot `idx`) in `res`, if it
    /// `borrows` or not.
    pub(crate) fn hold_terms(
        &self,
        job: &Job,
        idx: JobIdx,
        res: ResourceIdx,
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
    pub(crate) fn held(
        &self,
        ctx: &CycleCtx,
        terms: HoldTerms,
        queue: QueueIdx,
        cohort: Option<CohortIdx>,
        res: ResourceIdx,
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
    pub(crate) fn own_queue_hold<'c>(
        &self,
        ctx: &'c CycleCtx,
        terms: &HoldTerms,
        queue: QueueIdx,
        res: ResourceIdx,
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
        res: ResourceIdx,
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
    pub(crate) fn unused_nominal(&self, queue: QueueIdx, res: ResourceIdx) -> u64 {
        self.state.queues.get(queue).map_or(0, |q| {
            q.quota(res)
                .map_or(0, |s| s.nominal)
                .saturating_sub(q.usage(res))
        })
    }

    /// Brings up to date what the queue hold of `queue` in `res`, if any,
    /// keeps from the other queues of its cohort, after its usage changed.
    pub(crate) fn refresh_queue_hold(&self, queue: QueueIdx, res: ResourceIdx, ctx: &mut CycleCtx) {
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
    pub(crate) fn cohort_releases(&self, res: ResourceIdx, now: Timestamp) -> Vec<CohortRelease> {
        self.state.job_releases_in(res, now, |(end, units, queue)| {
            let cohort = self.state.queues.get(queue).and_then(|q| q.cohort);
            (end, units, cohort, queue)
        })
    }

    pub(crate) fn cohort_release(
        &self,
        idx: JobIdx,
        job: &Job,
        run: &Running,
        res: ResourceIdx,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::CycleCtx;
    use crate::testing::contested_cluster;
    use crate::types::Timestamp;
    use crate::{Allocator, CycleOutcome, Event, JobSpec, JobUid};

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
        let idx =
            |alloc: &Allocator, uid: &str| alloc.policy().job_idx(&JobUid::new(uid)).expect("job");
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
        let res = *alloc
            .policy()
            .options_of(holder)
            .first()
            .expect("an option");
        let now = Timestamp(3_600);
        let mut ctx = CycleCtx::default();
        // q0's nominal quota (16) kept whole for the holder.
        alloc.policy().hold_queue_quota(
            holder,
            Some((res, now.plus_secs(600))),
            None,
            now,
            &mut ctx,
        );
        let kept = |alloc: &Allocator, ctx: &CycleCtx| {
            alloc
                .policy()
                .kept_by_queue_holds(ctx, cohort, borrower, res, &|_| false)
                .units
        };
        assert_eq!(kept(&alloc, &ctx), 16);
        let plan = alloc
            .policy()
            .try_place(small, res, now, &mut ctx)
            .expect("room");
        alloc.admit_in_cycle(small, plan, now, &mut ctx, &mut CycleOutcome::default());
        assert_eq!(kept(&alloc, &ctx), 8);
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
                        keys.push(ages(hold, starving).shape_key(
                            QueueIdx::from(queue),
                            sharing,
                            units,
                        ));
                    }
                }
            }
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        assert!(keys.iter().all(Option::is_some));
        // Beyond the key's room: no key, so the job is evaluated in full.
        assert_eq!(
            ages(true, true).shape_key(QueueIdx::from(1 << 29), false, 8),
            None
        );
        assert_eq!(
            ages(false, false).shape_key(QueueIdx::from(0), false, u64::from(u32::MAX) + 1),
            None
        );
    }
}
