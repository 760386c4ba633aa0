//! A test cluster: kube-fake-client as the API server (server-side apply, status
//! subresources), a real NATS server, the planner under test, and a driver that
//! plays the Job controller, the kubelet and the watcher (through the watcher's own
//! mapping and publishing code).
// Each test binary uses a different subset of the driver.
#![allow(dead_code)]

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use kube::{Api, ResourceExt};
use planner_core::PlannerConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_contracts::{
    EntityRef, Envelope, Incoming, Payload, Service as TrainyardService, streams,
};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;
use trainyard_watcher::mapping::{ChangeEvent, Watched, WatchedJob, WatchedPod};
use trainyard_watcher::relist::Relist;

pub const NS: &str = "ml";

pub struct Cluster {
    pub nats: NatsServer,
    pub runtime: Runtime,
    pub client: kube::Client,
    /// What the simulated watcher last listed, per kind, so vanished objects are
    /// reported as deleted (the watcher's own relist logic).
    relists: tokio::sync::Mutex<(Relist, Relist, Relist)>,
}

pub async fn start() -> Cluster {
    start_with(|_| {}).await
}

/// A cluster whose planner config `configure` changes from the tests' default.
pub async fn start_with(configure: impl FnOnce(&mut PlannerConfig)) -> Cluster {
    // RUST_LOG=trainyard_planner=debug shows what the planner did when a test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    let nats = NatsServer::start();
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(
        TrainyardService::Planner,
        settings,
        CancellationToken::new(),
    )
    .await
    .expect("runtime");
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<TrainingJob>()
        .with_resource::<trainyard_api::Sweep>()
        .with_status_subresource::<TrainingJob>()
        .with_status_subresource::<Job>()
        .with_status_subresource::<Pod>()
        .build()
        .await
        .expect("fake API server");
    let mut config = PlannerConfig {
        worker_nats_url: nats.url(),
        restart_backoff_initial_seconds: 1,
        restart_backoff_max_seconds: 2,
        stop_grace_period_seconds: 1,
        // Finished jobs leave memory quickly, so tests go through the reload.
        finished_entry_ttl_seconds: 1,
        ..Default::default()
    };
    configure(&mut config);
    trainyard_planner::start(&runtime, config, client.clone()).expect("planner starts");
    Cluster {
        nats,
        runtime,
        client,
        relists: Default::default(),
    }
}

pub use trainyard_testkit::eventually;

impl Cluster {
    /// `trainyard_planner_actions_total` for one action kind.
    pub fn actions(&self, action: &str) -> u64 {
        trainyard_testkit::metric(
            &self.runtime.registry,
            "trainyard_planner_actions_total",
            &[("action", action)],
        ) as u64
    }

    pub fn training_jobs(&self) -> Api<TrainingJob> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn sweeps(&self) -> Api<trainyard_api::Sweep> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), NS)
    }
    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a TrainingJob from an example file (its namespace replaced by `ml`).
    pub async fn create_example(&self, file: &str) -> TrainingJob {
        let path = format!("{}/../../examples/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("example exists");
        let mut job: TrainingJob = yaml_serde::from_str(&text).expect("example parses");
        job.metadata.namespace = Some(NS.to_string());
        self.training_jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create")
    }

    /// Creates a Sweep from an example file (its namespace replaced by `ml`).
    pub async fn create_sweep(&self, file: &str) -> trainyard_api::Sweep {
        let path = format!("{}/../../examples/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("example exists");
        let mut sweep: trainyard_api::Sweep = yaml_serde::from_str(&text).expect("example parses");
        sweep.metadata.namespace = Some(NS.to_string());
        self.sweeps()
            .create(&PostParams::default(), &sweep)
            .await
            .expect("create")
    }

    /// What the watcher publishes on a relist of everything in the cluster now.
    /// Unchanged objects keep their message ids, so JetStream drops the repeats;
    /// objects gone since the last relist are published as deleted.
    pub async fn watch_once(&self) {
        let all = ListParams::default();
        let mut relists = self.relists.lock().await;
        let (tjs, jobs, pods) = &mut *relists;
        let listed = self.training_jobs().list(&all).await.expect("list").items;
        self.publish_relist(tjs, listed).await;
        // Read as the watcher reads them.
        let listed = Api::<WatchedJob>::namespaced(self.client.clone(), NS)
            .list(&all)
            .await
            .expect("list")
            .items;
        self.publish_relist(jobs, listed).await;
        let listed = Api::<WatchedPod>::namespaced(self.client.clone(), NS)
            .list(&all)
            .await
            .expect("list")
            .items;
        self.publish_relist(pods, listed).await;
    }

    async fn publish_relist<K: Watched>(&self, relist: &mut Relist, objects: Vec<K>) {
        let mut changes = relist.on_event::<K>(Event::Init);
        for object in objects {
            changes.extend(relist.on_event(Event::InitApply(object)));
        }
        changes.extend(relist.on_event::<K>(Event::InitDone));
        for change in changes {
            self.publish_change(change).await;
        }
    }

    /// Whether the planner has handled every change event published so far.
    pub async fn events_handled(&self) -> bool {
        let Ok(stream) = self
            .runtime
            .jetstream
            .get_stream(streams::EVENTS.name)
            .await
        else {
            return false;
        };
        for consumer in TrainyardService::Planner.consumers() {
            if consumer.stream.name != streams::EVENTS.name {
                continue;
            }
            match stream.consumer_info(&consumer.durable).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                _ => return false,
            }
        }
        true
    }

    /// Publishes one change event as the watcher does.
    pub async fn publish_change(&self, change: ChangeEvent) {
        trainyard_watcher::adapter::publish(&self.runtime.publisher, change)
            .await
            .expect("send change")
            .stored()
            .await
            .expect("store change");
    }

    /// Publishes a message as another service (or a worker) would.
    pub async fn publish<P: Payload>(&self, name: &str, payload: P) {
        let envelope = Envelope::new("test", EntityRef::new(NS, name, ""), payload);
        self.runtime
            .publisher
            .publish(envelope)
            .await
            .expect("publish");
    }

    pub async fn status_state(&self, name: &str) -> Option<TrainingJobState> {
        self.training_jobs()
            .get(name)
            .await
            .ok()
            .and_then(|j| j.status)
            .and_then(|s| s.state)
    }

    /// Waits until the planner has written `state`, re-running the watcher meanwhile.
    pub async fn wait_for_state(&self, name: &str, state: TrainingJobState) -> TrainingJob {
        eventually(&format!("{name} to be {state}"), || async {
            self.watch_once().await;
            let job = self.training_jobs().get(name).await.ok()?;
            (job.status.as_ref()?.state == Some(state)).then_some(job)
        })
        .await
    }

    /// Plays the Job controller and kubelet: the Job's pods run.
    pub async fn run_workers(
        &self,
        job_name: &str,
        training_job: &str,
        attempt: u32,
        workers: u32,
    ) {
        for index in 0..workers {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{job_name}-{index}"), "namespace": NS,
                             "labels": {"trainyard.dev/job": training_job, "trainyard.dev/attempt": attempt.to_string()},
                             "annotations": {"batch.kubernetes.io/job-completion-index": index.to_string()}},
                "spec": {"nodeName": "gpu-1", "containers": [{"name": "trainer", "image": "x"}]}
            }))
            .expect("pod");
            self.pods()
                .create(&PostParams::default(), &pod)
                .await
                .expect("create pod");
            self.set_pod(job_name, index, json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "trainer", "ready": true, "restartCount": 0, "image": "x",
                                       "imageID": "x", "state": {"running": {}}}]}))
                .await;
        }
        self.set_job_status(
            job_name,
            json!({"active": workers, "ready": workers,
                                             "startTime": "2026-11-21T10:00:00Z"}),
        )
        .await;
    }

    pub async fn set_pod(&self, job_name: &str, index: u32, status: serde_json::Value) {
        self.pods()
            .patch_status(
                &format!("{job_name}-{index}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("pod status");
    }

    /// A worker's container exits with `code`; the Job fails (backoffLimit 0).
    pub async fn fail_worker(&self, job_name: &str, index: u32, code: i32) {
        self.set_pod(job_name, index, json!({"phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "x",
                                   "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]}))
            .await;
        self.set_job_status(job_name, json!({"active": 0, "failed": 1,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}))
            .await;
    }

    /// Every worker succeeds; the Job completes.
    pub async fn complete_workers(&self, job_name: &str, workers: u32) {
        for index in 0..workers {
            self.set_pod(job_name, index, json!({"phase": "Succeeded",
                "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "x",
                                       "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}))
                .await;
        }
        self.set_job_status(
            job_name,
            json!({"active": 0, "ready": 0, "succeeded": workers,
            "completionTime": "2026-11-21T11:00:00Z",
            "conditions": [{"type": "Complete", "status": "True"}]}),
        )
        .await;
    }

    pub async fn set_job_status(&self, job_name: &str, status: serde_json::Value) {
        self.jobs()
            .patch_status(
                job_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("job status");
    }

    pub async fn job_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .jobs()
            .list(&ListParams::default())
            .await
            .expect("list jobs")
            .items
            .iter()
            .map(|j| j.name_any())
            .collect();
        names.sort();
        names
    }

    /// Every message of one stream, in order.
    pub async fn stream_messages(&self, stream: &str) -> Vec<(String, Incoming)> {
        trainyard_testkit::stream_messages(&self.runtime.jetstream, stream, None)
            .await
            .into_iter()
            .filter_map(|m| Some((m.subject, Incoming::decode(&m.payload).ok()?)))
            .collect()
    }

    /// The lifecycle states published for `name`, in order.
    pub async fn transitions(&self, name: &str) -> Vec<TrainingJobState> {
        self.stream_messages(streams::LIFECYCLE.name)
            .await
            .into_iter()
            .filter(|(_, m)| m.header.entity.name == name)
            .filter_map(|(_, m)| {
                m.payload::<trainyard_contracts::lifecycle::TrainingJobTransitioned>()
                    .ok()
            })
            .map(|t| t.to)
            .collect()
    }
}
