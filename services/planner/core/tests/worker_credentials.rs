//! Worker NATS credentials: an admitted attempt gets a Secret with a token for
//! its TrainingJob, and its workers read it from `TRAINYARD_NATS_TOKEN`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{admission, spec, t0, training_job, worker_pod};
use nkeys::KeyPair;
use planner_core::{
    JobPlan, PlannerConfig, TOKEN_ENV, TOKEN_SECRET_KEY, WorkerToken, desired_objects,
};
use trainyard_api::FailurePolicy;

fn config(issues: bool) -> PlannerConfig {
    PlannerConfig {
        worker_credentials_seed_file: issues.then(|| "/etc/trainyard/issuer.nk".to_owned()),
        ..PlannerConfig::default()
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
    let plan = JobPlan {
        attempt: 1,
        admission: Some(&admitted),
        suspended_by_user: false,
        resume_point: None,
        config: &config,
        interval_advice: None,
    };
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
    let secret = credentials.secret(&key, t0()).unwrap();
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
    let plan = JobPlan {
        attempt: 0,
        admission: None,
        suspended_by_user: false,
        resume_point: None,
        config: &config,
        interval_advice: None,
    };
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
    let plan = JobPlan {
        attempt: 0,
        admission: Some(&admitted),
        suspended_by_user: false,
        resume_point: None,
        config: &config,
        interval_advice: None,
    };
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
    let plan = JobPlan {
        attempt: 0,
        admission: Some(&admitted),
        suspended_by_user: false,
        resume_point: None,
        config: &config,
        interval_advice: None,
    };
    let objects = desired_objects(&job, &plan).unwrap();
    assert_eq!(
        objects.worker_credentials.unwrap().lifetime_seconds,
        30 * 86_400 + 3600
    );
}
