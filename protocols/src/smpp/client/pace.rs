//! Pacing: sequence numbers, the TPS token bucket and the reconnect backoff.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The largest sequence number SMPP allows (3.4 §2.2.1: 0x00000001 – 0x7FFFFFFF).
pub(crate) const MAX_SEQUENCE: u32 = 0x7FFF_FFFF;

/// Sequence numbers of one session: 1, 2, … 0x7FFFFFFF, then 1 again.
#[derive(Debug)]
pub(crate) struct SeqGen {
    next: u32,
}

impl SeqGen {
    pub(crate) fn new() -> Self {
        Self { next: 1 }
    }

    #[cfg(test)]
    pub(crate) fn starting_at(next: u32) -> Self {
        Self { next }
    }

    pub(crate) fn next_seq(&mut self) -> u32 {
        let seq = self.next;
        self.next = if seq >= MAX_SEQUENCE { 1 } else { seq + 1 };
        seq
    }
}

/// A token bucket for `max_tps`.
///
/// It holds at most 50 ms worth of tokens (at least one), so a sender that waits for tokens
/// wakes up to send a batch rather than one PDU per wake-up, while a burst never exceeds
/// 1/20 of a second's allowance.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    /// Tokens per second; 0 = unlimited.
    rate: f64,
    capacity: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(max_tps: u32, now: Instant) -> Self {
        let rate = f64::from(max_tps);
        let capacity = (rate / 20.0).max(1.0);
        Self {
            rate,
            capacity,
            tokens: capacity,
            last: now,
        }
    }

    pub(crate) fn unlimited(&self) -> bool {
        self.rate <= 0.0
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = now;
    }

    /// Take one token if there is one.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        if self.unlimited() {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When `want` tokens (capped to the bucket's capacity, at least one) will be there.
    pub(crate) fn ready_at(&mut self, now: Instant, want: usize) -> Instant {
        if self.unlimited() {
            return now;
        }
        self.refill(now);
        // Precision loss for absurd `want` values is irrelevant: it is capped below.
        #[allow(clippy::cast_precision_loss)]
        let want = (want as f64).clamp(1.0, self.capacity);
        let missing = (want - self.tokens).max(0.0);
        now + Duration::from_secs_f64(missing / self.rate)
    }
}

/// Exponential reconnect backoff with jitter: the n-th delay is `min * 2^n` plus up to a
/// quarter more, never below `min` nor above `max`.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        let max = max.max(min);
        Self { min, max, current: min }
    }

    pub(crate) fn reset(&mut self) {
        self.current = self.min;
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = base.saturating_mul(2).min(self.max);
        let spread = u64::try_from((base / 4).as_nanos()).unwrap_or(u64::MAX);
        let jitter = if spread == 0 { 0 } else { random_u64() % (spread + 1) };
        base.saturating_add(Duration::from_nanos(jitter))
            .clamp(self.min, self.max)
    }
}

/// A random number good enough for jitter (std's per-process random hash keys).
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_wrap_to_one() {
        let mut seq = SeqGen::new();
        assert_eq!(seq.next_seq(), 1);
        assert_eq!(seq.next_seq(), 2);
        let mut seq = SeqGen::starting_at(MAX_SEQUENCE - 1);
        assert_eq!(seq.next_seq(), MAX_SEQUENCE - 1);
        assert_eq!(seq.next_seq(), MAX_SEQUENCE);
        assert_eq!(seq.next_seq(), 1);
    }

    #[test]
    fn token_bucket_limits_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(20, start);
        assert!(bucket.take(start));
        assert!(!bucket.take(start), "capacity is one token at 20 tps");
        let ready = bucket.ready_at(start, 10);
        assert_eq!(ready - start, Duration::from_millis(50));
        assert!(bucket.take(start + Duration::from_millis(50)));

        let mut fast = TokenBucket::new(50_000, start);
        let mut taken = 0;
        while fast.take(start) {
            taken += 1;
        }
        assert_eq!(taken, 2_500, "50 ms worth of tokens");
        // Waiting for a batch, not for one token.
        assert_eq!(fast.ready_at(start, 50) - start, Duration::from_millis(1));

        let mut unlimited = TokenBucket::new(0, start);
        assert!((0..100_000).all(|_| unlimited.take(start)));
        assert_eq!(unlimited.ready_at(start, 5), start);
    }

    #[test]
    fn backoff_grows_with_jitter_within_bounds() {
        let min = Duration::from_millis(100);
        let max = Duration::from_millis(1000);
        let mut backoff = Backoff::new(min, max);
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        for (i, delay) in delays.iter().enumerate() {
            let base = (min * (1 << i.min(4))).min(max);
            assert!(
                *delay >= base.min(max) && *delay <= (base + base / 4).min(max),
                "{i}: {delay:?}"
            );
        }
        assert_eq!(*delays.last().unwrap(), max);
        backoff.reset();
        let first = backoff.next_delay();
        assert!(first >= min && first <= min + min / 4);
        // Inverted bounds do not panic and stay at min.
        let mut odd = Backoff::new(Duration::from_millis(50), Duration::from_millis(10));
        assert_eq!(odd.next_delay(), Duration::from_millis(50));
    }
}
