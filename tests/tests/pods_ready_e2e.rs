//! Pods that are never created, end to end: the simulated API server refuses
//! a TrainingJob's pods (its namespace's GPU ResourceQuota is too small), the
//! Job controller's `FailedCreate` Event reaches the planner through the
//! watcher, and after `pods_ready_timeout_seconds` the planner deletes the
//! attempt's Job, says why in the `PodsReady` condition and a Warning Event,
//! gives the GPUs back to the gpu-allocator and queues again; past the requeue
//! limit the job fails with the cause and the fix. Workers whose image cannot
//! be pulled are named the same way. Nothing is dead-lettered.

mod common;

use common::*;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use planner_core::{
    CONDITION_FAILED, CONDITION_PODS_READY, PlannerConfig, REASON_PODS_NOT_CREATED,
    REASON_PODS_NOT_READY,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::{
    ConditionStatus, TrainingJob, TrainingJobState, TrainingQueue, find_condition,
};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::{Incoming, Payload, Service, streams};
use trainyard_runtime::Runtime;
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, eventually, eventually_within, metric};

/// Every `trainingjob.transitioned` the planner published, in order.
async fn transitions(planner: &Runtime) -> Vec<TrainingJobTransitioned> {
    let stream = planner
        .jetstream
        .get_stream(streams::LIFECYCLE.name)
        .await
        .expect("lifecycle stream");
    let last = stream.cached_info().state.last_sequence;
    let mut found = Vec::new();
    for sequence in 1..=last {
        let Ok(message) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let incoming = Incoming::decode(&message.payload).expect("an envelope");
        if incoming.header.message_type == TrainingJobTransitioned::TYPE {
            found.push(incoming.payload().expect("a transition"));
        }
    }
    found
}

/// The simulated cluster (the demo's, at 600x, without failures, workers
/// whose image is [`MISSING_IMAGE`] never start), NATS, and the watcher,
/// planner and gpu-allocator, with a pods-ready timeout of 2 s, one requeue
/// allowed and a 1 s backoff.
struct Stack {
    kube: Client,
    watcher: Runtime,
    planner: Runtime,
    allocator: Runtime,
    simulator: Simulator,
    shutdown: CancellationToken,
    _nats: NatsServer,
}

/// An image the simulated kubelets can never pull.
const MISSING_IMAGE: &str = "registry.local/trainer:missing";

impl Stack {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let nats = NatsServer::start();
        let shutdown = CancellationToken::new();
        let mut cluster = demo_cluster();
        cluster.workers.unpullable_images = vec![MISSING_IMAGE.into()];
        let client = async_nats::connect(nats.url()).await.expect("nats");
        let simulator = Simulator::start(cluster, "127.0.0.1:0", Some(client), shutdown.clone())
            .await
            .expect("simulator starts");
        let kube = kube_client(&simulator, None).await;

        let watcher = start_watcher(&nats, &shutdown, &kube).await;
        let planner = runtime(Service::Planner, &nats, &shutdown).await;
        let planner_config = PlannerConfig {
            worker_nats_url: nats.url(),
            pods_ready_timeout_seconds: 2,
            pods_ready_requeue_limit: 1,
            restart_backoff_initial_seconds: 1,
            restart_backoff_max_seconds: 1,
            ..Default::default()
        };
        trainyard_planner::start(&planner, planner_config, kube.clone()).expect("planner starts");
        let allocator = runtime(Service::GpuAllocator, &nats, &shutdown).await;
        trainyard_gpu_allocator::start(&allocator, Default::default())
            .await
            .expect("allocator starts");

        let queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
        Api::<TrainingQueue>::all(kube.clone())
            .patch(
                &queue.name_any(),
                &PatchParams::apply("test").force(),
                &Patch::Apply(&queue),
            )
            .await
            .expect("queue applied");
        Stack {
            kube,
            watcher,
            planner,
            allocator,
            simulator,
            shutdown,
            _nats: nats,
        }
    }

    /// The example two-worker job in namespace `ml`, with `image` if given.
    async fn create_job(&self, image: Option<&str>) -> String {
        let mut job: TrainingJob = manifest("examples/trainingjob-simple.yaml");
        job.metadata.namespace = Some("ml".into());
        job.spec.image = image.map(str::to_owned);
        Api::<TrainingJob>::namespaced(self.kube.clone(), "ml")
            .create(&PostParams::default(), &job)
            .await
            .expect("job created");
        job.name_any()
    }

    /// The TrainingJob once it failed.
    async fn failed(&self, name: &str) -> TrainingJob {
        let jobs = Api::<TrainingJob>::namespaced(self.kube.clone(), "ml");
        eventually_within(
            &format!("{name} to fail"),
            Duration::from_secs(60),
            || async {
                let job = jobs.get(name).await.ok()?;
                (job.status.as_ref()?.state? == TrainingJobState::Failed).then_some(job)
            },
        )
        .await
    }

    /// Nothing was dead-lettered; then everything stops.
    async fn stop(self) {
        for runtime in [&self.planner, &self.allocator, &self.watcher] {
            assert_eq!(
                metric(&runtime.registry, "trainyard_dead_letters_total", &[]),
                0.0,
                "{} dead-lettered nothing",
                runtime.service.name()
            );
        }
        let mut dead_letters = self
            .planner
            .jetstream
            .get_stream(streams::DEAD_LETTER.name)
            .await
            .expect("stream");
        assert_eq!(dead_letters.info().await.expect("info").state.messages, 0);
        self.shutdown.cancel();
        self.simulator.join().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_refused_by_a_quota_give_the_gpus_back_requeue_then_fail_with_the_cause() {
    let stack = Stack::start().await;
    let kube = stack.kube.clone();
    // One GPU for the namespace: the second worker of a two-GPU gang is refused.
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpu-quota", "namespace": "ml"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}},
    }))
    .expect("a quota");
    Api::<ResourceQuota>::namespaced(kube.clone(), "ml")
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota created");
    let name = stack.create_job(None).await;
    let failed = stack.failed(&name).await;
    let status = failed.status.expect("status");
    let refusal = "FailedCreate: Error creating: pods \"mnist-training-a1-1-\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=1, limited: requests.nvidia.com/gpu=1";
    let pods_ready = find_condition(&status.conditions, CONDITION_PODS_READY).expect("PodsReady");
    assert_eq!(pods_ready.status, ConditionStatus::False);
    assert_eq!(pods_ready.reason.as_deref(), Some(REASON_PODS_NOT_CREATED));
    assert_eq!(
        pods_ready.message.as_deref(),
        Some(format!("pods of attempt 1 not created within 2s: {refusal}").as_str())
    );
    let failed_condition = find_condition(&status.conditions, CONDITION_FAILED).expect("Failed");
    assert_eq!(
        failed_condition.reason.as_deref(),
        Some(REASON_PODS_NOT_CREATED)
    );
    let message = failed_condition.message.clone().unwrap_or_default();
    assert!(message.contains(refusal), "{message}");
    assert!(
        message.contains("raise the ResourceQuota of namespace ml"),
        "the fix is named: {message}"
    );
    assert_eq!(status.restart_count, Some(1));
    assert_eq!(status.pods_ready_requeues, Some(1));

    // Both attempts' Jobs are gone.
    let children = Api::<Job>::namespaced(kube.clone(), "ml");
    eventually("the attempts' Jobs to be deleted", || async {
        let listed = children
            .list(&ListParams::default().labels(&format!("{}={name}", planner_core::LABEL_JOB)))
            .await
            .ok()?;
        listed.items.is_empty().then_some(())
    })
    .await;

    // The release the gpu-allocator acts on: attempt 0 leaves for attempt 1
    // because its pods were not created; then the job fails.
    let published = transitions(&stack.planner).await;
    let requeue = published
        .iter()
        .find(|t| t.reason == REASON_PODS_NOT_CREATED && t.to == TrainingJobState::Pending)
        .unwrap_or_else(|| panic!("a requeue transition in {published:?}"));
    assert_eq!(requeue.restart_count, 1);
    assert_eq!(requeue.from, Some(TrainingJobState::Initializing));
    assert!(
        requeue
            .message
            .starts_with("pods of attempt 0 not created within 2s: FailedCreate: Error creating: pods \"mnist-training-a0-1-\" is forbidden: exceeded quota: gpu-quota"),
        "{}",
        requeue.message
    );
    assert!(
        published
            .iter()
            .any(|t| t.to == TrainingJobState::Failed && t.reason == REASON_PODS_NOT_CREATED)
    );
    // ... and the allocator holds no GPUs for it any more.
    eventually("the allocator to free the GPUs", || async {
        let allocated = metric(
            &stack.allocator.registry,
            "trainyard_allocator_gpus",
            &[("state", "allocated")],
        );
        (allocated == 0.0).then_some(())
    })
    .await;

    let events = Api::<Event>::namespaced(kube.clone(), "ml");
    eventually("the Warning Event on the TrainingJob", || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        listed
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some(REASON_PODS_NOT_CREATED)
            })
            .then_some(())
    })
    .await;

    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_whose_image_cannot_be_pulled_are_named_and_the_job_fails_with_the_fix() {
    let stack = Stack::start().await;
    let name = stack.create_job(Some(MISSING_IMAGE)).await;
    let failed = stack.failed(&name).await;
    let status = failed.status.expect("status");
    let pods_ready = find_condition(&status.conditions, CONDITION_PODS_READY).expect("PodsReady");
    assert_eq!(pods_ready.reason.as_deref(), Some(REASON_PODS_NOT_READY));
    let message = pods_ready.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("2 of 2 workers of attempt 1 not running within 2s: worker ")
            && message.ends_with(
                ": ImagePullBackOff: Back-off pulling image \"registry.local/trainer:missing\""
            ),
        "{message}"
    );
    let failed_condition = find_condition(&status.conditions, CONDITION_FAILED).expect("Failed");
    assert_eq!(
        failed_condition.reason.as_deref(),
        Some(REASON_PODS_NOT_READY)
    );
    assert!(
        failed_condition
            .message
            .as_deref()
            .is_some_and(|m| m.contains("fix spec.image or the registry's pull secret")),
        "{failed_condition:?}"
    );
    let published = transitions(&stack.planner).await;
    assert!(
        published
            .iter()
            .any(|t| t.reason == REASON_PODS_NOT_READY && t.restart_count == 1),
        "attempt 0 gave its GPUs back: {published:?}"
    );
    stack.stop().await;
}
