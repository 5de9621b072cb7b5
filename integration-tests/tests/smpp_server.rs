//! The SMPP server of the real binary: binds and their failures, malformed input,
//! oversized lengths, throughput limits, windows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::{BindKind, CommandId, CommandStatus, EsmeOptions, SubmitSpec, TestEsme};
use support::*;

#[tokio::test]
async fn bind_failures_have_their_statuses() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let addr = gw.smpp_addr();
    let e = TestEsme::bind(addr, "esme1", "wrong", BindKind::Transceiver)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(CommandStatus::EsmeRinvpaswd));
    let e = TestEsme::bind(addr, "nobody", "secret", BindKind::Transceiver)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(CommandStatus::EsmeRinvsysid));
    // esme2 may bind twice.
    let _a = TestEsme::bind(addr, "esme2", "secret2", BindKind::Transmitter)
        .await
        .unwrap();
    let _b = TestEsme::bind(addr, "esme2", "secret2", BindKind::Receiver)
        .await
        .unwrap();
    let e = TestEsme::bind(addr, "esme2", "secret2", BindKind::Transceiver)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(CommandStatus::EsmeRbindfail));
}

#[tokio::test]
async fn malformed_pdus_get_generic_nack_and_the_session_stays_usable() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    // A submit_sm whose body stops in the middle of a C-string.
    let mut bad = vec![0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
    bad.extend_from_slice(b"\x00\x01\x01Shop");
    let len = bad.len() as u32;
    bad[..4].copy_from_slice(&len.to_be_bytes());
    esme.send_raw(&bad).await.unwrap();
    let nack = esme.next_pdu(Duration::from_secs(5)).await.expect("an answer");
    assert_eq!(nack.command_id(), CommandId::GenericNack);
    assert_eq!(nack.sequence_number(), 0x1234);
    // An unknown command id.
    let unknown = [0, 0, 0, 16, 0x00, 0x0F, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0x12, 0x35];
    esme.send_raw(&unknown).await.unwrap();
    let nack = esme.next_pdu(Duration::from_secs(5)).await.expect("an answer");
    assert_eq!(nack.command_id(), CommandId::GenericNack);
    assert_eq!(nack.status(), CommandStatus::EsmeRinvcmdid);
    // Still usable.
    let resp = esme
        .submit(&SubmitSpec::gsm("1", "447700900001", "after garbage"))
        .await
        .unwrap();
    assert!(resp.is_ok());
    assert!(smsc.wait_messages(1, WAIT).await);
}

#[tokio::test]
async fn oversized_command_length_closes_the_session() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    // 2 GiB announced: never allocated, the session is closed.
    esme.send_raw(&[0x7F, 0xFF, 0xFF, 0xFF, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 9])
        .await
        .unwrap();
    assert!(esme.wait_closed(Duration::from_secs(5)).await);
    // The gateway is fine.
    let again = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    assert!(
        again
            .submit(&SubmitSpec::gsm("1", "447700900002", "ok"))
            .await
            .unwrap()
            .is_ok()
    );
    let (status, _) = gw.admin_get("/healthz").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn account_tps_limit_throttles() {
    let smsc = smsc().await;
    let config = memory_config().replace(
        "password = \"secret\"\nmax-binds = 8",
        "password = \"secret\"\nmax-binds = 8\nmax-tps = 10",
    );
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let specs: Vec<SubmitSpec> = (0..50)
        .map(|i| SubmitSpec::gsm("1", &format!("4479{i}"), "burst"))
        .collect();
    let outcomes = esme.submit_pipelined(&specs, 50).await;
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    let throttled = outcomes
        .iter()
        .filter(|o| o.status == Some(CommandStatus::EsmeRthrottled))
        .count();
    assert!((10..50).contains(&ok), "ok {ok}");
    assert_eq!(ok + throttled, 50, "everything else is ESME_RTHROTTLED");
    assert!(smsc.wait_messages(ok as u64, WAIT).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(smsc.messages().len(), ok, "only acknowledged messages are sent");
}

#[tokio::test]
async fn session_window_throttles_beyond_its_size() {
    let smsc = smsc().await;
    // 200 pipelined submits against a window of 5: whatever is beyond the window when
    // it arrives is answered ESME_RTHROTTLED (never queued without bound, never
    // anything else), and every admitted one is delivered.
    let config = memory_config().replace("window = 1000", "window = 5");
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind_with(
        gw.smpp_addr(),
        "esme1",
        "secret",
        BindKind::Transceiver,
        EsmeOptions::default(),
    )
    .await
    .unwrap();
    let specs: Vec<SubmitSpec> = (0..200)
        .map(|i| SubmitSpec::gsm("1", &format!("4478{i}"), "w"))
        .collect();
    let outcomes = esme.submit_pipelined(&specs, 200).await;
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    let other: Vec<_> = outcomes.iter().filter(|o| !o.is_ok()).map(|o| o.status).collect();
    assert!(
        other.iter().all(|s| *s == Some(CommandStatus::EsmeRthrottled)),
        "{other:?}"
    );
    assert!(ok >= 5, "at least a window's worth is admitted");
    assert!(smsc.wait_messages(ok as u64, WAIT).await);
}

#[tokio::test]
async fn enquire_link_and_unbind() {
    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    assert_eq!(esme.enquire_link().await.unwrap(), CommandStatus::EsmeRok);
    assert_eq!(esme.unbind().await.unwrap(), CommandStatus::EsmeRok);
    assert!(esme.wait_closed(Duration::from_secs(5)).await);
}

/// `data_sm` from an ESME (as node-smpp and other clients send it, the text in
/// message_payload) is admitted like `submit_sm`, answered with `data_sm_resp` carrying
/// the id, reaches the provider, and its receipt comes back as a `deliver_sm` quoting
/// that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sm_is_submitted_and_its_receipt_comes_back() {
    use rusmpp::Pdu;
    use rusmpp::tlvs::MessageSubmissionRequestTlvValue;
    use rusmpp::types::{AnyOctetString, COctetString};
    use rusmpp::values::{MessagePayload, RegisteredDelivery};
    use sendium_integration_tests::Command;

    let smsc = smsc().await;
    let gw = gateway(&memory_config(), &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let dsm = rusmpp::pdus::DataSm::builder()
        .source_addr(COctetString::from_static_slice(b"Shop\0").unwrap())
        .destination_addr(COctetString::from_static_slice(b"447700900555\0").unwrap())
        .registered_delivery(RegisteredDelivery::from(1))
        .tlvs(vec![MessageSubmissionRequestTlvValue::MessagePayload(
            MessagePayload::new(AnyOctetString::from_static_slice(b"sent as a data sm")),
        )])
        .build();
    let seq = esme.next_seq();
    let resp = esme
        .request(&Command::new(CommandStatus::EsmeRok, seq, dsm))
        .await
        .unwrap();
    let command = resp.command.unwrap();
    assert_eq!(
        (command.id(), command.status()),
        (CommandId::DataSmResp, CommandStatus::EsmeRok)
    );
    let Some(Pdu::DataSmResp(r)) = command.pdu() else {
        panic!("not a data_sm_resp");
    };
    let id = r.message_id().as_str().to_owned();
    assert_eq!(id.len(), 36, "a message id: {id:?}");
    assert!(smsc.wait_messages(1, WAIT).await);
    let sent = smsc.messages_to("447700900555");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "sent as a data sm");
    let receipts = esme.wait_receipts(1, WAIT).await;
    assert_eq!(receipts.len(), 1);
    assert_eq!(receipts[0].message_id(), Some(id.as_str()));
}
