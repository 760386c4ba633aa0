//! The cost-optimizer: chooses spot or on-demand for `capacityType: any`
//! jobs on the expected cost of finishing them, prices every GPU-second at
//! the price in force, tracks TrainingQueue budgets and catches idle GPUs.
//! The decisions are made by [`state::CostState`] on top of
//! `cost-optimizer-core`; this crate feeds it messages and the clock and
//! publishes what it returns. The state is saved in the `trainyard_cost`
//! bucket, one value per job, node and queue ([`store`]), after every
//! change, utilisation reports coalesced
//! ([`CostConfig::state_save_interval_ms`]).

pub mod config;
pub mod dcgm;
pub mod error;
pub mod state;
pub mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use chrono::Utc;
use cost_optimizer_core::PriceCatalog;
use prometheus::{CounterVec, IntCounter, Opts};
use tokio::sync::Mutex;
use tracing::Instrument;
use trainyard_contracts::cost::UtilizationReported;
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::events::{Change, NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::lifecycle::{TrainingJobFinalized, TrainingJobTransitioned};
use trainyard_contracts::worker::CheckpointReported;
use trainyard_contracts::{Bucket, Incoming, Service};
use trainyard_runtime::{ConfigSources, Delivery, HandleError, Handler, Publisher, Runtime};

pub use config::{CostConfig, UtilizationSource};
pub use error::CostServiceError;
use state::{CostState, Outgoing};
use store::{StateStore, Written};

/// The running service.
pub struct CostOptimizer {
    state: Mutex<CostState>,
    publisher: Publisher,
    /// Held from taking the state's changes to their writes, so saves reach
    /// the bucket in the order the state changed.
    store: Mutex<StateStore>,
    dollars: CounterVec,
    /// Where GPU activity comes from when it is DCGM's.
    dcgm: Option<dcgm::DcgmSource>,
    /// Accounting runs whose DCGM query failed (no idle decisions then).
    dcgm_failures: IntCounter,
    /// Utilisation reports (or a failed save's values) are in the state but
    /// not yet in the bucket.
    unsaved: AtomicBool,
    saves: IntCounter,
}

fn load_catalog(path: &str) -> Result<PriceCatalog, CostServiceError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CostServiceError::Catalog(format!("price catalog {path}: {e}")))?;
    PriceCatalog::parse(&text).map_err(|e| CostServiceError::Catalog(format!("{path}: {e}")))
}

/// Service setup: reads the `cost_optimizer` section and starts the service.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), CostServiceError> {
    start(runtime, sources.section("cost_optimizer")?).await?;
    Ok(())
}

/// Competes for the cost-optimizer's lease; once this replica holds it, loads
/// the saved state and the catalog, then starts the consumers and the
/// accounting loop. One replica decides at a time: the state is kept in
/// memory and saved as it changes. The catalog watcher runs on every replica.
pub async fn start(
    runtime: &Runtime,
    config: CostConfig,
) -> Result<Arc<CostOptimizer>, CostServiceError> {
    let bucket = runtime.bucket(Bucket::Cost).cloned().ok_or_else(|| {
        CostServiceError::Store("bucket trainyard_cost was not provisioned".into())
    })?;
    let lease = runtime.lease()?;
    let dcgm = match config.utilization_source {
        UtilizationSource::Worker => None,
        UtilizationSource::Dcgm => Some(dcgm::DcgmSource::new(&config.prometheus_url)?),
    };
    let dcgm_failures = IntCounter::new(
        "trainyard_cost_dcgm_query_failures_total",
        "Accounting runs whose GPU activity query to Prometheus (DCGM) failed; no job was judged idle in them",
    )
    .map_err(trainyard_runtime::metrics::metric_error)?;
    runtime
        .registry
        .register(Box::new(dcgm_failures.clone()))
        .map_err(trainyard_runtime::metrics::metric_error)?;
    let saves = IntCounter::new(
        "trainyard_cost_state_saves_total",
        "Saves of the cost-optimizer's state to the trainyard_cost bucket (each writes the values changed since the last)",
    )
    .map_err(trainyard_runtime::metrics::metric_error)?;
    runtime
        .registry
        .register(Box::new(saves.clone()))
        .map_err(trainyard_runtime::metrics::metric_error)?;
    let dollars = CounterVec::new(
        Opts::new(
            "trainyard_cost_dollars_total",
            "Money spent on GPUs by TrainingJobs, by namespace, queue and capacity type (spot, on-demand, reserved), in the catalog's currency",
        ),
        &["namespace", "queue", "capacity_type"],
    )
    .map_err(trainyard_runtime::metrics::metric_error)?;
    runtime
        .registry
        .register(Box::new(dollars.clone()))
        .map_err(trainyard_runtime::metrics::metric_error)?;
    let service = Arc::new(CostOptimizer {
        state: Mutex::new(CostState::new(config.clone())),
        publisher: runtime.publisher.clone(),
        store: Mutex::new(StateStore::new(bucket, lease.clone())),
        dollars,
        dcgm,
        dcgm_failures,
        unsaved: AtomicBool::new(false),
        saves,
    });
    let leading = service.clone();
    let consumers = runtime.consumers();
    let shutdown = runtime.shutdown.clone();
    let restoring = config.clone();
    let interval = Duration::from_secs(config.accounting_interval_seconds.max(1));
    let save_interval = Duration::from_millis(config.state_save_interval_ms.max(1));
    runtime.spawn(async move {
        let token = tokio::select! {
            _ = shutdown.cancelled() => None,
            token = lease.acquired() => token,
        };
        if token.is_none() {
            return;
        }
        if let Err(err) = leading.restore(&restoring).await {
            tracing::error!(error = %err, "saved state unreadable; stopping so that a restart tries again");
            shutdown.cancel();
            return;
        }
        for spec in Service::CostOptimizer.consumers() {
            consumers.spawn(spec, leading.clone());
        }
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut saver = tokio::time::interval(save_interval);
        saver.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = timer.tick() => {
                    if let Err(err) = leading.tick().await {
                        tracing::warn!(error = %err, "accounting run failed; retried next interval");
                    }
                }
                _ = saver.tick() => {
                    if let Err(err) = leading.save_unsaved().await {
                        tracing::warn!(error = %err, "utilisation reports not saved; retried next interval");
                    }
                }
            }
        }
        if let Err(err) = leading.save_unsaved().await {
            tracing::error!(error = %err, "utilisation reports since the last save not saved at shutdown");
        }
    });
    let watching = service.clone();
    let shutdown = runtime.shutdown.clone();
    let path = config.catalog_path.clone();
    let every = Duration::from_secs(config.catalog_reload_seconds.max(1));
    runtime.spawn(async move {
        let modified = |p: &str| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut seen: Option<SystemTime> = modified(&path);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(every) => {}
            }
            let now = modified(&path);
            if now == seen {
                continue;
            }
            seen = now;
            match load_catalog(&path) {
                Ok(catalog) => {
                    tracing::info!(path, "price catalog reloaded");
                    watching.state.lock().await.set_catalog(catalog);
                }
                Err(err) => {
                    tracing::error!(error = %err, "price catalog not reloaded; the last good one stays in force");
                }
            }
        }
    });
    Ok(service)
}

impl CostOptimizer {
    /// Replaces the state with the saved one (a fresh one when nothing is
    /// saved) and gives it the catalog, when readable: what the lease holder
    /// starts from.
    async fn restore(&self, config: &CostConfig) -> Result<(), CostServiceError> {
        let saved = self.store.lock().await.load(config).await?;
        let mut state = saved.unwrap_or_else(|| CostState::new(config.clone()));
        // Without a catalog nothing can be priced or chosen; the service
        // still runs and picks the catalog up as soon as the file appears.
        match load_catalog(&config.catalog_path) {
            Ok(catalog) => state.set_catalog(catalog),
            Err(err) => {
                tracing::error!(error = %err, "no price catalog: nothing is priced until it is readable");
            }
        }
        *self.state.lock().await = state;
        Ok(())
    }

    /// One accounting run now; with DCGM as the source, after reading the
    /// GPU activity. A failed read is logged and counted, and leaves every
    /// job without an idle decision this run.
    pub async fn tick(&self) -> Result<(), CostServiceError> {
        if let Some(source) = &self.dcgm {
            match source.activity().await {
                Ok(activity) => self.state.lock().await.observe_activity(&activity),
                Err(err) => {
                    self.dcgm_failures.inc();
                    tracing::warn!(error = %err, "GPU activity unavailable: no idle decisions in this accounting run");
                }
            }
        }
        let out = {
            let mut state = self.state.lock().await;
            state.tick(Utc::now())
        };
        self.finish(out).await
    }

    /// Saves what changed in the state since the last save.
    async fn save(&self) -> Result<(), CostServiceError> {
        let mut store = self.store.lock().await;
        let changes = {
            let mut state = self.state.lock().await;
            // Whatever was unsaved is in these values.
            self.unsaved.store(false, Ordering::SeqCst);
            state
                .take_changed_values()
                .map_err(|e| CostServiceError::Store(format!("encode the state: {e}")))?
        };
        match store.save(changes).await {
            Ok(written) => {
                if written != Written::default() {
                    self.saves.inc();
                }
                Ok(())
            }
            Err(err) => {
                self.unsaved.store(true, Ordering::SeqCst);
                Err(err)
            }
        }
    }

    /// Saves the state if utilisation reports changed it since the last save.
    async fn save_unsaved(&self) -> Result<(), CostServiceError> {
        if self.unsaved.load(Ordering::SeqCst) {
            self.save().await?;
        }
        Ok(())
    }

    /// Saves the state, then counts and publishes `out`.
    async fn finish(&self, out: Vec<Outgoing>) -> Result<(), CostServiceError> {
        self.save().await?;
        // Every cost line is recorded once (the ledger moves past it), so the
        // counter adds each line as it goes out.
        for message in &out {
            if let Outgoing::Cost(entity, record) = message {
                for line in record.lines.iter().filter(|l| l.cost > 0.0) {
                    self.dollars
                        .with_label_values(&[
                            entity.namespace.as_str(),
                            record.queue.as_str(),
                            line.capacity_type.as_str(),
                        ])
                        .inc_by(line.cost);
                }
            }
        }
        for message in out {
            self.publish(message).await?;
        }
        Ok(())
    }

    async fn publish(&self, message: Outgoing) -> Result<(), CostServiceError> {
        let p = &self.publisher;
        match message {
            Outgoing::Capacity(e, m) => p.publish(p.envelope(e, m)).await?,
            Outgoing::Cost(e, m) => p.publish(p.envelope(e, m)).await?,
            Outgoing::Budget(e, m) => p.publish(p.envelope(e, m)).await?,
            Outgoing::BudgetAlert(e, m) => p.publish(p.envelope(e, m)).await?,
            Outgoing::Idle(e, m) => p.publish(p.envelope(e, m)).await?,
            Outgoing::IdleSuspend(e, m) => p.publish(p.envelope(e, m)).await?,
        };
        Ok(())
    }

    async fn apply(&self, message: &Incoming) -> Result<Vec<Outgoing>, HandleError> {
        let entity = &message.header.entity;
        let at = message.header.time;
        let mut state = self.state.lock().await;
        Ok(if message.is::<NodeObserved>() {
            let node: NodeObserved = message.payload()?;
            state.on_node(&entity.name, &node, at)
        } else if message.is::<TrainingQueueChanged>() {
            let queue: TrainingQueueChanged = message.payload()?;
            let object = (queue.change == Change::Applied).then_some(&queue.object);
            state.on_queue(&entity.name, object);
            Vec::new()
        } else if message.is::<TrainingJobChanged>() {
            let job: TrainingJobChanged = message.payload()?;
            let object = (job.change == Change::Applied).then_some(&job.object);
            state.on_job(entity, object, at)
        } else if message.is::<AdmissionDecided>() {
            let admission: AdmissionDecided = message.payload()?;
            state.on_admission(entity, &admission, at);
            Vec::new()
        } else if message.is::<TrainingJobTransitioned>() {
            let t: TrainingJobTransitioned = message.payload()?;
            let released = t.to.is_terminal() || t.to == trainyard_api::TrainingJobState::Suspended;
            if released {
                state.on_released(entity, t.to.is_terminal(), at)
            } else {
                Vec::new()
            }
        } else if message.is::<TrainingJobFinalized>() {
            state.on_job(entity, None, at)
        } else if message.is::<CheckpointReported>() {
            state.on_checkpoint(entity, at);
            Vec::new()
        } else if message.is::<UtilizationReported>() {
            let report: UtilizationReported = message.payload()?;
            state.on_utilization(entity, &report);
            Vec::new()
        } else {
            Vec::new()
        })
    }
}

impl Handler for CostOptimizer {
    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let span = tracing::info_span!(
            "cost",
            namespace = %message.header.entity.namespace,
            name = %message.header.entity.name,
            message_type = %message.header.message_type
        );
        async {
            let out = self.apply(&message).await?;
            // A report only replaces the last one of its worker (and
            // publishes nothing): it waits for the next save.
            if message.is::<UtilizationReported>() && out.is_empty() {
                self.unsaved.store(true, Ordering::SeqCst);
                return Ok(());
            }
            self.finish(out)
                .await
                .map_err(|e| HandleError::Retry(e.to_string()))
        }
        .instrument(span)
        .await
    }
}
