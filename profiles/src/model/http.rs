//! The words and helpers of `kind = "http"` destinations: providers reached through an
//! HTTP API instead of SMPP. The keys themselves live on [`super::DestinationConfig`]
//! (one table per destination, whatever its kind); [`crate::validate`] refuses the HTTP
//! keys on other kinds and checks templates and JSON pointers here.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::error::value_error_message;

word_enum! {
    /// The HTTP method of a submission.
    #[derive(Default)]
    pub enum HttpMethod {
        /// Fields in the body (`body` says how).
        #[default]
        Post => "POST",
        /// Fields in the query string.
        Get => "GET",
    }
}

word_enum! {
    /// How a POST carries the fields.
    #[derive(Default)]
    pub enum HttpBody {
        /// A JSON object of strings.
        #[default]
        Json => "json",
        /// `application/x-www-form-urlencoded`.
        Form => "form",
    }
}

word_enum! {
    /// What one request carries of a long message.
    #[derive(Default)]
    pub enum HttpParts {
        /// One request with the whole text (the provider splits it).
        #[default]
        Whole => "whole",
        /// One request per SMS part, as for SMPP.
        Split => "split",
    }
}

word_enum! {
    /// How a provider proves a receipt it posts back is its own.
    #[derive(Default)]
    pub enum ReceiptSignature {
        /// `X-Sendium-Receipt-Token` carries `receipt-secret` itself.
        #[default]
        Token => "token",
        /// `X-Sendium-Signature: sha256=<hex>`, HMAC-SHA256 of the raw body keyed by
        /// `receipt-secret`.
        HmacSha256 => "hmac-sha256",
    }
}

word_enum! {
    /// The receipt state a provider's status word stands for (SMPP's `stat:` words).
    pub enum ReceiptState {
        /// Delivered.
        Delivrd => "DELIVRD",
        /// Undeliverable.
        Undeliv => "UNDELIV",
        /// Validity ran out.
        Expired => "EXPIRED",
        /// Refused.
        Rejectd => "REJECTD",
        /// Deleted.
        Deleted => "DELETED",
        /// Unknown final state.
        Unknown => "UNKNOWN",
        /// Intermediate: accepted, not final (acknowledged, not recorded).
        Acceptd => "ACCEPTD",
        /// Intermediate: on its way (acknowledged, not recorded).
        Enroute => "ENROUTE",
    }
}

impl ReceiptState {
    /// Whether the state ends the message (an intermediate one is acknowledged and
    /// dropped, like an SMPP intermediate receipt).
    pub const fn is_final(self) -> bool {
        !matches!(self, Self::Acceptd | Self::Enroute)
    }
}

/// Placeholders a `fields` template may use.
pub const PLACEHOLDERS: &[&str] = &["from", "to", "text", "coding", "id", "callback", "deliver_at"];

/// The fields sent when a destination lists none.
pub fn default_fields() -> Vec<(String, String)> {
    ["from", "to", "text"]
        .iter()
        .map(|f| ((*f).to_owned(), format!("{{{f}}}")))
        .collect()
}

/// One piece of a parsed `fields` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePiece {
    /// Text copied as it is.
    Literal(String),
    /// A placeholder's name (one of [`PLACEHOLDERS`]).
    Placeholder(&'static str),
}

/// Why a template was refused: the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

/// Parses a template: `{name}` is a placeholder, `{{` and `}}` are literal braces.
pub fn parse_template(template: &str) -> Result<Vec<TemplatePiece>, TemplateError> {
    let mut out = Vec::new();
    let mut lit = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                lit.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                lit.push('}');
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let Some(p) = PLACEHOLDERS.iter().find(|p| **p == name) else {
                    return Err(TemplateError(format!("{{{name}}}")));
                };
                if !lit.is_empty() {
                    out.push(TemplatePiece::Literal(std::mem::take(&mut lit)));
                }
                out.push(TemplatePiece::Placeholder(p));
            }
            '}' => return Err(TemplateError("}".to_owned())),
            c => lit.push(c),
        }
    }
    if !lit.is_empty() {
        out.push(TemplatePiece::Literal(lit));
    }
    Ok(out)
}

/// Whether `pointer` is an RFC 6901 JSON pointer: empty, or `/`-separated tokens in
/// which `~` is followed only by `0` or `1`.
pub fn is_json_pointer(pointer: &str) -> bool {
    if pointer.is_empty() {
        return true;
    }
    if !pointer.starts_with('/') {
        return false;
    }
    let b = pointer.as_bytes();
    b.iter()
        .enumerate()
        .all(|(i, &c)| c != b'~' || matches!(b.get(i + 1), Some(b'0' | b'1')))
}

/// Replaces every `${NAME}` in `value` with the variable's value from `lookup`.
/// Returns the name of the first variable that is not set.
pub fn expand_env(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        match lookup(name) {
            Some(v) => out.push_str(&v),
            None => return Err(name.to_owned()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_placeholders_and_braces() {
        assert_eq!(
            parse_template("to={to} {{x}}").unwrap(),
            vec![
                TemplatePiece::Literal("to=".into()),
                TemplatePiece::Placeholder("to"),
                TemplatePiece::Literal(" {x}".into()),
            ]
        );
        assert_eq!(parse_template("{nope}").unwrap_err().0, "{nope}");
        assert_eq!(parse_template("a}b").unwrap_err().0, "}");
        assert!(parse_template("").unwrap().is_empty());
    }

    #[test]
    fn json_pointers() {
        assert!(is_json_pointer(""));
        assert!(is_json_pointer("/messages/0/id"));
        assert!(is_json_pointer("/a~1b/c~0"));
        assert!(!is_json_pointer("id"));
        assert!(!is_json_pointer("/a~2"));
        assert!(!is_json_pointer("/a~"));
    }

    #[test]
    fn env_references_expand() {
        let lookup = |n: &str| (n == "KEY").then(|| "k1".to_owned());
        assert_eq!(expand_env("Bearer ${KEY}", &lookup).unwrap(), "Bearer k1");
        assert_eq!(expand_env("plain", &lookup).unwrap(), "plain");
        assert_eq!(expand_env("${MISSING}", &lookup).unwrap_err(), "MISSING");
    }

    #[test]
    fn receipt_states() {
        assert_eq!(ReceiptState::from_word("delivrd"), Some(ReceiptState::Delivrd));
        assert!(!ReceiptState::Enroute.is_final());
        assert!(ReceiptState::Undeliv.is_final());
    }
}
