//! The real-cluster suite (kind or any cluster): runs only when
//! `TRAINYARD_E2E_KUBECONFIG` names a kubeconfig, e.g.
//!
//! ```sh
//! kind create cluster --name trainyard
//! kind get kubeconfig --name trainyard > /tmp/kind.kubeconfig
//! TRAINYARD_E2E_KUBECONFIG=/tmp/kind.kubeconfig cargo test -p trainyard-system-tests --test cluster_e2e -- --nocapture
//! ```
//!
//! It installs the CRDs, checks the apiserver rejects bad specs by schema and CEL,
//! runs the watcher and planner in-process against the cluster and a local NATS,
//! and follows a TrainingJob from creation to admission to deletion.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState};
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::{EntityRef, Service as TrainyardService};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;

const NS: &str = "trainyard-e2e";

async fn client() -> Option<Client> {
    let path = std::env::var("TRAINYARD_E2E_KUBECONFIG").ok()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kubeconfig = Kubeconfig::read_from(&path).expect("readable kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("usable kubeconfig");
    Some(Client::try_from(config).expect("client"))
}

async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    // A real cluster pulls images and schedules pods: give it two minutes.
    trainyard_testkit::eventually_within(what, Duration::from_secs(120), check).await
}

async fn runtime(nats: &NatsServer, service: TrainyardService) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    Runtime::start(service, settings, CancellationToken::new())
        .await
        .expect("runtime")
}

#[tokio::test]
async fn a_training_job_on_a_real_cluster() {
    let Some(client) = client().await else {
        eprintln!(
            "skipped: set TRAINYARD_E2E_KUBECONFIG to run the real-cluster suite (see the file's doc)"
        );
        return;
    };
    let apply = PatchParams::apply("trainyard-e2e").force();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in trainyard_api::all_crds() {
        let name = crd.metadata.name.clone().expect("named");
        crds.patch(&name, &apply, &Patch::Apply(&crd))
            .await
            .expect("CRD installed");
        eventually(&format!("{name} established"), || async {
            let crd = crds.get(&name).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NS}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .patch(NS, &apply, &Patch::Apply(&namespace))
        .await
        .expect("namespace");
    let jobs_api: Api<TrainingJob> = Api::namespaced(client.clone(), NS);

    // The apiserver itself rejects bad specs, naming the field.
    for (bad, field) in [
        (
            serde_json::json!({"model": "m", "dataset": "d", "numWorkers": 0}),
            "numWorkers",
        ),
        (
            serde_json::json!({"model": "m", "dataset": "d", "numWorkers": 1, "framework": "caffe"}),
            "framework",
        ),
        (
            serde_json::json!({"model": "m", "dataset": "d", "numWorkers": 1, "checkpoint": {"resumeFrom": "s3://b/x"}}),
            "resumeFrom",
        ),
    ] {
        // Sent untyped: the typed spec could not even hold an unknown framework.
        let raw = Api::<kube::api::DynamicObject>::namespaced_with(
            client.clone(),
            NS,
            &kube::api::ApiResource::erase::<TrainingJob>(&()),
        );
        let dynamic: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
            "metadata": {"name": "bad", "namespace": NS}, "spec": bad
        }))
        .expect("dynamic object");
        let err = raw
            .create(&PostParams::default(), &dynamic)
            .await
            .expect_err("rejected");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }

    let nats = NatsServer::start();
    let watcher = runtime(&nats, TrainyardService::Watcher).await;
    let metrics = trainyard_watcher::WatcherMetrics::register(&watcher.registry).expect("metrics");
    trainyard_watcher::adapter::spawn_watches(
        &watcher,
        client.clone(),
        &trainyard_watcher::WatcherSettings {
            namespace: Some(NS.into()),
            node_selector: None,
        },
        metrics,
    );
    let planner = runtime(&nats, TrainyardService::Planner).await;
    trainyard_planner::start(
        &planner,
        planner_core::PlannerConfig::default(),
        client.clone(),
    )
    .expect("planner");

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/trainingjob-simple.yaml"
    ))
    .expect("example");
    let mut tj: TrainingJob = yaml_serde::from_str(&text).expect("example parses");
    tj.metadata.namespace = Some(NS.into());
    jobs_api
        .patch("mnist-training", &apply, &Patch::Apply(&tj))
        .await
        .expect("created");

    let batch: Api<Job> = Api::namespaced(client.clone(), NS);
    let job = eventually("the suspended Job", || async {
        batch.get_opt("mnist-training-a0").await.ok()?
    })
    .await;
    assert_eq!(job.spec.expect("spec").suspend, Some(true));
    assert!(
        Api::<Service>::namespaced(client.clone(), NS)
            .get_opt("mnist-training-workers")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get_opt("mnist-training-config")
            .await
            .expect("get")
            .is_some()
    );

    let admission = planner.publisher.envelope(
        EntityRef::new(NS, "mnist-training", ""),
        AdmissionDecided {
            attempt: 0,
            queue: "default".into(),
            flavor: "any".into(),
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            placements: vec![],
            topology: BTreeMap::new(),
            capacity_type_reopened: false,
        },
    );
    planner
        .publisher
        .publish(admission)
        .await
        .expect("admission");
    eventually("the Job unsuspended", || async {
        let job = batch.get("mnist-training-a0").await.ok()?;
        (job.spec?.suspend == Some(false)).then_some(())
    })
    .await;
    eventually("Initializing or later", || async {
        let state = jobs_api.get("mnist-training").await.ok()?.status?.state?;
        (state != TrainingJobState::Pending && state != TrainingJobState::Queued).then_some(())
    })
    .await;

    jobs_api
        .delete("mnist-training", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("the TrainingJob and its Job gone", || async {
        let gone = jobs_api.get_opt("mnist-training").await.ok()?.is_none()
            && batch.get_opt("mnist-training-a0").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
}
