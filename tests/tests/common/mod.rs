//! What the end-to-end tests against the simulated demo cluster share: the
//! repository's files, a runtime per service, the demo cluster, a Kubernetes
//! client through the simulator's kubeconfig, and the watcher.

#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_runtime::{Runtime, Settings};
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::runner::Simulator;
use trainyard_testkit::NatsServer;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A manifest of the repository, by its path there.
pub fn manifest<K: serde::de::DeserializeOwned>(path: &str) -> K {
    let text = std::fs::read_to_string(repo().join(path)).expect("manifest readable");
    yaml_serde::from_str(&text).expect("manifest parses")
}

pub async fn runtime(service: Service, nats: &NatsServer, shutdown: &CancellationToken) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".into();
    Runtime::start(service, settings, shutdown.child_token())
        .await
        .expect("runtime starts")
}

/// The demo's simulated cluster, sped up, without random failures or
/// disruptions: every job must run to its last epoch.
pub fn demo_cluster() -> ClusterConfig {
    let mut config = ClusterConfig::load(
        &repo()
            .join("simulator/clusters/demo.yaml")
            .to_string_lossy(),
    )
    .expect("demo cluster config");
    // An hour of simulated time in about six seconds.
    config.speed = 600.0;
    // Random failures and spot reclaims would make the outcome depend on timing;
    // their handling is covered by simulator/tests/cluster.rs and the planner's
    // failure tests.
    config.failures.rate = 0.0;
    config.disruptions.spot_reclaims_per_node_hour = 0.0;
    config.disruptions.node_failures_per_node_hour = 0.0;
    config
}

/// A client connected the way the services' binaries connect: through the
/// kubeconfig the simulator writes; `call_timeout` bounds each request.
pub async fn kube_client(simulator: &Simulator, call_timeout: Option<Duration>) -> Client {
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&simulator.kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kube config");
    if let Some(timeout) = call_timeout {
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
    }
    Client::try_from(config).expect("kube client")
}

/// The watcher's runtime, its watches on `kube` started.
pub async fn start_watcher(
    nats: &NatsServer,
    shutdown: &CancellationToken,
    kube: &Client,
) -> Runtime {
    let watcher = runtime(Service::Watcher, nats, shutdown).await;
    let metrics = trainyard_watcher::WatcherMetrics::register(&watcher.registry).expect("metrics");
    trainyard_watcher::adapter::spawn_watches(&watcher, kube.clone(), &Default::default(), metrics);
    watcher
}
