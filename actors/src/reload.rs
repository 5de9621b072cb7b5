//! Live reconfiguration: accounts, API keys, routes and destinations are re-read from
//! the same file without a restart (SIGHUP, `POST /admin/reload`).
//!
//! A reload is all or nothing. The new configuration is validated like a startup one;
//! then every key that cannot change while running (storage, listeners, outbox
//! sources, limits read at startup) is compared with the running configuration, and
//! the first one that differs fails the reload naming it — the running configuration
//! stays as it was. Otherwise the live parts are swapped, destinations and routes
//! first (so a new account's traffic finds its routes):
//!
//! * `[[destinations]]`: a new one gets its worker and binds; a removed or changed one's
//!   worker gives back what it has not started, lets its submissions in flight finish,
//!   and stops — then a changed one binds again with its new settings. Work whose
//!   destinations are all gone is routed again by the current table, or fails with a
//!   NO-ROUTE receipt when nothing matches (see [`crate::destination_worker`] and the
//!   Router's placement);
//! * `[[smpp.accounts]]`: new accounts can bind at once; a changed account keeps its
//!   bound sessions under its new password and limits; a removed account's sessions are
//!   sent `unbind`;
//! * `[[http.api-keys]]`, `[[http.sendsms-users]]` (and each account's `max-tps` for
//!   HTTP): from the next request;
//! * `[[routes]]`: messages routed after the swap follow the new table; routes already
//!   recorded stay as they were;
//! * `[[mo-routes]]` and `[mo]`: inbound messages arriving after the swap follow them;
//!   stored ones keep their target.
//! * TLS certificate and key files (`[smpp.tls]`, `[http.tls]`, `[admin.tls]`): read
//!   again before anything is swapped (a bad file refuses the reload), then used for new
//!   connections; established sessions keep theirs (see [`crate::tls`]).

use std::collections::HashMap;
use std::time::SystemTime;

use parking_lot::Mutex;
use sendium_profiles::{Config, HttpConfig, RouteTable, SmppConfig};
use sendium_protocols::http::{ApiKey, HttpAccess, HttpCredentials, SendsmsUser};
use sendium_protocols::smpp::server::{Account, AccountBook, SessionRegistry};

use crate::spec::LiveRoutes;
use crate::supervisor::DestinationChanges;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{key} cannot change while Sendium runs (restart to change it); the running configuration is unchanged")]
    NotLive { key: &'static str },
    #[error("{0}; the running configuration is unchanged")]
    Invalid(String),
    #[error("the destinations could not be changed ({0}); the running configuration is unchanged")]
    Destinations(String),
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReloadSummary {
    pub accounts_added: Vec<String>,
    pub accounts_removed: Vec<String>,
    pub accounts_changed: Vec<String>,
    /// Sessions unbound because their account was removed.
    pub sessions_unbound: usize,
    pub api_keys: usize,
    pub routes: usize,
    pub mo_routes: usize,
    pub destinations: DestinationChanges,
}

/// The running configuration and the handles its live parts are swapped through.
pub struct LiveConfig {
    running: Mutex<Running>,
    accounts: Option<AccountBook>,
    http: Option<HttpAccess>,
    provider_receipts: Option<std::sync::Arc<crate::provider_receipts::ProviderReceipts>>,
    routes: LiveRoutes,
    sessions: SessionRegistry,
}

struct Running {
    config: Config,
    loaded_at: SystemTime,
}

/// `/admin/config`: which configuration runs (never its content: it holds secrets).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConfigView {
    /// RFC 3339.
    pub loaded_at: String,
    pub accounts: usize,
    pub api_keys: usize,
    pub routes: usize,
    pub mo_routes: usize,
    pub destinations: usize,
}

/// The server's accounts of a configuration.
pub fn smpp_accounts(smpp: &SmppConfig) -> Vec<Account> {
    smpp.accounts
        .iter()
        .map(|a| Account {
            system_id: a.system_id.clone(),
            password: a.password.expose().to_string(),
            max_binds: a.max_binds,
            max_tps: a.max_tps,
            allowed_ips: a.allowed_ips.clone(),
            // Validated at load: the text parses.
            tls_subject: a
                .tls_subject
                .as_deref()
                .and_then(|t| sendium_protocols::tls::Subject::parse(t).ok()),
        })
        .collect()
}

/// The HTTP ingress's keys, `/cgi-bin/sendsms` users and per-account limits of a
/// configuration.
pub fn http_access(cfg: &Config, http: &HttpConfig) -> (HttpCredentials, HashMap<String, u32>) {
    let api_keys = http
        .api_keys
        .iter()
        .map(|k| ApiKey {
            key: k.key.expose().to_string(),
            account: k.account.clone(),
            allowed_ips: k.allowed_ips.clone(),
        })
        .collect();
    let sendsms_users = http
        .sendsms_users
        .iter()
        .map(|u| SendsmsUser {
            username: u.username.clone(),
            password: u.password.expose().to_string(),
            account: u.account.clone(),
            allowed_ips: u.allowed_ips.clone(),
        })
        .collect();
    let keys = HttpCredentials {
        api_keys,
        sendsms_users,
    };
    let max_tps = cfg
        .smpp
        .as_ref()
        .map(|s| s.accounts.iter().map(|a| (a.system_id.clone(), a.max_tps)).collect())
        .unwrap_or_default();
    (keys, max_tps)
}

/// The first key that differs between `old` and `new` outside the live parts.
fn not_live_change(old: &Config, new: &Config) -> Option<&'static str> {
    // TLS certificate and key files are live (re-read at each reload); whether a listener
    // speaks TLS, and where, is not.
    let smpp_fixed = |c: &Config| {
        c.smpp.clone().map(|mut s| {
            s.accounts.clear();
            if let Some(t) = &mut s.tls {
                t.cert = std::path::PathBuf::new();
                t.key = std::path::PathBuf::new();
                t.client_ca = None;
            }
            s
        })
    };
    let http_fixed = |c: &Config| {
        c.http.clone().map(|mut h| {
            h.api_keys.clear();
            h.sendsms_users.clear();
            h.tls = h.tls.map(tls_presence);
            h
        })
    };
    let admin_fixed = |c: &Config| {
        let mut a = c.admin.clone();
        a.tls = a.tls.map(tls_presence);
        a
    };
    let smpp_tls_listen = |c: &Config| c.smpp.as_ref().map(|s| s.tls.as_ref().map(|t| t.listen));
    let checks: [(&'static str, bool); 15] = [
        ("sms.pending", old.sms.pending == new.sms.pending),
        ("sms.router-queue", old.sms.router_queue == new.sms.router_queue),
        ("sms.routed-work", old.sms.routed_work == new.sms.routed_work),
        ("sms", old.sms == new.sms),
        ("dlr", old.dlr == new.dlr),
        ("storage", old.storage == new.storage),
        (
            "smpp.listen",
            old.smpp.as_ref().map(|s| s.listen) == new.smpp.as_ref().map(|s| s.listen),
        ),
        ("smpp.tls.listen", smpp_tls_listen(old) == smpp_tls_listen(new)),
        ("smpp", smpp_fixed(old) == smpp_fixed(new)),
        (
            "http.listen",
            old.http.as_ref().map(|h| h.listen) == new.http.as_ref().map(|h| h.listen),
        ),
        (
            "http.tls",
            old.http.as_ref().map(|h| h.tls.is_some()) == new.http.as_ref().map(|h| h.tls.is_some()),
        ),
        ("http", http_fixed(old) == http_fixed(new)),
        ("admin.tls", old.admin.tls.is_some() == new.admin.tls.is_some()),
        ("admin", admin_fixed(old) == admin_fixed(new)),
        ("outbox", old.outbox == new.outbox),
    ];
    checks
        .into_iter()
        .find(|(_, same)| !same)
        .map(|(key, _)| key)
        .or_else(|| (old.log != new.log).then_some("log"))
        .or_else(|| (old.shutdown != new.shutdown).then_some("shutdown"))
}

/// A TLS section with its file paths blanked: only whether it is there counts.
fn tls_presence(mut t: sendium_profiles::TlsConfig) -> sendium_profiles::TlsConfig {
    t.cert = std::path::PathBuf::new();
    t.key = std::path::PathBuf::new();
    t
}

impl LiveConfig {
    pub fn new(
        config: Config,
        accounts: Option<AccountBook>,
        http: Option<HttpAccess>,
        provider_receipts: Option<std::sync::Arc<crate::provider_receipts::ProviderReceipts>>,
        routes: LiveRoutes,
        sessions: SessionRegistry,
    ) -> Self {
        LiveConfig {
            running: Mutex::new(Running {
                config,
                loaded_at: SystemTime::now(),
            }),
            accounts,
            http,
            provider_receipts,
            routes,
            sessions,
        }
    }

    pub fn view(&self) -> ConfigView {
        let running = self.running.lock();
        let c = &running.config;
        ConfigView {
            loaded_at: humantime::format_rfc3339_seconds(running.loaded_at).to_string(),
            accounts: c.smpp.as_ref().map_or(0, |s| s.accounts.len()),
            api_keys: c.http.as_ref().map_or(0, |h| h.api_keys.len()),
            routes: c.routes.len(),
            mo_routes: c.mo_routes.len(),
            destinations: c.destinations.len(),
        }
    }

    /// Whether `new` (already validated) may be swapped in, and whether its
    /// destinations differ from the running ones.
    pub fn check(&self, new: &Config) -> Result<bool, ReloadError> {
        let running = self.running.lock();
        if let Some(key) = not_live_change(&running.config, new) {
            return Err(ReloadError::NotLive { key });
        }
        Ok(running.config.destinations != new.destinations)
    }

    /// Swap in the route table (when the destinations did not change; otherwise the
    /// Router swaps it with them).
    pub fn replace_routes(&self, routes: RouteTable) {
        self.routes.replace(routes);
    }

    /// Swap in accounts and API keys, and make `new` the running configuration.
    pub fn commit(&self, new: Config) -> ReloadSummary {
        let mut running = self.running.lock();
        let old_accounts = running.config.smpp.as_ref().map(smpp_accounts).unwrap_or_default();
        let new_accounts = new.smpp.as_ref().map(smpp_accounts).unwrap_or_default();
        let mut summary = ReloadSummary {
            api_keys: new.http.as_ref().map_or(0, |h| h.api_keys.len()),
            routes: new.routes.len(),
            mo_routes: new.mo_routes.len(),
            ..ReloadSummary::default()
        };
        for a in &new_accounts {
            match old_accounts.iter().find(|o| o.system_id == a.system_id) {
                None => summary.accounts_added.push(a.system_id.clone()),
                Some(o) if o != a => summary.accounts_changed.push(a.system_id.clone()),
                Some(_) => {}
            }
        }
        if let Some(book) = &self.accounts {
            summary.accounts_removed = book.replace(&new_accounts);
            for id in &summary.accounts_removed {
                summary.sessions_unbound += self.sessions.close_account(id);
            }
        }
        if let (Some(access), Some(http)) = (&self.http, &new.http) {
            let (keys, max_tps) = http_access(&new, http);
            access.replace(keys, max_tps);
        }
        if let Some(receipts) = &self.provider_receipts {
            receipts.replace(&new);
        }
        running.config = new;
        running.loaded_at = SystemTime::now();
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        sendium_profiles::load_str(&format!(
            "[smpp]\n[[smpp.accounts]]\nsystem-id = \"a\"\npassword = \"pw\"\n\
             [[destinations]]\nname = \"sim\"\nkind = \"simulator\"\n[[routes]]\nname = \"default\"\nto = [\"sim\"]\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn only_live_keys_may_change() {
        let old = config("");
        assert_eq!(not_live_change(&old, &old), None);
        let more = config("[[smpp.accounts]]\nsystem-id = \"b\"\npassword = \"pw\"\n");
        assert_eq!(not_live_change(&old, &more), None, "accounts are live");
        let routed = config("[[routes]]\nname = \"uk\"\ndestination-prefix = \"44\"\nto = [\"sim\"]\n");
        assert_eq!(not_live_change(&old, &routed), None, "routes are live");
        let file = config("[sms.pending]\nbackend = \"file\"\n[storage.file]\ndir = \"/tmp/x\"\n");
        assert_eq!(not_live_change(&old, &file), Some("sms.pending"));
        let moved = config("[admin]\nlisten = \"127.0.0.1:9999\"\n");
        assert_eq!(not_live_change(&old, &moved), Some("admin"));
        let provider = config("[[destinations]]\nname = \"sim2\"\nkind = \"simulator\"\n");
        assert_eq!(not_live_change(&old, &provider), None, "destinations are live");
        let tls = |cert: &str, port: u16| {
            config(&format!(
                "[smpp.tls]\nlisten = \"127.0.0.1:{port}\"\ncert = \"{cert}\"\nkey = \"/k.pem\"\n[admin.tls]\ncert = \"{cert}\"\nkey = \"/k.pem\"\n"
            ))
        };
        assert_eq!(
            not_live_change(&tls("/a.pem", 3550), &tls("/b.pem", 3550)),
            None,
            "certificate files are live"
        );
        assert_eq!(
            not_live_change(&tls("/a.pem", 3550), &tls("/a.pem", 3551)),
            Some("smpp.tls.listen")
        );
        assert_eq!(not_live_change(&old, &tls("/a.pem", 3550)), Some("smpp.tls.listen"));
        let https = config("[http]\ntls = { cert = \"/c\", key = \"/k\" }\n");
        let http = config("[http]\n");
        assert_eq!(not_live_change(&http, &https), Some("http.tls"));
        let outbox = config("[[outbox.sources]]\nname = \"shop\"\nurl = \"sqlite:///tmp/x.db\"\n");
        assert_eq!(not_live_change(&old, &outbox), Some("outbox"));
    }

    /// A reload swaps `/cgi-bin/sendsms` users like API keys: an added user is taken, a
    /// removed one refused, from the next request.
    #[test]
    fn sendsms_users_are_live() {
        let user = |name: &str| {
            format!("[http]\n[[http.sendsms-users]]\nusername = \"{name}\"\npassword = \"pw\"\naccount = \"a\"\n")
        };
        let (old, new) = (config(&user("tester")), config(&user("other")));
        assert_eq!(not_live_change(&old, &new), None, "sendsms users are live");
        let (creds, max_tps) = http_access(&old, old.http.as_ref().unwrap());
        assert_eq!(creds.sendsms_users.len(), 1);
        let access = HttpAccess::new(creds, max_tps);
        assert!(format!("{access:?}").contains("sendsms_users: 1"));
        let (creds, max_tps) = http_access(&new, new.http.as_ref().unwrap());
        assert_eq!(creds.sendsms_users[0].username, "other");
        access.replace(creds, max_tps);
    }
}
