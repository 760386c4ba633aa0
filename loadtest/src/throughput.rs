//! Message rates from periodic samples of a counter (a stream's last
//! sequence, a consumer's acknowledged deliveries), for the pipeline test.
//!
//! An average over a whole run says little about capacity when the load comes
//! in a burst: the consumer idles before and after it. So besides the
//! average, [`busy_rate`] counts only the intervals in which the consumer had
//! a backlog (it could not have gone faster for lack of work), and
//! [`peak_rate`] gives the best rate over any window of a given length.

use serde::Serialize;

/// One reading of a counter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CounterSample {
    /// Seconds since the start of the run.
    pub t: f64,
    /// The counter (monotonic).
    pub value: u64,
    /// Work waiting when the sample was taken (0 if not applicable).
    pub backlog: u64,
}

fn delta(a: &CounterSample, b: &CounterSample) -> (f64, f64) {
    (b.value.saturating_sub(a.value) as f64, b.t - a.t)
}

/// Counter increase per second from the first to the last sample; `None`
/// with fewer than two samples or no time between them.
pub fn average_rate(samples: &[CounterSample]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    let (count, seconds) = delta(first, last);
    (seconds > 0.0).then(|| count / seconds)
}

/// Counter increase per second over the intervals that began with a
/// backlog, and the seconds those intervals cover; `None` if there were none.
pub fn busy_rate(samples: &[CounterSample]) -> Option<(f64, f64)> {
    let (count, seconds) = samples
        .windows(2)
        .filter(|w| w[0].backlog > 0)
        .map(|w| delta(&w[0], &w[1]))
        .fold((0.0, 0.0), |(c, s), (dc, ds)| (c + dc, s + ds));
    (seconds > 0.0).then(|| (count / seconds, seconds))
}

/// The highest counter increase per second over any span of consecutive
/// samples at least `window` seconds long (the shortest such span from each
/// starting sample); `None` if the run is shorter than `window`.
pub fn peak_rate(samples: &[CounterSample], window: f64) -> Option<f64> {
    let mut best: Option<f64> = None;
    let mut end = 0;
    for (start, a) in samples.iter().enumerate() {
        end = end.max(start + 1);
        while end < samples.len() && samples[end].t - a.t < window {
            end += 1;
        }
        let Some(b) = samples.get(end) else {
            break;
        };
        let (count, seconds) = delta(a, b);
        let rate = count / seconds;
        best = Some(best.map_or(rate, |r: f64| r.max(rate)));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: f64, value: u64, backlog: u64) -> CounterSample {
        CounterSample { t, value, backlog }
    }

    #[test]
    fn average_is_first_to_last() {
        let samples = [s(0.0, 0, 0), s(1.0, 50, 0), s(4.0, 200, 0)];
        assert_eq!(average_rate(&samples), Some(50.0));
        assert_eq!(average_rate(&samples[..1]), None);
    }

    #[test]
    fn busy_rate_skips_idle_intervals() {
        // Idle for 10 s, then 3,000 messages in 1 s with a backlog, then idle.
        let samples = [
            s(0.0, 0, 0),
            s(10.0, 0, 500),
            s(10.5, 1500, 800),
            s(11.0, 3000, 0),
            s(20.0, 3000, 0),
        ];
        let (rate, seconds) = busy_rate(&samples).expect("busy intervals");
        assert_eq!(seconds, 1.0);
        assert_eq!(rate, 3000.0);
        assert_eq!(average_rate(&samples), Some(150.0));
        assert_eq!(busy_rate(&[s(0.0, 0, 0), s(1.0, 10, 0)]), None);
    }

    #[test]
    fn peak_rate_uses_windows_of_at_least_the_given_length() {
        let samples = [
            s(0.0, 0, 0),
            s(0.5, 10, 0),
            s(1.0, 1010, 0),
            s(1.5, 2010, 0),
            s(2.0, 2020, 0),
        ];
        // 0.5 → 1.5 s: 2,000 messages in one second.
        assert_eq!(peak_rate(&samples, 1.0), Some(2000.0));
        assert_eq!(peak_rate(&samples, 5.0), None);
    }
}
