//! GPU activity from NVIDIA's DCGM exporter, as a Prometheus that scrapes
//! it answers instant queries: which worker of which TrainingJob attempt a
//! series belongs to, and its mean activity (0..1) over the worker's GPUs.
//!
//! `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio, 0..1: the share of time the
//! graphics engine was busy) is the measure; a pod without it (GPUs or
//! exporter configurations without profiling metrics) falls back to
//! `DCGM_FI_DEV_GPU_UTIL` (percent, 0..100). The exporter names the pod in
//! `namespace` and `pod`; scraped by a Kubernetes service discovery those
//! become `exported_namespace` and `exported_pod`, which win when present.
//! Pods are matched to jobs by the planner's names: TrainingJob `tj`,
//! attempt `n` runs as Job `tj-a<n>`, whose worker `i` is pod
//! `tj-a<n>-<i>-<suffix>`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::error::CostError;

/// The measure, a ratio.
pub const ENGINE_ACTIVE_METRIC: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
/// The fallback, in percent.
pub const GPU_UTIL_METRIC: &str = "DCGM_FI_DEV_GPU_UTIL";

/// One worker of one attempt of a TrainingJob.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerPod {
    pub namespace: String,
    pub training_job: String,
    pub attempt: u32,
    pub worker_index: u32,
}

/// The worker a pod named by the planner runs, or None for any other pod.
pub fn worker_of_pod(namespace: &str, pod: &str) -> Option<WorkerPod> {
    // <job>-<index>-<5-character suffix>, the Job being <training job>-a<attempt>.
    let (rest, suffix) = pod.rsplit_once('-')?;
    if suffix.len() != 5 || !suffix.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let (job, index) = rest.rsplit_once('-')?;
    let (training_job, attempt) = job.rsplit_once("-a")?;
    let number = |text: &str| {
        (!text.is_empty() && text.chars().all(|c| c.is_ascii_digit()))
            .then(|| text.parse().ok())
            .flatten()
    };
    Some(WorkerPod {
        namespace: namespace.to_owned(),
        training_job: training_job.to_owned(),
        attempt: number(attempt)?,
        worker_index: number(index)?,
    })
    .filter(|w| !w.training_job.is_empty())
}

#[derive(Debug, Deserialize)]
struct QueryResponse {
    status: String,
    #[serde(default)]
    data: Option<QueryData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct QueryData {
    result_type: String,
    result: Vec<VectorSample>,
}

#[derive(Debug, Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    /// `[unix time, "value"]`.
    value: (f64, String),
}

/// The value of every series of an instant query's answer (a Prometheus
/// `/api/v1/query` response body), by worker; series of other pods, or
/// with a value that is not a number, are left out.
pub fn samples_by_worker(body: &str) -> Result<Vec<(WorkerPod, f64)>, CostError> {
    let response: QueryResponse = serde_json::from_str(body)
        .map_err(|e| CostError::Prometheus(format!("unreadable query response: {e}")))?;
    if response.status != "success" {
        return Err(CostError::Prometheus(format!(
            "query failed: {}",
            response.error.unwrap_or(response.status)
        )));
    }
    let data = response
        .data
        .ok_or_else(|| CostError::Prometheus("query response without data".into()))?;
    if data.result_type != "vector" {
        return Err(CostError::Prometheus(format!(
            "expected an instant vector, got a {}",
            data.result_type
        )));
    }
    Ok(data
        .result
        .into_iter()
        .filter_map(|sample| {
            let label = |names: [&str; 2]| {
                names
                    .iter()
                    .find_map(|n| sample.metric.get(*n).filter(|v| !v.is_empty()))
            };
            let namespace = label(["exported_namespace", "namespace"])?;
            let pod = label(["exported_pod", "pod"])?;
            let value: f64 = sample
                .value
                .1
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())?;
            Some((worker_of_pod(namespace, pod)?, value))
        })
        .collect())
}

/// Each worker's mean activity (0..1) over its GPUs: from the engine-active
/// series where the worker has any, else from the utilisation series.
pub fn activity_by_worker(
    engine_active: &[(WorkerPod, f64)],
    gpu_util_percent: &[(WorkerPod, f64)],
) -> BTreeMap<WorkerPod, f64> {
    let mean = |samples: &[(WorkerPod, f64)], scale: f64| {
        let mut sums: BTreeMap<WorkerPod, (f64, u32)> = BTreeMap::new();
        for (worker, value) in samples {
            let entry = sums.entry(worker.clone()).or_default();
            entry.0 += value * scale;
            entry.1 += 1;
        }
        sums.into_iter()
            .map(|(w, (sum, n))| (w, (sum / f64::from(n)).clamp(0.0, 1.0)))
            .collect::<BTreeMap<_, _>>()
    };
    let mut activity = mean(gpu_util_percent, 0.01);
    activity.extend(mean(engine_active, 1.0));
    activity
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(job: &str, attempt: u32, index: u32) -> WorkerPod {
        WorkerPod {
            namespace: "ml".into(),
            training_job: job.into(),
            attempt,
            worker_index: index,
        }
    }

    #[test]
    fn pods_are_matched_to_workers_by_the_planners_names() {
        assert_eq!(
            worker_of_pod("ml", "bert-a2-1-x7k2p"),
            Some(worker("bert", 2, 1))
        );
        // A job name may itself contain "-a<digits>-".
        assert_eq!(
            worker_of_pod("ml", "run-a1-b-a0-3-abcde"),
            Some(worker("run-a1-b", 0, 3))
        );
        for other in [
            "coredns-5d78c9869d-abcde",
            "bert-a2-1",
            "bert-ax-1-abcde",
            "-a0-0-abcde",
        ] {
            assert_eq!(worker_of_pod("ml", other), None, "{other}");
        }
    }

    fn response(series: &[(&str, &str, &str, &str)]) -> String {
        let result: Vec<serde_json::Value> = series
            .iter()
            .map(|(ns_label, ns, pod, value)| {
                serde_json::json!({
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", *ns_label: ns,
                               if *ns_label == "namespace" { "pod" } else { "exported_pod" }: pod},
                    "value": [1_800_000_000.0, value],
                })
            })
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string()
    }

    #[test]
    fn series_are_read_by_worker_with_the_exported_labels_first() {
        let body = response(&[
            ("namespace", "ml", "bert-a0-0-abcde", "0.5"),
            ("exported_namespace", "ml", "gpt-a1-0-fghij", "0.25"),
            ("namespace", "ml", "not-a-worker", "0.9"),
            ("namespace", "ml", "bert-a0-1-klmno", "NaN"),
        ]);
        assert_eq!(
            samples_by_worker(&body).expect("valid"),
            vec![(worker("bert", 0, 0), 0.5), (worker("gpt", 1, 0), 0.25)]
        );
    }

    #[test]
    fn a_failed_or_unexpected_answer_is_an_error_not_an_empty_result() {
        let failed = r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(
            samples_by_worker(failed)
                .expect_err("failed")
                .to_string()
                .contains("parse error")
        );
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(samples_by_worker(matrix).is_err());
        assert!(samples_by_worker("<html>").is_err());
    }

    #[test]
    fn engine_activity_wins_and_utilisation_fills_in_per_worker() {
        let active = [(worker("a", 0, 0), 0.1), (worker("a", 0, 0), 0.3)];
        let util = [(worker("a", 0, 0), 90.0), (worker("b", 0, 0), 40.0)];
        let activity = activity_by_worker(&active, &util);
        assert!(
            (activity[&worker("a", 0, 0)] - 0.2).abs() < 1e-9,
            "mean of two GPUs"
        );
        assert!(
            (activity[&worker("b", 0, 0)] - 0.4).abs() < 1e-9,
            "percent to ratio"
        );
    }
}
