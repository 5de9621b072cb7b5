//! A small log-linear histogram (HdrHistogram-like) for latencies in microseconds.
//!
//! Values below 128 have their own bucket; above, every power-of-two range is split into
//! 64 linear sub-buckets, so a reported percentile is within 1/64 (1.6 %) of the true
//! value. Recording is an index computation and an increment; merging adds the counts.

use std::time::Duration;

const LINEAR: u64 = 128;
const SUB_BITS: u32 = 6; // 64 sub-buckets per power of two above LINEAR
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (LINEAR + (64 - 7) * SUB) as usize;

#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("min", &self.min)
            .field("p50", &self.percentile(50.0))
            .field("p99", &self.percentile(99.0))
            .field("max", &self.max)
            .finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

fn index(value: u64) -> usize {
    if value < LINEAR {
        return value as usize;
    }
    let msb = 63 - value.leading_zeros(); // >= 7
    let shift = msb - SUB_BITS; // >= 1
    let mantissa = value >> shift; // in [64, 128)
    (LINEAR + u64::from(shift - 1) * SUB + (mantissa - SUB)) as usize
}

/// (lowest, highest) value of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < LINEAR {
        return (i, i);
    }
    let shift = (i - LINEAR) / SUB + 1;
    let mantissa = (i - LINEAR) % SUB + SUB;
    let low = mantissa << shift;
    (low, low + ((1u64 << shift) - 1))
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    pub fn record(&mut self, value: u64) {
        self.record_n(value, 1);
    }

    pub fn record_n(&mut self, value: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.counts[index(value)] += n;
        self.count += n;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.sum += u128::from(value) * u128::from(n);
    }

    /// Records a duration in microseconds.
    pub fn record_duration(&mut self, d: Duration) {
        self.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += *b;
        }
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The value at percentile `p` (0–100): the midpoint of the bucket holding the
    /// ceil(p% · count)-th smallest value, clamped to the recorded min/max. `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let p = p.clamp(0.0, 100.0);
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        if rank >= self.count {
            return Some(self.max);
        }
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = bounds(i);
                let mid = low + (high - low) / 2;
                return Some(mid.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// [`Histogram::percentile`] as milliseconds (values are microseconds).
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        self.percentile(p).map(|us| us as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_everything_in_order() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 2, u64::MAX]) {
            let i = index(v);
            assert!(i >= last, "{v}");
            last = i;
            let (lo, hi) = bounds(i);
            assert!(lo <= v && v <= hi, "{v} not in {lo}..={hi}");
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn percentiles_are_within_two_percent() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        for (p, want) in [(50.0, 50_000.0), (90.0, 90_000.0), (99.0, 99_000.0), (99.9, 99_900.0)] {
            let got = h.percentile(p).unwrap() as f64;
            assert!((got - want).abs() / want < 0.02, "p{p}: {got} vs {want}");
        }
        assert_eq!(h.percentile(100.0), Some(100_000));
        assert_eq!(h.percentile(0.0), Some(1));
        assert_eq!(h.count(), 100_000);
        assert_eq!(h.min(), Some(1));
        assert_eq!(h.max(), Some(100_000));
        assert!((h.mean().unwrap() - 50_000.5).abs() < 0.01);
    }

    #[test]
    fn small_values_are_exact_and_merge_adds() {
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for v in [5, 5, 7, 9] {
            a.record(v);
        }
        b.record_n(100, 4);
        assert_eq!(a.percentile(50.0), Some(5));
        assert_eq!(a.percentile(75.0), Some(7));
        a.merge(&b);
        assert_eq!(a.count(), 8);
        assert_eq!(a.percentile(50.0), Some(9));
        assert_eq!(a.percentile(99.0), Some(100));
        assert_eq!(Histogram::new().percentile(50.0), None);
    }
}
