//! The generated NATS permissions on a real nats-server: every service does its
//! whole job (provision, consume, dead-letter, publish, its buckets) under its
//! own identity, and what an identity may not do is refused by the server and
//! leaves nothing in the streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use async_nats::{HeaderMap, ServerError};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::catalog::{self, CatalogEntry};
use trainyard_contracts::permissions::{self, Identity};
use trainyard_contracts::{Incoming, Service, streams};
use trainyard_runtime::{Delivery, HandleError, Handler, Runtime, Settings};
use trainyard_testkit::{NatsServer, eventually, metric};

/// The namespace and job the catalogue's examples are about.
const NAMESPACE: &str = "ml-training";
const JOB: &str = "bert-distributed";

fn submitter() -> Identity {
    Identity::Submitter {
        name: "ci".into(),
        namespaces: vec![NAMESPACE.into()],
    }
}

fn worker() -> Identity {
    Identity::Worker {
        namespace: NAMESPACE.into(),
        job: JOB.into(),
    }
}

fn password(identity: &Identity) -> String {
    format!("secret-of-{}", identity.user())
}

struct Installation {
    nats: NatsServer,
    secrets: tempfile::TempDir,
}

fn installation() -> Installation {
    let mut identities = permissions::deployment(&[submitter()]);
    identities.push(worker());
    let config = permissions::server_config(&identities).expect("derives the config");
    let env: Vec<(String, String)> = identities
        .iter()
        .map(|identity| (permissions::password_variable(identity), password(identity)))
        .collect();
    Installation {
        nats: NatsServer::start_with_config(&config, &env),
        secrets: tempfile::tempdir().expect("secrets dir"),
    }
}

impl Installation {
    fn settings(&self, service: Service) -> Settings {
        let identity = Identity::Service(service);
        let path = self.secrets.path().join(identity.user());
        std::fs::write(&path, password(&identity)).expect("write the password file");
        let mut settings = Settings::default();
        settings.nats.url = self.nats.url();
        settings.nats.user = Some(identity.user());
        settings.nats.password_file = Some(path.display().to_string());
        settings.http.listen = "127.0.0.1:0".into();
        settings
    }

    /// A client connected as `identity`, and the server errors it receives.
    async fn connect(
        &self,
        identity: &Identity,
    ) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
        let (errors, received) = mpsc::unbounded_channel();
        let client =
            async_nats::ConnectOptions::with_user_and_password(identity.user(), password(identity))
                .custom_inbox_prefix(identity.inbox_prefix())
                .event_callback(move |event| {
                    let errors = errors.clone();
                    async move {
                        if let async_nats::Event::ServerError(ServerError::Other(message)) = event {
                            let _ = errors.send(message);
                        }
                    }
                })
                .connect(self.nats.url())
                .await
                .expect("connects");
        (client, received)
    }

    async fn start(&self, service: Service) -> Runtime {
        tokio::time::timeout(
            Duration::from_secs(20),
            Runtime::start(service, self.settings(service), CancellationToken::new()),
        )
        .await
        .unwrap_or_else(|_| panic!("{} could not provision under its identity", service.name()))
        .expect("starts")
    }

    /// Messages stored on `stream` under `filter` (as stored, with the partition).
    async fn stored(&self, stream: &str, filter: &str) -> u64 {
        let (operator, _) = self.connect(&Identity::Operator).await;
        let stream = jetstream::new(operator)
            .get_stream(stream)
            .await
            .expect("stream exists");
        let mut consumer = stream
            .create_consumer(pull::Config {
                filter_subject: filter.to_string(),
                inactive_threshold: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .expect("operator reads");
        consumer.info().await.expect("consumer info").num_pending
    }
}

/// Counts what it is given and rejects it, so every message also goes through
/// the dead-letter path.
struct CountAndReject(Arc<AtomicUsize>);

impl Handler for CountAndReject {
    async fn handle(&self, _message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(HandleError::Reject {
            category: "test",
            reason: "counted".into(),
        })
    }
}

fn headers(entry: &CatalogEntry) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "Nats-Msg-Id",
        format!("{}-{}", entry.message_type, entry.subject).as_str(),
    );
    headers
}

fn body(entry: &CatalogEntry) -> Bytes {
    Bytes::from(serde_json::to_vec(&entry.example).expect("encodes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_does_its_whole_job_under_its_own_identity() {
    let installation = installation();
    let mut runtimes = HashMap::new();
    let mut handled = Vec::new();
    for service in Service::ALL {
        let runtime = installation.start(service).await;
        for bucket in service.buckets() {
            let store = runtime.bucket(bucket).expect("bucket provisioned");
            store
                .put("probe", Bytes::from_static(b"1"))
                .await
                .expect("put");
            assert!(store.get("probe").await.expect("get").is_some());
            store.purge("probe").await.expect("purge a key");
        }
        for consumer in service.consumers() {
            let count = Arc::new(AtomicUsize::new(0));
            handled.push((service, consumer.durable.clone(), count.clone()));
            runtime.spawn_consumer(consumer, Arc::new(CountAndReject(count)));
        }
        runtimes.insert(service.name(), runtime);
    }
    // The gpu-allocator replays a stream with an ephemeral reader at start-up.
    let allocator = &runtimes[Service::GpuAllocator.name()];
    allocator
        .jetstream
        .get_stream(streams::EVENTS.name)
        .await
        .expect("allocator reads the events stream")
        .create_consumer(pull::Config {
            filter_subject: "trainyard.events.node.>".into(),
            inactive_threshold: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .expect("allocator creates a reader");

    let (submitter_client, _) = installation.connect(&submitter()).await;
    let (worker_client, _) = installation.connect(&worker()).await;
    let external = |client: &async_nats::Client| jetstream::new(client.clone());
    for entry in catalog::all().expect("catalogue") {
        let publisher = entry.publisher;
        if publisher.starts_with("external systems") {
            external(&submitter_client)
                .publish_with_headers(entry.subject.clone(), headers(&entry), body(&entry))
                .await
                .expect("submitter publishes")
                .await
                .expect("stored");
        } else if publisher.starts_with("training workers") {
            external(&worker_client)
                .publish_with_headers(entry.subject.clone(), headers(&entry), body(&entry))
                .await
                .expect("worker publishes")
                .await
                .expect("stored");
        } else {
            let services: Vec<&str> = if publisher == "any service" {
                Service::ALL.iter().map(|s| s.name()).collect()
            } else {
                publisher.split(", ").collect()
            };
            for service in services {
                runtimes[service]
                    .publisher
                    .publish_raw(entry.subject.clone(), headers(&entry), body(&entry))
                    .await
                    .unwrap_or_else(|err| {
                        panic!("{service} may publish {}: {err}", entry.message_type)
                    });
            }
        }
    }

    for (service, durable, count) in &handled {
        eventually(&format!("{durable} receives its messages"), || async {
            (count.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
        let registry = &runtimes[service.name()].registry;
        eventually(
            &format!("{durable} dead-letters what it rejects"),
            || async {
                (metric(registry, "trainyard_dead_letters_total", &[]) > 0.0).then_some(())
            },
        )
        .await;
    }
    assert!(
        installation
            .stored(streams::DEAD_LETTER.name, "trainyard.deadletter.>")
            .await
            >= handled.len() as u64
    );
    for runtime in runtimes.into_values() {
        runtime.shutdown.cancel();
        runtime.run_until_shutdown().await.expect("stops");
    }
}

/// Publishes `subject` as `client` and expects NATS to refuse it, naming the subject.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_publishes_are_refused_and_leave_no_trace() {
    let installation = installation();
    let planner = installation.start(Service::Planner).await;
    let (worker_client, mut worker_errors) = installation.connect(&worker()).await;
    let decisions = [
        format!("trainyard.decisions.admission.{NAMESPACE}.{JOB}"),
        format!("trainyard.decisions.preemption.{NAMESPACE}.{JOB}"),
        format!("trainyard.decisions.trialstop.{NAMESPACE}.resnet-sweep"),
        format!("trainyard.decisions.resume.{NAMESPACE}.{JOB}"),
    ];
    for subject in &decisions {
        refused(&worker_client, &mut worker_errors, subject).await;
    }
    let other_job = [
        format!("trainyard.worker.progress.{NAMESPACE}.other-job"),
        format!("trainyard.worker.checkpoint.{NAMESPACE}.other-job"),
        format!("trainyard.worker.progress.team-b.{JOB}"),
    ];
    for subject in &other_job {
        refused(&worker_client, &mut worker_errors, subject).await;
    }
    let delete = format!("$JS.API.STREAM.DELETE.{}", streams::EVENTS.name);
    refused(&worker_client, &mut worker_errors, &delete).await;

    let (submitter_client, mut submitter_errors) = installation.connect(&submitter()).await;
    let elsewhere = "trainyard.submit.trainingjob.kube-system.escalate";
    refused(&submitter_client, &mut submitter_errors, elsewhere).await;
    refused(
        &submitter_client,
        &mut submitter_errors,
        &format!("trainyard.decisions.admission.{NAMESPACE}.{JOB}"),
    )
    .await;

    // A service may not act outside its role either.
    let (tuner, mut tuner_errors) = installation
        .connect(&Identity::Service(Service::HpoTuner))
        .await;
    refused(
        &tuner,
        &mut tuner_errors,
        &format!("trainyard.decisions.admission.{NAMESPACE}.{JOB}"),
    )
    .await;
    refused(&tuner, &mut tuner_errors, &delete).await;

    // What the worker may do still works, and is all that was stored.
    jetstream::new(worker_client.clone())
        .publish(
            format!("trainyard.worker.progress.{NAMESPACE}.{JOB}"),
            Bytes::from_static(b"{}"),
        )
        .await
        .expect("own progress handed over")
        .await
        .expect("own progress stored");
    assert_eq!(
        installation
            .stored(streams::DECISIONS.name, "trainyard.decisions.>")
            .await,
        0
    );
    assert_eq!(
        installation
            .stored(streams::WORKER.name, "trainyard.worker.>")
            .await,
        1
    );
    assert_eq!(
        installation
            .stored(streams::SUBMIT.name, "trainyard.submit.>")
            .await,
        0
    );
    let (operator, _) = installation.connect(&Identity::Operator).await;
    jetstream::new(operator)
        .get_stream(streams::EVENTS.name)
        .await
        .expect("the events stream survived the delete attempts");
    planner.shutdown.cancel();
    planner.run_until_shutdown().await.expect("stops");
}
