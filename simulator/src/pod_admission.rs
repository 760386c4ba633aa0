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

use serde_json::{Value, json};
use trainyard_contracts::hash::fnv1a_of;

use crate::resources;
use crate::selector::Selector;
use crate::store::Store;

const GPU: &str = "nvidia.com/gpu";
/// PriorityClasses every cluster has without anyone creating them.
const BUILT_IN_PRIORITY_CLASSES: [&str; 2] = ["system-cluster-critical", "system-node-critical"];

/// A whole-number quantity (`"4"`, `4`); anything else counts as none.
fn whole(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// `nvidia.com/gpu` one pod with `spec` asks for: per container, its limit, else its request.
fn gpus_of(spec: &Value) -> u64 {
    spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            whole(&c["resources"]["limits"][GPU])
                .or_else(|| whole(&c["resources"]["requests"][GPU]))
                .unwrap_or(0)
        })
        .sum()
}

/// Why the API server refuses the `workers` pods of Job `job` built from
/// `pod_spec` in `namespace`, in its words; None when they are admitted.
pub fn refusal(
    store: &Store,
    namespace: &str,
    job: &str,
    pod_spec: &Value,
    workers: u32,
) -> Option<String> {
    let forbidden = |index: u64, why: String| {
        format!("Error creating: pods \"{job}-{index}-\" is forbidden: {why}")
    };
    if let Some(class) = pod_spec["priorityClassName"].as_str()
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
    let (quotas, _) = store.list(
        resources::resource_quotas(),
        Some(namespace),
        &Selector::default(),
        &Selector::default(),
    );
    if quotas.is_empty() {
        return None;
    }
    let (pods, _) = store.list(
        resources::pods(),
        Some(namespace),
        &Selector::default(),
        &Selector::default(),
    );
    let live: Vec<&Value> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .collect();
    let used_pods = live.len() as u64;
    let used_gpus: u64 = live.iter().map(|p| gpus_of(&p["spec"])).sum();
    let per_pod_gpus = gpus_of(pod_spec);
    for quota in &quotas {
        let name = quota["metadata"]["name"].as_str().unwrap_or_default();
        let Some(hard) = quota["spec"]["hard"].as_object() else {
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
pub fn record_failed_create(store: &Store, job: &Value, message: &str, now: &str) {
    let namespace = job["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = job["metadata"]["name"].as_str().unwrap_or_default();
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": format!("{name}.{:x}", fnv1a_of(message.as_bytes())),
            "namespace": namespace,
        },
        "involvedObject": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "namespace": namespace,
            "uid": job["metadata"]["uid"],
        },
        "reason": "FailedCreate",
        "message": message,
        "type": "Warning",
        "source": {"component": "job-controller"},
        "reportingComponent": "job-controller",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    // Already recorded: the Job controller's retries repeat the same Event.
    let _ = store.create(resources::events(), Some(namespace), event);
}
