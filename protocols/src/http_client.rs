//! A lean HTTP/1.1 client for many short requests: one request at a time per connection, idle
//! keep-alive connections pooled per origin, and each connection driven by the request using it.
//!
//! Built on `hyper::client::conn::http1` instead of a general client (reqwest, hyper-util's
//! pooled client) because a receipt callback is a small JSON POST whose own work is a few
//! hundred bytes of I/O: the layers around it (header maps merged with the client's defaults, a
//! boxed resolver, the pool's checkout machinery, a task per connection with wake-ups between
//! it and the caller) cost more CPU than the exchange. Here a request is one header map, a pop
//! from a per-origin list under a mutex, and polls of the connection from the caller's own task.
//!
//! What it keeps from a general client, and how:
//!
//! - **Reuse.** A connection goes back to its origin's pool (at most
//!   [`Config::max_idle_per_origin`]) only once its answer was read to the end, the answer did
//!   not say `Connection: close`, and hyper still considers the connection open. An idle
//!   connection is not polled while pooled: whatever happened to it meanwhile (the peer closed
//!   it, sent something unexpected) is read when it is taken out, before the request is handed
//!   to it, and such a connection is dropped for the next one or a new one. Idle connections
//!   older than [`Config::idle_timeout`] are closed (when taken out, and by a sweep every half
//!   of that time), so sockets whose peer went away are not held for good.
//! - **Stale connections.** See [`Resend`]: a request hyper hands back unsent goes again on a
//!   new connection; one written on a reused connection that closed before any answer goes
//!   again only when the caller says it may reach the server twice.
//! - **Addresses.** An [`AddressPolicy`] decides which IPs may be reached: a target whose host
//!   is an address the policy refuses fails with [`Error::Forbidden`] without connecting; a
//!   host name is resolved once per new connection, the refused addresses dropped, and only the
//!   rest are connected to (in order) — no second resolution between check and connect.
//! - **Limits.** One deadline ([`Config::timeout`]) covers resolving, connecting, TLS, the
//!   request, the answer and its body; the body is read up to [`Config::max_body`].
//! - **TLS** through rustls with the ring provider, the server name checked, ALPN `http/1.1`.
//!   The certificate chain is checked against the webpki roots or, with [`Trust::CaFile`],
//!   against a PEM file's CA certificates only (a provider behind a private CA); that file
//!   is read again when it changes, checked at each new connection, so a renewed CA needs no
//!   restart.
//!
//! Not followed: redirects (a 3xx is an answer like any other). Not spoken: HTTP/2, proxies,
//! compression. Nothing here logs: errors name no URL, so a caller cannot leak a query string
//! by printing one.

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, poll_fn};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{AUTHORIZATION, CONNECTION, CONTENT_LENGTH, HOST, HeaderName, HeaderValue, USER_AGENT};
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::Full;
use hyper::body::Body as _;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::callback::CallbackTargets;
use crate::tls::ClientStream;

/// How a [`HttpClient`] behaves. [`Config::default`] suits short API calls.
#[derive(Clone, Debug)]
pub struct Config {
    /// The longest one request takes, all in: resolving, connecting, TLS, writing, the answer
    /// and its body. A request that outlasts it fails with [`Error::Timeout`] and its
    /// connection is closed (HTTP/1.1 cannot abandon an answer and keep the connection).
    pub timeout: Duration,
    /// Sent as `User-Agent` unless the request carries its own.
    pub user_agent: HeaderValue,
    /// Idle keep-alive connections kept per origin; a connection coming back to a full list
    /// is closed. As many as requests to one origin are in flight at once saves every
    /// connect without holding sockets nobody will use.
    pub max_idle_per_origin: usize,
    /// An idle connection unused this long is closed: servers close theirs after a while
    /// (often 5–75 s), and a pool that kept them would hold dead sockets.
    pub idle_timeout: Duration,
    /// An answer's body is read up to this many bytes; a longer one is cut there (see
    /// [`Response::truncated`]) and its connection closed instead of read to the end.
    pub max_body: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(30),
            user_agent: HeaderValue::from_static(concat!("sendium/", env!("CARGO_PKG_VERSION"))),
            max_idle_per_origin: 64,
            idle_timeout: Duration::from_secs(90),
            max_body: 64 * 1024,
        }
    }
}

/// Which addresses a client may connect to: the guard that keeps requests whose URL an
/// outside party chose (receipt callbacks) out of the operator's own network.
pub trait AddressPolicy: Send + Sync + 'static {
    /// Whether the client may connect to `ip`.
    fn permits(&self, ip: IpAddr) -> bool;
}

impl AddressPolicy for CallbackTargets {
    fn permits(&self, ip: IpAddr) -> bool {
        CallbackTargets::permits(self, ip)
    }
}

/// Every address may be reached: for endpoints the operator configured.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyAddress;

impl AddressPolicy for AnyAddress {
    fn permits(&self, _ip: IpAddr) -> bool {
        true
    }
}

/// A parsed `http://` or `https://` URL, with what each request to it needs already built
/// (origin, `Host` value, request target, TLS server name). Cheap to clone: parse one once and
/// keep it.
///
/// Its `Debug` shows the origin only: a path or query string may carry secrets.
#[derive(Clone)]
pub struct Target(Arc<TargetParts>);

struct TargetParts {
    origin: Origin,
    /// The request target in origin form: path and query, no fragment.
    uri: Uri,
    /// `host[:port]`, the port only when it is not the scheme's default.
    host_header: HeaderValue,
    /// `https` only.
    server_name: Option<ServerName<'static>>,
    /// `Authorization: Basic` from the URL's user information (`https://user:pass@host/`),
    /// sent as reqwest and browsers do; marked sensitive.
    authorization: Option<HeaderValue>,
}

/// What connections are pooled by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Origin {
    tls: bool,
    host: Host,
    port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Host {
    Ip(IpAddr),
    /// As the URL standard maps it (lowercase, IDNA to ASCII).
    Name(Box<str>),
}

/// Why a URL cannot be a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("not a URL")]
    Parse(#[source] url::ParseError),
    #[error("not an http:// or https:// URL with a host")]
    NotHttp,
    #[error("the URL's host cannot be sent in a request")]
    Host,
    #[error("the URL's path or query cannot be sent in a request")]
    Path,
    #[error("the URL's user name or password is not UTF-8 once percent-decoded")]
    UserInfo,
}

impl Target {
    /// Parse `raw` (see [`Target::from_url`]).
    pub fn parse(raw: &str) -> Result<Target, TargetError> {
        Target::from_url(&url::Url::parse(raw).map_err(TargetError::Parse)?)
    }

    /// The target a parsed URL names; its fragment is not sent.
    pub fn from_url(url: &url::Url) -> Result<Target, TargetError> {
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(TargetError::NotHttp),
        };
        let host = match url.host() {
            Some(url::Host::Ipv4(ip)) => Host::Ip(ip.into()),
            Some(url::Host::Ipv6(ip)) => Host::Ip(ip.into()),
            Some(url::Host::Domain(name)) => Host::Name(name.into()),
            None => return Err(TargetError::NotHttp),
        };
        let port = url.port_or_known_default().ok_or(TargetError::NotHttp)?;
        let host_str = url.host_str().ok_or(TargetError::NotHttp)?;
        // The URL standard drops a port that is the scheme's default: `port()` is then None.
        let host_header = match url.port() {
            Some(port) => HeaderValue::try_from(format!("{host_str}:{port}")),
            None => HeaderValue::try_from(host_str),
        }
        .map_err(|_| TargetError::Host)?;
        let path = &url[url::Position::BeforePath..url::Position::AfterQuery];
        let uri = Uri::try_from(if path.is_empty() { "/" } else { path }).map_err(|_| TargetError::Path)?;
        let server_name = match (&host, tls) {
            (_, false) => None,
            (Host::Ip(ip), true) => Some(ServerName::IpAddress((*ip).into())),
            (Host::Name(name), true) => Some(ServerName::try_from(name.to_string()).map_err(|_| TargetError::Host)?),
        };
        Ok(Target(Arc::new(TargetParts {
            origin: Origin { tls, host, port },
            uri,
            host_header,
            server_name,
            authorization: basic_auth(url)?,
        })))
    }
}

/// The `Authorization: Basic` value of a URL's user information, if it has any.
fn basic_auth(url: &url::Url) -> Result<Option<HeaderValue>, TargetError> {
    if url.username().is_empty() && url.password().is_none() {
        return Ok(None);
    }
    let mut credentials = percent_decode(url.username()).ok_or(TargetError::UserInfo)?;
    credentials.push(':');
    if let Some(password) = url.password() {
        credentials.push_str(&percent_decode(password).ok_or(TargetError::UserInfo)?);
    }
    let mut value = HeaderValue::try_from(format!("Basic {}", base64(credentials.as_bytes())))
        .map_err(|_| TargetError::UserInfo)?;
    value.set_sensitive(true);
    Ok(Some(value))
}

/// `raw` with its `%XX` escapes decoded; `None` when that is not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes.get(i + 1..i + 3).filter(|_| bytes[i] == b'%').and_then(|hex| {
            let hex = std::str::from_utf8(hex).ok()?;
            u8::from_str_radix(hex, 16).ok()
        });
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Standard base64 with padding (RFC 4648 §4), as `Basic` credentials are written.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * k)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.0.origin;
        let scheme = if o.tls { "https" } else { "http" };
        match &o.host {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "Target({scheme}://[{ip}]:{})", o.port),
            Host::Ip(ip) => write!(f, "Target({scheme}://{ip}:{})", o.port),
            Host::Name(name) => write!(f, "Target({scheme}://{name}:{})", o.port),
        }
    }
}

/// When a request whose connection failed goes again, once, on a new connection.
///
/// A pooled connection can be closed by its server at any moment (its keep-alive timeout, a
/// restart). When that is seen before the request is handed over, the connection is just
/// dropped for another. The remaining window: the request is handed over as the close
/// arrives. Then either hyper gives the request back unsent — it cannot have reached the
/// server — or it was written, and the connection closed before any answer: the server may
/// have dropped it unread (the usual case, an idle close racing the request) or have acted on
/// it and died before answering. Only the caller knows whether acting twice is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resend {
    /// Only a request hyper handed back unsent: never reaches the server twice. A request lost
    /// to the race fails with [`Error::Http`].
    IfUnsent,
    /// Also a request written on a reused connection that closed before any answer: for
    /// idempotent requests, and for those the receiver must take more than once anyway.
    IfUnanswered,
}

impl Resend {
    /// [`Resend::IfUnanswered`] for the methods HTTP defines as idempotent (RFC 9110 §9.2.2),
    /// [`Resend::IfUnsent`] for the rest.
    pub fn for_method(method: &Method) -> Resend {
        if method.is_idempotent() {
            Resend::IfUnanswered
        } else {
            Resend::IfUnsent
        }
    }
}

/// One request.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub method: Method,
    pub target: &'a Target,
    /// Sent as given, after `Host` (always the target's) and before the default
    /// `User-Agent` and the URL's `Authorization` (only when these name none). `Content-Length` is set from the body
    /// (also `0` for an empty one, except on GET, HEAD, OPTIONS and TRACE).
    pub headers: &'a [(HeaderName, HeaderValue)],
    pub body: Bytes,
    pub resend: Resend,
}

impl<'a> Request<'a> {
    /// A request without extra headers, resent as [`Resend::for_method`] says.
    pub fn new(method: Method, target: &'a Target, body: Bytes) -> Self {
        let resend = Resend::for_method(&method);
        Request {
            method,
            target,
            headers: &[],
            body,
            resend,
        }
    }
}

/// An answer, its body read to the end or up to [`Config::max_body`].
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The body went on beyond [`Config::max_body`]: `body` holds its start, and the
    /// connection was closed instead of read on.
    pub truncated: bool,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The target's host is, or resolves only to, addresses the client's [`AddressPolicy`]
    /// refuses; nothing was connected to.
    #[error("the target's host is, or resolves only to, addresses this client may not reach")]
    Forbidden,
    #[error("cannot resolve the target's host")]
    Resolve(#[source] io::Error),
    #[error("cannot connect to the target")]
    Connect(#[source] io::Error),
    #[error("TLS handshake with the target failed")]
    Tls(#[source] io::Error),
    /// [`Trust::CaFile`]'s file cannot be read or used (it changed since the last
    /// connection); nothing was connected to.
    #[error("cannot use the trusted CA certificates")]
    Trust(#[source] crate::tls::TlsError),
    /// The exchange failed before the answer's head was in: the connection broke, the
    /// answer was not HTTP/1.1, or a new connection closed at once.
    #[error("HTTP exchange with the target failed")]
    Http(#[source] hyper::Error),
    /// The answer's head came (`status`) but its body broke off.
    #[error("the answer ({status}) broke off in its body")]
    Body {
        status: StatusCode,
        #[source]
        source: hyper::Error,
    },
    /// A new connection closed before the request could be handed to it.
    #[error("the connection closed before the request was sent")]
    Closed,
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
}

/// Why a client cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    #[error("cannot set up TLS")]
    Tls(#[source] rustls::Error),
}

/// The certificates a client's TLS connections are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// The webpki roots (the Mozilla CA list).
    WebPki,
    /// Only the CA certificates in this PEM file; errors name it `{key}.tls-ca` (`key` is
    /// the destination's configuration key, e.g. `destinations[2]`, as for SMPP TLS).
    CaFile { key: String, path: PathBuf },
}

impl Trust {
    /// Read and check what this trusts, as a client built with it would: a CA file that
    /// cannot be read, holds no certificate or one rustls refuses fails.
    pub fn check(&self) -> Result<(), crate::tls::TlsError> {
        match self {
            Trust::WebPki => Ok(()),
            Trust::CaFile { key, path } => ca_file_connector(key, path).map(drop),
        }
    }
}

/// How new TLS connections are set up.
enum Connector {
    Fixed(TlsConnector),
    /// Built from a CA file at the first new connection, and built again when the file
    /// differs from what it was built from (see [`FileStamp`]). A file that cannot be read
    /// fails connections, not the client, so it is picked up once it is fixed.
    CaFile {
        key: String,
        path: PathBuf,
        built: Mutex<Option<(FileStamp, TlsConnector)>>,
    },
}

/// What tells a changed file from the one read before, without reading it: besides length
/// and modification time, the inode (a file renamed into place) and the change time.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: (u64, i64, i64),
}

impl FileStamp {
    fn of(key: &str, path: &std::path::Path) -> Result<FileStamp, crate::tls::TlsError> {
        let meta = std::fs::metadata(path).map_err(|source| crate::tls::TlsError::Read {
            key: format!("{key}.tls-ca"),
            path: path.to_owned(),
            source,
        })?;
        #[cfg(unix)]
        let inode = {
            use std::os::unix::fs::MetadataExt;
            (meta.ino(), meta.ctime(), meta.ctime_nsec())
        };
        Ok(FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            inode,
        })
    }
}

impl Connector {
    fn new(trust: Trust, extra_roots: Vec<CertificateDer<'static>>) -> Result<Connector, BuildError> {
        match trust {
            Trust::WebPki => {
                let mut roots = rustls::RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                };
                for cert in extra_roots {
                    roots.add(cert).map_err(BuildError::Tls)?;
                }
                let tls =
                    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                        .with_safe_default_protocol_versions()
                        .map_err(BuildError::Tls)?
                        .with_root_certificates(roots)
                        .with_no_client_auth();
                Ok(Connector::Fixed(http1_connector(tls)))
            }
            Trust::CaFile { key, path } => Ok(Connector::CaFile {
                key,
                path,
                built: Mutex::new(None),
            }),
        }
    }

    /// The connector for a new connection; for a CA file, one that trusts its current
    /// content. A file that became unreadable fails the connection rather than leaving the
    /// old certificates trusted.
    fn current(&self) -> Result<TlsConnector, crate::tls::TlsError> {
        match self {
            Connector::Fixed(c) => Ok(c.clone()),
            Connector::CaFile { key, path, built } => {
                let stamp = FileStamp::of(key, path)?;
                if let Some((seen, connector)) = &*built.lock()
                    && *seen == stamp
                {
                    return Ok(connector.clone());
                }
                let connector = ca_file_connector(key, path)?;
                *built.lock() = Some((stamp, connector.clone()));
                Ok(connector)
            }
        }
    }
}

fn http1_connector(mut tls: rustls::ClientConfig) -> TlsConnector {
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(tls))
}

fn ca_file_connector(key: &str, path: &std::path::Path) -> Result<TlsConnector, crate::tls::TlsError> {
    let settings = crate::tls::ClientTlsSettings {
        server_name: String::new(),
        ca: Some(path.to_owned()),
        insecure_skip_verify: false,
        key: key.to_owned(),
    };
    Ok(http1_connector((*crate::tls::client_config(&settings)?).clone()))
}

/// The client; cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct HttpClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    policy: Arc<dyn AddressPolicy>,
    tls: Connector,
    pool: Mutex<Pool>,
}

#[derive(Default)]
struct Pool {
    /// Per origin, oldest first: taken from and returned to the end, so the connection
    /// taken is the one most recently known alive, and expired ones gather at the front.
    idle: HashMap<Origin, Vec<Conn>>,
    /// The sweep task was started (on the first connection pooled, inside a runtime).
    sweeping: bool,
}

impl HttpClient {
    /// A client connecting only where `policy` permits.
    pub fn new(config: Config, policy: Arc<dyn AddressPolicy>) -> Result<Self, BuildError> {
        Self::with_trust(config, policy, Trust::WebPki)
    }

    /// `new`, checking TLS servers against `trust`. A CA file is read at the first new
    /// connection, and a bad one fails connections until it is fixed; [`Trust::check`]
    /// reads it now.
    pub fn with_trust(config: Config, policy: Arc<dyn AddressPolicy>, trust: Trust) -> Result<Self, BuildError> {
        Ok(Self::build(config, policy, Connector::new(trust, Vec::new())?))
    }

    /// `new`, trusting `extra_roots` besides the webpki roots (tests: a local server's own
    /// certificate).
    #[cfg(test)]
    fn with_roots(
        config: Config,
        policy: Arc<dyn AddressPolicy>,
        extra_roots: Vec<CertificateDer<'static>>,
    ) -> Result<Self, BuildError> {
        Ok(Self::build(config, policy, Connector::new(Trust::WebPki, extra_roots)?))
    }

    fn build(config: Config, policy: Arc<dyn AddressPolicy>, tls: Connector) -> Self {
        HttpClient {
            inner: Arc::new(Inner {
                config,
                policy,
                tls,
                pool: Mutex::default(),
            }),
        }
    }

    /// Open a connection to `target` (resolve, connect, TLS) and pool it for the next
    /// request, within [`Config::timeout`]: whether requests can go there now, found
    /// without sending one.
    pub async fn open(&self, target: &Target) -> Result<(), Error> {
        let timeout = self.inner.config.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let open = async {
            let mut conn = self.inner.connect(target, deadline).await?;
            if !conn.ready().await {
                return Err(Error::Closed);
            }
            self.inner.checkin(&target.0.origin, conn);
            Ok(())
        };
        match tokio::time::timeout_at(deadline, open).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }

    /// Send `req` and read its answer, within [`Config::timeout`].
    pub async fn send(&self, req: &Request<'_>) -> Result<Response, Error> {
        let timeout = self.inner.config.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, self.inner.exchange(req, deadline)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}

impl Inner {
    /// One request: on the most recently pooled connection to its origin (dropping those
    /// found closed), else a new one; sent again once on a new connection as [`Resend`]
    /// allows when a reused connection failed under it.
    async fn exchange(self: &Arc<Self>, req: &Request<'_>, deadline: tokio::time::Instant) -> Result<Response, Error> {
        let origin = &req.target.0.origin;
        let mut may_reuse = true;
        loop {
            let pooled = if may_reuse { self.checkout(origin) } else { None };
            let reused = pooled.is_some();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => self.connect(req.target, deadline).await?,
            };
            if !conn.ready().await {
                // Closed while it was idle, or right after connecting: nothing was sent.
                if reused {
                    continue;
                }
                return Err(Error::Closed);
            }
            match conn.send(self.request(req), self.config.max_body).await {
                Ok(Answered { response, reusable }) => {
                    if reusable {
                        self.checkin(origin, conn);
                    }
                    return response;
                }
                Err(failure) => {
                    let again = match failure {
                        Failure::Unsent(_) => true,
                        Failure::Unanswered(_) => req.resend == Resend::IfUnanswered,
                        Failure::Failed(_) => false,
                    };
                    // Once, and on a new connection: the other pooled ones may be as stale.
                    if again && reused && may_reuse {
                        may_reuse = false;
                        continue;
                    }
                    return Err(Error::Http(failure.into_error()));
                }
            }
        }
    }

    /// The hyper request for `req`.
    fn request(&self, req: &Request<'_>) -> http::Request<Full<Bytes>> {
        let parts = &*req.target.0;
        let mut headers = HeaderMap::with_capacity(req.headers.len() + 2);
        headers.insert(HOST, parts.host_header.clone());
        for (name, value) in req.headers {
            if name != HOST {
                headers.append(name.clone(), value.clone());
            }
        }
        if !headers.contains_key(USER_AGENT) {
            headers.insert(USER_AGENT, self.config.user_agent.clone());
        }
        if let Some(authorization) = &parts.authorization {
            headers.entry(AUTHORIZATION).or_insert_with(|| authorization.clone());
        }
        // hyper sets the length of a body it has, and none for an empty one; some servers
        // answer a POST without one 411 Length Required.
        if req.body.is_empty() && !matches!(req.method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE) {
            headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        let mut request = http::Request::new(Full::new(req.body.clone()));
        *request.method_mut() = req.method.clone();
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = headers;
        request
    }

    /// The most recently pooled connection to `origin`, unless it idled too long.
    fn checkout(&self, origin: &Origin) -> Option<Conn> {
        let mut pool = self.pool.lock();
        let idle = pool.idle.get_mut(origin)?;
        let conn = idle.pop()?;
        if conn.idle_since.elapsed() < self.config.idle_timeout {
            return Some(conn);
        }
        // The most recent one expired: the older ones under it did too.
        idle.clear();
        None
    }

    /// Pool a connection whose answer was read to the end.
    fn checkin(self: &Arc<Self>, origin: &Origin, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let closed;
        let start_sweep;
        {
            let mut pool = self.pool.lock();
            start_sweep = !pool.sweeping;
            pool.sweeping = true;
            let max = self.config.max_idle_per_origin;
            closed = match pool.idle.get_mut(origin) {
                Some(idle) if idle.len() < max => {
                    idle.push(conn);
                    None
                }
                None if max > 0 => {
                    pool.idle.insert(origin.clone(), vec![conn]);
                    None
                }
                _ => Some(conn),
            };
        }
        drop(closed);
        // Outside a runtime nothing sweeps: expired connections are then closed when their
        // origin is next used.
        let runtime = start_sweep
            .then(tokio::runtime::Handle::try_current)
            .and_then(Result::ok);
        if let Some(runtime) = runtime {
            let every = (self.config.idle_timeout / 2).max(Duration::from_millis(10));
            runtime.spawn(sweep(Arc::downgrade(self), every));
        }
    }

    /// Close the connections idle longer than [`Config::idle_timeout`].
    fn sweep(&self) {
        let mut expired = Vec::new();
        {
            let mut pool = self.pool.lock();
            pool.idle.retain(|_, idle| {
                let live = idle
                    .iter()
                    .position(|c| c.idle_since.elapsed() < self.config.idle_timeout)
                    .unwrap_or(idle.len());
                expired.extend(idle.drain(..live));
                !idle.is_empty()
            });
        }
        drop(expired);
    }

    /// A new connection: resolved, checked against the policy, connected, TLS when `https`.
    async fn connect(&self, target: &Target, deadline: tokio::time::Instant) -> Result<Conn, Error> {
        let parts = &*target.0;
        let port = parts.origin.port;
        let addrs: Vec<SocketAddr> = match &parts.origin.host {
            Host::Ip(ip) if self.policy.permits(*ip) => vec![SocketAddr::new(*ip, port)],
            Host::Ip(_) => return Err(Error::Forbidden),
            Host::Name(name) => {
                let found: Vec<SocketAddr> = tokio::net::lookup_host((&**name, port))
                    .await
                    .map_err(Error::Resolve)?
                    .collect();
                if found.is_empty() {
                    return Err(Error::Resolve(io::Error::new(
                        io::ErrorKind::NotFound,
                        "the host name has no address",
                    )));
                }
                let allowed: Vec<SocketAddr> = found.into_iter().filter(|a| self.policy.permits(a.ip())).collect();
                if allowed.is_empty() {
                    return Err(Error::Forbidden);
                }
                allowed
            }
        };
        let tls = match parts.server_name {
            None => None,
            Some(_) => Some(self.tls.current().map_err(Error::Trust)?),
        };
        let tcp = connect_any(&addrs, deadline).await.map_err(Error::Connect)?;
        tcp.set_nodelay(true).map_err(Error::Connect)?;
        let stream = match (&parts.server_name, tls) {
            (Some(name), Some(tls)) => {
                ClientStream::Tls(Box::new(tls.connect(name.clone(), tcp).await.map_err(Error::Tls)?))
            }
            _ => ClientStream::Plain(tcp),
        };
        let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Http)?;
        Ok(Conn {
            sender,
            driver: Some(driver),
            idle_since: Instant::now(),
        })
    }
}

/// Closes expired idle connections every `every` until the client is gone.
async fn sweep(pool: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = pool.upgrade() else {
            return;
        };
        inner.sweep();
    }
}

/// Connect to the first of `addrs` that answers. With several, each try gets an equal share
/// of the time left, so one address that drops packets does not use up the whole request.
async fn connect_any(addrs: &[SocketAddr], deadline: tokio::time::Instant) -> io::Result<TcpStream> {
    let mut last = None;
    for (i, addr) in addrs.iter().enumerate() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let share = left / u32::try_from(addrs.len() - i).unwrap_or(u32::MAX);
        match tokio::time::timeout(share, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => return Ok(tcp),
            Ok(Err(e)) => last = Some(e),
            Err(_) => last = Some(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address to connect to")))
}

type Driver = Connection<TokioIo<ClientStream>, Full<Bytes>>;

/// One HTTP/1.1 connection: hyper's request handle and its connection future, which this
/// client polls itself from the task making the request instead of spawning it.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once the connection ended (closed or failed).
    driver: Option<Driver>,
    idle_since: Instant,
}

/// A request that got its answer's head.
struct Answered {
    response: Result<Response, Error>,
    /// The answer was read to the end and the connection may carry another request.
    reusable: bool,
}

/// A request that got no answer, by what may have reached the server.
enum Failure {
    /// hyper gave the request back: not a byte of it was written.
    Unsent(hyper::Error),
    /// Written (maybe partly) on a connection that then closed or reset before any answer.
    Unanswered(hyper::Error),
    /// Anything else, such as an answer that is not HTTP/1.1.
    Failed(hyper::Error),
}

impl Failure {
    fn of(mut e: hyper::client::conn::TrySendError<http::Request<Full<Bytes>>>) -> Failure {
        let unsent = e.take_message().is_some();
        let error = e.into_error();
        if unsent {
            Failure::Unsent(error)
        } else if error.is_incomplete_message() || error.is_canceled() || broken_connection(&error) {
            Failure::Unanswered(error)
        } else {
            Failure::Failed(error)
        }
    }

    fn into_error(self) -> hyper::Error {
        match self {
            Failure::Unsent(e) | Failure::Unanswered(e) | Failure::Failed(e) => e,
        }
    }
}

/// Whether `e` comes from the peer resetting or closing the socket under a write or read.
fn broken_connection(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe
            );
        }
        source = err.source();
    }
    false
}

impl Conn {
    /// Poll the connection's I/O (hyper's dispatcher: writing the request, reading the
    /// answer, noticing a close while idle); false once it ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let ended = self.driver.as_mut().is_some_and(|d| Pin::new(d).poll(cx).is_ready());
        if ended {
            // Dropping it closes the socket and fails whatever still waits on it.
            self.driver = None;
        }
        self.driver.is_some()
    }

    /// Whether the connection can take a request: false when it closed (while idle, the
    /// peer's close or unexpected bytes are read here).
    async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            if !self.drive(cx) {
                return Poll::Ready(false);
            }
            self.sender.poll_ready(cx).map(|r| r.is_ok())
        })
        .await
    }

    /// Send one request and read its answer, up to `max_body` bytes of body.
    async fn send(&mut self, req: http::Request<Full<Bytes>>, max_body: usize) -> Result<Answered, Failure> {
        let mut answer = pin!(self.sender.try_send_request(req));
        let head = poll_fn(|cx| {
            self.drive(cx);
            answer.as_mut().poll(cx)
        })
        .await;
        let (parts, mut body) = head.map_err(Failure::of)?.into_parts();
        let mut read = BodyRead::default();
        // The body first: a short one is usually in already (often empty), and each poll of
        // the connection costs more than the rest of reading it. The connection is polled
        // only when the body waits for it. Not after the end either: the next request's
        // `ready` polls it, which is when the dispatcher goes idle and takes a request.
        let end = poll_fn(|cx| {
            let mut drove = false;
            loop {
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(None) => return Poll::Ready(Ok(true)),
                    Poll::Ready(Some(Ok(frame))) => {
                        let fits = frame.into_data().map_or(true, |data| read.push(data, max_body));
                        if !fits {
                            return Poll::Ready(Ok(false));
                        }
                        drove = false;
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                    Poll::Pending if drove => return Poll::Pending,
                    Poll::Pending => {
                        self.drive(cx);
                        drove = true;
                    }
                }
            }
        })
        .await;
        let status = parts.status;
        let (response, complete) = match end {
            Ok(complete) => (
                Ok(Response {
                    status,
                    body: read.into_bytes(),
                    truncated: !complete,
                    headers: parts.headers,
                }),
                complete,
            ),
            Err(source) => (Err(Error::Body { status, source }), false),
        };
        let close = response.as_ref().is_ok_and(|r| says_close(&r.headers));
        let reusable = complete && !close && self.driver.is_some() && !self.sender.is_closed();
        Ok(Answered { response, reusable })
    }
}

/// Whether an answer's `Connection` header says `close`.
fn says_close(headers: &HeaderMap) -> bool {
    headers.get_all(CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")))
    })
}

/// An answer's body as it comes: most are one chunk, kept without a copy.
#[derive(Default)]
struct BodyRead {
    first: Option<Bytes>,
    more: BytesMut,
}

impl BodyRead {
    /// Add a chunk; false once `max` bytes are in and the chunk went beyond (what fits is kept).
    fn push(&mut self, mut data: Bytes, max: usize) -> bool {
        let have = self.first.as_ref().map_or(0, Bytes::len) + self.more.len();
        let fits = data.len() <= max.saturating_sub(have);
        if !fits {
            data.truncate(max.saturating_sub(have));
        }
        if data.is_empty() {
            return fits;
        }
        match self.first.take() {
            None if self.more.is_empty() => self.first = Some(data),
            first => {
                if let Some(first) = first {
                    self.more.extend_from_slice(&first);
                }
                self.more.extend_from_slice(&data);
            }
        }
        fits
    }

    fn into_bytes(self) -> Bytes {
        self.first.unwrap_or_else(|| self.more.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::body::Incoming;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A self-signed certificate (not a CA) for `localhost` and 127.0.0.1, valid 2025–2125,
    /// and its P-256 key: the local TLS server's, for tests only.
    const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBiTCCAS+gAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAlsb2NhbGhv
c3QwIBcNMjUwMTAxMDAwMDAwWhgPMjEyNTAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM
CWxvY2FsaG9zdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABL08o0vV4Ri7Pzzd
fhxU+eH0Tms4uYbq4vGdb1ilnD7MvucNf2ZnJEGF1P0B4pHK5FD2jDBIQNDcIVi3
+XJ0o+OjcDBuMBoGA1UdEQQTMBGCCWxvY2FsaG9zdIcEfwAAATAMBgNVHRMBAf8E
AjAAMBMGA1UdJQQMMAoGCCsGAQUFBwMBMA4GA1UdDwEB/wQEAwIHgDAdBgNVHQ4E
FgQU69MGEyOh4J0p5a1AKYOfJKKSCzQwCgYIKoZIzj0EAwIDSAAwRQIhAK83KAMd
xLLeCLMlYKYnNgiYgyo5yglbE1VRNAMN89oaAiBJcRb13V4NLTaY9UdrGQVa9/5Q
Tc8yK+erMau/FNIsRg==
-----END CERTIFICATE-----
";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg4CmNFFtx6gfTJFXv
AyQWWChm6NeKPeyqinyN3IRYoAehRANCAAS9PKNL1eEYuz883X4cVPnh9E5rOLmG
6uLxnW9YpZw+zL7nDX9mZyRBhdT9AeKRyuRQ9owwSEDQ3CFYt/lydKPj
-----END PRIVATE KEY-----
";

    /// What a test server saw.
    #[derive(Default)]
    struct Seen {
        accepted: AtomicUsize,
        requests: AtomicUsize,
        /// Connections that ended (the client closed them, or the server did).
        ended: AtomicUsize,
        /// The ALPN protocol of the last TLS connection.
        alpn: parking_lot::Mutex<Option<Vec<u8>>>,
        /// Method, request target and headers of each request.
        heads: parking_lot::Mutex<Vec<(Method, Uri, HeaderMap)>>,
    }

    struct Server {
        addr: SocketAddr,
        seen: Arc<Seen>,
    }

    impl Server {
        fn url(&self, path: &str) -> Target {
            Target::parse(&format!("http://{}{path}", self.addr)).unwrap()
        }
    }

    fn answer(status: u16, body: impl Into<Bytes>) -> http::Response<Full<Bytes>> {
        let mut r = http::Response::new(Full::new(body.into()));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    }

    fn server_tls() -> rustls::ServerConfig {
        let cert = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
        let key = PrivateKeyDer::from_pem_slice(KEY.as_bytes()).unwrap();
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }

    /// A hyper HTTP/1.1 keep-alive server on `ip`, answering with `handler`; over TLS with
    /// [`CERT`] when `tls`.
    async fn serve_on<F, Fut>(ip: &str, tls: bool, handler: F) -> Server
    where
        F: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
    {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let acceptor = tls.then(|| tokio_rustls::TlsAcceptor::from(Arc::new(server_tls())));
        let counts = seen.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                counts.accepted.fetch_add(1, Ordering::SeqCst);
                let (counts, handler, acceptor) = (counts.clone(), handler.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let in_service = counts.clone();
                    let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                        in_service.requests.fetch_add(1, Ordering::SeqCst);
                        in_service
                            .heads
                            .lock()
                            .push((req.method().clone(), req.uri().clone(), req.headers().clone()));
                        let answered = handler(req);
                        async move { Ok::<_, Infallible>(answered.await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        None => {
                            let _ = http.serve_connection(TokioIo::new(sock), service).await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(sock).await {
                                *counts.alpn.lock() = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                                let _ = http.serve_connection(TokioIo::new(tls), service).await;
                            }
                        }
                    }
                    counts.ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Server { addr, seen }
    }

    async fn serve<F, Fut>(handler: F) -> Server
    where
        F: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
    {
        serve_on("127.0.0.1", false, handler).await
    }

    /// What a raw server does with the n-th request (from 1) on a connection.
    #[derive(Clone, Copy)]
    enum Act {
        Answer,
        /// Close the connection without answering.
        Close,
        /// Never answer.
        Hang,
    }

    /// A server speaking just enough HTTP/1.1 to misbehave: each request gets `act(n)`; a
    /// connection idle for `idle_close` (after its first answer) is closed.
    async fn raw_server(idle_close: Option<Duration>, act: fn(usize) -> Act) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let counts = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                counts.accepted.fetch_add(1, Ordering::SeqCst);
                let counts = counts.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for n in 1.. {
                        let wait = if n > 1 { idle_close } else { None };
                        let read = read_request(&mut sock, &mut buf);
                        let got = match wait {
                            Some(idle) => tokio::time::timeout(idle, read).await.unwrap_or(false),
                            None => read.await,
                        };
                        if !got {
                            break;
                        }
                        counts.requests.fetch_add(1, Ordering::SeqCst);
                        match act(n) {
                            Act::Answer => {
                                let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                                if sock.write_all(answer).await.is_err() {
                                    break;
                                }
                            }
                            Act::Close => break,
                            Act::Hang => std::future::pending::<()>().await,
                        }
                    }
                    counts.ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Server { addr, seen }
    }

    /// Read one request (head, then `Content-Length` bytes of body) off `buf` and `sock`.
    async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + len {
                    buf.drain(..end + 4 + len);
                    return true;
                }
            }
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn client(config: Config) -> HttpClient {
        HttpClient::new(config, Arc::new(AnyAddress)).unwrap()
    }

    fn post<'a>(target: &'a Target, body: &'static str) -> Request<'a> {
        Request::new(Method::POST, target, Bytes::from_static(body.as_bytes()))
    }

    #[tokio::test]
    async fn sequential_requests_share_one_kept_alive_connection() {
        let server =
            serve(|req: http::Request<Incoming>| async move { answer(200, req.uri().path().to_owned()) }).await;
        let client = client(Config::default());
        for i in 0..20 {
            let target = server.url(&format!("/n{i}"));
            let r = client.send(&post(&target, "{}")).await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.body, format!("/n{i}"));
            assert!(!r.truncated);
        }
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 20);
        assert_eq!(
            server.seen.accepted.load(Ordering::SeqCst),
            1,
            "one connection for 20 requests"
        );
    }

    #[tokio::test]
    async fn a_request_carries_host_user_agent_type_and_length() {
        let server = serve(|_| async { answer(204, "") }).await;
        let client = client(Config::default());
        let target = server.url("/dlr?token=a%20b#frag");
        let json = [(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
        let body = r#"{"id":"1"}"#;
        let req = Request {
            headers: &json,
            ..post(&target, body)
        };
        assert_eq!(client.send(&req).await.unwrap().status, 204);
        let empty = post(&target, "");
        assert_eq!(client.send(&empty).await.unwrap().status, 204);
        let heads = server.seen.heads.lock();
        let (method, uri, headers) = &heads[0];
        assert_eq!(method, Method::POST);
        assert_eq!(uri, "/dlr?token=a%20b");
        let port = server.addr.port();
        assert_eq!(headers[HOST], format!("127.0.0.1:{port}").as_str());
        assert_eq!(headers[USER_AGENT], concat!("sendium/", env!("CARGO_PKG_VERSION")));
        assert_eq!(headers[http::header::CONTENT_TYPE], "application/json");
        assert_eq!(headers[http::header::CONTENT_LENGTH], body.len().to_string().as_str());
        let (_, _, headers) = &heads[1];
        assert_eq!(headers[http::header::CONTENT_LENGTH], "0", "an empty POST says so");
    }

    #[test]
    fn targets_carry_host_headers_and_origin_form_and_show_no_query() {
        let t = Target::parse("http://Example.COM:80/a/b?x=1#f").unwrap();
        assert_eq!(t.0.host_header, "example.com");
        assert_eq!(t.0.uri, "/a/b?x=1");
        assert!(t.0.server_name.is_none());
        let t = Target::parse("https://[::1]:8443").unwrap();
        assert_eq!(t.0.host_header, "[::1]:8443");
        assert_eq!(t.0.uri, "/");
        assert_eq!(t.0.origin.port, 8443);
        assert!(matches!(t.0.server_name, Some(ServerName::IpAddress(_))));
        let t = Target::parse("https://hooks.example.net/cb?secret=s3cr3t").unwrap();
        assert_eq!(t.0.origin.port, 443);
        assert_eq!(t.0.host_header, "hooks.example.net");
        let shown = format!("{t:?}");
        assert_eq!(shown, "Target(https://hooks.example.net:443)");
        assert_eq!(Target::parse("ftp://example.com/").unwrap_err(), TargetError::NotHttp);
        assert!(matches!(Target::parse("no url"), Err(TargetError::Parse(_))));
    }

    #[tokio::test]
    async fn user_information_in_the_url_is_sent_as_basic_credentials() {
        let server = serve(|_| async { answer(200, "") }).await;
        let client = client(Config::default());
        let target = Target::parse(&format!("http://us%40er:p%3Ass@{}/cb", server.addr)).unwrap();
        client.send(&post(&target, "{}")).await.unwrap();
        let heads = server.seen.heads.lock();
        let (_, uri, headers) = &heads[0];
        assert_eq!(headers[AUTHORIZATION], "Basic dXNAZXI6cDpzcw==", "us@er:p:ss");
        assert_eq!(uri, "/cb");
        assert_eq!(
            headers[HOST],
            server.addr.to_string().as_str(),
            "no user information in Host"
        );
        assert!(target.0.authorization.as_ref().unwrap().is_sensitive());
        assert!(!format!("{target:?}").contains("us"), "Debug shows no credentials");
    }

    #[test]
    fn base64_and_percent_decoding() {
        assert_eq!(base64(b"a:"), "YTo=");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b"\xff\xfe\xfd\xfc"), "//79/A==");
        assert_eq!(base64(b""), "");
        assert_eq!(percent_decode("a%20b%zz%4").as_deref(), Some("a b%zz%4"));
        assert_eq!(percent_decode("%ff"), None);
        assert!(Target::parse("http://h/").unwrap().0.authorization.is_none());
    }

    #[tokio::test]
    async fn an_answer_beyond_the_cap_is_cut_and_its_connection_not_reused() {
        let server = serve(|req: http::Request<Incoming>| async move {
            let size = if req.uri().path() == "/big" { 100 * 1024 } else { 10 };
            answer(200, vec![b'x'; size])
        })
        .await;
        let client = client(Config {
            max_body: 64 * 1024,
            ..Config::default()
        });
        let big = server.url("/big");
        let r = client.send(&post(&big, "")).await.unwrap();
        assert!(r.truncated);
        assert_eq!(r.body.len(), 64 * 1024);
        let small = server.url("/small");
        for _ in 0..3 {
            let r = client.send(&post(&small, "")).await.unwrap();
            assert!(!r.truncated);
            assert_eq!(r.body.len(), 10);
        }
        assert_eq!(
            server.seen.accepted.load(Ordering::SeqCst),
            2,
            "a new connection after the cut answer, then reused"
        );
    }

    #[test]
    fn a_body_in_chunks_is_kept_whole_up_to_the_cap() {
        let mut read = BodyRead::default();
        assert!(read.push(Bytes::from_static(b"abc"), 8));
        assert!(read.push(Bytes::from_static(b"def"), 8));
        assert!(!read.push(Bytes::from_static(b"ghi"), 8));
        assert_eq!(read.into_bytes(), "abcdefgh");
        let mut read = BodyRead::default();
        assert!(read.push(Bytes::from_static(b"abc"), 3));
        assert!(read.push(Bytes::new(), 3));
        assert_eq!(read.into_bytes(), "abc");
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let server = raw_server(Some(Duration::from_millis(50)), |_| Act::Answer).await;
        let client = client(Config::default());
        let target = server.url("/");
        for _ in 0..3 {
            assert_eq!(client.send(&post(&target, "{}")).await.unwrap().status, 200);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(server.seen.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 3, "no request sent twice");
    }

    /// The server reads the second request on each connection and closes without an answer,
    /// as when its keep-alive timeout fires just as the request arrives.
    #[tokio::test]
    async fn a_request_lost_to_a_closing_connection_is_resent_only_when_allowed() {
        let act = |n| if n == 1 { Act::Answer } else { Act::Close };
        let server = raw_server(None, act).await;
        let client = client(Config::default());
        let target = server.url("/");
        let resent = Request {
            resend: Resend::IfUnanswered,
            ..post(&target, "{}")
        };
        assert_eq!(client.send(&resent).await.unwrap().status, 200);
        assert_eq!(
            client.send(&resent).await.unwrap().status,
            200,
            "resent on a new connection"
        );
        assert_eq!(server.seen.accepted.load(Ordering::SeqCst), 2);
        assert_eq!(
            server.seen.requests.load(Ordering::SeqCst),
            3,
            "the server read it twice"
        );

        let server = raw_server(None, act).await;
        let target = server.url("/");
        let once = Request {
            resend: Resend::IfUnsent,
            ..post(&target, "{}")
        };
        assert_eq!(client.send(&once).await.unwrap().status, 200);
        match client.send(&once).await {
            Err(Error::Http(e)) => assert!(e.is_incomplete_message(), "{e}"),
            other => panic!("expected the lost request to fail, got {other:?}"),
        }
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 2);
        assert_eq!(Resend::for_method(&Method::POST), Resend::IfUnsent);
        assert_eq!(Resend::for_method(&Method::PUT), Resend::IfUnanswered);
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let server = serve(|_| async {
            let mut r = answer(302, "");
            r.headers_mut()
                .insert(http::header::LOCATION, HeaderValue::from_static("/elsewhere"));
            r
        })
        .await;
        let client = client(Config::default());
        let target = server.url("/dlr");
        let r = client.send(&post(&target, "{}")).await.unwrap();
        assert_eq!(r.status, 302);
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_timeout_ends_a_request_the_server_never_answers() {
        let server = raw_server(None, |_| Act::Hang).await;
        let client = client(Config {
            timeout: Duration::from_millis(300),
            ..Config::default()
        });
        let started = Instant::now();
        let target = server.url("/");
        match client.send(&post(&target, "{}")).await {
            Err(Error::Timeout(t)) => assert_eq!(t, Duration::from_millis(300)),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 1);
    }

    /// `result` is the TLS handshake refusing the server's certificate as of no trusted issuer.
    fn assert_unknown_issuer(result: Result<Response, Error>) {
        match result {
            Err(Error::Tls(e)) => {
                let cause = e.get_ref().and_then(|c| c.downcast_ref::<rustls::Error>());
                assert_eq!(
                    cause,
                    Some(&rustls::Error::InvalidCertificate(
                        rustls::CertificateError::UnknownIssuer
                    )),
                    "{e}"
                );
            }
            other => panic!("expected a TLS failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn https_to_a_server_of_unknown_issuer_is_refused() {
        let server = serve_on("127.0.0.1", true, |_| async { answer(200, "ok") }).await;
        let client = client(Config::default());
        let target = Target::parse(&format!("https://localhost:{}/", server.addr.port())).unwrap();
        assert_unknown_issuer(client.send(&post(&target, "{}")).await);
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_ca_file_is_trusted_instead_of_the_webpki_roots_and_read_again_when_it_changes() {
        let server = serve_on("127.0.0.1", true, |_| async { answer(200, "ok") }).await;
        let target = Target::parse(&format!("https://localhost:{}/", server.addr.port())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, CERT).unwrap();
        let trust = Trust::CaFile {
            key: "destinations[0]".into(),
            path: ca.clone(),
        };
        trust.check().unwrap();
        // No idle connections kept: every request opens one, so each sees the file as it is.
        let config = Config {
            max_idle_per_origin: 0,
            ..Config::default()
        };
        let client = HttpClient::with_trust(config, Arc::new(AnyAddress), trust.clone()).unwrap();
        let r = client.send(&post(&target, "{}")).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        client.open(&target).await.unwrap();

        // Another CA in the file (as after a renewal to the wrong one): the server's
        // certificate is no longer trusted, and the webpki roots are not a fallback.
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&ca, format!("{}\n", other.cert.pem())).unwrap();
        assert_unknown_issuer(client.send(&post(&target, "{}")).await);
        // Gone: connections fail before connecting, naming the key and the file.
        std::fs::remove_file(&ca).unwrap();
        match client.open(&target).await {
            Err(Error::Trust(e)) => {
                let text = e.to_string();
                assert!(text.starts_with("destinations[0].tls-ca: cannot read"), "{text}");
            }
            other => panic!("expected the CA file to fail, got {other:?}"),
        }
        assert!(trust.check().is_err());
        // A client made while it is missing fails its connections, not its making.
        let late = HttpClient::with_trust(Config::default(), Arc::new(AnyAddress), trust).unwrap();
        assert!(matches!(late.open(&target).await, Err(Error::Trust(_))));
        // Back as it was: trusted again, with no restart.
        std::fs::write(&ca, CERT).unwrap();
        let r = client.send(&post(&target, "{}")).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        late.open(&target).await.unwrap();
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn https_round_trips_with_the_issuer_trusted_and_checks_the_server_name() {
        let server = serve_on("127.0.0.1", true, |_| async { answer(200, "ok") }).await;
        let cert = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
        let client = HttpClient::with_roots(Config::default(), Arc::new(AnyAddress), vec![cert]).unwrap();
        let port = server.addr.port();
        for url in [
            format!("https://localhost:{port}/a"),
            format!("https://127.0.0.1:{port}/b"),
        ] {
            let target = Target::parse(&url).unwrap();
            for _ in 0..3 {
                let r = client.send(&post(&target, "{}")).await.unwrap();
                assert_eq!((r.status, &r.body[..]), (StatusCode::OK, &b"ok"[..]));
            }
        }
        assert_eq!(server.seen.alpn.lock().as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(
            server.seen.accepted.load(Ordering::SeqCst),
            2,
            "one connection per origin (localhost, 127.0.0.1)"
        );
        assert_eq!(
            server.seen.heads.lock()[0].2[HOST],
            format!("localhost:{port}").as_str()
        );

        // The certificate names 127.0.0.1, not 127.0.0.2 (where Linux's loopback also answers).
        let Ok(listener) = std::net::TcpListener::bind("127.0.0.2:0") else {
            return;
        };
        drop(listener);
        let other = serve_on("127.0.0.2", true, |_| async { answer(200, "ok") }).await;
        let target = Target::parse(&format!("https://127.0.0.2:{}/", other.addr.port())).unwrap();
        match client.send(&post(&target, "{}")).await {
            Err(Error::Tls(e)) => {
                let cause = e.get_ref().and_then(|c| c.downcast_ref::<rustls::Error>());
                assert!(
                    matches!(
                        cause,
                        Some(rustls::Error::InvalidCertificate(
                            rustls::CertificateError::NotValidForNameContext { .. }
                                | rustls::CertificateError::NotValidForName
                        ))
                    ),
                    "{e}"
                );
            }
            other => panic!("expected a name mismatch, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_concurrent_requests_each_get_their_own_answer() {
        let server = serve(|req: http::Request<Incoming>| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            answer(200, req.uri().path().to_owned())
        })
        .await;
        let client = client(Config::default());
        let targets: Vec<Target> = (0..50).map(|i| server.url(&format!("/{i}"))).collect();
        let requests: Vec<Request<'_>> = targets.iter().map(|t| post(t, "{}")).collect();
        for _ in 0..2 {
            let answers = futures::future::join_all(requests.iter().map(|r| client.send(r))).await;
            for (i, r) in answers.into_iter().enumerate() {
                assert_eq!(r.unwrap().body, format!("/{i}"));
            }
        }
        let accepted = server.seen.accepted.load(Ordering::SeqCst);
        assert!(accepted <= 50, "{accepted} connections for 50 at once, twice");
        assert_eq!(server.seen.requests.load(Ordering::SeqCst), 100);
    }

    #[tokio::test]
    async fn addresses_the_policy_refuses_are_never_connected_to() {
        let server = serve(|_| async { answer(200, "") }).await;
        let guarded = HttpClient::new(Config::default(), Arc::new(CallbackTargets::default())).unwrap();
        let port = server.addr.port();
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://localhost:{port}/"),
        ] {
            let target = Target::parse(&url).unwrap();
            match guarded.send(&post(&target, "{}")).await {
                Err(Error::Forbidden) => {}
                other => panic!("{url}: expected Forbidden, got {other:?}"),
            }
        }
        let opened = HttpClient::new(
            Config::default(),
            Arc::new(CallbackTargets::new(vec!["127.0.0.0/8".parse().unwrap()])),
        )
        .unwrap();
        let target = server.url("/");
        assert_eq!(opened.send(&post(&target, "{}")).await.unwrap().status, 200);
        assert_eq!(
            server.seen.accepted.load(Ordering::SeqCst),
            1,
            "only the permitted request connected"
        );
    }

    #[tokio::test]
    async fn idle_connections_expire_and_are_closed() {
        let server = serve(|_| async { answer(200, "") }).await;
        let client = client(Config {
            idle_timeout: Duration::from_millis(100),
            ..Config::default()
        });
        let target = server.url("/");
        client.send(&post(&target, "{}")).await.unwrap();
        client.send(&post(&target, "{}")).await.unwrap();
        assert_eq!(server.seen.accepted.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(client.inner.pool.lock().idle.is_empty(), "swept");
        assert_eq!(server.seen.ended.load(Ordering::SeqCst), 1, "the socket was closed");
        client.send(&post(&target, "{}")).await.unwrap();
        assert_eq!(server.seen.accepted.load(Ordering::SeqCst), 2);
    }
}
