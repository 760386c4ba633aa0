//! A TrainingQueue's pod policy, end to end on the simulated cluster: a job
//! with a hostPath volume and a job naming a PriorityClass outside the
//! queue's allow-list are never admitted and never get a Job (not even a
//! suspended one); each stays Queued with `Admitted: False`, reason
//! `PodPolicyRefused`, naming the field and the fix, and a Warning Event.
//! A job already running in the queue is left as it was, and nothing is
//! dead-lettered. Submitted over NATS, such a spec is refused before any
//! TrainingJob is created (category `policy_violation`, the field and the
//! fix on the submitter's result subject).

mod common;

use common::*;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, Volume};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use planner_core::{
    CONDITION_ADMITTED, CONDITION_PREEMPTED, PlannerConfig, REASON_POD_POLICY_REFUSED,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::{
    Condition, PodPolicy, SchedulingSpec, TrainingJob, TrainingJobState, TrainingQueue,
    find_condition,
};
use trainyard_contracts::submit::{SubmissionResult, TrainingJobSubmitted};
use trainyard_contracts::{EntityRef, Envelope, Incoming, Service, streams};
use trainyard_runtime::Runtime;
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, eventually, metric};

const NAMESPACE: &str = "ml";

/// The simulated demo cluster, NATS, watcher, planner and gpu-allocator,
/// with the demo queue allowing the PriorityClass `batch` only.
struct Stack {
    kube: Client,
    watcher: Runtime,
    planner: Runtime,
    allocator: Runtime,
    simulator: Simulator,
    shutdown: CancellationToken,
    _nats: NatsServer,
}

impl Stack {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let nats = NatsServer::start();
        let shutdown = CancellationToken::new();
        let client = async_nats::connect(nats.url()).await.expect("nats");
        let simulator = Simulator::start(
            demo_cluster(),
            "127.0.0.1:0",
            Some(client),
            shutdown.clone(),
        )
        .await
        .expect("simulator starts");
        let kube = kube_client(&simulator, None).await;
        let watcher = start_watcher(&nats, &shutdown, &kube).await;
        let planner = runtime(Service::Planner, &nats, &shutdown).await;
        let planner_config = PlannerConfig {
            worker_nats_url: nats.url(),
            ..Default::default()
        };
        trainyard_planner::start(&planner, planner_config, kube.clone()).expect("planner starts");
        let allocator = runtime(Service::GpuAllocator, &nats, &shutdown).await;
        trainyard_gpu_allocator::start(&allocator, Default::default())
            .await
            .expect("allocator starts");

        let mut queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
        queue.spec.pod_policy = Some(PodPolicy {
            allowed_priority_classes: Some(vec!["batch".into()]),
            ..PodPolicy::default()
        });
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

    /// Creates the example two-worker job as `name`, changed by `edit`; long
    /// enough to run all through the test.
    async fn create_job(&self, name: &str, edit: impl FnOnce(&mut TrainingJob)) {
        let mut job: TrainingJob = manifest("examples/trainingjob-simple.yaml");
        job.metadata.name = Some(name.into());
        job.metadata.namespace = Some(NAMESPACE.into());
        if let Some(hyperparameters) = job.spec.hyperparameters.as_mut() {
            hyperparameters.epochs = Some(100_000);
        }
        edit(&mut job);
        Api::<TrainingJob>::namespaced(self.kube.clone(), NAMESPACE)
            .create(&PostParams::default(), &job)
            .await
            .expect("job created");
    }

    async fn job(&self, name: &str) -> Option<TrainingJob> {
        Api::<TrainingJob>::namespaced(self.kube.clone(), NAMESPACE)
            .get(name)
            .await
            .ok()
    }

    /// The job's `Admitted` condition once its queue's pod policy refused it.
    async fn refused(&self, name: &str) -> Condition {
        eventually(
            &format!("{name} to be refused by the pod policy"),
            || async {
                let status = self.job(name).await?.status?;
                let admitted = find_condition(&status.conditions, CONDITION_ADMITTED)?;
                (admitted.reason.as_deref() == Some(REASON_POD_POLICY_REFUSED)
                    && status.state == Some(TrainingJobState::Queued))
                .then(|| admitted.clone())
            },
        )
        .await
    }

    /// Names of the Jobs in the namespace.
    async fn jobs(&self) -> Vec<String> {
        Api::<Job>::namespaced(self.kube.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .expect("Jobs listed")
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect()
    }

    /// Only the planner's `refused` submissions were dead-lettered; then
    /// everything stops.
    async fn stop(self, refused: u64) {
        // The submitter hears its result before the planner dead-letters the
        // submission: wait for the count before comparing it.
        eventually("the planner's dead letters", || async {
            (metric(&self.planner.registry, "trainyard_dead_letters_total", &[]) >= refused as f64)
                .then_some(())
        })
        .await;
        for (runtime, expected) in [
            (&self.planner, refused),
            (&self.allocator, 0),
            (&self.watcher, 0),
        ] {
            assert_eq!(
                metric(&runtime.registry, "trainyard_dead_letters_total", &[]),
                expected as f64,
                "{} dead-lettered {expected}",
                runtime.service.name()
            );
        }
        let mut dead_letters = self
            .planner
            .jetstream
            .get_stream(streams::DEAD_LETTER.name)
            .await
            .expect("stream");
        assert_eq!(
            dead_letters.info().await.expect("info").state.messages,
            refused
        );
        self.shutdown.cancel();
        self.simulator.join().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_and_a_priority_class_outside_the_allow_list_get_no_job_and_a_clear_refusal() {
    let stack = Stack::start().await;
    stack.create_job("victim", |_| {}).await;
    eventually("the victim to run", || async {
        let state = stack.job("victim").await?.status?.state?;
        (state == TrainingJobState::Running).then_some(())
    })
    .await;
    let victim_jobs = stack.jobs().await;
    assert_eq!(victim_jobs, ["victim-a0"]);

    stack
        .create_job("host-path", |job| {
            job.spec.volumes = vec![Volume {
                name: "host".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/".into(),
                    ..HostPathVolumeSource::default()
                }),
                ..Volume::default()
            }];
        })
        .await;
    stack
        .create_job("critical", |job| {
            job.spec.scheduling = Some(SchedulingSpec {
                priority: Some("system-cluster-critical".into()),
                ..SchedulingSpec::default()
            });
        })
        .await;

    let host_path = stack.refused("host-path").await;
    let message = host_path.message.unwrap_or_default();
    assert!(
        message.contains("spec.volumes[0].hostPath: TrainingQueue default does not allow hostPath volumes")
            && message.contains("remove spec.volumes[0].hostPath, or name a queue whose podPolicy.allowedVolumeTypes lists hostPath"),
        "{message}"
    );
    let critical = stack.refused("critical").await;
    let message = critical.message.unwrap_or_default();
    assert!(
        message.contains(
            "spec.scheduling.priority: TrainingQueue default does not allow PriorityClass system-cluster-critical (spec.podPolicy.allowedPriorityClasses: batch)"
        ),
        "{message}"
    );

    let events = Api::<Event>::namespaced(stack.kube.clone(), NAMESPACE);
    eventually("a Warning Event for each refused job", || async {
        let listed = events.list(&ListParams::default()).await.ok()?;
        let warned = |name: &str| {
            listed.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some(REASON_POD_POLICY_REFUSED)
            })
        };
        (warned("host-path") && warned("critical")).then_some(())
    })
    .await;

    // Neither refused job ever had a Job, and the victim runs on as it was.
    assert_eq!(stack.jobs().await, victim_jobs);
    let victim = stack
        .job("victim")
        .await
        .expect("victim")
        .status
        .expect("status");
    assert_eq!(victim.state, Some(TrainingJobState::Running));
    assert_eq!(victim.restart_count.unwrap_or(0), 0);
    assert!(find_condition(&victim.conditions, CONDITION_PREEMPTED).is_none());
    stack.stop(0).await;
}

/// Publishes a submission of `spec` as `ml/<name>` and returns the answer.
async fn submit(
    stack: &Stack,
    results: &mut async_nats::Subscriber,
    name: &str,
    spec: serde_json::Value,
) -> SubmissionResult {
    let submitted = TrainingJobSubmitted {
        labels: Default::default(),
        annotations: Default::default(),
        spec: serde_json::from_value(spec).expect("a spec"),
    };
    stack
        .planner
        .publisher
        .publish(Envelope::new(
            "external",
            EntityRef::new(NAMESPACE, name, ""),
            submitted,
        ))
        .await
        .expect("stored");
    // Bounded so that a lost answer fails the test instead of hanging it.
    let message = tokio::time::timeout(std::time::Duration::from_secs(60), results.next())
        .await
        .expect("an answer within 60 s")
        .expect("subscription open");
    Incoming::decode(&message.payload)
        .expect("an envelope")
        .payload()
        .expect("a submission result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_the_queue_refuses_creates_no_trainingjob_and_names_the_field() {
    let stack = Stack::start().await;
    let mut results = stack
        .planner
        .client
        .subscribe("trainyard.submit.result.>")
        .await
        .expect("subscribe to results");
    // The queue is read at submission: wait until the stored one has its policy.
    eventually("the queue's pod policy to be stored", || async {
        let queue = Api::<TrainingQueue>::all(stack.kube.clone())
            .get("default")
            .await
            .ok()?;
        queue.spec.pod_policy.map(|_| ())
    })
    .await;

    let host_path = submit(
        &stack,
        &mut results,
        "host-path",
        json!({
            "model": "cnn", "dataset": "mnist", "numWorkers": 1,
            "volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}],
        }),
    )
    .await;
    assert!(!host_path.accepted);
    assert_eq!(host_path.category.as_deref(), Some("policy_violation"));
    assert_eq!(host_path.errors[0].field, "spec.volumes[0].hostPath");
    assert_eq!(
        host_path.errors[0].message,
        "TrainingQueue default's spec.podPolicy does not allow hostPath volumes: remove spec.volumes[0].hostPath, or submit to a queue that allows it"
    );
    let critical = submit(
        &stack,
        &mut results,
        "critical",
        json!({
            "model": "cnn", "dataset": "mnist", "numWorkers": 1,
            "scheduling": {"priority": "system-cluster-critical"},
        }),
    )
    .await;
    assert_eq!(critical.category.as_deref(), Some("policy_violation"));
    assert_eq!(critical.errors[0].field, "spec.scheduling.priority");

    let training_jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("TrainingJobs listed")
        .items;
    assert!(training_jobs.is_empty(), "{training_jobs:?}");
    assert!(stack.jobs().await.is_empty());
    stack.stop(2).await;
}
