//! The admission cycle, in five steps:
//! 1. evictions: victims whose grace period ended (or who reported their
//!    checkpoint) release their GPUs and go back to pending;
//! 2. preemptors whose victims are all gone are admitted first, so the
//!    capacity they paid for is not taken by someone else;
//! 3. jobs that held a reservation, a cohort quota hold or a queue hold last
//!    cycle are evaluated next, so they keep it until they start;
//! 4. the main pass walks every pending job, queues interleaved by weighted
//!    dominant share, and admits each one that fits quota and concrete nodes
//!    now; blocked jobs at the front get backfill reservations;
//! 5. a bounded number of still-blocked jobs look for preemption victims.

pub(crate) mod admit;
pub(crate) mod cpu_only;
pub(crate) mod evaluate;
pub(crate) mod placement;
pub(crate) mod preempt;
pub(crate) mod queue_order;
pub(crate) mod queue_position;
pub(crate) mod quota_holds;
pub(crate) mod reservation;
pub(crate) mod victim_search;

use std::sync::Arc;

use crate::cycle::quota_holds::{CohortQueueHold, QuotaHold};
use crate::cycle::reservation::Reservations;
use crate::decision::{CycleOutcome, CycleStats, Eviction, EvictionReason};
use crate::ids::CohortIdx;
use crate::ids::{FastMap, JobIdx, QueueIdx, ReasonIdx, ResIdx};
use crate::memo::{CycleMemo, EarlyFailures};
use crate::pending::PendingReason;
use crate::state::jobs::Job;
use crate::types::{JobUid, Timestamp};

use crate::allocator::Allocator;
use crate::cycle::queue_position::QueuePositions;

/// Scratch state of one cycle.
#[derive(Default)]
pub(crate) struct CycleCtx {
    /// The speed layer: answers kept for jobs that would be answered alike.
    pub(crate) memo: CycleMemo,
    /// Jobs found waiting so far, per queue: their queue positions.
    pub(crate) positions: QueuePositions,
    /// Failures of jobs evaluated before the main pass.
    pub(crate) early: EarlyFailures,
    /// Jobs given a reservation this cycle, in order.
    pub(crate) reserved_order: Vec<JobUid>,
    /// Reasons of jobs blocked by their queue's hold, by (queue, resource,
    /// units, queue usage).
    pub(crate) queue_hold_reasons: FastMap<(QueueIdx, ResIdx, u64, u64), ReasonIdx>,
    /// Reasons of jobs their queue refuses, by queue and namespace (none
    /// for a queue on hold): one per cause, however many jobs wait for it.
    pub(crate) refusals: FastMap<QueueIdx, FastMap<String, ReasonIdx>>,
    /// Cohort pool headroom held for the first job that only the pool
    /// blocks, per (cohort, resource).
    pub(crate) quota_holds: FastMap<(CohortIdx, ResIdx), QuotaHold>,
    /// A queue's nominal quota kept for one of its blocked jobs, per (queue,
    /// resource): the units that job needs (see `hold_queue_quota`).
    pub(crate) queue_holds: FastMap<(QueueIdx, ResIdx), QuotaHold>,
    /// `queue_holds` by (the holding queue's cohort, resource), each group
    /// in the order the holds were made: what `kept_by_queue_holds` needs
    /// of the map, for each borrower checked, without walking all of it.
    pub(crate) queue_holds_by_cohort: FastMap<(CohortIdx, ResIdx), Vec<CohortQueueHold>>,
    pub(crate) reservations: Reservations,
    /// Failures that may try preemption (blocked by quota or capacity), in
    /// line order: (slot in the pending explanations, job).
    pub(crate) may_preempt: Vec<(usize, JobIdx)>,
    pub(crate) stats: CycleStats,
    /// By queue: bumped by every admission and every new quota or queue
    /// hold in the queue's cohort (see `quota_changed`): what a quota check
    /// of the queue saw is valid while its epoch stays.
    pub(crate) quota_epochs: Vec<u64>,
    /// Every reason made this cycle, each once: failures name them by index
    /// (see `Pending::reason`). Handed to the outcome.
    pub(crate) reasons: Vec<Arc<PendingReason>>,
    /// Every job evaluated in full: what the quota shortcut is checked against.
    #[cfg(test)]
    pub(crate) no_quota_shortcut: bool,
}

impl CycleCtx {
    #[cfg(not(test))]
    pub(crate) fn quota_shortcut(&self) -> bool {
        true
    }

    #[cfg(test)]
    pub(crate) fn quota_shortcut(&self) -> bool {
        !self.no_quota_shortcut
    }

    /// Lists a job that holds a reservation or quota among those evaluated
    /// first next cycle (see `evaluate_reserved_first`), once: a job that
    /// holds both was evaluated twice, and a second evaluation could admit
    /// it past the reservation the first had just made for it, which then
    /// held other jobs back for a job already running.
    pub(crate) fn evaluate_first_next_cycle(&mut self, uid: &JobUid) {
        if !self.reserved_order.contains(uid) {
            self.reserved_order.push(uid.clone());
        }
    }

    pub(crate) fn quota_epoch(&self, queue: QueueIdx) -> u64 {
        self.quota_epochs.get(queue as usize).copied().unwrap_or(0)
    }

    /// Adds a reason to the cycle's table.
    pub(crate) fn add_reason(&mut self, reason: PendingReason) -> ReasonIdx {
        let idx = ReasonIdx::try_from(self.reasons.len()).unwrap_or(ReasonIdx::MAX);
        self.reasons.push(Arc::new(reason));
        idx
    }

    pub(crate) fn reason(&self, idx: ReasonIdx) -> Option<&PendingReason> {
        self.reasons.get(idx as usize).map(|r| &**r)
    }

    /// Units missing by reason `idx` (see `PendingReason::shortfall`).
    pub(crate) fn shortfall(&self, idx: ReasonIdx) -> u64 {
        self.reason(idx).map_or(u64::MAX, PendingReason::shortfall)
    }
}

impl Allocator {
    // ------------------------------------------------------------------ cycle

    /// Runs one admission cycle at `now`.
    pub fn cycle(&mut self, now: Timestamp) -> CycleOutcome {
        let ctx = CycleCtx {
            memo: self.memo.start_cycle(self.state.inv.node_changes),
            ..CycleCtx::default()
        };
        self.cycle_with(now, ctx)
    }

    pub(crate) fn cycle_with(&mut self, now: Timestamp, mut ctx: CycleCtx) -> CycleOutcome {
        self.state.clock = self.state.clock.max(now);
        self.state.cycles += 1;
        self.prune_tombstones(now);
        let mut out = CycleOutcome {
            now,
            ..CycleOutcome::default()
        };
        out.evictions.append(&mut self.state.undelivered_evictions);
        self.process_evictions(now, &mut out);
        self.start_drains(now, &mut out);

        ctx.positions = QueuePositions::new(self.state.queues.queues.len());
        self.hold_for_waiting_preemptors(now, &mut ctx);
        self.admit_ready_preemptors(now, &mut ctx, &mut out);
        self.evaluate_reserved_first(now, &mut ctx, &mut out);
        let lanes = self.build_lanes(now);
        self.main_pass(now, lanes, &mut ctx, &mut out);
        self.admit_cpu_only(now, &mut ctx, &mut out);
        ctx.positions.set_lengths(&mut out.pending);
        self.state.reserved_jobs = std::mem::take(&mut ctx.reserved_order);
        if self.state.config.preemption.enabled {
            self.preemption_pass(now, &mut ctx, &mut out);
        }
        out.reasons = std::mem::take(&mut ctx.reasons);
        out.stats = ctx.stats;
        out.stats.admitted = u32::try_from(out.admissions.len()).unwrap_or(u32::MAX);
        self.memo.end_cycle(ctx.memo, self.state.inv.node_changes);
        out
    }

    pub(crate) fn prune_tombstones(&mut self, now: Timestamp) {
        let retention = self.state.config.tombstone_retention_secs;
        while let Some((at, _)) = self.state.tombstone_order.front() {
            if now.secs_since(*at) <= retention {
                break;
            }
            if let Some((_, uid)) = self.state.tombstone_order.pop_front() {
                self.state.tombstones.remove(&uid);
            }
        }
    }

    pub(crate) fn process_evictions(&mut self, now: Timestamp, out: &mut CycleOutcome) {
        let due = self
            .state
            .by_arrival(self.state.preempting.iter().copied().filter(|idx| {
                self.state
                    .job(*idx)
                    .and_then(Job::running)
                    .and_then(|r| r.preempting.as_ref())
                    .is_some_and(|p| p.checkpointed || p.evict_at <= now)
            }));
        for idx in due {
            let Some(job) = self.state.job(idx) else {
                continue;
            };
            let uid = job.spec.uid.clone();
            let Some(by) = job
                .running()
                .and_then(|r| r.preempting.as_ref())
                .map(|p| p.by.clone())
            else {
                continue;
            };
            let reason = match &by {
                Some(by) => EvictionReason::Preempted { by: by.clone() },
                None => EvictionReason::Drained {
                    queue: self.state.queues.name_of(job.queue),
                },
            };
            self.state.requeue(idx, by);
            out.evictions.push(Eviction {
                uid,
                reason,
                at: now,
            });
        }
    }

    // ------------------------------------------------------------- preemption
}

#[cfg(test)]
pub(crate) mod tests {
    use super::CycleCtx;
    use super::queue_order::{LaneJob, LaneKey};
    use super::quota_holds::HoldAges;
    use crate::memo::EarlyFailures;
    use crate::types::Timestamp;
    use crate::{
        Allocator, AllocatorConfig, BackfillPolicy, CycleOutcome, Event, FlavorQuota, JobSpec,
        JobUid, PendingExplanation, QueueSpec, ResourceQuota, names,
    };

    use crate::testing::Rng;

    #[test]
    pub(crate) fn an_early_failure_is_taken_once_and_only_by_its_job() {
        let mut early = EarlyFailures::default();
        early.insert(3, (7, true));
        early.insert(200, (8, false));
        // 131 and 8 share a word or a bit with job 3 or 200 without being them.
        assert_eq!(early.take(131), None);
        assert_eq!(early.take(8), None);
        assert_eq!(early.take(10_000), None, "beyond every marked word");
        assert_eq!(early.take(3), Some((7, true)));
        assert_eq!(early.take(3), None, "taken once");
        assert_eq!(early.take(200), Some((8, false)));
    }

    /// Two cohorts of three queues and a queue of its own, on 16 nodes of
    /// 8 GPUs (half of them labelled `pool: a`); quota holds start early so
    /// that jobs cross both hold ages during the run.
    pub(crate) fn contested_cluster() -> Allocator {
        let mut alloc = Allocator::new(AllocatorConfig {
            backfill: BackfillPolicy {
                queue_hold_after_secs: 300,
                borrower_hold_after_secs: 600,
                ..BackfillPolicy::default()
            },
            ..AllocatorConfig::default()
        })
        .expect("valid config");
        for n in 0..16 {
            let mut node = crate::cycle::reservation::tests::node(&format!("node-{n}"));
            if n % 2 == 0
                && let Event::NodeUpserted(info) = &mut node
            {
                info.labels.insert("pool".into(), "a".into());
            }
            alloc.apply(node).expect("node");
        }
        let cohorts = [
            Some("c0"),
            Some("c0"),
            Some("c0"),
            Some("c1"),
            Some("c1"),
            Some("c1"),
            None,
        ];
        let nominal = [16, 8, 24, 8, 16, 32, 16];
        for (q, (cohort, nominal)) in cohorts.iter().zip(nominal).enumerate() {
            let queue = QueueSpec {
                name: format!("q{q}"),
                cohort: cohort.map(str::to_string),
                quotas: vec![FlavorQuota {
                    flavor: "A100.on-demand".into(),
                    resources: vec![ResourceQuota {
                        resource: names::GPU_RESOURCE.into(),
                        nominal,
                        ..ResourceQuota::default()
                    }],
                }],
                ..QueueSpec::default()
            };
            alloc.apply(Event::QueueUpserted(queue)).expect("queue");
        }
        alloc
    }

    /// What a queue hold keeps from its cohort's borrowers follows its
    /// queue's admissions within the cycle: a job the holder lets through
    /// uses some of the held nominal quota.
    #[test]
    pub(crate) fn a_queue_hold_keeps_only_what_its_queue_leaves_unused() {
        let mut alloc = contested_cluster();
        for (uid, queue, workers) in [
            ("holder", "q0", 2),
            ("small", "q0", 1),
            ("borrower", "q1", 1),
        ] {
            let job = JobSpec {
                uid: JobUid::new(uid),
                namespace: "ml".into(),
                name: uid.into(),
                queue: Some(queue.into()),
                submitted_at: Timestamp(0),
                num_workers: workers,
                gpus_per_worker: 8,
                ..JobSpec::default()
            };
            alloc.apply(Event::JobSubmitted(job)).expect("job");
        }
        let idx = |alloc: &Allocator, uid: &str| alloc.job_idx(&JobUid::new(uid)).expect("job");
        let (holder, small) = (idx(&alloc, "holder"), idx(&alloc, "small"));
        let queue_of =
            |alloc: &Allocator, uid: &str| alloc.state.job(idx(alloc, uid)).expect("job").queue;
        let borrower = queue_of(&alloc, "borrower");
        let cohort = alloc
            .state
            .queues
            .get(queue_of(&alloc, "holder"))
            .and_then(|q| q.cohort)
            .expect("cohort");
        let res = *alloc.options_of(holder).first().expect("an option");
        let now = Timestamp(3_600);
        let mut ctx = CycleCtx::default();
        // q0's nominal quota (16) kept whole for the holder.
        alloc.hold_queue_quota(holder, Some((res, now.plus_secs(600))), None, now, &mut ctx);
        let kept = |alloc: &Allocator, ctx: &CycleCtx| {
            alloc
                .kept_by_queue_holds(ctx, cohort, borrower, res, &|_| false)
                .units
        };
        assert_eq!(kept(&alloc, &ctx), 16);
        let plan = alloc.try_place(small, res, now, &mut ctx).expect("room");
        alloc.admit_in_cycle(small, plan, now, &mut ctx, &mut CycleOutcome::default());
        assert_eq!(kept(&alloc, &ctx), 8);
    }

    /// Everything a cycle decided, pending explanations resolved.
    pub(crate) fn decided(
        alloc: &Allocator,
        out: &CycleOutcome,
    ) -> (String, String, String, Vec<PendingExplanation>) {
        (
            format!("{:?}", out.admissions),
            format!("{:?}", out.preemptions),
            format!("{:?}", out.evictions),
            out.pending
                .iter()
                .filter_map(|p| alloc.explain(out, p))
                .collect(),
        )
    }

    /// The quota shortcut answers a job from an earlier failure of its
    /// shape: it must decide what evaluating the job in full decides.
    /// Seeded runs of a contested cluster (cohorts borrowing, quota and
    /// queue holds, starving borrowers, runtime estimates, node filters,
    /// preemption) go cycle by cycle with and without it.
    #[test]
    pub(crate) fn the_quota_shortcut_decides_as_a_full_evaluation() {
        let mut shortcut_answers = 0;
        for seed in 1..=12u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut fast = contested_cluster();
            let mut full = contested_cluster();
            let mut running: Vec<JobUid> = Vec::new();
            let mut next = 0;
            for step in 1..=60u64 {
                let now = step * 60;
                let mut events = Vec::new();
                for _ in 0..rng.below(9) {
                    next += 1;
                    let mut job = JobSpec {
                        uid: JobUid::new(format!("j{next}")),
                        namespace: "ml".into(),
                        name: format!("j{next}"),
                        queue: Some(format!("q{}", rng.below(7))),
                        priority: rng.pick(&[0, 5, 10]),
                        submitted_at: Timestamp(now.saturating_sub(rng.below(1_200))),
                        num_workers: rng.pick(&[1, 1, 2, 4]),
                        gpus_per_worker: rng.pick(&[1, 2, 4, 8, 8]),
                        runtime_estimate_secs: rng.pick(&[None, Some(300), Some(900), Some(3_600)]),
                        ..JobSpec::default()
                    };
                    // Some jobs want half the nodes; a few want none there are.
                    match rng.below(8) {
                        0 | 1 => job.node_selector.insert("pool".into(), "a".into()),
                        2 => job.node_selector.insert("pool".into(), "b".into()),
                        _ => None,
                    };
                    events.push(Event::JobSubmitted(job));
                }
                for _ in 0..rng.below(3) {
                    if !running.is_empty() {
                        let done = running.swap_remove(rng.below(running.len() as u64) as usize);
                        events.push(Event::JobFinished { uid: done });
                    }
                }
                for event in events {
                    fast.apply(event.clone()).expect("event");
                    full.apply(event).expect("event");
                }
                let with_shortcut = fast.cycle(Timestamp(now));
                let without = full.cycle_with(
                    Timestamp(now),
                    CycleCtx {
                        no_quota_shortcut: true,
                        ..CycleCtx::default()
                    },
                );
                assert_eq!(
                    decided(&fast, &with_shortcut),
                    decided(&full, &without),
                    "seed {seed}, cycle at {now} s"
                );
                shortcut_answers += with_shortcut.stats.memo_hits;
                running.extend(with_shortcut.admissions.iter().map(|a| a.uid.clone()));
                let gone: Vec<&JobUid> = with_shortcut.evictions.iter().map(|e| &e.uid).collect();
                running.retain(|uid| !gone.contains(&uid));
            }
        }
        assert!(
            shortcut_answers > 1_000,
            "shortcut used {shortcut_answers} times"
        );
    }

    pub(crate) fn head(priority: i32, submitted_at: u64, seq: u64) -> LaneJob {
        LaneJob {
            priority,
            submitted_at: Timestamp(submitted_at),
            idx: 0,
            seq,
            shape: None,
        }
    }

    #[test]
    pub(crate) fn lane_keys_go_by_share_then_the_heads_place_in_line_then_lane() {
        let shares = [-1.5, -0.0, 0.0, 1e-300, 0.25, 0.5, 3.0, f64::INFINITY];
        let any = head(0, 0, 0);
        for a in shares {
            for b in shares {
                // Greater goes first: the lower share.
                let by_share = LaneKey::new(a, &any, 1).cmp(&LaneKey::new(b, &any, 1));
                assert_eq!(by_share, b.total_cmp(&a), "{a} vs {b}");
            }
        }
        let key = |share, p, t, seq, lane| LaneKey::new(share, &head(p, t, seq), lane);
        assert!(key(0.25, i32::MIN, 9, 9, 9) > key(0.5, i32::MAX, 0, 0, 0));
        // Higher effective priority first, negative ones included.
        for (hi, lo) in [(1, 0), (0, -1), (-1, -2), (i32::MAX, i32::MIN), (5, -5)] {
            assert!(
                key(0.5, hi, 9, 9, 9) > key(0.5, lo, 0, 0, 0),
                "{hi} vs {lo}"
            );
        }
        assert!(key(0.5, 3, 1, 9, 9) > key(0.5, 3, 2, 0, 0));
        // Submission times differing in either half of their bits.
        assert!(key(0.5, 3, 1 << 32, 9, 9) > key(0.5, 3, 2 << 32, 0, 0));
        assert!(key(0.5, 3, 1 << 32 | 7, 9, 9) > key(0.5, 3, 1 << 32 | 8, 0, 0));
        assert!(key(0.5, 3, u64::MAX - 1, 9, 9) > key(0.5, 3, u64::MAX, 0, 0));
        assert!(key(0.5, 3, 1, u64::MAX - 1, 9) > key(0.5, 3, 1, u64::MAX, 0));
        assert!(key(0.5, 3, 1, 1, 9) > key(0.5, 3, 1, 2, 0));
        assert!(key(0.5, 3, 1, 1, 3) > key(0.5, 3, 1, 1, 4));
        assert_eq!(key(0.5, 3, 1, 1, 3).lane(), 3);
    }

    #[test]
    pub(crate) fn shape_keys_tell_every_field_apart_and_refuse_what_does_not_fit() {
        let ages = |queue_hold, starving| HoldAges {
            queue_hold,
            starving,
        };
        let mut keys = Vec::new();
        for queue in [0, 1, 7, (1 << 29) - 1] {
            for sharing in [false, true] {
                for units in [0, 1, 8, u64::from(u32::MAX)] {
                    for (hold, starving) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        keys.push(ages(hold, starving).shape_key(queue, sharing, units));
                    }
                }
            }
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        assert!(keys.iter().all(Option::is_some));
        // Beyond the key's room: no key, so the job is evaluated in full.
        assert_eq!(ages(true, true).shape_key(1 << 29, false, 8), None);
        assert_eq!(
            ages(false, false).shape_key(0, false, u64::from(u32::MAX) + 1),
            None
        );
    }
}
