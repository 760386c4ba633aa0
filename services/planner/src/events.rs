//! Kubernetes Events on TrainingJobs. An Event that repeats (same object, type,
//! reason and note within six minutes) is counted into the first one's
//! `series` rather than created again, as client-go's recorder does. Unlike
//! kube-runtime's `Recorder`, which scans its whole cache on every publish and
//! keeps every Event it sent for six minutes, the cache here is swept on an
//! interval and holds at most `SERIES_CAPACITY` small entries.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::error::PlannerError;
use crate::kubernetes::is_not_found;

/// How long after its last occurrence an Event still counts repeats (client-go's value).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// How often expired series are dropped: a sweep visits every entry.
const SWEEP_EVERY: SignedDuration = SignedDuration::from_secs(10);
/// Most series tracked at once; beyond it a repeat is created as a new Event.
const SERIES_CAPACITY: usize = 4096;

/// What makes two Events the same one happening again.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct SeriesKey {
    namespace: String,
    name: String,
    uid: String,
    warning: bool,
    reason: String,
    note: String,
}

#[derive(Debug)]
struct Series {
    event_name: String,
    count: i32,
    last_observed: Timestamp,
}

/// What to send for one occurrence.
#[derive(Debug, PartialEq, Eq)]
enum Occurrence {
    /// A new Event object named `event_name`.
    First { event_name: String },
    /// The `count`th occurrence of the Event named `event_name`.
    Repeat { event_name: String, count: i32 },
}

/// The series seen recently; pure, time comes in as an argument.
#[derive(Debug)]
struct SeriesCache {
    series: HashMap<SeriesKey, Series>,
    capacity: usize,
    last_sweep: Timestamp,
    /// Last nanosecond stamp used in an Event name, so names never collide.
    last_stamp: i128,
}

impl SeriesCache {
    fn new(capacity: usize) -> Self {
        Self {
            series: HashMap::new(),
            capacity,
            last_sweep: Timestamp::UNIX_EPOCH,
            last_stamp: 0,
        }
    }

    fn occur(&mut self, key: &SeriesKey, now: Timestamp) -> Occurrence {
        if now.duration_since(self.last_sweep) >= SWEEP_EVERY {
            self.series
                .retain(|_, s| now.duration_since(s.last_observed) < SERIES_WINDOW);
            self.last_sweep = now;
        }
        if let Some(series) = self.series.get_mut(key)
            && now.duration_since(series.last_observed) < SERIES_WINDOW
        {
            series.count += 1;
            series.last_observed = now;
            return Occurrence::Repeat {
                event_name: series.event_name.clone(),
                count: series.count,
            };
        }
        Occurrence::First {
            event_name: self.start(key, now),
        }
    }

    /// Starts a series (when there is room) and names its Event.
    fn start(&mut self, key: &SeriesKey, now: Timestamp) -> String {
        self.last_stamp = now.as_nanosecond().max(self.last_stamp + 1);
        let event_name = format!("{}.{:x}", key.name, self.last_stamp);
        if self.series.len() < self.capacity || self.series.contains_key(key) {
            self.series.insert(
                key.clone(),
                Series {
                    event_name: event_name.clone(),
                    count: 1,
                    last_observed: now,
                },
            );
        }
        event_name
    }

    /// Starts the series again: its first Event is gone.
    fn restart(&mut self, key: &SeriesKey, now: Timestamp) -> String {
        self.forget(key);
        self.start(key, now)
    }

    /// Drops a series whose Event could not be written, so the next
    /// occurrence creates it again.
    fn forget(&mut self, key: &SeriesKey) {
        self.series.remove(key);
    }
}

/// Publishes Events for one reporting controller.
pub struct EventRecorder {
    client: Client,
    controller: String,
    cache: Mutex<SeriesCache>,
}

impl EventRecorder {
    pub fn new(client: Client, controller: &str) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            cache: Mutex::new(SeriesCache::new(SERIES_CAPACITY)),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, SeriesCache> {
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one occurrence of an Event on `regarding`.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), PlannerError> {
        let key = SeriesKey {
            namespace: regarding.namespace.clone().unwrap_or_default(),
            name: regarding.name.clone().unwrap_or_default(),
            uid: regarding.uid.clone().unwrap_or_default(),
            warning,
            reason: reason.to_string(),
            note: note.to_string(),
        };
        let now = Timestamp::now();
        let occurrence = self.cache().occur(&key, now);
        let namespace = if key.namespace.is_empty() {
            "default"
        } else {
            &key.namespace
        };
        let events = Api::<Event>::namespaced(self.client.clone(), namespace);
        let result = match &occurrence {
            Occurrence::Repeat { event_name, count } => {
                let patch = json!({"series": EventSeries {
                    count: *count,
                    last_observed_time: MicroTime(now),
                }});
                match events
                    .patch(event_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    // The first occurrence is gone (Events expire): start a new series.
                    Err(err) if is_not_found(&err) => {
                        let event_name = self.cache().restart(&key, now);
                        self.create(&events, &event_name, regarding, &key, now)
                            .await
                    }
                    other => other.map(|_| ()),
                }
            }
            Occurrence::First { event_name } => {
                self.create(&events, event_name, regarding, &key, now).await
            }
        };
        result
            .inspect_err(|_| self.cache().forget(&key))
            .map_err(PlannerError::kube(format!("record event {reason}")))
    }

    async fn create(
        &self,
        events: &Api<Event>,
        event_name: &str,
        regarding: &ObjectReference,
        key: &SeriesKey,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let event = Event {
            metadata: ObjectMeta {
                name: Some(event_name.to_string()),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            // The planner's Events name what happened by their reason alone.
            action: Some(key.reason.clone()),
            reason: Some(key.reason.clone()),
            note: Some(key.note.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.controller.clone()),
            type_: Some(if key.warning { "Warning" } else { "Normal" }.to_string()),
            ..Default::default()
        };
        events
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, reason: &str) -> SeriesKey {
        SeriesKey {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            warning: false,
            reason: reason.into(),
            note: "note".into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("valid time")
    }

    #[test]
    fn a_repeat_within_the_window_counts_into_the_first_event() {
        let mut cache = SeriesCache::new(16);
        let Occurrence::First { event_name } = cache.occur(&key("a", "Admitted"), at(0)) else {
            panic!("first occurrence creates an Event");
        };
        assert!(event_name.starts_with("a."), "{event_name}");
        assert_eq!(
            cache.occur(&key("a", "Admitted"), at(60)),
            Occurrence::Repeat {
                event_name: event_name.clone(),
                count: 2
            }
        );
        // The window runs from the last occurrence, not the first.
        assert_eq!(
            cache.occur(&key("a", "Admitted"), at(60 + 350)),
            Occurrence::Repeat {
                event_name,
                count: 3
            }
        );
    }

    #[test]
    fn a_different_note_reason_or_object_is_a_new_event() {
        let mut cache = SeriesCache::new(16);
        cache.occur(&key("a", "Admitted"), at(0));
        let mut other_note = key("a", "Admitted");
        other_note.note = "another".into();
        for other in [other_note, key("a", "Running"), key("b", "Admitted")] {
            assert!(matches!(
                cache.occur(&other, at(1)),
                Occurrence::First { .. }
            ));
        }
    }

    #[test]
    fn after_the_window_the_same_event_starts_a_new_series() {
        let mut cache = SeriesCache::new(16);
        let first = cache.occur(&key("a", "Admitted"), at(0));
        let again = cache.occur(&key("a", "Admitted"), at(361));
        assert!(matches!(again, Occurrence::First { .. }));
        assert_ne!(first, again, "a new Event gets a new name");
    }

    #[test]
    fn event_names_never_collide_within_one_instant() {
        let mut cache = SeriesCache::new(16);
        let names: Vec<_> = ["A", "B", "C"]
            .iter()
            .map(|reason| match cache.occur(&key("a", reason), at(0)) {
                Occurrence::First { event_name } => event_name,
                repeat => panic!("{repeat:?}"),
            })
            .collect();
        assert_ne!(names[0], names[1]);
        assert_ne!(names[1], names[2]);
    }

    #[test]
    fn the_cache_stays_bounded_and_expired_series_are_swept() {
        let mut cache = SeriesCache::new(3);
        for name in ["a", "b", "c", "d"] {
            cache.occur(&key(name, "Admitted"), at(0));
        }
        assert_eq!(cache.series.len(), 3);
        // Beyond the capacity a repeat is a new Event rather than a count.
        assert!(matches!(
            cache.occur(&key("d", "Admitted"), at(1)),
            Occurrence::First { .. }
        ));
        // Once the window has passed, the next sweep empties the cache.
        cache.occur(&key("e", "Admitted"), at(400));
        assert_eq!(cache.series.len(), 1);
    }

    #[test]
    fn a_forgotten_series_is_created_again() {
        let mut cache = SeriesCache::new(16);
        cache.occur(&key("a", "Admitted"), at(0));
        cache.forget(&key("a", "Admitted"));
        assert!(matches!(
            cache.occur(&key("a", "Admitted"), at(1)),
            Occurrence::First { .. }
        ));
    }

    #[test]
    fn a_restarted_series_counts_from_its_new_event() {
        let mut cache = SeriesCache::new(16);
        let Occurrence::First { event_name: first } = cache.occur(&key("a", "Admitted"), at(0))
        else {
            panic!("first occurrence creates an Event");
        };
        let second = cache.restart(&key("a", "Admitted"), at(1));
        assert_ne!(first, second);
        assert_eq!(
            cache.occur(&key("a", "Admitted"), at(2)),
            Occurrence::Repeat {
                event_name: second,
                count: 2
            }
        );
    }
}
