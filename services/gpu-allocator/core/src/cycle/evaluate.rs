//! Evaluation of one pending job: its queue admits it, then quota and
//! concrete nodes for the whole gang on each (flavor, resource) it may use,
//! in preference order; a plan when one fits, else the most useful reason.

use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::cycle::placement::{self, Candidate};
use crate::cycle::quota_holds::{QuotaHold, fits_beside};
use crate::event::JobSpec;
use crate::ids::{FilterIdx, JobIdx, NodeIdx, ReasonIdx, ResourceIdx};
use crate::memo::{CycleMemo, MemoKey, QuotaBlocked};
use crate::pending::PendingReason;
use crate::state::jobs::{Gang, Job, JobState};
use crate::types::{GpuSliceRequest, JobUid, ResourceKind, Timestamp, TopologyRequirement, names};

/// What a successful placement attempt produced.
pub(crate) struct Plan {
    pub(crate) res: ResourceIdx,
    pub(crate) per_worker: u32,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
    pub(crate) ahead_of: Option<JobUid>,
}

/// Keeps the later of `at` and the time `latest` holds.
pub(crate) fn keep_latest(latest: &mut Option<u64>, at: u64) {
    *latest = Some(latest.map_or(at, |t| t.max(at)));
}

/// Keeps the earlier of `at` and the time `earliest` holds.
pub(crate) fn keep_earliest(earliest: &mut Option<u64>, at: u64) {
    *earliest = Some(earliest.map_or(at, |t| t.min(at)));
}

/// A job's expected end for a runtime estimate, as a sort key (`u64::MAX`
/// without an estimate) and as a time.
pub(crate) fn estimated_end(
    estimate_secs: Option<u64>,
    now: Timestamp,
) -> (u64, Option<Timestamp>) {
    match estimate_secs {
        Some(est) => {
            let end = now.plus_secs(est);
            (end.0, Some(end))
        }
        None => (u64::MAX, None),
    }
}

impl Policy<'_> {
    /// Resources a job may use, in the queue's flavor preference order.
    pub(crate) fn options_for(&self, job: &Job, out: &mut Vec<ResourceIdx>) {
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
            let mut matching: Vec<(u32, u32, &str, ResourceIdx)> = queue
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

    pub(crate) fn options_of(&self, idx: JobIdx) -> Vec<ResourceIdx> {
        let mut out = Vec::new();
        if let Some(job) = self.state.job(idx) {
            self.options_for(job, &mut out);
        }
        out
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

    /// Whether the job's queue admits it now: not on hold, open to its
    /// namespace.
    pub(crate) fn queue_admits(&self, job: &Job) -> bool {
        self.state
            .queues
            .get(job.queue)
            .and_then(|q| q.spec.as_ref())
            .is_none_or(|spec| spec.admits(&job.spec))
    }

    /// Why the job's queue does not admit it now (unknown, on hold, or
    /// closed to its namespace), one reason per cause however many jobs
    /// wait for it; `None` when it does.
    pub(crate) fn queue_refusal(&self, job: &Job, ctx: &mut CycleCtx) -> Option<ReasonIdx> {
        let queue = job.queue;
        let Some((q, spec)) = self
            .state
            .queues
            .get(queue)
            .and_then(|q| Some((q, q.spec.as_ref()?)))
        else {
            return Some(ctx.add_reason(PendingReason::QueueNotFound {
                queue: self.state.queues.name_of(queue),
            }));
        };
        if !spec.refuses(&job.spec.namespace) {
            // Never cached: what a job asks for is its own.
            let request = spec.pod_policy.refusal(&job.spec.pod_requests)?;
            return Some(ctx.add_reason(PendingReason::pod_policy_refused(
                &spec.pod_policy,
                &q.name,
                request,
            )));
        }
        let namespace = if spec.held() {
            ""
        } else {
            job.spec.namespace.as_str()
        };
        if let Some(reason) = ctx.refusals.get(&queue).and_then(|r| r.get(namespace)) {
            return Some(*reason);
        }
        let name = q.name.to_string();
        let reason = ctx.add_reason(if spec.on_hold {
            PendingReason::QueueOnHold {
                queue: name,
                drains: spec.drain,
            }
        } else if let Some(budget) = &spec.budget_hold {
            PendingReason::BudgetSpent {
                queue: name,
                spend: budget.spend.clone(),
                drains: budget.drains,
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
        Some(reason)
    }

    /// Tries every allowed (flavor, resource) of a pending job. On failure
    /// returns the most useful reason and whether preemption may help.
    pub(crate) fn evaluate(
        &self,
        idx: JobIdx,
        now: Timestamp,
        ctx: &mut CycleCtx,
        options: &mut Vec<ResourceIdx>,
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
        // No node could ever hold it: no quota, hold or preemption helps.
        if let Some(reason) = self.unschedulable(idx, ctx) {
            return Err((reason, false));
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
        if let Some(reason) = self.queue_refusal(job, ctx) {
            return Err((reason, false));
        }
        let queue = job.queue;
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
        let mut first_capacity_failure: Option<(ResourceIdx, ReasonIdx)> = None;
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
        let mut quota_short: Option<(ResourceIdx, u64, Option<Timestamp>)> = None;
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
                    && self.slots_when_empty(res, &job.spec, job.filter, &mut ctx.memo)
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
                        &mut ctx.memo,
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
                let reason = match ctx.memo.lookup_quota_reason(&key) {
                    Some(r) if !holding => r,
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
                            ctx.memo.record_quota_reason(key, r);
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
        let mut reserved: Option<(ResourceIdx, Timestamp)> = None;
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
        if alike && let Some(key) = ages.shape_key(queue, sharing, units) {
            ctx.memo.record_quota_blocked(
                key,
                QuotaBlocked {
                    epoch,
                    reason,
                    can_preempt,
                    exempt_until,
                    passes_until,
                },
            );
        }
        Err((reason, can_preempt))
    }

    /// Finds concrete nodes for every worker of a job in `res`, honouring
    /// node filters and this cycle's reservations.
    pub(crate) fn try_place(
        &self,
        idx: JobIdx,
        res: ResourceIdx,
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
        if let Some(reason) = ctx.memo.lookup_placement_failure(&key, end_key) {
            ctx.stats.memo_hits += 1;
            return Err(reason);
        }
        let Some(r) = self.state.inv.res(res) else {
            let reason = self.capacity_reason(res, spec, (0, 0), job.filter, &mut ctx.memo);
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
                self.capacity_reason(res, spec, (placeable, lacking), job.filter, &mut ctx.memo)
            }
        };
        let reason = ctx.add_reason(reason);
        ctx.memo.record_placement_failure(key, end_key, reason);
        Err(reason)
    }

    /// Workers of the job `spec` describes that the nodes of `res` `filter`
    /// admits could host, in one zone or rack if it must stay in one, if
    /// every running job ended. (Not a promise: nodes come and go; it tells
    /// "wait" apart from "never, as is".)
    pub(crate) fn slots_when_empty(
        &self,
        res: ResourceIdx,
        spec: &JobSpec,
        filter: FilterIdx,
        memo: &mut CycleMemo,
    ) -> u64 {
        let gang = Gang::of(spec);
        // The count of workers does not change what each node hosts.
        let key = (res, filter, Gang { workers: 0, ..gang });
        if let Some(slots) = memo.lookup_empty_slots(&key) {
            return slots;
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
        memo.record_empty_slots(key, slots);
        slots
    }

    /// Why the job `spec` describes does not fit the nodes of `res` now:
    /// `placeable` of its workers are all that do (in one zone or rack if
    /// it must stay in one), and `lacking_cpu_memory` more are what the free
    /// units could host but not the CPU or memory beside them.
    pub(crate) fn capacity_reason(
        &self,
        res: ResourceIdx,
        spec: &JobSpec,
        (placeable, lacking_cpu_memory): (u64, u64),
        filter: FilterIdx,
        memo: &mut CycleMemo,
    ) -> PendingReason {
        let (per_worker, workers) = (spec.gpus_per_worker, spec.num_workers);
        let placeable = placeable.min(u64::from(workers));
        // Workers that lack only CPU or memory are not short of units.
        let short_workers = u64::from(workers).saturating_sub(placeable + lacking_cpu_memory);
        let empty_slots = self.slots_when_empty(res, spec, filter, memo);
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
            node_constrained: filter != FilterIdx::ANY_NODE,
        }
    }
}
