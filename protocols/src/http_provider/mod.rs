//! A provider reached through an HTTP API, shaped like [`crate::smpp::client::SmppClient`]
//! towards the destination worker: it takes `(token, part)` submissions and reports
//! `Up`, `Down` and `SubmitResult` through the same [`ClientEvents`] sink, so the worker's
//! window, retries, throttling back-off and failover apply unchanged.
//!
//! One task per destination queues submissions and runs at most `window` requests at
//! once, paced to `max_tps`, each on the pooled keep-alive [`HttpClient`]. Reachability:
//! the destination is up once a connection to the URL's host and port opens (with the TLS
//! handshake for `https://`, the certificate checked against `tls-ca` or the webpki
//! roots), and down after [`DOWN_AFTER`] requests in a row failed to connect (nothing
//! reached the provider); while down it probes with a new connection after the reconnect
//! backoff, and logs why one failed whenever the reason changes. An HTTP answer of any
//! status, or a timeout, says the provider is reachable.
//! `sendium_destination_up` (label `destination`) is 1 while it is up, as for an SMPP
//! destination's transmitting session.

pub mod outcome;
pub mod receipts;
pub mod render;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http_client::{self, AnyAddress, HttpClient, Request, Target, Trust};
use crate::smpp::client::{ClientEvent, ClientEvents, OutboundSubmit, SubmitFailure};
use outcome::{Class, ResultCounts};
use render::{Encoding, Field, Rendered, Values};

/// Requests in a row that could not connect before the destination is reported down.
pub const DOWN_AFTER: u32 = 3;

/// One HTTP destination's settings.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpProviderConfig {
    pub name: String,
    pub url: String,
    pub encoding: Encoding,
    /// Sent with every request; values are secrets (API keys).
    pub headers: Vec<(String, String)>,
    pub fields: Vec<Field>,
    /// Where the provider's message id is in its answer; `None`: the part id is it.
    pub id_pointer: Option<String>,
    /// `{callback}`: the URL receipts are posted back to.
    pub callback: String,
    pub window: usize,
    pub max_tps: u32,
    pub response_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// What an `https://` url's certificate is checked against (`tls-ca`).
    pub trust: Trust,
}

impl fmt::Debug for HttpProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpProviderConfig")
            .field("name", &self.name)
            .field("encoding", &self.encoding)
            .field("headers", &header_names)
            .field("window", &self.window)
            .field("max_tps", &self.max_tps)
            .finish_non_exhaustive()
    }
}

/// One part to send, with the id Sendium gives it (`{id}`).
#[derive(Clone, Debug)]
pub struct HttpSubmit {
    pub part: OutboundSubmit,
    pub id: String,
}

/// The handle the worker keeps; dropping it does not stop the task, [`Self::stop`] does.
pub struct HttpProvider {
    tx: mpsc::UnboundedSender<Vec<(u64, HttpSubmit)>>,
    up: Arc<AtomicBool>,
    results: Arc<ResultCounts>,
    cancel: CancellationToken,
}

impl HttpProvider {
    /// Starts the destination's task (inside a tokio runtime).
    pub fn start(cfg: HttpProviderConfig, sink: Arc<dyn ClientEvents>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let up = Arc::new(AtomicBool::new(false));
        let cancel = CancellationToken::new();
        let results = Arc::new(ResultCounts::default());
        let task = Task::new(cfg, sink, up.clone(), results.clone(), rx, cancel.clone());
        tokio::spawn(task.run());
        HttpProvider {
            tx,
            up,
            results,
            cancel,
        }
    }

    /// Queue parts; their results come as `SubmitResult` events.
    pub fn submit(&self, batch: Vec<(u64, HttpSubmit)>) {
        let _ = self.tx.send(batch);
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Requests sent so far by the class they ended in (`2xx`, `4xx`, `429`, `5xx`,
    /// `timeout`, `error`).
    pub fn results(&self) -> Vec<(&'static str, u64)> {
        self.results.snapshot()
    }

    /// Stop: requests in flight are abandoned (their parts are the worker's to redo).
    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

/// What one request ended in.
struct Done {
    token: u64,
    result: Result<String, SubmitFailure>,
    /// It could not connect, and why (the error and its causes, which name no URL):
    /// nothing reached the provider.
    unreachable: Option<String>,
}

struct Prepared {
    client: HttpClient,
    target: Target,
    /// A field template uses `{deliver_at}`: scheduled messages can be sent here.
    carries_schedule: bool,
    /// The warning about a scheduled message this destination cannot carry was logged.
    schedule_warned: AtomicBool,
    headers: Vec<(HeaderName, HeaderValue)>,
}

struct Task {
    cfg: Arc<HttpProviderConfig>,
    sink: Arc<dyn ClientEvents>,
    up: Arc<AtomicBool>,
    /// `sendium_destination_up`, following `up`.
    up_gauge: metrics::Gauge,
    results: Arc<ResultCounts>,
    rx: mpsc::UnboundedReceiver<Vec<(u64, HttpSubmit)>>,
    cancel: CancellationToken,
    queue: VecDeque<(u64, HttpSubmit)>,
    failures_in_a_row: u32,
    /// Why the last probe failed, as logged; `None` after one succeeded.
    probe_failure: Option<String>,
    backoff: Duration,
    next_send: Instant,
}

impl Task {
    fn new(
        cfg: HttpProviderConfig,
        sink: Arc<dyn ClientEvents>,
        up: Arc<AtomicBool>,
        results: Arc<ResultCounts>,
        rx: mpsc::UnboundedReceiver<Vec<(u64, HttpSubmit)>>,
        cancel: CancellationToken,
    ) -> Self {
        let backoff = cfg.reconnect_min;
        let up_gauge = metrics::gauge!("sendium_destination_up", "destination" => cfg.name.clone());
        up_gauge.set(if up.load(Ordering::Acquire) { 1.0 } else { 0.0 });
        Task {
            cfg: Arc::new(cfg),
            sink,
            up,
            up_gauge,
            results,
            rx,
            cancel,
            queue: VecDeque::new(),
            failures_in_a_row: 0,
            probe_failure: None,
            backoff,
            next_send: Instant::now(),
        }
    }

    fn prepare(&self) -> Result<Prepared, String> {
        let cfg = &self.cfg;
        let parsed = url::Url::parse(&cfg.url).map_err(|_| "the url is not a URL".to_owned())?;
        let target = Target::from_url(&parsed).map_err(|e| e.to_string())?;
        let client = HttpClient::with_trust(
            http_client::Config {
                timeout: cfg.response_timeout,
                max_idle_per_origin: cfg.window,
                ..http_client::Config::default()
            },
            Arc::new(AnyAddress),
            cfg.trust.clone(),
        )
        .map_err(|e| crate::error::chain(&e))?;
        let mut headers = Vec::with_capacity(cfg.headers.len());
        for (name, value) in &cfg.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("bad header name {name}"))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| format!("bad value for header {name}"))?;
            value.set_sensitive(true);
            headers.push((name, value));
        }
        let carries_schedule = cfg
            .fields
            .iter()
            .any(|(_, pieces)| pieces.contains(&render::Piece::Value(render::Placeholder::DeliverAt)));
        Ok(Prepared {
            client,
            target,
            carries_schedule,
            schedule_warned: AtomicBool::new(false),
            headers,
        })
    }

    async fn run(mut self) {
        let prepared = match self.prepare() {
            Ok(p) => Arc::new(p),
            Err(reason) => {
                tracing::error!(destination = %self.cfg.name, %reason, "HTTP destination cannot start");
                self.sink.on_events(vec![ClientEvent::Down { reason }]);
                self.refuse_all().await;
                return;
            }
        };
        let mut inflight: JoinSet<Done> = JoinSet::new();
        let mut probe_at = Some(Instant::now());
        loop {
            if self.up.load(Ordering::Acquire) {
                self.launch(&prepared, &mut inflight);
            } else if !self.queue.is_empty() {
                let refused: Vec<ClientEvent> = self
                    .queue
                    .drain(..)
                    .map(|(token, _)| ClientEvent::SubmitResult {
                        token,
                        result: Err(SubmitFailure::NotBound),
                    })
                    .collect();
                self.sink.on_events(refused);
            }
            let pace_wait = (!self.queue.is_empty() && inflight.len() < self.cfg.window).then_some(self.next_send);
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return,
                Some(done) = inflight.join_next(), if !inflight.is_empty() => {
                    let mut events = Vec::new();
                    let mut next = Some(done);
                    while let Some(done) = next {
                        if let Ok(d) = done {
                            if self.account(&d) {
                                probe_at = Some(Instant::now() + self.backoff);
                            }
                            events.push(ClientEvent::SubmitResult { token: d.token, result: d.result });
                        }
                        next = inflight.try_join_next();
                    }
                    self.sink.on_events(events);
                }
                batch = self.rx.recv() => match batch {
                    Some(b) => self.queue.extend(b),
                    None => return,
                },
                () = sleep_until_opt(probe_at), if probe_at.is_some() => {
                    probe_at = self.probe(&prepared).await;
                }
                () = sleep_until_opt(pace_wait), if pace_wait.is_some() && self.up.load(Ordering::Acquire) => {}
            }
        }
    }

    /// Counts a request's result towards reachability; true when it made the destination
    /// go down (a probe is then due after the backoff). The `Down` event goes out at
    /// once, before the results that caused it.
    fn account(&mut self, d: &Done) -> bool {
        let Some(why) = &d.unreachable else {
            self.failures_in_a_row = 0;
            return false;
        };
        self.failures_in_a_row += 1;
        if self.failures_in_a_row >= DOWN_AFTER && self.up.swap(false, Ordering::AcqRel) {
            self.up_gauge.set(0.0);
            self.sink.on_events(vec![ClientEvent::Down {
                reason: format!("{DOWN_AFTER} requests in a row could not connect: {why}"),
            }]);
            self.backoff = self.cfg.reconnect_min;
            return true;
        }
        false
    }

    /// One connection to the provider, TLS included for an `https://` url (pooled for the
    /// next request): up if it opens, else the next probe's time.
    async fn probe(&mut self, p: &Prepared) -> Option<Instant> {
        let opened = p.client.open(&p.target).await;
        if let Err(e) = &opened {
            let why = crate::error::chain(e);
            if self.probe_failure.as_deref() != Some(why.as_str()) {
                tracing::warn!(destination = %self.cfg.name, reason = %why, "HTTP destination cannot be reached");
                self.probe_failure = Some(why);
            }
        }
        if opened.is_ok() {
            self.probe_failure = None;
            self.failures_in_a_row = 0;
            self.backoff = self.cfg.reconnect_min;
            if !self.up.swap(true, Ordering::AcqRel) {
                self.up_gauge.set(1.0);
                self.sink.on_events(vec![ClientEvent::Up]);
            }
            None
        } else {
            let wait = self.backoff;
            self.backoff = (self.backoff * 2).min(self.cfg.reconnect_max);
            Some(Instant::now() + wait)
        }
    }

    /// Start queued requests while the window and `max-tps` allow.
    fn launch(&mut self, p: &Arc<Prepared>, inflight: &mut JoinSet<Done>) {
        let interval = match self.cfg.max_tps {
            0 => Duration::ZERO,
            tps => Duration::from_secs(1) / tps,
        };
        while inflight.len() < self.cfg.window {
            let now = Instant::now();
            if !interval.is_zero() && now < self.next_send {
                return;
            }
            let Some((token, submit)) = self.queue.pop_front() else {
                return;
            };
            if !interval.is_zero() {
                self.next_send = self.next_send.max(now - interval) + interval;
            }
            let cfg = self.cfg.clone();
            let p = p.clone();
            let results = self.results.clone();
            inflight.spawn(async move { send_one(&cfg, &p, &results, token, submit).await });
        }
    }

    /// The URL could not be used: every submission fails as if the destination were down.
    async fn refuse_all(&mut self) {
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return,
                batch = self.rx.recv() => match batch {
                    Some(b) => self.sink.on_events(
                        b.into_iter()
                            .map(|(token, _)| ClientEvent::SubmitResult { token, result: Err(SubmitFailure::NotBound) })
                            .collect(),
                    ),
                    None => return,
                },
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends one part and reads what its answer means.
async fn send_one(
    cfg: &HttpProviderConfig,
    p: &Prepared,
    results: &ResultCounts,
    token: u64,
    submit: HttpSubmit,
) -> Done {
    let values = match Values::of(&submit.part, submit.id.clone(), cfg.callback.clone()) {
        Ok(v) => v,
        Err(_) => {
            return Done {
                token,
                result: Err(SubmitFailure::Status(outcome::NO_MESSAGE_ID)),
                unreachable: None,
            };
        }
    };
    if values.scheduled() && !p.carries_schedule {
        // Once per destination start: the REJECTD receipts say it for each message.
        if !p.schedule_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                destination = %cfg.name,
                "a message scheduled for later reached an HTTP destination whose fields have no {{deliver_at}}: such branches fail rather than delivering now"
            );
        }
        return Done {
            token,
            result: Err(SubmitFailure::Status(outcome::SCHEDULE_NOT_CARRIED)),
            unreachable: None,
        };
    }
    let mut headers = p.headers.clone();
    let (method, body, target) = match render::render(&cfg.fields, cfg.encoding, &values) {
        Rendered::Body { body, content_type } => {
            headers.push((http::header::CONTENT_TYPE, HeaderValue::from_static(content_type)));
            (Method::POST, body, p.target.clone())
        }
        Rendered::Query(query) => {
            let sep = if cfg.url.contains('?') { '&' } else { '?' };
            let target = match Target::parse(&format!("{}{sep}{query}", cfg.url)) {
                Ok(t) => t,
                Err(_) => {
                    return Done {
                        token,
                        result: Err(SubmitFailure::Status(outcome::NO_MESSAGE_ID)),
                        unreachable: None,
                    };
                }
            };
            (Method::GET, Bytes::new(), target)
        }
    };
    let req = Request {
        method: method.clone(),
        target: &target,
        headers: &headers,
        body,
        resend: http_client::Resend::for_method(&method),
    };
    let (result, class, unreachable) = match p.client.send(&req).await {
        Ok(resp) => {
            let class = outcome::class_of(resp.status);
            let result = if class == Class::Ok {
                match &cfg.id_pointer {
                    None => Ok(submit.id),
                    Some(ptr) => outcome::message_id(&resp.body, ptr).ok_or_else(|| {
                        tracing::warn!(
                            destination = %cfg.name,
                            status = resp.status.as_u16(),
                            "HTTP provider accepted a message, but its answer has no message id at id-pointer: the branch fails"
                        );
                        SubmitFailure::Status(outcome::NO_MESSAGE_ID)
                    }),
                }
            } else {
                Err(outcome::failure_of(resp.status))
            };
            (result, class, None)
        }
        Err(e) => {
            let (f, class, unreachable) = outcome::failure_of_error(&e);
            (Err(f), class, unreachable.then(|| crate::error::chain(&e)))
        }
    };
    metrics::counter!("sendium_http_destination_requests_total", "destination" => cfg.name.clone(), "class" => class.label())
        .increment(1);
    results.record(class);
    Done {
        token,
        result,
        unreachable,
    }
}
