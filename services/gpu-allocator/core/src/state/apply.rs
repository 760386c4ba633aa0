//! Events in: the one place that changes the state between cycles. Every
//! event is idempotent by its key, and a rejected event changes nothing.

use crate::decision::{Admission, Drain, Eviction, EvictionReason, Preemption};
use crate::error::AllocatorError;
use crate::event::{Applied, Event, JobSpec, NodeInfo, QueueSpec};
use crate::ids::JobIdx;
use crate::ids::NodeIdx;
use crate::state::State;
use crate::state::jobs::{Job, JobState, Nomination};
use crate::state::queues::{QuotaSlot, SlotClass};
use crate::types::{JobUid, ResourceKind, Timestamp};

impl State {
    /// Applies one event. A rejected event leaves the state unchanged.
    pub(crate) fn apply(&mut self, event: Event) -> Result<Applied, AllocatorError> {
        match event {
            Event::NodeUpserted(info) => self.upsert_node(info),
            Event::NodeRemoved { name } => Ok(self.remove_node(&name)),
            Event::QueueUpserted(spec) => self.upsert_queue(spec),
            Event::QueueRemoved { name } => Ok(if self.queues.remove(&name) {
                Applied::Changed
            } else {
                Applied::Unchanged
            }),
            Event::QueueBudgetChanged { name, hold } => {
                let spec = self
                    .queues
                    .by_name(&name)
                    .and_then(|idx| self.queues.get(idx))
                    .and_then(|q| q.spec.clone());
                match spec {
                    Some(mut spec) if spec.budget_hold != hold => {
                        spec.budget_hold = hold;
                        self.upsert_queue(spec)
                    }
                    _ => Ok(Applied::Unchanged),
                }
            }
            Event::JobSubmitted(spec) => self.submit(spec),
            Event::JobFinished { uid } | Event::JobRemoved { uid } => Ok(self.finish(&uid)),
            Event::JobCheckpointed { uid } => Ok(self.checkpointed(&uid)),
            Event::Admitted(admission) => self.replay_admission(&admission),
            Event::PreemptionStarted(preemption) => self.replay_preemption(&preemption),
            Event::DrainStarted(drain) => Ok(self.replay_drain(&drain)),
            Event::Evicted(eviction) => Ok(self.replay_eviction(&eviction)),
        }
    }

    /// Removes a job like `JobRemoved` but without remembering its uid (see
    /// `Allocator::withdraw`).
    pub(crate) fn withdraw(&mut self, uid: &JobUid) -> Applied {
        if !self.job_by_uid.contains_key(uid) {
            return Applied::Unchanged;
        }
        self.finish(uid);
        if self.tombstones.remove(uid).is_some() {
            self.tombstone_order.retain(|(_, u)| u != uid);
        }
        Applied::Changed
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
                if let Some(slot) = self.jobs.get_mut(idx.slot()) {
                    *slot = Some(job);
                }
                idx
            }
            None => {
                self.jobs.push(Some(job));
                JobIdx::from_slot(self.jobs.len() - 1)
            }
        };
        self.job_by_uid.insert(uid, idx);
        self.list(idx);
        Ok(Applied::Changed)
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
        if let Some(slot) = self.jobs.get_mut(idx.slot()) {
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
