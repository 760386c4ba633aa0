//! Kubernetes API faults, end to end: the simulated API server answers most
//! write requests (60 %) with 409, 429, 500 or 503 and lets some hang past
//! the planner's call timeout, and a TrainingJob still gets its Job, runs and
//! completes, with nothing dead-lettered on the way.

mod common;

use common::*;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use planner_core::PlannerConfig;
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingQueue};
use trainyard_contracts::{Service, streams};
use trainyard_simulator::faults::{ApiFaultConfig, FAULT_STATUSES};
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, eventually_within, metric};

/// Applies `object` as a user would: again after each faulted answer.
async fn apply_until_accepted<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually_within(
        "the API server to accept the apply",
        Duration::from_secs(60),
        || async {
            api.patch(
                &object.name_any(),
                &PatchParams::apply("test").force(),
                &Patch::Apply(object),
            )
            .await
            .ok()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_api_faults_a_job_still_gets_its_job_and_completes_and_nothing_is_dead_lettered() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let nats = NatsServer::start();
    let shutdown = CancellationToken::new();
    let mut cluster = demo_cluster();
    cluster.api_faults = ApiFaultConfig {
        write_error_rate: 0.6,
        statuses: FAULT_STATUSES.to_vec(),
        write_stall_rate: 0.05,
        stall_seconds: 3.0,
        seed: 7,
        ..ApiFaultConfig::default()
    };
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let simulator = Simulator::start(cluster, "127.0.0.1:0", Some(client), shutdown.clone())
        .await
        .expect("simulator starts");
    let kube = kube_client(&simulator, None).await;

    let watcher = start_watcher(&nats, &shutdown, &kube).await;
    let planner = runtime(Service::Planner, &nats, &shutdown).await;
    let planner_config = PlannerConfig {
        worker_nats_url: nats.url(),
        ..Default::default()
    };
    // A stalled call ends at the timeout, as the planner's own client's do.
    let planner_kube = kube_client(&simulator, Some(Duration::from_secs(1))).await;
    trainyard_planner::start(&planner, planner_config, planner_kube).expect("planner starts");
    let allocator = runtime(Service::GpuAllocator, &nats, &shutdown).await;
    trainyard_gpu_allocator::start(&allocator, Default::default())
        .await
        .expect("allocator starts");

    apply_until_accepted(
        &Api::<TrainingQueue>::all(kube.clone()),
        &manifest("simulator/clusters/demo-queue.yaml"),
    )
    .await;
    let jobs = Api::<TrainingJob>::namespaced(kube.clone(), "ml");
    let mut job: TrainingJob = manifest("examples/trainingjob-simple.yaml");
    job.metadata.namespace = Some("ml".into());
    let name = job.name_any();
    apply_until_accepted(&jobs, &job).await;

    let state = eventually_within(
        &format!("{name} to finish"),
        Duration::from_secs(180),
        || async {
            let state = jobs.get(&name).await.ok()?.status?.state?;
            state.is_terminal().then_some(state)
        },
    )
    .await;
    assert_eq!(state, TrainingJobState::Completed);
    let children = Api::<Job>::namespaced(kube.clone(), "ml")
        .list(&ListParams::default().labels(&format!("{}={name}", planner_core::LABEL_JOB)))
        .await
        .expect("list jobs");
    assert_eq!(
        children.items.len(),
        1,
        "one Job, however often a write failed"
    );

    for runtime in [&planner, &allocator, &watcher] {
        assert_eq!(
            metric(&runtime.registry, "trainyard_dead_letters_total", &[]),
            0.0,
            "{} dead-lettered nothing",
            runtime.service.name()
        );
    }
    let mut dead_letters = planner
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("stream");
    assert_eq!(dead_letters.info().await.expect("info").state.messages, 0);

    let transient = metric(
        &planner.registry,
        "trainyard_messages_handled_total",
        &[("outcome", "transient")],
    );
    assert!(transient > 0.0, "the faults reached the planner");
    shutdown.cancel();
    simulator.join().await;
}
