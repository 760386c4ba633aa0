//! Submissions over NATS are tenants: the subject's namespace and name (which
//! the submitter's NATS permissions bind to the namespaces it owns), the
//! envelope's entity and the TrainingJob's namespace must agree; the namespace
//! must be one the installation accepts submissions into; and a submission may
//! only overwrite a TrainingJob an earlier submission created.

use std::collections::BTreeMap;

use serde_json::Value;
use trainyard_api::{TrainingJobSpec, TrainingQueue};
use trainyard_contracts::EntityRef;
use trainyard_contracts::subject::ParsedSubject;
use trainyard_contracts::submit::{SubmissionError, SubmissionResult};

/// Label the planner puts on TrainingJobs it created from a submission; only
/// those may be changed by a later submission.
pub const LABEL_SUBMITTED: &str = "trainyard.dev/submitted";
const SUBMITTED: &str = "nats";

/// Namespaces no submission may create a TrainingJob in, whatever the config
/// says: the cluster's own and Trainyard's.
const SYSTEM_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "trainyard-system",
];

/// Why a submission is refused: a bounded category and every problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub category: &'static str,
    pub errors: Vec<SubmissionError>,
}

impl Rejection {
    fn one(category: &'static str, field: &str, message: String) -> Self {
        Self {
            category,
            errors: vec![SubmissionError {
                field: field.to_string(),
                message,
            }],
        }
    }

    /// The result the submitter hears.
    pub fn result(&self) -> SubmissionResult {
        SubmissionResult {
            accepted: false,
            category: Some(self.category.to_string()),
            errors: self.errors.clone(),
        }
    }

    /// One line for the dead letter.
    pub fn reason(&self) -> String {
        self.errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A submission that passed every check: the TrainingJob to create or update.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    pub namespace: String,
    pub name: String,
    pub spec: TrainingJobSpec,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Checks a submission before anything is read from the cluster. `subject` is
/// the subject it was stored under, `payload` its raw JSON, `allowed` the
/// namespaces submissions may go to (empty: any but the system namespaces).
pub fn check_submission(
    subject: Option<&ParsedSubject>,
    entity: &EntityRef,
    payload: &Value,
    allowed: &[String],
) -> Result<Accepted, Rejection> {
    let Some(subject) = subject else {
        return Err(Rejection::one(
            "entity_mismatch",
            "subject",
            "publish on trainyard.submit.trainingjob.<namespace>.<name>".to_string(),
        ));
    };
    let subject_namespace = subject.namespace.clone().unwrap_or_default();
    if subject_namespace != entity.namespace || subject.name != entity.name {
        return Err(Rejection::one(
            "entity_mismatch",
            "entity",
            format!(
                "the envelope names {}/{} but was published for {}/{}; publish on the subject of the entity it names",
                entity.namespace, entity.name, subject_namespace, subject.name
            ),
        ));
    }
    if let Some(namespace) = payload
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        && namespace != entity.namespace
    {
        return Err(Rejection::one(
            "entity_mismatch",
            "metadata.namespace",
            format!(
                "the TrainingJob names namespace {namespace} but the submission is for {}; drop metadata.namespace or make them agree",
                entity.namespace
            ),
        ));
    }
    let namespace = entity.namespace.as_str();
    let refused = SYSTEM_NAMESPACES.contains(&namespace)
        || (!allowed.is_empty() && !allowed.iter().any(|a| a == namespace));
    if namespace.is_empty() || refused {
        return Err(Rejection::one(
            "namespace_not_allowed",
            "entity.namespace",
            format!(
                "submissions into namespace {namespace:?} are not accepted; submit into a namespace listed in the planner's submit_namespaces"
            ),
        ));
    }
    if !is_dns_label(&entity.name) {
        return Err(Rejection::one(
            "invalid_spec",
            "entity.name",
            format!(
                "{:?} is not a valid name: use lowercase letters, digits and '-', at most 63 characters",
                entity.name
            ),
        ));
    }
    let spec = TrainingJobSpec::from_json(payload.get("spec").cloned().unwrap_or(Value::Null))
        .map_err(|errors| Rejection {
            category: "invalid_spec",
            errors: errors
                .into_iter()
                .map(|e| SubmissionError {
                    field: e.path,
                    message: e.message,
                })
                .collect(),
        })?;
    let labels = string_map(payload, "labels")?;
    let annotations = string_map(payload, "annotations")?;
    let mut labels = labels;
    labels.insert(LABEL_SUBMITTED.to_string(), SUBMITTED.to_string());
    Ok(Accepted {
        namespace: entity.namespace.clone(),
        name: entity.name.clone(),
        spec,
        labels,
        annotations,
    })
}

/// A submission whose pods ask for something its TrainingQueue's
/// `spec.podPolicy` does not allow (a hostPath volume, a PriorityClass off
/// the allow-list, ...) is refused before any TrainingJob is created: the
/// gpu-allocator would never admit it. `queue` is the queue the spec names,
/// as stored now; unknown, the submission goes on and the job waits for the
/// queue like any other.
pub fn check_pod_policy(
    accepted: &Accepted,
    queue: Option<&TrainingQueue>,
) -> Result<(), Rejection> {
    let Some(queue) = queue else {
        return Ok(());
    };
    let policy = queue
        .spec
        .pod_policy
        .as_ref()
        .map(trainyard_api::PodPolicy::rule)
        .unwrap_or_default();
    let requests = trainyard_api::pod_requests(&accepted.spec);
    let Some(refused) = policy.refusal(&requests) else {
        return Ok(());
    };
    Err(Rejection::one(
        "policy_violation",
        &refused.field,
        format!(
            "TrainingQueue {}'s spec.podPolicy does not allow {}: remove {}, or submit to a queue that allows it",
            accepted.spec.queue_name(),
            refused.kind.describe(),
            refused.field
        ),
    ))
}

/// A submission may replace a TrainingJob only if one created it.
pub fn check_overwrite(
    accepted: &Accepted,
    existing_labels: &BTreeMap<String, String>,
) -> Result<(), Rejection> {
    if existing_labels.get(LABEL_SUBMITTED).map(String::as_str) == Some(SUBMITTED) {
        return Ok(());
    }
    Err(Rejection::one(
        "not_owned",
        "entity.name",
        format!(
            "TrainingJob {}/{} exists and was not created by a submission; choose another name or change it with kubectl",
            accepted.namespace, accepted.name
        ),
    ))
}

fn string_map(payload: &Value, field: &str) -> Result<BTreeMap<String, String>, Rejection> {
    match payload.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(value) => serde_json::from_value(value.clone()).map_err(|err| {
            Rejection::one(
                "invalid_spec",
                field,
                format!("{err}; give a map of strings to strings"),
            )
        }),
    }
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trainyard_contracts::subject;

    fn parsed(s: &str) -> Option<ParsedSubject> {
        subject::parse(s)
    }

    fn spec() -> Value {
        json!({"spec": {"model": "bert", "dataset": "wiki", "numWorkers": 1}})
    }

    fn check(subject: &str, entity: (&str, &str), payload: &Value) -> Result<Accepted, Rejection> {
        check_submission(
            parsed(subject).as_ref(),
            &EntityRef::new(entity.0, entity.1, ""),
            payload,
            &[],
        )
    }

    #[test]
    fn a_spec_its_queues_pod_policy_refuses_is_rejected_naming_the_field() {
        let payload = json!({"spec": {
            "model": "bert", "dataset": "wiki", "numWorkers": 1,
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        }});
        let accepted = check(
            "trainyard.submit.trainingjob.ml.bert",
            ("ml", "bert"),
            &payload,
        )
        .expect("tenancy and spec pass");
        let queue: TrainingQueue = serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
            "metadata": {"name": "default"},
            "spec": {"flavors": [{"name": "a100", "nominalQuota": 8}]},
        }))
        .expect("queue parses");
        let rejection = check_pod_policy(&accepted, Some(&queue)).expect_err("refused");
        assert_eq!(rejection.category, "policy_violation");
        assert_eq!(rejection.errors[0].field, "spec.volumes[0].hostPath");
        assert_eq!(
            rejection.errors[0].message,
            "TrainingQueue default's spec.podPolicy does not allow hostPath volumes: remove spec.volumes[0].hostPath, or submit to a queue that allows it"
        );

        let mut open = queue.clone();
        open.spec.pod_policy = Some(trainyard_api::PodPolicy {
            allowed_volume_types: vec!["hostPath".into()],
            ..Default::default()
        });
        assert!(check_pod_policy(&accepted, Some(&open)).is_ok());
        assert!(
            check_pod_policy(&accepted, None).is_ok(),
            "an unknown queue: the job waits for it"
        );
    }

    #[test]
    fn a_matching_submission_is_accepted_and_marked() {
        let accepted = check(
            "trainyard.submit.trainingjob.3.ml.bert",
            ("ml", "bert"),
            &spec(),
        )
        .expect("accepted");
        assert_eq!(accepted.labels[LABEL_SUBMITTED], "nats");
        assert!(check_overwrite(&accepted, &accepted.labels).is_ok());
        let err = check_overwrite(&accepted, &BTreeMap::new()).expect_err("kubectl's job");
        assert_eq!(err.category, "not_owned");
    }

    #[test]
    fn subject_and_entity_must_agree() {
        let err = check(
            "trainyard.submit.trainingjob.3.ml.bert",
            ("kube-system", "bert"),
            &spec(),
        )
        .expect_err("mismatch");
        assert_eq!(err.category, "entity_mismatch");
        let mut payload = spec();
        payload["metadata"] = json!({"namespace": "other"});
        let err = check(
            "trainyard.submit.trainingjob.3.ml.bert",
            ("ml", "bert"),
            &payload,
        )
        .expect_err("object elsewhere");
        assert_eq!(err.errors[0].field, "metadata.namespace");
    }

    #[test]
    fn system_and_unlisted_namespaces_are_refused() {
        let err = check(
            "trainyard.submit.trainingjob.3.kube-system.x",
            ("kube-system", "x"),
            &spec(),
        )
        .expect_err("system namespace");
        assert_eq!(err.category, "namespace_not_allowed");
        let err = check_submission(
            parsed("trainyard.submit.trainingjob.3.ml.bert").as_ref(),
            &EntityRef::new("ml", "bert", ""),
            &spec(),
            &["team-a".to_string()],
        )
        .expect_err("not listed");
        assert_eq!(err.category, "namespace_not_allowed");
    }

    #[test]
    fn enum_errors_keep_their_field_path() {
        let payload = json!({"spec": {"model": "bert", "dataset": "wiki", "numWorkers": 1, "framework": "mxnet"}});
        let err = check(
            "trainyard.submit.trainingjob.3.ml.bert",
            ("ml", "bert"),
            &payload,
        )
        .expect_err("bad enum");
        assert_eq!(err.category, "invalid_spec");
        assert_eq!(err.errors[0].field, "spec.framework", "{err:?}");
    }
}
