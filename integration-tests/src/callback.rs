//! A tiny HTTP server on 127.0.0.1 recording the DLR callbacks Sendium POSTs.
//!
//! Every request is recorded (with the status it was answered with). By default it answers
//! `200 OK`; [`CallbackServer::fail_for`], [`CallbackServer::fail_next`] and
//! [`CallbackServer::set_status`] make it answer 500 (or anything) to test retries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::http::{header, read_message};
use crate::util::wait_until;

/// One request as received.
#[derive(Debug, Clone)]
pub struct CallbackRequest {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body as JSON, when it is JSON.
    pub json: Option<serde_json::Value>,
    /// The status we answered with.
    pub answered: u16,
    pub received_at: Instant,
}

/// A receipt callback body: `{"id", "status", "error_code", "done_at"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallbackReceipt {
    pub id: String,
    pub status: String,
    pub error_code: serde_json::Value,
    pub done_at: serde_json::Value,
    pub path: String,
}

#[derive(Default)]
struct State {
    requests: Vec<CallbackRequest>,
    fail_until: Option<Instant>,
    fail_next: u64,
    fixed_status: Option<u16>,
    delay: Duration,
}

struct Shared {
    state: Mutex<State>,
    notify: Notify,
    connections: AtomicU64,
}

impl Shared {
    fn answer_status(&self) -> u16 {
        let mut state = self.state.lock();
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return 500;
        }
        if state.fail_until.is_some_and(|until| Instant::now() < until) {
            return 500;
        }
        state.fixed_status.unwrap_or(200)
    }
}

/// The callback server. Dropping it stops it.
pub struct CallbackServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for CallbackServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for CallbackServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CallbackServer {
    /// Listens on 127.0.0.1 at a free port.
    pub async fn start() -> CallbackServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("callback server listen");
        let addr = listener.local_addr().expect("callback server address");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            connections: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        CallbackServer { addr, shared, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}` — `path` should start with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Answer 500 to everything for `period`.
    pub fn fail_for(&self, period: Duration) {
        self.shared.state.lock().fail_until = Some(Instant::now() + period);
    }

    /// Answer 500 to the next `n` requests.
    pub fn fail_next(&self, n: u64) {
        self.shared.state.lock().fail_next = n;
    }

    /// Answer `status` to everything (`None`: 200), unless a failure mode applies.
    pub fn set_status(&self, status: Option<u16>) {
        self.shared.state.lock().fixed_status = status;
    }

    /// Answer every request only after `delay` (a slow endpoint).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.state.lock().delay = delay;
    }

    /// Back to answering 200.
    pub fn heal(&self) {
        let mut state = self.shared.state.lock();
        state.fail_until = None;
        state.fail_next = 0;
        state.fixed_status = None;
    }

    /// Every request received (failed attempts included).
    pub fn requests(&self) -> Vec<CallbackRequest> {
        self.shared.state.lock().requests.clone()
    }

    /// Requests answered with 2xx.
    pub fn accepted(&self) -> Vec<CallbackRequest> {
        self.shared
            .state
            .lock()
            .requests
            .iter()
            .filter(|r| (200..300).contains(&r.answered))
            .cloned()
            .collect()
    }

    /// The receipt bodies of accepted requests (bodies that are not receipts are skipped).
    pub fn receipts(&self) -> Vec<CallbackReceipt> {
        self.accepted()
            .iter()
            .filter_map(|r| {
                let json = r.json.as_ref()?;
                Some(CallbackReceipt {
                    id: json.get("id")?.as_str()?.to_owned(),
                    status: json.get("status")?.as_str()?.to_owned(),
                    error_code: json.get("error_code").cloned().unwrap_or(serde_json::Value::Null),
                    done_at: json.get("done_at").cloned().unwrap_or(serde_json::Value::Null),
                    path: r.path.clone(),
                })
            })
            .collect()
    }

    /// Waits until `n` requests arrived (failed ones included).
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        wait_until(&self.shared.notify, timeout, || {
            self.shared.state.lock().requests.len() >= n
        })
        .await
    }

    /// Waits until `n` requests were answered 2xx.
    pub async fn wait_accepted(&self, n: usize, timeout: Duration) -> bool {
        wait_until(&self.shared.notify, timeout, || {
            self.shared
                .state
                .lock()
                .requests
                .iter()
                .filter(|r| (200..300).contains(&r.answered))
                .count()
                >= n
        })
        .await
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve(stream, shared.clone()));
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

async fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    while let Ok(Some(message)) = read_message(&mut stream, &mut buf, false).await {
        let mut parts = message.start_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let close = header(&message.headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let delay = shared.state.lock().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let status = shared.answer_status();
        let json = serde_json::from_slice(&message.body).ok();
        shared.state.lock().requests.push(CallbackRequest {
            method,
            path,
            headers: message.headers,
            body: message.body,
            json,
            answered: status,
            received_at: Instant::now(),
        });
        shared.notify.notify_waiters();
        let body = if (200..300).contains(&status) {
            "{}"
        } else {
            "{\"error\":\"injected\"}"
        };
        let response = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n{body}",
            reason(status),
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        if stream.write_all(response.as_bytes()).await.is_err() || close {
            break;
        }
    }
}
