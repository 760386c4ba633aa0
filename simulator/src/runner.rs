//! Runs the simulated cluster: the API server on a loopback port (with the
//! checkpoint root's S3 endpoint at `/s3` when there is one), the simulated
//! controllers on a timer (and on every change), worker reports out to NATS and
//! worker commands and retention decisions in from NATS.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::serve::ListenerExt;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::commands::{CheckpointRequested, StopRequested};
use trainyard_contracts::decisions::RetentionApplied;
use trainyard_contracts::subject;
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload};

use crate::apiserver;
use crate::checkpoints::CheckpointStorage;
use crate::clock::SimClock;
use crate::cluster::{Cluster, Report, WorkerCommand};
use crate::config::ClusterConfig;
use crate::error::SimulatorError;
use crate::object_storage;
use crate::store::Store;

/// A running simulated cluster.
pub struct Simulator {
    pub store: Arc<Store>,
    pub cluster: Arc<Mutex<Cluster>>,
    /// Where the API server listens.
    pub address: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

/// Locks the cluster; a panic in a step cannot leave it half-updated in a way
/// later steps cannot read, so a poisoned lock is used as is.
pub fn lock(cluster: &Mutex<Cluster>) -> MutexGuard<'_, Cluster> {
    cluster.lock().unwrap_or_else(|e| e.into_inner())
}

impl Simulator {
    /// Starts the API server on `listen` and the controllers; reports go to `nats`
    /// when given. Everything stops on `shutdown`.
    pub async fn start(
        config: ClusterConfig,
        listen: &str,
        nats: Option<async_nats::Client>,
        shutdown: CancellationToken,
    ) -> Result<Self, SimulatorError> {
        let store = Arc::new(Store::default());
        let tick = Duration::from_millis(config.tick_milliseconds);
        let clock = SimClock::new(config.speed);
        let api_faults = config.api_faults.clone();
        let checkpoint_storage = config.checkpoints.root.clone().map(CheckpointStorage::new);
        let cluster = Arc::new(Mutex::new(Cluster::new(store.clone(), config, clock)));
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| SimulatorError::Listen {
                address: listen.to_owned(),
                source,
            })?;
        let address = listener
            .local_addr()
            .map_err(|source| SimulatorError::Listen {
                address: listen.to_owned(),
                source,
            })?;
        let mut router = apiserver::router_with_faults(store.clone(), shutdown.clone(), api_faults);
        if let Some(storage) = &checkpoint_storage {
            router = router.merge(object_storage::router(storage));
        }
        let api_shutdown = shutdown.clone();
        let mut tasks = vec![tokio::spawn(async move {
            // As Go's net package (and so the real API server) does: without it
            // a watch event or a response body written after its headers waits
            // for the client's delayed ACK, up to 40 ms.
            let listener = listener.tap_io(|tcp| {
                if let Err(err) = tcp.set_nodelay(true) {
                    tracing::warn!(error = %err, "cannot set TCP_NODELAY");
                }
            });
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(api_shutdown.cancelled_owned())
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "simulated API server stopped");
            }
        })];
        let jetstream = nats.clone().map(async_nats::jetstream::new);
        if let Some(client) = nats {
            let subscriber = client
                .subscribe("trainyard.commands.>")
                .await
                .map_err(|e| SimulatorError::Nats(e.to_string()))?;
            tasks.push(tokio::spawn(receive_commands(
                subscriber,
                cluster.clone(),
                jetstream.clone(),
                shutdown.clone(),
            )));
            if checkpoint_storage.is_some() {
                let retention = client
                    .subscribe("trainyard.decisions.retention.>")
                    .await
                    .map_err(|e| SimulatorError::Nats(e.to_string()))?;
                tasks.push(tokio::spawn(receive_retention(
                    retention,
                    cluster.clone(),
                    shutdown.clone(),
                )));
            }
        }
        tasks.push(tokio::spawn(drive(
            cluster.clone(),
            store.clone(),
            jetstream,
            tick,
            shutdown,
        )));
        tracing::info!(%address, "simulated cluster serving");
        Ok(Self {
            store,
            cluster,
            address,
            tasks,
        })
    }

    /// A kubeconfig that points kube clients (and kubectl) at this simulator.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: trainyard-simulator\n  cluster:\n    server: http://{}\ncontexts:\n- name: trainyard-simulator\n  context:\n    cluster: trainyard-simulator\n    user: trainyard-simulator\n    namespace: default\ncurrent-context: trainyard-simulator\nusers:\n- name: trainyard-simulator\n  user: {{}}\n",
            self.address
        )
    }

    /// Waits for every task to end (after the shutdown token fires).
    pub async fn join(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Steps the controllers every tick and whenever an object changes.
async fn drive(
    cluster: Arc<Mutex<Cluster>>,
    store: Arc<Store>,
    jetstream: Option<async_nats::jetstream::Context>,
    tick: Duration,
    shutdown: CancellationToken,
) {
    let mut changes = store.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
            _ = changes.recv() => {
                // Let a burst of writes land before stepping once for all of them.
                tokio::time::sleep(tick / 2).await;
                changes = changes.resubscribe();
            }
        }
        let reports = lock(&cluster).step();
        publish(jetstream.as_ref(), reports).await;
    }
}

fn envelope<P: Payload>(
    namespace: &str,
    training_job: &str,
    worker: u32,
    payload: P,
) -> (String, Vec<u8>) {
    let envelope = Envelope::new(
        format!("worker-{worker}"),
        EntityRef::new(namespace, training_job, ""),
        payload,
    );
    (envelope.subject(), envelope.to_json().unwrap_or_default())
}

/// Publishes worker reports to JetStream, waiting for all acknowledgements together.
async fn publish(jetstream: Option<&async_nats::jetstream::Context>, reports: Vec<Report>) {
    let Some(jetstream) = jetstream else {
        return;
    };
    let mut acks = Vec::with_capacity(reports.len());
    for report in reports {
        let (subject, body) = match report {
            Report::Progress {
                namespace,
                training_job,
                payload,
            } => {
                let worker = payload.worker_index;
                envelope(&namespace, &training_job, worker, payload)
            }
            Report::Checkpoint {
                namespace,
                training_job,
                payload,
            } => {
                let worker = payload.worker_index;
                envelope(&namespace, &training_job, worker, payload)
            }
            Report::Utilization {
                namespace,
                training_job,
                payload,
            } => {
                let worker = payload.worker_index;
                envelope(&namespace, &training_job, worker, payload)
            }
        };
        match jetstream.publish(subject.clone(), body.into()).await {
            Ok(ack) => acks.push(ack),
            Err(err) => tracing::warn!(%subject, error = %err, "worker report not sent"),
        }
    }
    for result in futures::future::join_all(acks.into_iter().map(|ack| ack.into_future())).await {
        if let Err(err) = result {
            tracing::warn!(error = %err, "worker report not stored");
        }
    }
}

/// Worker commands (checkpoint-now, stop) for simulated workers.
async fn receive_commands(
    mut subscriber: async_nats::Subscriber,
    cluster: Arc<Mutex<Cluster>>,
    jetstream: Option<async_nats::jetstream::Context>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = subscriber.next() => match message {
                Some(message) => message,
                None => return,
            },
        };
        let Some(parsed) = subject::parse(&message.subject) else {
            continue;
        };
        let Ok(incoming) = Incoming::decode(&message.payload) else {
            tracing::warn!(subject = %message.subject, "undecodable command ignored");
            continue;
        };
        let namespace = parsed.namespace.unwrap_or_default();
        let training_job = parsed.name;
        let command = if incoming.is::<CheckpointRequested>() {
            WorkerCommand::CheckpointNow {
                namespace,
                training_job,
            }
        } else if incoming.is::<StopRequested>() {
            WorkerCommand::Stop {
                namespace,
                training_job,
            }
        } else {
            continue;
        };
        let reports = lock(&cluster).command(command);
        publish(jetstream.as_ref(), reports).await;
    }
}

/// Retention decisions, which the workers of jobs on volumes carry out
/// (executor `worker`), as a real worker-side reporter does.
async fn receive_retention(
    mut subscriber: async_nats::Subscriber,
    cluster: Arc<Mutex<Cluster>>,
    shutdown: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = subscriber.next() => match message {
                Some(message) => message,
                None => return,
            },
        };
        let Some(parsed) = subject::parse(&message.subject) else {
            continue;
        };
        let decision = Incoming::decode(&message.payload)
            .ok()
            .and_then(|incoming| incoming.payload::<RetentionApplied>().ok());
        let Some(decision) = decision else {
            tracing::warn!(subject = %message.subject, "undecodable retention decision ignored");
            continue;
        };
        let namespace = parsed.namespace.unwrap_or_default();
        let deleted = lock(&cluster).retention(&namespace, &parsed.name, &decision);
        if !deleted.is_empty() {
            tracing::info!(%namespace, job = %parsed.name, deleted = deleted.len(), "retention applied by the simulated workers");
        }
    }
}
