//! Indices into the allocator's tables, and the map type its hot tables use.
//!
//! Every index is a slot number in one table, and each table has its own
//! index type: nodes, flavors, resource kinds, (flavor, kind) resources and
//! node filters in the inventory, jobs in the job arena, queues and cohorts
//! in the queue table, reasons in a cycle's reason table. Zones and racks
//! are numbered from 1 in the order first met, 0 being a node without the
//! label (`ZoneIdx::ABSENT`, `RackIdx::ABSENT`). Each is a `u32`
//! in a `#[repr(transparent)]` newtype, so an index of one table cannot be
//! passed where another's is expected, at no cost. The state hands them
//! out; nothing else interprets them.

use std::collections::HashMap;

/// Defines a slot index type over `u32`: ordered and hashed as the number
/// is, so maps and sorts keyed by it behave exactly as on the bare number.
macro_rules! slot_index {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub(crate) struct $name(u32);

        #[allow(dead_code, reason = "not every table needs every conversion")]
        impl $name {
            /// The index of slot `slot` of its table (`u32::MAX` beyond:
            /// tables never grow that far).
            #[inline]
            pub(crate) fn from_slot(slot: usize) -> Self {
                Self(u32::try_from(slot).unwrap_or(u32::MAX))
            }

            /// The slot number, for packing into a key.
            #[inline]
            pub(crate) const fn number(self) -> u32 {
                self.0
            }

            /// Each entry of `table` with its index.
            #[inline]
            pub(crate) fn enumerate<T>(table: &[T]) -> impl Iterator<Item = (Self, &T)> {
                (0..).zip(table).map(|(slot, entry)| (Self(slot), entry))
            }

            /// Its slot in its table.
            #[inline]
            pub(crate) const fn slot(self) -> usize {
                self.0 as usize
            }
        }

        /// Unit tests name slots by number.
        #[cfg(test)]
        impl From<u32> for $name {
            fn from(slot: u32) -> Self {
                Self(slot)
            }
        }
    };
}

slot_index!(
    /// A node's slot in the inventory.
    NodeIdx
);
slot_index!(
    /// A flavor's slot in the inventory.
    FlavorIdx
);
slot_index!(
    /// A resource kind's slot in the inventory.
    KindIdx
);
slot_index!(
    /// A (flavor, resource kind) pair's slot in the inventory.
    ResourceIdx
);
slot_index!(
    /// An interned node filter's slot (a job's node selector, affinity and
    /// tolerations); slot 0 is the filter that admits every node.
    FilterIdx
);
slot_index!(
    /// A job's slot in the job arena (reused after the job leaves).
    JobIdx
);
slot_index!(
    /// A queue's slot in the queue table.
    QueueIdx
);
slot_index!(
    /// A cohort's slot in the queue table.
    CohortIdx
);
slot_index!(
    /// A reason's place in its cycle's table of reasons (`CycleOutcome::reasons`).
    ReasonIdx
);

/// Defines the id type of one kind of interned label value over `u32`: 0
/// is the label absent (`ABSENT`), n the n-th value interned. Ordered and
/// hashed as the number is.
macro_rules! label_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub(crate) struct $name(u32);

        impl $name {
            /// Whether it stands for a node without the label.
            #[inline]
            pub(crate) const fn is_absent(self) -> bool {
                self.0 == 0
            }
        }

        impl LabelId for $name {
            const ABSENT: Self = Self(0);

            #[inline]
            fn from_number(number: u32) -> Self {
                Self(number)
            }

            #[inline]
            fn number(self) -> u32 {
                self.0
            }
        }

        /// Unit tests name values by number.
        #[cfg(test)]
        impl From<u32> for $name {
            fn from(number: u32) -> Self {
                Self(number)
            }
        }
    };
}

/// An interned label value's id as its number, and back: what the
/// interner and a snapshot's intern order need.
pub(crate) trait LabelId: Copy {
    /// A node without the label.
    const ABSENT: Self;

    fn from_number(number: u32) -> Self;
    fn number(self) -> u32;
}

label_id!(
    /// A zone (`topology.kubernetes.io/zone` label value) in the inventory.
    ZoneIdx
);
label_id!(
    /// A rack / NVLink domain (the configured rack label's value) in the
    /// inventory, within its zone: `rack-1` of two zones are two racks.
    RackIdx
);

/// Hash map with a fast, fixed-seed hasher: per-cycle memos are hot, and a
/// fixed seed keeps every run of the same input identical.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// `units` as a signed delta, saturating.
pub(crate) fn units_i64(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

impl FilterIdx {
    /// The filter of a job without node constraints, interned first.
    pub(crate) const ANY_NODE: Self = Self(0);
}
