//! One ESME connection: a single task, a single `select!` loop.
//!
//! Per wake-up the loop does all the work that is ready: it reads what the socket holds and
//! decodes every frame in it (one handler call for all submits of that read), settles every
//! handler batch that completed, queues every deliver request that arrived, and then writes
//! everything produced with one `write_all` at the top of the next iteration.

use std::collections::VecDeque;
use std::mem;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::budget::UnboundTicket;
use crate::auth_guard::Verdict;
use tracing::Instrument;

use super::account::{AccountBook, AccountState, BindRefusal, BindSlot};
use super::convert;
use super::metrics::{self, PduTally};
use super::registry::{self, ChunkReply, DELIVER_QUEUE, DeliverChunk, Registration};
use super::{CLOSE_GRACE, DeliverOutcome, InboundSubmit, OutboundDeliver, ServerConfig, SubmitHandler, SubmitReply};
use crate::smpp::IdMap;
use crate::smpp::build::{self, BindKind};
use crate::smpp::frame::{self, FrameError};
use crate::tls;

/// Spare room ensured in the read buffer before each read: up to this much is read per
/// syscall (several hundred submit_sm).
const READ_RESERVE: usize = 64 * 1024;
/// An output buffer that grew beyond this (a large deliver batch) is released after use.
const OUT_KEEP: usize = 1024 * 1024;
/// After the last write, how long the session waits for the ESME to close its side.
const LINGER: Duration = Duration::from_millis(500);
/// Our system_id when the configured one cannot be sent (longer than 15 ASCII octets).
const FALLBACK_SYSTEM_ID: &str = "sendium";

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// What all sessions of one server share.
pub(super) struct Shared {
    pub(super) config: Arc<ServerConfig>,
    /// Bound sessions' slots (`max_connections`).
    bound_slots: Arc<Semaphore>,
    handler: Arc<dyn SubmitHandler>,
    registry: super::SessionRegistry,
    accounts: AccountBook,
    window: usize,
    system_id: String,
}

impl Shared {
    pub(super) fn new(
        config: Arc<ServerConfig>,
        handler: Arc<dyn SubmitHandler>,
        registry: super::SessionRegistry,
    ) -> Self {
        let system_id = if build::bind_resp(BindKind::Transceiver, 0, CommandStatus::EsmeRok, &config.system_id).is_ok()
        {
            config.system_id.clone()
        } else {
            tracing::error!(
                fallback = FALLBACK_SYSTEM_ID,
                "configured SMPP system_id cannot be sent in a bind_resp (at most 15 ASCII characters)"
            );
            FALLBACK_SYSTEM_ID.to_owned()
        };
        Shared {
            bound_slots: Arc::new(Semaphore::new(config.max_connections.max(1))),
            accounts: config.accounts.clone(),
            window: config.window.max(1),
            system_id,
            config,
            handler,
            registry,
        }
    }
}

/// A connection's place in the unbound budget until it binds, and the token that
/// closes it when a newer connection needs the place (see `budget.rs`).
pub(super) struct Unbound {
    pub(super) ticket: UnboundTicket,
    pub(super) evict: CancellationToken,
}

/// Runs the session of one accepted connection until it closes. With `tls` the handshake
/// runs here first, in the connection's own task and within the connection's bind deadline:
/// the connection holds its unbound place meanwhile, so handshakes that never finish are
/// bounded by `max-unbound` and `bind-timeout` like connections that never bind.
pub(super) async fn run(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    unbound: Unbound,
    tls: Option<TlsAcceptor>,
) {
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let span =
        tracing::info_span!("smpp_session", session = id, %peer, account = tracing::field::Empty, tls = tls.is_some());
    async move {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "TCP_NODELAY not set");
        }
        tracing::debug!("SMPP connection accepted");
        let mut session = Session::new(id, peer, shared, shutdown.clone());
        session.unbound = Some(unbound.ticket);
        session.evict = unbound.evict;
        match tls {
            None => {
                let mut stream = stream;
                let (rd, wr) = stream.split();
                session.run(rd, wr, shutdown).await;
            }
            Some(acceptor) => {
                let handshake = tls::accept_by(&acceptor, stream, session.bind_deadline);
                let stream = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    () = session.evict.cancelled() => {
                        tracing::debug!("SMPP connection in its TLS handshake closed to make room for a newer one");
                        return;
                    }
                    done = handshake => match done {
                        Ok(stream) => stream,
                        Err(err) => {
                            tls::count_handshake_failure("smpp", &err);
                            tracing::info!(error = %err, "SMPP TLS handshake did not complete; closing");
                            return;
                        }
                    },
                };
                session.tls = true;
                session.certificate = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(tls::Subject::of);
                let (rd, wr) = tokio::io::split(stream);
                session.run(rd, wr, shutdown).await;
            }
        }
        tracing::info!(
            account = session.account.as_ref().map(|a| &*a.name),
            reason = session.close_reason,
            "SMPP session closed"
        );
    }
    .instrument(span)
    .await;
}

/// A bound session's hold on shared state: its bind slot and its registry entry. Dropped
/// when the session starts closing.
struct Bound {
    kind: BindKind,
    _slot: BindSlot,
    _registration: Registration,
    /// One of the `max_connections` bound sessions.
    _connection: OwnedSemaphorePermit,
}

impl Bound {
    fn new(kind: BindKind, slot: BindSlot, registration: Registration, connection: OwnedSemaphorePermit) -> Self {
        ::metrics::gauge!(metrics::SESSIONS, "bind" => registry::bind_name(kind)).increment(1.0);
        Bound {
            kind,
            _slot: slot,
            _registration: registration,
            _connection: connection,
        }
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        ::metrics::gauge!(metrics::SESSIONS, "bind" => registry::bind_name(self.kind)).decrement(1.0);
    }
}

/// What the session sends last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Final {
    Nothing,
    /// Answer the ESME's unbind.
    UnbindResp(u32),
    /// Server shutdown: send unbind and wait for unbind_resp.
    Unbind,
}

struct Closing {
    deadline: Instant,
    last: Final,
    /// Sequence number of the unbind we sent.
    unbind_sent: Option<u32>,
    expired: bool,
    finished: bool,
}

/// One submit_sm of a read: its sequence number, and the status it is refused with, or
/// `None` when it goes to the handler (the handler's replies fill those in order).
struct Slot {
    seq: u32,
    refused: Option<CommandStatus>,
    /// Answered with data_sm_resp (a data_sm) instead of submit_sm_resp.
    data_sm: bool,
}

/// A handler batch that completed.
struct BatchDone {
    slots: Vec<Slot>,
    /// Submits handed to the handler.
    handled: usize,
    /// `None` when the handler panicked.
    replies: Option<Vec<SubmitReply>>,
}

/// Run-length tally of error statuses, so a flood of one refusal costs one metrics call.
#[derive(Default)]
struct ErrorTally {
    run: Option<(CommandStatus, u64)>,
}

impl ErrorTally {
    fn count(&mut self, status: CommandStatus) {
        if status == CommandStatus::EsmeRok {
            return;
        }
        match &mut self.run {
            Some((current, n)) if *current == status => *n += 1,
            run => {
                if let Some((previous, n)) = run.replace((status, 1)) {
                    metrics::error(previous, n);
                }
            }
        }
    }

    fn flush(&mut self) {
        if let Some((status, n)) = self.run.take() {
            metrics::error(status, n);
        }
    }
}

/// Outbound deliver_sm of one session.
struct Delivers {
    window: usize,
    timeout: Duration,
    chunks: IdMap<u64, ChunkReply>,
    next_chunk: u64,
    /// Written, waiting for deliver_sm_resp: sequence number → (chunk, item index).
    pending: IdMap<u32, (u64, usize)>,
    /// Write order of `pending` (deadlines are increasing); entries already answered are
    /// skipped when they reach the front.
    deadlines: VecDeque<(Instant, u32)>,
    /// Accepted but not written yet (the window is full).
    queued: VecDeque<(u64, usize, OutboundDeliver)>,
}

impl Delivers {
    fn new(window: usize, timeout: Duration) -> Self {
        Delivers {
            window,
            timeout,
            chunks: IdMap::default(),
            next_chunk: 0,
            pending: IdMap::default(),
            deadlines: VecDeque::new(),
            queued: VecDeque::new(),
        }
    }

    fn accept(&mut self, chunk: DeliverChunk) {
        let id = self.next_chunk;
        self.next_chunk = self.next_chunk.wrapping_add(1);
        let DeliverChunk { items, reply } = chunk;
        self.chunks.insert(id, reply);
        self.queued
            .extend(items.into_iter().enumerate().map(|(index, item)| (id, index, item)));
    }

    /// Writes queued items while the window has room.
    fn pump(&mut self, now: Instant, next_seq: &mut u32, out: &mut BytesMut) {
        while self.pending.len() < self.window {
            let Some((chunk, index, item)) = self.queued.pop_front() else {
                break;
            };
            let seq = take_seq(next_seq);
            match convert::deliver_sm(seq, &item) {
                Ok(command) => {
                    frame::encode(&command, out);
                    self.pending.insert(seq, (chunk, index));
                    self.deadlines.push_back((now + self.timeout, seq));
                }
                Err(status) => {
                    tracing::warn!(
                        status = metrics::status_name(status),
                        "deliver_sm cannot be built from the given fields"
                    );
                    self.settle(chunk, index, DeliverOutcome::Refused(u32::from(status)));
                }
            }
        }
    }

    fn settle(&mut self, chunk: u64, index: usize, outcome: DeliverOutcome) {
        if let Some(reply) = self.chunks.get_mut(&chunk)
            && reply.settle(index, outcome)
        {
            self.chunks.remove(&chunk);
        }
    }

    /// Settles the deliver_sm with sequence number `seq`; false when none is outstanding.
    fn resolve(&mut self, seq: u32, outcome: DeliverOutcome) -> bool {
        match self.pending.remove(&seq) {
            Some((chunk, index)) => {
                self.settle(chunk, index, outcome);
                true
            }
            None => false,
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if deadline > now && self.pending.contains_key(&seq) {
                break;
            }
            self.deadlines.pop_front();
            if let Some((chunk, index)) = self.pending.remove(&seq) {
                self.settle(chunk, index, DeliverOutcome::Timeout);
            }
        }
    }

    fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&(deadline, seq)) = self.deadlines.front() {
            if self.pending.contains_key(&seq) {
                return Some(deadline);
            }
            self.deadlines.pop_front();
        }
        None
    }

    /// The session ends: every open item is settled as disconnected.
    fn abandon(&mut self) {
        self.queued.clear();
        self.pending.clear();
        self.deadlines.clear();
        self.chunks.clear();
    }

    /// Items not written yet will not be: they are settled as disconnected.
    fn drop_queued(&mut self) {
        while let Some((chunk, index, _)) = self.queued.pop_front() {
            self.settle(chunk, index, DeliverOutcome::Disconnected);
        }
    }
}

/// The next sequence number of a PDU we originate: 1..=0x7FFFFFFF, wrapping.
fn take_seq(next: &mut u32) -> u32 {
    let seq = *next;
    *next = if seq >= 0x7FFF_FFFF { 1 } else { seq + 1 };
    seq
}

async fn recv_chunk(rx: &mut Option<mpsc::Receiver<DeliverChunk>>) -> Option<DeliverChunk> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

struct Session {
    shared: Arc<Shared>,
    id: u64,
    peer: SocketAddr,
    /// Cancelled to unbind and close this session: by the server's shutdown, or by the
    /// registry when a reload removes the session's account.
    close: CancellationToken,
    /// The account, from a successful bind on (kept while closing, for the last batch and
    /// the logs).
    account: Option<Arc<AccountState>>,
    bound: Option<Bound>,
    closing: Option<Closing>,
    close_reason: &'static str,

    codec: LengthDelimitedCodec,
    rbuf: BytesMut,
    out: BytesMut,
    /// False once the stream ended or can no longer be trusted.
    reading: bool,
    /// False once a write failed or stalled.
    write_ok: bool,
    /// The ESME closed its side (or the read failed).
    eof: bool,

    inflight: FuturesOrdered<BoxFuture<'static, BatchDone>>,
    /// Handler-bound submits whose answers are not written yet (the window).
    unwritten: usize,
    /// Submits of the read being processed.
    slots: Vec<Slot>,
    submits: Vec<InboundSubmit>,

    next_seq: u32,
    last_rx: Instant,
    /// Deadline for any PDU after we sent an idle enquire_link.
    probe: Option<Instant>,
    bind_deadline: Instant,
    /// A failed bind's answer is held back until then (see [`crate::auth_guard`]).
    answer_not_before: Option<Instant>,
    /// Its place in the unbound budget, given back when it binds.
    unbound: Option<UnboundTicket>,
    /// Fired when a newer unbound connection needs the place (ignored once bound).
    evict: CancellationToken,
    /// When the timer is armed for; a day ahead when disarmed.
    timer_at: Instant,

    delivers: Delivers,
    deliver_rx: Option<mpsc::Receiver<DeliverChunk>>,

    pdus: PduTally,
    errors: ErrorTally,

    /// The connection came over the TLS listener.
    tls: bool,
    /// The subject of the client certificate it presented (mutual TLS), if any.
    certificate: Option<crate::tls::Subject>,
}

impl Session {
    fn new(id: u64, peer: SocketAddr, shared: Arc<Shared>, close: CancellationToken) -> Self {
        let now = Instant::now();
        let config = &shared.config;
        Session {
            id,
            peer,
            close,
            account: None,
            bound: None,
            closing: None,
            close_reason: "closed",
            codec: frame::codec(config.max_command_length),
            rbuf: BytesMut::new(),
            out: BytesMut::new(),
            reading: true,
            write_ok: true,
            eof: false,
            inflight: FuturesOrdered::new(),
            unwritten: 0,
            slots: Vec::new(),
            submits: Vec::new(),
            next_seq: 1,
            last_rx: now,
            probe: None,
            bind_deadline: now + config.bind_timeout,
            answer_not_before: None,
            unbound: None,
            evict: CancellationToken::new(),
            timer_at: far_future(now),
            delivers: Delivers::new(shared.window, config.deliver_timeout),
            deliver_rx: None,
            pdus: PduTally::default(),
            errors: ErrorTally::default(),
            tls: false,
            certificate: None,
            shared,
        }
    }

    async fn run<R, W>(&mut self, mut rd: R, mut wr: W, shutdown: CancellationToken)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let cancel = shutdown.cancelled_owned();
        tokio::pin!(cancel);
        let timer = tokio::time::sleep_until(self.timer_at);
        tokio::pin!(timer);

        loop {
            if !self.out.is_empty() {
                self.flush(&mut wr).await;
            }
            let now = Instant::now();
            if now >= self.timer_at {
                self.timer_at = far_future(now);
                self.on_timer(now);
            }
            if self.close_step() {
                if !self.out.is_empty() {
                    self.flush(&mut wr).await;
                }
                break;
            }
            if !self.out.is_empty() {
                // close_step or the timer produced output (unbind, enquire_link, deliver_sm).
                continue;
            }

            let next = self.next_deadline(now);
            if next < self.timer_at {
                self.timer_at = next;
                timer.as_mut().reset(next);
            }
            if self.reading {
                self.rbuf.reserve(READ_RESERVE);
            }

            tokio::select! {
                biased;
                _ = &mut cancel, if self.closing.is_none() => self.on_shutdown(),
                () = self.evict.cancelled(), if self.closing.is_none() && self.bound.is_none() => {
                    tracing::debug!("unbound SMPP connection closed to make room for a newer one");
                    self.stop_reading();
                    self.start_closing(Final::Nothing, "evicted while unbound");
                }
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.finish_batch(done);
                    while let Some(Some(done)) = self.inflight.next().now_or_never() {
                        self.finish_batch(done);
                    }
                    self.errors.flush();
                }
                chunk = recv_chunk(&mut self.deliver_rx), if self.deliver_rx.is_some() => self.on_deliver(chunk),
                read = rd.read_buf(&mut self.rbuf), if self.reading => self.on_read(read),
                () = &mut timer => {}
            }
        }
        // Whatever is still open is abandoned now, not after the linger below: in-flight
        // batches are dropped, and dropping a ChunkReply settles its items as disconnected.
        self.inflight = FuturesOrdered::new();
        self.delivers.abandon();
        let _ = wr.shutdown().await;
        if self.write_ok && !self.eof {
            // Closing a socket with unread input makes the kernel send RST, which can wipe
            // our last answers (a bind_resp, unbind_resp) from the ESME's receive buffer
            // before it reads them. So read and discard until the ESME closes too, briefly.
            let _ = tokio::time::timeout(LINGER, async {
                let mut sink = [0u8; 4096];
                while let Ok(n) = rd.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }
    }

    /// Writes `out` with one `write_all`; a failed or stalled write ends the session.
    async fn flush<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) {
        if let Some(at) = self.answer_not_before.take() {
            // The session closes after this answer and reads nothing more: waiting here
            // holds up nothing but the guesser.
            tokio::time::sleep_until(at).await;
        }
        if self.write_ok {
            let stall = self.shared.config.idle_timeout.max(Duration::from_millis(100));
            // The flush matters for TLS only: a write can leave records in the TLS buffer
            // when the socket is full, and nothing else would send them.
            let write = async {
                wr.write_all(&self.out).await?;
                wr.flush().await
            };
            let result = tokio::time::timeout(stall, write).await;
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "SMPP write failed");
                    Some("write failed")
                }
                Err(_) => {
                    tracing::warn!("SMPP write stalled (the ESME does not read); closing");
                    Some("write stalled")
                }
            };
            if let Some(reason) = failure {
                self.write_ok = false;
                self.stop_reading();
                self.start_closing(Final::Nothing, reason);
            }
        }
        if self.out.capacity() > OUT_KEEP {
            self.out = BytesMut::new();
        } else {
            self.out.clear();
        }
    }

    fn stop_reading(&mut self) {
        self.reading = false;
        self.rbuf = BytesMut::new();
    }

    fn next_deadline(&mut self, now: Instant) -> Instant {
        let mut next = far_future(now);
        match &self.closing {
            Some(closing) => next = next.min(closing.deadline),
            None => {
                next = next.min(self.probe.unwrap_or(self.last_rx + self.shared.config.idle_timeout));
                if self.bound.is_none() {
                    next = next.min(self.bind_deadline);
                }
            }
        }
        if let Some(deadline) = self.delivers.next_deadline() {
            next = next.min(deadline);
        }
        next
    }

    fn on_timer(&mut self, now: Instant) {
        self.delivers.expire(now);
        if let Some(closing) = &mut self.closing {
            if now >= closing.deadline {
                closing.expired = true;
            }
        } else if self.bound.is_none() && now >= self.bind_deadline {
            tracing::info!("SMPP connection did not bind in time; closing");
            self.stop_reading();
            self.start_closing(Final::Nothing, "bind timeout");
        } else if let Some(probe) = self.probe {
            if now >= probe {
                tracing::info!("ESME did not answer enquire_link; closing");
                self.stop_reading();
                self.start_closing(Final::Nothing, "idle timeout");
            }
        } else if now >= self.last_rx + self.shared.config.idle_timeout {
            let seq = take_seq(&mut self.next_seq);
            frame::encode(&build::enquire_link(seq), &mut self.out);
            self.probe = Some(now + self.shared.config.idle_timeout);
        }
        if self.closing.is_none() {
            self.delivers.pump(now, &mut self.next_seq, &mut self.out);
        }
    }

    /// Advances a closing session; true when it is done.
    fn close_step(&mut self) -> bool {
        let drained = self.inflight.is_empty() && (!self.reading || self.delivers.pending.is_empty());
        let Some(closing) = &mut self.closing else {
            return false;
        };
        if closing.finished {
            return true;
        }
        if !drained && !closing.expired {
            return false;
        }
        match closing.last {
            Final::Nothing => closing.finished = true,
            Final::UnbindResp(seq) => {
                frame::encode(&build::unbind_resp(seq), &mut self.out);
                closing.finished = true;
            }
            Final::Unbind => {
                if closing.unbind_sent.is_none() && self.write_ok {
                    let seq = take_seq(&mut self.next_seq);
                    frame::encode(&build::unbind(seq), &mut self.out);
                    closing.unbind_sent = Some(seq);
                }
                // Then wait for unbind_resp, unless there is no time or no stream left.
                if closing.expired || !self.reading || !self.write_ok {
                    closing.finished = true;
                }
            }
        }
        closing.finished
    }

    /// Starts closing (once): the session leaves the registry and frees its bind slot, and
    /// queued deliveries are settled as disconnected.
    fn start_closing(&mut self, last: Final, reason: &'static str) {
        if self.closing.is_some() {
            return;
        }
        self.close_reason = reason;
        self.closing = Some(Closing {
            deadline: Instant::now() + CLOSE_GRACE,
            last,
            unbind_sent: None,
            expired: false,
            finished: false,
        });
        if let Some(bound) = self.bound.take() {
            tracing::info!(
                account = self.account.as_ref().map(|a| &*a.name),
                bind = registry::bind_name(bound.kind),
                reason,
                "SMPP session unbinding"
            );
        }
        if let Some(mut rx) = self.deliver_rx.take() {
            rx.close();
            while let Ok(chunk) = rx.try_recv() {
                drop(chunk);
            }
        }
        self.delivers.drop_queued();
    }

    fn on_shutdown(&mut self) {
        let last = if self.bound.is_some() {
            Final::Unbind
        } else {
            Final::Nothing
        };
        self.start_closing(last, "shutdown");
    }

    fn on_deliver(&mut self, chunk: Option<DeliverChunk>) {
        let Some(chunk) = chunk else {
            self.deliver_rx = None;
            return;
        };
        self.delivers.accept(chunk);
        if let Some(rx) = &mut self.deliver_rx {
            while let Ok(chunk) = rx.try_recv() {
                self.delivers.accept(chunk);
            }
        }
        self.delivers.pump(Instant::now(), &mut self.next_seq, &mut self.out);
    }

    fn on_read(&mut self, read: std::io::Result<usize>) {
        match read {
            Ok(0) => {
                self.eof = true;
                self.stop_reading();
                self.start_closing(Final::Nothing, "connection closed by the ESME");
            }
            Ok(_) => {
                let now = Instant::now();
                self.last_rx = now;
                self.probe = None;
                self.process_frames();
                if self.closing.is_none() {
                    self.delivers.pump(now, &mut self.next_seq, &mut self.out);
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "SMPP read failed");
                self.eof = true;
                self.stop_reading();
                self.start_closing(Final::Nothing, "read failed");
            }
        }
    }

    /// Decodes every complete frame in the read buffer, then hands the read's submits on.
    fn process_frames(&mut self) {
        while self.reading {
            match self.codec.decode(&mut self.rbuf) {
                Ok(Some(bytes)) => match frame::decode_frame(bytes) {
                    Ok(command) => {
                        self.pdus.count(metrics::command_index(command.id()));
                        self.on_command(&command);
                    }
                    Err(err) => self.on_bad_frame(&err),
                },
                Ok(None) => break,
                Err(err) => {
                    self.pdus.count(metrics::INVALID);
                    if frame::is_frame_too_long(&err) {
                        let header = frame::peek_header(&self.rbuf);
                        tracing::warn!(
                            command_length = header.map(|h| h.command_length),
                            max = self.shared.config.max_command_length,
                            "SMPP command_length above the maximum; closing"
                        );
                        if let Some(header) = header
                            && header.command_id != u32::from(CommandId::GenericNack)
                        {
                            self.errors.count(CommandStatus::EsmeRinvcmdlen);
                            let nack = build::generic_nack(header.sequence_number, CommandStatus::EsmeRinvcmdlen);
                            frame::encode(&nack, &mut self.out);
                        }
                    } else {
                        tracing::debug!(error = %err, "SMPP framing failed; closing");
                    }
                    self.stop_reading();
                    self.start_closing(Final::Nothing, "bad command_length");
                }
            }
        }
        self.finish_read_batch();
        self.pdus.flush();
        self.errors.flush();
    }

    fn on_bad_frame(&mut self, err: &FrameError) {
        self.pdus.count(metrics::INVALID);
        tracing::debug!(error = %err, "SMPP PDU refused");
        if let Some(reply) = err.reply() {
            self.errors.count(err.nack_status());
            frame::encode(&reply, &mut self.out);
        }
        if err.must_close() {
            self.stop_reading();
            self.start_closing(Final::Nothing, "bad command_length");
        }
    }

    fn nack(&mut self, seq: u32, status: CommandStatus) {
        self.errors.count(status);
        frame::encode(&build::generic_nack(seq, status), &mut self.out);
    }

    fn on_command(&mut self, command: &Command) {
        let seq = command.sequence_number();
        let id = command.id();
        match (id, command.pdu()) {
            (CommandId::SubmitSm, Some(Pdu::SubmitSm(sm))) => self.on_submit(seq, convert::inbound_submit(sm), false),
            (CommandId::DataSm, Some(Pdu::DataSm(dsm))) => self.on_submit(seq, convert::inbound_data_sm(dsm), true),
            (CommandId::BindTransmitter, Some(Pdu::BindTransmitter(bind))) => self.on_bind(
                BindKind::Transmitter,
                seq,
                bind.system_id.as_str(),
                bind.password.as_str().as_bytes(),
            ),
            (CommandId::BindReceiver, Some(Pdu::BindReceiver(bind))) => {
                self.on_bind(
                    BindKind::Receiver,
                    seq,
                    bind.system_id.as_str(),
                    bind.password.as_str().as_bytes(),
                );
            }
            (CommandId::BindTransceiver, Some(Pdu::BindTransceiver(bind))) => self.on_bind(
                BindKind::Transceiver,
                seq,
                bind.system_id.as_str(),
                bind.password.as_str().as_bytes(),
            ),
            (CommandId::EnquireLink, _) => frame::encode(&build::enquire_link_resp(seq), &mut self.out),
            (CommandId::EnquireLinkResp, _) => {}
            (CommandId::Unbind, _) => self.on_unbind(seq),
            (CommandId::UnbindResp, _) => {
                if let Some(closing) = &mut self.closing
                    && closing.unbind_sent.is_some()
                {
                    closing.finished = true;
                }
            }
            (CommandId::DeliverSmResp, _) => {
                let status = command.status();
                let outcome = if status == CommandStatus::EsmeRok {
                    DeliverOutcome::Acked
                } else {
                    DeliverOutcome::Refused(u32::from(status))
                };
                if !self.delivers.resolve(seq, outcome) {
                    tracing::debug!(seq, "deliver_sm_resp for no outstanding deliver_sm; ignored");
                }
            }
            (CommandId::GenericNack, _) => {
                let status = command.status();
                let settled = self.delivers.resolve(seq, DeliverOutcome::Refused(u32::from(status)));
                tracing::info!(
                    seq,
                    status = metrics::status_name(status),
                    settled_deliver = settled,
                    "ESME sent generic_nack"
                );
            }
            (id, _) if id.is_response() => {
                tracing::debug!(command_id = u32::from(id), "unexpected response from the ESME; ignored");
            }
            (id, _) => {
                let status = if self.bound.is_none() && self.closing.is_none() {
                    CommandStatus::EsmeRinvbndsts
                } else {
                    CommandStatus::EsmeRinvcmdid
                };
                tracing::debug!(command_id = u32::from(id), "unsupported SMPP request");
                self.nack(seq, status);
            }
        }
    }

    fn on_bind(&mut self, kind: BindKind, seq: u32, system_id: &str, password: &[u8]) {
        let refuse = |session: &mut Session, status: CommandStatus| {
            metrics::bind_refused(status);
            match build::bind_resp(kind, seq, status, &session.shared.system_id) {
                Ok(resp) => frame::encode(&resp, &mut session.out),
                Err(_) => session.nack(seq, status),
            }
        };
        if self.closing.is_some() {
            refuse(self, CommandStatus::EsmeRinvbndsts);
            return;
        }
        if self.bound.is_some() {
            tracing::info!(bind = registry::bind_name(kind), "bind on a bound session refused");
            refuse(self, CommandStatus::EsmeRalybnd);
            return;
        }
        let guard = &self.shared.config.auth;
        let ip = self.peer.ip();
        let verdict = guard.check(ip, Some(system_id));
        let admitted = if !self.shared.handler.accepts_binds() {
            Err(CommandStatus::EsmeRbindfail)
        } else if let Verdict::Refuse(left) = verdict {
            ::metrics::counter!("sendium_auth_refused_total", "listener" => "smpp").increment(1);
            tracing::warn!(
                system_id,
                peer = %ip,
                refused_for_s = left.as_secs(),
                "SMPP bind refused without checking: too many failed binds"
            );
            Err(CommandStatus::EsmeRbindfail)
        } else {
            match self
                .shared
                .accounts
                .accounts()
                .bind_from(system_id, password, ip, self.certificate.as_ref())
            {
                Ok(slot) => Ok(slot),
                Err(BindRefusal::Certificate) => {
                    ::metrics::counter!("sendium_auth_certificate_refused_total", "listener" => "smpp").increment(1);
                    tracing::warn!(
                        system_id,
                        peer = %ip,
                        tls = self.tls,
                        certificate = self.certificate.is_some(),
                        "SMPP bind refused: the account's tls-subject requires a client certificate with that subject"
                    );
                    Err(CommandStatus::EsmeRbindfail)
                }
                Err(BindRefusal::Address) => {
                    ::metrics::counter!("sendium_auth_address_refused_total", "listener" => "smpp").increment(1);
                    tracing::warn!(system_id, peer = %ip, "SMPP bind refused: the account's allowed-ips do not include the peer");
                    Err(CommandStatus::EsmeRbindfail)
                }
                Err(refusal) => Err(refusal.status()),
            }
        };
        match &admitted {
            Ok(_) => guard.succeeded(ip, Some(system_id)),
            Err(CommandStatus::EsmeRinvsysid | CommandStatus::EsmeRinvpaswd) => {
                ::metrics::counter!("sendium_auth_failures_total", "listener" => "smpp").increment(1);
                let delay = guard.failed(ip, Some(system_id));
                if !delay.is_zero() {
                    self.answer_not_before = Some(Instant::now() + delay);
                }
            }
            Err(_) => {}
        }
        let slot = match admitted {
            Ok(slot) => slot,
            Err(status) => {
                tracing::warn!(
                    system_id,
                    peer = %ip,
                    bind = registry::bind_name(kind),
                    status = metrics::status_name(status),
                    "SMPP bind refused"
                );
                refuse(self, status);
                self.stop_reading();
                self.start_closing(Final::Nothing, "bind refused");
                return;
            }
        };

        let Ok(bound_slot) = self.shared.bound_slots.clone().try_acquire_owned() else {
            tracing::warn!(system_id, "SMPP bind refused: max-connections bound sessions reached");
            refuse(self, CommandStatus::EsmeRbindfail);
            self.stop_reading();
            self.start_closing(Final::Nothing, "bind refused");
            return;
        };
        self.unbound = None;
        let account = slot.account().clone();
        let (tx, rx) = if kind.can_receive() {
            let (tx, rx) = mpsc::channel(DELIVER_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let registration = self.shared.registry.register(
            &account.name,
            registry::Entry {
                id: self.id,
                kind,
                peer: self.peer,
                tx,
                send_timeout: self.shared.config.deliver_timeout,
                close: self.close.clone(),
            },
        );
        self.deliver_rx = rx;
        self.bound = Some(Bound::new(kind, slot, registration, bound_slot));
        match build::bind_resp(kind, seq, CommandStatus::EsmeRok, &self.shared.system_id) {
            Ok(resp) => frame::encode(&resp, &mut self.out),
            Err(_) => self.nack(seq, CommandStatus::EsmeRsyserr),
        }
        tracing::Span::current().record("account", &*account.name);
        tracing::info!(
            account = &*account.name,
            bind = registry::bind_name(kind),
            "SMPP session bound"
        );
        self.shared.handler.bound(&account.name, kind.can_receive());
        self.account = Some(account);
    }

    fn on_unbind(&mut self, seq: u32) {
        match &mut self.closing {
            None => self.start_closing(Final::UnbindResp(seq), "unbind"),
            Some(closing) => {
                // Both sides unbinding, or a repeated unbind: answer at once and finish.
                frame::encode(&build::unbind_resp(seq), &mut self.out);
                closing.finished = true;
            }
        }
    }

    /// A submit_sm, or a data_sm (`data_sm`), read into `submit`: the window, the
    /// account's rate and the pipeline treat both alike; only the answer differs.
    fn on_submit(&mut self, seq: u32, submit: Result<InboundSubmit, CommandStatus>, data_sm: bool) {
        let may_submit = self.closing.is_none() && self.bound.as_ref().is_some_and(|b| b.kind.can_transmit());
        let refused = if may_submit {
            match submit {
                Ok(submit) => {
                    self.submits.push(submit);
                    None
                }
                Err(status) => Some(status),
            }
        } else {
            Some(CommandStatus::EsmeRinvbndsts)
        };
        self.slots.push(Slot { seq, refused, data_sm });
    }

    /// Applies the window and the account's token bucket to the read's submits and hands
    /// the admitted ones to the handler as one batch.
    fn finish_read_batch(&mut self) {
        if self.slots.is_empty() {
            return;
        }
        let mut slots = mem::take(&mut self.slots);
        let mut submits = mem::take(&mut self.submits);

        let account = self.account.clone();
        if !submits.is_empty() {
            let room = self.shared.window.saturating_sub(self.unwritten);
            let mut admitted = submits.len().min(room);
            if admitted > 0
                && let Some(account) = &account
            {
                admitted = account.admit(admitted, Instant::now());
            }
            if admitted < submits.len() {
                for slot in slots.iter_mut().filter(|slot| slot.refused.is_none()).skip(admitted) {
                    slot.refused = Some(CommandStatus::EsmeRthrottled);
                }
                submits.truncate(admitted);
            }
        }

        match account {
            Some(account) if !submits.is_empty() => {
                let handled = submits.len();
                self.unwritten += handled;
                let handler = self.shared.handler.clone();
                let batch = async move {
                    let call = handler.submit(&account.name, submits);
                    let replies = AssertUnwindSafe(call).catch_unwind().await.ok();
                    BatchDone {
                        slots,
                        handled,
                        replies,
                    }
                };
                self.inflight.push_back(Box::pin(batch));
            }
            // Every submit of the read was refused: answer now.
            _ => self.finish_batch(BatchDone {
                slots,
                handled: 0,
                replies: Some(Vec::new()),
            }),
        }
    }

    /// Writes the answers of a batch, in request order.
    fn finish_batch(&mut self, done: BatchDone) {
        let BatchDone {
            slots,
            handled,
            replies,
        } = done;
        self.unwritten = self.unwritten.saturating_sub(handled);
        match &replies {
            None => tracing::error!(batch = handled, "submit handler panicked; answering ESME_RSYSERR"),
            Some(replies) if replies.len() != handled => tracing::error!(
                batch = handled,
                replies = replies.len(),
                "submit handler returned a wrong number of replies"
            ),
            Some(_) => {}
        }
        let mut replies = replies.unwrap_or_default().into_iter();
        for slot in slots {
            let answer = if slot.data_sm {
                convert::put_data_sm_resp
            } else {
                convert::put_submit_sm_resp
            };
            let status = match slot.refused {
                Some(status) => status,
                None => match replies.next() {
                    Some(SubmitReply::Accepted(id)) => {
                        if answer(&mut self.out, slot.seq, CommandStatus::EsmeRok, &id) {
                            continue;
                        }
                        tracing::error!("submit handler returned an id that is not a valid message_id");
                        CommandStatus::EsmeRsyserr
                    }
                    Some(SubmitReply::Refused(0)) => {
                        tracing::error!("submit handler refused with status 0");
                        CommandStatus::EsmeRsyserr
                    }
                    Some(SubmitReply::Refused(code)) => CommandStatus::from(code),
                    None => CommandStatus::EsmeRsyserr,
                },
            };
            self.errors.count(status);
            answer(&mut self.out, slot.seq, status, "");
        }
    }
}

/// A deadline that never comes (tokio's timer handles ~2 years; a day is plenty).
fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(86_400)
}
