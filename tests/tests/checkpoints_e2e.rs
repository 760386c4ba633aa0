//! Checkpoints end to end on the simulated demo cluster: its workers write
//! real checkpoint files under a temporary root, the checkpoint-manager reads
//! them through the simulator's S3 endpoint with its real S3 client, and the
//! watcher, planner and gpu-allocator run the job. A save killed mid-way
//! fails the first attempt; the next one resumes from the newest verified
//! checkpoint, skipping the incomplete newer one (a `CheckpointSkipped`
//! Event), its worker reads and verifies `RESUME_FROM`, and retention
//! (`keepLast: 2`) deletes the older checkpoints from disk.

mod common;

use common::*;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams};
use planner_core::PlannerConfig;
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingQueue};
use trainyard_checkpoint_manager::{ManagerConfig, StorageSettings};
use trainyard_contracts::Service;
use trainyard_simulator::checkpoints::{SaveDraw, killed_save};
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, eventually_within};

const NS: &str = "default";
const JOB: &str = "resume-e2e";
const BASE: &str = "s3://ml-checkpoints/default/resume-e2e";
const EPOCHS: u32 = 8;
const KILLED_SAVE_RATE: f64 = 0.3;
/// Files of a one-worker checkpoint, the manifest included.
const FILES: usize = 4;

fn killed(seed: u64, attempt: u32, epoch: u32) -> bool {
    let uri = format!("{BASE}/checkpoint-epoch-{epoch}");
    let draw = SaveDraw {
        seed,
        rate: KILLED_SAVE_RATE,
        namespace: NS,
        training_job: JOB,
        attempt,
        uri: &uri,
    };
    killed_save(&draw, FILES).is_some()
}

/// A seed under which attempt 0 saves epochs 1 and 2 and dies saving epoch 3,
/// and later attempts save every epoch.
fn seed_killing_the_third_save_only() -> u64 {
    (0..10_000)
        .find(|&seed| {
            !killed(seed, 0, 1)
                && !killed(seed, 0, 2)
                && killed(seed, 0, 3)
                && (1..=3).all(|attempt| (3..=EPOCHS).all(|e| !killed(seed, attempt, e)))
        })
        .expect("some seed draws that")
}

/// Checkpoint directories left under the job's prefix, sorted.
fn checkpoints_on_disk(root: &Path) -> Vec<String> {
    let dir = root.join("s3/ml-checkpoints/default/resume-e2e");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_job_resumes_from_the_newest_verified_checkpoint_skipping_an_incomplete_newer_one()
 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = tempfile::tempdir().expect("temp dir");
    let mut config = demo_cluster();
    config.seed = seed_killing_the_third_save_only();
    config.checkpoints.root = Some(root.path().to_path_buf());
    config.checkpoints.killed_save_rate = KILLED_SAVE_RATE;

    let nats = NatsServer::start();
    let shutdown = CancellationToken::new();
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let simulator = Simulator::start(config, "127.0.0.1:0", Some(client), shutdown.clone())
        .await
        .expect("simulator starts");
    let kube = kube_client(&simulator, None).await;
    let _watcher = start_watcher(&nats, &shutdown, &kube).await;
    let planner = runtime(Service::Planner, &nats, &shutdown).await;
    let planner_config = PlannerConfig {
        worker_nats_url: nats.url(),
        restart_backoff_initial_seconds: 1,
        restart_backoff_max_seconds: 2,
        ..Default::default()
    };
    trainyard_planner::start(&planner, planner_config, kube.clone()).expect("planner starts");
    let allocator = runtime(Service::GpuAllocator, &nats, &shutdown).await;
    trainyard_gpu_allocator::start(&allocator, Default::default())
        .await
        .expect("allocator starts");
    let manager = runtime(Service::CheckpointManager, &nats, &shutdown).await;
    let manager_config = ManagerConfig {
        storage: StorageSettings {
            s3_endpoint: Some(format!("http://{}/s3", simulator.address)),
            s3_region: Some("us-east-1".into()),
            s3_access_key_id: Some("simulator".into()),
            s3_secret_access_key: Some("simulator".into()),
            ..StorageSettings::default()
        },
        ..ManagerConfig::default()
    };
    trainyard_checkpoint_manager::start(&manager, manager_config)
        .await
        .expect("checkpoint-manager starts");

    let queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
    Api::<TrainingQueue>::all(kube.clone())
        .patch(
            &queue.name_any(),
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&queue),
        )
        .await
        .expect("queue");
    let job: TrainingJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": NS},
        "spec": {
            "model": "gpt2",
            "dataset": "wikitext",
            "numWorkers": 1,
            "gpusPerWorker": 1,
            "hyperparameters": {"epochs": EPOCHS},
            "checkpoint": {
                "enabled": true,
                "frequency": 1,
                "storage": {"type": "s3", "s3Bucket": "ml-checkpoints"},
                "retention": {"keepLast": 2},
            },
        },
    }))
    .expect("job");
    let jobs = Api::<TrainingJob>::namespaced(kube.clone(), NS);
    jobs.patch(JOB, &PatchParams::apply("e2e").force(), &Patch::Apply(&job))
        .await
        .expect("job applied");

    let finished = eventually_within("the job to complete", Duration::from_secs(120), || {
        let jobs = jobs.clone();
        async move {
            let live = jobs.get(JOB).await.ok()?;
            let status = live.status.clone()?;
            (status.state == Some(TrainingJobState::Completed)
                && status.checkpoint.as_ref()?.latest_epoch == Some(EPOCHS))
            .then_some(live)
        }
    })
    .await;
    let status = finished.status.clone().unwrap_or_default();
    assert!(status.restart_count.unwrap_or_default() >= 1, "{status:?}");
    let checkpoint = status.checkpoint.clone().unwrap_or_default();
    assert_eq!(
        checkpoint.latest_path.as_deref(),
        Some(format!("{BASE}/checkpoint-epoch-{EPOCHS}").as_str()),
        "{checkpoint:?}"
    );

    let events = Api::<Event>::namespaced(kube.clone(), NS);
    let skipped = eventually_within(
        "the CheckpointSkipped Event",
        Duration::from_secs(20),
        || {
            let events = events.clone();
            async move {
                let listed = events.list(&ListParams::default()).await.ok()?;
                listed.items.into_iter().find_map(|e| {
                    let on_job = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(JOB);
                    (on_job && e.reason.as_deref() == Some("CheckpointSkipped"))
                        .then(|| e.note.unwrap_or_default())
                })
            }
        },
    )
    .await;
    assert!(
        skipped.starts_with(&format!(
            "resuming from {BASE}/checkpoint-epoch-2 (step 200), not from the newer {BASE}/checkpoint-epoch-3 (step 300): "
        )),
        "{skipped}"
    );

    // The next attempt's worker read the resume point and verified it.
    let pods = Api::<Pod>::namespaced(kube.clone(), NS);
    let listed = pods
        .list(&ListParams::default().labels(&format!("trainyard.dev/job={JOB}")))
        .await
        .expect("pods");
    let mut logs = Vec::new();
    for pod in &listed.items {
        if let Ok(text) = pods.logs(&pod.name_any(), &LogParams::default()).await {
            logs.push(text);
        }
    }
    let resumed = format!(
        "resuming from {BASE}/checkpoint-epoch-2 at epoch 2 (read RESUME_FROM: trainyard-manifest.json verified, 3 files)"
    );
    assert!(
        logs.iter().any(|log| log.contains(&resumed)),
        "a worker log says {resumed:?}: {logs:?}"
    );

    // keepLast: 2 — the manager deleted the older checkpoints through S3.
    let left = eventually_within(
        "retention to leave the two newest checkpoints",
        Duration::from_secs(20),
        || {
            let left = checkpoints_on_disk(root.path());
            async move { (left.len() == 2).then_some(left) }
        },
    )
    .await;
    assert_eq!(left, ["checkpoint-epoch-7", "checkpoint-epoch-8"]);

    shutdown.cancel();
    simulator.join().await;
}
