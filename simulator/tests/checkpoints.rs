//! The simulated workers' checkpoints as real files under a temporary root:
//! written with Trainyard's manifest and reported as verified, saying how; a
//! killed save left without its manifest, reported unverified, and the run
//! failing; retention decisions for volumes carried out by the workers;
//! `RESUME_FROM` read and verified; the root's `s3/` part served to a real S3
//! client.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_WORKER_INDEX;
use trainyard_contracts::decisions::{RetentionApplied, RetentionExecutor};
use trainyard_contracts::worker::{CheckpointReported, VerificationMethod};
use trainyard_simulator::checkpoints::{self, CheckpointStorage, MANIFEST_FILE, SavePlan};
use trainyard_simulator::clock::SimClock;
use trainyard_simulator::cluster::{Cluster, Report, WorkerCommand};
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::resources;
use trainyard_simulator::runner::Simulator;
use trainyard_simulator::selector::Selector;
use trainyard_simulator::store::Store;

const NS: &str = "ml";

fn cluster(root: &Path, extra: &str) -> (Arc<Store>, Cluster) {
    let yaml = format!(
        "nodes: [{{name: n, gpus: 8}}]\nworkers: {{secondsPerEpoch: 10, startDelaySeconds: 0}}\ncheckpoints: {{root: {}{extra}}}",
        root.display()
    );
    let store = Arc::new(Store::default());
    let config = ClusterConfig::parse(&yaml).expect("valid config");
    let cluster = Cluster::new(store.clone(), config, SimClock::new(1.0));
    (store, cluster)
}

/// A Job as the planner writes it, checkpointing every epoch to `dir`.
fn job(store: &Store, name: &str, workers: u32, dir: &str, resume_from: Option<&str>) {
    job_with(store, name, workers, dir, resume_from, "1", None);
}

/// A Job as the planner writes it with `CHECKPOINT_FREQUENCY` = `frequency`
/// and, for `auto`, the advised interval in its ConfigMap when given.
fn job_with(
    store: &Store,
    name: &str,
    workers: u32,
    dir: &str,
    resume_from: Option<&str>,
    frequency: &str,
    interval_seconds: Option<&str>,
) {
    let mut data = json!({
        "hyperparameters.json": "{\"epochs\": 4}",
        "training-config.json": "{\"model\": \"cnn\"}",
    });
    if let Some(uri) = resume_from {
        data["resume-from"] = json!(uri);
    }
    if let Some(seconds) = interval_seconds {
        data["checkpoint-interval-seconds"] = json!(seconds);
    }
    store
        .create(
            resources::config_maps(),
            Some(NS),
            json!({"metadata": {"name": format!("{name}-config")}, "data": data}),
        )
        .expect("configmap");
    store
        .create(
            resources::jobs(),
            Some(NS),
            json!({
                "metadata": {"name": name, "labels": {"trainyard.dev/job": name}},
                "spec": {
                    "completions": workers,
                    "parallelism": workers,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": {"trainyard.dev/job": name, "trainyard.dev/attempt": "0"}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{
                                "name": "worker",
                                "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                "env": [
                                    {"name": "CHECKPOINT_DIR", "value": dir},
                                    {"name": "CHECKPOINT_FREQUENCY", "value": frequency},
                                    {"name": "RESUME_FROM", "valueFrom": {"configMapKeyRef": {"name": format!("{name}-config"), "key": "resume-from", "optional": true}}},
                                    {"name": "CHECKPOINT_INTERVAL_SECONDS", "valueFrom": {"configMapKeyRef": {"name": format!("{name}-config"), "key": "checkpoint-interval-seconds", "optional": true}}},
                                ],
                            }],
                            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}],
                        },
                    },
                },
            }),
        )
        .expect("job");
}

fn checkpoint_reports(reports: &[Report]) -> Vec<CheckpointReported> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Checkpoint { payload, .. } => Some(payload.clone()),
            Report::Progress { .. } | Report::Utilization { .. } => None,
        })
        .collect()
}

/// Steps from 0 to `until` seconds, one step a second, collecting the reports.
fn run_until(cluster: &mut Cluster, until: u32) -> Vec<Report> {
    (0..=until)
        .flat_map(|t| cluster.step_at(f64::from(t)))
        .collect()
}

fn rank_zero_log(store: &Store, job: &str) -> Vec<String> {
    let (pods, _) = store.list(
        resources::pods(),
        Some(NS),
        &Selector::parse(&format!("batch.kubernetes.io/job-name={job}")).expect("selector"),
        &Selector::default(),
    );
    let pod = pods
        .iter()
        .find(|p| p["metadata"]["labels"][LABEL_WORKER_INDEX] == "0")
        .expect("rank 0");
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    store
        .logs()
        .lines_after(NS, name, 0)
        .into_iter()
        .map(|line| line.text)
        .collect()
}

fn job_phase(store: &Store, job: &str) -> Vec<String> {
    let job = store.get(resources::jobs(), Some(NS), job).expect("job");
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .map(|c| c["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if let Ok(relative) = path.strip_prefix(base) {
                out.push(relative.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn workers_write_checkpoints_with_a_manifest_that_verifies_and_report_how_they_verified() {
    let root = tempfile::tempdir().expect("temp dir");
    let (store, mut cluster) = cluster(root.path(), "");
    job(&store, "v", 2, "/checkpoints", None);
    let reports = run_until(&mut cluster, 45);
    let saved = checkpoint_reports(&reports);
    assert_eq!(
        saved.iter().map(|c| c.uri.as_str()).collect::<Vec<_>>(),
        [1, 2, 3, 4].map(|e| format!("/checkpoints/checkpoint-epoch-{e}")),
        "the URI is the path the worker sees"
    );
    let dir: PathBuf = root
        .path()
        .join("volumes/ml/v/checkpoints/checkpoint-epoch-3");
    assert_eq!(
        files_under(&dir),
        [
            "model/part-0.bin",
            "model/part-1.bin",
            "optimizer.bin",
            "trainer_state.json",
            MANIFEST_FILE,
        ],
        "one shard per rank, nothing left under a temporary name"
    );
    // The manifest, checked here without the simulator's own verifier.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).expect("manifest"))
            .expect("json");
    assert_eq!(manifest["format"], "trainyard.checkpoint/v1");
    assert_eq!(
        (manifest["epoch"].as_u64(), manifest["step"].as_u64()),
        (Some(3), Some(300))
    );
    let mut total = std::fs::metadata(dir.join(MANIFEST_FILE))
        .expect("manifest")
        .len();
    for file in manifest["files"].as_array().expect("files") {
        let data = std::fs::read(dir.join(file["path"].as_str().expect("path"))).expect("file");
        assert_eq!(file["sizeBytes"].as_u64(), Some(data.len() as u64));
        assert_eq!(file["sha256"], format!("{:x}", Sha256::digest(&data)));
        total += data.len() as u64;
    }
    assert!(manifest["metrics"]["loss"].as_f64().is_some());
    let third = &saved[2];
    assert_eq!(
        third.verified_by,
        Some(VerificationMethod::TrainyardManifest)
    );
    assert!(third.checksums_verified);
    assert_eq!(third.size_bytes, total, "the bytes written");
    assert_eq!(
        third.metrics.get("loss").copied(),
        manifest["metrics"]["loss"].as_f64(),
        "the report carries the metrics the manifest records"
    );
    assert!(
        rank_zero_log(&store, "v").iter().any(|l| l
            .starts_with("checkpoint saved: /checkpoints/checkpoint-epoch-3 (epoch 3): 5 files, ")
            && l.ends_with("trainyard-manifest.json verified with SHA-256")),
        "{:?}",
        rank_zero_log(&store, "v")
    );
    assert_eq!(job_phase(&store, "v"), ["SuccessCriteriaMet", "Complete"]);
}

fn saved_epochs(reports: &[Report], job: &str) -> Vec<u32> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Checkpoint {
                training_job,
                payload,
                ..
            } if training_job == job => Some(payload.epoch),
            _ => None,
        })
        .collect()
}

#[test]
fn workers_with_frequency_auto_save_at_the_advised_interval_and_follow_new_advice() {
    let root = tempfile::tempdir().expect("temp dir");
    let (store, mut cluster) = cluster(root.path(), "");
    // 10 s epochs: advice of 20 s at the start means every second epoch.
    job_with(
        &store,
        "advised",
        1,
        "/checkpoints",
        None,
        "auto",
        Some("20"),
    );
    // No advice yet: every epoch, until the command's 30 s.
    job_with(&store, "told", 1, "/checkpoints", None, "auto", None);
    let mut reports: Vec<Report> = (0..=15)
        .flat_map(|t| cluster.step_at(f64::from(t)))
        .collect();
    assert_eq!(saved_epochs(&reports, "told"), [1]);
    let _ = cluster.command(WorkerCommand::CheckpointInterval {
        namespace: NS.to_string(),
        training_job: "told".to_string(),
        seconds: 30.0,
    });
    reports.extend((16..=45).flat_map(|t| cluster.step_at(f64::from(t))));
    assert_eq!(saved_epochs(&reports, "advised"), [2, 4]);
    assert_eq!(saved_epochs(&reports, "told"), [1, 4]);
}

#[test]
fn a_killed_save_leaves_no_manifest_is_reported_unverified_and_the_worker_dies() {
    let root = tempfile::tempdir().expect("temp dir");
    let (store, mut cluster) = cluster(root.path(), ", killedSaveRate: 1.0");
    job(&store, "k", 1, "s3://bucket/ml/k", None);
    let reports = run_until(&mut cluster, 45);
    let saved = checkpoint_reports(&reports);
    assert_eq!(
        saved.len(),
        1,
        "the worker dies in its first save: {saved:?}"
    );
    assert_eq!(saved[0].uri, "s3://bucket/ml/k/checkpoint-epoch-1");
    assert_eq!(
        saved[0].verified_by, None,
        "an incomplete save is not vouched for"
    );
    assert!(!saved[0].checksums_verified);
    let dir = root.path().join("s3/bucket/ml/k/checkpoint-epoch-1");
    assert!(dir.is_dir(), "the save began");
    assert!(!dir.join(MANIFEST_FILE).exists());
    let verified = checkpoints::verify(&dir);
    assert_eq!(
        verified.err().as_deref(),
        Some("no trainyard-manifest.json: the save did not finish")
    );
    assert!(
        files_under(&dir).iter().any(|f| f
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with(".trainyard-tmp."))),
        "the file being written is left cut short under its temporary name: {:?}",
        files_under(&dir)
    );
    let log = rank_zero_log(&store, "k");
    assert!(
        log.iter().any(|l| l
            .starts_with("killed while saving s3://bucket/ml/k/checkpoint-epoch-1 (epoch 1): ")
            && l.ends_with("no trainyard-manifest.json")),
        "{log:?}"
    );
    assert_eq!(
        log.last().map(String::as_str),
        Some("killed: out of memory; exiting with code 137")
    );
    assert_eq!(job_phase(&store, "k"), ["FailureTarget", "Failed"]);
}

#[test]
fn which_saves_are_killed_follows_the_seed_whatever_the_order_of_the_jobs() {
    let outcomes = |names: &[&str]| -> Vec<(String, bool)> {
        let root = tempfile::tempdir().expect("temp dir");
        let (store, mut cluster) = cluster(root.path(), ", killedSaveRate: 0.3");
        for name in names {
            job(&store, name, 1, "/checkpoints", None);
        }
        let mut outcomes: Vec<(String, bool)> = checkpoint_reports(&run_until(&mut cluster, 45))
            .into_iter()
            .map(|c| (c.uri.clone(), c.verified_by.is_none()))
            .collect();
        outcomes.sort();
        outcomes
    };
    let forward = outcomes(&["a", "b", "c", "d", "e", "f"]);
    let backward = outcomes(&["f", "e", "d", "c", "b", "a"]);
    assert_eq!(forward, backward);
    let killed = forward.iter().filter(|(_, killed)| *killed).count();
    assert!(
        killed > 0 && killed < forward.len(),
        "some of the saves are killed: {forward:?}"
    );
}

#[test]
fn retention_for_volumes_deletes_the_listed_checkpoints_inside_checkpoint_dir_only() {
    let root = tempfile::tempdir().expect("temp dir");
    let (store, mut cluster) = cluster(root.path(), "");
    job(&store, "r", 1, "/checkpoints", None);
    run_until(&mut cluster, 25);
    let base = root.path().join("volumes/ml/r");
    let elsewhere = base.join("data/keep-me");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    let by_manager = RetentionApplied {
        delete: vec!["/checkpoints/checkpoint-epoch-1".into()],
        keep: vec!["/checkpoints/checkpoint-epoch-2".into()],
        executor: RetentionExecutor::CheckpointManager,
    };
    assert!(
        cluster.retention(NS, "r", &by_manager).is_empty(),
        "the checkpoint-manager deletes what it can reach itself"
    );
    assert!(base.join("checkpoints/checkpoint-epoch-1").is_dir());
    let by_worker = RetentionApplied {
        delete: vec![
            "/checkpoints/checkpoint-epoch-1".into(),
            "/data/keep-me".into(),
        ],
        keep: vec!["/checkpoints/checkpoint-epoch-2".into()],
        executor: RetentionExecutor::Worker,
    };
    assert_eq!(
        cluster.retention(NS, "r", &by_worker),
        ["/checkpoints/checkpoint-epoch-1"]
    );
    assert!(!base.join("checkpoints/checkpoint-epoch-1").exists());
    assert!(checkpoints::verify(&base.join("checkpoints/checkpoint-epoch-2")).is_ok());
    assert!(
        elsewhere.is_dir(),
        "nothing outside CHECKPOINT_DIR is deleted"
    );
    let log = rank_zero_log(&store, "r");
    assert!(
        log.contains(&"retention: deleted /checkpoints/checkpoint-epoch-1".to_owned()),
        "{log:?}"
    );
    assert!(
        log.contains(
            &"retention: not deleting /data/keep-me: it is outside CHECKPOINT_DIR /checkpoints"
                .to_owned()
        ),
        "{log:?}"
    );
    assert!(
        cluster.retention(NS, "other", &by_worker).is_empty(),
        "a job with no running worker has no reporter to delete anything"
    );
}

#[test]
fn a_resumed_worker_reads_and_verifies_the_checkpoint_resume_from_names() {
    let root = tempfile::tempdir().expect("temp dir");
    let storage = CheckpointStorage::new(root.path());
    let metrics = Default::default();
    let path = storage
        .local_path("s3://bucket/ml/earlier/checkpoint-epoch-2", NS, "s")
        .expect("path");
    let plan = SavePlan {
        epoch: 2,
        step: 200,
        metrics: &metrics,
        workers: 1,
        killed_at: None,
    };
    checkpoints::save(&path, &plan, "2026-12-01T00:00:00Z").expect("saved");
    let (store, mut cluster) = cluster(root.path(), "");
    job(
        &store,
        "s",
        1,
        "s3://bucket/ml/s",
        Some("s3://bucket/ml/earlier/checkpoint-epoch-2"),
    );
    job(
        &store,
        "m",
        1,
        "s3://bucket/ml/m",
        Some("s3://bucket/ml/gone/checkpoint-epoch-3"),
    );
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    assert_eq!(
        rank_zero_log(&store, "s").first().map(String::as_str),
        Some(
            "rank 0/1: training cnn for 4 epochs, resuming from s3://bucket/ml/earlier/checkpoint-epoch-2 at epoch 2 (read RESUME_FROM: trainyard-manifest.json verified, 3 files)"
        )
    );
    assert_eq!(
        rank_zero_log(&store, "m").first().map(String::as_str),
        Some(
            "rank 0/1: training cnn for 4 epochs, resuming from s3://bucket/ml/gone/checkpoint-epoch-3 at epoch 3 (RESUME_FROM is not readable: no trainyard-manifest.json: the save did not finish; starting at the epoch its name says)"
        )
    );
}

/// Keys and sizes under `prefix`, sorted.
async fn list(s3: &impl ObjectStore, prefix: &str) -> Vec<(String, u64)> {
    let mut keys: Vec<(String, u64)> = s3
        .list(Some(&ObjectPath::from(prefix)))
        .map(|meta| {
            let meta = meta.expect("listed");
            (meta.location.to_string(), meta.size)
        })
        .collect()
        .await;
    keys.sort();
    keys
}

#[tokio::test]
async fn the_roots_s3_part_is_listed_read_and_deleted_by_a_real_s3_client() {
    let root = tempfile::tempdir().expect("temp dir");
    let config = ClusterConfig::parse(&format!(
        "nodes: [{{name: n, gpus: 8}}]\ncheckpoints: {{root: {}}}",
        root.path().display()
    ))
    .expect("config");
    let shutdown = CancellationToken::new();
    let simulator = Simulator::start(config, "127.0.0.1:0", None, shutdown.clone())
        .await
        .expect("simulator");
    let storage = CheckpointStorage::new(root.path());
    let metrics = Default::default();
    for (epoch, killed_at) in [(1, None), (2, Some(1))] {
        let plan = SavePlan {
            epoch,
            step: u64::from(epoch) * 100,
            metrics: &metrics,
            workers: 1,
            killed_at,
        };
        let path = storage
            .local_path(&format!("s3://ckpt/ml/j/checkpoint-epoch-{epoch}"), NS, "j")
            .expect("path");
        checkpoints::save(&path, &plan, "2026-12-01T00:00:00Z").expect("saved");
    }
    let s3 = AmazonS3Builder::new()
        .with_endpoint(format!("http://{}/s3", simulator.address))
        .with_allow_http(true)
        .with_bucket_name("ckpt")
        .with_region("us-east-1")
        .with_access_key_id("any")
        .with_secret_access_key("any")
        .build()
        .expect("client");
    let complete = list(&s3, "ml/j/checkpoint-epoch-1").await;
    assert_eq!(
        complete.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [
            "ml/j/checkpoint-epoch-1/model/part-0.bin",
            "ml/j/checkpoint-epoch-1/optimizer.bin",
            "ml/j/checkpoint-epoch-1/trainer_state.json",
            "ml/j/checkpoint-epoch-1/trainyard-manifest.json",
        ]
    );
    let manifest_path = ObjectPath::from("ml/j/checkpoint-epoch-1/trainyard-manifest.json");
    let manifest = s3
        .get(&manifest_path)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("body");
    assert_eq!(
        manifest.as_ref(),
        std::fs::read(
            root.path()
                .join("s3/ckpt/ml/j/checkpoint-epoch-1/trainyard-manifest.json")
        )
        .expect("file")
        .as_slice()
    );
    assert!(
        !list(&s3, "ml/j/checkpoint-epoch-2")
            .await
            .iter()
            .any(|(k, _)| k.ends_with(MANIFEST_FILE)),
        "the killed save has no manifest"
    );
    for (key, _) in &complete {
        s3.delete(&ObjectPath::from(key.as_str()))
            .await
            .expect("deleted");
    }
    assert!(list(&s3, "ml/j/checkpoint-epoch-1").await.is_empty());
    assert!(
        !root.path().join("s3/ckpt/ml/j/checkpoint-epoch-1").exists(),
        "the emptied directories go with the objects"
    );
    assert!(matches!(
        s3.get(&manifest_path).await,
        Err(object_store::Error::NotFound { .. })
    ));
    shutdown.cancel();
    simulator.join().await;
}
