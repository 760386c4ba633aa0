//! The preemption pass: a bounded number of still-blocked jobs look for
//! victims (`victim_search`); a plan found starts the victims' grace period
//! and nominates the preemptor. Queue drains start here too.

use crate::allocator::Allocator;
use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::cycle::evaluate::estimated_end;
use crate::decision::{CycleOutcome, Drain, PreemptionRule, Victim};
use crate::ids::{FastMap, JobIdx, QueueIdx, ResourceIdx};
use crate::memo::PreemptionKey;
use crate::pending::PendingReason;
use crate::state::jobs::{Gang, Job, Nomination};
use crate::types::{JobUid, ResourceKind, Timestamp};

impl Allocator {
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
        let mut inflight = self.policy().inflight();
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
            if !self.policy().may_try_preemption(idx) {
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
            let Some(plan) = self
                .policy()
                .find_victims(idx, now, &inflight, &draining, ctx)
            else {
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
            inflight = self.policy().inflight();
            if let Some(f) = out.pending.get_mut(slot) {
                f.reason = ctx.add_reason(PendingReason::AwaitingPreemption {
                    victims: u32::try_from(preemption.victims.len()).unwrap_or(u32::MAX),
                    evict_at: preemption.evict_at,
                });
            }
            out.preemptions.push(preemption);
        }
    }

    /// Tells the admitted jobs of every draining queue to checkpoint: each
    /// is evicted when the grace period ends (or once it checkpointed), then
    /// waits in the queue's line while the queue is held. A job already
    /// being preempted goes as that preemption planned.
    pub(crate) fn start_drains(&mut self, now: Timestamp, out: &mut CycleOutcome) {
        let draining: Vec<QueueIdx> = QueueIdx::enumerate(&self.state.queues.queues)
            .map(|(q, _)| q)
            .filter(|q| {
                self.state
                    .queues
                    .get(*q)
                    .and_then(|q| q.spec.as_ref())
                    .is_some_and(|spec| spec.drains())
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
                .filter_map(|idx| self.policy().victim(idx, PreemptionRule::Drain))
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
}

impl Policy<'_> {
    /// Running job `idx` as a victim of `rule`.
    pub(crate) fn victim(&self, idx: JobIdx, rule: PreemptionRule) -> Option<Victim> {
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

    /// The resource a nomination planned on.
    pub(crate) fn nomination_res(&self, nomination: &Nomination) -> Option<ResourceIdx> {
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
}
