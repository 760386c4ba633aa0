//! The adapter's state: the allocator core plus what the core does not keep
//! (the last spec of every TrainingJob and its current attempt, queue
//! defaults, flavors learned from queues, which explanations were published)
//! and the outbox of decisions not yet published. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use gpu_allocator_core::{
    Admission, Allocator, AllocatorStats, Applied, CycleOutcome, CycleStats, Drain, Event,
    EvictionReason, FlavorSpec, JobSpec, JobUid, Preemption, Timestamp,
};
use serde::{Deserialize, Serialize};
use trainyard_api::{TrainingJobState, TrainingQueue};
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::{
    AdmissionDecided, PendingExplained, PreemptionDecided, QueueStatusReported,
};
use trainyard_contracts::events::{Change, NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::object_key;

use crate::config::AllocatorServiceConfig;
use crate::error::ServiceError;
use crate::mapping::{self, QueueInfo};
use crate::pending_status::{PendingStatus, cause_hash};
use crate::persisted::{PendingStatuses, PersistedState, STATE_FORMAT_VERSION};

/// Flavor name of CPU-only admissions (gpusPerWorker 0): no GPU, no placement.
pub use gpu_allocator_core::names::CPU_ONLY_FLAVOR as CPU_FLAVOR;

/// What the adapter knows of one TrainingJob.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRecord {
    /// Namespace, name and Kubernetes uid.
    pub entity: EntityRef,
    /// The attempt the allocator knows (`status.restartCount`).
    pub attempt: u32,
    /// The last spec seen, with the uid of `attempt`; a new attempt announced
    /// only by a lifecycle message is submitted from it.
    pub template: JobSpec,
    /// `spec.suspend` of the last spec seen.
    pub suspended: bool,
}

/// A decision waiting to be published (kept in the snapshot until it is).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Outgoing {
    /// `admission.decided`.
    Admission {
        id: String,
        entity: EntityRef,
        payload: AdmissionDecided,
        /// The core decision, fed back once published (none for CPU-only jobs).
        decision: Option<Admission>,
    },
    /// `preemption.decided`, one per victim.
    Preemption {
        id: String,
        entity: EntityRef,
        payload: PreemptionDecided,
        decision: Preemption,
    },
    /// `preemption.decided` with reason `drain`, one per job of a draining queue.
    Drain {
        id: String,
        entity: EntityRef,
        payload: PreemptionDecided,
        decision: Drain,
    },
    /// `admission.pending`.
    Pending {
        id: String,
        entity: EntityRef,
        payload: PendingExplained,
    },
    /// `queue.status`.
    QueueStatus {
        id: String,
        entity: EntityRef,
        payload: QueueStatusReported,
    },
}

impl Outgoing {
    /// Admissions, preemptions and drains are decisions: published only
    /// once a snapshot holds them. Pending explanations and queue reports
    /// are not.
    pub fn is_decision(&self) -> bool {
        self.status_about().is_none()
    }

    /// The job a pending explanation, or the queue a status report, is
    /// about: a newer one about it supersedes it while it is unpublished.
    /// (Queues have no namespace, so the two never meet.)
    fn status_about(&self) -> Option<&EntityRef> {
        match self {
            Outgoing::Pending { entity, .. } | Outgoing::QueueStatus { entity, .. } => Some(entity),
            Outgoing::Admission { .. } | Outgoing::Preemption { .. } | Outgoing::Drain { .. } => {
                None
            }
        }
    }

    /// The `Nats-Msg-Id`.
    pub fn id(&self) -> &str {
        match self {
            Outgoing::Admission { id, .. }
            | Outgoing::Preemption { id, .. }
            | Outgoing::Drain { id, .. }
            | Outgoing::Pending { id, .. }
            | Outgoing::QueueStatus { id, .. } => id,
        }
    }
}

/// Counters of one cycle, for metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CycleReport {
    pub admissions: usize,
    pub preempted_victims: usize,
    pub evictions_preempted: usize,
    /// Jobs of draining queues told to checkpoint, and those evicted.
    pub drained_victims: usize,
    pub evictions_drained: usize,
    pub evictions_node_lost: usize,
    pub pending: usize,
    pub explanations_published: usize,
    /// Queue status reports queued for publishing.
    pub queue_reports: usize,
    /// Pending jobs per queue.
    pub queue_depth: BTreeMap<String, u32>,
    /// Pending jobs per kind of reason (`PendingReason::kind`).
    pub pending_by_reason: BTreeMap<&'static str, u32>,
    pub core: CycleStats,
    pub totals: AllocatorStats,
}

/// The adapter state.
pub struct AllocatorState {
    config: AllocatorServiceConfig,
    alloc: Allocator,
    /// Shared, so the copy of the state made under the lock for every save
    /// clones a pointer per job rather than its names and spec.
    jobs: BTreeMap<String, Arc<JobRecord>>,
    by_uid: HashMap<String, String>,
    queues: BTreeMap<String, QueueInfo>,
    learned_flavors: BTreeMap<String, FlavorSpec>,
    /// Looked up for every pending job each cycle: hashed, not ordered.
    pending_status: PendingStatuses,
    cpu_admitted: BTreeSet<String>,
    outbox: VecDeque<Outgoing>,
    applied: BTreeMap<String, u64>,
    generation: u64,
    /// The last status report queued per queue. Not saved: after a restart
    /// every queue is reported again, which rewrites its status as it was.
    queue_status: BTreeMap<String, QueueStatusReported>,
    /// When queue reports were last worked out.
    queue_status_at: Option<Timestamp>,
    /// The cost-optimizer's capacity choice per job (`namespace/name`). Not
    /// saved: choices published after the snapshot are replayed at start,
    /// earlier ones are not.
    capacity_chosen: BTreeMap<String, CapacityChoice>,
}

/// The capacity type the cost-optimizer chose for a job with `capacityType:
/// any`.
#[derive(Debug, Clone, PartialEq)]
struct CapacityChoice {
    /// The TrainingJob's Kubernetes uid: a job deleted and created again
    /// under its name is chosen for anew.
    uid: String,
    capacity: gpu_allocator_core::CapacityType,
    /// Nodes of that type alone could never hold the job (the core found it
    /// unschedulable so restricted), so it is admitted on either type: the
    /// job asked for none, and a cheaper type that can never run it is no
    /// saving.
    never_fits: bool,
}

fn changed(applied: Applied) -> bool {
    applied == Applied::Changed
}

impl AllocatorState {
    /// An empty state.
    pub fn new(config: AllocatorServiceConfig) -> Result<Self, ServiceError> {
        let alloc = Allocator::new(config.allocator_config(&[]))?;
        Ok(Self {
            config,
            alloc,
            jobs: BTreeMap::new(),
            by_uid: HashMap::new(),
            queues: BTreeMap::new(),
            learned_flavors: BTreeMap::new(),
            pending_status: HashMap::default(),
            cpu_admitted: BTreeSet::new(),
            outbox: VecDeque::new(),
            applied: BTreeMap::new(),
            generation: 0,
            queue_status: BTreeMap::new(),
            queue_status_at: None,
            capacity_chosen: BTreeMap::new(),
        })
    }

    /// Rebuilds the state from a snapshot, under the current configuration
    /// (falling back to the snapshot's own if the current one does not fit it).
    pub fn restore(
        config: AllocatorServiceConfig,
        persisted: PersistedState,
    ) -> Result<Self, ServiceError> {
        if persisted.format_version != STATE_FORMAT_VERSION {
            return Err(ServiceError::Store(format!(
                "snapshot format {} is not {STATE_FORMAT_VERSION}",
                persisted.format_version
            )));
        }
        let learned: Vec<FlavorSpec> = persisted.learned_flavors.values().cloned().collect();
        let mut snapshot = persisted.allocator;
        let stored_config = snapshot.config.clone();
        snapshot.config = config.allocator_config(&learned);
        let alloc = match Allocator::restore(snapshot.clone()) {
            Ok(alloc) => alloc,
            Err(err) => {
                tracing::warn!(error = %err, "snapshot does not fit the current configuration; restoring with the configuration it was taken under");
                snapshot.config = stored_config;
                Allocator::restore(snapshot)?
            }
        };
        let by_uid = persisted
            .jobs
            .iter()
            .map(|(key, rec)| (rec.entity.uid.clone(), key.clone()))
            .collect();
        Ok(Self {
            config,
            alloc,
            jobs: persisted.jobs,
            by_uid,
            queues: persisted.queues,
            learned_flavors: persisted.learned_flavors,
            pending_status: persisted.pending_status,
            cpu_admitted: persisted.cpu_admitted,
            outbox: persisted.outbox,
            applied: persisted.applied,
            generation: 0,
            queue_status: BTreeMap::new(),
            queue_status_at: None,
            capacity_chosen: BTreeMap::new(),
        })
    }

    /// Everything needed to continue after a restart.
    pub fn persisted(&self) -> PersistedState {
        PersistedState {
            format_version: STATE_FORMAT_VERSION,
            allocator: self.alloc.snapshot(),
            jobs: self.jobs.clone(),
            queues: self.queues.clone(),
            learned_flavors: self.learned_flavors.clone(),
            pending_status: self.pending_status.clone(),
            cpu_admitted: self.cpu_admitted.clone(),
            outbox: self.outbox.clone(),
            applied: self.applied.clone(),
        }
    }

    /// Records that the message at `sequence` of `stream` was applied. Not a
    /// change of its own (the generation stays): if it is lost in a crash,
    /// the message is only replayed once more, and applying it is idempotent.
    pub fn note_applied(&mut self, stream: &str, sequence: u64) {
        let last = self.applied.entry(stream.to_string()).or_default();
        *last = (*last).max(sequence);
    }

    /// Sequence of the last message of `stream` applied (0 = none).
    pub fn applied_sequence(&self, stream: &str) -> u64 {
        self.applied.get(stream).copied().unwrap_or(0)
    }

    /// Whether the message at `sequence` of `stream` is already in the state:
    /// a consumer delivers a stream in order, so one at or below the last
    /// applied sequence was replayed at start (or is a redelivery). Sequence
    /// 0 means unknown, never applied.
    pub fn already_applied(&self, stream: &str, sequence: u64) -> bool {
        sequence > 0 && sequence <= self.applied_sequence(stream)
    }

    /// Increases with every change; the persister saves up to a generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn touch(&mut self) {
        self.generation += 1;
    }

    /// The core (read-only), for tests and metrics.
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    /// The record of a TrainingJob.
    pub fn job(&self, namespace: &str, name: &str) -> Option<&JobRecord> {
        self.jobs
            .get(&object_key(namespace, name))
            .map(|rec| &**rec)
    }

    /// Decisions waiting to be published, oldest first.
    pub fn outbox(&self) -> &VecDeque<Outgoing> {
        &self.outbox
    }

    fn apply(&mut self, event: Event) -> Result<bool, ServiceError> {
        let applied = changed(self.alloc.apply(event)?);
        if applied {
            self.touch();
        }
        Ok(applied)
    }

    // ------------------------------------------------------------------ nodes

    /// `node.observed`.
    pub fn on_node(&mut self, entity: &EntityRef, node: &NodeObserved) -> Result<(), ServiceError> {
        let event = mapping::node_event(entity, node)?;
        self.apply(event)?;
        Ok(())
    }

    // ----------------------------------------------------------------- queues

    /// `trainingqueue.changed`.
    pub fn on_queue(
        &mut self,
        entity: &EntityRef,
        change: &TrainingQueueChanged,
    ) -> Result<(), ServiceError> {
        let (mut event, info) = mapping::queue_event(&self.config, entity, change)?;
        let name = queue_name(entity, &change.object);
        // The budget's hold is the cost-optimizer's, not the spec's: kept.
        if let Event::QueueUpserted(spec) = &mut event {
            spec.budget_hold = self.alloc.queue_budget_hold(&name).cloned();
        }
        match info {
            Some(info) => {
                self.learn_flavors(&name, &info.flavors);
                if self.queues.get(&name) != Some(&info) {
                    self.queues.insert(name, info);
                    self.touch();
                }
            }
            None => {
                if self.queues.remove(&name).is_some() {
                    self.touch();
                }
            }
        }
        self.apply(event)?;
        Ok(())
    }

    /// Flavors a queue defines by node labels become allocator flavors. The
    /// core's flavors are part of its configuration, so a new one rebuilds
    /// the core from its own snapshot (nodes are re-matched to flavors).
    fn learn_flavors(&mut self, queue: &str, flavors: &[FlavorSpec]) {
        let mut added = Vec::new();
        for flavor in flavors {
            if self.config.configures_flavor(&flavor.name) {
                continue;
            }
            match self.learned_flavors.get(&flavor.name) {
                Some(known) if known.node_labels == flavor.node_labels => {}
                Some(known) => tracing::warn!(
                    queue,
                    flavor = %flavor.name,
                    known = ?known.node_labels,
                    ignored = ?flavor.node_labels,
                    "flavor already defined with other node labels by another queue; keeping the first definition"
                ),
                None => {
                    self.learned_flavors
                        .insert(flavor.name.clone(), flavor.clone());
                    added.push(flavor.name.clone());
                }
            }
        }
        if added.is_empty() {
            return;
        }
        let learned: Vec<FlavorSpec> = self.learned_flavors.values().cloned().collect();
        let mut snapshot = self.alloc.snapshot();
        snapshot.config = self.config.allocator_config(&learned);
        match Allocator::restore(snapshot) {
            Ok(alloc) => {
                self.alloc = alloc;
                self.touch();
                tracing::info!(queue, flavors = ?added, "learned flavors from TrainingQueue node labels");
            }
            Err(err) => {
                for name in &added {
                    self.learned_flavors.remove(name);
                }
                tracing::warn!(queue, flavors = ?added, error = %err, "cannot add flavors defined by the queue; its jobs wait with NoMatchingFlavor");
            }
        }
    }

    // ------------------------------------------------------------------- jobs

    /// `trainingjob.changed`: submit the current attempt, finish older ones.
    pub fn on_job_changed(
        &mut self,
        entity: &EntityRef,
        change: &TrainingJobChanged,
        now: Timestamp,
    ) -> Result<(), ServiceError> {
        let job = &change.object;
        let namespace = job
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| entity.namespace.clone());
        let name = job
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| entity.name.clone());
        let key = object_key(&namespace, &name);
        let k8s_uid = job
            .metadata
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| entity.uid.clone());
        if k8s_uid.is_empty() {
            return Err(ServiceError::invalid(
                format!("TrainingJob {key}"),
                "metadata.uid",
                "must not be empty: the allocator keys jobs by uid",
            ));
        }
        if change.change == Change::Deleted {
            if let Some(rec) = self.jobs.get(&key).cloned()
                && rec.entity.uid == k8s_uid
            {
                self.forget(&key);
                self.apply(Event::JobRemoved {
                    uid: rec.template.uid.clone(),
                })?;
            }
            return Ok(());
        }
        let attempt = mapping::job_attempt(job);
        let queue = job
            .spec
            .scheduling
            .as_ref()
            .and_then(|s| s.queue.as_deref())
            .unwrap_or(self.config.default_queue.as_str());
        let queue_default = self.queues.get(queue).map(|q| q.default_priority);
        let mut spec = mapping::job_spec(&self.config, job, &k8s_uid, attempt, queue_default, now)?;
        if let Some(rec) = self.jobs.get(&key).cloned() {
            if rec.entity.uid != k8s_uid {
                // Deleted and created again under the same name.
                self.finish_attempt(&rec.template.uid)?;
            } else if attempt < rec.attempt {
                return Ok(()); // an older copy of the object
            } else {
                // Noted when the attempt before was preempted (or carried
                // into it): not in the object.
                spec.last_preemptor = rec.template.last_preemptor.clone();
                if attempt > rec.attempt {
                    self.finish_attempt(&rec.template.uid)?;
                }
            }
        }
        let suspended = job.spec.is_suspended();
        let terminal = job
            .status
            .as_ref()
            .and_then(|s| s.state)
            .is_some_and(|s| s.is_terminal());
        let backing_off = job.status.as_ref().is_some_and(|s| s.requeue_at.is_some());
        let record = JobRecord {
            entity: EntityRef::new(&namespace, &name, &k8s_uid),
            attempt,
            template: spec.clone(),
            suspended,
        };
        self.remember(key.clone(), record);
        if terminal {
            self.finish_attempt(&spec.uid)
        } else if suspended {
            self.suspend_attempt(&spec.uid)
        } else if backing_off {
            self.hold_attempt(&spec.uid);
            Ok(())
        } else {
            let spec = self.with_chosen_capacity(&key, &k8s_uid, spec);
            self.submit(spec)
        }
    }

    /// `spec` kept to the capacity type the cost-optimizer chose for the job, if any.
    fn with_chosen_capacity(&self, key: &str, k8s_uid: &str, mut spec: JobSpec) -> JobSpec {
        if let Some(choice) = self.capacity_chosen.get(key)
            && choice.uid == k8s_uid
            && !choice.never_fits
        {
            mapping::restrict_capacity(
                &mut spec,
                &self.config.capacity_type_labels,
                choice.capacity,
            );
        }
        spec
    }

    /// Whether the job of attempt `uid` is admitted on either capacity type
    /// because its chosen one can never hold it.
    fn capacity_reopened(&self, uid: &JobUid) -> bool {
        self.record_of(uid).is_some_and(|rec| {
            let key = object_key(&rec.entity.namespace, &rec.entity.name);
            self.capacity_chosen
                .get(&key)
                .is_some_and(|c| c.uid == rec.entity.uid && c.never_fits)
        })
    }

    /// Opens both capacity types again to the pending jobs of `outcome` that
    /// the core found unschedulable only as restricted to their chosen
    /// type, and returns their attempt uids: their explanation this cycle
    /// describes the restriction, not the job. One that is unschedulable on
    /// either type is found so again next cycle, with the reason that
    /// holds for the job itself.
    fn open_capacity_of_unschedulable(&mut self, outcome: &CycleOutcome) -> HashSet<JobUid> {
        let restricted: Vec<(JobUid, String)> = outcome
            .pending
            .iter()
            .filter_map(|pending| {
                let (uid, _, reason) = self.alloc.pending_parts(outcome, pending)?;
                if !matches!(
                    **reason,
                    gpu_allocator_core::PendingReason::Unschedulable { .. }
                ) {
                    return None;
                }
                let rec = self.record_of(uid)?;
                let key = object_key(&rec.entity.namespace, &rec.entity.name);
                let choice = self.capacity_chosen.get(&key)?;
                (choice.uid == rec.entity.uid && !choice.never_fits).then(|| (uid.clone(), key))
            })
            .collect();
        let mut opened = HashSet::new();
        for (uid, key) in restricted {
            let Some(choice) = self.capacity_chosen.get_mut(&key) else {
                continue;
            };
            choice.never_fits = true;
            tracing::info!(
                job = %key,
                capacity = ?choice.capacity,
                "nodes of the chosen capacity type alone can never hold the job; admitting it on either type"
            );
            let Some(rec) = self.jobs.get(&key).cloned() else {
                continue;
            };
            if let Err(err) = self.submit(rec.template.clone()) {
                tracing::warn!(job = %key, error = %err, "job not resubmitted without its capacity type");
                continue;
            }
            opened.insert(uid);
        }
        opened
    }

    /// `cost.capacity`: a pending job is admitted on the chosen type only
    /// from now (an admitted one keeps its nodes; its next attempt follows
    /// the choice).
    /// The cost-optimizer's budget report: a spent budget holds the queue
    /// (`Held`), or also drains it (`Suspended`); `Open` releases it. A
    /// report about a queue not known yet changes nothing (the next one,
    /// every accounting interval while the spend moves, applies).
    pub fn on_budget(
        &mut self,
        entity: &EntityRef,
        report: &trainyard_contracts::cost::BudgetStatusReported,
    ) -> Result<(), ServiceError> {
        use trainyard_contracts::cost::BudgetState;
        let hold = match report.state {
            BudgetState::Open => None,
            BudgetState::Held | BudgetState::Suspended => Some(gpu_allocator_core::BudgetHold {
                drains: report.state == BudgetState::Suspended,
                spend: format!(
                    "spent {:.2} of {:.2} {} in the period from {}",
                    report.spent,
                    report.amount,
                    report.currency,
                    report.period_start.to_rfc3339()
                ),
            }),
        };
        self.apply(Event::QueueBudgetChanged {
            name: entity.name.clone(),
            hold,
        })?;
        Ok(())
    }

    pub fn on_capacity(
        &mut self,
        entity: &EntityRef,
        chosen: &trainyard_contracts::cost::CapacityChosen,
    ) -> Result<(), ServiceError> {
        let key = object_key(&entity.namespace, &entity.name);
        let capacity = match chosen.capacity_type {
            trainyard_contracts::cost::CapacityType::Spot => gpu_allocator_core::CapacityType::Spot,
            trainyard_contracts::cost::CapacityType::OnDemand => {
                gpu_allocator_core::CapacityType::OnDemand
            }
        };
        let Some(rec) = self.jobs.get(&key).cloned() else {
            self.capacity_chosen.insert(
                key,
                CapacityChoice {
                    uid: entity.uid.clone(),
                    capacity,
                    never_fits: false,
                },
            );
            return Ok(());
        };
        if !entity.uid.is_empty() && entity.uid != rec.entity.uid {
            return Ok(());
        }
        // A choice repeated (the cost-optimizer re-decides on every change of
        // its inputs) keeps what the core found of it.
        let never_fits = self
            .capacity_chosen
            .get(&key)
            .is_some_and(|c| c.uid == rec.entity.uid && c.capacity == capacity && c.never_fits);
        self.capacity_chosen.insert(
            key.clone(),
            CapacityChoice {
                uid: rec.entity.uid.clone(),
                capacity,
                never_fits,
            },
        );
        self.touch();
        if rec.suspended || rec.template.gpus_per_worker == 0 {
            return Ok(());
        }
        let spec = self.with_chosen_capacity(&key, &rec.entity.uid, rec.template.clone());
        self.submit(spec)
    }

    fn remember(&mut self, key: String, record: JobRecord) {
        if self.jobs.get(&key).map(|rec| &**rec) != Some(&record) {
            self.by_uid.insert(record.entity.uid.clone(), key.clone());
            self.jobs.insert(key, Arc::new(record));
            self.touch();
        }
    }

    fn forget(&mut self, key: &str) {
        if let Some(rec) = self.jobs.remove(key) {
            self.by_uid.remove(&rec.entity.uid);
            self.touch();
        }
    }

    fn submit(&mut self, spec: JobSpec) -> Result<(), ServiceError> {
        // A CPU-only attempt admitted once stays admitted: the core forgets
        // it (keeping its uid only for a while) once it is admitted.
        if spec.is_cpu_only() && self.cpu_admitted.contains(spec.uid.as_str()) {
            return Ok(());
        }
        self.apply(Event::JobSubmitted(spec))?;
        Ok(())
    }

    fn finish_attempt(&mut self, uid: &JobUid) -> Result<(), ServiceError> {
        self.cpu_admitted.remove(uid.as_str());
        self.pending_status.remove(uid.as_str());
        self.apply(Event::JobFinished { uid: uid.clone() })?;
        Ok(())
    }

    /// A suspended attempt releases its GPUs. If it was admitted, the planner
    /// deletes its Job and resumes as a new attempt, so it is finished; if it
    /// was still waiting, the same attempt may resume, so it is withdrawn
    /// without a tombstone.
    fn suspend_attempt(&mut self, uid: &JobUid) -> Result<(), ServiceError> {
        if self.is_admitted(uid) {
            return self.finish_attempt(uid);
        }
        self.withdraw_waiting(uid);
        Ok(())
    }

    fn is_admitted(&self, uid: &JobUid) -> bool {
        self.alloc.admission(uid).is_some() || self.cpu_admitted.contains(uid.as_str())
    }

    /// Takes a waiting attempt out of its queue, without a tombstone: it may queue again.
    fn withdraw_waiting(&mut self, uid: &JobUid) {
        self.pending_status.remove(uid.as_str());
        if changed(self.alloc.withdraw(uid)) {
            self.touch();
        }
    }

    /// An attempt the planner creates only after a backoff does not queue
    /// before then. One admitted already keeps its admission: the planner
    /// holds it for the attempt, and taking it back would free GPUs the
    /// attempt is about to use.
    fn hold_attempt(&mut self, uid: &JobUid) {
        if !self.is_admitted(uid) {
            self.withdraw_waiting(uid);
        }
    }

    /// `trainingjob.transitioned` from the planner.
    pub fn on_transition(
        &mut self,
        entity: &EntityRef,
        transition: &TrainingJobTransitioned,
    ) -> Result<(), ServiceError> {
        let key = object_key(&entity.namespace, &entity.name);
        let Some(mut rec) = self.jobs.get(&key).map(|rec| JobRecord::clone(rec)) else {
            // Never saw its spec: remember only that a finished attempt is done.
            if transition.to.is_terminal() && !entity.uid.is_empty() {
                self.apply(Event::JobFinished {
                    uid: JobUid::for_attempt(&entity.uid, transition.restart_count),
                })?;
            }
            return Ok(());
        };
        if !entity.uid.is_empty() && entity.uid != rec.entity.uid {
            return Ok(()); // about an earlier object of the same name
        }
        let attempt = transition.restart_count;
        if attempt < rec.attempt {
            return Ok(());
        }
        if attempt > rec.attempt {
            self.finish_attempt(&rec.template.uid)?;
            rec.attempt = attempt;
            rec.template.set_attempt(&rec.entity.uid, attempt);
            self.remember(key.clone(), rec.clone());
        }
        let uid = rec.template.uid.clone();
        match transition.to {
            TrainingJobState::Completed | TrainingJobState::Failed => self.finish_attempt(&uid),
            TrainingJobState::Suspended => self.suspend_attempt(&uid),
            // Pending may be a backoff, which only the object says
            // (`status.requeueAt`): its status write queues the attempt.
            TrainingJobState::Pending => Ok(()),
            TrainingJobState::Queued
            | TrainingJobState::Initializing
            | TrainingJobState::Running => {
                if rec.suspended {
                    Ok(())
                } else {
                    let spec = self.with_chosen_capacity(&key, &rec.entity.uid, rec.template);
                    self.submit(spec)
                }
            }
        }
    }

    /// `trainingjob.finalized`: the job and everything it owned are gone.
    pub fn on_finalized(&mut self, entity: &EntityRef) -> Result<(), ServiceError> {
        let key = object_key(&entity.namespace, &entity.name);
        let Some(rec) = self.jobs.get(&key).cloned() else {
            return Ok(());
        };
        if !entity.uid.is_empty() && entity.uid != rec.entity.uid {
            return Ok(());
        }
        self.forget(&key);
        self.cpu_admitted.remove(rec.template.uid.as_str());
        self.pending_status.remove(rec.template.uid.as_str());
        self.apply(Event::JobRemoved {
            uid: rec.template.uid.clone(),
        })?;
        Ok(())
    }

    // ------------------------------------------------------------------ cycle

    /// The next attempt of an evicted one never takes its preemptor as a
    /// victim (the core's loop guard, kept across attempts): its template
    /// carries it.
    fn note_preemptor(&mut self, victim: &JobUid, by: &JobUid) {
        // Only while the record is at the victim's attempt.
        let Some(rec) = self
            .record_of(victim)
            .filter(|rec| rec.template.uid == *victim)
        else {
            return;
        };
        let mut rec = rec.clone();
        rec.template.last_preemptor = Some(by.clone());
        let key = object_key(&rec.entity.namespace, &rec.entity.name);
        self.remember(key, rec);
    }

    fn record_of(&self, uid: &JobUid) -> Option<&JobRecord> {
        let (k8s_uid, _) = uid.attempt()?;
        self.jobs.get(self.by_uid.get(k8s_uid)?).map(|rec| &**rec)
    }

    fn entity_of(&self, uid: &JobUid) -> EntityRef {
        match self.record_of(uid) {
            Some(rec) => rec.entity.clone(),
            None => mapping::job_entity("", "", uid),
        }
    }

    /// Runs one admission cycle and queues its decisions in the outbox.
    pub fn cycle(&mut self, now: Timestamp) -> CycleReport {
        let outcome = self.alloc.cycle(now);
        let mut report = CycleReport {
            admissions: outcome.admissions.len(),
            pending: outcome.pending.len(),
            core: outcome.stats,
            ..CycleReport::default()
        };
        for queue in self.queues.keys() {
            report.queue_depth.insert(queue.clone(), 0);
        }
        let mut decided = !outcome.admissions.is_empty()
            || !outcome.preemptions.is_empty()
            || !outcome.drains.is_empty()
            || !outcome.evictions.is_empty();
        for admission in &outcome.admissions {
            self.pending_status.remove(admission.uid.as_str());
        }
        let reopened = self.open_capacity_of_unschedulable(&outcome);
        decided |= !reopened.is_empty();
        // Resolved before the evictions below end attempts in the core.
        let (fresh, status_changed) = self.explain_pending(&outcome, &reopened, now, &mut report);
        decided |= status_changed;
        for admission in outcome.admissions {
            let attempt = admission.uid.attempt().map_or(0, |(_, a)| a);
            // A CPU-only admission holds nothing in the core to replay.
            let cpu_only = admission.flavor == CPU_FLAVOR;
            if cpu_only {
                self.cpu_admitted.insert(admission.uid.to_string());
            }
            let mut payload = mapping::admission_decided(&admission, attempt);
            payload.capacity_type_reopened = self.capacity_reopened(&admission.uid);
            self.outbox.push_back(Outgoing::Admission {
                id: mapping::admission_id(&admission.uid),
                entity: mapping::job_entity(&admission.namespace, &admission.name, &admission.uid),
                payload,
                decision: (!cpu_only).then_some(admission),
            });
        }
        for preemption in outcome.preemptions {
            let preemptor = self.entity_of(&preemption.preemptor);
            for victim in &preemption.victims {
                report.preempted_victims += 1;
                self.outbox.push_back(Outgoing::Preemption {
                    id: mapping::preemption_id(&victim.uid, &preemption.preemptor),
                    entity: mapping::job_entity(&victim.namespace, &victim.name, &victim.uid),
                    payload: mapping::preemption_decided(
                        &preemption,
                        victim,
                        preemptor.clone(),
                        self.config.grace_seconds,
                    ),
                    decision: preemption.clone(),
                });
            }
        }
        for drain in outcome.drains {
            for victim in &drain.victims {
                report.drained_victims += 1;
                self.outbox.push_back(Outgoing::Drain {
                    id: mapping::drain_id(&victim.uid, &drain.queue),
                    entity: mapping::job_entity(&victim.namespace, &victim.name, &victim.uid),
                    payload: mapping::drain_decided(
                        drain.evict_at,
                        victim,
                        self.config.grace_seconds,
                        self.alloc.queue_budget_hold(&drain.queue),
                    ),
                    decision: drain.clone(),
                });
            }
        }
        for eviction in outcome.evictions {
            match eviction.reason {
                EvictionReason::Preempted { .. } => report.evictions_preempted += 1,
                EvictionReason::Drained { .. } => report.evictions_drained += 1,
                EvictionReason::NodeLost { .. } => report.evictions_node_lost += 1,
            }
            let uid = eviction.uid.clone();
            if let EvictionReason::Preempted { by } = &eviction.reason {
                self.note_preemptor(&uid, by);
            }
            // Feed the decision back (a no-op: the cycle applied it), then end
            // the attempt: the planner replaces an evicted attempt with a new
            // one, which is submitted fresh when it is announced.
            if let Err(err) = self.alloc.apply(Event::Evicted(eviction)) {
                tracing::warn!(%uid, error = %err, "eviction feedback rejected");
            }
            if let Err(err) = self.finish_attempt(&uid) {
                tracing::warn!(%uid, error = %err, "cannot finish evicted attempt");
            }
        }
        if !fresh.is_empty() {
            report.explanations_published = fresh.len();
            self.supersede(fresh);
            decided = true;
        }
        report.queue_reports = self.report_queues(now);
        if decided || report.queue_reports > 0 {
            self.touch();
        }
        report.totals = self.alloc.stats();
        report
    }

    /// Queues a status report for each queue whose figures changed since
    /// its last one, at most every `queue_status_interval_seconds`: a busy
    /// queue's figures change every cycle, and each report is an API write.
    /// Returns how many were queued.
    fn report_queues(&mut self, now: Timestamp) -> usize {
        let interval = self.config.queue_status_interval_seconds;
        if self
            .queue_status_at
            .is_some_and(|at| now.0 < at.0.saturating_add(interval))
        {
            return 0;
        }
        self.queue_status_at = Some(now);
        let mut cpu_admitted: BTreeMap<&str, u32> = BTreeMap::new();
        for uid in &self.cpu_admitted {
            if let Some(rec) = self.record_of(&JobUid::new(uid.as_str())) {
                let queue = rec.template.queue.as_deref();
                *cpu_admitted
                    .entry(queue.unwrap_or(&self.config.default_queue))
                    .or_default() += 1;
            }
        }
        let mut fresh = Vec::new();
        let mut reported = BTreeMap::new();
        for usage in self.alloc.queue_usage() {
            let cpu = cpu_admitted.get(usage.name.as_str()).copied().unwrap_or(0);
            let payload = mapping::queue_status_reported(&usage, cpu);
            if self.queue_status.get(&usage.name) != Some(&payload) {
                fresh.push(Outgoing::QueueStatus {
                    id: mapping::queue_status_id(&usage.name, &payload, now),
                    entity: EntityRef::new("", &usage.name, ""),
                    payload: payload.clone(),
                });
            }
            reported.insert(usage.name, payload);
        }
        // Deleted queues are forgotten: one created again is reported anew.
        self.queue_status = reported;
        let queued = fresh.len();
        self.supersede(fresh);
        queued
    }

    /// Queues `fresh` status messages, dropping in one pass the unpublished
    /// older ones about the same jobs or queues.
    fn supersede(&mut self, fresh: Vec<Outgoing>) {
        if fresh.is_empty() {
            return;
        }
        let replaced: HashSet<&EntityRef> =
            fresh.iter().filter_map(Outgoing::status_about).collect();
        self.outbox
            .retain(|o| o.status_about().is_none_or(|e| !replaced.contains(e)));
        self.outbox.extend(fresh);
    }

    /// Counts each queue's pending jobs into `report` and returns the
    /// explanations worth publishing again (see [`PendingStatus`]), and
    /// whether any published status changed; forgets the published status
    /// of jobs no longer pending. Every pending job is looked at each cycle,
    /// so this touches only borrowed parts of most of them: an explanation
    /// is built for those it returns.
    fn explain_pending(
        &mut self,
        outcome: &CycleOutcome,
        reopened: &HashSet<JobUid>,
        now: Timestamp,
        report: &mut CycleReport,
    ) -> (Vec<Outgoing>, bool) {
        let step = self.config.explain_step_percent;
        let mut fresh = Vec::new();
        // Pending jobs that have a published status after this loop.
        let mut with_status = 0usize;
        let mut changed_status = false;
        let mut causes: Vec<Option<u64>> = vec![None; outcome.reasons().len()];
        for pending in &outcome.pending {
            let Some((uid, queue, reason)) = self.alloc.pending_parts(outcome, pending) else {
                continue;
            };
            // Every queue with jobs pending has one at position 1.
            if pending.position == 1 {
                report
                    .queue_depth
                    .insert(queue.to_string(), pending.queue_length);
            }
            if reopened.contains(uid) {
                continue;
            }
            *report.pending_by_reason.entry(reason.kind()).or_default() += 1;
            // Jobs waiting for one reason share its cause hash.
            let cause = match causes.get_mut(pending.reason_index()) {
                Some(cached) => *cached.get_or_insert_with(|| cause_hash(reason)),
                None => cause_hash(reason),
            };
            let status = PendingStatus::new(cause, queue, pending.position, reason);
            if self
                .pending_status
                .get(uid.as_str())
                .is_some_and(|published| !status.supersedes(published, step))
            {
                with_status += 1;
                continue;
            }
            let Some(rec) = self.record_of(uid) else {
                continue;
            };
            let gpus = u32::try_from(rec.template.total_units()).unwrap_or(u32::MAX);
            let entity = rec.entity.clone();
            let attempt = uid.attempt().map(|(_, attempt)| attempt);
            let payload =
                mapping::pending_explained(attempt, queue, pending.position, reason, gpus);
            fresh.push(Outgoing::Pending {
                id: mapping::pending_id(uid, &payload, now),
                entity,
                payload,
            });
            self.pending_status.insert(uid.to_string(), status);
            with_status += 1;
            changed_status = true;
        }
        // The map holds a status for each of those `with_status` jobs: any
        // more may belong to jobs gone from the line.
        let before = self.pending_status.len();
        if before != with_status {
            let still_pending: HashSet<&str> = outcome
                .pending
                .iter()
                .filter_map(|p| self.alloc.pending_parts(outcome, p))
                .map(|(uid, _, _)| uid.as_str())
                .collect();
            self.pending_status
                .retain(|uid, _| still_pending.contains(uid.as_str()));
            changed_status |= before != self.pending_status.len();
        }
        (fresh, changed_status)
    }

    /// A decision was published: drop it from the outbox and feed it back
    /// into the core, as the core's README asks (a no-op when applied).
    pub fn published(&mut self, id: &str) {
        // Decisions go out in outbox order, so the one published is the first.
        let at = if self.outbox.front().is_some_and(|o| o.id() == id) {
            Some(0)
        } else {
            self.outbox.iter().position(|o| o.id() == id)
        };
        let Some(outgoing) = at.and_then(|at| self.outbox.remove(at)) else {
            return;
        };
        self.touch();
        let event = match outgoing {
            Outgoing::Admission {
                decision: Some(admission),
                ..
            } => Event::Admitted(admission),
            Outgoing::Preemption { decision, .. } => Event::PreemptionStarted(decision),
            Outgoing::Drain { decision, .. } => Event::DrainStarted(decision),
            Outgoing::Admission { decision: None, .. }
            | Outgoing::Pending { .. }
            | Outgoing::QueueStatus { .. } => return,
        };
        let kind = event.kind();
        if let Err(err) = self.alloc.apply(event) {
            tracing::debug!(kind, error = %err, "decision feedback not applied");
        }
    }
}

fn queue_name(entity: &EntityRef, queue: &TrainingQueue) -> String {
    queue
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| entity.name.clone())
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use trainyard_contracts::cost::BudgetState;
    use trainyard_contracts::events::Change;

    use super::*;

    fn state() -> AllocatorState {
        state_with(AllocatorServiceConfig::default())
    }

    /// One node of 8 A100 and a queue `default` with all 8 as nominal quota.
    fn state_with(config: AllocatorServiceConfig) -> AllocatorState {
        let mut state = AllocatorState::new(config).expect("state");
        let node: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8,
            "labels": {"nvidia.com/gpu.product": "A100"},
            "unschedulable": false, "ready": true
        }))
        .expect("node");
        state
            .on_node(&EntityRef::new("", "n1", ""), &node)
            .expect("node applies");
        set_default_queue(&mut state, "None");
        state
    }

    /// Applies queue `default`: all 8 A100 as nominal quota, and `stop_policy`.
    fn set_default_queue(state: &mut AllocatorState, stop_policy: &str) {
        let queue: TrainingQueueChanged = serde_json::from_value(json!({
            "change": "Applied",
            "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                       "metadata": {"name": "default"},
                       "spec": {"stopPolicy": stop_policy, "flavors": [{"name": "a100", "nominalQuota": 8,
                                "nodeLabels": {"nvidia.com/gpu.product": "A100"}}]}}
        }))
        .expect("queue");
        state
            .on_queue(&EntityRef::new("", "default", ""), &queue)
            .expect("queue applies");
    }

    fn job(name: &str, gpus: u32, restart: u32, suspend: bool) -> TrainingJobChanged {
        serde_json::from_value(json!({
            "change": "Applied",
            "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                       "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
                       "spec": {"model": "m", "dataset": "d", "numWorkers": 1,
                                "gpusPerWorker": gpus, "suspend": suspend},
                       "status": {"restartCount": restart}}
        }))
        .expect("job")
    }

    /// Node `s1`: `gpus` A100 on spot (n1, from `state`, is on-demand).
    fn add_spot_node(state: &mut AllocatorState, gpus: u32) {
        let spot: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": gpus,
            "labels": {"nvidia.com/gpu.product": "A100", "karpenter.sh/capacity-type": "spot"},
            "unschedulable": false, "ready": true
        }))
        .expect("node");
        state
            .on_node(&EntityRef::new("", "s1", ""), &spot)
            .expect("node applies");
    }

    /// The node of worker 0 of each admission in the outbox.
    fn first_worker_nodes(state: &AllocatorState) -> Vec<String> {
        state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Admission { payload, .. } => {
                    Some(payload.placements.first()?.node.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Whether each admission in the outbox was opened to either capacity type.
    fn capacity_reopened(state: &AllocatorState) -> Vec<bool> {
        state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Admission { payload, .. } => Some(payload.capacity_type_reopened),
                _ => None,
            })
            .collect()
    }

    /// The cost-optimizer's choice of spot.
    fn spot_chosen() -> trainyard_contracts::cost::CapacityChosen {
        serde_json::from_value(json!({
            "capacityType": "spot", "reason": "spot: saves 57%", "currency": "USD",
            "spotExpectedCost": 1.0, "onDemandExpectedCost": 2.0, "expectedCost": 1.0,
            "inputs": {"workHours": 1.0, "runtimeSource": "default", "gpus": 4, "nodes": 1,
                       "checkpointSaveSeconds": 60.0, "restartSeconds": 360.0,
                       "spotPricePerGpuHour": 1.5, "onDemandPricePerGpuHour": 4.0,
                       "spotReclaimsPerNodeHour": 0.01, "pool": "A100@", "spotInterruptions": 0}
        }))
        .expect("decision")
    }

    fn entity(name: &str) -> EntityRef {
        EntityRef::new("ml", name, format!("uid-{name}"))
    }

    fn admitted(state: &AllocatorState) -> Vec<(String, u32)> {
        state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Admission {
                    entity, payload, ..
                } => Some((entity.name.clone(), payload.attempt)),
                _ => None,
            })
            .collect()
    }

    fn transition(to: TrainingJobState, restart_count: u32) -> TrainingJobTransitioned {
        TrainingJobTransitioned {
            from: None,
            to,
            reason: "test".into(),
            message: String::new(),
            restart_count,
            gpus: 0,
            queue: None,
            context: Default::default(),
        }
    }

    #[test]
    fn a_job_with_any_capacity_is_admitted_on_the_type_the_cost_optimizer_chose() {
        let mut state = state();
        // n1 (from `state`) is on-demand: it carries no spot label.
        add_spot_node(&mut state, 8);
        let chosen = spot_chosen();
        state
            .on_capacity(&entity("cheap"), &chosen)
            .expect("decision applies");
        state
            .on_job_changed(&entity("cheap"), &job("cheap", 4, 0, false), Timestamp(0))
            .expect("job applies");
        state.cycle(Timestamp(1));
        assert_eq!(first_worker_nodes(&state), vec!["s1".to_string()]);
        assert_eq!(capacity_reopened(&state), [false]);
    }

    #[test]
    fn a_chosen_capacity_type_that_can_never_hold_the_job_gives_way_to_either_type() {
        let mut state = state();
        // n1 (from `state`) is on-demand with 8 GPUs; the one spot node has 4.
        add_spot_node(&mut state, 4);
        let chosen = spot_chosen();
        state
            .on_capacity(&entity("wide"), &chosen)
            .expect("decision applies");
        state
            .on_job_changed(&entity("wide"), &job("wide", 8, 0, false), Timestamp(0))
            .expect("job applies");
        state.cycle(Timestamp(1));
        assert!(
            admitted(&state).is_empty(),
            "no spot node holds 8 GPUs per worker"
        );
        assert!(
            !state
                .outbox()
                .iter()
                .any(|o| matches!(o, Outgoing::Pending { .. })),
            "the restricted job's verdict is not published: it describes the restriction"
        );
        // The cost-optimizer repeats its choice; the job stays open to both types.
        state
            .on_capacity(&entity("wide"), &chosen)
            .expect("decision applies");
        state.cycle(Timestamp(2));
        assert_eq!(first_worker_nodes(&state), vec!["n1".to_string()]);
        assert_eq!(
            capacity_reopened(&state),
            [true],
            "the admission says the choice gave way"
        );
    }

    #[test]
    fn queue_flavor_labels_become_allocator_flavors() {
        let mut state = state();
        state
            .on_job_changed(&entity("a"), &job("a", 8, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        let outbox = state.outbox();
        let Some(Outgoing::Admission { payload, .. }) = outbox.front() else {
            panic!("expected an admission, got {outbox:?}");
        };
        assert_eq!(payload.flavor, "a100");
        assert_eq!(payload.node_selector["nvidia.com/gpu.product"], "A100");
    }

    #[test]
    fn a_restart_finishes_the_old_attempt_and_submits_the_new_one() {
        let mut state = state();
        state
            .on_job_changed(&entity("a"), &job("a", 8, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        assert_eq!(admitted(&state), [("a".to_string(), 0)]);
        publish_all(&mut state);
        // The planner restarts the job as attempt 1: GPUs of attempt 0 are freed
        // and attempt 1, once created and queued, is admitted from the remembered spec.
        state
            .on_transition(&entity("a"), &transition(TrainingJobState::Pending, 1))
            .expect("transition");
        assert_eq!(state.job("ml", "a").map(|r| r.attempt), Some(1));
        state.cycle(Timestamp(11));
        assert!(admitted(&state).is_empty(), "Pending may be a backoff");
        state
            .on_transition(&entity("a"), &transition(TrainingJobState::Queued, 1))
            .expect("transition");
        assert_eq!(state.job("ml", "a").map(|r| r.attempt), Some(1));
        state.cycle(Timestamp(11));
        assert_eq!(admitted(&state), [("a".to_string(), 1)]);
        // A late copy of attempt 0 changes nothing.
        state
            .on_job_changed(&entity("a"), &job("a", 8, 0, false), Timestamp(12))
            .expect("stale job");
        assert!(
            !state
                .allocator()
                .contains_job(&JobUid::for_attempt("uid-a", 0))
        );
    }

    /// An evicted attempt is finished at once and its job comes back as a
    /// new allocator job, so what the core knew of the old one travels in
    /// the new attempt's spec: its restarts (victim searches count them) and
    /// its preemptor (never its victim), by either message that announces it.
    #[test]
    fn a_new_attempt_after_a_preemption_carries_its_restarts_and_preemptor() {
        for by_transition in [true, false] {
            let mut state = state_with(AllocatorServiceConfig {
                priority_classes: [("urgent".to_string(), 100)].into(),
                ..AllocatorServiceConfig::default()
            });
            let queue: TrainingQueueChanged = serde_json::from_value(json!({
                "change": "Applied",
                "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                           "metadata": {"name": "default"},
                           "spec": {"flavors": [{"name": "a100", "nominalQuota": 8,
                                    "nodeLabels": {"nvidia.com/gpu.product": "A100"}}],
                                    "preemption": {"withinQueue": "LowerPriority"}}}
            }))
            .expect("queue");
            state
                .on_queue(&EntityRef::new("", "default", ""), &queue)
                .expect("queue applies");
            state
                .on_job_changed(&entity("low"), &job("low", 8, 0, false), Timestamp(10))
                .expect("job");
            state.cycle(Timestamp(10));
            let mut urgent = job("urgent", 8, 0, false);
            urgent.object.spec.scheduling =
                Some(serde_json::from_value(json!({"priority": "urgent"})).expect("scheduling"));
            state
                .on_job_changed(&entity("urgent"), &urgent, Timestamp(20))
                .expect("job");
            let report = state.cycle(Timestamp(20));
            assert_eq!(report.preempted_victims, 1, "urgent preempts low");
            let grace = state.config.grace_seconds;
            let report = state.cycle(Timestamp(20 + grace));
            assert_eq!(report.evictions_preempted, 1);
            if by_transition {
                state
                    .on_transition(&entity("low"), &transition(TrainingJobState::Queued, 1))
                    .expect("transition");
            } else {
                state
                    .on_job_changed(
                        &entity("low"),
                        &job("low", 8, 1, false),
                        Timestamp(30 + grace),
                    )
                    .expect("job");
            }
            let template = &state.job("ml", "low").expect("record").template;
            assert_eq!(template.uid, JobUid::for_attempt("uid-low", 1));
            assert_eq!(
                template.earlier_restarts, 1,
                "by transition: {by_transition}"
            );
            assert_eq!(
                template.last_preemptor,
                Some(JobUid::for_attempt("uid-urgent", 0)),
                "by transition: {by_transition}"
            );
            let snapshot = state.allocator().snapshot();
            let submitted = snapshot
                .jobs
                .iter()
                .find(|j| j.spec.uid == template.uid)
                .expect("attempt 1 submitted");
            assert_eq!(submitted.preempted_by, template.last_preemptor);
            // Both survive a save (left out of the JSON only when unset).
            let persisted = state.persisted();
            let saved = serde_json::to_value(&persisted).expect("encode");
            let decoded: PersistedState = serde_json::from_value(saved).expect("decode");
            assert_eq!(decoded, persisted);
            let spec = |jobs: &[gpu_allocator_core::JobSnapshot], uid: &str| {
                serde_json::to_value(&jobs.iter().find(|j| j.spec.uid.as_str() == uid)?.spec).ok()
            };
            let urgent = spec(&persisted.allocator.jobs, "uid-urgent/a0").expect("urgent");
            assert_eq!(urgent.get("earlierRestarts"), None);
            assert_eq!(urgent.get("lastPreemptor"), None);
            let low = spec(&persisted.allocator.jobs, "uid-low/a1").expect("low");
            assert_eq!(low["earlierRestarts"], 1);
            assert_eq!(low["lastPreemptor"], "uid-urgent/a0");
        }
    }

    #[test]
    fn a_job_suspended_while_pending_resumes_as_the_same_attempt() {
        let mut state = state();
        state
            .on_job_changed(&entity("big"), &job("big", 16, 0, false), Timestamp(10))
            .expect("job");
        state
            .on_job_changed(&entity("big"), &job("big", 16, 0, true), Timestamp(11))
            .expect("suspend");
        let uid = JobUid::for_attempt("uid-big", 0);
        assert!(!state.allocator().contains_job(&uid));
        state
            .on_job_changed(&entity("big"), &job("big", 16, 0, false), Timestamp(12))
            .expect("resume");
        assert!(state.allocator().is_pending(&uid));
        state
            .on_transition(&entity("big"), &transition(TrainingJobState::Failed, 0))
            .expect("failed");
        assert!(!state.allocator().contains_job(&uid));
    }

    /// During a restart or pods-ready backoff (`status.requeueAt`) the next
    /// attempt takes no GPUs; it queues once the planner creates it.
    #[test]
    fn an_attempt_in_its_backoff_is_not_admitted_until_it_is_created() {
        let mut state = state();
        state
            .on_job_changed(&entity("big"), &job("big", 8, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        assert_eq!(admitted(&state), [("big".to_owned(), 0)]);
        state
            .on_transition(&entity("big"), &transition(TrainingJobState::Pending, 1))
            .expect("restarting");
        let mut backing_off = job("big", 8, 1, false);
        backing_off.object.status = Some(
            serde_json::from_value(json!({"restartCount": 1, "requeueAt": "2026-12-07T06:00:00Z"}))
                .expect("status"),
        );
        state
            .on_job_changed(&entity("big"), &backing_off, Timestamp(11))
            .expect("backoff");
        state.cycle(Timestamp(11));
        let next = JobUid::for_attempt("uid-big", 1);
        assert!(!state.allocator().contains_job(&next));
        assert_eq!(admitted(&state), [("big".to_owned(), 0)]);

        state
            .on_job_changed(&entity("big"), &job("big", 8, 1, false), Timestamp(12))
            .expect("created");
        state.cycle(Timestamp(12));
        assert_eq!(
            admitted(&state),
            [("big".to_owned(), 0), ("big".to_owned(), 1)]
        );
    }

    #[test]
    fn a_pending_explanation_is_not_queued_again_while_nothing_changed() {
        let mut state = state();
        state
            .on_job_changed(&entity("big"), &job("big", 16, 0, false), Timestamp(10))
            .expect("job");
        let report = state.cycle(Timestamp(10));
        assert_eq!(report.explanations_published, 1);
        assert_eq!(report.queue_depth["default"], 1);
        // 16 GPUs a worker, and the node has 8.
        assert_eq!(report.pending_by_reason, [("unschedulable", 1)].into());
        let report = state.cycle(Timestamp(11));
        assert_eq!(report.explanations_published, 0);
        assert_eq!(
            report.pending_by_reason,
            [("unschedulable", 1)].into(),
            "counted whether or not published"
        );
    }

    /// Pod affinity with a zone key: kube-scheduler would leave the workers
    /// pending on a node without a zone label, so they wait for one that has it.
    #[test]
    fn a_gang_kept_in_one_zone_waits_for_a_node_with_a_zone() {
        let mut state = state();
        let change: TrainingJobChanged = serde_json::from_value(json!({
            "change": "Applied",
            "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                       "metadata": {"name": "zoned", "namespace": "ml", "uid": "uid-zoned"},
                       "spec": {"model": "m", "dataset": "d", "numWorkers": 2, "gpusPerWorker": 2,
                                "scheduling": {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                                    {"labelSelector": {"matchLabels": {"trainyard.dev/job": "zoned"}},
                                     "topologyKey": "topology.kubernetes.io/zone"}]}}}}}
        }))
        .expect("job");
        state
            .on_job_changed(&entity("zoned"), &change, Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        assert!(admitted(&state).is_empty(), "n1 has no zone label");
        let why: Vec<&PendingExplained> = state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Pending { payload, .. } => Some(payload),
                _ => None,
            })
            .collect();
        assert!(
            why[0].message.contains(
                "none has the label topology.kubernetes.io/zone, which a pod affinity's \
                 topologyKey needs too"
            ),
            "{why:?}"
        );

        let zoned: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8,
            "labels": {"nvidia.com/gpu.product": "A100", "topology.kubernetes.io/zone": "z1"},
            "unschedulable": false, "ready": true
        }))
        .expect("node");
        state
            .on_node(&EntityRef::new("", "n2", ""), &zoned)
            .expect("node applies");
        state.cycle(Timestamp(20));
        let Some(Outgoing::Admission { payload, .. }) = state
            .outbox()
            .iter()
            .find(|o| matches!(o, Outgoing::Admission { .. }))
        else {
            panic!("admitted once a zoned node is there: {:?}", state.outbox());
        };
        assert!(
            payload.placements.iter().all(|p| p.node == "n2"),
            "{payload:?}"
        );
        assert_eq!(payload.topology["topology.kubernetes.io/zone"], "z1");
    }

    fn publish_all(state: &mut AllocatorState) {
        let ids: Vec<String> = state.outbox().iter().map(|o| o.id().to_string()).collect();
        for id in ids {
            state.published(&id);
        }
    }

    #[test]
    fn a_draining_queue_tells_its_jobs_to_checkpoint_then_holds_their_next_attempt() {
        let mut state = state();
        state
            .on_job_changed(&entity("runs"), &job("runs", 8, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        assert_eq!(admitted(&state), [("runs".to_string(), 0)]);
        publish_all(&mut state);

        set_default_queue(&mut state, "HoldAndDrain");
        let report = state.cycle(Timestamp(20));
        assert_eq!(report.drained_victims, 1);
        let notice = state.outbox().iter().find_map(|o| match o {
            Outgoing::Drain {
                entity, payload, ..
            } => Some((entity.name.clone(), payload.clone())),
            _ => None,
        });
        let Some((victim, notice)) = notice else {
            panic!("a drain notice: {:?}", state.outbox());
        };
        assert!(
            Outgoing::Drain {
                id: String::new(),
                entity: entity("runs"),
                payload: notice.clone(),
                decision: Drain {
                    queue: "default".into(),
                    victims: vec![],
                    decided_at: Timestamp(20),
                    evict_at: Timestamp(20),
                },
            }
            .is_decision(),
            "published once saved, as a preemption"
        );
        assert_eq!(victim, "runs");
        assert_eq!(notice.reason, "drain");
        assert_eq!(notice.preemptor, EntityRef::new("", "default", ""));
        assert!(
            notice.message.contains("HoldAndDrain"),
            "{}",
            notice.message
        );
        publish_all(&mut state);
        assert_eq!(state.cycle(Timestamp(21)).drained_victims, 0, "told once");

        let grace = state.config.grace_seconds;
        let report = state.cycle(Timestamp(20 + grace));
        assert_eq!(report.evictions_drained, 1);
        // The planner starts attempt 1, which waits while the queue drains.
        state
            .on_job_changed(
                &entity("runs"),
                &job("runs", 8, 1, false),
                Timestamp(20 + grace),
            )
            .expect("next attempt");
        state.cycle(Timestamp(21 + grace));
        let waits = state.outbox().iter().find_map(|o| match o {
            Outgoing::Pending { payload, .. } => Some(payload.message.clone()),
            _ => None,
        });
        assert!(
            waits
                .as_deref()
                .is_some_and(|m| m.contains("on hold (stopPolicy: HoldAndDrain)")),
            "{waits:?}"
        );
    }

    fn budget(state: BudgetState) -> trainyard_contracts::cost::BudgetStatusReported {
        trainyard_contracts::cost::BudgetStatusReported {
            state,
            period_start: chrono::DateTime::from_timestamp(1_795_000_000, 0).unwrap_or_default(),
            spent: 1012.5,
            amount: 1000.0,
            currency: "USD".into(),
            message: "101% of the Monthly budget spent".into(),
        }
    }

    fn pending_messages(state: &AllocatorState) -> Vec<String> {
        state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Pending { payload, .. } => Some(payload.message.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_held_budget_admits_no_new_job_lets_running_ones_run_and_is_released_when_open() {
        let mut state = state();
        state
            .on_job_changed(&entity("runs"), &job("runs", 4, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        publish_all(&mut state);
        let queue = EntityRef::new("", "default", "");
        state
            .on_budget(&queue, &budget(BudgetState::Held))
            .expect("budget");
        state
            .on_job_changed(&entity("waits"), &job("waits", 4, 0, false), Timestamp(20))
            .expect("job");
        let report = state.cycle(Timestamp(20));
        assert_eq!(
            (report.drained_victims, report.evictions_drained),
            (0, 0),
            "running jobs go on"
        );
        assert!(admitted(&state).is_empty(), "no new admission");
        let messages = pending_messages(&state);
        assert!(
            messages.iter().any(|m| m
                .contains("has spent its budget (spent 1012.50 of 1000.00 USD")
                && m.contains("kubectl patch trainingqueue default")
                && m.contains("admitted jobs run on")),
            "{messages:?}"
        );
        publish_all(&mut state);

        // A new spec of the queue keeps the cost-optimizer's hold.
        set_default_queue(&mut state, "None");
        state.cycle(Timestamp(30));
        assert!(admitted(&state).is_empty(), "still held");

        state
            .on_budget(&queue, &budget(BudgetState::Open))
            .expect("budget");
        state.cycle(Timestamp(40));
        assert_eq!(
            admitted(&state),
            [("waits".to_string(), 0)],
            "released when the budget is open again"
        );
    }

    #[test]
    fn a_suspending_budget_drains_the_queue_with_a_checkpoint_first() {
        let mut state = state();
        state
            .on_job_changed(&entity("runs"), &job("runs", 8, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        publish_all(&mut state);
        state
            .on_budget(
                &EntityRef::new("", "default", ""),
                &budget(BudgetState::Suspended),
            )
            .expect("budget");
        let report = state.cycle(Timestamp(20));
        assert_eq!(report.drained_victims, 1);
        let notice = state.outbox().iter().find_map(|o| match o {
            Outgoing::Drain { payload, .. } => Some(payload.clone()),
            _ => None,
        });
        let Some(notice) = notice else {
            panic!("a drain notice: {:?}", state.outbox());
        };
        assert_eq!(notice.reason, "drain");
        assert!(
            notice.message.contains("has spent its budget")
                && notice.message.contains("checkpoint now"),
            "{}",
            notice.message
        );
        let reports = queue_reports(&state);
        assert!(
            reports
                .iter()
                .any(|(name, r)| name == "default" && !r.active && r.reason == "BudgetSpent"),
            "{reports:?}"
        );
    }

    fn queue_reports(state: &AllocatorState) -> Vec<(String, QueueStatusReported)> {
        state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::QueueStatus {
                    entity, payload, ..
                } => Some((entity.name.clone(), payload.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_queue_is_reported_when_its_figures_change_at_most_every_interval() {
        let mut state = state();
        state
            .on_job_changed(&entity("runs"), &job("runs", 8, 0, false), Timestamp(10))
            .expect("job");
        state
            .on_job_changed(&entity("cpu"), &job("cpu", 0, 0, false), Timestamp(10))
            .expect("job");
        let report = state.cycle(Timestamp(10));
        assert_eq!(report.queue_reports, 1);
        let reports = queue_reports(&state);
        let [(queue, first)] = reports.as_slice() else {
            panic!("one report: {reports:?}");
        };
        assert_eq!(queue, "default");
        assert_eq!(
            (first.pending, first.admitted),
            (0, 2),
            "CPU-only jobs count"
        );
        assert_eq!(
            first.usage,
            [trainyard_contracts::decisions::ResourceUsage {
                flavor: "a100".into(),
                resource: "nvidia.com/gpu".into(),
                used: 8,
                borrowed: 0,
            }]
        );
        assert!(first.active && first.reason == "Ready");
        assert!(
            !Outgoing::QueueStatus {
                id: String::new(),
                entity: EntityRef::new("", "default", ""),
                payload: first.clone(),
            }
            .is_decision()
        );

        state
            .on_job_changed(&entity("waits"), &job("waits", 8, 0, false), Timestamp(11))
            .expect("job");
        let report = state.cycle(Timestamp(11));
        assert_eq!(report.queue_reports, 0, "within the interval");
        let report = state.cycle(Timestamp(12));
        assert_eq!(report.queue_reports, 1);
        let reports = queue_reports(&state);
        assert_eq!(reports.len(), 1, "the unpublished older report is replaced");
        assert_eq!((reports[0].1.pending, reports[0].1.admitted), (1, 2));
        let report = state.cycle(Timestamp(20));
        assert_eq!(report.queue_reports, 0, "nothing changed");

        set_default_queue(&mut state, "Hold");
        assert_eq!(state.cycle(Timestamp(22)).queue_reports, 1);
        let reports = queue_reports(&state);
        let held = &reports[0].1;
        assert!(!held.active);
        assert_eq!(held.reason, "Stopped");
        assert!(
            held.message.contains("stopPolicy is Hold"),
            "{}",
            held.message
        );
    }

    #[test]
    fn published_statuses_are_kept_for_the_pending_jobs_only() {
        let mut state = state();
        for name in ["j0", "j1", "j2"] {
            state
                .on_job_changed(&entity(name), &job(name, 8, 0, false), Timestamp(10))
                .expect("job");
        }
        let kept = |state: &AllocatorState| -> Vec<String> {
            let mut uids: Vec<String> = state.persisted().pending_status.into_keys().collect();
            uids.sort();
            uids
        };
        let report = state.cycle(Timestamp(10));
        assert_eq!((report.admissions, report.explanations_published), (1, 2));
        assert_eq!(kept(&state), ["uid-j1/a0", "uid-j2/a0"]);
        state
            .on_transition(&entity("j0"), &transition(TrainingJobState::Completed, 0))
            .expect("completion");
        let report = state.cycle(Timestamp(20));
        assert_eq!(report.admissions, 1);
        assert_eq!(kept(&state), ["uid-j2/a0"]);
        assert_eq!(report.queue_depth["default"], 1);
    }

    #[test]
    fn a_save_keeps_a_job_spec_once_and_restores_it_whole() {
        let mut state = state();
        for (name, suspend) in [("run", false), ("wait", false), ("held", true)] {
            state
                .on_job_changed(&entity(name), &job(name, 8, 0, suspend), Timestamp(10))
                .expect("job");
        }
        state.cycle(Timestamp(10));
        let persisted = state.persisted();
        let saved = serde_json::to_value(&persisted).expect("encode");
        // The allocator holds the running and the waiting job; the suspended
        // one's spec lives only in its record.
        assert_eq!(saved["jobs"]["ml/run"].get("template"), None);
        assert_eq!(saved["jobs"]["ml/wait"].get("template"), None);
        assert_eq!(saved["jobs"]["ml/held"]["template"]["name"], "held");
        let decoded: PersistedState = serde_json::from_value(saved.clone()).expect("decode");
        assert_eq!(decoded, persisted);

        // A save from before always has every template.
        let mut older = saved.clone();
        older["jobs"]["ml/run"]["template"] =
            serde_json::to_value(&persisted.jobs["ml/run"].template).expect("spec");
        let decoded: PersistedState = serde_json::from_value(older).expect("decode older");
        assert_eq!(decoded, persisted);

        // A template neither saved nor in the allocator is a clear error.
        let mut broken = saved;
        broken["allocator"]["jobs"] = json!([]);
        let err = serde_json::from_value::<PersistedState>(broken).expect_err("no template");
        assert!(err.to_string().contains("jobs[ml/run]"), "{err}");
    }

    #[test]
    fn a_snapshot_with_text_hashes_restores_and_explains_its_pending_jobs_once_more() {
        let mut state = state();
        state
            .on_job_changed(&entity("big"), &job("big", 16, 0, false), Timestamp(10))
            .expect("job");
        assert_eq!(state.cycle(Timestamp(10)).explanations_published, 1);
        let mut saved = serde_json::to_value(state.persisted()).expect("encode");
        let fields = saved.as_object_mut().expect("an object");
        fields.remove("pendingStatus");
        fields.insert("explained".into(), json!({"uid-big/a0": 42}));
        let persisted: PersistedState = serde_json::from_value(saved).expect("decode");
        let mut restored =
            AllocatorState::restore(AllocatorServiceConfig::default(), persisted).expect("restore");
        assert_eq!(restored.cycle(Timestamp(11)).explanations_published, 1);
        assert_eq!(restored.cycle(Timestamp(12)).explanations_published, 0);
    }

    /// Runs one 8-GPU job and queues 40 behind it, then completes the running
    /// one: the head is admitted and the 39 others move up by one. Returns
    /// the explanations published by the second cycle.
    fn republished_after_the_head_moves_on(explain_step_percent: u32) -> Vec<u32> {
        let mut state = state_with(AllocatorServiceConfig {
            explain_step_percent,
            ..AllocatorServiceConfig::default()
        });
        for index in 0..41 {
            let name = format!("j{index:02}");
            state
                .on_job_changed(&entity(&name), &job(&name, 8, 0, false), Timestamp(10))
                .expect("job");
        }
        let report = state.cycle(Timestamp(10));
        assert_eq!((report.admissions, report.explanations_published), (1, 40));
        let ids: Vec<String> = state.outbox().iter().map(|o| o.id().to_string()).collect();
        for id in &ids {
            state.published(id);
        }
        state
            .on_transition(&entity("j00"), &transition(TrainingJobState::Completed, 0))
            .expect("completion");
        let report = state.cycle(Timestamp(20));
        assert_eq!(report.admissions, 1);
        let positions: Vec<u32> = state
            .outbox()
            .iter()
            .filter_map(|o| match o {
                Outgoing::Pending { payload, .. } => Some(payload.position),
                _ => None,
            })
            .collect();
        assert_eq!(positions.len(), report.explanations_published);
        positions
    }

    #[test]
    fn a_moved_position_is_republished_near_the_head_and_every_tenth_deeper() {
        // Positions 2..=11 became 1..=10: a move of one is a tenth of 10.
        assert_eq!(
            republished_after_the_head_moves_on(10),
            (1..=10).collect::<Vec<_>>()
        );
        assert_eq!(
            republished_after_the_head_moves_on(0),
            (1..=39).collect::<Vec<_>>()
        );
    }

    #[test]
    fn cpu_only_jobs_are_admitted_once_without_placement() {
        let mut state = state();
        state
            .on_job_changed(&entity("cpu"), &job("cpu", 0, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        state
            .on_job_changed(&entity("cpu"), &job("cpu", 0, 0, false), Timestamp(11))
            .expect("again");
        state.cycle(Timestamp(11));
        assert_eq!(admitted(&state), [("cpu".to_string(), 0)]);
        let Some(Outgoing::Admission {
            payload, decision, ..
        }) = state.outbox().front()
        else {
            panic!("an admission first");
        };
        assert_eq!(payload.flavor, CPU_FLAVOR);
        assert!(payload.placements.is_empty());
        assert!(decision.is_none(), "nothing of it to replay in the core");
    }

    #[test]
    fn a_cpu_only_job_waits_while_its_queue_is_on_hold() {
        let mut state = state();
        set_default_queue(&mut state, "Hold");
        state
            .on_job_changed(&entity("cpu"), &job("cpu", 0, 0, false), Timestamp(10))
            .expect("job");
        let report = state.cycle(Timestamp(10));
        assert!(admitted(&state).is_empty(), "a held queue admits nothing");
        assert_eq!(report.pending, 1);
        set_default_queue(&mut state, "None");
        state.cycle(Timestamp(11));
        assert_eq!(admitted(&state), [("cpu".to_string(), 0)]);
    }

    #[test]
    fn a_restored_state_never_admits_twice() {
        let mut state = state();
        state
            .on_job_changed(&entity("a"), &job("a", 4, 0, false), Timestamp(10))
            .expect("job");
        state.cycle(Timestamp(10));
        assert_eq!(admitted(&state).len(), 1);
        let saved = serde_json::to_vec(&state.persisted()).expect("encode");
        let persisted: PersistedState = serde_json::from_slice(&saved).expect("decode");
        let mut restored =
            AllocatorState::restore(AllocatorServiceConfig::default(), persisted).expect("restore");
        // The unpublished admission is still in the outbox, to be republished
        // under the same id; the job is not admitted again.
        assert_eq!(admitted(&restored), [("a".to_string(), 0)]);
        let id = restored.outbox()[0].id().to_string();
        restored.published(&id);
        restored
            .on_job_changed(&entity("a"), &job("a", 4, 0, false), Timestamp(11))
            .expect("redelivered");
        restored.cycle(Timestamp(11));
        assert!(admitted(&restored).is_empty());
    }

    #[test]
    fn applied_stream_positions_survive_a_restore_and_mark_redeliveries() {
        let mut state = state();
        assert!(!state.already_applied("EVENTS", 1));
        state.note_applied("EVENTS", 7);
        state.note_applied("EVENTS", 5);
        state.note_applied("LIFECYCLE", 2);
        assert_eq!(
            state.applied_sequence("EVENTS"),
            7,
            "the highest one counts"
        );
        let restored =
            AllocatorState::restore(AllocatorServiceConfig::default(), state.persisted())
                .expect("restore");
        assert!(restored.already_applied("EVENTS", 7));
        assert!(!restored.already_applied("EVENTS", 8));
        assert!(restored.already_applied("LIFECYCLE", 2));
        assert!(
            !restored.already_applied("LIFECYCLE", 0),
            "0 = no position known"
        );
        assert!(!restored.already_applied("OTHER", 1));
    }

    #[test]
    fn deleted_jobs_are_forgotten() {
        let mut state = state();
        state
            .on_job_changed(&entity("a"), &job("a", 4, 0, false), Timestamp(10))
            .expect("job");
        let mut deleted = job("a", 4, 0, false);
        deleted.change = Change::Deleted;
        state
            .on_job_changed(&entity("a"), &deleted, Timestamp(11))
            .expect("deleted");
        assert!(state.job("ml", "a").is_none());
        assert!(
            !state
                .allocator()
                .contains_job(&JobUid::for_attempt("uid-a", 0))
        );
    }
}
