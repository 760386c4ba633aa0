//! Test harness: a real NATS server, the checkpoint-manager on a [`Runtime`],
//! a driver that plays the watcher, the planner and the workers, and
//! checkpoints written to real storage.
// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{ObjectStore, PutPayload};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_checkpoint_manager::{ManagerConfig, StorageSettings};
use trainyard_contracts::events::{Change, TrainingJobChanged};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::worker::CheckpointReported;
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload, Service};
use trainyard_runtime::metrics::RuntimeMetrics;
use trainyard_runtime::{Publisher, Runtime, Settings};
use trainyard_testkit::NatsServer;

pub const NS: &str = "ml";

/// A real S3-compatible server (`moto_server`, `pip install 'moto[server]'`) on loopback.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    pub fn start() -> Self {
        Self::start_on(trainyard_testkit::free_port())
    }

    /// Starts the server on `port` (e.g. one a job's storage already names).
    pub fn start_on(port: u16) -> Self {
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server on PATH (pip install 'moto[server]')");
        let endpoint = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "moto_server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self { child, endpoint }
    }

    /// The manager's storage settings for this server.
    pub fn storage(&self) -> StorageSettings {
        StorageSettings {
            read_volumes: true,
            s3_endpoint: Some(self.endpoint.clone()),
            s3_region: Some("us-east-1".into()),
            s3_access_key_id: Some("test".into()),
            s3_secret_access_key: Some("test".into()),
            ..StorageSettings::default()
        }
    }

    /// Creates `bucket` (moto needs it first) and returns a client of it.
    pub async fn bucket(&self, bucket: &str) -> AmazonS3 {
        reqwest::Client::new()
            .put(format!("{}/{bucket}", self.endpoint))
            .send()
            .await
            .expect("bucket created");
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .expect("s3 client")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a complete checkpoint (files, then its manifest) under `prefix` in `s3`.
pub async fn write_s3_checkpoint(s3: &AmazonS3, prefix: &str, step: u64, loss: f64) {
    let (mut files, manifest) = checkpoint_files(step, loss, 256);
    files.push(("trainyard-manifest.json".to_string(), manifest));
    for (path, bytes) in files {
        s3.put(
            &object_store::path::Path::from(format!("{prefix}/{path}")),
            PutPayload::from(bytes),
        )
        .await
        .expect("put");
    }
}

pub async fn start_manager(nats: &NatsServer, config: ManagerConfig) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    settings.shutdown_grace_seconds = 5;
    let runtime = Runtime::start(
        Service::CheckpointManager,
        settings,
        CancellationToken::new(),
    )
    .await
    .expect("runtime starts");
    trainyard_checkpoint_manager::start(&runtime, config)
        .await
        .expect("manager starts");
    runtime
}

pub async fn stop_manager(runtime: Runtime) {
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("manager stops");
}

pub fn job_ref(name: &str) -> EntityRef {
    EntityRef::new(NS, name, format!("uid-{name}"))
}

/// A TrainingJob with checkpointing on, its storage and retention as given.
pub fn training_job(name: &str, checkpoint: serde_json::Value) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"model": "gpt", "dataset": "web", "numWorkers": 1, "checkpoint": checkpoint,
                 "scheduling": {"queue": "team-a"}}
    }))
    .expect("job parses")
}

pub struct Driver {
    pub publisher: Publisher,
    pub jetstream: jetstream::Context,
}

impl Driver {
    pub async fn connect(nats: &NatsServer) -> Self {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let jetstream = jetstream::new(client);
        let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).expect("metrics");
        Self {
            publisher: Publisher::new(jetstream.clone(), Service::Watcher, metrics),
            jetstream,
        }
    }

    pub async fn publish<P: Payload + Clone>(&self, entity: EntityRef, payload: P) {
        self.publisher
            .publish(Envelope::new("test", entity, payload))
            .await
            .expect("publish");
    }

    pub async fn apply(&self, job: &TrainingJob) {
        let entity = EntityRef::new(
            NS,
            job.metadata.name.as_deref().unwrap_or_default(),
            job.metadata.uid.as_deref().unwrap_or_default(),
        );
        self.publish(
            entity,
            TrainingJobChanged {
                change: Change::Applied,
                object: job.clone(),
            },
        )
        .await;
    }

    pub async fn report(&self, job: &str, uri: &str, step: u64, loss: f64, save_seconds: f64) {
        self.publish(
            job_ref(job),
            CheckpointReported {
                epoch: u32::try_from(step / 100).unwrap_or(0),
                step,
                uri: uri.to_string(),
                metrics: BTreeMap::from([("loss".to_string(), loss)]),
                save_seconds: Some(save_seconds),
                ..CheckpointReported::default()
            },
        )
        .await;
    }

    pub async fn transition(
        &self,
        job: &str,
        from: TrainingJobState,
        to: TrainingJobState,
        reason: &str,
    ) {
        self.publish(
            job_ref(job),
            TrainingJobTransitioned {
                from: Some(from),
                to,
                reason: reason.to_string(),
                message: String::new(),
                restart_count: 0,
                gpus: 1,
                queue: Some("team-a".to_string()),
                context: Default::default(),
            },
        )
        .await;
    }

    /// Every decision of type `P` published about `job` so far.
    pub async fn decisions<P: Payload>(&self, job: &str) -> Vec<P> {
        trainyard_testkit::stream_messages(&self.jetstream, "TRAINYARD_DECISIONS", None)
            .await
            .into_iter()
            .filter_map(|m| Incoming::decode(&m.payload).ok())
            .filter(|m| m.header.entity.name == job && m.is::<P>())
            .filter_map(|m| m.payload::<P>().ok())
            .collect()
    }

    /// Polls until `count` decisions of type `P` about `job` exist (allowing
    /// a quarter second per message for long fault-injection runs).
    pub async fn wait_for<P: Payload>(&self, job: &str, count: usize) -> Vec<P> {
        trainyard_testkit::eventually_within(
            &format!("{count} {} for {job}", P::TYPE),
            Duration::from_secs(30)
                + Duration::from_millis(250) * u32::try_from(count).unwrap_or(u32::MAX),
            || async {
                let found = self.decisions::<P>(job).await;
                (found.len() >= count).then_some(found)
            },
        )
        .await
    }
}

/// The files of one checkpoint and its manifest, as the worker-side reporter writes them.
pub fn checkpoint_files(step: u64, loss: f64, size: usize) -> (Vec<(String, Vec<u8>)>, Vec<u8>) {
    let files: Vec<(String, Vec<u8>)> = vec![
        (
            "model/part-0.bin".to_string(),
            vec![(step % 251) as u8; size],
        ),
        ("optimizer.bin".to_string(), vec![7; size / 2 + 1]),
    ];
    let manifest = json!({
        "format": "trainyard.checkpoint/v1", "step": step, "epoch": step / 100,
        "createdAt": "2026-12-06T00:00:00Z",
        "files": files.iter().map(|(path, bytes)| json!({
            "path": path, "sizeBytes": bytes.len(),
            "sha256": format!("{:x}", Sha256::digest(bytes)),
        })).collect::<Vec<_>>(),
        "metrics": {"loss": loss},
    });
    (
        files,
        serde_json::to_vec(&manifest).expect("manifest encodes"),
    )
}

/// Writes a checkpoint into `dir`; with `complete` false the save stops
/// after the first file (no manifest): a worker killed mid-save.
pub fn write_volume_checkpoint(dir: &Path, step: u64, loss: f64, complete: bool) {
    let (files, manifest) = checkpoint_files(step, loss, 4096);
    for (index, (path, bytes)) in files.iter().enumerate() {
        if !complete && index == 1 {
            return;
        }
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::write(target, bytes).expect("write");
    }
    std::fs::write(dir.join("trainyard-manifest.json"), manifest).expect("manifest");
}

/// Every `CheckpointProblem` alert published about `job` so far, with its envelope id.
pub async fn problems(
    jetstream: &jetstream::Context,
    job: &str,
) -> Vec<(String, trainyard_contracts::alerts::CheckpointProblem)> {
    use trainyard_contracts::alerts::CheckpointProblem;
    trainyard_testkit::stream_messages(jetstream, "TRAINYARD_ALERTS", None)
        .await
        .into_iter()
        .filter_map(|m| Incoming::decode(&m.payload).ok())
        .filter(|m| m.header.entity.name == job && m.is::<CheckpointProblem>())
        .filter_map(|m| {
            let id = m.header.id.to_string();
            m.payload::<CheckpointProblem>().ok().map(|p| (id, p))
        })
        .collect()
}
