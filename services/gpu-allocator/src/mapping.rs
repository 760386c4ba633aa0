//! Pure mapping between Trainyard messages and the allocator core's events
//! and decisions. No I/O: everything here is unit-tested.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gpu_allocator_core::{
    Admission, AgingPolicy, BudgetHold, CapacityType, CpuMemory, Event, FlavorQuota, FlavorSpec,
    GpuSliceRequest, JobSpec, JobUid, NodeInfo, NodeKey, NodeOperator, NodeRequirement,
    NodeSelectorTerm, PendingReason, Preemption, PreemptionRule, QueuePreemption, QueueSpec,
    QueueUsage, ResourceQuota, Taint, TaintEffect, Timestamp, Toleration, TolerationOperator,
    TopologyRequirement, Victim, names,
};
use k8s_openapi::api::core::v1::ResourceRequirements;
use trainyard_api::quantity::{self, QuantityError};
use trainyard_api::{
    DEFAULT_AGING_STEP, ReclaimWithinCohort, TrainingJob, TrainingQueue, WithinQueuePreemption,
};
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::{
    AdmissionDecided, PendingExplained, PodPolicyRefusal, PreemptionDecided, QueueStatusReported,
    ResourceUsage, TolerationSpec, Unschedulable, WorkerPlacement,
};
use trainyard_contracts::events::{Change, NodeObserved, TrainingQueueChanged};
use trainyard_contracts::hash::fnv1a_parts;

use crate::config::{AllocatorServiceConfig, CapacityLabel};
use crate::error::ServiceError;

/// Weight given to a queue whose `fairShare.weight` is 0: it borrows last.
pub const ZERO_WEIGHT: f64 = 1e-6;

/// The allocator's preemption rights for a TrainingQueue's `preemption`
/// settings. `Any` also preempts for fair share: Kueue's fair sharing
/// preempts among borrowers with any priority too.
pub fn queue_preemption(
    within_queue: WithinQueuePreemption,
    reclaim: ReclaimWithinCohort,
) -> QueuePreemption {
    QueuePreemption {
        within_queue: within_queue == WithinQueuePreemption::LowerPriority,
        reclaim_within_cohort: reclaim != ReclaimWithinCohort::Never,
        reclaim_lower_priority_only: reclaim == ReclaimWithinCohort::LowerPriority,
        fair_share: reclaim == ReclaimWithinCohort::Any,
    }
}

/// `status.restartCount` of a TrainingJob, 0 when unset.
pub fn job_attempt(job: &TrainingJob) -> u32 {
    job.status
        .as_ref()
        .and_then(|s| s.restart_count)
        .unwrap_or(0)
}

fn taint_effect(object: &str, field: String, effect: &str) -> Result<TaintEffect, ServiceError> {
    match effect {
        "NoSchedule" => Ok(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Ok(TaintEffect::PreferNoSchedule),
        "NoExecute" => Ok(TaintEffect::NoExecute),
        other => Err(ServiceError::invalid(
            object,
            field,
            format!(
                "unknown effect {other:?} (expected NoSchedule, PreferNoSchedule or NoExecute)"
            ),
        )),
    }
}

/// A node event: upsert with its GPU resources and what pods Trainyard does
/// not manage hold of them (not the allocator's to give), or removal.
pub fn node_event(entity: &EntityRef, node: &NodeObserved) -> Result<Event, ServiceError> {
    let name = entity.name.clone();
    if node.change == Change::Deleted {
        return Ok(Event::NodeRemoved { name });
    }
    let object = format!("node {name}");
    let mig_resource = |profile: &str| {
        let profile = profile
            .strip_prefix(names::MIG_RESOURCE_PREFIX)
            .unwrap_or(profile);
        format!("{}{profile}", names::MIG_RESOURCE_PREFIX)
    };
    let mut allocatable = BTreeMap::new();
    allocatable.insert(
        names::GPU_RESOURCE.to_string(),
        node.allocatable_gpus.to_string(),
    );
    for (profile, count) in &node.mig {
        allocatable.insert(mig_resource(profile), count.to_string());
    }
    let mut used_by_other_pods: BTreeMap<String, u32> = node
        .mig_used_by_other_pods
        .iter()
        .map(|(profile, count)| (mig_resource(profile), *count))
        .collect();
    if node.gpus_used_by_other_pods > 0 {
        used_by_other_pods.insert(
            names::GPU_RESOURCE.to_string(),
            node.gpus_used_by_other_pods,
        );
    }
    let taints = node
        .taints
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Ok(Taint {
                key: t.key.clone(),
                value: t.value.clone().unwrap_or_default(),
                effect: taint_effect(&object, format!("taints[{i}].effect"), &t.effect)?,
            })
        })
        .collect::<Result<Vec<_>, ServiceError>>()?;
    // A node reporting one of CPU and memory is not limited by the other.
    let cpu_memory = (node.allocatable_cpu_millis.is_some()
        || node.allocatable_memory_bytes.is_some())
    .then(|| CpuMemory {
        cpu_millis: node.allocatable_cpu_millis.unwrap_or(u64::MAX),
        memory_bytes: node.allocatable_memory_bytes.unwrap_or(u64::MAX),
    });
    Ok(Event::NodeUpserted(NodeInfo {
        name,
        labels: node.labels.clone(),
        allocatable,
        taints,
        unschedulable: node.unschedulable,
        ready: node.ready,
        used_by_other_pods,
        cpu_memory,
        cpu_memory_used_by_other_pods: CpuMemory {
            cpu_millis: node.cpu_millis_used_by_other_pods,
            memory_bytes: node.memory_bytes_used_by_other_pods,
        },
    }))
}

/// What the adapter remembers of a TrainingQueue besides the core's view.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueInfo {
    /// `priority.defaultPriority`: priority of jobs without a PriorityClass.
    pub default_priority: i32,
    /// Flavors the queue defines by `nodeLabels`.
    pub flavors: Vec<FlavorSpec>,
}

/// A TrainingQueue event. The spec is checked against the CRD's rules first,
/// so a bad queue is rejected naming the field (`spec.flavors[0].lendingLimit`).
/// Per flavor, `nominalQuota` is the `nvidia.com/gpu` quota and each
/// `migQuotas[]` entry the quota of `nvidia.com/mig-<profile>`; the queue's own
/// aging (`priority.agingSeconds`, `agingStep`) is capped by the configured
/// `aging_max_boost`, and without `agingSeconds` the configured aging applies.
pub fn queue_event(
    config: &AllocatorServiceConfig,
    entity: &EntityRef,
    change: &TrainingQueueChanged,
) -> Result<(Event, Option<QueueInfo>), ServiceError> {
    let queue: &TrainingQueue = &change.object;
    let name = queue
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| entity.name.clone());
    if change.change == Change::Deleted {
        return Ok((Event::QueueRemoved { name }, None));
    }
    let spec = &queue.spec;
    if let Err(errors) = spec.validate() {
        let first = errors.first();
        return Err(ServiceError::invalid(
            format!("TrainingQueue {name}"),
            first
                .map(|e| e.path.clone())
                .unwrap_or_else(|| "spec".into()),
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    let quotas = spec
        .flavors
        .iter()
        .map(|f| FlavorQuota {
            flavor: f.name.clone(),
            resources: std::iter::once(ResourceQuota {
                resource: names::GPU_RESOURCE.to_string(),
                nominal: u64::from(f.nominal_quota),
                borrowing_limit: f.borrowing_limit.map(u64::from),
                lending_limit: f.lending_limit.map(u64::from),
            })
            .chain(f.mig_quotas.iter().map(|m| ResourceQuota {
                resource: format!("{}{}", names::MIG_RESOURCE_PREFIX, m.profile),
                nominal: u64::from(m.nominal_quota),
                borrowing_limit: m.borrowing_limit.map(u64::from),
                lending_limit: m.lending_limit.map(u64::from),
            }))
            .collect(),
        })
        .collect();
    let aging = spec.priority.as_ref().and_then(|p| {
        p.aging_seconds.map(|seconds| AgingPolicy {
            interval_secs: u64::from(seconds),
            step: p.aging_step.unwrap_or(DEFAULT_AGING_STEP),
            max_boost: config.aging_max_boost,
        })
    });
    let weight = spec.fair_share_weight();
    let core = QueueSpec {
        name,
        cohort: spec.cohort.clone(),
        weight: if weight > 0.0 { weight } else { ZERO_WEIGHT },
        quotas,
        preemption: queue_preemption(spec.within_queue_preemption(), spec.reclaim_within_cohort()),
        aging,
        namespaces: spec.namespaces.clone(),
        on_hold: spec.on_hold(),
        drain: spec.drains(),
        // Set from the cost-optimizer's reports (`AllocatorState::on_budget`).
        budget_hold: None,
        pod_policy: spec
            .pod_policy
            .as_ref()
            .map(trainyard_api::PodPolicy::rule)
            .unwrap_or_default(),
    };
    core.validate()?;
    let info = QueueInfo {
        default_priority: spec.default_priority(),
        flavors: spec
            .flavors
            .iter()
            .filter(|f| !f.node_labels.is_empty())
            .map(|f| FlavorSpec {
                name: f.name.clone(),
                node_labels: f.node_labels.clone(),
                ..FlavorSpec::default()
            })
            .collect(),
    };
    Ok((Event::QueueUpserted(core), Some(info)))
}

fn toleration(
    object: &str,
    index: usize,
    t: &TolerationLike<'_>,
) -> Result<Toleration, ServiceError> {
    let operator = match t.operator {
        None | Some("Equal") => TolerationOperator::Equal,
        Some("Exists") => TolerationOperator::Exists,
        Some(other) => {
            return Err(ServiceError::invalid(
                object,
                format!("spec.scheduling.tolerations[{index}].operator"),
                format!("unknown operator {other:?} (expected Equal or Exists)"),
            ));
        }
    };
    let effect = match t.effect {
        None | Some("") => None,
        Some(effect) => Some(taint_effect(
            object,
            format!("spec.scheduling.tolerations[{index}].effect"),
            effect,
        )?),
    };
    Ok(Toleration {
        key: t.key.filter(|k| !k.is_empty()).map(str::to_string),
        operator,
        value: t.value.map(str::to_string),
        effect,
    })
}

/// The job's required node-affinity terms in the core's model, each also
/// requiring the topology key of every required pod affinity term: nodes
/// without it are no place for the workers (`pod_affinity_keys`), so a gang
/// kept in one zone is never placed on a node without a zone label, where
/// its pods would stay pending.
fn node_affinity(
    object: &str,
    job: &TrainingJob,
    scheduling: &trainyard_api::SchedulingSpec,
) -> Result<Vec<NodeSelectorTerm>, ServiceError> {
    let mut keys: Vec<&str> = job.pod_affinity_keys().collect();
    keys.sort_unstable();
    keys.dedup();
    let labelled = keys.iter().map(|key| NodeRequirement {
        key: NodeKey::Label((*key).to_string()),
        operator: NodeOperator::Exists,
        values: Vec::new(),
    });
    let mut terms = node_selector_terms(object, scheduling)?;
    if terms.is_empty() && !keys.is_empty() {
        terms.push(NodeSelectorTerm::default());
    }
    for term in &mut terms {
        term.requirements.extend(labelled.clone());
    }
    Ok(terms)
}

/// `nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` in the
/// core's model.
fn node_selector_terms(
    object: &str,
    scheduling: &trainyard_api::SchedulingSpec,
) -> Result<Vec<NodeSelectorTerm>, ServiceError> {
    const FIELD: &str = "spec.scheduling.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    let terms = scheduling
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    terms
        .iter()
        .enumerate()
        .map(|(i, term)| {
            let expressions = term.match_expressions.iter().flatten().enumerate();
            let fields = term.match_fields.iter().flatten().enumerate();
            let mut requirements = Vec::new();
            for (j, e) in expressions {
                requirements.push(NodeRequirement {
                    key: NodeKey::Label(e.key.clone()),
                    operator: node_operator(
                        object,
                        format!("{FIELD}[{i}].matchExpressions[{j}].operator"),
                        &e.operator,
                    )?,
                    values: e.values.clone().unwrap_or_default(),
                });
            }
            for (j, f) in fields {
                if f.key != "metadata.name" {
                    return Err(ServiceError::invalid(
                        object,
                        format!("{FIELD}[{i}].matchFields[{j}].key"),
                        format!(
                            "unknown field {:?} (nodes can be matched on metadata.name only)",
                            f.key
                        ),
                    ));
                }
                requirements.push(NodeRequirement {
                    key: NodeKey::Name,
                    operator: node_operator(
                        object,
                        format!("{FIELD}[{i}].matchFields[{j}].operator"),
                        &f.operator,
                    )?,
                    values: f.values.clone().unwrap_or_default(),
                });
            }
            Ok(NodeSelectorTerm { requirements })
        })
        .collect()
}

fn node_operator(
    object: &str,
    field: String,
    operator: &str,
) -> Result<NodeOperator, ServiceError> {
    Ok(match operator {
        "In" => NodeOperator::In,
        "NotIn" => NodeOperator::NotIn,
        "Exists" => NodeOperator::Exists,
        "DoesNotExist" => NodeOperator::DoesNotExist,
        "Gt" => NodeOperator::Gt,
        "Lt" => NodeOperator::Lt,
        other => {
            return Err(ServiceError::invalid(
                object,
                field,
                format!(
                    "unknown operator {other:?} (expected In, NotIn, Exists, DoesNotExist, Gt or Lt)"
                ),
            ));
        }
    })
}

struct TolerationLike<'a> {
    key: Option<&'a str>,
    operator: Option<&'a str>,
    value: Option<&'a str>,
    effect: Option<&'a str>,
}

/// Resolves a job's priority: its PriorityClass from the configuration, else
/// its queue's default priority.
pub fn resolve_priority(
    config: &AllocatorServiceConfig,
    class: Option<&str>,
    queue_default: Option<i32>,
) -> i32 {
    class
        .and_then(|c| config.priority_classes.get(c).copied())
        .or(queue_default)
        .unwrap_or(0)
}

/// The allocator's view of one attempt of a TrainingJob. `queue_default` is
/// the default priority of the job's queue when the queue is known.
pub fn job_spec(
    config: &AllocatorServiceConfig,
    job: &TrainingJob,
    k8s_uid: &str,
    attempt: u32,
    queue_default: Option<i32>,
    now: Timestamp,
) -> Result<JobSpec, ServiceError> {
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let object = format!("TrainingJob {namespace}/{name}");
    let spec = &job.spec;
    let scheduling = spec.scheduling.clone().unwrap_or_default();
    let tolerations = scheduling
        .tolerations
        .iter()
        .enumerate()
        .map(|(i, t)| {
            toleration(
                &object,
                i,
                &TolerationLike {
                    key: t.key.as_deref(),
                    operator: t.operator.as_deref(),
                    value: t.value.as_deref(),
                    effect: t.effect.as_deref(),
                },
            )
        })
        .collect::<Result<Vec<_>, ServiceError>>()?;
    let mut node_selector = scheduling.node_selector.clone();
    let explicit = match spec.capacity_type() {
        trainyard_api::CapacityType::Spot => Some(CapacityType::Spot),
        trainyard_api::CapacityType::OnDemand => Some(CapacityType::OnDemand),
        trainyard_api::CapacityType::Any => None,
    };
    if let Some(label) = &config.capacity_type_label {
        match spec.capacity_type() {
            trainyard_api::CapacityType::Spot => {
                node_selector.insert(label.clone(), "spot".into());
            }
            trainyard_api::CapacityType::OnDemand => {
                node_selector.insert(label.clone(), "on-demand".into());
            }
            trainyard_api::CapacityType::Any => {}
        }
    }
    let gpu_slice = scheduling
        .mig_profile
        .clone()
        .filter(|p| !p.is_empty())
        .map(GpuSliceRequest::Profile);
    let submitted_at = job
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_second()).ok())
        .unwrap_or(now.0);
    let mut core = JobSpec {
        // Both follow from the attempt: `set_attempt` below.
        uid: JobUid::default(),
        earlier_restarts: 0,
        namespace,
        name,
        queue: scheduling.queue.clone(),
        priority: resolve_priority(config, scheduling.priority.as_deref(), queue_default),
        submitted_at: Timestamp(submitted_at),
        num_workers: spec.num_workers,
        gpus_per_worker: spec.gpus_per_worker(),
        // MIG slices are never time-sliced: a MIG request wins.
        allow_gpu_sharing: gpu_slice.is_none() && scheduling.allow_time_slicing.unwrap_or(false),
        gpu_slice,
        runtime_estimate_secs: scheduling.estimated_runtime_seconds.filter(|s| *s > 0),
        min_gpu_memory_mib: None,
        // Known from the attempt before, not from the object: the state sets it.
        last_preemptor: None,
        node_selector,
        tolerations,
        node_affinity: node_affinity(&object, job, &scheduling)?,
        topology: required_topology(&object, job, &config.rack_label)?,
        cpu_memory_per_worker: cpu_memory_per_worker(&object, spec.resources.as_ref())?,
        preemptible: true,
        one_worker_per_node: job.workers_one_per_node(),
        pod_requests: trainyard_api::pod_requests(spec),
    };
    if config.capacity_type_label.is_none()
        && let Some(capacity) = explicit
    {
        restrict_capacity(&mut core, &config.capacity_type_labels, capacity);
    }
    core.set_attempt(k8s_uid, attempt);
    // CPU-only jobs (gpusPerWorker 0) are admitted by the adapter itself; the
    // core only validates GPU jobs.
    if core.gpus_per_worker > 0 {
        core.validate()?;
    }
    Ok(core)
}

/// Keeps `spec` to nodes of `capacity`: spot is any of `labels` with a spot
/// value, on-demand none of them. ANDed into every term of the job's own
/// required node affinity.
pub fn restrict_capacity(spec: &mut JobSpec, labels: &[CapacityLabel], capacity: CapacityType) {
    if labels.is_empty() {
        return;
    }
    let requirement = |label: &CapacityLabel, operator| NodeRequirement {
        key: NodeKey::Label(label.label.clone()),
        operator,
        values: label.spot_values.clone(),
    };
    let capacity_terms: Vec<Vec<NodeRequirement>> = match capacity {
        CapacityType::Spot => labels
            .iter()
            .map(|l| vec![requirement(l, NodeOperator::In)])
            .collect(),
        CapacityType::OnDemand => vec![
            labels
                .iter()
                .map(|l| requirement(l, NodeOperator::NotIn))
                .collect(),
        ],
    };
    let own = std::mem::take(&mut spec.node_affinity);
    spec.node_affinity = if own.is_empty() {
        capacity_terms
            .into_iter()
            .map(|requirements| NodeSelectorTerm { requirements })
            .collect()
    } else {
        own.iter()
            .flat_map(|term| {
                capacity_terms.iter().map(move |extra| NodeSelectorTerm {
                    requirements: term.requirements.iter().chain(extra).cloned().collect(),
                })
            })
            .collect()
    };
}

/// The domain a required pod affinity among the job's own workers keeps
/// them in (`TrainingJob::workers_kept_within`): the narrowest whose key
/// the allocator knows (hostname, the configured rack label, zone). A key
/// it does not know leaves the gang spread as preferred; the planner then
/// leaves the workers unpinned, to the scheduler.
fn required_topology(
    object: &str,
    job: &TrainingJob,
    rack_label: &str,
) -> Result<TopologyRequirement, ServiceError> {
    let keys: Vec<&str> = job.workers_kept_within().collect();
    let required = if keys.contains(&names::HOSTNAME_LABEL) {
        TopologyRequirement::SameNode
    } else if keys.contains(&rack_label) {
        TopologyRequirement::SameRack
    } else if keys.contains(&names::ZONE_LABEL) {
        TopologyRequirement::SameZone
    } else {
        TopologyRequirement::Preferred
    };
    let workers = job.spec.num_workers;
    if required == TopologyRequirement::SameNode && workers > 1 && job.workers_one_per_node() {
        return Err(ServiceError::invalid(
            object,
            "spec.scheduling.affinity",
            format!(
                "podAffinity keeps the {workers} workers on one node and podAntiAffinity keeps \
                 them on separate nodes (both on topologyKey {}): no node can take them; drop one \
                 of the two terms",
                names::HOSTNAME_LABEL
            ),
        ));
    }
    Ok(required)
}

/// The CPU and memory a worker requests (`spec.resources`): its requests,
/// or its limits where it states no request (the API server defaults
/// requests to limits).
fn cpu_memory_per_worker(
    object: &str,
    resources: Option<&ResourceRequirements>,
) -> Result<CpuMemory, ServiceError> {
    let Some(resources) = resources else {
        return Ok(CpuMemory::default());
    };
    let amount = |name: &str, parse: fn(&str) -> Result<u64, QuantityError>| {
        let Some((list, _, quantity)) = quantity::requested(resources).find(|(_, n, _)| *n == name)
        else {
            return Ok(0);
        };
        parse(&quantity.0).map_err(|err| {
            ServiceError::invalid(
                object,
                format!("spec.resources.{list}.{name}"),
                err.to_string(),
            )
        })
    };
    Ok(CpuMemory {
        cpu_millis: amount("cpu", quantity::cpu_millis)?,
        memory_bytes: amount("memory", quantity::bytes)?,
    })
}

fn operator_name(op: TolerationOperator) -> &'static str {
    match op {
        TolerationOperator::Equal => "Equal",
        TolerationOperator::Exists => "Exists",
    }
}

fn effect_name(effect: TaintEffect) -> &'static str {
    match effect {
        TaintEffect::NoSchedule => "NoSchedule",
        TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        TaintEffect::NoExecute => "NoExecute",
    }
}

/// A core toleration as the planner injects it.
pub fn toleration_spec(t: &Toleration) -> TolerationSpec {
    TolerationSpec {
        key: t.key.clone().unwrap_or_default(),
        operator: operator_name(t.operator).to_string(),
        value: t.value.clone(),
        effect: t.effect.map(|e| effect_name(e).to_string()),
    }
}

/// The labels every worker's selector shares, without the per-node hostname:
/// an Indexed Job has one pod template, so only common labels can be injected.
pub fn common_selector(admission: &Admission) -> BTreeMap<String, String> {
    let mut workers = admission.workers.iter();
    let Some(first) = workers.next() else {
        return BTreeMap::new();
    };
    let mut common = first.node_selector.clone();
    common.remove(names::HOSTNAME_LABEL);
    for worker in workers {
        common.retain(|k, v| worker.node_selector.get(k) == Some(v));
    }
    common
}

/// An admission as the planner consumes it.
pub fn admission_decided(admission: &Admission, attempt: u32) -> AdmissionDecided {
    let mut topology = BTreeMap::new();
    if let Some(zone) = &admission.topology.zone {
        topology.insert(names::ZONE_LABEL.to_string(), zone.clone());
    }
    if let Some(rack) = &admission.topology.rack {
        topology.insert(admission.topology.rack_label.clone(), rack.clone());
    }
    AdmissionDecided {
        attempt,
        queue: admission.queue.clone(),
        flavor: admission.flavor.clone(),
        node_selector: common_selector(admission),
        tolerations: admission.tolerations.iter().map(toleration_spec).collect(),
        placements: admission
            .workers
            .iter()
            .map(|w| WorkerPlacement {
                index: w.index,
                node: w.node.clone(),
                gpus: admission.units_per_worker,
            })
            .collect(),
        topology,
        capacity_type_reopened: false,
    }
}

/// Deduplication id of an admission: one per attempt.
pub fn admission_id(uid: &JobUid) -> String {
    format!("admission:{uid}")
}

/// Deduplication id of a preemption: one per victim and preemptor.
pub fn preemption_id(victim: &JobUid, preemptor: &JobUid) -> String {
    format!("preemption:{victim}:{preemptor}")
}

/// Deduplication id of a pending explanation: the job, what the message
/// says and the cycle that made it. A redelivery is dropped; the job's next
/// explanation goes through even when it says again what one before the
/// last said (A, B, then A within the duplicate window).
pub fn pending_id(uid: &JobUid, payload: &PendingExplained, at: Timestamp) -> String {
    let hash = fnv1a_parts(&[
        payload.queue.as_bytes(),
        &payload.position.to_le_bytes(),
        payload.flavor.as_deref().unwrap_or_default().as_bytes(),
        &payload.gpus_requested.to_le_bytes(),
        &payload.gpus_short.to_le_bytes(),
        payload.message.as_bytes(),
        &at.0.to_le_bytes(),
    ]);
    format!("pending:{hash:016x}:{uid}")
}

/// Deduplication id of a queue's status report: the queue, what the report
/// says and the cycle that made it, as for [`pending_id`].
pub fn queue_status_id(queue: &str, payload: &QueueStatusReported, at: Timestamp) -> String {
    // Field order is fixed, so the encoding is too.
    let encoded = serde_json::to_vec(payload).unwrap_or_default();
    let hash = fnv1a_parts(&[&encoded, &at.0.to_le_bytes()]);
    format!("queue-status:{hash:016x}:{queue}")
}

/// The status report of one queue, with `cpu_admitted` CPU-only jobs (the
/// core never sees them) counted as admitted.
pub fn queue_status_reported(usage: &QueueUsage, cpu_admitted: u32) -> QueueStatusReported {
    let (reason, message) = if usage.drains {
        (
            QUEUE_STOPPED,
            "stopPolicy is HoldAndDrain: the queue admits no job until it is set back to None; \
             its admitted jobs checkpoint, stop and wait in line",
        )
    } else if usage.on_hold {
        (
            QUEUE_STOPPED,
            "stopPolicy is Hold: the queue admits no job until it is set back to None; admitted jobs run on",
        )
    } else if let Some(budget) = &usage.budget_hold {
        (
            QUEUE_BUDGET_SPENT,
            if budget.drains {
                "the budget is spent (action SuspendWithCheckpoint): the queue admits no job and its \
                 admitted jobs checkpoint, stop and wait in line until the next period or a raised spec.budget.amount"
            } else {
                "the budget is spent (action Hold): the queue admits no job until the next period or a \
                 raised spec.budget.amount; admitted jobs run on"
            },
        )
    } else {
        (QUEUE_READY, "the queue admits jobs")
    };
    // `as` saturates: a zero-weight queue that borrows has a huge share.
    let weighted_share = (usage.weighted_share * 1000.0).round() as u64;
    QueueStatusReported {
        pending: usage.pending,
        admitted: usage.admitted.saturating_add(cpu_admitted),
        usage: usage
            .resources
            .iter()
            .map(|r| ResourceUsage {
                flavor: r.flavor.clone(),
                resource: r.resource.clone(),
                used: r.used,
                borrowed: r.borrowed,
            })
            .collect(),
        weighted_share,
        active: !usage.on_hold && usage.budget_hold.is_none(),
        reason: reason.to_string(),
        message: message.to_string(),
    }
}

/// Reason of a queue that admits jobs.
pub const QUEUE_READY: &str = "Ready";
/// Reason of a queue whose `stopPolicy` is Hold.
pub const QUEUE_STOPPED: &str = "Stopped";
/// Reason of a queue whose budget is spent.
pub const QUEUE_BUDGET_SPENT: &str = "BudgetSpent";

/// The entity a decision about a job is published for: namespace, name and
/// the Kubernetes uid (without the attempt).
pub fn job_entity(namespace: &str, name: &str, uid: &JobUid) -> EntityRef {
    let k8s_uid = uid.attempt().map(|(u, _)| u).unwrap_or(uid.as_str());
    EntityRef::new(namespace, name, k8s_uid)
}

fn timestamp_to_utc(at: Timestamp) -> DateTime<Utc> {
    i64::try_from(at.0)
        .ok()
        .and_then(|secs| DateTime::from_timestamp(secs, 0))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// One victim's preemption notice.
pub fn preemption_decided(
    preemption: &Preemption,
    victim: &Victim,
    preemptor: EntityRef,
    grace_seconds: u64,
) -> PreemptionDecided {
    let (reason, rule) = match victim.rule {
        PreemptionRule::LowerPriority => ("priority", "a higher-priority job of the same queue"),
        PreemptionRule::ReclaimQuota => ("reclaim", "its queue reclaims quota lent to the cohort"),
        PreemptionRule::FairShare => ("reclaim", "the cohort's fair share moves GPUs to its queue"),
        PreemptionRule::Drain => {
            return drain_decided(preemption.evict_at, victim, grace_seconds, None);
        }
    };
    PreemptionDecided {
        message: format!(
            "{} needs {} {} of flavor {} ({rule}); checkpoint now, workers are evicted after the grace period",
            preemptor.key(),
            victim.units,
            preemption.resource,
            preemption.flavor,
        ),
        preemptor,
        reason: reason.to_string(),
        grace_period_seconds: u32::try_from(grace_seconds).unwrap_or(u32::MAX),
        evict_after: timestamp_to_utc(preemption.evict_at),
    }
}

/// One victim's notice that its queue drains (`stopPolicy: HoldAndDrain`,
/// or a spent budget's `budget` hold that suspends). The preemptor named is
/// the TrainingQueue (cluster-scoped, no namespace).
pub fn drain_decided(
    evict_at: Timestamp,
    victim: &Victim,
    grace_seconds: u64,
    budget: Option<&BudgetHold>,
) -> PreemptionDecided {
    let cause = match budget.filter(|b| b.drains) {
        Some(budget) => format!(
            "has spent its budget ({}, action SuspendWithCheckpoint)",
            budget.spend
        ),
        None => "is set to stopPolicy HoldAndDrain".to_owned(),
    };
    PreemptionDecided {
        message: format!(
            "TrainingQueue {} {cause}; checkpoint now, workers are evicted after the grace period \
             and the job waits in line until the queue admits jobs again",
            victim.queue
        ),
        preemptor: EntityRef::new("", &victim.queue, ""),
        reason: "drain".to_string(),
        grace_period_seconds: u32::try_from(grace_seconds).unwrap_or(u32::MAX),
        evict_after: timestamp_to_utc(evict_at),
    }
}

/// Deduplication id of a drain notice: one per victim and queue.
pub fn drain_id(victim: &JobUid, queue: &str) -> String {
    format!("drain:{victim}:{queue}")
}

fn reason_flavor(reason: &PendingReason) -> Option<String> {
    match reason {
        PendingReason::QuotaExceeded { flavor, .. }
        | PendingReason::InsufficientCapacity { flavor, .. }
        | PendingReason::HeldForReservation { flavor, .. }
        | PendingReason::Unschedulable { flavor, .. } => Some(flavor.clone()),
        PendingReason::QueueNotFound { .. }
        | PendingReason::QueueOnHold { .. }
        | PendingReason::BudgetSpent { .. }
        | PendingReason::NamespaceNotAdmitted { .. }
        | PendingReason::PodPolicyRefused { .. }
        | PendingReason::NoMatchingFlavor { .. }
        | PendingReason::AwaitingPreemption { .. } => None,
    }
}

/// Why a job waits, as the planner writes it into the job's status.
pub fn pending_explained(
    attempt: Option<u32>,
    queue: &str,
    position: u32,
    reason: &PendingReason,
    gpus_requested: u32,
) -> PendingExplained {
    let short = reason.shortfall();
    let gpus_short = if short == u64::MAX {
        gpus_requested
    } else {
        u32::try_from(short).unwrap_or(u32::MAX)
    };
    PendingExplained {
        attempt,
        queue: queue.to_string(),
        position,
        flavor: reason_flavor(reason),
        gpus_requested,
        gpus_short,
        // The position and queue travel in their own fields (the planner's
        // condition leads with them), so the message is why the job waits.
        message: reason.to_string(),
        unschedulable: unschedulable(reason),
        pod_policy: match reason {
            PendingReason::PodPolicyRefused {
                field, detail, fix, ..
            } => Some(Box::new(PodPolicyRefusal {
                field: field.clone(),
                detail: detail.clone(),
                fix: fix.clone(),
            })),
            _ => None,
        },
    }
}

/// The typed half of an unschedulable job's explanation.
fn unschedulable(reason: &PendingReason) -> Option<Box<Unschedulable>> {
    match reason {
        PendingReason::Unschedulable {
            cause,
            resource,
            largest_node,
            largest_node_units,
            detail,
            fix,
            ..
        } => Some(Box::new(Unschedulable {
            field: cause.field().to_string(),
            largest_node: largest_node.clone(),
            largest_node_gpus: *largest_node_units,
            resource: resource.clone(),
            detail: detail.clone(),
            fix: fix.clone(),
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use gpu_allocator_core::{TopologyAssignment, WorkerPlacement as CorePlacement};
    use serde_json::json;
    use trainyard_contracts::events::Taint as NodeTaint;

    use super::*;

    fn config() -> AllocatorServiceConfig {
        AllocatorServiceConfig::default()
    }

    fn node(gpus: u32) -> NodeObserved {
        NodeObserved {
            change: Change::Applied,
            allocatable_gpus: gpus,
            mig: [("1g.10gb".to_string(), 7)].into(),
            labels: [("nvidia.com/gpu.product".to_string(), "A100".to_string())].into(),
            taints: vec![NodeTaint {
                key: "nvidia.com/gpu".into(),
                value: None,
                effect: "NoSchedule".into(),
            }],
            unschedulable: true,
            ready: true,
            gpus_used_by_other_pods: 0,
            mig_used_by_other_pods: BTreeMap::new(),
            allocatable_cpu_millis: None,
            allocatable_memory_bytes: None,
            cpu_millis_used_by_other_pods: 0,
            memory_bytes_used_by_other_pods: 0,
        }
    }

    #[test]
    fn node_maps_gpu_and_mig_counts_taints_and_flags() {
        let entity = EntityRef::new("", "gpu-1", "");
        let Event::NodeUpserted(info) = node_event(&entity, &node(8)).expect("maps") else {
            panic!("expected NodeUpserted");
        };
        assert_eq!(info.name, "gpu-1");
        assert_eq!(info.allocatable["nvidia.com/gpu"], "8");
        assert_eq!(info.allocatable["nvidia.com/mig-1g.10gb"], "7");
        assert_eq!(info.taints[0].effect, TaintEffect::NoSchedule);
        assert_eq!(info.taints[0].value, "");
        assert!(info.unschedulable && info.ready);
        let deleted = NodeObserved {
            change: Change::Deleted,
            ..node(8)
        };
        assert_eq!(
            node_event(&entity, &deleted).expect("maps"),
            Event::NodeRemoved {
                name: "gpu-1".into()
            }
        );
    }

    #[test]
    fn units_other_pods_hold_go_to_the_core_beside_the_allocatable_ones() {
        let entity = EntityRef::new("", "gpu-1", "");
        let shared = NodeObserved {
            gpus_used_by_other_pods: 3,
            mig_used_by_other_pods: [("1g.10gb".to_string(), 2)].into(),
            ..node(8)
        };
        let Event::NodeUpserted(info) = node_event(&entity, &shared).expect("maps") else {
            panic!("expected NodeUpserted");
        };
        assert_eq!(info.allocatable["nvidia.com/gpu"], "8");
        assert_eq!(
            info.used_by_other_pods,
            [
                ("nvidia.com/gpu".to_string(), 3),
                ("nvidia.com/mig-1g.10gb".to_string(), 2)
            ]
            .into()
        );
        let Event::NodeUpserted(info) = node_event(&entity, &node(8)).expect("maps") else {
            panic!("expected NodeUpserted");
        };
        assert!(info.used_by_other_pods.is_empty());
    }

    #[test]
    fn cpu_and_memory_of_a_node_and_of_other_pods_go_to_the_core() {
        let entity = EntityRef::new("", "gpu-1", "");
        let upserted = |node: &NodeObserved| match node_event(&entity, node).expect("maps") {
            Event::NodeUpserted(info) => info,
            other => panic!("expected NodeUpserted, got {other:?}"),
        };
        let info = upserted(&NodeObserved {
            allocatable_cpu_millis: Some(64_000),
            allocatable_memory_bytes: Some(512 << 30),
            cpu_millis_used_by_other_pods: 2_500,
            memory_bytes_used_by_other_pods: 1 << 30,
            ..node(8)
        });
        assert_eq!(
            info.cpu_memory,
            Some(CpuMemory {
                cpu_millis: 64_000,
                memory_bytes: 512 << 30
            })
        );
        assert_eq!(
            info.cpu_memory_used_by_other_pods,
            CpuMemory {
                cpu_millis: 2_500,
                memory_bytes: 1 << 30
            }
        );
        assert_eq!(upserted(&node(8)).cpu_memory, None, "reports neither");
        let cpu_only = upserted(&NodeObserved {
            allocatable_cpu_millis: Some(8_000),
            ..node(8)
        });
        assert_eq!(
            cpu_only.cpu_memory.map(|c| (c.cpu_millis, c.memory_bytes)),
            Some((8_000, u64::MAX)),
            "memory it does not report does not limit it"
        );
    }

    #[test]
    fn node_with_unknown_taint_effect_names_the_field() {
        let mut bad = node(8);
        bad.taints[0].effect = "Sometimes".into();
        let err = node_event(&EntityRef::new("", "gpu-1", ""), &bad).expect_err("rejected");
        assert!(err.to_string().contains("taints[0].effect"), "{err}");
    }

    fn queue(spec: serde_json::Value) -> TrainingQueueChanged {
        serde_json::from_value(json!({
            "change": "Applied",
            "object": {
                "apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                "metadata": {"name": "team-a"},
                "spec": spec,
            }
        }))
        .expect("queue parses")
    }

    #[test]
    fn reclaim_within_cohort_maps_to_the_core_rules() {
        // (reclaim, only from lower priorities, fair share) per setting.
        for (setting, expected) in [
            (json!({}), (false, false, false)),
            (
                json!({"reclaimWithinCohort": "Never"}),
                (false, false, false),
            ),
            (
                json!({"reclaimWithinCohort": "LowerPriority"}),
                (true, true, false),
            ),
            (json!({"reclaimWithinCohort": "Any"}), (true, false, true)),
        ] {
            let change = queue(json!({
                "flavors": [{"name": "a100", "nominalQuota": 8}],
                "preemption": setting.clone(),
            }));
            let (event, _) =
                queue_event(&config(), &EntityRef::new("", "team-a", ""), &change).expect("maps");
            let Event::QueueUpserted(spec) = event else {
                panic!("expected QueueUpserted")
            };
            let p = spec.preemption;
            assert_eq!(
                (
                    p.reclaim_within_cohort,
                    p.reclaim_lower_priority_only,
                    p.fair_share
                ),
                expected,
                "{setting}"
            );
        }
    }

    #[test]
    fn queue_maps_quotas_cohort_weight_preemption_and_flavors() {
        let change = queue(json!({
            "cohort": "research",
            "flavors": [
                {"name": "a100", "nominalQuota": 16, "borrowingLimit": 8, "lendingLimit": 4,
                 "nodeLabels": {"nvidia.com/gpu.product": "A100"}},
                {"name": "t4", "nominalQuota": 8}
            ],
            "fairShare": {"weight": 0},
            "preemption": {"withinQueue": "LowerPriority", "reclaimWithinCohort": "Any"},
            "priority": {"defaultPriority": 5},
            "namespaces": ["research", "research-dev"],
            "stopPolicy": "Hold"
        }));
        let (event, info) =
            queue_event(&config(), &EntityRef::new("", "team-a", ""), &change).expect("maps");
        let Event::QueueUpserted(spec) = event else {
            panic!("expected QueueUpserted")
        };
        assert_eq!(spec.name, "team-a");
        assert_eq!(spec.cohort.as_deref(), Some("research"));
        assert_eq!(spec.weight, ZERO_WEIGHT);
        assert_eq!(spec.quotas[0].resources[0].nominal, 16);
        assert_eq!(spec.quotas[0].resources[0].borrowing_limit, Some(8));
        assert_eq!(spec.quotas[0].resources[0].lending_limit, Some(4));
        assert!(spec.preemption.within_queue && spec.preemption.reclaim_within_cohort);
        assert!(spec.preemption.fair_share);
        assert!(!spec.preemption.reclaim_lower_priority_only);
        let info = info.expect("info");
        assert_eq!(info.default_priority, 5);
        assert_eq!(
            info.flavors.len(),
            1,
            "only flavors with node labels are learned"
        );
        assert_eq!(info.flavors[0].name, "a100");
        assert_eq!(spec.aging, None, "no agingSeconds: the configured aging");
        assert_eq!(spec.namespaces, ["research", "research-dev"]);
        assert!(spec.admits_namespace("research-dev") && !spec.admits_namespace("prod"));
        assert!(spec.on_hold && !spec.drain);
        let mut draining = change.clone();
        draining.object.spec.stop_policy = Some(trainyard_api::StopPolicy::HoldAndDrain);
        let (event, _) =
            queue_event(&config(), &EntityRef::new("", "team-a", ""), &draining).expect("maps");
        let Event::QueueUpserted(spec) = event else {
            panic!("expected QueueUpserted")
        };
        assert!(spec.on_hold && spec.drain, "HoldAndDrain holds and drains");
    }

    #[test]
    fn queue_maps_mig_quotas_per_profile_and_its_own_aging() {
        let change = queue(json!({
            "cohort": "research",
            "flavors": [
                {"name": "a100-mig", "nominalQuota": 0,
                 "migQuotas": [
                     {"profile": "1g.10gb", "nominalQuota": 14, "borrowingLimit": 7},
                     {"profile": "3g.40gb", "nominalQuota": 2, "lendingLimit": 1}
                 ]}
            ],
            "priority": {"agingSeconds": 300, "agingStep": 10}
        }));
        let config = AllocatorServiceConfig {
            aging_max_boost: 500,
            ..config()
        };
        let (event, _) =
            queue_event(&config, &EntityRef::new("", "team-a", ""), &change).expect("maps");
        let Event::QueueUpserted(spec) = event else {
            panic!("expected QueueUpserted")
        };
        let resources: Vec<(&str, u64, Option<u64>, Option<u64>)> = spec.quotas[0]
            .resources
            .iter()
            .map(|r| {
                (
                    r.resource.as_str(),
                    r.nominal,
                    r.borrowing_limit,
                    r.lending_limit,
                )
            })
            .collect();
        assert_eq!(
            resources,
            [
                ("nvidia.com/gpu", 0, None, None),
                ("nvidia.com/mig-1g.10gb", 14, Some(7), None),
                ("nvidia.com/mig-3g.40gb", 2, None, Some(1)),
            ]
        );
        assert_eq!(
            spec.aging,
            Some(AgingPolicy {
                interval_secs: 300,
                step: 10,
                max_boost: 500,
            })
        );
        let default_step = queue(json!({
            "flavors": [{"name": "a100", "nominalQuota": 8}],
            "priority": {"agingSeconds": 60}
        }));
        let (event, _) =
            queue_event(&config, &EntityRef::new("", "team-a", ""), &default_step).expect("maps");
        let Event::QueueUpserted(spec) = event else {
            panic!("expected QueueUpserted")
        };
        assert_eq!(spec.aging.map(|a| (a.interval_secs, a.step)), Some((60, 1)));
    }

    #[test]
    fn queue_with_a_bad_mig_profile_names_the_field() {
        let change = queue(json!({
            "flavors": [{"name": "a100", "nominalQuota": 0,
                         "migQuotas": [{"profile": "nvidia.com/mig-1g.10gb", "nominalQuota": 7}]}]
        }));
        let err = queue_event(&config(), &EntityRef::new("", "team-a", ""), &change)
            .expect_err("rejected");
        assert!(
            err.to_string()
                .contains("spec.flavors[0].migQuotas[0].profile"),
            "{err}"
        );
    }

    #[test]
    fn bad_queue_spec_names_the_field() {
        let change = queue(json!({
            "cohort": "research",
            "flavors": [{"name": "a100", "nominalQuota": 4, "lendingLimit": 8}]
        }));
        let err = queue_event(&config(), &EntityRef::new("", "team-a", ""), &change)
            .expect_err("rejected");
        assert!(
            err.to_string().contains("spec.flavors[0].lendingLimit"),
            "{err}"
        );
    }

    fn training_job(scheduling: serde_json::Value, restart_count: Option<u32>) -> TrainingJob {
        serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
            "metadata": {"name": "bert", "namespace": "ml", "uid": "u-1",
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"model": "bert", "dataset": "wiki", "numWorkers": 4, "gpusPerWorker": 2,
                     "scheduling": scheduling},
            "status": {"restartCount": restart_count},
        }))
        .expect("job parses")
    }

    fn job_with_resources(resources: serde_json::Value) -> Result<JobSpec, ServiceError> {
        let mut job = training_job(json!({}), None);
        job.spec.resources = Some(serde_json::from_value(resources).expect("resources parse"));
        job_spec(&config(), &job, "u-1", 0, None, Timestamp(0))
    }

    #[test]
    fn a_workers_cpu_and_memory_are_its_requests_or_else_its_limits() {
        let spec = job_with_resources(json!({
            "requests": {"cpu": "7500m", "memory": "60Gi"},
            "limits": {"cpu": "16", "memory": "64Gi"}
        }))
        .expect("maps");
        assert_eq!(
            spec.cpu_memory_per_worker,
            CpuMemory {
                cpu_millis: 7_500,
                memory_bytes: 60 << 30
            }
        );
        let limits_only =
            job_with_resources(json!({"limits": {"cpu": "4", "memory": "1G"}})).expect("maps");
        assert_eq!(
            limits_only.cpu_memory_per_worker,
            CpuMemory {
                cpu_millis: 4_000,
                memory_bytes: 1_000_000_000
            }
        );
        let none = job_spec(
            &config(),
            &training_job(json!({}), None),
            "u-1",
            0,
            None,
            Timestamp(0),
        )
        .expect("maps");
        assert!(none.cpu_memory_per_worker.is_zero());
        let err = job_with_resources(json!({"requests": {"memory": "64GB"}}))
            .expect_err("not a quantity");
        assert!(
            err.to_string().contains("spec.resources.requests.memory")
                && err.to_string().contains("16Gi"),
            "{err}"
        );
    }

    #[test]
    fn job_maps_attempt_uid_priority_and_scheduling() {
        let config = AllocatorServiceConfig {
            priority_classes: [("high-priority".to_string(), 1000)].into(),
            capacity_type_label: Some("karpenter.sh/capacity-type".into()),
            ..AllocatorServiceConfig::default()
        };
        let job = training_job(
            json!({"priority": "high-priority", "queue": "team-a",
                   "nodeSelector": {"disk": "ssd"}, "capacityType": "spot",
                   "migProfile": "1g.10gb", "allowTimeSlicing": true,
                   "estimatedRuntimeSeconds": 3600,
                   "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}),
            Some(3),
        );
        assert_eq!(job_attempt(&job), 3);
        let spec = job_spec(&config, &job, "u-1", 3, Some(7), Timestamp(99)).expect("maps");
        assert_eq!(spec.uid.as_str(), "u-1/a3");
        assert_eq!(spec.uid.attempt(), Some(("u-1", 3)));
        assert_eq!(spec.earlier_restarts, 3, "victim searches count them");
        assert_eq!(spec.priority, 1000);
        assert_eq!(spec.queue.as_deref(), Some("team-a"));
        assert_eq!(spec.submitted_at, Timestamp(1_704_067_200));
        assert_eq!((spec.num_workers, spec.gpus_per_worker), (4, 2));
        assert_eq!(
            spec.gpu_slice,
            Some(GpuSliceRequest::Profile("1g.10gb".into()))
        );
        assert!(!spec.allow_gpu_sharing, "MIG wins over time slicing");
        assert_eq!(spec.runtime_estimate_secs, Some(3600));
        assert_eq!(spec.node_selector["karpenter.sh/capacity-type"], "spot");
        assert_eq!(spec.node_selector["disk"], "ssd");
        assert_eq!(spec.tolerations[0].operator, TolerationOperator::Exists);
        let plain = training_job(json!({}), None);
        assert_eq!(job_attempt(&plain), 0);
        let spec = job_spec(&config, &plain, "u-1", 0, Some(7), Timestamp(99)).expect("maps");
        assert_eq!(spec.priority, 7, "queue default without a PriorityClass");
        assert_eq!(spec.queue, None, "the configured default queue applies");
        assert_eq!(spec.earlier_restarts, 0);
        assert!(!spec.one_worker_per_node);
        let apart = training_job(
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"training-job": "bert"}},
                 "topologyKey": "kubernetes.io/hostname"}]}}}),
            None,
        );
        let spec = job_spec(&config, &apart, "u-1", 0, None, Timestamp(99)).expect("maps");
        assert!(spec.one_worker_per_node, "its workers keep apart");

        let zoned = training_job(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}]}}}}),
            None,
        );
        let spec = job_spec(&config, &zoned, "u-1", 0, None, Timestamp(99)).expect("maps");
        assert_eq!(
            spec.node_affinity,
            vec![
                NodeSelectorTerm {
                    requirements: vec![NodeRequirement {
                        key: NodeKey::Label("topology.kubernetes.io/zone".into()),
                        operator: NodeOperator::In,
                        values: vec!["z1".into()],
                    }]
                },
                NodeSelectorTerm {
                    requirements: vec![NodeRequirement {
                        key: NodeKey::Name,
                        operator: NodeOperator::In,
                        values: vec!["gpu-7".into()],
                    }]
                },
            ]
        );
        for (affinity, field) in [
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["z1"]}]}),
                "nodeSelectorTerms[0].matchExpressions[0].operator",
            ),
            (
                json!({"matchFields": [{"key": "spec.unschedulable", "operator": "In", "values": ["x"]}]}),
                "nodeSelectorTerms[0].matchFields[0].key",
            ),
            (
                json!({"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["z1"]}]}),
                "nodeAffinity[0].requirements[0]",
            ),
        ] {
            let bad = training_job(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [affinity]}}}}),
                None,
            );
            let err = job_spec(&config, &bad, "u-1", 0, None, Timestamp(99)).expect_err("refused");
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn pod_affinity_among_the_jobs_own_workers_is_a_required_topology() {
        let term = |key: &str, selector: serde_json::Value| json!({"labelSelector": {"matchLabels": selector}, "topologyKey": key});
        let with = |affinity: serde_json::Value| {
            let job = training_job(json!({"affinity": affinity}), None);
            job_spec(&config(), &job, "u-1", 0, None, Timestamp(0))
        };
        let together = |terms: Vec<serde_json::Value>| {
            with(json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}))
                .expect("maps")
                .topology
        };
        let own = json!({"trainyard.dev/job": "bert"});
        let rack = config().rack_label;
        assert_eq!(
            together(vec![term(names::ZONE_LABEL, own.clone())]),
            TopologyRequirement::SameZone
        );
        assert_eq!(
            together(vec![
                term(names::ZONE_LABEL, own.clone()),
                term(&rack, json!({"training-job": "bert"}))
            ]),
            TopologyRequirement::SameRack,
            "the narrowest domain asked"
        );
        assert_eq!(
            together(vec![term(names::HOSTNAME_LABEL, own.clone())]),
            TopologyRequirement::SameNode
        );
        // Another job's pods, or a key the allocator does not know.
        assert_eq!(
            together(vec![term(
                names::ZONE_LABEL,
                json!({"trainyard.dev/job": "gpt"})
            )]),
            TopologyRequirement::Preferred
        );
        assert_eq!(
            together(vec![term("example.com/pod", own.clone())]),
            TopologyRequirement::Preferred
        );

        let err = with(json!({
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                [term(names::HOSTNAME_LABEL, own.clone())]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                [term(names::HOSTNAME_LABEL, own)]}}))
        .expect_err("no node takes them");
        assert!(
            err.to_string().contains("spec.scheduling.affinity")
                && err.to_string().contains("drop one of the two terms"),
            "{err}"
        );
    }

    #[test]
    fn pod_affinity_needs_nodes_that_carry_its_topology_keys() {
        let exists = |key: &str| NodeRequirement {
            key: NodeKey::Label(key.into()),
            operator: NodeOperator::Exists,
            values: vec![],
        };
        let pod_affinity = json!({"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"trainyard.dev/job": "bert"}}, "topologyKey": names::ZONE_LABEL},
            {"labelSelector": {"matchLabels": {"app": "feature-store"}}, "topologyKey": names::ZONE_LABEL},
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "example.com/pod"}]});
        let job = training_job(json!({"affinity": {"podAffinity": pod_affinity}}), None);
        let spec = job_spec(&config(), &job, "u-1", 0, None, Timestamp(0)).expect("maps");
        assert_eq!(
            spec.node_affinity,
            [NodeSelectorTerm {
                requirements: vec![exists("example.com/pod"), exists(names::ZONE_LABEL)],
            }],
            "every key once, whatever pods its term selects"
        );

        let job = training_job(
            json!({"affinity": {
                "podAffinity": pod_affinity,
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]}}}}),
            None,
        );
        let spec = job_spec(&config(), &job, "u-1", 0, None, Timestamp(0)).expect("maps");
        assert_eq!(spec.node_affinity.len(), 2, "each term keeps its own");
        for term in &spec.node_affinity {
            assert_eq!(
                term.requirements[1..],
                [exists("example.com/pod"), exists(names::ZONE_LABEL)]
            );
        }
        let unaffined = training_job(json!({}), None);
        let spec = job_spec(&config(), &unaffined, "u-1", 0, None, Timestamp(0)).expect("maps");
        assert!(spec.node_affinity.is_empty());
    }

    #[test]
    fn job_with_bad_toleration_names_the_field() {
        let job = training_job(
            json!({"tolerations": [{"key": "a", "operator": "Maybe"}]}),
            None,
        );
        let err = job_spec(
            &AllocatorServiceConfig::default(),
            &job,
            "u-1",
            0,
            None,
            Timestamp(0),
        )
        .expect_err("rejected");
        assert!(
            err.to_string()
                .contains("spec.scheduling.tolerations[0].operator"),
            "{err}"
        );
    }

    fn worker(index: u32, node: &str) -> CorePlacement {
        CorePlacement {
            index,
            node: node.into(),
            node_selector: [
                (names::HOSTNAME_LABEL.to_string(), node.to_string()),
                ("nvidia.com/gpu.product".to_string(), "A100".to_string()),
            ]
            .into(),
            request_resource: names::GPU_RESOURCE.into(),
        }
    }

    fn admission(workers: Vec<CorePlacement>) -> Admission {
        Admission {
            uid: JobUid::new("u-1/a2"),
            namespace: "ml".into(),
            name: "bert".into(),
            queue: "team-a".into(),
            flavor: "a100".into(),
            resource: names::GPU_RESOURCE.into(),
            units_per_worker: 4,
            capacity_type: None,
            workers,
            tolerations: vec![Toleration::exists(
                "nvidia.com/gpu",
                TaintEffect::NoSchedule,
            )],
            topology: TopologyAssignment {
                zone: Some("z1".into()),
                rack: Some("r1".into()),
                rack_label: names::NVLINK_CLIQUE_LABEL.into(),
                nodes: 2,
            },
            admitted_at: Timestamp(5),
            borrowing: false,
            backfilled_ahead_of: None,
        }
    }

    #[test]
    fn admission_selector_is_the_common_flavor_labels_without_hostnames() {
        let decided = admission_decided(&admission(vec![worker(0, "n1"), worker(1, "n2")]), 2);
        assert_eq!(decided.attempt, 2);
        assert_eq!(
            decided.node_selector,
            [("nvidia.com/gpu.product".to_string(), "A100".to_string())].into()
        );
        assert_eq!(decided.placements.len(), 2);
        assert_eq!(decided.placements[1].node, "n2");
        assert_eq!(decided.placements[1].gpus, 4);
        assert_eq!(decided.tolerations[0].operator, "Exists");
        assert_eq!(decided.tolerations[0].effect.as_deref(), Some("NoSchedule"));
        assert_eq!(decided.topology[names::ZONE_LABEL], "z1");
        assert_eq!(decided.topology[names::NVLINK_CLIQUE_LABEL], "r1");
        // All workers on one node: the hostname is still not injected.
        let single = admission_decided(&admission(vec![worker(0, "n1"), worker(1, "n1")]), 2);
        assert!(!single.node_selector.contains_key(names::HOSTNAME_LABEL));
        assert_eq!(admission_id(&JobUid::new("u-1/a2")), "admission:u-1/a2");
    }

    #[test]
    fn a_jobs_pod_requests_and_its_queues_pod_policy_reach_the_core() {
        let mut job = training_job(json!({"priority": "high-priority"}), None);
        job.spec.volumes = vec![
            serde_json::from_value(json!({"name": "host", "hostPath": {"path": "/var/run"}}))
                .expect("volume parses"),
        ];
        let core = job_spec(&config(), &job, "u-1", 0, None, Timestamp(0)).expect("maps");
        let fields: Vec<&str> = core.pod_requests.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.volumes[0].hostPath", "spec.scheduling.priority"]
        );

        let change = queue(json!({
            "flavors": [{"name": "a100", "nominalQuota": 8}],
            "podPolicy": {"allowedVolumeTypes": ["hostPath"], "allowedPriorityClasses": []}
        }));
        let (event, _) =
            queue_event(&config(), &EntityRef::new("", "team-a", ""), &change).expect("maps");
        let Event::QueueUpserted(queue) = event else {
            panic!("an upsert: {event:?}");
        };
        assert_eq!(queue.pod_policy.allowed_volume_types, ["hostPath"]);
        let refused = queue
            .pod_policy
            .refusal(&core.pod_requests)
            .expect("the class is not allowed");
        assert_eq!(refused.field, "spec.scheduling.priority");

        let pending = pending_explained(
            None,
            "team-a",
            1,
            &PendingReason::pod_policy_refused(&queue.pod_policy, "team-a", refused),
            16,
        );
        let refusal = pending.pod_policy.expect("typed refusal");
        assert_eq!(refusal.field, "spec.scheduling.priority");
        assert!(
            refusal.fix.contains("remove spec.scheduling.priority"),
            "{}",
            refusal.fix
        );
        assert!(
            pending
                .message
                .starts_with("spec.scheduling.priority: TrainingQueue team-a")
        );
    }

    #[test]
    fn pending_explanation_carries_shortfall_and_stable_id() {
        let uid = JobUid::new("u-1/a0");
        let reason = PendingReason::QueueNotFound {
            queue: "team-a".into(),
        };
        let pending = pending_explained(Some(0), "team-a", 2, &reason, 8);
        assert_eq!(pending.gpus_short, 8);
        assert_eq!(pending.position, 2);
        assert_eq!(pending.message, "TrainingQueue team-a does not exist");
        let id = pending_id(&uid, &pending, Timestamp(7));
        assert_eq!(id, pending_id(&uid, &pending, Timestamp(7)));
        let moved = PendingExplained {
            position: 3,
            ..pending.clone()
        };
        assert_ne!(id, pending_id(&uid, &moved, Timestamp(7)));
        assert_ne!(id, pending_id(&uid, &pending, Timestamp(8)));
        assert_ne!(
            id,
            pending_id(&JobUid::new("u-2/a0"), &pending, Timestamp(7))
        );
        assert_eq!(pending.unschedulable, None);
    }

    #[test]
    fn an_unschedulable_job_is_explained_with_its_field_and_largest_node() {
        let reason = PendingReason::Unschedulable {
            cause: gpu_allocator_core::UnschedulableCause::UnitsPerWorker,
            flavor: "t4-spot".into(),
            resource: "nvidia.com/gpu".into(),
            largest_node: "gpu-node-3".into(),
            largest_node_units: 8,
            detail: "spec.gpusPerWorker is 16 but the largest node (gpu-node-3) has 8 GPUs".into(),
            fix: "lower gpusPerWorker to at most 8 and raise numWorkers".into(),
        };
        let pending = pending_explained(None, "team-a", 4, &reason, 32);
        assert_eq!(pending.flavor.as_deref(), Some("t4-spot"));
        assert_eq!(pending.gpus_short, 32, "every GPU it asks for is short");
        assert_eq!(
            pending.message,
            "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node \
             (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers"
        );
        let unschedulable = pending.unschedulable.expect("typed");
        assert_eq!(unschedulable.field, "spec.gpusPerWorker");
        assert_eq!(
            (
                unschedulable.largest_node.as_str(),
                unschedulable.largest_node_gpus
            ),
            ("gpu-node-3", 8)
        );
    }
}
