//! GPU cost accounting with OpenCost's semantics: a job is charged for
//! max(requested, used) GPUs on each node it holds, at the price in force
//! when the GPU-seconds were spent; GPUs of priced nodes that no job holds
//! are idle cluster cost, kept apart and never folded into jobs.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::catalog::{CapacityKind, PriceCatalog, PriceKey};

/// GPUs a job holds on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holding {
    pub node: String,
    pub gpus: u32,
}

/// A running job's accounting state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub namespace: String,
    pub queue: String,
    pub holdings: Vec<Holding>,
    /// GPUs in use per requested GPU (0..=1 and above for oversubscription),
    /// when the workers report it.
    pub usage_ratio: Option<f64>,
    /// Accrued up to here.
    pub since: DateTime<Utc>,
}

/// A node's price key and GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PricedNode {
    pub key: PriceKey,
    pub gpus: u32,
}

/// Money spent over one stretch at one price: by a job, or idle (no job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostLine {
    /// `namespace/name` of the job; `None` for idle cluster cost.
    pub job: Option<String>,
    pub namespace: String,
    pub queue: String,
    pub node: String,
    pub capacity: CapacityKind,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub gpu_hours: f64,
    pub per_gpu_hour: f64,
    pub cost: f64,
}

/// The ledger apart from its entries per job and per node: idle cost, cost
/// per namespace and queue, unpriced GPU-hours (saved as one value, the
/// entries each with their job or node).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerTotals {
    pub idle_since: Option<DateTime<Utc>>,
    pub by_queue: BTreeMap<String, BTreeMap<String, f64>>,
    pub idle_total: f64,
    pub unpriced_gpu_hours: f64,
}

/// Running jobs, priced nodes and the totals so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    nodes: BTreeMap<String, PricedNode>,
    running: BTreeMap<String, Running>,
    /// When idle cost was accrued up to.
    idle_since: Option<DateTime<Utc>>,
    by_job: BTreeMap<String, f64>,
    /// Namespace → queue → cost (nested: JSON keys are strings).
    by_queue: BTreeMap<String, BTreeMap<String, f64>>,
    idle_total: f64,
    /// GPU-hours held on nodes the catalog has no price for.
    unpriced_gpu_hours: f64,
}

fn hours(start: DateTime<Utc>, end: DateTime<Utc>) -> f64 {
    (end - start).num_milliseconds().max(0) as f64 / 3_600_000.0
}

impl Ledger {
    /// Restores the totals, leaving the entries per job and node as they are.
    pub fn set_totals(&mut self, totals: LedgerTotals) {
        self.idle_since = totals.idle_since;
        self.by_queue = totals.by_queue;
        self.idle_total = totals.idle_total;
        self.unpriced_gpu_hours = totals.unpriced_gpu_hours;
    }

    pub fn totals(&self) -> LedgerTotals {
        LedgerTotals {
            idle_since: self.idle_since,
            by_queue: self.by_queue.clone(),
            idle_total: self.idle_total,
            unpriced_gpu_hours: self.unpriced_gpu_hours,
        }
    }

    /// Jobs running or with a cost so far.
    pub fn jobs(&self) -> impl Iterator<Item = &String> {
        self.running.keys().chain(
            self.by_job
                .keys()
                .filter(|k| !self.running.contains_key(*k)),
        )
    }

    /// Cost charged to `job` so far, if any was recorded since it started.
    pub fn job_total_recorded(&self, job: &str) -> Option<f64> {
        self.by_job.get(job).copied()
    }

    /// Restores the cost charged to `job` so far.
    pub fn set_job_total(&mut self, job: &str, total: f64) {
        self.by_job.insert(job.to_string(), total);
    }

    /// A node joined or changed. Accrue first: the change applies from now.
    pub fn set_node(&mut self, name: &str, node: PricedNode) {
        self.nodes.insert(name.to_string(), node);
    }

    /// A node left. Accrue first.
    pub fn remove_node(&mut self, name: &str) {
        self.nodes.remove(name);
    }

    pub fn node(&self, name: &str) -> Option<&PricedNode> {
        self.nodes.get(name)
    }

    /// A job started holding GPUs (or its holdings changed: accrue first).
    pub fn start(&mut self, job: &str, running: Running) {
        self.running.insert(job.to_string(), running);
    }

    pub fn running(&self, job: &str) -> Option<&Running> {
        self.running.get(job)
    }

    pub fn running_mut(&mut self, job: &str) -> Option<&mut Running> {
        self.running.get_mut(job)
    }

    /// The job released its GPUs at `at`: its last lines.
    pub fn stop(&mut self, job: &str, at: DateTime<Utc>, catalog: &PriceCatalog) -> Vec<CostLine> {
        let mut lines = Vec::new();
        if let Some(run) = self.running.get(job).cloned() {
            self.charge_job(job, &run, at, catalog, &mut lines);
            self.running.remove(job);
        }
        lines
    }

    /// Charges every running job and the idle GPUs up to `at`.
    pub fn accrue(&mut self, at: DateTime<Utc>, catalog: &PriceCatalog) -> Vec<CostLine> {
        let mut lines = Vec::new();
        let jobs: Vec<(String, Running)> = self
            .running
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (job, run) in jobs {
            self.charge_job(&job, &run, at, catalog, &mut lines);
            if let Some(r) = self.running.get_mut(&job) {
                r.since = r.since.max(at);
            }
        }
        if let Some(since) = self.idle_since
            && since < at
        {
            let mut held: BTreeMap<&str, u32> = BTreeMap::new();
            for run in self.running.values() {
                for h in &run.holdings {
                    *held.entry(h.node.as_str()).or_default() += h.gpus;
                }
            }
            let mut idle_lines = Vec::new();
            for (name, node) in &self.nodes {
                let idle = node
                    .gpus
                    .saturating_sub(held.get(name.as_str()).copied().unwrap_or(0));
                if idle == 0 {
                    continue;
                }
                for span in catalog.spans(&node.key, since, at) {
                    let gpu_hours = f64::from(idle) * hours(span.start, span.end);
                    idle_lines.push(CostLine {
                        job: None,
                        namespace: String::new(),
                        queue: String::new(),
                        node: name.clone(),
                        capacity: node.key.capacity,
                        start: span.start,
                        end: span.end,
                        gpu_hours,
                        per_gpu_hour: span.per_gpu_hour,
                        cost: gpu_hours * span.per_gpu_hour,
                    });
                }
            }
            self.idle_total += idle_lines.iter().map(|l| l.cost).sum::<f64>();
            lines.extend(idle_lines);
        }
        self.idle_since = Some(self.idle_since.map_or(at, |s| s.max(at)));
        lines
    }

    fn charge_job(
        &mut self,
        job: &str,
        run: &Running,
        at: DateTime<Utc>,
        catalog: &PriceCatalog,
        lines: &mut Vec<CostLine>,
    ) {
        if at <= run.since {
            return;
        }
        let usage = run.usage_ratio.unwrap_or(0.0).max(1.0);
        for holding in &run.holdings {
            let charged_gpus = f64::from(holding.gpus) * usage;
            let Some(node) = self.nodes.get(&holding.node) else {
                self.unpriced_gpu_hours += charged_gpus * hours(run.since, at);
                continue;
            };
            let spans = catalog.spans(&node.key, run.since, at);
            let priced: f64 = spans.iter().map(|s| hours(s.start, s.end)).sum();
            self.unpriced_gpu_hours += charged_gpus * (hours(run.since, at) - priced).max(0.0);
            for span in spans {
                let gpu_hours = charged_gpus * hours(span.start, span.end);
                let cost = gpu_hours * span.per_gpu_hour;
                *self.by_job.entry(job.to_string()).or_default() += cost;
                *self
                    .by_queue
                    .entry(run.namespace.clone())
                    .or_default()
                    .entry(run.queue.clone())
                    .or_default() += cost;
                lines.push(CostLine {
                    job: Some(job.to_string()),
                    namespace: run.namespace.clone(),
                    queue: run.queue.clone(),
                    node: holding.node.clone(),
                    capacity: node.key.capacity,
                    start: span.start,
                    end: span.end,
                    gpu_hours,
                    per_gpu_hour: span.per_gpu_hour,
                    cost,
                });
            }
        }
    }

    /// Cost charged to `job` so far.
    pub fn job_total(&self, job: &str) -> f64 {
        self.by_job.get(job).copied().unwrap_or(0.0)
    }

    /// Forgets a finished job's total (its lines were published).
    pub fn forget_job(&mut self, job: &str) {
        self.by_job.remove(job);
    }

    /// Cost so far per namespace and queue.
    pub fn by_queue(&self) -> &BTreeMap<String, BTreeMap<String, f64>> {
        &self.by_queue
    }

    /// Cost of GPUs no job held.
    pub fn idle_total(&self) -> f64 {
        self.idle_total
    }

    pub fn unpriced_gpu_hours(&self) -> f64 {
        self.unpriced_gpu_hours
    }

    /// Price per GPU-hour now of what `run` holds, summed over its GPUs.
    pub fn hourly_rate(&self, run: &Running, at: DateTime<Utc>, catalog: &PriceCatalog) -> f64 {
        run.holdings
            .iter()
            .filter_map(|h| {
                let node = self.nodes.get(&h.node)?;
                Some(f64::from(h.gpus) * catalog.price_at(&node.key, at)?)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = r#"
products: [A100]
prices:
  - {product: A100, capacityType: on-demand, pricePerGpuHour: 4.0, effectiveFrom: "2026-01-01T00:00:00Z"}
  - {product: A100, capacityType: on-demand, pricePerGpuHour: 2.0, effectiveFrom: "2026-01-01T01:00:00Z"}
  - {product: A100, capacityType: spot, pricePerGpuHour: 1.0, effectiveFrom: "2026-01-01T00:00:00Z"}
"#;

    fn t(minutes: i64) -> DateTime<Utc> {
        "2026-01-01T00:00:00Z"
            .parse::<DateTime<Utc>>()
            .expect("time")
            + chrono::Duration::minutes(minutes)
    }

    fn node(capacity: CapacityKind, gpus: u32) -> PricedNode {
        PricedNode {
            key: PriceKey {
                product: "A100".into(),
                mig_profile: None,
                zone: None,
                region: None,
                capacity,
            },
            gpus,
        }
    }

    fn ledger() -> Ledger {
        let mut l = Ledger::default();
        l.set_node("od-1", node(CapacityKind::OnDemand, 8));
        l.set_node("spot-1", node(CapacityKind::Spot, 8));
        l
    }

    fn run(holdings: &[(&str, u32)], usage: Option<f64>, since: i64) -> Running {
        Running {
            namespace: "ml".into(),
            queue: "team-a".into(),
            holdings: holdings
                .iter()
                .map(|(n, g)| Holding {
                    node: n.to_string(),
                    gpus: *g,
                })
                .collect(),
            usage_ratio: usage,
            since: t(since),
        }
    }

    #[test]
    fn gpu_seconds_are_priced_at_the_price_in_force_when_spent() {
        let catalog = PriceCatalog::parse(CATALOG).expect("valid");
        let mut l = ledger();
        l.start("ml/bert", run(&[("od-1", 4)], None, 30));
        let lines = l.accrue(t(90), &catalog);
        let job_lines: Vec<&CostLine> = lines.iter().filter(|l| l.job.is_some()).collect();
        assert_eq!(job_lines.len(), 2);
        // 30 min × 4 GPUs at $4, then 30 min × 4 GPUs at $2.
        assert!((job_lines[0].cost - 8.0).abs() < 1e-9);
        assert!((job_lines[1].cost - 4.0).abs() < 1e-9);
        assert!((l.job_total("ml/bert") - 12.0).abs() < 1e-9);
        // A later price change does not reprice what was charged.
        let later =
            PriceCatalog::parse(&CATALOG.replace("pricePerGpuHour: 2.0", "pricePerGpuHour: 9.0"))
                .expect("valid");
        l.stop("ml/bert", t(90), &later);
        assert!((l.job_total("ml/bert") - 12.0).abs() < 1e-9);
    }

    #[test]
    fn idle_gpus_are_cluster_cost_not_job_cost() {
        let catalog = PriceCatalog::parse(CATALOG).expect("valid");
        let mut l = ledger();
        assert!(l.accrue(t(0), &catalog).is_empty());
        l.start("ml/bert", run(&[("spot-1", 6)], None, 0));
        l.accrue(t(60), &catalog);
        assert!((l.job_total("ml/bert") - 6.0).abs() < 1e-9);
        // 8 idle on-demand GPUs at $4 and 2 idle spot GPUs at $1.
        assert!((l.idle_total() - 34.0).abs() < 1e-9);
        assert!((l.by_queue()["ml"]["team-a"] - 6.0).abs() < 1e-9);
    }

    #[test]
    fn usage_above_the_request_is_charged_and_below_it_is_not_refunded() {
        let catalog = PriceCatalog::parse(CATALOG).expect("valid");
        let mut l = ledger();
        l.start("ml/a", run(&[("spot-1", 2)], Some(0.1), 0));
        l.start("ml/b", run(&[("spot-1", 2)], Some(1.5), 0));
        l.accrue(t(60), &catalog);
        assert!((l.job_total("ml/a") - 2.0).abs() < 1e-9);
        assert!((l.job_total("ml/b") - 3.0).abs() < 1e-9);
    }

    #[test]
    fn gpus_on_unpriced_nodes_are_counted_apart() {
        let catalog = PriceCatalog::parse(CATALOG).expect("valid");
        let mut l = ledger();
        l.start("ml/a", run(&[("unknown", 2)], None, 0));
        let lines = l.stop("ml/a", t(30), &catalog);
        assert!(lines.is_empty());
        assert!((l.unpriced_gpu_hours() - 1.0).abs() < 1e-9);
    }
}
