//! Failure with retry, suspend and resume, and deletion, end to end through a real
//! NATS server and an in-memory API server.

mod cluster;

use std::collections::BTreeMap;

use cluster::eventually;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_contracts::commands::CheckpointRequested;
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::events::Change;
use trainyard_contracts::lifecycle::TrainingJobFinalized;
use trainyard_contracts::{Bucket, streams};
use trainyard_planner::KubeWriter;
use trainyard_planner::kubernetes::FINALIZER;
use trainyard_watcher::mapping::{Watched, WatchedJob};

fn admitted(attempt: u32) -> AdmissionDecided {
    AdmissionDecided {
        attempt,
        queue: "default".into(),
        flavor: "any".into(),
        node_selector: BTreeMap::new(),
        tolerations: vec![],
        placements: vec![],
        topology: BTreeMap::new(),
        capacity_type_reopened: false,
    }
}

async fn unsuspended(cluster: &cluster::Cluster, job: &str) {
    eventually(&format!("{job} unsuspended"), || async {
        let j = cluster.jobs().get(job).await.ok()?;
        (j.spec.as_ref()?.suspend == Some(false)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn retryable_failure_restarts_the_gang_then_a_permanent_one_fails_the_job() {
    let cluster = cluster::start().await;
    // ExitCode policy: signals (128+) are retried, program errors (1-127) are not.
    let tj = cluster.create_example("trainingjob-simple.yaml").await;
    let name = tj.name_any();
    cluster
        .training_jobs()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"failurePolicy": {"restartPolicy": "ExitCode", "backoffLimit": 3}}})),
        )
        .await
        .expect("patch policy");
    cluster.watch_once().await;
    eventually("attempt 0", || async {
        cluster.jobs().get_opt("mnist-training-a0").await.ok()?
    })
    .await;
    cluster.publish(&name, admitted(0)).await;
    unsuspended(&cluster, "mnist-training-a0").await;
    cluster.run_workers("mnist-training-a0", &name, 0, 2).await;
    cluster
        .wait_for_state(&name, TrainingJobState::Running)
        .await;

    // Worker 1 is OOM-killed (137): the whole gang restarts as attempt 1 after backoff.
    cluster.fail_worker("mnist-training-a0", 1, 137).await;
    cluster.watch_once().await;
    let restarted = eventually("attempt 1", || async {
        cluster.watch_once().await;
        cluster.jobs().get_opt("mnist-training-a1").await.ok()?
    })
    .await;
    assert_eq!(
        restarted.spec.expect("spec").suspend,
        Some(true),
        "a new attempt waits for admission again"
    );
    // The whole gang is a new Job; the failed one stays (its pods ended) for `kubectl logs`.
    let failed_gang = cluster
        .jobs()
        .get("mnist-training-a0")
        .await
        .expect("kept for logs");
    assert_eq!(
        failed_gang.spec.expect("spec").backoff_limit,
        Some(0),
        "no worker restarts alone"
    );
    let status = cluster
        .training_jobs()
        .get(&name)
        .await
        .expect("get")
        .status
        .expect("status");
    assert_eq!(status.restart_count, Some(1));

    cluster.publish(&name, admitted(1)).await;
    unsuspended(&cluster, "mnist-training-a1").await;
    cluster.run_workers("mnist-training-a1", &name, 1, 2).await;
    cluster
        .wait_for_state(&name, TrainingJobState::Running)
        .await;

    // Exit code 1 is the program's own error: permanent, Failed at once.
    cluster.fail_worker("mnist-training-a1", 0, 1).await;
    let failed = cluster
        .wait_for_state(&name, TrainingJobState::Failed)
        .await;
    let status = failed.status.expect("status");
    let reason = status.failure_reason.unwrap_or_default();
    assert!(
        reason.contains("exited with code 1"),
        "the exit code is in the message: {reason}"
    );
    assert_eq!(status.restart_count, Some(1));
    assert!(
        cluster
            .jobs()
            .get_opt("mnist-training-a2")
            .await
            .expect("get")
            .is_none(),
        "no retry"
    );
}

async fn suspend(cluster: &cluster::Cluster, name: &str, value: bool) {
    cluster
        .training_jobs()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": value}})),
        )
        .await
        .expect("set spec.suspend");
}

#[tokio::test]
async fn suspend_stops_the_workers_and_resume_starts_a_new_attempt() {
    let cluster = cluster::start().await;
    let tj = cluster.create_example("trainingjob-simple.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;
    eventually("attempt 0", || async {
        cluster.jobs().get_opt("mnist-training-a0").await.ok()?
    })
    .await;
    cluster.publish(&name, admitted(0)).await;
    unsuspended(&cluster, "mnist-training-a0").await;
    cluster.run_workers("mnist-training-a0", &name, 0, 2).await;
    cluster
        .wait_for_state(&name, TrainingJobState::Running)
        .await;

    suspend(&cluster, &name, true).await;
    cluster
        .wait_for_state(&name, TrainingJobState::Suspended)
        .await;
    let commands = cluster.stream_messages(streams::COMMANDS.name).await;
    assert!(
        commands.iter().any(|(_, m)| m.is::<CheckpointRequested>()),
        "workers are told to checkpoint before they stop"
    );
    eventually("the workers' Job gone", || async {
        cluster.watch_once().await;
        cluster
            .jobs()
            .get_opt("mnist-training-a0")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    suspend(&cluster, &name, false).await;
    cluster.watch_once().await;
    eventually("a new attempt after resume", || async {
        cluster.watch_once().await;
        cluster.jobs().get_opt("mnist-training-a1").await.ok()?
    })
    .await;
    // The new attempt's Job is created before the status that says so is written.
    eventually("the job no longer Suspended", || async {
        let state = cluster.training_jobs().get(&name).await.ok()?.status?.state;
        (state.is_some() && state != Some(TrainingJobState::Suspended)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn deletion_publishes_a_final_event_and_forgets_the_job() {
    let cluster = cluster::start().await;
    let tj = cluster.create_example("trainingjob-simple.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;
    eventually("the finalizer", || async {
        let tj = cluster.training_jobs().get(&name).await.ok()?;
        tj.finalizers().iter().any(|f| f == FINALIZER).then_some(())
    })
    .await;
    eventually("attempt 0", || async {
        cluster.jobs().get_opt("mnist-training-a0").await.ok()?
    })
    .await;
    // Read as the watcher reads it, to report its deletion later.
    let attempt: WatchedJob = kube::Api::namespaced(cluster.client.clone(), cluster::NS)
        .get("mnist-training-a0")
        .await
        .expect("get the Job");

    cluster
        .training_jobs()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    cluster.watch_once().await;
    let finalized = eventually("the final lifecycle event", || async {
        cluster
            .stream_messages(streams::LIFECYCLE.name)
            .await
            .into_iter()
            .find(|(_, m)| m.is::<TrainingJobFinalized>())
    })
    .await;
    assert_eq!(finalized.1.header.entity.name, name);
    let state = cluster
        .runtime
        .bucket(Bucket::Planner)
        .expect("bucket")
        .get(format!("ml/{name}"))
        .await;
    assert!(matches!(state, Ok(None)), "the job's planner state is gone");

    // The garbage collector deletes the Job after the TrainingJob is gone, so
    // the Job's last changes come after the job is forgotten (here one that
    // marks it for deletion, as a foreground deletion does; the relist above
    // may already have reported the Job gone). They must not keep the job in
    // the planner's memory.
    let mut marked = attempt;
    marked.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    marked.metadata.resource_version = Some("999999".into());
    cluster
        .publish_change(
            marked
                .to_event(Change::Applied)
                .expect("the Job belongs to the TrainingJob"),
        )
        .await;
    // A stale copy of the TrainingJob itself (a redelivery that outlived it):
    // writing to it finds it gone, which is not an error to retry.
    let mut stale = tj;
    stale.metadata.resource_version = Some("999998".into());
    cluster
        .publish_change(stale.to_event(Change::Applied).expect("a TrainingJob"))
        .await;
    eventually("the planner has handled every change", || async {
        cluster.events_handled().await.then_some(())
    })
    .await;
    eventually("no job left in the planner's memory", || async {
        let held = trainyard_testkit::metric(
            &cluster.runtime.registry,
            "trainyard_planner_jobs_in_memory",
            &[],
        );
        (held == 0.0).then_some(())
    })
    .await;
    let dead = trainyard_testkit::stream_messages(
        &cluster.runtime.jetstream,
        streams::DEAD_LETTER.name,
        None,
    )
    .await;
    assert!(dead.is_empty(), "nothing dead-lettered: {dead:?}");
}

#[tokio::test]
async fn the_finalizer_removes_every_owned_object_then_releases_the_job() {
    let cluster = cluster::start().await;
    let tj = cluster.create_example("trainingjob-simple.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;
    let tj = eventually("the finalizer", || async {
        let tj = cluster.training_jobs().get(&name).await.ok()?;
        tj.finalizers().iter().any(|f| f == FINALIZER).then_some(tj)
    })
    .await;
    eventually("attempt 0", || async {
        cluster.jobs().get_opt("mnist-training-a0").await.ok()?
    })
    .await;

    // The in-memory API server deletes at once instead of honouring finalizers, so
    // the finalizer step runs here directly, as the planner does when it sees
    // metadata.deletionTimestamp. Its patches are read-modify-write, not atomic:
    // a status write of the still running planner can put an old finalizer list
    // back (a real API server refuses new finalizers on an object being
    // deleted), so the step runs again on what is stored until it holds.
    let writer = KubeWriter::new(cluster.client.clone(), "trainyard-planner");
    writer.finalize(&tj).await.expect("finalize");
    eventually("the job released", || async {
        let stored = cluster.training_jobs().get(&name).await.ok()?;
        if !stored.finalizers().iter().any(|f| f == FINALIZER) {
            return Some(());
        }
        writer.finalize(&stored).await.expect("finalize");
        None
    })
    .await;
    assert!(
        cluster
            .jobs()
            .get_opt("mnist-training-a0")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        cluster
            .services()
            .get_opt("mnist-training-workers")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        cluster
            .config_maps()
            .get_opt("mnist-training-config")
            .await
            .expect("get")
            .is_none()
    );
}
