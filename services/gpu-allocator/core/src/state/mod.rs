//! The allocator's state: what every decision reads, and nothing that
//! decides. Nodes and their free units (`inventory`), TrainingQueues and
//! their quota and usage (`queues`), each queue's pending jobs in line
//! order (`line`), the job arena (`jobs`), the running jobs' expected
//! releases (`releases`). `apply` is the one place events change it;
//! between events only the cycle changes it, through the primitives here
//! (`commit`, `release`, `requeue`, `start_preempting`, `end_nomination`).
//!
//! No module under `state/` imports a policy pass or the speed layer (the
//! test `tests/layers.rs` checks it).

pub(crate) mod apply;
pub(crate) mod inventory;
pub(crate) mod jobs;
pub(crate) mod line;
pub(crate) mod queues;
pub(crate) mod releases;

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::config::AllocatorConfig;
use crate::decision::{Admission, Eviction, Victim};
use crate::event::JobSpec;
use crate::ids::{FastMap, FilterIdx, JobIdx, NodeIdx, QueueIdx, ResourceIdx, units_i64};
use crate::state::inventory::{Inventory, Node, NodeFilter};
use crate::state::jobs::{Job, JobState, PreemptingState, Running};
use crate::state::line::LineEntry;
use crate::state::queues::Queues;
use crate::state::releases::{Booking, ReleaseBook};
use crate::types::{JobUid, Timestamp};

/// Nodes, queues and jobs.
pub(crate) struct State {
    pub(crate) config: AllocatorConfig,
    pub(crate) inv: Inventory,
    pub(crate) queues: Queues,
    /// The job arena: a job's slot (`JobIdx`) is reused after it leaves.
    pub(crate) jobs: Vec<Option<Job>>,
    pub(crate) job_by_uid: FastMap<JobUid, JobIdx>,
    pub(crate) free_job_slots: Vec<JobIdx>,
    /// Interned node filters (a job's selector, affinity, tolerations):
    /// filter 0 is "no constraints".
    pub(crate) filters: Vec<NodeFilter>,
    pub(crate) filter_ids: HashMap<NodeFilter, FilterIdx>,
    /// Running jobs told they are preempted, waiting for their eviction.
    pub(crate) preempting: BTreeSet<JobIdx>,
    /// Pending jobs with a nomination (waiting for their victims).
    pub(crate) nominated: BTreeSet<JobIdx>,
    /// Uids of jobs gone, so a replayed submission is ignored.
    pub(crate) tombstones: HashMap<JobUid, Timestamp>,
    pub(crate) tombstone_order: VecDeque<(Timestamp, JobUid)>,
    /// Evictions made between cycles (a node removed), handed to the next.
    pub(crate) undelivered_evictions: Vec<Eviction>,
    pub(crate) clock: Timestamp,
    /// Cycles run, this one included while it runs.
    pub(crate) cycles: u64,
    pub(crate) next_seq: u64,
    /// Jobs that held a reservation at the end of the last cycle.
    pub(crate) reserved_jobs: Vec<JobUid>,
    /// Expected releases of the running jobs, per resource.
    pub(crate) releases: FastMap<ResourceIdx, ReleaseBook>,
    /// Running jobs per (queue, resource), in no particular order: a victim
    /// search lists only the queues it may take from.
    pub(crate) running_by_queue: FastMap<(QueueIdx, ResourceIdx), Vec<JobIdx>>,
    /// CPU-only jobs waiting for their queue, by (arrival, slot): they take
    /// no GPU, so they stand in no queue's line.
    pub(crate) cpu_only_waiting: BTreeSet<(u64, JobIdx)>,
}

impl State {
    /// An empty state under `config` (validated by the caller).
    pub(crate) fn new(config: AllocatorConfig) -> Self {
        let inv = Inventory::new(&config);
        let mut state = State {
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
            cpu_only_waiting: BTreeSet::new(),
        };
        // Filter 0 is "no constraints", the common case checked fastest.
        state.intern_filter(NodeFilter::default());
        state
    }

    pub(crate) fn job(&self, idx: JobIdx) -> Option<&Job> {
        self.jobs.get(idx.slot()).and_then(Option::as_ref)
    }

    /// Job `idx`'s uid, for a reason that names it.
    pub(crate) fn job_uid(&self, idx: JobIdx) -> Option<JobUid> {
        self.job(idx).map(|j| j.spec.uid.clone())
    }

    pub(crate) fn job_mut(&mut self, idx: JobIdx) -> Option<&mut Job> {
        self.jobs.get_mut(idx.slot()).and_then(Option::as_mut)
    }

    /// Job `idx`'s queue, base priority and line entry, as its spec and
    /// arrival say now.
    fn line_entry(&self, idx: JobIdx) -> Option<(QueueIdx, i32, LineEntry)> {
        let job = self.job(idx)?;
        Some((job.queue, job.spec.priority, LineEntry::of(idx, job)))
    }

    /// Puts job `idx` in its queue's line.
    pub(crate) fn list(&mut self, idx: JobIdx) {
        if let Some(job) = self.job(idx)
            && job.spec.is_cpu_only()
        {
            self.cpu_only_waiting.insert((job.seq, idx));
            return;
        }
        if let Some((queue, priority, entry)) = self.line_entry(idx)
            && let Some(q) = self.queues.get_mut(queue)
        {
            q.line.insert(priority, entry);
        }
    }

    /// Takes job `idx` out of its queue's line, if it is listed: call it
    /// before anything the entry copies changes.
    pub(crate) fn unlist(&mut self, idx: JobIdx) {
        if let Some(job) = self.job(idx)
            && job.spec.is_cpu_only()
        {
            self.cpu_only_waiting.remove(&(job.seq, idx));
            return;
        }
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
    pub(crate) fn admits(&self, node: &Node, filter: FilterIdx) -> bool {
        if filter == FilterIdx::ANY_NODE {
            return node.extra_taints.is_empty();
        }
        self.filters
            .get(filter.slot())
            .is_some_and(|f| Inventory::node_admits(node, f))
    }

    pub(crate) fn intern_filter(&mut self, filter: NodeFilter) -> FilterIdx {
        if let Some(id) = self.filter_ids.get(&filter) {
            return *id;
        }
        let id = FilterIdx::from_slot(self.filters.len());
        self.filters.push(filter.clone());
        self.filter_ids.insert(filter, id);
        id
    }

    pub(crate) fn filter_for(&mut self, spec: &JobSpec) -> FilterIdx {
        let mut tolerations = spec.tolerations.clone();
        tolerations.sort();
        self.intern_filter(NodeFilter {
            node_selector: spec.node_selector.clone(),
            tolerations,
            min_gpu_memory_mib: spec.min_gpu_memory_mib,
            node_affinity: spec.node_affinity.clone(),
        })
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

    pub(crate) fn tombstone(&mut self, uid: JobUid) {
        if self.tombstones.insert(uid.clone(), self.clock).is_none() {
            self.tombstone_order.push_back((self.clock, uid));
        }
    }

    /// Forgets the uids of jobs gone longer than the retention ago.
    pub(crate) fn prune_tombstones(&mut self, now: Timestamp) {
        let retention = self.config.tombstone_retention_secs;
        while let Some((at, _)) = self.tombstone_order.front() {
            if now.secs_since(*at) <= retention {
                break;
            }
            if let Some((_, uid)) = self.tombstone_order.pop_front() {
                self.tombstones.remove(&uid);
            }
        }
    }

    /// Ends a pending job's nomination: it competes like any other job.
    pub(crate) fn end_nomination(&mut self, idx: JobIdx) {
        if let Some(job) = self.job_mut(idx) {
            job.state = JobState::Pending(None);
        }
        self.nominated.remove(&idx);
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
        res: ResourceIdx,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, NodeInfo};
    use crate::types::{Taint, TaintEffect, Toleration};

    #[test]
    fn the_empty_filter_admits_exactly_the_nodes_without_extra_taints() {
        let mut state = State::new(AllocatorConfig::default());
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
            state
                .apply(Event::NodeUpserted(info))
                .expect("node accepted");
        }
        let tolerating = state.intern_filter(NodeFilter {
            tolerations: vec![Toleration::equal(
                "dedicated",
                "research",
                TaintEffect::NoSchedule,
            )],
            ..NodeFilter::default()
        });
        let node = |name: &str| {
            state
                .inv
                .node_by_name(name)
                .and_then(|idx| state.inv.node(idx))
                .expect("node listed")
        };
        for name in ["plain", "tainted"] {
            let n = node(name);
            assert_eq!(
                state.admits(n, FilterIdx::from(0)),
                Inventory::node_admits(n, &NodeFilter::default()),
                "{name}"
            );
            assert!(state.admits(n, tolerating), "{name}");
        }
        assert!(state.admits(node("plain"), FilterIdx::from(0)));
        assert!(!state.admits(node("tainted"), FilterIdx::from(0)));
    }
}
