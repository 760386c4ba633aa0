//! "Queued too long": a job that waits in `Queued` (not admitted) longer than
//! its threshold is told about once per attempt and destination, naming the
//! queue, the wait and the pending reason the planner or gpu-allocator gave
//! last. The wait is a [`QueueWait`] that lifecycle transitions, pending
//! explanations, admissions and deletions fold into ([`observe`]); the
//! service stores it, and [`due`] says, at a given time, which destinations
//! are owed the notification.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_api::TrainingJobState;
use trainyard_contracts::alerts::Severity;
use trainyard_contracts::decisions::{AdmissionDecided, PendingExplained};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::{EntityRef, Incoming, Payload};

use crate::error::CoreError;
use crate::event::{Event, derived_id, human_duration, subscriptions};
use crate::routing::{Routed, Routing};

/// The event type of a job that waited too long.
pub const QUEUED_TOO_LONG: &str = "job.queued_too_long";

/// Why the job waits, as its last explainer put it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingReason {
    /// `WaitingForQuota`, `WaitingForAdmission`, `AdmissionConflict`, ...
    pub reason: String,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// One job's wait for admission, as the notifier keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueWait {
    pub job: EntityRef,
    /// The attempt (restart count) that waits, or waited last.
    pub attempt: u32,
    /// Since when the job waits in `Queued`; None once it left (admitted,
    /// ended, deleted), kept so a late, older message cannot reopen the wait.
    #[serde(default)]
    pub queued_since: Option<DateTime<Utc>>,
    /// Time of the message that last opened or closed the wait.
    pub changed_at: DateTime<Utc>,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub pending: Option<PendingReason>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The job's `trainyard.dev/notify*` annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub owner: Option<EntityRef>,
    /// Destinations (their keys) already told about this wait.
    #[serde(default)]
    pub notified: BTreeSet<String>,
}

impl QueueWait {
    fn empty(job: &EntityRef) -> Self {
        Self {
            job: job.clone(),
            attempt: 0,
            queued_since: None,
            changed_at: DateTime::<Utc>::MIN_UTC,
            queue: None,
            pending: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            owner: None,
            notified: BTreeSet::new(),
        }
    }

    pub fn is_waiting(&self) -> bool {
        self.queued_since.is_some()
    }

    /// The event for people at `now`: the queue, the wait so far and the
    /// pending reason. Its id is the same for every replica and restart.
    pub fn event(&self, now: DateTime<Utc>) -> Option<Event> {
        let since = self.queued_since?;
        let waited = human_duration((now - since).num_seconds().max(0) as u64);
        let key = self.job.key();
        let queue = self.queue.clone().unwrap_or_default();
        let (reason, message) = match &self.pending {
            Some(p) => (p.reason.clone(), p.message.clone()),
            None => ("Queued".to_string(), String::new()),
        };
        let (subscriptions, subscribed_events) = subscriptions(&self.annotations);
        let mut fields = vec![
            ("Job".to_string(), self.job.name.clone()),
            ("Namespace".to_string(), self.job.namespace.clone()),
            ("Queue".to_string(), queue.clone()),
            ("Waiting".to_string(), waited.clone()),
            ("Pending reason".to_string(), reason.clone()),
        ];
        if self.attempt > 0 {
            fields.push(("Restarts".to_string(), self.attempt.to_string()));
        }
        if let Some(owner) = &self.owner {
            fields.push(("Sweep".to_string(), owner.name.clone()));
        }
        let stamp = since.to_rfc3339();
        Some(Event {
            id: derived_id(&[&key, QUEUED_TOO_LONG, &self.attempt.to_string(), &stamp]),
            kind: QUEUED_TOO_LONG.to_string(),
            severity: Severity::Warning,
            time: now,
            entity: self.job.clone(),
            queue: self.queue.clone(),
            owner: self.owner.clone(),
            labels: self.labels.clone(),
            subscriptions,
            subscribed_events,
            title: format!("{key} queued for {waited} in queue {queue}"),
            reason,
            text: message,
            fix: None,
            fields,
            links: Vec::new(),
            fingerprint: format!("{key}/{QUEUED_TOO_LONG}/{}/{stamp}", self.attempt),
        })
    }
}

/// What one consumed message says about a job's wait.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitObservation {
    Transitioned(Box<TrainingJobTransitioned>),
    Pending(PendingExplained),
    Admitted { attempt: u32 },
    Deleted,
}

/// The observation a message carries, if it is one the wait depends on.
pub fn observation_of(incoming: &Incoming) -> Result<Option<WaitObservation>, CoreError> {
    let kind = incoming.header.message_type.as_str();
    Ok(match kind {
        TrainingJobTransitioned::TYPE => {
            Some(WaitObservation::Transitioned(Box::new(incoming.payload()?)))
        }
        PendingExplained::TYPE => Some(WaitObservation::Pending(incoming.payload()?)),
        AdmissionDecided::TYPE => {
            let admission: AdmissionDecided = incoming.payload()?;
            Some(WaitObservation::Admitted {
                attempt: admission.attempt,
            })
        }
        TrainingJobFinalized::TYPE => Some(WaitObservation::Deleted),
        _ => None,
    })
}

/// Folds an observation made at `at` (its message's time) into the job's
/// wait. None: nothing to store (no change, or a job that never waited).
/// Messages older than the last opening or closing of the wait do not move
/// it, so replicas handling one job's messages out of order agree.
pub fn observe(
    previous: Option<&QueueWait>,
    job: &EntityRef,
    observation: &WaitObservation,
    at: DateTime<Utc>,
) -> Option<QueueWait> {
    let stale = previous.is_some_and(|p| at < p.changed_at);
    match observation {
        WaitObservation::Transitioned(t) if t.to == TrainingJobState::Queued => {
            if stale {
                return None;
            }
            let mut wait = previous.cloned().unwrap_or_else(|| QueueWait::empty(job));
            let continues = wait.is_waiting() && wait.attempt == t.restart_count;
            if !continues {
                // A pending explanation that came after the last change is
                // about this wait; anything older is about an earlier one.
                let pending = wait.pending.take().filter(|p| p.at >= wait.changed_at);
                wait = QueueWait {
                    pending,
                    ..QueueWait::empty(job)
                };
                wait.attempt = t.restart_count;
                wait.queued_since = Some(at);
                wait.changed_at = at;
            }
            let from_transition = PendingReason {
                reason: t.reason.clone(),
                message: t.message.clone(),
                at,
            };
            // The gpu-allocator's explanation says more than the planner's
            // "waiting for admission"; a later transition (a conflict) wins.
            if wait.pending.is_none()
                || (continues && wait.pending.as_ref().is_some_and(|p| p.at <= at))
            {
                wait.pending = Some(from_transition);
            }
            wait.queue = t.queue.clone().or(wait.queue);
            wait.labels = t.context.labels.clone();
            wait.annotations = t.context.annotations.clone();
            wait.owner = t.context.owner.clone();
            changed(previous, wait)
        }
        WaitObservation::Transitioned(t) => {
            let previous = previous.filter(|_| !stale)?;
            close(previous, Some(t.restart_count), at)
        }
        WaitObservation::Admitted { attempt } => match previous {
            // Kept closed, so a Queued message older than the admission
            // (handled later, by another replica) cannot open a wait.
            None => Some(QueueWait {
                attempt: *attempt,
                changed_at: at,
                ..QueueWait::empty(job)
            }),
            Some(p) if !stale && *attempt >= p.attempt => close(p, Some(*attempt), at),
            Some(_) => None,
        },
        WaitObservation::Deleted => {
            let previous = previous.filter(|_| !stale)?;
            close(previous, None, at)
        }
        WaitObservation::Pending(p) => {
            if previous.is_some_and(|w| {
                w.pending.as_ref().is_some_and(|known| known.at > at)
                    || (!w.is_waiting() && at < w.changed_at)
            }) {
                return None;
            }
            let mut wait = previous.cloned().unwrap_or_else(|| QueueWait::empty(job));
            // The planner words it the same way in the job's Admitted condition.
            wait.pending = Some(PendingReason {
                reason: if p.unschedulable.is_some() {
                    "Unschedulable"
                } else {
                    "WaitingForQuota"
                }
                .to_string(),
                message: format!(
                    "position {} in queue {}: {}",
                    p.position, p.queue, p.message
                ),
                at,
            });
            wait.queue = Some(p.queue.clone());
            changed(previous, wait)
        }
    }
}

fn close(previous: &QueueWait, attempt: Option<u32>, at: DateTime<Utc>) -> Option<QueueWait> {
    let mut wait = previous.clone();
    wait.queued_since = None;
    wait.changed_at = at;
    wait.pending = None;
    wait.notified.clear();
    if let Some(attempt) = attempt {
        wait.attempt = wait.attempt.max(attempt);
    }
    changed(Some(previous), wait)
}

fn changed(previous: Option<&QueueWait>, wait: QueueWait) -> Option<QueueWait> {
    (previous != Some(&wait)).then_some(wait)
}

/// What a wait owes at `now`: the notification per destination whose
/// threshold has passed and that was not told yet, and when the next one
/// falls due.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Due {
    pub notify: Vec<(Routed, Event)>,
    pub next: Option<DateTime<Utc>>,
}

pub fn due(wait: &QueueWait, routing: &Routing, now: DateTime<Utc>) -> Due {
    let (Some(since), Some(event)) = (wait.queued_since, wait.event(now)) else {
        return Due::default();
    };
    let mut out = Due::default();
    for (routed, threshold) in routing.route_queued(&event) {
        if wait.notified.contains(&routed.destination.key()) {
            continue;
        }
        let at = since + chrono::Duration::from_std(threshold).unwrap_or(chrono::TimeDelta::MAX);
        if at <= now {
            out.notify.push((routed, event.clone()));
        } else {
            out.next = Some(out.next.map_or(at, |next| next.min(at)));
        }
    }
    out
}

/// Thresholds of `job.queued_too_long`: `after` for every queue unless the
/// queue has its own; a route's `queued_too_long_after` beats both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedThresholds {
    pub after: Duration,
    pub queues: BTreeMap<String, Duration>,
}

impl Default for QueuedThresholds {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(3600),
            queues: BTreeMap::new(),
        }
    }
}

impl QueuedThresholds {
    pub fn for_queue(&self, queue: Option<&str>) -> Duration {
        queue
            .and_then(|q| self.queues.get(q))
            .copied()
            .unwrap_or(self.after)
    }
}
