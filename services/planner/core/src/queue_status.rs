//! A TrainingQueue's status from the gpu-allocator's report. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use trainyard_api::{
    Condition, ConditionStatus, FairSharingStatus, FlavorUsage, MigUsage, QUEUE_ACTIVE,
    TrainingQueueStatus,
};
use trainyard_contracts::decisions::QueueStatusReported;

use crate::resources::{GPU_RESOURCE, MIG_RESOURCE_PREFIX};

fn units(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// The queue's status: the report's figures, one usage entry per flavor in
/// the report's order (whole GPUs, then MIG slices per profile), and the
/// Active condition, whose transition time moves only when it flips.
/// Resources other than whole GPUs and MIG slices are not in the CRD and
/// are left out.
pub fn queue_status(
    report: &QueueStatusReported,
    previous: Option<&TrainingQueueStatus>,
    generation: Option<i64>,
    now: Time,
) -> TrainingQueueStatus {
    let mut usage: Vec<FlavorUsage> = Vec::new();
    for resource in &report.usage {
        let at = match usage.iter().position(|u| u.name == resource.flavor) {
            Some(at) => at,
            None => {
                usage.push(FlavorUsage {
                    name: resource.flavor.clone(),
                    ..FlavorUsage::default()
                });
                usage.len() - 1
            }
        };
        let flavor = &mut usage[at];
        if resource.resource == GPU_RESOURCE {
            flavor.used = units(resource.used);
            flavor.borrowed = units(resource.borrowed);
        } else if let Some(profile) = resource.resource.strip_prefix(MIG_RESOURCE_PREFIX) {
            flavor.mig_slices.push(MigUsage {
                profile: profile.to_string(),
                used: units(resource.used),
                borrowed: units(resource.borrowed),
            });
        }
    }
    let mut conditions = previous.map(|s| s.conditions.clone()).unwrap_or_default();
    let mut active = Condition::new(
        QUEUE_ACTIVE,
        if report.active {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        report.reason.as_str(),
        report.message.as_str(),
    );
    active.last_transition_time = Some(now);
    active.observed_generation = generation;
    trainyard_api::set_condition(&mut conditions, active);
    TrainingQueueStatus {
        pending: report.pending,
        admitted: report.admitted,
        usage,
        fair_sharing: Some(FairSharingStatus {
            weighted_share: report.weighted_share,
        }),
        // Written from the cost-optimizer's reports (`budget_status`).
        budget: previous.and_then(|s| s.budget.clone()),
        conditions,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use trainyard_contracts::decisions::ResourceUsage;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).expect("valid time"))
    }

    fn resource(flavor: &str, resource: &str, used: u64, borrowed: u64) -> ResourceUsage {
        ResourceUsage {
            flavor: flavor.into(),
            resource: resource.into(),
            used,
            borrowed,
        }
    }

    fn report(active: bool) -> QueueStatusReported {
        QueueStatusReported {
            pending: 3,
            admitted: 5,
            usage: vec![
                resource("a100", "nvidia.com/gpu", 40, 8),
                resource("a100", "nvidia.com/mig-1g.10gb", 4, 1),
                resource("t4", "nvidia.com/gpu", 2, 0),
                resource("t4", "nvidia.com/gpu.shared", 3, 0),
            ],
            weighted_share: 250,
            active,
            reason: if active { "Ready" } else { "Stopped" }.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn usage_is_grouped_by_flavor_with_mig_slices_per_profile() {
        let status = queue_status(&report(true), None, Some(4), at(100));
        assert_eq!((status.pending, status.admitted), (3, 5));
        assert_eq!(
            status.usage,
            [
                FlavorUsage {
                    name: "a100".into(),
                    used: 40,
                    borrowed: 8,
                    mig_slices: vec![MigUsage {
                        profile: "1g.10gb".into(),
                        used: 4,
                        borrowed: 1,
                    }],
                },
                FlavorUsage {
                    name: "t4".into(),
                    used: 2,
                    borrowed: 0,
                    mig_slices: vec![],
                },
            ]
        );
        assert_eq!(status.fair_sharing.map(|f| f.weighted_share), Some(250));
        assert_eq!(status.observed_generation, Some(4));
        let active =
            trainyard_api::find_condition(&status.conditions, QUEUE_ACTIVE).expect("Active is set");
        assert!(active.is_true());
        assert_eq!(active.reason.as_deref(), Some("Ready"));
    }

    #[test]
    fn the_active_condition_keeps_its_transition_time_until_it_flips() {
        let first = queue_status(&report(true), None, Some(1), at(100));
        let again = queue_status(&report(true), Some(&first), Some(1), at(200));
        let time = |status: &TrainingQueueStatus| {
            trainyard_api::find_condition(&status.conditions, QUEUE_ACTIVE)
                .and_then(|c| c.last_transition_time.clone())
        };
        assert_eq!(time(&again), Some(at(100)));
        let stopped = queue_status(&report(false), Some(&again), Some(2), at(300));
        assert_eq!(time(&stopped), Some(at(300)));
        let active = trainyard_api::find_condition(&stopped.conditions, QUEUE_ACTIVE)
            .expect("Active is set");
        assert!(!active.is_true());
        assert_eq!(active.reason.as_deref(), Some("Stopped"));
        assert_eq!(stopped.conditions.len(), 1);
    }
}
