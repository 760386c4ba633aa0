//! The checkpoint-manager (its release binary) on a real nats-server and a
//! real S3-compatible server (`moto_server` on PATH):
//!
//! 1. `--jobs` TrainingJobs (default 1,000) each report `--checkpoints-per-job`
//!    checkpoints (default 50) on volumes the manager does not read, verified
//!    on the worker's word: no storage I/O, so the figure is the manager's own
//!    (reports handled per second). Then its RSS, with every checkpoint tracked.
//! 2. Every job leaves Running for another attempt (`Running → Pending`,
//!    `Restarting`), paced at `--failures-per-second`: the time from publishing
//!    the transition to receiving its `checkpoint.resume`, p50/p99/max.
//! 3. `--s3-checkpoints` checkpoints (default 500; 50 per job) written to moto
//!    (a manifest with SHA-256 and two files of 64 KiB and 32 KiB), then reported
//!    at once: checkpoints verified per second against the storage (list, read
//!    the manifest, hash both files), checksums on.
//!
//! Prints a table and one JSON line; bounded by `--timeout-seconds` per phase;
//! asserts nothing.
//!
//! Usage: `checkpoints [--jobs N] [--checkpoints-per-job N]
//! [--failures-per-second N] [--s3-checkpoints N] [--timeout-seconds N]
//! [--bin-dir DIR]`

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::HeaderMap;
use async_nats::jetstream;
use clap::Parser;
use futures::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_contracts::decisions::ResumePointChosen;
use trainyard_contracts::events::{Change, TrainingJobChanged};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::worker::{CheckpointReported, VerificationMethod};
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload, Service};
use trainyard_loadtest::stack::{Stack, default_bin_dir, free_port};
use trainyard_stats::SortedSamples;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    #[arg(long, default_value_t = 50)]
    checkpoints_per_job: usize,
    #[arg(long, default_value_t = 200)]
    failures_per_second: u64,
    #[arg(long, default_value_t = 500)]
    s3_checkpoints: usize,
    /// Limit of each phase's wait.
    #[arg(long, default_value_t = 300)]
    timeout_seconds: u64,
    /// Where `trainyard-checkpoint-manager` is (default: the workspace's target/release).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

const NS: &str = "bench";
const BUCKET: &str = "bench-checkpoints";
/// Publishes awaited at once before their acks are collected.
const PUBLISH_WINDOW: usize = 1000;

/// A moto server, killed on drop.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Moto {
    async fn start() -> anyhow::Result<Self> {
        let port = free_port()?;
        let child = std::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("moto_server on PATH (pip install 'moto[server]')")?;
        let moto = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("moto_server did not listen within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(moto)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes to JetStream, awaiting acks a window at a time.
struct Publisher {
    js: jetstream::Context,
    acks: Vec<jetstream::context::PublishAckFuture>,
}

impl Publisher {
    async fn send<P: Payload>(&mut self, entity: EntityRef, payload: P) -> anyhow::Result<()> {
        let envelope = Envelope::new("loadtest", entity, payload);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", envelope.id.to_string().as_str());
        let ack = self
            .js
            .publish_with_headers(envelope.subject(), headers, envelope.to_json()?.into())
            .await?;
        self.acks.push(ack);
        if self.acks.len() >= PUBLISH_WINDOW {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        for ack in self.acks.drain(..) {
            ack.await?;
        }
        Ok(())
    }
}

fn job_name(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index:04}")
}

fn entity(name: &str) -> EntityRef {
    EntityRef::new(NS, name, format!("uid-{name}"))
}

fn training_job(name: &str, storage: serde_json::Value) -> anyhow::Result<TrainingJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"model": "gpt", "dataset": "web", "numWorkers": 1,
                 "checkpoint": {"enabled": true, "storage": storage},
                 "scheduling": {"queue": "team-a"}}
    }))?)
}

fn report(
    uri: String,
    index: usize,
    verified_by: Option<VerificationMethod>,
) -> CheckpointReported {
    let step = (index as u64 + 1) * 100;
    CheckpointReported {
        epoch: u32::try_from(index + 1).unwrap_or(u32::MAX),
        step,
        uri,
        metrics: BTreeMap::from([("loss".to_string(), 1.0 / (index as f64 + 1.0))]),
        save_seconds: Some(30.0),
        size_bytes: 96 * 1024,
        verified_by,
        checksums_verified: verified_by.is_some(),
        ..CheckpointReported::default()
    }
}

/// The sum of the samples of `name` whose labels include every pair of `labels`.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| {
            labels
                .iter()
                .all(|(key, value)| line.contains(&format!("{key}=\"{value}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, value| sum + value)
}

/// Polls the manager's metric until it reaches `target`; the time it took
/// from `since`.
async fn wait_metric(
    stack: &Stack,
    name: &str,
    labels: &[(&str, &str)],
    target: f64,
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + limit;
    loop {
        let text = stack.metrics(Service::CheckpointManager).await?;
        let value = metric(&text, name, labels);
        if value >= target {
            return Ok(since.elapsed());
        }
        if Instant::now() > deadline {
            bail!("{name}{labels:?} reached {value} of {target} within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Current and peak resident set size of `pid`, in bytes.
fn rss(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .with_context(|| format!("{key} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The files of one checkpoint (two data files and the manifest listing them).
fn checkpoint_files(step: u64) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            "model/part-0.bin".to_string(),
            vec![(step % 251) as u8; 64 * 1024],
        ),
        ("optimizer.bin".to_string(), vec![7; 32 * 1024]),
    ];
    let manifest = json!({
        "format": "trainyard.checkpoint/v1", "step": step, "epoch": step / 100,
        "createdAt": "2026-12-06T00:00:00Z",
        "files": files.iter().map(|(path, bytes)| json!({
            "path": path, "sizeBytes": bytes.len(),
            "sha256": format!("{:x}", Sha256::digest(bytes)),
        })).collect::<Vec<_>>(),
    });
    files.push((
        "trainyard-manifest.json".to_string(),
        manifest.to_string().into_bytes(),
    ));
    files
}

const HANDLED: &str = "trainyard_messages_handled_total";
const VERIFICATIONS: &str = "trainyard_checkpoint_verifications_total";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let limit = Duration::from_secs(args.timeout_seconds);
    let bin_dir = args.bin_dir.clone().unwrap_or_else(default_bin_dir);
    let moto = Moto::start().await?;
    reqwest::Client::new()
        .put(format!("{}/{BUCKET}", moto.endpoint))
        .send()
        .await?
        .error_for_status()?;
    let mut stack = Stack::new(&bin_dir, "warn")?;
    stack.start_nats(None).await?;
    let env = [
        ("S3_ENDPOINT", moto.endpoint.as_str()),
        ("S3_REGION", "us-east-1"),
        ("S3_ACCESS_KEY_ID", "test"),
        ("S3_SECRET_ACCESS_KEY", "test"),
    ]
    .map(|(key, value)| {
        (
            format!("TRAINYARD_CHECKPOINT_MANAGER__{key}"),
            value.to_string(),
        )
    });
    stack.start_service(Service::CheckpointManager, &env)?;
    stack.wait_ready(Duration::from_secs(30)).await?;
    let manager_pid = stack
        .stats()
        .into_iter()
        .find(|p| p.name == Service::CheckpointManager.name())
        .map(|p| p.pid)
        .context("checkpoint-manager is running")?;
    let client = stack.connect().await?;
    let mut publisher = Publisher {
        js: jetstream::new(client.clone()),
        acks: Vec::new(),
    };
    let (_, rss_idle) = rss(manager_pid)?;

    // 1. Tracking: every job's checkpoints, verified on the worker's word.
    let names: Vec<String> = (0..args.jobs).map(|j| job_name("job", j)).collect();
    for name in &names {
        let job = training_job(
            name,
            json!({"type": "pvc", "claimName": "checkpoints", "mountPath": format!("/checkpoints/{name}")}),
        )?;
        publisher
            .send(
                entity(name),
                TrainingJobChanged {
                    change: Change::Applied,
                    object: job,
                },
            )
            .await?;
    }
    publisher.flush().await?;
    let events = [
        ("consumer", "checkpoint-manager-events"),
        ("outcome", "ack"),
    ];
    wait_metric(
        &stack,
        HANDLED,
        &events,
        args.jobs as f64,
        Instant::now(),
        limit,
    )
    .await?;
    let tracked = args.jobs * args.checkpoints_per_job;
    let started = Instant::now();
    for index in 0..args.checkpoints_per_job {
        for name in &names {
            let uri = format!("/checkpoints/{name}/step-{}", (index + 1) * 100);
            publisher
                .send(
                    entity(name),
                    report(uri, index, Some(VerificationMethod::TrainyardManifest)),
                )
                .await?;
        }
    }
    publisher.flush().await?;
    let tracking_took = wait_metric(
        &stack,
        VERIFICATIONS,
        &[("outcome", "verified")],
        tracked as f64,
        started,
        limit,
    )
    .await?;
    let (rss_tracked, peak_tracked) = rss(manager_pid)?;

    // 2. Failures: each job's transition to its resume decision.
    let received: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut resumes = client.subscribe("trainyard.decisions.resume.>").await?;
    let collector = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Some(message) = resumes.next().await {
                let at = Instant::now();
                let Ok(incoming) = Incoming::decode(&message.payload) else {
                    continue;
                };
                let Ok(point) = incoming.payload::<ResumePointChosen>() else {
                    continue;
                };
                if point.reason == "Restarting"
                    && let Ok(mut received) = received.lock()
                {
                    received.entry(incoming.header.entity.name).or_insert(at);
                }
            }
        })
    };
    client.flush().await?;
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let pace = Duration::from_secs_f64(1.0 / args.failures_per_second.max(1) as f64);
    let failures_started = tokio::time::Instant::now();
    for (i, name) in names.iter().enumerate() {
        tokio::time::sleep_until(failures_started + pace * u32::try_from(i).unwrap_or(u32::MAX))
            .await;
        sent.insert(name.clone(), Instant::now());
        publisher
            .send(
                entity(name),
                TrainingJobTransitioned {
                    from: Some(TrainingJobState::Running),
                    to: TrainingJobState::Pending,
                    reason: "Restarting".into(),
                    message: "worker exited with code 137".into(),
                    restart_count: 1,
                    gpus: 0,
                    queue: Some("team-a".into()),
                    context: Default::default(),
                },
            )
            .await?;
        // Each transition's own latency: its publish is acknowledged now.
        publisher.flush().await?;
    }
    let deadline = Instant::now() + limit;
    let latencies = loop {
        let done: Vec<f64> = {
            let received = received
                .lock()
                .map_err(|_| anyhow::anyhow!("collector state poisoned"))?;
            sent.iter()
                .filter_map(|(name, at)| {
                    received
                        .get(name)
                        .map(|got| got.saturating_duration_since(*at).as_secs_f64() * 1000.0)
                })
                .collect()
        };
        if done.len() == sent.len() || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    collector.abort();
    let latency = SortedSamples::new(latencies.iter().copied());
    let ms = |p: f64| latency.percentile(p).unwrap_or(f64::NAN);

    // 3. Verification against moto: write, then report at once.
    let http = reqwest::Client::new();
    let s3_jobs = args.s3_checkpoints.div_ceil(50).max(1);
    let s3_names: Vec<String> = (0..s3_jobs).map(|j| job_name("s3-job", j)).collect();
    for name in &s3_names {
        let job = training_job(name, json!({"type": "s3", "s3Bucket": BUCKET}))?;
        publisher
            .send(
                entity(name),
                TrainingJobChanged {
                    change: Change::Applied,
                    object: job,
                },
            )
            .await?;
    }
    publisher.flush().await?;
    wait_metric(
        &stack,
        HANDLED,
        &events,
        (args.jobs + s3_jobs) as f64,
        Instant::now(),
        limit,
    )
    .await?;
    let mut uris = Vec::new();
    for n in 0..args.s3_checkpoints {
        let name = &s3_names[n % s3_jobs];
        let index = n / s3_jobs;
        let prefix = format!("{NS}/{name}/step-{}", (index + 1) * 100);
        for (path, bytes) in checkpoint_files((index as u64 + 1) * 100) {
            http.put(format!("{}/{BUCKET}/{prefix}/{path}", moto.endpoint))
                .body(bytes)
                .send()
                .await?
                .error_for_status()?;
        }
        uris.push((name.clone(), index, format!("s3://{BUCKET}/{prefix}")));
    }
    let text = stack.metrics(Service::CheckpointManager).await?;
    let verified_before = metric(&text, VERIFICATIONS, &[("outcome", "verified")]);
    let started = Instant::now();
    for (name, index, uri) in uris {
        publisher
            .send(entity(&name), report(uri, index, None))
            .await?;
    }
    publisher.flush().await?;
    let s3_took = wait_metric(
        &stack,
        VERIFICATIONS,
        &[("outcome", "verified")],
        verified_before + args.s3_checkpoints as f64,
        started,
        limit,
    )
    .await?;
    let text = stack.metrics(Service::CheckpointManager).await?;
    let incomplete = metric(&text, VERIFICATIONS, &[("outcome", "incomplete")]);
    let dead_letters = publisher
        .js
        .get_stream("TRAINYARD_DEADLETTER")
        .await?
        .info()
        .await?
        .state
        .messages;
    let (rss_end, peak_end) = rss(manager_pid)?;
    let cpu_seconds = stack
        .stats()
        .into_iter()
        .find(|p| p.name == Service::CheckpointManager.name())
        .map(|p| p.cpu_seconds)
        .unwrap_or(f64::NAN);
    stack.stop(Duration::from_secs(10)).await;

    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let tracking_rate = tracked as f64 / tracking_took.as_secs_f64();
    let s3_rate = args.s3_checkpoints as f64 / s3_took.as_secs_f64();
    println!(
        "checkpoint-manager: {} jobs x {} checkpoints = {tracked} tracked",
        args.jobs, args.checkpoints_per_job
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| reports handled (worker's word), {tracked} | {:.1} s, {tracking_rate:.0}/s |",
        tracking_took.as_secs_f64()
    );
    println!(
        "| RSS idle / with {tracked} tracked (peak) | {:.1} MiB / {:.1} MiB ({:.1} MiB) |",
        mib(rss_idle),
        mib(rss_tracked),
        mib(peak_tracked)
    );
    println!(
        "| failure → resume decision, {} jobs at {}/s: p50 / p99 / max | {:.1} / {:.1} / {:.1} ms ({} of {} answered) |",
        args.jobs,
        args.failures_per_second,
        ms(50.0),
        ms(99.0),
        latency.max().unwrap_or(f64::NAN),
        latency.len(),
        args.jobs
    );
    println!(
        "| verified on moto S3 (checksums on), {} | {:.1} s, {s3_rate:.1} checkpoints/s |",
        args.s3_checkpoints,
        s3_took.as_secs_f64()
    );
    println!(
        "| RSS at the end (peak) | {:.1} MiB ({:.1} MiB) |",
        mib(rss_end),
        mib(peak_end)
    );
    println!("| incomplete verifications, dead letters | {incomplete}, {dead_letters} |");
    println!("| manager CPU | {cpu_seconds:.1} s |");
    println!(
        "{}",
        json!({
            "benchmark": "checkpoints",
            "jobs": args.jobs,
            "checkpoints_per_job": args.checkpoints_per_job,
            "tracked": tracked,
            "tracking_seconds": tracking_took.as_secs_f64(),
            "tracking_reports_per_second": tracking_rate,
            "rss_idle_bytes": rss_idle,
            "rss_tracked_bytes": rss_tracked,
            "rss_tracked_peak_bytes": peak_tracked,
            "failures_per_second": args.failures_per_second,
            "resume_answered": latency.len(),
            "resume_ms_p50": ms(50.0),
            "resume_ms_p99": ms(99.0),
            "resume_ms_max": latency.max(),
            "s3_checkpoints": args.s3_checkpoints,
            "s3_seconds": s3_took.as_secs_f64(),
            "s3_checkpoints_per_second": s3_rate,
            "rss_end_bytes": rss_end,
            "rss_end_peak_bytes": peak_end,
            "incomplete": incomplete,
            "dead_letters": dead_letters,
            "manager_cpu_seconds": cpu_seconds,
        })
    );
    drop(moto);
    Ok(())
}
