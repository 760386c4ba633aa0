//! The labels a TrainingJob's worker pods carry, and what the job's
//! `scheduling.affinity` asks of where those workers run.
//!
//! The gpu-allocator places every worker on a node at admission, and the
//! planner pins the workers to those nodes. Both read a job's affinity
//! here, so the allocator plans only what the pin lets the pods do: a
//! required pod anti-affinity that keeps the job's own workers on separate
//! hosts (the usual way to give each worker a node) becomes one worker per
//! node in the plan, and required node affinity limits the nodes it places
//! on; constraints the allocator cannot see (affinity to other pods) leave
//! the workers unpinned, to the scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::TrainingJob;

/// Label on every owned object: the name of the owning TrainingJob.
pub const LABEL_JOB: &str = "trainyard.dev/job";
/// Label on every owned object: what it is for (`worker`, `config`, `service`).
pub const LABEL_ROLE: &str = "trainyard.dev/role";
/// Label on every owned object: the restart attempt it belongs to.
pub const LABEL_ATTEMPT: &str = "trainyard.dev/attempt";
/// Label on every owned object: the controller that manages it.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "trainyard";
/// Worker pod label of the reference operator, kept so `kubectl logs -l
/// training-job=<name>` and anti-affinity rules written against it keep working.
pub const LABEL_TRAINING_JOB: &str = "training-job";
/// Value of [`LABEL_ROLE`] on worker pods.
pub const ROLE_WORKER: &str = "worker";
/// Node label with the node's name.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";

/// Labels every worker pod of TrainingJob `name` carries, whatever the attempt.
pub fn worker_pod_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB.to_owned(), name.to_owned()),
        (LABEL_ROLE.to_owned(), ROLE_WORKER.to_owned()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_TRAINING_JOB.to_owned(), name.to_owned()),
    ])
}

impl TrainingJob {
    /// Whether a required pod anti-affinity term keeps the job's own workers
    /// on separate nodes (topology key `kubernetes.io/hostname`, a selector
    /// that picks the job's worker pods, in the job's namespace).
    pub fn workers_one_per_node(&self) -> bool {
        self.required_anti_affinity()
            .any(|term| self.keeps_own_workers_apart(term))
    }

    /// Whether the gpu-allocator's placement accounts for every required
    /// placement rule of the workers, so pinning them to the admitted nodes
    /// leaves them schedulable: node selector, tolerations and required node
    /// affinity it reads; required pod affinity it cannot see (other pods'
    /// labels), nor pod anti-affinity other than keeping the job's own
    /// workers apart.
    pub fn placement_fully_planned(&self) -> bool {
        let Some(affinity) = self.affinity() else {
            return true;
        };
        let pod_affinity = affinity
            .pod_affinity
            .as_ref()
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_some_and(|terms| !terms.is_empty());
        !pod_affinity
            && self
                .required_anti_affinity()
                .all(|term| self.keeps_own_workers_apart(term))
    }

    fn affinity(&self) -> Option<&Affinity> {
        self.spec.scheduling.as_ref()?.affinity.as_ref()
    }

    fn required_anti_affinity(&self) -> impl Iterator<Item = &PodAffinityTerm> {
        self.affinity()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten()
    }

    fn keeps_own_workers_apart(&self, term: &PodAffinityTerm) -> bool {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let namespace = self.metadata.namespace.as_deref().unwrap_or_default();
        // An empty list and no selector mean the pod's own namespace.
        let own_namespace = term.namespace_selector.is_none()
            && term
                .namespaces
                .as_ref()
                .is_none_or(|n| n.is_empty() || n.iter().any(|ns| ns == namespace));
        term.topology_key == LABEL_HOSTNAME
            && own_namespace
            && term
                .label_selector
                .as_ref()
                .is_some_and(|s| selects(s, &worker_pod_labels(name)))
    }
}

/// Whether `selector` picks an object with `labels`. A selector that names
/// no requirement picks nothing here: Kubernetes reads a null selector in
/// an affinity term as matching no pods.
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector.match_labels.iter().flatten();
    let expressions = selector.match_expressions.iter().flatten();
    if match_labels.clone().next().is_none() && expressions.clone().next().is_none() {
        return false;
    }
    match_labels.clone().all(|(k, v)| labels.get(k) == Some(v))
        && expressions.clone().all(|e| {
            let value = labels.get(&e.key);
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        NodeAffinity, NodeSelector, NodeSelectorTerm, PodAffinity, PodAntiAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;
    use crate::{SchedulingSpec, TrainingJobSpec};

    fn job(affinity: Option<Affinity>) -> TrainingJob {
        let mut job = TrainingJob::new(
            "bert",
            TrainingJobSpec {
                scheduling: Some(SchedulingSpec {
                    affinity,
                    ..SchedulingSpec::default()
                }),
                ..TrainingJobSpec::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job
    }

    fn term(
        topology: &str,
        key: &str,
        value: &str,
        namespaces: Option<Vec<String>>,
    ) -> PodAffinityTerm {
        PodAffinityTerm {
            topology_key: topology.into(),
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: key.into(),
                    operator: "In".into(),
                    values: Some(vec![value.into()]),
                }]),
                ..LabelSelector::default()
            }),
            namespaces,
            ..PodAffinityTerm::default()
        }
    }

    fn anti(terms: Vec<PodAffinityTerm>) -> Option<Affinity> {
        Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(terms),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        })
    }

    #[test]
    fn anti_affinity_on_the_jobs_own_workers_per_host_is_one_worker_per_node() {
        // The reference's advanced example.
        let own = job(anti(vec![term(
            LABEL_HOSTNAME,
            "training-job",
            "bert",
            None,
        )]));
        assert!(own.workers_one_per_node());
        assert!(own.placement_fully_planned());
        let listed = job(anti(vec![term(
            LABEL_HOSTNAME,
            LABEL_JOB,
            "bert",
            Some(vec!["ml".into()]),
        )]));
        assert!(listed.workers_one_per_node());

        for other in [
            // Another job's pods, another namespace, another topology.
            term(LABEL_HOSTNAME, "training-job", "gpt", None),
            term(
                LABEL_HOSTNAME,
                "training-job",
                "bert",
                Some(vec!["prod".into()]),
            ),
            term("topology.kubernetes.io/zone", "training-job", "bert", None),
        ] {
            let job = job(anti(vec![other.clone()]));
            assert!(!job.workers_one_per_node(), "{other:?}");
            assert!(!job.placement_fully_planned(), "{other:?}");
        }
        let empty_selector = PodAffinityTerm {
            label_selector: Some(LabelSelector::default()),
            ..term(LABEL_HOSTNAME, "x", "y", None)
        };
        assert!(!job(anti(vec![empty_selector])).workers_one_per_node());
    }

    #[test]
    fn placement_is_fully_planned_unless_a_rule_the_allocator_cannot_see_is_required() {
        assert!(job(None).placement_fully_planned());
        assert!(!job(None).workers_one_per_node());
        let node_affinity = job(Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm::default()],
                }),
                ..NodeAffinity::default()
            }),
            ..Affinity::default()
        }));
        assert!(
            node_affinity.placement_fully_planned(),
            "the allocator reads it"
        );
        let pod_affinity = job(Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term(
                    LABEL_HOSTNAME,
                    "app",
                    "cache",
                    None,
                )]),
                ..PodAffinity::default()
            }),
            ..Affinity::default()
        }));
        assert!(!pod_affinity.placement_fully_planned());
    }
}
