//! Allocator configuration: flavors, aging, backfill and preemption knobs.
//! Loaded by the service binary; the core only validates it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::AllocatorError;
use crate::types::{CapacityType, TaintEffect, Toleration, names};

/// Everything the allocator needs besides the event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllocatorConfig {
    /// Queue used by jobs that name none.
    pub default_queue: String,
    /// Node label naming the rack / NVLink domain (zone uses the standard label).
    pub rack_label: String,
    /// Operator-defined flavors, matched against nodes in this order; a node
    /// belongs to the first flavor it matches.
    pub flavors: Vec<FlavorSpec>,
    /// Whether nodes that match no configured flavor get an automatic flavor
    /// named `<gpu product>.<capacity type>` (e.g. `NVIDIA-A100-SXM4-80GB.spot`).
    pub auto_flavors: bool,
    /// Tolerations injected for jobs admitted to an automatic flavor.
    pub auto_flavor_tolerations: Vec<Toleration>,
    /// Extra tolerations injected when an automatic flavor is spot capacity.
    pub spot_tolerations: Vec<Toleration>,
    /// Priority aging, so that nothing starves.
    pub aging: AgingPolicy,
    /// Backfill and reservations for blocked jobs.
    pub backfill: BackfillPolicy,
    /// Preemption knobs.
    pub preemption: PreemptionPolicy,
    /// How long finished job uids are remembered so that a replayed
    /// `JobSubmitted` for a finished job is ignored instead of re-run.
    pub tombstone_retention_secs: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            default_queue: "default".to_string(),
            rack_label: names::NVLINK_CLIQUE_LABEL.to_string(),
            flavors: Vec::new(),
            auto_flavors: true,
            auto_flavor_tolerations: vec![Toleration::exists(
                names::GPU_RESOURCE,
                TaintEffect::NoSchedule,
            )],
            spot_tolerations: vec![Toleration::equal(
                names::GKE_SPOT_LABEL,
                "true",
                TaintEffect::NoSchedule,
            )],
            aging: AgingPolicy::default(),
            backfill: BackfillPolicy::default(),
            preemption: PreemptionPolicy::default(),
            tombstone_retention_secs: 7 * 24 * 3600,
        }
    }
}

/// An operator-defined flavor: the nodes that carry all of its labels (and,
/// when given, this GPU product and capacity type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct FlavorSpec {
    /// Name quotas refer to.
    pub name: String,
    /// Required value of `nvidia.com/gpu.product`.
    pub gpu_product: Option<String>,
    /// Required capacity type, read from the Karpenter, GKE or EKS labels.
    pub capacity_type: Option<CapacityType>,
    /// Further labels a node must carry; also injected as node selector.
    pub node_labels: BTreeMap<String, String>,
    /// Tolerations injected for jobs admitted to this flavor; node taints they
    /// cover do not count against a job.
    pub tolerations: Vec<Toleration>,
}

/// Priority aging: a pending job gains `step` priority per `intervalSecs` of
/// waiting, up to `maxBoost` in total. The configured policy applies to every
/// queue that does not set its own ([`crate::QueueSpec::aging`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AgingPolicy {
    /// Seconds of waiting per priority step; 0 disables aging.
    pub interval_secs: u64,
    /// Priority gained per step (at least 1).
    pub step: i32,
    /// Largest boost a job can gain.
    pub max_boost: i32,
}

impl Default for AgingPolicy {
    fn default() -> Self {
        AgingPolicy {
            interval_secs: 600,
            step: 1,
            max_boost: 1_000,
        }
    }
}

impl AgingPolicy {
    /// Boost for a job that has waited `waited_secs`.
    pub fn boost(&self, waited_secs: u64) -> i32 {
        if self.interval_secs == 0 {
            return 0;
        }
        let steps = waited_secs / self.interval_secs;
        let boost = steps.saturating_mul(u64::try_from(self.step.max(0)).unwrap_or(0));
        let cap = u64::try_from(self.max_boost.max(0)).unwrap_or(0);
        i32::try_from(boost.min(cap)).unwrap_or(i32::MAX)
    }

    /// Rejects policies that cannot age sensibly: the offending field (relative
    /// to the policy) and why.
    pub(crate) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.max_boost < 0 {
            return Err(("maxBoost", "must be >= 0"));
        }
        if self.step < 1 {
            return Err(("step", "must be >= 1"));
        }
        Ok(())
    }
}

/// Backfill: blocked jobs at the front get a reservation (nodes and a start
/// time); later jobs may only use capacity that does not delay it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackfillPolicy {
    /// With backfill off, the first blocked job blocks the whole cycle for its
    /// flavor's nodes (strict order).
    pub enabled: bool,
    /// How many blocked jobs per cycle get a reservation.
    pub max_reservations: u32,
    /// Runtime assumed for running jobs without an estimate, when computing
    /// when a reserved job can start.
    pub assumed_runtime_secs: u64,
    /// How long a queue's first blocked job waits before the queue keeps the
    /// nominal quota it frees for that job (a queue hold; 0: at once). Until
    /// then later jobs of the queue may take it (Kueue's BestEffortFIFO): a
    /// short wait costs less than the idle quota a hold would leave.
    pub queue_hold_after_secs: u64,
    /// How long a job larger than its queue's nominal quota (it can only run
    /// by borrowing) waits before its cohort keeps the quota any member
    /// frees for it, from every member's jobs, not only from borrowers (0:
    /// at once). Each queue's jobs otherwise take back their own nominal
    /// quota as it frees up, so in a busy cohort such a job never starts.
    /// Once it runs it is not a victim of reclaim or fair share, which would
    /// take back at once what it waited for. Jobs ending before it can
    /// expect to start still pass.
    pub borrower_hold_after_secs: u64,
}

impl Default for BackfillPolicy {
    fn default() -> Self {
        BackfillPolicy {
            enabled: true,
            max_reservations: 4,
            assumed_runtime_secs: 4 * 3600,
            queue_hold_after_secs: 600,
            borrower_hold_after_secs: 3600,
        }
    }
}

/// Preemption knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PreemptionPolicy {
    /// Master switch.
    pub enabled: bool,
    /// Time a victim gets to checkpoint before it is evicted.
    pub grace_period_secs: u64,
    /// Preemption decisions per cycle.
    pub max_preemptions_per_cycle: u32,
    /// Pending jobs examined for preemption per cycle (victim search is the
    /// expensive part of a cycle, so it is bounded).
    pub max_attempts_per_cycle: u32,
    /// Largest victim set considered for one preemptor.
    pub max_victims: u32,
}

impl Default for PreemptionPolicy {
    fn default() -> Self {
        PreemptionPolicy {
            enabled: true,
            grace_period_secs: 120,
            max_preemptions_per_cycle: 8,
            max_attempts_per_cycle: 4,
            max_victims: 32,
        }
    }
}

fn config_error(field: impl Into<String>, reason: impl Into<String>) -> AllocatorError {
    AllocatorError::InvalidConfig {
        field: field.into(),
        reason: reason.into(),
    }
}

impl AllocatorConfig {
    /// Rejects configurations the allocator cannot honour.
    pub fn validate(&self) -> Result<(), AllocatorError> {
        if self.default_queue.trim().is_empty() {
            return Err(config_error("defaultQueue", "must not be empty"));
        }
        if self.rack_label.trim().is_empty() {
            return Err(config_error("rackLabel", "must not be empty"));
        }
        let mut seen = BTreeSet::new();
        for (i, flavor) in self.flavors.iter().enumerate() {
            if flavor.name.trim().is_empty() {
                return Err(config_error(
                    format!("flavors[{i}].name"),
                    "must not be empty",
                ));
            }
            if !seen.insert(flavor.name.as_str()) {
                return Err(config_error(
                    format!("flavors[{i}].name"),
                    format!("duplicate flavor name {}", flavor.name),
                ));
            }
            if flavor.gpu_product.is_none()
                && flavor.capacity_type.is_none()
                && flavor.node_labels.is_empty()
            {
                return Err(config_error(
                    format!("flavors[{i}]"),
                    "needs gpuProduct, capacityType or nodeLabels, otherwise it matches every node",
                ));
            }
        }
        if let Err((field, reason)) = self.aging.check() {
            return Err(config_error(format!("aging.{field}"), reason));
        }
        if self.backfill.assumed_runtime_secs == 0 {
            return Err(config_error("backfill.assumedRuntimeSecs", "must be > 0"));
        }
        if self.preemption.max_victims == 0 {
            return Err(config_error("preemption.maxVictims", "must be > 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(AllocatorConfig::default().validate(), Ok(()));
    }

    #[test]
    fn duplicate_flavor_names_are_rejected_with_field_path() {
        let flavor = FlavorSpec {
            name: "a100".into(),
            gpu_product: Some("A100".into()),
            ..FlavorSpec::default()
        };
        let config = AllocatorConfig {
            flavors: vec![flavor.clone(), flavor],
            ..AllocatorConfig::default()
        };
        match config.validate() {
            Err(AllocatorError::InvalidConfig { field, .. }) => {
                assert_eq!(field, "flavors[1].name")
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn aging_boost_grows_per_interval_and_is_capped() {
        let aging = AgingPolicy {
            interval_secs: 100,
            step: 1,
            max_boost: 3,
        };
        assert_eq!(aging.boost(99), 0);
        assert_eq!(aging.boost(250), 2);
        assert_eq!(aging.boost(10_000), 3);
        let stepped = AgingPolicy {
            step: 5,
            max_boost: 12,
            ..aging
        };
        assert_eq!(stepped.boost(250), 10);
        assert_eq!(stepped.boost(10_000), 12);
        let off = AgingPolicy {
            interval_secs: 0,
            ..aging
        };
        assert_eq!(off.boost(10_000), 0);
        let bad = AgingPolicy { step: 0, ..aging };
        assert!(matches!(
            AllocatorConfig { aging: bad, ..AllocatorConfig::default() }.validate(),
            Err(AllocatorError::InvalidConfig { ref field, .. }) if field == "aging.step"
        ));
    }
}
