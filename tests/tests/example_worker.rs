//! `examples/train.py` speaks the worker contract: its messages decode with the
//! Rust contracts, it checkpoints and resumes, and it obeys the stop command.

use std::path::Path;
use std::process::Command;

use trainyard_contracts::worker::{CheckpointReported, ProgressReported};
use trainyard_contracts::{Incoming, Service, streams};
use trainyard_runtime::Runtime;
use trainyard_testkit::NatsServer;

fn script() -> String {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/train.py"))
        .to_string_lossy()
        .into_owned()
}

/// The worker library from this checkout, whether or not it is pip-installed.
fn library() -> String {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../sdk/python/src"))
        .to_string_lossy()
        .into_owned()
}

fn run_worker(nats: &NatsServer, job: &str, extra: &[(&str, String)]) {
    let status = Command::new("python3")
        .arg(script())
        .env("PYTHONPATH", library())
        .env("TRAINYARD_NATS_URL", nats.url())
        .env("TRAINYARD_NAMESPACE", "ml")
        .env("TRAINYARD_JOB", job)
        .env("TRAINYARD_ATTEMPT", "0")
        .env("TRAINYARD_WORKER_INDEX", "0")
        .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
        .status()
        .expect("python3 runs (scripts/test.sh installs nats-py)");
    assert!(status.success(), "train.py failed: {status}");
}

async fn worker_messages(runtime: &Runtime, job: &str) -> Vec<Incoming> {
    let filter = format!("trainyard.worker.*.*.ml.{job}");
    trainyard_testkit::stream_messages(&runtime.jetstream, streams::WORKER.name, Some(&filter))
        .await
        .iter()
        .map(|m| Incoming::decode(&m.payload).expect("a valid envelope"))
        .collect()
}

#[tokio::test]
async fn train_py_reports_checkpoints_and_resumes() {
    let nats = NatsServer::start();
    let mut settings = trainyard_runtime::Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(
        Service::Planner,
        settings,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .expect("streams provisioned");
    let checkpoints = tempfile::tempdir().expect("temp dir");
    let dir = checkpoints.path().to_string_lossy().into_owned();

    run_worker(
        &nats,
        "toy",
        &[
            ("EPOCHS", "4".into()),
            ("CHECKPOINT_DIR", dir.clone()),
            ("CHECKPOINT_FREQUENCY", "2".into()),
        ],
    );
    let messages = worker_messages(&runtime, "toy").await;
    let progress: Vec<ProgressReported> = messages
        .iter()
        .filter(|m| m.is::<ProgressReported>())
        .map(|m| m.payload().expect("progress payload"))
        .collect();
    let epochs: Vec<u32> = progress.iter().map(|p| p.epoch).collect();
    assert_eq!(epochs, [1, 2, 3, 4]);
    assert!(
        progress[3].metrics["loss"] < progress[0].metrics["loss"],
        "it learns"
    );
    let saved: Vec<CheckpointReported> = messages
        .iter()
        .filter(|m| m.is::<CheckpointReported>())
        .map(|m| m.payload().expect("checkpoint payload"))
        .collect();
    assert_eq!(saved.iter().map(|c| c.epoch).collect::<Vec<_>>(), [2, 4]);
    // Each checkpoint is a directory whose manifest was written last.
    assert!(
        Path::new(&saved[0].uri)
            .join("trainyard-manifest.json")
            .exists()
    );

    // A new attempt resumes after epoch 2 instead of starting over.
    run_worker(
        &nats,
        "toy-resumed",
        &[
            ("EPOCHS", "4".into()),
            ("RESUME_FROM", saved[0].uri.clone()),
        ],
    );
    let resumed: Vec<u32> = worker_messages(&runtime, "toy-resumed")
        .await
        .iter()
        .filter(|m| m.is::<ProgressReported>())
        .map(|m| m.payload::<ProgressReported>().expect("progress").epoch)
        .collect();
    assert_eq!(resumed, [3, 4]);
}
