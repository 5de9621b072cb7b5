//! A test ESME: a client of Sendium's SMPP server.
//!
//! ```no_run
//! # async fn demo(addr: std::net::SocketAddr) {
//! use sendium_integration_tests::esme::{SubmitSpec, TestEsme};
//! use sendium_integration_tests::{BindKind, CommandStatus};
//! let esme = TestEsme::bind(addr, "esme1", "secret", BindKind::Transceiver).await.unwrap();
//! let resp = esme.submit(&SubmitSpec::gsm("12345", "447700900123", "hello").dlr()).await.unwrap();
//! assert_eq!(resp.status, CommandStatus::EsmeRok);
//! let receipts = esme.wait_receipts(1, std::time::Duration::from_secs(10)).await;
//! assert_eq!(receipts[0].message_id(), Some(resp.message_id.as_str()));
//! # }
//! ```
//!
//! A background reader answers `enquire_link`, collects `deliver_sm` receipts (answering
//! `deliver_sm_resp` as [`DlrReply`] says), routes responses to the waiting request by
//! sequence number, and queues everything else for [`TestEsme::next_pdu`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use parking_lot::Mutex;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use sendium_protocols::receipt::{ReceiptState, ReceiptText};
use sendium_protocols::smpp::build::{self, Address, BindCredentials, BindKind, BuildError, ShortMessage};
use sendium_protocols::smpp::frame::{self, FrameError, RawHeader};
use sendium_protocols::text::{self, Alphabet};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::util::wait_until;
use crate::wire::{KnownTlvs, split_user_data};

/// How the ESME answers deliver_sm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlrReply {
    /// deliver_sm_resp ESME_ROK.
    Ok,
    /// deliver_sm_resp with this status (the receipt counts as refused).
    Status(CommandStatus),
    /// No deliver_sm_resp at all.
    NoAnswer,
}

/// Options for [`TestEsme::bind_with`].
#[derive(Debug, Clone)]
pub struct EsmeOptions {
    pub system_type: String,
    pub dlr_reply: DlrReply,
    /// How long a request waits for its response.
    pub resp_timeout: Duration,
    /// How long the bind waits for bind_resp.
    pub bind_timeout: Duration,
    /// Answer the server's enquire_link automatically (otherwise it is queued for next_pdu).
    pub answer_enquire_link: bool,
    /// Connect over TLS, trusting what this client trusts.
    pub tls: Option<crate::tls::TlsClient>,
}

impl Default for EsmeOptions {
    fn default() -> Self {
        EsmeOptions {
            system_type: String::new(),
            dlr_reply: DlrReply::Ok,
            resp_timeout: Duration::from_secs(10),
            bind_timeout: Duration::from_secs(10),
            answer_enquire_link: true,
            tls: None,
        }
    }
}

/// Why a bind failed.
#[derive(Debug)]
pub enum BindError {
    /// The server answered with a non-OK status.
    Rejected { status: CommandStatus },
    /// Connecting or writing failed.
    Io(io::Error),
    /// The server closed the connection without answering.
    Closed,
    /// No answer within `bind_timeout`.
    Timeout,
    /// The answer was not the matching bind_resp (e.g. a generic_nack).
    Unexpected(String),
}

impl BindError {
    /// The status a rejected bind was answered with (generic_nack status included).
    pub fn status(&self) -> Option<CommandStatus> {
        match self {
            BindError::Rejected { status } => Some(*status),
            _ => None,
        }
    }
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindError::Rejected { status } => write!(f, "bind rejected with {}", crate::wire::status_name(*status)),
            BindError::Io(e) => write!(f, "bind failed: {e}"),
            BindError::Closed => write!(f, "connection closed before bind_resp"),
            BindError::Timeout => write!(f, "no bind_resp in time"),
            BindError::Unexpected(what) => write!(f, "unexpected answer to bind: {what}"),
        }
    }
}

impl std::error::Error for BindError {}

/// Why a request got no response.
#[derive(Debug)]
pub enum EsmeError {
    Timeout,
    Closed,
    Io(io::Error),
    Build(BuildError),
}

impl fmt::Display for EsmeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EsmeError::Timeout => write!(f, "no response in time"),
            EsmeError::Closed => write!(f, "connection closed"),
            EsmeError::Io(e) => write!(f, "i/o error: {e}"),
            EsmeError::Build(e) => write!(f, "cannot build PDU: {e}"),
        }
    }
}

impl std::error::Error for EsmeError {}

impl From<io::Error> for EsmeError {
    fn from(e: io::Error) -> Self {
        EsmeError::Io(e)
    }
}

impl From<BuildError> for EsmeError {
    fn from(e: BuildError) -> Self {
        EsmeError::Build(e)
    }
}

/// Any PDU the ESME received.
#[derive(Debug, Clone)]
pub struct ReceivedPdu {
    pub header: RawHeader,
    /// The decoded PDU; `None` when it did not decode (see `error`).
    pub command: Option<Command>,
    pub error: Option<FrameError>,
    /// The PDU's bytes, command_length included.
    pub raw: Vec<u8>,
    pub received_at: Instant,
}

impl ReceivedPdu {
    pub fn command_id(&self) -> CommandId {
        CommandId::from(self.header.command_id)
    }

    pub fn status(&self) -> CommandStatus {
        CommandStatus::from(self.header.command_status)
    }

    pub fn sequence_number(&self) -> u32 {
        self.header.sequence_number
    }
}

/// A delivery receipt (deliver_sm with a receipt esm_class) as received.
#[derive(Debug, Clone)]
pub struct Receipt {
    /// `id:` from the text.
    pub id: Option<String>,
    /// `stat:` from the text.
    pub stat: Option<ReceiptState>,
    /// `err:` from the text.
    pub err: Option<String>,
    pub receipted_message_id: Option<String>,
    pub message_state: Option<u8>,
    pub esm_class: u8,
    /// The handset the message went to.
    pub source: String,
    /// The original sender.
    pub destination: String,
    /// The receipt text as received.
    pub text: String,
    pub parsed: Option<ReceiptText>,
    pub sequence_number: u32,
    pub received_at: Instant,
}

impl Receipt {
    /// The id this receipt reports on: the TLV, else the text's `id:`.
    pub fn message_id(&self) -> Option<&str> {
        self.receipted_message_id.as_deref().or(self.id.as_deref())
    }

    /// The state: the text's `stat:`, else the message_state TLV.
    pub fn state(&self) -> Option<ReceiptState> {
        self.stat
            .or_else(|| self.message_state.and_then(ReceiptState::from_message_state))
    }

    fn from_deliver(sm: &rusmpp::pdus::DeliverSm, seq: u32, at: Instant) -> Receipt {
        let tlvs = KnownTlvs::read(sm.tlvs());
        let data: &[u8] = tlvs
            .message_payload
            .as_deref()
            .unwrap_or_else(|| sm.short_message().as_ref());
        let text = String::from_utf8_lossy(data).into_owned();
        let parsed = ReceiptText::parse(&text).ok();
        Receipt {
            id: parsed.as_ref().map(|p| p.id.clone()),
            stat: parsed.as_ref().map(|p| p.stat),
            err: parsed.as_ref().map(|p| p.err.clone()),
            receipted_message_id: tlvs.receipted_message_id,
            message_state: tlvs.message_state,
            esm_class: u8::from(sm.esm_class),
            source: sm.source_addr.as_str().to_owned(),
            destination: sm.destination_addr.as_str().to_owned(),
            text,
            parsed,
            sequence_number: seq,
            received_at: at,
        }
    }
}

/// A mobile-originated deliver_sm (not a receipt).
#[derive(Debug, Clone)]
pub struct MoMessage {
    pub source: String,
    pub destination: String,
    pub esm_class: u8,
    pub data_coding: u8,
    pub text: String,
    pub user_data: Vec<u8>,
}

/// How a multipart message marks its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concat {
    /// UDH with an 8-bit reference (IEI 0x00) — what Kannel sends.
    Udh8(u8),
    /// UDH with a 16-bit reference (IEI 0x08).
    Udh16(u16),
    /// sar_msg_ref_num / sar_total_segments / sar_segment_seqnum TLVs.
    Sar(u16),
}

/// Which parts of a multipart message ask for a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DlrParts {
    None,
    /// Only part 1 (Kannel).
    First,
    Every,
    Last,
}

/// One submit_sm to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitSpec {
    pub source: String,
    pub source_ton: u8,
    pub source_npi: u8,
    pub destination: String,
    pub dest_ton: u8,
    pub dest_npi: u8,
    pub esm_class: u8,
    pub data_coding: u8,
    pub registered_delivery: u8,
    pub short_message: Vec<u8>,
    pub message_payload: Option<Vec<u8>>,
    pub sar: Option<(u16, u8, u8)>,
    /// SMPP time (`YYMMDDhhmmsstnnp`), empty for none.
    pub validity_period: String,
    /// SMPP time, empty for none.
    pub schedule_delivery_time: String,
}

impl SubmitSpec {
    /// An empty GSM message from `source` to `destination` (ton/npi 1/1).
    pub fn new(source: &str, destination: &str) -> SubmitSpec {
        SubmitSpec {
            source: source.to_owned(),
            source_ton: 1,
            source_npi: 1,
            destination: destination.to_owned(),
            dest_ton: 1,
            dest_npi: 1,
            esm_class: 0,
            data_coding: 0,
            registered_delivery: 0,
            short_message: Vec::new(),
            message_payload: None,
            sar: None,
            validity_period: String::new(),
            schedule_delivery_time: String::new(),
        }
    }

    /// `text` in `alphabet`. Panics if the text cannot be encoded (test tooling).
    pub fn encoded(source: &str, destination: &str, alphabet: Alphabet, text: &str) -> SubmitSpec {
        let data = text::encode(alphabet, text).expect("text not representable in the alphabet");
        SubmitSpec {
            data_coding: alphabet.data_coding(),
            short_message: data,
            ..SubmitSpec::new(source, destination)
        }
    }

    /// GSM 7-bit if the text allows it, else UCS2.
    pub fn text(source: &str, destination: &str, text: &str) -> SubmitSpec {
        SubmitSpec::encoded(source, destination, text::best_alphabet(text), text)
    }

    /// GSM 03.38 (data_coding 0, one septet per octet).
    pub fn gsm(source: &str, destination: &str, text: &str) -> SubmitSpec {
        SubmitSpec::encoded(source, destination, Alphabet::Gsm7, text)
    }

    /// UCS2 (data_coding 8).
    pub fn ucs2(source: &str, destination: &str, text: &str) -> SubmitSpec {
        SubmitSpec::encoded(source, destination, Alphabet::Ucs2, text)
    }

    /// Latin-1 (data_coding 3).
    pub fn latin1(source: &str, destination: &str, text: &str) -> SubmitSpec {
        SubmitSpec::encoded(source, destination, Alphabet::Latin1, text)
    }

    /// Raw octets with any data_coding.
    pub fn binary(source: &str, destination: &str, data_coding: u8, data: &[u8]) -> SubmitSpec {
        SubmitSpec {
            data_coding,
            short_message: data.to_vec(),
            ..SubmitSpec::new(source, destination)
        }
    }

    /// The whole text in a message_payload TLV (short_message empty).
    pub fn payload(source: &str, destination: &str, alphabet: Alphabet, text: &str) -> SubmitSpec {
        let mut spec = SubmitSpec::encoded(source, destination, alphabet, text);
        spec.message_payload = Some(std::mem::take(&mut spec.short_message));
        spec
    }

    /// A long text split into parts with the alphabet's standard limits (153/134 octets
    /// per part with an 8-bit UDH, one less with a 16-bit UDH, 160/140 with SAR). Always
    /// marks the parts, even when the text fits in one.
    pub fn multipart(
        source: &str,
        destination: &str,
        alphabet: Alphabet,
        text: &str,
        concat: Concat,
        dlr: DlrParts,
    ) -> Vec<SubmitSpec> {
        let (single, per_part) = text::segment_limits(alphabet);
        let per_part = match concat {
            Concat::Udh8(_) => per_part,
            Concat::Udh16(_) => per_part - 1,
            Concat::Sar(_) => single,
        };
        SubmitSpec::multipart_with_limit(source, destination, alphabet, text, concat, dlr, per_part)
    }

    /// Like [`SubmitSpec::multipart`] with at most `per_part` user-data octets per part
    /// (GSM escapes and UCS2 surrogate pairs are not split).
    pub fn multipart_with_limit(
        source: &str,
        destination: &str,
        alphabet: Alphabet,
        text: &str,
        concat: Concat,
        dlr: DlrParts,
        per_part: usize,
    ) -> Vec<SubmitSpec> {
        let data = text::encode(alphabet, text).expect("text not representable in the alphabet");
        let segments = text::split_with_limits(alphabet, &data, (0, per_part.max(1)));
        let total = u8::try_from(segments.len()).expect("more than 255 parts");
        segments
            .iter()
            .enumerate()
            .map(|(i, segment)| {
                let seq = u8::try_from(i + 1).unwrap_or(u8::MAX);
                let asks = match dlr {
                    DlrParts::None => false,
                    DlrParts::First => seq == 1,
                    DlrParts::Every => true,
                    DlrParts::Last => seq == total,
                };
                let mut spec = SubmitSpec {
                    data_coding: alphabet.data_coding(),
                    registered_delivery: u8::from(asks),
                    ..SubmitSpec::new(source, destination)
                };
                match concat {
                    Concat::Udh8(reference) => {
                        spec.esm_class = 0x40;
                        spec.short_message = text::concat_udh_8bit(reference, total, seq).to_vec();
                    }
                    Concat::Udh16(reference) => {
                        spec.esm_class = 0x40;
                        spec.short_message = text::concat_udh_16bit(reference, total, seq).to_vec();
                    }
                    Concat::Sar(reference) => spec.sar = Some((reference, total, seq)),
                }
                spec.short_message.extend_from_slice(segment);
                spec
            })
            .collect()
    }

    /// Ask for a receipt (registered_delivery 1).
    pub fn dlr(mut self) -> SubmitSpec {
        self.registered_delivery = 1;
        self
    }

    pub fn with_registered_delivery(mut self, registered_delivery: u8) -> SubmitSpec {
        self.registered_delivery = registered_delivery;
        self
    }

    /// Set esm_class (e.g. 0x03 as Kannel does; keep 0x40 when there is a UDH).
    pub fn with_esm_class(mut self, esm_class: u8) -> SubmitSpec {
        self.esm_class = esm_class;
        self
    }

    /// Kannel's esm_class: 0x03 (store and forward), 0x43 with a UDH.
    pub fn kannel_style(mut self) -> SubmitSpec {
        self.esm_class |= 0x03;
        self
    }

    pub fn with_source_ton_npi(mut self, ton: u8, npi: u8) -> SubmitSpec {
        self.source_ton = ton;
        self.source_npi = npi;
        self
    }

    pub fn with_dest_ton_npi(mut self, ton: u8, npi: u8) -> SubmitSpec {
        self.dest_ton = ton;
        self.dest_npi = npi;
        self
    }

    /// The user data after any UDH.
    pub fn user_data(&self) -> &[u8] {
        let data = self.message_payload.as_deref().unwrap_or(&self.short_message);
        let tlvs = KnownTlvs {
            sar_msg_ref_num: self.sar.map(|s| s.0),
            sar_total_segments: self.sar.map(|s| s.1),
            sar_segment_seqnum: self.sar.map(|s| s.2),
            ..KnownTlvs::default()
        };
        split_user_data(self.esm_class, data, &tlvs).1
    }

    /// With this `validity_period` (an SMPP time such as `000000000005000R`: 5 s).
    pub fn with_validity(mut self, validity_period: &str) -> SubmitSpec {
        self.validity_period = validity_period.to_owned();
        self
    }

    /// With this `schedule_delivery_time` (an SMPP time such as `000000010000000R`: in
    /// an hour).
    pub fn with_schedule(mut self, schedule_delivery_time: &str) -> SubmitSpec {
        self.schedule_delivery_time = schedule_delivery_time.to_owned();
        self
    }

    /// The submit_sm PDU with sequence number `seq`.
    pub fn to_command(&self, seq: u32) -> Result<Command, BuildError> {
        let mut command = self.to_command_without_validity(seq)?;
        if (!self.validity_period.is_empty() || !self.schedule_delivery_time.is_empty())
            && let Some(Pdu::SubmitSm(sm)) = command.pdu()
        {
            let time = |t: &String| {
                rusmpp::types::EmptyOrFullCOctetString::from_string(t.clone())
                    .expect("SMPP times are 16 ASCII characters")
            };
            let mut sm = sm.clone();
            if !self.validity_period.is_empty() {
                sm.validity_period = time(&self.validity_period);
            }
            if !self.schedule_delivery_time.is_empty() {
                sm.schedule_delivery_time = time(&self.schedule_delivery_time);
            }
            command.set_pdu(sm);
        }
        Ok(command)
    }

    fn to_command_without_validity(&self, seq: u32) -> Result<Command, BuildError> {
        build::submit_sm(
            seq,
            &ShortMessage {
                source: Address {
                    ton: self.source_ton,
                    npi: self.source_npi,
                    addr: &self.source,
                },
                destination: Address {
                    ton: self.dest_ton,
                    npi: self.dest_npi,
                    addr: &self.destination,
                },
                esm_class: self.esm_class,
                registered_delivery: self.registered_delivery,
                data_coding: self.data_coding,
                short_message: &self.short_message,
                message_payload: self.message_payload.as_deref(),
                sar: self.sar,
            },
        )
    }
}

/// The answer to one submit_sm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitResp {
    pub status: CommandStatus,
    /// Empty when the response had none (errors, generic_nack).
    pub message_id: String,
    /// SubmitSmResp, or GenericNack when the server could not decode the submit.
    pub command_id: CommandId,
}

impl SubmitResp {
    pub fn is_ok(&self) -> bool {
        self.status == CommandStatus::EsmeRok && self.command_id == CommandId::SubmitSmResp
    }

    fn from_pdu(pdu: &ReceivedPdu) -> SubmitResp {
        let message_id = match pdu.command.as_ref().and_then(Command::pdu) {
            Some(Pdu::SubmitSmResp(resp)) => resp.message_id().as_str().to_owned(),
            _ => String::new(),
        };
        SubmitResp {
            status: pdu.status(),
            message_id,
            command_id: pdu.command_id(),
        }
    }
}

/// One pipelined submit's result, in the order of the specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitOutcome {
    /// `None`: no response (timeout or connection closed).
    pub status: Option<CommandStatus>,
    pub message_id: String,
    /// Send to response (ZERO without a response).
    pub latency: Duration,
}

impl SubmitOutcome {
    pub fn is_ok(&self) -> bool {
        self.status == Some(CommandStatus::EsmeRok)
    }
}

enum Waiter {
    Once(oneshot::Sender<ReceivedPdu>),
    Batch(mpsc::UnboundedSender<ReceivedPdu>),
}

/// The socket's halves: plain TCP or TLS.
type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

struct Inner {
    writer: tokio::sync::Mutex<Writer>,
    seq: AtomicU32,
    waiters: Mutex<HashMap<u32, Waiter>>,
    receipts: Mutex<Vec<Receipt>>,
    mo: Mutex<Vec<MoMessage>>,
    unsolicited: Mutex<VecDeque<ReceivedPdu>>,
    notify: Notify,
    closed: AtomicBool,
    dlr_reply: Mutex<DlrReply>,
    options: EsmeOptions,
}

impl Inner {
    fn next_seq(&self) -> u32 {
        loop {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            if seq != 0 && seq < 0x7FFF_FFFF {
                return seq;
            }
            self.seq.store(1, Ordering::Relaxed);
        }
    }

    async fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let mut writer = self.writer.lock().await;
        writer.write_all(bytes).await?;
        writer.flush().await
    }
}

/// A bound ESME session.
pub struct TestEsme {
    inner: Arc<Inner>,
    reader: tokio::task::JoinHandle<()>,
    kind: BindKind,
}

impl fmt::Debug for TestEsme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestEsme")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Drop for TestEsme {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn received(frame: BytesMut, at: Instant) -> ReceivedPdu {
    let raw = frame.to_vec();
    let header = frame::peek_header(&raw).unwrap_or(RawHeader {
        command_length: u32::try_from(raw.len()).unwrap_or(0),
        command_id: 0,
        command_status: 0,
        sequence_number: 0,
    });
    let (command, error) = match frame::decode_frame(frame) {
        Ok(command) => (Some(command), None),
        Err(err) => (None, Some(err)),
    };
    ReceivedPdu {
        header,
        command,
        error,
        raw,
        received_at: at,
    }
}

impl TestEsme {
    /// Connects and binds with default [`EsmeOptions`].
    pub async fn bind(
        addr: SocketAddr,
        system_id: &str,
        password: &str,
        kind: BindKind,
    ) -> Result<TestEsme, BindError> {
        TestEsme::bind_with(addr, system_id, password, kind, EsmeOptions::default()).await
    }

    pub async fn bind_with(
        addr: SocketAddr,
        system_id: &str,
        password: &str,
        kind: BindKind,
        options: EsmeOptions,
    ) -> Result<TestEsme, BindError> {
        let stream = TcpStream::connect(addr).await.map_err(BindError::Io)?;
        let _ = stream.set_nodelay(true);
        let creds = BindCredentials {
            system_id,
            password,
            system_type: &options.system_type,
        };
        let bind = build::bind(kind, 1, &creds).map_err(|e| BindError::Unexpected(e.to_string()))?;
        let bind = crate::wire::encode_to_vec(&bind);
        let (read_half, write_half, frame, rbuf): (Reader, Writer, _, _) = match &options.tls {
            None => {
                let mut stream = stream;
                let (frame, rbuf) = bind_exchange(&mut stream, &bind, options.bind_timeout).await?;
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w), frame, rbuf)
            }
            Some(tls) => {
                let handshake = tokio::time::timeout(options.bind_timeout, tls.handshake(stream));
                let mut stream = handshake
                    .await
                    .map_err(|_| BindError::Timeout)?
                    .map_err(BindError::Io)?;
                let (frame, rbuf) = bind_exchange(&mut stream, &bind, options.bind_timeout).await?;
                let (r, w) = tokio::io::split(stream);
                (Box::new(r), Box::new(w), frame, rbuf)
            }
        };
        let pdu = received(frame, Instant::now());
        let expected = BindKind::from_command_id(pdu.command_id()) == Some(kind) && pdu.command_id().is_response();
        if pdu.status() != CommandStatus::EsmeRok && (expected || pdu.command_id() == CommandId::GenericNack) {
            return Err(BindError::Rejected { status: pdu.status() });
        }
        if !expected {
            return Err(BindError::Unexpected(format!("{:?}", pdu.command_id())));
        }

        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(write_half),
            seq: AtomicU32::new(2),
            waiters: Mutex::new(HashMap::new()),
            receipts: Mutex::new(Vec::new()),
            mo: Mutex::new(Vec::new()),
            unsolicited: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            closed: AtomicBool::new(false),
            dlr_reply: Mutex::new(options.dlr_reply),
            options,
        });
        let reader = tokio::spawn(read_loop(inner.clone(), read_half, rbuf));
        Ok(TestEsme { inner, reader, kind })
    }

    pub fn kind(&self) -> BindKind {
        self.kind
    }

    /// A fresh sequence number (for hand-built PDUs).
    pub fn next_seq(&self) -> u32 {
        self.inner.next_seq()
    }

    /// Changes how later deliver_sm are answered.
    pub fn set_dlr_reply(&self, reply: DlrReply) {
        *self.inner.dlr_reply.lock() = reply;
    }

    /// Sends a request and waits for the response with its sequence number (or a
    /// generic_nack carrying it). The command's sequence number is used as is.
    pub async fn request(&self, command: &Command) -> Result<ReceivedPdu, EsmeError> {
        let seq = command.sequence_number();
        let (tx, rx) = oneshot::channel();
        self.inner.waiters.lock().insert(seq, Waiter::Once(tx));
        if self.inner.closed.load(Ordering::Acquire) {
            self.inner.waiters.lock().remove(&seq);
            return Err(EsmeError::Closed);
        }
        if let Err(e) = self.inner.write(&crate::wire::encode_to_vec(command)).await {
            self.inner.waiters.lock().remove(&seq);
            return Err(EsmeError::Io(e));
        }
        match tokio::time::timeout(self.inner.options.resp_timeout, rx).await {
            Ok(Ok(pdu)) => Ok(pdu),
            Ok(Err(_)) => Err(EsmeError::Closed),
            Err(_) => {
                self.inner.waiters.lock().remove(&seq);
                Err(EsmeError::Timeout)
            }
        }
    }

    /// Submits one message and waits for its submit_sm_resp.
    pub async fn submit(&self, spec: &SubmitSpec) -> Result<SubmitResp, EsmeError> {
        let command = spec.to_command(self.next_seq())?;
        let pdu = self.request(&command).await?;
        Ok(SubmitResp::from_pdu(&pdu))
    }

    /// Submits each spec in turn (e.g. the parts of a multipart message).
    pub async fn submit_all(&self, specs: &[SubmitSpec]) -> Result<Vec<SubmitResp>, EsmeError> {
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            out.push(self.submit(spec).await?);
        }
        Ok(out)
    }

    /// Submits every spec keeping up to `window` outstanding; PDUs that fit in the window
    /// together are written with one write. A submit unanswered within `resp_timeout` of
    /// the last progress ends the run (it and the unsent rest get `status: None`).
    pub async fn submit_pipelined(&self, specs: &[SubmitSpec], window: usize) -> Vec<SubmitOutcome> {
        let window = window.max(1);
        let mut outcomes: Vec<SubmitOutcome> = specs
            .iter()
            .map(|_| SubmitOutcome {
                status: None,
                message_id: String::new(),
                latency: Duration::ZERO,
            })
            .collect();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut in_flight: HashMap<u32, (usize, Instant)> = HashMap::new();
        let mut next = 0;
        loop {
            if next < specs.len() && in_flight.len() < window && !self.is_closed() {
                let mut buf = BytesMut::new();
                let mut seqs = Vec::new();
                while next < specs.len() && in_flight.len() + seqs.len() < window {
                    let seq = self.next_seq();
                    match specs[next].to_command(seq) {
                        Ok(command) => {
                            frame::encode(&command, &mut buf);
                            seqs.push((seq, next));
                        }
                        Err(_) => outcomes[next].status = Some(CommandStatus::EsmeRsyserr),
                    }
                    next += 1;
                }
                {
                    let mut waiters = self.inner.waiters.lock();
                    for (seq, _) in &seqs {
                        waiters.insert(*seq, Waiter::Batch(tx.clone()));
                    }
                }
                let sent_at = Instant::now();
                if self.inner.write(&buf).await.is_err() {
                    let mut waiters = self.inner.waiters.lock();
                    for (seq, _) in &seqs {
                        waiters.remove(seq);
                    }
                    break;
                }
                for (seq, index) in seqs {
                    in_flight.insert(seq, (index, sent_at));
                }
            }
            if in_flight.is_empty() {
                if next >= specs.len() || self.is_closed() {
                    break;
                }
                continue;
            }
            let first = tokio::select! {
                pdu = rx.recv() => pdu,
                // Returns on close or after resp_timeout without any response.
                _ = self.wait_closed(self.inner.options.resp_timeout) => None,
            };
            let stop = first.is_none();
            for pdu in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                if let Some((index, sent_at)) = in_flight.remove(&pdu.sequence_number()) {
                    let resp = SubmitResp::from_pdu(&pdu);
                    outcomes[index] = SubmitOutcome {
                        status: Some(resp.status),
                        message_id: resp.message_id,
                        latency: pdu.received_at.saturating_duration_since(sent_at),
                    };
                }
            }
            if stop {
                break;
            }
        }
        let mut waiters = self.inner.waiters.lock();
        for seq in in_flight.keys() {
            waiters.remove(seq);
        }
        outcomes
    }

    /// Every receipt received so far.
    pub fn receipts(&self) -> Vec<Receipt> {
        self.inner.receipts.lock().clone()
    }

    /// How many mobile-originated deliver_sm were received so far.
    pub fn mo_count(&self) -> usize {
        self.inner.mo.lock().len()
    }

    /// Mobile-originated deliver_sm received so far.
    pub fn mo_messages(&self) -> Vec<MoMessage> {
        self.inner.mo.lock().clone()
    }

    /// Waits until at least `n` receipts arrived (or `timeout`), returns all received.
    pub async fn wait_receipts(&self, n: usize, timeout: Duration) -> Vec<Receipt> {
        wait_until(&self.inner.notify, timeout, || self.inner.receipts.lock().len() >= n).await;
        self.receipts()
    }

    /// Writes raw bytes (any framing, valid or not).
    pub async fn send_raw(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.write(bytes).await
    }

    /// Writes a PDU without waiting for any response.
    pub async fn send_command(&self, command: &Command) -> io::Result<()> {
        self.inner.write(&crate::wire::encode_to_vec(command)).await
    }

    /// The next PDU no request was waiting for (responses to raw sends, generic_nack,
    /// unbind, outbind …; not receipts, not auto-answered enquire_link).
    pub async fn next_pdu(&self, timeout: Duration) -> Option<ReceivedPdu> {
        let mut out = None;
        wait_until(&self.inner.notify, timeout, || {
            out = self.inner.unsolicited.lock().pop_front();
            out.is_some()
        })
        .await;
        out
    }

    /// True once the server closed the connection (or it failed).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    pub async fn wait_closed(&self, timeout: Duration) -> bool {
        wait_until(&self.inner.notify, timeout, || self.is_closed()).await
    }

    pub async fn enquire_link(&self) -> Result<CommandStatus, EsmeError> {
        let pdu = self.request(&build::enquire_link(self.next_seq())).await?;
        Ok(pdu.status())
    }

    /// Sends unbind and waits for unbind_resp.
    pub async fn unbind(&self) -> Result<CommandStatus, EsmeError> {
        let pdu = self.request(&build::unbind(self.next_seq())).await?;
        Ok(pdu.status())
    }

    /// Closes the TCP connection without unbinding.
    pub async fn close(self) {
        let _ = self.inner.writer.lock().await.shutdown().await;
        self.reader.abort();
    }
}

/// Writes the bind and reads until the first whole PDU (its answer): that frame, and
/// whatever arrived after it.
async fn bind_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    bind: &[u8],
    timeout: Duration,
) -> Result<(BytesMut, BytesMut), BindError> {
    stream.write_all(bind).await.map_err(BindError::Io)?;
    stream.flush().await.map_err(BindError::Io)?;
    let mut codec = frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH);
    let mut rbuf = BytesMut::with_capacity(64 * 1024);
    tokio::time::timeout(timeout, async {
        loop {
            match tokio_util::codec::Decoder::decode(&mut codec, &mut rbuf) {
                Ok(Some(frame)) => return Ok((frame, rbuf)),
                Ok(None) => {}
                Err(e) => return Err(BindError::Io(e)),
            }
            rbuf.reserve(64 * 1024);
            match stream.read_buf(&mut rbuf).await {
                Ok(0) => return Err(BindError::Closed),
                Ok(_) => {}
                Err(e) => return Err(BindError::Io(e)),
            }
        }
    })
    .await
    .map_err(|_| BindError::Timeout)?
}

async fn read_loop(inner: Arc<Inner>, mut read_half: Reader, mut rbuf: BytesMut) {
    let mut codec = frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH);
    loop {
        let now = Instant::now();
        let mut replies = BytesMut::new();
        let mut broken = false;
        loop {
            match tokio_util::codec::Decoder::decode(&mut codec, &mut rbuf) {
                Ok(Some(frame)) => {
                    let empty = frame.is_empty();
                    handle_pdu(&inner, received(frame, now), &mut replies);
                    if empty {
                        broken = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if !replies.is_empty() && inner.write(&replies).await.is_err() {
            broken = true;
        }
        inner.notify.notify_waiters();
        if broken {
            break;
        }
        rbuf.reserve(64 * 1024);
        match read_half.read_buf(&mut rbuf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    inner.closed.store(true, Ordering::Release);
    // Dropping the senders wakes every waiting request with "closed".
    inner.waiters.lock().clear();
    inner.notify.notify_waiters();
}

fn handle_pdu(inner: &Inner, pdu: ReceivedPdu, replies: &mut BytesMut) {
    let id = pdu.command_id();
    if id.is_response() {
        let waiter = inner.waiters.lock().remove(&pdu.sequence_number());
        match waiter {
            Some(Waiter::Once(tx)) => {
                let _ = tx.send(pdu);
            }
            Some(Waiter::Batch(tx)) => {
                let _ = tx.send(pdu);
            }
            None => inner.unsolicited.lock().push_back(pdu),
        }
        return;
    }
    match pdu.command.as_ref().and_then(Command::pdu) {
        Some(Pdu::DeliverSm(sm)) => {
            let seq = pdu.sequence_number();
            let esm_class = u8::from(sm.esm_class);
            if esm_class & 0x3C != 0 {
                inner
                    .receipts
                    .lock()
                    .push(Receipt::from_deliver(sm, seq, pdu.received_at));
            } else {
                let tlvs = KnownTlvs::read(sm.tlvs());
                let data: &[u8] = tlvs
                    .message_payload
                    .as_deref()
                    .unwrap_or_else(|| sm.short_message().as_ref());
                let data_coding = u8::from(sm.data_coding);
                let (_, user_data) = split_user_data(esm_class, data, &tlvs);
                inner.mo.lock().push(MoMessage {
                    source: sm.source_addr.as_str().to_owned(),
                    destination: sm.destination_addr.as_str().to_owned(),
                    esm_class,
                    data_coding,
                    text: text::decode(data_coding, user_data).unwrap_or_default(),
                    user_data: user_data.to_vec(),
                });
                inner.unsolicited.lock().push_back(pdu.clone());
            }
            match *inner.dlr_reply.lock() {
                DlrReply::Ok => frame::encode(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok), replies),
                DlrReply::Status(status) => frame::encode(&build::deliver_sm_resp(seq, status), replies),
                DlrReply::NoAnswer => {}
            }
        }
        Some(Pdu::EnquireLink) if inner.options.answer_enquire_link => {
            frame::encode(&build::enquire_link_resp(pdu.sequence_number()), replies);
        }
        Some(Pdu::Unbind) => {
            frame::encode(&build::unbind_resp(pdu.sequence_number()), replies);
            inner.unsolicited.lock().push_back(pdu);
        }
        _ => inner.unsolicited.lock().push_back(pdu),
    }
}
