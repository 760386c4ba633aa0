//! JetStream streams, durable consumers and key-value buckets: what exists, who reads what.

use crate::subject::{Family, PARTITIONS, ROOT, family_filter, kind_filter};

/// A stream: one per subject family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSpec {
    pub name: &'static str,
    pub family: Family,
    pub description: &'static str,
    /// Per-job subjects are rewritten on ingest to carry a partition token.
    pub partitioned: bool,
    /// Byte limit unless the runtime configuration sets another
    /// (`nats.stream_max_bytes.<family>`).
    pub default_max_bytes: i64,
    /// What the stream does with a message once it holds its byte limit.
    pub discard: Discard,
}

/// What a full stream gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// The oldest messages make room for the new one: for reports whose newer
    /// copies supersede the old ones.
    Old,
    /// The new message is refused and its publisher gets an error (and
    /// retries): for messages no one may lose.
    New,
}

impl Discard {
    pub fn as_str(self) -> &'static str {
        match self {
            Discard::Old => "old",
            Discard::New => "new",
        }
    }
}

const MIB: i64 = 1024 * 1024;
const GIB: i64 = 1024 * MIB;

impl StreamSpec {
    pub fn subjects(&self) -> Vec<String> {
        vec![family_filter(self.family)]
    }

    /// Subject transform `(source, destination)` that inserts the partition token
    /// after the kind: `trainyard.events.pod.ml.bert` → `trainyard.events.pod.7.ml.bert`.
    /// The NATS server computes the partition from namespace and name.
    pub fn partition_transform(&self) -> Option<(String, String)> {
        self.partitioned.then(|| {
            let family = self.family.as_str();
            (
                format!("{ROOT}.{family}.*.*.*"),
                format!(
                    "{ROOT}.{family}.{{{{wildcard(1)}}}}.{{{{partition({PARTITIONS},2,3)}}}}.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}"
                ),
            )
        })
    }
}

pub const EVENTS: StreamSpec = StreamSpec {
    name: "TRAINYARD_EVENTS",
    family: Family::Events,
    description: "Kubernetes change events published by the watcher",
    partitioned: true,
    default_max_bytes: 2 * GIB,
    discard: Discard::New,
};
pub const DECISIONS: StreamSpec = StreamSpec {
    name: "TRAINYARD_DECISIONS",
    family: Family::Decisions,
    description: "Admission, trial, checkpoint and cost decisions",
    partitioned: true,
    default_max_bytes: GIB,
    discard: Discard::New,
};
pub const WORKER: StreamSpec = StreamSpec {
    name: "TRAINYARD_WORKER",
    family: Family::Worker,
    description: "Progress and checkpoint reports from training workers",
    partitioned: true,
    default_max_bytes: 2 * GIB,
    discard: Discard::Old,
};
pub const COMMANDS: StreamSpec = StreamSpec {
    name: "TRAINYARD_COMMANDS",
    family: Family::Commands,
    description: "Commands to running training: checkpoint now, checkpoint interval, stop",
    partitioned: true,
    default_max_bytes: 64 * MIB,
    discard: Discard::New,
};
pub const ALERTS: StreamSpec = StreamSpec {
    name: "TRAINYARD_ALERTS",
    family: Family::Alerts,
    description: "Alerts for people, delivered by the notifier",
    partitioned: false,
    default_max_bytes: 256 * MIB,
    discard: Discard::New,
};
pub const SUBMIT: StreamSpec = StreamSpec {
    name: "TRAINYARD_SUBMIT",
    family: Family::Submit,
    description: "TrainingJob submissions from external systems",
    partitioned: true,
    default_max_bytes: 256 * MIB,
    discard: Discard::New,
};
pub const LIFECYCLE: StreamSpec = StreamSpec {
    name: "TRAINYARD_LIFECYCLE",
    family: Family::Lifecycle,
    description: "TrainingJob lifecycle transitions published by the planner",
    partitioned: true,
    default_max_bytes: GIB,
    discard: Discard::New,
};
pub const DEAD_LETTER: StreamSpec = StreamSpec {
    name: "TRAINYARD_DEADLETTER",
    family: Family::DeadLetter,
    description: "Messages a consumer gave up on, with the reason",
    partitioned: false,
    default_max_bytes: GIB,
    discard: Discard::New,
};

/// Every stream. Each service provisions all of them at start-up (idempotently), so
/// services can start in any order.
pub const ALL: [StreamSpec; 8] = [
    EVENTS,
    DECISIONS,
    WORKER,
    COMMANDS,
    ALERTS,
    SUBMIT,
    LIFECYCLE,
    DEAD_LETTER,
];

/// The seven services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    Watcher,
    Planner,
    GpuAllocator,
    HpoTuner,
    CheckpointManager,
    CostOptimizer,
    Notifier,
}

impl Service {
    pub const ALL: [Service; 7] = [
        Service::Watcher,
        Service::Planner,
        Service::GpuAllocator,
        Service::HpoTuner,
        Service::CheckpointManager,
        Service::CostOptimizer,
        Service::Notifier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::Watcher => "watcher",
            Service::Planner => "planner",
            Service::GpuAllocator => "gpu-allocator",
            Service::HpoTuner => "hpo-tuner",
            Service::CheckpointManager => "checkpoint-manager",
            Service::CostOptimizer => "cost-optimizer",
            Service::Notifier => "notifier",
        }
    }

    /// The durable pull consumers this service reads from.
    pub fn consumers(self) -> Vec<ConsumerSpec> {
        let events = |kinds: &[&str]| {
            kinds
                .iter()
                .map(|k| kind_filter(Family::Events, k))
                .collect()
        };
        match self {
            Service::Watcher => vec![],
            Service::Planner => vec![
                // TrainingJob changes (what users ask for) have their own consumer,
                // so a new job is not queued behind its running neighbours' Job
                // and Pod observations.
                ConsumerSpec::part(self, EVENTS, "trainingjob", events(&["trainingjob"])),
                ConsumerSpec::new(self, EVENTS, events(&["job", "pod", "jobevent"])),
                ConsumerSpec::new(self, DECISIONS, vec![family_filter(Family::Decisions)]),
                ConsumerSpec::new(self, WORKER, vec![family_filter(Family::Worker)]),
                // Submissions only: the planner's own results share the stream.
                ConsumerSpec::new(
                    self,
                    SUBMIT,
                    vec![kind_filter(Family::Submit, "trainingjob")],
                ),
            ],
            Service::GpuAllocator => vec![
                ConsumerSpec::new(
                    self,
                    EVENTS,
                    events(&["trainingjob", "trainingqueue", "node"]),
                ),
                ConsumerSpec::new(self, LIFECYCLE, vec![family_filter(Family::Lifecycle)]),
                ConsumerSpec::new(
                    self,
                    DECISIONS,
                    vec![
                        kind_filter(Family::Decisions, "capacity"),
                        kind_filter(Family::Decisions, "budget"),
                    ],
                ),
            ],
            Service::HpoTuner => vec![
                ConsumerSpec::new(self, EVENTS, events(&["sweep"])),
                ConsumerSpec::new(self, WORKER, vec![kind_filter(Family::Worker, "progress")]),
                ConsumerSpec::new(self, LIFECYCLE, vec![family_filter(Family::Lifecycle)]),
            ],
            Service::CheckpointManager => vec![
                ConsumerSpec::new(self, EVENTS, events(&["trainingjob"])),
                ConsumerSpec::new(
                    self,
                    WORKER,
                    vec![kind_filter(Family::Worker, "checkpoint")],
                ),
                ConsumerSpec::new(self, LIFECYCLE, vec![family_filter(Family::Lifecycle)]),
                // A finished Sweep's best trial is registered as its model.
                ConsumerSpec::new(
                    self,
                    DECISIONS,
                    vec![kind_filter(Family::Decisions, "sweep")],
                ),
            ],
            Service::CostOptimizer => vec![
                ConsumerSpec::new(
                    self,
                    EVENTS,
                    events(&["trainingjob", "trainingqueue", "node"]),
                ),
                ConsumerSpec::new(self, LIFECYCLE, vec![family_filter(Family::Lifecycle)]),
                ConsumerSpec::new(
                    self,
                    DECISIONS,
                    vec![kind_filter(Family::Decisions, "admission")],
                ),
                ConsumerSpec::new(
                    self,
                    WORKER,
                    vec![
                        kind_filter(Family::Worker, "utilization"),
                        kind_filter(Family::Worker, "checkpoint"),
                    ],
                ),
            ],
            Service::Notifier => vec![
                ConsumerSpec::new(self, ALERTS, vec![family_filter(Family::Alerts)]),
                ConsumerSpec::new(self, LIFECYCLE, vec![family_filter(Family::Lifecycle)]),
                ConsumerSpec::new(
                    self,
                    DECISIONS,
                    vec![
                        kind_filter(Family::Decisions, "sweep"),
                        kind_filter(Family::Decisions, "budget"),
                        // How long a queued job waits, and why.
                        kind_filter(Family::Decisions, "pending"),
                        kind_filter(Family::Decisions, "admission"),
                    ],
                ),
            ],
        }
    }

    /// Key-value buckets this service keeps state in.
    pub fn buckets(self) -> Vec<Bucket> {
        match self {
            Service::Watcher => vec![],
            Service::Notifier => vec![
                Bucket::NotifierOutbox,
                Bucket::Notifications,
                Bucket::NotifierPace,
            ],
            Service::Planner => vec![Bucket::Planner, Bucket::Leases],
            Service::GpuAllocator => vec![Bucket::Allocator, Bucket::Leases],
            Service::HpoTuner => vec![Bucket::Tuner],
            Service::CheckpointManager => vec![Bucket::Checkpoints, Bucket::Leases],
            Service::CostOptimizer => vec![Bucket::Cost, Bucket::Leases],
        }
    }
}

impl Service {
    /// The key of the lease in [`Bucket::Leases`] that picks this service's one
    /// active replica, for services whose decisions need one view of the world;
    /// None for services whose replicas share the work.
    pub fn lease_key(self) -> Option<&'static str> {
        match self {
            Service::Planner
            | Service::GpuAllocator
            | Service::CheckpointManager
            | Service::CostOptimizer => Some(self.name()),
            Service::Watcher | Service::HpoTuner | Service::Notifier => None,
        }
    }
}

/// A durable pull consumer: `<service>-<stream family>`, shared by a service's replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    pub durable: String,
    pub stream: StreamSpec,
    pub filter_subjects: Vec<String>,
}

impl ConsumerSpec {
    fn new(service: Service, stream: StreamSpec, filter_subjects: Vec<String>) -> Self {
        Self {
            durable: format!("{}-{}", service.name(), stream.family.as_str()),
            stream,
            filter_subjects,
        }
    }

    /// `<service>-<stream family>-<part>`: one of several consumers a service
    /// keeps on one stream.
    fn part(
        service: Service,
        stream: StreamSpec,
        part: &str,
        filter_subjects: Vec<String>,
    ) -> Self {
        let mut spec = Self::new(service, stream, filter_subjects);
        spec.durable = format!("{}-{part}", spec.durable);
        spec
    }
}

/// Key-value buckets for state a service must rebuild after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Planner: per-job attempt, applied generation and backoff state.
    Planner,
    /// gpu-allocator: inventory and admissions snapshot.
    Allocator,
    /// hpo-tuner: sweep state (observations, rungs, trial ids).
    Tuner,
    /// checkpoint-manager: checkpoint catalogue per job.
    Checkpoints,
    /// cost-optimizer: spend per job and budget.
    Cost,
    /// Leases that pick the active replica of the planner and the
    /// gpu-allocator; an entry not renewed expires after [`LEASE_TTL`].
    Leases,
    /// notifier: each routed event per destination until it is delivered, the
    /// replicas' heartbeats, and each queued job's wait for admission.
    NotifierOutbox,
    /// notifier: delivery status per notification
    /// ([`crate::notifications::DeliveryStatus`]).
    Notifications,
    /// notifier: per Slack channel and webhook endpoint, the earliest instant
    /// the next message may go and the end of the last 429's `Retry-After`,
    /// shared by the replicas.
    NotifierPace,
}

/// How long a lease outlives its last renewal: a standby takes over within
/// this plus its polling interval after the active replica dies.
pub const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(6);

impl Bucket {
    pub fn name(self) -> &'static str {
        match self {
            Bucket::Planner => "trainyard_planner",
            Bucket::Allocator => "trainyard_allocator",
            Bucket::Tuner => "trainyard_tuner",
            Bucket::Checkpoints => "trainyard_checkpoints",
            Bucket::Cost => "trainyard_cost",
            Bucket::Leases => "trainyard_leases",
            Bucket::NotifierOutbox => "trainyard_notifier_outbox",
            Bucket::Notifications => "trainyard_notifications",
            Bucket::NotifierPace => "trainyard_notifier_pace",
        }
    }

    /// How long an entry lives after its last write; `None` keeps it until deleted.
    pub fn max_age(self) -> Option<std::time::Duration> {
        match self {
            Bucket::Leases => Some(LEASE_TTL),
            // Long enough that a redelivered message finds its event already
            // delivered; short enough to stay small.
            Bucket::NotifierOutbox => Some(std::time::Duration::from_secs(24 * 3600)),
            Bucket::Notifications => Some(std::time::Duration::from_secs(7 * 24 * 3600)),
            // A pace older than a day lies in the past: its key may go.
            Bucket::NotifierPace => Some(std::time::Duration::from_secs(24 * 3600)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_names_are_unique() {
        let mut names: Vec<String> = Service::ALL
            .iter()
            .flat_map(|s| s.consumers())
            .map(|c| c.durable)
            .collect();
        let before = names.len();
        names.sort();
        names.dedup();
        assert_eq!(before, names.len());
    }

    #[test]
    fn consumer_filters_stay_inside_their_stream() {
        for service in Service::ALL {
            for consumer in service.consumers() {
                let prefix = format!("{ROOT}.{}.", consumer.stream.family.as_str());
                for filter in &consumer.filter_subjects {
                    assert!(
                        filter.starts_with(&prefix),
                        "{filter} outside {}",
                        consumer.stream.name
                    );
                }
            }
        }
    }

    #[test]
    fn only_worker_reports_may_be_discarded_when_a_stream_is_full() {
        for stream in ALL {
            let expected = if stream.name == WORKER.name {
                Discard::Old
            } else {
                Discard::New
            };
            assert_eq!(stream.discard, expected, "{}", stream.name);
            assert!(stream.default_max_bytes >= 64 * MIB, "{}", stream.name);
        }
    }

    #[test]
    fn partition_transform_uses_nats_mapping_functions() {
        let (source, dest) = EVENTS
            .partition_transform()
            .expect("events are partitioned");
        assert_eq!(source, "trainyard.events.*.*.*");
        assert_eq!(
            dest,
            "trainyard.events.{{wildcard(1)}}.{{partition(16,2,3)}}.{{wildcard(2)}}.{{wildcard(3)}}"
        );
        assert!(ALERTS.partition_transform().is_none());
    }
}
