//! What the pipeline and trace-replay benchmarks put on the simulated cluster:
//! its configuration, the TrainingQueue, the TrainingJobs, and how a replayed
//! trace job's run time becomes epochs; and the job records read back from the
//! simulator's history.

use std::collections::BTreeMap;

use serde_json::json;
use trainyard_api::{TrainingJob, TrainingQueue};
use trainyard_simulator::cluster::{EPOCH_SECONDS_ENV, JobHistory, RunOutcome};
use trainyard_simulator::config::{
    ClusterConfig, DEFAULT_NODE_CPU, DEFAULT_NODE_MEMORY, NodeGroup, WorkerConfig,
};

use crate::Error;
use crate::report::JobRecord;

/// The GPU product every benchmark node advertises (and the queue's flavor selects).
pub const GPU_PRODUCT: &str = "A100-SXM4-80GB";

/// `nodes` identical on-demand nodes of `gpus_per_node` GPUs, at `speed`
/// simulated seconds per real second. No failures, no disruptions and no
/// pod start delay: the benchmarks measure Trainyard, and a trace's
/// durations already are the whole run.
pub fn cluster_config(nodes: u32, gpus_per_node: u32, speed: f64) -> ClusterConfig {
    ClusterConfig {
        speed,
        seed: 1,
        tick_milliseconds: 50,
        nodes: vec![NodeGroup {
            name: "gpu".into(),
            count: nodes,
            gpus: gpus_per_node,
            gpu_product: Some(GPU_PRODUCT.into()),
            gpu_memory_mib: Some(81920),
            mig: BTreeMap::new(),
            cpu: DEFAULT_NODE_CPU.into(),
            memory: DEFAULT_NODE_MEMORY.into(),
            time_slicing_replicas: None,
            capacity_type: Default::default(),
            price_class: Some("a100-on-demand".into()),
            zone: Some("zone-a".into()),
            region: None,
            nodes_per_rack: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }],
        workers: WorkerConfig {
            start_delay_seconds: 0.0,
            ..WorkerConfig::default()
        },
        failures: Default::default(),
        disruptions: Default::default(),
        scoring: Default::default(),
        api_faults: Default::default(),
        priority_classes: BTreeMap::new(),
        checkpoints: Default::default(),
    }
}

/// The checkpoint-manager's settings for reading the simulated workers'
/// `s3://` checkpoints through the S3 endpoint of the simulator at `address`.
pub fn simulated_s3_env(address: std::net::SocketAddr) -> Vec<(String, String)> {
    [
        ("S3_ENDPOINT", format!("http://{address}/s3")),
        ("S3_REGION", "us-east-1".to_owned()),
        ("S3_ACCESS_KEY_ID", "simulator".to_owned()),
        ("S3_SECRET_ACCESS_KEY", "simulator".to_owned()),
    ]
    .into_iter()
    .map(|(key, value)| (format!("TRAINYARD_CHECKPOINT_MANAGER__{key}"), value))
    .collect()
}

/// A TrainingQueue guaranteeing `gpus` GPUs of [`GPU_PRODUCT`].
pub fn training_queue(name: &str, gpus: u32) -> Result<TrainingQueue, Error> {
    manifest(
        "TrainingQueue",
        json!({
            "apiVersion": "trainyard.dev/v1",
            "kind": "TrainingQueue",
            "metadata": {"name": name},
            "spec": {
                "flavors": [{
                    "name": "a100",
                    "nominalQuota": gpus,
                    "nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT},
                }],
            },
        }),
    )
}

/// The shape of one benchmark TrainingJob.
#[derive(Debug, Clone, PartialEq)]
pub struct JobShape {
    pub model: String,
    pub workers: u32,
    pub gpus_per_worker: u32,
    pub epochs: u32,
    /// Simulated seconds per epoch for this job alone; the cluster's per-model
    /// speed when `None`.
    pub seconds_per_epoch: Option<f64>,
    /// TrainingQueue; the allocator's default queue when `None`.
    pub queue: Option<String>,
}

/// A TrainingJob named `name` in `namespace` with `shape`.
pub fn training_job(namespace: &str, name: &str, shape: &JobShape) -> Result<TrainingJob, Error> {
    let mut spec = json!({
        "model": shape.model,
        "dataset": "synthetic",
        "numWorkers": shape.workers,
        "gpusPerWorker": shape.gpus_per_worker,
        "hyperparameters": {"epochs": shape.epochs},
    });
    if let Some(seconds) = shape.seconds_per_epoch {
        spec["env"] = json!([{"name": EPOCH_SECONDS_ENV, "value": seconds.to_string()}]);
    }
    if let Some(queue) = &shape.queue {
        spec["scheduling"] = json!({"queue": queue});
    }
    manifest(
        "TrainingJob",
        json!({
            "apiVersion": "trainyard.dev/v1",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }),
    )
}

fn manifest<K: serde::de::DeserializeOwned>(
    kind: &'static str,
    value: serde_json::Value,
) -> Result<K, Error> {
    serde_json::from_value(value).map_err(|source| Error::Manifest { kind, source })
}

/// Epochs and simulated seconds per epoch so that a run of `duration`
/// seconds has about one epoch per `epoch_target` seconds, at least one and
/// at most `max_epochs`; epochs × seconds per epoch is exactly `duration`.
/// Fewer, longer epochs mean fewer worker reports; the run time is the same.
pub fn epochs_for(duration: f64, epoch_target: f64, max_epochs: u32) -> (u32, f64) {
    let wanted = (duration / epoch_target).round();
    let epochs = if wanted.is_finite() && wanted >= 1.0 {
        (wanted as u32).min(max_epochs.max(1))
    } else {
        1
    };
    (epochs, duration / f64::from(epochs))
}

/// A Kubernetes object name (DNS-1123 label) for trace job `id` under
/// `prefix`: lowercase letters, digits and `-`, at most 63 characters.
pub fn object_name(prefix: &str, id: &str) -> String {
    let raw = format!("{prefix}-{id}").to_lowercase();
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(63);
    let trimmed = name.trim_matches('-');
    if trimmed.is_empty() {
        "job".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// What the benchmark knows about a submitted job.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// `namespace/name`, the simulator history's key.
    pub key: String,
    pub queue: String,
    pub gpus: u32,
    /// Simulated time of submission.
    pub at: f64,
}

/// Job records from the simulator's history: started is the first gang
/// start, finished the successful end (or, for a job that never succeeded,
/// its last end). A job the cluster never started has neither.
pub fn job_records(
    submitted: &[Submitted],
    history: &BTreeMap<String, JobHistory>,
) -> Vec<JobRecord> {
    submitted
        .iter()
        .map(|job| {
            let run = history.get(&job.key);
            let started = run
                .and_then(|h| h.started.first().copied())
                .map(|s| s.max(job.at));
            let success = run.and_then(|h| {
                h.ended
                    .iter()
                    .find(|(_, outcome)| *outcome == RunOutcome::Succeeded)
                    .map(|(t, _)| *t)
            });
            let last_end = run.and_then(|h| h.ended.last().map(|(t, _)| *t));
            let finished = started.and_then(|s| success.or(last_end).map(|f| f.max(s)));
            JobRecord {
                name: job.key.clone(),
                queue: job.queue.clone(),
                gpus: job.gpus,
                submitted: job.at,
                started,
                finished,
                succeeded: started.is_some() && success.is_some(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_multiply_back_to_the_duration() {
        assert_eq!(epochs_for(600.0, 300.0, 20), (2, 300.0));
        let (epochs, seconds) = epochs_for(5673.0, 300.0, 20);
        assert_eq!(epochs, 19);
        assert!((f64::from(epochs) * seconds - 5673.0).abs() < 1e-9);
        assert_eq!(epochs_for(60.0, 300.0, 20), (1, 60.0));
        assert_eq!(epochs_for(1e9, 300.0, 20).0, 20);
    }

    #[test]
    fn object_names_are_dns_labels() {
        assert_eq!(object_name("tiresias-60", "17"), "tiresias-60-17");
        assert_eq!(object_name("Trace_A", "job.1"), "trace-a-job-1");
        assert_eq!(object_name("x", &"9".repeat(100)).len(), 63);
        assert_eq!(object_name("-", "_"), "job");
    }

    #[test]
    fn manifests_parse_into_the_api_types() {
        let shape = JobShape {
            model: "resnet50".into(),
            workers: 2,
            gpus_per_worker: 4,
            epochs: 3,
            seconds_per_epoch: Some(12.5),
            queue: Some("research".into()),
        };
        let job = training_job("default", "a", &shape).expect("a TrainingJob");
        assert_eq!(job.spec.num_workers, 2);
        assert_eq!(job.spec.gpus_per_worker, Some(4));
        assert_eq!(job.spec.epochs(), 3);
        assert_eq!(job.spec.env[0].name, EPOCH_SECONDS_ENV);
        assert_eq!(job.spec.env[0].value.as_deref(), Some("12.5"));
        let queue = training_queue("default", 60).expect("a TrainingQueue");
        assert_eq!(queue.spec.flavors[0].nominal_quota, 60);
        assert_eq!(cluster_config(15, 4, 60.0).nodes[0].count, 15);
    }

    #[test]
    fn records_take_the_first_start_and_the_successful_end() {
        let submitted = |key: &str| Submitted {
            key: key.into(),
            queue: "default".into(),
            gpus: 4,
            at: 10.0,
        };
        let history = BTreeMap::from([
            (
                "ns/retried".to_owned(),
                JobHistory {
                    gpus: 4,
                    started: vec![12.0, 30.0],
                    ended: vec![(20.0, RunOutcome::Failed), (50.0, RunOutcome::Succeeded)],
                },
            ),
            (
                "ns/failed".to_owned(),
                JobHistory {
                    gpus: 4,
                    started: vec![11.0],
                    ended: vec![(15.0, RunOutcome::Failed)],
                },
            ),
        ]);
        let records = job_records(
            &[
                submitted("ns/retried"),
                submitted("ns/failed"),
                submitted("ns/never"),
            ],
            &history,
        );
        assert_eq!(
            (
                records[0].started,
                records[0].finished,
                records[0].succeeded
            ),
            (Some(12.0), Some(50.0), true)
        );
        assert_eq!(
            (
                records[1].started,
                records[1].finished,
                records[1].succeeded
            ),
            (Some(11.0), Some(15.0), false)
        );
        assert_eq!(
            (
                records[2].started,
                records[2].finished,
                records[2].succeeded
            ),
            (None, None, false)
        );
    }
}
