//! Resource requests and limits of a worker container.
//!
//! The GPU resource comes from `gpusPerWorker` alone, so the queue (which admits
//! `numWorkers × gpusPerWorker`) and the kubelet (which enforces the container's
//! resources) can never disagree. A spec may still list the GPU resource in
//! `resources` as long as it says the same thing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use trainyard_api::TrainingJobSpec;

use crate::error::PlanError;

/// Extended resource of a whole NVIDIA GPU.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Prefix of the extended resource of a MIG slice, `nvidia.com/mig-<profile>`.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Resource name one worker's GPUs are requested as: `nvidia.com/gpu`, or
/// `nvidia.com/mig-<profile>` for MIG slices (the GPU operator's mixed strategy).
pub fn gpu_resource_name(spec: &TrainingJobSpec) -> String {
    match spec
        .scheduling
        .as_ref()
        .and_then(|s| s.mig_profile.as_deref())
    {
        Some(profile) => format!("{MIG_RESOURCE_PREFIX}{profile}"),
        None => GPU_RESOURCE.to_owned(),
    }
}

/// Requests and limits of a worker: `spec.resources` plus the GPU resource set from
/// `gpusPerWorker` in both (extended resources need requests equal to limits).
pub(crate) fn worker_resources(
    spec: &TrainingJobSpec,
) -> Result<Option<ResourceRequirements>, PlanError> {
    let gpus = spec.gpus_per_worker();
    let gpu_resource = gpu_resource_name(spec);
    let mut requirements = spec.resources.clone().unwrap_or_default();
    set_gpus(&mut requirements.requests, "requests", &gpu_resource, gpus)?;
    set_gpus(&mut requirements.limits, "limits", &gpu_resource, gpus)?;
    if requirements == ResourceRequirements::default() {
        return Ok(None);
    }
    Ok(Some(requirements))
}

fn set_gpus(
    section: &mut Option<BTreeMap<String, Quantity>>,
    section_name: &'static str,
    gpu_resource: &str,
    gpus: u32,
) -> Result<(), PlanError> {
    let quantities = section.get_or_insert_with(BTreeMap::new);
    // With MIG, whole GPUs must not be requested as well: that would double the ask.
    let mut expected = vec![(gpu_resource.to_owned(), gpus)];
    if gpu_resource != GPU_RESOURCE {
        expected.push((GPU_RESOURCE.to_owned(), 0));
    }
    for (resource, want) in &expected {
        if let Some(quantity) = quantities.get(resource)
            && parse_whole_quantity(&quantity.0) != Some(*want)
        {
            return Err(PlanError::GpuResourceMismatch {
                section: section_name,
                resource: resource.clone(),
                value: quantity.0.clone(),
                gpus_per_worker: gpus,
            });
        }
    }
    quantities.remove(GPU_RESOURCE);
    if gpus > 0 {
        quantities.insert(gpu_resource.to_owned(), Quantity(gpus.to_string()));
    } else {
        quantities.remove(gpu_resource);
    }
    if quantities.is_empty() {
        *section = None;
    }
    Ok(())
}

/// Parses a quantity that must be a whole count, as extended resources are ("4").
fn parse_whole_quantity(quantity: &str) -> Option<u32> {
    quantity.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::SchedulingSpec;

    fn spec_with(gpus: u32, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> TrainingJobSpec {
        let to_map = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        TrainingJobSpec {
            model: "m".into(),
            dataset: "d".into(),
            num_workers: 1,
            gpus_per_worker: Some(gpus),
            resources: Some(ResourceRequirements {
                requests: to_map(requests),
                limits: to_map(limits),
                ..ResourceRequirements::default()
            }),
            ..TrainingJobSpec::default()
        }
    }

    fn gpu_limit(requirements: &Option<ResourceRequirements>, resource: &str) -> Option<String> {
        requirements
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource))
            .map(|q| q.0.clone())
    }

    #[test]
    fn gpus_come_from_gpus_per_worker() -> Result<(), PlanError> {
        let resources = worker_resources(&spec_with(2, &[("cpu", "8")], &[]))?;
        assert_eq!(gpu_limit(&resources, GPU_RESOURCE).as_deref(), Some("2"));
        let requests = resources.as_ref().and_then(|r| r.requests.as_ref());
        assert_eq!(
            requests
                .and_then(|r| r.get(GPU_RESOURCE))
                .map(|q| q.0.as_str()),
            Some("2")
        );
        assert_eq!(
            requests.and_then(|r| r.get("cpu")).map(|q| q.0.as_str()),
            Some("8")
        );
        Ok(())
    }

    #[test]
    fn consistent_spec_gpus_are_accepted_and_inconsistent_ones_named() -> Result<(), PlanError> {
        let consistent = spec_with(4, &[("nvidia.com/gpu", "4")], &[("nvidia.com/gpu", "4")]);
        assert_eq!(
            gpu_limit(&worker_resources(&consistent)?, GPU_RESOURCE).as_deref(),
            Some("4")
        );

        let wrong = spec_with(4, &[], &[("nvidia.com/gpu", "2")]);
        let error = worker_resources(&wrong).err();
        assert!(matches!(
            &error,
            Some(PlanError::GpuResourceMismatch {
                section: "limits",
                ..
            })
        ));
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("spec.resources.limits"), "{message}");
        assert!(message.contains("gpusPerWorker is 4"), "{message}");
        Ok(())
    }

    #[test]
    fn cpu_jobs_request_no_gpu_and_mig_jobs_request_slices() -> Result<(), PlanError> {
        assert_eq!(worker_resources(&spec_with(0, &[], &[]))?, None);

        let mut mig = spec_with(2, &[], &[]);
        mig.scheduling = Some(SchedulingSpec {
            mig_profile: Some("1g.10gb".into()),
            ..SchedulingSpec::default()
        });
        let resources = worker_resources(&mig)?;
        assert_eq!(
            gpu_limit(&resources, "nvidia.com/mig-1g.10gb").as_deref(),
            Some("2")
        );
        assert_eq!(gpu_limit(&resources, GPU_RESOURCE), None);
        Ok(())
    }
}
