use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use super::*;

/// A self-signed certificate for `localhost` / 127.0.0.1, written as PEM files.
struct TestCert {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

fn test_cert() -> TestCert {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    TestCert { dir, cert, key }
}

fn files(c: &TestCert) -> ServerTlsFiles {
    ServerTlsFiles {
        key: "smpp.tls".into(),
        cert: c.cert.clone(),
        private_key: c.key.clone(),
        alpn: Vec::new(),
        client_ca: None,
    }
}

fn client(ca: Option<PathBuf>, insecure: bool) -> TlsConnector {
    let settings = ClientTlsSettings {
        server_name: "localhost".into(),
        ca,
        insecure_skip_verify: insecure,
        key: "destinations[a]".into(),
    };
    TlsConnector::from(client_config(&settings).unwrap())
}

#[test]
fn errors_name_the_key_and_the_file() {
    let c = test_cert();
    let mut f = files(&c);
    f.private_key = c.dir.path().join("missing.pem");
    let err = server_config(&f).unwrap_err().to_string();
    assert!(err.starts_with("smpp.tls.key: cannot read "), "{err}");
    assert!(err.contains("missing.pem"), "{err}");

    // A key file that holds a certificate only.
    f.private_key = c.cert.clone();
    let err = server_config(&f).unwrap_err();
    assert!(matches!(err, TlsError::NoKey { .. }), "{err}");

    let mut f = files(&c);
    f.cert = c.key.clone();
    let err = server_config(&f).unwrap_err().to_string();
    assert!(
        err.starts_with("smpp.tls.cert: ") && err.contains("no PEM certificate"),
        "{err}"
    );

    // A key that does not belong to the certificate.
    let other = test_cert();
    let mut f = files(&c);
    f.private_key = other.key.clone();
    let err = server_config(&f).unwrap_err().to_string();
    assert!(err.starts_with("smpp.tls.key: "), "{err}");
}

async fn echo_once(listener: TcpListener, tls: ServerTls) -> Result<(), HandshakeError> {
    let (tcp, _) = listener.accept().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut s = accept_by(&tls.acceptor(), tcp, deadline).await?;
    let mut buf = [0u8; 4];
    if s.read_exact(&mut buf).await.is_ok() {
        let _ = s.write_all(&buf).await;
        let _ = s.shutdown().await;
    }
    Ok(())
}

#[tokio::test]
async fn a_client_trusting_the_ca_file_talks_and_one_trusting_webpki_is_refused() {
    let c = test_cert();
    let tls = ServerTls::load(files(&c)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(echo_once(listener, tls.clone()));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = client(Some(c.cert.clone()), false)
        .connect(server_name("localhost").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    server.await.unwrap().unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(echo_once(listener, tls.clone()));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let err = client(None, false)
        .connect(server_name("localhost").unwrap(), tcp)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(server.await.unwrap().is_err());

    // Explicit opt-in: any certificate.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(echo_once(listener, tls));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = client(None, true)
        .connect(server_name("localhost").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(b"pong").await.unwrap();
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    server.await.unwrap().unwrap();
}

/// The pinned client accepts the server holding exactly the configured certificate, under
/// any name, and refuses another server's certificate.
#[tokio::test]
async fn a_pinned_client_takes_only_the_configured_certificate() {
    let ours = test_cert();
    let theirs = test_cert();
    let pinned = TlsConnector::from(pinned_client_config("admin.tls.cert", &ours.cert).unwrap());
    for (served, accepted) in [(&ours, true), (&theirs, false)] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(echo_once(listener, ServerTls::load(files(served)).unwrap()));
        let tcp = TcpStream::connect(addr).await.unwrap();
        // A name the certificate does not carry: the pin alone decides.
        let result = pinned.connect(server_name("sendium.invalid").unwrap(), tcp).await;
        match result {
            Ok(mut s) => {
                assert!(accepted, "another server's certificate was accepted");
                s.write_all(b"ping").await.unwrap();
                let mut buf = [0u8; 4];
                s.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"ping");
                server.await.unwrap().unwrap();
            }
            Err(e) => {
                assert!(!accepted, "the configured certificate was refused: {e}");
                assert!(e.to_string().contains("not the configured one"), "{e}");
                assert!(server.await.unwrap().is_err());
            }
        }
    }
    let err = pinned_client_config("admin.tls.cert", &ours.key).unwrap_err();
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
}

#[tokio::test]
async fn a_peer_that_never_speaks_times_out() {
    let c = test_cert();
    let tls = ServerTls::load(files(&c)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _silent = TcpStream::connect(addr).await.unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    let started = std::time::Instant::now();
    let err = accept_by(&tls.acceptor(), tcp, Instant::now() + Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(err, HandshakeError::Timeout), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn replace_serves_new_connections_with_the_new_certificate() {
    let first = test_cert();
    let second = test_cert();
    let tls = ServerTls::load(files(&first)).unwrap();
    tls.replace(ServerTls::prepare(files(&second)).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(echo_once(listener, tls));
    let tcp = TcpStream::connect(addr).await.unwrap();
    // Trusting only the first certificate no longer works.
    let err = client(Some(first.cert.clone()), false)
        .connect(server_name("localhost").unwrap(), tcp)
        .await;
    assert!(err.is_err());
    assert!(server.await.unwrap().is_err());
}
