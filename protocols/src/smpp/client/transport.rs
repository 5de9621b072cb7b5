//! A destination session's socket: plain TCP, or TLS over it. One type, so the session
//! code is the same for both.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::ClientConfig;
use super::session::SessionError;
use crate::tls;

pub(crate) enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Transport {
    /// Reads what is buffered or readable now without waiting; `WouldBlock` otherwise.
    /// A TLS stream is polled once: a pending read leaves nothing behind, and the next
    /// wait registers for readiness again.
    pub(crate) fn try_read_buf(&mut self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.try_read_buf(buf),
            Transport::Tls(s) => s
                .read_buf(buf)
                .now_or_never()
                .unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into())),
        }
    }
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

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
