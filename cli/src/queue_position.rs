//! Where a waiting TrainingJob stands in its queue.
//!
//! The planner has no status field for it: the position travels in the message of the
//! job's `Admitted` condition, written as `position N in queue Q: <why>` (see the
//! planner's `waiting_condition`). Parsing that text is the only way to show it.

use trainyard_api::{ConditionStatus, TrainingJob, find_condition};

/// Condition whose message carries the queue position while a job waits.
pub const ADMITTED_CONDITION: &str = "Admitted";

/// A job's place in a TrainingQueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePosition {
    /// 1-based position.
    pub position: u32,
    /// TrainingQueue name.
    pub queue: String,
}

/// Finds `position N in queue Q` anywhere in `message`.
///
/// The queue name ends at the first character a queue name cannot contain (queue
/// names are DNS subdomains), so the `:` and the explanation after it are dropped,
/// as is a full stop closing a sentence.
pub fn parse_queue_position(message: &str) -> Option<QueuePosition> {
    const PREFIX: &str = "position ";
    const MIDDLE: &str = " in queue ";
    let mut rest = message;
    while let Some(start) = rest.find(PREFIX) {
        let after_prefix = &rest[start + PREFIX.len()..];
        let digits_end = after_prefix
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after_prefix.len());
        let parsed = after_prefix[..digits_end]
            .parse::<u32>()
            .ok()
            .and_then(|position| {
                let queue_text = after_prefix[digits_end..].strip_prefix(MIDDLE)?;
                let queue_end = queue_text
                    .find(|c: char| {
                        !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                    })
                    .unwrap_or(queue_text.len());
                let queue = queue_text[..queue_end].trim_end_matches('.');
                (!queue.is_empty()).then(|| QueuePosition {
                    position,
                    queue: queue.to_owned(),
                })
            });
        if parsed.is_some() {
            return parsed;
        }
        rest = after_prefix;
    }
    None
}

/// The position of a job that is waiting for admission, if its status tells it.
///
/// Only an `Admitted` condition that is not True counts: once a job is admitted the
/// old waiting message is history.
pub fn waiting_position(job: &TrainingJob) -> Option<QueuePosition> {
    let status = job.status.as_ref()?;
    let admitted = find_condition(&status.conditions, ADMITTED_CONDITION)?;
    if admitted.status == ConditionStatus::True {
        return None;
    }
    admitted.message.as_deref().and_then(parse_queue_position)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::{Condition, TrainingJobSpec, TrainingJobStatus};

    fn at(position: u32, queue: &str) -> Option<QueuePosition> {
        Some(QueuePosition {
            position,
            queue: queue.to_owned(),
        })
    }

    #[test]
    fn parses_the_planner_message() {
        assert_eq!(
            parse_queue_position(
                "position 3 in queue team-a: queue team-a flavor a100-spot: 30 of 32 GPUs in use, needs 2 more; position 3"
            ),
            at(3, "team-a")
        );
        assert_eq!(
            parse_queue_position("position 12 in queue default"),
            at(12, "default")
        );
        assert_eq!(
            parse_queue_position("now at position 1 in queue research.gpu."),
            at(1, "research.gpu")
        );
    }

    #[test]
    fn skips_mentions_that_are_not_a_position() {
        assert_eq!(
            parse_queue_position("position unknown; position 2 in queue q: waiting"),
            at(2, "q")
        );
        for text in [
            "",
            "waiting for queue default to admit 4 GPUs (2 workers × 2)",
            "position  in queue q",
            "position 3 in queue ",
            "position 3 in queue: x",
            "position 99999999999 in queue q",
            "position 3 of queue q",
        ] {
            assert_eq!(parse_queue_position(text), None, "{text}");
        }
    }

    fn job_with(conditions: Vec<Condition>) -> TrainingJob {
        let mut job = TrainingJob::new("j", TrainingJobSpec::default());
        job.status = Some(TrainingJobStatus {
            conditions,
            ..TrainingJobStatus::default()
        });
        job
    }

    #[test]
    fn reads_the_admitted_condition_only_while_waiting() {
        let waiting = Condition::new(
            ADMITTED_CONDITION,
            ConditionStatus::False,
            "WaitingForQuota",
            "position 2 in queue default: 8 of 8 GPUs in use",
        );
        assert_eq!(
            waiting_position(&job_with(vec![waiting.clone()])),
            at(2, "default")
        );

        let mut admitted = waiting;
        admitted.status = ConditionStatus::True;
        assert_eq!(waiting_position(&job_with(vec![admitted])), None);

        let other = Condition::new(
            "Running",
            ConditionStatus::False,
            "Queued",
            "position 2 in queue default: x",
        );
        assert_eq!(waiting_position(&job_with(vec![other])), None);
        assert_eq!(
            waiting_position(&TrainingJob::new("j", TrainingJobSpec::default())),
            None
        );
    }
}
