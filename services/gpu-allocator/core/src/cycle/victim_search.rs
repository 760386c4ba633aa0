//! Preemption: choosing the set of whole gangs whose eviction lets a blocked
//! job in (quota and concrete nodes) and throws away the least work (see
//! `Cost`), under three rules:
//!
//! - `LowerPriority`: victims from the preemptor's own queue with strictly
//!   lower *base* priority (aging never causes preemption);
//! - `ReclaimQuota`: the preemptor stays within its queue's nominal quota, and
//!   the victims' queues (same cohort) are borrowing that resource (victims
//!   of strictly lower base priority only, if the queue says so);
//! - `FairShare`: the preemptor's queue borrows; victims' queues borrow too and
//!   keep a weighted share at least as large as the preemptor's queue after
//!   the preemption.
//!
//! A job admitted as a starving borrower (larger than its queue's nonzero
//! nominal quota, after waiting `backfill.borrowerHoldAfterSecs`) is never a
//! victim of the last two: it runs on borrowed quota its cohort kept for
//! it. While a cohort keeps
//! quota for such a job, the last two rules are off in that cohort for that
//! resource: capacity they would free is what the cohort is waiting on.
//! Nor is a job admitted in the same cycle a victim of any rule. Under every
//! rule the preemptor must fit its quota without what this cycle's holds
//! keep from it (`Allocator::held_from`): cohort headroom, and its own
//! queue's nominal quota kept for a job ahead of it in line. Whether it
//! borrows, and so which cohort holds bind it, is judged with the victims
//! gone.
//!
//! Why this cannot loop: a lower-priority victim can never preempt back by
//! priority; a reclaiming queue is within nominal, so it is never a borrower
//! that the victim could reclaim from or fair-share against; and a fair-share
//! preemption only moves capacity from a queue whose final share is not below
//! the preemptor's, so the reverse move would need the opposite inequality.
//! On top of that, a job never picks the job that last preempted it (or its
//! earlier attempt: `JobSpec::last_preemptor`).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::rc::Rc;

use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::cycle::placement::{self, Candidate, NodeTable};
use crate::cycle::quota_holds::HeldFrom;
use crate::decision::PreemptionRule;
use crate::ids::{CohortIdx, FastMap, FilterIdx, JobIdx, NodeIdx, QueueIdx, ResourceIdx};
use crate::state::jobs::{Gang, JobState};
use crate::state::queues::UsageDelta;
use crate::types::{CpuMemory, Timestamp};

/// Candidate victims examined per preemptor, lowest priority first.
const MAX_CANDIDATES: usize = 512;
/// Victims examined one by one for a single-victim solution.
const MAX_SINGLE_TRIES: usize = 256;

/// A chosen victim set and the preemptor's planned placement.
pub(crate) struct VictimPlan {
    pub(crate) res: ResourceIdx,
    pub(crate) victims: Vec<(JobIdx, PreemptionRule)>,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
}

/// A possible victim; borrows from the allocator so that listing the
/// (possibly thousands of) running jobs allocates nothing per job.
struct Cand<'a> {
    idx: JobIdx,
    queue: QueueIdx,
    units: u64,
    priority: i32,
    admitted_at: Timestamp,
    /// Arrival order: a unique, cheap tie-breaker.
    seq: u64,
    rule: PreemptionRule,
    /// GPU-seconds its eviction throws away: what it ran since admission
    /// (a job may not resume from a checkpoint) plus a grace period for
    /// this restart and each earlier one.
    lost: u64,
    /// Workers per node.
    placement: &'a [(NodeIdx, u32)],
    per_worker: u32,
    /// CPU and memory each of its workers requests.
    cpu_memory: CpuMemory,
}

impl Cand<'_> {
    /// The cost of evicting this job alone.
    fn cost(&self) -> Cost {
        (self.lost, self.units, 1, self.priority)
    }

    /// Units freed per node.
    fn nodes(&self) -> impl Iterator<Item = (NodeIdx, u32)> + '_ {
        self.placement
            .iter()
            .map(|(n, w)| (*n, w.saturating_mul(self.per_worker)))
    }
}

/// Preemptions decided but not yet carried out, projected as done: victims
/// gone, preemptors admitted. Every new decision is judged against this
/// projected state; judging several preemptions in one cycle against the
/// same current state would overshoot the fair split and invite a swing back.
#[derive(Default)]
pub(crate) struct Inflight {
    pub(crate) deltas: Vec<UsageDelta>,
    /// Units of currently free capacity promised to waiting preemptors.
    pub(crate) claims: FastMap<(NodeIdx, ResourceIdx), u32>,
    /// Node views per (resource, node filter, units and CPU and memory per
    /// worker), shared by the searches of one pass until the next decision
    /// changes the claims.
    bases: RefCell<FastMap<BaseViewKey, Rc<BaseView>>>,
}

/// Resource, node filter, units per worker, CPU and memory per worker.
type BaseViewKey = (ResourceIdx, FilterIdx, u32, CpuMemory);

/// Eligible nodes of one resource for one node filter, net of claims.
struct BaseView {
    nodes: NodeTable,
    /// Nodes that already host a worker, best fit first.
    fitting: Vec<Candidate>,
    slots: u64,
}

/// Everything fixed while searching victims for one preemptor in one resource.
struct Search<'a> {
    alloc: &'a Policy<'a>,
    inflight: &'a [UsageDelta],
    res: ResourceIdx,
    queue: QueueIdx,
    units: u64,
    /// What this cycle's holds keep from the preemptor
    /// (`Allocator::held_from`): evicting others must not start it on that.
    held: HeldFrom,
    /// The preemptor. Slot counts below divide units by its GPUs a worker:
    /// enough to rule victim sets out (they overcount for workers that
    /// must not share a node); placing it decides.
    gang: Gang,
    /// Eligible nodes: free units, zone, rack.
    base: &'a NodeTable,
    /// Eligible nodes that already host a worker, best fit first.
    base_fitting: &'a [Candidate],
    base_slots: u64,
    cands: Vec<Cand<'a>>,
    max_victims: usize,
}

/// (GPU-seconds of work thrown away, GPUs evicted, victim gangs, highest
/// victim priority): smaller is better. Work first: a gang is evicted whole,
/// so stopping one 64-worker gang that has run for hours to start an 8-GPU
/// job loses far more than two small jobs would, while a gang admitted a
/// minute ago loses little. Ranked by GPUs first, the searches threw away
/// 1.6-1.9 times as much work on the gang-heavy and fragmenting benchmarks.
type Cost = (u64, u64, usize, i32);

/// The cost of evicting nobody.
const NO_COST: Cost = (0, 0, 0, i32::MIN);

/// The cost of evicting the victims of `a` and of `b`. Work saturates: it is
/// GPUs x seconds, both from input.
fn plus(a: Cost, b: Cost) -> Cost {
    (
        a.0.saturating_add(b.0),
        a.1.saturating_add(b.1),
        a.2 + b.2,
        a.3.max(b.3),
    )
}

/// Order of the candidates: lowest priority, then the latest admitted (the
/// least work run, as Kueue orders them), the biggest, the first arrived;
/// last the candidate's index. It picks the candidates a search looks at
/// and the greedy search's order: biggest before latest admitted threw away
/// 12-27 % more work on the fragmenting mix (three seeds).
type CandKey = (i32, Reverse<Timestamp>, Reverse<u64>, u64, usize);

/// Order of single victims: least work thrown away, fewest GPUs, then
/// lowest priority, the latest admitted, the first arrived; last the
/// candidate's index.
type SingleKey = (u64, u64, i32, Reverse<Timestamp>, u64, usize);

/// What the rules say of a victim set.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    Hold,
    Broken,
    /// Broken for every superset too: a victim queue would be taken down to
    /// its nominal quota, and more victims only take more. The searches
    /// grow one set, so they stop here (most failing searches end this
    /// way, after up to hundreds of rule checks).
    BrokenForGood,
}

/// What a victim set gives the preemptor.
enum Verdict {
    Fits(Vec<(NodeIdx, u32)>),
    NoFit,
    NoFitForGood,
}

impl Search<'_> {
    fn cost(&self, set: &[usize]) -> Cost {
        set.iter()
            .filter_map(|i| self.cands.get(*i))
            .fold(NO_COST, |sum, c| plus(sum, c.cost()))
    }

    /// Units freed per node by evicting `set` (victims may be gangs spanning
    /// many nodes, so a map keeps this linear).
    fn freed(&self, set: &[usize]) -> FastMap<NodeIdx, u32> {
        let mut freed: FastMap<NodeIdx, u32> = FastMap::default();
        for c in set.iter().filter_map(|i| self.cands.get(*i)) {
            for (node, units) in c.nodes() {
                *freed.entry(node).or_default() += units;
            }
        }
        freed
    }

    /// CPU and memory freed per node by evicting `set`; `None` when the
    /// preemptor asks for neither.
    fn cpu_memory_freed(&self, set: &[usize]) -> Option<FastMap<NodeIdx, CpuMemory>> {
        if self.gang.cpu_memory.is_zero() {
            return None;
        }
        let mut freed: FastMap<NodeIdx, CpuMemory> = FastMap::default();
        for c in set.iter().filter_map(|i| self.cands.get(*i)) {
            for (node, workers) in c.placement {
                let here = freed.entry(*node).or_default();
                *here = here.plus(c.cpu_memory.times(*workers));
            }
        }
        Some(freed)
    }

    /// Worker slots after evicting `set` (cheap necessary condition).
    fn slots_with(&self, freed: &FastMap<NodeIdx, u32>) -> u64 {
        let g = self.gang.per_worker.max(1);
        let mut slots = self.base_slots;
        for (node, extra) in freed {
            if let Some((free, _, _)) = self.base.get(node) {
                slots += u64::from((free + extra) / g) - u64::from(free / g);
            }
        }
        slots
    }

    fn deltas(&self, set: &[usize]) -> Vec<UsageDelta> {
        // Room for the preemptor's own delta too (see `rules_hold`): one
        // allocation per check, no regrowth.
        let mut deltas = Vec::with_capacity(self.inflight.len() + set.len() + 1);
        deltas.extend_from_slice(self.inflight);
        deltas.extend(
            set.iter()
                .filter_map(|i| self.cands.get(*i))
                .map(|c| UsageDelta {
                    queue: c.queue,
                    res: self.res,
                    units: -i64::try_from(c.units).unwrap_or(i64::MAX),
                }),
        );
        deltas
    }

    /// Whether the preemptor fits its quota with `deltas` applied, without
    /// what this cycle's holds keep from it.
    fn quota_fits(&self, deltas: &[UsageDelta]) -> bool {
        let queues = &self.alloc.state.queues;
        // Evicting its own queue's jobs may leave the preemptor within its
        // nominal quota, where only a starving borrower's hold binds it.
        let used = queues.usage_with(self.queue, self.res, deltas);
        let held = self.held.cohort(used, self.units);
        queues
            .check_with_hold(self.queue, self.res, self.units, deltas, held)
            .is_ok()
            && self.held.own_queue_allows(used, self.units)
    }

    /// Quota and rule validity of a victim set.
    fn rules(&self, set: &[usize]) -> Rules {
        let mut deltas = self.deltas(set);
        let queues = &self.alloc.state.queues;
        if !self.quota_fits(&deltas) {
            return Rules::Broken;
        }
        // Victim queues are few: a vector beats a map (every queue is checked,
        // so the order does not matter).
        let mut per_queue: Vec<(QueueIdx, (u64, u64, bool))> = Vec::new();
        for c in set.iter().filter_map(|i| self.cands.get(*i)) {
            if c.queue == self.queue {
                continue;
            }
            let e = match per_queue.iter_mut().position(|(q, _)| *q == c.queue) {
                Some(at) => per_queue.get_mut(at).map(|(_, e)| e),
                None => {
                    per_queue.push((c.queue, (0, u64::MAX, false)));
                    per_queue.last_mut().map(|(_, e)| e)
                }
            };
            let Some(e) = e else { continue };
            e.0 += c.units;
            e.1 = e.1.min(c.units);
            e.2 |= c.rule == PreemptionRule::FairShare;
        }
        if per_queue.is_empty() {
            return Rules::Hold;
        }
        // With the preemptor admitted: the same deltas plus one, so extend
        // them in place and look at the prefix for the state without it.
        let without_me = deltas.len();
        deltas.push(UsageDelta {
            queue: self.queue,
            res: self.res,
            units: i64::try_from(self.units).unwrap_or(i64::MAX),
        });
        let my_share_after = queues.share(self.queue, &deltas);
        let deltas = deltas.get(..without_me).unwrap_or_default();
        // Every queue's nominal check before any fair share: only the first
        // breaks every superset, and finding it ends the search early.
        for (queue, (removed, smallest, _)) in &per_queue {
            let Some(q) = queues.get(*queue) else {
                return Rules::BrokenForGood;
            };
            let nominal = q.quota(self.res).map_or(0, |s| s.nominal);
            // The queue was still borrowing when its last victim was taken:
            // we only take back borrowed capacity, never nominal quota.
            // (Another victim of the queue lowers this sum, whatever its size.)
            let projected = queues.usage_with(*queue, self.res, self.inflight);
            if projected.saturating_sub(*removed).saturating_add(*smallest) <= nominal {
                return Rules::BrokenForGood;
            }
        }
        for (queue, (.., fair_share)) in per_queue {
            if fair_share && my_share_after > queues.share(queue, deltas) {
                return Rules::Broken;
            }
        }
        Rules::Hold
    }

    /// Full check: quota, rules and a concrete placement.
    fn fits(&self, set: &[usize]) -> Option<Vec<(NodeIdx, u32)>> {
        if set.is_empty() || set.len() > self.max_victims {
            return None;
        }
        let freed = self.freed(set);
        if self.slots_with(&freed) < u64::from(self.gang.workers) {
            return None;
        }
        match self.fits_with(set, &freed) {
            Verdict::Fits(placement) => Some(placement),
            Verdict::NoFit | Verdict::NoFitForGood => None,
        }
    }

    /// `fits` for callers that already track the freed units and know the
    /// slot count suffices: rules first (no per-node work), then placement.
    fn fits_with(&self, set: &[usize], freed: &FastMap<NodeIdx, u32>) -> Verdict {
        if set.is_empty() {
            return Verdict::NoFit;
        }
        if set.len() > self.max_victims {
            return Verdict::NoFitForGood;
        }
        match self.rules(set) {
            Rules::Hold => {}
            Rules::Broken => return Verdict::NoFit,
            Rules::BrokenForGood => return Verdict::NoFitForGood,
        }
        self.place_with(set, freed)
    }

    /// The preemptor's placement once `freed` units are back, for a victim
    /// set whose rules hold.
    fn place_with(&self, set: &[usize], freed: &FastMap<NodeIdx, u32>) -> Verdict {
        let cpu_memory_freed = self.cpu_memory_freed(set);
        // Freed nodes with their new usable units; every other node as is.
        let changed: Vec<Candidate> = freed
            .iter()
            .filter_map(|(node, extra)| {
                let (free, zone, rack) = self.base.get(node)?;
                let mut usable = free + extra;
                if let Some(cpu_memory_freed) = &cpu_memory_freed {
                    let n = self.alloc.state.inv.node(*node)?;
                    let freed_here = cpu_memory_freed.get(node).copied().unwrap_or_default();
                    usable = n.usable_units_after(usable, self.gang, freed_here);
                }
                (usable >= self.gang.per_worker).then_some(Candidate {
                    node: *node,
                    usable,
                    zone: *zone,
                    rack: *rack,
                })
            })
            .collect();
        let untouched = self
            .base_fitting
            .iter()
            .filter(|c| !freed.contains_key(&c.node));
        if self.gang.workers == 1 {
            // Best fit without building the full candidate list.
            let best_untouched = untouched.take(1);
            return changed
                .iter()
                .chain(best_untouched)
                .min_by_key(|c| (c.usable, c.node))
                .map_or(Verdict::NoFit, |c| Verdict::Fits(vec![(c.node, 1)]));
        }
        let cands: Vec<Candidate> = untouched.copied().chain(changed).collect();
        placement::place_gang(self.gang, &cands).map_or(Verdict::NoFit, Verdict::Fits)
    }

    /// Drops victims that are not needed, last added first.
    fn minimize(&self, mut set: Vec<usize>) -> Vec<usize> {
        let mut i = set.len();
        while i > 0 {
            i -= 1;
            if set.len() <= 1 {
                break;
            }
            let mut trial = set.clone();
            trial.remove(i);
            if self.fits(&trial).is_some() {
                set = trial;
            }
        }
        set
    }

    /// The cheapest single victim, if one suffices.
    fn single(&self) -> Option<Vec<usize>> {
        // Least work thrown away, then fewest GPUs. Sorted as plain keys
        // (the candidate's index last, as a stable sort would tie them):
        // comparing through the candidates cost more than the rest of this.
        let mut keyed: Vec<SingleKey> = self
            .cands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    c.lost,
                    c.units,
                    c.priority,
                    Reverse(c.admitted_at),
                    c.seq,
                    i,
                )
            })
            .collect();
        // At most `MAX_SINGLE_TRIES` are tried: pick those, sort only them.
        if keyed.len() > MAX_SINGLE_TRIES {
            keyed.select_nth_unstable(MAX_SINGLE_TRIES);
            keyed.truncate(MAX_SINGLE_TRIES);
        }
        keyed.sort_unstable();
        // A node gains at most ceil(units freed / units per worker) worker
        // slots: a victim that cannot add enough even so needs no full check.
        let g = self.gang.per_worker.max(1);
        let may_fit = |c: &Cand<'_>| {
            let most: u64 = c
                .nodes()
                .map(|(_, units)| u64::from(units.div_ceil(g)))
                .sum();
            self.base_slots + most >= u64::from(self.gang.workers)
        };
        // What the rules say of one victim depends only on its queue, units
        // and rule, so victims alike in those share one check: most victims
        // tried here fail the rules, each check a handful of allocations.
        let mut verdicts: Vec<((QueueIdx, u64, bool), bool)> = Vec::new();
        let mut rules_hold = |i: usize, c: &Cand<'_>| {
            let key = (c.queue, c.units, c.rule == PreemptionRule::FairShare);
            match verdicts.iter().find(|(k, _)| *k == key) {
                Some(&(_, hold)) => hold,
                None => {
                    let hold = self.rules(&[i]) == Rules::Hold;
                    verdicts.push((key, hold));
                    hold
                }
            }
        };
        // The checks of `fits`, cheapest first (their order does not change
        // the answer).
        keyed
            .into_iter()
            .map(|(.., i)| i)
            .find(|&i| {
                let Some(c) = self.cands.get(i) else {
                    return false;
                };
                if self.max_victims == 0 || !may_fit(c) || !rules_hold(i, c) {
                    return false;
                }
                let freed = self.freed(&[i]);
                self.slots_with(&freed) >= u64::from(self.gang.workers)
                    && matches!(self.place_with(&[i], &freed), Verdict::Fits(_))
            })
            .map(|i| vec![i])
    }

    /// Clears the cheapest nodes: per node, the exact smallest subset of its
    /// jobs that makes room for one more worker; nodes by that cost until the
    /// gang fits.
    fn node_targeted(&self) -> Option<Vec<usize>> {
        let g = self.gang.per_worker.max(1);
        // (node, candidate, units it holds there) grouped by node, each
        // node's candidates in index order: one run per node, no vector per
        // node, and the per-node buffers below are reused (this runs over
        // hundreds of nodes per search). A placement names each node once.
        // Grouped by counting: nodes are dense indices, and sorting the
        // triples cost a third of this search.
        //
        // Per node, its count of triples, then where its run starts.
        let mut starts = vec![0usize; self.alloc.state.inv.nodes.len()];
        for c in &self.cands {
            for (node, _) in c.nodes() {
                if let Some(count) = starts.get_mut(node.slot()) {
                    *count += 1;
                }
            }
        }
        let mut total = 0;
        let mut hosts = 0;
        for start in &mut starts {
            let count = *start;
            *start = total;
            total += count;
            hosts += usize::from(count > 0);
        }
        let mut on_node: Vec<(NodeIdx, usize, u32)> = vec![(NodeIdx::default(), 0, 0); total];
        for (i, c) in self.cands.iter().enumerate() {
            for (node, units) in c.nodes() {
                if let Some(at) = starts.get_mut(node.slot())
                    && let Some(slot) = on_node.get_mut(*at)
                {
                    *slot = (node, i, units);
                    *at += 1;
                }
            }
        }
        // Per job on the node: units it holds there, what evicting it costs.
        let mut stats: Vec<(u32, Cost)> = Vec::new();
        let mut dp: Vec<Option<Cost>> = Vec::new();
        // For job j and freed units f: the units freed before j when j's
        // eviction improved f (the walk back reads the subset from it).
        let mut from: Vec<Option<usize>> = Vec::new();
        // Per node its cost and its subset, as a range of `subsets`: one
        // buffer for every node's subset rather than a vector each.
        let mut node_costs: Vec<(Cost, NodeIdx, (usize, usize))> = Vec::with_capacity(hosts);
        let mut subsets: Vec<usize> = Vec::with_capacity(total);
        for run in on_node.chunk_by(|a, b| a.0 == b.0) {
            let Some((node, ..)) = run.first() else {
                continue;
            };
            let Some((free, _, _)) = self.base.get(node) else {
                continue;
            };
            let target = (free / g + 1) * g;
            // 0/1 knapsack over the node's jobs: the cheapest subset (as
            // `Cost` ranks them) that frees `need` units here. Exact, and
            // linear in jobs x units per node.
            let need = target.saturating_sub(*free) as usize;
            // Most nodes host one candidate: it alone frees enough or not.
            if let [(_, i, on_node)] = run {
                if *on_node as usize >= need
                    && let Some(c) = self.cands.get(*i)
                {
                    let start = subsets.len();
                    subsets.push(*i);
                    node_costs.push((c.cost(), *node, (start, subsets.len())));
                }
                continue;
            }
            stats.clear();
            stats.extend(
                run.iter().map(|(_, i, on_node)| {
                    (*on_node, self.cands.get(*i).map_or(NO_COST, Cand::cost))
                }),
            );
            let width = need + 1;
            dp.clear();
            dp.resize(width, None);
            if let Some(slot) = dp.first_mut() {
                *slot = Some(NO_COST);
            }
            from.clear();
            from.resize(stats.len() * width, None);
            for (j, (on_node, victim)) in stats.iter().enumerate() {
                for f in (0..=need).rev() {
                    let Some(Some(cost)) = dp.get(f).copied() else {
                        continue;
                    };
                    let nf = (f + *on_node as usize).min(need);
                    if nf == f {
                        continue;
                    }
                    let next = plus(cost, *victim);
                    if let Some(slot) = dp.get_mut(nf)
                        && slot.is_none_or(|c| next < c)
                    {
                        *slot = Some(next);
                        if let Some(link) = from.get_mut(j * width + nf) {
                            *link = Some(f);
                        }
                    }
                }
            }
            if let Some(cost) = dp.pop().flatten().filter(|_| need > 0) {
                // Walk back from the last job: a link means the job's
                // eviction made the state, so it is in, and the walk goes on
                // from the units freed before it.
                let start = subsets.len();
                let mut f = need;
                for j in (0..stats.len()).rev() {
                    if let Some(Some(before)) = from.get(j * width + f) {
                        subsets.extend(run.get(j).map(|(_, i, _)| *i));
                        f = *before;
                    }
                }
                if let Some(subset) = subsets.get_mut(start..) {
                    subset.reverse();
                }
                node_costs.push((cost, *node, (start, subsets.len())));
            }
        }
        // Cheapest node first. A search takes few of the hundreds of nodes
        // before it fits or gives up (at `max_victims`), so a heap hands them
        // out in order without sorting them all (nodes are unique: the
        // order is the sorted one).
        let mut cheapest: BinaryHeap<Reverse<_>> = node_costs.into_iter().map(Reverse).collect();
        let mut chosen: Vec<usize> = Vec::new();
        let mut seen = vec![false; self.cands.len()];
        let mut freed: FastMap<NodeIdx, u32> = FastMap::default();
        let mut slots = self.base_slots;
        while let Some(Reverse((_, _, (start, end)))) = cheapest.pop() {
            for &i in subsets.get(start..end).unwrap_or_default() {
                match seen.get_mut(i) {
                    Some(seen) if !*seen => *seen = true,
                    _ => continue,
                }
                chosen.push(i);
                let Some(c) = self.cands.get(i) else { continue };
                for (node, units) in c.nodes() {
                    let Some((free, _, _)) = self.base.get(&node) else {
                        continue;
                    };
                    let entry = freed.entry(node).or_default();
                    let before = *entry;
                    *entry += units;
                    slots +=
                        u64::from((free + before + units) / g) - u64::from((free + before) / g);
                }
            }
            if chosen.len() > self.max_victims {
                return None;
            }
            // The full check only once the freed slots could host the gang.
            if slots >= u64::from(self.gang.workers) {
                match self.fits_with(&chosen, &freed) {
                    Verdict::Fits(_) => return Some(self.minimize(chosen)),
                    Verdict::NoFitForGood => return None,
                    Verdict::NoFit => {}
                }
            }
        }
        None
    }

    /// Adds victims in candidate order (lowest priority, latest admitted
    /// first) until the job fits.
    /// Worker slots are tracked incrementally so the full check only runs
    /// once the freed capacity could possibly host the gang.
    fn greedy(&self) -> Option<Vec<usize>> {
        let g = self.gang.per_worker.max(1);
        let mut set = Vec::new();
        let mut freed: FastMap<NodeIdx, u32> = FastMap::default();
        let mut slots = self.base_slots;
        for (i, c) in self.cands.iter().enumerate() {
            set.push(i);
            if set.len() > self.max_victims {
                return None;
            }
            for (node, units) in c.nodes() {
                let Some((free, _, _)) = self.base.get(&node) else {
                    continue;
                };
                let entry = freed.entry(node).or_default();
                let before = *entry;
                *entry += units;
                slots += u64::from((free + before + units) / g) - u64::from((free + before) / g);
            }
            if slots >= u64::from(self.gang.workers) {
                match self.fits_with(&set, &freed) {
                    Verdict::Fits(_) => return Some(self.minimize(set)),
                    Verdict::NoFitForGood => return None,
                    Verdict::NoFit => {}
                }
            }
        }
        None
    }

    /// Necessary condition for any victim set: evicting every candidate
    /// frees enough worker slots and quota. Both only grow with more victims,
    /// so when this fails no subset can succeed.
    fn feasible_at_all(&self) -> bool {
        // Quota first, with the victims' usage summed per queue (a handful
        // of deltas instead of one per candidate).
        let mut deltas = self.inflight.to_vec();
        for c in &self.cands {
            let units = -i64::try_from(c.units).unwrap_or(i64::MAX);
            match deltas
                .iter_mut()
                .find(|d| d.queue == c.queue && d.res == self.res && d.units <= 0)
            {
                Some(d) => d.units = d.units.saturating_add(units),
                None => deltas.push(UsageDelta {
                    queue: c.queue,
                    res: self.res,
                    units,
                }),
            }
        }
        if !self.quota_fits(&deltas) {
            return false;
        }
        // Then worker slots, stopping as soon as there are enough.
        let g = self.gang.per_worker.max(1);
        let mut freed: FastMap<NodeIdx, u32> = FastMap::default();
        let mut slots = self.base_slots;
        for c in &self.cands {
            for (node, units) in c.nodes() {
                let Some((free, _, _)) = self.base.get(&node) else {
                    continue;
                };
                let entry = freed.entry(node).or_default();
                let before = *entry;
                *entry += units;
                slots += u64::from((free + before + units) / g) - u64::from((free + before) / g);
            }
            if slots >= u64::from(self.gang.workers) {
                return true;
            }
        }
        false
    }
}

impl Policy<'_> {
    /// A pending job without a nomination, in an existing queue.
    pub(crate) fn may_try_preemption(&self, idx: JobIdx) -> bool {
        let Some(job) = self.state.job(idx) else {
            return false;
        };
        matches!(job.state, JobState::Pending(None))
            && self
                .state
                .queues
                .get(job.queue)
                .is_some_and(|q| q.spec.is_some())
    }

    /// The preemptions in flight, as deltas and claims.
    pub(crate) fn inflight(&self) -> Inflight {
        let mut inflight = Inflight::default();
        for idx in self.preempting_jobs() {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            let Some(run) = job.running() else { continue };
            inflight.deltas.push(UsageDelta {
                queue: job.queue,
                res: run.res,
                units: -i64::try_from(run.admission.total_units()).unwrap_or(i64::MAX),
            });
        }
        for idx in self.nominated_jobs() {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            let JobState::Pending(Some(nomination)) = &job.state else {
                continue;
            };
            if self.victims_left(job, nomination) == 0 {
                continue;
            }
            let Some(res) = self.nomination_res(nomination) else {
                continue;
            };
            inflight.deltas.push(UsageDelta {
                queue: job.queue,
                res,
                units: i64::try_from(job.spec.total_units()).unwrap_or(i64::MAX),
            });
            for planned in &nomination.nodes {
                let Some(node) = self.state.inv.node_by_name(&planned.node) else {
                    continue;
                };
                let need = planned.workers.saturating_mul(job.spec.gpus_per_worker);
                let from_victims: u32 = nomination
                    .victims
                    .iter()
                    .filter_map(|uid| self.job_idx(uid))
                    .filter_map(|v| self.state.job(v).and_then(|j| j.running()))
                    .filter(|run| run.res == res)
                    .flat_map(|run| {
                        run.placement
                            .iter()
                            .filter(|(n, _)| *n == node)
                            .map(|(_, w)| w.saturating_mul(run.per_worker))
                    })
                    .sum();
                *inflight.claims.entry((node, res)).or_default() +=
                    need.saturating_sub(from_victims);
            }
        }
        inflight
    }

    fn base_view(
        &self,
        res: ResourceIdx,
        filter_id: FilterIdx,
        gang: Gang,
        inflight: &Inflight,
    ) -> Option<Rc<BaseView>> {
        let per_worker = gang.per_worker;
        let key = (res, filter_id, per_worker, gang.cpu_memory);
        if let Some(view) = inflight.bases.borrow().get(&key) {
            return Some(Rc::clone(view));
        }
        let r = self.state.inv.res(res)?;
        let mut view = BaseView {
            nodes: NodeTable::new(self.state.inv.nodes.len()),
            fitting: Vec::new(),
            slots: 0,
        };
        for (node_idx, free) in r.nodes_with_free(0) {
            let Some(node) = self.state.inv.node(node_idx) else {
                continue;
            };
            if !self.state.admits(node, filter_id) {
                continue;
            }
            let promised = inflight.claims.get(&(node_idx, res)).copied().unwrap_or(0);
            let free = free.saturating_sub(promised);
            view.slots += u64::from(free / per_worker.max(1));
            view.nodes.set(node_idx, (free, node.zone, node.rack));
            let usable = node.usable_units(free, gang);
            if usable >= per_worker {
                view.fitting.push(Candidate {
                    node: node_idx,
                    usable,
                    zone: node.zone,
                    rack: node.rack,
                });
            }
        }
        view.fitting.sort_unstable_by_key(|c| (c.usable, c.node));
        let view = Rc::new(view);
        inflight.bases.borrow_mut().insert(key, Rc::clone(&view));
        Some(view)
    }

    /// Victims for a blocked job, trying its flavors in preference order.
    /// `draining`: (cohort, resource, holder) of the cohort holds that bind
    /// every member (a starving borrower's): while one stands, nobody else
    /// in the cohort takes that resource from other queues, since what a
    /// preemption frees belongs to the holder.
    pub(crate) fn find_victims(
        &self,
        idx: JobIdx,
        now: Timestamp,
        inflight: &Inflight,
        draining: &[(CohortIdx, ResourceIdx, JobIdx)],
        ctx: &CycleCtx,
    ) -> Option<VictimPlan> {
        self.options_of(idx)
            .into_iter()
            .find_map(|res| self.find_victims_in(idx, res, now, inflight, draining, ctx))
    }

    fn find_victims_in(
        &self,
        idx: JobIdx,
        res: ResourceIdx,
        now: Timestamp,
        inflight: &Inflight,
        draining: &[(CohortIdx, ResourceIdx, JobIdx)],
        ctx: &CycleCtx,
    ) -> Option<VictimPlan> {
        let job = self.state.job(idx)?;
        let spec = &job.spec;
        let queue = self.state.queues.get(job.queue)?;
        let from_other_queues = !draining
            .iter()
            .any(|&(c, r, holder)| queue.cohort == Some(c) && r == res && holder != idx);
        let slot = queue.quota(res)?;
        let units = spec.total_units();
        let projected_own = self
            .state
            .queues
            .usage_with(job.queue, res, &inflight.deltas);
        let within_nominal = projected_own.saturating_add(units) <= slot.nominal;
        // Every victim also spends its grace period checkpointing, then
        // starts again: each of its GPUs loses at least that much, and once
        // more for every earlier restart. A restarted job starts afresh, so
        // without that count it is the cheapest victim again and again.
        let restart = self.state.config.preemption.grace_period_secs;
        // Which queues are eligible victim queues (same cohort, still
        // borrowing in the projected state): once per queue, not per job.
        let borrowing_peer: Vec<bool> = self
            .state
            .queues
            .queues
            .iter()
            .enumerate()
            .map(|(qi, vq)| {
                let qi = QueueIdx::from_slot(qi);
                let nominal = vq.quota(res).map_or(0, |s| s.nominal);
                qi != job.queue
                    && from_other_queues
                    && queue.cohort.is_some()
                    && vq.cohort == queue.cohort
                    && self.state.queues.usage_with(qi, res, &inflight.deltas) > nominal
            })
            .collect();
        // By index: comparing uids with every running job was 2 % of a cycle.
        let last_preemptor = job.preempted_by.as_ref().and_then(|uid| self.job_idx(uid));
        // Only the queues a victim may come from: its own, and the borrowing
        // peers. The sort below is a total order, so the listing order does
        // not matter.
        let victim_queues = QueueIdx::enumerate(&borrowing_peer).filter_map(|(q, peer)| {
            (*peer || (q == job.queue && queue.preemption.within_queue)).then_some(q)
        });
        let lists: Vec<&Vec<JobIdx>> = victim_queues
            .filter_map(|q| self.state.running_by_queue.get(&(q, res)))
            .collect();
        // Room for every job listed: growing the vector as it filled was
        // half a percent of a cycle.
        let mut cands = Vec::with_capacity(lists.iter().map(|l| l.len()).sum());
        let running = lists.into_iter().flatten().filter_map(|vidx| {
            let vjob = self.state.job(*vidx)?;
            Some((*vidx, vjob, vjob.running()?))
        });
        for (vidx, vjob, run) in running {
            // Checks on the job come first: `run` lives behind one more
            // pointer, and most running jobs are ruled out without it.
            if !vjob.spec.preemptible {
                continue;
            }
            // Explicit loop guard: never strike back at the last preemptor.
            if last_preemptor == Some(vidx) {
                continue;
            }
            let rule = if vjob.queue == job.queue {
                if queue.preemption.within_queue && vjob.spec.priority < spec.priority {
                    PreemptionRule::LowerPriority
                } else {
                    continue;
                }
            } else {
                if !borrowing_peer
                    .get(vjob.queue.slot())
                    .copied()
                    .unwrap_or(false)
                {
                    continue;
                }
                // A job its cohort kept quota for (a starving borrower when
                // admitted): taking that back would undo the wait at once.
                if self.starving_borrower(vjob, res, run.admitted_at) {
                    continue;
                }
                if within_nominal {
                    if !queue.preemption.reclaim_within_cohort
                        || (queue.preemption.reclaim_lower_priority_only
                            && vjob.spec.priority >= spec.priority)
                    {
                        continue;
                    }
                    PreemptionRule::ReclaimQuota
                } else {
                    if !queue.preemption.fair_share {
                        continue;
                    }
                    PreemptionRule::FairShare
                }
            };
            // Admitted in this very cycle: telling it to stop before it
            // starts undoes a decision the planner is already carrying out.
            if run.res != res || run.preempting.is_some() || run.cycle == self.state.cycles {
                continue;
            }
            let victim_units = run.admission.total_units();
            let restart_secs = restart.saturating_mul(u64::from(vjob.restarts()).saturating_add(1));
            cands.push(Cand {
                idx: vidx,
                queue: vjob.queue,
                units: victim_units,
                lost: victim_units
                    .saturating_mul(now.secs_since(run.admitted_at).saturating_add(restart_secs)),
                priority: vjob.spec.priority,
                admitted_at: run.admitted_at,
                seq: vjob.seq,
                rule,
                placement: &run.placement,
                per_worker: run.per_worker,
                cpu_memory: vjob.spec.cpu_memory_per_worker,
            });
        }
        if cands.is_empty() {
            return None;
        }
        // In `CandKey` order (a total order: arrival numbers are unique). Sorted
        // as plain keys, and only the first `MAX_CANDIDATES` of them, which
        // are all a search looks at: moving and comparing whole candidates
        // was a tenth of a search.
        let mut keyed: Vec<CandKey> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                (
                    c.priority,
                    Reverse(c.admitted_at),
                    Reverse(c.units),
                    c.seq,
                    i,
                )
            })
            .collect();
        if keyed.len() > MAX_CANDIDATES {
            keyed.select_nth_unstable(MAX_CANDIDATES);
            keyed.truncate(MAX_CANDIDATES);
        }
        keyed.sort_unstable();
        let mut unsorted: Vec<Option<Cand<'_>>> = cands.into_iter().map(Some).collect();
        let cands: Vec<Cand<'_>> = keyed
            .iter()
            .filter_map(|&(.., i)| unsorted.get_mut(i).and_then(Option::take))
            .collect();

        let view = self.base_view(res, job.filter, Gang::of(spec), inflight)?;
        let search = Search {
            alloc: self,
            inflight: &inflight.deltas,
            res,
            queue: job.queue,
            units,
            held: self.held_from(ctx, idx, res, now),
            gang: Gang::of(spec),
            base: &view.nodes,
            base_fitting: &view.fitting,
            base_slots: view.slots,
            cands,
            max_victims: usize::try_from(self.state.config.preemption.max_victims)
                .unwrap_or(usize::MAX),
        };
        if !search.feasible_at_all() {
            return None;
        }
        // Every strategy proposes a set; the cheapest wins. Greedy only runs
        // when the structured searches found nothing.
        let mut proposals: Vec<Vec<usize>> = Vec::new();
        proposals.extend(search.single());
        proposals.extend(search.node_targeted());
        if proposals.is_empty() {
            proposals.extend(search.greedy());
        }
        let chosen = proposals.into_iter().min_by_key(|set| search.cost(set))?;
        let placement = search.fits(&chosen)?;
        let victims = chosen
            .iter()
            .filter_map(|i| search.cands.get(*i))
            .map(|c| (c.idx, c.rule))
            .collect();
        Some(VictimPlan {
            res,
            victims,
            placement,
        })
    }
}
