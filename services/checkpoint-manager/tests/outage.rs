//! A checkpoint storage that does not answer holds no lane: a report whose
//! S3 endpoint refuses connections waits in the job's record (acknowledged,
//! kept in the `trainyard_checkpoints` bucket) while a job sharing its lane
//! on a live moto server is verified at once; the waiting report survives a
//! restart of the manager and is verified once a real moto server listens on
//! its endpoint. A report that is wrong whatever the storage's state is still
//! refused with its reason, and nothing is dead-lettered.

mod common;

use std::hash::{Hash, Hasher};

use common::*;
use serde_json::json;
use trainyard_checkpoint_manager::ManagerConfig;
use trainyard_contracts::decisions::{CheckpointVerified, ResumePointChosen};
use trainyard_testkit::{NatsServer, metric};

const BUCKET: &str = "outage";
/// The manager's lanes per consumer.
const LANES: u64 = 8;

/// The runtime's lane of a job's messages: the hash of its namespace and name.
fn lane(name: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (Some(NS.to_string()), name.to_string()).hash(&mut hasher);
    hasher.finish() % LANES
}

/// A job name whose reports share `other`'s lane.
fn lane_sharing_name(other: &str) -> String {
    (0..)
        .map(|n| format!("live-{n}"))
        .find(|name| lane(name) == lane(other))
        .expect("some name shares the lane")
}

/// Forwards connections on `port` to the server at `endpoint` (`http://host:port`).
async fn forward(port: u16, endpoint: &str) -> tokio::task::JoinHandle<()> {
    let target = endpoint.trim_start_matches("http://").to_string();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the dead port is free");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

fn waiting_jobs(runtime: &trainyard_runtime::Runtime) -> f64 {
    metric(&runtime.registry, "trainyard_checkpoint_waiting_jobs", &[])
}

async fn wait_until_jobs_handled(runtime: &trainyard_runtime::Runtime, count: f64) {
    trainyard_testkit::eventually("the TrainingJobs handled", || async {
        let handled = metric(
            &runtime.registry,
            "trainyard_messages_handled_total",
            &[
                ("consumer", "checkpoint-manager-events"),
                ("outcome", "ack"),
            ],
        );
        (handled >= count).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_holds_no_lane_and_its_reports_survive_a_restart() {
    let nats = NatsServer::start();
    let driver = Driver::connect(&nats).await;
    let live = Moto::start();
    let live_s3 = live.bucket(BUCKET).await;
    // Nothing listens on this port until the end: every request is refused.
    let dead_port = trainyard_testkit::free_port();
    let config = || {
        let mut storage = live.storage();
        storage.storage_timeout_seconds = 2;
        ManagerConfig {
            storage,
            ..ManagerConfig::default()
        }
    };
    let manager = start_manager(&nats, config()).await;
    let live_job = lane_sharing_name("dead");
    driver
        .apply(&training_job(
            "dead",
            json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": BUCKET,
                   "s3Endpoint": format!("http://127.0.0.1:{dead_port}")}}),
        ))
        .await;
    driver
        .apply(&training_job(
            &live_job,
            json!({"enabled": true, "storage": {"type": "s3", "s3Bucket": BUCKET}}),
        ))
        .await;
    wait_until_jobs_handled(&manager, 2.0).await;

    let dead_uri = format!("s3://{BUCKET}/{NS}/dead/step-100");
    driver.report("dead", &dead_uri, 100, 0.5, 2.0).await;
    let outside = "s3://elsewhere/ml/dead/step-50";
    driver.report("dead", outside, 50, 0.6, 2.0).await;
    write_s3_checkpoint(&live_s3, &format!("{NS}/{live_job}/step-100"), 100, 0.4).await;
    let live_uri = format!("s3://{BUCKET}/{NS}/{live_job}/step-100");
    driver.report(&live_job, &live_uri, 100, 0.4, 2.0).await;

    // The live job's report, behind the dead one's in the same lane, is
    // verified while the dead endpoint still refuses connections.
    let verdicts = driver.wait_for::<CheckpointVerified>(&live_job, 1).await;
    assert!(verdicts[0].verified, "{verdicts:?}");
    let refused = driver.wait_for::<CheckpointVerified>("dead", 1).await;
    assert_eq!(refused.len(), 1, "only the refusal: {refused:?}");
    assert_eq!(refused[0].uri, outside);
    assert!(
        refused[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("outside the job's checkpoint storage")),
        "{refused:?}"
    );
    assert_eq!(waiting_jobs(&manager), 1.0);
    // A second report on the dead endpoint waits without trying it in the handler.
    let second_uri = format!("s3://{BUCKET}/{NS}/dead/step-200");
    driver.report("dead", &second_uri, 200, 0.45, 2.0).await;
    trainyard_testkit::eventually("the reports acknowledged", || async {
        let acked = metric(
            &manager.registry,
            "trainyard_messages_handled_total",
            &[
                ("consumer", "checkpoint-manager-worker"),
                ("outcome", "ack"),
            ],
        );
        (acked >= 4.0).then_some(())
    })
    .await;

    // A restart in between: the waiting reports are in the job's stored record.
    stop_manager(manager).await;
    let manager = start_manager(&nats, config()).await;
    trainyard_testkit::eventually("the waiting job recovered", || async {
        (waiting_jobs(&manager) == 1.0).then_some(())
    })
    .await;
    assert!(
        driver
            .decisions::<ResumePointChosen>("dead")
            .await
            .is_empty(),
        "nothing is decided while the storage is down"
    );

    // The endpoint comes up with the checkpoints stored: a second moto
    // server, filled first, then reachable on the dead port.
    let revived = Moto::start();
    let dead_s3 = revived.bucket(BUCKET).await;
    write_s3_checkpoint(&dead_s3, &format!("{NS}/dead/step-100"), 100, 0.5).await;
    write_s3_checkpoint(&dead_s3, &format!("{NS}/dead/step-200"), 200, 0.45).await;
    let _forwarding = forward(dead_port, &revived.endpoint).await;

    let verdicts = driver.wait_for::<CheckpointVerified>("dead", 3).await;
    let verified: Vec<(&str, bool)> = verdicts
        .iter()
        .skip(1)
        .map(|v| (v.uri.as_str(), v.verified))
        .collect();
    assert_eq!(
        verified,
        [(dead_uri.as_str(), true), (second_uri.as_str(), true)],
        "{verdicts:?}"
    );
    let resumes = driver.wait_for::<ResumePointChosen>("dead", 2).await;
    assert_eq!(
        resumes.last().map(|r| r.uri.as_str()),
        Some(second_uri.as_str())
    );
    trainyard_testkit::eventually("no job waits", || async {
        (waiting_jobs(&manager) == 0.0).then_some(())
    })
    .await;
    let dead =
        trainyard_testkit::stream_messages(&driver.jetstream, "TRAINYARD_DEADLETTER", None).await;
    assert!(dead.is_empty(), "dead-lettered: {}", dead.len());
    stop_manager(manager).await;
}
