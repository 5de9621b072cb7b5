//! Sendium's configuration: the TOML model, environment overrides,
//! validation, the supported storage profiles with their restart guarantees,
//! and the routing table.
//!
//! Startup goes through [`load`] (or [`load_with_env`] in tests), which parses,
//! applies `SENDIUM__…` overrides and [`validate`]s, so a [`Config`] obtained
//! from it is known to be accepted: every error names the
//! full key and, for enumerations, the allowed values, and an unimplemented
//! storage profile is refused rather than silently run with weaker guarantees.
//!
//! This crate depends on neither `storage` nor `protocols`; `actors` converts
//! its plain types into theirs.

#![forbid(unsafe_code)]

pub mod duration;
mod error;
mod load;
mod mo_routing;
mod model;
mod profile;
mod routing;
mod validate;

pub use error::ConfigError;
pub use load::{ENV_PREFIX, ENV_SEPARATOR, QUICKSTART, load, load_str, load_str_with_env, load_with_env};
pub use mo_routing::{MoMessage, MoRoute, MoRouteError, MoRouteTable, MoTarget, keyword_of};
pub use model::SendsmsUser;
pub use model::http::{PLACEHOLDERS, TemplateError, TemplatePiece, default_fields, is_json_pointer, parse_template};
pub use model::tls::{SmppTlsConfig, TlsConfig};
pub use model::{
    AdminConfig, ApiKey, BindMode, Config, DestinationConfig, DestinationKind, DlrBackend, DlrConfig,
    FileStorageConfig, HttpBody, HttpConfig, HttpMethod, HttpParts, IdFormat, LogConfig, LogFormat, LogLevel,
    MAX_ROUTE_PRIORITY, MoConfig, MoRouteConfig, MoUnrouted, OnReceiptRequest, OutboxConfig, OutboxSourceConfig,
    PendingConfig, PostgresqlStorageConfig, ReceiptSignature, ReceiptState, RouteConfig, RoutedWorkConfig,
    RouterQueueConfig, Secret, ShutdownConfig, SmppAccount, SmppConfig, SmsConfig, StageBackend, StorageConfig,
};
pub use profile::{
    DLR_GUARANTEES, Guarantee, IMPLEMENTED_DLR, IMPLEMENTED_OUTBOUND, OUTBOUND_GUARANTEES, StorageProfile,
    check_supported, documented_guarantee, guarantee_table, implemented_profiles,
};
pub use routing::{Route, RouteQuery, RouteTable, normalize_address};
pub use validate::{MAX_COMMAND_LENGTH, MIN_COMMAND_LENGTH, validate};
