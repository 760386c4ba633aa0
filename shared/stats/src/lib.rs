//! Nearest-rank percentiles: the one definition every benchmark and the
//! `trainyard` CLI's run summary use.
//!
//! For `n` samples sorted ascending, the p-th percentile (0 ≤ p ≤ 100) is the
//! sample at 1-based rank `ceil(p / 100 × n)`, taking rank 1 when that is 0
//! (so p = 0 is the minimum and p = 100 the maximum). It is always one of the
//! samples, never an interpolation: at least p % of the samples are ≤ it. For
//! 10 samples p95 is the 10th (the maximum) and p50 the 5th.

/// Samples sorted ascending, ready for percentile queries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SortedSamples(Vec<f64>);

impl SortedSamples {
    /// Sorts `values`. NaN sorts to one end (IEEE total order), so
    /// callers should pass finite values.
    pub fn new(values: impl IntoIterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        Self(v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The nearest-rank p-th percentile (see the module docs); `None` when
    /// there are no samples or `p` is outside 0..=100.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if !(0.0..=100.0).contains(&p) || self.0.is_empty() {
            return None;
        }
        let n = self.0.len();
        // p/100·n is computed as p·n/100 so that e.g. p = 95, n = 20 gives
        // exactly 19 rather than 19.000000000000004 (which would round up).
        let rank = (p * n as f64 / 100.0).ceil() as usize;
        self.0.get(rank.clamp(1, n) - 1).copied()
    }

    pub fn max(&self) -> Option<f64> {
        self.0.last().copied()
    }

    pub fn mean(&self) -> Option<f64> {
        if self.0.is_empty() {
            None
        } else {
            Some(self.0.iter().sum::<f64>() / self.0.len() as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_to(n: u32) -> SortedSamples {
        // Reversed so the constructor has to sort.
        SortedSamples::new((1..=n).rev().map(f64::from))
    }

    #[test]
    fn nearest_rank_on_ten_samples() {
        let s = one_to(10);
        assert_eq!(s.percentile(0.0), Some(1.0));
        assert_eq!(s.percentile(10.0), Some(1.0));
        assert_eq!(s.percentile(10.1), Some(2.0));
        assert_eq!(s.percentile(50.0), Some(5.0));
        assert_eq!(s.percentile(90.0), Some(9.0));
        assert_eq!(s.percentile(95.0), Some(10.0));
        assert_eq!(s.percentile(100.0), Some(10.0));
    }

    #[test]
    fn nearest_rank_hits_exact_ranks_without_float_drift() {
        // 95 % of 20 is rank 19 exactly; 99 % of 100 is rank 99; 90 % of
        // 30 is rank 27.
        assert_eq!(one_to(20).percentile(95.0), Some(19.0));
        assert_eq!(one_to(100).percentile(99.0), Some(99.0));
        assert_eq!(one_to(30).percentile(90.0), Some(27.0));
        // Every rank for every size up to 200: at least p % of samples are
        // <= the answer, and fewer than p % are < it.
        for n in 1..=200u32 {
            let s = one_to(n);
            for p in [1.0, 25.0, 50.0, 90.0, 95.0, 99.0, 99.9] {
                let v = s.percentile(p).unwrap_or(f64::NAN);
                let at_or_below = v / f64::from(n) * 100.0;
                let below = (v - 1.0) / f64::from(n) * 100.0;
                assert!(at_or_below >= p - 1e-9 && below < p, "n={n} p={p} -> {v}");
            }
        }
    }

    #[test]
    fn single_and_empty() {
        let one = SortedSamples::new([7.5]);
        assert_eq!(one.percentile(50.0), Some(7.5));
        assert_eq!(one.percentile(99.0), Some(7.5));
        let empty = SortedSamples::new([]);
        assert_eq!(empty.percentile(50.0), None);
        assert_eq!(empty.max(), None);
        assert_eq!(empty.mean(), None);
        assert!(empty.is_empty());
    }

    #[test]
    fn out_of_range_p_is_none() {
        let s = one_to(3);
        assert_eq!(s.percentile(-1.0), None);
        assert_eq!(s.percentile(100.5), None);
        assert_eq!(s.percentile(f64::NAN), None);
        assert_eq!(s.mean(), Some(2.0));
        assert_eq!(s.max(), Some(3.0));
        assert_eq!(s.len(), 3);
    }
}
