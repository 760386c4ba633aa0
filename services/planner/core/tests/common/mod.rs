//! Fixtures shared by the planner-core tests: TrainingJobs, messages, and a harness that
//! plays the planner shell (it folds observations, runs `decide`, and carries out the
//! actions on an in-memory record of what the cluster and NATS would have seen).

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use planner_core::{
    DesiredObjects, EventType, Observation, Observed, PlannerAction, PlannerCommand, PlannerConfig,
    PlannerJobState, decide, observe,
};
use trainyard_api::{TrainingJob, TrainingJobSpec, TrainingJobState, TrainingJobStatus};
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::{
    AdmissionDecided, PendingExplained, PreemptionDecided, ResumePointChosen, TolerationSpec,
    WorkerPlacement,
};
use trainyard_contracts::events::{
    Change, ContainerTermination, JobObserved, ObservedCondition, PodObserved,
};
use trainyard_contracts::lifecycle::TrainingJobTransitioned;
use trainyard_contracts::worker::{CheckpointReported, ProgressReported};

/// Namespace of fixtures whose YAML has none.
pub const NAMESPACE: &str = "ml-training";

/// A fixed start time, so every run of the tests computes the same statuses.
pub fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600, 0).unwrap() // 2026-01-01T00:00:00Z
}

/// Gives a parsed TrainingJob what the apiserver would: namespace, uid, generation.
pub fn as_stored(mut job: TrainingJob) -> TrainingJob {
    let name = job.metadata.name.clone().unwrap_or_default();
    job.metadata
        .namespace
        .get_or_insert_with(|| NAMESPACE.to_owned());
    job.metadata
        .uid
        .get_or_insert_with(|| format!("uid-{name}"));
    job.metadata.generation.get_or_insert(1);
    job
}

/// A TrainingJob named `name` with `spec`, as stored.
pub fn training_job(name: &str, spec: TrainingJobSpec) -> TrainingJob {
    as_stored(TrainingJob {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    })
}

/// A minimal valid spec: `workers` workers with one GPU each.
pub fn spec(workers: u32) -> TrainingJobSpec {
    TrainingJobSpec {
        model: "resnet50".into(),
        dataset: "imagenet".into(),
        num_workers: workers,
        gpus_per_worker: Some(1),
        ..TrainingJobSpec::default()
    }
}

/// Reads a YAML TrainingJob.
pub fn parse_training_job(yaml: &str) -> TrainingJob {
    as_stored(yaml_serde::from_str(yaml).unwrap())
}

/// An admission of `attempt` onto A100 nodes.
pub fn admission(attempt: u32, workers: u32) -> AdmissionDecided {
    AdmissionDecided {
        attempt,
        queue: "default".into(),
        flavor: "a100-80gb".into(),
        node_selector: BTreeMap::from([(
            "nvidia.com/gpu.product".to_owned(),
            "A100-SXM4-80GB".to_owned(),
        )]),
        tolerations: vec![TolerationSpec {
            key: "trainyard.dev/capacity-type".into(),
            operator: "Equal".into(),
            value: Some("on-demand".into()),
            effect: Some("NoSchedule".into()),
        }],
        placements: (0..workers)
            .map(|index| WorkerPlacement {
                index,
                node: format!("gpu-node-{index}"),
                gpus: 1,
            })
            .collect(),
        topology: BTreeMap::new(),
        capacity_type_reopened: false,
    }
}

pub fn pending(position: u32) -> PendingExplained {
    PendingExplained {
        attempt: None,
        queue: "default".into(),
        position,
        flavor: Some("a100-80gb".into()),
        gpus_requested: 2,
        gpus_short: 2,
        message: "queue default flavor a100-80gb: 16 of 16 GPUs in use, needs 2 more".into(),
        unschedulable: None,
        pod_policy: None,
    }
}

pub fn condition(condition_type: &str, reason: &str) -> ObservedCondition {
    ObservedCondition {
        condition_type: condition_type.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: None,
    }
}

/// The Job of `attempt` as the watcher reports it.
pub fn job_event(name: &str, attempt: u32, suspended: bool, active: u32) -> JobObserved {
    JobObserved {
        change: Change::Applied,
        job_name: format!("{name}-a{attempt}"),
        job_uid: format!("job-uid-{attempt}"),
        attempt,
        suspended,
        active,
        ready: 0,
        succeeded: 0,
        failed: 0,
        conditions: Vec::new(),
        start_time: None,
        completion_time: None,
    }
}

pub fn pod_event(name: &str, attempt: u32, index: u32, phase: &str) -> PodObserved {
    PodObserved {
        change: Change::Applied,
        pod_name: format!("{name}-a{attempt}-{index}-abcde"),
        attempt,
        index,
        phase: phase.into(),
        node_name: Some(format!("gpu-node-{index}")),
        scheduling_gates: Vec::new(),
        ready: phase == "Running",
        restart_count: 0,
        termination: None,
        conditions: Vec::new(),
        waiting: None,
    }
}

pub fn pod_failed(name: &str, attempt: u32, index: u32, exit_code: i32) -> PodObserved {
    PodObserved {
        termination: Some(ContainerTermination {
            exit_code,
            signal: None,
            reason: Some(
                if exit_code == 137 {
                    "OOMKilled"
                } else {
                    "Error"
                }
                .into(),
            ),
            message: None,
        }),
        ready: false,
        ..pod_event(name, attempt, index, "Failed")
    }
}

pub fn progress(
    attempt: u32,
    worker: u32,
    epoch: u32,
    metrics: &[(&str, f64)],
) -> ProgressReported {
    ProgressReported {
        worker_index: worker,
        attempt,
        epoch,
        total_epochs: None,
        step: u64::from(epoch) * 100,
        metrics: metrics.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    }
}

/// The checkpoint-manager's resume point once it verified `report`.
pub fn verified_resume_point(report: &CheckpointReported) -> ResumePointChosen {
    ResumePointChosen {
        uri: report.uri.clone(),
        epoch: report.epoch,
        step: report.step,
        reason: "Verified".into(),
        verified_by: Some(trainyard_contracts::worker::VerificationMethod::TrainyardManifest),
        skipped: Vec::new(),
    }
}

pub fn checkpoint(attempt: u32, epoch: u32) -> CheckpointReported {
    CheckpointReported {
        worker_index: 0,
        attempt,
        epoch,
        step: u64::from(epoch) * 100,
        uri: format!("s3://ml-checkpoints/run/checkpoint-epoch-{epoch}"),
        size_bytes: 1 << 20,
        metrics: BTreeMap::new(),
        ..CheckpointReported::default()
    }
}

pub fn preemption(evict_after: DateTime<Utc>) -> PreemptionDecided {
    PreemptionDecided {
        preemptor: EntityRef::new("ml-training", "urgent-job", "uid-urgent"),
        reason: "priority".into(),
        message: "urgent-job (priority 1000) needs 2 GPUs of flavor a100-80gb".into(),
        grace_period_seconds: 60,
        evict_after,
    }
}

/// Plays the planner shell against an in-memory record of its effects.
pub struct Harness {
    pub job: TrainingJob,
    pub state: PlannerJobState,
    pub config: PlannerConfig,
    pub now: DateTime<Utc>,
    /// Every observation with its time, in order, for replays.
    pub log: Vec<(DateTime<Utc>, Observation)>,
    /// Names of every Job ever applied.
    pub applied_jobs: BTreeSet<String>,
    /// The last objects applied.
    pub last_applied: Option<DesiredObjects>,
    pub deleted_jobs: Vec<String>,
    /// Commands actually published (JetStream drops duplicate dedup keys).
    pub commands: Vec<PlannerCommand>,
    /// Transitions actually published.
    pub transitions: Vec<TrainingJobTransitioned>,
    /// Kubernetes Events recorded: (warning, reason, message).
    pub recorded_events: Vec<(bool, String, String)>,
    published_keys: BTreeSet<String>,
}

impl Harness {
    pub fn new(job: TrainingJob) -> Self {
        Self {
            job,
            state: PlannerJobState::new(),
            config: PlannerConfig::default(),
            now: t0(),
            log: Vec::new(),
            applied_jobs: BTreeSet::new(),
            last_applied: None,
            deleted_jobs: Vec::new(),
            commands: Vec::new(),
            transitions: Vec::new(),
            recorded_events: Vec::new(),
            published_keys: BTreeSet::new(),
        }
    }

    pub fn name(&self) -> String {
        self.job.metadata.name.clone().unwrap_or_default()
    }

    pub fn observe(&mut self, observation: Observation) -> Observed {
        self.log.push((self.now, observation.clone()));
        observe(&mut self.state, self.now, observation)
    }

    /// Runs `decide` and carries out its actions.
    pub fn decide(&mut self) -> Vec<PlannerAction> {
        let actions = decide(&self.job, &self.state, self.now, &self.config);
        for action in &actions {
            match action {
                PlannerAction::ApplyObjects(objects) => {
                    self.applied_jobs.insert(objects.job_name().to_owned());
                    self.last_applied = Some((**objects).clone());
                }
                PlannerAction::DeleteJob { name } => self.deleted_jobs.push(name.clone()),
                PlannerAction::SendCommand { command, dedup_key } => {
                    if self.published_keys.insert(dedup_key.clone()) {
                        self.commands.push(command.clone());
                    }
                }
                PlannerAction::PublishTransition {
                    transition,
                    dedup_key,
                } => {
                    if self.published_keys.insert(dedup_key.clone()) {
                        self.transitions.push(transition.as_ref().clone());
                    }
                }
                PlannerAction::UpdateStatus(status) => self.job.status = Some((**status).clone()),
                PlannerAction::SuspendJob { .. } => {
                    self.job.spec.suspend = Some(true);
                    self.job.metadata.generation = self.job.metadata.generation.map(|g| g + 1);
                }
                PlannerAction::RecordEvent {
                    event_type,
                    reason,
                    message,
                } => self.recorded_events.push((
                    *event_type == EventType::Warning,
                    reason.clone(),
                    message.clone(),
                )),
                PlannerAction::RecreateAfter { .. }
                | PlannerAction::RecheckAfter { .. }
                | PlannerAction::UngateWorker { .. } => {}
            }
        }
        actions
    }

    pub fn advance(&mut self, seconds: i64) {
        self.now += TimeDelta::seconds(seconds);
    }

    pub fn status(&self) -> TrainingJobStatus {
        self.job.status.clone().unwrap_or_default()
    }

    pub fn state_now(&self) -> Option<TrainingJobState> {
        self.status().state
    }

    pub fn condition(&self, condition_type: &str) -> Option<trainyard_api::Condition> {
        trainyard_api::find_condition(&self.status().conditions, condition_type).cloned()
    }

    /// Drives attempt `attempt` from creation to all workers running.
    pub fn run_attempt_until_running(&mut self, attempt: u32) {
        let name = self.name();
        let workers = self.job.spec.num_workers;
        self.decide();
        self.observe(Observation::Job(job_event(&name, attempt, true, 0)));
        self.decide();
        self.observe(Observation::Admission(admission(attempt, workers)));
        self.decide();
        let mut started = job_event(&name, attempt, false, workers);
        started.start_time = Some(self.now);
        self.observe(Observation::Job(started));
        for index in 0..workers {
            self.observe(Observation::Pod(pod_event(
                &name, attempt, index, "Running",
            )));
        }
        self.decide();
        assert_eq!(
            self.state_now(),
            Some(TrainingJobState::Running),
            "{:?}",
            self.status()
        );
    }
}

pub fn applied(actions: &[PlannerAction]) -> Vec<&DesiredObjects> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::ApplyObjects(objects) => Some(&**objects),
            _ => None,
        })
        .collect()
}

/// The (pod, node) of each ungate in `actions`.
pub fn ungated(actions: &[PlannerAction]) -> Vec<(&str, Option<&str>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::UngateWorker { pod_name, node } => {
                Some((pod_name.as_str(), node.as_deref()))
            }
            _ => None,
        })
        .collect()
}

pub fn deleted(actions: &[PlannerAction]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            PlannerAction::DeleteJob { name } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// The Job's worker pod template.
pub fn worker_pod(objects: &DesiredObjects) -> Option<&PodSpec> {
    objects.job.spec.as_ref()?.template.spec.as_ref()
}

/// Value of a literal env var of the worker container.
pub fn env_value(objects: &DesiredObjects, name: &str) -> Option<String> {
    let pod = worker_pod(objects)?;
    let env = pod.containers.first()?.env.as_ref()?;
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
}
