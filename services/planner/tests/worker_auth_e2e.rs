//! Workers' per-job NATS credentials on a real nats-server with the generated
//! configuration and its auth callout answered by the planner's responder: a
//! worker with its job's token reports for that job only; a bad token is
//! refused at connect; the services keep their passwords.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{ConnectOptions, ServerError};
use bytes::Bytes;
use futures::StreamExt;
use nkeys::KeyPair;
use planner_core::WorkerToken;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_contracts::permissions::{self, CALLOUT_ISSUER_VARIABLE, Identity};
use trainyard_planner::callout;
use trainyard_testkit::NatsServer;

const NAMESPACE: &str = "ml";
const JOB: &str = "bert";

fn password(identity: &Identity) -> String {
    format!("secret-of-{}", identity.user())
}

struct Installation {
    nats: NatsServer,
    issuer: Arc<KeyPair>,
    responder: CancellationToken,
    registry: prometheus::Registry,
}

impl Drop for Installation {
    fn drop(&mut self) {
        self.responder.cancel();
    }
}

/// The server with the generated users and callout, and the planner's responder.
async fn installation() -> Installation {
    let issuer = Arc::new(KeyPair::new_account());
    let identities = permissions::deployment(&[]);
    let config = permissions::server_config_with(&identities, true).expect("derives the config");
    let mut env: Vec<(String, String)> = identities
        .iter()
        .map(|identity| (permissions::password_variable(identity), password(identity)))
        .collect();
    env.push((CALLOUT_ISSUER_VARIABLE.to_string(), issuer.public_key()));
    let nats = NatsServer::start_with_config(&config, &env);
    let planner = Identity::Service(Service::Planner);
    let client = ConnectOptions::with_user_and_password(planner.user(), password(&planner))
        .custom_inbox_prefix(planner.inbox_prefix())
        .connect(nats.url())
        .await
        .expect("the planner connects with its password");
    let registry = prometheus::Registry::new();
    let metrics = callout::CalloutMetrics::register(&registry).expect("metrics");
    let responder = CancellationToken::new();
    let serving = callout::serve(client.clone(), issuer.clone(), metrics, responder.clone());
    tokio::spawn(async move { serving.await.expect("responder runs") });
    // The subscription is in place once a round trip through the server is done.
    client.flush().await.expect("flushed");
    Installation {
        nats,
        issuer,
        responder,
        registry,
    }
}

fn token(key: &KeyPair, namespace: &str, job: &str, valid_for: i64) -> String {
    WorkerToken {
        ns: namespace.into(),
        job: job.into(),
        exp: chrono::Utc::now().timestamp() + valid_for,
    }
    .sign(key)
    .expect("signs")
}

/// A worker of `ml/bert` connected with `token`, and the server errors it receives.
async fn worker(
    nats: &NatsServer,
    token: String,
) -> Result<(async_nats::Client, mpsc::UnboundedReceiver<String>), async_nats::ConnectError> {
    let (errors, received) = mpsc::unbounded_channel();
    let identity = Identity::Worker {
        namespace: NAMESPACE.into(),
        job: JOB.into(),
    };
    ConnectOptions::with_token(token)
        .custom_inbox_prefix(identity.inbox_prefix())
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(ServerError::Other(message)) = event {
                    let _ = errors.send(message);
                }
            }
        })
        .connect(nats.url())
        .await
        .map(|client| (client, received))
}

async fn operator(nats: &NatsServer) -> async_nats::Client {
    ConnectOptions::with_user_and_password("operator".into(), password(&Identity::Operator))
        .connect(nats.url())
        .await
        .expect("the operator connects with its password")
}

async fn refused(
    client: &async_nats::Client,
    errors: &mut mpsc::UnboundedReceiver<String>,
    subject: &str,
) {
    client
        .publish(subject.to_string(), Bytes::from_static(b"{}"))
        .await
        .expect("handed to the connection");
    client.flush().await.expect("flushed");
    let error = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .unwrap_or_else(|_| panic!("no refusal for {subject}"))
        .expect("error stream open");
    assert!(
        error.contains("Permissions Violation") && error.contains(subject),
        "refusal names the subject: {error}"
    );
}

fn answers(installation: &Installation, outcome: &str) -> f64 {
    trainyard_testkit::metric(
        &installation.registry,
        "trainyard_planner_worker_auth_total",
        &[("outcome", outcome)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_its_jobs_token_reports_for_that_job_only() {
    let installation = installation().await;
    let operator = operator(&installation.nats).await;
    let mut reports = operator
        .subscribe("trainyard.worker.>")
        .await
        .expect("operator subscribes");
    operator.flush().await.expect("flushed");

    let (worker, mut errors) = worker(
        &installation.nats,
        token(&installation.issuer, NAMESPACE, JOB, 600),
    )
    .await
    .expect("a worker with its job's token connects");
    let mut commands = worker
        .subscribe(format!("trainyard.commands.stop.{NAMESPACE}.{JOB}"))
        .await
        .expect("subscribes to its commands");
    worker.flush().await.expect("flushed");

    for kind in ["progress", "checkpoint"] {
        let subject = format!("trainyard.worker.{kind}.{NAMESPACE}.{JOB}");
        worker
            .publish(subject.clone(), Bytes::from_static(b"{}"))
            .await
            .expect("published");
        let received = tokio::time::timeout(Duration::from_secs(5), reports.next())
            .await
            .expect("the report arrives")
            .expect("subscription open");
        assert_eq!(received.subject.as_str(), subject);
    }
    operator
        .publish(
            format!("trainyard.commands.stop.{NAMESPACE}.{JOB}"),
            Bytes::from_static(b"{}"),
        )
        .await
        .expect("operator sends a command");
    tokio::time::timeout(Duration::from_secs(5), commands.next())
        .await
        .expect("the worker hears its command")
        .expect("subscription open");

    for subject in [
        format!("trainyard.worker.progress.{NAMESPACE}.other-job"),
        format!("trainyard.worker.progress.team-b.{JOB}"),
        format!("trainyard.decisions.admission.{NAMESPACE}.{JOB}"),
        "$JS.API.STREAM.DELETE.TRAINYARD_EVENTS".to_string(),
    ] {
        refused(&worker, &mut errors, &subject).await;
    }
    // Another job's commands are not its to hear.
    worker
        .subscribe(format!("trainyard.commands.stop.{NAMESPACE}.other-job"))
        .await
        .expect("handed to the connection");
    worker.flush().await.expect("flushed");
    let error = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .expect("a refusal")
        .expect("error stream open");
    assert!(
        error.contains("Permissions Violation for Subscription"),
        "{error}"
    );
    assert!(answers(&installation, "authorized") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_refused_at_connect_and_services_keep_their_passwords() {
    let installation = installation().await;
    let nats = &installation.nats;
    let expired = token(&installation.issuer, NAMESPACE, JOB, -1);
    let foreign = token(&KeyPair::new_account(), NAMESPACE, JOB, 600);
    for (what, bad) in [
        ("an expired token", expired),
        ("a token signed by another key", foreign),
        ("garbage", "not-a-token".to_string()),
        ("an empty token", String::new()),
    ] {
        let result = worker(nats, bad).await;
        assert!(result.is_err(), "{what} was accepted");
    }
    // A wrong service password goes to the callout too, and is refused there.
    assert!(
        ConnectOptions::with_user_and_password("watcher".into(), "wrong".into())
            .connect(nats.url())
            .await
            .is_err()
    );
    assert!(answers(&installation, "refused") >= 4.0);

    // The responder lives on: a good token still gets in, and so do the services.
    worker(nats, token(&installation.issuer, NAMESPACE, JOB, 600))
        .await
        .expect("a valid token still connects");
    for service in Service::ALL {
        let identity = Identity::Service(service);
        let client = ConnectOptions::with_user_and_password(identity.user(), password(&identity))
            .custom_inbox_prefix(identity.inbox_prefix())
            .connect(nats.url())
            .await
            .unwrap_or_else(|err| panic!("{} connects: {err}", service.name()));
        client.flush().await.expect("flushed");
    }
}
