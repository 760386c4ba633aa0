//! Sweeps and external submissions through the planner, end to end.

mod cluster;

use std::collections::BTreeMap;

use cluster::eventually;
use kube::ResourceExt;
use trainyard_api::{SweepState, TrainingJobState};
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::decisions::{
    AdmissionDecided, BestTrial, ParameterValue, SweepProgressed, TrialRequested, TrialStopped,
};
use trainyard_contracts::streams;
use trainyard_contracts::submit::TrainingJobSubmitted;

fn request(index: u32, learning_rate: f64) -> TrialRequested {
    TrialRequested {
        trial_name: format!("bert-finetune-sweep-t{index:04}"),
        trial_index: index,
        parameters: BTreeMap::from([
            (
                "learningRate".to_string(),
                ParameterValue::Float(learning_rate),
            ),
            ("batchSize".to_string(), ParameterValue::Int(32)),
        ]),
        tracking: None,
    }
}

#[tokio::test]
async fn trials_become_owned_training_jobs_and_the_sweep_gets_its_status() {
    let cluster = cluster::start().await;
    let sweep = cluster.create_sweep("sweep.yaml").await;
    let name = sweep.name_any();

    cluster.publish(&name, request(0, 0.003)).await;
    cluster.publish(&name, request(0, 0.003)).await;
    let trial = eventually("the trial", || async {
        cluster
            .training_jobs()
            .get_opt("bert-finetune-sweep-t0000")
            .await
            .ok()?
    })
    .await;
    let owner = &trial.metadata.owner_references.clone().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Sweep", name.as_str())
    );
    let hp = trial.spec.hyperparameters.clone().expect("hyperparameters");
    assert_eq!((hp.learning_rate, hp.batch_size), (Some(0.003), Some(32)));
    let trials = cluster
        .training_jobs()
        .list(&Default::default())
        .await
        .expect("list")
        .items;
    assert_eq!(
        trials.len(),
        1,
        "a repeated request creates no second trial"
    );

    cluster
        .publish(
            &name,
            SweepProgressed {
                pending: 0,
                running: 1,
                succeeded: 2,
                failed: 0,
                early_stopped: 1,
                best_trial: Some(BestTrial {
                    trial_name: "bert-finetune-sweep-t0002".into(),
                    parameters: BTreeMap::from([(
                        "learningRate".to_string(),
                        ParameterValue::Float(0.001),
                    )]),
                    objective_value: 0.91,
                }),
                rungs: BTreeMap::from([(1, 4), (3, 1)]),
                finished_reason: None,
                message: None,
                objective_metric: None,
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
                tracking_warning: None,
            },
        )
        .await;
    let status = eventually("the sweep status", || async {
        cluster.sweeps().get(&name).await.ok()?.status
    })
    .await;
    assert_eq!(status.state, Some(SweepState::Running));
    assert_eq!(status.trials.expect("counts").early_stopped, 1);
    assert_eq!(status.best_trial.expect("best").objective_value, 0.91);

    // The tuner stops the running trial early: the planner stops it, Completed.
    cluster.watch_once().await;
    eventually("the trial's Job", || async {
        cluster
            .jobs()
            .get_opt("bert-finetune-sweep-t0000-a0")
            .await
            .ok()?
    })
    .await;
    cluster
        .publish(
            "bert-finetune-sweep-t0000",
            AdmissionDecided {
                attempt: 0,
                queue: "default".into(),
                flavor: "any".into(),
                node_selector: BTreeMap::new(),
                tolerations: vec![],
                placements: vec![],
                topology: BTreeMap::new(),
                capacity_type_reopened: false,
            },
        )
        .await;
    eventually("the trial admitted", || async {
        let job = cluster
            .jobs()
            .get("bert-finetune-sweep-t0000-a0")
            .await
            .ok()?;
        (job.spec?.suspend == Some(false)).then_some(())
    })
    .await;
    let workers = trial.spec.num_workers;
    cluster
        .run_workers(
            "bert-finetune-sweep-t0000-a0",
            "bert-finetune-sweep-t0000",
            0,
            workers,
        )
        .await;
    cluster
        .wait_for_state("bert-finetune-sweep-t0000", TrainingJobState::Running)
        .await;
    cluster
        .publish(
            &name,
            TrialStopped {
                trial_name: "bert-finetune-sweep-t0000".into(),
                reason: "ASHA: below the top third at rung 1".into(),
                rung: Some(1),
            },
        )
        .await;
    let stopped = cluster
        .wait_for_state("bert-finetune-sweep-t0000", TrainingJobState::Completed)
        .await;
    let conditions = stopped.status.expect("status").conditions;
    assert!(
        conditions
            .iter()
            .any(|c| c.message.as_deref().unwrap_or("").contains("ASHA")),
        "the early stop is explained: {conditions:?}"
    );
}

#[tokio::test]
async fn submissions_create_jobs_and_bad_specs_are_dead_lettered_with_the_field() {
    let cluster = cluster::start().await;
    let good: TrainingJobSubmitted = serde_json::from_value(serde_json::json!({
        "labels": {"team": "nlp"},
        "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 2}
    }))
    .expect("submission");
    cluster.publish("nightly-bert", good).await;
    let created = eventually("the submitted TrainingJob", || async {
        cluster.training_jobs().get_opt("nightly-bert").await.ok()?
    })
    .await;
    assert_eq!(
        created.labels().get("team").map(String::as_str),
        Some("nlp")
    );

    let bad: TrainingJobSubmitted = serde_json::from_value(serde_json::json!({
        "spec": {"model": "bert-base", "dataset": "wikitext", "numWorkers": 0}
    }))
    .expect("decodes; the rules are checked by the planner");
    cluster.publish("broken", bad).await;
    let letter = eventually("the dead letter", || async {
        let stream = cluster
            .runtime
            .jetstream
            .get_stream(streams::DEAD_LETTER.name)
            .await
            .ok()?;
        let message = stream.get_raw_message(1).await.ok()?;
        serde_json::from_slice::<DeadLetter>(&message.payload).ok()
    })
    .await;
    assert_eq!(letter.category, "invalid_spec");
    assert!(
        letter.reason.contains("spec.numWorkers"),
        "{}",
        letter.reason
    );
    assert!(
        cluster
            .training_jobs()
            .get_opt("broken")
            .await
            .expect("get")
            .is_none()
    );
}
