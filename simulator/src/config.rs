//! The simulated cluster's configuration file (YAML): virtual nodes, the clock,
//! worker speeds, failures and disruptions. `simulator/clusters/*.yaml` are examples.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use trainyard_api::quantity::{bytes, cpu_millis};

use crate::error::SimulatorError;

/// Capacity type label values follow Karpenter (`karpenter.sh/capacity-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    #[default]
    OnDemand,
    Spot,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnDemand => "on-demand",
            Self::Spot => "spot",
        }
    }
}

/// A node taint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaintConfig {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    pub effect: String,
}

/// A group of identical virtual nodes, named `<name>-<index>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroup {
    pub name: String,
    #[serde(default = "one")]
    pub count: u32,
    /// Whole GPUs per node (`nvidia.com/gpu`).
    #[serde(default)]
    pub gpus: u32,
    /// `nvidia.com/gpu.product`, e.g. `A100-SXM4-80GB`.
    #[serde(default)]
    pub gpu_product: Option<String>,
    /// `nvidia.com/gpu.memory` in MiB.
    #[serde(default)]
    pub gpu_memory_mib: Option<u32>,
    /// MIG slices per node by profile (`1g.10gb: 7` → `nvidia.com/mig-1g.10gb: 7`).
    #[serde(default)]
    pub mig: BTreeMap<String, u32>,
    /// CPU per node (`status.allocatable.cpu`), a quantity such as `32` or `500m`.
    #[serde(default = "default_cpu", deserialize_with = "deserialize_quantity")]
    pub cpu: String,
    /// Memory per node (`status.allocatable.memory`), a quantity such as `256Gi`.
    #[serde(default = "default_memory", deserialize_with = "deserialize_quantity")]
    pub memory: String,
    /// Time-slicing replicas per GPU (`nvidia.com/gpu.replicas`); whole GPUs are
    /// then advertised `gpus × replicas` times, as the device plugin does.
    #[serde(default)]
    pub time_slicing_replicas: Option<u32>,
    #[serde(default)]
    pub capacity_type: CapacityType,
    /// Price class label (`trainyard.dev/price-class`), e.g. `a100-spot`.
    #[serde(default)]
    pub price_class: Option<String>,
    /// `topology.kubernetes.io/zone`.
    #[serde(default)]
    pub zone: Option<String>,
    /// `topology.kubernetes.io/region`.
    #[serde(default)]
    pub region: Option<String>,
    /// Nodes per rack (`nvidia.com/gpu.clique` = `<group>-rack-<n>`); unset: no rack label.
    #[serde(default)]
    pub nodes_per_rack: Option<u32>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub taints: Vec<TaintConfig>,
}

fn one() -> u32 {
    1
}

/// A node's CPU unless its group says otherwise: enough that GPUs, not CPU,
/// limit what fits on it.
pub const DEFAULT_NODE_CPU: &str = "128";
/// A node's memory unless its group says otherwise, likewise.
pub const DEFAULT_NODE_MEMORY: &str = "2Ti";

fn default_cpu() -> String {
    DEFAULT_NODE_CPU.into()
}

fn default_memory() -> String {
    DEFAULT_NODE_MEMORY.into()
}

/// A quantity as text (`"500m"`, `"256Gi"`) or as a bare YAML number (`cpu: 32`),
/// which is how most people write a CPU count. [`ClusterConfig::check`] parses it.
fn deserialize_quantity<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    struct QuantityText;

    impl Visitor<'_> for QuantityText {
        type Value = String;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a quantity such as \"32\", \"500m\" or \"256Gi\"")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
            Ok(text.to_owned())
        }

        fn visit_u64<E: de::Error>(self, number: u64) -> Result<String, E> {
            Ok(number.to_string())
        }

        fn visit_i64<E: de::Error>(self, number: i64) -> Result<String, E> {
            Ok(number.to_string())
        }

        fn visit_f64<E: de::Error>(self, number: f64) -> Result<String, E> {
            Ok(number.to_string())
        }
    }

    deserializer.deserialize_any(QuantityText)
}

/// How simulated workers train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Simulated seconds per epoch for models not listed in `models`.
    pub seconds_per_epoch: f64,
    /// Simulated seconds per epoch by `spec.model`.
    pub models: BTreeMap<String, f64>,
    /// Simulated seconds from binding to Running (image pull, container start).
    pub start_delay_seconds: f64,
    /// Loss at epoch 0; it decays towards `final_loss`. Accuracy rises to `final_accuracy`.
    pub initial_loss: f64,
    pub final_loss: f64,
    pub final_accuracy: f64,
    /// Images whose pull always fails: workers with one never start and wait
    /// in `ImagePullBackOff`, as with an image that does not exist.
    pub unpullable_images: Vec<String>,
    /// Simulated seconds between a running worker's GPU utilisation reports
    /// (`worker.utilization`); a change of phase is reported at once. 0: none.
    pub utilization_report_seconds: f64,
    /// Simulated seconds at the start of each run that its workers report as
    /// loading data (part of the first epoch's time).
    pub data_loading_seconds: f64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            seconds_per_epoch: 60.0,
            models: BTreeMap::new(),
            start_delay_seconds: 5.0,
            initial_loss: 2.5,
            final_loss: 0.2,
            final_accuracy: 0.93,
            unpullable_images: Vec::new(),
            utilization_report_seconds: 0.0,
            data_loading_seconds: 0.0,
        }
    }
}

/// Random failures of training runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FailureConfig {
    /// Probability that a run (one attempt of one job) fails before it completes.
    pub rate: f64,
    /// Exit codes a failing worker ends with, picked uniformly (137 = OOM-killed,
    /// retryable; 1 = a bug, permanent).
    pub exit_codes: Vec<i32>,
}

impl Default for FailureConfig {
    fn default() -> Self {
        Self {
            rate: 0.0,
            exit_codes: vec![137],
        }
    }
}

/// Node disruptions, as Poisson processes in simulated time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DisruptionConfig {
    /// Reclaims per spot node per simulated hour.
    pub spot_reclaims_per_node_hour: f64,
    /// Failures (NotReady, pods lost) per node per simulated hour.
    pub node_failures_per_node_hour: f64,
    /// Simulated seconds until a reclaimed spot node is replaced (under a new name)
    /// or a failed node is Ready again.
    pub recovery_seconds: f64,
}

impl Default for DisruptionConfig {
    fn default() -> Self {
        Self {
            spot_reclaims_per_node_hour: 0.0,
            node_failures_per_node_hour: 0.0,
            recovery_seconds: 120.0,
        }
    }
}

/// The checkpoints simulated workers write.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Directory the workers write their checkpoints under (`--checkpoint-root`
    /// overrides it). Unset: they report checkpoints without writing any.
    pub root: Option<PathBuf>,
    /// Fraction of saves killed mid-save (drawn from `seed`, the job, its attempt
    /// and the checkpoint): the worker dies (exit 137) and leaves the checkpoint
    /// without its manifest. Needs `root`.
    pub killed_save_rate: f64,
}

/// The whole simulated cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// Simulated seconds per real second (1 = real time, 3600 = an hour per second).
    #[serde(default = "real_time")]
    pub speed: f64,
    /// Seed for failures and disruptions, so a run can be repeated.
    #[serde(default)]
    pub seed: u64,
    /// Real milliseconds between two steps of the simulated controllers (they also
    /// step at once when an object changes).
    #[serde(default = "default_tick")]
    pub tick_milliseconds: u64,
    pub nodes: Vec<NodeGroup>,
    #[serde(default)]
    pub workers: WorkerConfig,
    #[serde(default)]
    pub failures: FailureConfig,
    #[serde(default)]
    pub disruptions: DisruptionConfig,
    #[serde(default)]
    pub checkpoints: CheckpointConfig,
    /// Which of the nodes that fit a pod the scheduler binds it to.
    #[serde(default)]
    pub scoring: NodeScoring,
    /// Errors and stalls of the API server's write requests.
    #[serde(default)]
    pub api_faults: crate::faults::ApiFaultConfig,
    /// PriorityClasses that exist from the start, name to value, as an
    /// installation's `deploy/priorityclasses.yaml` creates them: a Job
    /// naming any other gets no pods (`FailedCreate`).
    #[serde(default)]
    pub priority_classes: BTreeMap<String, i32>,
}

/// The scheduler's choice among the nodes that fit a pod, by free GPUs, as
/// kube-scheduler's `NodeResourcesFit` scoring strategies choose by free
/// resources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeScoring {
    /// The node with the fewest free GPUs (bin packing).
    #[default]
    MostAllocated,
    /// The node with the most free GPUs: kube-scheduler's default, which
    /// spreads pods.
    LeastAllocated,
}

fn real_time() -> f64 {
    1.0
}

fn default_tick() -> u64 {
    50
}

impl ClusterConfig {
    /// Reads and checks a config file; errors name the file and the field.
    pub fn load(path: &str) -> Result<Self, SimulatorError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimulatorError::Config {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::parse(&text).map_err(|message| SimulatorError::Config {
            path: path.to_owned(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Self = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            return Err(format!("speed: {} must be a positive number", self.speed));
        }
        if self.tick_milliseconds == 0 {
            return Err("tickMilliseconds: must be at least 1".into());
        }
        if self.nodes.is_empty() {
            return Err("nodes: at least one node group is needed".into());
        }
        for (i, group) in self.nodes.iter().enumerate() {
            if group.name.is_empty()
                || !group
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                return Err(format!(
                    "nodes[{i}].name: {:?} must be lowercase letters, digits and '-'",
                    group.name
                ));
            }
            if let Err(err) = cpu_millis(&group.cpu) {
                return Err(format!("nodes[{i}].cpu (group {}): {err}", group.name));
            }
            if let Err(err) = bytes(&group.memory) {
                return Err(format!("nodes[{i}].memory (group {}): {err}", group.name));
            }
            if group.nodes_per_rack == Some(0) {
                return Err(format!(
                    "nodes[{i}].nodesPerRack: must be at least 1 (or unset)"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.failures.rate) {
            return Err(format!(
                "failures.rate: {} must be between 0 and 1",
                self.failures.rate
            ));
        }
        if self.failures.rate > 0.0 && self.failures.exit_codes.is_empty() {
            return Err(
                "failures.exitCodes: give at least one exit code when failures.rate > 0".into(),
            );
        }
        if !(0.0..=1.0).contains(&self.checkpoints.killed_save_rate) {
            return Err(format!(
                "checkpoints.killedSaveRate: {} must be between 0 and 1",
                self.checkpoints.killed_save_rate
            ));
        }
        self.api_faults.check()?;
        for (field, seconds) in [
            (
                "workers.utilizationReportSeconds",
                self.workers.utilization_report_seconds,
            ),
            (
                "workers.dataLoadingSeconds",
                self.workers.data_loading_seconds,
            ),
        ] {
            if !(seconds.is_finite() && seconds >= 0.0) {
                return Err(format!(
                    "{field}: {seconds} must be zero or a positive number of seconds"
                ));
            }
        }
        let speeds = std::iter::once((
            "workers.secondsPerEpoch".to_owned(),
            self.workers.seconds_per_epoch,
        ))
        .chain(
            self.workers
                .models
                .iter()
                .map(|(m, s)| (format!("workers.models.{m}"), *s)),
        );
        for (field, seconds) in speeds {
            if !(seconds.is_finite() && seconds > 0.0) {
                return Err(format!(
                    "{field}: {seconds} must be a positive number of seconds"
                ));
            }
        }
        Ok(())
    }

    /// Simulated seconds per epoch for a model.
    pub fn seconds_per_epoch(&self, model: &str) -> f64 {
        self.workers
            .models
            .get(model)
            .copied()
            .unwrap_or(self.workers.seconds_per_epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_file_gets_defaults() {
        let config =
            ClusterConfig::parse("nodes: [{name: gpu, count: 2, gpus: 8}]").expect("valid");
        assert_eq!(config.speed, 1.0);
        assert_eq!(config.nodes[0].capacity_type, CapacityType::OnDemand);
        assert_eq!(config.seconds_per_epoch("any"), 60.0);
        assert_eq!(
            (
                config.nodes[0].cpu.as_str(),
                config.nodes[0].memory.as_str()
            ),
            ("128", "2Ti"),
            "the CPU and memory every node had before groups could say"
        );
    }

    #[test]
    fn node_cpu_and_memory_are_quantities_written_as_text_or_numbers() {
        let config = ClusterConfig::parse(
            "nodes: [{name: a, cpu: 32, memory: 256Gi}, {name: b, cpu: 0.5, memory: \"1e9\"}]",
        )
        .expect("valid");
        let resources: Vec<(&str, &str)> = config
            .nodes
            .iter()
            .map(|g| (g.cpu.as_str(), g.memory.as_str()))
            .collect();
        assert_eq!(resources, [("32", "256Gi"), ("0.5", "1e9")]);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("speed: 0\nnodes: [{name: a}]", "speed"),
            ("nodes: []", "nodes"),
            ("nodes: [{name: A_B}]", "nodes[0].name"),
            ("nodes: [{name: a}]\nfailures: {rate: 2}", "failures.rate"),
            (
                "nodes: [{name: a}]\nworkers: {models: {bert: -1}}",
                "workers.models.bert",
            ),
            ("nodes: [{name: a, gpu: 8}]", "gpu"),
            (
                "nodes: [{name: a}, {name: lean, cpu: 4 cores}]",
                "nodes[1].cpu (group lean): \"4 cores\" is not a Kubernetes quantity",
            ),
            (
                "nodes: [{name: a, memory: 16GB}]",
                "nodes[0].memory (group a): \"16GB\" is not a Kubernetes quantity",
            ),
            ("nodes: [{name: a, memory: -1}]", "nodes[0].memory"),
            ("nodes: [{name: a, cpu: [1]}]", "a quantity such as"),
            (
                "nodes: [{name: a}]\ncheckpoints: {killedSaveRate: 1.5}",
                "checkpoints.killedSaveRate",
            ),
            (
                "nodes: [{name: a}]\nworkers: {utilizationReportSeconds: -60}",
                "workers.utilizationReportSeconds",
            ),
        ];
        for (text, field) in cases {
            let err = ClusterConfig::parse(text).expect_err(text);
            assert!(err.contains(field), "{text}: {err}");
        }
    }
}
