//! Sending: every replica watches the outbox; each destination belongs to one
//! live replica (rendezvous hashing over the heartbeats), which groups its
//! events, claims them with compare-and-set, sends at the pace shared with
//! the other replicas (per Slack channel and webhook endpoint, see [`crate::pace`]),
//! retries, and marks them sent or dead-letters them. A replica that stops
//! (or is killed) stops beating; its destinations move to the others, which
//! take its pending events and resend what it had claimed under the same
//! notification id.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use chrono::Utc;
use futures::StreamExt;
use notifier_core::delivery::{self, Verdict};
use notifier_core::pace::PaceTarget;
use notifier_core::{Added, Event, Grouper, Notification, Routed, coalesce};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::alerts::{Severity, WebhookEndpointDisabled};
use trainyard_contracts::dead_letter::{DeadLetter, REASON_HEADER};
use trainyard_contracts::notifications::{DeliveryState, DeliveryStatus};
use trainyard_contracts::{Bucket, EntityRef, subject};
use trainyard_runtime::Publisher;

use crate::live::LiveConfig;
use crate::metrics::NotifierMetrics;
use crate::outbox::{
    ENTRY_PREFIX, EntryState, HEARTBEAT_PREFIX, Outbox, OutboxEntry, heartbeat_key,
};
use crate::pace::SharedPace;
use crate::send::Sender;

/// How the dispatcher paces, retries and beats.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    pub replica: String,
    pub heartbeat: Duration,
    /// Least time between two messages to one Slack channel, across replicas.
    pub channel_interval: Duration,
    /// Delays before each retry.
    pub retry_schedule: Vec<Duration>,
}

/// What a destination's worker sends.
struct Job {
    routed: Routed,
    /// Events with their outbox keys and the revision last seen.
    members: Vec<(Event, String, u64)>,
    /// Set when resending what a stopped replica had claimed.
    notification_id: Option<String>,
    due_at: Instant,
}

/// A claimed notification on its way.
struct Attempt {
    notification: Notification,
    routed: Routed,
    /// Outbox keys with the revision of our claim.
    claims: Vec<(String, u64)>,
    entries: Vec<OutboxEntry>,
    retries: usize,
    due_at: Instant,
    created: chrono::DateTime<Utc>,
}

enum Work {
    New(Job),
    Retry(Box<Attempt>),
}

struct Tracked {
    entry: OutboxEntry,
    revision: u64,
    taken: bool,
}

#[derive(Clone)]
pub struct Dispatcher {
    pub settings: DispatchSettings,
    pub outbox: Outbox,
    pub status: kv::Store,
    /// Per Slack channel and webhook endpoint, shared with the other replicas.
    pub pace: SharedPace,
    pub config: LiveConfig,
    pub sender: Sender,
    pub publisher: Publisher,
    pub metrics: NotifierMetrics,
    /// Webhook receivers that answered 410, until the config changes.
    pub disabled: Arc<Mutex<HashSet<String>>>,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

impl Dispatcher {
    /// Beats until shutdown, then removes the heartbeat so the others take over at once.
    pub async fn heartbeat(self, shutdown: CancellationToken) {
        let key = heartbeat_key(&self.settings.replica);
        let mut tick = tokio::time::interval(self.settings.heartbeat);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    if let Err(err) = self.outbox.store.put(&key, Bytes::from(now_ms().to_string())).await {
                        tracing::warn!(error = %err, "heartbeat failed");
                    }
                }
            }
        }
        if let Err(err) = self.outbox.store.delete(&key).await {
            tracing::warn!(error = %err, "cannot remove the heartbeat; others take over when it ages");
        }
    }

    /// Watches the outbox and sends what this replica owns, until shutdown.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut watch = loop {
            match self.outbox.store.watch_with_history(">").await {
                Ok(watch) => break watch,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot watch the outbox; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        let me = self.settings.replica.clone();
        let mut index: HashMap<String, Tracked> = HashMap::new();
        let mut beats: HashMap<String, i64> = HashMap::new();
        let mut grouper: Grouper<(String, u64)> = Grouper::default();
        let mut queues: HashMap<String, mpsc::UnboundedSender<Work>> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            let next_due = grouper.next_due().map(Instant::from_std);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                update = watch.next() => match update {
                    Some(Ok(entry)) => {
                        observe(&me, &mut index, &mut beats, entry);
                        continue;
                    }
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, "outbox watch error; watching anew");
                        match self.outbox.store.watch_with_history(">").await {
                            Ok(fresh) => watch = fresh,
                            Err(err) => tracing::warn!(error = %err, "cannot watch the outbox"),
                        }
                        continue;
                    }
                    None => {
                        match self.outbox.store.watch_with_history(">").await {
                            Ok(fresh) => watch = fresh,
                            Err(err) => {
                                tracing::warn!(error = %err, "cannot watch the outbox");
                                tokio::time::sleep(Duration::from_millis(500)).await;
                            }
                        }
                        continue;
                    }
                },
                _ = tick.tick() => {}
                _ = sleep_until(next_due) => {}
            }
            let now = Instant::now();
            let live = self.live_replicas(&beats);
            let mut resend: BTreeMap<String, Job> = BTreeMap::new();
            for (key, tracked) in index.iter_mut() {
                if tracked.taken || tracked.entry.state.is_final() {
                    continue;
                }
                let destination = tracked.entry.routed.destination.key();
                if delivery::owner(&destination, &live) != Some(&me) {
                    continue;
                }
                match &tracked.entry.state {
                    EntryState::Pending => {
                        let added = grouper.add(
                            tracked.entry.routed.clone(),
                            tracked.entry.event.clone(),
                            (key.clone(), tracked.revision),
                            now.into_std(),
                        );
                        if added == Added::Repeat {
                            self.metrics
                                .notifications
                                .with_label_values(&[
                                    &tracked.entry.routed.destination.receiver,
                                    "repeat",
                                ])
                                .inc();
                            let (outbox, key, revision) =
                                (self.outbox.clone(), key.clone(), tracked.revision);
                            let mut entry = tracked.entry.clone();
                            entry.state = EntryState::Sent {
                                notification: String::new(),
                            };
                            tokio::spawn(async move {
                                if let Err(err) = outbox.update(&key, &entry, revision).await {
                                    tracing::warn!(error = %err, "cannot mark a repeated alert");
                                }
                            });
                        }
                        tracked.taken = true;
                    }
                    EntryState::Sending {
                        owner,
                        notification,
                    } if !live.contains(owner) => {
                        resend
                            .entry(notification.clone())
                            .or_insert_with(|| Job {
                                routed: tracked.entry.routed.clone(),
                                members: Vec::new(),
                                notification_id: Some(notification.clone()),
                                due_at: now,
                            })
                            .members
                            .push((tracked.entry.event.clone(), key.clone(), tracked.revision));
                        tracked.taken = true;
                    }
                    _ => {}
                }
            }
            let mut jobs: Vec<Job> = resend.into_values().collect();
            for batch in grouper.due(now.into_std()) {
                jobs.push(Job {
                    routed: batch.routed,
                    members: batch
                        .members
                        .into_iter()
                        .map(|(event, (key, revision))| (event, key, revision))
                        .collect(),
                    notification_id: None,
                    due_at: now,
                });
            }
            for job in jobs {
                let destination = job.routed.destination.key();
                let queue = queues
                    .entry(destination)
                    .or_insert_with(|| self.spawn_worker(shutdown.clone()));
                if queue.send(Work::New(job)).is_err() {
                    tracing::warn!("a destination worker stopped");
                }
            }
            self.metrics.pending.set(
                index
                    .values()
                    .filter(|t| t.taken && !t.entry.state.is_final())
                    .count() as i64,
            );
        }
    }

    fn live_replicas(&self, beats: &HashMap<String, i64>) -> Vec<String> {
        let horizon = now_ms() - 3 * self.settings.heartbeat.as_millis() as i64;
        let mut live: Vec<String> = beats
            .iter()
            .filter(|(_, at)| **at >= horizon)
            .map(|(replica, _)| replica.clone())
            .collect();
        if !live.contains(&self.settings.replica) {
            live.push(self.settings.replica.clone());
        }
        live.sort();
        live
    }

    fn spawn_worker(&self, shutdown: CancellationToken) -> mpsc::UnboundedSender<Work> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Work>();
        let this = self.clone();
        let retry_tx = tx.clone();
        tokio::spawn(async move {
            'work: loop {
                let work = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    work = rx.recv() => match work { Some(work) => work, None => break },
                };
                let attempt = match work {
                    Work::New(job) => match this.claim(job).await {
                        Some(attempt) => attempt,
                        None => continue,
                    },
                    Work::Retry(attempt) => *attempt,
                };
                let paced = this.pace_target(&attempt.routed);
                if let Some((target, interval)) = &paced {
                    // A slot booked before another replica's 429 may fall in
                    // its hold: then book again after it.
                    loop {
                        let slot = this.pace.book(target, *interval).await;
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'work,
                            _ = tokio::time::sleep_until(slot.at) => {}
                        }
                        if !this.pace.held(target, slot).await {
                            break;
                        }
                    }
                }
                let verdict = this.send(&attempt).await;
                if let (
                    Verdict::Retry {
                        after: Some(after), ..
                    },
                    Some((target, _)),
                ) = (&verdict, &paced)
                {
                    this.pace.hold(target, *after).await;
                }
                if let Some((delay, attempt)) = this.settle(attempt, verdict).await {
                    let tx = retry_tx.clone();
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = shutdown.cancelled() => {}
                            _ = tokio::time::sleep(delay) => { let _ = tx.send(Work::Retry(Box::new(attempt))); }
                        }
                    });
                }
            }
        });
        tx
    }

    /// What paces a notification: the Slack channel it goes to (one message
    /// per channel interval, across replicas and receivers) or its webhook
    /// endpoint (no interval, but a `Retry-After` holds it for everyone).
    fn pace_target(&self, routed: &Routed) -> Option<(PaceTarget, Duration)> {
        let live = self.config.get();
        let spec = live.routing.receiver(&routed.destination.receiver);
        let channel = routed.destination.channel.clone().or_else(|| {
            spec.and_then(|r| r.slack.as_ref())
                .map(|s| s.channel.clone())
        });
        if let Some(channel) = channel {
            return Some((
                PaceTarget::SlackChannel(channel),
                self.settings.channel_interval,
            ));
        }
        spec.and_then(|r| r.webhook.as_ref())
            .map(|w| (PaceTarget::Webhook(w.url.clone()), Duration::ZERO))
    }

    /// Claims each event with compare-and-set; events another replica claimed
    /// first are left out. None when nothing is left.
    async fn claim(&self, job: Job) -> Option<Attempt> {
        let all_ids: Vec<String> = job.members.iter().map(|(e, _, _)| e.id.clone()).collect();
        let id = job.notification_id.clone().unwrap_or_else(|| {
            notifier_core::notification::notification_id(&job.routed.destination, &all_ids)
        });
        let mut claims = Vec::new();
        let mut entries = Vec::new();
        let mut events = Vec::new();
        for (event, key, revision) in job.members {
            let entry = OutboxEntry {
                routed: job.routed.clone(),
                event: event.clone(),
                state: EntryState::Sending {
                    owner: self.settings.replica.clone(),
                    notification: id.clone(),
                },
                stored_at: Utc::now(),
            };
            match self.outbox.update(&key, &entry, revision).await {
                Ok(Some(revision)) => {
                    claims.push((key, revision));
                    entries.push(entry);
                    events.push(event);
                }
                Ok(None) => tracing::debug!(%key, "claimed by another replica"),
                Err(err) => tracing::warn!(error = %err, "claim failed; the event stays pending"),
            }
        }
        if events.is_empty() {
            return None;
        }
        let created = Utc::now();
        let mut notification = coalesce(job.routed.destination.clone(), events, created);
        notification.id = id;
        let attempt = Attempt {
            notification,
            routed: job.routed,
            claims,
            entries,
            retries: 0,
            due_at: job.due_at,
            created,
        };
        self.record(&attempt, DeliveryState::Pending, None).await;
        Some(attempt)
    }

    async fn send(&self, attempt: &Attempt) -> Verdict {
        let receiver = &attempt.routed.destination.receiver;
        let disabled = self
            .disabled
            .lock()
            .map(|set| set.contains(receiver))
            .unwrap_or(false);
        if disabled {
            return Verdict::Rejected {
                why: format!(
                    "receiver {receiver} is disabled: it answered 410 Gone; change the notifier's routes to enable it again"
                ),
            };
        }
        let live = self.config.get();
        match live.routing.receiver(receiver) {
            Some(spec) => {
                self.sender
                    .attempt(spec, live.secrets.get(receiver), &attempt.notification)
                    .await
            }
            None => Verdict::Rejected {
                why: format!("receiver {receiver} is no longer in the routing config"),
            },
        }
    }

    /// Records the verdict; returns the retry to schedule, if any.
    async fn settle(&self, mut attempt: Attempt, verdict: Verdict) -> Option<(Duration, Attempt)> {
        let receiver = attempt.routed.destination.receiver.clone();
        let count = |outcome: &str| {
            self.metrics
                .notifications
                .with_label_values(&[&receiver, outcome])
                .inc()
        };
        let failure = match verdict {
            Verdict::Delivered => {
                count("sent");
                self.metrics
                    .delivery_seconds
                    .with_label_values(&[&receiver])
                    .observe(attempt.due_at.elapsed().as_secs_f64());
                let id = attempt.notification.id.clone();
                self.finish(&mut attempt, EntryState::Sent { notification: id })
                    .await;
                self.record(&attempt, DeliveryState::Sent, None).await;
                return None;
            }
            Verdict::Retry { after, why } => {
                let jitter: f64 = rand::random();
                match delivery::next_delay(
                    &self.settings.retry_schedule,
                    attempt.retries,
                    jitter,
                    after,
                ) {
                    Some(delay) => {
                        count("retrying");
                        attempt.retries += 1;
                        tracing::info!(notification = %attempt.notification.id, %receiver, %why, ?delay, "delivery failed; retrying");
                        self.record(&attempt, DeliveryState::Retrying, Some(why))
                            .await;
                        return Some((delay, attempt));
                    }
                    None => format!("gave up after {} attempts: {why}", attempt.retries + 1),
                }
            }
            Verdict::Gone => {
                count("disabled");
                if let Ok(mut set) = self.disabled.lock() {
                    set.insert(receiver.clone());
                }
                self.raise_disabled(&receiver).await;
                format!(
                    "receiver {receiver} answered 410 Gone; it is disabled until the routing config changes"
                )
            }
            Verdict::Rejected { why } => why,
        };
        count("failed");
        tracing::error!(notification = %attempt.notification.id, %receiver, reason = %failure, "notification dead-lettered");
        let id = attempt.notification.id.clone();
        self.finish(&mut attempt, EntryState::Failed { notification: id })
            .await;
        self.dead_letter(&attempt, &failure).await;
        self.record(&attempt, DeliveryState::Failed, Some(failure))
            .await;
        None
    }

    async fn finish(&self, attempt: &mut Attempt, state: EntryState) {
        for ((key, revision), entry) in attempt.claims.iter_mut().zip(attempt.entries.iter_mut()) {
            entry.state = state.clone();
            match self.outbox.update(key, entry, *revision).await {
                Ok(Some(next)) => *revision = next,
                Ok(None) => tracing::warn!(%key, "outbox entry changed under our claim"),
                Err(err) => tracing::warn!(error = %err, "cannot record the outcome in the outbox"),
            }
        }
    }

    async fn record(&self, attempt: &Attempt, state: DeliveryState, error: Option<String>) {
        let n = &attempt.notification;
        let status = DeliveryStatus {
            id: n.id.clone(),
            receiver: n.destination.receiver.clone(),
            destination: match &n.destination.channel {
                Some(channel) => format!("slack:{channel}"),
                None => n.destination.receiver.clone(),
            },
            event: n.kind.clone(),
            title: n.title.clone(),
            events: n.event_count(),
            state,
            attempts: attempt.retries as u32 + u32::from(state != DeliveryState::Pending),
            last_error: error,
            created_at: attempt.created,
            updated_at: Utc::now(),
        };
        match serde_json::to_vec(&status) {
            Ok(body) => {
                if let Err(err) = self.status.put(&n.id, Bytes::from(body)).await {
                    tracing::warn!(error = %err, "cannot record delivery status");
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot encode delivery status"),
        }
    }

    async fn dead_letter(&self, attempt: &Attempt, reason: &str) {
        let letter = DeadLetter {
            stream: Bucket::NotifierOutbox.name().to_string(),
            consumer: attempt.routed.destination.receiver.clone(),
            subject: String::new(),
            stream_sequence: 0,
            category: "delivery".into(),
            reason: reason.to_string(),
            deliveries: attempt.retries as u64 + 1,
            failed_at: Utc::now(),
            headers: Default::default(),
            payload: serde_json::to_string(&attempt.notification).unwrap_or_default(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Msg-Id",
            format!("notification:{}", attempt.notification.id).as_str(),
        );
        headers.insert(REASON_HEADER, reason.replace(['\r', '\n'], " ").as_str());
        let body = Bytes::from(serde_json::to_vec(&letter).unwrap_or_default());
        let subject = subject::dead_letter(Bucket::NotifierOutbox.name(), &letter.consumer);
        if let Err(err) = self.publisher.publish_raw(subject, headers, body).await {
            tracing::error!(error = %err, "cannot publish the dead letter; the outbox keeps the failure");
        }
    }

    async fn raise_disabled(&self, receiver: &str) {
        let alert = WebhookEndpointDisabled {
            severity: Severity::Critical,
            receiver: receiver.to_string(),
            status: 410,
            message: format!(
                "webhook receiver {receiver} answered 410 Gone; deliveries to it are off until the notifier's routes change"
            ),
        };
        let envelope = self
            .publisher
            .envelope(EntityRef::new("", receiver, ""), alert);
        if let Err(err) = self.publisher.publish(envelope).await {
            tracing::error!(error = %err, "cannot raise the endpoint-disabled alert");
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn observe(
    me: &str,
    index: &mut HashMap<String, Tracked>,
    beats: &mut HashMap<String, i64>,
    entry: kv::Entry,
) {
    let deleted = matches!(entry.operation, Operation::Delete | Operation::Purge);
    if let Some(replica) = entry.key.strip_prefix(HEARTBEAT_PREFIX) {
        if deleted {
            beats.remove(replica);
        } else if let Some(at) = std::str::from_utf8(&entry.value)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            beats.insert(replica.to_string(), at);
        }
        return;
    }
    if !entry.key.starts_with(ENTRY_PREFIX) {
        return;
    }
    if deleted {
        index.remove(&entry.key);
        return;
    }
    let Ok(parsed) = serde_json::from_slice::<OutboxEntry>(&entry.value) else {
        tracing::warn!(key = %entry.key, "unreadable outbox entry ignored");
        return;
    };
    if parsed.state.is_final() {
        index.remove(&entry.key);
        return;
    }
    let taken = matches!(&parsed.state, EntryState::Sending { owner, .. } if owner == me);
    let tracked = index.entry(entry.key).or_insert(Tracked {
        entry: parsed.clone(),
        revision: entry.revision,
        taken,
    });
    if entry.revision >= tracked.revision {
        // A Pending entry we took keeps its mark; any other change is looked at afresh.
        let keep = tracked.taken
            && parsed.state == EntryState::Pending
            && tracked.entry.state == EntryState::Pending;
        tracked.taken = taken || keep;
        tracked.entry = parsed;
        tracked.revision = entry.revision;
    }
}
