//! Rules a configuration must satisfy beyond its types.
//!
//! Everything that can be checked without opening a socket or a store is
//! checked here, at startup, so an operator finds a mistake in the log of the
//! first start rather than at the first message. All problems are collected
//! and reported together ([`ConfigError::Multiple`]) so a file can be fixed in
//! one pass; each names its full key.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::model::http::{PLACEHOLDERS, is_json_pointer, parse_template};
use crate::model::{
    BindMode, Config, DestinationConfig, DestinationKind, DlrBackend, HttpMethod, MAX_ROUTE_PRIORITY, OnReceiptRequest,
    Secret, StageBackend,
};
use crate::profile::check_supported;

/// SMPP 3.4 field limits (bytes, without the terminating NUL): longer values
/// cannot be encoded in a bind PDU, and an ESME could never bind with them.
const MAX_SYSTEM_ID: usize = 15;
const MAX_PASSWORD: usize = 8;
const MAX_SYSTEM_TYPE: usize = 12;
/// Most partitions the outbound work may be spread over (each held one needs a
/// connection of its own).
const MAX_PARTITIONS: u16 = 1024;
/// Longest outbox source name (it labels metrics).
const MAX_SOURCE_NAME: usize = 64;
/// Most rows one outbox delivery takes (they are admitted in one request).
const MAX_OUTBOX_BATCH: u32 = 10_000;

/// `smpp.max-command-length` bounds: below 64 not even a bind fits; above
/// 1 MiB one session could pin a large allocation per PDU.
pub const MIN_COMMAND_LENGTH: u32 = 64;
/// See [`MIN_COMMAND_LENGTH`].
pub const MAX_COMMAND_LENGTH: u32 = 1_048_576;

/// Checks every rule, including that the storage profile is one Sendium
/// implements. `load*` runs it; call it again after editing a `Config` in code.
pub fn validate(cfg: &Config) -> Result<(), ConfigError> {
    let mut v = Validator::default();
    v.sms(cfg);
    v.dlr(cfg);
    v.storage(cfg);
    v.smpp(cfg);
    v.http(cfg);
    v.admin(cfg);
    v.destinations(cfg);
    v.routes(cfg);
    v.mo(cfg);
    v.outbox(cfg);
    v.tls(cfg);
    v.nonzero("shutdown.timeout", cfg.shutdown.timeout);
    if let Err(e) = check_supported(&cfg.storage_profile()) {
        v.problems.push(e);
    }
    match ConfigError::from_problems(v.problems) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

mod tls;

#[derive(Default)]
struct Validator {
    problems: Vec<ConfigError>,
}

impl Validator {
    fn invalid(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        });
    }

    fn value(&mut self, key: impl Into<String>, value: impl Into<String>, expected: impl Into<String>) {
        self.problems.push(ConfigError::InvalidValue {
            key: key.into(),
            value: value.into(),
            expected: expected.into(),
        });
    }

    fn missing(&mut self, key: impl Into<String>, when: Option<String>) {
        self.problems.push(ConfigError::MissingKey { key: key.into(), when });
    }

    /// Counts, windows and sizes of zero would stall or refuse everything.
    fn at_least<T: Into<u64> + Copy>(&mut self, key: &str, value: T, min: u64) {
        let v: u64 = value.into();
        if v < min {
            self.value(key, v.to_string(), format!("at least {min}"));
        }
    }

    fn at_least_usize(&mut self, key: &str, value: usize, min: usize) {
        if value < min {
            self.value(key, value.to_string(), format!("at least {min}"));
        }
    }

    /// A zero timeout, interval or retention is never what an operator means.
    fn nonzero(&mut self, key: &str, d: Duration) {
        if d.is_zero() {
            self.value(
                key,
                format!("{:?}", crate::duration::format(d)),
                "a duration greater than zero",
            );
        }
    }

    fn max_len(&mut self, key: &str, value: &str, max: usize, quote: bool) {
        if value.len() > max {
            let shown = if quote {
                format!("{value:?}")
            } else {
                // Secrets: say how long, never what.
                format!("of {} bytes", value.len())
            };
            self.value(key, shown, format!("at most {max} bytes (SMPP 3.4 limit)"));
        }
    }

    fn not_empty(&mut self, key: &str, value: &str) -> bool {
        if value.trim().is_empty() {
            self.invalid(key, "must not be empty");
            false
        } else {
            true
        }
    }

    /// Requires `value` to be non-empty and not already used at an earlier
    /// index of the same list (`what[first]`).
    fn unique<'a>(&mut self, seen: &mut HashMap<&'a str, usize>, key: &str, value: &'a str, i: usize, what: &str) {
        if !self.not_empty(key, value) {
            return;
        }
        if let Some(first) = first_seen(seen, value, i) {
            self.invalid(key, format!("\"{value}\" is already {what}[{first}]"));
        }
    }

    fn sms(&mut self, cfg: &Config) {
        let s = &cfg.sms;
        self.nonzero("sms.multipart-expiry", s.multipart_expiry);
        self.nonzero("sms.max-age", s.max_age);
        self.at_least_usize("sms.pending.max-messages", s.pending.max_messages, 1);
        self.at_least_usize("sms.router-queue.batch-size", s.router_queue.batch_size, 1);
        self.at_least_usize("sms.routed-work.max-in-flight", s.routed_work.max_in_flight, 1);
    }

    fn dlr(&mut self, cfg: &Config) {
        let d = &cfg.dlr;
        if d.backend == DlrBackend::Memory {
            self.at_least_usize("dlr.capacity", d.capacity, 1);
        }
        self.nonzero("dlr.retention", d.retention);
        self.nonzero("dlr.callback-timeout", d.callback_timeout);
        self.nonzero("dlr.orphan-retention", d.orphan_retention);
        if d.claim_lease < d.callback_timeout.saturating_mul(2) {
            self.invalid(
                "dlr.claim-lease",
                format!(
                    "must be at least twice dlr.callback-timeout ({:?}): a callback starts only while its claim \
                     has a whole attempt left",
                    d.callback_timeout
                ),
            );
        }
        if d.on_receipt_request == OnReceiptRequest::Refuse && d.backend != DlrBackend::Disabled {
            self.invalid(
                "dlr.on-receipt-request",
                format!(
                    "\"refuse\" applies only with dlr.backend = \"disabled\", but dlr.backend is \"{}\"",
                    d.backend
                ),
            );
        }
    }

    fn storage(&mut self, cfg: &Config) {
        let stages = [
            ("sms.pending.backend", cfg.sms.pending.backend),
            ("sms.router-queue.backend", cfg.sms.router_queue.backend),
            ("sms.routed-work.backend", cfg.sms.routed_work.backend),
        ];
        let users = |stage: StageBackend, dlr: DlrBackend| -> Vec<String> {
            let mut keys: Vec<String> = stages
                .iter()
                .filter(|(_, b)| *b == stage)
                .map(|(k, b)| format!("{k} = \"{b}\""))
                .collect();
            if cfg.dlr.backend == dlr {
                keys.push(format!("dlr.backend = \"{dlr}\""));
            }
            keys
        };
        let file_users = users(StageBackend::File, DlrBackend::File);
        let pg_users = users(StageBackend::Postgresql, DlrBackend::Postgresql);

        let dir_missing = cfg.storage.file.dir.as_ref().is_none_or(|d| d.as_os_str().is_empty());
        if !file_users.is_empty() && dir_missing {
            self.missing(
                "storage.file.dir",
                Some(format!("required because {}", file_users.join(", "))),
            );
        }
        let url_missing = cfg.storage.postgresql.url.as_ref().is_none_or(Secret::is_empty);
        if !pg_users.is_empty() && url_missing {
            self.missing(
                "storage.postgresql.url",
                Some(format!("required because {}", pg_users.join(", "))),
            );
        }
        if !pg_users.is_empty() {
            self.at_least(
                "storage.postgresql.max-connections",
                cfg.storage.postgresql.max_connections,
                1,
            );
        }
        let pg = &cfg.storage.postgresql;
        if !(1..=MAX_PARTITIONS).contains(&pg.partitions) {
            self.value(
                "storage.postgresql.partitions",
                pg.partitions.to_string(),
                format!("a number from 1 to {MAX_PARTITIONS}"),
            );
        }
        if pg.shared {
            if cfg.sms.pending.backend != StageBackend::Postgresql {
                self.invalid(
                    "storage.postgresql.shared",
                    "true needs the postgresql outbound stages (sms.pending, sms.router-queue and \
                     sms.routed-work backend = \"postgresql\"): they are what several processes share",
                );
            } else if cfg.dlr.backend != DlrBackend::Postgresql {
                self.invalid(
                    "storage.postgresql.shared",
                    format!(
                        "true needs dlr.backend = \"postgresql\", but it is \"{}\": a provider hands a receipt to \
                         whichever process's session it likes, and only a DLR store in the shared database lets \
                         that process find the message it belongs to and the ESME waiting for it",
                        cfg.dlr.backend
                    ),
                );
            }
        }
        if let Some(schema) = &cfg.storage.postgresql.schema {
            let plain = schema
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && schema.len() <= 63
                && schema
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !plain {
                self.invalid(
                    "storage.postgresql.schema",
                    format!(
                        "\"{schema}\" is not a plain schema name: lower-case letters, digits and _, \
                         starting with a letter or _, at most 63 characters"
                    ),
                );
            }
        }
    }

    fn smpp(&mut self, cfg: &Config) {
        let Some(s) = &cfg.smpp else { return };
        self.at_least("smpp.max-connections", s.max_connections, 1);
        self.at_least("smpp.max-unbound", s.max_unbound, 1);
        self.at_least("smpp.max-unbound-per-address", s.max_unbound_per_address, 1);
        if !(MIN_COMMAND_LENGTH..=MAX_COMMAND_LENGTH).contains(&s.max_command_length) {
            self.value(
                "smpp.max-command-length",
                s.max_command_length.to_string(),
                format!("a number from {MIN_COMMAND_LENGTH} to {MAX_COMMAND_LENGTH}"),
            );
        }
        self.at_least("smpp.window", s.window, 1);
        self.nonzero("smpp.bind-timeout", s.bind_timeout);
        self.nonzero("smpp.idle-timeout", s.idle_timeout);
        self.nonzero("smpp.deliver-timeout", s.deliver_timeout);

        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, a) in s.accounts.iter().enumerate() {
            let key = format!("smpp.accounts[{i}]");
            let id_key = format!("{key}.system-id");
            self.max_len(&id_key, &a.system_id, MAX_SYSTEM_ID, true);
            self.unique(&mut seen, &id_key, &a.system_id, i, "the system-id of smpp.accounts");
            let pw_key = format!("{key}.password");
            if a.password.is_empty() {
                self.invalid(&pw_key, "must not be empty: anyone could bind as this account");
            }
            self.max_len(&pw_key, a.password.expose(), MAX_PASSWORD, false);
            self.at_least(&format!("{key}.max-binds"), a.max_binds, 1);
        }
    }

    fn outbox(&mut self, cfg: &Config) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, src) in cfg.outbox.sources.iter().enumerate() {
            let key = format!("outbox.sources[{i}]");
            let name_key = format!("{key}.name");
            self.unique(&mut seen, &name_key, &src.name, i, "the name of outbox sources");
            if !src.name.is_empty()
                && (src.name.len() > MAX_SOURCE_NAME
                    || !src
                        .name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            {
                self.value(
                    name_key,
                    format!("{:?}", src.name),
                    format!("at most {MAX_SOURCE_NAME} letters, digits, '-' and '_'"),
                );
            }
            let url = src.url.expose();
            let sqlite = url.starts_with("sqlite://");
            if url.is_empty() {
                self.missing(format!("{key}.url"), None);
            } else if !(sqlite || url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                // Not echoed: a URL may carry a password.
                self.invalid(
                    format!("{key}.url"),
                    "must be a postgres://, postgresql:// or sqlite:/// URL",
                );
            }
            if let Err(e) = sendium_outbox::TableName::new(&src.table) {
                self.invalid(format!("{key}.table"), e.to_string());
            }
            if sqlite && src.partitions != 1 {
                self.value(
                    format!("{key}.partitions"),
                    src.partitions.to_string(),
                    "1 for a SQLite source (one relay per database file)",
                );
            } else if !(1..=MAX_PARTITIONS).contains(&src.partitions) {
                self.value(
                    format!("{key}.partitions"),
                    src.partitions.to_string(),
                    format!("a number from 1 to {MAX_PARTITIONS}"),
                );
            }
            if !(1..=MAX_OUTBOX_BATCH).contains(&src.batch_size) {
                self.value(
                    format!("{key}.batch-size"),
                    src.batch_size.to_string(),
                    format!("a number from 1 to {MAX_OUTBOX_BATCH}"),
                );
            }
            self.at_least(&format!("{key}.max-attempts"), src.max_attempts, 1);
            self.nonzero(&format!("{key}.poll-interval"), src.poll_interval);
            self.nonzero(&format!("{key}.max-backoff"), src.max_backoff);
        }
    }

    fn http(&mut self, cfg: &Config) {
        let Some(h) = &cfg.http else { return };
        self.at_least_usize("http.max-body-bytes", h.max_body_bytes, 1);
        self.at_least("http.max-connections", h.max_connections, 1);
        self.nonzero("http.header-timeout", h.header_timeout);
        self.nonzero("http.body-timeout", h.body_timeout);
        self.nonzero("http.idempotency-retention", h.idempotency_retention);
        if let Some(u) = &h.public_url {
            let plain = url::Url::parse(u).is_ok_and(|p| p.query().is_none() && p.fragment().is_none());
            if !is_web_url(u) || !plain {
                self.value(
                    "http.public-url",
                    format!("{u:?}"),
                    "an http:// or https:// URL without a query, e.g. \"https://sms.example.com\"",
                );
            }
        }
        let accounts = account_ids(cfg);
        let mut seen: Vec<(&Secret, usize)> = Vec::new();
        for (i, k) in h.api_keys.iter().enumerate() {
            let key_key = format!("http.api-keys[{i}].key");
            if k.key.is_empty() {
                self.invalid(&key_key, "must not be empty");
            } else if let Some((_, first)) = seen.iter().find(|(s, _)| *s == &k.key) {
                // Never echo the key itself: it is a credential.
                self.invalid(
                    &key_key,
                    format!("the same key is already used by http.api-keys[{first}]"),
                );
            } else {
                seen.push((&k.key, i));
            }
            self.known_account(format!("http.api-keys[{i}].account"), &k.account, &accounts);
        }
        for (i, u) in h.sendsms_users.iter().enumerate() {
            let name_key = format!("http.sendsms-users[{i}].username");
            if u.username.is_empty() {
                self.invalid(&name_key, "must not be empty");
            } else if let Some(first) = h.sendsms_users[..i].iter().position(|o| o.username == u.username) {
                self.invalid(
                    &name_key,
                    format!("the same username is already used by http.sendsms-users[{first}]"),
                );
            }
            if u.password.is_empty() {
                self.invalid(format!("http.sendsms-users[{i}].password"), "must not be empty");
            }
            self.known_account(format!("http.sendsms-users[{i}].account"), &u.account, &accounts);
        }
    }

    /// `account` (at `key`) names one of `accounts`, the configured SMPP system-ids.
    fn known_account(&mut self, key: String, account: &str, accounts: &[&str]) {
        if !accounts.contains(&account) {
            self.value(
                key,
                format!("{account:?}"),
                format!(
                    "the system-id of an [[smpp.accounts]] entry ({})",
                    list_or_none(accounts)
                ),
            );
        }
    }

    fn admin(&mut self, cfg: &Config) {
        let a = &cfg.admin;
        if !is_loopback(&a.listen) && a.token.is_empty() {
            self.missing(
                "admin.token",
                Some(format!(
                    "required because admin.listen {} is not a loopback address",
                    a.listen
                )),
            );
        }
    }

    fn destinations(&mut self, cfg: &Config) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, d) in cfg.destinations.iter().enumerate() {
            let key = format!("destinations[{i}]");
            let name_key = format!("{key}.name");
            self.unique(&mut seen, &name_key, &d.name, i, "the name of destinations");
            if d.kind == DestinationKind::Smpp {
                let when = || Some("required for kind = \"smpp\"".to_owned());
                match d.host.as_deref() {
                    None => self.missing(format!("{key}.host"), when()),
                    Some(h) => {
                        self.not_empty(&format!("{key}.host"), h);
                    }
                }
                match d.port {
                    None => self.missing(format!("{key}.port"), when()),
                    Some(p) => self.at_least(&format!("{key}.port"), p, 1),
                }
                match d.system_id.as_deref() {
                    None => self.missing(format!("{key}.system-id"), when()),
                    Some(s) => {
                        let k = format!("{key}.system-id");
                        if self.not_empty(&k, s) {
                            self.max_len(&k, s, MAX_SYSTEM_ID, true);
                        }
                    }
                }
                self.max_len(&format!("{key}.password"), d.password.expose(), MAX_PASSWORD, false);
                self.max_len(&format!("{key}.system-type"), &d.system_type, MAX_SYSTEM_TYPE, true);
            }
            if d.kind == DestinationKind::Http {
                self.http_destination(&key, d);
            } else {
                self.no_http_keys(&key, d);
            }
            if d.kind != DestinationKind::Smpp {
                self.no_smpp_keys(&key, d);
            }
            if d.kind != DestinationKind::Simulator && d.dlr_delay_ms != crate::model::default_dlr_delay_ms() {
                self.invalid(format!("{key}.dlr-delay-ms"), "applies to kind = \"simulator\" only");
            }
            self.at_least(&format!("{key}.window"), d.window, 1);
            self.nonzero(&format!("{key}.enquire-link-interval"), d.enquire_link_interval);
            self.nonzero(&format!("{key}.response-timeout"), d.response_timeout);
            self.nonzero(&format!("{key}.failover-after"), d.failover_after);
            self.nonzero(&format!("{key}.reconnect-min"), d.reconnect_min);
            if d.reconnect_max < d.reconnect_min {
                self.value(
                    format!("{key}.reconnect-max"),
                    format!("{:?}", crate::duration::format(d.reconnect_max)),
                    format!(
                        "at least {key}.reconnect-min ({})",
                        crate::duration::format(d.reconnect_min)
                    ),
                );
            }
        }
    }

    /// The keys of `kind = "http"`: a URL Sendium can reach, templates with known
    /// placeholders, JSON pointers, and a receipt setup that is complete or absent.
    fn http_destination(&mut self, key: &str, d: &DestinationConfig) {
        match d.url.as_deref() {
            None => self.missing(format!("{key}.url"), Some("required for kind = \"http\"".to_owned())),
            Some(u) => {
                if !is_web_url(u) {
                    // Not echoed: a URL may carry a user and password.
                    self.invalid(format!("{key}.url"), "must be an http:// or https:// URL");
                }
            }
        }
        if d.method == Some(HttpMethod::Get) && d.body.is_some() {
            self.invalid(
                format!("{key}.body"),
                "applies to method = \"POST\" only (GET sends the fields in the query string)",
            );
        }
        for (name, template) in &d.fields {
            let k = format!("{key}.fields.{name}");
            if let Err(e) = parse_template(template) {
                let allowed: Vec<String> = PLACEHOLDERS.iter().map(|p| format!("{{{p}}}")).collect();
                self.value(
                    k,
                    format!("{template:?}"),
                    format!(
                        "text with placeholders {} (\"{{{{\" and \"}}}}\" for braces); {e} is not one",
                        allowed.join(" ")
                    ),
                );
            }
        }
        for (name, pointer) in [
            ("id-pointer", &d.id_pointer),
            ("receipt-id-pointer", &d.receipt_id_pointer),
            ("receipt-status-pointer", &d.receipt_status_pointer),
            ("receipt-error-pointer", &d.receipt_error_pointer),
        ] {
            if let Some(p) = pointer
                && !is_json_pointer(p)
            {
                self.value(
                    format!("{key}.{name}"),
                    format!("{p:?}"),
                    "an RFC 6901 JSON pointer such as \"/data/id\" (\"~0\" for ~, \"~1\" for /)",
                );
            }
        }
        for (name, value) in &d.headers {
            let bad_name = name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if bad_name {
                self.value(
                    format!("{key}.headers"),
                    format!("{name:?}"),
                    "header names of letters, digits, - and _",
                );
            } else if value.expose().bytes().any(|b| b == b'\r' || b == b'\n') {
                self.invalid(format!("{key}.headers.{name}"), "must not contain a line break");
            }
        }
        if !d.receipt_key.is_empty() {
            for (name, pointer) in [
                ("receipt-id-pointer", &d.receipt_id_pointer),
                ("receipt-status-pointer", &d.receipt_status_pointer),
            ] {
                if pointer.is_none() {
                    self.missing(
                        format!("{key}.{name}"),
                        Some("required with receipt-secret: where a posted receipt says it".to_owned()),
                    );
                }
            }
            if d.receipt_status.is_empty() {
                self.missing(
                    format!("{key}.receipt-status"),
                    Some("required with receipt-secret: the provider's status words".to_owned()),
                );
            }
        }
    }

    /// Keys of the SMPP client on another kind would be silently ignored; refuse them
    /// instead. Keys with a default count as given when they differ from it.
    fn no_smpp_keys(&mut self, key: &str, d: &DestinationConfig) {
        let given = [
            ("host", d.host.is_some()),
            ("port", d.port.is_some()),
            ("system-id", d.system_id.is_some()),
            ("password", !d.password.expose().is_empty()),
            ("system-type", !d.system_type.is_empty()),
            ("bind", d.bind != BindMode::default()),
            (
                "enquire-link-interval",
                d.enquire_link_interval != crate::model::default_enquire_link_interval(),
            ),
        ];
        for (name, set) in given {
            if set {
                self.invalid(format!("{key}.{name}"), "applies to kind = \"smpp\" only");
            }
        }
    }

    /// HTTP keys on another kind would be silently ignored; refuse them instead.
    fn no_http_keys(&mut self, key: &str, d: &DestinationConfig) {
        let given = [
            ("url", d.url.is_some()),
            ("method", d.method.is_some()),
            ("headers", !d.headers.is_empty()),
            ("body", d.body.is_some()),
            ("fields", !d.fields.is_empty()),
            ("id-pointer", d.id_pointer.is_some()),
            ("receipt-secret", !d.receipt_key.is_empty()),
            ("receipt-status", !d.receipt_status.is_empty()),
            ("receipt-id-pointer", d.receipt_id_pointer.is_some()),
            ("receipt-status-pointer", d.receipt_status_pointer.is_some()),
            ("receipt-error-pointer", d.receipt_error_pointer.is_some()),
        ];
        for (name, set) in given {
            if set {
                self.invalid(format!("{key}.{name}"), "applies to kind = \"http\" only");
            }
        }
    }

    fn routes(&mut self, cfg: &Config) {
        let destinations: Vec<&str> = cfg.destinations.iter().map(|d| d.name.as_str()).collect();
        let accounts = account_ids(cfg);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, r) in cfg.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            let name_key = format!("{key}.name");
            self.unique(&mut seen, &name_key, &r.name, i, "the name of routes");
            if r.account != "*" && !accounts.contains(&r.account.as_str()) {
                self.value(
                    format!("{key}.account"),
                    format!("{:?}", r.account),
                    format!(
                        "\"*\" or the system-id of an [[smpp.accounts]] entry ({})",
                        list_or_none(&accounts)
                    ),
                );
            }
            let prefix = crate::routing::normalize_address(&r.destination_prefix);
            let prefix_ok =
                prefix.bytes().all(|b| b.is_ascii_digit()) && (r.destination_prefix.is_empty() || !prefix.is_empty());
            if !prefix_ok {
                self.value(
                    format!("{key}.destination-prefix"),
                    format!("{:?}", r.destination_prefix),
                    "digits, optionally after a leading \"+\" or \"00\" (\"\" matches every number)",
                );
            }
            for (field, re) in [
                ("destination-regex", &r.destination_regex),
                ("source-regex", &r.source_regex),
                ("text-regex", &r.text_regex),
            ] {
                if let Some(re) = re
                    && let Err(e) = regex::Regex::new(re)
                {
                    self.value(
                        format!("{key}.{field}"),
                        format!("{re:?}"),
                        format!("a regular expression ({})", e.to_string().lines().last().unwrap_or("")),
                    );
                }
            }
            if r.source_prefix.chars().any(char::is_whitespace) {
                self.value(
                    format!("{key}.source-prefix"),
                    format!("{:?}", r.source_prefix),
                    "the leading characters of a sender address, without spaces",
                );
            }
            if r.to.is_empty() {
                self.invalid(format!("{key}.to"), "must name at least one destination");
            }
            self.targets(&key, "to", &r.to, &destinations);
            self.targets(&key, "copy-to", &r.copy_to, &destinations);
            if r.priority > MAX_ROUTE_PRIORITY {
                self.value(
                    format!("{key}.priority"),
                    r.priority.to_string(),
                    format!("a number from 0 (default) to {MAX_ROUTE_PRIORITY}, higher first"),
                );
            }
            for (j, c) in r.copy_to.iter().enumerate() {
                if let Some(t) = r.to.iter().position(|t| t == c) {
                    self.invalid(
                        format!("{key}.copy-to[{j}]"),
                        format!(
                            "\"{c}\" is also {key}.to[{t}]; a destination is either a failover target or a copy, not both"
                        ),
                    );
                }
            }
        }
    }

    fn mo(&mut self, cfg: &Config) {
        self.nonzero("mo.multipart-expiry", cfg.mo.multipart_expiry);
        if !cfg.mo_routes.is_empty() && cfg.dlr.backend == DlrBackend::Disabled {
            self.invalid(
                "mo-routes",
                "inbound messages are kept by the DLR store until delivered; dlr.backend = \"disabled\" has none (choose memory, file or postgresql)",
            );
        }
        let destinations: Vec<&str> = cfg.destinations.iter().map(|d| d.name.as_str()).collect();
        let accounts = account_ids(cfg);
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, r) in cfg.mo_routes.iter().enumerate() {
            let key = format!("mo-routes[{i}]");
            self.unique(&mut seen, &format!("{key}.name"), &r.name, i, "the name of mo-routes");
            if let Some(p) = &r.destination_prefix {
                let prefix = crate::routing::normalize_address(p);
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    self.value(
                        format!("{key}.destination-prefix"),
                        format!("{p:?}"),
                        "digits, optionally after a leading \"+\" or \"00\"",
                    );
                }
            }
            if let Some(re) = &r.destination_regex {
                if r.destination_prefix.is_some() {
                    self.invalid(
                        format!("{key}.destination-regex"),
                        "give destination-prefix or destination-regex, not both",
                    );
                }
                if let Err(e) = regex::Regex::new(re) {
                    self.value(
                        format!("{key}.destination-regex"),
                        format!("{re:?}"),
                        format!("a regular expression ({})", e.to_string().lines().last().unwrap_or("")),
                    );
                }
            }
            if let Some(d) = &r.from_destination
                && !destinations.contains(&d.as_str())
            {
                self.value(
                    format!("{key}.from-destination"),
                    format!("{d:?}"),
                    format!("the name of a [[destinations]] entry ({})", list_or_none(&destinations)),
                );
            }
            if let Some(k) = &r.keyword
                && (k.is_empty() || k.chars().any(char::is_whitespace))
            {
                self.value(format!("{key}.keyword"), format!("{k:?}"), "one word");
            }
            match (&r.to_account, &r.to_url) {
                (Some(_), Some(_)) => self.invalid(format!("{key}.to-url"), "give to-account or to-url, not both"),
                (None, None) => self.missing(
                    format!("{key}.to-account"),
                    Some("or to-url: where the messages go".to_owned()),
                ),
                (Some(a), None) => {
                    if !accounts.contains(&a.as_str()) {
                        self.value(
                            format!("{key}.to-account"),
                            format!("{a:?}"),
                            format!(
                                "the system-id of an [[smpp.accounts]] entry ({})",
                                list_or_none(&accounts)
                            ),
                        );
                    }
                }
                (None, Some(u)) => {
                    if !is_web_url(u) {
                        // Not echoed: a URL may carry a user and password.
                        self.invalid(format!("{key}.to-url"), "must be an http:// or https:// URL");
                    }
                }
            }
        }
    }

    fn targets(&mut self, route: &str, field: &str, names: &[String], destinations: &[&str]) {
        for (j, n) in names.iter().enumerate() {
            let key = format!("{route}.{field}[{j}]");
            if !destinations.contains(&n.as_str()) {
                self.value(
                    key,
                    format!("{n:?}"),
                    format!("the name of a [[destinations]] entry ({})", list_or_none(destinations)),
                );
            } else if let Some(first) = names[..j].iter().position(|m| m == n) {
                self.invalid(key, format!("\"{n}\" is already {route}.{field}[{first}]"));
            }
        }
    }
}

/// Records `name` at index `i` unless it was seen before; returns the index
/// of its first occurrence when it is a duplicate.
fn first_seen<'a>(seen: &mut HashMap<&'a str, usize>, name: &'a str, i: usize) -> Option<usize> {
    match seen.entry(name) {
        Entry::Occupied(first) => Some(*first.get()),
        Entry::Vacant(slot) => {
            slot.insert(i);
            None
        }
    }
}

fn account_ids(cfg: &Config) -> Vec<&str> {
    cfg.smpp
        .iter()
        .flat_map(|s| s.accounts.iter().map(|a| a.system_id.as_str()))
        .collect()
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none are configured".to_owned()
    } else {
        format!("one of {}", names.join(", "))
    }
}

/// Whether an address is reachable only from this host.
fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// An `http://` or `https://` URL with a host.
fn is_web_url(u: &str) -> bool {
    url::Url::parse(u).is_ok_and(|p| matches!(p.scheme(), "http" | "https") && p.host().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::load_str;

    const BASE: &str = r#"
[smpp]
[[smpp.accounts]]
system-id = "esme1"
password = "secret"

[[destinations]]
name = "a"
kind = "simulator"

[[destinations]]
name = "b"
kind = "smpp"
host = "127.0.0.1"
port = 2776
system-id = "sendium"
"#;

    /// Loads `BASE` followed by `extra` and returns the messages of every problem.
    fn problems(extra: &str) -> Vec<String> {
        match load_str(&format!("{BASE}\n{extra}")) {
            Ok(_) => vec![],
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    }

    fn one(extra: &str) -> String {
        let p = problems(extra);
        assert_eq!(p.len(), 1, "{p:#?}");
        p.into_iter().next().unwrap_or_default()
    }

    #[test]
    fn allowed_ips_take_addresses_and_networks() {
        let cfg = load_str(&format!(
            "{BASE}\n[http]\n[[http.api-keys]]\nkey = \"k\"\naccount = \"esme1\"\nallowed-ips = [\"192.0.2.7\", \"2001:db8::/32\"]"
        ))
        .unwrap();
        let k = &cfg.http.as_ref().unwrap().api_keys[0];
        assert_eq!(
            k.allowed_ips,
            vec!["192.0.2.7/32".parse().unwrap(), "2001:db8::/32".parse().unwrap()]
        );
        let p = problems("[[smpp.accounts]]\nsystem-id = \"x\"\npassword = \"p\"\nallowed-ips = [\"10.0.0.0/33\"]");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("smpp.accounts") && p[0].contains("allowed-ips") && p[0].contains("CIDR"),
            "{p:?}"
        );
    }

    #[test]
    fn route_regexes_must_compile() {
        assert_eq!(
            problems(
                "[[routes]]\nname = \"r\"\nto = [\"a\"]\nsource-prefix = \"BANK\"\nsource-regex = \"^[0-9]+$\"\ndestination-regex = \"^33\"\ntext-regex = \"(?i)code\""
            ),
            Vec::<String>::new()
        );
        let p = one("[[routes]]\nname = \"r\"\nto = [\"a\"]\ntext-regex = \"(\"");
        assert!(
            p.starts_with("invalid value \"(\" for routes[0].text-regex: expected a regular expression"),
            "{p}"
        );
    }

    #[test]
    fn mo_routes_are_checked_key_by_key() {
        assert_eq!(
            problems(
                "[[mo-routes]]\nname = \"m\"\nkeyword = \"JOIN\"\ndestination-prefix = \"+4470\"\nto-account = \"esme1\"\n[[mo-routes]]\nname = \"n\"\ndestination-regex = \"^8[0-9]{4}$\"\nfrom-destination = \"b\"\nto-url = \"https://app.example/mo\""
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            one("[[mo-routes]]\nname = \"m\"\nto-account = \"esme9\""),
            "invalid value \"esme9\" for mo-routes[0].to-account: expected the system-id of an [[smpp.accounts]] entry (one of esme1)"
        );
        assert_eq!(
            one("[[mo-routes]]\nname = \"m\""),
            "missing required key mo-routes[0].to-account (or to-url: where the messages go)"
        );
        assert!(one("[[mo-routes]]\nname = \"m\"\nto-url = \"ftp://x\"").contains("mo-routes[0].to-url"));
        assert!(
            one("[[mo-routes]]\nname = \"m\"\ndestination-regex = \"(\"\nto-account = \"esme1\"")
                .contains("mo-routes[0].destination-regex")
        );
        assert!(
            one("[[mo-routes]]\nname = \"m\"\nfrom-destination = \"zz\"\nto-account = \"esme1\"")
                .contains("mo-routes[0].from-destination")
        );
        assert!(
            one("[[mo-routes]]\nname = \"m\"\nkeyword = \"two words\"\nto-account = \"esme1\"")
                .contains("mo-routes[0].keyword")
        );
        assert!(
            one("[dlr]\nbackend = \"disabled\"\n[[mo-routes]]\nname = \"m\"\nto-account = \"esme1\"")
                .contains("dlr.backend = \"disabled\"")
        );
        assert_eq!(
            one("[mo]\nunrouted = \"drop\""),
            "invalid value \"drop\" for mo.unrouted: expected one of ack, reject"
        );
    }

    #[test]
    fn base_is_valid() {
        assert_eq!(problems(""), Vec::<String>::new());
    }

    #[test]
    fn claim_lease_must_outlast_a_callback_attempt() {
        assert!(
            one("[dlr]\nclaim-lease = \"9s\"")
                .starts_with("invalid dlr.claim-lease: must be at least twice dlr.callback-timeout"),
            "{}",
            one("[dlr]\nclaim-lease = \"9s\"")
        );
        assert_eq!(problems("[dlr]\nclaim-lease = \"10s\""), Vec::<String>::new());
    }

    #[test]
    fn outbox_sources_are_checked_key_by_key() {
        let ok = "[[outbox.sources]]\nname = \"shop\"\nurl = \"postgres://app@127.0.0.1/shop\"\n";
        assert_eq!(problems(ok), Vec::<String>::new());
        let bad = problems(
            "[[outbox.sources]]\nname = \"shop\"\nurl = \"mysql://secret@db/shop\"\ntable = \"App.Outbox\"\n\
             partitions = 0\nbatch-size = 0\nmax-attempts = 0\npoll-interval = \"0s\"\n\
             [[outbox.sources]]\nname = \"shop\"\nurl = \"sqlite:///var/lib/app.db\"\npartitions = 4\n",
        );
        let expect = [
            "invalid outbox.sources[0].url: must be a postgres://, postgresql:// or sqlite:/// URL",
            "invalid outbox.sources[0].table: table name \"App.Outbox\" must start with",
            "invalid value 0 for outbox.sources[0].partitions: expected a number from 1 to 1024",
            "invalid value 0 for outbox.sources[0].batch-size: expected a number from 1 to 10000",
            "outbox.sources[0].max-attempts",
            "outbox.sources[0].poll-interval",
            "invalid outbox.sources[1].name: \"shop\" is already the name of outbox sources[0]",
            "invalid value 4 for outbox.sources[1].partitions: expected 1 for a SQLite source",
        ];
        for e in expect {
            assert!(bad.iter().any(|p| p.starts_with(e) || p.contains(e)), "{e}\n{bad:#?}");
        }
        assert_eq!(bad.len(), expect.len(), "{bad:#?}");
        assert!(
            !bad.iter().any(|p| p.contains("secret")),
            "the URL is not echoed: {bad:#?}"
        );
        assert!(
            one("[[outbox.sources]]\nname = \"a\"\nurl = \"sqlite:///x.db\"\nbatch = 5").contains(
                "unknown key outbox.sources[0].batch: expected one of name, url, table, partitions, batch-size"
            )
        );
    }

    const HTTP: &str = "[[destinations]]\nname = \"h\"\nkind = \"http\"\nurl = \"https://api.example/sms\"\n";

    #[test]
    fn http_destinations_are_checked_key_by_key() {
        assert!(
            problems(&format!(
                "{HTTP}method = \"GET\"\nheaders = {{ X-Api-Key = \"k\" }}\nfields = {{ msg = \"{{text}} {{{{x}}}}\", dst = \"{{to}}\" }}\nid-pointer = \"/data/0/id\"\nparts = \"split\"\nreceipt-secret = \"s\"\nreceipt-signature = \"hmac-sha256\"\nreceipt-status = {{ delivered = \"DELIVRD\", failed = \"UNDELIV\" }}\nreceipt-id-pointer = \"/id\"\nreceipt-status-pointer = \"/status\""
            ))
            .is_empty()
        );
        assert_eq!(
            one("[[destinations]]\nname = \"h\"\nkind = \"http\""),
            "missing required key destinations[2].url (required for kind = \"http\")"
        );
        assert!(
            one("[[destinations]]\nname = \"h\"\nkind = \"http\"\nurl = \"ftp://x\"").contains("destinations[2].url")
        );
        assert!(one(&format!("{HTTP}method = \"PUT\"")).contains("one of POST, GET"));
        assert!(one(&format!("{HTTP}body = \"xml\"")).contains("one of json, form"));
        assert!(one(&format!("{HTTP}parts = \"some\"")).contains("one of whole, split"));
        assert!(one(&format!("{HTTP}receipt-signature = \"md5\"")).contains("one of token, hmac-sha256"));
        assert!(one(&format!("{HTTP}receipt-status = {{ ok = \"GOOD\" }}")).contains("DELIVRD, UNDELIV"));
        assert!(one(&format!("{HTTP}method = \"GET\"\nbody = \"form\"")).contains("destinations[2].body"));
        let e = one(&format!("{HTTP}fields = {{ m = \"{{body}}\" }}"));
        assert!(
            e.contains("destinations[2].fields.m") && e.contains("{body} is not one"),
            "{e}"
        );
        assert!(one(&format!("{HTTP}id-pointer = \"data.id\"")).contains("destinations[2].id-pointer"));
        assert!(one(&format!("{HTTP}headers = {{ \"a b\" = \"x\" }}")).contains("destinations[2].headers"));
        let p = problems(&format!("{HTTP}receipt-secret = \"s\""));
        assert_eq!(p.len(), 3, "{p:#?}");
        assert!(
            one("[[destinations]]\nname = \"s\"\nkind = \"simulator\"\nurl = \"http://x\"")
                .contains("applies to kind = \"http\" only")
        );
    }

    #[test]
    fn a_malformed_url_is_refused_without_echoing_it() {
        let e = one("[[destinations]]\nname = \"h\"\nkind = \"http\"\nurl = \"htps://user:s3cr3t@api.example/sms\"\n");
        assert!(
            e.contains("destinations[2].url") && e.contains("http:// or https://"),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn keys_of_another_destination_kind_are_refused_not_ignored() {
        let sim = "[[destinations]]\nname = \"s\"\nkind = \"simulator\"\n";
        for (extra, key) in [
            ("host = \"smsc.example\"", "destinations[2].host"),
            ("port = 2775", "destinations[2].port"),
            ("system-id = \"x\"", "destinations[2].system-id"),
            ("password = \"p\"", "destinations[2].password"),
            ("system-type = \"t\"", "destinations[2].system-type"),
            ("bind = \"transmitter+receiver\"", "destinations[2].bind"),
            (
                "enquire-link-interval = \"5s\"",
                "destinations[2].enquire-link-interval",
            ),
        ] {
            let e = one(&format!("{sim}{extra}"));
            assert!(
                e.contains(key) && e.contains("applies to kind = \"smpp\" only"),
                "{extra}: {e}"
            );
            let e = one(&format!("{HTTP}{extra}"));
            assert!(e.contains(key) && e.contains("kind = \"smpp\" only"), "{extra}: {e}");
        }
        // An HTTP destination trusts a private CA for its https:// url; nothing else does.
        assert!(problems(&format!("{HTTP}tls-ca = \"/etc/ca.pem\"")).is_empty());
        let plain = HTTP.replace("https://", "http://");
        let e = one(&format!("{plain}tls-ca = \"/etc/ca.pem\""));
        assert!(
            e.contains("destinations[2].tls-ca") && e.contains("only used with an https:// url"),
            "{e}"
        );
        let e = one(&format!("{sim}tls-ca = \"/etc/ca.pem\""));
        assert!(
            e.contains("destinations[2].tls-ca") && e.contains("applies to kind = \"smpp\" or \"http\" only"),
            "{e}"
        );
        for extra in ["tls-server-name = \"x.example\"", "tls-insecure-skip-verify = true"] {
            let e = one(&format!("{HTTP}{extra}"));
            assert!(e.contains("applies to kind = \"smpp\" only"), "{extra}: {e}");
        }
        let smpp = "[[destinations]]\nname = \"c\"\nkind = \"smpp\"\nhost = \"h\"\nport = 1\nsystem-id = \"x\"\n";
        let e = one(&format!("{smpp}dlr-delay-ms = 5"));
        assert!(
            e.contains("destinations[2].dlr-delay-ms") && e.contains("kind = \"simulator\" only"),
            "{e}"
        );
        // Their defaults, given or not, are no problem; nor are the keys every kind uses.
        assert!(problems(&format!("{sim}dlr-delay-ms = 5\nwindow = 10\nbind = \"transceiver\"")).is_empty());
        assert!(problems(&format!("{HTTP}window = 10\nmax-tps = 5\nresponse-timeout = \"5s\"")).is_empty());
    }

    #[test]
    fn http_secrets_come_from_the_environment_and_stay_hidden() {
        let toml = format!(
            "{BASE}\n{HTTP}headers = {{ Authorization = \"Bearer ${{SENDIUM_TEST_KEY_X}}\" }}\nreceipt-secret = \"${{SENDIUM_TEST_SECRET_X}}\"\nreceipt-status = {{ ok = \"DELIVRD\" }}\nreceipt-id-pointer = \"/id\"\nreceipt-status-pointer = \"/s\""
        );
        let env = vec![
            ("SENDIUM_TEST_KEY_X".to_owned(), "abc123".to_owned()),
            ("SENDIUM_TEST_SECRET_X".to_owned(), "shh".to_owned()),
        ];
        let cfg = crate::load_str_with_env(&toml, env).unwrap();
        let d = &cfg.destinations[2];
        assert_eq!(d.headers["Authorization"].expose(), "Bearer abc123");
        assert_eq!(d.receipt_key.expose(), "shh");
        let shown = format!("{d:?}");
        assert!(!shown.contains("abc123") && !shown.contains("shh"), "{shown}");
        let e = crate::load_str_with_env(&toml, vec![]).unwrap_err().to_string();
        assert!(
            e.contains("destinations[2].headers.Authorization") && e.contains("SENDIUM_TEST_KEY_X"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_destination_names() {
        assert_eq!(
            one("[[destinations]]\nname = \"a\"\nkind = \"simulator\""),
            "invalid destinations[2].name: \"a\" is already the name of destinations[0]"
        );
    }

    #[test]
    fn duplicate_accounts_and_api_keys() {
        assert_eq!(
            one("[[smpp.accounts]]\nsystem-id = \"esme1\"\npassword = \"x\""),
            "invalid smpp.accounts[1].system-id: \"esme1\" is already the system-id of smpp.accounts[0]"
        );
        let p = one("[http]\n[[http.api-keys]]\nkey = \"k1\"\naccount = \"esme1\"\n\
             [[http.api-keys]]\nkey = \"k1\"\naccount = \"esme1\"");
        assert_eq!(
            p,
            "invalid http.api-keys[1].key: the same key is already used by http.api-keys[0]"
        );
        assert!(!p.contains("k1"));
    }

    #[test]
    fn sendsms_users_are_checked_by_key() {
        let user = |name: &str, pw: &str, account: &str| {
            format!("[[http.sendsms-users]]\nusername = \"{name}\"\npassword = \"{pw}\"\naccount = \"{account}\"\n")
        };
        let p = one(&format!(
            "[http]\n{}{}",
            user("tester", "foobar", "esme1"),
            user("tester", "other", "esme1")
        ));
        assert_eq!(
            p,
            "invalid http.sendsms-users[1].username: the same username is already used by http.sendsms-users[0]"
        );
        assert_eq!(
            one(&format!("[http]\n{}", user("tester", "", "esme1"))),
            "invalid http.sendsms-users[0].password: must not be empty"
        );
        assert_eq!(
            one(&format!("[http]\n{}", user("tester", "foobar", "nobody"))),
            "invalid value \"nobody\" for http.sendsms-users[0].account: expected the system-id of an \
             [[smpp.accounts]] entry (one of esme1)"
        );
        let cfg = crate::load_str(&format!(
            "{BASE}\n[http]\n{}allowed-ips = [\"192.0.2.7\"]",
            user("tester", "foobar", "esme1")
        ))
        .unwrap();
        let u = &cfg.http.as_ref().unwrap().sendsms_users[0];
        assert_eq!((u.username.as_str(), u.account.as_str()), ("tester", "esme1"));
        assert!(u.password.matches(b"foobar"));
        assert_eq!(u.allowed_ips, vec!["192.0.2.7/32".parse::<ipnet::IpNet>().unwrap()]);
        assert!(
            !format!("{u:?}").contains("foobar"),
            "the password stays out of debug output"
        );
    }

    #[test]
    fn api_key_account_must_exist() {
        assert_eq!(
            one("[http]\n[[http.api-keys]]\nkey = \"k\"\naccount = \"nobody\""),
            "invalid value \"nobody\" for http.api-keys[0].account: expected the system-id of an \
             [[smpp.accounts]] entry (one of esme1)"
        );
    }

    #[test]
    fn routes_must_name_destinations() {
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = []"),
            "invalid routes[0].to: must name at least one destination"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\", \"x\"]"),
            "invalid value \"x\" for routes[0].to[1]: expected the name of a [[destinations]] \
             entry (one of a, b)"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\"]\ncopy-to = [\"y\"]"),
            "invalid value \"y\" for routes[0].copy-to[0]: expected the name of a [[destinations]] \
             entry (one of a, b)"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\"]\npriority = 10"),
            "invalid value 10 for routes[0].priority: expected a number from 0 (default) to 9, higher first"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\", \"b\"]\ncopy-to = [\"b\"]"),
            "invalid routes[0].copy-to[0]: \"b\" is also routes[0].to[1]; a destination is either \
             a failover target or a copy, not both"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\", \"a\"]"),
            "invalid routes[0].to[1]: \"a\" is already routes[0].to[0]"
        );
    }

    #[test]
    fn route_names_accounts_and_prefixes() {
        assert_eq!(
            one("[[routes]]\nname = \"r\"\nto = [\"a\"]\n[[routes]]\nname = \"r\"\nto = [\"b\"]"),
            "invalid routes[1].name: \"r\" is already the name of routes[0]"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\naccount = \"esme2\"\nto = [\"a\"]"),
            "invalid value \"esme2\" for routes[0].account: expected \"*\" or the system-id of an \
             [[smpp.accounts]] entry (one of esme1)"
        );
        assert_eq!(
            one("[[routes]]\nname = \"r\"\ndestination-prefix = \"44 \"\nto = [\"a\"]"),
            "invalid value \"44 \" for routes[0].destination-prefix: expected digits, optionally \
             after a leading \"+\" or \"00\" (\"\" matches every number)"
        );
        assert_eq!(
            problems("[[routes]]\nname = \"r\"\ndestination-prefix = \"+\"\nto = [\"a\"]").len(),
            1
        );
        assert!(problems("[[routes]]\nname = \"r\"\ndestination-prefix = \"+0044\"\nto = [\"a\"]").is_empty());
    }

    #[test]
    fn smpp_destinations_need_an_endpoint() {
        let p = problems("[[destinations]]\nname = \"c\"\nkind = \"smpp\"");
        assert_eq!(
            p,
            vec![
                "missing required key destinations[2].host (required for kind = \"smpp\")",
                "missing required key destinations[2].port (required for kind = \"smpp\")",
                "missing required key destinations[2].system-id (required for kind = \"smpp\")",
            ]
        );
    }

    #[test]
    fn windows_and_command_length() {
        assert_eq!(
            one("[[destinations]]\nname = \"c\"\nkind = \"simulator\"\nwindow = 0"),
            "invalid value 0 for destinations[2].window: expected at least 1"
        );
        let base_without_smpp = BASE.replace("[smpp]\n", "[smpp]\nwindow = 0\nmax-command-length = 63\n");
        let err = load_str(&base_without_smpp).unwrap_err();
        let msgs: Vec<String> = err.problems().iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            vec![
                "invalid value 63 for smpp.max-command-length: expected a number from 64 to 1048576",
                "invalid value 0 for smpp.window: expected at least 1",
            ]
        );
        let ok = BASE.replace("[smpp]\n", "[smpp]\nmax-command-length = 1048576\n");
        assert!(load_str(&ok).is_ok());
        let too_big = BASE.replace("[smpp]\n", "[smpp]\nmax-command-length = 1048577\n");
        assert!(load_str(&too_big).is_err());
    }

    #[test]
    fn smpp_field_lengths() {
        assert_eq!(
            one("[[smpp.accounts]]\nsystem-id = \"a-very-long-system-id\"\npassword = \"x\""),
            "invalid value \"a-very-long-system-id\" for smpp.accounts[1].system-id: expected at \
             most 15 bytes (SMPP 3.4 limit)"
        );
        let p = one("[[smpp.accounts]]\nsystem-id = \"e2\"\npassword = \"123456789\"");
        assert_eq!(
            p,
            "invalid value of 9 bytes for smpp.accounts[1].password: expected at most 8 bytes \
             (SMPP 3.4 limit)"
        );
        assert_eq!(
            one("[[smpp.accounts]]\nsystem-id = \"e2\"\npassword = \"\""),
            "invalid smpp.accounts[1].password: must not be empty: anyone could bind as this account"
        );
    }

    #[test]
    fn storage_locations_required_only_when_used() {
        // Present but unused is fine.
        assert!(problems("[storage.file]\ndir = \"/tmp/x\"\n[storage.postgresql]\nurl = \"postgres://x\"").is_empty());
        let p = problems("[sms.pending]\nbackend = \"file\"\n[dlr]\nbackend = \"postgresql\"");
        assert_eq!(p.len(), 2, "{p:#?}");
        assert_eq!(
            p[0],
            "missing required key storage.file.dir (required because sms.pending.backend = \"file\")"
        );
        assert_eq!(
            p[1],
            "missing required key storage.postgresql.url (required because dlr.backend = \"postgresql\")"
        );
        let p = problems(
            "[sms.router-queue]\nbackend = \"file\"\n[sms.routed-work]\nbackend = \"file\"\n[dlr]\nbackend = \"file\"",
        );
        assert_eq!(
            p[0],
            "missing required key storage.file.dir (required because sms.router-queue.backend = \
             \"file\", sms.routed-work.backend = \"file\", dlr.backend = \"file\")"
        );
        // With locations given, file/memory/memory is accepted; an unimplemented mix is not.
        assert!(problems("[sms.pending]\nbackend = \"file\"\n[storage.file]\ndir = \"/var/lib/sendium\"").is_empty());
        let p = problems("[sms.router-queue]\nbackend = \"file\"\n[storage.file]\ndir = \"/var/lib/sendium\"");
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("unsupported storage profile memory/file/memory"));
    }

    #[test]
    fn shared_database_needs_postgresql_stages_and_receipts() {
        const PG_STAGES: &str = "[sms.pending]\nbackend = \"postgresql\"\n[sms.router-queue]\nbackend = \
                                 \"postgresql\"\n[sms.routed-work]\nbackend = \"postgresql\"\n";
        const URL: &str = "url = \"postgres://x\"\n";
        // One process on the postgresql stages may keep receipts anywhere.
        assert!(problems(&format!("{PG_STAGES}[storage.postgresql]\n{URL}")).is_empty());
        let p = one(&format!("[storage.postgresql]\n{URL}shared = true"));
        assert!(
            p.starts_with("invalid storage.postgresql.shared: true needs the postgresql outbound stages"),
            "{p}"
        );
        let p = one(&format!("{PG_STAGES}[storage.postgresql]\n{URL}shared = true"));
        assert!(
            p.starts_with(
                "invalid storage.postgresql.shared: true needs dlr.backend = \"postgresql\", but it is \"memory\""
            ),
            "{p}"
        );
        assert!(
            problems(&format!(
                "{PG_STAGES}[dlr]\nbackend = \"postgresql\"\n[storage.postgresql]\n{URL}shared = true\npartitions = 64"
            ))
            .is_empty()
        );
        for bad in ["0", "1025"] {
            let p = one(&format!("{PG_STAGES}[storage.postgresql]\n{URL}partitions = {bad}"));
            assert!(
                p.contains("storage.postgresql.partitions") && p.contains("a number from 1 to 1024"),
                "{p}"
            );
        }
    }

    #[test]
    fn admin_token_required_off_loopback() {
        assert_eq!(
            one("[admin]\nlisten = \"0.0.0.0:9090\""),
            "missing required key admin.token (required because admin.listen 0.0.0.0:9090 is not a \
             loopback address)"
        );
        assert!(problems("[admin]\nlisten = \"0.0.0.0:9090\"\ntoken = \"t\"").is_empty());
        assert!(problems("[admin]\nlisten = \"[::1]:9090\"").is_empty());
    }

    #[test]
    fn receipt_refusal_only_with_disabled_dlr() {
        assert_eq!(
            one("[dlr]\non-receipt-request = \"refuse\""),
            "invalid dlr.on-receipt-request: \"refuse\" applies only with dlr.backend = \
             \"disabled\", but dlr.backend is \"memory\""
        );
        assert!(problems("[dlr]\nbackend = \"disabled\"\non-receipt-request = \"refuse\"").is_empty());
    }

    #[test]
    fn zero_sizes_and_durations() {
        assert_eq!(
            one("[sms.router-queue]\nbatch-size = 0"),
            "invalid value 0 for sms.router-queue.batch-size: expected at least 1"
        );
        assert_eq!(
            one("[dlr]\nretention = \"0s\""),
            "invalid value \"0s\" for dlr.retention: expected a duration greater than zero"
        );
        assert_eq!(
            one(
                "[[destinations]]\nname = \"c\"\nkind = \"simulator\"\nreconnect-min = \"10s\"\nreconnect-max = \"5s\""
            ),
            "invalid value \"5s\" for destinations[2].reconnect-max: expected at least \
             destinations[2].reconnect-min (10s)"
        );
    }

    #[test]
    fn all_problems_are_reported_together() {
        let err = load_str(&format!(
            "{BASE}\n[[routes]]\nname = \"r\"\nto = []\n[[destinations]]\nname = \"a\"\nkind = \"simulator\"\nwindow = 0"
        ))
        .unwrap_err();
        assert!(matches!(err, ConfigError::Multiple(_)));
        let text = err.to_string();
        assert!(text.starts_with("3 configuration errors:\n  - "), "{text}");
    }

    #[test]
    fn validate_runs_on_programmatic_configs() {
        let mut cfg = Config::default();
        assert!(validate(&cfg).is_ok());
        cfg.sms.pending.backend = StageBackend::Postgresql;
        let err = validate(&cfg).unwrap_err();
        assert_eq!(err.problems().len(), 2);
    }
}
