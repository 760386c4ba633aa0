//! Core `v1` Events from the `events.k8s.io/v1` Events Trainyard records. A real
//! apiserver serves one set of Events through both APIs; `kubectl describe` reads the
//! core one (`involvedObject.*` field selectors), the planner writes the newer one.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{self as core, EventSource};
use k8s_openapi::api::events::v1 as events;
use serde_json::Value;

use crate::resources;
use crate::selector::Selector;
use crate::store::Store;
use crate::typed;

/// The `events.k8s.io` Events in `namespace` as core Events matching the
/// selectors, as the API server serves them. One that does not read as an
/// Event is left out (a real API server would have refused it).
pub fn recorded_as_core(
    store: &Store,
    namespace: Option<&str>,
    labels: &Selector,
    fields: &Selector,
) -> Vec<Arc<Value>> {
    let Some(recorded_type) = resources::by_name("events.events.k8s.io") else {
        return Vec::new();
    };
    let (recorded, _) = store.list(recorded_type, namespace, labels, &Selector::default());
    recorded
        .iter()
        .filter_map(|event| typed::read::<events::Event>(recorded_type, event).ok())
        .filter_map(|event| typed::write(resources::events(), &as_core(event)).ok())
        .filter(|event| fields.matches_fields(event))
        .map(Arc::new)
        .collect()
}

/// The field mapping of the apiserver's own conversion between the two versions.
fn as_core(event: events::Event) -> core::Event {
    core::Event {
        metadata: event.metadata,
        involved_object: event.regarding.unwrap_or_default(),
        related: event.related,
        reason: event.reason,
        message: event.note,
        type_: event.type_,
        action: event.action,
        event_time: event.event_time,
        source: event
            .reporting_controller
            .clone()
            .map(|controller| EventSource {
                component: Some(controller),
                ..EventSource::default()
            }),
        reporting_component: event.reporting_controller,
        reporting_instance: event.reporting_instance,
        first_timestamp: event.deprecated_first_timestamp,
        last_timestamp: event.deprecated_last_timestamp,
        count: event.deprecated_count,
        series: event.series.map(|series| core::EventSeries {
            count: Some(series.count),
            last_observed_time: Some(series.last_observed_time),
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
        let recorded = typed::read(
            resources::by_name("events.events.k8s.io").expect("served"),
            &recorded,
        )
        .expect("an events.k8s.io Event");
        let core = typed::write(resources::events(), &as_core(recorded)).expect("a core Event");
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
