//! TLS keys: `[smpp.tls]`, `[http.tls]`, `[admin.tls]`, and the `tls-*` keys of an SMPP
//! destination. The files are read when the gateway starts and at each reload (see the
//! actors crate); here they are only paths.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// `[smpp.tls]`: a second SMPP listener that speaks TLS, beside the plain `smpp.listen`,
/// with the same accounts, limits and sessions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SmppTlsConfig {
    /// Listen address of the TLS listener (must differ from `smpp.listen`).
    #[serde(deserialize_with = "super::deserialize_socket_addr")]
    pub listen: SocketAddr,
    /// PEM certificate chain, leaf first (e.g. a `fullchain.pem`).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates: when set, every TLS connection must present a client
    /// certificate that chains to one of them (mutual TLS; see the accounts' `tls-subject`).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// `[http.tls]` / `[admin.tls]`: the listener serves HTTPS instead of HTTP on its
/// `listen` address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}
