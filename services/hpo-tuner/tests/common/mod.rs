//! Test harness: a real NATS server, the tuner on a [`Runtime`], and a driver that
//! plays the watcher, the planner and the training workers by publishing their
//! messages, and reads what the tuner published from the streams.
// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::{Sweep, TrainingJobState};
use trainyard_contracts::decisions::{SweepProgressed, TrialRequested, TrialStopped};
use trainyard_contracts::events::{Change, SweepChanged};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::worker::ProgressReported;
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload, Service, streams};
use trainyard_hpo_tuner::TunerConfig;
use trainyard_runtime::metrics::RuntimeMetrics;
use trainyard_runtime::{Publisher, Runtime, Settings};
use trainyard_testkit::NatsServer;

pub const NS: &str = "ml";

pub fn init_tracing() {
    // RUST_LOG=trainyard_hpo_tuner=debug shows what the tuner did when a test fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Starts a tuner against `nats`, as `serve` would but without signals.
pub async fn start_tuner(nats: &NatsServer, config: TunerConfig) -> Runtime {
    init_tracing();
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    settings.shutdown_grace_seconds = 5;
    let runtime = Runtime::start(Service::HpoTuner, settings, CancellationToken::new())
        .await
        .expect("runtime starts");
    trainyard_hpo_tuner::start(&runtime, config)
        .await
        .expect("tuner starts");
    runtime
}

/// Stops a tuner the way SIGTERM does: in-flight messages finish, the rest stay unacked.
pub async fn stop_tuner(runtime: Runtime) {
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("tuner stops");
}

/// Value of a counter or gauge in the runtime's registry (summed over labels).
pub fn metric(runtime: &Runtime, name: &str) -> f64 {
    trainyard_testkit::metric(&runtime.registry, name, &[])
}

/// Polls `check` until it returns Some, or fails after `seconds`.
pub async fn eventually<T, F, Fut>(what: &str, seconds: u64, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    trainyard_testkit::eventually_within(what, Duration::from_secs(seconds), check).await
}

/// A Sweep object in namespace [`NS`].
pub fn sweep_object(name: &str, uid: &str, spec: serde_json::Value) -> Sweep {
    serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1", "kind": "Sweep",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1},
        "spec": spec,
    }))
    .expect("sweep parses")
}

/// A trial template that passes validation.
pub fn template() -> serde_json::Value {
    json!({"model": "resnet50", "dataset": "cifar10", "numWorkers": 1, "gpusPerWorker": 1,
           "framework": "pytorch", "hyperparameters": {"epochs": 3}})
}

/// Plays the watcher, planner and workers.
pub struct Driver {
    pub publisher: Publisher,
    pub jetstream: jetstream::Context,
}

impl Driver {
    /// Streams must exist (a tuner provisions them at start).
    pub async fn connect(nats: &NatsServer) -> Self {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let jetstream = jetstream::new(client);
        let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).expect("metrics");
        Self {
            publisher: Publisher::new(jetstream.clone(), Service::Watcher, metrics),
            jetstream,
        }
    }

    pub async fn publish<P: Payload + Clone>(&self, entity: EntityRef, payload: P) -> Envelope<P> {
        let envelope = Envelope::new("test", entity, payload);
        self.publisher
            .publish(envelope.clone())
            .await
            .expect("publish");
        envelope
    }

    /// Publishes the same envelope again under another `Nats-Msg-Id`: what a
    /// redelivery looks like to a consumer.
    pub async fn republish<P: Payload + Clone>(&self, envelope: &Envelope<P>, copy: &str) {
        self.publisher
            .publish_with_id(envelope.clone(), &format!("{}-{copy}", envelope.id))
            .await
            .expect("republish");
    }

    pub async fn publish_raw(&self, subject: &str, body: &str) {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
        self.publisher
            .publish_raw(subject.to_string(), headers, Bytes::from(body.to_string()))
            .await
            .expect("publish raw");
    }

    pub async fn apply_sweep(&self, sweep: &Sweep) {
        let entity = EntityRef::new(
            NS,
            sweep.metadata.name.clone().unwrap_or_default(),
            sweep.metadata.uid.clone().unwrap_or_default(),
        );
        self.publish(
            entity,
            SweepChanged {
                change: Change::Applied,
                object: sweep.clone(),
            },
        )
        .await;
    }

    pub async fn delete_sweep(&self, sweep: &Sweep) {
        let entity = EntityRef::new(
            NS,
            sweep.metadata.name.clone().unwrap_or_default(),
            sweep.metadata.uid.clone().unwrap_or_default(),
        );
        self.publish(
            entity,
            SweepChanged {
                change: Change::Deleted,
                object: sweep.clone(),
            },
        )
        .await;
    }

    /// The planner reports a trial's TrainingJob moved to `to`.
    pub async fn transition(
        &self,
        trial: &str,
        uid: &str,
        to: TrainingJobState,
    ) -> Envelope<TrainingJobTransitioned> {
        self.publish(
            EntityRef::new(NS, trial, uid),
            TrainingJobTransitioned {
                from: None,
                to,
                reason: format!("Test{to}"),
                message: format!("the test moved it to {to}"),
                restart_count: 0,
                gpus: 0,
                queue: None,
                context: Default::default(),
            },
        )
        .await
    }

    /// Rank 0 of a trial reports metrics after `epoch` epochs.
    pub async fn progress(
        &self,
        trial: &str,
        uid: &str,
        epoch: u32,
        metrics: &[(&str, f64)],
    ) -> Envelope<ProgressReported> {
        self.publish(
            EntityRef::new(NS, trial, uid),
            ProgressReported {
                worker_index: 0,
                attempt: 0,
                epoch,
                total_epochs: Some(3),
                step: u64::from(epoch) * 100,
                metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            },
        )
        .await
    }

    /// Every message of one stream, in order, with its subject and headers.
    pub async fn messages(&self, stream: &str) -> Vec<(String, Option<HeaderMap>, Bytes)> {
        trainyard_testkit::stream_messages(&self.jetstream, stream, None)
            .await
            .into_iter()
            .map(|m| (m.subject, m.headers, m.payload))
            .collect()
    }

    /// Decisions the tuner published about `sweep`, decoded as `P`, in order.
    pub async fn decisions<P: Payload>(&self, sweep: &str) -> Vec<P> {
        self.messages(streams::DECISIONS.name)
            .await
            .into_iter()
            .filter_map(|(_, _, body)| Incoming::decode(&body).ok())
            .filter(|m| m.header.entity.name == sweep && m.is::<P>())
            .filter_map(|m| m.payload::<P>().ok())
            .collect()
    }

    pub async fn trial_requests(&self, sweep: &str) -> Vec<TrialRequested> {
        self.decisions(sweep).await
    }

    pub async fn trial_stops(&self, sweep: &str) -> Vec<TrialStopped> {
        self.decisions(sweep).await
    }

    pub async fn progress_reports(&self, sweep: &str) -> Vec<SweepProgressed> {
        self.decisions(sweep).await
    }

    /// Waits for the sweep's last progress to carry a finish reason.
    pub async fn finished(&self, sweep: &str, seconds: u64) -> SweepProgressed {
        eventually(&format!("sweep {sweep} to finish"), seconds, || async {
            self.progress_reports(sweep)
                .await
                .into_iter()
                .last()
                .filter(|p| p.finished_reason.is_some())
        })
        .await
    }

    /// Dead letters as JSON.
    pub async fn dead_letters(&self) -> Vec<serde_json::Value> {
        self.messages(streams::DEAD_LETTER.name)
            .await
            .into_iter()
            .filter_map(|(_, _, body)| serde_json::from_slice(&body).ok())
            .collect()
    }
}

/// Plays one trial from start to end as the planner and its worker would.
pub async fn run_trial_to_completion(driver: &Driver, trial: &TrialRequested, uid: &str) {
    driver
        .transition(&trial.trial_name, uid, TrainingJobState::Running)
        .await;
    for epoch in 1..=3 {
        let accuracy = score(trial) * f64::from(epoch) / 3.0;
        driver
            .progress(
                &trial.trial_name,
                uid,
                epoch,
                &[("accuracy", accuracy), ("loss", 1.0 - accuracy)],
            )
            .await;
    }
    driver
        .transition(&trial.trial_name, uid, TrainingJobState::Completed)
        .await;
}

/// A made-up objective of a trial's parameters, in (0, 1).
pub fn score(trial: &TrialRequested) -> f64 {
    let numbers: f64 = trial
        .parameters
        .values()
        .map(|v| match v {
            trainyard_contracts::decisions::ParameterValue::Int(i) => *i as f64 / 100.0,
            trainyard_contracts::decisions::ParameterValue::Float(f) => *f,
            trainyard_contracts::decisions::ParameterValue::Text(t) => t.len() as f64 / 10.0,
        })
        .sum();
    0.5 + 0.4 * (numbers.sin().abs())
}

/// The trial requests by index; fails on a repeated index.
pub fn by_index(requests: &[TrialRequested]) -> BTreeMap<u32, TrialRequested> {
    let mut out = BTreeMap::new();
    for request in requests {
        assert!(
            out.insert(request.trial_index, request.clone()).is_none(),
            "trial index {} requested twice",
            request.trial_index
        );
    }
    out
}
