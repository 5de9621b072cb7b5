//! Accounts as the server holds them: constant-time credentials, the concurrent-bind count
//! and the per-account token bucket shared by all of the account's sessions.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use rusmpp::CommandStatus;
use subtle::{Choice, ConstantTimeEq};
use tokio::time::Instant;

use super::Account;

/// Passwords are compared over this many octets whatever their length, so the comparison
/// time says nothing about the length either. SMPP 3.4 passwords have at most 8 octets
/// (the decoder refuses longer ones), so a configured password longer than this can never
/// match and is simply marked unusable.
const SECRET_LEN: usize = 16;

/// A password padded to [`SECRET_LEN`] octets, compared in constant time.
struct Secret {
    bytes: [u8; SECRET_LEN],
    len: u64,
    usable: bool,
}

impl Secret {
    fn new(password: &[u8]) -> Self {
        let mut bytes = [0u8; SECRET_LEN];
        let usable = password.len() <= SECRET_LEN;
        if let Some(dst) = bytes.get_mut(..password.len()) {
            dst.copy_from_slice(password);
        }
        Secret {
            bytes,
            len: u64::try_from(password.len()).unwrap_or(u64::MAX),
            usable,
        }
    }

    /// Same work for every input: pad, compare all octets, compare the lengths.
    fn matches(&self, given: &[u8]) -> Choice {
        let mut padded = [0u8; SECRET_LEN];
        let take = given.len().min(SECRET_LEN);
        if let (Some(dst), Some(src)) = (padded.get_mut(..take), given.get(..take)) {
            dst.copy_from_slice(src);
        }
        let given_len = u64::try_from(given.len()).unwrap_or(u64::MAX);
        self.bytes.ct_eq(&padded) & self.len.ct_eq(&given_len) & Choice::from(u8::from(self.usable))
    }
}

/// One-second-burst token bucket: `rate` tokens per second, at most `rate` stored.
#[derive(Debug)]
pub(super) struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(super) fn new(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate);
        Bucket {
            rate,
            tokens: rate,
            last: now,
        }
    }

    /// Takes up to `wanted` whole tokens; returns how many were granted.
    pub(super) fn take(&mut self, wanted: usize, now: Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        let available = self.tokens.floor();
        let wanted_f = wanted as f64;
        if wanted_f <= available {
            self.tokens -= wanted_f;
            wanted
        } else {
            self.tokens -= available;
            // `available` is a non-negative whole number below `wanted`.
            let granted = available as usize;
            granted.min(wanted)
        }
    }
}

/// An account with its live state.
pub(super) struct AccountState {
    /// The system_id, shared with every batch handed to the handler.
    pub(super) name: Arc<str>,
    max_binds: u32,
    secret: Secret,
    binds: AtomicU32,
    bucket: Option<Mutex<Bucket>>,
}

impl AccountState {
    fn new(account: &Account, now: Instant) -> Self {
        AccountState {
            name: Arc::from(account.system_id.as_str()),
            max_binds: account.max_binds,
            secret: Secret::new(account.password.as_bytes()),
            binds: AtomicU32::new(0),
            bucket: (account.max_tps > 0).then(|| Mutex::new(Bucket::new(account.max_tps, now))),
        }
    }

    /// Of `wanted` submits, how many the account's throughput limit lets through now.
    pub(super) fn admit(&self, wanted: usize, now: Instant) -> usize {
        match &self.bucket {
            None => wanted,
            Some(bucket) => bucket.lock().take(wanted, now),
        }
    }

    /// Sessions currently bound.
    #[cfg(test)]
    pub(super) fn bound_sessions(&self) -> u32 {
        self.binds.load(Ordering::Relaxed)
    }
}

/// A bind slot of an account; freed when dropped.
pub(super) struct BindSlot {
    account: Arc<AccountState>,
}

impl BindSlot {
    pub(super) fn account(&self) -> &Arc<AccountState> {
        &self.account
    }
}

impl Drop for BindSlot {
    fn drop(&mut self) {
        self.account.binds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// All configured accounts, by system_id.
pub(super) struct Accounts {
    by_id: HashMap<String, Arc<AccountState>>,
    /// Compared against when the system_id is unknown, so that an unknown id costs the
    /// same as a wrong password.
    dummy: Secret,
}

impl Accounts {
    pub(super) fn new(accounts: &[Account]) -> Self {
        let now = Instant::now();
        let by_id = accounts
            .iter()
            .map(|account| (account.system_id.clone(), Arc::new(AccountState::new(account, now))))
            .collect();
        Accounts {
            by_id,
            dummy: Secret::new(b"\x7f-dummy-\x7f"),
        }
    }

    /// Checks a bind's credentials and takes a bind slot.
    ///
    /// Unknown system_id → ESME_RINVSYSID, wrong password → ESME_RINVPASWD (the password is
    /// compared in constant time, against a dummy for an unknown id), no free slot →
    /// ESME_RBINDFAIL.
    pub(super) fn bind(&self, system_id: &str, password: &[u8]) -> Result<BindSlot, CommandStatus> {
        let account = self.by_id.get(system_id);
        let secret = account.map_or(&self.dummy, |account| &account.secret);
        let password_ok = bool::from(secret.matches(password));
        let Some(account) = account else {
            return Err(CommandStatus::EsmeRinvsysid);
        };
        if !password_ok {
            return Err(CommandStatus::EsmeRinvpaswd);
        }
        let max = account.max_binds;
        account
            .binds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bound| {
                (bound < max).then_some(bound + 1)
            })
            .map_err(|_| CommandStatus::EsmeRbindfail)?;
        Ok(BindSlot {
            account: account.clone(),
        })
    }

    #[cfg(test)]
    pub(super) fn get(&self, system_id: &str) -> Option<&Arc<AccountState>> {
        self.by_id.get(system_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn account(id: &str, pw: &str, max_binds: u32, max_tps: u32) -> Account {
        Account {
            system_id: id.into(),
            password: pw.into(),
            max_binds,
            max_tps,
        }
    }

    #[test]
    fn secrets_compare_whole_values() {
        let secret = Secret::new(b"secret");
        assert!(bool::from(secret.matches(b"secret")));
        assert!(!bool::from(secret.matches(b"secre")));
        assert!(!bool::from(secret.matches(b"secret\0")));
        assert!(!bool::from(secret.matches(b"secreT")));
        assert!(!bool::from(secret.matches(b"")));
        assert!(bool::from(Secret::new(b"").matches(b"")));
        // A configured password no bind can carry never matches, not even its prefix.
        let long = Secret::new(&[b'a'; 20]);
        assert!(!bool::from(long.matches(&[b'a'; 20])));
        assert!(!bool::from(long.matches(&[b'a'; 16])));
    }

    #[test]
    fn bind_statuses_and_slots() {
        let accounts = Accounts::new(&[account("esme1", "pw", 2, 0)]);
        assert_eq!(accounts.bind("nobody", b"pw").err(), Some(CommandStatus::EsmeRinvsysid));
        assert_eq!(accounts.bind("esme1", b"bad").err(), Some(CommandStatus::EsmeRinvpaswd));
        let first = accounts.bind("esme1", b"pw").unwrap();
        let second = accounts.bind("esme1", b"pw").unwrap();
        assert_eq!(accounts.bind("esme1", b"pw").err(), Some(CommandStatus::EsmeRbindfail));
        assert_eq!(accounts.get("esme1").unwrap().bound_sessions(), 2);
        drop(first);
        let third = accounts.bind("esme1", b"pw").unwrap();
        assert_eq!(third.account().name.as_ref(), "esme1");
        drop((second, third));
        assert_eq!(accounts.get("esme1").unwrap().bound_sessions(), 0);
    }

    #[test]
    fn zero_max_binds_refuses_every_bind() {
        let accounts = Accounts::new(&[account("esme1", "pw", 0, 0)]);
        assert_eq!(accounts.bind("esme1", b"pw").err(), Some(CommandStatus::EsmeRbindfail));
    }

    #[test]
    fn token_bucket_has_a_one_second_burst_and_refills() {
        let start = Instant::now();
        let mut bucket = Bucket::new(10, start);
        assert_eq!(bucket.take(4, start), 4);
        assert_eq!(bucket.take(10, start), 6);
        assert_eq!(bucket.take(1, start), 0);
        // 100 ms at 10/s: one token.
        let later = start + Duration::from_millis(100);
        assert_eq!(bucket.take(5, later), 1);
        // A long pause refills to the burst, not beyond.
        let much_later = later + Duration::from_secs(60);
        assert_eq!(bucket.take(100, much_later), 10);
        assert_eq!(bucket.take(0, much_later), 0);
    }

    #[test]
    fn unlimited_accounts_admit_everything() {
        let accounts = Accounts::new(&[account("a", "pw", 1, 0), account("b", "pw", 1, 3)]);
        let now = Instant::now();
        assert_eq!(accounts.get("a").unwrap().admit(1_000_000, now), 1_000_000);
        assert_eq!(accounts.get("b").unwrap().admit(5, now), 3);
        assert_eq!(accounts.get("b").unwrap().admit(5, now), 0);
    }
}
