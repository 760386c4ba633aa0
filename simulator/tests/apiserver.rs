//! Unmodified kube-rs clients against the simulated API server: the calls Trainyard's
//! watcher and planner make (get, list, create, replace, merge, strategic and apply
//! patches, status writes, deletes, `watcher` and the event `Recorder`) must behave as
//! they do against a real apiserver, and bad requests (among them pod spec changes a
//! real apiserver forbids) must get clear `Status` errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodSchedulingGate};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{
    DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::{Sweep, TrainingJob, TrainingJobState, TrainingJobStatus, TrainingQueue};
use trainyard_simulator::Store;
use trainyard_simulator::apiserver::router;

/// The namespace of the examples, and the client's default namespace.
const NS: &str = "ml-training";
/// Bound on waiting for one watch event (never reached when things work).
const EVENT_DEADLINE: Duration = Duration::from_secs(15);

/// The simulated API server on an ephemeral loopback port, and a client for it.
struct Server {
    client: Client,
    store: Arc<Store>,
    /// Watch requests served so far.
    watches: Arc<AtomicUsize>,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Server {
    async fn start() -> Self {
        Self::start_with(Store::default()).await
    }

    async fn start_with(store: Store) -> Self {
        // kube links rustls; name the crypto provider as the services do.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shutdown = CancellationToken::new();
        let watches = Arc::new(AtomicUsize::new(0));
        let counter = watches.clone();
        let store = Arc::new(store);
        let app = router(store.clone(), shutdown.clone()).layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let counter = counter.clone();
                async move {
                    let watch = request
                        .uri()
                        .query()
                        .is_some_and(|q| q.split('&').any(|pair| pair == "watch=true"));
                    if watch {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    next.run(request).await
                }
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("bound address");
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .expect("the simulated API server runs");
        });
        let url = format!("http://{address}").parse().expect("server url");
        let mut config = kube::Config::new(url);
        config.default_namespace = NS.to_owned();
        let client = Client::try_from(config).expect("kube client");
        Self {
            client,
            store,
            watches,
            shutdown,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    /// A request kube-rs has no typed call for; 4xx/5xx come back as `kube::Error::Api`.
    async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> Result<String, kube::Error> {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(body.as_bytes().to_vec())
            .expect("request");
        self.client.request_text(request).await
    }
}

fn example<K: serde::de::DeserializeOwned>(yaml: &str) -> K {
    yaml_serde::from_str(yaml).expect("the example parses")
}

fn training_job(name: &str) -> TrainingJob {
    let mut job: TrainingJob = example(include_str!("../../examples/trainingjob-simple.yaml"));
    job.metadata.name = Some(name.to_owned());
    job
}

fn pod(name: &str, job: Option<&str>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.to_owned());
    pod.metadata.labels = job.map(|job| [(LABEL_JOB.to_owned(), job.to_owned())].into());
    pod
}

/// The `Status` of a failed call; anything else (a dropped connection after a
/// server panic, a client-side error) fails the test.
fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

fn revision<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .expect("a resourceVersion")
        .parse()
        .expect("resourceVersions are numbers here")
}

/// `Init`, `InitApply(name)`, `Apply(name)`, `Delete(name)`, `InitDone` or the error.
fn describe<K: Resource>(event: &Result<watcher::Event<K>, watcher::Error>) -> String {
    match event {
        Ok(watcher::Event::Init) => "Init".into(),
        Ok(watcher::Event::InitApply(o)) => {
            format!("InitApply({})", o.meta().name.as_deref().unwrap_or("?"))
        }
        Ok(watcher::Event::InitDone) => "InitDone".into(),
        Ok(watcher::Event::Apply(o)) => {
            format!("Apply({})", o.meta().name.as_deref().unwrap_or("?"))
        }
        Ok(watcher::Event::Delete(o)) => {
            format!("Delete({})", o.meta().name.as_deref().unwrap_or("?"))
        }
        Err(err) => format!("Err({err})"),
    }
}

async fn next_event<S, T>(stream: &mut S) -> T
where
    S: Stream<Item = T> + Unpin,
{
    tokio::time::timeout(EVENT_DEADLINE, stream.next())
        .await
        .expect("a watch event within the deadline")
        .expect("the watch stream does not end")
}

/// The next `count` watcher events, described, with their objects' resourceVersions.
async fn next_events<S>(stream: &mut S, count: usize) -> (Vec<String>, Vec<u64>)
where
    S: Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Unpin,
{
    let (mut names, mut revisions) = (Vec::new(), Vec::new());
    for _ in 0..count {
        let event = next_event(stream).await;
        names.push(describe(&event));
        if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = &event {
            revisions.push(revision(o));
        }
    }
    (names, revisions)
}

fn strictly_increasing(revisions: &[u64]) -> bool {
    revisions.windows(2).all(|w| w[0] < w[1])
}

#[tokio::test]
async fn trainyard_crds_round_trip_create_get_list_replace_delete() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let sweeps: Api<Sweep> = server.api();
    let queues: Api<TrainingQueue> = Api::all(server.client.clone());

    let job = training_job("mnist");
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("created");
    assert_eq!(created.spec, job.spec, "the spec survives the round trip");
    assert!(
        created
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| !u.is_empty())
    );
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.metadata.namespace.as_deref(), Some(NS));
    let fetched = jobs.get("mnist").await.expect("get");
    assert_eq!(fetched, created);

    let sweep: Sweep = example(include_str!("../../examples/sweep.yaml"));
    let sweep_created = sweeps
        .create(&PostParams::default(), &sweep)
        .await
        .expect("sweep created");
    assert_eq!(sweep_created.spec, sweep.spec);
    let queue: TrainingQueue = example(include_str!("../../examples/trainingqueue-default.yaml"));
    let queue_created = queues
        .create(&PostParams::default(), &queue)
        .await
        .expect("queue created");
    assert_eq!(queue_created.spec, queue.spec);
    assert_eq!(
        queue_created.metadata.namespace, None,
        "TrainingQueue is cluster-scoped"
    );
    assert_eq!(
        queues.get("default").await.expect("get queue").spec,
        queue.spec
    );

    let other_ns: Api<TrainingJob> = Api::namespaced(server.client.clone(), "elsewhere");
    other_ns
        .create(&PostParams::default(), &training_job("mnist"))
        .await
        .expect("same name, other namespace");
    let names = |list: kube::core::ObjectList<TrainingJob>| {
        list.items
            .iter()
            .map(|j| format!("{}/{}", j.namespace().unwrap_or_default(), j.name_any()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(jobs.list(&ListParams::default()).await.expect("list")),
        ["ml-training/mnist"]
    );
    let all: Api<TrainingJob> = Api::all(server.client.clone());
    assert_eq!(
        names(all.list(&ListParams::default()).await.expect("list all")),
        ["elsewhere/mnist", "ml-training/mnist"]
    );
    let by_name = jobs
        .list(&ListParams::default().fields("metadata.name=nope"))
        .await
        .expect("field selector");
    assert!(by_name.items.is_empty());

    let mut changed = fetched.clone();
    changed.spec.num_workers = 4;
    let replaced = jobs
        .replace("mnist", &PostParams::default(), &changed)
        .await
        .expect("replaced");
    assert_eq!(replaced.spec.num_workers, 4);
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    assert!(revision(&replaced) > revision(&created));

    let deleted = jobs
        .delete("mnist", &DeleteParams::default())
        .await
        .expect("deleted");
    assert!(deleted.is_left(), "the deleted object comes back");
    assert_eq!(api_error(jobs.get("mnist").await).reason, "NotFound");
    assert!(jobs.get_opt("mnist").await.expect("get_opt").is_none());
    assert_eq!(
        api_error(jobs.delete("mnist", &DeleteParams::default()).await).code,
        404
    );
    assert!(
        other_ns.get_opt("mnist").await.expect("get_opt").is_some(),
        "only one namespace's job went"
    );
}

#[tokio::test]
async fn duplicates_are_already_exists_and_stale_writes_are_conflicts() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let missing = api_error(jobs.get("missing").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert!(missing.message.contains("missing"), "{}", missing.message);

    let created = jobs
        .create(&PostParams::default(), &training_job("a"))
        .await
        .expect("created");
    let again = api_error(
        jobs.create(&PostParams::default(), &training_job("a"))
            .await,
    );
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));

    let mut first = created.clone();
    first.spec.num_workers = 3;
    jobs.replace("a", &PostParams::default(), &first)
        .await
        .expect("current version");
    let mut stale = created.clone();
    stale.spec.num_workers = 5;
    let conflict = api_error(jobs.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    let stale_patch = json!({"metadata": {"resourceVersion": created.resource_version()}, "spec": {"numWorkers": 6}});
    let conflict = api_error(
        jobs.patch("a", &PatchParams::default(), &Patch::Merge(&stale_patch))
            .await,
    );
    assert_eq!(conflict.reason, "Conflict");
    assert_eq!(
        jobs.get("a").await.expect("get").spec.num_workers,
        3,
        "neither stale write landed"
    );
}

#[tokio::test]
async fn generation_follows_spec_changes_not_status_or_metadata() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let created = jobs
        .create(&PostParams::default(), &training_job("g"))
        .await
        .expect("created");
    assert_eq!(created.metadata.generation, Some(1));

    let status = json!({"status": {"state": "Running", "progress": "10%"}});
    let with_status = jobs
        .patch_status("g", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");
    assert_eq!(
        with_status.status.as_ref().and_then(|s| s.state),
        Some(TrainingJobState::Running)
    );
    assert_eq!(
        with_status.metadata.generation,
        Some(1),
        "status does not bump generation"
    );
    assert!(revision(&with_status) > revision(&created));

    let labels = json!({"metadata": {"labels": {"team": "vision"}}});
    let labelled = jobs
        .patch("g", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("labelled");
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata does not bump generation"
    );

    let spec = json!({"spec": {"numWorkers": 8}});
    let respecced = jobs
        .patch("g", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("spec changed");
    assert_eq!(respecced.metadata.generation, Some(2));
    assert_eq!(
        respecced.labels().get("team").map(String::as_str),
        Some("vision")
    );
    assert_eq!(respecced.status, with_status.status, "the status stays");
}

#[tokio::test]
async fn server_side_apply_creates_keeps_versions_and_prunes_what_a_manager_drops() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let planner = PatchParams::apply("trainyard-planner").force();

    let mut job = training_job("ssa");
    job.metadata.labels = Some(BTreeMap::from([
        ("team".to_owned(), "vision".to_owned()),
        ("tier".to_owned(), "gold".to_owned()),
    ]));
    job.spec.image = Some("trainer:1".to_owned());
    let created = jobs
        .patch("ssa", &planner, &Patch::Apply(&job))
        .await
        .expect("apply creates");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.uid.is_some());
    assert_eq!(created.spec, job.spec);

    let reapplied = jobs
        .patch("ssa", &planner, &Patch::Apply(&job))
        .await
        .expect("re-apply");
    assert_eq!(
        reapplied.resource_version(),
        created.resource_version(),
        "an unchanged apply writes nothing"
    );

    // Another manager co-owns `team` and adds `owner`; a plain merge patch adds `note`.
    let ops = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
        "metadata": {"name": "ssa", "labels": {"team": "vision", "owner": "ops"}},
    });
    jobs.patch("ssa", &PatchParams::apply("ops"), &Patch::Apply(&ops))
        .await
        .expect("ops applies");
    let note = json!({"metadata": {"labels": {"note": "kept"}}});
    jobs.patch("ssa", &PatchParams::default(), &Patch::Merge(&note))
        .await
        .expect("merge patch");

    let mut trimmed = training_job("ssa");
    trimmed.spec.num_workers = 3;
    let pruned = jobs
        .patch("ssa", &planner, &Patch::Apply(&trimmed))
        .await
        .expect("apply without image and labels");
    assert_eq!(
        pruned.spec.image, None,
        "the field the planner dropped is gone"
    );
    assert_eq!(pruned.spec.num_workers, 3);
    assert_eq!(pruned.metadata.generation, Some(2));
    let labels: Vec<(&str, &str)> = pruned
        .labels()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        [("note", "kept"), ("owner", "ops"), ("team", "vision")],
        "tier (only the planner's) went; ops' labels and the merge-patched one stayed"
    );
    assert_eq!(jobs.get("ssa").await.expect("get"), pruned);
}

#[tokio::test]
async fn status_writes_change_only_status_and_main_writes_never_do() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let planner = PatchParams::apply("trainyard-planner").force();

    let mut job = training_job("st");
    job.status = Some(TrainingJobStatus {
        state: Some(TrainingJobState::Completed),
        ..Default::default()
    });
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("created");
    assert_eq!(created.status, None, "status is not set on create");

    let status = TrainingJobStatus {
        state: Some(TrainingJobState::Running),
        progress: Some("10%".to_owned()),
        ..Default::default()
    };
    let body = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
        "spec": {"model": "sneaked-in"},
        "status": status,
    });
    let written = jobs
        .patch_status("st", &planner, &Patch::Apply(&body))
        .await
        .expect("status applied");
    assert_eq!(written.status, Some(status));
    assert_eq!(
        written.spec, created.spec,
        "the status subresource leaves the spec"
    );
    assert_eq!(written.metadata.generation, Some(1));

    let less = json!({"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob", "status": {"state": "Running"}});
    let pruned = jobs
        .patch_status("st", &planner, &Patch::Apply(&less))
        .await
        .expect("status re-applied");
    let pruned_status = pruned.status.clone().expect("status");
    assert_eq!(
        (pruned_status.state, pruned_status.progress),
        (Some(TrainingJobState::Running), None)
    );

    let via_main = json!({"status": {"state": "Failed"}});
    let unchanged = jobs
        .patch("st", &PatchParams::default(), &Patch::Merge(&via_main))
        .await
        .expect("merge");
    assert_eq!(unchanged.status, pruned.status);
    assert_eq!(
        unchanged.resource_version(),
        pruned.resource_version(),
        "a status-only main write is a no-op"
    );

    let mut replacement = unchanged.clone();
    replacement.spec.num_workers = 7;
    replacement.status = Some(TrainingJobStatus {
        state: Some(TrainingJobState::Failed),
        ..Default::default()
    });
    let replaced = jobs
        .replace("st", &PostParams::default(), &replacement)
        .await
        .expect("replaced");
    assert_eq!(replaced.spec.num_workers, 7);
    assert_eq!(replaced.status, pruned.status, "replace keeps the status");

    let mut applied = training_job("st");
    applied.status = replacement.status.clone();
    let applied = jobs
        .patch("st", &planner, &Patch::Apply(&applied))
        .await
        .expect("main apply");
    assert_eq!(
        applied.status, pruned.status,
        "a main-resource apply keeps the status"
    );
}

#[tokio::test]
async fn a_finalizer_holds_a_deletion_until_it_is_removed() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let mut job = training_job("fin");
    job.metadata.finalizers = Some(vec!["trainyard.dev/cleanup".to_owned()]);
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("created");

    let deleting = jobs
        .delete("fin", &DeleteParams::default())
        .await
        .expect("delete accepted")
        .left()
        .expect("the object, still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let still = jobs.get("fin").await.expect("still there");
    assert_eq!(
        still.metadata.deletion_timestamp,
        deleting.metadata.deletion_timestamp
    );
    assert_eq!(still.finalizers(), ["trainyard.dev/cleanup"]);
    assert_eq!(still.metadata.uid, created.metadata.uid);

    let again = jobs
        .delete("fin", &DeleteParams::default())
        .await
        .expect("delete again")
        .left();
    assert_eq!(
        again.map(|j| j.resource_version()),
        Some(still.resource_version()),
        "a second delete changes nothing"
    );

    // Both ways the planner writes finalizers: with and without a resourceVersion.
    let keep = json!({"metadata": {"finalizers": ["trainyard.dev/cleanup", "other"], "resourceVersion": still.resource_version()}});
    jobs.patch("fin", &PatchParams::default(), &Patch::Merge(&keep))
        .await
        .expect("finalizer added");
    let release = json!({"metadata": {"finalizers": ["other"]}});
    jobs.patch("fin", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("one released");
    assert!(
        jobs.get_opt("fin").await.expect("get").is_some(),
        "one finalizer left"
    );
    let release = json!({"metadata": {"finalizers": []}});
    jobs.patch("fin", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("released");
    assert!(
        jobs.get_opt("fin").await.expect("get").is_none(),
        "gone with its last finalizer"
    );
}

#[tokio::test]
async fn deleting_an_owner_deletes_its_dependents_unless_orphaned() {
    let server = Server::start().await;
    let jobs: Api<Job> = server.api();
    let pods: Api<Pod> = server.api();
    let owned_pods = |job: &Job, names: &[&str]| {
        let owner = job.controller_owner_ref(&()).expect("a job with uid");
        names
            .iter()
            .map(|name| {
                let mut p = pod(name, Some(&job.name_any()));
                p.metadata.owner_references = Some(vec![owner.clone()]);
                p
            })
            .collect::<Vec<_>>()
    };
    let job = |name: &str| {
        let mut job = Job::default();
        job.metadata.name = Some(name.to_owned());
        job
    };

    let background = jobs
        .create(&PostParams::default(), &job("bg"))
        .await
        .expect("job");
    for p in owned_pods(&background, &["bg-0", "bg-1"]) {
        pods.create(&PostParams::default(), &p)
            .await
            .expect("owned pod");
    }
    pods.create(&PostParams::default(), &pod("loner", None))
        .await
        .expect("unowned pod");
    let orphaning = jobs
        .create(&PostParams::default(), &job("orphan"))
        .await
        .expect("job");
    for p in owned_pods(&orphaning, &["orphan-0"]) {
        pods.create(&PostParams::default(), &p)
            .await
            .expect("owned pod");
    }

    jobs.delete("bg", &DeleteParams::background())
        .await
        .expect("deleted");
    let names = |pods: Vec<Pod>| pods.iter().map(ResourceExt::name_any).collect::<Vec<_>>();
    assert_eq!(
        names(pods.list(&ListParams::default()).await.expect("list").items),
        ["loner", "orphan-0"]
    );

    jobs.delete("orphan", &DeleteParams::orphan())
        .await
        .expect("deleted");
    assert!(jobs.get_opt("orphan").await.expect("get").is_none());
    assert_eq!(
        names(pods.list(&ListParams::default()).await.expect("list").items),
        ["loner", "orphan-0"],
        "Orphan leaves the dependents"
    );

    // The planner's trials: TrainingJobs owned by their Sweep.
    let sweeps: Api<Sweep> = server.api();
    let training: Api<TrainingJob> = server.api();
    let sweep: Sweep = example(include_str!("../../examples/sweep.yaml"));
    let sweep = sweeps
        .create(&PostParams::default(), &sweep)
        .await
        .expect("sweep");
    let mut trial = training_job("trial-0");
    trial.metadata.owner_references = sweep.controller_owner_ref(&()).map(|o| vec![o]);
    training
        .patch(
            "trial-0",
            &PatchParams::apply("trainyard-planner"),
            &Patch::Apply(&trial),
        )
        .await
        .expect("trial");
    sweeps
        .delete(&sweep.name_any(), &DeleteParams::default())
        .await
        .expect("sweep deleted");
    assert!(
        training.get_opt("trial-0").await.expect("get").is_none(),
        "the trial went with its sweep"
    );
}

#[tokio::test]
async fn the_watcher_lists_then_watches_only_labelled_pods() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    for p in [
        pod("a", Some("j1")),
        pod("b", Some("j1")),
        pod("unlabelled", None),
    ] {
        pods.create(&PostParams::default(), &p).await.expect("pod");
    }
    let elsewhere: Api<Pod> = Api::namespaced(server.client.clone(), "elsewhere");
    elsewhere
        .create(&PostParams::default(), &pod("a", Some("j9")))
        .await
        .expect("pod elsewhere");

    let mut events = watcher(pods.clone(), watcher::Config::default().labels(LABEL_JOB)).boxed();
    let (initial, _) = next_events(&mut events, 4).await;
    assert_eq!(
        initial,
        ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]
    );

    pods.create(&PostParams::default(), &pod("unlabelled-2", None))
        .await
        .expect("pod");
    elsewhere
        .create(&PostParams::default(), &pod("c-elsewhere", Some("j9")))
        .await
        .expect("pod");
    pods.create(&PostParams::default(), &pod("c", Some("j2")))
        .await
        .expect("pod");
    let relabel = json!({"metadata": {"labels": {"phase": "two"}}});
    pods.patch("c", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .expect("patched");
    pods.patch_status(
        "c",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Running"}})),
    )
    .await
    .expect("status");
    pods.delete("unlabelled", &DeleteParams::default())
        .await
        .expect("deleted");
    pods.delete("c", &DeleteParams::default())
        .await
        .expect("deleted");

    let (watched, revisions) = next_events(&mut events, 4).await;
    assert_eq!(watched, ["Apply(c)", "Apply(c)", "Apply(c)", "Delete(c)"]);
    assert!(strictly_increasing(&revisions), "{revisions:?}");

    // Losing the label leaves the watched set (DELETED), regaining it enters it
    // (ADDED), as with a real apiserver's filtered watch.
    let unlabel = json!({"metadata": {"labels": {LABEL_JOB: null}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .expect("unlabelled");
    let relabel = json!({"metadata": {"labels": {LABEL_JOB: "j3"}}});
    pods.patch(
        "unlabelled-2",
        &PatchParams::default(),
        &Patch::Merge(&relabel),
    )
    .await
    .expect("labelled");
    let (moved, _) = next_events(&mut events, 2).await;
    assert_eq!(moved, ["Delete(a)", "Apply(unlabelled-2)"]);
    let raw = pods
        .watch(
            &WatchParams::default().labels(LABEL_JOB).timeout(1),
            &revisions[0].to_string(),
        )
        .await
        .expect("watch");
    let raw: Vec<String> = raw
        .map(|event| match event.expect("event") {
            WatchEvent::Added(p) => format!("ADDED {}", p.name_any()),
            WatchEvent::Modified(p) => format!("MODIFIED {}", p.name_any()),
            WatchEvent::Deleted(p) => format!("DELETED {}", p.name_any()),
            other => format!("{other:?}"),
        })
        .filter(|line| std::future::ready(!line.starts_with("Bookmark")))
        .collect()
        .await;
    assert_eq!(
        raw,
        [
            "MODIFIED c",
            "MODIFIED c",
            "DELETED c",
            "DELETED a",
            "ADDED unlabelled-2"
        ]
    );
}

#[tokio::test]
async fn a_watch_resumed_from_an_old_version_replays_what_happened_in_between() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    pods.create(&PostParams::default(), &pod("before", Some("j")))
        .await
        .expect("pod");

    // The watcher opens its watch only when polled after InitDone: everything
    // below happens after its list's resourceVersion and before the watch.
    let mut events = watcher(pods.clone(), watcher::Config::default().labels(LABEL_JOB)).boxed();
    let (initial, _) = next_events(&mut events, 3).await;
    assert_eq!(initial, ["Init", "InitApply(before)", "InitDone"]);
    let list_version = pods
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version;

    pods.create(&PostParams::default(), &pod("x", Some("j")))
        .await
        .expect("pod");
    let patch = json!({"metadata": {"annotations": {"step": "2"}}});
    pods.patch("x", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patched");
    pods.create(&PostParams::default(), &pod("y", Some("j")))
        .await
        .expect("pod");
    pods.delete("x", &DeleteParams::default())
        .await
        .expect("deleted");
    pods.delete("before", &DeleteParams::default())
        .await
        .expect("deleted");

    let (replayed, revisions) = next_events(&mut events, 5).await;
    assert_eq!(
        replayed,
        [
            "Apply(x)",
            "Apply(x)",
            "Apply(y)",
            "Delete(x)",
            "Delete(before)"
        ]
    );
    assert!(strictly_increasing(&revisions), "{revisions:?}");

    // The same, as raw watch events from the list's resourceVersion.
    let raw = pods
        .watch(
            &WatchParams::default().labels(LABEL_JOB).timeout(1),
            &list_version.expect("list version"),
        )
        .await
        .expect("watch");
    let raw: Vec<String> = raw
        .take(5)
        .map(|event| match event.expect("event") {
            WatchEvent::Added(p) => format!("ADDED {}", p.name_any()),
            WatchEvent::Modified(p) => format!("MODIFIED {}", p.name_any()),
            WatchEvent::Deleted(p) => format!("DELETED {}", p.name_any()),
            other => format!("{other:?}"),
        })
        .collect()
        .await;
    assert_eq!(
        raw,
        [
            "ADDED x",
            "MODIFIED x",
            "ADDED y",
            "DELETED x",
            "DELETED before"
        ]
    );
}

#[tokio::test]
async fn watches_that_time_out_are_resumed_without_losing_changes() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    // A one-second server-side timeout makes the watcher re-watch (from the
    // bookmark or last object it saw) several times while pods keep coming.
    let config = watcher::Config::default().labels(LABEL_JOB).timeout(1);
    let mut events = watcher(pods.clone(), config).boxed();
    let (initial, _) = next_events(&mut events, 2).await;
    assert_eq!(initial, ["Init", "InitDone"]);

    const PODS: usize = 25;
    let creator = pods.clone();
    let creating = tokio::spawn(async move {
        for i in 0..PODS {
            creator
                .create(&PostParams::default(), &pod(&format!("p{i:02}"), Some("j")))
                .await
                .expect("pod");
            tokio::time::sleep(Duration::from_millis(120)).await;
        }
    });
    let (seen, revisions) = next_events(&mut events, PODS).await;
    creating.await.expect("all pods created");
    let expected: Vec<String> = (0..PODS).map(|i| format!("Apply(p{i:02})")).collect();
    assert_eq!(seen, expected, "every pod once, in order, no relist");
    assert!(strictly_increasing(&revisions));
    assert!(
        server.watches.load(Ordering::SeqCst) >= 2,
        "the watch was resumed at least once ({} watch requests)",
        server.watches.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_watch_from_beyond_the_history_gets_410_and_the_watcher_relists() {
    let server = Server::start_with(Store::with_history(4)).await;
    let pods: Api<Pod> = server.api();
    pods.create(&PostParams::default(), &pod("p0", Some("j")))
        .await
        .expect("pod");
    let mut events = watcher(pods.clone(), watcher::Config::default().labels(LABEL_JOB)).boxed();
    let (initial, _) = next_events(&mut events, 3).await;
    assert_eq!(initial, ["Init", "InitApply(p0)", "InitDone"]);

    // Six changes while the watcher is not watching: its version falls out of a
    // four-change history.
    for i in 1..=6 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), Some("j")))
            .await
            .expect("pod");
    }
    let raw = pods
        .watch(&WatchParams::default(), "1")
        .await
        .expect("watch");
    let first = tokio::time::timeout(EVENT_DEADLINE, std::pin::pin!(raw).next())
        .await
        .expect("an event");
    match first {
        Some(Ok(WatchEvent::Error(status))) => assert_eq!(status.code, 410, "{status:?}"),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    let gone = next_event(&mut events).await;
    match &gone {
        Err(watcher::Error::WatchError(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Gone, got {}", describe(other)),
    }
    let (relisted, _) = next_events(&mut events, 9).await;
    let mut expected = vec!["Init".to_owned()];
    expected.extend((0..=6).map(|i| format!("InitApply(p{i})")));
    expected.push("InitDone".to_owned());
    assert_eq!(relisted, expected);

    pods.create(&PostParams::default(), &pod("p7", Some("j")))
        .await
        .expect("pod");
    let (after, _) = next_events(&mut events, 1).await;
    assert_eq!(after, ["Apply(p7)"], "watching again after the relist");
}

#[tokio::test]
async fn the_recorder_creates_an_event_then_patches_its_series() {
    let server = Server::start().await;
    let jobs: Api<TrainingJob> = server.api();
    let job = jobs
        .create(&PostParams::default(), &training_job("ev"))
        .await
        .expect("job");
    let recorder = Recorder::new(
        server.client.clone(),
        Reporter {
            controller: "trainyard-planner".to_owned(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Admitted".to_owned(),
        note: Some("admitted to queue default".to_owned()),
        action: "Admit".to_owned(),
        secondary: None,
    };
    let reference = job.object_ref(&());
    for _ in 0..3 {
        recorder
            .publish(&event, &reference)
            .await
            .expect("published");
    }
    let warning = Event {
        type_: EventType::Warning,
        reason: "Preempted".to_owned(),
        note: None,
        action: "Preempt".to_owned(),
        secondary: None,
    };
    recorder
        .publish(&warning, &reference)
        .await
        .expect("published");

    let events: Api<K8sEvent> = server.api();
    let mut recorded = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    recorded.sort_by_key(|e| e.reason.clone());
    let summary: Vec<String> = recorded
        .iter()
        .map(|e| {
            format!(
                "{} x{} on {} by {}",
                e.reason.as_deref().unwrap_or("?"),
                e.series.as_ref().map_or(1, |s| s.count),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or("?"),
                e.reporting_controller.as_deref().unwrap_or("?"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "Admitted x3 on ev by trainyard-planner",
            "Preempted x1 on ev by trainyard-planner",
        ],
        "one Event per reason; repeats patch its series"
    );
}

/// A pod with these scheduling gates and the node selector `pool: a`, as the
/// Job controller creates a worker the planner places.
fn gated_pod(name: &str, gates: &[&str]) -> Pod {
    let gates: Vec<_> = gates.iter().map(|gate| json!({"name": gate})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": gates,
            "nodeSelector": {"pool": "a"},
            "containers": [{"name": "worker", "image": "trainer:1"}],
        },
    }))
    .expect("a pod")
}

/// What the planner sends to place a gated pod on `node` and lift its gate.
fn placement(node: &str) -> Patch<serde_json::Value> {
    Patch::Strategic(json!({"spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "schedulingGates": [{"name": "trainyard.dev/placement", "$patch": "delete"}],
    }}))
}

#[tokio::test]
async fn a_strategic_patch_lifts_one_scheduling_gate_and_adds_to_the_node_selector() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    let gates = ["trainyard.dev/placement", "example.com/other"];
    pods.create(&PostParams::default(), &gated_pod("w-0", &gates))
        .await
        .expect("created");

    let placed = pods
        .patch("w-0", &PatchParams::default(), &placement("gpu-3"))
        .await
        .expect("placed");
    let spec = placed.spec.clone().expect("a spec");
    let gate_names: Vec<String> = spec
        .scheduling_gates
        .into_iter()
        .flatten()
        .map(|gate| gate.name)
        .collect();
    assert_eq!(
        gate_names,
        ["example.com/other"],
        "only the named gate went"
    );
    assert_eq!(
        spec.node_selector,
        Some(BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "gpu-3".to_owned()),
            ("pool".to_owned(), "a".to_owned()),
        ])),
        "the key is added next to the existing one"
    );
    assert_eq!(spec.containers.len(), 1);
    let stored = server
        .raw(
            "GET",
            "/api/v1/namespaces/ml-training/pods/w-0",
            "application/json",
            "",
        )
        .await
        .expect("get");
    assert!(!stored.contains("$patch"), "{stored}");

    let again = pods
        .patch("w-0", &PatchParams::default(), &placement("gpu-3"))
        .await
        .expect("placed again");
    assert_eq!(
        again.resource_version(),
        placed.resource_version(),
        "deleting a gate that is gone changes nothing"
    );
    let last = Patch::Strategic(json!({"spec": {"schedulingGates": [
        {"name": "example.com/other", "$patch": "delete"},
    ]}}));
    let released = pods
        .patch("w-0", &PatchParams::default(), &last)
        .await
        .expect("released");
    assert!(revision(&released) > revision(&again));
    assert_eq!(
        released.spec.and_then(|s| s.scheduling_gates),
        Some(Vec::new())
    );
}

#[tokio::test]
async fn pod_spec_updates_may_only_lift_gates_and_place_gated_pods() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    let free = pods
        .create(&PostParams::default(), &gated_pod("free", &[]))
        .await
        .expect("created");
    let held = pods
        .create(
            &PostParams::default(),
            &gated_pod("held", &["trainyard.dev/placement"]),
        )
        .await
        .expect("created");
    let params = PatchParams::default();
    let refused = |status: Box<Status>, wanted: &str| {
        assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
        assert!(status.message.contains(wanted), "{}", status.message);
    };

    refused(
        api_error(pods.patch("free", &params, &placement("gpu-3")).await),
        "Pod \"free\" is invalid: spec.nodeSelector: Forbidden",
    );
    let applied = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "free"},
                         "spec": {"nodeSelector": {"pool": "a", "zone": "z1"}}});
    refused(
        api_error(
            pods.patch("free", &PatchParams::apply("ops"), &Patch::Apply(&applied))
                .await,
        ),
        "spec.nodeSelector: Forbidden",
    );
    let new_gate = json!({"spec": {"schedulingGates": [{"name": "example.com/y"}]}});
    refused(
        api_error(
            pods.patch("held", &params, &Patch::Strategic(&new_gate))
                .await,
        ),
        "spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate 'example.com/y'",
    );
    let mut regated = held.clone();
    if let Some(spec) = regated.spec.as_mut() {
        spec.scheduling_gates
            .get_or_insert_default()
            .push(PodSchedulingGate {
                name: "example.com/y".to_owned(),
            });
    }
    refused(
        api_error(pods.replace("held", &PostParams::default(), &regated).await),
        "found new scheduling gate 'example.com/y'",
    );
    let moved = json!({"spec": {"nodeSelector": {"pool": "b"}}});
    refused(
        api_error(pods.patch("held", &params, &Patch::Merge(&moved)).await),
        "spec.nodeSelector: Forbidden: only additions",
    );
    let image = json!({"spec": {"containers": [{"name": "worker", "image": "trainer:2"}]}});
    refused(
        api_error(pods.patch("held", &params, &Patch::Strategic(&image)).await),
        "spec: Forbidden: pod updates may not change fields other than",
    );
    assert_eq!(
        pods.get("held").await.expect("get").resource_version(),
        held.resource_version(),
        "nothing refused was written"
    );

    let placed = pods
        .patch("held", &params, &placement("gpu-3"))
        .await
        .expect("a gated pod is placed and released in one patch");
    let selector = placed
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    assert_eq!(
        selector.get("kubernetes.io/hostname").map(String::as_str),
        Some("gpu-3")
    );
    let mut relabelled = pods.get("free").await.expect("get");
    relabelled
        .labels_mut()
        .insert("tier".to_owned(), "gold".to_owned());
    pods.replace("free", &PostParams::default(), &relabelled)
        .await
        .expect("a replace that keeps the spec");
    for (name, before) in [("free", &free), ("held", &placed)] {
        let label = json!({"metadata": {"labels": {"team": "vision"}}});
        let labelled = pods
            .patch(name, &params, &Patch::Merge(&label))
            .await
            .expect("metadata may change");
        assert_eq!(labelled.spec, before.spec, "{name}");
        assert_eq!(
            labelled.labels().get("team").map(String::as_str),
            Some("vision")
        );
    }
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_the_server_keeps_serving() {
    let server = Server::start().await;
    let pods: Api<Pod> = server.api();
    let jobs: Api<TrainingJob> = server.api();
    jobs.create(&PostParams::default(), &training_job("ok"))
        .await
        .expect("job");

    let malformed = api_error(
        server
            .raw(
                "POST",
                "/api/v1/namespaces/ml-training/configmaps",
                "application/json",
                r#"{"metadata": {"name": "x",}"#,
            )
            .await,
    );
    assert_eq!(malformed.code, 400);
    assert!(
        malformed.message.contains("not valid JSON") && malformed.message.contains("line 1"),
        "{}",
        malformed.message
    );
    let not_an_object = api_error(
        server
            .raw(
                "POST",
                "/api/v1/namespaces/ml-training/configmaps",
                "application/json",
                "[1]",
            )
            .await,
    );
    assert_eq!(not_an_object.code, 400);

    let json_patch = api_error(
        server
            .raw(
                "PATCH",
                "/apis/trainyard.dev/v1/namespaces/ml-training/trainingjobs/ok",
                "application/json-patch+json",
                r#"[{"op": "remove", "path": "/spec"}]"#,
            )
            .await,
    );
    assert_eq!(
        (json_patch.code, json_patch.reason.as_str()),
        (415, "UnsupportedMediaType")
    );
    assert!(
        json_patch.message.contains("application/json-patch+json"),
        "{}",
        json_patch.message
    );
    let list_as_merge = api_error(
        server
            .raw(
                "PATCH",
                "/apis/trainyard.dev/v1/namespaces/ml-training/trainingjobs/ok",
                "application/merge-patch+json",
                "[]",
            )
            .await,
    );
    assert_eq!(list_as_merge.code, 400);

    let deployments: Api<Deployment> = server.api();
    let unknown = api_error(deployments.list(&ListParams::default()).await);
    assert_eq!(unknown.code, 404);
    for served in [
        "pods",
        "jobs.batch",
        "events.events.k8s.io",
        "trainingjobs.trainyard.dev",
    ] {
        assert!(
            unknown.message.contains(served),
            "{served} missing from: {}",
            unknown.message
        );
    }
    assert_eq!(
        api_error(server.raw("GET", "/healthz", "application/json", "").await).code,
        404
    );
    let exec = api_error(
        server
            .raw(
                "GET",
                "/api/v1/namespaces/ml-training/pods/p/exec",
                "application/json",
                "",
            )
            .await,
    );
    assert_eq!(exec.code, 400);
    assert!(exec.message.contains("\"exec\""), "{}", exec.message);

    for selector in ["tier in gpu", "=gpu", "tier gpu"] {
        let bad = api_error(pods.list(&ListParams::default().labels(selector)).await);
        assert_eq!(bad.code, 400, "{selector}");
        assert!(
            bad.message.contains(selector),
            "{selector}: {}",
            bad.message
        );
    }

    let no_manager = api_error(
        jobs.patch(
            "ok",
            &PatchParams::default(),
            &Patch::Apply(&training_job("ok")),
        )
        .await,
    );
    assert_eq!(no_manager.code, 400);
    assert!(
        no_manager.message.contains("fieldManager"),
        "{}",
        no_manager.message
    );

    let policy = api_error(
        server
            .raw("DELETE", "/apis/trainyard.dev/v1/namespaces/ml-training/trainingjobs/ok?propagationPolicy=Sideways", "application/json", "")
            .await,
    );
    assert_eq!(policy.code, 400);
    assert!(policy.message.contains("Sideways"), "{}", policy.message);

    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let refused = api_error(pods.create(&dry_run, &pod("dry", None)).await);
    assert_eq!(refused.code, 400);
    assert!(refused.message.contains("dryRun"), "{}", refused.message);
    assert!(
        pods.get_opt("dry").await.expect("get").is_none(),
        "a dry run writes nothing"
    );

    let too_deep = api_error(
        server
            .raw(
                "GET",
                "/apis/trainyard.dev/v1/trainingqueues/x/status/extra",
                "application/json",
                "",
            )
            .await,
    );
    assert_eq!(too_deep.code, 404);
    let wrong_scope = api_error(
        server
            .raw(
                "GET",
                "/apis/trainyard.dev/v1/trainingjobs/ok",
                "application/json",
                "",
            )
            .await,
    );
    assert_eq!(wrong_scope.code, 400);
    assert!(
        wrong_scope.message.contains("/namespaces/<ns>/"),
        "{}",
        wrong_scope.message
    );

    // Still serving, and nothing above changed the job.
    let job = jobs.get("ok").await.expect("the server still answers");
    assert_eq!(job.spec, training_job("ok").spec);
    let config_maps: Api<ConfigMap> = server.api();
    assert!(
        config_maps
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
}

/// A pod as the simulated kubelet leaves it: one container `worker`, in `phase`.
fn worker_pod(store: &Store, name: &str, phase: &str) {
    let state = match phase {
        "Running" => json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
        "Succeeded" => json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    store
        .create_with_status(
            trainyard_simulator::resources::pods(),
            Some(NS),
            json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "worker", "image": "trainer"}]},
                "status": {"phase": phase, "containerStatuses": [{"name": "worker", "state": state}]},
            }),
        )
        .expect("pod stored");
}

fn set_phase(store: &Store, name: &str, phase: &str) {
    store
        .update(
            trainyard_simulator::resources::pods(),
            Some(NS),
            name,
            |pod| {
                pod["status"]["phase"] = json!(phase);
            },
        )
        .expect("pod updated");
}

#[tokio::test]
async fn pod_logs_are_served_as_text_with_tail_timestamps_and_the_kubelets_refusals() {
    let server = Server::start().await;
    worker_pod(&server.store, "w-0", "Running");
    for epoch in 1..=3 {
        server
            .store
            .logs()
            .append(NS, "w-0", format!("epoch {epoch}/3 loss=0.5"));
    }
    let pods: Api<Pod> = server.api();
    let all = pods.logs("w-0", &LogParams::default()).await.expect("logs");
    assert_eq!(
        all,
        "epoch 1/3 loss=0.5\nepoch 2/3 loss=0.5\nepoch 3/3 loss=0.5\n"
    );
    let tail = LogParams {
        tail_lines: Some(1),
        timestamps: true,
        container: Some("worker".into()),
        ..LogParams::default()
    };
    let last = pods.logs("w-0", &tail).await.expect("tail");
    let (time, text) = last.trim_end().split_once(' ').expect("a timestamp first");
    assert!(
        chrono::DateTime::parse_from_rfc3339(time).is_ok(),
        "RFC 3339: {time}"
    );
    assert_eq!(text, "epoch 3/3 loss=0.5");
    let response = server
        .client
        .send(
            axum::http::Request::builder()
                .uri(format!("/api/v1/namespaces/{NS}/pods/w-0/log?tailLines=2"))
                .body(kube::client::Body::from(Vec::new()))
                .expect("request"),
        )
        .await
        .expect("a response");
    assert_eq!(response.headers()["content-type"], "text/plain");

    let missing = api_error(pods.logs("nobody", &LogParams::default()).await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    assert_eq!(missing.message, "pods \"nobody\" not found");
    worker_pod(&server.store, "w-1", "Pending");
    let waiting = api_error(pods.logs("w-1", &LogParams::default()).await);
    assert_eq!((waiting.code, waiting.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        waiting.message,
        "container \"worker\" in pod \"w-1\" is waiting to start: ContainerCreating"
    );
    let other = LogParams {
        container: Some("sidecar".into()),
        ..LogParams::default()
    };
    let unknown = api_error(pods.logs("w-0", &other).await);
    assert_eq!(
        unknown.message,
        "container sidecar is not valid for pod w-0"
    );
    let negative = LogParams {
        tail_lines: Some(-1),
        ..LogParams::default()
    };
    assert_eq!(api_error(pods.logs("w-0", &negative).await).code, 400);
}

#[tokio::test]
async fn a_followed_log_streams_new_lines_and_ends_when_the_pod_finishes() {
    use futures::{AsyncBufReadExt, TryStreamExt};
    let server = Server::start().await;
    worker_pod(&server.store, "w-0", "Running");
    server
        .store
        .logs()
        .append(NS, "w-0", "rank 0/1: starting at epoch 0");
    let pods: Api<Pod> = server.api();
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let mut lines = pods
        .log_stream("w-0", &follow)
        .await
        .expect("a stream")
        .lines();
    let next = async |lines: &mut (dyn futures::Stream<Item = std::io::Result<String>> + Unpin)| {
        tokio::time::timeout(EVENT_DEADLINE, lines.try_next())
            .await
            .expect("a line in time")
            .expect("readable")
    };
    assert_eq!(
        next(&mut lines).await.as_deref(),
        Some("rank 0/1: starting at epoch 0")
    );
    server.store.logs().append(NS, "w-0", "epoch 1/1 loss=0.1");
    assert_eq!(
        next(&mut lines).await.as_deref(),
        Some("epoch 1/1 loss=0.1")
    );
    server.store.logs().append(
        NS,
        "w-0",
        "training finished at epoch 1/1: exiting with code 0",
    );
    set_phase(&server.store, "w-0", "Succeeded");
    assert_eq!(
        next(&mut lines).await.as_deref(),
        Some("training finished at epoch 1/1: exiting with code 0")
    );
    assert_eq!(next(&mut lines).await, None, "the stream ends with the pod");

    // A finished pod's log is still served, and a follow of it ends at once.
    let after = pods.logs("w-0", &follow).await.expect("logs");
    assert_eq!(after.lines().count(), 3);
}
