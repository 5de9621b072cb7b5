//! A test SMSC: the upstream provider Sendium's destinations bind to.
//!
//! ```no_run
//! # async fn demo() {
//! use sendium_integration_tests::smsc::{SmscConfig, TestSmsc, IdStyle};
//! let smsc = TestSmsc::start(SmscConfig {
//!     id_style: IdStyle::Hex,
//!     receipt_id_style: Some(IdStyle::Decimal), // the classic hex/decimal mismatch
//!     ..SmscConfig::default()
//! })
//! .await;
//! // … point a `[[destinations]]` entry at smsc.port() …
//! assert!(smsc.wait_messages(1, std::time::Duration::from_secs(10)).await);
//! assert_eq!(smsc.messages()[0].text, "hello");
//! # }
//! ```
//!
//! What it does:
//!
//! - accepts `bind_transmitter|receiver|transceiver` for the configured accounts (any
//!   wrong credential → `ESME_RINVPASWD`, then the connection is closed);
//! - answers `submit_sm` with a fresh id in the configured [`IdStyle`] and records every
//!   submit ([`SubmitRecord`]); reassembles UDH (8/16-bit) and SAR multipart messages per
//!   (source, destination, reference) into [`SmscMessage`]s with decoded text;
//! - for `registered_delivery & 0x03 == 1` (or `== 2` and a failure outcome) sends a
//!   `deliver_sm` receipt (esm_class 0x04, Appendix B text, plus the
//!   `receipted_message_id`/`message_state` TLVs unless `receipt_tlvs` is off) after
//!   `receipt_delay`, to a bound receiver/transceiver session of the **same system_id**
//!   (round robin). With none bound, receipts are held until one binds. Receipts a session
//!   did not acknowledge before closing are held and resent on the next bind; receipts
//!   answered with an error status are sent again after 500 ms;
//! - injects faults at run time through [`TestSmsc::faults`].
//!
//! Performance: each session wake-up drains the socket, handles every PDU, appends all
//! answers to one buffer and writes it once; the batch's records are stored under one lock
//! and its receipts scheduled as one timer entry. Set `record: false` for benchmarks
//! (statistics and reassembly counters only, no per-submit storage).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use sendium_protocols::receipt::{ReceiptState, ReceiptText, format_date, text_excerpt};
use sendium_protocols::smpp::build::{self, Address, BindKind, ReceiptTlvs, ShortMessage};
use sendium_protocols::smpp::frame;
use sendium_protocols::text;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{Notify, mpsc, watch};

use crate::util::{unix_micros, unix_now, wait_until};
use crate::wire::{ConcatRef, Conn, KnownTlvs, PartInfo, split_user_data};

/// How message ids are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdStyle {
    /// Upper-case hexadecimal, e.g. `1A2B3C`.
    Hex,
    /// Lower-case hexadecimal, e.g. `1a2b3c`.
    HexLower,
    /// Decimal, e.g. `1715004`.
    Decimal,
    /// A UUID-looking string, e.g. `5f1c2a3b-0d4e-4a6f-8000-00000000002a`.
    Uuid,
}

impl IdStyle {
    /// Writes id number `n` in this style (`salt` varies the UUID per SMSC instance).
    pub fn format(self, n: u64, salt: u64) -> String {
        match self {
            IdStyle::Hex => format!("{n:X}"),
            IdStyle::HexLower => format!("{n:x}"),
            IdStyle::Decimal => n.to_string(),
            IdStyle::Uuid => format!(
                "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                (salt >> 32) & 0xFFFF_FFFF,
                (salt >> 16) & 0xFFFF,
                salt & 0xFFF,
                0x8000 | ((n >> 48) & 0x3FFF),
                n & 0xFFFF_FFFF_FFFF
            ),
        }
    }

    /// `hex`, `hexlower`, `dec`/`decimal`, `uuid` (for command lines).
    pub fn parse(s: &str) -> Option<IdStyle> {
        match s.to_ascii_lowercase().as_str() {
            "hex" => Some(IdStyle::Hex),
            "hexlower" | "hex-lower" => Some(IdStyle::HexLower),
            "dec" | "decimal" => Some(IdStyle::Decimal),
            "uuid" => Some(IdStyle::Uuid),
            _ => None,
        }
    }
}

/// Credentials the SMSC accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmscAccount {
    pub system_id: String,
    pub password: String,
}

impl SmscAccount {
    pub fn new(system_id: &str, password: &str) -> SmscAccount {
        SmscAccount {
            system_id: system_id.to_owned(),
            password: password.to_owned(),
        }
    }
}

/// Which destination numbers a [`ReceiptRule`] applies to.
#[derive(Clone)]
pub enum DestMatch {
    Any,
    Prefix(String),
    Suffix(String),
    Exact(String),
    /// Any predicate on the destination address.
    Func(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl DestMatch {
    pub fn matches(&self, destination: &str) -> bool {
        match self {
            DestMatch::Any => true,
            DestMatch::Prefix(p) => destination.starts_with(p.as_str()),
            DestMatch::Suffix(s) => destination.ends_with(s.as_str()),
            DestMatch::Exact(e) => destination == e,
            DestMatch::Func(f) => f(destination),
        }
    }
}

impl fmt::Debug for DestMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DestMatch::Any => write!(f, "Any"),
            DestMatch::Prefix(p) => write!(f, "Prefix({p:?})"),
            DestMatch::Suffix(s) => write!(f, "Suffix({s:?})"),
            DestMatch::Exact(e) => write!(f, "Exact({e:?})"),
            DestMatch::Func(_) => write!(f, "Func(..)"),
        }
    }
}

/// What receipts a submit gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptOutcome {
    /// One receipt with this state and `err:` value.
    Receipt { state: ReceiptState, err: String },
    /// Several receipts in this order (e.g. ACCEPTD then DELIVRD), in one batch; with
    /// several receivers bound, round robin may spread them over sessions.
    Sequence(Vec<(ReceiptState, String)>),
    /// No receipt at all (to test receipt expiry).
    NoReceipt,
    /// Several receipts in this order, each `gap` after the one before (the first after
    /// the receipt delay): an intermediate receipt, then the final one a while later.
    Spaced {
        receipts: Vec<(ReceiptState, String)>,
        gap: Duration,
    },
}

impl ReceiptOutcome {
    fn receipts(&self) -> Vec<(ReceiptState, String)> {
        match self {
            ReceiptOutcome::Receipt { state, err } => vec![(*state, err.clone())],
            ReceiptOutcome::Sequence(list) | ReceiptOutcome::Spaced { receipts: list, .. } => list.clone(),
            ReceiptOutcome::NoReceipt => Vec::new(),
        }
    }

    /// How long after the one before each receipt is sent.
    fn gap(&self) -> Duration {
        match self {
            ReceiptOutcome::Spaced { gap, .. } => *gap,
            _ => Duration::ZERO,
        }
    }
}

/// A receipt rule: the first rule whose destination matches decides; without a match the
/// receipt is `DELIVRD err:000`.
#[derive(Debug, Clone)]
pub struct ReceiptRule {
    pub dest: DestMatch,
    pub outcome: ReceiptOutcome,
}

impl ReceiptRule {
    /// Destinations ending in `suffix` get one receipt with `state` and `err`
    /// (e.g. `ReceiptRule::dest_suffix("13", ReceiptState::Undeliverable, "001")`).
    pub fn dest_suffix(suffix: &str, state: ReceiptState, err: &str) -> ReceiptRule {
        ReceiptRule {
            dest: DestMatch::Suffix(suffix.to_owned()),
            outcome: ReceiptOutcome::Receipt {
                state,
                err: err.to_owned(),
            },
        }
    }

    /// Destinations starting with `prefix` get one receipt with `state` and `err`.
    pub fn dest_prefix(prefix: &str, state: ReceiptState, err: &str) -> ReceiptRule {
        ReceiptRule {
            dest: DestMatch::Prefix(prefix.to_owned()),
            outcome: ReceiptOutcome::Receipt {
                state,
                err: err.to_owned(),
            },
        }
    }

    /// Destinations matching `dest` get no receipt.
    pub fn no_receipt(dest: DestMatch) -> ReceiptRule {
        ReceiptRule {
            dest,
            outcome: ReceiptOutcome::NoReceipt,
        }
    }
}

/// Configuration of a [`TestSmsc`].
#[derive(Debug, Clone)]
pub struct SmscConfig {
    /// 0: any free port. A fixed port lets a restarted SMSC be found again (the listener
    /// uses SO_REUSEADDR, and binding retries for 5 s while the port is still in use).
    pub port: u16,
    /// The system_id in our bind responses.
    pub system_id: String,
    /// Accepted credentials; empty accepts anything.
    pub accounts: Vec<SmscAccount>,
    /// Style of the ids in submit_sm_resp (and in the receipt TLV).
    pub id_style: IdStyle,
    /// Style of the id in the receipt *text*; `None`: same as `id_style`. The number is the
    /// same, so `Hex` + `Some(Decimal)` gives resp `A1B2C3` and receipt `id:10597059`
    /// (ignored when `id_style` is `Uuid`). The receipted_message_id TLV always carries
    /// the resp id; turn `receipt_tlvs` off to leave only the mismatching text id.
    pub receipt_id_style: Option<IdStyle>,
    /// First id number; `None`: derived from the clock, so a restarted SMSC does not
    /// reuse ids.
    pub id_start: Option<u64>,
    /// Delay between the submit_sm_resp and its receipt (changeable at run time).
    pub receipt_delay: Duration,
    /// Add the receipted_message_id and message_state TLVs to receipts.
    pub receipt_tlvs: bool,
    /// Put the first 20 characters of the message (non-ASCII as `?`) in `text:`.
    pub receipt_text: bool,
    /// Receipt rules (changeable at run time), see [`ReceiptRule`].
    pub receipt_rules: Vec<ReceiptRule>,
    /// Keep every submit and completed message (tests). Off: counters only (benchmarks).
    pub record: bool,
}

impl Default for SmscConfig {
    fn default() -> Self {
        SmscConfig {
            port: 0,
            system_id: "testsmsc".to_owned(),
            accounts: vec![SmscAccount::new("sendium", "pw")],
            id_style: IdStyle::Hex,
            receipt_id_style: None,
            id_start: None,
            receipt_delay: Duration::from_millis(20),
            receipt_tlvs: true,
            receipt_text: true,
            receipt_rules: Vec::new(),
            record: true,
        }
    }
}

/// One submit_sm as received.
#[derive(Debug, Clone)]
pub struct SubmitRecord {
    /// Connection number (1, 2, …) in accept order.
    pub session: u64,
    /// The session's bound system_id ("" when it was not bound).
    pub system_id: String,
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
    /// sar_msg_ref_num, sar_total_segments, sar_segment_seqnum.
    pub sar: Option<(u16, u8, u8)>,
    /// Concatenation info (UDH or SAR).
    pub part: Option<PartInfo>,
    /// `schedule_delivery_time` as sent ("" for at once).
    pub schedule_delivery_time: String,
    pub sequence_number: u32,
    /// The status we answered with; `None`: not answered (stop-answering / drop faults).
    pub status: Option<CommandStatus>,
    /// The id we returned (`Some` only with `ESME_ROK`).
    pub message_id: Option<String>,
    pub arrived_at: Instant,
}

impl SubmitRecord {
    /// The user data (after any UDH; message_payload when that was used).
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

    /// This part's text, decoded by data_coding.
    pub fn text(&self) -> Result<String, text::TextError> {
        text::decode(self.data_coding, self.user_data())
    }

    pub fn is_accepted(&self) -> bool {
        self.status == Some(CommandStatus::EsmeRok)
    }
}

/// A complete message: a single submit or every part of a multipart group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmscMessage {
    pub system_id: String,
    pub source: String,
    pub destination: String,
    /// Decoded text of all parts (`<undecodable …>` when data_coding is not text).
    pub text: String,
    /// Concatenated user data.
    pub user_data: Vec<u8>,
    pub data_coding: u8,
    /// Number of parts (1 for a single submit).
    pub parts: u8,
    pub reference: Option<ConcatRef>,
    /// The id returned for each part, in part order.
    pub message_ids: Vec<String>,
    /// registered_delivery of each part, in part order.
    pub registered_delivery: Vec<u8>,
    pub first_arrival: Instant,
    pub completed_at: Instant,
}

/// The same text reached the same destination more than once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub destination: String,
    pub text: String,
    pub count: usize,
}

/// A bound session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundSession {
    pub session: u64,
    pub system_id: String,
    pub kind: BindKind,
}

/// Counters (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmscStats {
    /// Connections open now.
    pub connections: u64,
    pub binds: u64,
    pub bind_failures: u64,
    /// Every submit_sm received.
    pub submits: u64,
    /// Answered ESME_ROK.
    pub accepted: u64,
    /// Answered with an error other than ESME_RTHROTTLED.
    pub rejected: u64,
    pub throttled: u64,
    /// Not answered (stop-answering / drop-connection faults).
    pub unanswered: u64,
    /// deliver_sm receipts written (resends included).
    pub receipts_sent: u64,
    /// deliver_sm_resp ESME_ROK received.
    pub receipts_acked: u64,
    /// deliver_sm_resp with an error status received.
    pub receipts_nacked: u64,
    /// Receipts waiting for a receiver to bind.
    pub receipts_held: u64,
    /// Complete messages (single submits and reassembled groups).
    pub messages_completed: u64,
    /// Completed messages whose (destination, text) had been seen before (record mode).
    pub duplicate_messages: u64,
    pub generic_nacks_sent: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    binds: AtomicU64,
    bind_failures: AtomicU64,
    submits: AtomicU64,
    accepted: AtomicU64,
    rejected: AtomicU64,
    throttled: AtomicU64,
    unanswered: AtomicU64,
    receipts_sent: AtomicU64,
    receipts_acked: AtomicU64,
    receipts_nacked: AtomicU64,
    messages_completed: AtomicU64,
    duplicate_messages: AtomicU64,
    generic_nacks_sent: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Run-time fault switches. All take effect for the next PDU.
#[derive(Debug)]
pub struct Faults {
    epoch: Instant,
    throttle_every: AtomicU64,
    throttle_until_us: AtomicU64,
    reject_active: AtomicBool,
    reject: Mutex<Vec<(String, CommandStatus)>>,
    drop_after: AtomicI64,
    stop_answering: AtomicBool,
    response_delay_us: AtomicU64,
    bind_reject: Mutex<Option<CommandStatus>>,
    counter: AtomicU64,
}

impl Faults {
    fn new() -> Faults {
        Faults {
            epoch: Instant::now(),
            throttle_every: AtomicU64::new(0),
            throttle_until_us: AtomicU64::new(0),
            reject_active: AtomicBool::new(false),
            reject: Mutex::new(Vec::new()),
            drop_after: AtomicI64::new(-1),
            stop_answering: AtomicBool::new(false),
            response_delay_us: AtomicU64::new(0),
            bind_reject: Mutex::new(None),
            counter: AtomicU64::new(0),
        }
    }

    /// Answer ESME_RTHROTTLED to every `n`-th submit from now on (0: off).
    pub fn throttle_every(&self, n: u64) {
        self.counter.store(0, Ordering::Relaxed);
        self.throttle_every.store(n, Ordering::Relaxed);
    }

    /// Answer ESME_RTHROTTLED to every submit for `period`.
    pub fn throttle_all_for(&self, period: Duration) {
        let until = self.epoch.elapsed() + period;
        let micros = u64::try_from(until.as_micros()).unwrap_or(u64::MAX);
        self.throttle_until_us.store(micros, Ordering::Relaxed);
    }

    /// Ends both throttling modes.
    pub fn stop_throttling(&self) {
        self.throttle_every.store(0, Ordering::Relaxed);
        self.throttle_until_us.store(0, Ordering::Relaxed);
    }

    /// Answer `status` (e.g. ESME_RINVDSTADR) to submits whose destination starts with
    /// `prefix` ("" matches every number). Rules are checked in the order added.
    pub fn reject_prefix(&self, prefix: &str, status: CommandStatus) {
        self.reject.lock().push((prefix.to_owned(), status));
        self.reject_active.store(true, Ordering::Release);
    }

    pub fn clear_rejects(&self) {
        self.reject.lock().clear();
        self.reject_active.store(false, Ordering::Release);
    }

    /// Answer the next `n` submits normally, then close the connection that receives the
    /// one after them without answering it (or anything after it in the same read).
    /// `n = 0`: the very next submit. Fires once.
    pub fn drop_connection_after(&self, n: u64) {
        self.drop_after
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// Stop (true) or resume (false) answering submits; unanswered submits are recorded
    /// with `status: None` and get no receipt.
    pub fn stop_answering(&self, on: bool) {
        self.stop_answering.store(on, Ordering::Relaxed);
    }

    /// Delay every write that carries submit_sm responses by `delay` (ZERO: off).
    pub fn delay_responses(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.response_delay_us.store(micros, Ordering::Relaxed);
    }

    /// Refuse every bind with `status` (`None`: accept again).
    pub fn reject_binds(&self, status: Option<CommandStatus>) {
        *self.bind_reject.lock() = status;
    }

    /// Switches every fault off.
    pub fn clear(&self) {
        self.stop_throttling();
        self.clear_rejects();
        self.drop_after.store(-1, Ordering::Relaxed);
        self.stop_answering(false);
        self.delay_responses(Duration::ZERO);
        self.reject_binds(None);
    }

    fn response_delay(&self) -> Option<Duration> {
        match self.response_delay_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// True when this submit must close the connection unanswered.
    fn take_drop(&self) -> bool {
        let mut current = self.drop_after.load(Ordering::Relaxed);
        loop {
            if current < 0 {
                return false;
            }
            let next = current - 1;
            match self
                .drop_after
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return current == 0,
                Err(actual) => current = actual,
            }
        }
    }

    /// The status for an answerable submit to `destination`.
    fn submit_status(&self, destination: &str) -> CommandStatus {
        let until = self.throttle_until_us.load(Ordering::Relaxed);
        if until > 0 && u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX) < until {
            return CommandStatus::EsmeRthrottled;
        }
        let every = self.throttle_every.load(Ordering::Relaxed);
        if every > 0 {
            let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(every) {
                return CommandStatus::EsmeRthrottled;
            }
        }
        if self.reject_active.load(Ordering::Acquire) {
            let rules = self.reject.lock();
            if let Some((_, status)) = rules.iter().find(|(p, _)| destination.starts_with(p.as_str())) {
                return *status;
            }
        }
        CommandStatus::EsmeRok
    }
}

/// A receipt waiting to be sent (or re-sent).
/// How long after a refused deliver_sm_resp a receipt is sent again.
const RECEIPT_RETRY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
struct PendingReceipt {
    /// Set for a mobile-originated message instead of a receipt.
    mo: Option<Arc<MoSpec>>,
    system_id: Arc<str>,
    resp_id: String,
    text_id: String,
    source: (u8, u8, String),
    destination: (u8, u8, String),
    state: ReceiptState,
    err: String,
    submit_unix: i64,
    /// The `done date`, set when the receipt is first sent: a resend is the same receipt.
    done_unix: Option<i64>,
    excerpt: String,
    /// Sent this long after the receipt delay (see [`ReceiptOutcome::Spaced`]).
    after: Duration,
}

type ReceiptTx = mpsc::UnboundedSender<Vec<PendingReceipt>>;

#[derive(Default)]
struct Receivers {
    sessions: HashMap<Arc<str>, Vec<(u64, ReceiptTx)>>,
    round_robin: HashMap<Arc<str>, usize>,
    held: HashMap<Arc<str>, VecDeque<PendingReceipt>>,
    bound: HashMap<u64, (String, BindKind)>,
}

impl Receivers {
    fn pick(&mut self, system_id: &Arc<str>) -> Option<(u64, ReceiptTx)> {
        let sessions = self.sessions.get(system_id).filter(|s| !s.is_empty())?;
        let rr = self.round_robin.entry(system_id.clone()).or_insert(0);
        let (id, tx) = &sessions[*rr % sessions.len()];
        *rr = rr.wrapping_add(1);
        Some((*id, tx.clone()))
    }

    fn hold(&mut self, receipts: impl IntoIterator<Item = PendingReceipt>) {
        for r in receipts {
            self.held.entry(r.system_id.clone()).or_default().push_back(r);
        }
    }

    fn held_count(&self) -> usize {
        self.held.values().map(VecDeque::len).sum()
    }
}

struct GroupPart {
    user_data: Vec<u8>,
    message_id: String,
    registered_delivery: u8,
}

struct Group {
    total: u8,
    parts: Vec<Option<GroupPart>>,
    received: usize,
    data_coding: u8,
    system_id: String,
    first_arrival: Instant,
}

#[derive(Default)]
struct Recorder {
    submits: Vec<SubmitRecord>,
    groups: HashMap<(String, String, ConcatRef), Group>,
    messages: Vec<SmscMessage>,
    seen: HashMap<(String, String), usize>,
}

struct Shared {
    config: SmscConfig,
    faults: Faults,
    salt: u64,
    next_id: AtomicU64,
    next_session: AtomicU64,
    receipt_delay_us: AtomicU64,
    rules_active: AtomicBool,
    rules: Mutex<Vec<ReceiptRule>>,
    counters: Counters,
    recorder: Mutex<Recorder>,
    receivers: Mutex<Receivers>,
    /// deliver_sm_resp statuses of mobile-originated messages, by tag, in arrival order.
    mo_answers: Mutex<Vec<(String, u32)>>,
    sched_tx: mpsc::UnboundedSender<(Instant, Vec<PendingReceipt>)>,
    notify: Notify,
    shutdown: watch::Sender<bool>,
    kick: watch::Sender<u64>,
}

impl Shared {
    fn receipt_delay(&self) -> Duration {
        Duration::from_micros(self.receipt_delay_us.load(Ordering::Relaxed))
    }

    /// The receipts a message to `destination` gets, and the gap between them.
    fn outcome_for(&self, destination: &str) -> (Vec<(ReceiptState, String)>, Duration) {
        if self.rules_active.load(Ordering::Acquire) {
            let rules = self.rules.lock();
            if let Some(rule) = rules.iter().find(|r| r.dest.matches(destination)) {
                return (rule.outcome.receipts(), rule.outcome.gap());
            }
        }
        (vec![(ReceiptState::Delivered, "000".to_owned())], Duration::ZERO)
    }

    /// Hands receipts to bound receivers (one channel message per session) or holds them.
    fn dispatch(&self, receipts: Vec<PendingReceipt>) {
        if receipts.is_empty() {
            return;
        }
        let mut receivers = self.receivers.lock();
        let mut out: Vec<(u64, ReceiptTx, Vec<PendingReceipt>)> = Vec::new();
        for receipt in receipts {
            match receivers.pick(&receipt.system_id) {
                Some((id, tx)) => match out.iter_mut().find(|(sid, _, _)| *sid == id) {
                    Some((_, _, batch)) => batch.push(receipt),
                    None => out.push((id, tx, vec![receipt])),
                },
                None => receivers.hold([receipt]),
            }
        }
        for (_, tx, batch) in out {
            if let Err(mpsc::error::SendError(batch)) = tx.send(batch) {
                receivers.hold(batch);
            }
        }
    }

    fn next_ids(&self) -> (String, String) {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let resp = self.config.id_style.format(n, self.salt);
        let text = match self.config.receipt_id_style {
            Some(style) if style != self.config.id_style && self.config.id_style != IdStyle::Uuid => {
                style.format(n, self.salt)
            }
            _ => resp.clone(),
        };
        (resp, text)
    }
}

/// A mobile-originated deliver_sm the SMSC sends to a bound receiver of a system_id
/// (held until one binds, sent again after a deliver_sm_resp of ESME_RX_T_APPN or a lost
/// session, as real SMSCs do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoSpec {
    /// The test's name for it: its answers are recorded under it.
    pub tag: String,
    pub source: String,
    pub destination: String,
    pub esm_class: u8,
    pub data_coding: u8,
    pub short_message: Vec<u8>,
    /// sar_msg_ref_num, sar_total_segments, sar_segment_seqnum.
    pub sar: Option<(u16, u8, u8)>,
}

impl MoSpec {
    /// A single GSM 7-bit (unpacked) message.
    pub fn gsm(tag: &str, source: &str, destination: &str, text: &str) -> MoSpec {
        MoSpec {
            tag: tag.to_owned(),
            source: source.to_owned(),
            destination: destination.to_owned(),
            esm_class: 0,
            data_coding: 0,
            short_message: text::encode(text::Alphabet::Gsm7, text).unwrap_or_default(),
            sar: None,
        }
    }
}

/// ESME_RX_T_APPN: the ESME cannot take it now; the SMSC sends it again.
const TEMPORARY_APP_ERROR: u32 = 0x64;

/// The test SMSC. Dropping it shuts it down (see [`TestSmsc::shutdown`] to wait for that).
pub struct TestSmsc {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<tokio::task::JoinHandle<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for TestSmsc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestSmsc")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

async fn bind_listener(port: u16) -> tokio::net::TcpListener {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let attempt = (|| {
            let socket = TcpSocket::new_v4()?;
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        })();
        match attempt {
            Ok(listener) => return listener,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && port != 0 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("test SMSC cannot listen on {addr}: {e}"),
        }
    }
}

async fn start_inner(config: SmscConfig) -> (Arc<Shared>, SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = bind_listener(config.port).await;
    let addr = listener.local_addr().expect("listener address");
    let (sched_tx, sched_rx) = mpsc::unbounded_channel();
    let micros = unix_micros();
    let shared = Arc::new(Shared {
        salt: micros.rotate_left(17) ^ u64::from(addr.port()),
        next_id: AtomicU64::new(config.id_start.unwrap_or(micros)),
        next_session: AtomicU64::new(1),
        receipt_delay_us: AtomicU64::new(u64::try_from(config.receipt_delay.as_micros()).unwrap_or(u64::MAX)),
        rules_active: AtomicBool::new(!config.receipt_rules.is_empty()),
        rules: Mutex::new(config.receipt_rules.clone()),
        faults: Faults::new(),
        counters: Counters::default(),
        recorder: Mutex::new(Recorder::default()),
        receivers: Mutex::new(Receivers::default()),
        mo_answers: Mutex::new(Vec::new()),
        sched_tx,
        notify: Notify::new(),
        shutdown: watch::Sender::new(false),
        kick: watch::Sender::new(0),
        config,
    });
    tokio::spawn(run_scheduler(shared.clone(), sched_rx));
    let accept = tokio::spawn(accept_loop(shared.clone(), listener));
    (shared, addr, accept)
}

impl TestSmsc {
    /// Starts the SMSC on the current tokio runtime, listening on 127.0.0.1.
    pub async fn start(config: SmscConfig) -> TestSmsc {
        let (shared, addr, accept) = start_inner(config).await;
        TestSmsc {
            shared,
            addr,
            accept: Some(accept),
            thread: None,
        }
    }

    /// Starts the SMSC on its own thread with a single-threaded runtime (one core), e.g.
    /// for a benchmark, or from a test that has no runtime. All methods work from anywhere.
    pub fn start_in_thread(config: SmscConfig) -> TestSmsc {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("test-smsc".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("test SMSC runtime");
                runtime.block_on(async move {
                    let (shared, addr, accept) = start_inner(config).await;
                    let mut shutdown = shared.shutdown.subscribe();
                    tx.send((shared.clone(), addr)).expect("test SMSC start");
                    let _ = shutdown.wait_for(|stop| *stop).await;
                    let _ = accept.await;
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while shared.counters.connections.load(Ordering::Relaxed) > 0 {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    })
                    .await;
                });
            })
            .expect("spawn test SMSC thread");
        let (shared, addr) = rx.recv().expect("test SMSC thread failed to start");
        TestSmsc {
            shared,
            addr,
            accept: None,
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Fault injection switches.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    pub fn set_receipt_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.receipt_delay_us.store(micros, Ordering::Relaxed);
    }

    /// Replaces the receipt rules (first match wins; no match: DELIVRD).
    pub fn set_receipt_rules(&self, rules: Vec<ReceiptRule>) {
        let active = !rules.is_empty();
        *self.shared.rules.lock() = rules;
        self.shared.rules_active.store(active, Ordering::Release);
    }

    pub fn stats(&self) -> SmscStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SmscStats {
            connections: get(&c.connections),
            binds: get(&c.binds),
            bind_failures: get(&c.bind_failures),
            submits: get(&c.submits),
            accepted: get(&c.accepted),
            rejected: get(&c.rejected),
            throttled: get(&c.throttled),
            unanswered: get(&c.unanswered),
            receipts_sent: get(&c.receipts_sent),
            receipts_acked: get(&c.receipts_acked),
            receipts_nacked: get(&c.receipts_nacked),
            receipts_held: self.held_receipts() as u64,
            messages_completed: get(&c.messages_completed),
            duplicate_messages: get(&c.duplicate_messages),
            generic_nacks_sent: get(&c.generic_nacks_sent),
        }
    }

    /// Every submit_sm received so far (record mode).
    pub fn submits(&self) -> Vec<SubmitRecord> {
        self.shared.recorder.lock().submits.clone()
    }

    /// Every complete message so far, in completion order (record mode).
    pub fn messages(&self) -> Vec<SmscMessage> {
        self.shared.recorder.lock().messages.clone()
    }

    pub fn messages_to(&self, destination: &str) -> Vec<SmscMessage> {
        let recorder = self.shared.recorder.lock();
        recorder
            .messages
            .iter()
            .filter(|m| m.destination == destination)
            .cloned()
            .collect()
    }

    /// Texts that reached the same destination more than once (record mode).
    pub fn duplicates(&self) -> Vec<Duplicate> {
        let recorder = self.shared.recorder.lock();
        let mut out: Vec<Duplicate> = recorder
            .seen
            .iter()
            .filter(|(_, count)| **count > 1)
            .map(|((destination, text), count)| Duplicate {
                destination: destination.clone(),
                text: text.clone(),
                count: *count,
            })
            .collect();
        out.sort_by(|a, b| (&a.destination, &a.text).cmp(&(&b.destination, &b.text)));
        out
    }

    /// Multipart groups still missing parts.
    pub fn incomplete_groups(&self) -> usize {
        self.shared.recorder.lock().groups.len()
    }

    /// Receipts waiting for a receiver to bind.
    /// Send mobile-originated messages to bound receivers of `system_id` (held until one
    /// binds).
    pub fn send_mo(&self, system_id: &str, messages: Vec<MoSpec>) {
        let system_id: Arc<str> = Arc::from(system_id);
        let pending = messages
            .into_iter()
            .map(|m| PendingReceipt {
                mo: Some(Arc::new(m)),
                system_id: system_id.clone(),
                resp_id: String::new(),
                text_id: String::new(),
                source: (0, 0, String::new()),
                destination: (0, 0, String::new()),
                state: ReceiptState::Delivered,
                err: String::new(),
                submit_unix: 0,
                done_unix: None,
                excerpt: String::new(),
                after: Duration::ZERO,
            })
            .collect();
        self.shared.dispatch(pending);
    }

    /// How many deliver_sm_resp to mobile-originated messages came so far.
    pub fn mo_answer_count(&self) -> usize {
        self.shared.mo_answers.lock().len()
    }

    /// deliver_sm_resp statuses of mobile-originated messages so far, by tag, in order.
    pub fn mo_answers(&self) -> Vec<(String, u32)> {
        self.shared.mo_answers.lock().clone()
    }

    pub fn held_receipts(&self) -> usize {
        self.shared.receivers.lock().held_count()
    }

    pub fn bound_sessions(&self) -> Vec<BoundSession> {
        let receivers = self.shared.receivers.lock();
        let mut out: Vec<BoundSession> = receivers
            .bound
            .iter()
            .map(|(id, (system_id, kind))| BoundSession {
                session: *id,
                system_id: system_id.clone(),
                kind: *kind,
            })
            .collect();
        out.sort_by_key(|b| b.session);
        out
    }

    /// Forgets recorded submits, messages and duplicate counts (not the counters).
    pub fn clear_records(&self) {
        let mut recorder = self.shared.recorder.lock();
        recorder.submits.clear();
        recorder.messages.clear();
        recorder.seen.clear();
    }

    /// Closes every open connection (the listener stays).
    pub fn disconnect_all(&self) {
        self.shared.kick.send_modify(|generation| *generation += 1);
    }

    /// Waits until `cond(self)` holds; false on timeout.
    pub async fn wait_for(&self, timeout: Duration, mut cond: impl FnMut(&TestSmsc) -> bool) -> bool {
        wait_until(&self.shared.notify, timeout, || cond(self)).await
    }

    pub async fn wait_submits(&self, n: u64, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.stats().submits >= n).await
    }

    pub async fn wait_accepted(&self, n: u64, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.stats().accepted >= n).await
    }

    pub async fn wait_messages(&self, n: u64, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.stats().messages_completed >= n).await
    }

    pub async fn wait_receipts_sent(&self, n: u64, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.stats().receipts_sent >= n).await
    }

    pub async fn wait_receipts_acked(&self, n: u64, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.stats().receipts_acked >= n).await
    }

    /// Waits until at least `n` sessions are bound.
    pub async fn wait_bound(&self, n: usize, timeout: Duration) -> bool {
        self.wait_for(timeout, |s| s.shared.receivers.lock().bound.len() >= n)
            .await
    }

    /// Stops listening, closes every connection and waits for that.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(accept) = self.accept.take() {
            let _ = accept.await;
            let shared = self.shared.clone();
            let _ = tokio::time::timeout(Duration::from_secs(2), async move {
                while shared.counters.connections.load(Ordering::Relaxed) > 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl Drop for TestSmsc {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
    }
}

/// Resolves once the shutdown flag is set (without holding the watch guard).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn accept_loop(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
                shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                let session = Session::new(shared.clone(), stream, id);
                tokio::spawn(session.run());
            }
        }
    }
}

struct Due {
    at: Instant,
    n: u64,
    batch: Vec<PendingReceipt>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.n) == (other.at, other.n)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.n).cmp(&(other.at, other.n))
    }
}

/// One timer for all receipt batches: each batch is one heap entry.
async fn run_scheduler(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<(Instant, Vec<PendingReceipt>)>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut heap: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut n = 0u64;
    loop {
        let next = heap.peek().map(|Reverse(d)| tokio::time::Instant::from_std(d.at));
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            msg = rx.recv() => match msg {
                Some((at, batch)) => {
                    n += 1;
                    heap.push(Reverse(Due { at, n, batch }));
                    while let Ok((at, batch)) = rx.try_recv() {
                        n += 1;
                        heap.push(Reverse(Due { at, n, batch }));
                    }
                }
                None => return,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {}
        }
        let now = Instant::now();
        let mut due = Vec::new();
        while heap.peek().is_some_and(|Reverse(d)| d.at <= now) {
            if let Some(Reverse(d)) = heap.pop() {
                due.extend(d.batch);
            }
        }
        shared.dispatch(due);
    }
}

/// What one read batch produced, applied under one lock at the end.
#[derive(Default)]
struct Batch {
    records: Vec<SubmitRecord>,
    receipts: Vec<PendingReceipt>,
    submits: u64,
    accepted: u64,
    rejected: u64,
    throttled: u64,
    unanswered: u64,
    answered_submits: bool,
}

struct Session {
    shared: Arc<Shared>,
    conn: Conn,
    id: u64,
    bound: Option<(Arc<str>, BindKind)>,
    rx: Option<mpsc::UnboundedReceiver<Vec<PendingReceipt>>>,
    unacked: HashMap<u32, PendingReceipt>,
    next_seq: u32,
    closing: bool,
    drop_now: bool,
}

async fn recv_opt<T>(rx: Option<&mut mpsc::UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

enum Event {
    Readable,
    Writable,
    Receipts(Option<Vec<PendingReceipt>>),
    Stop,
}

impl Session {
    fn new(shared: Arc<Shared>, stream: TcpStream, id: u64) -> Session {
        Session {
            shared,
            conn: Conn::new(stream),
            id,
            bound: None,
            rx: None,
            unacked: HashMap::new(),
            next_seq: 1,
            closing: false,
            drop_now: false,
        }
    }

    async fn run(mut self) {
        let _ = self.serve().await;
        self.cleanup();
    }

    async fn serve(&mut self) -> io::Result<()> {
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut kick = self.shared.kick.subscribe();
        loop {
            let event = tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => Event::Stop,
                _ = kick.changed() => Event::Stop,
                r = self.conn.stream.readable(), if !self.closing => { r?; Event::Readable }
                r = self.conn.stream.writable(), if !self.conn.wbuf.is_empty() => { r?; Event::Writable }
                b = recv_opt(self.rx.as_mut()), if self.rx.is_some() && !self.closing => Event::Receipts(b),
            };
            let mut delay = None;
            match event {
                Event::Stop => return Ok(()),
                Event::Writable => {}
                Event::Readable => {
                    self.conn.try_fill(1 << 20)?;
                    let batch = self.process_input();
                    if batch.answered_submits {
                        delay = self.shared.faults.response_delay();
                    }
                    self.finish_batch(batch);
                    if self.conn.eof {
                        self.closing = true;
                    }
                }
                Event::Receipts(Some(first)) => {
                    let mut receipts = first;
                    if let Some(rx) = self.rx.as_mut() {
                        while let Ok(more) = rx.try_recv() {
                            receipts.extend(more);
                        }
                    }
                    self.send_receipts(receipts);
                }
                Event::Receipts(None) => self.rx = None,
            }
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            if self.drop_now {
                let _ = tokio::time::timeout(Duration::from_secs(1), self.conn.flush()).await;
                return Ok(());
            }
            self.conn.try_flush()?;
            if self.closing {
                let _ = tokio::time::timeout(Duration::from_secs(1), self.conn.flush()).await;
                return Ok(());
            }
        }
    }

    fn process_input(&mut self) -> Batch {
        let mut batch = Batch::default();
        let now = Instant::now();
        let unix = unix_now();
        loop {
            let frame = match self.conn.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    // command_length above the maximum: answer it and give up on the stream.
                    if let Some(header) = frame::peek_header(&self.conn.rbuf) {
                        self.nack(header.sequence_number, CommandStatus::EsmeRinvcmdlen);
                    }
                    self.conn.rbuf.clear();
                    self.closing = true;
                    break;
                }
            };
            match frame::decode_frame(frame) {
                Err(err) => {
                    if let Some(reply) = err.reply() {
                        self.conn.push(&reply);
                        self.shared.counters.generic_nacks_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    if err.must_close() {
                        self.conn.rbuf.clear();
                        self.closing = true;
                        break;
                    }
                }
                Ok(command) => self.handle(command, &mut batch, now, unix),
            }
            if self.drop_now || self.closing {
                break;
            }
        }
        batch
    }

    fn nack(&mut self, seq: u32, status: CommandStatus) {
        self.conn.push(&build::generic_nack(seq, status));
        self.shared.counters.generic_nacks_sent.fetch_add(1, Ordering::Relaxed);
    }

    fn handle(&mut self, command: Command, batch: &mut Batch, now: Instant, unix: i64) {
        let seq = command.sequence_number();
        match (command.id(), command.pdu()) {
            (_, Some(Pdu::BindTransmitter(b))) => {
                self.handle_bind(BindKind::Transmitter, seq, b.system_id.as_str(), b.password.as_str());
            }
            (_, Some(Pdu::BindReceiver(b))) => {
                self.handle_bind(BindKind::Receiver, seq, b.system_id.as_str(), b.password.as_str());
            }
            (_, Some(Pdu::BindTransceiver(b))) => {
                self.handle_bind(BindKind::Transceiver, seq, b.system_id.as_str(), b.password.as_str());
            }
            (_, Some(Pdu::SubmitSm(sm))) => self.handle_submit(seq, sm, batch, now, unix),
            (CommandId::DeliverSmResp, _) => self.handle_deliver_resp(seq, command.status()),
            (CommandId::EnquireLink, _) => self.conn.push(&build::enquire_link_resp(seq)),
            (CommandId::Unbind, _) => {
                self.conn.push(&build::unbind_resp(seq));
                self.closing = true;
            }
            (id, _) if id.is_response() => {}
            _ => self.nack(seq, CommandStatus::EsmeRinvcmdid),
        }
    }

    fn handle_bind(&mut self, kind: BindKind, seq: u32, system_id: &str, password: &str) {
        let ours = self.shared.config.system_id.clone();
        if self.bound.is_some() {
            self.push_result(build::bind_resp(kind, seq, CommandStatus::EsmeRalybnd, &ours));
            return;
        }
        let accounts = &self.shared.config.accounts;
        let forced = *self.shared.faults.bind_reject.lock();
        let status = match forced {
            Some(status) => status,
            None if accounts.is_empty()
                || accounts
                    .iter()
                    .any(|a| a.system_id == system_id && a.password == password) =>
            {
                CommandStatus::EsmeRok
            }
            None => CommandStatus::EsmeRinvpaswd,
        };
        self.push_result(build::bind_resp(kind, seq, status, &ours));
        if status != CommandStatus::EsmeRok {
            self.shared.counters.bind_failures.fetch_add(1, Ordering::Relaxed);
            self.closing = true;
            return;
        }
        self.shared.counters.binds.fetch_add(1, Ordering::Relaxed);
        let system_id: Arc<str> = Arc::from(system_id);
        self.bound = Some((system_id.clone(), kind));
        let mut receivers = self.shared.receivers.lock();
        receivers.bound.insert(self.id, (system_id.to_string(), kind));
        if kind.can_receive() {
            let (tx, rx) = mpsc::unbounded_channel();
            if let Some(held) = receivers.held.remove(&system_id) {
                let _ = tx.send(held.into_iter().collect());
            }
            receivers.sessions.entry(system_id).or_default().push((self.id, tx));
            self.rx = Some(rx);
        }
        drop(receivers);
        self.shared.notify.notify_waiters();
    }

    fn push_result(&mut self, command: Result<Command, build::BuildError>) {
        match command {
            Ok(command) => self.conn.push(&command),
            Err(_) => self.nack(0, CommandStatus::EsmeRsyserr),
        }
    }

    fn handle_submit(&mut self, seq: u32, sm: &rusmpp::pdus::SubmitSm, batch: &mut Batch, now: Instant, unix: i64) {
        batch.submits += 1;
        let tlvs = KnownTlvs::read(sm.tlvs());
        let short_message: &[u8] = sm.short_message().as_ref();
        let data = tlvs.message_payload.as_deref().unwrap_or(short_message);
        let esm_class = u8::from(sm.esm_class);
        let data_coding = u8::from(sm.data_coding);
        let registered_delivery = u8::from(sm.registered_delivery);
        let (part, user_data) = split_user_data(esm_class, data, &tlvs);
        let destination = sm.destination_addr.as_str();
        let system_id = self.bound.as_ref().map(|(s, _)| s.clone());

        let status = match &self.bound {
            Some((_, kind)) if kind.can_transmit() => {
                let faults = &self.shared.faults;
                if faults.stop_answering.load(Ordering::Relaxed) {
                    None
                } else if faults.take_drop() {
                    self.drop_now = true;
                    None
                } else {
                    Some(faults.submit_status(destination))
                }
            }
            _ => Some(CommandStatus::EsmeRinvbndsts),
        };

        let mut message_id = None;
        match status {
            None => batch.unanswered += 1,
            Some(CommandStatus::EsmeRok) => {
                let (resp_id, text_id) = self.shared.next_ids();
                self.push_result(build::submit_sm_resp(seq, CommandStatus::EsmeRok, &resp_id));
                batch.accepted += 1;
                batch.answered_submits = true;
                let wants = registered_delivery & 0x03;
                if wants == 1 || wants == 2 {
                    let (outcome, gap) = self.shared.outcome_for(destination);
                    let excerpt = if self.shared.config.receipt_text {
                        ascii_excerpt(data_coding, user_data)
                    } else {
                        String::new()
                    };
                    for (n, (state, err)) in outcome.into_iter().enumerate() {
                        if wants == 2 && state.is_success() {
                            continue;
                        }
                        let after = gap * u32::try_from(n).unwrap_or(u32::MAX);
                        batch.receipts.push(PendingReceipt {
                            mo: None,
                            system_id: system_id.clone().unwrap_or_else(|| Arc::from("")),
                            resp_id: resp_id.clone(),
                            text_id: text_id.clone(),
                            source: (
                                u8::from(sm.source_addr_ton),
                                u8::from(sm.source_addr_npi),
                                sm.source_addr.as_str().to_owned(),
                            ),
                            destination: (
                                u8::from(sm.dest_addr_ton),
                                u8::from(sm.dest_addr_npi),
                                destination.to_owned(),
                            ),
                            state,
                            err,
                            submit_unix: unix,
                            done_unix: None,
                            excerpt: excerpt.clone(),
                            after,
                        });
                    }
                }
                message_id = Some(resp_id);
            }
            Some(status) => {
                self.push_result(build::submit_sm_resp(seq, status, ""));
                batch.answered_submits = true;
                if status == CommandStatus::EsmeRthrottled {
                    batch.throttled += 1;
                } else {
                    batch.rejected += 1;
                }
            }
        }

        let record = self.shared.config.record;
        batch.records.push(SubmitRecord {
            session: self.id,
            system_id: system_id.map(|s| s.to_string()).unwrap_or_default(),
            source: sm.source_addr.as_str().to_owned(),
            source_ton: u8::from(sm.source_addr_ton),
            source_npi: u8::from(sm.source_addr_npi),
            destination: destination.to_owned(),
            dest_ton: u8::from(sm.dest_addr_ton),
            dest_npi: u8::from(sm.dest_addr_npi),
            esm_class,
            data_coding,
            registered_delivery,
            // Without recording only the part's user data is kept, for reassembly counts.
            short_message: if record { short_message.to_vec() } else { Vec::new() },
            message_payload: if record { tlvs.message_payload.clone() } else { None },
            sar: tlvs.sar(),
            part,
            schedule_delivery_time: sm.schedule_delivery_time.as_str().to_owned(),
            sequence_number: seq,
            status,
            message_id,
            arrived_at: now,
        });
    }

    fn handle_deliver_resp(&mut self, seq: u32, status: CommandStatus) {
        let Some(receipt) = self.unacked.remove(&seq) else {
            return;
        };
        if let Some(mo) = &receipt.mo {
            let code = u32::from(status);
            self.shared.mo_answers.lock().push((mo.tag.clone(), code));
            if code == TEMPORARY_APP_ERROR {
                let due = Instant::now() + RECEIPT_RETRY;
                let _ = self.shared.sched_tx.send((due, vec![receipt]));
            }
            self.shared.notify.notify_waiters();
            return;
        }
        if status == CommandStatus::EsmeRok {
            self.shared.counters.receipts_acked.fetch_add(1, Ordering::Relaxed);
        } else {
            // Like real SMSCs: a receipt the ESME refused is sent again later.
            self.shared.counters.receipts_nacked.fetch_add(1, Ordering::Relaxed);
            let due = Instant::now() + RECEIPT_RETRY;
            let _ = self.shared.sched_tx.send((due, vec![receipt]));
        }
        self.shared.notify.notify_waiters();
    }

    fn finish_batch(&mut self, batch: Batch) {
        let c = &self.shared.counters;
        add(&c.submits, batch.submits);
        add(&c.accepted, batch.accepted);
        add(&c.rejected, batch.rejected);
        add(&c.throttled, batch.throttled);
        add(&c.unanswered, batch.unanswered);
        if !batch.records.is_empty() {
            let record = self.shared.config.record;
            let mut recorder = self.shared.recorder.lock();
            let mut completed = 0;
            let mut duplicates = 0;
            for r in batch.records {
                if r.is_accepted() {
                    let (done, dup) = reassemble(&mut recorder, &r, record);
                    completed += u64::from(done);
                    duplicates += u64::from(dup);
                }
                if record {
                    recorder.submits.push(r);
                }
            }
            drop(recorder);
            add(&c.messages_completed, completed);
            add(&c.duplicate_messages, duplicates);
        }
        if !batch.receipts.is_empty() {
            let due = Instant::now() + self.shared.receipt_delay();
            let (now, mut later): (Vec<_>, Vec<_>) = batch.receipts.into_iter().partition(|r| r.after.is_zero());
            if !now.is_empty() {
                let _ = self.shared.sched_tx.send((due, now));
            }
            later.sort_by_key(|r| r.after);
            for r in later {
                let _ = self.shared.sched_tx.send((due + r.after, vec![r]));
            }
        }
        self.shared.notify.notify_waiters();
    }

    fn send_receipts(&mut self, receipts: Vec<PendingReceipt>) {
        let now = unix_now();
        let mut sent = 0;
        for mut receipt in receipts {
            let seq = self.next_seq;
            self.next_seq = self.next_seq.wrapping_add(1).max(1);
            if let Some(mo) = &receipt.mo {
                let sm = ShortMessage {
                    source: Address {
                        ton: 1,
                        npi: 1,
                        addr: &mo.source,
                    },
                    destination: Address {
                        ton: 0,
                        npi: 0,
                        addr: &mo.destination,
                    },
                    esm_class: mo.esm_class,
                    registered_delivery: 0,
                    data_coding: mo.data_coding,
                    short_message: &mo.short_message,
                    message_payload: None,
                    sar: mo.sar,
                };
                if let Ok(command) = build::deliver_sm(seq, &sm, None) {
                    self.conn.push(&command);
                    self.unacked.insert(seq, receipt);
                }
                continue;
            }
            let delivered = receipt.state.is_success();
            let text = ReceiptText {
                id: receipt.text_id.clone(),
                sub: 1,
                dlvrd: u32::from(delivered),
                submit_date: Some(format_date(receipt.submit_unix)),
                done_date: Some(format_date(*receipt.done_unix.get_or_insert(now))),
                stat: receipt.state,
                err: receipt.err.clone(),
                text: receipt.excerpt.clone(),
            }
            .format();
            let sm = ShortMessage {
                // The receipt comes from the handset the message went to.
                source: Address {
                    ton: receipt.destination.0,
                    npi: receipt.destination.1,
                    addr: &receipt.destination.2,
                },
                destination: Address {
                    ton: receipt.source.0,
                    npi: receipt.source.1,
                    addr: &receipt.source.2,
                },
                esm_class: 0x04,
                registered_delivery: 0,
                data_coding: 0,
                short_message: text.as_bytes(),
                message_payload: None,
                sar: None,
            };
            let tlvs = ReceiptTlvs {
                receipted_message_id: &receipt.resp_id,
                message_state: receipt.state.message_state(),
            };
            let tlvs = self.shared.config.receipt_tlvs.then_some(&tlvs);
            if let Ok(command) = build::deliver_sm(seq, &sm, tlvs) {
                self.conn.push(&command);
                self.unacked.insert(seq, receipt);
                sent += 1;
            }
        }
        add(&self.shared.counters.receipts_sent, sent);
        self.shared.notify.notify_waiters();
    }

    /// Unregisters the session. Receipts it had not got acknowledged go to another bound
    /// receiver of the same system_id if there is one (as real SMSCs hand receipts to any
    /// bound session), else they are held for the next bind.
    fn cleanup(&mut self) {
        let mut receivers = self.shared.receivers.lock();
        receivers.bound.remove(&self.id);
        if let Some((system_id, kind)) = &self.bound
            && kind.can_receive()
            && let Some(list) = receivers.sessions.get_mut(system_id)
        {
            list.retain(|(id, _)| *id != self.id);
        }
        let mut unacked: Vec<(u32, PendingReceipt)> = self.unacked.drain().collect();
        unacked.sort_by_key(|(seq, _)| *seq);
        let mut orphaned: Vec<PendingReceipt> = unacked.into_iter().map(|(_, r)| r).collect();
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            while let Ok(batch) = rx.try_recv() {
                orphaned.extend(batch);
            }
        }
        let mut by_system: HashMap<Arc<str>, Vec<PendingReceipt>> = HashMap::new();
        for r in orphaned {
            by_system.entry(r.system_id.clone()).or_default().push(r);
        }
        for (system_id, batch) in by_system {
            match receivers.pick(&system_id) {
                Some((_, tx)) => {
                    if let Err(mpsc::error::SendError(batch)) = tx.send(batch) {
                        receivers.hold(batch);
                    }
                }
                None => receivers.hold(batch),
            }
        }
        drop(receivers);
        self.shared.counters.connections.fetch_sub(1, Ordering::Relaxed);
        self.shared.notify.notify_waiters();
    }
}

/// The first characters of the part's text for `text:`, ASCII only.
fn ascii_excerpt(data_coding: u8, user_data: &[u8]) -> String {
    let decoded = text::decode(data_coding, user_data).unwrap_or_default();
    text_excerpt(&decoded)
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect()
}

fn decode_text(data_coding: u8, user_data: &[u8]) -> String {
    text::decode(data_coding, user_data)
        .unwrap_or_else(|_| format!("<undecodable dcs {data_coding:#04x}: {} octets>", user_data.len()))
}

/// Adds an accepted submit to the recorder. Returns (a message completed, it was a duplicate).
fn reassemble(recorder: &mut Recorder, r: &SubmitRecord, record: bool) -> (bool, bool) {
    let message_id = r.message_id.clone().unwrap_or_default();
    let user_data = if record { r.user_data().to_vec() } else { Vec::new() };
    let part = r.part.filter(|p| p.total > 1 && p.seq >= 1 && p.seq <= p.total);
    let Some(part) = part else {
        if !record {
            return (true, false);
        }
        let message = SmscMessage {
            system_id: r.system_id.clone(),
            source: r.source.clone(),
            destination: r.destination.clone(),
            text: decode_text(r.data_coding, &user_data),
            user_data,
            data_coding: r.data_coding,
            parts: 1,
            reference: r.part.map(|p| p.reference),
            message_ids: vec![message_id],
            registered_delivery: vec![r.registered_delivery],
            first_arrival: r.arrived_at,
            completed_at: r.arrived_at,
        };
        return (true, complete(recorder, message));
    };
    let key = (r.source.clone(), r.destination.clone(), part.reference);
    let group = recorder.groups.entry(key.clone()).or_insert_with(|| Group {
        total: part.total,
        parts: (0..part.total).map(|_| None).collect(),
        received: 0,
        data_coding: r.data_coding,
        system_id: r.system_id.clone(),
        first_arrival: r.arrived_at,
    });
    if group.total != part.total {
        // Same reference, different size: a new message reusing the reference.
        *group = Group {
            total: part.total,
            parts: (0..part.total).map(|_| None).collect(),
            received: 0,
            data_coding: r.data_coding,
            system_id: r.system_id.clone(),
            first_arrival: r.arrived_at,
        };
    }
    let slot = &mut group.parts[usize::from(part.seq - 1)];
    if slot.is_none() {
        group.received += 1;
    }
    *slot = Some(GroupPart {
        user_data,
        message_id,
        registered_delivery: r.registered_delivery,
    });
    if group.received < usize::from(group.total) {
        return (false, false);
    }
    let Some(group) = recorder.groups.remove(&key) else {
        return (false, false);
    };
    if !record {
        return (true, false);
    }
    let parts: Vec<GroupPart> = group.parts.into_iter().flatten().collect();
    let user_data: Vec<u8> = parts.iter().flat_map(|p| p.user_data.iter().copied()).collect();
    let message = SmscMessage {
        system_id: group.system_id,
        source: key.0,
        destination: key.1,
        text: decode_text(group.data_coding, &user_data),
        user_data,
        data_coding: group.data_coding,
        parts: group.total,
        reference: Some(part.reference),
        message_ids: parts.iter().map(|p| p.message_id.clone()).collect(),
        registered_delivery: parts.iter().map(|p| p.registered_delivery).collect(),
        first_arrival: group.first_arrival,
        completed_at: r.arrived_at,
    };
    (true, complete(recorder, message))
}

fn complete(recorder: &mut Recorder, message: SmscMessage) -> bool {
    let count = recorder
        .seen
        .entry((message.destination.clone(), message.text.clone()))
        .or_insert(0);
    *count += 1;
    let duplicate = *count > 1;
    recorder.messages.push(message);
    duplicate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_styles() {
        assert_eq!(IdStyle::Hex.format(0x1A2B3C, 0), "1A2B3C");
        assert_eq!(IdStyle::HexLower.format(0x1A2B3C, 0), "1a2b3c");
        assert_eq!(IdStyle::Decimal.format(0x1A2B3C, 0), "1715004");
        let uuid = IdStyle::Uuid.format(42, 0x0123_4567_89AB_CDEF);
        assert_eq!(uuid.len(), 36);
        assert!(uuid.ends_with("00000000002a"), "{uuid}");
        assert_ne!(uuid, IdStyle::Uuid.format(43, 0x0123_4567_89AB_CDEF));
        assert_eq!(IdStyle::parse("DEC"), Some(IdStyle::Decimal));
        assert_eq!(IdStyle::parse("nope"), None);
    }

    #[test]
    fn faults_drop_after_counts_down_once() {
        let f = Faults::new();
        assert!(!f.take_drop());
        f.drop_connection_after(2);
        assert!(!f.take_drop());
        assert!(!f.take_drop());
        assert!(f.take_drop());
        assert!(!f.take_drop());
    }

    #[test]
    fn faults_throttle_and_reject() {
        let f = Faults::new();
        f.throttle_every(3);
        let statuses: Vec<_> = (0..6).map(|_| f.submit_status("447")).collect();
        assert_eq!(
            statuses.iter().filter(|s| **s == CommandStatus::EsmeRthrottled).count(),
            2
        );
        f.stop_throttling();
        f.reject_prefix("999", CommandStatus::EsmeRinvdstadr);
        assert_eq!(f.submit_status("999123"), CommandStatus::EsmeRinvdstadr);
        assert_eq!(f.submit_status("447"), CommandStatus::EsmeRok);
        f.throttle_all_for(Duration::from_secs(60));
        assert_eq!(f.submit_status("447"), CommandStatus::EsmeRthrottled);
        f.clear();
        assert_eq!(f.submit_status("999123"), CommandStatus::EsmeRok);
    }

    #[test]
    fn excerpt_is_ascii() {
        let data = text::encode(text::Alphabet::Ucs2, "héllo wörld, a long text here").unwrap();
        assert_eq!(ascii_excerpt(8, &data), "h?llo w?rld, a long ");
    }
}
