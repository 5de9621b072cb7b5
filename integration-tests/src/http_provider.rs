//! A fake HTTP SMS provider on 127.0.0.1 for `kind = "http"` destinations.
//!
//! It records every request and answers by rule: the queued [`Answer`]s first, in order,
//! then the default (200 with `{"message_id": "pN"}`, N counting accepted requests).
//! For load, [`FakeProvider::start_unrecorded`] only counts, and
//! [`FakeProvider::post_receipts`] makes it post a DELIVRD receipt for every accepted
//! message back to the gateway, in batches, as a provider's receipt webhook does.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::http::read_message;
use crate::util::wait_until;

/// How to answer one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 200 with `{"message_id": "pN"}`.
    Accept,
    /// This status with an error body.
    Status(u16),
    /// Wait this long, then accept.
    Delay(Duration),
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub status: u16,
    /// The message id returned, when accepted.
    pub message_id: Option<String>,
}

impl ProviderRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The form body's (or the query string's) fields.
    pub fn form(&self) -> Vec<(String, String)> {
        let raw: &[u8] = if self.method == "GET" {
            self.target.split_once('?').map_or(&b""[..], |(_, q)| q.as_bytes())
        } else {
            &self.body
        };
        url::form_urlencoded::parse(raw).into_owned().collect()
    }
}

#[derive(Default)]
struct State {
    answers: VecDeque<Answer>,
    default: Option<Answer>,
    /// Keep each request (off for load runs).
    record: bool,
    requests: Vec<ProviderRequest>,
    accepted: u64,
    /// Accepted ids whose receipt is not posted yet, when receipts are posted.
    unposted: Option<Vec<String>>,
    /// Receipts the gateway answered 200.
    receipts_posted: u64,
}

/// Receipts posted at most this many to a request.
const RECEIPT_BATCH: usize = 1_000;

/// The fake provider. Dropping it stops it.
pub struct FakeProvider {
    addr: SocketAddr,
    state: Arc<(Mutex<State>, Notify)>,
    task: tokio::task::JoinHandle<()>,
    /// Receipt posting tasks, stopped with the provider.
    posters: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
        for p in self.posters.get_mut().drain(..) {
            p.abort();
        }
    }
}

impl FakeProvider {
    pub async fn start() -> FakeProvider {
        Self::start_with(true).await
    }

    /// A provider for load: requests are counted ([`Self::accepted_count`]), not kept.
    pub async fn start_unrecorded() -> FakeProvider {
        Self::start_with(false).await
    }

    async fn start_with(record: bool) -> FakeProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("fake provider listen");
        let addr = listener.local_addr().expect("fake provider address");
        let state = Arc::new((
            Mutex::new(State {
                record,
                ..State::default()
            }),
            Notify::new(),
        ));
        let task = tokio::spawn(accept_loop(listener, state.clone()));
        FakeProvider {
            addr,
            state,
            task,
            posters: Mutex::new(Vec::new()),
        }
    }

    /// From now on, post `{"id": …, "status": "delivered"}` for every accepted message
    /// to the gateway's receipt endpoint for `destination` with header token `token`:
    /// every 10 ms, up to 1,000 to a request; a batch the gateway does not answer 200
    /// is posted again.
    pub fn post_receipts(&self, gateway: SocketAddr, destination: &str, token: &str) {
        self.state.0.lock().unposted.get_or_insert_with(Vec::new);
        let (state, destination, token) = (self.state.clone(), destination.to_owned(), token.to_owned());
        let poster = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let batch: Vec<String> = {
                    let mut s = state.0.lock();
                    let unposted = s.unposted.get_or_insert_with(Vec::new);
                    let take = unposted.len().min(RECEIPT_BATCH);
                    unposted.drain(..take).collect()
                };
                if batch.is_empty() {
                    continue;
                }
                let body: Vec<serde_json::Value> = batch
                    .iter()
                    .map(|id| serde_json::json!({"id": id, "status": "delivered"}))
                    .collect();
                let body = serde_json::Value::Array(body).to_string();
                let status = post_receipt(gateway, &destination, &body, Proof::Token(&token)).await;
                let mut s = state.0.lock();
                if status == 200 {
                    s.receipts_posted += batch.len() as u64;
                } else {
                    s.unposted.get_or_insert_with(Vec::new).extend(batch);
                }
            }
        });
        self.posters.lock().push(poster.abort_handle());
    }

    /// Requests answered 200.
    pub fn accepted_count(&self) -> u64 {
        self.state.0.lock().accepted
    }

    /// Receipts the gateway took (answered 200).
    pub fn receipts_posted(&self) -> u64 {
        self.state.0.lock().receipts_posted
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answer the next requests with these, in order.
    pub fn queue(&self, answers: &[Answer]) {
        self.state.0.lock().answers.extend(answers.iter().copied());
    }

    /// Answer every request not covered by the queue with this.
    pub fn set_default(&self, answer: Answer) {
        self.state.0.lock().default = Some(answer);
    }

    pub fn requests(&self) -> Vec<ProviderRequest> {
        self.state.0.lock().requests.clone()
    }

    pub fn accepted(&self) -> Vec<ProviderRequest> {
        self.requests().into_iter().filter(|r| r.status == 200).collect()
    }

    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> bool {
        wait_until(&self.state.1, timeout, || self.state.0.lock().requests.len() >= n).await
    }
}

/// How a posted receipt proves it comes from the provider.
#[derive(Debug, Clone, Copy)]
pub enum Proof<'a> {
    None,
    Token(&'a str),
    /// `X-Sendium-Signature: sha256=<hex>` keyed by this secret.
    Hmac(&'a str),
}

/// Posts `body` to the gateway's receipt endpoint for `destination`, as a provider
/// would; the status the gateway answered.
pub async fn post_receipt(gateway: SocketAddr, destination: &str, body: &str, proof: Proof<'_>) -> u16 {
    let signature;
    let headers: Vec<(&str, &str)> = match proof {
        Proof::None => vec![],
        Proof::Token(t) => vec![("X-Sendium-Receipt-Token", t)],
        Proof::Hmac(secret) => {
            let mac = sendium_protocols::http_provider::receipts::hmac_sha256(secret.as_bytes(), body.as_bytes());
            signature = format!("sha256={}", mac.iter().map(|b| format!("{b:02x}")).collect::<String>());
            vec![("X-Sendium-Signature", signature.as_str())]
        }
    };
    let path = format!("/v1/providers/{destination}/receipts");
    crate::http::post_json(gateway, &path, &headers, body)
        .await
        .map_or(0, |r| r.status)
}

async fn accept_loop(listener: TcpListener, state: Arc<(Mutex<State>, Notify)>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(serve(stream, state.clone()));
    }
}

async fn serve(mut stream: TcpStream, state: Arc<(Mutex<State>, Notify)>) {
    let mut buf = Vec::new();
    while let Ok(Some(message)) = read_message(&mut stream, &mut buf, false).await {
        let mut parts = message.start_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let target = parts.next().unwrap_or_default().to_owned();
        let answer = {
            let mut s = state.0.lock();
            s.answers.pop_front().or(s.default).unwrap_or(Answer::Accept)
        };
        let status = match answer {
            Answer::Delay(d) => {
                tokio::time::sleep(d).await;
                200
            }
            Answer::Accept => 200,
            Answer::Status(s) => s,
        };
        let body = {
            let mut s = state.0.lock();
            let id = (status == 200).then(|| {
                s.accepted += 1;
                format!("p{}", s.accepted)
            });
            if let (Some(id), Some(unposted)) = (&id, &mut s.unposted) {
                unposted.push(id.clone());
            }
            if s.record {
                s.requests.push(ProviderRequest {
                    method,
                    target,
                    headers: message.headers,
                    body: message.body,
                    status,
                    message_id: id.clone(),
                });
            }
            match &id {
                Some(id) => format!("{{\"message_id\":\"{id}\"}}"),
                None => "{\"error\":\"injected\"}".to_owned(),
            }
        };
        state.1.notify_waiters();
        let response = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            break;
        }
    }
}
