//! SMPP client sessions: Sendium as an ESME towards an upstream SMSC (a destination).
//!
//! [`SmppClient::start`] spawns one tokio task per TCP session ("slot"): one for
//! [`BindMode::Transceiver`], [`BindMode::Transmitter`] and [`BindMode::Receiver`], two for
//! [`BindMode::TransmitterReceiver`] (a transmitter that carries every submit and a receiver
//! that carries the receipts). Each slot task loops forever: connect (TCP_NODELAY), bind,
//! run the session, and after a refused bind or a lost session wait an exponential,
//! jittered backoff between [`ClientConfig::reconnect_min`] and
//! [`ClientConfig::reconnect_max`] before the next attempt (the backoff restarts from the
//! minimum after a successful bind).
//!
//! # Batching
//!
//! A session task sleeps in one `tokio::select!` over its command channel, its socket and
//! one timer. Each wake-up then does all the work that is ready: every queued command,
//! every readable byte (non-blocking reads until the socket is empty), every complete PDU,
//! every expired timer, and as many submits as window and TPS allow. Everything it writes in
//! that wake-up goes into one buffer and one `write_all`; everything it reports goes to
//! [`ClientEvents::on_events`] as one `Vec`.
//!
//! # Commands from the handles: an unbounded channel
//!
//! [`SmppClient::submit`] and [`SmppClient::ack`] are synchronous and never block: they push
//! onto an unbounded `tokio::sync::mpsc` channel read by the session task. That is
//! acceptable *only* because the owner bounds what it hands over: the DestinationWorker
//! submits no more than the credit the Router gave it (its in-memory window), and it acks
//! only receipts this client delivered to it. Inside the session, submits wait in a queue
//! until the window ([`ClientConfig::window`]) and the token bucket
//! ([`ClientConfig::max_tps`]) let them go out; a caller that ignores its own bound makes
//! that queue grow, not the socket.
//!
//! # Results, exactly once
//!
//! Every submitted token gets exactly one [`ClientEvent::SubmitResult`]:
//!
//! - `Ok(message_id)` for a `submit_sm_resp` with ESME_ROK (an SMSC that sends ESME_ROK
//!   without a body yields an empty id);
//! - `Err(Status(s))` for another status, for a `generic_nack` answering the submit (a
//!   nack with status 0 is reported as ESME_RSYSERR), and for a submit that cannot be
//!   encoded (an address or service_type too long …: the status an SMSC would have
//!   answered — ESME_RINVSRCADR, ESME_RINVDSTADR, ESME_RINVMSGLEN, ESME_RINVSERTYP, else
//!   ESME_RSUBMITFAIL — all permanent);
//! - `Err(Timeout)` when no response came within [`ClientConfig::response_timeout`]; the
//!   submit leaves the window then, and a late response is ignored;
//! - `Err(Disconnected)` for everything outstanding or still queued when the session is lost;
//! - `Err(NotBound)` at once, from [`SmppClient::submit`] itself, when no transmitting
//!   session is bound (or the client is stopped), and from the task for submits that reach
//!   it between two sessions.
//!
//! The one exception is the end of the client: once [`SmppClient::stop`] was called or the
//! last handle dropped, the tasks report nothing more (not even `Down`). The owner has gone
//! away, and a replacement owner that shares the event sink must not receive a dead client's
//! results or its `Down` (its tokens could collide with the new owner's). What was
//! outstanding then has an unknown outcome, which at-least-once submission already covers.
//!
//! # Receiving
//!
//! - `deliver_sm` → [`ClientEvent::Deliver`] (with the receipted_message_id, message_state
//!   and message_payload TLVs extracted); its `deliver_sm_resp` is written only when the
//!   owner calls [`SmppClient::ack`] with the [`DeliverAck`] and a status, so the receipt
//!   can be stored first. An ack for a session that has closed since is dropped: the SMSC
//!   sends the PDU again. `data_sm` is reported the same way and answered with
//!   `data_sm_resp`.
//! - `enquire_link` → `enquire_link_resp`; `alert_notification` (which has no response) is
//!   ignored; `generic_nack` is logged (and fails the submit it answers).
//! - `unbind` → `unbind_resp`, then the session closes and reconnects.
//! - A frame that does not decode → `generic_nack` (from [`FrameError::reply`]) and the
//!   session continues; a frame that breaks the framing ([`FrameError::must_close`]) or is
//!   longer than `max_command_length` is answered the same way, then the session closes
//!   and reconnects. Any other request (submit_sm, query_sm, outbind …) gets
//!   `generic_nack` ESME_RINVCMDID; unexpected responses are ignored.
//!
//! [`FrameError::reply`]: crate::smpp::frame::FrameError::reply
//! [`FrameError::must_close`]: crate::smpp::frame::FrameError::must_close
//!
//! # Timers
//!
//! `response_timeout` bounds the TCP connect, the bind response, every submit_sm and
//! enquire_link response and every socket write. An `enquire_link` goes out when no PDU
//! has arrived from the SMSC for `enquire_link_interval` (`Duration::ZERO` disables it), so
//! a peer that swallows our submits without answering is also probed; no answer within
//! `response_timeout` closes the session as dead (`Down`, reconnect). On close the client
//! sends `unbind` and waits up to `min(response_timeout, 1 s)` for `unbind_resp`.
//!
//! # Metrics and logs
//!
//! `sendium_destination_up` (gauge, label `destination` = [`ClientConfig::name`]) follows
//! the transmitting session until the client is stopped; `sendium_destination_submits_total` (labels `destination`,
//! `result` = `ok|status|timeout|disconnected`; `NotBound` submits never left and are not
//! counted); `sendium_destination_reconnects_total` (label `destination`: every connection
//! attempt after a slot's first). Binds, refused binds (status name and code) and lost
//! sessions (reason) are logged with the destination name; never message ids, bodies,
//! system_id or password.

mod pace;
mod pdu;

/// How a provider's deliver_sm or data_sm reads as an [`InboundDeliver`] (public for the
/// fuzz targets, which check what the sessions do with it).
pub use pdu::{inbound_data_sm, inbound_deliver};
mod session;
#[cfg(test)]
mod tests;
mod transport;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::SmppAddress;
use crate::smpp::build::BindKind;

/// How the client binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    /// One session that submits and receives receipts.
    Transceiver,
    /// Two sessions: a transmitter for submits, a receiver for receipts.
    TransmitterReceiver,
    /// Submit only (no receipts).
    Transmitter,
    /// Receive only. Such a client never reports [`ClientEvent::Up`] (nothing can be
    /// submitted through it); its receiver session still reconnects and delivers.
    Receiver,
}

impl BindMode {
    /// The sessions this mode opens, transmitting one first.
    fn slots(self) -> &'static [BindKind] {
        match self {
            BindMode::Transceiver => &[BindKind::Transceiver],
            BindMode::TransmitterReceiver => &[BindKind::Transmitter, BindKind::Receiver],
            BindMode::Transmitter => &[BindKind::Transmitter],
            BindMode::Receiver => &[BindKind::Receiver],
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Destination name, for logs and metric labels.
    pub name: String,
    pub host: String,
    pub port: u16,
    pub system_id: String,
    pub password: String,
    pub system_type: String,
    pub bind: BindMode,
    /// Outstanding submit_sm (no submit_sm_resp yet) per transmitting session. 0 is taken
    /// as 1.
    pub window: usize,
    /// Submits per second across the destination's sessions; 0 = unlimited.
    pub max_tps: u32,
    /// Idle time after which an enquire_link is sent; `Duration::ZERO` disables it.
    pub enquire_link_interval: Duration,
    /// A submit_sm (or enquire_link, bind) unanswered this long fails with `Timeout`.
    pub response_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Longest PDU accepted from the SMSC; 0 means
    /// [`DEFAULT_MAX_COMMAND_LENGTH`](crate::smpp::frame::DEFAULT_MAX_COMMAND_LENGTH).
    pub max_command_length: u32,
    /// TLS over the TCP connection (`tls = true`); None for plain SMPP.
    pub tls: Option<crate::tls::ClientTlsSettings>,
}

/// Written by hand so that the password never reaches a log line.
impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("system_id", &self.system_id)
            .field("password", &"<redacted>")
            .field("system_type", &self.system_type)
            .field("bind", &self.bind)
            .field("window", &self.window)
            .field("max_tps", &self.max_tps)
            .field("enquire_link_interval", &self.enquire_link_interval)
            .field("response_timeout", &self.response_timeout)
            .field("reconnect_min", &self.reconnect_min)
            .field("reconnect_max", &self.reconnect_max)
            .field("max_command_length", &self.max_command_length)
            .field("tls", &self.tls)
            .finish()
    }
}

/// One provider part to submit. `short_message` includes the UDH when `esm_class` has
/// UDHI (0x40) set; esm_class is always sent as given. A `short_message` longer than 255
/// octets is sent in the message_payload TLV (with an empty short_message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundSubmit {
    pub service_type: String,
    pub source: SmppAddress,
    pub destination: SmppAddress,
    pub esm_class: u8,
    pub protocol_id: u8,
    pub priority_flag: u8,
    pub registered_delivery: u8,
    pub data_coding: u8,
    pub short_message: Vec<u8>,
    /// When the provider is to deliver it (ms since the Unix epoch): sent as an absolute
    /// `schedule_delivery_time` while it is in the future. None: at once.
    pub schedule_delivery_time: Option<u64>,
}

/// A deliver_sm received from the provider (a receipt, or a mobile-originated message).
/// A data_sm is reported the same way (its user data in `message_payload`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundDeliver {
    pub source: SmppAddress,
    pub destination: SmppAddress,
    pub esm_class: u8,
    pub data_coding: u8,
    pub short_message: Vec<u8>,
    pub message_payload: Option<Vec<u8>>,
    pub receipted_message_id: Option<String>,
    pub message_state: Option<u8>,
    /// The SAR TLVs (sar_msg_ref_num, sar_total_segments, sar_segment_seqnum), when all
    /// three came.
    pub sar: Option<(u16, u8, u8)>,
}

impl InboundDeliver {
    /// The user data (message_payload if present, else short_message, without any UDH)
    /// and where the message sits in a multipart message: from the UDH's concatenation
    /// element (esm_class UDHI) or, failing that, the SAR TLVs.
    pub fn user_data(&self) -> Result<(Option<crate::multipart::Concat>, &[u8]), crate::multipart::MultipartError> {
        let data = self.message_payload.as_deref().unwrap_or(&self.short_message);
        let (udh_concat, user_data) = if self.esm_class & 0x40 != 0 {
            let (concat, _udh, user_data) = crate::multipart::parse_udh(data)?;
            (concat, user_data)
        } else {
            (None, data)
        };
        let sar = match self.sar {
            Some((reference, total, seq)) => Some(crate::multipart::from_sar(reference, total, seq)?),
            None => None,
        };
        Ok((udh_concat.or(sar), user_data))
    }
}

/// Identifies a received deliver_sm so its deliver_sm_resp can be sent later (after the
/// receipt is stored). Opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliverAck {
    /// The TCP session (unique in the process) the PDU arrived on.
    pub(crate) session: u64,
    pub(crate) sequence: u32,
    /// Which of the client's sessions (index into its slots) must answer.
    pub(crate) slot: u8,
    /// Answer with data_sm_resp instead of deliver_sm_resp.
    pub(crate) data_sm: bool,
}

/// Why a submit did not get a provider id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitFailure {
    /// submit_sm_resp with this non-zero command_status.
    Status(u32),
    /// No submit_sm_resp within the response timeout.
    Timeout,
    /// The session closed before the response.
    Disconnected,
    /// No bound transmitting session right now.
    NotBound,
}

impl SubmitFailure {
    /// Worth retrying later: throttling, a full queue at the SMSC, a system error,
    /// timeouts and lost sessions. Everything else ends the branch.
    pub fn is_transient(&self) -> bool {
        match self {
            SubmitFailure::Status(s) => matches!(*s, 0x08 | 0x14 | 0x58 | 0x64),
            SubmitFailure::Timeout | SubmitFailure::Disconnected | SubmitFailure::NotBound => true,
        }
    }

    pub fn status(&self) -> Option<u32> {
        match self {
            SubmitFailure::Status(s) => Some(*s),
            _ => None,
        }
    }

    /// Low-cardinality label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            SubmitFailure::Status(0x58) => "throttled",
            SubmitFailure::Status(0x14) => "queue_full",
            SubmitFailure::Status(_) => "status",
            SubmitFailure::Timeout => "timeout",
            SubmitFailure::Disconnected => "disconnected",
            SubmitFailure::NotBound => "not_bound",
        }
    }
}

/// What a client session reports.
#[derive(Debug, Clone)]
pub enum ClientEvent {
    /// A transmitting session is bound: submits can flow.
    Up,
    /// No transmitting session is bound any more (reconnecting with backoff).
    Down { reason: String },
    /// The result of the submit with this token.
    SubmitResult {
        token: u64,
        result: Result<String, SubmitFailure>,
    },
    /// A deliver_sm arrived; answer it with [`SmppClient::ack`].
    Deliver { pdu: InboundDeliver, ack: DeliverAck },
}

/// Receives events, one batch per wake-up of the session task.
///
/// Called from the session tasks (and, for `NotBound` results, from
/// [`SmppClient::submit`]'s caller): it must not block.
pub trait ClientEvents: Send + Sync + 'static {
    fn on_events(&self, events: Vec<ClientEvent>);
}

/// What a handle asks of a session task.
pub(crate) enum Cmd {
    Submit(Vec<(u64, OutboundSubmit)>),
    Ack(Vec<(DeliverAck, u32)>),
    /// Wake-up after [`Shared::stopped`] was set.
    Stop,
}

/// State the handles and the tasks share.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) events: Arc<dyn ClientEvents>,
    /// A transmitting session is bound (set before `Up`, cleared before `Down`).
    pub(crate) up: AtomicBool,
    /// `stop()` was called: tasks unbind and end, and report nothing more.
    pub(crate) stopped: AtomicBool,
}

impl Shared {
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

struct Inner {
    shared: Arc<Shared>,
    /// One command channel per session task, in [`BindMode::slots`] order. Dropping the
    /// last handle drops these senders, which is how the tasks learn that they must end.
    slots: Vec<mpsc::UnboundedSender<Cmd>>,
    /// Index of the transmitting slot, if the mode has one.
    transmitter: Option<usize>,
}

/// Handle to a destination's session(s). Cheap to clone; when the last clone is dropped
/// the sessions unbind and close.
#[derive(Clone)]
pub struct SmppClient {
    inner: Arc<Inner>,
}

impl fmt::Debug for SmppClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmppClient")
            .field("destination", &self.inner.shared.name)
            .field("up", &self.is_up())
            .finish()
    }
}

/// Answers deliver_sm PDUs of a client without keeping it alive; see [`SmppClient::acker`].
#[derive(Clone, Debug)]
pub struct Acker {
    inner: Weak<Inner>,
}

impl Acker {
    /// As [`SmppClient::ack`]; does nothing once every [`SmppClient`] handle is gone (the
    /// sessions are closed, so the SMSC sends the PDUs again).
    pub fn ack(&self, acks: Vec<(DeliverAck, u32)>) {
        if let Some(inner) = self.inner.upgrade() {
            SmppClient { inner }.ack(acks);
        }
    }
}

impl SmppClient {
    /// Start connecting and binding (with reconnect backoff) in background tasks.
    ///
    /// Returns at once. Must be called from within a tokio runtime; without one, the
    /// client logs an error and stays down (every submit gets `NotBound`).
    pub fn start(config: ClientConfig, events: Arc<dyn ClientEvents>) -> SmppClient {
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            events,
            up: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let kinds = config.bind.slots();
        let transmitter = kinds.iter().position(|kind| kind.can_transmit());
        let mut slots = Vec::with_capacity(kinds.len());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let config = Arc::new(config);
                for (index, kind) in kinds.iter().enumerate() {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let slot = session::Slot::new(
                        u8::try_from(index).unwrap_or(u8::MAX),
                        *kind,
                        config.clone(),
                        shared.clone(),
                        rx,
                    );
                    runtime.spawn(slot.run());
                    slots.push(tx);
                }
            }
            Err(err) => {
                tracing::error!(destination = %shared.name, error = %err, "SMPP client started outside a tokio runtime; it stays down");
                shared.stopped.store(true, Ordering::Release);
            }
        }
        SmppClient {
            inner: Arc::new(Inner {
                shared,
                slots,
                transmitter,
            }),
        }
    }

    /// Queue submits; each gets exactly one `SubmitResult` with its token.
    ///
    /// Never blocks. When no transmitting session is bound the results (`NotBound`) are
    /// reported before this returns, from the caller's thread.
    pub fn submit(&self, batch: Vec<(u64, OutboundSubmit)>) {
        if batch.is_empty() {
            return;
        }
        let rejected = match self.inner.transmitter.and_then(|i| self.inner.slots.get(i)) {
            Some(tx) if self.is_up() => match tx.send(Cmd::Submit(batch)) {
                Ok(()) => return,
                Err(mpsc::error::SendError(cmd)) => match cmd {
                    Cmd::Submit(batch) => batch,
                    Cmd::Ack(_) | Cmd::Stop => return,
                },
            },
            _ => batch,
        };
        let events = rejected
            .into_iter()
            .map(|(token, _)| ClientEvent::SubmitResult {
                token,
                result: Err(SubmitFailure::NotBound),
            })
            .collect();
        self.inner.shared.events.on_events(events);
    }

    /// Answer received deliver_sm PDUs with these command_status values (0 = ESME_ROK).
    ///
    /// An ack for a session that has closed since is dropped silently: the SMSC sends the
    /// PDU again on a new session.
    pub fn ack(&self, acks: Vec<(DeliverAck, u32)>) {
        let slots = &self.inner.slots;
        if slots.len() == 1 {
            if let Some(tx) = slots.first() {
                let _ = tx.send(Cmd::Ack(acks));
            }
            return;
        }
        let mut per_slot: Vec<Vec<(DeliverAck, u32)>> = slots.iter().map(|_| Vec::new()).collect();
        for (ack, status) in acks {
            if let Some(list) = per_slot.get_mut(usize::from(ack.slot)) {
                list.push((ack, status));
            }
        }
        for (tx, list) in slots.iter().zip(per_slot) {
            if !list.is_empty() {
                let _ = tx.send(Cmd::Ack(list));
            }
        }
    }

    /// An ack-only handle that does not keep the sessions alive.
    ///
    /// Give this, not a clone of the client, to whatever answers receipts later (the DLR
    /// stage): a clone held there would keep a crashed owner's sessions bound — and
    /// reporting into the shared event sink — until the last receipt is answered.
    pub fn acker(&self) -> Acker {
        Acker {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// A transmitting session is bound and the client is not stopped.
    pub fn is_up(&self) -> bool {
        let shared = &self.inner.shared;
        shared.up.load(Ordering::Acquire) && !shared.is_stopped()
    }

    /// Unbind and close now. The tasks end and report nothing more; later submits get
    /// `NotBound` at once.
    pub fn stop(&self) {
        self.inner.shared.stopped.store(true, Ordering::Release);
        for tx in &self.inner.slots {
            let _ = tx.send(Cmd::Stop);
        }
    }
}
