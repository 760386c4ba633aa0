//! Grouping in time, as Alertmanager does it: the first event of a group waits
//! `group_wait` for company, later ones go out `group_interval` after the last
//! send; an alert repeated inside `repeat_interval` is not sent again. Time is
//! an input, so tests drive it without sleeping.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::event::Event;
use crate::routing::Routed;

/// Events of one group that are due, with whatever the caller attached to each.
#[derive(Debug, Clone)]
pub struct Batch<M> {
    pub routed: Routed,
    pub members: Vec<(Event, M)>,
}

#[derive(Debug)]
struct Group<M> {
    routed: Routed,
    pending: Vec<(Event, M)>,
    flush_at: Option<Instant>,
    last_flush: Option<Instant>,
    /// Alert fingerprints sent, and when.
    sent: HashMap<String, Instant>,
}

/// What [`Grouper::add`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Queued,
    /// The same alert went out less than `repeat_interval` ago.
    Repeat,
}

/// Groups of events waiting to be sent, by group key.
#[derive(Debug)]
pub struct Grouper<M> {
    groups: BTreeMap<String, Group<M>>,
}

impl<M> Default for Grouper<M> {
    fn default() -> Self {
        Self {
            groups: BTreeMap::new(),
        }
    }
}

/// Alerts are states that can be raised again and again; lifecycle events are
/// facts, each told once.
fn repeats(event: &Event) -> bool {
    event.kind.starts_with("alert.") || event.kind.starts_with("budget.")
}

impl<M> Grouper<M> {
    pub fn add(&mut self, routed: Routed, event: Event, member: M, now: Instant) -> Added {
        let group = self
            .groups
            .entry(routed.group_key.clone())
            .or_insert_with(|| Group {
                routed,
                pending: Vec::new(),
                flush_at: None,
                last_flush: None,
                sent: HashMap::new(),
            });
        if repeats(&event)
            && group.sent.get(&event.fingerprint).is_some_and(|at| {
                now.saturating_duration_since(*at) < group.routed.policy.repeat_interval
            })
        {
            return Added::Repeat;
        }
        if group.flush_at.is_none() {
            group.flush_at = Some(match group.last_flush {
                None => now + group.routed.policy.group_wait,
                Some(last) => (last + group.routed.policy.group_interval).max(now),
            });
        }
        group.pending.push((event, member));
        Added::Queued
    }

    /// Takes every group whose time has come; forgets groups idle for longer
    /// than their intervals.
    pub fn due(&mut self, now: Instant) -> Vec<Batch<M>> {
        let mut out = Vec::new();
        self.groups.retain(|_, group| {
            if group.flush_at.is_some_and(|at| at <= now) {
                group.flush_at = None;
                group.last_flush = Some(now);
                let members = std::mem::take(&mut group.pending);
                for (event, _) in &members {
                    if repeats(event) {
                        group.sent.insert(event.fingerprint.clone(), now);
                    }
                }
                out.push(Batch {
                    routed: group.routed.clone(),
                    members,
                });
                return true;
            }
            let policy = &group.routed.policy;
            let keep_for = policy.group_interval.max(policy.repeat_interval);
            group.flush_at.is_some()
                || group
                    .last_flush
                    .is_some_and(|last| now.saturating_duration_since(last) < keep_for)
        });
        out
    }

    /// When the next group is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.groups.values().filter_map(|g| g.flush_at).min()
    }

    /// Events waiting in all groups.
    pub fn pending(&self) -> usize {
        self.groups.values().map(|g| g.pending.len()).sum()
    }
}
