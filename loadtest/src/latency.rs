//! Latency samples for the pipeline load test, summarised as nearest-rank
//! percentiles (the same definition as the replay report, from
//! [`crate::percentile`]).
//!
//! Every sample is kept rather than bucketed: a load test records at most a
//! few hundred thousand events, 8 bytes each, and exact percentiles avoid a
//! second, bucket-dependent definition of "p99".

use std::time::Duration;

use serde::Serialize;

use trainyard_stats::SortedSamples;

/// Collects latencies in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct LatencyRecorder {
    samples_ms: Vec<f64>,
}

/// Percentiles of the recorded latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl LatencyRecorder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn record(&mut self, latency: Duration) {
        // Dividing whole nanoseconds keeps whole milliseconds exact (50 ms
        // is 50.0, not 50.00000000000001 as via seconds × 1000).
        self.samples_ms.push(latency.as_nanos() as f64 / 1e6);
    }

    /// Records a latency already in milliseconds; non-finite or negative
    /// values are ignored because no measured latency can have them and one
    /// NaN would corrupt every percentile. Returns whether it was recorded.
    pub fn record_ms(&mut self, ms: f64) -> bool {
        let valid = ms.is_finite() && ms >= 0.0;
        if valid {
            self.samples_ms.push(ms);
        }
        valid
    }

    pub fn len(&self) -> usize {
        self.samples_ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples_ms.is_empty()
    }

    /// The summary; `None` before the first sample.
    pub fn summary(&self) -> Option<LatencySummary> {
        let sorted = SortedSamples::new(self.samples_ms.iter().copied());
        Some(LatencySummary {
            count: sorted.len(),
            p50_ms: sorted.percentile(50.0)?,
            p90_ms: sorted.percentile(90.0)?,
            p99_ms: sorted.percentile(99.0)?,
            max_ms: sorted.max()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_uses_nearest_rank() {
        let mut r = LatencyRecorder::new();
        assert_eq!(r.summary(), None);
        // 1..=100 ms in reverse order.
        for ms in (1..=100u64).rev() {
            r.record(Duration::from_millis(ms));
        }
        assert_eq!(
            r.summary(),
            Some(LatencySummary {
                count: 100,
                p50_ms: 50.0,
                p90_ms: 90.0,
                p99_ms: 99.0,
                max_ms: 100.0,
            })
        );
    }

    #[test]
    fn small_sample_and_invalid_values() {
        let mut r = LatencyRecorder::new();
        assert!(r.record_ms(2.5));
        assert!(r.record_ms(0.5));
        assert!(!r.record_ms(f64::NAN));
        assert!(!r.record_ms(-1.0));
        assert_eq!(r.len(), 2);
        assert!(!r.is_empty());
        assert_eq!(
            r.summary(),
            Some(LatencySummary {
                count: 2,
                p50_ms: 0.5,
                p90_ms: 2.5,
                p99_ms: 2.5,
                max_ms: 2.5,
            })
        );
    }
}
