//! `trainyard` against the simulated cluster's API server (with its controllers
//! running, so Jobs get pods whose workers train and write logs): `apply` of
//! files mixing Trainyard's kinds with built-in ones, found by discovery, and
//! `logs` of a TrainingJob's workers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJob;
use trainyard_api::placement::{LABEL_ATTEMPT, LABEL_JOB};
use trainyard_cli::cli::Cli;
use trainyard_cli::error::CliError;
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::runner::Simulator;

const NS: &str = "ml";
/// Bound on waiting for the simulated cluster (never reached when things work).
const DEADLINE: Duration = Duration::from_secs(60);

/// One 8-GPU node whose workers start at once; 20 simulated seconds a real one,
/// so a 1-second epoch takes 50 ms.
const CLUSTER: &str = "speed: 20\ntickMilliseconds: 20\nnodes: [{name: n, gpus: 8}]\nworkers: {secondsPerEpoch: 1, startDelaySeconds: 0}";

struct Cluster {
    client: Client,
    shutdown: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Cluster {
    async fn start() -> Self {
        // kube links rustls; name the crypto provider as the binary does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shutdown = CancellationToken::new();
        let config = ClusterConfig::parse(CLUSTER).expect("valid cluster");
        let simulator = Simulator::start(config, "127.0.0.1:0", None, shutdown.clone())
            .await
            .expect("the simulator starts");
        let url = format!("http://{}", simulator.address)
            .parse()
            .expect("server url");
        let mut config = kube::Config::new(url);
        config.default_namespace = NS.to_owned();
        let client = Client::try_from(config).expect("kube client");
        Self { client, shutdown }
    }

    /// Runs `trainyard <args>`; returns stdout and the result.
    async fn trainyard(&self, args: &[&str]) -> (String, Result<(), CliError>) {
        let cli = Cli::try_parse_from(std::iter::once("trainyard").chain(args.iter().copied()))
            .expect("arguments parse");
        let mut out = Vec::new();
        let mut err = Vec::new();
        let client = self.client.clone();
        let run = trainyard_cli::run(cli, async move || Ok(client), &mut out, &mut err);
        let result = tokio::time::timeout(DEADLINE, run)
            .await
            .unwrap_or_else(|_| panic!("trainyard {args:?} did not finish"));
        (String::from_utf8_lossy(&out).into_owned(), result)
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (out, result) = self.trainyard(args).await;
        if let Err(error) = result {
            panic!("trainyard {args:?} failed: {error}\n{out}");
        }
        out
    }

    /// A TrainingJob with this state, and, when `epochs` is given, the Indexed Job
    /// the planner would have made for it, whose workers the simulator runs.
    async fn training_job(&self, name: &str, state: &str, workers: u32, epochs: Option<u32>) {
        let text = std::fs::read_to_string(examples().join("trainingjob-simple.yaml"))
            .expect("example exists");
        let mut job: TrainingJob = yaml_serde::from_str(&text).expect("example parses");
        job.metadata.name = Some(name.to_owned());
        job.metadata.namespace = Some(NS.to_owned());
        let jobs: Api<TrainingJob> = Api::namespaced(self.client.clone(), NS);
        jobs.create(&PostParams::default(), &job)
            .await
            .expect("trainingjob created");
        jobs.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": state}})),
        )
        .await
        .expect("status set");
        let Some(epochs) = epochs else {
            return;
        };
        let config = format!("{name}-config");
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), NS);
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": config},
            "data": {
                "hyperparameters.json": format!("{{\"epochs\": {epochs}}}"),
                "training-config.json": "{\"model\": \"cnn\"}",
            },
        }))
        .expect("a ConfigMap");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("configmap created");
        let batch: Job = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-a0"), "labels": {LABEL_JOB: name}},
            "spec": {
                "completions": workers,
                "parallelism": workers,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {LABEL_JOB: name, LABEL_ATTEMPT: "0"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "worker",
                            "image": "trainer",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": config}}],
                    },
                },
            },
        }))
        .expect("a Job");
        Api::<Job>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &batch)
            .await
            .expect("job created");
    }

    /// Waits until every worker pod of `name` is in `phase` (polling the API).
    async fn wait_for_pods(&self, name: &str, workers: usize, phase: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let selector = format!("{LABEL_JOB}={name}");
        let waited = tokio::time::timeout(DEADLINE, async {
            loop {
                let listed = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .expect("pods listed");
                let in_phase = listed
                    .items
                    .iter()
                    .filter(|pod| {
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)
                    })
                    .count();
                if in_phase == workers {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "the workers of {name} never were {phase}");
    }
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write manifest");
    path.display().to_string()
}

const MIXED: &str = "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 10Gi}}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: fast
---
apiVersion: trainyard.dev/v1
kind: TrainingJob
metadata:
  name: mnist
spec:
  model: cnn
  dataset: mnist
  numWorkers: 1
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-b
  namespace: ignored
";

#[tokio::test(flavor = "multi_thread")]
async fn apply_sends_built_in_kinds_to_the_resource_and_scope_discovery_names() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "mixed.yaml", MIXED);
    let out = cluster.ok(&["apply", "-f", &file]).await;
    assert_eq!(
        out,
        "persistentvolumeclaim/data created\nconfigmap/settings created\ntrainingjob.trainyard.dev/mnist created\nnamespace/team-b created\n"
    );
    let claim = Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), NS)
        .get("data")
        .await
        .expect("the claim is in the client's namespace");
    assert_eq!(
        claim.spec.and_then(|s| s.access_modes),
        Some(vec!["ReadWriteOnce".to_owned()])
    );
    let settings = Api::<ConfigMap>::namespaced(cluster.client.clone(), NS)
        .get("settings")
        .await
        .expect("the ConfigMap");
    assert_eq!(
        settings
            .data
            .and_then(|d| d.get("mode").cloned())
            .as_deref(),
        Some("fast")
    );
    let namespace = Api::<Namespace>::all(cluster.client.clone())
        .get("team-b")
        .await
        .expect("the Namespace, cluster-scoped");
    assert_eq!(namespace.metadata.namespace, None);
    Api::<TrainingJob>::namespaced(cluster.client.clone(), NS)
        .get("mnist")
        .await
        .expect("the TrainingJob");

    let again = cluster.ok(&["apply", "-f", &file]).await;
    assert_eq!(
        again,
        "persistentvolumeclaim/data unchanged\nconfigmap/settings unchanged\ntrainingjob.trainyard.dev/mnist unchanged\nnamespace/team-b unchanged\n"
    );
    let changed = write(
        dir.path(),
        "changed.yaml",
        &MIXED.replace("mode: fast", "mode: slow"),
    );
    let out = cluster.ok(&["apply", "-f", &changed, "-n", "other"]).await;
    assert!(out.contains("configmap/settings created"), "{out}");
    let out = cluster.ok(&["apply", "-f", &changed]).await;
    assert!(out.contains("configmap/settings configured"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_sweep_applies_with_its_volume_claim_in_one_command() {
    let cluster = Cluster::start().await;
    let claim = examples().join("sweep-checkpoints.yaml");
    let sweep = examples().join("sweep.yaml");
    let out = cluster
        .ok(&[
            "apply",
            "-f",
            &claim.display().to_string(),
            "-f",
            &sweep.display().to_string(),
        ])
        .await;
    assert_eq!(
        out,
        "persistentvolumeclaim/sweep-checkpoints created\nsweep.trainyard.dev/bert-finetune-sweep created\n"
    );
    Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), "ml-training")
        .get("sweep-checkpoints")
        .await
        .expect("the claim the sweep's trials name");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_applies_like_its_files_the_claim_before_the_sweep() {
    let cluster = Cluster::start().await;
    let directory = examples().display().to_string();
    let out = cluster.ok(&["apply", "-f", &directory]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    let claim = lines
        .iter()
        .position(|l| *l == "persistentvolumeclaim/sweep-checkpoints created");
    let sweep = lines
        .iter()
        .position(|l| *l == "sweep.trainyard.dev/bert-finetune-sweep created");
    assert!(claim.is_some() && claim < sweep, "{out}");
    // No namespace in the manifest and no -n: the client's default namespace.
    Api::<TrainingJob>::namespaced(cluster.client.clone(), NS)
        .get("gpt-resume")
        .await
        .expect("in the default namespace");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kind_the_cluster_does_not_serve_is_named_and_nothing_is_applied() {
    let cluster = Cluster::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(
        dir.path(),
        "bad.yaml",
        &format!(
            "{MIXED}---\napiVersion: v1\nkind: ConfigMapp\nmetadata: {{name: typo}}\n---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: w}}\n"
        ),
    );
    let (out, result) = cluster.trainyard(&["apply", "-f", &file]).await;
    let error = result.expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "{file}: document 5 (ConfigMapp \"typo\"): the cluster serves no kind ConfigMapp in apiVersion v1"
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "{file}: document 6 (Widget \"w\"): the cluster does not serve apiVersion example.com/v1"
        )),
        "{message}"
    );
    assert!(
        message.ends_with(
            "nothing was applied: the cluster does not serve the kind of the 2 document(s) above"
        ),
        "{message}"
    );
    assert_eq!(out, "");
    let settings = Api::<ConfigMap>::namespaced(cluster.client.clone(), NS)
        .get_opt("settings")
        .await
        .expect("read");
    assert!(settings.is_none(), "nothing of the file was applied");
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_print_rank_zero_every_rank_or_the_tail_of_a_finished_job() {
    let cluster = Cluster::start().await;
    cluster.training_job("done", "Running", 2, Some(3)).await;
    cluster.wait_for_pods("done", 2, "Succeeded").await;

    let rank_zero = cluster.ok(&["logs", "done"]).await;
    let lines: Vec<&str> = rank_zero.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("rank 0/2: training cnn for 3 epochs, starting at epoch 0")
    );
    let epochs: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("epoch "))
        .collect();
    assert_eq!(epochs.len(), 3, "{rank_zero}");
    assert!(epochs[2].starts_with("epoch 3/3 step 300 "), "{rank_zero}");
    assert!(epochs[2].contains(" loss="), "{rank_zero}");
    assert_eq!(
        lines.last().copied(),
        Some("training finished at epoch 3/3: exiting with code 0")
    );

    let rank_one = cluster.ok(&["logs", "done", "--rank", "1", "-n", NS]).await;
    assert!(rank_one.starts_with("rank 1/2: "), "{rank_one}");

    let all = cluster.ok(&["logs", "done", "--all"]).await;
    let all: Vec<&str> = all.lines().collect();
    assert_eq!(all.len(), 2 * lines.len(), "{all:?}");
    assert_eq!(
        all[0],
        "[rank 0] rank 0/2: training cnn for 3 epochs, starting at epoch 0"
    );
    assert!(
        all[lines.len()..]
            .iter()
            .all(|l| l.starts_with("[rank 1] ")),
        "{all:?}"
    );

    assert_eq!(
        cluster.ok(&["logs", "done", "--tail", "1"]).await,
        "training finished at epoch 3/3: exiting with code 0\n"
    );
    assert_eq!(
        cluster.ok(&["logs", "done", "--all", "--tail", "1"]).await,
        "[rank 0] training finished at epoch 3/3: exiting with code 0\n[rank 1] training finished at epoch 3/3: exiting with code 0\n"
    );
    let stamped = cluster
        .ok(&["logs", "done", "--tail", "1", "--timestamps"])
        .await;
    assert!(
        stamped.ends_with("Z training finished at epoch 3/3: exiting with code 0\n"),
        "{stamped}"
    );

    let (_, result) = cluster.trainyard(&["logs", "done", "--rank", "2"]).await;
    let error = result.expect_err("no rank 2");
    assert_eq!(
        error.to_string(),
        "trainingjob \"done\" has no worker of rank 2: its workers have ranks 0, 1"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_followed_log_streams_until_the_worker_exits() {
    let cluster = Cluster::start().await;
    // 40 epochs of a simulated second: two real seconds of training.
    cluster.training_job("live", "Running", 1, Some(40)).await;
    cluster.wait_for_pods("live", 1, "Running").await;
    let followed = cluster.ok(&["logs", "live", "-f"]).await;
    let lines: Vec<&str> = followed.lines().collect();
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("epoch ")).count(),
        40,
        "{followed}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("training finished at epoch 40/40: exiting with code 0")
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    let listed = pods
        .list(&ListParams::default().labels(&format!("{LABEL_JOB}=live")))
        .await
        .expect("pods listed");
    assert_eq!(
        listed.items[0]
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref()),
        Some("Succeeded"),
        "the follow ended because the worker did"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn logs_of_a_job_without_workers_say_its_state() {
    let cluster = Cluster::start().await;
    cluster.training_job("waiting", "Queued", 1, None).await;
    let (out, result) = cluster.trainyard(&["logs", "waiting"]).await;
    let error = result.expect_err("no pods");
    assert_eq!(error.exit_code(), 1);
    let message = error.to_string();
    assert!(
        message.starts_with(
            "trainingjob \"waiting\" in namespace ml: no worker pods: job is Queued; "
        ),
        "{message}"
    );
    assert!(message.contains("trainyard explain waiting"), "{message}");
    assert_eq!(out, "");

    let (_, result) = cluster.trainyard(&["logs", "nobody"]).await;
    let error = result.expect_err("no such job");
    assert_eq!(error.exit_code(), 3);
    assert_eq!(
        error.to_string(),
        "trainingjobs \"nobody\" not found in namespace ml"
    );
}
