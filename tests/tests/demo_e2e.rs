//! The demo scenario, headless: the simulated cluster of `simulator/clusters/demo.yaml`
//! (clock sped up, no random failures), a real NATS server, and the watcher, planner,
//! gpu-allocator and hpo-tuner running their real code against the simulator's
//! Kubernetes API. The
//! example TrainingJobs and the example Sweep are applied as the demo applies them;
//! every job must complete with its status filled in, and the sweep must finish
//! with a best trial.

mod common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use planner_core::{
    COMPLETION_INDEX_ANNOTATION, LABEL_ATTEMPT, LABEL_JOB, LABEL_ROLE, PlannerConfig, Role,
};
use tokio_util::sync::CancellationToken;
use trainyard_api::{
    QUEUE_ACTIVE, StopPolicy, Sweep, SweepState, TrainingJob, TrainingJobState, TrainingQueue,
    TrainingQueueStatus, find_condition,
};
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::{Incoming, Service, streams};
use trainyard_runtime::Runtime;
use trainyard_simulator::config::{ClusterConfig, NodeScoring};
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, eventually_within};

async fn apply<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        &object.name_any(),
        &PatchParams::apply("demo").force(),
        &Patch::Apply(object),
    )
    .await
    .expect("apply");
}

/// NATS, the simulator, and the watcher, planner, gpu-allocator and
/// hpo-tuner against them.
struct Stack {
    kube: Client,
    allocator: Runtime,
    shutdown: CancellationToken,
    simulator: Simulator,
    _nats: NatsServer,
}

impl Stack {
    async fn start(config: ClusterConfig) -> Stack {
        let _ = tracing_subscriber_init();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let nats = NatsServer::start();
        let shutdown = CancellationToken::new();
        let client = async_nats::connect(nats.url()).await.expect("nats");
        let simulator = Simulator::start(config, "127.0.0.1:0", Some(client), shutdown.clone())
            .await
            .expect("simulator starts");
        // Connect the way the services' binaries do: through the kubeconfig the simulator writes.
        let kube = kube_client(&simulator, None).await;

        let _watcher = start_watcher(&nats, &shutdown, &kube).await;
        let planner = runtime(Service::Planner, &nats, &shutdown).await;
        let planner_config = PlannerConfig {
            worker_nats_url: nats.url(),
            restart_backoff_initial_seconds: 1,
            restart_backoff_max_seconds: 2,
            ..Default::default()
        };
        trainyard_planner::start(&planner, planner_config, kube.clone()).expect("planner starts");
        let allocator = runtime(Service::GpuAllocator, &nats, &shutdown).await;
        trainyard_gpu_allocator::start(&allocator, Default::default())
            .await
            .expect("allocator starts");
        let tuner = runtime(Service::HpoTuner, &nats, &shutdown).await;
        trainyard_hpo_tuner::start(&tuner, Default::default())
            .await
            .expect("tuner starts");
        apply(
            &Api::<TrainingQueue>::all(kube.clone()),
            &manifest("simulator/clusters/demo-queue.yaml"),
        )
        .await;
        Stack {
            kube,
            allocator,
            shutdown,
            simulator,
            _nats: nats,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.simulator.join().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_job_and_the_sweep_complete_on_the_simulated_cluster() {
    let config = demo_cluster();
    // kube-scheduler's default spreads pods over the emptiest nodes; workers
    // must still land where the gpu-allocator placed them.
    assert_eq!(config.scoring, NodeScoring::LeastAllocated);
    let stack = Stack::start(config).await;
    let kube = stack.kube.clone();

    let names = ["simple", "distributed", "resume", "advanced"];
    let jobs = Api::<TrainingJob>::namespaced(kube.clone(), "default");
    for name in names {
        apply(
            &jobs,
            &manifest::<TrainingJob>(&format!("examples/trainingjob-{name}.yaml")),
        )
        .await;
    }
    let sweep: Sweep = manifest("examples/sweep.yaml");
    let sweeps = Api::<Sweep>::namespaced(kube.clone(), &sweep.namespace().unwrap_or_default());
    apply(&sweeps, &sweep).await;

    // The gpu-allocator reports the queue, and the planner writes its status.
    let busy = queue_status(&kube, "the queue to show admitted jobs", |s| {
        s.admitted > 0 && s.usage.iter().any(|u| u.name == "a100-80gb" && u.used > 0)
    })
    .await;
    assert!(busy.observed_generation.is_some(), "{busy:?}");

    let expected: Vec<TrainingJob> = names
        .iter()
        .map(|n| manifest(&format!("examples/trainingjob-{n}.yaml")))
        .collect();
    let finished = eventually_within(
        "every example TrainingJob to finish",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            let expected = expected.clone();
            async move {
                let mut done = Vec::new();
                for job in &expected {
                    let live = jobs.get(&job.name_any()).await.ok()?;
                    let status = live.status.as_ref()?;
                    // Workers' last reports may be folded in just after the end.
                    let settled = status.current_epoch == Some(live.spec.epochs());
                    if !status.state.as_ref()?.is_terminal() || !settled {
                        return None;
                    }
                    done.push(live);
                }
                Some(done)
            }
        },
    )
    .await;
    for job in &finished {
        let name = job.name_any();
        let status = job.status.clone().unwrap_or_default();
        assert_eq!(
            status.state,
            Some(TrainingJobState::Completed),
            "{name}: {status:?}"
        );
        let total = job.spec.epochs();
        assert_eq!(status.total_epochs, Some(total), "{name}");
        assert_eq!(status.progress.as_deref(), Some("100%"), "{name}");
        assert!(
            status.start_time.is_some() && status.completion_time.is_some(),
            "{name}: {status:?}"
        );
        assert!(
            status.metrics.contains_key("loss"),
            "{name} reports metrics: {status:?}"
        );
        let succeeded = status
            .conditions
            .iter()
            .find(|c| c.condition_type == "Succeeded");
        assert!(
            succeeded.is_some_and(|c| c.is_true()),
            "{name}: {:?}",
            status.conditions
        );
        assert!(status.failure_reason.is_none(), "{name}");
        let resumed_at = job
            .spec
            .checkpoint
            .as_ref()
            .and_then(|c| c.resume_from.as_deref())
            .map_or(0, trainyard_simulator::cluster::resume_epoch);
        if job.spec.checkpointing_enabled()
            && total >= resumed_at + job.spec.checkpoint_every_epochs()
        {
            let checkpoint = status.checkpoint.clone().unwrap_or_default();
            assert!(
                checkpoint.latest_epoch.is_some(),
                "{name} checkpointed: {status:?}"
            );
        }
    }
    let sweep = eventually_within("the sweep to finish", Duration::from_secs(120), || {
        let sweeps = sweeps.clone();
        let name = sweep.name_any();
        async move {
            let live = sweeps.get(&name).await.ok()?;
            let state = live.status.as_ref()?.state?;
            matches!(state, SweepState::Completed | SweepState::Failed).then_some(live)
        }
    })
    .await;
    let status = sweep.status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(SweepState::Completed), "{status:?}");
    let best = status.best_trial.expect("a best trial");
    assert!(best.objective_value.is_finite(), "{best:?}");
    assert_workers_ran_where_admitted(&stack.allocator, kube.clone()).await;
    stack.stop().await;
}

/// The node each admission placed each worker on, by (TrainingJob, attempt, index).
async fn planned_nodes(allocator: &Runtime) -> BTreeMap<(String, String, u32), String> {
    let mut planned = BTreeMap::new();
    for message in
        trainyard_testkit::stream_messages(&allocator.jetstream, streams::DECISIONS.name, None)
            .await
    {
        let Ok(incoming) = Incoming::decode(&message.payload) else {
            continue;
        };
        if let Ok(admission) = incoming.payload::<AdmissionDecided>() {
            for placement in admission.placements {
                planned.insert(
                    (
                        incoming.header.entity.name.clone(),
                        admission.attempt.to_string(),
                        placement.index,
                    ),
                    placement.node,
                );
            }
        }
    }
    planned
}

/// Every worker pod of every admitted attempt (the example jobs' and the
/// sweep's trials') was bound to the node its admission placed its index on.
async fn assert_workers_ran_where_admitted(allocator: &Runtime, kube: Client) {
    let planned = planned_nodes(allocator).await;
    let pods = Api::<Pod>::all(kube)
        .list(&ListParams::default().labels(&format!("{LABEL_ROLE}={}", Role::Worker.as_str())))
        .await
        .expect("pods");
    let mut checked = BTreeSet::new();
    for pod in &pods {
        let labels = pod.labels();
        let job = labels.get(LABEL_JOB).cloned().unwrap_or_default();
        let attempt = labels.get(LABEL_ATTEMPT).cloned().unwrap_or_default();
        let index: u32 = pod
            .annotations()
            .get(COMPLETION_INDEX_ANNOTATION)
            .and_then(|i| i.parse().ok())
            .expect("completion index");
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let key = (job, attempt, index);
        assert_eq!(
            planned.get(&key),
            Some(&node),
            "{key:?}: pod {} ran on {node}",
            pod.name_any()
        );
        checked.insert(key);
    }
    assert!(checked.len() >= 8, "bound worker pods checked: {checked:?}");
    // The advanced example's eight workers were planned onto eight nodes:
    // each was gated until given its own.
    let advanced = checked
        .iter()
        .filter(|(job, ..)| job == "advanced-training");
    assert!(advanced.count() >= 8, "{checked:?}");
}

/// A TrainingJob of `workers` x `gpus` in namespace `ml`, from the simple example.
fn training_job(name: &str, workers: u32, gpus: u32) -> TrainingJob {
    let mut job: TrainingJob = manifest("examples/trainingjob-simple.yaml");
    job.metadata.name = Some(name.to_owned());
    job.metadata.namespace = Some("ml".to_owned());
    job.spec.num_workers = workers;
    job.spec.gpus_per_worker = Some(gpus);
    job
}

async fn state_of(jobs: &Api<TrainingJob>, name: &str) -> Option<TrainingJob> {
    let live = jobs.get(name).await.ok()?;
    live.status.as_ref()?.state?;
    Some(live)
}

/// The state TrainingJob `name` ends in.
async fn finish(jobs: &Api<TrainingJob>, name: &str) -> TrainingJobState {
    eventually_within(
        &format!("{name} to finish"),
        Duration::from_secs(60),
        || async move {
            let state = state_of(jobs, name).await?.status?.state?;
            state.is_terminal().then_some(state)
        },
    )
    .await
}

/// The demo cluster's A100 group, two nodes of it.
fn two_a100_nodes() -> ClusterConfig {
    let mut config = demo_cluster();
    config.nodes.retain(|group| group.name == "a100");
    config.nodes[0].count = 2;
    config
}

/// Creates pod `name` in `namespace`, of one `container`, on node a100-0
/// (a pod Trainyard does not manage), and waits until it is bound.
async fn bind_on_a100_0(
    stack: &Stack,
    namespace: &str,
    name: &str,
    container: serde_json::Value,
) -> Api<Pod> {
    let pods = Api::<Pod>::namespaced(stack.kube.clone(), namespace);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "a100-0"},
                 "containers": [container]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    eventually_within(
        &format!("{name} to be bound"),
        Duration::from_secs(30),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await.ok()?;
                (pod.spec?.node_name? == "a100-0").then_some(())
            }
        },
    )
    .await;
    pods
}

/// The status of TrainingQueue `default` once `done` holds for it.
async fn queue_status(
    kube: &Client,
    what: &str,
    done: impl Fn(&TrainingQueueStatus) -> bool,
) -> TrainingQueueStatus {
    let queues = Api::<TrainingQueue>::all(kube.clone());
    eventually_within(what, Duration::from_secs(60), || {
        let queues = queues.clone();
        let done = &done;
        async move {
            let status = queues.get("default").await.ok()?.status?;
            done(&status).then_some(status)
        }
    })
    .await
}

/// The `Admitted` condition's message once TrainingJob `name` waits with a
/// message that contains `says`.
async fn waiting(jobs: &Api<TrainingJob>, name: &str, says: &str) -> String {
    // A drained or preempted job waits only once its checkpoint is reported,
    // or the allocator's 30 s grace is over; a loaded machine needs both.
    eventually_within(&format!("{name} to wait"), Duration::from_secs(90), || {
        let jobs = jobs.clone();
        async move {
            let live = state_of(&jobs, name).await?;
            let status = live.status?;
            let admitted = status
                .conditions
                .iter()
                .find(|c| c.condition_type == "Admitted")?;
            (status.state == Some(TrainingJobState::Queued)
                && admitted.message.as_deref()?.contains(says))
            .then(|| admitted.message.clone().unwrap_or_default())
        }
    })
    .await
}

/// GPUs a pod Trainyard does not manage holds (an inference server here)
/// are not given to training: a job that fits on either of two empty nodes
/// is placed on the one without the server, and a job that needs both
/// waits, GPUs short, until the server is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_other_pods_hold_are_not_given_to_training() {
    let stack = Stack::start(two_a100_nodes()).await;
    let server = serde_json::json!({"name": "server", "image": "vllm/vllm-openai",
                                    "resources": {"limits": {"nvidia.com/gpu": "8"}}});
    let pods = bind_on_a100_0(&stack, "serving", "inference", server).await;

    let jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), "ml");
    apply(&jobs, &training_job("one-node", 2, 4)).await;
    let state = finish(&jobs, "one-node").await;
    assert_eq!(state, TrainingJobState::Completed);
    let planned = planned_nodes(&stack.allocator).await;
    let one_node: Vec<&String> = planned
        .iter()
        .filter(|((job, ..), _)| job == "one-node")
        .map(|(_, node)| node)
        .collect();
    assert_eq!(one_node, ["a100-1", "a100-1"], "{planned:?}");

    apply(&jobs, &training_job("two-nodes", 2, 8)).await;
    let waiting = waiting(&jobs, "two-nodes", "short").await;
    assert!(
        waiting.contains("8 nvidia.com/gpu short")
            && waiting
                .contains("8 nvidia.com/gpu of the flavor held by pods Trainyard does not manage"),
        "{waiting}"
    );
    let waits = queue_status(&stack.kube, "the queue to show the job waiting", |s| {
        s.pending == 1 && s.admitted == 0
    })
    .await;
    let active = find_condition(&waits.conditions, QUEUE_ACTIVE).expect("Active");
    assert!(
        active.is_true() && active.reason.as_deref() == Some("Ready"),
        "{active:?}"
    );
    pods.delete("inference", &Default::default())
        .await
        .expect("server deleted");
    let state = finish(&jobs, "two-nodes").await;
    assert_eq!(state, TrainingJobState::Completed);
    let idle = queue_status(&stack.kube, "the queue to be idle", |s| {
        s.pending == 0 && s.admitted == 0
    })
    .await;
    assert!(idle.usage.iter().all(|u| u.used == 0), "{idle:?}");
    stack.stop().await;
}

/// CPU a pod Trainyard does not manage requests (a data-loading job here)
/// is not given to training either: a gang that needs a worker on each of
/// two nodes waits, naming the CPU, while one of them lacks it, and runs
/// once it is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_other_pods_hold_is_not_given_to_training() {
    let mut config = two_a100_nodes();
    config.nodes[0].cpu = "32".into();
    let stack = Stack::start(config).await;
    let loader = serde_json::json!({"name": "etl", "image": "spark",
                                    "resources": {"requests": {"cpu": "24"}}});
    let pods = bind_on_a100_0(&stack, "data", "etl", loader).await;

    let jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), "ml");
    let mut job = training_job("two-nodes", 2, 8);
    job.spec.resources = Some(
        serde_json::from_value(serde_json::json!({"requests": {"cpu": "16"}})).expect("resources"),
    );
    apply(&jobs, &job).await;
    let waiting = waiting(&jobs, "two-nodes", "short").await;
    assert!(
        waiting.contains(
            "1 fit now; 0 nvidia.com/gpu short; 1 more worker(s) would fit by nvidia.com/gpu \
             but not by the CPU or memory free beside it (cpu 16 per worker)"
        ),
        "{waiting}"
    );
    pods.delete("etl", &Default::default())
        .await
        .expect("loader deleted");
    let state = finish(&jobs, "two-nodes").await;
    assert_eq!(state, TrainingJobState::Completed);
    stack.stop().await;
}

/// A gang kept in one zone by a required pod affinity among its own
/// workers runs on zone-labelled nodes only: kube-scheduler (and the
/// simulator's scheduler) would leave its pods pending on nodes without a
/// zone label, so the gpu-allocator never places it there, even though
/// they are empty and the tightest fit (8 GPUs against the zoned 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_kept_in_one_zone_runs_on_zone_labelled_nodes() {
    let mut config = two_a100_nodes();
    config.nodes[0].gpus = 16;
    let mut bare = config.nodes[0].clone();
    bare.gpus = 8;
    bare.name = "bare".into();
    bare.zone = None;
    bare.nodes_per_rack = None;
    config.nodes.insert(0, bare);
    let stack = Stack::start(config).await;
    let jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), "ml");
    let mut job = training_job("zoned", 2, 4);
    job.spec.scheduling.get_or_insert_default().affinity = Some(
        serde_json::from_value(serde_json::json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"trainyard.dev/job": "zoned"}},
                "topologyKey": "topology.kubernetes.io/zone"}]}}))
        .expect("affinity"),
    );
    apply(&jobs, &job).await;
    assert_eq!(finish(&jobs, "zoned").await, TrainingJobState::Completed);
    let planned = planned_nodes(&stack.allocator).await;
    let nodes: Vec<&String> = planned
        .iter()
        .filter(|((job, ..), _)| job == "zoned")
        .map(|(_, node)| node)
        .collect();
    assert_eq!(nodes.len(), 2, "{planned:?}");
    assert!(nodes.iter().all(|n| n.starts_with("a100-")), "{nodes:?}");
    stack.stop().await;
}

/// A TrainingQueue on hold (`stopPolicy: Hold`) admits nothing: a job in it
/// waits saying so, the queue's status says it is stopped, and once the
/// policy is taken off the job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_hold_keeps_its_jobs_waiting_until_it_is_released() {
    let stack = Stack::start(two_a100_nodes()).await;
    let queues = Api::<TrainingQueue>::all(stack.kube.clone());
    let mut queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
    queue.spec.stop_policy = Some(StopPolicy::Hold);
    apply(&queues, &queue).await;
    // The queue and the job reach the gpu-allocator through separate
    // watches; a job it sees before the hold is admitted, as in Kueue.
    queue_status(&stack.kube, "the queue to say it is stopped", |s| {
        find_condition(&s.conditions, QUEUE_ACTIVE)
            .is_some_and(|c| c.reason.as_deref() == Some("Stopped"))
    })
    .await;

    let jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), "ml");
    apply(&jobs, &training_job("held", 1, 4)).await;
    let message = waiting(&jobs, "held", "on hold").await;
    assert!(message.contains("stopPolicy: Hold"), "{message}");
    let held = queue_status(&stack.kube, "the queue to count the held job", |s| {
        s.pending == 1
    })
    .await;
    assert_eq!(held.admitted, 0);

    queue.spec.stop_policy = None;
    apply(&queues, &queue).await;
    assert_eq!(finish(&jobs, "held").await, TrainingJobState::Completed);
    let active = queue_status(&stack.kube, "the queue to be active again", |s| {
        find_condition(&s.conditions, QUEUE_ACTIVE).is_some_and(|c| c.is_true())
    })
    .await;
    assert_eq!(active.pending, 0);
    stack.stop().await;
}

/// TrainingJob `name` once attempt `attempt` of it runs.
async fn running_attempt(jobs: &Api<TrainingJob>, name: &str, attempt: u32) {
    eventually_within(
        &format!("attempt {attempt} of {name} to run"),
        Duration::from_secs(60),
        || async move {
            let status = state_of(jobs, name).await?.status?;
            (status.state == Some(TrainingJobState::Running)
                && status.restart_count == Some(attempt))
            .then_some(())
        },
    )
    .await;
}

/// A TrainingQueue set to `stopPolicy: HoldAndDrain` stops its running
/// job: the job is told to checkpoint, its attempt ends once it has, and
/// the next attempt waits in line saying the queue drains; once the policy
/// is taken off, it runs again from its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_queue_checkpoints_and_stops_its_job_and_resumes_it_once_released() {
    let stack = Stack::start(two_a100_nodes()).await;
    let queues = Api::<TrainingQueue>::all(stack.kube.clone());
    let mut queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
    let jobs = Api::<TrainingJob>::namespaced(stack.kube.clone(), "ml");
    let mut job = training_job("drained", 1, 4);
    job.spec.hyperparameters.get_or_insert_default().epochs = Some(100_000);
    job.spec.checkpoint = Some(
        serde_json::from_value(serde_json::json!({"enabled": true, "frequency": 100_000,
            "storage": {"type": "s3", "s3Bucket": "ml-checkpoints"}}))
        .expect("checkpoint"),
    );
    apply(&jobs, &job).await;
    running_attempt(&jobs, "drained", 0).await;

    queue.spec.stop_policy = Some(StopPolicy::HoldAndDrain);
    apply(&queues, &queue).await;
    let message = waiting(&jobs, "drained", "stopPolicy: HoldAndDrain").await;
    assert!(message.contains("on hold"), "{message}");
    let status = jobs
        .get("drained")
        .await
        .expect("job")
        .status
        .expect("status");
    let preempted = find_condition(&status.conditions, "Preempted").expect("Preempted");
    assert!(
        preempted
            .message
            .as_deref()
            .is_some_and(|m| m.contains("TrainingQueue default")),
        "{preempted:?}"
    );
    assert!(
        status.checkpoint.and_then(|c| c.latest_epoch).is_some(),
        "it checkpointed before it stopped"
    );
    let drained = queue_status(&stack.kube, "the queue to say it drains", |s| {
        s.pending == 1
            && s.admitted == 0
            && find_condition(&s.conditions, QUEUE_ACTIVE).is_some_and(|c| {
                c.message
                    .as_deref()
                    .is_some_and(|m| m.contains("HoldAndDrain"))
            })
    })
    .await;
    assert!(drained.usage.iter().all(|u| u.used == 0), "{drained:?}");

    queue.spec.stop_policy = None;
    apply(&queues, &queue).await;
    running_attempt(&jobs, "drained", 1).await;
    stack.stop().await;
}

fn tracing_subscriber_init() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init()
}
