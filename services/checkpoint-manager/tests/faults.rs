//! Fault injection on both storage kinds: workers killed at a random point of
//! their save, on a real S3-compatible server (moto) and on a volume. The
//! invariants: no resume point is ever an incomplete checkpoint, and no
//! retention decision deletes the newest verified, the best or a pinned one.
//!
//! `CHECKPOINT_FAULT_SAVES` sets the saves per storage kind (default 60; the
//! 1,000-save run is `CHECKPOINT_FAULT_SAVES=1000`).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use rand::{Rng, SeedableRng};
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_checkpoint_manager::ManagerConfig;
use trainyard_contracts::decisions::{CheckpointVerified, ResumePointChosen, RetentionApplied};
use trainyard_testkit::NatsServer;

const BUCKET: &str = "ckpt";
const PINNED: u64 = 300;

fn saves() -> u64 {
    std::env::var("CHECKPOINT_FAULT_SAVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn settings(moto: &Moto) -> ManagerConfig {
    ManagerConfig {
        storage: moto.storage(),
        ..ManagerConfig::default()
    }
}

fn retention() -> serde_json::Value {
    json!({"keepLast": 2, "keepBest": {"metric": "loss", "mode": "min"}, "pinnedSteps": [PINNED]})
}

/// Saves `count` checkpoints through `write`, each cut short at a random
/// file with probability 1/3, with a failure every tenth save; returns the
/// steps whose saves completed.
async fn run_saves<W, Fut>(
    driver: &Driver,
    job: &str,
    base: &str,
    count: u64,
    mut write: W,
) -> BTreeSet<u64>
where
    W: FnMut(String, Vec<(String, Vec<u8>)>, Option<usize>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let mut complete = BTreeSet::new();
    for index in 1..=count {
        let step = index * 100;
        let loss = rng.random_range(0.0..1.0);
        let (mut files, manifest) = checkpoint_files(step, loss, 256);
        files.push(("trainyard-manifest.json".to_string(), manifest));
        // Killed before writing file `cut` (the manifest is always last).
        let cut = rng
            .random_bool(1.0 / 3.0)
            .then(|| rng.random_range(0..files.len()));
        if cut.is_none() {
            complete.insert(step);
        }
        let uri = format!("{base}/step-{step}");
        write(uri.clone(), files, cut).await;
        driver.report(job, &uri, step, loss, 1.5).await;
        if index == 1 {
            driver.wait_for::<CheckpointVerified>(job, 1).await;
        }
        if index % 10 == 0 {
            driver
                .transition(
                    job,
                    TrainingJobState::Running,
                    TrainingJobState::Pending,
                    "Restarting",
                )
                .await;
            driver
                .transition(
                    job,
                    TrainingJobState::Initializing,
                    TrainingJobState::Running,
                    "AllWorkersRunning",
                )
                .await;
        }
    }
    complete
}

/// Checks every decision published about `job` against the invariants.
async fn assert_invariants(driver: &Driver, job: &str, saves: u64, complete: &BTreeSet<u64>) {
    let verified = driver
        .wait_for::<CheckpointVerified>(job, saves as usize)
        .await;
    let outcome: BTreeMap<u64, bool> = verified.iter().map(|v| (v.step, v.verified)).collect();
    for (step, ok) in &outcome {
        assert_eq!(*ok, complete.contains(step), "step {step} verified {ok}");
    }
    let resumes = driver.decisions::<ResumePointChosen>(job).await;
    let bad_resumes = resumes
        .iter()
        .filter(|r| !complete.contains(&r.step))
        .count();
    let deletions = driver.decisions::<RetentionApplied>(job).await;
    // What must survive each deletion, replayed from the verification order.
    let mut live: BTreeMap<u64, f64> = BTreeMap::new();
    let mut deleted_protected = 0;
    let mut deletion_iter = deletions.iter();
    for v in verified.iter().filter(|v| v.verified) {
        let loss = v
            .latest_verified
            .as_ref()
            .and_then(|c| c.metrics.get("loss"))
            .copied();
        live.insert(v.step, loss.unwrap_or(f64::MAX));
        let newest = live.keys().next_back().copied();
        let best = live
            .iter()
            .min_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(s, _)| *s);
        if v.count < u32::try_from(live.len()).unwrap_or(u32::MAX) {
            let applied = deletion_iter
                .next()
                .expect("a retention decision for the drop in count");
            for uri in &applied.delete {
                let step: u64 = uri
                    .rsplit('-')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if Some(step) == newest || Some(step) == best || step == PINNED {
                    deleted_protected += 1;
                }
                live.remove(&step);
            }
        }
    }
    eprintln!(
        "{job}: {saves} saves, {} complete, {} incomplete; {} resume points, {bad_resumes} from an incomplete checkpoint; {} checkpoints deleted, {deleted_protected} of them protected",
        complete.len(),
        saves as usize - complete.len(),
        resumes.len(),
        deletions.iter().map(|d| d.delete.len()).sum::<usize>()
    );
    assert_eq!(bad_resumes, 0, "resumed from an incomplete checkpoint");
    assert_eq!(
        deleted_protected, 0,
        "deleted the newest verified, the best or a pinned checkpoint"
    );
    assert!(!deletions.is_empty(), "retention ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_saves_are_never_resumed_and_retention_keeps_what_matters() {
    let moto = Moto::start();
    let nats = NatsServer::start();
    let manager = start_manager(&nats, settings(&moto)).await;
    let driver = Driver::connect(&nats).await;
    let count = saves();

    let s3 = moto.bucket(BUCKET).await;
    driver
        .apply(&training_job(
            "on-s3",
            json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": BUCKET}, "retention": retention()}),
        ))
        .await;
    let complete = run_saves(
        &driver,
        "on-s3",
        &format!("s3://{BUCKET}/{NS}/on-s3"),
        count,
        |uri, files, cut| {
            let s3 = &s3;
            async move {
                let prefix = uri
                    .trim_start_matches(&format!("s3://{BUCKET}/"))
                    .to_string();
                for (index, (path, bytes)) in files.into_iter().enumerate() {
                    if Some(index) == cut {
                        return;
                    }
                    s3.put(
                        &Path::from(format!("{prefix}/{path}")),
                        PutPayload::from(bytes),
                    )
                    .await
                    .expect("put");
                }
            }
        },
    )
    .await;
    assert_invariants(&driver, "on-s3", count, &complete).await;

    // A volume.
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "on-volume",
            json!({"enabled": true, "storage": {"type": "pvc", "claimName": "c", "mountPath": base},
                   "retention": retention()}),
        ))
        .await;
    let complete = run_saves(
        &driver,
        "on-volume",
        &base,
        count,
        |uri, files, cut| async move {
            for (index, (path, bytes)) in files.into_iter().enumerate() {
                if Some(index) == cut {
                    return;
                }
                let target = std::path::Path::new(&uri).join(path);
                std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
                std::fs::write(target, bytes).expect("write");
            }
        },
    )
    .await;
    assert_invariants(&driver, "on-volume", count, &complete).await;
    stop_manager(manager).await;
}
