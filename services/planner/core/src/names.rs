//! Names and labels of the objects a TrainingJob owns.
//!
//! Worker pods cannot carry their own index label from a pod template (one template
//! serves every index). Kubernetes adds it: pods of an Indexed Job get the annotation
//! and label `batch.kubernetes.io/job-completion-index`, the host name
//! `<job>-<index>`, and with `subdomain` set the DNS name
//! `<job>-<index>.<subdomain>.<namespace>.svc`. Workers read their index from that
//! annotation (`TRAINYARD_WORKER_INDEX`), and peers find each other by those names.

use std::collections::BTreeMap;

pub use trainyard_api::placement::{
    LABEL_ATTEMPT, LABEL_HOSTNAME, LABEL_JOB, LABEL_MANAGED_BY, LABEL_ROLE, LABEL_TRAINING_JOB,
    MANAGED_BY,
};
/// Scheduling gate on the worker pods of a job planned onto several nodes:
/// each pod waits for the planner to give it the node its index was placed on.
pub const PLACEMENT_GATE: &str = "trainyard.dev/placement";
/// Annotation (and label) Kubernetes sets on each pod of an Indexed Job.
pub const COMPLETION_INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// Longest DNS label: Service names and pod host names are DNS labels.
const MAX_DNS_LABEL: usize = 63;
/// Suffix of the worker Service name.
const SERVICE_SUFFIX: &str = "-workers";
/// Digits reserved for the attempt number in Job names, so a job that is restarted
/// or preempted many times never outgrows its host names.
const RESERVED_ATTEMPT_DIGITS: usize = 4;

/// What an owned object is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Config,
    Service,
    Checkpoints,
    Credentials,
}

impl Role {
    /// Value of [`LABEL_ROLE`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => trainyard_api::placement::ROLE_WORKER,
            Self::Config => "config",
            Self::Service => "service",
            Self::Checkpoints => "checkpoints",
            Self::Credentials => "credentials",
        }
    }
}

/// Name of the batch/v1 Job running `attempt` of TrainingJob `training_job`.
///
/// Every attempt is a new Job: a failed gang is replaced as a whole, never one worker.
pub fn job_name(training_job: &str, attempt: u32) -> String {
    format!("{training_job}-a{attempt}")
}

/// Name of the Secret with the NATS token of `attempt`'s workers.
pub fn worker_credentials_name(training_job: &str, attempt: u32) -> String {
    format!("{}-nats", job_name(training_job, attempt))
}

/// Name of the headless worker Service (also the pods' `subdomain`).
pub fn service_name(training_job: &str) -> String {
    format!("{training_job}{SERVICE_SUFFIX}")
}

pub use trainyard_api::trainingjob::checkpoint_claim_name;

/// Name of the ConfigMap with hyperparameters and training configuration.
pub fn config_map_name(training_job: &str) -> String {
    format!("{training_job}-config")
}

/// Stable DNS name of worker `index` of `job_name`, resolvable from any namespace
/// without assuming the cluster domain.
pub fn worker_host(job_name: &str, index: u32, service: &str, namespace: &str) -> String {
    format!("{job_name}-{index}.{service}.{namespace}.svc")
}

/// Labels every owned object carries.
pub fn common_labels(
    training_job: &str,
    role: Role,
    attempt: u32,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut labels = extra.clone();
    labels.insert(LABEL_JOB.to_owned(), training_job.to_owned());
    labels.insert(LABEL_ROLE.to_owned(), role.as_str().to_owned());
    labels.insert(LABEL_ATTEMPT.to_owned(), attempt.to_string());
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels
}

/// Labels that pick the worker pods of one attempt (the Service selector).
pub fn worker_selector(training_job: &str, attempt: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_JOB.to_owned(), training_job.to_owned()),
        (LABEL_ROLE.to_owned(), Role::Worker.as_str().to_owned()),
        (LABEL_ATTEMPT.to_owned(), attempt.to_string()),
    ])
}

/// Longest TrainingJob name whose Service name and worker host names
/// (`<name>-a<attempt>-<index>`) are still DNS labels for `num_workers` workers.
pub fn max_name_length(num_workers: u32) -> usize {
    let index_digits = num_workers.saturating_sub(1).to_string().len();
    let for_hosts = MAX_DNS_LABEL - "-a".len() - RESERVED_ATTEMPT_DIGITS - "-".len() - index_digits;
    let for_service = MAX_DNS_LABEL - SERVICE_SUFFIX.len();
    for_hosts.min(for_service)
}

/// Checks that `name` can name the worker Service (a DNS-1035 label) and the workers'
/// host names; returns what is wrong otherwise.
pub fn name_problem(name: &str, num_workers: u32) -> Option<String> {
    let max = max_name_length(num_workers);
    if name.len() > max {
        return Some(format!(
            "it has {} characters but {num_workers} workers need host names <name>-a<attempt>-<index> of at most {MAX_DNS_LABEL}",
            name.len()
        ));
    }
    let Some(first) = name.chars().next() else {
        return Some("it is empty".to_owned());
    };
    if !first.is_ascii_lowercase() {
        return Some("a Service name must start with a letter".to_owned());
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Some(format!("{bad:?} is not allowed in a Service name"));
    }
    if name.ends_with('-') {
        return Some("it must not end with '-'".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names() {
        assert_eq!(job_name("bert", 3), "bert-a3");
        assert_eq!(service_name("bert"), "bert-workers");
        assert_eq!(config_map_name("bert"), "bert-config");
        assert_eq!(
            worker_host("bert-a3", 1, "bert-workers", "ml"),
            "bert-a3-1.bert-workers.ml.svc"
        );
    }

    #[test]
    fn names_must_fit_dns_labels() {
        assert_eq!(max_name_length(1), 55);
        assert_eq!(max_name_length(100), 54);
        assert_eq!(name_problem("mnist-training", 2), None);
        assert!(name_problem(&"a".repeat(56), 2).is_some());
        assert!(name_problem("my.job", 2).is_some_and(|p| p.contains("'.'")));
        assert!(name_problem("1job", 2).is_some_and(|p| p.contains("start with a letter")));
        assert_eq!(name_problem("", 2).as_deref(), Some("it is empty"));
    }
}
