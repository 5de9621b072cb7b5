//! The test SMSC, driven by a raw SMPP client (frame/build only).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Raw, WAIT, receipt_parts};
use rusmpp::{CommandId, CommandStatus};
use sendium_integration_tests::esme::{Concat, DlrParts, SubmitSpec};
use sendium_integration_tests::smsc::{
    DestMatch, IdStyle, ReceiptOutcome, ReceiptRule, SmscAccount, SmscConfig, TestSmsc,
};
use sendium_protocols::receipt::{ReceiptState, ReceiptText};
use sendium_protocols::smpp::build::{self, BindKind};
use sendium_protocols::text::Alphabet;

fn config() -> SmscConfig {
    SmscConfig {
        receipt_delay: Duration::from_millis(10),
        ..SmscConfig::default()
    }
}

#[tokio::test]
async fn binds_check_credentials() {
    let smsc = TestSmsc::start(config()).await;
    for kind in [BindKind::Transmitter, BindKind::Receiver, BindKind::Transceiver] {
        let mut ok = Raw::connect(smsc.addr()).await;
        assert_eq!(ok.bind(kind, "sendium", "pw").await, CommandStatus::EsmeRok);
        // a second bind on the same session
        assert_eq!(ok.bind(kind, "sendium", "pw").await, CommandStatus::EsmeRalybnd);
    }
    for (id, pw) in [("sendium", "wrong"), ("nobody", "pw")] {
        let mut bad = Raw::connect(smsc.addr()).await;
        assert_eq!(
            bad.bind(BindKind::Transceiver, id, pw).await,
            CommandStatus::EsmeRinvpaswd
        );
        assert!(bad.recv(WAIT).await.is_none());
        assert!(bad.closed, "the SMSC closes after a failed bind");
    }
    smsc.faults().reject_binds(Some(CommandStatus::EsmeRbindfail));
    let mut refused = Raw::connect(smsc.addr()).await;
    assert_eq!(
        refused.bind(BindKind::Transceiver, "sendium", "pw").await,
        CommandStatus::EsmeRbindfail
    );
    smsc.faults().reject_binds(None);
    let stats = smsc.stats();
    assert_eq!(stats.binds, 3);
    assert_eq!(stats.bind_failures, 3);

    // submit before bind / on a receiver session
    let mut unbound = Raw::connect(smsc.addr()).await;
    let (status, _) = unbound.submit(&SubmitSpec::gsm("1", "2", "x")).await;
    assert_eq!(status, CommandStatus::EsmeRinvbndsts);
    let mut receiver = Raw::bound(smsc.addr(), BindKind::Receiver).await;
    let (status, _) = receiver.submit(&SubmitSpec::gsm("1", "2", "x")).await;
    assert_eq!(status, CommandStatus::EsmeRinvbndsts);
}

#[tokio::test]
async fn any_credentials_when_no_accounts() {
    let smsc = TestSmsc::start(SmscConfig {
        accounts: vec![],
        ..config()
    })
    .await;
    let mut raw = Raw::connect(smsc.addr()).await;
    assert_eq!(
        raw.bind(BindKind::Transceiver, "whoever", "x").await,
        CommandStatus::EsmeRok
    );
}

#[tokio::test]
async fn submit_records_and_receipt_in_another_base() {
    let smsc = TestSmsc::start(SmscConfig {
        id_style: IdStyle::Hex,
        receipt_id_style: Some(IdStyle::Decimal),
        id_start: Some(0xA1B2C3),
        ..config()
    })
    .await;
    let mut raw = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let before = Instant::now();
    let (status, id) = raw
        .submit(&SubmitSpec::gsm("12345", "447700900123", "hello world").dlr())
        .await;
    assert_eq!(status, CommandStatus::EsmeRok);
    assert_eq!(id, "A1B2C3");
    let (_, id2) = raw
        .submit(&SubmitSpec::gsm("12345", "447700900124", "no receipt"))
        .await;
    assert_eq!(id2, "A1B2C4");

    let deliver = raw.recv_id(CommandId::DeliverSm, WAIT).await.expect("receipt");
    let (text, tlv_id, state, esm_class) = receipt_parts(&deliver);
    assert_eq!(esm_class, 0x04);
    let parsed = ReceiptText::parse(&text).unwrap();
    assert_eq!(parsed.id, "10597059", "receipt text in decimal: {text}");
    assert_eq!(parsed.stat, ReceiptState::Delivered);
    assert_eq!(parsed.err, "000");
    assert_eq!(parsed.text, "hello world");
    assert!(parsed.submit_date.is_some() && parsed.done_date.is_some());
    assert_eq!(tlv_id.as_deref(), Some("A1B2C3"), "TLV carries the resp id");
    assert_eq!(state, Some(2));
    raw.ack(&deliver).await;
    assert!(smsc.wait_receipts_acked(1, WAIT).await);
    // only one receipt: the second submit did not ask
    assert!(
        raw.recv_id(CommandId::DeliverSm, Duration::from_millis(200))
            .await
            .is_none()
    );

    let submits = smsc.submits();
    assert_eq!(submits.len(), 2);
    let s = &submits[0];
    assert_eq!(
        (
            s.source.as_str(),
            s.destination.as_str(),
            s.esm_class,
            s.data_coding,
            s.registered_delivery
        ),
        ("12345", "447700900123", 0, 0, 1)
    );
    assert_eq!(s.short_message, b"hello world");
    assert_eq!(s.message_id.as_deref(), Some("A1B2C3"));
    assert_eq!(s.status, Some(CommandStatus::EsmeRok));
    assert!(s.arrived_at >= before);
    assert_eq!(s.system_id, "sendium");
    let stats = smsc.stats();
    assert_eq!(
        (stats.submits, stats.accepted, stats.receipts_sent, stats.receipts_acked),
        (2, 2, 1, 1)
    );
    assert_eq!(stats.messages_completed, 2);
}

#[tokio::test]
async fn receipts_without_tlvs_and_uuid_ids() {
    let smsc = TestSmsc::start(SmscConfig {
        id_style: IdStyle::Uuid,
        receipt_tlvs: false,
        receipt_text: false,
        ..config()
    })
    .await;
    let mut raw = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let (_, id) = raw.submit(&SubmitSpec::gsm("1", "2", "hi").dlr()).await;
    assert_eq!(id.len(), 36);
    let deliver = raw.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    let (text, tlv_id, state, _) = receipt_parts(&deliver);
    assert_eq!(tlv_id, None);
    assert_eq!(state, None);
    let parsed = ReceiptText::parse(&text).unwrap();
    assert_eq!(parsed.id, id);
    assert_eq!(parsed.text, "");
}

#[tokio::test]
async fn multipart_reassembly_and_duplicates() {
    let smsc = TestSmsc::start(config()).await;
    let mut raw = Raw::bound(smsc.addr(), BindKind::Transmitter).await;
    let long_gsm: String = "The quick brown fox jumps over the lazy dog. €[] ".repeat(8);
    let long_ucs2: String = "Привет, мир! Съешь ещё этих мягких булок. 😀 ".repeat(4);

    // 8-bit UDH, parts out of order
    let mut parts = SubmitSpec::multipart(
        "111",
        "447001",
        Alphabet::Gsm7,
        &long_gsm,
        Concat::Udh8(7),
        DlrParts::First,
    );
    assert!(parts.len() >= 3);
    parts.reverse();
    for p in &parts {
        assert_eq!(raw.submit(p).await.0, CommandStatus::EsmeRok);
    }
    // 16-bit UDH, UCS2
    for p in SubmitSpec::multipart(
        "111",
        "447002",
        Alphabet::Ucs2,
        &long_ucs2,
        Concat::Udh16(0x1234),
        DlrParts::None,
    ) {
        raw.submit(&p).await;
    }
    // SAR
    for p in SubmitSpec::multipart(
        "111",
        "447003",
        Alphabet::Latin1,
        &"café ".repeat(60),
        Concat::Sar(99),
        DlrParts::Every,
    ) {
        raw.submit(&p).await;
    }
    // message_payload
    raw.submit(&SubmitSpec::payload("111", "447004", Alphabet::Gsm7, &long_gsm))
        .await;
    // an interleaved group with the same reference to another destination stays separate
    let other = SubmitSpec::multipart(
        "111",
        "447005",
        Alphabet::Gsm7,
        &long_gsm,
        Concat::Udh8(7),
        DlrParts::None,
    );
    raw.submit(&other[0]).await;
    assert_eq!(smsc.incomplete_groups(), 1);

    assert!(smsc.wait_messages(4, WAIT).await);
    let by_dest = |d: &str| smsc.messages_to(d);
    assert_eq!(by_dest("447001")[0].text, long_gsm);
    assert_eq!(by_dest("447001")[0].parts as usize, parts.len());
    assert_eq!(by_dest("447001")[0].registered_delivery[0], 1);
    assert!(by_dest("447001")[0].registered_delivery[1..].iter().all(|rd| *rd == 0));
    assert_eq!(by_dest("447002")[0].text, long_ucs2);
    assert_eq!(by_dest("447002")[0].data_coding, 8);
    assert_eq!(by_dest("447003")[0].text, "café ".repeat(60));
    assert_eq!(by_dest("447004")[0].text, long_gsm);
    assert_eq!(by_dest("447004")[0].parts, 1);
    assert!(by_dest("447005").is_empty());

    // the same text to the same destination again (e.g. a resubmission after a crash)
    for p in SubmitSpec::multipart(
        "111",
        "447001",
        Alphabet::Gsm7,
        &long_gsm,
        Concat::Udh8(8),
        DlrParts::None,
    ) {
        raw.submit(&p).await;
    }
    raw.submit(&SubmitSpec::gsm("111", "447006", "short")).await;
    raw.submit(&SubmitSpec::gsm("111", "447006", "short")).await;
    assert!(smsc.wait_messages(7, WAIT).await);
    let dups = smsc.duplicates();
    assert_eq!(dups.len(), 2, "{dups:?}");
    assert_eq!((dups[0].destination.as_str(), dups[0].count), ("447001", 2));
    assert_eq!(
        (dups[1].destination.as_str(), dups[1].text.as_str(), dups[1].count),
        ("447006", "short", 2)
    );
    assert_eq!(smsc.stats().duplicate_messages, 2);
}

#[tokio::test]
async fn receipts_are_held_until_a_receiver_binds() {
    let smsc = TestSmsc::start(config()).await;
    let mut tx = Raw::bound(smsc.addr(), BindKind::Transmitter).await;
    let (_, id1) = tx.submit(&SubmitSpec::gsm("1", "4471", "a").dlr()).await;
    let (_, id2) = tx.submit(&SubmitSpec::gsm("1", "4472", "b").dlr()).await;
    assert!(smsc.wait_for(WAIT, |s| s.held_receipts() == 2).await);
    assert_eq!(smsc.stats().receipts_sent, 0);

    // a receiver of another system_id does not get them
    let other_smsc_account = TestSmsc::start(SmscConfig {
        accounts: vec![SmscAccount::new("sendium", "pw"), SmscAccount::new("other", "pw")],
        ..config()
    })
    .await;
    let mut tx2 = Raw::bound(other_smsc_account.addr(), BindKind::Transmitter).await;
    tx2.submit(&SubmitSpec::gsm("1", "4471", "a").dlr()).await;
    let mut other = Raw::connect(other_smsc_account.addr()).await;
    assert_eq!(
        other.bind(BindKind::Receiver, "other", "pw").await,
        CommandStatus::EsmeRok
    );
    assert!(other.recv(Duration::from_millis(300)).await.is_none());
    assert_eq!(other_smsc_account.held_receipts(), 1);

    let mut rx = Raw::bound(smsc.addr(), BindKind::Receiver).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let d = rx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
        ids.push(receipt_parts(&d).1.unwrap());
        rx.ack(&d).await;
    }
    assert_eq!(ids, [id1, id2]);
    assert!(smsc.wait_receipts_acked(2, WAIT).await);
    assert_eq!(smsc.held_receipts(), 0);
}

#[tokio::test]
async fn unacknowledged_receipts_are_resent_on_the_next_bind() {
    let smsc = TestSmsc::start(config()).await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let (_, id) = trx.submit(&SubmitSpec::gsm("1", "4471", "a").dlr()).await;
    let first = trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    assert_eq!(receipt_parts(&first).1.as_deref(), Some(id.as_str()));
    drop(trx); // no deliver_sm_resp
    assert!(smsc.wait_for(WAIT, |s| s.held_receipts() == 1).await);

    let mut again = Raw::bound(smsc.addr(), BindKind::Receiver).await;
    let second = again.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    assert_eq!(receipt_parts(&second).0, receipt_parts(&first).0, "the same receipt");
    // refused with an error status: sent again a little later, on a bound session
    again
        .send(&build::deliver_sm_resp(
            second.sequence_number(),
            CommandStatus::EsmeRsyserr,
        ))
        .await;
    assert!(smsc.wait_for(WAIT, |s| s.stats().receipts_nacked == 1).await);
    let d = again.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    assert_eq!(receipt_parts(&d).0, receipt_parts(&first).0, "the same receipt, again");
    again.ack(&d).await;
    assert!(smsc.wait_receipts_acked(1, WAIT).await);
    let stats = smsc.stats();
    assert_eq!(
        (stats.receipts_sent, stats.receipts_acked, stats.receipts_held),
        (3, 1, 0)
    );
}

#[tokio::test]
async fn receipts_round_robin_over_bound_receivers() {
    let smsc = TestSmsc::start(config()).await;
    let mut tx = Raw::bound(smsc.addr(), BindKind::Transmitter).await;
    let mut a = Raw::bound(smsc.addr(), BindKind::Receiver).await;
    let mut b = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    for i in 0..4 {
        // one at a time so each is its own batch
        tx.submit(&SubmitSpec::gsm("1", &format!("447{i}"), "x").dlr()).await;
        assert!(smsc.wait_receipts_sent(i + 1, WAIT).await);
    }
    let mut counts = [0, 0];
    for (i, raw) in [&mut a, &mut b].into_iter().enumerate() {
        while let Some(d) = raw.recv(Duration::from_millis(200)).await {
            raw.ack(&d).await;
            counts[i] += 1;
        }
    }
    assert_eq!(counts, [2, 2]);
}

#[tokio::test]
async fn receipt_rules_choose_the_state() {
    let smsc = TestSmsc::start(SmscConfig {
        receipt_rules: vec![ReceiptRule::dest_suffix("13", ReceiptState::Undeliverable, "001")],
        ..config()
    })
    .await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    trx.submit(&SubmitSpec::gsm("1", "447700900013", "x").dlr()).await;
    let d = trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    let (text, _, state, _) = receipt_parts(&d);
    let parsed = ReceiptText::parse(&text).unwrap();
    assert_eq!(
        (parsed.stat, parsed.err.as_str(), parsed.dlvrd),
        (ReceiptState::Undeliverable, "001", 0)
    );
    assert_eq!(state, Some(5));

    // registered_delivery 2: only failures get a receipt
    trx.submit(&SubmitSpec::gsm("1", "447700900014", "x").with_registered_delivery(2))
        .await;
    trx.submit(&SubmitSpec::gsm("1", "447700900113", "x").with_registered_delivery(2))
        .await;
    let d = trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
    assert_eq!(receipt_parts(&d).2, Some(5));
    assert!(
        trx.recv_id(CommandId::DeliverSm, Duration::from_millis(200))
            .await
            .is_none()
    );

    smsc.set_receipt_rules(vec![
        ReceiptRule::no_receipt(DestMatch::Prefix("449".into())),
        ReceiptRule {
            dest: DestMatch::Any,
            outcome: ReceiptOutcome::Sequence(vec![
                (ReceiptState::Accepted, "000".into()),
                (ReceiptState::Delivered, "000".into()),
            ]),
        },
    ]);
    trx.submit(&SubmitSpec::gsm("1", "4490", "x").dlr()).await;
    trx.submit(&SubmitSpec::gsm("1", "4470", "x").dlr()).await;
    let states: Vec<Option<u8>> = [
        trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap(),
        trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap(),
    ]
    .iter()
    .map(|d| receipt_parts(d).2)
    .collect();
    assert_eq!(states, [Some(6), Some(2)]);
    assert!(
        trx.recv_id(CommandId::DeliverSm, Duration::from_millis(200))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn fault_throttle_reject_delay() {
    let smsc = TestSmsc::start(config()).await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transmitter).await;
    smsc.faults().throttle_every(2);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0);
    }
    assert_eq!(
        statuses,
        [
            CommandStatus::EsmeRok,
            CommandStatus::EsmeRthrottled,
            CommandStatus::EsmeRok,
            CommandStatus::EsmeRthrottled
        ]
    );
    smsc.faults().stop_throttling();
    smsc.faults().throttle_all_for(Duration::from_millis(300));
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRthrottled
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRok
    );

    smsc.faults().reject_prefix("999", CommandStatus::EsmeRinvdstadr);
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "999123", "x")).await.0,
        CommandStatus::EsmeRinvdstadr
    );
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "998123", "x")).await.0,
        CommandStatus::EsmeRok
    );
    smsc.faults().clear_rejects();
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "999123", "x")).await.0,
        CommandStatus::EsmeRok
    );

    smsc.faults().delay_responses(Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRok
    );
    assert!(t.elapsed() >= Duration::from_millis(200));
    smsc.faults().clear();

    let stats = smsc.stats();
    assert_eq!((stats.throttled, stats.rejected), (3, 1));
    // rejected and throttled submits are recorded but make no message
    assert_eq!(stats.messages_completed, stats.accepted);
}

#[tokio::test]
async fn fault_stop_answering_and_drop_connection() {
    let smsc = TestSmsc::start(config()).await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    smsc.faults().stop_answering(true);
    trx.send_submit(&SubmitSpec::gsm("1", "4470", "lost").dlr()).await;
    assert!(trx.recv(Duration::from_millis(300)).await.is_none());
    assert!(!trx.closed);
    smsc.faults().stop_answering(false);
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRok
    );

    smsc.faults().drop_connection_after(1);
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRok
    );
    trx.send_submit(&SubmitSpec::gsm("1", "4470", "dropped")).await;
    let mut got = Vec::new();
    while let Some(c) = trx.recv(WAIT).await {
        got.push(c.id());
    }
    assert!(trx.closed, "connection closed");
    assert!(!got.contains(&CommandId::SubmitSmResp), "{got:?}");
    // the fault fires once: a new session works
    let mut again = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    assert_eq!(
        again.submit(&SubmitSpec::gsm("1", "4470", "x")).await.0,
        CommandStatus::EsmeRok
    );

    let unanswered: Vec<_> = smsc.submits().into_iter().filter(|s| s.status.is_none()).collect();
    assert_eq!(unanswered.len(), 2);
    assert_eq!(smsc.stats().unanswered, 2);
    // unanswered submits get no receipt
    assert_eq!(smsc.stats().receipts_sent, 0);
}

#[tokio::test]
async fn protocol_basics() {
    let smsc = TestSmsc::start(config()).await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let seq = trx.next_seq();
    trx.send(&build::enquire_link(seq)).await;
    let resp = trx.recv(WAIT).await.unwrap();
    assert_eq!((resp.id(), resp.sequence_number()), (CommandId::EnquireLinkResp, seq));

    // unknown command id → generic_nack, the session survives
    let mut garbage = vec![0, 0, 0, 16, 0, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 42];
    trx.send_bytes(&garbage).await;
    let nack = trx.recv(WAIT).await.unwrap();
    assert_eq!(
        (nack.id(), nack.status(), nack.sequence_number()),
        (CommandId::GenericNack, CommandStatus::EsmeRinvcmdid, 42)
    );
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "2", "x")).await.0,
        CommandStatus::EsmeRok
    );

    // a command_length below 16 → nack and close
    garbage[3] = 8;
    trx.send_bytes(&garbage[..8]).await;
    let nack = trx.recv(WAIT).await.unwrap();
    assert_eq!(nack.id(), CommandId::GenericNack);
    assert!(trx.recv(WAIT).await.is_none() && trx.closed);

    let mut u = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let seq = u.next_seq();
    u.send(&build::unbind(seq)).await;
    assert_eq!(u.recv(WAIT).await.unwrap().id(), CommandId::UnbindResp);
    assert!(u.recv(WAIT).await.is_none() && u.closed);
}

#[tokio::test]
async fn disconnect_shutdown_and_restart_on_the_same_port() {
    let smsc = TestSmsc::start(config()).await;
    let port = smsc.port();
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    assert!(smsc.wait_bound(1, WAIT).await);
    assert_eq!(smsc.bound_sessions()[0].kind, BindKind::Transceiver);
    smsc.disconnect_all();
    assert!(trx.recv(WAIT).await.is_none() && trx.closed);
    assert!(smsc.wait_for(WAIT, |s| s.stats().connections == 0).await);

    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    smsc.shutdown().await;
    assert!(trx.recv(WAIT).await.is_none() && trx.closed);

    let again = TestSmsc::start(SmscConfig { port, ..config() }).await;
    assert_eq!(again.port(), port);
    let mut trx = Raw::bound(again.addr(), BindKind::Transceiver).await;
    assert_eq!(
        trx.submit(&SubmitSpec::gsm("1", "2", "x")).await.0,
        CommandStatus::EsmeRok
    );
}

#[test]
fn runs_on_its_own_thread() {
    let smsc = TestSmsc::start_in_thread(config());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
        assert_eq!(
            trx.submit(&SubmitSpec::gsm("1", "2", "x").dlr()).await.0,
            CommandStatus::EsmeRok
        );
        let d = trx.recv_id(CommandId::DeliverSm, WAIT).await.unwrap();
        trx.ack(&d).await;
        assert!(smsc.wait_receipts_acked(1, WAIT).await);
        smsc.shutdown().await;
    });
}

#[tokio::test]
async fn pipelined_batch_is_answered_in_one_go() {
    // 2 000 submits written at once: every one answered, ids unique, one receipt each.
    let smsc = TestSmsc::start(SmscConfig {
        record: false,
        receipt_delay: Duration::from_millis(50),
        ..config()
    })
    .await;
    let mut trx = Raw::bound(smsc.addr(), BindKind::Transceiver).await;
    let mut bytes = Vec::new();
    for i in 0..2000u32 {
        let spec = SubmitSpec::gsm("1", &format!("44{i:06}"), "bulk").dlr();
        bytes.extend(sendium_integration_tests::wire::encode_to_vec(
            &spec.to_command(i + 1).unwrap(),
        ));
    }
    trx.send_bytes(&bytes).await;
    let mut ids = std::collections::HashSet::new();
    let mut receipts = 0;
    while ids.len() < 2000 || receipts < 2000 {
        let c = trx.recv(WAIT).await.expect("more PDUs");
        match c.id() {
            CommandId::SubmitSmResp => {
                assert_eq!(c.status(), CommandStatus::EsmeRok);
                if let Some(rusmpp::Pdu::SubmitSmResp(r)) = c.pdu() {
                    assert!(ids.insert(r.message_id().as_str().to_owned()));
                }
            }
            CommandId::DeliverSm => {
                receipts += 1;
                trx.ack(&c).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(smsc.wait_receipts_acked(2000, WAIT).await);
    assert_eq!(smsc.stats().messages_completed, 2000);
    assert!(smsc.submits().is_empty(), "record: false keeps no submits");
}
