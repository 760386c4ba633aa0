//! The one retry schedule: capped doubling. Consumers' redeliveries, NATS
//! reconnects, job restarts and HTTP retries all wait by it, so "how long until
//! the next try" has one answer.

use std::time::Duration;

/// `initial` doubled `retry` times, at most `max`: initial, 2×, 4×, ... max.
pub fn capped_doubling(initial: Duration, retry: u32, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
    initial.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_initial_delay_up_to_the_cap() {
        let delays: Vec<u64> = (0..6)
            .map(|retry| {
                capped_doubling(Duration::from_secs(1), retry, Duration::from_secs(10)).as_secs()
            })
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let max = Duration::from_secs(300);
        assert_eq!(capped_doubling(Duration::from_secs(10), 40, max), max);
        assert_eq!(capped_doubling(Duration::from_secs(10), u32::MAX, max), max);
    }
}
