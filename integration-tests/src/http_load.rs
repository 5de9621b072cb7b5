//! The HTTP load of `sendium-bench --http` and `sendium-http-floor`: keep-alive clients
//! posting one message per request, and a keep-alive sink answering receipt callbacks.
//!
//! The client and the sink are written by hand over `TcpStream` with reused buffers: they
//! share the two cores with the server they measure, and a heavier client would lower its
//! throughput without changing its CPU per message.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::histogram::Histogram;

/// A message in GSM 7-bit that fits one part (one `submit_sm` per message).
pub const TEXT: &str = "HTTP bench message";
const CALLBACK_PATH: &str = "/dlr";
/// Between a 429/503 and sending the same message again.
const RETRY_AFTER: Duration = Duration::from_millis(5);
/// The longest wait for one request's answer; a client that waits longer gives up.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// A client gives up after this many I/O failures in a row on one message.
const MAX_IO_FAILURES: u32 = 5;
/// A header section longer than this is not an HTTP message we expect.
const MAX_HEAD: usize = 16 * 1024;
/// The sink's whole answer: nothing for the server to parse beyond the length.
const SINK_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

// ---------------------------------------------------------------------------------------
// HTTP/1.1 framing, just enough for both ends

/// The parts of a message head the client and the sink act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Where the body starts (after the blank line).
    pub body_start: usize,
    pub content_length: Option<usize>,
    /// `Connection: close`.
    pub close: bool,
    pub chunked: bool,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Parses the head at the start of `buf`: `Ok(None)` until the blank line has arrived.
pub fn parse_head(buf: &[u8]) -> io::Result<Option<Head>> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        return if buf.len() > MAX_HEAD {
            Err(io::Error::new(io::ErrorKind::InvalidData, "header section too long"))
        } else {
            Ok(None)
        };
    };
    let mut head = Head {
        body_start: end + 4,
        content_length: None,
        close: false,
        chunked: false,
    };
    // The start line first, then one header per line.
    for line in buf[..end].split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            head.content_length = Some(n.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad length"))?);
        } else if name.eq_ignore_ascii_case(b"connection") {
            head.close = value.eq_ignore_ascii_case(b"close");
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            head.chunked = true;
        }
    }
    Ok(Some(head))
}

/// A response's status code from its status line (`HTTP/1.1 202 Accepted`).
pub fn status_code(buf: &[u8]) -> Option<u16> {
    let code = buf.get(9..12)?;
    if !buf.starts_with(b"HTTP/1.") || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// The value of a string field in a flat JSON object, without unescaping: enough for the
/// gateway's ids and receipt statuses, which have no escapes.
pub fn json_str<'a>(body: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let quoted = format!("\"{key}\"");
    let at = find(body, quoted.as_bytes())? + quoted.len();
    let rest = body
        .get(at..)?
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let value = rest.strip_prefix(b"\"")?;
    let end = value.iter().position(|&b| b == b'"')?;
    Some(&value[..end])
}

// ---------------------------------------------------------------------------------------
// load generator

/// One answer read into the client's buffer.
struct Answer {
    status: u16,
    close: bool,
    body: Range<usize>,
}

/// Writes `request` and reads its response into `buf` (cleared first: one request at a
/// time, so nothing of a previous response is left in it).
async fn exchange(stream: &mut TcpStream, request: &[u8], buf: &mut Vec<u8>) -> io::Result<Answer> {
    stream.write_all(request).await?;
    buf.clear();
    loop {
        if let Some(head) = parse_head(buf)? {
            let status = status_code(buf).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad status"))?;
            if head.chunked {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "chunked response"));
            }
            let len = head
                .content_length
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "response without Content-Length"))?;
            let end = head.body_start + len;
            while buf.len() < end {
                if stream.read_buf(buf).await? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
            }
            return Ok(Answer {
                status,
                close: head.close,
                body: head.body_start..end,
            });
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// What the clients share: the request's fixed text, the next message number to send
/// and how many were accepted (for progress lines).
pub struct Load {
    pub addr: SocketAddr,
    messages: u64,
    /// The request up to the number in `to` (the length is fixed: numbers are padded).
    before_number: Vec<u8>,
    /// The rest of the body after it.
    after_number: Vec<u8>,
    next: AtomicU64,
    pub accepted: AtomicU64,
    /// Keep every accepted id (callback rows compare them with the callbacks).
    pub keep_ids: bool,
}

/// Digits after the path's two-digit prefix in `to`: twelve in all.
const NUMBER_DIGITS: usize = 8;

impl Load {
    /// `messages` requests to `addr` with `Authorization: Bearer {api_key}`, each to a
    /// twelve-digit number starting `number_prefix` (four digits), with `callback_url` when given.
    pub fn new(
        addr: SocketAddr,
        messages: u64,
        api_key: &str,
        number_prefix: &str,
        callback_url: Option<&str>,
    ) -> Load {
        let callback = callback_url.map_or(String::new(), |u| format!(",\"callback_url\":\"{u}\""));
        let body_start = format!("{{\"from\":\"Bench\",\"to\":\"{number_prefix}");
        let after = format!("\",\"text\":\"{TEXT}\"{callback}}}");
        let length = body_start.len() + NUMBER_DIGITS + after.len();
        let before = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {api_key}\r\n\
             Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{body_start}"
        );
        Load {
            addr,
            messages,
            before_number: before.into_bytes(),
            after_number: after.into_bytes(),
            next: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            keep_ids: callback_url.is_some(),
        }
    }

    /// Message `n`'s request into `out`.
    pub fn request(&self, n: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.before_number);
        // Numbers wrap past 10^8 messages so `to` keeps its length (and the body its
        // Content-Length).
        let _ = write!(out, "{:0width$}", n % 100_000_000, width = NUMBER_DIGITS);
        out.extend_from_slice(&self.after_number);
    }
}

/// One client's tallies.
#[derive(Debug, Default)]
pub struct ClientReport {
    pub latency: Histogram,
    pub accepted: u64,
    pub ids: Vec<String>,
    /// 429 and 503, per status (retried).
    pub retried: BTreeMap<u16, u64>,
    /// Other statuses than 202 (not retried: the message is not sent).
    pub refused: BTreeMap<u16, u64>,
    /// The first refusal's status and body.
    pub first_refusal: Option<String>,
    /// Connections opened again after the server closed one, or after an I/O error.
    pub reconnects: u64,
    pub io_errors: u64,
    /// Why the client stopped early.
    pub gave_up: Option<String>,
    /// When its last 202 arrived.
    pub last_accepted: Option<Instant>,
}

/// Sends messages until the shared counter passes `messages`, one request at a time on
/// `stream` (opened again when the server closes it or it fails).
pub async fn client(load: Arc<Load>, stream: TcpStream) -> ClientReport {
    let mut report = ClientReport::default();
    let mut stream = Some(stream);
    let mut request = Vec::with_capacity(load.before_number.len() + 64);
    let mut buf = Vec::with_capacity(1024);
    loop {
        let n = load.next.fetch_add(1, Ordering::Relaxed);
        if n >= load.messages {
            return report;
        }
        load.request(n, &mut request);
        let mut failures = 0;
        loop {
            let conn = match stream.as_mut() {
                Some(s) => s,
                None => match connect(load.addr).await {
                    Ok(s) => {
                        report.reconnects += 1;
                        stream.insert(s)
                    }
                    Err(e) => {
                        failures += 1;
                        report.io_errors += 1;
                        if failures >= MAX_IO_FAILURES {
                            report.gave_up = Some(format!("cannot connect: {e}"));
                            return report;
                        }
                        tokio::time::sleep(RETRY_AFTER).await;
                        continue;
                    }
                },
            };
            let started = Instant::now();
            let answer = match tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(conn, &request, &mut buf)).await {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    // The server closed the connection between requests, or it failed:
                    // send the message again on a new one. (A kept-alive connection the
                    // server closes has not read the request, so it was not admitted.)
                    stream = None;
                    failures += 1;
                    report.io_errors += 1;
                    if failures >= MAX_IO_FAILURES {
                        report.gave_up = Some(format!("request failed {failures} times: {e}"));
                        return report;
                    }
                    continue;
                }
                Err(_) => {
                    report.io_errors += 1;
                    report.gave_up = Some(format!("no answer within {} s", EXCHANGE_TIMEOUT.as_secs()));
                    return report;
                }
            };
            let elapsed = started.elapsed();
            if answer.close {
                stream = None;
            }
            match answer.status {
                202 => {
                    report.latency.record_duration(elapsed);
                    report.accepted += 1;
                    report.last_accepted = Some(Instant::now());
                    load.accepted.fetch_add(1, Ordering::Relaxed);
                    if load.keep_ids {
                        match json_str(&buf[answer.body.clone()], "id").and_then(|id| std::str::from_utf8(id).ok()) {
                            Some(id) => report.ids.push(id.to_owned()),
                            None => {
                                *report.refused.entry(202).or_default() += 1;
                                report.first_refusal.get_or_insert_with(|| {
                                    format!("202 without an id: {}", String::from_utf8_lossy(&buf[answer.body]))
                                });
                            }
                        }
                    }
                    break;
                }
                429 | 503 => {
                    *report.retried.entry(answer.status).or_default() += 1;
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                other => {
                    *report.refused.entry(other).or_default() += 1;
                    report
                        .first_refusal
                        .get_or_insert_with(|| format!("{other} {}", String::from_utf8_lossy(&buf[answer.body])));
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// callback sink

/// What the sink has received.
#[derive(Debug, Default)]
pub struct SinkState {
    /// Each message id once.
    pub ids: HashSet<String>,
    /// The status of each id's first callback.
    pub statuses: BTreeMap<String, u64>,
    /// Callbacks for an id already seen.
    pub repeated: u64,
    /// Requests without an `id`.
    pub unparsed: u64,
}

#[derive(Debug, Default)]
pub struct SinkShared {
    pub state: Mutex<SinkState>,
    /// `state.ids.len()`, read without the lock while the row waits.
    pub distinct: AtomicU64,
    pub requests: AtomicU64,
    pub connections: AtomicU64,
}

impl SinkShared {
    fn record(&self, body: &[u8]) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let id = json_str(body, "id").and_then(|id| std::str::from_utf8(id).ok());
        let status = json_str(body, "status").map_or("?".into(), String::from_utf8_lossy);
        let mut state = self.state.lock();
        match id {
            Some(id) if !state.ids.contains(id) => {
                state.ids.insert(id.to_owned());
                *state.statuses.entry(status.into_owned()).or_default() += 1;
                self.distinct.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) => state.repeated += 1,
            None => state.unparsed += 1,
        }
    }
}

/// An HTTP/1.1 server that answers every request `200` with an empty body and records
/// the receipt callbacks' ids. Unlike the kit's `CallbackServer` (which keeps every
/// request for the tests), it keeps one id per message, answers everything a read
/// brought with one write, and keeps connections open, so the gateway's callback client
/// pays for as little as a real endpoint would make it.
pub struct Sink {
    pub addr: SocketAddr,
    pub shared: Arc<SinkShared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    pub async fn start() -> io::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(SinkShared::default());
        let task = tokio::spawn(accept_callbacks(listener, shared.clone()));
        Ok(Sink { addr, shared, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}{CALLBACK_PATH}", self.addr)
    }

    pub fn distinct(&self) -> u64 {
        self.shared.distinct.load(Ordering::Relaxed)
    }
}

async fn accept_callbacks(listener: TcpListener, shared: Arc<SinkShared>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                shared.connections.fetch_add(1, Ordering::Relaxed);
                // Dropped with this task when the sink is: the connections close too.
                connections.spawn(serve_callbacks(stream, shared.clone()));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
        while connections.try_join_next().is_some() {}
    }
}

async fn serve_callbacks(mut stream: TcpStream, shared: Arc<SinkShared>) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(256);
    loop {
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut used = 0;
        let mut close = false;
        // Every whole request the read brought (a client may pipeline).
        loop {
            let head = match parse_head(&buf[used..]) {
                Ok(Some(h)) if !h.chunked => h,
                Ok(None) => break,
                // Not something the gateway sends: drop the connection.
                Ok(Some(_)) | Err(_) => return,
            };
            let start = used + head.body_start;
            let end = start + head.content_length.unwrap_or(0);
            if buf.len() < end {
                break;
            }
            shared.record(&buf[start..end]);
            out.extend_from_slice(SINK_ANSWER);
            used = end;
            if head.close {
                close = true;
                break;
            }
        }
        buf.drain(..used);
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if close {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_statuses_and_fields() {
        let buf = b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\nContent-Length: 10\r\n\
                    Connection: close\r\n\r\n{\"id\":\"1\"}";
        let head = parse_head(buf).unwrap().unwrap();
        assert_eq!(
            head,
            Head {
                body_start: buf.len() - 10,
                content_length: Some(10),
                close: true,
                chunked: false
            }
        );
        assert_eq!(status_code(buf), Some(202));
        assert_eq!(status_code(b"HTTP/1.1 2x2 ?\r\n"), None);
        assert_eq!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n").unwrap(), None);
        assert!(parse_head(&[b'a'; MAX_HEAD + 1]).is_err());
        assert!(parse_head(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n").is_err());
        let chunked = parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert!(chunked.is_some_and(|h| h.chunked && !h.close));

        let body = br#"{"done_at":"2026-12-04T10:00:00Z","error_code":"000","id":"01a2-ff","status": "DELIVRD"}"#;
        assert_eq!(json_str(body, "id"), Some(&b"01a2-ff"[..]));
        assert_eq!(json_str(body, "status"), Some(&b"DELIVRD"[..]));
        assert_eq!(json_str(body, "error_code"), Some(&b"000"[..]));
        assert_eq!(json_str(body, "missing"), None);
        assert_eq!(json_str(br#"{"id":7}"#, "id"), None, "not a string");
    }

    fn callback(id: &str, status: &str) -> String {
        let body =
            format!(r#"{{"done_at":"2026-12-04T10:00:00Z","error_code":"000","id":"{id}","status":"{status}"}}"#);
        format!(
            "POST /dlr HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    async fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        stream.read_exact(&mut buf).await.unwrap();
        buf
    }

    #[tokio::test]
    async fn the_sink_counts_each_id_once_over_a_kept_alive_connection() {
        let sink = Sink::start().await.unwrap();
        assert!(sink.url().ends_with(CALLBACK_PATH));
        let mut s = TcpStream::connect(sink.addr).await.unwrap();
        // Two pipelined in one write, then one in two writes, then a repeat.
        let two = callback("a", "DELIVRD") + &callback("b", "UNDELIV");
        s.write_all(two.as_bytes()).await.unwrap();
        assert_eq!(read_exactly(&mut s, 2 * SINK_ANSWER.len()).await, SINK_ANSWER.repeat(2));
        let third = callback("c", "DELIVRD");
        let (first, second) = third.split_at(third.len() - 5);
        s.write_all(first.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.write_all(second.as_bytes()).await.unwrap();
        s.write_all(callback("a", "DELIVRD").as_bytes()).await.unwrap();
        assert_eq!(read_exactly(&mut s, 2 * SINK_ANSWER.len()).await, SINK_ANSWER.repeat(2));
        assert_eq!(sink.distinct(), 3);
        let state = sink.shared.state.lock();
        assert_eq!(state.repeated, 1);
        assert_eq!(state.unparsed, 0);
        let statuses: Vec<(&str, u64)> = state.statuses.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(statuses, [("DELIVRD", 2), ("UNDELIV", 1)]);
        assert_eq!(sink.shared.requests.load(Ordering::Relaxed), 4);
        assert_eq!(sink.shared.connections.load(Ordering::Relaxed), 1);
    }

    /// A server that answers the first request 503, then 202 with an id, and closes the
    /// connection after every third answer.
    async fn fake_gateway(listener: TcpListener, answered: Arc<AtomicU64>) {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let answered = answered.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let head = loop {
                        if let Some(h) = parse_head(&buf).unwrap() {
                            break h;
                        }
                        if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    };
                    let end = head.body_start + head.content_length.unwrap_or(0);
                    while buf.len() < end {
                        if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    }
                    buf.drain(..end);
                    let n = answered.fetch_add(1, Ordering::Relaxed);
                    let (status, body) = if n == 0 {
                        ("503 Service Unavailable", "{}".to_owned())
                    } else {
                        ("202 Accepted", format!(r#"{{"id":"m{n}"}}"#))
                    };
                    let close = n % 3 == 2;
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{}\r\n{body}",
                        body.len(),
                        if close { "connection: close\r\n" } else { "" }
                    );
                    s.write_all(answer.as_bytes()).await.unwrap();
                    if close {
                        return;
                    }
                }
            });
        }
    }

    #[tokio::test]
    async fn a_client_retries_refusals_and_opens_a_closed_connection_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answered = Arc::new(AtomicU64::new(0));
        let server = tokio::spawn(fake_gateway(listener, answered.clone()));
        let load = Arc::new(Load::new(
            addr,
            10,
            "bench-http",
            "4474",
            Some("http://127.0.0.1:9/dlr"),
        ));
        let report = client(load.clone(), connect(addr).await.unwrap()).await;
        server.abort();
        assert_eq!(report.gave_up, None);
        assert_eq!(report.accepted, 10);
        assert_eq!(load.accepted.load(Ordering::Relaxed), 10);
        assert_eq!(report.retried.get(&503), Some(&1));
        assert!(report.refused.is_empty());
        assert_eq!(report.latency.count(), 10);
        let ids: HashSet<&String> = report.ids.iter().collect();
        assert_eq!(ids.len(), 10);
        assert_eq!(answered.load(Ordering::Relaxed), 11);
        assert_eq!(report.reconnects, 3, "closed after answers 3, 6 and 9");
        assert_eq!(report.io_errors, 0);
    }
}
