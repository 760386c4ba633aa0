//! The Kubernetes objects one attempt of a TrainingJob needs: an Indexed Job for the
//! workers, a headless Service for their DNS names, and a ConfigMap with the
//! hyperparameters, the training layout and the resume point.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container,
    ContainerPort, EmptyDirVolumeSource, KeyToPath, NFSVolumeSource, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PodSchedulingGate, PodSecurityContext, PodSpec,
    PodTemplateSpec, ProjectedVolumeSource, SeccompProfile, SecretProjection, SecurityContext,
    Service, ServicePort, ServiceSpec, Toleration, Volume, VolumeMount, VolumeProjection,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;
use serde_json::json;
use trainyard_api::placement::worker_pod_labels;
use trainyard_api::trainingjob::checkpoint_volume_sub_path;
use trainyard_api::{CheckpointFrequency, StorageType, TrainingJob, TrainingJobSpec};
use trainyard_contracts::decisions::{
    AdmissionDecided, CheckpointIntervalAdvised, ResumePointChosen, TolerationSpec,
};

use crate::config::PlannerConfig;
use crate::env::{
    CHECKPOINT_INTERVAL_KEY, CONFIG_MOUNT_PATH, HYPERPARAMETERS_FILE, NATS_CA_FILE,
    RESUME_FROM_KEY, TRAINING_CONFIG_FILE, WorkerContext, checkpoint_dir, worker_env,
};
use crate::error::PlanError;
use crate::names::{
    LABEL_HOSTNAME, PLACEMENT_GATE, Role, checkpoint_claim_name, common_labels, config_map_name,
    job_name, service_name, worker_credentials_name, worker_host, worker_selector,
};
use crate::preflight::{job_identity, preflight};
use crate::resources::worker_resources;
use crate::worker_token::{NATS_CA_SECRET_KEY, WorkerCredentials};

/// Name of the worker container.
pub const WORKER_CONTAINER: &str = "worker";
/// Name of the rendezvous port (worker 0 listens on it; TF workers all do).
pub const RENDEZVOUS_PORT_NAME: &str = "rendezvous";
/// Name of the metrics port.
pub const METRICS_PORT_NAME: &str = "metrics";

/// What the planner knows about one attempt beyond the TrainingJob's spec.
#[derive(Debug, Clone, Copy)]
pub struct JobPlan<'a> {
    /// Restart attempt the objects are for, 0 for the first run; names the Job.
    pub attempt: u32,
    /// The gpu-allocator's admission of this attempt. None: the Job is created suspended.
    pub admission: Option<&'a AdmissionDecided>,
    /// `spec.suspend` (or any other reason the user wants the workers stopped).
    pub suspended_by_user: bool,
    /// Checkpoint the workers start from; beats `spec.checkpoint.resumeFrom`.
    pub resume_point: Option<&'a ResumePointChosen>,
    /// The checkpoint-manager's latest interval advice, followed by workers
    /// of a job with `checkpoint.frequency: auto`.
    pub interval_advice: Option<&'a CheckpointIntervalAdvised>,
    /// Installation-wide settings: field manager, labels, images, NATS URL.
    pub config: &'a PlannerConfig,
}

/// Objects for one attempt, to be applied with server-side apply under
/// `field_manager` in this order: ConfigMap and Service first, so the Job's pods find
/// both when they start.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DesiredObjects {
    pub field_manager: String,
    /// The job's checkpoint volume, when checkpointing is on and the spec names
    /// no storage; owned by the TrainingJob, so it outlives every attempt.
    pub checkpoint_claim: Option<PersistentVolumeClaim>,
    pub config_map: ConfigMap,
    pub service: Service,
    pub job: Job,
    /// The Secret with the workers' NATS token, once the attempt is admitted
    /// and when the planner issues worker credentials; applied with the
    /// ConfigMap, before the Job's workers start.
    pub worker_credentials: Option<WorkerCredentials>,
}

impl DesiredObjects {
    /// True when the Job is created or kept suspended.
    pub fn job_suspended(&self) -> bool {
        self.job
            .spec
            .as_ref()
            .and_then(|s| s.suspend)
            .unwrap_or(false)
    }

    /// Name of the Job.
    pub fn job_name(&self) -> &str {
        self.job.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Builds the objects of `plan.attempt` of `job`.
///
/// Fails, without building anything, when the job does not pass [`preflight`] or the
/// admission contradicts the spec.
pub fn desired_objects(job: &TrainingJob, plan: &JobPlan<'_>) -> Result<DesiredObjects, PlanError> {
    preflight(job, plan.config)?;
    let identity = job_identity(job)?;
    let spec = &job.spec;
    if let Some(admission) = plan.admission
        && admission.attempt != plan.attempt
    {
        return Err(PlanError::AdmissionForOtherAttempt {
            admission_attempt: admission.attempt,
            plan_attempt: plan.attempt,
        });
    }

    let owner = OwnerReference {
        api_version: trainyard_api::API_GROUP_VERSION.to_owned(),
        kind: "TrainingJob".to_owned(),
        name: identity.name.to_owned(),
        uid: identity.uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let meta = |name: String, role: Role| ObjectMeta {
        name: Some(name),
        namespace: Some(identity.namespace.to_owned()),
        labels: Some(common_labels(
            identity.name,
            role,
            plan.attempt,
            &plan.config.extra_labels,
        )),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };

    let job_name = job_name(identity.name, plan.attempt);
    let service_name = service_name(identity.name);
    let config_map_name = config_map_name(identity.name);
    let worker_hosts: Vec<String> = (0..spec.num_workers)
        .map(|index| worker_host(&job_name, index, &service_name, identity.namespace))
        .collect();
    let master_host = worker_hosts.first().cloned().unwrap_or_default();
    let credentials_name = worker_credentials_name(identity.name, plan.attempt);
    let issues_credentials = plan.config.worker_credentials_seed_file.is_some();
    let context = WorkerContext {
        training_job: identity.name,
        namespace: identity.namespace,
        attempt: plan.attempt,
        config_map: &config_map_name,
        nats_url: &plan.config.worker_nats_url,
        master_host: &master_host,
        worker_hosts: &worker_hosts,
        sweep: job
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|owner| owner.kind == "Sweep")
            .map(|owner| owner.name.as_str()),
        credentials_secret: issues_credentials.then_some(credentials_name.as_str()),
        nats_ca: issues_credentials && plan.config.worker_nats_ca_file.is_some(),
    };

    let config_map = ConfigMap {
        metadata: meta(config_map_name.clone(), Role::Config),
        data: Some(config_map_data(spec, plan, &context)?),
        ..ConfigMap::default()
    };
    let service = Service {
        metadata: meta(service_name.clone(), Role::Service),
        spec: Some(worker_service_spec(spec, identity.name, plan.attempt)),
        ..Service::default()
    };

    let admitted = plan.admission.is_some();
    let mut pod_labels = common_labels(
        identity.name,
        Role::Worker,
        plan.attempt,
        &plan.config.extra_labels,
    );
    pod_labels.extend(worker_pod_labels(identity.name));
    // The user's labels first, so Trainyard's own (selectors, placement) win a clash.
    let mut labels = spec.pod_labels.clone();
    labels.extend(pod_labels);
    let job = Job {
        metadata: meta(job_name, Role::Worker),
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".to_owned()),
            completions: Some(count_i32(spec.num_workers)),
            parallelism: Some(count_i32(spec.num_workers)),
            // One failed worker fails the gang; the planner replaces it as a new attempt
            // from the latest checkpoint, so Kubernetes must not restart anything itself.
            backoff_limit: Some(0),
            // Workers run only when admitted and not suspended by the user.
            suspend: Some(!admitted || plan.suspended_by_user),
            active_deadline_seconds: spec
                .failure_policy
                .as_ref()
                .and_then(|f| f.active_deadline_seconds)
                .map(|seconds| i64::try_from(seconds).unwrap_or(i64::MAX)),
            // Finished Jobs and their pods stay for `kubectl logs`, then Kubernetes removes them.
            ttl_seconds_after_finished: plan
                .config
                .finished_job_ttl_seconds
                .map(|seconds| i32::try_from(seconds).unwrap_or(i32::MAX)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: pod_annotations(spec),
                    ..ObjectMeta::default()
                }),
                spec: Some(worker_pod_spec(
                    spec,
                    plan,
                    &context,
                    &service_name,
                    plan.admission.is_some_and(|admission| {
                        job.placement_fully_planned(|key| placed_within(admission, key))
                    }),
                )?),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    };

    let checkpoint_claim = (spec.checkpointing_enabled()
        && spec.checkpoint.as_ref().is_none_or(|c| c.storage.is_none()))
    .then(|| PersistentVolumeClaim {
        metadata: meta(checkpoint_claim_name(identity.name), Role::Checkpoints),
        spec: Some(PersistentVolumeClaimSpec {
            // Every worker of every attempt mounts it.
            access_modes: Some(vec!["ReadWriteMany".to_owned()]),
            storage_class_name: plan.config.checkpoint_storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(plan.config.checkpoint_volume_size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    });

    // Signed once the attempt is admitted, so the token's lifetime counts
    // from when its workers can start, not from a wait in the queue.
    let worker_credentials = (issues_credentials && admitted).then(|| WorkerCredentials {
        metadata: meta(credentials_name.clone(), Role::Credentials),
        namespace: identity.namespace.to_owned(),
        job: identity.name.to_owned(),
        lifetime_seconds: token_lifetime_seconds(spec, plan.config),
    });

    Ok(DesiredObjects {
        field_manager: plan.config.field_manager.clone(),
        checkpoint_claim,
        config_map,
        service,
        job,
        worker_credentials,
    })
}

/// The configured token lifetime, or the job's active deadline and an hour
/// when that is longer: a job may run to its deadline.
fn token_lifetime_seconds(spec: &TrainingJobSpec, config: &PlannerConfig) -> u64 {
    let deadline = spec
        .failure_policy
        .as_ref()
        .and_then(|f| f.active_deadline_seconds)
        .map(|seconds| seconds.saturating_add(3600));
    deadline.map_or(config.worker_token_lifetime_seconds, |deadline| {
        deadline.max(config.worker_token_lifetime_seconds)
    })
}

/// Worker counts are at most 100 (schema); saturate rather than wrap if that changes.
fn count_i32(count: u32) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}

fn port_i32(port: u32) -> i32 {
    i32::try_from(port).unwrap_or(i32::MAX)
}

fn monitoring_enabled(spec: &TrainingJobSpec) -> bool {
    spec.monitoring
        .as_ref()
        .and_then(|m| m.enabled)
        .unwrap_or(false)
}

/// The user's pod annotations, then Trainyard's scrape annotations over them.
fn pod_annotations(spec: &TrainingJobSpec) -> Option<BTreeMap<String, String>> {
    let mut annotations = spec.pod_annotations.clone();
    if monitoring_enabled(spec) {
        annotations.extend([
            ("prometheus.io/scrape".to_owned(), "true".to_owned()),
            (
                "prometheus.io/port".to_owned(),
                spec.metrics_port().to_string(),
            ),
        ]);
    }
    (!annotations.is_empty()).then_some(annotations)
}

fn worker_service_spec(spec: &TrainingJobSpec, training_job: &str, attempt: u32) -> ServiceSpec {
    let mut ports = vec![ServicePort {
        name: Some(RENDEZVOUS_PORT_NAME.to_owned()),
        port: port_i32(spec.master_port()),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }];
    if monitoring_enabled(spec) {
        ports.push(ServicePort {
            name: Some(METRICS_PORT_NAME.to_owned()),
            port: port_i32(spec.metrics_port()),
            protocol: Some("TCP".to_owned()),
            ..ServicePort::default()
        });
    }
    ServiceSpec {
        // Headless: a DNS record per pod instead of a virtual IP.
        cluster_ip: Some("None".to_owned()),
        // Workers must resolve each other while still starting up (rendezvous happens
        // before any of them could report Ready).
        publish_not_ready_addresses: Some(true),
        selector: Some(worker_selector(training_job, attempt)),
        ports: Some(ports),
        ..ServiceSpec::default()
    }
}

fn worker_pod_spec(
    spec: &TrainingJobSpec,
    plan: &JobPlan<'_>,
    context: &WorkerContext<'_>,
    service_name: &str,
    pin_to_admitted_nodes: bool,
) -> Result<PodSpec, PlanError> {
    let scheduling = spec.scheduling.clone().unwrap_or_default();
    let mut node_selector = scheduling.node_selector.clone();
    let mut tolerations = scheduling.tolerations.clone();
    if let Some(admission) = plan.admission {
        for (key, value) in &admission.node_selector {
            match node_selector.get(key) {
                Some(existing) if existing != value => {
                    return Err(PlanError::NodeSelectorConflict {
                        key: key.clone(),
                        spec_value: existing.clone(),
                        admission_value: value.clone(),
                        queue: admission.queue.clone(),
                    });
                }
                _ => {
                    node_selector.insert(key.clone(), value.clone());
                }
            }
        }
        for toleration in admission.tolerations.iter().map(to_toleration) {
            if !tolerations.contains(&toleration) {
                tolerations.push(toleration);
            }
        }
    }

    let mut ports = vec![ContainerPort {
        name: Some(RENDEZVOUS_PORT_NAME.to_owned()),
        container_port: port_i32(spec.master_port()),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }];
    if monitoring_enabled(spec) {
        ports.push(ContainerPort {
            name: Some(METRICS_PORT_NAME.to_owned()),
            container_port: port_i32(spec.metrics_port()),
            protocol: Some("TCP".to_owned()),
            ..ContainerPort::default()
        });
    }

    let planned = plan
        .admission
        .filter(|_| pin_to_admitted_nodes)
        .map(planned_nodes)
        .unwrap_or_default();
    let (volumes, volume_mounts) = worker_volumes(spec, context);
    let image = spec.image.clone().unwrap_or_else(|| {
        plan.config
            .default_images
            .for_framework(spec.framework())
            .to_owned()
    });
    let container = Container {
        name: WORKER_CONTAINER.to_owned(),
        image: Some(image),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(worker_env(spec, context)?),
        ports: Some(ports),
        resources: worker_resources(spec)?,
        volume_mounts: Some(volume_mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };

    Ok(PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".to_owned()),
        // With the Indexed Job's per-pod host names this gives every worker the DNS
        // name <job>-<index>.<service>.<namespace>.svc.
        subdomain: Some(service_name.to_owned()),
        priority_class_name: scheduling.priority.clone(),
        node_selector: (!node_selector.is_empty()).then_some(node_selector),
        service_account_name: spec.service_account_name.clone(),
        image_pull_secrets: (!spec.image_pull_secrets.is_empty())
            .then(|| spec.image_pull_secrets.clone()),
        affinity: pinned_to_planned_nodes(scheduling.affinity, &planned),
        scheduling_gates: gated_for_placement(&planned),
        tolerations: (!tolerations.is_empty()).then_some(tolerations),
        termination_grace_period_seconds: Some(i64::from(
            plan.config.termination_grace_period_seconds,
        )),
        volumes: Some(volumes),
        // Workers talk to NATS, never to the Kubernetes API.
        automount_service_account_token: Some(false),
        security_context: Some(pod_security_context(spec, plan.config)),
        ..PodSpec::default()
    })
}

/// The spec's pod securityContext, with the defaults every worker gets where it
/// says nothing: seccomp RuntimeDefault, and non-root when the installation's
/// images allow it.
fn pod_security_context(spec: &TrainingJobSpec, config: &PlannerConfig) -> PodSecurityContext {
    let mut context = spec.security_context.clone().unwrap_or_default();
    if context.run_as_non_root.is_none() && config.worker_run_as_non_root {
        context.run_as_non_root = Some(true);
    }
    context
        .seccomp_profile
        .get_or_insert_with(|| SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            ..SeccompProfile::default()
        });
    context
}

/// Whether `admission` placed every worker in one domain of the topology
/// `key`: one node for the hostname, else the zone or rack the allocator
/// reports the whole gang packed into.
fn placed_within(admission: &AdmissionDecided, key: &str) -> bool {
    if key == LABEL_HOSTNAME {
        planned_nodes(admission).len() == 1
    } else {
        admission.topology.contains_key(key)
    }
}

/// The distinct nodes `admission` placed workers on, sorted.
fn planned_nodes(admission: &AdmissionDecided) -> Vec<String> {
    let mut nodes: Vec<String> = admission
        .placements
        .iter()
        .map(|p| p.node.clone())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// The workers' affinity, with every required node-affinity term narrowed to
/// the `planned` nodes, those the gpu-allocator placed the workers on. The
/// allocator counted each worker's GPUs on those nodes (best fit, topology),
/// so a scheduler free to choose any node of the flavor (kube-scheduler's
/// default scoring spreads pods) would take GPUs the allocator plans other
/// jobs onto, and those jobs' pods would not bind. One pod template serves
/// every worker of an Indexed Job, so the pin is the set of planned nodes;
/// where that set has several nodes, [`gated_for_placement`] holds each pod
/// until it is given its own. Only for jobs whose placement rules the
/// allocator planned for (`TrainingJob::placement_fully_planned`): narrowed
/// to nodes chosen without a rule, the pods could fit nowhere. The
/// allocator chose nodes that match one of the user's required terms; the
/// pin joins each term, so the alternatives stay alternatives.
fn pinned_to_planned_nodes(affinity: Option<Affinity>, planned: &[String]) -> Option<Affinity> {
    if planned.is_empty() {
        return affinity;
    }
    let pin = NodeSelectorRequirement {
        key: LABEL_HOSTNAME.to_owned(),
        operator: "In".to_owned(),
        values: Some(planned.to_vec()),
    };
    let mut affinity = affinity.unwrap_or_default();
    let required = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    // Terms are alternatives: the pin must hold in each of them.
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(pin.clone());
    }
    Some(affinity)
}

/// The scheduling gate that holds every worker pod of a job planned onto
/// several nodes. Pinned to the set, the scheduler could put two workers on
/// a node planned for one and take the GPUs of a job planned beside them
/// (Kueue's topology-aware scheduling meets the same limit of one template
/// the same way): the planner removes the gate from each pod as it appears
/// and, in the same write, adds the node its completion index was placed on
/// to its node selector ([`PlannerAction::UngateWorker`]).
///
/// [`PlannerAction::UngateWorker`]: crate::PlannerAction::UngateWorker
fn gated_for_placement(planned: &[String]) -> Option<Vec<PodSchedulingGate>> {
    (planned.len() > 1).then(|| {
        vec![PodSchedulingGate {
            name: PLACEMENT_GATE.to_owned(),
        }]
    })
}

fn to_toleration(spec: &TolerationSpec) -> Toleration {
    Toleration {
        key: Some(spec.key.clone()),
        operator: Some(spec.operator.clone()),
        value: spec.value.clone(),
        effect: spec.effect.clone(),
        toleration_seconds: None,
    }
}

fn worker_volumes(
    spec: &TrainingJobSpec,
    context: &WorkerContext<'_>,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    let config_items: Vec<KeyToPath> = [HYPERPARAMETERS_FILE, TRAINING_CONFIG_FILE]
        .into_iter()
        .map(|file| KeyToPath {
            key: file.to_owned(),
            path: file.to_owned(),
            mode: None,
        })
        .collect();
    let config = match context.credentials_secret.filter(|_| context.nats_ca) {
        // The NATS CA joins the ConfigMap's files: one directory, and no volume
        // name beyond those the API keeps for Trainyard.
        Some(secret) => Volume {
            name: "trainyard-config".to_owned(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: context.config_map.to_owned(),
                            items: Some(config_items),
                            optional: None,
                        }),
                        ..VolumeProjection::default()
                    },
                    VolumeProjection {
                        secret: Some(SecretProjection {
                            name: secret.to_owned(),
                            items: Some(vec![KeyToPath {
                                key: NATS_CA_SECRET_KEY.to_owned(),
                                path: NATS_CA_FILE.to_owned(),
                                mode: None,
                            }]),
                            optional: Some(false),
                        }),
                        ..VolumeProjection::default()
                    },
                ]),
                default_mode: None,
            }),
            ..Volume::default()
        },
        None => Volume {
            name: "trainyard-config".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: context.config_map.to_owned(),
                items: Some(config_items),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
    };
    let mut volumes = vec![
        config,
        // Docker's 64 MiB /dev/shm is too small for NCCL's shared-memory transport and
        // for PyTorch DataLoader workers; a memory-backed emptyDir lifts that limit.
        Volume {
            name: "dshm".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: None,
            }),
            ..Volume::default()
        },
    ];
    let mut mounts = vec![
        VolumeMount {
            name: "trainyard-config".to_owned(),
            mount_path: CONFIG_MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "dshm".to_owned(),
            mount_path: "/dev/shm".to_owned(),
            ..VolumeMount::default()
        },
    ];

    if spec.checkpointing_enabled() {
        let storage = spec.checkpoint.as_ref().and_then(|c| c.storage.as_ref());
        // A named claim or NFS export is shared (by a Sweep's trials, by every
        // job that names it): each TrainingJob keeps its checkpoints in a
        // directory of its own there, as the default S3 prefix does, so no job
        // resumes from or retains another's files. The claim made per job
        // holds only that job's.
        let sub_path = storage
            .is_some_and(|s| matches!(s.storage_type, StorageType::Pvc | StorageType::Nfs))
            .then(|| checkpoint_volume_sub_path(context.namespace, context.training_job));
        let volume = match storage {
            Some(storage) if storage.storage_type == StorageType::Pvc => Some(Volume {
                name: "checkpoints".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: storage.claim_name.clone().unwrap_or_default(),
                    read_only: None,
                }),
                ..Volume::default()
            }),
            Some(storage) if storage.storage_type == StorageType::Nfs => Some(Volume {
                name: "checkpoints".to_owned(),
                nfs: Some(NFSVolumeSource {
                    server: storage.nfs_server.clone().unwrap_or_default(),
                    path: storage.nfs_path.clone().unwrap_or_default(),
                    read_only: None,
                }),
                ..Volume::default()
            }),
            // Object stores are written through their URI; nothing to mount.
            Some(_) => None,
            // No storage configured: the claim the planner makes for the job.
            None => Some(Volume {
                name: "checkpoints".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: checkpoint_claim_name(context.training_job),
                    read_only: None,
                }),
                ..Volume::default()
            }),
        };
        if let Some(volume) = volume {
            let mount_path =
                checkpoint_dir(spec, context.namespace, context.training_job).unwrap_or_default();
            mounts.push(VolumeMount {
                name: volume.name.clone(),
                mount_path,
                sub_path,
                ..VolumeMount::default()
            });
            volumes.push(volume);
        }
    }
    // The schema keeps user volume names off Trainyard's and every mount on a volume.
    volumes.extend(spec.volumes.iter().cloned());
    mounts.extend(spec.volume_mounts.iter().cloned());
    (volumes, mounts)
}

fn config_map_data(
    spec: &TrainingJobSpec,
    plan: &JobPlan<'_>,
    context: &WorkerContext<'_>,
) -> Result<BTreeMap<String, String>, PlanError> {
    let mut hyperparameters =
        serde_json::to_value(spec.hyperparameters.clone().unwrap_or_default())
            .map_err(|e| encode_error(HYPERPARAMETERS_FILE, &e))?;
    // Workers should not have to know the API's default epoch count.
    if let Some(object) = hyperparameters.as_object_mut() {
        object.insert("epochs".to_owned(), json!(spec.epochs()));
    }
    let checkpoint = spec.checkpoint.clone().unwrap_or_default();
    let networking = json!({
        "backend": spec.communication_backend().as_str(),
        "masterPort": spec.master_port(),
        "rdmaEnabled": spec.networking.as_ref().and_then(|n| n.rdma_enabled).unwrap_or(false),
    });
    let training_config = json!({
        "trainingJob": context.training_job,
        "namespace": context.namespace,
        "attempt": plan.attempt,
        "model": spec.model,
        "dataset": spec.dataset,
        "framework": spec.framework().as_str(),
        "numWorkers": spec.num_workers,
        "gpusPerWorker": spec.gpus_per_worker(),
        "workers": context.worker_hosts,
        "masterAddr": context.master_host,
        "networking": networking,
        "checkpoint": {
            "enabled": spec.checkpointing_enabled(),
            "dir": checkpoint_dir(spec, context.namespace, context.training_job),
            "frequency": spec.checkpoint_frequency(),
            "retention": checkpoint.retention,
            "storageType": checkpoint.storage.as_ref().map(|s| s.storage_type.as_str()),
        },
    });

    let mut data = BTreeMap::from([
        (
            HYPERPARAMETERS_FILE.to_owned(),
            serde_json::to_string_pretty(&hyperparameters)
                .map_err(|e| encode_error(HYPERPARAMETERS_FILE, &e))?,
        ),
        (
            TRAINING_CONFIG_FILE.to_owned(),
            serde_json::to_string_pretty(&training_config)
                .map_err(|e| encode_error(TRAINING_CONFIG_FILE, &e))?,
        ),
    ]);
    let spec_resume = spec.checkpoint.as_ref().and_then(|c| c.resume_from.clone());
    let resume_from = plan
        .resume_point
        .map(|point| point.uri.clone())
        .or(spec_resume);
    if let Some(uri) = resume_from {
        data.insert(RESUME_FROM_KEY.to_owned(), uri);
    }
    if spec.checkpoint_frequency() == CheckpointFrequency::Auto
        && let Some(advice) = plan.interval_advice
    {
        data.insert(
            CHECKPOINT_INTERVAL_KEY.to_owned(),
            advice.interval_seconds.to_string(),
        );
    }
    Ok(data)
}

fn encode_error(what: &'static str, error: &serde_json::Error) -> PlanError {
    PlanError::Encode {
        what,
        message: error.to_string(),
    }
}
