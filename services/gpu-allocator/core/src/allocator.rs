//! The allocator's state and event application: nodes, queues and jobs in,
//! with every event idempotent by its key. The cycle lives in `cycle.rs`,
//! snapshots in `snapshot.rs`.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::backfill::{Booking, ReleaseBook};
use crate::config::AllocatorConfig;
use crate::cycle::{EmptySlots, QuotaBlockedShapes};
use crate::decision::{
    Admission, Drain, Eviction, EvictionReason, PlannedNode, Preemption, PreemptionRule, Victim,
};
use crate::error::AllocatorError;
use crate::event::{Applied, Event, JobSpec, NodeInfo, QueueSpec};
use crate::inventory::{Inventory, JobIdx, Node, NodeFilter, NodeIdx, ResIdx};
use crate::line::LineEntry;
use crate::queues::{QueueIdx, Queues, QuotaSlot, SlotClass};
use crate::types::{JobUid, ResourceKind, Timestamp};

/// Hash map with a fast, fixed-seed hasher: per-cycle memos are hot, and a
/// fixed seed keeps every run of the same input identical.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// A victim that is checkpointing before eviction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptingState {
    /// The preemptor; none when its queue drains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<JobUid>,
    /// Rule that allowed the preemption.
    pub rule: PreemptionRule,
    /// Eviction deadline.
    pub evict_at: Timestamp,
    /// The victim reported its checkpoint, so it can go before the deadline.
    pub checkpointed: bool,
}

/// A preemptor waiting for its victims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nomination {
    /// Victims that must be gone before the preemptor starts.
    pub victims: Vec<JobUid>,
    /// Eviction deadline.
    pub evict_at: Timestamp,
    /// Flavor the plan is for.
    pub flavor: String,
    /// Resource the plan is for.
    pub resource: String,
    /// Planned nodes; held for the preemptor meanwhile.
    pub nodes: Vec<PlannedNode>,
}

#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) res: ResIdx,
    pub(crate) per_worker: u32,
    pub(crate) placement: Vec<(NodeIdx, u32)>,
    pub(crate) admitted_at: Timestamp,
    /// The cycle that admitted it (`Allocator::cycles` then); a replayed
    /// admission gets the last cycle's, so it is never taken for one of
    /// the next cycle's.
    pub(crate) cycle: u64,
    pub(crate) admission: Admission,
    pub(crate) preempting: Option<PreemptingState>,
}

#[derive(Debug)]
pub(crate) enum JobState {
    // The nomination boxed too: a pending job is read by every cycle, a
    // nomination by few.
    Pending(Option<Box<Nomination>>),
    // Boxed: pending jobs (the many) stay small and cache-friendly.
    Running(Box<Running>),
}

/// In this order (`repr(C)`): what a cycle reads of every job it
/// evaluates comes first, then the spec, whose own order does the same
/// (see `JobSpec`). A full evaluation starts with a job nothing has touched
/// for a cycle, so each cache line it needs is a miss; the compiler's order
/// spread those fields over four or five of its cache lines.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Job {
    pub(crate) state: JobState,
    pub(crate) queue: QueueIdx,
    pub(crate) filter: u32,
    /// Arrival order, the last tie-breaker after priority and submission
    /// time (cheaper than comparing uids, and the same after a replay).
    pub(crate) seq: u64,
    pub(crate) spec: JobSpec,
    pub(crate) requeues: u32,
    /// Last job that preempted this one, or an earlier attempt of it
    /// (`JobSpec::last_preemptor`): never chosen as this job's victim (the
    /// explicit half of the no-loop guarantee).
    pub(crate) preempted_by: Option<JobUid>,
    /// A victim search that found nothing is not repeated before this time
    /// (see the preemption pass): searches are the costliest part of a cycle.
    pub(crate) preemption_retry_after: Timestamp,
    /// Consecutive fruitless victim searches.
    pub(crate) preemption_failures: u32,
}

impl Job {
    pub(crate) fn running(&self) -> Option<&Running> {
        match &self.state {
            JobState::Running(r) => Some(r.as_ref()),
            JobState::Pending(_) => None,
        }
    }

    /// Restarts before its current run: those of earlier attempts and this
    /// allocator's own requeues.
    pub(crate) fn restarts(&self) -> u32 {
        self.spec.earlier_restarts.saturating_add(self.requeues)
    }
}

/// Cluster-level counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatorStats {
    /// Nodes known.
    pub nodes: u32,
    /// Whole GPUs on all nodes.
    pub gpu_capacity: u64,
    /// Whole GPUs held by admitted jobs.
    pub gpus_allocated: u64,
    /// Jobs pending.
    pub pending_jobs: u32,
    /// Jobs running.
    pub running_jobs: u32,
}

/// The GPU admission decision core.
pub struct Allocator {
    pub(crate) config: AllocatorConfig,
    pub(crate) inv: Inventory,
    pub(crate) queues: Queues,
    pub(crate) jobs: Vec<Option<Job>>,
    pub(crate) job_by_uid: FastMap<JobUid, JobIdx>,
    pub(crate) free_job_slots: Vec<JobIdx>,
    pub(crate) filters: Vec<NodeFilter>,
    pub(crate) filter_ids: HashMap<NodeFilter, u32>,
    pub(crate) preempting: BTreeSet<JobIdx>,
    pub(crate) nominated: BTreeSet<JobIdx>,
    pub(crate) tombstones: HashMap<JobUid, Timestamp>,
    pub(crate) tombstone_order: VecDeque<(Timestamp, JobUid)>,
    pub(crate) undelivered_evictions: Vec<Eviction>,
    pub(crate) clock: Timestamp,
    /// Cycles run, this one included while it runs.
    pub(crate) cycles: u64,
    pub(crate) next_seq: u64,
    /// Jobs that held a reservation at the end of the last cycle.
    pub(crate) reserved_jobs: Vec<JobUid>,
    /// Expected releases of the running jobs, per resource.
    pub(crate) releases: FastMap<ResIdx, ReleaseBook>,
    /// Running jobs per (queue, resource), in no particular order: a victim
    /// search lists only the queues it may take from.
    pub(crate) running_by_queue: FastMap<(QueueIdx, ResIdx), Vec<JobIdx>>,
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

pub(crate) fn units_i64(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

impl Allocator {
    /// Creates an empty allocator.
    pub fn new(config: AllocatorConfig) -> Result<Self, AllocatorError> {
        config.validate()?;
        let inv = Inventory::new(&config);
        let mut alloc = Allocator {
            config,
            inv,
            queues: Queues::default(),
            jobs: Vec::new(),
            job_by_uid: FastMap::default(),
            free_job_slots: Vec::new(),
            filters: Vec::new(),
            filter_ids: HashMap::new(),
            preempting: BTreeSet::new(),
            nominated: BTreeSet::new(),
            tombstones: HashMap::new(),
            tombstone_order: VecDeque::new(),
            undelivered_evictions: Vec::new(),
            clock: Timestamp(0),
            cycles: 0,
            next_seq: 0,
            reserved_jobs: Vec::new(),
            releases: FastMap::default(),
            running_by_queue: FastMap::default(),
            spare_quota_blocked: QuotaBlockedShapes::default(),
            spare_empty_slots: (0, EmptySlots::default()),
        };
        // Filter 0 is "no constraints", the common case checked fastest.
        alloc.intern_filter(NodeFilter::default());
        Ok(alloc)
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    pub(crate) fn job(&self, idx: JobIdx) -> Option<&Job> {
        self.jobs.get(idx as usize).and_then(Option::as_ref)
    }

    /// Job `idx`'s uid, for a reason that names it.
    pub(crate) fn job_uid(&self, idx: JobIdx) -> Option<JobUid> {
        self.job(idx).map(|j| j.spec.uid.clone())
    }

    pub(crate) fn job_mut(&mut self, idx: JobIdx) -> Option<&mut Job> {
        self.jobs.get_mut(idx as usize).and_then(Option::as_mut)
    }

    /// Job `idx`'s queue, base priority and line entry, as its spec and
    /// arrival say now.
    fn line_entry(&self, idx: JobIdx) -> Option<(QueueIdx, i32, LineEntry)> {
        let job = self.job(idx)?;
        Some((job.queue, job.spec.priority, LineEntry::of(idx, job)))
    }

    /// Puts job `idx` in its queue's line.
    pub(crate) fn list(&mut self, idx: JobIdx) {
        if let Some((queue, priority, entry)) = self.line_entry(idx)
            && let Some(q) = self.queues.get_mut(queue)
        {
            q.line.insert(priority, entry);
        }
    }

    /// Takes job `idx` out of its queue's line, if it is listed: call it
    /// before anything the entry copies changes.
    pub(crate) fn unlist(&mut self, idx: JobIdx) {
        if let Some((queue, priority, entry)) = self.line_entry(idx)
            && let Some(q) = self.queues.get_mut(queue)
        {
            q.line.remove(priority, &entry);
        }
    }

    /// Whether `node` admits jobs of interned node filter `filter`. The
    /// empty filter (interned first, the one most jobs have) admits the
    /// nodes without extra taints: no lookup, and this runs for every node
    /// a placement, reservation or victim search looks at.
    pub(crate) fn admits(&self, node: &Node, filter: u32) -> bool {
        if filter == 0 {
            return node.extra_taints.is_empty();
        }
        self.filters
            .get(filter as usize)
            .is_some_and(|f| Inventory::node_admits(node, f))
    }

    pub(crate) fn intern_filter(&mut self, filter: NodeFilter) -> u32 {
        if let Some(id) = self.filter_ids.get(&filter) {
            return *id;
        }
        let id = u32::try_from(self.filters.len()).unwrap_or(u32::MAX);
        self.filters.push(filter.clone());
        self.filter_ids.insert(filter, id);
        id
    }

    pub(crate) fn filter_for(&mut self, spec: &JobSpec) -> u32 {
        let mut tolerations = spec.tolerations.clone();
        tolerations.sort();
        self.intern_filter(NodeFilter {
            node_selector: spec.node_selector.clone(),
            tolerations,
            min_gpu_memory_mib: spec.min_gpu_memory_mib,
            node_affinity: spec.node_affinity.clone(),
        })
    }

    /// Whether a job with this uid is pending or running.
    pub fn contains_job(&self, uid: &JobUid) -> bool {
        self.job_by_uid.contains_key(uid)
    }

    /// The admission of a running job.
    pub fn admission(&self, uid: &JobUid) -> Option<&Admission> {
        let idx = self.job_by_uid.get(uid)?;
        self.job(*idx)?.running().map(|r| &r.admission)
    }

    /// Whether a job is pending (known and not admitted).
    pub fn is_pending(&self, uid: &JobUid) -> bool {
        self.job_by_uid
            .get(uid)
            .and_then(|i| self.job(*i))
            .is_some_and(|j| matches!(j.state, JobState::Pending(_)))
    }

    /// Cluster-level counters (whole GPUs only).
    pub fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats::default();
        for node in self.inv.nodes.iter().flatten() {
            stats.nodes += 1;
            for pool in &node.pools {
                if self.inv.kind_of_res(pool.res) == Some(&ResourceKind::Gpu) {
                    stats.gpu_capacity += u64::from(pool.capacity);
                    stats.gpus_allocated += u64::from(pool.used.min(pool.capacity));
                }
            }
        }
        for job in self.jobs.iter().flatten() {
            match job.state {
                JobState::Pending(_) => stats.pending_jobs += 1,
                JobState::Running(_) => stats.running_jobs += 1,
            }
        }
        stats
    }

    // ----------------------------------------------------------------- events

    /// Applies one event. A rejected event leaves the state unchanged.
    pub fn apply(&mut self, event: Event) -> Result<Applied, AllocatorError> {
        match event {
            Event::NodeUpserted(info) => self.upsert_node(info),
            Event::NodeRemoved { name } => Ok(self.remove_node(&name)),
            Event::QueueUpserted(spec) => self.upsert_queue(spec),
            Event::QueueRemoved { name } => Ok(if self.queues.remove(&name) {
                Applied::Changed
            } else {
                Applied::Unchanged
            }),
            Event::JobSubmitted(spec) => self.submit(spec),
            Event::JobFinished { uid } | Event::JobRemoved { uid } => Ok(self.finish(&uid)),
            Event::JobCheckpointed { uid } => Ok(self.checkpointed(&uid)),
            Event::Admitted(admission) => self.replay_admission(&admission),
            Event::PreemptionStarted(preemption) => self.replay_preemption(&preemption),
            Event::DrainStarted(drain) => Ok(self.replay_drain(&drain)),
            Event::Evicted(eviction) => Ok(self.replay_eviction(&eviction)),
        }
    }

    pub(crate) fn upsert_node(&mut self, info: NodeInfo) -> Result<Applied, AllocatorError> {
        if let Some(idx) = self.inv.node_by_name(&info.name)
            && self.inv.node(idx).is_some_and(|n| n.info == info)
        {
            return Ok(Applied::Unchanged);
        }
        self.inv.upsert_node(info)?;
        Ok(Applied::Changed)
    }

    /// `jobs` in arrival order, not slot order: a restore renumbers the
    /// slots, and the restored allocator must decide exactly alike.
    pub(crate) fn by_arrival(&self, jobs: impl IntoIterator<Item = JobIdx>) -> Vec<JobIdx> {
        let mut keyed: Vec<(u64, JobIdx)> = jobs
            .into_iter()
            .filter_map(|idx| Some((self.job(idx)?.seq, idx)))
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, idx)| idx).collect()
    }

    pub(crate) fn remove_node(&mut self, name: &str) -> Applied {
        let Some(running) = self.inv.remove_node(name) else {
            return Applied::Unchanged;
        };
        for job in self.by_arrival(running) {
            let uid = match self.job(job) {
                Some(j) => j.spec.uid.clone(),
                None => continue,
            };
            self.requeue(job, None);
            self.undelivered_evictions.push(Eviction {
                uid,
                reason: EvictionReason::NodeLost {
                    node: name.to_string(),
                },
                at: self.clock,
            });
        }
        Applied::Changed
    }

    pub(crate) fn upsert_queue(&mut self, spec: QueueSpec) -> Result<Applied, AllocatorError> {
        spec.validate()?;
        if let Some(idx) = self.queues.by_name(&spec.name)
            && self.queues.get(idx).and_then(|q| q.spec.as_ref()) == Some(&spec)
        {
            return Ok(Applied::Unchanged);
        }
        let mut slots = Vec::new();
        for fq in &spec.quotas {
            let flavor = self.inv.intern_flavor(&fq.flavor);
            for rq in &fq.resources {
                let Some(kind) = ResourceKind::from_quota_name(&rq.resource) else {
                    continue;
                };
                let class = match kind {
                    ResourceKind::Gpu => SlotClass::WholeGpu,
                    ResourceKind::SharedGpu => SlotClass::SharedGpu,
                    ResourceKind::Mig(_) => SlotClass::Mig,
                };
                let kind = self.inv.intern_kind(&kind);
                let res = self.inv.intern_res(flavor, kind);
                slots.push(QuotaSlot {
                    res,
                    flavor,
                    class,
                    nominal: rq.nominal,
                    borrowing_limit: rq.borrowing_limit,
                    lending_limit: rq.lending_limit,
                });
            }
        }
        self.queues.upsert(spec, slots);
        Ok(Applied::Changed)
    }

    pub(crate) fn submit(&mut self, spec: JobSpec) -> Result<Applied, AllocatorError> {
        spec.validate()?;
        if self.tombstones.contains_key(&spec.uid) {
            return Ok(Applied::Unchanged);
        }
        let queue_name = spec
            .queue
            .clone()
            .unwrap_or_else(|| self.config.default_queue.clone());
        if let Some(idx) = self.job_by_uid.get(&spec.uid).copied() {
            // A re-delivery, or an edit while pending: only a pending job
            // that is not mid-preemption may change.
            let Some(job) = self.job(idx) else {
                return Ok(Applied::Unchanged);
            };
            if job.spec == spec || !matches!(job.state, JobState::Pending(None)) {
                return Ok(Applied::Unchanged);
            }
            let queue = self.queues.intern(&queue_name);
            let filter = self.filter_for(&spec);
            self.unlist(idx);
            if let Some(job) = self.job_mut(idx) {
                job.spec = spec;
                job.queue = queue;
                job.filter = filter;
            }
            self.list(idx);
            return Ok(Applied::Changed);
        }
        let queue = self.queues.intern(&queue_name);
        let filter = self.filter_for(&spec);
        let uid = spec.uid.clone();
        let preempted_by = spec.last_preemptor.clone();
        let seq = self.next_seq;
        self.next_seq += 1;
        let job = Job {
            seq,
            preemption_retry_after: Timestamp(0),
            preemption_failures: 0,
            spec,
            queue,
            filter,
            state: JobState::Pending(None),
            requeues: 0,
            preempted_by,
        };
        let idx = match self.free_job_slots.pop() {
            Some(idx) => {
                if let Some(slot) = self.jobs.get_mut(idx as usize) {
                    *slot = Some(job);
                }
                idx
            }
            None => {
                self.jobs.push(Some(job));
                u32::try_from(self.jobs.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.job_by_uid.insert(uid, idx);
        self.list(idx);
        Ok(Applied::Changed)
    }

    pub(crate) fn tombstone(&mut self, uid: JobUid) {
        if self.tombstones.insert(uid.clone(), self.clock).is_none() {
            self.tombstone_order.push_back((self.clock, uid));
        }
    }

    pub(crate) fn finish(&mut self, uid: &JobUid) -> Applied {
        let Some(idx) = self.job_by_uid.get(uid).copied() else {
            if self.tombstones.contains_key(uid) {
                return Applied::Unchanged;
            }
            // Finished before we saw it submitted (out-of-order delivery):
            // remember it so the late submission is ignored.
            self.tombstone(uid.clone());
            return Applied::Changed;
        };
        self.release(idx);
        self.unlist(idx);
        if let Some(slot) = self.jobs.get_mut(idx as usize) {
            *slot = None;
        }
        if self.nominated.remove(&idx) {
            // Its victims were only asked to checkpoint; nobody needs their
            // GPUs any more, so they keep running.
            let victims: Vec<JobIdx> = self.preempting.iter().copied().collect();
            for v in victims {
                let spared = self.update_preempting(v, |p| {
                    let by_it = p.as_ref().is_some_and(|p| p.by.as_ref() == Some(uid));
                    if by_it {
                        *p = None;
                    }
                    by_it
                });
                if spared == Some(true) {
                    self.preempting.remove(&v);
                }
            }
        }
        self.job_by_uid.remove(uid);
        self.free_job_slots.push(idx);
        self.tombstone(uid.clone());
        Applied::Changed
    }

    /// Removes a job like `JobRemoved` but without remembering its uid, so
    /// the same uid may be submitted again later (a job suspended while it
    /// was still pending, then resumed as the same attempt). Additive helper
    /// for the service adapter; not an [`Event`], so it is not replayable.
    pub fn withdraw(&mut self, uid: &JobUid) -> Applied {
        if !self.job_by_uid.contains_key(uid) {
            return Applied::Unchanged;
        }
        self.finish(uid);
        if self.tombstones.remove(uid).is_some() {
            self.tombstone_order.retain(|(_, u)| u != uid);
        }
        Applied::Changed
    }

    pub(crate) fn checkpointed(&mut self, uid: &JobUid) -> Applied {
        let Some(idx) = self.job_by_uid.get(uid).copied() else {
            return Applied::Unchanged;
        };
        let reported = self.update_preempting(idx, |p| match p {
            Some(p) if !p.checkpointed => {
                p.checkpointed = true;
                true
            }
            _ => false,
        });
        if reported == Some(true) {
            Applied::Changed
        } else {
            Applied::Unchanged
        }
    }

    /// Frees a running job's units (no-op for pending jobs).
    pub(crate) fn release(&mut self, idx: JobIdx) {
        self.book_releases(idx, Booking::Remove);
        let Some(job) = self.job(idx) else { return };
        let Some(run) = job.running() else { return };
        let res = run.res;
        let per_worker = run.per_worker;
        let placement = run.placement.clone();
        let queue = job.queue;
        let cpu_memory = job.spec.cpu_memory_per_worker;
        let mut total: u64 = 0;
        for (node, workers) in &placement {
            let units = u64::from(workers.saturating_mul(per_worker));
            total += units;
            self.inv.adjust(*node, res, -units_i64(units));
            self.inv
                .adjust_cpu_memory(*node, cpu_memory.times(*workers), false);
            if let Some(n) = self.inv.node_mut(*node) {
                n.running.remove(&idx);
            }
        }
        if let Some(running) = self.running_by_queue.get_mut(&(queue, res))
            && let Some(at) = running.iter().position(|j| *j == idx)
        {
            running.swap_remove(at);
        }
        self.queues.add_usage(queue, res, -units_i64(total));
        self.preempting.remove(&idx);
    }

    /// Stops a running job and puts it back in its queue.
    pub(crate) fn requeue(&mut self, idx: JobIdx, preempted_by: Option<JobUid>) {
        self.release(idx);
        let Some(job) = self.job_mut(idx) else { return };
        job.state = JobState::Pending(None);
        job.requeues = job.requeues.saturating_add(1);
        if preempted_by.is_some() {
            job.preempted_by = preempted_by;
        }
        self.list(idx);
    }

    /// Takes units on nodes and marks the job running.
    pub(crate) fn commit(
        &mut self,
        idx: JobIdx,
        res: ResIdx,
        per_worker: u32,
        placement: Vec<(NodeIdx, u32)>,
        admission: Admission,
    ) {
        let Some(job) = self.job(idx) else { return };
        let queue = job.queue;
        let cpu_memory = job.spec.cpu_memory_per_worker;
        let mut total: u64 = 0;
        for (node, workers) in &placement {
            let units = u64::from(workers.saturating_mul(per_worker));
            total += units;
            self.inv.adjust(*node, res, units_i64(units));
            self.inv
                .adjust_cpu_memory(*node, cpu_memory.times(*workers), true);
            if let Some(n) = self.inv.node_mut(*node) {
                n.running.insert(idx);
            }
        }
        self.running_by_queue
            .entry((queue, res))
            .or_default()
            .push(idx);
        self.queues.add_usage(queue, res, units_i64(total));
        self.unlist(idx);
        self.nominated.remove(&idx);
        let cycle = self.cycles;
        if let Some(job) = self.job_mut(idx) {
            job.state = JobState::Running(Box::new(Running {
                res,
                per_worker,
                placement,
                admitted_at: admission.admitted_at,
                cycle,
                admission,
                preempting: None,
            }));
        }
        self.book_releases(idx, Booking::Add);
    }

    pub(crate) fn replay_admission(&mut self, adm: &Admission) -> Result<Applied, AllocatorError> {
        const EVENT: &str = "Admitted";
        let Some(idx) = self.job_by_uid.get(&adm.uid).copied() else {
            if self.tombstones.contains_key(&adm.uid) {
                return Ok(Applied::Unchanged);
            }
            return Err(AllocatorError::UnknownJob {
                uid: adm.uid.clone(),
                event: EVENT,
            });
        };
        let Some(job) = self.job(idx) else {
            return Ok(Applied::Unchanged);
        };
        if job.running().is_some() {
            return Ok(Applied::Unchanged);
        }
        let inconsistent = |reason: String| AllocatorError::InconsistentDecision {
            uid: adm.uid.clone(),
            event: EVENT,
            reason,
        };
        let kind = ResourceKind::from_quota_name(&adm.resource)
            .ok_or_else(|| inconsistent(format!("unknown resource {}", adm.resource)))?;
        if adm.units_per_worker == 0 || adm.workers.is_empty() {
            return Err(inconsistent("no workers or zero units per worker".into()));
        }
        let mut placement: Vec<(NodeIdx, u32)> = Vec::new();
        for w in &adm.workers {
            let node =
                self.inv
                    .node_by_name(&w.node)
                    .ok_or_else(|| AllocatorError::UnknownNode {
                        uid: adm.uid.clone(),
                        node: w.node.clone(),
                        event: EVENT,
                    })?;
            match placement.iter_mut().find(|(n, _)| *n == node) {
                Some(entry) => entry.1 += 1,
                None => placement.push((node, 1)),
            }
        }
        let flavor = self.inv.intern_flavor(&adm.flavor);
        let kind = self.inv.intern_kind(&kind);
        let res = self.inv.intern_res(flavor, kind);
        self.commit(idx, res, adm.units_per_worker, placement, adm.clone());
        Ok(Applied::Changed)
    }

    pub(crate) fn replay_preemption(&mut self, p: &Preemption) -> Result<Applied, AllocatorError> {
        const EVENT: &str = "PreemptionStarted";
        let mut changed = self.start_preempting(&p.victims, Some(&p.preemptor), p.evict_at);
        let Some(idx) = self.job_by_uid.get(&p.preemptor).copied() else {
            if self.tombstones.contains_key(&p.preemptor) {
                return Ok(if changed {
                    Applied::Changed
                } else {
                    Applied::Unchanged
                });
            }
            return Err(AllocatorError::UnknownJob {
                uid: p.preemptor.clone(),
                event: EVENT,
            });
        };
        if let Some(job) = self.job_mut(idx)
            && let JobState::Pending(nomination) = &mut job.state
            && nomination.is_none()
        {
            *nomination = Some(Box::new(Nomination {
                victims: p.victims.iter().map(|v| v.uid.clone()).collect(),
                evict_at: p.evict_at,
                flavor: p.flavor.clone(),
                resource: p.resource.clone(),
                nodes: p.planned_nodes.clone(),
            }));
            self.nominated.insert(idx);
            changed = true;
        }
        Ok(if changed {
            Applied::Changed
        } else {
            Applied::Unchanged
        })
    }

    /// Marks `victims` still running and not yet told as preempted by
    /// `by` (none: their queue drains) until `evict_at`; whether any was.
    pub(crate) fn start_preempting(
        &mut self,
        victims: &[Victim],
        by: Option<&JobUid>,
        evict_at: Timestamp,
    ) -> bool {
        let mut changed = false;
        for v in victims {
            let Some(idx) = self.job_by_uid.get(&v.uid).copied() else {
                continue; // already finished: nothing to evict
            };
            let started = self.update_preempting(idx, |preempting| {
                let free = preempting.is_none();
                if free {
                    *preempting = Some(PreemptingState {
                        by: by.cloned(),
                        rule: v.rule,
                        evict_at,
                        checkpointed: false,
                    });
                }
                free
            });
            if started == Some(true) {
                self.preempting.insert(idx);
                changed = true;
            }
        }
        changed
    }

    pub(crate) fn replay_drain(&mut self, d: &Drain) -> Applied {
        if self.start_preempting(&d.victims, None, d.evict_at) {
            Applied::Changed
        } else {
            Applied::Unchanged
        }
    }

    pub(crate) fn replay_eviction(&mut self, e: &Eviction) -> Applied {
        let Some(idx) = self.job_by_uid.get(&e.uid).copied() else {
            return Applied::Unchanged;
        };
        if self.job(idx).and_then(Job::running).is_none() {
            return Applied::Unchanged;
        }
        let by = match &e.reason {
            EvictionReason::Preempted { by } => Some(by.clone()),
            EvictionReason::Drained { .. } | EvictionReason::NodeLost { .. } => None,
        };
        self.requeue(idx, by);
        Applied::Changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NodeInfo;
    use crate::types::{Taint, TaintEffect, Toleration};

    #[test]
    fn what_an_evaluation_reads_of_a_job_fits_in_two_cache_lines() {
        use std::mem::{offset_of, size_of};
        // The job's state, queue, filter and arrival, then the spec's
        // scalars and MIG request, in one stretch at the front.
        let spec = offset_of!(Job, spec);
        let hot_end = spec
            + offset_of!(JobSpec, gpu_slice)
            + size_of::<Option<crate::types::GpuSliceRequest>>();
        assert!(hot_end <= 128, "hot fields end at byte {hot_end}");
        for offset in [
            offset_of!(Job, state),
            offset_of!(Job, queue),
            offset_of!(Job, filter),
            offset_of!(Job, seq),
            spec + offset_of!(JobSpec, submitted_at),
            spec + offset_of!(JobSpec, runtime_estimate_secs),
            spec + offset_of!(JobSpec, priority),
            spec + offset_of!(JobSpec, num_workers),
            spec + offset_of!(JobSpec, gpus_per_worker),
            spec + offset_of!(JobSpec, allow_gpu_sharing),
            spec + offset_of!(JobSpec, preemptible),
            spec + offset_of!(JobSpec, topology),
        ] {
            assert!(offset < hot_end, "a hot field at byte {offset}");
        }
        // The names come after.
        assert!(spec + offset_of!(JobSpec, uid) >= hot_end);
        assert!(spec + offset_of!(JobSpec, name) >= hot_end);
    }

    #[test]
    fn the_empty_filter_admits_exactly_the_nodes_without_extra_taints() {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("default config");
        let mut plain = NodeInfo {
            name: "plain".into(),
            ready: true,
            ..NodeInfo::default()
        };
        plain
            .allocatable
            .insert("nvidia.com/gpu".into(), "8".into());
        let mut tainted = plain.clone();
        tainted.name = "tainted".into();
        tainted.taints.push(Taint {
            key: "dedicated".into(),
            value: "research".into(),
            effect: TaintEffect::NoSchedule,
        });
        for info in [plain, tainted] {
            alloc
                .apply(Event::NodeUpserted(info))
                .expect("node accepted");
        }
        let tolerating = alloc.intern_filter(NodeFilter {
            tolerations: vec![Toleration::equal(
                "dedicated",
                "research",
                TaintEffect::NoSchedule,
            )],
            ..NodeFilter::default()
        });
        let node = |name: &str| {
            alloc
                .inv
                .node_by_name(name)
                .and_then(|idx| alloc.inv.node(idx))
                .expect("node listed")
        };
        for name in ["plain", "tainted"] {
            let n = node(name);
            assert_eq!(
                alloc.admits(n, 0),
                Inventory::node_admits(n, &NodeFilter::default()),
                "{name}"
            );
            assert!(alloc.admits(n, tolerating), "{name}");
        }
        assert!(alloc.admits(node("plain"), 0));
        assert!(!alloc.admits(node("tainted"), 0));
    }
}
