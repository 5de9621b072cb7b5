//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! Wire-level tests of the server: a real listener on 127.0.0.1:0, a raw ESME written here
//! (tokio `TcpStream` + [`frame::codec`] + the `build` helpers) and a fake handler that
//! records what it was given.
//!
//! No test sleeps to synchronise: every wait is for a condition, bounded by [`WAIT`].

mod bind;
mod deliver;
mod framing;
mod lifecycle;
mod submit;
mod throughput;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::StreamExt;
use parking_lot::Mutex;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::smpp::build::{self, Address, BindCredentials, BindKind, ShortMessage};
use crate::smpp::frame::{self, DEFAULT_MAX_COMMAND_LENGTH};

/// Upper bound of every wait in these tests.
pub(super) const WAIT: Duration = Duration::from_secs(2);

/// `esme1`/`secret` (4 binds) and `esme2`/`pw2` (1 bind), unthrottled.
pub(super) fn accounts() -> Vec<Account> {
    vec![
        Account {
            system_id: "esme1".into(),
            password: "secret".into(),
            max_binds: 4,
            max_tps: 0,
            allowed_ips: Vec::new(),
            tls_subject: None,
        },
        Account {
            system_id: "esme2".into(),
            password: "pw2".into(),
            max_binds: 1,
            max_tps: 0,
            allowed_ips: Vec::new(),
            tls_subject: None,
        },
    ]
}

pub(super) fn config() -> ServerConfig {
    ServerConfig {
        auth: Default::default(),
        system_id: "sendium".into(),
        max_connections: 16,
        max_unbound: 16,
        max_unbound_per_address: 16,
        max_command_length: DEFAULT_MAX_COMMAND_LENGTH,
        window: 1000,
        bind_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(30),
        deliver_timeout: Duration::from_secs(5),
        accounts: AccountBook::new(&accounts()),
    }
}

/// What the fake handler answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// `Accepted("id-N")`, N counting from 1 over all calls.
    Accept,
    Refuse(u32),
    Panic,
    /// One reply fewer than submits.
    TooFew,
    /// An id longer than 64 characters.
    BadId,
}

pub(super) struct FakeHandler {
    batches: Mutex<Vec<(String, Vec<InboundSubmit>)>>,
    bound: Mutex<Vec<(String, bool)>>,
    /// When set, each call takes (and keeps) one permit before answering.
    gate: Option<Arc<Semaphore>>,
    mode: Mutex<Mode>,
    next_id: AtomicUsize,
}

impl FakeHandler {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self::build(None))
    }

    /// A handler whose calls wait for a permit of the returned semaphore.
    pub(super) fn gated() -> (Arc<Self>, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        (Arc::new(Self::build(Some(gate.clone()))), gate)
    }

    fn build(gate: Option<Arc<Semaphore>>) -> Self {
        FakeHandler {
            batches: Mutex::new(Vec::new()),
            bound: Mutex::new(Vec::new()),
            gate,
            mode: Mutex::new(Mode::Accept),
            next_id: AtomicUsize::new(1),
        }
    }

    pub(super) fn set_mode(&self, mode: Mode) {
        *self.mode.lock() = mode;
    }

    pub(super) fn calls(&self) -> usize {
        self.batches.lock().len()
    }

    pub(super) fn submits(&self) -> Vec<InboundSubmit> {
        self.batches.lock().iter().flat_map(|(_, b)| b.clone()).collect()
    }

    pub(super) fn accounts(&self) -> Vec<String> {
        self.batches.lock().iter().map(|(a, _)| a.clone()).collect()
    }

    pub(super) fn bound_calls(&self) -> Vec<(String, bool)> {
        self.bound.lock().clone()
    }
}

#[async_trait]
impl SubmitHandler for FakeHandler {
    async fn submit(&self, account: &str, batch: Vec<InboundSubmit>) -> Vec<SubmitReply> {
        let len = batch.len();
        self.batches.lock().push((account.to_owned(), batch));
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let mode = *self.mode.lock();
        match mode {
            Mode::Accept => (0..len)
                .map(|_| SubmitReply::Accepted(format!("id-{}", self.next_id.fetch_add(1, Ordering::Relaxed))))
                .collect(),
            Mode::Refuse(status) => vec![SubmitReply::Refused(status); len],
            Mode::Panic => panic!("fake handler panics on purpose"),
            Mode::TooFew => vec![SubmitReply::Accepted("x".into()); len.saturating_sub(1)],
            Mode::BadId => vec![SubmitReply::Accepted("x".repeat(65)); len],
        }
    }

    fn bound(&self, account: &str, can_receive: bool) {
        self.bound.lock().push((account.to_owned(), can_receive));
    }
}

pub(super) struct TestServer {
    pub(super) addr: SocketAddr,
    pub(super) registry: SessionRegistry,
    pub(super) handler: Arc<FakeHandler>,
    pub(super) shutdown: CancellationToken,
    pub(super) task: JoinHandle<std::io::Result<()>>,
}

pub(super) async fn start(config: ServerConfig, handler: Arc<FakeHandler>) -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = SessionRegistry::new();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        Arc::new(config),
        handler.clone(),
        registry.clone(),
        shutdown.clone(),
    ));
    TestServer {
        addr,
        registry,
        handler,
        shutdown,
        task,
    }
}

impl TestServer {
    pub(super) async fn esme(&self) -> Esme {
        Esme::connect(self.addr).await
    }

    /// A connected ESME bound as `kind` with esme1's credentials.
    pub(super) async fn bound(&self, kind: BindKind) -> Esme {
        let mut esme = self.esme().await;
        let resp = esme.bind(kind, "esme1", "secret").await;
        assert_eq!(resp.status(), CommandStatus::EsmeRok);
        esme
    }
}

/// Waits (polling) until `cond` holds, failing after [`WAIT`].
pub(super) async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A raw ESME.
pub(super) struct Esme {
    rd: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    wr: OwnedWriteHalf,
    seq: u32,
}

impl Esme {
    pub(super) async fn connect(addr: SocketAddr) -> Esme {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (rd, wr) = stream.into_split();
        Esme {
            rd: FramedRead::new(rd, frame::codec(DEFAULT_MAX_COMMAND_LENGTH)),
            wr,
            seq: 0,
        }
    }

    pub(super) fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    /// Sends every command with one write.
    pub(super) async fn send_all(&mut self, commands: &[Command]) {
        let mut buf = BytesMut::new();
        for command in commands {
            frame::encode(command, &mut buf);
        }
        self.send_raw(&buf).await;
    }

    pub(super) async fn send(&mut self, command: &Command) {
        self.send_all(std::slice::from_ref(command)).await;
    }

    pub(super) async fn send_raw(&mut self, bytes: &[u8]) {
        self.wr.write_all(bytes).await.unwrap();
    }

    /// The next PDU, or `None` when the server closed the connection.
    pub(super) async fn recv_or_closed(&mut self) -> Option<Command> {
        match tokio::time::timeout(WAIT, self.rd.next()).await {
            Err(_) => panic!("no PDU and no close within {WAIT:?}"),
            Ok(None) | Ok(Some(Err(_))) => None,
            Ok(Some(Ok(bytes))) => Some(frame::decode_frame(bytes).unwrap()),
        }
    }

    pub(super) async fn recv(&mut self) -> Command {
        self.recv_or_closed().await.expect("the server closed the connection")
    }

    /// Asserts the server closes the connection without sending anything more.
    pub(super) async fn expect_closed(&mut self) {
        if let Some(command) = self.recv_or_closed().await {
            panic!("expected the connection to close, got {command:?}");
        }
    }

    pub(super) async fn bind(&mut self, kind: BindKind, system_id: &str, password: &str) -> Command {
        let seq = self.next_seq();
        let creds = BindCredentials {
            system_id,
            password,
            system_type: "",
        };
        self.send(&build::bind(kind, seq, &creds).unwrap()).await;
        let resp = self.recv().await;
        assert_eq!(resp.sequence_number(), seq);
        assert_eq!(BindKind::from_command_id(resp.id()), Some(kind));
        assert!(resp.id().is_response());
        resp
    }

    /// Sends one submit_sm and returns its response.
    pub(super) async fn submit(&mut self, sm: &ShortMessage<'_>) -> Command {
        let seq = self.next_seq();
        self.send(&build::submit_sm(seq, sm).unwrap()).await;
        let resp = self.recv().await;
        assert_eq!(resp.id(), CommandId::SubmitSmResp);
        assert_eq!(resp.sequence_number(), seq);
        resp
    }

    pub(super) async fn enquire_link_works(&mut self) {
        let seq = self.next_seq();
        self.send(&build::enquire_link(seq)).await;
        let resp = self.recv().await;
        assert_eq!((resp.id(), resp.sequence_number()), (CommandId::EnquireLinkResp, seq));
    }
}

/// A plain GSM 7-bit submit to `destination`.
pub(super) fn text(destination: &str, body: &'static [u8]) -> ShortMessage<'static> {
    // Leaked so the helper can hand out 'static messages; a few bytes per test.
    let destination: &'static str = Box::leak(destination.to_owned().into_boxed_str());
    ShortMessage {
        source: Address {
            ton: 5,
            npi: 0,
            addr: "Sendium",
        },
        destination: Address {
            ton: 1,
            npi: 1,
            addr: destination,
        },
        esm_class: 0x00,
        registered_delivery: 1,
        data_coding: 0,
        short_message: body,
        message_payload: None,
        sar: None,
    }
}

/// The message_id of a submit_sm_resp.
pub(super) fn message_id(resp: &Command) -> String {
    match resp.pdu() {
        Some(Pdu::SubmitSmResp(resp)) => resp.message_id().as_str().to_owned(),
        None => String::new(),
        other => panic!("not a submit_sm_resp: {other:?}"),
    }
}

/// Raw PDU bytes: header fields and a body, command_length computed.
pub(super) fn raw_pdu(command_id: u32, status: u32, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(&command_id.to_be_bytes());
    out.extend_from_slice(&status.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(body);
    out
}
