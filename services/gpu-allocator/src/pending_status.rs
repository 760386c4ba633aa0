//! Which pending explanations are worth publishing again. Each published
//! `admission.pending` becomes a status write on its TrainingJob (the
//! planner's condition), and with thousands of jobs waiting most of what
//! changes from one cycle to the next is counts: one admission moves every
//! job behind it up by one, and a queue's usage moves every one of its jobs'
//! "GPUs short". Republishing on every change made about 9,000 messages a
//! cycle with 10,000 jobs pending (`loadtest`, `allocator_service`). So a
//! job's status is published again when its queue or why it waits changes
//! (the kind of reason, the flavor, the resource), and when its position or
//! its GPUs short moved by at least a step (a percent of the smaller of the
//! old and new value): near the head of a queue every move shows, deep in it
//! the position is refreshed every tenth or so.

use gpu_allocator_core::PendingReason;
use serde::{Deserialize, Serialize};

use trainyard_contracts::hash::{fnv1a, fnv1a_parts};

/// What the last published explanation of a job said, as far as deciding to
/// publish again goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingStatus {
    /// Hash of the job's queue and why it waits, without counts ([`cause_hash`]).
    pub cause: u64,
    /// 1-based position in its queue.
    pub position: u32,
    /// Units short (`u64::MAX` when no flavor can take the job).
    pub short: u64,
}

impl PendingStatus {
    /// The status of a job at `position` in `queue`, waiting for `reason`,
    /// whose [`cause_hash`] is `reason_cause`.
    pub fn new(reason_cause: u64, queue: &str, position: u32, reason: &PendingReason) -> Self {
        PendingStatus {
            cause: fnv1a(reason_cause, queue.as_bytes()),
            position,
            short: reason.shortfall(),
        }
    }

    /// Whether this status (the current one) should be published over
    /// `published`: another cause, or a position or shortfall moved by at
    /// least `step_percent` percent of the smaller of the two values (0:
    /// every move).
    pub fn supersedes(&self, published: &PendingStatus, step_percent: u32) -> bool {
        self.cause != published.cause
            || moved(
                u64::from(published.position),
                u64::from(self.position),
                step_percent,
            )
            || moved(published.short, self.short, step_percent)
    }
}

fn moved(from: u64, to: u64, step_percent: u32) -> bool {
    from != to
        && from.abs_diff(to).saturating_mul(100)
            >= u64::from(step_percent).saturating_mul(from.min(to))
}

/// Hash of why a job waits, leaving out every count (usage, shortfall,
/// workers that fit, times) and whether a job ahead holds the quota (a
/// cohort's hold passes from job to job and would touch every job of the
/// cohort each time): two reasons hash alike when a user would read them as
/// the same cause. A job holding quota itself is a cause of its own.
pub fn cause_hash(reason: &PendingReason) -> u64 {
    let parts: [&[u8]; 3] = match reason {
        PendingReason::QueueNotFound { queue } => [b"queue-not-found", queue.as_bytes(), b""],
        PendingReason::QueueOnHold { queue, drains } => [
            if *drains {
                b"queue-draining"
            } else {
                b"queue-on-hold"
            },
            queue.as_bytes(),
            b"",
        ],
        PendingReason::BudgetSpent { queue, drains, .. } => [
            if *drains {
                b"budget-spent-draining"
            } else {
                b"budget-spent"
            },
            queue.as_bytes(),
            b"",
        ],
        PendingReason::NamespaceNotAdmitted {
            queue, namespace, ..
        } => [
            b"namespace-not-admitted",
            queue.as_bytes(),
            namespace.as_bytes(),
        ],
        // The detail names the queue and what it allows: a changed policy is a new cause.
        PendingReason::PodPolicyRefused { field, detail, .. } => {
            [b"pod-policy-refused", field.as_bytes(), detail.as_bytes()]
        }
        PendingReason::NoMatchingFlavor { wants } => [b"no-matching-flavor", wants.as_bytes(), b""],
        PendingReason::QuotaExceeded {
            flavor,
            resource,
            holding_cohort_quota,
            ..
        } => [
            if *holding_cohort_quota {
                b"quota-holding"
            } else {
                b"quota"
            },
            flavor.as_bytes(),
            resource.as_bytes(),
        ],
        PendingReason::InsufficientCapacity {
            flavor,
            resource,
            reserved_start,
            fits_when_empty,
            held_by_other_pods,
            workers_lacking_cpu_memory,
            ..
        } => [
            match (
                reserved_start.is_some(),
                *fits_when_empty,
                *workers_lacking_cpu_memory > 0,
                *held_by_other_pods > 0,
            ) {
                (true, ..) => b"capacity-reserved",
                (false, true, true, _) => b"capacity-cpu-memory",
                (false, true, false, false) => b"capacity",
                (false, true, false, true) => b"capacity-other-pods",
                (false, false, ..) => b"capacity-never",
            },
            flavor.as_bytes(),
            resource.as_bytes(),
        ],
        PendingReason::HeldForReservation {
            flavor, resource, ..
        } => [
            b"held-for-reservation",
            flavor.as_bytes(),
            resource.as_bytes(),
        ],
        PendingReason::AwaitingPreemption { .. } => [b"awaiting-preemption", b"", b""],
        // Another field at fault, another flavor come closest or another
        // largest node (a bigger one joined, still too small) is a new
        // cause. No other kind's tag reads like a field path.
        PendingReason::Unschedulable {
            cause,
            flavor,
            largest_node,
            ..
        } => [
            cause.field().as_bytes(),
            flavor.as_bytes(),
            largest_node.as_bytes(),
        ],
    };
    fnv1a_parts(&parts)
}

#[cfg(test)]
mod tests {
    use gpu_allocator_core::{JobUid, Timestamp};

    use super::*;

    fn quota(used: u64, held_for: Option<&str>) -> PendingReason {
        quota_holding(used, held_for, false)
    }

    fn quota_holding(used: u64, held_for: Option<&str>, holding: bool) -> PendingReason {
        PendingReason::QuotaExceeded {
            flavor: "h100".into(),
            resource: "nvidia.com/gpu".into(),
            requested: 16,
            available: 100 - used.min(100),
            nominal: 100,
            used,
            held_for: held_for.map(JobUid::new),
            holding_cohort_quota: holding,
        }
    }

    fn status(position: u32, short: u64) -> PendingStatus {
        PendingStatus {
            cause: cause_hash(&quota(0, None)),
            position,
            short,
        }
    }

    #[test]
    fn counts_and_holds_ahead_do_not_change_the_cause_but_holding_and_the_flavor_do() {
        assert_eq!(cause_hash(&quota(10, None)), cause_hash(&quota(95, None)));
        assert_eq!(
            cause_hash(&quota(10, None)),
            cause_hash(&quota(10, Some("a")))
        );
        assert_ne!(
            cause_hash(&quota_holding(10, None, true)),
            cause_hash(&quota(10, None))
        );
        let capacity =
            |flavor: &str, reserved: bool, held: u64| PendingReason::InsufficientCapacity {
                flavor: flavor.into(),
                resource: "nvidia.com/gpu".into(),
                workers: 4,
                units_per_worker: 8,
                placeable_workers: 1,
                units_short: 24,
                reserved_start: reserved.then_some(Timestamp(100)),
                fits_when_empty: true,
                required_topology: None,
                held_by_other_pods: held,
                workers_lacking_cpu_memory: 0,
                cpu_memory_per_worker: Default::default(),
                node_constrained: false,
            };
        assert_ne!(
            cause_hash(&capacity("h100", false, 0)),
            cause_hash(&quota(0, None))
        );
        assert_ne!(
            cause_hash(&capacity("h100", false, 0)),
            cause_hash(&capacity("a100", false, 0))
        );
        assert_ne!(
            cause_hash(&capacity("h100", false, 0)),
            cause_hash(&capacity("h100", true, 0))
        );
        // Pods Trainyard does not manage starting to hold GPUs is a new cause;
        // how many they hold is a number, like the shortfall.
        assert_ne!(
            cause_hash(&capacity("h100", false, 0)),
            cause_hash(&capacity("h100", false, 6))
        );
        assert_eq!(
            cause_hash(&capacity("h100", false, 6)),
            cause_hash(&capacity("h100", false, 2))
        );
        // So is CPU or memory beside free GPUs running short.
        let lacking = |workers| {
            let mut reason = capacity("h100", false, 6);
            if let PendingReason::InsufficientCapacity {
                workers_lacking_cpu_memory,
                ..
            } = &mut reason
            {
                *workers_lacking_cpu_memory = workers;
            }
            reason
        };
        assert_ne!(cause_hash(&lacking(1)), cause_hash(&lacking(0)));
        assert_eq!(cause_hash(&lacking(1)), cause_hash(&lacking(3)));
    }

    #[test]
    fn near_the_head_every_move_shows_and_deep_in_line_a_tenth_does() {
        let published = status(10, 8);
        assert!(status(9, 8).supersedes(&published, 10));
        assert!(status(10, 8).supersedes(&status(11, 8), 10));
        assert!(!status(10, 8).supersedes(&published, 10));
        let deep = status(500, 8);
        assert!(!status(455, 8).supersedes(&deep, 10));
        assert!(status(454, 8).supersedes(&deep, 10));
        assert!(status(560, 8).supersedes(&deep, 10));
        assert!(!status(540, 8).supersedes(&deep, 10));
        assert!(status(499, 8).supersedes(&deep, 0), "step 0: every move");
    }

    #[test]
    fn a_job_moved_to_another_queue_is_published_again() {
        let reason = quota(10, None);
        let status = |queue: &str| PendingStatus::new(cause_hash(&reason), queue, 3, &reason);
        let published = status("team-a");
        assert!(!status("team-a").supersedes(&published, 10));
        assert!(status("team-b").supersedes(&published, 10));
    }

    #[test]
    fn the_shortfall_counts_like_the_position_and_reaching_zero_always_shows() {
        let published = status(3, 40);
        assert!(!status(3, 37).supersedes(&published, 10));
        assert!(status(3, 36).supersedes(&published, 10));
        assert!(status(3, 0).supersedes(&status(3, 1), 10));
        let other_cause = PendingStatus {
            cause: cause_hash(&PendingReason::AwaitingPreemption {
                victims: 1,
                evict_at: Timestamp(100),
            }),
            ..published
        };
        assert!(other_cause.supersedes(&published, 10));
    }
}
