//! The running service: the message handler, the cycle loop, snapshots in
//! the `trainyard_allocator` bucket and publishing through an outbox.
//!
//! Exactly-once admission across restarts rests on two rules:
//! - a message is acked only after a snapshot containing its effect is saved
//!   (the handler waits for it), so nothing acked is ever lost;
//! - a decision is published only after a snapshot containing it (in the
//!   outbox) is saved, and leaves the outbox only once JetStream stored it, so
//!   a restarted allocator republishes (deduplicated by `Nats-Msg-Id`) rather
//!   than decides again.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use gpu_allocator_core::Timestamp;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use trainyard_contracts::decisions::{AdmissionDecided, PendingExplained, PreemptionDecided};
use trainyard_contracts::events::{NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::{EntityRef, Incoming, Payload};
use trainyard_runtime::{Delivery, HandleError, Handler, Publisher};

use crate::config::AllocatorServiceConfig;
use crate::error::ServiceError;
use crate::metrics::AllocatorMetrics;
use crate::state::{AllocatorState, Outgoing, PersistedState};

/// Key of the snapshot in the `trainyard_allocator` bucket.
pub const SNAPSHOT_KEY: &str = "snapshot";

/// Seconds since the Unix epoch (the core's clock unit).
pub fn now() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

/// Loads the saved state, if any.
pub async fn load(bucket: &kv::Store) -> Result<Option<PersistedState>, ServiceError> {
    let Some(bytes) = bucket
        .get(SNAPSHOT_KEY)
        .await
        .map_err(|e| ServiceError::Store(format!("get {SNAPSHOT_KEY}: {e}")))?
    else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        ServiceError::Store(format!(
            "snapshot under {SNAPSHOT_KEY} is unreadable ({e}); refusing to start without it, \
             since decisions made after it would be repeated. Delete the key only if every \
             admitted job is known to the planner"
        ))
    })
}

/// State shared by the handler and the cycle loop.
pub struct Allocation {
    state: Mutex<AllocatorState>,
    wake: Notify,
    persisted: watch::Sender<u64>,
    config: AllocatorServiceConfig,
    metrics: AllocatorMetrics,
    shutdown: CancellationToken,
}

impl Allocation {
    pub fn new(
        state: AllocatorState,
        config: AllocatorServiceConfig,
        metrics: AllocatorMetrics,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let (persisted, _) = watch::channel(state.generation());
        Arc::new(Self {
            state: Mutex::new(state),
            wake: Notify::new(),
            persisted,
            config,
            metrics,
            shutdown,
        })
    }

    fn lock(&self) -> MutexGuard<'_, AllocatorState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one message to the state; returns the generation to wait for.
    fn apply(&self, message: &Incoming) -> Result<u64, ServiceError> {
        let entity: &EntityRef = &message.header.entity;
        let mut state = self.lock();
        let message_type = message.header.message_type.as_str();
        let result = if message.is::<NodeObserved>() {
            let payload = message.payload::<NodeObserved>()?;
            state.on_node(entity, &payload)
        } else if message.is::<TrainingQueueChanged>() {
            let payload = message.payload::<TrainingQueueChanged>()?;
            state.on_queue(entity, &payload)
        } else if message.is::<TrainingJobChanged>() {
            let payload = message.payload::<TrainingJobChanged>()?;
            state.on_job_changed(entity, &payload, now())
        } else if message.is::<TrainingJobTransitioned>() {
            let payload = message.payload::<TrainingJobTransitioned>()?;
            state.on_transition(entity, &payload)
        } else if message.is::<TrainingJobFinalized>() {
            message.payload::<TrainingJobFinalized>()?;
            state.on_finalized(entity)
        } else {
            return Ok(state.generation());
        };
        let outcome = match &result {
            Ok(()) => "applied",
            Err(_) => "rejected",
        };
        self.metrics
            .events
            .with_label_values(&[message_type, outcome])
            .inc();
        result.map(|()| state.generation())
    }

    /// Waits until a snapshot at least as new as `generation` is saved.
    async fn wait_persisted(&self, generation: u64) -> Result<(), HandleError> {
        let mut saved = self.persisted.subscribe();
        if *saved.borrow() >= generation {
            return Ok(());
        }
        self.wake.notify_one();
        let timeout = self.config.persist_timeout();
        let wait = saved.wait_for(|g| *g >= generation);
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, wait) => outcome,
            _ = async {
                self.shutdown.cancelled().await;
                // The loop saves once more on shutdown.
                tokio::time::sleep(Duration::from_secs(2)).await;
            } => return Err(HandleError::Retry("shutting down before the change was saved".into())),
        };
        match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(HandleError::Retry(
                "allocator stopped before the change was saved".into(),
            )),
            Err(_) => Err(HandleError::Retry(format!(
                "state snapshot not saved within {timeout:?}; will retry"
            ))),
        }
    }
}

/// The consumer handler: applies the message, then acks once it is saved.
pub struct AllocatorHandler(pub Arc<Allocation>);

impl Handler for AllocatorHandler {
    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let generation = self.0.apply(&message).map_err(HandleError::from)?;
        self.0.wait_persisted(generation).await
    }
}

/// The cycle loop: cycles, saves and publishes until shutdown, then saves once more.
pub struct CycleLoop {
    pub allocation: Arc<Allocation>,
    pub bucket: kv::Store,
    pub publisher: Publisher,
}

impl CycleLoop {
    pub async fn run(self) {
        let config = &self.allocation.config;
        let interval = config.cycle_interval();
        let min_gap = config.event_cycle_min_gap();
        let every = config.snapshot_every_cycles.max(1);
        let mut persisted = *self.allocation.persisted.borrow();
        let mut cycles: u64 = 0;
        let mut last_cycle: Option<Instant> = None;
        // Decisions saved before a restart and not yet published go out first.
        self.step(false, &mut persisted, false).await;
        loop {
            let next = last_cycle.map_or_else(tokio::time::Instant::now, |at| {
                tokio::time::Instant::from_std(at + interval)
            });
            let by_event = tokio::select! {
                _ = self.allocation.shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next) => false,
                _ = self.allocation.wake.notified() => true,
            };
            let cycle = !by_event || last_cycle.is_none_or(|at| at.elapsed() >= min_gap);
            if cycle {
                cycles += 1;
                last_cycle = Some(Instant::now());
            }
            self.step(cycle, &mut persisted, cycle && cycles.is_multiple_of(every))
                .await;
        }
        self.step(false, &mut persisted, true).await;
        tracing::info!("allocator state saved on shutdown");
    }

    async fn step(&self, cycle: bool, persisted: &mut u64, force_save: bool) {
        let allocation = &self.allocation;
        let (bytes, generation, outbox) = {
            let mut state = allocation.lock();
            if cycle {
                let started = Instant::now();
                let report = state.cycle(crate::service::now());
                allocation
                    .metrics
                    .observe_cycle(&report, started.elapsed().as_secs_f64());
            }
            let generation = state.generation();
            let bytes = if generation > *persisted || force_save {
                match serde_json::to_vec(&state.persisted()) {
                    Ok(bytes) => Some(bytes),
                    Err(err) => {
                        tracing::error!(error = %err, "cannot encode the allocator snapshot");
                        return;
                    }
                }
            } else {
                None
            };
            allocation
                .metrics
                .outbox
                .set(i64::try_from(state.outbox().len()).unwrap_or(i64::MAX));
            (bytes, generation, state.outbox().to_vec())
        };
        if let Some(bytes) = bytes {
            let size = bytes.len();
            match self.bucket.put(SNAPSHOT_KEY, bytes.into()).await {
                Ok(_) => {
                    *persisted = (*persisted).max(generation);
                    allocation.persisted.send_replace(*persisted);
                    allocation
                        .metrics
                        .snapshots
                        .with_label_values(&["ok"])
                        .inc();
                    allocation
                        .metrics
                        .snapshot_bytes
                        .set(i64::try_from(size).unwrap_or(i64::MAX));
                }
                Err(err) => {
                    allocation
                        .metrics
                        .snapshots
                        .with_label_values(&["error"])
                        .inc();
                    tracing::warn!(error = %err, size, "cannot save the allocator snapshot; decisions wait");
                    return;
                }
            }
        }
        if *persisted < generation {
            return;
        }
        for outgoing in outbox {
            match publish(&self.publisher, &outgoing).await {
                Ok(()) => allocation.lock().published(outgoing.id()),
                Err(err) => {
                    tracing::warn!(id = outgoing.id(), error = %err, "publishing a decision failed; retrying next cycle");
                    break;
                }
            }
        }
    }
}

async fn publish(publisher: &Publisher, outgoing: &Outgoing) -> Result<(), ServiceError> {
    match outgoing {
        Outgoing::Admission {
            id,
            entity,
            payload,
            ..
        } => send::<AdmissionDecided>(publisher, id, entity, payload).await,
        Outgoing::Preemption {
            id,
            entity,
            payload,
            ..
        } => send::<PreemptionDecided>(publisher, id, entity, payload).await,
        Outgoing::Pending {
            id,
            entity,
            payload,
        } => send::<PendingExplained>(publisher, id, entity, payload).await,
    }
}

async fn send<P: Payload + Clone>(
    publisher: &Publisher,
    id: &str,
    entity: &EntityRef,
    payload: &P,
) -> Result<(), ServiceError> {
    let envelope = publisher.envelope(entity.clone(), payload.clone());
    publisher.publish_with_id(envelope, id).await?;
    Ok(())
}
