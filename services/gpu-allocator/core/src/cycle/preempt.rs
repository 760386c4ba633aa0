//! Preemption: victims due for eviction, queue drains, and the preemption
//! pass, in which a bounded number of still-blocked jobs look for victims
//! (`victim_search`); a plan found starts the victims' grace period and
//! nominates the preemptor. Each pass decides one thing at a time; the
//! cycle (`cycle/mod.rs`) applies it before the pass goes on.

use crate::config::PreemptionPolicy;
use crate::cycle::evaluate::estimated_end;
use crate::cycle::victim_search::Inflight;
use crate::cycle::{CycleCtx, Decision, Pass, Policy};
use crate::decision::{Drain, Eviction, EvictionReason, PreemptionRule, Victim};
use crate::ids::{CohortIdx, FastMap, JobIdx, QueueIdx, ResourceIdx};
use crate::memo::PreemptionKey;
use crate::state::jobs::{Gang, Job, Nomination};
use crate::types::{JobUid, ResourceKind, Timestamp};

/// Victims whose grace period ended, or who reported their checkpoint, in
/// arrival order: each goes back to pending.
pub(crate) struct Evictions {
    due: std::vec::IntoIter<JobIdx>,
    now: Timestamp,
}

impl Evictions {
    pub(crate) fn new(policy: Policy<'_>, now: Timestamp) -> Self {
        let due = policy
            .state
            .by_arrival(policy.state.preempting.iter().copied().filter(|idx| {
                policy
                    .state
                    .job(*idx)
                    .and_then(Job::running)
                    .and_then(|r| r.preempting.as_ref())
                    .is_some_and(|p| p.checkpointed || p.evict_at <= now)
            }));
        Evictions {
            due: due.into_iter(),
            now,
        }
    }
}

impl Pass for Evictions {
    fn next(&mut self, policy: Policy<'_>, _: Timestamp, _: &mut CycleCtx) -> Option<Decision> {
        for idx in self.due.by_ref() {
            let Some(job) = policy.state.job(idx) else {
                continue;
            };
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
                    queue: policy.state.queues.name_of(job.queue),
                },
            };
            return Some(Decision::Evict {
                job: idx,
                by,
                eviction: Eviction {
                    uid: job.spec.uid.clone(),
                    reason,
                    at: self.now,
                },
            });
        }
        None
    }
}

/// Queues that drain: each one's admitted jobs not yet told are told to
/// checkpoint, and are evicted when the grace period ends (or once they
/// checkpointed), then wait in the queue's line while the queue is held. A
/// job already being preempted goes as that preemption planned.
pub(crate) struct Drains {
    queues: std::vec::IntoIter<QueueIdx>,
    now: Timestamp,
}

impl Drains {
    pub(crate) fn new(policy: Policy<'_>, now: Timestamp) -> Self {
        let draining: Vec<QueueIdx> = QueueIdx::enumerate(&policy.state.queues.queues)
            .filter(|(_, q)| q.spec.as_ref().is_some_and(|spec| spec.drains()))
            .map(|(q, _)| q)
            .collect();
        Drains {
            queues: draining.into_iter(),
            now,
        }
    }
}

impl Pass for Drains {
    fn next(&mut self, policy: Policy<'_>, _: Timestamp, _: &mut CycleCtx) -> Option<Decision> {
        let evict_at = self
            .now
            .plus_secs(policy.state.config.preemption.grace_period_secs);
        for queue in self.queues.by_ref() {
            let told: Vec<JobIdx> = policy
                .state
                .running_by_queue
                .iter()
                .filter(|((q, _), _)| *q == queue)
                .flat_map(|(_, jobs)| jobs.iter().copied())
                .filter(|idx| {
                    policy
                        .state
                        .job(*idx)
                        .and_then(Job::running)
                        .is_some_and(|r| r.preempting.is_none())
                })
                .collect();
            if told.is_empty() {
                continue;
            }
            let victims: Vec<Victim> = policy
                .state
                .by_arrival(told)
                .into_iter()
                .filter_map(|idx| policy.victim(idx, PreemptionRule::Drain))
                .collect();
            return Some(Decision::Drain(Drain {
                queue: policy.state.queues.name_of(queue),
                victims,
                decided_at: self.now,
                evict_at,
            }));
        }
        None
    }
}

/// The preemption pass: a bounded number of still-blocked jobs, in line
/// order, look for victims (`victim_search`). A plan found nominates the
/// job and starts its victims' grace period; a search that fails backs the
/// job off.
pub(crate) struct PreemptionPass {
    blocked: std::vec::IntoIter<(usize, JobIdx)>,
    limits: PreemptionPolicy,
    attempts: u32,
    decided: u32,
    /// Per failed key, the earliest estimated end (u64::MAX = none) of a
    /// job that failed: a job ending later is let through by no more holds
    /// (see `HoldTerms::exempt`), so fails too.
    failed_searches: FastMap<PreemptionKey, u64>,
    /// Usage projections and claims of the preemptions under way.
    inflight: Inflight,
    /// Cohort quota holds that bind lenders: (cohort, resource, holder).
    draining: Vec<(CohortIdx, ResourceIdx, JobIdx)>,
    /// Whether the last decision was a nomination.
    nominating: bool,
}

impl PreemptionPass {
    /// Takes the jobs the earlier passes found may preempt
    /// (`CycleCtx::may_preempt`).
    pub(crate) fn new(policy: Policy<'_>, ctx: &mut CycleCtx) -> Self {
        let draining = ctx
            .quota_holds
            .iter()
            .filter(|(_, h)| h.binds_lenders)
            .map(|(&(cohort, res), h)| (cohort, res, h.holder_idx))
            .collect();
        PreemptionPass {
            blocked: std::mem::take(&mut ctx.may_preempt).into_iter(),
            limits: policy.state.config.preemption,
            attempts: 0,
            decided: 0,
            failed_searches: FastMap::default(),
            inflight: policy.inflight(),
            draining,
            nominating: false,
        }
    }
}

impl Pass for PreemptionPass {
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision> {
        loop {
            if self.attempts >= self.limits.max_attempts_per_cycle
                || self.decided >= self.limits.max_preemptions_per_cycle
            {
                return None;
            }
            let (slot, idx) = self.blocked.next()?;
            if !policy.may_try_preemption(idx) {
                continue;
            }
            // Jobs alike in every respect the victim search looks at fail
            // alike; decisions within the cycle only make it harder.
            // A draining holder may take what others of its shape may not.
            let holds_drain = self.draining.iter().any(|&(.., holder)| holder == idx);
            let job = policy.state.job(idx);
            let key = job.and_then(|j| {
                (j.preempted_by.is_none() && !holds_drain).then(|| PreemptionKey {
                    queue: j.queue,
                    priority: j.spec.priority,
                    gang: Gang::of(&j.spec),
                    filter: j.filter,
                    sharing: j.spec.allow_gpu_sharing,
                    slice: j.spec.gpu_slice.clone(),
                })
            });
            let end = job.map_or(u64::MAX, |j| {
                estimated_end(j.spec.runtime_estimate_secs, now).0
            });
            if let Some(key) = &key
                && self
                    .failed_searches
                    .get(key)
                    .is_some_and(|&failing_end| end >= failing_end)
            {
                continue;
            }
            if job.is_some_and(|j| j.preemption_retry_after > now) {
                continue;
            }
            self.attempts += 1;
            ctx.stats.preemption_attempts += 1;
            if let Some(plan) = policy.find_victims(idx, now, &self.inflight, &self.draining, ctx) {
                self.nominating = true;
                return Some(Decision::Nominate {
                    job: idx,
                    plan,
                    slot,
                });
            }
            if let Some(key) = key {
                let failing_end = self.failed_searches.entry(key).or_insert(end);
                *failing_end = (*failing_end).min(end);
            }
            if let Some(j) = job {
                let (failures, retry_after) =
                    back_off(j.preemption_failures, self.limits.grace_period_secs, now);
                return Some(Decision::BackOff {
                    job: idx,
                    failures,
                    retry_after,
                });
            }
        }
    }

    fn applied(&mut self, policy: Policy<'_>, took_effect: bool) {
        if std::mem::take(&mut self.nominating) && took_effect {
            self.decided += 1;
            // The decision changes usage projections and claims.
            self.inflight = policy.inflight();
        }
    }
}

/// A job's failed victim searches and when it may search again, after one
/// more failure at `now`: back off linearly, one grace period per failure
/// up to eight. The state that made the search fail rarely changes within
/// a cycle or two, and other blocked jobs get the turn.
pub(crate) fn back_off(failures: u32, grace_period_secs: u64, now: Timestamp) -> (u32, Timestamp) {
    let failures = failures.saturating_add(1).min(8);
    let grace = grace_period_secs.max(1);
    (failures, now.plus_secs(grace * u64::from(failures)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::Allocator;
    use crate::config::AllocatorConfig;
    use crate::cycle::reservation::tests::{job, node, queue};
    use crate::event::Event;

    /// Two 2-GPU jobs admitted in queue `q`, `b` before `a`; then `q` is put
    /// on hold and drains.
    fn drained_queue() -> Allocator {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
        for event in [
            node("n1"),
            queue("q"),
            job("b", "q", 1, None),
            job("a", "q", 1, None),
        ] {
            alloc.apply(event).expect("accepted");
        }
        assert_eq!(alloc.cycle(Timestamp(0)).admissions.len(), 2);
        let Event::QueueUpserted(mut spec) = queue("q") else {
            unreachable!("a queue event")
        };
        spec.on_hold = true;
        spec.drain = true;
        alloc.apply(Event::QueueUpserted(spec)).expect("queue");
        alloc
    }

    fn uids(victims: &[Victim]) -> Vec<&str> {
        victims.iter().map(|v| v.uid.as_str()).collect()
    }

    #[test]
    fn a_draining_queue_tells_its_running_jobs_in_arrival_order_once_applied() {
        let alloc = drained_queue();
        let policy = alloc.policy();
        let mut ctx = CycleCtx::default();
        let now = Timestamp(10);
        let mut drains = Drains::new(policy, now);
        let Some(Decision::Drain(drain)) = drains.next(policy, now, &mut ctx) else {
            panic!("queue q drains");
        };
        assert_eq!(drain.queue, "q");
        assert_eq!(uids(&drain.victims), ["b", "a"]);
        assert_eq!(drain.evict_at, Timestamp(130), "after the grace period");
        assert!(
            drains.next(policy, now, &mut ctx).is_none(),
            "one queue drains"
        );
        assert!(
            alloc.state.preempting.is_empty(),
            "deciding tells nobody: the cycle applies the drain"
        );
    }

    #[test]
    fn victims_are_evicted_in_arrival_order_once_their_grace_period_ends() {
        let mut alloc = drained_queue();
        assert_eq!(alloc.cycle(Timestamp(10)).drains.len(), 1);
        let policy = alloc.policy();
        let mut ctx = CycleCtx::default();
        assert!(
            Evictions::new(policy, Timestamp(129))
                .next(policy, Timestamp(129), &mut ctx)
                .is_none(),
            "within the grace period"
        );
        let now = Timestamp(130);
        let mut evictions = Evictions::new(policy, now);
        let mut evicted = Vec::new();
        while let Some(decision) = evictions.next(policy, now, &mut ctx) {
            let Decision::Evict { by, eviction, .. } = decision else {
                panic!("only evictions");
            };
            assert_eq!(by, None, "drained, not preempted");
            assert_eq!(
                eviction.reason,
                EvictionReason::Drained { queue: "q".into() }
            );
            evicted.push(eviction.uid.as_str().to_string());
        }
        assert_eq!(evicted, ["b", "a"]);
        assert_eq!(
            alloc.state.preempting.len(),
            2,
            "still running until applied"
        );
    }

    #[test]
    fn a_failed_search_backs_off_one_more_grace_period_up_to_eight() {
        let now = Timestamp(1_000);
        assert_eq!(back_off(0, 30, now), (1, Timestamp(1_030)));
        assert_eq!(back_off(1, 30, now), (2, Timestamp(1_060)));
        assert_eq!(back_off(7, 30, now), (8, Timestamp(1_240)));
        assert_eq!(back_off(8, 30, now), (8, Timestamp(1_240)), "at most eight");
        assert_eq!(
            back_off(2, 0, now),
            (3, Timestamp(1_003)),
            "no grace period: a second per failure"
        );
    }
}
