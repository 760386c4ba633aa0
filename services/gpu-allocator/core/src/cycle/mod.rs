//! The admission cycle: the policy passes, in order.
//! 1. evictions: victims whose grace period ended (or who reported their
//!    checkpoint) release their GPUs and go back to pending; queue drains
//!    start (`preempt`);
//! 2. preemptors whose victims are all gone are admitted first, so the
//!    capacity they paid for is not taken by someone else (`admit`, their
//!    nodes held meanwhile by `reservation`);
//! 3. jobs that held a reservation, a cohort quota hold or a queue hold last
//!    cycle are evaluated next, so they keep it until they start (`admit`);
//! 4. the main pass walks every pending job in queue order (`queue_order`),
//!    evaluates it (`evaluate`: its queue, quota beside this cycle's
//!    `quota_holds`, concrete nodes by `placement`) and admits each one that
//!    fits now; blocked jobs at the front get backfill reservations
//!    (`reservation`);
//! 5. CPU-only jobs whose queue admits them are admitted (`cpu_only`);
//!    every pending job gets its queue position (`queue_position`);
//! 6. a bounded number of still-blocked jobs look for preemption victims
//!    (`preempt`, `victim_search`).
//!
//! Each pass reads the state and this cycle's context (`CycleCtx`). The
//! plans they make (an admission's placement, a preemption's victims) are
//! applied here, at the end of this file, through the state's primitives
//! (`State::commit`, `release`, `requeue`, `start_preempting`). Answers kept
//! for reuse are behind `CycleMemo`'s lookups and records.

pub(crate) mod admit;
pub(crate) mod cpu_only;
pub(crate) mod evaluate;
pub(crate) mod placement;
pub(crate) mod preempt;
pub(crate) mod queue_order;
pub(crate) mod queue_position;
pub(crate) mod quota_holds;
pub(crate) mod reservation;
pub(crate) mod unschedulable;
pub(crate) mod victim_search;

use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

use crate::cycle::evaluate::Plan;
use crate::cycle::quota_holds::{CohortQueueHold, QuotaHold};
use crate::cycle::reservation::Reservations;
use crate::decision::{
    Admission, CycleOutcome, CycleStats, Eviction, EvictionReason, PlannedNode, Preemption,
    TopologyAssignment, WorkerPlacement,
};
use crate::ids::{CohortIdx, FastMap, JobIdx, QueueIdx, ReasonIdx, ResourceIdx};
use crate::memo::{CycleMemo, EarlyFailures};
use crate::pending::PendingReason;
use crate::state::State;
use crate::state::jobs::{Job, JobState, Nomination};
use crate::state::releases::Timeline;
use crate::types::{JobUid, Timestamp, names};

use crate::allocator::Allocator;
use crate::cycle::queue_position::QueuePositions;

/// What every policy pass reads: the state, and nothing it can change.
/// Passes are methods of `Policy` and return a plan or a reason; the
/// driver below (`impl Allocator`) applies the plans to the state.
#[derive(Clone, Copy)]
pub(crate) struct Policy<'s> {
    pub(crate) state: &'s State,
}

/// Scratch state of one cycle.
#[derive(Default)]
pub(crate) struct CycleCtx {
    /// The speed layer: answers kept for jobs that would be answered alike.
    pub(crate) memo: CycleMemo,
    /// Jobs found waiting so far, per queue: their queue positions.
    pub(crate) positions: QueuePositions,
    /// Failures of jobs evaluated before the main pass.
    pub(crate) early: EarlyFailures,
    /// Jobs given a reservation this cycle, in order.
    pub(crate) reserved_order: Vec<JobUid>,
    /// Reasons of jobs blocked by their queue's hold, by (queue, resource,
    /// units, queue usage).
    pub(crate) queue_hold_reasons: FastMap<(QueueIdx, ResourceIdx, u64, u64), ReasonIdx>,
    /// Reasons of jobs their queue refuses, by queue and namespace (none
    /// for a queue on hold): one per cause, however many jobs wait for it.
    pub(crate) refusals: FastMap<QueueIdx, FastMap<String, ReasonIdx>>,
    /// Cohort pool headroom held for the first job that only the pool
    /// blocks, per (cohort, resource).
    pub(crate) quota_holds: FastMap<(CohortIdx, ResourceIdx), QuotaHold>,
    /// A queue's nominal quota kept for one of its blocked jobs, per (queue,
    /// resource): the units that job needs (see `hold_queue_quota`).
    pub(crate) queue_holds: FastMap<(QueueIdx, ResourceIdx), QuotaHold>,
    /// `queue_holds` by (the holding queue's cohort, resource), each group
    /// in the order the holds were made: what `kept_by_queue_holds` needs
    /// of the map, for each borrower checked, without walking all of it.
    pub(crate) queue_holds_by_cohort: FastMap<(CohortIdx, ResourceIdx), Vec<CohortQueueHold>>,
    pub(crate) reservations: Reservations,
    /// Failures that may try preemption (blocked by quota or capacity), in
    /// line order: (slot in the pending explanations, job).
    pub(crate) may_preempt: Vec<(usize, JobIdx)>,
    pub(crate) stats: CycleStats,
    /// By queue: bumped by every admission and every new quota or queue
    /// hold in the queue's cohort (see `quota_changed`): what a quota check
    /// of the queue saw is valid while its epoch stays.
    pub(crate) quota_epochs: Vec<u64>,
    /// Every reason made this cycle, each once: failures name them by index
    /// (see `Pending::reason`). Handed to the outcome.
    pub(crate) reasons: Vec<Arc<PendingReason>>,
    /// Every job evaluated in full: what the quota shortcut is checked against.
    #[cfg(test)]
    pub(crate) no_quota_shortcut: bool,
}

impl CycleCtx {
    #[cfg(not(test))]
    pub(crate) fn quota_shortcut(&self) -> bool {
        true
    }

    #[cfg(test)]
    pub(crate) fn quota_shortcut(&self) -> bool {
        !self.no_quota_shortcut
    }

    /// Lists a job that holds a reservation or quota among those evaluated
    /// first next cycle (see `evaluate_reserved_first`), once: a job that
    /// holds both was evaluated twice, and a second evaluation could admit
    /// it past the reservation the first had just made for it, which then
    /// held other jobs back for a job already running.
    pub(crate) fn evaluate_first_next_cycle(&mut self, uid: &JobUid) {
        if !self.reserved_order.contains(uid) {
            self.reserved_order.push(uid.clone());
        }
    }

    pub(crate) fn quota_epoch(&self, queue: QueueIdx) -> u64 {
        self.quota_epochs.get(queue.slot()).copied().unwrap_or(0)
    }

    /// Adds a reason to the cycle's table.
    pub(crate) fn add_reason(&mut self, reason: PendingReason) -> ReasonIdx {
        self.add_shared_reason(Arc::new(reason))
    }

    /// Adds a reason kept beyond the cycle to the cycle's table.
    pub(crate) fn add_shared_reason(&mut self, reason: Arc<PendingReason>) -> ReasonIdx {
        let idx = ReasonIdx::from_slot(self.reasons.len());
        self.reasons.push(reason);
        idx
    }

    pub(crate) fn reason(&self, idx: ReasonIdx) -> Option<&PendingReason> {
        self.reasons.get(idx.slot()).map(|r| &**r)
    }

    /// Units missing by reason `idx` (see `PendingReason::shortfall`).
    pub(crate) fn shortfall(&self, idx: ReasonIdx) -> u64 {
        self.reason(idx).map_or(u64::MAX, PendingReason::shortfall)
    }
}

impl Allocator {
    /// The passes, reading the current state.
    pub(crate) fn policy(&self) -> Policy<'_> {
        Policy { state: &self.state }
    }

    // ------------------------------------------------------------------ cycle

    /// Runs one admission cycle at `now`.
    pub fn cycle(&mut self, now: Timestamp) -> CycleOutcome {
        let ctx = CycleCtx {
            memo: self
                .memo
                .start_cycle(self.state.inv.node_changes, self.state.queues.changes),
            ..CycleCtx::default()
        };
        self.cycle_with(now, ctx)
    }

    pub(crate) fn cycle_with(&mut self, now: Timestamp, mut ctx: CycleCtx) -> CycleOutcome {
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

        ctx.positions = QueuePositions::new(self.state.queues.queues.len());
        self.policy().hold_for_waiting_preemptors(now, &mut ctx);
        self.admit_ready_preemptors(now, &mut ctx, &mut out);
        self.evaluate_reserved_first(now, &mut ctx, &mut out);
        let lanes = self.policy().build_lanes(now);
        self.main_pass(now, lanes, &mut ctx, &mut out);
        self.admit_cpu_only(now, &mut ctx, &mut out);
        ctx.positions.set_lengths(&mut out.pending);
        self.state.reserved_jobs = std::mem::take(&mut ctx.reserved_order);
        if self.state.config.preemption.enabled {
            self.preemption_pass(now, &mut ctx, &mut out);
        }
        out.reasons = std::mem::take(&mut ctx.reasons);
        out.stats = ctx.stats;
        out.stats.admitted = u32::try_from(out.admissions.len()).unwrap_or(u32::MAX);
        self.memo.end_cycle(ctx.memo, self.state.inv.node_changes);
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

    // ------------------------------------------------------------- preemption

    // ------------------------------------------- plans applied to the state

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
        let cached = ctx.memo.take_timeline(res);
        let queue = self.state.job(idx).map(|job| job.queue);
        if let Some(queue) = queue {
            self.policy().quota_changed(queue, ctx);
        }
        self.admit(idx, plan, now, out);
        if let Some(queue) = queue {
            self.policy().refresh_queue_hold(queue, res, ctx);
        }
        // Updating a cached timeline in place gives the same sorted events
        // as rebuilding it from every running job, for a fraction of the cost.
        if let Some(mut timeline) = cached {
            self.add_releases(Rc::make_mut(&mut timeline), idx, res, now);
            ctx.memo.record_timeline(res, timeline);
        }
        // Likewise for the cohort releases.
        if let Some(releases) = ctx.memo.cohort_releases_to_update(res)
            && let Some(job) = self.state.job(idx)
            && let Some(run) = job.running()
            && let Some(release) = self.policy().cohort_release(idx, job, run, res, now)
        {
            crate::state::releases::insert_one(releases, release);
        }
    }

    /// Inserts the release events of running job `idx` into `timeline` (see
    /// `release_timeline`), keeping it sorted.
    pub(crate) fn add_releases(
        &self,
        timeline: &mut Timeline,
        idx: JobIdx,
        res: ResourceIdx,
        now: Timestamp,
    ) {
        let mut events = Vec::new();
        self.state
            .job_releases(idx, res, now, |event| events.push(event));
        crate::state::releases::insert_sorted(timeline, &mut events);
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
        let flavor = self.state.inv.flavors.get(r.flavor.slot());
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

    /// Records victims and the preemptor's nomination.
    pub(crate) fn start_preemption(
        &mut self,
        idx: JobIdx,
        plan: &crate::cycle::victim_search::VictimPlan,
        now: Timestamp,
    ) -> Option<Preemption> {
        let evict_at = now.plus_secs(self.state.config.preemption.grace_period_secs);
        let preemptor = self.state.job(idx)?.spec.uid.clone();
        let mut victims = Vec::new();
        for (victim, rule) in &plan.victims {
            victims.push(self.policy().victim(*victim, *rule)?);
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
}
