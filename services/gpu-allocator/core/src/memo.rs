//! The speed layer: what one cycle keeps for the next to find faster. Only
//! looked up by key, never iterated, so it cannot change a decision.

use crate::cycle::{EmptySlots, QuotaBlockedShapes};

/// Kept from one cycle to the next.
#[derive(Default)]
pub(crate) struct Memo {
    /// The last cycle's quota-shortcut failures, emptied: regrown from
    /// nothing, they cost 1.5 % of a cycle's instructions. Only looked up by
    /// key, never iterated, so their room cannot change a decision. (Maps
    /// that are iterated start empty each cycle, as after a restart: reusing
    /// them all changed decisions through their iteration order.)
    pub(crate) spare_quota_blocked: QuotaBlockedShapes,
    /// `slots_when_empty` as the last cycle left it, with the
    /// `Inventory::node_changes` it was worked out at: it depends on the
    /// nodes alone, and walking them all for each reason took a fifth of
    /// a cycle where CPU binds. Only looked up by key.
    pub(crate) spare_empty_slots: (u64, EmptySlots),
}
