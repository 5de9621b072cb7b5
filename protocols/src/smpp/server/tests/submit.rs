//! Server tests (test-only: compiled under `#[cfg(test)]`).

use super::*;
use crate::multipart::Concat;
use crate::text::{concat_udh_8bit, concat_udh_16bit};
use rusmpp::pdus::SubmitSm;
use rusmpp::tlvs::MessageSubmissionRequestTlvValue;
use rusmpp::types::{AnyOctetString, COctetString, EmptyOrFullCOctetString, OctetString};
use rusmpp::values::{EsmClass, MessagePayload};

#[tokio::test]
async fn submit_is_answered_with_the_handlers_id() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transmitter).await;
    let resp = esme.submit(&text("447700900123", b"hello")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRok);
    assert_eq!(message_id(&resp), "id-1");

    assert_eq!(server.handler.accounts(), vec!["esme1".to_owned()]);
    let submits = server.handler.submits();
    assert_eq!(
        submits,
        vec![InboundSubmit {
            service_type: String::new(),
            source: SmppAddress::new(5, 0, "Sendium"),
            destination: SmppAddress::new(1, 1, "447700900123"),
            esm_class: 0,
            protocol_id: 0,
            priority_flag: 0,
            registered_delivery: 1,
            data_coding: 0,
            user_data: b"hello".to_vec(),
            concat: None,
            validity: None,
            schedule: None,
        }]
    );
}

/// A data_sm (§4.7.1) with its text in message_payload.
fn data_sm(destination: &'static [u8], payload: &'static [u8]) -> rusmpp::pdus::DataSm {
    rusmpp::pdus::DataSm::builder()
        .source_addr(COctetString::from_static_slice(b"Shop\0").unwrap())
        .destination_addr(COctetString::from_static_slice(destination).unwrap())
        .registered_delivery(rusmpp::values::RegisteredDelivery::from(1))
        .tlvs(vec![MessageSubmissionRequestTlvValue::MessagePayload(
            MessagePayload::new(AnyOctetString::from_static_slice(payload)),
        )])
        .build()
}

#[tokio::test]
async fn data_sm_is_admitted_like_submit_sm_and_answered_with_data_sm_resp() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let seq = esme.next_seq();
    esme.send(&Command::new(
        CommandStatus::EsmeRok,
        seq,
        data_sm(b"447700900123\0", b"by data_sm"),
    ))
    .await;
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.sequence_number(), resp.status()),
        (CommandId::DataSmResp, seq, CommandStatus::EsmeRok)
    );
    let Some(Pdu::DataSmResp(r)) = resp.pdu() else {
        panic!("not a data_sm_resp: {resp:?}");
    };
    assert_eq!(r.message_id().as_str(), "id-1");
    let submits = server.handler.submits();
    assert_eq!(submits.len(), 1);
    assert_eq!(submits[0].user_data, b"by data_sm");
    assert_eq!(submits[0].destination.addr, "447700900123");
    assert_eq!(submits[0].registered_delivery, 1);

    // Refused: a data_sm_resp with the status and no id, as for submit_sm.
    let seq = esme.next_seq();
    esme.send(&Command::new(CommandStatus::EsmeRok, seq, data_sm(b"\0", b"x")))
        .await;
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.sequence_number(), resp.status()),
        (CommandId::DataSmResp, seq, CommandStatus::EsmeRinvdstadr)
    );
    server.handler.set_mode(Mode::Refuse(0x14));
    let seq = esme.next_seq();
    esme.send(&Command::new(CommandStatus::EsmeRok, seq, data_sm(b"1\0", b"x")))
        .await;
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.status()),
        (CommandId::DataSmResp, CommandStatus::EsmeRmsgqful)
    );
}

#[tokio::test]
async fn refusals_from_the_handler_carry_its_status_and_no_id() {
    let server = start(config(), FakeHandler::new()).await;
    server.handler.set_mode(Mode::Refuse(0x14));
    let mut esme = server.bound(BindKind::Transceiver).await;
    let resp = esme.submit(&text("447700900123", b"hello")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRmsgqful);
    assert_eq!(message_id(&resp), "");
}

#[tokio::test]
async fn handler_bugs_are_system_errors_and_the_session_survives() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    server.handler.set_mode(Mode::Panic);
    let resp = esme.submit(&text("1", b"a")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRsyserr);

    server.handler.set_mode(Mode::BadId);
    let resp = esme.submit(&text("1", b"a")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRsyserr);

    server.handler.set_mode(Mode::TooFew);
    let seqs = [esme.next_seq(), esme.next_seq()];
    esme.send_all(&seqs.map(|seq| build::submit_sm(seq, &text("1", b"a")).unwrap()))
        .await;
    let first = esme.recv().await;
    let second = esme.recv().await;
    assert_eq!(
        (first.sequence_number(), first.status()),
        (seqs[0], CommandStatus::EsmeRok)
    );
    assert_eq!(
        (second.sequence_number(), second.status()),
        (seqs[1], CommandStatus::EsmeRsyserr)
    );

    server.handler.set_mode(Mode::Accept);
    assert_eq!(esme.submit(&text("1", b"a")).await.status(), CommandStatus::EsmeRok);
}

#[tokio::test]
async fn pipelined_submits_are_batched_and_answered_in_order() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let commands: Vec<Command> = (0..200)
        .map(|_| {
            let seq = esme.next_seq();
            build::submit_sm(seq, &text("447700900123", b"pipelined")).unwrap()
        })
        .collect();
    let first_seq = commands[0].sequence_number();
    esme.send_all(&commands).await;

    let mut ids = Vec::new();
    for i in 0..200u32 {
        let resp = esme.recv().await;
        assert_eq!(resp.id(), CommandId::SubmitSmResp);
        assert_eq!(resp.sequence_number(), first_seq + i, "responses in request order");
        assert_eq!(resp.status(), CommandStatus::EsmeRok);
        ids.push(message_id(&resp));
    }
    let expected: Vec<String> = (1..=200).map(|n| format!("id-{n}")).collect();
    assert_eq!(ids, expected);
    assert_eq!(server.handler.submits().len(), 200);
    let calls = server.handler.calls();
    assert!(calls < 200, "{calls} handler calls for 200 pipelined submits");
}

#[tokio::test]
async fn multipart_udh_and_sar_and_message_payload_reach_the_handler() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transmitter).await;

    let mut udh8 = concat_udh_8bit(0x42, 3, 1).to_vec();
    udh8.extend_from_slice(b"part one");
    let udh8: &'static [u8] = Box::leak(udh8.into_boxed_slice());
    let mut udh16 = concat_udh_16bit(0x1234, 2, 2).to_vec();
    udh16.extend_from_slice(b"part two");
    let udh16: &'static [u8] = Box::leak(udh16.into_boxed_slice());
    let payload = vec![b'p'; 500];

    let messages = [
        ShortMessage {
            esm_class: 0x43,
            ..text("1", udh8)
        },
        ShortMessage {
            esm_class: 0x40,
            ..text("2", udh16)
        },
        ShortMessage {
            sar: Some((0xBEEF, 4, 3)),
            ..text("3", b"sar part")
        },
        ShortMessage {
            short_message: b"",
            message_payload: Some(&payload),
            ..text("4", b"")
        },
    ];
    for sm in &messages {
        assert_eq!(esme.submit(sm).await.status(), CommandStatus::EsmeRok);
    }
    let got = server.handler.submits();
    assert_eq!(got.len(), 4);
    assert_eq!(
        got[0].concat,
        Some(Concat {
            reference: 0x42,
            total: 3,
            seq: 1
        })
    );
    assert_eq!(
        (got[0].esm_class, got[0].user_data.as_slice()),
        (0x03, &b"part one"[..])
    );
    assert_eq!(
        got[1].concat,
        Some(Concat {
            reference: 0x1234,
            total: 2,
            seq: 2
        })
    );
    assert_eq!(
        (got[1].esm_class, got[1].user_data.as_slice()),
        (0x00, &b"part two"[..])
    );
    assert_eq!(
        got[2].concat,
        Some(Concat {
            reference: 0xBEEF,
            total: 4,
            seq: 3
        })
    );
    assert_eq!(got[2].user_data, b"sar part");
    assert_eq!((got[3].user_data.clone(), got[3].concat), (payload, None));
}

/// A submit_sm built field by field (for combinations the builders refuse).
fn raw_submit(destination: &'static [u8], esm_class: u8, short_message: &'static [u8]) -> SubmitSm {
    SubmitSm::builder()
        .source_addr(COctetString::from_static_slice(b"1\0").unwrap())
        .destination_addr(COctetString::from_static_slice(destination).unwrap())
        .esm_class(EsmClass::from(esm_class))
        .short_message(OctetString::from_static_slice(short_message).unwrap())
        .build()
}

#[tokio::test]
async fn invalid_submits_get_their_status_without_reaching_the_handler() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    let mut cases: Vec<(SubmitSm, CommandStatus)> = vec![
        (raw_submit(b"\0", 0, b"x"), CommandStatus::EsmeRinvdstadr),
        (raw_submit(b"1\0", 0x40, b""), CommandStatus::EsmeRinvesmclass),
        (
            raw_submit(b"1\0", 0x40, b"\x05\x00\x03\x01"),
            CommandStatus::EsmeRinvmsglen,
        ),
        (
            raw_submit(b"1\0", 0x40, b"\x05\x00\x03\x01\x02\x03x"),
            CommandStatus::EsmeRinvmsglen,
        ),
    ];
    let mut both = raw_submit(b"1\0", 0, b"short");
    both.set_tlvs(vec![MessageSubmissionRequestTlvValue::MessagePayload(
        MessagePayload::new(AnyOctetString::from_static_slice(b"payload")),
    )]);
    cases.push((both, CommandStatus::EsmeRinvmsglen));
    let mut partial_sar = raw_submit(b"1\0", 0, b"x");
    partial_sar.set_tlvs(vec![
        MessageSubmissionRequestTlvValue::SarMsgRefNum(7),
        MessageSubmissionRequestTlvValue::SarSegmentSeqnum(1),
    ]);
    cases.push((partial_sar, CommandStatus::EsmeRinvtlvval));
    let mut bad_sar = raw_submit(b"1\0", 0, b"x");
    bad_sar.set_tlvs(vec![
        MessageSubmissionRequestTlvValue::SarMsgRefNum(7),
        MessageSubmissionRequestTlvValue::SarTotalSegments(2),
        MessageSubmissionRequestTlvValue::SarSegmentSeqnum(3),
    ]);
    cases.push((bad_sar, CommandStatus::EsmeRinvtlvval));

    for (sm, status) in cases {
        let seq = esme.next_seq();
        esme.send(&Command::new(CommandStatus::EsmeRok, seq, sm)).await;
        let resp = esme.recv().await;
        assert_eq!((resp.id(), resp.sequence_number()), (CommandId::SubmitSmResp, seq));
        assert_eq!(resp.status(), status, "seq {seq}");
        assert_eq!(message_id(&resp), "");
    }
    assert_eq!(server.handler.calls(), 0);
}

/// A valid submit_sm with `validity_period` set (as the ESME would send it; the builders
/// leave it empty).
fn submit_with_validity(validity_period: &str) -> SubmitSm {
    let mut sm = raw_submit(b"447700900123\0", 0, b"hello");
    sm.validity_period = EmptyOrFullCOctetString::from_string(validity_period.to_owned()).unwrap();
    sm
}

fn unix_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

#[tokio::test]
async fn an_unreadable_validity_period_is_refused_with_rinvexpiry() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    // Month 13, Feb 30, tenths in a relative time, an unknown indicator, not a time at all.
    for bad in [
        "251301000000000+",
        "250230000000000+",
        "000001000000100R",
        "000001000000000X",
        "2023-10-01T12:00",
    ] {
        let seq = esme.next_seq();
        esme.send(&Command::new(CommandStatus::EsmeRok, seq, submit_with_validity(bad)))
            .await;
        let resp = esme.recv().await;
        assert_eq!((resp.id(), resp.sequence_number()), (CommandId::SubmitSmResp, seq));
        assert_eq!(resp.status(), CommandStatus::EsmeRinvexpiry, "{bad}");
        assert_eq!(message_id(&resp), "");
    }
    assert_eq!(server.handler.calls(), 0);
}

#[tokio::test]
async fn a_valid_validity_period_reaches_the_handler_as_a_deadline() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let hour = 3_600_000;

    // Relative: one day, two hours from receipt.
    let before = unix_ms();
    let seq = esme.next_seq();
    esme.send(&Command::new(
        CommandStatus::EsmeRok,
        seq,
        submit_with_validity("000001020000000R"),
    ))
    .await;
    assert_eq!(esme.recv().await.status(), CommandStatus::EsmeRok);
    let after = unix_ms();
    // Absolute: 2025-01-01T00:00 local, one hour ahead of UTC.
    let seq = esme.next_seq();
    esme.send(&Command::new(
        CommandStatus::EsmeRok,
        seq,
        submit_with_validity("250101000000004+"),
    ))
    .await;
    assert_eq!(esme.recv().await.status(), CommandStatus::EsmeRok);

    let submits = server.handler.submits();
    assert_eq!(submits.len(), 2);
    let period = 26 * hour;
    let relative = submits[0].validity.unwrap();
    assert!(
        (before + period..=after + period).contains(&relative),
        "{relative} not within [{}, {}]",
        before + period,
        after + period
    );
    assert_eq!(submits[1].validity, Some(1_735_689_600_000 - hour));
    assert_eq!(submits[1].user_data, b"hello");
}

#[tokio::test]
async fn a_refusal_between_valid_submits_keeps_request_order() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let seqs = [esme.next_seq(), esme.next_seq(), esme.next_seq()];
    let commands = [
        build::submit_sm(seqs[0], &text("1", b"a")).unwrap(),
        Command::new(CommandStatus::EsmeRok, seqs[1], raw_submit(b"\0", 0, b"x")),
        build::submit_sm(seqs[2], &text("3", b"c")).unwrap(),
    ];
    esme.send_all(&commands).await;
    let got: Vec<_> = [esme.recv().await, esme.recv().await, esme.recv().await]
        .iter()
        .map(|r| (r.sequence_number(), r.status()))
        .collect();
    assert_eq!(
        got,
        vec![
            (seqs[0], CommandStatus::EsmeRok),
            (seqs[1], CommandStatus::EsmeRinvdstadr),
            (seqs[2], CommandStatus::EsmeRok)
        ]
    );
}

#[tokio::test]
async fn window_exceeded_is_throttled() {
    let mut config = config();
    config.window = 2;
    let (handler, gate) = FakeHandler::gated();
    let server = start(config, handler).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    let first = [esme.next_seq(), esme.next_seq()];
    esme.send_all(&first.map(|seq| build::submit_sm(seq, &text("1", b"a")).unwrap()))
        .await;
    eventually("the handler to hold two submits", || {
        server.handler.submits().len() == 2
    })
    .await;

    // Two answers are outstanding: a third submit is over the window.
    let resp = esme.submit(&text("1", b"b")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRthrottled);
    assert_eq!(server.handler.submits().len(), 2);

    gate.add_permits(100);
    for seq in first {
        let resp = esme.recv().await;
        assert_eq!((resp.sequence_number(), resp.status()), (seq, CommandStatus::EsmeRok));
    }
    // Room again.
    assert_eq!(esme.submit(&text("1", b"c")).await.status(), CommandStatus::EsmeRok);
}

#[tokio::test]
async fn window_applies_within_one_read() {
    let mut config = config();
    config.window = 3;
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let commands: Vec<Command> = (0..5)
        .map(|_| {
            let seq = esme.next_seq();
            build::submit_sm(seq, &text("1", b"a")).unwrap()
        })
        .collect();
    esme.send_all(&commands).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(esme.recv().await.status());
    }
    // However the five arrived (one read or several), never more than three were
    // outstanding, and answers keep request order within each read.
    let ok = statuses.iter().filter(|s| **s == CommandStatus::EsmeRok).count();
    assert!(ok >= 3, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == CommandStatus::EsmeRok || *s == CommandStatus::EsmeRthrottled)
    );
    assert_eq!(server.handler.submits().len(), ok);
}

#[tokio::test]
async fn max_tps_is_a_token_bucket_shared_by_the_accounts_sessions() {
    let mut config = config();
    let mut throttled = accounts();
    throttled[0].max_tps = 3;
    config.accounts = AccountBook::new(&throttled);
    let server = start(config, FakeHandler::new()).await;
    let mut a = server.bound(BindKind::Transmitter).await;
    let mut b = server.bound(BindKind::Transceiver).await;
    // The bucket holds 3 tokens and gains 3 per second: over `t` seconds at most
    // 3 + 3t submits can be accepted.
    let started = Instant::now();
    let most = |started: Instant| 3 + (3.0 * started.elapsed().as_secs_f64()).floor() as usize;

    let commands: Vec<Command> = (0..10)
        .map(|_| {
            let seq = a.next_seq();
            build::submit_sm(seq, &text("1", b"a")).unwrap()
        })
        .collect();
    a.send_all(&commands).await;
    let mut ok = 0;
    for _ in 0..10 {
        match a.recv().await.status() {
            CommandStatus::EsmeRok => ok += 1,
            CommandStatus::EsmeRthrottled => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(ok >= 3 && ok <= most(started), "{ok} accepted");
    assert!(ok < 10);
    assert_eq!(server.handler.submits().len(), ok);

    // The other session of the same account shares the (now empty) bucket.
    let mut b_ok = 0;
    for _ in 0..3 {
        if b.submit(&text("1", b"b")).await.status() == CommandStatus::EsmeRok {
            b_ok += 1;
        }
    }
    assert!(ok + b_ok <= most(started), "{ok} + {b_ok} accepted");

    // Another account is not limited.
    let mut other = server.esme().await;
    other.bind(BindKind::Transmitter, "esme2", "pw2").await;
    for _ in 0..10 {
        assert_eq!(other.submit(&text("1", b"c")).await.status(), CommandStatus::EsmeRok);
    }
}
