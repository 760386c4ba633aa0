//! CPU-only admission: a job that asks for no GPU (`gpusPerWorker: 0`)
//! takes no quota and no node, so it is admitted as soon as its queue admits
//! it (known, not on hold, open to its namespace), in arrival order, and
//! otherwise waits with that reason after the queue's GPU jobs. Its
//! admission names the flavor `CPU_ONLY_FLAVOR` and no workers: the
//! scheduler places its pods. Once admitted it leaves the allocator, its uid
//! remembered like a finished job's, so a replay of its submission or of
//! its admission changes nothing.

use crate::allocator::Allocator;
use crate::cycle::CycleCtx;
use crate::decision::{Admission, CycleOutcome, TopologyAssignment};
use crate::ids::JobIdx;
use crate::pending::Pending;
use crate::types::{Timestamp, names};

impl Allocator {
    /// Admits the waiting CPU-only jobs whose queue admits them; the others
    /// get a pending entry.
    pub(crate) fn admit_cpu_only(
        &mut self,
        now: Timestamp,
        ctx: &mut CycleCtx,
        out: &mut CycleOutcome,
    ) {
        let waiting: Vec<JobIdx> = self
            .state
            .cpu_only_waiting
            .iter()
            .map(|(_, idx)| *idx)
            .collect();
        for idx in waiting {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            if let Some(reason) = self.policy().queue_refusal(job, ctx) {
                if let Some(position) = ctx.positions.next(job.queue) {
                    out.pending.push(Pending {
                        job: idx,
                        seq: job.seq,
                        queue: job.queue,
                        position,
                        queue_length: 0,
                        effective_priority: self.policy().effective_priority(job, now),
                        reason,
                    });
                }
                continue;
            }
            let spec = &job.spec;
            let admission = Admission {
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
            };
            self.state.finish(&admission.uid);
            out.admissions.push(admission);
        }
    }
}
