//! `trainyard notifications`: recent deliveries from the notifier's
//! delivery-status bucket, newest first.

use std::io::Write;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use trainyard_contracts::Bucket;
use trainyard_contracts::notifications::DeliveryStatus;

use crate::cli::NatsArgs;
use crate::error::CliError;
use crate::format::{human_duration, table};

/// Newest first, at most `limit`, only `state` when given.
pub fn select(
    mut statuses: Vec<DeliveryStatus>,
    state: Option<&str>,
    limit: usize,
) -> Vec<DeliveryStatus> {
    statuses.retain(|s| state.is_none_or(|wanted| s.state.as_str() == wanted));
    statuses.sort_by_key(|s| std::cmp::Reverse(s.updated_at));
    statuses.truncate(limit);
    statuses
}

/// The table of [`select`]ed statuses.
pub fn rows(
    statuses: Vec<DeliveryStatus>,
    state: Option<&str>,
    limit: usize,
    now: DateTime<Utc>,
) -> String {
    let statuses = select(statuses, state, limit);
    let mut rows = vec![
        [
            "AGE",
            "STATE",
            "DESTINATION",
            "EVENT",
            "EVENTS",
            "ATTEMPTS",
            "TITLE",
            "LAST ERROR",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in statuses {
        let age = (now - s.created_at).num_milliseconds() as f64 / 1000.0;
        let title: String = s.title.chars().take(60).collect();
        rows.push(vec![
            human_duration(age),
            s.state.as_str().to_string(),
            s.destination,
            s.event,
            s.events.to_string(),
            s.attempts.to_string(),
            title,
            s.last_error.unwrap_or_default(),
        ]);
    }
    table(&rows)
}

/// Reads every delivery status from the notifier's bucket and prints them.
pub async fn list(
    nats_args: &NatsArgs,
    state: Option<&str>,
    limit: usize,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let nats_url = &nats_args.nats_url;
    let nats = |what: &str, err: &dyn std::fmt::Display| {
        CliError::Nats(format!("{what} on {nats_url}: {err}"))
    };
    let client = crate::nats::connect(nats_args).await?;
    let js = async_nats::jetstream::new(client);
    let store = js
        .get_key_value(Bucket::Notifications.name())
        .await
        .map_err(|e| nats("no delivery-status bucket (is the notifier running?)", &e))?;
    let mut keys = store
        .keys()
        .await
        .map_err(|e| nats("cannot list deliveries", &e))?;
    let mut statuses = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| nats("cannot list deliveries", &e))?;
        if let Some(value) = store
            .get(&key)
            .await
            .map_err(|e| nats("cannot read a delivery", &e))?
            && let Ok(status) = serde_json::from_slice::<DeliveryStatus>(&value)
        {
            statuses.push(status);
        }
    }
    let write = |out: &mut dyn Write, text: String| {
        out.write_all(text.as_bytes())
            .map_err(|e| CliError::Usage(format!("cannot write: {e}")))
    };
    if json {
        let text =
            serde_json::to_string_pretty(&select(statuses, state, limit)).unwrap_or_default();
        return write(out, text + "\n");
    }
    write(out, rows(statuses, state, limit, Utc::now()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_contracts::notifications::DeliveryState;

    fn status(
        id: &str,
        state: DeliveryState,
        minutes_ago: i64,
        now: DateTime<Utc>,
    ) -> DeliveryStatus {
        let at = now - chrono::Duration::minutes(minutes_ago);
        DeliveryStatus {
            id: id.into(),
            receiver: "slack".into(),
            destination: "slack:#training".into(),
            event: "job.failed".into(),
            title: format!("ml/{id} failed"),
            events: 1,
            state,
            attempts: 1,
            last_error: (state == DeliveryState::Failed).then(|| "HTTP 404".to_string()),
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn newest_first_filtered_and_limited() {
        let now = Utc::now();
        let statuses = vec![
            status("old", DeliveryState::Sent, 30, now),
            status("new", DeliveryState::Sent, 1, now),
            status("bad", DeliveryState::Failed, 5, now),
        ];
        let text = rows(statuses.clone(), None, 10, now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("AGE"));
        assert!(
            lines[1].contains("ml/new failed") && lines[3].contains("ml/old failed"),
            "{text}"
        );
        let failed = rows(statuses.clone(), Some("failed"), 10, now);
        assert_eq!(failed.lines().count(), 2);
        assert!(failed.contains("HTTP 404"));
        assert_eq!(rows(statuses, None, 1, now).lines().count(), 2);
    }
}
