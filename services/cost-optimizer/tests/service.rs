//! The cost-optimizer against a real nats-server: capacity chosen for a job
//! with `capacityType: any`, cost recorded once it holds GPUs, the metric,
//! budget alerts, and the state kept across a restart.

mod common;

use common::{CATALOG, eventually, node, payloads, publisher, start_with};
use serde_json::json;
use trainyard_contracts::alerts::BudgetThresholdCrossed;
use trainyard_contracts::cost::{CapacityChosen, CapacityType, CostRecorded};
use trainyard_contracts::decisions::{AdmissionDecided, WorkerPlacement};
use trainyard_contracts::events::{TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::{EntityRef, Service, streams};
use trainyard_cost_optimizer::CostConfig;
use trainyard_runtime::Runtime;
use trainyard_testkit::NatsServer;

/// The service with a one-second accounting interval.
async fn start(nats: &NatsServer, catalog: &std::path::Path) -> Runtime {
    start_with(
        nats,
        CostConfig {
            catalog_path: catalog.display().to_string(),
            accounting_interval_seconds: 1,
            ..CostConfig::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chooses_capacity_records_cost_and_alerts_on_budget() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(&catalog, CATALOG).expect("catalog written");
    let runtime = start(&nats, &catalog).await;
    let watcher = publisher(&runtime, Service::Watcher);
    for (name, capacity) in [("spot-1", "spot"), ("od-1", "on-demand")] {
        let entity = EntityRef::new("", name, "");
        watcher
            .publish(watcher.envelope(entity, node(name, capacity)))
            .await
            .expect("node published");
    }
    let queue: TrainingQueueChanged = serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                   "metadata": {"name": "team-a"},
                   "spec": {"flavors": [{"name": "a100", "nominalQuota": 16}],
                            "budget": {"amount": 0.01, "period": "Monthly", "thresholdsPercent": [50, 100]}}}
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
                            "checkpoint": {"enabled": true},
                            "scheduling": {"queue": "team-a", "capacityType": "any", "estimatedRuntimeSeconds": 36000}}}
    }))
    .expect("job");
    let entity = EntityRef::new("ml", "bert", "u1");
    watcher
        .publish(watcher.envelope(entity.clone(), job))
        .await
        .expect("job published");

    let chosen = eventually("a capacity decision", || async {
        payloads::<CapacityChosen>(&runtime, streams::DECISIONS.name)
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(chosen.0.name, "bert");
    assert_eq!(chosen.1.capacity_type, CapacityType::Spot);
    assert!(
        chosen.1.reason.starts_with("spot: saves"),
        "{}",
        chosen.1.reason
    );
    assert_eq!(chosen.1.inputs.gpus, 4);
    assert_eq!(chosen.1.inputs.pool, "A100-SXM4-80GB@zone-a");

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
        capacity_type_reopened: false,
    };
    allocator
        .publish(allocator.envelope(entity.clone(), admission))
        .await
        .expect("admission published");
    let record = eventually("a cost record", || async {
        payloads::<CostRecorded>(&runtime, streams::DECISIONS.name)
            .await
            .into_iter()
            .find(|(_, r)| r.accrued_cost > 0.0)
    })
    .await;
    assert_eq!(record.1.queue, "team-a");
    assert_eq!(record.1.lines[0].capacity_type, "spot");
    assert_eq!(record.1.lines[0].price_per_gpu_hour, 1.5);
    assert!(record.1.estimated_cost.expect("runtime known") > record.1.accrued_cost);

    let alerts = eventually("budget alerts at 50 and 100%", || async {
        let alerts = payloads::<BudgetThresholdCrossed>(&runtime, streams::ALERTS.name).await;
        (alerts.len() >= 2).then_some(alerts)
    })
    .await;
    assert_eq!(alerts[0].1.threshold_percent, 50);
    assert_eq!(alerts[1].1.threshold_percent, 100);
    assert_eq!(alerts[0].1.queue.as_deref(), Some("team-a"));
    assert!(
        trainyard_testkit::metric(
            &runtime.registry,
            "trainyard_cost_dollars_total",
            &[
                ("namespace", "ml"),
                ("queue", "team-a"),
                ("capacity_type", "spot")
            ]
        ) > 0.0
    );
    assert_eq!(
        trainyard_testkit::metric(
            &runtime.registry,
            "trainyard_cost_dollars_total",
            &[("capacity_type", "on-demand")]
        ),
        0.0,
        "the job ran on spot only"
    );
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");

    // After a restart the job is still known: its spend goes on from the saved total.
    let runtime = start(&nats, &catalog).await;
    let before = record.1.accrued_cost;
    eventually("cost accrued on after the restart", || async {
        payloads::<CostRecorded>(&runtime, streams::DECISIONS.name)
            .await
            .into_iter()
            .find(|(_, r)| r.accrued_cost > before * 1.5)
    })
    .await;
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}
