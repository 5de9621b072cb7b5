//! Accounts as the server holds them: constant-time credentials, the concurrent-bind count
//! and the per-account token bucket shared by all of the account's sessions.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::{Mutex, RwLock};
use rusmpp::CommandStatus;
use subtle::{Choice, ConstantTimeEq};
use tokio::time::Instant;

use super::Account;
use crate::tls::Subject;

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

/// An account with its live state. A reload changes its password, bind limit and
/// throughput limit in place, so its bound sessions keep their slots and follow the new
/// limits.
pub(super) struct AccountState {
    /// The system_id, shared with every batch handed to the handler.
    pub(super) name: Arc<str>,
    max_binds: AtomicU32,
    secret: RwLock<Secret>,
    /// Empty: any address.
    allowed_ips: RwLock<Vec<ipnet::IpNet>>,
    /// Mutual TLS: the client certificate's subject must have these attributes.
    tls_subject: RwLock<Option<Subject>>,
    binds: AtomicU32,
    bucket: Mutex<Option<Bucket>>,
}

impl AccountState {
    fn new(account: &Account, now: Instant) -> Self {
        AccountState {
            name: Arc::from(account.system_id.as_str()),
            max_binds: AtomicU32::new(account.max_binds),
            secret: RwLock::new(Secret::new(account.password.as_bytes())),
            allowed_ips: RwLock::new(account.allowed_ips.clone()),
            tls_subject: RwLock::new(account.tls_subject.clone()),
            binds: AtomicU32::new(0),
            bucket: Mutex::new((account.max_tps > 0).then(|| Bucket::new(account.max_tps, now))),
        }
    }

    /// Take a reloaded account's password and limits.
    fn update(&self, account: &Account, now: Instant) {
        self.max_binds.store(account.max_binds, Ordering::Release);
        *self.secret.write() = Secret::new(account.password.as_bytes());
        *self.allowed_ips.write() = account.allowed_ips.clone();
        *self.tls_subject.write() = account.tls_subject.clone();
        let mut bucket = self.bucket.lock();
        let rate = f64::from(account.max_tps);
        if bucket.as_ref().map_or(0.0, |b| b.rate) != rate {
            *bucket = (account.max_tps > 0).then(|| Bucket::new(account.max_tps, now));
        }
    }

    /// Of `wanted` submits, how many the account's throughput limit lets through now.
    pub(super) fn admit(&self, wanted: usize, now: Instant) -> usize {
        match self.bucket.lock().as_mut() {
            None => wanted,
            Some(bucket) => bucket.take(wanted, now),
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

/// Why a bind was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BindRefusal {
    /// Credentials or limits: answered with this status.
    Status(CommandStatus),
    /// The account does not accept binds from this address (ESME_RBINDFAIL).
    Address,
    /// The account requires a client certificate with its `tls-subject`, and the
    /// connection has none, or one with another subject (ESME_RBINDFAIL).
    Certificate,
}

impl BindRefusal {
    pub(super) fn status(self) -> CommandStatus {
        match self {
            BindRefusal::Status(s) => s,
            BindRefusal::Address | BindRefusal::Certificate => CommandStatus::EsmeRbindfail,
        }
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 address, so `allowed-ips` written as IPv4
/// match a dual-stack listener's peers.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// All configured accounts, by system_id; replaced as a whole by a reload.
pub(super) struct Accounts {
    by_id: RwLock<HashMap<String, Arc<AccountState>>>,
    /// Compared against when the system_id is unknown, so that an unknown id costs the
    /// same as a wrong password.
    dummy: Secret,
}

/// The server's accounts, shared with whoever reloads them ([`AccountBook::replace`]).
#[derive(Clone)]
pub struct AccountBook(Arc<Accounts>);

/// Names the accounts only: passwords stay out of debug output.
impl std::fmt::Debug for AccountBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<String> = self.0.by_id.read().keys().cloned().collect();
        ids.sort();
        f.debug_tuple("AccountBook").field(&ids).finish()
    }
}

impl AccountBook {
    pub fn new(accounts: &[Account]) -> Self {
        AccountBook(Arc::new(Accounts::new(accounts)))
    }

    /// Take a reloaded account list: new accounts can bind at once, changed ones keep
    /// their sessions under the new password and limits, and the system ids of removed
    /// ones are returned (their sessions are for the caller to unbind).
    pub fn replace(&self, accounts: &[Account]) -> Vec<String> {
        let now = Instant::now();
        let mut by_id = self.0.by_id.write();
        let removed: Vec<String> = by_id
            .keys()
            .filter(|id| !accounts.iter().any(|a| &a.system_id == *id))
            .cloned()
            .collect();
        for id in &removed {
            by_id.remove(id);
        }
        for account in accounts {
            match by_id.get(&account.system_id) {
                Some(state) => state.update(account, now),
                None => {
                    by_id.insert(account.system_id.clone(), Arc::new(AccountState::new(account, now)));
                }
            }
        }
        removed
    }

    pub fn len(&self) -> usize {
        self.0.by_id.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn accounts(&self) -> &Accounts {
        &self.0
    }
}

impl Accounts {
    pub(super) fn new(accounts: &[Account]) -> Self {
        let now = Instant::now();
        let by_id = accounts
            .iter()
            .map(|account| (account.system_id.clone(), Arc::new(AccountState::new(account, now))))
            .collect();
        Accounts {
            by_id: RwLock::new(by_id),
            dummy: Secret::new(b"\x7f-dummy-\x7f"),
        }
    }

    /// Checks a bind's credentials and takes a bind slot.
    ///
    /// Unknown system_id → ESME_RINVSYSID, wrong password → ESME_RINVPASWD (the password is
    /// compared in constant time, against a dummy for an unknown id), no free slot →
    /// ESME_RBINDFAIL. An account with `allowed-ips` refuses a bind from any other
    /// address with ESME_RBINDFAIL ([`BindRefusal::Address`]), whatever its password;
    /// one with `tls-subject` refuses a connection without a client certificate that has
    /// that subject ([`BindRefusal::Certificate`]) the same way.
    #[cfg(test)]
    pub(super) fn bind(&self, system_id: &str, password: &[u8], peer: IpAddr) -> Result<BindSlot, BindRefusal> {
        self.bind_from(system_id, password, peer, None)
    }

    /// [`Self::bind`] for a connection whose client certificate has `certificate` as its
    /// subject (None: plain, or TLS without a client certificate).
    pub(super) fn bind_from(
        &self,
        system_id: &str,
        password: &[u8],
        peer: IpAddr,
        certificate: Option<&Subject>,
    ) -> Result<BindSlot, BindRefusal> {
        let by_id = self.by_id.read();
        let account = by_id.get(system_id);
        if let Some(account) = account {
            let allowed = account.allowed_ips.read();
            if !allowed.is_empty() && !allowed.iter().any(|net| net.contains(&canonical(peer))) {
                return Err(BindRefusal::Address);
            }
            if let Some(required) = &*account.tls_subject.read()
                && !certificate.is_some_and(|c| c.satisfies(required))
            {
                return Err(BindRefusal::Certificate);
            }
        }
        let password_ok = bool::from(match account {
            Some(account) => account.secret.read().matches(password),
            None => self.dummy.matches(password),
        });
        let Some(account) = account else {
            return Err(BindRefusal::Status(CommandStatus::EsmeRinvsysid));
        };
        if !password_ok {
            return Err(BindRefusal::Status(CommandStatus::EsmeRinvpaswd));
        }
        let max = account.max_binds.load(Ordering::Acquire);
        account
            .binds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bound| {
                (bound < max).then_some(bound + 1)
            })
            .map_err(|_| BindRefusal::Status(CommandStatus::EsmeRbindfail))?;
        Ok(BindSlot {
            account: account.clone(),
        })
    }

    #[cfg(test)]
    pub(super) fn get(&self, system_id: &str) -> Option<Arc<AccountState>> {
        self.by_id.read().get(system_id).cloned()
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
            allowed_ips: Vec::new(),
            tls_subject: None,
        }
    }

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn allowed_ips_refuse_other_addresses_before_the_password() {
        let mut a = account("esme1", "pw", 4, 0);
        a.allowed_ips = vec!["10.0.0.0/8".parse().unwrap(), "192.0.2.7/32".parse().unwrap()];
        let accounts = Accounts::new(&[a, account("open", "pw", 1, 0)]);
        let from = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(accounts.bind("esme1", b"pw", from("10.1.2.3")).is_ok());
        assert!(accounts.bind("esme1", b"pw", from("192.0.2.7")).is_ok());
        assert!(
            accounts.bind("esme1", b"pw", from("::ffff:10.9.9.9")).is_ok(),
            "IPv4-mapped"
        );
        assert_eq!(
            accounts.bind("esme1", b"pw", from("192.0.2.8")).err(),
            Some(BindRefusal::Address)
        );
        assert_eq!(accounts.bind("esme1", b"bad", LOCAL).err(), Some(BindRefusal::Address));
        assert_eq!(BindRefusal::Address.status(), CommandStatus::EsmeRbindfail);
        assert!(
            accounts.bind("open", b"pw", from("203.0.113.1")).is_ok(),
            "no list: any address"
        );
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
        assert_eq!(
            accounts.bind("nobody", b"pw", LOCAL).err().map(BindRefusal::status),
            Some(CommandStatus::EsmeRinvsysid)
        );
        assert_eq!(
            accounts.bind("esme1", b"bad", LOCAL).err().map(BindRefusal::status),
            Some(CommandStatus::EsmeRinvpaswd)
        );
        let first = accounts.bind("esme1", b"pw", LOCAL).unwrap();
        let second = accounts.bind("esme1", b"pw", LOCAL).unwrap();
        assert_eq!(
            accounts.bind("esme1", b"pw", LOCAL).err().map(BindRefusal::status),
            Some(CommandStatus::EsmeRbindfail)
        );
        assert_eq!(accounts.get("esme1").unwrap().bound_sessions(), 2);
        drop(first);
        let third = accounts.bind("esme1", b"pw", LOCAL).unwrap();
        assert_eq!(third.account().name.as_ref(), "esme1");
        drop((second, third));
        assert_eq!(accounts.get("esme1").unwrap().bound_sessions(), 0);
    }

    #[test]
    fn zero_max_binds_refuses_every_bind() {
        let accounts = Accounts::new(&[account("esme1", "pw", 0, 0)]);
        assert_eq!(
            accounts.bind("esme1", b"pw", LOCAL).err().map(BindRefusal::status),
            Some(CommandStatus::EsmeRbindfail)
        );
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

    #[test]
    fn a_reload_adds_changes_and_removes_accounts_keeping_bound_slots() {
        let book = AccountBook::new(&[account("esme1", "pw", 2, 0), account("old", "pw", 1, 0)]);
        let slot = book.accounts().bind("esme1", b"pw", LOCAL).unwrap();
        let removed = book.replace(&[account("esme1", "new", 1, 0), account("fresh", "f", 1, 0)]);
        assert_eq!(removed, vec!["old".to_owned()]);
        assert_eq!(
            book.accounts().bind("old", b"pw", LOCAL).err().map(BindRefusal::status),
            Some(CommandStatus::EsmeRinvsysid)
        );
        assert_eq!(
            book.accounts()
                .bind("esme1", b"pw", LOCAL)
                .err()
                .map(BindRefusal::status),
            Some(CommandStatus::EsmeRinvpaswd)
        );
        // The bound session keeps its slot, and counts against the new limit of 1.
        assert_eq!(
            book.accounts()
                .bind("esme1", b"new", LOCAL)
                .err()
                .map(BindRefusal::status),
            Some(CommandStatus::EsmeRbindfail)
        );
        drop(slot);
        assert!(book.accounts().bind("esme1", b"new", LOCAL).is_ok());
        assert!(book.accounts().bind("fresh", b"f", LOCAL).is_ok());
        assert_eq!(book.len(), 2);
        assert_eq!(format!("{book:?}"), "AccountBook([\"esme1\", \"fresh\"])");
    }
}
