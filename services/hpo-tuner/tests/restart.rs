//! A tuner restarted in the middle of a sweep goes on from its stored state:
//! no trial is requested twice, none is lost, and the sweep ends the same way.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::json;
use trainyard_api::TrainingJobState;
use trainyard_hpo_tuner::TunerConfig;
use trainyard_hpo_tuner::store::SweepState;
use trainyard_testkit::NatsServer;

const MAX_TRIALS: u32 = 10;

fn spec() -> serde_json::Value {
    json!({
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "parameters": [
            {"name": "learningRate", "type": "float", "min": 0.0001, "max": 0.1, "log": true},
            {"name": "batchSize", "type": "int", "min": 16, "max": 128, "step": 16},
            {"name": "optimizer", "type": "categorical", "values": ["adam", "adamw", "sgd"]},
            {"name": "dropout", "type": "float", "min": 0.0, "max": 0.5, "step": 0.1},
        ],
        "algorithm": {"name": "tpe", "settings": {"nStartupTrials": 3}},
        "parallelTrialCount": 3,
        "maxTrialCount": MAX_TRIALS,
        "trialTemplate": template(),
    })
}

/// Runs every requested trial that has not run yet; returns how many it ran.
async fn run_new_trials(driver: &Driver, sweep: &str, done: &mut BTreeSet<String>) -> usize {
    let mut ran = 0;
    for trial in driver.trial_requests(sweep).await {
        if done.insert(trial.trial_name.clone()) {
            let uid = format!("uid-{}", trial.trial_name);
            run_trial_to_completion(driver, &trial, &uid).await;
            ran += 1;
        }
    }
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_sweep_neither_loses_nor_repeats_trials() {
    let nats = NatsServer::start();
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let driver = Driver::connect(&nats).await;
    let sweep = sweep_object("restart", "uid-restart", spec());
    driver.apply_sweep(&sweep).await;

    // Part of the sweep with the first tuner.
    let mut done = BTreeSet::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while done.len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out running four trials"
        );
        run_new_trials(&driver, "restart", &mut done).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let first_run: Vec<_> = driver.trial_requests("restart").await;
    stop_tuner(tuner).await;

    // While no tuner runs, the requested trials go on and finish: their
    // messages wait in the streams.
    run_new_trials(&driver, "restart", &mut done).await;
    let stored_before = driver
        .jetstream
        .get_key_value("trainyard_tuner")
        .await
        .expect("bucket")
        .get("ml/restart")
        .await
        .expect("get")
        .expect("the sweep's state is stored");
    let stored_before = SweepState::decode("ml/restart", &stored_before).expect("state decodes");
    assert!(stored_before.outbox.is_empty(), "nothing left unpublished");
    assert!(!stored_before.core.trials().is_empty());

    // A new tuner on the same NATS, with the Sweep's event and a finished
    // trial's messages delivered again for good measure.
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    driver.apply_sweep(&sweep).await;
    let again = &first_run[0];
    let uid = format!("uid-{}", again.trial_name);
    let completed = driver
        .transition(&again.trial_name, &uid, TrainingJobState::Completed)
        .await;
    driver.republish(&completed, "copy").await;
    driver
        .progress(&again.trial_name, &uid, 2, &[("accuracy", 0.99)])
        .await;

    let finished = loop {
        run_new_trials(&driver, "restart", &mut done).await;
        let last = driver.progress_reports("restart").await.into_iter().last();
        if let Some(progress) = last.filter(|p| p.finished_reason.is_some()) {
            break progress;
        }
        assert!(
            done.len() <= MAX_TRIALS as usize,
            "more trials than maxTrialCount: {done:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };

    let requests = driver.trial_requests("restart").await;
    let indices = by_index(&requests);
    assert_eq!(
        indices.keys().copied().collect::<Vec<_>>(),
        (0..MAX_TRIALS).collect::<Vec<_>>(),
        "exactly trials 0..{MAX_TRIALS}"
    );
    assert_eq!(
        requests.len(),
        MAX_TRIALS as usize,
        "no trial requested twice"
    );
    for (index, request) in &indices {
        assert_eq!(request.trial_name, format!("restart-t{index:04}"));
        assert_eq!(request.parameters.len(), 4);
    }
    // The requests published before the restart are the same ones (same ids, same parameters).
    for request in &first_run {
        assert_eq!(&indices[&request.trial_index], request);
    }
    assert_eq!(
        finished.finished_reason.as_deref(),
        Some("MaxTrialsReached")
    );
    assert_eq!(finished.succeeded, MAX_TRIALS, "{finished:?}");
    assert_eq!(
        (finished.pending, finished.running, finished.failed),
        (0, 0, 0)
    );
    let best = finished.best_trial.expect("a best trial");
    let best_score = score(
        &indices[&best.trial_name[best.trial_name.len() - 4..]
            .parse::<u32>()
            .expect("index")],
    );
    assert!(
        (best.objective_value - best_score).abs() < 1e-12,
        "{best:?}"
    );
    assert!(
        driver.dead_letters().await.is_empty(),
        "nothing was dead-lettered"
    );
    assert_eq!(metric(&tuner, "trainyard_tuner_sweeps_active"), 0.0);
    stop_tuner(tuner).await;
}

/// The tuner stored a decision in its outbox and died before publishing it: the
/// next tuner publishes exactly that decision (same trial, same parameters) and
/// the redelivered message that caused it changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_deciding_and_publishing_loses_nothing() {
    use hpo_tuner_core::SweepEvent;
    use trainyard_contracts::decisions::TrialRequested;
    use trainyard_hpo_tuner::routing::{self, OutgoingPayload};

    let nats = NatsServer::start();
    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let driver = Driver::connect(&nats).await;
    let mut spec = spec();
    spec["algorithm"] = json!({"name": "random"});
    spec["parallelTrialCount"] = json!(2);
    spec["maxTrialCount"] = json!(4);
    let sweep = sweep_object("crash", "uid-crash", spec);
    driver.apply_sweep(&sweep).await;
    let first = eventually("two trials", 20, || async {
        let requests = driver.trial_requests("crash").await;
        (requests.len() == 2).then_some(requests)
    })
    .await;
    stop_tuner(tuner).await;

    // What the tuner would have stored on handling "t0 completed" before dying.
    let bucket = driver
        .jetstream
        .get_key_value("trainyard_tuner")
        .await
        .expect("bucket");
    let entry = bucket
        .entry("ml/crash")
        .await
        .expect("entry")
        .expect("state stored");
    let mut state = SweepState::decode("ml/crash", &entry.value).expect("decodes");
    let t0 = first[0].clone();
    let accuracy = score(&t0);
    let decisions = state
        .core
        .on_event(SweepEvent::TrialCompleted {
            trial_id: t0.trial_name.clone(),
            value: Some(accuracy),
        })
        .expect("completes");
    let mut outbox =
        routing::decision_messages(&state.sweep, &state.core, &state.codec, &decisions);
    state.progress_seq += 1;
    let progress = routing::progress_of(
        &state.core,
        &state.codec,
        &state.metadata,
        state.tracking_warning.as_deref(),
    );
    outbox.push(routing::Outgoing {
        message_id: routing::progress_message_id(&state.sweep, state.progress_seq),
        correlation_id: None,
        causation_id: None,
        payload: OutgoingPayload::SweepProgressed(progress.clone()),
    });
    state.last_progress = Some(progress);
    let decided: Vec<TrialRequested> = outbox
        .iter()
        .filter_map(|m| match &m.payload {
            OutgoingPayload::TrialRequested(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(decided.len(), 1, "t0's slot goes to t2");
    state.outbox = outbox;
    bucket
        .update("ml/crash", state.encode().expect("encodes"), entry.revision)
        .await
        .expect("stored");
    // The message that caused it was never acked, so it comes again.
    run_trial_to_completion(&driver, &t0, "uid-t0").await;

    let tuner = start_tuner(&nats, TunerConfig::default()).await;
    let mut done: BTreeSet<String> = [t0.trial_name.clone()].into();
    let finished = loop {
        run_new_trials(&driver, "crash", &mut done).await;
        if let Some(p) = driver
            .progress_reports("crash")
            .await
            .into_iter()
            .last()
            .filter(|p| p.finished_reason.is_some())
        {
            break p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let requests = driver.trial_requests("crash").await;
    let indices = by_index(&requests);
    assert_eq!(
        indices.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(indices[&2], decided[0], "the stored decision, as decided");
    assert_eq!(
        finished.finished_reason.as_deref(),
        Some("MaxTrialsReached")
    );
    assert_eq!(finished.succeeded, 4);
    stop_tuner(tuner).await;
}
