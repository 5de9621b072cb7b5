//! Backing off password and API-key guessing.
//!
//! Every failed SMPP bind (unknown system_id, wrong password) and every request with an
//! unknown API key is counted against its source address and, for binds, against the
//! system_id it named. Past [`DELAY_AFTER`] failures within [`WINDOW`] the answer to each
//! further failure is held back — 250 ms, doubling, at most [`MAX_DELAY`] — so guessing
//! gets slow; past [`REFUSE_ADDRESS_AFTER`] failures an address is refused outright for
//! [`REFUSE_FOR`] (binds get `ESME_RBINDFAIL`, HTTP requests 429) whatever it sends. A
//! system_id past [`REFUSE_ACCOUNT_AFTER`] failures is refused for [`REFUSE_FOR`] to
//! every address that failed for it — a correct bind from any other address is
//! unaffected, so an attacker cannot lock the real ESME out. A success clears its
//! address's record.
//!
//! Memory is bounded: at most [`MAX_TRACKED`] addresses, system_ids and pairs each;
//! beyond that the records whose window ended go first, then the oldest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Failures (per address or per system_id) answered without delay.
pub const DELAY_AFTER: u32 = 3;
/// The longest a failure's answer is held back.
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// Failures after which an address is refused.
pub const REFUSE_ADDRESS_AFTER: u32 = 10;
/// Failures after which a system_id is refused to the addresses that failed for it.
pub const REFUSE_ACCOUNT_AFTER: u32 = 20;
/// How long a refusal lasts.
pub const REFUSE_FOR: Duration = Duration::from_secs(300);
/// Failures older than this are forgotten.
pub const WINDOW: Duration = Duration::from_secs(900);
/// Records kept per kind.
pub const MAX_TRACKED: usize = 65_536;

/// Whether to check the credentials at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Check,
    /// Refused without looking at the credentials, for about this long.
    Refuse(Duration),
}

#[derive(Clone, Copy, Debug)]
struct Record {
    failures: u32,
    since: Instant,
    refused_until: Option<Instant>,
}

impl Record {
    fn new(now: Instant) -> Self {
        Record {
            failures: 0,
            since: now,
            refused_until: None,
        }
    }

    fn live(&self, now: Instant) -> bool {
        now.duration_since(self.since) < WINDOW || self.refused_until.is_some_and(|u| u > now)
    }

    fn refused(&self, now: Instant) -> Option<Duration> {
        self.refused_until.filter(|u| *u > now).map(|u| u - now)
    }

    fn fail(&mut self, now: Instant, refuse_after: u32) {
        if !self.live(now) {
            *self = Record::new(now);
        }
        self.failures = self.failures.saturating_add(1);
        if self.failures >= refuse_after {
            self.refused_until = Some(now + REFUSE_FOR);
        }
    }
}

struct Tracked<K: std::hash::Hash + Eq + Clone>(HashMap<K, Record>);

impl<K: std::hash::Hash + Eq + Clone> Default for Tracked<K> {
    fn default() -> Self {
        Tracked(HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq + Clone> Tracked<K> {
    fn entry(&mut self, key: &K, now: Instant) -> &mut Record {
        if !self.0.contains_key(key) && self.0.len() >= MAX_TRACKED {
            self.0.retain(|_, r| r.live(now));
            if self.0.len() >= MAX_TRACKED
                && let Some(oldest) = self.0.iter().min_by_key(|(_, r)| r.since).map(|(k, _)| k.clone())
            {
                self.0.remove(&oldest);
            }
        }
        self.0.entry(key.clone()).or_insert_with(|| Record::new(now))
    }
}

/// The failure records of one gateway (SMPP and HTTP share them).
#[derive(Default)]
pub struct AuthGuard {
    state: Mutex<State>,
    /// Records held: while none, a check takes no lock (every request checks).
    tracked: AtomicUsize,
}

#[derive(Default)]
struct State {
    addresses: Tracked<IpAddr>,
    accounts: Tracked<String>,
    /// (address, system_id) pairs that failed: who a refused system_id is refused to.
    pairs: Tracked<(IpAddr, String)>,
}

impl State {
    fn len(&self) -> usize {
        self.addresses.0.len() + self.accounts.0.len() + self.pairs.0.len()
    }
}

impl std::fmt::Debug for AuthGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock();
        f.debug_struct("AuthGuard")
            .field("addresses", &st.addresses.0.len())
            .field("accounts", &st.accounts.0.len())
            .finish()
    }
}

impl AuthGuard {
    pub fn new() -> Self {
        Self::default()
    }

    /// Before checking credentials from `addr` (for `system_id`, for a bind).
    pub fn check(&self, addr: IpAddr, system_id: Option<&str>) -> Verdict {
        if self.tracked.load(Ordering::Relaxed) == 0 {
            return Verdict::Check;
        }
        let now = Instant::now();
        let st = self.state.lock();
        if let Some(left) = st.addresses.0.get(&addr).and_then(|r| r.refused(now)) {
            return Verdict::Refuse(left);
        }
        if let Some(id) = system_id
            && let Some(left) = st.accounts.0.get(id).and_then(|r| r.refused(now))
            && st.pairs.0.get(&(addr, id.to_string())).is_some_and(|r| r.live(now))
        {
            return Verdict::Refuse(left);
        }
        Verdict::Check
    }

    /// Credentials from `addr` were wrong: count it, and return how long to hold the
    /// answer back.
    pub fn failed(&self, addr: IpAddr, system_id: Option<&str>) -> Duration {
        let now = Instant::now();
        let mut st = self.state.lock();
        let by_address = st.addresses.entry(&addr, now);
        by_address.fail(now, REFUSE_ADDRESS_AFTER);
        let mut failures = by_address.failures;
        if let Some(id) = system_id {
            let by_account = st.accounts.entry(&id.to_string(), now);
            by_account.fail(now, REFUSE_ACCOUNT_AFTER);
            failures = failures.max(by_account.failures);
            st.pairs.entry(&(addr, id.to_string()), now).fail(now, u32::MAX);
        }
        self.tracked.store(st.len(), Ordering::Relaxed);
        delay_for(failures)
    }

    /// Credentials from `addr` were right.
    pub fn succeeded(&self, addr: IpAddr, system_id: Option<&str>) {
        let mut st = self.state.lock();
        st.addresses.0.remove(&addr);
        if let Some(id) = system_id {
            st.pairs.0.remove(&(addr, id.to_string()));
        }
        self.tracked.store(st.len(), Ordering::Relaxed);
    }
}

/// The hold-back after the `failures`-th failure.
fn delay_for(failures: u32) -> Duration {
    if failures <= DELAY_AFTER {
        return Duration::ZERO;
    }
    let doublings = (failures - DELAY_AFTER - 1).min(16);
    (Duration::from_millis(250) * (1u32 << doublings)).min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn failures_are_slowed_then_the_address_is_refused() {
        let g = AuthGuard::new();
        let a = ip("192.0.2.1");
        let delays: Vec<Duration> = (0..REFUSE_ADDRESS_AFTER)
            .map(|_| {
                assert_eq!(g.check(a, Some("esme1")), Verdict::Check);
                g.failed(a, Some("esme1"))
            })
            .collect();
        assert_eq!(&delays[..3], &[Duration::ZERO; 3]);
        assert_eq!(delays[3], Duration::from_millis(250));
        assert_eq!(delays[4], Duration::from_millis(500));
        assert_eq!(delays[9], MAX_DELAY);
        assert!(matches!(g.check(a, Some("esme1")), Verdict::Refuse(d) if d > Duration::from_secs(290)));
        assert!(
            matches!(g.check(a, Some("other")), Verdict::Refuse(_)),
            "the address, whatever it names"
        );
        assert_eq!(
            g.check(ip("192.0.2.2"), Some("esme1")),
            Verdict::Check,
            "another address"
        );
    }

    #[test]
    fn a_guessed_system_id_is_refused_only_to_the_addresses_that_failed_for_it() {
        let g = AuthGuard::new();
        // A distributed guess: many addresses, a few failures each.
        for i in 0..REFUSE_ACCOUNT_AFTER {
            let a = ip(&format!("198.51.100.{i}"));
            g.failed(a, Some("esme1"));
        }
        assert!(matches!(g.check(ip("198.51.100.3"), Some("esme1")), Verdict::Refuse(_)));
        assert_eq!(g.check(ip("198.51.100.3"), Some("esme2")), Verdict::Check);
        assert_eq!(
            g.check(ip("203.0.113.9"), Some("esme1")),
            Verdict::Check,
            "the real ESME binds"
        );
    }

    #[test]
    fn a_success_clears_its_address() {
        let g = AuthGuard::new();
        let a = ip("192.0.2.7");
        for _ in 0..5 {
            g.failed(a, None);
        }
        g.succeeded(a, None);
        assert_eq!(g.failed(a, None), Duration::ZERO);
    }

    #[test]
    fn records_stay_bounded() {
        let g = AuthGuard::new();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            g.failed(IpAddr::from(i.to_be_bytes()), None);
        }
        assert!(g.state.lock().addresses.0.len() <= MAX_TRACKED);
    }
}
