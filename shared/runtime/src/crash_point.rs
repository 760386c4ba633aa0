//! Named points at which a service can be made to crash on purpose, so that
//! chaos runs kill it exactly where a crash is most harmful (after a state
//! save and before the publish that follows it, after a Kubernetes apply and
//! before the ack) rather than at random moments.
//!
//! `TRAINYARD_CRASH_AT=<point>` aborts the process the first time it reaches
//! `<point>`; `<point>:<n>` the n-th time. The abort (SIGABRT) skips every
//! drain, flush and destructor, as a SIGKILL or an OOM kill would. Unset (as
//! in every deployment), a point costs one read of an initialised static.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "TRAINYARD_CRASH_AT";

struct Armed {
    point: String,
    /// Times the point may still be passed before the crash.
    passes_left: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| parse(&std::env::var(CRASH_AT_ENV).ok()?))
        .as_ref()
}

/// `<point>` or `<point>:<n>` (n ≥ 1); None for an empty or malformed value,
/// which is logged, so a typo never crashes a service somewhere unexpected.
fn parse(value: &str) -> Option<Armed> {
    let (point, nth) = match value.rsplit_once(':') {
        Some((point, n)) => match n.parse::<u64>() {
            Ok(n) if n >= 1 => (point, n),
            _ => {
                tracing::error!(
                    value,
                    "{CRASH_AT_ENV} takes <point> or <point>:<n> with n ≥ 1; ignored"
                );
                return None;
            }
        },
        None => (value, 1),
    };
    if point.is_empty() {
        return None;
    }
    tracing::warn!(point, nth, "armed to crash at a crash point");
    Some(Armed {
        point: point.to_owned(),
        passes_left: AtomicU64::new(nth - 1),
    })
}

/// Aborts the process here when `TRAINYARD_CRASH_AT` names `point` and this
/// is the n-th time it is reached.
pub fn reached(point: &str) {
    let Some(armed) = armed() else {
        return;
    };
    if armed.point != point {
        return;
    }
    let crash = armed
        .passes_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_err();
    if crash {
        eprintln!("crash point {point} reached: aborting");
        std::process::abort();
    }
}

const BEFORE_ACK: &str = ".before-ack";

/// The crash point of a durable consumer (e.g. `planner-events`): a message
/// handled (its effects done) and not yet acknowledged.
pub fn before_ack(durable: &str) -> String {
    format!("{durable}{BEFORE_ACK}")
}

/// [`reached`] at consumer `durable`'s [`before_ack`] point, without making
/// its name: it is passed once per message.
pub fn reached_before_ack(durable: &str) {
    if armed().is_some_and(|armed| armed.point.strip_suffix(BEFORE_ACK) == Some(durable)) {
        reached(&before_ack(durable));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_and_an_optional_count_are_read_and_a_bad_count_disarms() {
        let armed = parse("gpu-allocator.after-save:3").expect("armed");
        assert_eq!(armed.point, "gpu-allocator.after-save");
        assert_eq!(armed.passes_left.load(Ordering::SeqCst), 2);
        let once = parse("planner-events.before-ack").expect("armed");
        assert_eq!(once.passes_left.load(Ordering::SeqCst), 0);
        assert!(parse("planner-events.before-ack:0").is_none());
        assert!(parse("planner-events.before-ack:x").is_none());
        assert!(parse("").is_none());
    }
}
