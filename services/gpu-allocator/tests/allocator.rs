//! End to end against a real nats-server: events in, decisions out, restarts,
//! dead letters.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::cost::{BudgetState, BudgetStatusReported};
use trainyard_contracts::dead_letter::DeadLetter;
use trainyard_contracts::decisions::{
    AdmissionDecided, PendingExplained, PreemptionDecided, QueueStatusReported,
};
use trainyard_contracts::events::{NodeObserved, TrainingJobChanged, TrainingQueueChanged};
use trainyard_contracts::{EntityRef, Envelope, Incoming, Payload, Service, streams};
use trainyard_gpu_allocator::{AllocatorServiceConfig, AllocatorState, Outgoing, replay};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;

const NS: &str = "ml";

async fn start(nats: &NatsServer, config: AllocatorServiceConfig) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::GpuAllocator, settings, CancellationToken::new())
        .await
        .expect("runtime");
    trainyard_gpu_allocator::start(&runtime, config)
        .await
        .expect("allocator starts");
    runtime
}

fn config() -> AllocatorServiceConfig {
    AllocatorServiceConfig {
        cycle_interval_ms: 100,
        priority_classes: [("high".to_string(), 100), ("low".to_string(), 1)].into(),
        ..AllocatorServiceConfig::default()
    }
}

async fn publish<P: Payload>(runtime: &Runtime, entity: EntityRef, payload: P) {
    let envelope = Envelope::new("test", entity, payload);
    runtime.publisher.publish(envelope).await.expect("publish");
}

async fn node(runtime: &Runtime, name: &str, gpus: u32) {
    let payload: NodeObserved = serde_json::from_value(json!({
        "change": "Applied", "allocatableGpus": gpus,
        "labels": {"nvidia.com/gpu.product": "A100", "pool": "a100"},
        "unschedulable": false, "ready": true
    }))
    .expect("node");
    publish(runtime, EntityRef::new("", name, ""), payload).await;
}

async fn queue(runtime: &Runtime, name: &str, spec: serde_json::Value) {
    let payload: TrainingQueueChanged = serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
                   "metadata": {"name": name}, "spec": spec}
    }))
    .expect("queue");
    publish(runtime, EntityRef::new("", name, ""), payload).await;
}

async fn default_queue(runtime: &Runtime, nominal: u32) {
    queue(
        runtime,
        "default",
        json!({"flavors": [{"name": "a100", "nominalQuota": nominal,
                             "nodeLabels": {"pool": "a100"}}],
               "preemption": {"withinQueue": "LowerPriority"}}),
    )
    .await;
}

async fn job(runtime: &Runtime, name: &str, workers: u32, gpus: u32, priority: Option<&str>) {
    let mut scheduling = json!({});
    if let Some(priority) = priority {
        scheduling = json!({"priority": priority});
    }
    job_with(runtime, name, workers, gpus, scheduling).await;
}

async fn job_with(
    runtime: &Runtime,
    name: &str,
    workers: u32,
    gpus: u32,
    scheduling: serde_json::Value,
) {
    let payload: TrainingJobChanged = serde_json::from_value(json!({
        "change": "Applied",
        "object": {"apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
                   "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
                                "creationTimestamp": "2024-01-01T00:00:00Z"},
                   "spec": {"model": "m", "dataset": "d", "numWorkers": workers,
                            "gpusPerWorker": gpus, "scheduling": scheduling}}
    }))
    .expect("job");
    publish(
        runtime,
        EntityRef::new(NS, name, format!("uid-{name}")),
        payload,
    )
    .await;
}

/// Every message of a stream, raw.
async fn raw_messages(runtime: &Runtime, stream: &str) -> Vec<Vec<u8>> {
    trainyard_testkit::stream_messages(&runtime.jetstream, stream, None)
        .await
        .into_iter()
        .map(|m| m.payload.to_vec())
        .collect()
}

async fn decisions<P: Payload>(runtime: &Runtime) -> Vec<(EntityRef, P)> {
    raw_messages(runtime, streams::DECISIONS.name)
        .await
        .iter()
        .filter_map(|bytes| Incoming::decode(bytes).ok())
        .filter_map(|m| {
            let entity = m.header.entity.clone();
            m.payload::<P>().ok().map(|p| (entity, p))
        })
        .collect()
}

async fn admissions(runtime: &Runtime) -> Vec<(String, AdmissionDecided)> {
    decisions::<AdmissionDecided>(runtime)
        .await
        .into_iter()
        .map(|(e, p)| (e.name, p))
        .collect()
}

use trainyard_testkit::eventually;

async fn stop(runtime: Runtime) {
    runtime.shutdown.cancel();
    runtime.run_until_shutdown().await.expect("stops");
}

fn admissions_counter(runtime: &Runtime) -> f64 {
    trainyard_testkit::metric(
        &runtime.registry,
        "trainyard_allocator_admissions_total",
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_never_admits_twice_and_new_jobs_still_get_admitted() {
    let nats = NatsServer::start();
    let first = start(&nats, config()).await;
    node(&first, "n1", 8).await;
    node(&first, "n2", 8).await;
    default_queue(&first, 32).await;
    job(&first, "a", 1, 8, None).await;
    job(&first, "b", 1, 8, None).await;
    eventually("a and b admitted", || async {
        (admissions(&first).await.len() == 2).then_some(())
    })
    .await;
    stop(first).await;

    let second = start(&nats, config()).await;
    // A watcher relist re-announces everything; only the new job is admitted.
    node(&second, "n3", 8).await;
    job(&second, "a", 1, 8, None).await;
    job(&second, "b", 1, 8, None).await;
    job(&second, "c", 1, 8, None).await;
    eventually("c admitted", || async {
        admissions(&second)
            .await
            .iter()
            .any(|(name, _)| name == "c")
            .then_some(())
    })
    .await;
    // Give a few more cycles the chance to (wrongly) admit again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let all = admissions(&second).await;
    for name in ["a", "b", "c"] {
        let count = all.iter().filter(|(n, _)| n == name).count();
        assert_eq!(count, 1, "{name} admitted {count} times: {all:?}");
    }
    assert_eq!(
        admissions_counter(&second),
        1.0,
        "the restarted allocator decided only c (JetStream dedup cannot hide a second decision here)"
    );
    let nodes: Vec<&str> = all
        .iter()
        .map(|(_, a)| a.placements[0].node.as_str())
        .collect();
    let mut distinct = nodes.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        3,
        "each 8-GPU job has its own node: {nodes:?}"
    );
    stop(second).await;
}

/// Acks every message waiting for the allocator's durable consumers, as the
/// service would once it handled them.
async fn ack_all(runtime: &Runtime, consumers: &[trainyard_contracts::ConsumerSpec]) {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use futures::StreamExt;
    for spec in consumers {
        let stream = runtime
            .jetstream
            .get_stream(spec.stream.name)
            .await
            .expect("stream");
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(spec.durable.clone()),
                filter_subjects: spec.filter_subjects.clone(),
                ack_policy: AckPolicy::Explicit,
                ..Default::default()
            })
            .await
            .expect("consumer");
        let mut batch = consumer
            .fetch()
            .max_messages(100)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .expect("fetch");
        while let Some(message) = batch.next().await {
            message.expect("message").double_ack().await.expect("ack");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_acked_after_the_last_snapshot_are_replayed_from_the_streams() {
    let nats = NatsServer::start();
    // The runtime provisions the streams; the allocator itself is driven by hand.
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::GpuAllocator, settings, CancellationToken::new())
        .await
        .expect("runtime");
    let consumers = Service::GpuAllocator.consumers();
    let replay_all = |state: AllocatorState| {
        let jetstream = runtime.jetstream.clone();
        let consumers = consumers.clone();
        async move {
            let mut state = state;
            let mut read = 0;
            for consumer in &consumers {
                read += replay(&jetstream, consumer, &mut state)
                    .await
                    .expect("replay");
            }
            (state, read)
        }
    };

    // Before the snapshot: the node was applied (and acked).
    node(&runtime, "n1", 8).await;
    ack_all(&runtime, &consumers).await;
    let (state, read) = replay_all(AllocatorState::new(config()).expect("state")).await;
    assert_eq!(read, 1);
    let snapshot = state.persisted();
    assert!(
        snapshot.applied[streams::EVENTS.name] > 0,
        "{:?}",
        snapshot.applied
    );

    // After it (acked, then the allocator died before saving): the queue and the job.
    default_queue(&runtime, 8).await;
    job(&runtime, "late", 1, 8, None).await;
    let restored = AllocatorState::restore(config(), snapshot).expect("restores");
    let (restored, read) = replay_all(restored).await;
    assert_eq!(
        read, 0,
        "messages the consumer has not acked reach it, not the replay"
    );
    ack_all(&runtime, &consumers).await;
    let (mut restored, read) = replay_all(restored).await;
    assert_eq!(
        read, 2,
        "only the messages after the snapshot are read again"
    );
    restored.cycle(gpu_allocator_core::Timestamp(1_700_000_000));
    let admitted: Vec<&str> = restored
        .outbox()
        .iter()
        .filter_map(|o| match o {
            Outgoing::Admission {
                entity, payload, ..
            } => {
                assert_eq!(payload.placements[0].node, "n1");
                Some(entity.name.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        admitted,
        ["late"],
        "the replayed job is admitted on the known node"
    );
    let (_, read) = replay_all(restored).await;
    assert_eq!(read, 0, "nothing is replayed twice");
    stop(runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_admitted_all_or_nothing_and_told_why_it_waits() {
    let nats = NatsServer::start();
    let runtime = start(&nats, config()).await;
    node(&runtime, "n1", 4).await;
    node(&runtime, "n2", 4).await;
    default_queue(&runtime, 32).await;
    job(&runtime, "gang", 3, 4, None).await;
    let pending = eventually("a pending explanation", || async {
        decisions::<PendingExplained>(&runtime)
            .await
            .into_iter()
            .find(|(e, _)| e.name == "gang")
    })
    .await;
    assert_eq!(pending.0.uid, "uid-gang");
    assert_eq!(pending.1.gpus_requested, 12);
    assert_eq!(pending.1.queue, "default");
    // Two 4-GPU nodes never hold three 4-GPU workers: waiting does not help
    // until a node joins.
    assert!(
        pending.1.message.contains("spec.numWorkers is 3"),
        "{}",
        pending.1.message
    );
    assert_eq!(
        pending.1.unschedulable.as_ref().map(|u| u.field.as_str()),
        Some("spec.numWorkers")
    );
    assert!(
        admissions(&runtime).await.is_empty(),
        "no partial admission"
    );
    // The same explanation is not repeated every cycle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let explained = decisions::<PendingExplained>(&runtime).await.len();
    assert_eq!(explained, 1);

    node(&runtime, "n3", 4).await;
    let (_, admission) = eventually("the gang admitted", || async {
        admissions(&runtime).await.into_iter().next()
    })
    .await;
    assert_eq!(admission.attempt, 0);
    assert_eq!(admission.placements.len(), 3);
    assert_eq!(admission.flavor, "a100");
    assert_eq!(
        admission.node_selector.get("pool").map(String::as_str),
        Some("a100")
    );
    assert!(
        !admission
            .node_selector
            .contains_key("kubernetes.io/hostname")
    );
    stop(runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_closed_to_the_jobs_namespace_says_so_until_it_opens() {
    let nats = NatsServer::start();
    let runtime = start(&nats, config()).await;
    node(&runtime, "n1", 8).await;
    let team_a = |namespaces: serde_json::Value| {
        json!({"flavors": [{"name": "a100", "nominalQuota": 8, "nodeLabels": {"pool": "a100"}}],
               "namespaces": namespaces})
    };
    queue(&runtime, "team-a", team_a(json!(["research"]))).await;
    job_with(&runtime, "borrowed", 1, 8, json!({"queue": "team-a"})).await;
    let (_, pending) = eventually("a pending explanation", || async {
        decisions::<PendingExplained>(&runtime)
            .await
            .into_iter()
            .find(|(e, _)| e.name == "borrowed")
    })
    .await;
    assert_eq!(pending.queue, "team-a");
    assert!(
        pending
            .message
            .contains("TrainingQueue team-a admits jobs of namespaces research only, not ml"),
        "{}",
        pending.message
    );
    assert!(admissions(&runtime).await.is_empty());

    queue(&runtime, "team-a", team_a(json!(["research", NS]))).await;
    let (name, _) = eventually("the job admitted", || async {
        admissions(&runtime).await.into_iter().next()
    })
    .await;
    assert_eq!(name, "borrowed");
    stop(runtime).await;
}

fn snapshots_saved(runtime: &Runtime) -> f64 {
    trainyard_testkit::metric(
        &runtime.registry,
        "trainyard_allocator_snapshots_total",
        &[("outcome", "ok")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explanations_go_out_without_a_snapshot_and_decisions_wait_for_one() {
    let nats = NatsServer::start();
    let runtime = start(
        &nats,
        AllocatorServiceConfig {
            // Only decisions (and shutdown) save a snapshot in this test.
            snapshot_min_interval_ms: 3_600_000,
            snapshot_every_cycles: 1_000_000,
            ..config()
        },
    )
    .await;
    node(&runtime, "n1", 4).await;
    node(&runtime, "n2", 4).await;
    default_queue(&runtime, 32).await;
    job(&runtime, "small", 1, 4, None).await;
    eventually("the small job admitted", || async {
        admissions(&runtime).await.into_iter().next()
    })
    .await;
    let saved = snapshots_saved(&runtime);
    assert!(saved >= 1.0, "the admission was saved before it went out");

    job(&runtime, "gang", 2, 4, None).await;
    eventually("the gang's pending explanation", || async {
        decisions::<PendingExplained>(&runtime)
            .await
            .into_iter()
            .find(|(e, _)| e.name == "gang")
    })
    .await;
    assert_eq!(
        snapshots_saved(&runtime),
        saved,
        "an explanation does not wait for a snapshot"
    );

    node(&runtime, "n3", 4).await;
    eventually("the gang admitted", || async {
        admissions(&runtime)
            .await
            .into_iter()
            .find(|(name, _)| name == "gang")
    })
    .await;
    assert!(
        snapshots_saved(&runtime) > saved,
        "the admission was saved before it went out"
    );
    stop(runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_job_preempts_a_lower_priority_one() {
    let nats = NatsServer::start();
    let runtime = start(&nats, config()).await;
    node(&runtime, "n1", 8).await;
    default_queue(&runtime, 8).await;
    job(&runtime, "low", 1, 8, Some("low")).await;
    eventually("low admitted", || async {
        (!admissions(&runtime).await.is_empty()).then_some(())
    })
    .await;
    job(&runtime, "high", 1, 8, Some("high")).await;
    let (victim, decision) = eventually("a preemption", || async {
        decisions::<PreemptionDecided>(&runtime)
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(victim.name, "low");
    assert_eq!(victim.uid, "uid-low");
    assert_eq!(decision.preemptor.name, "high");
    assert_eq!(decision.reason, "priority");
    assert_eq!(decision.grace_period_seconds, 120);
    stop(runtime).await;
}

async fn dead_letters(runtime: &Runtime) -> Vec<DeadLetter> {
    raw_messages(runtime, streams::DEAD_LETTER.name)
        .await
        .iter()
        .filter_map(|bytes| serde_json::from_slice(bytes).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_nodes_and_queues_are_dead_lettered_with_the_field() {
    let nats = NatsServer::start();
    let runtime = start(&nats, config()).await;
    node(&runtime, "huge", 100_000).await;
    queue(
        &runtime,
        "bad",
        json!({"cohort": "c", "flavors": [{"name": "a100", "nominalQuota": 4, "lendingLimit": 8}]}),
    )
    .await;
    let letters = eventually("two dead letters", || async {
        let letters = dead_letters(&runtime).await;
        (letters.len() >= 2).then_some(letters)
    })
    .await;
    assert!(
        letters
            .iter()
            .any(|l| l.reason.contains("allocatable[nvidia.com/gpu]")
                && l.category == "invalid_node"),
        "{letters:?}"
    );
    assert!(
        letters
            .iter()
            .any(|l| l.reason.contains("spec.flavors[0].lendingLimit")),
        "{letters:?}"
    );
    // Good messages still flow afterwards.
    node(&runtime, "n1", 8).await;
    default_queue(&runtime, 8).await;
    job(&runtime, "ok", 1, 8, None).await;
    eventually("ok admitted", || async {
        (!admissions(&runtime).await.is_empty()).then_some(())
    })
    .await;
    stop(runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_admit_each_job_once_and_the_standby_takes_over_on_a_rolling_restart() {
    let nats = NatsServer::start();
    let active = start(&nats, config()).await;
    let standby = start(&nats, config()).await;
    node(&active, "n1", 8).await;
    node(&active, "n2", 8).await;
    default_queue(&active, 32).await;
    job(&active, "a", 1, 8, None).await;
    eventually("a admitted", || async {
        (admissions(&active).await.len() == 1).then_some(())
    })
    .await;
    // The active replica decided; the standby neither consumed nor decided.
    assert_eq!(admissions_counter(&active), 1.0);
    assert_eq!(admissions_counter(&standby), 0.0);

    // A rolling restart: the active one stops, the standby takes over with
    // its snapshot and admits only what is new.
    stop(active).await;
    job(&standby, "a", 1, 8, None).await;
    job(&standby, "b", 1, 8, None).await;
    job(&standby, "c", 1, 8, None).await;
    eventually("b admitted by the new active replica", || async {
        admissions(&standby)
            .await
            .iter()
            .any(|(name, _)| name == "b")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let all = admissions(&standby).await;
    for name in ["a", "b"] {
        let count = all.iter().filter(|(n, _)| n == name).count();
        assert_eq!(count, 1, "{name} admitted {count} times: {all:?}");
    }
    assert!(
        all.iter().all(|(name, _)| name != "c"),
        "two 8-GPU nodes hold two 8-GPU jobs, not three: {all:?}"
    );
    assert_eq!(
        admissions_counter(&standby),
        1.0,
        "the new active decided b only"
    );
    stop(standby).await;
}

async fn budget(runtime: &Runtime, queue: &str, state: BudgetState) {
    let report = BudgetStatusReported {
        state,
        period_start: chrono::DateTime::from_timestamp(1_795_000_000, 0).unwrap_or_default(),
        spent: 1012.5,
        amount: 1000.0,
        currency: "USD".into(),
        message: "101% of the Monthly budget spent".into(),
    };
    publish(runtime, EntityRef::new("", queue, ""), report).await;
}

#[tokio::test]
async fn a_spent_budget_holds_new_jobs_until_the_budget_is_open_again() {
    let nats = NatsServer::start();
    let runtime = start(&nats, config()).await;
    node(&runtime, "n1", 8).await;
    default_queue(&runtime, 8).await;
    job(&runtime, "runs", 1, 4, None).await;
    eventually("the first job admitted", || async {
        admissions(&runtime)
            .await
            .into_iter()
            .find(|(name, _)| name == "runs")
    })
    .await;

    budget(&runtime, "default", BudgetState::Held).await;
    // The queue's report says it stopped before the next job arrives, so the
    // job meets the hold.
    eventually("the queue reported held", || async {
        decisions::<QueueStatusReported>(&runtime)
            .await
            .into_iter()
            .find(|(e, r)| e.name == "default" && r.reason == "BudgetSpent")
    })
    .await;
    job(&runtime, "waits", 1, 4, None).await;
    let (_, pending) = eventually("the new job told why it waits", || async {
        decisions::<PendingExplained>(&runtime)
            .await
            .into_iter()
            .find(|(e, _)| e.name == "waits")
    })
    .await;
    assert!(
        pending.message.contains("has spent its budget")
            && pending.message.contains("raise spec.budget.amount"),
        "{}",
        pending.message
    );
    assert!(
        decisions::<PreemptionDecided>(&runtime).await.is_empty(),
        "running jobs go on"
    );
    assert!(
        !admissions(&runtime)
            .await
            .iter()
            .any(|(name, _)| name == "waits")
    );

    budget(&runtime, "default", BudgetState::Open).await;
    eventually("the held job admitted once the budget is open", || async {
        admissions(&runtime)
            .await
            .into_iter()
            .find(|(name, _)| name == "waits")
    })
    .await;
    stop(runtime).await;
}
