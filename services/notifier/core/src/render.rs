//! What a notification looks like: Slack Block Kit (within Slack's limits,
//! truncated, never rejected), a compact text rendering of those blocks, and
//! the webhook body `{type, timestamp, data}`.

use serde_json::{Value, json};

use crate::notification::{Line, Notification, line_title};

/// Slack's limits on a message.
pub mod limits {
    pub const BLOCKS: usize = 50;
    pub const HEADER_CHARS: usize = 150;
    pub const SECTION_CHARS: usize = 3000;
    pub const FIELDS: usize = 10;
    pub const FIELD_CHARS: usize = 2000;
    pub const CONTEXT_CHARS: usize = 3000;
    pub const BUTTON_TEXT_CHARS: usize = 75;
    pub const URL_CHARS: usize = 3000;
    pub const ACTION_ELEMENTS: usize = 25;
    /// The top-level `text` fallback is cut by Slack beyond this.
    pub const TEXT_CHARS: usize = 40_000;
}

/// Cuts `text` to at most `max` characters, ending in `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn emoji(notification: &Notification) -> &'static str {
    use trainyard_contracts::alerts::Severity;
    match notification.kind.as_str() {
        "job.completed" | "sweep.finished" => ":white_check_mark:",
        "sweep.best_trial" => ":trophy:",
        _ => match notification.severity {
            Severity::Critical => ":x:",
            Severity::Warning => ":warning:",
            Severity::Info => ":information_source:",
        },
    }
}

fn mrkdwn(text: String) -> Value {
    json!({"type": "mrkdwn", "text": truncate(&text, limits::SECTION_CHARS)})
}

fn line_blocks(line: &Line, detailed: bool) -> Vec<Value> {
    let event = &line.sample;
    let mut blocks = Vec::new();
    let mut body = if detailed {
        event.text.clone()
    } else {
        format!("*{}*\n{}", line_title(line), event.text)
    };
    if let Some(fix) = &event.fix {
        body = format!("{body}\n*Fix:* {fix}");
    }
    if line.count > 1 {
        let shown: Vec<&str> = line.entities.iter().take(10).map(String::as_str).collect();
        let more = line.entities.len().saturating_sub(shown.len());
        body = format!(
            "{body}\n_{}{}_",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    let fields: Vec<Value> = event
        .fields
        .iter()
        .take(limits::FIELDS)
        .map(|(name, value)| {
            json!({"type": "mrkdwn", "text": truncate(&format!("*{name}*\n{value}"), limits::FIELD_CHARS)})
        })
        .collect();
    if !body.trim().is_empty() {
        blocks.push(json!({"type": "section", "text": mrkdwn(body.trim().to_string())}));
    }
    if detailed && !fields.is_empty() {
        blocks.push(json!({"type": "section", "fields": fields}));
    }
    if detailed && !event.links.is_empty() {
        let buttons: Vec<Value> = event
            .links
            .iter()
            .filter(|(_, url)| url.chars().count() <= limits::URL_CHARS)
            .take(limits::ACTION_ELEMENTS)
            .map(|(label, url)| {
                json!({"type": "button",
                       "text": {"type": "plain_text", "text": truncate(label, limits::BUTTON_TEXT_CHARS)},
                       "url": url})
            })
            .collect();
        if !buttons.is_empty() {
            blocks.push(json!({"type": "actions", "elements": buttons}));
        }
    }
    blocks
}

/// The Block Kit message; `channel` is set for `chat.postMessage`.
pub fn slack_message(notification: &Notification, channel: Option<&str>) -> Value {
    let header = format!("{} {}", emoji(notification), notification.title);
    let mut blocks = vec![json!({"type": "header",
        "text": {"type": "plain_text", "text": truncate(&header, limits::HEADER_CHARS), "emoji": true}})];
    let single = notification.lines.len() == 1;
    // Room for the header, the context line and a "more" line.
    let room = limits::BLOCKS - 3;
    let mut shown = 0;
    for line in &notification.lines {
        let line_blocks = line_blocks(line, single);
        if blocks.len() - 1 + line_blocks.len() > room {
            break;
        }
        blocks.extend(line_blocks);
        shown += 1;
    }
    let hidden = notification.lines.len() - shown;
    if hidden > 0 {
        let events: u32 = notification.lines[shown..].iter().map(|l| l.count).sum();
        blocks.push(json!({"type": "section",
            "text": mrkdwn(format!("_… and {hidden} more kinds of events ({events} events)_"))}));
    }
    let first = notification.lines.first().map(|l| &l.sample);
    let context = format!(
        "trainyard · {} · {} event{} · {}",
        notification.kind,
        notification.event_count(),
        if notification.event_count() == 1 {
            ""
        } else {
            "s"
        },
        first
            .map(|e| e.time)
            .unwrap_or(notification.created_at)
            .format("%Y-%m-%d %H:%M:%S UTC")
    );
    blocks.push(json!({"type": "context",
        "elements": [{"type": "mrkdwn", "text": truncate(&context, limits::CONTEXT_CHARS)}]}));
    let mut message = json!({
        "text": truncate(&notification.title, limits::TEXT_CHARS),
        "blocks": blocks,
    });
    if let Some(channel) = channel {
        message["channel"] = json!(channel);
    }
    message
}

/// A compact text rendering of a Block Kit message, as a person would read it.
pub fn slack_text(message: &Value) -> String {
    let mut out = Vec::new();
    let text_of = |v: &Value| v["text"].as_str().unwrap_or_default().to_string();
    for block in message["blocks"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("header") => out.push(format!("▌{}", text_of(&block["text"]))),
            Some("section") => {
                if block["text"].is_object() {
                    out.push(text_of(&block["text"]));
                }
                if let Some(fields) = block["fields"].as_array() {
                    let fields: Vec<String> = fields
                        .iter()
                        .map(|f| text_of(f).replace('*', "").replacen('\n', ": ", 1))
                        .collect();
                    out.push(fields.join(" | "));
                }
            }
            Some("context") => {
                let parts: Vec<String> = block["elements"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(text_of)
                    .collect();
                out.push(parts.join(" "));
            }
            Some("actions") => {
                let buttons: Vec<String> = block["elements"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| {
                        format!(
                            "[{}]({})",
                            text_of(&b["text"]),
                            b["url"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                out.push(buttons.join(" "));
            }
            _ => {}
        }
    }
    out.join("\n")
}

/// The webhook body: `{type, timestamp, data}`, `data` being the notification.
pub fn webhook_body(notification: &Notification) -> Value {
    json!({
        "type": notification.kind,
        "timestamp": notification.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": notification,
    })
}
