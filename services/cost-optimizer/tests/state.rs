//! The cost-optimizer's saved state against a real nats-server: a value per
//! job that survives a restart at thousands of jobs and goes when its job is
//! finalized; a state saved whole by earlier releases is moved to such
//! values; utilisation reports are saved together rather than one save each,
//! and a restart keeps the last of them (they are saved at shutdown).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::kv;
use common::{CATALOG, eventually, node, payloads, publisher, runtime, start_with};
use futures::TryStreamExt;
use serde_json::{Value, json};
use trainyard_api::TrainingJobState;
use trainyard_contracts::alerts::GpusIdle;
use trainyard_contracts::cost::{CostRecorded, UtilizationReported, WorkerPhase};
use trainyard_contracts::decisions::{AdmissionDecided, WorkerPlacement};
use trainyard_contracts::events::{TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::{Bucket, EntityRef, Service, streams};
use trainyard_cost_optimizer::CostConfig;
use trainyard_runtime::Runtime;
use trainyard_testkit::NatsServer;

/// The state saved whole by an earlier release: nodes spot-1 and od-1, queue
/// team-a, and ml/bert on 4 GPUs of spot-1 for an hour, checkpointed at
/// 30 min, 6.00 USD charged.
const SAVED_WHOLE: &str = include_str!("fixtures/state-saved-whole.json");

/// A config under which only messages change the state: no accounting run.
fn quiet(catalog: &std::path::Path) -> CostConfig {
    CostConfig {
        catalog_path: catalog.display().to_string(),
        accounting_interval_seconds: 3600,
        ..CostConfig::default()
    }
}

fn bucket(runtime: &Runtime) -> kv::Store {
    runtime
        .bucket(Bucket::Cost)
        .cloned()
        .expect("bucket trainyard_cost")
}

async fn keys(bucket: &kv::Store) -> BTreeSet<String> {
    bucket
        .keys()
        .await
        .expect("keys listed")
        .try_collect()
        .await
        .expect("keys read")
}

async fn value(bucket: &kv::Store, key: &str) -> Option<Value> {
    let bytes = bucket.get(key).await.expect("value read")?;
    Some(serde_json::from_slice(&bytes).expect("JSON value"))
}

/// A `capacityType: any` job of one GPU that checkpoints.
fn any_job(name: &str) -> TrainingJobChanged {
    serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                   "metadata": {"name": name, "namespace": "ml", "uid": name, "generation": 1},
                   "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 1, "gpusPerWorker": 1,
                            "checkpoint": {"enabled": true},
                            "scheduling": {"queue": "team-a", "capacityType": "any",
                                           "estimatedRuntimeSeconds": 36000}}}
    }))
    .expect("job")
}

fn admission(node: &str, gpus: u32) -> AdmissionDecided {
    AdmissionDecided {
        attempt: 0,
        queue: "team-a".into(),
        flavor: "a100".into(),
        node_selector: Default::default(),
        tolerations: Vec::new(),
        placements: vec![WorkerPlacement {
            index: 0,
            node: node.into(),
            gpus,
        }],
        topology: Default::default(),
        capacity_type_reopened: false,
    }
}

async fn publish_nodes(runtime: &Runtime) {
    let watcher = publisher(runtime, Service::Watcher);
    for (name, capacity) in [("spot-1", "spot"), ("od-1", "on-demand")] {
        watcher
            .publish(watcher.envelope(EntityRef::new("", name, ""), node(name, capacity)))
            .await
            .expect("node published");
    }
}

/// Messages the service handled, over its consumers and outcomes.
/// The planner's word that the job `entity` completed.
async fn publish_completed(runtime: &Runtime, entity: EntityRef) {
    let planner = publisher(runtime, Service::Planner);
    let succeeded = TrainingJobTransitioned {
        from: Some(TrainingJobState::Running),
        to: TrainingJobState::Completed,
        reason: "Completed".into(),
        message: String::new(),
        restart_count: 0,
        gpus: 0,
        queue: Some("team-a".into()),
        context: Default::default(),
    };
    planner
        .publish(planner.envelope(entity, succeeded))
        .await
        .expect("transition published");
}

fn handled(runtime: &Runtime) -> f64 {
    trainyard_testkit::metric(&runtime.registry, "trainyard_messages_handled_total", &[])
}

/// Puts to the `trainyard_cost` bucket so far.
async fn state_puts(jetstream: &async_nats::jetstream::Context) -> u64 {
    let mut stream = jetstream
        .get_stream(format!("KV_{}", Bucket::Cost.name()))
        .await
        .expect("the bucket's stream");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn utilisation_reports_are_saved_together_and_a_restart_keeps_the_last_ones() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).expect("catalog written");
    // No accounting run and no timed save while the reports come in.
    let quiet = CostConfig {
        state_save_interval_ms: 3_600_000,
        ..quiet(&catalog)
    };
    let runtime = start_with(&nats, quiet.clone()).await;
    let watcher = publisher(&runtime, Service::Watcher);
    watcher
        .publish(watcher.envelope(EntityRef::new("", "spot-1", ""), node("spot-1", "spot")))
        .await
        .expect("node published");
    let queue: TrainingQueueChanged = serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                   "metadata": {"name": "team-a"},
                   "spec": {"flavors": [{"name": "a100", "nominalQuota": 16}],
                            "idlePolicy": {"windowSeconds": 1, "action": "Alert"}}}
    }))
    .expect("queue");
    watcher
        .publish(watcher.envelope(EntityRef::new("", "team-a", "q1"), queue))
        .await
        .expect("queue published");
    let job: TrainingJobChanged = serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                   "metadata": {"name": "bert", "namespace": "ml", "uid": "u1", "generation": 1},
                   "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 1, "gpusPerWorker": 4,
                            "scheduling": {"queue": "team-a"}}}
    }))
    .expect("job");
    let entity = EntityRef::new("ml", "bert", "u1");
    watcher
        .publish(watcher.envelope(entity.clone(), job))
        .await
        .expect("job published");
    let allocator = publisher(&runtime, Service::GpuAllocator);
    allocator
        .publish(allocator.envelope(entity.clone(), admission("spot-1", 4)))
        .await
        .expect("admission published");
    eventually("node, queue, job and admission handled", || async {
        (handled(&runtime) >= 4.0).then_some(())
    })
    .await;
    // Every other change was saved before its message was acknowledged.
    let puts = state_puts(&runtime.jetstream).await;

    // Busy, then idle: only the last report says the GPUs are idle.
    let reports = 40;
    for i in 0..reports {
        let report = UtilizationReported {
            worker_index: 0,
            attempt: 0,
            gpu_utilization: if i + 1 == reports { 0.03 } else { 0.9 },
            phase: WorkerPhase::Training,
        };
        watcher
            .publish(watcher.envelope(entity.clone(), report))
            .await
            .expect("report published");
    }
    eventually("the reports handled", || async {
        (handled(&runtime) >= 4.0 + f64::from(reports)).then_some(())
    })
    .await;
    assert_eq!(
        state_puts(&runtime.jetstream).await,
        puts,
        "no save for a utilisation report alone"
    );
    let jetstream = runtime.jetstream.clone();
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
    assert_eq!(
        state_puts(&jetstream).await,
        puts + 1,
        "one save at shutdown"
    );

    // After a restart the accounting runs judge the job on the last report
    // and find it idle.
    let runtime = start_with(
        &nats,
        CostConfig {
            accounting_interval_seconds: 1,
            ..quiet
        },
    )
    .await;
    let (alerted, alert) = eventually("an idle alert after the restart", || async {
        payloads::<GpusIdle>(&runtime, streams::ALERTS.name)
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(alerted.name, "bert");
    assert!((alert.utilization_percent - 3.0).abs() < 1e-9);
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}

/// Saved whole, this state is about 2 MB, over NATS's 1 MiB message limit:
/// its save failed and every message that changed it was retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_of_3000_running_jobs_survives_a_restart() {
    const JOBS: usize = 3000;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).expect("catalog written");
    let runtime = start_with(&nats, quiet(&catalog)).await;
    publish_nodes(&runtime).await;
    let watcher = publisher(&runtime, Service::Watcher);
    let allocator = publisher(&runtime, Service::GpuAllocator);
    for i in 0..JOBS {
        let name = format!("job-{i}");
        let entity = EntityRef::new("ml", &name, &name);
        watcher
            .publish(watcher.envelope(entity.clone(), any_job(&name)))
            .await
            .expect("job published");
        allocator
            .publish(allocator.envelope(entity, admission("spot-1", 1)))
            .await
            .expect("admission published");
    }
    trainyard_testkit::eventually_within(
        "every job and admission handled",
        Duration::from_secs(300),
        || async { (handled(&runtime) >= (2 + 2 * JOBS) as f64).then_some(()) },
    )
    .await;
    let store = bucket(&runtime);
    let saved = keys(&store).await;
    assert_eq!(saved.iter().filter(|k| k.starts_with("job.")).count(), JOBS);
    assert!(saved.contains("node.spot-1") && saved.contains("cluster"));
    let job = value(&store, "job.ml/job-7").await.expect("a job's value");
    assert!(
        serde_json::to_vec(&job).expect("encoded").len() < 2048,
        "a job's value stays small: {job}"
    );
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");

    // Restarted, the service charges every job it knew running, with the
    // estimate from its spec.
    let runtime = start_with(
        &nats,
        CostConfig {
            accounting_interval_seconds: 1,
            ..quiet(&catalog)
        },
    )
    .await;
    let charged = trainyard_testkit::eventually_within(
        "a cost record of every job after the restart",
        Duration::from_secs(120),
        || async {
            let charged: BTreeSet<String> =
                payloads::<CostRecorded>(&runtime, streams::DECISIONS.name)
                    .await
                    .into_iter()
                    .filter(|(_, r)| r.accrued_cost > 0.0 && r.estimated_cost.is_some())
                    .map(|(e, _)| e.name)
                    .collect();
            (charged.len() == JOBS).then_some(charged)
        },
    )
    .await;
    assert!(charged.contains("job-0") && charged.contains("job-2999"));
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_keeps_its_value_until_it_is_finalized() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).expect("catalog written");
    let runtime = start_with(&nats, quiet(&catalog)).await;
    publish_nodes(&runtime).await;
    let watcher = publisher(&runtime, Service::Watcher);
    let entity = EntityRef::new("ml", "bert", "u1");
    watcher
        .publish(watcher.envelope(entity.clone(), any_job("bert")))
        .await
        .expect("job published");
    let allocator = publisher(&runtime, Service::GpuAllocator);
    allocator
        .publish(allocator.envelope(entity.clone(), admission("spot-1", 1)))
        .await
        .expect("admission published");
    let store = bucket(&runtime);
    eventually("the job's value", || async {
        value(&store, "job.ml/bert")
            .await
            .filter(|v| !v["job"]["running"].is_null())
    })
    .await;
    publish_completed(&runtime, entity.clone()).await;
    // Finished, it holds no GPUs; its value stays while the TrainingJob does.
    eventually("the finished job's value", || async {
        value(&store, "job.ml/bert")
            .await
            .filter(|v| v["job"]["running"].is_null())
    })
    .await;
    let finalized = TrainingJobFinalized {
        last_state: Some(TrainingJobState::Completed),
    };
    let planner = publisher(&runtime, Service::Planner);
    planner
        .publish(planner.envelope(entity, finalized))
        .await
        .expect("finalization published");
    eventually("no value once finalized", || async {
        (!keys(&store).await.contains("job.ml/bert")).then_some(())
    })
    .await;
    assert_eq!(value(&store, "job.ml/bert").await, None);
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_saved_whole_is_moved_to_a_value_per_job_node_and_queue() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).expect("catalog written");
    let runtime = runtime(&nats).await;
    let store = bucket(&runtime);
    store
        .put("state", SAVED_WHOLE.as_bytes().to_vec().into())
        .await
        .expect("state saved whole");
    trainyard_cost_optimizer::start(&runtime, quiet(&catalog))
        .await
        .expect("cost-optimizer starts");
    eventually("the state moved", || async {
        let saved = keys(&store).await;
        (!saved.contains("state")).then_some(())
    })
    .await;
    assert_eq!(
        keys(&store).await,
        BTreeSet::from(
            [
                "cluster",
                "job.ml/bert",
                "node.od-1",
                "node.spot-1",
                "queue.team-a"
            ]
            .map(String::from)
        )
    );
    // The accounting run at start charged the days since the fixture's save.
    let job = value(&store, "job.ml/bert").await.expect("the job's value");
    let accrued = job["job"]["accrued"].as_f64().expect("accrued");
    assert!(accrued >= 6.0, "{job}");
    assert_eq!(job["job"]["facts"]["chosen"], json!("spot"));
    assert_eq!(job["job"]["facts"]["checkpointed_hours"], json!(0.5));
    assert_eq!(
        job["job"]["running"]["holdings"][0]["node"],
        json!("spot-1")
    );

    // It goes on from there: finished, the job's last record carries what
    // it was charged before.
    publish_completed(&runtime, EntityRef::new("ml", "bert", "u1")).await;
    let (_, record) = eventually("the job's last cost record", || async {
        payloads::<CostRecorded>(&runtime, streams::DECISIONS.name)
            .await
            .into_iter()
            .next()
    })
    .await;
    assert!(record.accrued_cost >= accrued, "{record:?}");
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}
