//! The fuzz scenario's bad messages: for every message type of the contract
//! catalog, seven malformed envelopes on the subject its example is
//! published on; and, afterwards, what became of them in the dead-letter
//! stream.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde_json::{Value, json};
use trainyard_contracts::Service;
use trainyard_contracts::catalog;
use trainyard_contracts::dead_letter::DeadLetter;

use super::ChaosError;

/// Levels of nesting of the deep-nesting kind (serde_json stops at 128).
const NESTING: usize = 300;

pub struct BadMessage {
    pub subject: String,
    pub kind: &'static str,
    body: Vec<u8>,
    /// Broken before any handler sees it (the envelope does not decode):
    /// every consumer of the subject must dead-letter it.
    pub envelope_level: bool,
}

/// A bad message as stored.
pub struct Published {
    stream: String,
    sequence: u64,
    subject: String,
    kind: &'static str,
    envelope_level: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct FuzzOutcome {
    pub published: usize,
    /// (message, consumer) pairs: each consumer whose filter takes the subject.
    pub expected: usize,
    /// Pairs with a dead letter.
    pub dead_lettered: usize,
    /// Pairs dead-lettered more than once.
    pub duplicated: usize,
    /// Envelope-level pairs without a dead letter (a silent drop).
    pub missing: usize,
    /// Per kind: messages published and dead letters for them.
    pub by_kind: BTreeMap<&'static str, (usize, usize)>,
}

/// Seven bad messages per catalog entry.
pub fn messages(rng: &mut StdRng) -> Result<Vec<BadMessage>, ChaosError> {
    let entries =
        catalog::all().map_err(|e| ChaosError::Watch(format!("the contract catalog: {e}")))?;
    let json = |e: serde_json::Error| ChaosError::Watch(format!("writing a bad message: {e}"));
    let mut out = Vec::with_capacity(entries.len() * 7);
    for (i, entry) in entries.iter().enumerate() {
        let example = fresh_id(&entry.example);
        let text = serde_json::to_vec(&example).map_err(json)?;
        let with_marker = |key: &str| -> Result<(Vec<u8>, usize), ChaosError> {
            let mut marked = example.clone();
            marked[key] = json!("@@marker@@");
            let bytes = serde_json::to_vec(&marked).map_err(json)?;
            let at = find(&bytes, b"\"@@marker@@\"")
                .ok_or_else(|| ChaosError::Watch("the marker was not written".into()))?;
            Ok((bytes, at))
        };
        let mut bad = |kind, body, envelope_level| {
            out.push(BadMessage {
                subject: entry.subject.clone(),
                kind,
                body,
                envelope_level,
            })
        };
        let random: Vec<u8> = (0..rng.random_range(1..512))
            .map(|_| rng.random::<u8>())
            .collect();
        bad("random bytes", random, true);
        bad("truncated JSON", text[..text.len() / 2].to_vec(), true);
        let (mut invalid, at) = with_marker("source")?;
        invalid[at + 1] = 0xff;
        invalid[at + 2] = 0xfe;
        bad("invalid UTF-8", invalid, true);
        let (marked, at) = with_marker("payload")?;
        let nested = [
            &marked[..at],
            "[".repeat(NESTING).as_bytes(),
            "]".repeat(NESTING).as_bytes(),
            &marked[at + "\"@@marker@@\"".len()..],
        ]
        .concat();
        // The envelope reads its payload as raw JSON; the nesting breaks the
        // payload's decoding, which only the consumers of its type attempt.
        bad("deep nesting", nested, false);
        let mut no_entity = example.clone();
        if let Some(fields) = no_entity.as_object_mut() {
            fields.remove("entity");
        }
        bad(
            "no entity",
            serde_json::to_vec(&no_entity).map_err(json)?,
            true,
        );
        let mut version = fresh_id(&entry.example);
        version["schemaVersion"] = json!(99);
        bad(
            "unknown version",
            serde_json::to_vec(&version).map_err(json)?,
            false,
        );
        let other = &entries[(i + 1) % entries.len()];
        let mut wrong = fresh_id(&entry.example);
        wrong["payload"] = other.example["payload"].clone();
        bad(
            "another type's payload",
            serde_json::to_vec(&wrong).map_err(json)?,
            false,
        );
    }
    Ok(out)
}

/// The example with an id of its own, so no deduplication hides it.
fn fresh_id(example: &Value) -> Value {
    let mut copy = example.clone();
    let id = uuid::Uuid::now_v7().to_string();
    copy["id"] = json!(id);
    copy["correlationId"] = json!(id);
    copy
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Publishes `bad` evenly over `window` seconds from `start`.
pub async fn publish(
    js: &jetstream::Context,
    bad: &[BadMessage],
    start: Instant,
    window: f64,
) -> Result<Vec<Published>, ChaosError> {
    let mut published = Vec::with_capacity(bad.len());
    if bad.is_empty() {
        return Ok(published);
    }
    let every = window / bad.len() as f64;
    for (i, message) in bad.iter().enumerate() {
        tokio::time::sleep_until((start + Duration::from_secs_f64(every * i as f64)).into()).await;
        let failed =
            |e: &dyn std::fmt::Display| ChaosError::Nats(format!("{}: {e}", message.subject));
        let ack = js
            .publish(message.subject.clone(), message.body.clone().into())
            .await
            .map_err(|e| failed(&e))?
            .await
            .map_err(|e| failed(&e))?;
        published.push(Published {
            stream: ack.stream,
            sequence: ack.sequence,
            subject: message.subject.clone(),
            kind: message.kind,
            envelope_level: message.envelope_level,
        });
    }
    Ok(published)
}

/// Matches what was published with the dead letters of the consumers of
/// `services` (those that ran).
pub fn outcome(
    published: &[Published],
    letters: &[DeadLetter],
    services: &[Service],
) -> FuzzOutcome {
    let mut letters_of: HashMap<(&str, u64, &str), usize> = HashMap::new();
    for letter in letters {
        *letters_of
            .entry((
                letter.stream.as_str(),
                letter.stream_sequence,
                letter.consumer.as_str(),
            ))
            .or_insert(0) += 1;
    }
    let consumers: Vec<_> = services
        .iter()
        .flat_map(|service| service.consumers())
        .collect();
    let mut outcome = FuzzOutcome {
        published: published.len(),
        ..FuzzOutcome::default()
    };
    for message in published {
        let kind = outcome.by_kind.entry(message.kind).or_insert((0, 0));
        kind.0 += 1;
        for spec in consumers.iter().filter(|spec| {
            spec.stream.name == message.stream
                && (spec.filter_subjects.is_empty()
                    || spec
                        .filter_subjects
                        .iter()
                        .any(|filter| subject_matches(filter, &message.subject)))
        }) {
            outcome.expected += 1;
            let count = letters_of
                .get(&(
                    message.stream.as_str(),
                    message.sequence,
                    spec.durable.as_str(),
                ))
                .copied()
                .unwrap_or(0);
            kind.1 += count;
            match count {
                0 if message.envelope_level => outcome.missing += 1,
                0 => {}
                1 => outcome.dead_lettered += 1,
                _ => {
                    outcome.dead_lettered += 1;
                    outcome.duplicated += 1;
                }
            }
        }
    }
    outcome
}

/// Whether some consumer of `services` takes messages on `subject`.
pub fn consumed_by(subject: &str, services: &[Service]) -> bool {
    services
        .iter()
        .flat_map(|service| service.consumers())
        .any(|spec| {
            spec.stream
                .subjects()
                .iter()
                .any(|filter| subject_matches(filter, subject))
                && (spec.filter_subjects.is_empty()
                    || spec
                        .filter_subjects
                        .iter()
                        .any(|filter| subject_matches(filter, subject)))
        })
}

/// NATS subject matching: `*` is one token, a final `>` one or more.
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for token in filter.split('.') {
        match (token, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (literal, Some(actual)) if literal == actual => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_as_nats_matches_them() {
        assert!(subject_matches("a.*.c", "a.b.c"));
        assert!(subject_matches("a.>", "a.b.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(!subject_matches("a.*", "a.b.c"));
        assert!(!subject_matches("a.b", "a.c"));
        assert!(subject_matches("a.b", "a.b"));
    }
}
