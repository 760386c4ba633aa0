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
    /// What kubectl also accepts for the plural (`tj`, `po`), from discovery.
    pub short_names: &'static [&'static str],
    /// Columns of `kubectl get` after NAME: a CRD's printer columns, or the
    /// simulator's choice for a built-in kind.
    pub columns: &'static [PrinterColumn],
}

/// A column of the server-side table `kubectl get` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    pub name: &'static str,
    /// `string`, `integer`, `number`, `boolean` or `date` (printed as an age).
    pub column_type: &'static str,
    /// A simple JSONPath, `.status.state`.
    pub json_path: &'static str,
    /// 0: always shown; 1: only with `-o wide`.
    pub priority: i32,
    pub description: &'static str,
}

const fn column(
    name: &'static str,
    column_type: &'static str,
    json_path: &'static str,
    priority: i32,
) -> PrinterColumn {
    PrinterColumn {
        name,
        column_type,
        json_path,
        priority,
        description: "",
    }
}

const AGE: PrinterColumn = column("Age", "date", ".metadata.creationTimestamp", 0);
const AGE_ONLY: &[PrinterColumn] = &[AGE];
const POD_COLUMNS: &[PrinterColumn] = &[
    column("Status", "string", ".status.phase", 0),
    AGE,
    column("Node", "string", ".spec.nodeName", 1),
    column("IP", "string", ".status.podIP", 1),
];
const NODE_COLUMNS: &[PrinterColumn] = &[
    column(
        "GPU",
        "string",
        ".metadata.labels.nvidia\\.com/gpu\\.product",
        0,
    ),
    AGE,
    column(
        "Capacity-Type",
        "string",
        ".metadata.labels.karpenter\\.sh/capacity-type",
        1,
    ),
    column(
        "Zone",
        "string",
        ".metadata.labels.topology\\.kubernetes\\.io/zone",
        1,
    ),
];
const JOB_COLUMNS: &[PrinterColumn] = &[
    column("Active", "integer", ".status.active", 0),
    column("Succeeded", "integer", ".status.succeeded", 0),
    column("Failed", "integer", ".status.failed", 0),
    AGE,
    column("Suspended", "boolean", ".spec.suspend", 1),
];
const EVENT_COLUMNS: &[PrinterColumn] = &[
    column("Type", "string", ".type", 0),
    column("Reason", "string", ".reason", 0),
    column("Message", "string", ".message", 0),
    AGE,
];

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

struct Builtin {
    name: &'static str,
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
    short_names: &'static [&'static str],
    columns: &'static [PrinterColumn],
}

const fn builtin(b: Builtin) -> ResourceType {
    ResourceType {
        name: b.name,
        group: b.group,
        version: "v1",
        plural: b.plural,
        kind: b.kind,
        namespaced: b.namespaced,
        status_subresource: b.status_subresource,
        short_names: b.short_names,
        columns: b.columns,
    }
}

const BUILTIN: [ResourceType; 12] = [
    builtin(Builtin {
        name: "pods",
        group: "",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        short_names: &["po"],
        columns: POD_COLUMNS,
    }),
    builtin(Builtin {
        name: "nodes",
        group: "",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        short_names: &["no"],
        columns: NODE_COLUMNS,
    }),
    builtin(Builtin {
        name: "services",
        group: "",
        plural: "services",
        kind: "Service",
        namespaced: true,
        status_subresource: true,
        short_names: &["svc"],
        columns: AGE_ONLY,
    }),
    builtin(Builtin {
        name: "configmaps",
        group: "",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        short_names: &["cm"],
        columns: AGE_ONLY,
    }),
    builtin(Builtin {
        name: "namespaces",
        group: "",
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        status_subresource: true,
        short_names: &["ns"],
        columns: AGE_ONLY,
    }),
    builtin(Builtin {
        name: "events",
        group: "",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        short_names: &["ev"],
        columns: EVENT_COLUMNS,
    }),
    builtin(Builtin {
        name: "events.events.k8s.io",
        group: "events.k8s.io",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        short_names: &["ev"],
        columns: &[
            column("Type", "string", ".type", 0),
            column("Reason", "string", ".reason", 0),
            column("Note", "string", ".note", 0),
            AGE,
        ],
    }),
    builtin(Builtin {
        name: "persistentvolumeclaims",
        group: "",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
        status_subresource: true,
        short_names: &["pvc"],
        columns: &[
            column("Status", "string", ".status.phase", 0),
            column("Capacity", "string", ".spec.resources.requests.storage", 0),
            AGE,
        ],
    }),
    builtin(Builtin {
        name: "secrets",
        group: "",
        plural: "secrets",
        kind: "Secret",
        namespaced: true,
        status_subresource: false,
        short_names: &[],
        columns: &[column("Type", "string", ".type", 0), AGE],
    }),
    builtin(Builtin {
        name: "resourcequotas",
        group: "",
        plural: "resourcequotas",
        kind: "ResourceQuota",
        namespaced: true,
        status_subresource: true,
        short_names: &["quota"],
        columns: AGE_ONLY,
    }),
    builtin(Builtin {
        name: "priorityclasses.scheduling.k8s.io",
        group: "scheduling.k8s.io",
        plural: "priorityclasses",
        kind: "PriorityClass",
        namespaced: false,
        status_subresource: false,
        short_names: &["pc"],
        columns: &[column("Value", "integer", ".value", 0), AGE],
    }),
    builtin(Builtin {
        name: "jobs.batch",
        group: "batch",
        plural: "jobs",
        kind: "Job",
        namespaced: true,
        status_subresource: true,
        short_names: &[],
        columns: JOB_COLUMNS,
    }),
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
        short_names: Box::leak(
            spec.names
                .short_names
                .unwrap_or_default()
                .into_iter()
                .map(leak)
                .collect(),
        ),
        columns: Box::leak(
            version
                .and_then(|v| v.additional_printer_columns.clone())
                .unwrap_or_default()
                .into_iter()
                .map(|c| PrinterColumn {
                    name: leak(c.name),
                    column_type: leak(c.type_),
                    json_path: leak(c.json_path),
                    priority: c.priority.unwrap_or(0),
                    description: leak(c.description.unwrap_or_default()),
                })
                .collect(),
        ),
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
pub fn secrets() -> &'static ResourceType {
    named("secrets")
}
pub fn events() -> &'static ResourceType {
    named("events")
}
pub fn resource_quotas() -> &'static ResourceType {
    named("resourcequotas")
}
pub fn priority_classes() -> &'static ResourceType {
    named("priorityclasses.scheduling.k8s.io")
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
