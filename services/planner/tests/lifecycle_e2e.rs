//! End to end through a real NATS server and an in-memory API server: a
//! TrainingJob goes Pending → Queued → Initializing → Running → Completed.

mod cluster;

use std::collections::BTreeMap;

use cluster::{NS, eventually};
use kube::ResourceExt;
use trainyard_api::TrainingJobState;
use trainyard_contracts::decisions::{AdmissionDecided, PendingExplained, TolerationSpec};
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{Incoming, streams};

fn admission(workers: u32) -> AdmissionDecided {
    AdmissionDecided {
        attempt: 0,
        queue: "default".into(),
        flavor: "a100".into(),
        node_selector: BTreeMap::from([("nvidia.com/gpu.product".into(), "A100-SXM4-80GB".into())]),
        tolerations: vec![TolerationSpec {
            key: "nvidia.com/gpu".into(),
            operator: "Exists".into(),
            value: None,
            effect: Some("NoSchedule".into()),
        }],
        placements: (0..workers)
            .map(|index| trainyard_contracts::decisions::WorkerPlacement {
                index,
                node: "gpu-1".into(),
                gpus: 2,
            })
            .collect(),
        topology: BTreeMap::new(),
        capacity_type_reopened: false,
    }
}

fn progress(epoch: u32, total: u32, accuracy: f64) -> ProgressReported {
    ProgressReported {
        worker_index: 0,
        attempt: 0,
        epoch,
        total_epochs: Some(total),
        step: u64::from(epoch) * 100,
        metrics: BTreeMap::from([
            ("loss".into(), 1.0 - accuracy),
            ("accuracy".into(), accuracy),
        ]),
    }
}

/// The admitted distributed job's two workers start and report epoch 1.
async fn run_to_running(cluster: &cluster::Cluster, name: &str) {
    cluster
        .wait_for_state(name, TrainingJobState::Initializing)
        .await;
    cluster.run_workers("bert-distributed-a0", name, 0, 2).await;
    cluster.publish(name, progress(1, 3, 0.71)).await;
    cluster
        .wait_for_state(name, TrainingJobState::Running)
        .await;
}

#[tokio::test]
async fn distributed_job_runs_to_completion_and_a_replay_changes_nothing() {
    let cluster = cluster::start().await;
    let tj = cluster.create_example("trainingjob-distributed.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;

    // Created suspended, with its headless Service and ConfigMap.
    let job = eventually("the suspended Job", || async {
        cluster.jobs().get_opt("bert-distributed-a0").await.ok()?
    })
    .await;
    let spec = job.spec.clone().expect("job spec");
    assert_eq!(spec.suspend, Some(true), "created suspended until admitted");
    assert_eq!((spec.parallelism, spec.completions), (Some(2), Some(2)));
    assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
    assert!(
        cluster
            .services()
            .get_opt("bert-distributed-workers")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        cluster
            .config_maps()
            .get_opt("bert-distributed-config")
            .await
            .expect("get")
            .is_some()
    );
    let owner = &job.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("TrainingJob", Some(true))
    );

    cluster
        .publish(
            &name,
            PendingExplained {
                attempt: None,
                queue: "default".into(),
                position: 2,
                flavor: Some("a100".into()),
                gpus_requested: 4,
                gpus_short: 4,
                message: "queue default: needs 4 more GPUs; position 2".into(),
                unschedulable: None,
                pod_policy: None,
            },
        )
        .await;
    let queued = cluster
        .wait_for_state(&name, TrainingJobState::Queued)
        .await;
    let conditions = queued.status.expect("status").conditions;
    assert!(
        conditions
            .iter()
            .any(|c| c.message.as_deref().unwrap_or("").contains("position 2")),
        "the pending reason is readable in status: {conditions:?}"
    );

    // Admission: selector and tolerations injected, Job unsuspended.
    let versions = || async {
        let config_map = cluster.config_maps().get("bert-distributed-config").await;
        let service = cluster.services().get("bert-distributed-workers").await;
        (
            config_map.expect("config map").resource_version(),
            service.expect("service").resource_version(),
        )
    };
    let before_admission = versions().await;
    cluster.publish(&name, admission(2)).await;
    let job = eventually("the admitted Job", || async {
        let job = cluster.jobs().get("bert-distributed-a0").await.ok()?;
        (job.spec.as_ref()?.suspend == Some(false)).then_some(job)
    })
    .await;
    assert_eq!(
        versions().await,
        before_admission,
        "admitting changes the Job only: the ConfigMap and Service are not written again"
    );
    let pod = job.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(
        pod.node_selector
            .expect("selector")
            .get("nvidia.com/gpu.product")
            .map(String::as_str),
        Some("A100-SXM4-80GB")
    );
    assert!(
        pod.tolerations
            .expect("tolerations")
            .iter()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu"))
    );
    run_to_running(&cluster, &name).await;
    // Worker counts alone wait up to `min_status_interval_ms` for a write.
    eventually("2 active workers in status", || async {
        let status = cluster.training_jobs().get(&name).await.ok()?.status?;
        (status.workers.as_ref()?.active == 2).then_some(())
    })
    .await;

    cluster.publish(&name, progress(2, 3, 0.82)).await;
    cluster.publish(&name, progress(3, 3, 0.88)).await;
    let with_epoch = eventually("epoch 3 in status", || async {
        let status = cluster.training_jobs().get(&name).await.ok()?.status?;
        (status.current_epoch == Some(3)).then_some(status)
    })
    .await;
    assert_eq!(with_epoch.metrics.get("accuracy"), Some(&0.88));
    assert_eq!(with_epoch.progress.as_deref(), Some("100%"));

    cluster.complete_workers("bert-distributed-a0", 2).await;
    let done = cluster
        .wait_for_state(&name, TrainingJobState::Completed)
        .await;
    let status = done.status.expect("status");
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert!(status.duration.is_some());
    assert_eq!(status.restart_count, Some(0));
    assert_eq!(status.observed_generation, done.metadata.generation);

    let transitions = eventually("the Completed transition", || async {
        let t = cluster.transitions(&name).await;
        t.contains(&TrainingJobState::Completed).then_some(t)
    })
    .await;
    assert_eq!(
        transitions,
        [
            TrainingJobState::Pending,
            TrainingJobState::Queued,
            TrainingJobState::Initializing,
            TrainingJobState::Running,
            TrainingJobState::Completed
        ]
    );

    // `kubectl describe` tells the story: an Event per transition.
    // Events are sent in the background, so they may land just after the state.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(cluster.client.clone(), NS);
    eventually("an Event per transition", || async {
        let reasons: Vec<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
            .filter_map(|e| e.reason)
            .collect();
        (reasons.len() >= 5).then_some(reasons)
    })
    .await;

    // Replay every input the planner consumed, as new messages: nothing changes.
    // First let the planner release the finished job from memory
    // (`finished_entry_ttl_seconds` is 1 here), so the replay reloads it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let jobs_before = cluster.job_names().await;
    let status_before = cluster
        .training_jobs()
        .get(&name)
        .await
        .expect("get")
        .status;
    for stream in [
        streams::EVENTS.name,
        streams::DECISIONS.name,
        streams::WORKER.name,
    ] {
        for (subject, message) in cluster.stream_messages(stream).await {
            let raw = serde_json::to_vec(&message_json(&message)).expect("json");
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                "Nats-Msg-Id",
                format!("replay-{}", message.header.id).as_str(),
            );
            let published_subject = strip_partition(&subject);
            cluster
                .runtime
                .publisher
                .publish_raw(published_subject, headers, raw.into())
                .await
                .expect("replay");
        }
    }
    let lifecycle_before = cluster.transitions(&name).await.len();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(cluster.job_names().await, jobs_before, "no second Job");
    let status_after = cluster
        .training_jobs()
        .get(&name)
        .await
        .expect("get")
        .status;
    assert_eq!(
        status_after.as_ref().and_then(|s| s.state),
        status_before.as_ref().and_then(|s| s.state)
    );
    assert_eq!(
        cluster.transitions(&name).await.len(),
        lifecycle_before,
        "no transition published again"
    );
    // The finished job's entry was released, so the replay reloads it; the
    // stale copies of the TrainingJob it carries must not make any input fail.
    let dead = trainyard_testkit::stream_messages(
        &cluster.runtime.jetstream,
        streams::DEAD_LETTER.name,
        None,
    )
    .await;
    assert!(
        dead.is_empty(),
        "a replay dead-letters nothing: {} messages",
        dead.len()
    );
    let _ = NS;
}

/// While a job runs, reports that change nothing but progress wait for the
/// next status write (here the one that says Completed) instead of each
/// writing the status.
#[tokio::test]
async fn progress_reports_in_quick_succession_wait_for_the_next_status_write() {
    let cluster = cluster::start_with(|config| config.min_status_interval_ms = 600_000).await;
    let tj = cluster.create_example("trainingjob-distributed.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;
    cluster.publish(&name, admission(2)).await;
    run_to_running(&cluster, &name).await;
    let writes_before = cluster.actions("status");

    cluster.publish(&name, progress(2, 3, 0.82)).await;
    cluster.publish(&name, progress(3, 3, 0.88)).await;
    cluster.complete_workers("bert-distributed-a0", 2).await;
    let done = cluster
        .wait_for_state(&name, TrainingJobState::Completed)
        .await;
    let status = done.status.clone().expect("status");
    assert_eq!(
        status.current_epoch,
        Some(3),
        "the last report went out with Completed"
    );
    assert_eq!(status.metrics.get("accuracy"), Some(&0.88));
    assert_eq!(
        cluster.actions("status") - writes_before,
        1,
        "one status write after Running: the one that says Completed"
    );
    assert!(cluster.actions("status_deferred") >= 2);
}

/// The envelope as JSON again (header fields plus the raw payload).
fn message_json(message: &Incoming) -> serde_json::Value {
    let mut value = serde_json::to_value(&message.header).expect("header");
    value["payload"] = message.raw_payload();
    value
}

/// `trainyard.events.pod.7.ml.x` → `trainyard.events.pod.ml.x`: publish as the original publisher did.
fn strip_partition(subject: &str) -> String {
    let parts: Vec<&str> = subject.split('.').collect();
    if parts.len() == 6 {
        [parts[0], parts[1], parts[2], parts[4], parts[5]].join(".")
    } else {
        subject.to_string()
    }
}
