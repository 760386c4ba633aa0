//! `trainyard tensorboard NAME`: the commands that open a TrainingJob's
//! TensorBoard logs. The planner gives the workers `TENSORBOARD_LOG_DIR`,
//! `tensorboard` under the checkpoint directory; on a volume, the commands
//! start a TensorBoard pod that mounts it read-only and forward a local port
//! to it; in an object store, they run TensorBoard locally on the URI.

use std::io::Write;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, NFSVolumeSource, PersistentVolumeClaimVolumeSource,
    Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, ResourceExt};
use trainyard_api::{MonitoringSpec, StorageType, TrainingJob};

use crate::error::CliError;
use crate::resources::{Listed, Scope};

/// How to open the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorboardOptions {
    /// Local port forwarded to TensorBoard (and its port in the pod).
    pub port: u16,
    /// Image with the `tensorboard` command, for the pod.
    pub image: String,
}

/// Prints the commands for the TrainingJob `name`.
pub async fn tensorboard(
    client: Client,
    namespace: &str,
    name: &str,
    options: &TensorboardOptions,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let scope = Scope::Namespace(namespace.to_owned());
    let job = crate::get::named(&TrainingJob::api(client, &scope), &scope, name).await?;
    out.write_all(commands(&job, options)?.as_bytes())?;
    Ok(())
}

/// The shell commands (with `#` comments) that open `job`'s logs; an error
/// says why the job keeps none.
pub fn commands(job: &TrainingJob, options: &TensorboardOptions) -> Result<String, CliError> {
    let name = job.name_any();
    let namespace = job.namespace().unwrap_or_default();
    let spec = &job.spec;
    if !spec
        .monitoring
        .as_ref()
        .is_some_and(MonitoringSpec::is_tensorboard_enabled)
    {
        return Err(CliError::Usage(format!(
            "trainingjob {namespace}/{name} does not keep TensorBoard logs: set spec.monitoring.tensorboardEnabled: true (with checkpointing on), and the workers get TENSORBOARD_LOG_DIR"
        )));
    }
    let Some(log_dir) = planner_core::tensorboard_log_dir(spec, &namespace, &name) else {
        return Err(CliError::Usage(format!(
            "trainingjob {namespace}/{name} keeps no TensorBoard logs: they are written under the checkpoint storage and its checkpointing is off; set spec.checkpoint.enabled: true"
        )));
    };
    let storage = spec.checkpoint.as_ref().and_then(|c| c.storage.as_ref());
    let volume = match storage {
        None => Some((
            "claim",
            VolumeSourceOf::Claim(planner_core::checkpoint_claim_name(&name)),
        )),
        Some(storage) => match storage.storage_type {
            StorageType::Pvc => Some((
                "claim",
                VolumeSourceOf::Claim(storage.claim_name.clone().unwrap_or_default()),
            )),
            StorageType::Nfs => Some((
                "NFS export",
                VolumeSourceOf::Nfs(
                    storage.nfs_server.clone().unwrap_or_default(),
                    storage.nfs_path.clone().unwrap_or_default(),
                ),
            )),
            StorageType::S3 | StorageType::Gcs => None,
        },
    };
    let port = options.port;
    let Some((what, source)) = volume else {
        let endpoint = storage
            .and_then(|s| s.s3_endpoint.as_deref())
            .map(|endpoint| format!("AWS_ENDPOINT_URL_S3={endpoint} "))
            .unwrap_or_default();
        return Ok(format!(
            "# TensorBoard logs of trainingjob {namespace}/{name}: {log_dir} (object storage).\n\
             # Run TensorBoard here, with credentials that can read the bucket and\n\
             # TensorBoard's support for the scheme installed, then open http://localhost:{port}\n\
             {endpoint}tensorboard --logdir {log_dir} --port {port}\n"
        ));
    };
    let mount_path = planner_core::checkpoint_dir(spec, &namespace, &name).unwrap_or_default();
    let pod_name = format!("{name}-tensorboard");
    let pod = pod(
        &pod_name,
        &namespace,
        &name,
        &mount_path,
        &log_dir,
        source,
        options,
    );
    let manifest = yaml_serde::to_string(&pod)?;
    Ok(format!(
        "# TensorBoard logs of trainingjob {namespace}/{name}: {log_dir} on its checkpoint {what}.\n\
         # A TensorBoard pod mounts it read-only and localhost:{port} is forwarded to it\n\
         # (a ReadWriteOnce claim mounts only on the node that already has it).\n\
         # Open http://localhost:{port}; afterwards: kubectl -n {namespace} delete pod {pod_name}\n\
         kubectl -n {namespace} apply -f - <<'EOF'\n\
         {manifest}EOF\n\
         kubectl -n {namespace} wait --for=condition=Ready pod/{pod_name} --timeout=300s\n\
         kubectl -n {namespace} port-forward pod/{pod_name} {port}:{port}\n"
    ))
}

enum VolumeSourceOf {
    Claim(String),
    Nfs(String, String),
}

fn pod(
    pod_name: &str,
    namespace: &str,
    job: &str,
    mount_path: &str,
    log_dir: &str,
    source: VolumeSourceOf,
    options: &TensorboardOptions,
) -> Pod {
    let volume = match source {
        VolumeSourceOf::Claim(claim_name) => Volume {
            name: "checkpoints".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name,
                read_only: Some(true),
            }),
            ..Volume::default()
        },
        VolumeSourceOf::Nfs(server, path) => Volume {
            name: "checkpoints".to_owned(),
            nfs: Some(NFSVolumeSource {
                server,
                path,
                read_only: Some(true),
            }),
            ..Volume::default()
        },
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                [
                    (
                        "app.kubernetes.io/name".to_owned(),
                        "tensorboard".to_owned(),
                    ),
                    // Not the workers' training-job label: the services
                    // would take the pod for one of the job's workers.
                    ("app.kubernetes.io/instance".to_owned(), job.to_owned()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            // The same restricted settings as the workers, so a namespace that
            // enforces the restricted Pod Security Standard admits it.
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(1000),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_owned(),
                    localhost_profile: None,
                }),
                ..PodSecurityContext::default()
            }),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "tensorboard".to_owned(),
                image: Some(options.image.clone()),
                command: Some(vec![
                    "tensorboard".to_owned(),
                    "--logdir".to_owned(),
                    log_dir.to_owned(),
                    "--bind_all".to_owned(),
                    "--port".to_owned(),
                    options.port.to_string(),
                ]),
                ports: Some(vec![ContainerPort {
                    container_port: i32::from(options.port),
                    name: Some("http".to_owned()),
                    ..ContainerPort::default()
                }]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "checkpoints".to_owned(),
                    mount_path: mount_path.to_owned(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                }]),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_owned()]),
                        add: None,
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            volumes: Some(vec![volume]),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use trainyard_api::{CheckpointSpec, CheckpointStorage, TrainingJobSpec};

    use super::*;

    fn job(
        storage: Option<CheckpointStorage>,
        tensorboard: bool,
        checkpointing: bool,
    ) -> TrainingJob {
        let mut job = TrainingJob::new(
            "bert",
            TrainingJobSpec {
                model: "bert".into(),
                dataset: "wiki".into(),
                num_workers: 2,
                checkpoint: Some(CheckpointSpec {
                    enabled: Some(checkpointing),
                    storage,
                    ..CheckpointSpec::default()
                }),
                monitoring: Some(MonitoringSpec {
                    tensorboard_enabled: Some(tensorboard),
                    ..MonitoringSpec::default()
                }),
                ..TrainingJobSpec::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job
    }

    fn options() -> TensorboardOptions {
        TensorboardOptions {
            port: 6006,
            image: "tensorboard:test".into(),
        }
    }

    fn storage(storage_type: StorageType) -> CheckpointStorage {
        CheckpointStorage {
            storage_type,
            claim_name: None,
            mount_path: None,
            s3_bucket: None,
            s3_prefix: None,
            s3_endpoint: None,
            gcs_bucket: None,
            nfs_server: None,
            nfs_path: None,
        }
    }

    #[test]
    fn logs_on_the_jobs_own_claim_open_through_a_pod_and_a_port_forward() {
        let text = commands(&job(None, true, true), &options()).expect("commands");
        assert!(text.starts_with(
            "# TensorBoard logs of trainingjob ml/bert: /checkpoints/tensorboard on its checkpoint claim.\n"
        ), "{text}");
        let manifest = text
            .split("<<'EOF'\n")
            .nth(1)
            .and_then(|rest| rest.split("EOF\n").next())
            .expect("a manifest");
        let pod: Pod = yaml_serde::from_str(manifest).expect("the manifest is a Pod");
        assert!(
            !pod.labels()
                .contains_key(trainyard_api::placement::LABEL_TRAINING_JOB),
            "the watcher must not take it for a worker"
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(
            spec.volumes
                .as_ref()
                .and_then(|v| v[0].persistent_volume_claim.clone()),
            Some(PersistentVolumeClaimVolumeSource {
                claim_name: "bert-checkpoints".into(),
                read_only: Some(true),
            })
        );
        let container = &spec.containers[0];
        assert_eq!(
            container.command.as_deref(),
            Some(
                &[
                    "tensorboard",
                    "--logdir",
                    "/checkpoints/tensorboard",
                    "--bind_all",
                    "--port",
                    "6006"
                ]
                .map(String::from)[..]
            )
        );
        assert_eq!(
            container
                .volume_mounts
                .as_ref()
                .map(|m| m[0].mount_path.as_str()),
            Some("/checkpoints"),
            "mounted where the workers mount it"
        );
        assert!(
            text.ends_with(
                "kubectl -n ml wait --for=condition=Ready pod/bert-tensorboard --timeout=300s\n\
             kubectl -n ml port-forward pod/bert-tensorboard 6006:6006\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn logs_on_a_named_claim_or_nfs_mount_that_volume() {
        let mut pvc = storage(StorageType::Pvc);
        pvc.claim_name = Some("shared-ckpt".into());
        pvc.mount_path = Some("/ckpt".into());
        let text = commands(&job(Some(pvc), true, true), &options()).expect("commands");
        assert!(text.contains("claimName: shared-ckpt"), "{text}");
        assert!(text.contains("- /ckpt/tensorboard"), "{text}");

        let mut nfs = storage(StorageType::Nfs);
        nfs.nfs_server = Some("10.0.0.5".into());
        nfs.nfs_path = Some("/exports/ml".into());
        let text = commands(&job(Some(nfs), true, true), &options()).expect("commands");
        assert!(text.contains("on its checkpoint NFS export"), "{text}");
        assert!(
            text.contains("server: 10.0.0.5") && text.contains("path: /exports/ml"),
            "{text}"
        );
    }

    #[test]
    fn logs_in_a_bucket_open_with_a_local_tensorboard() {
        let mut s3 = storage(StorageType::S3);
        s3.s3_bucket = Some("ckpts".into());
        s3.s3_endpoint = Some("http://minio:9000".into());
        let text = commands(&job(Some(s3), true, true), &options()).expect("commands");
        assert!(
            text.ends_with(
                "AWS_ENDPOINT_URL_S3=http://minio:9000 tensorboard --logdir s3://ckpts/ml/bert/tensorboard --port 6006\n"
            ),
            "{text}"
        );
        assert!(!text.contains("kubectl"), "{text}");
    }

    #[test]
    fn a_job_without_logs_says_which_field_to_set() {
        let off = commands(&job(None, false, true), &options())
            .expect_err("off")
            .to_string();
        assert!(
            off.contains("set spec.monitoring.tensorboardEnabled: true"),
            "{off}"
        );
        let unkept = commands(&job(None, true, false), &options())
            .expect_err("no checkpoints")
            .to_string();
        assert!(
            unkept.contains("checkpointing is off; set spec.checkpoint.enabled: true"),
            "{unkept}"
        );
    }
}
