//! The `cost_optimizer` configuration section (`TRAINYARD_COST_OPTIMIZER__*`).

use serde::{Deserialize, Serialize};

/// A node label that marks spot capacity when it has one of `spot_values`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct CapacityLabel {
    pub label: String,
    pub spot_values: Vec<String>,
}

/// The label conventions of Karpenter, EKS, GKE and AKS (the simulator's
/// nodes use Karpenter's).
pub fn default_capacity_labels() -> Vec<CapacityLabel> {
    let label = |label: &str, values: &[&str]| CapacityLabel {
        label: label.into(),
        spot_values: values.iter().map(|v| v.to_string()).collect(),
    };
    vec![
        label("karpenter.sh/capacity-type", &["spot"]),
        label("eks.amazonaws.com/capacityType", &["SPOT"]),
        label("cloud.google.com/gke-spot", &["true"]),
        label("cloud.google.com/gke-preemptible", &["true"]),
        label("kubernetes.azure.com/scalesetpriority", &["spot"]),
    ]
}

/// Where idle detection reads GPU utilisation from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UtilizationSource {
    /// The workers' own `worker.utilization` reports.
    #[default]
    Worker,
    /// A Prometheus that scrapes NVIDIA's DCGM exporter (`prometheus_url`).
    Dcgm,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct CostConfig {
    /// The price catalog (the `price-catalog` ConfigMap, mounted).
    pub catalog_path: String,
    /// Seconds between checks of the catalog file for changes.
    pub catalog_reload_seconds: u64,
    /// Seconds between accounting runs: cost records, budgets, idle checks.
    pub accounting_interval_seconds: u64,
    /// Longest a utilisation report waits to be saved. Reports come from
    /// every worker every few seconds and each replaces the last, so they
    /// are saved together (with the next other change, or at the latest
    /// this long after), not one save each; every other change is saved
    /// before its message is acknowledged.
    pub state_save_interval_ms: u64,
    /// Node labels that mark spot capacity; a node with none is on-demand.
    pub capacity_type_labels: Vec<CapacityLabel>,
    /// Node label with the GPU product.
    pub product_label: String,
    /// Node labels with the zone and the region (the pool is product@zone).
    pub zone_label: String,
    pub region_label: String,
    /// Runtime assumed for jobs with neither an estimate nor history.
    pub default_runtime_seconds: u64,
    /// Checkpoint interval assumed for checkpointing jobs until two
    /// checkpoints have been reported.
    pub assumed_checkpoint_interval_seconds: u64,
    pub checkpoint_save_seconds: u64,
    /// Seconds from an interruption to training again.
    pub restart_seconds: u64,
    /// Interruption rate of spot pools the catalog gives no prior for.
    pub fallback_reclaims_per_node_hour: f64,
    /// Interruptions on spot after which a job stays on on-demand.
    pub max_spot_interruptions: u32,
    /// Extra deadline-miss probability spot may carry over on-demand.
    pub deadline_risk_tolerance: f64,
    /// Where idle detection reads GPU utilisation from.
    pub utilization_source: UtilizationSource,
    /// The Prometheus (e.g. `http://prometheus.monitoring:9090`) that
    /// scrapes the DCGM exporter, queried every accounting interval.
    pub prometheus_url: String,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            catalog_path: "/etc/trainyard/price-catalog/price-catalog.yaml".into(),
            catalog_reload_seconds: 10,
            accounting_interval_seconds: 60,
            state_save_interval_ms: 1000,
            capacity_type_labels: default_capacity_labels(),
            product_label: "nvidia.com/gpu.product".into(),
            zone_label: "topology.kubernetes.io/zone".into(),
            region_label: "topology.kubernetes.io/region".into(),
            default_runtime_seconds: 3600,
            assumed_checkpoint_interval_seconds: 1800,
            checkpoint_save_seconds: 60,
            restart_seconds: 360,
            fallback_reclaims_per_node_hour: 0.0002,
            max_spot_interruptions: 3,
            deadline_risk_tolerance: 0.0,
            utilization_source: UtilizationSource::Worker,
            prometheus_url: String::new(),
        }
    }
}
