//! Downstream delivery of receipts and inbound messages: a deliver_sm to a bound
//! receiver/transceiver session of the account, or an HTTP POST to the submission's
//! callback URL (the `[[mo-routes]]` URL for an inbound message).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::Method;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use sendium_protocols::callback::CallbackTargets;
use sendium_protocols::http_client::{BuildError, Config, Error as HttpError, HttpClient, Request, Resend, Target};

use sendium_protocols::receipt::{ReceiptFields, ReceiptState, format_date};
use sendium_protocols::smpp::server::{DeliverOutcome, OutboundDeliver, SessionRegistry};
use sendium_storage::{
    Delivery, DeliveryContent, DeliveryFinish, DeliveryResult, DlrState, InboundMessage, ReceiptOutcome, Timestamp,
};

use crate::address::to_wire;
use crate::destination_worker::receipts::receipt_state;

/// esm_class of an SMSC delivery receipt.
const ESM_CLASS_RECEIPT: u8 = 0x04;

/// The Appendix B text of a receipt, carrying the id the client was given.
pub fn receipt_text(d: &Delivery, outcome: &ReceiptOutcome) -> String {
    let mut id = [0; 36];
    let submit_date = format_date(d.target.submitted_at.as_unix_seconds());
    let done_date = format_date(outcome.done_at.as_unix_seconds());
    ReceiptFields {
        id: d.target.submit_id.encode(&mut id),
        sub: 1,
        dlvrd: u32::from(outcome.state == DlrState::Delivered),
        submit_date: Some(&submit_date),
        done_date: Some(&done_date),
        stat: receipt_state(outcome.state),
        err: &outcome.error,
        text: "",
    }
    .format()
}

/// The id the client was given, for a receipt's receipted_message_id TLV.
fn receipted_id(d: &Delivery) -> String {
    d.target.submit_id.encode(&mut [0; 36]).to_owned()
}

/// The deliver_sm for a delivery: a receipt goes from the handset back to the original
/// sender; an inbound message from the subscriber to the number they wrote to, whole
/// (an assembled multipart message longer than 254 octets in message_payload).
pub fn deliver_sm(d: &Delivery) -> OutboundDeliver {
    match &d.content {
        DeliveryContent::Receipt(outcome) => OutboundDeliver {
            source: to_wire(&d.target.destination),
            destination: to_wire(&d.target.source),
            esm_class: ESM_CLASS_RECEIPT,
            data_coding: 0,
            short_message: receipt_text(d, outcome).into_bytes(),
            receipted_message_id: Some(receipted_id(d)),
            message_state: Some(receipt_state(outcome.state).message_state()),
        },
        DeliveryContent::Inbound(m) => inbound_deliver_sm(m),
        // Created for Kannel dlr-urls only; as a deliver_sm it is an intermediate receipt.
        DeliveryContent::Progress(p) => OutboundDeliver {
            source: to_wire(&d.target.destination),
            destination: to_wire(&d.target.source),
            esm_class: ESM_CLASS_RECEIPT,
            data_coding: 0,
            short_message: p.text.clone().into_bytes(),
            receipted_message_id: Some(receipted_id(d)),
            message_state: Some(ReceiptState::Enroute.message_state()),
        },
    }
}

/// esm_class of a plain (mobile-originated) message: default mode, no UDH.
const ESM_CLASS_MO: u8 = 0x00;

fn inbound_deliver_sm(m: &InboundMessage) -> OutboundDeliver {
    OutboundDeliver {
        source: to_wire(&m.source),
        destination: to_wire(&m.destination),
        esm_class: ESM_CLASS_MO,
        data_coding: m.data_coding,
        short_message: m.payload.clone(),
        receipted_message_id: None,
        message_state: None,
    }
}

/// When to try again after `attempt` failed attempts: exponential, capped.
pub fn retry_at(now: Timestamp, attempt: u32, min: Duration, max: Duration) -> Timestamp {
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    now.saturating_add((min * factor).min(max))
}

fn give_up_or(d: &Delivery, at: Timestamp) -> DeliveryResult {
    if at > d.expires_at {
        DeliveryResult::Dead
    } else {
        DeliveryResult::Retry { at }
    }
}

/// Deliver SMPP receipts of one account; one result per delivery. `shared_store`:
/// several processes claim from the store, so a receipt whose account is not bound here
/// (it unbound meanwhile) is due again at once for the process it is bound to, instead
/// of held until it binds here.
pub async fn smpp(
    registry: &SessionRegistry,
    account: &str,
    deliveries: &[Delivery],
    shared_store: bool,
) -> Vec<DeliveryFinish> {
    let pdus = deliveries.iter().map(deliver_sm).collect();
    let outcomes = registry.deliver(account, pdus).await;
    let now = Timestamp::now();
    metrics::counter!("sendium_receipt_delivery_attempts_total", "channel" => "smpp")
        .increment(deliveries.len() as u64);
    deliveries
        .iter()
        .zip(outcomes)
        .map(|(d, o)| {
            let result = match o {
                DeliverOutcome::Acked => DeliveryResult::Delivered,
                // Held until the account binds again (the bind wakes it), within retention.
                DeliverOutcome::NoSession if shared_store => DeliveryResult::Retry { at: now },
                DeliverOutcome::NoSession => DeliveryResult::Retry { at: d.expires_at },
                DeliverOutcome::Refused(_) | DeliverOutcome::Timeout | DeliverOutcome::Disconnected => give_up_or(
                    d,
                    retry_at(now, d.attempt, Duration::from_secs(1), Duration::from_secs(300)),
                ),
            };
            DeliveryFinish {
                id: d.id,
                attempt: d.attempt,
                result,
            }
        })
        .collect()
}

/// RFC 3339 UTC time of a timestamp.
pub fn rfc3339(t: Timestamp) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(t.as_millis())).to_string()
}

/// The JSON body of an HTTP receipt callback: `{"id", "status", "error_code", "done_at"}`.
#[derive(serde::Serialize)]
struct CallbackBody<'a> {
    id: String,
    status: &'a str,
    error_code: &'a str,
    done_at: String,
}

/// The JSON body of an HTTP delivery, encoded: a receipt callback, or an inbound
/// message (see [`crate::inbound::http_body`]).
pub fn callback_body(d: &Delivery) -> Vec<u8> {
    let (status, error_code, done_at) = match &d.content {
        DeliveryContent::Receipt(outcome) => (
            receipt_state(outcome.state).stat_text(),
            outcome.error.as_str(),
            outcome.done_at,
        ),
        DeliveryContent::Inbound(m) => return crate::inbound::http_body(m),
        // Created for Kannel dlr-urls only; as JSON it is an intermediate receipt.
        DeliveryContent::Progress(p) => (ReceiptState::Enroute.stat_text(), "000", p.at),
    };
    let body = CallbackBody {
        id: d.target.submit_id.to_string(),
        status,
        error_code,
        done_at: rfc3339(done_at),
    };
    // Strings and a fixed struct: encoding cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The client receipts are POSTed with: no redirects, and connections only to addresses
/// the callback targets permit (see [`sendium_protocols::callback`]); built on
/// [`sendium_protocols::http_client`], whose pool keeps connections alive per host.
#[derive(Clone)]
pub struct CallbackClient {
    client: HttpClient,
    /// Callback URLs parsed before (most receipts of an API client go to the same few
    /// URLs, and parsing one, with its host's IDNA mapping, costs more than the rest of
    /// building the request).
    urls: Arc<parking_lot::Mutex<HashMap<String, Target>>>,
}

/// Parsed callback URLs kept at most; the cache starts over when it is full.
const URL_CACHE: usize = 1024;

/// Idle keep-alive connections kept per callback host: as many as the correlator sends
/// callbacks at once.
const MAX_IDLE_PER_HOST: usize = 64;

/// A callback answer's body read up to this much, so its connection goes back to the
/// pool; a longer body closes the connection instead (nothing in it is used).
const DRAIN_LIMIT: usize = 64 * 1024;

/// The headers of every callback besides those the client sets (`Host`, `User-Agent`,
/// `Content-Length`).
static CALLBACK_HEADERS: [(HeaderName, HeaderValue); 1] =
    [(CONTENT_TYPE, HeaderValue::from_static("application/json"))];

impl CallbackClient {
    /// `timeout`: the longest one attempt takes, connecting and reading the answer included.
    pub fn new(timeout: Duration, targets: CallbackTargets) -> Result<Self, BuildError> {
        let config = Config {
            timeout,
            max_idle_per_origin: MAX_IDLE_PER_HOST,
            max_body: DRAIN_LIMIT,
            ..Config::default()
        };
        Ok(CallbackClient {
            client: HttpClient::new(config, Arc::new(targets))?,
            urls: Arc::default(),
        })
    }

    /// `raw` parsed, from the cache when it was parsed before; `None` when it is not a URL
    /// a callback can go to.
    fn url(&self, raw: &str) -> Option<Target> {
        if let Some(url) = self.urls.lock().get(raw) {
            return Some(url.clone());
        }
        let url = Target::parse(raw).ok()?;
        let mut urls = self.urls.lock();
        if urls.len() >= URL_CACHE {
            urls.clear();
        }
        urls.insert(raw.to_owned(), url.clone());
        Some(url)
    }
}

/// POST one callback; `Ok(2xx?)` once an answer came, `Err(forbidden?)` without one.
///
/// Resent at once on a new connection when a kept-alive connection closed under it before
/// any answer ([`Resend::IfUnanswered`]), typically the endpoint's keep-alive timeout racing
/// the request. That may deliver the receipt twice, but so would the alternative: an attempt
/// without a 2xx is retried with backoff anyway, so callbacks are at least once either way
/// (the receiver tells repeats by `id`), and resending at once spares the receipt a delay
/// and the failure metric a false count.
async fn post(client: &CallbackClient, target: &Target, body: Vec<u8>) -> Result<bool, bool> {
    send(client, Method::POST, target, &CALLBACK_HEADERS, Bytes::from(body)).await
}

/// Send one callback request (see [`post`]).
async fn send(
    client: &CallbackClient,
    method: Method,
    target: &Target,
    headers: &[(HeaderName, HeaderValue)],
    body: Bytes,
) -> Result<bool, bool> {
    let request = Request {
        method,
        target,
        headers,
        body,
        resend: Resend::IfUnanswered,
    };
    match client.client.send(&request).await {
        // The answer's body is read (up to DRAIN_LIMIT) so the connection can be reused,
        // and not looked at.
        Ok(answer) => Ok(answer.status.is_success()),
        // A 2xx whose body broke off: the endpoint took the receipt.
        Err(HttpError::Body { status, .. }) => Ok(status.is_success()),
        Err(HttpError::Forbidden) => Err(true),
        Err(_) => Err(false),
    }
}

/// POST one receipt; 2xx is delivered, anything else (or no answer) is retried. A
/// callback whose target callbacks may not reach is given up at once.
pub async fn http(client: &CallbackClient, url: &str, d: &Delivery) -> DeliveryFinish {
    metrics::counter!("sendium_receipt_delivery_attempts_total", "channel" => "http").increment(1);
    let parsed = client.url(url);
    let sent = match parsed {
        // Every callback URL is checked at submission; one that still does not parse is
        // retried like an endpoint that does not answer, until its retention ends.
        None => Err(false),
        Some(target) => post(client, &target, callback_body(d)).await,
    };
    finish(d, "http", sent)
}

/// GET a filled-in Kannel `dlr-url` (not cached: it holds per-message values). `Ok(2xx?)`
/// once an answer came, `Err(forbidden?)` without one, as [`post`].
pub async fn get(client: &CallbackClient, url: &str) -> Result<bool, bool> {
    match Target::parse(url) {
        Ok(target) => send(client, Method::GET, &target, &[], Bytes::new()).await,
        Err(_) => Err(false),
    }
}

/// The result of one callback attempt: 2xx is delivered; a target callbacks may not
/// reach is given up at once; anything else is retried with backoff until retention.
/// `channel` labels the failure metric.
pub fn finish(d: &Delivery, channel: &'static str, sent: Result<bool, bool>) -> DeliveryFinish {
    if sent == Err(true) {
        metrics::counter!("sendium_receipt_delivery_failures_total", "channel" => channel, "reason" => "forbidden")
            .increment(1);
        tracing::warn!("receipt callback refused: its target is an address callbacks may not reach");
        return DeliveryFinish {
            id: d.id,
            attempt: d.attempt,
            result: DeliveryResult::Dead,
        };
    }
    let result = if sent == Ok(true) {
        DeliveryResult::Delivered
    } else {
        metrics::counter!("sendium_receipt_delivery_failures_total", "channel" => channel, "reason" => "callback")
            .increment(1);
        give_up_or(
            d,
            retry_at(
                Timestamp::now(),
                d.attempt,
                Duration::from_secs(1),
                Duration::from_secs(600),
            ),
        )
    };
    DeliveryFinish {
        id: d.id,
        attempt: d.attempt,
        result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendium_protocols::receipt::ReceiptText;
    use sendium_storage::{Address, DeliveryId, MessageId, ReceiptOutcome, ReceiptTarget, ReplyPath};

    fn delivery(state: DlrState) -> Delivery {
        Delivery {
            id: DeliveryId(1),
            attempt: 1,
            target: ReceiptTarget {
                submit_id: MessageId::generate(),
                account: "esme1".into(),
                reply: ReplyPath::Smpp,
                source: Address::new(5, 0, "Shop"),
                destination: Address::new(1, 1, "447700900123"),
                submitted_at: Timestamp(1_764_590_400_000),
                failure_only: false,
            },
            content: DeliveryContent::Receipt(ReceiptOutcome {
                state,
                error: "000".into(),
                done_at: Timestamp(1_764_590_460_000),
            }),
            created_at: Timestamp::now(),
            expires_at: Timestamp::now().saturating_add(Duration::from_secs(60)),
        }
    }

    #[test]
    fn receipt_deliver_sm_swaps_addresses_and_carries_the_submit_id() {
        let d = delivery(DlrState::Delivered);
        let pdu = deliver_sm(&d);
        assert_eq!(pdu.esm_class, 0x04);
        assert_eq!(pdu.source.addr, "447700900123");
        assert_eq!(pdu.destination.addr, "Shop");
        assert_eq!(
            pdu.receipted_message_id.as_deref(),
            Some(d.target.submit_id.to_string().as_str())
        );
        assert_eq!(pdu.message_state, Some(2));
        let text = String::from_utf8(pdu.short_message).unwrap();
        let parsed = ReceiptText::parse(&text).unwrap();
        assert_eq!(parsed.id, d.target.submit_id.to_string());
        assert_eq!(parsed.stat, ReceiptState::Delivered);
        assert_eq!(parsed.dlvrd, 1);
        assert_eq!(parsed.done_date.as_deref(), Some("2512011201"));
    }

    #[test]
    fn inbound_deliver_sm_goes_from_the_subscriber_to_the_number_whole() {
        let message = sendium_storage::InboundMessage {
            id: MessageId::generate(),
            from_destination: "up".into(),
            source: Address::new(1, 1, "447700900001"),
            destination: Address::new(0, 0, "81234"),
            data_coding: 8,
            payload: [0x00, 0x41].repeat(200),
            received_at: Timestamp(1_764_590_400_000),
            route: "app".into(),
            incomplete: false,
        };
        let mut d = delivery(DlrState::Delivered);
        d.content = DeliveryContent::Inbound(Box::new(message.clone()));
        let pdu = deliver_sm(&d);
        assert_eq!(pdu.esm_class, 0x00);
        assert_eq!(
            (pdu.source.addr.as_str(), pdu.destination.addr.as_str()),
            ("447700900001", "81234")
        );
        assert_eq!((pdu.data_coding, pdu.short_message.len()), (8, 400));
        assert_eq!((pdu.receipted_message_id, pdu.message_state), (None, None));
        let v: serde_json::Value = serde_json::from_slice(&callback_body(&d)).unwrap();
        assert_eq!(v["id"], message.id.to_string());
        assert_eq!(v["text"], "A".repeat(200));
    }

    #[test]
    fn callback_json_names_status_and_time() {
        let d = delivery(DlrState::Undeliverable);
        let v: serde_json::Value = serde_json::from_slice(&callback_body(&d)).unwrap();
        assert_eq!(v["status"], "UNDELIV");
        assert_eq!(v["done_at"], "2025-12-01T12:01:00Z");
        assert_eq!(v["id"], d.target.submit_id.to_string());
    }

    /// A keep-alive endpoint answering every request `200` with a short body: the
    /// callbacks reuse one connection instead of opening one each (an unread body would
    /// make the client close it).
    #[tokio::test]
    async fn callbacks_reuse_a_kept_alive_connection_when_the_answer_has_a_body() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: its head, then Content-Length bytes of body.
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        while buf.len() < end + 4 + len {
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..end + 4 + len);
                        // The body a moment after the head, as from a real endpoint
                        // whose answer spans two segments: the client has the status
                        // before the body, and only reading on makes the connection free.
                        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";
                        if sock.write_all(head).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if sock.write_all(b"OK").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let targets = CallbackTargets::new(vec!["127.0.0.0/8".parse().unwrap()]);
        let client = CallbackClient::new(Duration::from_secs(5), targets).unwrap();
        let url = format!("http://{addr}/dlr");
        for _ in 0..5 {
            let finish = http(&client, &url, &delivery(DlrState::Delivered)).await;
            assert_eq!(finish.result, DeliveryResult::Delivered);
        }
        assert_eq!(
            connections.load(Ordering::SeqCst),
            1,
            "one connection for five callbacks"
        );
    }

    #[test]
    fn retries_back_off_and_give_up_after_retention() {
        let now = Timestamp(1_000_000);
        assert_eq!(
            retry_at(now, 1, Duration::from_secs(1), Duration::from_secs(60)),
            Timestamp(1_001_000)
        );
        assert_eq!(
            retry_at(now, 3, Duration::from_secs(1), Duration::from_secs(60)),
            Timestamp(1_004_000)
        );
        assert_eq!(
            retry_at(now, 30, Duration::from_secs(1), Duration::from_secs(60)),
            Timestamp(1_060_000)
        );
        let d = delivery(DlrState::Delivered);
        assert_eq!(
            give_up_or(&d, d.expires_at.saturating_add(Duration::from_secs(1))),
            DeliveryResult::Dead
        );
    }
}
