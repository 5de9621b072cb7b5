//! The routing table: which destinations a message goes to.
//!
//! Rules are `[[routes]]` in file order and the first matching rule wins,
//! because that is what operators read top to bottom. A rule matches on the
//! submitting account (`*` = any) and on a prefix of the destination address.
//! Addresses arrive as `+447700900123`, `00447700900123` or `447700900123`
//! for the same number, so a leading `+` and then a leading `00` are ignored
//! on both the address and the configured prefix (the address itself is not
//! rewritten; this is for matching only).
//!
//! A rule may also match on the sender (`source-prefix`, `source-regex`), on the
//! whole destination address (`destination-regex`) and on the text (`text-regex`,
//! read only when some rule has one; bodies are never logged). Regular expressions
//! are compiled once, when the configuration is loaded or reloaded.
//!
//! `resolve` runs for every message, so the table is compiled once: prefixes
//! go into a byte trie whose nodes list the rules ending there in file order.
//! A lookup walks the address once — cost proportional to the address length
//! plus the few rules sharing a prefix, not to the number of rules — and
//! allocates nothing.

use regex::Regex;

use crate::model::{Config, RouteConfig};

/// What a message is routed by.
#[derive(Debug, Clone, Copy)]
pub struct RouteQuery<'a> {
    /// The submitting account's system-id.
    pub account: &'a str,
    /// The sender address as submitted.
    pub source: &'a str,
    /// The destination address as submitted.
    pub destination: &'a str,
    /// The decoded text; needed only when [`RouteTable::needs_text`] (`None` for
    /// binary data, which no `text-regex` matches).
    pub text: Option<&'a str>,
}

impl<'a> RouteQuery<'a> {
    /// A query by account and destination only (no sender, no text).
    pub fn new(account: &'a str, destination: &'a str) -> Self {
        Self {
            account,
            source: "",
            destination,
            text: None,
        }
    }
}

/// A rule's conditions beyond its account and destination prefix.
#[derive(Debug, Clone, Default)]
struct Conditions {
    /// Normalised like addresses (see [`normalize_address`]).
    source_prefix: Option<String>,
    source_regex: Option<Regex>,
    destination_regex: Option<Regex>,
    text_regex: Option<Regex>,
    /// A regular expression did not compile (a configuration that skipped validation):
    /// the rule never matches.
    broken: bool,
}

impl Conditions {
    fn of(rc: &RouteConfig) -> Self {
        let mut broken = false;
        let mut compile = |re: &Option<String>| match re.as_deref().map(Regex::new) {
            Some(Ok(re)) => Some(re),
            Some(Err(_)) => {
                broken = true;
                None
            }
            None => None,
        };
        let source_regex = compile(&rc.source_regex);
        let destination_regex = compile(&rc.destination_regex);
        let text_regex = compile(&rc.text_regex);
        Conditions {
            source_prefix: (!rc.source_prefix.is_empty()).then(|| normalize_address(&rc.source_prefix).to_owned()),
            source_regex,
            destination_regex,
            text_regex,
            broken,
        }
    }

    fn hold(&self, q: &RouteQuery<'_>) -> bool {
        if self.broken {
            return false;
        }
        if let Some(p) = &self.source_prefix
            && !normalize_address(q.source).starts_with(p.as_str())
        {
            return false;
        }
        if self.source_regex.as_ref().is_some_and(|re| !re.is_match(q.source)) {
            return false;
        }
        if self
            .destination_regex
            .as_ref()
            .is_some_and(|re| !re.is_match(q.destination))
        {
            return false;
        }
        match &self.text_regex {
            Some(re) => q.text.is_some_and(|t| re.is_match(t)),
            None => true,
        }
    }
}

/// What a matching rule sends a message to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The rule's name (for logs and metrics).
    pub name: String,
    /// Destinations in failover order: the first reachable one is used.
    pub to: Vec<String>,
    /// Additional destinations, each an independent branch.
    pub copy_to: Vec<String>,
    /// `priority`: higher goes first out of a destination's queue.
    pub priority: u8,
}

/// One trie node: children keyed by the next address byte, and the indices of
/// the rules whose normalized prefix ends exactly here (ascending = file order).
#[derive(Debug, Clone, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    rules: Vec<u32>,
}

impl Node {
    fn child(&self, byte: u8) -> Option<u32> {
        // At most ten children for digit prefixes: a linear scan beats hashing.
        self.children.iter().find(|(b, _)| *b == byte).map(|&(_, idx)| idx)
    }
}

/// Compiled `[[routes]]`.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: Vec<Route>,
    /// Per rule: `None` for `*`, else the one account it applies to.
    accounts: Vec<Option<Box<str>>>,
    /// Per rule: its other conditions.
    conditions: Vec<Conditions>,
    /// Some rule has a `text-regex`.
    needs_text: bool,
    /// Node 0 is the root (the empty prefix).
    nodes: Vec<Node>,
}

/// Strips a leading `+`, then a leading `00` (international call prefix).
pub fn normalize_address(addr: &str) -> &str {
    let addr = addr.strip_prefix('+').unwrap_or(addr);
    addr.strip_prefix("00").unwrap_or(addr)
}

impl RouteTable {
    /// Compiles routes (normally those of a validated [`Config`]).
    /// Never fails: an invalid rule can at worst never match.
    pub fn new(routes: &[RouteConfig]) -> Self {
        let mut table = RouteTable {
            routes: Vec::with_capacity(routes.len()),
            accounts: Vec::with_capacity(routes.len()),
            conditions: Vec::with_capacity(routes.len()),
            needs_text: routes.iter().any(|r| r.text_regex.is_some()),
            nodes: vec![Node::default()],
        };
        for (idx, rc) in routes.iter().enumerate() {
            // Rule counts are far below u32::MAX; saturate rather than panic.
            let rule = u32::try_from(idx).unwrap_or(u32::MAX);
            table.routes.push(Route {
                name: rc.name.clone(),
                to: rc.to.clone(),
                copy_to: rc.copy_to.clone(),
                priority: rc.priority,
            });
            table.conditions.push(Conditions::of(rc));
            table.accounts.push(if rc.account == "*" {
                None
            } else {
                Some(rc.account.as_str().into())
            });
            let node = table.insert_prefix(normalize_address(&rc.destination_prefix));
            if let Some(n) = table.nodes.get_mut(node) {
                n.rules.push(rule);
            }
        }
        table
    }

    /// Compiles the routes of a configuration.
    pub fn from_config(cfg: &Config) -> Self {
        Self::new(&cfg.routes)
    }

    fn insert_prefix(&mut self, prefix: &str) -> usize {
        let mut node = 0usize;
        for &byte in prefix.as_bytes() {
            let existing = self.nodes.get(node).and_then(|n| n.child(byte));
            node = match existing {
                Some(next) => next as usize,
                None => {
                    let next = self.nodes.len();
                    self.nodes.push(Node::default());
                    if let Some(n) = self.nodes.get_mut(node) {
                        n.children.push((byte, u32::try_from(next).unwrap_or(u32::MAX)));
                    }
                    next
                }
            };
        }
        node
    }

    /// Whether some rule matches on the text: callers decode it only then.
    pub fn needs_text(&self) -> bool {
        self.needs_text
    }

    /// The first rule, in file order, whose conditions all hold.
    pub fn resolve(&self, q: &RouteQuery<'_>) -> Option<&Route> {
        let account = q.account;
        let addr = normalize_address(q.destination).as_bytes();
        let mut best: Option<u32> = None;
        let mut node = self.nodes.first();
        let mut depth = 0usize;
        while let Some(n) = node {
            for &rule in &n.rules {
                if best.is_some_and(|b| rule >= b) {
                    break;
                }
                let account_ok = match self.accounts.get(rule as usize) {
                    Some(None) => true,
                    Some(Some(only)) => **only == *account,
                    None => false,
                };
                let applies = account_ok && self.conditions.get(rule as usize).is_some_and(|c| c.hold(q));
                if applies {
                    best = Some(rule);
                    break;
                }
            }
            if best == Some(0) {
                break;
            }
            node = addr
                .get(depth)
                .and_then(|&byte| n.child(byte))
                .and_then(|next| self.nodes.get(next as usize));
            depth += 1;
        }
        best.and_then(|rule| self.routes.get(rule as usize))
    }

    /// Every rule, in file order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no rules (every message is unroutable).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(name: &str, account: &str, prefix: &str, to: &[&str]) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            account: account.into(),
            destination_prefix: prefix.into(),
            to: to.iter().map(|s| (*s).to_owned()).collect(),
            copy_to: vec![],
            destination_regex: None,
            source_prefix: String::new(),
            source_regex: None,
            text_regex: None,
            priority: 0,
        }
    }

    #[test]
    fn a_resolved_route_carries_its_priority() {
        let plain = RouteTable::new(&[rc("bulk", "*", "", &["a"])]);
        assert_eq!(plain.resolve(&RouteQuery::new("x", "447")).map(|r| r.priority), Some(0));
        let mut otp = rc("otp", "*", "44", &["a"]);
        otp.priority = 9;
        let t = RouteTable::new(&[otp, rc("bulk", "*", "", &["a"])]);
        assert_eq!(t.resolve(&RouteQuery::new("x", "447")).map(|r| r.priority), Some(9));
        assert_eq!(t.resolve(&RouteQuery::new("x", "33")).map(|r| r.priority), Some(0));
    }

    fn name<'a>(t: &'a RouteTable, account: &str, addr: &str) -> Option<&'a str> {
        t.resolve(&RouteQuery::new(account, addr)).map(|r| r.name.as_str())
    }

    #[test]
    fn rules_match_on_sender_destination_regex_and_text() {
        let with = |name: &str, f: &dyn Fn(&mut RouteConfig)| {
            let mut r = rc(name, "*", "", &["a"]);
            f(&mut r);
            r
        };
        let t = RouteTable::new(&[
            with("otp", &|r| r.text_regex = Some(r"(?i)\bcode\b".into())),
            with("bank", &|r| r.source_prefix = "BANK".into()),
            with("short", &|r| r.source_regex = Some(r"^[0-9]{5}$".into())),
            with("fr", &|r| r.destination_regex = Some(r"^\+?33[67]".into())),
            with("rest", &|_| {}),
        ]);
        assert!(t.needs_text());
        let q = |source: &'static str, destination: &'static str, text: Option<&'static str>| RouteQuery {
            account: "esme1",
            source,
            destination,
            text,
        };
        let name = |q: RouteQuery<'_>| t.resolve(&q).map(|r| r.name.clone());
        assert_eq!(
            name(q("Shop", "447700900123", Some("your CODE is 1234"))).as_deref(),
            Some("otp")
        );
        assert_eq!(
            name(q("BANKXYZ", "447700900123", Some("hello"))).as_deref(),
            Some("bank")
        );
        assert_eq!(name(q("12345", "447700900123", None)).as_deref(), Some("short"));
        assert_eq!(name(q("Shop", "+33612345678", None)).as_deref(), Some("fr"));
        assert_eq!(name(q("Shop", "33512345678", Some("codes"))).as_deref(), Some("rest"));
        // A rule whose expression does not compile never matches.
        let broken = RouteTable::new(&[with("bad", &|r| r.text_regex = Some("(".into())), with("ok", &|_| {})]);
        assert_eq!(
            broken.resolve(&q("a", "1", Some("("))).map(|r| r.name.as_str()),
            Some("ok")
        );
        assert!(!RouteTable::new(&[with("x", &|_| {})]).needs_text());
    }

    #[test]
    fn first_match_wins_in_file_order() {
        let t = RouteTable::new(&[rc("all", "*", "", &["a"]), rc("uk", "*", "44", &["b"])]);
        assert_eq!(name(&t, "x", "447700900123"), Some("all"));

        let t = RouteTable::new(&[
            rc("uk-mobile", "*", "447", &["b"]),
            rc("uk", "*", "44", &["c"]),
            rc("all", "*", "", &["a"]),
        ]);
        assert_eq!(name(&t, "x", "447700900123"), Some("uk-mobile"));
        assert_eq!(name(&t, "x", "441632960000"), Some("uk"));
        assert_eq!(name(&t, "x", "33612345678"), Some("all"));
        // A later, longer prefix does not beat an earlier shorter one.
        let t = RouteTable::new(&[rc("uk", "*", "44", &["c"]), rc("uk-mobile", "*", "447", &["b"])]);
        assert_eq!(name(&t, "x", "447700900123"), Some("uk"));
    }

    #[test]
    fn account_specific_route_before_wildcard() {
        let t = RouteTable::new(&[
            rc("esme1-uk", "esme1", "44", &["premium"]),
            rc("uk", "*", "44", &["cheap"]),
        ]);
        let r = t.resolve(&RouteQuery::new("esme1", "447700900123")).unwrap();
        assert_eq!(r.name, "esme1-uk");
        assert_eq!(r.to, vec!["premium".to_owned()]);
        assert_eq!(name(&t, "esme2", "447700900123"), Some("uk"));
        // An account rule placed after the wildcard is shadowed by it.
        let t = RouteTable::new(&[
            rc("uk", "*", "44", &["cheap"]),
            rc("esme1-uk", "esme1", "44", &["premium"]),
        ]);
        assert_eq!(name(&t, "esme1", "447700900123"), Some("uk"));
    }

    #[test]
    fn prefix_ignores_plus_and_double_zero() {
        let t = RouteTable::new(&[
            rc("uk", "*", "+44", &["b"]),
            rc("fr", "*", "0033", &["c"]),
            rc("national", "*", "0", &["d"]),
        ]);
        for addr in ["+447700900123", "00447700900123", "447700900123"] {
            assert_eq!(name(&t, "x", addr), Some("uk"), "{addr}");
        }
        for addr in ["+33612345678", "0033612345678", "33612345678", "+0033612345678"] {
            assert_eq!(name(&t, "x", addr), Some("fr"), "{addr}");
        }
        assert_eq!(name(&t, "x", "07700900123"), Some("national"));
        assert_eq!(normalize_address("+00447"), "447");
        assert_eq!(normalize_address("0447"), "0447");
    }

    #[test]
    fn no_match_is_none() {
        let t = RouteTable::new(&[rc("uk", "*", "44", &["b"]), rc("esme1", "esme1", "", &["c"])]);
        assert_eq!(name(&t, "esme2", "33612345678"), None);
        assert_eq!(name(&t, "esme2", ""), None);
        assert_eq!(name(&t, "esme2", "4"), None);
        assert!(RouteTable::new(&[]).resolve(&RouteQuery::new("a", "1")).is_none());
        assert!(RouteTable::new(&[]).is_empty());
    }

    #[test]
    fn empty_prefix_matches_every_number() {
        let t = RouteTable::new(&[rc("all", "*", "", &["a"])]);
        assert_eq!(name(&t, "x", ""), Some("all"));
        assert_eq!(name(&t, "x", "+1"), Some("all"));
        assert_eq!(t.len(), 1);
    }

    /// Cross-checks the trie against the obvious linear scan on many tables.
    #[test]
    fn trie_agrees_with_linear_scan() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let digits = |len: u64, next: &mut dyn FnMut(u64) -> u64| -> String {
            (0..len).map(|_| char::from(b'0' + next(4) as u8)).collect()
        };
        let accounts = ["*", "a", "b"];
        for _ in 0..200 {
            let mut routes = Vec::new();
            for i in 0..next(12) {
                let len = next(4);
                let mut prefix = digits(len, &mut next);
                if next(4) == 0 {
                    prefix.insert(0, '+');
                }
                let account = accounts[next(3) as usize];
                routes.push(rc(&format!("r{i}"), account, &prefix, &["d"]));
            }
            let table = RouteTable::new(&routes);
            for _ in 0..50 {
                let len = next(6);
                let addr = digits(len, &mut next);
                let account = ["a", "b", "c"][next(3) as usize];
                let expected = routes.iter().find(|r| {
                    (r.account == "*" || r.account == account)
                        && normalize_address(&addr).starts_with(normalize_address(&r.destination_prefix))
                });
                assert_eq!(
                    table.resolve(&RouteQuery::new(account, &addr)).map(|r| r.name.as_str()),
                    expected.map(|r| r.name.as_str()),
                    "{routes:?} {account} {addr}"
                );
            }
        }
    }
}
