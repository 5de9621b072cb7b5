//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! Client sessions against a fake SMSC on 127.0.0.1:0.
//!
//! The fake records everything it receives (binds, submits, responses, unbind, EOF) and
//! can be told to refuse binds, answer submits with ids or errors, hold them, close the
//! connection, or inject PDUs and raw bytes. Tests wait for conditions (with a deadline),
//! never for fixed times.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use rusmpp::pdus::{AlertNotification, DataSm, SubmitSm};
use rusmpp::tlvs::MessageSubmissionRequestTlvValue;
use rusmpp::types::{AnyOctetString, COctetString};
use rusmpp::values::{DataCoding, EsmClass, MessagePayload, Npi, RegisteredDelivery, ServiceType, Ton};
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, timeout_at};
use tokio_util::codec::Decoder;

use super::*;
use crate::smpp::SmppAddress;
use crate::smpp::build::{self, Address, BindKind, ReceiptTlvs, ShortMessage};
use crate::smpp::frame::{self, DEFAULT_MAX_COMMAND_LENGTH, decode_frame, encode};

/// Longest a test waits for one condition.
const WAIT: Duration = Duration::from_secs(5);

/// Waits until `check` returns `Some`, re-checking whenever `notify` fires.
async fn eventually<T>(notify: &Notify, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(value) = check() {
            return value;
        }
        if timeout_at(deadline, notified).await.is_err() {
            panic!("timed out waiting for {what}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The fake SMSC
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubmitPolicy {
    /// submit_sm_resp ESME_ROK with a fresh message id.
    Ack,
    /// submit_sm_resp with this status.
    Status(CommandStatus),
    /// Keep them until [`Fake::release`].
    Hold,
    /// Close the connection on the first submit.
    Close,
}

#[derive(Debug, Clone)]
struct Policy {
    /// Refuse this many binds (then accept).
    refuse_binds: u32,
    refuse_status: CommandStatus,
    submit: SubmitPolicy,
    answer_enquire_link: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            refuse_binds: 0,
            refuse_status: CommandStatus::EsmeRbindfail,
            submit: SubmitPolicy::Ack,
            answer_enquire_link: true,
        }
    }
}

#[derive(Debug, Clone)]
enum Seen {
    Bind {
        conn: usize,
        kind: BindKind,
        system_id: String,
        password: String,
        at: Instant,
    },
    Submit {
        conn: usize,
        seq: u32,
        pdu: Box<SubmitSm>,
    },
    DeliverResp {
        conn: usize,
        seq: u32,
        status: u32,
    },
    DataSmResp {
        conn: usize,
        seq: u32,
        status: u32,
    },
    EnquireLink {
        conn: usize,
    },
    EnquireLinkResp {
        conn: usize,
        seq: u32,
    },
    GenericNack {
        conn: usize,
        seq: u32,
        status: u32,
    },
    Unbind {
        conn: usize,
    },
    UnbindResp {
        conn: usize,
        seq: u32,
    },
    Eof {
        conn: usize,
    },
}

enum Ctl {
    Pdus(Vec<Command>),
    Raw(Vec<u8>),
    Release,
    Close,
}

#[derive(Default)]
struct FakeState {
    policy: Mutex<Policy>,
    seen: Mutex<Vec<Seen>>,
    conns: Mutex<HashMap<usize, mpsc::UnboundedSender<Ctl>>>,
    held: Mutex<HashMap<usize, usize>>,
    max_outstanding: AtomicUsize,
    notify: Notify,
}

impl FakeState {
    fn record(&self, seen: Seen) {
        self.seen.lock().push(seen);
        self.notify.notify_waiters();
    }
}

struct Fake {
    addr: SocketAddr,
    state: Arc<FakeState>,
}

impl Fake {
    async fn start(policy: Policy) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(FakeState {
            policy: Mutex::new(policy),
            ..FakeState::default()
        });
        let accept_state = state.clone();
        tokio::spawn(async move {
            let mut next_conn = 0;
            while let Ok((stream, _)) = listener.accept().await {
                next_conn += 1;
                let (tx, rx) = mpsc::unbounded_channel();
                accept_state.conns.lock().insert(next_conn, tx);
                tokio::spawn(serve(accept_state.clone(), next_conn, stream, rx));
            }
        });
        Fake { addr, state }
    }

    fn set_policy(&self, f: impl FnOnce(&mut Policy)) {
        f(&mut self.state.policy.lock());
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().clone()
    }

    fn ctl(&self, conn: usize, ctl: Ctl) {
        if let Some(tx) = self.state.conns.lock().get(&conn) {
            let _ = tx.send(ctl);
        }
    }

    fn send(&self, conn: usize, pdus: Vec<Command>) {
        self.ctl(conn, Ctl::Pdus(pdus));
    }

    fn release(&self, conn: usize) {
        self.ctl(conn, Ctl::Release);
    }

    fn close(&self, conn: usize) {
        self.ctl(conn, Ctl::Close);
    }

    fn held(&self, conn: usize) -> usize {
        self.state.held.lock().get(&conn).copied().unwrap_or(0)
    }

    async fn wait<T>(&self, what: &str, mut check: impl FnMut(&[Seen]) -> Option<T>) -> T {
        eventually(&self.state.notify, what, || check(&self.state.seen.lock())).await
    }

    /// The binds seen so far: (conn, kind).
    fn binds(&self) -> Vec<(usize, BindKind, Instant)> {
        self.seen()
            .iter()
            .filter_map(|s| match s {
                Seen::Bind { conn, kind, at, .. } => Some((*conn, *kind, *at)),
                _ => None,
            })
            .collect()
    }

    async fn wait_binds(&self, n: usize) -> Vec<(usize, BindKind, Instant)> {
        eventually(&self.state.notify, &format!("{n} binds"), || {
            let binds = self.binds();
            (binds.len() >= n).then_some(binds)
        })
        .await
    }

    /// Sends an enquire_link and waits for its answer: everything the client wrote on
    /// `conn` before handling it has then been recorded.
    async fn sync(&self, conn: usize, seq: u32) {
        self.send(conn, vec![build::enquire_link(seq)]);
        self.wait("enquire_link_resp", |seen| {
            seen.iter()
                .any(|s| matches!(s, Seen::EnquireLinkResp { conn: c, seq: q } if *c == conn && *q == seq))
                .then_some(())
        })
        .await;
    }
}

static MESSAGE_IDS: AtomicUsize = AtomicUsize::new(1);

async fn serve(state: Arc<FakeState>, conn: usize, mut stream: TcpStream, mut ctl: mpsc::UnboundedReceiver<Ctl>) {
    let mut codec = frame::codec(DEFAULT_MAX_COMMAND_LENGTH);
    let mut rbuf = BytesMut::new();
    let mut held: Vec<u32> = Vec::new();
    let mut outstanding = 0usize;
    loop {
        let mut out = BytesMut::new();
        while let Ok(Some(frame)) = codec.decode(&mut rbuf) {
            let Ok(command) = decode_frame(frame) else {
                continue;
            };
            let seq = command.sequence_number();
            let status = u32::from(command.status());
            match command.pdu() {
                Some(Pdu::BindTransmitter(b)) => on_bind(
                    &state,
                    conn,
                    BindKind::Transmitter,
                    seq,
                    b.system_id.as_str(),
                    b.password.as_str(),
                    &mut out,
                ),
                Some(Pdu::BindReceiver(b)) => on_bind(
                    &state,
                    conn,
                    BindKind::Receiver,
                    seq,
                    b.system_id.as_str(),
                    b.password.as_str(),
                    &mut out,
                ),
                Some(Pdu::BindTransceiver(b)) => on_bind(
                    &state,
                    conn,
                    BindKind::Transceiver,
                    seq,
                    b.system_id.as_str(),
                    b.password.as_str(),
                    &mut out,
                ),
                Some(Pdu::SubmitSm(sm)) => {
                    state.record(Seen::Submit {
                        conn,
                        seq,
                        pdu: Box::new(sm.clone()),
                    });
                    outstanding += 1;
                    state.max_outstanding.fetch_max(outstanding, Ordering::SeqCst);
                    let policy = state.policy.lock().submit;
                    match policy {
                        SubmitPolicy::Ack => {
                            outstanding -= 1;
                            let id = format!("msg-{}", MESSAGE_IDS.fetch_add(1, Ordering::SeqCst));
                            encode(
                                &build::submit_sm_resp(seq, CommandStatus::EsmeRok, &id).unwrap(),
                                &mut out,
                            );
                        }
                        SubmitPolicy::Status(status) => {
                            outstanding -= 1;
                            encode(&build::submit_sm_resp(seq, status, "").unwrap(), &mut out);
                        }
                        SubmitPolicy::Hold => {
                            held.push(seq);
                            *state.held.lock().entry(conn).or_default() = held.len();
                            state.notify.notify_waiters();
                        }
                        SubmitPolicy::Close => {
                            state.record(Seen::Eof { conn });
                            return;
                        }
                    }
                }
                Some(Pdu::DeliverSmResp(_)) => state.record(Seen::DeliverResp { conn, seq, status }),
                Some(Pdu::DataSmResp(_)) => state.record(Seen::DataSmResp { conn, seq, status }),
                Some(Pdu::EnquireLink) => {
                    state.record(Seen::EnquireLink { conn });
                    if state.policy.lock().answer_enquire_link {
                        encode(&build::enquire_link_resp(seq), &mut out);
                    }
                }
                Some(Pdu::EnquireLinkResp) => state.record(Seen::EnquireLinkResp { conn, seq }),
                Some(Pdu::GenericNack) => state.record(Seen::GenericNack { conn, seq, status }),
                Some(Pdu::Unbind) => {
                    state.record(Seen::Unbind { conn });
                    encode(&build::unbind_resp(seq), &mut out);
                }
                Some(Pdu::UnbindResp) => state.record(Seen::UnbindResp { conn, seq }),
                _ if command.id() == CommandId::DeliverSmResp => state.record(Seen::DeliverResp { conn, seq, status }),
                _ => {}
            }
        }
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            state.record(Seen::Eof { conn });
            return;
        }
        tokio::select! {
            read = stream.read_buf(&mut rbuf) => {
                if !matches!(read, Ok(n) if n > 0) {
                    state.record(Seen::Eof { conn });
                    return;
                }
            }
            cmd = ctl.recv() => {
                let mut out = BytesMut::new();
                match cmd {
                    None | Some(Ctl::Close) => return,
                    Some(Ctl::Pdus(pdus)) => pdus.iter().for_each(|pdu| encode(pdu, &mut out)),
                    Some(Ctl::Raw(bytes)) => out.extend_from_slice(&bytes),
                    Some(Ctl::Release) => {
                        for seq in held.drain(..) {
                            outstanding -= 1;
                            let id = format!("msg-{}", MESSAGE_IDS.fetch_add(1, Ordering::SeqCst));
                            encode(&build::submit_sm_resp(seq, CommandStatus::EsmeRok, &id).unwrap(), &mut out);
                        }
                    }
                }
                if stream.write_all(&out).await.is_err() {
                    return;
                }
                // Only once the answers are on the wire.
                if state.held.lock().insert(conn, held.len()).is_some() {
                    state.notify.notify_waiters();
                }
            }
        }
    }
}

fn on_bind(
    state: &FakeState,
    conn: usize,
    kind: BindKind,
    seq: u32,
    system_id: &str,
    password: &str,
    out: &mut BytesMut,
) {
    state.record(Seen::Bind {
        conn,
        kind,
        system_id: system_id.to_owned(),
        password: password.to_owned(),
        at: Instant::now(),
    });
    let status = {
        let mut policy = state.policy.lock();
        if policy.refuse_binds > 0 {
            policy.refuse_binds -= 1;
            policy.refuse_status
        } else {
            CommandStatus::EsmeRok
        }
    };
    encode(&build::bind_resp(kind, seq, status, "fake-smsc").unwrap(), out);
}

// ---------------------------------------------------------------------------------------
// The event recorder
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<ClientEvent>>,
    batches: Mutex<Vec<usize>>,
    notify: Notify,
}

impl ClientEvents for Recorder {
    fn on_events(&self, events: Vec<ClientEvent>) {
        assert!(!events.is_empty(), "empty batches are never reported");
        self.batches.lock().push(events.len());
        self.events.lock().extend(events);
        self.notify.notify_waiters();
    }
}

impl Recorder {
    fn events(&self) -> Vec<ClientEvent> {
        self.events.lock().clone()
    }

    fn results(&self) -> Vec<(u64, Result<String, SubmitFailure>)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                ClientEvent::SubmitResult { token, result } => Some((token, result)),
                _ => None,
            })
            .collect()
    }

    fn count(&self, pred: impl Fn(&ClientEvent) -> bool) -> usize {
        self.events.lock().iter().filter(|e| pred(e)).count()
    }

    fn ups(&self) -> usize {
        self.count(|e| matches!(e, ClientEvent::Up))
    }

    fn downs(&self) -> usize {
        self.count(|e| matches!(e, ClientEvent::Down { .. }))
    }

    async fn wait<T>(&self, what: &str, mut check: impl FnMut(&[ClientEvent]) -> Option<T>) -> T {
        eventually(&self.notify, what, || check(&self.events.lock())).await
    }

    async fn wait_ups(&self, n: usize) {
        self.wait(&format!("{n} Up events"), |events| {
            (events.iter().filter(|e| matches!(e, ClientEvent::Up)).count() >= n).then_some(())
        })
        .await;
    }

    async fn wait_downs(&self, n: usize) -> String {
        self.wait(&format!("{n} Down events"), |events| {
            let reasons: Vec<&String> = events
                .iter()
                .filter_map(|e| match e {
                    ClientEvent::Down { reason } => Some(reason),
                    _ => None,
                })
                .collect();
            (reasons.len() >= n).then(|| reasons[n - 1].clone())
        })
        .await
    }

    /// Waits until every token has a result; returns each token's results.
    async fn wait_results(&self, tokens: &[u64]) -> HashMap<u64, Vec<Result<String, SubmitFailure>>> {
        self.wait("submit results", |events| {
            let mut by_token: HashMap<u64, Vec<Result<String, SubmitFailure>>> = HashMap::new();
            for e in events {
                if let ClientEvent::SubmitResult { token, result } = e {
                    by_token.entry(*token).or_default().push(result.clone());
                }
            }
            tokens.iter().all(|t| by_token.contains_key(t)).then_some(by_token)
        })
        .await
    }

    async fn wait_delivers(&self, n: usize) -> Vec<(InboundDeliver, DeliverAck)> {
        self.wait(&format!("{n} deliveries"), |events| {
            let delivers: Vec<(InboundDeliver, DeliverAck)> = events
                .iter()
                .filter_map(|e| match e {
                    ClientEvent::Deliver { pdu, ack } => Some((pdu.clone(), *ack)),
                    _ => None,
                })
                .collect();
            (delivers.len() >= n).then_some(delivers)
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Waits until the session tasks have ended: they hold the event sink while they run.
async fn wait_tasks_ended(recorder: &Arc<Recorder>) {
    let deadline = Instant::now() + WAIT;
    while Arc::strong_count(recorder) > 1 {
        assert!(Instant::now() < deadline, "session tasks still running");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn config(addr: SocketAddr, bind: BindMode) -> ClientConfig {
    ClientConfig {
        name: "test-destination".into(),
        host: addr.ip().to_string(),
        port: addr.port(),
        system_id: "sendium".into(),
        password: "pw".into(),
        system_type: String::new(),
        bind,
        window: 10,
        max_tps: 0,
        enquire_link_interval: Duration::from_secs(30),
        response_timeout: Duration::from_millis(300),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
        max_command_length: 0,
        tls: None,
    }
}

fn start(config: ClientConfig) -> (SmppClient, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let client = SmppClient::start(config, recorder.clone());
    (client, recorder)
}

fn part(text: &[u8]) -> OutboundSubmit {
    OutboundSubmit {
        service_type: String::new(),
        source: SmppAddress::new(5, 0, "Sendium"),
        destination: SmppAddress::new(1, 1, "447700900123"),
        esm_class: 0x03,
        protocol_id: 0,
        priority_flag: 0,
        registered_delivery: 1,
        data_coding: 0,
        short_message: text.to_vec(),
        schedule_delivery_time: None,
    }
}

fn batch(tokens: std::ops::RangeInclusive<u64>) -> Vec<(u64, OutboundSubmit)> {
    tokens.map(|t| (t, part(format!("message {t}").as_bytes()))).collect()
}

fn receipt(seq: u32, id: &str) -> Command {
    let text = format!("id:{id} sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000");
    let sm = ShortMessage {
        source: Address {
            ton: 1,
            npi: 1,
            addr: "447700900123",
        },
        destination: Address {
            ton: 5,
            npi: 0,
            addr: "Sendium",
        },
        esm_class: 0x04,
        registered_delivery: 0,
        data_coding: 0,
        short_message: text.as_bytes(),
        message_payload: None,
        sar: None,
    };
    let tlvs = ReceiptTlvs {
        receipted_message_id: id,
        message_state: 2,
    };
    build::deliver_sm(seq, &sm, Some(&tlvs)).unwrap()
}

fn one_result(results: &HashMap<u64, Vec<Result<String, SubmitFailure>>>, token: u64) -> Result<String, SubmitFailure> {
    let list = &results[&token];
    assert_eq!(list.len(), 1, "token {token} got {list:?}");
    list[0].clone()
}

fn submits_on(seen: &[Seen], conn: usize) -> Vec<(u32, SubmitSm)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Submit { conn: c, seq, pdu } if *c == conn => Some((*seq, (**pdu).clone())),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transceiver_binds_and_submits() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    assert!(client.is_up());
    let binds = fake.seen();
    assert!(matches!(
        &binds[0],
        Seen::Bind { kind: BindKind::Transceiver, system_id, password, .. } if system_id == "sendium" && password == "pw"
    ));

    let mut submits = batch(1..=3);
    let long = vec![b'x'; 300];
    submits.push((4, part(&long)));
    client.submit(submits);
    let results = events.wait_results(&[1, 2, 3, 4]).await;
    for token in 1..=4 {
        let id = one_result(&results, token).unwrap();
        assert!(id.starts_with("msg-"), "{id}");
    }

    let seen = fake.seen();
    let wire = submits_on(&seen, 1);
    assert_eq!(wire.len(), 4);
    // Sequence numbers continue after the bind's 1.
    assert_eq!(wire.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
    let (_, first) = &wire[0];
    assert_eq!(u8::from(first.esm_class), 0x03);
    assert_eq!(u8::from(first.registered_delivery), 1);
    assert_eq!(first.source_addr.as_str(), "Sendium");
    assert_eq!(first.destination_addr.as_str(), "447700900123");
    assert_eq!(&first.short_message()[..], b"message 1");
    let (_, long_pdu) = &wire[3];
    assert!(long_pdu.short_message().is_empty(), "long text goes in message_payload");
    let payload = long_pdu.tlvs().iter().find_map(|tlv| match tlv.value() {
        Some(rusmpp::tlvs::TlvValue::MessagePayload(p)) => Some(p.value.to_vec()),
        _ => None,
    });
    assert_eq!(payload.as_deref(), Some(&long[..]));
    assert_eq!(events.downs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transmitter_receiver_submits_on_one_session_and_receives_on_the_other() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::TransmitterReceiver));
    events.wait_ups(1).await;
    let binds = fake.wait_binds(2).await;
    let tx_conn = binds.iter().find(|b| b.1 == BindKind::Transmitter).unwrap().0;
    let rx_conn = binds.iter().find(|b| b.1 == BindKind::Receiver).unwrap().0;
    assert_ne!(tx_conn, rx_conn);

    client.submit(batch(1..=2));
    let results = events.wait_results(&[1, 2]).await;
    let id = one_result(&results, 1).unwrap();
    let seen = fake.seen();
    assert_eq!(submits_on(&seen, tx_conn).len(), 2);
    assert!(submits_on(&seen, rx_conn).is_empty());

    fake.send(rx_conn, vec![receipt(700, &id)]);
    let delivers = events.wait_delivers(1).await;
    let (pdu, ack) = &delivers[0];
    assert_eq!(pdu.receipted_message_id.as_deref(), Some(id.as_str()));
    assert_eq!(pdu.message_state, Some(2));
    assert_eq!(pdu.esm_class, 0x04);
    client.ack(vec![(*ack, 0)]);
    fake.wait("deliver_sm_resp on the receiver", |seen| {
        seen.iter()
            .any(|s| matches!(s, Seen::DeliverResp { conn, seq: 700, status: 0 } if *conn == rx_conn))
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_is_respected() {
    let fake = Fake::start(Policy {
        submit: SubmitPolicy::Hold,
        ..Policy::default()
    })
    .await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.window = 3;
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    client.submit(batch(1..=10));
    let mut answered = 0;
    while answered < 10 {
        let expect = (10 - answered).min(3);
        // Submits are counted as they arrive (a monotonic count, unlike what is held).
        fake.wait("a full window at the SMSC", |seen| {
            (submits_on(seen, 1).len() == answered + expect).then_some(())
        })
        .await;
        fake.release(1);
        answered += expect;
        events
            .wait("the released results", |e| {
                (e.iter()
                    .filter(|e| matches!(e, ClientEvent::SubmitResult { .. }))
                    .count()
                    >= answered)
                    .then_some(())
            })
            .await;
    }
    let results = events.wait_results(&(1..=10).collect::<Vec<_>>()).await;
    assert!((1..=10).all(|t| one_result(&results, t).is_ok()));
    assert_eq!(fake.state.max_outstanding.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tps_is_respected() {
    let fake = Fake::start(Policy::default()).await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.max_tps = 20;
    cfg.window = 100;
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    let started = Instant::now();
    client.submit(batch(1..=11));
    let results = events.wait_results(&(1..=11).collect::<Vec<_>>()).await;
    let elapsed = started.elapsed();
    assert!((1..=11).all(|t| one_result(&results, t).is_ok()));
    // One token to start with, then one every 50 ms: 10 × 50 ms.
    assert!(
        elapsed >= Duration::from_millis(450),
        "11 submits at 20 tps took {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_statuses_are_reported_and_classified() {
    let fake = Fake::start(Policy {
        submit: SubmitPolicy::Status(CommandStatus::EsmeRthrottled),
        ..Policy::default()
    })
    .await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    client.submit(batch(1..=1));
    let results = events.wait_results(&[1]).await;
    let failure = one_result(&results, 1).unwrap_err();
    assert_eq!(failure, SubmitFailure::Status(0x58));
    assert!(failure.is_transient());
    assert_eq!(failure.label(), "throttled");
    assert_eq!(failure.status(), Some(0x58));

    fake.set_policy(|p| p.submit = SubmitPolicy::Status(CommandStatus::EsmeRinvdstadr));
    client.submit(batch(2..=2));
    let results = events.wait_results(&[2]).await;
    let failure = one_result(&results, 2).unwrap_err();
    assert_eq!(failure, SubmitFailure::Status(0x0B));
    assert!(!failure.is_transient());

    // A part we cannot encode fails permanently without reaching the SMSC.
    let mut bad = part(b"x");
    bad.destination.addr = "1".repeat(25);
    client.submit(vec![(3, bad)]);
    let results = events.wait_results(&[3]).await;
    assert_eq!(one_result(&results, 3), Err(SubmitFailure::Status(0x0B)));
    assert_eq!(submits_on(&fake.seen(), 1).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_submit_times_out_and_a_late_response_is_ignored() {
    let fake = Fake::start(Policy {
        submit: SubmitPolicy::Hold,
        ..Policy::default()
    })
    .await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.response_timeout = Duration::from_millis(150);
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    let sent = Instant::now();
    client.submit(batch(1..=1));
    let results = events.wait_results(&[1]).await;
    assert_eq!(one_result(&results, 1), Err(SubmitFailure::Timeout));
    assert!(sent.elapsed() >= Duration::from_millis(150));

    // The late answer, then a fresh submit: its result comes after the late one was read.
    fake.set_policy(|p| p.submit = SubmitPolicy::Ack);
    fake.release(1);
    eventually(&fake.state.notify, "the late answer written", || {
        (fake.held(1) == 0).then_some(())
    })
    .await;
    client.submit(batch(2..=2));
    let results = events.wait_results(&[2]).await;
    assert!(one_result(&results, 2).is_ok());
    assert_eq!(one_result(&results, 1), Err(SubmitFailure::Timeout));
    assert_eq!(events.downs(), 0);
    assert!(client.is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_fails_everything_outstanding_once_and_reconnects_with_backoff() {
    let fake = Fake::start(Policy {
        submit: SubmitPolicy::Hold,
        ..Policy::default()
    })
    .await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.window = 3;
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    // Three in the window, two queued behind it.
    client.submit(batch(1..=5));
    eventually(&fake.state.notify, "a full window", || {
        (fake.held(1) == 3).then_some(())
    })
    .await;
    let closed_at = Instant::now();
    fake.close(1);

    let reason = events.wait_downs(1).await;
    assert!(reason.contains("closed"), "{reason}");
    let results = events.wait_results(&(1..=5).collect::<Vec<_>>()).await;
    for token in 1..=5 {
        assert_eq!(one_result(&results, token), Err(SubmitFailure::Disconnected));
    }
    assert!(!client.is_up());

    fake.set_policy(|p| p.submit = SubmitPolicy::Ack);
    events.wait_ups(2).await;
    let binds = fake.wait_binds(2).await;
    assert!(
        binds[1].2 - closed_at >= Duration::from_millis(50),
        "reconnected after the minimum backoff"
    );
    assert!(client.is_up());
    client.submit(batch(6..=6));
    let results = events.wait_results(&[6]).await;
    assert!(one_result(&results, 6).is_ok());
    // Still exactly one result for each of the first five.
    let results = events.results();
    for token in 1..=5 {
        assert_eq!(results.iter().filter(|(t, _)| *t == token).count(), 1);
    }
    assert_eq!(events.downs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_on_submit_reports_disconnected() {
    let fake = Fake::start(Policy {
        submit: SubmitPolicy::Close,
        ..Policy::default()
    })
    .await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    client.submit(batch(1..=2));
    let results = events.wait_results(&[1, 2]).await;
    assert_eq!(one_result(&results, 1), Err(SubmitFailure::Disconnected));
    assert_eq!(one_result(&results, 2), Err(SubmitFailure::Disconnected));
    events.wait_downs(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_refused_then_accepted() {
    let fake = Fake::start(Policy {
        refuse_binds: 2,
        ..Policy::default()
    })
    .await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    // Not bound yet: refused at once, from submit() itself.
    client.submit(batch(1..=2));
    assert_eq!(
        events.results(),
        vec![(1, Err(SubmitFailure::NotBound)), (2, Err(SubmitFailure::NotBound))]
    );
    events.wait_ups(1).await;
    let binds = fake.binds();
    assert_eq!(binds.len(), 3);
    assert!(binds[1].2 - binds[0].2 >= Duration::from_millis(50));
    assert!(binds[2].2 - binds[1].2 >= Duration::from_millis(50));
    assert_eq!(events.downs(), 0, "never up before, so no Down");
    client.submit(batch(3..=3));
    assert!(one_result(&events.wait_results(&[3]).await, 3).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiver_only_client_never_takes_submits() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Receiver));
    let binds = fake.wait_binds(1).await;
    assert_eq!(binds[0].1, BindKind::Receiver);
    client.submit(batch(1..=1));
    assert_eq!(events.results(), vec![(1, Err(SubmitFailure::NotBound))]);
    assert!(!client.is_up());
    fake.send(1, vec![receipt(5, "abc")]);
    let delivers = events.wait_delivers(1).await;
    client.ack(vec![(delivers[0].1, 0)]);
    fake.wait("deliver_sm_resp", |seen| {
        seen.iter()
            .any(|s| matches!(s, Seen::DeliverResp { seq: 5, .. }))
            .then_some(())
    })
    .await;
    assert_eq!(events.ups(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_sm_is_answered_only_when_acked() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;

    fake.send(1, vec![receipt(500, "abc123")]);
    let delivers = events.wait_delivers(1).await;
    let (pdu, ack) = &delivers[0];
    assert_eq!(pdu.receipted_message_id.as_deref(), Some("abc123"));
    assert_eq!(pdu.message_state, Some(2));
    assert_eq!(pdu.esm_class, 0x04);
    assert_eq!(pdu.source, SmppAddress::new(1, 1, "447700900123"));
    assert_eq!(pdu.destination, SmppAddress::new(5, 0, "Sendium"));
    assert!(pdu.short_message.starts_with(b"id:abc123 "));
    assert_eq!(pdu.message_payload, None);

    // The client has handled everything up to a later enquire_link: still no resp.
    fake.sync(1, 501).await;
    assert!(!fake.seen().iter().any(|s| matches!(s, Seen::DeliverResp { .. })));

    client.ack(vec![(*ack, 0x58)]);
    fake.wait("deliver_sm_resp with the owner's status", |seen| {
        seen.iter()
            .any(|s| {
                matches!(
                    s,
                    Seen::DeliverResp {
                        seq: 500,
                        status: 0x58,
                        ..
                    }
                )
            })
            .then_some(())
    })
    .await;

    // An ack for a session that has closed since is dropped.
    fake.send(1, vec![receipt(502, "def")]);
    let stale = events.wait_delivers(2).await[1].1;
    fake.close(1);
    events.wait_ups(2).await;
    let binds = fake.wait_binds(2).await;
    let new_conn = binds[1].0;
    client.ack(vec![(stale, 0)]);
    fake.sync(new_conn, 503).await;
    assert!(
        !fake
            .seen()
            .iter()
            .any(|s| matches!(s, Seen::DeliverResp { conn, .. } if *conn == new_conn))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_read_together_are_reported_as_one_batch() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    let batches_before = events.batches.lock().len();
    // One write of five PDUs.
    fake.send(1, (0..5).map(|i| receipt(600 + i, &format!("id{i}"))).collect());
    let delivers = events.wait_delivers(5).await;
    let batches = events.batches.lock()[batches_before..].to_vec();
    assert_eq!(batches, vec![5], "one on_events call for one read");
    // Acks for all five in one call.
    client.ack(delivers.iter().map(|(_, ack)| (*ack, 0)).collect());
    fake.wait("five deliver_sm_resp", |seen| {
        (seen.iter().filter(|s| matches!(s, Seen::DeliverResp { .. })).count() == 5).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sm_is_delivered_and_alert_notification_ignored() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;

    let alert = AlertNotification::new(
        Ton::International,
        Npi::Isdn,
        COctetString::from_str("447700900123").unwrap(),
        Ton::Unknown,
        Npi::Unknown,
        COctetString::from_str("Sendium").unwrap(),
        None,
    );
    let data = DataSm::builder()
        .service_type(ServiceType::null())
        .source_addr_ton(Ton::International)
        .source_addr_npi(Npi::Isdn)
        .source_addr(COctetString::from_str("447700900123").unwrap())
        .dest_addr_ton(Ton::Unknown)
        .dest_addr_npi(Npi::Unknown)
        .destination_addr(COctetString::from_str("Sendium").unwrap())
        .esm_class(EsmClass::from(0x04))
        .registered_delivery(RegisteredDelivery::from(0))
        .data_coding(DataCoding::from(0))
        .push_tlv(MessageSubmissionRequestTlvValue::MessagePayload(MessagePayload::new(
            AnyOctetString::from_static_slice(b"id:xyz stat:DELIVRD err:000"),
        )))
        .build();
    // receipted_message_id and message_state are not submission TLVs in rusmpp's model:
    // append them as raw bytes and fix command_length.
    let mut wire = BytesMut::new();
    encode(
        &Command::new(CommandStatus::EsmeRok, 800, Pdu::AlertNotification(alert)),
        &mut wire,
    );
    let mut data_wire = BytesMut::new();
    encode(&Command::new(CommandStatus::EsmeRok, 801, data), &mut data_wire);
    data_wire.extend_from_slice(&[
        0x00, 0x1E, 0x00, 0x04, b'x', b'y', b'z', 0, 0x04, 0x27, 0x00, 0x01, 0x02,
    ]);
    let len = u32::try_from(data_wire.len()).unwrap().to_be_bytes();
    data_wire[..4].copy_from_slice(&len);
    wire.extend_from_slice(&data_wire);
    fake.ctl(1, Ctl::Raw(wire.to_vec()));

    let delivers = events.wait_delivers(1).await;
    let (pdu, ack) = &delivers[0];
    assert_eq!(
        pdu.message_payload.as_deref(),
        Some(&b"id:xyz stat:DELIVRD err:000"[..])
    );
    assert!(pdu.short_message.is_empty());
    assert_eq!(pdu.receipted_message_id.as_deref(), Some("xyz"));
    assert_eq!(pdu.message_state, Some(2));
    client.ack(vec![(*ack, 0)]);
    fake.wait("data_sm_resp", |seen| {
        seen.iter()
            .any(|s| {
                matches!(
                    s,
                    Seen::DataSmResp {
                        conn: 1,
                        seq: 801,
                        status: 0
                    }
                )
            })
            .then_some(())
    })
    .await;
    // alert_notification has no response and did not disturb the session.
    assert!(!fake.seen().iter().any(|s| matches!(s, Seen::GenericNack { .. })));
    assert_eq!(events.downs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enquire_link_from_the_smsc_is_answered() {
    let fake = Fake::start(Policy::default()).await;
    let (_client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    fake.sync(1, 77).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_sends_enquire_link_and_stays_up_when_answered() {
    let fake = Fake::start(Policy::default()).await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.enquire_link_interval = Duration::from_millis(60);
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    fake.wait("three enquire_links", |seen| {
        (seen.iter().filter(|s| matches!(s, Seen::EnquireLink { .. })).count() >= 3).then_some(())
    })
    .await;
    assert_eq!(events.downs(), 0);
    assert!(client.is_up());
    assert_eq!(fake.binds().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_peer_is_detected_by_enquire_link() {
    let fake = Fake::start(Policy {
        answer_enquire_link: false,
        ..Policy::default()
    })
    .await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.enquire_link_interval = Duration::from_millis(100);
    cfg.response_timeout = Duration::from_millis(150);
    let (client, events) = start(cfg);
    events.wait_ups(1).await;
    let reason = events.wait_downs(1).await;
    assert!(reason.contains("enquire_link"), "{reason}");
    assert!(
        fake.seen().iter().any(|s| matches!(s, Seen::EnquireLink { conn: 1 })),
        "the client probed before giving up"
    );
    fake.wait("the dead session closed", |seen| {
        seen.iter().any(|s| matches!(s, Seen::Eof { conn: 1 })).then_some(())
    })
    .await;
    events.wait_ups(2).await;
    assert!(client.is_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_unbinds_and_closes() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::TransmitterReceiver));
    events.wait_ups(1).await;
    fake.wait_binds(2).await;
    let other = client.clone();
    drop(client);
    // One handle left: still bound.
    fake.sync(1, 900).await;
    assert!(other.is_up());
    assert!(!fake.seen().iter().any(|s| matches!(s, Seen::Unbind { .. })));

    drop(other);
    fake.wait("unbind and EOF on both sessions", |seen| {
        let unbinds = seen.iter().filter(|s| matches!(s, Seen::Unbind { .. })).count();
        let eofs = seen.iter().filter(|s| matches!(s, Seen::Eof { .. })).count();
        (unbinds == 2 && eofs == 2).then_some(())
    })
    .await;
    // Unbind came before EOF on each connection.
    let seen = fake.seen();
    for conn in [1, 2] {
        let unbind = seen
            .iter()
            .position(|s| matches!(s, Seen::Unbind { conn: c } if *c == conn));
        let eof = seen
            .iter()
            .position(|s| matches!(s, Seen::Eof { conn: c } if *c == conn));
        assert!(unbind < eof, "conn {conn}");
    }
    wait_tasks_ended(&events).await;
    assert_eq!(events.downs(), 0, "a client that ends reports nothing");
    assert_eq!(fake.binds().len(), 2, "no reconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_unbinds_and_later_submits_are_not_bound() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    client.stop();
    assert!(!client.is_up());
    client.submit(batch(1..=1));
    assert_eq!(events.results(), vec![(1, Err(SubmitFailure::NotBound))]);
    fake.wait("unbind then EOF", |seen| {
        let unbind = seen.iter().position(|s| matches!(s, Seen::Unbind { .. }))?;
        let eof = seen.iter().position(|s| matches!(s, Seen::Eof { .. }))?;
        (unbind < eof).then_some(())
    })
    .await;
    assert_eq!(fake.binds().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_backoff_ends_the_task() {
    let fake = Fake::start(Policy {
        refuse_binds: u32::MAX,
        ..Policy::default()
    })
    .await;
    let mut cfg = config(fake.addr, BindMode::Transceiver);
    cfg.reconnect_min = Duration::from_millis(400);
    cfg.reconnect_max = Duration::from_millis(400);
    let (client, recorder) = start(cfg);
    fake.wait_binds(1).await;
    fake.wait("the refused session closed", |seen| {
        seen.iter().any(|s| matches!(s, Seen::Eof { .. })).then_some(())
    })
    .await;
    drop(client);
    wait_tasks_ended(&recorder).await;
    assert_eq!(fake.binds().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_generic_nack_and_the_session_continues() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    // An unknown command id, then a deliver_sm whose body is cut short.
    let mut raw = vec![0, 0, 0, 16, 0, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 42];
    let mut short = BytesMut::new();
    encode(&receipt(43, "abc"), &mut short);
    short.truncate(30);
    short[..4].copy_from_slice(&30u32.to_be_bytes());
    raw.extend_from_slice(&short);
    fake.ctl(1, Ctl::Raw(raw));
    fake.wait("two generic_nacks", |seen| {
        let has = |seq, status| {
            seen.iter()
                .any(|s| matches!(s, Seen::GenericNack { conn: 1, seq: q, status: st } if *q == seq && *st == status))
        };
        (has(42, 0x03) && seen.iter().any(|s| matches!(s, Seen::GenericNack { seq: 43, .. }))).then_some(())
    })
    .await;
    client.submit(batch(1..=1));
    assert!(one_result(&events.wait_results(&[1]).await, 1).is_ok());
    assert_eq!(fake.binds().len(), 1);
    assert_eq!(events.downs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frame_closes_and_reconnects() {
    let fake = Fake::start(Policy::default()).await;
    let (_client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    let mut raw = Vec::new();
    raw.extend_from_slice(&100_000u32.to_be_bytes());
    raw.extend_from_slice(&[0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 44]);
    fake.ctl(1, Ctl::Raw(raw));
    fake.wait("generic_nack ESME_RINVCMDLEN", |seen| {
        seen.iter()
            .any(|s| {
                matches!(
                    s,
                    Seen::GenericNack {
                        seq: 44,
                        status: 0x02,
                        ..
                    }
                )
            })
            .then_some(())
    })
    .await;
    let reason = events.wait_downs(1).await;
    assert!(reason.contains("max_command_length"), "{reason}");
    events.wait_ups(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbind_from_the_smsc_is_answered_then_reconnects() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    fake.send(1, vec![build::unbind(9)]);
    fake.wait("unbind_resp", |seen| {
        seen.iter()
            .any(|s| matches!(s, Seen::UnbindResp { conn: 1, seq: 9 }))
            .then_some(())
    })
    .await;
    let reason = events.wait_downs(1).await;
    assert!(reason.contains("unbound"), "{reason}");
    events.wait_ups(2).await;
    assert!(client.is_up());
}

#[test]
fn debug_output_hides_the_password() {
    let cfg = config("127.0.0.1:1".parse().unwrap(), BindMode::Transceiver);
    let text = format!("{cfg:?}");
    assert!(!text.contains("\"pw\""), "{text}");
    assert!(text.contains("redacted"));
}

#[test]
fn start_outside_a_runtime_stays_down() {
    let recorder = Arc::new(Recorder::default());
    let client = SmppClient::start(
        config("127.0.0.1:1".parse().unwrap(), BindMode::Transceiver),
        recorder.clone(),
    );
    assert!(!client.is_up());
    client.submit(batch(1..=1));
    assert_eq!(recorder.results(), vec![(1, Err(SubmitFailure::NotBound))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acker_answers_without_keeping_the_client_alive() {
    let fake = Fake::start(Policy::default()).await;
    let (client, events) = start(config(fake.addr, BindMode::Transceiver));
    events.wait_ups(1).await;
    let acker = client.acker();
    fake.send(1, vec![receipt(40, "a"), receipt(41, "b")]);
    let delivers = events.wait_delivers(2).await;
    acker.ack(vec![(delivers[0].1, 0)]);
    fake.wait("deliver_sm_resp via the acker", |seen| {
        seen.iter()
            .any(|s| matches!(s, Seen::DeliverResp { seq: 40, .. }))
            .then_some(())
    })
    .await;
    drop(client);
    fake.wait("unbind", |seen| {
        seen.iter().any(|s| matches!(s, Seen::Unbind { .. })).then_some(())
    })
    .await;
    wait_tasks_ended(&events).await;
    acker.ack(vec![(delivers[1].1, 0)]);
    assert!(
        !fake
            .seen()
            .iter()
            .any(|s| matches!(s, Seen::DeliverResp { seq: 41, .. }))
    );
}
