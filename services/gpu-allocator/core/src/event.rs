//! Inputs: the events the adapter feeds in, and the specs they carry.
//! Every event is idempotent by its key (node name, queue name, job uid), so a
//! redelivered or replayed message never changes the outcome.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
pub use trainyard_pod_policy::{PodPolicy, PodRequest, PodRequestKind};

use crate::config::AgingPolicy;
use crate::decision::{Admission, Drain, Eviction, Preemption};
use crate::error::AllocatorError;
use crate::types::{
    CpuMemory, GpuSliceRequest, JobUid, NodeKey, NodeOperator, NodeSelectorTerm, Taint, Timestamp,
    Toleration, TopologyRequirement, is_zero,
};

/// Largest gang the allocator accepts (the TrainingJob API allows 1-100 workers).
pub const MAX_WORKERS: u32 = 100;
/// Largest per-worker request; no node carries more GPUs or slices than this.
pub const MAX_UNITS_PER_WORKER: u32 = 256;

/// One input to the allocator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Event {
    /// A node was created or changed (labels, allocatable, taints, readiness).
    NodeUpserted(NodeInfo),
    /// A node was deleted; jobs with workers on it are requeued.
    NodeRemoved {
        /// Node name.
        name: String,
    },
    /// A TrainingQueue was created or changed.
    QueueUpserted(QueueSpec),
    /// A TrainingQueue was deleted; its pending jobs wait for it to come back.
    QueueRemoved {
        /// Queue name.
        name: String,
    },
    /// A TrainingQueue's budget was spent (`hold`) or is open again (`None`),
    /// as the cost-optimizer reports it. Ignored for a queue not known yet:
    /// the adapter sets the hold on the queue's spec when it arrives.
    QueueBudgetChanged {
        /// Queue name.
        name: String,
        /// The hold, while the budget is spent.
        hold: Option<BudgetHold>,
    },
    /// A TrainingJob was submitted (or re-delivered).
    JobSubmitted(JobSpec),
    /// A job completed or failed; its GPUs are free again.
    JobFinished {
        /// Job uid.
        uid: JobUid,
    },
    /// A job was deleted by its owner, whatever its state.
    JobRemoved {
        /// Job uid.
        uid: JobUid,
    },
    /// A preemption victim reports its checkpoint is written, so it can be
    /// evicted before its grace period ends.
    JobCheckpointed {
        /// Job uid.
        uid: JobUid,
    },
    /// Replay of an admission decision (or adoption of a job found running
    /// after a restart). A no-op when the job is already admitted.
    Admitted(Admission),
    /// Replay of a preemption decision. A no-op when already recorded.
    PreemptionStarted(Preemption),
    /// Replay of a drain decision. A no-op when already recorded.
    DrainStarted(Drain),
    /// Replay of an eviction decision. A no-op when already applied.
    Evicted(Eviction),
}

impl Event {
    /// Short event kind for error messages and metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::NodeUpserted(_) => "NodeUpserted",
            Event::NodeRemoved { .. } => "NodeRemoved",
            Event::QueueUpserted(_) => "QueueUpserted",
            Event::QueueRemoved { .. } => "QueueRemoved",
            Event::QueueBudgetChanged { .. } => "QueueBudgetChanged",
            Event::JobSubmitted(_) => "JobSubmitted",
            Event::JobFinished { .. } => "JobFinished",
            Event::JobRemoved { .. } => "JobRemoved",
            Event::JobCheckpointed { .. } => "JobCheckpointed",
            Event::Admitted(_) => "Admitted",
            Event::PreemptionStarted(_) => "PreemptionStarted",
            Event::DrainStarted(_) => "DrainStarted",
            Event::Evicted(_) => "Evicted",
        }
    }
}

/// What applying an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Applied {
    /// The state changed.
    Changed,
    /// The event was a duplicate or had nothing to act on.
    Unchanged,
}

/// A node as the watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `status.allocatable` quantities; only GPU resources are read and they
    /// must be plain integers, as extended resources always are.
    pub allocatable: BTreeMap<String, String>,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// Units of the `allocatable` resources that pods the allocator does not
    /// manage hold (an inference server, a notebook): not free for its jobs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub used_by_other_pods: BTreeMap<String, u32>,
    /// Allocatable CPU and memory; `None` when the node reports neither
    /// (then they do not limit placement; a part it does not report is
    /// `u64::MAX`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_memory: Option<CpuMemory>,
    /// CPU and memory that pods the allocator does not manage request here.
    #[serde(skip_serializing_if = "CpuMemory::is_zero")]
    pub cpu_memory_used_by_other_pods: CpuMemory,
}

/// A TrainingQueue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueueSpec {
    /// Queue name (cluster-scoped).
    pub name: String,
    /// Cohort whose members lend each other unused quota.
    pub cohort: Option<String>,
    /// Fair-share weight (> 0); a queue with weight 2 gets twice the borrowed share.
    pub weight: f64,
    /// Quotas per flavor, in the order flavors are tried for this queue's jobs.
    pub quotas: Vec<FlavorQuota>,
    /// Which preemptions this queue's jobs may perform.
    pub preemption: QueuePreemption,
    /// Priority aging of this queue's pending jobs; `None` = the configured
    /// [`crate::AllocatorConfig::aging`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aging: Option<AgingPolicy>,
    /// Namespaces whose jobs the queue admits; empty = every namespace.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Admits no job (TrainingQueue `stopPolicy: Hold`); admitted jobs run on.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub on_hold: bool,
    /// Also evicts its admitted jobs, each told to checkpoint first and
    /// given the grace period (`stopPolicy: HoldAndDrain`); needs `on_hold`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// The queue's budget is spent: it admits no job, as on hold, and with
    /// `drains` stops its admitted jobs as a drain does. Apart from
    /// `on_hold` and `drain`, which are the queue's `stopPolicy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_hold: Option<BudgetHold>,
    /// What its jobs' pods may ask for (TrainingQueue `spec.podPolicy`).
    #[serde(skip_serializing_if = "PodPolicy::is_default")]
    pub pod_policy: PodPolicy,
}

/// A spent budget's hold on a queue (TrainingQueue `spec.budget`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct BudgetHold {
    /// Its jobs are checkpointed and stopped too (`action:
    /// SuspendWithCheckpoint`); otherwise they run on (`Hold`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub drains: bool,
    /// The spend, e.g. `spent 1012.50 of 1000.00 USD in the Monthly period
    /// from 2026-12-01T00:00:00Z`.
    pub spend: String,
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            name: String::new(),
            cohort: None,
            weight: 1.0,
            quotas: Vec::new(),
            preemption: QueuePreemption::default(),
            aging: None,
            namespaces: Vec::new(),
            on_hold: false,
            drain: false,
            budget_hold: None,
            pod_policy: PodPolicy::default(),
        }
    }
}

impl QueueSpec {
    /// Whether the queue admits jobs of `namespace`.
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Whether the queue refuses jobs of `namespace` now: on hold, or
    /// closed to it.
    pub(crate) fn refuses(&self, namespace: &str) -> bool {
        self.held() || !self.admits_namespace(namespace)
    }

    /// Whether the queue admits `job` now: not on hold, open to its
    /// namespace, and its pod policy allows what the job's pods ask for.
    pub(crate) fn admits(&self, job: &JobSpec) -> bool {
        !self.refuses(&job.namespace) && self.pod_policy.refusal(&job.pod_requests).is_none()
    }

    /// Whether it admits no job now: its `stopPolicy`, or its budget.
    pub fn held(&self) -> bool {
        self.on_hold || self.budget_hold.is_some()
    }

    /// Whether it stops its admitted jobs now: its `stopPolicy`, or its budget.
    pub fn drains(&self) -> bool {
        self.drain || self.budget_hold.as_ref().is_some_and(|b| b.drains)
    }

    /// Whether some of the jobs in its line may not be admitted now, for
    /// the queue (on hold) or their namespace.
    pub(crate) fn refuses_some(&self) -> bool {
        self.held() || !self.namespaces.is_empty()
    }
}

/// Quota of one queue in one flavor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct FlavorQuota {
    /// Flavor name (configured or automatic).
    pub flavor: String,
    /// Per-resource limits in this flavor.
    pub resources: Vec<ResourceQuota>,
}

/// Limits of one resource (e.g. `nvidia.com/gpu`) in one flavor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceQuota {
    /// `nvidia.com/gpu`, `nvidia.com/gpu.shared` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    /// Guaranteed amount.
    pub nominal: u64,
    /// How much above nominal the queue may borrow from its cohort; `None` = no limit.
    pub borrowing_limit: Option<u64>,
    /// How much of nominal other cohort members may borrow; `None` = all of it.
    pub lending_limit: Option<u64>,
}

/// Preemption rights of a queue's jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueuePreemption {
    /// Preempt lower-priority jobs of the same queue.
    pub within_queue: bool,
    /// Reclaim nominal quota that cohort members borrowed.
    pub reclaim_within_cohort: bool,
    /// Reclaim only from jobs of lower priority than the preemptor (Kueue's
    /// `reclaimWithinCohort: LowerPriority`), not from any borrower.
    pub reclaim_lower_priority_only: bool,
    /// Preempt borrowers with a larger fair share when borrowing oneself.
    pub fair_share: bool,
}

impl Default for QueuePreemption {
    fn default() -> Self {
        QueuePreemption {
            within_queue: true,
            reclaim_within_cohort: true,
            reclaim_lower_priority_only: false,
            fair_share: true,
        }
    }
}

/// A TrainingJob as far as admission is concerned.
///
/// In this order (`repr(C)`): the fields an admission cycle reads for every
/// job it evaluates first, the names and node constraints after (see the
/// allocator's `Job`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[repr(C)]
pub struct JobSpec {
    /// `metadata.creationTimestamp`.
    pub submitted_at: Timestamp,
    /// Expected runtime; lets the job backfill ahead of reserved jobs.
    pub runtime_estimate_secs: Option<u64>,
    /// Resolved priority (from the PriorityClass); higher runs first.
    pub priority: i32,
    /// Workers in the gang (1-100).
    pub num_workers: u32,
    /// GPUs (or MIG slices, or shared replicas) per worker, all on one node.
    pub gpus_per_worker: u32,
    /// Opt in to time-sliced (shared) GPUs.
    pub allow_gpu_sharing: bool,
    /// Whether other jobs may preempt this one.
    pub preemptible: bool,
    /// Workers never share a node (the job's required pod anti-affinity
    /// keeps them on separate hosts).
    pub one_worker_per_node: bool,
    /// Topology requirement for multi-worker jobs.
    pub topology: TopologyRequirement,
    /// CPU and memory each worker requests: a worker is placed only where
    /// they are free too.
    #[serde(skip_serializing_if = "CpuMemory::is_zero")]
    pub cpu_memory_per_worker: CpuMemory,
    /// Ask for MIG slices instead of whole GPUs.
    pub gpu_slice: Option<GpuSliceRequest>,
    /// Minimum per-GPU memory (MiB), matched against `nvidia.com/gpu.memory`.
    pub min_gpu_memory_mib: Option<u64>,
    /// Restarts before this run (`status.restartCount`: the service submits
    /// every attempt as a new job). Victim searches count one restart of
    /// lost work for each, so that evictions do not strike one job again
    /// and again. Left out of the JSON when 0, as `last_preemptor` when
    /// unset: most jobs never restart, and the snapshot holds every spec.
    #[serde(skip_serializing_if = "is_zero")]
    pub earlier_restarts: u32,
    /// The job that preempted an earlier attempt of this one (its last
    /// eviction): never chosen as this job's victim, as for a job requeued
    /// here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_preemptor: Option<JobUid>,
    /// Kubernetes uid; the idempotency key.
    pub uid: JobUid,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// TrainingQueue; the configured default when absent.
    pub queue: Option<String>,
    /// The job's own `scheduling.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// The job's own `scheduling.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// The job's required node affinity (`scheduling.affinity.nodeAffinity.
    /// requiredDuringSchedulingIgnoredDuringExecution`): a node must match
    /// one of the terms; none, any node.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_affinity: Vec<NodeSelectorTerm>,
    /// What the job's pods ask for that its queue's pod policy must allow;
    /// a queue that does not allow one of them never admits the job.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pod_requests: Vec<PodRequest>,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            uid: JobUid::default(),
            namespace: String::new(),
            name: String::new(),
            queue: None,
            priority: 0,
            submitted_at: Timestamp(0),
            num_workers: 1,
            gpus_per_worker: 1,
            gpu_slice: None,
            allow_gpu_sharing: false,
            runtime_estimate_secs: None,
            min_gpu_memory_mib: None,
            earlier_restarts: 0,
            last_preemptor: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            node_affinity: Vec::new(),
            pod_requests: Vec::new(),
            topology: TopologyRequirement::Preferred,
            cpu_memory_per_worker: CpuMemory::default(),
            preemptible: true,
            one_worker_per_node: false,
        }
    }
}

fn job_error(uid: &JobUid, field: &str, reason: impl Into<String>) -> AllocatorError {
    AllocatorError::InvalidJob {
        uid: uid.0.to_string(),
        field: field.to_string(),
        reason: reason.into(),
    }
}

impl JobSpec {
    /// Rejects specs the allocator cannot reason about.
    pub fn validate(&self) -> Result<(), AllocatorError> {
        if self.uid.0.trim().is_empty() {
            return Err(job_error(&self.uid, "uid", "must not be empty"));
        }
        if self.num_workers == 0 || self.num_workers > MAX_WORKERS {
            return Err(job_error(
                &self.uid,
                "numWorkers",
                format!(
                    "must be between 1 and {MAX_WORKERS}, got {}",
                    self.num_workers
                ),
            ));
        }
        if self.gpus_per_worker > MAX_UNITS_PER_WORKER {
            return Err(job_error(
                &self.uid,
                "gpusPerWorker",
                format!(
                    "must be between 0 (CPU only) and {MAX_UNITS_PER_WORKER}, got {}",
                    self.gpus_per_worker
                ),
            ));
        }
        if self.is_cpu_only() && self.gpu_slice.is_some() {
            return Err(job_error(
                &self.uid,
                "gpusPerWorker",
                "must be at least 1 with a GPU slice request: drop gpuSlice for a CPU-only job",
            ));
        }
        if let Some(queue) = &self.queue
            && queue.trim().is_empty()
        {
            return Err(job_error(&self.uid, "queue", "must not be empty when set"));
        }
        match &self.gpu_slice {
            Some(GpuSliceRequest::Profile(p)) if p.trim().is_empty() => {
                return Err(job_error(
                    &self.uid,
                    "gpuSlice.profile",
                    "must not be empty",
                ));
            }
            Some(GpuSliceRequest::MemoryGb(0)) => {
                return Err(job_error(&self.uid, "gpuSlice.memoryGb", "must be > 0"));
            }
            _ => {}
        }
        if self.gpu_slice.is_some() && self.allow_gpu_sharing {
            return Err(job_error(
                &self.uid,
                "allowGpuSharing",
                "cannot be combined with gpuSlice (MIG slices are not time-sliced)",
            ));
        }
        if self.runtime_estimate_secs == Some(0) {
            return Err(job_error(
                &self.uid,
                "runtimeEstimateSecs",
                "must be > 0 when set",
            ));
        }
        for (i, term) in self.node_affinity.iter().enumerate() {
            for (j, r) in term.requirements.iter().enumerate() {
                let field = || format!("nodeAffinity[{i}].requirements[{j}]");
                let integer = || r.values.first().is_some_and(|v| v.parse::<i64>().is_ok());
                let problem = match (&r.key, r.operator) {
                    (NodeKey::Name, NodeOperator::In | NodeOperator::NotIn)
                        if r.values.len() != 1 =>
                    {
                        Some("on metadata.name takes exactly one value")
                    }
                    (NodeKey::Name, NodeOperator::In | NodeOperator::NotIn) => None,
                    (NodeKey::Name, _) => Some("on metadata.name must be In or NotIn"),
                    (_, NodeOperator::In | NodeOperator::NotIn) if r.values.is_empty() => {
                        Some("In and NotIn need at least one value")
                    }
                    (_, NodeOperator::Exists | NodeOperator::DoesNotExist)
                        if !r.values.is_empty() =>
                    {
                        Some("Exists and DoesNotExist take no values")
                    }
                    (_, NodeOperator::Gt | NodeOperator::Lt)
                        if r.values.len() != 1 || !integer() =>
                    {
                        Some("Gt and Lt take exactly one integer value")
                    }
                    _ => None,
                };
                if let Some(problem) = problem {
                    return Err(job_error(&self.uid, &field(), problem));
                }
            }
        }
        Ok(())
    }

    /// Total units (GPUs, slices or replicas) of the gang.
    pub fn total_units(&self) -> u64 {
        u64::from(self.num_workers) * u64::from(self.gpus_per_worker)
    }

    /// Makes this the spec of attempt `attempt` of the TrainingJob
    /// `k8s_uid`: its uid (`JobUid::for_attempt`), and the restarts before
    /// it (victim searches count them). Every field that follows from the
    /// attempt is set here.
    pub fn set_attempt(&mut self, k8s_uid: &str, attempt: u32) {
        self.uid = JobUid::for_attempt(k8s_uid, attempt);
        self.earlier_restarts = attempt;
    }

    /// Whether the job asks for no GPU (see the CPU-only pass).
    pub fn is_cpu_only(&self) -> bool {
        self.gpus_per_worker == 0
    }
}

fn queue_error(queue: &str, field: String, reason: impl Into<String>) -> AllocatorError {
    AllocatorError::InvalidQueue {
        queue: queue.to_string(),
        field,
        reason: reason.into(),
    }
}

impl QueueSpec {
    /// Rejects queues with unusable quotas.
    pub fn validate(&self) -> Result<(), AllocatorError> {
        if self.name.trim().is_empty() {
            return Err(queue_error(&self.name, "name".into(), "must not be empty"));
        }
        if !(self.weight.is_finite() && self.weight > 0.0) {
            return Err(queue_error(
                &self.name,
                "weight".into(),
                format!("must be a finite number > 0, got {}", self.weight),
            ));
        }
        if let Some(cohort) = &self.cohort
            && cohort.trim().is_empty()
        {
            return Err(queue_error(
                &self.name,
                "cohort".into(),
                "must not be empty when set",
            ));
        }
        if let Some(aging) = &self.aging
            && let Err((field, reason)) = aging.check()
        {
            return Err(queue_error(&self.name, format!("aging.{field}"), reason));
        }
        if self.drain && !self.on_hold {
            return Err(queue_error(
                &self.name,
                "drain".into(),
                "a queue drains only while on hold (set onHold too)",
            ));
        }
        let mut flavors = std::collections::BTreeSet::new();
        for (i, fq) in self.quotas.iter().enumerate() {
            if fq.flavor.trim().is_empty() {
                return Err(queue_error(
                    &self.name,
                    format!("quotas[{i}].flavor"),
                    "must not be empty",
                ));
            }
            if !flavors.insert(fq.flavor.as_str()) {
                return Err(queue_error(
                    &self.name,
                    format!("quotas[{i}].flavor"),
                    format!("flavor {} listed twice", fq.flavor),
                ));
            }
            let mut resources = std::collections::BTreeSet::new();
            for (j, rq) in fq.resources.iter().enumerate() {
                if crate::types::ResourceKind::from_quota_name(&rq.resource).is_none() {
                    return Err(queue_error(
                        &self.name,
                        format!("quotas[{i}].resources[{j}].resource"),
                        format!(
                            "unknown GPU resource {:?} (expected nvidia.com/gpu, nvidia.com/gpu.shared or nvidia.com/mig-<profile>)",
                            rq.resource
                        ),
                    ));
                }
                if !resources.insert(rq.resource.as_str()) {
                    return Err(queue_error(
                        &self.name,
                        format!("quotas[{i}].resources[{j}].resource"),
                        format!("resource {} listed twice", rq.resource),
                    ));
                }
                if let Some(lending) = rq.lending_limit
                    && lending > rq.nominal
                {
                    return Err(queue_error(
                        &self.name,
                        format!("quotas[{i}].resources[{j}].lendingLimit"),
                        format!("{lending} exceeds nominal {}", rq.nominal),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobSpec {
        JobSpec {
            uid: JobUid::new("u1"),
            num_workers: 1,
            gpus_per_worker: 1,
            ..JobSpec::default()
        }
    }

    #[test]
    fn job_validation_names_the_field() {
        assert_eq!(job().validate(), Ok(()));
        let bad = JobSpec {
            num_workers: 0,
            ..job()
        };
        match bad.validate() {
            Err(AllocatorError::InvalidJob { field, .. }) => assert_eq!(field, "numWorkers"),
            other => panic!("expected InvalidJob, got {other:?}"),
        }
        let bad = JobSpec {
            gpus_per_worker: 10_000,
            ..job()
        };
        match bad.validate() {
            Err(AllocatorError::InvalidJob { field, .. }) => assert_eq!(field, "gpusPerWorker"),
            other => panic!("expected InvalidJob, got {other:?}"),
        }
    }

    #[test]
    fn queue_validation_rejects_bad_weight_and_resources() {
        let queue = QueueSpec {
            name: "q".into(),
            weight: 1.0,
            quotas: vec![FlavorQuota {
                flavor: "a100".into(),
                resources: vec![ResourceQuota {
                    resource: "cpu".into(),
                    nominal: 4,
                    ..ResourceQuota::default()
                }],
            }],
            ..QueueSpec::default()
        };
        match queue.validate() {
            Err(AllocatorError::InvalidQueue { field, .. }) => {
                assert_eq!(field, "quotas[0].resources[0].resource")
            }
            other => panic!("expected InvalidQueue, got {other:?}"),
        }
        let zero_weight = QueueSpec {
            name: "q".into(),
            weight: 0.0,
            ..QueueSpec::default()
        };
        assert!(matches!(
            zero_weight.validate(),
            Err(AllocatorError::InvalidQueue { ref field, .. }) if field == "weight"
        ));
    }

    #[test]
    fn events_round_trip_through_json() {
        let event = Event::JobSubmitted(job());
        let text = serde_json::to_string(&event).expect("serialize");
        let back: Event = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back, event);
    }
}
