//! Model registration against a real MLflow server (`pip install mlflow`), a
//! real S3-compatible server (moto) and a real NATS server: a completed job's
//! best verified checkpoint becomes a model version with the `best` alias,
//! exactly once across redeliveries and restarts; a finished Sweep's best
//! trial's checkpoint becomes a version of the Sweep's model, and no trial is
//! registered on its own. Skipped, with a message,
//! only when no `mlflow` executable is on PATH.

mod common;

use common::*;
use object_store::aws::AmazonS3;
use serde_json::{Value, json};
use trainyard_api::TrainingJobState;
use trainyard_checkpoint_manager::ManagerConfig;
use trainyard_contracts::decisions::{
    BestTrial, CheckpointVerified, ModelRegistered, SweepProgressed,
};
use trainyard_contracts::{Bucket, EntityRef};
use trainyard_runtime::Runtime;
use trainyard_testkit::{MlflowServer, NatsServer, metric, mlflow_executable};

const BUCKET: &str = "models";

/// Reads and writes through MLflow's REST API, independently of the manager's client.
struct Reader {
    http: reqwest::Client,
    server: String,
}

impl Reader {
    fn new(server: &MlflowServer) -> Self {
        Self {
            http: reqwest::Client::new(),
            server: server.url(),
        }
    }

    fn api(&self, path: &str) -> String {
        format!("{}/api/2.0/mlflow/{path}", self.server)
    }

    /// GET `path`: the HTTP status and the body.
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> (u16, Value) {
        let response = self
            .http
            .get(self.api(path))
            .query(query)
            .send()
            .await
            .expect("GET");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(self.api(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        response.json().await.expect("JSON")
    }

    /// A run for jobs to name in `monitoring.mlflowRunId`.
    async fn create_run(&self) -> String {
        let experiment =
            self.post("experiments/create", json!({"name": "ml"})).await["experiment_id"]
                .as_str()
                .expect("experiment id")
                .to_string();
        self.post(
            "runs/create",
            json!({"experiment_id": experiment, "run_name": "bert"}),
        )
        .await["run"]["info"]["run_id"]
            .as_str()
            .expect("run id")
            .to_string()
    }

    /// (version, source, run id) of every version of `model`.
    async fn versions(&self, model: &str) -> Vec<(String, String, String)> {
        let filter = format!("name='{model}'");
        let (status, body) = self
            .get("model-versions/search", &[("filter", filter.as_str())])
            .await;
        assert_eq!(status, 200, "{body}");
        body["model_versions"]
            .as_array()
            .map(|versions| {
                versions
                    .iter()
                    .map(|v| {
                        let text = |key: &str| v[key].as_str().unwrap_or_default().to_string();
                        (text("version"), text("source"), text("run_id"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn model_exists(&self, model: &str) -> bool {
        let (status, body) = self.get("registered-models/get", &[("name", model)]).await;
        assert!(matches!(status, 200 | 404), "{status}: {body}");
        status == 200
    }
}

fn registrations(runtime: &Runtime, outcome: &str) -> u64 {
    metric(
        &runtime.registry,
        "trainyard_checkpoint_registrations_total",
        &[("outcome", outcome)],
    ) as u64
}

/// Waits until this manager has handled `count` lifecycle messages: what it
/// decides about a transition has been published by then.
async fn lifecycle_handled(runtime: &Runtime, count: u64) {
    let handled = [
        ("consumer", "checkpoint-manager-lifecycle"),
        ("outcome", "ack"),
    ];
    trainyard_testkit::eventually(&format!("{count} lifecycle messages handled"), || async {
        (metric(
            &runtime.registry,
            "trainyard_messages_handled_total",
            &handled,
        ) >= count as f64)
            .then_some(())
    })
    .await;
}

fn s3_job(name: &str, extra: Value) -> trainyard_api::TrainingJob {
    let mut job = training_job(
        name,
        json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": BUCKET},
               "retention": {"keepBest": {"metric": "loss", "mode": "min"}}}),
    );
    let mut value = serde_json::to_value(&job).expect("job encodes");
    merge(&mut value, extra);
    job = serde_json::from_value(value).expect("job parses");
    job
}

fn merge(target: &mut Value, extra: Value) {
    match (target, extra) {
        (Value::Object(target), Value::Object(extra)) => {
            for (key, value) in extra {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, extra) => *target = extra,
    }
}

/// Saves and reports checkpoints (step, loss) of `job` in S3.
async fn save(driver: &Driver, s3: &AmazonS3, job: &str, checkpoints: &[(u64, f64)]) {
    for (step, loss) in checkpoints {
        let prefix = format!("{NS}/{job}/step-{step}");
        write_s3_checkpoint(s3, &prefix, *step, *loss).await;
        driver
            .report(job, &format!("s3://{BUCKET}/{prefix}"), *step, *loss, 2.0)
            .await;
    }
}

async fn complete(driver: &Driver, job: &str) {
    driver
        .transition(
            job,
            TrainingJobState::Running,
            TrainingJobState::Completed,
            "Succeeded",
        )
        .await;
}

fn registry_config(moto: &Moto, mlflow: &MlflowServer) -> ManagerConfig {
    ManagerConfig {
        storage: moto.storage(),
        mlflow_tracking_uri: Some(mlflow.url()),
        ..ManagerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_jobs_register_their_best_verified_checkpoint_once() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED completed_jobs_register_their_best_verified_checkpoint_once: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let mlflow = MlflowServer::start(executable);
    let moto = Moto::start();
    let s3 = moto.bucket(BUCKET).await;
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    let reader = Reader::new(&mlflow);
    let run_id = reader.create_run().await;

    let manager = start_manager(&nats, registry_config(&moto, &mlflow)).await;
    driver
        .apply(&s3_job(
            "bert",
            json!({"spec": {"monitoring": {"mlflowRunId": run_id}}}),
        ))
        .await;
    let checkpoints = [(100, 0.5), (200, 0.2), (300, 0.4)];
    save(&driver, &s3, "bert", &checkpoints).await;
    let verified = driver.wait_for::<CheckpointVerified>("bert", 3).await;
    assert!(verified.iter().all(|v| v.verified), "{verified:?}");
    complete(&driver, "bert").await;

    let best = format!("s3://{BUCKET}/{NS}/bert/step-200");
    let expected = ModelRegistered {
        model_name: "ml-bert".into(),
        version: "1".into(),
        source: best.clone(),
        run_id: Some(run_id.clone()),
        alias: Some("best".into()),
        error: None,
        tracking_warning: None,
    };
    let registered = driver.wait_for::<ModelRegistered>("bert", 1).await;
    assert_eq!(registered, vec![expected.clone()]);
    let (status, by_alias) = reader
        .get(
            "registered-models/alias",
            &[("name", "ml-bert"), ("alias", "best")],
        )
        .await;
    assert_eq!(status, 200, "{by_alias}");
    assert_eq!(by_alias["model_version"]["version"], "1");
    assert_eq!(by_alias["model_version"]["source"], best.as_str());
    assert_eq!(by_alias["model_version"]["run_id"], run_id.as_str());
    assert_eq!(registrations(&manager, "registered"), 1);

    // The completion again (a redelivery): the same registration, no new version.
    complete(&driver, "bert").await;
    let registered = driver.wait_for::<ModelRegistered>("bert", 2).await;
    assert_eq!(registered[1], expected);
    assert_eq!(
        reader.versions("ml-bert").await,
        vec![("1".to_string(), best.clone(), run_id.clone())]
    );

    // A restart that lost the job's record: the registry's version with the
    // same source is found and reused.
    stop_manager(manager).await;
    let store = driver
        .jetstream
        .get_key_value(Bucket::Checkpoints.name())
        .await
        .expect("checkpoint bucket");
    store
        .purge(format!("{NS}/bert"))
        .await
        .expect("record purged");
    let manager = start_manager(&nats, registry_config(&moto, &mlflow)).await;
    driver
        .apply(&s3_job(
            "bert",
            json!({"spec": {"monitoring": {"mlflowRunId": run_id}}}),
        ))
        .await;
    save(&driver, &s3, "bert", &checkpoints).await;
    driver.wait_for::<CheckpointVerified>("bert", 6).await;
    complete(&driver, "bert").await;
    let registered = driver.wait_for::<ModelRegistered>("bert", 3).await;
    assert_eq!(registered[2], expected);
    assert_eq!(
        reader.versions("ml-bert").await.len(),
        1,
        "no second version"
    );
    assert_eq!(registrations(&manager, "existing"), 1);
    assert_eq!(registrations(&manager, "registered"), 0);

    // No verified checkpoint: nothing is registered.
    driver.apply(&s3_job("unsaved", json!({}))).await;
    driver
        .report(
            "unsaved",
            &format!("s3://{BUCKET}/{NS}/unsaved/step-100"),
            100,
            0.3,
            2.0,
        )
        .await;
    let verified = driver.wait_for::<CheckpointVerified>("unsaved", 1).await;
    assert!(!verified[0].verified);
    complete(&driver, "unsaved").await;
    lifecycle_handled(&manager, 2).await;
    assert!(
        driver
            .decisions::<ModelRegistered>("unsaved")
            .await
            .is_empty()
    );
    assert!(!reader.model_exists("ml-unsaved").await);

    // Refusals that will not go away are published with the fix, once.
    driver
        .apply(&s3_job(
            "named",
            json!({"metadata": {"annotations": {"trainyard.dev/model-name": "team/bert"}}}),
        ))
        .await;
    save(&driver, &s3, "named", &[(100, 0.3)]).await;
    driver.wait_for::<CheckpointVerified>("named", 1).await;
    complete(&driver, "named").await;
    let refused = driver.wait_for::<ModelRegistered>("named", 1).await;
    assert_eq!(refused[0].model_name, "team/bert");
    assert_eq!(refused[0].version, "");
    let error = refused[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("trainyard.dev/model-name"), "{error}");

    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "on-volume",
            json!({"enabled": true, "storage": {"type": "pvc", "claimName": "c", "mountPath": base}}),
        ))
        .await;
    let step_dir = volume.path().join("step-100");
    write_volume_checkpoint(&step_dir, 100, 0.3, true);
    driver
        .report(
            "on-volume",
            step_dir.to_str().expect("utf-8"),
            100,
            0.3,
            2.0,
        )
        .await;
    driver.wait_for::<CheckpointVerified>("on-volume", 1).await;
    complete(&driver, "on-volume").await;
    // A path inside the workers means nothing to the registry: the version
    // names the claim and the job's directory on it, as KServe reads it.
    let registered = driver.wait_for::<ModelRegistered>("on-volume", 1).await;
    assert_eq!(registered[0].error, None, "{:?}", registered[0]);
    let source = format!("pvc://c/{NS}/on-volume/step-100");
    assert_eq!(registered[0].source, source);
    let versions = reader.versions(&format!("{NS}-on-volume")).await;
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0].1, source);
    assert_eq!(registrations(&manager, "refused"), 1);
    stop_manager(manager).await;

    // Registration off without a tracking URI.
    let manager = start_manager(
        &nats,
        ManagerConfig {
            storage: moto.storage(),
            ..ManagerConfig::default()
        },
    )
    .await;
    driver.apply(&s3_job("untracked", json!({}))).await;
    save(&driver, &s3, "untracked", &[(100, 0.3)]).await;
    driver.wait_for::<CheckpointVerified>("untracked", 1).await;
    complete(&driver, "untracked").await;
    lifecycle_handled(&manager, 1).await;
    assert!(
        driver
            .decisions::<ModelRegistered>("untracked")
            .await
            .is_empty()
    );
    assert!(!reader.model_exists("ml-untracked").await);
    stop_manager(manager).await;
}

/// A trial of the Sweep `sweep`: a TrainingJob the Sweep controls, labelled as
/// the planner labels trials.
fn trial(sweep: &str, name: &str) -> trainyard_api::TrainingJob {
    s3_job(
        name,
        json!({"metadata": {
            "labels": {"trainyard.dev/sweep": sweep},
            "ownerReferences": [{"apiVersion": "trainyard.dev/v1", "kind": "Sweep", "name": sweep,
                                 "uid": format!("uid-{sweep}"), "controller": true}]}}),
    )
}

/// Waits until this manager has handled `count` Sweep progress messages.
async fn sweeps_handled(runtime: &Runtime, count: u64) {
    let handled = [
        ("consumer", "checkpoint-manager-decisions"),
        ("outcome", "ack"),
    ];
    trainyard_testkit::eventually(&format!("{count} sweep messages handled"), || async {
        (metric(
            &runtime.registry,
            "trainyard_messages_handled_total",
            &handled,
        ) >= count as f64)
            .then_some(())
    })
    .await;
}

fn sweep_progress(best: &str, finished: Option<&str>) -> SweepProgressed {
    SweepProgressed {
        pending: 0,
        running: u32::from(finished.is_none()),
        succeeded: 2,
        failed: 0,
        early_stopped: 0,
        best_trial: Some(BestTrial {
            trial_name: best.to_string(),
            parameters: Default::default(),
            objective_value: 0.93,
        }),
        rungs: Default::default(),
        finished_reason: finished.map(str::to_string),
        message: None,
        objective_metric: Some("accuracy".into()),
        labels: Default::default(),
        annotations: Default::default(),
        tracking_warning: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_sweep_registers_only_its_best_trials_checkpoint_under_its_name() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED a_finished_sweep_registers_only_its_best_trials_checkpoint_under_its_name: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let mlflow = MlflowServer::start(executable);
    let moto = Moto::start();
    let s3 = moto.bucket(BUCKET).await;
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    let reader = Reader::new(&mlflow);
    let manager = start_manager(&nats, registry_config(&moto, &mlflow)).await;
    let sweep = EntityRef::new(NS, "resnet", "uid-resnet");

    for (name, checkpoints) in [
        ("resnet-t0000", [(100, 0.5), (200, 0.3)]),
        ("resnet-t0001", [(100, 0.4), (200, 0.1)]),
    ] {
        driver.apply(&trial("resnet", name)).await;
        save(&driver, &s3, name, &checkpoints).await;
        let verified = driver.wait_for::<CheckpointVerified>(name, 2).await;
        assert!(verified.iter().all(|v| v.verified), "{verified:?}");
        complete(&driver, name).await;
    }
    lifecycle_handled(&manager, 2).await;
    // Progress before the end registers nothing either.
    driver
        .publish(sweep.clone(), sweep_progress("resnet-t0001", None))
        .await;
    sweeps_handled(&manager, 1).await;
    for name in ["resnet-t0000", "resnet-t0001"] {
        assert!(
            driver.decisions::<ModelRegistered>(name).await.is_empty(),
            "{name} registered on its own"
        );
        assert!(!reader.model_exists(&format!("{NS}-{name}")).await);
    }
    assert!(!reader.model_exists("ml-resnet").await);

    driver
        .publish(
            sweep.clone(),
            sweep_progress("resnet-t0001", Some("MaxTrialsReached")),
        )
        .await;
    let best = format!("s3://{BUCKET}/{NS}/resnet-t0001/step-200");
    let expected = ModelRegistered {
        model_name: "ml-resnet".into(),
        version: "1".into(),
        source: best.clone(),
        run_id: None,
        alias: Some("best".into()),
        error: None,
        tracking_warning: None,
    };
    let registered = driver.wait_for::<ModelRegistered>("resnet-t0001", 1).await;
    assert_eq!(registered, vec![expected.clone()]);
    assert_eq!(
        reader.versions("ml-resnet").await,
        vec![("1".to_string(), best.clone(), String::new())]
    );

    // The finish again (the tuner republishes after a restart): the same
    // registration, no second version, and the other trial still nothing.
    driver
        .publish(
            sweep.clone(),
            sweep_progress("resnet-t0001", Some("MaxTrialsReached")),
        )
        .await;
    let registered = driver.wait_for::<ModelRegistered>("resnet-t0001", 2).await;
    assert_eq!(registered[1], expected);
    sweeps_handled(&manager, 3).await;
    assert_eq!(reader.versions("ml-resnet").await.len(), 1);
    assert_eq!(registrations(&manager, "registered"), 1);
    assert!(
        driver
            .decisions::<ModelRegistered>("resnet-t0000")
            .await
            .is_empty()
    );
    stop_manager(manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweeps_model_name_annotation_names_the_model_its_best_trial_becomes() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED a_sweeps_model_name_annotation_names_the_model_its_best_trial_becomes: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let mlflow = MlflowServer::start(executable);
    let moto = Moto::start();
    let s3 = moto.bucket(BUCKET).await;
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    let reader = Reader::new(&mlflow);
    let manager = start_manager(&nats, registry_config(&moto, &mlflow)).await;
    let sweep = EntityRef::new(NS, "vit", "uid-vit");

    driver.apply(&trial("vit", "vit-t0000")).await;
    save(&driver, &s3, "vit-t0000", &[(100, 0.2)]).await;
    let verified = driver.wait_for::<CheckpointVerified>("vit-t0000", 1).await;
    assert!(verified[0].verified, "{verified:?}");
    complete(&driver, "vit-t0000").await;
    lifecycle_handled(&manager, 1).await;

    // The tuner carries the Sweep's annotation in its progress.
    let mut finished = sweep_progress("vit-t0000", Some("GoalReached"));
    finished.annotations = [(
        trainyard_api::ANNOTATION_MODEL_NAME.to_string(),
        "vit-imagenet".to_string(),
    )]
    .into();
    driver.publish(sweep, finished).await;
    let registered = driver.wait_for::<ModelRegistered>("vit-t0000", 1).await;
    let best = format!("s3://{BUCKET}/{NS}/vit-t0000/step-100");
    assert_eq!(registered[0].model_name, "vit-imagenet", "{registered:?}");
    assert_eq!(registered[0].error, None, "{registered:?}");
    assert_eq!(
        reader.versions("vit-imagenet").await,
        vec![("1".to_string(), best, String::new())]
    );
    assert!(!reader.model_exists("ml-vit").await);
    stop_manager(manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_naming_an_allowed_server_registers_there_and_another_on_the_managers_own() {
    let Some(executable) = mlflow_executable() else {
        eprintln!(
            "SKIPPED a_job_naming_an_allowed_server_registers_there_and_another_on_the_managers_own: no `mlflow` executable on PATH (pip install mlflow)"
        );
        return;
    };
    let own = MlflowServer::start(executable.clone());
    let team = MlflowServer::start(executable);
    let moto = Moto::start();
    let s3 = moto.bucket(BUCKET).await;
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    let (own_reader, team_reader) = (Reader::new(&own), Reader::new(&team));
    let team_run = team_reader.create_run().await;
    let config = ManagerConfig {
        // Written with a path of its own: the team's server is everything below it.
        mlflow_allowed_tracking_uris: vec![format!("{}/", team.url())],
        ..registry_config(&moto, &own)
    };
    let manager = start_manager(&nats, config).await;

    // The team's server is allowed: the version is there, tied to the job's run.
    driver
        .apply(&s3_job(
            "team",
            json!({"spec": {"monitoring": {"mlflowTrackingUri": team.url(), "mlflowRunId": team_run}}}),
        ))
        .await;
    save(&driver, &s3, "team", &[(100, 0.3)]).await;
    driver.wait_for::<CheckpointVerified>("team", 1).await;
    complete(&driver, "team").await;
    let registered = driver.wait_for::<ModelRegistered>("team", 1).await;
    assert_eq!(registered[0].tracking_warning, None);
    assert_eq!(registered[0].run_id.as_deref(), Some(team_run.as_str()));
    let source = format!("s3://{BUCKET}/{NS}/team/step-100");
    assert_eq!(
        team_reader.versions("ml-team").await,
        vec![("1".to_string(), source, team_run.clone())]
    );
    assert!(!own_reader.model_exists("ml-team").await);

    // Another server: registered on the manager's own, without the job's run
    // (it is on the job's server), and the message says why.
    let elsewhere = "http://mlflow.elsewhere.example:5000";
    driver
        .apply(&s3_job(
            "elsewhere",
            json!({"spec": {"monitoring": {"mlflowTrackingUri": elsewhere, "mlflowRunId": "run-elsewhere"}}}),
        ))
        .await;
    save(&driver, &s3, "elsewhere", &[(100, 0.3)]).await;
    driver.wait_for::<CheckpointVerified>("elsewhere", 1).await;
    complete(&driver, "elsewhere").await;
    let registered = driver.wait_for::<ModelRegistered>("elsewhere", 1).await;
    assert_eq!(registered[0].error, None);
    assert_eq!(registered[0].run_id, None);
    let warning = registered[0].tracking_warning.clone().expect("a warning");
    assert!(
        warning.contains("mlflow.elsewhere.example")
            && warning.contains("checkpoint_manager.mlflow_allowed_tracking_uris")
            && warning.contains(&own.url()),
        "{warning}"
    );
    let source = format!("s3://{BUCKET}/{NS}/elsewhere/step-100");
    assert_eq!(
        own_reader.versions("ml-elsewhere").await,
        vec![("1".to_string(), source, String::new())]
    );
    assert!(!team_reader.model_exists("ml-elsewhere").await);
    assert_eq!(
        metric(
            &manager.registry,
            "trainyard_checkpoint_mlflow_servers_refused_total",
            &[]
        ),
        1.0
    );
    stop_manager(manager).await;
}
