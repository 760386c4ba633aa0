//! Runs the simulated cluster: the API server on a loopback port (with the
//! checkpoint root's S3 endpoint at `/s3` when there is one), the simulated
//! controllers on a timer (and on every change), worker reports out to NATS and
//! worker commands and retention decisions in from NATS.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::commands::{CheckpointIntervalSet, CheckpointRequested, StopRequested};
use trainyard_contracts::decisions::RetentionApplied;
use trainyard_contracts::permissions::Identity;
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
        Self::start_with_worker_nats(config, listen, nats, None, shutdown).await
    }

    /// [`Simulator::start`], and the workers of a pod with a NATS token
    /// (`TRAINYARD_NATS_TOKEN`) report over their own connection to
    /// `worker_nats_url` with it, one per job, as real workers do.
    pub async fn start_with_worker_nats(
        config: ClusterConfig,
        listen: &str,
        nats: Option<async_nats::Client>,
        worker_nats_url: Option<String>,
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
        let reporters = nats.clone().map(|client| {
            Arc::new(Reporters {
                shared: async_nats::jetstream::new(client),
                worker_nats_url,
                by_token: tokio::sync::Mutex::default(),
            })
        });
        if let Some(client) = nats {
            let subscriber = client
                .subscribe("trainyard.commands.>")
                .await
                .map_err(|e| SimulatorError::Nats(e.to_string()))?;
            tasks.push(tokio::spawn(receive_commands(
                subscriber,
                cluster.clone(),
                reporters.clone(),
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
            reporters,
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
    reporters: Option<Arc<Reporters>>,
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
        publish(reporters.as_ref(), reports).await;
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

/// A job's workers' connection is closed this long after its last report.
const WORKER_CONNECTION_IDLE: Duration = Duration::from_secs(120);

/// Where worker reports go: the simulator's own connection, or, for workers
/// with a NATS token, their job's connection made with it.
pub struct Reporters {
    shared: async_nats::jetstream::Context,
    /// Where workers with a token connect; None: every report goes over `shared`.
    worker_nats_url: Option<String>,
    /// Connections by token, with their last use.
    by_token: tokio::sync::Mutex<HashMap<String, (async_nats::jetstream::Context, Instant)>>,
}

impl Reporters {
    /// The connection the workers of `namespace/training_job` report over;
    /// None when their token is refused (logged).
    async fn for_job(
        &self,
        namespace: &str,
        training_job: &str,
        token: Option<&str>,
    ) -> Option<async_nats::jetstream::Context> {
        let (Some(url), Some(token)) = (&self.worker_nats_url, token) else {
            return Some(self.shared.clone());
        };
        let mut connections = self.by_token.lock().await;
        let now = Instant::now();
        connections.retain(|_, (_, used)| now.duration_since(*used) < WORKER_CONNECTION_IDLE);
        if let Some((context, used)) = connections.get_mut(token) {
            *used = now;
            return Some(context.clone());
        }
        let identity = Identity::Worker {
            namespace: namespace.to_owned(),
            job: training_job.to_owned(),
        };
        match async_nats::ConnectOptions::with_token(token.to_owned())
            .custom_inbox_prefix(identity.inbox_prefix())
            .name(format!("simulated workers of {namespace}/{training_job}"))
            .connect(trainyard_runtime::nats::servers(url))
            .await
        {
            Ok(client) => {
                let context = async_nats::jetstream::new(client);
                connections.insert(token.to_owned(), (context.clone(), now));
                Some(context)
            }
            Err(err) => {
                tracing::warn!(%namespace, job = %training_job, error = %err, "workers cannot connect to NATS with their token");
                None
            }
        }
    }
}

/// Publishes worker reports to JetStream, waiting for all acknowledgements together.
async fn publish(reporters: Option<&Arc<Reporters>>, reports: Vec<Report>) {
    let Some(reporters) = reporters else {
        return;
    };
    let mut acks = Vec::with_capacity(reports.len());
    for report in reports {
        let (namespace, training_job, token, (subject, body)) = match report {
            Report::Progress {
                namespace,
                training_job,
                payload,
                nats_token,
            } => {
                let worker = payload.worker_index;
                let message = envelope(&namespace, &training_job, worker, payload);
                (namespace, training_job, nats_token, message)
            }
            Report::Checkpoint {
                namespace,
                training_job,
                payload,
                nats_token,
            } => {
                let worker = payload.worker_index;
                let message = envelope(&namespace, &training_job, worker, payload);
                (namespace, training_job, nats_token, message)
            }
            Report::Utilization {
                namespace,
                training_job,
                payload,
                nats_token,
            } => {
                let worker = payload.worker_index;
                let message = envelope(&namespace, &training_job, worker, payload);
                (namespace, training_job, nats_token, message)
            }
        };
        let Some(jetstream) = reporters
            .for_job(&namespace, &training_job, token.as_deref())
            .await
        else {
            tracing::warn!(%subject, "worker report not sent");
            continue;
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

/// Worker commands (checkpoint-now, checkpoint-interval, stop) for simulated workers.
async fn receive_commands(
    mut subscriber: async_nats::Subscriber,
    cluster: Arc<Mutex<Cluster>>,
    reporters: Option<Arc<Reporters>>,
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
        } else if let Ok(interval) = incoming.payload::<CheckpointIntervalSet>() {
            WorkerCommand::CheckpointInterval {
                namespace,
                training_job,
                seconds: interval.interval_seconds,
            }
        } else {
            continue;
        };
        let reports = lock(&cluster).command(command);
        publish(reporters.as_ref(), reports).await;
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
