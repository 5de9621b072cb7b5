//! The provider task against a real HTTP server on 127.0.0.1: no more than `window`
//! requests at once, `max-tps` pacing, and reachability (down after [`DOWN_AFTER`]
//! requests in a row could not connect, up again once a probe connects).
//!
//! Test code only (`cfg(test)`): a test that cannot bind or connect on loopback fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};

use super::*;
use crate::smpp::SmppAddress;
use render::{Piece, Placeholder};

const WAIT: Duration = Duration::from_secs(10);

/// A provider that answers each request `200 {"id":"…"}` once a permit is released
/// (all at once when built `open`), counting the requests it holds at the same time.
struct Server {
    addr: SocketAddr,
    permits: Arc<Semaphore>,
    holding: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(open: bool) -> Server {
        Self::on(TcpListener::bind("127.0.0.1:0").await.unwrap(), open)
    }

    fn on(listener: TcpListener, open: bool) -> Server {
        let addr = listener.local_addr().unwrap();
        let permits = Arc::new(Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }));
        let holding = Arc::new(AtomicUsize::new(0));
        let most_at_once = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (p, h, m, s) = (permits.clone(), holding.clone(), most_at_once.clone(), served.clone());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (p, h, m, s) = (p.clone(), h.clone(), m.clone(), s.clone());
                connections.spawn(async move { serve(stream, p, h, m, s).await });
            }
        });
        Server {
            addr,
            permits,
            holding,
            most_at_once,
            served,
            task,
        }
    }

    fn holding(&self) -> usize {
        self.holding.load(Ordering::SeqCst)
    }

    /// Stops accepting and drops every open connection.
    fn stop(self) {
        self.task.abort();
    }
}

/// One request per connection (`Connection: close`), so a stopped server leaves no
/// pooled connection behind.
async fn serve(
    mut stream: TcpStream,
    permits: Arc<Semaphore>,
    holding: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let Ok(n) = stream.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let Ok(n) = stream.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
    most_at_once.fetch_max(now, Ordering::SeqCst);
    let Ok(permit) = permits.acquire().await else { return };
    permit.forget();
    holding.fetch_sub(1, Ordering::SeqCst);
    let n = served.fetch_add(1, Ordering::SeqCst);
    let body = format!("{{\"id\":\"p-{n}\"}}");
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
}

/// Collects what the task reports, in order.
struct Events(mpsc::UnboundedSender<ClientEvent>);

impl ClientEvents for Events {
    fn on_events(&self, events: Vec<ClientEvent>) {
        for e in events {
            let _ = self.0.send(e);
        }
    }
}

fn config(addr: SocketAddr, window: usize, max_tps: u32) -> HttpProviderConfig {
    HttpProviderConfig {
        name: "p".into(),
        url: format!("http://{addr}/send"),
        encoding: Encoding::Json,
        headers: vec![("X-Api-Key".into(), "k".into())],
        fields: vec![
            ("to".into(), vec![Piece::Value(Placeholder::To)]),
            ("msg".into(), vec![Piece::Value(Placeholder::Text)]),
        ],
        id_pointer: Some("/id".into()),
        callback: String::new(),
        window,
        max_tps,
        response_timeout: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
        trust: crate::http_client::Trust::WebPki,
    }
}

fn submits(tokens: std::ops::Range<u64>) -> Vec<(u64, HttpSubmit)> {
    tokens
        .map(|t| {
            let part = OutboundSubmit {
                service_type: String::new(),
                source: SmppAddress::new(5, 0, "Shop"),
                destination: SmppAddress::new(1, 1, "447700900123"),
                esm_class: 0,
                protocol_id: 0,
                priority_flag: 0,
                registered_delivery: 1,
                data_coding: 0,
                short_message: b"hello".to_vec(),
                schedule_delivery_time: None,
            };
            (
                t,
                HttpSubmit {
                    part,
                    id: format!("m-{t}"),
                },
            )
        })
        .collect()
}

fn start(cfg: HttpProviderConfig) -> (HttpProvider, mpsc::UnboundedReceiver<ClientEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (HttpProvider::start(cfg, Arc::new(Events(tx))), rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<ClientEvent>) -> ClientEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("no event")
        .expect("task gone")
}

/// The results of `n` submissions (other events in between are skipped).
async fn results(rx: &mut mpsc::UnboundedReceiver<ClientEvent>, n: usize) -> Vec<(u64, Result<String, SubmitFailure>)> {
    let mut got = Vec::new();
    while got.len() < n {
        if let ClientEvent::SubmitResult { token, result } = next(rx).await {
            got.push((token, result));
        }
    }
    got.sort_by_key(|(t, _)| *t);
    got
}

async fn until(mut ok: impl FnMut() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("condition not reached");
}

#[tokio::test]
async fn no_more_than_the_window_at_once() {
    let server = Server::start(false).await;
    let (provider, mut rx) = start(config(server.addr, 3, 0));
    assert!(matches!(next(&mut rx).await, ClientEvent::Up));
    provider.submit(submits(0..10));
    until(|| server.holding() == 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server.holding(),
        3,
        "a fourth request went out while three were unanswered"
    );
    server.permits.add_permits(10);
    let got = results(&mut rx, 10).await;
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|(_, r)| r.as_ref().is_ok_and(|id| id.starts_with("p-"))));
    assert_eq!(server.most_at_once.load(Ordering::SeqCst), 3);
    assert_eq!(server.served.load(Ordering::SeqCst), 10);
    let counted: u64 = provider
        .results()
        .iter()
        .filter(|(c, _)| *c == "2xx")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(counted, 10);
    provider.stop();
}

#[tokio::test]
async fn max_tps_spaces_the_requests() {
    let server = Server::start(true).await;
    let (provider, mut rx) = start(config(server.addr, 10, 20));
    assert!(matches!(next(&mut rx).await, ClientEvent::Up));
    let started = tokio::time::Instant::now();
    provider.submit(submits(0..11));
    let got = results(&mut rx, 11).await;
    assert!(got.iter().all(|(_, r)| r.is_ok()));
    // 11 requests at 20 per second: the last starts 10 intervals of 50 ms after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(480),
        "11 requests at max-tps 20 took only {:?}",
        started.elapsed()
    );
    provider.stop();
}

#[tokio::test]
async fn down_after_failed_connects_and_up_once_a_probe_connects() {
    // A port nothing listens on, kept to listen on later.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (provider, mut rx) = start(config(addr, 2, 0));
    provider.submit(submits(0..2));
    let got = results(&mut rx, 2).await;
    assert!(
        got.iter().all(|(_, r)| *r == Err(SubmitFailure::NotBound)),
        "submissions before the first successful probe are refused: {got:?}"
    );
    assert!(!provider.is_up());

    let server = Server::on(TcpListener::bind(addr).await.unwrap(), true);
    assert!(matches!(next(&mut rx).await, ClientEvent::Up), "a probe connected");
    assert!(provider.is_up());
    provider.submit(submits(10..12));
    assert!(results(&mut rx, 2).await.iter().all(|(_, r)| r.is_ok()));

    server.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Each request that cannot connect fails as `NotBound`; the third in a row says down.
    let mut failed = 0;
    let mut down = false;
    for t in 20..20 + u64::from(DOWN_AFTER) {
        provider.submit(submits(t..t + 1));
        loop {
            match next(&mut rx).await {
                ClientEvent::Down { .. } => down = true,
                ClientEvent::SubmitResult { result, .. } => {
                    assert_eq!(result, Err(SubmitFailure::NotBound));
                    failed += 1;
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(down, failed == DOWN_AFTER, "down after {failed} failed connects");
    }
    assert!(!provider.is_up());
    let errors: u64 = provider
        .results()
        .iter()
        .filter(|(c, _)| *c == "error")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(errors, u64::from(DOWN_AFTER));

    let _server = Server::on(TcpListener::bind(addr).await.unwrap(), true);
    assert!(
        matches!(next(&mut rx).await, ClientEvent::Up),
        "up again once a probe connects"
    );
    provider.submit(submits(30..31));
    assert!(results(&mut rx, 1).await[0].1.is_ok());
    provider.stop();
}
