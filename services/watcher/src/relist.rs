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
    known: HashMap<String, ChangeEvent>,
    listing: Option<HashSet<String>>,
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
                    .map(ChangeEvent::into_deleted)
                    .collect()
            }
        }
    }

    fn applied<K: Watched>(&mut self, object: &K) -> Option<ChangeEvent> {
        let event = object.to_event(Change::Applied)?;
        if let Some(uid) = object.meta().uid.clone() {
            self.known.insert(uid, event.clone());
        }
        Some(event)
    }

    /// Objects currently known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}
