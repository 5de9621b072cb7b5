//! The admin HTTP endpoints.
//!
//! `/healthz` (process alive), `/readyz` (stores open and healthy, reconciliation done),
//! `/metrics` (Prometheus text), `/admin/actors`, `/admin/destinations`, `/admin/profile`,
//! `/admin/cluster`, `/admin/outbox`, `/admin/mo`, `/admin/config`, `POST /admin/reload`.
//! Served on loopback by default; when a token is configured (required for a
//! non-loopback listen address), `/metrics` and `/admin/*` need
//! `Authorization: Bearer <token>`, compared in constant time.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use sendium_actors::Gateway;
use sendium_profiles::Secret;
use serde_json::json;

pub struct AdminState {
    pub gateway: Arc<Gateway>,
    pub prometheus: Option<PrometheusHandle>,
    pub token: Secret,
    /// Where a reload reads the configuration.
    pub source: crate::serve::ConfigSource,
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/actors", get(actors))
        .route("/admin/destinations", get(destinations))
        .route("/admin/profile", get(profile))
        .route("/admin/cluster", get(cluster))
        .route("/admin/outbox", get(outbox))
        .route("/admin/mo", get(mo))
        .route("/admin/config", get(config))
        .route("/admin/reload", axum::routing::post(reload))
        .with_state(state)
}

fn authorized(state: &AdminState, headers: &HeaderMap) -> bool {
    if state.token.is_empty() {
        return true;
    }
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    match value.strip_prefix("Bearer ") {
        Some(t) => state.token.matches(t.trim().as_bytes()),
        None => false,
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(json!({"error": "a valid admin token is required"})),
    )
        .into_response()
}

fn profile_json(g: &Gateway) -> serde_json::Value {
    let p = g.profile();
    json!({
        "pending": p.pending.as_str(),
        "router-queue": p.router_queue.as_str(),
        "routed-work": p.routed_work.as_str(),
        "dlr": p.dlr.as_str(),
    })
}

async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Ready (200) or not (503, with the reasons). An outbox source whose database does not
/// answer is named under `degraded` without making the gateway unready: SMPP and HTTP
/// admissions and the other sources do not depend on it.
async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let profile = profile_json(&state.gateway);
    let degraded = state.gateway.degraded();
    let mut body = match state.gateway.readiness() {
        Ok(()) => json!({"ready": true, "profile": profile}),
        Err(reasons) => json!({"ready": false, "profile": profile, "reasons": reasons}),
    };
    if !degraded.is_empty() {
        body["degraded"] = json!(degraded);
    }
    let status = if body["ready"] == json!(true) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let snapshot = state.gateway.snapshot().await;
    let actors = state.gateway.actors().await;
    let sources = state.gateway.outbox();
    crate::metrics::publish(&snapshot, &actors, state.gateway.readiness().is_ok());
    crate::metrics::publish_outbox(&sources);
    let present = crate::metrics::Present::of(&snapshot, &sources);
    let body = state
        .prometheus
        .as_ref()
        .map(|p| crate::metrics::without_removed(p.render(), &present))
        .unwrap_or_default();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn actors(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    axum::Json(state.gateway.actors().await).into_response()
}

async fn destinations(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    axum::Json(state.gateway.snapshot().await.destinations()).into_response()
}

async fn profile(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let g = state.guarantee_view();
    axum::Json(g).into_response()
}

/// The database of the postgresql outbound stages as this process shares it: the
/// partitions it holds and who holds the others.
async fn cluster(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    match state.gateway.cluster().await {
        Some(view) => axum::Json(view).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "error": "the outbound stages are not on postgresql: this process alone serves its storage"
            })),
        )
            .into_response(),
    }
}

/// Every outbox source: backlog, age of the oldest row, relay rate, retries, dead rows,
/// and whether its database answers.
async fn outbox(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    axum::Json(state.gateway.outbox()).into_response()
}

/// Inbound messages: `[mo]`, each `[[mo-routes]]` entry with its counts since start,
/// counts by provider connection, and the multipart parts held in the DLR store.
async fn mo(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let held = state
        .gateway
        .snapshot()
        .await
        .dlr
        .and_then(|d| d.store)
        .map(|s| s.inbound_parts);
    let mut view = serde_json::to_value(state.gateway.mo_view()).unwrap_or_default();
    view["held_parts"] = json!(held);
    axum::Json(view).into_response()
}

/// Which configuration runs: its source, when it was loaded, how many accounts, keys,
/// routes and destinations — never its content (it holds secrets).
async fn config(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    let view = state.gateway.config_view();
    axum::Json(json!({
        "source": state.source.describe(),
        "digest": state.source.digest(),
        "loaded_at": view.loaded_at,
        "accounts": view.accounts,
        "api_keys": view.api_keys,
        "routes": view.routes,
        "mo_routes": view.mo_routes,
        "destinations": view.destinations,
    }))
    .into_response()
}

/// Read the configuration again and swap its live parts in: 200 with what changed, 400
/// when the file does not load, 409 when a key that cannot change live differs.
async fn reload(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return unauthorized();
    }
    match crate::serve::reload(&state.gateway, &state.source).await {
        Ok(summary) => axum::Json(json!({"reloaded": true, "changes": summary})).into_response(),
        Err(e) => {
            let status = match e {
                crate::serve::ReloadFailure::Invalid(_) => StatusCode::BAD_REQUEST,
                crate::serve::ReloadFailure::Refused(_) => StatusCode::CONFLICT,
            };
            (status, axum::Json(json!({"reloaded": false, "error": e.to_string()}))).into_response()
        }
    }
}

impl AdminState {
    fn guarantee_view(&self) -> serde_json::Value {
        let g = self.gateway.guarantee();
        json!({
            "profile": profile_json(&self.gateway),
            "restart_guarantee": {
                "outbound": g.outbound,
                "dlr": g.dlr,
            },
            "durable": g.durable,
            "dlr_durable": matches!(
                self.gateway.profile().dlr,
                sendium_profiles::DlrBackend::File | sendium_profiles::DlrBackend::Postgresql
            ),
        })
    }
}
