//! Indices into the allocator's tables, and the map type its hot tables use.
//!
//! Every index is a slot number (`u32`): nodes, flavors, resource kinds and
//! (flavor, kind) resources in the inventory, jobs in the job arena, queues
//! and cohorts in the queue table, reasons in a cycle's reason table. The
//! state hands them out; nothing else interprets them.

use std::collections::HashMap;

/// A node's slot in the inventory.
pub(crate) type NodeIdx = u32;
/// A flavor's slot in the inventory.
pub(crate) type FlavorIdx = u32;
/// A resource kind's slot in the inventory.
pub(crate) type KindIdx = u32;
/// A (flavor, resource kind) pair's slot in the inventory.
pub(crate) type ResIdx = u32;
/// A job's slot in the job arena (reused after the job leaves).
pub(crate) type JobIdx = u32;
/// A queue's slot in the queue table.
pub(crate) type QueueIdx = u32;
/// A cohort's slot in the queue table.
pub(crate) type CohortIdx = u32;
/// A reason's place in its cycle's table of reasons (`CycleOutcome::reasons`).
pub(crate) type ReasonIdx = u32;

/// Hash map with a fast, fixed-seed hasher: per-cycle memos are hot, and a
/// fixed seed keeps every run of the same input identical.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// `units` as a signed delta, saturating.
pub(crate) fn units_i64(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}
