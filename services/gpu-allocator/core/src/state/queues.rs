//! TrainingQueues: nominal quota, cohort borrowing and lending, and the
//! weighted dominant-resource fair share used to order queues in a cycle.
//!
//! Quota model (the one Kueue users know):
//! - a queue may use up to `nominal` of a resource unconditionally (if the
//!   cohort has not lent it out, in which case it reclaims it);
//! - above nominal it borrows from the cohort pool, at most `borrowingLimit`;
//! - the pool is the sum of the members' lendable quota
//!   (`lendingLimit`, or all of nominal);
//! - a queue's share is `max over resources (usage above nominal / pool) / weight`.

use crate::config::AgingPolicy;
use crate::event::{QueuePreemption, QueueSpec};
use crate::ids::{CohortIdx, QueueIdx};
use crate::ids::{FlavorIdx, ResourceIdx};

/// Limits of one resource for one queue.
#[derive(Debug, Clone)]
pub(crate) struct QuotaSlot {
    pub(crate) res: ResourceIdx,
    pub(crate) flavor: FlavorIdx,
    /// What the slot counts: whole GPUs, time-sliced replicas, or MIG.
    pub(crate) class: SlotClass,
    pub(crate) nominal: u64,
    pub(crate) borrowing_limit: Option<u64>,
    pub(crate) lending_limit: Option<u64>,
}

/// Coarse kind of a quota slot, enough to pick a job's options without
/// looking up resource kinds per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotClass {
    WholeGpu,
    SharedGpu,
    Mig,
}

impl QuotaSlot {
    /// Part of nominal that cohort members may borrow.
    pub(crate) fn lendable(&self) -> u64 {
        self.lending_limit.unwrap_or(self.nominal).min(self.nominal)
    }

    /// Part of nominal that is never lent out.
    pub(crate) fn guaranteed(&self) -> u64 {
        self.nominal - self.lendable()
    }

    /// The most the queue may use: nominal plus its borrowing limit in a
    /// cohort, nominal alone outside one.
    pub(crate) fn own_limit(&self, in_cohort: bool) -> u64 {
        if in_cohort {
            self.nominal
                .saturating_add(self.borrowing_limit.unwrap_or(UNLIMITED))
        } else {
            self.nominal
        }
    }
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) name: std::sync::Arc<str>,
    /// `None` while the TrainingQueue does not exist (never created, or
    /// deleted while jobs still referred to it).
    pub(crate) spec: Option<QueueSpec>,
    pub(crate) cohort: Option<CohortIdx>,
    pub(crate) weight: f64,
    /// Quota slots in flavor preference order.
    pub(crate) quotas: Vec<QuotaSlot>,
    /// Flavors in preference order (deduplicated from `quotas`).
    pub(crate) flavor_order: Vec<FlavorIdx>,
    /// Resources a whole-GPU job may use, in preference order.
    pub(crate) plain_options: Vec<ResourceIdx>,
    /// Resources a job that opted in to sharing may use: per flavor, shared
    /// replicas first, then whole GPUs.
    pub(crate) sharing_options: Vec<ResourceIdx>,
    /// Units in use per resource (kept when the spec is removed, because the
    /// jobs still hold them).
    pub(crate) usage: Vec<(ResourceIdx, u64)>,
    /// Its pending jobs, in line order.
    pub(crate) line: crate::state::line::QueueLine,
    pub(crate) preemption: QueuePreemption,
    /// The queue's own aging; `None` = the configured one.
    pub(crate) aging: Option<AgingPolicy>,
}

impl Queue {
    pub(crate) fn new(name: &str) -> Self {
        Queue {
            name: std::sync::Arc::from(name),
            spec: None,
            cohort: None,
            weight: 1.0,
            quotas: Vec::new(),
            flavor_order: Vec::new(),
            plain_options: Vec::new(),
            sharing_options: Vec::new(),
            usage: Vec::new(),
            line: crate::state::line::QueueLine::default(),
            preemption: QueuePreemption::default(),
            aging: None,
        }
    }

    pub(crate) fn quota(&self, res: ResourceIdx) -> Option<&QuotaSlot> {
        self.quotas.iter().find(|q| q.res == res)
    }

    pub(crate) fn usage(&self, res: ResourceIdx) -> u64 {
        self.usage
            .iter()
            .find(|(r, _)| *r == res)
            .map_or(0, |(_, u)| *u)
    }

    fn set_usage(&mut self, res: ResourceIdx, value: u64) {
        match self.usage.iter_mut().find(|(r, _)| *r == res) {
            Some(entry) => entry.1 = value,
            None => self.usage.push((res, value)),
        }
    }
}

/// Lendable pool of one resource in one cohort.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PoolAccount {
    pub(crate) lendable: u64,
    /// Sum over members of usage beyond their guaranteed (never-lent) part.
    pub(crate) used: u64,
}

#[derive(Debug)]
pub(crate) struct Cohort {
    pub(crate) members: Vec<QueueIdx>,
    pub(crate) pools: Vec<(ResourceIdx, PoolAccount)>,
}

impl Cohort {
    pub(crate) fn pool(&self, res: ResourceIdx) -> PoolAccount {
        self.pools
            .iter()
            .find(|(r, _)| *r == res)
            .map_or(PoolAccount::default(), |(_, p)| *p)
    }

    fn pool_mut(&mut self, res: ResourceIdx) -> &mut PoolAccount {
        if let Some(i) = self.pools.iter().position(|(r, _)| *r == res) {
            return &mut self.pools[i].1;
        }
        self.pools.push((res, PoolAccount::default()));
        let last = self.pools.len() - 1;
        &mut self.pools[last].1
    }
}

/// Why a queue cannot take `requested` more units of a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaShortfall {
    pub(crate) nominal: u64,
    pub(crate) used: u64,
    pub(crate) available: u64,
    /// The job would stay within nominal: the cohort lent the quota out and
    /// it can be reclaimed.
    pub(crate) reclaimable: bool,
    /// The queue's own limit (nominal plus borrowing limit) would allow it:
    /// only the cohort pool is short.
    pub(crate) cohort_short: bool,
    /// Unused units left in the cohort pool.
    pub(crate) pool_headroom: u64,
}

/// A what-if change of usage, for preemption searches.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UsageDelta {
    pub(crate) queue: QueueIdx,
    pub(crate) res: ResourceIdx,
    pub(crate) units: i64,
}

/// Queue and cohort state.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    pub(crate) queues: Vec<Queue>,
    by_name: std::collections::HashMap<String, QueueIdx>,
    pub(crate) cohorts: Vec<Cohort>,
    cohort_by_name: std::collections::HashMap<String, CohortIdx>,
    /// Bumped by every queue spec installed or removed: what is worked out
    /// from the queues' flavors and namespaces holds while it stays.
    pub(crate) changes: u64,
}

/// Effectively unlimited borrowing, without overflow in sums.
const UNLIMITED: u64 = u64::MAX / 4;

impl Queues {
    pub(crate) fn intern(&mut self, name: &str) -> QueueIdx {
        if let Some(idx) = self.by_name.get(name) {
            return *idx;
        }
        let idx = QueueIdx::from_slot(self.queues.len());
        self.queues.push(Queue::new(name));
        self.by_name.insert(name.to_string(), idx);
        idx
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<QueueIdx> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn get(&self, idx: QueueIdx) -> Option<&Queue> {
        self.queues.get(idx.slot())
    }

    /// Queue `idx`'s name, for a decision or reason that names it.
    pub(crate) fn name_of(&self, idx: QueueIdx) -> String {
        self.get(idx)
            .map(|q| q.name.to_string())
            .unwrap_or_default()
    }

    pub(crate) fn get_mut(&mut self, idx: QueueIdx) -> Option<&mut Queue> {
        self.queues.get_mut(idx.slot())
    }

    fn intern_cohort(&mut self, name: &str) -> CohortIdx {
        if let Some(idx) = self.cohort_by_name.get(name) {
            return *idx;
        }
        let idx = CohortIdx::from_slot(self.cohorts.len());
        self.cohorts.push(Cohort {
            members: Vec::new(),
            pools: Vec::new(),
        });
        self.cohort_by_name.insert(name.to_string(), idx);
        idx
    }

    /// Installs a (validated) spec whose flavors/resources are already
    /// resolved to `slots`, then recomputes the affected cohorts' pools.
    pub(crate) fn upsert(&mut self, spec: QueueSpec, slots: Vec<QuotaSlot>) -> QueueIdx {
        self.changes += 1;
        let idx = self.intern(&spec.name);
        let new_cohort = spec.cohort.as_deref().map(|c| self.intern_cohort(c));
        let old_cohort = self.get(idx).and_then(|q| q.cohort);
        let mut flavor_order = Vec::new();
        for s in &slots {
            if !flavor_order.contains(&s.flavor) {
                flavor_order.push(s.flavor);
            }
        }
        let find = |flavor: FlavorIdx, class: SlotClass| {
            slots
                .iter()
                .find(|s| s.flavor == flavor && s.class == class)
                .map(|s| s.res)
        };
        let plain_options: Vec<ResourceIdx> = flavor_order
            .iter()
            .filter_map(|f| find(*f, SlotClass::WholeGpu))
            .collect();
        let sharing_options: Vec<ResourceIdx> = flavor_order
            .iter()
            .flat_map(|f| {
                [
                    find(*f, SlotClass::SharedGpu),
                    find(*f, SlotClass::WholeGpu),
                ]
            })
            .flatten()
            .collect();
        if let Some(q) = self.get_mut(idx) {
            q.weight = spec.weight;
            q.preemption = spec.preemption;
            q.aging = spec.aging;
            q.quotas = slots;
            q.flavor_order = flavor_order;
            q.plain_options = plain_options;
            q.sharing_options = sharing_options;
            q.cohort = new_cohort;
            q.spec = Some(spec);
        }
        self.recompute_cohorts(&[old_cohort, new_cohort]);
        idx
    }

    /// Removes a queue's spec; usage stays (its running jobs still hold it).
    pub(crate) fn remove(&mut self, name: &str) -> bool {
        let Some(idx) = self.by_name(name) else {
            return false;
        };
        let old_cohort = self.get(idx).and_then(|q| q.cohort);
        let Some(q) = self.get_mut(idx) else {
            return false;
        };
        if q.spec.is_none() {
            return false;
        }
        q.spec = None;
        q.aging = None;
        q.quotas.clear();
        q.flavor_order.clear();
        q.plain_options.clear();
        q.sharing_options.clear();
        q.cohort = None;
        self.changes += 1;
        self.recompute_cohorts(&[old_cohort]);
        true
    }

    fn recompute_cohorts(&mut self, cohorts: &[Option<CohortIdx>]) {
        for cohort in cohorts.iter().flatten() {
            let members: Vec<QueueIdx> = self
                .queues
                .iter()
                .enumerate()
                .filter(|(_, q)| q.spec.is_some() && q.cohort == Some(*cohort))
                .map(|(i, _)| QueueIdx::from_slot(i))
                .collect();
            let mut pools: Vec<(ResourceIdx, PoolAccount)> = Vec::new();
            for m in &members {
                let Some(q) = self.get(*m) else { continue };
                for slot in &q.quotas {
                    let used_beyond = q.usage(slot.res).saturating_sub(slot.guaranteed());
                    match pools.iter_mut().find(|(r, _)| *r == slot.res) {
                        Some((_, p)) => {
                            p.lendable += slot.lendable();
                            p.used += used_beyond;
                        }
                        None => pools.push((
                            slot.res,
                            PoolAccount {
                                lendable: slot.lendable(),
                                used: used_beyond,
                            },
                        )),
                    }
                }
                // Usage of resources the queue has no quota for still draws
                // on the pool (e.g. after a quota was removed).
                for (res, used) in &q.usage {
                    if q.quota(*res).is_none() {
                        match pools.iter_mut().find(|(r, _)| r == res) {
                            Some((_, p)) => p.used += used,
                            None => pools.push((
                                *res,
                                PoolAccount {
                                    lendable: 0,
                                    used: *used,
                                },
                            )),
                        }
                    }
                }
            }
            if let Some(c) = self.cohorts.get_mut(cohort.slot()) {
                c.members = members;
                c.pools = pools;
            }
        }
    }

    /// Applies a usage change to the queue and its cohort pool.
    pub(crate) fn add_usage(&mut self, queue: QueueIdx, res: ResourceIdx, delta: i64) {
        let Some(q) = self.queues.get_mut(queue.slot()) else {
            return;
        };
        let guaranteed = q.quota(res).map_or(0, QuotaSlot::guaranteed);
        let before = q.usage(res);
        let after =
            u64::try_from((i128::from(before) + i128::from(delta)).max(0)).unwrap_or(u64::MAX);
        q.set_usage(res, after);
        if let Some(cohort) = q.cohort
            && let Some(c) = self.cohorts.get_mut(cohort.slot())
        {
            let pool = c.pool_mut(res);
            let old_beyond = before.saturating_sub(guaranteed);
            let new_beyond = after.saturating_sub(guaranteed);
            pool.used = (pool.used + new_beyond).saturating_sub(old_beyond);
        }
    }

    /// Checks whether `queue` may take `requested` more units of `res`, given
    /// what-if `deltas` (victims removed).
    pub(crate) fn check(
        &self,
        queue: QueueIdx,
        res: ResourceIdx,
        requested: u64,
        deltas: &[UsageDelta],
    ) -> Result<(), QuotaShortfall> {
        self.check_with_hold(queue, res, requested, deltas, 0)
    }

    /// Whether `requested` units of `res` would fit `queue`'s quota with
    /// nothing else running: its own limit and, in a cohort, what the pool
    /// can lend besides its guaranteed part.
    pub(crate) fn fits_when_idle(&self, queue: QueueIdx, res: ResourceIdx, requested: u64) -> bool {
        let Some(q) = self.get(queue) else {
            return false;
        };
        let Some(slot) = q.quota(res) else {
            return false;
        };
        requested <= slot.own_limit(q.cohort.is_some())
            && q.cohort
                .and_then(|c| self.cohorts.get(c.slot()))
                .is_none_or(|cohort| {
                    requested <= slot.guaranteed().saturating_add(cohort.pool(res).lendable)
                })
    }

    /// `check`, with `held` units of the cohort pool set aside for a blocked
    /// job ahead in line (see the quota hold in the allocator).
    pub(crate) fn check_with_hold(
        &self,
        queue: QueueIdx,
        res: ResourceIdx,
        requested: u64,
        deltas: &[UsageDelta],
        held: u64,
    ) -> Result<(), QuotaShortfall> {
        let Some(q) = self.get(queue) else {
            return Err(QuotaShortfall {
                nominal: 0,
                used: 0,
                available: 0,
                reclaimable: false,
                cohort_short: false,
                pool_headroom: 0,
            });
        };
        let Some(slot) = q.quota(res) else {
            return Err(QuotaShortfall {
                nominal: 0,
                used: q.usage(res),
                available: 0,
                reclaimable: false,
                cohort_short: false,
                pool_headroom: 0,
            });
        };
        let used = self.usage_with(queue, res, deltas);
        let own_limit = slot.own_limit(q.cohort.is_some());
        let mut available = own_limit.saturating_sub(used);
        let mut pool_headroom = 0;
        if let Some(cohort_id) = q.cohort
            && let Some(cohort) = self.cohorts.get(cohort_id.slot())
        {
            let mut pool = cohort.pool(res);
            // Re-derive the pool use of every member the what-if touches,
            // once per member (the per-member term is not linear): at its
            // first delta. What-ifs hold a few dozen deltas at most, and
            // this runs for every victim set a search checks, so a scan
            // beats collecting and sorting the members.
            let touched = deltas.iter().enumerate().filter_map(|(i, d)| {
                let first = d.res == res
                    && !deltas
                        .get(..i)
                        .unwrap_or_default()
                        .iter()
                        .any(|e| e.res == res && e.queue == d.queue);
                first.then_some(d.queue)
            });
            for member_idx in touched {
                let Some(member) = self.get(member_idx) else {
                    continue;
                };
                if member.cohort != Some(cohort_id) {
                    continue;
                }
                let g = member.quota(res).map_or(0, QuotaSlot::guaranteed);
                let before = member.usage(res);
                let after = self.usage_with(member_idx, res, deltas);
                pool.used =
                    (pool.used + after.saturating_sub(g)).saturating_sub(before.saturating_sub(g));
            }
            pool_headroom = pool.lendable.saturating_sub(pool.used);
            let headroom = pool_headroom.saturating_sub(held);
            let from_guaranteed = slot.guaranteed().saturating_sub(used);
            available = available.min(from_guaranteed.saturating_add(headroom));
        }
        if requested <= available {
            Ok(())
        } else {
            Err(QuotaShortfall {
                nominal: slot.nominal,
                used,
                available,
                reclaimable: used.saturating_add(requested) <= slot.nominal,
                cohort_short: q.cohort.is_some() && used.saturating_add(requested) <= own_limit,
                pool_headroom,
            })
        }
    }

    /// Usage of `res` by `queue` with what-if `deltas` applied.
    pub(crate) fn usage_with(
        &self,
        queue: QueueIdx,
        res: ResourceIdx,
        deltas: &[UsageDelta],
    ) -> u64 {
        let base = self.get(queue).map_or(0, |q| q.usage(res));
        let delta: i64 = deltas
            .iter()
            .filter(|d| d.queue == queue && d.res == res)
            .map(|d| d.units)
            .sum();
        u64::try_from((i128::from(base) + i128::from(delta)).max(0)).unwrap_or(u64::MAX)
    }

    /// Weighted dominant share: the largest fraction of a cohort pool the
    /// queue borrows, divided by its weight. Queues within nominal have 0.
    pub(crate) fn share(&self, queue: QueueIdx, deltas: &[UsageDelta]) -> f64 {
        let Some(q) = self.get(queue) else { return 0.0 };
        let Some(cohort) = q.cohort.and_then(|c| self.cohorts.get(c.slot())) else {
            return 0.0;
        };
        if deltas.is_empty() {
            // Hot path (queue ordering in every cycle): no allocation.
            let mut dominant: f64 = 0.0;
            for (res, usage) in &q.usage {
                let nominal = q.quota(*res).map_or(0, |s| s.nominal);
                let borrowed = usage.saturating_sub(nominal);
                if borrowed > 0 {
                    let pool = cohort.pool(*res).lendable.max(1);
                    dominant = dominant.max(borrowed as f64 / pool as f64);
                }
            }
            return dominant / q.weight;
        }
        let mut resources: Vec<ResourceIdx> = q.usage.iter().map(|(r, _)| *r).collect();
        resources.extend(deltas.iter().filter(|d| d.queue == queue).map(|d| d.res));
        resources.sort_unstable();
        resources.dedup();
        let mut dominant: f64 = 0.0;
        for res in resources {
            let usage = self.usage_with(queue, res, deltas);
            let nominal = q.quota(res).map_or(0, |s| s.nominal);
            let borrowed = usage.saturating_sub(nominal);
            if borrowed == 0 {
                continue;
            }
            let pool = cohort.pool(res).lendable.max(1);
            dominant = dominant.max(borrowed as f64 / pool as f64);
        }
        dominant / q.weight
    }

    /// Re-derives every cohort pool from queue usage (after restore).
    pub(crate) fn recompute_all_cohorts(&mut self) {
        let all: Vec<Option<CohortIdx>> = (0..self.cohorts.len())
            .map(|i| Some(CohortIdx::from_slot(i)))
            .collect();
        self.recompute_cohorts(&all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(
        res: ResourceIdx,
        nominal: u64,
        borrowing: Option<u64>,
        lending: Option<u64>,
    ) -> QuotaSlot {
        QuotaSlot {
            res,
            flavor: FlavorIdx::from(0),
            class: SlotClass::WholeGpu,
            nominal,
            borrowing_limit: borrowing,
            lending_limit: lending,
        }
    }

    fn spec(name: &str, cohort: Option<&str>, weight: f64) -> QueueSpec {
        QueueSpec {
            name: name.into(),
            cohort: cohort.map(str::to_string),
            weight,
            ..QueueSpec::default()
        }
    }

    #[test]
    fn queue_without_cohort_is_capped_at_nominal() {
        let mut qs = Queues::default();
        let a = qs.upsert(
            spec("a", None, 1.0),
            vec![slot(ResourceIdx::from(0), 8, None, None)],
        );
        assert_eq!(qs.check(a, ResourceIdx::from(0), 8, &[]), Ok(()));
        qs.add_usage(a, ResourceIdx::from(0), 6);
        let short = qs
            .check(a, ResourceIdx::from(0), 4, &[])
            .expect_err("over nominal");
        assert_eq!(short.available, 2);
    }

    #[test]
    fn borrowing_respects_limits_and_lending() {
        let mut qs = Queues::default();
        let a = qs.upsert(
            spec("a", Some("c"), 1.0),
            vec![slot(ResourceIdx::from(0), 4, Some(6), None)],
        );
        let b = qs.upsert(
            spec("b", Some("c"), 1.0),
            vec![slot(ResourceIdx::from(0), 8, None, Some(5))],
        );
        // Pool = 4 (a lends all) + 5 (b lends 5 of 8) = 9; a may use 4 + 5 = 9,
        // capped by its borrowing limit 4 + 6 = 10.
        assert_eq!(qs.check(a, ResourceIdx::from(0), 9, &[]), Ok(()));
        assert!(qs.check(a, ResourceIdx::from(0), 10, &[]).is_err());
        qs.add_usage(a, ResourceIdx::from(0), 9);
        // b's guaranteed 3 is untouched, the rest of its nominal was lent.
        assert_eq!(qs.check(b, ResourceIdx::from(0), 3, &[]), Ok(()));
        let short = qs
            .check(b, ResourceIdx::from(0), 4, &[])
            .expect_err("lent out");
        assert!(short.reclaimable, "b is within nominal: it may reclaim");
        assert!(qs.share(a, &[]) > 0.0);
        assert_eq!(qs.share(b, &[]), 0.0);
    }

    #[test]
    fn weight_divides_the_share() {
        let mut qs = Queues::default();
        let a = qs.upsert(
            spec("a", Some("c"), 1.0),
            vec![slot(ResourceIdx::from(0), 0, None, None)],
        );
        let b = qs.upsert(
            spec("b", Some("c"), 2.0),
            vec![slot(ResourceIdx::from(0), 0, None, None)],
        );
        let _lender = qs.upsert(
            spec("l", Some("c"), 1.0),
            vec![slot(ResourceIdx::from(0), 10, None, None)],
        );
        qs.add_usage(a, ResourceIdx::from(0), 4);
        qs.add_usage(b, ResourceIdx::from(0), 4);
        assert!((qs.share(a, &[]) - 0.4).abs() < 1e-9);
        assert!((qs.share(b, &[]) - 0.2).abs() < 1e-9);
        let what_if = [UsageDelta {
            queue: a,
            res: ResourceIdx::from(0),
            units: -2,
        }];
        assert!((qs.share(a, &what_if) - 0.2).abs() < 1e-9);
    }
}
