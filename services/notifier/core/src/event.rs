//! What the notifier tells people about: one [`Event`] per lifecycle transition,
//! sweep milestone, budget decision or alert, normalised from the contract messages.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_api::{ANNOTATION_NOTIFY, ANNOTATION_NOTIFY_ON, TrainingJobState};
use trainyard_contracts::alerts::{
    AlertRaised, BudgetThresholdCrossed, CheckpointProblem, GpusIdle, MessagesDeadLettered,
    Severity, WebhookEndpointDisabled,
};
use trainyard_contracts::cost::{BudgetState, BudgetStatusReported};
use trainyard_contracts::decisions::{AdmissionDecided, PendingExplained, SweepProgressed};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::{EntityRef, Incoming, Payload};
use uuid::Uuid;

use crate::error::CoreError;

/// Every event type the notifier can route, for config validation and docs.
pub const EVENT_TYPES: &[&str] = &[
    "job.queued",
    "job.running",
    "job.restarted",
    "job.failed",
    "job.completed",
    "job.suspended",
    "job.resumed",
    "job.preempted",
    crate::queued::QUEUED_TOO_LONG,
    "sweep.best_trial",
    "sweep.finished",
    "budget.hold",
    "budget.suspend",
    AlertRaised::TYPE,
    BudgetThresholdCrossed::TYPE,
    GpusIdle::TYPE,
    CheckpointProblem::TYPE,
    MessagesDeadLettered::TYPE,
    WebhookEndpointDisabled::TYPE,
];

/// One thing that happened, ready to route and render.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Stable id: the same message seen twice gives the same id.
    pub id: String,
    /// Event type, one of [`EVENT_TYPES`].
    pub kind: String,
    pub severity: Severity,
    pub time: DateTime<Utc>,
    pub entity: EntityRef,
    #[serde(default)]
    pub queue: Option<String>,
    /// The Sweep a trial belongs to.
    #[serde(default)]
    pub owner: Option<EntityRef>,
    /// Labels of the job or sweep (and an alert's own labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Destinations from the `trainyard.dev/notify` annotation, e.g. `slack:#team-a`.
    #[serde(default)]
    pub subscriptions: Vec<String>,
    /// Event types the subscriptions want (`trainyard.dev/notify-on`); empty: the operator's default.
    #[serde(default)]
    pub subscribed_events: Vec<String>,
    /// One line for people, e.g. `ml-training/bert failed`.
    pub title: String,
    /// Short cause used to coalesce like events, e.g. `OOMKilled`.
    pub reason: String,
    pub text: String,
    #[serde(default)]
    pub fix: Option<String>,
    /// Named facts shown as fields (job, queue, GPUs, exit code, best metric...).
    #[serde(default)]
    pub fields: Vec<(String, String)>,
    /// Link buttons: (label, URL).
    #[serde(default)]
    pub links: Vec<(String, String)>,
    /// Repeats of the same fingerprint inside `repeat_interval` are not sent again.
    pub fingerprint: String,
}

impl Event {
    /// The labels routes match on: the object's labels, overridden by the
    /// built-in `event`, `severity`, `namespace`, `name`, `queue` and `owner`.
    pub fn route_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.labels.clone();
        labels.insert("event".into(), self.kind.clone());
        labels.insert("severity".into(), self.severity.as_str().into());
        labels.insert("namespace".into(), self.entity.namespace.clone());
        labels.insert("name".into(), self.entity.name.clone());
        labels.insert("queue".into(), self.queue.clone().unwrap_or_default());
        labels.insert(
            "owner".into(),
            self.owner
                .as_ref()
                .map(|o| o.name.clone())
                .unwrap_or_default(),
        );
        labels
    }
}

pub(crate) fn derived_id(parts: &[&str]) -> String {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, parts.join("\u{1f}").as_bytes()).to_string()
}

pub(crate) fn subscriptions(annotations: &BTreeMap<String, String>) -> (Vec<String>, Vec<String>) {
    let split = |key: &str| -> Vec<String> {
        annotations
            .get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    (split(ANNOTATION_NOTIFY), split(ANNOTATION_NOTIFY_ON))
}

fn base(incoming: &Incoming, id: String, kind: &str, severity: Severity) -> Event {
    let entity = incoming.header.entity.clone();
    Event {
        id,
        kind: kind.to_string(),
        severity,
        time: incoming.header.time,
        fingerprint: format!("{kind}/{}", entity.key()),
        title: entity.key(),
        entity,
        queue: None,
        owner: None,
        labels: BTreeMap::new(),
        subscriptions: Vec::new(),
        subscribed_events: Vec::new(),
        reason: String::new(),
        text: String::new(),
        fix: None,
        fields: Vec::new(),
        links: Vec::new(),
    }
}

/// The events one consumed message means: none for messages nobody is told
/// about (a job initializing, a budget check that allows), an error for a type
/// the notifier does not know or a payload that does not decode.
pub fn events_of(incoming: &Incoming) -> Result<Vec<Event>, CoreError> {
    let id = incoming.header.id.to_string();
    let kind = incoming.header.message_type.as_str();
    let events = match kind {
        TrainingJobTransitioned::TYPE => transition(incoming, id, &incoming.payload()?)
            .into_iter()
            .collect(),
        // What the queued-too-long watch observes; nothing is told at once.
        TrainingJobFinalized::TYPE | PendingExplained::TYPE | AdmissionDecided::TYPE => Vec::new(),
        SweepProgressed::TYPE => sweep(incoming, &incoming.payload()?),
        BudgetStatusReported::TYPE => budget(incoming, id, &incoming.payload()?)
            .into_iter()
            .collect(),
        AlertRaised::TYPE => {
            let alert: AlertRaised = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            event.fingerprint = format!("{kind}/{}/{}", alert.alertname, event.entity.key());
            event.title = alert.summary.clone();
            event.reason = alert.alertname.clone();
            event.text = alert.description.clone();
            event.labels = alert.labels.clone();
            event.labels.insert("alertname".into(), alert.alertname);
            vec![event]
        }
        BudgetThresholdCrossed::TYPE => {
            let alert: BudgetThresholdCrossed = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            event.fingerprint =
                format!("{kind}/{}/{}", event.entity.key(), alert.threshold_percent);
            event.title = format!(
                "{} budget {}% spent",
                event.entity.key(),
                alert.threshold_percent
            );
            event.reason = format!("{}%", alert.threshold_percent);
            event.text = alert.message.clone();
            event.queue = alert.queue.clone();
            event.fields = vec![
                (
                    "Spent".into(),
                    format!("{:.2} {}", alert.spent, alert.currency),
                ),
                (
                    "Budget".into(),
                    format!("{:.2} {}", alert.budget, alert.currency),
                ),
            ];
            vec![event]
        }
        GpusIdle::TYPE => {
            let alert: GpusIdle = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            event.title = format!("{} GPUs idle on {}", alert.gpus, event.entity.key());
            event.reason = "idle".into();
            event.text = alert.message.clone();
            event.queue = alert.queue.clone();
            event.fields = vec![
                ("GPUs".into(), alert.gpus.to_string()),
                ("Idle".into(), format!("{} min", alert.idle_minutes)),
                (
                    "Utilization".into(),
                    format!("{:.1}%", alert.utilization_percent),
                ),
            ];
            if let Some(node) = alert.node {
                event.fields.push(("Node".into(), node));
            }
            vec![event]
        }
        CheckpointProblem::TYPE => {
            let alert: CheckpointProblem = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            let problem = format!("{:?}", alert.problem);
            event.fingerprint = format!("{kind}/{}/{problem}", event.entity.key());
            event.title = format!("checkpoint problem on {}: {problem}", event.entity.key());
            event.reason = problem;
            event.text = alert.message.clone();
            if let Some(uri) = alert.uri {
                event.fields.push(("Checkpoint".into(), uri));
            }
            vec![event]
        }
        MessagesDeadLettered::TYPE => {
            let alert: MessagesDeadLettered = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            event.fingerprint = format!("{kind}/{}/{}", alert.consumer, alert.category);
            event.title = format!(
                "{} messages dead-lettered by {}",
                alert.count, alert.consumer
            );
            event.reason = alert.category.clone();
            event.text = alert.reason.clone();
            event.fields = vec![
                ("Stream".into(), alert.stream),
                ("Category".into(), alert.category),
            ];
            vec![event]
        }
        WebhookEndpointDisabled::TYPE => {
            let alert: WebhookEndpointDisabled = incoming.payload()?;
            let mut event = base(incoming, id, kind, alert.severity);
            event.fingerprint = format!("{kind}/{}", alert.receiver);
            event.title = format!("webhook receiver {} disabled", alert.receiver);
            event.reason = alert.status.to_string();
            event.text = alert.message.clone();
            vec![event]
        }
        other => return Err(CoreError::UnknownEventType(other.to_string())),
    };
    Ok(events)
}

fn transition(incoming: &Incoming, id: String, t: &TrainingJobTransitioned) -> Option<Event> {
    use TrainingJobState as S;
    let (kind, severity, verb) = match (t.from, t.to, t.reason.as_str()) {
        (_, S::Failed, _) => ("job.failed", Severity::Critical, "failed"),
        (_, S::Completed, _) => ("job.completed", Severity::Info, "completed"),
        (_, _, "Preempted") => ("job.preempted", Severity::Warning, "was preempted"),
        (_, _, "Restarting" | "RestartBackoff") => {
            ("job.restarted", Severity::Warning, "is restarting")
        }
        (_, S::Suspended, _) => ("job.suspended", Severity::Info, "was suspended"),
        (Some(S::Suspended), _, _) => ("job.resumed", Severity::Info, "resumed"),
        (_, S::Running, _) => ("job.running", Severity::Info, "is running"),
        (_, S::Queued, _) => ("job.queued", Severity::Info, "is queued"),
        _ => return None,
    };
    let c = &t.context;
    let mut event = base(incoming, id, kind, severity);
    event.fingerprint = format!("{}/{kind}/{}", event.entity.key(), t.restart_count);
    event.title = format!("{} {verb}", event.entity.key());
    event.reason = match (&c.exit_class, c.exit_code) {
        (Some(class), Some(code)) => format!("{}: exit code {code} ({class})", t.reason),
        _ => t.reason.clone(),
    };
    event.text = t.message.clone();
    event.fix = c.fix.clone();
    event.queue = t.queue.clone();
    event.owner = c.owner.clone();
    event.labels = c.labels.clone();
    (event.subscriptions, event.subscribed_events) = subscriptions(&c.annotations);
    event.fields.push(("Job".into(), event.entity.name.clone()));
    event
        .fields
        .push(("Namespace".into(), event.entity.namespace.clone()));
    if let Some(queue) = &t.queue {
        event.fields.push(("Queue".into(), queue.clone()));
    }
    event
        .fields
        .push(("State".into(), t.to.as_str().to_string()));
    event.fields.push(("GPUs".into(), t.gpus.to_string()));
    if let Some(seconds) = c.duration_seconds {
        event
            .fields
            .push(("Duration".into(), human_duration(seconds)));
    }
    if let Some(code) = c.exit_code {
        let class = c.exit_class.as_deref().unwrap_or("unknown");
        event
            .fields
            .push(("Exit code".into(), format!("{code} ({class})")));
    }
    if t.restart_count > 0 {
        event
            .fields
            .push(("Restarts".into(), t.restart_count.to_string()));
    }
    for (metric, value) in &c.final_metrics {
        event.fields.push((metric.clone(), format!("{value:.4}")));
    }
    if let Some(owner) = &c.owner {
        event.fields.push(("Sweep".into(), owner.name.clone()));
    }
    let mut links: Vec<(String, String)> = c
        .links
        .iter()
        .map(|(name, url)| (link_label(name), url.clone()))
        .collect();
    links.sort();
    event.links = links;
    Some(event)
}

fn link_label(name: &str) -> String {
    match name {
        "run" => "Open run".into(),
        "tracking" => "Experiment tracking".into(),
        other => other.to_string(),
    }
}

fn sweep(incoming: &Incoming, p: &SweepProgressed) -> Vec<Event> {
    let uid_or_key = if incoming.header.entity.uid.is_empty() {
        incoming.header.entity.key()
    } else {
        incoming.header.entity.uid.clone()
    };
    let metric = p
        .objective_metric
        .clone()
        .unwrap_or_else(|| "objective".into());
    let (subs, subscribed) = subscriptions(&p.annotations);
    let mut out = Vec::new();
    let decorate = |mut event: Event| {
        event.labels = p.labels.clone();
        event.subscriptions = subs.clone();
        event.subscribed_events = subscribed.clone();
        event
            .fields
            .push(("Sweep".into(), event.entity.name.clone()));
        event
            .fields
            .push(("Namespace".into(), event.entity.namespace.clone()));
        event.fields.push((
            "Trials".into(),
            format!(
                "{} succeeded, {} failed, {} stopped, {} running",
                p.succeeded, p.failed, p.early_stopped, p.running
            ),
        ));
        event
    };
    let best_params = |best: &trainyard_contracts::decisions::BestTrial| {
        best.parameters
            .iter()
            .map(|(name, value)| format!("{name}={}", parameter_text(value)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(best) = &p.best_trial
        && p.finished_reason.is_none()
    {
        let id = derived_id(&[&uid_or_key, "best", &best.trial_name]);
        let mut event = base(incoming, id, "sweep.best_trial", Severity::Info);
        event.fingerprint = format!(
            "sweep.best_trial/{}/{}",
            event.entity.key(),
            best.trial_name
        );
        event.title = format!(
            "{}: new best trial {} ({metric} {:.4})",
            event.entity.key(),
            best.trial_name,
            best.objective_value
        );
        event.reason = "best trial".into();
        event.text = best_params(best);
        event = decorate(event);
        event.fields.push((
            "Best metric".into(),
            format!("{metric} {:.4}", best.objective_value),
        ));
        out.push(event);
    }
    if let Some(finished) = &p.finished_reason {
        let id = derived_id(&[&uid_or_key, "finished"]);
        let mut event = base(incoming, id, "sweep.finished", Severity::Info);
        event.fingerprint = format!("sweep.finished/{}", event.entity.key());
        event.title = format!("{} finished: {finished}", event.entity.key());
        event.reason = finished.clone();
        event.text = p.message.clone().unwrap_or_default();
        if let Some(best) = &p.best_trial {
            event.text = format!(
                "{}\nbest trial {}: {}",
                event.text,
                best.trial_name,
                best_params(best)
            )
            .trim()
            .to_string();
        }
        event = decorate(event);
        if let Some(best) = &p.best_trial {
            event.fields.push((
                "Best metric".into(),
                format!("{metric} {:.4}", best.objective_value),
            ));
        }
        out.push(event);
    }
    out
}

fn parameter_text(value: &trainyard_contracts::decisions::ParameterValue) -> String {
    use trainyard_contracts::decisions::ParameterValue as V;
    match value {
        V::Int(v) => v.to_string(),
        V::Float(v) => format!("{v}"),
        V::Text(v) => v.clone(),
    }
}

fn budget(incoming: &Incoming, id: String, b: &BudgetStatusReported) -> Option<Event> {
    let (kind, severity) = match b.state {
        BudgetState::Open => return None,
        BudgetState::Held => ("budget.hold", Severity::Warning),
        BudgetState::Suspended => ("budget.suspend", Severity::Critical),
    };
    let mut event = base(incoming, id, kind, severity);
    event.fingerprint = format!("{kind}/{}", event.entity.key());
    event.title = format!(
        "{}: {:.0}% of budget spent",
        event.entity.key(),
        if b.amount > 0.0 {
            100.0 * b.spent / b.amount
        } else {
            100.0
        }
    );
    event.reason = format!("{:?}", b.state);
    event.text = b.message.clone();
    event.fields = vec![
        ("Spent".into(), format!("{:.2} {}", b.spent, b.currency)),
        ("Budget".into(), format!("{:.2} {}", b.amount, b.currency)),
    ];
    Some(event)
}

/// `3h 12m`, `45m`, `20s`.
pub fn human_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds % 3600 / 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m"),
        _ => format!("{h}h {m}m"),
    }
}
