//! HTTP ingress: `POST /v1/messages`.
//!
//! ```text
//! POST /v1/messages
//! Authorization: Bearer KEY
//! {"from": "12345", "to": "447700900123", "text": "hello",
//!  "callback_url": "http://…", "idempotency_key": "…", "deliver_at": "2026-12-24T09:00:00Z"}
//! ```
//!
//! Kannel's `GET`/`POST /cgi-bin/sendsms` is served on the same listener (see
//! [`crate::kannel`]).
//!
//! → `202 {"id": "<uuid>"}` once the message is stored as durably as the profile
//! promises (the same message again with the same `idempotency_key`: its first id,
//! with `"duplicate": true`); `400 {"error", "field"}` naming the bad field; `401` for a
//! missing or unknown key; `408` for a body that does not arrive in time; `409` naming
//! `idempotency_key` when the key was used for a different message; `413` for an oversized body; `429` when the account's throughput limit
//! is exceeded; `503` (with `Retry-After`) when the pipeline cannot take it now. An
//! API key belongs to an SMPP account: routing, receipts and limits are the account's.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use parking_lot::RwLock;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::auth_guard::{AuthGuard, Verdict};
pub use crate::callback::CallbackTargets;

/// Why a request's API key admits nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyRefusal {
    /// Missing, malformed or unknown.
    Invalid,
    /// Valid, but the key's `allowed-ips` do not include the request's address.
    Address,
}

/// An IPv4-mapped IPv6 address as its IPv4 address, so allow-lists written as IPv4 match
/// a dual-stack listener's peers.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An API key and the account it submits as.
#[derive(Clone)]
pub struct ApiKey {
    pub key: String,
    pub account: String,
    /// Addresses requests with this key may come from; empty = any. A request from
    /// elsewhere is refused with 403.
    pub allowed_ips: Vec<ipnet::IpNet>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// A `/cgi-bin/sendsms` user (Kannel's `sendsms-user`) and the account it submits as.
#[derive(Clone)]
pub struct SendsmsUser {
    pub username: String,
    pub password: String,
    pub account: String,
    /// Addresses its requests may come from; empty = any.
    pub allowed_ips: Vec<ipnet::IpNet>,
}

impl std::fmt::Debug for SendsmsUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendsmsUser")
            .field("username", &self.username)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

/// Whose requests the listener takes: bearer API keys for `POST /v1/messages`, and
/// username/password pairs for `/cgi-bin/sendsms`.
#[derive(Clone, Debug, Default)]
pub struct HttpCredentials {
    pub api_keys: Vec<ApiKey>,
    pub sendsms_users: Vec<SendsmsUser>,
}

impl From<Vec<ApiKey>> for HttpCredentials {
    fn from(api_keys: Vec<ApiKey>) -> Self {
        HttpCredentials {
            api_keys,
            sendsms_users: Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct HttpIngressConfig {
    /// The API keys and per-account limits, replaceable while serving.
    pub access: HttpAccess,
    pub max_body_bytes: usize,
    /// Where `callback_url` may point.
    pub callback_targets: CallbackTargets,
    /// Unknown API keys back off per address (see [`crate::auth_guard`]).
    pub auth: Arc<AuthGuard>,
    /// A body must arrive within this once the headers did.
    pub body_timeout: Duration,
}

/// Who may submit: the API keys, and each account's submissions per second (0 or
/// absent = unlimited). Shared with whoever reloads them ([`HttpAccess::replace`]).
#[derive(Clone, Default)]
pub struct HttpAccess(Arc<RwLock<Access>>);

#[derive(Default)]
struct Access {
    keys: Vec<ApiKey>,
    sendsms_users: Vec<SendsmsUser>,
    max_tps: HashMap<String, u32>,
    buckets: HashMap<String, Bucket>,
}

/// Names the accounts with keys only: keys stay out of debug output.
impl std::fmt::Debug for HttpAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let access = self.0.read();
        f.debug_struct("HttpAccess")
            .field("keys", &access.keys.len())
            .field("sendsms_users", &access.sendsms_users.len())
            .field("max_tps", &access.max_tps)
            .finish()
    }
}

impl HttpAccess {
    pub fn new(credentials: impl Into<HttpCredentials>, max_tps: HashMap<String, u32>) -> Self {
        let access = HttpAccess::default();
        access.replace(credentials, max_tps);
        access
    }

    /// Take reloaded keys, sendsms users and limits: a removed key or user is refused
    /// from the next request on; an account whose limit changed starts a fresh bucket.
    pub fn replace(&self, credentials: impl Into<HttpCredentials>, max_tps: HashMap<String, u32>) {
        let credentials = credentials.into();
        let mut access = self.0.write();
        access
            .buckets
            .retain(|account, bucket| max_tps.get(account).map(|t| f64::from(*t)) == Some(bucket.rate));
        access.keys = credentials.api_keys;
        access.sendsms_users = credentials.sendsms_users;
        access.max_tps = max_tps;
    }

    /// The account of a `/cgi-bin/sendsms` user. Every user's name and password are
    /// compared, in constant time, so the answer's timing says nothing about which users
    /// exist; a user whose `allowed-ips` exclude `peer` is refused like a wrong password,
    /// as Kannel refuses it.
    pub(crate) fn sendsms_account(&self, username: &[u8], password: &[u8], peer: Option<IpAddr>) -> Option<String> {
        let mut found = None;
        for u in &self.0.read().sendsms_users {
            let name = u.username.as_bytes().ct_eq(username);
            let pass = u.password.as_bytes().ct_eq(password);
            if bool::from(name & pass) && found.is_none() {
                let allowed = u.allowed_ips.is_empty()
                    || peer.is_some_and(|ip| u.allowed_ips.iter().any(|net| net.contains(&canonical_ip(ip))));
                found = Some(allowed.then(|| u.account.clone()));
            }
        }
        found.flatten()
    }
}

/// A validated submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpSubmission {
    pub account: String,
    pub from: String,
    pub to: String,
    pub text: String,
    pub callback_url: Option<String>,
    pub idempotency_key: Option<String>,
    /// `deliver_at`: when the provider is to deliver it, ms since the Unix epoch.
    pub deliver_at: Option<u64>,
}

/// The pipeline's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpOutcome {
    Accepted(String),
    /// The idempotency key was seen before: this is the earlier id.
    Duplicate(String),
    /// Refused for a reason the client can fix (e.g. a receipt was requested while
    /// receipts are disabled and configured to refuse).
    Invalid {
        field: &'static str,
        reason: String,
    },
    /// The request contradicts an earlier one (an idempotency key reused for another
    /// message): 409 naming the field.
    Conflict {
        field: &'static str,
        reason: String,
    },
    /// The pipeline is full or a store is failing: try again later.
    Unavailable,
    /// Admitted like [`HttpOutcome::Accepted`], and no destination of its route can
    /// take it now (Kannel's `3: Queued for later delivery`). Only `/cgi-bin/sendsms`
    /// answers it.
    Queued(String),
}

#[async_trait]
pub trait HttpSubmitHandler: Send + Sync + 'static {
    async fn submit(&self, submission: HttpSubmission) -> HttpOutcome;

    /// A `/cgi-bin/sendsms` request of `account`: one outcome per receiver, in order.
    /// Every receiver is refused unless the gateway serves the Kannel interface.
    async fn sendsms(&self, account: &str, request: crate::kannel::Sendsms) -> Vec<HttpOutcome> {
        let _ = account;
        request.to.iter().map(|_| HttpOutcome::Unavailable).collect()
    }

    /// Receipts an HTTP provider posted for `destination` (its raw body, to check a
    /// signature over): the status to answer. 404 unless the gateway serves them.
    async fn provider_receipts(&self, destination: &str, headers: &HeaderMap, body: bytes::Bytes) -> StatusCode {
        let _ = (destination, headers, body);
        StatusCode::NOT_FOUND
    }
}

struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

pub(crate) struct Ingress {
    pub(crate) access: HttpAccess,
    pub(crate) callback_targets: CallbackTargets,
    pub(crate) auth: Arc<AuthGuard>,
    pub(crate) body_timeout: Duration,
    pub(crate) max_body_bytes: usize,
    pub(crate) handler: Arc<dyn HttpSubmitHandler>,
    /// `sendium_http_requests_total{status="202"}`, looked up once: it counts nearly
    /// every request.
    pub(crate) accepted: metrics::Counter,
}

/// Why a request body could not be read.
pub(crate) enum BodyError {
    /// Larger than `max-body-bytes`, or cut off: 413.
    TooLarge,
    /// Not whole within `body-timeout`: 408.
    TooSlow,
}

impl Ingress {
    /// Read a request body within `body-timeout` and `max-body-bytes`, for every endpoint
    /// that takes one. A body too slow counts in `sendium_http_timeouts_total{what="body"}`.
    pub(crate) async fn read_body(&self, body: axum::body::Body) -> Result<bytes::Bytes, BodyError> {
        match tokio::time::timeout(self.body_timeout, axum::body::to_bytes(body, self.max_body_bytes)).await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(_)) => Err(BodyError::TooLarge),
            Err(_) => {
                metrics::counter!("sendium_http_timeouts_total", "what" => "body").increment(1);
                Err(BodyError::TooSlow)
            }
        }
    }
}

pub const MAX_TEXT_CHARS: usize = 1_600;
pub const MAX_IDEMPOTENCY_KEY: usize = 128;
pub const MAX_URL: usize = 2_048;

/// The router for the ingress listener.
pub fn router(config: HttpIngressConfig, handler: Arc<dyn HttpSubmitHandler>) -> Router {
    let state = Arc::new(Ingress {
        access: config.access,
        callback_targets: config.callback_targets,
        auth: config.auth,
        body_timeout: config.body_timeout,
        max_body_bytes: config.max_body_bytes,
        handler,
        accepted: metrics::counter!("sendium_http_requests_total", "status" => "202"),
    });
    Router::new()
        .route("/v1/messages", post(submit))
        .route("/v1/providers/{destination}/receipts", post(provider_receipts))
        .route(
            "/cgi-bin/sendsms",
            get(crate::kannel::endpoint::sendsms).post(crate::kannel::endpoint::sendsms),
        )
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(state)
}

/// The body of a `202`: the message's id, and `"duplicate": true` when the idempotency
/// key named an earlier message.
#[derive(serde::Serialize)]
struct AcceptedBody<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    duplicate: bool,
}

/// `202` with an [`AcceptedBody`] (serialized straight from the struct: no JSON value is
/// built for the answer almost every request gets).
fn accepted(id: &str, duplicate: bool) -> Response {
    (StatusCode::ACCEPTED, axum::Json(AcceptedBody { id, duplicate })).into_response()
}

fn error(status: StatusCode, message: &str, field: Option<&str>) -> Response {
    let mut body = json!({ "error": message });
    if let Some(f) = field {
        body["field"] = json!(f);
    }
    (status, axum::Json(body)).into_response()
}

impl Ingress {
    /// The account of the request's API key, or why there is none. Every key is compared,
    /// in constant time, so the answer's timing says nothing about which keys exist.
    fn account(&self, headers: &HeaderMap, peer: Option<IpAddr>) -> Result<String, KeyRefusal> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(KeyRefusal::Invalid)?
            .trim()
            .as_bytes();
        let mut found = None;
        for k in &self.access.0.read().keys {
            if bool::from(k.key.as_bytes().ct_eq(presented)) && found.is_none() {
                let allowed = k.allowed_ips.is_empty()
                    || peer.is_some_and(|ip| k.allowed_ips.iter().any(|net| net.contains(&canonical_ip(ip))));
                found = Some(if allowed {
                    Ok(k.account.clone())
                } else {
                    Err(KeyRefusal::Address)
                });
            }
        }
        found.unwrap_or(Err(KeyRefusal::Invalid))
    }

    /// Count a failed authentication from `ip` on `listener` and wait out the back-off
    /// the auth guard sets for that address.
    pub(crate) async fn auth_failed(&self, ip: IpAddr, listener: &'static str) {
        metrics::counter!("sendium_auth_failures_total", "listener" => listener).increment(1);
        let delay = self.auth.failed(ip, None);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    pub(crate) fn admit_rate(&self, account: &str) -> bool {
        let limited = |a: &Access| a.max_tps.get(account).copied().filter(|tps| *tps > 0);
        // Most accounts have no limit: that is decided under the shared lock.
        if limited(&self.access.0.read()).is_none() {
            return true;
        }
        let mut access = self.access.0.write();
        // Read again: a reload may have changed the limit in between.
        let Some(tps) = limited(&access) else {
            return true;
        };
        let b = access.buckets.entry(account.to_string()).or_insert_with(|| Bucket {
            rate: f64::from(tps),
            tokens: f64::from(tps),
            last: Instant::now(),
        });
        b.take()
    }
}

/// Why a body is not a valid submission: the field and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub reason: String,
}

fn field_err(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field,
        reason: reason.into(),
    }
}

fn string_field<'a>(body: &'a Value, field: &'static str, required: bool) -> Result<Option<&'a str>, FieldError> {
    match body.get(field) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(field_err(field, "is required")),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(field_err(field, "must be a string")),
    }
}

/// A required field's value, or the error naming it.
fn required<'a>(v: Option<&'a str>, field: &'static str) -> Result<&'a str, FieldError> {
    v.ok_or_else(|| field_err(field, "is required"))
}

/// A request body as the fast path reads it: straight into borrowed strings, with no
/// map of the fields. Any body it does not take (a field of the wrong type, an unknown or
/// repeated field, not JSON) is read again as a [`Value`], which says precisely what is
/// wrong with it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body<'a> {
    #[serde(borrow)]
    from: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    to: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    text: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    callback_url: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    idempotency_key: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    deliver_at: Option<std::borrow::Cow<'a, str>>,
}

/// Validate a request body into a submission for `account`, its `callback_url` against
/// `targets`.
pub fn parse_submission(account: &str, raw: &[u8], targets: &CallbackTargets) -> Result<HttpSubmission, FieldError> {
    if let Ok(body) = serde_json::from_slice::<Body<'_>>(raw) {
        let mut s = validate_submission(
            account,
            required(body.from.as_deref(), "from")?,
            required(body.to.as_deref(), "to")?,
            required(body.text.as_deref(), "text")?,
            body.callback_url.as_deref(),
            body.idempotency_key.as_deref(),
            targets,
        )?;
        s.deliver_at = deliver_at(body.deliver_at.as_deref())?;
        return Ok(s);
    }
    let body: Value = serde_json::from_slice(raw).map_err(|e| field_err("body", format!("is not valid JSON: {e}")))?;
    let Some(obj) = body.as_object() else {
        return Err(field_err("body", "must be a JSON object"));
    };
    const KNOWN: [&str; 6] = ["from", "to", "text", "callback_url", "idempotency_key", "deliver_at"];
    if let Some(unknown) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(FieldError {
            field: "body",
            reason: format!("has an unknown field {unknown:?}; expected {}", KNOWN.join(", ")),
        });
    }
    let callback_url = string_field(&body, "callback_url", false)?;
    let idempotency_key = string_field(&body, "idempotency_key", false)?;
    let scheduled = string_field(&body, "deliver_at", false)?;
    let mut s = validate_submission(
        account,
        string_field(&body, "from", true)?.unwrap_or_default(),
        string_field(&body, "to", true)?.unwrap_or_default(),
        string_field(&body, "text", true)?.unwrap_or_default(),
        callback_url,
        idempotency_key,
        targets,
    )?;
    s.deliver_at = deliver_at(scheduled)?;
    Ok(s)
}

/// `deliver_at`: an RFC 3339 time in UTC (`Z`), fractions of a second allowed.
fn deliver_at(value: Option<&str>) -> Result<Option<u64>, FieldError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let at = humantime::parse_rfc3339(value.trim()).map_err(|_| {
        field_err(
            "deliver_at",
            "must be an RFC 3339 time in UTC, e.g. \"2026-12-24T09:00:00Z\"",
        )
    })?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(Some(ms))
}

/// Check a submission's fields, as `POST /v1/messages` and the outbox relay take them:
/// `from` a number or an alphanumeric sender, `to` a phone number, `text` not empty and
/// not too long, `callback_url` an http(s) URL that `targets` permits (see
/// [`crate::callback`]). The error names the first bad field.
pub fn validate_submission(
    account: &str,
    from: &str,
    to: &str,
    text: &str,
    callback_url: Option<&str>,
    idempotency_key: Option<&str>,
    targets: &CallbackTargets,
) -> Result<HttpSubmission, FieldError> {
    let from = from.trim().to_string();
    if from.is_empty() || from.len() > 20 {
        return Err(field_err("from", "must be 1 to 20 characters"));
    }
    let numeric_from = from.trim_start_matches('+').chars().all(|c| c.is_ascii_digit());
    if !numeric_from && (from.chars().count() > 11 || !from.chars().all(|c| c.is_ascii_alphanumeric() || c == ' ')) {
        return Err(field_err(
            "from",
            "must be a number, or an alphanumeric sender of at most 11 letters, digits and spaces",
        ));
    }
    let to = to.trim();
    let digits = to.strip_prefix('+').unwrap_or(to);
    if digits.is_empty() || digits.len() > 20 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(field_err(
            "to",
            "must be a phone number: digits with an optional leading +, at most 20",
        ));
    }
    let text = text.to_string();
    if text.is_empty() {
        return Err(field_err("text", "must not be empty"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(field_err(
            "text",
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        ));
    }
    let callback_url = match callback_url {
        Some(u) => {
            let u = u.trim();
            if u.len() > MAX_URL
                || !(u.starts_with("http://") || u.starts_with("https://"))
                || u.contains(char::is_whitespace)
            {
                return Err(field_err("callback_url", "must be an http:// or https:// URL"));
            }
            targets.check(u).map_err(|e| field_err("callback_url", e.to_string()))?;
            Some(u.to_string())
        }
        None => None,
    };
    let idempotency_key = match idempotency_key {
        Some(k) if k.is_empty() || k.len() > MAX_IDEMPOTENCY_KEY => {
            return Err(field_err(
                "idempotency_key",
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY} characters"),
            ));
        }
        Some(k) => Some(k.to_string()),
        None => None,
    };
    Ok(HttpSubmission {
        account: account.to_string(),
        from,
        to: digits.to_string(),
        text,
        callback_url,
        idempotency_key,
        deliver_at: None,
    })
}

/// `POST /v1/providers/{destination}/receipts`: read the body within the body timeout
/// and let the handler authenticate, parse and store the receipts.
async fn provider_receipts(
    State(state): State<Arc<Ingress>>,
    axum::extract::Path(destination): axum::extract::Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let status = match state.read_body(body).await {
        Ok(body) => {
            state
                .handler
                .provider_receipts(&destination, &parts.headers, body)
                .await
        }
        Err(BodyError::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
        Err(BodyError::TooSlow) => StatusCode::REQUEST_TIMEOUT,
    };
    metrics::counter!("sendium_provider_receipt_requests_total", "status" => status.as_str().to_owned()).increment(1);
    status.into_response()
}

async fn submit(State(state): State<Arc<Ingress>>, req: Request) -> Response {
    // Set by the listener (crate::http_listener); absent only when the router is served
    // some other way.
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if let Some(ip) = ip
        && let Verdict::Refuse(left) = state.auth.check(ip, None)
    {
        metrics::counter!("sendium_auth_refused_total", "listener" => "http").increment(1);
        metrics::counter!("sendium_http_requests_total", "status" => "429").increment(1);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, left.as_secs().max(1).to_string())],
            axum::Json(json!({"error": "too many requests with an invalid API key from this address; retry later"})),
        )
            .into_response();
    }
    let account = match state.account(&headers, ip) {
        Ok(account) => Some(account),
        Err(KeyRefusal::Address) => {
            metrics::counter!("sendium_auth_address_refused_total", "listener" => "http").increment(1);
            metrics::counter!("sendium_http_requests_total", "status" => "403").increment(1);
            tracing::warn!(peer = ?ip, "HTTP request refused: the API key's allowed-ips do not include the peer");
            return error(
                StatusCode::FORBIDDEN,
                "this API key is not accepted from this address (allowed-ips)",
                None,
            );
        }
        Err(KeyRefusal::Invalid) => None,
    };
    let Some(account) = account else {
        metrics::counter!("sendium_http_requests_total", "status" => "401").increment(1);
        if let Some(ip) = ip {
            tracing::warn!(peer = %ip, "HTTP request with a missing or invalid API key");
            state.auth_failed(ip, "http").await;
        }
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or invalid API key (Authorization: Bearer KEY)",
            None,
        );
    };
    let body = match state.read_body(body).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            metrics::counter!("sendium_http_requests_total", "status" => "413").increment(1);
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the body is larger than {} bytes or was cut off", state.max_body_bytes),
                None,
            );
        }
        Err(BodyError::TooSlow) => {
            metrics::counter!("sendium_http_requests_total", "status" => "408").increment(1);
            return error(StatusCode::REQUEST_TIMEOUT, "the body did not arrive in time", None);
        }
    };
    let submission = match parse_submission(&account, &body, &state.callback_targets) {
        Ok(s) => s,
        Err(e) => {
            metrics::counter!("sendium_http_requests_total", "status" => "400").increment(1);
            return error(
                StatusCode::BAD_REQUEST,
                &format!("{} {}", e.field, e.reason),
                Some(e.field),
            );
        }
    };
    if !state.admit_rate(&account) {
        metrics::counter!("sendium_http_requests_total", "status" => "429").increment(1);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            axum::Json(json!({"error": "the account's throughput limit is exceeded"})),
        )
            .into_response();
    }
    match state.handler.submit(submission).await {
        HttpOutcome::Accepted(id) | HttpOutcome::Queued(id) => {
            state.accepted.increment(1);
            accepted(&id, false)
        }
        HttpOutcome::Duplicate(id) => {
            state.accepted.increment(1);
            accepted(&id, true)
        }
        HttpOutcome::Invalid { field, reason } => {
            metrics::counter!("sendium_http_requests_total", "status" => "400").increment(1);
            error(StatusCode::BAD_REQUEST, &format!("{field} {reason}"), Some(field))
        }
        HttpOutcome::Conflict { field, reason } => {
            metrics::counter!("sendium_http_requests_total", "status" => "409").increment(1);
            error(StatusCode::CONFLICT, &format!("{field} {reason}"), Some(field))
        }
        HttpOutcome::Unavailable => {
            metrics::counter!("sendium_http_requests_total", "status" => "503").increment(1);
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                axum::Json(json!({"error": "the gateway cannot accept messages right now; retry later"})),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<HttpSubmission, FieldError> {
        let loopback = CallbackTargets::new(vec!["127.0.0.0/8".parse().unwrap()]);
        parse_submission("esme1", body.as_bytes(), &loopback)
    }

    #[test]
    fn sendsms_users_match_name_and_password_and_address_and_are_swapped() {
        let user = |name: &str, password: &str, ips: &[&str]| SendsmsUser {
            username: name.into(),
            password: password.into(),
            account: format!("acct-{name}"),
            allowed_ips: ips.iter().map(|n| n.parse().unwrap()).collect(),
        };
        let access = HttpAccess::new(
            HttpCredentials {
                api_keys: Vec::new(),
                sendsms_users: vec![user("tester", "foobar", &[]), user("lan", "pw", &["10.0.0.0/8"])],
            },
            HashMap::new(),
        );
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(
            access.sendsms_account(b"tester", b"foobar", None).as_deref(),
            Some("acct-tester")
        );
        for (name, password) in [
            (&b"tester"[..], &b"foobaR"[..]),
            (b"teste", b"foobar"),
            (b"tester", b""),
            (b"lan", b"foobar"),
        ] {
            assert_eq!(access.sendsms_account(name, password, None), None);
        }
        assert_eq!(
            access.sendsms_account(b"lan", b"pw", ip("10.1.2.3")).as_deref(),
            Some("acct-lan")
        );
        assert_eq!(
            access.sendsms_account(b"lan", b"pw", ip("::ffff:10.1.2.3")).as_deref(),
            Some("acct-lan")
        );
        assert_eq!(access.sendsms_account(b"lan", b"pw", ip("192.0.2.1")), None);
        assert!(!format!("{access:?}{:?}", user("x", "hunter2", &[])).contains("hunter2"));
        access.replace(HttpCredentials::default(), HashMap::new());
        assert_eq!(
            access.sendsms_account(b"tester", b"foobar", None),
            None,
            "removed by the reload"
        );
    }

    #[test]
    fn valid_submission() {
        let s = parse(r#"{"from":"Shop","to":"+447700900123","text":"hi","callback_url":"http://127.0.0.1:9/cb","idempotency_key":"k1"}"#)
            .unwrap();
        assert_eq!(s.to, "447700900123");
        assert_eq!(s.callback_url.as_deref(), Some("http://127.0.0.1:9/cb"));
        assert_eq!(s.idempotency_key.as_deref(), Some("k1"));
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (r#"[1]"#, "body"),
            (r#"{"to":"1","text":"x"}"#, "from"),
            (r#"{"from":"1","text":"x"}"#, "to"),
            (r#"{"from":"1","to":"12a","text":"x"}"#, "to"),
            (r#"{"from":"1","to":"12","text":""}"#, "text"),
            (r#"{"from":"1","to":"12","text":5}"#, "text"),
            (r#"{"from":"This is far too long","to":"12","text":"x"}"#, "from"),
            (
                r#"{"from":"1","to":"12","text":"x","callback_url":"ftp://x"}"#,
                "callback_url",
            ),
            (
                r#"{"from":"1","to":"12","text":"x","callback_url":"http://169.254.169.254/latest"}"#,
                "callback_url",
            ),
            (
                r#"{"from":"1","to":"12","text":"x","idempotency_key":""}"#,
                "idempotency_key",
            ),
            (r#"{"from":"1","to":"12","text":"x","extra":1}"#, "body"),
            ("not json", "body"),
        ];
        for (body, field) in cases {
            assert_eq!(parse(body).unwrap_err().field, field, "{body}");
        }
    }

    /// The fast typed read and the `Value` read give the same answers: messages for a
    /// wrong type, an unknown field and a missing one; null as absent; escapes decoded;
    /// a repeated field taking its last value.
    #[test]
    fn the_typed_read_and_the_value_read_agree() {
        let reason = |b: &str| parse(b).unwrap_err().reason;
        assert_eq!(reason(r#"{"from":"1","to":"12","text":5}"#), "must be a string");
        assert!(reason(r#"{"from":"1","to":"12","text":"x","extra":1}"#).starts_with("has an unknown field \"extra\""));
        assert_eq!(reason(r#"{"from":"1","to":"12","text":null}"#), "is required");
        let s = parse(r#"{"from":"Shop","to":"12","text":"line\nquote \" \u00e9","callback_url":null}"#).unwrap();
        assert_eq!((s.text.as_str(), s.callback_url), ("line\nquote \" é", None));
        let s = parse(r#"{"from":"Shop","to":"12","text":"first","text":"last"}"#).unwrap();
        assert_eq!(s.text, "last");
    }
}
