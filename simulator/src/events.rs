//! Core `v1` Events from the `events.k8s.io/v1` Events Trainyard records. A real
//! apiserver serves one set of Events through both APIs; `kubectl describe` reads the
//! core one (`involvedObject.*` field selectors), the planner writes the newer one.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::resources;
use crate::selector::Selector;
use crate::store::Store;

/// The `events.k8s.io` Events in `namespace` as core Events matching the selectors.
pub fn recorded_as_core(
    store: &Store,
    namespace: Option<&str>,
    labels: &Selector,
    fields: &Selector,
) -> Vec<Arc<Value>> {
    let Some(rt) = resources::by_name("events.events.k8s.io") else {
        return Vec::new();
    };
    let (recorded, _) = store.list(rt, namespace, labels, &Selector::default());
    recorded
        .iter()
        .map(|event| as_core(event))
        .filter(|event| fields.matches_fields(event))
        .map(Arc::new)
        .collect()
}

/// The field mapping of the apiserver's own conversion between the two versions.
fn as_core(event: &Value) -> Value {
    let mut core = Map::new();
    core.insert("apiVersion".into(), json!("v1"));
    core.insert("kind".into(), json!("Event"));
    let mut copy = |to: &str, from: &str| {
        if let Some(value) = event.get(from).filter(|v| !v.is_null()) {
            core.insert(to.into(), value.clone());
        }
    };
    copy("metadata", "metadata");
    copy("involvedObject", "regarding");
    copy("related", "related");
    copy("reason", "reason");
    copy("message", "note");
    copy("type", "type");
    copy("action", "action");
    copy("eventTime", "eventTime");
    copy("reportingComponent", "reportingController");
    copy("reportingInstance", "reportingInstance");
    copy("firstTimestamp", "deprecatedFirstTimestamp");
    copy("lastTimestamp", "deprecatedLastTimestamp");
    copy("count", "deprecatedCount");
    if let Some(series) = event.get("series").filter(|v| v.is_object()) {
        core.insert(
            "series".into(),
            json!({"count": series["count"], "lastObservedTime": series["lastObservedTime"]}),
        );
    }
    if let Some(controller) = event.get("reportingController").and_then(Value::as_str) {
        core.insert("source".into(), json!({"component": controller}));
    }
    Value::Object(core)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_event_reads_as_a_core_event_about_its_object() {
        let recorded = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "bert.1", "namespace": "ml"},
            "regarding": {"kind": "TrainingJob", "name": "bert", "namespace": "ml", "uid": "u1"},
            "reason": "Admitted",
            "note": "placed on 2 nodes",
            "type": "Normal",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "trainyard.dev/planner",
            "reportingInstance": "planner-0",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
        });
        let core = as_core(&recorded);
        assert_eq!(core["involvedObject"]["name"], "bert");
        assert_eq!(core["message"], "placed on 2 nodes");
        assert_eq!(core["source"]["component"], "trainyard.dev/planner");
        assert_eq!(core["series"]["count"], 3);
        let selector = Selector::parse(
            "involvedObject.kind=TrainingJob,involvedObject.name=bert,involvedObject.namespace=ml",
        )
        .expect("parses");
        assert!(selector.matches_fields(&core));
    }
}
