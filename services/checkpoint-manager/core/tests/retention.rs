//! Retention invariants over random catalogues and policies.

use std::collections::{BTreeMap, BTreeSet};

use checkpoint_manager_core::retention::{self, Protected};
use checkpoint_manager_core::{
    Checkpoint, JobCheckpoints, KeepBest, KeepReason, Method, MetricMode, RetentionPolicy,
    Verification, Verifier,
};
use proptest::prelude::*;

fn verification() -> impl Strategy<Value = Verification> {
    prop_oneof![
        6 => Just(Verification::Verified {
            method: Method::TrainyardManifest,
            verifier: Verifier::Manager,
            checksums: true,
        }),
        1 => Just(Verification::Pending),
        1 => Just(Verification::Incomplete { reason: "model.pt is missing".into() }),
    ]
}

fn checkpoints() -> impl Strategy<Value = Vec<Checkpoint>> {
    prop::collection::vec(
        (
            0u32..20,
            0u64..2_000,
            verification(),
            prop::option::of(0.0f64..1.0),
        ),
        0..40,
    )
    .prop_map(|rows| {
        let mut job = JobCheckpoints::default();
        for (epoch, step, verification, loss) in rows {
            let checkpoint = Checkpoint {
                uri: format!("s3://ckpt/ns/job/e{epoch}-s{step}"),
                epoch,
                step,
                attempt: 0,
                metrics: loss
                    .map(|l| BTreeMap::from([("loss".to_string(), l)]))
                    .unwrap_or_default(),
                size_bytes: 1,
                save_seconds: None,
                verification,
            };
            // Repeated URIs are the same checkpoint reported again.
            let _ = job.record(checkpoint);
        }
        job.all().to_vec()
    })
}

fn policy() -> impl Strategy<Value = Option<RetentionPolicy>> {
    prop::option::of(
        (
            prop::option::of(0u32..6),
            prop::option::of((prop::bool::ANY, 1u32..4)),
            prop::option::of(1u64..600),
            prop::collection::vec(0u64..2_000, 0..3),
        )
            .prop_map(|(keep_last, best, every, pinned)| RetentionPolicy {
                keep_last,
                keep_best: best.map(|(max, count)| KeepBest {
                    metric: "loss".into(),
                    mode: if max {
                        MetricMode::Max
                    } else {
                        MetricMode::Min
                    },
                    count,
                }),
                keep_every_n_steps: every,
                pinned_steps: pinned,
            })
            .prop_filter("valid policies only", |p| p.check().is_ok()),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn retention_never_deletes_what_must_survive(
        checkpoints in checkpoints(),
        policy in policy(),
        resume_pick in any::<prop::sample::Index>(),
        registered_pick in any::<prop::sample::Index>(),
    ) {
        let pending_resume = (!checkpoints.is_empty())
            .then(|| checkpoints[resume_pick.index(checkpoints.len())].uri.clone());
        let registered: BTreeSet<String> = (!checkpoints.is_empty())
            .then(|| checkpoints[registered_pick.index(checkpoints.len())].uri.clone())
            .into_iter()
            .collect();
        let protected = Protected {
            pending_resume: pending_resume.as_deref(),
            registered: Some(&registered),
        };
        let decision = retention::decide(&checkpoints, policy.as_ref(), protected);

        // Every checkpoint is decided exactly once.
        let mut decided: Vec<&str> = decision.keep.iter().map(|(u, _)| u.as_str())
            .chain(decision.delete.iter().map(String::as_str)).collect();
        decided.sort_unstable();
        let mut all: Vec<&str> = checkpoints.iter().map(|c| c.uri.as_str()).collect();
        all.sort_unstable();
        prop_assert_eq!(decided, all);

        let deleted: BTreeSet<&str> = decision.delete.iter().map(String::as_str).collect();
        let newest_verified = checkpoints.iter().rev().find(|c| c.verification.is_verified());
        if let Some(newest) = newest_verified {
            prop_assert!(!deleted.contains(newest.uri.as_str()), "deleted the newest verified");
        }
        let keep_best = policy.as_ref().and_then(|p| p.keep_best.as_ref());
        if let Some(best) = keep_best.and_then(|kb| retention::best(&checkpoints, kb)) {
            prop_assert!(!deleted.contains(best.uri.as_str()), "deleted the best");
        }
        for checkpoint in &checkpoints {
            let uri = checkpoint.uri.as_str();
            if !deleted.contains(uri) {
                continue;
            }
            prop_assert!(checkpoint.verification.is_verified(), "deleted an unverified checkpoint");
            prop_assert!(Some(uri) != pending_resume.as_deref(), "deleted the pending resume");
            prop_assert!(!registered.contains(uri), "deleted a registered checkpoint");
            let pinned = policy.as_ref().is_some_and(|p| p.pinned_steps.contains(&checkpoint.step));
            prop_assert!(!pinned, "deleted a pinned checkpoint");
        }
        if policy.is_none() {
            prop_assert!(deleted.is_empty());
        }
        if let Some(n) = policy.as_ref().and_then(|p| p.keep_last) {
            for newest in checkpoints.iter().rev().filter(|c| c.verification.is_verified()).take(n as usize) {
                prop_assert!(!deleted.contains(newest.uri.as_str()), "deleted one of the last {}", n);
            }
        }

        // Deciding again on what is left deletes nothing more.
        let left: Vec<Checkpoint> = checkpoints.iter().filter(|c| !deleted.contains(c.uri.as_str())).cloned().collect();
        let again = retention::decide(&left, policy.as_ref(), protected);
        prop_assert!(again.delete.is_empty(), "second pass deleted {:?}", again.delete);
        prop_assert!(again.keep.iter().all(|(_, reason)| *reason != KeepReason::NoPolicy || policy.is_none()));
    }

    #[test]
    fn the_resume_point_is_the_newest_verified(checkpoints in checkpoints()) {
        let mut job = JobCheckpoints::default();
        for checkpoint in checkpoints.iter().cloned() {
            job.record(checkpoint).expect("distinct uris");
        }
        let choice = job.resume();
        let expected = checkpoints.iter().filter(|c| c.verification.is_verified())
            .max_by(|a, b| a.order_key().cmp(&b.order_key()));
        prop_assert_eq!(choice.checkpoint.map(|c| &c.uri), expected.map(|c| &c.uri));
        for skipped in &choice.skipped {
            prop_assert!(!skipped.checkpoint.verification.is_verified());
        }
    }
}
