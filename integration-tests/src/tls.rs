//! TLS for the test peers, on rustls directly (never Sendium's own TLS code, so a bug there
//! cannot be cancelled out by the same bug here): a client that trusts one CA file (the
//! test ESME, HTTPS requests), and [`TlsFront`], a TLS terminator in front of the test
//! SMSC that forwards plain SMPP to it — the SMSC's session code stays the one every other
//! test uses, and its records show what came through the TLS connection.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS client configuration trusting only the certificates in one PEM file, and the name
/// it checks the server's certificate against.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl TlsClient {
    /// Trusts the certificates in `ca_pem`; checks the server's certificate for `server_name`.
    pub fn trusting(ca_pem: &Path, server_name: &str) -> TlsClient {
        TlsClient::build(ca_pem, server_name, None)
    }

    /// [`TlsClient::trusting`], presenting a client certificate (mutual TLS).
    pub fn trusting_with_certificate(ca_pem: &Path, server_name: &str, cert_pem: &Path, key_pem: &Path) -> TlsClient {
        TlsClient::build(ca_pem, server_name, Some((cert_pem, key_pem)))
    }

    fn build(ca_pem: &Path, server_name: &str, identity: Option<(&Path, &Path)>) -> TlsClient {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_pem).expect("read CA file") {
            roots.add(cert.expect("CA certificate")).expect("add CA certificate");
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(read_chain(cert), PrivateKeyDer::from_pem_file(key).expect("client key"))
                .expect("client certificate"),
        };
        TlsClient {
            config: Arc::new(config),
            server_name: ServerName::try_from(server_name.to_owned()).expect("server name"),
        }
    }

    /// Connects and completes the handshake.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        let _ = tcp.set_nodelay(true);
        self.handshake(tcp).await
    }

    /// The handshake over an already connected socket.
    pub async fn handshake(&self, tcp: TcpStream) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        TlsConnector::from(self.config.clone())
            .connect(self.server_name.clone(), tcp)
            .await
    }
}

fn read_chain(cert_pem: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(cert_pem)
        .expect("read certificate file")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates")
}

/// A rustls server configuration from a PEM certificate chain and key.
pub fn server_config(cert_pem: &Path, key_pem: &Path) -> Arc<rustls::ServerConfig> {
    let chain = read_chain(cert_pem);
    let key = PrivateKeyDer::from_pem_file(key_pem).expect("private key");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate and key");
    Arc::new(config)
}

/// Terminates TLS on its own port and forwards each connection's plain bytes to
/// `upstream` (a [`crate::TestSmsc`]). Counts completed and failed handshakes.
pub struct TlsFront {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<FrontCounts>,
}

#[derive(Default)]
struct FrontCounts {
    handshakes: AtomicU64,
    failed: AtomicU64,
}

impl TlsFront {
    pub async fn start(cert_pem: &Path, key_pem: &Path, upstream: SocketAddr) -> TlsFront {
        let acceptor = TlsAcceptor::from(server_config(cert_pem, key_pem));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind TLS front");
        let addr = listener.local_addr().expect("local address");
        let counts = Arc::new(FrontCounts::default());
        let task = tokio::spawn(front_loop(listener, acceptor, upstream, counts.clone()));
        TlsFront { addr, task, counts }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Handshakes that completed.
    pub fn handshakes(&self) -> u64 {
        self.counts.handshakes.load(Ordering::Relaxed)
    }

    /// Handshakes the client broke off or that failed.
    pub fn failed_handshakes(&self) -> u64 {
        self.counts.failed.load(Ordering::Relaxed)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn front_loop(listener: TcpListener, acceptor: TlsAcceptor, upstream: SocketAddr, counts: Arc<FrontCounts>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let acceptor = acceptor.clone();
                let counts = counts.clone();
                connections.spawn(async move {
                    let mut tls = match acceptor.accept(tcp).await {
                        Ok(tls) => tls,
                        Err(_) => {
                            counts.failed.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                    counts.handshakes.fetch_add(1, Ordering::Relaxed);
                    let Ok(mut plain) = TcpStream::connect(upstream).await else { return };
                    let _ = plain.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        }
    }
}
