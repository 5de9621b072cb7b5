//! TLS on the real gateway, with certificates made in each test (rcgen, self-signed for
//! `localhost` and 127.0.0.1): an ESME binds on `[smpp.tls]` and gets its receipt while the
//! plain listener keeps serving plain SMPP; a `tls = true` destination reaches a TLS-fronted test
//! SMSC, and one that does not trust the SMSC's certificate sends nothing and says why; a
//! flood of connections that never finish a handshake does not keep a real ESME out; the
//! HTTP ingress and the admin listener serve HTTPS, and `sendium healthcheck` reaches the
//! latter by its configuration or a CA file; SIGHUP swaps the certificate for new
//! connections while a bound session keeps working, and a bad certificate refuses the
//! reload; an unreadable key fails startup naming the key and the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sendium_integration_tests::BindError;
use sendium_integration_tests::esme::EsmeOptions;
use sendium_integration_tests::{
    BindKind, GatewayProcess, SmscConfig, SubmitSpec, TestEsme, TestSmsc, TlsClient, TlsFront, free_port, http,
    sendium_command,
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A self-signed certificate and its key, as PEM files in `dir`.
struct Cert {
    cert: PathBuf,
    key: PathBuf,
}

fn make_cert(dir: &Path, name: &str) -> Cert {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    Cert { cert, key }
}

fn trusting(cert: &Cert) -> TlsClient {
    TlsClient::trusting(&cert.cert, "localhost")
}

async fn bind_tls(addr: std::net::SocketAddr, trusted: &Cert) -> Result<TestEsme, BindError> {
    TestEsme::bind_with(
        addr,
        "esme1",
        "secret",
        BindKind::Transceiver,
        over_tls(&trusting(trusted)),
    )
    .await
}

async fn submit_ok(esme: &TestEsme, to: &str, text: &str) {
    let resp = esme.submit(&SubmitSpec::gsm("Shop", to, text)).await.unwrap();
    assert!(resp.is_ok(), "{resp:?}");
}

fn over_tls(client: &TlsClient) -> EsmeOptions {
    EsmeOptions {
        tls: Some(client.clone()),
        ..EsmeOptions::default()
    }
}

async fn tls_gateway(config: &str, smsc: &TestSmsc) -> (GatewayProcess, std::net::SocketAddr) {
    let port = free_port();
    let gw = GatewayProcess::builder(config)
        .smsc_port(smsc.port())
        .var("smpp_tls_port", &port.to_string())
        .start()
        .await;
    (gw, std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

fn smpp_section(cert: &Cert, extra: &str) -> String {
    format!(
        "[smpp]\nlisten = \"127.0.0.1:{{smpp_port}}\"\nwindow = 1000\n{extra}\
         [smpp.tls]\nlisten = \"127.0.0.1:{{smpp_tls_port}}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         [[smpp.accounts]]\nsystem-id = \"esme1\"\npassword = \"secret\"\nmax-binds = 8\n",
        cert.cert.display(),
        cert.key.display()
    )
}

fn config_with(smpp: &str) -> String {
    [smpp, HTTP, ADMIN, UPSTREAM, DEFAULT_ROUTE].concat()
}

#[tokio::test]
async fn an_esme_binds_over_tls_submits_and_gets_its_receipt_while_plain_smpp_serves_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let smsc = smsc().await;
    let (gw, tls_addr) = tls_gateway(&config_with(&smpp_section(&cert, "")), &smsc).await;

    let esme = bind_tls(tls_addr, &cert).await.unwrap();
    let resp = esme
        .submit(&SubmitSpec::gsm("Shop", "447700900001", "over TLS").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok(), "{resp:?}");
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts.len(), 1, "{}", gw.log());
    assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
    assert_eq!(smsc.messages_to("447700900001").len(), 1);

    // The plain listener is unchanged: same account, plain SMPP.
    let plain = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    submit_ok(&plain, "447700900002", "plain").await;
    // And plain SMPP on the TLS port does not bind.
    let refused = TestEsme::bind_with(
        tls_addr,
        "esme1",
        "secret",
        BindKind::Transceiver,
        EsmeOptions {
            bind_timeout: Duration::from_secs(8),
            ..EsmeOptions::default()
        },
    )
    .await;
    assert!(refused.is_err(), "a plain bind on the TLS listener must fail");
}

fn tls_destination(front_port: u16, ca: &Path) -> String {
    format!(
        "\n[[destinations]]\nname = \"secure\"\nkind = \"smpp\"\nhost = \"127.0.0.1\"\nport = {front_port}\n\
         system-id = \"sendium\"\npassword = \"pw\"\nreconnect-min = \"50ms\"\nreconnect-max = \"500ms\"\n\
         response-timeout = \"2s\"\ntls = true\ntls-ca = \"{}\"\ntls-server-name = \"localhost\"\n\
         [[routes]]\nname = \"secure\"\nto = [\"secure\"]\n",
        ca.display()
    )
}

#[tokio::test]
async fn a_tls_destination_reaches_a_tls_smsc_and_messages_flow() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "smsc");
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let front = TlsFront::start(&cert.cert, &cert.key, smsc.addr()).await;
    let config = [SMPP, HTTP, ADMIN, &tls_destination(front.port(), &cert.cert)].concat();
    let gw = GatewayProcess::builder(&config).start().await;
    assert!(smsc.wait_bound(1, WAIT).await, "{}", gw.log());
    assert!(front.handshakes() >= 1);

    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    // Enough traffic for full windows and batched writes both ways through TLS.
    let specs: Vec<SubmitSpec> = (0..500)
        .map(|i| SubmitSpec::gsm("Shop", &format!("4477009{i:05}"), "through TLS").dlr())
        .collect();
    for o in esme.submit_pipelined(&specs, 100).await {
        assert!(o.is_ok(), "{o:?}");
    }
    assert!(smsc.wait_messages(500, WAIT).await, "{}", gw.log());
    assert_eq!(
        esme.wait_receipts(500, WAIT).await.len(),
        500,
        "receipts came back through TLS"
    );
}

#[tokio::test]
async fn a_destination_that_does_not_trust_the_smsc_certificate_sends_nothing_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let served = make_cert(dir.path(), "served");
    let trusted = make_cert(dir.path(), "trusted");
    let smsc = TestSmsc::start(SmscConfig::default()).await;
    let front = TlsFront::start(&served.cert, &served.key, smsc.addr()).await;
    let config = [SMPP, HTTP, ADMIN, &tls_destination(front.port(), &trusted.cert)].concat();
    let gw = GatewayProcess::builder(&config).start().await;

    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    submit_ok(&esme, "447700900001", "held back").await;
    // It keeps trying with backoff: several refusals, each a clear line.
    let refusals = || {
        gw.log()
            .lines()
            .filter(|l| {
                l.contains("SMPP destination TLS failed")
                    && l.contains("secure")
                    && l.contains("invalid peer certificate")
            })
            .count()
    };
    assert!(eventually(WAIT, || refusals() >= 3).await, "{}", gw.log());
    // The front counts a refusal once it has read the client's alert, after the gateway
    // logged it.
    assert!(
        eventually(WAIT, || front.failed_handshakes() >= 3).await,
        "the front saw {} failed handshakes",
        front.failed_handshakes()
    );
    assert_eq!(front.handshakes(), 0);
    assert!(smsc.submits().is_empty(), "nothing may reach an untrusted server");
    let (_, destinations) = gw.admin_get("/admin/destinations").await;
    assert!(destinations.contains("\"reconnecting\""), "{destinations}");
}

/// Opens `n` connections to `addr` that never complete a TLS handshake (half of them
/// send nothing, half a truncated ClientHello) and report when the server closes them.
async fn stalled_handshakes(addr: std::net::SocketAddr, n: usize) -> tokio::task::JoinSet<Option<Instant>> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            // A handshake record header announcing 512 bytes, then 3 of them.
            s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01])
                .await
                .unwrap();
        }
        set.spawn(async move {
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(WAIT, async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await;
            closed.ok().map(|()| Instant::now())
        });
    }
    set
}

#[tokio::test]
async fn connections_that_never_finish_a_handshake_do_not_keep_a_real_esme_out() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let smsc = smsc().await;
    // Every test connection comes from 127.0.0.1, so the per-address budget is opened
    // up; the total unbound budget (100) and the bind timeout bound the flood.
    let limits = "max-unbound = 100\nmax-unbound-per-address = 1000\nbind-timeout = \"8s\"\n";
    let (gw, tls_addr) = tls_gateway(&config_with(&smpp_section(&cert, limits)), &smsc).await;

    let mut flood = stalled_handshakes(tls_addr, 300).await;
    let started = Instant::now();
    let esme = bind_tls(tls_addr, &cert).await.unwrap();
    let bound_in = started.elapsed();
    // Well inside the bind timeout: it did not wait for the stalled ones to time out.
    assert!(bound_in < Duration::from_secs(5), "bound after {bound_in:?}");
    submit_ok(&esme, "447700900001", "despite the flood").await;

    // Each stalled handshake held an unbound place: the oldest were closed to make room,
    // the rest at the bind timeout.
    let mut closed = 0;
    while let Some(done) = flood.join_next().await {
        if done.unwrap().is_some() {
            closed += 1;
        }
    }
    assert_eq!(closed, 300, "every stalled handshake was closed by the gateway");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        wait_metric(&gw, "sendium_tls_handshake_failures_total", "reason=\"timeout\"", |n| n
            >= 1.0)
        .await,
        "handshakes that ran out of time are counted"
    );
    // The bound session outlived them all.
    submit_ok(&esme, "447700900002", "still bound").await;
}

#[tokio::test]
async fn the_http_ingress_and_the_admin_listener_serve_https() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "web");
    let smsc = smsc().await;
    let tls = format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n",
        cert.cert.display(),
        cert.key.display()
    );
    let http = HTTP.replacen("[http]\n", &format!("[http]\n{tls}"), 1);
    let admin = ADMIN.replacen("[admin]\n", &format!("[admin]\n{tls}"), 1);
    let config = [SMPP, &http, &admin, UPSTREAM, DEFAULT_ROUTE].concat();
    let mut gw = GatewayProcess::builder(&config).smsc_port(smsc.port()).spawn();
    let client = trusting(&cert);

    // Readiness over HTTPS (the kit's own readiness poll speaks plain HTTP).
    let ready = async {
        loop {
            if let Ok(r) = http::request_tls(gw.admin_addr(), &client, "GET", "/readyz", &[], None).await
                && r.status == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(WAIT, ready)
        .await
        .unwrap_or_else(|_| panic!("{}", gw.log()));

    // `sendium healthcheck` over HTTPS: from the configuration (exactly its certificate),
    // or against a CA file; not over plain HTTP, not trusting another certificate.
    let other = make_cert(dir.path(), "other");
    let admin_addr = gw.admin_addr().to_string();
    let config_path = gw.config_path().display().to_string();
    let healthcheck = |args: &[&str]| {
        let out = sendium_command().arg("healthcheck").args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = healthcheck(&["--config", &config_path]);
    assert!(ok, "{err}");
    let (ok, err) = healthcheck(&["--addr", &admin_addr, "--ca", &cert.cert.display().to_string()]);
    assert!(ok, "{err}");
    let (ok, err) = healthcheck(&[
        "--addr",
        &admin_addr,
        "--ca",
        &cert.cert.display().to_string(),
        "--server-name",
        "localhost",
    ]);
    assert!(ok, "{err}");
    let (ok, _) = healthcheck(&["--addr", &admin_addr]);
    assert!(!ok, "plain HTTP to the HTTPS admin listener");
    let (ok, err) = healthcheck(&["--addr", &admin_addr, "--ca", &other.cert.display().to_string()]);
    assert!(!ok && err.contains("certificate"), "another CA: {err}");
    let pinned_other = dir.path().join("other.toml");
    let cfg = std::fs::read_to_string(gw.config_path()).unwrap();
    std::fs::write(
        &pinned_other,
        cfg.replace(&cert.cert.display().to_string(), &other.cert.display().to_string()),
    )
    .unwrap();
    let (ok, err) = healthcheck(&["--config", &pinned_other.display().to_string()]);
    assert!(
        !ok && err.contains("not the configured one"),
        "another pinned certificate: {err}"
    );

    let body = br#"{"from": "Shop", "to": "447700900123", "text": "over HTTPS"}"#;
    let headers = [("Authorization", "Bearer key-1"), ("Content-Type", "application/json")];
    let r = http::request_tls(gw.http_addr(), &client, "POST", "/v1/messages", &headers, Some(body))
        .await
        .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(smsc.wait_messages(1, WAIT).await, "{}", gw.log());
    assert_eq!(smsc.messages_to("447700900123").len(), 1);

    // Plain HTTP on either port gets no answer.
    assert!(http::get(gw.http_addr(), "/healthz").await.is_err());
    assert!(http::get(gw.admin_addr(), "/healthz").await.is_err());
    gw.kill();
}

#[tokio::test]
async fn sighup_serves_a_new_certificate_to_new_connections_while_a_bound_session_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let old = make_cert(dir.path(), "old");
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let served = Cert {
        cert: live.join("cert.pem"),
        key: live.join("key.pem"),
    };
    std::fs::copy(&old.cert, &served.cert).unwrap();
    std::fs::copy(&old.key, &served.key).unwrap();
    let smsc = smsc().await;
    let (gw, tls_addr) = tls_gateway(&config_with(&smpp_section(&served, "")), &smsc).await;

    let bound = bind_tls(tls_addr, &old).await.unwrap();
    submit_ok(&bound, "447700900001", "before").await;

    let new = make_cert(dir.path(), "new");
    std::fs::copy(&new.cert, &served.cert).unwrap();
    std::fs::copy(&new.key, &served.key).unwrap();
    let hup = |gw: &GatewayProcess| {
        let pid = gw.pid().unwrap().to_string();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    };
    hup(&gw);
    assert!(wait_metric(&gw, "sendium_config_reloads_total", "outcome=\"ok\"", |n| n == 1.0).await);

    let fresh = bind_tls(tls_addr, &new).await.unwrap();
    submit_ok(&fresh, "447700900002", "new cert").await;
    let stale = bind_tls(tls_addr, &old).await;
    assert!(
        stale.is_err(),
        "a client trusting only the old certificate is refused now"
    );
    // The session bound before the reload was not dropped.
    assert!(!bound.is_closed());
    submit_ok(&bound, "447700900003", "after").await;

    // A certificate file that is not a certificate: the reload is refused, naming the key
    // and the file, and the running certificate stays.
    std::fs::write(&served.cert, "not a certificate\n").unwrap();
    hup(&gw);
    assert!(
        eventually(WAIT, || {
            let log = gw.log();
            log.contains("configuration reload refused")
                && log.contains("smpp.tls.cert")
                && log.contains(&served.cert.display().to_string())
        })
        .await,
        "{}",
        gw.log()
    );
    let again = bind_tls(tls_addr, &new).await.unwrap();
    submit_ok(&again, "447700900004", "kept").await;
    submit_ok(&bound, "447700900005", "still").await;
    assert!(smsc.wait_messages(5, WAIT).await);
}

#[tokio::test]
async fn startup_with_an_unreadable_key_fails_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let missing = Cert {
        cert: cert.cert.clone(),
        key: dir.path().join("no-such-key.pem"),
    };
    let config = config_with(&smpp_section(&missing, ""));
    let mut gw = GatewayProcess::builder(&config)
        .smsc_port(free_port())
        .var("smpp_tls_port", &free_port().to_string())
        .spawn();
    let status = gw.wait_exit(WAIT).await.expect("sendium must exit");
    assert!(!status.success());
    let log = gw.log();
    assert!(
        log.contains("smpp.tls.key") && log.contains(&missing.key.display().to_string()),
        "{log}"
    );
}

fn check_config(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sendium.toml");
    std::fs::write(&path, config).unwrap();
    let out = sendium_integration_tests::sendium_command()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn check_config_reads_the_tls_files_and_names_the_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let cert = make_cert(dir.path(), "server");
    let smpp = smpp_section(&cert, "")
        .replace("{smpp_port}", "2775")
        .replace("{smpp_tls_port}", "3550");
    let destination = tls_destination(2776, &cert.cert);
    let (ok, out) = check_config(&[smpp.as_str(), &destination].concat());
    assert!(ok, "{out}");
    assert!(out.contains("SMPP over TLS on 127.0.0.1:3550"), "{out}");
    assert!(out.contains("destination secure over TLS, trusts"), "{out}");

    let missing_ca = tls_destination(2776, &dir.path().join("no-ca.pem"));
    let (ok, out) = check_config(&[smpp.as_str(), &missing_ca].concat());
    assert!(!ok);
    assert!(
        out.contains("destinations[0].tls-ca") && out.contains("no-ca.pem"),
        "{out}"
    );

    let off = destination.replace("tls = true\n", "");
    let (ok, out) = check_config(&[smpp.as_str(), &off].concat());
    assert!(!ok);
    assert!(
        out.contains("destinations[0].tls-ca") && out.contains("only used with tls = true"),
        "{out}"
    );

    // An HTTP destination's https:// url: its CA file is read at startup too.
    let https = |ca: &Path| {
        format!(
            "\n[[destinations]]\nname = \"api\"\nkind = \"http\"\nurl = \"https://localhost:8443/send\"\ntls-ca = \"{}\"\n",
            ca.display()
        )
    };
    let (ok, out) = check_config(&[smpp.as_str(), &destination, &https(&cert.cert)].concat());
    assert!(ok, "{out}");
    assert!(out.contains("destination api over HTTPS, trusts"), "{out}");
    let (ok, out) = check_config(&[smpp.as_str(), &destination, &https(&dir.path().join("none.pem"))].concat());
    assert!(!ok);
    assert!(
        out.contains("destinations[1].tls-ca") && out.contains("none.pem"),
        "{out}"
    );
}

/// A CA, and client certificates it signs for a subject CN.
struct ClientCa {
    dir: PathBuf,
    cert: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl ClientCa {
    fn new(dir: &Path) -> ClientCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Test client CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        let cert = dir.join("client-ca.pem");
        std::fs::write(&cert, ca.pem()).unwrap();
        ClientCa {
            dir: dir.to_owned(),
            cert,
            ca,
            ca_key: key,
        }
    }

    /// A client certificate for `cn`, signed by this CA (or self-signed when `signed` is
    /// false).
    fn client(&self, cn: &str, signed: bool) -> Cert {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = if signed {
            params.signed_by(&key, &self.ca, &self.ca_key).unwrap()
        } else {
            params.self_signed(&key).unwrap()
        };
        let name = format!("{cn}-{}", if signed { "signed" } else { "self" });
        let out = Cert {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
        };
        std::fs::write(&out.cert, cert.pem()).unwrap();
        std::fs::write(&out.key, key.serialize_pem()).unwrap();
        out
    }
}

#[tokio::test]
async fn mutual_tls_binds_only_with_a_certificate_of_the_accounts_subject() {
    let dir = tempfile::tempdir().unwrap();
    let server = make_cert(dir.path(), "server");
    let ca = ClientCa::new(dir.path());
    let smpp = format!(
        "[smpp]\nlisten = \"127.0.0.1:{{smpp_port}}\"\n\
         [smpp.tls]\nlisten = \"127.0.0.1:{{smpp_tls_port}}\"\ncert = \"{}\"\nkey = \"{}\"\nclient-ca = \"{}\"\n\
         [[smpp.accounts]]\nsystem-id = \"esme1\"\npassword = \"secret\"\ntls-subject = \"CN=esme1\"\n\
         [[smpp.accounts]]\nsystem-id = \"esme2\"\npassword = \"secret2\"\n",
        server.cert.display(),
        server.key.display(),
        ca.cert.display()
    );
    let smsc = smsc().await;
    let (gw, tls_addr) = tls_gateway(&config_with(&smpp), &smsc).await;
    let as_client = |c: &Cert| EsmeOptions {
        tls: Some(TlsClient::trusting_with_certificate(
            &server.cert,
            "localhost",
            &c.cert,
            &c.key,
        )),
        ..EsmeOptions::default()
    };
    let bind = |id: &'static str, pw: &'static str, options: EsmeOptions| async move {
        TestEsme::bind_with(tls_addr, id, pw, BindKind::Transceiver, options).await
    };

    let esme1 = ca.client("esme1", true);
    let esme = bind("esme1", "secret", as_client(&esme1)).await.unwrap();
    submit_ok(&esme, "447700900001", "mutual").await;

    // The right chain, another subject: refused before the password is looked at.
    let intruder = ca.client("intruder", true);
    let refused = bind("esme1", "secret", as_client(&intruder)).await;
    assert!(
        matches!(refused, Err(BindError::Rejected { status }) if status == sendium_integration_tests::CommandStatus::EsmeRbindfail),
        "{refused:?}"
    );
    // An account without tls-subject takes any certificate of the CA.
    let other = bind("esme2", "secret2", as_client(&intruder)).await.unwrap();
    submit_ok(&other, "447700900002", "any subject").await;
    // No client certificate, or one the CA did not sign: no handshake.
    assert!(bind("esme2", "secret2", over_tls(&trusting(&server))).await.is_err());
    assert!(
        bind("esme1", "secret", as_client(&ca.client("esme1", false)))
            .await
            .is_err()
    );
    // The account's subject is only reachable over TLS: a plain bind is refused.
    let plain = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver).await;
    assert!(matches!(plain, Err(BindError::Rejected { .. })), "{plain:?}");
    assert!(
        gw.log()
            .contains("the account's tls-subject requires a client certificate"),
        "{}",
        gw.log()
    );
    submit_ok(&esme, "447700900003", "still bound").await;
}
