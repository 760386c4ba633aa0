//! A checkpoint storage outage is waited out: a report whose S3 endpoint
//! refuses connections (a real moto server started only later on that port)
//! is verified once the storage answers, and nothing is dead-lettered. A
//! report that is wrong whatever the storage's state, queued behind it (a
//! job's reports are handled in order), still gets its refusal.

mod common;

use common::*;
use serde_json::json;
use trainyard_checkpoint_manager::{ManagerConfig, StorageSettings};
use trainyard_contracts::decisions::{CheckpointVerified, ResumePointChosen};
use trainyard_testkit::{NatsServer, metric};

const BUCKET: &str = "outage";

fn transient_reports(runtime: &trainyard_runtime::Runtime) -> f64 {
    metric(
        &runtime.registry,
        "trainyard_messages_handled_total",
        &[
            ("consumer", "checkpoint-manager-worker"),
            ("outcome", "transient"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_made_while_storage_is_unreachable_is_verified_once_it_returns() {
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    // Nothing listens on the port yet: every request is refused.
    let port = trainyard_testkit::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = ManagerConfig {
        storage: StorageSettings {
            s3_endpoint: Some(endpoint.clone()),
            s3_region: Some("us-east-1".into()),
            s3_access_key_id: Some("test".into()),
            s3_secret_access_key: Some("test".into()),
            storage_timeout_seconds: 2,
            ..StorageSettings::default()
        },
        ..ManagerConfig::default()
    };
    let manager = start_manager(&nats, config).await;
    driver
        .apply(&training_job(
            "bert",
            json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": BUCKET}}),
        ))
        .await;
    // The job is known before its reports arrive, so they are handled in order.
    trainyard_testkit::eventually("the TrainingJob handled", || async {
        let handled = metric(
            &manager.registry,
            "trainyard_messages_handled_total",
            &[
                ("consumer", "checkpoint-manager-events"),
                ("outcome", "ack"),
            ],
        );
        (handled >= 1.0).then_some(())
    })
    .await;
    let uri = format!("s3://{BUCKET}/{NS}/bert/step-100");
    driver.report("bert", &uri, 100, 0.5, 2.0).await;
    let outside = "s3://elsewhere/ml/bert/step-50";
    driver.report("bert", outside, 50, 0.6, 2.0).await;

    // More failures than the consumer's delivery limit (5) would allow a
    // retried message.
    trainyard_testkit::eventually("the unreachable storage is waited out", || async {
        (transient_reports(&manager) >= 6.0).then_some(())
    })
    .await;
    assert!(
        driver
            .decisions::<CheckpointVerified>("bert")
            .await
            .is_empty(),
        "nothing is decided while the storage is down"
    );

    let moto = Moto::start_on(port);
    let s3 = moto.bucket(BUCKET).await;
    write_s3_checkpoint(&s3, &format!("{NS}/bert/step-100"), 100, 0.5).await;

    let resumes = driver.wait_for::<ResumePointChosen>("bert", 1).await;
    assert_eq!(resumes[0].uri, uri);
    let verdicts = driver.wait_for::<CheckpointVerified>("bert", 2).await;
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    assert_eq!(verdicts[0].uri, uri);
    assert!(verdicts[0].verified, "{verdicts:?}");
    assert_eq!(verdicts[1].uri, outside);
    assert!(!verdicts[1].verified, "{verdicts:?}");
    assert!(
        verdicts[1]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("outside the job's checkpoint storage")),
        "{verdicts:?}"
    );
    let dead =
        trainyard_testkit::stream_messages(&driver.jetstream, "TRAINYARD_DEADLETTER", None).await;
    assert!(dead.is_empty(), "dead-lettered: {}", dead.len());
    stop_manager(manager).await;
}
