//! Stream limits through a real JetStream: provisioning gives every stream its
//! byte limit and discard policy (also to a stream that existed without them),
//! a full stream that must not lose messages refuses a publish, and worker
//! progress makes room by dropping its oldest.

use async_nats::HeaderMap;
use async_nats::jetstream::stream::{self, DiscardPolicy};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_contracts::streams::{self, Discard};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;

const SMALL: i64 = 16 * 1024;

fn settings(nats: &NatsServer) -> Settings {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    settings.nats.stream_max_bytes.extend([
        ("decisions".to_string(), SMALL),
        ("worker".to_string(), SMALL),
    ]);
    settings
}

#[tokio::test]
async fn every_stream_gets_its_limit_and_discard_policy_also_when_it_existed_before() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let jetstream = async_nats::jetstream::new(client);
    // As an earlier release provisioned it: no byte limit, oldest discarded.
    jetstream
        .create_stream(stream::Config {
            name: streams::EVENTS.name.to_string(),
            subjects: streams::EVENTS.subjects(),
            ..Default::default()
        })
        .await
        .expect("unbounded stream");

    let runtime = Runtime::start(Service::Planner, settings(&nats), CancellationToken::new())
        .await
        .expect("runtime starts");
    for spec in streams::ALL {
        let mut stream = runtime
            .jetstream
            .get_stream(spec.name)
            .await
            .expect("provisioned");
        let config = stream.info().await.expect("info").config.clone();
        let expected = match spec.family.as_str() {
            "decisions" | "worker" => SMALL,
            _ => spec.default_max_bytes,
        };
        assert_eq!(config.max_bytes, expected, "{}", spec.name);
        let discard = match spec.discard {
            Discard::Old => DiscardPolicy::Old,
            Discard::New => DiscardPolicy::New,
        };
        assert_eq!(config.discard, discard, "{}", spec.name);
    }
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}

#[tokio::test]
async fn a_full_decisions_stream_refuses_a_publish_and_a_full_worker_stream_drops_its_oldest() {
    let nats = NatsServer::start();
    let runtime = Runtime::start(Service::Planner, settings(&nats), CancellationToken::new())
        .await
        .expect("runtime starts");
    let body = Bytes::from(vec![b'x'; 1024]);
    let publish = async |subject: &str, n: usize| {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{subject}-{n}").as_str());
        runtime
            .publisher
            .publish_raw(subject.to_string(), headers, body.clone())
            .await
    };

    let decisions = "trainyard.decisions.admission.ml.bert";
    let mut stored = 0;
    let refusal = loop {
        match publish(decisions, stored).await {
            Ok(_) => stored += 1,
            Err(err) => break err.to_string(),
        }
        assert!(stored < 100, "a 16 KiB stream took 100 KiB");
    };
    assert!(stored > 0, "the first messages fit");
    assert!(
        refusal.contains("maximum bytes"),
        "the publisher is told why: {refusal}"
    );
    let stream = runtime
        .jetstream
        .get_stream(streams::DECISIONS.name)
        .await
        .expect("stream");
    stream
        .get_raw_message(1)
        .await
        .expect("the oldest decision is kept");

    let worker = "trainyard.worker.progress.ml.bert";
    for n in 0..(2 * stored + 4) {
        publish(worker, n)
            .await
            .expect("worker progress is never refused");
    }
    let mut stream = runtime
        .jetstream
        .get_stream(streams::WORKER.name)
        .await
        .expect("stream");
    let state = stream.info().await.expect("info").state.clone();
    assert!(state.first_sequence > 1, "the oldest progress made room");
    assert!(state.bytes <= SMALL as u64);
    assert!(stream.get_raw_message(1).await.is_err());

    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}
