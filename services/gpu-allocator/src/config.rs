//! The `gpu_allocator` configuration section and its mapping onto the core's
//! [`AllocatorConfig`].

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_allocator_core::{
    AgingPolicy, AllocatorConfig, BackfillPolicy, CapacityType, FlavorSpec, PreemptionPolicy,
    Toleration,
};
use serde::{Deserialize, Serialize};

/// One operator-defined flavor (`gpu_allocator.flavors[]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct FlavorConfig {
    /// Name TrainingQueue flavors refer to.
    pub name: String,
    /// Required `nvidia.com/gpu.product`.
    pub gpu_product: Option<String>,
    /// Required capacity type (`spot` / `on-demand`).
    pub capacity_type: Option<CapacityType>,
    /// Labels a node must carry; also injected as node selector.
    pub node_labels: BTreeMap<String, String>,
    /// Tolerations injected for jobs admitted to this flavor.
    pub tolerations: Vec<Toleration>,
}

impl From<&FlavorConfig> for FlavorSpec {
    fn from(f: &FlavorConfig) -> Self {
        FlavorSpec {
            name: f.name.clone(),
            gpu_product: f.gpu_product.clone(),
            capacity_type: f.capacity_type,
            node_labels: f.node_labels.clone(),
            tolerations: f.tolerations.clone(),
        }
    }
}

/// A node label that marks spot capacity when it has one of `spot_values`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct CapacityLabel {
    pub label: String,
    pub spot_values: Vec<String>,
}

/// The spot label conventions of Karpenter (the simulator's nodes), EKS, GKE and AKS.
pub fn default_capacity_type_labels() -> Vec<CapacityLabel> {
    let label = |label: &str, value: &str| CapacityLabel {
        label: label.into(),
        spot_values: vec![value.into()],
    };
    vec![
        label("karpenter.sh/capacity-type", "spot"),
        label("eks.amazonaws.com/capacityType", "SPOT"),
        label("cloud.google.com/gke-spot", "true"),
        label("cloud.google.com/gke-preemptible", "true"),
        label("kubernetes.azure.com/scalesetpriority", "spot"),
    ]
}

/// The service's own settings (section `gpu_allocator`; environment
/// `TRAINYARD_GPU_ALLOCATOR__<KEY>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct AllocatorServiceConfig {
    /// Queue of jobs without `scheduling.queue`.
    pub default_queue: String,
    /// Time between admission cycles.
    pub cycle_interval_ms: u64,
    /// Smallest gap between two cycles triggered by arriving events.
    pub event_cycle_min_gap_ms: u64,
    /// Snapshot the state at least every this many cycles (it is also saved
    /// at once when a cycle decided something, and at most every
    /// `snapshot_min_interval_ms` when only messages changed it).
    pub snapshot_every_cycles: u64,
    /// Smallest gap between two snapshots saved for message changes alone;
    /// messages acked since the last snapshot are replayed from their streams
    /// at start.
    pub snapshot_min_interval_ms: u64,
    /// Seconds a preemption victim gets to checkpoint before eviction.
    pub grace_seconds: u64,
    /// Node label naming the rack / NVLink domain.
    pub rack_label: String,
    /// Operator-defined flavors, matched in order before queue-defined ones.
    pub flavors: Vec<FlavorConfig>,
    /// Nodes that match no flavor get `<gpu product>.<capacity type>`.
    pub auto_flavors: bool,
    /// PriorityClass name → priority value. A job without a class (or with an
    /// unknown one) gets its queue's `priority.defaultPriority`.
    pub priority_classes: BTreeMap<String, i32>,
    /// Node label that carries the capacity type; when set, jobs with
    /// `scheduling.capacityType` spot / on-demand select it.
    pub capacity_type_label: Option<String>,
    /// Node labels that mark spot nodes. Jobs with `scheduling.capacityType`
    /// spot or on-demand (unless `capacity_type_label` is set), and jobs with
    /// `any` once the cost-optimizer chose, are admitted on nodes of that
    /// type only: spot is any of these labels with a spot value, on-demand
    /// none of them.
    pub capacity_type_labels: Vec<CapacityLabel>,
    /// Seconds of waiting per priority step (0 disables aging).
    pub aging_interval_seconds: u64,
    /// Largest aging boost, also the ceiling of a TrainingQueue's own aging
    /// (`priority.agingSeconds` / `agingStep`).
    pub aging_max_boost: i32,
    /// Backfill behind reserved jobs.
    pub backfill_enabled: bool,
    /// Reservations per cycle.
    pub max_reservations: u32,
    /// Runtime assumed for jobs without `scheduling.estimatedRuntimeSeconds`.
    pub assumed_runtime_seconds: u64,
    /// Wait after which a queue keeps its freed quota for its first blocked job.
    pub queue_hold_after_seconds: u64,
    /// Wait after which a job larger than its queue's nominal quota makes its
    /// cohort keep freed quota for it.
    pub borrower_hold_after_seconds: u64,
    /// Preemption master switch.
    pub preemption_enabled: bool,
    /// Preemption decisions per cycle.
    pub max_preemptions_per_cycle: u32,
    /// How long finished attempts are remembered (replays are ignored meanwhile).
    pub tombstone_retention_seconds: u64,
    /// A pending job's explanation is published again when its queue or why
    /// it waits changes, or when its position or GPUs short moved by at least
    /// this percent of the smaller of the old and new value (0: every move).
    pub explain_step_percent: u32,
    /// Smallest gap between two status reports of a TrainingQueue (its
    /// pending and admitted jobs, GPUs used and borrowed); one is sent only
    /// when its figures changed.
    pub queue_status_interval_seconds: u64,
}

impl Default for AllocatorServiceConfig {
    fn default() -> Self {
        let core = AllocatorConfig::default();
        AllocatorServiceConfig {
            default_queue: core.default_queue,
            cycle_interval_ms: 500,
            event_cycle_min_gap_ms: 50,
            snapshot_every_cycles: 20,
            snapshot_min_interval_ms: 1_000,
            grace_seconds: core.preemption.grace_period_secs,
            rack_label: core.rack_label,
            flavors: Vec::new(),
            auto_flavors: core.auto_flavors,
            priority_classes: BTreeMap::new(),
            capacity_type_label: None,
            capacity_type_labels: default_capacity_type_labels(),
            aging_interval_seconds: core.aging.interval_secs,
            aging_max_boost: core.aging.max_boost,
            backfill_enabled: core.backfill.enabled,
            max_reservations: core.backfill.max_reservations,
            assumed_runtime_seconds: core.backfill.assumed_runtime_secs,
            queue_hold_after_seconds: core.backfill.queue_hold_after_secs,
            borrower_hold_after_seconds: core.backfill.borrower_hold_after_secs,
            preemption_enabled: core.preemption.enabled,
            max_preemptions_per_cycle: core.preemption.max_preemptions_per_cycle,
            tombstone_retention_seconds: core.tombstone_retention_secs,
            explain_step_percent: 10,
            queue_status_interval_seconds: 2,
        }
    }
}

impl AllocatorServiceConfig {
    /// The core configuration: configured flavors first, then flavors learned
    /// from TrainingQueues (`flavors[].nodeLabels`) whose names are not configured.
    pub fn allocator_config(&self, learned: &[FlavorSpec]) -> AllocatorConfig {
        let defaults = AllocatorConfig::default();
        let mut flavors: Vec<FlavorSpec> = self.flavors.iter().map(FlavorSpec::from).collect();
        for flavor in learned {
            if !flavors.iter().any(|f| f.name == flavor.name) {
                flavors.push(flavor.clone());
            }
        }
        AllocatorConfig {
            default_queue: self.default_queue.clone(),
            rack_label: self.rack_label.clone(),
            flavors,
            auto_flavors: self.auto_flavors,
            auto_flavor_tolerations: defaults.auto_flavor_tolerations,
            spot_tolerations: defaults.spot_tolerations,
            aging: AgingPolicy {
                interval_secs: self.aging_interval_seconds,
                max_boost: self.aging_max_boost,
                ..AgingPolicy::default()
            },
            backfill: BackfillPolicy {
                enabled: self.backfill_enabled,
                max_reservations: self.max_reservations,
                assumed_runtime_secs: self.assumed_runtime_seconds,
                queue_hold_after_secs: self.queue_hold_after_seconds,
                borrower_hold_after_secs: self.borrower_hold_after_seconds,
            },
            preemption: PreemptionPolicy {
                enabled: self.preemption_enabled,
                grace_period_secs: self.grace_seconds,
                max_preemptions_per_cycle: self.max_preemptions_per_cycle,
                ..defaults.preemption
            },
            tombstone_retention_secs: self.tombstone_retention_seconds,
        }
    }

    /// Whether a flavor name is defined by the configuration.
    pub fn configures_flavor(&self, name: &str) -> bool {
        self.flavors.iter().any(|f| f.name == name)
    }

    pub fn cycle_interval(&self) -> Duration {
        Duration::from_millis(self.cycle_interval_ms.max(10))
    }

    pub fn event_cycle_min_gap(&self) -> Duration {
        Duration::from_millis(self.event_cycle_min_gap_ms)
    }

    pub fn snapshot_min_interval(&self) -> Duration {
        Duration::from_millis(self.snapshot_min_interval_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_map_to_a_valid_core_config() {
        let config = AllocatorServiceConfig::default();
        let core = config.allocator_config(&[]);
        assert_eq!(core.validate(), Ok(()));
        assert_eq!(core.default_queue, "default");
        // Every backfill key reaches the core with the core's default.
        assert_eq!(core.backfill, AllocatorConfig::default().backfill);
        assert_eq!(config.cycle_interval(), Duration::from_millis(500));
    }

    #[test]
    fn configured_flavors_win_over_learned_ones() {
        let config = AllocatorServiceConfig {
            flavors: vec![FlavorConfig {
                name: "a100".into(),
                gpu_product: Some("A100".into()),
                ..FlavorConfig::default()
            }],
            grace_seconds: 30,
            ..AllocatorServiceConfig::default()
        };
        let learned = vec![
            FlavorSpec {
                name: "a100".into(),
                node_labels: [("x".to_string(), "y".to_string())].into(),
                ..FlavorSpec::default()
            },
            FlavorSpec {
                name: "t4".into(),
                node_labels: [("gpu".to_string(), "t4".to_string())].into(),
                ..FlavorSpec::default()
            },
        ];
        let core = config.allocator_config(&learned);
        let names: Vec<&str> = core.flavors.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a100", "t4"]);
        assert_eq!(core.flavors[0].gpu_product.as_deref(), Some("A100"));
        assert_eq!(core.preemption.grace_period_secs, 30);
    }
}
