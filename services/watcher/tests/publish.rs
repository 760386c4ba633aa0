//! The watch pump against a mocked watch stream and a real NATS server: changes
//! are published once, a relist publishes nothing new, vanished objects become deletions.

mod fixtures;

use futures::stream;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJob;
use trainyard_contracts::{Incoming, Service, streams};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;
use trainyard_watcher::{WatcherMetrics, pump};

async fn stored(runtime: &Runtime) -> u64 {
    let mut stream = runtime
        .jetstream
        .get_stream(streams::EVENTS.name)
        .await
        .expect("stream");
    stream.info().await.expect("info").state.messages
}

/// A NATS server and a watcher runtime on it (the server stops when dropped).
async fn started() -> (NatsServer, Runtime, WatcherMetrics) {
    let nats = NatsServer::start();
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::Watcher, settings, CancellationToken::new())
        .await
        .expect("starts");
    let metrics = WatcherMetrics::register(&runtime.registry).expect("metrics");
    (nats, runtime, metrics)
}

/// Runs the pump over `watch` until the watch ends.
async fn pump_all(
    runtime: &Runtime,
    metrics: &WatcherMetrics,
    watch: Vec<Result<Event<TrainingJob>, watcher::Error>>,
) {
    pump(
        stream::iter(watch),
        runtime.publisher.clone(),
        metrics.clone(),
        CancellationToken::new(),
    )
    .await;
}

#[tokio::test]
async fn relists_publish_no_duplicates_and_report_deletions() {
    let (_nats, runtime, metrics) = started().await;

    let a = fixtures::training_job("a", "ua", "1");
    let b = fixtures::training_job("b", "ub", "1");
    let a2 = fixtures::training_job("a", "ua", "2");
    let watch: Vec<Result<Event<TrainingJob>, watcher::Error>> = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(a.clone())),
        Ok(Event::InitApply(b.clone())),
        Ok(Event::InitDone),
        Ok(Event::Apply(a2.clone())),
        // The watch restarts: a2 and b listed again (same resourceVersions).
        Ok(Event::Init),
        Ok(Event::InitApply(a2.clone())),
        Ok(Event::InitApply(b.clone())),
        Ok(Event::InitDone),
        // Restarts again; b is gone.
        Ok(Event::Init),
        Ok(Event::InitApply(a2)),
        Ok(Event::InitDone),
    ];
    pump_all(&runtime, &metrics, watch).await;

    assert_eq!(
        stored(&runtime).await,
        4,
        "a@1, b@1, a@2 and b deleted; relists add nothing"
    );
    assert_eq!(
        metrics
            .events
            .with_label_values(&["trainingjob", "duplicate"])
            .get(),
        3
    );

    let stream = runtime
        .jetstream
        .get_stream(streams::EVENTS.name)
        .await
        .expect("stream");
    let last = stream.get_raw_message(4).await.expect("fourth message");
    let incoming = Incoming::decode(&last.payload).expect("envelope");
    let deleted: trainyard_contracts::events::TrainingJobChanged =
        incoming.payload().expect("payload");
    assert_eq!(deleted.change, trainyard_contracts::events::Change::Deleted);
    assert_eq!(incoming.header.entity.name, "b");
    assert!(
        last.subject.starts_with("trainyard.events.trainingjob."),
        "{}",
        last.subject
    );
}

#[tokio::test]
async fn changes_sent_ahead_of_their_acknowledgements_are_stored_in_watch_order() {
    let (_nats, runtime, metrics) = started().await;

    // More changes than the pump keeps in flight, alternating between two jobs.
    let changes = 600u64;
    let watch: Vec<Result<Event<TrainingJob>, watcher::Error>> = (1..=changes)
        .map(|version| {
            let (name, uid) = if version % 2 == 0 {
                ("a", "ua")
            } else {
                ("b", "ub")
            };
            Ok(Event::Apply(fixtures::training_job(
                name,
                uid,
                &version.to_string(),
            )))
        })
        .collect();
    pump_all(&runtime, &metrics, watch).await;

    assert_eq!(stored(&runtime).await, changes);
    assert_eq!(
        metrics
            .events
            .with_label_values(&["trainingjob", "stored"])
            .get(),
        changes,
        "every acknowledgement is counted before the pump returns"
    );
    let stream = runtime
        .jetstream
        .get_stream(streams::EVENTS.name)
        .await
        .expect("stream");
    for sequence in 1..=changes {
        let message = stream.get_raw_message(sequence).await.expect("message");
        let incoming = Incoming::decode(&message.payload).expect("envelope");
        let change: trainyard_contracts::events::TrainingJobChanged =
            incoming.payload().expect("payload");
        assert_eq!(
            change.object.metadata.resource_version.as_deref(),
            Some(sequence.to_string().as_str()),
            "stream sequence {sequence}"
        );
    }
}
