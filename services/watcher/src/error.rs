use thiserror::Error;

/// What can stop the watcher from starting.
#[derive(Debug, Error)]
pub enum WatcherError {
    /// No Kubernetes configuration (in-cluster or kubeconfig) could be loaded.
    #[error("kubernetes client: {0}; run in a cluster or set KUBECONFIG")]
    Kube(#[source] kube::Error),
    /// The `watcher` config section is invalid.
    #[error(transparent)]
    Config(#[from] trainyard_runtime::RuntimeError),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
}
