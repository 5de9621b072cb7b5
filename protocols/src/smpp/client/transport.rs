//! A destination session's socket: plain TCP, or TLS over it when the destination asks
//! for it.

use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::ClientConfig;
use super::session::SessionError;
use crate::tls;

/// A destination session's socket.
pub(crate) type Transport = crate::tls::ClientStream;

/// Wraps a connected socket in TLS when the destination asks for it. The CA file is read
/// here, at every attempt, so a renewed one is used from the next reconnect; a bad one
/// fails the attempt (logged, backoff) like a refused connection.
pub(crate) async fn secure(config: &ClientConfig, tcp: TcpStream) -> Result<Transport, SessionError> {
    let Some(settings) = &config.tls else {
        return Ok(Transport::Plain(tcp));
    };
    if settings.insecure_skip_verify {
        tracing::warn!(
            destination = %config.name,
            "TLS certificate verification is OFF for this destination (tls-insecure-skip-verify): anyone on the path can read and change its traffic"
        );
    }
    let client = tls::client_config(settings).map_err(|e| SessionError::TlsSetup(e.to_string()))?;
    let name = tls::server_name(&settings.server_name).map_err(|_| {
        SessionError::TlsSetup(format!(
            "tls-server-name {:?} is not a DNS name or IP address",
            settings.server_name
        ))
    })?;
    let stream = TlsConnector::from(client)
        .connect(name, tcp)
        .await
        .map_err(SessionError::TlsHandshake)?;
    Ok(Transport::Tls(Box::new(stream)))
}
