//! Inbound routing: which application an inbound (MO) message goes to.
//!
//! Rules are `[[mo-routes]]` in file order and the first matching rule wins, as with
//! `[[routes]]`. A rule matches on any of: a prefix of, or a regular expression over,
//! the number the subscriber wrote to (the short code or long number), the provider
//! connection the message came from, and the text's first word (its *keyword*, compared
//! ignoring case). Conditions a rule does not give match everything.
//!
//! A multipart message is routed once it is whole; while its parts arrive, a part is
//! accepted if a rule could still match it ([`MoRouteTable::may_route`]: every
//! condition but the keyword, which only the whole text has).
//!
//! Inbound traffic is a small share of a gateway's messages and rules are few, so the
//! table is a list checked in order; regular expressions are compiled once, when the
//! configuration is loaded or reloaded.

use regex::Regex;

use crate::model::MoRouteConfig;
use crate::routing::normalize_address;

/// Where a matching rule sends an inbound message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoTarget {
    /// `deliver_sm` to a bound receiver or transceiver session of this account.
    Account(String),
    /// An HTTP POST to this URL.
    Url(String),
}

/// A rule that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoRoute {
    /// The rule's name (logs, metrics, `/admin`).
    pub name: String,
    pub target: MoTarget,
}

#[derive(Debug, Clone)]
struct Rule {
    route: MoRoute,
    /// Normalised prefix (see [`normalize_address`]).
    prefix: Option<String>,
    regex: Option<Regex>,
    from_destination: Option<String>,
    /// Lower-cased.
    keyword: Option<String>,
}

/// What an inbound message is routed by.
#[derive(Debug, Clone, Copy)]
pub struct MoMessage<'a> {
    /// The `[[destinations]]` entry it arrived from.
    pub from_destination: &'a str,
    /// The number the subscriber wrote to.
    pub destination: &'a str,
    /// The decoded text (`None` when it is binary and has no words).
    pub text: Option<&'a str>,
}

/// Compiled `[[mo-routes]]`.
#[derive(Debug, Clone, Default)]
pub struct MoRouteTable {
    rules: Vec<Rule>,
}

/// A `[[mo-routes]]` entry whose regular expression does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mo-routes[{index}].destination-regex: {reason}")]
pub struct MoRouteError {
    pub index: usize,
    pub reason: String,
}

/// The text's first word: up to the first whitespace, leading whitespace skipped.
pub fn keyword_of(text: &str) -> Option<&str> {
    text.split_whitespace().next()
}

impl MoRouteTable {
    /// Compiles the rules (normally those of a validated configuration, whose regular
    /// expressions are known to compile).
    pub fn new(routes: &[MoRouteConfig]) -> Result<Self, MoRouteError> {
        let mut rules = Vec::with_capacity(routes.len());
        for (index, r) in routes.iter().enumerate() {
            let regex = match r.destination_regex.as_deref() {
                Some(re) => Some(Regex::new(re).map_err(|e| MoRouteError {
                    index,
                    reason: e.to_string(),
                })?),
                None => None,
            };
            let target = match (&r.to_account, &r.to_url) {
                (Some(account), _) => MoTarget::Account(account.clone()),
                (None, Some(url)) => MoTarget::Url(url.clone()),
                // Validation requires one of them; a rule without either never matches.
                (None, None) => continue,
            };
            rules.push(Rule {
                route: MoRoute {
                    name: r.name.clone(),
                    target,
                },
                prefix: r.destination_prefix.as_deref().map(|p| normalize_address(p).to_owned()),
                regex,
                from_destination: r.from_destination.clone(),
                keyword: r.keyword.as_deref().map(str::to_lowercase),
            });
        }
        Ok(Self { rules })
    }

    /// No rules: every inbound message is unrouted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules' names and targets, in order.
    pub fn routes(&self) -> impl Iterator<Item = &MoRoute> {
        self.rules.iter().map(|r| &r.route)
    }

    /// The first rule matching `m`.
    pub fn route(&self, m: &MoMessage<'_>) -> Option<&MoRoute> {
        let keyword = m.text.and_then(keyword_of);
        self.rules
            .iter()
            .find(|r| r.matches_number(m) && r.matches_keyword(keyword))
            .map(|r| &r.route)
    }

    /// Whether some rule may match the whole message a part of `m` belongs to: every
    /// condition but the keyword matches.
    pub fn may_route(&self, m: &MoMessage<'_>) -> bool {
        self.rules.iter().any(|r| r.matches_number(m))
    }
}

impl Rule {
    fn matches_number(&self, m: &MoMessage<'_>) -> bool {
        if self
            .from_destination
            .as_deref()
            .is_some_and(|d| d != m.from_destination)
        {
            return false;
        }
        if let Some(prefix) = &self.prefix
            && !normalize_address(m.destination).starts_with(prefix.as_str())
        {
            return false;
        }
        if let Some(re) = &self.regex
            && !re.is_match(m.destination)
        {
            return false;
        }
        true
    }

    fn matches_keyword(&self, keyword: Option<&str>) -> bool {
        match (&self.keyword, keyword) {
            (None, _) => true,
            (Some(want), Some(got)) => got.to_lowercase() == *want,
            (Some(_), None) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, f: impl FnOnce(&mut MoRouteConfig)) -> MoRouteConfig {
        let mut r = MoRouteConfig {
            name: name.into(),
            destination_prefix: None,
            destination_regex: None,
            from_destination: None,
            keyword: None,
            to_account: Some(format!("acct-{name}")),
            to_url: None,
        };
        f(&mut r);
        r
    }

    fn msg<'a>(from: &'a str, to: &'a str, text: Option<&'a str>) -> MoMessage<'a> {
        MoMessage {
            from_destination: from,
            destination: to,
            text,
        }
    }

    #[test]
    fn first_match_wins_over_keyword_prefix_regex_and_provider() {
        let table = MoRouteTable::new(&[
            rule("stop", |r| r.keyword = Some("STOP".into())),
            rule("shortcode", |r| r.destination_prefix = Some("+4470".into())),
            rule("regex", |r| r.destination_regex = Some("^8[0-9]{4}$".into())),
            rule("provider", |r| {
                r.from_destination = Some("smsc-b".into());
                r.to_account = None;
                r.to_url = Some("http://127.0.0.1:9/mo".into());
            }),
        ])
        .unwrap();
        let name = |m: MoMessage<'_>| table.route(&m).map(|r| r.name.clone());
        assert_eq!(name(msg("a", "447000", Some("  stop please"))).as_deref(), Some("stop"));
        assert_eq!(name(msg("a", "00447012", Some("hello"))).as_deref(), Some("shortcode"));
        assert_eq!(name(msg("a", "81234", Some("hello"))).as_deref(), Some("regex"));
        assert_eq!(name(msg("a", "812345", None)), None);
        let url = table.route(&msg("smsc-b", "1", None)).unwrap();
        assert_eq!(url.target, MoTarget::Url("http://127.0.0.1:9/mo".into()));
        assert_eq!(name(msg("smsc-a", "1", Some("x"))), None);
    }

    #[test]
    fn parts_are_accepted_when_a_rule_may_match_without_its_keyword() {
        let table = MoRouteTable::new(&[rule("k", |r| {
            r.keyword = Some("join".into());
            r.destination_prefix = Some("55".into());
        })])
        .unwrap();
        assert!(table.may_route(&msg("a", "5512", None)));
        assert!(!table.may_route(&msg("a", "4412", None)));
        assert!(table.route(&msg("a", "5512", Some("JOIN now"))).is_some());
        assert!(table.route(&msg("a", "5512", Some("leave"))).is_none());
    }

    #[test]
    fn a_bad_regex_names_its_rule() {
        let err =
            MoRouteTable::new(&[rule("a", |_| {}), rule("b", |r| r.destination_regex = Some("(".into()))]).unwrap_err();
        assert_eq!(err.index, 1);
        assert!(err.to_string().starts_with("mo-routes[1].destination-regex:"));
    }
}
