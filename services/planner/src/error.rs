use thiserror::Error;

/// What can go wrong in the planner adapter.
#[derive(Debug, Error)]
pub enum PlannerError {
    /// A Kubernetes API call failed.
    #[error("kubernetes {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    /// The TrainingJob was deleted while a message about it was handled
    /// (its deletion event finalizes it); nothing to retry.
    #[error("trainingjob {namespace}/{name} is gone")]
    TrainingJobGone { namespace: String, name: String },
    /// No Kubernetes configuration (in-cluster or kubeconfig) could be loaded.
    #[error("kubernetes client: {0}; run in a cluster or set KUBECONFIG")]
    Client(#[source] kube::Error),
    /// Runtime or configuration failure.
    #[error(transparent)]
    Runtime(#[from] trainyard_runtime::RuntimeError),
    /// Saving or loading job state in the KV bucket failed.
    #[error("state store: {0}")]
    Store(String),
    /// Another writer changed the job's stored state since this replica read
    /// it: the state is read again and the message retried.
    #[error("state conflict: {0}")]
    StateConflict(String),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(String),
    /// A value could not be encoded as JSON.
    #[error("cannot encode {0}")]
    Encode(String),
}

impl PlannerError {
    pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| PlannerError::Kube {
            action,
            source: Box::new(source),
        }
    }

    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            PlannerError::Kube { .. } => "kubernetes",
            PlannerError::TrainingJobGone { .. } => "gone",
            PlannerError::Client(_) => "client",
            PlannerError::Runtime(_) => "runtime",
            PlannerError::Store(_) => "store",
            PlannerError::StateConflict(_) => "state_conflict",
            PlannerError::Metrics(_) => "metrics",
            PlannerError::Encode(_) => "encode",
        }
    }
}
