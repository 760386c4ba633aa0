//! The catalogue of every message type: subject, publisher, consumers and a
//! checked example. `docs/messages.md` is generated from it
//! (`cargo run -p trainyard-contracts --bin messages-doc`), and a test fails when
//! the page drifts, so the public reference is always what the code does.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::envelope::{EntityRef, Envelope, Payload};
use crate::error::ContractError;
use crate::{alerts, commands, cost, decisions, events, lifecycle, submit, worker};

/// One message type, documented.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub message_type: &'static str,
    pub version: u32,
    /// Subject with `<namespace>` / `<name>` placeholders, as published.
    pub subject_pattern: String,
    /// Subject of the example.
    pub subject: String,
    pub publisher: &'static str,
    pub consumers: &'static str,
    pub description: &'static str,
    /// The example as a complete envelope.
    pub example: Value,
}

fn entry<P: Payload>(
    publisher: &'static str,
    consumers: &'static str,
    description: &'static str,
    entity: EntityRef,
    payload: Value,
) -> Result<CatalogEntry, ContractError> {
    let typed: P =
        serde_json::from_value(payload).map_err(|source| ContractError::InvalidPayload {
            message_type: P::TYPE,
            source,
        })?;
    let placeholder_ns = if entity.namespace.is_empty() {
        ""
    } else {
        "<namespace>"
    };
    let subject_pattern = typed.subject(&EntityRef::new(placeholder_ns, "<name>", ""));
    let mut envelope = Envelope::new(publisher, entity, typed);
    // Fixed id and time keep the generated page stable.
    envelope.id = Uuid::from_u128(0x0193_8c1e_7a00_7000_8000_0000_0000_0001);
    envelope.correlation_id = envelope.id;
    envelope.time = DateTime::<Utc>::from_timestamp(1_795_000_000, 0).unwrap_or_default();
    envelope.trace_context.traceparent =
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string());
    Ok(CatalogEntry {
        message_type: P::TYPE,
        version: P::VERSION,
        subject: envelope.subject(),
        subject_pattern,
        publisher,
        consumers,
        description,
        example: serde_json::to_value(&envelope).map_err(ContractError::Encode)?,
    })
}

fn job() -> EntityRef {
    EntityRef::new(
        "ml-training",
        "bert-distributed",
        "6f1c2b9e-1d2a-4f7e-9a61-0c5d3e8b7a42",
    )
}

fn sweep() -> EntityRef {
    EntityRef::new(
        "ml-training",
        "resnet-sweep",
        "a2d4e6f8-0b1c-4d3e-8f5a-6b7c8d9e0f1a",
    )
}

fn training_job_object() -> Value {
    json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "bert-distributed", "namespace": "ml-training",
                     "uid": "6f1c2b9e-1d2a-4f7e-9a61-0c5d3e8b7a42", "resourceVersion": "81723", "generation": 1},
        "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 2, "gpusPerWorker": 2,
                 "framework": "pytorch", "networking": {"backend": "nccl", "masterPort": 29500}}
    })
}

/// Every message type Trainyard exchanges.
pub fn all() -> Result<Vec<CatalogEntry>, ContractError> {
    Ok(vec![
        entry::<events::TrainingJobChanged>(
            "watcher",
            "planner, gpu-allocator, cost-optimizer",
            "A TrainingJob was created or deleted, or changed in what its consumers act on: the spec (`metadata.generation`), labels, annotations, owners, deletion, `status.restartCount`, or it finished. The planner's own writes (its finalizer, progress, conditions, states short of the end) are not published: `trainingjob.transitioned` carries the state changes. The object is sent without `metadata.managedFields`.",
            job(),
            json!({"change": "Applied", "object": training_job_object()}),
        )?,
        entry::<events::SweepChanged>(
            "watcher",
            "hpo-tuner",
            "A Sweep was created, changed or deleted (the object without `metadata.managedFields`).",
            sweep(),
            json!({"change": "Applied", "object": {
                "apiVersion": "trainyard.dev/v1", "kind": "Sweep",
                "metadata": {"name": "resnet-sweep", "namespace": "ml-training"},
                "spec": {
                    "objective": {"metric": "accuracy", "direction": "maximize", "goal": 0.95},
                    "parameters": [{"name": "learningRate", "type": "float", "min": 0.0001, "max": 0.1, "log": true}],
                    "algorithm": {"name": "tpe"},
                    "parallelTrialCount": 2, "maxTrialCount": 20,
                    "trialTemplate": {"model": "resnet50", "dataset": "cifar10", "numWorkers": 1}
                }
            }}),
        )?,
        entry::<events::TrainingQueueChanged>(
            "watcher",
            "gpu-allocator, cost-optimizer",
            "A TrainingQueue (cluster-scoped) was created, changed or deleted.",
            EntityRef::new("", "team-a", "0c9a3b1e-55aa-4f0e-b6d1-2e3f4a5b6c7d"),
            json!({"change": "Applied", "object": {
                "apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                "metadata": {"name": "team-a"},
                "spec": {"cohort": "research", "flavors": [{"name": "a100-on-demand", "nominalQuota": 32}]}
            }}),
        )?,
        entry::<events::JobObserved>(
            "watcher",
            "planner",
            "A Kubernetes Job owned by the TrainingJob (one attempt's workers) changed.",
            job(),
            json!({"change": "Applied", "jobName": "bert-distributed-a0", "jobUid": "3e1f", "attempt": 0,
                   "suspended": false, "active": 2, "ready": 2, "succeeded": 0, "failed": 0,
                   "conditions": [], "startTime": "2026-11-21T10:00:00Z"}),
        )?,
        entry::<events::PodObserved>(
            "watcher",
            "planner",
            "A worker Pod owned by the TrainingJob changed. `waiting` is why its first waiting container has not started (`ImagePullBackOff`, `ErrImagePull`, `CreateContainerConfigError`, ...).",
            job(),
            json!({"change": "Applied", "podName": "bert-distributed-a0-1-x7k2p", "attempt": 0, "index": 1,
                   "phase": "Failed", "nodeName": "gpu-node-7", "ready": false, "restartCount": 0,
                   "termination": {"exitCode": 137, "signal": 9, "reason": "OOMKilled"}}),
        )?,
        entry::<events::JobEventObserved>(
            "watcher",
            "planner",
            "A Warning `FailedCreate` Event about a Kubernetes Job owned by the TrainingJob: the API server refused the Job's pods (a ResourceQuota exceeded, a PriorityClass that does not exist, pod security admission). The planner names it when the attempt's pods are not created within `pods_ready_timeout_seconds`.",
            job(),
            json!({"change": "Applied", "jobName": "bert-distributed-a0", "attempt": 0, "reason": "FailedCreate",
                   "message": "Error creating: pods \"bert-distributed-a0-0-x7k2p\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=2",
                   "count": 3}),
        )?,
        entry::<events::NodeObserved>(
            "watcher",
            "gpu-allocator, cost-optimizer",
            "A Node's scheduling-relevant fields changed, or what pods the gpu-allocator did not place hold on it (every pod but TrainingJob workers asking for GPUs: `gpusUsedByOtherPods`, `migUsedByOtherPods`, `cpuMillisUsedByOtherPods`, `memoryBytesUsedByOtherPods`; absent when nothing). `allocatableCpuMillis` and `allocatableMemoryBytes` are absent when the node reports none.",
            EntityRef::new("", "gpu-node-7", "d7c6b5a4-3f2e-4d1c-9b8a-7f6e5d4c3b2a"),
            json!({"change": "Applied", "allocatableGpus": 8, "mig": {},
                   "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                              "karpenter.sh/capacity-type": "spot",
                              "topology.kubernetes.io/zone": "us-east-1a"},
                   "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                   "unschedulable": false, "ready": true, "gpusUsedByOtherPods": 2,
                   "allocatableCpuMillis": 96000, "allocatableMemoryBytes": 1_099_511_627_776u64,
                   "cpuMillisUsedByOtherPods": 2500, "memoryBytesUsedByOtherPods": 4_294_967_296u64}),
        )?,
        entry::<decisions::AdmissionDecided>(
            "gpu-allocator",
            "planner, cost-optimizer, notifier",
            "The job is admitted: every worker fits now, inside quota, on the nodes in `placements`. The planner injects the selector and tolerations, pins the workers to those nodes (each to the node of its index, through a scheduling gate, when there are several), and unsuspends the Job. `capacityTypeReopened: true` (absent otherwise): a `capacityType: any` job that no node of the type in `cost.capacity` can ever hold alone, admitted on either type; the planner shows it in `status.cost`.",
            job(),
            json!({"attempt": 0, "queue": "team-a", "flavor": "a100-spot",
                   "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                   "placements": [{"index": 0, "node": "gpu-node-7", "gpus": 2}, {"index": 1, "node": "gpu-node-7", "gpus": 2}],
                   "topology": {"topology.kubernetes.io/zone": "us-east-1a"}}),
        )?,
        entry::<decisions::PendingExplained>(
            "gpu-allocator",
            "planner, notifier",
            "Why the job is still waiting; the planner writes it into status and events as `position <position> in queue <queue>: <message>`. Published again when the cause changes or the position or shortfall moved by a step (gpu-allocator README). When no node of any flavor the job may use could hold it even with the cluster empty, `unschedulable` says so: the field to change (`spec.gpusPerWorker`, `spec.resources.requests.cpu`, `spec.scheduling.nodeSelector`, ...), the largest node and its units, what does not fit and the fix; the planner then marks the job `Schedulable: False` (reason `Unschedulable`). Consumers that do not read it still get the same words in `message`.",
            job(),
            json!({"queue": "team-a", "position": 3, "flavor": "a100-spot", "gpusRequested": 4, "gpusShort": 2,
                   "message": "quota: flavor a100-spot nvidia.com/gpu: needs 4, queue can take 2 (nominal 32, in use 30); 2 short"}),
        )?,
        entry::<decisions::PreemptionDecided>(
            "gpu-allocator",
            "planner",
            "The entity job is preempted: it is told to checkpoint, then evicted after the grace period.",
            job(),
            json!({"preemptor": {"namespace": "ml-training", "name": "urgent-finetune", "uid": "9f8e"},
                   "reason": "priority", "message": "preempted by ml-training/urgent-finetune (priority 1000 > 100)",
                   "gracePeriodSeconds": 120, "evictAfter": "2026-11-21T10:02:00Z"}),
        )?,
        entry::<decisions::QueueStatusReported>(
            "gpu-allocator",
            "planner",
            "What the TrainingQueue holds and awaits, for its status: jobs pending and admitted, units used and borrowed per flavor and resource, its weighted share in thousandths, and whether it admits jobs. Published when it changes, at most every `queue_status_interval_seconds`.",
            EntityRef::new("", "team-a", ""),
            json!({"pending": 3, "admitted": 5,
                   "usage": [{"flavor": "a100-on-demand", "resource": "nvidia.com/gpu", "used": 40, "borrowed": 8},
                             {"flavor": "a100-on-demand", "resource": "nvidia.com/mig-1g.10gb", "used": 4, "borrowed": 0}],
                   "weightedShare": 250, "active": true, "reason": "Ready", "message": "admits jobs"}),
        )?,
        entry::<decisions::TrialRequested>(
            "hpo-tuner",
            "planner",
            "Create a trial: a child TrainingJob of the Sweep with these hyperparameters. With experiment tracking on, `tracking` names the MLflow run made for the trial and the server it is on (the template's `monitoring.mlflowTrackingUri` as written when the tuner's allow-list admits it, else the tuner's own); the planner sets it as the trial's `monitoring.mlflowRunId` when that is the server the trial logs to (and `mlflowTrackingUri` when the template has none), so its workers log into that run.",
            sweep(),
            json!({"trialName": "resnet-sweep-t0003", "trialIndex": 3,
                   "parameters": {"learningRate": 0.0031, "batchSize": 64, "optimizer": "adamw"},
                   "tracking": {"mlflowTrackingUri": "http://mlflow.mlflow:5000",
                                "mlflowRunId": "5c2a0f7e9b4d4e0c8a1f3b6d2e9c7a10"}}),
        )?,
        entry::<decisions::TrialStopped>(
            "hpo-tuner",
            "planner",
            "Stop a trial early; the planner stops it and marks it EarlyStopped.",
            sweep(),
            json!({"trialName": "resnet-sweep-t0003", "reason": "ASHA: below the top 1/3 at rung 3", "rung": 3}),
        )?,
        entry::<decisions::SweepProgressed>(
            "hpo-tuner",
            "planner, notifier, checkpoint-manager",
            "Sweep progress for the Sweep's status, with the objective's metric name and the Sweep's labels and `trainyard.dev/notify*` annotations for the notifier. Once `finishedReason` is set, the checkpoint-manager registers `bestTrial`'s best verified checkpoint as the Sweep's model. `trackingWarning` says why the Sweep is recorded on the tuner's own MLflow server rather than the one its trial template names; the planner writes it as the Sweep's `TrackingRedirected` condition.",
            sweep(),
            json!({"pending": 1, "running": 2, "succeeded": 5, "failed": 0, "earlyStopped": 4,
                   "bestTrial": {"trialName": "resnet-sweep-t0002", "parameters": {"learningRate": 0.0012}, "objectiveValue": 0.931},
                   "rungs": {"1": 11, "3": 6, "9": 2}, "objectiveMetric": "accuracy",
                   "labels": {"team": "vision"}}),
        )?,
        entry::<decisions::ResumePointChosen>(
            "checkpoint-manager",
            "planner",
            "Where the job's next attempt resumes from: its newest verified checkpoint. Published when a newer checkpoint is verified and again when the job leaves Running for another attempt (the reason is then the transition's). `skipped` lists newer checkpoints passed over because they are not verified; the planner records each as an Event on the job.",
            job(),
            json!({"uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-4", "epoch": 4, "step": 12000,
                   "reason": "Restarting", "verifiedBy": "trainyard-manifest",
                   "skipped": [{"uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-5", "epoch": 5, "step": 15000,
                                "reason": "incomplete: model/part-1.bin listed in trainyard-manifest.json is missing"}]}),
        )?,
        entry::<decisions::RetentionApplied>(
            "checkpoint-manager",
            "planner, the job's worker-side reporter (executor worker)",
            "Checkpoints deleted under the job's retention policy. With executor `checkpoint-manager` (object stores) they are already deleted; with `worker` (volumes the manager cannot read) the job's worker-side reporter deletes them.",
            job(),
            json!({"delete": ["s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-1"],
                   "keep": ["s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-4"],
                   "executor": "checkpoint-manager"}),
        )?,
        entry::<decisions::CheckpointVerified>(
            "checkpoint-manager",
            "planner",
            "What verification of a reported checkpoint found, and the job's checkpoint summary (latest verified, best, count) for status. A checkpoint that is not verified is never resumed from; the planner records the reason as an Event.",
            job(),
            json!({"uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-4", "epoch": 4, "step": 12000,
                   "verified": true, "method": "trainyard-manifest", "verifier": "checkpoint-manager", "checksums": true,
                   "latestVerified": {"uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-4", "epoch": 4, "step": 12000, "metrics": {"loss": 0.41}},
                   "best": {"uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-3", "epoch": 3, "step": 9000, "metrics": {"loss": 0.39}},
                   "count": 3}),
        )?,
        entry::<decisions::CheckpointIntervalAdvised>(
            "checkpoint-manager",
            "planner, the job's worker-side reporter",
            "The recommended save interval (Young/Daly: about sqrt(2 x save cost x mean time between interruptions)) from the save durations workers report and the interruptions seen on the job's queue. Applied by the worker-side reporter when `checkpoint.frequency` is `auto`; otherwise shown in status.",
            job(),
            json!({"intervalSeconds": 3180.0, "saveSeconds": 60.0, "meanSecondsBetweenInterruptions": 86400.0, "applied": true}),
        )?,
        entry::<decisions::ModelRegistered>(
            "checkpoint-manager",
            "planner",
            "The completed job's best verified checkpoint (by `checkpoint.retention.keepBest`; else its latest verified) was registered in the MLflow model registry as this version of the model, and the alias moved to it. A Sweep's trials are not registered one by one: when the Sweep finishes, its best trial's checkpoint is registered under the Sweep's model name, published about that trial. Published once per job; with `error` (and no version) when the registry refused the registration for good, e.g. an invalid model name or a volume path it cannot take as a source, naming the fix. The planner writes `status.checkpoint.modelName` and `modelVersion`, or records a `ModelRegistrationFailed` Warning Event. The registry is the one the job's `monitoring.mlflowTrackingUri` names when the checkpoint-manager's allow-list admits it, else its own; `trackingWarning` then says why, and the planner records it as a `ModelRegistryRedirected` Warning Event.",
            job(),
            json!({"modelName": "ml-training-bert-distributed", "version": "3",
                   "source": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-3",
                   "runId": "5d1c8a0e2f7b4c1e9a3b6d8f0e2c4a6b", "alias": "best"}),
        )?,
        entry::<cost::CapacityChosen>(
            "cost-optimizer",
            "gpu-allocator, planner",
            "The capacity type the job runs on, chosen on the expected cost of finishing it (runtime, rework after interruptions at the pool's rate, restarts) and its deadline risk, with every input. The gpu-allocator admits the job on nodes of that type only; the planner writes `reason` into the job's status. Published for `scheduling.capacityType: any` when the job is created and again after repeated interruptions on spot.",
            job(),
            json!({"capacityType": "spot",
                   "reason": "spot: saves 57%. spot $20.51 (10.69 h at 0.0500 reclaims/h over 1 node(s)) vs on-demand $41.60 (10.40 h); 10.00 h of work (estimate), checkpoint every 0.50 h",
                   "currency": "USD", "spotExpectedCost": 20.51, "onDemandExpectedCost": 41.6, "expectedCost": 20.51,
                   "inputs": {"workHours": 10.0, "runtimeSource": "estimate", "gpus": 4, "nodes": 1,
                              "checkpointIntervalSeconds": 1800.0, "checkpointSaveSeconds": 72.0, "restartSeconds": 360.0,
                              "spotPricePerGpuHour": 0.48, "onDemandPricePerGpuHour": 1.0,
                              "spotReclaimsPerNodeHour": 0.05, "pool": "A100-SXM4-80GB@us-east-1a", "spotInterruptions": 0}}),
        )?,
        entry::<cost::CostRecorded>(
            "cost-optimizer",
            "planner, external subscribers",
            "Money the job spent over one accounting interval: one line per node and price in force (a later catalog change does not reprice it), its accrued cost and, when its runtime is known, the estimated cost at completion. GPUs are charged on max(request, usage).",
            job(),
            json!({"queue": "team-a", "periodStart": "2026-11-21T10:00:00Z", "periodEnd": "2026-11-21T10:01:00Z",
                   "currency": "USD",
                   "lines": [{"node": "gpu-node-7", "capacityType": "spot", "gpuHours": 0.0667, "pricePerGpuHour": 1.64, "cost": 0.1093}],
                   "accruedCost": 12.4, "estimatedCost": 20.5}),
        )?,
        entry::<cost::BudgetStatusReported>(
            "cost-optimizer",
            "gpu-allocator, planner",
            "A TrainingQueue's spend in its current budget period. `Held`: the gpu-allocator admits no new job of the queue; `Suspended`: it also has the queue's running jobs checkpointed and suspended. Published when the state changes and every accounting interval while the spend moves.",
            EntityRef::new("", "team-a", ""),
            json!({"state": "Open", "periodStart": "2026-11-01T00:00:00Z", "spent": 810.0, "amount": 1000.0,
                   "currency": "USD", "message": "81% of the Monthly budget spent"}),
        )?,
        entry::<cost::IdleSuspendRequested>(
            "cost-optimizer",
            "planner",
            "The job's GPUs stayed idle past its queue's idle window and grace: the planner checkpoints it, verifies the checkpoint and suspends it (never kills it). Resuming is setting `spec.suspend: false`.",
            job(),
            json!({"attempt": 0, "idleSince": "2026-11-21T10:02:00Z", "utilization": 0.01,
                   "message": "GPUs idle (1% < 5%) since 2026-11-21T10:02:00Z"}),
        )?,
        entry::<worker::ProgressReported>(
            "training workers (any framework; external)",
            "planner, hpo-tuner",
            "Training progress of one worker: epoch, step and metrics.",
            job(),
            json!({"workerIndex": 0, "attempt": 0, "epoch": 2, "totalEpochs": 10, "step": 5400,
                   "metrics": {"loss": 0.45, "accuracy": 0.89}}),
        )?,
        entry::<worker::CheckpointReported>(
            "training workers (any framework; external)",
            "checkpoint-manager, cost-optimizer, planner",
            "A worker committed a checkpoint (its completion marker written last). `saveSeconds` feeds the interval advice; `verifiedBy` says how the worker checked it complete, which counts only for volumes the checkpoint-manager cannot read.",
            job(),
            json!({"workerIndex": 0, "attempt": 0, "epoch": 4, "step": 12000,
                   "uri": "s3://ml-checkpoints/ml-training/bert-distributed/checkpoint-epoch-4",
                   "sizeBytes": 1_340_000_000u64, "metrics": {"loss": 0.41},
                   "saveSeconds": 42.5, "verifiedBy": "trainyard-manifest", "checksumsVerified": true}),
        )?,
        entry::<cost::UtilizationReported>(
            "training workers (any framework; external)",
            "cost-optimizer",
            "GPU utilisation of one worker (0..1, mean over its GPUs, from NVML) and what it is doing (`starting`, `loadingData`, `training`, `checkpointing`), for idle detection.",
            job(),
            json!({"workerIndex": 0, "attempt": 0, "gpuUtilization": 0.87, "phase": "training"}),
        )?,
        entry::<commands::CheckpointRequested>(
            "planner",
            "training workers",
            "Write a checkpoint now; the workers are stopped at the deadline.",
            job(),
            json!({"reason": "preempted by ml-training/urgent-finetune", "deadline": "2026-11-21T10:02:00Z"}),
        )?,
        entry::<commands::CheckpointIntervalSet>(
            "planner",
            "training workers",
            "Save checkpoints this many seconds apart (checkpoint.frequency: auto); sent when the checkpoint-manager's advice changes.",
            job(),
            json!({"intervalSeconds": 1800.0}),
        )?,
        entry::<commands::StopRequested>(
            "planner",
            "training workers",
            "Stop training (early stop, success policy met).",
            job(),
            json!({"reason": "successPolicy.targetAccuracy 0.95 reached"}),
        )?,
        entry::<alerts::AlertRaised>(
            "any service",
            "notifier",
            "Something a person should know; the subject carries the severity.",
            job(),
            json!({"alertname": "TrainingJobFailed", "severity": "critical",
                   "summary": "ml-training/bert-distributed failed", "description": "exit code 1 (permanent) on worker 0",
                   "labels": {"team": "nlp"}}),
        )?,
        entry::<alerts::BudgetThresholdCrossed>(
            "cost-optimizer",
            "notifier",
            "A TrainingQueue's spend crossed a threshold of its budget (within one accounting interval). The entity is the queue; the subject carries the severity (`warning` below 100 %, `critical` at the limit).",
            EntityRef::new("", "team-a", ""),
            json!({"severity": "warning", "thresholdPercent": 80, "spent": 810.0, "budget": 1000.0,
                   "currency": "USD", "queue": "team-a",
                   "message": "queue team-a spent 81% of its Monthly budget (810.00 of 1000.00 USD) in the period from 2026-11-01T00:00:00+00:00"}),
        )?,
        entry::<alerts::GpusIdle>(
            "cost-optimizer",
            "notifier",
            "GPUs held but idle: below the queue's threshold for its window, never while starting, loading data or checkpointing. The entity is the job holding them (or a node). The message says whether the queue's policy suspends the job next.",
            job(),
            json!({"severity": "warning", "gpus": 4, "idleMinutes": 30, "utilizationPercent": 1.5,
                   "queue": "team-a",
                   "message": "ml-training/bert-distributed: 4 GPUs idle (1% < 5%) since 2026-11-21T10:02:00+00:00"}),
        )?,
        entry::<alerts::CheckpointProblem>(
            "checkpoint-manager",
            "notifier",
            "A problem with a job's checkpoints. `WriteFailed` (warning): a reported checkpoint failed verification, \
             with `checkpoint.verified`'s reason; once per URI. `ResumeUnavailable`: the job left Running for another \
             attempt and none of its reported checkpoints is verified (critical: it starts from scratch), or newer ones \
             were skipped as unverified (warning, naming the step it falls back to). `RetentionFailed` (warning): a \
             checkpoint the retention policy chose could not be deleted (once per URI; retried on the next pass), or the \
             policy was refused (naming the field and the fix). `Overdue` (warning): a Running job has had no verified \
             checkpoint for longer than max(3 x its advised interval, the manager's floor); once per episode.",
            job(),
            json!({"severity": "warning", "problem": "Overdue", "lastCheckpointAgeSeconds": 7200,
                   "message": "no verified checkpoint for 1h10m while Running (allowed: 1h); the newest verified checkpoint is 2h old"}),
        )?,
        entry::<alerts::MessagesDeadLettered>(
            "any service",
            "notifier",
            "Messages went to a dead-letter subject since the last alert.",
            EntityRef::new("", "planner-events", ""),
            json!({"severity": "warning", "stream": "TRAINYARD_EVENTS", "consumer": "planner-events",
                   "category": "malformed", "count": 3, "reason": "payload is not JSON"}),
        )?,
        entry::<alerts::WebhookEndpointDisabled>(
            "notifier",
            "notifier",
            "A webhook endpoint answered 410 Gone; the notifier stopped sending to it until its configuration changes.",
            EntityRef::new("", "ci", ""),
            json!({"severity": "critical", "receiver": "ci", "status": 410,
                   "message": "webhook receiver ci answered 410 Gone; deliveries to it are off until the notifier's routes change"}),
        )?,
        entry::<submit::TrainingJobSubmitted>(
            "external systems",
            "planner",
            "Submit a TrainingJob without kubectl; the planner validates it and creates the object.",
            EntityRef::new("ml-training", "nightly-bert", ""),
            json!({"labels": {"team": "nlp"},
                   "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 2, "gpusPerWorker": 1}}),
        )?,
        entry::<submit::SubmissionResult>(
            "planner",
            "the submitter (external)",
            "The planner's answer to a submission: accepted, or rejected with the category and every problem, each naming its field (`spec.framework`, `entity.namespace`) and the fix. A submitter subscribes to its own namespace's results; it never needs the dead-letter stream.",
            EntityRef::new("ml-training", "nightly-bert", ""),
            json!({"accepted": false, "category": "invalid_spec",
                   "errors": [{"field": "spec.framework", "message": "unknown variant `mxnet`, expected one of `pytorch`, `tensorflow`, `jax`"}]}),
        )?,
        entry::<lifecycle::TrainingJobTransitioned>(
            "planner",
            "gpu-allocator, hpo-tuner, checkpoint-manager, cost-optimizer, notifier, external subscribers",
            "The TrainingJob moved to a new state. `context` carries what subscribers that never read Kubernetes need: the job's labels, its `trainyard.dev/notify*` annotations, its owning Sweep, links, the exit code and class on restarts and failures, the fix on failures, the final metrics and duration on completion (each absent when unknown).",
            job(),
            json!({"from": "Initializing", "to": "Running", "reason": "AllWorkersRunning",
                   "message": "2 of 2 workers running", "restartCount": 0, "gpus": 4, "queue": "team-a",
                   "context": {"labels": {"team": "nlp"},
                               "annotations": {"trainyard.dev/notify": "slack:#team-nlp"},
                               "links": {"tracking": "http://mlflow.mlflow:5000"}}}),
        )?,
        entry::<lifecycle::TrainingJobFinalized>(
            "planner",
            "gpu-allocator, hpo-tuner, checkpoint-manager, cost-optimizer, notifier, external subscribers",
            "The TrainingJob was deleted and everything it owned is gone.",
            job(),
            json!({"lastState": "Completed"}),
        )?,
    ])
}

/// Renders the reference page.
pub fn markdown() -> Result<String, ContractError> {
    let mut out = String::from(
        "# Trainyard message reference\n\n\
         Generated from `shared/contracts` by `cargo run -p trainyard-contracts --bin messages-doc`; do not edit.\n\n\
         Every message is a JSON envelope: `id` (UUID v7), `type`, `schemaVersion`, `source`, `time` (UTC),\n\
         `entity` (namespace, name, uid), `correlationId`, `causationId`, `traceContext` (W3C) and the typed\n\
         `payload`. Publish with the `Nats-Msg-Id` header set to the envelope id (JetStream drops duplicates\n\
         inside the duplicate window). Unknown fields are ignored; an unknown `schemaVersion` is rejected and\n\
         the message goes to the dead-letter subject with the reason.\n\n\
         Subjects end in `<namespace>.<name>` (`_` for cluster-scoped objects; a `.` inside a name is written\n\
         `_`). Partitioned streams store them with a partition token after the kind\n\
         (`trainyard.events.pod.7.ml-training.bert`), computed by the NATS server from namespace and name, so\n\
         publishers never compute it; filter with `trainyard.events.pod.*.<namespace>.<name>` or `trainyard.events.pod.>`.\n\n",
    );
    out.push_str("## Streams\n\nEach stream holds at most its byte limit (the default below, or `nats.stream_max_bytes.<family>` in the runtime configuration). When full, a stream that discards `old` drops its oldest messages; one that discards `new` refuses the publish, and the publisher gets an error and retries, so nothing stored is lost.\n\n| stream | subjects | partitioned | default max bytes | when full, discard | holds |\n|---|---|---|---|---|---|\n");
    for stream in crate::streams::ALL {
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} MiB | {} | {} |\n",
            stream.name,
            stream.subjects().join("`, `"),
            if stream.partitioned { "yes" } else { "no" },
            stream.default_max_bytes / (1024 * 1024),
            stream.discard.as_str(),
            stream.description
        ));
    }
    out.push_str("\nDead letters: `trainyard.deadletter.<stream>.<consumer>`, a JSON record with the original subject, body, headers, delivery count, category and reason (header `Trainyard-Dead-Letter-Reason`).\n");
    out.push_str(
        "\n## Durable consumers\n\n| service | durable | stream | filters |\n|---|---|---|---|\n",
    );
    for service in crate::streams::Service::ALL {
        for consumer in service.consumers() {
            out.push_str(&format!(
                "| {} | `{}` | `{}` | `{}` |\n",
                service.name(),
                consumer.durable,
                consumer.stream.name,
                consumer.filter_subjects.join("`, `")
            ));
        }
    }
    out.push_str("\n## Key-value buckets\n\n| service | bucket |\n|---|---|\n");
    for service in crate::streams::Service::ALL {
        for bucket in service.buckets() {
            out.push_str(&format!("| {} | `{}` |\n", service.name(), bucket.name()));
        }
    }
    out.push_str("\n## Messages\n");
    for entry in all()? {
        let example =
            serde_json::to_string_pretty(&entry.example).map_err(ContractError::Encode)?;
        out.push_str(&format!(
            "\n### `{}` (v{})\n\n{}\n\n- subject: `{}`\n- published by: {}\n- consumed by: {}\n\n```json\n{}\n```\n",
            entry.message_type,
            entry.version,
            entry.description,
            entry.subject_pattern,
            entry.publisher,
            entry.consumers,
            example
        ));
    }
    Ok(out)
}
