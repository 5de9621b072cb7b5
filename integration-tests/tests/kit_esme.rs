//! The test ESME against a tiny fake SMPP server written here with frame/build only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use sendium_integration_tests::esme::{BindError, Concat, DlrParts, DlrReply, EsmeOptions, SubmitSpec, TestEsme};
use sendium_integration_tests::wire::{KnownTlvs, encode_to_vec, parse_udh};
use sendium_protocols::receipt::{ReceiptState, ReceiptText};
use sendium_protocols::smpp::build::{self, Address, BindKind, ReceiptTlvs, ShortMessage};
use sendium_protocols::smpp::frame;
use sendium_protocols::text::{self, Alphabet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::Decoder;

const WAIT: Duration = Duration::from_secs(5);

#[derive(Clone, Copy)]
struct FakeOptions {
    bind_status: CommandStatus,
    /// Send a receipt for every submit with registered_delivery 1.
    receipts: bool,
    /// Hold responses until this many submits are outstanding (or 100 ms pass idle).
    hold: Option<usize>,
}

impl Default for FakeOptions {
    fn default() -> Self {
        FakeOptions {
            bind_status: CommandStatus::EsmeRok,
            receipts: true,
            hold: None,
        }
    }
}

#[derive(Default)]
struct FakeState {
    submits: Vec<Command>,
    deliver_resps: Vec<(u32, CommandStatus)>,
    max_outstanding: usize,
    other: Vec<CommandId>,
}

enum Push {
    Bytes(Vec<u8>),
    Close,
}

struct Fake {
    addr: SocketAddr,
    state: Arc<Mutex<FakeState>>,
    push: mpsc::UnboundedSender<Push>,
}

impl Fake {
    async fn start(options: FakeOptions) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(FakeState::default()));
        let (push, rx) = mpsc::unbounded_channel();
        let s = state.clone();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            serve(stream, options, s, rx).await;
        });
        Fake { addr, state, push }
    }
}

fn receipt_for(seq: u32, submit: &rusmpp::pdus::SubmitSm, id: &str) -> Command {
    let text = ReceiptText {
        id: id.to_owned(),
        sub: 1,
        dlvrd: 1,
        submit_date: Some("2401011200".into()),
        done_date: Some("2401011201".into()),
        stat: ReceiptState::Delivered,
        err: "000".into(),
        text: String::new(),
    }
    .format();
    let sm = ShortMessage {
        source: Address {
            ton: 1,
            npi: 1,
            addr: submit.destination_addr.as_str(),
        },
        destination: Address {
            ton: 1,
            npi: 1,
            addr: submit.source_addr.as_str(),
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

async fn serve(
    mut stream: TcpStream,
    options: FakeOptions,
    state: Arc<Mutex<FakeState>>,
    mut push: mpsc::UnboundedReceiver<Push>,
) {
    let mut codec = frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH);
    let mut buf = BytesMut::new();
    let mut held: Vec<Command> = Vec::new();
    let mut deliver_seq = 1000;
    loop {
        let mut out = BytesMut::new();
        let idle = tokio::time::sleep(Duration::from_millis(100));
        let mut idle_fired = false;
        tokio::select! {
            r = stream.read_buf(&mut buf) => {
                if matches!(r, Ok(0) | Err(_)) {
                    return;
                }
            }
            p = push.recv() => match p {
                Some(Push::Bytes(b)) => { stream.write_all(&b).await.unwrap(); continue; }
                Some(Push::Close) | None => return,
            },
            _ = idle, if !held.is_empty() => idle_fired = true,
        }
        while let Some(f) = codec.decode(&mut buf).unwrap() {
            let command = frame::decode_frame(f);
            let command = match command {
                Ok(c) => c,
                Err(e) => {
                    if let Some(reply) = e.reply() {
                        frame::encode(&reply, &mut out);
                    }
                    continue;
                }
            };
            let seq = command.sequence_number();
            match command.id() {
                CommandId::BindTransceiver | CommandId::BindTransmitter | CommandId::BindReceiver => {
                    let kind = BindKind::from_command_id(command.id()).unwrap();
                    frame::encode(
                        &build::bind_resp(kind, seq, options.bind_status, "fake").unwrap(),
                        &mut out,
                    );
                }
                CommandId::SubmitSm => {
                    state.lock().submits.push(command.clone());
                    held.push(command);
                }
                CommandId::DeliverSmResp => state.lock().deliver_resps.push((seq, command.status())),
                CommandId::EnquireLink => frame::encode(&build::enquire_link_resp(seq), &mut out),
                CommandId::Unbind => frame::encode(&build::unbind_resp(seq), &mut out),
                other => state.lock().other.push(other),
            }
        }
        // Hold mode: answer when the window is full or nothing arrived for 100 ms.
        let release = match options.hold {
            None => true,
            Some(n) => held.len() >= n || idle_fired,
        };
        if release && !held.is_empty() {
            {
                let mut s = state.lock();
                s.max_outstanding = s.max_outstanding.max(held.len());
            }
            for submit in held.drain(..) {
                let seq = submit.sequence_number();
                let id = format!("M{seq}");
                frame::encode(
                    &build::submit_sm_resp(seq, CommandStatus::EsmeRok, &id).unwrap(),
                    &mut out,
                );
                if let Some(Pdu::SubmitSm(sm)) = submit.pdu()
                    && options.receipts
                    && u8::from(sm.registered_delivery) & 1 == 1
                {
                    deliver_seq += 1;
                    frame::encode(&receipt_for(deliver_seq, sm, &id), &mut out);
                }
            }
        }
        if !out.is_empty() {
            stream.write_all(&out).await.unwrap();
        }
    }
}

#[tokio::test]
async fn bind_ok_and_rejected() {
    let fake = Fake::start(FakeOptions::default()).await;
    let esme = TestEsme::bind(fake.addr, "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    assert_eq!(esme.kind(), BindKind::Transceiver);
    assert_eq!(esme.enquire_link().await.unwrap(), CommandStatus::EsmeRok);
    assert_eq!(esme.unbind().await.unwrap(), CommandStatus::EsmeRok);

    let fake = Fake::start(FakeOptions {
        bind_status: CommandStatus::EsmeRinvpaswd,
        ..FakeOptions::default()
    })
    .await;
    let err = TestEsme::bind(fake.addr, "esme1", "bad", BindKind::Transmitter)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(CommandStatus::EsmeRinvpaswd));

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    assert!(matches!(
        TestEsme::bind(addr, "a", "b", BindKind::Transceiver).await,
        Err(BindError::Io(_))
    ));
}

#[tokio::test]
async fn submit_and_receipts_are_acknowledged() {
    let fake = Fake::start(FakeOptions::default()).await;
    let esme = TestEsme::bind(fake.addr, "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let resp = esme
        .submit(&SubmitSpec::gsm("12345", "447700900123", "hello").dlr())
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(resp.message_id.starts_with('M'));
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts.len(), 1);
    let r = &receipts[0];
    assert_eq!(r.message_id(), Some(resp.message_id.as_str()));
    assert_eq!(r.id.as_deref(), Some(resp.message_id.as_str()));
    assert_eq!(r.state(), Some(ReceiptState::Delivered));
    assert_eq!((r.message_state, r.esm_class), (Some(2), 0x04));
    assert_eq!((r.source.as_str(), r.destination.as_str()), ("447700900123", "12345"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        fake.state.lock().deliver_resps,
        [(r.sequence_number, CommandStatus::EsmeRok)]
    );

    // What the server saw is exactly what the spec said.
    let submits = fake.state.lock().submits.clone();
    let Some(Pdu::SubmitSm(sm)) = submits[0].pdu() else {
        panic!()
    };
    assert_eq!(u8::from(sm.esm_class), 0);
    assert_eq!(u8::from(sm.registered_delivery), 1);
    assert_eq!(
        sm.short_message().as_ref(),
        text::encode(Alphabet::Gsm7, "hello").unwrap()
    );
}

#[tokio::test]
async fn dlr_reply_modes() {
    let fake = Fake::start(FakeOptions::default()).await;
    let esme = TestEsme::bind_with(
        fake.addr,
        "esme1",
        "secret",
        BindKind::Transceiver,
        EsmeOptions {
            dlr_reply: DlrReply::Status(CommandStatus::EsmeRsyserr),
            ..EsmeOptions::default()
        },
    )
    .await
    .unwrap();
    esme.submit(&SubmitSpec::gsm("1", "2", "a").dlr()).await.unwrap();
    esme.wait_receipts(1, WAIT).await;
    esme.set_dlr_reply(DlrReply::NoAnswer);
    esme.submit(&SubmitSpec::gsm("1", "2", "b").dlr()).await.unwrap();
    assert_eq!(esme.wait_receipts(2, WAIT).await.len(), 2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resps: Vec<CommandStatus> = fake.state.lock().deliver_resps.iter().map(|(_, s)| *s).collect();
    assert_eq!(
        resps,
        [CommandStatus::EsmeRsyserr],
        "the second receipt is not answered"
    );
}

#[tokio::test]
async fn pipelined_submits_respect_the_window() {
    let fake = Fake::start(FakeOptions {
        hold: Some(10),
        receipts: false,
        ..FakeOptions::default()
    })
    .await;
    let esme = TestEsme::bind(fake.addr, "esme1", "secret", BindKind::Transmitter)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..55).map(|i| SubmitSpec::gsm("1", &format!("44{i}"), "x")).collect();
    let outcomes = esme.submit_pipelined(&specs, 10).await;
    assert_eq!(outcomes.len(), 55);
    assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
    let max = fake.state.lock().max_outstanding;
    assert_eq!(max, 10, "never more than the window outstanding");
    // results are in spec order: the server saw destinations in order and ids follow seqs
    let submits = fake.state.lock().submits.clone();
    let dests: Vec<String> = submits
        .iter()
        .map(|c| match c.pdu() {
            Some(Pdu::SubmitSm(sm)) => sm.destination_addr.as_str().to_owned(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(dests, specs.iter().map(|s| s.destination.clone()).collect::<Vec<_>>());
    for (o, c) in outcomes.iter().zip(&submits) {
        assert_eq!(o.message_id, format!("M{}", c.sequence_number()));
    }
    // the last 5 waited for the 100 ms idle timer
    assert!(outcomes[54].latency >= Duration::from_millis(90));
}

#[tokio::test]
async fn pipelined_submits_end_when_the_server_closes() {
    let fake = Fake::start(FakeOptions {
        hold: Some(1000),
        receipts: false,
        ..FakeOptions::default()
    })
    .await;
    let esme = TestEsme::bind(fake.addr, "esme1", "secret", BindKind::Transmitter)
        .await
        .unwrap();
    let push = fake.push.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        push.send(Push::Close).unwrap();
    });
    let specs: Vec<SubmitSpec> = (0..20).map(|_| SubmitSpec::gsm("1", "2", "x")).collect();
    let outcomes = esme.submit_pipelined(&specs, 5).await;
    assert!(outcomes.iter().all(|o| o.status.is_none()));
    assert!(esme.wait_closed(WAIT).await);
    assert!(matches!(
        esme.submit(&SubmitSpec::gsm("1", "2", "x")).await,
        Err(sendium_integration_tests::EsmeError::Closed | sendium_integration_tests::EsmeError::Io(_))
    ));
}

#[tokio::test]
async fn raw_access_and_unsolicited_pdus() {
    let fake = Fake::start(FakeOptions::default()).await;
    let esme = TestEsme::bind(fake.addr, "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    // unknown command id: the fake answers generic_nack, which no request waits for
    esme.send_raw(&[0, 0, 0, 16, 0, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 9])
        .await
        .unwrap();
    let pdu = esme.next_pdu(WAIT).await.unwrap();
    assert_eq!(
        (pdu.command_id(), pdu.status(), pdu.sequence_number()),
        (CommandId::GenericNack, CommandStatus::EsmeRinvcmdid, 9)
    );
    // a mobile-originated deliver_sm and a server enquire_link
    let mo = build::deliver_sm(
        77,
        &ShortMessage {
            source: Address {
                ton: 1,
                npi: 1,
                addr: "447700900123",
            },
            destination: Address {
                ton: 1,
                npi: 1,
                addr: "12345",
            },
            esm_class: 0,
            registered_delivery: 0,
            data_coding: 8,
            short_message: &text::encode(Alphabet::Ucs2, "привет").unwrap(),
            message_payload: None,
            sar: None,
        },
        None,
    )
    .unwrap();
    let mut bytes = encode_to_vec(&mo);
    bytes.extend(encode_to_vec(&build::enquire_link(78)));
    fake.push.send(Push::Bytes(bytes)).unwrap();
    let pdu = esme.next_pdu(WAIT).await.unwrap();
    assert_eq!(pdu.command_id(), CommandId::DeliverSm);
    assert_eq!(esme.mo_messages()[0].text, "привет");
    assert!(esme.receipts().is_empty());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(fake.state.lock().deliver_resps, [(77, CommandStatus::EsmeRok)]);
    assert_eq!(fake.state.lock().other, [CommandId::EnquireLinkResp]);
    assert!(esme.next_pdu(Duration::from_millis(100)).await.is_none());

    assert!(!esme.is_closed());
    fake.push.send(Push::Close).unwrap();
    assert!(esme.wait_closed(WAIT).await);
}

#[test]
fn multipart_specs() {
    let text_gsm: String = "0123456789".repeat(40); // 400 septets
    let parts = SubmitSpec::multipart("1", "2", Alphabet::Gsm7, &text_gsm, Concat::Udh8(0xAB), DlrParts::First);
    assert_eq!(parts.len(), 3);
    let mut data = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.esm_class, 0x40);
        assert_eq!(
            p.registered_delivery,
            u8::from(i == 0),
            "Kannel style: only part 1 asks"
        );
        let (concat, offset) = parse_udh(&p.short_message).unwrap();
        let concat = concat.unwrap();
        assert_eq!((concat.total, concat.seq), (3, u8::try_from(i + 1).unwrap()));
        assert_eq!(&p.short_message[..6], &text::concat_udh_8bit(0xAB, 3, concat.seq));
        assert!(p.short_message.len() - offset <= 153);
        data.extend_from_slice(p.user_data());
    }
    assert_eq!(text::decode(0, &data).unwrap(), text_gsm);

    let parts = SubmitSpec::multipart(
        "1",
        "2",
        Alphabet::Gsm7,
        &text_gsm,
        Concat::Udh16(0x1234),
        DlrParts::Every,
    );
    assert!(
        parts
            .iter()
            .all(|p| p.short_message.len() <= 7 + 152 && p.registered_delivery == 1)
    );
    assert_eq!(&parts[0].short_message[..7], &text::concat_udh_16bit(0x1234, 3, 1));

    let ucs2: String = "é😀".repeat(60);
    let parts = SubmitSpec::multipart("1", "2", Alphabet::Ucs2, &ucs2, Concat::Sar(7), DlrParts::Last);
    let mut data = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.esm_class, 0);
        assert_eq!(
            p.sar,
            Some((7, u8::try_from(parts.len()).unwrap(), u8::try_from(i + 1).unwrap()))
        );
        assert!(p.short_message.len() <= 140 && p.short_message.len() % 2 == 0);
        assert_eq!(p.registered_delivery, u8::from(i + 1 == parts.len()));
        // no part ends inside a surrogate pair
        assert!(text::decode(8, &p.short_message).is_ok());
        data.extend_from_slice(p.user_data());
    }
    assert_eq!(text::decode(8, &data).unwrap(), ucs2);
    let cmd = parts[0].to_command(5).unwrap();
    let Some(Pdu::SubmitSm(sm)) = cmd.pdu() else { panic!() };
    assert_eq!(KnownTlvs::read(sm.tlvs()).sar(), parts[0].sar);

    let payload = SubmitSpec::payload("1", "2", Alphabet::Latin1, &"ü".repeat(300));
    assert!(payload.short_message.is_empty());
    assert_eq!(payload.message_payload.as_ref().unwrap().len(), 300);
    assert_eq!(payload.data_coding, 3);
    let cmd = payload.to_command(6).unwrap();
    let Some(Pdu::SubmitSm(sm)) = cmd.pdu() else { panic!() };
    assert_eq!(KnownTlvs::read(sm.tlvs()).message_payload.unwrap().len(), 300);

    assert_eq!(SubmitSpec::text("1", "2", "ça").data_coding, 8);
    assert_eq!(SubmitSpec::text("1", "2", "ca").data_coding, 0);
    assert_eq!(SubmitSpec::latin1("1", "2", "ça").short_message, b"\xE7a");
    assert_eq!(SubmitSpec::gsm("1", "2", "x").with_esm_class(0x03).esm_class, 3);
    let kannel = SubmitSpec::multipart("1", "2", Alphabet::Gsm7, &text_gsm, Concat::Udh8(1), DlrParts::First);
    assert_eq!(kannel[0].clone().kannel_style().esm_class, 0x43);
}
