//! The configuration model: one serde struct per TOML table.
//!
//! Keys are kebab-case exactly as the README's configuration reference documents
//! them; they are a public interface, so renaming a field here is a breaking change
//! for every deployed file. Every struct denies unknown keys: a misspelt key
//! would otherwise be ignored and its setting would silently stay at the
//! default, which for a storage backend means silently losing durability.
//!
//! Every key has a default except those that make no sense without a value
//! (account credentials, destination and route names, a route's targets, API
//! keys); SMPP destination endpoints are optional here because a simulator
//! destination has none, and [`crate::validate`] requires them for `kind =
//! "smpp"`. A `Config` that came out of [`crate::load`] has been validated.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use subtle::ConstantTimeEq;

use crate::error::value_error_message;

/// Declares an enumeration of configuration words with its serde
/// implementation. The words are listed once, so the parser, `Display`, and
/// the "expected one of …" text of an error can never disagree.
macro_rules! word_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $word:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in documentation order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word used for this value in the configuration file.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $word ),+
                }
            }

            /// Parses a configuration word. ASCII case is ignored because
            /// environment variables are often written in upper case.
            pub fn from_word(word: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str().eq_ignore_ascii_case(word))
            }

            /// `one of a, b, c`: the tail of an "invalid value" error.
            pub fn expected() -> String {
                let words: Vec<&str> = Self::ALL.iter().map(|v| v.as_str()).collect();
                format!("one of {}", words.join(", "))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct WordVisitor;
                impl Visitor<'_> for WordVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(&$name::expected())
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::from_word(v).ok_or_else(|| {
                            E::custom(value_error_message(format_args!("{v:?}"), $name::expected()))
                        })
                    }
                }
                deserializer.deserialize_str(WordVisitor)
            }
        }
    };
}

word_enum! {
    /// Where one outbound stage (`pending`, `router-queue`, `routed-work`) keeps its records.
    /// Non-durable `memory` by default: durability is opted into, never assumed.
    #[derive(Default)]
    pub enum StageBackend {
        /// Lost on restart.
        #[default]
        Memory => "memory",
        /// An exclusive-locked spool directory (`storage.file.dir`).
        File => "file",
        /// A PostgreSQL database (`storage.postgresql.url`).
        Postgresql => "postgresql",
    }
}

word_enum! {
    /// Where provider correlations and pending downstream receipts are kept.
    #[derive(Default)]
    pub enum DlrBackend {
        /// Bounded by `dlr.capacity`; lost on restart.
        #[default]
        Memory => "memory",
        /// Survives restart in `storage.file.dir`.
        File => "file",
        /// Survives restart in PostgreSQL; shareable by several processes.
        Postgresql => "postgresql",
        /// No Sendium-owned receipt handling (see `dlr.on-receipt-request`).
        Disabled => "disabled",
    }
}

word_enum! {
    /// How a submission that asks for a receipt is answered when `dlr.backend = "disabled"`.
    #[derive(Default)]
    pub enum OnReceiptRequest {
        /// Accept the message; no receipt will ever come.
        #[default]
        Accept => "accept",
        /// Refuse it (`ESME_RINVREGDLVFLG` / HTTP 400), so the client knows.
        Refuse => "refuse",
    }
}

word_enum! {
    /// What the provider is answered for an inbound (MO) message no `[[mo-routes]]` entry
    /// matches.
    #[derive(Default)]
    pub enum MoUnrouted {
        /// Acknowledge it (the message is counted, logged without its text, and dropped):
        /// the provider does not send it again.
        #[default]
        Ack => "ack",
        /// Refuse it with ESME_RX_R_APPN (a permanent application error).
        Reject => "reject",
    }
}

word_enum! {
    /// Log verbosity.
    #[derive(Default)]
    pub enum LogLevel {
        /// Errors only.
        Error => "error",
        /// Warnings and errors.
        Warn => "warn",
        /// The default.
        #[default]
        Info => "info",
        /// Diagnostic detail.
        Debug => "debug",
        /// Everything.
        Trace => "trace",
    }
}

word_enum! {
    /// Log line format.
    #[derive(Default)]
    pub enum LogFormat {
        /// Human-readable lines.
        #[default]
        Text => "text",
        /// One JSON object per line, for log collectors.
        Json => "json",
    }
}

word_enum! {
    /// What a destination is.
    pub enum DestinationKind {
        /// An upstream SMSC reached over SMPP.
        Smpp => "smpp",
        /// Built in: acknowledges every submit, then sends a DELIVRD receipt.
        Simulator => "simulator",
        /// A provider reached through an HTTP API.
        Http => "http",
    }
}

pub mod http;
pub mod tls;
pub use http::{HttpBody, HttpMethod, HttpParts, ReceiptSignature, ReceiptState};

word_enum! {
    /// How Sendium binds to an upstream SMSC.
    #[derive(Default)]
    pub enum BindMode {
        /// One transceiver session carries submits and receipts.
        #[default]
        Transceiver => "transceiver",
        /// A transmitter session for submits and a receiver session for receipts.
        TransmitterReceiver => "transmitter+receiver",
    }
}

word_enum! {
    /// How receipt ids from a provider are compared with the ids it returned
    /// in `submit_sm_resp` (providers disagree on hex vs decimal).
    #[derive(Default)]
    pub enum IdFormat {
        /// Try the same form first, then both hex/decimal conversions.
        #[default]
        Auto => "auto",
        /// submit_sm_resp ids are hexadecimal; the receipt text writes the same
        /// number in decimal.
        Hex => "hex",
        /// submit_sm_resp ids are decimal; the receipt text writes the same
        /// number in hexadecimal.
        Dec => "dec",
        /// Byte-for-byte comparison.
        Exact => "exact",
    }
}

/// A password, API key, token or database URL.
///
/// Its `Debug` output is redacted so a logged `Config` never leaks
/// credentials, and equality runs in constant time so comparing a bind
/// password or an API key does not leak how many leading bytes matched.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must send or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no value was given (`token = ""`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Constant-time comparison with a candidate (a bind password, a bearer token).
    pub fn matches(&self, candidate: &[u8]) -> bool {
        bool::from(self.0.as_bytes().ct_eq(candidate))
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}
impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(\"\")")
        } else {
            f.write_str("Secret(<redacted>)")
        }
    }
}

/// What a rejected listen address is told to look like.
pub(crate) const SOCKET_ADDR_EXPECTED: &str = "an IP address and port such as \"127.0.0.1:8080\" or \"[::1]:8080\"";

/// Listen addresses are parsed at load time, not at bind time, so a typo is
/// reported with its key before anything starts.
fn deserialize_socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    struct AddrVisitor;
    impl Visitor<'_> for AddrVisitor {
        type Value = SocketAddr;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(SOCKET_ADDR_EXPECTED)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<SocketAddr, E> {
            v.trim()
                .parse()
                .map_err(|_| E::custom(value_error_message(format_args!("{v:?}"), SOCKET_ADDR_EXPECTED)))
        }
    }
    d.deserialize_str(AddrVisitor)
}

const NETWORK_EXPECTED: &str = "a network in CIDR notation, e.g. \"10.1.0.0/16\" or \"::1/128\"";

fn deserialize_networks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    let raw: Vec<String> = Deserialize::deserialize(d)?;
    raw.iter()
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| de::Error::custom(value_error_message(format_args!("{v:?}"), NETWORK_EXPECTED)))
        })
        .collect()
}

/// What `allowed-ips` takes.
const ADDRESSES_EXPECTED: &str = "an IP address or a network in CIDR form, e.g. \"192.0.2.7\" or \"10.0.0.0/8\"";

/// `allowed-ips`: networks, or single addresses (a /32 or /128 network).
fn deserialize_addresses<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    let raw: Vec<String> = Deserialize::deserialize(d)?;
    raw.iter()
        .map(|v| {
            let v = v.trim();
            v.parse::<ipnet::IpNet>()
                .or_else(|_| v.parse::<IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| de::Error::custom(value_error_message(format_args!("{v:?}"), ADDRESSES_EXPECTED)))
        })
        .collect()
}

/// A type that a configuration count can be.
trait WholeNumber: TryFrom<u64> {
    const MAX: u64;
}
impl WholeNumber for u16 {
    const MAX: u64 = u16::MAX as u64;
}
impl WholeNumber for u32 {
    const MAX: u64 = u32::MAX as u64;
}
impl WholeNumber for u64 {
    const MAX: u64 = u64::MAX;
}
impl WholeNumber for usize {
    const MAX: u64 = usize::MAX as u64;
}

/// Counts, sizes and ports are parsed strictly. The `config` crate on its own
/// would round `window = 1.5` to 2 and read `"true"` as 1; here a float, a
/// boolean, a negative or an out-of-range number is refused with its key.
/// Strings of digits are accepted because environment values are strings.
fn whole_number<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: WholeNumber,
{
    struct NumberVisitor<T>(std::marker::PhantomData<T>);
    impl<T: WholeNumber> NumberVisitor<T> {
        fn refuse<E: de::Error>(shown: impl fmt::Display) -> E {
            E::custom(value_error_message(
                shown,
                format_args!("a whole number from 0 to {}", T::MAX),
            ))
        }
    }
    impl<T: WholeNumber> Visitor<'_> for NumberVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a whole number from 0 to {}", T::MAX)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            T::try_from(v).map_err(|_| Self::refuse(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            let wide = u64::try_from(v).map_err(|_| Self::refuse(v))?;
            self.visit_u64(wide)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            Err(Self::refuse(v))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
            Err(Self::refuse(v))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            match v.trim().parse::<u64>() {
                Ok(n) => T::try_from(n).map_err(|_| Self::refuse(format_args!("{v:?}"))),
                Err(_) => Err(Self::refuse(format_args!("{v:?}"))),
            }
        }
    }
    d.deserialize_any(NumberVisitor(std::marker::PhantomData))
}

/// [`whole_number`] for an optional key (absent = `None` via `#[serde(default)]`).
fn optional_whole_number<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: WholeNumber,
{
    whole_number(d).map(Some)
}

const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Config {
    /// Outbound SMS stages and limits.
    pub sms: SmsConfig,
    /// Delivery-report storage and delivery.
    pub dlr: DlrConfig,
    /// Where the file and PostgreSQL backends keep their data.
    pub storage: StorageConfig,
    /// The SMPP server for ESMEs; no SMPP listener when absent.
    pub smpp: Option<SmppConfig>,
    /// The HTTP submission API; no HTTP listener when absent.
    pub http: Option<HttpConfig>,
    /// The admin HTTP endpoint (health, readiness, metrics).
    pub admin: AdminConfig,
    /// Logging.
    pub log: LogConfig,
    /// Upstream providers, `[[destinations]]`.
    pub destinations: Vec<DestinationConfig>,
    /// Routing rules, `[[routes]]`, first match wins.
    pub routes: Vec<RouteConfig>,
    /// Inbound (MO) messages from providers.
    pub mo: MoConfig,
    /// Inbound routing rules, `[[mo-routes]]`, first match wins.
    pub mo_routes: Vec<MoRouteConfig>,
    /// Applications' outbox tables Sendium relays SMS from.
    pub outbox: OutboxConfig,
    /// How a SIGTERM/SIGINT stop drains.
    pub shutdown: ShutdownConfig,
}

/// `[shutdown]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ShutdownConfig {
    /// Longest a stop waits for in-flight provider submissions and due receipts (and,
    /// on a non-durable pending stage, for the pipeline to send what it holds) before
    /// the process exits.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub timeout: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
        }
    }
}

/// `[sms]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SmsConfig {
    /// An incomplete multipart group fails this long after its first part
    /// (the absolute deadline is saved with each part, so a restart does not
    /// extend it).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub multipart_expiry: Duration,
    /// The longest a message is kept trying: a message whose destinations stay
    /// unreachable fails with an EXPIRED receipt this long after its acceptance, or at
    /// the `validity_period` its ESME gave if that comes first.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub max_age: Duration,
    /// `[sms.pending]`
    pub pending: PendingConfig,
    /// `[sms.router-queue]`
    pub router_queue: RouterQueueConfig,
    /// `[sms.routed-work]`
    pub routed_work: RoutedWorkConfig,
}

impl Default for SmsConfig {
    fn default() -> Self {
        Self {
            multipart_expiry: Duration::from_secs(10 * 60),
            max_age: Duration::from_secs(48 * 3600),
            pending: PendingConfig::default(),
            router_queue: RouterQueueConfig::default(),
            routed_work: RoutedWorkConfig::default(),
        }
    }
}

/// `[sms.pending]`: accepted messages, held until every branch is terminal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PendingConfig {
    /// Where accepted messages are kept.
    pub backend: StageBackend,
    /// Admission is refused (`ESME_RMSGQFUL` / HTTP 503) when this many
    /// messages are pending: a bound on memory and on recovery time.
    #[serde(deserialize_with = "whole_number")]
    pub max_messages: usize,
}

impl Default for PendingConfig {
    fn default() -> Self {
        Self {
            backend: StageBackend::Memory,
            max_messages: 500_000,
        }
    }
}

/// `[sms.router-queue]`: batches selected for routing.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RouterQueueConfig {
    /// Where selected batches are kept.
    pub backend: StageBackend,
    /// Units per select-and-stage: bounds how much of a backlog is loaded at once.
    #[serde(deserialize_with = "whole_number")]
    pub batch_size: usize,
}

impl Default for RouterQueueConfig {
    fn default() -> Self {
        Self {
            backend: StageBackend::Memory,
            batch_size: 512,
        }
    }
}

/// `[sms.routed-work]`: destinations chosen for each message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct RoutedWorkConfig {
    /// Where routing decisions are kept.
    pub backend: StageBackend,
    /// Routed messages held by the Router and destination workers at once.
    #[serde(deserialize_with = "whole_number")]
    pub max_in_flight: usize,
}

impl Default for RoutedWorkConfig {
    fn default() -> Self {
        Self {
            backend: StageBackend::Memory,
            max_in_flight: 20_000,
        }
    }
}

/// `[dlr]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DlrConfig {
    /// Where correlations and pending receipts are kept.
    pub backend: DlrBackend,
    /// Memory backend only: correlations kept; a receipt-requesting admission
    /// that cannot reserve one is refused.
    #[serde(deserialize_with = "whole_number")]
    pub capacity: usize,
    /// How long a correlation or an undelivered receipt is kept.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub retention: Duration,
    /// Only with `backend = "disabled"`: how a receipt request is answered.
    pub on_receipt_request: OnReceiptRequest,
    /// How long one HTTP receipt callback may take before it is retried.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub callback_timeout: Duration,
    /// Receipts whose provider id is not (yet) correlated are kept this long,
    /// because a provider may send the receipt before `submit_sm_resp` is processed.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub orphan_retention: Duration,
    /// How long a claimed receipt delivery stays hidden from other claimers. A claim
    /// whose result was never recorded (the process died mid-delivery) is delivered again
    /// after it; with `file` a restart releases such claims at once, with `postgresql`
    /// (shared by several processes) they wait for the lease.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub claim_lease: Duration,
}

impl Default for DlrConfig {
    fn default() -> Self {
        Self {
            backend: DlrBackend::Memory,
            capacity: 1_000_000,
            retention: Duration::from_secs(72 * 3600),
            on_receipt_request: OnReceiptRequest::Accept,
            callback_timeout: Duration::from_secs(5),
            orphan_retention: Duration::from_secs(10 * 60),
            claim_lease: Duration::from_secs(60),
        }
    }
}

/// `[storage]`
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct StorageConfig {
    /// `[storage.file]`
    pub file: FileStorageConfig,
    /// `[storage.postgresql]`
    pub postgresql: PostgresqlStorageConfig,
}

/// `[storage.file]`
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileStorageConfig {
    /// The exclusive-locked spool directory. No default: a durable spool in a
    /// guessed place would be lost with the container; required when any
    /// backend is `file`.
    pub dir: Option<PathBuf>,
}

/// `[storage.postgresql]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PostgresqlStorageConfig {
    /// Connection URL (may hold a password, hence [`Secret`]); required when
    /// any backend is `postgresql`.
    pub url: Option<Secret>,
    /// Connection pool size of each store (the outbound stages share one pool, the
    /// DLR store has its own).
    #[serde(deserialize_with = "whole_number")]
    pub max_connections: u32,
    /// The schema Sendium's tables live in (its `search_path`); the server's default
    /// when omitted.
    pub schema: Option<String>,
    /// Several Sendium processes serve this database's outbound stages, each with its
    /// share of the partitions (needs `dlr.backend = "postgresql"`); when false, one
    /// process serves it and a second is refused.
    pub shared: bool,
    /// How many partitions the outbound work is spread over (by account and
    /// destination number); every process on the database uses the same number.
    #[serde(deserialize_with = "whole_number")]
    pub partitions: u16,
}

impl Default for PostgresqlStorageConfig {
    fn default() -> Self {
        Self {
            url: None,
            max_connections: 8,
            schema: None,
            shared: false,
            partitions: 16,
        }
    }
}

/// `[smpp]`: the SMPP server for ESMEs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SmppConfig {
    /// Listen address.
    #[serde(deserialize_with = "deserialize_socket_addr")]
    pub listen: SocketAddr,
    /// Concurrent bound sessions, all accounts together.
    #[serde(deserialize_with = "whole_number")]
    pub max_connections: u32,
    /// Connections not bound yet, in total: a budget of their own, so they can never
    /// take the slots bound sessions need. When it is full, a new connection closes the
    /// oldest unbound one.
    #[serde(deserialize_with = "whole_number")]
    pub max_unbound: u32,
    /// Connections not bound yet from one address; more are closed at once.
    #[serde(deserialize_with = "whole_number")]
    pub max_unbound_per_address: u32,
    /// A PDU longer than this closes the session without allocating it, so a
    /// hostile length field cannot exhaust memory.
    #[serde(deserialize_with = "whole_number")]
    pub max_command_length: u32,
    /// Outstanding `submit_sm` per session before `ESME_RTHROTTLED`.
    #[serde(deserialize_with = "whole_number")]
    pub window: u32,
    /// A connection that has not bound within this time is closed.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub bind_timeout: Duration,
    /// A session with no traffic (not even `enquire_link`) for this long is closed.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub idle_timeout: Duration,
    /// How long to wait for `deliver_sm_resp` before the receipt is retried.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub deliver_timeout: Duration,
    /// `[[smpp.accounts]]`
    pub accounts: Vec<SmppAccount>,
    /// `[smpp.tls]`: a TLS listener beside the plain one.
    pub tls: Option<tls::SmppTlsConfig>,
}

impl Default for SmppConfig {
    fn default() -> Self {
        Self {
            listen: loopback(2775),
            max_connections: 1024,
            max_unbound: 256,
            max_unbound_per_address: 16,
            max_command_length: 16_384,
            window: 100,
            bind_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            deliver_timeout: Duration::from_secs(10),
            accounts: Vec::new(),
            tls: None,
        }
    }
}

fn default_max_binds() -> u32 {
    4
}

/// `[[smpp.accounts]]`: one ESME account.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SmppAccount {
    /// The `system_id` the ESME binds with.
    pub system_id: String,
    /// The bind password.
    pub password: Secret,
    /// Messages per second; 0 = unlimited; above it `ESME_RTHROTTLED`.
    #[serde(default)]
    #[serde(deserialize_with = "whole_number")]
    pub max_tps: u32,
    /// Concurrent sessions for this account.
    #[serde(default = "default_max_binds")]
    #[serde(deserialize_with = "whole_number")]
    pub max_binds: u32,
    /// Addresses binds may come from (addresses or CIDR networks); empty = any. A bind
    /// from elsewhere gets `ESME_RBINDFAIL`.
    #[serde(default, deserialize_with = "deserialize_addresses")]
    pub allowed_ips: Vec<ipnet::IpNet>,
    /// Mutual TLS: binds must come over `[smpp.tls]` with a client certificate whose
    /// subject has these attributes, e.g. `CN=esme1` or `CN=esme1, O=Shop`.
    #[serde(default)]
    pub tls_subject: Option<String>,
}

/// `[http]`: the HTTP submission API.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct HttpConfig {
    /// Listen address.
    #[serde(deserialize_with = "deserialize_socket_addr")]
    pub listen: SocketAddr,
    /// The address HTTP providers reach this listener under (behind a proxy or NAT),
    /// e.g. `https://sms.example.com`: the base of `{callback}`. Unset: built from
    /// `listen`.
    pub public_url: Option<String>,
    /// Larger request bodies are refused before they are read whole.
    #[serde(deserialize_with = "whole_number")]
    pub max_body_bytes: usize,
    /// Open connections; more are closed as soon as they are accepted.
    #[serde(deserialize_with = "whole_number")]
    pub max_connections: u32,
    /// A request's headers must arrive within this (also how long an idle keep-alive
    /// connection stays open).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub header_timeout: Duration,
    /// A request's body must arrive within this once its headers did (408 otherwise).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub body_timeout: Duration,
    /// How long an idempotency key is remembered.
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub idempotency_retention: Duration,
    /// `[[http.api-keys]]`
    pub api_keys: Vec<ApiKey>,
    /// `[[http.sendsms-users]]`: who may call the Kannel-compatible `/cgi-bin/sendsms`.
    pub sendsms_users: Vec<SendsmsUser>,
    /// Networks receipt callbacks may reach although they are loopback, link-local,
    /// private or otherwise internal (refused by default).
    #[serde(deserialize_with = "deserialize_networks")]
    pub callback_allow: Vec<ipnet::IpNet>,
    /// `[http.tls]`: serve HTTPS on `listen`.
    pub tls: Option<tls::TlsConfig>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: loopback(8080),
            public_url: None,
            max_body_bytes: 65_536,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idempotency_retention: Duration::from_secs(24 * 3600),
            api_keys: Vec::new(),
            sendsms_users: Vec::new(),
            callback_allow: Vec::new(),
            tls: None,
        }
    }
}

/// `[[http.api-keys]]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ApiKey {
    /// The bearer key.
    pub key: Secret,
    /// The `[[smpp.accounts]]` system-id the submissions belong to (for
    /// routing, receipts and limits).
    pub account: String,
    /// Addresses requests with this key may come from; empty = any. A request from
    /// elsewhere gets 403.
    #[serde(default, deserialize_with = "deserialize_addresses")]
    pub allowed_ips: Vec<ipnet::IpNet>,
}

/// `[[http.sendsms-users]]`: a Kannel `sendsms-user`. Applications that called Kannel's
/// `/cgi-bin/sendsms` keep their `username` and `password` parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SendsmsUser {
    /// The `username` (or `user`) parameter.
    pub username: String,
    /// The `password` (or `pass`) parameter, compared in constant time.
    pub password: Secret,
    /// The `[[smpp.accounts]]` system-id the messages belong to (routes, limits,
    /// receipts).
    pub account: String,
    /// Addresses requests of this user may come from; empty = any (Kannel's
    /// `user-allow-ip`). A request from elsewhere is refused like a wrong password.
    #[serde(default, deserialize_with = "deserialize_addresses")]
    pub allowed_ips: Vec<ipnet::IpNet>,
}

/// `[outbox]`
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct OutboxConfig {
    /// `[[outbox.sources]]`
    pub sources: Vec<OutboxSourceConfig>,
}

/// `[[outbox.sources]]`: one application database whose outbox table Sendium relays.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct OutboxSourceConfig {
    /// Names the source in metrics, `/admin/outbox` and `sendium outbox` commands.
    pub name: String,
    /// `postgres://…` or `sqlite:///path/to/app.db` (may hold a password, hence
    /// [`Secret`]).
    pub url: Secret,
    /// The outbox table in that database.
    #[serde(default = "default_outbox_table")]
    pub table: String,
    /// Parallel relay workers; several Sendium processes on one PostgreSQL source split
    /// them. Every process relaying a source uses the same number; 1 for SQLite.
    #[serde(default = "default_outbox_partitions", deserialize_with = "whole_number")]
    pub partitions: u16,
    /// Rows one delivery takes at most.
    #[serde(default = "default_outbox_batch_size", deserialize_with = "whole_number")]
    pub batch_size: u32,
    /// How long relayed rows are kept (marked `relayed`); 0 deletes them at once.
    #[serde(default, deserialize_with = "crate::duration::deserialize")]
    pub retention: Duration,
    /// Permanent refusals (unknown account, invalid number, empty body) before a row
    /// is dead.
    #[serde(default = "default_outbox_max_attempts", deserialize_with = "whole_number")]
    pub max_attempts: u32,
    /// Longest a committed row waits when its commit's notification is missed
    /// (SQLite has none: this is its polling interval).
    #[serde(
        default = "default_outbox_poll_interval",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub poll_interval: Duration,
    /// Backoff after a refusal or a failing database doubles up to this.
    #[serde(
        default = "default_outbox_max_backoff",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub max_backoff: Duration,
}

fn default_outbox_table() -> String {
    "sendium_outbox".into()
}

fn default_outbox_partitions() -> u16 {
    1
}

fn default_outbox_batch_size() -> u32 {
    500
}

fn default_outbox_max_attempts() -> u32 {
    5
}

fn default_outbox_poll_interval() -> Duration {
    Duration::from_secs(1)
}

fn default_outbox_max_backoff() -> Duration {
    Duration::from_secs(60)
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct AdminConfig {
    /// Listen address; loopback by default.
    #[serde(deserialize_with = "deserialize_socket_addr")]
    pub listen: SocketAddr,
    /// Bearer token; required when `listen` is not a loopback address.
    pub token: Secret,
    /// `[admin.tls]`: serve HTTPS on `listen`.
    pub tls: Option<tls::TlsConfig>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: loopback(9090),
            token: Secret::default(),
            tls: None,
        }
    }
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogConfig {
    /// Verbosity.
    pub level: LogLevel,
    /// Line format.
    pub format: LogFormat,
}

fn default_destination_window() -> u32 {
    50
}
pub(crate) fn default_dlr_delay_ms() -> u64 {
    100
}
pub(crate) fn default_enquire_link_interval() -> Duration {
    Duration::from_secs(30)
}
fn default_response_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_reconnect_min() -> Duration {
    Duration::from_secs(1)
}
fn default_failover_after() -> Duration {
    Duration::from_secs(10)
}

fn default_reconnect_max() -> Duration {
    Duration::from_secs(30)
}

/// `[[destinations]]`: one upstream provider.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DestinationConfig {
    /// Name used by routes, logs and metric labels.
    pub name: String,
    /// What it is.
    pub kind: DestinationKind,
    /// SMSC host name or address (required for `kind = "smpp"`).
    #[serde(default)]
    pub host: Option<String>,
    /// SMSC port (required for `kind = "smpp"`).
    #[serde(default)]
    #[serde(deserialize_with = "optional_whole_number")]
    pub port: Option<u16>,
    /// The `system_id` to bind with (required for `kind = "smpp"`).
    #[serde(default)]
    pub system_id: Option<String>,
    /// The bind password.
    #[serde(default)]
    pub password: Secret,
    /// The bind `system_type`.
    #[serde(default)]
    pub system_type: String,
    /// Session layout.
    #[serde(default)]
    pub bind: BindMode,
    /// Outstanding `submit_sm` per session.
    #[serde(default = "default_destination_window")]
    #[serde(deserialize_with = "whole_number")]
    pub window: u32,
    /// Messages per second; 0 = unlimited.
    #[serde(default)]
    #[serde(deserialize_with = "whole_number")]
    pub max_tps: u32,
    /// How receipt ids are compared with `submit_sm_resp` ids.
    #[serde(default)]
    pub id_format: IdFormat,
    /// Simulator only: delay before the DELIVRD receipt.
    #[serde(default = "default_dlr_delay_ms")]
    #[serde(deserialize_with = "whole_number")]
    pub dlr_delay_ms: u64,
    /// `enquire_link` period on an idle session.
    #[serde(
        default = "default_enquire_link_interval",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub enquire_link_interval: Duration,
    /// A request without a response for this long counts as failed (transient).
    #[serde(
        default = "default_response_timeout",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub response_timeout: Duration,
    /// First reconnect delay; doubled up to `reconnect-max`.
    #[serde(default = "default_reconnect_min", deserialize_with = "crate::duration::deserialize")]
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    #[serde(default = "default_reconnect_max", deserialize_with = "crate::duration::deserialize")]
    pub reconnect_max: Duration,
    /// SMPP only: TLS over the connection.
    #[serde(default)]
    pub tls: bool,
    /// SMPP with `tls`: PEM CA certificates to trust instead of the webpki roots.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// SMPP with `tls`: the name the SMSC's certificate must carry (and SNI); `host`
    /// when not set.
    #[serde(default)]
    pub tls_server_name: Option<String>,
    /// SMPP with `tls`: accept any certificate. Explicit opt-in, warned about at every
    /// connect.
    #[serde(default)]
    pub tls_insecure_skip_verify: bool,
    /// Work this destination holds moves to the next reachable destination of its route
    /// once the destination has been unreachable, or has kept throttling it, this long.
    /// (A submission left unanswered by a lost session or a response timeout moves at
    /// once.)
    #[serde(
        default = "default_failover_after",
        deserialize_with = "crate::duration::deserialize"
    )]
    pub failover_after: Duration,
    /// HTTP only: the provider's submission URL (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP only: the request method (POST or GET).
    #[serde(default)]
    pub method: Option<HttpMethod>,
    /// HTTP only: headers sent with every request; `${NAME}` in a value is replaced at
    /// load by the environment variable (an API key), and values are never shown.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// HTTP only, POST: how the fields are encoded.
    #[serde(default)]
    pub body: Option<HttpBody>,
    /// HTTP only: field name → template with `{from} {to} {text} {coding} {id}
    /// {callback}` placeholders; `from`, `to` and `text` when empty.
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
    /// HTTP only: RFC 6901 pointer to the provider's message id in its answer; without
    /// it Sendium's own part id is the provider id.
    #[serde(default)]
    pub id_pointer: Option<String>,
    /// HTTP only: whole text per request, or one request per SMS part.
    #[serde(default)]
    pub parts: HttpParts,
    /// HTTP only: the shared secret receipts posted back are checked with (`${NAME}`
    /// allowed); empty refuses every receipt.
    /// (Named apart from its key so a printed `Config` shows no word "secret".)
    #[serde(default, rename = "receipt-secret")]
    pub receipt_key: Secret,
    /// HTTP only: how `receipt-secret` is presented.
    #[serde(default)]
    pub receipt_signature: ReceiptSignature,
    /// HTTP only: the provider's status words and the receipt state each stands for.
    #[serde(default)]
    pub receipt_status: BTreeMap<String, ReceiptState>,
    /// HTTP only: pointer to the provider's message id in a receipt it posts.
    #[serde(default)]
    pub receipt_id_pointer: Option<String>,
    /// HTTP only: pointer to the status word in a receipt it posts.
    #[serde(default)]
    pub receipt_status_pointer: Option<String>,
    /// HTTP only: pointer to the provider's error code in a receipt it posts (optional).
    #[serde(default)]
    pub receipt_error_pointer: Option<String>,
}

impl DestinationConfig {
    /// An HTTP destination whose `url` is `https://`: TLS by its url, `tls-ca` allowed.
    pub fn is_https(&self) -> bool {
        self.kind == DestinationKind::Http && self.url.as_deref().is_some_and(|u| u.starts_with("https://"))
    }
}

fn default_route_account() -> String {
    "*".to_owned()
}

/// `[mo]`: inbound (mobile-originated) messages.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct MoConfig {
    /// The answer to a provider for a message no `[[mo-routes]]` entry matches.
    pub unrouted: MoUnrouted,
    /// A multipart inbound message still missing parts this long after its first part
    /// arrived is delivered with the parts it has, marked incomplete (the deadline is
    /// saved with the parts, so a restart does not extend it).
    #[serde(deserialize_with = "crate::duration::deserialize")]
    pub multipart_expiry: Duration,
}

impl Default for MoConfig {
    fn default() -> Self {
        Self {
            unrouted: MoUnrouted::Ack,
            multipart_expiry: Duration::from_secs(10 * 60),
        }
    }
}

/// `[[mo-routes]]`: where inbound messages go; see [`crate::MoRouteTable`]. Every
/// condition given must match; a rule without conditions matches every message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MoRouteConfig {
    /// Used by logs, metrics and `/admin`.
    pub name: String,
    /// Leading digits of the number the subscriber wrote to (`+` and a leading `00`
    /// ignored on both sides, as in `[[routes]]`).
    #[serde(default)]
    pub destination_prefix: Option<String>,
    /// A regular expression the whole number the subscriber wrote to must match
    /// (anchor it yourself: `^…$`); instead of `destination-prefix`.
    #[serde(default)]
    pub destination_regex: Option<String>,
    /// Only messages from this `[[destinations]]` entry (the provider connection).
    #[serde(default)]
    pub from_destination: Option<String>,
    /// The text's first word, compared ignoring case.
    #[serde(default)]
    pub keyword: Option<String>,
    /// Deliver as `deliver_sm` to a bound receiver or transceiver session of this
    /// `[[smpp.accounts]]` system-id (held until one binds, within `dlr.retention`).
    #[serde(default)]
    pub to_account: Option<String>,
    /// POST as JSON to this `http://` or `https://` URL, retried with backoff within
    /// `dlr.retention`.
    #[serde(default)]
    pub to_url: Option<String>,
}

/// `[[routes]]`: one routing rule; see [`crate::RouteTable`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RouteConfig {
    /// Name used by logs and metrics.
    pub name: String,
    /// Account system-id this rule applies to, or `*` for every account.
    #[serde(default = "default_route_account")]
    pub account: String,
    /// Leading digits of the destination address (`+` and a leading `00` are
    /// ignored on both sides); `""` matches every number.
    #[serde(default)]
    pub destination_prefix: String,
    /// A regular expression the whole destination address must match (anchor it:
    /// `^…$`).
    #[serde(default)]
    pub destination_regex: Option<String>,
    /// Leading characters of the sender address (`+` and a leading `00` ignored as
    /// for destinations); `""` matches every sender.
    #[serde(default)]
    pub source_prefix: String,
    /// A regular expression the sender address must match.
    #[serde(default)]
    pub source_regex: Option<String>,
    /// A regular expression the message's text must match (read only when some rule
    /// has one; binary messages never match).
    #[serde(default)]
    pub text_regex: Option<String>,
    /// First reachable destination; the rest are failover.
    pub to: Vec<String>,
    /// Extra branches (fan-out), each delivered and tracked separately.
    #[serde(default)]
    pub copy_to: Vec<String>,
    /// 0 (default) to [`MAX_ROUTE_PRIORITY`]: a destination's queued messages go to it
    /// highest priority first, in arrival order within one priority.
    #[serde(default)]
    pub priority: u8,
}

/// The highest `[[routes]] priority`.
pub const MAX_ROUTE_PRIORITY: u8 = 9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_list_choices() {
        for b in StageBackend::ALL {
            assert_eq!(StageBackend::from_word(b.as_str()), Some(*b));
        }
        assert_eq!(StageBackend::from_word("MEMORY"), Some(StageBackend::Memory));
        assert_eq!(StageBackend::from_word("fil"), None);
        assert_eq!(StageBackend::expected(), "one of memory, file, postgresql");
        assert_eq!(DlrBackend::expected(), "one of memory, file, postgresql, disabled");
        assert_eq!(BindMode::TransmitterReceiver.to_string(), "transmitter+receiver");
        assert_eq!(IdFormat::expected(), "one of auto, hex, dec, exact");
    }

    #[test]
    fn secrets_are_redacted_and_compare_in_constant_time() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        assert!(s.matches(b"hunter2"));
        assert!(!s.matches(b"hunter"));
        assert_eq!(s, Secret::new("hunter2"));
        assert_ne!(s, Secret::new("hunter3"));
        assert!(Secret::default().is_empty());
        let a = SmppAccount {
            system_id: "x".into(),
            password: s,
            max_tps: 0,
            max_binds: 4,
            allowed_ips: Vec::new(),
            tls_subject: None,
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let c = Config::default();
        assert_eq!(c.sms.pending.backend, StageBackend::Memory);
        assert_eq!(c.sms.pending.max_messages, 500_000);
        assert_eq!(c.sms.router_queue.batch_size, 512);
        assert_eq!(c.sms.routed_work.max_in_flight, 20_000);
        assert_eq!(c.sms.multipart_expiry, Duration::from_secs(600));
        assert_eq!(c.dlr.backend, DlrBackend::Memory);
        assert_eq!(c.dlr.capacity, 1_000_000);
        assert_eq!(c.dlr.retention, Duration::from_secs(72 * 3600));
        assert_eq!(c.dlr.on_receipt_request, OnReceiptRequest::Accept);
        assert_eq!(c.dlr.callback_timeout, Duration::from_secs(5));
        assert_eq!(c.dlr.orphan_retention, Duration::from_secs(600));
        assert_eq!(c.storage.postgresql.max_connections, 8);
        assert_eq!(c.admin.listen, "127.0.0.1:9090".parse().unwrap());
        assert!(c.admin.token.is_empty());
        assert_eq!(c.log.level, LogLevel::Info);
        assert_eq!(c.log.format, LogFormat::Text);
        assert!(c.smpp.is_none() && c.http.is_none());
        let s = SmppConfig::default();
        assert_eq!(s.listen, "127.0.0.1:2775".parse().unwrap());
        assert_eq!((s.max_connections, s.max_command_length, s.window), (1024, 16_384, 100));
        assert_eq!((s.max_unbound, s.max_unbound_per_address), (256, 16));
        assert_eq!(
            (s.bind_timeout, s.idle_timeout, s.deliver_timeout),
            (
                Duration::from_secs(5),
                Duration::from_secs(120),
                Duration::from_secs(10)
            )
        );
        let h = HttpConfig::default();
        assert_eq!(h.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(h.max_body_bytes, 65_536);
        assert_eq!(h.max_connections, 1024);
        assert_eq!(
            (h.header_timeout, h.body_timeout),
            (Duration::from_secs(10), Duration::from_secs(10))
        );
        assert!(h.callback_allow.is_empty());
        assert_eq!(h.idempotency_retention, Duration::from_secs(86_400));
    }
}
