//! The labels a TrainingJob's worker pods carry, and what the job's
//! `scheduling.affinity` asks of where those workers run.
//!
//! The gpu-allocator places every worker on a node at admission, and the
//! planner pins the workers to those nodes. Both read a job's affinity
//! here, so the allocator plans only what the pin lets the pods do: a
//! required pod anti-affinity that keeps the job's own workers on separate
//! hosts (the usual way to give each worker a node) becomes one worker per
//! node in the plan, a required pod affinity among them keeps the gang in
//! one zone, rack or node, and required node affinity limits the nodes it
//! places on; constraints the allocator cannot see (affinity to other pods)
//! leave the workers unpinned, to the scheduler.

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
/// Worker pod label the Job controller sets on an Indexed Job's pods: the
/// worker's completion index, which is its rank.
pub const LABEL_WORKER_INDEX: &str = "batch.kubernetes.io/job-completion-index";
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
    /// that picks the job's worker pods and no others).
    pub fn workers_one_per_node(&self) -> bool {
        self.required_anti_affinity()
            .any(|term| self.keeps_own_workers_apart(term))
    }

    /// Topology keys one domain of which must hold every worker: those of
    /// the required pod affinity terms that pick the job's own workers and no
    /// others (`topology.kubernetes.io/zone` keeps the gang in one zone,
    /// `kubernetes.io/hostname` on one node). Kubernetes lets the first
    /// worker go anywhere and the others only where it went.
    pub fn workers_kept_within(&self) -> impl Iterator<Item = &str> {
        self.required_affinity()
            .filter(|term| self.selects_own_workers_only(term))
            .map(|term| term.topology_key.as_str())
    }

    /// Topology keys of every required pod affinity term, whatever pods it
    /// selects: kube-scheduler places such a pod only on nodes that carry
    /// each key, even the first worker of a gang that selects itself.
    pub fn pod_affinity_keys(&self) -> impl Iterator<Item = &str> {
        self.required_affinity()
            .map(|term| term.topology_key.as_str())
    }

    /// Whether pinning the workers to the nodes the gpu-allocator placed
    /// them on leaves them schedulable: node selector, tolerations and
    /// required node affinity it reads; required pod affinity only among the
    /// job's own workers, and only where the placement put every worker in
    /// one domain of the term's topology key (`placed_within(key)`); pod
    /// anti-affinity only keeping the job's own workers apart. Affinity to
    /// other pods it cannot see (their labels).
    pub fn placement_fully_planned(&self, placed_within: impl Fn(&str) -> bool) -> bool {
        self.required_affinity()
            .all(|term| self.selects_own_workers_only(term) && placed_within(&term.topology_key))
            && self
                .required_anti_affinity()
                .all(|term| self.keeps_own_workers_apart(term))
    }

    fn affinity(&self) -> Option<&Affinity> {
        self.spec.scheduling.as_ref()?.affinity.as_ref()
    }

    fn required_affinity(&self) -> impl Iterator<Item = &PodAffinityTerm> {
        self.affinity()
            .and_then(|a| a.pod_affinity.as_ref())
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten()
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
        term.topology_key == LABEL_HOSTNAME && self.selects_own_workers_only(term)
    }

    /// Whether a pod (anti-)affinity term picks the job's worker pods and
    /// nothing else: in the job's namespace, with a selector that names the
    /// job (`trainyard.dev/job` or `training-job`). A selector on the role
    /// alone would pick other jobs' workers too, which the allocator does
    /// not see.
    fn selects_own_workers_only(&self, term: &PodAffinityTerm) -> bool {
        let name = self.metadata.name.as_deref().unwrap_or_default();
        let namespace = self.metadata.namespace.as_deref().unwrap_or_default();
        // An empty list and no selector mean the pod's own namespace.
        let own_namespace = term.namespace_selector.is_none()
            && term
                .namespaces
                .as_ref()
                .is_none_or(|n| n.is_empty() || n.iter().any(|ns| ns == namespace));
        own_namespace
            && term
                .label_selector
                .as_ref()
                .is_some_and(|s| selects(s, &worker_pod_labels(name)) && names_only_job(s, name))
    }
}

/// Whether `selector` requires a job-name label to be `name` and nothing else.
fn names_only_job(selector: &LabelSelector, name: &str) -> bool {
    let job_label = |key: &str| key == LABEL_JOB || key == LABEL_TRAINING_JOB;
    selector
        .match_labels
        .iter()
        .flatten()
        .any(|(k, v)| job_label(k) && v == name)
        || selector.match_expressions.iter().flatten().any(|e| {
            job_label(&e.key)
                && e.operator == "In"
                && e.values
                    .as_deref()
                    .is_some_and(|v| !v.is_empty() && v.iter().all(|v| v == name))
        })
}

/// Whether `selector` picks an object with `labels`. A selector that names
/// no requirement picks nothing here: Kubernetes reads a null selector in
/// an affinity term as matching no pods.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
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
        assert!(own.placement_fully_planned(|_| false));
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
            // Every trainyard worker in the namespace, other jobs' too.
            term(LABEL_HOSTNAME, LABEL_ROLE, ROLE_WORKER, None),
        ] {
            let job = job(anti(vec![other.clone()]));
            assert!(!job.workers_one_per_node(), "{other:?}");
            assert!(!job.placement_fully_planned(|_| true), "{other:?}");
        }
        let empty_selector = PodAffinityTerm {
            label_selector: Some(LabelSelector::default()),
            ..term(LABEL_HOSTNAME, "x", "y", None)
        };
        assert!(!job(anti(vec![empty_selector])).workers_one_per_node());
    }

    #[test]
    fn placement_is_fully_planned_unless_a_rule_the_allocator_cannot_see_is_required() {
        assert!(job(None).placement_fully_planned(|_| false));
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
            node_affinity.placement_fully_planned(|_| false),
            "the allocator reads it"
        );
        let pod_affinity = job(together(vec![term(LABEL_HOSTNAME, "app", "cache", None)]));
        assert!(!pod_affinity.placement_fully_planned(|_| true));
        assert_eq!(pod_affinity.workers_kept_within().count(), 0);
    }

    fn together(terms: Vec<PodAffinityTerm>) -> Option<Affinity> {
        Some(Affinity {
            pod_affinity: Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(terms),
                ..PodAffinity::default()
            }),
            ..Affinity::default()
        })
    }

    #[test]
    fn affinity_among_the_jobs_own_workers_keeps_them_in_one_domain() {
        const ZONE: &str = "topology.kubernetes.io/zone";
        let zone = job(together(vec![term(ZONE, LABEL_JOB, "bert", None)]));
        assert_eq!(zone.workers_kept_within().collect::<Vec<_>>(), vec![ZONE]);
        assert!(!zone.workers_one_per_node());
        // Pinned only where the allocator put every worker in one zone.
        assert!(zone.placement_fully_planned(|key| key == ZONE));
        assert!(!zone.placement_fully_planned(|key| key == LABEL_HOSTNAME));

        let both = job(together(vec![
            term(ZONE, "training-job", "bert", None),
            term(LABEL_HOSTNAME, LABEL_JOB, "bert", None),
        ]));
        assert_eq!(
            both.workers_kept_within().collect::<Vec<_>>(),
            vec![ZONE, LABEL_HOSTNAME]
        );
        assert!(both.placement_fully_planned(|_| true));
        assert!(!both.placement_fully_planned(|key| key == ZONE));

        // A selector that also picks other jobs' pods is affinity to pods the
        // allocator cannot see.
        let wide = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: LABEL_JOB.into(),
                operator: "In".into(),
                values: Some(vec!["bert".into(), "gpt".into()]),
            }]),
            ..LabelSelector::default()
        };
        let wide = job(together(vec![PodAffinityTerm {
            label_selector: Some(wide),
            ..term(ZONE, "x", "y", None)
        }]));
        assert_eq!(wide.workers_kept_within().count(), 0);
        assert!(!wide.placement_fully_planned(|_| true));
        let other_namespace = job(together(vec![term(
            ZONE,
            LABEL_JOB,
            "bert",
            Some(vec!["prod".into()]),
        )]));
        assert!(!other_namespace.placement_fully_planned(|_| true));
    }
}
