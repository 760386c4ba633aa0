//! Two planner replicas on one NATS and one API server: the standby writes
//! nothing while the active one holds the lease, and takes over (reconciling
//! every TrainingJob) once the active one stops in a rolling restart.

mod cluster;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use planner_core::PlannerConfig;
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJob;
use trainyard_contracts::Service;
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::{eventually, eventually_within, metric};

fn lease_held(runtime: &Runtime) -> f64 {
    metric(
        &runtime.registry,
        "trainyard_lease_held",
        &[("lease", "planner")],
    )
}

fn reconciles(runtime: &Runtime) -> f64 {
    metric(
        &runtime.registry,
        "trainyard_planner_reconciles_total",
        &[("outcome", "ok")],
    )
}

async fn job_names(client: &kube::Client) -> Vec<String> {
    Api::<Job>::namespaced(client.clone(), cluster::NS)
        .list(&ListParams::default())
        .await
        .expect("list jobs")
        .items
        .iter()
        .map(|job| job.name_any())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_planner_writes_nothing_and_takes_over_when_the_active_one_stops() {
    let cluster = cluster::start().await;
    let mut settings = Settings::default();
    settings.nats.url = cluster.nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let standby = Runtime::start(Service::Planner, settings, CancellationToken::new())
        .await
        .expect("runtime");
    let config = PlannerConfig {
        worker_nats_url: cluster.nats.url(),
        ..Default::default()
    };
    trainyard_planner::start(&standby, config, cluster.client.clone()).expect("planner starts");
    eventually("the first planner leads", || async {
        (lease_held(&cluster.runtime) == 1.0).then_some(())
    })
    .await;

    let first = cluster.create_example("trainingjob-simple.yaml").await;
    cluster.watch_once().await;
    eventually("the active planner creates the Job", || async {
        (!cluster.job_names().await.is_empty()).then_some(())
    })
    .await;
    assert_eq!(lease_held(&standby), 0.0);
    assert_eq!(reconciles(&standby), 0.0, "the standby handled nothing");

    // A rolling restart stops the active replica; it releases the lease.
    let cluster::Cluster {
        nats: _nats,
        runtime,
        client,
        ..
    } = cluster;
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");

    // A TrainingJob created while no planner was active: the new active
    // replica's resync reconciles it.
    let mut second: TrainingJob = first.clone();
    second.metadata = Default::default();
    second.metadata.name = Some(format!("{}-after", first.name_any()));
    second.metadata.namespace = Some(cluster::NS.to_string());
    second.status = None;
    Api::<TrainingJob>::namespaced(client.clone(), cluster::NS)
        .create(&PostParams::default(), &second)
        .await
        .expect("create");
    eventually_within(
        "the standby takes over and creates the new job's Job",
        Duration::from_secs(15),
        || async {
            let names = job_names(&client).await;
            (names.len() == 2).then_some(())
        },
    )
    .await;
    assert_eq!(lease_held(&standby), 1.0);
    // Nothing more comes: each TrainingJob has exactly one Job.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(job_names(&client).await.len(), 2);
    standby.shutdown.cancel();
    standby.run_until_shutdown().await.expect("stops");
}
