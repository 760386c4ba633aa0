//! What subscribers that never read Kubernetes (the notifier) need with a
//! transition: the job's labels and notification annotations, its Sweep,
//! links, the failure's exit code and class, the fix, final metrics and
//! duration.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use trainyard_api::{ANNOTATION_NOTIFY_PREFIX, ANNOTATION_RUN_URL, TrainingJob, TrainingJobState};
use trainyard_contracts::EntityRef;
use trainyard_contracts::lifecycle::TransitionContext;

use crate::decide::{REASON_PODS_NOT_CREATED, REASON_PODS_NOT_READY};
use crate::failure::{FailureCause, WorkerFailure};

/// The transition's context; `failure` is the failure that ended the attempt,
/// when the job restarts or fails because of it.
pub(crate) fn transition_context(
    job: &TrainingJob,
    to: TrainingJobState,
    reason: &str,
    failure: Option<&WorkerFailure>,
    metrics: &BTreeMap<String, f64>,
    started: Option<DateTime<Utc>>,
    ended: Option<DateTime<Utc>>,
) -> TransitionContext {
    let meta = &job.metadata;
    let annotations = meta.annotations.clone().unwrap_or_default();
    let mut links = BTreeMap::new();
    if let Some(url) = annotations.get(ANNOTATION_RUN_URL) {
        links.insert("run".to_string(), url.clone());
    }
    if let Some(uri) = job
        .spec
        .monitoring
        .as_ref()
        .and_then(|m| m.mlflow_tracking_uri.as_ref())
        .filter(|uri| uri.starts_with("http://") || uri.starts_with("https://"))
    {
        links.insert("tracking".to_string(), uri.clone());
    }
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Sweep")
        .map(|o| EntityRef::new(meta.namespace.clone().unwrap_or_default(), &o.name, &o.uid));
    let (exit_code, exit_class) = match failure {
        Some(failure) => (
            exit_code(&failure.cause),
            Some(
                if failure.is_retryable() {
                    "retryable"
                } else {
                    "permanent"
                }
                .to_string(),
            ),
        ),
        None => (None, None),
    };
    TransitionContext {
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: annotations
            .into_iter()
            .filter(|(key, _)| key.starts_with(ANNOTATION_NOTIFY_PREFIX))
            .collect(),
        owner,
        links,
        exit_code,
        exit_class,
        fix: (to == TrainingJobState::Failed)
            .then(|| fix(reason, failure.map(|f| &f.cause)))
            .flatten(),
        final_metrics: if to == TrainingJobState::Completed {
            metrics.clone()
        } else {
            BTreeMap::new()
        },
        duration_seconds: match (started, ended) {
            (Some(started), Some(ended)) => (ended - started).to_std().ok().map(|d| d.as_secs()),
            _ => None,
        },
    }
}

fn exit_code(cause: &FailureCause) -> Option<i32> {
    match cause {
        FailureCause::ExitCode { code, .. } => Some(*code),
        FailureCause::Signal { exit_code, .. } => Some(*exit_code),
        _ => None,
    }
}

/// What the user can do about a failure, by its reason and cause.
fn fix(reason: &str, cause: Option<&FailureCause>) -> Option<String> {
    if let Some(FailureCause::ExitCode {
        reason: Some(r), ..
    }) = cause
        && r == "OOMKilled"
    {
        return Some("the worker ran out of memory: lower the batch size or raise the workers' memory, then submit again".into());
    }
    let text = match reason {
        "PermanentFailure" | "WorkerFailed" => {
            "read the failed worker's logs (kubectl logs), fix the training code or data, then submit again; failurePolicy.restartPolicy OnFailure restarts such failures automatically"
        }
        "BackoffLimitExceeded" => {
            "the restarts allowed by failurePolicy.backoffLimit are used: fix the cause of the repeated failures, or raise the limit, then submit again"
        }
        "DeadlineExceeded" => {
            "raise failurePolicy.activeDeadlineSeconds, or resume from the latest checkpoint in a new TrainingJob"
        }
        REASON_PODS_NOT_CREATED => {
            "Kubernetes refused the workers' pods (the message names why: the namespace's ResourceQuota, a PriorityClass that does not exist, pod security admission): fix that, then submit again"
        }
        REASON_PODS_NOT_READY => {
            "the workers' pods never all ran (the message names the first worker's reason, e.g. an image that cannot be pulled or a missing Secret): fix that, then submit again"
        }
        _ => return None,
    };
    Some(text.to_string())
}
