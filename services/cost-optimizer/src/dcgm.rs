//! Reads GPU activity from a Prometheus that scrapes NVIDIA's DCGM exporter
//! (`utilization_source: dcgm`): two instant queries per accounting run,
//! the engine-active ratio and the utilisation percentage it falls back to,
//! read by worker in `cost_optimizer_core::dcgm`.

use std::collections::BTreeMap;
use std::time::Duration;

use cost_optimizer_core::dcgm::{
    ENGINE_ACTIVE_METRIC, GPU_UTIL_METRIC, WorkerPod, activity_by_worker, samples_by_worker,
};

use crate::error::CostServiceError;

/// How long one query may take; an accounting run never waits longer.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The Prometheus to ask.
pub struct DcgmSource {
    client: reqwest::Client,
    query_url: String,
}

impl DcgmSource {
    /// `url`: the Prometheus base URL (`cost_optimizer.prometheus_url`).
    pub fn new(url: &str) -> Result<Self, CostServiceError> {
        let url = url.trim().trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(CostServiceError::Invalid(format!(
                "cost_optimizer.prometheus_url: {url:?} is not an http(s) URL; utilization_source dcgm needs the Prometheus that scrapes the DCGM exporter, e.g. http://prometheus.monitoring:9090"
            )));
        }
        let client = reqwest::Client::builder()
            .timeout(QUERY_TIMEOUT)
            .build()
            .map_err(|e| CostServiceError::Prometheus(e.to_string()))?;
        Ok(Self {
            client,
            query_url: format!("{url}/api/v1/query"),
        })
    }

    async fn query(&self, metric: &str) -> Result<Vec<(WorkerPod, f64)>, CostServiceError> {
        let failed = |e: String| {
            CostServiceError::Prometheus(format!("{metric} from {}: {e}", self.query_url))
        };
        let response = self
            .client
            .get(&self.query_url)
            .query(&[("query", metric)])
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| failed(e.to_string()))?;
        // Prometheus answers a bad query with 400 and a JSON error, which
        // says more than the status.
        samples_by_worker(&body).map_err(|e| failed(format!("HTTP {status}: {e}")))
    }

    /// Each worker's GPU activity (0..1) now.
    pub async fn activity(&self) -> Result<BTreeMap<WorkerPod, f64>, CostServiceError> {
        let engine_active = self.query(ENGINE_ACTIVE_METRIC).await?;
        let gpu_util = self.query(GPU_UTIL_METRIC).await?;
        Ok(activity_by_worker(&engine_active, &gpu_util))
    }
}
