//! Where HTTP receipt callbacks may go.
//!
//! A `callback_url` is the API client's choice, and Sendium makes the request from
//! inside the operator's network: unchecked, any client could make the gateway call
//! cloud metadata (`169.254.169.254`), admin ports on loopback or private services. By
//! default a callback may not reach a loopback, link-local, private, shared (CGNAT),
//! unspecified, broadcast or multicast address (IPv6 alike: `::1`, `fe80::/10`,
//! `fc00::/7`, `::`, IPv4-mapped forms of the IPv4 ones); `[http] callback-allow` lists
//! networks that may be reached all the same.
//!
//! Checked twice: at submission, when the URL's host is an address (in any form the URL
//! standard reads as one, such as `http://2130706433/`) or `localhost` (400 naming
//! `callback_url`); and when connecting, after name resolution, so a name that resolves
//! to a forbidden address is caught too (the delivery's resolver drops those addresses).
//! Redirects are not followed.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::Mutex;

/// The networks callbacks may reach beyond the public internet.
#[derive(Clone, Debug, Default)]
pub struct CallbackTargets {
    allow: Vec<IpNet>,
    /// URLs [`CallbackTargets::check`] permitted lately. An API client sends the same
    /// few callback URLs with every message, and parsing one by the URL standard (its
    /// host's IDNA mapping included) costs more than the rest of reading the request's
    /// fields. The verdict depends only on the URL and `allow`, which never changes, so
    /// a remembered one stays right; a clone shares them. At most [`PERMITTED_URLS`],
    /// forgotten together when full.
    permitted: Arc<Mutex<HashSet<Box<str>>>>,
}

/// Callback URLs [`CallbackTargets`] remembers as permitted.
const PERMITTED_URLS: usize = 1024;

impl PartialEq for CallbackTargets {
    fn eq(&self, other: &Self) -> bool {
        self.allow == other.allow
    }
}

impl Eq for CallbackTargets {}

/// Why a callback URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackUrlError {
    #[error("must be an http:// or https:// URL")]
    NotHttp,
    #[error("must not point at a loopback, link-local, private or unspecified address (see [http] callback-allow)")]
    Forbidden,
}

impl CallbackTargets {
    pub fn new(allow: Vec<IpNet>) -> Self {
        CallbackTargets {
            allow,
            permitted: Arc::default(),
        }
    }

    /// Every address permitted: for URLs the operator configured (inbound message
    /// targets), which are trusted as the configuration is.
    pub fn anywhere() -> Self {
        let all = ["0.0.0.0/0", "::/0"].iter().filter_map(|n| n.parse().ok()).collect();
        CallbackTargets::new(all)
    }

    /// Whether a callback may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.allow.iter().any(|net| net.contains(&ip)) || !internal(ip)
    }

    /// [`CallbackTargets::check_url`] without the parsed URL, answered from the URLs
    /// permitted lately when it is one of them.
    pub fn check(&self, raw: &str) -> Result<(), CallbackUrlError> {
        if self.permitted.lock().contains(raw) {
            return Ok(());
        }
        self.check_url(raw)?;
        let mut permitted = self.permitted.lock();
        if permitted.len() >= PERMITTED_URLS {
            permitted.clear();
        }
        permitted.insert(raw.into());
        Ok(())
    }

    /// Check a callback URL as submitted (see the module docs).
    pub fn check_url(&self, raw: &str) -> Result<url::Url, CallbackUrlError> {
        let url = url::Url::parse(raw).map_err(|_| CallbackUrlError::NotHttp)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(CallbackUrlError::NotHttp);
        }
        match url.host() {
            None => Err(CallbackUrlError::NotHttp),
            Some(url::Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)).map(|()| url),
            Some(url::Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)).map(|()| url),
            Some(url::Host::Domain(name)) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                if name == "localhost" || name.ends_with(".localhost") {
                    self.check_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)).map(|()| url)
                } else {
                    Ok(url)
                }
            }
        }
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), CallbackUrlError> {
        if self.permits(ip) {
            Ok(())
        } else {
            Err(CallbackUrlError::Forbidden)
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An address inside some network rather than on the public internet.
fn internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        // 0.0.0.0/8 ("this network") and 100.64.0.0/10 (shared, carrier-grade NAT).
        || a == 0
        || (a == 100 && (64..128).contains(&b))
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local (deprecated).
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused_by_default_and_public_ones_pass() {
        let t = CallbackTargets::default();
        for bad in [
            "http://169.254.169.254/latest",
            "http://127.0.0.1:9090/admin",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://10.1.2.3/cb",
            "http://172.16.0.1/cb",
            "http://192.168.1.1/cb",
            "http://100.64.0.1/cb",
            "http://0.0.0.0:8080/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://localhost:8080/",
            "http://api.localhost/",
            "https://LOCALHOST./x",
        ] {
            assert_eq!(t.check_url(bad), Err(CallbackUrlError::Forbidden), "{bad}");
        }
        for good in [
            "https://example.com/receipts",
            "http://203.0.113.7:8080/cb",
            "http://[2001:db8::1]/cb",
        ] {
            assert!(t.check_url(good).is_ok(), "{good}");
        }
        for not_http in [
            "ftp://example.com/",
            "file:///etc/passwd",
            "http://",
            "example.com/x",
            "http//x",
        ] {
            assert_eq!(t.check_url(not_http), Err(CallbackUrlError::NotHttp), "{not_http}");
        }
    }

    #[test]
    fn callback_allow_opens_the_listed_networks_only() {
        let t = CallbackTargets::new(vec!["10.1.0.0/16".parse().unwrap(), "::1/128".parse().unwrap()]);
        assert!(t.check_url("http://10.1.2.3/cb").is_ok());
        assert!(t.check_url("http://[::1]:8080/cb").is_ok());
        assert_eq!(t.check_url("http://10.2.0.1/cb"), Err(CallbackUrlError::Forbidden));
        assert_eq!(t.check_url("http://127.0.0.1/cb"), Err(CallbackUrlError::Forbidden));
        assert!(t.permits("10.1.255.255".parse().unwrap()));
        assert!(!t.permits("::ffff:10.2.0.1".parse().unwrap()));
    }

    #[test]
    fn remembered_verdicts_are_those_of_a_fresh_check() {
        let t = CallbackTargets::new(vec!["10.1.0.0/16".parse().unwrap()]);
        let urls = [
            "https://example.com/receipts",
            "http://10.1.2.3/cb",
            "http://10.2.0.1/cb",
            "http://localhost:8080/",
            "ftp://example.com/",
        ];
        // Twice: the second round answers the permitted ones from memory, and a refused
        // URL is refused again rather than remembered.
        for _ in 0..2 {
            for url in urls {
                assert_eq!(t.check(url), t.check_url(url).map(drop), "{url}");
            }
        }
        // More URLs than are remembered: the memory starts over, verdicts stay right.
        for n in 0..(PERMITTED_URLS + 10) {
            assert_eq!(t.check(&format!("https://example.com/{n}")), Ok(()));
        }
        assert!(t.permitted.lock().len() <= PERMITTED_URLS);
        assert_eq!(t.check("http://127.0.0.1/cb"), Err(CallbackUrlError::Forbidden));
        // A clone with the same networks shares the memory; equality ignores it.
        assert_eq!(t.clone(), CallbackTargets::new(vec!["10.1.0.0/16".parse().unwrap()]));
    }
}
