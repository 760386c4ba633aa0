//! An object too large for one NATS message (above the server's max payload)
//! is skipped with a warning naming its size, and the watch goes on with the
//! changes after it.

mod fixtures;

use futures::stream;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJob;
use trainyard_contracts::{Incoming, Service, streams};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::{NatsServer, metric, stream_messages};
use trainyard_watcher::{WatcherMetrics, pump};

#[tokio::test]
async fn an_oversized_object_is_skipped_and_the_watch_goes_on() {
    let nats = NatsServer::start_with_config("max_payload: 8192\n", &[]);
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::Watcher, settings, CancellationToken::new())
        .await
        .expect("starts");
    let metrics = WatcherMetrics::register(&runtime.registry).expect("metrics");

    let mut big = fixtures::training_job("big", "ubig", "1");
    big.metadata.annotations = Some([("notes".to_string(), "x".repeat(16 * 1024))].into());
    let watch: Vec<Result<Event<TrainingJob>, watcher::Error>> = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(fixtures::training_job(
            "before", "u1", "1",
        ))),
        Ok(Event::InitApply(big)),
        Ok(Event::InitApply(fixtures::training_job("after", "u2", "1"))),
        Ok(Event::InitDone),
        Ok(Event::Apply(fixtures::training_job("after", "u2", "2"))),
    ];
    pump(
        stream::iter(watch),
        runtime.publisher.clone(),
        metrics.clone(),
        CancellationToken::new(),
    )
    .await;

    let names: Vec<String> = stream_messages(&runtime.jetstream, streams::EVENTS.name, None)
        .await
        .iter()
        .map(|m| {
            Incoming::decode(&m.payload)
                .expect("an envelope")
                .header
                .entity
                .name
        })
        .collect();
    assert_eq!(names, ["before", "after", "after"]);
    assert_eq!(
        metric(
            &runtime.registry,
            "trainyard_watcher_events_total",
            &[("kind", "trainingjob"), ("outcome", "oversized")],
        ),
        1.0
    );
}
