//! The contracts through a real JetStream: every message type round-trips,
//! duplicates are stored once, bad messages are dead-lettered and the consumer goes on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{EntityRef, Incoming, Service, catalog, streams, subject};
use trainyard_runtime::{Delivery, HandleError, Handler, Runtime, Settings};
use trainyard_testkit::NatsServer;

fn settings(nats: &NatsServer) -> Settings {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.nats.max_deliver = 2;
    settings.nats.ack_wait_seconds = 5;
    settings.http.listen = "127.0.0.1:0".to_string();
    settings
}

async fn start(nats: &NatsServer, service: Service) -> Runtime {
    Runtime::start(service, settings(nats), CancellationToken::new())
        .await
        .expect("runtime starts")
}

async fn stream_messages(runtime: &Runtime, name: &str) -> u64 {
    let mut stream = runtime
        .jetstream
        .get_stream(name)
        .await
        .expect("stream exists");
    stream.info().await.expect("stream info").state.messages
}

#[tokio::test]
async fn every_message_type_round_trips_through_jetstream() {
    let nats = NatsServer::start();
    let runtime = start(&nats, Service::Planner).await;
    // Provisioning again (a second service, a restart) changes nothing.
    let again = start(&nats, Service::Notifier).await;
    for spec in streams::ALL {
        let mut stream = runtime
            .jetstream
            .get_stream(spec.name)
            .await
            .expect("provisioned");
        let info = stream.info().await.expect("info");
        assert_eq!(
            info.config.storage,
            async_nats::jetstream::stream::StorageType::File
        );
        assert_eq!(info.config.num_replicas, 1);
    }
    assert!(
        runtime
            .bucket(trainyard_contracts::Bucket::Planner)
            .is_some()
    );

    for entry in catalog::all().expect("catalog") {
        let body = serde_json::to_vec(&entry.example).expect("encodes");
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Msg-Id",
            format!("catalog-{}", entry.message_type).as_str(),
        );
        let published = again
            .publisher
            .publish_raw(entry.subject.clone(), headers, Bytes::from(body))
            .await
            .unwrap_or_else(|err| panic!("{} publishes: {err}", entry.message_type));
        assert!(!published.duplicate);

        let family = subject::parse(&entry.subject)
            .expect("per-entity subject")
            .family;
        let spec = streams::ALL
            .iter()
            .find(|s| s.family.as_str() == family)
            .expect("a stream holds the family");
        let stream = runtime
            .jetstream
            .get_stream(spec.name)
            .await
            .expect("stream");
        let stored = stream
            .get_raw_message(published.stream_sequence)
            .await
            .expect("stored message");
        let incoming = Incoming::decode(&stored.payload).expect("decodes");
        assert_eq!(incoming.header.message_type, entry.message_type);
        let back: serde_json::Value = serde_json::from_slice(&stored.payload).expect("json");
        assert_eq!(
            back, entry.example,
            "{} survives the trip unchanged",
            entry.message_type
        );
        if spec.partitioned {
            let parsed = subject::parse(stored.subject.as_str()).expect("stored subject parses");
            let partition = parsed
                .partition
                .expect("partition token inserted by the server");
            assert!(partition < subject::PARTITIONS, "{}", stored.subject);
            assert_eq!(
                parsed.name,
                subject::parse(&entry.subject).expect("parses").name
            );
        }
    }
}

#[tokio::test]
async fn duplicate_publishes_are_stored_once() {
    let nats = NatsServer::start();
    let runtime = start(&nats, Service::Watcher).await;
    let envelope = runtime.publisher.envelope(
        EntityRef::new("ml", "bert", "u1"),
        ProgressReported {
            worker_index: 0,
            attempt: 0,
            epoch: 1,
            total_epochs: None,
            step: 10,
            metrics: Default::default(),
        },
    );
    let first = runtime
        .publisher
        .publish(envelope.clone())
        .await
        .expect("first");
    let second = runtime
        .publisher
        .publish(envelope.clone())
        .await
        .expect("second");
    assert!(!first.duplicate);
    assert!(
        second.duplicate,
        "same Nats-Msg-Id inside the window is a duplicate"
    );
    assert_eq!(first.stream_sequence, second.stream_sequence);
    let keyed = runtime
        .publisher
        .publish_with_id(envelope, "uid-1:rv-42")
        .await
        .expect("explicit id");
    assert!(!keyed.duplicate);
    assert_eq!(stream_messages(&runtime, streams::WORKER.name).await, 2);
}

/// Records what it handled; fails for entity `flaky` every time.
#[derive(Default)]
struct Recorder {
    handled: Mutex<Vec<String>>,
}

impl Handler for Recorder {
    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let progress: ProgressReported = message.payload()?;
        if message.header.entity.name == "flaky" {
            return Err(HandleError::Retry("downstream unavailable".to_string()));
        }
        self.handled
            .lock()
            .expect("lock")
            .push(format!("{}@{}", message.header.entity.name, progress.epoch));
        Ok(())
    }
}

#[tokio::test]
async fn bad_messages_are_dead_lettered_and_the_consumer_keeps_going() {
    let nats = NatsServer::start();
    let runtime = start(&nats, Service::HpoTuner).await;
    let recorder = Arc::new(Recorder::default());
    let spec = Service::HpoTuner
        .consumers()
        .into_iter()
        .find(|c| c.stream.name == streams::WORKER.name)
        .expect("hpo-tuner reads worker progress");
    let publish = |name: &str, epoch: u32| {
        runtime.publisher.envelope(
            EntityRef::new("ml", name, ""),
            ProgressReported {
                worker_index: 0,
                attempt: 0,
                epoch,
                total_epochs: None,
                step: 0,
                metrics: Default::default(),
            },
        )
    };
    runtime
        .publisher
        .publish(publish("good", 1))
        .await
        .expect("publish");
    let raw = |body: &'static [u8]| {
        runtime.publisher.publish_raw(
            "trainyard.worker.progress.ml.broken".to_string(),
            HeaderMap::new(),
            Bytes::from_static(body),
        )
    };
    raw(b"{ this is not json").await.expect("publish malformed");
    let mut future = serde_json::to_value(publish("future", 2)).expect("json");
    future["schemaVersion"] = json!(9);
    runtime
        .publisher
        .publish_raw(
            "trainyard.worker.progress.ml.future".to_string(),
            HeaderMap::new(),
            Bytes::from(serde_json::to_vec(&future).expect("json")),
        )
        .await
        .expect("publish future version");
    runtime
        .publisher
        .publish(publish("flaky", 3))
        .await
        .expect("publish");
    runtime
        .publisher
        .publish(publish("after", 4))
        .await
        .expect("publish");

    runtime.spawn_consumer(spec.clone(), recorder.clone());

    let deadline = Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let count = stream_messages(&runtime, streams::DEAD_LETTER.name).await;
        if count >= 3 || Instant::now() > deadline {
            break count;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        letters, 3,
        "malformed, unsupported version and exhausted retries"
    );
    assert_eq!(
        *recorder.handled.lock().expect("lock"),
        vec!["good@1".to_string(), "after@4".to_string()],
        "good messages around the bad ones are handled"
    );

    let consumer = runtime
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("stream")
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("ordered consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let mut categories = Vec::new();
    for _ in 0..3 {
        let message = messages.next().await.expect("a dead letter").expect("ok");
        assert_eq!(
            message.subject.as_str(),
            subject::dead_letter(streams::WORKER.name, &spec.durable)
        );
        let reason = message
            .headers
            .as_ref()
            .and_then(|h| h.get(trainyard_contracts::dead_letter::REASON_HEADER))
            .map(|v| v.as_str().to_string())
            .expect("reason header");
        let letter: DeadLetter =
            serde_json::from_slice(&message.payload).expect("dead letter record");
        assert_eq!(letter.reason.replace('\n', " "), reason);
        assert!(!letter.payload.is_empty(), "the original body is kept");
        categories.push(letter.category);
    }
    categories.sort();
    assert_eq!(
        categories,
        ["malformed", "retries_exhausted", "unsupported_version"]
    );
    let metrics = prometheus::TextEncoder::new()
        .encode_to_string(&runtime.registry.gather())
        .expect("encode");
    assert!(
        metrics.contains(
            "trainyard_dead_letters_total{category=\"malformed\",consumer=\"hpo-tuner-worker\",stream=\"TRAINYARD_WORKER\"} 1"
        ),
        "{metrics}"
    );
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}

#[tokio::test]
async fn a_message_two_consumers_reject_is_dead_lettered_for_each() {
    let nats = NatsServer::start();
    let tuner = start(&nats, Service::HpoTuner).await;
    let planner = start(&nats, Service::Planner).await;
    let worker_consumer = |service: Service| {
        service
            .consumers()
            .into_iter()
            .find(|c| c.stream.name == streams::WORKER.name)
            .expect("reads worker progress")
    };
    tuner.spawn_consumer(
        worker_consumer(Service::HpoTuner),
        Arc::new(Recorder::default()),
    );
    planner.spawn_consumer(
        worker_consumer(Service::Planner),
        Arc::new(Recorder::default()),
    );
    tuner
        .publisher
        .publish_raw(
            "trainyard.worker.progress.ml.broken".to_string(),
            HeaderMap::new(),
            Bytes::from_static(b"{ truncated"),
        )
        .await
        .expect("publish malformed");

    let deadline = Instant::now() + Duration::from_secs(20);
    while stream_messages(&tuner, streams::DEAD_LETTER.name).await < 2 && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let consumer = tuner
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("stream")
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .expect("ordered consumer");
    let pending = stream_messages(&tuner, streams::DEAD_LETTER.name).await;
    let mut messages = consumer
        .messages()
        .await
        .expect("messages")
        .take(pending as usize);
    let mut rejected_by = Vec::new();
    while let Some(message) = messages.next().await {
        let letter: DeadLetter =
            serde_json::from_slice(&message.expect("ok").payload).expect("dead letter record");
        assert_eq!(letter.category, "malformed");
        rejected_by.push(letter.consumer);
    }
    rejected_by.sort();
    assert_eq!(
        rejected_by,
        [
            worker_consumer(Service::HpoTuner).durable,
            worker_consumer(Service::Planner).durable
        ],
        "one dead letter per consumer, none dropped as a duplicate"
    );
}

/// Handles several entities at once: job `a`'s first message waits until job `b`
/// has been started, which only happens if lanes overlap (`a` and `b` fall in
/// different lanes of 4; the lane hash is deterministic).
struct Overlapping {
    handled: Mutex<Vec<String>>,
    b_started: tokio::sync::Notify,
}

impl Handler for Overlapping {
    fn lanes(&self) -> usize {
        4
    }

    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let progress: ProgressReported = message.payload()?;
        let name = message.header.entity.name.clone();
        if name == "b" {
            self.b_started.notify_one();
        }
        let overlapped = if (name.as_str(), progress.epoch) == ("a", 1) {
            tokio::time::timeout(Duration::from_secs(10), self.b_started.notified())
                .await
                .is_ok()
        } else {
            true
        };
        self.handled
            .lock()
            .expect("lock")
            .push(format!("{name}@{}:{overlapped}", progress.epoch));
        Ok(())
    }
}

#[tokio::test]
async fn lanes_overlap_entities_and_keep_each_entitys_order() {
    let nats = NatsServer::start();
    let runtime = start(&nats, Service::HpoTuner).await;
    let spec = Service::HpoTuner
        .consumers()
        .into_iter()
        .find(|c| c.stream.name == streams::WORKER.name)
        .expect("hpo-tuner reads worker progress");
    let handler = Arc::new(Overlapping {
        handled: Mutex::default(),
        b_started: tokio::sync::Notify::new(),
    });
    for (name, epoch) in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)] {
        let envelope = runtime.publisher.envelope(
            EntityRef::new("ml", name, ""),
            ProgressReported {
                worker_index: 0,
                attempt: 0,
                epoch,
                total_epochs: None,
                step: 0,
                metrics: Default::default(),
            },
        );
        runtime.publisher.publish(envelope).await.expect("publish");
    }
    runtime.spawn_consumer(spec, handler.clone());
    let handled = trainyard_testkit::eventually("five messages handled", || {
        let handler = handler.clone();
        async move {
            let handled = handler.handled.lock().expect("lock").clone();
            (handled.len() == 5).then_some(handled)
        }
    })
    .await;
    let of = |entity: &str| -> Vec<String> {
        handled
            .iter()
            .filter(|h| h.starts_with(entity))
            .cloned()
            .collect()
    };
    assert_eq!(
        of("a@"),
        ["a@1:true", "a@2:true", "a@3:true"],
        "{handled:?}"
    );
    assert_eq!(of("b@"), ["b@1:true", "b@2:true"], "{handled:?}");
    assert_eq!(
        handled[0], "b@1:true",
        "b ran while a's first message waited: {handled:?}"
    );
}
