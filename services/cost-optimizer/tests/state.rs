//! The cost-optimizer's saved state against a real nats-server: utilisation
//! reports are saved together rather than one save each, and a restart
//! keeps the last of them (they are saved at shutdown).

mod common;

use common::{CATALOG, eventually, node, payloads, publisher, start_with};
use serde_json::json;
use trainyard_contracts::alerts::GpusIdle;
use trainyard_contracts::cost::{UtilizationReported, WorkerPhase};
use trainyard_contracts::decisions::{AdmissionDecided, WorkerPlacement};
use trainyard_contracts::events::{TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::{Bucket, EntityRef, Service, streams};
use trainyard_cost_optimizer::CostConfig;
use trainyard_runtime::Runtime;
use trainyard_testkit::NatsServer;

/// Messages the service handled, over its consumers and outcomes.
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
        catalog_path: catalog.display().to_string(),
        accounting_interval_seconds: 3600,
        state_save_interval_ms: 3_600_000,
        ..CostConfig::default()
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
    let admission = AdmissionDecided {
        attempt: 0,
        queue: "team-a".into(),
        flavor: "a100".into(),
        node_selector: Default::default(),
        tolerations: Vec::new(),
        placements: vec![WorkerPlacement {
            index: 0,
            node: "spot-1".into(),
            gpus: 4,
        }],
        topology: Default::default(),
    };
    allocator
        .publish(allocator.envelope(entity.clone(), admission))
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
