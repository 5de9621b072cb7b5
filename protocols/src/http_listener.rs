//! The HTTP ingress listener: connections, timeouts and limits.
//!
//! `axum::serve` has no limits of its own; an internet-facing listener needs them:
//!
//! - at most `max_connections` open connections; more are closed as soon as they are
//!   accepted (`sendium_http_connections_refused_total`);
//! - a request's headers must arrive within `header_timeout` — which also bounds how
//!   long an idle keep-alive connection stays open, since the timer runs from the moment
//!   the connection waits for its next request (`sendium_http_timeouts_total{what="headers"}`);
//! - its body within `body_timeout` once the headers arrived (checked by the handler,
//!   see [`crate::http`]: 408, `sendium_http_timeouts_total{what="body"}`).
//!
//! With TLS ([`serve_with_tls`]) the handshake comes first, in the connection's task and
//! slot, within `header_timeout`.
//!
//! `sendium_http_connections` is the number open now. Every request carries the peer
//! address ([`axum::extract::ConnectInfo`]) for the failed-key back-off.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::tls::{self, ServerTls};

/// Connection limits of an HTTP listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// How long connections get to finish their requests after shutdown fired.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Serve `app` on `listener` until `shutdown` fires (then in-flight requests finish,
/// within a short grace period).
pub async fn serve(listener: TcpListener, app: Router, limits: ListenerLimits, shutdown: CancellationToken) {
    serve_with_tls(listener, app, limits, None, shutdown).await;
}

/// [`serve`], speaking HTTPS with `tls` when given. The handshake runs in the connection's
/// task, holding its connection slot, and must finish within `header_timeout` (the same
/// bound a plain connection has for its first request's headers); failures count in
/// `sendium_tls_handshake_failures_total{listener}` with `label`.
pub async fn serve_with_tls(
    listener: TcpListener,
    app: Router,
    limits: ListenerLimits,
    tls: Option<(ServerTls, &'static str)>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "HTTP accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    metrics::counter!("sendium_http_connections_refused_total").increment(1);
                    drop(stream);
                    continue;
                };
                let app = app.clone();
                let stop = shutdown.clone();
                let acceptor = tls.as_ref().map(|(identity, label)| (identity.acceptor(), *label));
                connections.spawn(async move {
                    metrics::gauge!("sendium_http_connections").increment(1.0);
                    match acceptor {
                        None => connection(stream, peer, app, limits, stop).await,
                        Some((acceptor, label)) => {
                            let deadline = tokio::time::Instant::now() + limits.header_timeout;
                            let handshake = tls::accept_by(&acceptor, stream, deadline);
                            tokio::select! {
                                () = stop.cancelled() => {}
                                done = handshake => match done {
                                    Ok(stream) => connection(stream, peer, app, limits, stop).await,
                                    Err(err) => {
                                        tls::count_handshake_failure(label, &err);
                                        tracing::debug!(%peer, error = %err, listener = label, "HTTPS handshake did not complete");
                                    }
                                },
                            }
                        }
                    }
                    metrics::gauge!("sendium_http_connections").decrement(1.0);
                    drop(slot);
                });
            }
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.abort_all();
    }
}

async fn connection<S>(stream: S, peer: SocketAddr, app: Router, limits: ListenerLimits, stop: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        let mut app = app.clone();
        async move {
            let resp: Result<axum::response::Response, Infallible> = app.call(req.map(axum::body::Body::new)).await;
            resp
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            metrics::counter!("sendium_http_timeouts_total", "what" => "headers").increment(1);
        } else {
            tracing::debug!(error = %e, "HTTP connection ended with an error");
        }
    }
}
