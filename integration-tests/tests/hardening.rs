//! The internet-facing ports under abuse, against the real binary on 127.0.0.1 (other
//! loopback addresses, 127.x.y.z, stand in for other machines): floods of connections
//! that never bind, password and API-key guessing, slow HTTP clients, and receipt
//! callbacks aimed at the operator's own network.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use sendium_integration_tests::wire::encode_to_vec;
use sendium_integration_tests::{BindKind, CallbackServer, GatewayProcess, SubmitSpec, TestEsme};
use sendium_protocols::smpp::build::{self, BindCredentials};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// Bind `system_id`/`password` from `from`; the bind_resp's command_status (None when
/// the connection closed first).
async fn bind_status(from: Ipv4Addr, to: SocketAddr, system_id: &str, password: &str) -> Option<u32> {
    let mut conn = connect_from(from, to).await.ok()?;
    let creds = BindCredentials {
        system_id,
        password,
        system_type: "",
    };
    let pdu = build::bind(build::BindKind::Transceiver, 1, &creds).unwrap();
    conn.write_all(&encode_to_vec(&pdu)).await.ok()?;
    let mut header = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut header))
        .await
        .ok()?
        .ok()?;
    Some(u32::from_be_bytes([header[8], header[9], header[10], header[11]]))
}

/// Seconds to submit `n` messages (100 in flight) over a fresh session of esme1.
async fn submit_seconds(gw: &GatewayProcess, n: usize, tag: usize) -> f64 {
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..n)
        .map(|i| SubmitSpec::gsm("Shop", &format!("4478{tag:02}{i:06}"), "flood"))
        .collect();
    let started = Instant::now();
    let outcomes = esme.submit_pipelined(&specs, 100).await;
    let took = started.elapsed().as_secs_f64();
    assert!(outcomes.iter().all(|o| o.is_ok()));
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_idle_connections_neither_keep_an_esme_out_nor_slow_it_down() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let addr = gw.smpp_addr();
    let before = [submit_seconds(&gw, 3_000, 0).await];

    // 5,000 connections that never bind, from 400 addresses.
    let mut flood = Vec::new();
    for chunk in 0..25u32 {
        let mut opening = tokio::task::JoinSet::new();
        for i in 0..200u32 {
            let n = chunk * 200 + i;
            let from = Ipv4Addr::new(
                127,
                1,
                u8::try_from(n % 400 / 200).unwrap(),
                u8::try_from(n % 200 + 1).unwrap(),
            );
            opening.spawn(connect_from(from, addr));
        }
        while let Some(opened) = opening.join_next().await {
            flood.extend(opened.unwrap().ok());
        }
    }
    assert!(flood.len() >= 4_900, "{} connections opened", flood.len());

    // Once the listener has worked through the flood's accept queue (closing what
    // exceeds the unbound budget), an ESME binds at once and submits as usual; the
    // throughput figure is the benchmark's (`sendium-bench --flood`).
    assert!(
        wait_metric(&gw, "sendium_smpp_unbound_evicted_total", "", |n| n >= 4_500.0).await,
        "the listener took the flood"
    );
    let started = Instant::now();
    let esme = TestEsme::bind(addr, "esme1", "secret", BindKind::Transceiver).await;
    let bind_took = started.elapsed();
    assert!(esme.is_ok(), "the ESME binds during the flood");
    assert!(bind_took < Duration::from_secs(1), "bind took {bind_took:?}");
    drop(esme);
    let during = submit_seconds(&gw, 3_000, 3).await;
    println!(
        "3,000 submits: {:.3} s without the flood, {during:.3} s with it",
        before[0]
    );
    let text = gw.admin_get("/metrics").await.1;
    assert!(
        metric(&text, "sendium_smpp_unbound_connections", "") <= 256.0,
        "the unbound budget holds"
    );
    assert!(metric(&text, "sendium_smpp_unbound_evicted_total", "") >= 4_500.0);
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_passwords_backs_off_and_is_refused_while_the_real_esme_binds() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let addr = gw.smpp_addr();
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let started = Instant::now();
    let mut statuses = Vec::new();
    for i in 0..30 {
        statuses.push(bind_status(attacker, addr, "esme1", &format!("guess{i}")).await);
    }
    let took = started.elapsed();
    let wrong = 0x0000_000E; // ESME_RINVPASWD
    let refused = 0x0000_000D; // ESME_RBINDFAIL
    assert!(statuses[..10].iter().all(|s| *s == Some(wrong)), "{statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == Some(refused)), "{statuses:?}");
    // Failures 4 to 10 were answered late: 0.25 + 0.5 + 1 + 2 × 4 s.
    assert!(took >= Duration::from_millis(9_500), "guessing took only {took:?}");
    // The right password from the attacker's address is refused as well...
    assert_eq!(bind_status(attacker, addr, "esme1", "secret").await, Some(refused));
    // ...and the real ESME, elsewhere, binds at once.
    let started = Instant::now();
    assert_eq!(
        bind_status(Ipv4Addr::new(127, 0, 0, 1), addr, "esme1", "secret").await,
        Some(0)
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(wait_metric(&gw, "sendium_auth_failures_total", "listener=\"smpp\"", |n| n == 10.0).await);
    assert!(wait_metric(&gw, "sendium_auth_refused_total", "listener=\"smpp\"", |n| n >= 21.0).await);
    let log = gw.log();
    assert!(log.contains("SMPP bind refused"), "{log}");
    assert!(!log.contains("guess1"), "no password in the log");

    // Unknown API keys back off the same way, per address.
    let http = gw.http_addr();
    let mut codes = Vec::new();
    for _ in 0..12 {
        codes.push(http_status(Ipv4Addr::new(127, 0, 0, 3), http, "wrong-key").await);
    }
    assert!(codes[..10].iter().all(|c| *c == 401), "{codes:?}");
    assert!(codes[10..].iter().all(|c| *c == 429), "{codes:?}");
    assert_eq!(http_status(Ipv4Addr::new(127, 0, 0, 1), http, "key-1").await, 202);
}

/// POST a message with `key` from `from`; the response status.
async fn http_status(from: Ipv4Addr, to: SocketAddr, key: &str) -> u16 {
    let mut conn = connect_from(from, to).await.unwrap();
    let body = r#"{"from":"Shop","to":"447700900400","text":"hi"}"#;
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_http_clients_are_cut_off_by_timeouts_and_limits() {
    let smsc = smsc().await;
    let config = memory_config().replace(
        "[http]\n",
        "[http]\nheader-timeout = \"1s\"\nbody-timeout = \"1s\"\nmax-connections = 40\n",
    );
    let gw = gateway(&config, &smsc).await;
    let http = gw.http_addr();
    let closed_within = |mut conn: TcpStream, limit: Duration| async move {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(limit, conn.read_to_end(&mut buf)).await;
        (read.is_ok(), String::from_utf8_lossy(&buf).into_owned())
    };

    // Headers that never finish.
    let mut slow = TcpStream::connect(http).await.unwrap();
    slow.write_all(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (closed, _) = closed_within(slow, Duration::from_secs(5)).await;
    assert!(closed, "a connection whose headers never finish is closed");

    // A body trickled a byte a second: 408, on each endpoint that reads a body.
    let heads: [&[u8]; 3] = [
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1\r\nContent-Length: 60\r\n\r\n{",
        b"POST /v1/providers/upstream/receipts HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n[",
        b"POST /cgi-bin/sendsms HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 60\r\n\r\nu",
    ];
    let mut feeders = Vec::new();
    for head in heads {
        let mut trickle = TcpStream::connect(http).await.unwrap();
        trickle.write_all(head).await.unwrap();
        feeders.push(tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if trickle.write_all(b" ").await.is_err() {
                    break;
                }
            }
            trickle
        }));
    }
    for feeder in feeders {
        let trickle = feeder.await.unwrap();
        let (_, answer) = closed_within(trickle, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }

    // Idle keep-alive connections beyond max-connections are refused; the idle ones
    // are closed after header-timeout, and the listener serves again.
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(TcpStream::connect(http).await.unwrap());
    }
    let mut waiting = tokio::task::JoinSet::new();
    for c in idle {
        waiting.spawn(closed_within(c, Duration::from_secs(5)));
    }
    while let Some(closed) = waiting.join_next().await {
        assert!(closed.unwrap().0, "every idle connection closed");
    }
    let r = gw
        .post_message("key-1", r#"{"from":"Shop","to":"447700900401","text":"after"}"#)
        .await
        .unwrap();
    assert_eq!(r.status, 202);
    let text = gw.admin_get("/metrics").await.1;
    assert!(
        metric(&text, "sendium_http_connections_refused_total", "") >= 20.0,
        "{text}"
    );
    assert!(metric(&text, "sendium_http_timeouts_total", "what=\"headers\"") >= 40.0);
    assert_eq!(metric(&text, "sendium_http_timeouts_total", "what=\"body\""), 3.0);
    assert_eq!(
        metric(&text, "sendium_provider_receipt_requests_total", "status=\"408\""),
        1.0
    );
}

/// The memory profile with callbacks under the default policy (nothing internal).
fn default_policy_config() -> String {
    let config = memory_config();
    let opened = "callback-allow = [\"127.0.0.0/8\", \"::1/128\"]\n";
    assert!(config.contains(opened));
    config.replace(opened, "")
}

async fn post(gw: &GatewayProcess, to: &str, callback: &str) -> (u16, serde_json::Value) {
    let body = format!(r#"{{"from":"Shop","to":"{to}","text":"hello","callback_url":"{callback}"}}"#);
    let r = gw.post_message("key-1", &body).await.unwrap();
    (r.status, serde_json::from_slice(&r.body).unwrap_or_default())
}

/// A name other than `localhost` that this machine resolves to a loopback address
/// (from /etc/hosts).
fn loopback_name() -> String {
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    hosts
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let addr = words.next()?;
            addr.starts_with("127.")
                .then(|| words.find(|n| !n.contains("localhost") && !n.starts_with('#')))?
        })
        .next()
        .map(str::to_string)
        .expect("this test needs a name other than localhost for 127.0.0.1 in /etc/hosts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_to_internal_addresses_are_refused_at_submission_and_after_name_resolution() {
    let smsc = smsc().await;
    let gw = gateway(&default_policy_config(), &smsc).await;
    for target in [
        "http://169.254.169.254/latest",
        "http://127.0.0.1:9090/admin/reload",
        "http://2130706433/",
        "http://[::1]:8080/",
        "http://[::ffff:10.0.0.1]/",
        "http://192.168.1.10/cb",
        "http://localhost:8080/cb",
    ] {
        let (status, body) = post(&gw, "447700900301", target).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert_eq!(body["field"], "callback_url", "{target}: {body}");
    }

    // A name that resolves to loopback passes the submission check, and is caught when
    // the callback connects: nothing reaches the sink, the receipt is given up.
    let sink = CallbackServer::start().await;
    let name = loopback_name();
    let url = format!("http://{name}:{}/cb", sink.addr().port());
    let (status, body) = post(&gw, "447700900302", &url).await;
    assert_eq!(status, 202, "{body}");
    assert!(smsc.wait_for(WAIT, |s| !s.messages_to("447700900302").is_empty()).await);
    assert!(
        wait_metric(
            &gw,
            "sendium_receipt_delivery_failures_total",
            "reason=\"forbidden\"",
            |n| n >= 1.0
        )
        .await,
        "the callback was refused at connect time"
    );
    assert!(sink.requests().is_empty(), "the sink was never called");
    assert!(!gw.log().contains(&name), "the target is not logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_allow_opens_a_network_and_redirects_are_not_followed() {
    let smsc = smsc().await;
    let config = default_policy_config().replace("[http]\n", "[http]\ncallback-allow = [\"127.0.0.0/8\"]\n");
    let gw = gateway(&config, &smsc).await;
    let sink = CallbackServer::start().await;
    let (status, body) = post(&gw, "447700900311", &sink.url("/cb")).await;
    assert_eq!(status, 202, "{body}");
    assert!(
        sink.wait_accepted(1, WAIT).await,
        "an allowed network gets its callback"
    );
    // IPv6 loopback is still refused: only 127.0.0.0/8 was opened.
    let (status, _) = post(&gw, "447700900312", "http://[::1]:9/cb").await;
    assert_eq!(status, 400);

    // A callback target answering with a redirect to the sink: not followed.
    let redirector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = redirector.local_addr().unwrap().port();
    let location = sink.url("/redirected");
    let answered = tokio::spawn(async move {
        let (mut conn, _) = redirector.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = conn.read(&mut buf).await.unwrap();
        let reply = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(reply.as_bytes()).await.unwrap();
    });
    let before = sink.requests().len();
    let (status, body) = post(&gw, "447700900313", &format!("http://127.0.0.1:{port}/cb")).await;
    assert_eq!(status, 202, "{body}");
    tokio::time::timeout(WAIT, answered).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.requests().len(), before, "the redirect was not followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_reused_for_another_message_is_refused_and_a_retry_is_answered() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let send = |to: &'static str, text: &'static str| {
        let body = format!(r#"{{"from":"Shop","to":"{to}","text":"{text}","idempotency_key":"order-77"}}"#);
        let gw = &gw;
        async move {
            let r = gw.post_message("key-1", &body).await.unwrap();
            (r.status, serde_json::from_slice::<serde_json::Value>(&r.body).unwrap())
        }
    };
    let (status, first) = send("447700900501", "your code is 1234").await;
    assert_eq!(status, 202, "{first}");
    let (status, retry) = send("447700900501", "your code is 1234").await;
    assert_eq!(status, 202, "{retry}");
    assert_eq!(retry["id"], first["id"]);
    assert_eq!(retry["duplicate"], true);
    for (to, text) in [
        ("447700900501", "your code is 9999"),
        ("447700900502", "your code is 1234"),
    ] {
        let (status, body) = send(to, text).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["field"], "idempotency_key", "{body}");
    }
    assert!(smsc.wait_for(WAIT, |s| s.messages().len() == 1).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(smsc.messages().len(), 1, "one message went out");
}

/// `allowed-ips` on an SMPP account and on an API key: a bind or request from another
/// address is refused (ESME_RBINDFAIL, 403) and counted, whatever its credentials; from
/// a listed address (or network) it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_ips_lock_accounts_and_api_keys_to_their_addresses() {
    let smsc = smsc().await;
    let locked = r#"
[[smpp.accounts]]
system-id = "locked"
password = "pw"
allowed-ips = ["127.0.0.2", "127.3.0.0/16"]
"#;
    let key = r#"
[[http.api-keys]]
key = "key-locked"
account = "esme1"
allowed-ips = ["127.0.0.2"]
"#;
    let config = [SMPP, locked, HTTP, key, ADMIN, UPSTREAM, DEFAULT_ROUTE].concat();
    let gw = gateway(&config, &smsc).await;
    let smpp = SocketAddr::from((Ipv4Addr::LOCALHOST, gw.smpp_addr().port()));
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, gw.http_addr().port()));
    let ok = 0;
    let bindfail = 0x0D;
    assert_eq!(
        bind_status(Ipv4Addr::new(127, 0, 0, 2), smpp, "locked", "pw").await,
        Some(ok)
    );
    assert_eq!(
        bind_status(Ipv4Addr::new(127, 3, 9, 9), smpp, "locked", "pw").await,
        Some(ok)
    );
    assert_eq!(
        bind_status(Ipv4Addr::new(127, 0, 0, 9), smpp, "locked", "pw").await,
        Some(bindfail),
        "a listed account binding from elsewhere"
    );
    assert_eq!(
        bind_status(Ipv4Addr::new(127, 0, 0, 9), smpp, "esme1", "secret").await,
        Some(ok),
        "an account without allowed-ips binds from anywhere"
    );
    assert_eq!(http_status(Ipv4Addr::new(127, 0, 0, 2), http, "key-locked").await, 202);
    assert_eq!(http_status(Ipv4Addr::new(127, 0, 0, 9), http, "key-locked").await, 403);
    assert_eq!(http_status(Ipv4Addr::new(127, 0, 0, 9), http, "key-1").await, 202);
    assert!(
        wait_metric(&gw, "sendium_auth_address_refused_total", "listener=\"smpp\"", |v| v
            == 1.0)
        .await
    );
    assert!(
        wait_metric(&gw, "sendium_auth_address_refused_total", "listener=\"http\"", |v| v
            == 1.0)
        .await
    );
    assert!(!gw.log().contains("\"pw\""), "no password in the log");
}
