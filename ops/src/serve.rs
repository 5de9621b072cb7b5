//! `sendium serve`: run the gateway until SIGINT/SIGTERM.

use std::sync::Arc;

use sendium_actors::Gateway;
use sendium_profiles::{Config, DlrBackend};
use tokio::net::TcpListener;

use crate::admin::{self, AdminState};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Gateway(#[from] sendium_actors::GatewayError),
    #[error("cannot listen on {addr} (admin.listen): {source}")]
    Admin {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The restart behaviour of the chosen profile, said once at startup: an operator must
/// never be surprised by what a restart keeps.
pub fn announce_profile(cfg: &Config) {
    let profile = cfg.storage_profile();
    match sendium_profiles::check_supported(&profile) {
        Ok(g) => {
            if g.durable {
                tracing::info!(profile = %profile, outbound = g.outbound, dlr = g.dlr, "storage profile");
            } else {
                tracing::warn!(
                    profile = %profile,
                    outbound = g.outbound,
                    dlr = g.dlr,
                    "storage profile is NOT durable: accepted messages are lost on restart"
                );
            }
            if cfg.dlr.backend == DlrBackend::Memory {
                tracing::warn!(
                    capacity = cfg.dlr.capacity,
                    "DLR store is in memory: correlations and undelivered receipts are lost on restart"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "unsupported storage profile"),
    }
    if cfg.sms.pending.backend == sendium_profiles::StageBackend::Postgresql {
        let pg = &cfg.storage.postgresql;
        if pg.shared {
            tracing::info!(
                partitions = pg.partitions,
                "outbound stages shared with the other Sendium processes on this database: each works on the \
                 partitions it holds and takes over those of a process that dies"
            );
        } else {
            tracing::info!(
                partitions = pg.partitions,
                "outbound stages served by this process alone: another process on the same database is refused"
            );
        }
    }
    let fps = sendium_storage::failpoint::active();
    if !fps.is_empty() {
        tracing::warn!(failpoints = ?fps, "failpoints are active (test run)");
    }
}

/// A started gateway with its admin endpoint.
pub struct Running {
    pub gateway: Arc<Gateway>,
    pub admin_addr: std::net::SocketAddr,
}

/// Start everything the configuration asks for.
pub async fn start(cfg: &Config) -> Result<Running, ServeError> {
    announce_profile(cfg);
    let prometheus = crate::metrics::install();
    let gateway = Arc::new(Gateway::start(cfg).await?);
    let listener = TcpListener::bind(cfg.admin.listen)
        .await
        .map_err(|source| ServeError::Admin {
            addr: cfg.admin.listen,
            source,
        })?;
    let admin_addr = listener.local_addr().unwrap_or(cfg.admin.listen);
    let state = Arc::new(AdminState {
        gateway: gateway.clone(),
        prometheus,
        token: cfg.admin.token.clone(),
    });
    let token = gateway.shutdown_token();
    gateway.add_listener(tokio::spawn(async move {
        let app = admin::router(state);
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move { token.cancelled().await });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin listener stopped");
        }
    }));
    if let Some(a) = gateway.smpp_addr() {
        tracing::info!(addr = %a, "SMPP listening");
    }
    tracing::info!(addr = %admin_addr, "admin listening");
    Ok(Running { gateway, admin_addr })
}

/// Wait for SIGINT or SIGTERM.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub async fn run(cfg: Config) -> Result<(), ServeError> {
    let running = start(&cfg).await?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.gateway.stop(cfg.shutdown.timeout).await;
    Ok(())
}
