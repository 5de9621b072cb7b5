//! `sendium serve`: run the gateway until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use sendium_actors::Gateway;
use sendium_actors::reload::{ReloadError, ReloadSummary};
use sendium_profiles::{Config, DlrBackend};
use tokio::net::TcpListener;

use sendium_protocols::http_listener::{self, ListenerLimits};

use crate::admin::{self, AdminState};

/// The admin listener's limits when it serves HTTPS: a few operators and scrapers.
const ADMIN_LIMITS: ListenerLimits = ListenerLimits {
    max_connections: 64,
    header_timeout: std::time::Duration::from_secs(10),
};

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
                    "DLR store is in memory: correlations and undelivered receipts and inbound messages are lost on restart"
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

/// Where the running configuration came from: a file, or (`None`) the embedded
/// quickstart. A reload reads it again, with the environment's overrides.
#[derive(Clone, Debug, Default)]
pub struct ConfigSource {
    pub path: Option<PathBuf>,
    /// SHA-256 of the running configuration's text (environment overrides aside).
    digest: Arc<parking_lot::Mutex<String>>,
}

impl ConfigSource {
    pub fn new(path: Option<PathBuf>) -> Self {
        let source = ConfigSource {
            path,
            digest: Arc::default(),
        };
        if let Ok(text) = source.text() {
            *source.digest.lock() = digest(&text);
        }
        source
    }

    fn text(&self) -> std::io::Result<Vec<u8>> {
        match &self.path {
            Some(path) => std::fs::read(path),
            None => Ok(sendium_profiles::QUICKSTART.as_bytes().to_vec()),
        }
    }

    fn load(&self) -> Result<(Config, String), sendium_profiles::ConfigError> {
        let cfg = match &self.path {
            Some(path) => sendium_profiles::load(path),
            None => sendium_profiles::load_str_with_env(sendium_profiles::QUICKSTART, std::env::vars()),
        }?;
        Ok((cfg, self.text().map(|t| digest(&t)).unwrap_or_default()))
    }

    pub fn describe(&self) -> String {
        self.path
            .as_ref()
            .map_or_else(|| "embedded quickstart".to_owned(), |p| p.display().to_string())
    }

    /// The running configuration's digest (`sha256:<hex>`).
    pub fn digest(&self) -> String {
        self.digest.lock().clone()
    }
}

fn digest(text: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(text);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadFailure {
    /// The file does not load or validate.
    #[error("{0}; the running configuration is unchanged")]
    Invalid(String),
    #[error(transparent)]
    Refused(#[from] ReloadError),
}

/// Read the configuration again and swap its live parts in (SIGHUP, `POST
/// /admin/reload`); counted in `sendium_config_reloads_total{outcome}`.
pub async fn reload(gateway: &Gateway, source: &ConfigSource) -> Result<ReloadSummary, ReloadFailure> {
    let result = match source.load() {
        Err(e) => Err(ReloadFailure::Invalid(e.to_string())),
        Ok((cfg, digest)) => match gateway.reload(cfg).await {
            Ok(summary) => {
                *source.digest.lock() = digest;
                Ok(summary)
            }
            Err(e) => Err(ReloadFailure::Refused(e)),
        },
    };
    let outcome = match &result {
        Ok(summary) => {
            tracing::info!(
                source = %source.describe(),
                accounts_added = summary.accounts_added.len(),
                accounts_removed = summary.accounts_removed.len(),
                accounts_changed = summary.accounts_changed.len(),
                sessions_unbound = summary.sessions_unbound,
                api_keys = summary.api_keys,
                routes = summary.routes,
                destinations_added = summary.destinations.added.len(),
                destinations_removed = summary.destinations.removed.len(),
                destinations_changed = summary.destinations.changed.len(),
                "configuration reloaded"
            );
            "ok"
        }
        Err(e) => {
            tracing::warn!(source = %source.describe(), error = %e, "configuration reload refused");
            match e {
                ReloadFailure::Invalid(_) => "invalid",
                ReloadFailure::Refused(_) => "refused",
            }
        }
    };
    metrics::counter!("sendium_config_reloads_total", "outcome" => outcome).increment(1);
    result
}

/// Start everything the configuration asks for.
pub async fn start(cfg: &Config) -> Result<Running, ServeError> {
    start_from(cfg, ConfigSource::new(None)).await
}

/// [`start`], remembering where the configuration came from for reloads.
pub async fn start_from(cfg: &Config, source: ConfigSource) -> Result<Running, ServeError> {
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
        source,
    });
    let token = gateway.shutdown_token();
    let app = admin::router(state);
    match gateway.tls().admin.clone() {
        None => gateway.add_listener(tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move { token.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "admin listener stopped");
            }
        })),
        // HTTPS goes through the ingress's listener: its handshake and header timeouts
        // bound what an unauthenticated peer can hold open.
        Some(identity) => gateway.add_listener(tokio::spawn(http_listener::serve_with_tls(
            listener,
            app,
            ADMIN_LIMITS,
            Some((identity, "admin")),
            token,
        ))),
    }
    if let Some(a) = gateway.smpp_addr() {
        tracing::info!(addr = %a, "SMPP listening");
    }
    if let Some(a) = gateway.smpp_tls_addr() {
        tracing::info!(addr = %a, "SMPP over TLS listening");
    }
    tracing::info!(addr = %admin_addr, tls = cfg.admin.tls.is_some(), "admin listening");
    Ok(Running { gateway, admin_addr })
}

/// Reload the configuration on every SIGHUP until the gateway stops.
fn reload_on_sighup(gateway: Arc<Gateway>, source: ConfigSource) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("SIGHUP cannot be handled: reload with POST /admin/reload");
        return;
    };
    let stop = gateway.shutdown_token();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    let _ = reload(&gateway, &source).await;
                }
                () = stop.cancelled() => return,
            }
        }
    });
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

pub async fn run(cfg: Config, source: ConfigSource) -> Result<(), ServeError> {
    let running = start_from(&cfg, source.clone()).await?;
    reload_on_sighup(running.gateway.clone(), source);
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.gateway.stop(cfg.shutdown.timeout).await;
    Ok(())
}
