//! What a real API server's admission does to the pods a Job controller
//! creates, for the two refusals users meet most: a pod template naming a
//! PriorityClass that does not exist (the `Priority` plugin) and a namespace
//! ResourceQuota the pods would exceed (`pods`, `count/pods`,
//! `requests.nvidia.com/gpu`, `limits.nvidia.com/gpu`). A refused Job gets
//! no pods and the Job controller's Warning Event `FailedCreate` with the
//! API server's words, as on a real cluster.
//!
//! Simplification: a Job's pods are admitted together, all or none (a real
//! Job controller creates those that fit and reports the first refused one).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Event, EventSource, ObjectReference, Pod, PodSpec, ResourceQuota,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use trainyard_contracts::hash::fnv1a_of;

use crate::resources;
use crate::store::Store;

const GPU: &str = "nvidia.com/gpu";
/// PriorityClasses every cluster has without anyone creating them.
const BUILT_IN_PRIORITY_CLASSES: [&str; 2] = ["system-cluster-critical", "system-node-critical"];

/// A whole-number quantity (`"4"`, `4`); anything else counts as none.
fn whole(value: &Quantity) -> Option<u64> {
    value.0.parse().ok()
}

/// `nvidia.com/gpu` one pod with `spec` asks for: per container, its limit, else its request.
fn gpus_of(spec: &PodSpec) -> u64 {
    spec.containers
        .iter()
        .filter_map(|c| c.resources.as_ref())
        .map(|r| {
            let of = |list: &Option<std::collections::BTreeMap<String, Quantity>>| {
                list.as_ref().and_then(|l| l.get(GPU)).and_then(whole)
            };
            of(&r.limits).or_else(|| of(&r.requests)).unwrap_or(0)
        })
        .sum()
}

/// Why the API server refuses the `workers` pods of Job `job` built from
/// `pod_spec` in `namespace`, in its words; None when they are admitted.
pub fn refusal(
    store: &Store,
    namespace: &str,
    job: &str,
    pod_spec: &PodSpec,
    workers: u32,
) -> Option<String> {
    let forbidden = |index: u64, why: String| {
        format!("Error creating: pods \"{job}-{index}-\" is forbidden: {why}")
    };
    if let Some(class) = pod_spec.priority_class_name.as_deref()
        && !BUILT_IN_PRIORITY_CLASSES.contains(&class)
        && store
            .get(resources::priority_classes(), None, class)
            .is_err()
    {
        return Some(forbidden(
            0,
            format!("no PriorityClass with name {class} was found"),
        ));
    }
    // A quota or pod that does not read as one is not counted (a real API
    // server would have refused it).
    let quotas: Vec<ResourceQuota> = store
        .list_as(resources::resource_quotas(), Some(namespace))
        .into_iter()
        .flatten()
        .collect();
    if quotas.is_empty() {
        return None;
    }
    let pods: Vec<Pod> = store
        .list_as(resources::pods(), Some(namespace))
        .into_iter()
        .flatten()
        .collect();
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .collect();
    let used_pods = live.len() as u64;
    let used_gpus: u64 = live
        .iter()
        .filter_map(|p| p.spec.as_ref())
        .map(gpus_of)
        .sum();
    let per_pod_gpus = gpus_of(pod_spec);
    for quota in &quotas {
        let name = quota.metadata.name.as_deref().unwrap_or_default();
        let Some(hard) = quota.spec.as_ref().and_then(|s| s.hard.as_ref()) else {
            continue;
        };
        for (resource, limit) in hard {
            let (used, each) = match resource.as_str() {
                "pods" | "count/pods" => (used_pods, 1),
                "requests.nvidia.com/gpu" | "limits.nvidia.com/gpu" => (used_gpus, per_pod_gpus),
                _ => continue,
            };
            let Some(limit) = whole(limit) else {
                continue;
            };
            // The first pod of the gang that would not fit is the one refused.
            let refused = (0..u64::from(workers)).find(|k| used + (k + 1) * each > limit);
            if let Some(index) = refused {
                return Some(forbidden(
                    index,
                    format!(
                        "exceeded quota: {name}, requested: {resource}={each}, used: {resource}={}, limited: {resource}={limit}",
                        used + index * each
                    ),
                ));
            }
        }
    }
    None
}

/// Records the Job controller's `FailedCreate` Warning Event about `job`
/// (once per distinct message: a repeat is the same Event).
pub fn record_failed_create(store: &Store, job: &Job, message: &str, now: &Time) {
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", fnv1a_of(message.as_bytes()))),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("batch/v1".to_owned()),
            kind: Some("Job".to_owned()),
            name: Some(name),
            namespace: Some(namespace.clone()),
            uid: job.metadata.uid.clone(),
            ..ObjectReference::default()
        },
        reason: Some("FailedCreate".to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".to_owned()),
        source: Some(EventSource {
            component: Some("job-controller".to_owned()),
            ..EventSource::default()
        }),
        reporting_component: Some("job-controller".to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now.clone()),
        count: Some(1),
        ..Event::default()
    };
    // Already recorded: the Job controller's retries repeat the same Event.
    let _ = store.create_as(resources::events(), Some(&namespace), &event, false);
}
