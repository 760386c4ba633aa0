//! The cost-optimizer's decisions made visible and carried out, end to end
//! through a real NATS server and an in-memory API server: a job's cost in
//! its status and the suspension of an idle job after a verified checkpoint.
//! A queue's budget: `queue_budget_e2e.rs`.

mod cluster;

use std::collections::BTreeMap;

use chrono::{TimeDelta, Utc};
use cluster::eventually;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_contracts::commands::CheckpointRequested;
use trainyard_contracts::cost::{CapacityChosen, CostLine, CostRecorded, IdleSuspendRequested};
use trainyard_contracts::decisions::{AdmissionDecided, CheckpointVerified};
use trainyard_contracts::streams;

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

/// Creates the simple example and runs attempt 0 until Running.
async fn running_job(cluster: &cluster::Cluster) -> String {
    let tj = cluster.create_example("trainingjob-simple.yaml").await;
    let name = tj.name_any();
    cluster.watch_once().await;
    eventually("attempt 0", || async {
        cluster.jobs().get_opt("mnist-training-a0").await.ok()?
    })
    .await;
    cluster.publish(&name, admitted(0)).await;
    eventually("attempt 0 unsuspended", || async {
        let job = cluster.jobs().get("mnist-training-a0").await.ok()?;
        (job.spec.as_ref()?.suspend == Some(false)).then_some(())
    })
    .await;
    cluster.run_workers("mnist-training-a0", &name, 0, 2).await;
    cluster
        .wait_for_state(&name, TrainingJobState::Running)
        .await;
    name
}

fn cost_record(minute: i64, accrued: f64) -> CostRecorded {
    let start =
        chrono::DateTime::<Utc>::from_timestamp(1_795_000_000 + minute * 60, 0).unwrap_or_default();
    CostRecorded {
        queue: "default".into(),
        period_start: start,
        period_end: start + TimeDelta::minutes(1),
        currency: "USD".into(),
        lines: vec![CostLine {
            node: "gpu-node-1".into(),
            capacity_type: "spot".into(),
            gpu_hours: 2.0 / 60.0,
            price_per_gpu_hour: 1.5,
            cost: 0.05,
        }],
        accrued_cost: accrued,
        estimated_cost: Some(4.5),
    }
}

#[tokio::test]
async fn cost_records_and_the_capacity_choice_reach_the_job_status() {
    let cluster = cluster::start().await;
    let name = running_job(&cluster).await;
    let chosen: CapacityChosen = serde_json::from_value(json!({
        "capacityType": "spot", "reason": "spot: saves 57%", "currency": "USD",
        "spotExpectedCost": 2.0, "onDemandExpectedCost": 4.6, "expectedCost": 2.0,
        "inputs": {"workHours": 1.0, "runtimeSource": "estimate", "gpus": 2, "nodes": 1,
                   "checkpointSaveSeconds": 60.0, "restartSeconds": 360.0,
                   "spotPricePerGpuHour": 1.0, "onDemandPricePerGpuHour": 2.3,
                   "spotReclaimsPerNodeHour": 0.05, "pool": "A100@zone-a", "spotInterruptions": 0}
    }))
    .expect("a capacity choice");
    cluster.publish(&name, chosen).await;
    cluster.publish(&name, cost_record(0, 0.05)).await;
    cluster.publish(&name, cost_record(1, 0.10)).await;
    // A record published twice under different ids counts once.
    cluster.publish(&name, cost_record(1, 0.10)).await;
    let cost = eventually("status.cost", || async {
        let job = cluster.training_jobs().get(&name).await.ok()?;
        let cost = job.status?.cost?;
        (cost.accrued == 0.10 && cost.capacity_type.is_some()).then_some(cost)
    })
    .await;
    assert_eq!(
        cost.gpu_seconds, 240.0,
        "two intervals of 2 GPUs for a minute"
    );
    assert_eq!(cost.estimated, Some(4.5));
    assert_eq!(cost.currency, "USD");
    assert_eq!(cost.capacity_type.as_deref(), Some("spot"));
    assert_eq!(cost.decision.as_deref(), Some("spot: saves 57%"));
}

async fn suspended_reason(cluster: &cluster::Cluster, name: &str) -> Option<String> {
    let job = cluster.training_jobs().get(name).await.ok()?;
    trainyard_api::find_condition(&job.status?.conditions, "Suspended")?
        .reason
        .clone()
}

#[tokio::test]
async fn an_idle_job_is_checkpointed_then_suspended_and_resumes_with_one_patch() {
    let cluster = cluster::start_with(|config| config.stop_grace_period_seconds = 3600).await;
    let name = running_job(&cluster).await;
    cluster
        .publish(
            &name,
            IdleSuspendRequested {
                attempt: 0,
                idle_since: Utc::now() - TimeDelta::minutes(30),
                utilization: 0.02,
                message: "GPUs idle (2% < 5%)".into(),
            },
        )
        .await;
    eventually("a checkpoint request for the idle job", || async {
        let commands = cluster.stream_messages(streams::COMMANDS.name).await;
        commands
            .iter()
            .filter_map(|(_, m)| m.payload::<CheckpointRequested>().ok())
            .find(|c| c.reason.contains("idle"))
    })
    .await;
    eventually("the wait for the checkpoint in the status", || async {
        (suspended_reason(&cluster, &name).await.as_deref() == Some("IdleCheckpointing"))
            .then_some(())
    })
    .await;
    let job = cluster.training_jobs().get(&name).await.expect("get");
    assert_ne!(
        job.spec.suspend,
        Some(true),
        "not suspended before a checkpoint"
    );

    cluster
        .publish(
            &name,
            CheckpointVerified {
                uri: "s3://ckpt/mnist/step-900".into(),
                epoch: 3,
                step: 900,
                verified: true,
                method: None,
                verifier: Some("checkpoint-manager".into()),
                checksums: true,
                reason: None,
                latest_verified: None,
                best: None,
                count: 1,
            },
        )
        .await;
    let suspended = cluster
        .wait_for_state(&name, TrainingJobState::Suspended)
        .await;
    assert_eq!(
        suspended.spec.suspend,
        Some(true),
        "spec.suspend set by the planner"
    );
    let condition =
        trainyard_api::find_condition(&suspended.status.expect("status").conditions, "Suspended")
            .cloned()
            .expect("the Suspended condition");
    assert_eq!(condition.reason.as_deref(), Some("IdleSuspended"));
    let message = condition.message.unwrap_or_default();
    assert!(message.contains("utilisation 2%"), "{message}");
    assert!(message.contains("s3://ckpt/mnist/step-900"), "{message}");
    assert!(
        message.contains("kubectl patch trainingjob mnist-training -n ml"),
        "{message}"
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

    // The one patch the condition names resumes it as a new attempt.
    cluster
        .training_jobs()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .expect("resume");
    eventually("a new attempt after resume", || async {
        cluster.watch_once().await;
        cluster.jobs().get_opt("mnist-training-a1").await.ok()?
    })
    .await;
}
