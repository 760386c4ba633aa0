//! A Sweep whose trial template names its own MLflow server, against two real
//! tracking servers on loopback (`pip install mlflow`): the tuner's own and a
//! team's. Skipped, with a message, only when no `mlflow` executable is on
//! PATH (as every MLflow test here).

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{Value, json};
use trainyard_contracts::decisions::TrialRequested;
use trainyard_hpo_tuner::TunerConfig;
use trainyard_testkit::{MlflowServer, NatsServer, mlflow_executable};

/// Answers through MLflow's own REST API, independently of the client under test.
async fn get(server: &MlflowServer, path: &str, query: &[(&str, &str)]) -> Option<Value> {
    let response = reqwest::Client::new()
        .get(server.api(path))
        .query(query)
        .send()
        .await
        .expect("GET");
    if !response.status().is_success() {
        return None;
    }
    Some(response.json().await.expect("JSON"))
}

async fn experiment_id(server: &MlflowServer, name: &str) -> Option<String> {
    let body = get(
        server,
        "experiments/get-by-name",
        &[("experiment_name", name)],
    )
    .await?;
    body["experiment"]["experiment_id"]
        .as_str()
        .map(str::to_string)
}

/// The run's status and its `accuracy` history, if the server holds the run.
async fn run_on(server: &MlflowServer, run_id: &str) -> Option<(String, Vec<f64>)> {
    let run = get(server, "runs/get", &[("run_id", run_id)]).await?;
    let history = get(
        server,
        "metrics/get-history",
        &[("run_id", run_id), ("metric_key", "accuracy")],
    )
    .await
    .unwrap_or_default();
    let mut points: Vec<(i64, f64)> = history["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["step"].as_i64().unwrap_or_default(),
                p["value"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    points.sort_by_key(|p| p.0);
    Some((
        run["run"]["info"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        points.into_iter().map(|p| p.1).collect(),
    ))
}

fn sweep_naming(name: &str, tracking_uri: &str) -> trainyard_api::Sweep {
    let mut template = template();
    template["monitoring"] = json!({"mlflowTrackingUri": tracking_uri});
    sweep_object(
        name,
        &format!("uid-{name}"),
        json!({
            "objective": {"metric": "accuracy", "direction": "maximize"},
            "parameters": [{"name": "learningRate", "type": "float", "min": 0.001, "max": 0.1, "log": true}],
            "parallelTrialCount": 2,
            "maxTrialCount": 2,
            "trialTemplate": template,
        }),
    )
}

/// What the planner makes of a trial request: the trial's monitoring
/// (`MLFLOW_TRACKING_URI`, `MLFLOW_RUN_ID` of its workers).
fn trial_monitoring(
    sweep: &trainyard_api::Sweep,
    request: &TrialRequested,
) -> (Option<String>, Option<String>) {
    let spec = planner_core::trial_spec(
        &sweep.spec.trial_template,
        &request.parameters,
        request.tracking.as_ref(),
    )
    .expect("trial spec");
    let monitoring = spec.monitoring.unwrap_or_default();
    (monitoring.mlflow_tracking_uri, monitoring.mlflow_run_id)
}

async fn requests(driver: &Driver, sweep: &str) -> BTreeMap<u32, TrialRequested> {
    eventually(&format!("two trials of {sweep}"), 30, || async {
        let requests = driver.trial_requests(sweep).await;
        (requests.len() == 2).then(|| by_index(&requests))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_is_recorded_on_the_allowed_server_its_template_names() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED a_sweep_is_recorded_on_the_allowed_server_its_template_names: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let own = MlflowServer::start(executable.clone());
    let team = MlflowServer::start(executable);
    let nats = NatsServer::start();
    let config = TunerConfig {
        mlflow_tracking_uri: Some(own.url()),
        // Written with a trailing slash: servers are compared normalised.
        mlflow_allowed_tracking_uris: vec![format!("{}/", team.url())],
        ..TunerConfig::default()
    };
    let tuner = start_tuner(&nats, config).await;
    let driver = Driver::connect(&nats).await;

    // The team's server is allowed: experiment, trial runs and metrics go there.
    let allowed = sweep_naming("team", &team.url());
    driver.apply_sweep(&allowed).await;
    let team_requests = requests(&driver, "team").await;
    for request in team_requests.values() {
        let tracking = request.tracking.as_ref().expect("the request names a run");
        assert_eq!(tracking.mlflow_tracking_uri, team.url());
        assert!(
            run_on(&team, &tracking.mlflow_run_id).await.is_some(),
            "{}'s run is on the team's server",
            request.trial_name
        );
        assert_eq!(
            trial_monitoring(&allowed, request),
            (Some(team.url()), Some(tracking.mlflow_run_id.clone())),
            "the trial's workers log into the run the tuner made"
        );
    }
    for request in team_requests.values() {
        run_trial_to_completion(&driver, request, &format!("job-{}", request.trial_index)).await;
    }
    let finished = driver.finished("team", 30).await;
    assert_eq!(finished.tracking_warning, None);
    let run = &team_requests[&0]
        .tracking
        .as_ref()
        .expect("tracking")
        .mlflow_run_id;
    let (status, accuracy) = eventually("the team's run finished", 30, || async {
        run_on(&team, run)
            .await
            .filter(|(status, accuracy)| status == "FINISHED" && accuracy.len() == 3)
    })
    .await;
    assert_eq!((status.as_str(), accuracy.len()), ("FINISHED", 3));
    assert!(experiment_id(&team, "ml/team").await.is_some());
    assert_eq!(
        experiment_id(&own, "ml/team").await,
        None,
        "nothing of the Sweep on the tuner's own server"
    );

    // A server not in the allow-list: recorded on the tuner's own, and the
    // Sweep's progress says why; the workers keep their server, without a run.
    let elsewhere = "http://mlflow.elsewhere.example:5000";
    let refused = sweep_naming("elsewhere", elsewhere);
    driver.apply_sweep(&refused).await;
    let elsewhere_requests = requests(&driver, "elsewhere").await;
    for request in elsewhere_requests.values() {
        let tracking = request.tracking.as_ref().expect("the request names a run");
        assert_eq!(tracking.mlflow_tracking_uri, own.url());
        assert!(
            run_on(&own, &tracking.mlflow_run_id).await.is_some(),
            "{}'s run is on the tuner's server",
            request.trial_name
        );
        assert_eq!(
            trial_monitoring(&refused, request),
            (Some(elsewhere.to_string()), None),
            "no run id for a server that has no such run"
        );
    }
    let warning = eventually("the Sweep's progress to carry the warning", 30, || async {
        driver
            .progress_reports("elsewhere")
            .await
            .into_iter()
            .find_map(|p| p.tracking_warning)
    })
    .await;
    assert!(
        warning.contains(elsewhere)
            && warning.contains("hpo_tuner.mlflow_allowed_tracking_uris")
            && warning.contains(&own.url()),
        "{warning}"
    );
    assert!(experiment_id(&own, "ml/elsewhere").await.is_some());
    assert_eq!(experiment_id(&team, "ml/elsewhere").await, None);
    assert_eq!(
        metric(&tuner, "trainyard_tuner_mlflow_servers_refused_total"),
        1.0
    );
    assert_eq!(metric(&tuner, "trainyard_tuner_mlflow_errors_total"), 0.0);
    stop_tuner(tuner).await;
}
