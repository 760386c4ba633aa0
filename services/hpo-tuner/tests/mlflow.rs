//! Experiment tracking against a real MLflow tracking server on loopback
//! (`pip install mlflow`). Skipped, with a message, only when no `mlflow`
//! executable is on PATH.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJobState;
use trainyard_contracts::EntityRef;
use trainyard_contracts::lifecycle::TrainingJobFinalized;
use trainyard_hpo_tuner::TunerConfig;
use trainyard_hpo_tuner::spec::parameter_text;
use trainyard_mlflow::{Batch, Metric, MlflowClient, RetryPolicy, RunStatus};
use trainyard_testkit::{MlflowServer, NatsServer, mlflow_executable};

/// Reads through MLflow's own REST API, independently of the client under test.
struct Reader {
    http: reqwest::Client,
}

impl Reader {
    async fn get(&self, url: &str, query: &[(&str, &str)]) -> Value {
        let response = self.http.get(url).query(query).send().await.expect("GET");
        assert!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        response.json().await.expect("JSON")
    }

    async fn post(&self, url: &str, body: Value) -> Value {
        let response = self.http.post(url).json(&body).send().await.expect("POST");
        assert!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        response.json().await.expect("JSON")
    }

    async fn history(&self, server: &MlflowServer, run_id: &str, key: &str) -> Vec<(i64, f64)> {
        let body = self
            .get(
                &server.api("metrics/get-history"),
                &[
                    ("run_id", run_id),
                    ("metric_key", key),
                    ("max_results", "25000"),
                ],
            )
            .await;
        let mut points: Vec<(i64, f64)> = body["metrics"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|p| {
                        (
                            p["step"].as_i64().unwrap_or_default(),
                            p["value"].as_f64().unwrap_or(f64::NAN),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        points.sort_by_key(|p| p.0);
        points
    }

    async fn runs(&self, server: &MlflowServer, experiment_id: &str) -> Vec<Value> {
        let body = self
            .post(
                &server.api("runs/search"),
                json!({"experiment_ids": [experiment_id], "max_results": 100}),
            )
            .await;
        body["runs"].as_array().cloned().unwrap_or_default()
    }
}

fn pairs_of(run: &Value, kind: &str) -> BTreeMap<String, String> {
    run["data"][kind]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    (
                        i["key"].as_str().unwrap_or_default().to_string(),
                        i["value"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trials_are_recorded_in_mlflow() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED trials_are_recorded_in_mlflow: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let server = MlflowServer::start(executable);
    let reader = Reader {
        http: reqwest::Client::new(),
    };
    client_round_trip(&server, &reader).await;
    tuner_records_a_sweep(&server, &reader).await;
    tuner_records_standalone_jobs(&server, &reader).await;
}

/// The client on its own: idempotent experiments, batching past MLflow's
/// limits, metric history, status.
async fn client_round_trip(server: &MlflowServer, reader: &Reader) {
    let client = MlflowClient::new(
        &server.url(),
        Duration::from_secs(30),
        RetryPolicy::default(),
        CancellationToken::new(),
    )
    .expect("client");
    let tags = vec![("trainyard.namespace".to_string(), "ml".to_string())];
    let first = client
        .get_or_create_experiment("ml/client-check", &tags)
        .await
        .expect("created");
    let again = client
        .get_or_create_experiment("ml/client-check", &tags)
        .await
        .expect("found");
    assert_eq!(first, again, "get-or-create finds the experiment it made");
    let run = client
        .create_run(&first, "client-check-t0000", 1_700_000_000_000, &tags)
        .await
        .expect("run");
    let batch = Batch {
        metrics: (0..1500)
            .map(|step| Metric {
                key: "loss".into(),
                value: 1.0 / f64::from(step + 1),
                timestamp_ms: 1_700_000_000_000 + i64::from(step),
                step: i64::from(step),
            })
            .collect(),
        params: (0..150).map(|i| (format!("p{i}"), i.to_string())).collect(),
        tags: (0..120).map(|i| (format!("t{i}"), i.to_string())).collect(),
    };
    client.log_batch(&run, batch.clone()).await.expect("logged");
    // Logging the same again is accepted (params are immutable but identical).
    client.log_batch(&run, batch).await.expect("logged twice");
    client
        .update_run(&run, RunStatus::Finished, Some(1_700_000_100_000))
        .await
        .expect("updated");

    let got = reader
        .get(&server.api("runs/get"), &[("run_id", run.as_str())])
        .await;
    assert_eq!(got["run"]["info"]["status"], "FINISHED");
    assert_eq!(got["run"]["info"]["end_time"], 1_700_000_100_000i64);
    let params = pairs_of(&got["run"], "params");
    assert_eq!(params.len(), 150);
    assert_eq!(params["p149"], "149");
    let tags = pairs_of(&got["run"], "tags");
    assert_eq!(tags["t119"], "119");
    let history = reader.history(server, &run, "loss").await;
    assert_eq!(history.len(), 1500, "every point once, none twice");
    assert_eq!(history[0], (0, 1.0));
    assert_eq!(history[1499].0, 1499);
}

/// The tuner records a sweep: one experiment, one run per trial with params,
/// tags, metric history by epoch and the final status.
async fn tuner_records_a_sweep(server: &MlflowServer, reader: &Reader) {
    let nats = NatsServer::start();
    let config = TunerConfig {
        mlflow_tracking_uri: Some(server.url()),
        ..TunerConfig::default()
    };
    let tuner = start_tuner(&nats, config.clone()).await;
    let driver = Driver::connect(&nats).await;
    let sweep = sweep_object(
        "tracked",
        "uid-tracked",
        json!({
            "objective": {"metric": "accuracy", "direction": "maximize"},
            "parameters": [
                {"name": "learningRate", "type": "float", "min": 0.001, "max": 0.1, "log": true},
                {"name": "batchSize", "type": "int", "min": 16, "max": 64, "step": 16},
                {"name": "optimizer", "type": "categorical", "values": ["adam", "sgd"]},
            ],
            "parallelTrialCount": 3,
            "maxTrialCount": 3,
            "earlyStopping": {"algorithm": "asha", "minResource": 1, "maxResource": 3, "reductionFactor": 3},
            "trialTemplate": template(),
        }),
    );
    driver.apply_sweep(&sweep).await;
    let requests = eventually("three trials", 20, || async {
        let requests = driver.trial_requests("tracked").await;
        (requests.len() == 3).then_some(requests)
    })
    .await;
    let names: Vec<String> = requests.iter().map(|r| r.trial_name.clone()).collect();

    // t0 completes, t1 falls below the rung and is stopped, t2 fails.
    driver
        .transition(&names[0], "job-0", TrainingJobState::Running)
        .await;
    let mut reports = Vec::new();
    for (epoch, accuracy) in [(1, 0.9), (2, 0.92), (3, 0.95)] {
        reports.push(
            driver
                .progress(
                    &names[0],
                    "job-0",
                    epoch,
                    &[("accuracy", accuracy), ("loss", 1.0 - accuracy)],
                )
                .await,
        );
    }
    // A redelivered report is recorded once.
    driver.republish(&reports[1], "again").await;
    driver
        .transition(&names[0], "job-0", TrainingJobState::Completed)
        .await;
    driver
        .transition(&names[1], "job-1", TrainingJobState::Running)
        .await;
    driver
        .progress(&names[1], "job-1", 1, &[("accuracy", 0.4)])
        .await;
    driver
        .transition(&names[2], "job-2", TrainingJobState::Failed)
        .await;
    let finished = driver.finished("tracked", 30).await;
    assert_eq!(
        finished.finished_reason.as_deref(),
        Some("MaxTrialsReached")
    );
    assert_eq!(
        (finished.succeeded, finished.early_stopped, finished.failed),
        (1, 1, 1)
    );

    let experiment = reader
        .get(
            &server.api("experiments/get-by-name"),
            &[("experiment_name", "ml/tracked")],
        )
        .await;
    let experiment_id = experiment["experiment"]["experiment_id"]
        .as_str()
        .expect("experiment id")
        .to_string();
    let experiment_tags = pairs_of(
        &json!({"data": {"tags": experiment["experiment"]["tags"]}}),
        "tags",
    );
    assert_eq!(experiment_tags["trainyard.sweep_uid"], "uid-tracked");

    let expected_status = ["FINISHED", "KILLED", "FAILED"];
    let runs = eventually("three runs with their final status", 60, || async {
        let runs = reader.runs(server, &experiment_id).await;
        let by_name: BTreeMap<String, Value> = runs
            .into_iter()
            .map(|r| {
                (
                    r["info"]["run_name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    r,
                )
            })
            .collect();
        let done = names.iter().zip(expected_status).all(|(name, status)| {
            by_name
                .get(name)
                .is_some_and(|r| r["info"]["status"] == status)
        });
        (by_name.len() == 3 && done).then_some(by_name)
    })
    .await;
    for (i, request) in requests.iter().enumerate() {
        let run = &runs[&request.trial_name];
        let params = pairs_of(run, "params");
        let expected: BTreeMap<String, String> = request
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), parameter_text(v)))
            .collect();
        assert_eq!(params, expected, "{} params", request.trial_name);
        let tags = pairs_of(run, "tags");
        assert_eq!(tags["trainyard.namespace"], "ml");
        assert_eq!(tags["trainyard.name"], request.trial_name);
        assert_eq!(tags["trainyard.sweep"], "tracked");
        assert_eq!(tags["trainyard.uid"], format!("job-{i}"));
        assert!(run["info"]["end_time"].as_i64().is_some(), "ended");
        // The run existed before the trial was asked for, and the request
        // names it: the trial's workers log into it (MLFLOW_RUN_ID), and the
        // tracker recorded into the same run rather than a second one.
        let tracking = request
            .tracking
            .as_ref()
            .expect("the request names the run");
        assert_eq!(tracking.mlflow_tracking_uri, server.url());
        assert_eq!(
            tracking.mlflow_run_id,
            run["info"]["run_id"].as_str().unwrap_or_default(),
            "{}",
            request.trial_name
        );
    }
    let t0 = runs[&names[0]]["info"]["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    assert_eq!(
        reader.history(server, &t0, "accuracy").await,
        vec![(1, 0.9), (2, 0.92), (3, 0.95)]
    );
    assert_eq!(reader.history(server, &t0, "loss").await.len(), 3);
    let t1 = runs[&names[1]]["info"]["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    assert_eq!(
        reader.history(server, &t1, "accuracy").await,
        vec![(1, 0.4)]
    );

    // A restarted tuner finds the runs it made instead of making new ones.
    stop_tuner(tuner).await;
    let tuner = start_tuner(&nats, config).await;
    driver.republish(&reports[2], "after-restart").await;
    driver
        .progress(&names[0], "job-0", 4, &[("accuracy", 0.96)])
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(reader.runs(server, &experiment_id).await.len(), 3);
    assert_eq!(
        reader.history(server, &t0, "accuracy").await,
        vec![(1, 0.9), (2, 0.92), (3, 0.95), (4, 0.96)],
        "late reports are still recorded, repeats are not"
    );
    assert_eq!(metric(&tuner, "trainyard_tuner_mlflow_errors_total"), 0.0);
    stop_tuner(tuner).await;
}

/// The experiment's id, once it exists.
async fn experiment_id(server: &MlflowServer, reader: &Reader, name: &str) -> Option<String> {
    let response = reader
        .http
        .get(server.api("experiments/get-by-name"))
        .query(&[("experiment_name", name)])
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body: Value = response.json().await.ok()?;
    body["experiment"]["experiment_id"]
        .as_str()
        .map(str::to_string)
}

/// Runs of an experiment by run name; fails on a repeated name.
async fn runs_by_name(
    server: &MlflowServer,
    reader: &Reader,
    experiment_id: &str,
) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for run in reader.runs(server, experiment_id).await {
        let name = run["info"]["run_name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            out.insert(name.clone(), run).is_none(),
            "two runs named {name}"
        );
    }
    out
}

/// Standalone TrainingJobs (not trials): one experiment named after the
/// namespace, one run per job with its tags, metric history by epoch and final
/// status; a restarted tuner keeps using the runs it made.
async fn tuner_records_standalone_jobs(server: &MlflowServer, reader: &Reader) {
    let nats = NatsServer::start();
    let config = TunerConfig {
        mlflow_tracking_uri: Some(server.url()),
        ..TunerConfig::default()
    };
    assert!(config.mlflow_track_standalone_jobs, "on by default");
    let tuner = start_tuner(&nats, config.clone()).await;
    let driver = Driver::connect(&nats).await;

    // bert: runs 3 epochs (suspended and resumed in between) and completes.
    driver
        .transition("bert", "uid-bert", TrainingJobState::Running)
        .await;
    let losses = [(1, 0.9), (2, 0.5), (3, 0.25)];
    for (epoch, loss) in losses {
        driver
            .progress("bert", "uid-bert", epoch, &[("loss", loss)])
            .await;
        if epoch == 1 {
            driver
                .transition("bert", "uid-bert", TrainingJobState::Suspended)
                .await;
            driver
                .transition("bert", "uid-bert", TrainingJobState::Running)
                .await;
        }
    }
    driver
        .transition("bert", "uid-bert", TrainingJobState::Completed)
        .await;
    // gpt: starts, reports an epoch; finishes after the tuner restarted.
    driver
        .transition("gpt", "uid-gpt", TrainingJobState::Running)
        .await;
    driver.progress("gpt", "uid-gpt", 1, &[("loss", 2.0)]).await;
    // llama: deleted while running.
    driver
        .transition("llama", "uid-llama", TrainingJobState::Running)
        .await;
    driver
        .publish(
            EntityRef::new(NS, "llama", "uid-llama"),
            TrainingJobFinalized {
                last_state: Some(TrainingJobState::Running),
            },
        )
        .await;

    let experiment = eventually("the namespace's experiment", 60, || {
        experiment_id(server, reader, NS)
    })
    .await;
    let runs = eventually("bert finished with 3 points, llama killed", 60, || async {
        let runs = runs_by_name(server, reader, &experiment).await;
        let bert = runs.get("ml/bert")?;
        let llama = runs.get("ml/llama")?;
        let gpt = runs.get("ml/gpt")?;
        let bert_id = bert["info"]["run_id"].as_str()?;
        let gpt_id = gpt["info"]["run_id"].as_str()?;
        let done = bert["info"]["status"] == "FINISHED"
            && llama["info"]["status"] == "KILLED"
            && reader.history(server, bert_id, "loss").await.len() == 3
            && reader.history(server, gpt_id, "loss").await.len() == 1;
        done.then_some(runs)
    })
    .await;
    assert_eq!(runs.len(), 3, "one run per job: {:?}", runs.keys());
    let bert = &runs["ml/bert"];
    let tags = pairs_of(bert, "tags");
    assert_eq!(tags["trainyard.namespace"], "ml");
    assert_eq!(tags["trainyard.name"], "bert");
    assert_eq!(tags["trainyard.uid"], "uid-bert");
    assert_eq!(tags["trainyard.kind"], "TrainingJob");
    assert!(bert["info"]["end_time"].as_i64().is_some(), "ended");
    let bert_id = bert["info"]["run_id"].as_str().expect("run id").to_string();
    let expected: Vec<(i64, f64)> = losses.iter().map(|(e, l)| (i64::from(*e), *l)).collect();
    assert_eq!(reader.history(server, &bert_id, "loss").await, expected);
    assert_eq!(runs["ml/gpt"]["info"]["status"], "RUNNING");
    // Trials are not standalone jobs: the sweep's runs stay in their own experiment.
    assert!(runs.keys().all(|name| !name.contains("-t0")));

    // A restarted tuner goes on with the runs it made.
    stop_tuner(tuner).await;
    let tuner = start_tuner(&nats, config).await;
    driver.progress("gpt", "uid-gpt", 2, &[("loss", 1.0)]).await;
    driver
        .transition("gpt", "uid-gpt", TrainingJobState::Failed)
        .await;
    // bert is deleted after it completed: its run stays FINISHED.
    driver
        .publish(
            EntityRef::new(NS, "bert", "uid-bert"),
            TrainingJobFinalized {
                last_state: Some(TrainingJobState::Completed),
            },
        )
        .await;
    let runs = eventually("gpt failed with 2 points", 60, || async {
        let runs = runs_by_name(server, reader, &experiment).await;
        let gpt = runs.get("ml/gpt")?;
        let gpt_id = gpt["info"]["run_id"].as_str()?;
        let done = gpt["info"]["status"] == "FAILED"
            && reader.history(server, gpt_id, "loss").await == vec![(1, 2.0), (2, 1.0)];
        done.then_some(runs)
    })
    .await;
    assert_eq!(runs.len(), 3, "no second run after the restart");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let bert = reader
        .get(&server.api("runs/get"), &[("run_id", bert_id.as_str())])
        .await;
    assert_eq!(bert["run"]["info"]["status"], "FINISHED");
    assert_eq!(metric(&tuner, "trainyard_tuner_mlflow_errors_total"), 0.0);
    stop_tuner(tuner).await;
}
