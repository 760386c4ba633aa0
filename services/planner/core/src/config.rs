//! What the planner knows about its installation rather than about one job.
//!
//! The planner binary reads this from the `[planner]` section of its configuration
//! (every field has a default), so the core itself never touches the environment.

use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_contracts::backoff::capped_doubling;

use serde::{Deserialize, Serialize};
use trainyard_api::Framework;

/// Installation-wide settings of the planner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlannerConfig {
    /// Server-side-apply field manager for every object the planner writes.
    pub field_manager: String,
    /// NATS URL the workers report progress and checkpoints to (`TRAINYARD_NATS_URL`);
    /// it must resolve from the job's namespace, hence the fully qualified default.
    pub worker_nats_url: String,
    /// Labels added to every object, e.g. `app.kubernetes.io/part-of: ml-platform`.
    /// Trainyard's own labels win on a clash.
    pub extra_labels: BTreeMap<String, String>,
    /// Images used when `spec.image` is unset.
    pub default_images: FrameworkImages,
    /// GPUs of the largest GPU node; a job asking for more per worker can never run and
    /// fails before any object is created. Unset: not checked.
    pub largest_node_gpus: Option<u32>,
    /// Seconds between SIGTERM and SIGKILL for a worker pod: the time workers get to
    /// write a checkpoint when they are suspended, preempted or stopped.
    pub termination_grace_period_seconds: u32,
    /// Seconds the workers get to exit on their own after a Stop command (success
    /// policy met, trial stopped early) before their Job is deleted.
    pub stop_grace_period_seconds: u32,
    /// Delay before the first restart after a failure; doubles with every further restart.
    pub restart_backoff_initial_seconds: u32,
    /// Longest delay between restarts.
    pub restart_backoff_max_seconds: u32,
    /// Seconds a finished Job (and its pods, with their logs) is kept before Kubernetes
    /// deletes it (`ttlSecondsAfterFinished`). Unset: kept until the TrainingJob goes.
    pub finished_job_ttl_seconds: Option<u32>,
    /// TrainingJobs reconciled at once per consumer (their Kubernetes round trips
    /// overlap); messages about one job are always handled in order.
    pub parallel_jobs: usize,
    /// Seconds a finished TrainingJob stays in the planner's memory after its
    /// last message (its state stays in the KV bucket either way).
    pub finished_entry_ttl_seconds: u32,
    /// Least time between two status writes of one TrainingJob when the later
    /// one changes no state and no condition (progress, metrics, worker counts):
    /// such a change waits and goes out with the next write. A busy job then
    /// costs the API server (and every watcher) a write per interval, not one
    /// per report. 0 writes every change at once.
    pub min_status_interval_ms: u64,
    /// Seconds an admitted worker may stay unschedulable (the scheduler found
    /// no node for it: GPUs taken by something the gpu-allocator could not
    /// see, a node gone since admission) before the attempt gives its
    /// admission back and queues again, as Kueue's `waitForPodsReady` does;
    /// only time without a node counts, not image pulls. 0: never.
    pub unschedulable_timeout_seconds: u32,
    /// Seconds an admitted attempt's workers may take to all run, from the
    /// moment its Job is seen unsuspended, as Kueue's `waitForPodsReady`:
    /// past it, the attempt's Job is deleted, its GPUs are given back and the
    /// job queues again after a backoff (`PodsReady` condition False,
    /// `PodsNotCreated` or `PodsNotReady`). 0: never.
    pub pods_ready_timeout_seconds: u32,
    /// Requeues for pods that were not ready in time before the job fails
    /// (counted in a row; an attempt whose workers all run resets the count).
    pub pods_ready_requeue_limit: u32,
    /// Namespaces TrainingJobs may be submitted into over NATS. Empty: any but
    /// the system namespaces (kube-system, kube-public, kube-node-lease,
    /// trainyard-system), which are always refused.
    pub submit_namespaces: Vec<String>,
    /// Worker pods must run as a non-root user (`runAsNonRoot`). Off by default
    /// because the common framework images run as root; turn it on when the
    /// installation's images set a non-root user.
    pub worker_run_as_non_root: bool,
    /// Storage class of the checkpoint claim made for jobs that name no
    /// checkpoint storage. Unset: the cluster's default class.
    pub checkpoint_storage_class: Option<String>,
    /// Size of that claim, a Kubernetes quantity.
    pub checkpoint_volume_size: String,
    /// File holding the NATS account nkey seed (`SA...`) the planner signs
    /// worker tokens and auth callout answers with. Set: every admitted
    /// attempt gets a Secret `<job>-nats` with its workers' token
    /// (`TRAINYARD_NATS_TOKEN`) and the planner answers nats-server's auth
    /// callout. Unset: workers get no token.
    pub worker_credentials_seed_file: Option<String>,
    /// File holding the CA bundle (PEM) that signed the NATS server's
    /// certificate, read when the planner starts. Set: each attempt's
    /// credentials Secret carries it as `ca.crt`, its workers find it at
    /// `TRAINYARD_NATS_CA_FILE` and verify `worker_nats_url` (`tls://`) with
    /// it. Needs `worker_credentials_seed_file`, whose Secret carries it.
    pub worker_nats_ca_file: Option<String>,
    /// Seconds a worker token is valid from the attempt's admission; a job
    /// whose `failurePolicy.activeDeadlineSeconds` is longer gets that plus an
    /// hour.
    pub worker_token_lifetime_seconds: u64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            field_manager: "trainyard-planner".to_owned(),
            worker_nats_url: "nats://nats.trainyard-system.svc:4222".to_owned(),
            extra_labels: BTreeMap::new(),
            default_images: FrameworkImages::default(),
            largest_node_gpus: None,
            termination_grace_period_seconds: 120,
            stop_grace_period_seconds: 300,
            restart_backoff_initial_seconds: 10,
            restart_backoff_max_seconds: 300,
            finished_job_ttl_seconds: Some(86_400),
            parallel_jobs: 16,
            finished_entry_ttl_seconds: 30,
            min_status_interval_ms: 1_000,
            unschedulable_timeout_seconds: 300,
            pods_ready_timeout_seconds: 300,
            pods_ready_requeue_limit: 3,
            submit_namespaces: Vec::new(),
            worker_run_as_non_root: false,
            checkpoint_storage_class: None,
            checkpoint_volume_size: "100Gi".to_owned(),
            worker_credentials_seed_file: None,
            worker_nats_ca_file: None,
            worker_token_lifetime_seconds: 7 * 86_400,
        }
    }
}

impl PlannerConfig {
    /// Delay before a restart when `previous_failures` failed attempts were already
    /// restarted: initial, 2×initial, 4×initial, ... capped at the maximum
    /// (10s, 20s, 40s, ... 5m with the defaults).
    pub fn restart_backoff(&self, previous_failures: u32) -> Duration {
        capped_doubling(
            Duration::from_secs(u64::from(self.restart_backoff_initial_seconds)),
            previous_failures,
            Duration::from_secs(u64::from(self.restart_backoff_max_seconds)),
        )
    }
}

/// Default worker image per framework.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FrameworkImages {
    pub pytorch: String,
    pub tensorflow: String,
    pub jax: String,
}

impl Default for FrameworkImages {
    fn default() -> Self {
        Self {
            pytorch: "ghcr.io/trainyard/trainer-pytorch:0.1.0".to_owned(),
            tensorflow: "ghcr.io/trainyard/trainer-tensorflow:0.1.0".to_owned(),
            jax: "ghcr.io/trainyard/trainer-jax:0.1.0".to_owned(),
        }
    }
}

impl FrameworkImages {
    /// The image for `framework`.
    pub fn for_framework(&self, framework: Framework) -> &str {
        match framework {
            Framework::Pytorch => &self.pytorch,
            Framework::Tensorflow => &self.tensorflow,
            Framework::Jax => &self.jax,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_backoff_doubles_and_caps_at_five_minutes() {
        let config = PlannerConfig::default();
        let delays: Vec<u64> = (0..8)
            .map(|n| config.restart_backoff(n).as_secs())
            .collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(config.restart_backoff(u32::MAX).as_secs(), 300);
    }
}
