//! What each TrainingQueue holds and awaits, for its status: jobs pending and
//! admitted, units used and borrowed per resource, and its weighted share.

use crate::allocator::Allocator;
use crate::ids::{QueueIdx, ResourceIdx};

/// One queue as its status reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueUsage {
    pub name: String,
    /// Jobs waiting in its line.
    pub pending: u32,
    /// Jobs holding an admission (GPUs or MIG slices).
    pub admitted: u32,
    /// Per resource it has quota for or still uses, in flavor preference order.
    pub resources: Vec<ResourceUsage>,
    /// The largest fraction of a cohort pool it borrows, divided by its
    /// fair-share weight, as queues are ordered in a cycle (0 within nominal).
    pub weighted_share: f64,
    /// `stopPolicy: Hold`: it admits no job.
    pub on_hold: bool,
    /// `stopPolicy: HoldAndDrain`: it also stops its admitted jobs.
    pub drains: bool,
    /// Its budget is spent: it admits no job (and may stop its jobs).
    pub budget_hold: Option<crate::event::BudgetHold>,
}

/// Units of one resource (e.g. `nvidia.com/gpu`) of one flavor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUsage {
    pub flavor: String,
    /// `nvidia.com/gpu`, `nvidia.com/gpu.shared` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    /// The queue's nominal quota (0 for a resource it only still uses).
    pub nominal: u64,
    /// Units its admitted jobs hold.
    pub used: u64,
    /// Of those, units above its nominal quota, borrowed from its cohort.
    pub borrowed: u64,
}

impl Allocator {
    /// Every TrainingQueue that exists, by name. Queues jobs name that do not
    /// exist have no status to write and are left out.
    pub fn queue_usage(&self) -> Vec<QueueUsage> {
        let mut admitted = vec![0u32; self.state.queues.queues.len()];
        for ((queue, _), running) in &self.state.running_by_queue {
            if let Some(count) = admitted.get_mut(queue.slot()) {
                *count = count.saturating_add(u32::try_from(running.len()).unwrap_or(u32::MAX));
            }
        }
        let mut cpu_only_waiting = vec![0usize; self.state.queues.queues.len()];
        for (_, idx) in &self.state.cpu_only_waiting {
            if let Some(job) = self.state.job(*idx)
                && let Some(count) = cpu_only_waiting.get_mut(job.queue.slot())
            {
                *count += 1;
            }
        }
        let cpu_only_waiting =
            |queue: QueueIdx| cpu_only_waiting.get(queue.slot()).copied().unwrap_or(0);
        let mut usage: Vec<QueueUsage> = self
            .state
            .queues
            .queues
            .iter()
            .zip(admitted)
            .enumerate()
            .filter_map(|(idx, (queue, admitted))| {
                let spec = queue.spec.as_ref()?;
                let quota_resources = queue.quotas.iter().map(|slot| slot.res);
                let mut held: Vec<ResourceIdx> = queue
                    .usage
                    .iter()
                    .filter(|(res, used)| *used > 0 && queue.quota(*res).is_none())
                    .map(|(res, _)| *res)
                    .collect();
                held.sort_unstable();
                let resources = quota_resources
                    .chain(held)
                    .map(|res| {
                        let used = queue.usage(res);
                        let nominal = queue.quota(res).map_or(0, |slot| slot.nominal);
                        ResourceUsage {
                            flavor: self.state.inv.res_flavor_name(res).to_string(),
                            resource: self.state.inv.res_quota_name(res),
                            nominal,
                            used,
                            borrowed: used.saturating_sub(nominal),
                        }
                    })
                    .collect();
                let idx = QueueIdx::from_slot(idx);
                Some(QueueUsage {
                    name: queue.name.to_string(),
                    pending: u32::try_from(queue.line.len() + cpu_only_waiting(idx))
                        .unwrap_or(u32::MAX),
                    admitted,
                    resources,
                    weighted_share: self.state.queues.share(idx, &[]),
                    on_hold: spec.on_hold,
                    drains: spec.drain,
                    budget_hold: spec.budget_hold.clone(),
                })
            })
            .collect();
        usage.sort_by(|a, b| a.name.cmp(&b.name));
        usage
    }
}
