//! What a TrainingJob may put into its worker pods, bounded by its TrainingQueue.
//!
//! The planner writes the worker container's own security context (never
//! privileged, no privilege escalation, every capability dropped) and the pod
//! spec carries no host namespaces (hostNetwork, hostPID, hostIPC), so those
//! need no check. What a spec can still ask for, and a queue must allow, is
//! listed by [`pod_requests`]: volumes that reach into the node or its network
//! (anything beyond the Pod Security Standards' restricted volume types), a
//! PriorityClass, extended resources besides the job's GPUs, and pod security
//! settings beyond the Pod Security Standards' baseline. The gpu-allocator
//! refuses to admit a job whose queue's [`PodPolicy`] does not allow one of
//! them, and the planner creates no Job for such a job before it is admitted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
pub use trainyard_pod_policy::{PodRequest, PodRequestKind};

use crate::trainingjob::{StorageType, TrainingJobSpec};

/// Volume types every queue allows: those the Pod Security Standards'
/// restricted profile allows. None of them reaches the node's file system or
/// mounts remote storage with the node's identity.
pub const ALWAYS_ALLOWED_VOLUME_TYPES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Sysctls the kubelet allows without an operator's opt-in (the Pod Security
/// Standards' baseline "safe" set); any other needs `allowUnsafeSecurityContext`.
pub const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// SELinux types the Pod Security Standards' baseline allows.
const BASELINE_SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Prefix of the per-container AppArmor annotation the kubelet still honours.
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Extended resource of a whole NVIDIA GPU; its count comes from `gpusPerWorker`.
const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Prefix of NVIDIA's GPU resources: whole GPUs, shared GPUs, MIG slices.
const NVIDIA_GPU_PREFIXES: [&str; 2] = ["nvidia.com/gpu", "nvidia.com/mig-"];

/// Most entries of each list of a pod policy.
pub const MAX_POD_POLICY_ENTRIES: usize = 64;

/// What the TrainingJobs of a queue may put into their worker pods beyond the
/// safe defaults. Unset: only the Pod Security Standards' restricted volume
/// types, any PriorityClass, no extended resource besides the job's GPUs, and
/// pod security settings within the baseline.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicy {
    /// Volume types the queue's jobs may use besides configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected and secret, by their field name in a pod's volumes, e.g. hostPath or nfs (also the checkpoint storage type nfs). hostPath gives a worker the node's file system: allow it only to queues of trusted namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_POD_POLICY_ENTRIES), inner(length(min = 1, max = 63), pattern(r"^[a-z][a-zA-Z]*$")))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_volume_types: Vec<String>,

    /// PriorityClasses the queue's jobs may name in scheduling.priority. Unset: any (as Kubernetes, which keeps the system classes to kube-system). Empty: none; jobs take the queue's default priority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_POD_POLICY_ENTRIES), inner(length(min = 1, max = 253)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_priority_classes: Option<Vec<String>>,

    /// Extended resources (not counted in the queue's quota) the queue's jobs may request in spec.resources, e.g. rdma/hca_shared_devices_a. NVIDIA GPU resources are never allowed there: GPUs come from gpusPerWorker, MIG slices from scheduling.migProfile, and both count against the queue's quota.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_POD_POLICY_ENTRIES), inner(length(min = 1, max = 253)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub allowed_extended_resources: Vec<String>,

    /// Allow pod security settings beyond the Pod Security Standards' baseline in spec.securityContext and spec.podAnnotations: seccomp or AppArmor Unconfined, an SELinux type other than the container types or an SELinux user or role, sysctls outside the safe set, Windows hostProcess. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_unsafe_security_context: Option<bool>,
}

impl PodPolicy {
    /// The policy with its defaults applied, as the one rule
    /// ([`trainyard_pod_policy::PodPolicy`]) the gpu-allocator admits by
    /// and the planner refuses submissions by.
    pub fn rule(&self) -> trainyard_pod_policy::PodPolicy {
        trainyard_pod_policy::PodPolicy {
            allowed_volume_types: self.allowed_volume_types.clone(),
            allowed_priority_classes: self.allowed_priority_classes.clone(),
            allowed_extended_resources: self.allowed_extended_resources.clone(),
            allow_unsafe_security_context: self.allow_unsafe_security_context.unwrap_or(false),
        }
    }
}

/// Everything in `spec` a queue's pod policy must allow, each with the field
/// asking for it; empty when the job needs no permission.
pub fn pod_requests(spec: &TrainingJobSpec) -> Vec<PodRequest> {
    let mut requests = Vec::new();
    let mut push = |field: String, kind: PodRequestKind| requests.push(PodRequest { field, kind });
    for (index, volume) in spec.volumes.iter().enumerate() {
        if let Some(kind) = volume_type(volume)
            && !ALWAYS_ALLOWED_VOLUME_TYPES.contains(&kind.as_str())
        {
            push(
                format!("spec.volumes[{index}].{kind}"),
                PodRequestKind::VolumeType(kind),
            );
        }
    }
    if spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.storage.as_ref())
        .is_some_and(|s| s.storage_type == StorageType::Nfs)
    {
        push(
            "spec.checkpoint.storage.type".to_owned(),
            PodRequestKind::VolumeType("nfs".to_owned()),
        );
    }
    if let Some(priority) = spec.scheduling.as_ref().and_then(|s| s.priority.as_ref()) {
        push(
            "spec.scheduling.priority".to_owned(),
            PodRequestKind::PriorityClass(priority.clone()),
        );
    }
    let own_mig = spec
        .scheduling
        .as_ref()
        .and_then(|s| s.mig_profile.as_deref())
        .map(|profile| format!("nvidia.com/mig-{profile}"));
    let mut seen: Vec<&str> = Vec::new();
    if let Some(resources) = &spec.resources {
        for (section, quantities) in [
            ("requests", &resources.requests),
            ("limits", &resources.limits),
        ] {
            for name in quantities.iter().flat_map(|q| q.keys()) {
                // The job's own GPU resource is set from gpusPerWorker; the planner
                // refuses a spec whose count disagrees.
                if !is_extended_resource(name)
                    || name == GPU_RESOURCE
                    || own_mig.as_deref() == Some(name.as_str())
                    || seen.contains(&name.as_str())
                {
                    continue;
                }
                seen.push(name);
                let field = format!("spec.resources.{section}[{name}]");
                if NVIDIA_GPU_PREFIXES.iter().any(|p| name.starts_with(p)) {
                    push(field, PodRequestKind::UncountedGpuResource(name.clone()));
                } else {
                    push(field, PodRequestKind::ExtendedResource(name.clone()));
                }
            }
        }
    }
    for (field, what) in unsafe_security_settings(spec) {
        push(field, PodRequestKind::UnsafeSecurityContext(what));
    }
    requests
}

/// The volume source a volume names (`hostPath`, `nfs`, ...), as its field is
/// spelled in a pod spec; `None` for a volume naming none (the API server
/// makes it an emptyDir). Read from the serialized form, so a volume type
/// added to Kubernetes later is governed without a change here.
fn volume_type(volume: &k8s_openapi::api::core::v1::Volume) -> Option<String> {
    let value = serde_json::to_value(volume).ok()?;
    value
        .as_object()?
        .keys()
        .find(|key| key.as_str() != "name")
        .cloned()
}

/// Whether `name` is an extended resource: a domain-prefixed name outside
/// `kubernetes.io`, as the API server tells them apart from cpu, memory,
/// ephemeral-storage and hugepages-*.
fn is_extended_resource(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, _)) => !(domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")),
        None => false,
    }
}

/// Pod security settings of `spec` beyond the Pod Security Standards'
/// baseline: (field, what it does).
fn unsafe_security_settings(spec: &TrainingJobSpec) -> Vec<(String, String)> {
    let mut found = Vec::new();
    if let Some(context) = &spec.security_context {
        if let Some(selinux) = &context.se_linux_options {
            let custom_type = selinux
                .type_
                .as_deref()
                .is_some_and(|t| !t.is_empty() && !BASELINE_SELINUX_TYPES.contains(&t));
            let user_or_role = selinux.user.as_deref().is_some_and(|u| !u.is_empty())
                || selinux.role.as_deref().is_some_and(|r| !r.is_empty());
            if custom_type || user_or_role {
                found.push((
                    "spec.securityContext.seLinuxOptions".to_owned(),
                    "an SELinux type other than the container types, or an SELinux user or role"
                        .to_owned(),
                ));
            }
        }
        for (index, sysctl) in context.sysctls.iter().flatten().enumerate() {
            if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
                found.push((
                    format!("spec.securityContext.sysctls[{index}]"),
                    format!("the unsafe sysctl {}", sysctl.name),
                ));
            }
        }
        if context
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            found.push((
                "spec.securityContext.seccompProfile.type".to_owned(),
                "seccomp profile Unconfined".to_owned(),
            ));
        }
        if context
            .app_armor_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            found.push((
                "spec.securityContext.appArmorProfile.type".to_owned(),
                "AppArmor profile Unconfined".to_owned(),
            ));
        }
        if context
            .windows_options
            .as_ref()
            .and_then(|w| w.host_process)
            .unwrap_or(false)
        {
            found.push((
                "spec.securityContext.windowsOptions.hostProcess".to_owned(),
                "a Windows host process".to_owned(),
            ));
        }
    }
    for (key, value) in &spec.pod_annotations {
        if key.starts_with(APPARMOR_ANNOTATION_PREFIX) && value == "unconfined" {
            found.push((
                format!("spec.podAnnotations[{key}]"),
                "AppArmor profile unconfined".to_owned(),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, NFSVolumeSource, PodSecurityContext, ResourceRequirements,
        SeccompProfile, SecretVolumeSource, Sysctl, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::trainingjob::SchedulingSpec;

    fn spec() -> TrainingJobSpec {
        TrainingJobSpec {
            model: "m".into(),
            dataset: "d".into(),
            num_workers: 1,
            gpus_per_worker: Some(1),
            ..TrainingJobSpec::default()
        }
    }

    fn fields(spec: &TrainingJobSpec) -> Vec<String> {
        pod_requests(spec).into_iter().map(|r| r.field).collect()
    }

    #[test]
    fn a_plain_job_needs_no_permission() {
        let mut job = spec();
        job.volumes = vec![Volume {
            name: "creds".into(),
            secret: Some(SecretVolumeSource::default()),
            ..Volume::default()
        }];
        job.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("4".into())),
                ("nvidia.com/gpu".to_owned(), Quantity("1".into())),
            ])),
            ..ResourceRequirements::default()
        });
        assert!(pod_requests(&job).is_empty());
    }

    #[test]
    fn node_reaching_volumes_are_named_by_their_field() {
        let mut job = spec();
        job.volumes = vec![
            Volume {
                name: "cache".into(),
                ..Volume::default()
            },
            Volume {
                name: "host".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/".into(),
                    ..HostPathVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume {
                name: "share".into(),
                nfs: Some(NFSVolumeSource {
                    server: "nas".into(),
                    path: "/data".into(),
                    ..NFSVolumeSource::default()
                }),
                ..Volume::default()
            },
        ];
        let requests = pod_requests(&job);
        assert_eq!(
            requests,
            [
                PodRequest {
                    field: "spec.volumes[1].hostPath".into(),
                    kind: PodRequestKind::VolumeType("hostPath".into()),
                },
                PodRequest {
                    field: "spec.volumes[2].nfs".into(),
                    kind: PodRequestKind::VolumeType("nfs".into()),
                },
            ]
        );
    }

    #[test]
    fn priority_extended_resources_and_unsafe_settings_are_listed() {
        let mut job = spec();
        job.scheduling = Some(SchedulingSpec {
            priority: Some("high-priority".into()),
            mig_profile: Some("1g.10gb".into()),
            ..SchedulingSpec::default()
        });
        job.resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("nvidia.com/mig-1g.10gb".to_owned(), Quantity("1".into())),
                ("nvidia.com/gpu.shared".to_owned(), Quantity("1".into())),
                ("rdma/hca".to_owned(), Quantity("1".into())),
                ("hugepages-2Mi".to_owned(), Quantity("1Gi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "nvidia.com/mig-3g.40gb".to_owned(),
                Quantity("1".into()),
            )])),
            ..ResourceRequirements::default()
        });
        job.security_context = Some(PodSecurityContext {
            run_as_user: Some(0),
            seccomp_profile: Some(SeccompProfile {
                type_: "Unconfined".into(),
                ..SeccompProfile::default()
            }),
            sysctls: Some(vec![
                Sysctl {
                    name: "net.ipv4.tcp_syncookies".into(),
                    value: "1".into(),
                },
                Sysctl {
                    name: "kernel.msgmax".into(),
                    value: "1".into(),
                },
            ]),
            ..PodSecurityContext::default()
        });
        job.pod_annotations = BTreeMap::from([(
            "container.apparmor.security.beta.kubernetes.io/worker".to_owned(),
            "unconfined".to_owned(),
        )]);
        assert_eq!(
            fields(&job),
            [
                "spec.scheduling.priority",
                "spec.resources.requests[nvidia.com/gpu.shared]",
                "spec.resources.requests[rdma/hca]",
                "spec.resources.limits[nvidia.com/mig-3g.40gb]",
                "spec.securityContext.sysctls[1]",
                "spec.securityContext.seccompProfile.type",
                "spec.podAnnotations[container.apparmor.security.beta.kubernetes.io/worker]",
            ]
        );
        let kinds: Vec<PodRequestKind> = pod_requests(&job).into_iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds[1],
            PodRequestKind::UncountedGpuResource("nvidia.com/gpu.shared".into())
        );
        assert_eq!(
            kinds[2],
            PodRequestKind::ExtendedResource("rdma/hca".into())
        );
    }
}
