//! The allocator's Prometheus metrics. Labels are bounded: queue names (an
//! operator creates a handful of TrainingQueues), eviction reasons, kinds of
//! pending reasons, message types and outcomes; never a job name.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use gpu_allocator_core::{PendingReason, QueueUsage};

use crate::error::ServiceError;
use crate::state::CycleReport;

/// Handles for the allocator's metrics.
#[derive(Clone)]
pub struct AllocatorMetrics {
    pub cycle_seconds: Histogram,
    pub admissions: IntCounter,
    pub preemptions: IntCounter,
    pub pending_explanations: IntCounter,
    pub queue_reports: IntCounter,
    pub evictions: IntCounterVec,
    pub pending_jobs: IntGauge,
    pub running_jobs: IntGauge,
    pub queue_depth: IntGaugeVec,
    pub pending_by_reason: IntGaugeVec,
    pub gpus: IntGaugeVec,
    pub gpu_allocation_ratio: Gauge,
    pub queue_nominal_quota: IntGaugeVec,
    pub queue_usage: IntGaugeVec,
    pub queue_borrowed: IntGaugeVec,
    pub events: IntCounterVec,
    pub snapshots: IntCounterVec,
    pub restores: IntCounterVec,
    pub snapshot_bytes: IntGauge,
    pub outbox: IntGauge,
}

fn metric_error(err: prometheus::Error) -> ServiceError {
    ServiceError::Metrics(err.to_string())
}

fn saturating_i64(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

impl AllocatorMetrics {
    pub fn register(registry: &Registry) -> Result<Self, ServiceError> {
        let metrics = Self {
            cycle_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "trainyard_allocator_cycle_seconds",
                    "Time of one admission cycle",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
            )
            .map_err(metric_error)?,
            admissions: IntCounter::new(
                "trainyard_allocator_admissions_total",
                "Jobs admitted (one per attempt)",
            )
            .map_err(metric_error)?,
            preemptions: IntCounter::new(
                "trainyard_allocator_preemptions_total",
                "Running jobs told to make room (one per victim)",
            )
            .map_err(metric_error)?,
            pending_explanations: IntCounter::new(
                "trainyard_allocator_pending_explanations_total",
                "admission.pending messages queued (each a status write on its TrainingJob)",
            )
            .map_err(metric_error)?,
            queue_reports: IntCounter::new(
                "trainyard_allocator_queue_status_reports_total",
                "queue.status messages queued (each a status write on its TrainingQueue)",
            )
            .map_err(metric_error)?,
            evictions: IntCounterVec::new(
                Opts::new(
                    "trainyard_allocator_evictions_total",
                    "Admitted jobs whose GPUs were taken back, by reason",
                ),
                &["reason"],
            )
            .map_err(metric_error)?,
            pending_jobs: IntGauge::new(
                "trainyard_allocator_pending_jobs",
                "Jobs waiting for admission",
            )
            .map_err(metric_error)?,
            running_jobs: IntGauge::new(
                "trainyard_allocator_running_jobs",
                "Jobs holding an admission",
            )
            .map_err(metric_error)?,
            queue_depth: IntGaugeVec::new(
                Opts::new(
                    "trainyard_allocator_queue_depth",
                    "Jobs waiting for admission, by TrainingQueue",
                ),
                &["queue"],
            )
            .map_err(metric_error)?,
            pending_by_reason: IntGaugeVec::new(
                Opts::new(
                    "trainyard_allocator_pending_jobs_by_reason",
                    "Jobs waiting for admission, by kind of reason (quota, capacity, \
                     capacity_cpu_memory, ...; every kind, zero or not)",
                ),
                &["reason"],
            )
            .map_err(metric_error)?,
            gpus: IntGaugeVec::new(
                Opts::new(
                    "trainyard_allocator_gpus",
                    "Whole GPUs known to the allocator, by state (capacity, allocated)",
                ),
                &["state"],
            )
            .map_err(metric_error)?,
            gpu_allocation_ratio: Gauge::new(
                "trainyard_allocator_gpu_allocation_ratio",
                "Allocated whole GPUs over GPU capacity (0 without capacity)",
            )
            .map_err(metric_error)?,
            queue_nominal_quota: IntGaugeVec::new(
                Opts::new(
                    "trainyard_queue_nominal_quota",
                    "Units (GPUs or MIG slices) a TrainingQueue is guaranteed, by flavor and resource",
                ),
                &["queue", "flavor", "resource"],
            )
            .map_err(metric_error)?,
            queue_usage: IntGaugeVec::new(
                Opts::new(
                    "trainyard_queue_usage",
                    "Units (GPUs or MIG slices) a TrainingQueue's admitted jobs hold, by flavor and resource",
                ),
                &["queue", "flavor", "resource"],
            )
            .map_err(metric_error)?,
            queue_borrowed: IntGaugeVec::new(
                Opts::new(
                    "trainyard_queue_borrowed",
                    "Of trainyard_queue_usage, units above the queue's nominal quota, borrowed from its cohort",
                ),
                &["queue", "flavor", "resource"],
            )
            .map_err(metric_error)?,
            events: IntCounterVec::new(
                Opts::new(
                    "trainyard_allocator_events_total",
                    "Messages applied to the allocator, by type and outcome",
                ),
                &["type", "outcome"],
            )
            .map_err(metric_error)?,
            snapshots: IntCounterVec::new(
                Opts::new(
                    "trainyard_allocator_snapshots_total",
                    "State snapshots written to the trainyard_allocator bucket, by outcome",
                ),
                &["outcome"],
            )
            .map_err(metric_error)?,
            restores: IntCounterVec::new(
                Opts::new(
                    "trainyard_allocator_restores_total",
                    "Times this process took the lease and restored its state, by source: snapshot (the last saved) or empty (none saved yet)",
                ),
                &["source"],
            )
            .map_err(metric_error)?,
            snapshot_bytes: IntGauge::new(
                "trainyard_allocator_snapshot_bytes",
                "Bytes stored by the last state snapshot (compressed)",
            )
            .map_err(metric_error)?,
            outbox: IntGauge::new(
                "trainyard_allocator_outbox",
                "Decisions saved but not yet published",
            )
            .map_err(metric_error)?,
        };
        registry
            .register(Box::new(metrics.cycle_seconds.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.admissions.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.restores.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.preemptions.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.pending_explanations.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.queue_reports.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.evictions.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.pending_jobs.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.running_jobs.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.queue_depth.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.pending_by_reason.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.gpus.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.gpu_allocation_ratio.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.queue_nominal_quota.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.queue_usage.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.queue_borrowed.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.events.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.snapshots.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.snapshot_bytes.clone()))
            .map_err(metric_error)?;
        registry
            .register(Box::new(metrics.outbox.clone()))
            .map_err(metric_error)?;
        Ok(metrics)
    }

    /// Records one cycle.
    pub fn observe_cycle(&self, report: &CycleReport, seconds: f64) {
        self.cycle_seconds.observe(seconds);
        self.admissions.inc_by(report.admissions as u64);
        self.preemptions.inc_by(report.preempted_victims as u64);
        self.pending_explanations
            .inc_by(report.explanations_published as u64);
        self.queue_reports.inc_by(report.queue_reports as u64);
        self.evictions
            .with_label_values(&["preempted"])
            .inc_by(report.evictions_preempted as u64);
        self.evictions
            .with_label_values(&["node_lost"])
            .inc_by(report.evictions_node_lost as u64);
        self.evictions
            .with_label_values(&["drained"])
            .inc_by(report.evictions_drained as u64);
        self.pending_jobs
            .set(saturating_i64(report.totals.pending_jobs));
        self.running_jobs
            .set(saturating_i64(report.totals.running_jobs));
        self.gpus
            .with_label_values(&["capacity"])
            .set(saturating_i64(report.totals.gpu_capacity));
        self.gpus
            .with_label_values(&["allocated"])
            .set(saturating_i64(report.totals.gpus_allocated));
        let ratio = if report.totals.gpu_capacity == 0 {
            0.0
        } else {
            report.totals.gpus_allocated as f64 / report.totals.gpu_capacity as f64
        };
        self.gpu_allocation_ratio.set(ratio);
        for kind in PendingReason::KINDS {
            let jobs = report.pending_by_reason.get(kind).copied().unwrap_or(0);
            self.pending_by_reason
                .with_label_values(&[kind])
                .set(i64::from(jobs));
        }
        self.queue_depth.reset();
        for (queue, depth) in &report.queue_depth {
            self.queue_depth
                .with_label_values(&[queue.as_str()])
                .set(i64::from(*depth));
        }
    }

    /// Records what each queue's admitted jobs hold, per flavor and resource
    /// (deleted queues leave).
    pub fn observe_queue_usage(&self, queues: &[QueueUsage]) {
        self.queue_nominal_quota.reset();
        self.queue_usage.reset();
        self.queue_borrowed.reset();
        for queue in queues {
            for held in &queue.resources {
                let labels = [
                    queue.name.as_str(),
                    held.flavor.as_str(),
                    held.resource.as_str(),
                ];
                self.queue_nominal_quota
                    .with_label_values(&labels)
                    .set(saturating_i64(held.nominal));
                self.queue_usage
                    .with_label_values(&labels)
                    .set(saturating_i64(held.used));
                self.queue_borrowed
                    .with_label_values(&labels)
                    .set(saturating_i64(held.borrowed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gpu_allocator_core::ResourceUsage;
    use prometheus::core::Collector;

    use super::*;

    fn queue(name: &str, used: u64, borrowed: u64) -> QueueUsage {
        QueueUsage {
            name: name.into(),
            pending: 0,
            admitted: 1,
            resources: vec![ResourceUsage {
                flavor: "a100".into(),
                resource: "nvidia.com/gpu".into(),
                nominal: 8,
                used,
                borrowed,
            }],
            weighted_share: 0.0,
            on_hold: false,
            drains: false,
            budget_hold: None,
        }
    }

    #[test]
    fn queue_usage_follows_the_queues_and_the_ratio_the_gpus() {
        let metrics = AllocatorMetrics::register(&Registry::new()).expect("registers");
        metrics.observe_queue_usage(&[queue("research", 12, 4), queue("prod", 8, 0)]);
        metrics.observe_queue_usage(&[queue("research", 6, 0)]);
        let labels = ["research", "a100", "nvidia.com/gpu"];
        assert_eq!(metrics.queue_usage.with_label_values(&labels).get(), 6);
        assert_eq!(metrics.queue_borrowed.with_label_values(&labels).get(), 0);
        assert_eq!(
            metrics.queue_nominal_quota.with_label_values(&labels).get(),
            8
        );
        let families = metrics.queue_usage.collect();
        assert_eq!(families[0].get_metric().len(), 1, "a deleted queue leaves");

        let mut report = CycleReport::default();
        report.totals.gpu_capacity = 16;
        report.totals.gpus_allocated = 12;
        metrics.observe_cycle(&report, 0.001);
        assert_eq!(metrics.gpu_allocation_ratio.get(), 0.75);
        report.totals.gpu_capacity = 0;
        report.totals.gpus_allocated = 0;
        metrics.observe_cycle(&report, 0.001);
        assert_eq!(metrics.gpu_allocation_ratio.get(), 0.0);
    }
}
