//! The resource types the simulated API server serves: the built-in kinds Trainyard
//! reads or writes, and Trainyard's own CRDs as `trainyard-api` defines them.

use std::sync::OnceLock;

use kube::CustomResourceExt;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

/// One served resource type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// `<plural>` for the core group, `<plural>.<group>` otherwise (as kubectl names them).
    pub name: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Writes to the main resource leave `status` alone; `/status` changes only it.
    pub status_subresource: bool,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `<Kind>` for the core group, `<Kind>.<group>` otherwise (`Job.batch`).
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_owned()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }
}

const fn builtin(
    name: &'static str,
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
) -> ResourceType {
    ResourceType {
        name,
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
        status_subresource,
    }
}

const BUILTIN: [ResourceType; 9] = [
    builtin("pods", "", "pods", "Pod", true, true),
    builtin("nodes", "", "nodes", "Node", false, true),
    builtin("services", "", "services", "Service", true, true),
    builtin("configmaps", "", "configmaps", "ConfigMap", true, false),
    builtin(
        "persistentvolumeclaims",
        "",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
    ),
    builtin("namespaces", "", "namespaces", "Namespace", false, true),
    builtin("events", "", "events", "Event", true, false),
    builtin(
        "events.events.k8s.io",
        "events.k8s.io",
        "events",
        "Event",
        true,
        false,
    ),
    builtin("jobs.batch", "batch", "jobs", "Job", true, true),
];

fn leak(value: String) -> &'static str {
    Box::leak(value.into_boxed_str())
}

fn from_crd(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> ResourceType {
    let spec = crd.spec;
    let version = spec
        .versions
        .iter()
        .find(|v| v.storage)
        .or(spec.versions.first());
    ResourceType {
        name: leak(format!("{}.{}", spec.names.plural, spec.group)),
        group: leak(spec.group.clone()),
        version: leak(version.map(|v| v.name.clone()).unwrap_or_default()),
        plural: leak(spec.names.plural.clone()),
        kind: leak(spec.names.kind.clone()),
        namespaced: spec.scope == "Namespaced",
        status_subresource: version
            .and_then(|v| v.subresources.as_ref())
            .is_some_and(|s| s.status.is_some()),
    }
}

/// Every served type (built once; the CRD-derived names live for the process).
pub fn all() -> &'static [ResourceType] {
    static ALL: OnceLock<Vec<ResourceType>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all = BUILTIN.to_vec();
        all.extend([TrainingJob::crd(), Sweep::crd(), TrainingQueue::crd()].map(from_crd));
        all
    })
}

/// The type at `/api/v1/<plural>` (`group` empty) or `/apis/<group>/<version>/<plural>`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    all()
        .iter()
        .find(|rt| rt.group == group && rt.version == version && rt.plural == plural)
}

/// The type with this qualified name (`jobs.batch`, `pods`, ...).
pub fn by_name(name: &str) -> Option<&'static ResourceType> {
    all().iter().find(|rt| rt.name == name)
}

/// The types the simulator itself drives, by qualified name.
pub fn pods() -> &'static ResourceType {
    named("pods")
}
pub fn nodes() -> &'static ResourceType {
    named("nodes")
}
pub fn jobs() -> &'static ResourceType {
    named("jobs.batch")
}
pub fn config_maps() -> &'static ResourceType {
    named("configmaps")
}
pub fn training_jobs() -> &'static ResourceType {
    named("trainingjobs.trainyard.dev")
}

fn named(name: &str) -> &'static ResourceType {
    match by_name(name) {
        Some(rt) => rt,
        None => unreachable!("{name} is in the built-in table"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainyard_crds_are_served_with_their_scope_and_status() {
        let tj = lookup("trainyard.dev", "v1", "trainingjobs").expect("served");
        assert_eq!(tj.kind, "TrainingJob");
        assert!(tj.namespaced && tj.status_subresource);
        let queue = by_name("trainingqueues.trainyard.dev").expect("served");
        assert!(!queue.namespaced);
        assert_eq!(jobs().api_version(), "batch/v1");
        assert_eq!(pods().api_version(), "v1");
        assert_eq!(pods().qualified_kind(), "Pod");
        assert_eq!(jobs().qualified_kind(), "Job.batch");
    }
}
