//! The tuner against a real NATS server: bad input is dead-lettered with a
//! reason that names the field, a sweep runs through early stopping and
//! deletion, and an unreachable MLflow never holds a sweep up.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJobState;
use trainyard_hpo_tuner::TunerConfig;
use trainyard_mlflow::{MlflowClient, MlflowError, RetryPolicy};
use trainyard_testkit::NatsServer;

fn spec(parameters: serde_json::Value) -> serde_json::Value {
    json!({
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "parameters": parameters,
        "parallelTrialCount": 2,
        "maxTrialCount": 4,
        "trialTemplate": template(),
    })
}

fn reason_of(letter: &serde_json::Value) -> &str {
    letter["reason"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_sweep_is_dead_lettered_with_the_field_named() {
    let nats = NatsServer::start();
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let driver = Driver::connect(&nats).await;

    // Breaks a CRD rule (min must be below max).
    let bad_range = sweep_object(
        "bad-range",
        "uid-1",
        spec(json!([{"name": "lr", "type": "float", "min": 1.0, "max": 0.5}])),
    );
    driver.apply_sweep(&bad_range).await;
    // Passes the CRD rules but cannot be searched (log scale with a step).
    let bad_step = sweep_object(
        "bad-step",
        "uid-2",
        spec(
            json!([{"name": "lr", "type": "float", "min": 0.001, "max": 0.1, "log": true, "step": 0.01}]),
        ),
    );
    driver.apply_sweep(&bad_step).await;
    // Not a Sweep at all.
    driver
        .publish_raw(
            "trainyard.events.sweep.ml.garbage",
            &json!({
                "id": uuid::Uuid::now_v7(), "type": "sweep.changed", "schemaVersion": 1,
                "source": "test", "time": "2026-11-18T11:06:40Z",
                "entity": {"namespace": "ml", "name": "garbage"},
                "correlationId": uuid::Uuid::now_v7(),
                "payload": {"change": "Applied", "object": {"spec": "nope"}},
            })
            .to_string(),
        )
        .await;
    // A good sweep after them still runs.
    let good = sweep_object(
        "good",
        "uid-3",
        spec(json!([{"name": "lr", "type": "float", "min": 0.001, "max": 0.1, "log": true}])),
    );
    driver.apply_sweep(&good).await;

    let letters = eventually("three dead letters", 20, || async {
        let letters = driver.dead_letters().await;
        (letters.len() >= 3).then_some(letters)
    })
    .await;
    assert_eq!(letters.len(), 3, "{letters:#?}");
    for letter in &letters {
        assert_eq!(letter["consumer"], "hpo-tuner-events");
        assert_eq!(letter["stream"], "TRAINYARD_EVENTS");
    }
    let range = letters
        .iter()
        .find(|l| {
            l["subject"]
                .as_str()
                .is_some_and(|s| s.ends_with(".ml.bad-range"))
        })
        .expect("bad-range dead-lettered");
    assert_eq!(range["category"], "invalid_spec");
    assert!(
        reason_of(range).contains("spec.parameters[0].max"),
        "{}",
        reason_of(range)
    );
    assert!(
        reason_of(range).contains("ml/bad-range"),
        "{}",
        reason_of(range)
    );
    let step = letters
        .iter()
        .find(|l| {
            l["subject"]
                .as_str()
                .is_some_and(|s| s.ends_with(".ml.bad-step"))
        })
        .expect("bad-step dead-lettered");
    assert_eq!(step["category"], "invalid_spec");
    assert!(
        reason_of(step).contains("spec.parameters[0].step"),
        "{}",
        reason_of(step)
    );
    let garbage = letters
        .iter()
        .find(|l| {
            l["subject"]
                .as_str()
                .is_some_and(|s| s.ends_with(".ml.garbage"))
        })
        .expect("garbage dead-lettered");
    assert_eq!(garbage["category"], "invalid_payload");

    let requests = eventually("the good sweep's trials", 20, || async {
        let requests = driver.trial_requests("good").await;
        (requests.len() == 2).then_some(requests)
    })
    .await;
    assert_eq!(by_index(&requests).len(), 2);
    assert!(driver.trial_requests("bad-range").await.is_empty());
    assert!(driver.trial_requests("bad-step").await.is_empty());
    stop_tuner(tuner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_stops_failures_and_deletion_reach_the_planner() {
    let nats = NatsServer::start();
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let driver = Driver::connect(&nats).await;
    let mut spec =
        spec(json!([{"name": "lr", "type": "float", "min": 0.001, "max": 0.1, "log": true}]));
    spec["parallelTrialCount"] = json!(3);
    spec["maxTrialCount"] = json!(6);
    spec["earlyStopping"] =
        json!({"algorithm": "asha", "minResource": 1, "maxResource": 9, "reductionFactor": 3});
    let sweep = sweep_object("asha", "uid-asha", spec);
    driver.apply_sweep(&sweep).await;
    let requests = eventually("three trials", 20, || async {
        let requests = driver.trial_requests("asha").await;
        (requests.len() == 3).then_some(requests)
    })
    .await;
    let names: Vec<_> = requests.iter().map(|r| r.trial_name.clone()).collect();

    // t0 sets the bar at rung 1; t1 is below it and is stopped; t2 fails.
    driver
        .transition(&names[0], "u0", TrainingJobState::Running)
        .await;
    driver
        .progress(&names[0], "u0", 1, &[("accuracy", 0.9)])
        .await;
    driver
        .transition(&names[1], "u1", TrainingJobState::Running)
        .await;
    driver
        .progress(&names[1], "u1", 1, &[("accuracy", 0.4)])
        .await;
    driver
        .transition(&names[2], "u2", TrainingJobState::Failed)
        .await;
    // Progress of other ranks and of jobs that are no trial change nothing.
    driver
        .publish(
            trainyard_contracts::EntityRef::new(NS, "not-a-trial", ""),
            trainyard_contracts::worker::ProgressReported {
                worker_index: 0,
                attempt: 0,
                epoch: 1,
                total_epochs: None,
                step: 0,
                metrics: [("accuracy".to_string(), 1.0)].into(),
            },
        )
        .await;

    let stops = eventually("t1 to be stopped", 20, || async {
        let stops = driver.trial_stops("asha").await;
        (!stops.is_empty()).then_some(stops)
    })
    .await;
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0].trial_name, names[1]);
    assert_eq!(stops[0].rung, Some(1), "stopped at the rung of epoch 1");
    assert!(stops[0].reason.starts_with("ASHA"), "{}", stops[0].reason);

    // Two slots freed (one stop, one failure): two more trials.
    let progress = eventually("five trials and the counts", 20, || async {
        let requests = driver.trial_requests("asha").await;
        let last = driver.progress_reports("asha").await.into_iter().last()?;
        (requests.len() == 5 && last.failed == 1 && last.early_stopped == 1).then_some(last)
    })
    .await;
    assert_eq!(progress.running, 1);
    assert_eq!(progress.pending, 2);
    assert_eq!(progress.rungs.get(&1), Some(&2), "{:?}", progress.rungs);
    assert_eq!(metric(&tuner, "trainyard_tuner_sweeps_active"), 1.0);
    assert_eq!(
        metric(&tuner, "trainyard_tuner_trials_requested_total"),
        5.0
    );

    // Deleting the Sweep stops every active trial and drops its state.
    driver.delete_sweep(&sweep).await;
    let finished = driver.finished("asha", 20).await;
    assert_eq!(finished.finished_reason.as_deref(), Some("Cancelled"));
    let stops = driver.trial_stops("asha").await;
    assert_eq!(stops.len(), 4, "t1 earlier, then t0, t3, t4: {stops:?}");
    eventually("the state to be dropped", 20, || async {
        let bucket = driver
            .jetstream
            .get_key_value("trainyard_tuner")
            .await
            .ok()?;
        bucket.get("ml/asha").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(metric(&tuner, "trainyard_tuner_sweeps_active"), 0.0);
    // Late reports about the deleted sweep's trials are ignored.
    driver
        .transition(&names[0], "u0", TrainingJobState::Completed)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(driver.trial_requests("asha").await.len(), 5);
    assert!(driver.dead_letters().await.is_empty());
    stop_tuner(tuner).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_mlflow_never_holds_a_sweep_up() {
    let nats = NatsServer::start();
    let closed = trainyard_testkit::free_port();
    let config = TunerConfig {
        mlflow_tracking_uri: Some(format!("http://127.0.0.1:{closed}")),
        mlflow_max_attempts: 2,
        ..TunerConfig::default()
    };
    let tuner = start_tuner(&nats, config).await;
    let driver = Driver::connect(&nats).await;
    let sweep = sweep_object(
        "untracked",
        "uid-u",
        spec(json!([{"name": "n", "type": "int", "min": 1, "max": 8}])),
    );
    driver.apply_sweep(&sweep).await;
    let mut done = std::collections::BTreeSet::new();
    let finished = loop {
        for trial in driver.trial_requests("untracked").await {
            if done.insert(trial.trial_name.clone()) {
                run_trial_to_completion(&driver, &trial, "uid").await;
            }
        }
        if let Some(p) = driver
            .progress_reports("untracked")
            .await
            .into_iter()
            .last()
            .filter(|p| p.finished_reason.is_some())
        {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        finished.finished_reason.as_deref(),
        Some("MaxTrialsReached")
    );
    assert_eq!(finished.succeeded, 4);
    assert!(
        driver
            .trial_requests("untracked")
            .await
            .iter()
            .all(|t| t.tracking.is_none()),
        "without a run the trials are requested without one"
    );
    eventually("tracking errors to be counted", 30, || async {
        (metric(&tuner, "trainyard_tuner_mlflow_errors_total") >= 1.0).then_some(())
    })
    .await;
    stop_tuner(tuner).await;
}

/// Answers `503` to the first `failures` requests, then `{}`; counts requests.
async fn flaky_server(failures: usize) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buffer = vec![0u8; 65536];
            let _ = socket.read(&mut buffer).await;
            let (status, body) = if n < failures {
                (
                    "503 Service Unavailable",
                    r#"{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}"#,
                )
            } else {
                ("200 OK", "{}")
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (port, count)
}

#[tokio::test]
async fn mlflow_calls_retry_server_errors_with_backoff_then_give_up() {
    let policy = RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
    };
    let (port, count) = flaky_server(2).await;
    let client = MlflowClient::new(
        &format!("http://127.0.0.1:{port}"),
        Duration::from_secs(5),
        policy.clone(),
        CancellationToken::new(),
    )
    .expect("client");
    client
        .update_run("run", trainyard_mlflow::RunStatus::Finished, Some(1))
        .await
        .expect("succeeds on the third attempt");
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);

    let (port, count) = flaky_server(usize::MAX).await;
    let client = MlflowClient::new(
        &format!("http://127.0.0.1:{port}"),
        Duration::from_secs(5),
        policy.clone(),
        CancellationToken::new(),
    )
    .expect("client");
    let started = Instant::now();
    let err = client
        .update_run("run", trainyard_mlflow::RunStatus::Finished, Some(1))
        .await
        .expect_err("always 503");
    assert_eq!(
        count.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "max_attempts"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(20 + 40 + 80),
        "backed off"
    );
    assert!(
        matches!(&err, MlflowError::Api { status: 503, error_code, .. } if error_code == "TEMPORARILY_UNAVAILABLE"),
        "{err}"
    );

    let closed = trainyard_testkit::free_port();
    let client = MlflowClient::new(
        &format!("http://127.0.0.1:{closed}"),
        Duration::from_secs(5),
        policy,
        CancellationToken::new(),
    )
    .expect("client");
    let err = client
        .update_run("run", trainyard_mlflow::RunStatus::Killed, None)
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, MlflowError::Transport { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_progress_carries_the_objective_labels_and_notify_and_model_name_annotations() {
    let nats = NatsServer::start();
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let driver = Driver::connect(&nats).await;

    let mut sweep = sweep_object(
        "annotated",
        "uid-annotated",
        spec(json!([{"name": "lr", "type": "float", "min": 0.001, "max": 0.1, "log": true}])),
    );
    sweep.metadata.labels = Some([("team".to_string(), "nlp".to_string())].into());
    sweep.metadata.annotations = Some(
        [
            ("trainyard.dev/notify", "slack:#team-nlp"),
            ("trainyard.dev/notify-on", "sweep.best_trial,sweep.finished"),
            ("trainyard.dev/model-name", "nlp-classifier"),
            ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
    );
    driver.apply_sweep(&sweep).await;

    let progress = eventually("the sweep's first progress", 20, || async {
        driver
            .progress_reports("annotated")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(progress.objective_metric.as_deref(), Some("accuracy"));
    assert_eq!(progress.labels.get("team").map(String::as_str), Some("nlp"));
    assert_eq!(
        progress.annotations,
        [
            ("trainyard.dev/notify", "slack:#team-nlp"),
            ("trainyard.dev/notify-on", "sweep.best_trial,sweep.finished"),
            ("trainyard.dev/model-name", "nlp-classifier"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
        "only the notification and model-name annotations travel"
    );
    stop_tuner(tuner).await;
}
