//! The one error type of this crate.
//!
//! Configuration errors are read by operators at startup, usually in a
//! container log, so every variant names the full key it is about
//! (`destinations[2].bind`, `routes[0].to[1]`) and, where the key takes one
//! of a fixed set of words, the words it accepts. Errors produced by serde and
//! the `config` crate are translated into these variants by
//! [`crate::load`], so a typo in the file and a failed validation rule read
//! the same way.
//!
//! No variant ever carries a password, API key, token or database URL: a
//! value is only quoted for keys whose values are not secret.

use std::fmt;
use std::path::PathBuf;

use crate::profile::StorageProfile;

/// Why a configuration could not be loaded or was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file could not be read at all.
    #[error("cannot read configuration file {}: {source}", path.display())]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// A `SENDIUM__…` environment variable holds bytes that are not UTF-8.
    #[error("environment variable {name} is not valid UTF-8")]
    Environment {
        /// The variable's name.
        name: String,
    },

    /// The TOML text itself is malformed (the message carries line and column).
    #[error("cannot parse {origin}: {message}")]
    Syntax {
        /// The file path, or `configuration` for text given directly.
        origin: String,
        /// The TOML parser's description of the problem.
        message: String,
    },

    /// A key that Sendium does not know (usually a typo, or a key from a
    /// newer release): refused rather than ignored so a misspelt setting never
    /// silently falls back to its default.
    #[error("unknown key {key}: {}", fmt_allowed(allowed))]
    UnknownKey {
        /// Full path of the unknown key.
        key: String,
        /// The keys accepted at that place.
        allowed: Vec<String>,
    },

    /// A key without a sensible default was left out.
    #[error("missing required key {key}{}", fmt_when(when.as_deref()))]
    MissingKey {
        /// Full path of the missing key.
        key: String,
        /// Why it is required here, when it is only conditionally required.
        when: Option<String>,
    },

    /// A key has a value of the right type that is not acceptable.
    #[error("invalid value {value} for {key}: expected {expected}")]
    InvalidValue {
        /// Full path of the key.
        key: String,
        /// The value as written (strings quoted).
        value: String,
        /// What is accepted, e.g. `one of memory, file, postgresql`.
        expected: String,
    },

    /// A key has a value of the wrong type (a table where a string belongs…).
    #[error("invalid type for {key}: expected {expected}, found {found}")]
    InvalidType {
        /// Full path of the key.
        key: String,
        /// The type accepted.
        expected: String,
        /// The type found.
        found: String,
    },

    /// A value breaks a rule that involves more than its own type, e.g. a
    /// duplicate name or a destination listed both in `to` and `copy-to`.
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// Full path of the key.
        key: String,
        /// The rule that was broken.
        reason: String,
    },

    /// The storage stage backends ask for a combination Sendium does not implement. Refused so the process never runs with weaker guarantees than
    /// the operator asked for.
    #[error(
        "unsupported storage profile {requested} (sms.pending.backend = \"{}\", \
         sms.router-queue.backend = \"{}\", sms.routed-work.backend = \"{}\", \
         dlr.backend = \"{}\"); supported: {}",
        requested.pending, requested.router_queue, requested.routed_work, requested.dlr,
        supported.join(", ")
    )]
    UnsupportedProfile {
        /// What the configuration asked for.
        requested: StorageProfile,
        /// Every accepted combination, rendered like `memory/memory/memory + dlr memory`.
        supported: Vec<String>,
    },

    /// Validation found several problems; all are reported at once so an
    /// operator can fix a file in one pass.
    #[error("{} configuration errors:{}", .0.len(), fmt_list(.0))]
    Multiple(Vec<ConfigError>),

    /// A problem reported by the `config` crate that fits none of the above.
    #[error("invalid configuration: {0}")]
    Other(String),
}

impl ConfigError {
    /// The full key this error is about, if it is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::UnknownKey { key, .. }
            | Self::MissingKey { key, .. }
            | Self::InvalidValue { key, .. }
            | Self::InvalidType { key, .. }
            | Self::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Every individual problem: the members of [`ConfigError::Multiple`], or
    /// this error alone.
    pub fn problems(&self) -> Vec<&ConfigError> {
        match self {
            Self::Multiple(all) => all.iter().flat_map(ConfigError::problems).collect(),
            one => vec![one],
        }
    }

    /// Folds a list of problems into one error: `None` when the list is
    /// empty, the problem itself when there is one, `Multiple` otherwise.
    pub(crate) fn from_problems(mut problems: Vec<ConfigError>) -> Option<ConfigError> {
        match problems.len() {
            0 => None,
            1 => problems.pop(),
            _ => Some(Self::Multiple(problems)),
        }
    }
}

fn fmt_allowed(allowed: &[String]) -> String {
    if allowed.is_empty() {
        "no keys are accepted here".to_owned()
    } else {
        format!("expected one of {}", allowed.join(", "))
    }
}

fn fmt_when(when: Option<&str>) -> String {
    when.map(|w| format!(" ({w})")).unwrap_or_default()
}

fn fmt_list(all: &[ConfigError]) -> String {
    let mut out = String::new();
    for e in all {
        out.push_str("\n  - ");
        out.push_str(&e.to_string());
    }
    out
}

/// Marks a serde error message produced by this crate's own deserializers
/// (enumeration words, durations, socket addresses) so the loader can turn it
/// back into [`ConfigError::InvalidValue`] once `config` has told it the key.
/// `config` only transports custom errors as strings, hence the marker; it
/// never reaches an operator because the loader always translates it.
const VALUE_TAG: char = '\u{1}';

/// Builds the tagged serde error message for a rejected value.
pub(crate) fn value_error_message(value: impl fmt::Display, expected: impl fmt::Display) -> String {
    format!("{VALUE_TAG}{value}{VALUE_TAG}{expected}")
}

/// Splits a message built by [`value_error_message`] into value and expectation.
pub(crate) fn parse_value_error_message(message: &str) -> Option<(&str, &str)> {
    message.strip_prefix(VALUE_TAG)?.split_once(VALUE_TAG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_error_message_round_trips() {
        let m = value_error_message("\"fil\"", "one of memory, file");
        assert_eq!(parse_value_error_message(&m), Some(("\"fil\"", "one of memory, file")));
        assert_eq!(parse_value_error_message("plain text"), None);
    }

    #[test]
    fn multiple_lists_every_problem() {
        let e = ConfigError::from_problems(vec![
            ConfigError::Invalid {
                key: "a".into(),
                reason: "x".into(),
            },
            ConfigError::MissingKey {
                key: "b".into(),
                when: Some("because".into()),
            },
        ])
        .unwrap();
        assert_eq!(
            e.to_string(),
            "2 configuration errors:\n  - invalid a: x\n  - missing required key b (because)"
        );
        assert_eq!(e.problems().len(), 2);
        assert_eq!(e.problems()[1].key(), Some("b"));
    }

    #[test]
    fn single_problem_is_not_wrapped() {
        let e = ConfigError::from_problems(vec![ConfigError::Other("x".into())]).unwrap();
        assert!(matches!(e, ConfigError::Other(_)));
        assert!(ConfigError::from_problems(vec![]).is_none());
    }
}
