//! Model registration: which checkpoint of a completed job becomes a model
//! version, under which name, and whether the registry already holds it.

use crate::catalog::{Checkpoint, JobCheckpoints};
use crate::retention::RetentionPolicy;

/// The default model name template: `<namespace>-<job name>`.
pub const DEFAULT_MODEL_NAME_TEMPLATE: &str = "{namespace}-{name}";

/// The model name `template` gives a job: every `{namespace}` and `{name}`
/// replaced, surrounding blanks trimmed.
pub fn model_name(template: &str, namespace: &str, name: &str) -> String {
    template
        .replace("{namespace}", namespace)
        .replace("{name}", name)
        .trim()
        .to_string()
}

/// The checkpoint to register: the best verified one by the policy's
/// `keepBest` metric, else the newest verified one; none without a verified
/// checkpoint.
pub fn candidate<'a>(
    checkpoints: &'a JobCheckpoints,
    policy: Option<&RetentionPolicy>,
) -> Option<&'a Checkpoint> {
    checkpoints
        .best(policy.and_then(|p| p.keep_best.as_ref()))
        .or_else(|| checkpoints.latest_verified())
}

/// The model version source of checkpoint `uri`: for one on a volume (under
/// `base`, the mount path) the volume's cluster address `location`
/// (`pvc://<claim>/<directory>`, ...) followed by the rest of its path, since
/// a path inside a worker pod means nothing to the registry or to a model
/// server; any other URI (object storage) as it is.
pub fn source(uri: &str, base: &str, location: Option<&str>) -> String {
    match (location, relative_to(base, uri)) {
        (Some(location), Some(rest)) => format!("{}{rest}", location.trim_end_matches('/')),
        _ => uri.to_string(),
    }
}

/// True when `uri` lies under `base` (the same path, or below it).
pub fn within(base: &str, uri: &str) -> bool {
    relative_to(base, uri).is_some()
}

/// The rest of `uri` below `base` (empty, or starting with `/`).
fn relative_to<'a>(base: &str, uri: &'a str) -> Option<&'a str> {
    uri.strip_prefix(base.trim_end_matches('/'))
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The version among `versions` (version, source) whose source is `source`:
/// registering the same checkpoint twice reuses it. The oldest wins when
/// concurrent registrations made two.
pub fn existing_version<'a>(
    versions: impl IntoIterator<Item = (&'a str, &'a str)>,
    source: &str,
) -> Option<&'a str> {
    versions
        .into_iter()
        .filter(|(_, s)| *s == source)
        .min_by_key(|(version, _)| version.parse::<u64>().unwrap_or(u64::MAX))
        .map(|(version, _)| version)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::retention::{KeepBest, MetricMode};
    use crate::verify::{Method, Verification, Verifier};

    fn checkpoint(step: u64, loss: f64, verified: bool) -> Checkpoint {
        Checkpoint {
            uri: format!("s3://b/job/step-{step}"),
            epoch: 0,
            step,
            attempt: 0,
            metrics: BTreeMap::from([("loss".to_string(), loss)]),
            size_bytes: 0,
            save_seconds: None,
            verification: if verified {
                Verification::Verified {
                    method: Method::TrainyardManifest,
                    verifier: Verifier::Manager,
                    checksums: true,
                }
            } else {
                Verification::Incomplete {
                    reason: "no manifest".into(),
                }
            },
        }
    }

    fn catalog(checkpoints: Vec<Checkpoint>) -> JobCheckpoints {
        let mut catalog = JobCheckpoints::default();
        for c in checkpoints {
            let uri = c.uri.clone();
            let verification = c.verification.clone();
            catalog.record(c).expect("recorded");
            catalog.set_verification(&uri, verification);
        }
        catalog
    }

    fn keep_best() -> RetentionPolicy {
        RetentionPolicy {
            keep_best: Some(KeepBest {
                metric: "loss".into(),
                mode: MetricMode::Min,
                count: 1,
            }),
            ..RetentionPolicy::default()
        }
    }

    #[test]
    fn the_best_verified_checkpoint_is_registered_not_a_better_unverified_one() {
        let catalog = catalog(vec![
            checkpoint(100, 0.5, true),
            checkpoint(200, 0.2, true),
            checkpoint(300, 0.1, false),
            checkpoint(400, 0.4, true),
        ]);
        let chosen = candidate(&catalog, Some(&keep_best())).expect("a candidate");
        assert_eq!(chosen.step, 200);
    }

    #[test]
    fn without_a_best_metric_the_newest_verified_checkpoint_is_registered() {
        let catalog = catalog(vec![
            checkpoint(100, 0.5, true),
            checkpoint(200, 0.2, true),
            checkpoint(300, 0.1, false),
        ]);
        assert_eq!(candidate(&catalog, None).map(|c| c.step), Some(200));
        assert_eq!(
            candidate(&catalog, Some(&RetentionPolicy::default())).map(|c| c.step),
            Some(200)
        );
    }

    #[test]
    fn nothing_is_registered_without_a_verified_checkpoint() {
        let catalog = catalog(vec![checkpoint(100, 0.5, false)]);
        assert!(candidate(&catalog, Some(&keep_best())).is_none());
        assert!(candidate(&JobCheckpoints::default(), None).is_none());
    }

    #[test]
    fn model_names_come_from_the_template() {
        assert_eq!(
            model_name(DEFAULT_MODEL_NAME_TEMPLATE, "ml", "bert"),
            "ml-bert"
        );
        assert_eq!(model_name("models.{name}", "ml", "bert"), "models.bert");
        assert_eq!(model_name(" {namespace} ", "ml", "bert"), "ml");
    }

    #[test]
    fn a_volume_checkpoint_is_registered_at_its_volumes_address_and_others_as_they_are() {
        assert_eq!(
            source(
                "/checkpoints/step-10",
                "/checkpoints/",
                Some("pvc://shared/ml/bert")
            ),
            "pvc://shared/ml/bert/step-10"
        );
        assert_eq!(
            source(
                "/checkpoints",
                "/checkpoints",
                Some("pvc://bert-checkpoints/")
            ),
            "pvc://bert-checkpoints"
        );
        assert_eq!(
            source("s3://b/ml/bert/step-10", "s3://b/ml/bert", None),
            "s3://b/ml/bert/step-10"
        );
        assert_eq!(
            source("/elsewhere/step-10", "/checkpoints", Some("pvc://c")),
            "/elsewhere/step-10"
        );
        assert!(within("s3://b/ml/bert", "s3://b/ml/bert/step-10"));
        assert!(within("/checkpoints/", "/checkpoints/step-10"));
        assert!(!within("s3://b/ml/bert", "s3://b/ml/bert-2/step-10"));
        assert!(!within("/checkpoints", "/tmp/step-10"));
    }

    #[test]
    fn a_version_with_the_same_source_is_reused_the_oldest_first() {
        let versions = [("3", "s3://b/x"), ("1", "s3://b/y"), ("2", "s3://b/x")];
        assert_eq!(existing_version(versions, "s3://b/x"), Some("2"));
        assert_eq!(existing_version(versions, "s3://b/z"), None);
    }
}
