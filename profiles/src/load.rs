//! Loading: one TOML file, overridden by `SENDIUM__…` environment variables,
//! then validated.
//!
//! Environment keys follow the file's structure with `__` between levels:
//! `SENDIUM__SMS__ROUTER_QUEUE__BACKEND` sets `[sms.router-queue] backend`.
//! The `config` crate's `convert_case(Case::Kebab)` is what turns
//! `ROUTER_QUEUE` into `router-queue`; without it the variable would create a
//! separate `router_queue` key and leave the real one unchanged (NOTES.md).
//! Here an unknown key fails loading, so that mistake could not go unnoticed
//! either way.
//!
//! The environment is passed in as a list of pairs ([`load_with_env`]) so
//! tests never mutate the process environment; [`load`] passes the real one.
//!
//! Errors from serde and `config` arrive as strings with a key path glued
//! on; [`translate`] turns them into the same [`ConfigError`] variants that
//! validation uses, so every message names the full key.

use std::collections::HashMap;
use std::path::Path;

use config::{Case, Environment, File, FileFormat};

use crate::error::{ConfigError, parse_value_error_message};
use crate::model::http::expand_env;
use crate::model::{Config, Secret};
use crate::validate::validate;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "SENDIUM";
/// Separator between the prefix and the key, and between key levels.
pub const ENV_SEPARATOR: &str = "__";

/// The embedded default configuration (`sendium serve` without a file): all
/// in memory, one simulated provider, loopback listeners, demo credentials.
pub const QUICKSTART: &str = r#"# Sendium quickstart: nothing is durable, every message goes to the built-in simulator.
[sms.pending]
backend = "memory"
[sms.router-queue]
backend = "memory"
[sms.routed-work]
backend = "memory"

[dlr]
backend = "memory"

[smpp]
listen = "127.0.0.1:2775"
[[smpp.accounts]]
system-id = "demo"
password = "demo"

[http]
listen = "127.0.0.1:8080"
# Receipt callbacks may go to this machine (by default loopback and private addresses
# are refused).
callback-allow = ["127.0.0.0/8", "::1/128"]
[[http.api-keys]]
key = "demo-key"
account = "demo"

[admin]
listen = "127.0.0.1:9090"

[[destinations]]
name = "simulator"
kind = "simulator"
dlr-delay-ms = 100

[[routes]]
name = "default"
to = ["simulator"]
"#;

/// Loads a file, applies `SENDIUM__…` variables from the process
/// environment, and validates.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with_env(Some(path), process_env()?)
}

/// Parses and validates TOML text without consulting the environment (tests,
/// [`QUICKSTART`]).
pub fn load_str(toml: &str) -> Result<Config, ConfigError> {
    build(Some(("configuration", toml)), None)
}

/// Loads an optional file (defaults only when `None`), applies the given
/// environment pairs (only `SENDIUM__…` names are used), and validates.
pub fn load_with_env(
    toml_source: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Config, ConfigError> {
    let text = match toml_source {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?),
        None => None,
    };
    let origin = toml_source.map(|p| p.display().to_string());
    let file = origin.as_deref().zip(text.as_deref());
    build(file, Some(env.into_iter().collect()))
}

/// Parses TOML text, applies the given environment pairs, and validates
/// (e.g. [`QUICKSTART`] adjusted by the environment).
pub fn load_str_with_env(toml: &str, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
    build(Some(("configuration", toml)), Some(env.into_iter().collect()))
}

/// The process's `SENDIUM__…` variables. Others are skipped, so an unrelated
/// non-UTF-8 variable cannot break startup; one of ours that is not UTF-8 is
/// an error rather than silently ignored.
fn process_env() -> Result<Vec<(String, String)>, ConfigError> {
    let wanted = format!("{ENV_PREFIX}{ENV_SEPARATOR}").to_ascii_lowercase();
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Ok(name) = name.into_string() else { continue };
        if !name.to_ascii_lowercase().starts_with(&wanted) {
            continue;
        }
        match value.into_string() {
            Ok(value) => out.push((name, value)),
            Err(_) => return Err(ConfigError::Environment { name }),
        }
    }
    Ok(out)
}

/// Replaces `${NAME}` in HTTP destination headers and receipt secrets with the
/// environment variable's value, so an API key need not be written in the file. The
/// given pairs are consulted first (tests pass them without touching the process
/// environment), then the process environment.
fn expand_destination_secrets(cfg: &mut Config, env: Option<&HashMap<String, String>>) -> Result<(), ConfigError> {
    let lookup = |name: &str| {
        env.and_then(|e| e.get(name).cloned())
            .or_else(|| std::env::var(name).ok())
    };
    let missing = |key: String, name: String| ConfigError::Invalid {
        key,
        reason: format!("environment variable {name} is not set"),
    };
    for (i, d) in cfg.destinations.iter_mut().enumerate() {
        for (h, v) in d.headers.iter_mut() {
            let expanded =
                expand_env(v.expose(), &lookup).map_err(|n| missing(format!("destinations[{i}].headers.{h}"), n))?;
            *v = Secret::new(expanded);
        }
        let expanded = expand_env(d.receipt_key.expose(), &lookup)
            .map_err(|n| missing(format!("destinations[{i}].receipt-secret"), n))?;
        d.receipt_key = Secret::new(expanded);
    }
    Ok(())
}

fn build(file: Option<(&str, &str)>, env: Option<HashMap<String, String>>) -> Result<Config, ConfigError> {
    let origin = file.map_or("configuration", |(o, _)| o).to_owned();
    let mut builder = config::Config::builder();
    if let Some((_, text)) = file {
        builder = builder.add_source(File::from_str(text, FileFormat::Toml));
    }
    if let Some(vars) = env.clone() {
        builder = builder.add_source(
            Environment::with_prefix(ENV_PREFIX)
                .prefix_separator(ENV_SEPARATOR)
                .separator(ENV_SEPARATOR)
                .convert_case(Case::Kebab)
                .source(Some(vars)),
        );
    }
    let cfg: Config = builder
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|e| translate(e, &origin))?;
    let mut cfg = cfg;
    expand_destination_secrets(&mut cfg, env.as_ref())?;
    validate(&cfg)?;
    Ok(cfg)
}

/// The TOML parser's message without the excerpt of the file it quotes.
///
/// The parser shows the offending line (`3 | password = "s3cr…`) under a caret; on a
/// line holding a password, API key or database URL that excerpt would carry the secret
/// into the startup error and into the log of a refused reload. Line and column, and what
/// was wrong, are kept: "TOML parse error at line 3, column 19: invalid basic string".
fn without_quoted_source(message: &str) -> String {
    let is_excerpt = |line: &str| {
        let rest = line.trim_start().trim_start_matches(|c: char| c.is_ascii_digit());
        rest.trim_start().starts_with('|')
    };
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !is_excerpt(line))
        .collect::<Vec<_>>()
        .join(": ")
}

/// Turns a `config` error into a [`ConfigError`] that names the full key.
fn translate(err: config::ConfigError, origin: &str) -> ConfigError {
    use config::ConfigError as C;
    match err {
        C::FileParse { uri, cause } => ConfigError::Syntax {
            origin: uri.unwrap_or_else(|| origin.to_owned()),
            message: without_quoted_source(&cause.to_string()),
        },
        C::NotFound(key) => ConfigError::MissingKey {
            key: normalize_key(&key),
            when: None,
        },
        C::Type {
            unexpected,
            expected,
            key,
            ..
        } => ConfigError::InvalidType {
            key: normalize_key(key.as_deref().unwrap_or("")),
            expected: type_name(expected),
            found: type_name(&unexpected.to_string()),
        },
        C::At { error, key, .. } => {
            let key = key.map(|k| normalize_key(&k));
            match *error {
                C::Message(m) => translate_message(&m, key),
                other => match key {
                    Some(key) => ConfigError::Invalid {
                        key,
                        reason: other.to_string(),
                    },
                    None => ConfigError::Other(other.to_string()),
                },
            }
        }
        C::Message(m) => translate_message(&m, None),
        other => ConfigError::Other(other.to_string()),
    }
}

/// Interprets a serde error message (the only form `config` keeps them in).
/// Wording matched here is serde's own (`unknown field`, `invalid type`),
/// stable across serde 1.x, and this crate's tagged value errors.
fn translate_message(m: &str, key: Option<String>) -> ConfigError {
    let join = |leaf: &str| match &key {
        Some(k) if !k.is_empty() => format!("{k}.{leaf}"),
        _ => leaf.to_owned(),
    };
    if let Some((value, expected)) = parse_value_error_message(m) {
        return ConfigError::InvalidValue {
            key: key.unwrap_or_default(),
            value: value.to_owned(),
            expected: expected.to_owned(),
        };
    }
    let after = |prefix: &str| m.strip_prefix(prefix).and_then(|rest| rest.split_once('`'));
    if let Some((field, tail)) = after("unknown field `") {
        return ConfigError::UnknownKey {
            key: join(field),
            allowed: backticked(tail),
        };
    }
    if let Some((field, _)) = after("missing field `") {
        return ConfigError::MissingKey {
            key: join(field),
            when: None,
        };
    }
    let invalid_type = m
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "));
    if let Some((found, expected)) = invalid_type {
        return ConfigError::InvalidType {
            key: key.unwrap_or_default(),
            expected: type_name(expected),
            found: type_name(found),
        };
    }
    match key {
        Some(key) => ConfigError::Invalid {
            key,
            reason: m.to_owned(),
        },
        None => ConfigError::Other(m.to_owned()),
    }
}

/// The words in backticks of serde's "expected one of `a`, `b`" tail.
fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// `config` builds paths as `destinations[2]bind`; write `destinations[2].bind`.
fn normalize_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    let mut chars = key.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == ']' && chars.peek().is_some_and(|n| *n != '[' && *n != '.') {
            out.push('.');
        }
    }
    out
}

/// Speaks TOML rather than serde: `a table`, `an array`. A value that came with the
/// type (`string "…"`, `` 64-bit integer `5` ``) is dropped: the key may be a password,
/// an API key or a URL with credentials, and the type is what the operator needs to see.
fn type_name(serde_name: &str) -> String {
    let s = serde_name.trim();
    if s.starts_with("struct ") || s == "a map" || s == "map" {
        return "a table".to_owned();
    }
    if s == "a sequence" || s == "sequence" {
        return "an array".to_owned();
    }
    let Some(at) = s.find(['`', '"']) else {
        return s.to_owned();
    };
    let word = s[..at].trim();
    let named = [
        ("integer", "an integer"),
        ("floating point", "a floating point number"),
        ("string", "a string"),
        ("boolean", "a boolean"),
        ("char", "a character"),
    ];
    named
        .iter()
        .find(|(part, _)| word.contains(part))
        .map_or_else(|| word.to_owned(), |(_, name)| (*name).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DestinationKind, DlrBackend, StageBackend};
    use crate::routing::RouteTable;
    use std::io::Write;
    use std::time::Duration;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn err(toml: &str) -> String {
        match load_str(toml) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn quickstart_loads_and_validates() {
        let c = load_str(QUICKSTART).unwrap();
        assert_eq!(c.storage_profile(), crate::StorageProfile::DEFAULT);
        let smpp = c.smpp.as_ref().unwrap();
        assert_eq!(smpp.listen, "127.0.0.1:2775".parse().unwrap());
        assert_eq!(smpp.accounts[0].system_id, "demo");
        assert!(smpp.accounts[0].password.matches(b"demo"));
        let http = c.http.as_ref().unwrap();
        assert_eq!(http.listen, "127.0.0.1:8080".parse().unwrap());
        assert!(http.api_keys[0].key.matches(b"demo-key"));
        assert_eq!(http.api_keys[0].account, "demo");
        assert_eq!(c.admin.listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.destinations.len(), 1);
        assert_eq!(c.destinations[0].name, "simulator");
        assert_eq!(c.destinations[0].kind, DestinationKind::Simulator);
        assert_eq!(c.destinations[0].dlr_delay_ms, 100);
        let table = RouteTable::from_config(&c);
        let r = table.resolve(&crate::RouteQuery::new("demo", "+447700900123")).unwrap();
        assert_eq!(r.name, "default");
        assert_eq!(r.to, vec!["simulator".to_owned()]);
        validate(&c).unwrap();
    }

    #[test]
    fn design_example_keys_parse() {
        // The configuration reference's keys, every stage on memory.
        let text = r#"
[sms.pending]
backend = "memory"
[sms.router-queue]
backend = "memory"
[sms.routed-work]
backend = "memory"
[dlr]
backend = "memory"
capacity = 1000000
retention = "72h"
[storage.file]
dir = "/var/lib/sendium"
[storage.postgresql]
url = "postgres://sendium@127.0.0.1:5432/sendium"
[smpp]
listen = "127.0.0.1:2775"
[[smpp.accounts]]
system-id = "esme1"
password = "secret"
max-tps = 0
max-binds = 4
[http]
listen = "127.0.0.1:8080"
[[http.api-keys]]
key = "change-me"
account = "esme1"
[admin]
listen = "127.0.0.1:9090"
token = ""
[log]
level = "debug"
format = "json"
[[destinations]]
name = "upstream-a"
kind = "smpp"
host = "127.0.0.1"
port = 2776
system-id = "sendium"
password = "pw"
bind = "transmitter+receiver"
window = 50
max-tps = 0
id-format = "hex"
dlr-delay-ms = 100
[[routes]]
name = "default"
account = "*"
destination-prefix = ""
to = ["upstream-a"]
copy-to = []
"#;
        let c = load_str(text).unwrap();
        assert_eq!(c.destinations[0].bind, crate::BindMode::TransmitterReceiver);
        assert_eq!(c.destinations[0].id_format, crate::IdFormat::Hex);
        assert_eq!(c.destinations[0].port, Some(2776));
        assert_eq!(c.dlr.retention, Duration::from_secs(72 * 3600));
        assert_eq!(c.log.format, crate::LogFormat::Json);
        assert_eq!(c.storage.file.dir.as_deref(), Some(Path::new("/var/lib/sendium")));
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn empty_text_is_the_default_config() {
        assert_eq!(load_str("").unwrap(), Config::default());
    }

    #[test]
    fn env_kebab_case_override_changes_router_queue() {
        // The file asks for an unimplemented backend; the environment must
        // replace *that* key (not create a `router_queue` sibling) for the
        // load to succeed.
        let toml = "[sms.router-queue]\nbackend = \"file\"\nbatch-size = 100\n";
        let c = load_str_with_env(
            toml,
            env(&[
                ("SENDIUM__SMS__ROUTER_QUEUE__BACKEND", "memory"),
                ("SENDIUM__SMS__ROUTER_QUEUE__BATCH_SIZE", "64"),
                ("OTHER__SMS__PENDING__BACKEND", "file"),
            ]),
        )
        .unwrap();
        assert_eq!(c.sms.router_queue.backend, StageBackend::Memory);
        assert_eq!(c.sms.router_queue.batch_size, 64);
        // And the opposite direction: the environment can break a good file.
        let e = load_str_with_env("", env(&[("SENDIUM__SMS__ROUTER_QUEUE__BACKEND", "file")])).unwrap_err();
        assert!(
            e.problems()
                .iter()
                .any(|p| matches!(p, ConfigError::UnsupportedProfile { .. })),
            "{e}"
        );
    }

    #[test]
    fn env_overrides_durations_words_and_sections() {
        let c = load_str_with_env(
            QUICKSTART,
            env(&[
                ("SENDIUM__DLR__BACKEND", "DISABLED"),
                ("SENDIUM__DLR__ON_RECEIPT_REQUEST", "refuse"),
                ("SENDIUM__DLR__ORPHAN_RETENTION", "30m"),
                ("SENDIUM__ADMIN__LISTEN", "0.0.0.0:9191"),
                ("SENDIUM__ADMIN__TOKEN", "t0ken"),
                ("SENDIUM__SMPP__MAX_COMMAND_LENGTH", "4096"),
            ]),
        )
        .unwrap();
        assert_eq!(c.dlr.backend, DlrBackend::Disabled);
        assert_eq!(c.dlr.on_receipt_request, crate::OnReceiptRequest::Refuse);
        assert_eq!(c.dlr.orphan_retention, Duration::from_secs(1800));
        assert_eq!(c.admin.listen, "0.0.0.0:9191".parse().unwrap());
        assert!(c.admin.token.matches(b"t0ken"));
        assert_eq!(c.smpp.unwrap().max_command_length, 4096);
        // Without a file, the environment alone can create a section.
        let c = load_with_env(None, env(&[("SENDIUM__HTTP__LISTEN", "127.0.0.1:8181")])).unwrap();
        assert_eq!(c.http.unwrap().listen, "127.0.0.1:8181".parse().unwrap());
    }

    #[test]
    fn env_errors_name_the_key() {
        let e = load_with_env(None, env(&[("SENDIUM__SMS__PENDING__BACKEND", "fil")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value \"fil\" for sms.pending.backend: expected one of memory, file, postgresql"
        );
        let e = load_with_env(None, env(&[("SENDIUM__SMS__ROUTER_QUEUE__NOPE", "1")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown key sms.router-queue.nope: expected one of backend, batch-size"
        );
        let e = load_with_env(None, env(&[("SENDIUM__SMS__PENDING__MAX_MESSAGES", "lots")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid value \"lots\" for sms.pending.max-messages: expected a whole number from 0 to \
             18446744073709551615"
        );
    }

    #[test]
    fn unknown_top_level_key() {
        let e = err("[sms]\n[smtp]\nlisten = \"127.0.0.1:25\"\n");
        assert_eq!(
            e,
            "unknown key smtp: expected one of sms, dlr, storage, smpp, http, admin, log, \
             destinations, routes, mo, mo-routes, outbox, shutdown"
        );
    }

    #[test]
    fn unknown_nested_key() {
        assert_eq!(
            err("[sms.pending]\nbackend = \"memory\"\nmax-message = 5\n"),
            "unknown key sms.pending.max-message: expected one of backend, max-messages"
        );
        // snake_case is not kebab-case.
        assert_eq!(
            err("[sms.router_queue]\nbackend = \"memory\"\n"),
            "unknown key sms.router_queue: expected one of multipart-expiry, max-age, pending, \
             router-queue, routed-work"
        );
        let e = err("[[destinations]]\nname = \"a\"\nkind = \"simulator\"\nsource-ton = 1\n");
        assert!(
            e.starts_with("unknown key destinations[0].source-ton: expected one of name, kind, host,"),
            "{e}"
        );
        let e = err("[smpp]\n[[smpp.accounts]]\nsystem-id = \"a\"\npassword = \"b\"\ntps = 1\n");
        assert!(
            e.starts_with("unknown key smpp.accounts[0].tps: expected one of "),
            "{e}"
        );
    }

    #[test]
    fn bad_backend_word() {
        assert_eq!(
            err("[sms.pending]\nbackend = \"fil\"\n"),
            "invalid value \"fil\" for sms.pending.backend: expected one of memory, file, postgresql"
        );
        assert_eq!(
            err("[dlr]\nbackend = \"none\"\n"),
            "invalid value \"none\" for dlr.backend: expected one of memory, file, postgresql, disabled"
        );
    }

    #[test]
    fn bad_id_format_and_bind() {
        let dest = "[[destinations]]\nname = \"a\"\nkind = \"simulator\"\n";
        assert_eq!(
            err(&format!(
                "{dest}[[destinations]]\nname = \"b\"\nkind = \"simulator\"\nid-format = \"decimal\"\n"
            )),
            "invalid value \"decimal\" for destinations[1].id-format: expected one of auto, hex, dec, exact"
        );
        assert_eq!(
            err(&format!(
                "{dest}[[destinations]]\nname = \"b\"\nkind = \"simulator\"\n[[destinations]]\nname = \"c\"\nkind = \"simulator\"\nbind = \"trx\"\n"
            )),
            "invalid value \"trx\" for destinations[2].bind: expected one of transceiver, transmitter+receiver"
        );
        assert_eq!(
            err("[[destinations]]\nname = \"a\"\nkind = \"fax\"\n"),
            "invalid value \"fax\" for destinations[0].kind: expected one of smpp, simulator, http"
        );
    }

    #[test]
    fn bad_duration() {
        assert_eq!(
            err("[dlr]\nretention = \"72hours!\"\n"),
            "invalid value \"72hours!\" for dlr.retention: expected a duration such as \"500ms\", \
             \"10s\", \"5m\" or \"72h\""
        );
        assert_eq!(
            err("[sms]\nmultipart-expiry = 600\n"),
            "invalid value \"600\" for sms.multipart-expiry: expected a duration such as \"500ms\", \
             \"10s\", \"5m\" or \"72h\""
        );
    }

    #[test]
    fn bad_listen_address() {
        assert_eq!(
            err("[http]\nlisten = \"localhost:8080\"\n"),
            "invalid value \"localhost:8080\" for http.listen: expected an IP address and port \
             such as \"127.0.0.1:8080\" or \"[::1]:8080\""
        );
    }

    #[test]
    fn bad_public_url() {
        for url in [
            "sms.example.com",
            "ftp://sms.example.com",
            "https://sms.example.com/?a=1",
        ] {
            assert_eq!(
                err(&format!("[http]\npublic-url = \"{url}\"\n")),
                format!(
                    "invalid value \"{url}\" for http.public-url: expected an http:// or https:// URL without a \
                     query, e.g. \"https://sms.example.com\""
                )
            );
        }
        let ok = load_str("[http]\npublic-url = \"https://sms.example.com/gw/\"\n").unwrap();
        assert_eq!(
            ok.http.and_then(|h| h.public_url).as_deref(),
            Some("https://sms.example.com/gw/")
        );
    }

    #[test]
    fn bad_callback_network() {
        assert_eq!(
            err("[http]\ncallback-allow = [\"10.1.0.0/16\", \"10.1.0.0/33\"]\n"),
            "invalid value \"10.1.0.0/33\" for http.callback-allow: expected a network in CIDR notation, \
             e.g. \"10.1.0.0/16\" or \"::1/128\""
        );
    }

    #[test]
    fn missing_required_field() {
        assert_eq!(
            err("[[destinations]]\nkind = \"simulator\"\n"),
            "missing required key destinations[0].name"
        );
        assert_eq!(
            err("[smpp]\n[[smpp.accounts]]\nsystem-id = \"a\"\n"),
            "missing required key smpp.accounts[0].password"
        );
        assert_eq!(err("[[routes]]\nname = \"r\"\n"), "missing required key routes[0].to");
    }

    #[test]
    fn wrong_types() {
        assert_eq!(
            err("sms = \"memory\"\n"),
            "invalid type for sms: expected a table, found a string"
        );
        assert_eq!(
            err("[[routes]]\nname = \"r\"\nto = \"a\"\n"),
            "invalid type for routes[0].to: expected an array, found a string"
        );
        assert_eq!(
            err("[admin]\nlisten = [\"127.0.0.1:1\"]\n"),
            "invalid type for admin.listen: expected a string, found an array"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_not_quoted() {
        for (toml, key) in [
            ("[http]\napi-keys = \"sk_live_s3cr3t\"\n", "http.api-keys"),
            (
                "[[destinations]]\nname = \"h\"\nkind = \"http\"\nurl = \"https://x\"\nheaders = \"Bearer s3cr3t\"\n",
                "destinations[0].headers",
            ),
        ] {
            let e = err(toml);
            assert!(e.contains(key), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
        }
        let e = load_with_env(None, env(&[("SENDIUM__HTTP__API_KEYS", "sk_live_s3cr3t")]))
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn numbers_are_strict() {
        assert_eq!(
            err("[[destinations]]\nname = \"a\"\nkind = \"smpp\"\nport = 70000\n"),
            "invalid value 70000 for destinations[0].port: expected a whole number from 0 to 65535"
        );
        assert_eq!(
            err("[dlr]\ncapacity = -1\n"),
            "invalid value -1 for dlr.capacity: expected a whole number from 0 to 18446744073709551615"
        );
        assert_eq!(
            err("[smpp]\nwindow = 1.5\n"),
            "invalid value 1.5 for smpp.window: expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            err("[smpp]\nwindow = true\n"),
            "invalid value true for smpp.window: expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            err("[smpp]\nwindow = \"true\"\n"),
            "invalid value \"true\" for smpp.window: expected a whole number from 0 to 4294967295"
        );
        let c = load_with_env(
            None,
            env(&[
                ("SENDIUM__HTTP__MAX_BODY_BYTES", "1024"),
                ("SENDIUM__STORAGE__POSTGRESQL__MAX_CONNECTIONS", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(c.http.unwrap().max_body_bytes, 1024);
        assert_eq!(c.storage.postgresql.max_connections, 3);
    }

    #[test]
    fn syntax_errors_name_the_origin() {
        let e = load_str("[sms\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
        assert!(e.to_string().starts_with("cannot parse configuration: "), "{e}");
    }

    #[test]
    fn a_syntax_error_on_a_secrets_line_does_not_quote_it() {
        for text in [
            "[[smpp.accounts]]\nsystem-id = \"esme1\"\npassword = \"s3cr3t\n",
            "[[smpp.accounts]]\nsystem-id = \"esme1\"\npassword = \"s3cr3t\" x\n",
            "[storage.postgresql]\nurl = \"postgres://sendium:s3cr3t@db/sendium\" = 1\n",
        ] {
            let e = load_str(text).unwrap_err();
            let shown = e.to_string();
            assert!(matches!(e, ConfigError::Syntax { .. }), "{shown}");
            assert!(!shown.contains("s3cr3t"), "{shown}");
            assert!(shown.contains("line 3") || shown.contains("line 2"), "{shown}");
            assert!(!shown.contains('\n'), "{shown}");
        }
    }

    #[test]
    fn loads_a_file() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(QUICKSTART.as_bytes()).unwrap();
        let c = load(f.path()).unwrap();
        assert_eq!(c.routes.len(), 1);
        let c = load_with_env(Some(f.path()), env(&[("SENDIUM__LOG__LEVEL", "debug")])).unwrap();
        assert_eq!(c.log.level, crate::LogLevel::Debug);

        let mut bad = tempfile::NamedTempFile::new().unwrap();
        bad.write_all(b"[sms.pending]\nbackend = = 1\n").unwrap();
        let e = load_with_env(Some(bad.path()), env(&[])).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot parse {}: ", bad.path().display())),
            "{e}"
        );
    }

    #[test]
    fn missing_file_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.toml");
        let e = load(&path).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read configuration file {}: ", path.display())),
            "{e}"
        );
    }

    #[test]
    fn key_normalization() {
        assert_eq!(normalize_key("destinations[2]bind"), "destinations[2].bind");
        assert_eq!(normalize_key("routes[0].to[1]"), "routes[0].to[1]");
        assert_eq!(normalize_key("a[0][1]b"), "a[0][1].b");
    }
}
