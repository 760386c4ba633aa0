//! Checks a TrainingJob must pass before any object is created for it.
//!
//! The apiserver already enforces the CRD schema, but a spec can pass the schema and
//! still be impossible to run: it arrived over NATS, asks for more GPUs per worker than
//! any node has, or names a checkpoint that is not a URI. Such a job fails at once with
//! a condition naming the field and the fix, instead of sitting in the queue forever.

use trainyard_api::TrainingJob;

use crate::config::PlannerConfig;
use crate::env::hyperparameter_env;
use crate::error::PlanError;
use crate::names::{max_name_length, name_problem};
use crate::resources::worker_resources;

/// Identity of a TrainingJob, checked to be present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobIdentity<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
}

/// Name, namespace and uid of `job`; owner references need all three.
pub(crate) fn job_identity(job: &TrainingJob) -> Result<JobIdentity<'_>, PlanError> {
    let name = job
        .metadata
        .name
        .as_deref()
        .ok_or(PlanError::MissingMetadata {
            field: "metadata.name",
            fix: "give the TrainingJob a name",
        })?;
    let namespace = job
        .metadata
        .namespace
        .as_deref()
        .ok_or(PlanError::MissingMetadata {
            field: "metadata.namespace",
            fix: "TrainingJob is namespaced; pass the object as the apiserver returned it",
        })?;
    let uid = job
        .metadata
        .uid
        .as_deref()
        .ok_or(PlanError::MissingMetadata {
            field: "metadata.uid",
            fix: "owner references need the uid; pass the object as the apiserver returned it",
        })?;
    Ok(JobIdentity {
        name,
        namespace,
        uid,
    })
}

/// Runs every pre-flight check, returning the first problem found.
///
/// Order matters only for which problem is reported first: identity, then the CRD's
/// own rules, then what only the planner knows (node sizes, URI syntax, how the
/// spec's resources and hyperparameters turn into pod fields).
pub fn preflight(job: &TrainingJob, config: &PlannerConfig) -> Result<(), PlanError> {
    let identity = job_identity(job)?;
    let spec = &job.spec;
    if let Some(problem) = name_problem(identity.name, spec.num_workers) {
        return Err(PlanError::UnusableName {
            name: identity.name.to_owned(),
            problem,
            max_length: max_name_length(spec.num_workers),
        });
    }
    spec.validate()
        .map_err(|errors| PlanError::InvalidSpec { errors })?;

    // MIG slices are not whole GPUs, so node size in GPUs says nothing about them.
    let uses_mig = spec
        .scheduling
        .as_ref()
        .is_some_and(|s| s.mig_profile.is_some());
    if let Some(largest) = config.largest_node_gpus
        && !uses_mig
        && spec.gpus_per_worker() > largest
    {
        return Err(PlanError::GpusExceedLargestNode {
            requested: spec.gpus_per_worker(),
            largest,
        });
    }
    if let Some(resume_from) = spec
        .checkpoint
        .as_ref()
        .and_then(|c| c.resume_from.as_deref())
        && let Some(problem) = checkpoint_location_problem(resume_from)
    {
        return Err(PlanError::UnparsableResumeFrom {
            value: resume_from.to_owned(),
            problem,
        });
    }
    worker_resources(spec)?;
    hyperparameter_env(spec)?;
    Ok(())
}

/// Says what is wrong with a checkpoint location, or None when it is a URI with a
/// scheme and a location (`s3://bucket/key`, `gs://...`, `file:///...`) or an
/// absolute path.
pub fn checkpoint_location_problem(value: &str) -> Option<&'static str> {
    if value.is_empty() {
        return Some("it is empty");
    }
    if value.chars().any(char::is_whitespace) {
        return Some("it contains whitespace");
    }
    if let Some((scheme, rest)) = value.split_once("://") {
        let scheme_ok = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return Some("the URI scheme is not valid");
        }
        if rest.is_empty() {
            return Some("the URI has nothing after the scheme");
        }
        let names_bucket = matches!(scheme, "s3" | "gs" | "gcs" | "az" | "abfs" | "abfss");
        if names_bucket && rest.starts_with('/') {
            return Some("the URI names no bucket");
        }
        return None;
    }
    if value.starts_with('/') {
        return None;
    }
    if value.contains(':') {
        return Some("it looks like a URI but lacks '://'");
    }
    Some("a path must be absolute (start with '/')")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_locations() {
        for good in [
            "s3://checkpoints/gpt/checkpoint-epoch-10",
            "gs://bucket/run",
            "file:///checkpoints/epoch-3",
            "/checkpoints/epoch-3",
            "hdfs://namenode:8020/ckpt",
        ] {
            assert_eq!(checkpoint_location_problem(good), None, "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("checkpoints/epoch-3", "absolute"),
            ("s3:/bucket/x", "'://'"),
            ("s3:///x", "bucket"),
            ("3s://bucket", "scheme"),
            ("s3://", "nothing after"),
            ("/checkpoints/epoch 3", "whitespace"),
        ] {
            assert!(
                checkpoint_location_problem(bad).is_some_and(|p| p.contains(why)),
                "{bad}: {:?}",
                checkpoint_location_problem(bad)
            );
        }
    }
}
