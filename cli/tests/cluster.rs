//! `trainyard` end to end against kube-fake-client (every example file of
//! Trainyard's kinds): an in-memory API server with
//! server-side apply and status subresources (but no watch, so `-w` is covered by the
//! pure tests in `watch.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::Parser;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use kube_fake_client::{PatchType, interceptor};
use serde_json::{Value, json};
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};
use trainyard_cli::cli::Cli;
use trainyard_cli::error::CliError;

/// One apply request as the server received it.
#[derive(Clone, Debug, PartialEq)]
struct Applied {
    /// "" for the cluster-scoped request path.
    namespace: String,
    name: String,
    kind: String,
    field_manager: Option<String>,
    force: bool,
    server_side_apply: bool,
}

/// What the interceptors saw and, for cluster-scoped objects, stored.
#[derive(Clone, Default)]
struct Server {
    applied: Arc<Mutex<Vec<Applied>>>,
    cluster_scoped: Arc<Mutex<BTreeMap<String, Value>>>,
}

impl Server {
    fn applied(&self) -> Vec<Applied> {
        self.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

/// The fake API server. kube-fake-client registers every custom resource as namespaced,
/// so it refuses the cluster-scoped TrainingQueue path; the interceptors answer requests
/// on that path themselves (namespace "") and record every apply with its parameters.
async fn cluster(nodes: Vec<Node>) -> (Client, Server) {
    let server = Server::default();
    let on_patch = server.clone();
    let on_get = server.clone();
    let interceptors = interceptor::Funcs::new()
        .patch(move |ctx| {
            if let Ok(mut applied) = on_patch.applied.lock() {
                applied.push(Applied {
                    namespace: ctx.namespace.to_owned(),
                    name: ctx.name.to_owned(),
                    kind: ctx.patch["kind"].as_str().unwrap_or_default().to_owned(),
                    field_manager: ctx.params.field_manager.clone(),
                    force: ctx.params.force,
                    server_side_apply: ctx.patch_type == PatchType::ApplyPatch,
                });
            }
            if !ctx.namespace.is_empty() {
                return Ok(None);
            }
            let Ok(mut stored) = on_patch.cluster_scoped.lock() else {
                return Ok(None);
            };
            let version = stored.len() + 1;
            let mut object = ctx.patch.clone();
            object["metadata"]["resourceVersion"] = json!(version.to_string());
            stored.insert(ctx.name.to_owned(), object.clone());
            Ok(Some(object))
        })
        .get(move |ctx| {
            if !ctx.namespace.is_empty() {
                return Ok(None);
            }
            Ok(on_get
                .cluster_scoped
                .lock()
                .ok()
                .and_then(|stored| stored.get(ctx.name).cloned()))
        });
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<TrainingJob>()
        .with_resource::<Sweep>()
        .with_resource::<TrainingQueue>()
        .with_status_subresource::<TrainingJob>()
        .with_objects(nodes)
        .with_object(seeded_queue())
        .with_interceptor_funcs(interceptors)
        .build()
        .await
        .expect("fake API server");
    (client, server)
}

/// A TrainingQueue put straight into the fake's store, so listing queues has something
/// to show (applied queues live in the interceptors' map, which lists cannot reach).
fn seeded_queue() -> TrainingQueue {
    let text = std::fs::read_to_string(examples().join("trainingqueue-default.yaml"))
        .expect("example exists");
    let mut queue: TrainingQueue = yaml_serde::from_str(&text).expect("example parses");
    queue.metadata.name = Some("seeded-queue".into());
    queue
}

/// Runs `trainyard <args>` against `client`; returns stdout, stderr and the result.
async fn trainyard(client: &Client, args: &[&str]) -> (String, String, Result<(), CliError>) {
    let cli = Cli::try_parse_from(std::iter::once("trainyard").chain(args.iter().copied()))
        .expect("arguments parse");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let client = client.clone();
    let result = trainyard_cli::run(cli, async move || Ok(client), &mut out, &mut err).await;
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        result,
    )
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The example files of Trainyard's kinds only: kube-fake-client serves no
/// discovery, which the built-in kinds' files need (`tests/simulator.rs` applies
/// those, and the whole directory).
fn example_files() -> Vec<String> {
    let trainyard_only = |path: &PathBuf| {
        std::fs::read_to_string(path).is_ok_and(|text| {
            text.lines()
                .filter(|line| line.starts_with("apiVersion:"))
                .all(|line| line == "apiVersion: trainyard.dev/v1")
        })
    };
    let mut files: Vec<String> = std::fs::read_dir(examples())
        .expect("examples directory")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .filter(trainyard_only)
        .map(|path| path.display().to_string())
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn every_example_applies_and_a_second_apply_configures() {
    let (client, server) = cluster(vec![]).await;
    let files = example_files();
    assert!(files.len() >= 6, "examples: {files:?}");
    let mut args = vec!["apply", "-n", "team-a"];
    for file in &files {
        args.extend(["-f", file.as_str()]);
    }

    let (out, _, result) = trainyard(&client, &args).await;
    result.expect("examples apply");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "sweep.trainyard.dev/bert-finetune-sweep created",
            "trainingjob.trainyard.dev/advanced-training created",
            "trainingjob.trainyard.dev/bert-distributed created",
            "trainingjob.trainyard.dev/bert-idle created",
            "trainingjob.trainyard.dev/gpt-resume created",
            "trainingjob.trainyard.dev/mnist-training created",
            "trainingqueue.trainyard.dev/default created",
        ]
    );

    // The manifest's own namespace wins; -n fills in the rest; queues are cluster-wide.
    let mnist = Api::<TrainingJob>::namespaced(client.clone(), "ml-training")
        .get("mnist-training")
        .await
        .expect("in its own namespace");
    assert_eq!(mnist.spec.num_workers, 2);
    let advanced = Api::<TrainingJob>::namespaced(client.clone(), "team-a")
        .get("advanced-training")
        .await
        .expect("in the -n namespace");
    assert_eq!(advanced.spec.total_gpus(), 32);
    Api::<Sweep>::namespaced(client.clone(), "ml-training")
        .get("bert-finetune-sweep")
        .await
        .expect("sweep");
    let queue = Api::<TrainingQueue>::all(client.clone())
        .get("default")
        .await
        .expect("cluster-scoped queue");
    assert_eq!(queue.spec.nominal_gpus(), 24);
    assert_eq!(queue.namespace(), None);

    // Every object went by server-side apply, forced, under the CLI's field manager;
    // the queue on the cluster-scoped path.
    let applied = server.applied();
    assert_eq!(applied.len(), 7);
    for request in &applied {
        assert_eq!(
            request.field_manager.as_deref(),
            Some("trainyard-cli"),
            "{request:?}"
        );
        assert!(request.force && request.server_side_apply, "{request:?}");
        let cluster_scoped = request.kind == "TrainingQueue";
        assert_eq!(request.namespace.is_empty(), cluster_scoped, "{request:?}");
    }

    let (out, _, result) = trainyard(&client, &args).await;
    result.expect("second apply");
    assert_eq!(out.lines().count(), 7, "{out}");
    assert!(
        out.lines()
            .all(|line| line.ends_with(" configured") || line.ends_with(" unchanged")),
        "{out}"
    );
}

#[tokio::test]
async fn a_bad_document_names_its_field_and_nothing_of_the_file_is_applied() {
    let (client, _) = cluster(vec![]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.yaml");
    let good =
        std::fs::read_to_string(examples().join("trainingjob-simple.yaml")).expect("example");
    let bad = good
        .replace("mnist-training", "mnist-bad")
        .replace("numWorkers: 2", "numWorkers: 101");
    std::fs::write(&path, format!("{good}---\n{bad}")).expect("write");
    let file = path.display().to_string();

    let (out, _, result) = trainyard(&client, &["apply", "-f", &file]).await;
    let error = result.expect_err("refused");
    let message = error.to_string();
    assert!(out.is_empty(), "nothing applied, nothing printed: {out}");
    assert!(
        message.contains(&format!("{file}: document 2 (TrainingJob \"mnist-bad\")")),
        "{message}"
    );
    assert!(
        message.contains("spec.numWorkers: Invalid value: must be between 1 and 100, got 101"),
        "{message}"
    );
    assert!(message.contains("nothing was applied"), "{message}");
    let jobs = Api::<TrainingJob>::namespaced(client.clone(), "ml-training");
    assert!(
        jobs.get_opt("mnist-training").await.expect("get").is_none(),
        "the good document was not applied either"
    );
    assert!(jobs.get_opt("mnist-bad").await.expect("get").is_none());
}

#[tokio::test]
async fn a_misspelt_field_is_refused_before_the_server_sees_it() {
    let (client, _) = cluster(vec![]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("job.yaml");
    let text = std::fs::read_to_string(examples().join("trainingjob-distributed.yaml"))
        .expect("example")
        .replace("gpusPerWorker: 2", "gpusPerWrker: 2");
    std::fs::write(&path, text).expect("write");
    let (_, _, result) = trainyard(&client, &["apply", "-f", &path.display().to_string()]).await;
    let message = result.expect_err("refused").to_string();
    assert!(
        message.contains("spec.gpusPerWrker: Unknown field"),
        "{message}"
    );
}

#[tokio::test]
async fn an_invalid_namespace_flag_is_refused() {
    let (client, _) = cluster(vec![]).await;
    let file = examples()
        .join("trainingjob-simple.yaml")
        .display()
        .to_string();
    let (_, _, result) = trainyard(&client, &["apply", "-f", &file, "-n", "Team_A"]).await;
    assert!(matches!(result, Err(CliError::Usage(m)) if m.contains("not a valid namespace")));
}

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).expect("valid"))
}

/// Sets a job's status through the status subresource, as the planner does.
async fn set_status(client: &Client, namespace: &str, name: &str, status: serde_json::Value) {
    let patch = json!({"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob", "status": status});
    Api::<TrainingJob>::namespaced(client.clone(), namespace)
        .patch_status(
            name,
            &PatchParams::apply("planner").force(),
            &Patch::Apply(&patch),
        )
        .await
        .expect("status written");
}

async fn applied_examples(nodes: Vec<Node>) -> Client {
    let (client, _) = cluster(nodes).await;
    let files = example_files();
    let mut args = vec!["apply", "-n", "ml-training"];
    for file in &files {
        args.extend(["-f", file.as_str()]);
    }
    let (_, _, result) = trainyard(&client, &args).await;
    result.expect("examples apply");
    client
}

#[tokio::test]
async fn get_prints_tables_and_json() {
    let client = applied_examples(vec![]).await;
    set_status(
        &client,
        "ml-training",
        "mnist-training",
        json!({"state": "Running", "progress": "30%", "currentEpoch": 3, "totalEpochs": 10, "restartCount": 1}),
    )
    .await;
    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Queued", "conditions": [{
            "type": "Admitted", "status": "False", "reason": "WaitingForQuota",
            "message": "position 2 in queue default: 16 of 16 GPUs in use"
        }], "queue": {"name": "default", "position": 2, "reason": "16 of 16 GPUs in use"}}),
    )
    .await;

    let (out, _, result) = trainyard(&client, &["get", "trainingjobs", "-n", "ml-training"]).await;
    result.expect("get");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(lines[0].starts_with("NAME                STATE     PROGRESS   EPOCH   GPUS       QUEUE        RESTARTS   AGE"), "{out}");
    let columns = |name: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .expect("row");
        line.split("   ")
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .collect()
    };
    assert_eq!(
        columns("mnist-training")[..7],
        [
            "mnist-training",
            "Running",
            "30%",
            "3/10",
            "2 (2x1)",
            "-",
            "1"
        ]
    );
    assert_eq!(
        columns("gpt-resume")[..7],
        [
            "gpt-resume",
            "Queued",
            "-",
            "0/20",
            "8 (4x2)",
            "default #2",
            "0"
        ]
    );
    assert_eq!(columns("advanced-training")[4], "32 (8x4)");

    let (out, _, result) = trainyard(&client, &["get", "tj", "-A", "-o", "wide"]).await;
    result.expect("get wide");
    assert!(out.starts_with("NAMESPACE     NAME "), "{out}");
    assert!(out.contains("MODEL"), "{out}");

    let (out, _, result) = trainyard(&client, &["get", "sweeps", "-n", "ml-training"]).await;
    result.expect("get sweeps");
    assert!(
        out.contains(
            "bert-finetune-sweep   -       0/32     0         0        minimize validation_loss   -"
        ),
        "{out}"
    );

    let (out, _, result) = trainyard(&client, &["get", "tq", "-n", "ignored-for-queues"]).await;
    result.expect("get queues");
    assert!(out.starts_with("NAME           COHORT     PENDING   ADMITTED   GPUS-USED   AGE\nseeded-queue   research   0         0          0/24 "), "{out}");

    let (out, _, result) =
        trainyard(&client, &["get", "tj", "-n", "ml-training", "-o", "json"]).await;
    result.expect("get json");
    let list: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(5));

    let (out, err, result) = trainyard(&client, &["get", "tj", "-n", "empty"]).await;
    result.expect("empty is fine");
    assert!(out.is_empty());
    assert_eq!(err, "No trainingjobs found in namespace empty.\n");
}

#[tokio::test]
async fn until_done_refuses_queues() {
    let (client, _) = cluster(vec![]).await;
    let (_, _, result) = trainyard(&client, &["get", "tq", "--until-done"]).await;
    assert!(matches!(result, Err(CliError::Usage(m)) if m.contains("no end state")));
}

fn gpu_node(name: &str, gpus: &str) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.status = Some(NodeStatus {
        allocatable: Some([("nvidia.com/gpu".to_owned(), Quantity(gpus.to_owned()))].into()),
        ..NodeStatus::default()
    });
    node
}

#[tokio::test]
async fn summary_reads_jobs_and_nodes() {
    let client = applied_examples(vec![gpu_node("gpu-1", "8"), gpu_node("gpu-2", "8")]).await;
    // creationTimestamp comes from the fake server's clock, so measure from it.
    let jobs = Api::<TrainingJob>::namespaced(client.clone(), "ml-training");
    let created = jobs
        .get("mnist-training")
        .await
        .expect("job")
        .creation_timestamp()
        .map(|t| t.0.as_second())
        .expect("fake server sets creationTimestamp");
    let time = |offset: i64| at(created + offset).0.to_string();
    set_status(
        &client,
        "ml-training",
        "mnist-training",
        json!({"state": "Completed", "startTime": time(10), "completionTime": time(110)}),
    )
    .await;
    set_status(
        &client,
        "ml-training",
        "bert-distributed",
        json!({"state": "Failed", "startTime": time(20), "completionTime": time(70)}),
    )
    .await;

    let (out, _, result) = trainyard(&client, &["summary", "-n", "ml-training", "--json"]).await;
    result.expect("summary");
    let summary: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(summary["jobs"]["total"], 5);
    assert_eq!(summary["jobs"]["completed"], 1);
    assert_eq!(summary["jobs"]["failed"], 1);
    assert_eq!(summary["jobs"]["other"], 3);
    assert_eq!(summary["gpuUtilisation"]["cluster"]["gpus"], 16);
    // mnist: 2 GPUs × 100 s; bert: 4 GPUs × 50 s.
    assert_eq!(summary["gpuUtilisation"]["gpuSeconds"], 400.0);
    let window = summary["gpuUtilisation"]["windowSeconds"]
        .as_f64()
        .expect("window");
    let ratio = summary["gpuUtilisation"]["ratio"].as_f64().expect("ratio");
    assert!((ratio - 400.0 / (16.0 * window)).abs() < 1e-9, "{summary}");

    let (out, _, result) = trainyard(&client, &["summary", "-n", "ml-training"]).await;
    result.expect("summary");
    assert!(
        out.starts_with(
            "TrainingJobs in namespace ml-training: 5 (1 completed, 1 failed, 3 other)"
        ),
        "{out}"
    );
    assert!(
        out.contains("Cluster GPUs:    16 allocatable nvidia.com/gpu on 2 of 2 nodes"),
        "{out}"
    );
}

/// The watcher starts with a plain list, which the fake serves: enough for
/// `--until-done` to see a finished namespace, and for `--timeout` to fire on an
/// unfinished one (the fake cannot stream the changes in between).
#[tokio::test]
async fn until_done_exits_when_every_job_finished_and_times_out_otherwise() {
    let client = applied_examples(vec![]).await;
    for (name, state) in [
        ("advanced-training", "Completed"),
        ("bert-distributed", "Failed"),
        ("bert-idle", "Suspended"),
        ("gpt-resume", "Completed"),
        ("mnist-training", "Completed"),
    ] {
        set_status(&client, "ml-training", name, json!({"state": state})).await;
    }
    let args = [
        "get",
        "tj",
        "-n",
        "ml-training",
        "--until-done",
        "--timeout",
        "20",
    ];
    let (out, _, result) = trainyard(&client, &args).await;
    result.expect("all finished");
    assert_eq!(out.lines().count(), 6, "header and five rows: {out}");
    assert!(out.contains("bert-distributed    Failed"), "{out}");

    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Running"}),
    )
    .await;
    let args = [
        "get",
        "tj",
        "-n",
        "ml-training",
        "--until-done",
        "--timeout",
        "1",
    ];
    let (_, _, result) = trainyard(&client, &args).await;
    let message = result.expect_err("gpt-resume still runs").to_string();
    assert_eq!(
        message,
        "timed out after 1s: 1 of 5 trainingjobs in namespace ml-training not finished: gpt-resume (Running)"
    );

    let (_, _, result) = trainyard(
        &client,
        &["get", "tj", "-n", "empty", "--until-done", "--timeout", "1"],
    )
    .await;
    let message = result.expect_err("nothing to finish").to_string();
    assert!(
        message.contains("no trainingjobs in namespace empty exist yet"),
        "{message}"
    );
}

#[tokio::test]
async fn manifests_are_checked_before_connecting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, "apiVersion: trainyard.dev/v1\nkind: TrainingJob\nmetadata: {name: x}\nspec: {model: m, dataset: d, numWorkers: 0}\n").expect("write");
    let cli = Cli::try_parse_from(["trainyard", "apply", "-f", &path.display().to_string()])
        .expect("arguments parse");
    let no_cluster = async || -> Result<Client, CliError> { panic!("must not connect") };
    let result = trainyard_cli::run(cli, no_cluster, &mut Vec::new(), &mut Vec::new()).await;
    assert!(
        matches!(&result, Err(CliError::InvalidManifests(errors)) if errors.len() == 1),
        "{result:?}"
    );
}

#[tokio::test]
async fn suspend_resume_and_delete_change_jobs_by_name() {
    let client = applied_examples(Vec::new()).await;
    let jobs = Api::<TrainingJob>::namespaced(client.clone(), "ml-training");
    let suspended = |job: TrainingJob| job.spec.suspend;

    let (out, _, result) = trainyard(
        &client,
        &[
            "suspend",
            "mnist-training",
            "bert-distributed",
            "-n",
            "ml-training",
        ],
    )
    .await;
    result.expect("suspend");
    assert_eq!(
        out,
        "trainingjob.trainyard.dev/mnist-training suspended\ntrainingjob.trainyard.dev/bert-distributed suspended\n"
    );
    let job = jobs.get("mnist-training").await.expect("still there");
    assert_eq!(suspended(job), Some(true));

    let (out, _, result) =
        trainyard(&client, &["resume", "mnist-training", "-n", "ml-training"]).await;
    result.expect("resume");
    assert_eq!(out, "trainingjob.trainyard.dev/mnist-training resumed\n");
    let job = jobs.get("mnist-training").await.expect("still there");
    assert_eq!(suspended(job), Some(false));

    let (out, _, result) = trainyard(
        &client,
        &["delete", "tj", "mnist-training", "-n", "ml-training"],
    )
    .await;
    result.expect("delete");
    assert_eq!(out, "trainingjob.trainyard.dev/mnist-training deleted\n");
    assert!(jobs.get_opt("mnist-training").await.expect("get").is_none());

    let (_, _, result) = trainyard(
        &client,
        &["delete", "tj", "mnist-training", "-n", "ml-training"],
    )
    .await;
    let error = result.expect_err("already gone").to_string();
    assert!(
        error.starts_with("delete trainingjob.trainyard.dev/mnist-training:"),
        "{error}"
    );

    let (_, _, result) = trainyard(&client, &["suspend", "x", "-n", "Not_A_Namespace"]).await;
    assert!(result.is_err(), "a bad namespace is refused");
}

#[tokio::test]
async fn completion_scripts_name_the_subcommands() {
    let (client, _) = cluster(Vec::new()).await;
    for shell in ["bash", "zsh", "fish"] {
        let (out, _, result) = trainyard(&client, &["completion", shell]).await;
        result.expect("completion");
        for verb in ["apply", "get", "delete", "suspend", "resume"] {
            assert!(out.contains(verb), "{shell} completion lacks {verb}");
        }
    }
}

#[tokio::test]
async fn get_by_name_prints_one_object_as_yaml_or_its_name_and_names_what_is_missing() {
    let client = applied_examples(vec![]).await;
    let (out, _, result) = trainyard(
        &client,
        &[
            "get",
            "tj",
            "mnist-training",
            "-n",
            "ml-training",
            "-o",
            "yaml",
        ],
    )
    .await;
    result.expect("get yaml");
    let object: Value = yaml_serde::from_str(&out).expect("yaml");
    assert_eq!(
        object["kind"], "TrainingJob",
        "one object, not a List: {out}"
    );
    assert_eq!(object["metadata"]["name"], "mnist-training");

    let (out, _, result) = trainyard(
        &client,
        &[
            "get",
            "tj",
            "gpt-resume",
            "mnist-training",
            "-n",
            "ml-training",
            "-o",
            "name",
        ],
    )
    .await;
    result.expect("get names");
    assert_eq!(
        out,
        "trainingjob.trainyard.dev/gpt-resume\ntrainingjob.trainyard.dev/mnist-training\n"
    );

    let (_, _, result) = trainyard(&client, &["get", "tj", "nope", "-n", "ml-training"]).await;
    let error = result.expect_err("missing");
    assert_eq!(error.exit_code(), 3);
    assert_eq!(
        error.to_string(),
        "trainingjobs \"nope\" not found in namespace ml-training"
    );

    let (_, _, result) = trainyard(&client, &["get", "tj", "mnist-training", "-A"]).await;
    let error = result.expect_err("names need one namespace");
    assert_eq!(error.exit_code(), 2, "{error}");
    let (_, _, result) =
        trainyard(&client, &["get", "tj", "a", "b", "-w", "-n", "ml-training"]).await;
    assert!(matches!(result, Err(CliError::Usage(m)) if m.contains("watch one name")));
}

#[tokio::test]
async fn a_label_selector_keeps_only_the_jobs_it_matches() {
    let client = applied_examples(vec![]).await;
    let jobs = Api::<TrainingJob>::namespaced(client.clone(), "ml-training");
    let labelled = json!({"metadata": {"labels": {"team": "nlp"}}});
    jobs.patch(
        "gpt-resume",
        &PatchParams::default(),
        &Patch::Merge(&labelled),
    )
    .await
    .expect("labelled");
    let (out, _, result) = trainyard(
        &client,
        &[
            "get",
            "tj",
            "-n",
            "ml-training",
            "-l",
            "team=nlp",
            "-o",
            "name",
        ],
    )
    .await;
    result.expect("get by label");
    assert_eq!(out, "trainingjob.trainyard.dev/gpt-resume\n");
}

#[tokio::test]
async fn describe_and_explain_say_why_a_job_waits() {
    let client = applied_examples(vec![]).await;
    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Queued", "conditions": [{
            "type": "Admitted", "status": "False", "reason": "WaitingForQuota",
            "message": "position 2 in queue default: 16 of 16 GPUs in use"
        }], "queue": {"name": "default", "position": 2, "reason": "16 of 16 GPUs in use"}}),
    )
    .await;
    let (out, _, result) =
        trainyard(&client, &["explain", "gpt-resume", "-n", "ml-training"]).await;
    result.expect("explain");
    assert_eq!(
        out,
        "gpt-resume waits in TrainingQueue default, position 2: 16 of 16 GPUs in use\n"
    );

    let (out, _, result) = trainyard(
        &client,
        &["describe", "tj", "gpt-resume", "-n", "ml-training"],
    )
    .await;
    result.expect("describe");
    for expected in [
        "Name:         gpt-resume\n",
        "Namespace:    ml-training\n",
        "State:        Queued\n",
        "Queue:        default, position 2: 16 of 16 GPUs in use\n",
        "Spec:\n",
        "WaitingForQuota",
        "Events:\n",
    ] {
        assert!(out.contains(expected), "{expected:?} missing:\n{out}");
    }
    let (_, _, result) = trainyard(&client, &["describe", "tj", "nope", "-n", "ml-training"]).await;
    assert_eq!(result.expect_err("missing").exit_code(), 3);
}

#[tokio::test]
async fn get_describe_and_explain_show_a_job_no_node_could_hold_as_unschedulable() {
    let client = applied_examples(vec![]).await;
    let why = "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node \
               (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers";
    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Queued", "conditions": [
            {"type": "Admitted", "status": "False", "reason": "Unschedulable",
             "message": format!("position 2 in queue default: {why}")},
            {"type": "Schedulable", "status": "False", "reason": "Unschedulable", "message": why}
        ], "queue": {"name": "default", "position": 2, "reason": why}}),
    )
    .await;

    let (out, _, result) =
        trainyard(&client, &["get", "tj", "gpt-resume", "-n", "ml-training"]).await;
    result.expect("get");
    let row = out.lines().nth(1).unwrap_or_default();
    assert!(row.contains(" default UNSCHEDULABLE "), "{out}");
    assert!(!row.contains("#2"), "no place in line is shown: {out}");

    let (out, _, result) =
        trainyard(&client, &["explain", "gpt-resume", "-n", "ml-training"]).await;
    result.expect("explain");
    assert_eq!(
        out,
        format!("gpt-resume is UNSCHEDULABLE in TrainingQueue default: {why}\n")
    );

    let (out, _, result) = trainyard(
        &client,
        &["describe", "tj", "gpt-resume", "-n", "ml-training"],
    )
    .await;
    result.expect("describe");
    let queue_line = format!("Queue:        default, UNSCHEDULABLE: {why}\n");
    for expected in [queue_line.as_str(), "Schedulable", "Unschedulable"] {
        assert!(out.contains(expected), "{expected:?} missing:\n{out}");
    }
}

#[tokio::test]
async fn get_fills_a_jsonpath_template_from_the_list_or_the_named_object() {
    let client = applied_examples(vec![]).await;
    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Queued", "queue": {"name": "default", "position": 2}}),
    )
    .await;
    let (out, _, result) = trainyard(
        &client,
        &[
            "get",
            "tj",
            "-n",
            "ml-training",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}{"\t"}{.spec.numWorkers}{"\n"}{end}"#,
        ],
    )
    .await;
    result.expect("get");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(rows.contains(&"gpt-resume\t4"), "{out}");
    assert!(out.ends_with('\n'), "the template's own newline ends it");

    let (out, _, result) = trainyard(
        &client,
        &[
            "get",
            "tj",
            "gpt-resume",
            "-n",
            "ml-training",
            "-o",
            "jsonpath={.metadata.name} waits at {.status.queue.position} in {.status.queue.name}",
        ],
    )
    .await;
    result.expect("get one");
    assert_eq!(
        out, "gpt-resume waits at 2 in default",
        "nothing added after it"
    );

    let (out, _, result) = trainyard(
        &client,
        &["get", "tq", "-o", "jsonpath={.items[0].metadata.name}"],
    )
    .await;
    result.expect("get queues");
    assert_eq!(out, "seeded-queue");

    let refused = Cli::try_parse_from([
        "trainyard",
        "get",
        "tj",
        "-o",
        "jsonpath={range .items[*]}{.x}",
    ])
    .expect_err("an unclosed range is refused");
    assert_eq!(refused.exit_code(), 2);
    assert!(
        refused
            .to_string()
            .contains("jsonpath template: {range ...} without its {end} at position 1"),
        "{refused}"
    );
}

#[tokio::test]
async fn kubeconfig_and_context_flags_choose_the_cluster_and_its_namespace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: first\n\
         clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n\
         users:\n- name: u\n  user:\n    token: t\n\
         contexts:\n- name: first\n  context: {cluster: c, user: u, namespace: one}\n\
         - name: second\n  context: {cluster: c, user: u, namespace: two}\n",
    )
    .expect("kubeconfig written");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = |context: Option<&str>| trainyard_cli::cli::ClusterArgs {
        kubeconfig: Some(path.clone()),
        context: context.map(str::to_owned),
    };
    let current = trainyard_cli::connect(&args(None)).await.expect("current");
    assert_eq!(current.default_namespace(), "one");
    let second = trainyard_cli::connect(&args(Some("second")))
        .await
        .expect("second");
    assert_eq!(second.default_namespace(), "two");
    let Err(error) = trainyard_cli::connect(&args(Some("third"))).await else {
        panic!("a context the kubeconfig lacks is refused");
    };
    assert!(error.to_string().contains("third"), "{error}");
}

#[tokio::test]
async fn cost_reports_what_the_jobs_status_says_they_cost() {
    let client = applied_examples(vec![]).await;
    set_status(
        &client,
        "ml-training",
        "mnist-training",
        json!({"state": "Running", "cost": {"accrued": 3.25, "estimated": 9.0, "currency": "USD",
                                            "gpuSeconds": 7200.0, "capacityType": "spot"}}),
    )
    .await;
    set_status(
        &client,
        "ml-training",
        "gpt-resume",
        json!({"state": "Running", "cost": {"accrued": 1.75, "currency": "USD", "gpuSeconds": 3600.0}}),
    )
    .await;

    let (out, _, result) = trainyard(
        &client,
        &[
            "cost",
            "--by",
            "namespace",
            "-n",
            "ml-training",
            "-o",
            "csv",
        ],
    )
    .await;
    result.expect("cost");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "NAMESPACE,JOBS,GPU-HOURS,ACCRUED,ESTIMATED,CURRENCY"
    );
    let expected_jobs = Api::<TrainingJob>::namespaced(client.clone(), "ml-training")
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .len();
    assert_eq!(
        lines[1],
        format!("ml-training,{expected_jobs},3.00,5.00,10.75,USD")
    );

    let (out, _, result) = trainyard(&client, &["cost", "-n", "ml-training", "-o", "json"]).await;
    result.expect("cost by job");
    let rows: Value = serde_json::from_str(&out).expect("JSON");
    let mnist = rows
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["group"] == "ml-training/mnist-training")
        })
        .expect("a row for the job");
    assert_eq!(mnist["accrued"], json!(3.25));
    assert_eq!(mnist["gpuHours"], json!(2.0));
}

#[tokio::test]
async fn tensorboard_prints_how_to_open_a_jobs_logs_and_says_why_a_job_has_none() {
    let client = applied_examples(vec![]).await;
    let (out, _, result) = trainyard(
        &client,
        &[
            "tensorboard",
            "advanced-training",
            "-n",
            "ml-training",
            "--port",
            "7007",
        ],
    )
    .await;
    result.expect("tensorboard");
    assert!(
        out.ends_with(
            "tensorboard --logdir s3://ml-checkpoints/ml-training/advanced-training/tensorboard --port 7007\n"
        ),
        "logs in the job's checkpoint bucket: {out}"
    );

    let (_, _, result) = trainyard(
        &client,
        &["tensorboard", "mnist-training", "-n", "ml-training"],
    )
    .await;
    let error = result.expect_err("no TensorBoard logs");
    assert_eq!(error.exit_code(), 2, "{error}");
    assert!(
        error
            .to_string()
            .contains("set spec.monitoring.tensorboardEnabled: true"),
        "{error}"
    );

    let (_, _, result) = trainyard(&client, &["tensorboard", "nowhere", "-n", "ml-training"]).await;
    assert_eq!(result.expect_err("missing").exit_code(), 3);
}
