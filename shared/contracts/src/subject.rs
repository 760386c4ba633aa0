//! Subject names. Every subject Trainyard publishes or consumes is built here.
//!
//! Per-entity subjects end in `<namespace>.<name>` so consumers can filter by job.
//! Streams that need per-job order rewrite them on ingest to carry a partition
//! token (see [`crate::streams`]), computed by the NATS server itself, so
//! external publishers never need to know the partitioning.

use crate::envelope::EntityRef;

/// Prefix of every Trainyard subject.
pub const ROOT: &str = "trainyard";

/// Number of partitions per-job subjects are spread over once stored.
/// Changing it reshuffles jobs between replicas, so it is part of the contract.
pub const PARTITIONS: u32 = 16;

/// Namespace token used for cluster-scoped objects (Nodes, TrainingQueues).
/// Kubernetes namespaces cannot contain `_`, so it never collides.
pub const CLUSTER_SCOPE: &str = "_";

/// Encodes a Kubernetes name as one subject token.
///
/// Names may contain `.`, which separates NATS tokens; `_` never appears in a
/// Kubernetes name, so replacing one with the other is reversible.
pub fn token(name: &str) -> String {
    name.replace('.', "_")
}

/// Reverses [`token`].
pub fn untoken(token: &str) -> String {
    token.replace('_', ".")
}

fn namespace_token(entity: &EntityRef) -> String {
    if entity.namespace.is_empty() {
        CLUSTER_SCOPE.to_string()
    } else {
        token(&entity.namespace)
    }
}

/// `trainyard.<family>.<kind>.<namespace>.<name>`: the subject a message is published on.
pub fn entity_subject(family: Family, kind: &str, entity: &EntityRef) -> String {
    format!(
        "{ROOT}.{}.{kind}.{}.{}",
        family.as_str(),
        namespace_token(entity),
        token(&entity.name)
    )
}

/// Filter matching every message of one kind in a family (all partitions).
pub fn kind_filter(family: Family, kind: &str) -> String {
    format!("{ROOT}.{}.{kind}.>", family.as_str())
}

/// Filter matching every message of a family.
pub fn family_filter(family: Family) -> String {
    format!("{ROOT}.{}.>", family.as_str())
}

/// Dead-letter subject for messages a consumer gave up on.
pub fn dead_letter(stream: &str, consumer: &str) -> String {
    format!(
        "{ROOT}.{}.{}.{}",
        Family::DeadLetter.as_str(),
        token(stream),
        token(consumer)
    )
}

/// Filter matching the dead letters of one stream, one consumer, both, or all.
pub fn dead_letter_filter(stream: Option<&str>, consumer: Option<&str>) -> String {
    format!(
        "{ROOT}.{}.{}.{}",
        Family::DeadLetter.as_str(),
        stream.map(token).unwrap_or_else(|| "*".to_string()),
        consumer.map(token).unwrap_or_else(|| "*".to_string())
    )
}

/// The subject a message was published on, from the subject it was stored
/// under: the partition token a partitioned stream inserted is removed, so a
/// message published again is partitioned by the server as the first time.
pub fn published(stored: &str) -> String {
    let tokens: Vec<&str> = stored.split('.').collect();
    match tokens.as_slice() {
        [root, family, kind, partition, ns, name]
            if *root == ROOT && partition.parse::<u32>().is_ok() =>
        {
            format!("{root}.{family}.{kind}.{ns}.{name}")
        }
        _ => stored.to_string(),
    }
}

/// The families of subjects; each is stored in its own stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Kubernetes change events published by the watcher.
    Events,
    /// Decisions of the gpu-allocator, hpo-tuner, checkpoint-manager and cost-optimizer.
    Decisions,
    /// Progress and checkpoint reports from training workers.
    Worker,
    /// Commands to running training (checkpoint now, stop).
    Commands,
    /// Alerts for people.
    Alerts,
    /// Job submissions by external systems.
    Submit,
    /// Lifecycle transitions of TrainingJobs, published by the planner.
    Lifecycle,
    /// Messages no consumer could handle, with the reason.
    DeadLetter,
}

impl Family {
    pub const ALL: [Family; 8] = [
        Family::Events,
        Family::Decisions,
        Family::Worker,
        Family::Commands,
        Family::Alerts,
        Family::Submit,
        Family::Lifecycle,
        Family::DeadLetter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Events => "events",
            Family::Decisions => "decisions",
            Family::Worker => "worker",
            Family::Commands => "commands",
            Family::Alerts => "alerts",
            Family::Submit => "submit",
            Family::Lifecycle => "lifecycle",
            Family::DeadLetter => "deadletter",
        }
    }
}

/// The parts of a per-entity subject, as stored (with partition) or as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubject {
    pub family: String,
    pub kind: String,
    pub partition: Option<u32>,
    pub namespace: Option<String>,
    pub name: String,
}

/// Splits a per-entity subject back into its parts. Returns `None` for subjects
/// that are not per-entity (dead letters) or not Trainyard's.
pub fn parse(subject: &str) -> Option<ParsedSubject> {
    let tokens: Vec<&str> = subject.split('.').collect();
    let (family, kind, partition, ns, name) = match tokens.as_slice() {
        [root, family, kind, ns, name] if *root == ROOT => (*family, *kind, None, *ns, *name),
        [root, family, kind, partition, ns, name] if *root == ROOT => {
            (*family, *kind, Some(partition.parse().ok()?), *ns, *name)
        }
        _ => return None,
    };
    Some(ParsedSubject {
        family: family.to_string(),
        kind: kind.to_string(),
        partition,
        namespace: (ns != CLUSTER_SCOPE).then(|| untoken(ns)),
        name: untoken(name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(ns: &str, name: &str) -> EntityRef {
        EntityRef::new(ns, name, "")
    }

    #[test]
    fn names_with_dots_round_trip_through_one_token() {
        let subject = entity_subject(Family::Events, "trainingjob", &job("ml", "bert.v2"));
        assert_eq!(subject, "trainyard.events.trainingjob.ml.bert_v2");
        let parsed = parse(&subject).expect("parses");
        assert_eq!(parsed.name, "bert.v2");
        assert_eq!(parsed.namespace.as_deref(), Some("ml"));
        assert_eq!(parsed.partition, None);
    }

    #[test]
    fn cluster_scoped_objects_use_the_cluster_token() {
        let subject = entity_subject(Family::Events, "node", &job("", "gpu-1"));
        assert_eq!(subject, "trainyard.events.node._.gpu-1");
        assert_eq!(parse(&subject).expect("parses").namespace, None);
    }

    #[test]
    fn stored_subjects_carry_the_partition() {
        let parsed = parse("trainyard.events.pod.7.ml.bert").expect("parses");
        assert_eq!(parsed.partition, Some(7));
        assert_eq!(parsed.kind, "pod");
        assert!(parse("trainyard.events.pod.x.ml.bert").is_none());
        assert!(parse("other.events.pod.ml.bert").is_none());
    }

    #[test]
    fn the_published_subject_drops_the_partition_token() {
        assert_eq!(
            published("trainyard.events.pod.7.ml.bert_v2"),
            "trainyard.events.pod.ml.bert_v2"
        );
        assert_eq!(
            published("trainyard.alerts.job.ml.bert"),
            "trainyard.alerts.job.ml.bert"
        );
        assert_eq!(
            published("trainyard.deadletter.TRAINYARD_EVENTS.planner-events"),
            "trainyard.deadletter.TRAINYARD_EVENTS.planner-events"
        );
    }

    #[test]
    fn dead_letter_filters_narrow_by_stream_and_consumer() {
        assert_eq!(dead_letter_filter(None, None), "trainyard.deadletter.*.*");
        assert_eq!(
            dead_letter_filter(Some("TRAINYARD_WORKER"), None),
            "trainyard.deadletter.TRAINYARD_WORKER.*"
        );
        assert_eq!(
            dead_letter_filter(None, Some("planner-events")),
            "trainyard.deadletter.*.planner-events"
        );
        assert!(
            dead_letter_filter(Some("TRAINYARD_WORKER"), Some("hpo-tuner-worker"))
                == dead_letter("TRAINYARD_WORKER", "hpo-tuner-worker")
        );
    }
}
