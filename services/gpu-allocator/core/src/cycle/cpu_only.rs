//! CPU-only admission: a job that asks for no GPU (`gpusPerWorker: 0`)
//! takes no quota and no node, so it is admitted as soon as its queue admits
//! it (known, not on hold, open to its namespace), in arrival order, and
//! otherwise waits with that reason after the queue's GPU jobs. Its
//! admission names the flavor `CPU_ONLY_FLAVOR` and no workers: the
//! scheduler places its pods. Once admitted it leaves the allocator, its uid
//! remembered like a finished job's, so a replay of its submission or of
//! its admission changes nothing.

use crate::cycle::{CycleCtx, Decision, Pass, Policy};
use crate::decision::{Admission, TopologyAssignment};
use crate::ids::JobIdx;
use crate::pending::Pending;
use crate::state::jobs::Job;
use crate::types::{Timestamp, names};

/// The waiting CPU-only jobs, in arrival order: each admitted if its queue
/// admits it, else listed as waiting.
pub(crate) struct CpuOnly {
    waiting: std::vec::IntoIter<JobIdx>,
}

impl CpuOnly {
    pub(crate) fn new(policy: Policy<'_>) -> Self {
        let waiting: Vec<JobIdx> = policy
            .state
            .cpu_only_waiting
            .iter()
            .map(|(_, idx)| *idx)
            .collect();
        CpuOnly {
            waiting: waiting.into_iter(),
        }
    }
}

impl Pass for CpuOnly {
    fn next(&mut self, policy: Policy<'_>, now: Timestamp, ctx: &mut CycleCtx) -> Option<Decision> {
        for idx in self.waiting.by_ref() {
            let Some(job) = policy.state.job(idx) else {
                continue;
            };
            let Some(reason) = policy.queue_refusal(job, ctx) else {
                return Some(Decision::AdmitCpuOnly(Box::new(
                    policy.cpu_only_admission(job, now),
                )));
            };
            if let Some(position) = ctx.positions.next(job.queue) {
                let entry = Pending {
                    job: idx,
                    seq: job.seq,
                    queue: job.queue,
                    position,
                    queue_length: 0,
                    effective_priority: policy.effective_priority(job, now),
                    reason,
                };
                // No victim frees a queue's hold or opens it to a namespace.
                ctx.wait(entry, false);
            }
        }
        None
    }
}

impl Policy<'_> {
    /// CPU-only `job`'s admission at `now`: no flavor of GPUs, no workers.
    pub(crate) fn cpu_only_admission(&self, job: &Job, now: Timestamp) -> Admission {
        let spec = &job.spec;
        Admission {
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            queue: self.state.queues.name_of(job.queue),
            flavor: names::CPU_ONLY_FLAVOR.to_string(),
            resource: String::new(),
            units_per_worker: 0,
            capacity_type: None,
            workers: Vec::new(),
            tolerations: Vec::new(),
            topology: TopologyAssignment::default(),
            admitted_at: now,
            borrowing: false,
            backfilled_ahead_of: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::Allocator;
    use crate::config::AllocatorConfig;
    use crate::cycle::queue_position::QueuePositions;
    use crate::cycle::reservation::tests::queue;
    use crate::event::{Event, JobSpec};
    use crate::types::JobUid;

    fn cpu_job(uid: &str, queue: &str) -> Event {
        Event::JobSubmitted(JobSpec {
            uid: JobUid::new(uid),
            queue: Some(queue.into()),
            num_workers: 2,
            gpus_per_worker: 0,
            ..JobSpec::default()
        })
    }

    #[test]
    fn a_cpu_only_job_is_admitted_when_its_queue_admits_it_and_waits_otherwise() {
        let mut alloc = Allocator::new(AllocatorConfig::default()).expect("valid config");
        let Event::QueueUpserted(mut held) = queue("held") else {
            unreachable!("a queue event")
        };
        held.on_hold = true;
        for event in [
            queue("open"),
            Event::QueueUpserted(held),
            cpu_job("waits", "held"),
            cpu_job("goes", "open"),
        ] {
            alloc.apply(event).expect("accepted");
        }
        let policy = alloc.policy();
        let now = Timestamp(5);
        let mut ctx = CycleCtx {
            positions: QueuePositions::new(2),
            ..CycleCtx::default()
        };
        let mut pass = CpuOnly::new(policy);
        let Some(Decision::AdmitCpuOnly(admission)) = pass.next(policy, now, &mut ctx) else {
            panic!("the job of the open queue is admitted");
        };
        assert_eq!(admission.uid, JobUid::new("goes"));
        assert_eq!(admission.queue, "open");
        assert_eq!(admission.flavor, names::CPU_ONLY_FLAVOR);
        assert!(
            admission.workers.is_empty(),
            "the scheduler places its pods"
        );
        assert_eq!(admission.admitted_at, now);
        assert!(pass.next(policy, now, &mut ctx).is_none());
        let [entry] = ctx.pending.as_slice() else {
            panic!("one job waits: {}", ctx.pending.len());
        };
        assert_eq!(policy.state.job_uid(entry.job), Some(JobUid::new("waits")));
        assert_eq!(entry.position, 1);
        assert!(ctx.may_preempt.is_empty(), "no victim frees a queue's hold");
        assert_eq!(
            alloc.state.cpu_only_waiting.len(),
            2,
            "deciding admits nobody: the cycle applies the admission"
        );
    }
}
