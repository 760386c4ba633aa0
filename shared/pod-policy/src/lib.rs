//! What a TrainingQueue lets its jobs put into their worker pods beyond the
//! safe defaults, and the one rule that decides whether a job's requests are
//! allowed. The gpu-allocator admits by it and the planner refuses
//! submissions by it; `trainyard-api` lists a TrainingJob's requests
//! (`pod_requests`) and turns a queue's `spec.podPolicy` into a [`PodPolicy`].

use serde::{Deserialize, Serialize};

/// What a queue's jobs may put into their pods beyond the safe defaults
/// (TrainingQueue `spec.podPolicy`, with its defaults applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct PodPolicy {
    /// Volume types allowed beyond the always-allowed ones, e.g. `hostPath`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_volume_types: Vec<String>,
    /// PriorityClasses its jobs may name; `None` = any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_priority_classes: Option<Vec<String>>,
    /// Extended resources its jobs may request beside their GPUs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_extended_resources: Vec<String>,
    /// Pod security settings beyond the Pod Security Standards' baseline.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_unsafe_security_context: bool,
}

/// Something a job's pods ask for that its queue's [`PodPolicy`] must allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRequest {
    /// The TrainingJob field asking for it, e.g. `spec.volumes[1].hostPath`.
    pub field: String,
    /// What it asks for.
    pub kind: PodRequestKind,
}

/// What a [`PodRequest`] asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type", content = "name")]
pub enum PodRequestKind {
    /// A volume type beyond the always-allowed ones, e.g. `hostPath`.
    VolumeType(String),
    /// A PriorityClass.
    PriorityClass(String),
    /// An extended resource beside the job's GPUs.
    ExtendedResource(String),
    /// An NVIDIA GPU resource beside the job's own, which no quota counts:
    /// never allowed.
    UncountedGpuResource(String),
    /// A pod security setting beyond the baseline, described.
    UnsafeSecurityContext(String),
}

impl PodPolicy {
    /// Whether it is the default policy (nothing beyond the safe defaults).
    pub fn is_default(&self) -> bool {
        *self == PodPolicy::default()
    }

    /// Whether it allows `kind`.
    pub fn allows(&self, kind: &PodRequestKind) -> bool {
        match kind {
            PodRequestKind::VolumeType(name) => self.allowed_volume_types.contains(name),
            PodRequestKind::PriorityClass(name) => self
                .allowed_priority_classes
                .as_ref()
                .is_none_or(|allowed| allowed.contains(name)),
            PodRequestKind::ExtendedResource(name) => {
                self.allowed_extended_resources.contains(name)
            }
            PodRequestKind::UncountedGpuResource(_) => false,
            PodRequestKind::UnsafeSecurityContext(_) => self.allow_unsafe_security_context,
        }
    }

    /// The first of `requests` it does not allow.
    pub fn refusal<'r>(&self, requests: &'r [PodRequest]) -> Option<&'r PodRequest> {
        requests.iter().find(|request| !self.allows(&request.kind))
    }
}

impl PodRequestKind {
    /// What is asked for, for a message: `hostPath volumes`, `PriorityClass
    /// high-priority`, ...
    pub fn describe(&self) -> String {
        match self {
            PodRequestKind::VolumeType(name) => format!("{name} volumes"),
            PodRequestKind::PriorityClass(name) => format!("PriorityClass {name}"),
            PodRequestKind::ExtendedResource(name) => format!("the extended resource {name}"),
            PodRequestKind::UncountedGpuResource(name) => format!(
                "the GPU resource {name} in spec.resources (no quota counts it; ask with gpusPerWorker, scheduling.migProfile or scheduling.allowTimeSlicing)"
            ),
            PodRequestKind::UnsafeSecurityContext(what) => what.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec![
            "hostPath".to_owned(),
            "batch".to_owned(),
            "rdma/hca".to_owned(),
        ]
    }

    #[test]
    fn the_default_policy_allows_any_priority_class_and_nothing_else_beyond_the_defaults() {
        let policy = PodPolicy::default();
        assert!(policy.allows(&PodRequestKind::PriorityClass("batch".into())));
        for kind in [
            PodRequestKind::VolumeType("hostPath".into()),
            PodRequestKind::ExtendedResource("rdma/hca".into()),
            PodRequestKind::UncountedGpuResource("nvidia.com/gpu.shared".into()),
            PodRequestKind::UnsafeSecurityContext("seccomp profile Unconfined".into()),
        ] {
            assert!(!policy.allows(&kind), "{kind:?}");
        }
    }

    #[test]
    fn an_empty_priority_class_list_allows_none_and_uncounted_gpus_are_never_allowed() {
        let everything = PodPolicy {
            allowed_volume_types: names(),
            allowed_priority_classes: Some(Vec::new()),
            allowed_extended_resources: vec!["nvidia.com/gpu.shared".into()],
            allow_unsafe_security_context: true,
        };
        assert!(!everything.allows(&PodRequestKind::PriorityClass("batch".into())));
        assert!(!everything.allows(&PodRequestKind::UncountedGpuResource(
            "nvidia.com/gpu.shared".into()
        )));
        assert!(everything.allows(&PodRequestKind::UnsafeSecurityContext("x".into())));
    }

    #[test]
    fn the_first_request_not_allowed_is_the_refusal() {
        let policy = PodPolicy {
            allowed_volume_types: vec!["hostPath".into()],
            allowed_priority_classes: Some(names()),
            ..PodPolicy::default()
        };
        let requests = [
            PodRequest {
                field: "spec.volumes[0].hostPath".into(),
                kind: PodRequestKind::VolumeType("hostPath".into()),
            },
            PodRequest {
                field: "spec.scheduling.priority".into(),
                kind: PodRequestKind::PriorityClass("urgent".into()),
            },
            PodRequest {
                field: "spec.volumes[1].nfs".into(),
                kind: PodRequestKind::VolumeType("nfs".into()),
            },
        ];
        let refused = policy.refusal(&requests).expect("urgent is not listed");
        assert_eq!(refused.field, "spec.scheduling.priority");
        assert!(policy.refusal(&requests[..1]).is_none());
    }

    #[test]
    fn a_policy_reads_back_as_written_and_the_default_writes_nothing() {
        let policy = PodPolicy {
            allowed_volume_types: vec!["hostPath".into()],
            allowed_priority_classes: Some(Vec::new()),
            allowed_extended_resources: Vec::new(),
            allow_unsafe_security_context: true,
        };
        let text = serde_json::to_string(&policy).expect("serializes");
        assert_eq!(
            text,
            r#"{"allowedVolumeTypes":["hostPath"],"allowedPriorityClasses":[],"allowUnsafeSecurityContext":true}"#
        );
        assert_eq!(
            serde_json::from_str::<PodPolicy>(&text).expect("reads"),
            policy
        );
        assert_eq!(
            serde_json::to_string(&PodPolicy::default()).expect("serializes"),
            "{}"
        );
    }
}
