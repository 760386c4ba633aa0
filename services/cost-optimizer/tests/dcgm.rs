//! GPU activity from a real Prometheus scraping an endpoint that serves
//! metrics in the DCGM exporter's format: a busy worker, an idle one, one
//! with only the fallback metric; and an unreachable Prometheus is an error.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cost_optimizer_core::dcgm::WorkerPod;
use trainyard_cost_optimizer::dcgm::DcgmSource;

const EXPORTER_METRICS: &str = "\
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"n1\",container=\"worker\",namespace=\"ml\",pod=\"busy-a0-0-abcde\"} 0.9
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"1\",UUID=\"GPU-2\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"n1\",container=\"worker\",namespace=\"ml\",pod=\"busy-a0-0-abcde\"} 0.8
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"2\",UUID=\"GPU-3\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"n1\",container=\"worker\",namespace=\"ml\",pod=\"idle-a1-0-fghij\"} 0.01
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"n1\",container=\"worker\",namespace=\"ml\",pod=\"busy-a0-0-abcde\"} 97
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-9\",modelName=\"Tesla T4\",Hostname=\"n2\",container=\"worker\",namespace=\"ml\",pod=\"t4job-a0-1-klmno\"} 3
";

/// A Prometheus (Debian's package) scraping `target` every second, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(target: &str) -> Prometheus {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: dcgm-exporter\n    static_configs: [{{targets: ['{target}']}}]\n"
        ),
    )
    .expect("config written");
    let port = trainyard_testkit::free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus on PATH (Debian package prometheus)");
    Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    }
}

fn worker(job: &str, attempt: u32, index: u32) -> WorkerPod {
    WorkerPod {
        namespace: "ml".into(),
        training_job: job.into(),
        attempt,
        worker_index: index,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_is_read_per_worker_from_a_real_prometheus_with_the_fallback_metric() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("exporter listens");
    let exporter = listener.local_addr().expect("address");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async { EXPORTER_METRICS }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let prometheus = start_prometheus(&exporter.to_string());
    let source = DcgmSource::new(&prometheus.url).expect("valid url");
    let activity = trainyard_testkit::eventually_within(
        "Prometheus to have scraped the exporter",
        Duration::from_secs(30),
        || async { source.activity().await.ok().filter(|a| a.len() == 3) },
    )
    .await;
    let busy = activity[&worker("busy", 0, 0)];
    assert!(
        (busy - 0.85).abs() < 1e-9,
        "engine activity, mean of two GPUs: {busy}"
    );
    assert!(activity[&worker("idle", 1, 0)] < 0.05, "the idle worker");
    let fallback = activity[&worker("t4job", 0, 1)];
    assert!(
        (fallback - 0.03).abs() < 1e-9,
        "GPU_UTIL percent when engine activity is absent: {fallback}"
    );
}

#[tokio::test]
async fn an_unreachable_prometheus_is_an_error_not_an_empty_answer() {
    let port = trainyard_testkit::free_port();
    let source = DcgmSource::new(&format!("http://127.0.0.1:{port}")).expect("valid url");
    let err = source.activity().await.expect_err("nothing listens");
    assert!(
        err.to_string().contains("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
        "{err}"
    );
    assert!(
        DcgmSource::new("prometheus:9090").is_err(),
        "a URL without a scheme is refused"
    );
}
