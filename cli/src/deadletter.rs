//! `trainyard deadletter list|show|replay`: the messages consumers gave up on,
//! read from the dead-letter stream, and published again once their cause is
//! fixed.

use std::io::Write;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer};
use chrono::SecondsFormat;
use futures::StreamExt;
use serde::Serialize;
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::{streams, subject};

use crate::cli::{DeadLetterFilter, NatsArgs};
use crate::error::CliError;
use crate::format::table;

/// One dead letter and where it is stored in the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDeadLetter {
    /// Sequence in the dead-letter stream: what `show` and `replay` take.
    pub sequence: u64,
    #[serde(flatten)]
    pub letter: DeadLetter,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    pub sequence: u64,
    pub subject: String,
    pub consumer: String,
    /// Where the original is stored now.
    pub stream: String,
    pub stream_sequence: u64,
}

fn nats_error(what: &str, url: &str, err: &dyn std::fmt::Display) -> CliError {
    CliError::Nats(format!("{what} on {url}: {err}"))
}

/// JetStream as the operator (or anonymously, where NATS has no users).
async fn connect(args: &NatsArgs) -> Result<jetstream::Context, CliError> {
    crate::nats::connect(args).await.map(jetstream::new)
}

async fn dead_letter_stream(
    js: &jetstream::Context,
    url: &str,
) -> Result<jetstream::stream::Stream, CliError> {
    js.get_stream(streams::DEAD_LETTER.name).await.map_err(|e| {
        nats_error(
            &format!(
                "no stream {} (has any service started?)",
                streams::DEAD_LETTER.name
            ),
            url,
            &e,
        )
    })
}

fn decode(sequence: u64, payload: &[u8]) -> Result<StoredDeadLetter, CliError> {
    serde_json::from_slice(payload)
        .map(|letter| StoredDeadLetter { sequence, letter })
        .map_err(|e| {
            CliError::Nats(format!(
                "message {sequence} of {} is not a dead-letter record: {e}",
                streams::DEAD_LETTER.name
            ))
        })
}

/// Every dead letter matching `filter`, oldest first. Reads with an ephemeral
/// consumer that acks nothing, so reading changes nothing.
pub async fn read(
    js: &jetstream::Context,
    url: &str,
    filter: &DeadLetterFilter,
) -> Result<Vec<StoredDeadLetter>, CliError> {
    let stream = dead_letter_stream(js, url).await?;
    let mut reader = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            filter_subject: subject::dead_letter_filter(
                filter.stream.as_deref(),
                filter.consumer.as_deref(),
            ),
            ..Default::default()
        })
        .await
        .map_err(|e| nats_error("cannot read dead letters", url, &e))?;
    let pending = reader
        .info()
        .await
        .map_err(|e| nats_error("cannot read dead letters", url, &e))?
        .num_pending as usize;
    let mut letters = Vec::with_capacity(pending);
    if pending == 0 {
        return Ok(letters);
    }
    let mut messages = reader
        .messages()
        .await
        .map_err(|e| nats_error("cannot read dead letters", url, &e))?
        .take(pending);
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| nats_error("cannot read dead letters", url, &e))?;
        let sequence = message
            .info()
            .map_err(|e| nats_error("cannot read dead letters", url, &e))?
            .stream_sequence;
        let letter = decode(sequence, &message.payload)?;
        if filter
            .category
            .as_deref()
            .is_none_or(|category| letter.letter.category == category)
        {
            letters.push(letter);
        }
    }
    Ok(letters)
}

/// The table `list` prints.
pub fn rows(letters: &[StoredDeadLetter]) -> String {
    let mut rows = vec![
        ["SEQ", "TIME", "SUBJECT", "CONSUMER", "CATEGORY", "REASON"]
            .map(String::from)
            .to_vec(),
    ];
    for stored in letters {
        let letter = &stored.letter;
        let reason: String = letter.reason.replace(['\r', '\n'], " ");
        let reason = if reason.chars().count() > 100 {
            reason.chars().take(99).collect::<String>() + "…"
        } else {
            reason
        };
        rows.push(vec![
            stored.sequence.to_string(),
            letter.failed_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            letter.original_subject(),
            letter.consumer.clone(),
            letter.category.clone(),
            reason,
        ]);
    }
    table(&rows)
}

/// The whole of one dead letter, for people: where it came from, why it
/// failed, its headers, and its payload pretty-printed when it is JSON.
pub fn render(stored: &StoredDeadLetter) -> String {
    let letter = &stored.letter;
    let mut text = format!(
        "Sequence:     {}\nStream:       {} (sequence {})\nConsumer:     {}\nSubject:      {}\nStored as:    {}\nDeliveries:   {}\nFailed at:    {}\nCategory:     {}\nReason:       {}\nHeaders:\n",
        stored.sequence,
        letter.stream,
        letter.stream_sequence,
        letter.consumer,
        letter.original_subject(),
        letter.subject,
        letter.deliveries,
        letter
            .failed_at
            .to_rfc3339_opts(SecondsFormat::Millis, true),
        letter.category,
        letter.reason,
    );
    for (name, value) in &letter.headers {
        text.push_str(&format!("  {name}: {value}\n"));
    }
    let payload = serde_json::from_str::<serde_json::Value>(&letter.payload)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| letter.payload.clone());
    text.push_str("Payload:\n");
    text.push_str(&payload);
    text.push('\n');
    text
}

/// `list`.
pub async fn list(
    nats: &NatsArgs,
    filter: &DeadLetterFilter,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let js = connect(nats).await?;
    let letters = read(&js, &nats.nats_url, filter).await?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&letters)?)?;
    } else if letters.is_empty() {
        writeln!(err, "No dead letters found.")?;
    } else {
        out.write_all(rows(&letters).as_bytes())?;
    }
    Ok(())
}

/// `show`.
pub async fn show(
    nats: &NatsArgs,
    sequence: u64,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let js = connect(nats).await?;
    let stream = dead_letter_stream(&js, &nats.nats_url).await?;
    let message = stream.get_raw_message(sequence).await.map_err(|e| {
        CliError::Usage(format!(
            "no dead letter with sequence {sequence} ({e}); `trainyard deadletter list` shows them"
        ))
    })?;
    let stored = decode(sequence, &message.payload)?;
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&stored)?)?;
    } else {
        out.write_all(render(&stored).as_bytes())?;
    }
    Ok(())
}

/// The headers the original is published with again: its own, but a
/// `Nats-Msg-Id` of the replay.
pub fn replay_headers(letter: &DeadLetter) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &letter.headers {
        if !name.eq_ignore_ascii_case("Nats-Msg-Id") {
            headers.insert(name.as_str(), value.as_str());
        }
    }
    headers.insert("Nats-Msg-Id", letter.replay_message_id().as_str());
    headers
}

/// `replay`: publishes each selected original again on the subject it was
/// published on, then deletes its dead letter. `sequences` empty means every
/// dead letter matching `filter`. Stops at the first failure: what was
/// replayed before it is printed and gone from the dead-letter stream.
pub async fn replay(
    nats: &NatsArgs,
    filter: &DeadLetterFilter,
    sequences: &[u64],
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    let js = connect(nats).await?;
    let url = nats.nats_url.as_str();
    let letters = read(&js, url, filter).await?;
    let selected: Vec<StoredDeadLetter> = if sequences.is_empty() {
        letters
    } else {
        let mut selected = Vec::with_capacity(sequences.len());
        for sequence in sequences {
            let found = letters
                .iter()
                .find(|stored| stored.sequence == *sequence)
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "no dead letter with sequence {sequence} matches; `trainyard deadletter list` shows them"
                    ))
                })?;
            selected.push(found.clone());
        }
        selected
    };
    if selected.is_empty() {
        writeln!(err, "No dead letters to replay.")?;
        return Ok(());
    }
    let stream = dead_letter_stream(&js, url).await?;
    let mut replayed = Vec::with_capacity(selected.len());
    for stored in selected {
        let letter = &stored.letter;
        let subject = letter.original_subject();
        let ack = js
            .publish_with_headers(
                subject.clone(),
                replay_headers(letter),
                letter.payload.clone().into(),
            )
            .await
            .map_err(|e| nats_error(&format!("cannot replay {}", stored.sequence), url, &e))?
            .await
            .map_err(|e| nats_error(&format!("cannot replay {}", stored.sequence), url, &e))?;
        stream.delete_message(stored.sequence).await.map_err(|e| {
            nats_error(
                &format!(
                    "replayed {} but could not delete its dead letter (replaying it again stores it once)",
                    stored.sequence
                ),
                url,
                &e,
            )
        })?;
        let done = Replayed {
            sequence: stored.sequence,
            subject,
            consumer: letter.consumer.clone(),
            stream: ack.stream,
            stream_sequence: ack.sequence,
        };
        if !json {
            writeln!(
                out,
                "replayed {}: {} (dead-lettered by {}) -> {} sequence {}",
                done.sequence, done.subject, done.consumer, done.stream, done.stream_sequence
            )?;
        }
        replayed.push(done);
    }
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&replayed)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn letter() -> StoredDeadLetter {
        StoredDeadLetter {
            sequence: 7,
            letter: DeadLetter {
                stream: "TRAINYARD_EVENTS".into(),
                consumer: "planner-events".into(),
                subject: "trainyard.events.pod.3.ml.bert".into(),
                stream_sequence: 41,
                category: "retries_exhausted".into(),
                reason: "gave up after 5 deliveries:\nkubernetes apply job ml/bert: 403".into(),
                deliveries: 5,
                failed_at: chrono::Utc
                    .with_ymd_and_hms(2026, 3, 1, 12, 0, 0)
                    .single()
                    .expect("a time"),
                headers: [
                    ("Nats-Msg-Id".to_string(), "pod:ml:bert:9".to_string()),
                    ("traceparent".to_string(), "00-abc-def-01".to_string()),
                ]
                .into(),
                payload: r#"{"id":"0190","type":"pod.observed"}"#.into(),
            },
        }
    }

    #[test]
    fn the_table_shows_the_published_subject_and_a_one_line_reason() {
        let text = rows(&[letter()]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("SEQ"), "{text}");
        assert!(lines[1].starts_with("7 "), "{text}");
        assert!(lines[1].contains("2026-03-01T12:00:00Z"), "{text}");
        assert!(lines[1].contains("trainyard.events.pod.ml.bert "), "{text}");
        assert!(lines[1].contains("gave up after 5 deliveries: kubernetes"));
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn show_pretty_prints_the_payload_and_lists_the_headers() {
        let text = render(&letter());
        assert!(text.contains("Stored as:    trainyard.events.pod.3.ml.bert"));
        assert!(text.contains("  traceparent: 00-abc-def-01"));
        assert!(text.contains("{\n  \"id\": \"0190\",\n  \"type\": \"pod.observed\"\n}"));
    }

    #[test]
    fn a_replay_keeps_the_headers_but_not_the_original_message_id() {
        let stored = letter();
        let headers = replay_headers(&stored.letter);
        assert_eq!(
            headers.get("traceparent").map(|v| v.as_str()),
            Some("00-abc-def-01")
        );
        assert_eq!(
            headers.get("Nats-Msg-Id").map(|v| v.as_str()),
            Some("replay:TRAINYARD_EVENTS:41")
        );
    }
}
