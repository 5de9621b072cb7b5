//! Small shared helpers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Waits until `cond()` holds or `timeout` passes; returns the final `cond()`.
///
/// Re-checks whenever `notify` fires (producers call `notify_waiters`) and at least every
/// 50 ms, so a missed notification only costs latency.
pub(crate) async fn wait_until(notify: &Notify, timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if cond() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return cond();
        }
        let step = (now + Duration::from_millis(50)).min(deadline);
        let _ = tokio::time::timeout_at(step, notified).await;
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Microseconds since the Unix epoch.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), the unit of the CPU times in
/// `/proc/<pid>/stat`; 100 when it cannot be read.
pub fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}
