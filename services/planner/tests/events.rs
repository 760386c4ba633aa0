//! The planner's Event recorder against an API server: repeats become a series,
//! and a series whose Event is gone starts again.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use trainyard_planner::events::EventRecorder;

fn regarding(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("trainyard.dev/v1alpha1".into()),
        kind: Some("TrainingJob".into()),
        namespace: Some("ml".into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        ..Default::default()
    }
}

async fn events_of(client: &kube::Client, name: &str) -> Vec<Event> {
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), "ml")
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.metadata.name.clone());
    events
}

#[tokio::test]
async fn repeated_events_are_counted_and_distinct_ones_created() {
    let client = kube_fake_client::ClientBuilder::new()
        .build()
        .await
        .expect("fake API server");
    let recorder = EventRecorder::new(client.clone(), "trainyard-planner");
    let job = regarding("resnet");
    for _ in 0..3 {
        recorder
            .publish(&job, true, "BackoffRestart", "worker 0 exited with 1")
            .await
            .expect("publish");
    }
    recorder
        .publish(&job, false, "Admitted", "admitted to queue default")
        .await
        .expect("publish");

    let events = events_of(&client, "resnet").await;
    assert_eq!(events.len(), 2, "{events:?}");
    let restarts = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("BackoffRestart"))
        .expect("restart event");
    assert_eq!(restarts.type_.as_deref(), Some("Warning"));
    assert_eq!(restarts.note.as_deref(), Some("worker 0 exited with 1"));
    assert_eq!(
        restarts.reporting_controller.as_deref(),
        Some("trainyard-planner")
    );
    assert_eq!(restarts.series.as_ref().map(|s| s.count), Some(3));
    let admitted = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Admitted"))
        .expect("admitted event");
    assert!(admitted.series.is_none());
}

#[tokio::test]
async fn a_repeat_of_a_deleted_event_creates_it_again() {
    let client = kube_fake_client::ClientBuilder::new()
        .build()
        .await
        .expect("fake API server");
    let recorder = EventRecorder::new(client.clone(), "trainyard-planner");
    let job = regarding("bert");
    recorder
        .publish(&job, false, "Preempted", "by ml/llm")
        .await
        .expect("publish");
    let first = events_of(&client, "bert").await;
    let name = first[0].metadata.name.clone().expect("name");
    Api::<Event>::namespaced(client.clone(), "ml")
        .delete(&name, &Default::default())
        .await
        .expect("delete");

    recorder
        .publish(&job, false, "Preempted", "by ml/llm")
        .await
        .expect("publish after the Event expired");
    let events = events_of(&client, "bert").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_ne!(events[0].metadata.name.as_deref(), Some(name.as_str()));
    assert!(events[0].series.is_none());
}
