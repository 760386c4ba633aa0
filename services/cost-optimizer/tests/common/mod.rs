//! What the cost-optimizer's tests against a real nats-server share: the
//! catalog, starting the service, publishing as another service, reading
//! what it published.

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::events::NodeObserved;
use trainyard_contracts::{EntityRef, Incoming, Payload, Service};
use trainyard_cost_optimizer::CostConfig;
use trainyard_runtime::{Publisher, Runtime, Settings};
use trainyard_testkit::NatsServer;
use trainyard_testkit::stream_messages;

pub const CATALOG: &str = r#"
currency: USD
products: [A100-SXM4-80GB]
prices:
  - {product: A100-SXM4-80GB, capacityType: on-demand, pricePerGpuHour: 4.0, effectiveFrom: "2020-01-01T00:00:00Z"}
  - {product: A100-SXM4-80GB, capacityType: spot, pricePerGpuHour: 1.5, effectiveFrom: "2020-01-01T00:00:00Z"}
interruption:
  - {bucket: "5-10%"}
"#;

/// The cost-optimizer's runtime (its buckets provisioned), without the service.
pub async fn runtime(nats: &NatsServer) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    settings.shutdown_grace_seconds = 5;
    Runtime::start(Service::CostOptimizer, settings, CancellationToken::new())
        .await
        .expect("runtime starts")
}

pub async fn start_with(nats: &NatsServer, config: CostConfig) -> Runtime {
    let runtime = runtime(nats).await;
    trainyard_cost_optimizer::start(&runtime, config)
        .await
        .expect("cost-optimizer starts");
    runtime
}

pub fn publisher(runtime: &Runtime, as_service: Service) -> Publisher {
    Publisher::new(
        runtime.jetstream.clone(),
        as_service,
        runtime.metrics.clone(),
    )
}

pub fn node(name: &str, capacity: &str) -> NodeObserved {
    serde_json::from_value(json!({
        "change": "Applied", "allocatableGpus": 8,
        "labels": {"nvidia.com/gpu.product": "A100-SXM4-80GB", "karpenter.sh/capacity-type": capacity,
                   "topology.kubernetes.io/zone": "zone-a", "kubernetes.io/hostname": name},
        "taints": [], "unschedulable": false, "ready": true
    }))
    .expect("node")
}

pub async fn payloads<P: Payload>(runtime: &Runtime, stream: &str) -> Vec<(EntityRef, P)> {
    stream_messages(&runtime.jetstream, stream, None)
        .await
        .into_iter()
        .filter_map(|m| Incoming::decode(&m.payload).ok())
        .filter(|m| m.is::<P>())
        .filter_map(|m| Some((m.header.entity.clone(), m.payload::<P>().ok()?)))
        .collect()
}

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    trainyard_testkit::eventually_within(what, Duration::from_secs(20), check).await
}
