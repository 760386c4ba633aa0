//! `trainyard summary`: what happened to the TrainingJobs in scope, computed from their
//! status alone so it works the same against a real cluster and the simulator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_stats::SortedSamples;

use crate::error::CliError;
use crate::format::{NONE, precise_duration, seconds_between, table};

/// Extended resource of a whole GPU; MIG slices (`nvidia.com/mig-*`) and time-sliced
/// shares (`nvidia.com/gpu.shared`) are other resources and are not counted.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Whole GPUs the cluster offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGpus {
    /// Sum of allocatable `nvidia.com/gpu`.
    pub gpus: u64,
    /// Nodes with at least one such GPU.
    pub gpu_nodes: usize,
    /// All nodes.
    pub nodes: usize,
}

/// Adds up allocatable `nvidia.com/gpu` over `nodes`.
pub fn cluster_gpus(nodes: &[Node]) -> Result<ClusterGpus, CliError> {
    let mut total = ClusterGpus {
        gpus: 0,
        gpu_nodes: 0,
        nodes: nodes.len(),
    };
    for node in nodes {
        let allocatable = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(GPU_RESOURCE));
        if let Some(quantity) = allocatable {
            // Device plugins report whole numbers; anything else is a misconfigured node.
            let gpus: u64 = quantity
                .0
                .trim()
                .parse()
                .map_err(|_| CliError::GpuQuantity {
                    node: node.name_any(),
                    value: quantity.0.clone(),
                })?;
            if gpus > 0 {
                total.gpus += gpus;
                total.gpu_nodes += 1;
            }
        }
    }
    Ok(total)
}

/// Average, 95th percentile and maximum of a set of durations, in seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// How many values.
    pub count: usize,
    /// Arithmetic mean.
    pub average: f64,
    /// Nearest-rank 95th percentile: the smallest value at least 95% of values do not exceed.
    pub p95: f64,
    /// Largest value.
    pub max: f64,
}

/// Stats of `values`, None when there are none.
pub fn stats(values: &[f64]) -> Option<Stats> {
    let sorted = SortedSamples::new(values.iter().copied());
    Some(Stats {
        count: sorted.len(),
        average: sorted.mean()?,
        p95: sorted.percentile(95.0)?,
        max: sorted.max()?,
    })
}

/// One job's line in the summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSummary {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Lifecycle state, if the planner set one.
    pub state: Option<TrainingJobState>,
    /// numWorkers × gpusPerWorker.
    pub gpus: u32,
    /// True when the GPUs are MIG slices (not counted in utilisation).
    pub mig: bool,
    /// creationTimestamp → status.startTime.
    pub queueing_delay_seconds: Option<f64>,
    /// status.startTime → status.completionTime.
    pub duration_seconds: Option<f64>,
}

/// Jobs by outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Every job in scope.
    pub total: usize,
    /// State Completed.
    pub completed: usize,
    /// State Failed.
    pub failed: usize,
    /// Any other state, or none yet.
    pub other: usize,
    /// Jobs per state ("-" for no state yet).
    pub by_state: BTreeMap<String, usize>,
}

/// GPU utilisation over the run, or why it cannot be given.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Utilisation {
    /// Σ job GPUs × (completion − start) over finished whole-GPU jobs.
    pub gpu_seconds: f64,
    /// Whole GPUs of the cluster, when the Nodes could be read.
    pub cluster: Option<ClusterGpus>,
    /// First creation → last completion, when any job finished.
    pub window_seconds: Option<f64>,
    /// gpu_seconds ÷ (cluster GPUs × window), between 0 and 1 when the data is consistent.
    pub ratio: Option<f64>,
    /// Finished jobs left out because their GPUs are MIG slices.
    pub mig_jobs_excluded: usize,
    /// Why ratio is missing, or what it does not count.
    pub note: String,
}

/// Everything `trainyard summary` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// "in namespace ml" / "in any namespace".
    pub scope: String,
    /// Jobs by outcome.
    pub jobs: Counts,
    /// Over jobs that started.
    pub queueing_delay_seconds: Option<Stats>,
    /// Over jobs that started and finished.
    pub duration_seconds: Option<Stats>,
    /// GPU utilisation.
    pub gpu_utilisation: Utilisation,
    /// One entry per job, by namespace and name.
    pub per_job: Vec<JobSummary>,
}

/// What is known about the cluster's GPUs: the count, or why it could not be read.
pub type ClusterGpuLookup = Result<ClusterGpus, String>;

const NOT_COUNTED: &str = "cluster GPUs are allocatable nvidia.com/gpu summed over Nodes; MIG slices and time-sliced (shared) GPUs are not counted, nor are jobs on MIG slices";

/// Computes the summary of `jobs` (sorted here, so the caller's order does not matter).
pub fn summarise(scope: String, jobs: &[TrainingJob], cluster: ClusterGpuLookup) -> Summary {
    let mut per_job: Vec<JobSummary> = jobs.iter().map(job_summary).collect();
    per_job.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

    let mut counts = Counts {
        total: per_job.len(),
        ..Counts::default()
    };
    for job in &per_job {
        match job.state {
            Some(TrainingJobState::Completed) => counts.completed += 1,
            Some(TrainingJobState::Failed) => counts.failed += 1,
            _ => counts.other += 1,
        }
        let state = job.state.map_or_else(|| NONE.to_owned(), |s| s.to_string());
        *counts.by_state.entry(state).or_default() += 1;
    }

    let delays: Vec<f64> = per_job
        .iter()
        .filter_map(|j| j.queueing_delay_seconds)
        .collect();
    let durations: Vec<f64> = per_job.iter().filter_map(|j| j.duration_seconds).collect();

    Summary {
        scope,
        jobs: counts,
        queueing_delay_seconds: stats(&delays),
        duration_seconds: stats(&durations),
        gpu_utilisation: utilisation(jobs, &per_job, cluster),
        per_job,
    }
}

fn job_summary(job: &TrainingJob) -> JobSummary {
    let status = job.status.as_ref();
    let created = job.metadata.creation_timestamp.as_ref();
    let started = status.and_then(|s| s.start_time.as_ref());
    let completed = status.and_then(|s| s.completion_time.as_ref());
    JobSummary {
        namespace: job.namespace().unwrap_or_default(),
        name: job.name_any(),
        state: status.and_then(|s| s.state),
        gpus: job.spec.total_gpus(),
        mig: job
            .spec
            .scheduling
            .as_ref()
            .is_some_and(|s| s.mig_profile.is_some()),
        queueing_delay_seconds: created
            .zip(started)
            .map(|(created, started)| seconds_between(created, started)),
        duration_seconds: started
            .zip(completed)
            .map(|(started, completed)| seconds_between(started, completed)),
    }
}

fn utilisation(
    jobs: &[TrainingJob],
    per_job: &[JobSummary],
    cluster: ClusterGpuLookup,
) -> Utilisation {
    let finished = per_job.iter().filter(|j| j.duration_seconds.is_some());
    let mig_jobs_excluded = finished.clone().filter(|j| j.mig).count();
    let gpu_seconds: f64 = finished
        .filter(|j| !j.mig)
        .filter_map(|j| j.duration_seconds.map(|d| f64::from(j.gpus) * d.max(0.0)))
        .sum();

    let first_creation = jobs
        .iter()
        .filter_map(|j| j.metadata.creation_timestamp.as_ref())
        .min_by_key(|t| t.0);
    let last_completion = jobs
        .iter()
        .filter_map(|j| j.status.as_ref().and_then(|s| s.completion_time.as_ref()))
        .max_by_key(|t| t.0);
    let window_seconds = first_creation
        .zip(last_completion)
        .map(|(first, last)| seconds_between(first, last));

    let (cluster, cluster_problem) = match cluster {
        Ok(cluster) => (Some(cluster), None),
        Err(reason) => (None, Some(reason)),
    };
    let gpus = cluster.as_ref().map_or(0, |c| c.gpus);
    let (ratio, note) = match (cluster_problem, window_seconds) {
        (Some(reason), _) => (None, format!("unknown: {reason}")),
        (None, None) => (None, "unknown: no job has finished yet".to_owned()),
        (None, Some(_)) if gpus == 0 => (
            None,
            "unknown: the cluster reports no allocatable nvidia.com/gpu".to_owned(),
        ),
        (None, Some(window)) if window <= 0.0 => (
            None,
            "unknown: the last completion is not after the first creation".to_owned(),
        ),
        (None, Some(window)) => (
            Some(gpu_seconds / (gpus as f64 * window)),
            NOT_COUNTED.to_owned(),
        ),
    };
    Utilisation {
        gpu_seconds,
        cluster,
        window_seconds,
        ratio,
        mig_jobs_excluded,
        note,
    }
}

fn stats_line(stats: Option<&Stats>, what: &str) -> String {
    match stats {
        Some(s) => format!(
            "average {}, p95 {}, max {} over {} {what}",
            precise_duration(s.average),
            precise_duration(s.p95),
            precise_duration(s.max),
            s.count
        ),
        None => format!("{NONE} (no {what})"),
    }
}

fn optional_duration(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| NONE.to_owned(), precise_duration)
}

/// The human-readable summary: counts, a per-job table and the aggregate lines.
pub fn render(summary: &Summary, namespace_column: bool) -> String {
    let counts = &summary.jobs;
    let mut text = format!(
        "TrainingJobs {}: {} ({} completed, {} failed, {} other)\n",
        summary.scope, counts.total, counts.completed, counts.failed, counts.other
    );
    if !summary.per_job.is_empty() {
        let mut header = Vec::new();
        if namespace_column {
            header.push("NAMESPACE".to_owned());
        }
        header.extend(["NAME", "STATE", "GPUS", "QUEUED", "DURATION"].map(String::from));
        let mut rows = vec![header];
        for job in &summary.per_job {
            let mut row = Vec::new();
            if namespace_column {
                row.push(job.namespace.clone());
            }
            let gpus = if job.mig {
                format!("{} (MIG)", job.gpus)
            } else {
                job.gpus.to_string()
            };
            row.extend([
                job.name.clone(),
                job.state.map_or_else(|| NONE.to_owned(), |s| s.to_string()),
                gpus,
                optional_duration(job.queueing_delay_seconds),
                optional_duration(job.duration_seconds),
            ]);
            rows.push(row);
        }
        text.push('\n');
        text.push_str(&table(&rows));
        text.push('\n');
    }
    let u = &summary.gpu_utilisation;
    let utilisation = match (u.ratio, &u.cluster, u.window_seconds) {
        (Some(ratio), Some(cluster), Some(window)) => format!(
            "{:.1}% = {:.0} GPU-seconds / ({} GPUs x {})",
            ratio * 100.0,
            u.gpu_seconds,
            cluster.gpus,
            precise_duration(window)
        ),
        _ => u.note.clone(),
    };
    let cluster = match &u.cluster {
        Some(c) => format!(
            "{} allocatable {GPU_RESOURCE} on {} of {} nodes (MIG slices and time-sliced GPUs are not counted)",
            c.gpus, c.gpu_nodes, c.nodes
        ),
        None => NONE.to_owned(),
    };
    let lines = [
        (
            "Queueing delay:",
            stats_line(summary.queueing_delay_seconds.as_ref(), "started jobs"),
        ),
        (
            "Job duration:",
            stats_line(summary.duration_seconds.as_ref(), "finished jobs"),
        ),
        ("GPU utilisation:", utilisation),
        ("Cluster GPUs:", cluster),
    ];
    for (label, value) in lines {
        text.push_str(&format!("{label:<17}{value}\n"));
    }
    if u.mig_jobs_excluded > 0 {
        text.push_str(&format!(
            "{:<17}{} finished job(s) on MIG slices are not counted in GPU utilisation\n",
            "", u.mig_jobs_excluded
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use trainyard_api::{SchedulingSpec, TrainingJobSpec, TrainingJobStatus};

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).expect("valid"))
    }

    /// A job created at `created`, started at `started`, finished at `completed`.
    fn job(
        name: &str,
        gpus: (u32, u32),
        state: Option<TrainingJobState>,
        times: (i64, Option<i64>, Option<i64>),
    ) -> TrainingJob {
        let mut job = TrainingJob::new(
            name,
            TrainingJobSpec {
                model: "m".into(),
                dataset: "d".into(),
                num_workers: gpus.0,
                gpus_per_worker: Some(gpus.1),
                ..TrainingJobSpec::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job.metadata.creation_timestamp = Some(at(times.0));
        job.status = Some(TrainingJobStatus {
            state,
            start_time: times.1.map(at),
            completion_time: times.2.map(at),
            ..TrainingJobStatus::default()
        });
        job
    }

    fn node(name: &str, gpus: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.status = Some(NodeStatus {
            allocatable: gpus.map(|g| {
                [
                    (GPU_RESOURCE.to_owned(), Quantity(g.to_owned())),
                    ("nvidia.com/mig-1g.10gb".to_owned(), Quantity("7".into())),
                ]
                .into()
            }),
            ..NodeStatus::default()
        });
        node
    }

    #[test]
    fn p95_is_nearest_rank() {
        assert_eq!(stats(&[]), None);
        let one = stats(&[4.0]).expect("one value");
        assert_eq!((one.average, one.p95, one.max), (4.0, 4.0, 4.0));
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let s = stats(&hundred).expect("values");
        assert_eq!((s.count, s.average, s.p95, s.max), (100, 50.5, 95.0, 100.0));
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(stats(&twenty).expect("values").p95, 19.0);
        let s = stats(&[1.0, 2.0, 3.0]).expect("values");
        assert_eq!((s.average, s.p95), (2.0, 3.0));
    }

    #[test]
    fn cluster_gpus_count_whole_gpus_only() {
        let nodes = [
            node("a", Some("8")),
            node("b", Some("4")),
            node("c", None),
            node("d", Some("0")),
        ];
        assert_eq!(
            cluster_gpus(&nodes).expect("whole numbers"),
            ClusterGpus {
                gpus: 12,
                gpu_nodes: 2,
                nodes: 4
            }
        );
        let bad = cluster_gpus(&[node("odd", Some("1500m"))]).expect_err("fractional");
        assert!(bad.to_string().contains("node odd"), "{bad}");
        assert_eq!(cluster_gpus(&[]).expect("empty").gpus, 0);
    }

    fn run() -> Vec<TrainingJob> {
        use TrainingJobState::*;
        vec![
            // 4 GPUs from 10 to 110: 400 GPU-seconds, queued 10s.
            job("b", (2, 2), Some(Completed), (0, Some(10), Some(110))),
            // 2 GPUs from 30 to 80: 100 GPU-seconds, queued 20s.
            job("a", (2, 1), Some(Failed), (10, Some(30), Some(80))),
            // Running: queued 40s, no duration, not in the GPU time.
            job("c", (1, 1), Some(Running), (20, Some(60), None)),
            // Still waiting.
            job("d", (1, 8), Some(Queued), (90, None, None)),
            job("e", (1, 1), None, (95, None, None)),
        ]
    }

    #[test]
    fn counts_delays_durations_and_utilisation() {
        let cluster = ClusterGpus {
            gpus: 10,
            gpu_nodes: 2,
            nodes: 3,
        };
        let summary = summarise("in namespace ml".into(), &run(), Ok(cluster.clone()));
        assert_eq!(
            (
                summary.jobs.total,
                summary.jobs.completed,
                summary.jobs.failed,
                summary.jobs.other
            ),
            (5, 1, 1, 3)
        );
        assert_eq!(summary.jobs.by_state.get("-"), Some(&1));
        assert_eq!(summary.jobs.by_state.get("Queued"), Some(&1));

        let delay = summary
            .queueing_delay_seconds
            .clone()
            .expect("three started");
        assert_eq!(delay.count, 3);
        assert!((delay.average - 70.0 / 3.0).abs() < 1e-9);
        assert_eq!((delay.p95, delay.max), (40.0, 40.0));

        let duration = summary.duration_seconds.clone().expect("two finished");
        assert_eq!(
            (duration.count, duration.average, duration.p95),
            (2, 75.0, 100.0)
        );

        // (400 + 100) GPU-seconds / (10 GPUs × 110 s from creation at 0 to completion at 110).
        let u = &summary.gpu_utilisation;
        assert_eq!(u.gpu_seconds, 500.0);
        assert_eq!(u.window_seconds, Some(110.0));
        assert!((u.ratio.expect("known") - 500.0 / 1100.0).abs() < 1e-12);
        assert_eq!(u.cluster, Some(cluster));

        let names: Vec<_> = summary.per_job.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "e"]);
        assert_eq!(summary.per_job[1].gpus, 4);
        assert_eq!(summary.per_job[0].queueing_delay_seconds, Some(20.0));
        assert_eq!(summary.per_job[3].duration_seconds, None);
    }

    #[test]
    fn mig_jobs_are_left_out_of_gpu_time() {
        let mut mig = job(
            "m",
            (1, 2),
            Some(TrainingJobState::Completed),
            (0, Some(0), Some(100)),
        );
        mig.spec.scheduling = Some(SchedulingSpec {
            mig_profile: Some("1g.10gb".into()),
            ..SchedulingSpec::default()
        });
        let whole = job(
            "w",
            (1, 1),
            Some(TrainingJobState::Completed),
            (0, Some(0), Some(100)),
        );
        let cluster = ClusterGpus {
            gpus: 1,
            gpu_nodes: 1,
            nodes: 1,
        };
        let summary = summarise("x".into(), &[mig, whole], Ok(cluster));
        let u = &summary.gpu_utilisation;
        assert_eq!(u.gpu_seconds, 100.0);
        assert_eq!(u.ratio, Some(1.0));
        assert_eq!(u.mig_jobs_excluded, 1);
        let text = render(&summary, false);
        assert!(text.contains("2 (MIG)"), "{text}");
        assert!(
            text.contains("1 finished job(s) on MIG slices are not counted"),
            "{text}"
        );
    }

    #[test]
    fn utilisation_explains_why_it_is_unknown() {
        let cluster = ClusterGpus {
            gpus: 8,
            gpu_nodes: 1,
            nodes: 1,
        };
        let waiting = job("w", (1, 1), Some(TrainingJobState::Queued), (0, None, None));
        let u = summarise("x".into(), &[waiting], Ok(cluster.clone())).gpu_utilisation;
        assert_eq!(u.ratio, None);
        assert!(u.note.contains("no job has finished"), "{}", u.note);

        let done = job(
            "d",
            (1, 1),
            Some(TrainingJobState::Completed),
            (0, Some(1), Some(5)),
        );
        let no_gpus = ClusterGpus {
            gpus: 0,
            ..cluster.clone()
        };
        let u = summarise("x".into(), std::slice::from_ref(&done), Ok(no_gpus)).gpu_utilisation;
        assert!(
            u.note.contains("no allocatable nvidia.com/gpu"),
            "{}",
            u.note
        );

        let u = summarise(
            "x".into(),
            std::slice::from_ref(&done),
            Err("cannot list Nodes: forbidden".into()),
        )
        .gpu_utilisation;
        assert_eq!(u.ratio, None);
        assert_eq!(u.note, "unknown: cannot list Nodes: forbidden");

        let instant = job(
            "i",
            (1, 1),
            Some(TrainingJobState::Completed),
            (5, Some(5), Some(5)),
        );
        let u = summarise("x".into(), &[instant], Ok(cluster)).gpu_utilisation;
        assert!(
            u.note.contains("not after the first creation"),
            "{}",
            u.note
        );
    }

    #[test]
    fn an_empty_scope_summarises_to_zeros() {
        let summary = summarise("in namespace empty".into(), &[], Err("no nodes".into()));
        assert_eq!(summary.jobs, Counts::default());
        assert_eq!(summary.queueing_delay_seconds, None);
        let text = render(&summary, false);
        assert!(
            text.starts_with(
                "TrainingJobs in namespace empty: 0 (0 completed, 0 failed, 0 other)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("Queueing delay:  - (no started jobs)"),
            "{text}"
        );
    }

    #[test]
    fn renders_a_table_and_the_aggregates() {
        let cluster = ClusterGpus {
            gpus: 10,
            gpu_nodes: 2,
            nodes: 3,
        };
        let summary = summarise("in any namespace".into(), &run(), Ok(cluster));
        let text = render(&summary, true);
        assert!(
            text.starts_with("TrainingJobs in any namespace: 5 (1 completed, 1 failed, 3 other)\n"),
            "{text}"
        );
        assert!(
            text.contains("NAMESPACE   NAME   STATE       GPUS   QUEUED   DURATION\n"),
            "{text}"
        );
        assert!(
            text.contains("ml          b      Completed   4      10.0s    1m40s\n"),
            "{text}"
        );
        assert!(
            text.contains("ml          e      -           1      -        -\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "Queueing delay:  average 23.3s, p95 40.0s, max 40.0s over 3 started jobs\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "Job duration:    average 1m15s, p95 1m40s, max 1m40s over 2 finished jobs\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("GPU utilisation: 45.5% = 500 GPU-seconds / (10 GPUs x 1m50s)\n"),
            "{text}"
        );
        assert!(text.contains("Cluster GPUs:    10 allocatable nvidia.com/gpu on 2 of 3 nodes (MIG slices and time-sliced GPUs are not counted)\n"), "{text}");
    }

    #[test]
    fn json_uses_camel_case_and_keeps_the_note() {
        let summary = summarise(
            "in namespace ml".into(),
            &run(),
            Err("cannot list Nodes".into()),
        );
        let json = serde_json::to_value(&summary).expect("serialises");
        assert_eq!(json["jobs"]["completed"], 1);
        assert_eq!(json["queueingDelaySeconds"]["p95"], 40.0);
        assert_eq!(json["gpuUtilisation"]["ratio"], serde_json::Value::Null);
        assert_eq!(json["gpuUtilisation"]["note"], "unknown: cannot list Nodes");
        assert_eq!(json["perJob"][1]["name"], "b");
        assert_eq!(json["perJob"][1]["durationSeconds"], 100.0);
    }
}
