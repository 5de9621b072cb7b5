//! TLS material for Sendium's listeners and SMPP destinations: PEM files read into rustls
//! configurations (ring provider, no OpenSSL), a holder a reload swaps for new connections,
//! and the handshake bounded by a deadline.
//!
//! Every error names the configuration key and the file it came from, never file content:
//! an operator reads "smpp.tls.key: /etc/sendium/key.pem holds no private key" and knows
//! what to fix.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read {
        key: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{key}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate { key: String, path: PathBuf },
    #[error("{key}: {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display())]
    NoKey { key: String, path: PathBuf },
    #[error("{key}: {} is not valid PEM: {detail}", path.display())]
    Pem { key: String, path: PathBuf, detail: String },
    #[error("{key}: {name:?} is not a DNS name or IP address a certificate can be checked against")]
    Name { key: String, name: String },
    #[error("{key}: {} cannot be used: {source}", path.display())]
    Rejected {
        key: String,
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

/// The files of a TLS server identity and the configuration keys they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// Configuration key prefix for messages, e.g. `smpp.tls`.
    pub key: String,
    /// Certificate chain, leaf first (a `fullchain.pem`).
    pub cert: PathBuf,
    pub private_key: PathBuf,
    /// ALPN protocols offered (`http/1.1` for HTTPS, none for SMPP).
    pub alpn: Vec<Vec<u8>>,
    /// CA certificates a client certificate must chain to; None: no client certificate is
    /// asked for.
    pub client_ca: Option<PathBuf>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key: key.to_owned(),
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in the PEM file at `path` (at least one).
pub fn load_certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            key: key.to_owned(),
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            key: key.to_owned(),
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn load_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            key: key.to_owned(),
            path: path.to_owned(),
        },
        other => TlsError::Pem {
            key: key.to_owned(),
            path: path.to_owned(),
            detail: other.to_string(),
        },
    })
}

/// A rustls server configuration from `files`: the files are read now, whole, so a
/// missing or mismatched file fails here and not at the first handshake.
pub fn server_config(files: &ServerTlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_key = format!("{}.cert", files.key);
    let key_key = format!("{}.key", files.key);
    let chain = load_certificates(&cert_key, &files.cert)?;
    let private_key = load_key(&key_key, &files.private_key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rejected {
            key: cert_key.clone(),
            path: files.cert.clone(),
            source,
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(&format!("{}.client-ca", files.key), path)?),
    };
    let mut config = builder
        .with_single_cert(chain, private_key)
        .map_err(|source| TlsError::Rejected {
            key: key_key,
            path: files.private_key.clone(),
            source,
        })?;
    config.alpn_protocols = files.alpn.clone();
    Ok(Arc::new(config))
}

/// Requires a client certificate that chains to the CAs in `path`.
fn client_verifier(key: &str, path: &Path) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certificates(key, path)? {
        roots.add(cert).map_err(|source| TlsError::Rejected {
            key: key.to_owned(),
            path: path.to_owned(),
            source,
        })?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::Pem {
            key: key.to_owned(),
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

/// A listener's server identity, replaceable while serving: a reload swaps it, and each
/// new connection takes the one current at its accept (established sessions keep theirs).
#[derive(Clone)]
pub struct ServerTls {
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
    files: Arc<RwLock<ServerTlsFiles>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("files", &*self.files.read()).finish()
    }
}

impl ServerTls {
    /// Reads `files` (see [`server_config`]).
    pub fn load(files: ServerTlsFiles) -> Result<Self, TlsError> {
        let config = server_config(&files)?;
        Ok(ServerTls {
            current: Arc::new(RwLock::new(config)),
            files: Arc::new(RwLock::new(files)),
        })
    }

    /// The acceptor for a connection accepted now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().clone())
    }

    /// Swaps in an identity loaded by [`Self::prepare`].
    pub fn replace(&self, prepared: PreparedServerTls) {
        *self.current.write() = prepared.config;
        *self.files.write() = prepared.files;
    }

    /// Reads `files` for a later [`Self::replace`]: a reload loads everything first and
    /// swaps only when every file was good.
    pub fn prepare(files: ServerTlsFiles) -> Result<PreparedServerTls, TlsError> {
        Ok(PreparedServerTls {
            config: server_config(&files)?,
            files,
        })
    }
}

/// A server identity read and checked, not yet in use.
pub struct PreparedServerTls {
    config: Arc<rustls::ServerConfig>,
    files: ServerTlsFiles,
}

/// Runs the server side of a handshake, giving up at `deadline`. The caller runs it in the
/// connection's own task (never the accept loop), holding the connection's place in the
/// listener's limits, so a peer that never finishes costs one slot until the deadline.
pub async fn accept_by<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    deadline: Instant,
) -> Result<tokio_rustls::server::TlsStream<S>, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Err(_) => Err(HandshakeError::Timeout),
        Ok(Err(err)) => Err(HandshakeError::Failed(err)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Why a server-side handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("TLS handshake not finished in time")]
    Timeout,
    #[error("TLS handshake failed: {0}")]
    Failed(#[source] std::io::Error),
}

/// Counts a failed server-side handshake in `sendium_tls_handshake_failures_total{listener}`.
pub fn count_handshake_failure(listener: &'static str, err: &HandshakeError) {
    let reason = match err {
        HandshakeError::Timeout => "timeout",
        HandshakeError::Failed(_) => "failed",
    };
    metrics::counter!("sendium_tls_handshake_failures_total", "listener" => listener, "reason" => reason).increment(1);
}

/// How an SMPP destination's TLS is set up; plain data (compared on reload), turned into a
/// connector at each connection attempt so a renewed CA file is read then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsSettings {
    /// Name the server certificate must carry (and SNI); the host when not set.
    pub server_name: String,
    /// CA certificates to trust instead of the webpki roots.
    pub ca: Option<PathBuf>,
    /// Accept any server certificate (explicit opt-in; warned about at each connect).
    pub insecure_skip_verify: bool,
    /// Configuration key prefix for messages, e.g. `destinations[upstream-a]`.
    pub key: String,
}

/// A client configuration for `settings`: the CA file (if any) is read now.
pub fn client_config(settings: &ClientTlsSettings) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rejected {
            key: settings.key.clone(),
            path: PathBuf::new(),
            source,
        })?;
    if settings.insecure_skip_verify {
        let verifier = Arc::new(Verification {
            provider: provider(),
            pinned: None,
        });
        return Ok(Arc::new(
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    match &settings.ca {
        Some(path) => {
            let ca_key = format!("{}.tls-ca", settings.key);
            for cert in load_certificates(&ca_key, path)? {
                roots.add(cert).map_err(|source| TlsError::Rejected {
                    key: ca_key.clone(),
                    path: path.clone(),
                    source,
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
}

/// A client configuration that accepts exactly the server whose certificate is the first
/// one in `cert` (the `cert` file of a listener's `tls`), whatever names it carries; the
/// handshake's signatures are still checked, so only the holder of its key passes. For
/// `sendium healthcheck`, which reaches its own admin listener by a loopback address its
/// certificate does not name. `key` names the configuration key in errors.
pub fn pinned_client_config(key: &str, cert: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let pinned = load_certificates(key, cert)?
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::NoCertificate {
            key: key.to_owned(),
            path: cert.to_owned(),
        })?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rejected {
            key: key.to_owned(),
            path: cert.to_owned(),
            source,
        })?;
    let verifier = Arc::new(Verification {
        provider: provider(),
        pinned: Some(pinned),
    });
    Ok(Arc::new(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

/// The server name to verify and send as SNI.
pub fn server_name(name: &str) -> Result<ServerName<'static>, rustls::pki_types::InvalidDnsNameError> {
    ServerName::try_from(name.to_owned())
}

/// A certificate check without a CA: with no pin (`tls-insecure-skip-verify`) any
/// certificate passes (the session is encrypted, but to whoever answers); with a pin only
/// that exact certificate does. Handshake signatures are checked either way.
#[derive(Debug)]
struct Verification {
    provider: Arc<CryptoProvider>,
    pinned: Option<CertificateDer<'static>>,
}

impl ServerCertVerifier for Verification {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.pinned {
            Some(pinned) if pinned.as_ref() != end_entity.as_ref() => Err(rustls::Error::General(
                "the server's certificate is not the configured one".into(),
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

mod stream;
mod subject;
pub use stream::ClientStream;
pub use subject::{SUBJECT_ATTRIBUTES, Subject};

#[cfg(test)]
mod tests;
