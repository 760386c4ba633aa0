//! The stack with NATS authentication on, as deployed: the generated users
//! and allow lists with the auth callout, every service under its own user,
//! the planner issuing each admitted attempt's worker token, and the
//! simulator's workers reporting over their own connection with it. A job
//! completes from those reports, and the attempt's Secret carries the NATS CA
//! beside the token.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use nkeys::KeyPair;
use planner_core::{NATS_CA_SECRET_KEY, PlannerConfig, TOKEN_SECRET_KEY, WorkerToken};
use tokio_util::sync::CancellationToken;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingQueue};
use trainyard_contracts::Service;
use trainyard_contracts::permissions::{self, CALLOUT_ISSUER_VARIABLE, Identity};
use trainyard_runtime::{Runtime, Settings};
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::{NatsServer, TestCertificates, eventually_within, metric};

struct Secured {
    nats: NatsServer,
    secrets: tempfile::TempDir,
    issuer_seed: String,
}

fn password(identity: &Identity) -> String {
    format!("password-of-{}", identity.user())
}

fn secured() -> Secured {
    let issuer = KeyPair::new_account();
    let identities = permissions::deployment(&[]);
    let config = permissions::server_config_with(&identities, true).expect("derives the config");
    let mut env: Vec<(String, String)> = identities
        .iter()
        .map(|identity| (permissions::password_variable(identity), password(identity)))
        .collect();
    env.push((CALLOUT_ISSUER_VARIABLE.to_string(), issuer.public_key()));
    let secrets = tempfile::tempdir().expect("secrets dir");
    let issuer_seed = secrets.path().join("issuer.nk");
    std::fs::write(&issuer_seed, issuer.seed().expect("seed")).expect("write the seed");
    Secured {
        nats: NatsServer::start_with_config(&config, &env),
        issuer_seed: issuer_seed.display().to_string(),
        secrets,
    }
}

impl Secured {
    async fn runtime(&self, service: Service, shutdown: &CancellationToken) -> Runtime {
        let identity = Identity::Service(service);
        let path = self.secrets.path().join(identity.user());
        std::fs::write(&path, password(&identity)).expect("write the password file");
        let mut settings = Settings::default();
        settings.nats.url = self.nats.url();
        settings.nats.user = Some(identity.user());
        settings.nats.password_file = Some(path.display().to_string());
        settings.http.listen = "127.0.0.1:0".into();
        Runtime::start(service, settings, shutdown.child_token())
            .await
            .unwrap_or_else(|err| panic!("{} starts under its own user: {err}", service.name()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_completes_with_its_workers_reporting_under_their_jobs_token() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secured = secured();
    let shutdown = CancellationToken::new();
    // The simulator stands in for the cluster; its own connection (commands,
    // retention) is the operator's, its workers connect with their token.
    let operator = async_nats::ConnectOptions::with_user_and_password(
        "operator".into(),
        password(&Identity::Operator),
    )
    .connect(secured.nats.url())
    .await
    .expect("operator connects");
    let simulator = Simulator::start_with_worker_nats(
        demo_cluster(),
        "127.0.0.1:0",
        Some(operator),
        Some(secured.nats.url()),
        shutdown.clone(),
    )
    .await
    .expect("simulator starts");
    let kube = kube_client(&simulator, None).await;

    let watcher = secured.runtime(Service::Watcher, &shutdown).await;
    let watcher_metrics =
        trainyard_watcher::WatcherMetrics::register(&watcher.registry).expect("metrics");
    trainyard_watcher::adapter::spawn_watches(
        &watcher,
        kube.clone(),
        &Default::default(),
        watcher_metrics,
    );
    let planner = secured.runtime(Service::Planner, &shutdown).await;
    // The CA the workers of a TLS installation verify NATS with; the
    // simulator's workers speak plain NATS here and leave it unread.
    let certificates = TestCertificates::generate("trainyard-test-ca");
    let planner_config = PlannerConfig {
        worker_nats_url: secured.nats.url(),
        worker_credentials_seed_file: Some(secured.issuer_seed.clone()),
        worker_nats_ca_file: Some(certificates.ca().display().to_string()),
        ..Default::default()
    };
    trainyard_planner::start(&planner, planner_config, kube.clone()).expect("planner starts");
    let allocator = secured.runtime(Service::GpuAllocator, &shutdown).await;
    trainyard_gpu_allocator::start(&allocator, Default::default())
        .await
        .expect("allocator starts");

    let apply = PatchParams::apply("test").force();
    let queue: TrainingQueue = manifest("simulator/clusters/demo-queue.yaml");
    Api::<TrainingQueue>::all(kube.clone())
        .patch(&queue.name_any(), &apply, &Patch::Apply(&queue))
        .await
        .expect("queue applied");
    let job: TrainingJob = manifest("examples/trainingjob-simple.yaml");
    let namespace = job.namespace().expect("namespace");
    let jobs = Api::<TrainingJob>::namespaced(kube.clone(), &namespace);
    jobs.patch(&job.name_any(), &apply, &Patch::Apply(&job))
        .await
        .expect("job applied");

    let finished = eventually_within(
        "the job to complete from its workers' reports",
        Duration::from_secs(120),
        || {
            let jobs = jobs.clone();
            let name = job.name_any();
            let epochs = job.spec.epochs();
            async move {
                let live = jobs.get(&name).await.ok()?;
                let status = live.status.clone()?;
                (status.state == Some(TrainingJobState::Completed)
                    && status.current_epoch == Some(epochs))
                .then_some(live)
            }
        },
    )
    .await;
    assert!(
        finished
            .status
            .as_ref()
            .is_some_and(|s| s.metrics.contains_key("loss"))
    );

    // The attempt's Secret holds a token for exactly this job, from the planner's key.
    let secret = Api::<Secret>::namespaced(kube.clone(), &namespace)
        .get(&format!("{}-a0-nats", job.name_any()))
        .await
        .expect("the attempt's credentials Secret exists");
    let data = secret.data.expect("data");
    assert_eq!(
        data[NATS_CA_SECRET_KEY].0,
        std::fs::read(certificates.ca()).expect("the CA file"),
        "the Secret carries the configured CA beside the token"
    );
    let token = data[TOKEN_SECRET_KEY].0.clone();
    let issuer = KeyPair::from_seed(
        std::fs::read_to_string(&secured.issuer_seed)
            .expect("seed")
            .trim(),
    )
    .expect("seed parses");
    let token = WorkerToken::verify(
        &String::from_utf8(token).expect("utf-8"),
        &issuer,
        chrono::Utc::now(),
    )
    .expect("a valid token");
    assert_eq!(
        (token.ns.as_str(), token.job.as_str()),
        (namespace.as_str(), "mnist-training")
    );
    // The workers' connection was the callout's to admit, and nothing was refused.
    let answers = |outcome: &str| {
        metric(
            &planner.registry,
            "trainyard_planner_worker_auth_total",
            &[("outcome", outcome)],
        )
    };
    assert!(answers("authorized") >= 1.0);
    assert_eq!(answers("refused") + answers("unanswered"), 0.0);

    shutdown.cancel();
    simulator.join().await;
}
