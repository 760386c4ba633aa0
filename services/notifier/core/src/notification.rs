//! Coalescing: the events of one batch become one notification, like events
//! (same type and reason) one line with a count.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use trainyard_contracts::EntityRef;
use trainyard_contracts::alerts::Severity;
use uuid::Uuid;

use crate::event::Event;
use crate::routing::Destination;

/// Like events of a notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    pub kind: String,
    pub reason: String,
    pub count: u32,
    /// The first event, shown in full.
    pub sample: Event,
    /// Every event's object, `namespace/name`.
    pub entities: Vec<String>,
}

/// One message to one destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Deterministic from destination and events: a resend has the same id.
    pub id: String,
    pub destination: Destination,
    /// The event type, or `mixed`.
    pub kind: String,
    pub severity: Severity,
    pub title: String,
    pub lines: Vec<Line>,
    /// Ids of every event in it.
    pub event_ids: Vec<String>,
    pub created_at: DateTime<Utc>,
}

impl Notification {
    pub fn event_count(&self) -> u32 {
        self.lines.iter().map(|l| l.count).sum()
    }
}

/// The notification id for these events to this destination.
pub fn notification_id(destination: &Destination, event_ids: &[String]) -> String {
    let mut ids = event_ids.to_vec();
    ids.sort();
    let mut name = destination.key();
    for id in ids {
        name.push('\u{1f}');
        name.push_str(&id);
    }
    Uuid::new_v5(&Uuid::NAMESPACE_URL, name.as_bytes()).to_string()
}

/// Coalesces `events` (in arrival order) into one notification.
pub fn coalesce(destination: Destination, events: Vec<Event>, now: DateTime<Utc>) -> Notification {
    let event_ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    let severity = events
        .iter()
        .map(|e| e.severity)
        .max()
        .unwrap_or(Severity::Info);
    let mut lines: Vec<Line> = Vec::new();
    for event in events {
        let entity = event.entity.key();
        match lines
            .iter_mut()
            .find(|l| l.kind == event.kind && l.reason == event.reason)
        {
            Some(line) => {
                line.count += 1;
                line.entities.push(entity);
            }
            None => lines.push(Line {
                kind: event.kind.clone(),
                reason: event.reason.clone(),
                count: 1,
                entities: vec![entity],
                sample: event,
            }),
        }
    }
    let kind = match lines.as_slice() {
        [first, rest @ ..] if rest.iter().all(|l| l.kind == first.kind) => first.kind.clone(),
        _ => "mixed".to_string(),
    };
    let title = title(&lines);
    Notification {
        id: notification_id(&destination, &event_ids),
        destination,
        kind,
        severity,
        title,
        lines,
        event_ids,
        created_at: now,
    }
}

/// The headline of a line: the event's own title, or a count.
pub fn line_title(line: &Line) -> String {
    if line.count == 1 {
        return line.sample.title.clone();
    }
    let verb = line
        .kind
        .rsplit('.')
        .next()
        .unwrap_or(&line.kind)
        .replace('_', " ");
    let what = match (&line.sample.owner, line.kind.starts_with("job.")) {
        (Some(owner), true) => format!("{} trials of {}", line.count, EntityRef::key(owner)),
        (None, true) => format!("{} jobs", line.count),
        _ => format!("{} × {}", line.count, line.kind),
    };
    if line.reason.is_empty() {
        format!("{what} {verb}")
    } else {
        format!("{what} {verb}: {}", line.reason)
    }
}

fn title(lines: &[Line]) -> String {
    match lines {
        [line] => line_title(line),
        _ => {
            let total: u32 = lines.iter().map(|l| l.count).sum();
            let parts: Vec<String> = lines.iter().map(line_title).collect();
            format!("{total} events: {}", parts.join("; "))
        }
    }
}
