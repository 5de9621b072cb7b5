//! Receipt policies: the bounded memory DLR store refuses what it cannot receipt,
//! `dlr.backend = "disabled"` accepts without receipts or refuses (as configured), and
//! incomplete multipart groups expire at their saved deadline with a failure receipt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use sendium_integration_tests::{
    Alphabet, BindKind, CommandStatus, Concat, DestMatch, DlrParts, ReceiptRule, ReceiptState, SmscConfig, SubmitSpec,
    TestEsme, TestSmsc,
};
use support::*;

#[tokio::test]
async fn memory_dlr_capacity_full_refuses_receipt_requests() {
    // The provider never sends receipts, so reserved receipts stay outstanding.
    let smsc = TestSmsc::start(SmscConfig {
        receipt_rules: vec![ReceiptRule::no_receipt(DestMatch::Any)],
        ..SmscConfig::default()
    })
    .await;
    let config = format!("[dlr]\nbackend = \"memory\"\ncapacity = 3\n{}", memory_config());
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    for i in 0..3 {
        let r = esme
            .submit(&SubmitSpec::gsm("1", &format!("4460{i}"), "r").dlr())
            .await
            .unwrap();
        assert!(r.is_ok());
    }
    let r = esme
        .submit(&SubmitSpec::gsm("1", "44609", "one too many").dlr())
        .await
        .unwrap();
    assert_eq!(
        r.status,
        CommandStatus::EsmeRmsgqful,
        "refused, not accepted unreceipted"
    );
    let r = esme
        .submit(&SubmitSpec::gsm("1", "44610", "no receipt wanted"))
        .await
        .unwrap();
    assert!(r.is_ok(), "submissions without a receipt request are unaffected");
    assert!(smsc.wait_messages(4, WAIT).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(smsc.messages().len(), 4, "the refused one was never sent");
}

#[tokio::test]
async fn disabled_dlr_accepts_without_receipts() {
    let smsc = smsc().await;
    let config = format!("[dlr]\nbackend = \"disabled\"\n{}", memory_config());
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let r = esme
        .submit(&SubmitSpec::gsm("1", "44620", "no dlr handling").dlr())
        .await
        .unwrap();
    assert!(r.is_ok());
    assert!(smsc.wait_messages(1, WAIT).await);
    assert_eq!(
        smsc.messages()[0].registered_delivery,
        vec![0],
        "no receipt is asked of the provider"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(esme.receipts().is_empty());
    let (_, ready) = gw.admin_get("/readyz").await;
    assert!(ready.contains("\"dlr\":\"disabled\""), "{ready}");
}

#[tokio::test]
async fn disabled_dlr_can_refuse_receipt_requests() {
    let smsc = smsc().await;
    let config = format!(
        "[dlr]\nbackend = \"disabled\"\non-receipt-request = \"refuse\"\n{}",
        memory_config()
    );
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let r = esme
        .submit(&SubmitSpec::gsm("1", "44630", "wants a receipt").dlr())
        .await
        .unwrap();
    assert_eq!(r.status, CommandStatus::EsmeRinvregdlvflg);
    let r = esme.submit(&SubmitSpec::gsm("1", "44631", "does not")).await.unwrap();
    assert!(r.is_ok());
    let resp = gw
        .post_message(
            "key-1",
            r#"{"from":"Shop","to":"44632","text":"x","callback_url":"http://127.0.0.1:9/cb"}"#,
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("callback_url"), "{}", resp.text());
}

#[tokio::test]
async fn incomplete_multipart_group_expires_with_a_failure_receipt() {
    let smsc = smsc().await;
    let config = format!("[sms]\nmultipart-expiry = \"1s\"\n{}", memory_config());
    let gw = gateway(&config, &smsc).await;
    let esme = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver)
        .await
        .unwrap();
    let parts = SubmitSpec::multipart(
        "1",
        "44640",
        Alphabet::Gsm7,
        &"y".repeat(400),
        Concat::Udh8(5),
        DlrParts::Every,
    );
    // Parts 1 and 3 only: part 2 never comes.
    let r1 = esme.submit(&parts[0]).await.unwrap();
    let r3 = esme.submit(&parts[2]).await.unwrap();
    assert!(r1.is_ok() && r3.is_ok(), "parts are admitted one by one");
    let receipts = esme.wait_receipts(2, Duration::from_secs(10)).await;
    assert_eq!(receipts.len(), 2);
    for r in &receipts {
        assert_eq!(r.state(), Some(ReceiptState::Expired));
        assert!(r.message_id() == Some(&r1.message_id) || r.message_id() == Some(&r3.message_id));
    }
    assert_eq!(smsc.stats().submits, 0, "an incomplete message is never sent");
}
