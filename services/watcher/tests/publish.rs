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

    // More changes than the pump keeps in flight, over 50 jobs in turn.
    let changes = 600u64;
    let watch: Vec<Result<Event<TrainingJob>, watcher::Error>> = (1..=changes)
        .map(|version| {
            let job = version % 50;
            Ok(Event::Apply(fixtures::training_job(
                &format!("job-{job}"),
                &format!("uid-{job}"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crash_with_changes_in_flight_loses_none_and_keeps_each_objects_order() {
    let (mut nats, runtime, metrics) = started().await;
    let (changes, watch) = futures::channel::mpsc::unbounded();
    let pumping = tokio::spawn(pump(
        watch,
        runtime.publisher.clone(),
        metrics.clone(),
        CancellationToken::new(),
    ));
    let change = |version: u64| -> Result<Event<TrainingJob>, watcher::Error> {
        let job = version % 20;
        Ok(Event::Apply(fixtures::training_job(
            &format!("job-{job}"),
            &format!("uid-{job}"),
            &version.to_string(),
        )))
    };
    for version in 1..=100 {
        changes.unbounded_send(change(version)).expect("queued");
    }
    trainyard_testkit::eventually("the first 100 changes stored", || async {
        (stored(&runtime).await == 100).then_some(())
    })
    .await;
    for version in 101..=150 {
        changes.unbounded_send(change(version)).expect("queued");
    }
    // Let some of them go out, then kill the server under them.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    nats = tokio::task::spawn_blocking(move || {
        nats.restart();
        nats
    })
    .await
    .expect("restarted");
    for version in 151..=200 {
        changes.unbounded_send(change(version)).expect("queued");
    }
    drop(changes);
    tokio::time::timeout(std::time::Duration::from_secs(120), pumping)
        .await
        .expect("the pump settles everything once the watch ends")
        .expect("pump task");

    let stream = runtime
        .jetstream
        .get_stream(streams::EVENTS.name)
        .await
        .expect("stream");
    let mut seen = std::collections::BTreeSet::new();
    let mut last_of_job = std::collections::HashMap::new();
    for sequence in 1..=stored(&runtime).await {
        let message = stream.get_raw_message(sequence).await.expect("message");
        let change: trainyard_contracts::events::TrainingJobChanged =
            Incoming::decode(&message.payload)
                .expect("envelope")
                .payload()
                .expect("payload");
        let version: u64 = change
            .object
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .expect("resourceVersion");
        let previous = last_of_job.insert(version % 20, version).unwrap_or(0);
        assert!(
            previous <= version,
            "job-{} stored version {version} after {previous}",
            version % 20
        );
        seen.insert(version);
    }
    assert_eq!(seen, (1..=200).collect(), "every change is stored");
    drop(nats);
}

#[tokio::test]
async fn status_only_changes_are_counted_not_published() {
    let (_nats, runtime, metrics) = started().await;
    let at = |rv: &str, epoch: u32| {
        let mut job = fixtures::training_job("a", "ua", rv);
        job.metadata.generation = Some(1);
        job.status =
            serde_json::from_value(serde_json::json!({"state": "Running", "currentEpoch": epoch}))
                .expect("valid status");
        Ok(Event::Apply(job))
    };
    pump_all(&runtime, &metrics, vec![at("1", 1), at("2", 2), at("3", 3)]).await;

    assert_eq!(stored(&runtime).await, 1);
    assert_eq!(
        metrics
            .events
            .with_label_values(&["trainingjob", "unchanged"])
            .get(),
        2
    );
}
