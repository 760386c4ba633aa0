//! What the cost-optimizer knows, and what each message or accounting run
//! makes it publish. No I/O: the service feeds it messages and the time, and
//! publishes the [`Outgoing`] messages it returns. Saved in the
//! `trainyard_cost` bucket as [`Record`]s, one value per job, node and queue
//! and one for the rest; a save writes the values changed since the last.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use cost_optimizer_core::budget::{Budget, BudgetEvent, BudgetPeriod, BudgetTracker, LimitAction};
use cost_optimizer_core::catalog::{CapacityKind, PriceCatalog, PriceKey};
use cost_optimizer_core::dcgm::WorkerPod;
use cost_optimizer_core::decision::{
    Choice, DecisionInputs, RuntimeHistory, RuntimeSource, decide,
};
use cost_optimizer_core::idle::{IdleAction, IdleDetector, IdlePolicy, WorkerPhase};
use cost_optimizer_core::interruption::{InterruptionModel, PoolKey};
use cost_optimizer_core::{Holding, Ledger, LedgerTotals, PricedNode, Running};
use serde::{Deserialize, Serialize};
use trainyard_api::{CapacityType as SpecCapacity, TrainingJob, TrainingQueue};
use trainyard_contracts::EntityRef;
use trainyard_contracts::alerts::{BudgetThresholdCrossed, GpusIdle, Severity};
use trainyard_contracts::cost::{
    BudgetState, BudgetStatusReported, CapacityChosen, CapacityInputs, CapacityType, CostLine,
    CostRecorded, IdleSuspendRequested, UtilizationReported, WorkerPhase as WirePhase,
};
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::events::{Change, NodeObserved};
use trainyard_contracts::object_key;

use crate::config::{CostConfig, UtilizationSource};

/// How an idle alert says the queue's policy suspends the job next.
const SUSPEND_NEXT: &str = "; checkpointing and suspending it";

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing {
    Capacity(EntityRef, CapacityChosen),
    Cost(EntityRef, CostRecorded),
    Budget(EntityRef, BudgetStatusReported),
    BudgetAlert(EntityRef, BudgetThresholdCrossed),
    Idle(EntityRef, GpusIdle),
    IdleSuspend(EntityRef, IdleSuspendRequested),
}

/// A node's place, price key and GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub key: PriceKey,
    pub pool: PoolKey,
    pub gpus: u32,
    pub ready: bool,
}

/// What a TrainingJob asks for and how it went so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFacts {
    pub entity: EntityRef,
    pub model: String,
    pub queue: String,
    pub gpus: u32,
    pub workers: u32,
    pub any_capacity: bool,
    pub runtime_seconds: Option<u64>,
    pub deadline: Option<DateTime<Utc>>,
    pub checkpoints: bool,
    pub product: Option<String>,
    pub chosen: Option<CapacityType>,
    pub spot_interruptions: u32,
    /// Hours trained up to `trained_to` (or so far, when not training).
    pub trained_hours: f64,
    /// While the job holds GPUs: the accrual time `trained_hours` counts up
    /// to; the hours since are trained too. Counting from a fixed time keeps
    /// the job's saved value unchanged while it trains.
    #[serde(default)]
    pub trained_to: Option<DateTime<Utc>>,
    /// `trained_hours` at the last checkpoint: what a lost node leaves of
    /// the training (nothing without checkpoints).
    #[serde(default)]
    pub checkpointed_hours: f64,
    pub last_checkpoint: Option<DateTime<Utc>>,
    pub checkpoint_gaps_seconds: Vec<f64>,
    pub attempt: u32,
    pub utilization: BTreeMap<u32, (f64, WorkerPhase)>,
    pub idle: IdleDetector,
    pub suspend_requested: bool,
    /// With utilisation from DCGM: every worker of the running attempt was
    /// sampled for this accounting run.
    #[serde(default)]
    pub activity_sampled: bool,
}

/// A queue's budget and idle policy, and its spend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueFacts {
    pub budget: Option<Budget>,
    pub idle: IdlePolicy,
    pub tracker: BudgetTracker,
    pub state: Option<BudgetState>,
}

impl JobFacts {
    /// Hours trained up to the accrual time `now`.
    pub fn trained_hours_at(&self, now: Option<DateTime<Utc>>) -> f64 {
        match (self.trained_to, now) {
            (Some(from), Some(now)) if now > from => {
                self.trained_hours + (now - from).num_milliseconds() as f64 / 3_600_000.0
            }
            _ => self.trained_hours,
        }
    }
}

/// One saved value. Each job, node and queue has its own, so no value grows
/// with the number of jobs (a NATS message, and so a KV value, is limited to
/// 1 MiB by default); [`Record::Cluster`] holds the rest.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "records only pass through, on their way to or from JSON"
)]
pub enum Record<'a> {
    /// A job: what it asks for, the GPUs it holds, its cost so far (each
    /// present from the first message that tells of it until it is
    /// finalized).
    Job {
        key: Cow<'a, str>,
        facts: Option<Cow<'a, JobFacts>>,
        running: Option<Cow<'a, Running>>,
        accrued: Option<f64>,
    },
    Node {
        name: Cow<'a, str>,
        facts: Cow<'a, NodeFacts>,
    },
    Queue {
        name: Cow<'a, str>,
        facts: Cow<'a, QueueFacts>,
    },
    /// Pools' interruptions, runtimes by model, the accrual clock, totals.
    Cluster {
        interruptions: Cow<'a, InterruptionModel>,
        history: Cow<'a, RuntimeHistory>,
        last_accrual: Option<DateTime<Utc>>,
        unbudgeted: Cow<'a, BTreeMap<String, f64>>,
        ledger: LedgerTotals,
    },
}

/// The part of a bucket key naming an object: characters outside
/// `[A-Za-z0-9_/-]` as `=XX` per UTF-8 byte (so `.` too: a key is always two
/// tokens), and `=` for an empty name. Never decoded: each value names its
/// object.
fn key_part(name: &str) -> String {
    if name.is_empty() {
        return "=".into();
    }
    let mut part = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'/' | b'-') {
            part.push(char::from(byte));
        } else {
            part.push_str(&format!("={byte:02X}"));
        }
    }
    part
}

fn job_value_key(key: &str) -> String {
    format!("job.{}", key_part(key))
}

fn node_value_key(name: &str) -> String {
    format!("node.{}", key_part(name))
}

fn queue_value_key(name: &str) -> String {
    format!("queue.{}", key_part(name))
}

const CLUSTER_KEY: &str = "cluster";

impl Record<'_> {
    /// Its key in the bucket: `job.<namespace>/<name>`, `node.<name>`,
    /// `queue.<name>` or `cluster`.
    pub fn key(&self) -> String {
        match self {
            Record::Job { key, .. } => job_value_key(key),
            Record::Node { name, .. } => node_value_key(name),
            Record::Queue { name, .. } => queue_value_key(name),
            Record::Cluster { .. } => CLUSTER_KEY.into(),
        }
    }
}

/// A value to save under its key, or None: the key is to go.
pub type ChangedValue = (String, Option<Vec<u8>>);

/// What changed since the last [`CostState::take_changed_values`]: the values to
/// write again (the cluster's always is).
#[derive(Debug, Clone, Default)]
struct Changed {
    jobs: BTreeSet<String>,
    every_job: bool,
    nodes: BTreeSet<String>,
    queues: BTreeSet<String>,
}

/// The state. Deserialised whole only from the single value earlier
/// releases saved (see `store`); saved as [`Record`]s.
#[derive(Debug, Clone, Deserialize)]
pub struct CostState {
    #[serde(skip)]
    catalog: Option<PriceCatalog>,
    config: CostConfig,
    nodes: BTreeMap<String, NodeFacts>,
    jobs: BTreeMap<String, JobFacts>,
    queues: BTreeMap<String, QueueFacts>,
    ledger: Ledger,
    interruptions: InterruptionModel,
    history: RuntimeHistory,
    last_accrual: Option<DateTime<Utc>>,
    /// Spend per queue not yet added to its budget.
    #[serde(default)]
    unbudgeted: BTreeMap<String, f64>,
    #[serde(skip)]
    changed: Changed,
}

fn phase_of(phase: WirePhase) -> WorkerPhase {
    match phase {
        WirePhase::Starting => WorkerPhase::Starting,
        WirePhase::LoadingData => WorkerPhase::LoadingData,
        WirePhase::Training => WorkerPhase::Training,
        WirePhase::Checkpointing => WorkerPhase::Checkpointing,
    }
}

impl CostState {
    pub fn new(config: CostConfig) -> Self {
        CostState {
            catalog: None,
            config,
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            queues: BTreeMap::new(),
            ledger: Ledger::default(),
            interruptions: InterruptionModel::default(),
            history: RuntimeHistory::default(),
            last_accrual: None,
            unbudgeted: BTreeMap::new(),
            changed: Changed::default(),
        }
    }

    /// A state saved whole (by earlier releases), under the current
    /// configuration. Its running jobs count their training on from the
    /// last accrual.
    pub fn restore(mut saved: CostState, config: CostConfig) -> Self {
        saved.config = config;
        let keys: Vec<String> = saved.jobs.keys().cloned().collect();
        for key in keys {
            saved.settle_training(&key);
        }
        saved
    }

    /// The state saved as `records`, under the current configuration.
    pub fn from_records(
        records: impl IntoIterator<Item = Record<'static>>,
        config: CostConfig,
    ) -> Self {
        let mut state = CostState::new(config);
        for record in records {
            match record {
                Record::Job {
                    key,
                    facts,
                    running,
                    accrued,
                } => {
                    if let Some(running) = running {
                        state.ledger.start(&key, running.into_owned());
                    }
                    if let Some(accrued) = accrued {
                        state.ledger.set_job_total(&key, accrued);
                    }
                    if let Some(facts) = facts {
                        state.jobs.insert(key.into_owned(), facts.into_owned());
                    }
                }
                Record::Node { name, facts } => {
                    // The ledger prices the nodes that are ready (`on_node`).
                    if facts.ready {
                        state.ledger.set_node(
                            &name,
                            PricedNode {
                                key: facts.key.clone(),
                                gpus: facts.gpus,
                            },
                        );
                    }
                    state.nodes.insert(name.into_owned(), facts.into_owned());
                }
                Record::Queue { name, facts } => {
                    state.queues.insert(name.into_owned(), facts.into_owned());
                }
                Record::Cluster {
                    interruptions,
                    history,
                    last_accrual,
                    unbudgeted,
                    ledger,
                } => {
                    state.interruptions = interruptions.into_owned();
                    state.history = history.into_owned();
                    state.last_accrual = last_accrual;
                    state.unbudgeted = unbudgeted.into_owned();
                    state.ledger.set_totals(ledger);
                }
            }
        }
        state
    }

    fn job_record<'a>(&'a self, key: &'a str) -> Option<Record<'a>> {
        let facts = self.jobs.get(key);
        let running = self.ledger.running(key);
        let accrued = self.ledger.job_total_recorded(key);
        if facts.is_none() && running.is_none() && accrued.is_none() {
            return None;
        }
        Some(Record::Job {
            key: Cow::Borrowed(key),
            facts: facts.map(Cow::Borrowed),
            running: running.map(Cow::Borrowed),
            accrued,
        })
    }

    fn node_record<'a>(&'a self, name: &'a str) -> Option<Record<'a>> {
        let facts = self.nodes.get(name)?;
        Some(Record::Node {
            name: Cow::Borrowed(name),
            facts: Cow::Borrowed(facts),
        })
    }

    fn queue_record<'a>(&'a self, name: &'a str) -> Option<Record<'a>> {
        let facts = self.queues.get(name)?;
        Some(Record::Queue {
            name: Cow::Borrowed(name),
            facts: Cow::Borrowed(facts),
        })
    }

    fn cluster_record(&self) -> Record<'_> {
        Record::Cluster {
            interruptions: Cow::Borrowed(&self.interruptions),
            history: Cow::Borrowed(&self.history),
            last_accrual: self.last_accrual,
            unbudgeted: Cow::Borrowed(&self.unbudgeted),
            ledger: self.ledger.totals(),
        }
    }

    fn job_keys(&self) -> BTreeSet<String> {
        self.jobs
            .keys()
            .chain(self.ledger.jobs())
            .cloned()
            .collect()
    }

    /// Every value of the state, by key.
    pub fn values(&self) -> Result<BTreeMap<String, Vec<u8>>, serde_json::Error> {
        let records = self
            .job_keys()
            .iter()
            .filter_map(|k| self.job_record(k))
            .chain(self.nodes.keys().filter_map(|n| self.node_record(n)))
            .chain(self.queues.keys().filter_map(|n| self.queue_record(n)))
            .chain([self.cluster_record()])
            .map(|r| Ok((r.key(), serde_json::to_vec(&r)?)))
            .collect::<Result<BTreeMap<_, _>, serde_json::Error>>()?;
        Ok(records)
    }

    /// The values that may have changed since the last call, by key (None:
    /// the object is gone, its value may go), and forgets which they were.
    pub fn take_changed_values(&mut self) -> Result<Vec<ChangedValue>, serde_json::Error> {
        let changed = std::mem::take(&mut self.changed);
        let jobs = if changed.every_job {
            let mut all = self.job_keys();
            all.extend(changed.jobs);
            all
        } else {
            changed.jobs
        };
        let encode = |key: String, record: Option<Record<'_>>| {
            Ok((key, record.map(|r| serde_json::to_vec(&r)).transpose()?))
        };
        let mut out = Vec::with_capacity(jobs.len() + 1);
        for key in &jobs {
            out.push(encode(job_value_key(key), self.job_record(key))?);
        }
        for name in &changed.nodes {
            out.push(encode(node_value_key(name), self.node_record(name))?);
        }
        for name in &changed.queues {
            out.push(encode(queue_value_key(name), self.queue_record(name))?);
        }
        out.push(encode(CLUSTER_KEY.into(), Some(self.cluster_record()))?);
        Ok(out)
    }

    /// The job's value is to be saved again.
    fn touch(&mut self, key: &str) {
        self.changed.jobs.insert(key.to_string());
    }

    /// Folds the hours trained up to the last accrual into `trained_hours`
    /// and counts on from there while the job holds GPUs: called whenever
    /// its ledger entry starts or stops.
    fn settle_training(&mut self, key: &str) {
        let now = self.last_accrual;
        let running = self.ledger.running(key).is_some();
        if let Some(job) = self.jobs.get_mut(key) {
            job.trained_hours = job.trained_hours_at(now);
            job.trained_to = if running { now } else { None };
        }
    }

    pub fn set_catalog(&mut self, catalog: PriceCatalog) {
        self.catalog = Some(catalog);
    }

    pub fn catalog(&self) -> Option<&PriceCatalog> {
        self.catalog.as_ref()
    }

    pub fn job(&self, namespace: &str, name: &str) -> Option<&JobFacts> {
        self.jobs.get(&object_key(namespace, name))
    }

    fn currency(&self) -> String {
        self.catalog
            .as_ref()
            .map_or_else(|| "USD".to_string(), |c| c.currency().to_string())
    }

    fn capacity_of(&self, labels: &BTreeMap<String, String>) -> CapacityKind {
        let spot = self.config.capacity_type_labels.iter().any(|l| {
            labels
                .get(&l.label)
                .is_some_and(|v| l.spot_values.iter().any(|s| s.eq_ignore_ascii_case(v)))
        });
        if spot {
            CapacityKind::Spot
        } else {
            CapacityKind::OnDemand
        }
    }

    // ------------------------------------------------------------- nodes

    /// `node.observed`. A spot node that goes away or turns not-ready counts
    /// as a reclaim of its pool and an interruption of the jobs on it.
    pub fn on_node(&mut self, name: &str, node: &NodeObserved, at: DateTime<Utc>) -> Vec<Outgoing> {
        self.accrue_until(at);
        self.changed.nodes.insert(name.to_string());
        let before = self.nodes.get(name).cloned();
        let lost = node.change == Change::Deleted || !node.ready;
        if let Some(old) = &before
            && old.ready
            && lost
            && old.key.capacity == CapacityKind::Spot
        {
            self.interruptions.observe_reclaim(&old.pool);
        }
        let mut out = Vec::new();
        if lost && before.as_ref().is_some_and(|b| b.ready) {
            let hit: Vec<String> = self
                .jobs
                .keys()
                .filter(|k| {
                    self.ledger
                        .running(k)
                        .is_some_and(|r| r.holdings.iter().any(|h| h.node == name))
                })
                .cloned()
                .collect();
            let now = self.last_accrual;
            for key in hit {
                self.touch(&key);
                if let Some(job) = self.jobs.get_mut(&key) {
                    // The work since the last checkpoint is done again.
                    job.trained_hours = job.checkpointed_hours;
                    job.trained_to = job.trained_to.and(now);
                    if before
                        .as_ref()
                        .is_some_and(|b| b.key.capacity == CapacityKind::Spot)
                    {
                        job.spot_interruptions += 1;
                    }
                }
                if let Some(catalog) = self.catalog.clone() {
                    self.ledger.stop(&key, at, &catalog);
                }
                self.settle_training(&key);
                out.extend(self.decide_job(&key, at, true));
            }
        }
        if node.change == Change::Deleted {
            self.nodes.remove(name);
            self.ledger.remove_node(name);
            return out;
        }
        let labels = &node.labels;
        let product = labels
            .get(&self.config.product_label)
            .cloned()
            .unwrap_or_default();
        let zone = labels.get(&self.config.zone_label).cloned();
        let region = labels.get(&self.config.region_label).cloned();
        let capacity = self.capacity_of(labels);
        let facts = NodeFacts {
            pool: PoolKey {
                product: product.clone(),
                location: zone.clone().or(region.clone()).unwrap_or_default(),
            },
            key: PriceKey {
                product,
                mig_profile: None,
                zone,
                region,
                capacity,
            },
            gpus: node.allocatable_gpus,
            ready: node.ready,
        };
        if facts.ready {
            self.ledger.set_node(
                name,
                PricedNode {
                    key: facts.key.clone(),
                    gpus: facts.gpus,
                },
            );
        } else {
            self.ledger.remove_node(name);
        }
        self.nodes.insert(name.to_string(), facts);
        out
    }

    // -------------------------------------------------------------- queues

    /// `trainingqueue.changed`: its budget and idle policy. A budget that
    /// does not validate is logged and not enforced.
    pub fn on_queue(&mut self, name: &str, queue: Option<&TrainingQueue>) {
        self.changed.queues.insert(name.to_string());
        let Some(queue) = queue else {
            self.queues.remove(name);
            return;
        };
        let facts = self.queues.entry(name.to_string()).or_default();
        facts.budget = queue.spec.budget.as_ref().map(|b| Budget {
            amount: b.amount,
            period: Some(match b.period {
                trainyard_api::BudgetPeriod::Daily => BudgetPeriod::Daily,
                trainyard_api::BudgetPeriod::Weekly => BudgetPeriod::Weekly,
                trainyard_api::BudgetPeriod::Monthly => BudgetPeriod::Monthly,
            }),
            thresholds_percent: b.thresholds_percent.clone(),
            action: match b.action {
                Some(trainyard_api::BudgetAction::SuspendWithCheckpoint) => {
                    LimitAction::SuspendWithCheckpoint
                }
                _ => LimitAction::Hold,
            },
        });
        if let Some(budget) = &facts.budget
            && let Err(err) = budget.validate(&format!("TrainingQueue {name} spec.budget"))
        {
            tracing::warn!(queue = name, error = %err, "budget not enforced");
            facts.budget = None;
        }
        let spec = queue.spec.idle_policy.clone().unwrap_or_default();
        let threshold = spec
            .threshold_percent
            .unwrap_or(trainyard_api::DEFAULT_IDLE_THRESHOLD_PERCENT);
        facts.idle = IdlePolicy {
            threshold: f64::from(threshold) / 100.0,
            resume_threshold: f64::from(
                spec.resume_threshold_percent
                    .unwrap_or(trainyard_api::DEFAULT_IDLE_RESUME_PERCENT)
                    .max(threshold),
            ) / 100.0,
            window_seconds: spec
                .window_seconds
                .unwrap_or(trainyard_api::DEFAULT_IDLE_WINDOW_SECONDS),
            suspend_after_seconds: (spec.action
                == Some(trainyard_api::IdleAction::AlertThenSuspend))
            .then(|| {
                spec.suspend_after_seconds
                    .unwrap_or(trainyard_api::DEFAULT_IDLE_SUSPEND_AFTER_SECONDS)
            }),
        };
    }

    // ---------------------------------------------------------------- jobs

    /// `trainingjob.changed`: a new job with `capacityType: any` gets its
    /// capacity chosen.
    pub fn on_job(
        &mut self,
        entity: &EntityRef,
        job: Option<&TrainingJob>,
        at: DateTime<Utc>,
    ) -> Vec<Outgoing> {
        let key = entity.key();
        self.touch(&key);
        let Some(job) = job else {
            self.forget(&key, at);
            return Vec::new();
        };
        let spec = &job.spec;
        let scheduling = spec.scheduling.clone().unwrap_or_default();
        let terminal = job
            .status
            .as_ref()
            .and_then(|s| s.state)
            .is_some_and(|s| s.is_terminal());
        let previous = self.jobs.remove(&key);
        let facts = JobFacts {
            entity: entity.clone(),
            model: spec.model.clone(),
            queue: scheduling.queue.clone().unwrap_or_else(|| "default".into()),
            gpus: spec.total_gpus(),
            workers: spec.num_workers.max(1),
            any_capacity: spec.capacity_type() == SpecCapacity::Any,
            runtime_seconds: scheduling.estimated_runtime_seconds,
            deadline: scheduling
                .deadline
                .as_ref()
                .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)),
            checkpoints: spec
                .checkpoint
                .as_ref()
                .and_then(|c| c.enabled)
                .unwrap_or(false),
            product: scheduling
                .node_selector
                .get(&self.config.product_label)
                .cloned(),
            ..previous.clone().unwrap_or_else(|| JobFacts {
                entity: entity.clone(),
                model: String::new(),
                queue: String::new(),
                gpus: 0,
                workers: 0,
                any_capacity: false,
                runtime_seconds: None,
                deadline: None,
                checkpoints: false,
                product: None,
                chosen: None,
                spot_interruptions: 0,
                trained_hours: 0.0,
                trained_to: None,
                checkpointed_hours: 0.0,
                last_checkpoint: None,
                checkpoint_gaps_seconds: Vec::new(),
                attempt: 0,
                utilization: BTreeMap::new(),
                idle: IdleDetector::default(),
                suspend_requested: false,
                activity_sampled: false,
            })
        };
        self.jobs.insert(key.clone(), facts);
        self.settle_training(&key);
        if terminal {
            return Vec::new();
        }
        let decided = previous.is_some_and(|p| p.chosen.is_some());
        if decided {
            Vec::new()
        } else {
            self.decide_job(&key, at, false)
        }
    }

    /// Chooses (again) for a job with `capacityType: any`; published when it
    /// is the first choice or a change.
    fn decide_job(&mut self, key: &str, at: DateTime<Utc>, redecide: bool) -> Vec<Outgoing> {
        let Some(catalog) = self.catalog.clone() else {
            return Vec::new();
        };
        let Some(job) = self.jobs.get(key).cloned() else {
            return Vec::new();
        };
        if !job.any_capacity || job.gpus == 0 {
            return Vec::new();
        }
        let Some((spot_node, od_node)) = self.cheapest_nodes(&catalog, job.product.as_deref(), at)
        else {
            return Vec::new();
        };
        let (runtime_hours, source) =
            match (job.runtime_seconds, self.history.mean_hours(&job.model)) {
                (Some(s), _) => (s as f64 / 3600.0, RuntimeSource::Estimate),
                (None, Some(h)) => (h, RuntimeSource::History),
                (None, None) => (
                    self.config.default_runtime_seconds as f64 / 3600.0,
                    RuntimeSource::Default,
                ),
            };
        let work_hours =
            (runtime_hours - job.trained_hours_at(self.last_accrual)).max(runtime_hours * 0.05);
        let interval_seconds = job.checkpoints.then(|| {
            if job.checkpoint_gaps_seconds.is_empty() {
                self.config.assumed_checkpoint_interval_seconds as f64
            } else {
                job.checkpoint_gaps_seconds.iter().sum::<f64>()
                    / job.checkpoint_gaps_seconds.len() as f64
            }
        });
        let spot_facts = &self.nodes[&spot_node];
        let prior = catalog.interruption_prior(
            &spot_facts.key.product,
            spot_facts.key.zone.as_deref(),
            spot_facts.key.region.as_deref(),
            self.config.fallback_reclaims_per_node_hour,
        );
        let rate = self
            .interruptions
            .rate(&spot_facts.pool, prior, catalog.prior_node_hours());
        let per_node = spot_facts.gpus.max(1);
        let nodes = job.gpus.div_ceil(per_node).max(1).min(job.workers.max(1));
        let spot_price = catalog.price_at(&spot_facts.key, at).unwrap_or(0.0);
        let od_price = catalog
            .price_at(&self.nodes[&od_node].key, at)
            .unwrap_or(0.0);
        let inputs = DecisionInputs {
            work_hours,
            runtime_source: source,
            gpus: job.gpus,
            nodes,
            checkpoint_interval_hours: interval_seconds.map(|s| s / 3600.0),
            checkpoint_save_hours: self.config.checkpoint_save_seconds as f64 / 3600.0,
            restart_hours: self.config.restart_seconds as f64 / 3600.0,
            spot_price_per_gpu_hour: spot_price,
            on_demand_price_per_gpu_hour: od_price,
            spot_reclaims_per_node_hour: rate,
            hours_to_deadline: job
                .deadline
                .map(|d| (d - at).num_seconds().max(0) as f64 / 3600.0),
            spot_interruptions: job.spot_interruptions,
            max_spot_interruptions: self.config.max_spot_interruptions,
            deadline_risk_tolerance: self.config.deadline_risk_tolerance,
        };
        let choice = decide(&inputs);
        let capacity_type = match choice.choice {
            Choice::Spot => CapacityType::Spot,
            Choice::OnDemand => CapacityType::OnDemand,
        };
        if redecide && job.chosen == Some(capacity_type) {
            return Vec::new();
        }
        if let Some(j) = self.jobs.get_mut(key) {
            j.chosen = Some(capacity_type);
        }
        self.changed.jobs.insert(key.to_string());
        let expected_cost = match choice.choice {
            Choice::Spot => choice.spot.expected_cost,
            Choice::OnDemand => choice.on_demand.expected_cost,
        };
        vec![Outgoing::Capacity(
            job.entity.clone(),
            CapacityChosen {
                capacity_type,
                reason: choice.reason.clone(),
                currency: catalog.currency().to_string(),
                spot_expected_cost: choice.spot.expected_cost,
                on_demand_expected_cost: choice.on_demand.expected_cost,
                expected_cost,
                spot_miss_probability: choice.spot.miss_probability,
                on_demand_miss_probability: choice.on_demand.miss_probability,
                inputs: CapacityInputs {
                    work_hours,
                    runtime_source: match source {
                        RuntimeSource::Estimate => "estimate",
                        RuntimeSource::History => "history",
                        RuntimeSource::Default => "default",
                    }
                    .into(),
                    gpus: job.gpus,
                    nodes,
                    checkpoint_interval_seconds: interval_seconds,
                    checkpoint_save_seconds: self.config.checkpoint_save_seconds as f64,
                    restart_seconds: self.config.restart_seconds as f64,
                    spot_price_per_gpu_hour: spot_price,
                    on_demand_price_per_gpu_hour: od_price,
                    spot_reclaims_per_node_hour: rate,
                    pool: spot_facts.pool.name(),
                    deadline: job.deadline,
                    spot_interruptions: job.spot_interruptions,
                },
            },
        )]
    }

    /// The cheapest priced spot and on-demand nodes (of `product` if given).
    fn cheapest_nodes(
        &self,
        catalog: &PriceCatalog,
        product: Option<&str>,
        at: DateTime<Utc>,
    ) -> Option<(String, String)> {
        let cheapest = |capacity: CapacityKind| {
            self.nodes
                .iter()
                .filter(|(_, n)| {
                    n.key.capacity == capacity && product.is_none_or(|p| n.key.product == p)
                })
                .filter_map(|(name, n)| Some((catalog.price_at(&n.key, at)?, name)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, name)| name.clone())
        };
        Some((
            cheapest(CapacityKind::Spot)?,
            cheapest(CapacityKind::OnDemand)?,
        ))
    }

    /// `admission.decided`: the job holds GPUs on these nodes from now.
    pub fn on_admission(
        &mut self,
        entity: &EntityRef,
        admission: &AdmissionDecided,
        at: DateTime<Utc>,
    ) {
        self.accrue_until(at);
        let key = entity.key();
        self.touch(&key);
        if let Some(catalog) = self.catalog.clone() {
            self.ledger.stop(&key, at, &catalog);
        }
        self.settle_training(&key);
        let queue = admission.queue.clone();
        let mut holdings: BTreeMap<String, u32> = BTreeMap::new();
        for p in &admission.placements {
            *holdings.entry(p.node.clone()).or_default() += p.gpus;
        }
        if holdings.is_empty() {
            return;
        }
        if let Some(job) = self.jobs.get_mut(&key) {
            job.attempt = admission.attempt;
            job.utilization.clear();
            job.idle = IdleDetector::default();
            job.suspend_requested = false;
        }
        self.ledger.start(
            &key,
            Running {
                namespace: entity.namespace.clone(),
                queue,
                holdings: holdings
                    .into_iter()
                    .map(|(node, gpus)| Holding { node, gpus })
                    .collect(),
                usage_ratio: None,
                since: at,
            },
        );
        self.settle_training(&key);
    }

    /// `trainingjob.transitioned` out of holding GPUs (suspended, finished).
    pub fn on_released(
        &mut self,
        entity: &EntityRef,
        finished: bool,
        at: DateTime<Utc>,
    ) -> Vec<Outgoing> {
        self.accrue_until(at);
        let key = entity.key();
        self.touch(&key);
        let lines = match self.catalog.clone() {
            Some(catalog) => self.ledger.stop(&key, at, &catalog),
            None => Vec::new(),
        };
        self.settle_training(&key);
        let mut out = self.records(lines, at, at);
        if finished && let Some(job) = self.jobs.get(&key) {
            self.history.record(&job.model, job.trained_hours);
        }
        if finished {
            self.ledger.forget_job(&key);
        }
        out.extend(self.check_budgets(at));
        out
    }

    fn forget(&mut self, key: &str, at: DateTime<Utc>) {
        self.touch(key);
        if let Some(catalog) = self.catalog.clone() {
            self.ledger.stop(key, at, &catalog);
        }
        self.ledger.forget_job(key);
        self.jobs.remove(key);
    }

    /// `worker.checkpoint`: the gap between checkpoints is the interval, and
    /// the training so far is kept.
    pub fn on_checkpoint(&mut self, entity: &EntityRef, at: DateTime<Utc>) {
        self.accrue_until(at);
        let key = entity.key();
        self.touch(&key);
        let now = self.last_accrual;
        if let Some(job) = self.jobs.get_mut(&key) {
            job.checkpointed_hours = job.trained_hours_at(now);
            if let Some(last) = job.last_checkpoint {
                let gap = (at - last).num_seconds() as f64;
                if gap > 0.0 {
                    job.checkpoint_gaps_seconds.push(gap);
                    if job.checkpoint_gaps_seconds.len() > 8 {
                        job.checkpoint_gaps_seconds.remove(0);
                    }
                }
            }
            job.last_checkpoint = Some(at);
        }
    }

    /// `worker.utilization`. With utilisation from DCGM, only the phase is
    /// taken from the report.
    pub fn on_utilization(&mut self, entity: &EntityRef, report: &UtilizationReported) {
        let key = entity.key();
        self.touch(&key);
        let from_workers = self.config.utilization_source == UtilizationSource::Worker;
        if let Some(job) = self.jobs.get_mut(&key)
            && report.attempt >= job.attempt
        {
            let phase = phase_of(report.phase);
            job.utilization
                .entry(report.worker_index)
                .and_modify(|(utilization, known)| {
                    if from_workers {
                        *utilization = report.gpu_utilization;
                    }
                    *known = phase;
                })
                .or_insert((report.gpu_utilization, phase));
        }
        self.update_usage_ratio(&key);
    }

    /// GPU activity per worker from DCGM, for the next accounting run: a
    /// running job is sampled when every worker of its attempt has a value.
    pub fn observe_activity(&mut self, activity: &BTreeMap<WorkerPod, f64>) {
        self.changed.every_job = true;
        let keys: Vec<String> = self.jobs.keys().cloned().collect();
        for key in keys {
            let Some(job) = self.jobs.get_mut(&key) else {
                continue;
            };
            let samples: BTreeMap<u32, f64> = activity
                .iter()
                .filter(|(w, _)| {
                    w.namespace == job.entity.namespace
                        && w.training_job == job.entity.name
                        && w.attempt == job.attempt
                })
                .map(|(w, value)| (w.worker_index, *value))
                .collect();
            job.activity_sampled = samples.len() as u32 >= job.workers.max(1);
            for (worker, value) in samples {
                job.utilization
                    .entry(worker)
                    .and_modify(|(utilization, _)| *utilization = value)
                    .or_insert((value, WorkerPhase::Training));
            }
            self.update_usage_ratio(&key);
        }
    }

    fn update_usage_ratio(&mut self, key: &str) {
        let ratio = self.jobs.get(key).and_then(|j| {
            (!j.utilization.is_empty()).then(|| {
                j.utilization.values().map(|(u, _)| *u).sum::<f64>() / j.utilization.len() as f64
            })
        });
        if let Some(run) = self.ledger.running_mut(key) {
            run.usage_ratio = ratio;
        }
    }

    fn accrue_until(&mut self, at: DateTime<Utc>) {
        if let Some(last) = self.last_accrual
            && at > last
        {
            let hours = (at - last).num_milliseconds() as f64 / 3_600_000.0;
            for node in self.nodes.values() {
                if node.ready && node.key.capacity == CapacityKind::Spot {
                    self.interruptions.observe_exposure(&node.pool, hours);
                }
            }
        }
        self.last_accrual = Some(self.last_accrual.map_or(at, |l| l.max(at)));
    }

    // ---------------------------------------------------------- accounting

    /// An accounting run at `at`: cost records per running job, budget
    /// checks, idle checks.
    pub fn tick(&mut self, at: DateTime<Utc>) -> Vec<Outgoing> {
        let start = self.last_accrual.unwrap_or(at);
        self.accrue_until(at);
        // Costs accrue to every running job; idle checks look at every job.
        self.changed.every_job = true;
        let Some(catalog) = self.catalog.clone() else {
            return Vec::new();
        };
        let lines = self.ledger.accrue(at, &catalog);
        let mut out = self.records(lines, start, at);
        out.extend(self.check_budgets(at));
        out.extend(self.check_idle(at));
        out
    }

    fn records(
        &mut self,
        lines: Vec<cost_optimizer_core::CostLine>,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Vec<Outgoing> {
        let mut by_job: BTreeMap<String, Vec<cost_optimizer_core::CostLine>> = BTreeMap::new();
        let mut by_queue: BTreeMap<String, f64> = BTreeMap::new();
        for line in lines {
            if let Some(job) = line.job.clone() {
                *by_queue.entry(line.queue.clone()).or_default() += line.cost;
                by_job.entry(job).or_default().push(line);
            }
        }
        for (queue, spend) in by_queue {
            *self.unbudgeted.entry(queue).or_default() += spend;
        }
        let currency = self.currency();
        let mut out = Vec::new();
        for (key, lines) in by_job {
            let Some(job) = self.jobs.get(&key) else {
                continue;
            };
            let accrued = self.ledger.job_total(&key);
            let runtime_hours = job
                .runtime_seconds
                .map(|s| s as f64 / 3600.0)
                .or_else(|| self.history.mean_hours(&job.model));
            let estimated = runtime_hours.and_then(|total| {
                let rate = self.ledger.running(&key).map(|r| {
                    self.catalog
                        .as_ref()
                        .map_or(0.0, |c| self.ledger.hourly_rate(r, end, c))
                })?;
                Some(accrued + (total - job.trained_hours_at(self.last_accrual)).max(0.0) * rate)
            });
            out.push(Outgoing::Cost(
                job.entity.clone(),
                CostRecorded {
                    queue: lines.first().map(|l| l.queue.clone()).unwrap_or_default(),
                    period_start: start,
                    period_end: end,
                    currency: currency.clone(),
                    lines: lines
                        .iter()
                        .map(|l| CostLine {
                            node: l.node.clone(),
                            capacity_type: l.capacity.as_str().into(),
                            gpu_hours: l.gpu_hours,
                            price_per_gpu_hour: l.per_gpu_hour,
                            cost: l.cost,
                        })
                        .collect(),
                    accrued_cost: accrued,
                    estimated_cost: estimated,
                },
            ));
        }
        out
    }

    /// Threshold alerts and state changes of every budget; the queue's
    /// status is published every run while it has a budget.
    fn check_budgets(&mut self, at: DateTime<Utc>) -> Vec<Outgoing> {
        let currency = self.currency();
        let mut out = Vec::new();
        for (name, facts) in self.queues.iter_mut() {
            let Some(budget) = facts.budget.clone() else {
                continue;
            };
            self.changed.queues.insert(name.clone());
            let entity = EntityRef::new("", name, "");
            let spend = self.unbudgeted.remove(name).unwrap_or(0.0);
            for event in facts.tracker.add(&budget, spend, at) {
                if let BudgetEvent::ThresholdCrossed {
                    percent,
                    spent,
                    amount,
                } = event
                {
                    let period = budget.period.map_or("", |p| match p {
                        BudgetPeriod::Daily => "Daily",
                        BudgetPeriod::Weekly => "Weekly",
                        BudgetPeriod::Monthly => "Monthly",
                    });
                    out.push(Outgoing::BudgetAlert(
                        entity.clone(),
                        BudgetThresholdCrossed {
                            severity: if percent >= 100 {
                                Severity::Critical
                            } else {
                                Severity::Warning
                            },
                            threshold_percent: percent,
                            spent,
                            budget: amount,
                            currency: currency.clone(),
                            queue: Some(name.clone()),
                            message: format!(
                                "queue {name} spent {:.0}% of its {period} budget ({spent:.2} of {amount:.2} {currency}) in the period from {}",
                                spent / amount * 100.0,
                                facts.tracker.period_start.unwrap_or(at).to_rfc3339()
                            ),
                        },
                    ));
                }
            }
            let state = match (facts.tracker.at_limit, budget.action) {
                (false, _) => BudgetState::Open,
                (true, LimitAction::Hold) => BudgetState::Held,
                (true, LimitAction::SuspendWithCheckpoint) => BudgetState::Suspended,
            };
            facts.state = Some(state);
            out.push(Outgoing::Budget(
                entity,
                BudgetStatusReported {
                    state,
                    period_start: facts.tracker.period_start.unwrap_or(at),
                    spent: facts.tracker.spent,
                    amount: budget.amount,
                    currency: currency.clone(),
                    message: format!(
                        "{:.0}% of the budget spent ({:.2} of {:.2} {currency})",
                        facts.tracker.spent / budget.amount * 100.0,
                        facts.tracker.spent,
                        budget.amount
                    ),
                },
            ));
        }
        out
    }

    /// With utilisation from DCGM, a job not sampled in this run gets no
    /// decision and its idle time starts over: missing data is never taken
    /// for idleness.
    fn check_idle(&mut self, at: DateTime<Utc>) -> Vec<Outgoing> {
        let mut out = Vec::new();
        let from_dcgm = self.config.utilization_source == UtilizationSource::Dcgm;
        for (key, job) in self.jobs.iter_mut() {
            let sampled = std::mem::take(&mut job.activity_sampled);
            if from_dcgm && !sampled {
                job.idle = IdleDetector::default();
                continue;
            }
            if self.ledger.running(key).is_none() || job.utilization.is_empty() {
                continue;
            }
            let policy = self
                .queues
                .get(&job.queue)
                .map(|q| q.idle.clone())
                .unwrap_or_default();
            let samples = job.utilization.values();
            let mean = samples.clone().map(|(u, _)| *u).sum::<f64>() / job.utilization.len() as f64;
            let phase = samples
                .map(|(_, p)| *p)
                .find(|p| p.is_busy_without_gpu())
                .unwrap_or(WorkerPhase::Training);
            let Some(action) = job.idle.observe(&policy, at, mean, phase) else {
                continue;
            };
            let threshold = policy.threshold * 100.0;
            let (since, utilization, suspend) = match action {
                IdleAction::Alert {
                    idle_since,
                    utilization,
                } => (idle_since, utilization, false),
                IdleAction::Suspend {
                    idle_since,
                    utilization,
                } => (idle_since, utilization, true),
            };
            let text = format!(
                "GPUs idle ({:.0}% < {threshold:.0}%) since {}",
                utilization * 100.0,
                since.to_rfc3339()
            );
            out.push(Outgoing::Idle(
                job.entity.clone(),
                GpusIdle {
                    severity: Severity::Warning,
                    gpus: job.gpus,
                    idle_minutes: u32::try_from((at - since).num_minutes().max(0))
                        .unwrap_or(u32::MAX),
                    utilization_percent: utilization * 100.0,
                    queue: Some(job.queue.clone()),
                    node: None,
                    message: format!(
                        "{key}: {} {text}{}",
                        job.gpus,
                        if suspend { SUSPEND_NEXT } else { "" }
                    ),
                },
            ));
            if suspend && !job.suspend_requested {
                job.suspend_requested = true;
                out.push(Outgoing::IdleSuspend(
                    job.entity.clone(),
                    IdleSuspendRequested {
                        attempt: job.attempt,
                        idle_since: since,
                        utilization,
                        message: text,
                    },
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + s, 0).expect("time")
    }

    /// A running one-worker job in a queue whose idle policy alerts after 60 s
    /// and suspends 60 s later, with utilisation from DCGM.
    fn running_job() -> (CostState, EntityRef) {
        let mut state = CostState::new(CostConfig {
            utilization_source: UtilizationSource::Dcgm,
            prometheus_url: "http://127.0.0.1:9090".into(),
            ..CostConfig::default()
        });
        state.set_catalog(
            PriceCatalog::parse(
                "products: [A100]\nprices:\n  - {product: A100, capacityType: on-demand, pricePerGpuHour: 4.0, effectiveFrom: \"2020-01-01T00:00:00Z\"}\n",
            )
            .expect("catalog"),
        );
        let node: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8, "unschedulable": false, "ready": true,
            "labels": {"nvidia.com/gpu.product": "A100"}
        }))
        .expect("node");
        state.on_node("n1", &node, t(0));
        let queue: TrainingQueue = serde_json::from_value(json!({
            "metadata": {"name": "q"},
            "spec": {"flavors": [], "idlePolicy": {"windowSeconds": 60, "action": "AlertThenSuspend", "suspendAfterSeconds": 60}}
        }))
        .expect("queue");
        state.on_queue("q", Some(&queue));
        let entity = EntityRef::new("ml", "bert", "u1");
        let job: TrainingJob = serde_json::from_value(json!({
            "metadata": {"name": "bert", "namespace": "ml", "uid": "u1"},
            "spec": {"model": "bert", "dataset": "d", "numWorkers": 1, "gpusPerWorker": 2,
                     "scheduling": {"queue": "q"}}
        }))
        .expect("job");
        state.on_job(&entity, Some(&job), t(0));
        let admission: AdmissionDecided = serde_json::from_value(json!({
            "attempt": 0, "queue": "q", "flavor": "a100",
            "placements": [{"index": 0, "node": "n1", "gpus": 2}]
        }))
        .expect("admission");
        state.on_admission(&entity, &admission, t(0));
        (state, entity)
    }

    fn activity(value: f64) -> BTreeMap<WorkerPod, f64> {
        BTreeMap::from([(
            WorkerPod {
                namespace: "ml".into(),
                training_job: "bert".into(),
                attempt: 0,
                worker_index: 0,
            },
            value,
        )])
    }

    fn idle_messages(out: &[Outgoing]) -> Vec<String> {
        out.iter()
            .filter_map(|o| match o {
                Outgoing::Idle(_, alert) => Some(format!(
                    "alert: {}",
                    if alert.message.ends_with(SUSPEND_NEXT) {
                        "suspend"
                    } else {
                        "alert"
                    }
                )),
                Outgoing::IdleSuspend(..) => Some("suspend request".to_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_lost_node_takes_the_training_back_to_the_last_checkpoint() {
        let lost: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8, "unschedulable": false, "ready": false,
            "labels": {"nvidia.com/gpu.product": "A100"}
        }))
        .expect("node");
        let (mut state, entity) = running_job();
        state.on_checkpoint(&entity, t(3 * 3600));
        state.on_node("n1", &lost, t(4 * 3600));
        let job = state.job("ml", "bert").expect("job");
        assert_eq!(
            job.trained_hours, 3.0,
            "the hour since the checkpoint is lost"
        );
        // Without a checkpoint nothing is kept.
        let (mut state, _) = running_job();
        state.on_node("n1", &lost, t(4 * 3600));
        assert_eq!(state.job("ml", "bert").expect("job").trained_hours, 0.0);
    }

    #[test]
    fn a_job_dcgm_sees_idle_is_alerted_then_suspended() {
        let (mut state, _) = running_job();
        let mut seen = Vec::new();
        for s in (0..=150).step_by(30) {
            state.observe_activity(&activity(0.01));
            seen.extend(idle_messages(&state.tick(t(s))));
        }
        assert_eq!(seen, ["alert: alert", "alert: suspend", "suspend request"]);
    }

    #[test]
    fn a_busy_job_or_missing_dcgm_data_is_never_judged_idle() {
        let (mut busy, _) = running_job();
        for s in (0..=300).step_by(30) {
            busy.observe_activity(&activity(0.9));
            assert!(idle_messages(&busy.tick(t(s))).is_empty());
        }
        // Low samples with a run without data between them: idle time starts
        // over after the gap, so no alert within the window of the last ones.
        let (mut gappy, entity) = running_job();
        for s in (0..=300).step_by(30) {
            if s % 60 == 0 {
                gappy.observe_activity(&activity(0.0));
            }
            assert!(idle_messages(&gappy.tick(t(s))).is_empty(), "at {s}");
        }
        // Worker reports do not stand in for DCGM data.
        let report = UtilizationReported {
            worker_index: 0,
            attempt: 0,
            gpu_utilization: 0.0,
            phase: WirePhase::Training,
        };
        for s in (330..=600).step_by(30) {
            gappy.on_utilization(&entity, &report);
            assert!(idle_messages(&gappy.tick(t(s))).is_empty(), "at {s}");
        }
    }

    /// The bucket after a save of `state`'s changes.
    fn save(state: &mut CostState, bucket: &mut BTreeMap<String, Vec<u8>>) {
        for (key, value) in state.take_changed_values().expect("encoded") {
            match value {
                Some(value) => bucket.insert(key, value),
                None => bucket.remove(&key),
            };
        }
    }

    fn restored(bucket: &BTreeMap<String, Vec<u8>>) -> CostState {
        let records = bucket
            .values()
            .map(|v| serde_json::from_slice::<Record<'static>>(v).expect("record"));
        CostState::from_records(records, CostConfig::default())
    }

    #[test]
    fn saving_the_changes_keeps_the_saved_values_equal_to_the_state() {
        let (mut state, entity) = running_job();
        let mut bucket = BTreeMap::new();
        save(&mut state, &mut bucket);
        type Step = (&'static str, Box<dyn Fn(&mut CostState)>);
        let steps: Vec<Step> = vec![
            (
                "checkpoint",
                Box::new(|s| s.on_checkpoint(&EntityRef::new("ml", "bert", "u1"), t(1800))),
            ),
            (
                "utilisation",
                Box::new(|s| {
                    s.on_utilization(
                        &EntityRef::new("ml", "bert", "u1"),
                        &UtilizationReported {
                            worker_index: 0,
                            attempt: 0,
                            gpu_utilization: 0.5,
                            phase: WirePhase::Training,
                        },
                    )
                }),
            ),
            (
                "accounting run",
                Box::new(|s| {
                    s.tick(t(3600));
                }),
            ),
            (
                "DCGM samples",
                Box::new(|s| s.observe_activity(&activity(0.4))),
            ),
            (
                "node lost",
                Box::new(|s| {
                    let lost: NodeObserved = serde_json::from_value(json!({
                    "change": "Deleted", "allocatableGpus": 8, "unschedulable": false, "ready": false,
                    "labels": {"nvidia.com/gpu.product": "A100"}
                })).expect("node");
                    s.on_node("n1", &lost, t(5400));
                }),
            ),
            ("queue deleted", Box::new(|s| s.on_queue("q", None))),
            (
                "finished",
                Box::new(|s| {
                    s.on_released(&EntityRef::new("ml", "bert", "u1"), true, t(7200));
                }),
            ),
            (
                "finalized",
                Box::new(|s| {
                    s.on_job(&EntityRef::new("ml", "bert", "u1"), None, t(7300));
                }),
            ),
        ];
        for (step, apply) in steps {
            apply(&mut state);
            save(&mut state, &mut bucket);
            assert_eq!(bucket, state.values().expect("encoded"), "after {step}");
            assert_eq!(
                restored(&bucket).values().expect("encoded"),
                bucket,
                "restored after {step}"
            );
        }
        assert!(
            bucket.keys().all(|k| !k.starts_with("job.")),
            "a finalized job leaves no value: {:?}",
            bucket.keys().collect::<Vec<_>>()
        );
        assert!(state.job(&entity.namespace, &entity.name).is_none());
    }

    #[test]
    fn a_training_job_is_saved_again_only_by_what_changes_it() {
        let (mut state, entity) = running_job();
        let mut bucket = BTreeMap::new();
        save(&mut state, &mut bucket);
        // A node's change accrues time: the job trains on, its value stays.
        let node: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8, "unschedulable": false, "ready": true,
            "labels": {"nvidia.com/gpu.product": "A100"}
        }))
        .expect("node");
        state.on_node("n2", &node, t(600));
        let changed: Vec<String> = state
            .take_changed_values()
            .expect("encoded")
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(changed, ["node.n2", "cluster"]);
        // Hours trained count on from the saved accrual time.
        state.on_checkpoint(&entity, t(1800));
        let job = state.job("ml", "bert").expect("job");
        assert!((job.checkpointed_hours - 0.5).abs() < 1e-9);
        assert!((job.trained_hours_at(Some(t(3600))) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn value_keys_are_two_tokens_of_the_characters_nats_allows() {
        assert_eq!(job_value_key("ml/bert-1"), "job.ml/bert-1");
        assert_eq!(
            node_value_key("ip-10-0-0-1.ec2.internal"),
            "node.ip-10-0-0-1=2Eec2=2Einternal"
        );
        assert_eq!(queue_value_key("a=b c"), "queue.a=3Db=20c");
        assert_eq!(queue_value_key(""), "queue.=");
        assert_ne!(queue_value_key("a.b"), queue_value_key("a=2Eb"));
    }

    #[test]
    fn a_state_saved_whole_restores_with_its_running_job_training_on() {
        let whole = include_str!("../tests/fixtures/state-saved-whole.json");
        let state = CostState::restore(
            serde_json::from_str(whole).expect("state saved whole"),
            CostConfig::default(),
        );
        let job = state.job("ml", "bert").expect("job");
        let saved_at = state.last_accrual;
        assert_eq!(job.trained_hours, 1.0);
        assert_eq!(job.trained_to, saved_at);
        let later = saved_at.map(|t| t + chrono::Duration::hours(2));
        assert!((job.trained_hours_at(later) - 3.0).abs() < 1e-9);
        let values = state.values().expect("encoded");
        let keys: Vec<&str> = values.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "cluster",
                "job.ml/bert",
                "node.od-1",
                "node.spot-1",
                "queue.team-a"
            ]
        );
    }
}
