//! Passing failures through a real JetStream: a message whose handler fails
//! transiently more often than `max_deliver` is handled again in place until
//! it succeeds, is never redelivered or dead-lettered, and messages about the
//! same entity after it wait their turn.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{EntityRef, Incoming, Service, streams};
use trainyard_runtime::{Delivery, HandleError, Handler, Runtime, Settings};
use trainyard_testkit::{NatsServer, eventually, metric};

/// Fails the first `failures` attempts at epoch 1 transiently; records
/// `(epoch, delivered)` of every attempt.
struct FlakyApi {
    failures: usize,
    attempts: Mutex<Vec<(u32, i64)>>,
    handled: Mutex<Vec<u32>>,
}

impl Handler for FlakyApi {
    async fn handle(&self, message: Incoming, delivery: Delivery) -> Result<(), HandleError> {
        let progress: ProgressReported = message.payload()?;
        let mut attempts = self.attempts.lock().expect("lock");
        attempts.push((progress.epoch, delivery.delivered));
        let tried = attempts
            .iter()
            .filter(|(e, _)| *e == progress.epoch)
            .count();
        if progress.epoch == 1 && tried <= self.failures {
            return Err(HandleError::Transient(
                "kubernetes apply job ml/bert: 503 ServiceUnavailable".into(),
            ));
        }
        self.handled.lock().expect("lock").push(progress.epoch);
        Ok(())
    }
}

#[tokio::test]
async fn a_transient_failure_is_handled_again_in_place_and_never_dead_lettered() {
    let nats = NatsServer::start();
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.nats.max_deliver = 2;
    // Shorter than the whole retry: the message must be held, not redelivered.
    settings.nats.ack_wait_seconds = 2;
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::HpoTuner, settings, CancellationToken::new())
        .await
        .expect("runtime starts");
    let spec = Service::HpoTuner
        .consumers()
        .into_iter()
        .find(|c| c.stream.name == streams::WORKER.name)
        .expect("hpo-tuner reads worker progress");
    let handler = Arc::new(FlakyApi {
        failures: 4,
        attempts: Mutex::default(),
        handled: Mutex::default(),
    });
    for epoch in [1, 2] {
        let envelope = runtime.publisher.envelope(
            EntityRef::new("ml", "bert", ""),
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
    runtime.spawn_consumer(spec.clone(), handler.clone());

    eventually("both messages are handled", async || {
        let handled = handler.handled.lock().expect("lock").clone();
        (handled.contains(&1) && handled.contains(&2)).then_some(())
    })
    .await;
    assert_eq!(
        handler.handled.lock().expect("lock")[0],
        1,
        "the later message about the same job waited"
    );
    let attempts = handler.attempts.lock().expect("lock").clone();
    let first: Vec<i64> = attempts
        .iter()
        .filter(|(epoch, _)| *epoch == 1)
        .map(|(_, delivered)| *delivered)
        .collect();
    // The message pulled with it may be redelivered meanwhile (its ack wait
    // ran out in the pull's buffer); handlers are idempotent.
    assert_eq!(first, [1; 5], "held, never redelivered");
    let mut dead_letters = runtime
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("stream");
    assert_eq!(dead_letters.info().await.expect("info").state.messages, 0);
    let transient = metric(
        &runtime.registry,
        "trainyard_messages_handled_total",
        &[
            ("consumer", spec.durable.as_str()),
            ("outcome", "transient"),
        ],
    );
    assert_eq!(transient, 4.0);
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("drains");
}
