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
//! Each pass reads the state and this cycle's context (`CycleCtx`, where it
//! also lists the jobs it finds waiting, and why) and decides one thing at
//! a time (`Pass::next`: an admission and its placement, a nomination and
//! its victims, an eviction). The
//! decisions are applied here, in `apply_decision`, through the state's
//! primitives (`State::commit`, `release`, `requeue`, `start_preempting`,
//! `end_nomination`), each before the pass is asked for the next, so a
//! pass sees the capacity its earlier decisions took. Answers kept for
//! reuse are behind `CycleMemo`'s lookups and records.

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

use crate::allocator::Allocator;
use crate::cycle::admit::{MainPass, ReadyPreemptors, ReservedFirst};
use crate::cycle::cpu_only::CpuOnly;
use crate::cycle::evaluate::Plan;
use crate::cycle::preempt::{Drains, Evictions, PreemptionPass};
use crate::cycle::queue_position::QueuePositions;
use crate::cycle::quota_holds::{CohortQueueHold, QuotaHold};
use crate::cycle::reservation::Reservations;
use crate::cycle::victim_search::VictimPlan;
use crate::decision::{
    Admission, CycleOutcome, CycleStats, Drain, Eviction, PlannedNode, Preemption,
    TopologyAssignment, WorkerPlacement,
};
use crate::ids::{CohortIdx, FastMap, JobIdx, QueueIdx, ReasonIdx, ResourceIdx};
use crate::memo::{CycleMemo, EarlyFailures};
use crate::pending::{Pending, PendingReason};
use crate::state::State;
use crate::state::jobs::{JobState, Nomination};
use crate::state::releases::Timeline;
use crate::types::{JobUid, Timestamp, names};

/// What every policy pass reads: the state, and nothing it can change.
/// Passes are methods of `Policy` and return a plan or a reason, or
/// `Pass`es that return one `Decision` at a time; the driver below
/// (`impl Allocator`) applies them to the state.
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
    /// line order: (slot in `pending`, job).
    pub(crate) may_preempt: Vec<(usize, JobIdx)>,
    /// Why each job seen waiting so far waits, in the order the passes met
    /// them: an explanation, not a change of the state. Handed to the
    /// outcome.
    pub(crate) pending: Vec<Pending>,
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

    /// Lists a job as waiting, `may_preempt`: among those the preemption
    /// pass may find victims for.
    pub(crate) fn wait(&mut self, entry: Pending, may_preempt: bool) {
        if may_preempt {
            self.may_preempt.push((self.pending.len(), entry.job));
        }
        self.pending.push(entry);
    }

    /// Units missing by reason `idx` (see `PendingReason::shortfall`).
    pub(crate) fn shortfall(&self, idx: ReasonIdx) -> u64 {
        self.reason(idx).map_or(u64::MAX, PendingReason::shortfall)
    }
}

/// One decision of a pass, made on the state as the decisions before it
/// left it; `Allocator::apply_decision` applies it.
pub(crate) enum Decision {
    /// Admit pending job `job` on `plan`'s nodes.
    Admit { job: JobIdx, plan: Plan },
    /// A ready preemptor's nomination is used up, whatever comes of it.
    EndNomination(JobIdx),
    /// Admit a CPU-only job: it leaves the allocator.
    AdmitCpuOnly(Box<Admission>),
    /// A victim search for `job` failed: it tries again after `retry_after`.
    BackOff {
        job: JobIdx,
        failures: u32,
        retry_after: Timestamp,
    },
    /// Start preempting `plan`'s victims for `job`, whose pending entry is
    /// `slot` of `CycleCtx::pending`.
    Nominate {
        job: JobIdx,
        plan: VictimPlan,
        slot: usize,
    },
    /// Tell a draining queue's running jobs to checkpoint.
    Drain(Drain),
    /// Victim `job` goes back to pending (preempted by `by`, or drained).
    Evict {
        job: JobIdx,
        by: Option<JobUid>,
        eviction: Eviction,
    },
}

/// A pass that decides one thing at a time: the cycle applies each
/// decision before it asks for the next, so a pass sees what its earlier
/// decisions took (an admission's units, a nomination's victims).
pub(crate) trait Pass {
    /// The next decision, or `None` when the pass is done.
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision>;

    /// Called once the decision `next` returned was applied, with whether
    /// it took effect.
    fn applied(&mut self, _policy: Policy<'_>, _took_effect: bool) {}
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
        self.state.prune_tombstones(now);
        let mut out = CycleOutcome {
            now,
            ..CycleOutcome::default()
        };
        out.evictions.append(&mut self.state.undelivered_evictions);
        let evictions = Evictions::new(self.policy(), now);
        self.run(evictions, now, &mut ctx, &mut out);
        let drains = Drains::new(self.policy(), now);
        self.run(drains, now, &mut ctx, &mut out);

        ctx.positions = QueuePositions::new(self.state.queues.queues.len());
        self.policy().hold_for_waiting_preemptors(now, &mut ctx);
        let ready = ReadyPreemptors::new(self.policy(), now);
        self.run(ready, now, &mut ctx, &mut out);
        let reserved = ReservedFirst::new(std::mem::take(&mut self.state.reserved_jobs));
        self.run(reserved, now, &mut ctx, &mut out);
        let main = MainPass::new(self.policy(), now);
        ctx.pending.reserve(main.jobs_in_line());
        ctx.may_preempt.reserve(main.jobs_in_line());
        self.run(main, now, &mut ctx, &mut out);
        let cpu_only = CpuOnly::new(self.policy());
        self.run(cpu_only, now, &mut ctx, &mut out);
        ctx.positions.set_lengths(&mut ctx.pending);
        self.state.reserved_jobs = std::mem::take(&mut ctx.reserved_order);
        if self.state.config.preemption.enabled {
            let preemption = PreemptionPass::new(self.policy(), &mut ctx);
            self.run(preemption, now, &mut ctx, &mut out);
        }
        out.pending = std::mem::take(&mut ctx.pending);
        out.reasons = std::mem::take(&mut ctx.reasons);
        out.stats = ctx.stats;
        out.stats.admitted = u32::try_from(out.admissions.len()).unwrap_or(u32::MAX);
        self.memo.end_cycle(ctx.memo, self.state.inv.node_changes);
        out
    }

    /// Runs `pass` to its end, applying each of its decisions before asking
    /// for the next.
    fn run(
        &mut self,
        mut pass: impl Pass,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        while let Some(decision) = pass.next(self.policy(), now, ctx) {
            let took_effect = self.apply_decision(decision, now, ctx, out);
            pass.applied(self.policy(), took_effect);
        }
    }

    // ------------------------------------------- plans applied to the state

    /// Applies one decision of a pass: the one place a cycle changes the
    /// state. Returns whether it took effect (a nomination whose victim
    /// stopped meanwhile does not).
    fn apply_decision(
        &mut self,
        decision: Decision,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) -> bool {
        match decision {
            Decision::Admit { job, plan } => self.admit_in_cycle(job, plan, now, ctx, out),
            Decision::EndNomination(job) => self.state.end_nomination(job),
            Decision::AdmitCpuOnly(admission) => {
                self.state.finish(&admission.uid);
                out.admissions.push(*admission);
            }
            Decision::BackOff {
                job,
                failures,
                retry_after,
            } => {
                if let Some(j) = self.state.job_mut(job) {
                    j.preemption_failures = failures;
                    j.preemption_retry_after = retry_after;
                }
            }
            Decision::Nominate { job, plan, slot } => {
                if let Some(j) = self.state.job_mut(job) {
                    j.preemption_failures = 0;
                    j.preemption_retry_after = Timestamp(0);
                }
                let Some(preemption) = self.start_preemption(job, &plan, now) else {
                    return false;
                };
                if slot < ctx.pending.len() {
                    let reason = ctx.add_reason(PendingReason::AwaitingPreemption {
                        victims: u32::try_from(preemption.victims.len()).unwrap_or(u32::MAX),
                        evict_at: preemption.evict_at,
                    });
                    if let Some(entry) = ctx.pending.get_mut(slot) {
                        entry.reason = reason;
                    }
                }
                out.preemptions.push(preemption);
            }
            Decision::Drain(drain) => {
                self.state
                    .start_preempting(&drain.victims, None, drain.evict_at);
                out.drains.push(drain);
            }
            Decision::Evict { job, by, eviction } => {
                self.state.requeue(job, by);
                out.evictions.push(eviction);
            }
        }
        true
    }

    /// Takes a job's GPUs for this cycle: every quota check seen so far is
    /// out of date, and the job's releases join its resource's timeline.
    fn admit_in_cycle(
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
    fn add_releases(&self, timeline: &mut Timeline, idx: JobIdx, res: ResourceIdx, now: Timestamp) {
        let mut events = Vec::new();
        self.state
            .job_releases(idx, res, now, |event| events.push(event));
        crate::state::releases::insert_sorted(timeline, &mut events);
    }

    /// Turns a plan into an admission decision and commits it.
    fn admit(&mut self, idx: JobIdx, plan: Plan, now: Timestamp, out: &mut CycleOutcome) {
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
        fn single<T: Copy>(set: &BTreeSet<T>) -> Option<T> {
            (set.len() == 1)
                .then(|| set.iter().next().copied())
                .flatten()
        }
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
    fn start_preemption(
        &mut self,
        idx: JobIdx,
        plan: &VictimPlan,
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
