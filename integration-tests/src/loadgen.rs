//! The benchmark's load generator: N transceiver sessions submitting to an SMPP server
//! (Sendium's, or the test SMSC for calibration), measuring submit_sm_resp latency and
//! waiting for every receipt.
//!
//! ```no_run
//! # async fn demo(addr: std::net::SocketAddr) {
//! use sendium_integration_tests::loadgen::{self, LoadConfig};
//! let report = loadgen::run(LoadConfig { addr, count: 100_000, ..LoadConfig::default() }).await.unwrap();
//! println!("{report}");
//! assert_eq!(report.receipts_missing, 0);
//! # }
//! ```
//!
//! Each session is one task doing everything ready per wake-up (NOTES "CPU per
//! wake-up"): fill the window with as many submit_sm as allowed into one buffer and write
//! it with one syscall, drain the socket, handle every response and receipt in it, answer
//! all deliver_sm with one write, and update the shared receipt matcher under one lock
//! per batch. Send and receive times are taken once per batch.
//!
//! Multipart messages are 3 UDH parts (8-bit reference) with only part 1 asking for a
//! receipt, as Kannel does, so every message expects exactly one receipt. Receipts are
//! matched globally by id (receipted_message_id, else the text's `id:`): the server may
//! hand a receipt to any bound session of the account.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rusmpp::{CommandId, CommandStatus, Pdu};
use sendium_protocols::receipt::ReceiptText;
use sendium_protocols::smpp::build::{self, Address, BindCredentials, BindKind, ShortMessage};
use sendium_protocols::smpp::frame;
use sendium_protocols::text::{self, Alphabet};
use tokio::net::TcpStream;

use crate::histogram::Histogram;
use crate::wire::{Conn, KnownTlvs, status_name};

/// Relative weights of the message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// Single-part GSM 7-bit.
    pub gsm: u32,
    /// Single-part UCS2.
    pub ucs2: u32,
    /// 3-part GSM with an 8-bit UDH reference.
    pub multipart: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            gsm: 1,
            ucs2: 0,
            multipart: 0,
        }
    }
}

impl Mix {
    /// `gsm=8,ucs2=1,multipart=1` (missing kinds weigh 0).
    pub fn parse(s: &str) -> Result<Mix, String> {
        let mut mix = Mix {
            gsm: 0,
            ucs2: 0,
            multipart: 0,
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, weight) = item
                .split_once('=')
                .ok_or_else(|| format!("mix item {item:?} is not kind=weight"))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|_| format!("mix weight {weight:?} is not a number"))?;
            match name.trim() {
                "gsm" => mix.gsm = weight,
                "ucs2" => mix.ucs2 = weight,
                "multipart" | "multi" => mix.multipart = weight,
                other => return Err(format!("unknown mix kind {other:?} (gsm, ucs2, multipart)")),
            }
        }
        if mix.gsm + mix.ucs2 + mix.multipart == 0 {
            return Err("the mix has no weight".to_owned());
        }
        Ok(mix)
    }

    fn kind(&self, n: u64) -> Kind {
        let total = u64::from(self.gsm + self.ucs2 + self.multipart).max(1);
        let slot = n % total;
        if slot < u64::from(self.gsm) {
            Kind::Gsm
        } else if slot < u64::from(self.gsm + self.ucs2) {
            Kind::Ucs2
        } else {
            Kind::Multipart
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gsm,
    Ucs2,
    Multipart,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub addr: SocketAddr,
    pub system_id: String,
    pub password: String,
    /// Transceiver sessions.
    pub sessions: usize,
    /// Messages in total (a multipart message counts once).
    pub count: u64,
    /// Outstanding submit_sm per session.
    pub window: usize,
    /// Messages per second in total; `None`: as fast as the window allows.
    pub rate: Option<f64>,
    pub mix: Mix,
    /// Ask for receipts and wait for them.
    pub receipts: bool,
    pub source: String,
    /// Destinations are this prefix plus an 8-digit message number.
    pub dest_prefix: String,
    /// How long to wait for missing receipts after the last response.
    pub receipt_timeout: Duration,
    /// Give up on outstanding submits after this long without any response.
    pub resp_timeout: Duration,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            addr: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2775)),
            system_id: "esme1".to_owned(),
            password: "secret".to_owned(),
            sessions: 4,
            count: 10_000,
            window: 100,
            rate: None,
            mix: Mix::default(),
            receipts: true,
            source: "12345".to_owned(),
            dest_prefix: "4477".to_owned(),
            receipt_timeout: Duration::from_secs(30),
            resp_timeout: Duration::from_secs(30),
        }
    }
}

/// What happened.
#[derive(Debug, Clone)]
pub struct LoadReport {
    pub messages: u64,
    /// submit_sm PDUs sent (multipart parts counted).
    pub submits: u64,
    pub submits_ok: u64,
    /// First submit to last matched receipt (to last response without receipts).
    pub elapsed: Duration,
    /// First submit to last response.
    pub submit_elapsed: Duration,
    /// messages / elapsed.
    pub msgs_per_sec: f64,
    /// submits / submit_elapsed.
    pub submits_per_sec: f64,
    /// submit_sm_resp latency in microseconds.
    pub resp_latency: Histogram,
    pub receipts_expected: u64,
    pub receipts_matched: u64,
    pub receipts_missing: u64,
    /// Receipts whose id matched no accepted submit (unknown or duplicate).
    pub receipts_unmatched: u64,
    /// Non-OK submit statuses by name.
    pub statuses: BTreeMap<String, u64>,
    /// Submits that never got a response.
    pub no_response: u64,
    /// Sessions that could not connect or bind, with the reason.
    pub session_errors: Vec<String>,
}

impl LoadReport {
    pub fn p50_ms(&self) -> f64 {
        self.resp_latency.percentile_ms(50.0).unwrap_or(0.0)
    }

    pub fn p99_ms(&self) -> f64 {
        self.resp_latency.percentile_ms(99.0).unwrap_or(0.0)
    }

    /// The report as one JSON object (for bench drivers).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "messages": self.messages,
            "submits": self.submits,
            "submits_ok": self.submits_ok,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "submit_elapsed_s": self.submit_elapsed.as_secs_f64(),
            "msgs_per_sec": self.msgs_per_sec,
            "submits_per_sec": self.submits_per_sec,
            "resp_p50_ms": self.p50_ms(),
            "resp_p99_ms": self.p99_ms(),
            "resp_max_ms": self.resp_latency.max().unwrap_or(0) as f64 / 1000.0,
            "receipts_expected": self.receipts_expected,
            "receipts_matched": self.receipts_matched,
            "receipts_missing": self.receipts_missing,
            "receipts_unmatched": self.receipts_unmatched,
            "statuses": self.statuses,
            "no_response": self.no_response,
            "session_errors": self.session_errors,
        })
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "messages        {} (submit_sm {}, ok {})",
            self.messages, self.submits, self.submits_ok
        )?;
        writeln!(
            f,
            "elapsed         {:.3} s (submit phase {:.3} s)",
            self.elapsed.as_secs_f64(),
            self.submit_elapsed.as_secs_f64()
        )?;
        writeln!(f, "end to end      {:.0} msg/s", self.msgs_per_sec)?;
        writeln!(f, "submit rate     {:.0} submit_sm/s", self.submits_per_sec)?;
        writeln!(
            f,
            "resp latency    p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            self.p50_ms(),
            self.p99_ms(),
            self.resp_latency.max().unwrap_or(0) as f64 / 1000.0
        )?;
        writeln!(
            f,
            "receipts        matched {} of {}, missing {}, unmatched {}",
            self.receipts_matched, self.receipts_expected, self.receipts_missing, self.receipts_unmatched
        )?;
        if self.statuses.is_empty() {
            writeln!(f, "non-OK statuses none")?;
        } else {
            let list: Vec<String> = self.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
            writeln!(f, "non-OK statuses {}", list.join(", "))?;
        }
        writeln!(f, "no response     {}", self.no_response)?;
        for e in &self.session_errors {
            writeln!(f, "session error   {e}")?;
        }
        Ok(())
    }
}

/// Run-level failure (nothing could be measured).
#[derive(Debug)]
pub enum LoadError {
    Config(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Config(e) => write!(f, "invalid load configuration: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

#[derive(Default)]
struct Matcher {
    expected: HashSet<String>,
    early: HashSet<String>,
    expected_total: u64,
    matched: u64,
    last_match: Option<Instant>,
}

struct Ctx {
    config: LoadConfig,
    bodies: Bodies,
    matcher: Mutex<Matcher>,
    stop: AtomicBool,
    done: AtomicUsize,
}

struct Bodies {
    gsm: Vec<u8>,
    ucs2: Vec<u8>,
    multipart: Vec<Vec<u8>>,
}

impl Bodies {
    fn new() -> Bodies {
        let gsm = text::encode(
            Alphabet::Gsm7,
            "Sendium load test: the quick brown fox jumps over the lazy dog 0123456789",
        )
        .unwrap_or_default();
        let ucs2_text: String = "Нагрузочный тест Sendium: съешь же ещё этих мягких французских булок"
            .chars()
            .take(70)
            .collect();
        let ucs2 = text::encode(Alphabet::Ucs2, &ucs2_text).unwrap_or_default();
        let long: String = "Sendium multipart load test message, part of a long text. "
            .chars()
            .cycle()
            .take(400)
            .collect();
        let long = text::encode(Alphabet::Gsm7, &long).unwrap_or_default();
        let multipart = text::split_with_limits(Alphabet::Gsm7, &long, (0, 153))
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        Bodies { gsm, ucs2, multipart }
    }
}

#[derive(Default)]
struct SessionResult {
    latency: Histogram,
    statuses: BTreeMap<String, u64>,
    submits: u64,
    ok: u64,
    messages: u64,
    no_response: u64,
    first_submit: Option<Instant>,
    last_resp: Option<Instant>,
    error: Option<String>,
    reported_done: bool,
}

/// Runs the load on the current tokio runtime (use a multi-threaded one for several
/// sessions to spread over cores).
pub async fn run(config: LoadConfig) -> Result<LoadReport, LoadError> {
    if config.sessions == 0 {
        return Err(LoadError::Config("sessions must be at least 1".to_owned()));
    }
    if config.window == 0 {
        return Err(LoadError::Config("window must be at least 1".to_owned()));
    }
    if config.rate.is_some_and(|r| r <= 0.0 || !r.is_finite()) {
        return Err(LoadError::Config("rate must be positive".to_owned()));
    }
    let sessions = config.sessions;
    let count = config.count;
    let ctx = Arc::new(Ctx {
        config,
        bodies: Bodies::new(),
        matcher: Mutex::new(Matcher::default()),
        stop: AtomicBool::new(false),
        done: AtomicUsize::new(0),
    });
    let per = count / sessions as u64;
    let extra = count % sessions as u64;
    let mut handles = Vec::with_capacity(sessions);
    let mut first = 0;
    for i in 0..sessions {
        let mine = per + u64::from((i as u64) < extra);
        let ctx = ctx.clone();
        handles.push(tokio::spawn(async move {
            let mut result = SessionResult::default();
            if let Err(e) = session(&ctx, first, mine, &mut result).await {
                result.error = Some(e.to_string());
            }
            if !result.reported_done {
                ctx.done.fetch_add(1, Ordering::AcqRel);
            }
            result
        }));
        first += mine;
    }

    // Wait for the submit phase, then for the receipts.
    let mut receipt_deadline: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        // Every session counts itself done once its submits are answered (or it failed).
        if ctx.done.load(Ordering::Acquire) < sessions {
            continue;
        }
        let outstanding = !ctx.matcher.lock().expected.is_empty();
        if !ctx.config.receipts || !outstanding {
            break;
        }
        let deadline = *receipt_deadline.get_or_insert_with(|| Instant::now() + ctx.config.receipt_timeout);
        if Instant::now() >= deadline {
            break;
        }
    }
    ctx.stop.store(true, Ordering::Release);

    let mut report = LoadReport {
        messages: 0,
        submits: 0,
        submits_ok: 0,
        elapsed: Duration::ZERO,
        submit_elapsed: Duration::ZERO,
        msgs_per_sec: 0.0,
        submits_per_sec: 0.0,
        resp_latency: Histogram::new(),
        receipts_expected: 0,
        receipts_matched: 0,
        receipts_missing: 0,
        receipts_unmatched: 0,
        statuses: BTreeMap::new(),
        no_response: 0,
        session_errors: Vec::new(),
    };
    let mut first_submit: Option<Instant> = None;
    let mut last_resp: Option<Instant> = None;
    for (i, handle) in handles.into_iter().enumerate() {
        let result = match handle.await {
            Ok(r) => r,
            Err(e) => {
                report.session_errors.push(format!("session {i}: {e}"));
                continue;
            }
        };
        report.resp_latency.merge(&result.latency);
        for (k, v) in result.statuses {
            *report.statuses.entry(k).or_default() += v;
        }
        report.messages += result.messages;
        report.submits += result.submits;
        report.submits_ok += result.ok;
        report.no_response += result.no_response;
        first_submit = min_opt(first_submit, result.first_submit);
        last_resp = max_opt(last_resp, result.last_resp);
        if let Some(e) = result.error {
            report.session_errors.push(format!("session {i}: {e}"));
        }
    }
    let matcher = ctx.matcher.lock();
    report.receipts_expected = matcher.expected_total;
    report.receipts_matched = matcher.matched;
    report.receipts_missing = matcher.expected.len() as u64;
    report.receipts_unmatched = matcher.early.len() as u64;
    if let (Some(start), Some(end)) = (first_submit, last_resp) {
        report.submit_elapsed = end.saturating_duration_since(start);
        let end_to_end = if ctx.config.receipts {
            max_opt(Some(end), matcher.last_match).unwrap_or(end)
        } else {
            end
        };
        report.elapsed = end_to_end.saturating_duration_since(start);
    }
    let secs = |d: Duration| d.as_secs_f64().max(1e-9);
    report.msgs_per_sec = report.messages as f64 / secs(report.elapsed);
    report.submits_per_sec = report.submits as f64 / secs(report.submit_elapsed);
    Ok(report)
}

/// [`run`] on a new multi-threaded runtime with `threads` workers.
pub fn run_blocking(config: LoadConfig, threads: usize) -> Result<LoadReport, LoadError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("load generator runtime");
    runtime.block_on(run(config))
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn max_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

async fn bind(conn: &mut Conn, config: &LoadConfig) -> io::Result<()> {
    let creds = BindCredentials {
        system_id: &config.system_id,
        password: &config.password,
        system_type: "",
    };
    let bind = build::bind(BindKind::Transceiver, 1, &creds)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    conn.push(&bind);
    conn.flush().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        while let Some(frame) = conn.next_frame()? {
            let command =
                frame::decode_frame(frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if command.id() == CommandId::BindTransceiverResp || command.id() == CommandId::GenericNack {
                if command.status() != CommandStatus::EsmeRok {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("bind refused: {}", status_name(command.status())),
                    ));
                }
                return Ok(());
            }
        }
        if conn.eof {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before bind_resp"));
        }
        tokio::time::timeout_at(deadline, conn.fill(1 << 20))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no bind_resp"))??;
    }
}

struct InFlight {
    sent: Instant,
    dlr: bool,
}

async fn session(ctx: &Ctx, first_msg: u64, my_count: u64, result: &mut SessionResult) -> io::Result<()> {
    let config = &ctx.config;
    let stream = TcpStream::connect(config.addr).await?;
    let mut conn = Conn::new(stream);
    bind(&mut conn, config).await?;
    let start = Instant::now();
    let rate = config.rate.map(|r| r / config.sessions as f64);
    let window = config.window;
    let mut in_flight: HashMap<u32, InFlight> = HashMap::with_capacity(window * 2);
    let mut seq: u32 = 2;
    let mut next = 0u64;
    let mut last_progress = Instant::now();
    let mut udh_ref: u8 = (first_msg & 0xFF) as u8;
    let mut resp_ids: Vec<String> = Vec::new();
    let mut receipt_ids: Vec<String> = Vec::new();

    loop {
        let now = Instant::now();
        // 1. Fill the window (as far as the rate allows) into one buffer.
        let allowed = match rate {
            Some(r) => my_count.min((r * now.duration_since(start).as_secs_f64()) as u64 + 1),
            None => my_count,
        };
        while next < allowed {
            let n = first_msg + next;
            let kind = config.mix.kind(n);
            let parts = if kind == Kind::Multipart {
                ctx.bodies.multipart.len()
            } else {
                1
            };
            if !in_flight.is_empty() && in_flight.len() + parts > window {
                break;
            }
            let destination = format!("{}{:08}", config.dest_prefix, n % 100_000_000);
            let rd = u8::from(config.receipts);
            match kind {
                Kind::Gsm | Kind::Ucs2 => {
                    let (dcs, body) = if kind == Kind::Gsm {
                        (0x00, &ctx.bodies.gsm)
                    } else {
                        (0x08, &ctx.bodies.ucs2)
                    };
                    push_submit(&mut conn, seq, config, &destination, 0x00, dcs, rd, body)?;
                    in_flight.insert(
                        seq,
                        InFlight {
                            sent: now,
                            dlr: rd == 1,
                        },
                    );
                    seq = next_seq(seq);
                }
                Kind::Multipart => {
                    udh_ref = udh_ref.wrapping_add(1);
                    let total = u8::try_from(parts).unwrap_or(u8::MAX);
                    for (i, segment) in ctx.bodies.multipart.iter().enumerate() {
                        let part_no = u8::try_from(i + 1).unwrap_or(u8::MAX);
                        let mut sm = text::concat_udh_8bit(udh_ref, total, part_no).to_vec();
                        sm.extend_from_slice(segment);
                        let part_rd = if part_no == 1 { rd } else { 0 };
                        push_submit(&mut conn, seq, config, &destination, 0x40, 0x00, part_rd, &sm)?;
                        in_flight.insert(
                            seq,
                            InFlight {
                                sent: now,
                                dlr: part_rd == 1,
                            },
                        );
                        seq = next_seq(seq);
                    }
                }
            }
            result.submits += parts as u64;
            result.messages += 1;
            result.first_submit.get_or_insert(now);
            next += 1;
        }
        conn.try_flush()?;

        let sending_done = next >= my_count && in_flight.is_empty();
        if sending_done && !result.reported_done {
            result.reported_done = true;
            ctx.done.fetch_add(1, Ordering::AcqRel);
        }
        if ctx.stop.load(Ordering::Acquire) {
            break;
        }
        if !in_flight.is_empty() && now.duration_since(last_progress) > config.resp_timeout {
            // The server stopped answering: count the rest as unanswered and stop sending.
            result.no_response += in_flight.len() as u64;
            in_flight.clear();
            next = my_count;
            continue;
        }

        // 2. Wait for something to do.
        let wake = if sending_done {
            now + Duration::from_millis(10)
        } else if rate.is_some() && next < my_count && in_flight.len() < window {
            now + Duration::from_millis(1)
        } else {
            last_progress + config.resp_timeout + Duration::from_millis(1)
        };
        enum Ev {
            Read,
            Write,
            Tick,
        }
        let event = tokio::select! {
            r = conn.stream.readable() => { r?; Ev::Read }
            r = conn.stream.writable(), if !conn.wbuf.is_empty() => { r?; Ev::Write }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => Ev::Tick,
        };
        if !matches!(event, Ev::Read) {
            continue;
        }

        // 3. Drain the socket and handle every PDU in it.
        conn.try_fill(1 << 20)?;
        let now = Instant::now();
        loop {
            let frame = match conn.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => return Err(e),
            };
            let command = match frame::decode_frame(frame) {
                Ok(command) => command,
                Err(err) => {
                    if let Some(reply) = err.reply() {
                        conn.push(&reply);
                    }
                    if err.must_close() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, err.to_string()));
                    }
                    continue;
                }
            };
            let seq_no = command.sequence_number();
            match command.id() {
                CommandId::SubmitSmResp | CommandId::GenericNack => {
                    let Some(flight) = in_flight.remove(&seq_no) else {
                        continue;
                    };
                    result
                        .latency
                        .record_duration(now.saturating_duration_since(flight.sent));
                    last_progress = now;
                    result.last_resp = Some(now);
                    let status = command.status();
                    if status == CommandStatus::EsmeRok && command.id() == CommandId::SubmitSmResp {
                        result.ok += 1;
                        if flight.dlr
                            && let Some(Pdu::SubmitSmResp(resp)) = command.pdu()
                        {
                            resp_ids.push(resp.message_id().as_str().to_owned());
                        }
                    } else {
                        *result.statuses.entry(status_name(status)).or_default() += 1;
                    }
                }
                CommandId::DeliverSm => {
                    conn.push(&build::deliver_sm_resp(seq_no, CommandStatus::EsmeRok));
                    if let Some(Pdu::DeliverSm(sm)) = command.pdu()
                        && u8::from(sm.esm_class) & 0x3C != 0
                    {
                        let tlvs = KnownTlvs::read(sm.tlvs());
                        let id = tlvs.receipted_message_id.or_else(|| {
                            let text = String::from_utf8_lossy(sm.short_message().as_ref()).into_owned();
                            ReceiptText::parse(&text).ok().map(|r| r.id)
                        });
                        if let Some(id) = id {
                            receipt_ids.push(id);
                        }
                    }
                }
                CommandId::EnquireLink => conn.push(&build::enquire_link_resp(seq_no)),
                CommandId::Unbind => {
                    conn.push(&build::unbind_resp(seq_no));
                    let _ = conn.flush().await;
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "server unbound"));
                }
                _ => {}
            }
        }
        if !resp_ids.is_empty() || !receipt_ids.is_empty() {
            let mut m = ctx.matcher.lock();
            for id in resp_ids.drain(..) {
                m.expected_total += 1;
                if m.early.remove(&id) {
                    m.matched += 1;
                    m.last_match = Some(now);
                } else {
                    m.expected.insert(id);
                }
            }
            for id in receipt_ids.drain(..) {
                if m.expected.remove(&id) {
                    m.matched += 1;
                    m.last_match = Some(now);
                } else {
                    m.early.insert(id);
                }
            }
        }
        if conn.eof {
            if !in_flight.is_empty() {
                result.no_response += in_flight.len() as u64;
            }
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
    }

    // Orderly end: unbind (answers to it are not awaited).
    conn.push(&build::unbind(next_seq(seq)));
    let _ = tokio::time::timeout(Duration::from_secs(1), conn.flush()).await;
    Ok(())
}

fn next_seq(seq: u32) -> u32 {
    if seq >= 0x7FFF_FFFF { 1 } else { seq + 1 }
}

#[allow(clippy::too_many_arguments)]
fn push_submit(
    conn: &mut Conn,
    seq: u32,
    config: &LoadConfig,
    destination: &str,
    esm_class: u8,
    data_coding: u8,
    registered_delivery: u8,
    short_message: &[u8],
) -> io::Result<()> {
    let sm = ShortMessage {
        source: Address {
            ton: 1,
            npi: 1,
            addr: &config.source,
        },
        destination: Address {
            ton: 1,
            npi: 1,
            addr: destination,
        },
        esm_class,
        registered_delivery,
        data_coding,
        short_message,
        message_payload: None,
        sar: None,
    };
    let command = build::submit_sm(seq, &sm).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    conn.push(&command);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parsing_and_selection() {
        let mix = Mix::parse("gsm=2, ucs2=1,multipart=1").unwrap();
        let kinds: Vec<Kind> = (0..4).map(|n| mix.kind(n)).collect();
        assert_eq!(kinds, [Kind::Gsm, Kind::Gsm, Kind::Ucs2, Kind::Multipart]);
        assert!(Mix::parse("gsm=0").is_err());
        assert!(Mix::parse("sms=1").is_err());
        assert!(Mix::parse("gsm").is_err());
        assert_eq!(Mix::parse("multi=1").unwrap().kind(7), Kind::Multipart);
    }

    #[test]
    fn bodies_fit() {
        let b = Bodies::new();
        assert!(b.gsm.len() <= 160);
        assert!(b.ucs2.len() <= 140);
        assert_eq!(b.multipart.len(), 3);
        assert!(b.multipart.iter().all(|p| p.len() <= 153));
    }
}
