//! `CheckpointProblem` alerts end to end: the checkpoint-manager raises them
//! on a real NATS server and the real notifier delivers them to a webhook
//! receiver, once each; a running job that stops checkpointing is raised as
//! overdue once per episode.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingJobState;
use trainyard_checkpoint_manager::{ManagerConfig, StorageSettings};
use trainyard_contracts::Service;
use trainyard_contracts::alerts::{CheckpointProblemKind, Severity};
use trainyard_contracts::decisions::{CheckpointVerified, ResumePointChosen};
use trainyard_contracts::worker::CheckpointReported;
use trainyard_notifier::NotifierConfig;
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::{NatsServer, WebhookSink, eventually_within};

const SIGNING_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn reading_volumes() -> ManagerConfig {
    ManagerConfig {
        storage: StorageSettings {
            read_volumes: true,
            ..StorageSettings::default()
        },
        ..ManagerConfig::default()
    }
}

/// The notifier on its own runtime, routing every event to `webhook_url`;
/// a repeated alert is not held back, so a duplicate would be delivered.
async fn start_notifier(nats: &NatsServer, dir: &std::path::Path, webhook_url: &str) -> Runtime {
    std::fs::write(dir.join("ci-key"), SIGNING_KEY).expect("signing key");
    let routes = dir.join("routes.yaml");
    std::fs::write(
        &routes,
        format!(
            "route:\n  receiver: ci\n  group_by: [event, namespace, name]\n  group_wait: 100ms\n  group_interval: 300ms\n  repeat_interval: 10ms\n\
             receivers:\n  - name: ci\n    webhook: {{url: \"{webhook_url}\", secret_file: {}}}\n",
            dir.join("ci-key").display()
        ),
    )
    .expect("routes");
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    settings.shutdown_grace_seconds = 5;
    let runtime = Runtime::start(Service::Notifier, settings, CancellationToken::new())
        .await
        .expect("notifier runtime starts");
    trainyard_notifier::start(
        &runtime,
        NotifierConfig {
            routes_file: routes,
            heartbeat_millis: 200,
            retry_schedule: vec!["200ms".into(), "400ms".into(), "1s".into()],
            ..NotifierConfig::default()
        },
    )
    .await
    .expect("notifier starts");
    runtime
}

/// Each delivered line's (problem, namespace/name, severity), with the
/// number of events it stands for.
fn delivered_lines(sink: &WebhookSink) -> Vec<(String, String, String, u64)> {
    sink.received()
        .iter()
        .filter(|d| d.body["type"] == "alert.checkpoint")
        .flat_map(|d| {
            d.body["data"]["lines"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|line: Value| {
            let sample = &line["sample"];
            (
                sample["reason"].as_str().unwrap_or_default().to_string(),
                format!(
                    "{}/{}",
                    sample["entity"]["namespace"].as_str().unwrap_or_default(),
                    sample["entity"]["name"].as_str().unwrap_or_default()
                ),
                sample["severity"].as_str().unwrap_or_default().to_string(),
                line["count"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_checkpoint_and_a_restart_from_scratch_reach_the_webhook_once_each() {
    let nats = NatsServer::start();
    let manager = start_manager(&nats, reading_volumes()).await;
    let sink = WebhookSink::start(0, 0).await;
    let notifier_dir = tempfile::tempdir().expect("tempdir");
    let notifier = start_notifier(&nats, notifier_dir.path(), &sink.url()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "bert",
            json!({"enabled": true,
                   "storage": {"type": "pvc", "claimName": "bert-ckpt", "mountPath": base}}),
        ))
        .await;
    driver
        .transition(
            "bert",
            TrainingJobState::Initializing,
            TrainingJobState::Running,
            "AllWorkersRunning",
        )
        .await;

    // The worker was killed mid-save: no manifest.
    let cut = volume.path().join("step-100");
    write_volume_checkpoint(&cut, 100, 0.5, false);
    let cut = cut.to_str().expect("utf-8").to_string();
    driver.report("bert", &cut, 100, 0.5, 2.0).await;
    let verified = driver.wait_for::<CheckpointVerified>("bert", 1).await;
    assert!(!verified[0].verified);

    // The job restarts with nothing verified to resume from.
    driver
        .transition(
            "bert",
            TrainingJobState::Running,
            TrainingJobState::Pending,
            "Restarting",
        )
        .await;
    // Another rank reports the same cut checkpoint: not a second alert.
    driver.report("bert", &cut, 100, 0.5, 2.0).await;
    // A later cut checkpoint: its alert follows every earlier one on the job's lane.
    let later = volume.path().join("step-200");
    write_volume_checkpoint(&later, 200, 0.4, false);
    let later = later.to_str().expect("utf-8").to_string();
    driver.report("bert", &later, 200, 0.4, 2.0).await;

    let raised = eventually_within(
        "the later checkpoint's alert",
        Duration::from_secs(30),
        || async {
            let raised = problems(&driver.jetstream, "bert").await;
            raised
                .iter()
                .any(|(_, p)| p.uri.as_deref() == Some(later.as_str()))
                .then_some(raised)
        },
    )
    .await;
    let kinds: Vec<(CheckpointProblemKind, Severity, Option<&str>)> = raised
        .iter()
        .map(|(_, p)| (p.problem, p.severity, p.uri.as_deref()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (
                CheckpointProblemKind::WriteFailed,
                Severity::Warning,
                Some(cut.as_str())
            ),
            (
                CheckpointProblemKind::ResumeUnavailable,
                Severity::Critical,
                Some(cut.as_str())
            ),
            (
                CheckpointProblemKind::WriteFailed,
                Severity::Warning,
                Some(later.as_str())
            ),
        ]
    );
    let write_failed = &raised[0].1;
    assert!(
        write_failed.message.contains(&cut),
        "{}",
        write_failed.message
    );
    assert!(
        write_failed
            .message
            .contains(verified[0].reason.as_deref().expect("a reason")),
        "the alert carries checkpoint.verified's reason: {}",
        write_failed.message
    );
    assert!(
        raised[1].1.message.contains("starts from scratch"),
        "{}",
        raised[1].1.message
    );
    let resumes = driver.decisions::<ResumePointChosen>("bert").await;
    assert!(
        resumes.is_empty(),
        "nothing verified, nothing to resume from"
    );

    // The notifier delivers each of the three alerts, and none twice.
    let published: Vec<String> = raised.iter().map(|(id, _)| id.clone()).collect();
    eventually_within("every alert delivered", Duration::from_secs(30), || async {
        let delivered: Vec<String> = sink
            .received()
            .iter()
            .flat_map(|d| d.event_ids.clone())
            .collect();
        published
            .iter()
            .all(|id| delivered.contains(id))
            .then_some(())
    })
    .await;
    let mut times_delivered: BTreeMap<String, usize> = BTreeMap::new();
    for id in sink
        .received()
        .iter()
        .filter(|d| d.body["type"] == "alert.checkpoint")
        .flat_map(|d| d.event_ids.clone())
    {
        *times_delivered.entry(id).or_default() += 1;
    }
    assert_eq!(
        times_delivered,
        published.iter().map(|id| (id.clone(), 1)).collect(),
        "each alert delivered exactly once"
    );
    let mut lines: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for (problem, job, severity, count) in delivered_lines(&sink) {
        *lines.entry((problem, job, severity)).or_default() += count;
    }
    assert_eq!(
        lines,
        BTreeMap::from([
            (
                (
                    "ResumeUnavailable".to_string(),
                    "ml/bert".to_string(),
                    "critical".to_string()
                ),
                1
            ),
            (
                (
                    "WriteFailed".to_string(),
                    "ml/bert".to_string(),
                    "warning".to_string()
                ),
                2
            ),
        ])
    );

    notifier.shutdown.cancel();
    notifier.run_until_shutdown().await.expect("notifier stops");
    stop_manager(manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_without_a_verified_checkpoint_is_overdue_once_per_episode() {
    let nats = NatsServer::start();
    let manager = start_manager(
        &nats,
        ManagerConfig {
            overdue_floor_seconds: 1,
            overdue_check_seconds: 1,
            ..reading_volumes()
        },
    )
    .await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    driver
        .apply(&training_job(
            "gpt",
            json!({"enabled": true,
                   "storage": {"type": "pvc", "claimName": "gpt-ckpt", "mountPath": base}}),
        ))
        .await;
    driver
        .transition(
            "gpt",
            TrainingJobState::Initializing,
            TrainingJobState::Running,
            "AllWorkersRunning",
        )
        .await;
    let overdue = |count: usize| {
        let driver = &driver;
        async move {
            eventually_within(
                &format!("{count} Overdue"),
                Duration::from_secs(30),
                || async {
                    let found: Vec<_> = problems(&driver.jetstream, "gpt")
                        .await
                        .into_iter()
                        .map(|(_, p)| p)
                        .filter(|p| p.problem == CheckpointProblemKind::Overdue)
                        .collect();
                    (found.len() >= count).then_some(found)
                },
            )
            .await
        }
    };
    let first = overdue(1).await;
    assert!(
        first[0].message.contains("no verified checkpoint"),
        "{}",
        first[0].message
    );
    assert_eq!(first[0].last_checkpoint_age_seconds, None);

    // A verified checkpoint ends the episode; the next one is raised once
    // more, though the check ran every second in between.
    let dir = volume.path().join("step-100");
    write_volume_checkpoint(&dir, 100, 0.5, true);
    // No save duration: interval advice would raise the limit to 3 intervals.
    driver
        .publish(
            job_ref("gpt"),
            CheckpointReported {
                epoch: 1,
                step: 100,
                uri: dir.to_str().expect("utf-8").to_string(),
                ..CheckpointReported::default()
            },
        )
        .await;
    driver.wait_for::<ResumePointChosen>("gpt", 1).await;
    let both = overdue(2).await;
    assert_eq!(both.len(), 2, "one alert per overdue episode: {both:?}");
    assert!(both[1].last_checkpoint_age_seconds.is_some());
    stop_manager(manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_retention_policy_is_raised_once_naming_the_field_and_fix() {
    let nats = NatsServer::start();
    let manager = start_manager(&nats, reading_volumes()).await;
    let driver = Driver::connect(&nats).await;
    let volume = tempfile::tempdir().expect("tempdir");
    let base = volume.path().to_str().expect("utf-8").to_string();
    let refused = training_job(
        "t5",
        json!({"enabled": true,
               "storage": {"type": "pvc", "claimName": "t5-ckpt", "mountPath": base},
               "retention": {"keepEveryNSteps": 0}}),
    );
    driver.apply(&refused).await;
    // The same spec seen again (a resync): no second alert.
    driver.apply(&refused).await;
    // A later report on the job's lane: every earlier alert is out by its verdict.
    let dir = volume.path().join("step-100");
    write_volume_checkpoint(&dir, 100, 0.5, true);
    driver
        .report("t5", dir.to_str().expect("utf-8"), 100, 0.5, 2.0)
        .await;
    driver.wait_for::<CheckpointVerified>("t5", 1).await;
    let raised = problems(&driver.jetstream, "t5").await;
    assert_eq!(raised.len(), 1, "{raised:?}");
    let policy = &raised[0].1;
    assert_eq!(policy.problem, CheckpointProblemKind::RetentionFailed);
    assert_eq!(policy.severity, Severity::Warning);
    assert!(
        policy.message.contains(".keepEveryNSteps") && policy.message.contains("at least 1"),
        "{}",
        policy.message
    );
    stop_manager(manager).await;
}
