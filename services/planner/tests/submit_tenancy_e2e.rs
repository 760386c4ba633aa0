//! Submissions are tenants: a submission for a namespace it was not published
//! for, into a system namespace, or over a TrainingJob no submission created is
//! refused, creates nothing, changes nothing, is dead-lettered with its category
//! and answered on the submitter's result subject with the field and the fix.

mod cluster;

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use serde_json::{Value, json};
use trainyard_api::TrainingJob;
use trainyard_api::placement::LABEL_JOB;
use trainyard_contracts::submit::{SubmissionResult, TrainingJobSubmitted};
use trainyard_contracts::{EntityRef, Envelope, Incoming, streams};

fn submission(spec: Value) -> TrainingJobSubmitted {
    TrainingJobSubmitted {
        labels: Default::default(),
        annotations: Default::default(),
        spec: serde_json::from_value(spec).expect("a spec"),
    }
}

fn good_spec() -> Value {
    json!({"model": "bert-base", "dataset": "wikitext", "numWorkers": 1})
}

/// Publishes a submission on `subject` whose envelope names `entity`, with the
/// payload's JSON as given (so it may be something the typed payload rejects).
async fn submit(cluster: &cluster::Cluster, subject: &str, entity: EntityRef, payload: Value) {
    let mut envelope =
        serde_json::to_value(Envelope::new("external", entity, submission(good_spec())))
            .expect("encodes");
    envelope["payload"] = payload;
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", subject);
    cluster
        .runtime
        .publisher
        .publish_raw(
            subject.to_string(),
            headers,
            Bytes::from(serde_json::to_vec(&envelope).expect("encodes")),
        )
        .await
        .expect("stored");
}

async fn next_result(results: &mut async_nats::Subscriber) -> (String, SubmissionResult) {
    let message = tokio::time::timeout(Duration::from_secs(10), results.next())
        .await
        .expect("a result within 10 s")
        .expect("subscription open");
    let incoming = Incoming::decode(&message.payload).expect("an envelope");
    (
        message.subject.to_string(),
        incoming.payload().expect("a submission result"),
    )
}

async fn dead_letter_categories(cluster: &cluster::Cluster) -> Vec<String> {
    let stream = cluster
        .runtime
        .jetstream
        .get_stream(streams::DEAD_LETTER.name)
        .await
        .expect("dead-letter stream");
    let last = stream.get_info().await.expect("info").state.last_sequence;
    let mut categories = Vec::new();
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await.expect("dead letter");
        let letter: trainyard_contracts::dead_letter::DeadLetter =
            serde_json::from_slice(&message.payload).expect("a dead letter");
        categories.push(letter.category);
    }
    categories
}

#[tokio::test]
async fn submissions_outside_their_tenancy_are_refused_and_change_nothing() {
    let cluster = cluster::start().await;
    let mut results = cluster
        .runtime
        .client
        .subscribe("trainyard.submit.result.>")
        .await
        .expect("subscribe to results");
    let victim = cluster.create_example("trainingjob-simple.yaml").await;
    let victim_name = victim.metadata.name.clone().expect("named");
    let good = serde_json::to_value(submission(good_spec())).expect("encodes");

    // Published for ml/escalate, but the envelope names kube-system.
    submit(
        &cluster,
        "trainyard.submit.trainingjob.ml.escalate",
        EntityRef::new("kube-system", "escalate", ""),
        good.clone(),
    )
    .await;
    let (subject, result) = next_result(&mut results).await;
    assert_eq!(subject, "trainyard.submit.result.kube-system.escalate");
    assert_eq!(result.category.as_deref(), Some("entity_mismatch"));
    assert_eq!(result.errors[0].field, "entity");

    // Into a system namespace, subject and entity agreeing.
    submit(
        &cluster,
        "trainyard.submit.trainingjob.kube-system.escalate",
        EntityRef::new("kube-system", "escalate", ""),
        good.clone(),
    )
    .await;
    let (_, result) = next_result(&mut results).await;
    assert_eq!(result.category.as_deref(), Some("namespace_not_allowed"));
    assert!(result.errors[0].message.contains("submit_namespaces"));

    // Over a TrainingJob created with kubectl.
    let mut takeover = good.clone();
    takeover["spec"]["numWorkers"] = json!(8);
    submit(
        &cluster,
        &format!("trainyard.submit.trainingjob.ml.{victim_name}"),
        EntityRef::new("ml", &victim_name, ""),
        takeover,
    )
    .await;
    let (_, result) = next_result(&mut results).await;
    assert_eq!(result.category.as_deref(), Some("not_owned"));

    // An unknown enum value names its field.
    let mut bad_enum = good.clone();
    bad_enum["spec"]["framework"] = json!("mxnet");
    submit(
        &cluster,
        "trainyard.submit.trainingjob.ml.mxnet-job",
        EntityRef::new("ml", "mxnet-job", ""),
        bad_enum,
    )
    .await;
    let (_, result) = next_result(&mut results).await;
    assert_eq!(result.category.as_deref(), Some("invalid_spec"));
    assert_eq!(result.errors[0].field, "spec.framework");
    assert!(result.errors[0].message.contains("mxnet"));

    let categories = dead_letter_categories(&cluster).await;
    assert_eq!(
        categories,
        [
            "entity_mismatch",
            "namespace_not_allowed",
            "not_owned",
            "invalid_spec"
        ]
    );
    let all_jobs = Api::<TrainingJob>::all(cluster.client.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    assert_eq!(all_jobs.len(), 1, "only the kubectl job exists");
    assert_eq!(all_jobs[0].spec, victim.spec, "the victim is unchanged");
    // The planner reconciles the kubectl-created job when it takes its lease,
    // so only that job may have a Job: no submission made one.
    let jobs = Api::<Job>::all(cluster.client.clone())
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    assert!(
        jobs.iter().all(|job| job
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(LABEL_JOB))
            == Some(&victim_name)),
        "a submission created a Job: {jobs:?}"
    );

    // A valid submission is accepted and answered.
    submit(
        &cluster,
        "trainyard.submit.trainingjob.ml.nightly",
        EntityRef::new("ml", "nightly", ""),
        good,
    )
    .await;
    let (_, result) = next_result(&mut results).await;
    assert!(result.accepted, "{result:?}");
    assert!(
        cluster
            .training_jobs()
            .get_opt("nightly")
            .await
            .expect("get")
            .is_some()
    );
}
