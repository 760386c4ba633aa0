//! A TrainingQueue's budget, from the cost-optimizer's report to the queue's
//! status, through a real NATS server and the simulated API server (the
//! queue is cluster-scoped).

use std::sync::Arc;

use chrono::Utc;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_api::TrainingQueue;
use trainyard_contracts::cost::{BudgetState, BudgetStatusReported};
use trainyard_contracts::decisions::QueueStatusReported;
use trainyard_contracts::{EntityRef, Envelope, Payload, Service};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::{NatsServer, eventually};

/// NATS, the simulated API server and the planner.
struct Stack {
    _nats: NatsServer,
    runtime: Runtime,
    client: kube::Client,
    shutdown: CancellationToken,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Stack {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let nats = NatsServer::start();
        let shutdown = CancellationToken::new();
        let store = Arc::new(trainyard_simulator::Store::default());
        let app = trainyard_simulator::apiserver::router(store, shutdown.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("bound address");
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .expect("the simulated API server runs");
        });
        let url = format!("http://{address}").parse().expect("server url");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("kube client");
        let mut settings = Settings::default();
        settings.nats.url = nats.url();
        settings.http.listen = "127.0.0.1:0".to_string();
        let runtime = Runtime::start(Service::Planner, settings, shutdown.clone())
            .await
            .expect("runtime");
        let config = planner_core::PlannerConfig {
            worker_nats_url: nats.url(),
            ..Default::default()
        };
        trainyard_planner::start(&runtime, config, client.clone()).expect("planner starts");
        Self {
            _nats: nats,
            runtime,
            client,
            shutdown,
        }
    }
}

async fn publish_queue<P: Payload>(stack: &Stack, queue: &str, payload: P) {
    let envelope = Envelope::new("test", EntityRef::new("", queue, ""), payload);
    stack
        .runtime
        .publisher
        .publish(envelope)
        .await
        .expect("publish");
}

#[tokio::test]
async fn a_budget_report_is_written_to_the_queue_status_and_kept_by_usage_reports() {
    let stack = Stack::start().await;
    let queues: Api<TrainingQueue> = Api::all(stack.client.clone());
    let queue: TrainingQueue = serde_json::from_value(json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
        "metadata": {"name": "team-a"},
        "spec": {"flavors": [{"name": "a100", "nominalQuota": 8}],
                 "budget": {"amount": 1000.0, "period": "Monthly", "thresholdsPercent": [50, 80, 100]}}
    }))
    .expect("a queue");
    queues
        .create(&PostParams::default(), &queue)
        .await
        .expect("create queue");
    let period_start =
        chrono::DateTime::<Utc>::from_timestamp(1_795_000_000, 0).unwrap_or_default();
    publish_queue(
        &stack,
        "team-a",
        BudgetStatusReported {
            state: BudgetState::Held,
            period_start,
            spent: 1012.5,
            amount: 1000.0,
            currency: "USD".into(),
            message: "101% of the Monthly budget spent".into(),
        },
    )
    .await;
    let budget = eventually("status.budget", || async {
        queues.get("team-a").await.ok()?.status?.budget
    })
    .await;
    assert_eq!(budget.state, "Held");
    assert_eq!(budget.spent, 1012.5);
    assert_eq!(budget.thresholds_crossed, vec![50, 80, 100]);
    let message = budget.message.unwrap_or_default();
    assert!(
        message.contains("kubectl patch trainingqueue team-a"),
        "{message}"
    );

    // The gpu-allocator's report rewrites the rest of the status, not the budget.
    publish_queue(
        &stack,
        "team-a",
        QueueStatusReported {
            pending: 2,
            admitted: 1,
            usage: vec![],
            weighted_share: 0,
            active: true,
            reason: "Ready".into(),
            message: "admits jobs".into(),
        },
    )
    .await;
    let status = eventually("the usage report written", || async {
        let status = queues.get("team-a").await.ok()?.status?;
        (status.pending == 2).then_some(status)
    })
    .await;
    assert_eq!(
        status.budget.map(|b| b.state).as_deref(),
        Some("Held"),
        "the budget survives the allocator's report"
    );
}
