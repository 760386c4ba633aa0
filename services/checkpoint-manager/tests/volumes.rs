//! The checkpoint-manager against a real NATS server and checkpoints on a
//! volume (a temporary directory it reads): verification, the resume point
//! skipping incomplete checkpoints, retention deleting from disk, interval
//! advice, and bad reports refused with the field named.

mod common;

use common::*;
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_checkpoint_manager::{ManagerConfig, StorageSettings};
use trainyard_contracts::decisions::{
    CheckpointIntervalAdvised, CheckpointVerified, ResumePointChosen, RetentionApplied,
    RetentionExecutor,
};
use trainyard_testkit::NatsServer;

fn reading_volumes() -> ManagerConfig {
    ManagerConfig {
        storage: StorageSettings {
            read_volumes: true,
            ..StorageSettings::default()
        },
        ..ManagerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_from_the_newest_verified_and_retention_keeps_what_matters() {
    let nats = NatsServer::start();
    let manager = start_manager(&nats, reading_volumes()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "gpt",
            json!({"enabled": true,
                   "storage": {"type": "pvc", "claimName": "gpt-ckpt", "mountPath": base},
                   "retention": {"keepLast": 2, "keepBest": {"metric": "loss", "mode": "min"}}}),
        ))
        .await;
    driver
        .transition(
            "gpt",
            TrainingJobState::Initializing,
            TrainingJobState::Running,
            "AllWorkersRunning",
        )
        .await;

    // 100 is the best by loss; 400 was cut short; 500 has no marker at all.
    for (step, loss, complete) in [
        (100, 0.1, true),
        (200, 0.5, true),
        (300, 0.4, true),
        (400, 0.3, false),
    ] {
        let dir = volume.path().join(format!("step-{step}"));
        write_volume_checkpoint(&dir, step, loss, complete);
        driver
            .report("gpt", dir.to_str().expect("utf-8"), step, loss, 2.0)
            .await;
        if step == 100 {
            // Reports wait (retried) until the TrainingJob, on another stream, is seen.
            driver.wait_for::<CheckpointVerified>("gpt", 1).await;
        }
    }
    let no_marker = volume.path().join("step-500");
    std::fs::create_dir_all(&no_marker).expect("mkdir");
    std::fs::write(no_marker.join("weights.bin"), b"w").expect("write");
    driver
        .report("gpt", no_marker.to_str().expect("utf-8"), 500, 0.2, 2.0)
        .await;

    let verified = driver.wait_for::<CheckpointVerified>("gpt", 5).await;
    let outcome: Vec<(u64, bool)> = verified.iter().map(|v| (v.step, v.verified)).collect();
    assert_eq!(
        outcome,
        vec![
            (100, true),
            (200, true),
            (300, true),
            (400, false),
            (500, false)
        ]
    );
    assert!(
        verified[3]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("no completion marker"),
        "{:?}",
        verified[3].reason
    );
    let last = verified.last().expect("summary");
    assert_eq!(last.latest_verified.as_ref().map(|c| c.step), Some(300));
    assert_eq!(last.best.as_ref().map(|c| c.step), Some(100));

    // A failure: the next attempt resumes from 300, naming what it skipped.
    driver
        .transition(
            "gpt",
            TrainingJobState::Running,
            TrainingJobState::Pending,
            "Restarting",
        )
        .await;
    let resumes = driver.wait_for::<ResumePointChosen>("gpt", 4).await;
    let restart = resumes
        .iter()
        .find(|r| r.reason == "Restarting")
        .expect("resume on restart");
    assert_eq!(restart.step, 300);
    let skipped: Vec<u64> = restart.skipped.iter().map(|s| s.step).collect();
    assert_eq!(skipped, vec![500, 400]);

    // A newer complete checkpoint: keepLast 2 is 300 and 600, best is 100, so 200 goes.
    let dir = volume.path().join("step-600");
    write_volume_checkpoint(&dir, 600, 0.9, true);
    driver
        .report("gpt", dir.to_str().expect("utf-8"), 600, 0.9, 2.0)
        .await;
    let retention = driver.wait_for::<RetentionApplied>("gpt", 1).await;
    assert_eq!(retention[0].delete, vec![format!("{base}/step-200")]);
    assert_eq!(retention[0].executor, RetentionExecutor::CheckpointManager);
    assert!(
        !volume.path().join("step-200").exists(),
        "deleted from the volume"
    );
    for kept in [100, 300, 400, 500, 600] {
        assert!(
            volume.path().join(format!("step-{kept}")).exists(),
            "step {kept} kept"
        );
    }

    let advice = driver.wait_for::<CheckpointIntervalAdvised>("gpt", 1).await;
    assert!(advice[0].interval_seconds > 0.0 && advice[0].save_seconds > 0.0);
    stop_manager(manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_outside_the_storage_or_contradicting_earlier_ones_are_refused() {
    let nats = NatsServer::start();
    let manager = start_manager(&nats, reading_volumes()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "bert",
            json!({"enabled": true, "storage": {"type": "pvc", "claimName": "c", "mountPath": base}}),
        ))
        .await;
    driver.report("bert", "/etc/step-1", 100, 0.5, 1.0).await;
    // Reports wait (retried) until the TrainingJob, on another stream, is seen.
    driver.wait_for::<CheckpointVerified>("bert", 1).await;
    let dir = volume.path().join("step-1");
    write_volume_checkpoint(&dir, 100, 0.5, true);
    driver
        .report("bert", dir.to_str().expect("utf-8"), 100, 0.5, 1.0)
        .await;
    driver
        .report("bert", dir.to_str().expect("utf-8"), 200, 0.5, 1.0)
        .await;
    let verified = driver.wait_for::<CheckpointVerified>("bert", 3).await;
    let reason = |i: usize| verified[i].reason.clone().unwrap_or_default();
    assert!(
        !verified[0].verified && reason(0).contains("outside the job's checkpoint storage"),
        "{}",
        reason(0)
    );
    assert!(verified[1].verified);
    assert!(
        !verified[2].verified && reason(2).contains("write each checkpoint to its own path"),
        "{}",
        reason(2)
    );
    assert!(
        volume.path().join("step-1").exists(),
        "nothing deleted on a doubtful report"
    );
    stop_manager(manager).await;
}

/// A diverged run reports its checkpoint with a NaN loss: the checkpoint is
/// verified and kept, the NaN ranks nothing, and the manager's saved state
/// still reads back after a restart (retention then deletes it in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reported_with_a_nan_metric_is_kept_across_a_restart() {
    let nats = NatsServer::start();
    let manager = start_manager(&nats, reading_volumes()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "diverged",
            json!({"enabled": true,
                   "storage": {"type": "pvc", "claimName": "d-ckpt", "mountPath": base},
                   "retention": {"keepLast": 1}}),
        ))
        .await;
    let first = volume.path().join("step-100");
    write_volume_checkpoint(&first, 100, 0.1, true);
    driver
        .report(
            "diverged",
            first.to_str().expect("utf-8"),
            100,
            f64::NAN,
            2.0,
        )
        .await;
    let verified = driver.wait_for::<CheckpointVerified>("diverged", 1).await;
    assert!(verified[0].verified, "{:?}", verified[0].reason);
    assert_eq!(
        verified[0].latest_verified.as_ref().map(|c| c.step),
        Some(100)
    );

    stop_manager(manager).await;
    let manager = start_manager(&nats, reading_volumes()).await;
    let second = volume.path().join("step-200");
    write_volume_checkpoint(&second, 200, 0.3, true);
    driver
        .report("diverged", second.to_str().expect("utf-8"), 200, 0.3, 2.0)
        .await;
    let retention = driver.wait_for::<RetentionApplied>("diverged", 1).await;
    assert_eq!(
        retention[0].delete,
        vec![format!("{base}/step-100")],
        "the restarted manager still knows the first checkpoint"
    );
    stop_manager(manager).await;
}

/// Whether `replica` holds the checkpoint-manager's lease.
fn leads(replica: &trainyard_runtime::Runtime) -> bool {
    replica
        .registry
        .gather()
        .iter()
        .filter(|family| family.name() == "trainyard_lease_held")
        .flat_map(|family| family.get_metric())
        .any(|metric| metric.get_gauge().get_value() == 1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_decides_at_a_time_and_the_standby_takes_over_when_it_stops() {
    let nats = NatsServer::start();
    let first = start_manager(&nats, reading_volumes()).await;
    trainyard_testkit::eventually("the first replica to hold the lease", || async {
        leads(&first).then_some(())
    })
    .await;
    let second = start_manager(&nats, reading_volumes()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "t5",
            json!({"enabled": true, "storage": {"type": "pvc", "claimName": "c", "mountPath": base}}),
        ))
        .await;
    let dir = volume.path().join("step-100");
    write_volume_checkpoint(&dir, 100, 0.5, true);
    driver
        .report("t5", dir.to_str().expect("utf-8"), 100, 0.5, 1.0)
        .await;
    driver.wait_for::<CheckpointVerified>("t5", 1).await;
    assert!(!leads(&second), "the second replica stands by");

    // A rolling restart: the holder stops, releasing the lease.
    stop_manager(first).await;
    trainyard_testkit::eventually("the standby to take the lease", || async {
        leads(&second).then_some(())
    })
    .await;
    let dir = volume.path().join("step-200");
    write_volume_checkpoint(&dir, 200, 0.4, true);
    driver
        .report("t5", dir.to_str().expect("utf-8"), 200, 0.4, 1.0)
        .await;
    let verified = driver.wait_for::<CheckpointVerified>("t5", 2).await;
    let last = verified.last().expect("the second verification");
    assert!(last.verified, "{last:?}");
    assert_eq!(
        last.count, 2,
        "the standby carried on from the stored record"
    );
    assert_eq!(last.latest_verified.as_ref().map(|c| c.step), Some(200));
    stop_manager(second).await;
}
