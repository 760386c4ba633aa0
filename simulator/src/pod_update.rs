//! Which changes the API server lets a client make to a pod's spec once the pod
//! exists: scheduling gates may only be removed (KEP-3521), and while the pod is
//! still gated its node selector may gain keys (KEP-3838), which is how a queue
//! such as Kueue places a gated pod before releasing it. Nothing else in the spec
//! may change; metadata and status are not limited by these rules.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodSchedulingGate, PodSpec};

/// A pod spec change the API server refuses (422 Invalid), as it words it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForbiddenPodUpdate {
    #[error(
        "spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate '{0}'"
    )]
    NewGate(String),
    #[error(
        "spec.schedulingGates: Forbidden: only deletion is allowed, but scheduling gate '{0}' was moved or repeated"
    )]
    MovedGate(String),
    #[error(
        "spec.nodeSelector: Forbidden: only additions to spec.nodeSelector are allowed (no mutations or deletions)"
    )]
    NodeSelectorChanged,
    #[error(
        "spec.nodeSelector: Forbidden: only additions to the node selector are allowed while the pod has scheduling gates"
    )]
    NodeSelectorWithoutGates,
    #[error(
        "spec: Forbidden: pod updates may not change fields other than spec.schedulingGates (deletions only) and spec.nodeSelector (additions while the pod has scheduling gates); changed: {0}"
    )]
    OtherFields(String),
}

/// Checks the spec of `next` against that of `current`, the stored pod.
pub fn check(current: &Pod, next: &Pod) -> Result<(), ForbiddenPodUpdate> {
    let absent = PodSpec::default();
    let old = current.spec.as_ref().unwrap_or(&absent);
    let new = next.spec.as_ref().unwrap_or(&absent);
    if old == new {
        return Ok(());
    }
    check_gates(gates(old), gates(new))?;
    check_node_selector(
        old.node_selector.as_ref(),
        new.node_selector.as_ref(),
        !gates(old).is_empty(),
    )?;
    let changed = other_changes(old, new);
    if changed.is_empty() {
        return Ok(());
    }
    let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
    Err(ForbiddenPodUpdate::OtherFields(changed.join(", ")))
}

/// The spec's scheduling gates; absent is none.
fn gates(spec: &PodSpec) -> &[PodSchedulingGate] {
    spec.scheduling_gates.as_deref().unwrap_or_default()
}

/// The new gates must be the old ones less some: a subsequence.
fn check_gates(
    old: &[PodSchedulingGate],
    new: &[PodSchedulingGate],
) -> Result<(), ForbiddenPodUpdate> {
    let mut remaining = old.iter();
    for gate in new {
        if !remaining.any(|kept| kept == gate) {
            let name = gate.name.clone();
            return Err(if old.contains(gate) {
                ForbiddenPodUpdate::MovedGate(name)
            } else {
                ForbiddenPodUpdate::NewGate(name)
            });
        }
    }
    Ok(())
}

/// Every old key must keep its value; new keys only while the pod is `gated`.
/// Absent and empty are the same selector.
fn check_node_selector(
    old: Option<&BTreeMap<String, String>>,
    new: Option<&BTreeMap<String, String>>,
    gated: bool,
) -> Result<(), ForbiddenPodUpdate> {
    let keys = |selector: Option<&BTreeMap<String, String>>| selector.map_or(0, BTreeMap::len);
    let kept = old
        .into_iter()
        .flatten()
        .all(|(key, value)| new.and_then(|new| new.get(key)) == Some(value));
    match (kept, keys(new) == keys(old)) {
        (true, true) => Ok(()),
        _ if !gated => Err(ForbiddenPodUpdate::NodeSelectorWithoutGates),
        (true, false) => Ok(()),
        (false, _) => Err(ForbiddenPodUpdate::NodeSelectorChanged),
    }
}

/// The spec fields, other than the gates and the node selector, that differ,
/// by the names the API gives them.
fn other_changes(old: &PodSpec, new: &PodSpec) -> BTreeSet<String> {
    let others = |spec: &PodSpec| PodSpec {
        scheduling_gates: None,
        node_selector: None,
        ..spec.clone()
    };
    let (old, new) = (others(old), others(new));
    if old == new {
        return BTreeSet::new();
    }
    // Only to name the fields: the typed specs already differ.
    let fields = |spec: &PodSpec| match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    let (old, new) = (fields(&old), fields(&new));
    old.keys()
        .chain(new.keys())
        .filter(|field| old.get(*field) != new.get(*field))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodStatus;
    use serde_json::{Value, json};

    use super::*;

    fn pod(gates: &[&str], selector: Value) -> Pod {
        let gates: Vec<Value> = gates.iter().map(|name| json!({"name": name})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"schedulingGates": gates, "nodeSelector": selector, "containers": [{"name": "c", "image": "x"}]},
        }))
        .expect("a pod")
    }

    #[test]
    fn gates_may_only_be_removed() {
        let gated = pod(&["a", "b", "c"], json!({}));
        for kept in [&["a", "c"][..], &["b"], &[]] {
            assert_eq!(check(&gated, &pod(kept, json!({}))), Ok(()), "{kept:?}");
        }
        assert_eq!(
            check(&gated, &pod(&["a", "b", "c", "d"], json!({}))),
            Err(ForbiddenPodUpdate::NewGate("d".into()))
        );
        assert_eq!(
            check(&gated, &pod(&["c", "a"], json!({}))),
            Err(ForbiddenPodUpdate::MovedGate("a".into()))
        );
        assert_eq!(
            check(&pod(&[], json!({})), &pod(&["a"], json!({}))),
            Err(ForbiddenPodUpdate::NewGate("a".into()))
        );
        let mut ungated = gated.clone();
        if let Some(spec) = &mut ungated.spec {
            spec.scheduling_gates = None;
        }
        assert_eq!(check(&gated, &ungated), Ok(()), "an absent list is empty");
    }

    #[test]
    fn a_gated_pods_node_selector_may_only_gain_keys() {
        let gated = pod(&["g"], json!({"pool": "a"}));
        let added = pod(&["g"], json!({"pool": "a", "host": "n-1"}));
        assert_eq!(check(&gated, &added), Ok(()));
        let released = pod(&[], json!({"pool": "a", "host": "n-1"}));
        assert_eq!(check(&gated, &released), Ok(()), "in the same write");
        for changed in [json!({"pool": "b"}), json!({"host": "n-1"}), json!(null)] {
            assert_eq!(
                check(&gated, &pod(&["g"], changed.clone())),
                Err(ForbiddenPodUpdate::NodeSelectorChanged),
                "{changed}"
            );
        }
        let no_selector = pod(&["g"], json!(null));
        assert_eq!(check(&no_selector, &pod(&["g"], json!({}))), Ok(()));
        assert_eq!(check(&no_selector, &added), Ok(()));
    }

    #[test]
    fn an_ungated_pods_node_selector_is_fixed() {
        let ungated = pod(&[], json!({"pool": "a"}));
        let added = pod(&[], json!({"pool": "a", "host": "n-1"}));
        assert_eq!(
            check(&ungated, &added),
            Err(ForbiddenPodUpdate::NodeSelectorWithoutGates)
        );
        let bound = pod(&[], json!({}));
        assert_eq!(
            check(&bound, &pod(&[], json!({"pool": "a"}))),
            Err(ForbiddenPodUpdate::NodeSelectorWithoutGates)
        );
        assert_eq!(
            check(&bound, &pod(&[], json!(null))),
            Ok(()),
            "empty is absent"
        );
    }

    #[test]
    fn other_spec_fields_are_fixed_but_metadata_and_status_are_not() {
        let gated = pod(&["g"], json!({}));
        let mut changed = gated.clone();
        if let Some(spec) = &mut changed.spec {
            spec.containers[0].image = Some("y".into());
            spec.node_name = Some("n-0".into());
        }
        let refused = check(&gated, &changed);
        assert_eq!(
            refused,
            Err(ForbiddenPodUpdate::OtherFields(
                "containers, nodeName".into()
            ))
        );
        assert!(
            refused
                .err()
                .is_some_and(|e| e.to_string().starts_with("spec: Forbidden: "))
        );
        let mut relabelled = gated.clone();
        relabelled.metadata.labels = Some([("l".to_owned(), "1".to_owned())].into());
        relabelled.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        });
        assert_eq!(check(&gated, &relabelled), Ok(()));
    }
}
