//! Pacing of the background durable writes: the Router's routed-work writes and the
//! Selector's stage commits.
//!
//! Nothing acknowledged waits on them, and at moderate rates back-to-back commits of a
//! few units each would spend the CPU and disk the acknowledging commits (the pending
//! stage's) need. A short gap between the starts of two of one actor's writes gathers
//! bigger batches.

use std::time::{Duration, Instant};

/// Least time between the starts of two durable background writes of one actor.
pub(crate) const WRITE_GAP: Duration = Duration::from_millis(3);

/// Runs `send` once `wait` has passed, on a task of its own: how an actor asks for a
/// message to itself later without sleeping in its handler, which would hold up every
/// message queued behind it.
pub(crate) fn send_after(wait: Duration, send: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        send();
    });
}

/// How long a write waits so that it starts `gap` (normally [`WRITE_GAP`]) after the
/// previous one (`last`), or nothing. The caller reads the clock once for `now`: reading
/// it again after a comparison would let the gap pass in between and the subtraction
/// underflow.
pub(crate) fn gap_left(gap: Duration, last: Option<Instant>, now: Instant) -> Duration {
    last.map_or(Duration::ZERO, |at| {
        gap.saturating_sub(now.saturating_duration_since(at))
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{WRITE_GAP, gap_left};

    #[test]
    fn a_write_waits_out_only_what_is_left_of_the_gap() {
        let now = Instant::now();
        let ago = |ms: u64| now.checked_sub(Duration::from_millis(ms)).unwrap();
        let left = |last| gap_left(WRITE_GAP, last, now);
        assert_eq!(left(None), Duration::ZERO, "the first write does not wait");
        assert_eq!(left(Some(now)), WRITE_GAP);
        assert_eq!(left(Some(ago(1))), WRITE_GAP - Duration::from_millis(1));
        assert_eq!(left(Some(ago(3))), Duration::ZERO, "the gap has just passed");
        // Past the gap (where reading the clock twice underflowed) and a `last` later
        // than `now`: neither panics.
        assert_eq!(left(Some(ago(1_000))), Duration::ZERO);
        assert_eq!(left(Some(now + Duration::from_millis(1))), WRITE_GAP);
        // Another gap.
        assert_eq!(
            gap_left(Duration::from_secs(2), Some(ago(500)), now),
            Duration::from_millis(1_500)
        );
    }
}
