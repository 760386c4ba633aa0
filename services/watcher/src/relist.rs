//! Turns a kube-runtime watcher stream into change events, including the
//! deletions a watch restart implies: an object known before a relist and not
//! listed again was deleted while the watch was down.

use std::collections::{HashMap, HashSet};

use kube::runtime::watcher::Event;
use trainyard_contracts::events::Change;

use crate::mapping::{ChangeEvent, Watched};

/// Last known event per object uid, across relists.
#[derive(Debug, Default)]
pub struct Relist {
    known: HashMap<String, Known>,
    listing: Option<HashSet<String>>,
    unchanged: u64,
}

/// The last event published for an object, and its published fingerprint.
#[derive(Debug)]
struct Known {
    event: ChangeEvent,
    fingerprint: Option<u64>,
}

impl Relist {
    /// Events to publish for one watcher event.
    pub fn on_event<K: Watched>(&mut self, event: Event<K>) -> Vec<ChangeEvent> {
        match event {
            Event::Apply(object) => self.applied(&object).into_iter().collect(),
            Event::InitApply(object) => {
                let event = self.applied(&object);
                if let (Some(listing), Some(uid)) =
                    (self.listing.as_mut(), object.meta().uid.clone())
                {
                    listing.insert(uid);
                }
                event.into_iter().collect()
            }
            Event::Delete(object) => {
                let Some(uid) = object.meta().uid.clone() else {
                    return Vec::new();
                };
                self.known.remove(&uid);
                object.to_event(Change::Deleted).into_iter().collect()
            }
            Event::Init => {
                self.listing = Some(HashSet::new());
                Vec::new()
            }
            Event::InitDone => {
                let Some(listed) = self.listing.take() else {
                    return Vec::new();
                };
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|uid| !listed.contains(*uid))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .filter_map(|uid| self.known.remove(&uid))
                    .map(|known| known.event.into_deleted())
                    .collect()
            }
        }
    }

    /// The event for a created or updated object; None when Trainyard does
    /// not care about it, or it reports nothing new: its published
    /// fingerprint, or else its event, is as last published.
    fn applied<K: Watched>(&mut self, object: &K) -> Option<ChangeEvent> {
        let fingerprint = object.published_fingerprint();
        let uid = object.meta().uid.as_ref();
        let known = uid.and_then(|uid| self.known.get(uid));
        if fingerprint.is_some() && known.is_some_and(|known| known.fingerprint == fingerprint) {
            self.unchanged += 1;
            return None;
        }
        let event = object.to_event(Change::Applied)?;
        if known.is_some_and(|known| known.event.payload.reports_same(&event.payload)) {
            self.unchanged += 1;
            return None;
        }
        if let Some(uid) = uid {
            let known = Known {
                event: event.clone(),
                fingerprint,
            };
            self.known.insert(uid.clone(), known);
        }
        Some(event)
    }

    /// Changes not published since the last call because nothing their
    /// consumers act on changed.
    pub fn take_unchanged(&mut self) -> u64 {
        std::mem::take(&mut self.unchanged)
    }

    /// Objects currently known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}
