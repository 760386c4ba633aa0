//! What the crate's unit tests share.

use crate::{
    Allocator, AllocatorConfig, BackfillPolicy, Event, FlavorQuota, QueueSpec, ResourceQuota, names,
};

/// A small deterministic generator (xorshift), so that each seed is one
/// reproducible scenario.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
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
