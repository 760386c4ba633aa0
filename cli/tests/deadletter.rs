//! `trainyard deadletter` against a real NATS server: a message a real
//! consumer dead-lettered is listed, shown and replayed, and the consumer then
//! handles it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use tokio_util::sync::CancellationToken;
use trainyard_cli::cli::Cli;
use trainyard_cli::error::CliError;
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{EntityRef, Incoming, Service, streams};
use trainyard_runtime::{Delivery, HandleError, Handler, Runtime, Settings};
use trainyard_testkit::{NatsServer, eventually};

/// Refuses every message until it is fixed, then records the envelope ids it handles.
#[derive(Default)]
struct FixableHandler {
    fixed: AtomicBool,
    handled: Mutex<Vec<String>>,
}

impl Handler for FixableHandler {
    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        if !self.fixed.load(Ordering::SeqCst) {
            return Err(HandleError::Reject {
                category: "handler",
                reason: format!(
                    "epoch counter unreadable for {}",
                    message.header.entity.name
                ),
            });
        }
        self.handled
            .lock()
            .expect("lock")
            .push(message.header.id.to_string());
        Ok(())
    }
}

async fn trainyard(args: &[&str]) -> (String, String, Result<(), CliError>) {
    let cli = Cli::parse_from(std::iter::once("trainyard").chain(args.iter().copied()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let no_cluster = async || -> Result<kube::Client, CliError> {
        panic!("dead letters need no Kubernetes API")
    };
    let result = trainyard_cli::run(cli, no_cluster, &mut out, &mut err).await;
    (
        String::from_utf8(out).expect("utf-8"),
        String::from_utf8(err).expect("utf-8"),
        result,
    )
}

async fn dead_letter_count(runtime: &Runtime) -> u64 {
    let mut stream = runtime
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("stream");
    stream.info().await.expect("info").state.messages
}

#[tokio::test]
async fn a_dead_letter_is_listed_shown_and_replayed_and_the_consumer_then_handles_it() {
    let nats = NatsServer::start();
    let url = nats.url();
    let mut settings = Settings::default();
    settings.nats.url = url.clone();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::HpoTuner, settings, CancellationToken::new())
        .await
        .expect("runtime starts");
    let spec = Service::HpoTuner
        .consumers()
        .into_iter()
        .find(|c| c.stream.name == streams::WORKER.name)
        .expect("hpo-tuner reads worker progress");
    let handler = Arc::new(FixableHandler::default());
    runtime.spawn_consumer(spec.clone(), handler.clone());

    let envelope = runtime.publisher.envelope(
        EntityRef::new("ml", "bert.v2", ""),
        ProgressReported {
            worker_index: 0,
            attempt: 0,
            epoch: 3,
            total_epochs: Some(10),
            step: 0,
            metrics: Default::default(),
        },
    );
    let id = envelope.id.to_string();
    runtime.publisher.publish(envelope).await.expect("publish");
    eventually("the message is dead-lettered", async || {
        (dead_letter_count(&runtime).await == 1).then_some(())
    })
    .await;

    let (out, _, result) = trainyard(&["deadletter", "list", "--nats-url", &url]).await;
    result.expect("list");
    let row = out.lines().nth(1).expect("one dead letter");
    for expected in [
        "trainyard.worker.progress.ml.bert_v2",
        "hpo-tuner-worker",
        "handler",
        "epoch counter unreadable for bert.v2",
    ] {
        assert!(row.contains(expected), "{expected} in {out}");
    }
    let sequence = row.split_whitespace().next().expect("SEQ").to_string();

    let (out, err, result) = trainyard(&[
        "deadletter",
        "list",
        "--consumer",
        "planner-worker",
        "--nats-url",
        &url,
    ])
    .await;
    result.expect("list of another consumer");
    assert!(out.is_empty() && err.contains("No dead letters"), "{out}");
    let (out, _, result) = trainyard(&[
        "deadletter",
        "list",
        "--stream",
        streams::WORKER.name,
        "-o",
        "json",
        "--nats-url",
        &url,
    ])
    .await;
    result.expect("json list");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed[0]["sequence"].to_string(), sequence);
    assert_eq!(listed[0]["consumer"], "hpo-tuner-worker");
    assert_eq!(listed[0]["category"], "handler");

    let (out, _, result) = trainyard(&["deadletter", "show", &sequence, "--nats-url", &url]).await;
    result.expect("show");
    assert!(out.contains("Reason:       epoch counter unreadable for bert.v2"));
    assert!(out.contains(&format!("  Nats-Msg-Id: {id}")), "{out}");
    assert!(
        out.contains(&format!("  \"id\": \"{id}\"")),
        "payload pretty-printed: {out}"
    );

    handler.fixed.store(true, Ordering::SeqCst);
    let (out, _, result) = trainyard(&[
        "deadletter",
        "replay",
        "--all",
        "--consumer",
        "hpo-tuner-worker",
        "--nats-url",
        &url,
    ])
    .await;
    result.expect("replay");
    assert!(
        out.starts_with(&format!(
            "replayed {sequence}: trainyard.worker.progress.ml.bert_v2 (dead-lettered by hpo-tuner-worker) -> TRAINYARD_WORKER sequence 2"
        )),
        "{out}"
    );
    eventually("the consumer handles the replayed message", async || {
        let handled = handler.handled.lock().expect("lock").clone();
        (!handled.is_empty()).then_some(handled)
    })
    .await;
    assert_eq!(
        *handler.handled.lock().expect("lock"),
        [id],
        "the same envelope"
    );
    assert_eq!(
        dead_letter_count(&runtime).await,
        0,
        "the dead letter is gone"
    );
    let (_, err, result) = trainyard(&["deadletter", "replay", "--all", "--nats-url", &url]).await;
    result.expect("nothing left to replay");
    assert!(err.contains("No dead letters to replay"));
    let (_, _, result) = trainyard(&["deadletter", "show", &sequence, "--nats-url", &url]).await;
    assert!(result.is_err(), "a replayed dead letter is gone");

    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}
