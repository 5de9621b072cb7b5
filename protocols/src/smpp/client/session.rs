//! The session tasks: one per TCP session ("slot"), reconnecting forever until the client
//! ends.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use metrics::{Counter, Gauge};
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::{Instant, sleep, sleep_until, timeout, timeout_at};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use super::pace::{Backoff, SeqGen, TokenBucket};
use super::transport::{self, Transport};
use super::{ClientConfig, ClientEvent, Cmd, DeliverAck, OutboundSubmit, Shared, SubmitFailure, pdu};
use crate::smpp::IdMap;
use crate::smpp::build::{self, BindCredentials, BindKind, BuildError};
use crate::smpp::frame::{self, FrameError, decode_frame, encode, is_frame_too_long, peek_header};

/// Session ids, unique in the process, so an ack can tell whether its session still exists.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Read buffer growth step.
const READ_RESERVE: usize = 64 * 1024;
/// At most this much is read per wake-up before the session writes and reports, so a peer
/// that never stops sending cannot starve the writes.
const MAX_READ_PER_WAKE: usize = 1024 * 1024;
/// Upper bound on the wait for unbind_resp and for last writes on a closing session.
const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// A timer far enough away to mean "nothing to do"; recomputed every wake-up.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// Why a connection attempt or a session ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("TCP connect failed: {0}")]
    Connect(io::Error),
    #[error("TCP connect timed out")]
    ConnectTimeout,
    #[error("TLS set-up failed: {0}")]
    TlsSetup(String),
    #[error("TLS handshake failed: {0}")]
    TlsHandshake(io::Error),
    #[error("TLS handshake timed out")]
    TlsTimeout,
    #[error("bind request not encodable: {0}")]
    BindRequest(#[from] BuildError),
    #[error("bind refused with {status:?} ({code:#010x})")]
    BindRefused { status: CommandStatus, code: u32 },
    #[error("no bind response within the response timeout")]
    BindTimeout,
    #[error("connection closed by the SMSC")]
    Closed,
    #[error("socket error: {0}")]
    Io(io::Error),
    #[error("write timed out (the SMSC does not read)")]
    WriteTimeout,
    #[error("the SMSC sent a PDU longer than max_command_length")]
    FrameTooLong,
    #[error("unrecoverable framing error: {0}")]
    Framing(FrameError),
    #[error("no enquire_link_resp within the response timeout")]
    EnquireLinkTimeout,
    #[error("unbound by the SMSC")]
    UnbindBySmsc,
}

impl SessionError {
    fn refused(status: CommandStatus) -> Self {
        SessionError::BindRefused {
            status,
            code: u32::from(status),
        }
    }
}

/// Metric handles of one destination, looked up once per task.
#[derive(Clone)]
struct Metrics {
    up: Gauge,
    ok: Counter,
    status: Counter,
    timeout: Counter,
    disconnected: Counter,
    reconnects: Counter,
}

impl Metrics {
    fn new(name: &str) -> Self {
        let submits = |result: &'static str| metrics::counter!("sendium_destination_submits_total", "destination" => name.to_owned(), "result" => result);
        Self {
            up: metrics::gauge!("sendium_destination_up", "destination" => name.to_owned()),
            ok: submits("ok"),
            status: submits("status"),
            timeout: submits("timeout"),
            disconnected: submits("disconnected"),
            reconnects: metrics::counter!("sendium_destination_reconnects_total", "destination" => name.to_owned()),
        }
    }
}

/// Submit outcomes counted during one wake-up, added to the counters once.
#[derive(Default)]
struct Counts {
    ok: u64,
    status: u64,
    timeout: u64,
    disconnected: u64,
}

impl Counts {
    fn flush(&mut self, metrics: &Metrics) {
        for (n, counter) in [
            (self.ok, &metrics.ok),
            (self.status, &metrics.status),
            (self.timeout, &metrics.timeout),
            (self.disconnected, &metrics.disconnected),
        ] {
            if n > 0 {
                counter.increment(n);
            }
        }
        *self = Counts::default();
    }
}

/// Reports events unless the client has been stopped (see the module docs: a stopped
/// client reports nothing more).
fn emit(shared: &Shared, events: Vec<ClientEvent>) {
    if !events.is_empty() && !shared.is_stopped() {
        shared.events.on_events(events);
    }
}

fn not_bound(batch: Vec<(u64, OutboundSubmit)>) -> Vec<ClientEvent> {
    batch
        .into_iter()
        .map(|(token, _)| ClientEvent::SubmitResult {
            token,
            result: Err(SubmitFailure::NotBound),
        })
        .collect()
}

/// Runs `fut` while answering commands the way a slot without a bound session must:
/// submits get `NotBound`, acks are dropped (their session is gone). `None` when the
/// client ends (stopped, or every handle dropped) before `fut` completes.
async fn while_unbound<F: Future>(rx: &mut UnboundedReceiver<Cmd>, shared: &Shared, fut: F) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            out = &mut fut => return Some(out),
            cmd = rx.recv() => match cmd {
                None | Some(Cmd::Stop) => return None,
                Some(Cmd::Submit(batch)) => emit(shared, not_bound(batch)),
                Some(Cmd::Ack(_)) => {}
            },
        }
        if shared.is_stopped() {
            return None;
        }
    }
}

/// One session slot of a client: a task that connects, binds, runs the session and
/// reconnects, until the client ends.
pub(crate) struct Slot {
    index: u8,
    kind: BindKind,
    config: Arc<ClientConfig>,
    shared: Arc<Shared>,
    rx: UnboundedReceiver<Cmd>,
}

impl Slot {
    pub(crate) fn new(
        index: u8,
        kind: BindKind,
        config: Arc<ClientConfig>,
        shared: Arc<Shared>,
        rx: UnboundedReceiver<Cmd>,
    ) -> Self {
        Self {
            index,
            kind,
            config,
            shared,
            rx,
        }
    }

    fn transmits(&self) -> bool {
        self.kind.can_transmit()
    }

    fn set_up(&self, metrics: &Metrics, up: bool) {
        if self.transmits() {
            self.shared.up.store(up, Ordering::Release);
            // A stopped client reports nothing more, on the gauge either: after a reload
            // changed the destination, the new client's session owns the series, and the
            // old one unbinding must not set it to 0 under a bound session.
            if !self.shared.is_stopped() {
                metrics.up.set(if up { 1.0 } else { 0.0 });
            }
        }
    }

    pub(crate) async fn run(mut self) {
        let name = self.shared.name.clone();
        let metrics = Metrics::new(&name);
        self.set_up(&metrics, false);
        let mut backoff = Backoff::new(self.config.reconnect_min, self.config.reconnect_max);
        let mut bucket = TokenBucket::new(self.config.max_tps, Instant::now());
        let mut first_attempt = true;
        loop {
            if self.shared.is_stopped() {
                break;
            }
            if !first_attempt {
                metrics.reconnects.increment(1);
            }
            first_attempt = false;
            let attempt = while_unbound(&mut self.rx, &self.shared, connect_and_bind(&self.config, self.kind)).await;
            let Some(attempt) = attempt else { break };
            match attempt {
                Err(err @ (SessionError::TlsSetup(_) | SessionError::TlsHandshake(_) | SessionError::TlsTimeout)) => {
                    tracing::warn!(destination = %name, bind = ?self.kind, error = %err, "SMPP destination TLS failed; nothing sent, reconnecting with backoff");
                }
                Err(SessionError::BindRefused { status, code }) => {
                    tracing::warn!(destination = %name, bind = ?self.kind, status = ?status, code, "SMPP bind refused");
                }
                Err(err) => {
                    tracing::warn!(destination = %name, bind = ?self.kind, error = %err, "SMPP connect or bind failed");
                }
                Ok(bound) => {
                    backoff.reset();
                    let mut session = Session::new(&self, bound, metrics.clone());
                    tracing::info!(destination = %name, bind = ?self.kind, session = session.id, "SMPP session bound");
                    self.set_up(&metrics, true);
                    // An owner that dropped its last handle meanwhile hears nothing more.
                    if self.transmits() && !self.rx.is_closed() {
                        emit(&self.shared, vec![ClientEvent::Up]);
                    }
                    match session.run(&mut self.rx, &mut bucket).await {
                        End::Closing => {
                            self.set_up(&metrics, false);
                            session.close_gracefully().await;
                            tracing::info!(destination = %name, bind = ?self.kind, session = session.id, "SMPP session unbound and closed");
                            break;
                        }
                        End::Lost(err) => {
                            tracing::warn!(destination = %name, bind = ?self.kind, session = session.id, reason = %err, "SMPP session lost");
                            self.set_up(&metrics, false);
                            session.flush_best_effort().await;
                            let mut events = session.fail_outstanding();
                            let ending = self.drain_after_loss(&mut events, &mut session.counts);
                            session.counts.flush(&metrics);
                            if self.transmits() {
                                events.push(ClientEvent::Down {
                                    reason: err.to_string(),
                                });
                            }
                            drop(session);
                            if ending {
                                break;
                            }
                            emit(&self.shared, events);
                        }
                    }
                }
            }
            let delay = backoff.next_delay();
            tracing::debug!(destination = %name, bind = ?self.kind, delay_ms = delay.as_millis(), "reconnecting after backoff");
            if while_unbound(&mut self.rx, &self.shared, sleep(delay)).await.is_none() {
                break;
            }
        }
        self.set_up(&metrics, false);
        tracing::debug!(destination = %name, bind = ?self.kind, "SMPP session task ended");
    }

    /// After a loss: submits still in the channel were sent while the session looked up;
    /// they fail as `Disconnected` with the rest. True when the client is ending (stopped
    /// or every handle dropped): then nothing is reported.
    fn drain_after_loss(&mut self, events: &mut Vec<ClientEvent>, counts: &mut Counts) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(Cmd::Submit(batch)) => {
                    counts.disconnected += batch.len() as u64;
                    events.extend(batch.into_iter().map(|(token, _)| ClientEvent::SubmitResult {
                        token,
                        result: Err(SubmitFailure::Disconnected),
                    }));
                }
                Ok(Cmd::Ack(_)) => {}
                Ok(Cmd::Stop) | Err(TryRecvError::Disconnected) => return true,
                Err(TryRecvError::Empty) => return self.shared.is_stopped() || self.rx.is_closed(),
            }
        }
    }
}

/// A connected and bound TCP session, as the bind exchange leaves it.
struct Bound {
    stream: Transport,
    codec: LengthDelimitedCodec,
    /// Bytes read after the bind response (the SMSC may send at once).
    rbuf: BytesMut,
    seq: SeqGen,
}

fn max_command_length(config: &ClientConfig) -> u32 {
    if config.max_command_length == 0 {
        frame::DEFAULT_MAX_COMMAND_LENGTH
    } else {
        config.max_command_length
    }
}

async fn connect_and_bind(config: &ClientConfig, kind: BindKind) -> Result<Bound, SessionError> {
    let deadline = Instant::now() + config.response_timeout;
    let stream = match timeout_at(deadline, TcpStream::connect((config.host.as_str(), config.port))).await {
        Err(_) => return Err(SessionError::ConnectTimeout),
        Ok(Err(err)) => return Err(SessionError::Connect(err)),
        Ok(Ok(stream)) => stream,
    };
    stream.set_nodelay(true).map_err(SessionError::Io)?;
    let mut stream = match timeout_at(deadline, transport::secure(config, stream)).await {
        Err(_) => return Err(SessionError::TlsTimeout),
        Ok(result) => result?,
    };

    // The bind response gets its own full response timeout, after the connect.
    let deadline = Instant::now() + config.response_timeout;
    let mut seq = SeqGen::new();
    let bind_seq = seq.next_seq();
    let creds = BindCredentials {
        system_id: &config.system_id,
        password: &config.password,
        system_type: &config.system_type,
    };
    let mut wbuf = BytesMut::new();
    encode(&build::bind(kind, bind_seq, &creds)?, &mut wbuf);
    write_by(&mut stream, &mut wbuf, deadline).await?;

    let mut codec = frame::codec(max_command_length(config));
    let mut rbuf = BytesMut::with_capacity(READ_RESERVE);
    loop {
        while let Some(frame) = codec.decode(&mut rbuf).map_err(|err| {
            if is_frame_too_long(&err) {
                SessionError::FrameTooLong
            } else {
                SessionError::Io(err)
            }
        })? {
            let command = match decode_frame(frame) {
                Ok(command) => command,
                Err(err) if err.must_close() => return Err(SessionError::Framing(err)),
                Err(err) => {
                    if let Some(reply) = err.reply() {
                        encode(&reply, &mut wbuf);
                    }
                    continue;
                }
            };
            let id = command.id();
            let answers_bind = command.sequence_number() == bind_seq;
            if answers_bind && id.is_response() && BindKind::from_command_id(id) == Some(kind) {
                if command.status() != CommandStatus::EsmeRok {
                    return Err(SessionError::refused(command.status()));
                }
                return Ok(Bound {
                    stream,
                    codec,
                    rbuf,
                    seq,
                });
            }
            match id {
                CommandId::GenericNack if answers_bind => return Err(SessionError::refused(command.status())),
                CommandId::EnquireLink => encode(&build::enquire_link_resp(command.sequence_number()), &mut wbuf),
                // Nothing else is legal before the bind response; ignore it.
                _ => {}
            }
        }
        write_by(&mut stream, &mut wbuf, deadline).await?;
        rbuf.reserve(READ_RESERVE);
        match timeout_at(deadline, stream.read_buf(&mut rbuf)).await {
            Err(_) => return Err(SessionError::BindTimeout),
            Ok(Err(err)) => return Err(SessionError::Io(err)),
            Ok(Ok(0)) => return Err(SessionError::Closed),
            Ok(Ok(_)) => {}
        }
    }
}

/// Writes and clears `wbuf` (if it holds anything) before `deadline`.
async fn write_by(stream: &mut Transport, wbuf: &mut BytesMut, deadline: Instant) -> Result<(), SessionError> {
    if wbuf.is_empty() {
        return Ok(());
    }
    // The flush matters for TLS only: records left in its buffer by a full socket.
    let write = async {
        stream.write_all(wbuf).await?;
        stream.flush().await
    };
    match timeout_at(deadline, write).await {
        Err(_) => Err(SessionError::WriteTimeout),
        Ok(Err(err)) => Err(SessionError::Io(err)),
        Ok(Ok(())) => {
            wbuf.clear();
            Ok(())
        }
    }
}

/// How a bound session ended.
enum End {
    /// The client ends (stop() or the last handle dropped): unbind, report nothing.
    Closing,
    /// The session broke; the slot reports and reconnects.
    Lost(SessionError),
}

enum Wake {
    Command(Option<Cmd>),
    Read(io::Result<usize>),
    Timer,
    /// The first pass, for frames that arrived with the bind response.
    Start,
}

/// One bound TCP session.
struct Session {
    id: u64,
    slot: u8,
    kind: BindKind,
    config: Arc<ClientConfig>,
    shared: Arc<Shared>,
    metrics: Metrics,
    counts: Counts,
    stream: Transport,
    codec: LengthDelimitedCodec,
    rbuf: BytesMut,
    /// Everything written in one wake-up, sent with one `write_all`.
    wbuf: BytesMut,
    seq: SeqGen,
    window: usize,
    /// Outstanding submit_sm: sequence number → token.
    pending: IdMap<u32, u64>,
    /// Response deadlines in send order (so in deadline order); entries already answered
    /// are skipped when they reach the front.
    deadlines: VecDeque<(Instant, u32)>,
    /// Submits waiting for window and TPS.
    queue: VecDeque<(u64, OutboundSubmit)>,
    /// The outstanding enquire_link: sequence number and response deadline.
    enquire: Option<(u32, Instant)>,
    enquire_interval: Option<Duration>,
    /// When a PDU last arrived from the SMSC.
    last_read: Instant,
    events: Vec<ClientEvent>,
}

impl Session {
    fn new(slot: &Slot, bound: Bound, metrics: Metrics) -> Self {
        let config = slot.config.clone();
        let interval = config.enquire_link_interval;
        Self {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            slot: slot.index,
            kind: slot.kind,
            window: config.window.max(1),
            enquire_interval: (!interval.is_zero()).then_some(interval),
            config,
            shared: slot.shared.clone(),
            metrics,
            counts: Counts::default(),
            stream: bound.stream,
            codec: bound.codec,
            rbuf: bound.rbuf,
            wbuf: BytesMut::with_capacity(READ_RESERVE),
            seq: bound.seq,
            pending: IdMap::default(),
            deadlines: VecDeque::new(),
            queue: VecDeque::new(),
            enquire: None,
            last_read: Instant::now(),
            events: Vec::new(),
        }
    }

    /// The next sequence number not in use by an outstanding submit (relevant only after
    /// wrapping past 0x7FFFFFFF).
    fn next_seq(&mut self) -> u32 {
        loop {
            let seq = self.seq.next_seq();
            if !self.pending.contains_key(&seq) {
                return seq;
            }
        }
    }

    async fn run(&mut self, rx: &mut UnboundedReceiver<Cmd>, bucket: &mut TokenBucket) -> End {
        let mut now = Instant::now();
        let timer = sleep_until(now + IDLE_WAKE);
        tokio::pin!(timer);
        let mut wake = Wake::Start;
        loop {
            let mut closing = false;
            let mut eof = false;
            match wake {
                Wake::Start | Wake::Timer => {}
                Wake::Command(None) => closing = true,
                Wake::Command(Some(cmd)) => closing = self.on_command(cmd),
                Wake::Read(Ok(0)) => eof = true,
                Wake::Read(Ok(_)) => {}
                Wake::Read(Err(err)) => return End::Lost(SessionError::Io(err)),
            }
            // Everything else that is ready now: commands, then bytes.
            if !closing {
                closing = self.drain_commands(rx);
            }
            if closing || self.shared.is_stopped() {
                return End::Closing;
            }
            if !eof {
                match self.drain_socket() {
                    Ok(at_eof) => eof = at_eof,
                    Err(err) => return End::Lost(SessionError::Io(err)),
                }
            }
            if let Err(err) = self.read_frames(now) {
                return End::Lost(err);
            }
            if eof {
                return End::Lost(SessionError::Closed);
            }
            if let Err(err) = self.check_timers(now) {
                return End::Lost(err);
            }
            self.fill_window(now, bucket);
            self.report();
            if let Err(err) = self.write_out().await {
                return End::Lost(err);
            }

            let deadline = self.next_deadline(now, bucket);
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            if self.rbuf.capacity() - self.rbuf.len() < READ_RESERVE / 4 {
                self.rbuf.reserve(READ_RESERVE);
            }
            wake = tokio::select! {
                cmd = rx.recv() => Wake::Command(cmd),
                read = self.stream.read_buf(&mut self.rbuf) => Wake::Read(read),
                () = &mut timer => Wake::Timer,
            };
            now = Instant::now();
        }
    }

    /// Handles one command; true when the client ends.
    fn on_command(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Submit(batch) => {
                if self.kind.can_transmit() {
                    self.queue.extend(batch);
                } else {
                    self.events.extend(not_bound(batch));
                }
            }
            Cmd::Ack(acks) => {
                for (ack, status) in acks {
                    // An ack for an earlier session: dropped, the SMSC will send again.
                    if ack.session != self.id {
                        continue;
                    }
                    let status = CommandStatus::from(status);
                    let resp = if ack.data_sm {
                        pdu::data_sm_resp(ack.sequence, status)
                    } else {
                        build::deliver_sm_resp(ack.sequence, status)
                    };
                    encode(&resp, &mut self.wbuf);
                }
            }
            Cmd::Stop => return true,
        }
        false
    }

    /// Takes every queued command; true when the client ends.
    fn drain_commands(&mut self, rx: &mut UnboundedReceiver<Cmd>) -> bool {
        loop {
            match rx.try_recv() {
                Ok(cmd) => {
                    if self.on_command(cmd) {
                        return true;
                    }
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => return true,
            }
        }
    }

    /// Reads what the socket has without waiting; true at end of stream.
    fn drain_socket(&mut self) -> io::Result<bool> {
        let mut total = 0;
        while total < MAX_READ_PER_WAKE {
            if self.rbuf.capacity() - self.rbuf.len() < READ_RESERVE / 4 {
                self.rbuf.reserve(READ_RESERVE);
            }
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => return Ok(true),
                Ok(n) => total += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) => return Err(err),
            }
        }
        Ok(false)
    }

    /// Decodes and handles every complete PDU in the read buffer.
    fn read_frames(&mut self, now: Instant) -> Result<(), SessionError> {
        loop {
            let frame = match self.codec.decode(&mut self.rbuf) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(err) if is_frame_too_long(&err) => {
                    let seq = peek_header(&self.rbuf).map_or(0, |h| h.sequence_number);
                    encode(&build::generic_nack(seq, CommandStatus::EsmeRinvcmdlen), &mut self.wbuf);
                    return Err(SessionError::FrameTooLong);
                }
                Err(err) => return Err(SessionError::Io(err)),
            };
            self.last_read = now;
            match decode_frame(frame) {
                Ok(command) => self.on_pdu(&command)?,
                Err(err) => {
                    tracing::warn!(destination = %self.shared.name, error = %err, "malformed PDU from the SMSC");
                    if let Some(reply) = err.reply() {
                        encode(&reply, &mut self.wbuf);
                    }
                    if err.must_close() {
                        return Err(SessionError::Framing(err));
                    }
                }
            }
        }
    }

    fn submit_result(&mut self, token: u64, result: Result<String, SubmitFailure>) {
        match &result {
            Ok(_) => self.counts.ok += 1,
            Err(SubmitFailure::Status(_)) => self.counts.status += 1,
            Err(SubmitFailure::Timeout) => self.counts.timeout += 1,
            Err(SubmitFailure::Disconnected) => self.counts.disconnected += 1,
            Err(SubmitFailure::NotBound) => {}
        }
        self.events.push(ClientEvent::SubmitResult { token, result });
    }

    fn on_pdu(&mut self, command: &Command) -> Result<(), SessionError> {
        let seq = command.sequence_number();
        let status = u32::from(command.status());
        match command.id() {
            CommandId::SubmitSmResp => {
                // Unknown sequence numbers are late answers to timed-out submits: ignored.
                if let Some(token) = self.pending.remove(&seq) {
                    let result = if status == 0 {
                        Ok(match command.pdu() {
                            Some(Pdu::SubmitSmResp(resp)) => resp.message_id().as_str().to_owned(),
                            _ => String::new(),
                        })
                    } else {
                        Err(SubmitFailure::Status(status))
                    };
                    self.submit_result(token, result);
                }
            }
            CommandId::GenericNack => {
                tracing::warn!(destination = %self.shared.name, status = ?command.status(), "generic_nack from the SMSC");
                if let Some(token) = self.pending.remove(&seq) {
                    let status = if status == 0 {
                        u32::from(CommandStatus::EsmeRsyserr)
                    } else {
                        status
                    };
                    self.submit_result(token, Err(SubmitFailure::Status(status)));
                } else if self.enquire.is_some_and(|(s, _)| s == seq) {
                    // A nacked enquire_link still proves the SMSC is alive.
                    self.enquire = None;
                }
            }
            CommandId::EnquireLink => encode(&build::enquire_link_resp(seq), &mut self.wbuf),
            CommandId::EnquireLinkResp => {
                if self.enquire.is_some_and(|(s, _)| s == seq) {
                    self.enquire = None;
                }
            }
            CommandId::DeliverSm => {
                if let Some(Pdu::DeliverSm(deliver)) = command.pdu() {
                    self.events.push(ClientEvent::Deliver {
                        pdu: pdu::inbound_deliver(deliver),
                        ack: self.ack_for(seq, false),
                    });
                }
            }
            CommandId::DataSm => {
                if let Some(Pdu::DataSm(data)) = command.pdu() {
                    self.events.push(ClientEvent::Deliver {
                        pdu: pdu::inbound_data_sm(data),
                        ack: self.ack_for(seq, true),
                    });
                }
            }
            CommandId::AlertNotification => {
                // No response exists for alert_notification (SMPP 3.4 §4.12).
                tracing::debug!(destination = %self.shared.name, "alert_notification ignored");
            }
            CommandId::Unbind => {
                encode(&build::unbind_resp(seq), &mut self.wbuf);
                return Err(SessionError::UnbindBySmsc);
            }
            id if id.is_response() => {
                tracing::debug!(destination = %self.shared.name, command = ?id, "unexpected response ignored");
            }
            id => {
                // A request an ESME does not serve (submit_sm, query_sm, outbind …).
                tracing::debug!(destination = %self.shared.name, command = ?id, "unsupported request answered with generic_nack");
                encode(&build::generic_nack(seq, CommandStatus::EsmeRinvcmdid), &mut self.wbuf);
            }
        }
        Ok(())
    }

    fn ack_for(&self, sequence: u32, data_sm: bool) -> DeliverAck {
        DeliverAck {
            session: self.id,
            sequence,
            slot: self.slot,
            data_sm,
        }
    }

    fn check_timers(&mut self, now: Instant) -> Result<(), SessionError> {
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if !self.pending.contains_key(&seq) {
                self.deadlines.pop_front();
                continue;
            }
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(token) = self.pending.remove(&seq) {
                self.submit_result(token, Err(SubmitFailure::Timeout));
            }
        }
        match (self.enquire, self.enquire_interval) {
            (Some((_, deadline)), _) if deadline <= now => return Err(SessionError::EnquireLinkTimeout),
            (None, Some(interval)) if self.last_read + interval <= now => {
                let seq = self.next_seq();
                encode(&build::enquire_link(seq), &mut self.wbuf);
                self.enquire = Some((seq, now + self.config.response_timeout));
            }
            _ => {}
        }
        Ok(())
    }

    /// Sends queued submits while window and TPS allow.
    fn fill_window(&mut self, now: Instant, bucket: &mut TokenBucket) {
        while self.pending.len() < self.window && !self.queue.is_empty() {
            if !bucket.take(now) {
                break;
            }
            let Some((token, part)) = self.queue.pop_front() else {
                break;
            };
            let seq = self.next_seq();
            match pdu::submit_sm(seq, &part) {
                Ok(command) => {
                    encode(&command, &mut self.wbuf);
                    self.pending.insert(seq, token);
                    self.deadlines.push_back((now + self.config.response_timeout, seq));
                }
                Err(err) => {
                    // Names the field and the constraint, never the value.
                    tracing::debug!(destination = %self.shared.name, error = %err, "submit not encodable");
                    self.submit_result(token, Err(SubmitFailure::Status(pdu::build_error_status(&err))));
                }
            }
        }
    }

    /// When the session must wake up without I/O: the first response deadline, the
    /// enquire_link timer, or the moment the token bucket lets a batch go.
    fn next_deadline(&self, now: Instant, bucket: &mut TokenBucket) -> Instant {
        let mut next = now + IDLE_WAKE;
        if let Some(&(deadline, _)) = self.deadlines.front() {
            next = next.min(deadline);
        }
        match (self.enquire, self.enquire_interval) {
            (Some((_, deadline)), _) => next = next.min(deadline),
            (None, Some(interval)) => next = next.min(self.last_read + interval),
            (None, None) => {}
        }
        let free = self.window.saturating_sub(self.pending.len());
        if !self.queue.is_empty() && free > 0 {
            next = next.min(bucket.ready_at(now, free.min(self.queue.len())));
        }
        next
    }

    /// Hands this wake-up's events to the owner as one batch.
    fn report(&mut self) {
        self.counts.flush(&self.metrics);
        if !self.events.is_empty() {
            // The next wake-up's batch is likely about as large: sized for it, its events
            // are not copied again at every doubling.
            let next = Vec::with_capacity(self.events.len());
            emit(&self.shared, std::mem::replace(&mut self.events, next));
        }
    }

    async fn write_out(&mut self) -> Result<(), SessionError> {
        let deadline = Instant::now() + self.config.response_timeout;
        write_by(&mut self.stream, &mut self.wbuf, deadline).await
    }

    /// Sends what is still buffered (a generic_nack, an unbind_resp) before the socket
    /// closes, without waiting long.
    async fn flush_best_effort(&mut self) {
        let deadline = Instant::now() + self.config.response_timeout.min(CLOSE_WAIT);
        let _ = write_by(&mut self.stream, &mut self.wbuf, deadline).await;
    }

    /// Everything outstanding or queued fails as `Disconnected`, after the events of the
    /// wake-up in which the session was lost.
    fn fail_outstanding(&mut self) -> Vec<ClientEvent> {
        let mut pending: Vec<(u32, u64)> = self.pending.drain().collect();
        pending.sort_unstable();
        let queued: Vec<u64> = self.queue.drain(..).map(|(token, _)| token).collect();
        for token in pending.into_iter().map(|(_, token)| token).chain(queued) {
            self.submit_result(token, Err(SubmitFailure::Disconnected));
        }
        self.deadlines.clear();
        self.enquire = None;
        std::mem::take(&mut self.events)
    }

    /// unbind, a short wait for unbind_resp, then close. Nothing is reported.
    async fn close_gracefully(&mut self) {
        let seq = self.next_seq();
        encode(&build::unbind(seq), &mut self.wbuf);
        let wait = self.config.response_timeout.min(CLOSE_WAIT);
        let Session {
            stream,
            wbuf,
            rbuf,
            codec,
            ..
        } = self;
        let exchange = async {
            stream.write_all(wbuf).await?;
            stream.flush().await?;
            wbuf.clear();
            loop {
                while let Some(frame) = codec.decode(rbuf)? {
                    let answered = decode_frame(frame)
                        .is_ok_and(|command| command.id() == CommandId::UnbindResp && command.sequence_number() == seq);
                    if answered {
                        return Ok(());
                    }
                }
                rbuf.reserve(READ_RESERVE);
                if stream.read_buf(rbuf).await? == 0 {
                    return Ok::<(), io::Error>(());
                }
            }
        };
        let _ = timeout(wait, exchange).await;
        let _ = timeout(wait, stream.shutdown()).await;
    }
}
