//! The running service: the message handler, the cycle loop, snapshots in
//! the `trainyard_allocator` bucket and publishing through an outbox.
//!
//! Exactly-once admission across restarts rests on two rules:
//! - a message is acked once applied, and the snapshot records, per stream,
//!   the sequence of the last message applied; at start the messages after
//!   it are replayed from the stream, so nothing acked is lost even though
//!   snapshots are saved at most every `snapshot_min_interval_ms` for
//!   message changes alone;
//! - a decision is published only after a snapshot containing it (in the
//!   outbox) is saved, and leaves the outbox only once JetStream stored it, so
//!   a restarted allocator republishes (deduplicated by `Nats-Msg-Id`) rather
//!   than decides again. Pending explanations are not decisions and go out
//!   without waiting for a save: a lost one is explained again after a
//!   restart, since the snapshot's record of what was published is as old as
//!   the snapshot. With thousands of jobs pending a snapshot is megabytes, and
//!   saving one for every cycle that explained a new job made snapshots the
//!   service's main work.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use gpu_allocator_core::Timestamp;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::decisions::{
    AdmissionDecided, PendingExplained, PreemptionDecided, QueueStatusReported,
};
use trainyard_contracts::events::{NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::streams::ConsumerSpec;
use trainyard_contracts::{EntityRef, Incoming, Payload};
use trainyard_runtime::{Delivery, HandleError, Handler, Lease, Publisher, crash_point};

use crate::config::AllocatorServiceConfig;
use crate::error::ServiceError;
use crate::metrics::AllocatorMetrics;
use crate::snapshot::SnapshotStore;
use crate::state::{AllocatorState, Outgoing};

/// Crash points (`TRAINYARD_CRASH_AT`, chaos runs): a cycle decided, neither
/// saved nor published; a snapshot saved, its decisions not yet published;
/// a decision published, not yet marked as such in the outbox.
pub const CRASH_MID_CYCLE: &str = "gpu-allocator.mid-cycle";
pub const CRASH_AFTER_SAVE: &str = "gpu-allocator.after-save";
pub const CRASH_AFTER_PUBLISH: &str = "gpu-allocator.after-publish";

/// Seconds since the Unix epoch (the core's clock unit).
pub fn now() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

/// Applies one message to the state (no metrics, no waking: shared by the
/// handler and the start-up replay). Messages of other types are ignored.
pub fn apply_message(state: &mut AllocatorState, message: &Incoming) -> Result<(), ServiceError> {
    let entity: &EntityRef = &message.header.entity;
    if message.is::<NodeObserved>() {
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
    } else if message.is::<trainyard_contracts::cost::CapacityChosen>() {
        let payload = message.payload::<trainyard_contracts::cost::CapacityChosen>()?;
        state.on_capacity(entity, &payload)
    } else if message.is::<trainyard_contracts::cost::BudgetStatusReported>() {
        let payload = message.payload::<trainyard_contracts::cost::BudgetStatusReported>()?;
        state.on_budget(entity, &payload)
    } else if message.is::<TrainingJobFinalized>() {
        message.payload::<TrainingJobFinalized>()?;
        state.on_finalized(entity)
    } else {
        Ok(())
    }
}

/// Replays the messages `consumer` reads that come after the last one the
/// snapshot recorded for its stream, in stream order, up to the last one its
/// durable consumer acked (later ones reach the durable consumer as usual).
/// Run before the consumers start. A message the state rejects is skipped:
/// the consumer dead-lettered it when it first arrived. Returns how many
/// messages were read.
pub async fn replay(
    jetstream: &jetstream::Context,
    consumer: &ConsumerSpec,
    state: &mut AllocatorState,
) -> Result<u64, ServiceError> {
    let stream_name = consumer.stream.name;
    let store_error = |what: &str, err: &dyn std::fmt::Display| {
        ServiceError::Store(format!("replaying {stream_name}: {what}: {err}"))
    };
    let after = state.applied_sequence(stream_name);
    let stream = jetstream
        .get_stream(stream_name)
        .await
        .map_err(|e| store_error("get stream", &e))?;
    // Up to the durable consumer's ack floor: what it handled (applied or
    // dead-lettered). Later messages reach it as usual, so a bad one is
    // dead-lettered rather than skipped here as already applied.
    let last = match stream.consumer_info(&consumer.durable).await {
        Ok(info) => info.ack_floor.stream_sequence,
        Err(err) if err.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound => 0,
        Err(err) => return Err(store_error("consumer info", &err)),
    };
    if last <= after {
        return Ok(0);
    }
    let reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
            filter_subjects: consumer.filter_subjects.clone(),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .map_err(|e| store_error("create reader", &e))?;
    let mut read = 0u64;
    loop {
        let mut batch = reader
            .fetch()
            .max_messages(500)
            .expires(Duration::from_millis(200))
            .messages()
            .await
            .map_err(|e| store_error("fetch", &e))?;
        let mut seen = false;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| store_error("read", &e))?;
            let sequence = message
                .info()
                .map_err(|e| store_error("message metadata", &e))?
                .stream_sequence;
            if sequence > last {
                return Ok(read);
            }
            seen = true;
            read += 1;
            match Incoming::decode(&message.payload) {
                Ok(incoming) => {
                    if let Err(err) = apply_message(state, &incoming) {
                        tracing::debug!(stream = stream_name, sequence, error = %err, "replayed message rejected again");
                    }
                }
                Err(err) => {
                    tracing::debug!(stream = stream_name, sequence, error = %err, "replayed message undecodable");
                }
            }
            state.note_applied(stream_name, sequence);
            if sequence == last {
                return Ok(read);
            }
        }
        // An empty fetch: the filtered messages ran out before `last`.
        if !seen {
            return Ok(read);
        }
    }
}

/// State shared by the handler and the cycle loop.
pub struct Allocation {
    state: Mutex<AllocatorState>,
    wake: Notify,
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
        Arc::new(Self {
            state: Mutex::new(state),
            wake: Notify::new(),
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

    /// Applies one message read at `sequence` of `stream` and records it.
    fn apply(&self, message: &Incoming, stream: &str, sequence: u64) -> Result<(), ServiceError> {
        let mut state = self.lock();
        let message_type = message.header.message_type.as_str();
        if state.already_applied(stream, sequence) {
            // Applying it again could only take the state back in time
            // (e.g. an older version of a node after a newer one was replayed).
            self.metrics
                .events
                .with_label_values(&[message_type, "already_applied"])
                .inc();
            return Ok(());
        }
        let result = apply_message(&mut state, message);
        // Recorded whatever the outcome: a rejected message is dead-lettered
        // (acked), so replaying it would only be rejected again. The state
        // raises no retryable error, so no earlier message is still to come.
        state.note_applied(stream, sequence);
        let outcome = match &result {
            Ok(()) => "applied",
            Err(_) => "rejected",
        };
        self.metrics
            .events
            .with_label_values(&[message_type, outcome])
            .inc();
        result
    }
}

/// The handler of one consumer: applies the message and wakes the cycle
/// loop; the runtime then acks. The change reaches the store with the next
/// snapshot, and until then the stream holds the message for a replay.
pub struct AllocatorHandler {
    allocation: Arc<Allocation>,
    stream: &'static str,
}

impl AllocatorHandler {
    /// A handler for the consumer of `stream`.
    pub fn new(allocation: Arc<Allocation>, stream: &'static str) -> Self {
        Self { allocation, stream }
    }
}

impl Handler for AllocatorHandler {
    async fn handle(&self, message: Incoming, delivery: Delivery) -> Result<(), HandleError> {
        self.allocation
            .apply(&message, self.stream, delivery.stream_sequence)
            .map_err(HandleError::from)?;
        self.allocation.wake.notify_one();
        Ok(())
    }
}

/// The last snapshot saved: the generation it holds and when.
struct Saved {
    generation: u64,
    at: Option<Instant>,
}

/// The cycle loop: cycles, saves and publishes until shutdown, then saves once more.
pub struct CycleLoop {
    pub allocation: Arc<Allocation>,
    pub snapshots: SnapshotStore,
    pub publisher: Publisher,
    /// Held while this replica is the active allocator; checked before every
    /// save and publish.
    pub lease: Lease,
}

impl CycleLoop {
    pub async fn run(mut self) {
        let config = &self.allocation.config;
        let interval = config.cycle_interval();
        let min_gap = config.event_cycle_min_gap();
        let every = config.snapshot_every_cycles.max(1);
        let mut persisted = Saved {
            generation: self.allocation.lock().generation(),
            at: None,
        };
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

    async fn step(&mut self, cycle: bool, persisted: &mut Saved, force_save: bool) {
        let min_interval = self.allocation.config.snapshot_min_interval();
        let allocation = &self.allocation;
        let (snapshot, generation, outbox) = {
            let mut state = allocation.lock();
            if cycle {
                let started = Instant::now();
                let report = state.cycle(crate::service::now());
                allocation
                    .metrics
                    .observe_cycle(&report, started.elapsed().as_secs_f64());
                allocation
                    .metrics
                    .observe_queue_usage(&state.allocator().queue_usage());
            }
            let generation = state.generation();
            // Decisions wait for a save before they are published, so they are
            // saved at once; message changes and explanations alone at most
            // every interval.
            let due = force_save
                || (generation > persisted.generation
                    && (state.outbox().iter().any(Outgoing::is_decision)
                        || persisted.at.is_none_or(|at| at.elapsed() >= min_interval)));
            // Copied under the lock, encoded (and the copy freed) after it:
            // messages wait for the lock, and with 10,000 jobs pending the
            // copy is the smallest of the three (`loadtest`, allocator_service).
            let snapshot = due.then(|| state.persisted());
            allocation
                .metrics
                .outbox
                .set(i64::try_from(state.outbox().len()).unwrap_or(i64::MAX));
            (
                snapshot,
                generation,
                state.outbox().iter().cloned().collect::<Vec<_>>(),
            )
        };
        if cycle {
            // Decided, neither saved nor published.
            crash_point::reached(CRASH_MID_CYCLE);
        }
        if let Err(err) = self.lease.fence() {
            tracing::warn!(error = %err, "not saving or publishing");
            return;
        }
        if let Some(snapshot) = snapshot {
            let bytes = match serde_json::to_vec(&snapshot) {
                Ok(bytes) => bytes,
                Err(err) => {
                    tracing::error!(error = %err, "cannot encode the allocator snapshot");
                    return;
                }
            };
            let size = bytes.len();
            match self.snapshots.save(&bytes).await {
                Ok(stored) => {
                    crash_point::reached(CRASH_AFTER_SAVE);
                    persisted.generation = persisted.generation.max(generation);
                    persisted.at = Some(Instant::now());
                    allocation
                        .metrics
                        .snapshots
                        .with_label_values(&["ok"])
                        .inc();
                    allocation
                        .metrics
                        .snapshot_bytes
                        .set(i64::try_from(stored).unwrap_or(i64::MAX));
                }
                Err(err @ ServiceError::Fenced(_)) => {
                    tracing::error!(error = %err, "another allocator took over; shutting down");
                    allocation.shutdown.cancel();
                    return;
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
        let saved = persisted.generation >= generation;
        for outgoing in outbox {
            if !saved && outgoing.is_decision() {
                continue;
            }
            if self.lease.fence().is_err() {
                break;
            }
            match publish(&self.publisher, &outgoing).await {
                Ok(()) => {
                    if outgoing.is_decision() {
                        crash_point::reached(CRASH_AFTER_PUBLISH);
                    }
                    allocation.lock().published(outgoing.id())
                }
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
        }
        | Outgoing::Drain {
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
        Outgoing::QueueStatus {
            id,
            entity,
            payload,
        } => send::<QueueStatusReported>(publisher, id, entity, payload).await,
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
