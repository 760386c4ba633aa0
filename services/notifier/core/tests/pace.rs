//! The shared pace's arithmetic: slots one interval apart whoever books them,
//! holds from a 429's `Retry-After` that every later slot waits for, and keys
//! valid in a bucket whatever the channel or URL.

use notifier_core::pace::{Booking, Pace, PaceTarget};

const SECOND: i64 = 1000;

/// Books with the state as stored, then stores what the booking says.
fn book(stored: &mut Pace, now_ms: i64, interval_ms: i64) -> i64 {
    let Booking { slot_ms, next } = stored.book(now_ms, interval_ms);
    if let Some(next) = next {
        *stored = next;
    }
    slot_ms
}

#[test]
fn replicas_booking_at_once_get_slots_one_interval_apart() {
    let mut stored = Pace::default();
    let now = 1_000_000;
    let slots: Vec<i64> = (0..3).map(|_| book(&mut stored, now, SECOND)).collect();
    assert_eq!(slots, [now, now + SECOND, now + 2 * SECOND]);
    assert_eq!(stored.next_at_ms, now + 3 * SECOND);
}

#[test]
fn a_slot_is_never_in_the_past() {
    let mut stored = Pace {
        next_at_ms: 5_000,
        hold_until_ms: 2_000,
    };
    assert_eq!(book(&mut stored, 9_000, SECOND), 9_000);
    assert_eq!(book(&mut stored, 9_100, SECOND), 10_000);
}

#[test]
fn a_hold_delays_every_later_slot_to_its_end() {
    let mut stored = Pace::default();
    let now = 1_000_000;
    book(&mut stored, now, SECOND);
    stored = stored.hold(now + 30 * SECOND).expect("a new hold");
    assert_eq!(book(&mut stored, now + 10, SECOND), now + 30 * SECOND);
    assert_eq!(book(&mut stored, now + 20, SECOND), now + 31 * SECOND);
}

#[test]
fn a_shorter_hold_does_not_shorten_a_longer_one() {
    let stored = Pace::default().hold(60 * SECOND).expect("a new hold");
    assert_eq!(stored.hold(30 * SECOND), None);
    assert_eq!(stored.hold(60 * SECOND), None);
    let longer = stored.hold(90 * SECOND).expect("a longer hold");
    assert_eq!(longer.hold_until_ms, 90 * SECOND);
    assert_eq!(longer.next_at_ms, 90 * SECOND);
}

#[test]
fn a_hold_keeps_slots_already_booked_beyond_it() {
    let mut stored = Pace::default();
    for _ in 0..5 {
        book(&mut stored, 0, SECOND);
    }
    let held = stored.hold(2 * SECOND).expect("a new hold");
    assert_eq!(
        held.next_at_ms,
        5 * SECOND,
        "booked slots are not given away"
    );
    assert_eq!(held.hold_until_ms, 2 * SECOND);
}

#[test]
fn a_slot_booked_before_a_hold_that_covers_it_must_book_again() {
    let mut stored = Pace::default();
    let now = 1_000_000;
    let first = book(&mut stored, now, SECOND);
    let second = book(&mut stored, now, SECOND);
    // The first message's answer: 429, Retry-After 2 s, read after 40 ms.
    stored = stored.hold(first + 40 + 2 * SECOND).expect("a new hold");
    assert!(stored.holds(second), "the second slot lies inside the hold");
    let again = book(&mut stored, second, SECOND);
    assert_eq!(again, first + 40 + 2 * SECOND);
    assert!(!stored.holds(again));
}

#[test]
fn without_an_interval_only_holds_delay_and_nothing_is_written() {
    let stored = Pace::default();
    assert_eq!(
        stored.book(7_000, 0),
        Booking {
            slot_ms: 7_000,
            next: None
        }
    );
    let held = stored.hold(9_000).expect("a new hold");
    assert_eq!(held.book(7_000, 0).slot_ms, 9_000);
    assert_eq!(held.book(9_500, 0).slot_ms, 9_500);
}

#[test]
fn keys_are_valid_bucket_keys_and_tell_targets_apart() {
    let targets = [
        PaceTarget::SlackChannel("#team-a".into()),
        PaceTarget::SlackChannel("#team.a".into()),
        PaceTarget::SlackChannel("#équipe b/c".into()),
        PaceTarget::Webhook("https://ci.internal/hooks/trainyard?x=1".into()),
        PaceTarget::Webhook("#team-a".into()),
    ];
    let keys: Vec<String> = targets.iter().map(PaceTarget::key).collect();
    for key in &keys {
        assert!(
            key.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c))
                && !key.starts_with('.')
                && !key.ends_with('.'),
            "{key}"
        );
    }
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), keys.len(), "{keys:?}");
    assert_eq!(
        PaceTarget::SlackChannel("#team-a".into()).key(),
        keys[0],
        "one channel, one key, whichever replica computes it"
    );
}
