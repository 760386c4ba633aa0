//! Worker NATS credentials: an admitted attempt gets a Secret with a token for
//! its TrainingJob, and its workers read it from `TRAINYARD_NATS_TOKEN`; with
//! a NATS CA configured, the Secret carries it and the workers find it at
//! `TRAINYARD_NATS_CA_FILE`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{admission, spec, t0, training_job, worker_pod};
use nkeys::KeyPair;
use planner_core::{
    CONFIG_MOUNT_PATH, JobPlan, NATS_CA_FILE, NATS_CA_SECRET_KEY, PlannerConfig, TOKEN_ENV,
    TOKEN_SECRET_KEY, WorkerToken, desired_objects,
};
use trainyard_api::FailurePolicy;
use trainyard_contracts::decisions::AdmissionDecided;
use trainyard_contracts::worker::NATS_CA_FILE_ENV;

fn config(issues: bool) -> PlannerConfig {
    PlannerConfig {
        worker_credentials_seed_file: issues.then(|| "/etc/trainyard/issuer.nk".to_owned()),
        ..PlannerConfig::default()
    }
}

fn plan<'a>(
    attempt: u32,
    admission: Option<&'a AdmissionDecided>,
    config: &'a PlannerConfig,
) -> JobPlan<'a> {
    JobPlan {
        attempt,
        admission,
        suspended_by_user: false,
        resume_point: None,
        config,
        interval_advice: None,
    }
}

fn token_env(objects: &planner_core::DesiredObjects) -> Option<(String, String)> {
    let container = worker_pod(objects)?.containers.first()?;
    let var = container
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == TOKEN_ENV)?;
    let reference = var.value_from.as_ref()?.secret_key_ref.as_ref()?;
    Some((reference.name.clone(), reference.key.clone()))
}

#[test]
fn an_admitted_attempt_gets_a_secret_with_a_token_for_its_job() {
    let job = training_job("bert", spec(2));
    let config = config(true);
    let admitted = admission(1, 2);
    let plan = plan(1, Some(&admitted), &config);
    let objects = desired_objects(&job, &plan).unwrap();
    let credentials = objects.worker_credentials.as_ref().unwrap();
    assert_eq!(credentials.metadata.name.as_deref(), Some("bert-a1-nats"));
    let owner = &credentials.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("TrainingJob", "bert")
    );
    assert_eq!(
        token_env(&objects),
        Some(("bert-a1-nats".to_owned(), TOKEN_SECRET_KEY.to_owned()))
    );

    let key = KeyPair::new_account();
    let secret = credentials.secret(&key, None, t0()).unwrap();
    let token = String::from_utf8(secret.data.unwrap()[TOKEN_SECRET_KEY].0.clone()).unwrap();
    let verified = WorkerToken::verify(&token, &key, t0()).unwrap();
    assert_eq!(verified.ns, job.metadata.namespace.clone().unwrap());
    assert_eq!(verified.job, "bert");
    assert_eq!(
        verified.exp,
        t0().timestamp() + i64::try_from(config.worker_token_lifetime_seconds).unwrap()
    );
}

#[test]
fn a_queued_attempt_has_no_token_yet_and_its_template_already_names_the_secret() {
    let job = training_job("bert", spec(2));
    let config = config(true);
    let plan = plan(0, None, &config);
    let objects = desired_objects(&job, &plan).unwrap();
    assert!(objects.job_suspended());
    assert!(objects.worker_credentials.is_none());
    assert_eq!(
        token_env(&objects).map(|(name, _)| name).as_deref(),
        Some("bert-a0-nats")
    );
}

#[test]
fn without_a_key_configured_workers_get_no_token() {
    let job = training_job("bert", spec(2));
    let config = config(false);
    let admitted = admission(0, 2);
    let plan = plan(0, Some(&admitted), &config);
    let objects = desired_objects(&job, &plan).unwrap();
    assert!(objects.worker_credentials.is_none());
    assert_eq!(token_env(&objects), None);
}

#[test]
fn a_job_with_a_longer_deadline_gets_a_token_lasting_past_it() {
    let mut spec = spec(1);
    spec.failure_policy = Some(FailurePolicy {
        active_deadline_seconds: Some(30 * 86_400),
        ..FailurePolicy::default()
    });
    let job = training_job("long", spec);
    let config = config(true);
    let admitted = admission(0, 1);
    let plan = plan(0, Some(&admitted), &config);
    let objects = desired_objects(&job, &plan).unwrap();
    assert_eq!(
        objects.worker_credentials.unwrap().lifetime_seconds,
        30 * 86_400 + 3600
    );
}

/// The worker container's `TRAINYARD_NATS_CA_FILE`, and the (Secret, key) of
/// the file at that path.
fn nats_ca(objects: &planner_core::DesiredObjects) -> (Option<String>, Option<(String, String)>) {
    let Some(pod) = worker_pod(objects) else {
        return (None, None);
    };
    let container = &pod.containers[0];
    let path = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == NATS_CA_FILE_ENV)
        .and_then(|e| e.value.clone());
    let source = path.as_deref().and_then(|path| {
        let (dir, file) = path.rsplit_once('/')?;
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == dir)?;
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)?;
        volume
            .projected
            .as_ref()?
            .sources
            .iter()
            .flatten()
            .filter_map(|source| source.secret.as_ref())
            .find_map(|secret| {
                let item = secret.items.iter().flatten().find(|i| i.path == file)?;
                Some((secret.name.clone(), item.key.clone()))
            })
    });
    (path, source)
}

#[test]
fn with_a_nats_ca_the_workers_read_it_from_their_attempts_secret() {
    let job = training_job("bert", spec(2));
    let config = PlannerConfig {
        worker_nats_ca_file: Some("/etc/trainyard/nats/ca.crt".to_owned()),
        ..config(true)
    };
    let admitted = admission(1, 2);
    let plan = plan(1, Some(&admitted), &config);
    let objects = desired_objects(&job, &plan).unwrap();
    assert_eq!(
        nats_ca(&objects),
        (
            Some(format!("{CONFIG_MOUNT_PATH}/{NATS_CA_FILE}")),
            Some(("bert-a1-nats".to_owned(), NATS_CA_SECRET_KEY.to_owned()))
        )
    );
    // The ConfigMap's files stay where they were, in the same directory.
    let pod = worker_pod(&objects).unwrap();
    let config_volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "trainyard-config")
        .unwrap();
    let config_map = config_volume
        .projected
        .as_ref()
        .unwrap()
        .sources
        .as_ref()
        .unwrap()[0]
        .config_map
        .as_ref()
        .unwrap();
    assert_eq!(config_map.name, "bert-config");

    let key = KeyPair::new_account();
    let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let secret = objects
        .worker_credentials
        .unwrap()
        .secret(&key, Some(ca), t0())
        .unwrap();
    assert_eq!(secret.data.unwrap()[NATS_CA_SECRET_KEY].0, ca.as_bytes());
}

#[test]
fn without_a_nats_ca_the_workers_get_no_ca_file() {
    let job = training_job("bert", spec(2));
    let admitted = admission(0, 2);
    for config in [
        config(true),
        // The CA travels in the credentials Secret; without a key there is none.
        PlannerConfig {
            worker_nats_ca_file: Some("/etc/trainyard/nats/ca.crt".to_owned()),
            ..config(false)
        },
    ] {
        let plan = plan(0, Some(&admitted), &config);
        let objects = desired_objects(&job, &plan).unwrap();
        assert_eq!(nats_ca(&objects), (None, None));
        let pod = worker_pod(&objects).unwrap();
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .any(|v| v.name == "trainyard-config" && v.config_map.is_some())
        );
    }
}
