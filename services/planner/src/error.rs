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
    /// The worker credentials key cannot be read or used.
    #[error("worker credentials: {0}")]
    Credentials(String),
}

impl PlannerError {
    pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| PlannerError::Kube {
            action,
            source: Box::new(source),
        }
    }

    /// Passing by nature: the API server throttled (429), failed (5xx), did
    /// not answer in time or could not be reached, or another writer changed
    /// the object or the state meanwhile (409, a state conflict). Handled
    /// again with backoff for as long as it lasts, never dead-lettered.
    pub fn is_transient(&self) -> bool {
        match self {
            PlannerError::Kube { source, .. } => transient_kube_error(source),
            PlannerError::StateConflict(_) => true,
            _ => false,
        }
    }

    /// Another writer changed the object since it was read (409): it is read
    /// again before the next attempt.
    pub fn is_conflict(&self) -> bool {
        match self {
            PlannerError::Kube { source, .. } => {
                matches!(source.as_ref(), kube::Error::Api(status) if status.code == 409)
            }
            PlannerError::StateConflict(_) => true,
            _ => false,
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
            PlannerError::Credentials(_) => "credentials",
            PlannerError::Encode(_) => "encode",
        }
    }
}

/// 409, 429 and 5xx answers, and failures to get an answer at all (a refused
/// connection, a timeout); not an answer that refuses the request itself.
fn transient_kube_error(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => {
            matches!(status.code, 409 | 429) || (500..600).contains(&status.code)
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

impl From<PlannerError> for trainyard_runtime::HandleError {
    fn from(err: PlannerError) -> Self {
        if err.is_transient() {
            Self::Transient(err.to_string())
        } else {
            Self::Retry(err.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> PlannerError {
        let status = kube::core::Status::failure("simulated", "Simulated").with_code(code);
        PlannerError::kube("apply job ml/bert")(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn throttling_server_errors_and_conflicts_are_transient_refusals_are_not() {
        for code in [409, 429, 500, 503, 504] {
            assert!(api(code).is_transient(), "{code}");
        }
        for code in [400, 403, 404, 422] {
            assert!(!api(code).is_transient(), "{code}");
        }
        assert!(api(409).is_conflict() && !api(503).is_conflict());
        assert!(PlannerError::StateConflict("revision 3".into()).is_transient());
        assert!(!PlannerError::Encode("job".into()).is_transient());
        assert!(matches!(
            trainyard_runtime::HandleError::from(api(429)),
            trainyard_runtime::HandleError::Transient(_)
        ));
        assert!(matches!(
            trainyard_runtime::HandleError::from(api(403)),
            trainyard_runtime::HandleError::Retry(_)
        ));
    }
}
